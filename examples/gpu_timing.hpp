// Shared by the examples that report bandwidth: on a GPU, time `launch(stream)` with CUDA events
// (one warm-up call, which compiles and loads, then `iters` timed calls) and print the achieved
// GB/s = bytes read + written per call / time per call. Without a GPU it does nothing.
#pragma once
#include <cstdio>

#include "runtime/driver.hpp"

template <class Launch>
void report_bandwidth(const char* what, double bytes, Launch&& launch, int iters = 20) {
  using namespace tilejit::runtime;
  if (!Driver::get().available()) return;
  Stream stream;
  launch(stream);
  stream.synchronize();
  Event start, stop;
  start.record(stream);
  for (int i = 0; i < iters; ++i) launch(stream);
  stop.record(stream);
  stop.synchronize();
  double ms = static_cast<double>(stop.elapsed_ms(start)) / iters;
  std::printf("%s: %.1f us per call, %.0f GB/s\n", what, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}
