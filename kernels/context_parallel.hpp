// The small kernels of context parallelism (issue 24; the host side is api/context_parallel/):
// combining the partial attention results that each GPU computes against several key/value
// chunks in turn. Forward: merge a chunk's partial O and LSE into an f32 accumulator
// (attention_cp_merge); backward: sum gradient partials into f32 (attention_cp_accumulate); both:
// convert the f32 result to the caller's dtype (attention_cp_convert).
//
// Tensors are row views with runtime strides, so the host can pass any range of rows: O-like
// tensors [B, S, H, D] (unit stride on D; base and other strides multiples of 16 bytes), LSE f32
// [B, H, S] (natural log, unit stride on S, any base). Grid (cdiv(S, BLOCK_M), H, B): one program
// per BLOCK_M rows of one head; rows past S are neither read nor written.
#pragma once
#include <cstdint>

#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Parameters: O_acc f32 [B, S, H, D], LSE_acc f32 [B, H, S] (updated in place), O_part DTYPE
// [B, S, H, D], LSE_part f32 [B, H, S] (a row that saw no key: O = 0, LSE = -inf). In f32:
// lse = m + log(exp(lse_acc - m) + exp(lse_part - m)), m = max(lse_acc, lse_part);
// O_acc = exp(lse_acc - lse) O_acc + exp(lse_part - lse) O_part. Both -inf: O = 0, LSE = -inf.
// FIRST: O_acc = O_part, LSE_acc = LSE_part (the accumulator is not read: no init pass).
const lang::Kernel& attention_cp_merge();
// Parameters: acc f32 [B, S, H, D], part DTYPE [B, S, H, D]: acc += part (FIRST: acc = part).
const lang::Kernel& attention_cp_accumulate();
// Parameters: src f32 [B, S, H, D], dst DTYPE [B, S, H, D]: dst = src rounded to DTYPE.
const lang::Kernel& attention_cp_convert();

// Rows per program for a head dim: 4096 elements, 32 f32 registers a thread per tile at 4 warps
// (the merge holds two such tiles).
constexpr int64_t cp_block_m(int64_t head_dim) { return 4096 / head_dim; }

// attention_cp_merge's and attention_cp_accumulate's metas: DTYPE (the part's: bf16, f16 or f32),
// HEAD_DIM (64, 128 or 256), BLOCK_M (a power of two; default cp_block_m(HEAD_DIM)), FIRST.
struct CpPartialConfig {
  ir::DType dtype = ir::DType::bf16;
  int64_t head_dim = 64;
  int64_t block_m = cp_block_m(64);
  bool first = false;

  lang::Meta to_meta() const;  // all four
  static CpPartialConfig read(lang::Builder& kb);
};

// attention_cp_convert's metas: DTYPE (dst's: bf16, f16 or f32), HEAD_DIM, BLOCK_M, as above.
struct CpConvertConfig {
  ir::DType dtype = ir::DType::bf16;
  int64_t head_dim = 64;
  int64_t block_m = cp_block_m(64);

  lang::Meta to_meta() const;  // all three
  static CpConvertConfig read(lang::Builder& kb);
};

}  // namespace tilejit::kernels
