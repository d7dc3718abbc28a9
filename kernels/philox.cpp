// Philox4x32-10 and the dropout keep-mask in the DSL (scheme: kernels/philox.hpp).
#include "kernels/philox.hpp"

#include <fmt/format.h>

#include "kernels/philox_host.hpp"

namespace tilejit::kernels {

using namespace lang;

namespace {

// Integer tiles and numbers as u32 (i32 values wrap; a negative number is a build error).
Tile as_u32(const Operand& x, Loc loc) { return cast(u32, x, loc); }

// The i1 keep decision of the byte of each element: `words` are the four Philox outputs,
// `k` (i32, broadcasting against them) the element's position 0..15 inside its call.
Tile keep_of(const std::array<Tile, 4>& words, const Tile& k, const Tile& threshold, Loc loc) {
  Tile word = k >> 2, shift = as_u32((k & 3) * 8, loc);
  Tile sel = where(word == 0, words[0], where(word == 1, words[1], where(word == 2, words[2], words[3], loc), loc), loc);
  return ((sel >> shift) & 0xFFu) < threshold;
}

}  // namespace

std::array<Tile, 4> philox4x32_10(std::array<Tile, 4> c, std::array<Tile, 2> k, Loc loc) {
  for (Tile& t : c) t = as_u32(t, loc);
  for (Tile& t : k) t = as_u32(t, loc);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k = {k[0] + kPhiloxW0, k[1] + kPhiloxW1};
    Tile hi0 = umulhi(c[0], kPhiloxM0, loc), lo0 = c[0] * kPhiloxM0;
    Tile hi1 = umulhi(c[2], kPhiloxM1, loc), lo1 = c[2] * kPhiloxM1;
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  // every output has the inputs' broadcast shape (after 10 rounds each depends on all inputs)
  return c;
}

Tile uniform_f32(const Operand& x, Loc loc) { return cast(f32, as_u32(x, loc) >> 8, loc) * 0x1p-24f; }

Tile dropout_keep(const Operand& batch_head, const Tile& rows, const Tile& cols, const Operand& seed_lo, const Operand& seed_hi,
                  const Operand& offset_lo, const Operand& offset_hi, const Operand& keep_threshold, Loc loc) {
  Builder& b = Builder::current(loc);
  if (rows.rank() != 1 || cols.rank() != 1)
    b.fail(loc, fmt::format("dropout_keep: rows and cols must be 1-D tiles, got ranks {} and {}", rows.rank(), cols.rank()));
  Tile j = as_u32(cols, loc)[row];  // [1, N]
  Tile call = ((j >> 6) << 2) | ((j >> 1) & 3u), position = (((j >> 3) & 7u) << 1) | (j & 1u);
  auto words = philox4x32_10({call, as_u32(rows, loc)[col], as_u32(batch_head, loc), as_u32(offset_lo, loc)},
                             {as_u32(seed_lo, loc), as_u32(seed_hi, loc) ^ as_u32(offset_hi, loc)}, loc);
  return keep_of(words, cast(i32, position, loc), as_u32(keep_threshold, loc), loc);
}

Tile dropout_keep_block(const Operand& batch_head, const Tile& rows, const Operand& col0, int64_t num_cols, const Operand& seed_lo,
                        const Operand& seed_hi, const Operand& offset_lo, const Operand& offset_hi, const Operand& keep_threshold,
                        Loc loc) {
  Builder& b = Builder::current(loc);
  if (rows.rank() != 1) b.fail(loc, fmt::format("dropout_keep_block: rows must be a 1-D tile, got rank {}", rows.rank()));
  if (num_cols <= 0) b.fail(loc, fmt::format("dropout_keep_block: num_cols = {} is not positive", num_cols));
  // Fewer than whole 64-column groups: the per-element form (the same bits).
  if (num_cols % 64 != 0)
    return dropout_keep(batch_head, rows, col0 + arange(0, num_cols, loc), seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold, loc);
  const int64_t m = rows.shape()[0], groups = num_cols / 64;
  // One Philox call per (row, 64-column group q, lane slot t): [M, Q, 4]; its 16 bytes serve the
  // positions (k, e) of j = 64 q + 8 k + 2 t + e, laid out as [M, Q, 8, 4, 2] = [M, num_cols].
  Tile q = (as_u32(col0, loc) >> 6) + as_u32(arange(0, groups, loc), loc);
  Tile call = expand_dims((q[col] << 2) | as_u32(arange(0, 4, loc), loc)[row], 0, loc);      // [1, Q, 4]
  Tile r = expand_dims(as_u32(rows, loc)[col], 2, loc);                                       // [M, 1, 1]
  auto words = philox4x32_10({call, r, as_u32(batch_head, loc), as_u32(offset_lo, loc)},
                             {as_u32(seed_lo, loc), as_u32(seed_hi, loc) ^ as_u32(offset_hi, loc)}, loc);
  for (Tile& w : words) w = expand_dims(expand_dims(w, 2, loc), 4, loc);                     // [M, Q, 1, 4, 1]
  Tile k = reshape(arange(0, 8, loc), {1, 1, 8, 1, 1}, loc), e = reshape(arange(0, 2, loc), {1, 1, 1, 1, 2}, loc);
  Tile keep = keep_of(words, (k << 1) | e, as_u32(keep_threshold, loc), loc);                // [M, Q, 8, 4, 2]
  return reshape(keep, {m, num_cols}, loc);
}

Tile dropout_keep_words(const Operand& batch_head, const Tile& rows, const Operand& word0, int64_t num_words, const Operand& seed_lo,
                        const Operand& seed_hi, const Operand& offset_lo, const Operand& offset_hi, const Operand& keep_threshold,
                        Loc loc) {
  Builder& b = Builder::current(loc);
  if (rows.rank() != 1) b.fail(loc, fmt::format("dropout_keep_words: rows must be a 1-D tile, got rank {}", rows.rank()));
  if (num_words <= 0 || num_words % 2 != 0)
    b.fail(loc, fmt::format("dropout_keep_words: num_words = {} must be a positive even number (whole 64-column call groups)", num_words));
  const int64_t m = rows.shape()[0], groups = num_words / 2;
  Tile q = (as_u32(word0, loc) >> 1) + as_u32(arange(0, groups, loc), loc);
  Tile call = expand_dims((q[col] << 2) | as_u32(arange(0, 4, loc), loc)[row], 0, loc);  // [1, Q, 4]
  Tile r = expand_dims(as_u32(rows, loc)[col], 2, loc);                                   // [M, 1, 1]
  auto words = philox4x32_10({call, r, as_u32(batch_head, loc), as_u32(offset_lo, loc)},
                             {as_u32(seed_lo, loc), as_u32(seed_hi, loc) ^ as_u32(offset_hi, loc)}, loc);  // [M, Q, 4]
  Tile threshold = as_u32(keep_threshold, loc);
  Tile lane_shift = reshape(as_u32(arange(0, 4, loc), loc) << 1u, {1, 1, 4}, loc);  // call t's bits sit at 2 t + ...
  std::array<Tile, 2> half;  // word 2 q (k < 4) and word 2 q + 1 (k >= 4)
  for (int h = 0; h < 2; ++h) {
    Tile part;
    for (int k4 = 0; k4 < 4; ++k4)
      for (int e = 0; e < 2; ++e) {
        const int byte = 2 * (4 * h + k4) + e;  // the call's byte 2 k + e serves column 8 k + 2 t + e
        Tile kept = cast(u32, ((words[byte / 4] >> static_cast<uint32_t>(8 * (byte % 4))) & 0xFFu) < threshold, loc);
        Tile bit = kept << static_cast<uint32_t>(8 * k4 + e);
        part = part.valid() ? (part | bit) : bit;
      }
    half[h] = sum(part << lane_shift, 2, loc);  // distinct bits: the sum is their OR
  }
  Tile which = reshape(arange(0, 2, loc), {1, 1, 2}, loc);
  return reshape(where(which == 0, expand_dims(half[0], 2, loc), expand_dims(half[1], 2, loc), loc), {m, num_words}, loc);
}

}  // namespace tilejit::kernels
