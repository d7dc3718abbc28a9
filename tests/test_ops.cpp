// Every tile op of the DSL, each built into a tiny kernel and run in the CPU interpreter on random
// inputs, compared with a float64 (or exact integer) reference computed here.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "host_bits.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"

using namespace tilejit::lang;
namespace rt = tilejit::runtime;

// These tests run tiles of any shape (7, 13, 24 ...) to test semantics on the CPU; the GPU backends
// take powers of two only, which the interpreter otherwise enforces.
static void interpret_any_shape(const tilejit::ir::Function& f, rt::Grid grid, const std::vector<rt::Arg>& args) {
  rt::interpret(f, grid, args, {.gpu_rules = false});
}
using rt::HostTensor;
using testing::raw;
using tilejit::ir::round_to;
__extension__ typedef unsigned __int128 u128;  // only for the u64 umulhi reference

namespace {

// ---- running kernels ----

void run(const std::string& name, Kernel::Body body, const std::vector<rt::Arg>& args, rt::Grid grid = {1, 1, 1}) {
  interpret_any_shape(kernel(name, std::move(body)).build(), grid, args);
}

// out[i] = f(x[i]) over one 1-D tile holding all of x.
HostTensor map1(HostTensor& x, DType out_dtype, const std::function<Tile(Tile)>& f) {
  const int64_t n = x.numel();
  HostTensor out(out_dtype, {n});
  run("map1", [&](Builder& k) {
    auto X = k.pointer("X", x.dtype());
    auto Out = k.pointer("Out", out_dtype);
    auto offs = arange(0, n);
    store(Out + offs, f(load(X + offs)));
  }, {x, out});
  return out;
}

// out[i] = f(x[i], y[i]) over one 1-D tile.
HostTensor map2(HostTensor& x, HostTensor& y, DType out_dtype, const std::function<Tile(Tile, Tile)>& f) {
  const int64_t n = x.numel();
  HostTensor out(out_dtype, {n});
  run("map2", [&](Builder& k) {
    auto X = k.pointer("X", x.dtype());
    auto Y = k.pointer("Y", y.dtype());
    auto Out = k.pointer("Out", out_dtype);
    auto offs = arange(0, n);
    store(Out + offs, f(load(X + offs), load(Y + offs)));
  }, {x, y, out});
  return out;
}

// out[i] = f(x[i], y[i], z[i]) over one 1-D tile.
HostTensor map3(HostTensor& x, HostTensor& y, HostTensor& z, DType out_dtype, const std::function<Tile(Tile, Tile, Tile)>& f) {
  const int64_t n = x.numel();
  HostTensor out(out_dtype, {n});
  run("map3", [&](Builder& k) {
    auto X = k.pointer("X", x.dtype()), Y = k.pointer("Y", y.dtype()), Z = k.pointer("Z", z.dtype());
    auto Out = k.pointer("Out", out_dtype);
    auto offs = arange(0, n);
    store(Out + offs, f(load(X + offs), load(Y + offs), load(Z + offs)));
  }, {x, y, z, out});
  return out;
}

// Loads a whole row-major [rows, cols] tensor as one 2-D tile (and stores one back).
Tile load2d(const Tile& ptr, int64_t rows, int64_t cols) {
  return load(ptr + arange(0, rows)[col] * cols + arange(0, cols)[row]);
}
void store2d(const Tile& ptr, const Tile& value) {
  store(ptr + arange(0, value.shape()[0])[col] * value.shape()[1] + arange(0, value.shape()[1])[row], value);
}

Tile as_i32(const Tile& cond) { return where(cond, 1, 0); }  // i1 cannot be stored: pointers to i1 are refused

// ---- host data ----

HostTensor tensor_of(DType d, const std::vector<double>& values) {
  HostTensor t(d, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set_flat(static_cast<int64_t>(i), values[i]);
  return t;
}

// Raw elements of a contiguous tensor (for 64-bit integers and bit patterns, which doubles cannot hold).
template <class T>
void set_raw(HostTensor& t, int64_t i, T v) {
  REQUIRE(sizeof(T) == static_cast<size_t>(tilejit::ir::byte_size(t.dtype())));
  std::memcpy(static_cast<std::byte*>(t.data()) + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

std::vector<double> ref1(const HostTensor& x, const std::function<double(double)>& f) {
  std::vector<double> r;
  for (double v : x.to_f64()) r.push_back(f(v));
  return r;
}
std::vector<double> ref2(const HostTensor& x, const HostTensor& y, const std::function<double(double, double)>& f) {
  std::vector<double> r, xs = x.to_f64(), ys = y.to_f64();
  for (size_t i = 0; i < xs.size(); ++i) r.push_back(f(xs[i], ys[i]));
  return r;
}

// ---- comparisons ----

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }
template <std::integral T>
bool same(T a, T b) { return a == b; }

// Exact equality (floats: same value and sign, any NaN matches NaN); lists the first differences.
template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  std::string detail;
  for (size_t i = 0; i < got.size(); ++i)
    if (!same(got[i], want[i]) && ++bad <= 6) detail += fmt::format("\n  [{}] got {}, want {}", i, got[i], want[i]);
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} of {} elements differ{}", what, bad, got.size(), detail));
}

// |got - want| <= rel * |want| element by element (NaN only matches NaN).
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  std::string detail;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok = same(got[i], want[i]) || std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]);
    if (!ok && ++bad <= 6) detail += fmt::format("\n  [{}] got {}, want {}", i, got[i], want[i]);
  }
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} of {} elements differ by more than {} relative{}", what, bad, got.size(),
                                      rel, detail));
}

// IEEE single/half/bfloat results: the exact result rounded once to the dtype.
double rounded(DType d, double exact) { return round_to(d, static_cast<float>(exact)); }

using BinOp = std::function<Tile(Tile, Tile)>;
using BinRef = std::function<double(double, double)>;
struct FloatCase {
  const char* name;
  BinOp op;
  BinRef ref;
};
const std::vector<FloatCase>& float_cases() {
  static const std::vector<FloatCase> cases{
      {"+", [](Tile a, Tile b) { return a + b; }, [](double a, double b) { return a + b; }},
      {"-", [](Tile a, Tile b) { return a - b; }, [](double a, double b) { return a - b; }},
      {"*", [](Tile a, Tile b) { return a * b; }, [](double a, double b) { return a * b; }},
      {"/", [](Tile a, Tile b) { return a / b; }, [](double a, double b) { return a / b; }},
      {"%", [](Tile a, Tile b) { return a % b; }, [](double a, double b) { return std::fmod(a, b); }},
  };
  return cases;
}

}  // namespace

// ======================================================================= creation

TEST_CASE("arange gives i32 start..end-1, including a non-zero start") {
  HostTensor a(i32, {16}), b(i32, {16});
  run("arange", [&](Builder& k) {
    auto A = k.pointer("A", i32), B = k.pointer("B", i32);
    Tile r0 = arange(0, 16), r5 = arange(5, 21);
    CHECK(r0.dtype() == i32);
    CHECK(r5.shape() == Shape{16});
    store(A + arange(0, 16), r0);
    store(B + arange(0, 16), r5);
  }, {a, b});
  std::vector<double> want_a, want_b;
  for (int i = 0; i < 16; ++i) want_a.push_back(i), want_b.push_back(i + 5);
  expect_same(a.to_f64(), want_a, "arange(0, 16)");
  expect_same(b.to_f64(), want_b, "arange(5, 21)");
}

TEST_CASE("full and zeros fill with a literal, rounded to the dtype, or with a runtime scalar") {
  HostTensor f(f32, {8}), z(i32, {8}), h(bf16, {8}), r(f32, {8}), rb(bf16, {8});
  const float fill = -2.71875f;        // a random-looking runtime value
  const float tie = 1.0f + 0x1p-8f;    // halfway between two bf16 numbers: rounds to even (1.0)
  run("fills", [&](Builder& k) {
    auto F = k.pointer("F", f32), Z = k.pointer("Z", i32), H = k.pointer("H", bf16);
    auto R = k.pointer("R", f32), RB = k.pointer("RB", bf16);
    auto v = k.scalar<float>("v"), t = k.scalar<float>("t");
    auto offs = arange(0, 8);
    store(F + offs, full(f32, {8}, 3.25));
    store(Z + offs, zeros(i32, {8}));
    store(H + offs, full(bf16, {8}, 0.1));
    store(R + offs, full(f32, {8}, v));
    store(RB + offs, full(bf16, {8}, t));
  }, {f, z, h, r, rb, fill, tie});
  expect_same(f.to_f64(), std::vector<double>(8, 3.25), "full(f32, 3.25)");
  expect_same(z.to_f64(), std::vector<double>(8, 0.0), "zeros(i32)");
  expect_same(h.to_f64(), std::vector<double>(8, round_to(bf16, 0.1f)), "full(bf16, 0.1)");
  expect_same(r.to_f64(), std::vector<double>(8, fill), "full(f32, runtime scalar)");
  expect_same(rb.to_f64(), std::vector<double>(8, 1.0), "full(bf16, runtime f32 tie) rounds to even");
}

// ======================================================================= shapes and broadcasting

TEST_CASE("broadcasting follows numpy: scalar+tile, [N,1]+[1,M], [M]+[N,M]") {
  const int64_t N = 8, M = 16;
  HostTensor x(f32, {N}), y(f32, {M}), z(f32, {N, M});
  x.fill_uniform(11, -2, 2);
  y.fill_uniform(12, -2, 2);
  z.fill_normal(13, 0, 1);
  HostTensor outer(f32, {N, M}), rowwise(f32, {N, M}), scal(f32, {M});
  const float s = 0.8125f;
  run("broadcast", [&](Builder& k) {
    auto X = k.pointer("X", f32), Y = k.pointer("Y", f32), Z = k.pointer("Z", f32);
    auto O1 = k.pointer("O1", f32), O2 = k.pointer("O2", f32), O3 = k.pointer("O3", f32);
    auto sv = k.scalar<float>("s");
    auto xv = load(X + arange(0, N)), yv = load(Y + arange(0, M));
    Tile o = xv[col] + yv[row];
    CHECK(o.shape() == Shape{N, M});
    store2d(O1, o);
    Tile r = yv + load2d(Z, N, M);  // [M] + [N, M]
    CHECK(r.shape() == Shape{N, M});
    store2d(O2, r);
    store(O3 + arange(0, M), sv * yv);  // scalar * tile
  }, {x, y, z, outer, rowwise, scal, s});
  std::vector<double> w1, w2, w3;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) {
      w1.push_back(static_cast<float>(x.get({i}) + y.get({j})));
      w2.push_back(static_cast<float>(y.get({j}) + z.get({i, j})));
    }
  for (int64_t j = 0; j < M; ++j) w3.push_back(static_cast<float>(double(s) * y.get({j})));
  expect_same(outer.to_f64(), w1, "x[col] + y[row]");
  expect_same(rowwise.to_f64(), w2, "[M] + [N,M]");
  expect_same(scal.to_f64(), w3, "scalar * [M]");
}

TEST_CASE("expand_dims, t[col], t[row] and broadcast_to give the expected shapes and values") {
  const int64_t N = 4, M = 8;
  HostTensor x(f32, {M}), a(f32, {N, M}), b(f32, {M, N}), c(f32, {N, M});
  x.fill_uniform(21, -1, 1);
  run("expand", [&](Builder& k) {
    auto X = k.pointer("X", f32), A = k.pointer("A", f32), B = k.pointer("B", f32), C = k.pointer("C", f32);
    auto xv = load(X + arange(0, M));
    CHECK(expand_dims(xv, 0).shape() == Shape{1, M});
    CHECK(expand_dims(xv, 1).shape() == Shape{M, 1});
    CHECK(expand_dims(xv, -1).shape() == Shape{M, 1});
    CHECK(xv[col].shape() == Shape{M, 1});
    CHECK(xv[row].shape() == Shape{1, M});
    Tile rows_of_x = broadcast_to(xv[row], {N, M});  // every row is x
    Tile cols_of_x = broadcast_to(expand_dims(xv, -1), {M, N});  // every column is x
    CHECK(rows_of_x.shape() == Shape{N, M});
    store2d(A, rows_of_x);
    store2d(B, cols_of_x);
    store2d(C, broadcast_to(xv, {N, M}));  // rank-1 to rank-2: aligned on the right
  }, {x, a, b, c});
  std::vector<double> wa, wb;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) wa.push_back(x.get({j}));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) wb.push_back(x.get({i}));
  expect_same(a.to_f64(), wa, "broadcast_to(x[row], {N,M})");
  expect_same(b.to_f64(), wb, "broadcast_to(expand_dims(x,-1), {M,N})");
  expect_same(c.to_f64(), wa, "broadcast_to(x, {N,M})");
}

TEST_CASE("reshape keeps row-major order; trans swaps the last two dims; permute reorders any dims") {
  const int64_t A = 2, B = 3, C = 4;
  HostTensor x(f32, {A * B * C});
  x.fill_normal(31, 0, 1);
  HostTensor r(f32, {A * B * C}), t(f32, {B * C * A}), p(f32, {C * A * B}), t3(f32, {A * C * B});
  run("shapes", [&](Builder& k) {
    auto X = k.pointer("X", f32), R = k.pointer("R", f32), T = k.pointer("T", f32), P = k.pointer("P", f32),
         T3 = k.pointer("T3", f32);
    auto flat = arange(0, A * B * C);
    auto xv = load(X + flat);
    Tile x2 = reshape(xv, {A * B, C});      // [6, 4]
    Tile x3 = reshape(xv, {A, B, C});       // [2, 3, 4]
    CHECK(x3.shape() == Shape{A, B, C});
    store(R + flat, reshape(x2, {A * B * C}));
    Tile tr = trans(reshape(xv, {A, B * C}));  // [12, 2]
    CHECK(tr.shape() == Shape{B * C, A});
    store(T + flat, reshape(tr, {A * B * C}));
    Tile pm = permute(x3, {2, 0, 1});  // [4, 2, 3]
    CHECK(pm.shape() == Shape{C, A, B});
    store(P + flat, reshape(pm, {A * B * C}));
    Tile t3v = trans(x3);  // rank 3: swaps the last two -> [2, 4, 3]
    CHECK(t3v.shape() == Shape{A, C, B});
    store(T3 + flat, reshape(t3v, {A * B * C}));
  }, {x, r, t, p, t3});
  auto xv = x.to_f64();
  auto at = [&](int64_t a, int64_t b, int64_t c) { return xv[static_cast<size_t>((a * B + b) * C + c)]; };
  std::vector<double> wt, wp, wt3;
  for (int64_t j = 0; j < B * C; ++j)
    for (int64_t i = 0; i < A; ++i) wt.push_back(xv[static_cast<size_t>(i * B * C + j)]);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) wp.push_back(at(a, b, c));
  for (int64_t a = 0; a < A; ++a)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t b = 0; b < B; ++b) wt3.push_back(at(a, b, c));
  expect_same(r.to_f64(), xv, "reshape round trip");
  expect_same(t.to_f64(), wt, "trans of [2,12]");
  expect_same(p.to_f64(), wp, "permute {2,0,1}");
  expect_same(t3.to_f64(), wt3, "trans of a rank-3 tile");
}

// ======================================================================= float arithmetic

TEST_CASE("f32 + - * / % are IEEE single precision, including inf, NaN and division by zero") {
  const int64_t n = 256;
  HostTensor x(f32, {n}), y(f32, {n});
  x.fill_uniform(41, -4, 4);
  y.fill_normal(42, 0, 3);
  // IEEE special cases at the front: x/0, 0/0, inf-inf, inf*0, NaN operands, fmod by 0 and of inf.
  const std::vector<std::pair<double, double>> special{
      {1.5, 0.0}, {-2.0, 0.0}, {0.0, 0.0}, {INFINITY, INFINITY}, {INFINITY, 0.0}, {NAN, 1.0}, {1.0, NAN},
      {-INFINITY, 2.0}, {7.25, INFINITY}, {-0.0, 3.0}, {5.5, -2.0}, {-5.5, 2.0}};
  for (size_t i = 0; i < special.size(); ++i) {
    x.set_flat(static_cast<int64_t>(i), special[i].first);
    y.set_flat(static_cast<int64_t>(i), special[i].second);
  }
  for (const auto& c : float_cases()) {
    HostTensor out = map2(x, y, f32, c.op);
    expect_same(out.to_f64(), ref2(x, y, [&](double a, double b) { return rounded(f32, c.ref(a, b)); }),
                fmt::format("f32 {}", c.name));
  }
}

TEST_CASE("fma rounds a * b + c once (std::fma), in f32 and f64, with broadcast literals; a * b + c rounds twice") {
  const int64_t n = 256;
  for (DType d : {f32, f64}) {
    HostTensor x(d, {n}), y(d, {n}), z(d, {n});
    x.fill_normal(51, 0, 3), y.fill_normal(52, 0, 3), z.fill_normal(53, 0, 9);
    x.set_flat(0, 1.0 + std::ldexp(1.0, -20)), y.set_flat(0, 1.0 - std::ldexp(1.0, -20)), z.set_flat(0, -1.0);  // exact: -2^-40
    x.set_flat(1, INFINITY), y.set_flat(1, 0.0), z.set_flat(1, 1.0);                                       // NaN
    HostTensor fused = map3(x, y, z, d, [](Tile a, Tile b, Tile c) { return fma(a, b, c); });
    HostTensor half = map3(x, y, z, d, [](Tile a, Tile b, Tile c) { return fma(a, 2.0f, c) + b * 0.0f; });
    int64_t bad = 0, bad_half = 0, differs_from_unfused = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = x.get_flat(i), b = y.get_flat(i), c = z.get_flat(i);
      const double want = d == f32 ? static_cast<double>(std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)))
                                   : std::fma(a, b, c);
      const double got = fused.get_flat(i);
      bad += !(got == want || (std::isnan(got) && std::isnan(want)));
      const double h = d == f32 ? static_cast<double>(std::fma(static_cast<float>(a), 2.0f, static_cast<float>(c))) : std::fma(a, 2.0, c);
      bad_half += !(half.get_flat(i) == h || std::isnan(h));
      const double unfused = d == f32 ? static_cast<double>(static_cast<float>(static_cast<float>(a) * static_cast<float>(b)) + static_cast<float>(c))
                                      : a * b + c;
      differs_from_unfused += got != unfused && !std::isnan(got);
    }
    CHECK(bad == 0);
    CHECK(bad_half == 0);
    CHECK(fused.get_flat(0) == -std::ldexp(1.0, -40));
    CHECK(std::isnan(fused.get_flat(1)));
    CHECK(differs_from_unfused >= 1);  // at least element 0, where the product's rounding matters
  }
}

TEST_CASE("bf16 and f16 + - * / % round each result once to the dtype (RNE)") {
  for (DType d : {bf16, f16}) {
    const int64_t n = 256;
    HostTensor x(d, {n}), y(d, {n});
    x.fill_uniform(51, -4, 4);
    y.fill_normal(52, 0, 2);
    y.set_flat(0, 0.0);  // division by zero -> inf, fmod by zero -> NaN
    for (const auto& c : float_cases()) {
      HostTensor out = map2(x, y, d, c.op);
      expect_same(out.to_f64(), ref2(x, y, [&](double a, double b) { return rounded(d, c.ref(a, b)); }),
                  fmt::format("{} {}", tilejit::ir::name(d), c.name));
    }
  }
}

namespace {

// The remainder of x / y, exactly, from the integer significands (IEEE fmod; not computed with
// std::fmod): NaN for x infinite, y zero or a NaN; x for |x| < |y| (y infinite, x = +-0); x's sign.
template <class F>
F exact_remainder(F x, F y) {
  if (std::isnan(x) || std::isnan(y) || std::isinf(x) || y == 0) return std::numeric_limits<F>::quiet_NaN();
  if (std::fabs(x) < std::fabs(y)) return x;
  const int digits = std::numeric_limits<F>::digits;
  int ex = 0, ey = 0;
  const auto mx = static_cast<uint64_t>(std::ldexp(std::frexp(std::fabs(x), &ex), digits));
  const auto my = static_cast<uint64_t>(std::ldexp(std::frexp(std::fabs(y), &ey), digits));
  u128 r = mx % my;  // mx * 2^(ex - ey) mod my (ex >= ey as |x| >= |y|)
  for (int k = ex - ey; k > 0; --k) r = r * 2 % my;
  return std::copysign(std::ldexp(static_cast<F>(static_cast<uint64_t>(r)), ey - digits), x);
}

}  // namespace

TEST_CASE("issue 28: float % is the exact remainder (fmod): signs, zeros, inf, NaN, subnormals, large quotients") {
  for (DType d : {f32, f64, f16, bf16}) {
    INFO(tilejit::ir::name(d));
    const std::vector<std::pair<double, double>> xy = test_kernels::float_rem_inputs(d, 7);
    const auto n = static_cast<int64_t>(xy.size());
    HostTensor x(d, {n}), y(d, {n}), r(d, {n}), bits(u32, {2 * n});
    for (int64_t i = 0; i < n; ++i) x.set_flat(i, xy[static_cast<size_t>(i)].first), y.set_flat(i, xy[static_cast<size_t>(i)].second);
    interpret_any_shape(test_kernels::float_rem().build({{"DTYPE", d}}), {(n + 255) / 256}, {x, y, r, bits, n});
    std::vector<double> want;
    for (int64_t i = 0; i < n; ++i) {
      const double a = x.get_flat(i), b = y.get_flat(i);  // the operands as stored (rounded to d)
      want.push_back(d == f32 ? static_cast<double>(exact_remainder(static_cast<float>(a), static_cast<float>(b))) : exact_remainder(a, b));
    }
    expect_same(r.to_f64(), want, fmt::format("{} %", tilejit::ir::name(d)));
  }
  // large quotients, by value
  HostTensor x(f32, {2}), y(f32, {2}), r(f32, {2}), bits(u32, {4});
  x.set_flat(0, 1e30), y.set_flat(0, 3.7), x.set_flat(1, 1e10), y.set_flat(1, 0.1);
  interpret_any_shape(test_kernels::float_rem().build(), {1}, {x, y, r, bits, int64_t{2}});
  CHECK(r.get_flat(0) == 0x1.814f88p+1);  // 3.0102396 (x - trunc(x / y) * y: 0 in f32)
  CHECK(r.get_flat(1) == 0x1.6a0beep-4);  // 0.0883902833
  CHECK(bits.get_flat(0) == 0x4040a7c4);
}

// ======================================================================= integer arithmetic

namespace {

// Reference integer semantics: two's complement wrap, C++ truncating division, x/0 == -1 (all
// ones), x%0 == x, MIN/-1 == MIN, MIN%-1 == 0.
template <class T>
struct IntRef {
  using U = std::make_unsigned_t<T>;
  static T add(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
  static T sub(T a, T b) { return static_cast<T>(static_cast<U>(a) - static_cast<U>(b)); }
  static T mul(T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); }
  static T div(T a, T b) {
    if (b == 0) return static_cast<T>(~U{0});
    if constexpr (std::is_signed_v<T>)
      if (a == std::numeric_limits<T>::min() && b == -1) return a;
    return static_cast<T>(a / b);
  }
  static T rem(T a, T b) {
    if (b == 0) return a;
    if constexpr (std::is_signed_v<T>)
      if (b == -1) return 0;
    return static_cast<T>(a % b);
  }
};

template <class T>
void check_int_arithmetic(DType d, uint64_t seed) {
  using L = std::numeric_limits<T>;
  const int64_t n = 256;
  HostTensor x(d, {n}), y(d, {n});
  x.fill_uniform(seed, static_cast<double>(L::min()), static_cast<double>(L::max()));
  y.fill_uniform(seed + 1, static_cast<double>(L::min()), static_cast<double>(L::max()));
  // Small divisors so that quotients and remainders are not all 0 / x, then the edge cases.
  HostTensor small(d, {n});
  small.fill_uniform(seed + 2, std::is_signed_v<T> ? -9 : 1, 9);
  for (int64_t i = 0; i < 64; ++i) set_raw<T>(y, i, raw<T>(small)[static_cast<size_t>(i)]);
  set_raw<T>(y, 0, T{0});
  set_raw<T>(y, 1, T{0});
  set_raw<T>(x, 1, T{0});
  set_raw<T>(x, 2, L::min());
  set_raw<T>(y, 2, std::is_signed_v<T> ? static_cast<T>(-1) : T{1});
  set_raw<T>(x, 3, L::max());
  set_raw<T>(y, 3, L::max());
  set_raw<T>(x, 4, L::min());
  set_raw<T>(y, 4, L::min());
  set_raw<T>(x, 5, std::is_signed_v<T> ? static_cast<T>(-7) : T{7});
  set_raw<T>(y, 5, std::is_signed_v<T> ? T{2} : T{2});

  struct Case {
    const char* name;
    BinOp op;
    T (*ref)(T, T);
  };
  const Case cases[] = {
      {"+", [](Tile a, Tile b) { return a + b; }, IntRef<T>::add},
      {"-", [](Tile a, Tile b) { return a - b; }, IntRef<T>::sub},
      {"*", [](Tile a, Tile b) { return a * b; }, IntRef<T>::mul},
      {"/", [](Tile a, Tile b) { return a / b; }, IntRef<T>::div},
      {"%", [](Tile a, Tile b) { return a % b; }, IntRef<T>::rem},
  };
  auto xs = raw<T>(x), ys = raw<T>(y);
  for (const Case& c : cases) {
    HostTensor out = map2(x, y, d, c.op);
    std::vector<T> want;
    for (size_t i = 0; i < xs.size(); ++i) want.push_back(c.ref(xs[i], ys[i]));
    expect_same(raw<T>(out), want, fmt::format("{} {}", tilejit::ir::name(d), c.name));
  }
}

}  // namespace

TEST_CASE("i32 + - * wrap around, / and % truncate toward zero, x/0 is -1") { check_int_arithmetic<int32_t>(i32, 61); }
TEST_CASE("u32 + - * wrap around, / and % are unsigned, x/0 is all ones") { check_int_arithmetic<uint32_t>(u32, 62); }
TEST_CASE("i64 + - * wrap around, / and % truncate toward zero, x/0 is -1") { check_int_arithmetic<int64_t>(i64, 63); }
TEST_CASE("u64 + - * wrap around, / and % are unsigned, x/0 is all ones") { check_int_arithmetic<uint64_t>(u64, 64); }

// ======================================================================= bit operations

namespace {

// Shifts by >= the bit width: << gives 0, >> gives 0 (unsigned) or the sign fill (signed), as
// PTX shl/shr clamp the amount.
template <class T>
T ref_shl(T a, T s) {
  using U = std::make_unsigned_t<T>;
  if (static_cast<U>(s) >= sizeof(T) * 8) return 0;
  return static_cast<T>(static_cast<U>(a) << static_cast<U>(s));
}
template <class T>
T ref_shr(T a, T s) {
  using U = std::make_unsigned_t<T>;
  if (static_cast<U>(s) >= sizeof(T) * 8) return std::is_signed_v<T> && a < 0 ? static_cast<T>(-1) : T{0};
  return static_cast<T>(a >> static_cast<U>(s));  // arithmetic for signed T (C++20)
}

template <class T>
void check_bit_ops(DType d, uint64_t seed) {
  using L = std::numeric_limits<T>;
  const int64_t n = 128;
  const T width = static_cast<T>(sizeof(T) * 8);
  HostTensor x(d, {n}), y(d, {n}), s(d, {n});
  x.fill_uniform(seed, static_cast<double>(L::min()), static_cast<double>(L::max()));
  y.fill_uniform(seed + 1, static_cast<double>(L::min()), static_cast<double>(L::max()));
  s.fill_uniform(seed + 2, 0, static_cast<double>(width - 1));
  // amounts at and beyond the width, on positive and negative values
  // (-1 read as an unsigned amount is the largest one)
  const T big[] = {width, static_cast<T>(width + 1), static_cast<T>(2 * width), static_cast<T>(100), static_cast<T>(-1)};
  for (int64_t i = 0; i < 10; ++i) set_raw<T>(s, i, big[i % 5]);
  set_raw<T>(x, 0, L::min());
  set_raw<T>(x, 1, static_cast<T>(L::max() - 5));

  auto xs = raw<T>(x);
  auto check = [&](const char* name, HostTensor& rhs, const BinOp& op, const std::function<T(T, T)>& ref) {
    HostTensor out = map2(x, rhs, d, op);
    auto rs = raw<T>(rhs);
    std::vector<T> want;
    for (size_t i = 0; i < xs.size(); ++i) want.push_back(ref(xs[i], rs[i]));
    expect_same(raw<T>(out), want, fmt::format("{} {}", tilejit::ir::name(d), name));
  };
  check("&", y, [](Tile a, Tile b) { return a & b; }, [](T a, T b) { return static_cast<T>(a & b); });
  check("|", y, [](Tile a, Tile b) { return a | b; }, [](T a, T b) { return static_cast<T>(a | b); });
  check("^", y, [](Tile a, Tile b) { return a ^ b; }, [](T a, T b) { return static_cast<T>(a ^ b); });
  check("<<", s, [](Tile a, Tile b) { return a << b; }, ref_shl<T>);
  check(">>", s, [](Tile a, Tile b) { return a >> b; }, ref_shr<T>);

  HostTensor inv = map1(x, d, [](Tile a) { return ~a; });
  std::vector<T> want_inv;
  for (T v : xs) want_inv.push_back(static_cast<T>(~v));
  expect_same(raw<T>(inv), want_inv, fmt::format("{} ~", tilejit::ir::name(d)));

  HostTensor lit = map1(x, d, [](Tile a) { return (a >> 3) ^ (a << 5); });  // literal amounts take x's dtype
  std::vector<T> want_lit;
  for (T v : xs) want_lit.push_back(static_cast<T>(ref_shr<T>(v, 3) ^ ref_shl<T>(v, 5)));
  expect_same(raw<T>(lit), want_lit, fmt::format("{} shifts by literals", tilejit::ir::name(d)));
}

}  // namespace

TEST_CASE("i32 & | ^ ~ << >> (arithmetic >>), shift amounts >= 32") { check_bit_ops<int32_t>(i32, 71); }
TEST_CASE("u32 & | ^ ~ << >> (logical >>), shift amounts >= 32") { check_bit_ops<uint32_t>(u32, 72); }
TEST_CASE("i64 & | ^ ~ << >> (arithmetic >>), shift amounts >= 64") { check_bit_ops<int64_t>(i64, 73); }
TEST_CASE("u64 & | ^ ~ << >> (logical >>), shift amounts >= 64") { check_bit_ops<uint64_t>(u64, 74); }

// ======================================================================= comparisons, unary, where

TEST_CASE("comparisons: ordered f32 compares with NaN are false, != is true; ints compare by signedness") {
  const int64_t n = 64;
  HostTensor x(f32, {n}), y(f32, {n});
  x.fill_uniform(81, -2, 2);
  y.fill_uniform(82, -2, 2);
  x.set_flat(0, NAN);
  y.set_flat(1, NAN);
  x.set_flat(2, NAN), y.set_flat(2, NAN);
  x.set_flat(3, 1.25), y.set_flat(3, 1.25);  // equal
  x.set_flat(4, -0.0), y.set_flat(4, 0.0);   // -0 == +0
  x.set_flat(5, INFINITY), y.set_flat(5, 1e38);
  struct Case {
    const char* name;
    BinOp op;
    std::function<bool(double, double)> ref;
  };
  const Case cases[] = {
      {"<", [](Tile a, Tile b) { return as_i32(a < b); }, [](double a, double b) { return a < b; }},
      {"<=", [](Tile a, Tile b) { return as_i32(a <= b); }, [](double a, double b) { return a <= b; }},
      {">", [](Tile a, Tile b) { return as_i32(a > b); }, [](double a, double b) { return a > b; }},
      {">=", [](Tile a, Tile b) { return as_i32(a >= b); }, [](double a, double b) { return a >= b; }},
      {"==", [](Tile a, Tile b) { return as_i32(a == b); }, [](double a, double b) { return a == b; }},
      {"!=", [](Tile a, Tile b) { return as_i32(a != b); }, [](double a, double b) { return a != b; }},
  };
  for (const Case& c : cases) {
    HostTensor out = map2(x, y, i32, c.op);
    expect_same(out.to_f64(), ref2(x, y, [&](double a, double b) { return c.ref(a, b) ? 1.0 : 0.0; }),
                fmt::format("f32 {}", c.name));
  }
  // The NaN rows explicitly, so that the rule is visible in a failure.
  HostTensor lt = map2(x, y, i32, cases[0].op), ne = map2(x, y, i32, cases[5].op), eq = map2(x, y, i32, cases[4].op);
  CHECK(lt.get_flat(0) == 0);
  CHECK(eq.get_flat(2) == 0);
  CHECK(ne.get_flat(0) == 1);
  CHECK(ne.get_flat(2) == 1);

  // i32 and u32: the same bit patterns compare differently.
  HostTensor a(i32, {n}), b(i32, {n}), ua(u32, {n}), ub(u32, {n});
  a.fill_uniform(83, -1000, 1000);
  b.fill_uniform(84, -1000, 1000);
  for (int64_t i = 0; i < n; ++i) {
    set_raw<uint32_t>(ua, i, static_cast<uint32_t>(raw<int32_t>(a)[static_cast<size_t>(i)]));
    set_raw<uint32_t>(ub, i, static_cast<uint32_t>(raw<int32_t>(b)[static_cast<size_t>(i)]));
  }
  HostTensor slt = map2(a, b, i32, cases[0].op), ult = map2(ua, ub, i32, cases[0].op);
  std::vector<double> ws, wu;
  auto as = raw<int32_t>(a), bs = raw<int32_t>(b);
  for (size_t i = 0; i < as.size(); ++i) {
    ws.push_back(as[i] < bs[i]);
    wu.push_back(static_cast<uint32_t>(as[i]) < static_cast<uint32_t>(bs[i]));
  }
  expect_same(slt.to_f64(), ws, "i32 <");
  expect_same(ult.to_f64(), wu, "u32 <");
}

TEST_CASE("unary minus, ! and ~ on floats, ints and booleans") {
  HostTensor x(f32, {64});
  x.fill_normal(91, 0, 5);
  x.set_flat(0, 0.0);
  x.set_flat(1, -0.0);
  x.set_flat(2, INFINITY);
  HostTensor neg = map1(x, f32, [](Tile a) { return -a; });
  expect_same(neg.to_f64(), ref1(x, [](double v) { return -v; }), "f32 -x (also -0 and inf)");

  HostTensor xi(i32, {64});
  xi.fill_uniform(92, -50, 50);
  set_raw<int32_t>(xi, 0, INT32_MIN);
  set_raw<int32_t>(xi, 1, 0);
  set_raw<int32_t>(xi, 2, 0);
  HostTensor negi = map1(xi, i32, [](Tile a) { return -a; });
  std::vector<int32_t> want_neg;
  for (int32_t v : raw<int32_t>(xi)) want_neg.push_back(IntRef<int32_t>::sub(0, v));
  expect_same(raw<int32_t>(negi), want_neg, "i32 -x wraps at INT_MIN");

  HostTensor noti = map1(xi, i32, [](Tile a) { return as_i32(!a); });  // !int is (x == 0)
  expect_same(noti.to_f64(), ref1(xi, [](double v) { return v == 0 ? 1.0 : 0.0; }), "!i32");
  HostTensor notb = map1(xi, i32, [](Tile a) { return as_i32(!(a > 0)); });  // !i1 is logical not
  expect_same(notb.to_f64(), ref1(xi, [](double v) { return v > 0 ? 0.0 : 1.0; }), "!(x > 0)");
  HostTensor nots = map1(xi, i32, [](Tile a) { return as_i32(~(a > 0)); });  // ~i1 flips the one bit
  expect_same(nots.to_f64(), ref1(xi, [](double v) { return v > 0 ? 0.0 : 1.0; }), "~(x > 0)");
}

TEST_CASE("where selects elementwise, broadcasts cond and branches, and accepts literal branches") {
  const int64_t N = 8, M = 16;
  HostTensor x(f32, {N}), y(f32, {M}), a(f32, {N, M}), b(f32, {M}), c(f32, {M});
  x.fill_normal(101, 0, 1);
  y.fill_normal(102, 0, 1);
  DType lit_dtype{}, int_lit_dtype{};
  HostTensor ci(i32, {M});
  run("where_ops", [&](Builder& k) {
    auto X = k.pointer("X", f32), Y = k.pointer("Y", f32), A = k.pointer("A", f32), B = k.pointer("B", f32),
         C = k.pointer("C", f32), CI = k.pointer("CI", i32);
    auto xv = load(X + arange(0, N)), yv = load(Y + arange(0, M));
    Tile w = where(xv[col] > 0, yv[row], -1.5);  // cond [N,1], a [1,M], b literal
    CHECK(w.shape() == Shape{N, M});
    store2d(A, w);
    store(B + arange(0, M), where(yv < 0, -yv, yv));
    Tile lits = where(yv > 0.5, 2.5, -1);
    lit_dtype = lits.dtype();
    store(C + arange(0, M), lits);
    Tile ilits = where(yv > 0.5, 7, -3);
    int_lit_dtype = ilits.dtype();
    store(CI + arange(0, M), ilits);
  }, {x, y, a, b, c, ci});
  CHECK(lit_dtype == f32);
  CHECK(int_lit_dtype == i32);
  std::vector<double> wa;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) wa.push_back(x.get({i}) > 0 ? y.get({j}) : -1.5);
  expect_same(a.to_f64(), wa, "where([N,1], [1,M], literal)");
  expect_same(b.to_f64(), ref1(y, [](double v) { return std::fabs(v); }), "where(y < 0, -y, y)");
  expect_same(c.to_f64(), ref1(y, [](double v) { return v > 0.5 ? 2.5 : -1.0; }), "where(c, 2.5, -1)");
  expect_same(ci.to_f64(), ref1(y, [](double v) { return v > 0.5 ? 7.0 : -3.0; }), "where(c, 7, -3)");
}

TEST_CASE("maximum and minimum propagate NaN for floats and compare ints by signedness") {
  const int64_t n = 64;
  HostTensor x(f32, {n}), y(f32, {n});
  x.fill_normal(111, 0, 1);
  y.fill_normal(112, 0, 1);
  x.set_flat(0, NAN);
  y.set_flat(1, NAN);
  x.set_flat(2, NAN), y.set_flat(2, NAN);
  x.set_flat(3, -INFINITY);
  y.set_flat(4, INFINITY);
  auto nanmax = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); };
  auto nanmin = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); };
  expect_same(map2(x, y, f32, [](Tile a, Tile b) { return maximum(a, b); }).to_f64(), ref2(x, y, nanmax), "f32 maximum");
  expect_same(map2(x, y, f32, [](Tile a, Tile b) { return minimum(a, b); }).to_f64(), ref2(x, y, nanmin), "f32 minimum");

  HostTensor a(u32, {n}), b(u32, {n});
  a.fill_uniform(113, 0, 4294967295.0);
  b.fill_uniform(114, 0, 4294967295.0);
  auto as = raw<uint32_t>(a), bs = raw<uint32_t>(b);
  std::vector<uint32_t> wmax, wmin;
  for (size_t i = 0; i < as.size(); ++i) wmax.push_back(std::max(as[i], bs[i])), wmin.push_back(std::min(as[i], bs[i]));
  expect_same(raw<uint32_t>(map2(a, b, u32, [](Tile p, Tile q) { return maximum(p, q); })), wmax, "u32 maximum");
  expect_same(raw<uint32_t>(map2(a, b, u32, [](Tile p, Tile q) { return minimum(p, q); })), wmin, "u32 minimum");

  HostTensor c(i32, {n}), d(i32, {n});
  c.fill_uniform(115, INT32_MIN, INT32_MAX);
  d.fill_uniform(116, INT32_MIN, INT32_MAX);
  expect_same(map2(c, d, i32, [](Tile p, Tile q) { return maximum(p, q); }).to_f64(),
              ref2(c, d, [](double p, double q) { return std::max(p, q); }), "i32 maximum");
}

TEST_CASE("umulhi gives the high half of the full unsigned product (u32, i32, u64)") {
  const int64_t n = 128;
  HostTensor a(u32, {n}), b(u32, {n});
  a.fill_uniform(121, 0, 4294967295.0);
  b.fill_uniform(122, 0, 4294967295.0);
  set_raw<uint32_t>(a, 0, 0xFFFFFFFFu);
  set_raw<uint32_t>(b, 0, 0xFFFFFFFFu);
  auto as = raw<uint32_t>(a), bs = raw<uint32_t>(b);
  std::vector<uint32_t> want;
  for (size_t i = 0; i < as.size(); ++i) want.push_back(static_cast<uint32_t>((uint64_t{as[i]} * bs[i]) >> 32));
  expect_same(raw<uint32_t>(map2(a, b, u32, [](Tile p, Tile q) { return umulhi(p, q); })), want, "u32 umulhi");

  // i32 operands: the IR defines umulhi as the high half of the *unsigned* product.
  HostTensor ai(i32, {n}), bi(i32, {n});
  std::memcpy(ai.data(), a.data(), a.bytes());
  std::memcpy(bi.data(), b.data(), b.bytes());
  std::vector<int32_t> want_i;
  for (uint32_t v : want) want_i.push_back(static_cast<int32_t>(v));
  expect_same(raw<int32_t>(map2(ai, bi, i32, [](Tile p, Tile q) { return umulhi(p, q); })), want_i, "i32 umulhi");

  HostTensor c(u64, {n}), d(u64, {n});
  c.fill_uniform(123, 0, 0x1p64);
  d.fill_uniform(124, 0, 0x1p64);
  set_raw<uint64_t>(c, 0, ~uint64_t{0});
  set_raw<uint64_t>(d, 0, ~uint64_t{0});
  auto cs = raw<uint64_t>(c), ds = raw<uint64_t>(d);
  std::vector<uint64_t> want64;
  for (size_t i = 0; i < cs.size(); ++i)
    want64.push_back(static_cast<uint64_t>((static_cast<u128>(cs[i]) * ds[i]) >> 64));
  expect_same(raw<uint64_t>(map2(c, d, u64, [](Tile p, Tile q) { return umulhi(p, q); })), want64, "u64 umulhi");
}

// prmt.b32 (default mode) written from the PTX manual: bytes {b:a} numbered 0..7, result byte i
// picked by selector nibble i, whose bit 3 asks for the picked byte's sign in all 8 bits.
uint32_t byte_perm_ref(uint32_t a, uint32_t b, uint32_t selector) {
  uint8_t src[8];
  for (int i = 0; i < 4; ++i) {
    src[i] = static_cast<uint8_t>(a >> (8 * i));
    src[4 + i] = static_cast<uint8_t>(b >> (8 * i));
  }
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = (selector >> (4 * i)) & 15u;
    const uint8_t byte = src[nibble % 8];
    r |= uint32_t{nibble >= 8 ? (byte >= 128 ? uint8_t{0xFF} : uint8_t{0}) : byte} << (8 * i);
  }
  return r;
}

TEST_CASE("byte_perm is prmt.b32: random words and selectors (sign replication included), i32, broadcasting") {
  const int64_t n = 256;
  HostTensor a(u32, {n}), b(u32, {n}), sel(u32, {n});
  a.fill_uniform(131, 0, 4294967295.0);
  b.fill_uniform(132, 0, 4294967295.0);
  sel.fill_uniform(133, 0, 4294967295.0);  // random nibbles: half of them replicate a sign
  auto as = raw<uint32_t>(a), bs = raw<uint32_t>(b), ss = raw<uint32_t>(sel);
  auto perm = [](Tile x, Tile y, Tile z) { return byte_perm(x, y, z); };
  std::vector<uint32_t> want;
  for (size_t i = 0; i < as.size(); ++i) want.push_back(byte_perm_ref(as[i], bs[i], ss[i]));
  expect_same(raw<uint32_t>(map3(a, b, sel, u32, perm)), want, "u32 byte_perm");

  // i32 operands: the same bits, an i32 result.
  HostTensor ai(i32, {n}), bi(i32, {n}), si(i32, {n});
  std::memcpy(ai.data(), a.data(), a.bytes());
  std::memcpy(bi.data(), b.data(), b.bytes());
  std::memcpy(si.data(), sel.data(), sel.bytes());
  std::vector<int32_t> want_i;
  for (uint32_t v : want) want_i.push_back(static_cast<int32_t>(v));
  expect_same(raw<int32_t>(map3(ai, bi, si, i32, perm)), want_i, "i32 byte_perm");

  // Broadcasting: out[i, s] = byte_perm(a[i], 0, s * 0x1111) -- every nibble value 0..15 as a
  // selector built in the kernel, the literal b widened to the tile.
  HostTensor grid(u32, {n, 16});
  run("byte_perm_broadcast", [&](Builder& k) {
    auto A = k.pointer("A", u32), Out = k.pointer("Out", u32);
    auto x = load(A + arange(0, n));
    store2d(Out, byte_perm(x[col], 0, cast(u32, arange(0, 16)[row]) * 0x1111u));
  }, {a, grid});
  std::vector<uint32_t> want_grid;
  for (size_t i = 0; i < as.size(); ++i)
    for (uint32_t s = 0; s < 16; ++s) want_grid.push_back(byte_perm_ref(as[i], 0, s * 0x1111u));
  expect_same(raw<uint32_t>(grid), want_grid, "broadcast byte_perm");
}

// ======================================================================= promotion

TEST_CASE("promotion: literals adopt the tile dtype; int+float literal is f32; wider int and wider float win") {
  const int64_t n = 64;
  HostTensor xb(bf16, {n}), xi(i32, {n}), xl(i64, {n}), xh(f16, {n}), xf(f32, {n}), xu(u32, {n});
  xb.fill_uniform(131, -3, 3);
  xi.fill_uniform(132, -1000, 1000);
  xl.fill_uniform(133, -0x1p40, 0x1p40);
  xh.fill_uniform(134, -3, 3);
  xf.fill_uniform(135, -3, 3);
  xu.fill_uniform(136, 0, 100);
  HostTensor ob(bf16, {n}), oi(f32, {n}), ol(i64, {n}), of(f32, {n}), ou(i32, {n});
  std::vector<DType> seen;
  run("promote", [&](Builder& k) {
    auto XB = k.pointer("XB", bf16), XI = k.pointer("XI", i32), XL = k.pointer("XL", i64), XH = k.pointer("XH", f16),
         XF = k.pointer("XF", f32), XU = k.pointer("XU", u32);
    auto OB = k.pointer("OB", bf16), OI = k.pointer("OI", f32), OL = k.pointer("OL", i64), OF = k.pointer("OF", f32),
         OU = k.pointer("OU", i32);
    auto offs = arange(0, n);
    auto b = load(XB + offs), i = load(XI + offs), l = load(XL + offs), h = load(XH + offs), f = load(XF + offs),
         u = load(XU + offs);
    Tile r1 = b * 1.5 + 0.1;  // both literals become bf16 constants
    Tile r2 = i + 0.5;        // int tile + float literal -> f32
    Tile r3 = i + l;          // i32 + i64 -> i64
    Tile r4 = h + f;          // f16 + f32 -> f32
    Tile r5 = (i * 0 - 1) < u;  // i32 vs u32 -> u32 (C rule): -1 becomes 0xFFFFFFFF
    seen = {r1.dtype(), r2.dtype(), r3.dtype(), r4.dtype(), (u + 1).dtype(), (i < 2.5).dtype()};
    store(OB + offs, r1);
    store(OI + offs, r2);
    store(OL + offs, r3);
    store(OF + offs, r4);
    store(OU + offs, as_i32(r5));
  }, {xb, xi, xl, xh, xf, xu, ob, oi, ol, of, ou});
  CHECK(seen == std::vector<DType>{bf16, f32, i64, f32, u32, i1});
  const double c15 = round_to(bf16, 1.5f), c01 = round_to(bf16, 0.1f);
  expect_same(ob.to_f64(), ref1(xb, [&](double v) { return rounded(bf16, rounded(bf16, v * c15) + c01); }),
              "bf16 * 1.5 + 0.1 in bf16");
  expect_same(oi.to_f64(), ref1(xi, [](double v) { return rounded(f32, v + 0.5); }), "i32 + 0.5 in f32");
  std::vector<int64_t> wl;
  auto is = raw<int32_t>(xi);
  auto ls = raw<int64_t>(xl);
  for (size_t j = 0; j < is.size(); ++j) wl.push_back(is[j] + ls[j]);
  expect_same(raw<int64_t>(ol), wl, "i32 + i64 in i64");
  expect_same(of.to_f64(), ref2(xh, xf, [](double p, double q) { return rounded(f32, p + q); }), "f16 + f32 in f32");
  expect_same(ou.to_f64(), std::vector<double>(n, 0.0), "(i32)-1 < u32 compares as unsigned");
}

TEST_CASE("promotion errors: a literal that does not fit the int tile, bf16 mixed with f16") {
  auto fits = kernel("literal_fit", [](Builder& k) {
    auto X = k.pointer("X", i8);
    auto offs = arange(0, 16);
    store(X + offs, load(X + offs) + 300);
  });
  CHECK_THROWS_WITH_AS(fits.build(), doctest::Contains("the number 300 does not fit in i8"), BuildError);
  auto mixed = kernel("bf16_f16", [](Builder& k) {
    auto A = k.pointer("A", bf16), B = k.pointer("B", f16);
    auto offs = arange(0, 16);
    store(A + offs, load(A + offs) * load(B + offs));
  });
  CHECK_THROWS_WITH_AS(mixed.build(), doctest::Contains("dtype mismatch: bf16 vs f16"), BuildError);
}

// ======================================================================= casts

TEST_CASE("cast f32 -> bf16 rounds to nearest even: ties, overflow, subnormals, NaN") {
  const std::vector<double> in{
      1.0 + 0x1p-8,             // tie between 1 and 1+2^-7 -> 1 (even)
      1.0 + 3 * 0x1p-8,         // tie between 1+2^-7 (odd) and 1+2^-6 -> 1+2^-6
      1.0 + 0x1p-8 + 0x1p-20,   // just above the tie -> up
      -(1.0 + 0x1p-8),          // negative tie -> -1
      -(1.0 + 3 * 0x1p-8),      //
      static_cast<double>(FLT_MAX),  // rounds past the largest bf16 -> inf
      -static_cast<double>(FLT_MAX),
      0x1.fefp127,              // rounds down to the largest finite bf16
      1e-40,                    // f32 subnormal
      0x1.8p-133,               // subnormal tie: 1.5 units of bf16's smallest subnormal -> 2 units
      -0.0, INFINITY, -INFINITY, NAN};
  HostTensor x = tensor_of(f32, in);
  HostTensor out = map1(x, bf16, [](Tile a) { return cast(bf16, a); });
  std::vector<double> hand{1.0, 1.0 + 0x1p-6, 1.0 + 0x1p-7, -1.0, -(1.0 + 0x1p-6), INFINITY, -INFINITY, 0x1.fep127,
                           round_to(bf16, 1e-40f), 0x1p-132, -0.0, INFINITY, -INFINITY, NAN};
  expect_same(out.to_f64(), hand, "f32 -> bf16, hand-computed");
  expect_same(out.to_f64(), ref1(x, [](double v) { return rounded(bf16, v); }), "f32 -> bf16 vs ir::round_to");

  HostTensor r(f32, {512});
  r.fill_normal(141, 0, 100);
  expect_same(map1(r, bf16, [](Tile a) { return cast(bf16, a); }).to_f64(), ref1(r, [](double v) { return rounded(bf16, v); }),
              "random f32 -> bf16");
}

TEST_CASE("cast f32 -> f16 rounds to nearest even: ties, 65520 overflows to inf, subnormals") {
  const std::vector<double> in{
      65504.0, 65519.0, 65520.0, -65520.0, 1e6,
      1.0 + 0x1p-11,          // tie -> 1
      1.0 + 3 * 0x1p-11,      // tie -> 1 + 2^-9
      0x1p-24,                // smallest subnormal
      0x1p-25,                // tie between 0 and 2^-24 -> 0
      0x1.8p-24,              // tie between 1 and 2 units -> 2 units
      0x1.4p-23,              // 2.5 units -> 2 units
      0x1p-14 - 0x1p-25,      // 1023.5 units -> 1024 units = the smallest normal
      1e-10, -0.0, NAN};
  HostTensor x = tensor_of(f32, in);
  HostTensor out = map1(x, f16, [](Tile a) { return cast(f16, a); });
  std::vector<double> hand{65504.0, 65504.0, INFINITY, -INFINITY, INFINITY, 1.0, 1.0 + 0x1p-9, 0x1p-24, 0.0, 0x1p-23,
                           0x1p-23, 0x1p-14, 0.0, -0.0, NAN};
  expect_same(out.to_f64(), hand, "f32 -> f16, hand-computed");

  HostTensor r(f32, {512});
  r.fill_normal(142, 0, 1000);
  expect_same(map1(r, f16, [](Tile a) { return cast(f16, a); }).to_f64(), ref1(r, [](double v) { return rounded(f16, v); }),
              "random f32 -> f16");
  HostTensor s(f32, {512});
  s.fill_uniform(143, -1e-4, 1e-4);  // mostly f16 subnormals
  expect_same(map1(s, f16, [](Tile a) { return cast(f16, a); }).to_f64(), ref1(s, [](double v) { return rounded(f16, v); }),
              "small f32 -> f16 subnormals");
}

TEST_CASE("cast f32 -> fp8 rounds to nearest even and saturates at the largest finite value (PTX satfinite)") {
  HostTensor x = tensor_of(f32, {1.0, 1.0625, 1.1875, 0.3, 448.0, 464.0, 1000.0, INFINITY, -1e6, NAN, 57344.0, 61440.0, 0.0});
  // e4m3: 3 mantissa bits, max 448; e5m2: 2 mantissa bits, max 57344
  expect_same(map1(x, f32, [](Tile t) { return cast(f32, cast(f8e4m3, t)); }).to_f64(),
              std::vector<double>{1.0, 1.0, 1.25, 0.3125, 448, 448, 448, 448, -448, NAN, 448, 448, 0.0}, "f32 -> f8e4m3");
  expect_same(map1(x, f32, [](Tile t) { return cast(f32, cast(f8e5m2, t)); }).to_f64(),
              std::vector<double>{1.0, 1.0, 1.25, 0.3125, 448, 448, 1024, 57344, -57344, NAN, 57344, 57344, 0.0},
              "f32 -> f8e5m2");
}

TEST_CASE("cast float -> int truncates toward zero, saturates at the range, NaN -> 0") {
  HostTensor x = tensor_of(f32, {2.7, -2.7, 0.5, -0.5, 2147483520.0, 3e9, -3e9, NAN, INFINITY, -INFINITY, -2147483648.0,
                                 300.0, -5.0, 254.9, 127.9, -200.0, 4e9, 5e9, 1e19, -1e19});
  auto to = [&](DType d) { return map1(x, d, [d](Tile a) { return cast(d, a); }); };
  expect_same(to(i32).to_f64(),
              std::vector<double>{2, -2, 0, 0, 2147483520.0, 2147483647.0, -2147483648.0, 0, 2147483647.0, -2147483648.0,
                                  -2147483648.0, 300, -5, 254, 127, -200, 2147483647.0, 2147483647.0, 2147483647.0,
                                  -2147483648.0},
              "f32 -> i32");
  expect_same(to(u8).to_f64(),
              std::vector<double>{2, 0, 0, 0, 255, 255, 0, 0, 255, 0, 0, 255, 0, 254, 127, 0, 255, 255, 255, 0}, "f32 -> u8");
  expect_same(to(i8).to_f64(),
              std::vector<double>{2, -2, 0, 0, 127, 127, -128, 0, 127, -128, -128, 127, -5, 127, 127, -128, 127, 127, 127,
                                  -128},
              "f32 -> i8");
  expect_same(to(u32).to_f64(),
              std::vector<double>{2, 0, 0, 0, 2147483520.0, 3e9, 0, 0, 4294967295.0, 0, 0, 300, 0, 254, 127, 0, 4e9,
                                  4294967295.0, 4294967295.0, 0},
              "f32 -> u32");
  auto got64 = raw<int64_t>(to(i64));
  CHECK(got64[0] == 2);
  CHECK(got64[5] == 3000000000LL);
  CHECK(got64[7] == 0);
  CHECK(got64[18] == INT64_MAX);
  CHECK(got64[19] == INT64_MIN);
  CHECK(got64[8] == INT64_MAX);

  HostTensor r(f32, {256});
  r.fill_normal(151, 0, 1e4);
  expect_same(map1(r, i32, [](Tile a) { return cast(i32, a); }).to_f64(), ref1(r, [](double v) { return std::trunc(v); }),
              "random f32 -> i32");
}

TEST_CASE("cast int -> float rounds once to nearest even (no double rounding through f32 or f64)") {
  HostTensor a = tensor_of(i32, {16777217, 16777219, -16777217, 2147483647, 257, 259, 255, 16842753, -7});
  expect_same(map1(a, f32, [](Tile t) { return cast(f32, t); }).to_f64(),
              std::vector<double>{16777216, 16777220, -16777216, 2147483648.0, 257, 259, 255, 16842752, -7}, "i32 -> f32");
  // 16842753 = 2^24 + 2^16 + 1: via f32 it would become the bf16 tie 2^24 + 2^16 and round to even (2^24).
  expect_same(map1(a, bf16, [](Tile t) { return cast(bf16, t); }).to_f64(),
              std::vector<double>{16777216, 16777216, -16777216, 2147483648.0, 256, 260, 255, 16908288, -7}, "i32 -> bf16");

  HostTensor l(i64, {3});
  set_raw<int64_t>(l, 0, (int64_t{1} << 53) + 1);
  set_raw<int64_t>(l, 1, (int64_t{1} << 62) + (int64_t{1} << 38) + 1);  // via f64 it would be an f32 tie
  set_raw<int64_t>(l, 2, INT64_MIN);
  expect_same(map1(l, f32, [](Tile t) { return cast(f32, t); }).to_f64(),
              std::vector<double>{0x1p53, 0x1p62 + 0x1p39, -0x1p63}, "i64 -> f32");

  HostTensor u = tensor_of(u32, {4294967295.0, 2147483648.0, 3});
  expect_same(map1(u, f32, [](Tile t) { return cast(f32, t); }).to_f64(), std::vector<double>{0x1p32, 0x1p31, 3},
              "u32 -> f32 (unsigned)");

  HostTensor r(i32, {256});
  r.fill_uniform(161, INT32_MIN, INT32_MAX);
  expect_same(map1(r, f32, [](Tile t) { return cast(f32, t); }).to_f64(), ref1(r, [](double v) { return rounded(f32, v); }),
              "random i32 -> f32");
}

TEST_CASE("cast int -> int wraps (sign/zero extension by the source), -> i1 is x != 0") {
  HostTensor a = tensor_of(i32, {200, 300, -129, -1, 127, 0, 65535, -32769});
  expect_same(map1(a, i8, [](Tile t) { return cast(i8, t); }).to_f64(), std::vector<double>{-56, 44, 127, -1, 127, 0, -1, -1},
              "i32 -> i8");
  expect_same(map1(a, u8, [](Tile t) { return cast(u8, t); }).to_f64(), std::vector<double>{200, 44, 127, 255, 127, 0, 255, 255},
              "i32 -> u8");
  expect_same(map1(a, i16, [](Tile t) { return cast(i16, t); }).to_f64(),
              std::vector<double>{200, 300, -129, -1, 127, 0, -1, 32767}, "i32 -> i16");
  std::vector<uint64_t> want_u64;
  for (int32_t v : raw<int32_t>(a)) want_u64.push_back(static_cast<uint64_t>(static_cast<int64_t>(v)));
  expect_same(raw<uint64_t>(map1(a, u64, [](Tile t) { return cast(u64, t); })), want_u64, "i32 -> u64 sign-extends");

  HostTensor b = tensor_of(i8, {-128, -1, 127, 5});
  expect_same(map1(b, i32, [](Tile t) { return cast(i32, t); }).to_f64(), std::vector<double>{-128, -1, 127, 5},
              "i8 -> i32 sign-extends");
  HostTensor c = tensor_of(u8, {255, 128, 0, 7});
  expect_same(map1(c, i32, [](Tile t) { return cast(i32, t); }).to_f64(), std::vector<double>{255, 128, 0, 7},
              "u8 -> i32 zero-extends");
  HostTensor d = tensor_of(u32, {4294967295.0, 2147483648.0});
  expect_same(raw<int64_t>(map1(d, i64, [](Tile t) { return cast(i64, t); })), std::vector<int64_t>{4294967295LL, 2147483648LL},
              "u32 -> i64 zero-extends");
  HostTensor e(i64, {3});
  set_raw<int64_t>(e, 0, (int64_t{1} << 32) + 5);
  set_raw<int64_t>(e, 1, int64_t{1} << 31);
  set_raw<int64_t>(e, 2, -(int64_t{1} << 33) - 3);
  expect_same(map1(e, i32, [](Tile t) { return cast(i32, t); }).to_f64(), std::vector<double>{5, -2147483648.0, -3},
              "i64 -> i32 wraps");

  HostTensor g = tensor_of(i32, {0, 5, -3, 256});
  expect_same(map1(g, i32, [](Tile t) { return cast(i32, cast(i1, t)); }).to_f64(), std::vector<double>{0, 1, 1, 1},
              "i32 -> i1 is x != 0 (256 does not truncate to 0)");
  HostTensor h = tensor_of(f32, {0.0, -0.0, 0.5, NAN, -3.0});
  expect_same(map1(h, i32, [](Tile t) { return cast(i32, cast(i1, t)); }).to_f64(), std::vector<double>{0, 0, 1, 1, 1},
              "f32 -> i1 is x != 0");
}

TEST_CASE("bitcast f32 <-> u32 reinterprets the bits, including NaN payloads") {
  HostTensor x(f32, {128});
  x.fill_normal(171, 0, 10);
  x.set_flat(0, -0.0);
  x.set_flat(1, INFINITY);
  auto xs = raw<uint32_t>(x);
  expect_same(raw<uint32_t>(map1(x, u32, [](Tile t) { return bitcast(u32, t); })), xs, "bitcast(u32, f32)");

  HostTensor u(u32, {128});
  u.fill_uniform(172, 0, 4294967295.0);
  set_raw<uint32_t>(u, 0, 0x7FC00001u);  // quiet NaN with a payload
  set_raw<uint32_t>(u, 1, 0x7F800001u);  // signalling NaN
  set_raw<uint32_t>(u, 2, 0xFFBFFFFFu);  // negative signalling NaN
  set_raw<uint32_t>(u, 3, 0x00000001u);  // smallest subnormal
  HostTensor f = map1(u, f32, [](Tile t) { return bitcast(f32, t); });
  expect_same(raw<uint32_t>(f), raw<uint32_t>(u), "bitcast(f32, u32) keeps the bits");
  expect_same(raw<uint32_t>(map1(u, u32, [](Tile t) { return bitcast(u32, bitcast(f32, t)); })), raw<uint32_t>(u),
              "u32 -> f32 -> u32 round trip");
}

TEST_CASE("pack_pairs / unpack_pairs: neighbours of the last dim as one u32 (low half first), and back") {
  HostTensor x(bf16, {64});
  x.fill_normal(173, 0, 3);
  x.set_flat(0, -0.0);
  x.set_flat(1, INFINITY);
  const std::vector<uint16_t> xs = raw<uint16_t>(x);
  // [2, 32] bf16 -> [2, 16] u32, stored flat, and the round trip
  HostTensor w(u32, {32}), back(bf16, {64});
  run("pairs", [&](Builder& k) {
    auto X = k.pointer("X", bf16);
    auto W = k.pointer("W", u32);
    auto Back = k.pointer("Back", bf16);
    Tile words = pack_pairs(reshape(load(X + arange(0, 64)), {2, 32}));
    store(W + arange(0, 32), reshape(words, {32}));
    store(Back + arange(0, 64), reshape(unpack_pairs(bf16, words), {64}));
  }, {x, w, back});
  const std::vector<uint32_t> ws = raw<uint32_t>(w);
  for (size_t j = 0; j < 32; ++j) CHECK(ws[j] == (uint32_t{xs[2 * j]} | uint32_t{xs[2 * j + 1]} << 16));
  CHECK(raw<uint16_t>(back) == xs);
  // an AND on the packed words zeroes halves: what apply_keep_pairs does to dropped probabilities
  HostTensor masked(bf16, {64});
  run("masked", [&](Builder& k) {
    auto X = k.pointer("X", bf16);
    auto Out = k.pointer("Out", bf16);
    Tile words = pack_pairs(load(X + arange(0, 64)));
    store(Out + arange(0, 64), unpack_pairs(bf16, words & 0x0000FFFFu));
  }, {x, masked});
  const std::vector<uint16_t> ms = raw<uint16_t>(masked);
  for (size_t e = 0; e < 64; ++e) CHECK(ms[e] == (e % 2 ? 0 : xs[e]));
}

// ======================================================================= math functions

TEST_CASE("f32 math functions match std:: in double to 1e-6 relative") {
  struct Case {
    const char* name;
    std::function<Tile(Tile)> op;
    double (*ref)(double);
    double lo, hi;
  };
  const Case cases[] = {
      {"exp", [](Tile t) { return exp(t); }, [](double v) { return std::exp(v); }, -20, 20},
      {"exp2", [](Tile t) { return exp2(t); }, [](double v) { return std::exp2(v); }, -30, 30},
      {"log", [](Tile t) { return log(t); }, [](double v) { return std::log(v); }, 1e-3, 1e3},
      {"log2", [](Tile t) { return log2(t); }, [](double v) { return std::log2(v); }, 1e-3, 1e3},
      {"sqrt", [](Tile t) { return sqrt(t); }, [](double v) { return std::sqrt(v); }, 0, 1e4},
      {"rsqrt", [](Tile t) { return rsqrt(t); }, [](double v) { return 1 / std::sqrt(v); }, 1e-4, 1e4},
      {"tanh", [](Tile t) { return tanh(t); }, [](double v) { return std::tanh(v); }, -6, 6},
      {"sin", [](Tile t) { return sin(t); }, [](double v) { return std::sin(v); }, -10, 10},
      {"cos", [](Tile t) { return cos(t); }, [](double v) { return std::cos(v); }, -10, 10},
      {"erf", [](Tile t) { return erf(t); }, [](double v) { return std::erf(v); }, -3, 3},
  };
  uint64_t seed = 181;
  for (const Case& c : cases) {
    HostTensor x(f32, {512});
    x.fill_uniform(seed++, c.lo, c.hi);
    expect_close(map1(x, f32, c.op).to_f64(), ref1(x, [&](double v) { return rounded(f32, c.ref(v)); }), 1e-6,
                 fmt::format("f32 {}", c.name));
  }
  // Special values: exact by IEEE/libm convention.
  HostTensor s = tensor_of(f32, {0.0, -0.0, INFINITY, -INFINITY, NAN, -1.0});
  auto on_specials = [&](Tile (*f)(const Operand&, Loc)) {
    return map1(s, f32, [f](Tile t) { return f(t, Loc::current()); }).to_f64();
  };
  expect_same(on_specials(exp), {1, 1, INFINITY, 0, NAN, rounded(f32, std::exp(-1.0))}, "exp of specials");
  expect_same(on_specials(log), {-INFINITY, -INFINITY, INFINITY, NAN, NAN, NAN}, "log of specials");
  expect_same(on_specials(sqrt), {0.0, -0.0, INFINITY, NAN, NAN, NAN}, "sqrt of specials");
}

TEST_CASE("abs, floor, ceil are exact on f32; abs also works on ints") {
  HostTensor x(f32, {256});
  x.fill_normal(191, 0, 100);
  x.set_flat(0, -0.0);
  x.set_flat(1, -2.5);
  x.set_flat(2, 2.5);
  x.set_flat(3, -INFINITY);
  expect_same(map1(x, f32, [](Tile t) { return abs(t); }).to_f64(), ref1(x, [](double v) { return std::fabs(v); }), "abs");
  expect_same(map1(x, f32, [](Tile t) { return floor(t); }).to_f64(), ref1(x, [](double v) { return std::floor(v); }), "floor");
  expect_same(map1(x, f32, [](Tile t) { return ceil(t); }).to_f64(), ref1(x, [](double v) { return std::ceil(v); }), "ceil");
  HostTensor xi(i32, {64});
  xi.fill_uniform(192, -1000, 1000);
  expect_same(map1(xi, i32, [](Tile t) { return abs(t); }).to_f64(), ref1(xi, [](double v) { return std::fabs(v); }), "i32 abs");
}

// ======================================================================= reductions

TEST_CASE("sum/max/min along each axis of a 2-D tile, negative axes, and over all axes") {
  const int64_t N = 8, M = 16;
  HostTensor x(f32, {N, M});
  x.fill_normal(201, 0, 1);
  HostTensor s0(f32, {M}), s1(f32, {N}), sn(f32, {N}), mx0(f32, {M}), mx1(f32, {N}), mn0(f32, {M}), mn1(f32, {N}),
      mxn(f32, {M}), all(f32, {3});
  run("reduce", [&](Builder& k) {
    auto X = k.pointer("X", f32);
    auto S0 = k.pointer("S0", f32), S1 = k.pointer("S1", f32), SN = k.pointer("SN", f32), MX0 = k.pointer("MX0", f32),
         MX1 = k.pointer("MX1", f32), MN0 = k.pointer("MN0", f32), MN1 = k.pointer("MN1", f32),
         MXN = k.pointer("MXN", f32), ALL = k.pointer("ALL", f32);
    auto xv = load2d(X, N, M);
    auto rn = arange(0, N), rm = arange(0, M);
    store(S0 + rm, sum(xv, 0));
    store(S1 + rn, sum(xv, 1));
    store(SN + rn, sum(xv, -1));
    store(MX0 + rm, max(xv, 0));
    store(MX1 + rn, max(xv, 1));
    store(MN0 + rm, min(xv, 0));
    store(MN1 + rn, min(xv, 1));
    store(MXN + rm, max(xv, -2));
    Tile total = sum(xv);
    CHECK(total.shape().empty());
    store(ALL, total);
    store(ALL + 1, max(xv));
    store(ALL + 2, min(xv));
  }, {x, s0, s1, sn, mx0, mx1, mn0, mn1, mxn, all});

  std::vector<double> ws0(M, 0), wa0(M, 0), ws1(N, 0), wa1(N, 0), wmx0(M, -INFINITY), wmx1(N, -INFINITY), wmn0(M, INFINITY),
      wmn1(N, INFINITY);
  double total = 0, total_abs = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) {
      double v = x.get({i, j});
      auto ui = static_cast<size_t>(i), uj = static_cast<size_t>(j);
      ws0[uj] += v, wa0[uj] += std::fabs(v), ws1[ui] += v, wa1[ui] += std::fabs(v);
      wmx0[uj] = std::max(wmx0[uj], v), wmx1[ui] = std::max(wmx1[ui], v);
      wmn0[uj] = std::min(wmn0[uj], v), wmn1[ui] = std::min(wmn1[ui], v);
      total += v, total_abs += std::fabs(v);
    }
  // A float sum of n terms in any order is within n * 2^-24 * sum|x| of the exact sum.
  auto check_sum = [](const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& abs_sum,
                      int64_t terms, const char* what) {
    for (size_t i = 0; i < got.size(); ++i)
      CHECK_MESSAGE(std::fabs(got[i] - want[i]) <= static_cast<double>(terms) * 0x1p-24 * abs_sum[i],
                    fmt::format("{}[{}]: got {}, want {}", what, i, got[i], want[i]));
  };
  check_sum(s0.to_f64(), ws0, wa0, N, "sum axis 0");
  check_sum(s1.to_f64(), ws1, wa1, M, "sum axis 1");
  expect_same(sn.to_f64(), s1.to_f64(), "sum axis -1 == sum axis 1");
  expect_same(mx0.to_f64(), wmx0, "max axis 0");
  expect_same(mx1.to_f64(), wmx1, "max axis 1");
  expect_same(mn0.to_f64(), wmn0, "min axis 0");
  expect_same(mn1.to_f64(), wmn1, "min axis 1");
  expect_same(mxn.to_f64(), wmx0, "max axis -2 == max axis 0");
  check_sum({all.get_flat(0)}, {total}, {total_abs}, N * M, "sum over all axes");
  CHECK(all.get_flat(1) == *std::max_element(wmx1.begin(), wmx1.end()));
  CHECK(all.get_flat(2) == *std::min_element(wmn1.begin(), wmn1.end()));
}

TEST_CASE("integer reductions are exact (i32 sum wraps like the adds it stands for)") {
  const int64_t N = 4, M = 32;
  HostTensor x(i32, {N, M}), s1(i32, {N}), mx(i32, {M}), total(i32, {1});
  x.fill_uniform(211, INT32_MIN / 8, INT32_MAX / 8);
  run("ireduce", [&](Builder& k) {
    auto X = k.pointer("X", i32), S1 = k.pointer("S1", i32), MX = k.pointer("MX", i32), T = k.pointer("T", i32);
    auto xv = load2d(X, N, M);
    store(S1 + arange(0, N), sum(xv, 1));
    store(MX + arange(0, M), max(xv, 0));
    store(T, sum(xv));
  }, {x, s1, mx, total});
  auto xs = raw<int32_t>(x);
  std::vector<int32_t> ws(N, 0), wm(M, INT32_MIN);
  int32_t wt = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) {
      int32_t v = xs[static_cast<size_t>(i * M + j)];
      ws[static_cast<size_t>(i)] = IntRef<int32_t>::add(ws[static_cast<size_t>(i)], v);
      wm[static_cast<size_t>(j)] = std::max(wm[static_cast<size_t>(j)], v);
      wt = IntRef<int32_t>::add(wt, v);
    }
  expect_same(raw<int32_t>(s1), ws, "i32 sum axis 1");
  expect_same(raw<int32_t>(mx), wm, "i32 max axis 0");
  CHECK(raw<int32_t>(total)[0] == wt);
}

// ======================================================================= dot

namespace {

// C = A @ B (+ Acc) in float64 from the stored (already rounded) inputs.
std::vector<double> matmul_ref(const HostTensor& a, const HostTensor& b, const HostTensor* acc) {
  const int64_t M = a.sizes()[0], K = a.sizes()[1], N = b.sizes()[1];
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = acc ? acc->get({i, j}) : 0.0;
      for (int64_t p = 0; p < K; ++p) s += a.get({i, p}) * b.get({p, j});
      c[static_cast<size_t>(i * N + j)] = s;
    }
  return c;
}

// Runs c = dot(a, b[, acc]) as one program.
HostTensor run_dot(HostTensor& a, HostTensor& b, HostTensor* acc) {
  const int64_t M = a.sizes()[0], K = a.sizes()[1], N = b.sizes()[1];
  const DType out_dtype = a.dtype() == i8 ? i32 : f32;
  HostTensor c(out_dtype, {M, N});
  HostTensor unused_acc(out_dtype, {M, N});  // the kernel always declares Acc; it reads it only with_acc
  unused_acc.fill(1);
  run("dot_kernel", [&](Builder& k) {
    auto A = k.pointer("A", a.dtype()), B = k.pointer("B", b.dtype()), Acc = k.pointer("Acc", out_dtype),
         C = k.pointer("C", out_dtype);
    auto av = load2d(A, M, K), bv = load2d(B, K, N);
    Tile r = acc ? dot(av, bv, load2d(Acc, M, N)) : dot(av, bv);
    CHECK(r.dtype() == out_dtype);
    CHECK(r.shape() == Shape{M, N});
    store2d(C, r);
  }, {a, b, acc ? *acc : unused_acc, c});
  return c;
}

}  // namespace

TEST_CASE("dot of f32, bf16, f16 and fp8 tiles accumulates in f32, with and without acc, non-square shapes") {
  struct Case {
    DType d;
    int64_t M, K, N;
    bool with_acc;
  };
  const Case cases[] = {{f32, 16, 32, 8, false},  {f32, 16, 32, 8, true},      {bf16, 16, 32, 8, false},
                        {bf16, 32, 16, 64, true},  {f16, 16, 64, 16, false},    {f16, 8, 32, 16, true},
                        {f8e4m3, 16, 32, 8, true}, {f8e5m2, 16, 32, 16, false}};
  uint64_t seed = 221;
  for (const Case& c : cases) {
    HostTensor a(c.d, {c.M, c.K}), b(c.d, {c.K, c.N}), acc(f32, {c.M, c.N});
    a.fill_normal(seed++, 0, 1);
    b.fill_normal(seed++, 0, 1);
    acc.fill_normal(seed++, 0, 4);
    HostTensor out = run_dot(a, b, c.with_acc ? &acc : nullptr);
    double err = rt::rel_error(out.to_f64(), matmul_ref(a, b, c.with_acc ? &acc : nullptr));
    CHECK_MESSAGE(err < 1e-6, fmt::format("dot {} [{},{}]x[{},{}]{}: relative error {}", tilejit::ir::name(c.d), c.M, c.K,
                                          c.K, c.N, c.with_acc ? " + acc" : "", err));
  }
}

TEST_CASE("dot of i8 tiles accumulates exactly in i32, with and without acc") {
  HostTensor a(i8, {16, 64}), b(i8, {64, 32}), acc(i32, {16, 32});
  a.fill_uniform(231, -128, 127);
  b.fill_uniform(232, -128, 127);
  acc.fill_uniform(233, -100000, 100000);
  for (bool with_acc : {false, true}) {
    HostTensor out = run_dot(a, b, with_acc ? &acc : nullptr);
    expect_same(out.to_f64(), matmul_ref(a, b, with_acc ? &acc : nullptr), with_acc ? "i8 dot + acc" : "i8 dot");
  }
}

// ======================================================================= program geometry

TEST_CASE("program_id and num_programs over a 3-D grid: every program sees its own ids") {
  const int64_t gx = 3, gy = 2, gz = 4, fields = 6;
  HostTensor out(i32, {gz, gy, gx, fields});
  run("geometry", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    auto x = program_id(0), y = k.program_id(1), z = program_id(2);
    auto base = Out + ((z * num_programs(1) + y) * k.num_programs(0) + x) * fields;
    store(base, x);
    store(base + 1, y);
    store(base + 2, z);
    store(base + 3, num_programs(0));
    store(base + 4, num_programs(1));
    store(base + 5, num_programs(2));
  }, {out}, {gx, gy, gz});
  std::vector<double> want;
  for (int64_t z = 0; z < gz; ++z)
    for (int64_t y = 0; y < gy; ++y)
      for (int64_t x = 0; x < gx; ++x)
        for (double v : {double(x), double(y), double(z), double(gx), double(gy), double(gz)}) want.push_back(v);
  expect_same(out.to_f64(), want, "ids and grid sizes per program");
}

TEST_CASE("cdiv: the Tile version on runtime ints and the constexpr int version") {
  static_assert(cdiv(10, 4) == 3 && cdiv(8, 4) == 2 && cdiv(1, 128) == 1);
  CHECK(cdiv(int64_t{1000}, int64_t{128}) == 8);
  HostTensor a(i32, {64}), b(i32, {64}), out(i32, {64}), sc(i32, {1});
  a.fill_uniform(241, 1, 100000);
  b.fill_uniform(242, 1, 300);
  run("cdiv_kernel", [&](Builder& k) {
    auto A = k.pointer("A", i32), B = k.pointer("B", i32), Out = k.pointer("Out", i32), S = k.pointer("S", i32);
    auto n = k.scalar<int>("n");
    auto offs = arange(0, 64);
    store(Out + offs, cdiv(load(A + offs), load(B + offs)));
    store(S, cdiv(n, 16));
  }, {a, b, out, sc, 1000});
  expect_same(out.to_f64(), ref2(a, b, [](double p, double q) { return std::ceil(p / q); }), "cdiv(tile, tile)");
  CHECK(sc.get_flat(0) == 63);  // ceil(1000 / 16)
}
