// The microbenchmarks run through the autotuner's GPU bench (warm-up, L2 flushed, median of the
// repetitions): each is a one-config tuning space, so that its problem, grid and timing are the
// tuner's own.
#include "api/calibrate.hpp"

#include <fmt/format.h>

#include "api/tuning.hpp"
#include "kernels/meta_names.hpp"
#include "kernels/microbench.hpp"

namespace tilejit::library {

namespace {

constexpr int64_t kBlock = 2048;

// A chain microbenchmark: `programs` x BLOCK elements, `iters` steps each.
runtime::TuningSpace chain_space(const char* name, const lang::Kernel& (*kernel)(), int64_t programs, int64_t iters) {
  runtime::TuningSpace s(name, kernel);
  s.param("BLOCK", {kBlock})
      .param("warps", {8})
      .key("programs", runtime::Bucketing::exact())
      .default_config({{{"BLOCK", kBlock}, {"warps", 8}}})
      .problem([programs, iters](const runtime::TuningContext&) {
        runtime::ProblemData d;
        d.tensors.push_back(std::make_unique<runtime::HostTensor>(ir::DType::f32, ir::Shape{programs * kBlock}));
        d.tensors[0]->fill_uniform_parallel(1, 0.5, 1.0);
        d.args.emplace_back(*d.tensors[0]);
        d.args.emplace_back(static_cast<int32_t>(iters));
        d.outputs = {0};
        d.tolerance = 0;  // the same kernel twice: the same bits
        return d;
      })
      .grid([programs](const runtime::TuningConfig&, const runtime::TuningContext&) { return runtime::Grid{programs}; })
      .workload([](const runtime::TuningConfig&, const runtime::TuningContext&) { return runtime::Workload{}; });
  return s;
}

// Milliseconds of the space's default config on GPU 0, timed as the tuner times.
double time_default(const runtime::TuningSpace& space, const runtime::TuningContext& ctx) {
  const runtime::TuningConfig c = space.default_config(ctx);
  jit::CompileOptions o = c.options();
  o.specialize = false;
  const ir::Function fn = space.build_ir(c, ctx.fixed);
  const jit::CompiledKernel k = jit::compile(fn, o);
  const runtime::Candidate cand{&c, &fn, &k, space.grid_of(c, ctx)};
  std::unique_ptr<runtime::Bench> bench = runtime::make_gpu_bench();
  bench->prepare(space, ctx, cand);
  const runtime::Bench::Result r = bench->measure(cand);
  if (!r.correct) throw std::runtime_error(fmt::format("tilejit calibrate: {}: {}", space.kernel_name(), r.note));
  return r.ms;
}

}  // namespace

CalibrationRun calibrate_device() {
  runtime::Driver& drv = runtime::Driver::get();
  drv.require("tilejit calibrate");
  CalibrationRun run;
  run.device = runtime::DeviceModel::from_props(drv.props(0), drv.driver_version());
  const double sms = run.device.sm_count, hz = run.device.clock_hz;
  const int64_t programs = static_cast<int64_t>(sms) * 16;  // a few waves of resident programs
  auto per_sm_clock = [&](double ops, double ms) { return ops / (ms * 1e-3) / hz / sms; };
  runtime::TuningContext ctx;
  ctx.shape = {{"programs", programs}};
  struct Chain {
    const char* name;
    const lang::Kernel& (*kernel)();
    int64_t iters;
    double* out;
    const char* unit;
  };
  for (const Chain& c : {Chain{"exp2_chain", &kernels::exp2_chain, 4096, &run.rates.exponentials_per_clock, "exponentials"},
                         Chain{"fma_chain", &kernels::fma_chain, 32768, &run.rates.fp32_per_clock, "FP32 FMAs"}}) {
    const runtime::TuningSpace space = chain_space(c.name, c.kernel, programs, c.iters);
    const double ms = time_default(space, ctx);
    const double ops = static_cast<double>(programs * kBlock) * static_cast<double>(c.iters);
    *c.out = per_sm_clock(ops, ms);
    run.details += fmt::format("{}: {} programs x {} elements x {} steps in {:.3f} ms: {:.2f} {} per SM and clock\n", c.name, programs,
                               kBlock, c.iters, ms, *c.out, c.unit);
  }
  // tensor cores: the library GEMM at its default configuration, bf16 8192^3
  const runtime::TuningSpace& gemm = gemm_tuning_space();
  runtime::TuningContext g;
  g.shape = {{"M", 8192}, {"N", 8192}, {"K", 8192}};
  g.fixed = library_fixed_meta("gemm", {});
  const double ms = time_default(gemm, g);
  run.rates.mma_flops_per_clock = per_sm_clock(2.0 * 8192 * 8192 * 8192, ms);
  run.details += fmt::format("gemm 8192^3 (its default config): {:.3f} ms: {:.0f} flops per SM and clock\n", ms,
                             run.rates.mma_flops_per_clock);
  return run;
}

}  // namespace tilejit::library
