// dsl/math.hpp: each function in the interpreter against the C library on edge values (NaN, +-inf,
// +-0, subnormals, ties, values near 0 and near the magic 2^23), in every float dtype; and each
// lowered through both backends and assembled for sm_90a.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "ptxas_testing.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

std::vector<double> edge_values() {
  std::vector<double> v{0.0,    -0.0,   kInf,     -kInf,    kNan,    0.5,      -0.5,    1.5,    2.5,      -2.5,
                        0.49999997, 1e-8, -1e-8,   1e-30,    0x1p-140, -0x1p-140, 0x1p23,  0x1p23 + 1, 0x1p23 - 0.5, -0x1p23 + 0.5,
                        3.0e38, -3.0e38, 1e5,      -1e5,     88.0,    -88.0,    100.0,   -100.0, 0.999,    -0.999,
                        -1.0,   1.0,    -1.5,     0.1,      -0.1,    7.25,     -7.75,   1e-4,   -1e-4,    20.0};
  while (v.size() < 64) v.push_back(static_cast<double>(v.size()) * 0.37 - 9.0);
  return v;
}

// Runs y = fn(x) over the edge values in dtype d in the interpreter; returns y as doubles.
std::vector<double> run(DType d, const std::function<Tile(const Tile&)>& fn) {
  const Kernel k = kernel("math_fn", [&](Builder& b) {
    auto X = b.pointer("X", d), Y = b.pointer("Y", d);
    auto i = arange(0, 64);
    store(Y + i, fn(load(X + i)));
  });
  rt::HostTensor x(d, {64}), y(d, {64});
  const auto v = edge_values();
  for (int64_t i = 0; i < 64; ++i) x.set({i}, v[static_cast<size_t>(i)]);
  rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(y)});
  std::vector<double> out;
  for (int64_t i = 0; i < 64; ++i) out.push_back(y.get({i}));
  return out;
}

std::vector<double> inputs(DType d) {  // the edge values as the dtype holds them
  std::vector<double> out;
  for (double v : edge_values()) out.push_back(ir::round_to(d, v));
  return out;
}

bool same(double a, double b) {  // NaN equals NaN; -0 differs from +0
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

}  // namespace

TEST_CASE("math: trunc and round (ties to even) are exact, keep -0.0, pass NaN and inf, in every float dtype") {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    INFO(ir::name(d));
    const auto x = inputs(d);
    const auto t = run(d, [](const Tile& v) { return trunc(v); });
    const auto r = run(d, [](const Tile& v) { return round(v); });
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("x = " << x[i]);
      CHECK(same(t[i], ir::round_to(d, std::trunc(x[i]))));
      CHECK(same(r[i], ir::round_to(d, std::nearbyint(x[i]))));  // the host rounds ties to even
    }
  }
}

TEST_CASE("math: isnan, isinf, isfinite, signbit, clamp; sums of booleans count") {
  const Kernel k = kernel("predicates", [](Builder& b) {
    auto X = b.pointer("X", f32), Out = b.pointer("Out", i32), Cl = b.pointer("Cl", f32), Cnt = b.pointer("Cnt", i32);
    auto i = arange(0, 64);
    Tile x = load(X + i);
    store(Out + i, cast(i32, isnan(x)) + cast(i32, isinf(x)) * 2 + cast(i32, isfinite(x)) * 4 + cast(i32, signbit(x)) * 8);
    store(Cl + i, clamp(x, -1.0f, 2.0f));
    store(Cnt + arange(0, 1), broadcast_to(sum(isnan(x)), {1}));
  });
  rt::HostTensor x(f32, {64}), out(i32, {64}), cl(f32, {64}), cnt(i32, {1});
  const auto v = edge_values();
  for (int64_t i = 0; i < 64; ++i) x.set({i}, v[static_cast<size_t>(i)]);
  rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(out), rt::Arg(cl), rt::Arg(cnt)});
  int nans = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double xi = x.get({i});
    INFO("x = " << xi);
    const int want = int(std::isnan(xi)) + 2 * int(std::isinf(xi)) + 4 * int(std::isfinite(xi)) + 8 * int(std::signbit(xi));
    CHECK(out.get({i}) == want);
    CHECK(same(cl.get({i}), std::isnan(xi) ? kNan : std::min(std::max(xi, -1.0), 2.0)));
    nans += std::isnan(xi);
  }
  CHECK(nans == 1);
  CHECK(cnt.get({0}) == nans);
}

// Small integers sum in 32 bits (Triton's rule, as cumsum accumulates): 64 x 100 does not wrap.
TEST_CASE("math: sums of i8 / i16 / u8 / u16 tiles count in i32 / u32") {
  for (DType d : {DType::i8, DType::i16, DType::u8, DType::u16}) {
    INFO(ir::name(d));
    const DType want_type = ir::is_signed(d) ? DType::i32 : DType::u32;
    const Kernel k = kernel("small_sums", [&](Builder& b) {
      auto X = b.pointer("X", d), Out = b.pointer("Out", want_type), Rows = b.pointer("Rows", want_type);
      Tile x = load(X + arange(0, 64));
      Tile total = sum(x), rows = sum(reshape(x, {8, 8}), 1);
      CHECK(total.dtype() == want_type);
      CHECK(rows.dtype() == want_type);
      store(Out + arange(0, 1), broadcast_to(total, {1}));
      store(Rows + arange(0, 8), rows);
    });
    rt::HostTensor x(d, {64}), out(want_type, {1}), rows(want_type, {8});
    for (int64_t i = 0; i < 64; ++i) x.set({i}, 100);
    rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(out), rt::Arg(rows)});
    CHECK(out.get({0}) == 6400);
    for (int64_t r = 0; r < 8; ++r) CHECK(rows.get({r}) == 800);
  }
}

TEST_CASE("math: sigmoid, log1p and expm1 against the C library (approximate exp/log: relative 2^-18)") {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    INFO(ir::name(d));
    const auto x = inputs(d);
    const auto s = run(d, [](const Tile& v) { return sigmoid(v); });
    const auto l = run(d, [](const Tile& v) { return log1p(v); });
    const auto e = run(d, [](const Tile& v) { return expm1(v); });
    const double tol = d == DType::f16 ? 0x1p-10 : d == DType::bf16 ? 0x1p-7 : 0x1p-18;
    auto close = [&](double got, double want) {
      want = ir::round_to(d, want);
      if (std::isnan(want) || std::isinf(want) || want == 0) return same(got, want) || (want == 0 && got == 0);
      return std::abs(got - want) <= tol * std::abs(want) + (d == DType::f64 ? 0 : 1e-38);
    };
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("x = " << x[i] << " sigmoid " << s[i] << " log1p " << l[i] << " expm1 " << e[i]);
      CHECK(close(s[i], 1.0 / (1.0 + std::exp(-x[i]))));
      CHECK(close(l[i], std::log1p(x[i])));
      CHECK(close(e[i], std::expm1(x[i])));
    }
  }
}

// PyTorch's rules, computed here on the host: the first index of the extreme; a NaN is the extreme.
int64_t host_arg(const std::vector<double>& v, bool largest) {
  for (size_t k = 0; k < v.size(); ++k)
    if (std::isnan(v[k])) return static_cast<int64_t>(k);
  size_t best = 0;
  for (size_t k = 1; k < v.size(); ++k)
    if (largest ? v[k] > v[best] : v[k] < v[best]) best = k;
  return static_cast<int64_t>(best);
}

TEST_CASE("math: argmax and argmin along either axis: first index of ties, NaN first, -0 equals +0, ints") {
  for (DType d : {DType::f32, DType::bf16, DType::i32}) {
    INFO(ir::name(d));
    const int64_t R = 8, C = 16;
    rt::HostTensor x(d, {R, C}), rows_max(i32, {R}), rows_min(i32, {R}), cols_max(i32, {C}), cols_min(i32, {C});
    x.fill_uniform(7, -4, 4);
    for (int64_t c = 0; c < C; ++c) x.set({0, c}, std::round(x.get({0, c})));  // many ties in row 0
    if (ir::is_float(d)) {
      x.set({1, 5}, kNan), x.set({1, 9}, kNan);  // the first NaN wins both
      x.set({2, 3}, -0.0), x.set({2, 4}, 0.0);
      for (int64_t c = 0; c < C; ++c)
        if (c != 3 && c != 4) x.set({2, c}, -1.0 - static_cast<double>(c));  // max: the zeros, first at 3
      x.set({3, 7}, kInf), x.set({3, 8}, -kInf);
    } else {
      x.set({1, 2}, 2147483647), x.set({1, 11}, -2147483647 - 1);
    }
    const Kernel k = kernel("arg", [&](Builder& b) {
      auto X = b.pointer("X", d), RM = b.pointer("RM", i32), RN = b.pointer("RN", i32), CM = b.pointer("CM", i32),
           CN = b.pointer("CN", i32);
      Tile t = load(X + expand_dims(arange(0, R), 1) * C + expand_dims(arange(0, C), 0));
      store(RM + arange(0, R), argmax(t, 1));
      store(RN + arange(0, R), argmin(t, 1));
      store(CM + arange(0, C), argmax(t, 0));
      store(CN + arange(0, C), argmin(t, 0));
    });
    rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(rows_max), rt::Arg(rows_min), rt::Arg(cols_max), rt::Arg(cols_min)});
    for (int64_t r = 0; r < R; ++r) {
      std::vector<double> row;
      for (int64_t c = 0; c < C; ++c) row.push_back(x.get({r, c}));
      CHECK_MESSAGE(rows_max.get({r}) == host_arg(row, true), "row " << r);
      CHECK_MESSAGE(rows_min.get({r}) == host_arg(row, false), "row " << r);
    }
    for (int64_t c = 0; c < C; ++c) {
      std::vector<double> col;
      for (int64_t r = 0; r < R; ++r) col.push_back(x.get({r, c}));
      CHECK_MESSAGE(cols_max.get({c}) == host_arg(col, true), "col " << c);
      CHECK_MESSAGE(cols_min.get({c}) == host_arg(col, false), "col " << c);
    }
    if (ir::is_float(d)) {
      CHECK(rows_max.get({1}) == 5);
      CHECK(rows_max.get({2}) == 3);
      CHECK(rows_max.get({3}) == 7);
      CHECK(rows_min.get({3}) == 8);
    }
  }
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { argmax(arange(0, 16), 1); }).build(),
                    doctest::Contains("argmax: axis 1 is out of range for a rank-1 tile (valid: 0 to 0)"));
}

TEST_CASE("math: every function lowers through both backends and assembles for sm_90a") {
  if (testing::no_ptxas()) return;
  for (DType d : {DType::f32, DType::bf16}) {
    const Kernel k = kernel("math_all", [d](Builder& b) {
      auto X = b.pointer("X", d), Y = b.pointer("Y", d), P = b.pointer("P", i32);
      auto i = arange(0, 128);
      Tile x = load(X + i);
      Tile y = trunc(x) + round(x) + sigmoid(x) + log1p(x) + expm1(x) + clamp(x, -1.0f, 1.0f);
      store(Y + i, y);
      store(P + i, cast(i32, isnan(x)) + cast(i32, isinf(x)) + cast(i32, isfinite(x)) + cast(i32, signbit(x)) +
                       broadcast_to(sum(isnan(x)), {128}));
      Tile m = reshape(x, {8, 16});  // argmax / argmin along both axes
      store(P + 128 + arange(0, 8), argmax(m, 1) + argmin(m, 1));
      store(P + 136 + arange(0, 16), argmax(m, 0) + argmin(m, 0));
    });
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(ir::name(d) << " " << jit::to_string(be));
      testing::assemble_sm90a(k.build(), be, 4);
    }
  }
}

TEST_CASE("math: histogram counts each bin, skips values outside, any integer dtype and shape") {
  const Kernel k = kernel("histogram_case", [](Builder& b) {
    auto X = b.pointer("X", i32), U = b.pointer("U", u8), H = b.pointer("H", i32), G = b.pointer("G", i32);
    auto V = b.pointer("V", u32), L = b.pointer("L", i64), HV = b.pointer("HV", i32), HL = b.pointer("HL", i32);
    Tile i = arange(0, 256);
    store(H + arange(0, 16), histogram(load(X + i), 16));
    store(G + arange(0, 64), histogram(reshape(load(U + i), {16, 16}), 64));
    // u32 above 2^31 (compared in i32: negative, on no bin) and i64 past 2^32 (compared in i64)
    store(HV + arange(0, 8), histogram(load(V + arange(0, 8)), 8));
    store(HL + arange(0, 8), histogram(load(L + arange(0, 8)), 8));
  });
  rt::HostTensor vu(u32, {8}), l(i64, {8}), hv(i32, {8}), hl(i32, {8});
  const double v_values[] = {4294967295.0, 2147483651.0, 3, 3, 7, 0, 2147483648.0, 5};
  const double l_values[] = {4294967299.0, -4294967293.0, 3, 1, 7, 0, 9223372036854775807.0, 5};
  for (int64_t j = 0; j < 8; ++j) vu.set({j}, v_values[j]), l.set({j}, l_values[j]);
  rt::HostTensor x(i32, {256}), u(u8, {256}), h(i32, {16}), g(i32, {64});
  x.fill_uniform(5, -4, 20);  // some below 0 and some past the last bin
  x.set({0}, -2147483648.0);
  u.fill_uniform(6, 0, 255);
  rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(u), rt::Arg(h), rt::Arg(g), rt::Arg(vu), rt::Arg(l), rt::Arg(hv), rt::Arg(hl)});
  const std::vector<double> want_v{1, 0, 0, 2, 0, 1, 0, 1}, want_l{1, 1, 0, 1, 0, 1, 0, 1};
  CHECK(hv.to_f64() == want_v);
  CHECK(hl.to_f64() == want_l);
  std::vector<double> hx(16, 0), hu(64, 0);
  for (int64_t j = 0; j < 256; ++j) {
    const auto v = static_cast<int64_t>(x.get({j})), w = static_cast<int64_t>(u.get({j}));
    if (v >= 0 && v < 16) ++hx[static_cast<size_t>(v)];
    if (w < 64) ++hu[static_cast<size_t>(w)];
  }
  double counted = 0;
  for (int64_t bin = 0; bin < 16; ++bin) {
    CHECK(h.get({bin}) == hx[static_cast<size_t>(bin)]);
    counted += hx[static_cast<size_t>(bin)];
  }
  for (int64_t bin = 0; bin < 64; ++bin) CHECK(g.get({bin}) == hu[static_cast<size_t>(bin)]);
  CHECK(counted > 100);
  CHECK(counted < 256);
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { histogram(arange(0, 16), 10); }).build(),
                    doctest::Contains("histogram: num_bins = 10 (valid: a power of two from 1 to 16384)"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { histogram(cast(f32, arange(0, 16)), 16); }).build(),
                    doctest::Contains("histogram: needs an integer tile, got f32[16]"));
  if (testing::no_ptxas()) return;
  for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(be));
    testing::assemble_sm90a(k.build(), be, 4);
  }
}
