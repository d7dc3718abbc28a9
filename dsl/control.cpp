// for_range and if_: run the body lambdas once into a region, then find which Vars the body
// reassigned; those become loop-carried values (for) or results (if), the rest are folded away.
#include "dsl/control.hpp"

#include <fmt/format.h>

#include "dsl/promote.hpp"

namespace tilejit::lang {
namespace {

using ir::OpKind;

std::string var_where(const Var& v) { return fmt::format("{}:{}", v.declared_at().file_name(), v.declared_at().line()); }

Tile bound(Builder& b, const Operand& o, DType d, const Loc& loc, const char* what) {
  if (!o.is_literal()) {
    const ir::Type& t = b.type(o.tile().id());
    if (!t.is_value() || !t.is_scalar() || !ir::is_int(t.dtype) || t.dtype == DType::i1)
      b.fail(loc, fmt::format("for_range: the {} must be an integer scalar, got {}", what, ir::to_string(t)));
  }
  return detail::materialize(b, o, d, {}, loc, "for_range");
}

}  // namespace

void for_range(const Operand& lb, const Operand& ub, const Operand& step, const std::function<void(Tile)>& body, Loc loc) {
  Builder& b = detail::builder_for({&lb, &ub, &step}, loc);
  if (step.is_literal() && (step.literal_kind() == Operand::LiteralKind::Float || step.int_value() <= 0))
    b.fail(loc, fmt::format("for_range: the step must be a positive integer, got {}", step.float_value()));
  // The loop counter is i32 unless a bound is 64-bit.
  DType d = DType::i32;
  for (const Operand* o : {&lb, &ub, &step}) {
    DType od = o->is_literal() ? detail::default_literal_dtype(*o) : b.type(o->tile().id()).dtype;
    if (od == DType::i64 || od == DType::u64) d = DType::i64;
  }
  Tile tl = bound(b, lb, d, loc, "lower bound"), tu = bound(b, ub, d, loc, "upper bound"), ts = bound(b, step, d, loc, "step");

  std::vector<Var*> vars = b.live_vars();
  std::vector<Tile> before;
  ir::Block region;
  ir::ValueId iv = b.new_value(ir::Type::scalar(d));
  region.args.push_back(iv);
  for (Var* v : vars) {
    before.push_back(v->value());
    ir::ValueId arg = b.new_value(b.type(v->value().id()));
    region.args.push_back(arg);
    Builder::set_var(*v, Tile(&b, arg));
  }
  b.enter(region);
  body(Tile(&b, iv));

  // Which Vars did the body reassign? The others read their outer value directly.
  std::vector<ir::ValueId> carried_args{iv}, yielded, inits;
  std::vector<size_t> carried;
  for (size_t i = 0; i < vars.size(); ++i) {
    ir::ValueId arg = region.args[i + 1];
    ir::ValueId now = vars[i]->value().id();
    if (now == arg) {
      ir::replace_all_uses(region, arg, before[i].id());
      continue;
    }
    if (b.type(now) != b.type(arg))
      b.fail(loc, fmt::format("for_range: the Var declared at {} changes type inside the loop body, from {} to {}; a "
                              "loop-carried value must keep its type (cast it back before the end of the body)",
                              var_where(*vars[i]), ir::to_string(b.type(arg)), ir::to_string(b.type(now))));
    carried.push_back(i);
    carried_args.push_back(arg);
    yielded.push_back(now);
    inits.push_back(before[i].id());
  }
  region.args = carried_args;
  b.emit(OpKind::yield, yielded, {}, loc);
  b.leave();

  ir::Op op;
  op.kind = OpKind::for_;
  op.operands = {tl.id(), tu.id(), ts.id()};
  op.operands.insert(op.operands.end(), inits.begin(), inits.end());
  op.loc = {loc.file_name(), loc.line(), loc.column()};
  for (ir::ValueId init : inits) op.results.push_back(b.new_value(b.type(init)));
  op.regions.push_back(std::move(region));
  std::vector<ir::ValueId> results = op.results;
  b.append(std::move(op));
  for (size_t i = 0; i < vars.size(); ++i) Builder::set_var(*vars[i], before[i]);
  for (size_t j = 0; j < carried.size(); ++j) Builder::set_var(*vars[carried[j]], Tile(&b, results[j]));
}

void for_range(const Operand& lb, const Operand& ub, const std::function<void(Tile)>& body, Loc loc) {
  for_range(lb, ub, 1, body, loc);
}

void if_(const Operand& cond, const std::function<void()>& then_body, const std::function<void()>& else_body, Loc loc) {
  Builder& b = detail::builder_for({&cond}, loc);
  Tile c = detail::to_tile(b, cond, loc);
  if (b.type(c.id()) != ir::Type::scalar(DType::i1))
    b.fail(loc, fmt::format("if_: the condition must be a boolean (i1) scalar, got {}", ir::to_string(b.type(c.id()))));

  std::vector<Var*> vars = b.live_vars();
  std::vector<Tile> before;
  for (Var* v : vars) before.push_back(v->value());

  // Run one branch into `region`, then restore every Var; return what each Var held at its end.
  auto run_branch = [&](ir::Block& region, const std::function<void()>& fn) {
    b.enter(region);
    if (fn) fn();
    std::vector<ir::ValueId> after;
    for (Var* v : vars) after.push_back(v->value().id());
    for (size_t i = 0; i < vars.size(); ++i) Builder::set_var(*vars[i], before[i]);
    return after;
  };
  ir::Block then_r, else_r;
  std::vector<ir::ValueId> then_vals = run_branch(then_r, then_body);
  std::vector<ir::ValueId> then_yield, else_yield;
  std::vector<size_t> changed;
  // The then-branch must be closed before the else-branch opens; its yield is appended after we
  // know which Vars either branch changed, so collect the else values first.
  b.leave();
  std::vector<ir::ValueId> else_vals = run_branch(else_r, else_body);
  for (size_t i = 0; i < vars.size(); ++i) {
    if (then_vals[i] == before[i].id() && else_vals[i] == before[i].id()) continue;
    for (ir::ValueId v : {then_vals[i], else_vals[i]})
      if (b.type(v) != b.type(before[i].id()))
        b.fail(loc, fmt::format("if_: the Var declared at {} changes type inside a branch, from {} to {}", var_where(*vars[i]),
                                ir::to_string(b.type(before[i].id())), ir::to_string(b.type(v))));
    changed.push_back(i);
    then_yield.push_back(then_vals[i]);
    else_yield.push_back(else_vals[i]);
  }
  b.emit(OpKind::yield, else_yield, {}, loc);
  b.leave();
  ir::Op then_y;
  then_y.kind = OpKind::yield;
  then_y.operands = then_yield;  // defined in then_r or outside: checked by the verifier at finish
  then_y.loc = {loc.file_name(), loc.line(), loc.column()};
  then_r.ops.push_back(std::move(then_y));

  ir::Op op;
  op.kind = OpKind::if_;
  op.operands = {c.id()};
  op.loc = {loc.file_name(), loc.line(), loc.column()};
  for (size_t i : changed) op.results.push_back(b.new_value(b.type(before[i].id())));
  op.regions.push_back(std::move(then_r));
  op.regions.push_back(std::move(else_r));
  std::vector<ir::ValueId> results = op.results;
  b.append(std::move(op));
  for (size_t j = 0; j < changed.size(); ++j) Builder::set_var(*vars[changed[j]], Tile(&b, results[j]));
}

void if_(const Operand& cond, const std::function<void()>& then_body, Loc loc) { if_(cond, then_body, nullptr, loc); }

void warpgroup_turn(const std::function<void()>& body, Loc loc) {
  Builder& b = Builder::current(loc);
  // the builder runs on one thread: a depth per thread is the depth of this kernel's turns
  thread_local int depth = 0;
  if (depth > 0) b.fail(loc, "warpgroup_turn: turns do not nest (this one is inside another warpgroup_turn)");
  b.emit(OpKind::turn_begin, {}, {}, loc);
  ++depth;
  try {
    body();
  } catch (...) {
    --depth;
    throw;
  }
  --depth;
  b.emit(OpKind::turn_end, {}, {}, loc);
}

void ring_producer(RingProducer r, Loc loc) {
  Builder& b = Builder::current(loc);
  for (auto [name, v] : {std::pair{"producer_registers", r.producer_registers}, std::pair{"consumer_registers", r.consumer_registers}})
    if (v < 24 || v > 256 || v % 8 != 0) b.fail(loc, fmt::format("ring_producer: {} = {} (valid: a multiple of 8 in [24, 256])", name, v));
  ir::AttrMap attrs{{"producer_registers", int64_t{r.producer_registers}}, {"consumer_registers", int64_t{r.consumer_registers}}};
  if (r.reduce_writer) attrs.emplace("reduce_writer", int64_t{1});  // (absent when off: the IR of other kernels is unchanged)
  if (r.coordinates_at_use) attrs.emplace("coordinates_at_use", int64_t{1});  // (likewise)
  b.emit(OpKind::ring_producer, {}, std::move(attrs), loc);
}

void warp_roles(const std::vector<WarpRole>& roles, Loc loc) {
  Builder& b = Builder::current(loc);
  if (roles.size() < 2) b.fail(loc, fmt::format("warp_roles: needs two or more roles, got {}", roles.size()));
  int rest = 0;
  const bool registers = roles[0].max_registers != 0;
  std::vector<int64_t> warps, regs;
  for (size_t i = 0; i < roles.size(); ++i) {
    const WarpRole& r = roles[i];
    if (r.warps == 0) ++rest;
    else if (r.warps < 4 || r.warps % 4 != 0 || (r.warps & (r.warps - 1)) != 0)
      b.fail(loc, fmt::format("warp_roles: role {} has warps = {} (valid: 4, 8, 16 -- whole warpgroups, a power of two -- or 0 for the "
                              "warps the other roles leave)", i, r.warps));
    if ((r.max_registers != 0) != registers)
      b.fail(loc, "warp_roles: give max_registers to every role or to none (setmaxnreg moves registers from some roles to others)");
    if (registers && (r.max_registers < 24 || r.max_registers > 256 || r.max_registers % 8 != 0))
      b.fail(loc, fmt::format("warp_roles: role {} has max_registers = {} (valid: a multiple of 8 in [24, 256], or 0 for every role)", i,
                              r.max_registers));
    if (!r.body) b.fail(loc, fmt::format("warp_roles: role {} has no body", i));
    warps.push_back(r.warps);
    regs.push_back(r.max_registers);
  }
  if (rest > 1) b.fail(loc, fmt::format("warp_roles: {} roles ask for the remaining warps (warps = 0); at most one may", rest));

  std::vector<Var*> vars = b.live_vars();
  std::vector<Tile> before;
  for (Var* v : vars) before.push_back(v->value());
  ir::Op op;
  op.kind = OpKind::warp_roles;
  op.loc = {loc.file_name(), loc.line(), loc.column()};
  op.attrs["warps"] = warps;
  op.attrs["max_registers"] = regs;
  for (size_t i = 0; i < roles.size(); ++i) {
    ir::Block region;
    b.enter(region);
    roles[i].body();
    for (size_t j = 0; j < vars.size(); ++j)
      if (vars[j]->value().id() != before[j].id())
        b.fail(loc, fmt::format("warp_roles: role {} assigns the Var declared at {}: roles change no Var declared outside them "
                                "(they run on different warps)", i, var_where(*vars[j])));
    b.emit(OpKind::yield, {}, {}, loc);
    b.leave();
    op.regions.push_back(std::move(region));
  }
  b.append(std::move(op));
}

Channel::Channel(DType dtype, const ir::Shape& shape, int stages, Loc loc)
    : id_(Builder::current(loc).new_channel_id()), dtype_(dtype), shape_(shape), stages_(stages) {
  Builder& b = Builder::current(loc);
  if (stages < 1 || stages > 16) b.fail(loc, fmt::format("Channel: stages = {} (valid: 1 to 16)", stages));
  if (shape.empty()) b.fail(loc, "Channel: carries tiles; give a shape");
  for (int64_t d : shape)
    if (d <= 0) b.fail(loc, fmt::format("Channel: tile dimensions must be positive, got {}", ir::shape_string(shape)));
}

ir::AttrMap Channel::attrs() const {
  return {{"channel", id_}, {"stages", int64_t{stages_}}, {"shape", shape_}, {"dtype", dtype_}};
}

void Channel::push(const Operand& index, const Tile& value, Loc loc) const {
  Builder& b = Builder::current(loc);
  const ir::Type want = ir::Type::tile(dtype_, shape_);
  if (b.type(value.id()) != want)
    b.fail(loc, fmt::format("Channel::push: the channel carries {}, got {}", ir::to_string(want), ir::to_string(b.type(value.id()))));
  Tile i = detail::materialize(b, index, DType::i32, {}, loc, "Channel::push");
  if (b.type(i.id()) != ir::Type::scalar(DType::i32))
    b.fail(loc, fmt::format("Channel::push: the index must be an i32 scalar, got {}", ir::to_string(b.type(i.id()))));
  b.emit(OpKind::channel_push, {i.id(), value.id()}, attrs(), loc);
}

Tile Channel::pop(const Operand& index, Loc loc) const {
  Builder& b = Builder::current(loc);
  Tile i = detail::materialize(b, index, DType::i32, {}, loc, "Channel::pop");
  if (b.type(i.id()) != ir::Type::scalar(DType::i32))
    b.fail(loc, fmt::format("Channel::pop: the index must be an i32 scalar, got {}", ir::to_string(b.type(i.id()))));
  return b.emit1(OpKind::channel_pop, {i.id()}, attrs(), loc);
}

}  // namespace tilejit::lang
