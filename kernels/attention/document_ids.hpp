// Document ids of a packed batch from its cumulative offsets: what a library document mask
// (causal_document / document) reads, so that variable-length self-attention (cu_seqlens) can run
// as one dense masked call on the packed sequence -- the wgmma kernels and block skipping of the
// masks instead of the varlen path (decision 113).
#pragma once

#include "dsl/lang.hpp"

namespace tilejit::kernels {

// attention_document_ids: doc_ids[0, t] = b for every token t in [cu_seqlens[b], cu_seqlens[b + 1]).
// Parameters: cu_seqlens i32 [B + 1] (non-decreasing, from 0), doc_ids i32 [1, total]; one program
// per sequence b, grid (B). Tokens past cu_seqlens[B] are not written.
const lang::Kernel& attention_document_ids();

}  // namespace tilejit::kernels
