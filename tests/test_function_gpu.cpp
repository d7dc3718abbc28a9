// tilejit::Function on the GPU (ctest label "gpu"): vector add and the library GEMM (TMA + wgmma,
// default schedule) against the interpreter, no recompile for a second Function, the TMA
// descriptor cache across changing layouts (and its recycling), 8 threads calling one Function on
// their own streams, the GEMM writing a dropout mask in its K loop or on warps of its own (DROPOUT_MASK, MASK_WARPS). Skips visibly
// without a GPU.
#include "runtime/function.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dsl/lang.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/gemm.hpp"
#include "kernels/philox_host.hpp"
#include "api/registry.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::DeviceTensor;
using runtime::Grid;
using runtime::HostTensor;

// GCC pairs the inlined operator new below with free() and warns; they do match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
// Counts the heap allocations of this thread while `counting` is set: the launch path must make none.
namespace {
thread_local bool counting = false;
std::atomic<long> allocations{0};
}  // namespace
void* operator new(std::size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

bool have_gpu() {
  if (runtime::Driver::get().available()) return true;
  MESSAGE("SKIPPED: no GPU: " << runtime::Driver::get().unavailable_reason());
  return false;
}

// The library GEMM under its default schedule (what `tilejit compile gemm` builds).
Function default_gemm() {
  const library::LibraryKernel* lk = library::find("gemm");
  REQUIRE(lk);
  jit::CompileOptions o;
  o.num_warps = lk->num_warps;
  o.pipeline.stages = lk->stages;
  return tilejit::compile(kernels::gemm(), lk->default_meta, o);
}

Grid gemm_grid(int64_t m, int64_t n) {
  const library::LibraryKernel* lk = library::find("gemm");
  int64_t bm = 0, bn = 0;
  for (const auto& [name, v] : lk->default_meta) {
    if (name == "BLOCK_M") bm = std::get<int64_t>(v);
    if (name == "BLOCK_N") bn = std::get<int64_t>(v);
  }
  return Grid{cdiv(m, bm) * cdiv(n, bn)};  // GROUP_M > 0: a 1-D grid
}

// C[M,N] = A[M,K] @ Bt[N,K]^T in float64 (bf16 inputs are exact in double).
std::vector<double> gemm_ref(const HostTensor& a, const HostTensor& bt, int64_t row0 = 0, int64_t m = -1) {
  const int64_t M = m < 0 ? a.sizes()[0] : m, K = a.sizes()[1], N = bt.sizes()[0];
  auto av = a.to_f64(), bv = bt.to_f64();
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t p = 0; p < K; ++p) s += av[static_cast<size_t>((row0 + i) * K + p)] * bv[static_cast<size_t>(j * K + p)];
      c[static_cast<size_t>(i * N + j)] = s;
    }
  return c;
}

}  // namespace

TEST_CASE("gpu: Function vector add matches the interpreter exactly, on the default and a user stream") {
  if (!have_gpu()) return;
  Function add = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 256}});
  runtime::Stream stream;
  for (int n : {1000, 1 << 20, 1}) {
    INFO("n = " << n);
    HostTensor x(f32, {n}), y(f32, {n}), ref(f32, {n});
    x.fill_uniform(static_cast<uint64_t>(n), -1, 1);
    y.fill_uniform(static_cast<uint64_t>(n) + 1, -1, 1);
    const Grid grid{cdiv(n, 256)};
    runtime::interpret(add.signature(), grid, {x, y, ref, n});
    auto dx = DeviceTensor::from_host(x), dy = DeviceTensor::from_host(y);
    DeviceTensor out(f32, {n});  // poisoned
    add(grid, nullptr, dx, dy, out, n);
    CHECK(runtime::max_abs_error(out.to_host().to_f64(), ref.to_f64()) == 0);
    out.poison();
    add(grid, stream, dx, dy, out, n);  // runtime::Stream overload
    stream.synchronize();
    CHECK(runtime::max_abs_error(out.to_host().to_f64(), ref.to_f64()) == 0);
    // The dynamic form.
    out.poison();
    const std::vector<runtime::DeviceArg> args{dx, dy, out, n};
    add.launch(grid, stream.handle(), args);
    stream.synchronize();
    CHECK(runtime::max_abs_error(out.to_host().to_f64(), ref.to_f64()) == 0);
  }
  CHECK(add.loaded());
  // Checks still run on every call once loaded.
  DeviceTensor small(f32, {16});
  CHECK_THROWS_AS(add({1}, nullptr, small, small, small, 2.5), std::invalid_argument);
  DeviceTensor wrong(i32, {16});
  CHECK_THROWS_AS(add({1}, nullptr, small, wrong, small, 16), std::invalid_argument);
  CHECK_THROWS_AS(add({0}, nullptr, small, small, small, 16), std::invalid_argument);
}

TEST_CASE("gpu: Function runs the library GEMM (default schedule, TMA + wgmma) like the interpreter") {
  if (!have_gpu()) return;
  Function gemm = default_gemm();
  struct Shape3 {
    int m, n, k;
  };
  // The second shape changes every TMA tensor's layout; the third returns to the first (its
  // descriptors are found again, not re-encoded).
  std::vector<Shape3> shapes{{256, 256, 128}, {200, 136, 192}, {256, 256, 128}};
  std::vector<HostTensor> as, bs;
  std::vector<DeviceTensor> das, dbs;
  as.reserve(3), bs.reserve(3), das.reserve(3), dbs.reserve(3);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape3 s = shapes[i];
    INFO(fmt::format("{}x{}x{}", s.m, s.n, s.k));
    if (i < 2) {
      as.emplace_back(bf16, ir::Shape{s.m, s.k});
      bs.emplace_back(bf16, ir::Shape{s.n, s.k});
      as.back().fill_uniform(31 + i, -1, 1);
      bs.back().fill_uniform(41 + i, -1, 1);
      das.push_back(DeviceTensor::from_host(as.back()));
      dbs.push_back(DeviceTensor::from_host(bs.back()));
    }
    const size_t t = i % 2;
    HostTensor ref(f32, {s.m, s.n});
    const Grid grid = gemm_grid(s.m, s.n);
    runtime::interpret(gemm.signature(), grid, {as[t], bs[t], ref});
    DeviceTensor c(f32, {s.m, s.n});
    gemm(grid, nullptr, das[t], dbs[t], c);
    double err = runtime::rel_error(c.to_host().to_f64(), ref.to_f64());
    INFO("rel. error " << err);
    CHECK(err <= 1e-5);
  }
  REQUIRE(gemm.compiled().tensor_maps.size() == 2);  // it was the TMA pipeline
}

TEST_CASE("gpu: a second Function for the same kernel and meta compiles nothing") {
  if (!have_gpu()) return;
  Function first = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 128}});
  const int n = 5000;
  HostTensor x(f32, {n}), y(f32, {n}), ref(f32, {n});
  x.fill_uniform(7, -1, 1);
  y.fill_uniform(8, -1, 1);
  runtime::interpret(first.signature(), {cdiv(n, 128)}, {x, y, ref, n});
  auto dx = DeviceTensor::from_host(x), dy = DeviceTensor::from_host(y);
  DeviceTensor out(f32, {n});
  first({cdiv(n, 128)}, nullptr, dx, dy, out, n);
  const auto before = runtime::compile_cache_stats();
  Function second = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 128}});
  out.poison();
  second({cdiv(n, 128)}, nullptr, dx, dy, out, n);
  const auto after = runtime::compile_cache_stats();
  CHECK(after.compiles == before.compiles);
  CHECK(after.disk_hits == before.disk_hits);
  CHECK(after.memory_hits == before.memory_hits + 1);
  CHECK(runtime::max_abs_error(out.to_host().to_f64(), ref.to_f64()) == 0);
  // Later calls do not go through the cache at all.
  for (int i = 0; i < 10; ++i) second({cdiv(n, 128)}, nullptr, dx, dy, out, n);
  CHECK(runtime::compile_cache_stats().memory_hits == after.memory_hits);
}

TEST_CASE("gpu: 8 threads call one Function concurrently on their own streams") {
  if (!have_gpu()) return;
  Function add = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 512}});
  Function gemm = default_gemm();
  constexpr int kThreads = 8, kLaunches = 50;
  const int n = 100000;
  const int M = 128, N = 256, K = 64;
  struct PerThread {
    HostTensor x, y, ref, a, bt;
    std::vector<double> c_ref;
  };
  std::vector<PerThread> host(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    PerThread& h = host[static_cast<size_t>(t)];
    h.x = HostTensor(f32, {n});
    h.y = HostTensor(f32, {n});
    h.ref = HostTensor(f32, {n});
    h.x.fill_uniform(100 + t, -1, 1);
    h.y.fill_uniform(200 + t, -1, 1);
    runtime::interpret(add.signature(), {cdiv(n, 512)}, {h.x, h.y, h.ref, n});
    h.a = HostTensor(bf16, {M, K});
    h.bt = HostTensor(bf16, {N, K});
    h.a.fill_uniform(300 + t, -1, 1);
    h.bt.fill_uniform(400 + t, -1, 1);
    h.c_ref = gemm_ref(h.a, h.bt);
  }
  // First calls from the main thread are not required: the threads race for the compile too.
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  std::vector<double> add_err(kThreads, -1), gemm_err(kThreads, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        PerThread& h = host[static_cast<size_t>(t)];
        runtime::Stream stream;
        auto dx = DeviceTensor::from_host(h.x), dy = DeviceTensor::from_host(h.y);
        auto da = DeviceTensor::from_host(h.a), db = DeviceTensor::from_host(h.bt);
        DeviceTensor out(f32, {n}), c(f32, {M, N});
        for (int i = 0; i < kLaunches; ++i) {
          add({cdiv(n, 512)}, stream, dx, dy, out, n);
          gemm(gemm_grid(M, N), stream, da, db, c);  // every thread's own tensors: TMA layouts alternate
        }
        stream.synchronize();
        add_err[static_cast<size_t>(t)] = runtime::max_abs_error(out.to_host().to_f64(), h.ref.to_f64());
        gemm_err[static_cast<size_t>(t)] = runtime::rel_error(c.to_host().to_f64(), h.c_ref);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
        ++failures;
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << errors[static_cast<size_t>(t)]);
    CHECK(errors[static_cast<size_t>(t)].empty());
    CHECK(add_err[static_cast<size_t>(t)] == 0);
    CHECK(gemm_err[static_cast<size_t>(t)] >= 0);
    CHECK(gemm_err[static_cast<size_t>(t)] <= 1e-5);
  }
  CHECK(failures == 0);
}

TEST_CASE("gpu: TMA GEMMs captured in a CUDA graph replay with their own descriptors after 20 other layouts") {
  if (!have_gpu()) return;
  // The descriptors are kernel parameters (decision 052): the graph holds copies, so launches on
  // other tensors in between (more layouts than the launcher's 16 host sets) cannot change them.
  Function gemm = default_gemm();
  const runtime::DriverApi& api = runtime::Driver::get().api();
  runtime::Stream stream(0);
  struct Shape3 {
    int m, n, k;
  };
  const std::vector<Shape3> shapes{{256, 256, 128}, {200, 136, 192}, {128, 512, 64}};
  std::vector<HostTensor> as, bs;
  std::vector<DeviceTensor> das, dbs, dcs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape3 sh = shapes[i];
    as.emplace_back(bf16, ir::Shape{sh.m, sh.k});
    bs.emplace_back(bf16, ir::Shape{sh.n, sh.k});
    das.push_back(DeviceTensor::empty_like(as.back()));
    dbs.push_back(DeviceTensor::empty_like(bs.back()));
    dcs.emplace_back(f32, ir::Shape{sh.m, sh.n});
    gemm(gemm_grid(sh.m, sh.n), stream.handle(), das[i], dbs[i], dcs[i]);  // warm-up: compiles, loads
  }
  stream.synchronize();
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  REQUIRE(api.StreamBeginCapture(stream.handle(), CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  for (size_t i = 0; i < shapes.size(); ++i) gemm(gemm_grid(shapes[i].m, shapes[i].n), stream.handle(), das[i], dbs[i], dcs[i]);
  REQUIRE(api.StreamEndCapture(stream.handle(), &graph) == CUDA_SUCCESS);
  REQUIRE(api.GraphInstantiate(&exec, graph, 0) == CUDA_SUCCESS);
  {  // 20 other layouts through the same kernel
    std::vector<DeviceTensor> keep;
    for (int i = 0; i < 20; ++i) {
      const int m = 64 * (i % 4 + 1), n = 64 * (i % 3 + 1), k = 64 * (i % 5 + 1);
      keep.emplace_back(bf16, ir::Shape{m, k});
      keep.emplace_back(bf16, ir::Shape{n, k});
      keep.emplace_back(f32, ir::Shape{m, n});
      gemm(gemm_grid(m, n), stream.handle(), keep[keep.size() - 3], keep[keep.size() - 2], keep.back());
    }
    stream.synchronize();
  }
  for (int replay = 0; replay < 2; ++replay) {
    for (size_t i = 0; i < shapes.size(); ++i) {  // new inputs in the captured buffers
      as[i].fill_uniform(100 + 10 * replay + static_cast<int>(i), -1, 1);
      bs[i].fill_uniform(200 + 10 * replay + static_cast<int>(i), -1, 1);
      das[i].buffer().upload(as[i].data(), as[i].bytes());
      dbs[i].buffer().upload(bs[i].data(), bs[i].bytes());
      dcs[i].poison();
    }
    REQUIRE(api.GraphLaunch(exec, stream.handle()) == CUDA_SUCCESS);
    stream.synchronize();
    for (size_t i = 0; i < shapes.size(); ++i) {
      INFO(fmt::format("replay {}, {}x{}x{}", replay, shapes[i].m, shapes[i].n, shapes[i].k));
      HostTensor ref(f32, {shapes[i].m, shapes[i].n});
      runtime::interpret(gemm.signature(), gemm_grid(shapes[i].m, shapes[i].n), {as[i], bs[i], ref});
      CHECK(runtime::rel_error(dcs[i].to_host().to_f64(), ref.to_f64()) <= 1e-5);
    }
  }
  api.GraphExecDestroy(exec);
  api.GraphDestroy(graph);
}

// The DROPOUT_MASK cases' problem: A [512, 256], B^T [512, 256], the plain GEMM's C, and a poisoned
// mask of 3 x 300 x 1000 bits (60 tiles of 64 x 8 words); the key's arguments as the kernel takes
// them (rng_state unused: a null u32 view, rng_state_in_memory 0).
struct MaskGemmProblem {
  static constexpr int M = 512, N = 512, K = 256, BH = 3, Sq = 300, Sk = 1000, words = (Sk + 31) / 32;
  static constexpr int64_t kEmpty[1] = {0}, kUnit[1] = {1};
  DeviceTensor da, db, c0{f32, {M, N}}, c1{f32, {M, N}}, mask;
  const runtime::TensorView no_state{u32, kEmpty, kUnit, 0, 0};

  explicit MaskGemmProblem(uint64_t seed) {
    HostTensor a(bf16, {M, K}), b(bf16, {N, K}), poisoned(u32, {BH, Sq, words});
    a.fill_uniform(seed, -1, 1);
    b.fill_uniform(seed + 1, -1, 1);
    poisoned.poison();
    da = DeviceTensor::from_host(a), db = DeviceTensor::from_host(b), mask = DeviceTensor::from_host(poisoned);
    Function plain = default_gemm();
    plain(gemm_grid(M, N), nullptr, da, db, c0);
  }
  // Runs `g` (a DROPOUT_MASK GEMM) into c1 and the mask under key r, then `extra` more arguments.
  template <class... Extra>
  void run(Function& g, const kernels::DropoutRngHost& r, Extra... extra) {
    g(gemm_grid(M, N), nullptr, da, db, c1, mask, int32_t{Sk}, static_cast<uint32_t>(r.seed), static_cast<uint32_t>(r.seed >> 32),
      static_cast<uint32_t>(r.offset), static_cast<uint32_t>(r.offset >> 32), r.keep_threshold, no_state, 0u, extra...);
  }
  // C bit-identical to the plain GEMM's, the mask the host's bit for bit.
  void check(const kernels::DropoutRngHost& r) const {
    const HostTensor h0 = c0.to_host(), h1 = c1.to_host(), hm = mask.to_host();
    CHECK(std::memcmp(h0.data(), h1.data(), static_cast<size_t>(M * N) * 4) == 0);
    const std::vector<uint32_t> want = kernels::dropout_mask_packed_host(r, BH, Sq, Sk);
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += static_cast<const uint32_t*>(hm.data())[i] != want[i];
    CHECK(bad == 0);
  }
};

TEST_CASE("gpu: the library GEMM with DROPOUT_MASK: C bit-identical to the plain GEMM, the mask the host's bit for bit") {
  if (!have_gpu()) return;
  const library::LibraryKernel* lk = library::find("gemm");
  REQUIRE(lk);
  // in the K loop, and on 4 warps of their own beside the GEMM's 8 (warp roles, with and without setmaxnreg)
  for (const int schedule : {0, 1, 2}) {
    INFO("schedule " << schedule << " (0: K loop, 1: MASK_WARPS=4, 2: MASK_WARPS=4 with setmaxnreg)");
    jit::CompileOptions o;
    o.num_warps = lk->num_warps + (schedule ? 4 : 0);
    o.pipeline.stages = lk->stages;
    Meta meta = lk->default_meta;
    meta.emplace_back("DROPOUT_MASK", true);
    meta.emplace_back("MASK_BLOCK_W", 8);
    if (schedule) meta.emplace_back("MASK_WARPS", 4);
    if (schedule == 2) meta.insert(meta.end(), {{"MMA_REGISTERS", 224}, {"MASK_REGISTERS", 56}});
    Function with = tilejit::compile(kernels::gemm(), meta, o);
    // 8 programs x 4 K steps = 32 mask tiles in the loop, 28 of the 60 after it
    MaskGemmProblem p(71);
    const kernels::DropoutRngHost r{0x0123456789abcdefull, 0x0000000500000007ull, 230};
    p.run(with, r);
    REQUIRE(with.compiled().tensor_maps.size() == 2);  // still the TMA pipeline
    p.check(r);
  }
}

// MASK_RANGE (issue 30): three GEMMs write one mask's tiles [0, 20), [20, 45), [45, 1000) (past the
// end: clamped) -- together the host's mask bit for bit, their C the plain GEMM's.
TEST_CASE("gpu: GEMMs with MASK_RANGE write one mask together, each its own tiles") {
  if (!have_gpu()) return;
  const library::LibraryKernel* lk = library::find("gemm");
  REQUIRE(lk);
  jit::CompileOptions o;
  o.num_warps = lk->num_warps;
  o.pipeline.stages = lk->stages;
  Meta meta = lk->default_meta;
  meta.insert(meta.end(), {{"DROPOUT_MASK", true}, {"MASK_BLOCK_W", 8}, {"MASK_RANGE", true}});
  Function ranged = tilejit::compile(kernels::gemm(), meta, o);
  MaskGemmProblem p(73);
  const kernels::DropoutRngHost r{42, 1ull << 40, 13};
  for (auto [first, end] : {std::pair{0, 20}, std::pair{20, 45}, std::pair{45, 1000}}) p.run(ranged, r, int32_t{first}, int32_t{end});
  REQUIRE(ranged.compiled().tensor_maps.size() == 2);
  p.check(r);
}

TEST_CASE("gpu: a channel between warp roles carries every tile, in order, through 1 to 3 slots") {
  if (!have_gpu()) return;
  for (int stages : {1, 2, 3}) {
    INFO("stages " << stages);
    jit::CompileOptions o;
    o.num_warps = 12;
    Function f = tilejit::compile(test_kernels::channel_kernel(), {{"STAGES", stages}}, o);
    const int programs = 264, n = 40;  // two programs per SM at once on an H100, 40 tiles each
    DeviceTensor out(u32, {programs, n, 8});
    f(Grid{programs}, nullptr, out, int32_t{n});
    const HostTensor h = out.to_host();
    const std::vector<uint32_t> want = test_kernels::channel_expected(programs, n);
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += static_cast<const uint32_t*>(h.data())[i] != want[i];
    CHECK(bad == 0);
  }
}

TEST_CASE("gpu: wgmma with A from registers (a Q block without TMA) at K = 64 and 128, alone and in a warp role, against the interpreter") {
  if (!have_gpu()) return;
  for (const int64_t d : {64, 128})
    for (const bool role : {false, true})
      for (const int variant : {0, 1, 2, 3, 4, 5, 6}) {  // 1: the key loop's TMA ring re-entered by an outer loop; 2:
                                                         // words through a channel; 3: two Q blocks through registers;
                                                         // 4: dQ's shape; 5: the same with Q by TMA; 6: with S's A
                                                         // operand computed in the loop from Q (hoisted by LLVM)
        const bool outer = variant == 1, channel = variant == 2, two = variant == 3, acc = variant >= 4, q_tma = variant == 5,
                   inner = variant == 6;
        if (channel && !role) continue;
        INFO("HEAD_DIM " << d << " role " << role << " outer " << outer << " channel " << channel << " two " << two << " acc " << acc << " q_tma " << q_tma << " inner " << inner);
        jit::CompileOptions o;
        o.num_warps = role ? 8 : 4;
        const lang::Meta meta{{"HEAD_DIM", d}, {"ROLE", role}, {"OUTER", outer}, {"CHANNEL", channel}, {"TWO", two}, {"ACC", acc}, {"Q_TMA", q_tma}, {"INNER", inner}};
        Function f = tilejit::compile(test_kernels::qk_registers(), meta, o);
        const int64_t M = 256, N = 512;
        HostTensor q(bf16, {M, d}), k(bf16, {N, d}), ref(f32, {M, N});
        q.fill_uniform(81, -1, 1);
        k.fill_uniform(82, -1, 1);
        runtime::interpret(test_kernels::qk_registers().build(meta), {M / 64}, {q, k, ref});
        DeviceTensor dq = DeviceTensor::from_host(q), dk = DeviceTensor::from_host(k), s(f32, {M, N});
        f(Grid{M / 64}, nullptr, dq, dk, s);
        // (relative to the largest value: ACC's bf16 rounding of S may differ in the last bit)
        const std::vector<double> want = ref.to_f64();
        double largest = 1;
        for (double x : want) largest = std::max(largest, std::abs(x));
        CHECK(runtime::max_abs_error(s.to_host().to_f64(), want) < 1e-3 * largest);
      }
}

// The register path for A operands loaded once (what a tensor without a 16-byte alignment promise
// gets) on the real attention kernels, bit for bit against the TMA path: every once-loaded window that feeds a wgmma as A (Q in the
// forward and dQ, K and V in dK/dV, dO in dQ) through registers instead of TMA. Before the
// keep_alive fix this path gave wrong dK, dV and dQ (166 failed checks of the attention suite).
TEST_CASE("gpu: attention kernels with once-loaded windows through registers give the TMA path's outputs") {
  if (!have_gpu()) return;
  const int64_t B = 1, H = 2, S = 320;
  for (const int64_t D : {64, 128})
    for (const bool causal : {false, true}) {
      INFO("D " << D << " causal " << causal);
      HostTensor q(bf16, {B, S, H, D}), k(bf16, {B, S, H, D}), v(bf16, {B, S, H, D}), dout(bf16, {B, S, H, D});
      q.fill_uniform(31, -1, 1), k.fill_uniform(32, -1, 1), v.fill_uniform(33, -1, 1), dout.fill_uniform(34, -1, 1);
      auto dq_in = DeviceTensor::from_host(q), dk_in = DeviceTensor::from_host(k), dv_in = DeviceTensor::from_host(v),
           ddo = DeviceTensor::from_host(dout);
      const float scale = static_cast<float>(1 / std::sqrt(double(D)));
      const lang::Meta base{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"BSHD", true}, {"CAUSAL", causal}};
      auto meta = [&](int64_t bm, int64_t bn) {
        lang::Meta m = base;
        m.insert(m.end(), {{"BLOCK_M", bm}, {"BLOCK_N", bn}});
        return m;
      };
      auto options = [](int warps, bool once_by_tma) {
        jit::CompileOptions o;
        o.num_warps = warps;
        o.pipeline.stages = 2;
        o.pipeline.once_by_tma = once_by_tma;
        return o;
      };
      std::vector<double> outs[2][6];  // O, LSE, Delta, dK, dV, dQ per path
      for (const int registers : {0, 1}) {
        const bool tma = registers == 0;
        Function fwd = tilejit::compile(kernels::attention_forward(), meta(128, 128), options(8, tma));
        Function pre = tilejit::compile(kernels::attention_backward_preprocess(), {{"DTYPE", bf16}, {"HEAD_DIM", D}, {"BLOCK_M", 64}, {"BSHD", true}},
                                        options(4, true));
        Function dkdv = tilejit::compile(kernels::attention_backward_dkdv(), meta(64, 64), options(4, tma));
        Function dqk = tilejit::compile(kernels::attention_backward_dq(), meta(64, 64), options(4, tma));
        if (registers) {  // the path taken: fewer tensor maps; dK/dV keeps its K and V fragments alive
          CHECK(fwd.compiled().tensor_maps.size() < tilejit::compile(kernels::attention_forward(), meta(128, 128), options(8, true)).compiled().tensor_maps.size());
          CHECK(dkdv.compiled().ptx.find("st.shared.b32 [S1]") != std::string::npos);
        }
        DeviceTensor o(bf16, {B, S, H, D}), lse(f32, {B, H, S}), delta(f32, {B, H, S}), dk(bf16, {B, S, H, D}), dv(bf16, {B, S, H, D}),
            dq(bf16, {B, S, H, D});
        fwd(Grid{lang::cdiv(S, 128), H, B}, nullptr, dq_in, dk_in, dv_in, o, lse, scale);
        pre(Grid{lang::cdiv(S, 64), H, B}, nullptr, o, ddo, delta);
        dkdv(Grid{lang::cdiv(S, 64), H, B}, nullptr, dq_in, dk_in, dv_in, ddo, lse, delta, dk, dv, scale);
        dqk(Grid{lang::cdiv(S, 64), H, B}, nullptr, dq_in, dk_in, dv_in, ddo, lse, delta, dq, scale);
        int i = 0;
        for (DeviceTensor* t : {&o, &lse, &delta, &dk, &dv, &dq}) outs[registers][i++] = t->to_host().to_f64();
      }
      const char* names[6] = {"O", "LSE", "Delta", "dK", "dV", "dQ"};
      for (int i = 0; i < 6; ++i) {
        INFO(names[i]);
        double largest = 0;
        for (double x : outs[0][i]) largest = std::max(largest, std::abs(x));
        CHECK(largest > 0);
        CHECK(outs[1][i] == outs[0][i]);  // bit for bit: the same MMAs, only A's source differs
      }
    }
}

TEST_CASE("gpu: more distinct TMA layouts than descriptor sets: recycled sets never reach a pending launch") {
  if (!have_gpu()) return;
  Function gemm = default_gemm();
  // 150 launches, each on A shifted by one row (a new descriptor for A every time: more than the
  // 128 sets the launcher keeps) and writing its own block of C; all queued before any check.
  const int M = 128, N = 256, K = 64, kLaunches = 150;
  HostTensor a(bf16, {M + kLaunches, K}), bt(bf16, {N, K});
  a.fill_uniform(5, -1, 1);
  bt.fill_uniform(6, -1, 1);
  auto da = DeviceTensor::from_host(a), db = DeviceTensor::from_host(bt);
  DeviceTensor c(f32, {int64_t{kLaunches} * M, N});
  runtime::Stream stream;
  const std::vector<int64_t> a_sizes{M, K}, a_strides{K, 1}, c_sizes{M, N}, c_strides{N, 1};
  for (int i = 0; i < kLaunches; ++i) {
    runtime::TensorView av{bf16, a_sizes, a_strides, da.ptr() + static_cast<uint64_t>(i) * K * 2, 0};
    runtime::TensorView cv{f32, c_sizes, c_strides, c.ptr() + static_cast<uint64_t>(i) * M * N * 4, 0};
    gemm(gemm_grid(M, N), stream, av, db, cv);
  }
  stream.synchronize();
  auto got = c.to_host().to_f64();
  int bad = 0;
  for (int i = 0; i < kLaunches; ++i) {
    std::vector<double> ref = gemm_ref(a, bt, i, M);
    std::vector<double> block(got.begin() + static_cast<ptrdiff_t>(i) * M * N, got.begin() + static_cast<ptrdiff_t>(i + 1) * M * N);
    double err = runtime::rel_error(block, ref);
    if (!(err <= 1e-5)) {
      ++bad;
      MESSAGE("launch " << i << ": rel. error " << err);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("gpu: calls after the first allocate nothing (plain and TMA kernels)") {
  if (!have_gpu()) return;
  Function add = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 256}});
  Function gemm = default_gemm();
  const int n = 4096, M = 128, N = 256, K = 64;
  DeviceTensor x(f32, {n}), y(f32, {n}), out(f32, {n});
  DeviceTensor a(bf16, {M, K}), b(bf16, {N, K}), c(f32, {M, N});
  runtime::Stream stream;
  add({cdiv(n, 256)}, stream, x, y, out, n);  // first calls: compile and load
  gemm(gemm_grid(M, N), stream, a, b, c);
  stream.synchronize();
  allocations = 0;
  counting = true;
  for (int i = 0; i < 1000; ++i) add({cdiv(n, 256)}, stream, x, y, out, n);
  for (int i = 0; i < 100; ++i) gemm(gemm_grid(M, N), stream, a, b, c);
  counting = false;
  stream.synchronize();
  CHECK(allocations.load() == 0);
}

// Issue 26, item 4: one Function, arguments that do and do not hold 16-byte alignment, unit strides
// and multiples of 16: each call gets its variant (the aligned one vectorised) and the interpreter's
// values, whatever the order of the calls.
TEST_CASE("gpu: launch-time specialisation: aligned, shifted and strided views of one Function match the interpreter") {
  if (!have_gpu()) return;
  Function copy = tilejit::compile(test_kernels::undeclared_copy);
  HostTensor x(bf16, {128, 258});
  x.fill_uniform(7, -8, 8);
  const DeviceTensor dx = DeviceTensor::from_host(x);
  const std::array<int64_t, 2> sizes{128, 256}, strides{258, 1}, strided_strides{258, 2}, strided_sizes{128, 128};
  struct Case {
    const char* what;
    runtime::TensorView view;
    int c0;
  };
  const uint64_t base = runtime::view(dx).address;
  // (258 elements a row: a 516-byte pitch, not a multiple of 16 -- the aligned case is a separate copy)
  HostTensor xa(bf16, {128, 256});
  xa.fill_uniform(8, -8, 8);
  const DeviceTensor dxa = DeviceTensor::from_host(xa);
  const std::array<int64_t, 2> a_strides{256, 1};
  const std::vector<Case> cases{
      {"aligned, c0 64", runtime::TensorView{bf16, sizes, a_strides, runtime::view(dxa).address, 0}, 64},
      {"odd pitch, c0 16", runtime::TensorView{bf16, sizes, strides, base, 0}, 16},
      {"shifted base, c0 3", runtime::TensorView{bf16, sizes, strides, base + 2, 0}, 3},
      {"innermost stride 2, c0 32", runtime::TensorView{bf16, strided_sizes, strided_strides, base, 0}, 32},
      {"aligned again, c0 5", runtime::TensorView{bf16, sizes, a_strides, runtime::view(dxa).address, 0}, 5},
  };
  const auto host_x = x.to_f64(), host_xa = xa.to_f64();
  runtime::Stream stream;
  for (const Case& c : cases) {
    INFO(c.what);
    // the reference: the interpreter on the same elements, copied into a dense host tensor
    const bool in_a = c.view.address == runtime::view(dxa).address;
    const std::vector<double>& src = in_a ? host_xa : host_x;
    const auto first = static_cast<int64_t>((c.view.address - (in_a ? runtime::view(dxa).address : base)) / 2);
    HostTensor in(bf16, {c.view.sizes[0], c.view.sizes[1]});
    for (int64_t r = 0; r < in.sizes()[0]; ++r)
      for (int64_t k = 0; k < in.sizes()[1]; ++k)
        in.set({r, k}, src[static_cast<size_t>(first + r * c.view.strides[0] + k * c.view.strides[1])]);
    HostTensor ref(bf16, {in.sizes()[0], in.sizes()[1]});
    ref.poison();
    const Grid grid{2};
    runtime::interpret(copy.signature(), grid, {in, ref, int64_t{c.c0}});
    DeviceTensor out(bf16, {in.sizes()[0], in.sizes()[1]});  // poisoned
    const std::vector<runtime::DeviceArg> args{c.view, out, c.c0};
    copy.launch(grid, stream.handle(), args);
    stream.synchronize();
    const std::vector<double> got = out.to_host().to_f64(), want = ref.to_f64();
    int64_t differ = 0, written = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
      if (!std::isnan(want[i])) ++written;
      if (!both_nan && got[i] != want[i]) ++differ;
    }
    CHECK(written > 0);
    CHECK(differ == 0);
  }
  const std::vector<runtime::DeviceArg> aligned{cases[0].view, cases[0].view, 64};
  CHECK(copy.specialization(aligned) != 0);
  CHECK(copy.compiled(aligned).ptx.find("ld.global.v4") != std::string::npos);
}

// Pointer loads vectorise through AxisInfo (jit/axis_info.hpp) where the specialisation declares
// n a multiple of 16: lengths inside and crossing a block's end, f32 and bf16, against the
// interpreter bit for bit (added in the twelfth session; first GPU run pending then).
TEST_CASE("gpu: specialised pointer loads (vector fast path, scalar edge) match the interpreter") {
  if (!have_gpu()) return;
  for (DType d : {f32, bf16}) {
    INFO(ir::name(d));
    const Kernel k = kernel("ptr_add", [&](Builder& b) {
      auto X = b.pointer("X", d), Y = b.pointer("Y", d), Out = b.pointer("Out", d);
      auto n = b.scalar<int>("n");
      auto offs = program_id(0) * 512 + arange(0, 512);
      auto mask = offs < n;
      store(Out + offs, load(X + offs, mask, 0.0) + load(Y + offs, mask, 0.0), mask);
    });
    Function add = tilejit::compile(k);
    for (int n : {4096, 4000, 1008}) {
      INFO("n = " << n);
      HostTensor x(d, {4096}), y(d, {4096}), ref(d, {4096});
      x.fill_uniform(11, -4, 4);
      y.fill_uniform(12, -4, 4);
      ref.poison();
      const Grid grid{8};
      runtime::interpret(add.signature(), grid, {x, y, ref, n});
      const DeviceTensor dx = DeviceTensor::from_host(x), dy = DeviceTensor::from_host(y);
      DeviceTensor out(d, {4096});  // poisoned
      add(grid, nullptr, dx, dy, out, n);
      const std::vector<double> got = out.to_host().to_f64(), want = ref.to_f64();
      int64_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (!(std::isnan(got[i]) && std::isnan(want[i])) && got[i] != want[i]) ++differ;
      CHECK(differ == 0);
      if (n % 16 == 0) {
        const std::vector<runtime::DeviceArg> args{dx, dy, out, n};
        CHECK(add.compiled(args).ptx.find("ld.global.v") != std::string::npos);
      }
    }
  }
}
