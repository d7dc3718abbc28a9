// The `tilejit` tool's subcommands: each lives in its own cmd_*.cpp and is listed once in
// tilejit.cpp. A command gets its arguments (after its name) and returns the exit status.
#pragma once
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "api/registry.hpp"

namespace tilejit::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  const char* usage;  // shown by `tilejit NAME --help` and on usage errors
  int (*run)(const Args& args);
};

// Throws UsageError: printed with the command's usage, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int cmd_kernels(const Args& args);
int cmd_compile(const Args& args);
int cmd_cache(const Args& args);
int cmd_run(const Args& args);
int cmd_inspect(const Args& args);
int cmd_bundle(const Args& args);
int cmd_tune(const Args& args);
int cmd_calibrate(const Args& args);

// Loads $TILEJIT_PLUGINS, then every `--plugin PATH` (or --plugin=PATH) of a command's arguments,
// and returns the arguments without them. Throws plugin::PluginError, or UsageError for a
// --plugin without a path.
Args load_plugins(const Args& args);

// Shared option parsing for commands that build a library or plugin kernel: --meta NAME=VALUE,
// --backend, --arch, --num-warps, --stages, --no-pipeline. Returns false for options it does
// not know (the caller handles those); `i` is advanced past consumed values.
struct KernelSelection {
  const library::LibraryKernel* kernel = nullptr;
  lang::Meta meta;                 // the user's values
  jit::CompileOptions options;     // starts from the library's default schedule
  ir::Function build() const;      // the default meta under the user's
};
KernelSelection select_kernel(const std::string& name);
bool parse_kernel_option(const Args& args, size_t& i, KernelSelection& sel);
const std::string& option_value(const Args& args, size_t& i);
// VALUE of a meta-parameter on the command line: an integer, true/false or a dtype name.
// `context` starts the usage error ("--meta", "gemm:BLOCK_N=...").
ir::MetaValue parse_meta_value(const std::string& context, const std::string& name, const std::string& value);
int parse_int(const std::string& context, const std::string& value);

}  // namespace tilejit::cli
