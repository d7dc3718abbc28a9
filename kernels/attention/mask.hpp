// Attention masks and score modifications as DSL library functions (issue 8 part 1): FlexAttention's
// mask_mod / score_mod over tiles, the library masks (every pattern of kernels/attention/mask_host.hpp,
// which defines them and is their bit-exact host twin), tile-level block skipping for interval
// masks, and the block-mask pre-pass kernels (attention_block_classes, attention_block_lists) that classify blocks of any mask.
//
// How an attention kernel uses a library mask (forward; names are this header's):
//
//   auto kind = mask_kind_meta(kb);                  // meta MASK (an int, MaskKind), compile-time
//   ... declare the kernel's own parameters ...
//   AttentionMask mask(kb, kind);                    // declares the mask's runtime parameters, in
//                                                    // mask_parameter_names(kind) order
//   SequenceMask seq = mask.bind(b, h, S_q, S_k);    // per (batch, head); per sequence with VARLEN
//   if (mask.has_tile_intervals()) {                 // full, causal, windows, global, prefix_lm
//     seq.key_tiles(m0, BM, BN).for_each(BN, [&](Tile n0) {   // only the non-empty key tiles
//       s = dot(...);
//       if_((!seq.tile_is_full(m0, BM, n0, BN)) | (n0 + BN > S_k), [&] {   // partial or ragged
//         s = where(seq.allowed(rows, n0 + arange(0, BN)) & (cols < S_k)[row], s, -INFINITY);
//       });
//       ... online softmax ...
//     });
//   } else {                                          // data-dependent: read the pre-pass's lists
//     BlockMaskLists lists(kb);                       // (declared with the other parameters)
//     for_range(0, lists.partial_count(b, h, m_block), [&](Tile j) { n0 = lists.partial_block(...) * BN; masked });
//     for_range(0, lists.full_count(b, h, m_block), [&](Tile j) { n0 = lists.full_block(...) * BN; unmasked });
//   }
//
// The backward's dK/dV kernel walks query tiles for one key tile: seq.query_tiles(n0, BN, BM) and the
// same tile_is_full, or the pre-pass's KV_MAJOR lists (per key tile, the query tiles).
#pragma once
#include <array>
#include <functional>
#include <optional>
#include <string>

#include "dsl/lang.hpp"
#include "kernels/attention/mask_host.hpp"

namespace tilejit::kernels {

// What a mask_mod or score_mod sees: FlexAttention's (b, h, q_idx, kv_idx) as tiles that broadcast
// to the score tile [M, N].
struct MaskIndices {
  lang::Tile b, h;      // i32 scalars: batch (VARLEN: the sequence), query head
  lang::Tile q;         // i32 [M, 1]: query rows, 0-based in [0, S_q) (a ragged tile runs past S_q)
  lang::Tile kv;        // i32 [1, N]: keys, 0-based in [0, S_k) (likewise)
  lang::Tile s_q, s_k;  // i32 scalars: the sequence lengths
  // The query rows' key positions q + (S_k - S_q), i32 [M, 1] (bottom-right alignment; see the host header).
  lang::Tile position() const;
  lang::Shape shape() const { return {q.shape()[0], kv.shape()[1]}; }
};
// rows i32 [M] and cols i32 [N] as the [M, 1] / [1, N] index tiles.
MaskIndices mask_indices(const lang::Tile& b, const lang::Tile& h, const lang::Tile& rows, const lang::Tile& cols, const lang::Tile& s_q,
                         const lang::Tile& s_k, lang::Loc loc = lang::Loc::current());

// A mask: i1 (true = attend) of a shape that broadcasts to [M, N]. Values for rows >= S_q or keys
// >= S_k are unspecified (kernels mask bounds themselves); a mask_mod may not read memory out of
// bounds there (mask its loads). User masks close over their own parameters (declared on the Builder).
using MaskMod = std::function<lang::Tile(const MaskIndices&)>;
MaskMod mask_and(MaskMod a, MaskMod b);  // FlexAttention's and_masks / or_masks
MaskMod mask_or(MaskMod a, MaskMod b);
// The mask's value as i1 [M, N] exactly (broadcast).
lang::Tile evaluate_mask(const MaskMod& mask, const MaskIndices& idx, lang::Loc loc = lang::Loc::current());

// A score modification: f32 score [M, N] (natural-log units, q . k * softmax_scale, before the
// softmax) -> f32 [M, N]. `derivative` is d apply / d score at `score`, elementwise, for the
// backward (dS_before = dS_after * derivative); empty means 1 (a score-independent bias).
struct ScoreMod {
  std::function<lang::Tile(const lang::Tile& score, const MaskIndices&)> apply;
  std::function<lang::Tile(const lang::Tile& score, const MaskIndices&)> derivative;
  lang::Tile operator()(const lang::Tile& score, const MaskIndices& idx) const { return apply(score, idx); }
  lang::Tile gradient(const lang::Tile& score, const MaskIndices& idx, lang::Loc loc = lang::Loc::current()) const;  // f32 [M, N]
};
// ALiBi: score + slopes[h] * (kv - position), slopes an f32 [H] tensor (alibi_score_host).
ScoreMod alibi_score_mod(const lang::Tensor& slopes);
// cap * tanh(score / cap), derivative 1 - tanh^2 (softcap_score_host); cap an f32 scalar.
ScoreMod softcap_score_mod(const lang::Tile& cap);

// The compile-time meta-parameters that pick a library mask / score mod (ints: MaskKind,
// ScoreModKind); an out-of-range value is a BuildError listing the valid ones.
MaskKind mask_kind_meta(lang::Builder& kb, const std::string& name = "MASK", MaskKind def = MaskKind::full,
                        lang::Loc loc = lang::Loc::current());
ScoreModKind score_mod_kind_meta(lang::Builder& kb, const std::string& name = "SCORE_MOD", ScoreModKind def = ScoreModKind::none,
                                 lang::Loc loc = lang::Loc::current());

// Up to two runs of tile starts, in increasing order and disjoint: run r visits t = begin[r],
// begin[r] + block, ... while t < end[r] (begin a multiple of the block size; end an exclusive
// bound, not rounded; a run with begin >= end is empty). `runs` is known when the kernel is built.
struct TileRanges {
  std::array<lang::Tile, 2> begin, end;
  int runs = 1;
  // for_range over each run in turn (Vars carried across both runs).
  void for_each(int64_t block, const std::function<void(lang::Tile)>& body, lang::Loc loc = lang::Loc::current()) const;
};

class SequenceMask;

// A library mask in a kernel: constructing it declares the runtime parameters of `kind` on the
// Builder, in mask_parameter_names(kind) order (construct it after the kernel's other parameters,
// like AttentionDropout): i32 scalars mask_window_left / mask_window_right / mask_global_tokens /
// mask_block_q / mask_block_k, tensors mask_doc_ids (i32 [B or 1, S_k]), mask_prefix_lengths
// (i32 [B]), mask_block_table (u8 [B or 1, H or 1, nQB, nKB]). Argument values are not checked in
// the kernel: the host calls check_mask first.
class AttentionMask {
 public:
  AttentionMask(lang::Builder& kb, MaskKind kind, lang::Loc loc = lang::Loc::current());
  MaskKind kind() const { return kind_; }
  // Whether key_tiles / query_tiles / tile_is_full exist for this kind (mask_has_tile_intervals);
  // the others need the block-mask pre-pass (attention_block_classes, attention_block_lists).
  bool has_tile_intervals() const { return mask_has_tile_intervals(kind_); }
  // The mask of batch b, query head h and sequence lengths s_q, s_k (i32 scalars); loads the
  // per-batch scalars the kind needs (prefix length, the question's or the last segment's id) here.
  SequenceMask bind(const lang::Tile& b, const lang::Tile& h, const lang::Tile& s_q, const lang::Tile& s_k,
                    lang::Loc loc = lang::Loc::current()) const;
  // The same mask as a MaskMod (binds per call; for generic code such as the pre-pass).
  MaskMod mask_mod() const;
  // The program order of a (tiles, heads, ...) grid of `block`-sized tiles: (tile, head) as given,
  // except for kinds whose first tiles carry far more work (global tokens: their query blocks see
  // every key, their key blocks are seen by every query). There the first heads * heavy programs
  // take every head's heavy tiles (heads fastest), the others the remaining tiles head by head
  // (keeping a head's K/V hot in L2): in plain launch order the last head's heavy tiles would start
  // last and finish long after the rest.
  std::pair<lang::Tile, lang::Tile> program_order(int64_t block, const lang::Tile& tile, const lang::Tile& head,
                                                  lang::Loc loc = lang::Loc::current()) const;

  // The declared parameters (those `kind` does not use are invalid Tiles / Tensors).
  lang::Tile window_left, window_right, global_tokens, block_q, block_k;
  lang::Tensor doc_ids, prefix_lengths, block_table;

 private:
  MaskKind kind_;
};

// A cheap, conservative classification of one (query tile, key tile): `empty` (i1 scalar) implies
// no in-bounds element is allowed, `full` that every one is; neither: evaluate the elements.
struct TileVerdict {
  lang::Tile empty, full;
};

// One (batch, head, sequence) of a library mask: element masks and tile-level block skipping.
class SequenceMask {
 public:
  // i1 [M, N] for query rows `rows` (i32 [M]) and keys `cols` (i32 [N]): mask_allowed, bit for bit
  // on in-bounds elements (false on out-of-bounds ones).
  lang::Tile allowed(const lang::Tile& rows, const lang::Tile& cols, lang::Loc loc = lang::Loc::current()) const;
  lang::Tile allowed(const MaskIndices& idx, lang::Loc loc = lang::Loc::current()) const;
  MaskIndices indices(const lang::Tile& rows, const lang::Tile& cols, lang::Loc loc = lang::Loc::current()) const;

  // Interval kinds only (a BuildError otherwise), scalar arithmetic only, no per-element work:
  // key_tiles: the key tiles (starts n0, multiples of block_n) the query tile [m0, m0 + block_m)
  // needs: exactly its non-empty tiles (two runs for global_sliding_window: the global keys, then
  // the window). Empty when the tile has no row below S_q.
  TileRanges key_tiles(const lang::Tile& m0, int64_t block_m, int64_t block_n, lang::Loc loc = lang::Loc::current()) const;
  // query_tiles: the transpose, for the backward's dK/dV: the query tiles (starts m0, multiples of
  // block_m) with an allowed element in the key tile [n0, n0 + block_n). Exactly the non-empty ones.
  TileRanges query_tiles(const lang::Tile& n0, int64_t block_n, int64_t block_m, lang::Loc loc = lang::Loc::current()) const;
  // i1 scalar: every in-bounds element of tile (m0, n0) is allowed (BlockClass::full), for a tile
  // with at least one row < S_q and one key < S_k. A full tile crossing S_k still needs the bounds mask.
  lang::Tile tile_is_full(const lang::Tile& m0, int64_t block_m, const lang::Tile& n0, int64_t block_n,
                          lang::Loc loc = lang::Loc::current()) const;
  // Segment kinds (document, causal_document, share_question, causal_blockwise): what the ranges of
  // the tile's ids tell at the cost of BLOCK_M + BLOCK_N loads (TileVerdict), so that the pre-pass
  // evaluates the mask per element only where they do not decide; nothing for the other kinds.
  std::optional<TileVerdict> tile_verdict(const lang::Tile& m0, int64_t block_m, const lang::Tile& n0, int64_t block_n,
                                          lang::Loc loc = lang::Loc::current()) const;

  lang::Tile b, h, s_q, s_k;

 private:
  friend class AttentionMask;
  struct Element;  // what mask_patterns' predicates read (mask.cpp)
  explicit SequenceMask(const AttentionMask& mask) : mask_(mask) {}
  lang::Tile doc_at(const lang::Tile& tokens, lang::Loc loc) const;  // doc ids of key positions (i32; -1 outside [0, S_k))
  void require_intervals(const char* what, lang::Loc loc) const;
  AttentionMask mask_;
  lang::Tile prefix, question_doc, last_doc;  // per-batch scalars some kinds load in bind()
};

// A library score mod in a kernel: declares its parameter (score_mod_parameter_names order).
struct AttentionScoreMod {
  AttentionScoreMod(lang::Builder& kb, ScoreModKind kind, lang::Loc loc = lang::Loc::current());
  ScoreModKind kind;
  ScoreMod mod;  // empty apply for ScoreModKind::none
  lang::Tensor alibi_slopes;
  lang::Tile softcap;
};

// ---- the block-classification pre-pass (FlexAttention's create_block_mask, in the DSL) ----
//
// Two kernels. attention_block_classes (block_classes_kernel for a mask of one's own) classifies
// every (query tile, key tile) by evaluating the mask over the [BLOCK_M, BLOCK_N] tile (in-bounds
// elements only: BlockClass) and writes block_classes[b, h, qb, kb]; one program per TILES (meta,
// default 1) key tiles, grid (nQB, cdiv(nKB, TILES), Bm * Hm). attention_block_lists then turns one row (KV_MAJOR: one column) of classes
// into FlexAttention's lists: the partial inner tiles in increasing order at indices[b, h, outer,
// 0..count), the full ones likewise; entries past the counts are not written. One program per
// outer tile, grid (nOuter, Hm, Bm), 64 classes at a time (a prefix sum as a [64, 64] compare and
// reduce, then a scattered store). The classes do not depend on the order, so the dK/dV (KV_MAJOR)
// and dQ lists at the same tiles share one classification. (Two kernels, not one that walks each
// row's tiles in sequence: that one ran too few programs [039].)
//
// Parameters: classes kernel -- block_classes u8 [Bm, Hm, nQB, nKB], S_q, S_k (i32), then the
// mask's own parameters; metas BLOCK_M, BLOCK_N (the attention kernel's tiles; nQB = cdiv(S_q,
// BLOCK_M), nKB = cdiv(S_k, BLOCK_N)), TILES and, for the library kernel, MASK
// (kernels::BlockClassesConfig). Lists kernel --
// block_classes, then the partial count i32 [Bm, Hm, nOuter] and indices i32 [Bm, Hm, nOuter,
// nInner] and the full count and indices likewise; meta KV_MAJOR (false: outer = query tiles,
// inner = key tiles, lists named kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
// true: outer = key tiles, named q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, for
// dK/dV; kernels::BlockListsConfig). Bm, Hm: the mask's batch and head extents (1 when it does not depend on them: a
// document mask with a [1, S_k] id tensor has Bm = 1; only block_sparse tables with H > 1 need
// Hm = H).
// Schedule of the classes kernel: 8 warps at 128 x 128 tiles (4 spill there), 4 below [039].
lang::Kernel block_classes_kernel(std::string name, std::function<MaskMod(lang::Builder&)> declare_mask);
// The same with a quick classifier: where it returns a verdict that decides a tile (empty or
// full), the tile is classified without evaluating its elements (the library's document masks:
// SequenceMask::tile_verdict). Arguments: b, h, S_q, S_k, m0, BLOCK_M, n0, BLOCK_N.
using TileVerdictFn = std::function<std::optional<TileVerdict>(const lang::Tile&, const lang::Tile&, const lang::Tile&, const lang::Tile&,
                                                               const lang::Tile&, int64_t, const lang::Tile&, int64_t)>;
struct BlockClassifier {
  MaskMod mask;
  TileVerdictFn verdict;  // may be empty
};
lang::Kernel block_classes_kernel(std::string name, std::function<BlockClassifier(lang::Builder&)> declare);
// TILES of the library's classification (the API's, the registry's default): a few key tiles per
// program beat one; the work is the per-element mask, so more gains little [039].
inline constexpr int64_t kBlockClassTiles = 4;
// The library masks' classification: meta MASK picks the kind (AttentionMask declares its parameters).
const lang::Kernel& attention_block_classes();
// The lists from the classes (any mask).
const lang::Kernel& attention_block_lists();

// What an attention kernel declares to read the pre-pass's lists (parameter names as above), and
// reads per (b, h, outer tile). A list tensor whose batch or head extent is 1 broadcasts.
struct BlockMaskLists {
  BlockMaskLists(lang::Builder& kb, bool kv_major = false, lang::Loc loc = lang::Loc::current());
  lang::Tile partial_count(const lang::Tile& b, const lang::Tile& h, const lang::Tile& tile, lang::Loc loc = lang::Loc::current()) const;
  lang::Tile partial_block(const lang::Tile& b, const lang::Tile& h, const lang::Tile& tile, const lang::Tile& j,
                           lang::Loc loc = lang::Loc::current()) const;  // the j-th partial inner tile index (i32)
  lang::Tile full_count(const lang::Tile& b, const lang::Tile& h, const lang::Tile& tile, lang::Loc loc = lang::Loc::current()) const;
  lang::Tile full_block(const lang::Tile& b, const lang::Tile& h, const lang::Tile& tile, const lang::Tile& j,
                        lang::Loc loc = lang::Loc::current()) const;
  lang::Tensor num, indices, full_num, full_indices;
};

}  // namespace tilejit::kernels
