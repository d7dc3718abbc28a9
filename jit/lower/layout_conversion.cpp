// Moving a tile between layouts (a register renaming, else an exchange through shared memory),
// gathers along an axis (through shared memory too), and flexible values, materialised directly in
// whatever layout a use asks for.
#include "jit/lower/lowerer.hpp"

#include <map>

namespace tilejit::jit::lower {

Regs Lowerer::convert(const Regs& regs, const Layout& from, const Layout& to, const ir::Type& t) {
  if (from == to) return regs;
  if (from.lane == to.lane && from.warp == to.warp && from.shape == to.shape) {
    // Same elements per thread: a register renaming.
    std::map<Coord, V> by_coord;
    for (uint32_t r = 0; r < static_cast<uint32_t>(from.num_regs()); ++r) by_coord.emplace(from.reg_coords(r), regs[r]);
    Regs outr;
    bool ok = true;
    for (uint32_t r = 0; r < static_cast<uint32_t>(to.num_regs()) && ok; ++r) {
      auto it = by_coord.find(to.reg_coords(r));
      if (it == by_coord.end()) ok = false;
      else outr.push_back(it->second);
    }
    if (ok) return outr;
  }
  return through_smem(regs, from, to, t);
}

pir::Ty Lowerer::smem_ty(const ir::Type& t) const {
  if (t.is_pointer()) return pir::scalar(DType::u64);
  if (t.dtype == DType::i1) return pir::scalar(DType::u8);
  return pir::scalar(t.dtype);
}

V Lowerer::to_smem(V v, const ir::Type& t) {
  if (t.is_pointer()) return emit(Op::bitcast, pir::scalar(DType::u64), {v});
  if (t.dtype == DType::i1) return cast(v, DType::u8);
  return v;
}

V Lowerer::from_smem(V v, const ir::Type& t) {
  if (t.is_pointer()) return emit(Op::bitcast, pir::pointer(t.dtype), {v});
  if (t.dtype == DType::i1) return cmp(pir::Pred::ne, v, cint(DType::u8, 0));
  return v;
}

Regs Lowerer::through_smem(const Regs& regs, const Layout& from, const Layout& to, const ir::Type& t) {
  pir::Ty st = smem_ty(t);
  int64_t esize = ir::byte_size(st.dtype);
  int64_t numel = 1;
  for (int64_t d : to.shape) numel *= d;
  reserve_smem(numel * esize);
  for (uint32_t r = 0; r < regs.size(); ++r) {
    if (duplicate_reg(from, r)) continue;
    V off = bin(Op::mul, tile_offset(from, r), ci32(esize));
    emit0(Op::store_shared, {off, to_smem(regs[r], t)});
  }
  emit0(Op::barrier, {});
  Regs outr;
  for (uint32_t r = 0; r < static_cast<uint32_t>(to.num_regs()); ++r) {
    V off = bin(Op::mul, tile_offset(to, r), ci32(esize));
    outr.push_back(from_smem(emit(Op::load_shared, st, {off}), t));
  }
  emit0(Op::barrier, {});
  return outr;
}

void Lowerer::gather(const ir::Op& op) {
  const ir::Type& xt = f_.type(op.operands[0]);
  const ir::Type& rt = f_.type(op.results[0]);
  check_shape(&op, xt);
  check_shape(&op, rt);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const Layout Lx = plan_.natural[op.operands[0]] ? *plan_.natural[op.operands[0]] : memory_layout(xt);
  const Layout& Lr = *plan_.natural[op.results[0]];
  const Regs x = get(op.operands[0], Lx), index = get(op.operands[1], Lr);
  // the source tile row-major in shared memory, then each result element read at its index
  const pir::Ty st = smem_ty(xt);
  const int64_t esize = ir::byte_size(st.dtype);
  int64_t numel = 1;
  for (int64_t d : xt.shape) numel *= d;
  reserve_smem(numel * esize);
  for (uint32_t r = 0; r < x.size(); ++r)
    if (!duplicate_reg(Lx, r)) emit0(Op::store_shared, {bin(Op::mul, tile_offset(Lx, r), ci32(esize)), to_smem(x[r], xt)});
  emit0(Op::barrier, {});
  // an index outside the axis wraps (the interpreter reports it): never a read outside the tile
  const int64_t n = xt.shape[axis];
  Regs out;
  for (uint32_t r = 0; r < static_cast<uint32_t>(Lr.num_regs()); ++r) {
    V off = ci32(0);
    for (size_t d = 0; d < xt.shape.size(); ++d) {
      V c = d == axis ? land(cast(index[r], DType::i32), ci32(n - 1)) : coord(Lr, r, d);
      off = bin(Op::add, bin(Op::mul, off, ci32(xt.shape[d])), c);
    }
    out.push_back(from_smem(emit(Op::load_shared, st, {bin(Op::mul, off, ci32(esize))}), xt));
  }
  emit0(Op::barrier, {});
  put(op.results[0], Lr, out);
}

Regs Lowerer::materialize(const ir::Op& op, const Layout& L) {
  const ir::Type& t = f_.type(op.results[0]);
  check_shape(&op, t);
  auto n = static_cast<uint32_t>(L.num_regs());
  switch (op.kind) {
    case OpKind::constant: return Regs(n, constant_value(t.dtype, op.attrs.at("value")));
    case OpKind::splat: return Regs(n, scalar(op.operands[0]));
    case OpKind::arange: {
      Regs r;
      for (uint32_t i = 0; i < n; ++i) r.push_back(bin(Op::add, coord(L, i, 0), ci32(op.int_attr("start"))));
      return r;
    }
    case OpKind::broadcast: {
      const ir::Type& src = f_.type(op.operands[0]);
      Layout S = L;
      for (size_t d = 0; d < src.shape.size(); ++d)
        if (src.shape[d] == 1 && t.shape[d] != 1) S = S.collapse(static_cast<int>(d));
      return get(op.operands[0], S);
    }
    case OpKind::expand_dims: return get(op.operands[0], L.drop_dim(static_cast<int>(op.int_attr("axis"))));
    case OpKind::channel_pop:
      // first run: read at its first use, and the layout recorded; the second reads it at the
      // pop itself (the channel_pop case of Lowerer::lower), once
      precompute_requests_.try_emplace(op.results[0], L);
      return channel_read(op, L);
    case OpKind::precompute:
      // A use asks for a flexible precompute result that was not computed ahead in this layout
      // (first run, or another layout): recorded, and computed here.
      precompute_requests_.try_emplace(op.results[0], L);
      return get(op.operands[0], L);
    case OpKind::trans: {
      const auto& perm = op.ints_attr("perm");
      std::vector<int64_t> inv(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
      return get(op.operands[0], L.permute(inv));
    }
    case OpKind::reshape: {
      auto S = L.reshape(f_.type(op.operands[0]).shape);
      if (!S) fail(&op, "reshape of a layout that is not linear in the flat index");
      return get(op.operands[0], *S);
    }
    default:
      if (ir::is_elementwise(op.kind)) return elementwise(op, L);
      fail(&op, "internal: not a flexible op");
  }
}

}  // namespace tilejit::jit::lower
