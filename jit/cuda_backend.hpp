// Backend B: the per-thread IR printed as CUDA C++ (with inline PTX where backend A uses it) and
// compiled to PTX by nvrtc. It computes bit-for-bit what the LLVM backend computes.
#pragma once
#include <string>

#include "jit/thread_ir.hpp"

namespace tilejit::jit {

struct CudaOutput {
  std::string source;   // the CUDA C++ translation unit given to nvrtc
  std::string ptx;
  double source_ms = 0;  // printing the source
  double nvrtc_ms = 0;   // nvrtc, CUDA C++ -> PTX
};

// The CUDA C++ source of `f`: one extern "C" __global__ kernel named f.name, parameters in the
// order of f.params. Throws std::runtime_error (naming the kernel) for what the GPU backends do
// not support yet (fp8 conversions and arithmetic, f64 transcendental functions).
std::string print_cuda(const pir::Func& f);

// print_cuda + nvrtc_compile for `arch` ("sm_90a") with --fmad=false, so that no multiply-add is
// contracted (the LLVM backend does not contract either). Throws CompileError where nvrtc is
// missing or rejects the source.
CudaOutput emit_ptx_nvrtc(const pir::Func& f, const std::string& arch);

}  // namespace tilejit::jit
