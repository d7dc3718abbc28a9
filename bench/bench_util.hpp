// What the attention benchmarks (bench/attention.cpp, attention_cp.cpp, attention_timeline.cpp)
// share: seeded random device buffers, medians, the dropout key's arguments and --with's metas.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dsl/builder.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/gpu_kernel.hpp"
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

// The dropout key's rng_state argument when seed and offset are scalars: a null u32 view (device 0).
// `rounds` rounds over `variants` variants, their order rotated each round (a fixed order biases
// a comparison by several %: clock drift over seconds favours whichever runs first).
template <class F>
void rotated_rounds(int rounds, int variants, F&& measure) {
  for (int round = 0; round < rounds; ++round)
    for (int k = 0; k < variants; ++k) measure((k + round) % variants);
}

inline constexpr int64_t kEmptyDims[1] = {0}, kUnitStride[1] = {1};
inline const runtime::TensorView no_rng_state{ir::DType::u32, kEmptyDims, kUnitStride, 0, 0};

// The attention kernels' dropout arguments (seed 1234, offset 7, probability p; the call's own
// mask coordinates) appended to a kernel's arguments.
inline void add_dropout_key(std::vector<runtime::DeviceArg>& args, double p) {
  for (uint32_t v : {1234u, 0u, 7u, 0u, kernels::dropout_keep_threshold(p)}) args.emplace_back(v);
  args.emplace_back(no_rng_state);
  args.emplace_back(0u);
  for (int i = 0; i < 4; ++i) args.emplace_back(int32_t{0});  // dropout_row_offset .. dropout_heads
}

// "A,B=0,C=1" -> {A: true, B: false, C: true}: the bool metas of --with.
inline std::vector<std::pair<std::string, bool>> parse_with(const std::string& with) {
  std::vector<std::pair<std::string, bool>> out;
  size_t start = 0;
  while (start < with.size()) {
    const size_t comma = std::min(with.find(',', start), with.size());
    const std::string item = with.substr(start, comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) out.emplace_back(item, true);
    else out.emplace_back(item.substr(0, eq), item.substr(eq + 1) != "0");
    start = comma + 1;
  }
  return out;
}

// "A,B=0,C=24" -> {A: true, B: false, C: 24}: --with's metas where an integer meta (a value other
// than 0 or 1) keeps its number.
inline lang::Meta parse_with_values(const std::string& with) {
  lang::Meta out;
  size_t start = 0;
  while (start < with.size()) {
    const size_t comma = std::min(with.find(',', start), with.size());
    const std::string item = with.substr(start, comma - start);
    const size_t eq = item.find('=');
    const std::string value = eq == std::string::npos ? "1" : item.substr(eq + 1);
    const std::string name = item.substr(0, eq);
    if (value == "0" || value == "1") out.emplace_back(name, value == "1");
    else out.emplace_back(name, static_cast<int64_t>(std::stoll(value)));
    start = comma + 1;
  }
  return out;
}

}  // namespace tilejit::bench_util
