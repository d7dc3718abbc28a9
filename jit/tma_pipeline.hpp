// Recognises the loops the Hopper pipeline lowers (sm_90a): a K loop whose carried accumulator is
// updated by dot(window of A, trans(window of B^T)) or dot(window of A, window of B), with A
// K-major and B either way, all TMA-shaped, beside any side work that does not read them. They become a ring of shared-memory stages filled by
// TMA behind mbarriers, consumed by wgmma.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsl/ir/function.hpp"

namespace tilejit::jit {

struct PipelineOptions {
  bool enabled = true;  // only on sm_90a
  int stages = 3;
  // false: windows loaded once (outside loops) that feed a wgmma as A go through registers, not
  // TMA (what a tensor without a 16-byte alignment promise gets); for testing that path on every
  // kernel. Part of the cache and bundle keys when false.
  bool once_by_tma = true;
};

struct TmaDotLoop {
  const ir::Op* loop = nullptr;
  const ir::Op* dot = nullptr;
  // A as A[BM, BK] (K-major: offsets (m, iv), consumed directly) or as A^T[BK, BM] (MN-major:
  // offsets (iv, m), consumed through trans; wgmma reads it transposed, imm-trans-a)
  const ir::Op* load_a = nullptr;
  bool a_mn_major = false;
  // B as B^T[BN, BK] (K-major: offsets (n, iv), consumed through trans) or as B[BK, BN]
  // (MN-major: offsets (iv, n), consumed directly; wgmma reads it transposed)
  const ir::Op* load_b = nullptr;
  bool b_mn_major = false;
  // Side work: the body's other ops, which read none of the above (e.g. a dropout mask generated
  // in the GEMM's spare issue slots, issue 7). Lowered in each iteration after its wgmmas are
  // issued and the previous stage refilled, so it runs while they do. Empty when the body holds
  // only the windows' scalar offsets.
  std::vector<const ir::Op*> side_ops;
  size_t acc_index = 0;            // which carried value is the accumulator
  int64_t bm = 0, bn = 0, bk = 0;
  int stages = 3;
};

// Why a loop is not pipelined is not an error: it is lowered by the generic path instead.
std::optional<TmaDotLoop> match_tma_dot_loop(const ir::Function& f, const ir::Op& loop, int num_warps,
                                             const std::string& arch, const PipelineOptions& opts);

// The K loops the pipeline lowers, by for op: the first Hopper step of layout assignment
// (assign_layouts.hpp).
struct TmaPlan {
  std::map<const ir::Op*, TmaDotLoop> loops;
};

// match_tma_dot_loop on every for loop of `f`. `op_warps`: ops inside warp roles, with their
// role's warps (others run on num_warps).
TmaPlan match_tma_loops(const ir::Function& f, int num_warps, const std::map<const ir::Op*, int>& op_warps,
                        const std::string& arch, const PipelineOptions& opts);
// `f`'s text, then the matched loops in program order (--dump-after match-tma).
std::string print_tma_plan(const ir::Function& f, const TmaPlan& plan);

}  // namespace tilejit::jit
