// FlashAttention-2 backward in the DSL: three deterministic kernels (no atomics), run in order
// after the forward (kernels/attention.hpp), whose LSE they reuse to recompute P.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Tensors follow the forward: Q, O, dO, dQ: [batch, heads_q, seq_q, head_dim]; K, V, dK, dV:
// [batch, heads_kv, seq_k, head_dim] (or all [batch, seq, heads, head_dim] with BSHD); heads_q a
// multiple of heads_kv. LSE (the forward's, natural log, -inf for a row that sees no key) and
// Delta: f32 [batch, heads_q, seq_q]. Causal masks align the last query with the last key.

// Delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] (f32).
// Params: O, dO, Delta. Meta: DTYPE, BLOCK_M, HEAD_DIM, BSHD. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_preprocess();

// dK, dV for one key block of one key/value head, summed over the query heads of its group:
// dV = sum P^T dO, dK = scale * sum dS^T Q with dS = P * (dO V^T - Delta).
// Params: Q, K, V, dO, LSE, Delta, dK, dV, softmax_scale (f32).
// Meta: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD. Grid: (cdiv(seq_k, BLOCK_N), heads_kv, batch).
const lang::Kernel& attention_backward_dkdv();

// dQ = scale * sum dS K for one query block.
// Params: Q, K, V, dO, LSE, Delta, dQ, softmax_scale (f32).
// Meta: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_dq();

}  // namespace tilejit::kernels
