// Philox4x32-10 and the dropout keep-mask in the DSL (scheme: kernels/philox.hpp).
#include "kernels/philox.hpp"

#include <fmt/format.h>

#include "kernels/philox_host.hpp"

namespace tilejit::kernels {

using namespace lang;

namespace {

// Integer tiles and numbers as u32 (i32 values wrap; a negative number is a build error).
Tile as_u32(const Operand& x, Loc loc) { return cast(u32, x, loc); }

// The Philox output word that holds byte `position` (i32 0..15, broadcasting against the words)
// of each element's call. Where the position is constant per register (the accumulator layouts'
// column bits) the selects fold away.
Tile word_of(const std::array<Tile, 4>& words, const Tile& position, Loc loc) {
  Tile word = position >> 2;
  return where(word == 0, words[0], where(word == 1, words[1], where(word == 2, words[2], words[3], loc), loc), loc);
}

// The i1 keep decision of the byte of each element: `words` are the four Philox outputs,
// `k` (i32, broadcasting against them) the element's position 0..15 inside its call.
Tile keep_of(const std::array<Tile, 4>& words, const Tile& k, const Tile& threshold, Loc loc) {
  return ((word_of(words, k, loc) >> as_u32((k & 3) * 8, loc)) & 0xFFu) < threshold;
}

}  // namespace

std::array<Tile, 4> philox4x32_10(std::array<Tile, 4> c, std::array<Tile, 2> k, Loc loc) {
  for (Tile& t : c) t = as_u32(t, loc);
  for (Tile& t : k) t = as_u32(t, loc);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k = {k[0] + kPhiloxW0, k[1] + kPhiloxW1};
    // Each (hi, lo) pair as one 32 x 32 -> 64-bit product: the backends emit mul.wide.u32, one
    // IMAD.WIDE.U32 instead of an IMAD.HI and an IMAD (Philox is most of dropout's work).
    Tile p0 = cast(u64, c[0], loc) * uint64_t{kPhiloxM0}, p1 = cast(u64, c[2], loc) * uint64_t{kPhiloxM1};
    Tile hi0 = cast(u32, p0 >> uint64_t{32}, loc), lo0 = cast(u32, p0, loc);
    Tile hi1 = cast(u32, p1 >> uint64_t{32}, loc), lo1 = cast(u32, p1, loc);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  // every output has the inputs' broadcast shape (after 10 rounds each depends on all inputs)
  return c;
}

Tile uniform_f32(const Operand& x, Loc loc) { return cast(f32, as_u32(x, loc) >> 8, loc) * 0x1p-24f; }

DropoutKey DropoutKey::declare(Builder& kb) {
  // (braced: the parameters are declared in the order written)
  DropoutKey key{kb.scalar<uint32_t>("seed_lo"), kb.scalar<uint32_t>("seed_hi"), kb.scalar<uint32_t>("offset_lo"),
                 kb.scalar<uint32_t>("offset_hi"), kb.scalar<uint32_t>("keep_threshold")};
  // Seed and offset from device memory when rng_state_in_memory != 0: a CUDA graph replays the
  // launch with its scalars frozen, but reads the state afresh (masked off: no access, the scalars).
  Tile state = kb.pointer("rng_state", u32);
  Tile in_memory = kb.scalar<uint32_t>("rng_state_in_memory") != 0u;
  key.seed_lo = load(state, in_memory, key.seed_lo);
  key.seed_hi = load(state + 1, in_memory, key.seed_hi);
  key.offset_lo = load(state + 2, in_memory, key.offset_lo);
  key.offset_hi = load(state + 3, in_memory, key.offset_hi);
  return key;
}

Tile dropout_keep(const Operand& batch_head, const Tile& rows, const Tile& cols, const DropoutKey& key, Loc loc) {
  Builder& b = Builder::current(loc);
  if (rows.rank() != 1 || cols.rank() != 1)
    b.fail(loc, fmt::format("dropout_keep: rows and cols must be 1-D tiles, got ranks {} and {}", rows.rank(), cols.rank()));
  Tile j = as_u32(cols, loc)[row];  // [1, N]
  Tile call = ((j >> 6) << 2) | ((j >> 1) & 3u), position = (((j >> 3) & 7u) << 1) | (j & 1u);
  auto words = philox4x32_10({call, as_u32(rows, loc)[col], as_u32(batch_head, loc), as_u32(key.offset_lo, loc)},
                             {as_u32(key.seed_lo, loc), as_u32(key.seed_hi, loc) ^ as_u32(key.offset_hi, loc)}, loc);
  return keep_of(words, cast(i32, position, loc), as_u32(key.keep_threshold, loc), loc);
}

Tile dropout_keep_flags(const Operand& words, const Operand& keep_threshold, Loc loc) {
  // Byte x is dropped iff x >= T, i.e. iff x + c carries out of the byte, c = (256 - T) & 0xFF
  // (T = 256: c = 0, never). Per byte: the low 7 bits are added (no carry can cross into the next
  // byte: 127 + 127 < 256), bit 7 of t is then the carry into bit 7, and the carry out of bit 7
  // is majority(x7, c7, carry in) -- bitwise over the word, meaningful in bit 7 of each byte.
  // T = 0 (drop all) has no such c: ADD's 0x80 forces the carry in, MAJ's 1s the majority.
  Tile threshold = as_u32(keep_threshold, loc), c = (256u - threshold) & 0xFFu, none = threshold == 0u;
  Tile add = where(none, 0x80808080u, (c & 0x7Fu) * 0x01010101u, loc), maj = where(none, 0xFFFFFFFFu, c * 0x01010101u, loc);
  Tile w = as_u32(words, loc), t = (w & 0x7F7F7F7Fu) + add;
  return ~((w & t) | (maj & (w | t)));
}

namespace {

void check_block_args(const char* what, const Tile& rows, int64_t num_cols, Loc loc) {
  Builder& b = Builder::current(loc);
  if (rows.rank() != 1) b.fail(loc, fmt::format("{}: rows must be a 1-D tile, got rank {}", what, rows.rank()));
  if (num_cols <= 0) b.fail(loc, fmt::format("{}: num_cols = {} is not positive", what, num_cols));
}

// The Philox outputs of the calls of rows `rows` and the 64-column groups q0 + 0..groups-1 (q0:
// u32 scalar): [M, groups, 4] each, call t of group q being counter word 4 q + t.
std::array<Tile, 4> group_calls(const Operand& batch_head, const Tile& rows, const Tile& q0, int64_t groups, const DropoutKey& key,
                                Loc loc) {
  Tile q = q0 + as_u32(arange(0, groups, loc), loc);
  Tile call = expand_dims((q[col] << 2) | as_u32(arange(0, 4, loc), loc)[row], 0, loc);  // [1, Q, 4]
  Tile r = expand_dims(as_u32(rows, loc)[col], 2, loc);                                   // [M, 1, 1]
  return philox4x32_10({call, r, as_u32(batch_head, loc), as_u32(key.offset_lo, loc)},
                       {as_u32(key.seed_lo, loc), as_u32(key.seed_hi, loc) ^ as_u32(key.offset_hi, loc)}, loc);
}

}  // namespace

DropoutKeepCalls dropout_calls(const Operand& batch_head, const Tile& rows, const Operand& col0, int64_t num_cols, const DropoutKey& key,
                               Loc loc) {
  check_block_args("dropout_calls", rows, num_cols, loc);
  if (num_cols % 64 != 0)
    Builder::current(loc).fail(loc, fmt::format("dropout_calls: num_cols = {} is not a multiple of 64 (whole call groups; "
                                                "dropout_keep_mask_block takes any width)",
                                                num_cols));
  // one call per (row, 64-column group q, lane slot t): the raw outputs, their flags taken at the use
  DropoutKeepCalls c;
  c.num_rows = rows.shape()[0];
  c.num_cols = num_cols;
  c.words = group_calls(batch_head, rows, as_u32(col0, loc) >> 6, num_cols / 64, key, loc);
  c.keep_threshold = as_u32(key.keep_threshold, loc);
  return c;
}

Tile dropout_keep_mask_block(const Operand& batch_head, const Tile& rows, const Operand& col0, int64_t num_cols, const DropoutKey& key,
                             Loc loc) {
  check_block_args("dropout_keep_mask_block", rows, num_cols, loc);
  // Fewer than whole 64-column groups: the per-element form (the same bits), widened.
  if (num_cols % 64 != 0)
    return 0u - cast(u32, dropout_keep(batch_head, rows, col0 + arange(0, num_cols, loc), key, loc), loc);
  // the flags of only the word each element uses (where the word's choice is not constant per
  // register, as in dK/dV's transposed blocks, that is fewer than all four)
  return dropout_keep_mask_of(dropout_calls(batch_head, rows, col0, num_cols, key, loc), loc);
}

Tile dropout_keep_mask_of(const DropoutKeepCalls& c, Loc loc) {
  std::array<Tile, 4> words = c.words;
  for (Tile& w : words) w = expand_dims(expand_dims(w, 2, loc), 4, loc);  // [M, Q, 1, 4, 1]
  // Call j's 16 bytes serve the positions (k, e) of j = 64 q + 8 k + 2 t + e: [M, Q, 8, 4, 2] = [M, num_cols].
  Tile k = reshape(arange(0, 8, loc), {1, 1, 8, 1, 1}, loc), e = reshape(arange(0, 2, loc), {1, 1, 1, 1, 2}, loc);
  Tile position = (k << 1) | e;
  // The word, its flags unless already taken, then one prmt per element: byte position % 4's flag
  // (bit 7) replicated into all 32 bits.
  Tile word = word_of(words, position, loc);
  Tile flags = c.flags ? word : dropout_keep_flags(word, c.keep_threshold, loc);
  Tile mask = byte_perm(flags, 0u, as_u32((position & 3) | 8, loc) * 0x1111u, loc);
  return reshape(mask, {c.num_rows, c.num_cols}, loc);
}

Tile dropout_keep_pairs_of(const DropoutKeepCalls& c, Loc loc) {
  std::array<Tile, 4> words = c.words;
  for (Tile& w : words) w = expand_dims(w, 2, loc);  // [M, Q, 1, 4]
  // Pair (k, t) of call group q is columns 64 q + 8 k + 2 t + {0, 1}: bytes 2 k and 2 k + 1 of call
  // t's output, in word k / 2. [M, Q, 8, 4] = [M, num_cols / 2].
  Tile position = reshape(arange(0, 8, loc), {1, 1, 8, 1}, loc) << 1;
  Tile word = word_of(words, position, loc);
  Tile flags = c.flags ? word : dropout_keep_flags(word, c.keep_threshold, loc);
  // the low byte's flag replicated into bytes 0-1, the high byte's into bytes 2-3
  Tile low = as_u32(position & 3, loc) | 8u;
  Tile pairs = byte_perm(flags, 0u, low * 0x11u + (low + 1u) * 0x1100u, loc);
  return reshape(pairs, {c.num_rows, c.num_cols / 2}, loc);
}

Tile apply_keep_pairs(const Tile& x, const Tile& pairs, Loc loc) {
  Builder& b = Builder::current(loc);
  const ir::Type& xt = b.type(x.id());
  const ir::Type& pt = b.type(pairs.id());
  if (ir::bit_width(xt.dtype) != 16 || pt.dtype != u32 || xt.shape.size() != 2 || pt.shape.size() != 2 || pt.shape[0] != xt.shape[0] ||
      2 * pt.shape[1] != xt.shape[1])
    b.fail(loc, fmt::format("apply_keep_pairs: needs a 16-bit [M, N] tile and a u32 [M, N / 2] pair mask, got {} and {}",
                            ir::to_string(xt), ir::to_string(pt)));
  return unpack_pairs(xt.dtype, pack_pairs(x, loc) & pairs, loc);
}

Tile dropout_keep_block(const Operand& batch_head, const Tile& rows, const Operand& col0, int64_t num_cols, const DropoutKey& key,
                        Loc loc) {
  check_block_args("dropout_keep_block", rows, num_cols, loc);
  if (num_cols % 64 != 0)
    return dropout_keep(batch_head, rows, col0 + arange(0, num_cols, loc), key, loc);
  return dropout_keep_mask_block(batch_head, rows, col0, num_cols, key, loc) != 0u;
}

Tile apply_keep_mask(const Tile& x, const Tile& mask, Loc loc) {
  Builder& b = Builder::current(loc);
  if (x.dtype() != f32 || mask.dtype() != u32)
    b.fail(loc, fmt::format("apply_keep_mask: needs an f32 tile and a u32 mask, got {} and {}", ir::name(x.dtype()),
                            ir::name(mask.dtype())));
  return bitcast(f32, bitcast(u32, x, loc) & mask, loc);
}

Tile dropout_keep_words(const Operand& batch_head, const Tile& rows, const Operand& word0, int64_t num_words, const DropoutKey& key,
                        Loc loc) {
  Builder& b = Builder::current(loc);
  if (rows.rank() != 1) b.fail(loc, fmt::format("dropout_keep_words: rows must be a 1-D tile, got rank {}", rows.rank()));
  if (num_words <= 0 || num_words % 2 != 0)
    b.fail(loc, fmt::format("dropout_keep_words: num_words = {} must be a positive even number (whole 64-column call groups)", num_words));
  const int64_t m = rows.shape()[0];
  // [M, Q, 4]
  auto words = group_calls(batch_head, rows, as_u32(word0, loc) >> 1, num_words / 2, key, loc);
  std::array<Tile, 4> flags;
  for (int i = 0; i < 4; ++i) flags[i] = dropout_keep_flags(words[i], key.keep_threshold, loc);
  Tile lane_shift = reshape(as_u32(arange(0, 4, loc), loc) << 1u, {1, 1, 4}, loc);  // call t's bits sit at 2 t + ...
  std::array<Tile, 2> half;  // word 2 q (k < 4) and word 2 q + 1 (k >= 4)
  for (int h = 0; h < 2; ++h) {
    // Bytes 8 h + 2 k' + e of the call (words 2 h, 2 h + 1) serve bits 8 k' + e: two prmts gather
    // the e = 0 and e = 1 flags into byte k', two shifts move their bit 7 to bit 0 / bit 1.
    Tile even = byte_perm(flags[2 * h], flags[2 * h + 1], 0x6420u, loc), odd = byte_perm(flags[2 * h], flags[2 * h + 1], 0x7531u, loc);
    Tile part = ((even >> 7u) & 0x01010101u) | ((odd >> 6u) & 0x02020202u);
    half[h] = sum(part << lane_shift, 2, loc);  // distinct bits: the sum is their OR
  }
  Tile which = reshape(arange(0, 2, loc), {1, 1, 2}, loc);
  return reshape(where(which == 0, expand_dims(half[0], 2, loc), expand_dims(half[1], 2, loc), loc), {m, num_words}, loc);
}

}  // namespace tilejit::kernels
