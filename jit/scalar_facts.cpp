#include "jit/scalar_facts.hpp"

#include <algorithm>
#include <variant>

namespace tilejit::jit {
namespace {

int64_t pow2_dividing(int64_t c) {
  if (c == 0) return ScalarFacts::kMaxDivisor;
  const auto u = static_cast<uint64_t>(c);
  return std::min<int64_t>(ScalarFacts::kMaxDivisor, static_cast<int64_t>(u & (~u + 1)));
}

const int64_t* int_constant(const ir::Op* op) {
  return op && op->kind == ir::OpKind::constant ? std::get_if<int64_t>(&op->attrs.at("value")) : nullptr;
}

}  // namespace

ScalarFacts::ScalarFacts(const ir::Function& f) : f_(f) { index(f.body); }

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
  if (auto l = loop_.find(v); l != loop_.end()) {
    r = std::min(divisor(l->second->operands[0]), divisor(l->second->operands[2]));  // lb + i * step
  } else if (const ir::Op* op = def(v); op && t.is_scalar() && ir::is_int(t.dtype)) {
    switch (op->kind) {
      case ir::OpKind::constant:
        if (const int64_t* c = int_constant(op)) r = pow2_dividing(*c);
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
  if (auto l = loop_.find(v); l != loop_.end()) return non_negative(l->second->operands[0]);
  const ir::Op* op = def(v);
  const ir::Type& t = f_.type(v);
  if (!op || !t.is_scalar() || !ir::is_int(t.dtype)) return false;
  if (t.dtype == ir::DType::u8 || t.dtype == ir::DType::u16) return true;  // as i32 coordinates too
  switch (op->kind) {
    case ir::OpKind::constant: {
      const int64_t* c = int_constant(op);
      return c && *c >= 0;
    }
    case ir::OpKind::program_id: case ir::OpKind::num_programs: case ir::OpKind::tensor_dim: return true;
    case ir::OpKind::add: case ir::OpKind::mul: case ir::OpKind::maximum: case ir::OpKind::minimum:
      return non_negative(op->operands[0]) && non_negative(op->operands[1]);
    case ir::OpKind::select: return non_negative(op->operands[1]) && non_negative(op->operands[2]);
    case ir::OpKind::div: case ir::OpKind::rem: {
      // x / 0 is all bits set (-1): only divisors that are positive constants or tensor sizes (a
      // zero size is an empty tensor, which no window of a launched kernel indexes by)
      const ir::Op* d = def(op->operands[1]);
      const int64_t* c = int_constant(d);
      const bool divisor_ok = (c && *c > 0) || (d && d->kind == ir::OpKind::tensor_dim);
      return divisor_ok && non_negative(op->operands[0]);
    }
    case ir::OpKind::cast: {  // into a signed type wide enough that the value cannot wrap negative
      const ir::DType s = f_.type(op->operands[0]).dtype;
      if (!ir::is_int(s) || s == ir::DType::i1 || !ir::is_signed(t.dtype)) return false;
      if (!ir::is_signed(s)) return ir::bit_width(t.dtype) > ir::bit_width(s);
      return non_negative(op->operands[0]) && ir::bit_width(t.dtype) >= ir::bit_width(s);
    }
    default: return false;
  }
}

bool tma_inner_offset_aligned(const ScalarFacts& facts, ir::ValueId inner_offset, ir::DType dtype) {
  return facts.divisor(inner_offset) * ir::byte_size(dtype) % 16 == 0;
}

}  // namespace tilejit::jit
