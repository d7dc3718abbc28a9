// The LLVM emitter's memory, synchronisation and tensor-core instructions: global and shared
// memory (predicated accesses through inline PTX), barriers, shuffles, mbarriers and semaphores,
// what keeps LLVM and ptxas from moving code (opaque, keep_alive), mma.sync, wgmma and TMA. The
// second of the two translation units that include LLVM's headers.
#include <algorithm>
#include <cstdlib>

#include "jit/llvm_backend/emitter.hpp"

namespace tilejit::jit::llvm_backend {

// ---------------------------------------------------------------- memory

Emitter::Access Emitter::access(DType d) {
  switch (ir::byte_size(d)) {
    case 1: return {"u8", "h", b_.getInt16Ty()};
    case 2: return {"b16", "h", b_.getInt16Ty()};
    case 4: return {"b32", "r", b_.getInt32Ty()};
    default: return {"b64", "l", b_.getInt64Ty()};
  }
}
llvm::Value* Emitter::to_bits(llvm::Value* x, DType d, llvm::Type* reg) {
  if (d == DType::i1) return b_.CreateZExt(x, reg);
  llvm::Value* i = b_.CreateBitCast(x, b_.getIntNTy(static_cast<unsigned>(ir::byte_size(d) * 8)));
  return b_.CreateZExtOrTrunc(i, reg);
}
llvm::Value* Emitter::from_bits(llvm::Value* i, DType d) {
  if (d == DType::i1) return b_.CreateICmpNE(i, llvm::ConstantInt::get(i->getType(), 0));
  llvm::Value* n = b_.CreateTrunc(i, b_.getIntNTy(static_cast<unsigned>(ir::byte_size(d) * 8)));
  return b_.CreateBitCast(n, scalar_type(d));
}

llvm::Value* Emitter::load(const pir::Inst& in) {
  DType d = f_.types[in.results[0]].dtype;
  llvm::Type* T = scalar_type(d);
  if (in.args.size() == 1) {
    if (d == DType::i1) return b_.CreateICmpNE(b_.CreateLoad(b_.getInt8Ty(), v(in.args[0])), b_.getInt8(0));
    return b_.CreateLoad(T, v(in.args[0]));
  }
  Access a = access(d);
  llvm::Value* other = to_bits(v(in.args[2]), d, a.reg);
  std::string text = fmt::format("mov.b{0} $0, $3;\n\t@$2 ld.global.{1} $0, [$1];", a.reg->getIntegerBitWidth(), a.ptx_type);
  llvm::Value* r = asm_call(a.reg, text, fmt::format("={},l,b,{}", a.constraint, a.constraint), {v(in.args[0]), v(in.args[1]), other}, true);
  return from_bits(r, d);
}

void Emitter::store(const pir::Inst& in) {
  DType d = f_.types[in.args[1]].dtype;
  llvm::Value* x = v(in.args[1]);
  if (in.args.size() == 2) {
    if (d == DType::i1) x = b_.CreateZExt(x, b_.getInt8Ty());
    b_.CreateStore(x, v(in.args[0]));
    return;
  }
  Access a = access(d);
  std::string text = fmt::format("@$2 st.global.{} [$0], $1;", a.ptx_type);
  asm_call(b_.getVoidTy(), text, fmt::format("l,{},b,~{{memory}}", a.constraint), {v(in.args[0]), to_bits(x, d, a.reg), v(in.args[2])}, true);
}

llvm::Value* Emitter::atomic_add(const pir::Inst& in) {
  DType d = f_.types[in.args[1]].dtype;
  auto body = [&]() -> llvm::Value* {
    auto op = ir::is_float(d) ? llvm::AtomicRMWInst::FAdd : llvm::AtomicRMWInst::Add;
    return b_.CreateAtomicRMW(op, v(in.args[0]), v(in.args[1]), llvm::MaybeAlign(), llvm::AtomicOrdering::Monotonic,
                              ctx_.getOrInsertSyncScopeID("device"));
  };
  if (in.args.size() == 2) return body();
  return guarded(v(in.args[2]), scalar_type(d), body);
}

// LLVM 19's NVPTX drops atomics' orders and scopes (a plain atom: relaxed, GPU scope), so the
// PTX is written here: atom.{sem}.{scope}.global.{op}.{type}, on bits for the bitwise ops,
// exchange and compare-and-swap. Float max / min have no atom: LLVM's compare-and-swap loop
// (maxnum / minnum: a NaN operand is ignored), relaxed at GPU scope, with the order's fences.
llvm::Value* Emitter::atomic_rmw(const pir::Inst& in) {
  const bool cas = in.op == Op::atomic_cas;
  const size_t values = cas ? 2 : 1;
  const DType d = f_.types[in.args[values]].dtype;
  const pir::AtomicImm a = pir::AtomicImm::decode(in.imm);
  const bool wide = ir::bit_width(d) == 64, fl = ir::is_float(d);
  const bool float_minmax = fl && (a.rmw == ir::AtomicRmw::max || a.rmw == ir::AtomicRmw::min);
  if (float_minmax && a.scope == ir::MemScope::sys)
    fail(fmt::format("atomic_{} on {} at scope sys is not supported by the llvm backend (its compare-and-swap loop is "
                     "GPU-scoped); use scope gpu, or the nvrtc backend",
                     ir::name(a.rmw), ir::name(d)));
  const std::string order = fmt::format("{}.{}", ir::name(a.sem), ir::name(a.scope));
  auto body = [&]() -> llvm::Value* {
    if (float_minmax) {
      const std::string fence = fmt::format("fence.acq_rel.{};", ir::name(a.scope));
      if (a.sem == ir::MemSem::release || a.sem == ir::MemSem::acq_rel) asm_call(b_.getVoidTy(), fence, "~{memory}", {}, true);
      using B = llvm::AtomicRMWInst::BinOp;
      llvm::Value* old = b_.CreateAtomicRMW(a.rmw == ir::AtomicRmw::max ? B::FMax : B::FMin, v(in.args[0]), v(in.args[1]),
                                            llvm::MaybeAlign(), llvm::AtomicOrdering::Monotonic,
                                            a.scope == ir::MemScope::cta ? ctx_.getOrInsertSyncScopeID("block")
                                                                         : ctx_.getOrInsertSyncScopeID("device"));
      if (a.sem == ir::MemSem::acquire || a.sem == ir::MemSem::acq_rel) asm_call(b_.getVoidTy(), fence, "~{memory}", {}, true);
      return old;
    }
    const std::string rc = wide ? "l" : "r";
    llvm::Type* bits_ty = wide ? b_.getInt64Ty() : b_.getInt32Ty();
    if (cas) {
      llvm::Value* old = asm_call(bits_ty, fmt::format("atom.{}.global.cas.b{} $0, [$1], $2, $3;", order, wide ? 64 : 32),
                                  fmt::format("={},l,{},{},~{{memory}}", rc, rc, rc),
                                  {v(in.args[0]), to_bits(v(in.args[1]), d, bits_ty), to_bits(v(in.args[2]), d, bits_ty)}, true);
      return from_bits(old, d);
    }
    const bool arith = a.rmw == ir::AtomicRmw::add || a.rmw == ir::AtomicRmw::max || a.rmw == ir::AtomicRmw::min;
    const char* op = a.rmw == ir::AtomicRmw::add   ? "add"
                     : a.rmw == ir::AtomicRmw::max ? "max"
                     : a.rmw == ir::AtomicRmw::min ? "min"
                     : a.rmw == ir::AtomicRmw::and_ ? "and"
                     : a.rmw == ir::AtomicRmw::or_  ? "or"
                     : a.rmw == ir::AtomicRmw::xor_ ? "xor"
                                                    : "exch";
    if (arith && fl) {  // add on f32 / f64, by value
      const std::string fc = wide ? "d" : "f";
      return asm_call(scalar_type(d), fmt::format("atom.{}.global.{}.f{} $0, [$1], $2;", order, op, wide ? 64 : 32),
                      fmt::format("={},l,{},~{{memory}}", fc, fc), {v(in.args[0]), v(in.args[1])}, true);
    }
    // (no atom.add.s64: the unsigned add has the same bits)
    const std::string type = arith ? fmt::format("{}{}", ir::is_signed(d) && !(a.rmw == ir::AtomicRmw::add && wide) ? "s" : "u",
                                                 wide ? 64 : 32)
                                   : fmt::format("b{}", wide ? 64 : 32);
    llvm::Value* old = asm_call(bits_ty, fmt::format("atom.{}.global.{}.{} $0, [$1], $2;", order, op, type),
                                fmt::format("={},l,{},~{{memory}}", rc, rc), {v(in.args[0]), to_bits(v(in.args[1]), d, bits_ty)}, true);
    return from_bits(old, d);
  };
  if (in.args.size() == 1 + values) return body();
  return guarded(v(in.args.back()), scalar_type(d), body);
}

void Emitter::memory_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  V r0 = in.results.empty() ? 0 : in.results[0];
  switch (in.op) {
    case Op::load_vec: {
      auto n = static_cast<unsigned>(in.imm);
      auto* vt = llvm::FixedVectorType::get(b_.getInt32Ty(), n);
      llvm::Value* vv = b_.CreateAlignedLoad(vt, a(0), llvm::Align(4 * n));
      for (unsigned i = 0; i < n; ++i) set(in.results[i], b_.CreateExtractElement(vv, i));
      return;
    }
    case Op::store_vec: {
      auto n = static_cast<unsigned>(in.args.size() - 1);
      auto* vt = llvm::FixedVectorType::get(b_.getInt32Ty(), n);
      llvm::Value* vv = llvm::PoisonValue::get(vt);
      for (unsigned i = 0; i < n; ++i) vv = b_.CreateInsertElement(vv, a(i + 1), i);
      b_.CreateAlignedStore(vv, a(0), llvm::Align(4 * n));
      return;
    }
    case Op::gep: {
      llvm::Value* off = b_.CreateIntCast(a(1), b_.getInt64Ty(), sgn(in.args[1]));
      set(r0, b_.CreateGEP(scalar_type(f_.types[in.args[0]].dtype == DType::i1 ? DType::u8 : f_.types[in.args[0]].dtype), a(0), {off}));
      return;
    }
    case Op::load: set(r0, load(in)); return;
    case Op::store: store(in); return;
    case Op::atomic_add: set(r0, atomic_add(in)); return;
    case Op::atomic_rmw:
    case Op::atomic_cas: set(r0, atomic_rmw(in)); return;
    case Op::load_shared: set(r0, b_.CreateLoad(type(f_.types[r0]), smem_ptr(in.args[0]))); return;
    case Op::store_shared:
      if (in.args.size() == 3) {
        guarded(a(2), nullptr, [&]() -> llvm::Value* {
          b_.CreateStore(a(1), smem_ptr(in.args[0]));
          return nullptr;
        });
      } else {
        b_.CreateStore(a(1), smem_ptr(in.args[0]));
      }
      return;
    case Op::smem_addr:
      set(r0, b_.CreatePtrToInt(smem_ptr(in.args[0]), b_.getInt32Ty()));
      return;
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

// ---------------------------------------------------------------- synchronisation and ordering

void Emitter::sync_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  V r0 = in.results.empty() ? 0 : in.results[0];
  switch (in.op) {
    case Op::barrier: intrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {}); return;
    case Op::named_barrier_sync:
    case Op::named_barrier_arrive: {
      // memory clobber: no load or store moves across a hand-over between warps; fenced, or
      // ptxas sinks the arithmetic computed before a turn (the softmax) past the bar.sync, into
      // the turn, and the warpgroups no longer overlap
      const std::string op = fmt::format("{} $0, $1;", in.op == Op::named_barrier_sync ? "bar.sync" : "bar.arrive");
      const std::string text = in.imm & pir::kBarrierUnfenced ? op : ptxas_fence(op, "TILEJIT_TURN");
      const auto threads = static_cast<uint32_t>(in.imm & (pir::kBarrierUnfenced - 1));
      asm_call(b_.getVoidTy(), text, "r,r,~{memory}", {a(0), b_.getInt32(threads)}, true, /*convergent=*/true);
      return;
    }
    case Op::ballot:
      set(r0, intrinsic(llvm::Intrinsic::nvvm_vote_ballot_sync, {}, {b_.getInt32(0xFFFFFFFFu), a(0)}));
      return;
    case Op::shfl_xor: {
      llvm::Type* t = a(0)->getType();
      auto shuffle = [&](llvm::Value* x) {
        auto id = x->getType()->isFloatTy() ? llvm::Intrinsic::nvvm_shfl_sync_bfly_f32 : llvm::Intrinsic::nvvm_shfl_sync_bfly_i32;
        return intrinsic(id, {}, {b_.getInt32(0xFFFFFFFFu), x, b_.getInt32(static_cast<uint32_t>(in.imm)), b_.getInt32(31)});
      };
      if (t->getPrimitiveSizeInBits() != 64) {
        set(r0, shuffle(a(0)));
        return;
      }
      // 64 bits: the two 32-bit halves, each shuffled (shfl moves one 32-bit register).
      llvm::Value* bits = b_.CreateBitCast(a(0), b_.getInt64Ty());
      llvm::Value* lo = shuffle(b_.CreateTrunc(bits, b_.getInt32Ty()));
      llvm::Value* hi = shuffle(b_.CreateTrunc(b_.CreateLShr(bits, 32), b_.getInt32Ty()));
      llvm::Value* both = b_.CreateOr(b_.CreateZExt(lo, b_.getInt64Ty()), b_.CreateShl(b_.CreateZExt(hi, b_.getInt64Ty()), 32));
      set(r0, b_.CreateBitCast(both, t));
      return;
    }
    case Op::mbar_init: asm_call(b_.getVoidTy(), "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", {a(0), a(1)}, true); return;
    case Op::mbar_expect_tx:
      asm_call(b_.getVoidTy(), "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}", {a(0), a(1)}, true);
      return;
    case Op::mbar_arrive: asm_call(b_.getVoidTy(), "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", {a(0)}, true); return;
    // The spin waits are convergent: LLVM otherwise tail-duplicated an mbarrier wait into the two
    // sides of a lane-0 branch (`wait K; if (lane 0) arrive; wait V` became lane 0 and its warp
    // waiting for V at two places), and the diverged warp hung on the GPU (the persistent dK/dV
    // with a ring producer, decision 074). CUDA C's asm (the nvrtc backend) is convergent already.
    case Op::sem_wait:
      asm_call(b_.getVoidTy(),
               "{\n\t.reg .pred P1;\n\t.reg .b32 V1;\n\tTILEJIT_SEM_${:uid}:\n\tld.acquire.gpu.global.b32 V1, [$0];\n\t"
               "setp.ge.s32 P1, V1, $1;\n\t@!P1 nanosleep.u32 32;\n\t@!P1 bra TILEJIT_SEM_${:uid};\n\t}",
               "l,r,~{memory}", {a(0), a(1)}, true, /*convergent=*/true);
      return;
    case Op::read_clock: set(r0, asm_call(b_.getInt64Ty(), "mov.u64 $0, %clock64;", "=l", {}, true)); return;
    case Op::sem_signal:
      asm_call(b_.getVoidTy(), "fence.acq_rel.gpu;\n\tred.release.gpu.global.add.s32 [$0], $1;", "l,r,~{memory}", {a(0), a(1)}, true);
      return;
    case Op::mbar_wait:
      if (const char* budget = std::getenv("TILEJIT_DEBUG_WAITS")) return debug_mbar_wait(a(0), a(1), budget);
      asm_call(b_.getVoidTy(),
               "{\n\t.reg .pred P1;\n\tTILEJIT_WAIT_${:uid}:\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1;\n\t"
               "@!P1 bra TILEJIT_WAIT_${:uid};\n\t}",
               "r,r,~{memory}", {a(0), a(1)}, true, /*convergent=*/true);
      return;
    case Op::atom_shared:
      set(in.results[0], asm_call(b_.getInt32Ty(), fmt::format("atom.{}.cta.shared::cta.{} $0, [$1], $2;", in.imm == pir::kAtomSharedCount ? "relaxed" : "acq_rel",
                                                               in.imm == pir::kAtomSharedExch ? "exch.b32" : "add.u32"),
                                  "=r,r,r,~{memory}", {a(0), a(1)}, true));
      return;
    case Op::mbar_inval: asm_call(b_.getVoidTy(), "mbarrier.inval.shared::cta.b64 [$0];", "r,~{memory}", {a(0)}, true); return;
    case Op::set_max_registers:
      asm_call(b_.getVoidTy(), fmt::format("setmaxnreg.{}.sync.aligned.u32 {};", in.imm > 0 ? "inc" : "dec", std::abs(in.imm)), "~{memory}",
               {}, true, /*convergent=*/true);
      return;
    case Op::fence_mbar_init: asm_call(b_.getVoidTy(), "fence.mbarrier_init.release.cluster;", "~{memory}", {}, true); return;
    case Op::exit_thread: asm_call(b_.getVoidTy(), "exit;", "~{memory}", {}, true, /*convergent=*/true); return;
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

void Emitter::opaque(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  // The values tied in and out of an empty volatile asm: LLVM must compute them before it
  // and keeps it in order with the other volatile asm (a wgmma wait), so the work cannot be
  // sunk to its uses. Types asm cannot name (i1) pass through.
  std::vector<llvm::Value*> args;
  std::vector<llvm::Type*> tys;
  std::vector<size_t> at;
  std::string outs, ins;
  for (size_t i = 0; i < in.args.size(); ++i) {
    llvm::Value* x = a(i);
    llvm::Type* t = x->getType();
    const char* c = t->isFloatTy() ? "f" : t->isDoubleTy() ? "d" : t->isIntegerTy(32) ? "r" : t->isIntegerTy(64) ? "l"
                    : t->isIntegerTy(16) ? "h" : nullptr;
    if (!c) {
      set(in.results[i], x);
      continue;
    }
    outs += fmt::format("{}={}", at.empty() ? "" : ",", c);
    ins += fmt::format(",{}", at.size());
    at.push_back(i);
    args.push_back(x);
    tys.push_back(t);
  }
  if (at.empty()) return;
  if (in.imm & pir::kOpaqueCopy) {
    for (size_t k = 0; k < at.size(); ++k) {
      const bool wide = tys[k]->isDoubleTy() || tys[k]->isIntegerTy(64);
      const char* c = tys[k]->isFloatTy() ? "f" : tys[k]->isDoubleTy() ? "d" : wide ? "l" : tys[k]->isIntegerTy(16) ? "h" : "r";
      const std::string text = tys[k]->isIntegerTy(16) ? "mov.b16 $0, $1;" : wide ? "mov.b64 $0, $1;" : "mov.b32 $0, $1;";
      set(in.results[at[k]], asm_call(tys[k], text, fmt::format("={},{}", c, c), {args[k]}, true));
    }
    return;
  }
  llvm::Type* ret = tys.size() == 1 ? tys[0] : llvm::StructType::get(ctx_, tys);
  llvm::Value* r = asm_call(ret, "", outs + ins, args, true);
  for (unsigned k = 0; k < at.size(); ++k) set(in.results[at[k]], tys.size() == 1 ? r : b_.CreateExtractValue(r, {k}));
}

void Emitter::keep_alive(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  // (thread_ir.hpp) predicated-off shared stores of each register, 16 registers an asm
  for (size_t first = 0; first < in.args.size(); first += 16) {
    const size_t count = std::min<size_t>(16, in.args.size() - first);
    std::string text = kNeverTrueP1, constraints;
    std::vector<llvm::Value*> args;
    for (size_t k = 0; k < count; ++k) {
      llvm::Value* x = a(first + k);
      llvm::Type* t = x->getType();
      const bool wide = t->isIntegerTy(64) || t->isDoubleTy();
      if (t->isFloatTy()) x = b_.CreateBitCast(x, b_.getInt32Ty());
      if (t->isDoubleTy()) x = b_.CreateBitCast(x, b_.getInt64Ty());
      if (t->isIntegerTy(16) || t->isIntegerTy(8) || t->isIntegerTy(1)) x = b_.CreateZExt(x, b_.getInt32Ty());
      text += fmt::format("\t@P1 st.shared.b{} [S1], ${};\n", wide ? 64 : 32, args.size());
      constraints += fmt::format("{}{}", args.empty() ? "" : ",", wide ? "l" : "r");
      args.push_back(x);
    }
    text += "}";
    asm_call(b_.getVoidTy(), text, constraints, args, true);
  }
}

// ---------------------------------------------------------------- tensor cores and TMA

llvm::Value* Emitter::mma(const pir::Inst& in) {
  const char* t = static_cast<DType>(in.imm) == DType::bf16 ? "bf16" : "f16";
  std::string text = fmt::format(
      "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};", t);
  llvm::Type* F = b_.getFloatTy();
  auto* ret = llvm::StructType::get(ctx_, {F, F, F, F});
  std::vector<llvm::Value*> args;
  for (V a : in.args) args.push_back(v(a));
  // convergent: LLVM sank an mma.sync whose result only an atomic's element-add fallback read into
  // that branch, where lanes diverge: the .aligned instruction then hung the warp (fuzzer, issue 28)
  return asm_call(ret, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", args, false, /*convergent=*/true);
}

llvm::Value* Emitter::mma_tf32(const pir::Inst& in) {
  llvm::Type* F = b_.getFloatTy();
  auto* ret = llvm::StructType::get(ctx_, {F, F, F, F});
  std::vector<llvm::Value*> args;
  for (V a : in.args) args.push_back(v(a));
  // convergent, as mma(): an .aligned instruction every lane of the warp must execute together
  return asm_call(ret,
                  "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                  "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", args, false, /*convergent=*/true);
}

std::string Emitter::with_tensor_map(V map, int operand, const std::string& text, llvm::Value*& arg) {
  auto it = byval_symbol_.find(map);
  if (it == byval_symbol_.end()) return text;
  const std::string from = fmt::format("[${},", operand);
  const size_t at = text.find(from);
  if (at == std::string::npos) fail(fmt::format("internal: no tensor map operand ${} in '{}'", operand, text));
  std::string body = text;
  body.replace(at, from.size(), "[tj_map,");
  arg = b_.getInt64(0);
  return fmt::format("{{\n\t.reg .b64 tj_map;\n\tmov.b64 tj_map, {};\n\tcvta.param.u64 tj_map, tj_map;\n\t{}\n\t}}", it->second, body);
}

void Emitter::tensor_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  switch (in.op) {
    case Op::mma_16816:
    case Op::mma_1688_tf32: {
      llvm::Value* s = in.op == Op::mma_16816 ? mma(in) : mma_tf32(in);
      for (unsigned i = 0; i < 4; ++i) set(in.results[i], b_.CreateExtractValue(s, {i}));
      return;
    }
    case Op::cvt_tf32:  // (no side effects: LLVM may merge or drop it like arithmetic)
      set(in.results[0], asm_call(b_.getInt32Ty(), "cvt.rna.tf32.f32 $0, $1;", "=r,f", {a(0)}, false));
      return;
    case Op::tma_load_2d: {
      llvm::Value* map = a(1);
      const std::string text = with_tensor_map(
          in.args[1], 1, "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {$2, $3}], [$4];", map);
      asm_call(b_.getVoidTy(), text, "r,l,r,r,r,~{memory}", {a(0), map, a(2), a(3), a(4)}, true);
      return;
    }
    case Op::tma_load:
    case Op::tma_reduce_add:
    case Op::tma_store: {
      // (shared addr, map, coordinates[, mbarrier]): the copy's operands, then "{c0, c1, ...}"
      const bool load = in.op == Op::tma_load;
      const auto rank = static_cast<size_t>(in.imm);
      std::string coords, cons = load ? "r,l" : "l,r";
      std::vector<llvm::Value*> args{load ? a(0) : a(1), load ? a(1) : a(0)};
      const int map_operand = load ? 1 : 0;  // (the map is in.args[1] either way)
      for (size_t i = 0; i < rank; ++i) {
        coords += fmt::format("{}${}", i ? ", " : "", i + 2);
        cons += ",r";
        args.push_back(a(2 + i));
      }
      if (!load) {
        const std::string text = with_tensor_map(
            in.args[1], map_operand,
            in.op == Op::tma_store
                ? fmt::format("cp.async.bulk.tensor.{}d.global.shared::cta.tile.bulk_group [$0, {{{}}}], [$1];", rank, coords)
                : fmt::format("cp.reduce.async.bulk.tensor.{}d.global.shared::cta.add.tile.bulk_group [$0, {{{}}}], [$1];", rank, coords),
            args[static_cast<size_t>(map_operand)]);
        asm_call(b_.getVoidTy(), text, cons + ",~{memory}", args, true);
        return;
      }
      args.push_back(a(2 + rank));
      const std::string text = with_tensor_map(
          in.args[1], map_operand,
          fmt::format("cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {{{}}}], [${}];", rank,
                      coords, rank + 2),
          args[static_cast<size_t>(map_operand)]);
      asm_call(b_.getVoidTy(), text, cons + ",r,~{memory}", args, true);
      return;
    }
    case Op::bulk_commit: asm_call(b_.getVoidTy(), "cp.async.bulk.commit_group;", "~{memory}", {}, true); return;
    case Op::bulk_wait:
      asm_call(b_.getVoidTy(),
               fmt::format("cp.async.bulk.wait_group{} {};", in.imm & pir::kBulkWaitRead ? ".read" : "", in.imm & 0xFF),
               "~{memory}", {}, true);
      return;
    case Op::fence_proxy_async_global: asm_call(b_.getVoidTy(), "fence.proxy.async.global;", "~{memory}", {}, true); return;
    case Op::fence_proxy_async: asm_call(b_.getVoidTy(), "fence.proxy.async.shared::cta;", "~{memory}", {}, true); return;
    case Op::wgmma_fence: asm_call(b_.getVoidTy(), "wgmma.fence.sync.aligned;", "~{memory}", {}, true, true); return;
    case Op::wgmma_commit:
      asm_call(b_.getVoidTy(),
               in.imm & pir::kCommitFenced ? ptxas_fence_after("wgmma.commit_group.sync.aligned;", "TILEJIT_WGCOMMIT")
                                           : "wgmma.commit_group.sync.aligned;",
               "~{memory}", {}, true, /*convergent=*/true);
      return;
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

void Emitter::wgmma(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  bool is_wait = in.op == Op::wgmma_wait, rs = in.op == Op::wgmma_rs;
  size_t n = in.results.size();
  size_t first_acc = is_wait ? 0 : rs ? 5 : 2;
  std::string regs, cons;
  for (size_t i = 0; i < n; ++i) {
    regs += fmt::format("{}${}", i ? ", " : "", i);
    cons += fmt::format("{}=f", i ? "," : "");
  }
  std::string text;
  std::vector<llvm::Value*> args;
  if (is_wait) {
    text = fmt::format("wgmma.wait_group.sync.aligned {};", in.imm & 0xFF);
    if (in.imm & pir::kWaitFenced) text = ptxas_fence(text, "TILEJIT_WGWAIT");
  } else {
    int64_t nn = in.imm & 0xFFFF;
    const char* t = static_cast<DType>((in.imm >> 16) & 0xFF) == DType::bf16 ? "bf16" : "f16";
    int64_t trans_b = (in.imm >> 24) & 1, trans_a = (in.imm >> 26) & 1;
    // bit 25: D = A*B (scale-d = 0): the accumulator inputs are not read, so not tied
    llvm::Value* scale_d = b_.getInt32((in.imm >> 25) & 1 ? 0 : 1);
    if (rs) {  // A from registers: no transpose-A immediate
      text = fmt::format("{{\n\t.reg .pred p;\n\tsetp.ne.b32 p, ${}, 0;\n\twgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} "
                         "{{{}}}, {{${}, ${}, ${}, ${}}}, ${}, p, 1, 1, {};\n\t}}",
                         n + 5, nn, t, t, regs, n, n + 1, n + 2, n + 3, n + 4, trans_b);
      cons += ",r,r,r,r,l,r";
      args = {a(0), a(1), a(2), a(3), a(4), scale_d};
    } else {
      text = fmt::format("{{\n\t.reg .pred p;\n\tsetp.ne.b32 p, ${}, 0;\n\twgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} "
                         "{{{}}}, ${}, ${}, p, 1, 1, {}, {};\n\t}}",
                         n + 2, nn, t, t, regs, n, n + 1, trans_a, trans_b);
      cons += ",l,l,r";
      args = {a(0), a(1), scale_d};
    }
  }
  const bool tie = is_wait || !((in.imm >> 25) & 1);
  for (size_t i = 0; tie && i < n; ++i) {
    cons += fmt::format(",{}", i);
    args.push_back(a(first_acc + i));
  }
  if (n == 0) {  // a wait that orders only through memory and other asm
    asm_call(b_.getVoidTy(), text, "~{memory}", {}, true, /*convergent=*/true);
    return;
  }
  cons += ",~{memory}";
  std::vector<llvm::Type*> fs(n, b_.getFloatTy());
  auto* ret = llvm::StructType::get(ctx_, fs);
  llvm::Value* sv = asm_call(ret, text, cons, args, true, /*convergent=*/true);  // .sync.aligned: the warpgroup
  for (unsigned i = 0; i < n; ++i) set(in.results[i], b_.CreateExtractValue(sv, {i}));
}

// TILEJIT_DEBUG_WAITS=CYCLES[:ADDRESS] (debugging hangs; the compile cache keys it apart): an
// mbarrier wait that has not passed after CYCLES gives up, so that a kernel that would hang
// finishes, and lane 0 of the warp records where it stood: with ADDRESS (a device buffer of u32,
// zeroed: [0] counts records, record k at 8 + 8 k: site, program, thread, barrier offset, parity,
// clock) by plain stores, which leave the schedule as it was; else by printf (an extern call:
// ptxas then serialises the wgmmas, which can hide a race).
void Emitter::debug_mbar_wait(llvm::Value* bar, llvm::Value* parity, const char* spec) {
  char* rest = nullptr;
  const long long budget = std::strtoll(spec, &rest, 10);
  const unsigned long long address = rest && *rest == ':' ? std::strtoull(rest + 1, nullptr, 0) : 0;
  const int site = debug_wait_sites_++;
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  auto clock = [&] { return asm_call(b_.getInt64Ty(), "mov.u64 $0, %clock64;", "=l", {}, true); };
  llvm::Value* start = budget < 0 ? nullptr : clock();
  auto* loop = llvm::BasicBlock::Create(ctx_, "dbg_wait", fn);
  auto* check = llvm::BasicBlock::Create(ctx_, "dbg_check", fn);
  auto* report = llvm::BasicBlock::Create(ctx_, "dbg_report", fn);
  auto* done = llvm::BasicBlock::Create(ctx_, "dbg_done", fn);
  b_.CreateBr(loop);
  b_.SetInsertPoint(loop);
  llvm::Value* ok = asm_call(b_.getInt32Ty(),
                             "{\n\t.reg .pred P1;\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [$1], $2;\n\tselp.b32 $0, 1, 0, P1;\n\t}",
                             "=r,r,r,~{memory}", {bar, parity}, true, /*convergent=*/true);
  if (budget < 0) {  // (the same wait as a loop LLVM sees, without the watchdog)
    b_.CreateCondBr(b_.CreateICmpNE(ok, b_.getInt32(0)), done, loop);
    check->eraseFromParent();
    report->eraseFromParent();
    b_.SetInsertPoint(done);
    return;
  }
  b_.CreateCondBr(b_.CreateICmpNE(ok, b_.getInt32(0)), done, check);
  b_.SetInsertPoint(check);
  llvm::Value* now = clock();
  llvm::Value* late = b_.CreateICmpSGT(b_.CreateSub(now, start), b_.getInt64(static_cast<uint64_t>(budget)));
  b_.CreateCondBr(late, report, loop);
  b_.SetInsertPoint(report);
  llvm::Value* tid = intrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, {}, {});
  llvm::Value* cta = intrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, {}, {});
  auto* print = llvm::BasicBlock::Create(ctx_, "dbg_print", fn);
  b_.CreateCondBr(b_.CreateICmpEQ(b_.CreateAnd(tid, b_.getInt32(31)), b_.getInt32(0)), print, done);
  b_.SetInsertPoint(print);
  llvm::Value* offset = b_.CreateSub(bar, b_.CreatePtrToInt(smem_, b_.getInt32Ty()));
  llvm::Type* i32 = b_.getInt32Ty();
  llvm::Value* vals[] = {b_.getInt32(static_cast<uint32_t>(site)), cta, tid, offset, parity, b_.CreateTrunc(now, i32)};
  if (address) {
    llvm::Value* base = b_.getInt64(address);
    llvm::Value* k = asm_call(i32, "atom.global.add.u32 $0, [$1], 1;", "=r,l,~{memory}", {base}, true);
    auto* store = llvm::BasicBlock::Create(ctx_, "dbg_store", fn);
    b_.CreateCondBr(b_.CreateICmpULT(k, b_.getInt32(4096)), store, done);
    b_.SetInsertPoint(store);
    llvm::Value* rec = b_.CreateAdd(base, b_.CreateMul(b_.CreateZExt(b_.CreateAdd(k, b_.getInt32(1)), b_.getInt64Ty()), b_.getInt64(32)));
    for (unsigned i = 0; i < 6; ++i)
      asm_call(b_.getVoidTy(), "st.global.u32 [$0], $1;", "l,r,~{memory}", {b_.CreateAdd(rec, b_.getInt64(4 * i)), vals[i]}, true);
    b_.CreateBr(done);
  } else {
    auto* args_ty = llvm::StructType::get(ctx_, {i32, i32, i32, i32, i32, i32});
    llvm::IRBuilder<> entry_b(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    llvm::AllocaInst* buf = entry_b.CreateAlloca(args_ty);
    for (unsigned i = 0; i < 6; ++i) b_.CreateStore(vals[i], b_.CreateStructGEP(args_ty, buf, i));
    auto* fmt_global =
        b_.CreateGlobalString("tilejit wait timeout: site %d program %d thread %d barrier +%d parity %d clock %u\n", "dbg_fmt", 1);
    llvm::FunctionCallee vprintf = m_.getOrInsertFunction("vprintf", llvm::FunctionType::get(i32, {b_.getPtrTy(), b_.getPtrTy()}, false));
    b_.CreateCall(vprintf, {b_.CreateAddrSpaceCast(fmt_global, b_.getPtrTy()), buf});
    b_.CreateBr(done);
  }
  b_.SetInsertPoint(done);
}

}  // namespace tilejit::jit::llvm_backend
