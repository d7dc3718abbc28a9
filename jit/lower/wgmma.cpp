// Other wgmma dots, with shared-memory tiles (jit/wgmma_plan.hpp): TMA copies once or through rings
// ahead of loops, the staged A operand, and the bookkeeping of wgmma groups still in flight.
#include "jit/lower/lowerer.hpp"

#include <algorithm>
#include <bit>
#include <map>
#include <unordered_set>

namespace tilejit::jit::lower {

V Lowerer::smem_at(int64_t offset) { return emit(Op::smem_addr, pir::scalar(DType::u32), {ci32(offset)}); }

void Lowerer::hopper_init() {
  const HopperPlan& h = plan_.hopper;
  scratch_base_ = h.persistent_bytes;
  smem_bytes_ = std::max(smem_bytes_, h.persistent_bytes);
  if (h.tiles.empty()) return;
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
    for (const ir::Op* op : h.tile_order)
      if (const SmemTile& t = h.tiles.at(op); !t.ring) emit0(Op::mbar_init, {smem_at(t.barrier), ci32(1)});
    for (const ir::Op* loop : h.ring_order)
      if (!h.rings.at(loop).follower()) init_ring_barriers(h.rings.at(loop));
    if (h.reduce_writer) init_reduce_writer();
    emit0(Op::fence_mbar_init, {});
  });
  emit0(Op::barrier, {});
}

void Lowerer::init_ring_barriers(const SmemRing& r, bool counters) {
  if (r.producer) {  // per tile: full (the producer's copy, 1 arrival + bytes), empty (every consumer warp)
    for (const ir::Op* l : r.loads)
      for (int s = 0; s < r.stages; ++s) {
        const SmemTile& t = plan_.hopper.tiles.at(l);
        emit0(Op::mbar_init, {smem_at(t.full + 8 * s), ci32(1)});
        emit0(Op::mbar_init, {smem_at(t.empty + 8 * s), ci32(plan_.num_warps)});
      }
    return;
  }
  for (int s = 0; s < r.stages; ++s) {
    emit0(Op::mbar_init, {smem_at(r.full + 8 * s), ci32(1)});
    if (counters) emit(Op::atom_shared, pir::scalar(DType::u32), {smem_at(r.released + 8 * s), cint(DType::u32, 0)}, pir::kAtomSharedExch);
  }
}

void Lowerer::reset_ring(const SmemRing& r) {
  emit0(Op::barrier, {});
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
    for (int s = 0; s < r.stages; ++s) emit0(Op::mbar_inval, {smem_at(r.full + 8 * s)});
    init_ring_barriers(r, /*counters=*/false);  // each run leaves them at a multiple of the warp count
    emit0(Op::fence_mbar_init, {});
  });
  emit0(Op::barrier, {});
}

void Lowerer::issue_tile(const SmemTile& t, V dst, V bar, const ir::Op* loop, V counter_value) {
  const ir::Op& load = *t.load;
  const size_t rank = load.operands.size() - 1;
  // Offsets computed in the loop body are evaluated again with the counter of the prefetched
  // iteration (the planner collected their scalar ops).
  std::map<ir::ValueId, V> at_counter;
  if (loop) {
    at_counter[loop->regions[0].args[0]] = counter_value;
    for (const ir::Op* op : t.offset_ops) {
      std::vector<V> a;
      const bool of_tensor = op->kind == OpKind::tensor_ptr || op->kind == OpKind::tensor_dim || op->kind == OpKind::tensor_stride;
      if (!of_tensor)
        for (ir::ValueId o : op->operands) a.push_back(at_counter.count(o) ? at_counter.at(o) : scalar(o));
      V r = 0;
      auto tensor = [&] { return tensors_.at(op->operands[0]); };
      const auto dim = [&] { return static_cast<size_t>(op->int_attr("dim")); };
      if (op->kind == OpKind::constant) r = constant_value(f_.type(op->results[0]).dtype, op->attrs.at("value"));
      else if (op->kind == OpKind::load) r = emit(Op::load, pir::scalar(f_.type(op->results[0]).dtype), a);
      else if (op->kind == OpKind::tensor_ptr) r = tensor().ptr;
      else if (op->kind == OpKind::tensor_dim) r = tensor().sizes.at(dim());
      else if (op->kind == OpKind::tensor_stride) r = tensor().strides.at(dim());
      else r = scalar_op(*op, a);
      at_counter[op->results[0]] = r;
    }
  }
  std::vector<V> off;
  for (size_t d = 0; d < rank; ++d) {
    ir::ValueId v = load.operands[1 + d];
    off.push_back(cast(at_counter.count(v) ? at_counter.at(v) : scalar(v), DType::i32));
  }
  V map = tensor_map(t.param_index, t.box, t.swizzle_bytes());
  for (int64_t c = 0; c < t.cols / t.chunk_cols(); ++c) {
    std::vector<V> args{bin(Op::add, dst, cint(DType::u32, c * t.chunk_bytes())), map};
    for (size_t i = 0; i < rank; ++i) {  // innermost first
      V x = off[rank - 1 - i];
      args.push_back(i == 0 && c ? bin(Op::add, x, ci32(t.chunk_cols() * c)) : x);
    }
    args.push_back(bar);
    emit0(Op::tma_load, args, static_cast<int64_t>(rank));
  }
}

Regs Lowerer::smem_vector_regs(const SmemTile& t, const Layout& L) {
  const SmemRing& r = plan_.hopper.rings.at(t.ring);
  if (r.producer) wait_ring_tile(t, rings_.at(t.ring));  // (once an iteration; freed at its end, ring_bottom)
  const V stage = bin(Op::add, ci32(r.base + t.offset), bin(Op::mul, rings_.at(t.ring).stage, ci32(r.stage_bytes)));
  const DType d = f_.type(t.load->results[0]).dtype;
  Regs regs;
  if (additive(L)) {
    // the thread's element in this stage through an opaque copy, the registers' steps as address
    // immediates: LLVM hoisted every register's offset (16 values at S^T's column layout) and held
    // them through the loop (decision 103)
    const V base = emit_multi(Op::opaque, {bin(Op::add, stage, bin(Op::mul, thread_coords(L)[0], ci32(t.elem_bytes)))}, 1,
                              pir::scalar(DType::i32), pir::kOpaqueCopy)[0];
    for (uint32_t i = 0; i < static_cast<uint32_t>(L.num_regs()); ++i) {
      const int64_t step = L.reg_coords(i)[0] * t.elem_bytes;
      regs.push_back(load_shared_at(step ? bin(Op::add, base, ci32(step)) : base, d));
    }
    return regs;
  }
  for (uint32_t i = 0; i < static_cast<uint32_t>(L.num_regs()); ++i)
    regs.push_back(load_shared_at(bin(Op::add, stage, bin(Op::mul, coord(L, i, 0), ci32(t.elem_bytes))), d));
  return regs;
}

void Lowerer::smem_tile_load(const ir::Op& op) {
  const SmemTile& t = plan_.hopper.tiles.at(&op);
  if (t.vector) {  // in this iteration's stage (ring_top waited for it); read at each use
    check_shape(&op, f_.type(op.results[0]));
    const Layout& L = *plan_.natural[op.results[0]];
    put(op.results[0], L, smem_vector_regs(t, L));
    smem_vectors_.insert(op.results[0]);
    return;
  }
  if (t.ring) return;  // the ring of its loop copies it
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
    V bar = smem_at(t.barrier);
    emit0(Op::mbar_expect_tx, {bar, ci32(t.bytes())});
    issue_tile(t, smem_at(t.offset), bar);
  });
}

V Lowerer::ring_stage_addr(const SmemRing& r, V stage, int64_t offset) {
  return bin(Op::add, smem_at(r.base + offset), cast(bin(Op::mul, stage, ci32(r.stage_bytes)), DType::u32));
}

void Lowerer::ring_issue(const ir::Op& loop, const SmemRing& r, const RingState& st, V j, V s) {
  int64_t bytes = 0;
  for (const ir::Op* l : r.loads) bytes += plan_.hopper.tiles.at(l).bytes();
  V full = bin(Op::add, smem_at(r.full), cast(bin(Op::mul, s, ci32(8)), DType::u32));
  emit0(Op::mbar_expect_tx, {full, ci32(bytes)});
  V counter = bin(Op::add, st.lb, bin(Op::mul, j, st.step));
  for (const ir::Op* l : r.loads) {
    const SmemTile& t = plan_.hopper.tiles.at(l);
    issue_tile(t, ring_stage_addr(r, s, t.offset), full, &loop, counter);
  }
}

Lowerer::RingState Lowerer::ring_bounds(const ir::Op& loop) {
  RingState st;
  st.lb = cast(scalar(loop.operands[0]), DType::i32);
  st.step = cast(scalar(loop.operands[2]), DType::i32);
  st.trips = trip_count(st.lb, cast(scalar(loop.operands[1]), DType::i32), st.step);
  return st;
}

void Lowerer::ring_prologue(const ir::Op& loop, const SmemRing& r) {
  if (r.producer) {  // the producer warpgroup fills the stages; a chain's count goes on from loop to loop
    RingState st = ring_bounds(loop);
    st.base = ring_counts_.count(r.head()) ? ring_counts_.at(r.head()) : ci32(0);
    rings_[&loop] = st;
    return;
  }
  if (r.follower()) return;  // its bounds and place in the chain were set before the chain's first loop
  if (r.chain.empty()) {
    const RingState st = ring_bounds(loop);
    pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
      for (int j = 0; j < r.stages; ++j)
        pir_if(cmp(pir::Pred::lt, ci32(j), st.trips), [&] { ring_issue(loop, r, st, ci32(j), ci32(j)); });
    });
    rings_[&loop] = st;
    return;
  }
  // One ring over consecutive loops: every loop's bounds now (the later loops' first tiles may be
  // issued from here or from an earlier loop's last iterations), each loop's iterations counted on
  // from the loops before it.
  V base = ci32(0);
  for (const ir::Op* member : r.chain) {
    for (size_t i = 0; i < 3; ++i) scalar_ahead(member->operands[i]);
    for (const ir::Op* l : plan_.hopper.rings.at(member).loads) {
      for (size_t i = 1; i < l->operands.size(); ++i)
        if (!inside_loop(l->operands[i], *member)) scalar_ahead(l->operands[i]);
      for (const ir::Op* op : plan_.hopper.tiles.at(l).offset_ops)
        for (ir::ValueId o : op->operands)
          if (!inside_loop(o, *member) && !f_.type(o).is_tensor()) scalar_ahead(o);
    }
    RingState st = ring_bounds(*member);
    st.base = base;
    base = bin(Op::add, base, st.trips);
    rings_[member] = st;
  }
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
    for (int g = 0; g < r.stages; ++g) ring_issue_chain(r, ci32(g), ci32(g));
  });
}

void Lowerer::ring_issue_chain(const SmemRing& r, V g, V s) {
  // iterations only go forward: from loop k, the owner is loop k or a later one; the first
  // owner whose range g has not passed issues it
  auto from = std::find(r.chain.begin(), r.chain.end(), r.loop);
  std::function<void(std::vector<const ir::Op*>::const_iterator)> issue = [&](std::vector<const ir::Op*>::const_iterator it) {
    if (it == r.chain.end()) return;
    const ir::Op* member = *it;
    const RingState& st = rings_.at(member);
    const V j = bin(Op::sub, g, st.base);
    pir_if_values(cmp(pir::Pred::lt, j, st.trips), {}, [&] {
      ring_issue(*member, plan_.hopper.rings.at(member), st, j, s);
      return Regs{};
    }, [&] {
      issue(std::next(it));
      return Regs{};
    });
  };
  issue(from);
}

bool Lowerer::inside_loop(ir::ValueId v, const ir::Op& loop) const {
  if (v == loop.regions[0].args[0]) return true;
  bool inside = false;
  ir::walk(loop.regions[0], [&](const ir::Op& op) {
    inside = inside || std::find(op.results.begin(), op.results.end(), v) != op.results.end();
  });
  return inside;
}

void Lowerer::ring_top(const ir::Op& loop, const SmemRing& r, V iv) {
  RingState& st = rings_.at(&loop);
  const int S = r.stages;
  st.iter = bin(Op::div, bin(Op::sub, cast(iv, DType::i32), st.lb), st.step);
  // (continues across runs of a nested ring, and across a chain's loops)
  if (r.producer || !r.chain.empty()) st.iter = bin(Op::add, st.base, st.iter);
  st.stage = bin(Op::rem, st.iter, ci32(S));
  if (r.producer) {  // each tile is waited for where it is first read, and freed after its last
    st.body = blocks_.back();
    st.reads.clear();
    st.released.clear();
    st.waited_in.clear();
    return;
  }
  V full = bin(Op::add, smem_at(r.full), cast(bin(Op::mul, st.stage, ci32(8)), DType::u32));
  emit0(Op::mbar_wait, {full, bin(Op::bit_and, bin(Op::div, st.iter, ci32(S)), ci32(1))});
}

void Lowerer::ring_bottom(const SmemRing& r) {
  if (r.producer) {  // tiles whose last reader's wait stood in a branch (all waited by now)
    RingState& st = rings_.at(r.loop);
    for (const ir::Op* l : r.loads)
      if (!st.released.count(l)) release_ring_tile(plan_.hopper.tiles.at(l), st);
    return;
  }
  const RingState& st = rings_.at(r.loop);
  const int W = warps_;
  V counter = bin(Op::add, smem_at(r.released), cast(bin(Op::mul, st.stage, ci32(8)), DType::u32));
  pir_if(cmp(pir::Pred::eq, lane_, ci32(0)), [&] {
    V old = emit(Op::atom_shared, pir::scalar(DType::u32), {counter, cint(DType::u32, 1)}, pir::kAtomSharedAdd);
    V last = cmp(pir::Pred::eq, bin(Op::rem, old, cint(DType::u32, W)), cint(DType::u32, W - 1));
    V j = bin(Op::add, st.iter, ci32(r.stages));
    if (!r.chain.empty()) return pir_if(last, [&] { ring_issue_chain(r, j, st.stage); });
    pir_if(land(last, cmp(pir::Pred::lt, j, st.trips)), [&] { ring_issue(*r.loop, r, st, j, st.stage); });
  });
}

V Lowerer::tile_addr(const SmemTile& t) {
  if (!t.ring) {
    emit0(Op::mbar_wait, {smem_at(t.barrier), ci32(0)});
    return smem_at(t.offset);
  }
  const SmemRing& r = plan_.hopper.rings.at(t.ring);
  RingState& st = rings_.at(t.ring);
  if (r.producer) wait_ring_tile(t, st);
  return ring_stage_addr(r, st.stage, t.offset);
}

void Lowerer::wait_ring_tile(const SmemTile& t, RingState& st) {
  // once per iteration, unless the earlier wait stood in a block that has ended (a branch)
  auto w = st.waited_in.find(t.load);
  if (w != st.waited_in.end() && std::find(block_ids_.begin(), block_ids_.end(), w->second) != block_ids_.end()) return;
  const SmemRing& r = plan_.hopper.rings.at(t.ring);
  emit0(Op::mbar_wait, {stage_barrier(t.full, st.stage), bin(Op::bit_and, bin(Op::div, st.iter, ci32(r.stages)), ci32(1))});
  st.waited_in[t.load] = block_ids_.back();
}

void Lowerer::wgmma_dot(const ir::Op& op, const WgmmaDot& w) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]);
  const int64_t M = A.shape[0], K = A.shape[1], N = B.shape[1];
  const int W = warps_;
  // Warpgroup g takes row slab g % split.m and column slab g / split.m (Layout::wgmma_split).
  const Layout::WgmmaSplit split = Layout::wgmma_split(M, W);
  const int64_t reps = M / (64 * split.m), wn = N / split.n, per = wn / 2;
  const Layout& LC = *plan_.natural[op.results[0]];
  Regs acc = get(op.operands[2], LC);
  V wg = bin(Op::shr, warp_, ci32(2));
  V wg_m = split.m > 1 ? bin(Op::bit_and, wg, ci32(split.m - 1)) : ci32(0);
  V wg_n = split.n > 1 ? bin(Op::shr, wg, ci32(std::countr_zero(static_cast<unsigned>(split.m)))) : ci32(0);
  // B: K-major tiles (B^T[N, K] rows) step 32 bytes per k16 inside a chunk and a chunk per 4
  // steps; MN-major tiles (B[K, N]) step 16 rows of 128 bytes, chunks `leading` bytes apart. A
  // warpgroup's column slab starts wn rows (K-major) or wn / 64 chunks (MN-major) in.
  const SmemTile& tb = plan_.hopper.tiles.at(w.b_tile);
  V b_base = tile_addr(tb);
  if (split.n > 1) {
    const int64_t slab_bytes = w.b_mn_major ? wn / 64 * tb.chunk_bytes() : wn * 128;
    b_base = bin(Op::add, b_base, cast(bin(Op::mul, wg_n, ci32(slab_bytes)), DType::u32));
  }
  V desc_b = w.b_mn_major ? descriptor(b_base, tb.chunk_bytes()) : descriptor(b_base);
  // DotOptions::descriptors_at_use: an opaque copy, so that LLVM cannot hoist the k steps'
  // descriptors (base + step) out of the loops around the dot into registers live through them
  const bool at_use = op.attrs.count(ir::kDescriptorsAtUseAttr) > 0;
  const auto local = [&](V desc) { return at_use ? emit_multi(Op::opaque, {desc}, 1, pir::scalar(DType::u64), pir::kOpaqueCopy)[0] : desc; };
  desc_b = local(desc_b);
  auto b_step = [&](int64_t kk) { return w.b_mn_major ? kk * 2048 / 16 : ((kk / 4) * tb.chunk_bytes() + (kk % 4) * 32) / 16; };
  V desc_a = 0;
  Regs a;
  const SmemTile* ta = w.a_tile ? &plan_.hopper.tiles.at(w.a_tile) : nullptr;
  // A^T [K, M] in shared memory, read MN-major (transpose-A): staged from registers, or a loaded tile
  const bool a_mn = w.a_staged != nullptr || w.a_mn_major;
  const int64_t a_chunk = K * 128;  // A^T's bytes per 64-column chunk of M
  if (a_mn) {
    if (w.a_staged) stage_a(*w.a_staged, op.attrs.count(ir::kStagingAtUseAttr) > 0);
    const V a_base = w.a_staged ? smem_at(plan_.hopper.a_staging) : tile_addr(*ta);
    // warpgroup wg_m's first 64 rows of M are chunk wg_m; slab r adds split.m chunks
    desc_a = descriptor(bin(Op::add, a_base, cast(bin(Op::mul, wg_m, ci32(a_chunk)), DType::u32)), a_chunk);
    // (its k steps too: loop-invariant, LLVM held all of them through the loop, two registers each)
    desc_a = local(desc_a);
  } else if (ta) {
    desc_a = descriptor(bin(Op::add, tile_addr(*ta), cast(bin(Op::mul, wg_m, ci32(64 * 128)), DType::u32)));
    desc_a = local(desc_a);
  } else {
    // A in registers: the m64k16 A fragment is the accumulator layout of a [M, K] tile, k16 chunk
    // kk of slab r being registers {col bit 0, row 8, col 8} + 16 kk (jit/layout.cpp).
    Layout LA = Layout::wgmma_a(M, K, W);
    Regs ar = get(op.operands[0], LA);
    std::map<Coord, V> by_coord;
    for (uint32_t r = 0; r < static_cast<uint32_t>(LA.num_regs()); ++r) by_coord.emplace(LA.reg_coords(r), ar[r]);
    for (int64_t r = 0; r < reps; ++r)
      for (int64_t kk = 0; kk < K / 16; ++kk)
        for (int64_t c : {0, 8})
          for (int64_t h : {0, 8}) {
            int64_t row = r * 64 * split.m + h, col = 16 * kk + c;
            a.push_back(pack(by_coord.at({row, col}), by_coord.at({row, col + 1})));
          }
    // A value the same in every iteration of the innermost loop around this dot (from outside
    // it, or computed in it from such values alone, which LLVM hoists): ptxas must be shown that
    // its registers live across the loop's back edge.
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
      if (f->loop_body) {
        if (loop_invariant(op.operands[0], *f->body)) f->keep_alive.insert(f->keep_alive.end(), a.begin(), a.end());
        break;
      }
  }
  const int64_t imm = wn | (static_cast<int64_t>(A.dtype) << 16) | (int64_t{w.b_mn_major} << 24) | (int64_t{a_mn} << 26);
  // dot(a, b) (a zero accumulator): the first k-step overwrites instead of reading zeros, so no
  // zero registers are materialised (LLVM shares one zero, and ptxas would then make a later
  // group wait for this one: C7517).
  const ir::Op* acc_def = def_.count(op.operands[2]) ? def_.at(op.operands[2]) : nullptr;
  const double* acc_value = acc_def && acc_def->kind == OpKind::constant ? std::get_if<double>(&acc_def->attrs.at("value")) : nullptr;
  const bool zero_acc = acc_value && *acc_value == 0.0;
  emit0(Op::wgmma_fence, {});
  for (int64_t r = 0; r < reps; ++r)
    for (int64_t kk = 0; kk < K / 16; ++kk) {
      std::vector<V> args;
      if (a_mn) {
        const int64_t a_off = r * split.m * a_chunk + kk * 2048;  // a k16 step: 16 rows of 128 bytes
        args.push_back(bin(Op::add, desc_a, cint(DType::u64, a_off / 16)));
      } else if (ta) {
        int64_t a_off = (kk / 4) * ta->chunk_bytes() + r * 64 * split.m * 128 + (kk % 4) * 32;
        args.push_back(bin(Op::add, desc_a, cint(DType::u64, a_off / 16)));
      } else {
        size_t base = static_cast<size_t>(4 * (r * (K / 16) + kk));
        args.insert(args.end(), a.begin() + static_cast<std::ptrdiff_t>(base), a.begin() + static_cast<std::ptrdiff_t>(base + 4));
      }
      args.push_back(bin(Op::add, desc_b, cint(DType::u64, b_step(kk))));
      for (int64_t j = 0; j < per; ++j) args.push_back(acc[static_cast<size_t>(r * per + j)]);
      const int64_t overwrite = zero_acc && kk == 0 ? int64_t{1} << 25 : 0;
      Regs out = emit_multi(ta || w.a_staged ? Op::wgmma : Op::wgmma_rs, args, static_cast<size_t>(per), pir::scalar(DType::f32),
                            imm | overwrite);
      for (int64_t j = 0; j < per; ++j) acc[static_cast<size_t>(r * per + j)] = out[static_cast<size_t>(j)];
    }
  emit0(Op::wgmma_commit, {});
  // The group stays in flight until something reads the result (get() waits for it then), so
  // independent MMAs and the code between them overlap: e.g. dP^T = V dO^T runs while P^T's
  // exponentials are computed.
  std::vector<const ir::Op*> ring_tiles;
  for (const SmemTile* t : {ta, &tb})
    if (t && t->ring && plan_.hopper.rings.at(t->ring).producer) {
      ring_tiles.push_back(t->load);
      ++rings_.at(t->ring).reads[t->load];
    }
  pending_.push_back({++committed_, op.results[0], LC, acc, ops_lowered_, blocks_.back(), blocks_.back()->insts.size() - 1, ring_tiles});
  if (w.a_staged) staged_a_group_ = committed_;
  put(op.results[0], LC, acc);
}

bool Lowerer::loop_invariant(ir::ValueId x, const ir::Block& body) const {
  std::unordered_set<ir::ValueId> inside(body.args.begin(), body.args.end());
  ir::walk(body, [&](const ir::Op& inner) {
    inside.insert(inner.results.begin(), inner.results.end());
    for (const ir::Block& region : inner.regions) inside.insert(region.args.begin(), region.args.end());
  });
  std::unordered_map<ir::ValueId, bool> memo;
  std::function<bool(ir::ValueId)> invariant = [&](ir::ValueId v) {
    if (!inside.count(v)) return true;
    if (auto it = memo.find(v); it != memo.end()) return it->second;
    auto d = def_.find(v);
    if (d == def_.end()) return memo[v] = false;  // a block argument
    const ir::Op& op = *d->second;
    const OpKind k = op.kind;
    const bool register_only = ir::is_elementwise(k) || k == OpKind::constant || k == OpKind::arange || k == OpKind::splat ||
                               k == OpKind::broadcast || k == OpKind::expand_dims || k == OpKind::reshape || k == OpKind::trans ||
                               k == OpKind::pack_pairs || k == OpKind::unpack_pairs || k == OpKind::program_id ||
                               k == OpKind::num_programs || k == OpKind::tensor_dim || k == OpKind::tensor_stride || k == OpKind::tensor_ptr;
    bool r = register_only;
    for (size_t i = 0; r && i < op.operands.size(); ++i) r = invariant(op.operands[i]);
    return memo[v] = r;
  };
  return invariant(x);
}

V Lowerer::swizzled_offset(V row, V col, int64_t elem_bytes, int64_t chunk_bytes) {
  const int64_t per_row = 128 / elem_bytes, per_unit = 16 / elem_bytes;
  V chunk = bin(Op::shr, col, ci32(std::countr_zero(static_cast<uint64_t>(per_row)))), within = land(col, ci32(per_row - 1));
  V unit = bin(Op::bit_xor, bin(Op::shr, within, ci32(std::countr_zero(static_cast<uint64_t>(per_unit)))), land(row, ci32(7)));
  return bin(Op::add, bin(Op::mul, chunk, ci32(chunk_bytes)),
             bin(Op::add, bin(Op::mul, row, ci32(128)),
                 bin(Op::add, bin(Op::mul, unit, ci32(16)), bin(Op::mul, land(within, ci32(per_unit - 1)), ci32(elem_bytes)))));
}

V Lowerer::chunked_offset(V row, V col, int64_t elem_bytes, int64_t chunk_cols, int64_t rows) {
  const V chunk = bin(Op::shr, col, ci32(std::countr_zero(static_cast<uint64_t>(chunk_cols))));
  const V within = land(col, ci32(chunk_cols - 1));
  return bin(Op::add, bin(Op::mul, chunk, ci32(rows * chunk_cols * elem_bytes)),
             bin(Op::add, bin(Op::mul, row, ci32(chunk_cols * elem_bytes)), bin(Op::mul, within, ci32(elem_bytes))));
}

void Lowerer::store_shared_at(V offset, V value, std::optional<V> pred) {
  pir::Inst st;
  st.op = Op::store_shared;
  st.args = {offset, value};
  if (pred) st.args.push_back(*pred);
  blocks_.back()->insts.push_back(std::move(st));
}

V Lowerer::load_shared_at(V offset, DType d) {
  pir::Inst ld;
  ld.op = Op::load_shared;
  ld.args = {offset};
  ld.results.push_back(out_.new_value(pir::scalar(d)));
  const V r = ld.results[0];
  blocks_.back()->insts.push_back(std::move(ld));
  return r;
}

void Lowerer::stage_a(const ir::Op& trans, bool at_use) {
  if (std::any_of(pending_.begin(), pending_.end(), [&](const PendingDot& p) { return p.group == staged_a_group_; }))
    wait_groups(staged_a_group_);
  // the same barrier tells every thread that earlier TMA reduces have read their staging tile
  if (!plan_.hopper.reduces.empty()) pir_if(bulk_issuer(), [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
  emit0(Op::barrier, {});
  if (!plan_.hopper.reduces.empty()) reduce_staging_free_in_ = block_ids_.back();
  const ir::ValueId x = trans.operands[0];
  const ir::Type& t = f_.type(x);
  const int64_t K = t.shape[0];
  Layout L = plan_.natural[x] ? *plan_.natural[x] : memory_layout(t);
  Regs xr = get(x, L);
  std::map<Coord, uint32_t> reg_of;
  for (uint32_t r = 0; r < xr.size(); ++r) reg_of.emplace(L.reg_coords(r), r);
  std::optional<V> own = owner(L);
  // at_use (DotOptions::staging_at_use): the offsets from opaque copies of the lane and warp, as a
  // TMA store's at the store: LLVM hoisted the staging's 16 swizzled offsets out of the loop around
  // the dot and held them through it (the dK/dV kernel's dS: decision 103)
  const std::vector<V> tc = at_use ? thread_coords_at_use(L) : thread_coords(L);
  for (uint32_t r = 0; r < xr.size(); ++r) {
    if (duplicate_reg(L, r)) continue;
    const Coord c = L.reg_coords(r);
    auto pair = reg_of.find({c[0], c[1] + 1});
    // a pair when the thread's own column part is even and the next column is its next register
    const bool paired = c[1] % 2 == 0 && pair != reg_of.end() && additive(L);
    if (c[1] % 2 == 1 && reg_of.count({c[0], c[1] - 1}) && additive(L)) continue;  // stored with its pair
    V off = swizzled_offset(coord(L, r, 0, tc[0]), coord(L, r, 1, tc[1]), 2, K * 128);
    store_shared_at(bin(Op::add, off, ci32(plan_.hopper.a_staging)), paired ? pack(xr[r], xr[pair->second]) : xr[r], own);
  }
  emit0(Op::fence_proxy_async, {});
  emit0(Op::barrier, {});
}

std::optional<int> Lowerer::region_waits_for(const ir::Op& op) const {
  if (pending_.empty()) return std::nullopt;
  std::optional<int> upto;
  auto note = [&](ir::ValueId v) {
    for (const PendingDot& p : pending_)
      if (p.value == v) upto = std::max(upto.value_or(p.group), p.group);
  };
  bool runs_dots = false;
  for (ir::ValueId v : op.operands) note(v);
  for (const ir::Block& r : op.regions)
    ir::walk(r, [&](const ir::Op& inner) {
      runs_dots = runs_dots || inner.kind == OpKind::dot;
      for (ir::ValueId v : inner.operands) note(v);
    });
  if (runs_dots) return pending_.back().group;
  return upto;
}

void Lowerer::wait_for(ir::ValueId v) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const PendingDot& p) { return p.value == v; });
  if (it == pending_.end()) return;
  wait_groups(it->group);
}

void Lowerer::wait_pending() {
  if (!pending_.empty()) wait_groups(pending_.back().group);
}

void Lowerer::wait_groups(int upto) {
  Regs tied;
  std::vector<PendingDot> done, rest;
  for (PendingDot& p : pending_) (p.group <= upto ? done : rest).push_back(std::move(p));
  for (const PendingDot& p : done) tied.insert(tied.end(), p.regs.begin(), p.regs.end());
  // Fenced when work was lowered since the issue (e.g. a softmax meant to run while the MMA
  // does): that overlap exists only if the wait stays after it. A wait right at the issue (a
  // result read at once) is left to ptxas to place.
  const bool overlapped = std::any_of(done.begin(), done.end(), [&](const PendingDot& p) { return ops_lowered_ > p.ops_at_issue; });
  Regs out = emit_multi(Op::wgmma_wait, tied, tied.size(), pir::scalar(DType::f32),
                        (committed_ - upto) | (overlapped ? pir::kWaitFenced : 0));
  wait_outputs_.insert(out.begin(), out.end());
  pending_ = std::move(rest);  // before put(): get() must not see them pending again
  size_t at = 0;
  for (const PendingDot& p : done) {
    put(p.value, p.layout, Regs(out.begin() + static_cast<std::ptrdiff_t>(at), out.begin() + static_cast<std::ptrdiff_t>(at + p.regs.size())));
    at += p.regs.size();
  }
  std::vector<const ir::Op*> retired;
  for (const PendingDot& p : done) retired.insert(retired.end(), p.ring_tiles.begin(), p.ring_tiles.end());
  if (!retired.empty()) release_retired(retired);
}

}  // namespace tilejit::jit::lower
