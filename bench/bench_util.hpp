// What the attention benchmarks (bench/attention.cpp, bench/attention_cp.cpp) share: seeded random
// device buffers and medians.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/device_buffer.hpp"
#include "runtime/host_tensor.hpp"

namespace tilejit::bench_util {

// A device buffer on `device` filled with normal random values of `dtype` (uploaded in chunks of
// one host tensor with a per-buffer seed: cheap for 64 MB buffers).
inline runtime::DeviceBuffer random_buffer(size_t bytes, ir::DType dtype, uint64_t seed, int device = 0) {
  runtime::DeviceBuffer buf(bytes, device);
  const int64_t es = ir::byte_size(dtype);
  const int64_t chunk = std::min<int64_t>(int64_t{1} << 22, static_cast<int64_t>(bytes) / es);
  runtime::HostTensor h(dtype, {chunk});
  h.fill_normal(seed, 0, 1);
  for (size_t off = 0; off < bytes; off += static_cast<size_t>(chunk * es))
    buf.upload(h.data(), std::min(bytes - off, static_cast<size_t>(chunk * es)), off);
  return buf;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tilejit::bench_util
