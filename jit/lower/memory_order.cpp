// Ordering global memory between the threads of a program (lowerer.hpp, "global memory between
// threads"): the barrier a tile load or store needs when another thread may have touched the same
// element since the last barrier of all threads.
#include <algorithm>

#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {

bool Lowerer::conflicts(const GlobalAccess& a, const GlobalAccess& b) {
  if (!a.write && !b.write) return false;
  if (a.atomic && b.atomic) return false;
  if (!a.params.empty() && !b.params.empty() &&
      std::none_of(a.params.begin(), a.params.end(), [&](size_t p) { return b.params.count(p) > 0; }))
    return false;
  // each element touched by the same one thread both times: that thread's program order suffices
  if (a.layout && b.layout && *a.layout == *b.layout && !a.layout->has_replication()) return false;
  return true;
}

void Lowerer::order_global(ir::ValueId address, bool write, std::optional<Layout> layout, bool atomic) {
  GlobalAccess now;
  now.atomic = atomic;
  if (auto it = sources_.find(address); it != sources_.end()) now.params = it->second;
  now.write = write;
  // registers that repeat an element inside one thread do not make another thread touch it
  if (layout) now.layout = layout->without_zero_regs();
  const bool hazard = std::any_of(unordered_.begin(), unordered_.end(), [&](const GlobalAccess& a) { return conflicts(a, now); });
  if (hazard && !in_turn_) emit0(Op::barrier, {});  // (records nothing: clears unordered_)
  add_unordered({now});
  for (LoopHead& h : loop_heads_)
    if (!h.barrier_seen) h.accesses.push_back(now);
}

void Lowerer::add_unordered(const std::vector<GlobalAccess>& accesses) {
  for (const GlobalAccess& a : accesses)
    if (std::find(unordered_.begin(), unordered_.end(), a) == unordered_.end()) unordered_.push_back(a);
}

void Lowerer::global_barrier_emitted() {
  unordered_.clear();
  // only the innermost body surely passes it every iteration (an inner loop may run no trip)
  if (!loop_heads_.empty()) loop_heads_.back().barrier_seen = true;
}

void Lowerer::order_loop_back_edge(LoopHead head) {
  const bool hazard = std::any_of(unordered_.begin(), unordered_.end(), [&](const GlobalAccess& tail) {
    return std::any_of(head.accesses.begin(), head.accesses.end(), [&](const GlobalAccess& top) { return conflicts(tail, top); });
  });
  if (hazard && !in_turn_) emit0(Op::barrier, {});
}

}  // namespace tilejit::jit::lower
