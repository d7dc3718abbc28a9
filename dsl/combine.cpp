// associative_scan / reduce with a user combine: the combine lambda runs once, into the op's
// region, on scalar arguments standing for a pair of elements.
#include "dsl/combine.hpp"

#include <fmt/format.h>

#include "dsl/promote.hpp"

namespace tilejit::lang {
namespace {

using ir::OpKind;

std::vector<Tile> combine_op(OpKind kind, const char* what, const std::vector<Tile>& xs, int axis, const Combine& combine,
                             bool reverse, const Loc& loc) {
  if (xs.empty()) Builder::current(loc).fail(loc, fmt::format("{}: needs one or more tiles", what));
  for (const Tile& x : xs)
    if (!x.valid()) Builder::current(loc).fail(loc, fmt::format("{}: a tile is empty (default-constructed)", what));
  Builder& b = *xs[0].builder();
  if (!combine) b.fail(loc, fmt::format("{}: the combine function is empty", what));
  const ir::Type first = b.type(xs[0].id());  // a copy: new values below grow the value table
  const int rank = static_cast<int>(first.shape.size());
  if (rank == 0) b.fail(loc, fmt::format("{}: cannot combine along an axis of a scalar ({})", what, ir::to_string(first)));
  axis = detail::normalize_axis(b, what, first, axis, loc);
  std::vector<ir::ValueId> operands;
  std::vector<DType> dtypes;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].builder() != &b) b.fail(loc, fmt::format("{}: tile {} belongs to another kernel", what, i));
    const ir::Type& t = b.type(xs[i].id());
    if (!t.is_value() || t.shape != first.shape)
      b.fail(loc, fmt::format("{}: tile {} is {}, tile 0 is {} (every tile needs the same shape)", what, i, ir::to_string(t),
                              ir::to_string(first)));
    operands.push_back(xs[i].id());
    dtypes.push_back(t.dtype);
  }

  // the combine's arguments: a_0..a_{n-1}, then b_0..b_{n-1}
  const size_t n = xs.size();
  ir::Block region;
  std::vector<Tile> a, bb;
  for (size_t side = 0; side < 2; ++side)
    for (size_t i = 0; i < n; ++i) {
      ir::ValueId arg = b.new_value(ir::Type::scalar(dtypes[i]));
      region.args.push_back(arg);
      (side == 0 ? a : bb).push_back(Tile(&b, arg));
    }
  std::vector<Var*> vars = b.live_vars();
  std::vector<ir::ValueId> before;
  for (Var* v : vars) before.push_back(v->value().id());
  b.enter(region);
  std::vector<Tile> out = combine(a, bb);
  if (out.size() != n)
    b.fail(loc, fmt::format("{}: the combine function returned {} value{} for {} tile{}", what, out.size(), out.size() == 1 ? "" : "s",
                            n, n == 1 ? "" : "s"));
  std::vector<ir::ValueId> yielded;
  for (size_t i = 0; i < n; ++i) {
    if (!out[i].valid() || out[i].builder() != &b) b.fail(loc, fmt::format("{}: the combine function's result {} is not a tile of this kernel", what, i));
    const ir::Type& t = b.type(out[i].id());
    if (t != ir::Type::scalar(dtypes[i]))
      b.fail(loc, fmt::format("{}: the combine function's result {} is {}, expected {} (the dtype of tile {}; cast it)", what, i,
                              ir::to_string(t), ir::to_string(ir::Type::scalar(dtypes[i])), i));
    yielded.push_back(out[i].id());
  }
  b.emit(OpKind::yield, yielded, {}, loc);
  b.leave();
  for (size_t i = 0; i < vars.size(); ++i)
    if (vars[i]->value().id() != before[i])
      b.fail(loc, fmt::format("{}: the combine function assigns a Var; it may only compute and return its values", what));

  ir::Op op;
  op.kind = kind;
  op.operands = operands;
  op.attrs["axis"] = int64_t{axis};
  if (kind == OpKind::scan) op.attrs["reverse"] = int64_t{reverse ? 1 : 0};
  op.loc = {loc.file_name(), loc.line(), loc.column()};
  for (size_t i = 0; i < n; ++i) {
    ir::Shape s = first.shape;
    if (kind == OpKind::reduce_with) s.erase(s.begin() + axis);
    op.results.push_back(b.new_value(b.type(operands[i]).with_shape(s)));
  }
  op.regions.push_back(std::move(region));
  std::vector<ir::ValueId> results = op.results;
  b.append(std::move(op));
  std::vector<Tile> r;
  for (ir::ValueId v : results) r.push_back(Tile(&b, v));
  return r;
}

Combine from_one(const Combine1& combine) {
  if (!combine) return nullptr;
  return [combine](const std::vector<Tile>& a, const std::vector<Tile>& b) { return std::vector<Tile>{combine(a[0], b[0])}; };
}

// The dtype a running sum or product accumulates in: small integers as `sum` counts them
// (detail::widened_integer), 16-bit floats in f32.
DType accumulation_dtype(DType d) {
  if (d == DType::f16 || d == DType::bf16) return DType::f32;
  return detail::widened_integer(d);
}

Tile running(const char* what, const Operand& x, int axis, bool reverse, bool product, const Loc& loc) {
  Builder& b = detail::builder_for({&x}, loc);
  Tile t = detail::to_tile(b, x, loc);
  if (ir::is_fp8(t.dtype())) b.fail(loc, fmt::format("{}: cannot accumulate {} (cast to f16 or f32 first)", what, ir::name(t.dtype())));
  const DType acc = accumulation_dtype(t.dtype());
  if (acc != t.dtype()) t = cast(acc, t, loc);
  return combine_op(OpKind::scan, what, {t}, axis, from_one([product](const Tile& p, const Tile& q) { return product ? p * q : p + q; }),
                    reverse, loc)[0];
}

}  // namespace

std::vector<Tile> associative_scan(const std::vector<Tile>& xs, int axis, const Combine& combine, bool reverse, Loc loc) {
  return combine_op(OpKind::scan, "associative_scan", xs, axis, combine, reverse, loc);
}

Tile associative_scan(const Operand& x, int axis, const Combine1& combine, bool reverse, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  return combine_op(OpKind::scan, "associative_scan", {detail::to_tile(b, x, loc)}, axis, from_one(combine), reverse, loc)[0];
}

std::vector<Tile> reduce(const std::vector<Tile>& xs, int axis, const Combine& combine, Loc loc) {
  return combine_op(OpKind::reduce_with, "reduce", xs, axis, combine, false, loc);
}

Tile reduce(const Operand& x, int axis, const Combine1& combine, Loc loc) {
  Builder& b = detail::builder_for({&x}, loc);
  return combine_op(OpKind::reduce_with, "reduce", {detail::to_tile(b, x, loc)}, axis, from_one(combine), false, loc)[0];
}

Tile cumsum(const Operand& x, int axis, bool reverse, Loc loc) { return running("cumsum", x, axis, reverse, false, loc); }
Tile cumprod(const Operand& x, int axis, bool reverse, Loc loc) { return running("cumprod", x, axis, reverse, true, loc); }

}  // namespace tilejit::lang
