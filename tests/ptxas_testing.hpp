// The assembler check the CI runs on every library kernel: compile a built kernel for sm_90a through
// one backend with ptxas (not nvJitLink), and check that the PTX holds the entry and a cubin came
// out. Tests then check or report its registers, spills and instructions.
#pragma once
#include <doctest/doctest.h>

#include <string>

#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"

namespace testing {

// True (and a visible SKIPPED message) when no ptxas is found.
inline bool no_ptxas() {
  if (!tilejit::jit::find_ptxas().empty()) return false;
  MESSAGE("SKIPPED: no ptxas on TILEJIT_PTXAS, PATH or the CUDA root");
  return true;
}

// `stages` 0: the compile options' default.
inline tilejit::jit::CompiledKernel assemble_sm90a(const tilejit::ir::Function& fn, tilejit::jit::Backend backend, int num_warps,
                                                  int stages = 0) {
  tilejit::jit::CompileOptions o;
  o.backend = backend;
  o.num_warps = num_warps;
  if (stages) o.pipeline.stages = stages;
  o.ptx_tool = tilejit::jit::PtxTool::Ptxas;
  tilejit::jit::CompiledKernel k = tilejit::jit::compile(fn, o);
  CHECK(k.ptx.find(".entry " + fn.name) != std::string::npos);
  CHECK(k.cubin.size() > 1000);
  return k;
}

}  // namespace testing
