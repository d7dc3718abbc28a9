// What the autotuner's files (runtime/autotuner.cpp, autotuner_run.cpp, tuning_store.cpp,
// tuning_table.cpp) share; internal to runtime/.
#pragma once
#include <bit>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir/sha256.hpp"
#include "runtime/tuning_space.hpp"

namespace tilejit::runtime::tuning_detail {

inline uint64_t f64_bits(double v) { return std::bit_cast<uint64_t>(v); }
inline double bits_f64(uint64_t v) { return std::bit_cast<double>(v); }

// The valid configs a choice was made among: a stored choice is reused only for the same ones.
inline std::string fingerprint(const std::vector<TuningConfig>& configs) {
  std::string all;
  for (const TuningConfig& c : configs) all += c.id() + "\n";
  return ir::sha256_hex(all);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tilejit::runtime::tuning_detail
