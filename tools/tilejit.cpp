// The `tilejit` command-line tool: a table of subcommands (one file each, see commands.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "commands.hpp"

using namespace tilejit::cli;

namespace {

const Command kCommands[] = {
    {"kernels", "list the library kernels", "tilejit kernels\n", &cmd_kernels},
    {"compile", "compile a library kernel and write its IR, source, PTX or cubin",
     "tilejit compile KERNEL [--meta NAME=VALUE ...] [--backend llvm|nvrtc] [--arch sm_90a]\n"
     "                [--num-warps N] [--stages N] [--no-pipeline] [--emit ir|source|ptx|cubin|all ...]\n"
     "                [--dump-after PASS] [-o DIR]\n"
     "  Compiles a library kernel (its default schedule under your --meta values and options) and\n"
     "  writes DIR/KERNEL.{tir,ll|cu,ptx,cubin} for each --emit (default: ptx and cubin); prints\n"
     "  registers, shared memory, spills and timings. VALUE: an integer, true/false or a dtype.\n"
     "  PASS: verify canonicalize assign-layouts lower backend ptx-to-cubin\n",
     &cmd_compile},
};

void print_usage(FILE* out) {
  std::fprintf(out, "usage: tilejit COMMAND [ARGS...]   (tilejit COMMAND --help for details)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    print_usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
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
