// The Hopper GEMM K loop (jit/tma_pipeline.hpp, TmaDotLoop): a ring of shared-memory stages filled
// by TMA behind mbarriers and consumed by wgmma; with the tensor maps and emission helpers it needs.
#include "jit/lower/lowerer.hpp"

#include <fmt/format.h>

namespace tilejit::jit::lower {

void Lowerer::tensor_map_params() {
  for (const ir::Op* op : plan_.hopper.tile_order) {
    const SmemTile& t = plan_.hopper.tiles.at(op);
    tensor_map(t.param_index, t.box, t.swizzle_bytes());
  }
  for (const auto& [loop, m] : plan_.tma_loops) {
    tensor_map(param_index(m.load_a->operands[0]), gemm_box(m, false));
    tensor_map(param_index(m.load_b->operands[0]), gemm_box(m, true));
  }
  // TMA reduces' maps too, in program order: a map first met inside a region (thread 0's issue)
  // and reused after it was a value out of scope (nvrtc refused two reduces into one tensor)
  ir::walk(f_.body, [&](const ir::Op& op) {
    if (auto it = plan_.hopper.reduces.find(&op); it != plan_.hopper.reduces.end())
      tensor_map(it->second.param_index, it->second.box, it->second.swizzle_bytes());
  });
}

std::vector<int64_t> Lowerer::gemm_box(const TmaDotLoop& m, bool b) {
  if (b ? m.b_mn_major : m.a_mn_major) return {64, m.bk};  // (MN-major: 64-column chunks of BK rows)
  return {m.bk, b ? m.bn : m.bm};
}

int Lowerer::param_index(ir::ValueId tensor) const {
  int index = 0;
  while (f_.params[static_cast<size_t>(index)].value != tensor) ++index;
  return index;
}

V Lowerer::tensor_map(int param, const std::vector<int64_t>& box, int swizzle_bytes) {
  auto key = std::make_tuple(param, box, swizzle_bytes);
  if (auto it = tensor_maps_.find(key); it != tensor_maps_.end()) return it->second;
  pir::TensorMapSpec spec;
  spec.abi_slot = static_cast<int>(out_.params.size());
  spec.param_index = param;
  spec.box = box;
  spec.swizzle_bytes = swizzle_bytes;
  out_.tensor_maps.push_back(spec);
  int earlier = 0;
  for (const auto& [k, v] : tensor_maps_) earlier += std::get<0>(k) == param ? 1 : 0;
  const std::string& name = f_.params[static_cast<size_t>(param)].name;
  pir::Ty ty = pir::pointer(DType::u8);
  out_.params.push_back({earlier ? fmt::format("{}_tensor_map{}", name, earlier) : name + "_tensor_map", ty, pir::kTensorMapBytes});
  return tensor_maps_[key] = emit(Op::param, ty, {}, spec.abi_slot);
}

V Lowerer::trip_count(V lb, V ub, V step) {
  V span = bin(Op::sub, ub, lb);
  return emit(Op::select, pir::scalar(DType::i32),
              {cmp(pir::Pred::gt, span, ci32(0)), bin(Op::div, bin(Op::sub, bin(Op::add, span, step), ci32(1)), step), ci32(0)});
}

void Lowerer::pir_if(V cond, const std::function<void()>& then_body) {
  pir_if_values(cond, {}, [&] {
    then_body();
    return Regs{};
  }, [] { return Regs{}; });
}

Regs Lowerer::emit_multi(Op op, std::vector<V> args, size_t n, pir::Ty ty, int64_t imm) {
  pir::Inst in;
  in.op = op;
  in.args = std::move(args);
  in.imm = imm;
  for (size_t i = 0; i < n; ++i) in.results.push_back(out_.new_value(ty));
  Regs r = in.results;
  blocks_.back()->insts.push_back(std::move(in));
  return r;
}

void Lowerer::side_work(const ir::Op& op, const TmaDotLoop& m, V i, int64_t ring_bytes) {
  if (m.side_ops.empty()) return;
  const ir::Block& body = op.regions[0];
  const DType t = f_.type(body.args[0]).dtype;
  frames_.back().scalars[body.args[0]] =
      bin(Op::add, scalar(op.operands[0]), bin(Op::mul, cast(i, t), scalar(op.operands[2])));
  const int64_t outer_scratch = scratch_base_;
  scratch_base_ += ring_bytes;
  for (const ir::Op* side : m.side_ops) lower(*side);
  scratch_base_ = outer_scratch;
}

V Lowerer::descriptor(V addr, int64_t leading_bytes) {
  const uint64_t fixed = (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
  V a = bin(Op::bit_and, bin(Op::shr, cast(addr, DType::u64), cint(DType::u64, 4)), cint(DType::u64, 0x3FFF));
  return bin(Op::bit_or, a, cint(DType::u64, static_cast<int64_t>(fixed)));
}

void Lowerer::tma_loop(const ir::Op& op, const TmaDotLoop& m) {
  const int S = m.stages, W = warps_, WG = W / 4;
  const ir::Type& at = f_.type(m.load_a->results[0]);
  const int64_t a_bytes = m.bm * m.bk * 2, b_bytes = m.bn * m.bk * 2, stage = a_bytes + b_bytes;
  const int64_t bar0 = S * stage;
  reserve_smem(bar0 + 16 * S);
  auto i32 = [&](ir::ValueId v) { return cast(scalar(v), DType::i32); };
  V lb = i32(op.operands[0]), ub = i32(op.operands[1]), step = i32(op.operands[2]);
  V nk = trip_count(lb, ub, step);
  V m_off = i32(m.load_a->operands[m.a_mn_major ? 2 : 1]), n_off = i32(m.load_b->operands[m.b_mn_major ? 2 : 1]);
  V map_a = tensor_map(param_index(m.load_a->operands[0]), gemm_box(m, false));
  V map_b = tensor_map(param_index(m.load_b->operands[0]), gemm_box(m, true));
  V is0 = cmp(pir::Pred::eq, tid_, ci32(0));
  V base = emit(Op::smem_addr, pir::scalar(DType::u32), {ci32(0)});
  auto addr = [&](V byte_off) { return bin(Op::add, base, cast(byte_off, DType::u32)); };
  auto full = [&](V s) { return addr(bin(Op::add, ci32(bar0), bin(Op::mul, s, ci32(8)))); };
  auto empty = [&](V s) { return addr(bin(Op::add, ci32(bar0 + 8 * S), bin(Op::mul, s, ci32(8)))); };
  auto issue = [&](V j, V s) {
    V k = bin(Op::add, lb, bin(Op::mul, j, step));
    V stage_off = bin(Op::mul, s, ci32(stage));
    emit0(Op::mbar_expect_tx, {full(s), ci32(a_bytes + b_bytes)});
    if (!m.a_mn_major) {
      emit0(Op::tma_load_2d, {addr(stage_off), map_a, k, m_off, full(s)});
    } else {
      for (int64_t c = 0; c < m.bm / 64; ++c)  // chunk c: rows m + 64c.. of A (its columns in A^T), BK rows of A^T
        emit0(Op::tma_load_2d, {addr(bin(Op::add, stage_off, ci32(c * 64 * m.bk * 2))), map_a, bin(Op::add, m_off, ci32(64 * c)), k, full(s)});
    }
    V b_off = bin(Op::add, stage_off, ci32(a_bytes));
    if (!m.b_mn_major) {
      emit0(Op::tma_load_2d, {addr(b_off), map_b, k, n_off, full(s)});
    } else {
      for (int64_t c = 0; c < m.bn / 64; ++c)  // chunk c: columns n + 64c.., BK rows, at b_off + c*64*BK*2
        emit0(Op::tma_load_2d, {addr(bin(Op::add, b_off, ci32(c * 64 * m.bk * 2))), map_b,
                                bin(Op::add, n_off, ci32(64 * c)), k, full(s)});
    }
  };
  pir_if(is0, [&] {
    for (int s = 0; s < S; ++s) {
      emit0(Op::mbar_init, {full(ci32(s)), ci32(1)});
      emit0(Op::mbar_init, {empty(ci32(s)), ci32(W)});
    }
    emit0(Op::fence_mbar_init, {});
  });
  emit0(Op::barrier, {});
  pir_if(is0, [&] {
    for (int j = 0; j < S; ++j) pir_if(cmp(pir::Pred::lt, ci32(j), nk), [&] { issue(ci32(j), ci32(j)); });
  });

  const Layout& LC = *plan_.natural[m.dot->results[0]];
  Regs acc0 = get(op.operands[3], LC);
  // The loop and its final wait only where it runs (nk > 0): when the path that skips it
  // reached the wait too, LLVM could materialise the initial accumulators there in the wgmmas'
  // own registers, which ptxas counts as non-wgmma code inside the pipeline stage and then
  // serialises every wgmma (C7514/C7515, seen once the loop had side work).
  const std::vector<pir::Ty> acc_types(acc0.size(), pir::scalar(DType::f32));
  Regs res = pir_if_values(cmp(pir::Pred::gt, nk, ci32(0)), acc_types, [&]() -> Regs {
    const int64_t per = m.bn / 2;  // accumulator registers per wgmma
    const int64_t reps = m.bm / (64 * WG);
    pir::Inst loop;
    loop.op = Op::for_;
    loop.args = {ci32(0), nk, ci32(1)};
    for (V x : acc0) loop.args.push_back(x);
    pir::Block body;
    V i = out_.new_value(pir::scalar(DType::i32));
    body.args.push_back(i);
    Regs acc;
    for (size_t r = 0; r < acc0.size(); ++r) acc.push_back(out_.new_value(pir::scalar(DType::f32)));
    body.args.insert(body.args.end(), acc.begin(), acc.end());
    push_block(&body);
    frames_.emplace_back();
    {
      V s = bin(Op::rem, i, ci32(S));
      V parity = bin(Op::bit_and, bin(Op::div, i, ci32(S)), ci32(1));
      emit0(Op::mbar_wait, {full(s), parity});
      emit0(Op::wgmma_fence, {});
      V stage_off = bin(Op::mul, s, ci32(stage));
      V wg = bin(Op::shr, warp_, ci32(2));
      // K-major B advances 32 bytes (16 elements) per k16 step inside its swizzled rows; MN-major
      // B advances 16 rows of 128 bytes.
      V desc_b = m.b_mn_major ? descriptor(addr(bin(Op::add, stage_off, ci32(a_bytes))), 64 * m.bk * 2)
                              : descriptor(addr(bin(Op::add, stage_off, ci32(a_bytes))));
      const int64_t b_step = m.b_mn_major ? 16 * 128 / 16 : 2;  // in descriptor units (16 bytes)
      int64_t imm = m.bn | (static_cast<int64_t>(at.dtype) << 16) | (int64_t{m.b_mn_major} << 24) | (int64_t{m.a_mn_major} << 26);
      // A likewise: K-major rows of BK * 2 bytes, 32 bytes a k16 step; MN-major (A^T) 64-row slabs
      // are 64-column chunks of BK rows (one a warpgroup's m64), 16 rows of 128 bytes a k16 step
      const int64_t a_step = m.a_mn_major ? 16 * 128 / 16 : 2;
      for (int64_t r = 0; r < reps; ++r) {
        V row0 = bin(Op::add, bin(Op::mul, wg, ci32(64)), ci32(r * 64 * WG));
        V desc_a = m.a_mn_major ? descriptor(addr(bin(Op::add, stage_off, bin(Op::mul, bin(Op::div, row0, ci32(64)), ci32(64 * m.bk * 2)))),
                                             64 * m.bk * 2)
                                : descriptor(addr(bin(Op::add, stage_off, bin(Op::mul, row0, ci32(m.bk * 2)))));
        for (int64_t kk = 0; kk < m.bk / 16; ++kk) {
          std::vector<V> args{bin(Op::add, desc_a, cint(DType::u64, a_step * kk)), bin(Op::add, desc_b, cint(DType::u64, b_step * kk))};
          for (int64_t j = 0; j < per; ++j) args.push_back(acc[static_cast<size_t>(r * per + j)]);
          Regs out = emit_multi(Op::wgmma, args, static_cast<size_t>(per), pir::scalar(DType::f32), imm);
          for (int64_t j = 0; j < per; ++j) acc[static_cast<size_t>(r * per + j)] = out[static_cast<size_t>(j)];
        }
      }
      emit0(Op::wgmma_commit, {});
      // Only the next iteration's wgmma (ordered after this asm) reads the accumulators inside the
      // loop, so this wait needs no register ties; the one after the loop has them. With side
      // work, two groups stay in flight (the tensor cores queue this step's and the last one's
      // while the side work runs, instead of idling once this step's are done).
      const int inflight = m.side_ops.empty() || S < 3 ? 1 : 2;
      emit_multi(Op::wgmma_wait, {}, 0, pir::scalar(DType::f32), inflight);
      // The stage read by iteration i-inflight is free: release it and refill it with that
      // iteration + S.
      pir_if(cmp(pir::Pred::ge, i, ci32(inflight)), [&] {
        V prev = bin(Op::sub, i, ci32(inflight));
        V ps = bin(Op::rem, prev, ci32(S));
        pir_if(cmp(pir::Pred::eq, lane_, ci32(0)), [&] { emit0(Op::mbar_arrive, {empty(ps)}); });
        V j = bin(Op::add, prev, ci32(S));
        pir_if(land(is0, cmp(pir::Pred::lt, j, nk)), [&] {
          V use = bin(Op::sub, bin(Op::div, j, ci32(S)), ci32(1));
          emit0(Op::mbar_wait, {empty(ps), bin(Op::bit_and, use, ci32(1))});
          issue(j, ps);
        });
      });
      side_work(op, m, i, bar0 + 16 * S);
      pir::Inst y;
      y.op = Op::yield;
      y.args = acc;
      body.insts.push_back(std::move(y));
    }
    frames_.pop_back();
    pop_block();
    Regs out;
    for (size_t r = 0; r < acc0.size(); ++r) out.push_back(out_.new_value(pir::scalar(DType::f32)));
    loop.results = out;
    loop.regions.push_back(std::move(body));
    blocks_.back()->insts.push_back(std::move(loop));
    return emit_multi(Op::wgmma_wait, out, out.size(), pir::scalar(DType::f32), 0);
  }, [&] { return acc0; });
  emit0(Op::barrier, {});  // no warp reuses the stages while another still reads them
  put(op.results[0], LC, res);
}

}  // namespace tilejit::jit::lower
