// The driver layer on a GPU (ctest label "gpu"): device properties, PTX and cubin modules,
// launches (ragged grids, dynamic shared memory past 48 KB and past the opt-in limit), streams,
// events, device buffers and tensors, and the errors of bad launches. Skips visibly without a GPU.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "host_bits.hpp"

namespace rt = tilejit::runtime;
namespace fs = std::filesystem;
using rt::DeviceBuffer;
using rt::DeviceError;
using rt::Driver;

namespace {

// Hand-written PTX (checked with `ptxas -arch=sm_90`): vadd is c[i] = a[i] + b[i] for i < n, one
// element per thread; smem_reverse passes values through the top of its dynamic shared memory,
// so a launch whose dynamic size was not really granted reads or writes out of bounds.
const std::string kPtx = R"PTX(
.version 8.0
.target sm_90
.address_size 64

.extern .shared .align 16 .b8 dsmem[];

.visible .entry vadd(
    .param .u64 vadd_a,
    .param .u64 vadd_b,
    .param .u64 vadd_c,
    .param .u32 vadd_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .f32   %f<4>;
    .reg .b64   %rd<11>;

    ld.param.u64        %rd1, [vadd_a];
    ld.param.u64        %rd2, [vadd_b];
    ld.param.u64        %rd3, [vadd_c];
    ld.param.u32        %r1, [vadd_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mad.lo.s32          %r5, %r2, %r3, %r4;
    setp.ge.u32         %p1, %r5, %r1;
    @%p1 bra            $L_done;
    cvta.to.global.u64  %rd4, %rd1;
    cvta.to.global.u64  %rd5, %rd2;
    cvta.to.global.u64  %rd6, %rd3;
    mul.wide.u32        %rd7, %r5, 4;
    add.s64             %rd8, %rd4, %rd7;
    add.s64             %rd9, %rd5, %rd7;
    add.s64             %rd10, %rd6, %rd7;
    ld.global.f32       %f1, [%rd8];
    ld.global.f32       %f2, [%rd9];
    add.rn.f32          %f3, %f1, %f2;
    st.global.f32       [%rd10], %f3;
$L_done:
    ret;
}

// out[t] = ntid - 1 - t: thread t writes t at float index nfloats - 1 - t, and after the barrier
// reads what thread ntid - 1 - t wrote.
.visible .entry smem_reverse(
    .param .u64 smem_reverse_out,
    .param .u32 smem_reverse_nfloats
)
{
    .reg .b32   %r<12>;
    .reg .f32   %f<3>;
    .reg .b64   %rd<5>;

    ld.param.u64        %rd1, [smem_reverse_out];
    ld.param.u32        %r1, [smem_reverse_nfloats];
    mov.u32             %r2, %tid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, dsmem;
    sub.s32             %r5, %r1, 1;
    sub.s32             %r5, %r5, %r2;
    shl.b32             %r6, %r5, 2;
    add.s32             %r7, %r4, %r6;
    cvt.rn.f32.u32      %f1, %r2;
    st.shared.f32       [%r7], %f1;
    bar.sync            0;
    sub.s32             %r8, %r1, %r3;
    add.s32             %r8, %r8, %r2;
    shl.b32             %r9, %r8, 2;
    add.s32             %r10, %r4, %r9;
    ld.shared.f32       %f2, [%r10];
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r2, 4;
    add.s64             %rd4, %rd2, %rd3;
    st.global.f32       [%rd4], %f2;
    ret;
}
)PTX";

constexpr uint32_t kPoisonBits = 0xFFFFFFFFu;  // what fill_bytes(0xFF) leaves in an f32

using ::testing::contains;

template <class F>
std::string device_error_of(F&& f) {
  try {
    f();
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "(no DeviceError was thrown)";
}

// False, with a visible message, when there is no GPU: the GPU tests then pass as skipped.
bool have_gpu() {
  const Driver& d = Driver::get();
  if (!d.available()) {
    MESSAGE("SKIPPED: no GPU: " << d.unavailable_reason());
    return false;
  }
  return true;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Runs vadd over n elements with 256-thread blocks (the last block ragged) and checks every output
// bit-exactly against the host sum, and that the poisoned slack past n was not written.
void run_vadd(CUfunction f, uint32_t n, CUstream stream = nullptr) {
  const size_t slack = 64;
  auto a = random_floats(n, 1), b = random_floats(n, 2);
  DeviceBuffer da(n * sizeof(float)), db(n * sizeof(float)), dc((n + slack) * sizeof(float));
  da.upload(a.data(), n * sizeof(float));
  db.upload(b.data(), n * sizeof(float));
  dc.fill_bytes(0xFF);

  CUdeviceptr pa = da.ptr(), pb = db.ptr(), pc = dc.ptr();
  uint32_t count = n;
  void* params[] = {&pa, &pb, &pc, &count};
  rt::LaunchConfig cfg;
  cfg.grid = {(n + 255) / 256, 1, 1};
  cfg.block = {256, 1, 1};
  cfg.stream = stream;
  rt::launch(f, cfg, params, "vadd");

  std::vector<float> c(n + slack);
  dc.download(c.data(), c.size() * sizeof(float));  // waits for the launch on any stream
  size_t wrong = 0, first_wrong = n;
  for (uint32_t i = 0; i < n; ++i) {
    float expect = a[i] + b[i];
    if (std::bit_cast<uint32_t>(c[i]) != std::bit_cast<uint32_t>(expect)) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  CHECK_MESSAGE(wrong == 0, wrong << " of " << n << " outputs differ, the first at " << first_wrong);
  for (size_t i = n; i < n + slack; ++i) CHECK(std::bit_cast<uint32_t>(c[i]) == kPoisonBits);
}

// ptxas from PATH or the standard CUDA prefix; empty when there is none.
std::string find_ptxas() {
  if (std::system("ptxas --version > /dev/null 2>&1") == 0) return "ptxas";
  if (fs::exists("/usr/local/cuda/bin/ptxas")) return "/usr/local/cuda/bin/ptxas";
  return {};
}

// kPtx assembled by ptxas for `arch` into a fresh temporary directory; empty on failure.
std::vector<char> assemble(const std::string& ptxas, const std::string& arch, std::string& log) {
  fs::path dir = fs::temp_directory_path() / ("tilejit_test_driver_" + std::to_string(::getpid()) + "_" + arch);
  fs::create_directories(dir);
  {
    std::ofstream(dir / "k.ptx") << kPtx;
  }
  const std::string cmd = ptxas + " -arch=" + arch + " " + (dir / "k.ptx").string() + " -o " +
                          (dir / "k.cubin").string() + " > " + (dir / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log_in(dir / "log.txt");
  log.assign(std::istreambuf_iterator<char>(log_in), {});
  std::vector<char> cubin;
  if (rc == 0) {
    std::ifstream in(dir / "k.cubin", std::ios::binary);
    cubin.assign(std::istreambuf_iterator<char>(in), {});
  }
  fs::remove_all(dir);
  return cubin;
}

}  // namespace

// Runs wherever ptxas exists, GPU or not: the PTX the GPU tests JIT must be valid sm_90 PTX.
TEST_CASE("the hand-written test PTX assembles with ptxas -arch=sm_90") {
  const std::string ptxas = find_ptxas();
  if (ptxas.empty()) {
    MESSAGE("SKIPPED: no ptxas on PATH or in /usr/local/cuda/bin");
    return;
  }
  std::string log;
  auto cubin = assemble(ptxas, "sm_90", log);
  CHECK_MESSAGE(!cubin.empty(), "ptxas failed:\n" << log);
}

TEST_CASE("GPU: device properties are sane") {
  if (!have_gpu()) return;
  const Driver& d = Driver::get();
  REQUIRE(d.device_count() > 0);
  const rt::DeviceProps& p = d.props(0);
  MESSAGE(p.name << " (" << p.arch() << "): " << p.sm_count << " SMs, " << p.smem_per_block_optin
                 << " B smem/block opt-in, " << p.smem_per_sm << " B smem/SM, " << p.l2_bytes << " B L2, "
                 << p.global_mem_bytes << " B global; driver " << p.driver_version << ", " << d.library());
  CHECK(p.ordinal == 0);
  CHECK_FALSE(p.name.empty());
  CHECK(p.sm_count > 0);
  CHECK(p.cc_major >= 7);
  CHECK(p.smem_per_block == 48 * 1024);
  CHECK(p.smem_per_block_optin >= p.smem_per_block);
  CHECK(p.smem_per_sm >= p.smem_per_block_optin);
  CHECK(p.l2_bytes > 0);
  CHECK(p.global_mem_bytes > (size_t{1} << 30));
  CHECK(p.max_threads_per_block == 1024);
  CHECK(p.warp_size == 32);
  CHECK(p.driver_version >= 12000);
  CHECK(d.driver_version() == p.driver_version);
  if (p.cc_major == 9 && p.cc_minor == 0) CHECK(p.arch() == "sm_90a");
  if (contains(p.name, "H100")) {
    CHECK(p.arch() == "sm_90a");
    CHECK(p.sm_count >= 114);                        // PCIe 114, SXM 132
    CHECK(p.smem_per_block_optin == 227 * 1024);     // 232448
  }
  CHECK_THROWS_AS((void)d.props(d.device_count()), std::out_of_range);
}

TEST_CASE("GPU: a PTX module JIT-compiled by the driver adds vectors exactly, ragged grid") {
  if (!have_gpu()) return;
  rt::Module m = rt::Module::from_ptx(kPtx, "test_kernels.ptx");
  CHECK(m.handle() != nullptr);
  CUfunction f = m.function("vadd");
  REQUIRE(f != nullptr);
  run_vadd(f, 1000);  // 4 blocks of 256, the last one 232 threads short
  run_vadd(f, 1);
  run_vadd(f, 256 * 37);  // exact multiple

  const rt::FunctionAttributes a = rt::attributes(f, "vadd");
  const rt::DeviceProps& p = Driver::get().props();
  MESSAGE("vadd: " << a.num_regs << " registers, ptx " << a.ptx_version << ", binary " << a.binary_version);
  CHECK(a.num_regs > 0);
  CHECK(a.local_size_bytes == 0);
  CHECK(a.shared_size_bytes == 0);
  CHECK(a.max_threads_per_block > 0);
  CHECK(a.binary_version == p.cc_major * 10 + p.cc_minor);
}

TEST_CASE("GPU: a cubin module from ptxas runs the same kernel") {
  if (!have_gpu()) return;
  const std::string ptxas = find_ptxas();
  if (ptxas.empty()) {
    MESSAGE("SKIPPED: no ptxas to build a cubin");
    return;
  }
  const std::string arch = Driver::get().props().arch();
  std::string log;
  auto cubin = assemble(ptxas, arch, log);
  REQUIRE_MESSAGE(!cubin.empty(), "ptxas -arch=" << arch << " failed:\n" << log);
  rt::Module m = rt::Module::from_cubin(cubin.data(), cubin.size(), "test_kernels.cubin");
  run_vadd(m.function("vadd"), 1000);

  // A module moved into another object still works, and the moved-from one is empty.
  rt::Module moved = std::move(m);
  CHECK(m.handle() == nullptr);
  run_vadd(moved.function("vadd"), 333);

  // PTX text handed to from_cubin is caught before the driver sees it.
  CHECK_THROWS_AS(rt::Module::from_cubin(kPtx.data(), kPtx.size(), "not_a.cubin"), std::invalid_argument);
}

TEST_CASE("GPU: module errors name the call, the module or kernel, and carry the JIT log") {
  if (!have_gpu()) return;
  rt::Module m = rt::Module::from_ptx(kPtx, "test_kernels.ptx");
  const std::string missing = device_error_of([&] { (void)m.function("no_such_kernel"); });
  CHECK(contains(missing, "cuModuleGetFunction"));
  CHECK(contains(missing, "kernel 'no_such_kernel'"));
  CHECK(contains(missing, "module 'test_kernels.ptx'"));
  CHECK(contains(missing, "CUDA_ERROR_NOT_FOUND"));

  try {
    (void)rt::Module::from_ptx(".version 8.0\n.target sm_90\n.address_size 64\nthis is not ptx;\n", "broken.ptx");
    FAIL("broken PTX loaded");
  } catch (const DeviceError& e) {
    MESSAGE("broken PTX: " << std::string(e.what()));
    CHECK(contains(e.what(), "tilejit: cuModuleLoadDataEx for PTX module 'broken.ptx' failed: "));
    CHECK(e.call() == "cuModuleLoadDataEx");
    CHECK(e.result() != CUDA_SUCCESS);
  }
}

TEST_CASE("GPU: dynamic shared memory past 48 KB is granted, and past the opt-in limit is a clear error") {
  if (!have_gpu()) return;
  const rt::DeviceProps& p = Driver::get().props();
  rt::Module m = rt::Module::from_ptx(kPtx, "test_kernels.ptx");
  CUfunction f = m.function("smem_reverse");
  const unsigned threads = 256;

  auto run = [&](unsigned smem_bytes) {
    DeviceBuffer out(threads * sizeof(float));
    out.fill_bytes(0xFF);
    CUdeviceptr po = out.ptr();
    uint32_t nfloats = smem_bytes / 4;
    void* params[] = {&po, &nfloats};
    rt::LaunchConfig cfg;
    cfg.block = {threads, 1, 1};
    cfg.dynamic_smem_bytes = smem_bytes;
    rt::launch(f, cfg, params, "smem_reverse");
    std::vector<float> got(threads);
    out.download(got.data(), got.size() * sizeof(float));
    for (unsigned t = 0; t < threads; ++t) CHECK(got[t] == static_cast<float>(threads - 1 - t));
  };
  run(16 * 1024);  // under the default limit: no attribute needed
  CHECK(rt::attributes(f, "smem_reverse").max_dynamic_shared_size_bytes <= 48 * 1024);
  run(100 * 1024);  // raises the limit
  CHECK(rt::attributes(f, "smem_reverse").max_dynamic_shared_size_bytes == 100 * 1024);
  run(64 * 1024);   // under what was set: no change
  CHECK(rt::attributes(f, "smem_reverse").max_dynamic_shared_size_bytes == 100 * 1024);
  const unsigned optin = static_cast<unsigned>(p.smem_per_block_optin);
  run(optin);  // exactly the opt-in maximum (227 KB on H100; the kernel has no static smem)

  const unsigned too_much = optin + 1024;
  const std::string msg = device_error_of([&] {
    DeviceBuffer out(threads * sizeof(float));
    CUdeviceptr po = out.ptr();
    uint32_t nfloats = too_much / 4;
    void* params[] = {&po, &nfloats};
    rt::LaunchConfig cfg;
    cfg.block = {threads, 1, 1};
    cfg.dynamic_smem_bytes = too_much;
    rt::launch(f, cfg, params, "smem_reverse");
  });
  MESSAGE(msg);
  CHECK(contains(msg, "kernel 'smem_reverse'"));
  CHECK(contains(msg, std::to_string(too_much) + " bytes of dynamic shared memory"));
  CHECK(contains(msg, std::to_string(optin) + " bytes per block"));
  CHECK(contains(msg, "opt-in"));

  // A module unloaded and a new one loaded: its function starts from the default limit again, even
  // if the driver hands out the same CUfunction handle.
  m = rt::Module::from_ptx(kPtx, "test_kernels_again.ptx");
  f = m.function("smem_reverse");
  run(100 * 1024);
}

TEST_CASE("GPU: an invalid launch names cuLaunchKernel, the kernel and the result") {
  if (!have_gpu()) return;
  rt::Module m = rt::Module::from_ptx(kPtx, "test_kernels.ptx");
  CUfunction f = m.function("vadd");
  DeviceBuffer buf(1024 * sizeof(float));
  CUdeviceptr p = buf.ptr();
  uint32_t n = 1024;
  void* params[] = {&p, &p, &p, &n};
  rt::LaunchConfig cfg;
  cfg.block = {2048, 1, 1};  // more threads than a block may have
  try {
    rt::launch(f, cfg, params, "vadd");
    FAIL("a 2048-thread block launched");
  } catch (const DeviceError& e) {
    MESSAGE(std::string(e.what()));
    CHECK(contains(e.what(), "tilejit: cuLaunchKernel for kernel 'vadd' failed: CUDA_ERROR_INVALID_VALUE"));
    CHECK(e.call() == "cuLaunchKernel");
    CHECK(e.result() == CUDA_ERROR_INVALID_VALUE);
  }
  // The error is not sticky: the context still works.
  run_vadd(f, 1000);
}

TEST_CASE("GPU: streams and events time work; launches work from other threads") {
  if (!have_gpu()) return;
  rt::Module m = rt::Module::from_ptx(kPtx, "test_kernels.ptx");
  CUfunction f = m.function("vadd");

  rt::Stream stream;
  CHECK(stream.handle() != nullptr);
  run_vadd(f, 1000, stream.handle());

  // Big enough (3 x 16 MB per launch, 10 launches) that the elapsed time is well above the
  // event resolution (~0.5 us).
  const uint32_t n = 1u << 22;
  DeviceBuffer a(n * sizeof(float)), b(n * sizeof(float)), c(n * sizeof(float));
  a.fill_bytes(0);
  b.fill_bytes(0);
  CUdeviceptr pa = a.ptr(), pb = b.ptr(), pc = c.ptr();
  uint32_t count = n;
  void* params[] = {&pa, &pb, &pc, &count};
  rt::LaunchConfig cfg;
  cfg.grid = {n / 256, 1, 1};
  cfg.block = {256, 1, 1};
  cfg.stream = stream.handle();
  rt::Event start, stop;
  start.record(stream);
  for (int i = 0; i < 10; ++i) rt::launch(f, cfg, params, "vadd");
  stop.record(stream);
  stop.synchronize();
  const float ms = stop.elapsed_ms(start);
  MESSAGE("10 x vadd over 4M floats: " << ms << " ms");
  CHECK(ms > 0.0f);
  CHECK(ms < 10000.0f);
  stream.synchronize();

  // Another thread has no current context: the runtime makes the primary context current there.
  std::string thread_error;
  std::thread worker([&] {
    try {
      run_vadd(f, 777);
      rt::Stream s;
      run_vadd(f, 4097, s.handle());
      s.synchronize();
    } catch (const std::exception& e) {
      thread_error = e.what();
    }
  });
  worker.join();
  CHECK_MESSAGE(thread_error.empty(), thread_error);
}

TEST_CASE("GPU: DeviceBuffer and DeviceTensor round-trip host data") {
  if (!have_gpu()) return;
  DeviceBuffer buf(4096);
  CHECK(buf.ptr() != 0);
  CHECK(buf.ptr() % 256 == 0);
  CHECK(buf.bytes() == 4096);
  std::vector<uint8_t> in(4096), out(4096, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 3);
  buf.upload(in.data(), in.size());
  buf.download(out.data(), out.size());
  CHECK(in == out);
  buf.upload(in.data(), 100, 1000);  // partial, at an offset
  std::vector<uint8_t> part(100);
  buf.download(part.data(), 100, 1000);
  CHECK(std::equal(part.begin(), part.end(), in.begin()));
  CHECK_THROWS_AS(buf.upload(in.data(), 4096, 1), std::out_of_range);
  CHECK_THROWS_AS(buf.download(out.data(), 1, 4096), std::out_of_range);
  buf.fill_bytes(0xAB);
  buf.download(out.data(), out.size());
  CHECK(std::all_of(out.begin(), out.end(), [](uint8_t v) { return v == 0xAB; }));

  DeviceBuffer moved = std::move(buf);
  CHECK(buf.ptr() == 0);
  CHECK(moved.bytes() == 4096);
  DeviceBuffer zero(0);
  CHECK(zero.ptr() == 0);

  // A strided HostTensor (rows padded to 8 elements) keeps its layout and padding on the device.
  using tilejit::ir::DType;
  rt::HostTensor h(DType::f32, {5, 6}, {8, 1});
  h.fill_uniform(42, -1.0, 1.0);
  rt::DeviceTensor d = rt::DeviceTensor::from_host(h);
  CHECK(d.bytes() == h.bytes());
  CHECK(d.strides() == h.strides());
  rt::HostTensor back = d.to_host();
  CHECK(back.describe() == h.describe());
  CHECK(std::memcmp(back.data(), h.data(), h.bytes()) == 0);

  rt::DeviceTensor e = rt::DeviceTensor::empty_like(h);
  rt::HostTensor poisoned(DType::f32, {5, 6}, {8, 1});
  e.to_host(poisoned);
  const auto* bits = static_cast<const uint32_t*>(poisoned.data());
  CHECK(std::all_of(bits, bits + poisoned.bytes() / 4, [](uint32_t v) { return v == kPoisonBits; }));

  rt::DeviceTensor c(DType::bf16, {3, 4});
  CHECK(c.bytes() == 3 * 4 * 2);
  CHECK(c.strides() == tilejit::ir::Shape{4, 1});
  rt::HostTensor wrong(DType::f32, {3, 4});
  CHECK_THROWS_AS(c.to_host(wrong), std::invalid_argument);
}
