// The attention API on the GPU (ctest label "gpu"): a randomized sweep of shapes and options
// through tilejit::attention::forward/backward against a float64 reference (below: flat arrays,
// one pass per query row, ~0.1 s for the largest case; run on all cores): bf16/f16, D 64/128/256, GQA/MQA, ragged S_q != S_k, causal,
// custom scales, [B,S,H,D] / [B,H,S,D] (as permuted views) / padded row pitches, variable-length
// batches (forward and backward, empty sequences included) when the kernels have the VARLEN meta;
// dropout (issue 7: p 0.1/0.5, 64-bit seeds and offsets, default and custom schedules): the
// reference applies the host keep-mask (kernels/philox_host.hpp) and the mask the forward returns
// must be the host mask bit for bit at every visible element; library masks (Options::mask: windows,
// global + window, documents with per-batch or broadcast ids, prefix LM, share-question, causal
// blockwise, block-sparse tables per head or per batch, causal through the mask), forward and
// backward, with and without dropout and a caller's workspace: the reference applies the host
// twin's dense mask (kernels::dense_mask).
// Outputs, LSE, gradients and the workspace are poisoned (0xFF = NaN) before each run. Skips visibly without a GPU.
// The backward's dQ reductions (Options::dq_reduction: recompute, atomic, split, ordered) have a
// test case of their own: float64 on a few shapes, and split / ordered bit-identical run to run.
// The masked reference is checked against tests/attention_reference.hpp's on the CPU (no GPU needed).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "attention_api_helpers.hpp"
#include "attention_reference.hpp"
#include "attention_score_mod_reference.hpp"
#include "dropout_key_args.hpp"
#include "host_bits.hpp"
#include "api/attention.hpp"
#include "kernels/attention/mask_host.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"

using namespace tilejit;
using runtime::DeviceTensor;
using runtime::HostTensor;

namespace {

// The shape of one attention problem; tensors of it are flat [B, H, S, D] arrays of doubles.
struct AttentionCase {
  int B, Hq, Hkv, Sq, Sk, D;
  bool causal, bshd;  // bshd: the host tensors' logical order is [B, S, H, D] (else [B, H, S, D])

  std::string describe() const {
    return fmt::format("B={} Hq={} Hkv={} Sq={} Sk={} D={} causal={}", B, Hq, Hkv, Sq, Sk, D, causal);
  }
  ir::Shape shape(int h, int s) const { return bshd ? ir::Shape{B, s, h, D} : ir::Shape{B, h, s, D}; }
  // Query row i sees keys [0, visible(i)): bottom-right causal alignment.
  int visible(int i) const { return causal ? std::min(Sk, std::max(0, i + (Sk - Sq) + 1)) : Sk; }
  double default_scale() const { return 1.0 / std::sqrt(static_cast<double>(D)); }
};

// A [B, H, S, D] or [B, S, H, D] host tensor as a flat [B, H, S, D] vector.
std::vector<double> to_bhsd(const AttentionCase& c, const HostTensor& t) {
  std::vector<double> all = t.to_f64();
  if (!c.bshd) return all;
  const ir::Shape& s = t.sizes();
  const int64_t S = s[1], H = s[2], D = s[3];
  std::vector<double> out(all.size());
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h)
        std::copy_n(all.begin() + ((b * S + i) * H + h) * D, D, out.begin() + ((b * H + h) * S + i) * D);
  return out;
}

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;  // [B, Hq, Sq, D], [B, Hq, Sq], dq like o, dk/dv [B, Hkv, Sk, D]
};

// softmax(scale Q K^T, masked) V, its natural-log LSE, and (backward) the exact gradients for dO:
// dV = P^T dO, dP = dO V^T, Delta = rowsum(P * dP), dS = P (dP - Delta), dQ = scale dS K,
// dK = scale dS^T Q; dK and dV summed over each key/value head's query heads. `mask` (u8 [B, Hq,
// Sq, Sk], kernels::dense_mask's layout): masked elements contribute nothing. A row that sees no
// key: O = 0, LSE = -inf, zero gradients. With `drop`: O = (P * keep / keep probability) V (LSE of
// the undropped P), dV from the dropped P, dP * keep / keep probability; keep of (bh = (batch0 +
// b) * Hq + h, i, j).
struct DropoutRef {
  kernels::DropoutRngHost rng;
  int batch0 = 0;
};
Reference reference(const AttentionCase& c, const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                    const std::vector<double>& dout, double scale, bool backward, const DropoutRef* drop = nullptr,
                    const std::vector<double>* o_stored = nullptr, const std::vector<uint8_t>* mask = nullptr) {
  const auto D = static_cast<size_t>(c.D);
  Reference r;
  r.o.assign(q.size(), 0.0);
  r.lse.assign(q.size() / D, -INFINITY);
  if (backward) {
    r.dq.assign(q.size(), 0.0);
    r.dk.assign(k.size(), 0.0);
    r.dv.assign(v.size(), 0.0);
  }
  std::vector<double> p(static_cast<size_t>(c.Sk)), dp(static_cast<size_t>(c.Sk)), pd(static_cast<size_t>(c.Sk));
  const double inv_keep = drop ? 256.0 / drop->rng.keep_threshold : 1.0;
  auto dot = [D](const double* x, const double* y) {
    double s = 0;
    for (size_t d = 0; d < D; ++d) s += x[d] * y[d];
    return s;
  };
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      const int kh = h / (c.Hq / c.Hkv);
      const size_t kv0 = static_cast<size_t>(b * c.Hkv + kh) * static_cast<size_t>(c.Sk) * D;
      for (int i = 0; i < c.Sq; ++i) {
        const size_t row = static_cast<size_t>((b * c.Hq + h) * c.Sq + i);
        const double* qi = &q[row * D];
        const auto n = static_cast<size_t>(c.visible(i));
        const uint8_t* allowed = mask ? &(*mask)[row * static_cast<size_t>(c.Sk)] : nullptr;
        const auto sees = [allowed](size_t j) { return !allowed || allowed[j] != 0; };
        double mx = -INFINITY, sum = 0;
        for (size_t j = 0; j < n; ++j)
          if (sees(j)) mx = std::max(mx, p[j] = scale * dot(qi, &k[kv0 + j * D]));
        if (mx == -INFINITY) continue;  // no key (masked elements: p = 0 below, so they add nothing)
        for (size_t j = 0; j < n; ++j) sum += (p[j] = sees(j) ? std::exp(p[j] - mx) : 0.0);
        r.lse[row] = mx + std::log(sum);
        double* oi = &r.o[row * D];
        const auto bh = static_cast<uint32_t>(((drop ? drop->batch0 : 0) + b) * c.Hq + h);
        for (size_t j = 0; j < n; ++j) {
          p[j] /= sum;
          // the dropped, rescaled probability (1 where kept: inv_keep, else 0)
          const double keep = !drop || kernels::dropout_keep_host(drop->rng, bh, static_cast<uint32_t>(i), static_cast<uint32_t>(j))
                                  ? inv_keep
                                  : 0.0;
          pd[j] = p[j] * keep;
          const double* vj = &v[kv0 + j * D];
          for (size_t d = 0; d < D; ++d) oi[d] += pd[j] * vj[d];
          dp[j] = keep;  // for the backward: dP = (dO . v_j) * keep
        }
        if (!backward) continue;
        const double* doi = &dout[row * D];
        double delta = 0;
        for (size_t j = 0; j < n; ++j) delta += p[j] * (dp[j] = dp[j] * dot(doi, &v[kv0 + j * D]));
        // The backward of the output actually stored: Delta = dO . O from the rounded O (what the
        // kernels and FlashAttention compute). With dropout this differs from the exact Delta by
        // O's rounding, which is all that is left of dS when a row sees one key (exact dS = 0).
        if (o_stored) delta = dot(doi, &(*o_stored)[row * D]);
        double* dqi = &r.dq[row * D];
        for (size_t j = 0; j < n; ++j) {
          const double ds = scale * p[j] * (dp[j] - delta);
          const double* kj = &k[kv0 + j * D];
          double* dkj = &r.dk[kv0 + j * D];
          double* dvj = &r.dv[kv0 + j * D];
          for (size_t d = 0; d < D; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
            dvj[d] += pd[j] * doi[d];
          }
        }
      }
    }
  return r;
}

enum class Layout { bshd, bhsd, bshd_padded };
const char* layout_name(Layout l) { return l == Layout::bshd ? "BSHD" : l == Layout::bhsd ? "BHSD(view)" : "BSHD(padded)"; }

struct Case {
  int index = 0;
  uint64_t seed = 0;
  ir::DType dtype = ir::DType::bf16;
  AttentionCase c{};             // dense: the shape; varlen: Hq, Hkv, D, causal (B, Sq, Sk unused)
  Layout layout = Layout::bshd;
  std::optional<float> scale;    // unset: the API's default 1/sqrt(D)
  bool varlen = false;
  std::vector<int> lens_q, lens_k;  // varlen sequence lengths
  bool backward = true;
  bool own_workspace = true;     // false: the API allocates Delta itself
  double dropout_p = 0;          // > 0: dropout with seed/offset below
  uint64_t drop_seed = 0, drop_offset = 0;
  bool small_schedule = false;   // Options::schedule = 64x64, 4 warps, 2 stages (dropout masks across schedules)
  bool precomputed = false;      // dropout: forward and backward read the packed mask (Options::dropout_bits), not Philox
  bool bits_from_gpu = false;    // precomputed: the bits from attention::generate_dropout_bits (else the host twin's)
  // A library mask (Options::mask) and its data, row-major: doc ids [doc_rows, Sk], prefix lengths
  // [B], block table [table_b, table_h, cdiv(Sq, block_q), cdiv(Sk, block_k)].
  std::optional<kernels::MaskSpec> mask;
  std::vector<int32_t> doc_ids, prefix;
  std::vector<uint8_t> table;
  int64_t doc_rows = 1, table_b = 1, table_h = 1;

  kernels::MaskData mask_data() const {
    kernels::MaskData d;
    if (!mask) return d;
    const int64_t nq = (c.Sq + mask->block_q - 1) / std::max<int64_t>(mask->block_q, 1);
    const int64_t nk = (c.Sk + mask->block_k - 1) / std::max<int64_t>(mask->block_k, 1);
    d.doc_ids = {doc_ids, {doc_rows, c.Sk}};
    d.prefix_lengths = {prefix, {c.B}};
    d.block_table = {table, {table_b, table_h, nq, nk}};
    return d;
  }
  // kernels::dense_mask of the case: u8 [B, Hq, Sq, Sk]
  std::vector<uint8_t> dense_mask() const { return kernels::dense_mask(*mask, mask_data(), {c.B, c.Hq, c.Sq, c.Sk}); }

  std::string describe() const {
    std::string s = fmt::format("#{} {} ", index, ir::name(dtype));
    if (varlen)
      s += fmt::format("varlen lens_q [{}] lens_k [{}] Hq={} Hkv={} D={} causal={}", fmt::join(lens_q, ","), fmt::join(lens_k, ","),
                       c.Hq, c.Hkv, c.D, c.causal);
    else
      s += fmt::format("{} {}", c.describe(), layout_name(layout));
    if (scale) s += fmt::format(" scale={:.4f}", *scale);
    if (dropout_p > 0) s += fmt::format(" dropout p={} seed={:#x} offset={:#x}", dropout_p, drop_seed, drop_offset);
    if (small_schedule) s += " schedule 64x64/4w/2st";
    if (precomputed) s += bits_from_gpu ? " precomputed bits (GPU)" : " precomputed bits (host)";
    if (mask) {
      const kernels::MaskSpec& m = *mask;
      s += fmt::format(" mask {}", kernels::mask_kind_name(m.kind));
      switch (m.kind) {
        case kernels::MaskKind::sliding_window: s += fmt::format("(left {}, right {})", m.window_left, m.window_right); break;
        case kernels::MaskKind::causal_sliding_window: s += fmt::format("(left {})", m.window_left); break;
        case kernels::MaskKind::global_sliding_window:
          s += fmt::format("(global {}, left {}, right {})", m.global_tokens, m.window_left, m.window_right);
          break;
        case kernels::MaskKind::prefix_lm: s += fmt::format("(prefixes [{}])", fmt::join(prefix, ",")); break;
        case kernels::MaskKind::block_sparse:
          s += fmt::format("({}x{} blocks, table [{}, {}, ..])", m.block_q, m.block_k, table_b, table_h);
          break;
        default:
          if (kernels::mask_uses_doc_ids(m.kind)) s += fmt::format("(doc ids [{}, Sk], first row [{}])", doc_rows, fmt::join(
              std::vector<int32_t>(doc_ids.begin(), doc_ids.begin() + std::min<int64_t>(c.Sk, 40)), ","));
      }
      if (!own_workspace) s += " (API-allocated workspace)";
    }
    if (!backward) s += " (forward only)";
    return s;
  }
};

// ||got - ref||^2 and ||ref||^2 summed over pieces (the sequences of a varlen batch).
struct RelAcc {
  double num = 0, den = 0;
  void add(const std::vector<double>& got, const std::vector<double>& ref) {
    for (size_t i = 0; i < ref.size(); ++i) {
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
  }
  double value() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

struct Result {
  std::string what;
  std::string error;  // an exception, if one was thrown
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;  // relative errors (lse: max abs difference)
  int64_t nans = 0;                               // NaN elements in any output (unwritten: poison)
  int64_t mask_wrong = 0;                         // dropout: returned mask != host mask at visible elements
  bool ok() const {
    constexpr double tol = 1e-2;
    return error.empty() && nans == 0 && mask_wrong == 0 && o < tol && lse < tol && dq < tol && dk < tol && dv < tol;
  }
};

int64_t count_nans(const HostTensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isnan(t.get_flat(i)) ? 1 : 0;
  return n;
}

// max |got - ref| over a row-major LSE, where -inf must match -inf.
double lse_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i]) return INFINITY;
      continue;
    }
    e = std::max(e, std::abs(got[i] - ref[i]));
  }
  return e;
}

// The host tensor of a [.., heads, seq, D] input in the case's layout (padded: each token's row
// of heads 64 elements wider, so the S stride is not H * D).
HostTensor make_host(const Case& k, int heads, int seq) {
  const AttentionCase& c = k.c;
  if (k.layout != Layout::bshd_padded) return HostTensor(k.dtype, c.shape(heads, seq));
  const int64_t row = int64_t{heads} * c.D + 64;
  return HostTensor(k.dtype, {c.B, seq, heads, c.D}, {seq * row, row, c.D, 1});
}

using ::testing::api_view;

// Options::mask of a masked case: its data as host tensors, handed to `place` (HostTensor ->
// attention::Tensor: uploads, or a fake address for the checks).
template <class Place>
attention::Mask api_mask(const Case& k, Place&& place) {
  const kernels::MaskData md = k.mask_data();
  const auto host = [](ir::DType t, const std::vector<int64_t>& shape, auto const& values) {
    HostTensor h(t, ir::Shape(shape.begin(), shape.end()));
    for (int64_t e = 0; e < h.numel(); ++e) h.set_flat(e, static_cast<double>(values[static_cast<size_t>(e)]));
    return h;
  };
  attention::Mask m{*k.mask, {}, {}, {}};
  if (kernels::mask_uses_doc_ids(k.mask->kind)) m.doc_ids = place(host(ir::DType::i32, md.doc_ids.shape, k.doc_ids));
  if (k.mask->kind == kernels::MaskKind::prefix_lm) m.prefix_lengths = place(host(ir::DType::i32, md.prefix_lengths.shape, k.prefix));
  if (k.mask->kind == kernels::MaskKind::block_sparse) m.block_table = place(host(ir::DType::u8, md.block_table.shape, k.table));
  return m;
}

// Rows [start, start + len) of a packed [total, H, D] tensor as a [1, len, H, D] tensor.
HostTensor slice_seq(const HostTensor& packed, int64_t start, int64_t len) {
  const int64_t H = packed.sizes()[1], D = packed.sizes()[2];
  HostTensor out(packed.dtype(), {1, len, H, D});
  for (int64_t i = 0; i < len * H * D; ++i) out.set_flat(i, packed.get_flat(start * H * D + i));
  return out;
}

Case make_case(int index, bool varlen, bool varlen_backward, bool dropout = false) {
  std::mt19937_64 rng(0x5eed0000 + static_cast<uint64_t>(index));
  auto pick = [&](auto const& v) { return v[rng() % v.size()]; };
  Case k;
  k.index = index;
  k.seed = rng();
  if (dropout) {
    k.dropout_p = index % 2 ? 0.5 : 0.1;
    k.drop_seed = rng();
    k.drop_offset = rng() % 2 ? rng() : rng() % 1000;
  }
  // Every 12 consecutive cases cover dtype x D x mask.
  k.dtype = index % 2 ? ir::DType::f16 : ir::DType::bf16;
  const int D = std::vector<int>{64, 128, 256}[static_cast<size_t>(index / 2 % 3)];
  const bool causal = index / 6 % 2 == 1;
  const int hkv = pick(std::vector<int>{1, 1, 2, 3, 4});
  const int group = pick(std::vector<int>{1, 2, 4});  // hkv = 1, group > 1: multi-query
  if (rng() % 2) k.scale = 0.05f + 0.3f * static_cast<float>(rng() % 1000) / 1000.0f;
  k.own_workspace = rng() % 2 == 0;
  const std::vector<int> seqs{1, 17, 64, 100, 128, 257, 1000};
  constexpr double kBudget = 2.5e7;  // B * Hq * S_q * S_k * D: keeps the float64 reference ~0.2 s
  if (!varlen) {
    k.layout = static_cast<Layout>(index / 12 % 3);
    for (;;) {
      const int B = 1 + static_cast<int>(rng() % 3), Sq = pick(seqs), Sk = rng() % 4 == 0 ? Sq : pick(seqs);
      k.c = AttentionCase{B, hkv * group, hkv, Sq, Sk, D, causal, k.layout != Layout::bhsd};
      if (double(B) * k.c.Hq * Sq * Sk * D <= kBudget) break;
    }
    k.small_schedule = dropout && D <= 128 && rng() % 3 == 0;
    k.precomputed = dropout && rng() % 3 == 0;
    k.bits_from_gpu = k.precomputed && rng() % 2 == 0;
    return k;
  }
  k.varlen = true;
  k.backward = varlen_backward;
  for (;;) {
    const int n = 1 + static_cast<int>(rng() % 4);
    k.lens_q.clear();
    k.lens_k.clear();
    double cost = 0;
    for (int i = 0; i < n; ++i) {
      // empty sequences now and then (queries without keys, keys without queries)
      k.lens_q.push_back(rng() % 8 == 0 ? 0 : pick(seqs));
      k.lens_k.push_back(rng() % 8 == 0 ? 0 : rng() % 3 == 0 ? k.lens_q.back() : pick(seqs));
      cost += double(k.lens_q.back()) * k.lens_k.back();
    }
    const bool some_tokens = *std::max_element(k.lens_q.begin(), k.lens_q.end()) > 0 &&
                             *std::max_element(k.lens_k.begin(), k.lens_k.end()) > 0;  // the API needs total_q/k >= 1
    if (some_tokens && cost * hkv * group * D <= kBudget) break;
  }
  k.c = AttentionCase{1, hkv * group, hkv, 0, 0, D, causal, true};
  return k;
}

// A library mask of `kind` for case k's shape: random integers and data (document runs of random
// lengths, ids in order or repeated out of order; prefixes up to past S_k; block tables per head
// or per batch, about half the blocks on and some rows off). variant picks between the forms.
void add_mask(Case& k, kernels::MaskKind kind, int variant, std::mt19937_64& rng) {
  using kernels::MaskKind;
  const AttentionCase& c = k.c;
  auto below = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(n, 1))); };
  kernels::MaskSpec m;
  m.kind = kind;
  switch (kind) {
    case MaskKind::sliding_window: m.window_left = below(300), m.window_right = rng() % 4 == 0 ? 0 : below(300); break;
    case MaskKind::causal_sliding_window: m.window_left = below(400); break;
    case MaskKind::global_sliding_window: m.global_tokens = below(80), m.window_left = below(200), m.window_right = below(200); break;
    case MaskKind::prefix_lm:
      for (int b = 0; b < c.B; ++b) k.prefix.push_back(static_cast<int32_t>(below(c.Sk + 20)));
      break;
    case MaskKind::block_sparse: {
      const std::vector<int64_t> bq{16, 32, 64, 100, 128}, bk{16, 48, 64, 128, 200};
      m.block_q = bq[rng() % bq.size()], m.block_k = bk[rng() % bk.size()];
      // variant 0: one table per query head (broadcast over the batch); 1: per batch (and head)
      k.table_b = variant == 0 ? 1 : c.B;
      k.table_h = variant == 0 || rng() % 2 ? c.Hq : 1;
      const int64_t nq = (c.Sq + m.block_q - 1) / m.block_q, nk = (c.Sk + m.block_k - 1) / m.block_k;
      for (int64_t r = 0; r < k.table_b * k.table_h * nq; ++r) {
        const bool row_off = rng() % 6 == 0;  // a block row with no key: its queries see nothing
        for (int64_t j = 0; j < nk; ++j) k.table.push_back(!row_off && rng() % 2 ? 1 : 0);
      }
      break;
    }
    default:
      if (kernels::mask_uses_doc_ids(kind)) {
        // variant 0: runs with increasing ids per batch row; 1: one row for the batch, ids from {0, 1, 2} in any order
        k.doc_rows = variant == 0 && rng() % 3 != 0 ? c.B : 1;
        for (int64_t r = 0; r < k.doc_rows; ++r) {
          int32_t id = 0;
          for (int64_t t = 0; t < c.Sk;) {
            const int64_t len = 1 + below(rng() % 3 == 0 ? 8 : c.Sk / 2 + 1);
            for (int64_t e = 0; e < len && t < c.Sk; ++e, ++t) k.doc_ids.push_back(id);
            id = variant == 0 ? id + 1 : static_cast<int32_t>(rng() % 3);
          }
        }
      }
  }
  k.mask = m;
  kernels::check_mask(m, k.mask_data(), {c.B, c.Hq, c.Sq, c.Sk});
}

constexpr int kMaskedCases = 36;

// A masked case: every 12 cover the kinds (block-sparse and documents in two forms, causal through
// the mask); dtype, D, dropout and layouts rotate with the index: few distinct configurations to
// compile (bf16 D64; f16 D128 with dropout; bf16 D128 / D256, half with dropout).
Case make_masked_case(int index) {
  using kernels::MaskKind;
  std::mt19937_64 rng(0x3a5c0000 + static_cast<uint64_t>(index));
  auto pick = [&](auto const& v) { return v[rng() % v.size()]; };
  struct Kind {
    MaskKind kind;
    int variant;
  };
  static const Kind kinds[12] = {{MaskKind::sliding_window, 0},  {MaskKind::causal_sliding_window, 0}, {MaskKind::global_sliding_window, 0},
                                 {MaskKind::document, 0},        {MaskKind::causal_document, 0},       {MaskKind::prefix_lm, 0},
                                 {MaskKind::share_question, 0},  {MaskKind::causal_blockwise, 0},      {MaskKind::block_sparse, 0},
                                 {MaskKind::block_sparse, 1},    {MaskKind::document, 1},              {MaskKind::causal, 0}};
  const int pos = index % 12, group = index / 12 % 3;
  Case k;
  k.index = index;
  k.seed = rng();
  k.dtype = group == 1 ? ir::DType::f16 : ir::DType::bf16;
  const int D = group == 0 ? 64 : group == 2 && pos % 4 == 0 ? 256 : 128;
  if (group == 1 || (group == 2 && pos % 2 == 1)) {
    k.dropout_p = pos % 3 == 0 ? 0.5 : 0.1;
    k.drop_seed = rng();
    k.drop_offset = rng() % 1000;
  }
  k.layout = static_cast<Layout>((index + index / 12) % 3);
  const int hkv = pick(std::vector<int>{1, 2, 3, 4});
  const int gqa = pick(std::vector<int>{1, 2, 4});
  if (rng() % 2) k.scale = 0.05f + 0.3f * static_cast<float>(rng() % 1000) / 1000.0f;
  k.own_workspace = rng() % 3 != 0;
  const std::vector<int> seqs{1, 17, 64, 100, 128, 257, 600, 1000};
  constexpr double kBudget = 2.5e7;
  for (;;) {
    const int B = 1 + static_cast<int>(rng() % 3), Sq = pick(seqs), Sk = rng() % 3 == 0 ? Sq : pick(seqs);
    k.c = AttentionCase{B, hkv * gqa, hkv, Sq, Sk, D, false, k.layout != Layout::bhsd};
    if (double(B) * k.c.Hq * Sq * Sk * D <= kBudget) break;
  }
  add_mask(k, kinds[pos].kind, kinds[pos].variant, rng);
  return k;
}

// One case: inputs on the host, the GPU run under `gpu` (one case at a time on the device), then
// the float64 reference and the comparison outside it.
Result run_case(const Case& k, std::mutex& gpu) {
  Result r;
  r.what = k.describe();
  try {
    const AttentionCase& c = k.c;
    const bool bhsd = k.layout == Layout::bhsd;
    int64_t total_q = 0, total_k = 0;
    std::vector<int32_t> cu_q{0}, cu_k{0};
    for (size_t i = 0; i < k.lens_q.size(); ++i) {
      cu_q.push_back(cu_q.back() + k.lens_q[i]);
      cu_k.push_back(cu_k.back() + k.lens_k[i]);
    }
    total_q = cu_q.back();
    total_k = cu_k.back();
    HostTensor q, kk, v, dout;
    if (k.varlen) {
      q = HostTensor(k.dtype, {total_q, c.Hq, c.D});
      kk = HostTensor(k.dtype, {total_k, c.Hkv, c.D});
      v = HostTensor(k.dtype, {total_k, c.Hkv, c.D});
      dout = HostTensor(k.dtype, {total_q, c.Hq, c.D});
    } else {
      q = make_host(k, c.Hq, c.Sq);
      kk = make_host(k, c.Hkv, c.Sk);
      v = make_host(k, c.Hkv, c.Sk);
      dout = make_host(k, c.Hq, c.Sq);
    }
    q.fill_normal(k.seed, 0, 1);
    kk.fill_normal(k.seed + 1, 0, 1);
    v.fill_normal(k.seed + 2, 0, 1);
    dout.fill_normal(k.seed + 3, 0, 1);
    HostTensor lse_shape = k.varlen ? HostTensor(ir::DType::f32, {c.Hq, total_q}) : HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq});
    HostTensor cuq_h, cuk_h;
    if (k.varlen) {
      cuq_h = HostTensor(ir::DType::i32, {static_cast<int64_t>(cu_q.size())});
      cuk_h = HostTensor(ir::DType::i32, {static_cast<int64_t>(cu_k.size())});
      for (size_t i = 0; i < cu_q.size(); ++i) {
        cuq_h.set_flat(static_cast<int64_t>(i), cu_q[i]);
        cuk_h.set_flat(static_cast<int64_t>(i), cu_k[i]);
      }
    }

    HostTensor o_h, lse_h, dq_h, dk_h, dv_h, mask_h;
    // dropout: the forward's keep-mask, u8 [B * Hq, S_q, S_k] (varlen: [nseq * Hq, max_q, max_k]), 0xFF = not written
    // (not with library masks: those kernels' coordinates are checked through O and the gradients)
    const int64_t mask_b = (k.varlen ? static_cast<int64_t>(k.lens_q.size()) : c.B) * c.Hq;
    const int64_t mask_q = k.varlen ? *std::max_element(k.lens_q.begin(), k.lens_q.end()) : c.Sq;
    const int64_t mask_k = k.varlen ? *std::max_element(k.lens_k.begin(), k.lens_k.end()) : c.Sk;
    const bool want_mask = k.dropout_p > 0 && mask_q > 0 && mask_k > 0 && !k.mask;
    {
      std::lock_guard lock(gpu);
      runtime::Stream stream;
      auto dq_in = DeviceTensor::from_host(q), dk_in = DeviceTensor::from_host(kk), dv_in = DeviceTensor::from_host(v),
           ddo = DeviceTensor::from_host(dout);
      // Outputs: the inputs' layouts, every byte 0xFF.
      auto d_o = DeviceTensor::empty_like(q), d_dq = DeviceTensor::empty_like(q), d_dk = DeviceTensor::empty_like(kk),
           d_dv = DeviceTensor::empty_like(v), d_lse = DeviceTensor::empty_like(lse_shape);
      attention::Options opts;
      opts.softmax_scale = k.scale;
      opts.causal = c.causal;
      opts.dropout_p = k.dropout_p;
      opts.seed = k.drop_seed;
      opts.offset = k.drop_offset;
      if (k.small_schedule) opts.schedule = attention::Schedule{64, 64, 4, 2};
      DeviceTensor d_bits;  // precomputed: the packed keep-mask from the host twin (the dropout_mask kernel's bits)
      if (k.precomputed) {
        const int64_t words = (c.Sk + 31) / 32;
        const std::vector<uint32_t> packed = kernels::dropout_mask_packed_host(
            {k.drop_seed, k.drop_offset, kernels::dropout_keep_threshold(k.dropout_p)}, c.B * c.Hq, c.Sq, c.Sk);
        HostTensor bits_h(ir::DType::u32, {c.B * c.Hq, c.Sq, words});
        for (int64_t e = 0; e < bits_h.numel(); ++e) bits_h.set_flat(e, packed[static_cast<size_t>(e)]);
        if (k.bits_from_gpu) {
          // attention::generate_dropout_bits (the dropout_mask kernel) must write exactly the host's bits
          bits_h.poison();
          d_bits = DeviceTensor::from_host(bits_h);
          attention::generate_dropout_bits(api_view(d_bits, false), c.B, c.Hq, c.Sq, c.Sk, opts, stream.handle());
          stream.synchronize();
          const HostTensor got = d_bits.to_host();
          int64_t differ = 0;
          for (int64_t e = 0; e < got.numel(); ++e) differ += got.get_flat(e) != static_cast<double>(packed[static_cast<size_t>(e)]);
          CHECK(differ == 0);
        } else {
          d_bits = DeviceTensor::from_host(bits_h);
        }
        opts.dropout_bits = api_view(d_bits, false);
      }
      DeviceTensor d_mask;
      if (want_mask) {
        d_mask = DeviceTensor::empty_like(HostTensor(ir::DType::u8, {mask_b, mask_q, mask_k}));
        opts.dropout_mask = api_view(d_mask, false);
      }
      DeviceTensor d_cuq, d_cuk;
      if (k.varlen) {
        d_cuq = DeviceTensor::from_host(cuq_h);
        d_cuk = DeviceTensor::from_host(cuk_h);
        opts.cu_seqlens_q = api_view(d_cuq, false);
        opts.cu_seqlens_k = api_view(d_cuk, false);
        opts.max_seqlen_q = *std::max_element(k.lens_q.begin(), k.lens_q.end());
        opts.max_seqlen_k = *std::max_element(k.lens_k.begin(), k.lens_k.end());
      }
      // a library mask: its data on the device
      std::vector<DeviceTensor> mask_data;
      mask_data.reserve(3);
      if (k.mask) opts.mask = api_mask(k, [&](const HostTensor& h) { return api_view(mask_data.emplace_back(DeviceTensor::from_host(h)), false); });
      const auto Q = api_view(dq_in, bhsd), K = api_view(dk_in, bhsd), V = api_view(dv_in, bhsd), O = api_view(d_o, bhsd);
      const auto L = api_view(d_lse, false);
      // a caller's workspace, poisoned (the pre-pass writes counts and list entries, never the rest)
      const auto workspace = [&](runtime::DeviceBuffer& buf, size_t bytes) {
        if (!k.own_workspace || bytes == 0) return attention::Workspace{};
        buf = runtime::DeviceBuffer(bytes);
        buf.fill_bytes(0xFF);
        return attention::Workspace{buf.ptr(), buf.bytes()};
      };
      runtime::DeviceBuffer fws;
      attention::forward(Q, K, V, O, L, opts, stream.handle(), workspace(fws, attention::forward_workspace_bytes(Q, K, opts)));
      opts.dropout_mask.reset();  // (the backward ignores it)
      if (k.backward) {
        runtime::DeviceBuffer ws;
        const attention::Workspace w =
            workspace(ws, k.mask || opts.dropout_p > 0 ? attention::backward_workspace_bytes(Q, K, opts)  // (with dropout: the mask's words)
                                                       : attention::backward_workspace_bytes(Q, opts));
        attention::backward(Q, K, V, O, api_view(ddo, bhsd), L, api_view(d_dq, bhsd), api_view(d_dk, bhsd), api_view(d_dv, bhsd),
                            opts, stream.handle(), w);
      }
      stream.synchronize();
      o_h = d_o.to_host();
      lse_h = d_lse.to_host();
      if (want_mask) mask_h = d_mask.to_host();  // (a default DeviceTensor has numel() 1: no sizes)
      if (k.backward) {
        dq_h = d_dq.to_host();
        dk_h = d_dk.to_host();
        dv_h = d_dv.to_host();
      }
    }
    r.nans = count_nans(o_h) + count_nans(lse_h) + (k.backward ? count_nans(dq_h) + count_nans(dk_h) + count_nans(dv_h) : 0);

    RelAcc eo, edq, edk, edv;
    const auto compare = [&](const AttentionCase& cc, const HostTensor& qq, const HostTensor& kt, const HostTensor& vt,
                             const HostTensor& dot, const HostTensor& og, const std::vector<double>& lse_got, const HostTensor* dqg,
                             const HostTensor* dkg, const HostTensor* dvg, int batch0 = 0) {
      const double scale = k.scale ? static_cast<double>(*k.scale) : cc.default_scale();
      std::optional<DropoutRef> drop;
      if (k.dropout_p > 0) drop = DropoutRef{{k.drop_seed, k.drop_offset, kernels::dropout_keep_threshold(k.dropout_p)}, batch0};
      if (want_mask) {
        // the returned mask at every visible element of these batches
        for (int b = 0; b < cc.B; ++b)
          for (int h = 0; h < cc.Hq; ++h)
            for (int i = 0; i < cc.Sq; ++i)
              for (int j = 0; j < cc.visible(i); ++j) {
                const int64_t bh = int64_t{batch0 + b} * cc.Hq + h;
                const bool keep = kernels::dropout_keep_host(drop->rng, static_cast<uint32_t>(bh), static_cast<uint32_t>(i),
                                                             static_cast<uint32_t>(j));
                r.mask_wrong += mask_h.get({bh, i, j}) != (keep ? 1.0 : 0.0) ? 1 : 0;
              }
      }
      const std::vector<double> o_stored = to_bhsd(cc, og);
      const std::vector<uint8_t> dense = k.mask ? k.dense_mask() : std::vector<uint8_t>{};
      const Reference ref = reference(cc, to_bhsd(cc, qq), to_bhsd(cc, kt), to_bhsd(cc, vt), to_bhsd(cc, dot), scale, k.backward,
                                      drop ? &*drop : nullptr, drop ? &o_stored : nullptr, k.mask ? &dense : nullptr);
      eo.add(to_bhsd(cc, og), ref.o);
      r.lse = std::max(r.lse, lse_error(lse_got, ref.lse));
      if (!k.backward) return;
      edq.add(to_bhsd(cc, *dqg), ref.dq);
      edk.add(to_bhsd(cc, *dkg), ref.dk);
      edv.add(to_bhsd(cc, *dvg), ref.dv);
    };
    if (!k.varlen) {
      compare(c, q, kk, v, dout, o_h, lse_h.to_f64(), &dq_h, &dk_h, &dv_h);
    } else {
      for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
        const int lq = k.lens_q[s], lk = k.lens_k[s];
        const AttentionCase cc{1, c.Hq, c.Hkv, lq, lk, c.D, c.causal, true};
        std::vector<double> lse_got;
        for (int h = 0; h < c.Hq; ++h)
          for (int i = 0; i < lq; ++i) lse_got.push_back(lse_h.get({h, cu_q[s] + i}));
        HostTensor dqs, dks, dvs;
        if (k.backward) {
          dqs = slice_seq(dq_h, cu_q[s], lq);
          dks = slice_seq(dk_h, cu_k[s], lk);
          dvs = slice_seq(dv_h, cu_k[s], lk);
        }
        compare(cc, slice_seq(q, cu_q[s], lq), slice_seq(kk, cu_k[s], lk), slice_seq(v, cu_k[s], lk), slice_seq(dout, cu_q[s], lq),
                slice_seq(o_h, cu_q[s], lq), lse_got, &dqs, &dks, &dvs, static_cast<int>(s));
      }
    }
    r.o = eo.value();
    if (k.backward) {
      r.dq = edq.value();
      r.dk = edk.value();
      r.dv = edv.value();
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

// A bf16 tensor of `shape` with N(0, 1) entries from `seed`.
HostTensor normal_bf16(const ir::Shape& shape, uint64_t seed) {
  HostTensor t(ir::DType::bf16, shape);
  t.fill_normal(seed, 0, 1);
  return t;
}

// The checks every GPU case starts with: true when it can run here, else false after a visible
// SKIPPED message naming what is missing.
bool runs_here(bool needs_backward = false, bool needs_dropout = false, bool needs_masks = false) {
  if (const auto& drv = runtime::Driver::get(); !drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return false;
  }
  if (needs_backward && !attention::backward_available()) {
    MESSAGE("SKIPPED: the backward kernels are not in this build");
    return false;
  }
  if (needs_dropout && !attention::dropout_supported()) {
    MESSAGE("SKIPPED: the attention kernels have no DROPOUT meta");
    return false;
  }
  if (needs_masks && !attention::masks_supported()) {
    MESSAGE("SKIPPED: the attention kernels have no MASK meta");
    return false;
  }
  return true;
}

// A [B, S, H, D] case's bf16 inputs, N(0, 1) from seeds seed .. seed + 3 (q, k, v, dout).
struct CaseInputs {
  HostTensor q, k, v, dout;
  CaseInputs(const AttentionCase& c, uint64_t seed)
      : q(normal_bf16(c.shape(c.Hq, c.Sq), seed)), k(normal_bf16(c.shape(c.Hkv, c.Sk), seed + 1)),
        v(normal_bf16(c.shape(c.Hkv, c.Sk), seed + 2)), dout(normal_bf16(c.shape(c.Hq, c.Sq), seed + 3)) {}
};

// One way of running a case on the GPU: the inputs uploaded, fresh outputs, the API's views of
// them and its calls on them -- the cases below compare two or more ways bit for bit.
struct DeviceCall {
  DeviceTensor q, k, v, dout, o, lse, dq, dk, dv;
  DeviceCall(const AttentionCase& c, const CaseInputs& in)
      : q(DeviceTensor::from_host(in.q)), k(DeviceTensor::from_host(in.k)), v(DeviceTensor::from_host(in.v)),
        dout(DeviceTensor::from_host(in.dout)), o(DeviceTensor::empty_like(in.q)),
        lse(DeviceTensor::empty_like(HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq}))), dq(DeviceTensor::empty_like(in.q)),
        dk(DeviceTensor::empty_like(in.k)), dv(DeviceTensor::empty_like(in.v)) {}
  static attention::Tensor view(const DeviceTensor& t) { return api_view(t, false); }
  void forward(const attention::Options& opts, const runtime::Stream& stream) {
    attention::forward(view(q), view(k), view(v), view(o), view(lse), opts, stream.handle());
  }
  void backward(const attention::Options& opts, const runtime::Stream& stream, attention::Workspace w = {}) {
    attention::backward(view(q), view(k), view(v), view(o), view(dout), view(lse), view(dq), view(dk), view(dv), opts,
                        stream.handle(), w);
  }
  // o and lse, then (with_gradients) dq, dk and dv, read back as doubles
  std::vector<std::vector<double>> outputs(bool with_gradients) const {
    std::vector<std::vector<double>> out;
    for (const DeviceTensor* t : {&o, &lse, &dq, &dk, &dv}) out.push_back(t->to_host().to_f64());
    if (!with_gradients) out.resize(2);
    return out;
  }
  std::vector<std::vector<double>> gradients() const {
    std::vector<std::vector<double>> out;
    for (const DeviceTensor* t : {&dq, &dk, &dv}) out.push_back(t->to_host().to_f64());
    return out;
  }
};

// Every way's outputs equal the first way's, bit for bit; the first's hold no NaN (and, with
// `nonzero`, not only zeros). `names`: what the outputs are, for the failure message.
void check_ways_equal(const std::vector<std::vector<std::vector<double>>>& ways, const char* names, bool nonzero) {
  for (size_t i = 0; i < ways[0].size(); ++i) {
    INFO("output " << i << " (" << names << ")");
    CHECK(std::ranges::none_of(ways[0][i], [](double x) { return std::isnan(x); }));
    if (nonzero) CHECK(std::ranges::any_of(ways[0][i], [](double x) { return x != 0.0; }));
    for (size_t w = 1; w < ways.size(); ++w) {
      INFO("way " << w);
      CHECK(ways[w][i] == ways[0][i]);  // (-inf LSE rows compare equal; NaN would differ)
    }
  }
}

}  // namespace

TEST_CASE("gpu: attention API sweep (forward + backward) against float64") {
  if (const auto& drv = runtime::Driver::get(); !drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const bool bwd = attention::backward_available();
  const bool varlen_fwd = attention::varlen_supported(false), varlen_bwd = attention::varlen_supported(true);
  if (!bwd) MESSAGE("NOTE: the backward kernels are not in this build: forward only");
  if (!varlen_fwd) MESSAGE("NOTE: the attention kernels have no VARLEN meta yet: variable-length cases skipped");

  constexpr int kDense = 216, kVarlen = 48, kDropout = 48, kDropoutVarlen = 12;
  const bool dropout = attention::dropout_supported();
  if (!dropout) MESSAGE("NOTE: the attention kernels have no DROPOUT meta: dropout cases skipped");
  std::vector<Case> cases;
  for (int i = 0; i < kDense; ++i) {
    cases.push_back(make_case(i, false, false));
    cases.back().backward = bwd;
  }
  if (varlen_fwd)
    for (int i = 0; i < kVarlen; ++i) cases.push_back(make_case(kDense + i, true, varlen_bwd && bwd));
  if (dropout) {
    for (int i = 0; i < kDropout; ++i) {
      cases.push_back(make_case(kDense + kVarlen + i, false, false, true));
      cases.back().backward = bwd;
    }
    if (varlen_fwd)
      for (int i = 0; i < kDropoutVarlen; ++i) cases.push_back(make_case(kDense + kVarlen + kDropout + i, true, varlen_bwd && bwd, true));
  }
  const bool masks = attention::masks_supported();
  if (!masks) MESSAGE("NOTE: the attention kernels have no MASK meta: masked cases skipped");
  int masked = 0;
  if (masks)
    for (int i = 0; i < kMaskedCases; ++i) {
      Case k = make_masked_case(i);
      if (k.dropout_p > 0 && !dropout) continue;
      k.backward = bwd;
      cases.push_back(std::move(k));
      ++masked;
    }

  const unsigned workers = std::clamp(std::thread::hardware_concurrency(), 2u, 16u);
  // Compile every configuration first, in parallel (the JIT needs no GPU and caches on disk).
  {
    struct Cfg {
      ir::DType t;
      int d;
      kernels::MaskKind mask;  // full, causal or a library mask
      bool varlen, backward, dropout;
      auto key() const { return std::tuple(static_cast<int>(t), d, static_cast<int>(mask), varlen, backward, dropout); }
    };
    std::vector<Cfg> cfgs;
    for (ir::DType t : {ir::DType::bf16, ir::DType::f16})
      for (int d : {64, 128, 256})
        for (bool causal : {false, true})
          for (bool varlen : {false, true})
            for (bool drop : {false, true})
              if ((!varlen || varlen_fwd) && (!drop || dropout))
                cfgs.push_back({t, d, causal ? kernels::MaskKind::causal : kernels::MaskKind::full, varlen, varlen ? varlen_bwd && bwd : bwd,
                                drop});
    // the masked cases' configurations (with their pre-passes), each once
    for (const Case& k : cases)
      if (k.mask) {
        const Cfg cfg{k.dtype, k.c.D, k.mask->kind, false, k.backward, k.dropout_p > 0};
        if (std::ranges::none_of(cfgs, [&](const Cfg& o) { return o.key() == cfg.key(); })) cfgs.push_back(cfg);
      }
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::vector<std::string> failures;
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (size_t i; (i = next++) < cfgs.size();) {
          try {
            attention::prepare(cfgs[i].t, cfgs[i].d, cfgs[i].mask, cfgs[i].varlen, cfgs[i].backward, {}, 0, cfgs[i].dropout);
          } catch (const std::exception& e) {
            std::lock_guard lock(mu);
            failures.push_back(fmt::format("{} D={} mask={} varlen={} dropout={}: {}", ir::name(cfgs[i].t), cfgs[i].d,
                                           kernels::mask_kind_name(cfgs[i].mask), cfgs[i].varlen, cfgs[i].dropout, e.what()));
          }
        }
      });
    for (auto& t : pool) t.join();
    for (const auto& f : failures) FAIL_CHECK("compile failed: " << f);
    MESSAGE(fmt::format("compiled {} configurations in {:.1f} s", cfgs.size(),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  }

  std::vector<Result> results(cases.size());
  std::mutex gpu;
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < cases.size();) results[i] = run_case(cases[i], gpu);
    });
  for (auto& t : pool) t.join();

  Result worst;
  int failed = 0;
  for (const Result& r : results) {
    worst.o = std::max(worst.o, r.o);
    worst.lse = std::max(worst.lse, r.lse);
    worst.dq = std::max(worst.dq, r.dq);
    worst.dk = std::max(worst.dk, r.dk);
    worst.dv = std::max(worst.dv, r.dv);
    worst.nans += r.nans;
    worst.mask_wrong += r.mask_wrong;
    if (!r.ok()) {
      ++failed;
      FAIL_CHECK(fmt::format("{}: {}", r.what,
                             r.error.empty() ? fmt::format("rel. errors O {:.2e} dQ {:.2e} dK {:.2e} dV {:.2e}, LSE max abs {:.2e}, {} NaN, "
                                                           "{} mask elements wrong",
                                                           r.o, r.dq, r.dk, r.dv, r.lse, r.nans, r.mask_wrong)
                                             : r.error));
    }
  }
  const std::string summary =
      fmt::format("attention sweep: {} cases ({} varlen, {} dropout, {} masked, backward {}), {} failed; worst rel. error O {:.2e} "
                  "dQ {:.2e} dK {:.2e} dV {:.2e}, worst LSE abs {:.2e}, NaN elements {}, wrong mask elements {}; {:.1f} s",
                  cases.size(), varlen_fwd ? kVarlen : 0, dropout ? kDropout + (varlen_fwd ? kDropoutVarlen : 0) : 0, masked,
                  bwd ? (varlen_bwd ? "all" : "dense only") : "none", failed, worst.o, worst.dq, worst.dk, worst.dv, worst.lse,
                  worst.nans, worst.mask_wrong,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  MESSAGE(summary);
  fmt::print("{}\n", summary);
  CHECK(failed == 0);
}

// The sweep's masked reference (flat arrays) against tests/attention_reference.hpp's with the same
// dense mask, on small cases of every kind (no GPU): the two agree to rounding, rows left without
// a key give LSE = -inf and zero output and dQ, and the dense causal mask is the causal case.
TEST_CASE("attention sweep: the masked float64 reference equals attention_reference.hpp's (no GPU)") {
  using kernels::MaskKind;
  int keyless_rows = 0;
  for (int index = 0; index < 24; ++index) {
    std::mt19937_64 rng(0xc0ffee00 + static_cast<uint64_t>(index));
    Case k;
    k.index = index;
    const std::vector<int> seqs{1, 7, 23, 40};
    const int hkv = 1 + static_cast<int>(rng() % 2), Sq = seqs[rng() % seqs.size()], Sk = seqs[rng() % seqs.size()];
    k.c = AttentionCase{1 + static_cast<int>(rng() % 2), hkv * (1 + static_cast<int>(rng() % 2)), hkv, Sq, Sk, 8, false, false};
    const MaskKind kinds[] = {MaskKind::sliding_window, MaskKind::causal_sliding_window, MaskKind::global_sliding_window,
                              MaskKind::document,       MaskKind::causal_document,       MaskKind::prefix_lm,
                              MaskKind::share_question, MaskKind::causal_blockwise,      MaskKind::block_sparse,
                              MaskKind::block_sparse,   MaskKind::document,              MaskKind::causal};
    add_mask(k, kinds[index % 12], index % 12 >= 9 ? 1 : 0, rng);
    if (k.mask->kind == MaskKind::sliding_window && index >= 12) k.mask->window_left = k.mask->window_right = 0;  // (some rows keyless when S_q > S_k)
    INFO(k.describe());
    const AttentionCase& c = k.c;
    HostTensor q(ir::DType::f32, {c.B, c.Hq, c.Sq, c.D}), kt(ir::DType::f32, {c.B, c.Hkv, c.Sk, c.D}),
        v(ir::DType::f32, {c.B, c.Hkv, c.Sk, c.D}), dout(ir::DType::f32, {c.B, c.Hq, c.Sq, c.D});
    q.fill_normal(k.seed + 1, 0, 1);
    kt.fill_normal(k.seed + 2, 0, 1);
    v.fill_normal(k.seed + 3, 0, 1);
    dout.fill_normal(k.seed + 4, 0, 1);
    const double scale = 0.3;
    const std::vector<uint8_t> dense = k.dense_mask();
    const Reference flat = reference(c, q.to_f64(), kt.to_f64(), v.to_f64(), dout.to_f64(), scale, true, nullptr, nullptr, &dense);
    const testing::AttentionCase tc{c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, false, false};
    const testing::AttentionForwardRef f = testing::attention_forward_ref(tc, q, kt, v, scale, &dense);
    const testing::AttentionBackwardRef g = testing::attention_backward_ref(tc, q, kt, v, dout, scale, &dense);
    CHECK(testing::rel_error(flat.o, f.o) < 1e-12);
    CHECK(lse_error(flat.lse, f.lse) < 1e-12);
    CHECK(testing::rel_error(flat.dq, g.dq) < 1e-12);
    CHECK(testing::rel_error(flat.dk, g.dk) < 1e-12);
    CHECK(testing::rel_error(flat.dv, g.dv) < 1e-12);
    for (size_t row = 0; row < f.lse.size(); ++row) {
      const bool none = std::none_of(dense.begin() + static_cast<std::ptrdiff_t>(row * static_cast<size_t>(c.Sk)),
                                     dense.begin() + static_cast<std::ptrdiff_t>((row + 1) * static_cast<size_t>(c.Sk)),
                                     [](uint8_t a) { return a != 0; });
      CHECK((f.lse[row] == -INFINITY) == none);
      if (!none) continue;
      ++keyless_rows;
      for (int d = 0; d < c.D; ++d) {
        CHECK(f.o[row * static_cast<size_t>(c.D) + static_cast<size_t>(d)] == 0.0);
        CHECK(g.dq[row * static_cast<size_t>(c.D) + static_cast<size_t>(d)] == 0.0);
      }
    }
    if (k.mask->kind == MaskKind::causal) {
      // the dense causal mask on a non-causal case is the causal case
      const testing::AttentionCase causal{c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, true, false};
      const testing::AttentionForwardRef fc = testing::attention_forward_ref(causal, q, kt, v, scale);
      const testing::AttentionBackwardRef gc = testing::attention_backward_ref(causal, q, kt, v, dout, scale);
      CHECK(f.o == fc.o);
      CHECK(f.lse == fc.lse);
      CHECK(g.dq == gc.dq);
      CHECK(g.dk == gc.dk);
      CHECK(g.dv == gc.dv);
    }
  }
  CHECK(keyless_rows > 0);
}

// Options::mask = causal is options.causal = true: the same kernels, the same bits (forward and
// backward, with dropout).
TEST_CASE("gpu: attention API, mask kind causal equals options.causal bit for bit") {
  if (!runs_here(false, false, true)) return;
  const bool bwd = attention::backward_available();
  const AttentionCase c{2, 4, 2, 200, 300, 64, true, true};
  const CaseInputs in(c, 1);
  std::vector<std::vector<std::vector<double>>> outputs;
  for (int way = 0; way < 2; ++way) {
    runtime::Stream stream;
    DeviceCall call(c, in);
    attention::Options opts;
    if (way == 0) opts.causal = true;
    else opts.mask = attention::Mask{kernels::MaskSpec::causal(), {}, {}, {}};
    if (attention::dropout_supported()) {
      opts.dropout_p = 0.2;
      opts.seed = 0x1234567890ull;
    }
    call.forward(opts, stream);
    if (bwd) call.backward(opts, stream);
    stream.synchronize();
    outputs.push_back(call.outputs(bwd));
  }
  check_ways_equal(outputs, "o, lse, dq, dk, dv", false);
}

// options.accumulate_gradients: f32 dq, dk, dv prefilled with random values receive += the
// gradients; minus the prefill they are the plain backward's (bf16) up to its rounding. D 64 and
// 128, causal and not, with dropout (the kernels' epilogues on the wgmma paths), with the recompute
// and the atomic reduction.
TEST_CASE("gpu: attention API, accumulate_gradients adds the plain backward's gradients") {
  if (!runs_here(true)) return;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      const AttentionCase c{2, 4, 2, 200, 300, static_cast<int>(D), causal, true};
      INFO("D " << D << " causal " << causal);
      const CaseInputs in(c, 1);
      HostTensor pq(ir::DType::f32, c.shape(c.Hq, c.Sq)), pk(ir::DType::f32, c.shape(c.Hkv, c.Sk)), pv(ir::DType::f32, c.shape(c.Hkv, c.Sk));
      pq.fill_normal(5, 0, 1);
      pk.fill_normal(6, 0, 1);
      pv.fill_normal(7, 0, 1);
      runtime::Stream stream;
      DeviceCall call(c, in);
      attention::Options opts;
      opts.causal = causal;
      if (attention::dropout_supported()) opts.dropout_p = 0.1, opts.seed = 77;
      call.forward(opts, stream);
      call.backward(opts, stream);
      // recompute (the kernels' epilogues add) and atomic (dK/dV add; the convert pass adds dQ)
      for (const attention::DqReduction r : {attention::DqReduction::recompute, attention::DqReduction::atomic}) {
        INFO("reduction " << attention::name(r));
        auto s_dq = DeviceTensor::from_host(pq), s_dk = DeviceTensor::from_host(pk), s_dv = DeviceTensor::from_host(pv);
        attention::Options acc = opts;
        acc.accumulate_gradients = true;
        acc.dq_reduction = r;
        const auto view = DeviceCall::view;
        attention::backward(view(call.q), view(call.k), view(call.v), view(call.o), view(call.dout), view(call.lse), view(s_dq),
                            view(s_dk), view(s_dv), acc, stream.handle());
        stream.synchronize();
        for (auto [name, plain, sum, prefill] : {std::tuple{"dq", &call.dq, &s_dq, &pq}, std::tuple{"dk", &call.dk, &s_dk, &pk},
                                                 std::tuple{"dv", &call.dv, &s_dv, &pv}}) {
          const std::vector<double> a = plain->to_host().to_f64(), b = sum->to_host().to_f64(), p0 = prefill->to_f64();
          double worst = 0, big = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            worst = std::max(worst, std::abs(b[i] - p0[i] - a[i]));
            big = std::max(big, std::abs(a[i]));
          }
          INFO(name << ": largest |(sum - prefill) - plain| " << worst << ", largest value " << big);
          CHECK(big > 0.01);
          CHECK(worst <= big / 64 + 1e-4);  // bf16's rounding of the plain output (and the f32 add)
        }
      }
    }
}

// options.backward_phase: dK/dV then dQ in two calls sharing the workspace equal one call bit for
// bit (full, causal, a document mask whose lists the dkdv phase's pre-pass leaves for dQ's, and
// dropout, full and causal, whose dkdv phase leaves the mask's words for dQ's: decision 097).
TEST_CASE("gpu: attention API, backward phases equal one call bit for bit") {
  if (!runs_here(true)) return;
  const AttentionCase c{2, 4, 2, 300, 300, 128, false, true};
  const CaseInputs in(c, 11);
  HostTensor ids_h(ir::DType::i32, {c.B, c.Sk});
  for (int64_t i = 0; i < c.B * c.Sk; ++i) ids_h.set_flat(i, static_cast<int32_t>((i % c.Sk) / 70));
  for (int variant = 0; variant < 5; ++variant) {
    INFO("variant " << variant << " (full, causal, document mask, dropout full, dropout causal)");
    runtime::Stream stream;
    DeviceCall call(c, in);
    const auto d_ids = DeviceTensor::from_host(ids_h);
    attention::Options opts;
    opts.causal = variant == 1 || variant == 4;
    if (variant == 2) opts.mask = attention::Mask{kernels::MaskSpec::document(), api_view(d_ids, false), {}, {}};
    if (variant >= 3) opts.dropout_p = 0.1, opts.seed = 5, opts.dropout_words_max_bytes = size_t{1} << 30;
    call.forward(opts, stream);
    runtime::DeviceBuffer ws(attention::backward_workspace_bytes(DeviceCall::view(call.q), DeviceCall::view(call.k), opts));
    std::vector<std::vector<std::vector<double>>> got;
    for (int way = 0; way < 2; ++way) {
      for (DeviceTensor* t : {&call.dq, &call.dk, &call.dv}) t->poison();
      if (way == 0) {
        call.backward(opts, stream, {ws.ptr(), ws.bytes()});
      } else {
        attention::Options p = opts;
        p.backward_phase = attention::BackwardPhase::dkdv;
        call.backward(p, stream, {ws.ptr(), ws.bytes()});
        p.backward_phase = attention::BackwardPhase::dq;
        call.backward(p, stream, {ws.ptr(), ws.bytes()});
      }
      stream.synchronize();
      got.push_back(call.gradients());
    }
    check_ways_equal(got, "dq, dk, dv", true);
  }
}

// options.rng_state (issue 25, CUDA graphs): seed and offset read from device memory give the
// outputs of the same values passed as scalars, bit for bit -- forward, backward (every kernel
// that regenerates the keep-mask) and generate_dropout_bits -- and the kernels really read the
// memory at run time (other contents there, other outputs; the scalars are ignored).
TEST_CASE("gpu: attention API, dropout's seed and offset from device memory equal the scalars bit for bit") {
  if (!runs_here(false, true)) return;
  const bool bwd = attention::backward_available();
  const uint64_t seed = 0x89abcdef01234567ull, offset = 0x0000000500000003ull;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      const AttentionCase c{2, 4, 2, 200, 300, static_cast<int>(D), causal, true};
      INFO("D " << D << " causal " << causal);
      const CaseInputs in(c, 21);
      std::vector<std::vector<std::vector<double>>> outputs;
      std::vector<uint32_t> bits[2];
      for (int way = 0; way < 3; ++way) {  // scalars; memory (scalars wrong); memory with other contents
        runtime::Stream stream;
        DeviceCall call(c, in);
        auto d_state = DeviceTensor::from_host(testing::rng_state_tensor(way == 2 ? seed + 1 : seed, offset));
        auto d_bits = DeviceTensor::empty_like(HostTensor(ir::DType::u32, {c.B * c.Hq, c.Sq, (c.Sk + 31) / 32}));
        attention::Options opts;
        opts.causal = causal;
        opts.dropout_p = 0.2;
        opts.seed = way == 0 ? seed : 99, opts.offset = way == 0 ? offset : 98;
        if (way > 0) opts.rng_state = attention::contiguous(d_state.ptr(), ir::DType::i64, {2});
        call.forward(opts, stream);
        if (bwd) call.backward(opts, stream);
        if (way < 2) attention::generate_dropout_bits(api_view(d_bits, false), c.B, c.Hq, c.Sq, c.Sk, opts, stream.handle());
        stream.synchronize();
        outputs.push_back(call.outputs(bwd));
        if (way < 2) bits[way] = testing::raw<uint32_t>(d_bits.to_host());
      }
      const auto other_seed = outputs.back();
      outputs.pop_back();
      check_ways_equal(outputs, "o, lse, dq, dk, dv", false);
      CHECK(outputs[0][0] != other_seed[0]);  // another seed in memory: another mask, another O
      CHECK(bits[0] == bits[1]);
      CHECK(bits[0] == kernels::dropout_mask_packed_host({seed, offset, kernels::dropout_keep_threshold(0.2)}, c.B * c.Hq, c.Sq, c.Sk));
    }
}

// Options::dropout_words_max_bytes (decision 097): the fused dropout backward whose dK/dV stores the
// keep-mask's words for dQ to read gives the gradients of the one that draws the mask in both
// kernels, bit for bit -- with the API's own workspace and a caller's sized with k (poisoned), GQA,
// ragged S, full and causal; a caller's workspace sized without k runs the other path, the same.
TEST_CASE("gpu: attention API, the dropout backward drawing its mask once equals drawing it twice bit for bit") {
  if (!runs_here(true, true)) return;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      const AttentionCase c{2, 4, 2, 200, 300, static_cast<int>(D), causal, true};
      INFO("D " << D << " causal " << causal);
      const CaseInputs in(c, 31);
      std::vector<std::vector<std::vector<double>>> grads;
      for (int way = 0; way < 4; ++way) {  // twice (max bytes 0); once, own workspace; once, caller's; caller's sized without k
        runtime::Stream stream;
        DeviceCall call(c, in);
        attention::Options opts;
        opts.causal = causal;
        opts.dropout_p = 0.15;
        opts.seed = 0x1234567, opts.offset = 11;
        opts.dropout_words_max_bytes = way == 0 ? 0 : size_t{1} << 30;  // (D 128 causal's default is twice)
        const auto Q = DeviceCall::view(call.q), K = DeviceCall::view(call.k);
        call.forward(opts, stream);
        const size_t with_words = attention::backward_workspace_bytes(Q, K, opts), without = attention::backward_workspace_bytes(Q, opts);
        // B * Hq * S_q words of cdiv(S_k, 32) each, after Delta
        CHECK(with_words == without + (way == 0 ? 0 : size_t(c.B * c.Hq * c.Sq * ((c.Sk + 31) / 32) * 4 + 255) / 256 * 256));
        runtime::DeviceBuffer ws;
        attention::Workspace w;
        if (way >= 2) {
          ws = runtime::DeviceBuffer(way == 2 ? with_words : without);
          ws.fill_bytes(0xFF);
          w = attention::Workspace{ws.ptr(), ws.bytes()};
        }
        call.backward(opts, stream, w);
        stream.synchronize();
        grads.push_back(call.gradients());
      }
      check_ways_equal(grads, "dq, dk, dv", true);
    }
}

// options.persistent (decision 050): the forward on a persistent grid computes every tile exactly
// as one program per tile does -- D 128 (the ring producer) and D 64, full and causal (S_q > S_k:
// tiles with no key), GQA, a tile count that does not divide the grid.
TEST_CASE("gpu: attention API, the persistent forward equals one program per tile bit for bit") {
  if (!runs_here()) return;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      const AttentionCase c{3, 8, 2, 1000, 700, static_cast<int>(D), causal, true};
      INFO("D " << D << " causal " << causal);
      const CaseInputs in(c, 11);
      std::vector<std::vector<std::vector<double>>> outputs;
      for (int way = 0; way < 2; ++way) {
        runtime::Stream stream;
        DeviceCall call(c, in);
        attention::Options opts;
        opts.causal = causal;
        opts.persistent = way == 1;
        call.forward(opts, stream);
        stream.synchronize();
        outputs.push_back(call.outputs(false));
      }
      check_ways_equal(outputs, "o, lse", false);
    }
}

namespace {

// A masked test's inputs in BSHD: Q, K, V, dO normal (seeds seed..seed + 3), document ids per batch
// row in runs of `first + step * b` tokens, on the host and the device, and the API's views.
struct DocumentInputs {
  HostTensor q, k, v, dout, docs;
  DeviceTensor d_q, d_k, d_v, d_do, d_docs;
  attention::Tensor Q, K, V, dO;
  DocumentInputs(const AttentionCase& c, uint64_t seed, int64_t first, int64_t step)
      : q(ir::DType::bf16, c.shape(c.Hq, c.Sq)), k(ir::DType::bf16, c.shape(c.Hkv, c.Sk)), v(ir::DType::bf16, c.shape(c.Hkv, c.Sk)),
        dout(ir::DType::bf16, c.shape(c.Hq, c.Sq)), docs(ir::DType::i32, {c.B, c.Sk}) {
    q.fill_normal(seed, 0, 1);
    k.fill_normal(seed + 1, 0, 1);
    v.fill_normal(seed + 2, 0, 1);
    dout.fill_normal(seed + 3, 0, 1);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.Sk; ++t) docs.set({b, t}, static_cast<double>(t / (first + step * b)));
    d_q = DeviceTensor::from_host(q), d_k = DeviceTensor::from_host(k), d_v = DeviceTensor::from_host(v);
    d_do = DeviceTensor::from_host(dout), d_docs = DeviceTensor::from_host(docs);
    Q = api_view(d_q, false), K = api_view(d_k, false), V = api_view(d_v, false), dO = api_view(d_do, false);
  }
};

}  // namespace

// options.block_mask: a block mask built once (build_block_mask) gives the same outputs, bit for
// bit, as the calls' own pre-passes: forward, backward with dQ recomputed (dK/dV's and dQ's lists)
// and with split (the reduce kernel reads the block mask's classes); causal document ids with
// ragged documents, S_q != S_k, GQA; the same block mask serves two forward/backward rounds.
TEST_CASE("gpu: attention API, a block mask built once equals the calls' own pre-passes bit for bit") {
  if (const auto& drv = runtime::Driver::get(); !drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return;
  }
  if (!attention::masks_supported() || !attention::backward_available()) {
    MESSAGE("SKIPPED: the attention kernels have no MASK meta or no backward");
    return;
  }
  const AttentionCase c{2, 4, 2, 300, 450, 64, false, true};
  const DocumentInputs in(c, 1, 70, 37);
  const HostTensor &q = in.q, &kk = in.k, &v = in.v;
  const DeviceTensor& d_docs = in.d_docs;
  const attention::Tensor &Q = in.Q, &K = in.K, &V = in.V, &dO = in.dO;
  for (attention::DqReduction reduction : {attention::DqReduction::recompute, attention::DqReduction::split}) {
    INFO("dq_reduction " << static_cast<int>(reduction));
    attention::Options opts;
    opts.mask = attention::Mask{kernels::MaskSpec::causal_document(), api_view(d_docs, false), {}, {}};
    opts.dq_reduction = reduction;
    runtime::DeviceBuffer storage(attention::block_mask_bytes(Q, K, opts));
    runtime::Stream stream;
    const attention::BlockMask bm = attention::build_block_mask(Q, K, opts, {storage.ptr(), storage.bytes()}, stream.handle());
    std::vector<std::vector<double>> outputs[3];  // the calls' own pre-passes, then the block mask twice
    for (int way = 0; way < 3; ++way) {
      auto d_o = DeviceTensor::empty_like(q), d_dq = DeviceTensor::empty_like(q), d_dk = DeviceTensor::empty_like(kk),
           d_dv = DeviceTensor::empty_like(v), d_lse = DeviceTensor::empty_like(HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq}));
      attention::Options o = opts;
      if (way > 0) o.block_mask = &bm;
      attention::forward(Q, K, V, api_view(d_o, false), api_view(d_lse, false), o, stream.handle());
      attention::backward(Q, K, V, api_view(d_o, false), dO, api_view(d_lse, false), api_view(d_dq, false), api_view(d_dk, false),
                          api_view(d_dv, false), o, stream.handle());
      stream.synchronize();
      for (DeviceTensor* t : {&d_o, &d_lse, &d_dq, &d_dk, &d_dv}) outputs[way].push_back(t->to_host().to_f64());
    }
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      INFO("output " << i << " (o, lse, dq, dk, dv)");
      CHECK(std::ranges::none_of(outputs[0][i], [](double x) { return std::isnan(x); }));
      CHECK(std::ranges::any_of(outputs[0][i], [](double x) { return x != 0.0; }));
      CHECK(outputs[1][i] == outputs[0][i]);
      CHECK(outputs[2][i] == outputs[0][i]);
    }
  }
}

// Atomic under library masks runs dK/dV on the ring producer and the dQ writer, walking the mask's
// intervals or the pre-pass's lists (decision 102 at D 128, 108 at D 64). Against recompute (the masked default,
// checked against float64 by the masked sweep): dQ, dK and dV within 1e-2, no NaN, real gradients.
TEST_CASE("gpu: atomic backward on the dQ writer under library masks matches recompute") {
  if (const auto& drv = runtime::Driver::get(); !drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return;
  }
  if (!attention::masks_supported() || !attention::backward_available() || !attention::dq_reduction_supported(attention::DqReduction::atomic)) {
    MESSAGE("SKIPPED: the attention kernels have no MASK meta, no backward or no atomic reduction");
    return;
  }
  // D 128 on 64 x 128 tiles (102), D 64 on 128 x 128 (108)
  for (const int D : {128, 64}) {
  const AttentionCase c{2, 4, 2, 640, 640, D, false, true};
  const DocumentInputs in(c, 11, 90, 53);
  const HostTensor &q = in.q, &kk = in.k, &v = in.v;
  const DeviceTensor& d_docs = in.d_docs;
  const attention::Tensor &Q = in.Q, &K = in.K, &V = in.V, &dO = in.dO;
  for (const kernels::MaskSpec& spec : {kernels::MaskSpec::sliding_window(100, 50), kernels::MaskSpec::causal_document()}) {
    INFO("D " << D << " mask " << std::string(kernels::mask_kind_name(spec.kind)));
    attention::Options opts;
    opts.mask = attention::Mask{spec, {}, {}, {}};
    if (kernels::mask_uses_doc_ids(spec.kind)) opts.mask->doc_ids = api_view(d_docs, false);
    runtime::Stream stream;
    auto d_o = DeviceTensor::empty_like(q), d_lse = DeviceTensor::empty_like(HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq}));
    attention::forward(Q, K, V, api_view(d_o, false), api_view(d_lse, false), opts, stream.handle());
    std::vector<std::vector<double>> grads[2];
    for (int i = 0; i < 2; ++i) {
      attention::Options o = opts;
      o.dq_reduction = i == 0 ? attention::DqReduction::recompute : attention::DqReduction::atomic;
      auto d_dq = DeviceTensor::empty_like(q), d_dk = DeviceTensor::empty_like(kk), d_dv = DeviceTensor::empty_like(v);
      for (DeviceTensor* t : {&d_dq, &d_dk, &d_dv}) t->poison();
      attention::backward(Q, K, V, api_view(d_o, false), dO, api_view(d_lse, false), api_view(d_dq, false), api_view(d_dk, false),
                          api_view(d_dv, false), o, stream.handle());
      stream.synchronize();
      for (DeviceTensor* t : {&d_dq, &d_dk, &d_dv}) grads[i].push_back(t->to_host().to_f64());
    }
    for (size_t g = 0; g < 3; ++g) {
      INFO("gradient " << g << " (dq, dk, dv)");
      CHECK(std::ranges::none_of(grads[1][g], [](double x) { return std::isnan(x); }));
      CHECK(std::ranges::any_of(grads[0][g], [](double x) { return std::fabs(x) > 0.1; }));
      RelAcc e;
      e.add(grads[1][g], grads[0][g]);
      MESSAGE(fmt::format("D {} {} gradient {}: atomic vs recompute rel. error {:.2e}", D, kernels::mask_kind_name(spec.kind), g, e.value()));
      CHECK(e.value() < 1e-2);
    }
  }
  }
}

// Options::varlen_documents (decision 113): packed self-attention as one dense call with a document
// mask equals the varlen kernels' call (float64-checked by the sweep) within rounding: forward (O,
// LSE) and backward (dQ, dK, dV; the dense call's default reduction), causal and not, GQA, lengths
// 0, 1 and ragged, D 64 and 128; with a caller's workspace and without.
TEST_CASE("gpu: varlen self-attention as a document mask matches the varlen kernels") {
  if (!runs_here(true, false, true) || !attention::varlen_supported(true)) return;
  const std::vector<int> lens{300, 0, 1, 700, 129, 1024, 64};
  std::vector<int> cu{0};
  for (int n : lens) cu.push_back(cu.back() + n);
  const int64_t total = cu.back(), Hq = 8, Hkv = 2;
  HostTensor h_cu(ir::DType::i32, {static_cast<int64_t>(cu.size())});
  for (size_t i = 0; i < cu.size(); ++i) h_cu.set({static_cast<int64_t>(i)}, cu[i]);
  const DeviceTensor d_cu = DeviceTensor::from_host(h_cu);
  for (const int64_t D : {64, 128})
    for (const bool causal : {false, true}) {
      INFO("D " << D << " causal " << causal);
      HostTensor q(ir::DType::bf16, {total, Hq, D}), k(ir::DType::bf16, {total, Hkv, D}), v(ir::DType::bf16, {total, Hkv, D}),
          dout(ir::DType::bf16, {total, Hq, D});
      q.fill_normal(31, 0, 1), k.fill_normal(32, 0, 1), v.fill_normal(33, 0, 1), dout.fill_normal(34, 0, 1);
      const DeviceTensor d_q = DeviceTensor::from_host(q), d_k = DeviceTensor::from_host(k), d_v = DeviceTensor::from_host(v),
                         d_do = DeviceTensor::from_host(dout);
      runtime::Stream stream;
      std::vector<std::vector<double>> got[2];
      for (int route = 0; route < 2; ++route) {
        attention::Options opts;
        opts.causal = causal;
        opts.cu_seqlens_q = opts.cu_seqlens_k = api_view(d_cu, false);
        opts.max_seqlen_q = opts.max_seqlen_k = 1024;
        opts.varlen_documents = route == 1;
        auto d_o = DeviceTensor::empty_like(q), d_lse = DeviceTensor::empty_like(HostTensor(ir::DType::f32, {Hq, total}));
        auto d_dq = DeviceTensor::empty_like(q), d_dk = DeviceTensor::empty_like(k), d_dv = DeviceTensor::empty_like(v);
        for (DeviceTensor* t : {&d_o, &d_dq, &d_dk, &d_dv}) t->poison();
        const attention::Tensor Q = api_view(d_q, false), K = api_view(d_k, false), V = api_view(d_v, false), dO = api_view(d_do, false),
                                O = api_view(d_o, false), L = api_view(d_lse, false);
        // the routed forward in a caller's workspace, its backward allocating its own
        const runtime::DeviceBuffer ws(std::max<size_t>(attention::forward_workspace_bytes(Q, K, opts), 256));
        attention::forward(Q, K, V, O, L, opts, stream.handle(), {ws.ptr(), ws.bytes()});
        attention::backward(Q, K, V, O, dO, L, api_view(d_dq, false), api_view(d_dk, false), api_view(d_dv, false), opts, stream.handle());
        stream.synchronize();
        for (const DeviceTensor* t : {&d_o, &d_lse, &d_dq, &d_dk, &d_dv}) got[route].push_back(t->to_host().to_f64());
      }
      const char* names[] = {"o", "lse", "dq", "dk", "dv"};
      for (size_t g = 0; g < 5; ++g) {
        INFO(names[g]);
        CHECK(std::ranges::none_of(got[1][g], [](double x) { return std::isnan(x); }));
        CHECK(std::ranges::any_of(got[0][g], [](double x) { return std::fabs(x) > 0.1; }));
        RelAcc e;
        e.add(got[1][g], got[0][g]);
        MESSAGE(fmt::format("D {} causal {} {}: documents vs varlen kernels rel. error {:.2e}", D, causal, names[g], e.value()));
        CHECK(e.value() < (g == 1 ? 1e-4 : 1e-2));
      }
    }
}

// Every masked case of the sweep passes the API's checks as the sweep calls it (tensors at fake
// addresses in the case's layout, the mask's tensors, workspaces of the sizes the API asks for):
// the GPU run then tests the kernels, not the case generator (no GPU needed).
TEST_CASE("attention sweep: every masked case passes the API's checks (no GPU)") {
  int with_lists = 0;
  for (int i = 0; i < kMaskedCases; ++i) {
    const Case k = make_masked_case(i);
    INFO(k.describe());
    const AttentionCase& c = k.c;
    uint64_t next = 0x7f0000000000;
    const auto fake = [&](const HostTensor& h, bool bhsd) {
      attention::Tensor t;
      t.data = next;
      next += uint64_t{1} << 32;
      t.dtype = h.dtype();
      t.rank = static_cast<int>(h.sizes().size());
      std::copy(h.sizes().begin(), h.sizes().end(), t.sizes.begin());
      std::copy(h.strides().begin(), h.strides().end(), t.strides.begin());
      return bhsd ? attention::permute(t, {0, 2, 1, 3}) : t;
    };
    const bool bhsd = k.layout == Layout::bhsd;
    const HostTensor q = make_host(k, c.Hq, c.Sq), kv = make_host(k, c.Hkv, c.Sk);
    const attention::Tensor Q = fake(q, bhsd), K = fake(kv, bhsd), V = fake(kv, bhsd), O = fake(q, bhsd), dO = fake(q, bhsd),
                            dQ = fake(q, bhsd), dK = fake(kv, bhsd), dV = fake(kv, bhsd),
                            L = fake(HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq}), false);
    attention::Options opts;
    opts.softmax_scale = k.scale;
    opts.dropout_p = k.dropout_p;
    opts.mask = api_mask(k, [&](const HostTensor& h) { return fake(h, false); });
    CHECK_NOTHROW(attention::check_forward(Q, K, V, O, L, opts));
    CHECK_NOTHROW(attention::check_backward(Q, K, V, O, dO, L, dQ, dK, dV, opts));
    const size_t fwd = attention::forward_workspace_bytes(Q, K, opts), bwd = attention::backward_workspace_bytes(Q, K, opts);
    CHECK((fwd > 0) == !kernels::mask_has_tile_intervals(k.mask->kind));
    with_lists += fwd > 0;
    CHECK_NOTHROW(attention::check_forward(Q, K, V, O, L, opts, {next, fwd}));
    CHECK_NOTHROW(attention::check_backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, {next, bwd}));
    if (fwd > 0) CHECK_THROWS_AS(attention::check_forward(Q, K, V, O, L, opts, {next, fwd - 1}), std::invalid_argument);
    // (with fused dropout, full or causal, bwd counts the mask's words dK/dV stores for dQ; a smaller
    // workspace with room for the rest runs the backward that draws the mask twice: decision 097)
    attention::Options twice = opts;
    twice.dropout_words_max_bytes = 0;
    const size_t least = attention::backward_workspace_bytes(Q, K, twice);
    CHECK(least <= bwd);
    CHECK_NOTHROW(attention::check_backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, {next, least}));
    CHECK_THROWS_AS(attention::check_backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, {next, least - 1}), std::invalid_argument);
  }
  CHECK(with_lists >= kMaskedCases / 3);
}

// Options::dq_reduction on the GPU: recompute, atomic, split and ordered (and atomic / ordered with
// q_descending on causal shapes) against float64 on a few shapes: GQA and MQA, causal and full,
// ragged S_q != S_k (S_q > S_k: causal rows without keys), D 64 / 128, [B, S, H, D] and
// [B, H, S, D] memory, dropout once. Gradients are poisoned before every call; each reduction's
// first call gets a poisoned caller workspace (the API zeroes what must be zero). Determinism: 20
// more calls of split and ordered give the same bytes of dQ, dK and dV (the workspace reused as
// the previous call left it, every fourth call the API's own); atomic's dQ stays within tolerance
// of recompute's. Split and ordered add dQ's parts in the same order (equal dQ values), and the
// reductions' dK/dV are equal (the same tiles and dots).
namespace {

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  RelAcc e;
  e.add(got, ref);
  return e.value();
}

}  // namespace

TEST_CASE("gpu: attention API dQ reductions against float64, and determinism") {
  if (const auto& drv = runtime::Driver::get(); !drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return;
  }
  if (!attention::backward_available()) {
    MESSAGE("SKIPPED: the backward kernels are not in this build");
    return;
  }
  using attention::DqReduction;
  struct Mode {
    DqReduction r;
    bool descending;
    std::string label() const { return fmt::format("{}{}", attention::name(r), descending ? " q_descending" : ""); }
  };
  struct Shape {
    AttentionCase c;  // bshd = false: [B, H, S, D] memory passed as permuted views
    double p;         // dropout
  };
  const Shape shapes[] = {
      {{2, 4, 2, 200, 300, 64, false, true}, 0.0},   // GQA, S_q < S_k
      {{1, 4, 1, 333, 333, 128, true, false}, 0.0},  // MQA, causal, ragged tiles, [B, H, S, D] memory
      {{2, 2, 2, 300, 150, 64, true, true}, 0.0},    // causal with S_q > S_k: rows (and query tiles) without keys
      {{1, 4, 2, 257, 190, 128, false, true}, 0.1},  // dropout
      {{1, 8, 2, 640, 640, 64, true, true}, 0.0},    // causal, 10 key tiles per dQ tile at most
      {{1, 4, 2, 256, 320, 128, false, true}, 0.0},  // D 128 full, S_q % 4 == 0: dK/dV's ring options (atomic: RING_PRODUCER)
      {{1, 2, 2, 384, 384, 128, true, true}, 0.0},   // D 128 causal, aligned: atomic on the producer and the dQ writer
  };
  std::vector<Mode> modes;
  for (DqReduction r : {DqReduction::recompute, DqReduction::atomic, DqReduction::split, DqReduction::ordered}) {
    if (!attention::dq_reduction_supported(r)) {
      FAIL_CHECK("this build's backward does not take dq_reduction = " << attention::name(r));
      continue;
    }
    modes.push_back({r, false});
  }
  for (DqReduction r : {DqReduction::atomic, DqReduction::ordered})
    if (attention::dq_reduction_supported(r)) modes.push_back({r, true});

  // Compile every configuration first, in parallel (no GPU needed).
  {
    std::vector<std::tuple<int, bool, bool, Mode>> cfgs;  // D, causal, dropout, mode
    for (const Shape& s : shapes)
      for (const Mode& m : modes)
        if (!m.descending || s.c.causal) cfgs.emplace_back(s.c.D, s.c.causal, s.p > 0, m);
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::vector<std::string> failures;
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < std::clamp(std::thread::hardware_concurrency(), 2u, 16u); ++w)
      pool.emplace_back([&] {
        for (size_t i; (i = next++) < cfgs.size();) {
          const auto& [d, causal, dropout, m] = cfgs[i];
          try {
            attention::prepare(ir::DType::bf16, d, causal, false, true, {}, 0, dropout, m.r, m.descending);
          } catch (const std::exception& e) {
            std::lock_guard lock(mu);
            failures.push_back(fmt::format("D={} causal={} dropout={} {}: {}", d, causal, dropout, m.label(), e.what()));
          }
        }
      });
    for (auto& t : pool) t.join();
    for (const auto& f : failures) FAIL_CHECK("compile failed: " << f);
  }

  constexpr int kRepeats = 20;
  double worst = 0;
  int deterministic_runs = 0;
  for (const Shape& s : shapes) {
    const AttentionCase& c = s.c;
    const bool bhsd = !c.bshd;
    HostTensor q(ir::DType::bf16, c.shape(c.Hq, c.Sq)), kk(ir::DType::bf16, c.shape(c.Hkv, c.Sk)),
        v(ir::DType::bf16, c.shape(c.Hkv, c.Sk)), dout(ir::DType::bf16, c.shape(c.Hq, c.Sq));
    const uint64_t seed = 0xd9000 + static_cast<uint64_t>(c.Sq * 7 + c.Sk);
    q.fill_normal(seed + 1, 0, 1);
    kk.fill_normal(seed + 2, 0, 1);
    v.fill_normal(seed + 3, 0, 1);
    dout.fill_normal(seed + 4, 0, 1);
    runtime::Stream stream;
    auto d_q = DeviceTensor::from_host(q), d_k = DeviceTensor::from_host(kk), d_v = DeviceTensor::from_host(v),
         d_do = DeviceTensor::from_host(dout);
    auto d_o = DeviceTensor::empty_like(q), d_dq = DeviceTensor::empty_like(q), d_dk = DeviceTensor::empty_like(kk),
         d_dv = DeviceTensor::empty_like(v), d_lse = DeviceTensor::empty_like(HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq}));
    const auto Q = api_view(d_q, bhsd), K = api_view(d_k, bhsd), V = api_view(d_v, bhsd), O = api_view(d_o, bhsd),
               dO = api_view(d_do, bhsd), dQ = api_view(d_dq, bhsd), dK = api_view(d_dk, bhsd), dV = api_view(d_dv, bhsd),
               L = api_view(d_lse, false);
    attention::Options base;
    base.causal = c.causal;
    base.dropout_p = s.p;
    base.seed = 0xfeedbeef12345ull;
    base.offset = 77;
    attention::forward(Q, K, V, O, L, base, stream.handle());
    stream.synchronize();
    const HostTensor o_h = d_o.to_host();
    const std::vector<double> o_stored = to_bhsd(c, o_h);
    const DropoutRef drop{{base.seed, base.offset, kernels::dropout_keep_threshold(s.p > 0 ? s.p : 0.5)}, 0};
    const Reference ref = reference(c, to_bhsd(c, q), to_bhsd(c, kk), to_bhsd(c, v), to_bhsd(c, dout), c.default_scale(), true,
                                    s.p > 0 ? &drop : nullptr, s.p > 0 ? &o_stored : nullptr);

    struct Grads {
      HostTensor dq, dk, dv;
    };
    const auto run = [&](const attention::Options& opts, attention::Workspace ws) {
      d_dq.poison();
      d_dk.poison();
      d_dv.poison();
      attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), ws);
      stream.synchronize();
      return Grads{d_dq.to_host(), d_dk.to_host(), d_dv.to_host()};
    };
    std::map<std::string, Grads> got;
    for (const Mode& m : modes) {
      if (m.descending && !c.causal) continue;
      const std::string what = fmt::format("{} {} dropout {} dq_reduction {}", c.describe(), bhsd ? "BHSD(view)" : "BSHD", s.p, m.label());
      INFO(what);
      try {
        attention::Options opts = base;
        opts.dq_reduction = m.r;
        opts.q_descending = m.descending;
        runtime::DeviceBuffer ws(attention::backward_workspace_bytes(Q, K, opts));
        ws.fill_bytes(0xFF);
        const attention::Workspace w{ws.ptr(), ws.bytes()};
        const Grads g = run(opts, w);
        const int64_t nans = count_nans(g.dq) + count_nans(g.dk) + count_nans(g.dv);
        const double edq = rel_error(to_bhsd(c, g.dq), ref.dq), edk = rel_error(to_bhsd(c, g.dk), ref.dk),
                     edv = rel_error(to_bhsd(c, g.dv), ref.dv);
        MESSAGE(fmt::format("{}: rel. errors dQ {:.2e} dK {:.2e} dV {:.2e}", what, edq, edk, edv));
        worst = std::max({worst, edq, edk, edv});
        CHECK(nans == 0);
        CHECK(edq < 1e-2);
        CHECK(edk < 1e-2);
        CHECK(edv < 1e-2);
        if (m.r == DqReduction::split || m.r == DqReduction::ordered) {
          int differ = 0;
          for (int i = 0; i < kRepeats; ++i) {
            const Grads h = run(opts, i % 4 == 3 ? attention::Workspace{} : w);
            differ += same_bytes(h.dq, g.dq) && same_bytes(h.dk, g.dk) && same_bytes(h.dv, g.dv) ? 0 : 1;
          }
          CHECK_MESSAGE(differ == 0, differ << " of " << kRepeats << " repeated calls gave other bytes");
          ++deterministic_runs;
        }
        if (m.r == DqReduction::atomic && !m.descending) {
          // within tolerance of recompute's dQ (the add order, hence the last bits, vary)
          int differ = 0;
          for (int i = 0; i < 5; ++i) {
            const Grads h = run(opts, w);
            const double e = rel_error(h.dq.to_f64(), got.at("recompute").dq.to_f64());
            CHECK(e < 1e-2);
            differ += same_bytes(h.dq, g.dq) ? 0 : 1;
          }
          MESSAGE(fmt::format("{}: {} of 5 repeated atomic calls gave other dQ bytes", what, differ));
        }
        got.emplace(m.label(), g);
      } catch (const std::exception& e) {
        FAIL_CHECK(e.what());
      }
    }
    // the same add order: split's and ordered's dQ are equal (values: +0.0 + x and x differ only
    // in the sign of zeros); dK and dV do not depend on the reduction at the same tiles. Ordered
    // without q_descending runs DASH's shift schedule on a persistent grid (the API's
    // persistent_ordered): another fixed order, for dQ's adds and dK/dV's sums over query tiles.
    const auto equal_values = [](const HostTensor& a, const HostTensor& b) { return a.to_f64() == b.to_f64(); };
    INFO(c.describe());
    got.erase("ordered");
    if (got.contains("split") && got.contains("ordered")) {
      CHECK_MESSAGE(equal_values(got.at("split").dq, got.at("ordered").dq), "split and ordered dQ differ");
      if (got.contains("ordered q_descending"))
        CHECK_MESSAGE(equal_values(got.at("ordered").dq, got.at("ordered q_descending").dq), "ordered dQ depends on q_descending");
    }
    for (const char* other : {"split", "ordered"})
      if (got.contains("atomic") && got.contains(other)) {
        CHECK_MESSAGE(equal_values(got.at("atomic").dk, got.at(other).dk), "atomic and " << other << " dK differ");
        CHECK_MESSAGE(equal_values(got.at("atomic").dv, got.at(other).dv), "atomic and " << other << " dV differ");
      }
  }
  MESSAGE(fmt::format("dQ reductions: {} modes, worst rel. error {:.2e}, {} x {} repeated deterministic calls", modes.size(), worst,
                      deterministic_runs, kRepeats));
}

// Score mods through the API (Options::score_mod), forward and backward (recompute and atomic),
// against the float64 reference that applies the same mod (attention_score_mod_reference.hpp).
TEST_CASE("gpu: attention API score mods (ALiBi, soft-capping) against float64") {
  if (const auto& drv = runtime::Driver::get(); !drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return;
  }
  using kernels::ScoreModKind;
  for (ScoreModKind mod : {ScoreModKind::alibi, ScoreModKind::softcap})
    for (bool causal : {false, true})
      for (int64_t d : {64, 128}) {
        score_mod_testing::Case c{mod, causal ? kernels::MaskSpec::causal() : kernels::MaskSpec::full()};
        c.B = 2, c.Hq = 4, c.Hkv = 2, c.Sq = 200, c.Sk = causal ? 200 : 260, c.D = d;
        INFO(c.describe());
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        score_mod_testing::Reference r = score_mod_testing::reference(c, scale);
        runtime::Stream stream;
        auto d_q = DeviceTensor::from_host(r.q), d_k = DeviceTensor::from_host(r.k), d_v = DeviceTensor::from_host(r.v),
             d_do = DeviceTensor::from_host(r.dout), d_slopes = DeviceTensor::from_host(r.slopes);
        auto d_o = DeviceTensor::empty_like(r.q), d_dq = DeviceTensor::empty_like(r.q), d_dk = DeviceTensor::empty_like(r.k),
             d_dv = DeviceTensor::empty_like(r.v), d_lse = DeviceTensor::empty_like(HostTensor(ir::DType::f32, {c.B, c.Hq, c.Sq}));
        attention::Options opts;
        opts.causal = causal;
        opts.score_mod = {mod, api_view(d_slopes, false), score_mod_testing::kCap};
        attention::forward(api_view(d_q, true), api_view(d_k, true), api_view(d_v, true), api_view(d_o, true), api_view(d_lse, false), opts,
                           stream.handle());
        stream.synchronize();
        const double eo = testing::rel_error(d_o.to_host().to_f64(), r.o);
        CHECK(eo < 1e-2);
        for (attention::DqReduction red : {attention::DqReduction::recompute, attention::DqReduction::atomic}) {
          opts.dq_reduction = red;
          attention::backward(api_view(d_q, true), api_view(d_k, true), api_view(d_v, true), api_view(d_o, true), api_view(d_do, true),
                              api_view(d_lse, false), api_view(d_dq, true), api_view(d_dk, true), api_view(d_dv, true), opts,
                              stream.handle());
          stream.synchronize();
          const double eq = testing::rel_error(d_dq.to_host().to_f64(), r.dq), ek = testing::rel_error(d_dk.to_host().to_f64(), r.dk),
                       ev = testing::rel_error(d_dv.to_host().to_f64(), r.dv);
          MESSAGE(fmt::format("{} {}: rel. errors O {:.2e} dQ {:.2e} dK {:.2e} dV {:.2e}", c.describe(), attention::name(red), eo, eq, ek, ev));
          CHECK(eq < 1e-2);
          CHECK(ek < 1e-2);
          CHECK(ev < 1e-2);
        }
      }
}
