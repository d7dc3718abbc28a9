// The order in which a [tiles, heads, batches] grid's programs take their tiles when the tiles'
// work grows or shrinks steadily along the sequence (causal masks): the heaviest first, heads
// grouped into L2-sized sections.
//
// Why: the hardware starts programs in launch order (x fastest). With one head after another, the
// last head's heaviest tile starts when ~all the work but its own is done and finishes alone: at
// 2-4 waves of work per SM the tail costs a few percent, with few heads far more (a list-scheduling
// simulation: docs/decisions/018-heavy-first-sections.md). Longest-first over the whole grid
// removes the tail but runs every head at once, so each head's K/V (or Q/dO) is read from HBM by
// a few programs instead of being shared in L2 by many. So, as FlashAttention-3's LPT scheduler
// does: sections of G heads whose per-head inputs fit in a fixed L2 budget; within a section the
// tiles go heaviest first, heads fastest (the programs running together share a section's heads).
#pragma once
#include <cstdint>

#include "dsl/lang.hpp"

namespace tilejit::kernels {

// The L2 budget of one section: 32 MB of the H100's 50 MB (FlashAttention-3's figure).
inline constexpr int64_t kSectionL2Bytes = int64_t{32} << 20;
// Sections only from this sequence length on; shorter ones keep the launch order (heaviest first
// within each head): at S 1k / 2k a section spans 32-64 heads, so only a few programs of a head run
// at once, and sections measured slower there (decision 018).
inline constexpr int64_t kSectionsMinSeqLen = 4096;

struct GridSlot {
  lang::Tile tile, head, batch;  // i32 scalars
};

// The (tile, head, batch) of this program of a [num_programs(0) tiles, num_programs(1) heads,
// num_programs(2) batches] grid. `heavy_at_end`: the last tile carries the most work (causal
// forward and dQ: query tile m sees m + 1 key tiles) -- else the first (causal dK/dV).
// `seq_len` (i32 scalar) and `bytes_per_row` (the bytes a program streams per sequence row of its
// head, e.g. K and V: 2 * D * 2) size the sections: G = max(1, budget / (seq_len * bytes_per_row)).
// Below kSectionsMinSeqLen: (heavy_at_end ? tiles - 1 - x : x, y, z) of the launch index.
GridSlot heavy_first_sections(bool heavy_at_end, const lang::Tile& seq_len, int64_t bytes_per_row, lang::Loc loc = lang::Loc::current());

}  // namespace tilejit::kernels
