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

// Delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] (f32).
// Params: O, dO, Delta (VARLEN: cu_seqlens_q). Meta: DTYPE, BLOCK_M, HEAD_DIM, BSHD, VARLEN. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_preprocess();

// dK, dV for one key block of one key/value head, summed over the query heads of its group:
// dV = sum P^T dO, dK = scale * sum dS^T Q with dS = P * (dO V^T - Delta).
// Params: Q, K, V, dO, LSE, Delta, dK, dV, softmax_scale (f32) (VARLEN: cu_seqlens_q, cu_seqlens_k)
// (DROPOUT: seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold).
// Meta: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, DROPOUT, DROPOUT_BITS. Grid: (cdiv(seq_k, BLOCK_N), heads_kv, batch).
const lang::Kernel& attention_backward_dkdv();

// dQ = scale * sum dS K for one query block.
// Params: Q, K, V, dO, LSE, Delta, dQ, softmax_scale (f32) (VARLEN: cu_seqlens_q, cu_seqlens_k)
// (DROPOUT: seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold).
// Meta: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, DROPOUT, DROPOUT_BITS. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_dq();

}  // namespace tilejit::kernels
