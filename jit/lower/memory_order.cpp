// Ordering global memory between the threads of a program (lowerer.hpp, "global memory between
// threads"): the barrier a tile load or store needs when another thread may have touched the same
// element since the last barrier of all threads.
#include <algorithm>

#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {

bool Lowerer::conflicts(const GlobalAccess& a, const GlobalAccess& b, bool same_iteration) {
  // a read against a write: two reads never race, and an element written twice by different
  // threads with no barrier between is undefined on both sides (README) -- but a TMA write lands
  // whenever its bulk group completes, so a later write of the element must wait for it (also
  // where the store asked for TMA and its lowering wrote element by element: the order a program
  // sees must not depend on which path the lowering took -- found by the fuzzer)
  const bool after_tma_write = a.write && b.write && (a.async || b.async) && !(a.add && b.add);
  if (!(a.read && b.write) && !(a.write && b.read) && !after_tma_write) return false;
  if (!a.params.empty() && !b.params.empty() &&
      std::none_of(a.params.begin(), a.params.end(), [&](size_t p) { return b.params.count(p) > 0; }))
    return false;
  // the same addresses in one unreplicated layout: each element touched by the same one thread
  // both times, whose program order suffices (not when TMA wrote it: no thread did)
  if (same_iteration && !a.async && !b.async && !a.address.empty() && a.address == b.address && a.layout && b.layout && *a.layout == *b.layout &&
      !a.layout->has_replication())
    return false;
  return true;
}

std::vector<int64_t> Lowerer::window_key(const ir::Op& op, size_t first_offset) const {
  const size_t rank = tensors_.at(op.operands[0]).sizes.size();
  std::vector<int64_t> key{static_cast<int64_t>(op.operands[0])};
  for (size_t d = 0; d < rank; ++d) key.push_back(static_cast<int64_t>(op.operands[first_offset + d]));
  key.push_back(-1);
  for (int64_t d : op.ints_attr("dims")) key.push_back(d);
  key.push_back(-2);
  const ir::Type& t = f_.type(op.kind == ir::OpKind::block_load ? op.results[0] : op.operands[1]);
  for (int64_t n : t.shape) key.push_back(n);
  return key;
}

void Lowerer::order_global(ir::ValueId address, Access access, std::optional<Layout> layout, std::vector<int64_t> address_key,
                           bool add, bool async) {
  GlobalAccess now;
  now.add = add;
  now.async = async;
  now.read = access != Access::write;
  now.write = access != Access::read;
  now.address = std::move(address_key);
  if (auto it = sources_.find(address); it != sources_.end()) now.params = it->second;
  // registers that repeat an element inside one thread do not make another thread touch it (TMA's
  // writes: thread 0's bulk operation, whatever the value's layout)
  if (layout && !async) now.layout = layout->without_zero_regs();
  const bool hazard = std::any_of(unordered_.begin(), unordered_.end(), [&](const GlobalAccess& a) { return conflicts(a, now); });
  const bool async_hazard = std::any_of(unordered_.begin(), unordered_.end(),
                                        [&](const GlobalAccess& a) { return (a.async || now.async) && conflicts(a, now); });
  if (async_hazard && !in_turn_) complete_async_writes();
  else if (hazard && !in_turn_) emit0(Op::barrier, {});  // (records nothing: clears unordered_)
  add_unordered({now});
  for (LoopHead& h : loop_heads_)
    if (!h.barrier_seen) h.accesses.push_back(now);
}

void Lowerer::add_unordered(const std::vector<GlobalAccess>& accesses) {
  for (const GlobalAccess& a : accesses)
    if (std::find(unordered_.begin(), unordered_.end(), a) == unordered_.end()) unordered_.push_back(a);
}

void Lowerer::global_barrier_emitted() {
  // a barrier orders the threads' own accesses, not TMA's writes still in flight
  std::erase_if(unordered_, [](const GlobalAccess& a) { return !a.async; });
  // only the innermost body surely passes it every iteration (an inner loop may run no trip)
  if (!loop_heads_.empty()) loop_heads_.back().barrier_seen = true;
}

void Lowerer::order_loop_back_edge(LoopHead head) {
  bool hazard = false, async_hazard = false;
  for (const GlobalAccess& tail : unordered_)
    for (const GlobalAccess& top : head.accesses)
      if (conflicts(tail, top, /*same_iteration=*/false)) hazard = true, async_hazard = async_hazard || tail.async;
  if (async_hazard && !in_turn_) complete_async_writes();
  else if (hazard && !in_turn_) emit0(Op::barrier, {});
}

void Lowerer::complete_async_writes() {
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
    emit0(Op::bulk_wait, {}, 0);  // the bulk groups' global writes done (not only their reads)
    emit0(Op::fence_proxy_async_global, {});
  });
  emit0(Op::barrier, {});
  // the other threads' writes, ordered by the barrier, before thread 0's next TMA write
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] { emit0(Op::fence_proxy_async_global, {}); });
  unordered_.clear();
}

}  // namespace tilejit::jit::lower
