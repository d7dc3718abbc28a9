// TIMELINE instrumentation shared by attention_fwd and attention_bwd_dkdv (their TIMELINE metas;
// bench/attention_timeline reads the buffer): each warp's cycle counter (lang::timestamp) into
// slot `index`, clamped to the last of `stamps`, of row `tile` of a u64 [tiles, stamps, 32] buffer.
#pragma once

#include <cstdint>

#include "dsl/lang.hpp"

namespace tilejit::kernels {

inline void timeline_stamp(const lang::Tile& timeline, const lang::Tile& tile, const lang::Tile& index, int64_t stamps) {
  using namespace lang;
  const Tile at = minimum(maximum(index, 0), stamps - 1);
  timestamp(timeline + (cast(i64, tile) * stamps + cast(i64, at)) * 32);
}

}  // namespace tilejit::kernels
