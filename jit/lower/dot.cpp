// dot on registers: mma.sync m16n8k16 where the plan allows, else FMA on CUDA cores through shared
// memory (wgmma dots go to lower/wgmma.cpp, GEMM K loops to lower/tma_pipeline.cpp).
#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {

void Lowerer::dot(const ir::Op& op) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]), &C = f_.type(op.results[0]);
  for (const ir::Type* t : {&A, &B, &C}) check_shape(&op, *t);
  if (auto it = plan_.hopper.dots.find(&op); it != plan_.hopper.dots.end()) return wgmma_dot(op, it->second);
  DotPlan dp = plan_dot(A, B, warps_);
  const Layout& LC = *plan_.natural[op.results[0]];
  if (dp.mma) return mma(op, dp, LC);
  fma_dot(op, LC);
}

V Lowerer::pack(V lo, V hi) {
  auto l = unpacked_.find(lo), h = unpacked_.find(hi);
  if (l != unpacked_.end() && h != unpacked_.end() && l->second.first == h->second.first && l->second.second == 0 && h->second.second == 1)
    return l->second.first;
  return emit(Op::pack2, pir::scalar(DType::u32), {lo, hi});
}

void Lowerer::mma(const ir::Op& op, const DotPlan& dp, const Layout& LC) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]);
  int64_t M = A.shape[0], K = A.shape[1], N = B.shape[1];
  Layout LA = Layout::mma_a(M, K, dp.warps_m, dp.warps_n), LB = Layout::mma_b(K, N, dp.warps_m, dp.warps_n);
  Regs a = get(op.operands[0], LA), b = get(op.operands[1], LB), c = get(op.operands[2], LC);
  int64_t m_reps = M / dp.warps_m / 16, n_reps = N / dp.warps_n / 8, k_steps = K / 16;
  for (int64_t mi = 0; mi < m_reps; ++mi)
    for (int64_t ni = 0; ni < n_reps; ++ni) {
      size_t cb = static_cast<size_t>(4 * (ni + n_reps * mi));
      for (int64_t ki = 0; ki < k_steps; ++ki) {
        size_t ab = static_cast<size_t>(8 * (ki + k_steps * mi)), bb = static_cast<size_t>(4 * (ki + k_steps * ni));
        std::vector<V> args{pack(a[ab], a[ab + 1]), pack(a[ab + 2], a[ab + 3]), pack(a[ab + 4], a[ab + 5]),
                            pack(a[ab + 6], a[ab + 7]), pack(b[bb], b[bb + 1]), pack(b[bb + 2], b[bb + 3]),
                            c[cb], c[cb + 1], c[cb + 2], c[cb + 3]};
        pir::Inst in;
        in.op = Op::mma_16816;
        in.args = args;
        in.imm = static_cast<int64_t>(A.dtype);
        for (int j = 0; j < 4; ++j) in.results.push_back(out_.new_value(pir::scalar(DType::f32)));
        for (int j = 0; j < 4; ++j) c[cb + static_cast<size_t>(j)] = in.results[static_cast<size_t>(j)];
        blocks_.back()->insts.push_back(std::move(in));
      }
    }
  put(op.results[0], LC, c);
}

void Lowerer::fma_dot(const ir::Op& op, const Layout& LC) {
  const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]), &C = f_.type(op.results[0]);
  int64_t M = A.shape[0], K = A.shape[1], N = B.shape[1];
  Layout LA = memory_layout(A), LB = memory_layout(B);
  Regs a = get(op.operands[0], LA), b = get(op.operands[1], LB), c = get(op.operands[2], LC);
  int64_t es = ir::byte_size(A.dtype);
  int64_t b_base = M * K * es;
  reserve_smem(b_base + K * N * es);
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
    V m = coord(LC, r, 0), n = coord(LC, r, 1);
    V ao = bin(Op::mul, bin(Op::add, bin(Op::mul, m, ci32(K)), k), ci32(es));
    V bo = bin(Op::add, bin(Op::mul, bin(Op::add, bin(Op::mul, k, ci32(N)), n), ci32(es)), ci32(b_base));
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
