// Shared by the examples' `--compile` mode: lower a kernel through both backends (LLVM, nvrtc)
// to sm_90a PTX and a cubin, and print what ptxas reports. Exit status 0 when both succeed.
#pragma once
#include <cstdio>
#include <exception>

#include "jit/compile.hpp"

inline int compile_both_backends(const tilejit::ir::Function& fn) {
  int status = 0;
  for (auto backend : {tilejit::jit::Backend::Llvm, tilejit::jit::Backend::Nvrtc}) {
    tilejit::jit::CompileOptions o;
    o.backend = backend;
    try {
      auto k = tilejit::jit::compile(fn, o);
      std::printf("%s via %s: %s\n", fn.name.c_str(), std::string(tilejit::jit::to_string(backend)).c_str(),
                  k.info.to_string().c_str());
    } catch (const std::exception& e) {
      std::printf("%s via %s failed: %s\n", fn.name.c_str(), std::string(tilejit::jit::to_string(backend)).c_str(), e.what());
      status = 1;
    }
  }
  return status;
}
