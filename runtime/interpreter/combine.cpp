// scan and reduce_with (and xor_permute, the element exchange along an axis): the combine region run on one pair of elements at a time, left to right
// along the axis (right to left for a reverse scan, the running value still on the left). The GPU combines in a tree (jit/lower/
// scans.cpp): the same result for an associative combine, up to rounding for float arithmetic.
#include <fmt/format.h>

#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {

// The combine region of `op` on (a, b): a_i and b_i are element (ai, bi) of the slots given.
void Machine::combine_pair(const Op& op, const std::vector<const Slot*>& a, const std::vector<size_t>& ai,
                           const std::vector<const Slot*>& b, const std::vector<size_t>& bi, std::vector<Slot>& out) {
  const ir::Block& body = op.regions[0];
  const size_t n = op.operands.size();
  for (size_t side = 0; side < 2; ++side)
    for (size_t k = 0; k < n; ++k) {
      const Slot& src = *(side == 0 ? a : b)[k];
      const size_t at = (side == 0 ? ai : bi)[k];
      Slot& arg = S(body.args[side * n + k]);
      if (is_float_slot(op.operands[k])) arg.f.assign(1, src.f[at]);
      else arg.i.assign(1, src.i[at]);
    }
  const Op* y = run_block(body);
  for (size_t k = 0; k < n; ++k) copy_slot(out[k], S(y->operands[k]));
}

void Machine::combine_op(const Op& op) {
  const ir::Type& t = T(op.operands[0]);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const bool scan = op.kind == OpKind::scan;
  const bool reverse = scan && op.int_attr("reverse") != 0;
  const size_t n = op.operands.size();
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= t.shape[d];
  for (size_t d = axis + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  const int64_t len = t.shape[axis];
  std::vector<Slot> results(n);  // built aside, swapped into the result slots at the end
  for (size_t k = 0; k < n; ++k) {
    const size_t count = static_cast<size_t>(scan ? outer * len * inner : outer * inner);
    if (is_float_slot(op.operands[k])) results[k].f.assign(count, 0.0);
    else results[k].i.assign(count, 0);
  }
  std::vector<const Slot*> xs, acc_slots;
  for (size_t k = 0; k < n; ++k) xs.push_back(&S(op.operands[k]));
  std::vector<Slot> acc(n), next(n);
  for (size_t k = 0; k < n; ++k) acc_slots.push_back(&acc[k]);
  const std::vector<size_t> zero(n, 0);
  const auto at = [&](int64_t o, int64_t j, int64_t in) { return static_cast<size_t>((o * len + j) * inner + in); };
  const auto store = [&](size_t to) {
    for (size_t k = 0; k < n; ++k) {
      if (is_float_slot(op.operands[k])) results[k].f[to] = acc[k].f[0];
      else results[k].i[to] = acc[k].i[0];
    }
  };
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      const int64_t first = reverse ? len - 1 : 0, step = reverse ? -1 : 1;
      for (size_t k = 0; k < n; ++k) {
        const size_t e = at(o, first, in);
        if (is_float_slot(op.operands[k])) acc[k].f.assign(1, xs[k]->f[e]);
        else acc[k].i.assign(1, xs[k]->i[e]);
      }
      if (scan) store(at(o, first, in));
      for (int64_t j = first + step; j >= 0 && j < len; j += step) {
        const std::vector<size_t> xi(n, at(o, j, in));
        // a precedes b in the scan's direction: the running value first (Triton's reverse scan)
        combine_pair(op, acc_slots, zero, xs, xi, next);
        std::swap(acc, next);
        for (size_t k = 0; k < n; ++k) acc_slots[k] = &acc[k];
        if (scan) store(at(o, j, in));
      }
      if (!scan) store(static_cast<size_t>(o * inner + in));
    }
  for (size_t k = 0; k < n; ++k) std::swap(S(op.results[k]), results[k]);
}

void Machine::xor_permute_op(const Op& op) {
  const ir::Type& t = T(op.operands[0]);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const int64_t mask = op.int_attr("mask");
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= t.shape[d];
  for (size_t d = axis + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  const int64_t len = t.shape[axis];
  const Slot& x = S(op.operands[0]);
  Slot y;
  y.f.resize(x.f.size());
  y.i.resize(x.i.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < len; ++j)
      for (int64_t in = 0; in < inner; ++in) {
        const auto to = static_cast<size_t>((o * len + j) * inner + in), from = static_cast<size_t>((o * len + (j ^ mask)) * inner + in);
        if (!x.f.empty()) y.f[to] = x.f[from];
        if (!x.i.empty()) y.i[to] = x.i[from];
      }
  std::swap(S(op.results[0]), y);
}

void Machine::gather_op(const Op& op) {
  const ir::Type& xt = T(op.operands[0]);
  const ir::Type& it = T(op.operands[1]);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const Slot& x = S(op.operands[0]);
  const Slot& index = S(op.operands[1]);
  const int64_t n = xt.shape[axis];
  int64_t inner = 1;
  for (size_t d = axis + 1; d < xt.shape.size(); ++d) inner *= xt.shape[d];
  const int64_t m = it.shape[axis];
  Slot y;
  const size_t count = N(op.operands[1]);
  if (!x.f.empty()) y.f.resize(count);
  else y.i.resize(count);
  for (size_t e = 0; e < count; ++e) {
    const auto p = static_cast<int64_t>(e);
    const int64_t in = p % inner, o = p / inner / m;  // e = (o * m + j) * inner + in
    const int64_t j = index.i[e];
    if (j < 0 || j >= n)
      fault(op, fmt::format("gather: index {} is outside the axis of {} elements (valid: 0..{})", j, n, n - 1), p, &it.shape);
    const auto from = static_cast<size_t>((o * n + j) * inner + in);
    if (!x.f.empty()) y.f[e] = x.f[from];
    else y.i[e] = x.i[from];
  }
  std::swap(S(op.results[0]), y);
}

}  // namespace tilejit::runtime::interp
