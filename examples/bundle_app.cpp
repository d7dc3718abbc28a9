// A shipped application: it loads a bundle (built ahead of time by `tilejit bundle`), disables
// every compiler, and runs the library GEMM from the bundle. On a GPU it checks the result against
// float64; without one it checks that the bundle holds what the application needs.
//
//   bundle_app [BUNDLE]    (default: bundle_app.tjb next to the executable, made by the build)
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tilejit/tilejit.hpp>

#include "api/registry.hpp"
#include "runtime/bundle.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/driver.hpp"
#include "runtime/run.hpp"

namespace fs = std::filesystem;
namespace rt = tilejit::runtime;
using namespace tilejit::lang;

namespace {

fs::path default_bundle() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return (ec ? fs::path(".") : exe.parent_path()) / "bundle_app.tjb";
}

// The compiler libraries tilejit can dlopen (LLVM is linked in, and TILEJIT_DISABLE_COMPILERS
// keeps it from running; ptxas would be a subprocess): any of them mapped here breaks the promise.
std::string compilers_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  while (std::getline(maps, line))
    for (const char* lib : {"libnvJitLink", "libnvrtc", "libnvptxcompiler"})
      if (line.find(lib) != std::string::npos && found.find(lib) == std::string::npos)
        found += (found.empty() ? "" : ", ") + std::string(lib);
  return found;
}

int run(const fs::path& bundle_path) {
  // The application's promise: no LLVM, nvrtc, nvJitLink or ptxas at run time. Set before any
  // kernel is looked up, so a kernel missing from the bundle is an error, never a quiet compile.
  ::setenv("TILEJIT_DISABLE_COMPILERS", "1", 1);

  tilejit::load_bundle(bundle_path);  // checks the file and, on a GPU, that it holds kernels for it

  // The kernel and schedule the bundle was built for (`tilejit bundle gemm`): the library GEMM with
  // its default schedule. Building it makes tile IR only; the bundle supplies the compiled code.
  const rt::BundleEntrySpec spec = tilejit::library::bundle_spec("gemm");
  const tilejit::ir::Function fn = spec.build();

  rt::Driver& driver = rt::Driver::get();
  if (!driver.available()) {
    // Compile-only mode: nothing can run, but the lookup the GPU path makes can be checked.
    const tilejit::jit::CompiledKernel k = rt::compile_cached(fn, spec.options);
    const rt::CompileCacheStats s = rt::compile_cache_stats();
    const rt::Bundle b = rt::read_bundle(bundle_path);
    std::string archs;
    for (const std::string& arch : b.archs) archs += (archs.empty() ? "" : ", ") + arch;
    std::printf("bundle_app: no GPU (%s)\n", driver.unavailable_reason().c_str());
    std::printf("bundle_app: verified the bundle in compile-only mode: %s holds %zu entries (archs %s):\n",
                bundle_path.c_str(), b.entries.size(), archs.c_str());
    for (const rt::BundleEntry& e : b.entries)
      std::printf("  %s %s (%s) [%s]%s\n", e.kernel.c_str(), e.arch.c_str(), e.schedule.c_str(), e.meta.c_str(),
                  e.key == rt::bundle_key(fn, spec.options) ? "  <- used here" : "");
    std::printf("bundle_app: with compilers disabled, compile_cached found %s (%zu B cubin, %d registers): "
                "%llu bundle hits, %llu compiles\n",
                k.name.c_str(), k.cubin.size(), k.info.registers, static_cast<unsigned long long>(s.bundle_hits),
                static_cast<unsigned long long>(s.compiles));
    const std::string mapped = compilers_mapped();
    std::printf("bundle_app: compiler libraries loaded in this process: %s\n", mapped.empty() ? "none" : mapped.c_str());
    return s.compiles == 0 && s.bundle_hits == 1 && !k.cubin.empty() && mapped.empty() ? 0 : 1;
  }

  // Ragged against the 128x256x64 tiles; K-major operands (A[M,K], B^T[N,K]) with 16-byte row
  // pitches, as the default schedule's TMA + wgmma path requires.
  const int M = 1000, N = 1500, K = 1032;
  rt::HostTensor a(bf16, {M, K}), bt(bf16, {N, K}), c(f32, {M, N});  // c starts poisoned (0xFF bytes)
  a.fill_uniform(21, -1, 1);
  bt.fill_uniform(22, -1, 1);
  const int64_t programs = cdiv(M, 128) * cdiv(N, 256);  // GROUP_M = 8: a 1-D grid
  rt::RunReport report = rt::run(fn, {programs}, {a, bt, c}, spec.options);
  const rt::CompileCacheStats s = rt::compile_cache_stats();

  // float64 on 1024 sampled entries (the full reference would be 1.5 G multiply-adds).
  std::mt19937 rng(7);
  std::vector<double> got, ref;
  for (int n = 0; n < 1024; ++n) {
    const int i = std::uniform_int_distribution<int>(0, M - 1)(rng), j = std::uniform_int_distribution<int>(0, N - 1)(rng);
    double r = 0;
    for (int p = 0; p < K; ++p) r += a.get({i, p}) * bt.get({j, p});
    got.push_back(c.get({i, j}));
    ref.push_back(r);
  }
  const double err = rt::rel_error(got, ref);
  const bool on_gpu = report.where == rt::Where::Gpu;
  std::printf("bundle_app: gemm %dx%dx%d bf16 -> f32 on %s from the bundle %s, compilers disabled "
              "(%llu bundle hits, %llu compiles): relative error vs float64 (1024 sampled entries) = %.3g\n",
              M, N, K, on_gpu ? driver.props(0).name.c_str() : "the CPU interpreter", bundle_path.c_str(),
              static_cast<unsigned long long>(s.bundle_hits), static_cast<unsigned long long>(s.compiles), err);
  const std::string mapped = compilers_mapped();
  std::printf("bundle_app: compiler libraries loaded in this process: %s\n", mapped.empty() ? "none" : mapped.c_str());
  return on_gpu && s.compiles == 0 && s.bundle_hits >= 1 && err < 1e-5 && mapped.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr, "usage: bundle_app [BUNDLE]   (default: bundle_app.tjb next to the executable)\n");
    return 2;
  }
  const fs::path bundle = argc == 2 ? fs::path(argv[1]) : default_bundle();
  try {
    return run(bundle);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bundle_app: %s\n", e.what());
    return 1;
  }
}
