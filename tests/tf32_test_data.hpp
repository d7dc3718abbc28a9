// Test data for tf32 dots (input_precision tf32), shared by the CPU and GPU suites.
#pragma once
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <random>

#include "runtime/host_tensor.hpp"

namespace testing {

// Integers in [-range, range] whose f32 bits are moved by less than half of TF32's dropped range
// (|offset| < 0x1000): rounded to TF32 (cvt.rna) they are the integers again, so every product and
// sum of a tf32 dot of them is exact in any order -- results are bit for bit the interpreter's
// exactly when the inputs are rounded as cvt.rna rounds them, while raw f32 products or a
// truncation (an MMA reading unrounded bits) differ.
inline void fill_tf32_near_integers(tilejit::runtime::HostTensor& t, uint64_t seed, int range) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-range, range), offset(-0xfff, 0xfff);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int v = value(rng);
    const uint32_t base = std::bit_cast<uint32_t>(static_cast<float>(v));
    const int off = v == 0 ? std::abs(offset(rng)) : offset(rng);  // (0 has no negative neighbour of its sign)
    t.set_flat(i, static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(static_cast<int64_t>(base) + off))));
  }
}

}  // namespace testing
