// Canonicalisation of the tile IR: common-subexpression elimination of pure ops (scoped by
// regions) and dead-code elimination. Fewer duplicate tile ops means fewer layout exchanges.
#pragma once
#include "dsl/ir/function.hpp"

namespace tilejit::jit {

struct CanonicalizeStats {
  int cse_removed = 0;
  int dce_removed = 0;
};

CanonicalizeStats canonicalize(ir::Function& f);

}  // namespace tilejit::jit
