// Tile operations and operators: each checks its operands, inserts the broadcasts and casts the
// IR wants explicit, and emits one or a few IR ops.
#include "dsl/ops.hpp"

#include <fmt/format.h>

#include "dsl/promote.hpp"

namespace tilejit::lang {
namespace {

using detail::builder_for;
using ir::OpKind;

bool is_pointer(Builder& b, const Operand& o) { return !o.is_literal() && b.type(o.tile().id()).is_pointer(); }

// ptr + offset (or offset + ptr); `negate` for ptr - offset.
Tile pointer_offset(Builder& b, const Operand& ptr, const Operand& off, bool negate, const Loc& loc) {
  Tile p = ptr.tile();
  Tile o = detail::to_tile(b, off, loc);
  const ir::Type& ot = b.type(o.id());
  if (!ot.is_value() || !ir::is_int(ot.dtype) || ot.dtype == DType::i1)
    b.fail(loc, fmt::format("pointer arithmetic needs an integer offset, got {}", ir::to_string(ot)));
  if (negate) o = b.emit1(OpKind::neg, {o.id()}, {}, loc);
  Shape s = detail::broadcast_shapes(b, b.type(p.id()).shape, ot.shape, loc, "pointer arithmetic");
  p = detail::broadcast_to(b, p, s, loc);
  o = detail::broadcast_to(b, o, s, loc);
  return b.emit1(OpKind::addptr, {p.id(), o.id()}, {}, loc);
}

// Promote, broadcast and emit an elementwise binary op (or cmp with `pred`).
Tile binary(OpKind kind, const Operand& x, const Operand& y, const Loc& loc, const char* pred = nullptr, ir::AttrMap attrs = {}) {
  Builder& b = builder_for({&x, &y}, loc);
  std::string what = pred ? fmt::format("cmp {}", pred) : std::string(ir::op_name(kind));
  if (is_pointer(b, x) || is_pointer(b, y)) {
    if (kind == OpKind::add && !is_pointer(b, y)) return pointer_offset(b, x, y, false, loc);
    if (kind == OpKind::add && !is_pointer(b, x)) return pointer_offset(b, y, x, false, loc);
    if (kind == OpKind::sub && !is_pointer(b, y)) return pointer_offset(b, x, y, true, loc);
    b.fail(loc, fmt::format("{}: not defined on pointers (pointers support + and - of integer offsets)", what));
  }
  DType d;
  if (kind == OpKind::shl || kind == OpKind::shr) {
    // the shifted value decides the type; the amount follows it
    d = x.is_literal() ? detail::common_dtype(b, x, y, loc, what) : b.type(x.tile().id()).dtype;
  } else {
    d = detail::common_dtype(b, x, y, loc, what);
  }
  Shape sx = x.is_literal() ? Shape{} : b.type(x.tile().id()).shape;
  Shape sy = y.is_literal() ? Shape{} : b.type(y.tile().id()).shape;
  Shape s = detail::broadcast_shapes(b, sx, sy, loc, what);
  Tile tx = detail::materialize(b, x, d, s, loc, what);
  Tile ty = detail::materialize(b, y, d, s, loc, what);
  if (pred) attrs["pred"] = std::string(pred);
  return b.emit1(kind, {tx.id(), ty.id()}, std::move(attrs), loc);
}

Tile unary(OpKind kind, const Operand& x, const Loc& loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  return b.emit1(kind, {t.id()}, {}, loc);
}

Tile reduce(const char* kind, const Operand& x, int axis, const Loc& loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  int rank = static_cast<int>(b.type(t.id()).shape.size());
  if (rank == 0) b.fail(loc, fmt::format("{}: cannot reduce a scalar", kind));
  axis = detail::normalize_axis(b, kind, b.type(t.id()), axis, loc);
  // a sum of booleans counts them, and small integers sum in 32 bits (i32 / u32, as Triton does and
  // as cumsum accumulates)
  if (std::string_view(kind) == "sum" && detail::widened_integer(b.type(t.id()).dtype) != b.type(t.id()).dtype)
    t = cast(detail::widened_integer(b.type(t.id()).dtype), t, loc);
  return b.emit1(OpKind::reduce, {t.id()}, {{"kind", std::string(kind)}, {"axis", int64_t{axis}}}, loc);
}

Tile reduce_all(const char* kind, const Operand& x, const Loc& loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  while (!b.type(t.id()).shape.empty()) t = reduce(kind, t, b.type(t.id()).shape.size() == 1 ? 0 : 1, loc);
  return t;
}

}  // namespace

// ---- operators ----
Tile operator+(const Operand& a, const Operand& b) { return binary(OpKind::add, a, b, a.loc()); }
Tile operator-(const Operand& a, const Operand& b) { return binary(OpKind::sub, a, b, a.loc()); }
Tile operator*(const Operand& a, const Operand& b) { return binary(OpKind::mul, a, b, a.loc()); }

Tile scale_lazily(const Operand& x, const Operand& scale, std::source_location loc) {
  Builder& b = builder_for({&x, &scale}, loc);
  const DType d = detail::common_dtype(b, x, scale, loc, "scale_lazily");
  if (!ir::is_float(d)) b.fail(loc, fmt::format("scale_lazily: x and scale must be floats, got {}", ir::name(d)));
  return binary(OpKind::mul, x, scale, loc, nullptr, {{ir::kSkipUnitScaleAttr, int64_t{1}}});
}
Tile operator/(const Operand& a, const Operand& b) { return binary(OpKind::div, a, b, a.loc()); }
Tile operator%(const Operand& a, const Operand& b) { return binary(OpKind::rem, a, b, a.loc()); }
Tile operator&(const Operand& a, const Operand& b) { return binary(OpKind::bit_and, a, b, a.loc()); }
Tile operator|(const Operand& a, const Operand& b) { return binary(OpKind::bit_or, a, b, a.loc()); }
Tile operator^(const Operand& a, const Operand& b) { return binary(OpKind::bit_xor, a, b, a.loc()); }
Tile operator<<(const Operand& a, const Operand& b) { return binary(OpKind::shl, a, b, a.loc()); }
Tile operator>>(const Operand& a, const Operand& b) { return binary(OpKind::shr, a, b, a.loc()); }
Tile operator<(const Operand& a, const Operand& b) { return binary(OpKind::cmp, a, b, a.loc(), "lt"); }
Tile operator<=(const Operand& a, const Operand& b) { return binary(OpKind::cmp, a, b, a.loc(), "le"); }
Tile operator>(const Operand& a, const Operand& b) { return binary(OpKind::cmp, a, b, a.loc(), "gt"); }
Tile operator>=(const Operand& a, const Operand& b) { return binary(OpKind::cmp, a, b, a.loc(), "ge"); }
Tile operator==(const Operand& a, const Operand& b) { return binary(OpKind::cmp, a, b, a.loc(), "eq"); }
Tile operator!=(const Operand& a, const Operand& b) { return binary(OpKind::cmp, a, b, a.loc(), "ne"); }
Tile operator-(const Operand& a) { return unary(OpKind::neg, a, a.loc()); }
Tile operator~(const Operand& a) { return unary(OpKind::bit_not, a, a.loc()); }
Tile operator!(const Operand& a) {
  Builder& b = builder_for({&a}, a.loc());
  Tile t = detail::to_tile(b, a, a.loc());
  if (b.type(t.id()).dtype == DType::i1) return b.emit1(OpKind::bit_not, {t.id()}, {}, a.loc());
  return binary(OpKind::cmp, t, 0, a.loc(), "eq");
}

// ---- creation ----
Tile arange(int64_t start, int64_t end, Loc loc) {
  Builder& b = Builder::current(loc);
  if (end <= start) b.fail(loc, fmt::format("arange: needs end > start, got arange({}, {})", start, end));
  return b.emit1(OpKind::arange, {}, {{"start", start}, {"end", end}}, loc);
}

Tile full(DType dtype, Shape shape, const Operand& value, Loc loc) {
  Builder& b = builder_for({&value}, loc);
  for (int64_t d : shape)
    if (d <= 0) b.fail(loc, fmt::format("full: tile dimensions must be positive, got {}", ir::shape_string(shape)));
  if (!value.is_literal() && !b.type(value.tile().id()).is_scalar())
    b.fail(loc, fmt::format("full: the fill value must be a scalar, got {}", ir::to_string(b.type(value.tile().id()))));
  return detail::materialize(b, value, dtype, shape, loc, "full");
}

Tile zeros(DType dtype, Shape shape, Loc loc) { return full(dtype, std::move(shape), 0, loc); }

Tile scalar_constant(DType dtype, const Operand& value, Loc loc) { return full(dtype, {}, value, loc); }

// ---- shapes ----
Tile expand_dims(const Operand& x, int axis, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  int rank = static_cast<int>(b.type(t.id()).shape.size());
  if (axis < 0) axis += rank + 1;
  if (axis < 0 || axis > rank) b.fail(loc, fmt::format("expand_dims: axis {} is out of range for rank {}", axis, rank));
  return b.emit1(OpKind::expand_dims, {t.id()}, {{"axis", int64_t{axis}}}, loc);
}

Tile broadcast_to(const Operand& x, Shape shape, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  Shape s = detail::broadcast_shapes(b, b.type(t.id()).shape, shape, loc, "broadcast_to");
  if (s != shape)
    b.fail(loc, fmt::format("broadcast_to: cannot broadcast {} to {}", ir::to_string(b.type(t.id())), ir::shape_string(shape)));
  return detail::broadcast_to(b, t, shape, loc);
}

Tile reshape(const Operand& x, Shape shape, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  return b.emit1(OpKind::reshape, {detail::to_tile(b, x, loc).id()}, {{"shape", std::move(shape)}}, loc);
}

Tile permute(const Operand& x, std::vector<int64_t> perm, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  return b.emit1(OpKind::trans, {detail::to_tile(b, x, loc).id()}, {{"perm", std::move(perm)}}, loc);
}

Tile trans(const Operand& x, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  auto rank = static_cast<int64_t>(b.type(t.id()).shape.size());
  if (rank < 2) b.fail(loc, fmt::format("trans: needs a tile of rank >= 2, got {}", ir::to_string(b.type(t.id()))));
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
  std::swap(perm[static_cast<size_t>(rank - 1)], perm[static_cast<size_t>(rank - 2)]);
  return permute(t, perm, loc);
}

// ---- elementwise ----
Tile where(const Operand& cond, const Operand& x, const Operand& y, Loc loc) {
  Builder& b = builder_for({&cond, &x, &y}, loc);
  Tile c = detail::to_tile(b, cond, loc);
  const ir::Type& ct = b.type(c.id());
  if (!ct.is_value() || ct.dtype != DType::i1)
    b.fail(loc, fmt::format("where: the condition must be a boolean (i1) tile, got {} (compare it, e.g. x != 0)", ir::to_string(ct)));
  Shape sx = x.is_literal() ? Shape{} : b.type(x.tile().id()).shape;
  Shape sy = y.is_literal() ? Shape{} : b.type(y.tile().id()).shape;
  Shape s = detail::broadcast_shapes(b, detail::broadcast_shapes(b, ct.shape, sx, loc, "where"), sy, loc, "where");
  Tile tx, ty;
  if (is_pointer(b, x) || is_pointer(b, y)) {
    if (!is_pointer(b, x) || !is_pointer(b, y) || b.type(x.tile().id()).dtype != b.type(y.tile().id()).dtype)
      b.fail(loc, "where: both branches must be pointers of the same dtype, or both numbers");
    tx = detail::broadcast_to(b, x.tile(), s, loc);
    ty = detail::broadcast_to(b, y.tile(), s, loc);
  } else {
    DType d = detail::common_dtype(b, x, y, loc, "where");
    tx = detail::materialize(b, x, d, s, loc, "where");
    ty = detail::materialize(b, y, d, s, loc, "where");
  }
  c = detail::broadcast_to(b, c, s, loc);
  return b.emit1(OpKind::select, {c.id(), tx.id(), ty.id()}, {}, loc);
}

Tile maximum(const Operand& a, const Operand& b, Loc loc) { return binary(OpKind::maximum, a, b, loc); }
Tile minimum(const Operand& a, const Operand& b, Loc loc) { return binary(OpKind::minimum, a, b, loc); }
Tile umulhi(const Operand& a, const Operand& b, Loc loc) { return binary(OpKind::umulhi, a, b, loc); }

Tile fma(const Operand& a, const Operand& b, const Operand& c, Loc loc) {
  Builder& bld = builder_for({&a, &b, &c}, loc);
  DType d = DType::f32;
  Shape s;
  bool any_tile = false;
  for (const auto& [x, what] : {std::pair{&a, "a"}, std::pair{&b, "b"}, std::pair{&c, "c"}}) {
    if (x->is_literal()) continue;
    const ir::Type& t = bld.type(x->tile().id());
    if (t.dtype != DType::f32 && t.dtype != DType::f64)
      bld.fail(loc, fmt::format("fma: operand '{}' must be an f32 or f64 tile, got {} (cast it first)", what, ir::to_string(t)));
    if (any_tile && t.dtype != d) bld.fail(loc, fmt::format("fma: operands mix {} and {}; cast one first", ir::name(d), ir::name(t.dtype)));
    d = t.dtype;
    s = any_tile ? detail::broadcast_shapes(bld, s, t.shape, loc, "fma") : t.shape;
    any_tile = true;
  }
  Tile ta = detail::materialize(bld, a, d, s, loc, "fma");
  Tile tb = detail::materialize(bld, b, d, s, loc, "fma");
  Tile tc = detail::materialize(bld, c, d, s, loc, "fma");
  return bld.emit1(OpKind::fma, {ta.id(), tb.id(), tc.id()}, {}, loc);
}

Tile byte_perm(const Operand& a, const Operand& b, const Operand& selector, Loc loc) {
  Builder& bld = builder_for({&a, &b, &selector}, loc);
  // Bytes of 32-bit words only: a float or a narrower/wider integer would make the byte numbering
  // (and a silent conversion) a guess, so each operand is checked, not promoted.
  DType d = DType::u32;
  bool all_i32 = true, any_tile = false;
  Shape s;
  for (auto [o, what] : {std::pair{&a, "a"}, std::pair{&b, "b"}, std::pair{&selector, "selector"}}) {
    if (o->is_literal()) {
      if (o->literal_kind() == Operand::LiteralKind::Float || o->literal_kind() == Operand::LiteralKind::Bool)
        bld.fail(loc, fmt::format("byte_perm: operand '{}' must be an integer (u32 or i32 bytes), got a {} literal", what,
                                  o->literal_kind() == Operand::LiteralKind::Float ? "floating-point" : "boolean"));
      continue;
    }
    const ir::Type& t = bld.type(o->tile().id());
    if (!t.is_value() || (t.dtype != DType::u32 && t.dtype != DType::i32))
      bld.fail(loc, fmt::format("byte_perm: operand '{}' must be a u32 or i32 tile, got {} (bitcast or cast it to u32)", what,
                                ir::to_string(t)));
    any_tile = true;
    all_i32 = all_i32 && t.dtype == DType::i32;
    s = detail::broadcast_shapes(bld, s, t.shape, loc, "byte_perm");
  }
  if (any_tile && all_i32) d = DType::i32;
  Tile ta = detail::materialize(bld, a, d, s, loc, "byte_perm");
  Tile tb = detail::materialize(bld, b, d, s, loc, "byte_perm");
  Tile ts = detail::materialize(bld, selector, d, s, loc, "byte_perm");
  return bld.emit1(OpKind::byte_perm, {ta.id(), tb.id(), ts.id()}, {}, loc);
}

Tile cast(DType dtype, const Operand& x, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  if (x.is_literal()) return detail::materialize(b, x, dtype, {}, loc, "cast");
  Tile t = x.tile();
  if (!b.type(t.id()).is_value()) b.fail(loc, fmt::format("cast: cannot convert {} (only numbers)", ir::to_string(b.type(t.id()))));
  if (b.type(t.id()).dtype == dtype) return t;
  return b.emit1(OpKind::cast, {t.id()}, {{"dtype", dtype}}, loc);
}

Tile bitcast(DType dtype, const Operand& x, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  if (b.type(t.id()).dtype == dtype) return t;
  return b.emit1(OpKind::bitcast, {t.id()}, {{"dtype", dtype}}, loc);
}

Tile pack_pairs(const Tile& x, Loc loc) {
  Builder& b = Builder::current(loc);
  const ir::Type& t = b.type(x.id());
  if (!t.is_value() || ir::bit_width(t.dtype) != 16 || t.shape.empty() || t.shape.back() % 2 != 0)
    b.fail(loc, fmt::format("pack_pairs: needs a tile of a 16-bit dtype (bf16, f16, i16, u16) whose last dimension is even, got {}",
                            ir::to_string(t)));
  return b.emit1(OpKind::pack_pairs, {x.id()}, {}, loc);
}

Tile unpack_pairs(DType dtype, const Tile& words, Loc loc) {
  Builder& b = Builder::current(loc);
  const ir::Type& t = b.type(words.id());
  if (!t.is_value() || t.dtype != DType::u32 || t.shape.empty())
    b.fail(loc, fmt::format("unpack_pairs: needs a u32 tile, got {}", ir::to_string(t)));
  if (ir::bit_width(dtype) != 16) b.fail(loc, fmt::format("unpack_pairs: unpacks into a 16-bit dtype, got {}", ir::name(dtype)));
  return b.emit1(OpKind::unpack_pairs, {words.id()}, {{"dtype", dtype}}, loc);
}

Tile precompute(const Operand& x, Loc loc) {
  Builder& b = builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  return b.emit1(OpKind::precompute, {t.id()}, {}, loc);
}

Tile exp(const Operand& x, Loc loc) { return unary(OpKind::exp, x, loc); }
Tile exp2(const Operand& x, Loc loc) { return unary(OpKind::exp2, x, loc); }
Tile log(const Operand& x, Loc loc) { return unary(OpKind::log, x, loc); }
Tile log2(const Operand& x, Loc loc) { return unary(OpKind::log2, x, loc); }
Tile sqrt(const Operand& x, Loc loc) { return unary(OpKind::sqrt, x, loc); }
Tile rsqrt(const Operand& x, Loc loc) { return unary(OpKind::rsqrt, x, loc); }
Tile rcp(const Operand& x, Loc loc) { return unary(OpKind::rcp, x, loc); }
Tile abs(const Operand& x, Loc loc) { return unary(OpKind::abs, x, loc); }
Tile floor(const Operand& x, Loc loc) { return unary(OpKind::floor, x, loc); }
Tile ceil(const Operand& x, Loc loc) { return unary(OpKind::ceil, x, loc); }
Tile tanh(const Operand& x, Loc loc) { return unary(OpKind::tanh, x, loc); }
Tile sin(const Operand& x, Loc loc) { return unary(OpKind::sin, x, loc); }
Tile cos(const Operand& x, Loc loc) { return unary(OpKind::cos, x, loc); }
Tile erf(const Operand& x, Loc loc) { return unary(OpKind::erf, x, loc); }

// ---- reductions ----
Tile sum(const Operand& x, int axis, Loc loc) { return reduce("sum", x, axis, loc); }
Tile max(const Operand& x, int axis, Loc loc) { return reduce("max", x, axis, loc); }
Tile min(const Operand& x, int axis, Loc loc) { return reduce("min", x, axis, loc); }
Tile sum(const Operand& x, Loc loc) { return reduce_all("sum", x, loc); }
Tile max(const Operand& x, Loc loc) { return reduce_all("max", x, loc); }
Tile min(const Operand& x, Loc loc) { return reduce_all("min", x, loc); }

// ---- dot ----
Tile dot(const Operand& a, const Operand& b, const Operand& acc, DotOptions o, Loc loc) {
  Builder& bld = builder_for({&a, &b, &acc}, loc);
  Tile ta = detail::to_tile(bld, a, loc), tb = detail::to_tile(bld, b, loc);
  const ir::Type &A = bld.type(ta.id()), &B = bld.type(tb.id());
  const size_t ra = A.shape.size(), rb = B.shape.size();
  if ((ra != 2 && ra != 3) || (rb != 2 && rb != 3))
    bld.fail(loc, fmt::format("dot: operands must be 2-D tiles (a[M,K] @ b[K,N]) or 3-D tiles (a[B,M,K] @ b[B,K,N], batched), "
                              "got a {} and b {}", ir::to_string(A), ir::to_string(B)));
  if (ra != rb)
    bld.fail(loc, fmt::format("dot: a is {} ({}-D) but b is {} ({}-D); both must be 2-D, or both 3-D for a batched dot", ir::to_string(A),
                              ra, ir::to_string(B), rb));
  if (ra == 3 && A.shape[0] != B.shape[0])
    bld.fail(loc, fmt::format("dot: batch sizes differ: a is {} (B = {}), b is {} (B = {}); a batched dot needs equal leading dimensions",
                              ir::to_string(A), A.shape[0], ir::to_string(B), B.shape[0]));
  if (A.shape[ra - 1] != B.shape[ra - 2])
    bld.fail(loc, fmt::format("dot: inner dimensions differ: a is {} (K = {}), b is {} (K = {})", ir::to_string(A), A.shape[ra - 1],
                              ir::to_string(B), B.shape[ra - 2]));
  if (A.dtype != B.dtype)
    bld.fail(loc, fmt::format("dot: dtype mismatch: a is {}, b is {}; cast one so both match", ir::name(A.dtype), ir::name(B.dtype)));
  if (o.input_precision == InputPrecision::tf32 && A.dtype != DType::f32)
    bld.fail(loc, fmt::format("dot: input_precision tf32 rounds f32 inputs, but a and b are {} (a is {}); valid: f32 inputs with tf32, "
                              "or the default ieee for every dtype",
                              ir::name(A.dtype), ir::to_string(A)));
  DType acc_dtype = A.dtype == DType::i8 ? DType::i32 : DType::f32;
  Shape out = A.shape;
  out[ra - 1] = B.shape[ra - 1];
  Tile tc;
  if (acc.is_literal()) {
    tc = detail::materialize(bld, acc, acc_dtype, out, loc, "dot accumulator");
  } else {
    tc = acc.tile();
    const ir::Type& C = bld.type(tc.id());
    if (C.dtype != acc_dtype)
      bld.fail(loc, fmt::format("dot: the accumulator must be {} for {} inputs, got {}", ir::name(acc_dtype), ir::name(A.dtype),
                                ir::to_string(C)));
    // numpy's rule: aligned at the right, each dimension equal to the product's or 1
    bool fits = C.shape.size() <= out.size();
    for (size_t d = 0; fits && d < C.shape.size(); ++d) {
      const int64_t c = C.shape[C.shape.size() - 1 - d], want = out[out.size() - 1 - d];
      fits = c == want || c == 1;
    }
    if (!fits)
      bld.fail(loc, fmt::format("dot: the accumulator {} does not broadcast to the product's shape {} (valid: {}{} or a shape that "
                                "broadcasts to it)",
                                ir::to_string(C), ir::shape_string(out), ir::name(acc_dtype), ir::shape_string(out)));
    tc = detail::broadcast_to(bld, tc, out, loc);
  }
  // the default (ieee) is no attribute: the IR of every dot written before the option is unchanged
  ir::AttrMap attrs;
  if (o.input_precision != InputPrecision::ieee) attrs[ir::kInputPrecisionAttr] = std::string(ir::name(o.input_precision));
  if (o.descriptors_at_use) attrs[ir::kDescriptorsAtUseAttr] = int64_t{1};
  if (o.staging_at_use) attrs[ir::kStagingAtUseAttr] = int64_t{1};
  return bld.emit1(OpKind::dot, {ta.id(), tb.id(), tc.id()}, std::move(attrs), loc);
}

Tile dot(const Operand& a, const Operand& b, const Operand& acc, Loc loc) { return dot(a, b, acc, DotOptions{}, loc); }
Tile dot(const Operand& a, const Operand& b, DotOptions o, Loc loc) { return dot(a, b, 0, o, loc); }
Tile dot(const Operand& a, const Operand& b, Loc loc) { return dot(a, b, 0, DotOptions{}, loc); }

// ---- program geometry ----
Tile program_id(int axis, Loc loc) { return Builder::current(loc).program_id(axis, loc); }
Tile num_programs(int axis, Loc loc) { return Builder::current(loc).num_programs(axis, loc); }

Tile cdiv(const Operand& a, const Operand& b, Loc loc) {
  Builder& bld = builder_for({&a, &b}, loc);
  DType d = detail::common_dtype(bld, a, b, loc, "cdiv");
  if (!ir::is_int(d) || d == DType::i1) bld.fail(loc, fmt::format("cdiv: needs integers, got {}", ir::name(d)));
  return binary(OpKind::div, binary(OpKind::sub, binary(OpKind::add, a, b, loc), 1, loc), b, loc);
}

}  // namespace tilejit::lang
