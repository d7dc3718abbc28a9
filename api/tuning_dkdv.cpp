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

// Key rows in 64-row slabs, one per warpgroup, on the wgmma path (jit/wgmma_plan).
bool on_wgmma(const TuningConfig& c, const TuningContext& ctx) {
  return ctx.arch == "sm_90a" && c.get("warps") % 4 == 0 && c.get(mn::kBlockN) % (64 * (c.get("warps") / 4)) == 0;
}

Workload dkdv_workload(const TuningConfig& c, const TuningContext& ctx) {
  const int64_t B = dim(ctx, "B"), H = dim(ctx, "H"), S = dim(ctx, "S"), D = dim(ctx, "D");
  const int64_t bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN), warps = c.get("warps");
  const bool causal = ctx.meta_bool(mn::kCausal, false);
  const double e = static_cast<double>(ir::byte_size(meta_dtype(ctx, mn::kDtype, ir::DType::bf16)));
  Workload w;
  // S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q: 8 x S^2 x D per head (half when causal)
  w.flops = 8.0 * B * H * static_cast<double>(S) * S * D / (causal ? 2.0 : 1.0);
  w.programs = cdiv(S, bn) * H * B;
  w.threads = static_cast<int>(32 * warps);
  const double visits = static_cast<double>(cdiv(S, bm)) * (causal ? 0.5 : 1.0) + (causal ? 0.5 : 0.0);
  w.k_iterations = visits;
  w.mma_flops = 8.0 * static_cast<double>(w.programs) * visits * bm * bn * D;
  w.wgmma = on_wgmma(c, ctx);
  w.stages = w.wgmma ? static_cast<int>(c.get("stages")) : 1;
  w.dram_bytes = 6.0 * B * H * static_cast<double>(S) * D * e + 8.0 * B * H * S;
  w.l2_bytes = static_cast<double>(w.programs) * visits * 2.0 * bm * D * e + 4.0 * B * H * static_cast<double>(S) * D * e;
  w.smem_bytes = static_cast<double>(w.programs) * visits * (6.0 * bm * D * e + 2.0 * bm * bn * e);
  w.est_smem_bytes = (2 * bn * D + w.stages * 2 * bm * D) * static_cast<int64_t>(e) + 1024;
  // A query block visit per warpgroup (its 64 key rows): the four dots, an exponential per score,
  // ~10 FP32 lane-ops (scale, LSE, dS = P (dP - Delta), two conversions) and ~250 instructions a
  // thread that do not scale with the tile (LSE and Delta moved into the transposed layout, the
  // barriers around them, addresses): fitted to the H200 sweep (docs/performance-model.md)
  runtime::ChainWorkload& ch = w.chain;
  ch.present = true;
  ch.chains_per_program = w.wgmma ? static_cast<int>(warps / 4) : 1;
  const double rows = static_cast<double>(bn) / ch.chains_per_program;
  ch.steps = static_cast<double>(w.programs) * visits * ch.chains_per_program;
  ch.mma_flops = 8.0 * rows * static_cast<double>(bm * D);
  ch.operand_bytes = (2.0 * rows * D + 4.0 * bm * D) * e;
  ch.exponentials = rows * static_cast<double>(bm);
  ch.fp32_ops = 10.0 * rows * static_cast<double>(bm) + 128.0 * 250;
  // per consumer thread, each 64-row slab: dK and dV (f32), S^T and dP^T, ~24 more
  const int64_t slabs = w.wgmma ? std::max<int64_t>(1, bn / (64 * ch.chains_per_program)) : 1;
  ch.register_demand = static_cast<int>(slabs * (D + bm) + 24);
  const int64_t bound = std::max<int64_t>(1, c.get(runtime::kMinProgramsParam));
  ch.register_cap = static_cast<int>(std::min<int64_t>(255, 65536 / (32 * warps * bound) / 8 * 8));
  w.est_registers = std::min(ch.register_cap, ch.register_demand + 32);
  ch.tiles = static_cast<double>(w.programs);
  ch.bulk_epilogue = flag(c, mn::kTmaStore);
  ch.row_reductions = false;  // P = exp(S - LSE) element by element
  ch.lockstep = true;         // bar.sync every query block (LSE and Delta exchange)
  return w;
}

runtime::ProblemData dkdv_problem(const TuningContext& ctx) {
  const int64_t B = dim(ctx, "B"), H = dim(ctx, "H"), S = dim(ctx, "S"), D = dim(ctx, "D");
  const ir::DType t = meta_dtype(ctx, mn::kDtype, ir::DType::bf16);
  const bool causal = ctx.meta_bool(mn::kCausal, false);
  const ir::Shape qkv = ctx.meta_bool(mn::kBshd, false) ? ir::Shape{B, S, H, D} : ir::Shape{B, H, S, D};
  runtime::ProblemData d;
  // Q, K, V, dO; small scores (N(0, 0.3) entries) so that the softmax is near uniform and LSE is
  // known without a forward pass: ln of the keys a row sees (S, or i + 1 causal)
  for (int i = 0; i < 4; ++i) {
    d.tensors.push_back(std::make_unique<runtime::HostTensor>(t, qkv));
    d.tensors.back()->fill_normal_parallel(static_cast<uint64_t>(i + 11), 0, i < 2 ? 0.3 : 1.0);
  }
  auto lse = std::make_unique<runtime::HostTensor>(ir::DType::f32, ir::Shape{B, H, S});
  auto* l = static_cast<float*>(lse->data());
  for (int64_t r = 0; r < B * H; ++r)
    for (int64_t i = 0; i < S; ++i) l[r * S + i] = static_cast<float>(std::log(static_cast<double>(causal ? i + 1 : S)));
  d.tensors.push_back(std::move(lse));
  d.tensors.push_back(std::make_unique<runtime::HostTensor>(ir::DType::f32, ir::Shape{B, H, S}));
  d.tensors.back()->fill_normal_parallel(15, 0, 0.1);  // Delta = rowsum(dO * O): any finite values
  for (int i = 0; i < 2; ++i) d.tensors.push_back(std::make_unique<runtime::HostTensor>(t, qkv));  // dK, dV
  for (auto& x : d.tensors) d.args.emplace_back(*x);
  d.args.emplace_back(static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
  d.outputs = {6, 7};
  d.tolerance = 2e-2;  // tiles change the f32 sums' order
  return d;
}

// What attention::backward launches as dK/dV for this problem with the recompute reduction: its
// schedule and ring options (dkdv_ring_options), every option as the kernel resolves it.
TuningConfig api_default(const TuningContext& ctx) {
  attention::detail::Config a{};
  a.pass = attention::Pass::bwd_dkdv;
  a.dtype = meta_dtype(ctx, mn::kDtype, ir::DType::bf16);
  a.head_dim = static_cast<int>(dim(ctx, "D"));
  a.causal = ctx.meta_bool(mn::kCausal, false);
  a.sch = attention::default_schedule(attention::Pass::bwd_dkdv, a.dtype, a.head_dim, a.causal, false,
                                      kernels::DqReduction::recompute, false);
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
