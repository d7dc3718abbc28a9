// Values and arithmetic: C++ expressions of the per-thread IR's values, integer and float
// arithmetic with the LLVM backend's exact semantics, comparisons and conversions, and the
// instructions that compute values (parameters, special registers, arithmetic, pack2/unpack2).
#include <algorithm>
#include <limits>
#include <string_view>

#include "jit/cuda_backend/printer.hpp"

namespace tilejit::jit::cuda_backend {

// ---------------------------------------------------------------- value expressions

std::string Printer::wrap(DType d, const std::string& e) const {
  if (d == DType::i1) return fmt::format("((({}) & 1u) != 0)", e);
  return fmt::format("({})({})", scalar_ctype(d), e);
}
// A float expression of an f16/bf16/f32 value.
std::string Printer::fl(V v) const {
  switch (dt(v)) {
    case DType::f16: return fmt::format("__half2float({})", n(v));
    case DType::bf16: return fmt::format("__bfloat162float({})", n(v));
    default: return n(v);
  }
}
std::string Printer::round_from_f32(DType d, const std::string& e) const {
  switch (d) {
    case DType::f16: return fmt::format("__float2half_rn({})", e);
    case DType::bf16: return fmt::format("__float2bfloat16_rn({})", e);
    default: return e;
  }
}
// The bits of a scalar as an unsigned integer of its width (i1: 0/1).
std::string Printer::bits(V v) const {
  switch (dt(v)) {
    case DType::f16: return fmt::format("__half_as_ushort({})", n(v));
    case DType::bf16: return fmt::format("__bfloat16_as_ushort({})", n(v));
    case DType::f32: return fmt::format("__float_as_uint({})", n(v));
    case DType::f64: return fmt::format("(unsigned long long)__double_as_longlong({})", n(v));
    default: return fmt::format("({})({})", uexact(dt(v)), n(v));
  }
}
// A value of dtype d from an unsigned expression holding its bits (in the low bits).
std::string Printer::from_bits(DType d, const std::string& e) const {
  switch (d) {
    case DType::i1: return fmt::format("(({}) != 0)", e);
    case DType::f16: return fmt::format("__ushort_as_half((unsigned short)({}))", e);
    case DType::bf16: return fmt::format("__ushort_as_bfloat16((unsigned short)({}))", e);
    case DType::f32: return fmt::format("__uint_as_float((unsigned)({}))", e);
    case DType::f64: return fmt::format("__longlong_as_double((long long)({}))", e);
    default: return fmt::format("({})({})", scalar_ctype(d), e);
  }
}
std::string Printer::zero(DType d) const { return from_bits(d, "0u"); }

std::string Printer::int_literal(DType d, int64_t imm) const {
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

std::string Printer::constant(const pir::Inst& in, pir::Ty t) const {
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
std::optional<uint64_t> Printer::const_bits(V v) const {
  if (v >= const_bits_.size() || !const_bits_[v]) return std::nullopt;
  return const_bits_[v];
}
// A constant divisor that is neither 0 nor (for signed types) -1: plain C++ division is exact.
bool Printer::safe_divisor(V v) const {
  auto k = const_bits(v);
  if (!k || *k == 0) return false;
  const int w = ir::bit_width(dt(v));
  const uint64_t all = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
  return !(ir::is_signed(dt(v)) && *k == all);
}

// ---------------------------------------------------------------- ops

std::string Printer::binary_float(Op op, V a, V b) const {
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

std::string Printer::binary_int(Op op, V a, V b) const {
  DType d = dt(a);
  const std::string x = n(a), y = n(b);
  const char* U = uwide(d);
  const char* T = scalar_ctype(d);
  const bool s = ir::is_signed(d);
  const int w = ir::bit_width(d);
  // 8/16-bit sub and mul in 32 bits behind opaque movs (the LLVM backend's reason, emitter.hpp
  // in_32_bits: NVVM turns them into neg.s16, which ptxas gets wrong at -32768)
  if (w < 32 && (op == Op::sub || op == Op::mul))
    return wrap(d, fmt::format("tj_opaque32(tj_opaque32((unsigned){}) {} tj_opaque32((unsigned){}))", x, op == Op::sub ? '-' : '*', y));
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

std::string Printer::unary(Op op, V a) const {
  DType d = dt(a);
  const std::string x = n(a);
  if (!ir::is_float(d)) {
    switch (op) {
      case Op::neg:
        // 8/16-bit: in 32 bits behind opaque movs (neg.s16 of -32768 reads back as +32768: fuzzer)
        if (ir::bit_width(d) < 32) return wrap(d, fmt::format("tj_opaque32(0u - tj_opaque32((unsigned){}))", x));
        return wrap(d, fmt::format("0u - ({}){}", uwide(d), x));
      case Op::bit_not: return d == DType::i1 ? fmt::format("!{}", x) : fmt::format("({})~{}", scalar_ctype(d), x);
      case Op::popc:
        if (d != DType::u32) fail(fmt::format("popc needs a u32 operand, got {}", ir::name(d)));
        return fmt::format("(unsigned)__popc({})", x);
      case Op::abs:
        // 8/16-bit: the 32-bit abs wrapped back (abs.s16 gave +32768 for -32768, found by the fuzzer)
        if (ir::is_signed(d) && ir::bit_width(d) < 32)
          return wrap(d, fmt::format("tj_opaque32((unsigned)abs((int)tj_opaque32((unsigned){})))", x));
        if (ir::is_signed(d)) return (ir::bit_width(d) > 32 ? "tj_abs64(" : "tj_abs32(") + x + ")";
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

std::string Printer::compare(pir::Pred p, V a, V b) const {
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

std::string Printer::cast(V a, pir::Ty to) const {
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

std::string Printer::bitcast(V a, pir::Ty to) const {
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

std::string Printer::bits16(V v) const {
  if (ty(v).ptr || ir::bit_width(dt(v)) != 16) fail(fmt::format("pack2 takes 16-bit values, got {}", pir::type_name(ty(v))));
  return bits(v);
}

void Printer::arith_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return in.args.at(i); };
  switch (in.op) {
    case Op::param: {
      check_results(in, 1);
      if (in.imm < 0 || static_cast<size_t>(in.imm) >= f_.params.size())
        fail(fmt::format("param #{} does not exist (the kernel has {} parameters)", in.imm, f_.params.size()));
      if (!(f_.params[static_cast<size_t>(in.imm)].ty == ty(in.results[0])))
        fail(fmt::format("param #{} is {} but its value is {}", in.imm, pir::type_name(f_.params[static_cast<size_t>(in.imm)].ty),
                         pir::type_name(ty(in.results[0]))));
      if (f_.params[static_cast<size_t>(in.imm)].byval_bytes)  // a generic pointer into the parameter space
        return def(in.results[0], fmt::format("(unsigned char*)&{}", param_name(static_cast<size_t>(in.imm))));
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
    case Op::neg: case Op::bit_not: case Op::abs: case Op::popc: case Op::exp2: case Op::log2: case Op::exp: case Op::log: case Op::sqrt:
    case Op::rcp: case Op::rsqrt: case Op::floor: case Op::ceil: case Op::tanh: case Op::sin: case Op::cos: case Op::erf:
      check_args(in, 1, 1);
      check_results(in, 1);
      no_fp8(a(0), in);
      if (ty(a(0)).ptr) fail(fmt::format("{} on a pointer", pir::op_name(in.op)));
      if (!ir::is_float(dt(a(0))) && in.op != Op::neg && in.op != Op::bit_not && in.op != Op::abs && in.op != Op::popc)
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
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

}  // namespace tilejit::jit::cuda_backend
