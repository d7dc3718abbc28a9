// The attention backward's dQ kernel (attention_bwd_dq: the recompute reduction's second kernel,
// S and P recomputed per query tile) as a tuning space: tiles, warps, stages and the register
// bound, with the API's own configuration of each problem as the default.
#include <cmath>

#include "api/attention/internal.hpp"
#include "api/tuning.hpp"
#include "api/tuning_internal.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::library::tuning_detail {

namespace mn = kernels::meta_name;
using runtime::TuningConfig;
using runtime::TuningContext;
using runtime::Workload;

namespace {

bool on_wgmma(const TuningConfig& c, const TuningContext& ctx) { return backward_on_wgmma(c, ctx, c.get(mn::kBlockM)); }

// A key block visit per query tile: S = Q K^T, dP = dO V^T, dQ += dS K; ~8 FP32 lane-ops a score.
// LSE and Delta are loaded once a tile: no bar.sync in the loop (its warpgroups do not meet), and
// ~300 fewer PTX instructions a step than dK/dV's at the same scores a thread, hence ~60 that do
// not scale (an estimate from the PTX). Overlapped: dP's wgmma is issued with S's and runs beside
// the exponentials (D 64 sweeps' Spearman 0.39-0.88 -> 0.61-0.79; D 128's unchanged).
Workload dq_workload(const TuningConfig& c, const TuningContext& ctx) {
  return backward_workload(c, ctx, {.tile = c.get(mn::kBlockM), .step = c.get(mn::kBlockN), .dots = 3, .outputs = 1,
                                    .fp32_per_score = 8, .step_overhead = 60, .lockstep = false, .overlapped = true});
}

runtime::ProblemData dq_problem(const TuningContext& ctx) {
  runtime::ProblemData d = backward_problem_inputs(ctx);
  d.tensors.push_back(std::make_unique<runtime::HostTensor>(d.tensors[0]->dtype(), d.tensors[0]->sizes()));  // dQ
  for (auto& x : d.tensors) d.args.emplace_back(*x);
  d.args.emplace_back(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim(ctx, "D")))));
  d.outputs = {6};
  d.tolerance = 2e-2;  // tiles change the f32 sums' order
  return d;
}

// What attention::backward launches as dQ for this problem with the recompute reduction.
TuningConfig api_default(const TuningContext& ctx) {
  const attention::detail::Config a = api_config(attention::Pass::bwd_dq, ctx);
  return config_of(a.sch, kernels::attention_backward_dq().build(runtime::layer_meta(attention::detail::meta_of(a), ctx.fixed)), {});
}

}  // namespace

runtime::TuningSpace make_dq_space() {
  runtime::TuningSpace s("attention_bwd_dq", &kernels::attention_backward_dq);
  s.param(mn::kBlockM, {64, 128}).param(mn::kBlockN, {64, 128}).param("warps", {4, 8}).param("stages", {2, 3});
  s.param(std::string(runtime::kMinProgramsParam), {0, 2, 3});
  attention_keys(s, "attention_bwd_dq");
  s.constrain("min_programs 2 or 3 only with 4 warps (the bound leaves 65536 / (threads x programs) registers a thread)",
              [](const TuningConfig& c, const TuningContext&) { return c.get(runtime::kMinProgramsParam) == 0 || c.get("warps") == 4; })
      .constrain("stages = 2 off the wgmma path (the generic path does not pipeline its loads)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return on_wgmma(c, ctx) || c.get("stages") == 2; })
      .constrain("the f32 accumulator (dQ) fits: BLOCK_M x HEAD_DIM / threads <= 128",
                 [](const TuningConfig& c, const TuningContext& ctx) { return c.get(mn::kBlockM) * dim(ctx, "D") / (32 * c.get("warps")) <= 128; })
      .constrain("shared memory fits: Q and dO once + stages x (K and V blocks)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   const int64_t D = dim(ctx, "D"), bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN);
                   return (2 * bm * D + c.get("stages") * 2 * bn * D) * 2 + 1024 <= ctx.smem_limit;
                 })
      .default_config({{{mn::kBlockM, 64}, {mn::kBlockN, 64}, {"warps", 4}, {"stages", 2}, {std::string(runtime::kMinProgramsParam), 0}}})
      .default_for(api_default)
      .workload(dq_workload)
      .problem(dq_problem)
      .grid([](const TuningConfig& c, const TuningContext& ctx) {
        return runtime::Grid{cdiv(dim(ctx, "S"), c.get(mn::kBlockM)), dim(ctx, "H"), dim(ctx, "B")};
      });
  return s;
}

}  // namespace tilejit::library::tuning_detail
