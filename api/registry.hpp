// The kernel library by name, for tools (the `tilejit` CLI) and bundles: each entry builds its
// kernel on demand and says in one line what it computes.
#pragma once
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "runtime/bundle.hpp"

namespace tilejit::library {

struct LibraryKernel {
  std::string name;
  const lang::Kernel& (*kernel)();
  std::string summary;
  // The default schedule: meta values layered under the user's, warps and pipeline stages.
  lang::Meta default_meta;
  int num_warps = 4;
  int stages = 3;
};

const std::vector<LibraryKernel>& all();
const LibraryKernel* find(const std::string& name);  // nullptr when unknown

// A bundle entry for library kernel `kernel` at its default schedule (its warps and pipeline
// stages) with `meta` over its default meta: what `tilejit bundle KERNEL[:NAME=VALUE,...]` writes,
// and what an application builds to find the same entry. Throws std::invalid_argument for an
// unknown kernel.
runtime::BundleEntrySpec bundle_spec(const std::string& kernel, lang::Meta meta = {});

}  // namespace tilejit::library
