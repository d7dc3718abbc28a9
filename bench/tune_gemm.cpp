// bench/tune_gemm: the autotuner on the library GEMM for the shapes of bench/gemm.py: per shape the
// configs in the space, how many were compiled and timed, the cold tuning wall time (empty tuning
// store and compile cache directory), the warm wall time (a new Autotuner: only the lookup), and
// the best TFLOP/s of the pruned search against an exhaustive sweep. Run on the GPU machine.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "api/tuning.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/compile_cache.hpp"
#include "kernels/meta_names.hpp"

namespace mn = tilejit::kernels::meta_name;

using namespace tilejit;
using namespace tilejit::runtime;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  // library kernels timed as the API launches them: declared, not specialised per call
  // (runtime/specialization.hpp; TILEJIT_SPECIALIZE=1 set by the caller overrides)
  setenv("TILEJIT_SPECIALIZE", "0", /*overwrite=*/0);
  std::vector<std::array<int64_t, 3>> shapes;
  for (int i = 1; i + 2 < argc; i += 3) shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2])});
  if (shapes.empty()) shapes = {{8192, 8192, 8192}, {4096, 4096, 4096}, {16384, 6144, 2048}};
  Driver& drv = Driver::get();
  if (!drv.available() || drv.device_count() == 0) {
    std::fprintf(stderr, "bench/tune_gemm needs a GPU: %s\n", drv.unavailable_reason().c_str());
    return 2;
  }
  // A fresh directory: the cold run compiles everything (set TILEJIT_CACHE_DIR before the first
  // compile so the compile cache is cold too).
  const fs::path dir = fs::temp_directory_path() / fmt::format("tilejit_tune_bench_{}", ::getpid());
  fs::remove_all(dir);
  ::setenv("TILEJIT_CACHE_DIR", (dir / "cache").c_str(), 1);
  TuningStore pruned_store(dir / "pruned"), exhaustive_store(dir / "exhaustive");
  const TuningSpace& space = library::gemm_tuning_space();
  const lang::Meta fixed = library::library_fixed_meta("gemm", {{mn::kOutDtype, ir::DType::bf16}});
  std::printf("GPU: %s, %d SMs, driver %d\n", drv.props(0).name.c_str(), drv.props(0).sm_count, drv.driver_version());
  std::printf("| M x N x K | configs (valid) | compiled | timed | cold s | warm ms | pruned best TFLOP/s (own run) | exhaustive best TFLOP/s (head to head) | pruned choice (head to head) | ratio | pruned best config |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (auto [M, N, K] : shapes) {
    const Shape shape{{"M", M}, {"N", N}, {"K", K}};
    AutotuneOptions o;
    o.budget_s = 300;
    auto t0 = std::chrono::steady_clock::now();
    Autotuner cold(space, o);
    cold.set_store(&pruned_store);
    TuneResult p = cold.tune(shape, fixed);
    const double cold_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    Autotuner warm(space, o);
    warm.set_store(&pruned_store);
    TuneResult w = warm.tune(shape, fixed);
    const double warm_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    AutotuneOptions eo = o;
    eo.exhaustive = true;
    eo.budget_s = 1200;
    Autotuner ex(space, eo);
    ex.set_store(&exhaustive_store);
    TuneResult e = ex.tune(shape, fixed);
    auto tf = [&](const TuneResult& r) { return r.best_ms > 0 ? r.flops / (r.best_ms * 1e-3) / 1e12 : 0.0; };
    std::fprintf(stderr, "%lldx%lldx%lld: pruned %s (%s), warm from %s, exhaustive %s (%zu timed)\n", static_cast<long long>(M),
                 static_cast<long long>(N), static_cast<long long>(K), p.best.id().c_str(), p.source.c_str(), w.source.c_str(),
                 e.best.id().c_str(), e.timed);
    for (const ConfigResult& c : p.configs)
      if (c.measured_rank)
        std::fprintf(stderr, "  %-64s model #%d %.4f ms, measured #%d %.4f ms %.1f TFLOP/s\n", c.config.id().c_str(), c.model_rank,
                     c.estimate.ms, c.measured_rank, c.ms, c.tflops);
    // The search's quality: the pruned choice against the exhaustive best, timed head to head in
    // alternating rounds (one long sweep drifts with clocks and power by more than the 3% the
    // criterion allows, so numbers from different moments are not comparable).
    double choice_in_sweep = 0;
    {
      TuningContext ctx;
      ctx.shape = shape;
      ctx.fixed = fixed;
      ctx.smem_limit = static_cast<int64_t>(drv.props(0).smem_per_block_optin);
      ctx.sm_count = drv.props(0).sm_count;
      std::vector<TuningConfig> pair{p.best, e.best};
      std::vector<ir::Function> fns;
      std::vector<jit::CompiledKernel> kernels_;
      for (const TuningConfig& c : pair) {
        fns.push_back(space.build_ir(c, fixed));
        kernels_.push_back(runtime::compile_cached(fns.back(), c.options()));
      }
      auto candidate = [&](size_t i) { return Candidate{&pair[i], &fns[i], &kernels_[i], space.grid_of(pair[i], ctx)}; };
      auto bench = make_gpu_bench();
      bench->prepare(space, ctx, candidate(1));
      std::vector<double> t[2];
      for (int round = 0; round < 7; ++round)
        for (size_t i = 0; i < 2; ++i) t[i].push_back(bench->measure(candidate(i)).ms);
      for (auto& v : t) std::sort(v.begin(), v.end());
      double pruned_ms = t[0][3], best_ms = t[1][3];
      choice_in_sweep = e.flops / (pruned_ms * 1e-3) / 1e12;
      double best_tf = e.flops / (best_ms * 1e-3) / 1e12;
      std::fprintf(stderr, "  head to head (7 alternating rounds, medians): pruned choice %.1f TFLOP/s, exhaustive best %.1f\n",
                   choice_in_sweep, best_tf);
      e.best_ms = best_ms;  // the exhaustive best as timed head to head
    }
    std::printf("| %lldx%lldx%lld | %zu (%zu) | %zu | %zu | %.1f | %.2f | %.0f | %.0f | %.0f | %.3f | %s |\n", static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), p.space_size, p.valid, p.compiled, p.timed, cold_s, warm_ms,
                tf(p), tf(e), choice_in_sweep, tf(e) > 0 ? choice_in_sweep / tf(e) : 0.0, p.best.id().c_str());
    std::fflush(stdout);
  }
  fs::remove_all(dir);
  return 0;
}
