// The driver layer without a GPU (CI): loading never crashes, compile-only mode explains itself in
// one sentence, and every GPU operation then fails with a DeviceError carrying that sentence.
// The GPU behaviour is in test_driver_gpu.cpp (ctest label "gpu").
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "host_bits.hpp"

namespace rt = tilejit::runtime;
using rt::DeviceError;
using rt::Driver;

namespace {

using ::testing::contains;

// The message of the DeviceError `f` throws, or a marker that fails the checks when it throws none.
template <class F>
std::string device_error_of(F&& f) {
  try {
    f();
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "(no DeviceError was thrown)";
}

// TILEJIT_LIBCUDA pointing at the toolkit's stub (the ctest "driver.stub_library") must give
// compile-only mode naming the stub, on every machine, GPU or not.
// (The toolkit may sit elsewhere on the machine running the test than where the build found it.)
bool testing_the_stub() {
  const char* lib = std::getenv("TILEJIT_LIBCUDA");
  if (!lib || !contains(lib, "stubs")) return false;
  if (!std::filesystem::exists(lib)) {
    MESSAGE("SKIPPED: the stub checks: " << lib << " does not exist here");
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("Driver::get() loads once, from any thread, without throwing") {
  Driver* first = nullptr;
  CHECK_NOTHROW(first = &Driver::get());
  std::vector<Driver*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) threads.emplace_back([&seen, i] { seen[i] = &Driver::get(); });
  for (auto& t : threads) t.join();
  for (Driver* d : seen) CHECK(d == first);
  MESSAGE("driver library '" << first->library() << "': "
                             << (first->available() ? "available" : first->unavailable_reason()));
}

TEST_CASE("DeviceProps::arch names the ptxas target") {
  rt::DeviceProps p;
  p.cc_major = 9, p.cc_minor = 0;
  CHECK(p.arch() == "sm_90a");  // tilejit uses wgmma/TMA/setmaxnreg there
  p.cc_major = 8, p.cc_minor = 0;
  CHECK(p.arch() == "sm_80");
  p.cc_major = 8, p.cc_minor = 9;
  CHECK(p.arch() == "sm_89");
  p.cc_major = 10, p.cc_minor = 0;
  CHECK(p.arch() == "sm_100");
}

TEST_CASE("DeviceError names the call, the kernel and the result") {
  try {
    rt::check_cu_kernel(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel", "gemm");
    FAIL("check_cu_kernel did not throw");
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    CHECK(msg.rfind("tilejit: cuLaunchKernel for kernel 'gemm' failed: ", 0) == 0);
    CHECK(e.call() == "cuLaunchKernel");
    CHECK(e.result() == CUDA_ERROR_INVALID_VALUE);
    // A loaded driver names results even without a device (CUDA_VISIBLE_DEVICES=""); without a
    // library (or with the stub) the number still appears.
    if (Driver::get().available())
      CHECK(msg == "tilejit: cuLaunchKernel for kernel 'gemm' failed: CUDA_ERROR_INVALID_VALUE (invalid argument)");
    else
      CHECK((contains(msg, "CUDA_ERROR_INVALID_VALUE") || contains(msg, "CUresult 1")));
  }
  CHECK_NOTHROW(rt::check_cu(CUDA_SUCCESS, "cuMemAlloc"));
  try {
    rt::throw_cu_error(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", {}, "1024 bytes on device 0");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).rfind("tilejit: cuMemAlloc failed: ", 0) == 0);
    CHECK(contains(e.what(), "; 1024 bytes on device 0"));
  }
}

TEST_CASE("compile-only mode: one clear reason, and every GPU operation says it needs a GPU") {
  Driver& d = Driver::get();
  if (testing_the_stub()) {
    REQUIRE_FALSE(d.available());
    CHECK(contains(d.unavailable_reason(), "stub"));
    CHECK(contains(d.unavailable_reason(), "CUDA_ERROR_STUB_LIBRARY"));
  }
  if (d.available()) {
    MESSAGE("a GPU is available (" << d.props().name << "): the compile-only checks do not apply");
    return;
  }
  const std::string& reason = d.unavailable_reason();
  MESSAGE("compile-only mode: " << reason);
  REQUIRE_FALSE(reason.empty());
  CHECK(contains(reason, "compile-only mode"));
  // It names the cause: no library, the stub, cuInit's result, or no device.
  CHECK((contains(reason, "libcuda") || contains(reason, "stub") || contains(reason, "CUDA_ERROR") ||
         contains(reason, "cuInit") || contains(reason, "no CUDA device") || contains(reason, "NVIDIA driver")));
  CHECK(reason.find('\n') == std::string::npos);
  CHECK(d.device_count() == 0);

  auto check_needs_gpu = [&](const std::string& msg) {
    CHECK(contains(msg, "needs a GPU"));
    CHECK(contains(msg, reason));
  };
  check_needs_gpu(device_error_of([] { rt::DeviceBuffer b(1024); }));
  check_needs_gpu(device_error_of([] { rt::DeviceBuffer b(0); }));
  check_needs_gpu(device_error_of([] { rt::Module::from_ptx(".version 8.0\n.target sm_90\n", "empty.ptx"); }));
  check_needs_gpu(device_error_of([] {
    const unsigned char elf[64] = {0x7f, 'E', 'L', 'F'};
    rt::Module::from_cubin(elf, sizeof(elf), "k.cubin");
  }));
  check_needs_gpu(device_error_of([] { rt::Stream s; }));
  check_needs_gpu(device_error_of([] { rt::Event e; }));
  check_needs_gpu(device_error_of([&] { (void)d.props(0); }));
  check_needs_gpu(device_error_of([&] { (void)d.api(); }));
  check_needs_gpu(device_error_of([&] { (void)d.context(0); }));
  check_needs_gpu(device_error_of([] { (void)rt::attributes(nullptr, "k"); }));
  const std::string launch_msg = device_error_of([] {
    rt::launch(nullptr, rt::LaunchConfig{}, nullptr, "gemm");
  });
  check_needs_gpu(launch_msg);
  CHECK(contains(launch_msg, "kernel 'gemm'"));
  check_needs_gpu(device_error_of([] { rt::DeviceTensor t(tilejit::ir::DType::f32, {4, 8}); }));
  check_needs_gpu(device_error_of([] {
    rt::HostTensor h(tilejit::ir::DType::f32, {4, 8});
    h.fill(1.0);
    (void)rt::DeviceTensor::from_host(h);
  }));
  // Moved-from and default-constructed objects own nothing and destroy quietly.
  rt::DeviceBuffer empty;
  CHECK(empty.ptr() == 0);
  CHECK(empty.bytes() == 0);
  rt::Module no_module;
  CHECK(no_module.handle() == nullptr);
}
