// reduce along an axis: within each thread, across lanes by shuffles, and across warps through
// shared memory in a fixed (deterministic) order. reduce_along does it for several tiles at once
// (one shared-memory round for all): reduce, and reduce_with whose combine commutes (scans.cpp).
#include "jit/lower/lowerer.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

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
  // Narrow floats accumulate in f32 and round once; narrow integers in 32 bits, then wrap (the same
  // sum modulo 2^width; extension keeps the order for max/min): shuffles move 32 or 64 bits.
  DType acc_t = in_t.dtype;
  if (acc_t == DType::f16 || acc_t == DType::bf16) acc_t = DType::f32;
  else if (ir::is_int(acc_t) && ir::bit_width(acc_t) < 32) acc_t = ir::is_signed(acc_t) ? DType::i32 : DType::u32;
  Regs in = get(op.operands[0], L);
  Regs part = reduce_along({in}, L, axis, {acc_t}, [&](const std::vector<V>& a, const std::vector<V>& b) {
    return std::vector<V>{combine(kind, a[0], b[0])};
  })[0];
  for (V& p : part) p = cast(p, out_t.dtype);
  if (out_t.is_scalar()) frames_.back().scalars[op.results[0]] = part[0];
  else put(op.results[0], *plan_.natural[op.results[0]], part);
}

std::vector<Regs> Lowerer::reduce_along(const std::vector<Regs>& in, const Layout& L, int axis, const std::vector<DType>& dt,
                                        const std::function<std::vector<V>(const std::vector<V>&, const std::vector<V>&)>& combine_all) {
  const size_t n = in.size();
  const Layout D = L.drop_dim(axis);  // registers kept
  const Layout O = D.without_zero_regs();
  std::map<Coord, uint32_t> out_index;
  for (uint32_t r = 0; r < static_cast<uint32_t>(O.num_regs()); ++r) out_index.emplace(O.reg_coords(r), r);
  const auto tuple = [&](const std::vector<Regs>& t, size_t r) {
    std::vector<V> out;
    for (size_t k = 0; k < n; ++k) out.push_back(t[k][r]);
    return out;
  };
  std::vector<std::optional<std::vector<V>>> acc(static_cast<size_t>(O.num_regs()));
  for (uint32_t r = 0; r < in[0].size(); ++r) {
    auto& a = acc[out_index.at(D.reg_coords(r))];
    std::vector<V> x;
    for (size_t k = 0; k < n; ++k) x.push_back(cast(in[k][r], dt[k]));
    a = a ? combine_all(*a, x) : x;
  }
  std::vector<Regs> part(n);
  for (auto& a : acc)
    for (size_t k = 0; k < n; ++k) part[k].push_back((*a)[k]);
  // across lanes (each register's shuffles, then its combine)
  for (size_t i = 0; i < L.lane.size(); ++i) {
    if (L.lane[i][static_cast<size_t>(axis)] == 0) continue;
    for (size_t r = 0; r < part[0].size(); ++r) {
      std::vector<V> other;
      for (size_t k = 0; k < n; ++k) other.push_back(shuffle_xor(part[k][r], dt[k], int64_t{1} << i));
      const std::vector<V> c = combine_all(tuple(part, r), other);
      for (size_t k = 0; k < n; ++k) part[k][r] = c[k];
    }
  }
  // across warps, through shared memory in a fixed order (deterministic); all tiles in one round
  int64_t axis_warps = 0;
  for (size_t i = 0; i < L.warp.size(); ++i)
    if (L.warp[i][static_cast<size_t>(axis)] != 0) axis_warps |= int64_t{1} << i;
  if (!axis_warps) return part;
  int64_t onumel = 1;
  for (int64_t d : O.shape) onumel *= d;
  std::vector<int64_t> es, base;  // each tile's element size and first byte
  int64_t bytes = 0;
  for (size_t k = 0; k < n; ++k) {
    es.push_back(ir::byte_size(exchange_dtype(dt[k])));
    bytes = (bytes + es[k] - 1) / es[k] * es[k];
    base.push_back(bytes);
    bytes += warps_ * onumel * es[k];
  }
  reserve_smem(bytes);
  const auto offset = [&](size_t k, V w, V elem) {
    const V at = bin(Op::mul, bin(Op::add, bin(Op::mul, w, ci32(onumel)), elem), ci32(es[k]));
    return base[k] ? bin(Op::add, at, ci32(base[k])) : at;
  };
  for (size_t k = 0; k < n; ++k)
    for (uint32_t r = 0; r < part[k].size(); ++r)
      emit0(Op::store_shared, {offset(k, warp_, O.shape.empty() ? ci32(0) : tile_offset(O, r)), cast(part[k][r], exchange_dtype(dt[k]))});
  emit0(Op::barrier, {});
  V base_w = land(warp_, ci32(~axis_warps));
  std::vector<int64_t> combos{0};
  for (int64_t bit = 1; bit <= axis_warps; bit <<= 1)
    if (axis_warps & bit) {
      size_t m = combos.size();
      for (size_t j = 0; j < m; ++j) combos.push_back(combos[j] | bit);
    }
  std::sort(combos.begin(), combos.end());
  for (uint32_t r = 0; r < part[0].size(); ++r) {
    V elem = O.shape.empty() ? ci32(0) : tile_offset(O, r);
    std::optional<std::vector<V>> total;
    for (int64_t c : combos) {
      V w = bin(Op::bit_or, base_w, ci32(c));
      std::vector<V> x;
      for (size_t k = 0; k < n; ++k) x.push_back(cast(emit(Op::load_shared, pir::scalar(exchange_dtype(dt[k])), {offset(k, w, elem)}), dt[k]));
      total = total ? combine_all(*total, x) : x;
    }
    for (size_t k = 0; k < n; ++k) part[k][r] = (*total)[k];
  }
  emit0(Op::barrier, {});
  return part;
}

}  // namespace tilejit::jit::lower
