// What the attention kernels' tuning spaces share: the API's configuration of a problem, and for the
// backward's (api/tuning_dkdv.cpp, api/tuning_dq.cpp) the problem's inputs and the workload of a
// kernel that keeps a tile of rows and streams the other side's blocks past it.
#include <cmath>

#include "api/tuning_internal.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::library::tuning_detail {

namespace mn = kernels::meta_name;
using runtime::TuningConfig;
using runtime::TuningContext;
using runtime::Workload;

runtime::ProblemData backward_problem_inputs(const TuningContext& ctx) {
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
  return d;
}

attention::detail::Config api_config(attention::Pass p, const TuningContext& ctx) {
  attention::detail::Config a{};
  a.pass = p;
  a.dtype = meta_dtype(ctx, mn::kDtype, ir::DType::bf16);
  a.head_dim = static_cast<int>(dim(ctx, "D"));
  a.causal = ctx.meta_bool(mn::kCausal, false);
  a.dropout = ctx.meta_bool(mn::kDropout, false);
  // (a fixed MASK or SCORE_MOD meta: the tiles the API takes for such calls)
  // (the kernels' MASK meta is the library mask's kind, 0 for none: CAUSAL is its own meta)
  // (dK/dV: the fixed DQ_REDUCTION, recompute or atomic; the other passes run with recompute)
  const auto reduction = p == attention::Pass::bwd_dkdv ? static_cast<kernels::DqReduction>(ctx.meta_int(mn::kDqReduction, 0))
                                                        : kernels::DqReduction::recompute;
  a.reduction = static_cast<int>(reduction);
  a.sch = attention::default_schedule(p, a.dtype, a.head_dim, a.causal, false, reduction, a.dropout, ctx.meta_int(mn::kMask, 0) != 0,
                                      ctx.meta_int(mn::kScoreMod, 0) != 0);
  return a;
}

bool backward_on_wgmma(const TuningConfig& c, const TuningContext& ctx, int64_t tile) {
  return ctx.arch == "sm_90a" && c.get("warps") % 4 == 0 && tile % (64 * (c.get("warps") / 4)) == 0;
}

Workload backward_workload(const TuningConfig& c, const TuningContext& ctx, const BackwardLoop& k) {
  const int64_t B = dim(ctx, "B"), H = dim(ctx, "H"), S = dim(ctx, "S"), D = dim(ctx, "D");
  const int64_t warps = c.get("warps");
  const bool causal = ctx.meta_bool(mn::kCausal, false);
  const double e = static_cast<double>(ir::byte_size(meta_dtype(ctx, mn::kDtype, ir::DType::bf16))), bhsd = static_cast<double>(B * H * S * D);
  Workload w;
  w.flops = 2.0 * k.dots * B * H * static_cast<double>(S) * S * D / (causal ? 2.0 : 1.0);
  w.programs = cdiv(S, k.tile) * H * B;
  w.threads = static_cast<int>(32 * warps);
  const double visits = static_cast<double>(cdiv(S, k.step)) * (causal ? 0.5 : 1.0) + (causal ? 0.5 : 0.0);
  w.k_iterations = visits;
  w.mma_flops = 2.0 * k.dots * static_cast<double>(w.programs) * visits * static_cast<double>(k.tile * k.step * D);
  w.wgmma = backward_on_wgmma(c, ctx, k.tile);
  w.stages = w.wgmma ? static_cast<int>(c.get("stages")) : 1;
  // Q, K, V, dO read and the gradients written once; the streamed blocks from L2 every visit
  w.dram_bytes = (4.0 + k.outputs) * bhsd * e + 8.0 * B * H * S;
  w.l2_bytes = static_cast<double>(w.programs) * visits * 2.0 * static_cast<double>(k.step * D) * e + (2.0 + k.outputs) * bhsd * e;
  w.smem_bytes = static_cast<double>(w.programs) * visits * (6.0 * static_cast<double>(k.step * D) + 2.0 * static_cast<double>(k.tile * k.step)) * e;
  w.est_smem_bytes = (2 * k.tile * D + w.stages * 2 * k.step * D) * static_cast<int64_t>(e) + 1024;
  // A step per warpgroup (its 64-row slab of the tile, one streamed block): the dots, an
  // exponential per score, the elementwise softmax gradient's FP32 ops and the instructions a
  // thread that do not scale with the tile (`step_overhead`); no row reductions: P = exp(S - LSE)
  // element by element
  runtime::ChainWorkload& ch = w.chain;
  ch.present = true;
  ch.chains_per_program = w.wgmma ? static_cast<int>(warps / 4) : 1;
  const double rows = static_cast<double>(k.tile) / ch.chains_per_program, step = static_cast<double>(k.step);
  ch.steps = static_cast<double>(w.programs) * visits * ch.chains_per_program;
  ch.mma_flops = 2.0 * k.dots * rows * step * static_cast<double>(D);
  ch.operand_bytes = (2.0 * rows + k.dots * step) * static_cast<double>(D) * e;
  ch.exponentials = rows * step;
  ch.fp32_ops = k.fp32_per_score * rows * step + 128.0 * k.step_overhead;
  ch.row_reductions = false;
  ch.lockstep = k.lockstep;
  ch.overlapped = k.overlapped;
  // per consumer thread, each 64-row slab: the f32 accumulators (64 x D each), S and dP (64 x
  // step), ~24 more
  const int64_t slabs = w.wgmma ? std::max<int64_t>(1, k.tile / (64 * ch.chains_per_program)) : 1;
  ch.register_demand = static_cast<int>(slabs * (k.outputs * D / 2 + k.step) + 24);
  const int64_t bound = std::max<int64_t>(1, c.get(runtime::kMinProgramsParam));
  ch.register_cap = static_cast<int>(std::min<int64_t>(255, 65536 / (32 * warps * bound) / 8 * 8));
  w.est_registers = std::min(ch.register_cap, ch.register_demand + 32);
  ch.tiles = static_cast<double>(w.programs);
  return w;
}

}  // namespace tilejit::library::tuning_detail
