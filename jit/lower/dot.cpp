// dot on registers: mma.sync (m16n8k16 for 16-bit inputs, m16n8k8 .tf32 for f32 inputs with
// input_precision tf32) where the plan allows, else FMA on CUDA cores through shared memory (wgmma
// dots go to lower/wgmma.cpp, GEMM K loops to lower/tma_pipeline.cpp). A batched dot is the 2-D one
// per batch: each warp's registers hold its batches one after another (jit/dot_plan.hpp).
#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {

void Lowerer::dot(const ir::Op& op) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]), &C = f_.type(op.results[0]);
  for (const ir::Type* t : {&A, &B, &C}) check_shape(&op, *t);
  if (auto it = plan_.hopper.dots.find(&op); it != plan_.hopper.dots.end()) return wgmma_dot(op, it->second);
  DotPlan dp = plan_dot(A, B, warps_, ir::input_precision(op));
  const Layout& LC = *plan_.natural[op.results[0]];
  if (dp.mma) return mma(op, dp, LC);
  fma_dot(op, dp, LC);
}

Regs Lowerer::to_tf32(const Regs& f32_values) {
  Regs out;
  for (V x : f32_values) out.push_back(emit(Op::cvt_tf32, pir::scalar(DType::u32), {x}));
  return out;
}

V Lowerer::pack(V lo, V hi) {
  auto l = unpacked_.find(lo), h = unpacked_.find(hi);
  if (l != unpacked_.end() && h != unpacked_.end() && l->second.first == h->second.first && l->second.second == 0 && h->second.second == 1)
    return l->second.first;
  return emit(Op::pack2, pir::scalar(DType::u32), {lo, hi});
}

void Lowerer::mma(const ir::Op& op, const DotPlan& dp, const Layout& LC) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]);
  const size_t rank = A.shape.size();
  int64_t M = A.shape[rank - 2], K = A.shape[rank - 1], N = B.shape[rank - 1];
  Regs a = get(op.operands[0], dp.a_layout(A.shape)), b = get(op.operands[1], dp.b_layout(B.shape)), c = get(op.operands[2], LC);
  // tf32: each input rounded once (cvt.rna.tf32.f32), however many mmas read it
  if (dp.tf32) a = to_tf32(a), b = to_tf32(b);
  int64_t m_reps = M / dp.warps_m / 16, n_reps = N / dp.warps_n / 8, k_steps = K / dp.k_step();
  // a batch's registers: the layouts' batch bits are the register index's high bits
  const int64_t slabs = dp.batches_per_warp();
  const size_t a_slab = a.size() / static_cast<size_t>(slabs), b_slab = b.size() / static_cast<size_t>(slabs),
               c_slab = c.size() / static_cast<size_t>(slabs);
  for (int64_t s = 0; s < slabs; ++s)
    for (int64_t mi = 0; mi < m_reps; ++mi)
      for (int64_t ni = 0; ni < n_reps; ++ni) {
        size_t cb = static_cast<size_t>(s) * c_slab + static_cast<size_t>(4 * (ni + n_reps * mi));
        for (int64_t ki = 0; ki < k_steps; ++ki) {
          pir::Inst in;
          if (dp.tf32) {
            size_t ab = static_cast<size_t>(s) * a_slab + static_cast<size_t>(4 * (ki + k_steps * mi)),
                   bb = static_cast<size_t>(s) * b_slab + static_cast<size_t>(2 * (ki + k_steps * ni));
            in.op = Op::mma_1688_tf32;
            in.args = {a[ab], a[ab + 1], a[ab + 2], a[ab + 3], b[bb], b[bb + 1], c[cb], c[cb + 1], c[cb + 2], c[cb + 3]};
          } else {
            size_t ab = static_cast<size_t>(s) * a_slab + static_cast<size_t>(8 * (ki + k_steps * mi)),
                   bb = static_cast<size_t>(s) * b_slab + static_cast<size_t>(4 * (ki + k_steps * ni));
            std::vector<V> args{pack(a[ab], a[ab + 1]), pack(a[ab + 2], a[ab + 3]), pack(a[ab + 4], a[ab + 5]),
                                pack(a[ab + 6], a[ab + 7]), pack(b[bb], b[bb + 1]), pack(b[bb + 2], b[bb + 3]),
                                c[cb], c[cb + 1], c[cb + 2], c[cb + 3]};
            in.op = Op::mma_16816;
            in.args = args;
            in.imm = static_cast<int64_t>(A.dtype);
          }
          for (int j = 0; j < 4; ++j) in.results.push_back(out_.new_value(pir::scalar(DType::f32)));
          for (int j = 0; j < 4; ++j) c[cb + static_cast<size_t>(j)] = in.results[static_cast<size_t>(j)];
          blocks_.back()->insts.push_back(std::move(in));
        }
      }
  put(op.results[0], LC, c);
}

void Lowerer::fma_dot(const ir::Op& op, const DotPlan& dp, const Layout& LC) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]), &C = f_.type(op.results[0]);
  const size_t rank = A.shape.size();
  const bool batched = rank == 3;
  const int64_t batch = batched ? A.shape[0] : 1;
  int64_t M = A.shape[rank - 2], K = A.shape[rank - 1], N = B.shape[rank - 1];
  Layout LA = memory_layout(A), LB = memory_layout(B);
  Regs a = get(op.operands[0], LA), b = get(op.operands[1], LB), c = get(op.operands[2], LC);
  if (dp.tf32) {  // the rounded values, as f32: their products are exact (11 x 11 significant bits)
    a = to_tf32(a), b = to_tf32(b);
    for (Regs* x : {&a, &b})
      for (V& v : *x) v = emit(Op::bitcast, pir::scalar(DType::f32), {v});
  }
  int64_t es = ir::byte_size(A.dtype);
  int64_t b_base = batch * M * K * es;
  reserve_smem(b_base + batch * K * N * es);
  for (uint32_t r = 0; r < a.size(); ++r)
    if (!duplicate_reg(LA, r)) emit0(Op::store_shared, {bin(Op::mul, tile_offset(LA, r), ci32(es)), a[r]});
  for (uint32_t r = 0; r < b.size(); ++r)
    if (!duplicate_reg(LB, r))
      emit0(Op::store_shared, {bin(Op::add, bin(Op::mul, tile_offset(LB, r), ci32(es)), ci32(b_base)), b[r]});
  emit0(Op::barrier, {});
  // for k in [0, K): acc[r] += A[m_r, k] * B[k, n_r]
  pir::Inst loop;
  loop.op = Op::for_;
  loop.args = {ci32(0), ci32(K), ci32(1)};
  for (V x : c) loop.args.push_back(x);
  pir::Block body;
  V k = out_.new_value(pir::scalar(DType::i32));
  body.args.push_back(k);
  for (size_t i = 0; i < c.size(); ++i) body.args.push_back(out_.new_value(pir::scalar(C.dtype)));
  push_block(&body);
  frames_.emplace_back();
  pir::Inst y;
  y.op = Op::yield;
  for (uint32_t r = 0; r < c.size(); ++r) {
    // A[(b,) m, k] and B[(b,) k, n], row-major as stored above
    V m = coord(LC, r, rank - 2), n = coord(LC, r, rank - 1);
    V a_row = m, b_row = k;
    if (batched) {
      V bi = coord(LC, r, 0);
      a_row = bin(Op::add, bin(Op::mul, bi, ci32(M)), m);
      b_row = bin(Op::add, bin(Op::mul, bi, ci32(K)), k);
    }
    V ao = bin(Op::mul, bin(Op::add, bin(Op::mul, a_row, ci32(K)), k), ci32(es));
    V bo = bin(Op::add, bin(Op::mul, bin(Op::add, bin(Op::mul, b_row, ci32(N)), n), ci32(es)), ci32(b_base));
    V av = cast(emit(Op::load_shared, pir::scalar(A.dtype), {ao}), C.dtype);
    V bv = cast(emit(Op::load_shared, pir::scalar(B.dtype), {bo}), C.dtype);
    y.args.push_back(bin(Op::add, body.args[r + 1], bin(Op::mul, av, bv)));
  }
  body.insts.push_back(std::move(y));
  frames_.pop_back();
  pop_block();
  for (size_t i = 0; i < c.size(); ++i) loop.results.push_back(out_.new_value(pir::scalar(C.dtype)));
  loop.regions.push_back(std::move(body));
  Regs res = loop.results;
  blocks_.back()->insts.push_back(std::move(loop));
  emit0(Op::barrier, {});
  put(op.results[0], LC, res);
}

}  // namespace tilejit::jit::lower
