// What the library's tuning spaces (api/tuning.cpp, tuning_attention.cpp, tuning_dkdv.cpp, tuning_dq.cpp) share: small
// helpers over configs and contexts, and the spaces' constructors.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string_view>

#include "api/attention.hpp"
#include "api/attention/internal.hpp"
#include "runtime/tuning_space.hpp"

namespace tilejit::library::tuning_detail {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The fixed meta's dtype `name`, else `fallback`.
inline ir::DType meta_dtype(const runtime::TuningContext& ctx, std::string_view name, ir::DType fallback) {
  for (const auto& [n, v] : ctx.fixed)
    if (n == name)
      if (const ir::DType* d = std::get_if<ir::DType>(&v)) return *d;
  return fallback;
}

inline bool meta_bool_of(const lang::Meta& m, std::string_view name, bool fallback) {
  for (const auto& [n, v] : m)
    if (n == name)
      if (const bool* b = std::get_if<bool>(&v)) return *b;
  return fallback;
}

// Size `dim` of call argument `i` (a key extractor); std::invalid_argument naming the kernel.
inline int64_t arg_size(std::span<const runtime::DeviceArg> args, size_t i, int dim, std::string_view kernel) {
  if (i >= args.size() || !args[i].tensor() || args[i].tensor()->rank() <= dim)
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}': argument {} must be a tensor of rank > {} to key its tuning", kernel, i, dim));
  return args[i].tensor()->sizes[static_cast<size_t>(dim)];
}

// The problem's dimension `name` (std::out_of_range naming it when the shape has none).
inline int64_t dim(const runtime::TuningContext& ctx, const char* name) { return runtime::shape_get(ctx.shape, name); }

// A bool parameter's value in `c` (configs persisted before the parameter existed lack it: false).
inline bool flag(const runtime::TuningConfig& c, const char* name) { return c.find(name).value_or(0) != 0; }

runtime::TuningSpace make_attention_space();
// The attention spaces' keys B, H, S, D, read from argument 0 (Q) in its layout (BSHD or not).
void attention_keys(runtime::TuningSpace& s, const char* kernel);
// What the attention API configures for pass `p` of a dense call of this problem before any
// tuned choice: dtype, head dim and causal from the fixed meta, the pass's default schedule
// (dK/dV: the fixed DQ_REDUCTION's, recompute when unset; dropout where the fixed meta says so).
attention::detail::Config api_config(attention::Pass p, const runtime::TuningContext& ctx);
// A config of an attention space: the API's schedule, then `flags` as the built kernel `f` resolved them.
runtime::TuningConfig config_of(const attention::Schedule& sch, const ir::Function& f, std::span<const char* const> flags);
runtime::TuningSpace make_dkdv_space();
runtime::TuningSpace make_dq_space();
// api/tuning_backward.cpp: the backward kernels' tuning inputs, tensors only: Q, K, V, dO (BSHD
// when the fixed meta says so), LSE and Delta, with small scores so that LSE is known without a
// forward pass.
runtime::ProblemData backward_problem_inputs(const runtime::TuningContext& ctx);
// A backward kernel's main loop: a program keeps `tile` rows (dK/dV: BLOCK_N keys; dQ: BLOCK_M
// queries) and streams the other side's `step`-row blocks past them.
struct BackwardLoop {
  int64_t tile = 64, step = 64;
  int dots = 4;                 // matmuls a step: dK/dV 4 (S^T, dP^T, dV, dK), dQ 3 (S, dP, dQ)
  int outputs = 2;              // f32 accumulators of tile x D: dK and dV, or dQ
  double fp32_per_score = 10;   // the elementwise softmax gradient's lane-ops a score
  double step_overhead = 250;   // instructions a thread each step that do not scale with the tile
  bool lockstep = false;        // the warpgroups meet at a CTA barrier every step (dK/dV)
  bool overlapped = false;      // the step's dots stay in flight beside its exponentials (dQ: S and dP issued together)
};
// Tile rows in 64-row slabs, one per warpgroup, on the wgmma path (jit/wgmma_plan).
bool backward_on_wgmma(const runtime::TuningConfig& c, const runtime::TuningContext& ctx, int64_t tile);
runtime::Workload backward_workload(const runtime::TuningConfig& c, const runtime::TuningContext& ctx, const BackwardLoop& k);

}  // namespace tilejit::library::tuning_detail
