// The layout-assignment pass. Forward propagation in program order; loop-carried values iterate
// to a fixpoint so that, e.g., an accumulator initialised with zeros takes its dot's mma layout.
#include "jit/assign_layouts.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

namespace tilejit::jit {
namespace {

using ir::OpKind;

class Assigner {
 public:
  Assigner(const ir::Function& f, WarpRoles roles, TmaPlan tma, HopperPlan hopper) : f_(f) {
    static_cast<WarpRoles&>(plan_) = std::move(roles);
    plan_.tma_loops = std::move(tma.loops);
    plan_.hopper = std::move(hopper);
    warps_ = plan_.num_warps;
    plan_.natural.assign(f.values.size(), std::nullopt);
  }

  LayoutPlan run() {
    ir::walk(f_.body, [&](const ir::Op& op) {
      for (ir::ValueId r : op.results) def_[r] = &op;
      for (ir::ValueId v : op.operands) ++uses_[v], user_[v] = &op;
    });
    // The GEMM K loops' dots and every other dot that wgmma runs accumulate in the wgmma layout.
    for (const auto& [loop, m] : plan_.tma_loops) wgmma_dots_.insert(m.dot);
    for (const auto& [dot, w] : plan_.hopper.dots) wgmma_dots_.insert(dot);
    block(f_.body);
    return std::move(plan_);
  }

 private:
  const std::optional<Layout>& nat(ir::ValueId v) const { return plan_.natural[v]; }
  const ir::Op* def_of(ir::ValueId v) const {
    auto it = def_.find(v);
    return it == def_.end() ? nullptr : it->second;
  }
  Layout blocked(const ir::Type& t) const {
    return Layout::blocked(t.shape, warps(), vector_width(t.dtype, t.shape.back()));
  }
  // The warps the op being assigned runs on: its warp role's, else the launch's (which must then
  // be a power of two: layouts spread tiles over power-of-two warp counts).
  int warps() const {
    if (!is_power_of_two(warps_))
      throw LoweringError(fmt::format("tilejit: kernel '{}': a tile outside the warp roles needs a power-of-two num_warps, got {} "
                                      "(compute tiles inside the roles)", f_.name, warps_));
    return warps_;
  }

  void set(ir::ValueId v, std::optional<Layout> l) {
    if (f_.type(v).is_scalar()) l.reset();
    plan_.natural[v] = std::move(l);
  }

  void block(const ir::Block& b) {
    for (const ir::Op& op : b.ops) this->op(op);
  }

  std::optional<Layout> first_natural(const ir::Op& op) const {
    for (ir::ValueId v : op.operands)
      if (nat(v) && !f_.type(v).is_scalar()) return nat(v);
    return std::nullopt;
  }
  // A tile read by a block_load whose only use is `user` (same shape): it can be read in whatever
  // layout that use takes, straight from memory.
  bool relayable_load(ir::ValueId v, const ir::Op& user) const {
    const ir::Op* d = def_of(v);
    if (!d || d->kind != OpKind::block_load || d->attrs.count("at_use") || f_.type(v).is_scalar()) return false;
    auto u = uses_.find(v);
    return u != uses_.end() && u->second == 1 && f_.type(v).shape == f_.type(user.results[0]).shape;
  }
  // An elementwise op's layout: its first operand's, except that a single-use load gives way to
  // another operand's layout and is then read in it. `acc + load(old)` (an MMA accumulator plus a
  // tile from memory: a GEMM's residual, gradient accumulation) would otherwise exchange the
  // accumulator through shared memory, which at the end of a kernel grows its footprint (dK/dV at
  // D 128: 98688 -> 131200 B, half the programs per SM: decision 068).
  std::optional<Layout> elementwise_layout(const ir::Op& op) {
    std::optional<Layout> anchor;
    for (ir::ValueId v : op.operands)
      if (nat(v) && !f_.type(v).is_scalar() && !relayable_load(v, op)) {
        anchor = nat(v);
        break;
      }
    if (!anchor) return first_natural(op);
    for (ir::ValueId v : op.operands)
      if (relayable_load(v, op) && nat(v) != anchor) set(v, anchor);
    return anchor;
  }

  // A pointer load (a gather: a block-sparse mask's table, an index's lookup) whose value flows
  // through single-use elementwise ops of its shape into an op beside a laid-out tile (e.g.
  // `where(table != 0, S, -inf)` beside an MMA accumulator) is read in that tile's layout, its
  // pointers computed there: blocked, it would make the chain -- and an attention's softmax behind
  // the `where` -- exchange the tile through shared memory (decision 107). Only where its own
  // operands are flexible (no layout yet: index arithmetic), else converting them would cost more.
  std::optional<Layout> layout_downstream(const ir::Op& load) const {
    for (ir::ValueId o : load.operands)
      if (!f_.type(o).is_scalar() && nat(o)) return std::nullopt;
    ir::ValueId v = load.results[0];
    const ir::Shape& shape = f_.type(v).shape;
    for (int depth = 0; depth < 8; ++depth) {
      auto u = uses_.find(v);
      if (u == uses_.end() || u->second != 1) return std::nullopt;
      const ir::Op* user = user_.at(v);
      if (!ir::is_elementwise(user->kind) || user->results.size() != 1 || f_.type(user->results[0]).shape != shape) return std::nullopt;
      for (ir::ValueId w : user->operands)
        if (w != v && !f_.type(w).is_scalar() && nat(w) && f_.type(w).shape == shape) return nat(w);
      v = user->results[0];
    }
    return std::nullopt;
  }

  void op(const ir::Op& op) {
    switch (op.kind) {
      case OpKind::load:
        if (f_.type(op.results[0]).is_scalar()) return;  // scalars: no layout
        if (std::optional<Layout> l = layout_downstream(op)) {
          set(op.results[0], std::move(l));
          return;
        }
        set(op.results[0], blocked(f_.type(op.results[0])));
        return;
      case OpKind::block_load:
        if (!f_.type(op.results[0]).is_scalar()) set(op.results[0], blocked(f_.type(op.results[0])));  // scalars: no layout
        return;
      case OpKind::atomic_add:
      case OpKind::atomic_rmw:
      case OpKind::atomic_cas:
        // in the added value's own layout when it has one (e.g. an MMA accumulator: no exchange
        // through shared memory; the pointers are usually computed, hence materialised, in it)
        if (!f_.type(op.results[0]).is_scalar())
          set(op.results[0], nat(op.operands[1]) ? *nat(op.operands[1]) : blocked(f_.type(op.results[0])));
        return;
      case OpKind::reduce: {
        const ir::Type& in = f_.type(op.operands[0]);
        Layout src = nat(op.operands[0]) ? *nat(op.operands[0]) : blocked(in);
        set(op.results[0], src.slice(static_cast<int>(op.int_attr("axis"))));
        return;
      }
      case OpKind::scan:
      case OpKind::reduce_with:
      case OpKind::xor_permute: {
        const Layout L = combine_layout(op, plan_, blocked(f_.type(op.operands[0])));
        for (ir::ValueId r : op.results) set(r, op.kind == OpKind::reduce_with ? L.slice(static_cast<int>(op.int_attr("axis"))) : L);
        return;
      }
      case OpKind::histogram:  // counts come out of shared memory: any layout costs the same
        set(op.results[0], blocked(f_.type(op.results[0])));
        return;
      case OpKind::gather:  // in the index's layout: each thread reads the elements its indices name
        set(op.results[0], nat(op.operands[1]) ? *nat(op.operands[1]) : blocked(f_.type(op.results[0])));
        return;
      case OpKind::dot: {
        const ir::Type& r = f_.type(op.results[0]);
        if (wgmma_dots_.count(&op)) {
          set(op.results[0], Layout::wgmma_acc(r.shape[0], r.shape[1], warps()));
          return;
        }
        DotPlan d = plan_dot(f_.type(op.operands[0]), f_.type(op.operands[1]), warps(), ir::input_precision(op));
        set(op.results[0], d.mma ? d.acc_layout(r.shape) : blocked(r));
        return;
      }
      case OpKind::for_: {
        const ir::Block& body = op.regions[0];
        size_t n = op.results.size();
        std::vector<std::optional<Layout>> carried(n);
        for (size_t i = 0; i < n; ++i) carried[i] = nat(op.operands[3 + i]);
        for (int iter = 0; iter < 4; ++iter) {
          for (size_t i = 0; i < n; ++i) set(body.args[i + 1], carried[i]);
          block(body);
          const ir::Op& y = body.ops.back();
          bool changed = false;
          for (size_t i = 0; i < n; ++i) {
            const auto& l = nat(y.operands[i]);
            if (l && l != carried[i]) {
              carried[i] = l;
              changed = true;
            }
          }
          if (!changed) break;
        }
        // A carried tile is a phi: it needs a concrete layout even if everything was flexible.
        for (size_t i = 0; i < n; ++i) {
          if (!carried[i] && !f_.type(op.results[i]).is_scalar()) carried[i] = blocked(f_.type(op.results[i]));
          set(body.args[i + 1], carried[i]);
          set(op.results[i], carried[i]);
        }
        block(body);
        return;
      }
      case OpKind::if_: {
        block(op.regions[0]);
        block(op.regions[1]);
        const ir::Op& ty = op.regions[0].ops.back();
        const ir::Op& ey = op.regions[1].ops.back();
        for (size_t i = 0; i < op.results.size(); ++i) {
          std::optional<Layout> l = nat(ty.operands[i]) ? nat(ty.operands[i]) : nat(ey.operands[i]);
          if (!l && !f_.type(op.results[i]).is_scalar()) l = blocked(f_.type(op.results[i]));
          set(op.results[i], l);
        }
        return;
      }
      case OpKind::warp_roles: {
        const std::vector<WarpRolePlan>& roles = plan_.roles.at(&op);
        for (size_t i = 0; i < roles.size(); ++i) {
          warps_ = roles[i].warps;
          block(op.regions[i]);
        }
        warps_ = plan_.num_warps;
        return;
      }
      case OpKind::pack_pairs: {
        // in the operand's layout with each pair in one thread's registers where it has them (an
        // MMA accumulator does: no data moves), else from the blocked layout
        const ir::Type& in = f_.type(op.operands[0]);
        std::optional<Layout> p = nat(op.operands[0]) ? nat(op.operands[0])->pack_pairs() : std::nullopt;
        if (!p) p = blocked(in).pack_pairs();
        if (!p) {  // a small tile spread one element per thread: lay the words out, pairs follow
          ir::Type words = in;
          words.dtype = ir::DType::u32;
          words.shape.back() /= 2;
          p = blocked(words);
        }
        if (!p) throw LoweringError(fmt::format("tilejit: kernel '{}': pack_pairs at {}: no layout holds the pairs of {}", f_.name,
                                                op.loc.str(), ir::to_string(in)));
        set(op.results[0], p);
        return;
      }
      case OpKind::unpack_pairs:
        set(op.results[0], (nat(op.operands[0]) ? *nat(op.operands[0]) : blocked(f_.type(op.operands[0]))).unpack_pairs());
        return;
      case OpKind::constant: case OpKind::arange: case OpKind::splat: case OpKind::broadcast:
      case OpKind::expand_dims: case OpKind::reshape: case OpKind::trans:
        return;  // flexible
      case OpKind::precompute: {
        // of a load_at_use window: flexible too, so that the lowering reads the window where the
        // precompute stands directly in the layout its use asks for (no exchange)
        const ir::Op* src = def_of(op.operands[0]);
        if (src && src->kind == OpKind::block_load && src->attrs.count("at_use")) return;
        break;
      }
      default:
        break;
    }
    if (ir::is_elementwise(op.kind)) set(op.results[0], elementwise_layout(op));
  }

  const ir::Function& f_;
  int warps_ = 4;  // the warps of the code being assigned (a warp role's, else the launch's)
  std::set<const ir::Op*> wgmma_dots_;  // dots that accumulate in the wgmma layout
  std::map<ir::ValueId, const ir::Op*> def_;  // each value's defining op
  std::map<ir::ValueId, int> uses_;            // how many operands name each value
  std::map<ir::ValueId, const ir::Op*> user_;  // an op naming each value (its only one where uses_ is 1)
  LayoutPlan plan_;
};

}  // namespace

Layout combine_layout(const ir::Op& op, const LayoutPlan& plan, const Layout& blocked) {
  const int axis = static_cast<int>(op.int_attr("axis"));
  for (ir::ValueId v : op.operands)
    if (const std::optional<Layout>& l = plan.natural[v]; l && l->axis_bits_separate(axis)) return *l;
  return blocked;
}

int vector_width(ir::DType d, int64_t last_dim) {
  int v = 16 / ir::byte_size(d);
  while (v > 1 && last_dim % v != 0) v /= 2;
  return std::max(1, v);
}

void check_tile_shapes(const ir::Function& f) {
  ir::walk(f.body, [&](const ir::Op& op) {
    for (const auto* vs : {&op.operands, &op.results})
      for (ir::ValueId v : *vs)
        for (int64_t d : f.type(v).shape)
          if (!is_power_of_two(d))
            throw LoweringError(fmt::format("tilejit: kernel '{}': {} at {}: tile dimensions must be powers of two for "
                                            "the GPU backend, got {}",
                                            f.name, ir::op_name(op.kind), op.loc.str(), ir::to_string(f.type(v))));
  });
}

// lang::ring_producer: first at the top level, beside no warp roles, with registers that fit.
static void resolve_ring_producer(const ir::Function& f, WarpRoles& plan) {
  const ir::Op* found = nullptr;
  bool roles = false;
  ir::walk(f.body, [&](const ir::Op& op) {
    roles = roles || op.kind == OpKind::warp_roles;
    if (op.kind != OpKind::ring_producer) return;
    const bool top = std::any_of(f.body.ops.begin(), f.body.ops.end(), [&](const ir::Op& o) { return &o == &op; });
    if (!top || found)
      throw LoweringError(fmt::format("tilejit: kernel '{}': ring_producer at {} {}: it stands once, at the kernel's top level", f.name,
                                      op.loc.str(), found ? "is the second one" : "stands inside a loop, branch or warp role"));
    found = &op;
  });
  if (!found) return;
  const std::string where = fmt::format("tilejit: kernel '{}': ring_producer at {}", f.name, found->loc.str());
  if (roles) throw LoweringError(where + ": the kernel has warp_roles too; a ring producer is a warp role of its own (use one or the other)");
  if (plan.num_warps % 4 != 0)
    throw LoweringError(fmt::format("{}: num_warps = {} (valid with a ring producer: a multiple of 4, whole warpgroups)", where, plan.num_warps));
  RingProducerPlan p{static_cast<int>(found->int_attr("producer_registers")), static_cast<int>(found->int_attr("consumer_registers")),
                     found->attrs.count("coordinates_at_use") > 0};
  // setmaxnreg only moves registers between the program's warps: the launch allocates each thread
  // 65536 / threads rounded down to 8, and an increase past what the decreases freed waits forever
  // (a hang, not an error)
  const int64_t threads = int64_t{32} * (plan.num_warps + RingProducerPlan::kWarps), budget = threads * (65536 / threads / 8 * 8);
  const int64_t total = int64_t{32} * plan.num_warps * p.consumer_registers + int64_t{32} * RingProducerPlan::kWarps * p.producer_registers;
  if (total > budget)
    throw LoweringError(fmt::format("{}: {} consumer warps x 32 x {} registers + {} producer warps x 32 x {} = {} registers; the "
                                    "launch gives its {} threads {} each ({} in all): lower consumer_registers (at most {} here)",
                                    where, plan.num_warps, p.consumer_registers, RingProducerPlan::kWarps, p.producer_registers, total,
                                    threads, budget / threads, budget,
                                    (budget - 32 * RingProducerPlan::kWarps * p.producer_registers) / (32 * plan.num_warps) / 8 * 8));
  plan.ring_producer = p;
}

// lang::warp_roles: the roles' warps in order, 0 meaning the rest, checked against the launch.
WarpRoles resolve_warp_roles(const ir::Function& f, int num_warps) {
  WarpRoles plan;
  plan.num_warps = num_warps;
  resolve_ring_producer(f, plan);
  ir::walk(f.body, [&](const ir::Op& op) {
    if (op.kind != OpKind::warp_roles) return;
    const auto& warps = op.ints_attr("warps");
    const auto& regs = op.ints_attr("max_registers");
    int64_t given = 0;
    for (int64_t w : warps) given += w;
    const int64_t rest = plan.num_warps - given;
    const bool has_rest = std::count(warps.begin(), warps.end(), int64_t{0}) > 0;
    if (rest < 0 || (rest > 0 && !has_rest) || (has_rest && (rest < 4 || rest % 4 != 0 || !is_power_of_two(rest))))
      throw LoweringError(fmt::format(
          "tilejit: kernel '{}': warp_roles at {} asks for warps {} but the launch has num_warps = {} (valid: the roles' warps add "
          "up to num_warps; a role with warps = 0 takes the rest, which must be 4, 8 or 16)",
          f.name, op.loc.str(), fmt::join(warps, " + "), plan.num_warps));
    std::vector<WarpRolePlan> roles;
    int first = 0;
    for (size_t i = 0; i < warps.size(); ++i) {
      const int w = static_cast<int>(warps[i] ? warps[i] : rest);
      roles.push_back({first, w, static_cast<int>(regs[i])});
      ir::walk(op.regions[i], [&](const ir::Op& inner) { plan.op_warps[&inner] = w; });
      first += w;
    }
    if (regs[0] > 0) {
      // what the launch gives every thread (setmaxnreg's cap at entry), and what the roles ask for
      const int cap = entry_register_cap(plan.num_warps);
      int64_t total = 0;
      for (const WarpRolePlan& r : roles) total += int64_t{32} * r.warps * r.max_registers;
      if (total > 65536)
        throw LoweringError(fmt::format("tilejit: kernel '{}': warp_roles at {} asks for {} registers in all (max_registers x threads "
                                        "per role) but a multiprocessor has 65536: lower some role's max_registers (each thread "
                                        "starts with {})", f.name, op.loc.str(), total, cap));
    }
    plan.roles[&op] = std::move(roles);
  });
  return plan;
}

void check_register_rebalancing(const std::string& kernel, const WarpRoles& roles, int min_programs_per_sm) {
  if (min_programs_per_sm <= 1) return;
  const char* what = roles.ring_producer ? "a ring producer" : nullptr;
  for (const auto& [op, rs] : roles.roles)
    if (!what && !rs.empty() && rs[0].max_registers > 0) what = "warp roles with max_registers";
  if (what)
    throw LoweringError(fmt::format("tilejit: kernel '{}': min_programs_per_sm = {} with {}: setmaxnreg moves registers between "
                                    "the warpgroups of one program, which takes the multiprocessor's 65536 (valid: "
                                    "min_programs_per_sm 0 or 1, or a kernel without {})",
                                    kernel, min_programs_per_sm, what, what));
}

LayoutPlan assign_layouts(const ir::Function& f, WarpRoles roles, TmaPlan tma, HopperPlan hopper) {
  return Assigner(f, std::move(roles), std::move(tma), std::move(hopper)).run();
}

LayoutPlan assign_layouts(const ir::Function& f, int num_warps, const std::string& arch, const PipelineOptions& pipeline) {
  check_tile_shapes(f);
  WarpRoles roles = resolve_warp_roles(f, num_warps);
  TmaPlan tma = match_tma_loops(f, roles.num_warps, roles.op_warps, arch, pipeline);
  HopperPlan hopper = plan_wgmma(f, roles.num_warps, roles.op_warps, arch, pipeline, tma);
  return assign_layouts(f, std::move(roles), std::move(tma), std::move(hopper));
}

std::string print_with_layouts(const ir::Function& f, const LayoutPlan& plan) {
  std::string out = ir::print(f);
  out += fmt::format("// layouts ({} warps), by value in definition order:\n", plan.num_warps);
  std::vector<std::string> lines;
  ir::walk(f.body, [&](const ir::Op& op) {
    for (ir::ValueId r : op.results)
      if (plan.natural[r]) lines.push_back(fmt::format("//   {} result: {}", ir::op_name(op.kind), plan.natural[r]->str()));
  });
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace tilejit::jit
