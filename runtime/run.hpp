// Run a kernel on host tensors wherever it can run: JIT-compiled on the GPU when there is one
// (inputs uploaded, outputs downloaded back into the same HostTensors), else in the interpreter.
#pragma once
#include <vector>

#include "jit/compile.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::runtime {

enum class Where { Gpu, Interpreter };

struct RunReport {
  Where where = Where::Interpreter;
  std::string why_not_gpu;      // when it ran in the interpreter
  jit::CompiledKernel compiled;  // when it ran on the GPU
};

// Synchronous. Every HostTensor argument is copied to the device and back (outputs and inputs
// alike), so the call behaves as interpret() does on the same arguments.
RunReport run(const ir::Function& f, Grid grid, const std::vector<Arg>& args, const jit::CompileOptions& opts = {});

}  // namespace tilejit::runtime
