// `tilejit inspect`: what the JIT made of a library kernel, stage by stage: the IR after each
// pass, the PTX, the assembler's resource figures, and SASS when cuobjdump is installed.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <unistd.h>

#include "commands.hpp"
#include "output_file.hpp"

namespace tilejit::cli {

int cmd_inspect(const Args& args) {
  if (args.empty()) throw UsageError("inspect needs a kernel name (see `tilejit kernels`)");
  KernelSelection sel = select_kernel(args[0]);
  std::vector<std::string> passes;
  bool sass = true;
  for (size_t i = 1; i < args.size(); ++i) {
    if (parse_kernel_option(args, i, sel)) continue;
    if (args[i] == "--pass") passes.push_back(option_value(args, i));
    else if (args[i] == "--no-sass") sass = false;
    else throw UsageError(fmt::format("unknown option '{}'", args[i]));
  }
  if (passes.empty()) passes = jit::pass_names();
  ir::Function fn = sel.build();
  jit::CompiledKernel last;
  for (const std::string& pass : passes) {
    jit::CompileOptions o = sel.options;
    o.dump_after = pass;
    o.make_cubin = true;
    last = jit::compile(fn, o);
    std::printf("==== after %s ====\n%s\n", pass.c_str(), last.dump.c_str());
  }
  std::printf("==== PTX (%zu bytes) ====\n%s\n", last.ptx.size(), last.ptx.c_str());
  std::printf("==== resources ====\n%s (%s); %d threads, %lld B dynamic shared memory\n", last.info.to_string().c_str(),
              last.ptx_tool.c_str(), last.num_threads, static_cast<long long>(last.smem_bytes));
  if (!sass) return 0;
  if (std::system("command -v cuobjdump > /dev/null 2>&1") != 0) {
    std::printf("==== SASS ====\n(cuobjdump is not installed here)\n");
    return 0;
  }
  auto path = std::filesystem::temp_directory_path() / fmt::format("tilejit-inspect-{}.cubin", ::getpid());
  write_output("inspect", path,
               std::string_view(reinterpret_cast<const char*>(last.cubin.data()), last.cubin.size()));
  std::printf("==== SASS ====\n");
  std::fflush(stdout);
  int rc = std::system(fmt::format("cuobjdump -sass '{}'", path.string()).c_str());
  std::filesystem::remove(path);
  return rc == 0 ? 0 : 1;
}

}  // namespace tilejit::cli
