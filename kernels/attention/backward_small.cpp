// The backward's small kernels (kernels/attention/backward.hpp): attention_bwd_preprocess (Delta
// before dK/dV and dQ) and the dQ reductions' last step after dK/dV, attention_bwd_dq_convert
// (atomic, ordered) and attention_bwd_dq_reduce (split).
#include <optional>

#include "kernels/attention/backward.hpp"
#include "kernels/attention/backward_common.hpp"

namespace tilejit::kernels {

using namespace lang;
using backward_detail::element_pointer;
using backward_detail::HeadRows;
using backward_detail::kRowMajor;

const Kernel& attention_backward_preprocess() {
  static const Kernel kern = kernel("attention_bwd_preprocess", [](Builder& kb) {
    const PreprocessConfig cfg = PreprocessConfig::read(kb);
    const DType T = cfg.spec.dtype;
    const int64_t BM = cfg.block_m, D = cfg.spec.head_dim;
    const bool varlen = cfg.spec.varlen;
    const int rank = varlen ? 3 : 4;
    auto O = kb.tensor("O", T, rank, kRowMajor), dO = kb.tensor("dO", T, rank, kRowMajor);
    auto Delta = kb.tensor("Delta", f32, rank - 1, {.contiguous_last = true});
    Tile cu_q;  // VARLEN: i32[batch + 1] query offsets (the only side this kernel reads)
    if (varlen) cu_q = kb.pointer("cu_seqlens_q", i32);
    auto m0 = program_id(0) * BM, h = program_id(1);
    HeadRows rows(program_id(2), D, cfg.spec.bshd, varlen, cu_q);
    // a block past its sequence's end reads padding and writes nothing (outside the views)
    O = rows.queries(O), dO = rows.queries(dO), Delta = rows.queries(Delta);
    auto o = cast(f32, load(rows(O, h, m0, BM))), dout = cast(f32, load(rows(dO, h, m0, BM)));
    store(rows(Delta, h, m0, BM), sum(o * dout, 1));
  });
  return kern;
}

const Kernel& attention_backward_dq_convert() {
  static const Kernel kern = kernel("attention_bwd_dq_convert", [](Builder& kb) {
    const DqConvertConfig cfg = DqConvertConfig::read(kb);
    const DType T = cfg.spec.dtype;
    const int64_t BM = cfg.block_m, D = cfg.spec.head_dim;
    auto accum = kb.tensor("dQ_accum", f32, 4, kRowMajor);
    auto dQ = kb.tensor("dQ", cfg.accumulate ? f32 : T, 4, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    auto m0 = program_id(0) * BM, h = program_id(1);
    HeadRows rows(program_id(2), D, cfg.spec.bshd, /*varlen=*/false);
    Tile scaled = load(accum.block({rows.b, h, m0, 0}, {BM, D})) * softmax_scale;
    // ACCUMULATE: the f32 sums += this call's dQ (gradient accumulation, context parallelism's sums)
    if (cfg.accumulate) store(rows(dQ, h, m0, BM), load(rows(dQ, h, m0, BM)) + scaled);
    else store(rows(dQ, h, m0, BM), cast(T, scaled));
  });
  return kern;
}

const Kernel& attention_backward_dq_reduce() {
  static const Kernel kern = kernel("attention_bwd_dq_reduce", [](Builder& kb) {
    const DqReduceConfig cfg = DqReduceConfig::read(kb);
    const DType T = cfg.spec.dtype;
    const int64_t BM = cfg.block_m, BN = cfg.block_n, D = cfg.spec.head_dim;
    const bool causal = cfg.spec.causal;
    auto parts = kb.tensor("dQ_parts", f32, 5, kRowMajor);
    auto dQ = kb.tensor("dQ", T, 4, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    auto S_k = kb.scalar<int>("S_k");
    std::optional<AttentionMask> mask;  // a library mask: its parameters, then (no tile intervals) the classes
    Tensor classes;
    if (cfg.spec.library_mask()) {
      mask.emplace(kb, cfg.spec.mask);
      if (!mask->has_tile_intervals()) classes = kb.tensor("block_classes", u8, 4);
    }
    auto m_block = program_id(0), h = program_id(1);
    auto m0 = m_block * BM;
    HeadRows rows(program_id(2), D, cfg.spec.bshd, /*varlen=*/false);
    auto S_q = rows.seq_len(dQ);
    auto bh = rows.b * dQ.size(rows.head_dim()) + h;
    // Parts in increasing key tile order, from +0.0: the order is fixed, so the sum is the same
    // whatever order the dK/dV programs ran in.
    Var acc = zeros(f32, {BM, D});
    auto add = [&](const Tile& n) { acc = acc + load(parts.block({bh, m_block, n, 0, 0}, {BM, D}, {3, 4})); };
    if (!mask) {
      // the key tiles that see a row of this tile: all, or (causal) up to the last key its last row sees
      Tile key_end = causal ? minimum(S_k, m0 + BM + (S_k - S_q)) : S_k;
      for_range(0, key_end, BN, [&](Tile n0) { add(n0 / BN); });
    } else if (mask->has_tile_intervals()) {
      mask->bind(rows.b, h, S_q, S_k).key_tiles(m0, BM, BN).for_each(BN, [&](Tile n0) { add(n0 / BN); });
    } else {
      auto cb = where(classes.size(0) == 1, 0, rows.b), ch = where(classes.size(1) == 1, 0, h);
      for_range(0, cdiv(S_k, BN), [&](Tile n) {
        if_(load(element_pointer(classes, {cb, ch, m_block, n})) != 0, [&] { add(n); });  // BlockClass::empty = 0
      });
    }
    store(rows(dQ, h, m0, BM), cast(T, acc * softmax_scale));
  });
  return kern;
}

}  // namespace tilejit::kernels
