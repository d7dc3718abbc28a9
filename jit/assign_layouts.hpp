// Layout assignment: the distributed layout each tile value is computed in. Anchors (memory ops,
// dot, reductions, loop-carried values) get concrete layouts; views and constants stay flexible.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "dsl/ir/function.hpp"
#include <map>

#include "jit/dot_plan.hpp"
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

// lang::ring_producer: a warpgroup beyond num_warps that fills the TMA rings.
struct RingProducerPlan {
  static constexpr int kWarps = 4;  // setmaxnreg acts on whole warpgroups
  int producer_registers = 24, consumer_registers = 240;
  bool coordinates_at_use = false;  // RingProducer::coordinates_at_use
};

// The warps each op's code runs on: lang::warp_roles resolved against the launch (resolve_warp_roles).
struct WarpRoles {
  int num_warps = 4;  // the launch's; a warp role's code runs on the role's warps (op_warps)
  // lang::ring_producer: num_warps run the kernel, RingProducerPlan::kWarps more fill its rings
  std::optional<RingProducerPlan> ring_producer;
  std::map<const ir::Op*, std::vector<WarpRolePlan>> roles;  // by warp_roles op
  std::map<const ir::Op*, int> op_warps;                     // ops inside a role: the role's warps
  int warps_at(const ir::Op* op) const {
    auto it = op_warps.find(op);
    return it == op_warps.end() ? num_warps : it->second;
  }
};

// What the lowering follows: the warp roles, the Hopper plans, and a layout per tile value.
struct LayoutPlan : WarpRoles {
  // Per ValueId: the layout the value is computed in, or nullopt for scalars and for flexible
  // values (constants, aranges, splats, broadcasts, reshapes, trans, and elementwise ops on only
  // those), which lowering materialises directly in whatever layout each use asks for.
  std::vector<std::optional<Layout>> natural;
  // K loops lowered to the TMA + wgmma pipeline (their dot accumulates in the wgmma layout).
  std::map<const ir::Op*, TmaDotLoop> tma_loops;
  // Other dots on wgmma with shared-memory tiles (sm_90a): accumulate in the wgmma layout.
  HopperPlan hopper;
};

// Elements per thread along the fastest dim for 16-byte accesses.
int vector_width(ir::DType d, int64_t last_dim);
// The layout a scan, reduce_with or xor_permute runs in: its first operand layout whose axis bits are
// separate (Layout::axis_bits_separate), else `blocked` (the operands are converted to it).
Layout combine_layout(const ir::Op& op, const LayoutPlan& plan, const Layout& blocked);

// Layout assignment runs in steps, which jit/compile.cpp calls in this order:
//   check_tile_shapes: layouts are linear maps over bits, so every tile dimension is a power of two;
//   resolve_warp_roles: the warps each op runs on;
//   match_tma_loops (tma_pipeline.hpp): the GEMM K loops the TMA + wgmma pipeline lowers (sm_90a);
//   plan_wgmma (wgmma_plan.hpp): the other dots wgmma runs, with shared-memory tiles (sm_90a);
//   assign_layouts: the layout each tile value is computed in, given those plans.
void check_tile_shapes(const ir::Function& f);
WarpRoles resolve_warp_roles(const ir::Function& f, int num_warps);
// setmaxnreg (a ring producer, warp roles with max_registers) moves registers between the warpgroups
// of one program that holds a multiprocessor's register file: refuses a launch bound of more programs
// an SM (ptxas would, with an error about its temporal register count).
void check_register_rebalancing(const std::string& kernel, const WarpRoles& roles, int min_programs_per_sm);
LayoutPlan assign_layouts(const ir::Function& f, WarpRoles roles, TmaPlan tma, HopperPlan hopper);
// All the steps at once (for callers that want only the plan).
LayoutPlan assign_layouts(const ir::Function& f, int num_warps, const std::string& arch = "sm_90a",
                          const PipelineOptions& pipeline = {});
std::string print_with_layouts(const ir::Function& f, const LayoutPlan& plan);

}  // namespace tilejit::jit
