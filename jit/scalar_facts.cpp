#include "jit/scalar_facts.hpp"

#include <algorithm>
#include <variant>

namespace tilejit::jit {
int64_t pow2_dividing(int64_t c, int64_t cap) {
  if (c == 0) return cap;
  const auto u = static_cast<uint64_t>(c);
  return std::min<int64_t>(cap, static_cast<int64_t>(u & (~u + 1)));
}

namespace {

const int64_t* int_constant(const ir::Op* op) {
  return op && op->kind == ir::OpKind::constant ? std::get_if<int64_t>(&op->attrs.at("value")) : nullptr;
}

}  // namespace

ScalarFacts::ScalarFacts(const ir::Function& f) : f_(f) {
  index(f.body);
  for (const ir::Param& p : f.params)
    if (p.kind == ir::ParamKind::Scalar && p.spec.divisible_by > 1) param_divisor_[p.value] = std::min<int64_t>(kMaxDivisor, p.spec.divisible_by);
}

std::optional<int64_t> ScalarFacts::constant(ir::ValueId v) const {
  const int64_t* c = int_constant(def(v));
  return c ? std::optional<int64_t>(*c) : std::nullopt;
}

void ScalarFacts::index(const ir::Block& b) {
  for (const ir::Op& op : b.ops) {
    for (ir::ValueId r : op.results) def_[r] = &op;
    if (op.kind == ir::OpKind::for_ && !op.regions.empty() && !op.regions[0].args.empty()) loop_[op.regions[0].args[0]] = &op;
    for (const ir::Block& region : op.regions) index(region);
  }
}

const ir::Op* ScalarFacts::def(ir::ValueId v) const {
  auto d = def_.find(v);
  return d == def_.end() ? nullptr : d->second;
}

int64_t ScalarFacts::divisor(ir::ValueId v) const {
  if (auto m = divisor_.find(v); m != divisor_.end()) return m->second;
  int64_t r = 1;
  const ir::Type& t = f_.type(v);
  if (auto p = param_divisor_.find(v); p != param_divisor_.end()) {
    r = p->second;
  } else if (auto l = loop_.find(v); l != loop_.end()) {
    r = std::min(divisor(l->second->operands[0]), divisor(l->second->operands[2]));  // lb + i * step
  } else if (const ir::Op* op = def(v); op && t.is_scalar() && ir::is_int(t.dtype)) {
    switch (op->kind) {
      case ir::OpKind::constant:
        if (const int64_t* c = int_constant(op)) r = pow2_dividing(*c, kMaxDivisor);
        break;
      case ir::OpKind::add: case ir::OpKind::sub: r = std::min(divisor(op->operands[0]), divisor(op->operands[1])); break;
      case ir::OpKind::mul: r = std::min(kMaxDivisor, divisor(op->operands[0]) * divisor(op->operands[1])); break;
      case ir::OpKind::shl: {
        const int64_t* amount = int_constant(def(op->operands[1]));
        r = amount && *amount >= 0 && *amount < 12 ? std::min(kMaxDivisor, divisor(op->operands[0]) << *amount) : 1;
        break;
      }
      case ir::OpKind::cast: {
        // an integer conversion keeps the value modulo 2^width, so the divisors below 2^width
        const ir::Type& src = f_.type(op->operands[0]);
        if (ir::is_int(src.dtype) && src.dtype != ir::DType::i1)
          r = std::min(divisor(op->operands[0]), int64_t{1} << std::min(ir::bit_width(t.dtype) - 1, 12));
        break;
      }
      default: break;
    }
  }
  divisor_[v] = r;
  return r;
}

bool ScalarFacts::non_negative(ir::ValueId v) const {
  const std::optional<Range> r = range(v);
  return (r && r->lo >= 0) || index_like(v);
}

bool ScalarFacts::index_like(ir::ValueId v) const {
  const ir::Type& t = f_.type(v);
  if (!t.is_scalar() || !ir::is_int(t.dtype)) return false;
  if (auto l = loop_.find(v); l != loop_.end()) return non_negative(l->second->operands[0]);
  const ir::Op* op = def(v);
  if (!op) return false;
  auto small = [&](ir::ValueId x) {
    const std::optional<Range> r = range(x);
    return r && r->lo >= 0 && r->hi < (int64_t{1} << 16);
  };
  // every operand an index or a small constant-like value, at least one an index
  auto indices = [&](std::initializer_list<ir::ValueId> xs) {
    bool any = false;
    for (ir::ValueId x : xs) {
      const bool index = index_like(x);
      if (!index && !small(x)) return false;
      any = any || index;
    }
    return any;
  };
  switch (op->kind) {
    case ir::OpKind::program_id: case ir::OpKind::num_programs: case ir::OpKind::tensor_dim: return true;
    case ir::OpKind::add: case ir::OpKind::mul: case ir::OpKind::maximum: case ir::OpKind::minimum:
      return indices({op->operands[0], op->operands[1]});
    case ir::OpKind::select: return indices({op->operands[1], op->operands[2]});
    case ir::OpKind::sub: {
      // num_programs(a) - c - program_id(a) with c 0 or 1 (reversed program order): >= 0
      const ir::Op *x = def(op->operands[0]), *y = def(op->operands[1]);
      if (!x || !y || y->kind != ir::OpKind::program_id) return false;
      const ir::Op* n = x;
      if (x->kind == ir::OpKind::sub) {
        const std::optional<int64_t> c = constant(x->operands[1]);
        if (!c || *c < 0 || *c > 1) return false;
        n = def(x->operands[0]);
      }
      return n && n->kind == ir::OpKind::num_programs && n->int_attr("axis") == y->int_attr("axis");
    }
    case ir::OpKind::shl: {
      const std::optional<int64_t> k = constant(op->operands[1]);
      return k && *k >= 0 && *k < 16 && index_like(op->operands[0]);
    }
    case ir::OpKind::div: case ir::OpKind::rem: {
      const ir::Op* d = def(op->operands[1]);
      const std::optional<int64_t> c = constant(op->operands[1]);
      return ((c && *c > 0) || (d && d->kind == ir::OpKind::tensor_dim)) && index_like(op->operands[0]);
    }
    case ir::OpKind::cast: {  // into a signed type at least as wide
      const ir::DType s = f_.type(op->operands[0]).dtype;
      return ir::is_int(s) && s != ir::DType::i1 && ir::is_signed(t.dtype) && ir::bit_width(t.dtype) >= ir::bit_width(s) &&
             index_like(op->operands[0]);
    }
    default: return false;
  }
}

std::optional<ScalarFacts::Range> ScalarFacts::range(ir::ValueId v) const {
  if (auto m = range_.find(v); m != range_.end()) return m->second;
  range_[v] = std::nullopt;  // (cycles through loop counters end here)
  const std::optional<Range> r = compute_range(v);
  range_[v] = r;
  return r;
}

namespace {

__extension__ typedef __int128 Wide;  // (bounds of 64-bit products without overflow)

// The values of an integer type, clipped to int64 (u64 above 2^63 - 1 counts as unknown).
std::pair<Wide, Wide> type_bounds(ir::DType d) {
  const int w = ir::bit_width(d);
  if (d == ir::DType::i1) return {0, 1};
  if (!ir::is_signed(d)) return {0, w >= 64 ? Wide{INT64_MAX} : (Wide{1} << w) - 1};
  return {-(Wide{1} << (w - 1)), (Wide{1} << (w - 1)) - 1};
}

std::optional<ScalarFacts::Range> fit(ir::DType d, Wide lo, Wide hi) {
  const auto [tlo, thi] = type_bounds(d);
  if (lo < tlo || hi > thi || lo > hi) return std::nullopt;
  return ScalarFacts::Range{static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
}

}  // namespace

std::optional<ScalarFacts::Range> ScalarFacts::compute_range(ir::ValueId v) const {
  const ir::Type& t = f_.type(v);
  if (!t.is_scalar() || !ir::is_int(t.dtype)) return std::nullopt;
  const ir::DType d = t.dtype;
  const auto [tlo, thi] = type_bounds(d);
  // what the type alone says: unsigned values of up to 63 bits are never negative
  const std::optional<Range> by_type =
      ir::is_signed(d) || (d == ir::DType::u64) ? std::nullopt : fit(d, tlo, thi);
  if (auto l = loop_.find(v); l != loop_.end()) {
    // lb, lb + step, ... below ub (steps are positive)
    const std::optional<Range> lb = range(l->second->operands[0]), ub = range(l->second->operands[1]);
    if (!lb) return by_type;
    return fit(d, lb->lo, ub ? std::max<Wide>(lb->lo, Wide{ub->hi} - 1) : thi);
  }
  const ir::Op* op = def(v);
  if (!op) return by_type;
  auto arg = [&](size_t i) { return range(op->operands.at(i)); };
  auto shift_amount = [&]() -> std::optional<int64_t> {
    const int64_t* k = int_constant(def(op->operands.at(1)));
    return k && *k >= 0 && *k < ir::bit_width(d) ? std::optional<int64_t>(*k) : std::nullopt;
  };
  std::optional<Range> r;
  switch (op->kind) {
    case ir::OpKind::constant:
      if (const int64_t* c = int_constant(op)) r = Range{*c, *c};
      break;
    case ir::OpKind::program_id: case ir::OpKind::num_programs: {
      // the launch limits of a grid: 2^31 - 1 programs along x, 65535 along y and z
      const Wide most = op->int_attr("axis") == 0 ? Wide{INT32_MAX} : Wide{65535};
      r = fit(d, op->kind == ir::OpKind::num_programs ? 1 : 0, op->kind == ir::OpKind::num_programs ? most : most - 1);
      break;
    }
    case ir::OpKind::tensor_dim: r = fit(d, 0, thi); break;
    case ir::OpKind::add: case ir::OpKind::sub: case ir::OpKind::mul: {
      const std::optional<Range> a = arg(0), b = arg(1);
      if (!a || !b) break;
      if (op->kind == ir::OpKind::add) r = fit(d, Wide{a->lo} + b->lo, Wide{a->hi} + b->hi);
      else if (op->kind == ir::OpKind::sub) r = fit(d, Wide{a->lo} - b->hi, Wide{a->hi} - b->lo);
      else {
        const Wide p[4] = {Wide{a->lo} * b->lo, Wide{a->lo} * b->hi, Wide{a->hi} * b->lo, Wide{a->hi} * b->hi};
        r = fit(d, *std::min_element(p, p + 4), *std::max_element(p, p + 4));
      }
      break;
    }
    case ir::OpKind::shl: {
      const std::optional<Range> a = arg(0);
      const std::optional<int64_t> k = shift_amount();
      if (a && k && a->lo >= 0) r = fit(d, Wide{a->lo} << *k, Wide{a->hi} << *k);
      break;
    }
    case ir::OpKind::shr: {
      const std::optional<Range> a = arg(0);
      const std::optional<int64_t> k = shift_amount();
      if (a && k && a->lo >= 0) r = Range{a->lo >> *k, a->hi >> *k};
      break;
    }
    case ir::OpKind::maximum: case ir::OpKind::minimum: {
      // an operand of unknown range still lies in its type's: max(x, 0) >= 0, min(x, c) <= c
      auto or_type = [&](size_t i) { return arg(i) ? arg(i) : fit(d, tlo, thi); };
      const std::optional<Range> a = or_type(0), b = or_type(1);
      if (!a || !b) break;
      r = op->kind == ir::OpKind::maximum ? Range{std::max(a->lo, b->lo), std::max(a->hi, b->hi)}
                                          : Range{std::min(a->lo, b->lo), std::min(a->hi, b->hi)};
      break;
    }
    case ir::OpKind::select: {
      const std::optional<Range> a = arg(1), b = arg(2);
      if (a && b) r = Range{std::min(a->lo, b->lo), std::max(a->hi, b->hi)};
      break;
    }
    case ir::OpKind::div: case ir::OpKind::rem: {
      // x / 0 is all bits set (-1): only divisors that are positive constants or tensor sizes (a
      // zero size is an empty tensor, which no window of a launched kernel indexes by)
      const ir::Op* dv = def(op->operands[1]);
      const int64_t* c = int_constant(dv);
      const bool divisor_ok = (c && *c > 0) || (dv && dv->kind == ir::OpKind::tensor_dim);
      const std::optional<Range> a = arg(0);
      if (!divisor_ok || !a || a->lo < 0) break;
      if (op->kind == ir::OpKind::div) r = Range{c ? a->lo / *c : 0, c ? a->hi / *c : a->hi};
      else r = Range{0, c ? std::min(a->hi, *c - 1) : a->hi};
      break;
    }
    case ir::OpKind::cast: {  // an integer conversion keeps the value where the new type holds it
      const ir::DType s = f_.type(op->operands[0]).dtype;
      if (!ir::is_int(s) || s == ir::DType::i1) break;
      if (const std::optional<Range> a = arg(0)) r = fit(d, a->lo, a->hi);
      break;
    }
    default: break;
  }
  if (!r) return by_type;
  if (by_type) r = Range{std::max(r->lo, by_type->lo), std::min(r->hi, by_type->hi)};
  return r;
}

bool tma_inner_offset_aligned(const ScalarFacts& facts, ir::ValueId inner_offset, ir::DType dtype) {
  return facts.divisor(inner_offset) * ir::byte_size(dtype) % 16 == 0;
}

}  // namespace tilejit::jit
