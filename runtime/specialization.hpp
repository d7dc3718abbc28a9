// Launch-time specialisation, as Triton does it: where a kernel's parameters promise less than a
// call's arguments hold -- a tensor or pointer whose base (and outer strides) are 16-byte aligned, a
// tensor whose innermost stride is 1, an integer that is a multiple of 16 -- the kernel is compiled
// once more for what the arguments hold (vector loads, TMA and wgmma paths need those facts), so that
// a kernel needs no ALIGN meta or call-site choices to get them. A variant's promises are in its
// tile IR (ParamSpec), so its compile-cache key differs; its launches check them.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "dsl/ir/function.hpp"
#include "runtime/gpu_kernel.hpp"

namespace tilejit::runtime {

inline constexpr int kSpecialisedAlignBytes = 16;
inline constexpr int kSpecialisedDivisor = 16;

// One bit per (parameter, property) the arguments hold and the signature does not promise: bit 3i
// base (and outer strides) 16-byte aligned, 3i + 1 innermost stride 1, 3i + 2 an integer multiple of
// 16; parameters past the 21st are not specialised. 0: the signature as declared. Arguments of the
// wrong kind add nothing (the launch's checks report them).
uint64_t specialization_key(const ir::Function& signature, std::span<const DeviceArg> args);

// `f` with the promises of `key` added to its parameters' specs.
ir::Function specialize(const ir::Function& f, uint64_t key);

// "A: align 16, contiguous; n: divisible by 16" (empty for key 0).
std::string describe_specialization(const ir::Function& f, uint64_t key);

}  // namespace tilejit::runtime
