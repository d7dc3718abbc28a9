// Layout assignment: the distributed layout each tile value is computed in. Anchors (memory ops,
// dot, reductions, loop-carried values) get concrete layouts; views and constants stay flexible.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "dsl/ir/function.hpp"
#include <map>

#include "jit/layout.hpp"
#include "jit/tma_pipeline.hpp"
#include "jit/wgmma_plan.hpp"

namespace tilejit::jit {

// The registers a thread starts with when a launch of `num_warps` warps is capped to fill a
// multiprocessor's 65536 (what setmaxnreg moves from one warp role to another).
inline int entry_register_cap(int num_warps) { return 65536 / (32 * num_warps) / 8 * 8; }

// One role of a warp_roles op (lang::warp_roles), resolved against the launch's warps.
struct WarpRolePlan {
  int first_warp = 0, warps = 0;
  int max_registers = 0;  // 0: no setmaxnreg
};

struct LayoutPlan {
  int num_warps = 4;  // the launch's; a warp role's code runs on the role's warps (op_warps)
  std::map<const ir::Op*, std::vector<WarpRolePlan>> roles;  // by warp_roles op
  std::map<const ir::Op*, int> op_warps;                     // ops inside a role: the role's warps
  int warps_at(const ir::Op* op) const {
    auto it = op_warps.find(op);
    return it == op_warps.end() ? num_warps : it->second;
  }
  // Per ValueId: the layout the value is computed in, or nullopt for scalars and for flexible
  // values (constants, aranges, splats, broadcasts, reshapes, trans, and elementwise ops on only
  // those), which lowering materialises directly in whatever layout each use asks for.
  std::vector<std::optional<Layout>> natural;
  // K loops lowered to the TMA + wgmma pipeline (their dot accumulates in the wgmma layout).
  std::map<const ir::Op*, TmaDotLoop> tma_loops;
  // Other dots on wgmma with shared-memory tiles (sm_90a): accumulate in the wgmma layout.
  HopperPlan hopper;
};

// The dot configuration: mma.sync m16n8k16 when shapes and dtypes allow, FMA otherwise.
struct DotPlan {
  bool mma = false;
  int warps_m = 1, warps_n = 1;
};
DotPlan plan_dot(const ir::Type& a, const ir::Type& b, int num_warps);

// Elements per thread along the fastest dim for 16-byte accesses.
int vector_width(ir::DType d, int64_t last_dim);

LayoutPlan assign_layouts(const ir::Function& f, int num_warps, const std::string& arch = "sm_90a",
                          const PipelineOptions& pipeline = {});
std::string print_with_layouts(const ir::Function& f, const LayoutPlan& plan);

}  // namespace tilejit::jit
