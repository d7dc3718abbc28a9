// FlashAttention forward in the DSL (online softmax, exp2 with pre-scaled logits): the flagship
// kernel. Issue #6 widens it (layouts, GQA, varlen, backward); this is the first slice.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Q, O: [batch, heads_q, seq_q, head_dim]; K, V: [batch, heads_kv, seq_k, head_dim] (or all
// [batch, seq, heads, head_dim] with BSHD); heads_q a multiple of heads_kv (grouped-query and
// multi-query attention); LSE: [batch, heads_q, seq_q] (natural log; -inf for a row that sees no
// key); softmax_scale: f32. Causal masks align the last query with the last key.
// Meta: DTYPE (bf16|f16), BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN.
// Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
//
// VARLEN (flash_attn_varlen_func's layout): Q, O: [total_q, heads_q, head_dim]; K, V: [total_k,
// heads_kv, head_dim]; LSE: [heads_q, total_q]; two more parameters after softmax_scale,
// cu_seqlens_q and cu_seqlens_k: i32 pointers to batch + 1 cumulative offsets (0, len_0,
// len_0 + len_1, ...); sequence b is tokens [cu[b], cu[b + 1]). Each sequence is attended as in
// the dense kernel (its own S_q, S_k, causal alignment; length 0 allowed). Grid:
// (cdiv(max_seqlen_q, BLOCK_M), heads_q, batch); blocks past their sequence's end do nothing.
// Tokens outside [cu[0], cu[batch]) are neither read nor written.
const lang::Kernel& attention_forward();

}  // namespace tilejit::kernels
