// Per-thread IR -> CUDA C++ -> PTX (nvrtc). Every op is written so that its value is exactly the
// one the LLVM backend computes: guarded integer division and shifts, NaN-propagating min/max,
// saturating float->int casts, f16/bf16 arithmetic in f32 rounded once, the same approximate PTX
// instructions for transcendentals, and inline PTX for predicated accesses and mma.sync.
#include "jit/cuda_backend.hpp"
#include "jit/timing.hpp"

#include <fmt/format.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "jit/nvrtc.hpp"

namespace tilejit::jit {
namespace {

using ir::DType;
using pir::Op;
using pir::V;

// ---------------------------------------------------------------- literals

std::string hex_float(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", d);
  return buf;
}

// A float literal with exactly the value LLVM's ConstantFP::get(float, d) has (RNE from double).
std::string f32_literal(float f) {
  if (!std::isfinite(f)) return fmt::format("__uint_as_float(0x{:08x}u)", std::bit_cast<uint32_t>(f));
  return fmt::format("({}f)", hex_float(static_cast<double>(f)));
}

std::string f64_literal(double d) {
  if (!std::isfinite(d)) return fmt::format("__longlong_as_double((long long)0x{:016x}ull)", std::bit_cast<uint64_t>(d));
  return fmt::format("({})", hex_float(d));
}

// double -> f16/bf16 with one rounding (what LLVM's APFloat conversion does): round to float with
// round-to-odd, which keeps enough bits that the final round-to-nearest-even is exact.
uint16_t narrow_bits(DType d, double x) {
  float f;
  if (std::isnan(x)) {
    f = std::copysign(std::numeric_limits<float>::quiet_NaN(), static_cast<float>(std::signbit(x) ? -1 : 1));
  } else {
    f = static_cast<float>(x);
    if (std::isfinite(x) && static_cast<double>(f) != x) {
      if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
      f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
    }
  }
  return d == DType::f16 ? ir::f32_to_f16_bits(f) : ir::f32_to_bf16_bits(f);
}

// ---------------------------------------------------------------- the fixed part of every source

// Helpers shared by every kernel. The transcendental helpers are the PTX instructions the LLVM
// backend's NVVM intrinsics select; tj_frem is LLVM's NVPTX expansion of frem, instruction for
// instruction, so that ptxas treats both backends' code alike.
std::string prelude() {
  const float log2e = static_cast<float>(1.4426950408889634);
  const float erf_p = static_cast<float>(0.3275911);
  const double a[5] = {0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429};
  std::string erf_poly = fmt::format("  float p = {};\n", f32_literal(static_cast<float>(a[4])));
  for (int i = 3; i >= 0; --i) erf_poly += fmt::format("  p = __fadd_rn(__fmul_rn(p, q), {});\n", f32_literal(static_cast<float>(a[i])));

  std::string s;
  s += R"(#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Unused helpers and constants are expected (each kernel uses some): keep nvrtc's log for real news.
#pragma nv_diag_suppress 177
#pragma nv_diag_suppress 550

#define TJ_INLINE static __device__ __forceinline__

// Transcendentals: the approximate PTX instructions (the LLVM backend selects the same ones).
TJ_INLINE float tj_ex2(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
TJ_INLINE float tj_rcp(float x) { float r; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
TJ_INLINE float tj_lg2(float x) { float r; asm("lg2.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
TJ_INLINE float tj_rsqrt(float x) { float r; asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
TJ_INLINE float tj_sin(float x) { float r; asm("sin.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
TJ_INLINE float tj_cos(float x) { float r; asm("cos.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
TJ_INLINE float tj_tanh(float x) { float r; asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
// CUDA documents __byte_perm with 3-bit selectors only: the sign-replicate bit needs prmt itself.
TJ_INLINE unsigned tj_prmt(unsigned a, unsigned b, unsigned s) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
}
)";
  s += fmt::format("TJ_INLINE float tj_exp(float x) {{ return tj_ex2(__fmul_rn(x, {})); }}\n", f32_literal(log2e));
  s += fmt::format("TJ_INLINE float tj_log(float x) {{ return __fmul_rn(tj_lg2(x), {}); }}\n",
                   f32_literal(static_cast<float>(0.6931471805599453)));
  s += "// Abramowitz & Stegun 7.1.26, in the LLVM backend's operation order.\n";
  s += "TJ_INLINE float tj_erf_mag(float x) {\n  float ax = fabsf(x);\n";
  s += fmt::format("  float q = __fdiv_rn(1.0f, __fadd_rn(1.0f, __fmul_rn(ax, {})));\n", f32_literal(erf_p));
  s += erf_poly;
  s += "  p = __fmul_rn(p, q);\n";
  s += fmt::format("  float e = tj_ex2(__fmul_rn(-__fmul_rn(ax, ax), {}));\n", f32_literal(log2e));
  s += "  return __fsub_rn(1.0f, __fmul_rn(p, e));\n}\n";
  s += "TJ_INLINE float tj_erf(float x) { return copysignf(tj_erf_mag(x), x); }\n";
  s += "// f16/bf16: the sign is applied after rounding, as LLVM folds copysign through fptrunc (f16: bit\n"
       "// operations, bf16: abs.bf16 and neg.bf16), so that even NaN results carry the same bits.\n";
  s += "TJ_INLINE __half tj_erf(__half x) {\n"
       "  return __ushort_as_half((unsigned short)((__half_as_ushort(__float2half_rn(tj_erf_mag(__half2float(x)))) & 0x7fffu) |\n"
       "                                           (__half_as_ushort(x) & 0x8000u)));\n}\n";
  s += "TJ_INLINE __nv_bfloat16 tj_erf(__nv_bfloat16 x) {\n"
       "  __nv_bfloat16 a = __habs(__float2bfloat16_rn(tj_erf_mag(__bfloat162float(x))));\n"
       "  return (__bfloat16_as_ushort(x) & 0x8000u) ? __hneg(a) : a;\n}\n";
  s += R"(
// f16/bf16 -> f64 in one conversion (as LLVM's fpext; through f32 would change NaN payloads).
TJ_INLINE double tj_to_f64(__half x) {
  double r;
  asm("cvt.f64.f16 %0, %1;" : "=d"(r) : "h"(__half_as_ushort(x)));
  return r;
}
TJ_INLINE double tj_to_f64(__nv_bfloat16 x) {
#if __CUDA_ARCH__ >= 900
  double r;
  asm("cvt.f64.bf16 %0, %1;" : "=d"(r) : "h"(__bfloat16_as_ushort(x)));
  return r;
#else
  return (double)__bfloat162float(x);
#endif
}

// Floating-point remainder as LLVM's NVPTX backend expands frem: x - trunc(x / y) * y, x where y is infinite.
TJ_INLINE float tj_frem(float x, float y) {
  float r;
  asm("{\n\t.reg .f32 q, t, m, s;\n\t.reg .pred p;\n\tdiv.rn.f32 q, %1, %2;\n\tcvt.rzi.f32.f32 t, q;\n\tmul.f32 m, t, %2;\n\t"
      "sub.f32 s, %1, m;\n\ttestp.infinite.f32 p, %2;\n\tselp.f32 %0, %1, s, p;\n\t}" : "=f"(r) : "f"(x), "f"(y));
  return r;
}
TJ_INLINE double tj_frem(double x, double y) {
  double r;
  asm("{\n\t.reg .f64 q, t, m, s;\n\t.reg .pred p;\n\tdiv.rn.f64 q, %1, %2;\n\tcvt.rzi.f64.f64 t, q;\n\tmul.f64 m, t, %2;\n\t"
      "sub.f64 s, %1, m;\n\ttestp.infinite.f64 p, %2;\n\tselp.f64 %0, %1, s, p;\n\t}" : "=d"(r) : "d"(x), "d"(y));
  return r;
}

// NaN-propagating minimum and maximum (PTX min/max return the other operand for one NaN): the
// sum is NaN exactly when an operand is. f16/bf16 run in f32, as in the LLVM backend.
TJ_INLINE float tj_min(float x, float y) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y)); return r; }
TJ_INLINE float tj_max(float x, float y) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y)); return r; }
TJ_INLINE double tj_min(double x, double y) { return ((x != x) | (y != y)) ? __dadd_rn(x, y) : fmin(x, y); }
TJ_INLINE double tj_max(double x, double y) { return ((x != x) | (y != y)) ? __dadd_rn(x, y) : fmax(x, y); }

// Saturating float -> integer conversion, NaN -> 0 (LLVM's fptosi.sat / fptoui.sat). lo is the
// type's minimum and hi_excl its maximum + 1, both exact in F.
template <class T, class F>
TJ_INLINE T tj_f2i(F x, F lo, F hi_excl, T tmin, T tmax) {
  return x != x ? T(0) : x <= lo ? tmin : x >= hi_excl ? tmax : static_cast<T>(x);
}

// Predicated global accesses: the element's bits travel in a 16/32/64-bit register (u8 into a
// 16-bit one), the predicate is rebuilt from the bool inside the asm block.
TJ_INLINE unsigned short tj_ld_u8(const void* p, bool pred, unsigned short other) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p ld.global.u8 %0, [%1];\n\t}"
               : "+h"(other) : "l"(p), "r"((unsigned)pred) : "memory");
  return other;
}
TJ_INLINE unsigned short tj_ld_b16(const void* p, bool pred, unsigned short other) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p ld.global.b16 %0, [%1];\n\t}"
               : "+h"(other) : "l"(p), "r"((unsigned)pred) : "memory");
  return other;
}
TJ_INLINE unsigned tj_ld_b32(const void* p, bool pred, unsigned other) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p ld.global.b32 %0, [%1];\n\t}"
               : "+r"(other) : "l"(p), "r"((unsigned)pred) : "memory");
  return other;
}
TJ_INLINE unsigned long long tj_ld_b64(const void* p, bool pred, unsigned long long other) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p ld.global.b64 %0, [%1];\n\t}"
               : "+l"(other) : "l"(p), "r"((unsigned)pred) : "memory");
  return other;
}
TJ_INLINE void tj_st_u8(void* p, unsigned short v, bool pred) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.u8 [%0], %1;\n\t}"
               :: "l"(p), "h"(v), "r"((unsigned)pred) : "memory");
}
TJ_INLINE void tj_st_b16(void* p, unsigned short v, bool pred) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.b16 [%0], %1;\n\t}"
               :: "l"(p), "h"(v), "r"((unsigned)pred) : "memory");
}
TJ_INLINE void tj_st_b32(void* p, unsigned v, bool pred) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.b32 [%0], %1;\n\t}"
               :: "l"(p), "r"(v), "r"((unsigned)pred) : "memory");
}
TJ_INLINE void tj_st_b64(void* p, unsigned long long v, bool pred) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.b64 [%0], %1;\n\t}"
               :: "l"(p), "l"(v), "r"((unsigned)pred) : "memory");
}

// atomicAdd on an 8- or 16-bit integer (no hardware instruction): compare-and-swap on the aligned
// word that holds it, wrapping like LLVM's expansion of atomicrmw add. Returns the old bits.
TJ_INLINE unsigned tj_atomic_add_small(void* p, unsigned v, unsigned bytes) {
  unsigned long long a = reinterpret_cast<unsigned long long>(p);
  unsigned* w = reinterpret_cast<unsigned*>(a & ~3ull);
  unsigned shift = (unsigned)(a & 3ull) * 8u;
  unsigned mask = (bytes == 1u ? 0xffu : 0xffffu) << shift;
  unsigned old = *w, assumed;
  do {
    assumed = old;
    unsigned sum = ((((assumed & mask) >> shift) + v) << shift) & mask;
    old = atomicCAS(w, assumed, (assumed & ~mask) | sum);
  } while (old != assumed);
  return (old & mask) >> shift;
}

// Hopper: waiting on a transaction barrier's phase (the LLVM backend loops in PTX, this in C++).
TJ_INLINE void tj_mbar_wait(unsigned addr, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{\n\t.reg .pred P1;\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n\tselp.b32 %0, 1, 0, P1;\n\t}"
                 : "=r"(done) : "r"(addr), "r"(parity) : "memory");
  } while (!done);
}

// Semaphores between programs: acquire loads until the target, a release add after a fence.
TJ_INLINE void tj_sem_wait(const int* p, int target) {
  int v;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    if (v >= target) break;
    asm volatile("nanosleep.u32 32;");
  }
}
TJ_INLINE void tj_sem_signal(int* p, int v) {
  asm volatile("fence.acq_rel.gpu;\n\tred.release.gpu.global.add.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// 1024-byte alignment: 128-byte-swizzled TMA/wgmma tiles need it (as in the LLVM backend).
extern __shared__ __align__(1024) unsigned char tilejit_smem[];

)";
  return s;
}

// ---------------------------------------------------------------- the printer

bool is_narrow(DType d) { return d == DType::f16 || d == DType::bf16; }

const char* scalar_ctype(DType d) {
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
const char* storage_ctype(DType d) { return d == DType::i1 ? "unsigned char" : scalar_ctype(d); }

std::string ctype(pir::Ty t) { return t.ptr ? std::string(storage_ctype(t.dtype)) + "*" : scalar_ctype(t.dtype); }

// The unsigned type arithmetic of this width runs in (no signed overflow, no int promotion surprises).
const char* uwide(DType d) { return ir::bit_width(d) > 32 ? "unsigned long long" : "unsigned"; }

// The unsigned type of exactly this width (i1: bool, whose values are 0/1).
const char* uexact(DType d) {
  switch (ir::bit_width(d)) {
    case 1: return "bool";
    case 8: return "unsigned char";
    case 16: return "unsigned short";
    case 32: return "unsigned";
    default: return "unsigned long long";
  }
}
const char* sexact(DType d) {
  switch (ir::bit_width(d)) {
    case 8: return "signed char";
    case 16: return "short";
    case 32: return "int";
    default: return "long long";
  }
}

bool is_ident_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && c >= '0' && c <= '9');
}

class Printer {
 public:
  explicit Printer(const pir::Func& f) : f_(f) {}

  std::string run() {
    if (f_.name.empty() || !is_ident_char(f_.name[0], true))
      fail("the kernel name must be a C identifier (letters, digits, '_', not starting with a digit)");
    for (char c : f_.name)
      if (!is_ident_char(c, false)) fail("the kernel name must be a C identifier (letters, digits, '_', not starting with a digit)");
    if (f_.num_threads <= 0) fail(fmt::format("num_threads is {}; it must be positive", f_.num_threads));
    defined_.assign(f_.types.size(), 0);
    const_bits_.assign(f_.types.size(), std::nullopt);

    std::string out = prelude();
    std::vector<std::string> params;
    for (size_t i = 0; i < f_.params.size(); ++i) {
      const pir::Param& p = f_.params[i];
      params.push_back(p.ty.ptr ? fmt::format("{}* __restrict__ {}", storage_ctype(p.ty.dtype), param_name(i))
                                : fmt::format("{} {}", scalar_ctype(p.ty.dtype), param_name(i)));
    }
    out += fmt::format("// {} threads, {} bytes of dynamic shared memory\n", f_.num_threads, f_.smem_bytes);
    const std::string bounds = f_.min_programs_per_sm > 0 ? fmt::format("{}, {}", f_.num_threads, f_.min_programs_per_sm)
                                                          : fmt::format("{}", f_.num_threads);
    out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n", bounds, f_.name, fmt::join(params, ", "));
    // Constants first: their values do not depend on where they stand, and lowering may reuse a
    // constant outside the region that first defined it (LLVM constants are not instructions).
    hoist_constants(f_.body);
    block(f_.body);
    out += body_;
    out += "}\n";
    return out;
  }

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

  // ---- value expressions
  std::string wrap(DType d, const std::string& e) const {
    if (d == DType::i1) return fmt::format("((({}) & 1u) != 0)", e);
    return fmt::format("({})({})", scalar_ctype(d), e);
  }
  // A float expression of an f16/bf16/f32 value.
  std::string fl(V v) const {
    switch (dt(v)) {
      case DType::f16: return fmt::format("__half2float({})", n(v));
      case DType::bf16: return fmt::format("__bfloat162float({})", n(v));
      default: return n(v);
    }
  }
  std::string round_from_f32(DType d, const std::string& e) const {
    switch (d) {
      case DType::f16: return fmt::format("__float2half_rn({})", e);
      case DType::bf16: return fmt::format("__float2bfloat16_rn({})", e);
      default: return e;
    }
  }
  // The bits of a scalar as an unsigned integer of its width (i1: 0/1).
  std::string bits(V v) const {
    switch (dt(v)) {
      case DType::f16: return fmt::format("__half_as_ushort({})", n(v));
      case DType::bf16: return fmt::format("__bfloat16_as_ushort({})", n(v));
      case DType::f32: return fmt::format("__float_as_uint({})", n(v));
      case DType::f64: return fmt::format("(unsigned long long)__double_as_longlong({})", n(v));
      default: return fmt::format("({})({})", uexact(dt(v)), n(v));
    }
  }
  // A value of dtype d from an unsigned expression holding its bits (in the low bits).
  std::string from_bits(DType d, const std::string& e) const {
    switch (d) {
      case DType::i1: return fmt::format("(({}) != 0)", e);
      case DType::f16: return fmt::format("__ushort_as_half((unsigned short)({}))", e);
      case DType::bf16: return fmt::format("__ushort_as_bfloat16((unsigned short)({}))", e);
      case DType::f32: return fmt::format("__uint_as_float((unsigned)({}))", e);
      case DType::f64: return fmt::format("__longlong_as_double((long long)({}))", e);
      default: return fmt::format("({})({})", scalar_ctype(d), e);
    }
  }
  std::string zero(DType d) const { return from_bits(d, "0u"); }

  std::string int_literal(DType d, int64_t imm) const {
    const int w = ir::bit_width(d);
    const uint64_t mask = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
    const uint64_t b = static_cast<uint64_t>(imm) & mask;
    if (d == DType::i1) return b ? "true" : "false";
    if (!ir::is_signed(d)) {
      if (d == DType::u64) return fmt::format("{}ull", b);
      if (d == DType::u32) return fmt::format("{}u", b);
      return fmt::format("({}){}u", scalar_ctype(d), b);
    }
    const int64_t s = w == 64 ? static_cast<int64_t>(b) : static_cast<int64_t>(b << (64 - w)) >> (64 - w);
    if (s == std::numeric_limits<int64_t>::min()) return "(long long)0x8000000000000000ull";
    if (d == DType::i64) return fmt::format("{}ll", s);
    if (d == DType::i32) return s == std::numeric_limits<int32_t>::min() ? "(int)0x80000000u" : fmt::format("{}", s);
    return fmt::format("({})({})", scalar_ctype(d), s);
  }

  std::string constant(const pir::Inst& in, pir::Ty t) const {
    if (t.ptr) return fmt::format("reinterpret_cast<{}>(0x{:x}ull)", ctype(t), static_cast<uint64_t>(in.imm));
    switch (t.dtype) {
      case DType::f32: return f32_literal(static_cast<float>(in.fimm));
      case DType::f64: return f64_literal(in.fimm);
      case DType::f16: return fmt::format("__ushort_as_half((unsigned short)0x{:04x}u) /* {} */", narrow_bits(DType::f16, in.fimm), in.fimm);
      case DType::bf16:
        return fmt::format("__ushort_as_bfloat16((unsigned short)0x{:04x}u) /* {} */", narrow_bits(DType::bf16, in.fimm), in.fimm);
      case DType::f8e4m3: case DType::f8e5m2:  // bit patterns, as in the LLVM backend
        return fmt::format("(unsigned char)0x{:02x}u", static_cast<uint64_t>(in.imm) & 0xffu);
      default: return int_literal(t.dtype, in.imm);
    }
  }

  // The bits (masked to the width) of an integer constant; nullopt for anything else.
  std::optional<uint64_t> const_bits(V v) const {
    if (v >= const_bits_.size() || !const_bits_[v]) return std::nullopt;
    return const_bits_[v];
  }
  // A constant divisor that is neither 0 nor (for signed types) -1: plain C++ division is exact.
  bool safe_divisor(V v) const {
    auto k = const_bits(v);
    if (!k || *k == 0) return false;
    const int w = ir::bit_width(dt(v));
    const uint64_t all = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
    return !(ir::is_signed(dt(v)) && *k == all);
  }

  void hoist_constants(const pir::Block& b) {
    for (const pir::Inst& in : b.insts) {
      if (in.op == Op::constant) {
        check_results(in, 1);
        V r = in.results[0];
        if (!ty(r).ptr && ir::is_int(dt(r))) {
          const int w = ir::bit_width(dt(r));
          const_bits_[r] = static_cast<uint64_t>(in.imm) & (w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1);
        }
        line(fmt::format("const {} v{} = {};", ctype(ty(r)), r, constant(in, ty(r))));
        mark(r);
      }
      for (const pir::Block& region : in.regions) hoist_constants(region);
    }
  }

  // ---- ops
  void block(const pir::Block& b) {
    for (const pir::Inst& in : b.insts) inst(in);
  }

  std::string binary_float(Op op, V a, V b) const {
    DType d = dt(a);
    if (d == DType::f64) {
      switch (op) {
        case Op::add: return fmt::format("__dadd_rn({}, {})", n(a), n(b));
        case Op::sub: return fmt::format("__dsub_rn({}, {})", n(a), n(b));
        case Op::mul: return fmt::format("__dmul_rn({}, {})", n(a), n(b));
        case Op::div: return fmt::format("__ddiv_rn({}, {})", n(a), n(b));
        case Op::rem: return fmt::format("tj_frem({}, {})", n(a), n(b));
        case Op::minimum: return fmt::format("tj_min({}, {})", n(a), n(b));
        case Op::maximum: return fmt::format("tj_max({}, {})", n(a), n(b));
        default: break;
      }
    } else {
      std::string x = fl(a), y = fl(b), e;
      switch (op) {
        case Op::add: e = fmt::format("__fadd_rn({}, {})", x, y); break;
        case Op::sub: e = fmt::format("__fsub_rn({}, {})", x, y); break;
        case Op::mul: e = fmt::format("__fmul_rn({}, {})", x, y); break;
        case Op::div: e = fmt::format("__fdiv_rn({}, {})", x, y); break;
        case Op::rem: e = fmt::format("tj_frem({}, {})", x, y); break;
        case Op::minimum: e = fmt::format("tj_min({}, {})", x, y); break;
        case Op::maximum: e = fmt::format("tj_max({}, {})", x, y); break;
        default: fail(fmt::format("{} is not defined for floating-point operands", pir::op_name(op)));
      }
      return round_from_f32(d, e);
    }
    fail(fmt::format("{} is not defined for floating-point operands", pir::op_name(op)));
  }

  std::string binary_int(Op op, V a, V b) const {
    DType d = dt(a);
    const std::string x = n(a), y = n(b);
    const char* U = uwide(d);
    const char* T = scalar_ctype(d);
    const bool s = ir::is_signed(d);
    const int w = ir::bit_width(d);
    switch (op) {
      case Op::add: return wrap(d, fmt::format("({0}){1} + ({0}){2}", U, x, y));
      case Op::sub: return wrap(d, fmt::format("({0}){1} - ({0}){2}", U, x, y));
      case Op::mul: return wrap(d, fmt::format("({0}){1} * ({0}){2}", U, x, y));
      case Op::div:
        // x / 0 is all ones, MIN / -1 wraps to MIN (the interpreter's rules, never a trap).
        if (safe_divisor(b)) return fmt::format("({})({} / {})", T, x, y);
        if (s) return fmt::format("{1} == 0 ? ({2})-1 : {1} == ({2})-1 ? {3} : ({2})({0} / {1})", x, y, T, wrap(d, fmt::format("0u - ({}){}", U, x)));
        return fmt::format("{1} == 0 ? ({2})-1 : ({2})({0} / {1})", x, y, T);
      case Op::rem:
        if (safe_divisor(b)) return fmt::format("({})({} % {})", T, x, y);
        if (s) return fmt::format("{1} == 0 ? {0} : {1} == ({2})-1 ? ({2})0 : ({2})({0} % {1})", x, y, T);
        return fmt::format("{1} == 0 ? {0} : ({2})({0} % {1})", x, y, T);
      case Op::minimum: return fmt::format("{0} < {1} ? {0} : {1}", x, y);
      case Op::maximum: return fmt::format("{0} > {1} ? {0} : {1}", x, y);
      case Op::bit_and: return fmt::format("({})({} & {})", T, x, y);
      case Op::bit_or: return fmt::format("({})({} | {})", T, x, y);
      case Op::bit_xor: return fmt::format("({})({} ^ {})", T, x, y);
      case Op::shl: case Op::shr: {
        // The amount is read as an unsigned number of the operand's width; >= width shifts
        // everything out (an arithmetic right shift leaves the sign).
        if (auto k = const_bits(b)) {  // a constant amount: decide here
          if (op == Op::shl) return *k >= uint64_t(w) ? fmt::format("({})0", T) : wrap(d, fmt::format("({}){} << {}", U, x, *k));
          if (s) return fmt::format("({})({} >> {})", T, x, std::min<uint64_t>(*k, uint64_t(w - 1)));
          return *k >= uint64_t(w) ? fmt::format("({})0", T) : fmt::format("({})({} >> {})", T, x, *k);
        }
        std::string amount = std::string_view(U) == uexact(d) ? fmt::format("({}){}", U, y) : fmt::format("({})({}){}", U, uexact(d), y);
        std::string big = fmt::format("{} >= {}{}", amount, w, w > 32 ? "ull" : "u");
        if (op == Op::shl) return fmt::format("{} ? ({})0 : {}", big, T, wrap(d, fmt::format("({}){} << {}", U, x, amount)));
        if (s) return fmt::format("({})({} >> ({} ? {}u : {}))", T, x, big, w - 1, amount);
        return fmt::format("{} ? ({})0 : ({})({} >> {})", big, T, T, x, amount);
      }
      case Op::umulhi:
        if (w == 64) return fmt::format("({})__umul64hi((unsigned long long){}, (unsigned long long){})", T, x, y);
        if (w == 32) return fmt::format("({})__umulhi((unsigned){}, (unsigned){})", T, x, y);
        return wrap(d, fmt::format("((unsigned)({0}){1} * (unsigned)({0}){2}) >> {3}", uexact(d), x, y, w));
      default: fail(fmt::format("{} is not defined for integer operands", pir::op_name(op)));
    }
  }

  std::string unary(Op op, V a) const {
    DType d = dt(a);
    const std::string x = n(a);
    if (!ir::is_float(d)) {
      switch (op) {
        case Op::neg: return wrap(d, fmt::format("0u - ({}){}", uwide(d), x));
        case Op::bit_not: return d == DType::i1 ? fmt::format("!{}", x) : fmt::format("({})~{}", scalar_ctype(d), x);
        case Op::abs:
          if (ir::is_signed(d)) return fmt::format("{} < 0 ? {} : {}", x, wrap(d, fmt::format("0u - ({}){}", uwide(d), x)), x);
          return x;
        default: fail(fmt::format("{} is not defined for integer operands", pir::op_name(op)));
      }
    }
    switch (op) {
      case Op::neg: return d == DType::f32 || d == DType::f64 ? fmt::format("-{}", x) : fmt::format("__hneg({})", x);
      case Op::abs:
        if (d == DType::f64) return fmt::format("fabs({})", x);
        if (d == DType::bf16) return fmt::format("__habs({})", x);
        return round_from_f32(d, fmt::format("fabsf({})", fl(a)));
      case Op::bit_not: fail("not is not defined for floating-point operands");
      default: break;
    }
    if (d == DType::f64) {
      if (op == Op::sqrt) return fmt::format("__dsqrt_rn({})", x);
      if (op == Op::floor) return fmt::format("floor({})", x);
      if (op == Op::ceil) return fmt::format("ceil({})", x);
      fail(fmt::format("{} on f64 is not supported on the GPU yet", pir::op_name(op)));
    }
    const std::string f = fl(a);
    std::string e;
    switch (op) {
      case Op::exp2: e = fmt::format("tj_ex2({})", f); break;
      case Op::exp: e = fmt::format("tj_exp({})", f); break;
      case Op::log2: e = fmt::format("tj_lg2({})", f); break;
      case Op::log: e = fmt::format("tj_log({})", f); break;
      case Op::sqrt: e = fmt::format("__fsqrt_rn({})", f); break;
      case Op::rsqrt: e = fmt::format("tj_rsqrt({})", f); break;
      case Op::rcp: e = fmt::format("tj_rcp({})", f); break;
      case Op::floor: e = fmt::format("floorf({})", f); break;
      case Op::ceil: e = fmt::format("ceilf({})", f); break;
      case Op::tanh: e = fmt::format("tj_tanh({})", f); break;
      case Op::sin: e = fmt::format("tj_sin({})", f); break;
      case Op::cos: e = fmt::format("tj_cos({})", f); break;
      case Op::erf: return fmt::format("tj_erf({})", x);  // rounds (f16/bf16) inside
      default: fail(fmt::format("{} is not a unary op", pir::op_name(op)));
    }
    return round_from_f32(d, e);
  }

  std::string compare(pir::Pred p, V a, V b) const {
    static const char* ops[6] = {"==", "!=", "<", "<=", ">", ">="};
    const auto i = static_cast<size_t>(p);
    if (i >= 6) fail(fmt::format("cmp has predicate #{}, which is not one of eq ne lt le gt ge", i));
    if (ty(a).ptr) {  // as the LLVM backend would: signedness from the pointee
      const char* I = ir::is_signed(dt(a)) ? "long long" : "unsigned long long";
      return fmt::format("reinterpret_cast<{0}>({1}) {2} reinterpret_cast<{0}>({3})", I, n(a), ops[i], n(b));
    }
    // Float == is ordered and != unordered, exactly LLVM's oeq/une; <, <=, >, >= are ordered.
    if (is_narrow(dt(a))) return fmt::format("{} {} {}", fl(a), ops[i], fl(b));
    return fmt::format("{} {} {}", n(a), ops[i], n(b));
  }

  std::string cast(V a, pir::Ty to) const {
    pir::Ty from = ty(a);
    const std::string x = n(a);
    if (from == to) return x;
    if (from.ptr || to.ptr) {
      if (from.ptr && to.ptr) return fmt::format("reinterpret_cast<{}>({})", ctype(to), x);
      fail("cast between a pointer and a scalar; use bitcast");
    }
    DType fd = from.dtype, td = to.dtype;
    if (ir::is_fp8(fd) || ir::is_fp8(td)) fail("fp8 conversions are not supported on the GPU yet");
    const bool ff = ir::is_float(fd), tf = ir::is_float(td);
    if (td == DType::i1) return ff ? fmt::format("{} != 0.0{}", fd == DType::f64 ? x : fl(a), fd == DType::f64 ? "" : "f")
                                   : fmt::format("{} != 0", x);
    if (ff && tf) {
      // Each is one rounding from the source value (f16 <-> bf16 through f32 is exact to f32).
      const std::string f32 = fd == DType::f64 ? fmt::format("__double2float_rn({})", x) : fl(a);
      const std::string f64 = fd == DType::f64 ? x : fd == DType::f32 ? fmt::format("(double){}", x) : fmt::format("tj_to_f64({})", x);
      switch (td) {
        case DType::f64: return f64;
        case DType::f32: return f32;
        case DType::f16: return fd == DType::f64 ? fmt::format("__double2half({})", x) : round_from_f32(td, fl(a));
        case DType::bf16: return fd == DType::f64 ? fmt::format("__double2bfloat16({})", x) : round_from_f32(td, fl(a));
        default: break;
      }
    }
    if (!ff && tf) {
      // Signed sources (not i1) convert from their value, others from their unsigned value; one rounding.
      const bool s = ir::is_signed(fd);
      const bool wide = ir::bit_width(fd) == 64;
      const std::string src = wide ? fmt::format("({}){}", s ? "long long" : "unsigned long long", x)
                                   : fmt::format("({}){}", s ? "int" : "unsigned", x);
      const char* k = wide ? (s ? "ll" : "ull") : (s ? "int" : "uint");
      switch (td) {
        case DType::f32: return fmt::format("__{}2float_rn({})", k, src);
        case DType::f64: return wide ? fmt::format("__{}2double_rn({})", k, src) : fmt::format("(double){}", src);
        case DType::f16: return fmt::format("__{}2half_rn({})", k, src);
        case DType::bf16: return fmt::format("__{}2bfloat16_rn({})", k, src);
        default: break;
      }
    }
    if (ff && !tf) {
      // Saturating, NaN -> 0; narrow floats convert from their f32 value.
      const bool dbl = fd == DType::f64;
      const std::string src = dbl ? x : fl(a);
      const int w = ir::bit_width(td);
      const bool s = ir::is_signed(td);
      const std::string lo = s ? fmt::format("-0x1p{}", w - 1) : std::string("0x0p0");
      const std::string hi = fmt::format("0x1p{}", s ? w - 1 : w);
      const std::string sfx = dbl ? "" : "f";
      const char* T = scalar_ctype(td);
      const std::string tmin = !s ? fmt::format("({})0", T)
                               : w == 64 ? std::string("(long long)0x8000000000000000ull")
                                         : fmt::format("({})({})", T, -(int64_t{1} << (w - 1)));
      const std::string tmax = fmt::format("({})0x{:x}ull", T, s ? (uint64_t{1} << (w - 1)) - 1 : (w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1));
      return fmt::format("tj_f2i<{}, {}>({}, {}{}, {}{}, {}, {})", T, dbl ? "double" : "float", src, lo, sfx, hi, sfx, tmin, tmax);
    }
    // integer -> integer: sign-extend signed sources, zero-extend unsigned and i1, truncate (wrap).
    return fmt::format("({}){}", scalar_ctype(td), x);
  }

  std::string bitcast(V a, pir::Ty to) const {
    pir::Ty from = ty(a);
    const std::string x = n(a);
    if (from == to) return x;
    if (to.ptr && from.ptr) return fmt::format("reinterpret_cast<{}>({})", ctype(to), x);
    if (to.ptr) return fmt::format("reinterpret_cast<{}>((unsigned long long){})", ctype(to), x);
    if (from.ptr) return fmt::format("({})reinterpret_cast<unsigned long long>({})", scalar_ctype(to.dtype), x);
    if (ir::bit_width(from.dtype) != ir::bit_width(to.dtype))
      fail(fmt::format("bitcast from {} to {} changes the width", ir::name(from.dtype), ir::name(to.dtype)));
    return from_bits(to.dtype, bits(a));
  }

  std::string bits16(V v) const {
    if (ty(v).ptr || ir::bit_width(dt(v)) != 16) fail(fmt::format("pack2 takes 16-bit values, got {}", pir::type_name(ty(v))));
    return bits(v);
  }

  // Predicated global accesses through the width-specific helpers.
  struct Access {
    const char* suffix;  // u8, b16, b32, b64
    const char* reg;     // C type of the register
  };
  static Access access(DType d) {
    switch (ir::byte_size(d)) {
      case 1: return {"u8", "unsigned short"};
      case 2: return {"b16", "unsigned short"};
      case 4: return {"b32", "unsigned"};
      default: return {"b64", "unsigned long long"};
    }
  }

  std::string smem(V off, DType d) const {
    return fmt::format("*reinterpret_cast<{}*>(tilejit_smem + {})", storage_ctype(d), n(off));
  }
  std::string to_storage(V v) const {
    return dt(v) == DType::i1 && !ty(v).ptr ? fmt::format("(unsigned char){}", n(v)) : n(v);
  }

  void inst(const pir::Inst& in) {
    auto a = [&](size_t i) { return in.args.at(i); };
    switch (in.op) {
      case Op::constant: return;  // hoisted
      case Op::param: {
        check_results(in, 1);
        if (in.imm < 0 || static_cast<size_t>(in.imm) >= f_.params.size())
          fail(fmt::format("param #{} does not exist (the kernel has {} parameters)", in.imm, f_.params.size()));
        if (!(f_.params[static_cast<size_t>(in.imm)].ty == ty(in.results[0])))
          fail(fmt::format("param #{} is {} but its value is {}", in.imm, pir::type_name(f_.params[static_cast<size_t>(in.imm)].ty),
                           pir::type_name(ty(in.results[0]))));
        return def(in.results[0], param_name(static_cast<size_t>(in.imm)));
      }
      case Op::thread_id: check_results(in, 1); return def(in.results[0], "(int)threadIdx.x");
      case Op::block_id: case Op::grid_dim: {
        check_results(in, 1);
        if (in.imm < 0 || in.imm > 2) fail(fmt::format("{} axis {} is not 0, 1 or 2", pir::op_name(in.op), in.imm));
        static const char* axes[3] = {"x", "y", "z"};
        return def(in.results[0], fmt::format("(int){}.{}", in.op == Op::block_id ? "blockIdx" : "gridDim", axes[in.imm]));
      }
      case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::rem: case Op::minimum: case Op::maximum:
      case Op::bit_and: case Op::bit_or: case Op::bit_xor: case Op::shl: case Op::shr: case Op::umulhi: {
        check_args(in, 2, 2);
        check_results(in, 1);
        no_fp8(a(0), in);
        if (ty(a(0)).ptr) fail(fmt::format("{} on a pointer; use gep", pir::op_name(in.op)));
        const bool fp = ir::is_float(dt(a(0)));
        return def(in.results[0], fp ? binary_float(in.op, a(0), a(1)) : binary_int(in.op, a(0), a(1)));
      }
      case Op::neg: case Op::bit_not: case Op::abs: case Op::exp2: case Op::log2: case Op::exp: case Op::log: case Op::sqrt: case Op::rcp:
      case Op::rsqrt: case Op::floor: case Op::ceil: case Op::tanh: case Op::sin: case Op::cos: case Op::erf:
        check_args(in, 1, 1);
        check_results(in, 1);
        no_fp8(a(0), in);
        if (ty(a(0)).ptr) fail(fmt::format("{} on a pointer", pir::op_name(in.op)));
        if (!ir::is_float(dt(a(0))) && in.op != Op::neg && in.op != Op::bit_not && in.op != Op::abs)
          fail(fmt::format("{} is not defined for integer operands", pir::op_name(in.op)));
        return def(in.results[0], unary(in.op, a(0)));
      case Op::cmp:
        check_args(in, 2, 2);
        check_results(in, 1);
        no_fp8(a(0), in);
        return def(in.results[0], compare(static_cast<pir::Pred>(in.imm), a(0), a(1)));
      case Op::select:
        check_args(in, 3, 3);
        check_results(in, 1);
        return def(in.results[0], fmt::format("{} ? {} : {}", n(a(0)), n(a(1)), n(a(2))));
      case Op::byte_perm:
        check_args(in, 3, 3);
        check_results(in, 1);
        if (dt(a(0)) != DType::u32 && dt(a(0)) != DType::i32) fail(fmt::format("byte_perm takes u32 or i32, got {}", ir::name(dt(a(0)))));
        return def(in.results[0], fmt::format("({})tj_prmt((unsigned){}, (unsigned){}, (unsigned){})", scalar_ctype(dt(a(0))), n(a(0)),
                                              n(a(1)), n(a(2))));
      case Op::fma:
        check_args(in, 3, 3);
        check_results(in, 1);
        if (dt(a(0)) != DType::f32 && dt(a(0)) != DType::f64) fail(fmt::format("fma takes f32 or f64, got {}", ir::name(dt(a(0)))));
        return def(in.results[0], fmt::format("{}({}, {}, {})", dt(a(0)) == DType::f32 ? "__fmaf_rn" : "__fma_rn", n(a(0)), n(a(1)), n(a(2))));
      case Op::cast: check_args(in, 1, 1); check_results(in, 1); return def(in.results[0], cast(a(0), ty(in.results[0])));
      case Op::bitcast: check_args(in, 1, 1); check_results(in, 1); return def(in.results[0], bitcast(a(0), ty(in.results[0])));
      case Op::opaque: {
        // copies tied in/out of an empty volatile asm: computed before it, never sunk past it
        if (in.args.size() != in.results.size()) fail("opaque takes as many values as it returns");
        std::vector<std::string> tied;
        for (size_t i = 0; i < in.args.size(); ++i) {
          if (ty(in.results[i]) != ty(in.args[i])) fail("opaque returns its arguments' types");
          if (in.imm & pir::kOpaqueCopy) {  // a copy of its own (not tied): see pir::kOpaqueCopy
            const pir::Ty t = ty(in.results[i]);
            const int w = ir::bit_width(t.dtype);
            const char* c = t.ptr || t.dtype == DType::i1 ? nullptr
                            : w == 64                    ? (t.dtype == DType::f64 ? "d" : "l")
                            : w == 32                    ? (t.dtype == DType::f32 ? "f" : "r")
                            : w == 16                    ? "h"
                                                         : nullptr;
            if (!c) {
              def(in.results[i], n(in.args[i]));
              continue;
            }
            declare(in.results[i]);
            line(fmt::format("asm volatile(\"mov.b{} %0, %1;\" : \"={}\"(v{}) : \"{}\"({}));", w, c, in.results[i], c, n(in.args[i])));
            continue;
          }
          def(in.results[i], n(in.args[i]));
          const pir::Ty t = ty(in.results[i]);
          const int w = ir::bit_width(t.dtype);
          const char* c = t.ptr || t.dtype == DType::i1 ? nullptr  // pass through, as in the LLVM backend
                          : w == 64                    ? (t.dtype == DType::f64 ? "+d" : "+l")
                          : w == 32                    ? (t.dtype == DType::f32 ? "+f" : "+r")
                          : t.dtype == DType::i16 || t.dtype == DType::u16 ? "+h"
                                                                          : nullptr;
          if (c) tied.push_back(fmt::format("\"{}\"(v{})", c, in.results[i]));
        }
        if (!tied.empty()) line(fmt::format("asm volatile(\"\" : {});", fmt::join(tied, ", ")));
        return;
      }
      case Op::keep_alive: {
        // (thread_ir.hpp) predicated-off shared stores of each register
        std::string text = kNeverTrueP1;
        std::vector<std::string> ins;
        for (size_t k = 0; k < in.args.size(); ++k) {
          const pir::Ty t = ty(in.args[k]);
          const bool wide = ir::bit_width(t.dtype) == 64 || t.ptr;
          text += fmt::format("\\t@P1 st.shared.b{} [S1], %{};\\n", wide ? 64 : 32, ins.size());
          ins.push_back(wide ? fmt::format("\"l\"((unsigned long long){})", n(in.args[k]))
                             : t.dtype == DType::f32 ? fmt::format("\"r\"(__float_as_uint({}))", n(in.args[k]))
                                                     : fmt::format("\"r\"((unsigned){})", n(in.args[k])));
        }
        text += "}";
        line(fmt::format("asm volatile(\"{}\" :: {});", text, fmt::join(ins, ", ")));
        return;
      }
      case Op::pack2:
        check_args(in, 2, 2);
        check_results(in, 1);
        return def(in.results[0], fmt::format("(unsigned){} | ((unsigned){} << 16)", bits16(a(0)), bits16(a(1))));
      case Op::unpack2:
        check_args(in, 1, 1);
        check_results(in, 2);
        if (ty(a(0)) != pir::scalar(DType::u32)) fail("unpack2 takes a u32");
        for (V r : in.results)
          if (ty(r).ptr || ir::bit_width(dt(r)) != 16) fail(fmt::format("unpack2 results must be 16-bit, got {}", pir::type_name(ty(r))));
        def(in.results[0], from_bits(dt(in.results[0]), fmt::format("{} & 0xFFFFu", n(a(0)))));
        return def(in.results[1], from_bits(dt(in.results[1]), fmt::format("{} >> 16", n(a(0)))));
      case Op::load_vec: {
        // one aligned vector access: uint2/uint4 (or one unsigned) through a reinterpret_cast
        check_args(in, 1, 1);
        if (!ty(a(0)).ptr) fail("load_vec takes a pointer");
        if (in.imm != static_cast<int64_t>(in.results.size()) || (in.imm != 1 && in.imm != 2 && in.imm != 4))
          fail(fmt::format("load_vec of {} words has {} results (1, 2 or 4 words, one result each)", in.imm, in.results.size()));
        for (V r : in.results)
          if (ty(r) != pir::scalar(DType::u32)) fail("load_vec results must be u32");
        const char* vt = in.results.size() == 4 ? "uint4" : in.results.size() == 2 ? "uint2" : "uint1";
        std::string tmp = fmt::format("vec{}", in.results[0]);
        line(fmt::format("const {} {} = *reinterpret_cast<const {}*>({});", vt, tmp, vt, n(a(0))));
        static const char* lanes[4] = {"x", "y", "z", "w"};
        for (size_t i = 0; i < in.results.size(); ++i) def(in.results[i], fmt::format("{}.{}", tmp, lanes[i]));
        return;
      }
      case Op::store_vec: {
        check_args(in, 2, 5);
        if (!ty(a(0)).ptr) fail("store_vec takes a pointer");
        size_t words = in.args.size() - 1;
        if (words == 3) fail("store_vec stores 1, 2 or 4 words, not 3");
        for (size_t i = 1; i < in.args.size(); ++i)
          if (ty(a(i)) != pir::scalar(DType::u32)) fail("store_vec values must be u32");
        const char* vt = words == 4 ? "uint4" : words == 2 ? "uint2" : "uint1";
        std::vector<std::string> parts;
        for (size_t i = 1; i < in.args.size(); ++i) parts.push_back(n(a(i)));
        line(fmt::format("*reinterpret_cast<{}*>({}) = make_{}({});", vt, n(a(0)), vt, fmt::join(parts, ", ")));
        return;
      }
      case Op::gep: {
        check_args(in, 2, 2);
        check_results(in, 1);
        if (!ty(a(0)).ptr || ty(a(1)).ptr) fail("gep takes a pointer and an integer offset");
        const bool s = ir::is_signed(dt(a(1)));
        return def(in.results[0], fmt::format("{} + ({}){}", n(a(0)), s ? "long long" : "unsigned long long", n(a(1))));
      }
      case Op::load: return load(in);
      case Op::store: return store(in);
      case Op::atomic_add: return atomic_add(in);
      case Op::load_shared: {
        check_args(in, 1, 1);
        check_results(in, 1);
        DType d = dt(in.results[0]);
        std::string e = smem(a(0), ty(in.results[0]).ptr ? DType::u64 : d);
        if (ty(in.results[0]).ptr) return def(in.results[0], fmt::format("reinterpret_cast<{}>({})", ctype(ty(in.results[0])), e));
        return def(in.results[0], d == DType::i1 ? fmt::format("({} != 0)", e) : e);
      }
      case Op::store_shared: {
        check_args(in, 2, 3);
        const std::string v = ty(a(1)).ptr ? fmt::format("reinterpret_cast<unsigned long long>({})", n(a(1))) : to_storage(a(1));
        const std::string s = fmt::format("{} = {};", smem(a(0), ty(a(1)).ptr ? DType::u64 : dt(a(1))), v);
        if (in.args.size() == 3) line(fmt::format("if ({}) {}", n(a(2)), s));
        else line(s);
        return;
      }
      case Op::barrier: line("__syncthreads();"); return;
      case Op::named_barrier_sync:
      case Op::named_barrier_arrive:
      {
        // fenced as in the LLVM backend (unless pir::kBarrierUnfenced): ptxas would sink the
        // arithmetic computed before a turn (the softmax) past the bar.sync, into the turn
        check_args(in, 1, 1);
        const std::string op = in.op == Op::named_barrier_sync ? "bar.sync %0, %1;" : "bar.arrive %0, %1;";
        line(fmt::format("asm volatile(\"{}\" :: \"r\"({}), \"r\"({}) : \"memory\");",
                         in.imm & pir::kBarrierUnfenced ? op : ptxas_fence(op, "TJ_TURN"), u32(a(0)), in.imm & (pir::kBarrierUnfenced - 1)));
        return;
      }
      case Op::shfl_xor: {
        check_args(in, 1, 1);
        check_results(in, 1);
        V x = a(0);
        const std::string mask = fmt::format("{}", static_cast<int>(in.imm));
        if (ty(x).ptr) {
          return def(in.results[0], fmt::format("reinterpret_cast<{}>(__shfl_xor_sync(0xffffffffu, reinterpret_cast<unsigned long long>({}), {}))",
                                                ctype(ty(x)), n(x), mask));
        }
        switch (dt(x)) {
          case DType::i32: case DType::u32: case DType::i64: case DType::u64: case DType::f32: case DType::f64: case DType::f16:
          case DType::bf16:
            return def(in.results[0], fmt::format("__shfl_xor_sync(0xffffffffu, {}, {})", n(x), mask));
          default:  // 1, 8 and 16-bit integers (and fp8 bits) travel as a 32-bit word
            return def(in.results[0], from_bits(dt(x), fmt::format("__shfl_xor_sync(0xffffffffu, (unsigned){}, {})", bits(x), mask)));
        }
      }
      case Op::mma_16816: return mma(in);
      case Op::smem_addr:
        check_args(in, 1, 1);
        check_results(in, 1);
        return def(in.results[0], fmt::format("(unsigned)__cvta_generic_to_shared(tilejit_smem + {})", n(a(0))));
      case Op::mbar_init:
        check_args(in, 2, 2);
        line(fmt::format("asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"({}), \"r\"({}) : \"memory\");", u32(a(0)),
                         u32(a(1))));
        return;
      case Op::mbar_expect_tx:
        check_args(in, 2, 2);
        line(fmt::format("asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"({}), \"r\"({}) : \"memory\");",
                         u32(a(0)), u32(a(1))));
        return;
      case Op::mbar_arrive:
        check_args(in, 1, 1);
        line(fmt::format("asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"({}) : \"memory\");", u32(a(0))));
        return;
      case Op::sem_wait:
        check_args(in, 2, 2);
        line(fmt::format("tj_sem_wait((const int*){}, (int){});", n(a(0)), n(a(1))));
        return;
      case Op::sem_signal:
        check_args(in, 2, 2);
        line(fmt::format("tj_sem_signal((int*){}, (int){});", n(a(0)), n(a(1))));
        return;
      case Op::mbar_wait: check_args(in, 2, 2); line(fmt::format("tj_mbar_wait({}, {});", u32(a(0)), u32(a(1)))); return;
      case Op::tma_load_2d:
        check_args(in, 5, 5);
        if (!ty(a(1)).ptr && ir::bit_width(dt(a(1))) != 64) fail("tma_load_2d: the tensor map must be a pointer or a 64-bit address");
        line(fmt::format("asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{%2, %3}}], "
                         "[%4];\"\n{}    :: \"r\"({}), \"l\"({}), \"r\"({}), \"r\"({}), \"r\"({}) : \"memory\");",
                         indent(), u32(a(0)), n(a(1)), u32(a(2)), u32(a(3)), u32(a(4))));
        return;
      case Op::atom_shared:
        check_args(in, 2, 2);
        declare(in.results[0]);
        line(fmt::format("asm volatile(\"atom.acq_rel.cta.shared::cta.{} %0, [%1], %2;\" : \"=r\"(v{}) : \"r\"({}), \"r\"({}) : \"memory\");",
                         in.imm ? "exch.b32" : "add.u32", in.results[0], u32(a(0)), u32(a(1))));
        return;
      case Op::mbar_inval:
        check_args(in, 1, 1);
        line(fmt::format("asm volatile(\"mbarrier.inval.shared::cta.b64 [%0];\" :: \"r\"({}) : \"memory\");", u32(a(0))));
        return;
      case Op::tma_load:
      case Op::tma_reduce_add: {
        // (shared addr, map, coordinates[, mbarrier]): the copy's operands, then "{c0, c1, ...}"
        const bool load = in.op == Op::tma_load;
        const char* what = load ? "tma_load" : "tma_reduce_add";
        const auto rank = static_cast<size_t>(in.imm);
        if (rank < 1 || rank > 5) fail(fmt::format("{}: rank {} is not in [1, 5]", what, rank));
        check_args(in, rank + (load ? 3 : 2), rank + (load ? 3 : 2));
        if (!ty(a(1)).ptr && ir::bit_width(dt(a(1))) != 64) fail(fmt::format("{}: the tensor map must be a pointer or a 64-bit address", what));
        std::string coords, ins = load ? fmt::format("\"r\"({}), \"l\"({})", u32(a(0)), n(a(1))) : fmt::format("\"l\"({}), \"r\"({})", n(a(1)), u32(a(0)));
        for (size_t i = 0; i < rank; ++i) {
          coords += fmt::format("{}%{}", i ? ", " : "", i + 2);
          ins += fmt::format(", \"r\"({})", u32(a(2 + i)));
        }
        if (!load) {
          line(fmt::format("asm volatile(\"cp.reduce.async.bulk.tensor.{}d.global.shared::cta.add.tile.bulk_group [%0, {{{}}}], [%1];\"\n{}    :: {} : \"memory\");",
                           rank, coords, indent(), ins));
          return;
        }
        ins += fmt::format(", \"r\"({})", u32(a(2 + rank)));
        line(fmt::format("asm volatile(\"cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{{}}}], "
                         "[%{}];\"\n{}    :: {} : \"memory\");",
                         rank, coords, rank + 2, indent(), ins));
        return;
      }
      case Op::bulk_commit: line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");"); return;
      case Op::bulk_wait:
        line(fmt::format("asm volatile(\"cp.async.bulk.wait_group{} {};\" ::: \"memory\");", in.imm & pir::kBulkWaitRead ? ".read" : "",
                         in.imm & 0xFF));
        return;
      case Op::fence_proxy_async_global: line("asm volatile(\"fence.proxy.async.global;\" ::: \"memory\");"); return;
      case Op::set_max_registers:
        line(fmt::format("asm volatile(\"setmaxnreg.{}.sync.aligned.u32 {};\" ::: \"memory\");", in.imm > 0 ? "inc" : "dec",
                         std::abs(in.imm)));
        return;
      case Op::fence_mbar_init: line("asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");"); return;
      case Op::fence_proxy_async: line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");"); return;
      case Op::wgmma_fence: line("asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");"); return;
      case Op::wgmma_commit:
        // fenced (pir::kCommitFenced) as the LLVM backend does: no code hoisted into the group
        line(fmt::format("asm volatile(\"{}\" ::: \"memory\");", in.imm & pir::kCommitFenced
                                                                     ? ptxas_fence("wgmma.commit_group.sync.aligned;", "TJ_WGCOMMIT")
                                                                     : std::string("wgmma.commit_group.sync.aligned;")));
        return;
      case Op::wgmma_wait: case Op::wgmma: case Op::wgmma_rs: return wgmma(in);
      case Op::for_: return for_loop(in);
      case Op::if_: return if_op(in);
      case Op::yield: fail("yield outside a for or if region");
    }
    fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
  }

  void load(const pir::Inst& in) {
    check_args(in, 1, 3);
    if (in.args.size() == 2) fail("load takes a pointer, or a pointer, a predicate and a padding value");
    check_results(in, 1);
    V r = in.results[0];
    V p = in.args[0];
    if (!ty(p).ptr) fail("load from a value that is not a pointer");
    DType d = dt(r);
    if (ty(r).ptr) fail("loads of pointers are not supported");
    if (in.args.size() == 1) return def(r, d == DType::i1 ? fmt::format("(*{} != 0)", n(p)) : fmt::format("*{}", n(p)));
    Access acc = access(d);
    def(r, from_bits(d, fmt::format("tj_ld_{}({}, {}, ({}){})", acc.suffix, n(p), n(in.args[1]), acc.reg, bits(in.args[2]))));
  }

  void store(const pir::Inst& in) {
    check_args(in, 2, 3);
    V p = in.args[0], x = in.args[1];
    if (!ty(p).ptr) fail("store to a value that is not a pointer");
    if (ty(x).ptr) fail("stores of pointers are not supported");
    if (in.args.size() == 2) {
      line(fmt::format("*{} = {};", n(p), to_storage(x)));
      return;
    }
    Access acc = access(dt(x));
    line(fmt::format("tj_st_{}({}, ({}){}, {});", acc.suffix, n(p), acc.reg, bits(x), n(in.args[2])));
  }

  void atomic_add(const pir::Inst& in) {
    check_args(in, 2, 3);
    check_results(in, 1);
    V p = in.args[0], x = in.args[1], r = in.results[0];
    DType d = dt(x);
    if (!ty(p).ptr || ty(x).ptr) fail("atomic_add takes a pointer and a value");
    std::string e;
    switch (d) {
      case DType::i32: case DType::u32: case DType::u64: case DType::f32: case DType::f64: case DType::f16: case DType::bf16:
        e = fmt::format("atomicAdd({}, {})", n(p), n(x));
        break;
      case DType::i64:
        e = fmt::format("(long long)atomicAdd(reinterpret_cast<unsigned long long*>({}), (unsigned long long){})", n(p), n(x));
        break;
      case DType::i8: case DType::u8: case DType::i16: case DType::u16:
        e = from_bits(d, fmt::format("tj_atomic_add_small({}, (unsigned){}, {}u)", n(p), bits(x), ir::byte_size(d)));
        break;
      default: fail(fmt::format("atomic_add on {} is not supported", ir::name(d)));
    }
    if (in.args.size() == 2) return def(r, e);
    def(r, zero(d));
    line(fmt::format("if ({}) v{} = {};", n(in.args[2]), r, e));
  }

  void mma(const pir::Inst& in) {
    check_args(in, 10, 10);
    check_results(in, 4);
    const auto od = static_cast<DType>(in.imm);
    if (od != DType::f16 && od != DType::bf16) fail(fmt::format("mma_16816 operands must be f16 or bf16 (imm is {})", in.imm));
    const char* t = od == DType::bf16 ? "bf16" : "f16";
    std::vector<std::string> ins;
    for (size_t i = 0; i < 10; ++i) {
      V v = in.args[i];
      const bool f32 = i >= 6;
      if (ty(v).ptr || dt(v) != (f32 ? DType::f32 : DType::u32))
        fail(fmt::format("mma_16816 operand {} is {}, expected {}", i, pir::type_name(ty(v)), f32 ? "f32" : "u32"));
      ins.push_back(fmt::format("\"{}\"({})", f32 ? "f" : "r", n(v)));
    }
    for (V r : in.results)
      if (ty(r) != pir::scalar(DType::f32)) fail("mma_16816 results must be f32");
    line(fmt::format("float v{}, v{}, v{}, v{};", in.results[0], in.results[1], in.results[2], in.results[3]));
    for (V r : in.results) mark(r);
    line(fmt::format("asm(\"mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
                     "{{%10,%11,%12,%13}};\"\n{5}    : \"=f\"(v{1}), \"=f\"(v{2}), \"=f\"(v{3}), \"=f\"(v{4})\n{5}    : {6});",
                     t, in.results[0], in.results[1], in.results[2], in.results[3], std::string(static_cast<size_t>(depth_) * 2, ' '),
                     fmt::join(ins, ", ")));
  }

  // wgmma and wgmma_wait: the results are the accumulators, tied to the inputs ("+f"), as the LLVM
  // backend ties its outputs to its inputs.
  int asm_labels_ = 0;  // unique labels inside inline asm
  // `ptx` (inline-asm text with %N operands) inside a never-taken loop on %smid (the LLVM backend's
  // ptxas_fence): ptxas moves no code across it. As C++ string-literal text, with a fresh label.
  std::string ptxas_fence(const std::string& ptx, const char* label) {
    const int id = asm_labels_++;
    return fmt::format("{}\\t{}_{}:\\n\\t{}\\n\\t@P1 bra.uni {}_{};\\n\\t}}", kNeverTrueP1, label, id, ptx, label, id);
  }
  // The LLVM backend's kNeverTrueP1 as C++ string-literal text of an asm with operands: opens a
  // scope with P1 never true (ptxas cannot know; S1 holds the SM id); the caller closes it.
  static constexpr const char* kNeverTrueP1 =
      "{\\n\\t.reg .pred P1;\\n\\t.reg .b32 S1;\\n\\tmov.u32 S1, %%smid;\\n\\tsetp.gt.u32 P1, S1, 2147483647;\\n";

  void wgmma(const pir::Inst& in) {
    const bool is_wait = in.op == Op::wgmma_wait, rs = in.op == Op::wgmma_rs;
    const size_t nr = in.results.size();
    const size_t first_acc = is_wait ? 0 : rs ? 5 : 2;
    if (in.args.size() != first_acc + nr)
      fail(fmt::format("{} has {} operands for {} accumulators (expected {})", pir::op_name(in.op), in.args.size(), nr, first_acc + nr));
    // imm bit 25 (wgmma, wgmma_rs): D = A*B, scale-d = 0: the accumulator inputs are not read.
    const bool overwrite = !is_wait && ((in.imm >> 25) & 1);
    for (size_t i = 0; i < nr; ++i) {
      if (ty(in.args[first_acc + i]) != pir::scalar(DType::f32) || ty(in.results[i]) != pir::scalar(DType::f32))
        fail(fmt::format("{}: accumulators must be f32", pir::op_name(in.op)));
      if (overwrite) declare(in.results[i]);
      else def(in.results[i], n(in.args[first_acc + i]));
    }
    const char* scale_d = overwrite ? "0" : "1";
    std::string text;
    std::string inputs;
    if (is_wait) {
      const int64_t groups = in.imm & 0xFF;
      if (in.imm < 0 || groups > 7) fail(fmt::format("wgmma_wait: {} groups in flight is not in [0, 7]", groups));
      text = fmt::format("wgmma.wait_group.sync.aligned {};", groups);
      // as the LLVM backend: a never-taken loop keeps ptxas from moving code across the wait
      if (in.imm & pir::kWaitFenced) text = ptxas_fence(text, "TJ_WGWAIT");
    } else {
      const int64_t nn = in.imm & 0xFFFF;
      const auto od = static_cast<DType>((in.imm >> 16) & 0xFF);
      const int64_t trans_b = (in.imm >> 24) & 1, trans_a = (in.imm >> 26) & 1;
      if (od != DType::f16 && od != DType::bf16) fail(fmt::format("wgmma operands must be f16 or bf16 (imm is {:#x})", in.imm));
      if (nn < 8 || nn > 256 || nn % 8 || static_cast<size_t>(nn / 2) != nr)
        fail(fmt::format("wgmma m64n{}k16 needs {} accumulators, got {}", nn, nn / 2, nr));
      const size_t first_desc = rs ? 4 : 0;
      for (size_t i = first_desc; i < first_acc; ++i)
        if (ty(in.args[i]).ptr || ir::bit_width(dt(in.args[i])) != 64) fail("wgmma: the descriptors must be 64-bit integers");
      for (size_t i = 0; i < first_desc; ++i)
        if (ty(in.args[i]) != pir::scalar(DType::u32)) fail("wgmma_rs: the A fragment must be four u32 registers");
      const char* t = od == DType::bf16 ? "bf16" : "f16";
      std::string regs;
      for (size_t i = 0; i < nr; ++i) regs += fmt::format("{}%{}", i ? ", " : "", i);
      if (rs) {
        text = fmt::format("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{}, 0;\\n\\twgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} "
                           "{{{}}}, {{%{}, %{}, %{}, %{}}}, %{}, p, 1, 1, {};\\n\\t}}",
                           nr + 5, nn, t, t, regs, nr, nr + 1, nr + 2, nr + 3, nr + 4, trans_b);
        inputs = fmt::format("\"r\"({}), \"r\"({}), \"r\"({}), \"r\"({}), \"l\"({}), \"r\"({})", n(in.args[0]), n(in.args[1]),
                             n(in.args[2]), n(in.args[3]), n(in.args[4]), scale_d);
      } else {
        text = fmt::format("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{}, 0;\\n\\twgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} "
                           "{{{}}}, %{}, %{}, p, 1, 1, {}, {};\\n\\t}}",
                           nr + 2, nn, t, t, regs, nr, nr + 1, trans_a, trans_b);
        inputs = fmt::format("\"l\"({}), \"l\"({}), \"r\"({})", n(in.args[0]), n(in.args[1]), scale_d);
      }
    }
    std::vector<std::string> outs;
    for (V r : in.results) outs.push_back(fmt::format("\"{}f\"(v{})", overwrite ? "=" : "+", r));
    line(fmt::format("asm volatile(\"{}\"\n{}    : {}\n{}    : {} : \"memory\");", text, indent(), fmt::join(outs, ", "), indent(), inputs));
  }

  static const pir::Inst* yield_of(const pir::Block& b) {
    return !b.insts.empty() && b.insts.back().op == Op::yield ? &b.insts.back() : nullptr;
  }
  void region_body(const pir::Block& b) {
    for (const pir::Inst& in : b.insts)
      if (in.op != Op::yield) inst(in);
  }

  void for_loop(const pir::Inst& in) {
    if (in.regions.size() != 1) fail("for has one region");
    const pir::Block& body = in.regions[0];
    if (in.args.size() < 3 || body.args.size() != in.args.size() - 2 || in.results.size() != body.args.size() - 1)
      fail(fmt::format("for: {} operands, {} region arguments and {} results do not match (expected lb, ub, step, init... / iv, "
                       "carried... / results...)", in.args.size(), body.args.size(), in.results.size()));
    const pir::Inst* y = yield_of(body);
    const size_t nc = in.results.size();
    if ((y ? y->args.size() : 0) != nc) fail(fmt::format("for: the body yields {} values for {} carried ones", y ? y->args.size() : 0, nc));
    V iv = body.args[0];
    DType id = dt(iv);
    if (ty(iv).ptr || ir::is_float(id) || id == DType::i1) fail("for: the induction variable must be an integer");
    // Carried values live in the enclosing scope so that the results can read them after the loop.
    for (size_t i = 0; i < nc; ++i) def(body.args[i + 1], n(in.args[i + 3]));
    const std::string lb = n(in.args[0]), ub = n(in.args[1]), step = n(in.args[2]);
    const char* S = sexact(id);
    const char* U = uwide(id);
    // Signed comparison and wrapping increment, as the LLVM backend's loop header and latch.
    line(fmt::format("for ({0} v{1} = {2}; ({3})v{1} < ({3}){4}; v{1} = ({0})(({5})v{1} + ({5}){6})) {{", scalar_ctype(id), iv, lb, S,
                     ub, U, step));
    ++depth_;
    open_scope();
    mark(iv);
    region_body(body);
    // Every yield reads the values of this iteration: go through temporaries where a yield reads a
    // carried value that an earlier assignment would overwrite.
    bool direct = true;
    for (size_t i = 0; i < nc && direct; ++i)
      for (size_t j = 0; j < nc; ++j)
        if (y->args[i] == body.args[j + 1] && j != i) direct = false;
    if (direct) {
      for (size_t i = 0; i < nc; ++i)
        if (y->args[i] != body.args[i + 1]) line(fmt::format("v{} = {};", body.args[i + 1], n(y->args[i])));
    } else {
      line("{");
      ++depth_;
      for (size_t i = 0; i < nc; ++i) line(fmt::format("{} t{} = {};", ctype(ty(body.args[i + 1])), i, n(y->args[i])));
      for (size_t i = 0; i < nc; ++i) line(fmt::format("v{} = t{};", body.args[i + 1], i));
      --depth_;
      line("}");
    }
    close_scope();
    --depth_;
    line("}");
    for (size_t i = 0; i < nc; ++i) {
      if (ty(in.results[i]) != ty(body.args[i + 1])) fail("for: a result's type differs from its carried value's");
      def(in.results[i], n(body.args[i + 1]));
    }
  }

  void if_op(const pir::Inst& in) {
    check_args(in, 1, 1);
    if (in.regions.size() != 2) fail("if has two regions (then, else)");
    for (V r : in.results) declare(r);
    for (int side = 0; side < 2; ++side) {
      const pir::Block& b = in.regions[static_cast<size_t>(side)];
      const pir::Inst* y = yield_of(b);
      if ((y ? y->args.size() : 0) != in.results.size())
        fail(fmt::format("if: the {} region yields {} values for {} results", side == 0 ? "then" : "else", y ? y->args.size() : 0,
                         in.results.size()));
      line(side == 0 ? fmt::format("if ({}) {{", n(in.args[0])) : std::string("} else {"));
      ++depth_;
      open_scope();
      region_body(b);
      for (size_t i = 0; i < in.results.size(); ++i) line(fmt::format("v{} = {};", in.results[i], n(y->args[i])));
      close_scope();
      --depth_;
    }
    line("}");
  }

  const pir::Func& f_;
  std::string body_;
  int depth_ = 1;
  std::vector<char> defined_;
  std::vector<std::optional<uint64_t>> const_bits_;
  std::vector<std::vector<V>> scopes_;
};

}  // namespace

std::string print_cuda(const pir::Func& f) { return Printer(f).run(); }

CudaOutput emit_ptx_nvrtc(const pir::Func& f, const std::string& arch) {
  CudaOutput out;
  auto t0 = std::chrono::steady_clock::now();
  out.source = print_cuda(f);
  out.source_ms = ms_since(t0);
  NvrtcResult r = nvrtc_compile(out.source, f.name, arch, {"--fmad=false"});
  out.ptx = std::move(r.ptx);
  out.nvrtc_ms = r.milliseconds;
  return out;
}

}  // namespace tilejit::jit
