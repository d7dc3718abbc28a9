// DType properties and the exact narrow-float conversions (bf16, f16, fp8) every layer relies on.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <random>

#include "dsl/ir/dtype.hpp"
#include "dsl/ir/sha256.hpp"

using namespace tilejit::ir;

TEST_CASE("dtype names round-trip and widths are right") {
  for (DType d : {DType::i1, DType::i8, DType::i32, DType::u32, DType::i64, DType::f16, DType::bf16, DType::f32,
                  DType::f8e4m3, DType::f8e5m2}) {
    auto parsed = parse_dtype(name(d));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == d);
  }
  CHECK_FALSE(parse_dtype("float").has_value());
  CHECK(bit_width(DType::bf16) == 16);
  CHECK(byte_size(DType::i1) == 1);
  CHECK(byte_size(DType::f8e4m3) == 1);
  CHECK(is_float(DType::bf16));
  CHECK(is_int(DType::u32));
  CHECK_FALSE(is_signed(DType::u32));
  CHECK(is_signed(DType::i64));
}

// Reference RNE rounding to a float format with `mbits` explicit mantissa bits and minimum normal
// exponent `emin`, computed in double from first principles.
static double rne_reference(double x, int mbits, int emin) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = std::ilogb(x);
  if (e < emin) e = emin;
  double q = std::ldexp(1.0, e - mbits);
  return std::nearbyint(x / q) * q;
}

TEST_CASE("f32 -> bf16 rounds to nearest even, matching a first-principles reference") {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1000.f, 1000.f);
  for (int i = 0; i < 100000; ++i) {
    float x = u(rng) * std::ldexp(1.f, static_cast<int>(rng() % 40) - 20);
    CHECK_MESSAGE(round_to(DType::bf16, x) == static_cast<float>(rne_reference(x, 7, -126)), x);
  }
  // exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 -> even (1); 1 + 3*2^-8 -> 1 + 2^-6
  CHECK(round_to(DType::bf16, 1.f + std::ldexp(1.f, -8)) == 1.f);
  CHECK(round_to(DType::bf16, 1.f + 3 * std::ldexp(1.f, -8)) == 1.f + std::ldexp(1.f, -6));
  CHECK(std::isnan(round_to(DType::bf16, NAN)));
  CHECK(round_to(DType::bf16, INFINITY) == INFINITY);
  CHECK(f32_to_bf16_bits(-0.f) == 0x8000);
}

TEST_CASE("f32 -> f16 rounds to nearest even, with subnormals and overflow to infinity") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int i = 0; i < 100000; ++i) {
    float x = u(rng) * std::ldexp(1.f, static_cast<int>(rng() % 40) - 26);  // spans subnormals to 2^14
    CHECK_MESSAGE(round_to(DType::f16, x) == static_cast<float>(rne_reference(x, 10, -14)), x);
  }
  CHECK(round_to(DType::f16, 65504.f) == 65504.f);
  CHECK(round_to(DType::f16, 65519.f) == 65504.f);
  CHECK(round_to(DType::f16, 65520.f) == INFINITY);
  CHECK(round_to(DType::f16, std::ldexp(1.f, -25)) == 0.f);                      // tie to even (0)
  CHECK(round_to(DType::f16, std::ldexp(3.f, -25)) == std::ldexp(1.f, -23));      // tie to even (2 units)
  CHECK(f16_bits_to_f32(0x3C00) == 1.f);
  CHECK(f16_bits_to_f32(0x0001) == std::ldexp(1.f, -24));
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every finite f16 survives a round trip
    auto h = static_cast<uint16_t>(b);
    float f = f16_bits_to_f32(h);
    if (std::isfinite(f)) CHECK(f32_to_f16_bits(f) == h);
  }
}

TEST_CASE("fp8 e4m3 and e5m2 round to nearest even and saturate") {
  CHECK(round_to(DType::f8e4m3, 448.f) == 448.f);
  CHECK(round_to(DType::f8e4m3, 1000.f) == 448.f);  // satfinite
  CHECK(round_to(DType::f8e5m2, 1e6f) == 57344.f);
  CHECK(round_to(DType::f8e4m3, 1.0625f) == 1.f);     // halfway between 1 and 1.125 -> even
  CHECK(round_to(DType::f8e4m3, 1.1875f) == 1.25f);   // halfway between 1.125 and 1.25 -> even
  CHECK(std::isnan(f8e4m3_bits_to_f32(0x7F)));
  for (uint32_t b = 0; b < 256; ++b) {
    float f = f8e4m3_bits_to_f32(static_cast<uint8_t>(b));
    if (!std::isnan(f)) CHECK(f32_to_f8e4m3_bits(f) == b);
    float g = f8e5m2_bits_to_f32(static_cast<uint8_t>(b));
    if (std::isfinite(g)) CHECK(f32_to_f8e5m2_bits(g) == b);
  }
}

TEST_CASE("integer wrap-around follows two's complement at each width") {
  CHECK(wrap_int(DType::i32, int64_t{1} << 31) == INT32_MIN);
  CHECK(wrap_int(DType::u32, -1) == 0xFFFFFFFFll);
  CHECK(wrap_int(DType::i8, 200) == -56);
  CHECK(wrap_int(DType::u16, 70000) == 70000 - 65536);
}

TEST_CASE("sha256 matches the FIPS 180-4 test vectors") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("rounding a double to a narrow type rounds once (no double rounding through f32)") {
  // 1 + 2^-11 + 2^-40 lies just above the f16 tie 1 + 2^-11: the correct result is 1 + 2^-10;
  // rounding to f32 first would land exactly on the tie and round to even (1.0).
  double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(round_to(DType::f16, x) == 1.0 + std::ldexp(1.0, -10));
  CHECK(round_to(DType::bf16, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)) == 1.0 + std::ldexp(1.0, -7));
  CHECK(round_to(DType::f32, 0.1) == static_cast<double>(0.1f));
  CHECK(round_to(DType::f64, 0.1) == 0.1);
  CHECK(round_to(DType::bf16, 3.0) == 3.0);
}
