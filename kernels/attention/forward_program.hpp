// The pieces of attention_fwd, shared by forward.cpp (the algorithm), forward_schedules.cpp (how
// its key-block loop is arranged) and forward_experimental.cpp (arrangements that measured slower).
// Internal to the forward kernel.
#pragma once
#include <functional>
#include <optional>
#include <utility>

#include "dsl/lang.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/dropout.hpp"
#include "kernels/attention/mask.hpp"

namespace tilejit::kernels::forward_detail {

using lang::Tensor;
using lang::Tile;
using lang::Var;

// One program: the configuration, the kernel's parameters and the program's place (one tile, or
// with PERSISTENT each of its tiles in turn), rows [m0, m0 + BLOCK_M) of query head h in batch (or
// sequence) b.
struct ForwardProgram {
  explicit ForwardProgram(lang::Builder& kb);

  const ForwardConfig cfg;
  const lang::DotOptions dots{.descriptors_at_use = *cfg.descriptors_at_use};  // every dot's [077]
  const int64_t BM, BN, D;
  const bool causal, varlen, general_mask;  // general_mask: a library mask (cfg.spec.library_mask())
  const int rank;                           // of Q, K, V, O (LSE: rank - 1)
  const int seq_dim, head_dim;              // dims of Q, K, V, O

  // the parameters, in the kernel's order
  Tensor Q, K, V, O, LSE;
  Tile softmax_scale;
  Tile cu_q, cu_k;                         // VARLEN: i32[batch + 1] sequence offsets
  std::optional<AttentionDropout> drop;    // DROPOUT: the Philox key and keep threshold
  Tensor mask_out;                         // RETURN_MASK: u8 [batch * heads_q, seq_q, seq_k]
  std::optional<AttentionMask> amask;      // a library mask's parameters
  std::optional<BlockMaskLists> lists;     // its pre-pass lists (masks without tile intervals)
  std::optional<AttentionScoreMod> score_mod;
  Tile timeline;                           // TIMELINE: u64 [tiles, kTimelineStamps, 32]

  // PERSISTENT: runs `attend` for each of the program's tiles, place() set to it.
  void for_each_tile(const std::function<void()>& attend);
  // PERSISTENT: how many tiles this program takes (the walk of for_each_tile), and place() at the i-th
  // of them; `is_tile` false places it at no tile (OVERLAP_TILES' ends: query block num_m, whose
  // rows past S_q are neither read nor written, and no key blocks).
  Tile tile_count() const;
  void place_tile(const Tile& i, const Tile& is_tile);
  // Not PERSISTENT: place() at the program's grid slot (heavy tiles first where causal).
  void place_from_grid();
  // Sets the program's place (and what follows from it) to query block `query_block` of head
  // `head` in batch (or sequence) `batch`.
  void place(const Tile& query_block, const Tile& head, const Tile& batch);
  // Causal PERSISTENT: place() at position i of the program's walk in pairs (for_each_tile).
  void place_causal_position(const Tile& i, const Tile& num_m, const Tile& heads, const Tile& P, const Tile& q,
                             const std::optional<Tile>& is_tile = std::nullopt);

  // the program's place
  Tile m_block, h, b, m0;
  Tensor Qs, Ks, Vs, Os, LSEs;  // sequence b's views (VARLEN), else the tensors
  Tile S_q, S_k;
  Tile kv_h;      // the key/value head of query head h (grouped-query attention)
  Tile qk_scale;  // softmax_scale * log2 e (POSITIVE_SCALE: NaN for a scale <= 0)
  Tile diag;      // S_k - S_q: causal row i sees keys j <= i + diag (bottom-right aligned)
  Tile bh;        // DROPOUT: the mask's batch*heads coordinate (global: AttentionDropout::batch_head)
  Tile local_bh;  // RETURN_MASK: the returned mask's batch*heads index (this call's)
  Tile n_end;     // the keys the program reads: [0, n_end)
  Tile real;      // OVERLAP_TILES: whether the place is a tile (place_tile)

  // Rows [s0, s0 + n) of head hh of `t` (LSE: a vector of n).
  lang::BlockRef rows_of(const Tensor& t, const Tile& hh, const lang::Operand& s0, int64_t n) const;
  // TIMELINE: each warp's cycle counter into stamp `index` of this tile (clamped to the last);
  // 0 the tile's start, 1 after block 0's softmax (PV_PEEL), 2 + 5 j + {0 top, 1 MMAs issued,
  // 2 S landed (its row max taken), 3 softmax done, 4 rescaled} for key block j, the last one the
  // tile's end.
  void stamp(const Tile& index) const;
  void stamp(int64_t index) const { if (cfg.timeline) stamp(lang::scalar_constant(lang::i32, index)); }
};

// The key blocks a program visits as one flat loop j = 0 .. trips - 1 (one loop, so that the K/V
// ring prefetches across all of them): at(j) = (n0, partial), where partial says whether the
// block needs the element mask (it crosses the last key, the diagonal or the mask's edge).
struct KeyBlocks {
  Tile trips;
  std::function<std::pair<Tile, Tile>(const Tile&)> at;
};

// The online softmax of the program's rows (FlashAttention): the output accumulator, the running
// row max m and row sum l, and the steps of one key block.
struct ForwardTile {
  ForwardTile(ForwardProgram& p, const lang::Channel* keep_words);

  ForwardProgram& p;
  const lang::Channel* keep_words;  // RNG_WARPS: the keep-mask words from the RNG role
  Tile rows, q;
  Var acc;  // f32 [BLOCK_M, HEAD_DIM]
  Var m;    // running row max (log2 units; POSITIVE_SCALE: raw q . k units)
  Var l;    // running row sum of exp2
  std::optional<Tile> row_max_stamp;  // TIMELINE: the stamp softmax_block takes once S has landed
  std::optional<SequenceMask> seq;  // a library mask bound to (b, h)

  // S = Q K^T of the key block at n0 (unscaled).
  Tile scores(const Tile& n0) const;
  // The block's masking (on partial blocks) and the online softmax update of m and l. Returns P
  // (of dtype T, dropped elements zeroed) and the output's rescale factor alpha.
  std::pair<Tile, Tile> softmax_block(const Tile& n0, const Tile& partial, const Tile& s_raw, const AttentionDropout::Ahead& ahead);
  // The block's dropout mask inputs, issued early (DROPOUT_AHEAD, RNG_WARPS) or nothing.
  AttentionDropout::Ahead mask_ahead(const Tile& n0, const Tile& j) const;
  // A whole key block from its scores: softmax, then O = O * alpha + P V.
  void key_block(const Tile& n0, const Tile& partial, const Tile& s_raw, const AttentionDropout::Ahead& ahead);
  // Issues MMAs: in the warpgroups' turn with PINGPONG (lang::warpgroup_turn), else directly.
  void in_turn(const std::function<void()>& issue) const;
  // The blocks this program visits.
  KeyBlocks key_blocks();
  // O = acc / l and LSE = m + log l (natural log), stored.
  void finish();
};

// ForwardTile::finish for the rows at p's place from their accumulator, row max and row sum.
void finish_tile(const ForwardProgram& p, const Tile& acc, const Tile& m, const Tile& l);

// The key-block loop, by schedule (forward_schedules.cpp): the plain loop, or with PIPELINE_QK the
// next block's S issued before this block's softmax.
void key_block_loop(ForwardTile& t, const KeyBlocks& blocks);
// PIPELINE_PV (forward_schedules.cpp; the default with the ring producer): P_{j-1} V_{j-1} in flight
// during softmax_j.
void key_block_loop_pipeline_pv(ForwardTile& t, const KeyBlocks& blocks);
// PIPELINE_PV's loop over key blocks first .. trips - 1 (forward_schedules.cpp): iteration j issues
// S_j (with PIPELINE_QK: S_{j+1}; s_cur carries it) and P_{j-1} V_{j-1}, then runs block j's softmax.
// p_prev carries P_{j-1} and ends as the last block's P (its P V is the caller's).
void pipelined_pv_blocks(ForwardTile& t, const KeyBlocks& blocks, int first, Var& p_prev, Var& s_cur);
// OVERLAP_TILES (forward_experimental.cpp, measured slower [079]): the PERSISTENT walk with
// PIPELINE_PV and PV_PEEL, each tile's block 0 beside the previous tile's last P V and that tile's O
// stored after it.
void overlapped_tiles(ForwardProgram& p);
// RNG_WARPS (forward_experimental.cpp, measured slower): the MMA role `mma` beside warps that run
// the keep-mask's Philox calls and pass the words through `keep_words`.
void with_rng_warps(ForwardProgram& p, const lang::Channel& keep_words, const std::function<void()>& mma);

}  // namespace tilejit::kernels::forward_detail
