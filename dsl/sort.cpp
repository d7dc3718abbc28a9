// Bitonic sorting network over xor_permute: for each merge size s = 2, 4, ..., n and each stride
// t = s/2, ..., 1, element i meets element i ^ t and keeps the smaller of the two where
// (i & t) == 0 and i's block of s runs ascending ((i & s) == 0), else the larger. log2(n) (log2(n)
// + 1) / 2 exchanges, each an xor_permute per tile plus elementwise compares and selects.
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
  const Tile pos = positions(first.shape, axis, loc);
  for (int64_t size = 2; size <= n; size *= 2)
    for (int64_t stride = size / 2; stride >= 1; stride /= 2) {
      std::vector<Tile> other;
      for (const Tile& t : x) other.push_back(xor_permute(t, axis, stride, loc));
      // the lower element of an ascending block (or the upper of a descending one) keeps the smaller
      Tile keeps_smaller = ((pos & stride) == 0) == ((pos & size) == 0);
      Tile take_other = where(keeps_smaller, before(other, x, descending, loc), before(x, other, descending, loc), loc);
      for (size_t k = 0; k < x.size(); ++k) x[k] = where(take_other, other[k], x[k], loc);
    }
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

TopK topk(const Operand& x, int64_t k, int axis, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  const ir::Type type = b.type(t.id());
  axis = check_axis(b, "topk", type, axis, loc);
  const int64_t n = type.shape[static_cast<size_t>(axis)];
  if (k < 1 || k > n || (k & (k - 1)))
    b.fail(loc, fmt::format("topk: k = {} for an axis of {} (valid: a power of two from 1 to {})", k, n, n));
  std::vector<Tile> sorted = sort({t, positions(type.shape, axis, loc)}, axis, /*descending=*/true, loc);
  if (k == n) return {sorted[0], sorted[1]};
  // the axis split into [n / k, k]: the first of the n / k groups is the top k
  Shape split = type.shape;
  split[static_cast<size_t>(axis)] = k;
  split.insert(split.begin() + axis, n / k);
  std::vector<Tile> groups{reshape(sorted[0], split, loc), reshape(sorted[1], split, loc)};
  std::vector<Tile> first = reduce(groups, axis, [](const std::vector<Tile>& p, const std::vector<Tile>&) { return p; }, loc);
  return {first[0], first[1]};
}

}  // namespace tilejit::lang
