// Elementwise ops, conversions and tile shapes with the exact semantics the README states (and the
// GPU backends meet bit for bit where it says so): every float result rounded to its dtype,
// integers wrapped to their width, division and shifts that never trap, min/max with PTX's NaN
// rules, casts, bitcasts and 16-bit pairs.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {
namespace {

// exp and exp2 below f64 run as ex2.approx.ftz on the GPU: results under 2^-126 are zero.
inline double flush_exp(ir::DType d, double v) { return d != ir::DType::f64 && v < 0x1p-126 ? 0.0 : v; }

// dst[flat] = src[offset] over `shape` in row-major order, offset = sum idx[d] * strides[d].
template <class T>
void gather(const std::vector<T>& src, std::vector<T>& dst, const ir::Shape& shape, const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  dst.resize(static_cast<size_t>(n));
  if (shape.empty()) {
    dst[0] = src[0];
    return;
  }
  const size_t r = shape.size();
  const int64_t inner = shape[r - 1], istride = strides[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t flat = 0; flat < n; flat += inner) {
    for (int64_t j = 0; j < inner; ++j) dst[static_cast<size_t>(flat + j)] = src[static_cast<size_t>(off + j * istride)];
    for (size_t d = r - 1; d-- > 0;) {
      off += strides[d];
      if (++idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

std::vector<int64_t> row_major_strides(const ir::Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

enum class Pred { eq, ne, lt, le, gt, ge };

Pred parse_pred(const std::string& p) {
  if (p == "eq") return Pred::eq;
  if (p == "ne") return Pred::ne;
  if (p == "lt") return Pred::lt;
  if (p == "le") return Pred::le;
  if (p == "gt") return Pred::gt;
  if (p == "ge") return Pred::ge;
  throw std::logic_error("cmp: unknown predicate " + p);
}

template <class T>
inline bool compare(Pred p, T a, T b) {
  switch (p) {
    case Pred::eq: return a == b;
    case Pred::ne: return a != b;
    case Pred::lt: return a < b;
    case Pred::le: return a <= b;
    case Pred::gt: return a > b;
    case Pred::ge: return a >= b;
  }
  return false;
}

}  // namespace

// A numeric attribute (int64 or double) converted to dtype `t` the way a cast would.
void convert_attr(const ir::Attr& a, DType t, double& f, int64_t& i) {
  if (const auto* iv = std::get_if<int64_t>(&a)) {
    if (ir::is_float(t)) f = element::int_to_float(t, *iv, DType::i64);
    else i = element::int_to_int(t, *iv);
  } else {
    double d = std::get<double>(a);
    if (ir::is_float(t)) f = element::round_float(t, d);
    else i = element::float_to_int(t, d);
  }
}

void Machine::constant_op(const Op& op) {
  const ValueId res = op.results[0];
  double f = 0;
  int64_t i = 0;
  convert_attr(op.attrs.at("value"), T(res).dtype, f, i);
  if (is_float_slot(res)) S(res).f.assign(N(res), f);
  else S(res).i.assign(N(res), i);
}

void Machine::arange_op(const Op& op) {
  Slot& r = S(op.results[0]);
  const int64_t start = op.int_attr("start");
  r.i.resize(N(op.results[0]));
  for (size_t k = 0; k < r.i.size(); ++k) r.i[k] = start + static_cast<int64_t>(k);
}

void Machine::splat_op(const Op& op) {
  const Slot& a = S(op.operands[0]);
  Slot& r = S(op.results[0]);
  if (is_float_slot(op.operands[0])) r.f.assign(N(op.results[0]), a.f[0]);
  else r.i.assign(N(op.results[0]), a.i[0]);
}

void Machine::broadcast_op(const Op& op) {
  const ir::Shape& in = T(op.operands[0]).shape;
  std::vector<int64_t> st = row_major_strides(in);
  for (size_t d = 0; d < in.size(); ++d)
    if (in[d] == 1) st[d] = 0;
  permute(op, st);
}

void Machine::trans_op(const Op& op) {
  const auto& perm = op.ints_attr("perm");
  std::vector<int64_t> in_st = row_major_strides(T(op.operands[0]).shape), st(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) st[d] = in_st[static_cast<size_t>(perm[d])];
  permute(op, st);
}

void Machine::permute(const Op& op, const std::vector<int64_t>& src_strides) {
  const Slot& a = S(op.operands[0]);
  Slot& r = S(op.results[0]);
  const ir::Shape& out = T(op.results[0]).shape;
  if (is_float_slot(op.operands[0])) gather(a.f, r.f, out, src_strides);
  else gather(a.i, r.i, out, src_strides);
}

void Machine::binary(const Op& op) {
  using enum OpKind;
  const DType d = T(op.operands[0]).dtype;
  const size_t n = N(op.operands[0]);
  const Slot& A = S(op.operands[0]);
  const Slot& B = S(op.operands[1]);
  Slot& R = S(op.results[0]);
  if (op.kind == cmp) {
    const Pred p = parse_pred(op.str_attr("pred"));
    R.i.resize(n);
    if (ir::is_float(d)) {
      for (size_t k = 0; k < n; ++k) R.i[k] = compare(p, A.f[k], B.f[k]);
    } else if (ir::is_signed(d)) {
      for (size_t k = 0; k < n; ++k) R.i[k] = compare(p, A.i[k], B.i[k]);
    } else {
      for (size_t k = 0; k < n; ++k) R.i[k] = compare(p, static_cast<uint64_t>(A.i[k]), static_cast<uint64_t>(B.i[k]));
    }
    return;
  }
  if (ir::is_float(d)) {
    R.f.resize(n);
    const double* a = A.f.data();
    const double* b = B.f.data();
    double* r = R.f.data();
    with_rounder(d, [&](auto rnd) {
      switch (op.kind) {
        case add: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] + b[k]); return;
        case sub: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] - b[k]); return;
        case mul: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] * b[k]); return;
        case div: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] / b[k]); return;
        case rem: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::fmod(a[k], b[k])); return;
        case minimum: for (size_t k = 0; k < n; ++k) r[k] = min_nan(a[k], b[k]); return;
        case maximum: for (size_t k = 0; k < n; ++k) r[k] = max_nan(a[k], b[k]); return;
        default: fault(op, "not defined for floating-point operands");
      }
    });
    return;
  }
  R.i.resize(n);
  const int64_t* a = A.i.data();
  const int64_t* b = B.i.data();
  int64_t* r = R.i.data();
  const Wrap wrap(d);
  const bool sgn = ir::is_signed(d);
  const int w = ir::bit_width(d);
  const uint64_t wmask = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
  auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  switch (op.kind) {
    case add: for (size_t k = 0; k < n; ++k) r[k] = wrap(u(a[k]) + u(b[k])); return;
    case sub: for (size_t k = 0; k < n; ++k) r[k] = wrap(u(a[k]) - u(b[k])); return;
    case mul: for (size_t k = 0; k < n; ++k) r[k] = wrap(u(a[k]) * u(b[k])); return;
    case div:
      // Never traps: x/0 is all bits set, MIN/-1 wraps to MIN (what the GPU's div gives).
      for (size_t k = 0; k < n; ++k) {
        if (b[k] == 0) r[k] = wrap(~uint64_t{0});
        else if (sgn) r[k] = b[k] == -1 ? wrap(0 - u(a[k])) : a[k] / b[k];
        else r[k] = wrap(u(a[k]) / u(b[k]));
      }
      return;
    case rem:
      for (size_t k = 0; k < n; ++k) {
        if (b[k] == 0) r[k] = a[k];
        else if (sgn) r[k] = b[k] == -1 ? 0 : a[k] % b[k];
        else r[k] = wrap(u(a[k]) % u(b[k]));
      }
      return;
    case minimum:
      if (sgn) for (size_t k = 0; k < n; ++k) r[k] = std::min(a[k], b[k]);
      else for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(std::min(u(a[k]), u(b[k])));
      return;
    case maximum:
      if (sgn) for (size_t k = 0; k < n; ++k) r[k] = std::max(a[k], b[k]);
      else for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(std::max(u(a[k]), u(b[k])));
      return;
    case bit_and: for (size_t k = 0; k < n; ++k) r[k] = a[k] & b[k]; return;
    case bit_or: for (size_t k = 0; k < n; ++k) r[k] = a[k] | b[k]; return;
    case bit_xor: for (size_t k = 0; k < n; ++k) r[k] = a[k] ^ b[k]; return;
    case shl:
      // The amount is read as an unsigned number of the operand width; >= width shifts everything out.
      for (size_t k = 0; k < n; ++k) {
        uint64_t s = u(b[k]) & wmask;
        r[k] = s >= static_cast<uint64_t>(w) ? 0 : wrap(u(a[k]) << s);
      }
      return;
    case shr:
      for (size_t k = 0; k < n; ++k) {
        uint64_t s = u(b[k]) & wmask;
        if (sgn) r[k] = s >= static_cast<uint64_t>(w) ? (a[k] < 0 ? -1 : 0) : a[k] >> s;
        else r[k] = s >= static_cast<uint64_t>(w) ? 0 : static_cast<int64_t>(u(a[k]) >> s);
      }
      return;
    case umulhi:
      if (w == 32) {
        for (size_t k = 0; k < n; ++k) r[k] = wrap(((u(a[k]) & 0xFFFFFFFFu) * (u(b[k]) & 0xFFFFFFFFu)) >> 32);
      } else {
        for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(umulhi64(u(a[k]), u(b[k])));
      }
      return;
    default: fault(op, "not defined for integer operands");
  }
}

void Machine::unary(const Op& op) {
  using enum OpKind;
  const DType d = T(op.operands[0]).dtype;
  const size_t n = N(op.operands[0]);
  const Slot& A = S(op.operands[0]);
  Slot& R = S(op.results[0]);
  if (ir::is_float(d)) {
    R.f.resize(n);
    const double* a = A.f.data();
    double* r = R.f.data();
    with_rounder(d, [&](auto rnd) {
      switch (op.kind) {
        case neg: for (size_t k = 0; k < n; ++k) r[k] = -a[k]; return;
        case abs: for (size_t k = 0; k < n; ++k) r[k] = std::fabs(a[k]); return;
        // The GPU's ex2.approx.ftz flushes results below 2^-126 to zero (for f32, f16, bf16).
        case exp: for (size_t k = 0; k < n; ++k) r[k] = rnd(flush_exp(d, std::exp(a[k]))); return;
        case exp2: for (size_t k = 0; k < n; ++k) r[k] = rnd(flush_exp(d, std::exp2(a[k]))); return;
        case log: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::log(a[k])); return;
        case log2: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::log2(a[k])); return;
        case sqrt: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::sqrt(a[k])); return;
        case rsqrt: for (size_t k = 0; k < n; ++k) r[k] = rnd(1.0 / std::sqrt(a[k])); return;
        case rcp:  // rcp.approx.ftz below f64: subnormal inputs read as zero, subnormal results flush
          for (size_t k = 0; k < n; ++k) {
            const bool ftz = d != DType::f64;
            const double v = rnd(1.0 / (ftz ? flush_subnormal(a[k]) : a[k]));
            r[k] = ftz ? flush_subnormal(v) : v;
          }
          return;
        case floor: for (size_t k = 0; k < n; ++k) r[k] = std::floor(a[k]); return;
        case ceil: for (size_t k = 0; k < n; ++k) r[k] = std::ceil(a[k]); return;
        case tanh: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::tanh(a[k])); return;
        case sin: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::sin(a[k])); return;
        case cos: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::cos(a[k])); return;
        case erf: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::erf(a[k])); return;
        default: fault(op, "not defined for floating-point operands");
      }
    });
    return;
  }
  R.i.resize(n);
  const int64_t* a = A.i.data();
  int64_t* r = R.i.data();
  const Wrap wrap(d);
  auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  switch (op.kind) {
    case neg: for (size_t k = 0; k < n; ++k) r[k] = wrap(0 - u(a[k])); return;
    case bit_not: for (size_t k = 0; k < n; ++k) r[k] = wrap(~u(a[k])); return;
    case abs:
      if (ir::is_signed(d)) for (size_t k = 0; k < n; ++k) r[k] = a[k] < 0 ? wrap(0 - u(a[k])) : a[k];
      else std::copy(a, a + n, r);
      return;
    default: fault(op, "not defined for integer operands");
  }
}

void Machine::byte_perm_op(const Op& op) {
  const auto &a = S(op.operands[0]).i, &b = S(op.operands[1]).i, &sel = S(op.operands[2]).i;
  auto& r = S(op.results[0]).i;
  const Wrap wrap(T(op.results[0]).dtype);  // i32 results sign-extended, as every i32 slot
  r.resize(a.size());
  for (size_t k = 0; k < a.size(); ++k)
    r[k] = wrap(byte_perm32(static_cast<uint32_t>(a[k]), static_cast<uint32_t>(b[k]), static_cast<uint32_t>(sel[k])));
}

void Machine::fma_op(const Op& op) {
  const auto &a = S(op.operands[0]).f, &b = S(op.operands[1]).f, &c = S(op.operands[2]).f;
  auto& r = S(op.results[0]).f;
  const bool single = T(op.results[0]).dtype == DType::f32;
  r.resize(a.size());
  for (size_t k = 0; k < a.size(); ++k)
    r[k] = single ? static_cast<double>(std::fma(static_cast<float>(a[k]), static_cast<float>(b[k]), static_cast<float>(c[k])))
                  : std::fma(a[k], b[k], c[k]);
}

void Machine::select_op(const Op& op) {
  const auto& c = S(op.operands[0]).i;
  const Slot& A = S(op.operands[1]);
  const Slot& B = S(op.operands[2]);
  Slot& R = S(op.results[0]);
  const size_t n = c.size();
  if (is_float_slot(op.operands[1])) {
    R.f.resize(n);
    for (size_t k = 0; k < n; ++k) R.f[k] = c[k] ? A.f[k] : B.f[k];
  } else {
    R.i.resize(n);
    for (size_t k = 0; k < n; ++k) R.i[k] = c[k] ? A.i[k] : B.i[k];
  }
}

void Machine::cast_op(const Op& op) {
  const DType from = T(op.operands[0]).dtype, to = T(op.results[0]).dtype;
  const size_t n = N(op.operands[0]);
  const Slot& A = S(op.operands[0]);
  Slot& R = S(op.results[0]);
  const bool ff = ir::is_float(from), tf = ir::is_float(to);
  if (from == to) {  // a no-op, also for NaN payloads (an f32 round trip would quiet them)
    copy_slot(R, A);
  } else if (ff && tf) {
    R.f.resize(n);
    with_rounder(to, [&](auto rnd) {
      for (size_t k = 0; k < n; ++k) R.f[k] = rnd(A.f[k]);
    });
  } else if (!ff && tf) {
    R.f.resize(n);
    for (size_t k = 0; k < n; ++k) R.f[k] = element::int_to_float(to, A.i[k], from);
  } else if (ff) {
    R.i.resize(n);
    for (size_t k = 0; k < n; ++k) R.i[k] = element::float_to_int(to, A.f[k]);
  } else {
    R.i.resize(n);
    for (size_t k = 0; k < n; ++k) R.i[k] = element::int_to_int(to, A.i[k]);
  }
}

void Machine::bitcast_op(const Op& op) {
  const DType from = T(op.operands[0]).dtype, to = T(op.results[0]).dtype;
  const size_t n = N(op.operands[0]);
  const Slot& A = S(op.operands[0]);
  Slot& R = S(op.results[0]);
  const bool ff = ir::is_float(from), tf = ir::is_float(to);
  if (tf) R.f.resize(n);
  else R.i.resize(n);
  double f = 0;
  int64_t i = 0;
  for (size_t k = 0; k < n; ++k) {
    element::from_bits(to, element::to_bits(from, ff ? A.f[k] : 0.0, ff ? 0 : A.i[k]), f, i);
    if (tf) R.f[k] = f;
    else R.i[k] = i;
  }
}

// pack_pairs: word j = bits of elements 2j, 2j + 1 (low, high); unpack_pairs: the inverse.
void Machine::pairs_op(const Op& op) {
  const DType from = T(op.operands[0]).dtype, to = T(op.results[0]).dtype;
  const Slot& A = S(op.operands[0]);
  Slot& R = S(op.results[0]);
  const bool ff = ir::is_float(from), tf = ir::is_float(to);
  const size_t n = N(op.results[0]);
  if (tf) R.f.resize(n);
  else R.i.resize(n);
  auto bits = [&](size_t k) { return element::to_bits(from, ff ? A.f[k] : 0.0, ff ? 0 : A.i[k]); };
  double f = 0;
  int64_t i = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint64_t v = op.kind == OpKind::pack_pairs ? (bits(2 * k) & 0xFFFF) | (bits(2 * k + 1) & 0xFFFF) << 16
                                                     : bits(k / 2) >> (16 * (k % 2)) & 0xFFFF;
    element::from_bits(to, v, f, i);
    if (tf) R.f[k] = f;
    else R.i[k] = i;
  }
}

}  // namespace tilejit::runtime::interp
