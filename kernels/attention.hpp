// FlashAttention forward in the DSL (online softmax, exp2 with pre-scaled logits): the flagship
// kernel. Issue #6 widens it (layouts, GQA, varlen, backward); this is the first slice.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Q, K, V, O: [batch, heads, seq, head_dim] tensors; LSE: [batch, heads, seq] (natural log);
// softmax_scale: f32. Meta: DTYPE (bf16|f16), BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL.
// Grid: (cdiv(S_q, BLOCK_M), heads, batch).
const lang::Kernel& attention_forward();

}  // namespace tilejit::kernels
