// The library kernels' tuning spaces. Constraints encode what the compiler does (the wgmma
// pipeline's shape rules, the accumulator's register budget) so that configs that would fall off
// the fast path or spill are never compiled; the workloads feed the cost model.
#include "api/tuning.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/meta_names.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/gemm.hpp"
#include "api/registry.hpp"
#include "api/tuning_internal.hpp"

namespace tilejit::library {

namespace mn = kernels::meta_name;

using namespace kernels;

using runtime::Bucketing;
using runtime::DeviceArg;
using runtime::TuningConfig;
using runtime::TuningContext;
using runtime::Workload;
using namespace tuning_detail;

namespace {

// The config a space starts from: the registry's row of `kernel` (api/registry.cpp): its values of
// the tuned metas `names` (in this order, the id's), its warps and stages.
TuningConfig registry_default(const std::string& kernel, std::initializer_list<const char*> names) {
  const LibraryKernel* k = find(kernel);
  if (!k) throw std::logic_error(fmt::format("tilejit: kernel '{}' has a tuning space but no registry row", kernel));
  TuningConfig c;
  for (const char* name : names)
    for (const auto& [n, v] : k->default_meta)
      if (n == name) c.values.emplace_back(n, std::get<int64_t>(v));
  c.values.emplace_back("warps", k->num_warps);
  c.values.emplace_back("stages", k->stages);
  return c;
}

// `c` with the bool parameters `names` appended, off (they follow warps / stages in the spaces).
TuningConfig with_flags(TuningConfig c, std::initializer_list<const char*> names) {
  for (const char* n : names) c.values.emplace_back(n, 0);
  return c;
}

// ---- GEMM ------------------------------------------------------------------------------------

// On sm_90a with 16-byte aligned operands the K loop is a TMA + wgmma pipeline (given BLOCK_K = 64
// and BLOCK_M a multiple of 64 per warpgroup) whichever way A and B are given: an MN-major operand
// (A^T[K, M], B[K, N]) in 64-column chunks, read by wgmma transposed.
bool gemm_tma_layout(const TuningContext& ctx) { return ctx.arch == "sm_90a" && ctx.meta_int(mn::kAlign, 16) >= 16; }

bool gemm_wgmma(const TuningConfig& c, const TuningContext& ctx) {
  return gemm_tma_layout(ctx) && c.get(mn::kBlockK) == 64 && c.get(mn::kBlockM) % (64 * (c.get("warps") / 4)) == 0 &&
         c.get("warps") % 4 == 0 && (ctx.meta_bool(mn::kBKmajor, false) || c.get(mn::kBlockN) % 64 == 0);
}

int64_t gemm_smem_estimate(const TuningConfig& c, const TuningContext& ctx) {
  const int64_t bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN), bk = c.get(mn::kBlockK);
  const int64_t in = ir::byte_size(meta_dtype(ctx, mn::kDtype, ir::DType::bf16));
  // ring + mbarriers, and TMA_STORE's staging tile (C's tile in the output dtype)
  const int64_t staging = flag(c, mn::kTmaStore) ? bm * bn * ir::byte_size(meta_dtype(ctx, mn::kOutDtype, ir::DType::f32)) + 1024 : 0;
  if (gemm_wgmma(c, ctx)) return c.get("stages") * (bm + bn) * bk * in + 1024 + staging;
  return 2 * (bm + bn) * bk * in;  // generic path: operands staged through shared memory
}

Workload gemm_workload(const TuningConfig& c, const TuningContext& ctx) {
  const int64_t M = runtime::shape_get(ctx.shape, "M"), N = runtime::shape_get(ctx.shape, "N"), K = runtime::shape_get(ctx.shape, "K");
  const int64_t bm = c.get(mn::kBlockM), bn = c.get(mn::kBlockN), bk = c.get(mn::kBlockK), g = c.get(mn::kGroupM);
  const int64_t warps = c.get("warps"), stages = c.get("stages");
  const double in = static_cast<double>(ir::byte_size(meta_dtype(ctx, mn::kDtype, ir::DType::bf16)));
  const double out = static_cast<double>(ir::byte_size(meta_dtype(ctx, mn::kOutDtype, ir::DType::f32)));
  const int64_t tm = cdiv(M, bm), tn = cdiv(N, bn), kit = cdiv(K, bk);
  Workload w;
  w.wgmma = gemm_wgmma(c, ctx);
  w.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  w.programs = tm * tn;
  w.threads = static_cast<int>(32 * (warps + (flag(c, mn::kRingProducer) ? 4 : 0)));  // (the producer warpgroup)
  w.mma_flops = 2.0 * static_cast<double>(w.programs) * bm * bn * static_cast<double>(kit * bk);
  w.k_iterations = static_cast<double>(kit);
  w.stages = w.wgmma ? static_cast<int>(stages) : 1;
  const double tile_in = static_cast<double>((bm + bn) * bk) * in;
  w.l2_bytes = static_cast<double>(w.programs * kit) * tile_in + static_cast<double>(M * N) * out;
  // HBM: per wave (one program per SM assumed) the A row-panels and B column-panels it touches;
  // grouped order touches GROUP_M rows and many columns, the 2-D grid (M fastest) a column of rows.
  const int64_t slots = std::max(1, ctx.sm_count);
  const int64_t waves = cdiv(w.programs, slots);
  int64_t rows, cols;
  if (g > 0) {
    rows = std::min(g, tm);
    cols = std::min(tn, cdiv(slots, rows));
  } else {
    rows = std::min(tm, slots);
    cols = std::min(tn, cdiv(slots, tm));
  }
  const double per_wave = static_cast<double>(rows * bm + cols * bn) * static_cast<double>(K) * in;
  const double compulsory = static_cast<double>(M * K + N * K) * in;
  const double l2_in = static_cast<double>(w.programs * kit) * tile_in;
  w.dram_bytes = std::max(compulsory, std::min(static_cast<double>(waves) * per_wave, l2_in)) + static_cast<double>(M * N) * out;
  // Shared memory: TMA writes both tiles; each warpgroup's wgmma reads its A rows and all of B.
  const double wg = static_cast<double>(std::max<int64_t>(1, warps / 4));
  const double per_iter = w.wgmma ? tile_in + static_cast<double>(bm + static_cast<int64_t>(wg) * bn) * bk * in
                                  : 3.0 * tile_in;  // generic: element-wise staging, then fragment reads
  w.smem_bytes = static_cast<double>(w.programs * kit) * per_iter;
  const int64_t acc_regs = bm * bn / (32 * warps);
  w.est_registers = static_cast<int>(std::min<int64_t>(255, acc_regs + (w.wgmma ? 40 : 90)));
  w.est_smem_bytes = gemm_smem_estimate(c, ctx);
  if (w.wgmma) {
    // per consumer warpgroup and K slice: its rows of A against all of B, the wgmma issued and the
    // previous one retired; the ring ahead hides the loads' latency
    runtime::ChainWorkload& ch = w.chain;
    ch.present = true;
    ch.chains_per_program = static_cast<int>(wg);
    const double wg_rows = static_cast<double>(bm) / wg;
    ch.steps = static_cast<double>(w.programs * kit) * wg;
    ch.mma_flops = 2.0 * wg_rows * static_cast<double>(bn * bk);
    ch.operand_bytes = (wg_rows + static_cast<double>(bn)) * static_cast<double>(bk) * in;
    ch.overlapped = true;
    ch.async_steps = true;
    ch.row_reductions = false;
    ch.producer = flag(c, mn::kRingProducer);
    ch.register_demand = static_cast<int>(wg_rows * static_cast<double>(bn) / 128.0) + 24;
    ch.register_cap = 255;
    ch.persistent = flag(c, mn::kPersistent);
    ch.tiles = static_cast<double>(w.programs);
    ch.bulk_epilogue = flag(c, mn::kTmaStore);
    ch.loads_ahead = static_cast<int>(stages - 1 + (ch.producer ? 1 : 0));
  }
  return w;
}

runtime::ProblemData gemm_problem(const TuningContext& ctx) {
  const int64_t M = runtime::shape_get(ctx.shape, "M"), N = runtime::shape_get(ctx.shape, "N"), K = runtime::shape_get(ctx.shape, "K");
  const ir::DType in = meta_dtype(ctx, mn::kDtype, ir::DType::bf16), out = meta_dtype(ctx, mn::kOutDtype, ir::DType::f32);
  const bool ak = ctx.meta_bool(mn::kAKmajor, true), bk = ctx.meta_bool(mn::kBKmajor, false);
  runtime::ProblemData d;
  d.tensors.push_back(std::make_unique<runtime::HostTensor>(in, ak ? ir::Shape{M, K} : ir::Shape{K, M}));
  d.tensors.push_back(std::make_unique<runtime::HostTensor>(in, bk ? ir::Shape{N, K} : ir::Shape{K, N}));
  d.tensors.push_back(std::make_unique<runtime::HostTensor>(out, ir::Shape{M, N}));
  d.tensors[0]->fill_uniform_parallel(1, -1, 1);
  d.tensors[1]->fill_uniform_parallel(2, -1, 1);
  for (auto& t : d.tensors) d.args.emplace_back(*t);
  d.outputs = {2};
  // Configs sum K in different orders only across BLOCK_K; outputs round once.
  d.tolerance = out == ir::DType::f32 ? 1e-4 : 1e-2;
  return d;
}

runtime::Grid gemm_grid(const TuningConfig& c, const TuningContext& ctx) {
  const int64_t tm = cdiv(runtime::shape_get(ctx.shape, "M"), c.get(mn::kBlockM));
  const int64_t tn = cdiv(runtime::shape_get(ctx.shape, "N"), c.get(mn::kBlockN));
  // PERSISTENT: one program per multiprocessor (the constraint keeps it to tiles that fit once)
  if (flag(c, mn::kPersistent)) return {std::min<int64_t>(tm * tn, ctx.sm_count)};
  if (c.get(mn::kGroupM) > 0) return {tm * tn};
  return {tm, tn};
}

runtime::TuningSpace make_gemm_space() {
  runtime::TuningSpace s("gemm", &gemm);
  s.param(mn::kBlockM, {64, 128, 256})
      .param(mn::kBlockN, {64, 128, 256})
      .param(mn::kBlockK, {32, 64})
      .param(mn::kGroupM, {0, 8})
      .param("warps", {4, 8})
      .param("stages", {2, 3, 4, 5})
      .param_bool(mn::kRingProducer)
      .param_bool(mn::kPersistent)
      .param_bool(mn::kTmaStore)
      .constrain("RING_PRODUCER only on the TMA + wgmma path (its producer fills that ring)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return !flag(c, mn::kRingProducer) || gemm_wgmma(c, ctx); })
      .constrain("TMA_STORE only on the TMA + wgmma path (elsewhere C's stores stay element-wise: the same kernel)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return !flag(c, mn::kTmaStore) || gemm_wgmma(c, ctx); })
      .constrain("PERSISTENT only for tiles of which one program fits a multiprocessor (shared memory above half the limit): "
                 "its grid has one program per multiprocessor",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return !flag(c, mn::kPersistent) || 2 * gemm_smem_estimate(c, ctx) > ctx.smem_limit;
                 })
      .constrain("BLOCK_K = 64 on the TMA + wgmma path (128-byte swizzled K rows)",
                 [](const TuningConfig& c, const TuningContext& ctx) { return !gemm_tma_layout(ctx) || c.get(mn::kBlockK) == 64; })
      .constrain("BLOCK_M divisible by 64 x warpgroups (wgmma path)",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return !gemm_tma_layout(ctx) || c.get(mn::kBlockM) % (64 * (c.get("warps") / 4)) == 0;
                 })
      .constrain("stages only vary on the TMA path (the generic path does not pipeline): stages = 2 there",
                 [](const TuningConfig& c, const TuningContext& ctx) { return gemm_tma_layout(ctx) || c.get("stages") == 2; })
      .constrain("the f32 accumulator fits in registers: BLOCK_M x BLOCK_N / threads <= 128",
                 [](const TuningConfig& c, const TuningContext&) { return c.get(mn::kBlockM) * c.get(mn::kBlockN) / (32 * c.get("warps")) <= 128; })
      .constrain("shared memory fits: stages x (BLOCK_M + BLOCK_N) x BLOCK_K x element size within the device limit",
                 [](const TuningConfig& c, const TuningContext& ctx) { return gemm_smem_estimate(c, ctx) <= ctx.smem_limit; })
      .constrain("tiles no larger than the problem rounded up to a power of two",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return c.get(mn::kBlockM) <= std::max<int64_t>(64, pow2_at_least(runtime::shape_get(ctx.shape, "M"))) &&
                          c.get(mn::kBlockN) <= std::max<int64_t>(64, pow2_at_least(runtime::shape_get(ctx.shape, "N")));
                 })
      .constrain("GROUP_M > 0 only with several tile rows",
                 [](const TuningConfig& c, const TuningContext& ctx) {
                   return c.get(mn::kGroupM) == 0 || cdiv(runtime::shape_get(ctx.shape, "M"), c.get(mn::kBlockM)) > 1;
                 })
      .key("M", Bucketing::pow2(16), [](std::span<const DeviceArg> a, const lang::Meta&) { return arg_size(a, 2, 0, "gemm"); })
      .key("N", Bucketing::pow2(16), [](std::span<const DeviceArg> a, const lang::Meta&) { return arg_size(a, 2, 1, "gemm"); })
      .key("K", Bucketing::pow2(16),
           [](std::span<const DeviceArg> a, const lang::Meta& fixed) {
             return arg_size(a, 0, meta_bool_of(fixed, mn::kAKmajor, true) ? 1 : 0, "gemm");
           })
      .default_config(with_flags(registry_default("gemm", {mn::kBlockM, mn::kBlockN, mn::kBlockK, mn::kGroupM}),
                                 {mn::kRingProducer, mn::kPersistent, mn::kTmaStore}))
      .workload(gemm_workload)
      .problem(gemm_problem)
      .grid(gemm_grid);
  return s;
}

}  // namespace

const runtime::TuningSpace& gemm_tuning_space() {
  static const runtime::TuningSpace s = make_gemm_space();
  return s;
}

const runtime::TuningSpace& attention_fwd_tuning_space() {
  static const runtime::TuningSpace s = tuning_detail::make_attention_space();
  return s;
}

const runtime::TuningSpace& attention_dkdv_tuning_space() {
  static const runtime::TuningSpace s = tuning_detail::make_dkdv_space();
  return s;
}

const runtime::TuningSpace& attention_dq_tuning_space() {
  static const runtime::TuningSpace s = tuning_detail::make_dq_space();
  return s;
}

const runtime::TuningSpace* find_tuning_space(const std::string& kernel) {
  const LibraryKernel* k = find(kernel);
  return k && k->tuning_space ? &k->tuning_space() : nullptr;
}

std::vector<std::string> tunable_kernels() {
  std::vector<std::string> names;
  for (const LibraryKernel& k : all())
    if (k.tuning_space) names.push_back(k.name);
  for (const RegisteredKernel& r : registered())
    if (r.kernel->tuning_space) names.push_back(r.kernel->name);
  return names;
}

namespace {

std::string no_space_error(const std::string& kernel) {
  return fmt::format("tilejit: kernel '{}' has no tuning space (tunable: {})", kernel, fmt::join(tunable_kernels(), ", "));
}

// The space's key dimensions in declaration order: what --shape gives.
std::vector<std::string> key_names(const std::string& kernel) {
  const runtime::TuningSpace* space = find_tuning_space(kernel);
  if (!space) throw std::invalid_argument(no_space_error(kernel));
  std::vector<std::string> names;
  for (const runtime::KeyArg& k : space->key_args()) names.push_back(k.name);
  return names;
}

}  // namespace

lang::Meta library_fixed_meta(const std::string& kernel, const lang::Meta& user) {
  const runtime::TuningSpace* space = find_tuning_space(kernel);
  const LibraryKernel* lk = find(kernel);
  if (!space || !lk) throw std::invalid_argument(no_space_error(kernel));
  lang::Meta defaults;
  for (const auto& [n, v] : lk->default_meta)
    if (!space->default_config().find(n)) defaults.push_back({n, v});
  lang::Meta fixed;
  for (const auto& [n, v] : user) {
    if (space->default_config().find(n))
      throw std::invalid_argument(fmt::format("tilejit: kernel '{}': {} is tuned; it cannot be fixed with --meta", kernel, n));
    fixed.push_back({n, v});
  }
  return runtime::layer_meta(fixed, defaults);
}

runtime::Shape library_shape(const std::string& kernel, const std::vector<int64_t>& v) {
  const std::vector<std::string> names = key_names(kernel);
  if (v.size() != names.size())
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}': --shape takes {}", kernel, fmt::join(names, ",")));
  runtime::Shape shape;
  for (size_t i = 0; i < names.size(); ++i) shape.emplace_back(names[i], v[i]);
  return shape;
}

std::string shape_names(const std::string& kernel) { return fmt::format("{}", fmt::join(key_names(kernel), ",")); }

}  // namespace tilejit::library
