// Lowering of the tile IR to the per-thread IR: every tile value becomes a set of registers per
// thread as its layout says; layout changes, reductions across warps and dot operands go through
// shared memory; dot runs on tensor cores (mma.sync m16n8k16) where the plan allows.
#pragma once
#include <stdexcept>

#include "dsl/ir/function.hpp"
#include "jit/assign_layouts.hpp"
#include "jit/thread_ir.hpp"

namespace tilejit::jit {

pir::Func lower_to_threads(const ir::Function& f, const LayoutPlan& plan);

}  // namespace tilejit::jit
