// The kernel library by name, for tools (the `tilejit` CLI) and bundles: each entry builds its
// kernel on demand and says in one line what it computes. Plugins (api/plugin.hpp) add rows of
// the same shape at run time.
#pragma once
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "runtime/bundle.hpp"

namespace tilejit::runtime {
class TuningSpace;
}

namespace tilejit::library {

struct LibraryKernel {
  std::string name;
  const lang::Kernel& (*kernel)();
  std::string summary;
  // The default schedule: meta values layered under the user's, warps and pipeline stages.
  lang::Meta default_meta;
  int num_warps = 4;
  int stages = 3;
  // What `tilejit tune` searches (runtime/tuning_space.hpp), or nullptr: the kernel is not tunable.
  const runtime::TuningSpace& (*tuning_space)() = nullptr;
};

const std::vector<LibraryKernel>& all();  // the library's own kernels
// A library or registered kernel by name; nullptr when unknown.
const LibraryKernel* find(const std::string& name);

// ---- kernels registered at run time (plugins) --------------------------------------------------

// Adds `kernels` after the library's, all or none: each needs a name of letters, digits and '_'
// (not starting with a digit) that no library or registered kernel has, and a kernel. `origin`
// says where they came from ("--plugin ./libk.so") in listings and errors. Throws
// std::invalid_argument naming the first bad entry and what is valid. Thread-safe; a row, once
// registered, stays at its address until exit.
void register_kernels(const std::vector<LibraryKernel>& kernels, const std::string& origin);
struct RegisteredKernel {
  const LibraryKernel* kernel;
  std::string origin;
};
std::vector<RegisteredKernel> registered();  // in registration order
// The origin of a registered kernel; "" for a library kernel or an unknown name.
std::string origin_of(const std::string& name);

// A bundle entry for library kernel `kernel` at its default schedule (its warps and pipeline
// stages) with `meta` over its default meta: what `tilejit bundle KERNEL[:NAME=VALUE,...]` writes,
// and what an application builds to find the same entry. Throws std::invalid_argument for an
// unknown kernel.
runtime::BundleEntrySpec bundle_spec(const std::string& kernel, lang::Meta meta = {});

}  // namespace tilejit::library
