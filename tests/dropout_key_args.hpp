// The dropout key's kernel arguments as tests pass them to kernels that declare it
// (kernels::DropoutKey::declare): seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold, then
// rng_state and rng_state_in_memory.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/philox_host.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"

namespace testing {

// The interpreter's arguments for key `r`: its five scalars and, with `state` (u32 [4] =
// [seed, offset] as little-endian words), that tensor read instead of them; without, an empty
// tensor and the flag off.
inline std::vector<tilejit::runtime::Arg> dropout_key_args(const tilejit::kernels::DropoutRngHost& r,
                                                           tilejit::runtime::HostTensor* state = nullptr) {
  static tilejit::runtime::HostTensor none(tilejit::ir::DType::u32, {0});
  return {static_cast<uint32_t>(r.seed), static_cast<uint32_t>(r.seed >> 32), static_cast<uint32_t>(r.offset),
          static_cast<uint32_t>(r.offset >> 32), r.keep_threshold, state ? *state : none, static_cast<uint32_t>(state != nullptr)};
}

// The attention kernels' dropout arguments (kernels::AttentionDropout): the key's, then its
// coordinates in a larger attention (dropout_row_offset, dropout_col_offset, dropout_head_offset,
// dropout_heads; all 0: the call's own mask).
inline std::vector<tilejit::runtime::Arg> attention_dropout_args(const tilejit::kernels::DropoutRngHost& r,
                                                                 tilejit::runtime::HostTensor* state = nullptr,
                                                                 std::array<int32_t, 4> coordinates = {}) {
  std::vector<tilejit::runtime::Arg> args = dropout_key_args(r, state);
  for (int32_t c : coordinates) args.emplace_back(c);
  return args;
}

// A u32 [4] host tensor holding seed and offset as the kernels read rng_state.
inline tilejit::runtime::HostTensor rng_state_tensor(uint64_t seed, uint64_t offset) {
  tilejit::runtime::HostTensor t(tilejit::ir::DType::u32, {4});
  const uint64_t words[2] = {seed, offset};
  for (int i = 0; i < 4; ++i) t.set_flat(i, static_cast<uint32_t>(words[i / 2] >> (32 * (i % 2))));
  return t;
}

}  // namespace testing
