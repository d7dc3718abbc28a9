// Backend A: the per-thread IR printed as LLVM IR through LLVM's C++ API, optimised at O3 and
// compiled to PTX by LLVM's NVPTX backend (linked statically into libtilejit).
#pragma once
#include <string>

#include "jit/thread_ir.hpp"

namespace tilejit::jit {

struct LlvmOutput {
  std::string llvm_ir;  // after optimisation
  std::string ptx;
  double ir_ms = 0;   // building LLVM IR + O3
  double ptx_ms = 0;  // NVPTX code generation
};

// arch: "sm_90a" (or any sm_XY the NVPTX backend knows). packed_loop_pairs: CompileOptions'.
LlvmOutput emit_ptx_llvm(const pir::Func& f, const std::string& arch, bool packed_loop_pairs = false);
std::string llvm_version();

}  // namespace tilejit::jit
