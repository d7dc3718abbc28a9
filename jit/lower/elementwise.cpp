// Elementwise ops: each register of the result computed from the operands' registers in the same
// layout, by the scalar instruction(s) of the op.
#include "jit/lower/lowerer.hpp"

#include <map>
#include <optional>
#include <set>

namespace tilejit::jit::lower {

V Lowerer::scalar_op(const ir::Op& op, const std::vector<V>& a) {
  const ir::Type& rt = f_.type(op.results[0]);
  pir::Ty ty = value_ty(rt);
  switch (op.kind) {
    case OpKind::cmp: {
      static const std::map<std::string, pir::Pred> preds{{"eq", pir::Pred::eq}, {"ne", pir::Pred::ne}, {"lt", pir::Pred::lt},
                                                          {"le", pir::Pred::le}, {"gt", pir::Pred::gt}, {"ge", pir::Pred::ge}};
      return cmp(preds.at(op.str_attr("pred")), a[0], a[1]);
    }
    case OpKind::select: return emit(Op::select, ty, {a[0], a[1], a[2]});
    case OpKind::cast: return emit(Op::cast, ty, {a[0]});
    case OpKind::bitcast: return emit(Op::bitcast, ty, {a[0]});
    case OpKind::addptr: return emit(Op::gep, ty, {a[0], a[1]});
    default: break;
  }
  static const std::map<OpKind, Op> direct{
      {OpKind::add, Op::add}, {OpKind::sub, Op::sub}, {OpKind::mul, Op::mul}, {OpKind::div, Op::div},
      {OpKind::rem, Op::rem}, {OpKind::minimum, Op::minimum}, {OpKind::maximum, Op::maximum},
      {OpKind::bit_and, Op::bit_and}, {OpKind::bit_or, Op::bit_or}, {OpKind::bit_xor, Op::bit_xor},
      {OpKind::shl, Op::shl}, {OpKind::shr, Op::shr}, {OpKind::umulhi, Op::umulhi}, {OpKind::byte_perm, Op::byte_perm}, {OpKind::fma, Op::fma},
      {OpKind::neg, Op::neg}, {OpKind::bit_not, Op::bit_not}, {OpKind::abs, Op::abs}, {OpKind::exp, Op::exp}, {OpKind::exp2, Op::exp2},
      {OpKind::log, Op::log}, {OpKind::log2, Op::log2}, {OpKind::sqrt, Op::sqrt}, {OpKind::rsqrt, Op::rsqrt}, {OpKind::rcp, Op::rcp},
      {OpKind::floor, Op::floor}, {OpKind::ceil, Op::ceil}, {OpKind::tanh, Op::tanh}, {OpKind::sin, Op::sin},
      {OpKind::cos, Op::cos}, {OpKind::erf, Op::erf}};
  auto it = direct.find(op.kind);
  if (it == direct.end()) fail(&op, "internal: no per-thread lowering");
  return emit(it->second, ty, a);
}

Regs Lowerer::elementwise(const ir::Op& op, const Layout& L) {
  std::vector<Regs> in;
  for (ir::ValueId v : op.operands) in.push_back(get(v, L));
  if (op.kind == OpKind::mul && op.has_attr(ir::kSkipUnitScaleAttr)) return scale_lazily(op, L, in);
  Regs outr;
  for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) {
    std::vector<V> a;
    for (const Regs& x : in) a.push_back(x[r]);
    outr.push_back(scalar_op(op, a));
  }
  return outr;
}

// lang::scale_lazily: x * s, skipped by a warp whose threads hold only scales equal to 1 (each
// thread tests the scale registers its own multiplies use, the warp votes): one uniform branch
// around the multiplies, the unscaled registers on the other side. NaN scales multiply (!(s == 1)).
Regs Lowerer::scale_lazily(const ir::Op& op, const Layout& L, const std::vector<Regs>& in) {
  const DType d = f_.type(op.results[0]).dtype;
  const V one = cfloat(d, 1.0);
  std::set<V> seen;
  std::optional<V> moved;
  for (V s : in[1])
    if (seen.insert(s).second) {
      const V c = lnot(cmp(pir::Pred::eq, s, one));
      moved = moved ? bin(Op::bit_or, *moved, c) : c;
    }
  const V votes = emit(Op::ballot, pir::scalar(DType::u32), {*moved});
  pir::Inst branch;
  branch.op = Op::if_;
  branch.args = {cmp(pir::Pred::ne, votes, cint(DType::u32, 0))};
  for (int side = 0; side < 2; ++side) {
    pir::Block pb;
    push_block(&pb);
    pir::Inst y;
    y.op = Op::yield;
    for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r)
      y.args.push_back(side == 0 ? scalar_op(op, {in[0][r], in[1][r]}) : in[0][r]);
    pb.insts.push_back(std::move(y));
    pop_block();
    branch.regions.push_back(std::move(pb));
  }
  const Regs res = fresh(op.results[0], L);
  branch.results = res;
  blocks_.back()->insts.push_back(std::move(branch));
  return res;
}

}  // namespace tilejit::jit::lower
