// Heavy-first program order in L2-sized head sections (kernels/attention/program_order.hpp).
#include "kernels/attention/program_order.hpp"

namespace tilejit::kernels {

using namespace lang;

GridSlot heavy_first_sections(bool heavy_at_end, const Tile& seq_len, int64_t bytes_per_row, Loc loc) {
  const Tile tiles = num_programs(0, loc), heads = num_programs(1, loc), units = heads * num_programs(2, loc);
  // the launch-order index (x fastest, then y, then z): fits i32 (the API bounds the grid)
  const Tile p = program_id(0, loc) + tiles * (program_id(1, loc) + heads * program_id(2, loc));
  // heads per section (budget / bytes_per_row first: seq_len * bytes_per_row may exceed i32)
  const Tile per_section = minimum(maximum((kSectionL2Bytes / bytes_per_row) / maximum(seq_len, 1), 1, loc), units, loc);
  const Tile section = p / (per_section * tiles);
  const Tile first_unit = section * per_section;
  const Tile in_section = minimum(per_section, units - first_unit, loc);  // the last section may be smaller
  const Tile within = p - first_unit * tiles;
  const Tile rank = within / in_section;  // 0: the heaviest tile
  const Tile unit = first_unit + within % in_section;
  // short sequences keep the launch order (heaviest first within each head)
  const Tile sectioned = seq_len >= kSectionsMinSeqLen;
  const Tile tile = where(sectioned, rank, program_id(0, loc)), head = where(sectioned, unit % heads, program_id(1, loc)),
             batch = where(sectioned, unit / heads, program_id(2, loc));
  return {heavy_at_end ? tiles - 1 - tile : tile, head, batch};
}

}  // namespace tilejit::kernels
