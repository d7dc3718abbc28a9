#include "jit/axis_info.hpp"

#include <algorithm>
#include <numeric>
#include <variant>

namespace tilejit::jit {
namespace {

using ir::OpKind;

int64_t pow2_of(int64_t c) { return pow2_dividing(c, AxisInfo::kMaxDivisibility); }

AxisFacts unknown(size_t rank) { return {std::vector<int64_t>(rank, 1), std::vector<int64_t>(rank, 1), std::vector<int64_t>(rank, 1)}; }

// The same value everywhere, divisible by `div`.
AxisFacts uniform(const ir::Shape& shape, int64_t div) {
  AxisFacts a = unknown(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) a.divisibility[d] = div, a.constancy[d] = shape[d];
  return a;
}

int64_t gcd(int64_t a, int64_t b) { return std::gcd(a, b); }

// a + b (scale: b's units in a's, e.g. the element size for a pointer plus offsets)
AxisFacts sum(const AxisFacts& a, const AxisFacts& b, int64_t scale) {
  AxisFacts r = unknown(a.contiguity.size());
  for (size_t d = 0; d < r.contiguity.size(); ++d) {
    r.contiguity[d] = std::max(gcd(a.contiguity[d], b.constancy[d]), gcd(a.constancy[d], b.contiguity[d]));
    r.divisibility[d] = std::min(AxisInfo::kMaxDivisibility, gcd(a.divisibility[d], b.divisibility[d] * scale));
    r.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
  }
  return r;
}

}  // namespace

AxisInfo::AxisInfo(const ir::Function& f, const ScalarFacts& facts) : f_(f), facts_(facts) {
  for (const ir::Param& p : f.params) {
    if (p.kind == ir::ParamKind::Pointer) pointer_align_[p.value] = std::max<int64_t>(p.spec.align_bytes, ir::byte_size(p.type.dtype));
    if (p.kind == ir::ParamKind::Tensor) tensor_params_[p.value] = &p;
  }
  visit(f.body);
}

void AxisInfo::visit(const ir::Block& b) {
  for (const ir::Op& op : b.ops) {
    for (ir::ValueId r : op.results) def_[r] = &op;
    if (op.results.size() == 1 && !f_.type(op.results[0]).is_scalar() && f_.type(op.results[0]).kind != ir::TypeKind::Tensor)
      facts_of_[op.results[0]] = compute(op);
    for (const ir::Block& r : op.regions) visit(r);
  }
}

AxisFacts AxisInfo::of(ir::ValueId v) const {
  if (auto it = facts_of_.find(v); it != facts_of_.end()) return it->second;
  return unknown(f_.type(v).shape.size());
}

const ir::Param* AxisInfo::tensor_param(ir::ValueId v) const {
  auto it = tensor_params_.find(v);
  return it == tensor_params_.end() ? nullptr : it->second;
}

bool AxisInfo::is_one(ir::ValueId v) const {
  auto d = def_.find(v);
  if (d == def_.end()) return false;
  const ir::Op& op = *d->second;
  switch (op.kind) {
    case OpKind::constant: {
      const auto* c = std::get_if<int64_t>(&op.attrs.at("value"));
      return c && *c == 1;
    }
    case OpKind::splat: case OpKind::cast: return ir::is_int(f_.type(op.operands[0]).dtype) && is_one(op.operands[0]);
    case OpKind::tensor_stride: {
      const ir::Param* p = tensor_param(op.operands[0]);
      return p && p->spec.contiguous_last && op.int_attr("dim") == p->type.rank - 1;
    }
    default: return false;
  }
}

int64_t AxisInfo::scalar_divisibility(ir::ValueId v) const {
  if (auto p = pointer_align_.find(v); p != pointer_align_.end()) return std::min(kMaxDivisibility, p->second);
  if (auto d = def_.find(v); d != def_.end()) {
    const ir::Op& op = *d->second;
    const ir::Param* p = (op.kind == OpKind::tensor_ptr || op.kind == OpKind::tensor_stride) ? tensor_param(op.operands[0]) : nullptr;
    if (p) {
      const int64_t es = ir::byte_size(p->type.dtype), align = std::max<int64_t>(p->spec.align_bytes, es);
      if (op.kind == OpKind::tensor_ptr) return std::min(kMaxDivisibility, align);  // bytes
      if (op.int_attr("dim") < p->type.rank - 1) return std::max<int64_t>(1, align / es);  // elements
      return 1;
    }
    if (op.kind == OpKind::addptr && f_.type(v).is_scalar()) {  // e.g. Out + 4096 (bytes: offset x element size)
      const int64_t es = ir::byte_size(f_.type(v).dtype);
      return std::min(kMaxDivisibility, gcd(scalar_divisibility(op.operands[0]), scalar_divisibility(op.operands[1]) * es));
    }
  }
  const ir::Type& t = f_.type(v);
  if (t.kind == ir::TypeKind::Value && ir::is_int(t.dtype) && t.dtype != ir::DType::i1) return std::min(kMaxDivisibility, facts_.divisor(v));
  return 1;
}

AxisFacts AxisInfo::compute(const ir::Op& op) const {
  const ir::Type& t = f_.type(op.results[0]);
  const ir::Shape& shape = t.shape;
  const size_t rank = shape.size();
  auto in = [&](size_t i) { return of(op.operands.at(i)); };
  switch (op.kind) {
    case OpKind::constant:
      if (const auto* c = std::get_if<int64_t>(&op.attrs.at("value"))) return uniform(shape, pow2_of(*c));
      return uniform(shape, 1);
    case OpKind::splat: return uniform(shape, scalar_divisibility(op.operands[0]));
    case OpKind::arange: {
      AxisFacts a = unknown(1);
      a.contiguity[0] = shape[0];
      a.divisibility[0] = pow2_of(op.int_attr("start"));
      return a;
    }
    case OpKind::add: case OpKind::addptr: {
      if (f_.type(op.operands[1]).is_scalar() || f_.type(op.operands[0]).is_scalar()) return unknown(rank);
      const int64_t scale = op.kind == OpKind::addptr ? ir::byte_size(t.dtype) : 1;
      return sum(in(0), in(1), scale);
    }
    case OpKind::sub: {
      const AxisFacts a = in(0), b = in(1);
      AxisFacts r = unknown(rank);
      for (size_t d = 0; d < rank; ++d) {
        r.contiguity[d] = gcd(a.contiguity[d], b.constancy[d]);
        r.divisibility[d] = gcd(a.divisibility[d], b.divisibility[d]);
        r.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
      }
      return r;
    }
    case OpKind::mul: {
      if (is_one(op.operands[1])) return in(0);
      if (is_one(op.operands[0])) return in(1);
      const AxisFacts a = in(0), b = in(1);
      AxisFacts r = unknown(rank);
      for (size_t d = 0; d < rank; ++d) {
        r.divisibility[d] = std::min(kMaxDivisibility, a.divisibility[d] * b.divisibility[d]);
        r.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
      }
      return r;
    }
    case OpKind::cast: {  // integer to integer: the values (and so the runs) stay where they fit
      const ir::DType s = f_.type(op.operands[0]).dtype;
      if (!ir::is_int(s) || !ir::is_int(t.dtype) || ir::bit_width(t.dtype) < ir::bit_width(s)) return unknown(rank);
      return in(0);
    }
    case OpKind::broadcast: {
      const ir::Shape& from = f_.type(op.operands[0]).shape;
      AxisFacts a = in(0);
      if (from.size() != rank) return unknown(rank);
      for (size_t d = 0; d < rank; ++d)
        if (from[d] == 1 && shape[d] != 1) a.contiguity[d] = 1, a.constancy[d] = shape[d];
      return a;
    }
    case OpKind::expand_dims: {
      AxisFacts a = in(0);
      const auto axis = static_cast<size_t>(op.int_attr("axis"));
      const int64_t div = a.divisibility.empty() ? 1 : *std::min_element(a.divisibility.begin(), a.divisibility.end());
      a.contiguity.insert(a.contiguity.begin() + static_cast<std::ptrdiff_t>(axis), 1);
      a.divisibility.insert(a.divisibility.begin() + static_cast<std::ptrdiff_t>(axis), div);
      a.constancy.insert(a.constancy.begin() + static_cast<std::ptrdiff_t>(axis), 1);
      return a;
    }
    case OpKind::cmp: {
      const AxisFacts a = in(0), b = in(1);
      AxisFacts r = unknown(rank);
      const std::string& pred = op.str_attr("pred");
      for (size_t d = 0; d < rank; ++d) {
        r.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
        // a run of consecutive a starting at a multiple of G, against a b constant there and a
        // multiple of G: a < b (and a >= b) changes only at a multiple of G
        if ((pred == "lt" || pred == "ge") && b.constancy[d] == shape[d] && ir::is_signed(f_.type(op.operands[0]).dtype))
          r.constancy[d] = std::max(r.constancy[d], gcd(a.contiguity[d], gcd(a.divisibility[d], b.divisibility[d])));
      }
      return r;
    }
    case OpKind::bit_and: case OpKind::bit_or: case OpKind::bit_xor: {
      const AxisFacts a = in(0), b = in(1);
      AxisFacts r = unknown(rank);
      for (size_t d = 0; d < rank; ++d) r.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
      return r;
    }
    default: return unknown(rank);
  }
}

}  // namespace tilejit::jit
