// The host (plain C++) twin of kernels/philox.hpp: Philox4x32-10 and the attention dropout
// keep-mask, bit for bit what the DSL functions compute in a kernel. Tests and reference
// implementations (attention with dropout, the packed mask kernel) use it; no tilejit dependency.
//
// Counter layout of the dropout keep-mask (one Philox4x32-10 call serves 16 elements):
//   element (bh, i, j) -- bh = batch * heads_q + query head, i = query row, j = key column --
//   with j = 64 q + 8 k + 2 t + e (e in 0..1, t in 0..3, k in 0..7): counter = {4 q + t, i, bh,
//   offset_lo}, key = {seed_lo, seed_hi ^ offset_hi}; the call's byte 2 k + e serves it (byte b is
//   bits 8 * (b % 4) .. + 7 of output word b / 4); the element is kept iff byte < keep_threshold.
//   Why this order: a thread of a tensor-core accumulator holds columns 2 t + e + 8 k of each 64,
//   so the 16 elements of one call live in one thread (no thread recomputes another's call).
// keep_threshold = round((1 - p) * 256) in [0, 256], so the effective keep probability is
// keep_threshold / 256 (p = 0.1: 230 / 256 = 0.8984375) and an unbiased dropout scales kept
// values by 256 / keep_threshold.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace tilejit::kernels {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;  // round multipliers
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;  // Weyl key increments
inline constexpr int kDropoutElementsPerCall = 16;                          // 8-bit thresholds

// Random123's philox4x32_R(10, counter, key): 10 rounds, the key bumped between rounds.
inline std::array<uint32_t, 4> philox4x32_10_host(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k = {k[0] + kPhiloxW0, k[1] + kPhiloxW1};
    const uint64_t p0 = uint64_t{kPhiloxM0} * c[0], p1 = uint64_t{kPhiloxM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

// A uniform float in [0, 1): the top 24 bits of x times 2^-24 (exact in f32; 1 - 2^-24 at most).
inline float uniform_f32_host(uint32_t x) { return static_cast<float>(x >> 8) * 0x1p-24f; }

// The 8-bit keep threshold for dropout probability p in [0, 1]: round((1 - p) * 256).
inline uint32_t dropout_keep_threshold(double p) {
  if (!(p >= 0.0 && p <= 1.0)) throw std::invalid_argument("dropout probability must be in [0, 1]");
  return static_cast<uint32_t>(std::lround((1.0 - p) * 256.0));
}
// The keep probability a threshold actually gives: threshold / 256.
inline double dropout_keep_probability(uint32_t keep_threshold) { return keep_threshold / 256.0; }

struct DropoutRngHost {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t keep_threshold = 256;  // keep iff byte < keep_threshold (256: keep everything)
};

// The Philox call that serves element (bh, i, j): counter word 0 is 4 * (j / 64) + (j / 2) % 4.
inline uint32_t dropout_call_host(uint32_t j) { return ((j >> 6) << 2) | ((j >> 1) & 3u); }
// The byte of that call that serves it: 2 * ((j / 8) % 8) + j % 2.
inline uint32_t dropout_position_host(uint32_t j) { return (((j >> 3) & 7u) << 1) | (j & 1u); }
inline std::array<uint32_t, 4> dropout_philox_host(const DropoutRngHost& r, uint32_t bh, uint32_t i, uint32_t j) {
  return philox4x32_10_host({dropout_call_host(j), i, bh, static_cast<uint32_t>(r.offset)},
                            {static_cast<uint32_t>(r.seed), static_cast<uint32_t>(r.seed >> 32) ^ static_cast<uint32_t>(r.offset >> 32)});
}

// The random byte of element (bh, i, j) and whether the element is kept.
inline uint32_t dropout_byte_host(const DropoutRngHost& r, uint32_t bh, uint32_t i, uint32_t j) {
  const uint32_t k = dropout_position_host(j);
  return (dropout_philox_host(r, bh, i, j)[k / 4] >> (8 * (k % 4))) & 0xFFu;
}
inline bool dropout_keep_host(const DropoutRngHost& r, uint32_t bh, uint32_t i, uint32_t j) {
  return dropout_byte_host(r, bh, i, j) < r.keep_threshold;
}

// The whole keep-mask of a layer, unpacked: [bh][i][j] as bh * s_q * s_k + i * s_k + j (1 = keep).
inline std::vector<uint8_t> dropout_mask_host(const DropoutRngHost& r, int64_t bh_count, int64_t s_q, int64_t s_k) {
  std::vector<uint8_t> m(static_cast<size_t>(bh_count * s_q * s_k));
  for (int64_t bh = 0; bh < bh_count; ++bh)
    for (int64_t i = 0; i < s_q; ++i)
      for (int64_t j = 0; j < s_k; ++j)
        m[static_cast<size_t>((bh * s_q + i) * s_k + j)] =
            dropout_keep_host(r, static_cast<uint32_t>(bh), static_cast<uint32_t>(i), static_cast<uint32_t>(j));
  return m;
}

// The packed mask the dropout_mask kernel writes: [bh][i][w] u32 words, w = j / 32, bit j % 32 set
// iff element j is kept; bits past s_k are 0.
inline std::vector<uint32_t> dropout_mask_packed_host(const DropoutRngHost& r, int64_t bh_count, int64_t s_q, int64_t s_k) {
  const int64_t words = (s_k + 31) / 32;
  const std::vector<uint8_t> m = dropout_mask_host(r, bh_count, s_q, s_k);
  std::vector<uint32_t> p(static_cast<size_t>(bh_count * s_q * words), 0u);
  for (int64_t row = 0; row < bh_count * s_q; ++row)
    for (int64_t j = 0; j < s_k; ++j)
      if (m[static_cast<size_t>(row * s_k + j)]) p[static_cast<size_t>(row * words + j / 32)] |= 1u << (j % 32);
  return p;
}

}  // namespace tilejit::kernels
