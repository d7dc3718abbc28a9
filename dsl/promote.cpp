// Broadcasting, dtype promotion and literal materialisation for the DSL.
#include "dsl/promote.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace tilejit::lang::detail {
namespace {

std::string describe(Builder& b, const Operand& o) {
  if (!o.is_literal()) return ir::to_string(b.type(o.tile().id()));
  switch (o.literal_kind()) {
    case Operand::LiteralKind::Bool: return o.int_value() ? "true" : "false";
    case Operand::LiteralKind::Float: return fmt::format("{}", o.float_value());
    case Operand::LiteralKind::UInt64: return fmt::format("{}", static_cast<uint64_t>(o.int_value()));
    case Operand::LiteralKind::Int: return fmt::format("{}", o.int_value());
  }
  return "?";
}

bool literal_fits(const Operand& o, DType d) {
  if (o.literal_kind() == Operand::LiteralKind::UInt64) {
    uint64_t v = static_cast<uint64_t>(o.int_value());
    return d == DType::u64 || (d == DType::i64 && v <= static_cast<uint64_t>(INT64_MAX)) ||
           v <= (uint64_t{1} << (ir::bit_width(d) - (ir::is_signed(d) ? 1 : 0))) - 1;
  }
  int64_t v = o.int_value();
  int w = ir::bit_width(d);
  if (d == DType::i1) return v == 0 || v == 1;
  if (w == 64) return ir::is_signed(d) || v >= 0;
  if (ir::is_signed(d)) return v >= -(int64_t{1} << (w - 1)) && v < (int64_t{1} << (w - 1));
  return v >= 0 && v < (int64_t{1} << w);
}

}  // namespace

Builder& builder_for(std::initializer_list<const Operand*> ops, const Loc& loc) {
  Builder* found = nullptr;
  for (const Operand* o : ops) {
    if (o->is_literal()) continue;
    if (!o->tile().valid()) Builder::current(loc).fail(loc, "uses an empty Tile (declared but never assigned)");
    if (found && found != o->tile().builder())
      found->fail(loc, "mixes values from two different kernels");
    found = o->tile().builder();
  }
  Builder& b = found ? *found : Builder::current(loc);
  if (&b != &Builder::current(loc)) b.fail(loc, "uses a value of a kernel that is not being built");
  return b;
}

Shape broadcast_shapes(Builder& b, const Shape& x, const Shape& y, const Loc& loc, std::string_view what) {
  size_t n = std::max(x.size(), y.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t dx = i < n - x.size() ? 1 : x[i - (n - x.size())];
    int64_t dy = i < n - y.size() ? 1 : y[i - (n - y.size())];
    if (dx != dy && dx != 1 && dy != 1)
      b.fail(loc, fmt::format("{}: shape mismatch in broadcast: {} vs {} (dim {}: {} vs {})", what, ir::shape_string(x),
                              ir::shape_string(y), i, dx, dy));
    out[i] = dx == 1 ? dy : dx;
  }
  return out;
}

Tile broadcast_to(Builder& b, const Tile& t, const Shape& shape, const Loc& loc) {
  const ir::Type& ty = b.type(t.id());
  if (ty.shape == shape) return t;
  if (ty.is_scalar()) return b.emit1(ir::OpKind::splat, {t.id()}, {{"shape", shape}}, loc);
  Tile cur = t;
  if (ty.shape.size() < shape.size()) {
    Shape padded(shape.size() - ty.shape.size(), 1);
    padded.insert(padded.end(), ty.shape.begin(), ty.shape.end());
    cur = b.emit1(ir::OpKind::reshape, {cur.id()}, {{"shape", padded}}, loc);
  }
  if (b.type(cur.id()).shape.size() > shape.size())
    b.fail(loc, fmt::format("cannot broadcast {} to {}", ir::to_string(ty), ir::shape_string(shape)));
  if (b.type(cur.id()).shape != shape) cur = b.emit1(ir::OpKind::broadcast, {cur.id()}, {{"shape", shape}}, loc);
  return cur;
}

DType default_literal_dtype(const Operand& o) {
  switch (o.literal_kind()) {
    case Operand::LiteralKind::Bool: return DType::i1;
    case Operand::LiteralKind::Float: return DType::f32;
    case Operand::LiteralKind::UInt64: return DType::u64;
    case Operand::LiteralKind::Int:
      return (o.int_value() >= INT32_MIN && o.int_value() <= INT32_MAX) ? DType::i32 : DType::i64;
  }
  return DType::i32;
}

DType common_dtype(Builder& b, const Operand& x, const Operand& y, const Loc& loc, std::string_view what) {
  if (x.is_literal() && y.is_literal()) {
    DType dx = default_literal_dtype(x), dy = default_literal_dtype(y);
    if (ir::is_float(dx) || ir::is_float(dy)) return DType::f32;
    return ir::bit_width(dx) >= ir::bit_width(dy) ? dx : dy;
  }
  if (x.is_literal() || y.is_literal()) {
    const Operand& lit = x.is_literal() ? x : y;
    const ir::Type& t = b.type((x.is_literal() ? y : x).tile().id());
    if (!t.is_value()) b.fail(loc, fmt::format("{}: cannot combine {} with a number", what, ir::to_string(t)));
    DType d = t.dtype;
    if (ir::is_fp8(d)) b.fail(loc, fmt::format("{}: {} is a storage type; cast to f16, bf16 or f32 before arithmetic", what, ir::name(d)));
    if (ir::is_float(d)) return d;
    if (lit.literal_kind() == Operand::LiteralKind::Float) return DType::f32;
    if (d == DType::i1 && lit.literal_kind() != Operand::LiteralKind::Bool) return default_literal_dtype(lit);
    return d;
  }
  const ir::Type& tx = b.type(x.tile().id());
  const ir::Type& ty = b.type(y.tile().id());
  if (!tx.is_value() || !ty.is_value())
    b.fail(loc, fmt::format("{}: cannot combine {} and {}", what, ir::to_string(tx), ir::to_string(ty)));
  DType dx = tx.dtype, dy = ty.dtype;
  if (dx == dy) return dx;
  if (ir::is_fp8(dx) || ir::is_fp8(dy))
    b.fail(loc, fmt::format("{}: fp8 is a storage type; cast to f16, bf16 or f32 before arithmetic ({} vs {})", what,
                            ir::name(dx), ir::name(dy)));
  bool fx = ir::is_float(dx), fy = ir::is_float(dy);
  if (fx && fy) {
    int wx = ir::bit_width(dx), wy = ir::bit_width(dy);
    if (wx == wy)
      b.fail(loc, fmt::format("{}: dtype mismatch: {} vs {}; cast one operand explicitly, e.g. cast(f32, x)", what,
                              ir::name(dx), ir::name(dy)));
    return wx > wy ? dx : dy;
  }
  if (fx) return dx;
  if (fy) return dy;
  if (dx == DType::i1) return dy;
  if (dy == DType::i1) return dx;
  int wx = ir::bit_width(dx), wy = ir::bit_width(dy);
  if (wx != wy) return wx > wy ? dx : dy;
  return ir::is_signed(dx) ? dy : dx;  // same width, mixed signedness: unsigned wins (C rule)
}

Tile materialize(Builder& b, const Operand& o, DType dtype, const Shape& shape, const Loc& loc, std::string_view what) {
  if (!o.is_literal()) {
    Tile t = o.tile();
    const ir::Type& ty = b.type(t.id());
    if (ty.is_value() && ty.dtype != dtype) t = b.emit1(ir::OpKind::cast, {t.id()}, {{"dtype", dtype}}, loc);
    return broadcast_to(b, t, shape, loc);
  }
  ir::Attr value;
  if (ir::is_float(dtype)) {
    double v = o.float_value();
    v = ir::round_to(dtype, v);
    value = v;
  } else {
    if (o.literal_kind() == Operand::LiteralKind::Float) {
      double v = o.float_value();
      if (v != std::trunc(v) || !std::isfinite(v))
        b.fail(loc, fmt::format("{}: the number {} is not an integer but meets an {} value", what, v, ir::name(dtype)));
      Operand as_int(static_cast<int64_t>(v), o.loc());
      if (!literal_fits(as_int, dtype)) b.fail(loc, fmt::format("{}: the number {} does not fit in {}", what, v, ir::name(dtype)));
      value = static_cast<int64_t>(v);
    } else {
      if (!literal_fits(o, dtype))
        b.fail(loc, fmt::format("{}: the number {} does not fit in {}", what, describe(b, o), ir::name(dtype)));
      value = ir::wrap_int(dtype, o.int_value());
    }
  }
  return b.emit1(ir::OpKind::constant, {}, {{"value", value}, {"dtype", dtype}, {"shape", shape}}, loc);
}

DType widened_integer(DType d) {
  if (d == DType::i1 || d == DType::i8 || d == DType::i16) return DType::i32;
  if (d == DType::u8 || d == DType::u16) return DType::u32;
  return d;
}

int normalize_axis(Builder& b, std::string_view what, const ir::Type& t, int axis, const Loc& loc) {
  const int rank = static_cast<int>(t.shape.size());
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank)
    b.fail(loc, fmt::format("{}: axis {} is out of range for {} (valid: 0..{} or negative from the end)", what, axis, ir::to_string(t),
                            rank - 1));
  return axis;
}

Tile to_tile(Builder& b, const Operand& o, const Loc& loc) {
  if (!o.is_literal()) return o.tile();
  return materialize(b, o, default_literal_dtype(o), {}, loc, "literal");
}

}  // namespace tilejit::lang::detail
