// Plugins the loader must refuse with a clear error, one per definition (tests/CMakeLists.txt
// builds each as its own library):
//   BAD_PLUGIN_STALE      the stamp of another tilejit version: what an old build exports
//   BAD_PLUGIN_NO_ENTRY   a shared library with neither entry point
//   BAD_PLUGIN_DUPLICATE  a kernel named like a library kernel (gemm)
//   BAD_PLUGIN_THROWS     a registration that throws
#include "api/plugin.hpp"

#if defined(BAD_PLUGIN_STALE)
#include <cstdlib>

// Written by hand (TILEJIT_PLUGIN would stamp this tilejit's version): only the stamp's shape is
// the same in every version.
extern "C" __attribute__((visibility("default"))) const tilejit_plugin_abi_stamp* tilejit_plugin_stamp() {
  static const tilejit_plugin_abi_stamp stamp{tilejit::plugin::kAbi, "0.0.9", tilejit::plugin::kCxxLibrary};
  return &stamp;
}
// Calling it would mean the stamp was not checked first.
extern "C" __attribute__((visibility("default"))) void tilejit_plugin_register_v1(tilejit::plugin::Registrar&) { std::abort(); }

#elif defined(BAD_PLUGIN_NO_ENTRY)
extern "C" __attribute__((visibility("default"))) int not_a_tilejit_plugin() { return 1; }

#elif defined(BAD_PLUGIN_DUPLICATE)
namespace {
const tilejit::lang::Kernel& copy() {
  static const tilejit::lang::Kernel k = tilejit::lang::kernel("gemm", [](tilejit::lang::Builder& b) { b.scalar<int>("n"); });
  return k;
}
}  // namespace
TILEJIT_PLUGIN(registrar) {
  registrar.add({.name = "gemm", .kernel = &copy, .summary = "a second gemm", .default_meta = {}, .num_warps = 4, .stages = 3,
                 .tuning_space = nullptr});
}

#elif defined(BAD_PLUGIN_THROWS)
#include <stdexcept>
TILEJIT_PLUGIN(registrar) {
  (void)registrar;
  throw std::runtime_error("the plugin's own configuration is missing");
}

#else
#error "define one of the BAD_PLUGIN_* cases"
#endif
