// The pieces the attention backward kernels share (kernels/attention/backward.hpp documents the
// kernels): where a head's rows live (HeadRows, also VARLEN's per-sequence views), the leading
// parameters of the dK/dV and dQ kernels and the math both recompute (BackwardParams), and the
// walks over a library mask's tiles. Internal to the backward kernels: dkdv.cpp, dq.cpp,
// backward_small.cpp.
//
// The backward (FlashAttention-2, deterministic): Delta = rowsum(dO * O) first; then one program
// per key block accumulates dK and dV over the query heads of its group and the query blocks that
// see it, and one program per query block accumulates dQ over the key blocks it sees. Both
// recompute P = exp2(S * scale * log2 e - LSE * log2 e) from the forward's LSE.
// Dropout (DROPOUT) regenerates the forward's keep-mask from the same logical coordinates
// (AttentionDropout, kernels/attention/dropout.hpp): dV = sum (P * keep * s)^T dO, dP = (dO V^T) *
// keep * s, dS = P * (dP - Delta), s = 1 / keep probability; Delta = rowsum(dO * O) is unchanged (O
// includes the dropout).
// Library masks (MASK, kernels/attention/mask.hpp) other than full and causal visit only the
// non-empty blocks, in one flat loop per program, and mask only the partial ones (P = 0 there).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>

#include "dsl/lang.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/dropout.hpp"
#include "kernels/attention/mask.hpp"

namespace tilejit::kernels::backward_detail {

using lang::BlockRef;
using lang::Builder;
using lang::Operand;
using lang::Tensor;
using lang::Tile;
using lang::Var;

inline constexpr double kLog2e = 1.4426950408889634;  // exp(x) = exp2(x * log2 e)
inline const lang::ParamSpec kRowMajor{.align_bytes = 16, .contiguous_last = true};

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
  HeadRows(Tile batch, int64_t head_dim_, bool bshd_, bool varlen_, const Tile& cu_q = {}, const Tile& cu_k = {});

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
  BlockRef operator()(const Tensor& t, const Operand& hh, const Operand& s0, int64_t n) const;
  // The end of the loop of a program whose own block starts at `first` in a sequence of `len`:
  // with VARLEN (programs launched for the longest sequence) 0 once the block lies past the end.
  Tile unless_past(const Tile& first, const Tile& len, const Tile& end) const;
};

// A pointer to one element of a tensor at integer scalar coordinates.
Tile element_pointer(const Tensor& t, std::initializer_list<Tile> at);

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
// pipelined schedule sees a single stream of tiles to prefetch [039].
struct MaskedTileWalk {
  Tile count;
  std::function<MaskedTile(const Tile& j)> at;
};
// Interval kinds: the runs of TileRanges (two for global_sliding_window) laid end to end; `full`
// says whether the tile at a start is full (SequenceMask::tile_is_full).
MaskedTileWalk interval_walk(const TileRanges& r, int64_t block, std::function<Tile(const Tile& start)> full);
// Data-dependent kinds: the pre-pass's partial tiles of `outer`, then its full ones; an index is
// read only where it is valid (the other list's load reads its entry 0, in bounds, and is unused).
MaskedTileWalk list_walk(const BlockMaskLists& lists, const Tile& b, const Tile& h, const Tile& outer, int64_t block);

// The leading parameters (Q, K, V, dO, LSE, Delta) of the dK/dV and dQ kernels, the trailing ones
// (VARLEN's offsets, dropout, the mask, the score mod: declared by the kernel through sequence(),
// declare_mask() and declare_score_mod(), in that order), and what both kernels compute alike.
struct BackwardParams {
  // Declares Q, K, V, dO, LSE, Delta (the kernel has read its configuration: spec, tiles and
  // PARTIAL_TILES_ONLY).
  // row_vectors_aligned: LSE and Delta declared 16-byte aligned (base and every outer stride: S % 4
  // == 0), as TMA copies need (LSE_IN_RING); the launch checks it.
  BackwardParams(Builder& kb, const AttentionSpec& spec, int64_t block_m, int64_t block_n, bool partial_tiles_only,
                 bool row_vectors_aligned = false);

  ir::DType T;
  int64_t BM, BN, D;
  bool causal, bshd, varlen;  // causal: CAUSAL or MASK = causal
  MaskKind mask_kind;         // MASK: full / causal (folded into `causal`) or a library mask (library_mask())
  ScoreModKind score_mod_kind;  // SCORE_MOD
  bool dropout;               // DROPOUT: trailing seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold
  bool dropout_bits;          // DROPOUT_BITS: then the precomputed packed mask `dropout_bits` (rng = precomputed)
  bool partial_tiles_only;    // PARTIAL_TILES_ONLY (full / causal): the element mask on partial tiles only (mask_partial)
  // DROPOUT at bf16: the gradients fold the keep scale s out of their loops (dS / s = P (Z dP -
  // Delta / s); dQ, dK and a reduction's dQ parts times s once) [091]; f16 keeps s in the loops
  // (dS / s could underflow there).
  bool fold_dropout_scale() const { return dropout && T == ir::DType::bf16; }
  // The fold's three places (drop: the kernel's dropout, set when `dropout`): Delta as the loop uses
  // it (Delta / s when folded), dP dropped in the loop (times s unless folded) and the scale of the
  // gradients' sums (softmax_scale, times s when folded).
  lang::Tile loop_delta(const lang::Tile& delta, const std::optional<AttentionDropout>& drop) const {
    return fold_dropout_scale() ? delta * drop->inverse_scale() : delta;
  }
  lang::Tile loop_dp(const lang::Tile& dp, const AttentionDropout& drop) const { return fold_dropout_scale() ? dp : dp * drop.scale; }
  lang::Tile sum_scale(const lang::Tile& softmax_scale, const std::optional<AttentionDropout>& drop) const {
    return fold_dropout_scale() ? softmax_scale * drop->scale : softmax_scale;
  }
  int rank;                   // of Q, K, V, dO and the gradients (LSE, Delta: rank - 1)
  Tensor Q, K, V, dO, LSE, Delta;

  // A library mask: a kind other than full and causal (those run the CAUSAL code path).
  bool library_mask() const { return mask_kind != MaskKind::full && mask_kind != MaskKind::causal; }
  // Declares a library mask's parameters (after the dropout ones: call after sequence()) and, for
  // a kind without tile intervals, the pre-pass's lists (kv_major: per key tile, for dK/dV).
  void declare_mask(Builder& kb, bool kv_major);
  std::optional<AttentionMask> mask;
  std::optional<BlockMaskLists> lists;
  // Declares the score mod's parameter (last: call after declare_mask).
  void declare_score_mod(Builder& kb);
  std::optional<AttentionScoreMod> smod;
  // The exponent of P = exp2(.) for the block, from the raw dot q . k ([BM, BN], or transposed
  // [BN, BM] for dK/dV) and the rows' LSE in log2 units (broadcast): raw * scale * log2 e - lse as
  // one fma, or with a score mod mod(raw * scale) * log2 e - lse; `derivative` gets d mod / d score
  // where the mod has one (soft-capping; invalid otherwise: a factor of 1).
  Tile log2_p_exponent(const Tile& raw, const Tile& lse_log2, const Tile& softmax_scale, const HeadRows& rows, const Tile& h,
                       const Tile& m0, const Tile& n0, const Tile& S_q, const Tile& S_k, bool transposed, Tile* derivative) const;

  // The rows of batch b (declares the trailing VARLEN parameters cu_seqlens_q, cu_seqlens_k, then
  // with DROPOUT the dropout scalars (and DROPOUT_BITS' mask) into `drop`: call it after the
  // kernel's own parameters); Q, K, V, dO, LSE, Delta become sequence b's views.
  // (bits_any_strides: `dropout_bits` declared with any strides -- dQ's DROPOUT_WORDS_KEY_MAJOR)
  HeadRows sequence(Builder& kb, Tile b, std::optional<AttentionDropout>& drop, bool bits_any_strides = false);
  // The dropout mask's batch*heads index of query head h: b * heads_q + h (b: the sequence).
  Tile batch_head(const HeadRows& rows, const Tile& h) const;
  // Query heads per key/value head (grouped-query attention).
  Tile group(const HeadRows& rows) const;
  // The LSE of rows [m0, m0 + BM) of head h in log2 units, +inf for a row that sees no key
  // (LSE = -inf) or lies past the end: its P = exp2(s - inf) = 0, never exp2(-inf - -inf) = NaN.
  Tile lse_log2_of(const Tile& lse) const;
  // LSE (natural log, as stored; +inf past S_q) and Delta of the query block at m0, as loaded.
  // in_ring: read where used (load_at_use), zero past S_q: inside a loop with a TMA ring, copied into
  // the ring's stage and read from shared memory (LSE_IN_RING). Zero LSE rows past S_q give P = 1
  // there, against zero Q and dO rows: no contribution, as with +inf.
  RowVectors row_vectors(const HeadRows& rows, const Tile& h, const Tile& m0, bool in_ring = false) const;
  // Which (query row, key) pairs count: keys inside the sequence and, when causal, the forward's
  // bottom-right alignment (row i sees keys j <= i + S_k - S_q). Arguments broadcast to the block.
  Tile visible(const Tile& qrows, const Tile& keys, const Tile& S_q, const Tile& S_k) const;
  // Whether the tile of query block m0 and key block n0 needs visible() element by element: keys
  // past S_k, or (causal) a key after some row's diagonal. Every other tile runs without the
  // per-element compare and select (a uniform branch, as in the forward). Rows past S_q need no
  // mask: their LSE is +inf, so P = 0 there.
  Tile partial_tile(const Tile& m0, const Tile& n0, const Tile& S_q, const Tile& S_k) const;
  // P (or P^T) zeroed where `allowed()` is false: on partial tiles only (PARTIAL_TILES_ONLY, the
  // default [020]), or on every tile (the A/B baseline: `attention_bench --meta-ab
  // PARTIAL_TILES_ONLY`), and on every tile with a score mod (the branch costs the registers the
  // mod's terms need [020]). Call after declare_score_mod.
  Tile mask_partial(const Tile& p, const Tile& partial, const std::function<Tile()>& allowed) const;
};

}  // namespace tilejit::kernels::backward_detail
