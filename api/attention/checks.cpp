// The argument checks of the attention API (host only, no GPU): every failure names the function, the
// argument, the value and what would be valid. forward, backward and the workspace sizers run them.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "api/attention/internal.hpp"
#include "runtime/argument_aliasing.hpp"
#include "kernels/philox_host.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention::detail {

namespace mn = kernels::meta_name;
namespace {

bool is_pow2_in(int v, int lo, int hi) { return v >= lo && v <= hi && std::has_single_bit(static_cast<unsigned>(v)); }

std::string group_name(bool backward) { return backward ? "q, k, v, o, do, dq, dk, dv" : "q, k, v, o"; }

std::string supported_reductions() {
  std::vector<std::string> ok;
  for (DqReduction r : {DqReduction::recompute, DqReduction::atomic, DqReduction::split, DqReduction::ordered})
    if (dq_reduction_supported(r)) ok.push_back(fmt::format("{} {}", static_cast<int>(r), name(r)));
  return ok.empty() ? std::string("none (no backward kernels)") : fmt::format("{}", fmt::join(ok, ", "));
}

// q, k, v, o: dtype (first: it decides the byte sizes of the alignment checks), rank, layout,
// device, head dim, batch and heads (fills d.head_dim, d.heads_q, d.heads_kv).
void check_qkvo(const Checker& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, Dims& d, bool backward) {
  if (q.dtype != ir::DType::bf16 && q.dtype != ir::DType::f16)
    c.fail("q has dtype {}; supported: bf16, f16", ir::name(q.dtype));
  const std::string group = group_name(backward);
  c.same_dtype("k", k, q, group.c_str());
  c.same_dtype("v", v, q, group.c_str());
  c.same_dtype("o", o, q, group.c_str());

  const int rank = d.varlen ? 3 : 4;
  const char* q_layout = d.varlen ? "[total_q, Hq, D] (varlen)" : "[B, S_q, Hq, D]";
  const char* k_layout = d.varlen ? "[total_k, Hkv, D] (varlen)" : "[B, S_k, Hkv, D]";
  c.tensor("q", q, rank, q_layout, kAlign);
  c.tensor("k", k, rank, k_layout, kAlign);
  c.tensor("v", v, rank, k_layout, kAlign);
  c.tensor("o", o, rank, q_layout, kAlign);
  c.same_device("k", k, q);
  c.same_device("v", v, q);
  c.same_device("o", o, q);

  const int s = d.varlen ? 0 : 1, h = s + 1, dd = s + 2;  // dims of S, H, D
  d.head_dim = q.size(dd);
  if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256)
    c.fail("head dim D = {} (q.sizes[{}]) is not supported; supported: 64, 128, 256", d.head_dim, dd);
  if (k.size(dd) != d.head_dim) c.fail("k has head dim D = {} but q has D = {} (they must match)", k.size(dd), d.head_dim);
  if (!d.varlen && k.size(0) != q.size(0))
    c.fail("k has batch size B = {} but q has B = {} (they must match)", k.size(0), q.size(0));
  c.same_sizes("v", v, "k", k);
  c.same_sizes("o", o, "q", q);
  d.heads_q = q.size(h);
  d.heads_kv = k.size(h);
  if (d.heads_q % d.heads_kv != 0)
    c.fail("q has Hq = {} heads, not a multiple of k's Hkv = {} (grouped-query attention needs Hq % Hkv == 0)", d.heads_q,
           d.heads_kv);
  if (d.heads_q > kGridYZMax) c.fail("q has Hq = {} heads; at most {} (the launch grid's y dimension)", d.heads_q, kGridYZMax);
}

// The batch and sequence lengths: options.cu_seqlens_q/k and max_seqlen_q/k (varlen), else q's
// and k's sizes (fills d.batch, d.seq_q, d.seq_k, d.total_q, d.total_k).
void check_sequences(const Checker& c, const Tensor& q, const Tensor& k, const Options& opts, Dims& d) {
  if (d.varlen) {
    const Tensor& cq = *opts.cu_seqlens_q;
    const Tensor& ck = *opts.cu_seqlens_k;
    for (auto [name, t] : {std::pair{"options.cu_seqlens_q", &cq}, std::pair{"options.cu_seqlens_k", &ck}}) {
      if (t->dtype != ir::DType::i32) c.fail("{} has dtype {}; it must be i32 (B + 1 offsets)", name, ir::name(t->dtype));
      c.tensor(name, *t, 1, "[B + 1]", 4);
      c.same_device(name, *t, q);
      if (t->size(0) < 2) c.fail("{} has {} entries; it needs B + 1 >= 2 (offsets 0, ..., total)", name, t->size(0));
    }
    if (cq.size(0) != ck.size(0))
      c.fail("options.cu_seqlens_q has {} entries but options.cu_seqlens_k has {} (both are B + 1 offsets)", cq.size(0), ck.size(0));
    d.batch = cq.size(0) - 1;
    d.total_q = q.size(0);
    d.total_k = k.size(0);
    if (opts.max_seqlen_q < 1 || opts.max_seqlen_q > d.total_q)
      c.fail("options.max_seqlen_q = {}; with cu_seqlens it must be between 1 and q's total tokens {}", opts.max_seqlen_q, d.total_q);
    if (opts.max_seqlen_k < 1 || opts.max_seqlen_k > d.total_k)
      c.fail("options.max_seqlen_k = {}; with cu_seqlens it must be between 1 and k's total tokens {}", opts.max_seqlen_k, d.total_k);
    d.seq_q = opts.max_seqlen_q;
    d.seq_k = opts.max_seqlen_k;
  } else {
    d.batch = q.size(0);
    d.seq_q = q.size(1);
    d.seq_k = k.size(1);
  }
  if (d.batch > kGridYZMax) c.fail("batch size B = {}; at most {} (the launch grid's z dimension)", d.batch, kGridYZMax);
}

// lse: f32 [B, Hq, S_q] (varlen [Hq, total_q]), unit stride on the sequence.
void check_lse(const Checker& c, const Tensor& q, const Tensor& lse, const Dims& d) {
  if (lse.dtype != ir::DType::f32) c.fail("lse has dtype {}; it must be f32", ir::name(lse.dtype));
  const char* lse_layout = d.varlen ? "[Hq, total_q] (varlen)" : "[B, Hq, S_q]";
  c.tensor("lse", lse, d.varlen ? 2 : 3, lse_layout, 4);
  c.same_device("lse", lse, q);
  const bool lse_ok = d.varlen ? lse.size(0) == d.heads_q && lse.size(1) == d.total_q
                               : lse.size(0) == d.batch && lse.size(1) == d.heads_q && lse.size(2) == d.seq_q;
  if (!lse_ok)
    c.fail("lse has sizes {} but must be {} = {}", list(sizes_of(lse)), lse_layout,
           d.varlen ? fmt::format("[{},{}]", d.heads_q, d.total_q) : fmt::format("[{},{},{}]", d.batch, d.heads_q, d.seq_q));
}

// options.dropout_coordinates as the kernels take them: offsets in [0, 2^31), col_offset a multiple
// of 64, heads 0 or at least head_offset + Hq; only heads with varlen; not with precomputed bits.
kernels::DropoutCoordinates check_dropout_coordinates(const Checker& c, const Options& opts, const Dims& d) {
  const auto& g = opts.dropout_coordinates;
  if (g.row_offset == 0 && g.col_offset == 0 && g.head_offset == 0 && g.heads == 0) return {};
  constexpr int64_t kMax = INT32_MAX;
  auto in_range = [&](const char* name, int64_t v, int64_t extent) {
    if (v < 0 || v + extent > kMax)
      c.fail("options.dropout_coordinates.{} = {}; it must be in [0, 2^31 - {}] (the kernels' coordinates are 32-bit)", name, v,
             extent);
  };
  in_range("row_offset", g.row_offset, d.seq_q);
  in_range("col_offset", g.col_offset, d.seq_k);
  in_range("head_offset", g.head_offset, d.heads_q);
  if (g.col_offset % 64 != 0)
    c.fail("options.dropout_coordinates.col_offset = {} is not a multiple of 64 (the kernels draw the mask in groups of 64 keys)",
           g.col_offset);
  if (g.heads != 0 && (g.heads < g.head_offset + d.heads_q || g.heads > kMax))
    c.fail("options.dropout_coordinates.heads = {}; it must be 0 (this call's Hq) or at least head_offset + Hq = {} + {}", g.heads,
           g.head_offset, d.heads_q);
  if (d.varlen && (g.row_offset != 0 || g.col_offset != 0))
    c.fail("options.dropout_coordinates.row_offset / col_offset = {} / {} with cu_seqlens: a packed batch's rows and keys count "
           "inside each sequence (only head_offset and heads place a varlen call)", g.row_offset, g.col_offset);
  if (opts.dropout_bits) c.fail("options.dropout_coordinates with options.dropout_bits: precomputed bits are the call's own (unset one)");
  return {static_cast<int32_t>(g.row_offset), static_cast<int32_t>(g.col_offset), static_cast<int32_t>(g.head_offset),
          static_cast<int32_t>(g.heads)};
}

// Dropout: p in [0, 1); the mask for tests (forward); the precomputed bits (fills d.dropout,
// d.philox, d.rng_state, d.return_mask, d.read_bits).
void check_dropout_options(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward) {
  if (!(opts.dropout_p >= 0.0 && opts.dropout_p < 1.0))
    c.fail("options.dropout_p = {} is not in [0, 1) (0: no dropout)", opts.dropout_p);
  d.dropout = opts.dropout_p > 0.0;
  if (d.dropout) {
    for (Pass p : {Pass::forward, Pass::bwd_dkdv, Pass::bwd_dq})
      if ((p == Pass::forward || backward) && !declares(p, mn::kDropout))
        c.fail("options.dropout_p = {}: this build's {} kernel has no DROPOUT meta (dropout is not supported)", opts.dropout_p, name(p));
    d.philox = kernels::PhiloxKey::dropout(opts.seed, opts.offset, opts.dropout_p);
    d.philox.coordinates = check_dropout_coordinates(c, opts, d);
  }
  if (opts.rng_state) {
    if (!d.dropout) c.fail("options.rng_state is set but options.dropout_p = 0 (the state is dropout's; set dropout_p > 0)");
    d.rng_state = check_rng_state(c, *opts.rng_state, q.device);
  }
  if (opts.dropout_mask && !backward) {
    if (!d.dropout) c.fail("options.dropout_mask is set but options.dropout_p = 0 (the mask is dropout's; set dropout_p > 0)");
    const Tensor& m = *opts.dropout_mask;
    if (m.dtype != ir::DType::u8) c.fail("options.dropout_mask has dtype {}; it must be u8 (1 = kept)", ir::name(m.dtype));
    const char* layout = d.varlen ? "[B * Hq, max_seqlen_q, max_seqlen_k]" : "[B * Hq, S_q, S_k]";
    c.tensor("options.dropout_mask", m, 3, layout, 1);
    c.same_device("options.dropout_mask", m, q);
    const std::array<int64_t, 3> want{d.batch * d.heads_q, d.seq_q, d.seq_k};
    if (m.size(0) != want[0] || m.size(1) != want[1] || m.size(2) != want[2])
      c.fail("options.dropout_mask has sizes {} but must be {} = {}", list(sizes_of(m)), layout, list(want));
    d.return_mask = true;
  }
  if (opts.dropout_bits) {
    if (!d.dropout) c.fail("options.dropout_bits is set but options.dropout_p = 0 (the bits are dropout's; set dropout_p > 0)");
    if (d.varlen) c.fail("options.dropout_bits: the precomputed mask is for dense batches (not with cu_seqlens)");
    for (Pass p : {Pass::forward, Pass::bwd_dkdv, Pass::bwd_dq})
      if ((p == Pass::forward || backward) && !declares(p, mn::kDropoutBits))
        c.fail("options.dropout_bits: this build's {} kernel cannot read a precomputed mask (no DROPOUT_BITS meta)", name(p));
    if (opts.schedule && opts.schedule->block_n % 32 != 0)
      c.fail("options.schedule.block_n = {} with options.dropout_bits: the kernels read whole 32-column mask words, so block_n "
             "must be a multiple of 32", opts.schedule->block_n);
    const Tensor& m = *opts.dropout_bits;
    if (m.dtype != ir::DType::u32) c.fail("options.dropout_bits has dtype {}; it must be u32 (packed bits)", ir::name(m.dtype));
    c.tensor("options.dropout_bits", m, 3, "[B * Hq, S_q, cdiv(S_k, 32)]", 4);
    c.same_device("options.dropout_bits", m, q);
    const std::array<int64_t, 3> want{d.batch * d.heads_q, d.seq_q, (d.seq_k + 31) / 32};
    if (m.size(0) != want[0] || m.size(1) != want[1] || m.size(2) != want[2])
      c.fail("options.dropout_bits has sizes {} but must be [B * Hq, S_q, cdiv(S_k, 32)] = {}", list(sizes_of(m)), list(want));
    d.read_bits = true;
  }
}

}  // namespace

// options.rng_state: i64 / u64 [2] = [seed, offset], unit stride, 8-byte aligned, on `device`.
// Returns its address.
uint64_t check_rng_state(const Checker& c, const Tensor& s, int device) {
  if (s.dtype != ir::DType::i64 && s.dtype != ir::DType::u64)
    c.fail("options.rng_state has dtype {}; it must be i64 or u64 (the 64-bit [seed, offset])", ir::name(s.dtype));
  c.tensor("options.rng_state", s, 1, "[2] = [seed, offset]", 8);
  if (s.size(0) != 2) c.fail("options.rng_state has sizes {} but must be [2] = [seed, offset]", list(sizes_of(s)));
  if (s.device != device) c.fail("options.rng_state is on device {} but q is on device {} (all tensors must be on one device)", s.device, device);
  return s.data;
}

void check_schedule(const Checker& c, const Options& opts) {
  if (const auto& sch = opts.schedule) {
    if (!is_pow2_in(sch->block_m, 16, 256) || !is_pow2_in(sch->block_n, 16, 256))
      c.fail("options.schedule has block_m = {}, block_n = {}; both must be powers of two from 16 to 256", sch->block_m,
             sch->block_n);
    if (!is_pow2_in(sch->num_warps, 1, 16)) c.fail("options.schedule.num_warps = {}; valid: 1, 2, 4, 8, 16", sch->num_warps);
    if (sch->stages < 1 || sch->stages > 8) c.fail("options.schedule.stages = {}; valid: 1 to 8", sch->stages);
    if (sch->min_programs_per_sm < 0 || sch->min_programs_per_sm > 32)
      c.fail("options.schedule.min_programs_per_sm = {}; valid: 0 (no bound) to 32", sch->min_programs_per_sm);
  }
}

// options.mask against the call: the kind, its integers (kernels::check_mask's rules), the tensors
// the kind reads (dtype, rank, sizes, device, strides) and none it does not, and the kernels'
// support. Nothing is read from device memory: tensor values are the caller's responsibility.
void check_mask_option(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward) {
  using kernels::MaskKind;
  d.causal = opts.causal;
  if (!opts.mask) return;
  const Mask& m = *opts.mask;
  const int kind = static_cast<int>(m.spec.kind);
  if (kind < 0 || kind >= kernels::kMaskKindCount)
    c.fail("options.mask.spec.kind = {} is not a mask kind; valid: {}", kind, kernels::mask_kind_list());
  const MaskKind k = m.spec.kind;
  const char* kname = kernels::mask_kind_name(k);
  struct MaskTensor {
    const char* name;
    const std::optional<Tensor>* t;
    bool read;
    const char* readers;
    ir::DType dtype;
    int rank;
    const char* layout;
    uint64_t align;
  };
  const std::array<MaskTensor, 3> tensors{{
      {"options.mask.doc_ids", &m.doc_ids, kernels::mask_uses_doc_ids(k), "document, causal_document, share_question, causal_blockwise",
       ir::DType::i32, 2, "[B or 1, S_k]", 4},
      {"options.mask.prefix_lengths", &m.prefix_lengths, k == MaskKind::prefix_lm, "prefix_lm", ir::DType::i32, 1, "[B]", 4},
      {"options.mask.block_table", &m.block_table, k == MaskKind::block_sparse, "block_sparse", ir::DType::u8, 4,
       "[B or 1, Hq or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)]", 1},
  }};
  for (const MaskTensor& t : tensors) {
    if (t.t->has_value() && !t.read) c.fail("{} is set but mask kind {} does not read it (read by: {})", t.name, kname, t.readers);
    if (!t.t->has_value() && t.read) c.fail("{} is not set; mask kind {} needs it: {} {}", t.name, kname, ir::name(t.dtype), t.layout);
  }
  if (!library_mask(k)) {
    d.causal = d.causal || k == MaskKind::causal;
    return;
  }
  if (opts.causal)
    c.fail("options.mask has kind {} and options.causal = true; a library mask does not combine with causal (the causal patterns are "
           "kinds of their own: causal_sliding_window, causal_document, share_question, causal_blockwise; or causal alone)",
           kname);
  if (d.varlen)
    c.fail("options.mask has kind {} with variable-length batches (options.cu_seqlens_q/k); library masks take dense batches only "
           "(packed sequences are a document mask: options.mask.doc_ids)",
           kname);
  for (Pass p : {Pass::forward, Pass::bwd_dkdv, Pass::bwd_dq})
    if ((p == Pass::forward || backward) && !declares(p, mn::kMask))
      c.fail("options.mask has kind {}: this build's {} kernel has no MASK meta (library masks are not supported)", kname, name(p));
  // kernels::check_mask's rules: all of them for the kinds without tensors; the others' tensor
  // rules need host values, so their shapes are checked below and their integers here.
  const kernels::MaskProblem pr{d.batch, d.heads_q, d.seq_q, d.seq_k};
  try {
    if (std::ranges::none_of(tensors, [](const MaskTensor& t) { return t.read; })) {
      kernels::check_mask(m.spec, {}, pr);
    } else {
      kernels::mask_detail::check_extent(m.spec, "S_q", pr.s_q, 0, "a sequence length");
      kernels::mask_detail::check_extent(m.spec, "S_k", pr.s_k, 0, "a sequence length");
      if (k == MaskKind::block_sparse) {
        kernels::mask_detail::check_extent(m.spec, "block_q", m.spec.block_q, 1, "the table's query rows per block");
        kernels::mask_detail::check_extent(m.spec, "block_k", m.spec.block_k, 1, "the table's keys per block");
      }
    }
  } catch (const std::invalid_argument& e) {
    c.fail("options.mask.spec: {}", e.what());
  }
  for (const MaskTensor& t : tensors) {
    if (!t.read) continue;
    const Tensor& x = **t.t;
    if (x.dtype != t.dtype) c.fail("{} has dtype {}; it must be {} {}", t.name, ir::name(x.dtype), ir::name(t.dtype), t.layout);
    c.tensor(t.name, x, t.rank, t.layout, t.align);
    c.same_device(t.name, x, q);
  }
  if (m.doc_ids) {
    const Tensor& x = *m.doc_ids;
    if ((x.size(0) != 1 && x.size(0) != d.batch) || x.size(1) != d.seq_k)
      c.fail("options.mask.doc_ids has sizes {} but must be [B or 1, S_k] = [{} or 1,{}] (a document id per key token)",
             list(sizes_of(x)), d.batch, d.seq_k);
    d.mask_batch = x.size(0);
  }
  if (m.prefix_lengths && m.prefix_lengths->size(0) != d.batch)
    c.fail("options.mask.prefix_lengths has sizes {} but must be [B] = [{}] (one prefix length per batch row)",
           list(sizes_of(*m.prefix_lengths)), d.batch);
  if (m.block_table) {
    const Tensor& x = *m.block_table;
    const int64_t nq = lang::cdiv(d.seq_q, m.spec.block_q), nk = lang::cdiv(d.seq_k, m.spec.block_k);
    if ((x.size(0) != 1 && x.size(0) != d.batch) || (x.size(1) != 1 && x.size(1) != d.heads_q) || x.size(2) != nq || x.size(3) != nk)
      c.fail("options.mask.block_table has sizes {} but must be [B or 1, Hq or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)] = "
             "[{} or 1,{} or 1,{},{}] (block_q = {}, block_k = {}, S_q = {}, S_k = {})",
             list(sizes_of(x)), d.batch, d.heads_q, nq, nk, m.spec.block_q, m.spec.block_k, d.seq_q, d.seq_k);
    d.mask_batch = x.size(0);
    d.mask_heads = x.size(1);
  }
  d.mask = k;
  d.lists = !kernels::mask_has_tile_intervals(k);
}

// options.score_mod: its kind, and the slopes (alibi) or the cap (softcap) it needs.
void check_score_mod_option(const Checker& c, const Tensor& q, const Options& opts, Dims& d) {
  const ScoreMod& s = opts.score_mod;
  const int kind = static_cast<int>(s.kind);
  if (kind < 0 || kind >= kernels::kScoreModKindCount)
    c.fail("options.score_mod.kind = {} is not a score mod; valid: 0 none, 1 alibi, 2 softcap", kind);
  if (s.kind == kernels::ScoreModKind::none) return;
  if (!declares(Pass::forward, mn::kScoreMod))
    c.fail("options.score_mod.kind = {}: this build's attention kernels have no SCORE_MOD meta", kernels::score_mod_kind_name(s.kind));
  if (s.kind == kernels::ScoreModKind::alibi) {
    if (!s.alibi_slopes) c.fail("options.score_mod.kind = alibi needs options.score_mod.alibi_slopes (f32 [Hq] = [{}])", d.heads_q);
    const Tensor& t = *s.alibi_slopes;
    if (t.dtype != ir::DType::f32) c.fail("options.score_mod.alibi_slopes has dtype {}; it must be f32", ir::name(t.dtype));
    c.tensor("options.score_mod.alibi_slopes", t, 1, "[Hq]", 4);
    c.same_device("options.score_mod.alibi_slopes", t, q);
    if (t.size(0) != d.heads_q) c.fail("options.score_mod.alibi_slopes has sizes {} but must be [Hq] = [{}]", list(sizes_of(t)), d.heads_q);
  } else if (!(std::isfinite(s.softcap) && s.softcap > 0)) {
    c.fail("options.score_mod.softcap = {}; with kind softcap it must be finite and > 0", s.softcap);
  }
  d.score_mod = s.kind;
}

// The backward's dQ reduction and query-tile order against the call (varlen, the mask kind) and
// what the dK/dV kernel refuses (kernels/attention/backward.hpp: the reductions with VARLEN,
// ordered with a library MASK, Q_DESCENDING with split or a library MASK), before anything runs.
void check_dq_reduction(const Checker& c, DqReduction reduction, bool q_descending, bool varlen, kernels::MaskKind mask,
                        const ReductionArgs& a) {
  const int r = static_cast<int>(reduction);
  if (r < 0 || r > 3) c.fail("{} = {} is not a dQ reduction; valid: 0 recompute, 1 atomic, 2 split, 3 ordered", a.reduction, r);
  const char* rname = name(reduction);
  if (reduction != DqReduction::recompute) {
    if (varlen)
      c.fail("{} = {} with {}; the atomic, split and ordered reductions take dense batches only (their workspaces are laid out "
             "per dense [B, Hq, S_q]); use recompute",
             a.reduction, rname, a.varlen);
    if (reduction == DqReduction::ordered && library_mask(mask))
      c.fail("{} = ordered with {} {}; ordered takes the full and causal masks only (its semaphore waits count every earlier key "
             "tile); use atomic or split with library masks",
             a.reduction, a.mask, kernels::mask_kind_name(mask));
    if (!dq_reduction_supported(reduction))
      c.fail("{} = {}: this build's attention_bwd_dkdv kernel does not take DQ_REDUCTION = {} (or the {} kernel is missing); "
             "valid here: {}",
             a.reduction, rname, r, reduction == DqReduction::split ? "attention_bwd_dq_reduce" : "attention_bwd_dq_convert",
             supported_reductions());
  }
  if (!q_descending) return;
  if (reduction == DqReduction::split)
    c.fail("{} = true with {} = split; the dK/dV kernel takes Q_DESCENDING with recompute, atomic and ordered only", a.descending,
           a.reduction);
  if (library_mask(mask))
    c.fail("{} = true with {} {}; the descending walk is for the full and causal masks only", a.descending, a.mask,
           kernels::mask_kind_name(mask));
  if (!declares(Pass::bwd_dkdv, mn::kQDescending))
    c.fail("{} = true: this build's attention_bwd_dkdv kernel has no Q_DESCENDING meta", a.descending);
}

// options.dq_reduction and q_descending of a backward call (the forward ignores them).
void check_reduction_option(const Checker& c, const Options& opts, Dims& d, bool backward) {
  if (!backward) return;
  // (unset: the default for this shape and Options::deterministic; it always passes these checks)
  const DqReduction reduction = opts.dq_reduction ? *opts.dq_reduction : default_reduction(d, opts);
  check_dq_reduction(c, reduction, opts.q_descending, d.varlen, d.mask);
  d.reduction = reduction;
  d.q_descending = opts.q_descending;
  if (!opts.accumulate_gradients) return;
  // recompute: dK/dV and dQ add into the sums in their epilogues; atomic: dK/dV adds, and the
  // convert pass adds scale * dQ_accum into dQ's sums
  if (reduction != DqReduction::recompute && reduction != DqReduction::atomic)
    c.fail("options.accumulate_gradients with options.dq_reduction = {}; the accumulating kernels add dQ in attention_bwd_dq "
           "(recompute) or attention_bwd_dq_convert (atomic) only", name(reduction));
  for (Pass p : {Pass::bwd_dkdv, dq_pass(reduction)})
    if (!declares(p, mn::kAccumulate))
      c.fail("options.accumulate_gradients: this build's {} kernel has no ACCUMULATE meta", name(p));
  d.accumulate = true;
}

Dims check_common(const Checker& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                  const Options& opts, bool backward) {
  Dims d;
  const bool has_q = opts.cu_seqlens_q.has_value(), has_k = opts.cu_seqlens_k.has_value();
  if (has_q != has_k)
    c.fail("{} is set but {} is not (variable-length batches need both)", has_q ? "options.cu_seqlens_q" : "options.cu_seqlens_k",
           has_q ? "options.cu_seqlens_k" : "options.cu_seqlens_q");
  d.varlen = has_q;
  if (!d.varlen && (opts.max_seqlen_q != 0 || opts.max_seqlen_k != 0))
    c.fail("options.max_seqlen_q/k = {}/{} are set without cu_seqlens_q/k (they only apply to variable-length batches)",
           opts.max_seqlen_q, opts.max_seqlen_k);

  check_qkvo(c, q, k, v, o, d, backward);
  check_sequences(c, q, k, opts, d);
  check_lse(c, q, lse, d);

  d.scale = opts.softmax_scale.value_or(static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim))));
  if (!std::isfinite(d.scale)) c.fail("options.softmax_scale = {} is not finite", d.scale);

  check_schedule(c, opts);
  if (d.varlen && !varlen_supported(backward))
    c.fail("variable-length batches (options.cu_seqlens_q/k) are not supported by this build's {} kernels (no VARLEN meta)",
           backward ? "backward" : "forward");

  check_dropout_options(c, q, opts, d, backward);
  check_mask_option(c, q, opts, d, backward);
  check_score_mod_option(c, q, opts, d);
  check_reduction_option(c, opts, d, backward);
  plan_workspace(c, q, opts, d, backward);
  return d;
}

// Outputs share no byte with an input, another output or the workspace: attention reads every row
// of k and v (and, backward, of q, o and do) from every program and over several launches, so no
// output can be written in place.
void check_disjoint(const Checker& c, std::initializer_list<std::pair<const char*, const Tensor*>> outputs,
                    std::initializer_list<std::pair<const char*, const Tensor*>> inputs, const Workspace& ws) {
  std::vector<std::pair<const char*, const Tensor*>> seen(inputs);
  for (const auto& [name, t] : outputs) {
    const runtime::TensorView out = t->view();
    for (const auto& [other_name, other] : seen)
      if (runtime::views_overlap(out, other->view()))
        c.fail("the output {} ({}) shares memory with {} ({}); attention writes no output in place (valid: separate "
               "buffers)",
               name, t->describe(), other_name, other->describe());
    if (ws.data != 0 && ws.bytes != 0) {
      const int64_t bytes = static_cast<int64_t>(ws.bytes), unit = 1;
      const runtime::TensorView w{ir::DType::u8, std::span(&bytes, 1), std::span(&unit, 1), ws.data, t->device};
      if (runtime::views_overlap(out, w))
        c.fail("the output {} ({}) overlaps the workspace ({} bytes at {:#x}) (valid: separate buffers)", name,
               t->describe(), ws.bytes, ws.data);
    }
    seen.emplace_back(name, t);
  }
}

Dims check_forward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                        const Options& opts, Workspace ws) {
  const Checker c("forward");
  const Dims d = check_common(c, q, k, v, o, lse, opts, false);
  check_workspace(c, ws, forward_bytes(d), "forward_workspace_bytes");
  check_disjoint(c, {{"o", &o}, {"lse", &lse}}, {{"q", &q}, {"k", &k}, {"v", &v}}, ws);
  return d;
}

Dims check_backward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_,
                         const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts,
                         Workspace ws) {
  const Checker c("backward");
  Dims d = check_common(c, q, k, v, o, lse, opts, true);
  if (!backward_available())
    c.fail("the backward kernels (attention_bwd_preprocess, attention_bwd_dkdv, attention_bwd_dq) are not in this build's "
           "kernel library");
  const std::string group = group_name(true);
  const int rank = d.varlen ? 3 : 4;
  const char* q_layout = d.varlen ? "[total_q, Hq, D] (varlen)" : "[B, S_q, Hq, D]";
  const char* k_layout = d.varlen ? "[total_k, Hkv, D] (varlen)" : "[B, S_k, Hkv, D]";
  const BackwardPhase phase = opts.backward_phase;
  if (phase != BackwardPhase::all && phase != BackwardPhase::dkdv && phase != BackwardPhase::dq)
    c.fail("options.backward_phase = {} is not a phase; valid: 0 all, 1 dkdv, 2 dq", static_cast<int>(phase));
  for (auto [name, t, ref_name, ref, layout, gradient] :
       {std::tuple{"do", &do_, "q", &q, q_layout, false}, std::tuple{"dq", &dq, "q", &q, q_layout, true},
        std::tuple{"dk", &dk, "k", &k, k_layout, true}, std::tuple{"dv", &dv, "v", &v, k_layout, true}}) {
    // a gradient the call's phase does not write: f32 or the inputs' dtype (a caller may add the
    // dK/dV phase into f32 sums and write dQ in the dQ phase, passing the same tensors to both)
    const bool written = phase == BackwardPhase::all || (phase == BackwardPhase::dq) == (std::string_view(name) == "dq");
    if (gradient && !written) {
      if (t->dtype != ir::DType::f32 && t->dtype != q.dtype)
        c.fail("{} has dtype {}; options.backward_phase = {} leaves it alone, but it must be f32 or q's dtype {}", name,
               ir::name(t->dtype), attention::name(phase), ir::name(q.dtype));
    } else if (d.accumulate && gradient) {  // the f32 sums
      if (t->dtype != ir::DType::f32)
        c.fail("{} has dtype {}; with options.accumulate_gradients the gradients are f32 sums (+=)", name, ir::name(t->dtype));
    } else {
      c.same_dtype(name, *t, q, group.c_str());
    }
    c.tensor(name, *t, rank, layout, kAlign);
    c.same_device(name, *t, q);
    c.same_sizes(name, *t, ref_name, *ref);
  }
  // a workspace with room for everything but the mask's words (e.g. sized without k): dQ draws
  // the mask again instead (the same bits)
  if (d.mask_once && ws.data != 0 && ws.bytes < backward_bytes(d)) d.mask_once = false;
  check_workspace(c, ws, backward_bytes(d), "backward_workspace_bytes");
  if (phase != BackwardPhase::all && d.reduction != DqReduction::recompute)
    c.fail("options.backward_phase = {} with options.dq_reduction = {}: split phases need recompute (the reductions compute dQ "
           "inside dK/dV)", name(phase), name(d.reduction));
  if (phase != BackwardPhase::all && ws.data == 0)
    c.fail("options.backward_phase = {} without a workspace: the dq phase reads the Delta the dkdv phase left there (pass one "
           "sized by backward_workspace_bytes to both calls)", name(phase));
  check_disjoint(c, {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}},
                 {{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"do", &do_}, {"lse", &lse}}, ws);
  // Delta is contiguous [B, Hq, S_q] at the (16-byte aligned) workspace base: S_q % 4 aligns its rows
  d.row_vectors_aligned = !d.varlen && d.seq_q % 4 == 0 && lse.data % 16 == 0 && lse.stride(0) % 4 == 0 && lse.stride(1) % 4 == 0;
  return d;
}

}  // namespace tilejit::attention::detail

namespace tilejit::attention {
using namespace detail;

void check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const Options& opts,
                   Workspace workspace) {
  if (opts.varlen_documents) {
    (void)check_documents_forward(q, k, v, o, lse, opts, workspace);
    return;
  }
  check_forward_dims(q, k, v, o, lse, opts, workspace);
}

void check_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                    const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, Workspace workspace) {
  if (opts.varlen_documents) {
    (void)check_documents_backward(q, k, v, o, do_, lse, dq, dk, dv, opts, workspace);
    return;
  }
  check_backward_dims(q, k, v, o, do_, lse, dq, dk, dv, opts, workspace);
}

}  // namespace tilejit::attention
