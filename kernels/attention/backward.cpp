// Attention backward (FlashAttention-2, deterministic): Delta = rowsum(dO * O) first; then one
// program per key block accumulates dK and dV over the query heads of its group and the query
// blocks that see it, and one program per query block accumulates dQ over the key blocks it sees.
// Both recompute P = exp2(S * scale * log2 e - LSE * log2 e) from the forward's LSE.
// Variable-length batches (VARLEN) run the same code on per-sequence views (HeadRows).
// Dropout (DROPOUT) regenerates the forward's keep-mask from the same logical coordinates
// (AttentionDropout, kernels/attention/forward.hpp): dV = sum (P * keep * s)^T dO, dP = (dO V^T) * keep * s,
// dS = P * (dP - Delta), s = 1 / keep probability; Delta = rowsum(dO * O) is unchanged (O includes
// the dropout).
// Library masks (MASK, kernels/attention/mask.hpp) other than full and causal visit only the
// non-empty blocks, in one flat loop per program, and mask only the partial ones (P = 0 there).
#include "kernels/attention/backward.hpp"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

#include "kernels/attention/config.hpp"
#include "kernels/attention/dropout.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/attention/backward_schedule_lang.hpp"
#include "kernels/philox.hpp"
#include "kernels/attention/program_order.hpp"

namespace tilejit::kernels {

using namespace lang;

namespace {

constexpr double kLog2e = 1.4426950408889634;
const ParamSpec kRowMajor{.align_bytes = 16, .contiguous_last = true};

// Where the rows of one (batch, head) live: every window the backward kernels read or write comes
// from here, and so do the sequence lengths. Variable-length batches (VARLEN) change only this:
// sequence b of each tensor is the view of its packed tokens [cu[b], cu[b + 1]) (Tensor::slice),
// and windows are bounds-checked against it, as in the forward.
struct HeadRows {
  Tile b;  // the batch (the sequence, with VARLEN)
  int64_t D;
  bool bshd;    // tensors are [batch, seq, heads, head_dim] (else [batch, heads, seq, head_dim])
  bool varlen;  // tensors are [total, heads, head_dim], statistics [heads, total]
  Tile q_start, q_len, k_start, k_len;  // VARLEN: sequence b's tokens on the query and key side

  // VARLEN: sequence b's offsets from the i32 pointers cu_q (and cu_k, when the kernel has it).
  HeadRows(Tile batch, int64_t head_dim_, bool bshd_, bool varlen_, const Tile& cu_q = {}, const Tile& cu_k = {})
      : b(std::move(batch)), D(head_dim_), bshd(bshd_), varlen(varlen_) {
    if (!varlen) return;
    q_start = load(cu_q + b), q_len = load(cu_q + (b + 1)) - q_start;
    if (cu_k.valid()) k_start = load(cu_k + b), k_len = load(cu_k + (b + 1)) - k_start;
  }

  int seq_dim() const { return varlen ? 0 : bshd ? 1 : 2; }
  int head_dim() const { return varlen ? 1 : bshd ? 2 : 1; }
  int rank() const { return varlen ? 3 : 4; }  // of Q, K, V and the gradients; statistics: rank() - 1
  // Sequence b of a query-side tensor (Q, O, dO, dQ, LSE, Delta) or a key-side one (K, V, dK, dV):
  // the tensor itself, or with VARLEN its view.
  Tensor queries(const Tensor& t) const { return varlen ? t.slice(t.rank() == rank() ? 0 : 1, q_start, q_len) : t; }
  Tensor keys(const Tensor& t) const { return varlen ? t.slice(0, k_start, k_len) : t; }
  Tile seq_len(const Tensor& t) const { return t.size(seq_dim()); }
  // Rows [s0, s0 + n) of head hh: an [n, D] window of Q, K, V or a gradient in either layout, or
  // [n] of a statistics tensor (LSE, Delta: [batch, heads, seq] or [heads, total]).
  BlockRef operator()(const Tensor& t, const Operand& hh, const Operand& s0, int64_t n) const {
    if (t.rank() == rank() - 1) return varlen ? t.block({hh, s0}, {n}) : t.block({b, hh, s0}, {n});
    if (varlen) return t.block({s0, hh, 0}, {n, D}, {0, 2});
    return bshd ? t.block({b, s0, hh, 0}, {n, D}, {1, 3}) : t.block({b, hh, s0, 0}, {n, D}, {2, 3});
  }
  // The end of the loop of a program whose own block starts at `first` in a sequence of `len`:
  // with VARLEN (programs launched for the longest sequence) 0 once the block lies past the end.
  Tile unless_past(const Tile& first, const Tile& len, const Tile& end) const { return varlen ? where(first < len, end, 0) : end; }
};

// The VARLEN meta (refused with BSHD, as in the forward).
bool varlen_meta(Builder& kb, bool bshd) {
  const bool varlen = kb.meta<bool>("VARLEN", false);
  if (varlen && bshd)
    kb.fail(Loc::current(), "VARLEN tensors are [total_tokens, heads, head_dim]; BSHD does not apply to them");
  return varlen;
}

// The MASK meta (the forward's): full and causal run the CAUSAL code path (MASK=causal is
// CAUSAL=true); the other kinds are library masks, on dense batches without CAUSAL for now.
MaskKind backward_mask_meta(Builder& kb, bool causal, bool varlen) {
  const MaskKind kind = mask_kind_meta(kb);
  if (kind != MaskKind::full && kind != MaskKind::causal && (causal || varlen))
    kb.fail(Loc::current(), fmt::format("MASK={} ({}) does not combine with {} yet (use the mask alone: the causal kinds cover causal "
                                        "patterns, document masks packed sequences)",
                                        static_cast<int>(kind), mask_kind_name(kind), causal ? "CAUSAL=true" : "VARLEN=true"));
  return kind;
}

// The DQ_REDUCTION meta of the dK/dV kernel (dense batches only for the atomic and split forms).
DqReduction dq_reduction_meta(Builder& kb, bool varlen) {
  const int64_t value = kb.meta<int>("DQ_REDUCTION", 0);
  if (value < 0 || value > 3)
    kb.fail(Loc::current(), fmt::format("meta-parameter DQ_REDUCTION = {} is not a dQ reduction; valid: 0 recompute (the "
                                        "attention_bwd_dq kernel), 1 atomic, 2 split, 3 ordered",
                                        value));
  const auto reduction = static_cast<DqReduction>(value);
  if (reduction != DqReduction::recompute && varlen)
    kb.fail(Loc::current(), fmt::format("DQ_REDUCTION={} ({}) does not combine with VARLEN=true yet (its workspaces are laid out "
                                        "per dense [batch, heads_q, seq_q]); use DQ_REDUCTION=0 (recompute)",
                                        value, dq_reduction_name(reduction)));
  return reduction;
}

// A pointer to one element of a tensor at integer scalar coordinates.
Tile element_pointer(const Tensor& t, std::initializer_list<Tile> at) {
  Tile p = t.ptr();
  int dim = 0;
  for (const Tile& i : at) p = p + i * t.stride(dim++);
  return p;
}

// One step of a program's walk over its inner tiles under a library mask: the tile's first row
// (dK/dV: a query tile) or key (dQ: a key tile), and whether it is partial (needs the element mask).
struct MaskedTile {
  Tile start, partial;
};
// A query block's LSE and Delta ([BLOCK_M] f32 each), as loaded.
struct RowVectors {
  Tile lse, delta;
};

// The walk: ONE flat loop j in [0, count) per program (whatever the runs or lists), so that a
// pipelined schedule sees a single stream of tiles to prefetch.
struct MaskedTileWalk {
  Tile count;
  std::function<MaskedTile(const Tile& j)> at;
};

// Interval kinds: the runs of TileRanges (two for global_sliding_window) laid end to end; `full`
// says whether the tile at a start is full (SequenceMask::tile_is_full).
MaskedTileWalk interval_walk(const TileRanges& r, int64_t block, std::function<Tile(const Tile& start)> full) {
  auto trips = [&](size_t run) { return cdiv(maximum(r.end[run] - r.begin[run], 0), block); };
  const Tile trips0 = trips(0);
  const Tile count = r.runs == 2 ? trips0 + trips(1) : trips0;
  return {count, [r, block, trips0, full = std::move(full)](const Tile& j) {
            Tile start = r.begin[0] + j * block;
            if (r.runs == 2) start = where(j < trips0, start, r.begin[1] + (j - trips0) * block);
            return MaskedTile{start, !full(start)};
          }};
}

// Data-dependent kinds: the pre-pass's partial tiles of `outer`, then its full ones; an index is
// read only where it is valid (the other list's load reads its entry 0, in bounds, and is unused).
MaskedTileWalk list_walk(const BlockMaskLists& lists, const Tile& b, const Tile& h, const Tile& outer, int64_t block) {
  const Tile pc = lists.partial_count(b, h, outer), fc = lists.full_count(b, h, outer);
  return {pc + fc, [&lists, b, h, outer, block, pc](const Tile& j) {
            Tile partial = j < pc;
            Tile index = where(partial, lists.partial_block(b, h, outer, where(partial, j, 0)),
                               lists.full_block(b, h, outer, where(partial, 0, j - pc)));
            return MaskedTile{index * block, partial};
          }};
}

// The meta-parameters and leading parameters (Q, K, V, dO, LSE, Delta) of the dK/dV and dQ kernels.
struct BackwardParams {
  DType T;
  int64_t BM, BN, D;
  bool causal, bshd, varlen;
  MaskKind mask_kind;  // MASK: full / causal (folded into `causal`) or a library mask (library_mask())
  bool dropout;  // DROPOUT: trailing seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold
  bool dropout_bits;  // DROPOUT_BITS: then the precomputed packed mask `dropout_bits` (rng = precomputed)
  bool partial_tiles_only;  // PARTIAL_TILES_ONLY (full / causal): the element mask on partial tiles only (mask_partial)
  int rank;  // of Q, K, V, dO and the gradients (LSE, Delta: rank - 1)
  Tensor Q, K, V, dO, LSE, Delta;

  explicit BackwardParams(Builder& kb)
      : T(kb.meta_dtype("DTYPE", bf16)),
        BM(kb.meta<int>("BLOCK_M", 64)),
        BN(kb.meta<int>("BLOCK_N", 64)),
        D(kb.meta<int>("HEAD_DIM", 64)),
        causal(kb.meta<bool>("CAUSAL", false)),
        bshd(kb.meta<bool>("BSHD", false)),
        varlen(varlen_meta(kb, bshd)),
        mask_kind(backward_mask_meta(kb, causal, varlen)),
        dropout(kb.meta<bool>("DROPOUT", false)),
        dropout_bits(read_dropout_bits(kb, dropout, varlen, BN)),
        partial_tiles_only(kb.meta<bool>("PARTIAL_TILES_ONLY", true)),
        rank(varlen ? 3 : 4),
        Q(kb.tensor("Q", T, rank, kRowMajor)),
        K(kb.tensor("K", T, rank, kRowMajor)),
        V(kb.tensor("V", T, rank, kRowMajor)),
        dO(kb.tensor("dO", T, rank, kRowMajor)),
        LSE(kb.tensor("LSE", f32, rank - 1, {.contiguous_last = true})),
        Delta(kb.tensor("Delta", f32, rank - 1, {.contiguous_last = true})) {
    causal = causal || mask_kind == MaskKind::causal;
  }

  // A library mask: a kind other than full and causal (those run the CAUSAL code path).
  bool library_mask() const { return mask_kind != MaskKind::full && mask_kind != MaskKind::causal; }
  // Declares a library mask's parameters (after the dropout ones: call after sequence()) and, for
  // a kind without tile intervals, the pre-pass's lists (kv_major: per key tile, for dK/dV).
  void declare_mask(Builder& kb, bool kv_major) {
    if (!library_mask()) return;
    mask.emplace(kb, mask_kind);
    if (!mask->has_tile_intervals()) lists.emplace(kb, kv_major);
  }
  std::optional<AttentionMask> mask;
  std::optional<BlockMaskLists> lists;
  // SCORE_MOD: declares the score mod's parameter (last: call after declare_mask).
  void declare_score_mod(Builder& kb) { smod.emplace(kb, score_mod_kind_meta(kb)); }
  std::optional<AttentionScoreMod> smod;
  // The exponent of P = exp2(.) for the block, from the raw dot q . k ([BM, BN], or transposed
  // [BN, BM] for dK/dV) and the rows' LSE in log2 units (broadcast): raw * scale * log2 e - lse as
  // one fma, or with a score mod mod(raw * scale) * log2 e - lse; `derivative` gets d mod / d score
  // where the mod has one (soft-capping; invalid otherwise: a factor of 1).
  Tile log2_p_exponent(const Tile& raw, const Tile& lse_log2, const Tile& softmax_scale, const HeadRows& rows, const Tile& h,
                       const Tile& m0, const Tile& n0, const Tile& S_q, const Tile& S_k, bool transposed, Tile* derivative) const {
    if (!smod || smod->kind == ScoreModKind::none) return fma(raw, softmax_scale * kLog2e, -lse_log2);
    const MaskIndices idx = mask_indices(rows.b, h, m0 + arange(0, BM), n0 + arange(0, BN), S_q, S_k);
    const Tile s = transposed ? trans(raw * softmax_scale) : raw * softmax_scale;  // [BM, BN]
    auto back = [&](const Tile& t) { return transposed ? trans(t) : t; };
    if (smod->mod.derivative) *derivative = back(smod->mod.gradient(s, idx));
    return back(smod->mod(s, idx)) * kLog2e - lse_log2;
  }

  // The rows of batch b (declares the trailing VARLEN parameters cu_seqlens_q, cu_seqlens_k, then
  // with DROPOUT the dropout scalars (and DROPOUT_BITS' mask) into `drop`: call it after the kernel's own parameters); Q, K,
  // V, dO, LSE, Delta become sequence b's views.
  HeadRows sequence(Builder& kb, Tile b, std::optional<AttentionDropout>& drop) {
    Tile cu_q, cu_k;  // VARLEN: i32[batch + 1] offsets of the sequences in the packed tokens
    if (varlen) cu_q = kb.pointer("cu_seqlens_q", i32), cu_k = kb.pointer("cu_seqlens_k", i32);
    if (dropout) drop.emplace(kb);
    if (dropout_bits) drop->declare_bits(kb);
    HeadRows rows(std::move(b), D, bshd, varlen, cu_q, cu_k);
    Q = rows.queries(Q), dO = rows.queries(dO), LSE = rows.queries(LSE), Delta = rows.queries(Delta);
    K = rows.keys(K), V = rows.keys(V);
    return rows;
  }
  // The dropout mask's batch*heads index of query head h: b * heads_q + h (b: the sequence).
  Tile batch_head(const HeadRows& rows, const Tile& h) const { return rows.b * Q.size(rows.head_dim()) + h; }
  // Query heads per key/value head (grouped-query attention).
  Tile group(const HeadRows& rows) const { return Q.size(rows.head_dim()) / K.size(rows.head_dim()); }
  // The LSE of rows [m0, m0 + BM) of head h in log2 units, +inf for a row that sees no key
  // (LSE = -inf) or lies past the end: its P = exp2(s - inf) = 0, never exp2(-inf - -inf) = NaN.
  Tile lse_log2_of(const Tile& lse) const { return where(lse == -INFINITY, INFINITY, lse * kLog2e); }
  // LSE (natural log, as stored; +inf past S_q) and Delta of the query block at m0, as loaded.
  RowVectors row_vectors(const HeadRows& rows, const Tile& h, const Tile& m0) const {
    return {load(rows(LSE, h, m0, BM), /*padding=*/INFINITY), load(rows(Delta, h, m0, BM))};
  }
  // Which (query row, key) pairs count: keys inside the sequence and, when causal, the forward's
  // bottom-right alignment (row i sees keys j <= i + S_k - S_q). Arguments broadcast to the block.
  Tile visible(const Tile& qrows, const Tile& keys, const Tile& S_q, const Tile& S_k) const {
    Tile v = keys < S_k;
    if (causal) v = v & (keys <= qrows + (S_k - S_q));
    return v;
  }
  // Whether the tile of query block m0 and key block n0 needs visible() element by element: keys
  // past S_k, or (causal) a key after some row's diagonal. Every other tile runs without the
  // per-element compare and select (a uniform branch, as in the forward). Rows past S_q need no
  // mask: their LSE is +inf, so P = 0 there.
  Tile partial_tile(const Tile& m0, const Tile& n0, const Tile& S_q, const Tile& S_k) const {
    Tile partial = n0 + BN > S_k;
    if (causal) partial = partial | (n0 + (BN - 1) > m0 + (S_k - S_q));
    return partial;
  }
  // P (or P^T) zeroed where `allowed()` is false: on partial tiles only (PARTIAL_TILES_ONLY, the
  // default), or on every tile (the A/B baseline: `attention_bench --meta-ab PARTIAL_TILES_ONLY`).
  // Call after declare_score_mod.
  Tile mask_partial(const Tile& p, const Tile& partial, const std::function<Tile()>& allowed) const {
    // (not with a score mod: the branch then costs registers the mod's terms need; D128 dK/dV with
    // soft-capping spilled 32 -> 280 B under ptxas)
    if (!partial_tiles_only || (smod && smod->kind != ScoreModKind::none)) return where(allowed(), p, 0.0f);
    Var masked = p;
    if_(partial, [&] { masked = where(allowed(), masked, 0.0f); });
    return masked;
  }
};

}  // namespace

const Kernel& attention_backward_preprocess() {
  static const Kernel kern = kernel("attention_bwd_preprocess", [](Builder& kb) {
    auto T = kb.meta_dtype("DTYPE", bf16);
    auto BM = kb.meta<int>("BLOCK_M", 64), D = kb.meta<int>("HEAD_DIM", 64);
    auto bshd = kb.meta<bool>("BSHD", false);
    const bool varlen = varlen_meta(kb, bshd);
    const int rank = varlen ? 3 : 4;
    auto O = kb.tensor("O", T, rank, kRowMajor), dO = kb.tensor("dO", T, rank, kRowMajor);
    auto Delta = kb.tensor("Delta", f32, rank - 1, {.contiguous_last = true});
    Tile cu_q;  // VARLEN: i32[batch + 1] query offsets (the only side this kernel reads)
    if (varlen) cu_q = kb.pointer("cu_seqlens_q", i32);
    auto m0 = program_id(0) * BM, h = program_id(1);
    HeadRows rows(program_id(2), D, bshd, varlen, cu_q);
    // a block past its sequence's end reads padding and writes nothing (outside the views)
    O = rows.queries(O), dO = rows.queries(dO), Delta = rows.queries(Delta);
    auto o = cast(f32, load(rows(O, h, m0, BM))), dout = cast(f32, load(rows(dO, h, m0, BM)));
    store(rows(Delta, h, m0, BM), sum(o * dout, 1));
  });
  return kern;
}

const Kernel& attention_backward_dkdv() {
  static const Kernel kern = kernel("attention_bwd_dkdv", [](Builder& kb) {
    BackwardParams a(kb);
    const DqReduction reduction = dq_reduction_meta(kb, a.varlen);
    auto dK = kb.tensor("dK", a.T, a.rank, kRowMajor), dV = kb.tensor("dV", a.T, a.rank, kRowMajor);
    Tensor dq_ws;  // atomic: dQ_accum f32 [B, Hq, S_q, D]; split: dQ_parts f32 [B * Hq, M, N, BM, D]
    if (reduction == DqReduction::atomic || reduction == DqReduction::ordered) dq_ws = kb.tensor("dQ_accum", f32, 4, kRowMajor);
    if (reduction == DqReduction::split) dq_ws = kb.tensor("dQ_parts", f32, 5, kRowMajor);
    Tile dq_sem;  // ordered: i32 [B * Hq, M] semaphores (zero before the call): key tiles added so far
    if (reduction == DqReduction::ordered) dq_sem = kb.pointer("dQ_semaphores", i32);
    // Q_DESCENDING (causal): a key block visits its query blocks from the last to the first.
    const bool q_descending = kb.meta<bool>("Q_DESCENDING", false);
    // PERSISTENT (ordered): DASH's schedule (kernels/attention/backward_schedule.hpp): num_programs(0) programs,
    // all resident, take the items (key tiles; causal: pairs n, N-1-n) of every (batch, KV head) in
    // turn; tiles of one wave visit query tiles in the shift orders, and each adds into dQ[m] when
    // the accumulation order says (wait_target), so no tile waits in the full case.
    const bool persistent = kb.meta<bool>("PERSISTENT", false);
    // ROWS_AHEAD (schedule): each query block's LSE and Delta are loaded while the block before it
    // runs (walk_blocks), not at its top. Default on except causal at D >= 128 (H100 S4k, dK/dV
    // alone, three runs: D64 +7-13% full, +2-3% causal, D128 +3% full, -1% causal).
    const bool rows_ahead = kb.meta<bool>("ROWS_AHEAD", !(a.causal && a.D >= 128));
    auto softmax_scale = kb.scalar<float>("softmax_scale");

    // HEAVY_FIRST_SECTIONS (dense causal; not PERSISTENT, which has its own order): the key tiles
    // heaviest first (tile 0 sees every query) across heads too, in L2-sized sections of heads
    // (kernels/attention/program_order.hpp); else in launch order (heaviest first within each head). Off by
    // default here: H100, recompute's dK/dV, one process, alternated rounds: 0.94-1.04x (S 4k-16k, D
    // 64/128; the forward and dQ gain 1-12% from it). The ordered reduction stays deadlock-free
    // with it: a head's lower key tiles still start first.
    const bool sections = kb.meta<bool>("HEAVY_FIRST_SECTIONS", false) && !persistent && a.causal && !a.varlen;
    Tile first_n = program_id(0), first_kv_h = program_id(1), first_b = program_id(2);
    if (sections) {
      const GridSlot slot = heavy_first_sections(/*heavy_at_end=*/false, a.Q.size(a.bshd ? 1 : 2), 2 * a.D * ir::byte_size(a.T));
      first_n = slot.tile, first_kv_h = slot.head, first_b = slot.batch;  // (Q and dO rows)
    }
    std::optional<AttentionDropout> drop;
    HeadRows rows0 = a.sequence(kb, persistent ? zeros(i32, {}) : first_b, drop);
    a.declare_mask(kb, /*kv_major=*/true);
    a.declare_score_mod(kb);
    if (reduction == DqReduction::ordered && a.mask)
      kb.fail(Loc::current(), "DQ_REDUCTION=3 (ordered) takes the full and causal masks only (its wait targets count every earlier "
                              "key block); use atomic or split with library masks");
    if (q_descending && (a.mask || reduction == DqReduction::split))
      kb.fail(Loc::current(), "Q_DESCENDING applies to the full and causal walks without the split reduction");
    if (persistent && (reduction != DqReduction::ordered || q_descending || a.varlen))
      kb.fail(Loc::current(), fmt::format("PERSISTENT takes DQ_REDUCTION=3 (ordered) on dense batches without Q_DESCENDING (its "
                                          "visit order is DASH's shift order); got DQ_REDUCTION={}{}{}",
                                          static_cast<int>(reduction), q_descending ? ", Q_DESCENDING" : "", a.varlen ? ", VARLEN" : ""));
    const Tile S_q = rows0.seq_len(a.Q), S_k = rows0.seq_len(a.K);  // dense: every batch's
    const BwdScheduleLang sched{S_q, S_k, a.BM, a.BN, a.causal};
    // One key tile of one (batch, KV head): dK, dV over its group's query heads and query tiles.
    // PERSISTENT: `slot` and `stage` say where it stands in DASH's schedule.
    auto key_tile = [&](HeadRows rows, Tile n_block, Tile kv_h, const BwdScheduleLang::Slot* slot, const Tile& stage) {
      if (a.mask) std::tie(n_block, kv_h) = a.mask->program_order(a.BN, n_block, kv_h);  // heavy key blocks first
      auto n0 = n_block * a.BN;
      auto dK_t = rows.keys(dK), dV_t = rows.keys(dV);
      auto group = a.group(rows);
      auto k = load(rows(a.K, kv_h, n0, a.BN)), v = load(rows(a.V, kv_h, n0, a.BN));
      auto keys = (n0 + arange(0, a.BN))[col];  // [BN, 1]: this program's blocks are transposed, S^T
      Var dk = zeros(f32, {a.BN, a.D});
      Var dv = zeros(f32, {a.BN, a.D});
      // Causal: the first query block with a row that sees key n0 (row i sees n0 from i = n0 - diag).
      Tile m_begin = a.causal ? maximum(n0 - (S_k - S_q), 0) / a.BM * a.BM : zeros(i32, {});
      Tile m_end = rows.unless_past(n0, S_k, S_q);
      for_range(0, group, [&](Tile g) {  // the query heads of this key/value head's group
        auto h = kv_h * group + g;
        Tile bh;  // DROPOUT: the mask's batch*heads index
        if (a.dropout) bh = a.batch_head(rows, h);
        std::optional<SequenceMask> seq;  // a library mask: per query head (block_sparse tables may differ)
        if (a.mask) seq = a.mask->bind(rows.b, h, S_q, S_k);
        // One query block; needs_mask (library masks): whether its P^T needs the element mask (a
        // partial block or keys past S_k; rows past S_q have P = 0 already: LSE = +inf there).
        // ordered: the semaphore count to wait for before adding (default: n_block), and `deferred`:
        // where to leave this add's semaphore index for the caller to signal later (see below).
        // `ahead`: the block's LSE and Delta, loaded one block earlier (walk_blocks).
        auto block = [&](const Tile& m0, const RowVectors& ahead, const Tile& needs_mask, const Tile& wait_target = Tile(),
                         Var* deferred = nullptr) {
          auto q = load(rows(a.Q, h, m0, a.BM)), dout = load(rows(a.dO, h, m0, a.BM));
          auto lse = a.lse_log2_of(ahead.lse)[row];  // [1, BM]
          auto delta = ahead.delta[row];
          Tile pt;  // P^T
          Tile mod_grad_t;  // SCORE_MOD with a derivative: d mod / d score, transposed
          const Tile e_t =
              a.log2_p_exponent(dot(k, trans(q)), lse, softmax_scale, rows, h, m0, n0, S_q, S_k, /*transposed=*/true, &mod_grad_t);
          if (seq) {
            Var p_t = exp2(e_t);
            if_(needs_mask, [&] { p_t = where(trans(seq->allowed(m0 + arange(0, a.BM), n0 + arange(0, a.BN))), p_t, 0.0f); });
            pt = p_t;
          } else {
            pt = a.mask_partial(exp2(e_t), a.partial_tile(m0, n0, S_q, S_k),
                                [&] { return a.visible((m0 + arange(0, a.BM))[row], keys, S_q, S_k); });
          }
          // DROPOUT: the block is transposed (rows are keys, columns query rows): the forward's mask
          // of (query rows m0.., keys n0..), transposed; s = 1 / keep probability is applied to dV
          // once at the end
          Tile pt_kept = pt;
          Tile dpt = dot(v, trans(dout));  // dP^T (of the dropped P: times keep * s)
          Tile dst;  // dS^T = P^T * (dP^T - Delta)
          if (a.dropout) {
            // One use of the mask, before dV's MMA is issued (its 0 / ~0 words, one register per
            // element, then die early instead of staying live across that MMA): dS^T = P^T (Z s dP^T
            // - Delta) = (P^T Z) s dP^T - P^T Delta, Z the mask.
            Tile keep_t = drop->keep_mask_transposed(bh, m0, a.BM, n0, a.BN);  // [BN, BM]
            pt_kept = apply_keep_mask(pt, keep_t);
            dst = pt_kept * (dpt * drop->scale) - pt * delta;
          } else {
            dst = pt * (dpt - delta);
          }
          dv = dot(cast(a.T, pt_kept), dout, dv);
          if (mod_grad_t.valid()) dst = dst * mod_grad_t;  // the gradient of the raw score
          auto dst_t = cast(a.T, dst);
          dk = dot(dst_t, q, dk);
          // DQ_REDUCTION: this block's part of dQ, dS K = trans(dS^T) K [BM, D] (unscaled: the
          // convert / reduce kernel multiplies by softmax_scale once, as the dQ kernel does). A is
          // dS^T's registers transposed (the lowering moves them through shared memory into the A
          // layout). B: the program's K window, the same shared-memory copy of K the S^T dots read,
          // wherever wgmma can run this dot too: M = BLOCK_M a multiple of 64, and at 64 rows on two
          // warpgroups each takes half of D's columns, which must be whole 64-column chunks (D 128).
          // Elsewhere (e.g. D 64 on 8 warps) it falls to mma.sync, which takes B from registers; a use
          // outside wgmma would also take the K window out of shared memory for the S^T dots, so that
          // dot reads its own copy of K, loaded in the loop (LLVM at D 64: 700 B of spills -> 20 B).
          if (reduction != DqReduction::recompute) {
            const bool k_on_wgmma = a.BM % 64 == 0 && (a.BM >= a.BN || a.D % 128 == 0);
            Tile k_b = k_on_wgmma ? k : load(rows(a.K, kv_h, n0, a.BN));
            Tile dq_part = dot(trans(dst_t), k_b);
            auto window = [&] { return dq_ws.block({rows.b, h, m0, 0}, {a.BM, a.D}, {2, 3}); };  // dQ_accum's
            if (reduction == DqReduction::atomic) {
              atomic_add(window(), dq_part);  // on Hopper: TMA adds the tile from shared memory
            } else if (reduction == DqReduction::ordered) {
              // Key blocks add into dQ tile m in increasing order: this one waits for the n_block
              // before it (every earlier key block reaches m: full, or causal, whose query range only
              // grows towards earlier keys). dQ_accum starts at zero. Waits are on lower block indices
              // only: no deadlock whatever the residency. Each add is elementwise, so the order of the
              // key blocks fixes every element's sum.
              Tile sem_index = a.batch_head(rows, h) * cdiv(S_q, a.BM) + m0 / a.BM;
              // PERSISTENT: the previous block's signal is given only now, one block of work after
              // its add was issued: a signal first waits for the add's writes to complete in L2,
              // which stalled the whole program when it came right after the add. Still before this
              // block waits, so every wait's predecessor has been signalled: no new waits arise.
              if (deferred) if_(*deferred >= 0, [&] { signal_add(dq_sem + *deferred, 1); });
              // the add waits for its turn (on the TMA path only the issuing thread waits)
              atomic_add(window(), dq_part, dq_sem + sem_index, wait_target.valid() ? wait_target : n_block);
              if (deferred) *deferred = sem_index;
              else signal_add(dq_sem + sem_index, 1);
            } else {
              store(dq_ws.block({a.batch_head(rows, h), m0 / a.BM, n_block, 0, 0}, {a.BM, a.D}, {3, 4}), dq_part);
            }
          }
        };
        // The query blocks j = 0 .. count - 1 at m0_at(j), each with its LSE and Delta loaded while
        // the block before it runs: read at the block's top, those global loads stalled its
        // exponent (their latency exceeds S^T's MMA; ~11% of the kernel's time at D128 S4k, H100).
        // Blocks past the end read padding (rows past S_q), never outside the tensors.
        auto walk_blocks = [&](const Tile& count, const std::function<Tile(const Tile&)>& m0_at,
                               const std::function<void(const Tile& j, const Tile& m0, const RowVectors&)>& body) {
          if (!rows_ahead) {
            for_range(0, count, [&](Tile j) {
              const Tile m0 = m0_at(j);
              body(j, m0, a.row_vectors(rows, h, m0));
            });
            return;
          }
          const RowVectors first = a.row_vectors(rows, h, where(count > 0, m0_at(zeros(i32, {})), 0));
          Var lse = first.lse, delta = first.delta;
          for_range(0, count, [&](Tile j) {
            const RowVectors current{lse, delta};
            const RowVectors next = a.row_vectors(rows, h, m0_at(minimum(j + 1, maximum(count - 1, 0))));
            lse = next.lse;
            delta = next.delta;
            body(j, m0_at(j), current);
          });
        };
        if (slot) {  // PERSISTENT: the shift order; each add waits for its place in the fixed order
          Var deferred = full(i32, {}, -1);  // the last add's semaphore, not signalled yet
          auto query_tile = [&](const Tile& t) { return sched.visit_query_tile(*slot, stage, n_block, t); };
          walk_blocks(sched.visit_count(n_block), [&](const Tile& t) { return query_tile(t) * a.BM; },
                      [&](const Tile& t, const Tile& m0, const RowVectors& rv) {
                        block(m0, rv, Tile(), sched.wait_target(*slot, stage, n_block, query_tile(t)), &deferred);
                      });
          if_(deferred >= 0, [&] { signal_add(dq_sem + deferred, 1); });
          return;
        }
        if (!seq) {
          Tile trips = cdiv(maximum(m_end - m_begin, 0), a.BM);
          walk_blocks(trips, [&](const Tile& j) { return m_begin + (q_descending ? trips - 1 - j : j) * a.BM; },
                      [&](const Tile&, const Tile& m0, const RowVectors& rv) { block(m0, rv, Tile()); });
          return;
        }
        // the query blocks that see this key block: the mask's intervals or the pre-pass's lists
        auto is_full = [&](const Tile& m0) { return seq->tile_is_full(m0, a.BM, n0, a.BN); };
        const MaskedTileWalk walk = a.lists ? list_walk(*a.lists, rows.b, h, n_block, a.BM)
                                            : interval_walk(seq->query_tiles(n0, a.BN, a.BM), a.BM, is_full);
        Tile keys_edge = n0 + a.BN > S_k;
        walk_blocks(walk.count, [&](const Tile& j) { return walk.at(j).start; },
                    [&](const Tile& j, const Tile& m0, const RowVectors& rv) { block(m0, rv, walk.at(j).partial | keys_edge); });
      });
      store(rows(dK_t, kv_h, n0, a.BN), cast(a.T, dk * softmax_scale));
      Tile dv_out = dv;
      if (a.dropout) dv_out = dv_out * drop->scale;
      store(rows(dV_t, kv_h, n0, a.BN), cast(a.T, dv_out));
    };
    if (!persistent) {
      key_tile(rows0, first_n, first_kv_h, nullptr, Tile());
      return;
    }
    // item L = (batch * KV heads + KV head) * items + i: the model's heads are the KV heads (a
    // program runs the whole query group of its KV head, in the same order for every query head)
    const Tile heads_kv = a.K.size(rows0.head_dim());
    const Tile total = a.K.size(0) * heads_kv * sched.items_per_head();
    for_range(program_id(0), total, num_programs(0), [&](Tile linear) {
      const BwdScheduleLang::Slot s = sched.slot(linear, num_programs(0));
      HeadRows rows(s.head / heads_kv, a.D, a.bshd, false);
      for_range(0, sched.stages(s), [&](Tile stage) { key_tile(rows, sched.stage_tile(s, stage), s.head % heads_kv, &s, stage); });
    });
  });
  return kern;
}

const Kernel& attention_backward_dq() {
  static const Kernel kern = kernel("attention_bwd_dq", [](Builder& kb) {
    BackwardParams a(kb);
    auto dQ = kb.tensor("dQ", a.T, a.rank, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");

    // Heavy query blocks first (longest job first: the last programs launched are light, so the
    // grid's tail is short): a causal block m sees m + 1 key blocks, so the walk is descending.
    // HEAVY_FIRST_SECTIONS (default, dense causal): across heads too, in L2-sized sections of heads
    // (kernels/attention/program_order.hpp); else within each head only. H100, one process, alternated rounds:
    // 1.00-1.12x (S 4k-16k, D 64/128; 1.07x at S 8k D 128, 1.12x with 16 heads).
    const bool sections = kb.meta<bool>("HEAVY_FIRST_SECTIONS", true) && a.causal && !a.varlen;
    Tile m_block = a.causal ? num_programs(0) - 1 - program_id(0) : program_id(0), h = program_id(1), b = program_id(2);
    if (sections) {
      const GridSlot slot = heavy_first_sections(/*heavy_at_end=*/true, a.K.size(a.bshd ? 1 : 2), 2 * a.D * ir::byte_size(a.T));
      m_block = slot.tile, h = slot.head, b = slot.batch;  // (K and V rows)
    }
    std::optional<AttentionDropout> drop;
    HeadRows rows = a.sequence(kb, b, drop);
    a.declare_mask(kb, /*kv_major=*/false);
    a.declare_score_mod(kb);
    if (a.mask) std::tie(m_block, h) = a.mask->program_order(a.BM, program_id(0), h);
    auto m0 = m_block * a.BM;
    dQ = rows.queries(dQ);
    auto S_q = rows.seq_len(a.Q), S_k = rows.seq_len(a.K);
    auto kv_h = h / a.group(rows);
    auto q = load(rows(a.Q, h, m0, a.BM)), dout = load(rows(a.dO, h, m0, a.BM));
    const RowVectors row_vectors = a.row_vectors(rows, h, m0);
    auto lse = a.lse_log2_of(row_vectors.lse)[col];  // [BM, 1]
    auto delta = row_vectors.delta[col];
    auto qrows = (m0 + arange(0, a.BM))[col];
    Var dq = zeros(f32, {a.BM, a.D});
    Tile bh;  // DROPOUT: the mask's batch*heads index
    if (a.dropout) bh = a.batch_head(rows, h);
    std::optional<SequenceMask> seq;  // a library mask
    if (a.mask) seq = a.mask->bind(rows.b, h, S_q, S_k);
    // One key block; needs_mask (library masks): whether its P needs the element mask (a partial
    // block or keys past S_k).
    auto block = [&](const Tile& n0, const Tile& needs_mask) {
      auto k = load(rows(a.K, kv_h, n0, a.BN)), v = load(rows(a.V, kv_h, n0, a.BN));
      Tile p;
      Tile mod_grad;  // SCORE_MOD with a derivative: d mod / d score
      const Tile e = a.log2_p_exponent(dot(q, trans(k)), lse, softmax_scale, rows, h, m0, n0, S_q, S_k, /*transposed=*/false, &mod_grad);
      if (seq) {
        Var pm = exp2(e);
        if_(needs_mask, [&] { pm = where(seq->allowed(m0 + arange(0, a.BM), n0 + arange(0, a.BN)), pm, 0.0f); });
        p = pm;
      } else {
        p = a.mask_partial(exp2(e), a.partial_tile(m0, n0, S_q, S_k), [&] { return a.visible(qrows, (n0 + arange(0, a.BN))[row], S_q, S_k); });
      }
      Tile dp = dot(dout, trans(v));  // dP (of the dropped P: times keep * s)
      if (a.dropout) dp = apply_keep_mask(dp * drop->scale, drop->keep_mask(bh, m0, a.BM, n0, a.BN));
      Tile ds = p * (dp - delta);  // dS = P * (dP - Delta)
      if (mod_grad.valid()) ds = ds * mod_grad;  // the gradient of the raw score
      dq = dot(cast(a.T, ds), k, dq);
    };
    if (seq) {
      // the key blocks this query block sees: the mask's intervals or the pre-pass's lists
      auto is_full = [&](const Tile& n0) { return seq->tile_is_full(m0, a.BM, n0, a.BN); };
      const MaskedTileWalk walk = a.lists ? list_walk(*a.lists, rows.b, h, m_block, a.BN)
                                          : interval_walk(seq->key_tiles(m0, a.BM, a.BN), a.BN, is_full);
      for_range(0, walk.count, [&](Tile j) {
        const MaskedTile t = walk.at(j);
        block(t.start, t.partial | (t.start + a.BN > S_k));
      });
    } else {
      // Causal: stop after the last key the block's last row sees (none for key-less blocks).
      Tile n_end = rows.unless_past(m0, S_q, a.causal ? minimum(S_k, m0 + a.BM + (S_k - S_q)) : S_k);
      for_range(0, n_end, a.BN, [&](Tile n0) { block(n0, Tile()); });
    }
    store(rows(dQ, h, m0, a.BM), cast(a.T, dq * softmax_scale));
  });
  return kern;
}

const Kernel& attention_backward_dq_convert() {
  static const Kernel kern = kernel("attention_bwd_dq_convert", [](Builder& kb) {
    auto T = kb.meta_dtype("DTYPE", bf16);
    const int64_t BM = kb.meta<int>("BLOCK_M", 64), D = kb.meta<int>("HEAD_DIM", 64);
    auto bshd = kb.meta<bool>("BSHD", false);
    auto accum = kb.tensor("dQ_accum", f32, 4, kRowMajor);
    auto dQ = kb.tensor("dQ", T, 4, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    auto m0 = program_id(0) * BM, h = program_id(1);
    HeadRows rows(program_id(2), D, bshd, /*varlen=*/false);
    store(rows(dQ, h, m0, BM), cast(T, load(accum.block({rows.b, h, m0, 0}, {BM, D})) * softmax_scale));
  });
  return kern;
}

const Kernel& attention_backward_dq_reduce() {
  static const Kernel kern = kernel("attention_bwd_dq_reduce", [](Builder& kb) {
    auto T = kb.meta_dtype("DTYPE", bf16);
    const int64_t BM = kb.meta<int>("BLOCK_M", 64), BN = kb.meta<int>("BLOCK_N", 64), D = kb.meta<int>("HEAD_DIM", 64);
    bool causal = kb.meta<bool>("CAUSAL", false);
    auto bshd = kb.meta<bool>("BSHD", false);
    const MaskKind kind = backward_mask_meta(kb, causal, /*varlen=*/false);
    causal = causal || kind == MaskKind::causal;
    auto parts = kb.tensor("dQ_parts", f32, 5, kRowMajor);
    auto dQ = kb.tensor("dQ", T, 4, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    auto S_k = kb.scalar<int>("S_k");
    std::optional<AttentionMask> mask;  // a library mask: its parameters, then (no tile intervals) the classes
    Tensor classes;
    if (kind != MaskKind::full && kind != MaskKind::causal) {
      mask.emplace(kb, kind);
      if (!mask->has_tile_intervals()) classes = kb.tensor("block_classes", u8, 4);
    }
    auto m_block = program_id(0), h = program_id(1);
    auto m0 = m_block * BM;
    HeadRows rows(program_id(2), D, bshd, /*varlen=*/false);
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
