// reduce along an axis: within each thread, across lanes by shuffles, and across warps through
// shared memory in a fixed (deterministic) order.
#include "jit/lower/lowerer.hpp"

#include <algorithm>
#include <map>

namespace tilejit::jit::lower {

V Lowerer::combine(const std::string& kind, V a, V b) {
  if (kind == "sum") return bin(Op::add, a, b);
  if (kind == "max") return bin(Op::maximum, a, b);
  return bin(Op::minimum, a, b);
}

void Lowerer::reduce(const ir::Op& op) {
  const ir::Type& in_t = f_.type(op.operands[0]);
  const ir::Type& out_t = f_.type(op.results[0]);
  check_shape(&op, in_t);
  const std::string& kind = op.str_attr("kind");
  int axis = static_cast<int>(op.int_attr("axis"));
  Layout L = plan_.natural[op.operands[0]] ? *plan_.natural[op.operands[0]] : memory_layout(in_t);
  Regs in = get(op.operands[0], L);
  // Narrow floats accumulate in f32 and round once; narrow integers in 32 bits, then wrap (the same
  // sum modulo 2^width; extension keeps the order for max/min): shuffles move 32 or 64 bits.
  DType acc_t = in_t.dtype;
  if (acc_t == DType::f16 || acc_t == DType::bf16) acc_t = DType::f32;
  else if (ir::is_int(acc_t) && ir::bit_width(acc_t) < 32) acc_t = ir::is_signed(acc_t) ? DType::i32 : DType::u32;
  Layout D = L.drop_dim(axis);  // registers kept
  Layout O = D.without_zero_regs();
  std::map<Coord, uint32_t> out_index;
  for (uint32_t r = 0; r < static_cast<uint32_t>(O.num_regs()); ++r) out_index.emplace(O.reg_coords(r), r);
  std::vector<std::optional<V>> acc(static_cast<size_t>(O.num_regs()));
  for (uint32_t r = 0; r < in.size(); ++r) {
    uint32_t o = out_index.at(D.reg_coords(r));
    V x = cast(in[r], acc_t);
    acc[o] = acc[o] ? combine(kind, *acc[o], x) : x;
  }
  Regs part;
  for (auto& a : acc) part.push_back(*a);
  // across lanes
  for (size_t i = 0; i < L.lane.size(); ++i) {
    if (L.lane[i][static_cast<size_t>(axis)] == 0) continue;
    for (V& p : part) p = combine(kind, p, emit(Op::shfl_xor, pir::scalar(acc_t), {p}, int64_t{1} << i));
  }
  // across warps, through shared memory in a fixed order (deterministic)
  int64_t axis_warps = 0;
  for (size_t i = 0; i < L.warp.size(); ++i)
    if (L.warp[i][static_cast<size_t>(axis)] != 0) axis_warps |= int64_t{1} << i;
  if (axis_warps) {
    int64_t onumel = 1;
    for (int64_t d : O.shape) onumel *= d;
    int64_t es = ir::byte_size(acc_t);
    reserve_smem(warps_ * onumel * es);
    for (uint32_t r = 0; r < part.size(); ++r) {
      V off = bin(Op::mul, bin(Op::add, bin(Op::mul, warp_, ci32(onumel)), O.shape.empty() ? ci32(0) : tile_offset(O, r)), ci32(es));
      emit0(Op::store_shared, {off, part[r]});
    }
    emit0(Op::barrier, {});
    V base_w = land(warp_, ci32(~axis_warps));
    std::vector<int64_t> combos{0};
    for (int64_t bit = 1; bit <= axis_warps; bit <<= 1)
      if (axis_warps & bit) {
        size_t n = combos.size();
        for (size_t j = 0; j < n; ++j) combos.push_back(combos[j] | bit);
      }
    std::sort(combos.begin(), combos.end());
    for (uint32_t r = 0; r < part.size(); ++r) {
      V elem = O.shape.empty() ? ci32(0) : tile_offset(O, r);
      std::optional<V> total;
      for (int64_t c : combos) {
        V w = bin(Op::bit_or, base_w, ci32(c));
        V off = bin(Op::mul, bin(Op::add, bin(Op::mul, w, ci32(onumel)), elem), ci32(es));
        V x = emit(Op::load_shared, pir::scalar(acc_t), {off});
        total = total ? combine(kind, *total, x) : x;
      }
      part[r] = *total;
    }
    emit0(Op::barrier, {});
  }
  for (V& p : part) p = cast(p, out_t.dtype);
  if (out_t.is_scalar()) frames_.back().scalars[op.results[0]] = part[0];
  else put(op.results[0], *plan_.natural[op.results[0]], part);
}

}  // namespace tilejit::jit::lower
