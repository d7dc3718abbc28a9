// Per-thread IR -> LLVM IR -> PTX. The only translation unit that includes LLVM headers (each
// costs ~20 s to compile). Predicated global accesses and tensor-core ops use inline PTX, as
// Triton does; everything else is plain LLVM IR so that O3 can simplify it.
#include "jit/llvm_backend.hpp"
#include "jit/timing.hpp"

#include <fmt/format.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
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
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace tilejit::jit {
namespace {

using ir::DType;
using pir::Op;
using pir::V;

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

class Emitter {
 public:
  Emitter(const pir::Func& f, llvm::LLVMContext& ctx, llvm::Module& m) : f_(f), ctx_(ctx), m_(m), b_(ctx) {}

  void run() {
    std::vector<llvm::Type*> params;
    for (const pir::Param& p : f_.params) params.push_back(type(p.ty));
    auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_), params, false);
    fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, f_.name, m_);
    fn_->setCallingConv(llvm::CallingConv::PTX_Kernel);
    for (size_t i = 0; i < f_.params.size(); ++i) {
      fn_->getArg(static_cast<unsigned>(i))->setName(f_.params[i].name);
      if (f_.params[i].ty.ptr) fn_->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoAlias);
    }
    // Kernel and launch-bound annotations (kept for LLVMs that still read them).
    auto* md = m_.getOrInsertNamedMetadata("nvvm.annotations");
    auto i32 = [&](int v) { return llvm::ConstantAsMetadata::get(b_.getInt32(v)); };
    md->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, "kernel"), i32(1)}));
    md->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, "maxntidx"), i32(f_.num_threads)}));
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

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw std::runtime_error(fmt::format("tilejit: kernel '{}': LLVM backend: {}", f_.name, msg));
  }

  llvm::Type* scalar_type(DType d) {
    switch (d) {
      case DType::i1: return b_.getInt1Ty();
      case DType::i8: case DType::u8: case DType::f8e4m3: case DType::f8e5m2: return b_.getInt8Ty();
      case DType::i16: case DType::u16: return b_.getInt16Ty();
      case DType::i32: case DType::u32: return b_.getInt32Ty();
      case DType::i64: case DType::u64: return b_.getInt64Ty();
      case DType::f16: return b_.getHalfTy();
      case DType::bf16: return b_.getBFloatTy();
      case DType::f32: return b_.getFloatTy();
      case DType::f64: return b_.getDoubleTy();
    }
    fail("unknown dtype");
  }
  llvm::Type* type(pir::Ty t) { return t.ptr ? llvm::PointerType::get(ctx_, 1) : scalar_type(t.dtype); }
  llvm::Value* v(V id) {
    if (!vals_[id]) fail(fmt::format("value %{} used before definition", id));
    return vals_[id];
  }
  DType dt(V id) const { return f_.types[id].dtype; }
  bool is_fp(V id) const { return !f_.types[id].ptr && ir::is_float(dt(id)) && !ir::is_fp8(dt(id)); }
  bool sgn(V id) const { return ir::is_signed(dt(id)); }

  llvm::Value* intrinsic(llvm::Intrinsic::ID id, llvm::ArrayRef<llvm::Type*> tys, llvm::ArrayRef<llvm::Value*> args) {
    return b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, id, tys), args);
  }
  // `convergent`: an instruction every thread of a warp (bar.sync: of the barrier) must reach
  // together, which LLVM may then not duplicate into divergent paths. Without it LLVM tail-
  // duplicated a named barrier after `if (tid == 0) {...}` into both branches: thread 0 and its
  // warp's others then waited at different bar.sync instructions, and the program hung.
  llvm::Value* asm_call(llvm::Type* ret, const std::string& text, const std::string& constraints,
                        llvm::ArrayRef<llvm::Value*> args, bool side_effects, bool convergent = false) {
    std::vector<llvm::Type*> arg_types;
    for (llvm::Value* a : args) arg_types.push_back(a->getType());
    auto* ft = llvm::FunctionType::get(ret, arg_types, false);
    llvm::CallInst* call = b_.CreateCall(llvm::InlineAsm::get(ft, text, constraints, side_effects), args);
    if (convergent) call->addFnAttr(llvm::Attribute::Convergent);
    return call;
  }

  // `ptx` inside a loop whose branch is never taken (no SM id reaches 2^31, which ptxas cannot
  // know, unlike a condition on the thread id that it folds): the loop delimits basic blocks that
  // ptxas neither merges nor predicates away, so it moves no code across `ptx`. `label` must be
  // unique per use site; ${:uid} makes it unique per inline asm.
  static std::string ptxas_fence(const std::string& ptx, const char* label) {
    return fmt::format("{}\t{}_${{:uid}}:\n\t{}\n\t@P1 bra.uni {}_${{:uid}};\n\t}}", kNeverTrueP1, label, ptx, label);
  }
  // Opens an asm scope with predicate P1 = (SM id > 2^31 - 1): never true, which ptxas cannot know
  // (S1 holds the SM id). ptxas_fence and keep_alive build on it; the caller closes the scope.
  static constexpr const char* kNeverTrueP1 = "{\n\t.reg .pred P1;\n\t.reg .b32 S1;\n\tmov.u32 S1, %smid;\n\tsetp.gt.u32 P1, S1, 2147483647;\n";

  // f16/bf16 math runs in f32 and rounds once.
  llvm::Value* to_f32(llvm::Value* x) { return x->getType()->isFloatTy() ? x : b_.CreateFPExt(x, b_.getFloatTy()); }
  llvm::Value* from_f32(llvm::Value* x, llvm::Type* t) { return t->isFloatTy() ? x : b_.CreateFPTrunc(x, t); }

  llvm::Value* math(Op op, llvm::Value* x) {
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

  llvm::Value* min_max(bool is_max, V a, V b) {
    llvm::Value *x = v(a), *y = v(b);
    if (!is_fp(a)) {
      auto id = is_max ? (sgn(a) ? llvm::Intrinsic::smax : llvm::Intrinsic::umax) : (sgn(a) ? llvm::Intrinsic::smin : llvm::Intrinsic::umin);
      return intrinsic(id, {x->getType()}, {x, y});
    }
    // NaN-propagating, -0 below +0 (the interpreter's and PTX max.NaN's semantics), computed in
    // >= f32; f32 is one max.NaN/min.NaN instruction.
    llvm::Type* t = x->getType();
    if (!t->isDoubleTy())
      return from_f32(intrinsic(is_max ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, {b_.getFloatTy()}, {to_f32(x), to_f32(y)}), t);
    llvm::Value *fx = t->isDoubleTy() ? x : to_f32(x), *fy = t->isDoubleTy() ? y : to_f32(y);
    llvm::Value* m = intrinsic(is_max ? llvm::Intrinsic::maxnum : llvm::Intrinsic::minnum, {fx->getType()}, {fx, fy});
    llvm::Value* nan = b_.CreateFCmpUNO(fx, fy);
    m = b_.CreateSelect(nan, b_.CreateFAdd(fx, fy), m);
    return t->isDoubleTy() ? m : from_f32(m, t);
  }

  // Shift amounts >= the width give 0 (or the sign) rather than LLVM's poison.
  llvm::Value* shift(bool left, V a, V b) {
    llvm::Value *x = v(a), *s = v(b);
    unsigned w = x->getType()->getIntegerBitWidth();
    llvm::Value* big = b_.CreateICmpUGE(s, llvm::ConstantInt::get(s->getType(), w));
    llvm::Value* safe = b_.CreateSelect(big, llvm::ConstantInt::get(s->getType(), 0), s);
    if (left) return b_.CreateSelect(big, llvm::ConstantInt::get(x->getType(), 0), b_.CreateShl(x, safe));
    if (sgn(a)) return b_.CreateAShr(x, b_.CreateSelect(big, llvm::ConstantInt::get(s->getType(), w - 1), s));
    return b_.CreateSelect(big, llvm::ConstantInt::get(x->getType(), 0), b_.CreateLShr(x, safe));
  }

  // Integer division and remainder without LLVM's undefined cases (the interpreter's rules).
  llvm::Value* int_divrem(bool div, V a, V b) {
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

  llvm::Value* cast(V a, pir::Ty to) {
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

  // Bits of a loaded/stored element: the PTX register class and the integer type used in asm.
  struct Access {
    const char* ptx_type;   // b16, b32, b64, u8
    const char* constraint; // h, r, l
    llvm::Type* reg;        // integer type carried through asm
  };
  Access access(DType d) {
    switch (ir::byte_size(d)) {
      case 1: return {"u8", "h", b_.getInt16Ty()};
      case 2: return {"b16", "h", b_.getInt16Ty()};
      case 4: return {"b32", "r", b_.getInt32Ty()};
      default: return {"b64", "l", b_.getInt64Ty()};
    }
  }
  llvm::Value* to_bits(llvm::Value* x, DType d, llvm::Type* reg) {
    if (d == DType::i1) return b_.CreateZExt(x, reg);
    llvm::Value* i = b_.CreateBitCast(x, b_.getIntNTy(static_cast<unsigned>(ir::byte_size(d) * 8)));
    return b_.CreateZExtOrTrunc(i, reg);
  }
  llvm::Value* from_bits(llvm::Value* i, DType d) {
    if (d == DType::i1) return b_.CreateICmpNE(i, llvm::ConstantInt::get(i->getType(), 0));
    llvm::Value* n = b_.CreateTrunc(i, b_.getIntNTy(static_cast<unsigned>(ir::byte_size(d) * 8)));
    return b_.CreateBitCast(n, scalar_type(d));
  }

  llvm::Value* load(const pir::Inst& in) {
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

  void store(const pir::Inst& in) {
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

  // Run `body` only where `pred` holds; returns the phi of its value (or `fallback`).
  template <class F>
  llvm::Value* guarded(llvm::Value* pred, llvm::Type* t, F body) {
    llvm::BasicBlock* from = b_.GetInsertBlock();
    auto* then_bb = llvm::BasicBlock::Create(ctx_, "guarded", fn_);
    auto* join = llvm::BasicBlock::Create(ctx_, "join", fn_);
    b_.CreateCondBr(pred, then_bb, join);
    b_.SetInsertPoint(then_bb);
    llvm::Value* r = body();
    llvm::BasicBlock* then_end = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    if (!t || t->isVoidTy()) return nullptr;
    auto* phi = b_.CreatePHI(t, 2);
    phi->addIncoming(llvm::Constant::getNullValue(t), from);
    phi->addIncoming(r, then_end);
    return phi;
  }

  llvm::Value* atomic_add(const pir::Inst& in) {
    DType d = f_.types[in.args[1]].dtype;
    auto body = [&]() -> llvm::Value* {
      auto op = ir::is_float(d) ? llvm::AtomicRMWInst::FAdd : llvm::AtomicRMWInst::Add;
      return b_.CreateAtomicRMW(op, v(in.args[0]), v(in.args[1]), llvm::MaybeAlign(), llvm::AtomicOrdering::Monotonic,
                                ctx_.getOrInsertSyncScopeID("device"));
    };
    if (in.args.size() == 2) return body();
    return guarded(v(in.args[2]), scalar_type(d), body);
  }

  llvm::Value* smem_ptr(V off) { return b_.CreateGEP(b_.getInt8Ty(), smem_, {v(off)}); }

  llvm::Value* mma(const pir::Inst& in) {
    const char* t = static_cast<DType>(in.imm) == DType::bf16 ? "bf16" : "f16";
    std::string text = fmt::format(
        "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};", t);
    llvm::Type* F = b_.getFloatTy();
    auto* ret = llvm::StructType::get(ctx_, {F, F, F, F});
    std::vector<llvm::Value*> args;
    for (V a : in.args) args.push_back(v(a));
    return asm_call(ret, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", args, false);
  }

  void block(const pir::Block& blk) {
    for (const pir::Inst& in : blk.insts) inst(in);
  }

  void set(V r, llvm::Value* x) { vals_[r] = x; }

  void inst(const pir::Inst& in) {
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
      case Op::param: set(r0, fn_->getArg(static_cast<unsigned>(in.imm))); return;
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
      case Op::sub: set(r0, is_fp(in.args[0]) ? b_.CreateFSub(a(0), a(1)) : b_.CreateSub(a(0), a(1))); return;
      case Op::mul: set(r0, is_fp(in.args[0]) ? b_.CreateFMul(a(0), a(1)) : b_.CreateMul(a(0), a(1))); return;
      case Op::div: set(r0, is_fp(in.args[0]) ? b_.CreateFDiv(a(0), a(1)) : int_divrem(true, in.args[0], in.args[1])); return;
      case Op::rem: set(r0, is_fp(in.args[0]) ? b_.CreateFRem(a(0), a(1)) : int_divrem(false, in.args[0], in.args[1])); return;
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
      case Op::neg: set(r0, is_fp(in.args[0]) ? b_.CreateFNeg(a(0)) : b_.CreateNeg(a(0))); return;
      case Op::bit_not: set(r0, b_.CreateNot(a(0))); return;
      case Op::abs:
        set(r0, is_fp(in.args[0]) ? intrinsic(llvm::Intrinsic::fabs, {a(0)->getType()}, {a(0)})
                                  : (sgn(in.args[0]) ? intrinsic(llvm::Intrinsic::abs, {a(0)->getType()}, {a(0), b_.getFalse()}) : a(0)));
        return;
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
        else set(r0, b_.CreateBitCast(a(0), type(to)));
        return;
      }
      case Op::pack2: {
        // As a two-element vector: two f32 -> bf16/f16 roundings feeding it become one cvt.rn.*x2.f32.
        auto* vt = llvm::FixedVectorType::get(a(0)->getType(), 2);
        llvm::Value* vec = b_.CreateInsertElement(b_.CreateInsertElement(llvm::PoisonValue::get(vt), a(0), uint64_t{0}), a(1), uint64_t{1});
        set(r0, b_.CreateBitCast(vec, b_.getInt32Ty()));
        return;
      }
      case Op::unpack2: {
        llvm::Value* w = a(0);
        for (unsigned h = 0; h < 2; ++h) {
          llvm::Value* half = b_.CreateTrunc(h ? b_.CreateLShr(w, 16) : w, b_.getInt16Ty());
          set(in.results[h], b_.CreateBitCast(half, type(f_.types[in.results[h]])));
        }
        return;
      }
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
      case Op::shfl_xor: {
        bool f = a(0)->getType()->isFloatTy();
        auto id = f ? llvm::Intrinsic::nvvm_shfl_sync_bfly_f32 : llvm::Intrinsic::nvvm_shfl_sync_bfly_i32;
        set(r0, intrinsic(id, {}, {b_.getInt32(0xFFFFFFFFu), a(0), b_.getInt32(static_cast<uint32_t>(in.imm)), b_.getInt32(31)}));
        return;
      }
      case Op::mma_16816: {
        llvm::Value* s = mma(in);
        for (unsigned i = 0; i < 4; ++i) set(in.results[i], b_.CreateExtractValue(s, {i}));
        return;
      }
      case Op::smem_addr:
        set(r0, b_.CreatePtrToInt(smem_ptr(in.args[0]), b_.getInt32Ty()));
        return;
      case Op::mbar_init: asm_call(b_.getVoidTy(), "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", {a(0), a(1)}, true); return;
      case Op::mbar_expect_tx:
        asm_call(b_.getVoidTy(), "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}", {a(0), a(1)}, true);
        return;
      case Op::mbar_arrive: asm_call(b_.getVoidTy(), "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", {a(0)}, true); return;
      case Op::sem_wait:
        asm_call(b_.getVoidTy(),
                 "{\n\t.reg .pred P1;\n\t.reg .b32 V1;\n\tTILEJIT_SEM_${:uid}:\n\tld.acquire.gpu.global.b32 V1, [$0];\n\t"
                 "setp.ge.s32 P1, V1, $1;\n\t@!P1 nanosleep.u32 32;\n\t@!P1 bra TILEJIT_SEM_${:uid};\n\t}",
                 "l,r,~{memory}", {a(0), a(1)}, true);
        return;
      case Op::sem_signal:
        asm_call(b_.getVoidTy(), "fence.acq_rel.gpu;\n\tred.release.gpu.global.add.s32 [$0], $1;", "l,r,~{memory}", {a(0), a(1)}, true);
        return;
      case Op::mbar_wait:
        asm_call(b_.getVoidTy(),
                 "{\n\t.reg .pred P1;\n\tTILEJIT_WAIT_${:uid}:\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1;\n\t"
                 "@!P1 bra TILEJIT_WAIT_${:uid};\n\t}",
                 "r,r,~{memory}", {a(0), a(1)}, true);
        return;
      case Op::tma_load_2d:
        asm_call(b_.getVoidTy(),
                 "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {$2, $3}], [$4];",
                 "r,l,r,r,r,~{memory}", {a(0), a(1), a(2), a(3), a(4)}, true);
        return;
      case Op::atom_shared:
        set(in.results[0], asm_call(b_.getInt32Ty(),
                                    fmt::format("atom.acq_rel.cta.shared::cta.{} $0, [$1], $2;", in.imm ? "exch.b32" : "add.u32"),
                                    "=r,r,r,~{memory}", {a(0), a(1)}, true));
        return;
      case Op::mbar_inval: asm_call(b_.getVoidTy(), "mbarrier.inval.shared::cta.b64 [$0];", "r,~{memory}", {a(0)}, true); return;
      case Op::tma_load:
      case Op::tma_reduce_add: {
        // (shared addr, map, coordinates[, mbarrier]): the copy's operands, then "{c0, c1, ...}"
        const bool load = in.op == Op::tma_load;
        const auto rank = static_cast<size_t>(in.imm);
        std::string coords, cons = load ? "r,l" : "l,r";
        std::vector<llvm::Value*> args{load ? a(0) : a(1), load ? a(1) : a(0)};
        for (size_t i = 0; i < rank; ++i) {
          coords += fmt::format("{}${}", i ? ", " : "", i + 2);
          cons += ",r";
          args.push_back(a(2 + i));
        }
        if (!load) {
          asm_call(b_.getVoidTy(),
                   fmt::format("cp.reduce.async.bulk.tensor.{}d.global.shared::cta.add.tile.bulk_group [$0, {{{}}}], [$1];", rank, coords),
                   cons + ",~{memory}", args, true);
          return;
        }
        args.push_back(a(2 + rank));
        asm_call(b_.getVoidTy(),
                 fmt::format("cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {{{}}}], [${}];",
                             rank, coords, rank + 2),
                 cons + ",r,~{memory}", args, true);
        return;
      }
      case Op::bulk_commit: asm_call(b_.getVoidTy(), "cp.async.bulk.commit_group;", "~{memory}", {}, true); return;
      case Op::bulk_wait:
        asm_call(b_.getVoidTy(),
                 fmt::format("cp.async.bulk.wait_group{} {};", in.imm & pir::kBulkWaitRead ? ".read" : "", in.imm & 0xFF),
                 "~{memory}", {}, true);
        return;
      case Op::fence_proxy_async_global: asm_call(b_.getVoidTy(), "fence.proxy.async.global;", "~{memory}", {}, true); return;
      case Op::set_max_registers:
        asm_call(b_.getVoidTy(), fmt::format("setmaxnreg.{}.sync.aligned.u32 {};", in.imm > 0 ? "inc" : "dec", std::abs(in.imm)), "~{memory}",
                 {}, true, /*convergent=*/true);
        return;
      case Op::fence_mbar_init: asm_call(b_.getVoidTy(), "fence.mbarrier_init.release.cluster;", "~{memory}", {}, true); return;
      case Op::fence_proxy_async: asm_call(b_.getVoidTy(), "fence.proxy.async.shared::cta;", "~{memory}", {}, true); return;
      case Op::wgmma_fence: asm_call(b_.getVoidTy(), "wgmma.fence.sync.aligned;", "~{memory}", {}, true); return;
      case Op::wgmma_commit:
        asm_call(b_.getVoidTy(),
                 in.imm & pir::kCommitFenced ? ptxas_fence("wgmma.commit_group.sync.aligned;", "TILEJIT_WGCOMMIT")
                                             : "wgmma.commit_group.sync.aligned;",
                 "~{memory}", {}, true);
        return;
      case Op::wgmma_wait:
      case Op::wgmma_rs:
      case Op::wgmma: {
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
          asm_call(b_.getVoidTy(), text, "~{memory}", {}, true);
          return;
        }
        cons += ",~{memory}";
        std::vector<llvm::Type*> fs(n, b_.getFloatTy());
        auto* ret = llvm::StructType::get(ctx_, fs);
        llvm::Value* sv = asm_call(ret, text, cons, args, true);
        for (unsigned i = 0; i < n; ++i) set(in.results[i], b_.CreateExtractValue(sv, {i}));
        return;
      }
      case Op::opaque: {
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
        return;
      }
      case Op::keep_alive: {
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
        return;
      }
      case Op::for_: return for_loop(in);
      case Op::if_: return if_op(in);
      case Op::yield: return;
    }
    fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
  }

  void for_loop(const pir::Inst& in) {
    const pir::Block& body = in.regions[0];
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* header = llvm::BasicBlock::Create(ctx_, "loop", fn_);
    auto* body_bb = llvm::BasicBlock::Create(ctx_, "body", fn_);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    b_.CreateBr(header);
    b_.SetInsertPoint(header);
    std::vector<llvm::PHINode*> phis;
    for (size_t i = 0; i < body.args.size(); ++i) {
      auto* phi = b_.CreatePHI(type(f_.types[body.args[i]]), 2);
      phi->addIncoming(v(in.args[i == 0 ? 0 : i + 2]), pre);
      phis.push_back(phi);
      set(body.args[i], phi);
    }
    llvm::Value* cond = b_.CreateICmpSLT(phis[0], v(in.args[1]));
    b_.CreateCondBr(cond, body_bb, exit);
    b_.SetInsertPoint(body_bb);
    block(body);
    const pir::Inst& y = body.insts.back();
    llvm::Value* next = b_.CreateAdd(phis[0], v(in.args[2]));
    llvm::BasicBlock* latch = b_.GetInsertBlock();
    phis[0]->addIncoming(next, latch);
    for (size_t i = 0; i < y.args.size(); ++i) phis[i + 1]->addIncoming(v(y.args[i]), latch);
    b_.CreateBr(header);
    b_.SetInsertPoint(exit);
    for (size_t i = 0; i < in.results.size(); ++i) set(in.results[i], phis[i + 1]);
  }

  void if_op(const pir::Inst& in) {
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

  const pir::Func& f_;
  llvm::LLVMContext& ctx_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  llvm::Function* fn_ = nullptr;
  llvm::GlobalVariable* smem_ = nullptr;
  std::vector<llvm::Value*> vals_;
};

}  // namespace

std::string llvm_version() { return LLVM_VERSION_STRING; }

LlvmOutput emit_ptx_llvm(const pir::Func& f, const std::string& arch) {
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
  Emitter(f, ctx, *module).run();

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
