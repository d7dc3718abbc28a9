// Element types of the tile IR and the exact host-side rounding rules for the narrow ones.
// Everything that converts a float to bf16/f16 (DSL constant folding, the interpreter, tests) goes through here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tilejit::ir {

// Scalar element types. fp8 kinds are listed so the type system has room for them; the DSL
// accepts them as storage types (load/store/cast) only.
enum class DType : uint8_t {
  i1, i8, i16, i32, i64, u8, u16, u32, u64,
  f16, bf16, f32, f64, f8e4m3, f8e5m2,
};

std::string_view name(DType t);
std::optional<DType> parse_dtype(std::string_view s);
int bit_width(DType t);
inline int byte_size(DType t) { return t == DType::i1 ? 1 : bit_width(t) / 8; }
bool is_float(DType t);
bool is_int(DType t);  // i1 counts as an integer (0/1)
bool is_signed(DType t);
bool is_fp8(DType t);
// An integer type every value of which is an i32 value (i1, i8, i16, i32, u8, u16): window offsets
// of these types are computed in 32 bits and may be TMA coordinates; i64, u32 and u64 are not.
inline bool fits_i32(DType t) {
  return t == DType::i1 || t == DType::i8 || t == DType::i16 || t == DType::i32 || t == DType::u8 || t == DType::u16;
}

// IEEE/bfloat narrow conversions, round-to-nearest-even. f16/bf16: overflow to infinity; NaN
// payloads are not preserved (a quiet NaN results). fp8 (e4m3 and e5m2): saturate to the largest
// finite value, infinities included, as PTX's only conversions (cvt.rn.satfinite) do; NaN -> 0x7F.
uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(uint16_t b);
uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(uint16_t b);
uint8_t f32_to_f8e4m3_bits(float x);
float f8e4m3_bits_to_f32(uint8_t b);
uint8_t f32_to_f8e5m2_bits(float x);
float f8e5m2_bits_to_f32(uint8_t b);

// Round a float to the nearest value representable in `t` (a float dtype) and return it as float.
// f64 is not narrowed by this; callers keep doubles separately.
float round_to(DType t, float x);
// The same from a double with a single rounding (round-to-odd to f32 first): for C++ literals.
double round_to(DType t, double x);

// Wrap an integer to the width and signedness of `t` (two's complement), as the GPU does.
int64_t wrap_int(DType t, int64_t v);
// A float value converted to integer dtype `t` by the README's cast rule: truncation toward zero,
// saturation at the range, NaN -> 0 (PTX cvt.rzi.sat); i1: x != 0. Unsigned results are returned
// as their bits (u64 max: -1). The interpreter's casts and the lowering's constants both use it.
int64_t float_to_int(DType t, double x);

}  // namespace tilejit::ir
