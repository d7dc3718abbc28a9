// Per-thread IR -> LLVM IR -> PTX. One of the two translation units that include LLVM's headers
// (each costs ~20 s to compile). Predicated global accesses and tensor-core ops use inline PTX, as
// Triton does; everything else is plain LLVM IR so that O3 can simplify it.
// This file: the module, the kernel's function and the pass pipeline, arithmetic and conversions,
// the dispatch of instructions and control flow; llvm_backend/gpu_ops.cpp: memory,
// synchronisation, tensor cores and TMA.
#include "jit/llvm_backend.hpp"
#include "jit/llvm_backend/emitter.hpp"
#include "jit/timing.hpp"

#include <fmt/format.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <stdexcept>

namespace tilejit::jit {
namespace {

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    // 32-bit shared-memory pointers: half the registers for shared addresses.
    const char* args[] = {"tilejit", "-nvptx-short-ptr"};
    llvm::cl::ParseCommandLineOptions(2, args, "tilejit\n");
  });
}

}  // namespace

namespace llvm_backend {

void Emitter::run() {
  std::vector<llvm::Type*> params;
  // (a by-value blob is a generic pointer to the parameter: byval + grid_constant below)
  for (const pir::Param& p : f_.params) params.push_back(p.byval_bytes ? llvm::PointerType::get(ctx_, 0) : type(p.ty));
  auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_), params, false);
  fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, f_.name, m_);
  fn_->setCallingConv(llvm::CallingConv::PTX_Kernel);
  for (size_t i = 0; i < f_.params.size(); ++i) {
    fn_->getArg(static_cast<unsigned>(i))->setName(f_.params[i].name);
    if (f_.params[i].byval_bytes) {
      auto* blob = llvm::ArrayType::get(b_.getInt8Ty(), static_cast<uint64_t>(f_.params[i].byval_bytes));
      fn_->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::getWithByValType(ctx_, blob));
      fn_->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::getWithAlignment(ctx_, llvm::Align(64)));
    } else if (f_.params[i].ty.ptr) {
      fn_->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoAlias);
    }
  }
  // Kernel and launch-bound annotations (kept for LLVMs that still read them).
  auto* md = m_.getOrInsertNamedMetadata("nvvm.annotations");
  auto i32 = [&](int v) { return llvm::ConstantAsMetadata::get(b_.getInt32(v)); };
  md->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, "kernel"), i32(1)}));
  md->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, "maxntidx"), i32(f_.num_threads)}));
  // By-value blobs are read in place in the parameter space (grid_constant: NVPTX takes their
  // address with cvta.param instead of copying them to local memory, where TMA cannot read them).
  std::vector<llvm::Metadata*> grid_constant;
  for (size_t i = 0; i < f_.params.size(); ++i)
    if (f_.params[i].byval_bytes) grid_constant.push_back(i32(static_cast<int>(i) + 1));  // 1-based
  if (!grid_constant.empty())
    md->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, "grid_constant"),
                                            llvm::MDNode::get(ctx_, grid_constant)}));
  if (f_.min_programs_per_sm > 0)  // .minnctapersm
    md->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, "minctasm"), i32(f_.min_programs_per_sm)}));
  smem_ = new llvm::GlobalVariable(m_, llvm::ArrayType::get(b_.getInt8Ty(), 0), false, llvm::GlobalValue::ExternalLinkage,
                                   nullptr, "tilejit_smem", nullptr, llvm::GlobalValue::NotThreadLocal, 3);
  smem_->setAlignment(llvm::Align(1024));  // 128-byte-swizzled TMA/wgmma tiles need 1024-byte alignment
  vals_.assign(f_.types.size(), nullptr);
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
  block(f_.body);
  b_.CreateRetVoid();
}

// ---------------------------------------------------------------- arithmetic

llvm::Value* Emitter::math(Op op, llvm::Value* x) {
  llvm::Type* t = x->getType();
  if (t->isDoubleTy()) {
    if (op == Op::sqrt) return intrinsic(llvm::Intrinsic::sqrt, {t}, {x});
    if (op == Op::floor) return intrinsic(llvm::Intrinsic::floor, {t}, {x});
    if (op == Op::ceil) return intrinsic(llvm::Intrinsic::ceil, {t}, {x});
    fail(fmt::format("{} on f64 is not supported on the GPU yet", pir::op_name(op)));
  }
  llvm::Value* f = to_f32(x);
  llvm::Type* F = b_.getFloatTy();
  llvm::Value* r = nullptr;
  switch (op) {
    case Op::exp2: r = intrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {f}); break;
    case Op::exp:
      r = intrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {b_.CreateFMul(f, llvm::ConstantFP::get(F, 1.4426950408889634))});
      break;
    case Op::log2: r = intrinsic(llvm::Intrinsic::nvvm_lg2_approx_f, {}, {f}); break;
    case Op::log:
      r = b_.CreateFMul(intrinsic(llvm::Intrinsic::nvvm_lg2_approx_f, {}, {f}), llvm::ConstantFP::get(F, 0.6931471805599453));
      break;
    case Op::sqrt: r = intrinsic(llvm::Intrinsic::sqrt, {F}, {f}); break;
    case Op::rsqrt: r = intrinsic(llvm::Intrinsic::nvvm_rsqrt_approx_f, {}, {f}); break;
    case Op::rcp: r = intrinsic(llvm::Intrinsic::nvvm_rcp_approx_ftz_f, {}, {f}); break;
    case Op::floor: r = intrinsic(llvm::Intrinsic::floor, {F}, {f}); break;
    case Op::ceil: r = intrinsic(llvm::Intrinsic::ceil, {F}, {f}); break;
    case Op::sin: r = intrinsic(llvm::Intrinsic::nvvm_sin_approx_f, {}, {f}); break;
    case Op::cos: r = intrinsic(llvm::Intrinsic::nvvm_cos_approx_f, {}, {f}); break;
    case Op::tanh: r = asm_call(F, "tanh.approx.f32 $0, $1;", "=f,f", {f}, false); break;
    case Op::erf: {
      // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): erf(x) = s * (1 - poly(t) * exp(-x^2)), t = 1/(1+p|x|)
      llvm::Value* ax = intrinsic(llvm::Intrinsic::fabs, {F}, {f});
      llvm::Value* q = b_.CreateFDiv(llvm::ConstantFP::get(F, 1.0),
                                     b_.CreateFAdd(llvm::ConstantFP::get(F, 1.0), b_.CreateFMul(ax, llvm::ConstantFP::get(F, 0.3275911))));
      const double a[5] = {0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429};
      llvm::Value* p = llvm::ConstantFP::get(F, a[4]);
      for (int i = 3; i >= 0; --i) p = b_.CreateFAdd(b_.CreateFMul(p, q), llvm::ConstantFP::get(F, a[i]));
      p = b_.CreateFMul(p, q);
      llvm::Value* e = intrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {},
                                 {b_.CreateFMul(b_.CreateFNeg(b_.CreateFMul(ax, ax)), llvm::ConstantFP::get(F, 1.4426950408889634))});
      llvm::Value* y = b_.CreateFSub(llvm::ConstantFP::get(F, 1.0), b_.CreateFMul(p, e));
      r = intrinsic(llvm::Intrinsic::copysign, {F}, {y, f});
      break;
    }
    default: fail("not a math op");
  }
  return from_f32(r, t);
}

llvm::Value* Emitter::min_max(bool is_max, V a, V b) {
  llvm::Value *x = v(a), *y = v(b);
  if (!is_fp(a)) {
    auto id = is_max ? (sgn(a) ? llvm::Intrinsic::smax : llvm::Intrinsic::umax) : (sgn(a) ? llvm::Intrinsic::smin : llvm::Intrinsic::umin);
    return intrinsic(id, {x->getType()}, {x, y});
  }
  // LLVM 19's min/max simplification crashes (SIGSEGV in getInverseMinMaxIntrinsic, fixed upstream
  // by llvm-project#173705) on an operand that is another intrinsic's result, e.g. minimum(fma(a,
  // b, a), minimum(a, b)), found by the fuzzer: such operands go through an opaque mov.
  auto opaque = [&](llvm::Value* o) -> llvm::Value* {
    auto* ii = llvm::dyn_cast<llvm::IntrinsicInst>(o);
    if (!ii || ii->getCalledFunction()->getName().starts_with("llvm.nvvm.")) return o;  // (shuffles: the row max)
    switch (ii->getIntrinsicID()) {
      case llvm::Intrinsic::minimum: case llvm::Intrinsic::maximum: case llvm::Intrinsic::minnum: case llvm::Intrinsic::maxnum:
        return o;
      default: break;
    }
    const bool f64 = o->getType()->isDoubleTy();
    return asm_call(o->getType(), f64 ? "mov.b64 $0, $1;" : "mov.b32 $0, $1;", f64 ? "=d,d" : "=f,f", {o}, false);
  };
  // NaN-propagating, -0 below +0 (the interpreter's and PTX max.NaN's semantics), computed in
  // >= f32; f32 is one max.NaN/min.NaN instruction.
  llvm::Type* t = x->getType();
  if (t->isFloatTy() || t->isDoubleTy()) {
    x = opaque(x);
    y = opaque(y);
  }
  if (!t->isDoubleTy())
    return from_f32(intrinsic(is_max ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, {b_.getFloatTy()}, {to_f32(x), to_f32(y)}), t);
  llvm::Value *fx = t->isDoubleTy() ? x : to_f32(x), *fy = t->isDoubleTy() ? y : to_f32(y);
  llvm::Value* m = intrinsic(is_max ? llvm::Intrinsic::maxnum : llvm::Intrinsic::minnum, {fx->getType()}, {fx, fy});
  llvm::Value* nan = b_.CreateFCmpUNO(fx, fy);
  m = b_.CreateSelect(nan, b_.CreateFAdd(fx, fy), m);
  return t->isDoubleTy() ? m : from_f32(m, t);
}

// Floating-point remainder, exact: std::fmod, as the interpreter computes it (LLVM's frem becomes
// x - trunc(x / y) * y on NVPTX, far off for large quotients). f16/bf16 run in f32, which is exact:
// the remainder of two f16 values is an f16 value.
llvm::Value* Emitter::frem(llvm::Value* x, llvm::Value* y) {
  llvm::Type* t = x->getType();
  const bool f64 = t->isDoubleTy();
  llvm::Value* r = b_.CreateCall(fmod_function(f64), {f64 ? x : to_f32(x), f64 ? y : to_f32(y)});
  return f64 ? r : from_f32(r, t);
}

// tilejit_fmod_f32 / _f64, internal and always inlined (cuda_backend/prelude.cpp's tj_frem is the
// same). NaN where x is infinite, y zero or either NaN; x where |x| < |y|; else, with a = |x| and
// b = |y|: while a / b >= 2^p (p = 23 / 52), a is reduced modulo d = b's significand at a's
// exponent - (p - 1) (a multiple of b, a / d < 2^p; b * 2^p instead of b if b is subnormal, a
// normal multiple), then modulo b. A step a mod d (a / d < 2^p): q = trunc(a / d) is the quotient
// or one more (the division rounds to nearest), r = fma(-q, d, a) is exact (a multiple of d's ulp
// no larger than d), plus d if negative. The result takes x's sign.
llvm::Function* Emitter::fmod_function(bool f64) {
  const char* name = f64 ? "tilejit_fmod_f64" : "tilejit_fmod_f32";
  if (llvm::Function* f = m_.getFunction(name)) return f;
  llvm::Type* F = f64 ? b_.getDoubleTy() : b_.getFloatTy();
  llvm::IntegerType* I = f64 ? b_.getInt64Ty() : b_.getInt32Ty();
  const int p = f64 ? 52 : 23;
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(F, {F, F}, false), llvm::Function::InternalLinkage, name, m_);
  fn->addFnAttr(llvm::Attribute::AlwaysInline);
  llvm::IRBuilder<> b(ctx_);
  auto block = [&](const char* n) { return llvm::BasicBlock::Create(ctx_, n, fn); };
  auto fc = [&](double v) { return llvm::ConstantFP::get(F, v); };
  auto call = [&](llvm::Intrinsic::ID id, llvm::ArrayRef<llvm::Value*> args) {
    return b.CreateCall(llvm::Intrinsic::getDeclaration(&m_, id, {F}), args);
  };
  auto step = [&](llvm::Value* a, llvm::Value* d) {  // a mod d, for a / d < 2^p
    llvm::Value* q = call(llvm::Intrinsic::trunc, {b.CreateFDiv(a, d)});
    llvm::Value* r = call(llvm::Intrinsic::fma, {b.CreateFNeg(q), d, a});
    return b.CreateSelect(b.CreateFCmpOLT(r, fc(0.0)), b.CreateFAdd(r, d), r);
  };
  llvm::BasicBlock *entry = block("entry"), *nan = block("nan"), *finite = block("finite"), *small = block("small");
  llvm::BasicBlock *big = block("big"), *reduce = block("reduce"), *head = block("head"), *body = block("body");
  llvm::BasicBlock *last = block("last"), *tail = block("tail");
  llvm::Value *x = fn->getArg(0), *y = fn->getArg(1);
  b.SetInsertPoint(entry);
  llvm::Value *ax = call(llvm::Intrinsic::fabs, {x}), *ay = call(llvm::Intrinsic::fabs, {y});
  b.CreateCondBr(b.CreateOr(b.CreateFCmpULE(ay, fc(0.0)), b.CreateFCmpUGE(ax, fc(INFINITY))), nan, finite);
  b.SetInsertPoint(nan);
  llvm::Value* xy = b.CreateFMul(x, y);
  b.CreateRet(b.CreateFDiv(xy, xy));
  b.SetInsertPoint(finite);
  b.CreateCondBr(b.CreateFCmpOLT(ax, ay), small, big);
  b.SetInsertPoint(small);
  b.CreateRet(x);
  b.SetInsertPoint(big);
  llvm::Value* ay_p = b.CreateFMul(ay, fc(std::ldexp(1.0, p)));
  b.CreateCondBr(b.CreateFCmpOGE(ax, ay_p), reduce, tail);
  b.SetInsertPoint(reduce);
  llvm::Value* bn = b.CreateSelect(b.CreateFCmpOLT(ay, fc(std::ldexp(1.0, f64 ? -1022 : -126))), ay_p, ay);
  llvm::Value* bn_p = b.CreateFMul(bn, fc(std::ldexp(1.0, p)));
  llvm::Value* mant = b.CreateAnd(b.CreateBitCast(bn, I), llvm::ConstantInt::get(I, (uint64_t{1} << p) - 1));
  b.CreateBr(head);
  b.SetInsertPoint(head);
  llvm::PHINode* a = b.CreatePHI(F, 2);
  a->addIncoming(ax, reduce);
  b.CreateCondBr(b.CreateFCmpOGE(a, bn_p), body, last);
  b.SetInsertPoint(body);
  llvm::Value* e = b.CreateLShr(b.CreateBitCast(a, I), p);
  llvm::Value* d = b.CreateBitCast(b.CreateOr(mant, b.CreateShl(b.CreateSub(e, llvm::ConstantInt::get(I, p - 1)), p)), F);
  a->addIncoming(step(a, d), body);
  b.CreateBr(head);
  b.SetInsertPoint(last);
  llvm::Value* reduced = step(a, bn);
  b.CreateBr(tail);
  b.SetInsertPoint(tail);
  llvm::PHINode* a2 = b.CreatePHI(F, 2);
  a2->addIncoming(ax, big);
  a2->addIncoming(reduced, last);
  b.CreateRet(call(llvm::Intrinsic::copysign, {step(a2, ay), x}));
  return fn;
}

// Shift amounts >= the width give 0 (or the sign) rather than LLVM's poison.
llvm::Value* Emitter::shift(bool left, V a, V b) {
  llvm::Value *x = v(a), *s = v(b);
  unsigned w = x->getType()->getIntegerBitWidth();
  llvm::Value* big = b_.CreateICmpUGE(s, llvm::ConstantInt::get(s->getType(), w));
  llvm::Value* safe = b_.CreateSelect(big, llvm::ConstantInt::get(s->getType(), 0), s);
  if (left) return b_.CreateSelect(big, llvm::ConstantInt::get(x->getType(), 0), b_.CreateShl(x, safe));
  if (sgn(a)) return b_.CreateAShr(x, b_.CreateSelect(big, llvm::ConstantInt::get(s->getType(), w - 1), s));
  return b_.CreateSelect(big, llvm::ConstantInt::get(x->getType(), 0), b_.CreateLShr(x, safe));
}

// Integer division and remainder without LLVM's undefined cases (the interpreter's rules).
llvm::Value* Emitter::int_divrem(bool div, V a, V b) {
  llvm::Value *x = v(a), *y = v(b);
  llvm::Type* t = x->getType();
  llvm::Value* zero = b_.CreateICmpEQ(y, llvm::ConstantInt::get(t, 0));
  llvm::Value* safe = b_.CreateSelect(zero, llvm::ConstantInt::get(t, 1), y);
  llvm::Value* r;
  if (sgn(a)) {
    llvm::Value* minus1 = b_.CreateICmpEQ(y, llvm::ConstantInt::getSigned(t, -1));
    safe = b_.CreateSelect(minus1, llvm::ConstantInt::get(t, 1), safe);
    r = div ? b_.CreateSDiv(x, safe) : b_.CreateSRem(x, safe);
    r = b_.CreateSelect(minus1, div ? b_.CreateNeg(x) : llvm::ConstantInt::get(t, 0), r);
  } else {
    r = div ? b_.CreateUDiv(x, safe) : b_.CreateURem(x, safe);
  }
  return b_.CreateSelect(zero, div ? llvm::ConstantInt::getSigned(t, -1) : x, r);
}

llvm::Value* Emitter::cast(V a, pir::Ty to) {
  llvm::Value* x = v(a);
  pir::Ty from = f_.types[a];
  llvm::Type* T = type(to);
  if (from == to) return x;
  DType fd = from.dtype, td = to.dtype;
  if (ir::is_fp8(fd) || ir::is_fp8(td)) fail("fp8 conversions are not supported on the GPU yet");
  if (td == DType::i1) {
    return ir::is_float(fd) ? b_.CreateFCmpUNE(x, llvm::ConstantFP::get(x->getType(), 0.0))
                            : b_.CreateICmpNE(x, llvm::ConstantInt::get(x->getType(), 0));
  }
  bool ff = ir::is_float(fd), tf = ir::is_float(td);
  if (ff && tf) {
    unsigned fw = x->getType()->getPrimitiveSizeInBits(), tw = T->getPrimitiveSizeInBits();
    if (fw == tw) return b_.CreateFPTrunc(b_.CreateFPExt(x, b_.getFloatTy()), T);  // f16 <-> bf16 through f32 (exact)
    return fw > tw ? b_.CreateFPTrunc(x, T) : b_.CreateFPExt(x, T);
  }
  if (!ff && tf) return (ir::is_signed(fd) && fd != DType::i1) ? b_.CreateSIToFP(x, T) : b_.CreateUIToFP(x, T);
  if (ff && !tf) {
    llvm::Value* f = x->getType()->isDoubleTy() ? x : to_f32(x);
    return intrinsic(ir::is_signed(td) ? llvm::Intrinsic::fptosi_sat : llvm::Intrinsic::fptoui_sat, {T, f->getType()}, {f});
  }
  return b_.CreateIntCast(x, T, ir::is_signed(fd) && fd != DType::i1);
}

void Emitter::arith_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return v(in.args[i]); };
  V r0 = in.results.empty() ? 0 : in.results[0];
  switch (in.op) {
    case Op::constant: {
      pir::Ty t = f_.types[r0];
      llvm::Type* T = type(t);
      set(r0, ir::is_float(t.dtype) && !ir::is_fp8(t.dtype) ? llvm::ConstantFP::get(T, in.fimm)
                                                            : static_cast<llvm::Value*>(llvm::ConstantInt::get(T, static_cast<uint64_t>(in.imm), true)));
      return;
    }
    case Op::param:
      set(r0, fn_->getArg(static_cast<unsigned>(in.imm)));
      if (f_.params[static_cast<size_t>(in.imm)].byval_bytes) byval_symbol_[r0] = fmt::format("{}_param_{}", f_.name, in.imm);
      return;
    case Op::thread_id: set(r0, intrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, {}, {})); return;
    case Op::block_id: {
      static const llvm::Intrinsic::ID ids[3] = {llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y,
                                                 llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z};
      set(r0, intrinsic(ids[in.imm], {}, {}));
      return;
    }
    case Op::grid_dim: {
      static const llvm::Intrinsic::ID ids[3] = {llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_y,
                                                 llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_z};
      set(r0, intrinsic(ids[in.imm], {}, {}));
      return;
    }
    case Op::add: set(r0, is_fp(in.args[0]) ? b_.CreateFAdd(a(0), a(1)) : b_.CreateAdd(a(0), a(1))); return;
    case Op::sub:
      if (!is_fp(in.args[0]) && narrow_int(in.args[0])) set(r0, in_32_bits(in, [&](auto w) { return b_.CreateSub(w(0), w(1)); }));
      else set(r0, is_fp(in.args[0]) ? b_.CreateFSub(a(0), a(1)) : b_.CreateSub(a(0), a(1)));
      return;
    case Op::mul:
      if (!is_fp(in.args[0]) && narrow_int(in.args[0])) set(r0, in_32_bits(in, [&](auto w) { return b_.CreateMul(w(0), w(1)); }));
      else set(r0, is_fp(in.args[0]) ? b_.CreateFMul(a(0), a(1)) : b_.CreateMul(a(0), a(1)));
      return;
    case Op::div: set(r0, is_fp(in.args[0]) ? b_.CreateFDiv(a(0), a(1)) : int_divrem(true, in.args[0], in.args[1])); return;
    case Op::rem: set(r0, is_fp(in.args[0]) ? frem(a(0), a(1)) : int_divrem(false, in.args[0], in.args[1])); return;
    case Op::minimum: set(r0, min_max(false, in.args[0], in.args[1])); return;
    case Op::maximum: set(r0, min_max(true, in.args[0], in.args[1])); return;
    case Op::bit_and: set(r0, b_.CreateAnd(a(0), a(1))); return;
    case Op::bit_or: set(r0, b_.CreateOr(a(0), a(1))); return;
    case Op::bit_xor: set(r0, b_.CreateXor(a(0), a(1))); return;
    case Op::shl: set(r0, shift(true, in.args[0], in.args[1])); return;
    case Op::shr: set(r0, shift(false, in.args[0], in.args[1])); return;
    case Op::umulhi: {
      llvm::Type* T = a(0)->getType();
      unsigned w = T->getIntegerBitWidth();
      llvm::Type* W = b_.getIntNTy(2 * w);
      llvm::Value* p = b_.CreateMul(b_.CreateZExt(a(0), W), b_.CreateZExt(a(1), W));
      set(r0, b_.CreateTrunc(b_.CreateLShr(p, w), T));
      return;
    }
    case Op::byte_perm:  // llvm.nvvm.prmt is prmt.b32 (default mode); LLVM knows it is pure
      set(r0, intrinsic(llvm::Intrinsic::nvvm_prmt, {}, {a(0), a(1), a(2)}));
      return;
    case Op::fma: set(r0, intrinsic(llvm::Intrinsic::fma, {a(0)->getType()}, {a(0), a(1), a(2)})); return;
    case Op::neg:
      if (!is_fp(in.args[0]) && narrow_int(in.args[0])) set(r0, in_32_bits(in, [&](auto w) { return b_.CreateNeg(w(0)); }));
      else set(r0, is_fp(in.args[0]) ? b_.CreateFNeg(a(0)) : b_.CreateNeg(a(0)));
      return;
    case Op::bit_not: set(r0, b_.CreateNot(a(0))); return;
    case Op::popc: set(r0, intrinsic(llvm::Intrinsic::ctpop, {a(0)->getType()}, {a(0)})); return;
    case Op::abs: {
      llvm::Value* x = a(0);
      if (is_fp(in.args[0])) set(r0, intrinsic(llvm::Intrinsic::fabs, {x->getType()}, {x}));
      else if (!sgn(in.args[0])) set(r0, x);
      else if (x->getType()->getIntegerBitWidth() < 32) {
        // abs.s16 then cvt.s32.s16 gives +32768 for -32768 on the H100 where it wraps to -32768
        // (found by the fuzzer): abs.s32 of the widened value, then wrapped. The opaque mov hides
        // the widening, so LLVM cannot narrow the abs back to abs.s16.
        llvm::Value* wide = asm_call(b_.getInt32Ty(), "mov.b32 $0, $1;", "=r,r", {b_.CreateSExt(x, b_.getInt32Ty())}, false);
        llvm::Value* w = intrinsic(llvm::Intrinsic::abs, {b_.getInt32Ty()}, {wide, b_.getFalse()});
        set(r0, b_.CreateTrunc(w, x->getType()));
      }
      else {
        // (x ^ s) - s with the sign mask s opaque: from abs.s32 the GPU read abs(INT_MIN) < 0 as
        // false and abs(INT_MIN) >> 16 as positive (found by the fuzzer); INT_MIN stays INT_MIN
        const unsigned w = x->getType()->getIntegerBitWidth();
        llvm::Value* sign = b_.CreateAShr(x, w - 1);
        sign = w == 64 ? asm_call(b_.getInt64Ty(), "mov.b64 $0, $1;", "=l,l", {sign}, false)
                       : asm_call(b_.getInt32Ty(), "mov.b32 $0, $1;", "=r,r", {sign}, false);
        set(r0, b_.CreateSub(b_.CreateXor(x, sign), sign));
      }
      return;
    }
    case Op::exp2: case Op::log2: case Op::exp: case Op::log: case Op::sqrt: case Op::rsqrt: case Op::rcp: case Op::floor:
    case Op::ceil: case Op::tanh: case Op::sin: case Op::cos: case Op::erf:
      set(r0, math(in.op, a(0)));
      return;
    case Op::cmp: {
      auto p = static_cast<pir::Pred>(in.imm);
      if (is_fp(in.args[0])) {
        static const llvm::CmpInst::Predicate fp[6] = {llvm::CmpInst::FCMP_OEQ, llvm::CmpInst::FCMP_UNE, llvm::CmpInst::FCMP_OLT,
                                                       llvm::CmpInst::FCMP_OLE, llvm::CmpInst::FCMP_OGT, llvm::CmpInst::FCMP_OGE};
        set(r0, b_.CreateFCmp(fp[static_cast<int>(p)], a(0), a(1)));
      } else {
        bool s = sgn(in.args[0]);
        static const llvm::CmpInst::Predicate si[6] = {llvm::CmpInst::ICMP_EQ, llvm::CmpInst::ICMP_NE, llvm::CmpInst::ICMP_SLT,
                                                       llvm::CmpInst::ICMP_SLE, llvm::CmpInst::ICMP_SGT, llvm::CmpInst::ICMP_SGE};
        static const llvm::CmpInst::Predicate ui[6] = {llvm::CmpInst::ICMP_EQ, llvm::CmpInst::ICMP_NE, llvm::CmpInst::ICMP_ULT,
                                                       llvm::CmpInst::ICMP_ULE, llvm::CmpInst::ICMP_UGT, llvm::CmpInst::ICMP_UGE};
        set(r0, b_.CreateICmp((s ? si : ui)[static_cast<int>(p)], a(0), a(1)));
      }
      return;
    }
    case Op::select: set(r0, b_.CreateSelect(a(0), a(1), a(2))); return;
    case Op::cast: set(r0, cast(in.args[0], f_.types[r0])); return;
    case Op::bitcast: {
      pir::Ty to = f_.types[r0], from = f_.types[in.args[0]];
      if (to.ptr && !from.ptr) set(r0, b_.CreateIntToPtr(a(0), type(to)));
      else if (!to.ptr && from.ptr) set(r0, b_.CreatePtrToInt(a(0), type(to)));
      else if (type(to)->is16bitFPTy()) set(r0, half_from_bits(b_.CreateBitCast(a(0), b_.getInt16Ty()), type(to)));
      else set(r0, b_.CreateBitCast(a(0), type(to)));
      return;
    }
    case Op::pack2: set(r0, pack_pair(a(0), a(1))); return;
    case Op::unpack2: {
      llvm::Value* w = a(0);
      for (unsigned h = 0; h < 2; ++h) {
        llvm::Value* half = b_.CreateTrunc(h ? b_.CreateLShr(w, 16) : w, b_.getInt16Ty());
        llvm::Type* t = type(f_.types[in.results[h]]);
        set(in.results[h], t->is16bitFPTy() ? half_from_bits(half, t) : b_.CreateBitCast(half, t));
      }
      return;
    }
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

llvm::Value* Emitter::half_from_bits(llvm::Value* bits, llvm::Type* to) {
  // Whether v's bits come from a 16-bit float of the other type, looking through the integer,
  // vector and select instructions LLVM's combines see through (a few levels: pairs, masks).
  std::function<bool(llvm::Value*, int)> other_half = [&](llvm::Value* v, int depth) {
    llvm::Type* t = v->getType()->getScalarType();
    if (t->is16bitFPTy()) return t != to;
    auto* inst = llvm::dyn_cast<llvm::Instruction>(v);
    if (!inst || depth == 0 || llvm::isa<llvm::PHINode>(inst) || llvm::isa<llvm::CallBase>(inst) || llvm::isa<llvm::LoadInst>(inst))
      return false;
    for (llvm::Value* o : inst->operands())
      if (other_half(o, depth - 1)) return true;
    return false;
  };
  if (other_half(bits, 6)) bits = asm_call(b_.getInt16Ty(), "mov.b16 $0, $1;", "=h,h", {bits}, false);
  return b_.CreateBitCast(bits, to);
}

// ---------------------------------------------------------------- instructions and control flow

void Emitter::inst(const pir::Inst& in) {
  switch (in.op) {
    case Op::constant: case Op::param: case Op::thread_id: case Op::block_id: case Op::grid_dim:
    case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::rem: case Op::minimum: case Op::maximum:
    case Op::bit_and: case Op::bit_or: case Op::bit_xor: case Op::shl: case Op::shr: case Op::umulhi:
    case Op::byte_perm: case Op::fma: case Op::neg: case Op::bit_not: case Op::abs: case Op::popc:
    case Op::exp2: case Op::log2: case Op::exp: case Op::log: case Op::sqrt: case Op::rsqrt: case Op::rcp: case Op::floor:
    case Op::ceil: case Op::tanh: case Op::sin: case Op::cos: case Op::erf:
    case Op::cmp: case Op::select: case Op::cast: case Op::bitcast: case Op::pack2: case Op::unpack2:
      return arith_inst(in);
    case Op::load_vec: case Op::store_vec: case Op::gep: case Op::load: case Op::store: case Op::atomic_add:
    case Op::atomic_rmw: case Op::atomic_cas:
    case Op::load_shared: case Op::store_shared: case Op::smem_addr:
      return memory_inst(in);
    case Op::barrier: case Op::named_barrier_sync: case Op::named_barrier_arrive: case Op::shfl_xor: case Op::ballot: case Op::mbar_init:
    case Op::mbar_expect_tx: case Op::mbar_arrive: case Op::sem_wait: case Op::sem_signal: case Op::mbar_wait:
    case Op::atom_shared: case Op::mbar_inval: case Op::set_max_registers: case Op::exit_thread: case Op::fence_mbar_init:
    case Op::read_clock:
      return sync_inst(in);
    case Op::opaque: return opaque(in);
    case Op::keep_alive: return keep_alive(in);
    case Op::mma_16816: case Op::mma_1688_tf32: case Op::cvt_tf32: case Op::tma_load_2d: case Op::tma_load: case Op::tma_reduce_add: case Op::tma_store: case Op::bulk_commit: case Op::bulk_wait:
    case Op::fence_proxy_async_global: case Op::fence_proxy_async: case Op::wgmma_fence: case Op::wgmma_commit:
      return tensor_inst(in);
    case Op::wgmma_wait: case Op::wgmma_rs: case Op::wgmma: return wgmma(in);
    case Op::for_: return for_loop(in);
    case Op::if_: return if_op(in);
    case Op::yield: return;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

void Emitter::for_loop(const pir::Inst& in) {
  const pir::Block& body = in.regions[0];
  llvm::BasicBlock* pre = b_.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(ctx_, "loop", fn_);
  auto* body_bb = llvm::BasicBlock::Create(ctx_, "body", fn_);
  auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
  b_.CreateBr(header);
  b_.SetInsertPoint(header);
  // CompileOptions::packed_loop_pairs: consecutive 16-bit float carried values (a tile's
  // elements in register order) as one i32 phi, packed where they enter and unpacked at the
  // header; LLVM folds the packing into the producers' and consumers' own (cvt.rn.bf16x2, the
  // wgmma operand's 32-bit registers). Carried value i >= 1 (0: the induction variable) may head
  // a pair (its phi carries i and i + 1) or be a pair's second (no phi of its own).
  const size_t n = body.args.size();
  std::vector<bool> heads(n, false), second(n, false);
  if (packed_loop_pairs_)
    for (size_t i = 1; i + 1 < n; ++i) {
      llvm::Type* t0 = type(f_.types[body.args[i]]);
      if (t0->is16bitFPTy() && type(f_.types[body.args[i + 1]]) == t0) heads[i] = second[i + 1] = true, ++i;
    }
  // the value entering phi i: value(i), or value(i) and value(i + 1) packed
  const auto entering = [&](size_t i, const auto& value) { return heads[i] ? pack_pair(value(i), value(i + 1)) : value(i); };
  std::vector<llvm::Value*> init(n, nullptr);
  {
    llvm::IRBuilderBase::InsertPointGuard guard(b_);
    b_.SetInsertPoint(pre->getTerminator());
    for (size_t i = 0; i < n; ++i)
      if (!second[i]) init[i] = entering(i, [&](size_t k) { return v(in.args[k == 0 ? 0 : k + 2]); });
  }
  std::vector<llvm::PHINode*> phis(n, nullptr);
  for (size_t i = 0; i < n; ++i)
    if (!second[i]) phis[i] = b_.CreatePHI(init[i]->getType(), 2), phis[i]->addIncoming(init[i], pre);
  std::vector<llvm::Value*> carried(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (heads[i]) {
      llvm::Value* vec = b_.CreateBitCast(phis[i], llvm::FixedVectorType::get(type(f_.types[body.args[i]]), 2));
      carried[i] = b_.CreateExtractElement(vec, uint64_t{0});
      carried[i + 1] = b_.CreateExtractElement(vec, uint64_t{1});
    } else if (!second[i]) {
      carried[i] = phis[i];
    }
    set(body.args[i], carried[i]);
  }
  llvm::Value* cond = b_.CreateICmpSLT(phis[0], v(in.args[1]));
  b_.CreateCondBr(cond, body_bb, exit);
  b_.SetInsertPoint(body_bb);
  block(body);
  const pir::Inst& y = body.insts.back();
  llvm::Value* next = b_.CreateAdd(phis[0], v(in.args[2]));
  llvm::BasicBlock* latch = b_.GetInsertBlock();
  phis[0]->addIncoming(next, latch);
  for (size_t i = 1; i < n; ++i)
    if (phis[i]) phis[i]->addIncoming(entering(i, [&](size_t k) { return v(y.args[k - 1]); }), latch);
  b_.CreateBr(header);
  b_.SetInsertPoint(exit);
  for (size_t i = 0; i < in.results.size(); ++i) set(in.results[i], carried[i + 1]);
}

void Emitter::if_op(const pir::Inst& in) {
  auto* then_bb = llvm::BasicBlock::Create(ctx_, "then", fn_);
  auto* else_bb = llvm::BasicBlock::Create(ctx_, "else", fn_);
  auto* join = llvm::BasicBlock::Create(ctx_, "endif", fn_);
  b_.CreateCondBr(v(in.args[0]), then_bb, else_bb);
  std::vector<std::pair<llvm::BasicBlock*, std::vector<llvm::Value*>>> ends;
  for (int side = 0; side < 2; ++side) {
    b_.SetInsertPoint(side == 0 ? then_bb : else_bb);
    block(in.regions[static_cast<size_t>(side)]);
    std::vector<llvm::Value*> ys;
    for (V y : in.regions[static_cast<size_t>(side)].insts.back().args) ys.push_back(v(y));
    ends.emplace_back(b_.GetInsertBlock(), ys);
    b_.CreateBr(join);
  }
  b_.SetInsertPoint(join);
  for (size_t i = 0; i < in.results.size(); ++i) {
    auto* phi = b_.CreatePHI(type(f_.types[in.results[i]]), 2);
    for (auto& [bb, ys] : ends) phi->addIncoming(ys[i], bb);
    set(in.results[i], phi);
  }
}

}  // namespace llvm_backend

std::string llvm_version() { return LLVM_VERSION_STRING; }

LlvmOutput emit_ptx_llvm(const pir::Func& f, const std::string& arch, bool packed_loop_pairs) {
  init_llvm();
  auto t0 = std::chrono::steady_clock::now();
  LlvmOutput out;
  llvm::LLVMContext ctx;
  auto module = std::make_unique<llvm::Module>(f.name, ctx);
  const std::string triple = "nvptx64-nvidia-cuda";
  module->setTargetTriple(triple);
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, err);
  if (!target) throw std::runtime_error(fmt::format("tilejit: NVPTX target unavailable: {}", err));
  llvm::TargetOptions opts;
  opts.AllowFPOpFusion = llvm::FPOpFusion::Standard;  // no contraction: rounding matches the interpreter
  std::unique_ptr<llvm::TargetMachine> tm(
      target->createTargetMachine(triple, arch, "+ptx85", opts, llvm::Reloc::Static, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (!tm) throw std::runtime_error(fmt::format("tilejit: kernel '{}': LLVM has no NVPTX target for {}", f.name, arch));
  // The data layout first: IRBuilder takes alignments (e.g. 8 bytes for i64) from it.
  module->setDataLayout(tm->createDataLayout());
  llvm_backend::Emitter(f, ctx, *module, packed_loop_pairs).run();

  llvm::raw_string_ostream es(err);
  if (llvm::verifyModule(*module, &es))
    throw std::runtime_error(fmt::format("tilejit: kernel '{}': internal error, invalid LLVM IR: {}", f.name, es.str()));

  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(*module, mam);
  }
  {
    llvm::raw_string_ostream os(out.llvm_ir);
    module->print(os, nullptr);
  }
  out.ir_ms = ms_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  llvm::SmallVector<char, 0> buf;
  llvm::raw_svector_ostream os(buf);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw std::runtime_error(fmt::format("tilejit: kernel '{}': NVPTX cannot emit assembly", f.name));
  pm.run(*module);
  out.ptx.assign(buf.begin(), buf.end());
  out.ptx_ms = ms_since(t1);
  return out;
}

}  // namespace tilejit::jit
