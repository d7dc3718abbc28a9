// The attention forward's tuning space: tiles, warps, stages, the register bound and every
// schedule option of the kernel (ring producer, persistent grid, the two pipelines, TMA stores,
// the exact normalisation), with the API's own configuration of each problem as the default, so
// that a tuned choice can only match or beat what the API launches.
#include <cmath>

#include "api/attention/internal.hpp"
#include "api/tuning.hpp"
#include "api/tuning_internal.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::library::tuning_detail {

namespace mn = kernels::meta_name;
using runtime::Bucketing;
using runtime::DeviceArg;
using runtime::TuningConfig;
using runtime::TuningContext;
using runtime::Workload;

namespace {

// The schedule options in the space, after tiles / warps / stages / min_programs (bool params).
constexpr const char* kFlags[] = {mn::kExactNormalize, mn::kPersistent, mn::kRingProducer,
                                  mn::kPipelinePv,     mn::kPipelineQk, mn::kTmaStore};

// The Hopper path (jit/wgmma_plan): BLOCK_M in 64-row slabs, one per warpgroup.
bool on_wgmma(const TuningConfig& c, const TuningContext& ctx) {
  return ctx.arch == "sm_90a" && c.get("warps") % 4 == 0 && c.get(mn::kBlockM) % (64 * (c.get("warps") / 4)) == 0;
}

Workload attention_workload(const TuningConfig& c, const TuningContext& ctx) {
  const int64_t B = dim(ctx, "B"), H = dim(ctx, "H"), S = dim(ctx, "S"), D = dim(ctx, "D");
  const int64_t bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN), warps = c.get("warps");
  const bool causal = ctx.meta_bool(mn::kCausal, false);
  const double e = static_cast<double>(ir::byte_size(meta_dtype(ctx, mn::kDtype, ir::DType::bf16)));
  Workload w;
  w.flops = 4.0 * B * H * static_cast<double>(S) * S * D / (causal ? 2.0 : 1.0);
  w.programs = cdiv(S, bm) * H * B;
  w.threads = static_cast<int>(32 * (warps + (flag(c, mn::kRingProducer) ? 4 : 0)));
  const double n_iter = static_cast<double>(cdiv(S, bn)) * (causal ? 0.5 : 1.0) + (causal ? 0.5 : 0.0);
  w.k_iterations = n_iter;
  w.mma_flops = 4.0 * static_cast<double>(w.programs) * n_iter * bm * bn * D;
  w.wgmma = on_wgmma(c, ctx);
  w.stages = w.wgmma ? static_cast<int>(c.get("stages")) : 1;
  const double qkvo = 4.0 * B * H * static_cast<double>(S) * D * e;
  w.dram_bytes = qkvo + 4.0 * B * H * S;
  w.l2_bytes = static_cast<double>(w.programs) * n_iter * 2.0 * bn * D * e + 2.0 * B * H * static_cast<double>(S) * D * e;
  w.smem_bytes = static_cast<double>(w.programs) * n_iter * (4.0 * bn * D * e + 2.0 * bm * bn * e);
  w.est_smem_bytes = w.wgmma ? (bm * D + w.stages * 2 * bn * D) * static_cast<int64_t>(e) + 1024
                             : (bm * D + 2 * bn * D + bm * bn) * static_cast<int64_t>(e);
  // The key-block loop as chains (docs/performance-model.md): each consumer warpgroup takes a
  // 64-row slab of the tile (the wgmma path; elsewhere one chain per program) and per key block
  // runs S = Q K^T and P V (4 x rows x BLOCK_N x D flops, Q, K and V read from shared memory),
  // one exponential per score and ~7 FP32 lane-ops (scale, max, subtract, sum, convert), and
  // rescales its O rows (~6 per element).
  runtime::ChainWorkload& ch = w.chain;
  ch.present = true;
  ch.chains_per_program = w.wgmma ? static_cast<int>(warps / 4) : 1;
  const double rows = static_cast<double>(bm) / ch.chains_per_program;
  ch.steps = static_cast<double>(w.programs) * n_iter * ch.chains_per_program;
  ch.mma_flops = 4.0 * rows * static_cast<double>(bn * D);
  ch.operand_bytes = (rows * D + 2.0 * bn * D) * e;
  ch.exponentials = rows * static_cast<double>(bn);
  ch.fp32_ops = 7.0 * rows * static_cast<double>(bn) + 6.4 * rows * static_cast<double>(D);
  const bool qk = flag(c, mn::kPipelineQk), pv = flag(c, mn::kPipelinePv);
  ch.overlapped = qk || pv;
  ch.producer = flag(c, mn::kRingProducer);
  // per consumer thread, each of its 64-row slabs: O (64 x D f32 over 128 threads), S, and the
  // pipelined block's second S (PIPELINE_QK) or P (PIPELINE_PV); ~24 for addresses and row stats
  const int64_t slabs = w.wgmma ? std::max<int64_t>(1, bm / (64 * ch.chains_per_program)) : 1;
  const int64_t extra = qk ? bn / 2 : pv ? bn / 4 : 0;
  ch.register_demand = static_cast<int>(slabs * (D / 2 + bn / 2 + extra) + 24);
  const int64_t bound = std::max<int64_t>(1, c.get(runtime::kMinProgramsParam));
  ch.register_cap = ch.producer ? 240 : static_cast<int>(std::min<int64_t>(255, 65536 / (32 * warps * bound) / 8 * 8));
  // before compiling: ~32 above the demand (the sweeps' compiled kernels), within the cap; the
  // producer's kernel takes the whole register file (setmaxnreg moves it between the roles)
  w.est_registers = ch.producer ? static_cast<int>(65536 / w.threads / 8 * 8)
                                : std::min(ch.register_cap, ch.register_demand + 32);
  ch.persistent = flag(c, mn::kPersistent);
  ch.tiles = static_cast<double>(w.programs);
  ch.bulk_epilogue = flag(c, mn::kTmaStore);
  ch.slowdown = flag(c, mn::kExactNormalize) ? 1.1 : 1.0;  // the division's subroutine serialises every wgmma [002]
  return w;
}

runtime::ProblemData attention_problem(const TuningContext& ctx) {
  const int64_t B = dim(ctx, "B"), H = dim(ctx, "H"), S = dim(ctx, "S"), D = dim(ctx, "D");
  const ir::DType t = meta_dtype(ctx, mn::kDtype, ir::DType::bf16);
  // BSHD (the API's layout): [B, S, H, D]; LSE [B, H, S] either way
  const ir::Shape qkvo = ctx.meta_bool(mn::kBshd, false) ? ir::Shape{B, S, H, D} : ir::Shape{B, H, S, D};
  runtime::ProblemData d;
  for (int i = 0; i < 4; ++i) d.tensors.push_back(std::make_unique<runtime::HostTensor>(t, qkvo));
  d.tensors.push_back(std::make_unique<runtime::HostTensor>(ir::DType::f32, ir::Shape{B, H, S}));
  for (int i = 0; i < 3; ++i) d.tensors[static_cast<size_t>(i)]->fill_normal_parallel(static_cast<uint64_t>(i + 1), 0, 1);
  for (auto& x : d.tensors) d.args.emplace_back(*x);
  d.args.emplace_back(static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
  d.outputs = {3, 4};
  d.tolerance = 2e-2;  // BLOCK_N changes the online-softmax rescaling order
  return d;
}

// What attention::forward launches for this problem (api/attention/schedules.cpp): its schedule,
// and every option as the kernel resolves it (read back from the built kernel's metas, so that
// a default changed in ForwardConfig::read moves this one with it).
TuningConfig api_default(const TuningContext& ctx) {
  attention::detail::Config a = api_config(attention::Pass::forward, ctx);
  a.positive_scale = ctx.meta_bool(mn::kPositiveScale, false);
  a.persistent = attention::detail::forward_persistent(a.head_dim, false, 0, 0, a.dropout);
  const ir::Function f = kernels::attention_forward().build(runtime::layer_meta(attention::detail::meta_of(a), ctx.fixed));
  return config_of(a.sch, f, kFlags);
}

}  // namespace

void attention_keys(runtime::TuningSpace& s, const char* kernel) {
  auto bshd = [](const lang::Meta& m) { return meta_bool_of(m, mn::kBshd, false); };
  s.key("B", Bucketing::pow2(), [kernel](std::span<const DeviceArg> a, const lang::Meta&) { return arg_size(a, 0, 0, kernel); })
      .key("H", Bucketing::pow2(), [kernel, bshd](std::span<const DeviceArg> a, const lang::Meta& m) { return arg_size(a, 0, bshd(m) ? 2 : 1, kernel); })
      .key("S", Bucketing::pow2(64), [kernel, bshd](std::span<const DeviceArg> a, const lang::Meta& m) { return arg_size(a, 0, bshd(m) ? 1 : 2, kernel); })
      .key("D", Bucketing::exact(), [kernel](std::span<const DeviceArg> a, const lang::Meta&) { return arg_size(a, 0, 3, kernel); });
}

TuningConfig config_of(const attention::Schedule& sch, const ir::Function& f, std::span<const char* const> flags) {
  TuningConfig c;
  c.values.emplace_back(mn::kBlockM, sch.block_m);
  c.values.emplace_back(mn::kBlockN, sch.block_n);
  c.values.emplace_back("warps", sch.num_warps);
  c.values.emplace_back("stages", sch.stages);
  c.values.emplace_back(runtime::kMinProgramsParam, sch.min_programs_per_sm);
  for (const char* name : flags) {
    const ir::MetaEntry* m = f.find_meta(name);
    const bool* on = m ? std::get_if<bool>(&m->value) : nullptr;
    if (!on) throw std::logic_error(fmt::format("tilejit: {} declares no bool meta {} (its tuning space's default reads it)", f.name, name));
    c.values.emplace_back(name, *on ? 1 : 0);
  }
  return c;
}

runtime::TuningSpace make_attention_space() {
  runtime::TuningSpace s("attention_fwd", &kernels::attention_forward);
  s.param(mn::kBlockM, {64, 128}).param(mn::kBlockN, {32, 64, 128}).param("warps", {4, 8}).param("stages", {2, 3});
  s.param(std::string(runtime::kMinProgramsParam), {0, 2});
  for (const char* name : kFlags) s.param_bool(name);
  attention_keys(s, "attention_fwd");
  auto producer = [](const TuningConfig& c) { return flag(c, mn::kRingProducer); };
  s.constrain("min_programs = 2 only with 8 warps (two programs of 256 threads per SM)",
              [](const TuningConfig& c, const TuningContext&) { return c.get(runtime::kMinProgramsParam) == 0 || c.get("warps") == 8; })
      .constrain("stages = 2 off the wgmma path (the generic path does not pipeline its loads)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return on_wgmma(c, ctx) || c.get("stages") == 2; })
      // the division's subroutine serialises every wgmma; a bound or the producer's registers leave
      // it no room either (decisions 002-004)
      .constrain("EXACT_NORMALIZE only at HEAD_DIM 64 without a register bound or the producer (elsewhere O = acc x rcp(l))",
                 [producer](const TuningConfig& c, const TuningContext& ctx) {
                   return !flag(c, mn::kExactNormalize) ||
                          (dim(ctx, "D") == 64 && c.get(runtime::kMinProgramsParam) == 0 && !producer(c));
                 })
      .constrain("RING_PRODUCER on the wgmma path, HEAD_DIM <= 128, no register bound (setmaxnreg moves registers "
                 "between the producer and the consumers of one program)",
                 [producer](const TuningConfig& c, const TuningContext& ctx) {
                   return !producer(c) || (on_wgmma(c, ctx) && dim(ctx, "D") <= 128 && c.get(runtime::kMinProgramsParam) == 0);
                 })
      .constrain("PERSISTENT with RING_PRODUCER (the producer copies the next tile's blocks during this one's end)",
                 [producer](const TuningConfig& c, const TuningContext&) { return !flag(c, mn::kPersistent) || producer(c); })
      .constrain("PIPELINE_PV on the wgmma path (P V in flight beside the next softmax)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return !flag(c, mn::kPipelinePv) || on_wgmma(c, ctx); })
      .constrain("PIPELINE_QK on the wgmma path, not beside PIPELINE_PV (both do not fit 240 registers: decision 045)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return !flag(c, mn::kPipelineQk) || (on_wgmma(c, ctx) && !flag(c, mn::kPipelinePv));
                 })
      .constrain("TMA_STORE on the wgmma path with BLOCK_N >= BLOCK_M (O is staged in a K / V or Q tile)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return !flag(c, mn::kTmaStore) || (on_wgmma(c, ctx) && c.get(mn::kBlockN) >= c.get(mn::kBlockM));
                 })
      // (D 64 runs 128 x 128 in the API: BLOCK_N may exceed HEAD_DIM; at D 256, S and O beside each
      // other leave room for 64 keys per block, as the API's D 256 schedule)
      .constrain("BLOCK_N <= 64 at HEAD_DIM 256",
                 [](const TuningConfig& c, const TuningContext& ctx) { return dim(ctx, "D") < 256 || c.get(mn::kBlockN) <= 64; })
      .constrain("the f32 output accumulator fits in registers: BLOCK_M x HEAD_DIM / consumer threads <= 128",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return c.get(mn::kBlockM) * dim(ctx, "D") / (32 * c.get("warps")) <= 128;
                 })
      .constrain("shared memory fits: Q once + stages x (K and V blocks) on the wgmma path",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   const int64_t D = dim(ctx, "D"), bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN);
                   return (bm * D + c.get("stages") * 2 * bn * D) * 2 + 1024 <= ctx.smem_limit;
                 })
      // (names every parameter; each problem's default is the API's: default_for)
      .default_config({{{mn::kBlockM, 128}, {mn::kBlockN, 128}, {"warps", 8}, {"stages", 2}, {std::string(runtime::kMinProgramsParam), 0},
                        {mn::kExactNormalize, 0}, {mn::kPersistent, 0}, {mn::kRingProducer, 0}, {mn::kPipelinePv, 0},
                        {mn::kPipelineQk, 0}, {mn::kTmaStore, 0}}})
      .default_for(api_default)
      .workload(attention_workload)
      .problem(attention_problem)
      .grid([](const TuningConfig& c, const TuningContext& ctx) {
        const int64_t tiles_m = cdiv(dim(ctx, "S"), c.get(mn::kBlockM)), H = dim(ctx, "H"), B = dim(ctx, "B");
        // PERSISTENT: one program per SM walks the tiles (the producer kernel fits once per SM)
        if (flag(c, mn::kPersistent)) return runtime::Grid{std::min<int64_t>(tiles_m * H * B, ctx.sm_count)};
        return runtime::Grid{tiles_m, H, B};
      });
  return s;
}

}  // namespace tilejit::library::tuning_detail
