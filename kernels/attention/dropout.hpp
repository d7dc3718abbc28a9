// Dropout in the attention kernels: the Philox key and keep threshold the kernels take, and the
// keep-mask of a block, fused (Philox in the kernel) or precomputed (the packed bits the
// dropout_mask kernel writes) -- the same bits either way (kernels/philox.hpp).
#pragma once
#include <cstdint>
#include <optional>

#include "dsl/lang.hpp"
#include "kernels/philox.hpp"

namespace tilejit::kernels {

// Dropout in the attention kernels (forward, dK/dV, dQ), and the one owner of "the keep-mask of a
// block" there: kernels ask it for a block's mask in the form they consume (i1, u32 per element,
// transposed, packed pairs, or prepared ahead) and never build one from Philox or mask words
// themselves. The constructor declares the Philox key (DropoutKey::declare: seed_lo, seed_hi,
// offset_lo, offset_hi, keep_threshold; call after the kernel's other parameters). The mask
// either comes from Philox in the kernel under `key` (rng = fused) or, once `bits` is set (meta
// DROPOUT_BITS: rng = precomputed), from the packed mask the dropout_mask kernel wrote: u32
// [batch * heads_q, seq_q, cdiv(seq_k, 32)], bit j % 32 of word j / 32 -- the same bits.
//
// Global coordinates: a call may be a piece of a larger attention (context parallelism: a rank's
// heads, query rows or key shard), whose keep-mask it must reproduce. After the key, the
// constructor declares the i32 scalars dropout_row_offset, dropout_col_offset, dropout_head_offset
// and dropout_heads: the call's query row i is row i + row_offset of the larger attention, key j is
// key j + col_offset (a multiple of 64, so whole Philox groups stay whole: the host checks), and
// head h of batch b is bh = b * heads + head_offset + h (heads 0: the call's own). Fused masks use
// them; a precomputed mask (`bits`) is the call's own, in its local coordinates.
struct AttentionDropout {
  DropoutKey key;    // the Philox key and keep threshold (kernels/philox.hpp)
  lang::Tile row_offset, col_offset, head_offset, heads;  // the global coordinates (i32 scalars)
  lang::Tile scale;  // f32 256 / keep_threshold: what kept probabilities are multiplied by
  // 1 / scale exactly (keep_threshold / 256, a multiplication: no division in the kernel). The
  // gradients fold `scale` out of their loops: dS = s P (Z dP - Delta / s), s applied once to the
  // sums (bf16 only: dS / s in f16 could underflow when s is large).
  lang::Tile inverse_scale() const;
  lang::Tensor bits;  // rng = precomputed: the packed keep-mask (invalid: fused)
  lang::Tensor bits_out;  // fused: where the drawn words are also stored (invalid: nowhere)

  explicit AttentionDropout(lang::Builder& kb);
  // The mask's batch*heads coordinate of head h of batch b in a call with `call_heads` query heads.
  lang::Tile batch_head(const lang::Tile& b, const lang::Tile& call_heads, const lang::Tile& h) const;
  // Declares the packed-mask parameter `dropout_bits` (rng = precomputed): u32 [B * Hq, S_q,
  // cdiv(S_k, 32)] with a unit last stride, or (any_strides) with any strides -- e.g. the API's
  // key-major words (strides [W * S_q, 1, S_q]: a block's words are whole runs of rows; decision 097).
  void declare_bits(lang::Builder& kb, bool any_strides = false);
  // Declares `dropout_bits_out` (u32, the layout of `bits`): keep_mask_transposed's fused words are
  // also stored there (dK/dV's DROPOUT_WRITE_BITS). Words of blocks the kernel skips stay unwritten,
  // and bits of keys >= S_k are unspecified: a reader masks both (they are past the causal
  // diagonal or the keys).
  void declare_bits_out(lang::Builder& kb, bool any_strides = false);
  // The keep-mask (i1 [num_rows, num_cols], true = keep) of query rows [row0, row0 + num_rows)
  // and key columns [col0, col0 + num_cols) of batch*heads index `batch_head`. Fused: one Philox
  // call per 16 elements when num_cols is a multiple of 64 (col0 a multiple of 64: a block
  // start), else one per element (the same bits). Precomputed: a [num_rows, num_cols / 32] word
  // load (num_cols a multiple of 32, col0 too); rows or words past the tensor read as dropped.
  lang::Tile keep(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0, int64_t num_cols) const;
  // The same mask as u32 0xFFFFFFFF (keep) / 0 (drop), for apply_keep_mask (kernels/philox.hpp):
  // zeroing dropped values with one AND per element. Fused: dropout_keep_mask_block.
  lang::Tile keep_mask(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0,
                       int64_t num_cols) const;
  // keep_mask transposed: u32 [num_cols, num_rows], for blocks whose rows are keys (dK/dV's S^T).
  // Fused with whole 64-column groups: the packed words (dropout_keep_words) where each thread owns
  // whole Philox calls, then a shared-memory exchange into the transposed layout.
  // `words_ahead`: the block's fused words, from keep_words_ahead (else computed here).
  lang::Tile keep_mask_transposed(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0,
                                  int64_t num_cols, const lang::Tile* words_ahead = nullptr) const;
  // Fused, whole 64-column groups: the block's packed words (keep_words) under `precompute`, for a
  // kernel that issues them where an MMA is in flight and passes them to keep_mask_transposed.
  lang::Tile keep_words_ahead(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0,
                              int64_t num_cols) const;
  // Fused: the packed words (u32 [rows, num_words], bit b of word w = column 32 (word0 + w) + b,
  // 1 = keep; num_words and word0 even) of query rows `rows` (i32 [M]) -- dropout_keep_words, what
  // the dropout_mask kernel writes: for warps that compute the mask for others (RNG_WARPS), whose
  // consumers then read it as precomputed words (Ahead::words).
  lang::Tile keep_words(const lang::Tile& batch_head, const lang::Tile& rows, const lang::Tile& word0, int64_t num_words) const;
  // keep_mask in two steps, for a kernel that prepares the mask's inputs where it has nothing else
  // to issue (e.g. right after issuing an MMA) and builds the mask at its use. Fused (whole 64-column
  // groups): the block's Philox calls (see DropoutKeepCalls); precomputed: the block's packed words,
  // read under `precompute` directly in the layout of their use. Otherwise nothing ahead, and
  // keep_mask_of is keep_mask.
  struct Ahead {
    std::optional<DropoutKeepCalls> calls;
    lang::Tile words;  // rng = precomputed: u32 [num_rows, num_cols / 32]
  };
  Ahead keep_ahead(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0, int64_t num_cols) const;
  lang::Tile keep_mask_of(const Ahead& ahead, const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows,
                          const lang::Tile& col0, int64_t num_cols) const;
  // The same mask for packed pairs of columns, u32 [num_rows, num_cols / 2] (half h of word j:
  // column 2 j + h, 0xFFFF keep / 0 drop), for apply_keep_pairs on the rounded 16-bit
  // probabilities: one prmt and one AND per two elements instead of per element. num_cols even.
  lang::Tile keep_pairs_of(const Ahead& ahead, const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows,
                           const lang::Tile& col0, int64_t num_cols) const;

 private:
  // rng = precomputed: the block's packed words, u32 [num_rows, num_cols / 32]; at_use: load_at_use
  // (in its use's layout), else a plain load (a layout of its own, pipelined)
  lang::Tile bits_words(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0,
                        int64_t num_cols, bool at_use = true) const;
  // The block's words in a packed mask laid out as `bits` (read) or `bits_out` (written)
  static lang::BlockRef words_block(const lang::Tensor& mask, const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows,
                                    const lang::Tile& col0, int64_t num_cols);
  // fused: the global rows row0 + [0, num_rows) and the global column of local column col0
  lang::Tile global_rows(const lang::Tile& row0, int64_t num_rows) const;
  lang::Tile global_col(const lang::Tile& col0) const;
};

// A packed keep-mask (u32 [num_rows, num_cols / 32], bit b of word w = column 32 w + b, 1 = keep)
// as u32 [num_rows, num_cols] 0xFFFFFFFF (keep) / 0 (drop), for apply_keep_mask: one shift per 4
// columns and one prmt per element.
lang::Tile expand_keep_words(const lang::Tile& words, int64_t num_rows, int64_t num_cols);
// The same as u32 [num_rows, num_cols / 2] pair masks (see AttentionDropout::keep_pairs_of): two
// shifts per 8 columns and one prmt per pair.
lang::Tile expand_keep_word_pairs(const lang::Tile& words, int64_t num_rows, int64_t num_cols);

}  // namespace tilejit::kernels
