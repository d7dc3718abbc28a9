// See schedule_dots.hpp.
#include "jit/schedule_dots.hpp"

#include <algorithm>
#include <unordered_map>

namespace tilejit::jit {
namespace {

using ir::OpKind;

// Uses of each value anywhere in the function (nested regions included).
void count_uses(const ir::Block& b, std::unordered_map<ir::ValueId, int>& uses) {
  for (const ir::Op& op : b.ops) {
    for (ir::ValueId v : op.operands) ++uses[v];
    for (const ir::Block& r : op.regions) count_uses(r, uses);
  }
}

int hoist_in(ir::Block& b, const std::unordered_map<ir::ValueId, int>& uses) {
  int moved = 0;
  for (ir::Op& op : b.ops)
    for (ir::Block& r : op.regions) moved += hoist_in(r, uses);
  std::vector<ir::Op> out;
  out.reserve(b.ops.size());
  std::unordered_map<ir::ValueId, size_t> def_at;  // value -> index in `out`
  auto place = [&](ir::Op op, size_t at) {
    for (auto& [v, i] : def_at)
      if (i >= at) ++i;
    for (ir::ValueId r : op.results) def_at[r] = at;
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), std::move(op));
  };
  // The earliest index after every in-block definition of `op`'s operands.
  auto earliest = [&](const ir::Op& op) {
    size_t at = 0;
    for (ir::ValueId v : op.operands)
      if (auto it = def_at.find(v); it != def_at.end()) at = std::max(at, it->second + 1);
    return at;
  };
  for (ir::Op& op : b.ops) {
    if (op.kind != OpKind::dot) {
      place(std::move(op), out.size());
      continue;
    }
    // A trans used only by this dot travels with it, and so does a constant (a zero accumulator):
    // it has no operands, so it may sit anywhere before its uses.
    std::vector<size_t> carried;
    for (ir::ValueId v : op.operands) {
      auto it = def_at.find(v);
      if (it == def_at.end()) continue;
      const ir::Op& d = out[it->second];
      if ((d.kind == OpKind::trans && uses.at(v) == 1) || d.kind == OpKind::constant) carried.push_back(it->second);
    }
    std::sort(carried.rbegin(), carried.rend());
    // (a dot may read one constant twice, e.g. two equal tiles merged by CSE: move it once)
    carried.erase(std::unique(carried.begin(), carried.end()), carried.end());
    std::vector<ir::Op> travellers;
    for (size_t i : carried) {
      travellers.insert(travellers.begin(), std::move(out[i]));
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
      for (auto it = def_at.begin(); it != def_at.end();) {
        if (it->second == i) it = def_at.erase(it);
        else {
          if (it->second > i) --it->second;
          ++it;
        }
      }
    }
    size_t at = 0;
    for (ir::Op& t : travellers) {
      const size_t t_at = earliest(t);
      place(std::move(t), t_at);
      at = std::max(at, t_at + 1);
    }
    // A warpgroup turn is a fence: its dots are issued inside it, in turn (lang::warpgroup_turn),
    // and in their written order (which decides what a wait_group leaves in flight).
    size_t after_fence = 0;
    for (size_t i = out.size(); i-- > 0;)
      if (out[i].kind == OpKind::turn_begin || out[i].kind == OpKind::turn_end) {
        after_fence = i + 1;
        break;
      }
    if (after_fence > 0)
      for (size_t i = after_fence; i < out.size(); ++i)
        if (out[i].kind == OpKind::dot) after_fence = i + 1;
    size_t dot_at = std::max({at, earliest(op), after_fence});
    if (dot_at + travellers.size() < out.size()) ++moved;
    place(std::move(op), dot_at);
  }
  b.ops = std::move(out);
  return moved;
}

}  // namespace

int hoist_dots(ir::Function& f) {
  std::unordered_map<ir::ValueId, int> uses;
  count_uses(f.body, uses);
  return hoist_in(f.body, uses);
}

}  // namespace tilejit::jit
