// Shared by the masked attention backward suites (test_attention_mask_backward,
// test_attention_bwd_reduction): a library mask's kernel arguments, the block-mask
// pre-pass in the interpreter, and the float64 backward of masked attention with dropout.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/attention/mask.hpp"
#include "kernels/attention/mask_host.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/interpreter.hpp"

namespace testing {

// Ragged documents for the segment masks' id tensors [rows, tokens]: per row, runs of random lengths
// in [1, longest] with ids that do not start at 0.
template <class Rng>
std::vector<int32_t> mask_documents(int64_t rows, int64_t tokens, uint32_t longest, Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(rows * tokens));
  for (int64_t r = 0; r < rows; ++r) {
    int32_t id = 40 + 5 * static_cast<int32_t>(r);
    uint32_t left = 0;
    for (int64_t t = 0; t < tokens; ++t, --left) {
      if (left == 0) left = 1 + static_cast<uint32_t>(rng()) % longest, id += 2;
      ids[static_cast<size_t>(r * tokens + t)] = id;
    }
  }
  return ids;
}

// A library mask's parameters as interpreter arguments, in the kernels' declaration order
// (kernels::mask_parameter_names); the tensors its kind reads are copied from `data`.
struct MaskArgs {
  tilejit::runtime::HostTensor docs, prefix, table;
  std::vector<tilejit::runtime::Arg> args;
  MaskArgs(const tilejit::kernels::MaskSpec& spec, const tilejit::kernels::MaskData& data) {
    namespace km = tilejit::kernels;
    using tilejit::runtime::Arg;
    auto copy = [](tilejit::ir::DType d, const std::vector<int64_t>& shape, const auto& values) {
      tilejit::runtime::HostTensor t(d, shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.set_flat(i, values[static_cast<size_t>(i)]);
      return t;
    };
    if (km::mask_uses_doc_ids(spec.kind)) docs = copy(tilejit::ir::DType::i32, data.doc_ids.shape, data.doc_ids.values);
    if (spec.kind == km::MaskKind::prefix_lm) prefix = copy(tilejit::ir::DType::i32, data.prefix_lengths.shape, data.prefix_lengths.values);
    if (spec.kind == km::MaskKind::block_sparse) table = copy(tilejit::ir::DType::u8, data.block_table.shape, data.block_table.values);
    const std::map<std::string, Arg> by_name{
        {"mask_window_left", spec.window_left}, {"mask_window_right", spec.window_right}, {"mask_global_tokens", spec.global_tokens},
        {"mask_block_q", spec.block_q},         {"mask_block_k", spec.block_k},           {"mask_doc_ids", Arg(docs)},
        {"mask_prefix_lengths", Arg(prefix)},   {"mask_block_table", Arg(table)}};
    for (const std::string& name : km::mask_parameter_names(spec.kind)) args.push_back(by_name.at(name));
  }
  MaskArgs(const MaskArgs&) = delete;  // args point at the tensors
};

// The block-mask pre-pass (attention_block_classes, then attention_block_lists) at BLOCK_M x BLOCK_N tiles, in the interpreter: the block classes
// [Bm, Hm, nQB, nKB] and the four lists (num, indices, full num, full indices) a kernel reads,
// poisoned where the pre-pass leaves them. Bm, Hm: the mask data's batch and head extents (1 where
// it broadcasts: a [1, S_k] id tensor, a [1, 1, ..] block table).
struct BlockMaskRun {
  tilejit::runtime::HostTensor classes, num, indices, full_num, full_indices;
  BlockMaskRun(const tilejit::kernels::MaskSpec& spec, const tilejit::kernels::MaskData& data, const MaskArgs& mask, int64_t batch,
               int64_t s_q, int64_t s_k, int64_t block_m, int64_t block_n, bool kv_major) {
    using tilejit::ir::DType;
    namespace km = tilejit::kernels;
    const bool table = spec.kind == km::MaskKind::block_sparse;
    const int64_t Bm = table ? data.block_table.shape[0] : km::mask_uses_doc_ids(spec.kind) ? data.doc_ids.shape[0] : batch;
    const int64_t Hm = table ? data.block_table.shape[1] : 1;
    const int64_t q_tiles = (s_q + block_m - 1) / block_m, k_tiles = (s_k + block_n - 1) / block_n;
    const int64_t outer = kv_major ? k_tiles : q_tiles, inner = kv_major ? q_tiles : k_tiles;
    classes = tilejit::runtime::HostTensor(DType::u8, {Bm, Hm, q_tiles, k_tiles});
    num = tilejit::runtime::HostTensor(DType::i32, {Bm, Hm, outer}), full_num = tilejit::runtime::HostTensor(DType::i32, {Bm, Hm, outer});
    indices = tilejit::runtime::HostTensor(DType::i32, {Bm, Hm, outer, inner});
    full_indices = tilejit::runtime::HostTensor(DType::i32, {Bm, Hm, outer, inner});
    for (tilejit::runtime::HostTensor* t : {&classes, &num, &indices, &full_num, &full_indices}) t->poison();
    std::vector<tilejit::runtime::Arg> args{classes, s_q, s_k};
    args.insert(args.end(), mask.args.begin(), mask.args.end());
    const tilejit::lang::Meta meta{{"BLOCK_M", block_m}, {"BLOCK_N", block_n}, {"MASK", static_cast<int>(spec.kind)}};
    tilejit::runtime::interpret(tilejit::kernels::attention_block_classes().build(meta), {q_tiles, k_tiles, Bm * Hm}, args);
    tilejit::runtime::interpret(tilejit::kernels::attention_block_lists().build({{"KV_MAJOR", kv_major}}), {outer, Hm, Bm},
                                {classes, num, indices, full_num, full_indices});
  }
  void append_to(std::vector<tilejit::runtime::Arg>& args) {
    for (tilejit::runtime::HostTensor* t : {&num, &indices, &full_num, &full_indices}) args.emplace_back(*t);
  }
};

// What the masked backward tests' problems share: a label, the mask and its data, the sizes and the
// kernels' tiles. Each test derives its own Problem (adding layout, dropout, ...) and builds its list
// with add_problem.
struct MaskedProblemCore {
  std::string label;
  tilejit::kernels::MaskSpec spec = tilejit::kernels::MaskSpec::full();
  int64_t B = 1, Hq = 2, Hkv = 1, Sq = 0, Sk = 0, bm = 16, bn = 16;
  std::vector<int32_t> docs, prefix;
  std::vector<int64_t> docs_shape, table_shape;
  std::vector<uint8_t> table;

  tilejit::kernels::MaskData data() const {
    return {{docs, docs_shape}, {prefix, {static_cast<int64_t>(prefix.size())}}, {table, table_shape}};
  }
  tilejit::kernels::MaskProblem extent() const { return {B, Hq, Sq, Sk}; }
  int64_t q_tiles() const { return (Sq + bm - 1) / bm; }
  int64_t k_tiles() const { return (Sk + bn - 1) / bn; }
};

// Appends a problem with these fields to `ps` and returns it (for the fields the call leaves out).
template <class P>
P* add_problem(std::vector<P>& ps, std::string label, tilejit::kernels::MaskSpec spec, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq,
               int64_t Sk, int64_t bm, int64_t bn) {
  P p;
  p.label = std::move(label), p.spec = spec, p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Sq = Sq, p.Sk = Sk, p.bm = bm, p.bn = bn;
  ps.push_back(std::move(p));
  return &ps.back();
}

// The sizes and layout of a masked attention problem: Q, dO, O [B, Hq, S_q, D], K, V [B, Hkv, S_k, D]
// (BSHD: [B, S, H, D]).
struct MaskedAttentionDims {
  int64_t B, Hq, Hkv, Sq, Sk, D;
  bool bshd = false;
  size_t at(int64_t b, int64_t h, int64_t s, int64_t d, int64_t H, int64_t S) const {
    return static_cast<size_t>(bshd ? ((b * S + s) * H + h) * D + d : ((b * H + h) * S + s) * D + d);
  }
  size_t q_at(int64_t b, int64_t h, int64_t s, int64_t d) const { return at(b, h, s, d, Hq, Sq); }
  size_t k_at(int64_t b, int64_t h, int64_t s, int64_t d) const { return at(b, h, s, d, Hkv, Sk); }
};

// The gradients of masked attention with dropout, in float64, given the stored O (Delta = rowsum(dO *
// O), as the kernels and FlashAttention compute it); logical row-major like q, k, v; Delta [B, Hq, S_q].
struct MaskedBackwardRef {
  std::vector<double> dq, dk, dv, delta;
};

// The forward of the exact inputs (written to `o`, whose dtype rounds it as a forward's store would, and
// `lse`: f32 [B, Hq, S_q], -inf for a row with no allowed key, whose O = 0), then the gradients with
// the dense mask `mask` [B, Hq, S_q, S_k] and, when keep_threshold < 256, the dropout of `rng`:
// dV = sum Pd^T dO, dP = dO V^T * keep * s, dS = P (dP - Delta). Masked keys are never read (NaN in
// rows no allowed element touches reaches nothing).
inline MaskedBackwardRef masked_backward_ref(const MaskedAttentionDims& p, const std::vector<uint8_t>& mask,
                                             const tilejit::runtime::HostTensor& qt, const tilejit::runtime::HostTensor& kt,
                                             const tilejit::runtime::HostTensor& vt, const tilejit::runtime::HostTensor& dot_,
                                             double scale, const tilejit::kernels::DropoutRngHost& rng, tilejit::runtime::HostTensor& o,
                                             tilejit::runtime::HostTensor& lse) {
  const std::vector<double> q = qt.to_f64(), k = kt.to_f64(), v = vt.to_f64(), dout = dot_.to_f64();
  const bool dropout = rng.keep_threshold < 256;
  const double keep_scale = dropout ? 256.0 / rng.keep_threshold : 1.0;
  MaskedBackwardRef r{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0), std::vector<double>(v.size(), 0.0),
                      std::vector<double>(static_cast<size_t>(p.B * p.Hq * p.Sq), 0.0)};
  std::vector<double> prob(static_cast<size_t>(p.Sk)), dropped(static_cast<size_t>(p.Sk));
  const int64_t group = p.Hq / p.Hkv;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t kh = h / group;
      const auto bh = static_cast<uint32_t>(b * p.Hq + h);
      for (int64_t i = 0; i < p.Sq; ++i) {
        const uint8_t* allowed = &mask[static_cast<size_t>(((b * p.Hq + h) * p.Sq + i) * p.Sk)];
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < p.Sk; ++j) {
          if (!allowed[j]) continue;
          double s = 0;
          for (int64_t d = 0; d < p.D; ++d) s += q[p.q_at(b, h, i, d)] * k[p.k_at(b, kh, j, d)];
          prob[static_cast<size_t>(j)] = s * scale, mx = std::max(mx, s * scale);
        }
        if (mx == -INFINITY) {  // no allowed key: O = 0, LSE = -inf, no gradient
          for (int64_t d = 0; d < p.D; ++d) o.set_flat(static_cast<int64_t>(p.q_at(b, h, i, d)), 0.0);
          lse.set({b, h, i}, -INFINITY);
          continue;
        }
        for (int64_t j = 0; j < p.Sk; ++j) sum += allowed[j] ? std::exp(prob[static_cast<size_t>(j)] - mx) : 0.0;
        const double row_lse = mx + std::log(sum);
        lse.set({b, h, i}, row_lse);
        for (int64_t j = 0; j < p.Sk; ++j) {
          const double pj = allowed[j] ? std::exp(prob[static_cast<size_t>(j)] - row_lse) : 0.0;
          const bool keep = !dropout || tilejit::kernels::dropout_keep_host(rng, bh, static_cast<uint32_t>(i), static_cast<uint32_t>(j));
          prob[static_cast<size_t>(j)] = pj, dropped[static_cast<size_t>(j)] = keep ? pj * keep_scale : 0.0;
        }
        double delta = 0;
        for (int64_t d = 0; d < p.D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < p.Sk; ++j)
            if (allowed[j]) acc += dropped[static_cast<size_t>(j)] * v[p.k_at(b, kh, j, d)];
          const auto at = static_cast<int64_t>(p.q_at(b, h, i, d));
          o.set_flat(at, acc);
          delta += dout[p.q_at(b, h, i, d)] * o.get_flat(at);  // the stored O
        }
        r.delta[static_cast<size_t>((b * p.Hq + h) * p.Sq + i)] = delta;
        for (int64_t j = 0; j < p.Sk; ++j) {
          if (!allowed[j]) continue;
          const double pj = prob[static_cast<size_t>(j)], pd = dropped[static_cast<size_t>(j)];
          double dp = 0;
          if (pd != 0)
            for (int64_t d = 0; d < p.D; ++d) dp += dout[p.q_at(b, h, i, d)] * v[p.k_at(b, kh, j, d)];
          const double ds = pj * ((pd != 0 ? dp * keep_scale : 0.0) - delta);
          for (int64_t d = 0; d < p.D; ++d) {
            r.dv[p.k_at(b, kh, j, d)] += pd * dout[p.q_at(b, h, i, d)];
            r.dq[p.q_at(b, h, i, d)] += scale * ds * k[p.k_at(b, kh, j, d)];
            r.dk[p.k_at(b, kh, j, d)] += scale * ds * q[p.q_at(b, h, i, d)];
          }
        }
      }
    }
  return r;
}

}  // namespace testing
