// FlashAttention forward in the DSL (online softmax, exp2 with pre-scaled logits): the flagship
// kernel. Issue #6 widens it (layouts, GQA, varlen, backward); this is the first slice.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Q, O: [batch, heads_q, seq_q, head_dim]; K, V: [batch, heads_kv, seq_k, head_dim] (or all
// [batch, seq, heads, head_dim] with BSHD); heads_q a multiple of heads_kv (grouped-query and
// multi-query attention); LSE: [batch, heads_q, seq_q] (natural log; -inf for a row that sees no
// key); softmax_scale: f32. Causal masks align the last query with the last key.
// Meta: DTYPE (bf16|f16), BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD.
// Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_forward();

}  // namespace tilejit::kernels
