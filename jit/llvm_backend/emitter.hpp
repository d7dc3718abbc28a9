// The LLVM emitter: one object that builds the LLVM IR of a per-thread IR function
// (jit/llvm_backend.hpp). Its members are grouped by concern, each group defined in the file named
// at its section comment. This header includes LLVM's: only the two translation units of
// jit/llvm_backend/ include it (cmake/llvm.cmake gives them LLVM's flags; each costs ~20 s to
// compile).
#pragma once
#include <fmt/format.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <stdexcept>
#include <map>
#include <string>
#include <vector>

#include "jit/thread_ir.hpp"

namespace tilejit::jit::llvm_backend {

using ir::DType;
using pir::Op;
using pir::V;

class Emitter {
 public:
  Emitter(const pir::Func& f, llvm::LLVMContext& ctx, llvm::Module& m, bool packed_loop_pairs = false)
      : f_(f), ctx_(ctx), m_(m), b_(ctx), packed_loop_pairs_(packed_loop_pairs) {}

  // The kernel's function, into the module (llvm_backend/emitter.cpp).
  void run();

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
  // 16 bits `bits` as the 16-bit float type `to`. Where they come (through integer ops, vectors
  // or selects) from the other 16-bit float type, through an opaque mov: LLVM would fold the chain
  // into a bf16 <-> f16 bitcast, which NVPTX cannot select ("LLVM ERROR: Cannot select", an abort).
  llvm::Value* half_from_bits(llvm::Value* bits, llvm::Type* to);
  llvm::Type* type(pir::Ty t) { return t.ptr ? llvm::PointerType::get(ctx_, 1) : scalar_type(t.dtype); }
  // Two 16-bit values as one i32, through a two-element vector: two f32 -> bf16/f16 roundings
  // feeding it become one cvt.rn.*x2.f32 (pack2, and packed_loop_pairs' carried pairs).
  llvm::Value* pack_pair(llvm::Value* x0, llvm::Value* x1) {
    auto* vt = llvm::FixedVectorType::get(x0->getType(), 2);
    llvm::Value* vec = b_.CreateInsertElement(b_.CreateInsertElement(llvm::PoisonValue::get(vt), x0, uint64_t{0}), x1, uint64_t{1});
    return b_.CreateBitCast(vec, b_.getInt32Ty());
  }
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
  // 8- and 16-bit integer neg, sub and mul, computed in 32 bits: ptxas gives neg.s16 (and abs.s16)
  // of -32768 as +32768 in a register later read as 16 bits unconverted (an i8 -(-128) cast to i16
  // came out 128; found by the fuzzer). Opaque movs around the 32-bit op keep LLVM from narrowing
  // it back (it turns mul by -1 and 0 - x into neg).
  bool narrow_int(V id) const { return !f_.types[id].ptr && ir::is_int(dt(id)) && ir::bit_width(dt(id)) < 32 && dt(id) != DType::i1; }
  template <class F>
  llvm::Value* in_32_bits(const pir::Inst& in, F op) {
    llvm::Type* narrow = v(in.args[0])->getType();
    auto opaque32 = [&](llvm::Value* x) { return asm_call(b_.getInt32Ty(), "mov.b32 $0, $1;", "=r,r", {x}, false); };
    auto w = [&](size_t k) {
      llvm::Value* x = v(in.args[k]);
      return opaque32(sgn(in.args[k]) ? b_.CreateSExt(x, b_.getInt32Ty()) : b_.CreateZExt(x, b_.getInt32Ty()));
    };
    return b_.CreateTrunc(opaque32(op(w)), narrow);
  }
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
  // `ptx`, then a never-taken loop that re-reads the SM id: code after it does not move above `ptx`.
  // For an instruction that must not run twice in ptxas's view: a wgmma.commit_group inside
  // ptxas_fence's loop made ptxas commit an extra group with a dummy HGMMA on its path, so that a
  // later `wgmma.wait_group 1` also waited for the group before (decision 096).
  static std::string ptxas_fence_after(const std::string& ptx, const char* label) {
    return fmt::format("{{\n\t.reg .pred P1;\n\t.reg .b32 S1;\n\t{}\n\t{}_${{:uid}}:\n\tmov.u32 S1, %smid;\n\t"
                       "setp.gt.u32 P1, S1, 2147483647;\n\t@P1 bra.uni {}_${{:uid}};\n\t}}",
                       ptx, label, label);
  }
  // Opens an asm scope with predicate P1 = (SM id > 2^31 - 1): never true, which ptxas cannot know
  // (S1 holds the SM id). ptxas_fence and keep_alive build on it; the caller closes the scope.
  static constexpr const char* kNeverTrueP1 = "{\n\t.reg .pred P1;\n\t.reg .b32 S1;\n\tmov.u32 S1, %smid;\n\tsetp.gt.u32 P1, S1, 2147483647;\n";

  // f16/bf16 math runs in f32 and rounds once.
  llvm::Value* to_f32(llvm::Value* x) { return x->getType()->isFloatTy() ? x : b_.CreateFPExt(x, b_.getFloatTy()); }
  llvm::Value* from_f32(llvm::Value* x, llvm::Type* t) { return t->isFloatTy() ? x : b_.CreateFPTrunc(x, t); }

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

  llvm::Value* smem_ptr(V off) { return b_.CreateGEP(b_.getInt8Ty(), smem_, {v(off)}); }

  void block(const pir::Block& blk) {
    for (const pir::Inst& in : blk.insts) inst(in);
  }

  void set(V r, llvm::Value* x) { vals_[r] = x; }

  // ---------------------------------------------------------------- arithmetic (llvm_backend/emitter.cpp)
  llvm::Value* math(Op op, llvm::Value* x);
  llvm::Value* min_max(bool is_max, V a, V b);
  llvm::Value* shift(bool left, V a, V b);
  llvm::Value* int_divrem(bool div, V a, V b);
  llvm::Value* frem(llvm::Value* x, llvm::Value* y);
  llvm::Function* fmod_function(bool f64);
  llvm::Value* cast(V a, pir::Ty to);
  // constants, parameters, special registers, arithmetic, comparisons, conversions, pack2/unpack2
  void arith_inst(const pir::Inst& in);

  // ---------------------------------------------------------------- instructions and control flow (llvm_backend/emitter.cpp)
  // One instruction: hands it to the emitter of its family.
  void inst(const pir::Inst& in);
  void for_loop(const pir::Inst& in);
  void if_op(const pir::Inst& in);

  // ---------------------------------------------------------------- memory (llvm_backend/gpu_ops.cpp)
  // Bits of a loaded/stored element: the PTX register class and the integer type used in asm.
  struct Access {
    const char* ptx_type;   // b16, b32, b64, u8
    const char* constraint; // h, r, l
    llvm::Type* reg;        // integer type carried through asm
  };
  Access access(DType d);
  llvm::Value* to_bits(llvm::Value* x, DType d, llvm::Type* reg);
  llvm::Value* from_bits(llvm::Value* i, DType d);
  llvm::Value* load(const pir::Inst& in);
  void store(const pir::Inst& in);
  llvm::Value* atomic_add(const pir::Inst& in);
  llvm::Value* atomic_rmw(const pir::Inst& in);  // and atomic_cas
  // vector accesses, gep, global and shared loads, stores and atomics, shared addresses
  void memory_inst(const pir::Inst& in);

  // ---------------------------------------------------------------- synchronisation and ordering (llvm_backend/gpu_ops.cpp)
  // barriers, shuffles, mbarriers, semaphores, shared-memory atomics, register reallocation
  void sync_inst(const pir::Inst& in);
  void debug_mbar_wait(llvm::Value* bar, llvm::Value* parity, const char* spec);
  int debug_wait_sites_ = 0;
  void opaque(const pir::Inst& in);
  void keep_alive(const pir::Inst& in);

  // ---------------------------------------------------------------- tensor cores and TMA (llvm_backend/gpu_ops.cpp)
  llvm::Value* mma(const pir::Inst& in);
  llvm::Value* mma_tf32(const pir::Inst& in);  // mma.sync m16n8k8 .tf32
  void wgmma(const pir::Inst& in);
  // mma.sync, TMA copies and bulk groups, async-proxy fences, wgmma fence and commit
  void tensor_inst(const pir::Inst& in);

  const pir::Func& f_;
  llvm::LLVMContext& ctx_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  bool packed_loop_pairs_ = false;  // CompileOptions::packed_loop_pairs (for_loop)
  llvm::Function* fn_ = nullptr;
  llvm::GlobalVariable* smem_ = nullptr;
  std::vector<llvm::Value*> vals_;
  // Values of by-value blob parameters (TMA tensor maps), by value id: their PTX parameter symbol.
  // A TMA instruction takes the map's generic address right where it is used (cvta.param inside
  // its asm) instead of from a register live across the kernel: the producer warpgroup, at 24
  // registers, spilled the hoisted addresses.
  std::map<V, std::string> byval_symbol_;
  // `text` (an asm body naming the map operand `$N`), with that operand replaced by the map's
  // address computed in place when `map` is a by-value parameter; `arg` then becomes an unused 0.
  std::string with_tensor_map(V map, int operand, const std::string& text, llvm::Value*& arg);
};

}  // namespace tilejit::jit::llvm_backend
