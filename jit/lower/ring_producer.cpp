// lang::ring_producer: a warpgroup of its own fills the kernel's TMA rings (FlashAttention-3's
// producer warp), and the consumers free each ring tile right after its last reader retires.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {

void Lowerer::run_with_ring_producer() {
  const RingProducerPlan& p = *plan_.ring_producer;
  const int W = plan_.num_warps;
  out_.num_threads = 32 * (W + RingProducerPlan::kWarps);
  out_.min_programs_per_sm = 1;  // the cap setmaxnreg needs (ptxas ignores it without one: C7508)
  const int cap = entry_register_cap(W + RingProducerPlan::kWarps);
  // the writer's tensor maps at the top level, where every later use sees them (they are cached)
  for (const auto& [op, red] : plan_.hopper.reduces)
    if (red.loop) tensor_map(red.param_index, red.box, red.swizzle_bytes());
  auto set_registers = [&](int want) {
    if (want != cap) emit0(Op::set_max_registers, {}, want > cap ? want : -want);
  };
  // setmaxnreg: the producer's registers go back to the pool first, the consumers' increase waits
  // for them. One if/else, so that each warpgroup runs one setmaxnreg (it is .sync.aligned).
  pir_if_values(cmp(pir::Pred::lt, warp_, ci32(W)), {}, [&] {
    set_registers(p.consumer_registers);
    role_barrier_ = kRoleBarrier;  // a barrier of "all threads" is one of the consumers'
    coordinates_at_use_ = p.coordinates_at_use;
    kernel_body();
    coordinates_at_use_ = false;
    role_barrier_ = 0;
    return Regs{};
  }, [&] {
    set_registers(p.producer_registers);
    pir_if(land(cmp(pir::Pred::eq, warp_, ci32(W)), cmp(pir::Pred::eq, lane_, ci32(0))), [&] { produce_rings(); });
    if (plan_.hopper.reduce_writer)
      pir_if(land(cmp(pir::Pred::eq, warp_, ci32(W + 1)), cmp(pir::Pred::eq, lane_, ci32(0))), [&] { write_reduces(); });
    emit0(Op::exit_thread, {});  // not through the consumers' last blocks (pir::Op::exit_thread says why)
    return Regs{};
  });
}

V Lowerer::scalar_ahead(ir::ValueId v, bool for_producer) {
  for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
    if (auto it = f->scalars.find(v); it != f->scalars.end()) return it->second;
  auto d = def_.find(v);
  if (d == def_.end()) fail(nullptr, fmt::format("internal: scalar {} needed ahead has no definition", v));
  const ir::Op& op = *d->second;
  const OpKind k = op.kind;
  const bool effect = k == OpKind::store || k == OpKind::atomic_add || k == OpKind::atomic_rmw || k == OpKind::atomic_cas || k == OpKind::block_store || k == OpKind::block_load ||
                      k == OpKind::wait_ge || k == OpKind::signal_add || k == OpKind::channel_push || k == OpKind::channel_pop ||
                      k == OpKind::dot || k == OpKind::reduce || k == OpKind::tensor_slice || k == OpKind::precompute;
  const bool pure_scalar = !effect && op.regions.empty() && all_scalar(op);
  if (!pure_scalar && !for_producer)
    fail(&op, "internal: a ring shared by consecutive loops needs this value before the first loop (the planner checks it can)");
  if (!pure_scalar)
    fail(&op, "ring_producer: the producer warp computes the rings' loop bounds and tile offsets on its own, from scalar "
              "arithmetic, program ids, parameters, tensor shapes and scalar loads; this value needs more (compute it from those, "
              "or drop ring_producer)");
  for (ir::ValueId o : op.operands)
    if (!f_.type(o).is_tensor()) scalar_ahead(o, for_producer);
  lower(op);
  return scalar(v);
}

void Lowerer::produce_rings() {
  std::map<const ir::Op*, V> counts;
  const RingIteration fill = [&](const ir::Op& loop, const SmemRing& r, V g, V counter) {
    const V s = bin(Op::rem, g, ci32(r.stages)), parity = bin(Op::bit_and, bin(Op::div, g, ci32(r.stages)), ci32(1));
    // in program order (K before V), a tile lending its memory to a TMA store's staging last:
    // its stage comes back only after that store, which should hold up no other copy
    std::vector<const ir::Op*> loads = r.loads;
    std::stable_partition(loads.begin(), loads.end(), [&](const ir::Op* l) { return !plan_.hopper.tiles.at(l).lends_staging_to; });
    for (const ir::Op* l : loads) {
      const SmemTile& t = plan_.hopper.tiles.at(l);
      const V full = stage_barrier(t.full, s), empty = stage_barrier(t.empty, s);
      // the stage's previous tile freed (a fresh barrier's "previous phase" counts as complete)
      emit0(Op::mbar_wait, {empty, bin(Op::bit_xor, parity, ci32(1))});
      emit0(Op::mbar_expect_tx, {full, ci32(t.bytes())});
      issue_tile(t, ring_stage_addr(r, s, t.offset), full, &loop, counter);
    }
  };
  for (const ir::Op& op : f_.body.ops)
    if (fills_rings(op)) produce_loop(op, counts, fill);
}

std::vector<Lowerer::WriterPart> Lowerer::writer_parts(const ir::Op& add) const {
  const TmaReduce& red = plan_.hopper.reduces.at(&add);
  const ir::Type& t = f_.type(add.operands[1]);
  const Layout L = plan_.natural[add.operands[1]] ? *plan_.natural[add.operands[1]] : memory_layout(t);
  const int64_t per_chunk = red.chunk_cols(), chunks = red.cols / per_chunk;
  const int W = plan_.num_warps, groups = W / 4;
  std::vector<int> owner(static_cast<size_t>(chunks), -1);
  bool split = groups > 1 && groups <= ReduceWriter::kMaxParts && L.num_warps() == W;
  for (int w = 0; split && w < W; ++w)
    for (uint32_t l = 0; split && l < 32; ++l)
      for (uint32_t r = 0; split && r < static_cast<uint32_t>(L.num_regs()); ++r) {
        int& o = owner.at(static_cast<size_t>(L.coords(r, l, static_cast<uint32_t>(w))[1] / per_chunk));
        if (o < 0) o = w / 4;
        split = o == w / 4;
      }
  if (!split) return whole_tile_part(red);
  std::vector<WriterPart> parts;
  for (int g = 0; g < groups; ++g) {
    parts.push_back({4 * g, 4, {}});
    for (int64_t k = 0; k < chunks; ++k)
      if (owner[static_cast<size_t>(k)] == g) parts.back().chunks.push_back(k);
  }
  return parts;
}

std::vector<Lowerer::WriterPart> Lowerer::whole_tile_part(const TmaReduce& red) const {
  WriterPart all{0, plan_.num_warps, {}};
  for (int64_t k = 0; k < red.cols / red.chunk_cols(); ++k) all.chunks.push_back(k);
  return {all};
}

void Lowerer::init_reduce_writer() {
  // the same parts for every add (they share the staging tile and barriers), else one part
  for (const auto& [op, red] : plan_.hopper.reduces) {
    if (!red.loop) continue;
    std::vector<WriterPart> parts = writer_parts(*op);
    if (!writer_parts_.empty() && parts != writer_parts_) {
      writer_parts_ = whole_tile_part(red);
      break;
    }
    writer_parts_ = std::move(parts);
  }
  // full: every thread of the part arrives once its registers are staged; empty: the writer
  const int64_t bars = plan_.hopper.reduce_writer->barriers;
  for (size_t p = 0; p < writer_parts_.size(); ++p) {
    emit0(Op::mbar_init, {smem_at(bars + 16 * static_cast<int64_t>(p)), ci32(32 * writer_parts_[p].warps)});
    emit0(Op::mbar_init, {smem_at(bars + 16 * static_cast<int64_t>(p) + 8), ci32(1)});
  }
}

void Lowerer::stage_for_writer(const TmaReduce& red, const Layout& L, const Regs& val) {
  // one add a ring iteration: its parity is the barriers' phase; a fresh empty barrier's
  // "previous phase" counts as complete, so the first add does not wait
  const V parity = bin(Op::bit_and, rings_.at(red.loop).iter, ci32(1));
  const V part = writer_parts_.size() > 1 ? bin(Op::shr, warp_, ci32(2)) : ci32(0);
  const V full = bin(Op::add, smem_at(plan_.hopper.reduce_writer->barriers), cast(bin(Op::mul, part, ci32(16)), DType::u32));
  const V empty = bin(Op::add, full, cint(DType::u32, 8));
  emit0(Op::mbar_wait, {empty, bin(Op::bit_xor, parity, ci32(1))});
  stage_registers(red, L, val, ci32(plan_.hopper.reduce_staging));
  emit0(Op::fence_proxy_async, {});  // (the writes, for TMA's reads: async proxy)
  emit0(Op::mbar_arrive, {full});
}

void Lowerer::write_reduces() {
  std::map<const ir::Op*, const ir::Op*> add_in;  // ring loop -> its add
  for (const auto& [op, red] : plan_.hopper.reduces)
    if (red.loop) add_in[red.loop] = op;
  const ReduceWriter& w = *plan_.hopper.reduce_writer;
  const int64_t bars = w.barriers;
  const int parts = static_cast<int>(writer_parts_.size());
  // Ordered adds that pass their turn on (signal_after): the last one's semaphore is signalled one
  // add later -- after the next add's parts are staged, before its own wait, so every wait's
  // predecessor has been signalled (no new waits arise) and the add has long completed [073].
  bool signals = false;
  for (const auto& [loop, add] : add_in)
    if (auto o = ir::window_order(*add); o && o->signal) signals = true;
  const V pending = ci32(w.pending_signal);
  auto flush_signal = [&] {
    const V prev = load_shared_at(pending, DType::u64);
    pir_if(cmp(pir::Pred::ne, prev, cint(DType::u64, 0)), [&] {
      emit0(Op::bulk_wait, {}, 0);  // (its global writes complete)
      emit0(Op::fence_proxy_async_global, {});
      emit0(Op::sem_signal, {emit(Op::bitcast, pir::pointer(DType::i32), {prev}), ci32(1)});
    });
  };
  if (signals) store_shared_at(pending, cint(DType::u64, 0), std::nullopt);
  std::map<const ir::Op*, V> counts;
  const RingIteration write = [&](const ir::Op& loop, const SmemRing&, V g, V) {
    auto it = add_in.find(&loop);
    if (it == add_in.end()) return;
    const ir::Op& add = *it->second;
    // the add's offsets ahead of the waits (innermost first, as issue_tma_chunks reads them)
    const size_t rank = tensors_.at(add.operands[0]).sizes.size();
    for (size_t i = 0; i < rank; ++i) producer_value(add.operands[2 + rank - 1 - i]);
    const V parity = bin(Op::bit_and, g, ci32(1));
    const V base = emit(Op::smem_addr, pir::scalar(DType::u32), {ci32(plan_.hopper.reduce_staging)});
    const std::optional<ir::WindowOrder> order = ir::window_order(add);
    auto issue_part = [&](int p) {
      issue_tma_chunks(add, plan_.hopper.reduces.at(&add), base, writer_parts_[static_cast<size_t>(p)].chunks,
                       [&](ir::ValueId v) { return producer_value(v); });
      emit0(Op::bulk_commit, {});
    };
    if (order) {  // every part staged, the previous add's turn passed on, then this add's turn
      for (int p = 0; p < parts; ++p) emit0(Op::mbar_wait, {smem_at(bars + 16 * p), parity});
      if (signals) flush_signal();
      emit0(Op::sem_wait, {producer_value(order->semaphore), cast(producer_value(order->target), DType::i32)});
      emit0(Op::fence_proxy_async_global, {});  // (the adds come after what the signals released)
      for (int p = 0; p < parts; ++p) issue_part(p);
    } else {
      for (int p = 0; p < parts; ++p) {
        emit0(Op::mbar_wait, {smem_at(bars + 16 * p), parity});
        issue_part(p);
      }
    }
    // each part back to its warpgroup once TMA has read it (the groups complete in order)
    for (int p = 0; p < parts; ++p) {
      emit0(Op::bulk_wait, {}, pir::kBulkWaitRead | (parts - 1 - p));
      emit0(Op::mbar_arrive, {smem_at(bars + 16 * p + 8)});
    }
    if (order && order->signal) store_shared_at(pending, emit(Op::bitcast, pir::scalar(DType::u64), {producer_value(*order->signal)}), std::nullopt);
  };
  for (const ir::Op& op : f_.body.ops)
    if (fills_rings(op)) produce_loop(op, counts, write);
  if (signals) flush_signal();  // the last add's
  // (the adds' global writes complete on their own; shared memory must outlive their reads)
  emit0(Op::bulk_wait, {}, pir::kBulkWaitRead);
}

bool Lowerer::fills_rings(const ir::Op& op) const {
  return op.kind == OpKind::for_ && (plan_.hopper.rings.count(&op) || !nested_producer_rings(op).empty());
}

std::vector<const ir::Op*> Lowerer::nested_producer_rings(const ir::Op& loop) const {
  std::vector<const ir::Op*> out;
  for (const ir::Block& region : loop.regions)
    ir::walk(region, [&](const ir::Op& op) {
      // (a chain's count is carried once, under its first loop)
      if (auto it = plan_.hopper.rings.find(&op); it != plan_.hopper.rings.end() && it->second.producer && !it->second.follower())
        out.push_back(&op);
    });
  return out;
}

void Lowerer::produce_loop(const ir::Op& loop, std::map<const ir::Op*, V>& counts, const RingIteration& each) {
  const ir::Block& body = loop.regions[0];
  const auto ring_it = plan_.hopper.rings.find(&loop);
  const SmemRing* r = ring_it == plan_.hopper.rings.end() ? nullptr : &ring_it->second;
  std::unordered_set<ir::ValueId> inside(body.args.begin(), body.args.end());
  ir::walk(body, [&](const ir::Op& op) { inside.insert(op.results.begin(), op.results.end()); });
  // everything from outside the loop that its bounds and its tiles' offsets read, computed in the
  // enclosing iteration's frame (an enclosing loop's counter is bound there)
  auto outside = [&](ir::ValueId v) {
    if (!inside.count(v) && !f_.type(v).is_tensor()) producer_value(v);
  };
  for (size_t i = 0; i < 3; ++i) outside(loop.operands[i]);
  if (r)
    for (const ir::Op* l : r->loads) {
      for (size_t i = 1; i < l->operands.size(); ++i) outside(l->operands[i]);
      for (const ir::Op* op : plan_.hopper.tiles.at(l).offset_ops)
        for (ir::ValueId o : op->operands) outside(o);
    }
  const V lb = cast(scalar(loop.operands[0]), DType::i32), step = cast(scalar(loop.operands[2]), DType::i32);
  const V trips = trip_count(lb, cast(scalar(loop.operands[1]), DType::i32), step);
  const ir::Op* key = r ? r->head() : &loop;  // a chain counts on from loop to loop
  const V base = counts.count(key) ? counts.at(key) : ci32(0);  // this ring's iterations before this run
  const std::vector<const ir::Op*> nested = nested_producer_rings(loop);
  pir::Inst for_op;
  for_op.op = Op::for_;
  for_op.args = {ci32(0), trips, ci32(1)};
  pir::Block pb;
  const V j = out_.new_value(pir::scalar(DType::i32));
  pb.args.push_back(j);
  for (const ir::Op* n : nested) {
    for_op.args.push_back(counts.count(n) ? counts.at(n) : ci32(0));
    pb.args.push_back(counts[n] = out_.new_value(pir::scalar(DType::i32)));
  }
  push_block(&pb);
  frames_.emplace_back();
  const V counter = bin(Op::add, lb, bin(Op::mul, j, step));
  frames_.back().scalars[body.args[0]] = cast(counter, f_.type(body.args[0]).dtype);
  if (r) each(loop, *r, bin(Op::add, base, j), counter);  // (the ring's iteration, counted across runs)
  for (const ir::Op& op : body.ops)  // the rings' loops in the body, in program order (the planner allows no branch around them)
    if (fills_rings(op)) produce_loop(op, counts, each);
  pir::Inst y;
  y.op = Op::yield;
  for (const ir::Op* n : nested) y.args.push_back(counts.at(n));
  pb.insts.push_back(std::move(y));
  frames_.pop_back();
  pop_block();
  for_op.regions.push_back(std::move(pb));
  for (const ir::Op* n : nested) for_op.results.push_back(counts[n] = out_.new_value(pir::scalar(DType::i32)));
  blocks_.back()->insts.push_back(std::move(for_op));
  if (r) counts[key] = bin(Op::add, base, trips);
}

int Lowerer::ring_readers(const ir::Op* tile) {
  if (ring_readers_.empty())
    for (const auto& [d, w] : plan_.hopper.dots)
      for (const ir::Op* t : {w.a_tile, w.b_tile})
        if (t) ++ring_readers_[t];
  // a TMA store staged in the tile reads it last, and frees it itself (tma_bulk_write)
  return ring_readers_.at(tile) + (plan_.hopper.tiles.at(tile).lends_staging_to ? 1 : 0);
}

void Lowerer::release_retired(const std::vector<const ir::Op*>& tiles) {
  for (const ir::Op* l : tiles) {
    const SmemTile& t = plan_.hopper.tiles.at(l);
    if (t.vector) continue;  // read by plain loads, at any point of the iteration: freed at its end
    RingState& st = rings_.at(t.ring);
    if (st.released.count(l) || blocks_.back() != st.body || st.reads[l] < ring_readers(l)) continue;
    const bool in_flight = std::any_of(pending_.begin(), pending_.end(), [&](const PendingDot& p) {
      return std::find(p.ring_tiles.begin(), p.ring_tiles.end(), l) != p.ring_tiles.end();
    });
    if (!in_flight) release_ring_tile(t, st);
  }
}

void Lowerer::release_ring_tile(const SmemTile& t, RingState& st) {
  st.released.insert(t.load);
  // The tile's copy is waited for before its stage goes back, also on paths that skipped its reads
  // (a loop of no trips, a branch): else the producer could refill a stage whose copy still lands,
  // and a later wait on the full barrier would see the wrong phase (seen: a persistent program's
  // Q whose key loop ran no trip -> CUDA_ERROR_LAUNCH_FAILED). A wait already passed is cheap.
  wait_ring_tile(t, st);
  // each consumer warp once (the barrier counts num_warps arrivals), after its own wgmma wait
  pir_if(cmp(pir::Pred::eq, lane_, ci32(0)), [&] { emit0(Op::mbar_arrive, {stage_barrier(t.empty, st.stage)}); });
}

}  // namespace tilejit::jit::lower
