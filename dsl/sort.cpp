// Bitonic sorting network over xor_permute: for each merge size s = 2, 4, ..., n and each stride
// t = s/2, ..., 1, element i meets element i ^ t and keeps the smaller of the two where
// (i & t) == 0 and i's block of s runs ascending ((i & s) == 0), else the larger. log2(n) (log2(n)
// + 1) / 2 exchanges, each an xor_permute per tile plus elementwise compares and selects. topk
// sorts blocks of k and then halves the axis round by round (bitonic top-k).
#include "dsl/sort.hpp"

#include <fmt/format.h>

#include "dsl/combine.hpp"
#include "dsl/math.hpp"
#include "dsl/promote.hpp"

namespace tilejit::lang {
namespace {

// The axis index of every element of a tile of `shape` (i32).
Tile positions(const Shape& shape, int axis, const Loc& loc) {
  Tile p = arange(0, shape[static_cast<size_t>(axis)], loc);
  for (int d = 0; d < static_cast<int>(shape.size()); ++d)
    if (d != axis) p = expand_dims(p, d, loc);
  return broadcast_to(p, shape, loc);
}

int check_axis(Builder& b, const char* what, const ir::Type& t, int axis, const Loc& loc) {
  const int rank = static_cast<int>(t.shape.size());
  if (rank == 0) b.fail(loc, fmt::format("{}: needs a tile, got the scalar {}", what, ir::to_string(t)));
  return detail::normalize_axis(b, what, t, axis, loc);
}

// a < b and a == b in the sort's order (floats: -0 before +0, NaN last and equal to NaN).
std::pair<Tile, Tile> compare(const Tile& a, const Tile& b, const Loc& loc) {
  if (a.dtype() == DType::i1) return compare(cast(DType::i32, a, loc), cast(DType::i32, b, loc), loc);
  if (!ir::is_float(a.dtype())) return {a < b, a == b};
  Tile a_nan = isnan(a, loc), b_nan = isnan(b, loc), a_neg = signbit(a, loc), b_neg = signbit(b, loc);
  Tile same_value = a == b;
  Tile less = (!a_nan) & (b_nan | (a < b) | (same_value & a_neg & !b_neg));
  Tile equal = (a_nan & b_nan) | (same_value & (a_neg == b_neg));
  return {less, equal};
}

// Whether tuple a orders before tuple b: by tile 0 (reversed when descending), then 1, 2, ... ascending.
Tile before(const std::vector<Tile>& a, const std::vector<Tile>& b, bool descending, const Loc& loc) {
  Tile result;
  for (size_t k = a.size(); k-- > 0;) {
    auto [less, equal] = k == 0 && descending ? compare(b[k], a[k], loc) : compare(a[k], b[k], loc);
    result = result.valid() ? less | (equal & result) : less;
  }
  return result;
}

}  // namespace

Tile xor_permute(const Operand& x, int axis, int64_t mask, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  axis = check_axis(b, "xor_permute", b.type(t.id()), axis, loc);
  const int64_t n = b.type(t.id()).shape[static_cast<size_t>(axis)];
  if (mask < 0 || mask >= n)
    b.fail(loc, fmt::format("xor_permute: mask {} is out of range for an axis of {} (valid: 0..{})", mask, n, n - 1));
  if (mask == 0) return t;
  return b.emit1(ir::OpKind::xor_permute, {t.id()}, {{"axis", int64_t{axis}}, {"mask", mask}}, loc);
}

Tile flip(const Operand& x, int axis, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  axis = check_axis(b, "flip", b.type(t.id()), axis, loc);
  return xor_permute(t, axis, b.type(t.id()).shape[static_cast<size_t>(axis)] - 1, loc);
}

Tile gather(const Operand& x, const Operand& index, int axis, Loc loc) {
  Builder& b = detail::builder_for({&x, &index}, loc);
  Tile t = detail::to_tile(b, x, loc), i = detail::to_tile(b, index, loc);
  axis = check_axis(b, "gather", b.type(t.id()), axis, loc);
  const ir::Type& it = b.type(i.id());
  if (!ir::is_int(it.dtype) || it.dtype == DType::i1)
    b.fail(loc, fmt::format("gather: the index must be an integer tile, got {}", ir::to_string(it)));
  return b.emit1(ir::OpKind::gather, {t.id(), i.id()}, {{"axis", int64_t{axis}}}, loc);
}

namespace {

// The exchanges of the bitonic network for block sizes first_size, 2 first_size, ..., last_size
// (each with strides size / 2 .. 1): a block of `size` ends sorted in the order (reversed where
// (pos & size) != 0), given that its halves were sorted in opposite directions (or single elements).
void bitonic_stages(std::vector<Tile>& x, int axis, bool descending, int64_t first_size, int64_t last_size, const Loc& loc) {
  Builder& b = Builder::current(loc);
  const Shape shape = b.type(x[0].id()).shape;  // (a copy: new values may move the value table)
  const Tile pos = positions(shape, axis, loc);
  for (int64_t size = first_size; size <= last_size; size *= 2)
    for (int64_t stride = size / 2; stride >= 1; stride /= 2) {
      std::vector<Tile> other;
      for (const Tile& t : x) other.push_back(xor_permute(t, axis, stride, loc));
      // the lower element of an ascending block (or the upper of a descending one) keeps the smaller
      Tile keeps_smaller = ((pos & stride) == 0) == ((pos & size) == 0);
      // One integer tile: equal elements are identical, so exchanging them changes nothing and
      // one compare decides (before(x, other) is !before(other, x) for all that matter).
      Tile take_other = x.size() == 1 && ir::is_int(b.type(x[0].id()).dtype)
                            ? keeps_smaller == before(other, x, descending, loc)
                            : where(keeps_smaller, before(other, x, descending, loc), before(x, other, descending, loc), loc);
      for (size_t k = 0; k < x.size(); ++k) x[k] = where(take_other, other[k], x[k], loc);
    }
}

}  // namespace

std::vector<Tile> sort(const std::vector<Tile>& tiles, int axis, bool descending, Loc loc) {
  if (tiles.empty()) Builder::current(loc).fail(loc, "sort: needs one or more tiles");
  Builder& b = Builder::current(loc);
  const ir::Type first = b.type(tiles[0].id());
  axis = check_axis(b, "sort", first, axis, loc);
  for (size_t k = 0; k < tiles.size(); ++k)
    if (b.type(tiles[k].id()).shape != first.shape)
      b.fail(loc, fmt::format("sort: tile {} is {}, tile 0 is {} (every tile needs the same shape)", k, ir::to_string(b.type(tiles[k].id())),
                              ir::to_string(first)));
  const int64_t n = first.shape[static_cast<size_t>(axis)];
  if (n & (n - 1)) b.fail(loc, fmt::format("sort: the axis has {} elements (valid: a power of two)", n));
  std::vector<Tile> x = tiles;
  bitonic_stages(x, axis, descending, 2, n, loc);
  return x;
}

Tile sort(const Operand& x, int axis, bool descending, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  return sort(std::vector<Tile>{detail::to_tile(b, x, loc)}, axis, descending, loc)[0];
}

Tile argsort(const Operand& x, int axis, bool descending, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  axis = check_axis(b, "argsort", b.type(t.id()), axis, loc);
  return sort({t, positions(b.type(t.id()).shape, axis, loc)}, axis, descending, loc)[1];
}

namespace {

// A u32 whose unsigned order is the sort's order of x (integers and floats up to 32 bits): floats
// widen to f32 exactly, NaN maps above +inf, negatives flip all bits, non-negatives the sign bit
// (so -0.0 sits just below +0.0); signed integers flip the sign bit.
Tile ordered_u32(const Tile& x, const Loc& loc) {
  Builder& b = Builder::current(loc);
  const DType d = b.type(x.id()).dtype;
  const Tile ones = scalar_constant(DType::u32, int64_t{0xFFFFFFFF}, loc), sign = scalar_constant(DType::u32, int64_t{0x80000000}, loc);
  if (ir::is_float(d)) {
    const Tile f = d == DType::f32 ? x : cast(DType::f32, x, loc);
    const Tile bits = bitcast(DType::u32, f, loc);
    return where(isnan(f, loc), ones, bits ^ where(signbit(f, loc), ones, sign, loc), loc);
  }
  if (d == DType::i1 || !ir::is_signed(d)) return cast(DType::u32, x, loc);
  return bitcast(DType::u32, cast(DType::i32, x, loc), loc) ^ sign;
}

}  // namespace

TopK topk(const Operand& x, int64_t k, int axis, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  const ir::Type type = b.type(t.id());
  axis = check_axis(b, "topk", type, axis, loc);
  const int64_t n = type.shape[static_cast<size_t>(axis)];
  if (k < 1 || k > n || (k & (k - 1)))
    b.fail(loc, fmt::format("topk: k = {} for an axis of {} (valid: a power of two from 1 to {})", k, n, n));
  // Up to 32-bit values the network moves one u64 key per element: the value's order in the high
  // half, n - 1 - position in the low (larger first, then the smaller position), so one integer
  // compare decides each exchange where a float and its position take a dozen instructions. The
  // values are gathered at the winning positions at the end (bit-exact, NaN payloads included).
  const bool keyed = ir::bit_width(type.dtype) <= 32;
  const Tile pos = positions(type.shape, axis, loc);
  std::vector<Tile> v = keyed ? std::vector<Tile>{(cast(DType::u64, ordered_u32(t, loc), loc) << 32) |
                                                  cast(DType::u64, scalar_constant(DType::i32, n - 1, loc) - pos, loc)}
                              : std::vector<Tile>{t, pos};
  // Bitonic top-k: blocks of k sorted in alternating directions (the network's first log2 k
  // sizes), then rounds that halve the axis: two neighbouring blocks (one each way) form a bitonic
  // sequence whose element-wise better halves are its top k, itself bitonic, which log2 k
  // exchanges sort. log2 k (log2 k + 1) / 2 exchanges on n elements, then log2 k on n / 2, n / 4,
  // ... k: about 3.5x fewer element exchanges than sorting all n at n = 1024, k = 16.
  bitonic_stages(v, axis, /*descending=*/true, 2, k, loc);
  for (int64_t m = n; m > k; m /= 2) {
    // [.., m, ..] -> [.., m / 2k, 2, k, ..]: the pair of blocks on the new axis + 1
    Shape pairs = b.type(v[0].id()).shape;
    pairs[static_cast<size_t>(axis)] = k;
    pairs.insert(pairs.begin() + axis, 2);
    pairs.insert(pairs.begin() + axis, m / (2 * k));
    std::vector<Tile> grouped;
    for (const Tile& g : v) grouped.push_back(reshape(g, pairs, loc));
    std::vector<Tile> better = keyed ? std::vector<Tile>{max(grouped[0], axis + 1, loc)}
                                     : reduce(grouped, axis + 1, [&](const std::vector<Tile>& p, const std::vector<Tile>& q) {
                                         const Tile take_p = before(p, q, /*descending=*/true, loc);
                                         std::vector<Tile> out;
                                         for (size_t i = 0; i < p.size(); ++i) out.push_back(where(take_p, p[i], q[i], loc));
                                         return out;
                                       }, loc);
    Shape halved = b.type(v[0].id()).shape;
    halved[static_cast<size_t>(axis)] = m / 2;
    for (size_t i = 0; i < v.size(); ++i) v[i] = reshape(better[i], halved, loc);
    bitonic_stages(v, axis, /*descending=*/true, k, k, loc);  // (only the last size: the merge)
  }
  if (!keyed) return {v[0], v[1]};
  const Tile indices = scalar_constant(DType::i32, n - 1, loc) - cast(DType::i32, v[0] & scalar_constant(DType::u64, int64_t{0xFFFFFFFF}, loc), loc);
  return {gather(t, indices, axis, loc), indices};
}

}  // namespace tilejit::lang
