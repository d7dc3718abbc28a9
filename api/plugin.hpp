// Your kernels in the tilejit tools: a plugin is a shared library of your own that registers
// kernels, described like the library's (api/registry.hpp), with TILEJIT_PLUGIN. `tilejit --plugin
// PATH ...` (or $TILEJIT_PLUGINS) loads it, and every command takes its kernels by name:
//
//   #include <tilejit/api/plugin.hpp>
//   const tilejit::lang::Kernel& my_kernel();             // returns a function-local static Kernel
//   TILEJIT_PLUGIN(registrar) {
//     registrar.add({.name = "my_kernel", .kernel = &my_kernel, .summary = "what it computes",
//                    .default_meta = {{"BLOCK", 128}}, .num_warps = 4, .stages = 2,
//                    .tuning_space = nullptr});   // every field named: GCC's -Wextra warns otherwise
//   }
//
// C++ objects (strings, vectors, kernels) cross between the plugin and the tool, so both must be
// built from the same tilejit and C++ library: the loader first reads a plain C stamp of what the
// plugin was built against and refuses a mismatch before any of them crosses (decision 048).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "api/registry.hpp"
#include "runtime/kernel_codec.hpp"
#include "runtime/tuning_space.hpp"

extern "C" {
// What a plugin was built against. Plain C and never changed, so that this tilejit can read the
// stamp of a plugin built against any other before calling anything else in it.
struct tilejit_plugin_abi_stamp {
  uint32_t abi;                 // tilejit::plugin::kAbi of the plugin's headers
  const char* tilejit_version;  // tilejit::runtime::codec::kTilejitVersion of the plugin's headers
  const char* cxx_library;      // tilejit::plugin::kCxxLibrary of the plugin's compiler
};
}

namespace tilejit::plugin {

// The plugin protocol's version: the registration entry's name and the Registrar below. Bumped
// with them; any tilejit version change is refused as well (the described types change with it).
inline constexpr uint32_t kAbi = 1;

// The C++ standard library's ABI the headers are compiled with: std::string and std::vector cross
// the boundary, and their layouts differ between these.
#if defined(_LIBCPP_VERSION)
inline constexpr const char* kCxxLibrary = "libc++";
#elif defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI && defined(_GLIBCXX_DEBUG)
inline constexpr const char* kCxxLibrary = "libstdc++ cxx11 ABI, debug mode";
#elif defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI
inline constexpr const char* kCxxLibrary = "libstdc++ cxx11 ABI";
#elif defined(__GLIBCXX__)
inline constexpr const char* kCxxLibrary = "libstdc++ pre-cxx11 ABI";
#else
inline constexpr const char* kCxxLibrary = "unknown C++ library";
#endif

// The symbols a plugin exports (TILEJIT_PLUGIN defines both).
inline constexpr const char* kStampSymbol = "tilejit_plugin_stamp";
inline constexpr const char* kRegisterSymbol = "tilejit_plugin_register_v1";

// What a plugin's registration function fills. Each row is a library row: name, builder of the
// Kernel, one-line summary, default meta, warps and stages, and optionally a tuning space (then
// `tilejit tune NAME --shape ...` takes the space's key dimensions in declaration order).
class Registrar {
 public:
  void add(library::LibraryKernel kernel) { kernels_.push_back(std::move(kernel)); }
  const std::vector<library::LibraryKernel>& kernels() const { return kernels_; }

 private:
  std::vector<library::LibraryKernel> kernels_;
};

using RegisterFunction = void (*)(Registrar&);
using StampFunction = const tilejit_plugin_abi_stamp* (*)();

}  // namespace tilejit::plugin

// Defines a plugin's two entry points (at namespace scope, once per plugin); the braces that
// follow are the registration function's body, with `registrar_name` its Registrar&.
#define TILEJIT_PLUGIN(registrar_name)                                                                             \
  extern "C" __attribute__((visibility("default"))) const tilejit_plugin_abi_stamp* tilejit_plugin_stamp() {      \
    static const tilejit_plugin_abi_stamp stamp{::tilejit::plugin::kAbi,                                          \
                                                ::tilejit::runtime::codec::kTilejitVersion.data(),                \
                                                ::tilejit::plugin::kCxxLibrary};                                  \
    return &stamp;                                                                                                 \
  }                                                                                                                \
  static void tilejit_plugin_register_body(::tilejit::plugin::Registrar&);                                         \
  extern "C" __attribute__((visibility("default"))) void tilejit_plugin_register_v1(::tilejit::plugin::Registrar& r) { \
    tilejit_plugin_register_body(r);                                                                               \
  }                                                                                                                \
  static void tilejit_plugin_register_body(::tilejit::plugin::Registrar& registrar_name)
