// The kernel library by name, for tools (the `tilejit` CLI) and bundles: each entry builds its
// kernel on demand and says in one line what it computes.
#pragma once
#include <string>
#include <vector>

#include "dsl/lang.hpp"

namespace tilejit::kernels {

struct LibraryKernel {
  std::string name;
  const lang::Kernel& (*kernel)();
  std::string summary;
  // The default schedule: meta values layered under the user's, warps and pipeline stages.
  lang::Meta default_meta;
  int num_warps = 4;
  int stages = 3;
};

const std::vector<LibraryKernel>& library();
const LibraryKernel* find(const std::string& name);  // nullptr when unknown

}  // namespace tilejit::kernels
