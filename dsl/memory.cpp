// Loads, stores, atomics and tensor windows.
#include "dsl/memory.hpp"

#include <fmt/format.h>

#include "dsl/ops.hpp"
#include "dsl/promote.hpp"

namespace tilejit::lang {
namespace {

using detail::builder_for;
using ir::OpKind;

Tile pointer_tile(Builder& b, const Operand& ptr, const Loc& loc, const char* what) {
  if (ptr.is_literal() || !b.type(ptr.tile().id()).is_pointer())
    b.fail(loc, fmt::format("{}: the address must be a pointer or pointer tile (e.g. X + offsets), got {}", what,
                            ptr.is_literal() ? "a number" : ir::to_string(b.type(ptr.tile().id()))));
  return ptr.tile();
}

Tile mask_tile(Builder& b, const Operand& mask, const Loc& loc, const char* what) {
  Tile m = detail::to_tile(b, mask, loc);
  const ir::Type& t = b.type(m.id());
  if (!t.is_value() || t.dtype != DType::i1)
    b.fail(loc, fmt::format("{}: the mask must be a boolean (i1) tile, got {}", what, ir::to_string(t)));
  return m;
}

// Check that `value` can be written through a pointer to `pointee` without an implicit conversion.
void check_value_dtype(Builder& b, const Operand& value, DType pointee, const Loc& loc, const char* what) {
  if (value.is_literal()) return;
  const ir::Type& vt = b.type(value.tile().id());
  if (!vt.is_value() || vt.dtype != pointee)
    b.fail(loc, fmt::format("{}: the value is {} but the pointer points to {}; convert it first with cast({}, value)", what,
                            ir::to_string(vt), ir::name(pointee), ir::name(pointee)));
}

Tile memory_op(OpKind kind, const Operand& ptr, const Operand& value, const Operand* mask, const Loc& loc) {
  const char* what = kind == OpKind::store ? "store" : "atomic_add";
  Builder& b = mask ? builder_for({&ptr, &value, mask}, loc) : builder_for({&ptr, &value}, loc);
  Tile p = pointer_tile(b, ptr, loc, what);
  DType pointee = b.type(p.id()).dtype;
  check_value_dtype(b, value, pointee, loc, what);
  Shape s = b.type(p.id()).shape;
  if (!value.is_literal()) s = detail::broadcast_shapes(b, s, b.type(value.tile().id()).shape, loc, what);
  Tile m;
  if (mask) {
    m = mask_tile(b, *mask, loc, what);
    s = detail::broadcast_shapes(b, s, b.type(m.id()).shape, loc, what);
  }
  std::vector<ir::ValueId> ops{detail::broadcast_to(b, p, s, loc).id(), detail::materialize(b, value, pointee, s, loc, what).id()};
  if (mask) ops.push_back(detail::broadcast_to(b, m, s, loc).id());
  auto r = b.emit(kind, std::move(ops), {}, loc);
  return r.empty() ? Tile() : Tile(&b, r[0]);
}

void check_dim(Builder& b, const Tensor& t, int dim, const char* what, const Loc& loc) {
  if (dim < 0 || dim >= t.rank()) b.fail(loc, fmt::format("{}: dim {} is out of range for a rank-{} tensor", what, dim, t.rank()));
}

}  // namespace

Tile load(const Operand& ptr, Loc loc) {
  Builder& b = builder_for({&ptr}, loc);
  return b.emit1(OpKind::load, {pointer_tile(b, ptr, loc, "load").id()}, {}, loc);
}

Tile load(const Operand& ptr, const Operand& mask, Loc loc) { return load(ptr, mask, 0, loc); }

Tile load(const Operand& ptr, const Operand& mask, const Operand& other, Loc loc) {
  Builder& b = builder_for({&ptr, &mask, &other}, loc);
  Tile p = pointer_tile(b, ptr, loc, "load");
  Tile m = mask_tile(b, mask, loc, "load");
  DType pointee = b.type(p.id()).dtype;
  Shape s = detail::broadcast_shapes(b, b.type(p.id()).shape, b.type(m.id()).shape, loc, "load");
  if (!other.is_literal()) {
    check_value_dtype(b, other, pointee, loc, "load (padding value)");
    s = detail::broadcast_shapes(b, s, b.type(other.tile().id()).shape, loc, "load");
  }
  Tile o = detail::materialize(b, other, pointee, s, loc, "load (padding value)");
  return b.emit1(OpKind::load, {detail::broadcast_to(b, p, s, loc).id(), detail::broadcast_to(b, m, s, loc).id(), o.id()}, {}, loc);
}

void store(const Operand& ptr, const Operand& value, Loc loc) { memory_op(OpKind::store, ptr, value, nullptr, loc); }
void store(const Operand& ptr, const Operand& value, const Operand& mask, Loc loc) {
  memory_op(OpKind::store, ptr, value, &mask, loc);
}
Tile atomic_add(const Operand& ptr, const Operand& value, Loc loc) { return memory_op(OpKind::atomic_add, ptr, value, nullptr, loc); }
Tile atomic_add(const Operand& ptr, const Operand& value, const Operand& mask, Loc loc) {
  return memory_op(OpKind::atomic_add, ptr, value, &mask, loc);
}

namespace {

// atomic_rmw (rmw set) and atomic_cas (compare set) through pointer tiles.
Tile rmw_op(std::optional<ir::AtomicRmw> rmw, const Operand& ptr, const Operand* compare, const Operand& value,
            const Operand* mask, AtomicOptions o, const Loc& loc) {
  const std::string what = rmw ? fmt::format("atomic_{}", ir::name(*rmw)) : "atomic_cas";
  Builder& b = builder_for({&ptr, &value}, loc);
  Tile p = pointer_tile(b, ptr, loc, what.c_str());
  const DType pointee = b.type(p.id()).dtype;
  if (std::string valid = ir::atomic_dtype_error(rmw, pointee); !valid.empty())
    b.fail(loc, fmt::format("{}: the pointer points to {}; {} takes {}", what, ir::name(pointee), what, valid));
  Shape s = b.type(p.id()).shape;
  for (const Operand* v : {compare, &value}) {
    if (!v) continue;
    check_value_dtype(b, *v, pointee, loc, what.c_str());
    if (!v->is_literal()) s = detail::broadcast_shapes(b, s, b.type(v->tile().id()).shape, loc, what.c_str());
  }
  Tile m;
  if (mask) {
    m = mask_tile(b, *mask, loc, what.c_str());
    s = detail::broadcast_shapes(b, s, b.type(m.id()).shape, loc, what.c_str());
  }
  std::vector<ir::ValueId> ops{detail::broadcast_to(b, p, s, loc).id()};
  if (compare) ops.push_back(detail::materialize(b, *compare, pointee, s, loc, what.c_str()).id());
  ops.push_back(detail::materialize(b, value, pointee, s, loc, what.c_str()).id());
  if (mask) ops.push_back(detail::broadcast_to(b, m, s, loc).id());
  ir::AttrMap attrs{{"sem", std::string(ir::name(o.sem))}, {"scope", std::string(ir::name(o.scope))}};
  if (rmw) attrs.emplace("rmw", std::string(ir::name(*rmw)));
  return b.emit1(rmw ? OpKind::atomic_rmw : OpKind::atomic_cas, std::move(ops), std::move(attrs), loc);
}

}  // namespace

Tile atomic_add(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::add, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_add(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::add, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_max(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::max, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_max(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::max, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_min(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::min, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_min(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::min, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_and(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::and_, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_and(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::and_, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_or(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::or_, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_or(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::or_, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_xor(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::xor_, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_xor(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::xor_, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_xchg(const Operand& ptr, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::xchg, ptr, nullptr, value, nullptr, o, loc);
}
Tile atomic_xchg(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(ir::AtomicRmw::xchg, ptr, nullptr, value, &mask, o, loc);
}
Tile atomic_cas(const Operand& ptr, const Operand& compare, const Operand& value, AtomicOptions o, Loc loc) {
  return rmw_op(std::nullopt, ptr, &compare, value, nullptr, o, loc);
}
Tile atomic_cas(const Operand& ptr, const Operand& compare, const Operand& value, const Operand& mask, AtomicOptions o, Loc loc) {
  return rmw_op(std::nullopt, ptr, &compare, value, &mask, o, loc);
}

namespace {

// wait_at_least / signal_add: a scalar pointer to i32 and an i32 scalar (numbers adapt).
void semaphore_op(OpKind kind, const Operand& semaphore, const Operand& value, const Loc& loc) {
  const char* what = kind == OpKind::wait_ge ? "wait_at_least" : "signal_add";
  Builder& b = builder_for({&semaphore, &value}, loc);
  Tile p = pointer_tile(b, semaphore, loc, what);
  const ir::Type& pt = b.type(p.id());
  if (!pt.is_scalar() || pt.dtype != DType::i32)
    b.fail(loc, fmt::format("{}: the semaphore must be one i32 (a scalar pointer to i32), got {}", what, ir::to_string(pt)));
  if (!value.is_literal()) {
    const ir::Type& vt = b.type(value.tile().id());
    if (!vt.is_scalar() || !ir::is_int(vt.dtype) || vt.dtype == DType::i1)
      b.fail(loc, fmt::format("{}: the {} must be an integer scalar, got {}", what, kind == OpKind::wait_ge ? "target" : "value",
                              ir::to_string(vt)));
  }
  Tile v = value.is_literal() ? detail::materialize(b, value, DType::i32, {}, loc, what) : cast(DType::i32, value.tile(), loc);
  b.emit(kind, {p.id(), v.id()}, {}, loc);
}

}  // namespace

void wait_at_least(const Operand& semaphore, const Operand& target, Loc loc) { semaphore_op(OpKind::wait_ge, semaphore, target, loc); }

void timestamp(const Operand& slot, Loc loc) {
  Builder& b = builder_for({&slot}, loc);
  Tile p = pointer_tile(b, slot, loc, "timestamp");
  const ir::Type& pt = b.type(p.id());
  if (!pt.is_scalar() || pt.dtype != DType::u64)
    b.fail(loc, fmt::format("timestamp: the slot must be one u64 (a scalar pointer to u64), got {}", ir::to_string(pt)));
  b.emit(OpKind::timestamp, {p.id()}, {}, loc);
}
void signal_add(const Operand& semaphore, const Operand& value, Loc loc) { semaphore_op(OpKind::signal_add, semaphore, value, loc); }

// ---- tensors ----
Tile Tensor::ptr(Loc loc) const {
  Builder& b = builder_for({}, loc);
  return b.emit1(OpKind::tensor_ptr, {desc_.id()}, {}, loc);
}

Tile Tensor::size(int dim, Loc loc) const {
  Builder& b = Builder::current(loc);
  check_dim(b, *this, dim, "size", loc);
  return b.emit1(OpKind::tensor_dim, {desc_.id()}, {{"dim", int64_t{dim}}}, loc);
}

Tile Tensor::stride(int dim, Loc loc) const {
  Builder& b = Builder::current(loc);
  check_dim(b, *this, dim, "stride", loc);
  return b.emit1(OpKind::tensor_stride, {desc_.id()}, {{"dim", int64_t{dim}}}, loc);
}

Tensor Tensor::slice(int dim, const Operand& start, const Operand& length, Loc loc) const {
  Builder& b = builder_for({&start, &length}, loc);
  check_dim(b, *this, dim, "slice", loc);
  auto i32_scalar = [&](const Operand& o, const char* what) {
    Tile t = detail::to_tile(b, o, loc);
    const ir::Type& ty = b.type(t.id());
    if (ty != ir::Type::scalar(DType::i32))
      b.fail(loc, fmt::format("slice: the {} must be an i32 scalar, got {}{}", what, ir::to_string(ty),
                              ty.is_value() && ty.is_scalar() && ir::is_int(ty.dtype) ? " (convert it with cast(i32, x))" : ""));
    return t.id();
  };
  ir::ValueId s = i32_scalar(start, "start"), n = i32_scalar(length, "length");
  return Tensor(b.emit1(OpKind::tensor_slice, {desc_.id(), s, n}, {{"dim", int64_t{dim}}}, loc));
}

BlockRef Tensor::block(std::vector<Operand> offsets, Shape shape, std::vector<int64_t> dims, Loc loc) const {
  Builder& b = Builder::current(loc);
  if (static_cast<int>(offsets.size()) != rank())
    b.fail(loc, fmt::format("block: needs {} offsets (one per tensor dim), got {}", rank(), offsets.size()));
  if (shape.empty() || static_cast<int>(shape.size()) > rank())
    b.fail(loc, fmt::format("block: the window shape {} must have 1..{} dims", ir::shape_string(shape), rank()));
  if (dims.empty())
    for (size_t i = 0; i < shape.size(); ++i) dims.push_back(rank() - static_cast<int64_t>(shape.size()) + static_cast<int64_t>(i));
  if (dims.size() != shape.size())
    b.fail(loc, fmt::format("block: dims {} and shape {} differ in length", ir::shape_string(dims), ir::shape_string(shape)));
  BlockRef r{*this, {}, std::move(shape), std::move(dims), loc};
  for (const Operand& o : offsets) {
    Tile t = detail::to_tile(b, o, loc);
    const ir::Type& ty = b.type(t.id());
    if (!ty.is_value() || !ty.is_scalar() || !ir::is_int(ty.dtype) || ty.dtype == DType::i1)
      b.fail(loc, fmt::format("block: offsets must be integer scalars, got {}", ir::to_string(ty)));
    r.offsets.push_back(t);
  }
  return r;
}

Tile load(const BlockRef& blk, double padding, Loc loc) {
  Builder& b = Builder::current(loc);
  std::vector<ir::ValueId> ops{blk.tensor.descriptor().id()};
  for (const Tile& t : blk.offsets) ops.push_back(t.id());
  return b.emit1(OpKind::block_load, std::move(ops), {{"shape", blk.shape}, {"dims", blk.dims}, {"padding", padding}}, loc);
}

Tile load_at_use(const BlockRef& blk, double padding, Loc loc) {
  Builder& b = Builder::current(loc);
  std::vector<ir::ValueId> ops{blk.tensor.descriptor().id()};
  for (const Tile& t : blk.offsets) ops.push_back(t.id());
  return b.emit1(OpKind::block_load, std::move(ops),
                 {{"shape", blk.shape}, {"dims", blk.dims}, {"padding", padding}, {"at_use", int64_t{1}}}, loc);
}

void store(const BlockRef& blk, const Operand& value, Loc loc) { store(blk, value, StoreOptions{}, loc); }

void store(const BlockRef& blk, const Operand& value, StoreOptions opts, Loc loc) {
  Builder& b = builder_for({&value}, loc);
  DType d = blk.tensor.dtype();
  check_value_dtype(b, value, d, loc, "store");
  Tile v = detail::materialize(b, value, d, blk.shape, loc, "store");
  std::vector<ir::ValueId> ops{blk.tensor.descriptor().id(), v.id()};
  for (const Tile& t : blk.offsets) ops.push_back(t.id());
  ir::AttrMap attrs{{"dims", blk.dims}};
  if (opts.tma) attrs.emplace(ir::kTmaStoreAttr, int64_t{1});
  if (opts.tma && opts.offsets_at_store) attrs.emplace(ir::kOffsetsAtStoreAttr, int64_t{1});
  b.emit(OpKind::block_store, std::move(ops), std::move(attrs), loc);
}

namespace {
// atomic_add / _max / _min / _and / _or / _xor on a window: a block_store with reduce = the op.
void window_atomic(ir::AtomicRmw rmw, const BlockRef& blk, const Operand& value, const Operand* semaphore, const Operand* target, Loc loc,
                   const Operand* signal = nullptr, AddOptions opts = {}) {
  Builder& b = builder_for({&value}, loc);
  const std::string what = fmt::format("atomic_{}", ir::name(rmw));
  DType d = blk.tensor.dtype();
  check_value_dtype(b, value, d, loc, what.c_str());
  if (rmw == ir::AtomicRmw::add) {
    if (d == DType::i1 || d == DType::bf16 || d == DType::f16 || d == DType::f64 || ir::bit_width(d) < 32)
      b.fail(loc, fmt::format("atomic_add on a window of {} elements: atomic adds take f32, i32, u32, i64 or u64 tensors", ir::name(d)));
  } else if (std::string valid = ir::atomic_dtype_error(rmw, d); !valid.empty()) {
    b.fail(loc, fmt::format("{} on a window of {} elements: {} takes {} tensors", what, ir::name(d), what, valid));
  }
  Tile v = detail::materialize(b, value, d, blk.shape, loc, what.c_str());
  std::vector<ir::ValueId> ops{blk.tensor.descriptor().id(), v.id()};
  for (const Tile& t : blk.offsets) ops.push_back(t.id());
  ir::AttrMap attrs{{"dims", blk.dims}, {"reduce", std::string(ir::name(rmw))}};
  if (opts.narrow_staging) attrs.emplace(ir::kNarrowStagingAttr, int64_t{1});
  // a semaphore operand: one i32 (a scalar pointer to i32)
  auto semaphore_tile = [&](const Operand& o, const char* name) {
    Tile p = pointer_tile(b, o, loc, "atomic_add");
    const ir::Type& pt = b.type(p.id());
    if (!pt.is_scalar() || pt.dtype != DType::i32)
      b.fail(loc, fmt::format("atomic_add: the {} must be one i32 (a scalar pointer to i32), got {}", name, ir::to_string(pt)));
    return p;
  };
  if (semaphore) {  // ordered: the semaphore and its target follow the offsets
    Tile p = semaphore_tile(*semaphore, "semaphore");
    Tile t = target->is_literal() ? detail::materialize(b, *target, DType::i32, {}, loc, "atomic_add") : cast(DType::i32, target->tile(), loc);
    if (!b.type(t.id()).is_scalar()) b.fail(loc, fmt::format("atomic_add: the target must be an integer scalar, got {}", ir::to_string(b.type(t.id()))));
    ops.push_back(p.id()), ops.push_back(t.id());
    attrs["after_semaphore"] = int64_t{1};
    if (signal) {  // then, once complete: *signal += 1
      ops.push_back(semaphore_tile(*signal, "signalled semaphore").id());
      attrs["signal_after"] = int64_t{1};
    }
  }
  b.emit(OpKind::block_store, std::move(ops), std::move(attrs), loc);
}
}  // namespace

void atomic_add(const BlockRef& blk, const Operand& value, Loc loc) { window_atomic(ir::AtomicRmw::add, blk, value, nullptr, nullptr, loc); }
void atomic_add(const BlockRef& blk, const Operand& value, const Operand& semaphore, const Operand& target, Loc loc) {
  window_atomic(ir::AtomicRmw::add, blk, value, &semaphore, &target, loc);
}
void atomic_add(const BlockRef& blk, const Operand& value, const Operand& semaphore, const Operand& target, const Operand& signal, Loc loc) {
  window_atomic(ir::AtomicRmw::add, blk, value, &semaphore, &target, loc, &signal);
}
void atomic_add(const BlockRef& blk, const Operand& value, AddOptions opts, Loc loc) {
  window_atomic(ir::AtomicRmw::add, blk, value, nullptr, nullptr, loc, nullptr, opts);
}
void atomic_add(const BlockRef& blk, const Operand& value, const Operand& semaphore, const Operand& target, const Operand& signal,
                AddOptions opts, Loc loc) {
  window_atomic(ir::AtomicRmw::add, blk, value, &semaphore, &target, loc, &signal, opts);
}
void atomic_max(const BlockRef& blk, const Operand& value, Loc loc) { window_atomic(ir::AtomicRmw::max, blk, value, nullptr, nullptr, loc); }
void atomic_min(const BlockRef& blk, const Operand& value, Loc loc) { window_atomic(ir::AtomicRmw::min, blk, value, nullptr, nullptr, loc); }
void atomic_and(const BlockRef& blk, const Operand& value, Loc loc) { window_atomic(ir::AtomicRmw::and_, blk, value, nullptr, nullptr, loc); }
void atomic_or(const BlockRef& blk, const Operand& value, Loc loc) { window_atomic(ir::AtomicRmw::or_, blk, value, nullptr, nullptr, loc); }
void atomic_xor(const BlockRef& blk, const Operand& value, Loc loc) { window_atomic(ir::AtomicRmw::xor_, blk, value, nullptr, nullptr, loc); }

}  // namespace tilejit::lang
