// GEMM in the DSL: C[M,N] = A[M,K] @ B[K,N] with f32 accumulation, any M/N/K (masked edges),
// any operand strides (row- or column-major), bf16/f16 inputs, bf16/f16/f32 output.
#pragma once
#include <cstdint>

#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Meta-parameters: DTYPE (bf16|f16, inputs), OUT_DTYPE (bf16|f16|f32), BLOCK_M, BLOCK_N, BLOCK_K,
// A_KMAJOR (A given as A[M,K], default; else as A^T[K,M]), B_KMAJOR (B given as B^T[N,K]; default B[K,N]).
// ALIGN (default 16): bytes that base addresses and row pitches are multiples of (checked at launch).
// All tensors row-major (unit innermost stride). With BLOCK_K = 64 on sm_90a the K loop runs as a
// TMA + wgmma pipeline whichever way A and B are given (an MN-major operand -- A^T, or B[K, N] --
// is copied in 64-column chunks and read by wgmma transposed).
// GROUP_M: 0 for a 2-D grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)); g > 0 for a 1-D grid of
// cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs ordered g tile-rows at a time (L2 reuse).
// DROPOUT_MASK (default false): the GEMM also writes an attention layer's packed dropout keep-mask
// (issue 7: the RNG hidden in the GEMM that precedes attention, e.g. the QKV projection), in
// tiles of MASK_BLOCK_M rows x MASK_BLOCK_W words (default 64 x 4), MASK_TILES_PER_STEP (default 1)
// per K step, run while that step's wgmmas do; the tiles left over after the K loop. The same bits
// as the dropout_mask kernel (dropout_mask.hpp), whose parameters follow C.
// RING_PRODUCER (default false): a producer warpgroup fills the TMA ring (lang::ring_producer: 4
// warps more at launch, setmaxnreg 24 / 240). PERSISTENT (default false): a 1-D grid of any size
// (one program per multiprocessor) walks the tiles t = program_id, + num_programs, ... in the
// GROUP_M order; with the producer, the next tile's first K blocks are copied during this tile's
// epilogue. Neither with DROPOUT_MASK. TMA_STORE (default false): C leaves through a staging tile
// in shared memory and TMA stores (StoreOptions::tma), where C's rows are 16-byte aligned.
// MASK_RANGE (default false): the GEMM writes tiles [mask_tile_first, mask_tile_end) of the mask
// only (two i32 parameters more; DropoutMaskTiles), so that the GEMMs before an attention layer
// share its mask (issue 30).
// Parameters: A, B, C (rank-2 tensors), then with DROPOUT_MASK: Mask, S_k, seed_lo, seed_hi,
// offset_lo, offset_hi, keep_threshold, rng_state, rng_state_in_memory (and with MASK_RANGE:
// mask_tile_first, mask_tile_end).
const lang::Kernel& gemm();

// gemm's compile-time choices (the metas above) with their defaults.
struct GemmConfig {
  ir::DType dtype = ir::DType::bf16, out_dtype = ir::DType::f32;
  int64_t block_m = 128, block_n = 128, block_k = 64;
  bool a_kmajor = true, b_kmajor = false;
  int64_t align = 16;
  int64_t group_m = 0;
  // DROPOUT_MASK: the packed dropout keep-mask written beside the GEMM (docs/decisions/015)
  bool dropout_mask = false;
  int64_t mask_block_m = 64, mask_block_w = 4;
  bool mask_causal = false;
  int64_t mask_align = 4;
  int64_t mask_tiles_per_step = 1;
  int64_t mask_warps = 0, mma_registers = 0, mask_registers = 0;  // warp roles (MASK_WARPS > 0)
  bool mask_range = false;  // MASK_RANGE: tiles [mask_tile_first, mask_tile_end) of the mask only
  bool ring_producer = false, persistent = false;
  bool tma_store = false;

  // The tiles, and the other metas that differ from their defaults (only those the kernel reads).
  lang::Meta to_meta() const;
  // In gemm's body: reads (declares) the metas in the kernel's order and checks them.
  static GemmConfig read(lang::Builder& kb);
};

}  // namespace tilejit::kernels
