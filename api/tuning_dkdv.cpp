// The attention backward's dK/dV kernel as a tuning space: tiles, warps, stages, the register
// bound, LSE_IN_RING, TMA_STORE, and with the atomic reduction (the fixed DQ_REDUCTION=1: dQ's parts
// added into an f32 dQ_accum, the API's default on long dense calls) the ring producer and the dQ
// writer; recompute (unset: dQ by its own kernel) keeps both off. The API's own configuration of
// each problem is the default.
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

constexpr const char* kFlags[] = {mn::kLseInRing, mn::kTmaStore, mn::kRingProducer, mn::kDqWriter};

bool on_wgmma(const TuningConfig& c, const TuningContext& ctx) { return backward_on_wgmma(c, ctx, c.get(mn::kBlockN)); }

bool atomic(const TuningContext& ctx) { return ctx.meta_int(mn::kDqReduction, 0) == static_cast<int>(kernels::DqReduction::atomic); }

// A query block visit per key tile: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q; ~10
// FP32 lane-ops a score (scale, LSE, dS = P (dP - Delta), two conversions); ~250 instructions a
// step that do not scale (LSE and Delta moved into the transposed layout, three bar.sync, the
// ring's copies): fitted to the H200 sweep (decision 082); the warpgroups meet at those barriers
// Atomic: a fifth dot (dQ's part, dS K) a step and its f32 adds through L2 (uncalibrated: the
// constants above were fitted to recompute's sweep).
Workload dkdv_workload(const TuningConfig& c, const TuningContext& ctx) {
  const bool adds = atomic(ctx);
  Workload w = backward_workload(c, ctx, {.tile = c.get(mn::kBlockN), .step = c.get(mn::kBlockM), .dots = adds ? 5 : 4, .outputs = 2,
                                          .fp32_per_score = 10, .step_overhead = 250, .lockstep = true});
  w.chain.bulk_epilogue = flag(c, mn::kTmaStore);
  if (adds) w.l2_bytes += w.k_iterations * static_cast<double>(w.programs * c.get(mn::kBlockM) * dim(ctx, "D")) * 4.0;
  return w;
}

runtime::ProblemData dkdv_problem(const TuningContext& ctx) {
  runtime::ProblemData d = backward_problem_inputs(ctx);
  const ir::Shape qkv = d.tensors[0]->sizes();
  for (int i = 0; i < 2; ++i) d.tensors.push_back(std::make_unique<runtime::HostTensor>(d.tensors[0]->dtype(), qkv));  // dK, dV
  // atomic: dQ_accum, f32 [B, H, S, D], zero (its sums grow over the timed launches: not compared)
  if (atomic(ctx)) {
    d.tensors.push_back(std::make_unique<runtime::HostTensor>(ir::DType::f32, ir::Shape{dim(ctx, "B"), dim(ctx, "H"), dim(ctx, "S"), dim(ctx, "D")}));
    d.tensors.back()->fill(0.0);
  }
  for (auto& x : d.tensors) d.args.emplace_back(*x);
  d.args.emplace_back(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim(ctx, "D")))));
  d.outputs = {6, 7};
  d.tolerance = 2e-2;  // tiles change the f32 sums' order
  return d;
}

// What attention::backward launches as dK/dV for this problem with its reduction (the fixed
// DQ_REDUCTION): its schedule and ring options (dkdv_ring_options), every option as the kernel
// resolves it.
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
  s.constrain("RING_PRODUCER and DQ_WRITER with DQ_REDUCTION=1 (atomic) only; DQ_WRITER needs RING_PRODUCER",
              [](const TuningConfig& c, const TuningContext& ctx) {
                return (atomic(ctx) || (!flag(c, mn::kRingProducer) && !flag(c, mn::kDqWriter))) &&
                       (!flag(c, mn::kDqWriter) || flag(c, mn::kRingProducer));
              })
      .constrain("RING_PRODUCER on the wgmma path with 8 warps and no register bound (the producer's warpgroup takes its "
                 "registers with setmaxnreg)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return !flag(c, mn::kRingProducer) || (on_wgmma(c, ctx) && c.get("warps") == 8 && c.get(runtime::kMinProgramsParam) == 0);
                 });
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
                        {mn::kLseInRing, 0}, {mn::kTmaStore, 0}, {mn::kRingProducer, 0}, {mn::kDqWriter, 0}}})
      .default_for(api_default)
      .workload(dkdv_workload)
      .problem(dkdv_problem)
      .grid([](const TuningConfig& c, const TuningContext& ctx) {
        return runtime::Grid{cdiv(dim(ctx, "S"), c.get(mn::kBlockN)), dim(ctx, "H"), dim(ctx, "B")};
      });
  return s;
}

}  // namespace tilejit::library::tuning_detail
