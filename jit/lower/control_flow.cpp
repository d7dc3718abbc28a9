// for and if: carried values flattened to registers, each body lowered in its own frame (its
// scoped caches) as a pir region; K loops the plan pipelines go to lower/tma_pipeline.cpp.
#include "jit/lower/lowerer.hpp"

#include <algorithm>

namespace tilejit::jit::lower {

Regs Lowerer::carried(ir::ValueId v, const std::optional<Layout>& L) { return L ? get(v, *L) : Regs{scalar(v)}; }

Regs Lowerer::fresh(ir::ValueId v, const std::optional<Layout>& L) {
  size_t n = L ? static_cast<size_t>(L->num_regs()) : 1;
  Regs r;
  for (size_t i = 0; i < n; ++i) r.push_back(out_.new_value(value_ty(f_.type(v))));
  return r;
}

void Lowerer::bind(ir::ValueId v, const std::optional<Layout>& L, const Regs& regs) {
  if (L) put(v, *L, regs);
  else frames_.back().scalars[v] = regs.at(0);
}

void Lowerer::for_loop(const ir::Op& op) {
  ++memory_epoch_;  // load_at_use windows read before this may have changed
  if (auto it = plan_.tma_loops.find(&op); it != plan_.tma_loops.end()) return tma_loop(op, it->second);
  const ir::Block& body = op.regions[0];
  pir::Inst loop;
  loop.op = Op::for_;
  loop.args = {scalar(op.operands[0]), scalar(op.operands[1]), scalar(op.operands[2])};
  std::vector<std::optional<Layout>> lay;
  for (size_t i = 0; i < op.results.size(); ++i) {
    lay.push_back(plan_.natural[op.results[i]]);
    for (V x : carried(op.operands[3 + i], lay.back())) loop.args.push_back(x);
  }
  const SmemRing* ring = nullptr;
  if (auto it = plan_.hopper.rings.find(&op); it != plan_.hopper.rings.end()) ring = &it->second;
  if (ring) ring_prologue(op, *ring);
  // producer rings inside: their iteration counts travel with the loop (after its own values)
  const std::vector<const ir::Op*> counted = plan_.hopper.ring_producer ? nested_producer_rings(op) : std::vector<const ir::Op*>{};
  for (const ir::Op* r : counted) loop.args.push_back(ring_counts_.count(r) ? ring_counts_.at(r) : ci32(0));
  pir::Block pb;
  V iv = out_.new_value(pir::scalar(f_.type(body.args[0]).dtype));
  pb.args.push_back(iv);
  std::vector<Regs> arg_regs;
  for (size_t i = 0; i < op.results.size(); ++i) {
    arg_regs.push_back(fresh(body.args[i + 1], lay[i]));
    for (V x : arg_regs.back()) pb.args.push_back(x);
  }
  for (const ir::Op* r : counted) pb.args.push_back(ring_counts_[r] = out_.new_value(pir::scalar(DType::i32)));
  push_block(&pb);
  frames_.emplace_back();
  frames_.back().loop_body = true;
  frames_.back().body = &body;
  frames_.back().scalars[body.args[0]] = iv;
  for (size_t i = 0; i < op.results.size(); ++i) bind(body.args[i + 1], lay[i], arg_regs[i]);
  // global accesses before the loop stay unordered after it (it may run no trip)
  const std::vector<GlobalAccess> before = unordered_;
  loop_heads_.emplace_back();
  if (ring) {
    ring_top(op, *ring, iv);
    active_rings_.push_back(&op);
  }
  block(body);
  if (ring) {
    active_rings_.pop_back();
    ring_bottom(*ring);
  }
  LoopHead head = std::move(loop_heads_.back());
  loop_heads_.pop_back();
  order_loop_back_edge(std::move(head));
  if (!frames_.back().keep_alive.empty()) emit0(Op::keep_alive, frames_.back().keep_alive);
  pir::Inst y;
  y.op = Op::yield;
  const ir::Op& iy = body.ops.back();
  for (size_t i = 0; i < op.results.size(); ++i) {
    Regs r = carried(iy.operands[i], lay[i]);
    // A carried MMA result still in flight at the loop's end and double-buffered (the body
    // reads the carried value after issuing the MMA that makes the next one: PIPELINE_QK's S)
    // was just waited for. Its copy into the carried register must come after that wait: as
    // copies of their own (pir::kOpaqueCopy), not as the wait's tied operands, which LLVM copies
    // before the wait, where ptxas sees a read of an in-flight accumulator (C7514).
    if (std::any_of(r.begin(), r.end(), [&](V x) { return wait_outputs_.count(x) > 0; }) &&
        read_after_def(body, body.args[i + 1], iy.operands[i]))
      r = emit_multi(Op::opaque, r, r.size(), pir::scalar(f_.type(iy.operands[i]).dtype), pir::kOpaqueCopy);
    for (V x : r) y.args.push_back(x);
  }
  for (const ir::Op* r : counted) y.args.push_back(ring_counts_.at(r));
  pb.insts.push_back(std::move(y));
  frames_.pop_back();
  pop_block();
  std::vector<Regs> res;
  for (size_t i = 0; i < op.results.size(); ++i) {
    res.push_back(fresh(op.results[i], lay[i]));
    for (V x : res.back()) loop.results.push_back(x);
  }
  for (const ir::Op* r : counted) loop.results.push_back(ring_counts_[r] = out_.new_value(pir::scalar(DType::i32)));
  loop.regions.push_back(std::move(pb));
  blocks_.back()->insts.push_back(std::move(loop));
  add_unordered(before);
  if (ring && ring->rerun && ring->last_in_chain()) reset_ring(*ring);
  if (ring && ring->producer) ring_counts_[ring->head()] = bin(Op::add, rings_.at(&op).base, rings_.at(&op).trips);
  // the enclosing ring's tiles this loop read last (e.g. a persistent tile's Q after its key loop)
  if (!active_rings_.empty() && plan_.hopper.rings.at(active_rings_.back()).producer &&
      rings_.at(active_rings_.back()).body == blocks_.back())
    release_retired(plan_.hopper.rings.at(active_rings_.back()).loads);
  for (size_t i = 0; i < op.results.size(); ++i) bind(op.results[i], lay[i], res[i]);
}

bool Lowerer::read_after_def(const ir::Block& body, ir::ValueId x, ir::ValueId v) {
  bool after = false, reads = false;
  for (const ir::Op& op : body.ops) {
    if (after) {
      const auto check = [&](const ir::Op& inner) {
        reads |= std::find(inner.operands.begin(), inner.operands.end(), x) != inner.operands.end();
      };
      check(op);
      for (const ir::Block& region : op.regions) ir::walk(region, check);
    }
    after |= std::find(op.results.begin(), op.results.end(), v) != op.results.end();
  }
  return reads;
}

void Lowerer::if_op(const ir::Op& op) {
  ++memory_epoch_;  // load_at_use windows read before this may have changed
  pir::Inst in;
  in.op = Op::if_;
  in.args = {scalar(op.operands[0])};
  std::vector<std::optional<Layout>> lay;
  for (ir::ValueId r : op.results) lay.push_back(plan_.natural[r]);
  // each side starts from the accesses before the if; after it, any side's may be unordered (a
  // barrier on one side orders nothing on the other, nor for the enclosing loop's next iteration)
  const std::vector<GlobalAccess> before = unordered_;
  const bool head_barrier = !loop_heads_.empty() && loop_heads_.back().barrier_seen;
  std::vector<GlobalAccess> after;
  for (int side = 0; side < 2; ++side) {
    const ir::Block& region = op.regions[static_cast<size_t>(side)];
    pir::Block pb;
    push_block(&pb);
    frames_.emplace_back();
    unordered_ = before;
    block(region);
    after.insert(after.end(), unordered_.begin(), unordered_.end());  // (each side's includes `before`)
    if (!loop_heads_.empty()) loop_heads_.back().barrier_seen = head_barrier;
    pir::Inst y;
    y.op = Op::yield;
    for (size_t i = 0; i < op.results.size(); ++i)
      for (V x : carried(region.ops.back().operands[i], lay[i])) y.args.push_back(x);
    pb.insts.push_back(std::move(y));
    frames_.pop_back();
    pop_block();
    in.regions.push_back(std::move(pb));
  }
  unordered_.clear();
  add_unordered(after);
  std::vector<Regs> res;
  for (size_t i = 0; i < op.results.size(); ++i) {
    res.push_back(fresh(op.results[i], lay[i]));
    for (V x : res.back()) in.results.push_back(x);
  }
  blocks_.back()->insts.push_back(std::move(in));
  for (size_t i = 0; i < op.results.size(); ++i) bind(op.results[i], lay[i], res[i]);
}

}  // namespace tilejit::jit::lower
