// bench/launch_overhead: the host-side cost of one launch through tilejit::Function, GpuKernel and
// a raw cuLaunchKernel of the same cubin with pre-built arguments (issue 4: Function must add
// under 2 us). Two ways of timing each: "batched" times only the enqueue of short bursts (the
// stream is drained, untimed, between bursts, so the launch queue never fills: pure host cost);
// "tight" times one long loop of launches, where a full queue makes the host wait for the GPU.
//
//   build/bench/launch_overhead [--launches N] [--batch B] [--rounds R] [--no-gemm]
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "kernels/gemm.hpp"
#include "api/registry.hpp"
#include "runtime/function.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::DeviceArg;
using runtime::DeviceTensor;
using runtime::Grid;

namespace {

Kernel vector_add = kernel("vector_add", [](Builder& k) {
  auto X = k.pointer("X", f32, {.align_bytes = 16});
  auto Y = k.pointer("Y", f32, {.align_bytes = 16});
  auto Out = k.pointer("Out", f32, {.align_bytes = 16});
  auto n = k.scalar<int>("n");
  auto BLOCK = k.meta<int>("BLOCK", 256);
  auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
  auto mask = offs < n;
  store(Out + offs, load(X + offs, mask) + load(Y + offs, mask), mask);
});

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

struct Options {
  int launches = 100000;
  int batch = 256;
  int rounds = 9;
  bool gemm = true;
};

struct Variant {
  Variant(std::string n, std::function<void()> l) : name(std::move(n)), launch(std::move(l)) {}
  std::string name;
  std::function<void()> launch;  // one launch (the std::function call costs the same in every variant)
  std::vector<double> batched, tight, tight_cpu;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Rounds interleave the variants so that clock or thermal drift hits them alike.
void measure(std::vector<Variant>& variants, const runtime::Stream& stream, const Options& o) {
  for (Variant& v : variants)
    for (int i = 0; i < 2000; ++i) v.launch();  // warm-up (first calls, caches, descriptor sets)
  stream.synchronize();
  for (int r = 0; r < o.rounds; ++r)
    for (Variant& v : variants) {
      double enqueue = 0;
      for (int done = 0; done < o.launches; done += o.batch) {
        stream.synchronize();
        const int b = std::min(o.batch, o.launches - done);
        const double t0 = now_us();
        for (int i = 0; i < b; ++i) v.launch();
        enqueue += now_us() - t0;
      }
      stream.synchronize();
      v.batched.push_back(enqueue / o.launches);

      const double c0 = thread_cpu_us(), t0 = now_us();
      for (int i = 0; i < o.launches; ++i) v.launch();
      const double t1 = now_us(), c1 = thread_cpu_us();
      stream.synchronize();
      v.tight.push_back((t1 - t0) / o.launches);
      v.tight_cpu.push_back((c1 - c0) / o.launches);
    }
}

void report(const std::string& title, std::vector<Variant>& variants, const Options& o) {
  fmt::print("\n{}\n{} launches per measurement, batches of {}, median of {} rounds\n", title, o.launches, o.batch, o.rounds);
  fmt::print("{:<44} {:>18} {:>14} {:>16} {:>12}\n", "variant", "batched us/launch", "(best round)", "tight us/launch",
             "(tight cpu)");
  for (Variant& v : variants)
    fmt::print("{:<44} {:>18.3f} {:>14.3f} {:>16.3f} {:>12.3f}\n", v.name, median(v.batched),
               *std::min_element(v.batched.begin(), v.batched.end()), median(v.tight), median(v.tight_cpu));
  const double raw_b = median(variants[0].batched), raw_t = median(variants[0].tight);
  for (size_t i = 1; i < variants.size(); ++i)
    fmt::print("  {:<42} {:+.3f} us/launch over raw (batched), {:+.3f} (tight)\n", variants[i].name, median(variants[i].batched) - raw_b,
               median(variants[i].tight) - raw_t);
}

int parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--launches") o.launches = std::max(1, value());
    else if (a == "--batch") o.batch = std::max(1, value());
    else if (a == "--rounds") o.rounds = std::max(1, value());
    else if (a == "--no-gemm") o.gemm = false;
    else {
      std::fprintf(stderr, "usage: launch_overhead [--launches N] [--batch B] [--rounds R] [--no-gemm]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse(argc, argv, o); rc >= 0) return rc;
  auto& driver = runtime::Driver::get();
  if (!driver.available()) {
    std::fprintf(stderr, "bench/launch_overhead needs a GPU: %s\n", driver.unavailable_reason().c_str());
    return 2;
  }
  const runtime::DriverApi& api = driver.api();
  fmt::print("GPU: {} (driver {}), host-side cost of one launch\n", driver.props(0).name, driver.driver_version());
  runtime::Stream stream;
  const CUstream s = stream.handle();

  // ---- vector add: 4 parameters, one program --------------------------------------------------
  const int n = 256;
  Function add = tilejit::compile(vector_add, {{"BLOCK", 256}});
  DeviceTensor x(f32, {n}), y(f32, {n}), out(f32, {n});
  {
    runtime::HostTensor hx(f32, {n}), hy(f32, {n});
    hx.fill_uniform(1, -1, 1);
    hy.fill_uniform(2, -1, 1);
    x = DeviceTensor::from_host(hx);
    y = DeviceTensor::from_host(hy);
  }
  const Grid grid{1};
  add(grid, s, x, y, out, n);  // compiles and loads
  stream.synchronize();
  const jit::CompiledKernel& ck = add.compiled();
  runtime::GpuKernel gk(add.signature(), ck);  // the same cubin, its own module
  CUfunction fn = add.gpu_kernel().function();
  const auto threads = static_cast<unsigned>(ck.num_threads), smem = static_cast<unsigned>(ck.smem_bytes);
  CUdeviceptr px = x.ptr(), py = y.ptr(), po = out.ptr();
  int32_t nn = n;
  void* raw_params[] = {&px, &py, &po, &nn};
  const std::array<DeviceArg, 4> prebuilt{x, y, out, n};

  std::vector<Variant> v;
  v.emplace_back("raw cuLaunchKernel (pre-built params)", [&] {
                 runtime::check_cu(api.LaunchKernel(fn, 1, 1, 1, threads, 1, 1, smem, s, raw_params, nullptr), "cuLaunchKernel");
               });
  v.emplace_back("GpuKernel(grid, {x, y, out, n}, stream)", [&] { gk(grid, {x, y, out, n}, s); });
  v.emplace_back("GpuKernel::launch(grid, span, stream)", [&] { gk.launch(grid, prebuilt, s); });
  v.emplace_back("Function(grid, stream, x, y, out, n)", [&] { add(grid, s, x, y, out, n); });
  v.emplace_back("Function::launch(grid, stream, span)", [&] { add.launch(grid, s, prebuilt); });
  measure(v, stream, o);
  {
    auto hx = x.to_host().to_f64(), hy = y.to_host().to_f64(), ho = out.to_host().to_f64();
    for (int i = 0; i < n; ++i)
      if (ho[static_cast<size_t>(i)] != static_cast<double>(static_cast<float>(hx[static_cast<size_t>(i)] + hy[static_cast<size_t>(i)]))) {
        std::fprintf(stderr, "vector add gave a wrong result at %d\n", i);
        return 1;
      }
  }
  report(fmt::format("vector_add: 4 parameters, 1 program of {} threads", threads), v, o);
  // What tilejit itself adds, without the driver's noise: the checks and packing every launch does.
  {
    const int reps = 10 * o.launches;
    double best = 1e30;
    for (int r = 0; r < o.rounds; ++r) {
      const double t0 = now_us();
      for (int i = 0; i < reps; ++i) add.check(grid, x, y, out, n);
      best = std::min(best, (now_us() - t0) / reps);
    }
    fmt::print("  argument checks + ABI packing alone (Function::check, no launch): {:.1f} ns/call\n", best * 1e3);
  }
  const double fn_over = median(v[3].batched) - median(v[0].batched);

  // ---- GEMM through TMA descriptors (the locked path): 128x256x64, one program ------------------
  double gemm_over = 0;
  if (o.gemm) {
    const library::LibraryKernel* lk = library::find("gemm");
    jit::CompileOptions opts;
    opts.num_warps = lk->num_warps;
    opts.pipeline.stages = lk->stages;
    Function gemm = tilejit::compile(kernels::gemm(), lk->default_meta, opts);
    const int M = 128, N = 256, K = 64;
    DeviceTensor a(bf16, {M, K}), a2(bf16, {M, K}), b(bf16, {N, K}), c(f32, {M, N});
    a.buffer().fill_bytes(0);
    a2.buffer().fill_bytes(0);
    b.buffer().fill_bytes(0);
    gemm(grid, s, a, b, c);
    stream.synchronize();
    const jit::CompiledKernel& gc = gemm.compiled();
    CUfunction gfn = gemm.gpu_kernel().function();
    // The raw launch's own descriptors, encoded and uploaded once.
    runtime::DeviceBuffer maps(128 * gc.tensor_maps.size());
    for (size_t m = 0; m < gc.tensor_maps.size(); ++m) {
      const auto& spec = gc.tensor_maps[m];
      const DeviceTensor& t = spec.param_index == 0 ? a : b;
      cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.sizes()[1]), static_cast<cuuint64_t>(t.sizes()[0])};
      cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.strides()[0] * 2)};
      cuuint32_t box[2] = {static_cast<cuuint32_t>(spec.box[0]), static_cast<cuuint32_t>(spec.box[1])};
      cuuint32_t unit[2] = {1, 1};
      CUtensorMap map;
      runtime::check_cu(api.TensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(t.ptr()), dims,
                                                 strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                        "cuTensorMapEncodeTiled");
      maps.upload(&map, 128, 128 * m);
    }
    std::vector<uint64_t> slots;
    for (const DeviceTensor* t : {&a, &b, &c}) {
      slots.push_back(t->ptr());
      for (int64_t sz : t->sizes()) slots.push_back(static_cast<uint32_t>(sz));
      for (int64_t st : t->strides()) slots.push_back(static_cast<uint64_t>(st));
    }
    for (size_t m = 0; m < gc.tensor_maps.size(); ++m) slots.push_back(maps.ptr() + 128 * m);
    std::vector<void*> gparams;
    for (uint64_t& sl : slots) gparams.push_back(&sl);
    const auto gthreads = static_cast<unsigned>(gc.num_threads), gsmem = static_cast<unsigned>(gc.smem_bytes);
    const std::array<DeviceArg, 3> gprebuilt{a, b, c};

    std::vector<Variant> g;
    g.emplace_back("raw cuLaunchKernel (pre-built params)", [&] {
                   runtime::check_cu(api.LaunchKernel(gfn, 1, 1, 1, gthreads, 1, 1, gsmem, s, gparams.data(), nullptr),
                                     "cuLaunchKernel");
                 });
    g.emplace_back("Function(grid, stream, a, b, c)", [&] { gemm(grid, s, a, b, c); });
    g.emplace_back("Function::launch(grid, stream, span)", [&] { gemm.launch(grid, s, gprebuilt); });
    // A layout change each call: the descriptors are found among the encoded sets, not re-encoded.
    bool flip = false;
    g.emplace_back("Function, A alternating between 2 tensors", [&] { gemm(grid, s, (flip = !flip) ? a2 : a, b, c); });
    Options go = o;
    go.launches = std::max(1, o.launches / 10);  // each GEMM program runs ~10 us
    measure(g, stream, go);
    report(fmt::format("gemm (TMA descriptors, default schedule): 3 tensors + {} descriptors, 1 program of {} threads, {} B smem",
                       gc.tensor_maps.size(), gthreads, gsmem),
           g, go);
    gemm_over = median(g[1].batched) - median(g[0].batched);
  }

  fmt::print("\nSummary: Function adds {:+.3f} us per launch over raw cuLaunchKernel (vector_add, batched){}; target < 2 us: {}\n",
             fn_over, o.gemm ? fmt::format(", {:+.3f} us with TMA descriptors (gemm)", gemm_over) : std::string{},
             fn_over < 2.0 && gemm_over < 2.0 ? "met" : "NOT met");
  return 0;
}
