// scan and reduce_with: a user combine along an axis, in a layout whose axis-coordinate bits are
// each one register, lane or warp bit (Layout::axis_bits_separate). The lowest axis bits that are
// register bits make runs of consecutive elements in a thread, scanned in order (one combine per
// element). The other bits are combined from the least significant up, as in a hypercube scan, on
// one value per run: after each bit a run knows the total of its aligned block and its exclusive
// prefix inside it (the blocks before it, in scan order); merging two blocks, both totals become
// their combine and the second's runs gain the first's total on the left of their prefix. Register
// bits pair runs of a thread, lane bits shuffle, warp bits go through shared memory. Last, each
// element combines its run's exclusive prefix with its prefix inside the run. Any associative
// combine works (order is kept, commutativity is not assumed). xor_permute moves elements across
// the same bits.
#include <algorithm>
#include <map>
#include <optional>

#include "jit/assign_layouts.hpp"
#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {

DType exchange_dtype(DType d) {
  if (d != DType::i1 && ir::bit_width(d) >= 32) return d;
  if (ir::is_float(d)) return DType::f32;
  return d == DType::i1 || ir::is_signed(d) ? DType::i32 : DType::u32;
}

namespace {

// One bit of the axis coordinate: which register, lane or warp bit carries it, and its weight.
struct AxisBit {
  enum class Where { reg, lane, warp } where;
  int index;
  int64_t weight;
};

std::vector<AxisBit> axis_bits(const Layout& L, size_t axis) {
  std::vector<AxisBit> bits;
  const auto add = [&](const std::vector<Coord>& bases, AxisBit::Where w) {
    for (size_t i = 0; i < bases.size(); ++i)
      if (bases[i][axis] != 0) bits.push_back({w, static_cast<int>(i), bases[i][axis]});
  };
  add(L.reg, AxisBit::Where::reg);
  add(L.lane, AxisBit::Where::lane);
  add(L.warp, AxisBit::Where::warp);
  std::sort(bits.begin(), bits.end(), [](const AxisBit& a, const AxisBit& b) { return a.weight < b.weight; });
  return bits;
}

}  // namespace

V Lowerer::shuffle_xor(V x, DType d, int64_t lane_mask) {
  const DType w = exchange_dtype(d);
  return cast(emit(Op::shfl_xor, pir::scalar(w), {cast(x, w)}, lane_mask), d);
}

std::vector<V> Lowerer::combine_region(const ir::Op& op, const std::vector<V>& a, const std::vector<V>& b) {
  const ir::Block& body = op.regions[0];
  const size_t n = a.size();
  frames_.emplace_back();
  for (size_t k = 0; k < n; ++k) {
    frames_.back().scalars[body.args[k]] = a[k];
    frames_.back().scalars[body.args[n + k]] = b[k];
  }
  std::vector<V> out;
  for (const ir::Op& inner : body.ops) {
    if (inner.kind == OpKind::yield) {
      for (ir::ValueId v : inner.operands) out.push_back(scalar(v));
      break;
    }
    lower(inner);  // constants and scalar elementwise ops (the verifier allows nothing else)
  }
  frames_.pop_back();
  return out;
}

std::vector<Regs> Lowerer::partner_values(bool across_warps, int bit, const std::vector<Regs>& values, const std::vector<DType>& dt) {
  std::vector<Regs> other(values.size(), Regs(values.empty() ? 0 : values[0].size()));
  if (!across_warps) {
    // one shuffle per distinct value: after the register bits below this one, the registers of a
    // block hold the same total (the same V), and a shuffle is not deduplicated downstream
    for (size_t k = 0; k < values.size(); ++k) {
      std::map<V, V> shuffled;
      for (size_t r = 0; r < values[k].size(); ++r) {
        auto [it, fresh] = shuffled.try_emplace(values[k][r], 0);
        if (fresh) it->second = shuffle_xor(values[k][r], dt[k], int64_t{1} << bit);
        other[k][r] = it->second;
      }
    }
    return other;
  }
  constexpr int64_t kSlot = 8;  // bytes per exchanged value (32- and 64-bit ones alike)
  const auto n = static_cast<int64_t>(values.size()), regs = static_cast<int64_t>(values[0].size());
  reserve_smem(int64_t{warps_} * 32 * n * regs * kSlot);
  const auto offset = [&](V thread, size_t r, size_t k) {
    return bin(Op::mul, bin(Op::add, bin(Op::mul, thread, ci32(n * regs)), ci32(static_cast<int64_t>(r) * n + static_cast<int64_t>(k))),
               ci32(kSlot));
  };
  for (size_t k = 0; k < values.size(); ++k)
    for (size_t r = 0; r < values[k].size(); ++r) emit0(Op::store_shared, {offset(tid_, r, k), cast(values[k][r], exchange_dtype(dt[k]))});
  emit0(Op::barrier, {});
  const V partner = bin(Op::bit_xor, tid_, ci32(int64_t{32} << bit));
  for (size_t k = 0; k < values.size(); ++k)
    for (size_t r = 0; r < values[k].size(); ++r)
      other[k][r] = cast(emit(Op::load_shared, pir::scalar(exchange_dtype(dt[k])), {offset(partner, r, k)}), dt[k]);
  emit0(Op::barrier, {});
  return other;
}

void Lowerer::xor_permute(const ir::Op& op) {
  const ir::Type& t = f_.type(op.operands[0]);
  check_shape(&op, t);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const int64_t mask = op.int_attr("mask");
  const Layout L = combine_layout(op, plan_, memory_layout(t));
  if (!L.axis_bits_separate(static_cast<int>(axis))) fail(&op, "internal: the exchange layout mixes axis bits: " + L.str());
  std::vector<Regs> v{get(op.operands[0], L)};
  for (const AxisBit& bit : axis_bits(L, axis)) {
    if ((mask & bit.weight) == 0) continue;
    if (bit.where == AxisBit::Where::reg) {
      const uint32_t m = 1u << bit.index;
      for (uint32_t r = 0; r < v[0].size(); ++r)
        if ((r & m) == 0) std::swap(v[0][r], v[0][r | m]);
    } else {
      v = partner_values(bit.where == AxisBit::Where::warp, bit.index, v, {t.dtype});
    }
  }
  put(op.results[0], L, v[0]);
}

namespace {

// Whether a run has an exclusive prefix yet (the combine of everything before it in its block, in
// scan order): known at compile time while only register bits merged it, a per-thread i1 once a
// lane or warp bit decided it.
struct HasPrefix {
  enum class Known { no, yes, runtime } known = Known::no;
  V value = 0;  // when runtime
};

// Whether each result of the combine is one commutative operation of its own pair: a_k + b_k or
// a_k * b_k, for integers also max, min, and, or, xor (float max / min are left out: +0 and -0
// compare equal, so their order decides the sign). Such a reduce_with may combine in any order, as
// a reduction does (floats up to rounding, as the tree does anyway).
bool commutes(const ir::Function& f, const ir::Op& op) {
  const ir::Block& body = op.regions[0];
  const size_t n = op.operands.size();
  if (body.ops.size() != n + 1 || body.ops.back().kind != OpKind::yield || body.ops.back().operands.size() != n) return false;
  for (size_t k = 0; k < n; ++k) {
    const ir::ValueId want = body.ops.back().operands[k];
    const ir::Op* def = nullptr;
    for (const ir::Op& o : body.ops)
      if (o.results.size() == 1 && o.results[0] == want) def = &o;
    if (!def || def->operands.size() != 2) return false;
    const bool pair = (def->operands[0] == body.args[k] && def->operands[1] == body.args[n + k]) ||
                      (def->operands[1] == body.args[k] && def->operands[0] == body.args[n + k]);
    const bool is_float = ir::is_float(f.type(op.operands[k]).dtype);
    const OpKind c = def->kind;
    const bool commutative = c == OpKind::add || c == OpKind::mul ||
                             (!is_float && (c == OpKind::maximum || c == OpKind::minimum || c == OpKind::bit_and ||
                                            c == OpKind::bit_or || c == OpKind::bit_xor));
    if (!pair || !commutative) return false;
  }
  return true;
}

}  // namespace

void Lowerer::reduce_commuting(const ir::Op& op, const Layout& L, const std::vector<Regs>& x, const std::vector<DType>& dt) {
  // any order: as a reduction does, every tile at once (one shared-memory round for all, not one
  // per warp bit, and no per-register totals kept apart for the order's sake)
  const std::vector<Regs> part = reduce_along(x, L, static_cast<int>(op.int_attr("axis")), dt,
                                              [&](const std::vector<V>& a, const std::vector<V>& b) { return combine_region(op, a, b); });
  for (size_t k = 0; k < part.size(); ++k) {
    if (f_.type(op.results[k]).is_scalar()) frames_.back().scalars[op.results[k]] = part[k][0];
    else put(op.results[k], *plan_.natural[op.results[k]], part[k]);
  }
}

void Lowerer::combine_along(const ir::Op& op) {
  const size_t n = op.operands.size();
  const ir::Type& in_t = f_.type(op.operands[0]);
  check_shape(&op, in_t);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const bool scan = op.kind == OpKind::scan;
  const bool reverse = scan && op.int_attr("reverse") != 0;
  const Layout L = combine_layout(op, plan_, memory_layout(in_t));
  if (!L.axis_bits_separate(static_cast<int>(axis))) fail(&op, "internal: the combine layout mixes axis bits: " + L.str());
  const auto R = static_cast<uint32_t>(L.num_regs());
  std::vector<DType> dt;
  std::vector<Regs> x;  // [operand][register]
  for (ir::ValueId v : op.operands) {
    dt.push_back(f_.type(v).dtype);
    x.push_back(get(v, L));
  }
  const auto at = [&](const std::vector<Regs>& t, uint32_t r) {
    std::vector<V> out;
    for (size_t k = 0; k < n; ++k) out.push_back(t[k][r]);
    return out;
  };
  const auto set = [&](std::vector<Regs>& t, uint32_t r, const std::vector<V>& v) {
    for (size_t k = 0; k < n; ++k) t[k][r] = v[k];
  };
  if (!scan && commutes(f_, op)) return reduce_commuting(op, L, x, dt);
  const auto pick = [&](V cond, V a, V b) { return emit(Op::select, out_.types[a], {cond, a, b}); };
  const auto pick_all = [&](V cond, const std::vector<V>& a, const std::vector<V>& b) {
    std::vector<V> out;
    for (size_t k = 0; k < n; ++k) out.push_back(pick(cond, a[k], b[k]));
    return out;
  };

  // 1. Runs: the axis bits of lowest weight that are register bits make each thread hold runs of
  // consecutive elements; each run is scanned in order, one combine per element (a hypercube over
  // those bits costs log2(run) times more, and every later bit would again touch each register).
  const std::vector<AxisBit> bits = axis_bits(L, axis);
  size_t run_bits = 0;
  uint32_t run_mask = 0;
  while (run_bits < bits.size() && bits[run_bits].where == AxisBit::Where::reg) run_mask |= 1u << bits[run_bits++].index;
  std::vector<uint32_t> bases;  // a run's first register (its run bits clear)
  std::map<uint32_t, size_t> run_of;
  for (uint32_t r = 0; r < R; ++r)
    if ((r & run_mask) == 0) run_of.emplace(r, bases.size()), bases.push_back(r);
  const auto members = [&](uint32_t base) {  // a run's registers in scan order
    std::vector<uint32_t> m;
    for (uint32_t j = 0; j < (1u << run_bits); ++j) {
      uint32_t r = base;
      for (size_t b = 0; b < run_bits; ++b)
        if ((j >> b) & 1u) r |= 1u << bits[b].index;
      m.push_back(r);
    }
    if (reverse) std::reverse(m.begin(), m.end());
    return m;
  };
  const auto runs = bases.size();
  std::vector<Regs> prefix(n, Regs(R)), total(n, Regs(runs)), before(n, Regs(runs));  // before: the exclusive prefix
  std::vector<HasPrefix> has(runs);
  for (size_t q = 0; q < runs; ++q) {
    const std::vector<uint32_t> m = members(bases[q]);
    std::vector<V> acc = at(x, m[0]);
    if (scan) set(prefix, m[0], acc);
    for (size_t j = 1; j < m.size(); ++j) {
      acc = combine_region(op, acc, at(x, m[j]));
      if (scan) set(prefix, m[j], acc);
    }
    set(total, static_cast<uint32_t>(q), acc);
  }

  // 2. The other bits, from the least significant up, on one value per run: merging a block that
  // comes first in scan order (total `first`) with one that comes second gives both the combined
  // total, and the second's runs gain `first` on the left of their exclusive prefix.
  const auto prepend = [&](size_t q, const std::vector<V>& first, std::optional<V> when) {
    const auto r = static_cast<uint32_t>(q);
    HasPrefix& h = has[q];
    std::vector<V> extended;
    switch (h.known) {
      case HasPrefix::Known::no: extended = first; break;
      case HasPrefix::Known::yes: extended = combine_region(op, first, at(before, r)); break;
      case HasPrefix::Known::runtime: extended = pick_all(h.value, combine_region(op, first, at(before, r)), first); break;
    }
    if (!when) {
      set(before, r, extended);
      h = {HasPrefix::Known::yes, 0};
      return;
    }
    // (no prefix yet: `extended` is only read where `when` made one)
    set(before, r, h.known == HasPrefix::Known::no ? extended : pick_all(*when, extended, at(before, r)));
    if (h.known == HasPrefix::Known::no) h = {HasPrefix::Known::runtime, *when};
    else if (h.known == HasPrefix::Known::runtime) h.value = pick(*when, cint(DType::i1, 1), h.value);
  };
  for (size_t bi = run_bits; bi < bits.size(); ++bi) {
    const AxisBit& bit = bits[bi];
    if (bit.where == AxisBit::Where::reg) {
      const uint32_t m = 1u << bit.index;
      for (size_t q = 0; q < runs; ++q) {
        if (bases[q] & m) continue;
        const size_t q2 = run_of.at(bases[q] | m), first = reverse ? q2 : q, second = reverse ? q : q2;
        const std::vector<V> t = combine_region(op, at(total, static_cast<uint32_t>(first)), at(total, static_cast<uint32_t>(second)));
        if (scan) prepend(second, at(total, static_cast<uint32_t>(first)), std::nullopt);
        set(total, static_cast<uint32_t>(first), t);
        set(total, static_cast<uint32_t>(second), t);
      }
      continue;
    }
    // the partner block's totals: another lane's (shuffle) or another warp's (shared memory)
    const std::vector<Regs> other = partner_values(bit.where == AxisBit::Where::warp, bit.index, total, dt);
    // i1: this thread's block comes second in the scan's direction
    const V mine_second = cmp(reverse ? pir::Pred::eq : pir::Pred::ne,
                              land(bit.where == AxisBit::Where::lane ? lane_ : warp_, ci32(int64_t{1} << bit.index)), ci32(0));
    for (size_t q = 0; q < runs; ++q) {
      const auto r = static_cast<uint32_t>(q);
      const std::vector<V> mine = at(total, r), theirs = at(other, r);
      if (scan) prepend(q, theirs, mine_second);
      set(total, r, combine_region(op, pick_all(mine_second, theirs, mine), pick_all(mine_second, mine, theirs)));
    }
  }

  if (scan) {
    // 3. Each element: its run's exclusive prefix, then its prefix inside the run
    for (size_t q = 0; q < runs; ++q) {
      const auto rq = static_cast<uint32_t>(q);
      for (uint32_t r : members(bases[q])) {
        switch (has[q].known) {
          case HasPrefix::Known::no: break;
          case HasPrefix::Known::yes: set(prefix, r, combine_region(op, at(before, rq), at(prefix, r))); break;
          case HasPrefix::Known::runtime:
            set(prefix, r, pick_all(has[q].value, combine_region(op, at(before, rq), at(prefix, r)), at(prefix, r)));
            break;
        }
      }
    }
    for (size_t k = 0; k < n; ++k) put(op.results[k], L, prefix[k]);
    return;
  }
  // every element of an axis line now holds the line's total: one register per result element
  std::vector<Regs> line(n, Regs(R));
  for (size_t q = 0; q < runs; ++q)
    for (uint32_t r : members(bases[q])) set(line, r, at(total, static_cast<uint32_t>(q)));
  const Layout D = L.drop_dim(static_cast<int>(axis)), O = D.without_zero_regs();
  std::map<Coord, uint32_t> out_index;
  for (uint32_t r = 0; r < static_cast<uint32_t>(O.num_regs()); ++r) out_index.emplace(O.reg_coords(r), r);
  for (size_t k = 0; k < n; ++k) {
    Regs part(static_cast<size_t>(O.num_regs()));
    for (uint32_t r = 0; r < R; ++r) part[out_index.at(D.reg_coords(r))] = line[k][r];
    if (f_.type(op.results[k]).is_scalar()) frames_.back().scalars[op.results[k]] = part[0];
    else put(op.results[k], *plan_.natural[op.results[k]], part);
  }
}

}  // namespace tilejit::jit::lower
