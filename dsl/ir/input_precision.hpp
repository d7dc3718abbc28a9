// A dot's input precision (Triton's `input_precision`): how f32 inputs enter the products. The
// dot op carries it as the attribute "input_precision" only when it is not the default, so the
// tile IR (and every cache key and PTX dump) of a default dot is what it was before the option.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "dsl/ir/op.hpp"

namespace tilejit::ir {

// ieee: inputs as they are (exact products, f32 accumulation). tf32: each f32 input rounded to
// TF32 first (round_to_tf32), the products of the rounded values exact, accumulated in f32; on the
// GPU the tensor cores' mma.sync .tf32 runs it.
enum class InputPrecision : uint8_t { ieee, tf32 };

inline constexpr const char* kInputPrecisionAttr = "input_precision";

inline std::string_view name(InputPrecision p) { return p == InputPrecision::tf32 ? "tf32" : "ieee"; }

inline std::optional<InputPrecision> parse_input_precision(std::string_view s) {
  if (s == "ieee") return InputPrecision::ieee;
  if (s == "tf32") return InputPrecision::tf32;
  return std::nullopt;
}

// The precision of a dot op (absent attribute: ieee). The verifier has checked the spelling.
inline InputPrecision input_precision(const Op& dot) {
  if (!dot.has_attr(kInputPrecisionAttr)) return InputPrecision::ieee;
  return parse_input_precision(dot.str_attr(kInputPrecisionAttr)).value_or(InputPrecision::ieee);
}

// PTX cvt.rna.tf32.f32 on the bits of an f32: round to nearest with ties away from zero on the 13
// dropped mantissa bits (adding half of the dropped range to the magnitude bits carries into the
// kept ones and, past the largest finite value, into the exponent: infinity, as RNA rounds), the
// dropped bits then cleared. Infinities and NaNs are not rounded, only cleared, as the hardware
// does (the sm_80+ SASS is exactly this): a NaN keeps its sign and its high payload bits -- the
// GPU's own NaNs (0x7fffffff) stay NaNs -- and only a NaN whose payload lies wholly in the dropped
// bits would come out as an infinity. Subnormals round like normal numbers (no flush).
inline uint32_t tf32_rna_bits(uint32_t f32_bits) {
  constexpr uint32_t kExponent = 0x7f800000u, kKept = 0xffffe000u, kHalf = 0x1000u;
  if ((f32_bits & kExponent) == kExponent) return f32_bits & kKept;
  return (f32_bits + kHalf) & kKept;
}

inline float round_to_tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = tf32_rna_bits(bits);
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

}  // namespace tilejit::ir
