// FlashAttention forward in the DSL (online softmax, exp2 with pre-scaled logits): the flagship
// kernel. Issue #6 widens it (layouts, GQA, varlen, backward); this is the first slice.
#pragma once
#include <optional>

#include "dsl/lang.hpp"
#include "kernels/philox.hpp"

namespace tilejit::kernels {

// Q, O: [batch, heads_q, seq_q, head_dim]; K, V: [batch, heads_kv, seq_k, head_dim] (or all
// [batch, seq, heads, head_dim] with BSHD); heads_q a multiple of heads_kv (grouped-query and
// multi-query attention); LSE: [batch, heads_q, seq_q] (natural log; -inf for a row that sees no
// key); softmax_scale: f32. Causal masks align the last query with the last key.
// Meta: DTYPE (bf16|f16), BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, DROPOUT, RETURN_MASK,
// DROPOUT_BITS.
// Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
//
// VARLEN (flash_attn_varlen_func's layout): Q, O: [total_q, heads_q, head_dim]; K, V: [total_k,
// heads_kv, head_dim]; LSE: [heads_q, total_q]; two more parameters after softmax_scale,
// cu_seqlens_q and cu_seqlens_k: i32 pointers to batch + 1 cumulative offsets (0, len_0,
// len_0 + len_1, ...); sequence b is tokens [cu[b], cu[b + 1]). Each sequence is attended as in
// the dense kernel (its own S_q, S_k, causal alignment; length 0 allowed). Grid:
// (cdiv(max_seqlen_q, BLOCK_M), heads_q, batch); blocks past their sequence's end do nothing.
// Tokens outside [cu[0], cu[batch]) are neither read nor written.
//
// DROPOUT (issue 7; FlashAttention's convention): O = dropout(softmax(S)) V, LSE that of the
// undropped softmax(S). Five more scalar parameters after all the others (dense: after
// softmax_scale; VARLEN: after cu_seqlens_k): seed_lo, seed_hi, offset_lo, offset_hi (u32 halves
// of the 64-bit Philox seed and offset) and keep_threshold (u32, kernels::dropout_keep_threshold(p)
// = round((1 - p) * 256)). Element (row i, key j) of query head h in batch b is kept iff
// kernels::dropout_keep(bh = b * heads_q + h, i, j) (kernels/philox.hpp: logical coordinates, so
// the mask is the same under any tile sizes, schedule or pass; VARLEN: b is the sequence, i and j
// positions inside it); kept probabilities are scaled by 256 / keep_threshold (the inverse of the
// effective keep probability keep_threshold / 256). One Philox call per 16 elements.
// RETURN_MASK (tests; needs DROPOUT): one more parameter, dropout_mask: u8 [batch * heads_q,
// seq_q, seq_k] (VARLEN: [batch * heads_q, max_seqlen_q, max_seqlen_k]), unit innermost stride;
// every block the forward visits writes its keep bits (1 = kept), including elements that are
// masked (causal, past the last key); blocks a causal program skips are not written.
// DROPOUT_BITS (needs DROPOUT, dense only, BLOCK_N a multiple of 32): rng = precomputed -- one
// more parameter last, dropout_bits: u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)], bit j % 32 of
// word j / 32 (the dropout_mask kernel's output for the same seed/offset/threshold); the forward
// reads it instead of running Philox. The same bits, so outputs are identical to the fused ones.
// HEAVY_FIRST_SECTIONS (default true; dense causal only): the programs take their query tiles
// heaviest (last) first across heads, in L2-sized sections of heads (kernels/attention/program_order.hpp);
// false: heaviest first within each head only. Same grid, same values.
const lang::Kernel& attention_forward();

// The dropout parameters of the attention kernels (forward, dK/dV, dQ): declares seed_lo,
// seed_hi, offset_lo, offset_hi, keep_threshold (call after the kernel's other parameters).
// The keep-mask either comes from Philox in the kernel (rng = fused) or, once `bits` is set
// (meta DROPOUT_BITS: rng = precomputed), from the packed mask the dropout_mask kernel wrote:
// u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)], bit j % 32 of word j / 32 -- the same bits.
struct AttentionDropout {
  lang::Tile seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold;
  lang::Tile scale;  // f32 256 / keep_threshold: what kept probabilities are multiplied by
  lang::Tensor bits;  // rng = precomputed: the packed keep-mask (invalid: fused)

  explicit AttentionDropout(lang::Builder& kb);
  // The meta that picks the RNG (DROPOUT_BITS), checked against the kernel's other metas.
  static bool precomputed_meta(lang::Builder& kb, bool dropout, bool varlen, int64_t block_n);
  // Declares the packed-mask parameter `dropout_bits` (rng = precomputed).
  void declare_bits(lang::Builder& kb);
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
  lang::Tile keep_mask_transposed(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0,
                                  int64_t num_cols) const;
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
  // rng = precomputed: the block's packed words, u32 [num_rows, num_cols / 32] (load_at_use)
  lang::Tile bits_words(const lang::Tile& batch_head, const lang::Tile& row0, int64_t num_rows, const lang::Tile& col0,
                        int64_t num_cols) const;
};

// A packed keep-mask (u32 [num_rows, num_cols / 32], bit b of word w = column 32 w + b, 1 = keep)
// as u32 [num_rows, num_cols] 0xFFFFFFFF (keep) / 0 (drop), for apply_keep_mask: one shift per 4
// columns and one prmt per element.
lang::Tile expand_keep_words(const lang::Tile& words, int64_t num_rows, int64_t num_cols);
// The same as u32 [num_rows, num_cols / 2] pair masks (see AttentionDropout::keep_pairs_of): two
// shifts per 8 columns and one prmt per pair.
lang::Tile expand_keep_word_pairs(const lang::Tile& words, int64_t num_rows, int64_t num_cols);

}  // namespace tilejit::kernels
