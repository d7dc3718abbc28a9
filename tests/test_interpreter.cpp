// The interpreter as a launcher: argument and grid checking against the kernel's parameters and
// ParamSpecs, run-time faults reported as InterpretErrors with the kernel, source line, program and
// element, IR verification before running, determinism, and untouched outputs keeping their poison.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"
#include "host_bits.hpp"

using namespace tilejit::lang;
namespace ir = tilejit::ir;
namespace rt = tilejit::runtime;
using rt::HostTensor;
using rt::InterpretError;

namespace {

// The InterpretError message of running `f` (fails the test if it runs cleanly).
std::string interpret_error(const ir::Function& f, rt::Grid grid, const std::vector<rt::Arg>& args) {
  try {
    rt::interpret(f, grid, args);
  } catch (const InterpretError& e) {
    return e.what();
  }
  FAIL("kernel '" << f.name << "' ran, but an InterpretError was expected");
  return {};
}

using ::testing::contains;
std::string here(int line) { return fmt::format("test_interpreter.cpp:{}", line); }

bool all_poison(const HostTensor& t, size_t from_byte, size_t to_byte) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return std::all_of(p + from_byte, p + to_byte, [](unsigned char c) { return c == 0xFF; });
}

// out[i] = x[i] * s for n elements: a pointer, a tensor and two scalars to pass arguments to.
ir::Function scale_kernel(ParamSpec x_spec = {}, ParamSpec t_spec = {}) {
  return kernel("scale", [=](Builder& k) {
    auto X = k.pointer("X", f32, x_spec);
    auto T = k.tensor("T", f32, 2, t_spec);
    auto s = k.scalar<float>("s");
    auto n = k.scalar<int>("n");
    auto offs = arange(0, 16);
    auto mask = offs < n;
    store(T.ptr() + offs, load(X + offs, mask) * s, mask);
  }).build();
}

}  // namespace

// ======================================================================= launch checks

TEST_CASE("by default the interpreter refuses what the GPU backends refuse: tile dims that are not powers of two") {
  // issue 26, item 5: a kernel that passed on the CPU failed at compile time
  const ir::Function fn = kernel("odd_tile", [](Builder& b) {
    auto X = b.pointer("X", f32), Y = b.pointer("Y", f32);
    auto i = arange(0, 96);
    store(Y + i, load(X + i) * 2.0f);
  }).build();
  HostTensor x(f32, {96}), y(f32, {96});
  x.fill_uniform(3, -1, 1);
  const std::string msg = interpret_error(fn, {1}, {x, y});
  INFO(msg);
  CHECK(contains(msg, "kernel 'odd_tile': arange at "));
  CHECK(contains(msg, here(__LINE__ - 8)));
  CHECK(contains(msg, "tile dimensions must be powers of two for the GPU backend, got i32[96]"));
  rt::interpret(fn, {1}, {x, y}, {.gpu_rules = false});  // on request, the CPU runs it anyway
  for (int64_t i = 0; i < 96; ++i) CHECK(y.get({i}) == 2.0 * x.get({i}));
}

TEST_CASE("gpu_rules: a grid the GPU cannot launch (y or z above 65535) is refused, as the launcher does") {
  const ir::Function fn = kernel("tall_grid", [](Builder& b) {
    auto Y = b.pointer("Y", i32);
    store(Y + program_id(1), program_id(1));
  }).build();
  HostTensor y(i32, {65536});
  const std::string msg = interpret_error(fn, {1, 65536, 1}, {y});
  INFO(msg);
  CHECK(contains(msg, "kernel 'tall_grid': grid (1,65536,1) cannot launch on the GPU: y and z must be in [1, 65535]"));
  CHECK(contains(interpret_error(fn, {1, 1, 70000}, {y}), "grid (1,1,70000) cannot launch on the GPU"));
  rt::interpret(fn, {1, 65536, 1}, {y}, {.gpu_rules = false});  // the CPU runs it on request
  CHECK(y.get({65535}) == 65535);
  CHECK(y.get({1234}) == 1234);
}

TEST_CASE("a wrong number of arguments names the kernel, the parameters and the count") {
  auto fn = scale_kernel();
  HostTensor x(f32, {16}), t(f32, {4, 4});
  std::string msg = interpret_error(fn, {1}, {x, t, 2.0f});
  INFO(msg);
  CHECK(contains(msg, "kernel 'scale'"));
  CHECK(contains(msg, "takes 4 arguments (X, T, s, n), got 3"));
  CHECK_THROWS_AS(rt::interpret(fn, {1}, {x, t, 2.0f, 16, 1}), InterpretError);
}

TEST_CASE("a buffer for a scalar and a scalar for a pointer are rejected, naming the argument") {
  auto fn = scale_kernel();
  HostTensor x(f32, {16}), t(f32, {4, 4});
  x.fill_uniform(1, -1, 1);
  std::string msg = interpret_error(fn, {1}, {x, t, 2.0f, x});
  INFO(msg);
  CHECK(contains(msg, "kernel 'scale'"));
  CHECK(contains(msg, "argument 3 'n'"));
  CHECK(contains(msg, "the buffer f32[16]"));
  CHECK(contains(msg, "scalar i32"));

  std::string msg2 = interpret_error(fn, {1}, {5, t, 2.0f, 16});
  INFO(msg2);
  CHECK(contains(msg2, "argument 0 'X'"));
  CHECK(contains(msg2, "the integer 5"));
  CHECK(contains(msg2, "ptr<f32>"));

  std::string msg3 = interpret_error(fn, {1}, {x, 1.5, 2.0f, 16});
  INFO(msg3);
  CHECK(contains(msg3, "argument 1 'T'"));
  CHECK(contains(msg3, "tensor<f32,2>"));
}

TEST_CASE("a buffer of the wrong dtype or a tensor of the wrong rank is rejected") {
  auto fn = scale_kernel();
  HostTensor x(f32, {16}), xb(bf16, {16}), t(f32, {4, 4}), t3(f32, {2, 2, 4}), t1(f32, {16});
  std::string msg = interpret_error(fn, {1}, {xb, t, 2.0f, 16});
  INFO(msg);
  CHECK(contains(msg, "argument 0 'X'"));
  CHECK(contains(msg, "holds bf16"));
  CHECK(contains(msg, "ptr<f32>"));

  for (HostTensor* wrong : {&t3, &t1}) {
    std::string m = interpret_error(fn, {1}, {x, *wrong, 2.0f, 16});
    INFO(m);
    CHECK(contains(m, "argument 1 'T'"));
    CHECK(contains(m, fmt::format("has rank {}", wrong->rank())));
    CHECK(contains(m, "tensor<f32,2>"));
  }
  // A pointer parameter takes a buffer of any rank: it is only a base address.
  HostTensor x2(f32, {4, 4});
  x2.fill_uniform(2, -1, 1);
  CHECK_NOTHROW(rt::interpret(fn, {1}, {x2, t, 2.0f, 16}));
  CHECK(t.get({3, 3}) == static_cast<float>(x2.get({3, 3}) * 2.0));
}

TEST_CASE("scalar arguments are range- and kind-checked: i32 out of range, float for int, bool for int") {
  auto fn = scale_kernel();
  HostTensor x(f32, {16}), t(f32, {4, 4});
  x.fill_uniform(3, -1, 1);
  for (int64_t bad : {int64_t{1} << 31, -(int64_t{1} << 31) - 1, int64_t{1} << 40}) {
    std::string msg = interpret_error(fn, {1}, {x, t, 2.0f, bad});
    INFO(msg);
    CHECK(contains(msg, "argument 3 'n'"));
    CHECK(contains(msg, fmt::format("{}", bad)));
    CHECK(contains(msg, "-2147483648 to 2147483647"));
  }
  CHECK_THROWS_AS(rt::interpret(fn, {1}, {x, t, 2.0f, uint64_t{1} << 31}), InterpretError);
  CHECK_THROWS_WITH_AS(rt::interpret(fn, {1}, {x, t, 2.0f, 16.0}), doctest::Contains("pass an integer"), InterpretError);
  CHECK_THROWS_AS(rt::interpret(fn, {1}, {x, t, 2.0f, true}), InterpretError);
  // The extremes of the range are accepted; an int for a float parameter converts.
  CHECK_NOTHROW(rt::interpret(fn, {1}, {x, t, 2, int64_t{INT32_MAX}}));
  CHECK(t.get({3, 3}) == static_cast<float>(x.get_flat(15) * 2.0));
  CHECK_NOTHROW(rt::interpret(fn, {1}, {x, t, 0.1, INT32_MIN}));  // n < 0: nothing is written

  auto fu = kernel("unsigned_scalar", [](Builder& k) {
    auto Out = k.pointer("Out", u32);
    store(Out, k.scalar<uint32_t>("v"));
  }).build();
  HostTensor o(u32, {1});
  CHECK_THROWS_WITH_AS(rt::interpret(fu, {1}, {o, -1}), doctest::Contains("0 to 4294967295"), InterpretError);
  rt::interpret(fu, {1}, {o, 4294967295u});
  CHECK(o.get_flat(0) == 4294967295.0);
}

TEST_CASE("ParamSpec: align_bytes is checked against the base address, contiguous_last against the innermost stride") {
  HostTensor x(f32, {16}), t(f32, {4, 4});
  x.fill_uniform(4, -1, 1);
  // HostTensor allocations are 256-byte aligned, which satisfies 16.
  CHECK_NOTHROW(rt::interpret(scale_kernel({.align_bytes = 16}), {1}, {x, t, 2.0f, 16}));

  // 512 is stricter than HostTensor's alignment: find an allocation that is 256 but not 512 aligned.
  std::vector<std::unique_ptr<HostTensor>> keep;
  HostTensor* odd = nullptr;
  for (int i = 0; i < 32 && !odd; ++i) {
    keep.push_back(std::make_unique<HostTensor>(f32, ir::Shape{16}));
    if (reinterpret_cast<uintptr_t>(keep.back()->data()) % 512 != 0) odd = keep.back().get();
  }
  REQUIRE(odd != nullptr);
  odd->fill(1.0);
  std::string msg = interpret_error(scale_kernel({.align_bytes = 512}), {1}, {*odd, t, 2.0f, 16});
  INFO(msg);
  CHECK(contains(msg, "argument 0 'X'"));
  CHECK(contains(msg, "not a multiple of 512"));

  auto contiguous = scale_kernel({}, {.contiguous_last = true});
  HostTensor strided(f32, {4, 4}, {8, 2});
  std::string msg2 = interpret_error(contiguous, {1}, {x, strided, 2.0f, 16});
  INFO(msg2);
  CHECK(contains(msg2, "argument 1 'T'"));
  CHECK(contains(msg2, "innermost stride 2"));
  HostTensor padded_rows(f32, {4, 4}, {8, 1});  // row gaps are fine: only the innermost stride matters
  CHECK_NOTHROW(rt::interpret(contiguous, {1}, {x, padded_rows, 2.0f, 16}));
}

TEST_CASE("a grid with a zero or negative dimension is rejected") {
  auto fn = scale_kernel();
  HostTensor x(f32, {16}), t(f32, {4, 4});
  for (rt::Grid g : {rt::Grid{0, 1, 1}, rt::Grid{1, -1, 1}, rt::Grid{1, 1, 0}}) {
    std::string msg = interpret_error(fn, g, {x, t, 2.0f, 16});
    INFO(msg);
    CHECK(contains(msg, "kernel 'scale'"));
    CHECK(contains(msg, "grid"));
  }
}

TEST_CASE("Arg::describe names the kind and value for error messages") {
  HostTensor t(bf16, {4, 8});
  CHECK(rt::Arg(t).describe() == "the buffer bf16[4,8]");
  CHECK(rt::Arg(5).describe() == "the integer 5");
  CHECK(rt::Arg(2.5).describe() == "the float 2.5");
  CHECK(rt::Arg(true).describe() == "the bool true");
  CHECK(rt::Arg(size_t{7}).kind() == rt::Arg::Kind::UInt);
}

TEST_CASE("malformed IR is rejected by the verifier before anything runs") {
  auto fn = scale_kernel();
  HostTensor x(f32, {16}), t(f32, {4, 4});
  // Drop the first op of the body: its result is then used without a definition.
  REQUIRE(!fn.body.ops.empty());
  fn.body.ops.erase(fn.body.ops.begin());
  CHECK_THROWS_AS(rt::interpret(fn, {1}, {x, t, 2.0f, 16}), ir::VerifyError);
  CHECK(all_poison(t, 0, t.bytes()));
}

// ======================================================================= run-time faults

TEST_CASE("an unmasked out-of-bounds load is an InterpretError naming the kernel, line, program and element") {
  int line = 0;
  auto fn = kernel("oob_load", [&](Builder& k) {
    auto X = k.pointer("X", f32), Out = k.pointer("Out", f32);
    auto offs = program_id(0) * 8 + arange(0, 8);
    line = __LINE__ + 1;
    auto v = load(X + offs);
    store(Out + offs, v);
  }).build();
  HostTensor x(f32, {10}), out(f32, {16});
  x.fill_uniform(5, -1, 1);
  std::string msg = interpret_error(fn, {2}, {x, out});
  INFO(msg);
  CHECK(contains(msg, "kernel 'oob_load'"));
  CHECK(contains(msg, here(line)));
  CHECK(contains(msg, "program (1,0,0)"));   // program 0 is in bounds
  CHECK(contains(msg, "tile element [2]"));  // the first element past X[9]
  CHECK(contains(msg, "argument 0 'X'"));
  CHECK(contains(msg, "past the end"));
}

TEST_CASE("an unmasked out-of-bounds store, past the end or before the start, is an InterpretError") {
  int line = 0;
  auto fn = kernel("oob_store", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    auto shift = k.scalar<int>("shift");
    auto offs = arange(0, 8) + shift;
    line = __LINE__ + 1;
    store(Out + offs, offs);
  }).build();
  HostTensor out(i32, {8});
  for (int shift : {1, -3}) {
    std::string msg = interpret_error(fn, {1}, {out, shift});
    INFO(msg);
    CHECK(contains(msg, "kernel 'oob_store'"));
    CHECK(contains(msg, here(line)));
    CHECK(contains(msg, "writes"));
    CHECK(contains(msg, shift > 0 ? "past the end" : "before the start"));
  }
  rt::interpret(fn, {1}, {out, 0});  // and in bounds it runs
  CHECK(out.get_flat(7) == 7);
}

TEST_CASE("a non-positive runtime loop step is an InterpretError at the for_range") {
  int line = 0;
  auto fn = kernel("runtime_step", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    auto step = k.scalar<int>("step");
    Var c = zeros(i32, {});
    line = __LINE__ + 1;
    for_range(0, 10, step, [&](Tile) { c = c + 1; });
    store(Out, c);
  }).build();
  HostTensor out(i32, {1});
  for (int step : {0, -1}) {
    std::string msg = interpret_error(fn, {1}, {out, step});
    INFO(msg);
    CHECK(contains(msg, "kernel 'runtime_step'"));
    CHECK(contains(msg, here(line)));
    CHECK(contains(msg, fmt::format("step must be positive, got {}", step)));
  }
  rt::interpret(fn, {1}, {out, 3});
  CHECK(out.get_flat(0) == 4);  // 0, 3, 6, 9
}

// ======================================================================= determinism and poison

TEST_CASE("the same inputs give bit-identical outputs on every run") {
  const int64_t R = 32, C = 64;
  auto fn = kernel("mixed", [&](Builder& k) {
    auto X = k.tensor("X", bf16, 2), W = k.tensor("W", bf16, 2), Y = k.tensor("Y", f32, 2);
    auto Tot = k.pointer("Tot", f32);
    auto r0 = program_id(0) * 16;
    auto x = load(X.block({r0, 0}, {16, C}));
    auto h = dot(x, load(W.block({0, 0}, {C, 32})));  // [16, 32]
    auto e = exp(h - max(h, 1)[col]);
    auto y = e / sum(e, 1)[col];
    store(Y.block({r0, 0}, {16, 32}), y + tanh(h) * 0.25);
    atomic_add(Tot, sum(y * h));
  }).build();
  HostTensor x(bf16, {R, C}), w(bf16, {C, 32});
  x.fill_normal(6, 0, 1);
  w.fill_normal(7, 0, 0.2);
  std::vector<HostTensor> ys, tots;
  for (int run = 0; run < 2; ++run) {
    ys.emplace_back(f32, ir::Shape{R, 32});
    tots.emplace_back(f32, ir::Shape{1});
    tots.back().fill(0.0);
    rt::interpret(fn, {R / 16}, {x, w, ys.back(), tots.back()});
  }
  REQUIRE(ys[0].bytes() == ys[1].bytes());
  CHECK(std::memcmp(ys[0].data(), ys[1].data(), ys[0].bytes()) == 0);
  CHECK(std::memcmp(tots[0].data(), tots[1].data(), tots[0].bytes()) == 0);
  CHECK(std::isfinite(tots[0].get_flat(0)));
  auto v = ys[0].to_f64();
  CHECK(std::none_of(v.begin(), v.end(), [](double d) { return std::isnan(d); }));  // every element written
}

TEST_CASE("outputs the kernel does not write keep HostTensor's poison") {
  const int64_t n = 64;
  HostTensor x(f32, {n}), out(f32, {n}), iout(i32, {n});
  x.fill_uniform(8, -1, 1);
  rt::interpret(kernel("half", [&](Builder& k) {
    auto X = k.pointer("X", f32), Out = k.pointer("Out", f32), IOut = k.pointer("IOut", i32);
    auto offs = arange(0, n / 2);  // writes only the first half
    store(Out + offs, load(X + offs));
    store(IOut + offs, offs);
  }).build(), {1}, {x, out, iout});
  const size_t half_f = static_cast<size_t>(n / 2) * sizeof(float);
  CHECK(all_poison(out, half_f, out.bytes()));
  CHECK(all_poison(iout, half_f, iout.bytes()));
  CHECK_FALSE(all_poison(out, 0, half_f));
  CHECK(std::isnan(out.get_flat(n - 1)));  // f32 poison reads as NaN
  CHECK(iout.get_flat(n - 1) == -1);       // i32 poison reads as -1
  for (int64_t i = 0; i < n / 2; ++i) CHECK(out.get_flat(i) == x.get_flat(i));
}

TEST_CASE("issue 28: integer padding converts like a cast") {
  HostTensor u(u8, {16}), i(i8, {16}), ou(u8, {16}), oi(i8, {16});
  for (int64_t k = 0; k < 16; ++k) u.set({k}, 100 + static_cast<double>(k)), i.set({k}, -static_cast<double>(k));
  rt::interpret(test_kernels::int_padding().build(), {1}, {u, i, ou, oi, 10});  // 6 elements in range, 10 padded
  for (int64_t k = 0; k < 16; ++k) {
    CHECK(ou.get({k}) == (k < 6 ? 110.0 + static_cast<double>(k) : 0.0));
    CHECK(oi.get({k}) == (k < 6 ? -10.0 - static_cast<double>(k) : 127.0));
  }
}

TEST_CASE("issue 28: f32 atomic_add flushes subnormal inputs and results to zero, as the GPU's atom.add.f32 does") {
  HostTensor x(f32, {64}), acc(f32, {64}), old(f32, {64}), acc2(f32, {64});
  for (int64_t k = 0; k < 64; ++k) {
    x.set({k}, k % 2 ? 1e-39 : 1.0);          // subnormal / normal addends
    acc.set({k}, k % 4 < 2 ? 2e-39 : -1e-39);  // subnormal memory
    acc2.set({k}, acc.get({k}));
  }
  rt::interpret(test_kernels::atomic_subnormals().build(), {1}, {x, acc, old, acc2});
  for (int64_t k = 0; k < 64; ++k) {
    const double want = k % 2 ? 0.0 : 1.0;  // flushed memory + flushed or normal addend
    CHECK(acc.get({k}) == want);
    CHECK(acc2.get({k}) == want);
    CHECK(old.get({k}) == (k % 4 < 2 ? static_cast<double>(2e-39f) : static_cast<double>(-1e-39f)));  // the old value as stored
  }
}
