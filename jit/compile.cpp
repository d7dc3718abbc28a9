// The pass pipeline. Read top to bottom, this is the table of contents of the JIT.
#include "jit/compile.hpp"
#include "jit/ptxas_workarounds.hpp"
#include "jit/timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <functional>

#include "jit/assign_layouts.hpp"
#include "jit/canonicalize.hpp"
#include "jit/compile_budget.hpp"
#include "jit/schedule_dots.hpp"
#include "jit/cuda_backend.hpp"
#include "jit/llvm_backend.hpp"
#include "jit/lower.hpp"
#include "jit/ptx_compiler.hpp"

namespace tilejit::jit {
namespace {

// ptxas's C7602 ("Insufficient registers (N) ... register target of M") names neither the launch
// bound that set the cap nor what to change: say both, keeping ptxas's text below.
[[noreturn]] void explain_register_cap(const CompileError& e, const std::string& kernel, int threads,
                                       int min_programs, int user_min_programs) {
  const std::string what = e.what();
  const int cap = std::min(255, 65536 / std::max(1, threads * min_programs) / 8 * 8);
  std::string needs;
  if (auto at = what.find("register target of "); at != std::string::npos) {
    size_t i = at + 19;
    while (i < what.size() && std::isdigit(static_cast<unsigned char>(what[i]))) needs += what[i++];
  }
  const std::string why =
      user_min_programs >= min_programs
          ? fmt::format("min_programs_per_sm = {} caps registers at {} per thread (65536 / ({} threads x {}))",
                        min_programs, cap, threads, min_programs)
          : fmt::format("its warp roles cap registers at {} per thread at entry (65536 / {} threads)", cap, threads);
  throw CompileError(fmt::format(
      "tilejit: kernel '{}': {}, and one of its instructions (a wgmma's accumulator) needs {} registers: "
      "lower min_programs_per_sm{}, use fewer warps or a smaller tile\n{}",
      kernel, why, needs.empty() ? "more" : needs,
      user_min_programs > 1 ? fmt::format(" (1 allows {})", std::min(255, 65536 / std::max(1, threads) / 8 * 8)) : "",
      what));
}

bool env_true(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return false;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

// Spills and registers at the cap: a kernel that compiles but will be slow says so (issue 26).
void note_resources(CompiledKernel& out, int min_programs_per_sm, const std::string& assembler_log) {
  const KernelInfo& i = out.info;
  // ptxas's C7512: the wgmma of one warpgroup wait for each other (a 2-4x slower kernel)
  if (assembler_log.find("(C7512)") != std::string::npos)
    out.warnings.push_back(fmt::format("kernel '{}': {} serialises its wgmma instructions for want of registers: smaller tiles, fewer "
                                       "values live across the MMAs, or more registers (ring_producer / warp_roles registers)",
                                       out.name, out.ptx_tool));
  const int cap = min_programs_per_sm > 0 ? std::min(255, 65536 / std::max(1, out.num_threads * min_programs_per_sm) / 8 * 8) : 255;
  if (i.spill_store_bytes > 0 || i.spill_load_bytes > 0)
    out.warnings.push_back(fmt::format(
        "kernel '{}' spills {} B of stores and {} B of loads per thread at {} registers (cap {}): smaller tiles or more warps "
        "keep it in registers", out.name, i.spill_store_bytes, i.spill_load_bytes, i.registers, cap));
  else if (i.registers >= cap && cap < 255)
    out.warnings.push_back(fmt::format("kernel '{}' uses all {} registers its cap allows (min_programs_per_sm = {})", out.name,
                                       i.registers, min_programs_per_sm));
  if (env_true("TILEJIT_QUIET")) return;
  for (const std::string& w : out.warnings) fmt::print(stderr, "tilejit: warning: {} (TILEJIT_QUIET=1 silences this)\n", w);
}

}  // namespace

bool compilers_disabled() { return env_true("TILEJIT_DISABLE_COMPILERS"); }

std::string_view to_string(Backend b) { return b == Backend::Llvm ? "llvm" : "nvrtc"; }

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names{"verify",         "canonicalize", "schedule", "match-tma", "plan-wgmma",
                                              "assign-layouts", "lower",        "backend",  "ptx-to-cubin"};
  return names;
}

namespace {

// The tile-IR passes and the lowering: compile() hands the result to a backend, lower() returns it.
// `dump(pass, text)` receives each pass's output; `tile_ir` the tile IR after canonicalisation.
pir::Func run_passes(const ir::Function& input, const CompileOptions& opts,
                     const std::function<void(const std::string&, const std::string&)>& dump, std::string* tile_ir) {
  // Warp roles (lang::warp_roles) may split any multiple of 4 warps (e.g. 12 = 8 MMA + 4 others);
  // elsewhere tiles spread over a power-of-two number of warps.
  bool roles = false;
  ir::walk(input.body, [&](const ir::Op& op) { roles = roles || op.kind == ir::OpKind::warp_roles; });
  const bool power_of_two = (opts.num_warps & (opts.num_warps - 1)) == 0;
  if (opts.num_warps < 1 || opts.num_warps > 32 || !(power_of_two || (roles && opts.num_warps % 4 == 0)))
    throw CompileError(fmt::format("tilejit: kernel '{}': num_warps = {} (valid: 1, 2, 4, 8, 16, 32{})", input.name, opts.num_warps,
                                   roles ? ", or with warp roles any multiple of 4 up to 32" : ""));
  check_compile_budget(input, opts.num_warps);  // milliseconds here, not minutes in ptxas
  // (the TMA pipeline takes 2 to 8; 1 is a valid "no ring" choice, as pipeline.enabled = false)
  if (opts.pipeline.stages < 1 || opts.pipeline.stages > 8)
    throw CompileError(fmt::format("tilejit: kernel '{}': pipeline stages = {} (valid: 1 to 8; 1 or a disabled pipeline: no "
                                   "TMA ring)", input.name, opts.pipeline.stages));
  if (opts.min_programs_per_sm < 0 || opts.min_programs_per_sm > 32)
    throw CompileError(fmt::format("tilejit: kernel '{}': min_programs_per_sm = {} (valid: 0 = no bound, 1 to 32)", input.name,
                                   opts.min_programs_per_sm));
  ir::Function f = input;
  ir::verify(f);
  dump("verify", ir::print(f));

  canonicalize(f);
  ir::verify(f);
  std::string canonical = ir::print(f);
  dump("canonicalize", canonical);
  if (tile_ir) *tile_ir = std::move(canonical);

  // Hopper: dots issue as early as their operands allow (the lowering overlaps MMAs in flight).
  if (opts.arch == "sm_90a" && opts.pipeline.enabled) hoist_dots(f);
  dump("schedule", ir::print(f));

  // Layouts, in steps (assign_layouts.hpp): the warps each op runs on; on sm_90a, the GEMM K loops
  // the TMA + wgmma pipeline lowers, then the other dots wgmma runs from shared-memory tiles; then
  // the layout of every tile value.
  check_tile_shapes(f);
  WarpRoles warps = resolve_warp_roles(f, opts.num_warps);
  check_register_rebalancing(f.name, warps, opts.min_programs_per_sm);
  TmaPlan tma = match_tma_loops(f, warps.num_warps, warps.op_warps, opts.arch, opts.pipeline);
  dump("match-tma", print_tma_plan(f, tma));
  HopperPlan hopper = plan_wgmma(f, warps.num_warps, warps.op_warps, opts.arch, opts.pipeline, tma);
  dump("plan-wgmma", print_hopper_plan(f, hopper));
  LayoutPlan plan = assign_layouts(f, std::move(warps), std::move(tma), std::move(hopper));
  dump("assign-layouts", print_with_layouts(f, plan));

  pir::Func threads = lower_to_threads(f, plan);
  // (the lowering asks for 1 when warp roles rebalance registers: setmaxnreg needs a cap at entry)
  threads.min_programs_per_sm = std::max(threads.min_programs_per_sm, opts.min_programs_per_sm);
  dump("lower", pir::print(threads));
  return threads;
}

// The rings start at opts.pipeline.stages and shrink against a budget that cannot count the
// scratch of layout exchanges (known only once lowered): where the kernel then overflows shared
// memory, the passes again with one stage fewer, down to 2, rather than refusing a valid program
// (fuzzer seeds 14438, 20359). `fitted`: the stages it took, 0 when the requested ones fit.
pir::Func run_passes_fitting(const ir::Function& input, const CompileOptions& opts,
                             const std::function<void(const std::string&, const std::string&)>& dump, std::string* tile_ir,
                             int* fitted) {
  CompileOptions o = opts;
  for (;;) {
    try {
      return run_passes(input, o, dump, tile_ir);
    } catch (const SharedMemoryOverflow&) {
      if (!o.pipeline.enabled || o.pipeline.stages <= 2) throw;
      --o.pipeline.stages;
      if (fitted) *fitted = o.pipeline.stages;
    }
  }
}

}  // namespace

pir::Func lower(const ir::Function& f, const CompileOptions& opts) {
  detail::check_arch(opts.arch, f.name, false);
  return run_passes_fitting(f, opts, [](const std::string&, const std::string&) {}, nullptr, nullptr);
}

CompiledKernel compile(const ir::Function& input, const CompileOptions& opts) {
  // First, before any compiler is loaded or run: the switch that proves bundles need none.
  if (compilers_disabled())
    throw CompileError(fmt::format(
        "tilejit: kernel '{}' is not in a loaded bundle and compilers are disabled (TILEJIT_DISABLE_COMPILERS={}): "
        "load a bundle that holds it (tilejit::load_bundle; `tilejit bundle` writes one) and run it through "
        "runtime::compile_cached, or unset TILEJIT_DISABLE_COMPILERS",
        input.name, std::getenv("TILEJIT_DISABLE_COMPILERS")));
  detail::check_arch(opts.arch, input.name, false);  // before LLVM prints its own lines about it
  const auto& names = pass_names();
  if (!opts.dump_after.empty() && std::find(names.begin(), names.end(), opts.dump_after) == names.end())
    throw CompileError(fmt::format("tilejit: kernel '{}': unknown pass '{}' for --dump-after (valid: {})", input.name,
                                   opts.dump_after, fmt::join(names, ", ")));
  CompiledKernel out;
  out.name = input.name;
  out.arch = opts.arch;
  out.backend = opts.backend;
  auto dump = [&](const std::string& pass, const std::string& text) {
    if (opts.dump_after == pass) out.dump = text;
  };
  auto t0 = std::chrono::steady_clock::now();
  int fitted_stages = 0;
  pir::Func threads = run_passes_fitting(input, opts, dump, &out.tile_ir, &fitted_stages);
  if (fitted_stages)
    out.warnings.push_back(fmt::format("kernel '{}': {} pipeline stages do not fit in shared memory beside its layout exchanges; "
                                       "compiled with {}", input.name, opts.pipeline.stages, fitted_stages));
  const ir::Function& f = input;
  out.num_threads = threads.num_threads;
  out.smem_bytes = threads.smem_bytes;
  out.abi = threads.params;
  out.tensor_maps = threads.tensor_maps;
  out.timings.passes_ms = ms_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  if (opts.backend == Backend::Llvm) {
    LlvmOutput l = emit_ptx_llvm(threads, opts.arch, opts.packed_loop_pairs);
    out.backend_source = std::move(l.llvm_ir);
    out.ptx = std::move(l.ptx);
  } else {
    CudaOutput c = emit_ptx_nvrtc(threads, opts.arch);
    out.backend_source = std::move(c.source);
    out.ptx = std::move(c.ptx);
  }
  rewrite_integer_negations(out.ptx);  // (a ptxas bug: jit/ptxas_workarounds.hpp)
  out.timings.backend_ms = ms_since(t1);
  dump("backend", out.backend_source);

  if (opts.make_cubin) {
    CubinResult c;
    try {
      c = ptx_to_cubin(out.ptx, opts.arch, f.name, opts.ptx_tool);
    } catch (const CompileError& e) {
      if (threads.min_programs_per_sm > 0 && std::string_view(e.what()).find("(C7602)") != std::string_view::npos)
        explain_register_cap(e, f.name, threads.num_threads, threads.min_programs_per_sm, opts.min_programs_per_sm);
      throw;
    }
    out.cubin = std::move(c.cubin);
    out.ptx_tool = c.tool;
    for (const KernelInfo& k : c.kernels)
      if (k.name == f.name) out.info = k;
    out.timings.ptx_to_cubin_ms = c.milliseconds;
    note_resources(out, opts.min_programs_per_sm, c.log);  // (the cap a user set; warp roles set their own)
    dump("ptx-to-cubin", out.info.to_string());
  }
  return out;
}

}  // namespace tilejit::jit
