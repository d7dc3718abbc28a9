#include "dsl/math.hpp"

#include <fmt/format.h>

#include <limits>

#include "dsl/promote.hpp"

namespace tilejit::lang {
namespace {

// The operand as a tile (literals in their default dtype) and its builder.
struct In {
  Builder& b;
  Tile t;
  DType d;
};
In in(const Operand& x, const Loc& loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  return {b, t, t.dtype()};
}

In float_in(const Operand& x, const char* fn, const Loc& loc) {
  In i = in(x, loc);
  if (!ir::is_float(i.d) || ir::is_fp8(i.d))
    i.b.fail(loc, fmt::format("{}: x is {}; it takes f16, bf16, f32 or f64 tiles", fn, ir::name(i.d)));
  return i;
}

// 16-bit floats computed in f32 (their values are exact there), the result rounded once.
Tile wide(const In& i, const Loc& loc) { return ir::bit_width(i.d) < 32 ? cast(DType::f32, i.t, loc) : i.t; }
Tile narrow(const In& i, const Tile& r, const Loc& loc) { return ir::bit_width(i.d) < 32 ? cast(i.d, r, loc) : r; }

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

Tile isnan(const Operand& x, Loc loc) {
  In i = in(x, loc);
  if (!ir::is_float(i.d)) return full(DType::i1, i.b.type(i.t.id()).shape, false, loc);
  return i.t != i.t;
}

Tile isinf(const Operand& x, Loc loc) {
  In i = in(x, loc);
  if (!ir::is_float(i.d)) return full(DType::i1, i.b.type(i.t.id()).shape, false, loc);
  return abs(i.t, loc) == kInf;
}

Tile isfinite(const Operand& x, Loc loc) {
  In i = in(x, loc);
  if (!ir::is_float(i.d)) return full(DType::i1, i.b.type(i.t.id()).shape, true, loc);
  return abs(i.t, loc) < kInf;  // NaN compares false
}

Tile signbit(const Operand& x, Loc loc) {
  In i = in(x, loc);
  if (!ir::is_float(i.d)) return i.t < 0;
  const DType bits = i.d == DType::f64 ? DType::i64 : i.d == DType::f32 ? DType::i32 : DType::i16;
  return bitcast(bits, i.t, loc) < 0;
}

Tile clamp(const Operand& x, const Operand& lo, const Operand& hi, Loc loc) {
  return minimum(maximum(x, lo, loc), hi, loc);
}

Tile trunc(const Operand& x, Loc loc) {
  In i = float_in(x, "trunc", loc);
  return where(i.t < 0, ceil(i.t, loc), floor(i.t, loc), loc);
}

Tile round(const Operand& x, Loc loc) {
  In i = float_in(x, "round", loc);
  Tile w = wide(i, loc);
  const double magic = i.d == DType::f64 ? 0x1p52 : 0x1p23;  // from here on every value is an integer
  Tile a = abs(w, loc);
  Tile r = (a + magic) - magic;  // the addition rounds to an integer, ties to even
  Tile s = where(signbit(w, loc), -r, r, loc);  // -0.0 and -0.3 give -0.0
  return narrow(i, where(a < magic, s, w, loc), loc);  // NaN and inf: a < magic is false
}

Tile sigmoid(const Operand& x, Loc loc) {
  In i = float_in(x, "sigmoid", loc);
  Tile w = wide(i, loc);
  return narrow(i, 1.0 / (1.0 + exp(-w, loc)), loc);
}

Tile log1p(const Operand& x, Loc loc) {
  In i = float_in(x, "log1p", loc);
  Tile w = wide(i, loc);
  Tile u = 1.0 + w;
  // Goldberg: log(u) * (x / (u - 1)) corrects the rounding of 1 + x; u == 1: log1p(x) = x
  Tile r = where(u == 1.0, w, log(u, loc) * (w / (u - 1.0)), loc);
  return narrow(i, where(w == kInf, w, r, loc), loc);
}

Tile expm1(const Operand& x, Loc loc) {
  In i = float_in(x, "expm1", loc);
  Tile w = wide(i, loc);
  Tile u = exp(w, loc);
  // Kahan: (u - 1) * x / log(u) corrects the rounding of exp(x); u == 1: expm1(x) = x
  Tile r = where(u == 1.0, w, (u - 1.0) * (w / log(u, loc)), loc);
  r = where(u - 1.0 == -1.0, full(DType::f32, {}, -1.0, loc), r, loc);
  return narrow(i, where(u == kInf, u, r, loc), loc);
}

namespace {

Tile arg_extreme(const Operand& x, int axis, bool largest, const char* fn, const Loc& loc) {
  In i = in(x, loc);
  const Shape shape = i.b.type(i.t.id()).shape;
  const int rank = static_cast<int>(shape.size());
  if (rank == 0 || axis < 0 || axis >= rank)
    i.b.fail(loc, fmt::format("{}: axis {} is out of range for a rank-{} tile (valid: 0 to {})", fn, axis, rank, rank - 1));
  const int64_t n = shape[static_cast<size_t>(axis)];
  if (n > std::numeric_limits<int32_t>::max())
    i.b.fail(loc, fmt::format("{}: {} elements along axis {} do not fit the i32 index", fn, n, axis));
  // the extreme back in x's shape (NaN when the row has one: reductions propagate NaN)
  Tile m = broadcast_to(expand_dims(largest ? max(i.t, axis, loc) : min(i.t, axis, loc), axis, loc), shape, loc);
  Tile hit = where(isnan(m, loc), isnan(i.t, loc), i.t == m, loc);
  // each element's index along the axis
  Tile index = arange(0, n, loc);
  for (int d = 0; d < rank; ++d)
    if (d != axis) index = expand_dims(index, d, loc);
  index = broadcast_to(index, shape, loc);
  return min(where(hit, index, full(DType::i32, shape, static_cast<int32_t>(n), loc), loc), axis, loc);
}

}  // namespace

Tile argmax(const Operand& x, int axis, Loc loc) { return arg_extreme(x, axis, true, "argmax", loc); }
Tile argmin(const Operand& x, int axis, Loc loc) { return arg_extreme(x, axis, false, "argmin", loc); }

Tile histogram(const Operand& x, int64_t num_bins, Loc loc) { return histogram(x, num_bins, HistogramMethod::ballots, loc); }

Tile histogram(const Operand& x, int64_t num_bins, HistogramMethod method, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  const ir::Type type = b.type(t.id());
  if (!ir::is_int(type.dtype) || type.dtype == DType::i1 || type.shape.empty())
    b.fail(loc, fmt::format("histogram: needs an integer tile, got {}", ir::to_string(type)));
  if (num_bins < 1 || num_bins > ir::kMaxHistogramBins || (num_bins & (num_bins - 1)))
    b.fail(loc, fmt::format("histogram: num_bins = {} (valid: a power of two from 1 to {})", num_bins, ir::kMaxHistogramBins));
  ir::AttrMap attrs{{"num_bins", num_bins}};
  if (method == HistogramMethod::shared_atomics) attrs["method"] = std::string("shared_atomics");  // (absent: ballots)
  return b.emit1(ir::OpKind::histogram, {t.id()}, attrs, loc);
}

}  // namespace tilejit::lang
