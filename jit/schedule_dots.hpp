// Issue order for the Hopper path: each dot moves up, within its block, to just after the last
// op that defines one of its operands (a single-use trans feeding it moves along). The lowering
// leaves a wgmma group in flight until its result is read, so a dot that does not depend on the
// code before it (the backward's dP^T = V dO^T next to P^T = exp2(K Q^T ...)) then overlaps with it.
#pragma once
#include "dsl/ir/function.hpp"

namespace tilejit::jit {

// Returns how many dots moved. Pure reordering: every op still follows its operands' definitions.
int hoist_dots(ir::Function& f);

}  // namespace tilejit::jit
