// Wall-clock milliseconds for the JIT's per-stage timings (CompiledKernel::timings).
// Header-only: every stage that reports a time uses the same clock.
#pragma once
#include <chrono>

namespace tilejit::jit {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tilejit::jit
