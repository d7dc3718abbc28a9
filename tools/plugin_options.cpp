// --plugin PATH (any command, repeatable) and $TILEJIT_PLUGINS: plugins load before the command
// runs, so every command finds their kernels by name like the library's.
#include <fmt/format.h>

#include "api/plugin_loader.hpp"
#include "commands.hpp"

namespace tilejit::cli {

Args load_plugins(const Args& args) {
  plugin::load_from_environment();  // first: --plugin then adds to what the environment gives
  Args rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--plugin") {
      if (i + 1 >= args.size()) throw UsageError("--plugin needs a path (a shared library built with TILEJIT_PLUGIN)");
      plugin::load(args[++i], "--plugin");
    } else if (args[i].starts_with("--plugin=")) {
      plugin::load(args[i].substr(9), "--plugin");
    } else {
      rest.push_back(args[i]);
    }
  }
  return rest;
}

}  // namespace tilejit::cli
