// `tilejit run`: a library kernel on random inputs, on the GPU or in the interpreter, checked
// against float64 on sampled outputs, timed on the GPU.
#include <fmt/format.h>

#include "kernels/meta_names.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "commands.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::cli {

namespace mn = kernels::meta_name;
namespace {

using runtime::HostTensor;
using ir::DType;

std::vector<int64_t> parse_shape(const std::string& s) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string part = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      v.push_back(std::stoll(part, &used));
      if (used != part.size() || v.back() <= 0) throw std::invalid_argument(part);  // "64x" is not 64
    } catch (const std::exception&) {
      throw UsageError(fmt::format("--shape {}: expected comma-separated positive integers", s));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

template <class T>
T meta_of(const ir::Function& fn, const char* name) {
  const ir::MetaEntry* m = fn.find_meta(name);
  if (!m) throw std::runtime_error(fmt::format("kernel '{}' has no meta-parameter {}", fn.name, name));
  return std::get<T>(m->value);
}

// Runs `fn` with `args` on the chosen device; returns milliseconds per launch (GPU) or the wall
// time of one interpreted run.
double execute(const ir::Function& fn, const jit::CompileOptions& opts, runtime::Grid grid, std::vector<runtime::Arg> args,
               bool gpu, int reps) {
  if (!gpu) {
    auto t0 = std::chrono::steady_clock::now();
    runtime::interpret(fn, grid, args);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  auto t0 = std::chrono::steady_clock::now();
  jit::CompiledKernel compiled = runtime::compile_cached(fn, opts);
  double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  runtime::CompileCacheStats st = runtime::compile_cache_stats();
  std::printf("kernel ready in %.2f ms (%s)\n", load_ms,
              st.compiles ? "compiled" : st.disk_hits ? "from the on-disk cache, nothing compiled" : "from memory");
  runtime::GpuKernel k(fn, std::move(compiled));
  std::fprintf(stderr, "%s\n", k.compiled().info.to_string().c_str());
  std::vector<runtime::DeviceTensor> dev;
  dev.reserve(args.size());
  std::vector<runtime::DeviceArg> dargs;
  for (const runtime::Arg& a : args)
    if (a.kind() == runtime::Arg::Kind::Buffer) dev.push_back(runtime::DeviceTensor::from_host(*a.tensor()));
  size_t t = 0;
  for (const runtime::Arg& a : args) {
    if (a.kind() == runtime::Arg::Kind::Buffer) dargs.emplace_back(dev[t++]);
    else if (a.kind() == runtime::Arg::Kind::Float) dargs.emplace_back(a.as_double());
    else dargs.emplace_back(a.as_int());
  }
  k(grid, dargs);
  runtime::Event e0, e1;
  e0.record();
  for (int i = 0; i < reps; ++i) k(grid, dargs);
  e1.record();
  e1.synchronize();
  t = 0;
  for (const runtime::Arg& a : args)
    if (a.kind() == runtime::Arg::Kind::Buffer) dev[t++].to_host(*a.tensor());
  return e1.elapsed_ms(e0) / reps;
}

void report(double err, double tol, double ms, double flops, bool gpu) {
  std::printf("relative error vs float64 (sampled): %.3g (%s)\n", err, err < tol ? "ok" : "TOO LARGE");
  if (gpu) std::printf("time: %.4f ms per launch, %.1f TFLOP/s\n", ms, flops / (ms * 1e-3) / 1e12);
  else std::printf("time: %.1f ms (CPU interpreter)\n", ms);
}

int run_gemm(const KernelSelection& sel, std::vector<int64_t> shape, bool gpu, int reps) {
  if (shape.empty()) shape = gpu ? std::vector<int64_t>{1024, 1024, 1024} : std::vector<int64_t>{96, 80, 64};
  if (shape.size() != 3) throw UsageError("gemm needs --shape M,N,K");
  int64_t M = shape[0], N = shape[1], K = shape[2];
  ir::Function fn = sel.build();
  bool ak = meta_of<bool>(fn, mn::kAKmajor), bk = meta_of<bool>(fn, mn::kBKmajor);
  DType in_t = meta_of<DType>(fn, mn::kDtype), out_t = meta_of<DType>(fn, mn::kOutDtype);
  int64_t bm = meta_of<int64_t>(fn, mn::kBlockM), bn = meta_of<int64_t>(fn, mn::kBlockN), group = meta_of<int64_t>(fn, mn::kGroupM);
  HostTensor a(in_t, ak ? ir::Shape{M, K} : ir::Shape{K, M}), b(in_t, bk ? ir::Shape{N, K} : ir::Shape{K, N}), c(out_t, {M, N});
  a.fill_uniform(1, -1, 1);
  b.fill_uniform(2, -1, 1);
  runtime::Grid grid = group ? runtime::Grid{lang::cdiv(M, bm) * lang::cdiv(N, bn)} : runtime::Grid{lang::cdiv(M, bm), lang::cdiv(N, bn)};
  std::printf("gemm %lldx%lldx%lld on the %s\n", static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
              gpu ? "GPU" : "CPU interpreter");
  double ms = execute(fn, sel.options, grid, {a, b, c}, gpu, reps);
  std::mt19937 rng(3);
  double num = 0, den = 0;
  for (int s = 0; s < 256; ++s) {
    int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(M)), j = static_cast<int64_t>(rng() % static_cast<uint64_t>(N));
    double ref = 0;
    for (int64_t p = 0; p < K; ++p) ref += (ak ? a.get({i, p}) : a.get({p, i})) * (bk ? b.get({j, p}) : b.get({p, j}));
    num += (c.get({i, j}) - ref) * (c.get({i, j}) - ref);
    den += ref * ref;
  }
  report(std::sqrt(num / den), out_t == DType::f32 ? 1e-4 : 1e-2, ms, 2.0 * M * N * K, gpu);
  return 0;
}

int run_attention(KernelSelection sel, std::vector<int64_t> shape, bool gpu, int reps) {
  if (shape.empty()) shape = gpu ? std::vector<int64_t>{2, 8, 1024, 64} : std::vector<int64_t>{1, 2, 128, 64};
  if (shape.size() != 4) throw UsageError("attention_fwd needs --shape B,H,S,D");
  int64_t B = shape[0], H = shape[1], S = shape[2], D = shape[3];
  if (std::none_of(sel.meta.begin(), sel.meta.end(), [](const auto& m) { return m.first == mn::kHeadDim; }))
    sel.meta.push_back({mn::kHeadDim, D});
  ir::Function fn = sel.build();
  bool causal = meta_of<bool>(fn, mn::kCausal);
  DType t = meta_of<DType>(fn, mn::kDtype);
  int64_t bm = meta_of<int64_t>(fn, mn::kBlockM);
  HostTensor q(t, {B, H, S, D}), k(t, {B, H, S, D}), v(t, {B, H, S, D}), o(t, {B, H, S, D}), lse(DType::f32, {B, H, S});
  q.fill_normal(1, 0, 1);
  k.fill_normal(2, 0, 1);
  v.fill_normal(3, 0, 1);
  double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::printf("attention_fwd B=%lld H=%lld S=%lld D=%lld %s on the %s\n", static_cast<long long>(B), static_cast<long long>(H),
              static_cast<long long>(S), static_cast<long long>(D), causal ? "causal" : "full", gpu ? "GPU" : "CPU interpreter");
  double ms = execute(fn, sel.options, {lang::cdiv(S, bm), H, B}, {q, k, v, o, lse, static_cast<float>(scale)}, gpu, reps);
  std::mt19937 rng(4);
  double num = 0, den = 0;
  std::vector<double> p(static_cast<size_t>(S));
  for (int s = 0; s < 32; ++s) {
    int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(B)), h = static_cast<int64_t>(rng() % static_cast<uint64_t>(H));
    int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(S)), n = causal ? i + 1 : S;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      double d = 0;
      for (int64_t x = 0; x < D; ++x) d += q.get({b, h, i, x}) * k.get({b, h, j, x});
      p[static_cast<size_t>(j)] = d * scale;
      mx = std::max(mx, p[static_cast<size_t>(j)]);
    }
    for (int64_t j = 0; j < n; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
    for (int64_t x = 0; x < D; ++x) {
      double ref = 0;
      for (int64_t j = 0; j < n; ++j) ref += p[static_cast<size_t>(j)] * v.get({b, h, j, x});
      ref /= sum;
      num += (o.get({b, h, i, x}) - ref) * (o.get({b, h, i, x}) - ref);
      den += ref * ref;
    }
  }
  report(std::sqrt(num / den), 1e-2, ms, 4.0 * B * H * S * S * D / (causal ? 2 : 1), gpu);
  return 0;
}

}  // namespace

int cmd_run(const Args& args) {
  if (args.empty()) throw UsageError("run needs a kernel name (see `tilejit kernels`)");
  KernelSelection sel = select_kernel(args[0]);
  std::vector<int64_t> shape;
  std::string device;
  int reps = 20;
  for (size_t i = 1; i < args.size(); ++i) {
    if (parse_kernel_option(args, i, sel)) continue;
    if (args[i] == "--shape") shape = parse_shape(option_value(args, i));
    else if (args[i] == "--device") device = option_value(args, i);
    else if (args[i] == "--reps") {
      reps = parse_int("--reps", option_value(args, i));
      if (reps < 1 || reps > 1000000) throw UsageError(fmt::format("--reps {}: valid: 1 to 1000000", reps));
    }
    else throw UsageError(fmt::format("unknown option '{}'", args[i]));
  }
  auto& driver = runtime::Driver::get();
  if (device.empty()) device = driver.available() ? "gpu" : "cpu";
  if (device != "cpu" && device != "gpu") throw UsageError(fmt::format("--device {}: valid: cpu, gpu", device));
  bool gpu = device == "gpu";
  if (gpu) driver.require("tilejit run --device gpu");
  if (sel.kernel->name == "gemm") return run_gemm(sel, shape, gpu, reps);
  if (sel.kernel->name == "attention_fwd") return run_attention(sel, shape, gpu, reps);
  if (const std::string origin = library::origin_of(sel.kernel->name); !origin.empty())
    throw UsageError(fmt::format("`tilejit run` has inputs and a float64 reference only for gemm and attention_fwd; kernel '{}' "
                                 "(from {}) has neither here: compile, inspect, tune or bundle it with this tool, and check its "
                                 "values against your reference in the interpreter (runtime::interpret) from your own tests",
                                 sel.kernel->name, origin));
  throw UsageError(fmt::format("`tilejit run` does not know inputs for kernel '{}' yet", sel.kernel->name));
}

}  // namespace tilejit::cli
