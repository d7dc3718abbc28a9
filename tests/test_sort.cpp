// dsl/sort.hpp: xor_permute, flip, sort, argsort and topk in the interpreter against std::sort /
// std::stable_sort with the documented order (-0 before +0, NaN last), along either axis and in
// both directions, the errors a user gets, and each lowered through both backends and assembled
// for sm_90a (axis bits in registers, lanes and warps).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "ptxas_testing.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;

namespace {

constexpr int64_t R = 4, C = 64;

// The documented order on doubles: -0 before +0, NaN after everything (NaNs equal).
bool order_less(double a, double b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  if (a == b) return std::signbit(a) && !std::signbit(b);
  return a < b;
}

bool same_bits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// The line `line` of a [R, C] tensor along `axis`.
std::vector<double> line_of(const rt::HostTensor& t, int axis, int64_t line) {
  std::vector<double> v;
  const int64_t len = axis == 0 ? R : C;
  for (int64_t j = 0; j < len; ++j) v.push_back(axis == 0 ? t.get({j, line}) : t.get({line, j}));
  return v;
}

// topk's k values and positions of line `line` of the input `v`: the largest first (NaN largest),
// the first position among equals first.
void check_topk_line(const std::vector<double>& v, const rt::HostTensor& tv, const rt::HostTensor& ti, int axis, int64_t line, int64_t k) {
  std::vector<int64_t> top(v.size());
  std::iota(top.begin(), top.end(), 0);
  std::stable_sort(top.begin(), top.end(), [&](int64_t p, int64_t q) { return order_less(v[static_cast<size_t>(q)], v[static_cast<size_t>(p)]); });
  for (int64_t j = 0; j < k; ++j) {
    const std::vector<int64_t> at = axis == 0 ? std::vector<int64_t>{j, line} : std::vector<int64_t>{line, j};
    REQUIRE(ti.get(at) == static_cast<double>(top[static_cast<size_t>(j)]));
    REQUIRE(same_bits(tv.get(at), v[static_cast<size_t>(top[static_cast<size_t>(j)])]));
  }
}

rt::HostTensor awkward_floats() {
  rt::HostTensor x(f32, {R, C});
  x.fill_uniform(11, -3, 3);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; j += 3) x.set({i, j}, std::round(x.get({i, j})));  // many ties
  const double special[] = {NAN, -0.0, 0.0, INFINITY, -INFINITY, NAN, 0.0, -0.0};
  for (int64_t s = 0; s < 8; ++s) x.set({s % R, (s * 7) % C}, special[s]);
  return x;
}

}  // namespace

TEST_CASE("sort: values, stable argsort and topk along either axis, both directions, against the host") {
  for (int axis : {0, 1})
    for (bool descending : {false, true}) {
      INFO("axis " << axis << " descending " << descending);
      const int64_t k = axis == 0 ? 2 : 8, lines = axis == 0 ? C : R, len = axis == 0 ? R : C;
      const Kernel kern = kernel("sort_case", [=](Builder& b) {
        auto X = b.tensor("X", f32, 2), S = b.tensor("S", f32, 2), A = b.tensor("A", i32, 2);
        auto TV = b.tensor("TV", f32, 2), TI = b.tensor("TI", i32, 2);
        Tile x = load(X.block({0, 0}, {R, C}));
        store(S.block({0, 0}, {R, C}), sort(x, axis, descending));
        store(A.block({0, 0}, {R, C}), argsort(x, axis, descending));
        TopK top = topk(x, k, axis);
        const Shape ts = axis == 0 ? Shape{k, C} : Shape{R, k};
        store(TV.block({0, 0}, ts), top.values);
        store(TI.block({0, 0}, ts), top.indices);
      });
      rt::HostTensor x = awkward_floats(), s(f32, {R, C}), a(i32, {R, C});
      rt::HostTensor tv(f32, axis == 0 ? ir::Shape{k, C} : ir::Shape{R, k}), ti(i32, axis == 0 ? ir::Shape{k, C} : ir::Shape{R, k});
      rt::interpret(kern.build(), {1}, {rt::Arg(x), rt::Arg(s), rt::Arg(a), rt::Arg(tv), rt::Arg(ti)});
      for (int64_t line = 0; line < lines; ++line) {
        const std::vector<double> v = line_of(x, axis, line), got = line_of(s, axis, line), got_idx = line_of(a, axis, line);
        std::vector<int64_t> idx(static_cast<size_t>(len));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t p, int64_t q) {
          return descending ? order_less(v[static_cast<size_t>(q)], v[static_cast<size_t>(p)]) : order_less(v[static_cast<size_t>(p)], v[static_cast<size_t>(q)]);
        });
        for (int64_t j = 0; j < len; ++j) {
          const auto u = static_cast<size_t>(j);
          REQUIRE(same_bits(got[u], v[static_cast<size_t>(idx[u])]));
          REQUIRE(got_idx[u] == static_cast<double>(idx[u]));
        }
        check_topk_line(v, tv, ti, axis, line, k);
      }
    }
}

// topk up to 32 bits sorts one u64 key per element (the value's order, then the position) and
// gathers the values; 64-bit dtypes keep the (value, position) network. Each dtype's extremes,
// ties, NaN payloads and signed zeros, against the host.
TEST_CASE("sort: topk of every dtype (keyed up to 32 bits, else value and position) against the host") {
  const std::vector<double> ints{-2147483648.0, 2147483647.0, -1, 0, 5, 5, -7, 100};
  const std::vector<double> unsigneds{4294967295.0, 2147483648.0, 2147483647.0, 0, 1, 1, 3000000000.0, 7};
  const std::vector<double> floats{NAN, -0.0, 0.0, INFINITY, -INFINITY, 1.5, -1.5, 1.5};
  struct Case {
    DType dtype;
    std::vector<double> specials;
  };
  const Case cases[] = {{i32, ints}, {i8, {-128, 127, -1, 0, 5, 5, -7, 100}}, {u8, {255, 128, 0, 1, 1, 7, 200, 3}},
                        {i16, {-32768, 32767, -1, 0, 5, 5, -7, 100}}, {u32, unsigneds}, {f32, floats}, {f16, floats},
                        {bf16, floats}, {f64, floats}, {i64, {-9007199254740992.0, 9007199254740992.0, -1, 0, 5, 5, -7, 100}},
                        {u16, {65535, 32768, 0, 1, 1, 7, 40000, 3}}};
  for (const Case& c : cases) {
    INFO(ir::name(c.dtype));
    constexpr int64_t n = 64, k = 16;
    const Kernel kern = kernel("topk_dtype", [&](Builder& b) {
      auto X = b.tensor("X", c.dtype, 2), TV = b.tensor("TV", c.dtype, 2), TI = b.tensor("TI", i32, 2);
      TopK top = topk(load(X.block({0, 0}, {R, n})), k, 1);
      store(TV.block({0, 0}, {R, k}), top.values);
      store(TI.block({0, 0}, {R, k}), top.indices);
    });
    rt::HostTensor x(c.dtype, {R, n}), tv(c.dtype, {R, k}), ti(i32, {R, k});
    if (ir::is_float(c.dtype)) x.fill_uniform(12, -4, 4);
    else x.fill_uniform(12, ir::is_signed(c.dtype) ? -50 : 0, 50);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < n; j += 2) x.set({i, j}, std::round(x.get({i, j})));  // ties
    for (int64_t s = 0; s < 8; ++s) x.set({s % R, (s * 9) % n}, c.specials[static_cast<size_t>(s)]), x.set({(s + 1) % R, (s * 5 + 3) % n}, c.specials[static_cast<size_t>(s)]);
    rt::interpret(kern.build(), {1}, {rt::Arg(x), rt::Arg(tv), rt::Arg(ti)});
    for (int64_t line = 0; line < R; ++line) {
      std::vector<double> v;
      for (int64_t j = 0; j < n; ++j) v.push_back(x.get({line, j}));
      check_topk_line(v, tv, ti, 1, line, k);
    }
  }
}

// topk's rounds (blocks of k sorted, then the axis halved by pairs of blocks): every k from 1 to
// the axis, along both axes, ties, NaN and signed zeros, against a stable host sort.
TEST_CASE("sort: topk for every power-of-two k along both axes") {
  rt::HostTensor x = awkward_floats();
  for (int axis : {0, 1}) {
    const int64_t len = axis == 0 ? R : C, lines = axis == 0 ? C : R;
    for (int64_t k = 1; k <= len; k *= 2) {
      INFO("axis " << axis << " k " << k);
      const Kernel kern = kernel("topk_case", [=](Builder& b) {
        auto X = b.tensor("X", f32, 2), TV = b.tensor("TV", f32, 2), TI = b.tensor("TI", i32, 2);
        TopK top = topk(load(X.block({0, 0}, {R, C})), k, axis);
        const Shape ts = axis == 0 ? Shape{k, C} : Shape{R, k};
        store(TV.block({0, 0}, ts), top.values);
        store(TI.block({0, 0}, ts), top.indices);
      });
      const ir::Shape ts = axis == 0 ? ir::Shape{k, C} : ir::Shape{R, k};
      rt::HostTensor tv(f32, ts), ti(i32, ts);
      rt::interpret(kern.build(), {1}, {rt::Arg(x), rt::Arg(tv), rt::Arg(ti)});
      for (int64_t line = 0; line < lines; ++line) {
        check_topk_line(line_of(x, axis, line), tv, ti, axis, line, k);
      }
    }
  }
}

TEST_CASE("sort: integers and booleans; several tiles move together; flip and xor_permute") {
  const Kernel k = kernel("sort_ints", [](Builder& b) {
    auto X = b.pointer("X", u8), Y = b.pointer("Y", u8), P = b.pointer("P", i32), F = b.pointer("F", i32), B = b.pointer("B", i32);
    Tile i = arange(0, 128);
    Tile x = load(X + i);
    std::vector<Tile> both = sort({x, i * 3}, 0, true);  // payload travels with its key
    store(Y + i, both[0]);
    store(P + i, both[1]);
    store(F + i, flip(i, 0) * 1000 + xor_permute(i, 0, 5));
    store(B + i, cast(i32, sort(x > 100, 0)));
  });
  rt::HostTensor x(u8, {128}), y(u8, {128}), p(i32, {128}), f(i32, {128}), bo(i32, {128});
  x.fill_uniform(4, 0, 255);
  rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(y), rt::Arg(p), rt::Arg(f), rt::Arg(bo)});
  std::vector<std::pair<double, int64_t>> ref;
  int64_t big = 0;
  for (int64_t i = 0; i < 128; ++i) {
    ref.push_back({x.get({i}), i * 3});
    big += x.get({i}) > 100;
  }
  // descending by key, ties by payload ascending
  std::sort(ref.begin(), ref.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (int64_t i = 0; i < 128; ++i) {
    REQUIRE(y.get({i}) == ref[static_cast<size_t>(i)].first);
    REQUIRE(p.get({i}) == static_cast<double>(ref[static_cast<size_t>(i)].second));
    REQUIRE(f.get({i}) == static_cast<double>((127 - i) * 1000 + (i ^ 5)));
    REQUIRE(bo.get({i}) == (i >= 128 - big ? 1.0 : 0.0));
  }
}

TEST_CASE("sort: errors name the function, the argument and what is valid") {
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { topk(arange(0, 64), 3, 0); }).build(),
                    doctest::Contains("topk: k = 3 for an axis of 64 (valid: a power of two from 1 to 64)"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { xor_permute(arange(0, 16), 0, 16); }).build(),
                    doctest::Contains("xor_permute: mask 16 is out of range for an axis of 16 (valid: 0..15)"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { sort(arange(0, 16), 2); }).build(),
                    doctest::Contains("sort: axis 2 is out of range for i32[16]"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { sort({arange(0, 16), arange(0, 8)}, 0); }).build(),
                    doctest::Contains("sort: tile 1 is i32[8], tile 0 is i32[16]"));
}

TEST_CASE("sort: sort, topk and flip lower through both backends and assemble for sm_90a") {
  if (testing::no_ptxas()) return;
  struct Case {
    ir::Shape shape;
    int axis, warps;
  };
  for (const Case& c : {Case{{4, 64}, 1, 4}, Case{{1024}, 0, 8}, Case{{64, 16}, 0, 4}, Case{{16, 128}, 1, 8}}) {
    const Kernel k = kernel("sort_lowering", [c](Builder& kb) {
      const int rank = static_cast<int>(c.shape.size());
      auto X = kb.tensor("X", f32, rank), S = kb.tensor("S", f32, rank), I = kb.tensor("I", i32, rank);
      const std::vector<Operand> zero(c.shape.size(), Operand(0));
      Tile x = load(X.block(zero, c.shape));
      store(S.block(zero, c.shape), sort(x, c.axis) + flip(x, c.axis));
      TopK top = topk(x, 4, c.axis);
      store(I.block(zero, top.indices.shape()), top.indices + cast(i32, top.values));
    });
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(ir::shape_string(c.shape) << " axis " << c.axis << " " << jit::to_string(be));
      testing::assemble_sm90a(k.build(), be, c.warps);
    }
  }
}

TEST_CASE("gather: take_along_axis along either axis, another length along the axis, errors") {
  const Kernel k = kernel("gather_case", [](Builder& b) {
    auto X = b.tensor("X", f32, 2), I0 = b.tensor("I0", i32, 2), I1 = b.tensor("I1", i64, 2);
    auto Y0 = b.tensor("Y0", f32, 2), Y1 = b.tensor("Y1", f32, 2);
    Tile x = load(X.block({0, 0}, {R, C}));
    store(Y0.block({0, 0}, {8, C}), gather(x, load(I0.block({0, 0}, {8, C})), 0));   // 8 picks from 4 rows
    store(Y1.block({0, 0}, {R, 16}), gather(x, load(I1.block({0, 0}, {R, 16})), 1));  // 16 of 64 columns
  });
  rt::HostTensor x(f32, {R, C}), i0(i32, {8, C}), i1(i64, {R, 16}), y0(f32, {8, C}), y1(f32, {R, 16});
  x.fill_uniform(21, -5, 5);
  x.set({2, 3}, NAN);
  i0.fill_uniform(22, 0, R - 1);
  i1.fill_uniform(23, 0, C - 1);
  rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(i0), rt::Arg(i1), rt::Arg(y0), rt::Arg(y1)});
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c = 0; c < C; ++c) REQUIRE(same_bits(y0.get({r, c}), x.get({static_cast<int64_t>(i0.get({r, c})), c})));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < 16; ++c) REQUIRE(same_bits(y1.get({r, c}), x.get({r, static_cast<int64_t>(i1.get({r, c}))})));
  // an index outside the axis: the interpreter names it
  i1.set({1, 2}, 64);
  CHECK_THROWS_WITH(rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(i0), rt::Arg(i1), rt::Arg(y0), rt::Arg(y1)}),
                    doctest::Contains("gather: index 64 is outside the axis of 64 elements (valid: 0..63)"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { gather(arange(0, 16), arange(0, 16) > 3, 0); }).build(),
                    doctest::Contains("gather: the index must be an integer tile, got i1[16]"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { gather(reshape(arange(0, 16), {4, 4}), reshape(arange(0, 8), {2, 4}), 1); }).build(),
                    doctest::Contains("differ in dimension 0 (only the axis 1 may)"));
  if (testing::no_ptxas()) return;
  for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(be));
    testing::assemble_sm90a(k.build(), be, 4);
  }
}
