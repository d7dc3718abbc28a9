// The lowering's driver: Lowerer::run, the walk over the tile IR in program order with the per-op
// dispatch (Lowerer::lower), and lower_to_threads, the entry of jit/lower.hpp.
#include "jit/lower.hpp"
#include "jit/lower/lowerer.hpp"

#include <fmt/format.h>

namespace tilejit::jit::lower {

pir::Func Lowerer::run() {
  out_.name = f_.name;
  out_.num_threads = 32 * plan_.num_warps;
  warps_ = plan_.num_warps;
  ir::walk(f_.body, [&](const ir::Op& op) {
    for (ir::ValueId r : op.results) def_[r] = &op;
    if (op.kind == OpKind::for_) iv_loop_[op.regions[0].args[0]] = &op;
  });
  // integer scalars the launch-time specialisation found divisible (ParamSpec::divisible_by)
  for (const ir::Param& p : f_.params)
    if (p.kind == ir::ParamKind::Scalar && p.spec.divisible_by > 1) divisors_[p.value] = p.spec.divisible_by;
  push_block(&out_.body);
  frames_.emplace_back();
  params();
  tensor_map_params();
  tid_ = emit(Op::thread_id, pir::scalar(DType::i32), {});
  lane_ = emit(Op::bit_and, pir::scalar(DType::i32), {tid_, ci32(31)});
  warp_ = emit(Op::shr, pir::scalar(DType::i32), {tid_, ci32(5)});
  turns_init();
  hopper_init();
  channels_init();
  if (plan_.ring_producer) run_with_ring_producer();
  else kernel_body();
  out_.smem_bytes = smem_bytes_;
  // The largest dynamic shared memory a block may have on sm_80/sm_90 (227 KB): a larger kernel
  // would only fail at launch.
  constexpr int64_t kMaxSmem = 227 * 1024;
  if (smem_bytes_ > kMaxSmem) {
    const HopperPlan& h = plan_.hopper;
    throw SharedMemoryOverflow(fmt::format("tilejit: kernel '{}': needs {} B of shared memory ({} B of TMA tiles and stages, the "
                                           "rest for exchanges between layouts); at most {} B fit on one multiprocessor: use "
                                           "smaller blocks or fewer stages",
                                           f_.name, smem_bytes_, h.persistent_bytes, kMaxSmem));
  }
  return std::move(out_);
}

void Lowerer::signal_after_writes(V ptr, V value) {
  // every thread's earlier writes are done (barrier), then thread 0 releases them
  emit0(Op::barrier, {});
  pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
    if (!plan_.hopper.reduces.empty()) {
      // thread 0 issued the program's TMA reduces: their global writes complete first
      emit0(Op::bulk_wait, {}, 0);
      emit0(Op::fence_proxy_async_global, {});
    }
    emit0(Op::sem_signal, {ptr, value});
  });
}

void Lowerer::kernel_body() {
  block(f_.body);
  // TMA reduces still reading the staging tile when the program ends: shared memory must outlive them.
  if (!plan_.hopper.reduces.empty())
    pir_if(bulk_issuer(), [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
}

void Lowerer::block(const ir::Block& b) {
  for (const ir::Op& op : b.ops) {
    // counted once lowered: a wait triggered by the op's own read sees only the ops before it
    const bool counts = op.kind != OpKind::dot && op.kind != OpKind::yield;
    if (op.regions.empty()) {
      lower(op);
      if (counts) ++ops_lowered_;
      continue;
    }
    // A region that runs MMAs itself waits for every MMA in flight first; one that reads MMA
    // results still in flight waits for those (and the groups committed before them: waits
    // count groups in order), so that later groups stay in flight through it (e.g. a mask
    // applied under a branch to S_j while P_{j-1} V_{j-1} runs). Any other region runs while they
    // all stay in flight: it cannot touch their registers, and they are not its to wait for.
    if (const std::optional<int> upto = region_waits_for(op)) wait_groups(*upto);
    std::vector<PendingDot> outer = std::move(pending_);
    pending_.clear();
    lower(op);
    pending_ = std::move(outer);
    ++ops_lowered_;
  }
  wait_pending();
}

bool Lowerer::all_scalar(const ir::Op& op) const {
  for (ir::ValueId r : op.results)
    if (!f_.type(r).is_scalar()) return false;
  return true;
}

void Lowerer::lower(const ir::Op& op) {
  switch (op.kind) {
    case OpKind::for_: return for_loop(op);
    case OpKind::if_: return if_op(op);
    case OpKind::yield: return;  // handled by the enclosing op
    case OpKind::store: return store(op);
    case OpKind::block_store: return block_store(op);
    case OpKind::load: return load(op);
    case OpKind::block_load: return block_load(op);
    case OpKind::atomic_add:
    case OpKind::atomic_rmw:
    case OpKind::atomic_cas: return pointer_atomic(op);
    case OpKind::wait_ge: {
      // thread 0 spins with acquire loads, then the barrier hands the acquired view to the CTA
      ++memory_epoch_;
      V ptr = scalar(op.operands[0]), target = scalar(op.operands[1]);
      pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
        emit0(Op::sem_wait, {ptr, target});
        // TMA reduces issued after the wait (async proxy) see what the signals released
        if (!plan_.hopper.reduces.empty()) emit0(Op::fence_proxy_async_global, {});
      });
      emit0(Op::barrier, {});
      return;
    }
    case OpKind::signal_add: {
      ++memory_epoch_;
      signal_after_writes(scalar(op.operands[0]), scalar(op.operands[1]));
      return;
    }
    case OpKind::warp_roles: return warp_roles(op);
    case OpKind::channel_push: return channel_push(op);
    case OpKind::channel_pop: {
      auto it = precomputed_.find(op.results[0]);
      if (it != precomputed_.end()) return put(op.results[0], it->second, channel_read(op, it->second));
      // never used: read (and freed) here all the same, or the pushing role would wait for the slot
      if (!used_.count(op.results[0])) channel_read(op, Layout::blocked(f_.type(op.results[0]).shape, warps_, 1));
      return;
    }
    case OpKind::pack_pairs: {
      // the result's layout unpacked has the pair bit as register bit 0: registers 2r, 2r + 1
      const Layout& L = *plan_.natural[op.results[0]];
      const Regs halves = get(op.operands[0], L.unpack_pairs());
      Regs words;
      for (size_t r = 0; r + 1 < halves.size(); r += 2) words.push_back(pack(halves[r], halves[r + 1]));
      put(op.results[0], L, words);
      return;
    }
    case OpKind::unpack_pairs: {
      const Layout& L = *plan_.natural[op.results[0]];
      const std::optional<Layout> packed = L.pack_pairs();
      if (!packed) fail(&op, "internal: unpack_pairs' layout holds no pairs");
      const Regs words = get(op.operands[0], *packed);
      const DType d = f_.type(op.results[0]).dtype;
      Regs halves;
      for (V w : words) {
        Regs two = emit_multi(Op::unpack2, {w}, 2, pir::scalar(d), 0);
        unpacked_[two[0]] = {w, 0};
        unpacked_[two[1]] = {w, 1};
        halves.insert(halves.end(), two.begin(), two.end());
      }
      put(op.results[0], L, halves);
      return;
    }
    case OpKind::timestamp: {
      // lane 0 of each warp: the cycle counter at slot + warp (instrumentation, no ordering)
      V at = emit(Op::gep, pir::pointer(DType::u64), {scalar(op.operands[0]), cast(warp_, DType::i64)});
      V now = emit(Op::read_clock, pir::scalar(DType::u64), {});
      emit0(Op::store, {at, now, cmp(pir::Pred::eq, lane_, ci32(0))});
      return;
    }
    case OpKind::turn_begin: return turn_begin(op);
    case OpKind::ring_producer: return;  // (run_with_ring_producer)
    case OpKind::turn_end: return turn_end();
    case OpKind::reduce: return reduce(op);
    case OpKind::scan:
    case OpKind::reduce_with: return combine_along(op);
    case OpKind::xor_permute: return xor_permute(op);
    case OpKind::gather: return gather(op);
    case OpKind::histogram: return histogram(op);
    case OpKind::dot: return dot(op);
    case OpKind::program_id:
      frames_.back().scalars[op.results[0]] = emit(Op::block_id, pir::scalar(DType::i32), {}, op.int_attr("axis"));
      return;
    case OpKind::num_programs:
      frames_.back().scalars[op.results[0]] = emit(Op::grid_dim, pir::scalar(DType::i32), {}, op.int_attr("axis"));
      return;
    case OpKind::tensor_ptr: frames_.back().scalars[op.results[0]] = tensors_.at(op.operands[0]).ptr; return;
    case OpKind::tensor_dim:
      frames_.back().scalars[op.results[0]] = tensors_.at(op.operands[0]).sizes.at(static_cast<size_t>(op.int_attr("dim")));
      return;
    case OpKind::tensor_stride:
      frames_.back().scalars[op.results[0]] =
          tensors_.at(op.operands[0]).strides.at(static_cast<size_t>(op.int_attr("dim")));
      return;
    case OpKind::tensor_slice: {
      // the view's base is parent + start * stride(dim), its size(dim) = length; rows stay
      // aligned unless the innermost dim is sliced (its start moves the base by elements)
      TensorDesc d = tensors_.at(op.operands[0]);
      auto dim = static_cast<size_t>(op.int_attr("dim"));
      V off = bin(Op::mul, cast(scalar(op.operands[1]), DType::i64), d.strides[dim]);
      d.ptr = emit(Op::gep, out_.types[d.ptr], {d.ptr, off});
      d.sizes[dim] = scalar(op.operands[2]);
      if (dim + 1 == d.sizes.size()) d.spec.align_bytes = 0;
      tensors_[op.results[0]] = d;
      return;
    }
    case OpKind::constant:
      if (all_scalar(op)) frames_.back().scalars[op.results[0]] = constant_value(f_.type(op.results[0]).dtype, op.attrs.at("value"));
      return;
    case OpKind::precompute: return precompute(op);
    default: break;
  }
  if (all_scalar(op)) {
    std::vector<V> a;
    for (ir::ValueId v : op.operands) a.push_back(scalar(v));
    frames_.back().scalars[op.results[0]] = scalar_op(op, a);
    return;
  }
  const auto& nat = plan_.natural[op.results[0]];
  if (!nat) return;  // flexible: materialised where used
  check_shape(&op, f_.type(op.results[0]));
  put(op.results[0], *nat, elementwise(op, *nat));
}

void Lowerer::precompute(const ir::Op& op) {
  const ir::ValueId x = op.operands[0], y = op.results[0];
  if (f_.type(y).is_scalar()) {
    frames_.back().scalars[y] = scalar(x);
    return;
  }
  std::optional<Layout> L = plan_.natural[y];
  if (!L) {
    auto it = precomputed_.find(y);
    if (it == precomputed_.end()) return;
    L = it->second;
  }
  check_shape(&op, f_.type(y));
  // Work meant to run while MMAs are in flight must not delay their issue: ptxas would otherwise
  // interleave it with the wgmma instructions of the group just committed (decisions 012, 030).
  if (!pending_.empty()) pending_.back().commit_block->insts[pending_.back().commit_at].imm |= pir::kCommitFenced;
  Regs r = get(x, *L);
  put(y, *L, emit_multi(Op::opaque, r, r.size(), pir::scalar(f_.type(y).dtype), 0));
}

}  // namespace tilejit::jit::lower

namespace tilejit::jit {

pir::Func lower_to_threads(const ir::Function& f, const LayoutPlan& plan) {
  // A flexible precompute result's layout is that of its use, known only once the use is lowered:
  // a first run records it, a second computes the value ahead in it.
  lower::Lowerer first(f, plan);
  pir::Func out = first.run();
  if (first.precompute_requests().empty()) return out;
  return lower::Lowerer(f, plan, first.precompute_requests()).run();
}

}  // namespace tilejit::jit
