// Combining partial attention results on one GPU (the kernels of kernels/context_parallel.hpp),
// for the context-parallel runner: asynchronous launches on `stream`, every argument checked first
// (std::invalid_argument naming the function, the argument, the value and what is valid).
//
// O-like tensors are [B, S, H, D] views (any strides, unit stride on D, D 64, 128 or 256, base
// and strides multiples of 16 bytes); LSE tensors f32 [B, H, S] views (unit stride on S). Views
// of a range of rows (of a larger buffer) are fine: nothing outside a view is touched.
#pragma once
#include <cuda.h>

#include "api/attention.hpp"

namespace tilejit::cp {

// Merges one partial result (o_part: bf16, f16 or f32; lse_part f32, natural log, -inf for a row
// that saw no key) into the f32 accumulators o_acc and lse_acc, in place. first: o_acc = o_part,
// lse_acc = lse_part (the accumulators need no initial values).
void merge_partial(const attention::Tensor& o_acc, const attention::Tensor& lse_acc, const attention::Tensor& o_part,
                   const attention::Tensor& lse_part, bool first, CUstream stream);
// acc (f32) += part (bf16, f16 or f32); first: acc = part.
void accumulate(const attention::Tensor& acc, const attention::Tensor& part, bool first, CUstream stream);
// dst (bf16, f16 or f32) = src_f32 rounded to nearest even.
void convert(const attention::Tensor& src_f32, const attention::Tensor& dst, CUstream stream);

}  // namespace tilejit::cp
