// The attention backward's dK/dV kernel (the deterministic recompute reduction: dQ by its own
// kernel) as a tuning space: tiles, warps, stages, the register bound, LSE_IN_RING and TMA_STORE,
// with the API's own configuration of each problem as the default.
#include <cmath>

#include "api/attention/internal.hpp"
#include "api/tuning.hpp"
#include "api/tuning_internal.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::library::tuning_detail {

namespace mn = kernels::meta_name;
using runtime::Bucketing;
using runtime::DeviceArg;
using runtime::TuningConfig;
using runtime::TuningContext;
using runtime::Workload;

namespace {

constexpr const char* kFlags[] = {mn::kLseInRing, mn::kTmaStore};

bool on_wgmma(const TuningConfig& c, const TuningContext& ctx) { return backward_on_wgmma(c, ctx, c.get(mn::kBlockN)); }

// A query block visit per key tile: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q; ~10
// FP32 lane-ops a score (scale, LSE, dS = P (dP - Delta), two conversions); ~250 instructions a
// step that do not scale (LSE and Delta moved into the transposed layout, three bar.sync, the
// ring's copies): fitted to the H200 sweep (decision 082); the warpgroups meet at those barriers
Workload dkdv_workload(const TuningConfig& c, const TuningContext& ctx) {
  Workload w = backward_workload(c, ctx, {.tile = c.get(mn::kBlockN), .step = c.get(mn::kBlockM), .dots = 4, .outputs = 2,
                                          .fp32_per_score = 10, .step_overhead = 250, .lockstep = true});
  w.chain.bulk_epilogue = flag(c, mn::kTmaStore);
  return w;
}

runtime::ProblemData dkdv_problem(const TuningContext& ctx) {
  runtime::ProblemData d = backward_problem_inputs(ctx);
  const ir::Shape qkv = d.tensors[0]->sizes();
  for (int i = 0; i < 2; ++i) d.tensors.push_back(std::make_unique<runtime::HostTensor>(d.tensors[0]->dtype(), qkv));  // dK, dV
  for (auto& x : d.tensors) d.args.emplace_back(*x);
  d.args.emplace_back(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim(ctx, "D")))));
  d.outputs = {6, 7};
  d.tolerance = 2e-2;  // tiles change the f32 sums' order
  return d;
}

// What attention::backward launches as dK/dV for this problem with the recompute reduction: its
// schedule and ring options (dkdv_ring_options), every option as the kernel resolves it.
TuningConfig api_default(const TuningContext& ctx) {
  attention::detail::Config a = api_config(attention::Pass::bwd_dkdv, ctx);
  const attention::detail::DkdvRingOptions r = attention::detail::dkdv_ring_options(a, true);
  a.lse_in_ring = r.lse_in_ring, a.ring_producer = r.ring_producer, a.dq_writer = r.dq_writer;
  return config_of(a.sch, kernels::attention_backward_dkdv().build(runtime::layer_meta(attention::detail::meta_of(a), ctx.fixed)), kFlags);
}

}  // namespace

runtime::TuningSpace make_dkdv_space() {
  runtime::TuningSpace s("attention_bwd_dkdv", &kernels::attention_backward_dkdv);
  s.param(mn::kBlockM, {64, 128}).param(mn::kBlockN, {64, 128}).param("warps", {4, 8}).param("stages", {2, 3});
  s.param(std::string(runtime::kMinProgramsParam), {0, 2, 3});
  for (const char* name : kFlags) s.param_bool(name);
  attention_keys(s, "attention_bwd_dkdv");
  s.constrain("min_programs 2 or 3 only with 4 warps (the bound leaves 65536 / (threads x programs) registers a thread)",
              [](const TuningConfig& c, const TuningContext&) { return c.get(runtime::kMinProgramsParam) == 0 || c.get("warps") == 4; })
      .constrain("stages = 2 off the wgmma path (the generic path does not pipeline its loads)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return on_wgmma(c, ctx) || c.get("stages") == 2; })
      .constrain("LSE_IN_RING and TMA_STORE on the wgmma path (TMA rings and bulk stores)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return (!flag(c, mn::kLseInRing) && !flag(c, mn::kTmaStore)) || on_wgmma(c, ctx);
                 })
      .constrain("the two f32 accumulators (dK, dV) fit: 2 x BLOCK_N x HEAD_DIM / threads <= 128",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return 2 * c.get(mn::kBlockN) * dim(ctx, "D") / (32 * c.get("warps")) <= 128;
                 })
      .constrain("shared memory fits: K and V once + stages x (Q and dO blocks)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   const int64_t D = dim(ctx, "D"), bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN);
                   return (2 * bn * D + c.get("stages") * 2 * bm * D) * 2 + 1024 <= ctx.smem_limit;
                 })
      .default_config({{{mn::kBlockM, 64}, {mn::kBlockN, 64}, {"warps", 4}, {"stages", 2}, {std::string(runtime::kMinProgramsParam), 0},
                        {mn::kLseInRing, 0}, {mn::kTmaStore, 0}}})
      .default_for(api_default)
      .workload(dkdv_workload)
      .problem(dkdv_problem)
      .grid([](const TuningConfig& c, const TuningContext& ctx) {
        return runtime::Grid{cdiv(dim(ctx, "S"), c.get(mn::kBlockN)), dim(ctx, "H"), dim(ctx, "B")};
      });
  return s;
}

}  // namespace tilejit::library::tuning_detail
