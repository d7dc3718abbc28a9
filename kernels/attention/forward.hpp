// FlashAttention forward in the DSL (online softmax, exp2 with pre-scaled logits): the flagship
// kernel. Issue #6 widens it (layouts, GQA, varlen, backward); this is the first slice.
#pragma once
#include <optional>

#include "dsl/lang.hpp"

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

}  // namespace tilejit::kernels
