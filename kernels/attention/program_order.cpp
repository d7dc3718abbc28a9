// Heavy-first program order in L2-sized head sections (kernels/attention/program_order.hpp).
#include "kernels/attention/program_order.hpp"

namespace tilejit::kernels {

using namespace lang;

namespace {

// Index p's place in its L2-sized head section: its rank (0: the heaviest tile) and unit (head of
// a batch row), and whether sections apply at this sequence length.
struct SectionPlace {
  Tile rank, unit, sectioned;
};

SectionPlace section_place(const Tile& p, const Tile& tiles, const Tile& units, const Tile& seq_len, int64_t bytes_per_row, Loc loc) {
  // heads per section (budget / bytes_per_row first: seq_len * bytes_per_row may exceed i32)
  const Tile per_section = minimum(maximum((kSectionL2Bytes / bytes_per_row) / maximum(seq_len, 1), 1, loc), units, loc);
  const Tile section = p / (per_section * tiles);
  const Tile first_unit = section * per_section;
  const Tile in_section = minimum(per_section, units - first_unit, loc);  // the last section may be smaller
  const Tile within = p - first_unit * tiles;
  // short sequences keep the launch order (heaviest first within each head)
  return {within / in_section, first_unit + within % in_section, seq_len >= kSectionsMinSeqLen};
}

}  // namespace

GridSlot heavy_first_sections(bool heavy_at_end, const Tile& seq_len, int64_t bytes_per_row, Loc loc) {
  const Tile tiles = num_programs(0, loc), heads = num_programs(1, loc), units = heads * num_programs(2, loc);
  // the launch-order index (x fastest, then y, then z): fits i32 (the API bounds the grid)
  const Tile p = program_id(0, loc) + tiles * (program_id(1, loc) + heads * program_id(2, loc));
  const SectionPlace s = section_place(p, tiles, units, seq_len, bytes_per_row, loc);
  const Tile tile = where(s.sectioned, s.rank, program_id(0, loc)), head = where(s.sectioned, s.unit % heads, program_id(1, loc)),
             batch = where(s.sectioned, s.unit / heads, program_id(2, loc));
  return {heavy_at_end ? tiles - 1 - tile : tile, head, batch};
}

GridSlot heavy_first_order(bool heavy_at_end, const Tile& p, const Tile& tiles, const Tile& heads, const Tile& units, const Tile& seq_len,
                           int64_t bytes_per_row, Loc loc) {
  const SectionPlace s = section_place(p, tiles, units, seq_len, bytes_per_row, loc);
  const Tile unit = where(s.sectioned, s.unit, p / tiles);
  const Tile tile = where(s.sectioned, s.rank, p % tiles);
  return {heavy_at_end ? tiles - 1 - tile : tile, unit % heads, unit / heads};
}

Tile serpentine(const Tile& t, const Tile& total) {
  const Tile P = num_programs(0), round = t / P, q = t % P;
  const Tile reversed = ((round % 2) == 1) & ((round + 1) * P <= total);
  return where(reversed, round * P + (P - 1 - q), t);
}

}  // namespace tilejit::kernels
