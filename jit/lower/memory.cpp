// Global memory: pointer loads, stores and atomics, and tensor windows (block_load/store/
// atomic_add) with their bounds predicates, vector accesses and TMA reduces.
#include "jit/lower/lowerer.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace tilejit::jit::lower {

Layout Lowerer::memory_layout(const ir::Type& t) const {
  return Layout::blocked(t.shape, warps_, vector_width(t.dtype, t.shape.back()));
}

void Lowerer::load(const ir::Op& op) {
  const ir::Type& t = f_.type(op.results[0]);
  pir::Ty ty = pir::scalar(t.dtype);
  if (t.is_scalar()) {
    order_global(op.operands[0], Access::read, std::nullopt);
    std::vector<V> a{scalar(op.operands[0])};
    if (op.operands.size() == 3) a = {a[0], scalar(op.operands[1]), scalar(op.operands[2])};
    frames_.back().scalars[op.results[0]] = emit(Op::load, ty, a);
    return;
  }
  check_shape(&op, t);
  const Layout& L = *plan_.natural[op.results[0]];
  Regs ptr = get(op.operands[0], L), mask, other;
  if (op.operands.size() == 3) {
    mask = get(op.operands[1], L);
    other = get(op.operands[2], L);
  }
  // after the operands: a conversion's barrier clears the record of unordered accesses
  order_global(op.operands[0], Access::read, L, {static_cast<int64_t>(op.operands[0])});
  auto scalar_path = [&] {
    Regs outr;
    for (size_t r = 0; r < ptr.size(); ++r)
      outr.push_back(mask.empty() ? emit(Op::load, ty, {ptr[r]}) : emit(Op::load, ty, {ptr[r], mask[r], other[r]}));
    return outr;
  };
  std::vector<ir::ValueId> uniform;  // mask and other: one value per group
  if (op.operands.size() == 3) uniform = {op.operands[1], op.operands[2]};
  const int g = pointer_vector_group(op.operands[0], t, L, uniform);
  if (g == 1) return put(op.results[0], L, scalar_path());
  // One vector load per group of g registers (one aligned run, one mask value): where every
  // group's mask holds; else (a tile crossing the mask's edge) the scalar loads.
  const auto words = static_cast<size_t>(g * ir::byte_size(t.dtype) / 4);
  auto vector_path = [&] {
    Regs outr;
    for (size_t h = 0; h < ptr.size(); h += static_cast<size_t>(g)) {
      Regs v = from_words(emit_multi(Op::load_vec, {ptr[h]}, words, pir::scalar(DType::u32), static_cast<int64_t>(words)), t.dtype);
      outr.insert(outr.end(), v.begin(), v.end());
    }
    return outr;
  };
  if (mask.empty()) return put(op.results[0], L, vector_path());
  V all = mask[0];
  for (size_t h = static_cast<size_t>(g); h < mask.size(); h += static_cast<size_t>(g)) all = land(all, mask[h]);
  put(op.results[0], L, pir_if_values(all, std::vector<pir::Ty>(ptr.size(), ty), vector_path, scalar_path));
}

int Lowerer::pointer_vector_group(ir::ValueId pointers, const ir::Type& t, const Layout& L, const std::vector<ir::ValueId>& uniform) {
  const int es = ir::byte_size(t.dtype);
  if (es != 2 && es != 4) return 1;
  const size_t last = t.shape.size() - 1;
  int g = register_run(L, last, es, 16);
  // every other register basis moves by whole groups along the last dim, so each group starts at
  // a multiple of g
  for (size_t k = 0; k < L.reg.size(); ++k)
    if ((int64_t{1} << k) >= g && L.reg[k][last] % g != 0) return 1;
  const AxisFacts p = axis_.of(pointers);
  while (g > 1 && (p.contiguity[last] % g != 0 || p.divisibility[last] % (g * es) != 0)) g /= 2;
  for (ir::ValueId u : uniform) {
    const AxisFacts m = axis_.of(u);
    while (g > 1 && m.constancy[last] % g != 0) g /= 2;
  }
  return g * es >= 4 ? g : 1;
}

std::optional<V> Lowerer::and_pred(std::optional<V> a, std::optional<V> b) {
  if (!a) return b;
  if (!b) return a;
  return land(*a, *b);
}

void Lowerer::store(const ir::Op& op) {
  ++memory_epoch_;  // load_at_use windows read before this may have changed
  const ir::Type& t = f_.type(op.operands[1]);
  if (t.is_scalar()) {
    order_global(op.operands[0], Access::write, std::nullopt);
    std::optional<V> pred = cmp(pir::Pred::eq, tid_, ci32(0));
    if (op.operands.size() == 3) pred = land(*pred, scalar(op.operands[2]));
    emit0(Op::store, {scalar(op.operands[0]), scalar(op.operands[1]), *pred});
    return;
  }
  check_shape(&op, t);
  Layout L = memory_layout(t);
  Regs ptr = get(op.operands[0], L), val = get(op.operands[1], L), mask;
  if (op.operands.size() == 3) mask = get(op.operands[2], L);
  // after the operands: a conversion's barrier clears the record of unordered accesses
  order_global(op.operands[0], Access::write, L, {static_cast<int64_t>(op.operands[0])});
  std::optional<V> own = owner(L);
  auto scalar_path = [&] {
    for (uint32_t r = 0; r < ptr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      std::optional<V> pred = and_pred(own, mask.empty() ? std::nullopt : std::optional<V>(mask[r]));
      if (pred) emit0(Op::store, {ptr[r], val[r], *pred});
      else emit0(Op::store, {ptr[r], val[r]});
    }
    return Regs{};
  };
  // As loads do: one vector store per group of g registers (an aligned run the pointers' AxisInfo
  // proves, one mask value) where every group's mask holds, else the element stores. Replicated
  // layouts (several threads own an element: predicated by owner) keep the element stores.
  std::vector<ir::ValueId> uniform;
  if (op.operands.size() == 3) uniform = {op.operands[2]};
  const int g = own ? 1 : pointer_vector_group(op.operands[0], t, L, uniform);
  if (g == 1) {
    scalar_path();
    return;
  }
  auto vector_path = [&] {
    for (size_t h = 0; h < ptr.size(); h += static_cast<size_t>(g)) {
      if (duplicate_reg(L, static_cast<uint32_t>(h))) continue;
      Regs args{ptr[h]};
      const Regs words = to_words(val, h, g, t.dtype);
      args.insert(args.end(), words.begin(), words.end());
      emit0(Op::store_vec, args);
    }
    return Regs{};
  };
  if (mask.empty()) {
    vector_path();
    return;
  }
  V all = mask[0];
  for (size_t h = static_cast<size_t>(g); h < mask.size(); h += static_cast<size_t>(g)) all = land(all, mask[h]);
  pir_if_values(all, {}, vector_path, scalar_path);
}

void Lowerer::pointer_atomic(const ir::Op& op) {
  // atomic_add, atomic_rmw and atomic_cas on pointers: (ptr, [compare,] value[, mask])
  ++memory_epoch_;  // load_at_use windows read before this may have changed
  const ir::Type& t = f_.type(op.results[0]);
  pir::Ty ty = pir::scalar(t.dtype);
  const bool cas = op.kind == OpKind::atomic_cas;
  const size_t values = cas ? 2 : 1;
  const bool masked = op.operands.size() == 2 + values;
  Op pop = Op::atomic_add;
  int64_t imm = 0;
  if (op.kind != OpKind::atomic_add) {
    pir::AtomicImm a;
    if (!cas) a.rmw = *ir::parse_atomic_rmw(op.str_attr("rmw"));
    a.sem = *ir::parse_mem_sem(op.str_attr("sem"));
    a.scope = *ir::parse_mem_scope(op.str_attr("scope"));
    pop = cas ? Op::atomic_cas : Op::atomic_rmw;
    imm = a.encode();
  }
  if (t.is_scalar()) {
    order_global(op.operands[0], used_.count(op.results[0]) ? Access::read_write : Access::write, std::nullopt);
    V pred = cmp(pir::Pred::eq, tid_, ci32(0));
    if (masked) pred = land(pred, scalar(op.operands.back()));
    std::vector<V> args{scalar(op.operands[0])};
    for (size_t i = 1; i <= values; ++i) args.push_back(scalar(op.operands[i]));
    args.push_back(pred);
    V old = emit(pop, ty, std::move(args), imm);
    // thread 0 holds the previous value; every thread needs it (scalars are uniform)
    reserve_smem(8);
    emit0(Op::store_shared, {ci32(0), old, cmp(pir::Pred::eq, tid_, ci32(0))});
    emit0(Op::barrier, {});
    frames_.back().scalars[op.results[0]] = emit(Op::load_shared, ty, {ci32(0)});
    emit0(Op::barrier, {});
    return;
  }
  check_shape(&op, t);
  const Layout& L = *plan_.natural[op.results[0]];
  Regs ptr = get(op.operands[0], L), mask;
  std::vector<Regs> val;
  for (size_t i = 1; i <= values; ++i) val.push_back(get(op.operands[i], L));
  if (masked) mask = get(op.operands.back(), L);
  // after the operands: a conversion's barrier clears the record of unordered accesses
  order_global(op.operands[0], used_.count(op.results[0]) ? Access::read_write : Access::write, L,
               {static_cast<int64_t>(op.operands[0])});
  std::optional<V> own = owner(L);
  Regs old(ptr.size());
  for (uint32_t r = 0; r < ptr.size(); ++r) {
    if (duplicate_reg(L, r)) continue;
    std::optional<V> pred = and_pred(own, mask.empty() ? std::nullopt : std::optional<V>(mask[r]));
    std::vector<V> args{ptr[r]};
    for (const Regs& v : val) args.push_back(v[r]);
    if (pred) args.push_back(*pred);
    old[r] = emit(pop, ty, std::move(args), imm);
  }
  if (L.has_replication()) {
    // Only owners performed the update: share the previous values with the replicas.
    int64_t es = ir::byte_size(t.dtype);
    reserve_smem(t.numel() * es);
    for (uint32_t r = 0; r < ptr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      V off = bin(Op::mul, tile_offset(L, r), ci32(es));
      if (own) emit0(Op::store_shared, {off, old[r], *own});
      else emit0(Op::store_shared, {off, old[r]});
    }
    emit0(Op::barrier, {});
    for (uint32_t r = 0; r < ptr.size(); ++r) old[r] = emit(Op::load_shared, ty, {bin(Op::mul, tile_offset(L, r), ci32(es))});
    emit0(Op::barrier, {});
  }
  put(op.results[0], L, old);
}

void Lowerer::window(const ir::Op& op, size_t first_offset, const Layout& L, Regs& addr, Regs& inb, V* all_ok) {
  const TensorDesc& td = tensors_.at(op.operands[0]);
  const auto& dims = op.ints_attr("dims");
  size_t rank = td.sizes.size();
  // Offsets are taken at their value, as the interpreter does. Types that fit in i32 are computed
  // in 32 bits (a tile coordinate added to an offset near 2^31 wraps negative: out of range, as the
  // sum is). i64 / u32 / u64 offsets in 64 bits, tested unsigned against the size (negative values
  // are out of range); u64 values >= 2^63 become 2^63 - 1, which coordinates cannot wrap below 2^63.
  // So are constant i32 offsets whose coordinates would wrap: nvrtc's optimizer rewrote another
  // index as sext(C + x) - C from such a wrapping sum, an address 2^32 elements off (fuzzer).
  std::vector<V> off, size64(rank, 0);
  std::vector<bool> wide(rank, false);
  for (size_t d = 0; d < rank; ++d) {
    const ir::ValueId o = op.operands[first_offset + d];
    const DType od = f_.type(o).dtype;
    const std::optional<int64_t> c = facts_.constant(o);
    constexpr int64_t kTileExtentBound = int64_t{1} << 20;  // more than any tile dimension
    if (ir::fits_i32(od) && !(c && *c > std::numeric_limits<int32_t>::max() - kTileExtentBound)) {
      off.push_back(cast(scalar(o), DType::i32));
      continue;
    }
    wide[d] = true;
    V x = cast(scalar(o), DType::i64);
    if (od == DType::u64) {
      V big = cmp(pir::Pred::lt, x, cint(DType::i64, 0));
      x = emit(Op::select, pir::scalar(DType::i64), {big, cint(DType::i64, std::numeric_limits<int64_t>::max()), x});
    }
    off.push_back(x);
    size64[d] = cast(td.sizes[d], DType::u64);
  }
  auto in_range = [&](size_t d, V x) {  // x in [0, size of dim d)
    if (wide[d]) return cmp(pir::Pred::lt, cast(x, DType::u64), size64[d]);
    return land(cmp(pir::Pred::ge, x, ci32(0)), cmp(pir::Pred::lt, x, td.sizes[d]));
  };
  // Fixed (non-tile) dims: one uniform check and one address term.
  V base_ok = emit(Op::constant, pir::scalar(DType::i1), {}, 1);
  V base_off = cint(DType::i64, 0);
  for (size_t d = 0; d < rank; ++d) {
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end()) continue;
    base_ok = land(base_ok, in_range(d, off[d]));
    base_off = bin(Op::add, base_off, bin(Op::mul, cast(off[d], DType::i64), td.strides[d]));
  }
  // Per tile dim, the in-bounds test and the address term of each distinct coordinate a
  // register can have, computed once: registers differ by compile-time steps, and a declared
  // unit innermost stride turns the innermost term into a constant (an address immediate).
  bool unit_last = td.spec.contiguous_last;
  std::vector<std::map<int64_t, std::pair<V, V>>> per_dim(dims.size());  // coord const -> (ok, i64 term)
  auto term = [&](size_t i, uint32_t r) -> std::pair<V, V> {
    auto d = static_cast<size_t>(dims[i]);
    int64_t rc = L.reg_coords(r)[i];
    auto it = per_dim[i].find(rc);
    if (it != per_dim[i].end()) return it->second;
    V c = rc == 0 ? thread_coords(L)[i] : bin(Op::add, thread_coords(L)[i], ci32(rc));
    V x = bin(Op::add, off[d], wide[d] ? cast(c, DType::i64) : c);
    V ok = in_range(d, x);
    V t = (unit_last && d == rank - 1) ? cast(x, DType::i64) : bin(Op::mul, cast(x, DType::i64), td.strides[d]);
    return per_dim[i][rc] = {ok, t};
  };
  bool add_ok = additive(L);
  pir::Ty pty = pir::pointer(f_.type(op.operands[0]).dtype);
  V thread_ptr = 0;
  std::vector<std::pair<V, V>> base_terms;
  if (add_ok) {
    // one per-thread pointer; each register adds (rc * stride) for its register coordinates
    V o = base_off;
    for (size_t i = 0; i < dims.size(); ++i) o = bin(Op::add, o, term(i, 0).second);
    thread_ptr = emit(Op::gep, pty, {td.ptr, o});
  }
  for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) {
    V ok = base_ok;
    V extra = 0;
    bool has_extra = false;
    for (size_t i = 0; i < dims.size(); ++i) {
      auto [okd, t] = term(i, r);
      ok = land(ok, okd);
      if (!add_ok) continue;
      auto d = static_cast<size_t>(dims[i]);
      int64_t rc = L.reg_coords(r)[i];
      if (rc == 0) continue;
      V step = (unit_last && d == rank - 1) ? cint(DType::i64, rc) : bin(Op::mul, cint(DType::i64, rc), td.strides[d]);
      extra = has_extra ? bin(Op::add, extra, step) : step;
      has_extra = true;
    }
    if (add_ok) {
      addr.push_back(has_extra ? emit(Op::gep, pty, {thread_ptr, extra}) : thread_ptr);
    } else {
      V o = base_off;
      for (size_t i = 0; i < dims.size(); ++i) o = bin(Op::add, o, term(i, r).second);
      addr.push_back(emit(Op::gep, pty, {td.ptr, o}));
    }
    inb.push_back(ok);
  }
  if (all_ok) {
    // every element in bounds = every distinct per-dim test holds (short, unlike a chain over
    // all registers, which also makes LLVM's implied-condition analysis quadratic)
    V all = base_ok;
    for (const auto& terms : per_dim)
      for (const auto& [rc, t] : terms) all = land(all, t.first);
    *all_ok = all;
  }
}

int64_t Lowerer::divisor(ir::ValueId v) {
  constexpr int64_t kCap = int64_t{1} << 20;
  if (auto it = divisors_.find(v); it != divisors_.end()) return it->second;
  int64_t d = 1;
  if (auto loop = iv_loop_.find(v); loop != iv_loop_.end()) {
    d = std::min(divisor(loop->second->operands[0]), divisor(loop->second->operands[2]));
  } else if (auto it = def_.find(v); it != def_.end()) {
    const ir::Op& op = *it->second;
    auto low_bit = [&](int64_t x) { return x == 0 ? kCap : std::min(kCap, x & -x); };
    switch (op.kind) {
      case OpKind::constant:
        if (auto* i = std::get_if<int64_t>(&op.attrs.at("value"))) d = low_bit(*i < 0 ? -*i : *i);
        break;
      case OpKind::mul: d = std::min(kCap, divisor(op.operands[0]) * divisor(op.operands[1])); break;
      case OpKind::add: case OpKind::sub: case OpKind::minimum: case OpKind::maximum:
        d = std::min(divisor(op.operands[0]), divisor(op.operands[1]));
        break;
      case OpKind::select: d = std::min(divisor(op.operands[1]), divisor(op.operands[2])); break;
      case OpKind::cast:
        if (ir::is_int(f_.type(op.operands[0]).dtype)) d = divisor(op.operands[0]);
        break;
      default: break;
    }
  }
  return divisors_[v] = d;
}

int Lowerer::vector_group(const ir::Op& op, size_t first_offset, const Layout& L, DType d) {
  int es = ir::byte_size(d);
  if (es != 2 && es != 4) return 1;
  const TensorDesc& td = tensors_.at(op.operands[0]);
  const auto& dims = op.ints_attr("dims");
  auto rank = static_cast<int64_t>(td.sizes.size());
  if (!td.spec.contiguous_last || dims.back() != rank - 1) return 1;
  const int g = register_run(L, dims.size() - 1, es, std::min(16, td.spec.align_bytes));
  if (g * es < 4 || divisor(op.operands[first_offset + static_cast<size_t>(rank - 1)]) % g != 0) return 1;
  return g;
}

int Lowerer::register_run(const Layout& L, size_t last, int es, int max_bytes) {
  int g = 1;
  for (size_t k = 0; k < L.reg.size() && g * es * 2 <= max_bytes; ++k) {
    Coord want(L.shape.size(), 0);
    want[last] = g;
    if (L.reg[k] != want) break;
    g *= 2;
  }
  for (const auto* bs : {&L.lane, &L.warp})
    for (const Coord& c : *bs)
      if (c[last] % g != 0) return 1;
  return g;
}

Regs Lowerer::pir_if_values(V cond, const std::vector<pir::Ty>& types, const std::function<Regs()>& then_body,
                            const std::function<Regs()>& else_body) {
  pir::Inst in;
  in.op = Op::if_;
  in.args = {cond};
  for (int side = 0; side < 2; ++side) {
    pir::Block pb;
    push_block(&pb);
    frames_.emplace_back();
    Regs ys = side == 0 ? then_body() : else_body();
    pir::Inst y;
    y.op = Op::yield;
    y.args = ys;
    pb.insts.push_back(std::move(y));
    frames_.pop_back();
    pop_block();
    in.regions.push_back(std::move(pb));
  }
  for (const pir::Ty& t : types) in.results.push_back(out_.new_value(t));
  Regs r = in.results;
  blocks_.back()->insts.push_back(std::move(in));
  return r;
}

Regs Lowerer::to_words(const Regs& vals, size_t head, int g, DType d) {
  Regs w;
  for (int j = 0; j < g; j += ir::byte_size(d) == 2 ? 2 : 1) {
    size_t r = head + static_cast<size_t>(j);
    if (ir::byte_size(d) == 2) w.push_back(pack(vals[r], vals[r + 1]));
    else w.push_back(emit(Op::bitcast, pir::scalar(DType::u32), {vals[r]}));
  }
  return w;
}

Regs Lowerer::from_words(const Regs& words, DType d) {
  Regs v;
  for (V w : words) {
    if (ir::byte_size(d) == 2) {
      Regs two = emit_multi(Op::unpack2, {w}, 2, pir::scalar(d), 0);
      v.insert(v.end(), two.begin(), two.end());
    } else {
      v.push_back(emit(Op::bitcast, pir::scalar(d), {w}));
    }
  }
  return v;
}

void Lowerer::block_load(const ir::Op& op) {
  if (plan_.hopper.tiles.count(&op)) return smem_tile_load(op);
  check_shape(&op, f_.type(op.results[0]));
  const Layout& L = *plan_.natural[op.results[0]];
  order_global(op.operands[0], Access::read, L, window_key(op, 1));
  put(op.results[0], L, block_load_regs(op, L));
  if (op.attrs.count("at_use")) reloadable_[op.results[0]] = {memory_epoch_, frames_.size()};
}

Regs Lowerer::block_load_regs(const ir::Op& op, const Layout& L) {
  if (L.without_zero_regs().reg.size() != L.reg.size()) {
    const Regs compact = block_load_regs(op, L.without_zero_regs());
    Regs out;
    for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) {
      uint32_t c = 0, bit = 0;  // r's bits at the non-zero bases, in order
      for (size_t i = 0; i < L.reg.size(); ++i) {
        if (std::all_of(L.reg[i].begin(), L.reg[i].end(), [](int64_t x) { return x == 0; })) continue;
        c |= ((r >> i) & 1u) << bit++;
      }
      out.push_back(compact[c]);
    }
    return out;
  }
  const ir::Type& t = f_.type(op.results[0]);
  Regs addr, inb;
  V all_ok = 0;
  window(op, 1, L, addr, inb, &all_ok);
  V pad = cfloat(DType::f64, op.float_attr("padding"));
  // (integer padding converts like a cast, as the interpreter does: -2.0 pads a u8 window with 0)
  V other = ir::is_float(t.dtype) ? cast(pad, t.dtype) : cint(t.dtype, ir::wrap_int(t.dtype, ir::float_to_int(t.dtype, op.float_attr("padding"))));
  pir::Ty ty = pir::scalar(t.dtype);
  auto scalar_path = [&] {
    Regs r;
    for (size_t i = 0; i < addr.size(); ++i) r.push_back(emit(Op::load, ty, {addr[i], inb[i], other}));
    return r;
  };
  int g = vector_group(op, 1, L, t.dtype);
  if (g == 1) return scalar_path();
  // Interior windows take one vector load per group; windows that cross an edge, the scalar path.
  size_t words = static_cast<size_t>(g * ir::byte_size(t.dtype) / 4);
  return pir_if_values(all_ok, std::vector<pir::Ty>(addr.size(), ty), [&] {
    Regs r;
    for (size_t h = 0; h < addr.size(); h += static_cast<size_t>(g)) {
      Regs w = emit_multi(Op::load_vec, {addr[h]}, words, pir::scalar(DType::u32), static_cast<int64_t>(words));
      Regs v = from_words(w, t.dtype);
      r.insert(r.end(), v.begin(), v.end());
    }
    return r;
  }, scalar_path);
}

void Lowerer::block_atomic(const ir::Op& op) {
  ++memory_epoch_;
  const ir::Type& t = f_.type(op.operands[1]);
  check_shape(&op, t);
  Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
  Regs val = get(op.operands[1], L);
  // after the operands: a conversion's barrier clears the record of unordered accesses
  const ir::AtomicRmw rmw = *ir::parse_atomic_rmw(op.str_attr("reduce"));
  order_global(op.operands[0], Access::write, L, window_key(op, 2), rmw == ir::AtomicRmw::add, plan_.hopper.reduces.count(&op) > 0);
  std::optional<V> own = owner(L);
  // ordered (after_semaphore): the add waits until *semaphore >= target (signal_after: and then
  // signals a semaphore, as signal_add after it would)
  const std::optional<ir::WindowOrder> order = ir::window_order(op);
  const bool ordered = order.has_value();
  V sem = ordered ? scalar(order->semaphore) : 0, target = ordered ? scalar(order->target) : 0;
  // max / min / and / or / xor: one relaxed GPU-scope atom per element (no TMA path)
  pir::AtomicImm imm;
  imm.rmw = rmw;
  imm.sem = ir::MemSem::relaxed;
  imm.scope = ir::MemScope::gpu;
  auto element_updates = [&] {
    if (ordered) {  // every thread adds: thread 0 waits, the barrier hands the acquired view on
      pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] { emit0(Op::sem_wait, {sem, target}); });
      emit0(Op::barrier, {});
    }
    Regs addr, inb;
    window(op, 2, L, addr, inb);
    for (uint32_t r = 0; r < addr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      if (rmw == ir::AtomicRmw::add) emit(Op::atomic_add, pir::scalar(t.dtype), {addr[r], val[r], *and_pred(own, inb[r])});
      else emit(Op::atomic_rmw, pir::scalar(t.dtype), {addr[r], val[r], *and_pred(own, inb[r])}, imm.encode());
    }
  };
  auto it = plan_.hopper.reduces.find(&op);
  if (it == plan_.hopper.reduces.end()) element_updates();
  else tma_bulk_write(op, it->second, L, val, element_updates, ordered, sem, target);
  // (the reduce writer waits for an ordered add's turn and signals it itself)
  if (order && order->signal && (it == plan_.hopper.reduces.end() || !it->second.loop)) signal_after_writes(scalar(*order->signal), ci32(1));
}

// A block store or add-reduce planned for TMA (HopperPlan::reduces): the tile goes into the
// swizzled staging tile (rows of 128 bytes per column chunk), then bulk_issuer() issues one bulk tensor
// store / add per chunk; `fallback` writes element by element where an offset may be negative.
void Lowerer::tma_bulk_write(const ir::Op& op, const TmaReduce& red, const Layout& L, const Regs& val,
                             const std::function<void()>& fallback, bool ordered, V sem, V target) {
  if (red.loop) return stage_for_writer(red, L, val);  // (HopperPlan::reduce_writer issues it)
  const auto element_updates = fallback;
  V issuer = bulk_issuer();
  // offsets not known to lie in [0, 2^31 - 1 - the box's extent]: TMA only when they do (it faults
  // otherwise); else every thread adds its elements, clipped at the tensor's edges, as the generic
  // path does
  V tma_ok = 0;
  if (red.check_coordinates) {
    tma_ok = emit(Op::constant, pir::scalar(DType::i1), {}, 1);
    const int64_t rank = static_cast<int64_t>(tensors_.at(op.operands[0]).sizes.size());
    const int64_t row_dim = op.ints_attr("dims")[0];
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t extent = red.extent(d, row_dim, rank);
      const ir::ValueId offset = op.operands[static_cast<size_t>(d) + 2];
      V x = cast(scalar(offset), DType::i32);  // (TMA offsets have types that fit i32: offsets_fit_i32)
      tma_ok = land(tma_ok, land(cmp(pir::Pred::ge, x, ci32(0)), cmp(pir::Pred::le, x, ci32(INT32_MAX - extent))));
    }
  }
  V staging = ci32(plan_.hopper.reduce_staging);  // (offset in shared memory)
  if (red.staging_tile) {
    // Staged in a tile (TmaReduce::staging_tile): its copy has landed, and every warp's MMAs
    // reading it have retired (each warp waits for its own; the barrier for the others).
    const SmemTile& t = plan_.hopper.tiles.at(red.staging_tile);
    wait_pending();  // (the value stored came from them: normally nothing is left in flight)
    if (t.ring) {
      const SmemRing& ring = plan_.hopper.rings.at(t.ring);
      RingState& st = rings_.at(t.ring);
      wait_ring_tile(t, st);
      staging = ring.stages == 1 ? ci32(ring.base + t.offset)
                                 : bin(Op::add, ci32(ring.base + t.offset), bin(Op::mul, st.stage, ci32(ring.stage_bytes)));
    } else {
      emit0(Op::mbar_wait, {smem_at(t.barrier), ci32(0)});
      staging = ci32(t.offset);
    }
    emit0(Op::barrier, {});
  } else if (reduce_staging_free_in_ != block_ids_.back()) {
    // The staging tile is free once the previous reduce has read it (bulk_issuer() issued it), unless a
    // barrier after such a wait was already met in this block (e.g. staging dQ's A operand).
    pir_if(issuer, [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
    emit0(Op::barrier, {});
  }
  reduce_staging_free_in_ = -1;
  stage_registers(red, L, val, staging, red.offsets_at_store);
  emit0(Op::fence_proxy_async, {});
  if (red.staging_tile && role_barrier_) {
    // A warp role's epilogue (the forward's O over its last V): only the issuing warp waits for
    // every warp's staging; the others arrive and go on to their next tile (FlashAttention-3's
    // epilogue). A barrier id of its own: the fast warps' next arrival cannot meet this instance,
    // since warp 0 passes it before the role's next barrier. Not a barrier of all threads for the
    // ordering of global accesses (memory_order.cpp): the other warps do not wait.
    const int saved = std::exchange(role_barrier_, 0);
    const int64_t threads = 32 * warps_ | pir::kBarrierUnfenced;
    V warp0 = cmp(pir::Pred::eq, warp_, ci32(0));
    pir_if(warp0, [&] { emit0(Op::named_barrier_sync, {ci32(kStoreIssueBarrier)}, threads); });
    pir_if(lnot(warp0), [&] { emit0(Op::named_barrier_arrive, {ci32(kStoreIssueBarrier)}, threads); });
    role_barrier_ = saved;
  } else {
    emit0(Op::barrier, {});
  }
  V base = emit(Op::smem_addr, pir::scalar(DType::u32), {staging});
  if (red.check_coordinates) pir_if(lnot(tma_ok), element_updates);
  pir_if(red.check_coordinates ? land(issuer, tma_ok) : issuer, [&] {
    // ordered: only this thread issues the add, so only it waits (no barrier for the others)
    if (ordered) {
      emit0(Op::sem_wait, {sem, target});
      emit0(Op::fence_proxy_async_global, {});  // the TMA add comes after what the signals released
    }
    issue_tma_chunks(op, red, base, whole_tile_part(red)[0].chunks, [&](ir::ValueId v) { return scalar(v); });
    emit0(Op::bulk_commit, {});
  });
  if (red.staging_tile && plan_.hopper.tiles.at(red.staging_tile).ring) {
    // the tile's stage goes back once TMA has read the staging: the issuing thread waits for that
    // before its warp's arrival; the other warps are done with it already
    const SmemTile& t = plan_.hopper.tiles.at(red.staging_tile);
    RingState& st = rings_.at(t.ring);
    st.released.insert(t.load);
    pir_if(cmp(pir::Pred::eq, lane_, ci32(0)), [&] {
      pir_if(issuer, [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
      emit0(Op::mbar_arrive, {stage_barrier(t.empty, st.stage)});
    });
  }
}

void Lowerer::issue_tma_chunks(const ir::Op& op, const TmaReduce& red, V base, const std::vector<int64_t>& chunks,
                               const std::function<V(ir::ValueId)>& offset) {
  const size_t rank = tensors_.at(op.operands[0]).sizes.size();
  const int64_t per_chunk = red.chunk_cols();
  const V map = tensor_map(red.param_index, red.box, red.swizzle_bytes());
  for (int64_t k : chunks) {
    std::vector<V> args{bin(Op::add, base, cint(DType::u32, k * red.chunk_bytes())), map};
    for (size_t i = 0; i < rank; ++i) {  // innermost first
      V x = cast(offset(op.operands[2 + rank - 1 - i]), DType::i32);
      args.push_back(i == 0 && k ? bin(Op::add, x, ci32(per_chunk * k)) : x);
    }
    emit0(red.store_only ? Op::tma_store : Op::tma_reduce_add, args, static_cast<int64_t>(rank));
  }
}

void Lowerer::stage_registers(const TmaReduce& red, const Layout& L, const Regs& val, V staging, bool at_store) {
  // element (r, c): 128 / es a swizzled row (narrow: 32 / es a plain row), the TMA copy reads the
  // chunks of that many columns;
  // 16-bit elements two at a time where a thread holds columns c, c + 1 (c even) of a row
  const int64_t es = red.elem_bytes;
  // at_store: from opaque copies of the lane and warp (not the coordinates: LLVM would share those
  // with the same coordinates computed earlier, held in registers from there to here)
  const std::vector<V> tc = at_store ? thread_coords_at_use(L) : thread_coords(L);
  std::map<Coord, uint32_t> reg_of;
  if (es == 2 && additive(L))
    for (uint32_t r = 0; r < val.size(); ++r) reg_of.emplace(L.reg_coords(r), r);
  for (uint32_t r = 0; r < val.size(); ++r) {
    if (duplicate_reg(L, r)) continue;
    V value = val[r];
    if (!reg_of.empty()) {
      const Coord c = L.reg_coords(r);
      if (c[1] % 2 == 1 && reg_of.count({c[0], c[1] - 1})) continue;  // stored with its pair
      if (auto pair = reg_of.find({c[0], c[1] + 1}); c[1] % 2 == 0 && pair != reg_of.end()) value = pack(val[r], val[pair->second]);
    }
    const V row = coord(L, r, 0, tc[0]), col = coord(L, r, 1, tc[1]);
    V off = red.swizzle_bytes() ? swizzled_offset(row, col, es, red.chunk_bytes()) : chunked_offset(row, col, es, red.chunk_cols(), red.rows);
    store_shared_at(bin(Op::add, off, staging), value, std::nullopt);
  }
}

void Lowerer::block_store(const ir::Op& op) {
  if (op.attrs.count("reduce")) return block_atomic(op);
  if (auto it = plan_.hopper.reduces.find(&op); it != plan_.hopper.reduces.end()) {  // a TMA store (StoreOptions::tma)
    ++memory_epoch_;
    const ir::Type& t = f_.type(op.operands[1]);
    check_shape(&op, t);
    const Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
    const Regs val = get(op.operands[1], L);
    order_global(op.operands[0], Access::write, L, window_key(op, 2), false, /*async=*/true);
    const auto element_stores = [&] {
      Regs addr, inb;
      window(op, 2, L, addr, inb);
      std::optional<V> own = owner(L);
      for (uint32_t r = 0; r < addr.size(); ++r)
        if (!duplicate_reg(L, r)) emit0(Op::store, {addr[r], val[r], *and_pred(own, inb[r])});
    };
    tma_bulk_write(op, it->second, L, val, element_stores, false, 0, 0);
    return;
  }
  ++memory_epoch_;  // load_at_use windows read before this may have changed
  const ir::Type& t = f_.type(op.operands[1]);
  check_shape(&op, t);
  // Store from the value's own layout when it has one: no exchange through shared memory.
  Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
  Regs val = get(op.operands[1], L), addr, inb;
  V all_ok = 0;
  window(op, 2, L, addr, inb, &all_ok);
  // after the operands: a conversion's barrier clears the record of unordered accesses (a store
  // that asked for TMA is ordered as one: memory_order.cpp)
  const bool asked_tma = op.attrs.count(ir::kTmaStoreAttr) && op.int_attr(ir::kTmaStoreAttr) != 0;
  order_global(op.operands[0], Access::write, L, window_key(op, 2), false, asked_tma);
  std::optional<V> own = owner(L);
  auto scalar_path = [&] {
    for (uint32_t r = 0; r < addr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      emit0(Op::store, {addr[r], val[r], *and_pred(own, inb[r])});
    }
    return Regs{};
  };
  int g = vector_group(op, 2, L, t.dtype);
  if (g == 1) {
    scalar_path();
    return;
  }
  pir_if_values(all_ok, {}, [&] {
    auto stores = [&] {
      for (size_t h = 0; h < addr.size(); h += static_cast<size_t>(g)) {
        if (duplicate_reg(L, static_cast<uint32_t>(h))) continue;
        Regs args{addr[h]};
        Regs w = to_words(val, h, g, t.dtype);
        args.insert(args.end(), w.begin(), w.end());
        emit0(Op::store_vec, args);
      }
    };
    if (own) pir_if(*own, stores);
    else stores();
    return Regs{};
  }, scalar_path);
}

}  // namespace tilejit::jit::lower
