// The fixed part of every CUDA source (the device helpers every kernel may call, as text) and
// the literals that give constants exactly the values the LLVM backend gives them.
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "jit/cuda_backend/printer.hpp"

namespace tilejit::jit::cuda_backend {

// ---------------------------------------------------------------- literals

namespace {

std::string hex_float(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", d);
  return buf;
}

}  // namespace

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

namespace {

// (in two parts: arithmetic, then memory and synchronisation)
std::string prelude_arithmetic() {
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

// Floating-point remainder, exact (std::fmod, the interpreter's): the LLVM backend's
// tilejit_fmod_f32 / _f64 step for step (llvm_backend/emitter.cpp says why each step is exact).
// F with P significand bits, U its bits. No product feeds a sum (nvrtc contracts those), and nvrtc's
// defaults (IEEE division, no flush to zero) keep every step exact on subnormals.
TJ_INLINE unsigned tj_bits(float x) { return __float_as_uint(x); }
TJ_INLINE unsigned long long tj_bits(double x) { return (unsigned long long)__double_as_longlong(x); }
TJ_INLINE float tj_from_bits(unsigned b) { return __uint_as_float(b); }
TJ_INLINE double tj_from_bits(unsigned long long b) { return __longlong_as_double((long long)b); }
template <class F>
TJ_INLINE F tj_frem_step(F a, F d) {  // a mod d, for a / d < 2^P
  F q = trunc(a / d), r = fma(-q, d, a);
  return r < F(0) ? r + d : r;
}
template <class F, class U, int P>
TJ_INLINE F tj_frem_exact(F x, F y) {
  const U mant = (U(1) << P) - 1, inf = (~U(0) >> 1) & ~mant;
  const F two_p = F(U(1) << P);
  F ax = fabs(x), ay = fabs(y);
  if (!(ay > F(0)) || !(ax < tj_from_bits(inf))) return (x * y) / (x * y);
  if (ax < ay) return x;
  F ay_p = ay * two_p;
  if (ax >= ay_p) {
    F b = ay < tj_from_bits(U(1) << P) ? ay_p : ay, b_p = b * two_p;  // b: normal
    U b_mant = tj_bits(b) & mant;
    while (ax >= b_p) ax = tj_frem_step(ax, tj_from_bits(b_mant | (((tj_bits(ax) >> P) - U(P - 1)) << P)));
    ax = tj_frem_step(ax, b);
  }
  return copysign(tj_frem_step(ax, ay), x);
}
TJ_INLINE float tj_frem(float x, float y) { return tj_frem_exact<float, unsigned, 23>(x, y); }
TJ_INLINE double tj_frem(double x, double y) { return tj_frem_exact<double, unsigned long long, 52>(x, y); }

// NaN-propagating minimum and maximum (PTX min/max return the other operand for one NaN): the
// sum is NaN exactly when an operand is. f16/bf16 run in f32, as in the LLVM backend.
TJ_INLINE float tj_min(float x, float y) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y)); return r; }
TJ_INLINE float tj_max(float x, float y) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y)); return r; }
TJ_INLINE double tj_min(double x, double y) { return ((x != x) | (y != y)) ? __dadd_rn(x, y) : fmin(x, y); }
TJ_INLINE double tj_max(double x, double y) { return ((x != x) | (y != y)) ? __dadd_rn(x, y) : fmax(x, y); }

// A 32-bit value the optimizer cannot see through: keeps 8/16-bit neg, sub, mul and abs in 32 bits
// (NVVM narrows them to neg.s16 / abs.s16, which ptxas gets wrong at -32768).
TJ_INLINE unsigned tj_opaque32(unsigned x) { unsigned r; asm("mov.b32 %0, %1;" : "=r"(r) : "r"(x)); return r; }
TJ_INLINE unsigned long long tj_opaque64(unsigned long long x) { unsigned long long r; asm("mov.b64 %0, %1;" : "=l"(r) : "l"(x)); return r; }

// |x| with |INT_MIN| = INT_MIN (wrapping), as (x ^ s) - s with the sign mask s opaque: from abs.s32
// the GPU read abs(INT_MIN) < 0 as false and abs(INT_MIN) >> 16 as positive (found by the fuzzer).
TJ_INLINE int tj_abs32(int x) { unsigned s = tj_opaque32((unsigned)(x >> 31)); return (int)(((unsigned)x ^ s) - s); }
TJ_INLINE long long tj_abs64(long long x) {
  unsigned long long s = tj_opaque64((unsigned long long)(x >> 63));
  return (long long)(((unsigned long long)x ^ s) - s);
}

// Saturating float -> integer conversion, NaN -> 0 (LLVM's fptosi.sat / fptoui.sat). lo is the
// type's minimum and hi_excl its maximum + 1, both exact in F.
template <class T, class F>
TJ_INLINE T tj_f2i(F x, F lo, F hi_excl, T tmin, T tmax) {
  return x != x ? T(0) : x <= lo ? tmin : x >= hi_excl ? tmax : static_cast<T>(x);
}

)";
  return s;
}

std::string prelude_memory() {
  std::string s;
  s += R"(// A TMA tensor map passed by value (CUtensorMap's size and alignment), read in place.
struct __align__(64) tilejit_tensor_map { unsigned char bytes[128]; };
)";
  s += R"(// Predicated global accesses: the element's bits travel in a 16/32/64-bit register (u8 into a
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

}  // namespace

// Helpers shared by every kernel. The transcendental helpers are the PTX instructions the LLVM
// backend's NVVM intrinsics select; tj_frem is the LLVM backend's exact remainder, step for step,
// so that ptxas treats both backends' code alike.
std::string prelude() { return prelude_arithmetic() + prelude_memory(); }

}  // namespace tilejit::jit::cuda_backend
