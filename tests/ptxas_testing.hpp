// The assembler check the CI runs on every library kernel: compile a built kernel for sm_90a through
// one backend with ptxas (not nvJitLink), and check that the PTX holds the entry and a cubin came
// out. Tests then check or report its registers, spills and instructions.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"
#include "runtime/bundle.hpp"

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

// Library kernels as bundles list them, each compiled under its spec's options by ptxas (a cubin;
// `with_log`: ptxas run again for its log, to grep for serialisation), on every core.
struct AssembledSpec {
  tilejit::jit::CompiledKernel compiled;
  std::string log, error;  // error: what compiling threw (empty: compiled)
};
inline std::vector<AssembledSpec> assemble_specs(const std::vector<tilejit::runtime::BundleEntrySpec>& specs, bool with_log = false) {
  std::vector<AssembledSpec> out(specs.size());
  std::vector<std::thread> pool;
  std::atomic<size_t> next{0};
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < specs.size();) try {
          tilejit::jit::CompileOptions o = specs[i].options;
          o.ptx_tool = tilejit::jit::PtxTool::Ptxas;
          o.make_cubin = true;
          out[i].compiled = tilejit::jit::compile(specs[i].build(), o);
          if (with_log)
            out[i].log = tilejit::jit::ptx_to_cubin(out[i].compiled.ptx, "sm_90a", out[i].compiled.name, tilejit::jit::PtxTool::Ptxas).log;
        } catch (const std::exception& e) {
          out[i].error = e.what();
        }
    });
  for (std::thread& t : pool) t.join();
  return out;
}

}  // namespace testing
