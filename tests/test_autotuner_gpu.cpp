// The autotuner on the GPU (ctest label "gpu"): tunes the library GEMM for one shape pruned (top-k)
// and exhaustively, checks the pruned best reaches 97% of the exhaustive best, that a warm rerun
// is only a lookup (timed), and that a TunedKernel's chosen config matches the interpreter. Skips
// visibly without a GPU.
#include "runtime/autotuner.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "api/calibrate.hpp"
#include "api/tuning.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::runtime;
namespace fs = std::filesystem;

namespace {

bool have_gpu() {
  if (Driver::get().available() && Driver::get().device_count() > 0) return true;
  MESSAGE("SKIPPED: no GPU: " << Driver::get().unavailable_reason());
  return false;
}

void print(const char* what, const TuneResult& r) {
  std::printf("%s: %s %s -> %s %.4f ms (%.1f TFLOP/s); %zu valid, %zu compiled, %zu timed, %zu reused; wall %.2f s "
              "(compile %.2f s, timing %.2f s)\n",
              what, r.kernel.c_str(), describe_shape(r.shape).c_str(), r.best.id().c_str(), r.best_ms,
              r.flops / (r.best_ms * 1e-3) / 1e12, r.valid, r.compiled, r.timed, r.cached, r.wall_s, r.compile_s, r.timing_s);
  for (const ConfigResult& c : r.configs)
    if (c.measured_rank)
      std::printf("  %-64s model %.4f ms (#%d)  measured %.4f ms (#%d)  %.1f TFLOP/s\n", c.config.id().c_str(), c.estimate.ms,
                  c.model_rank, c.ms, c.measured_rank, c.tflops);
  std::fflush(stdout);
}

}  // namespace

TEST_CASE("GEMM: pruned tuning reaches 97% of the exhaustive best; a warm run is a lookup") {
  if (!have_gpu()) return;
  const fs::path base = fs::temp_directory_path() / fmt::format("tilejit_autotuner_gpu_{}", ::getpid());
  fs::remove_all(base);
  TuningStore pruned_store(base / "pruned"), exhaustive_store(base / "exhaustive");
  const TuningSpace& space = library::gemm_tuning_space();
  const lang::Meta fixed = library::library_fixed_meta("gemm", {{"OUT_DTYPE", ir::DType::bf16}});
  const Shape shape{{"M", 4096}, {"N", 4096}, {"K", 4096}};

  AutotuneOptions po;
  po.budget_s = 300;
  Autotuner pruned(space, po);
  pruned.set_store(&pruned_store);
  TuneResult p = pruned.tune(shape, fixed);
  print("pruned", p);
  REQUIRE(p.source == "tuned");
  CHECK(p.timed <= static_cast<size_t>(po.top_k) + 1);

  AutotuneOptions eo = po;
  eo.exhaustive = true;
  eo.budget_s = 590;
  Autotuner exhaustive(space, eo);
  exhaustive.set_store(&exhaustive_store);
  TuneResult e = exhaustive.tune(shape, fixed);
  print("exhaustive", e);
  REQUIRE(e.source == "tuned");
  CHECK_FALSE(e.over_budget);
  const double ratio = e.best_ms / p.best_ms;
  MESSAGE(fmt::format("pruned best / exhaustive best (throughput): {:.3f}", ratio));
  CHECK(ratio >= 0.97);

  // Warm: a new tuner finds the stored choice; nothing is compiled or timed.
  const CompileCacheStats before = compile_cache_stats();
  const auto t0 = std::chrono::steady_clock::now();
  Autotuner warm(space, po);
  warm.set_store(&pruned_store);
  TuneResult w = warm.tune(shape, fixed);
  const double warm_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("warm: %s from %s in %.3f ms\n", w.best.id().c_str(), w.source.c_str(), warm_ms);
  CHECK(w.source == "disk");
  CHECK(w.best == p.best);
  CHECK(compile_cache_stats().compiles == before.compiles);
  CHECK(warm_ms < 100);
  fs::remove_all(base);
}

TEST_CASE("TunedKernel: the chosen GEMM config's output matches the interpreter") {
  if (!have_gpu()) return;
  const TuningSpace& space = library::gemm_tuning_space();
  const lang::Meta fixed = library::library_fixed_meta("gemm", {{"OUT_DTYPE", ir::DType::f32}});
  AutotuneOptions o;
  o.persist = false;
  o.top_k = 3;
  TunedKernel gemm(space, fixed, o);
  const int64_t M = 192, N = 160, K = 128;
  HostTensor a(ir::DType::bf16, {M, K}), bt(ir::DType::bf16, {N, K}), c(ir::DType::f32, {M, N});
  a.fill_uniform(1, -1, 1);
  bt.fill_uniform(2, -1, 1);
  DeviceTensor da = DeviceTensor::from_host(a), db = DeviceTensor::from_host(bt), dc = DeviceTensor::from_host(c);
  gemm(nullptr, da, db, dc);
  HostTensor got = dc.to_host();
  const DeviceArg args[] = {da, db, dc};
  TuningConfig cfg = gemm.config_for(args);
  MESSAGE("chosen: " << cfg.id());
  TuningContext ctx;
  ctx.shape = {{"M", M}, {"N", N}, {"K", K}};
  ctx.fixed = fixed;
  interpret(space.build_ir(cfg, fixed), space.grid_of(cfg, ctx), {a, bt, c});
  CHECK(rel_error(got.to_f64(), c.to_f64()) < 1e-5);
}

TEST_CASE("gpu: calibrate_device measures plausible unit rates (issue 29)") {
  if (!have_gpu()) return;
  const library::CalibrationRun run = library::calibrate_device();
  std::printf("%s", run.details.c_str());
  MESSAGE(run.rates.describe());
  CHECK(run.rates.plausible());
  CHECK(run.rates.exponentials_per_clock <= 17);  // MUFU issues at most 16 a clock per SM
  CHECK(run.rates.fp32_per_clock <= 130);
}
