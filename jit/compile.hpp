// The JIT pipeline, tile IR -> cubin, as one readable list of passes (compile.cpp), with the
// artefacts of every stage kept for inspection (`tilejit compile --emit`, --dump-after).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/ptx_compiler.hpp"
#include "jit/thread_ir.hpp"
#include "jit/tma_pipeline.hpp"

namespace tilejit::jit {

enum class Backend { Llvm, Nvrtc };
std::string_view to_string(Backend b);

struct CompileOptions {
  std::string arch = "sm_90a";
  Backend backend = Backend::Llvm;
  int num_warps = 4;
  // > 0: the programs per multiprocessor the registers must leave room for (PTX .minnctapersm;
  // ptxas then caps each thread's registers, spilling if it must), e.g. 3 of 128 threads: <= 168.
  int min_programs_per_sm = 0;
  PtxTool ptx_tool = PtxTool::Auto;
  PipelineOptions pipeline;  // TMA + wgmma K loops on sm_90a
  bool make_cubin = true;   // false: stop at PTX (no assembler needed)
  // LLVM backend: loop-carried 16-bit float values travel in pairs, one 32-bit phi for two (a
  // loop-carried bf16 tile such as PIPELINE_PV's P): ptxas then writes a masked P straight into
  // the registers the next iteration's wgmma reads, without copies (the dropout forward: 30 PRMT
  // copies a key block). Off until timed (decision 092).
  bool packed_loop_pairs = false;
  std::string dump_after;   // a pass name from pass_names(): its output goes to CompiledKernel::dump
  // tilejit::Function only (not code generation): compile a variant per argument facts the kernel
  // does not declare (runtime/specialization.hpp). The library's own launches turn it off: their
  // kernels declare what they need, and bundles hold the declared variant.
  bool specialize = true;
};

struct CompileTimings {
  double passes_ms = 0;        // tile-IR passes and lowering to the per-thread IR
  double backend_ms = 0;       // per-thread IR -> PTX (LLVM or nvrtc)
  double ptx_to_cubin_ms = 0;
};

struct CompiledKernel {
  std::string name;
  std::string arch;
  Backend backend = Backend::Llvm;
  int num_threads = 0;
  int64_t smem_bytes = 0;            // dynamic shared memory the launch must provide
  std::vector<pir::Param> abi;       // flattened parameters: tensors become ptr, sizes (i32), strides (i64)
  std::vector<pir::TensorMapSpec> tensor_maps;  // TMA descriptors the launcher builds (extra trailing parameters)
  std::string tile_ir;               // after the tile-IR passes
  std::string backend_source;        // LLVM IR (optimised) or CUDA C++
  std::string ptx;
  std::vector<uint8_t> cubin;
  KernelInfo info;                   // registers, shared memory, spills (when a cubin was made)
  std::string ptx_tool;
  std::string dump;                  // the --dump-after output
  // What the user should know about the result (spills, registers at the cap); also printed on
  // stderr by compile() unless TILEJIT_QUIET is 1/true/yes/on. Not stored in caches or bundles.
  std::vector<std::string> warnings;
  CompileTimings timings;
};

// Passes in order; names accepted by CompileOptions::dump_after.
const std::vector<std::string>& pass_names();

// Throws LoweringError / CompileError with the kernel's name on failure. The input is copied.
// With compilers_disabled() it throws CompileError at once, touching no compiler.
CompiledKernel compile(const ir::Function& f, const CompileOptions& opts = {});

// The per-thread program compile() hands to a backend (verification, the tile-IR passes, layouts,
// lowering), for tools that execute it on the host (runtime/emulator.hpp). Throws as compile().
pir::Func lower(const ir::Function& f, const CompileOptions& opts = {});

// True when the environment variable TILEJIT_DISABLE_COMPILERS is 1, true, yes or on (any case),
// read on every call: a shipped application (or a test) proving that its kernels come from loaded
// bundles (runtime/bundle.hpp) and never from LLVM, nvrtc, nvJitLink or ptxas.
bool compilers_disabled();

}  // namespace tilejit::jit
