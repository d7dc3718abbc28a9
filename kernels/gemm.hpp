// GEMM in the DSL: C[M,N] = A[M,K] @ B[K,N] with f32 accumulation, any M/N/K (masked edges),
// any operand strides (row- or column-major), bf16/f16 inputs, bf16/f16/f32 output.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Meta-parameters: DTYPE (bf16|f16, inputs), OUT_DTYPE (bf16|f16|f32), BLOCK_M, BLOCK_N, BLOCK_K,
// A_KMAJOR (A given as A[M,K], default; else as A^T[K,M]), B_KMAJOR (B given as B^T[N,K]; default B[K,N]).
// ALIGN (default 16): bytes that base addresses and row pitches are multiples of (checked at launch).
// All tensors row-major (unit innermost stride). With both K-major, BLOCK_K = 64 and sm_90a the K loop
// runs as a TMA + wgmma pipeline.
// GROUP_M: 0 for a 2-D grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); g > 0 for a 1-D grid of
// cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs ordered g tile-rows at a time (L2 reuse).
// Parameters: A, B, C (rank-2 tensors).
const lang::Kernel& gemm();

}  // namespace tilejit::kernels
