// Microbenchmark kernels for the cost model's calibration (api/calibrate.cpp): each element of X
// goes through ITERS dependent steps of one operation, BLOCK elements a program, so that the
// operation's issue rate -- not memory -- bounds the time.
#pragma once
#include "dsl/builder.hpp"

namespace tilejit::kernels {

// x = exp2(x * -0.25) ITERS times (MUFU.EX2 and one FMUL a step): X f32 [n], n a multiple of BLOCK.
const lang::Kernel& exp2_chain();
// x = x * 0.999 + 0.001 ITERS times (one FFMA a step).
const lang::Kernel& fma_chain();

}  // namespace tilejit::kernels
