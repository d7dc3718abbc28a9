// How a dot that is not on wgmma runs on a CTA's warps: mma.sync (m16n8k16 for f16 / bf16,
// m16n8k8 .tf32 for f32 inputs with input_precision tf32) when the shapes fit, else FMA on CUDA
// cores through shared memory; and, for a batched dot ([B,M,K] @ [B,K,N]), how the batch spreads
// over warps and registers. The layout pass and the lowering both read it, so the accumulator's
// layout and the fragments the lowering builds agree by construction.
#pragma once
#include <cstdint>

#include "dsl/ir/input_precision.hpp"
#include "dsl/ir/type.hpp"
#include "jit/layout.hpp"

namespace tilejit::jit {

struct DotPlan {
  bool mma = false;
  // f32 inputs rounded to TF32 (cvt.rna.tf32.f32) before the products: on mma.sync m16n8k8 .tf32,
  // or on the FMA path when the shapes do not fit
  bool tf32 = false;
  int warps_m = 1, warps_n = 1;  // one batch's warps, along M and N (mma)
  // Batched dots: `batch` > 0 batches, of which `warps_b` are side by side on warps (the warp
  // index's high bits); each warp holds batches_per_warp() of them one after the other in its
  // registers (the register index's high bits), each as the 2-D dot's fragments.
  int64_t batch = 0;
  int warps_b = 1;

  int64_t batches_per_warp() const { return batch > 0 ? batch / warps_b : 1; }
  int64_t k_step() const { return tf32 ? 8 : 16; }  // the mma's K

  // (mma only) the layouts of A [(B,) M, K], B [(B,) K, N] and the accumulator [(B,) M, N].
  Layout a_layout(const ir::Shape& a) const;
  Layout b_layout(const ir::Shape& b) const;
  Layout acc_layout(const ir::Shape& c) const;
};

// `a` and `b` are the dot's operand types (2-D, or 3-D with the batch first).
DotPlan plan_dot(const ir::Type& a, const ir::Type& b, int num_warps, ir::InputPrecision precision = ir::InputPrecision::ieee);

}  // namespace tilejit::jit
