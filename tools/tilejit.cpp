// The `tilejit` command-line tool: a table of subcommands (one file each, see commands.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "api/plugin_loader.hpp"
#include "commands.hpp"

using namespace tilejit::cli;

namespace {

const Command kCommands[] = {
    {"kernels", "list the library kernels and those of loaded plugins",
     "tilejit kernels\n"
     "  Every kernel the other commands take by name: the library's, then each plugin's with the\n"
     "  option or variable and the path it came from.\n",
     &cmd_kernels},
    {"compile", "compile a library or plugin kernel and write its IR, source, PTX or cubin",
     "tilejit compile KERNEL [--meta NAME=VALUE ...] [--backend llvm|nvrtc] [--arch sm_90a]\n"
     "                [--num-warps N] [--stages N] [--min-programs-per-sm N] [--no-pipeline] [--packed-loop-pairs]\n"
     "                [--emit ir|source|ptx|cubin|all ...]\n"
     "                [--dump-after PASS] [-o DIR]\n"
     "  Compiles a kernel (its default schedule under your --meta values and options) and\n"
     "  writes DIR/KERNEL.{tir,ll|cu,ptx,cubin} for each --emit (default: ptx and cubin); prints\n"
     "  registers, shared memory, spills and timings. VALUE: an integer, true/false or a dtype.\n"
     "  PASS: verify canonicalize schedule match-tma plan-wgmma assign-layouts lower backend ptx-to-cubin\n",
     &cmd_compile},
    {"cache", "list, verify or clear the on-disk compile cache",
     "tilejit cache ls|verify|clear|dir\n"
     "  ls: every entry (key, kernel, arch, size, age); verify: report invalid entries (exit 1 if\n"
     "  any; they are never loaded, only rebuilt); clear: remove all entries; dir: where it is.\n"
     "  The directory: $TILEJIT_CACHE_DIR, else $XDG_CACHE_HOME/tilejit, else ~/.cache/tilejit;\n"
     "  TILEJIT_CACHE=0 disables it.\n",
     &cmd_cache},
    {"run", "run a library kernel on random inputs; print its error against a reference and its time",
     "tilejit run KERNEL [--shape M,N,K | B,H,S,D] [--device cpu|gpu] [--meta NAME=VALUE ...] [--num-warps N]\n"
     "            [--stages N] [--backend llvm|nvrtc] [--reps N]\n"
     "  gemm: --shape M,N,K (default 1024,1024,1024 on the GPU, 96,80,64 on the CPU);\n"
     "  attention_fwd: --shape B,H,S,D (default 2,8,1024,64 on the GPU, 1,2,128,64 on the CPU).\n"
     "  --device defaults to gpu when there is one. Prints the relative error against float64\n"
     "  (sampled rows for large shapes) and, on the GPU, the time and TFLOP/s. Plugin kernels have\n"
     "  no inputs or reference here: check them in the interpreter from your own tests.\n",
     &cmd_run},
    {"inspect", "show the IR after each pass, the PTX, registers/shared memory/spills and SASS",
     "tilejit inspect KERNEL [--meta NAME=VALUE ...] [--backend llvm|nvrtc] [--num-warps N] [--stages N]\n"
     "                [--pass PASS ...] [--no-sass]\n"
     "  Prints the IR after each pass (or only the --pass ones), the PTX, what the assembler\n"
     "  reports, and the SASS when cuobjdump is on PATH.\n",
     &cmd_inspect},
    {"bundle", "build library or plugin kernels into a bundle an application loads with no compiler; list one",
     "tilejit bundle -o FILE [--emit-cpp FILE.cpp] [--arch ARCH ...] [--attention KEY=VALUE,...] KERNEL[:NAME=VALUE,...] ...\n"
     "tilejit bundle --list FILE\n"
     "  Compiles each KERNEL (its default schedule under your values) for each --arch (default sm_90a)\n"
     "  and writes one checked file that tilejit::load_bundle(FILE) loads; --emit-cpp also writes a C++\n"
     "  source embedding it that loads it at start-up when linked into an application. NAME=VALUE:\n"
     "  a meta-parameter (an integer, true/false or a dtype), or the schedule: warps=N, stages=N,\n"
     "  min_programs_per_sm=N, pipeline=on|off, once_by_tma=on|off, packed_loop_pairs=on|off, backend=llvm|nvrtc.\n"
     "  Examples: gemm  gemm:BLOCK_N=128,OUT_DTYPE=f32\n"
     "  attention_fwd:CAUSAL=true,warps=8. --attention: every kernel the attention API launches for one\n"
     "  configuration (what attention::prepare compiles): D=64|128|256 (required), dtype=bf16|f16,\n"
     "  mask=NAME, reduction=recompute|atomic|split|ordered (unset: every one the default may pick), varlen,\n"
     "  backward, dropout, q_descending=0|1 (a flag's name alone means 1); e.g. --attention D=128,mask=causal,dropout.\n"
     "  --list prints a bundle's entries.\n",
     &cmd_bundle},
    {"tune", "autotune a kernel for shapes: model ranking, parallel compiles, GPU timing, persisted",
     "tilejit tune KERNEL --shape DIMS [--shape DIMS ...] [--top-k N] [--compile-k N] [--budget-s S] [--exhaustive]\n"
     "             [--force] [--model-only] [--all] [--meta NAME=VALUE ...] [--backend llvm|nvrtc] [--bundle FILE]\n"
     "             [--csv FILE] [--rep-ms MS]\n"
     "  DIMS: gemm M,N,K; attention_fwd, attention_bwd_dkdv and attention_bwd_dq B,H,S,D; a plugin kernel its space's key dimensions. Ranks the kernel's tuning space with the cost model,\n"
     "  compiles the best --compile-k (default 2 x top-k) in parallel, times the best --top-k (default 6)\n"
     "  and the default config on the GPU (outputs checked against the default's) and stores every\n"
     "  measurement and the choice next to the compile cache; a later run is a lookup. --exhaustive\n"
     "  times every valid config; --force re-chooses (stored measurements are still reused). Prints\n"
     "  config, model estimate and rank, measured time and rank, TFLOP/s, then the model's terms (each\n"
     "  unit's busy time, the chains' latency, memory, occupancy) for the choice and the default and the\n"
     "  choice's gain over the default. Without a GPU (or with\n"
     "  --model-only) prints the model's ranking only. --bundle FILE writes the chosen kernels and the\n"
     "  tuning table into a bundle, so an application that loads it never tunes. --csv FILE writes one\n"
     "  row per config and shape: the model's terms, the measurement, the compiled resources. --rep-ms:\n"
     "  timed repetitions per config (default 60 ms).\n",
     &cmd_tune},
    {"calibrate", "measure the cost model's unit rates on this GPU and store them",
     "tilejit calibrate [--show]\n"
     "  Times microbenchmarks on GPU 0 (exponentials and FP32 FMAs in dependent chains; the library GEMM\n"
     "  at 8192^3 for the record), prints each rate per SM and clock beside the data sheet's, and stores\n"
     "  them next to the tuning results (the compile cache's directory), where the autotuner's cost model\n"
     "  takes the exponential and FP32 rates for this GPU (name, SM count, driver). A rate outside\n"
     "  [1/4, 2] x the data sheet's is not stored.\n"
     "  --show prints the stored rates.\n",
     &cmd_calibrate},
};

void print_usage(FILE* out) {
  std::fprintf(out, "usage: tilejit COMMAND [ARGS...] [--plugin PATH ...]   (tilejit COMMAND --help for details)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\n--plugin PATH (any command, repeatable) loads the kernels of a shared library built with\n"
               "TILEJIT_PLUGIN (api/plugin.hpp), after those of $TILEJIT_PLUGINS (paths separated by ':').\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Args given(argv + 1, argv + argc);
  if (given.empty() || given[0] == "--help" || given[0] == "-h") {
    print_usage(given.empty() ? stderr : stdout);
    return given.empty() ? 2 : 0;
  }
  // Plugins load before the command is looked up, so --plugin may stand anywhere.
  Args args;
  try {
    args = load_plugins(given);
  } catch (const tilejit::plugin::PluginError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tilejit: %s\n", e.what());
    return 2;
  }
  if (args.empty()) {
    print_usage(stderr);
    return 2;
  }
  for (const Command& c : kCommands) {
    if (args[0] != c.name) continue;
    Args rest(args.begin() + 1, args.end());
    if (!rest.empty() && (rest[0] == "--help" || rest[0] == "-h")) {
      std::fputs(c.usage, stdout);
      return 0;
    }
    try {
      return c.run(rest);
    } catch (const UsageError& e) {
      std::fprintf(stderr, "tilejit %s: %s\nusage: %s", c.name, e.what(), c.usage);
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "tilejit: unknown command '%s'\n", args[0].c_str());
  print_usage(stderr);
  return 2;
}
