// Every build-time error of the DSL: the message names the kernel, the C++ source line of the
// offending expression, and what is wrong.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "dsl/lang.hpp"

using namespace tilejit::lang;

namespace {

// Build `body` as kernel "bad"; require a BuildError whose message contains each phrase and,
// when line > 0, "test_dsl_errors.cpp:<line>".
void expect_error(const Kernel::Body& body, std::vector<std::string> phrases, int line, const Meta& meta = {}) {
  try {
    kernel("bad", body).build(meta);
    FAIL("expected a BuildError");
  } catch (const BuildError& e) {
    std::string msg = e.what();
    CHECK_MESSAGE(msg.find("kernel 'bad'") != std::string::npos, msg);
    if (line > 0) CHECK_MESSAGE(msg.find(fmt::format("test_dsl_errors.cpp:{}", line)) != std::string::npos, msg);
    for (const auto& p : phrases) CHECK_MESSAGE(msg.find(p) != std::string::npos, "missing '" << p << "' in: " << msg);
  }
}

}  // namespace

TEST_CASE("shape mismatch in broadcast names both shapes and the dim") {
  int line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        auto X = k.pointer("X", f32);
        auto t = load(X + arange(0, 32)) + load(X + arange(0, 16));
        store(X + arange(0, 32), t);
      },
      {"shape mismatch in broadcast", "[32] vs [16]", "dim 0"}, line);
}

TEST_CASE("dot with incompatible inner dimensions") {
  int line = __LINE__ + 5;
  expect_error(
      [](Builder& k) {
        auto a = zeros(bf16, {64, 32});
        auto b = zeros(bf16, {16, 64});
        auto c = dot(a, b);
        (void)c;
        (void)k;
      },
      {"dot: inner dimensions differ", "bf16[64,32]", "bf16[16,64]"}, line);
}

TEST_CASE("batched and tf32 dots: ranks, batch sizes, the accumulator's shape and tf32's dtype name the problem") {
  int line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(bf16, {2, 16, 16}), zeros(bf16, {16, 16}));
        (void)t;
      },
      {"dot: a is bf16[2,16,16] (3-D) but b is bf16[16,16] (2-D)", "both 3-D for a batched dot"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(f32, {2, 16, 8}), zeros(f32, {4, 8, 16}));
        (void)t;
      },
      {"dot: batch sizes differ", "a is f32[2,16,8] (B = 2)", "b is f32[4,8,16] (B = 4)", "equal leading dimensions"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(f32, {2, 2, 16, 16}), zeros(f32, {2, 2, 16, 16}));
        (void)t;
      },
      {"dot: operands must be 2-D tiles (a[M,K] @ b[K,N]) or 3-D tiles (a[B,M,K] @ b[B,K,N], batched)", "a f32[2,2,16,16]"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(f32, {2, 16, 8}), zeros(f32, {2, 16, 8}));
        (void)t;
      },
      {"dot: inner dimensions differ", "a is f32[2,16,8] (K = 8)", "b is f32[2,16,8] (K = 16)"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(f32, {2, 16, 8}), zeros(f32, {2, 8, 16}), zeros(f32, {4, 16, 16}));
        (void)t;
      },
      {"dot: the accumulator f32[4,16,16] does not broadcast to the product's shape [2,16,16]", "valid: f32[2,16,16]"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(bf16, {16, 16}), zeros(bf16, {16, 16}), {.input_precision = InputPrecision::tf32});
        (void)t;
      },
      {"dot: input_precision tf32 rounds f32 inputs, but a and b are bf16", "valid: f32 inputs with tf32"}, line);
  // a [M,N] accumulator broadcasts over the batch
  CHECK_NOTHROW(kernel("ok", [](Builder&) {
                  auto t = dot(zeros(f32, {2, 16, 8}), zeros(f32, {2, 8, 16}), zeros(f32, {16, 16}), {.input_precision = InputPrecision::tf32});
                  (void)t;
                }).build());
}

TEST_CASE("dtype mismatch: f16 with bf16, dot operands, fp8 arithmetic") {
  int line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = zeros(f16, {8}) + zeros(bf16, {8});
        (void)t;
      },
      {"dtype mismatch", "f16 vs bf16", "cast"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = dot(zeros(f16, {16, 16}), zeros(bf16, {16, 16}));
        (void)t;
      },
      {"dot: dtype mismatch"}, line);
  line = __LINE__ + 3;
  expect_error(
      [](Builder&) {
        auto t = zeros(f8e4m3, {8}) * 2;
        (void)t;
      },
      {"storage type"}, line);
}

TEST_CASE("store of a value to a pointer of another type") {
  int line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        auto Out = k.pointer("Out", f32);
        store(Out + arange(0, 16), zeros(bf16, {16}));
      },
      {"store", "bf16[16]", "points to f32", "cast(f32, value)"}, line);
  line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        auto T = k.tensor("T", f16, 2);
        store(T.block({0, 0}, {16, 16}), zeros(f32, {16, 16}));
      },
      {"store", "f32[16,16]", "points to f16"}, line);
}

TEST_CASE("meta-parameters: unknown name, wrong kind, missing value, declared twice") {
  expect_error([](Builder& k) { (void)k.meta<int>("BLOCK", 16); }, {"no meta-parameter named BLOK", "declared: BLOCK"}, 0,
               {{"BLOK", 32}});
  // a value given twice (a caller's list with a meta its defaults also set): named as such, not "no meta named"
  expect_error([](Builder& k) { (void)k.meta<int>("BLOCK", 16); }, {"meta-parameter BLOCK given more than once"}, 0,
               {{"BLOCK", 32}, {"BLOCK", 64}});
  int line = __LINE__ + 1;
  expect_error([](Builder& k) { (void)k.meta<int>("BLOCK", 16); }, {"'BLOCK' is an int", "a bool"}, line, {{"BLOCK", true}});
  line = __LINE__ + 1;
  expect_error([](Builder& k) { (void)k.meta<int>("BLOCK"); }, {"'BLOCK'", "no default"}, line);
  line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        (void)k.meta<int>("BLOCK", 1);
        (void)k.meta<int>("BLOCK", 2);
      },
      {"declared twice"}, line);
}

TEST_CASE("parameters: duplicate name, invalid name, bad alignment") {
  int line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        k.pointer("X", f32);
        k.pointer("X", f16);
      },
      {"parameter 'X' is declared twice"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder& k) { k.scalar("n-1", i32); }, {"not an identifier"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder& k) { k.pointer("X", f32, {.align_bytes = 12}); }, {"power of two"}, line);
}

TEST_CASE("operations on the wrong kind of value") {
  int line = __LINE__ + 1;
  expect_error([](Builder&) { (void)exp(arange(0, 8)); }, {"exp", "floating-point", "i32[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)where(arange(0, 8), 1.0f, 0.0f); }, {"where", "boolean", "i32[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)load(arange(0, 8)); }, {"load", "pointer", "i32[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)sum(zeros(f32, {4, 4}), 2); }, {"axis 2 is out of range", "f32[4,4]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)(arange(0, 8) + (int64_t{1} << 40)); }, {"does not fit in i32"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder& k) { (void)(k.pointer("P", f32) * 2); }, {"not defined on pointers"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)reshape(zeros(f32, {4, 4}), {3, 5}); }, {"element count differs"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)(arange(0, 8) << 1.5f); }, {"shl", "1.5 is not an integer"}, line);
  (void)line;
}

TEST_CASE("fma takes f32 or f64 tiles of one dtype") {
  int line = __LINE__ + 1;
  expect_error([](Builder&) { (void)fma(zeros(bf16, {8}), 1.0f, 0.0f); }, {"fma", "operand 'a'", "f32 or f64", "bf16[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)fma(zeros(f32, {8}), zeros(f64, {8}), 0.0f); }, {"fma", "mix f32 and f64"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)fma(zeros(f32, {8}), zeros(f32, {4}), 0.0f); }, {"fma", "shape mismatch"}, line);
}

TEST_CASE("byte_perm takes 32-bit integer words: each operand's dtype is checked by name") {
  int line = __LINE__ + 1;
  expect_error([](Builder&) { (void)byte_perm(zeros(f32, {8}), 0, 0x3210); }, {"byte_perm", "operand 'a'", "u32 or i32", "f32[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)byte_perm(zeros(u32, {8}), zeros(u8, {8}), 0x3210); }, {"byte_perm", "operand 'b'", "u8[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)byte_perm(zeros(u32, {8}), 0, zeros(i64, {8})); }, {"byte_perm", "operand 'selector'", "i64[8]"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)byte_perm(zeros(u32, {8}), 0.5f, 0x3210); }, {"byte_perm", "operand 'b'", "floating-point"}, line);
  line = __LINE__ + 1;
  expect_error([](Builder&) { (void)byte_perm(zeros(u32, {8}), zeros(u32, {4}), 0); }, {"byte_perm", "shape mismatch"}, line);
  (void)line;
}

TEST_CASE("tensor windows: wrong number of offsets, shape longer than the rank") {
  int line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        auto Q = k.tensor("Q", bf16, 4);
        (void)load(Q.block({0, 0, 0}, {64, 64}));
      },
      {"needs 4 offsets", "got 3"}, line);
  line = __LINE__ + 4;
  expect_error(
      [](Builder& k) {
        auto Q = k.tensor("Q", bf16, 2);
        (void)load(Q.block({0, 0}, {2, 64, 64}));
      },
      {"must have 1..2 dims"}, line);
}

TEST_CASE("a DSL operation outside a kernel body is an error, not a crash") {
  CHECK_THROWS_AS((void)arange(0, 8), BuildError);
  try {
    (void)zeros(f32, {4});
  } catch (const BuildError& e) {
    CHECK(std::string(e.what()).find("outside a kernel body") != std::string::npos);
  }
}
