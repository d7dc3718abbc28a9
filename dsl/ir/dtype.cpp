// DType names and the exact narrow-float conversions (round-to-nearest-even).
#include "dsl/ir/dtype.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tilejit::ir {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  int bits;
};

constexpr std::array<DTypeInfo, 15> kInfo{{
    {DType::i1, "i1", 1},         {DType::i8, "i8", 8},         {DType::i16, "i16", 16},
    {DType::i32, "i32", 32},      {DType::i64, "i64", 64},      {DType::u8, "u8", 8},
    {DType::u16, "u16", 16},      {DType::u32, "u32", 32},      {DType::u64, "u64", 64},
    {DType::f16, "f16", 16},      {DType::bf16, "bf16", 16},    {DType::f32, "f32", 32},
    {DType::f64, "f64", 64},      {DType::f8e4m3, "f8e4m3", 8}, {DType::f8e5m2, "f8e5m2", 8},
}};

const DTypeInfo& info(DType t) { return kInfo.at(static_cast<size_t>(t)); }

// Encode |a| (finite, non-negative) into a small float with `mbits` mantissa bits and the given
// bias, rounding to nearest even and saturating at `max_finite` (PTX cvt.rn.satfinite).
uint8_t encode_fp8(float x, int mbits, int bias, float max_finite, uint8_t nan_bits) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return nan_bits;
  double a = std::fabs(static_cast<double>(x));
  if (a == 0) return sign;
  int ex = 0;
  std::frexp(a, &ex);
  int e = std::max(ex - 1, 1 - bias);
  double q = std::ldexp(1.0, e - mbits);
  double r = std::nearbyint(a / q) * q;
  if (r > max_finite) r = max_finite;
  if (r == 0) return sign;
  std::frexp(r, &ex);
  int e2 = ex - 1;
  if (e2 < 1 - bias) {
    auto mant = static_cast<uint32_t>(r / std::ldexp(1.0, 1 - bias - mbits));
    return static_cast<uint8_t>(sign | mant);
  }
  auto mant = static_cast<uint32_t>(r / std::ldexp(1.0, e2 - mbits)) - (1u << mbits);
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(e2 + bias) << mbits) | mant);
}

float decode_fp8(uint8_t b, int mbits, int bias, bool has_inf) {
  const int ebits = 7 - mbits;
  const uint32_t exp = (b >> mbits) & ((1u << ebits) - 1);
  const uint32_t mant = b & ((1u << mbits) - 1);
  const float sign = (b & 0x80) ? -1.f : 1.f;
  const uint32_t exp_max = (1u << ebits) - 1;
  if (has_inf && exp == exp_max) return mant ? NAN : sign * INFINITY;
  if (!has_inf && exp == exp_max && mant == (1u << mbits) - 1) return NAN;
  if (exp == 0) return sign * static_cast<float>(std::ldexp(static_cast<double>(mant), 1 - bias - mbits));
  return sign * static_cast<float>(
                    std::ldexp(static_cast<double>(mant + (1u << mbits)), static_cast<int>(exp) - bias - mbits));
}

}  // namespace

std::string_view name(DType t) { return info(t).name; }

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& i : kInfo)
    if (i.name == s) return i.type;
  return std::nullopt;
}

int bit_width(DType t) { return info(t).bits; }

bool is_float(DType t) {
  switch (t) {
    case DType::f16: case DType::bf16: case DType::f32: case DType::f64:
    case DType::f8e4m3: case DType::f8e5m2:
      return true;
    default:
      return false;
  }
}
bool is_int(DType t) { return !is_float(t); }
bool is_signed(DType t) {
  switch (t) {
    case DType::i8: case DType::i16: case DType::i32: case DType::i64:
      return true;
    default:
      return is_float(t);
  }
}
bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

uint16_t f32_to_bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x0040);  // quiet NaN, sign kept
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_f16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | (x > 0x7F800000u ? 0x7E00 : 0x7C00);
  if (x >= 0x477FF000u) return sign | 0x7C00;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                        // below 2^-14: half subnormal, unit 2^-24
    float scaled = std::bit_cast<float>(x) * 16777216.0f;  // exact: power-of-two scaling
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  x += 0xC8000FFFu + ((x >> 13) & 1u);  // rebias exponent by -112, round to nearest even
  return sign | static_cast<uint16_t>(x >> 13);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    float v = static_cast<float>(mant) / 16777216.0f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint8_t f32_to_f8e4m3_bits(float x) { return encode_fp8(x, 3, 7, 448.f, 0x7F); }
float f8e4m3_bits_to_f32(uint8_t b) { return decode_fp8(b, 3, 7, false); }
uint8_t f32_to_f8e5m2_bits(float x) { return encode_fp8(x, 2, 15, 57344.f, 0x7F); }
float f8e5m2_bits_to_f32(uint8_t b) { return decode_fp8(b, 2, 15, true); }

float round_to(DType t, float x) {
  switch (t) {
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(x));
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(x));
    case DType::f8e4m3: return f8e4m3_bits_to_f32(f32_to_f8e4m3_bits(x));
    case DType::f8e5m2: return f8e5m2_bits_to_f32(f32_to_f8e5m2_bits(x));
    case DType::f32: case DType::f64: return x;
    default: throw std::logic_error("round_to: not a float dtype");
  }
}

double round_to(DType t, double x) {
  if (t == DType::f64) return x;
  float f = static_cast<float>(x);  // round to nearest even
  if (t == DType::f32 || !std::isfinite(x) || static_cast<double>(f) == x) return round_to(t, f);
  // Round to odd: truncate toward zero, then force the last bit. With f32's 13+ spare bits,
  // rounding that to the narrow type is then exactly one correct rounding of x.
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
  return round_to(t, f);
}

int64_t float_to_int(DType t, double x) {
  if (t == DType::i1) return x != 0 ? 1 : 0;
  if (std::isnan(x)) return 0;
  double tr = std::trunc(x);
  int w = bit_width(t);
  if (is_signed(t)) {
    double lim = std::ldexp(1.0, w - 1);  // 2^(w-1): first value above the range
    if (tr >= lim) return w == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (w - 1)) - 1;
    if (tr < -lim) return w == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t{1} << (w - 1));
    return static_cast<int64_t>(tr);
  }
  if (tr <= 0) return 0;
  double lim = std::ldexp(1.0, w);
  if (tr >= lim) return w == 64 ? -1 : static_cast<int64_t>((uint64_t{1} << w) - 1);  // u64 max as its bits
  return static_cast<int64_t>(static_cast<uint64_t>(tr));
}

int64_t wrap_int(DType t, int64_t v) {
  switch (t) {
    case DType::i1: return v & 1;
    case DType::i8: return static_cast<int8_t>(v);
    case DType::i16: return static_cast<int16_t>(v);
    case DType::i32: return static_cast<int32_t>(v);
    case DType::u8: return static_cast<uint8_t>(v);
    case DType::u16: return static_cast<uint16_t>(v);
    case DType::u32: return static_cast<uint32_t>(v);
    default: return v;  // i64, u64 (u64 kept as its bit pattern)
  }
}

}  // namespace tilejit::ir
