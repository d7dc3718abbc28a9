// The CUDA printer: one object that prints a per-thread IR function as CUDA C++
// (jit/cuda_backend.hpp). Its members are grouped by concern, each group defined in the file named
// at its section comment; this header is shared by the files of jit/cuda_backend/ only (internal to
// jit/).
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "jit/thread_ir.hpp"

namespace tilejit::jit::cuda_backend {

using ir::DType;
using pir::Op;
using pir::V;

// ---------------------------------------------------------------- literals and the prelude (cuda_backend/prelude.cpp)

std::string f32_literal(float f);
std::string f64_literal(double d);
uint16_t narrow_bits(DType d, double x);
// The fixed part of every source: the helpers shared by every kernel.
std::string prelude();

// ---------------------------------------------------------------- C types

inline bool is_narrow(DType d) { return d == DType::f16 || d == DType::bf16; }

inline const char* scalar_ctype(DType d) {
  switch (d) {
    case DType::i1: return "bool";
    case DType::i8: return "signed char";
    case DType::u8: return "unsigned char";
    case DType::i16: return "short";
    case DType::u16: return "unsigned short";
    case DType::i32: return "int";
    case DType::u32: return "unsigned";
    case DType::i64: return "long long";
    case DType::u64: return "unsigned long long";
    case DType::f16: return "__half";
    case DType::bf16: return "__nv_bfloat16";
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f8e4m3: case DType::f8e5m2: return "unsigned char";  // storage only
  }
  return "?";
}

// Memory element type: i1 is stored as a byte (as the LLVM backend does).
inline const char* storage_ctype(DType d) { return d == DType::i1 ? "unsigned char" : scalar_ctype(d); }

inline std::string ctype(pir::Ty t) { return t.ptr ? std::string(storage_ctype(t.dtype)) + "*" : scalar_ctype(t.dtype); }

// The unsigned type arithmetic of this width runs in (no signed overflow, no int promotion surprises).
inline const char* uwide(DType d) { return ir::bit_width(d) > 32 ? "unsigned long long" : "unsigned"; }

// The unsigned type of exactly this width (i1: bool, whose values are 0/1).
inline const char* uexact(DType d) {
  switch (ir::bit_width(d)) {
    case 1: return "bool";
    case 8: return "unsigned char";
    case 16: return "unsigned short";
    case 32: return "unsigned";
    default: return "unsigned long long";
  }
}
inline const char* sexact(DType d) {
  switch (ir::bit_width(d)) {
    case 8: return "signed char";
    case 16: return "short";
    case 32: return "int";
    default: return "long long";
  }
}

inline bool is_ident_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && c >= '0' && c <= '9');
}

class Printer {
 public:
  explicit Printer(const pir::Func& f) : f_(f) {}

  // The kernel's source (cuda_backend/printer.cpp).
  std::string run();

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw std::runtime_error(fmt::format("tilejit: kernel '{}': CUDA backend: {}", f_.name, msg));
  }

  std::string param_name(size_t i) const {
    std::string s = fmt::format("p{}_", i);
    for (char c : f_.params[i].name) s += is_ident_char(c, false) ? c : '_';
    return s;
  }

  pir::Ty ty(V v) const {
    if (v >= f_.types.size()) fail(fmt::format("value %{} has no type (the function has {} values)", v, f_.types.size()));
    return f_.types[v];
  }
  DType dt(V v) const { return ty(v).dtype; }

  // The name of a defined value.
  std::string n(V v) const {
    if (v >= defined_.size() || !defined_[v]) fail(fmt::format("value %{} used before its definition (or outside its region)", v));
    return fmt::format("v{}", v);
  }

  std::string indent() const { return std::string(static_cast<size_t>(depth_) * 2, ' '); }
  // An operand of a "r" asm constraint: 32-bit values as they are, narrower integers widened.
  std::string u32(V v) const {
    if (ty(v).ptr || ir::is_float(dt(v)) || ir::bit_width(dt(v)) > 32)
      fail(fmt::format("expected a 32-bit integer operand, got {} (%{})", pir::type_name(ty(v)), v));
    return ir::bit_width(dt(v)) == 32 ? n(v) : fmt::format("(unsigned){}", n(v));
  }
  void line(const std::string& s) {
    body_.append(static_cast<size_t>(depth_) * 2, ' ');
    body_ += s;
    body_ += '\n';
  }
  void mark(V r) {
    if (r >= defined_.size()) fail(fmt::format("value %{} has no type", r));
    if (defined_[r]) fail(fmt::format("value %{} is defined twice", r));
    defined_[r] = 1;
    if (!scopes_.empty()) scopes_.back().push_back(r);
  }
  void def(V r, const std::string& expr) {
    line(fmt::format("{} v{} = {};", ctype(ty(r)), r, expr));
    mark(r);
  }
  void declare(V r) {
    line(fmt::format("{} v{};", ctype(ty(r)), r));
    mark(r);
  }
  void open_scope() { scopes_.emplace_back(); }
  void close_scope() {
    for (V v : scopes_.back()) defined_[v] = 0;
    scopes_.pop_back();
  }

  void check_args(const pir::Inst& in, size_t lo, size_t hi) const {
    if (in.args.size() < lo || in.args.size() > hi)
      fail(fmt::format("{} takes {} operands, got {}", pir::op_name(in.op), lo == hi ? fmt::format("{}", lo) : fmt::format("{} to {}", lo, hi),
                       in.args.size()));
  }
  void check_results(const pir::Inst& in, size_t k) const {
    if (in.results.size() != k) fail(fmt::format("{} has {} results, expected {}", pir::op_name(in.op), in.results.size(), k));
  }
  void no_fp8(V v, const pir::Inst& in) const {
    if (!ty(v).ptr && ir::is_fp8(dt(v)))
      fail(fmt::format("{} on {} is not supported on the GPU yet (fp8 is a storage type)", pir::op_name(in.op), ir::name(dt(v))));
  }

  // ---------------------------------------------------------------- values and arithmetic (cuda_backend/arithmetic.cpp)
  // ---- value expressions
  std::string wrap(DType d, const std::string& e) const;
  std::string fl(V v) const;
  std::string round_from_f32(DType d, const std::string& e) const;
  std::string bits(V v) const;
  std::string from_bits(DType d, const std::string& e) const;
  std::string zero(DType d) const;
  std::string int_literal(DType d, int64_t imm) const;
  std::string constant(const pir::Inst& in, pir::Ty t) const;
  std::optional<uint64_t> const_bits(V v) const;
  bool safe_divisor(V v) const;
  // ---- ops
  std::string binary_float(Op op, V a, V b) const;
  std::string binary_int(Op op, V a, V b) const;
  std::string unary(Op op, V a) const;
  std::string compare(pir::Pred p, V a, V b) const;
  std::string cast(V a, pir::Ty to) const;
  std::string bitcast(V a, pir::Ty to) const;
  std::string bits16(V v) const;
  // parameters, special registers, arithmetic, comparisons, conversions, pack2/unpack2
  void arith_inst(const pir::Inst& in);

  // ---------------------------------------------------------------- the body (cuda_backend/printer.cpp)
  void hoist_constants(const pir::Block& b);
  void block(const pir::Block& b);
  // One instruction: hands it to the printer of its family.
  void inst(const pir::Inst& in);

  // ---------------------------------------------------------------- memory (cuda_backend/memory.cpp)
  // Predicated global accesses through the width-specific helpers.
  struct Access {
    const char* suffix;  // u8, b16, b32, b64
    const char* reg;     // C type of the register
  };
  static Access access(DType d);
  std::string smem(V off, DType d) const;
  std::string to_storage(V v) const;
  void load(const pir::Inst& in);
  void store(const pir::Inst& in);
  void atomic_add(const pir::Inst& in);
  void atomic_rmw(const pir::Inst& in);  // and atomic_cas: inline PTX atom with its order and scope
  // vector accesses, gep, shared-memory loads, stores and addresses
  void memory_inst(const pir::Inst& in);

  // ---------------------------------------------------------------- synchronisation and ordering (cuda_backend/sync.cpp)
  std::string ptxas_fence(const std::string& ptx, const char* label);
  std::string ptxas_fence_after(const std::string& ptx, const char* label);
  // Asm text written for an asm with operands ("%%" for a literal '%') as text for one without.
  static std::string without_operands(std::string text);
  // The LLVM backend's kNeverTrueP1 as C++ string-literal text of an asm with operands: opens a
  // scope with P1 never true (ptxas cannot know; S1 holds the SM id); the caller closes it.
  static constexpr const char* kNeverTrueP1 =
      "{\\n\\t.reg .pred P1;\\n\\t.reg .b32 S1;\\n\\tmov.u32 S1, %%smid;\\n\\tsetp.gt.u32 P1, S1, 2147483647;\\n";

  // barriers, shuffles, mbarriers, semaphores, shared-memory atomics, register reallocation
  void sync_inst(const pir::Inst& in);
  void opaque(const pir::Inst& in);
  void keep_alive(const pir::Inst& in);

  // ---------------------------------------------------------------- tensor cores and TMA (cuda_backend/tensor_core.cpp)
  void mma(const pir::Inst& in);       // mma_16816 and mma_1688_tf32
  void cvt_tf32(const pir::Inst& in);
  void wgmma(const pir::Inst& in);
  // TMA copies and bulk groups, async-proxy fences, wgmma fence and commit
  void tensor_inst(const pir::Inst& in);

  // ---------------------------------------------------------------- control flow (cuda_backend/control_flow.cpp)
  static const pir::Inst* yield_of(const pir::Block& b);
  void region_body(const pir::Block& b);
  void for_loop(const pir::Inst& in);
  void if_op(const pir::Inst& in);

  const pir::Func& f_;
  std::string body_;
  int depth_ = 1;
  std::vector<char> defined_;
  std::vector<std::optional<uint64_t>> const_bits_;
  std::vector<std::vector<V>> scopes_;
  int asm_labels_ = 0;  // unique labels inside inline asm
};

}  // namespace tilejit::jit::cuda_backend
