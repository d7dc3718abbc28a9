// FlashAttention-2 backward in the DSL: three deterministic kernels (no atomics), run in order
// after the forward (kernels/attention.hpp), whose LSE they reuse to recompute P.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Tensors follow the forward: Q, O, dO, dQ: [batch, heads_q, seq_q, head_dim]; K, V, dK, dV:
// [batch, heads_kv, seq_k, head_dim] (or all [batch, seq, heads, head_dim] with BSHD); heads_q a
// multiple of heads_kv. LSE (the forward's, natural log, -inf for a row that sees no key) and
// Delta: f32 [batch, heads_q, seq_q]. Causal masks align the last query with the last key.
//
// VARLEN (as the forward's): Q, O, dO, dQ: [total_q, heads_q, head_dim]; K, V, dK, dV: [total_k,
// heads_kv, head_dim]; LSE, Delta: f32 [heads_q, total_q]; trailing i32 pointer parameters
// cu_seqlens_q, cu_seqlens_k (batch + 1 cumulative offsets; the preprocess takes cu_seqlens_q
// only). Each sequence is differentiated as in the dense kernels (its own S_q, S_k, causal
// alignment; length 0 allowed: its gradients are 0). The grids use max_seqlen_q/k for seq_q/k and
// the number of sequences for batch; programs past their sequence's end do nothing; tokens
// outside [cu[0], cu[batch]) are neither read nor written. BSHD with VARLEN is a BuildError.
//
// DROPOUT (dK/dV and dQ; the forward's, kernels/attention.hpp): five more scalars after all the
// other parameters, seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold (the forward's values);
// the kernels regenerate the forward's keep-mask from the same logical coordinates (bh = b *
// heads_q + h, query row, key) and differentiate O = dropout(P) V: dV = sum (P * keep * s)^T dO,
// dS = P * (dO V^T * keep * s - Delta), s = 256 / keep_threshold. The preprocess is unchanged
// (Delta = rowsum(dO * O), O already dropped).
// DROPOUT_BITS (dK/dV and dQ, dense only, BLOCK_N a multiple of 32; needs DROPOUT): rng =
// precomputed, as in the forward -- one more parameter after the dropout scalars, dropout_bits
// (u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)], what the dropout_mask kernel writes); the
// kernels read the mask instead of regenerating it (the same bits).
//
// MASK (dK/dV and dQ; an int, kernels::MaskKind, the forward's meta; default full): a library mask
// (kernels/attention_mask_host.hpp defines each pattern). MASK=causal is exactly CAUSAL=true (the same
// code, no parameters). Any other kind with CAUSAL=true or VARLEN=true is a BuildError (not
// supported together yet). Its parameters come after all the others (after the dropout scalars
// and dropout_bits): the mask's own, in kernels::mask_parameter_names(kind) order (i32 scalars
// mask_window_left, mask_window_right, mask_global_tokens, mask_block_q, mask_block_k; tensors
// mask_doc_ids i32 [B or 1, S_k], mask_prefix_lengths i32 [B], mask_block_table u8 [B or 1, Hq or 1,
// ..]); then, for the kinds without tile intervals (document, causal_document, share_question,
// causal_blockwise, block_sparse: !kernels::mask_has_tile_intervals), the lists of the
// attention_block_mask pre-pass (kernels/attention_mask.hpp) run with THIS kernel's BLOCK_M and
// BLOCK_N: dK/dV reads the KV_MAJOR=true lists (per key tile, its query tiles) q_num_blocks,
// q_indices, full_q_num_blocks, full_q_indices; dQ the KV_MAJOR=false lists (per query tile, its key
// tiles) kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices (i32, [Bm, Hm, nOuter(,
// nInner)], Bm / Hm 1 or B / Hq: they broadcast). Each program visits only the non-empty blocks, in
// one flat loop (the interval kinds' runs end to end, or the partial list then the full one), and
// evaluates the element mask only in partial blocks and blocks that cross S_k (one uniform branch);
// masked elements have P = 0, hence dS = 0. The mask is per query head (dK/dV binds it per head of
// the group). Rows with no allowed key (forward LSE = -inf) get zero gradients. Dropout and masks
// are independent.

// Delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] (f32).
// Params: O, dO, Delta (VARLEN: cu_seqlens_q). Meta: DTYPE, BLOCK_M, HEAD_DIM, BSHD, VARLEN. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_preprocess();

// dK, dV for one key block of one key/value head, summed over the query heads of its group:
// dV = sum P^T dO, dK = scale * sum dS^T Q with dS = P * (dO V^T - Delta).
// Params: Q, K, V, dO, LSE, Delta, dK, dV, softmax_scale (f32) (VARLEN: cu_seqlens_q, cu_seqlens_k)
// (DROPOUT: seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold) (DROPOUT_BITS: dropout_bits)
// (MASK: the mask's parameters, then without tile intervals q_num_blocks, q_indices,
// full_q_num_blocks, full_q_indices).
// Meta: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, MASK, DROPOUT, DROPOUT_BITS. Grid: (cdiv(seq_k, BLOCK_N), heads_kv, batch).
const lang::Kernel& attention_backward_dkdv();

// dQ = scale * sum dS K for one query block.
// Params: Q, K, V, dO, LSE, Delta, dQ, softmax_scale (f32) (VARLEN: cu_seqlens_q, cu_seqlens_k)
// (DROPOUT: seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold) (DROPOUT_BITS: dropout_bits)
// (MASK: the mask's parameters, then without tile intervals kv_num_blocks, kv_indices,
// full_kv_num_blocks, full_kv_indices).
// Meta: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, MASK, DROPOUT, DROPOUT_BITS. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_dq();

}  // namespace tilejit::kernels
