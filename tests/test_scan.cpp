// dsl/combine.hpp: associative_scan, reduce with a combine, cumsum and cumprod in the interpreter
// against host references (order-sensitive combines, several tiles at once, NaN, booleans and
// narrow dtypes, both directions and axes), the errors a user gets, and every form lowered through
// both backends and assembled for sm_90a (layouts with the axis in registers, lanes and warps).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
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

// Loads X[R, C] and stores fn(x) into Y (of Y's shape): one program.
Kernel rows_kernel(DType in, const std::function<void(Builder&, const Tile&)>& body) {
  return kernel("scan_case", [=](Builder& b) {
    auto X = b.pointer("X", in);
    Tile r = arange(0, R), c = arange(0, C);
    body(b, load(X + r[col] * C + c[row]));
  });
}

Tile store_rc(const Tensor& Y, const Tile& v) {  // v[R, C] into Y[R, C]
  Tile r = arange(0, R), c = arange(0, C);
  store(Y.ptr() + r[col] * C + c[row], v);
  return v;
}

}  // namespace

TEST_CASE("scan: cumsum and cumprod along either axis, forwards and backwards, against a host loop") {
  for (int axis : {0, 1})
    for (bool reverse : {false, true}) {
      INFO("axis " << axis << " reverse " << reverse);
      const Kernel k = kernel("cumsum_case", [=](Builder& b) {
        auto X = b.tensor("X", i32, 2), S = b.tensor("S", i32, 2), P = b.tensor("P", f32, 2);
        Tile x = load(X.block({0, 0}, {R, C}));
        store(S.block({0, 0}, {R, C}), cumsum(x, axis, reverse));
        store(P.block({0, 0}, {R, C}), cumprod(cast(f32, x), axis, reverse));
      });
      rt::HostTensor x(i32, {R, C}), s(i32, {R, C}), p(f32, {R, C});
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = 0; j < C; ++j) x.set({i, j}, static_cast<double>((i * 7 + j * 13) % 5 - 2));  // -2..2: exact products
      for (int64_t j = 0; j < C; j += 9) x.set({1, j}, 1.0);
      rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(s), rt::Arg(p)});
      const int64_t lines = axis == 0 ? C : R, len = axis == 0 ? R : C;
      for (int64_t line = 0; line < lines; ++line) {
        int64_t acc_s = 0;
        double acc_p = 1;
        for (int64_t t = 0; t < len; ++t) {
          const int64_t pos = reverse ? len - 1 - t : t;
          const std::vector<int64_t> at = axis == 0 ? std::vector<int64_t>{pos, line} : std::vector<int64_t>{line, pos};
          acc_s += static_cast<int64_t>(x.get(at));
          acc_p = static_cast<double>(static_cast<float>(acc_p * x.get(at)));
          REQUIRE(s.get(at) == static_cast<double>(acc_s));
          REQUIRE(p.get(at) == acc_p);
        }
      }
    }
}

TEST_CASE("scan: booleans and narrow integers accumulate in 32 bits, 16-bit floats in f32") {
  DType out_bool{}, out_i8{}, out_u16{}, out_bf16{};  // (tiles die with the build: keep their dtypes)
  const Kernel k = kernel("cumsum_dtypes", [&](Builder& b) {
    auto X = b.pointer("X", i8), Y = b.pointer("Y", i32), Z = b.pointer("Z", f32), U = b.pointer("U", u32);
    Tile i = arange(0, 128);
    Tile x = load(X + i);
    Tile counts = cumsum(x > 0, 0), sums = cumsum(x, 0), sums_u = cumsum(cast(u16, x), 0), sums_f = cumsum(cast(bf16, x), 0);
    out_bool = counts.dtype();
    out_i8 = sums.dtype();
    out_u16 = sums_u.dtype();
    out_bf16 = sums_f.dtype();
    store(Y + i, counts);
    store(Y + 128 + i, sums);
    store(U + i, sums_u);
    store(Z + i, sums_f);
  });
  const ir::Function fn = k.build();
  CHECK(out_bool == i32);
  CHECK(out_i8 == i32);
  CHECK(out_u16 == u32);
  CHECK(out_bf16 == f32);
  rt::HostTensor x(i8, {128}), y(i32, {256}), z(f32, {128}), u(u32, {128});
  for (int64_t i = 0; i < 128; ++i) x.set({i}, static_cast<double>(i % 2 ? 127 - i % 50 : -(i % 37)));
  rt::interpret(fn, {1}, {rt::Arg(x), rt::Arg(y), rt::Arg(z), rt::Arg(u)});
  int64_t positives = 0, total = 0;
  uint32_t total_u = 0;
  for (int64_t i = 0; i < 128; ++i) {
    positives += x.get({i}) > 0;
    total += static_cast<int64_t>(x.get({i}));  // 127 * 64 would wrap an i8: the sum does not
    total_u += static_cast<uint16_t>(static_cast<int16_t>(x.get({i})));
    REQUIRE(y.get({i}) == static_cast<double>(positives));
    REQUIRE(y.get({128 + i}) == static_cast<double>(total));
    REQUIRE(u.get({i}) == static_cast<double>(total_u));
    REQUIRE(z.get({i}) == static_cast<double>(total));  // small integers: exact in f32
  }
  CHECK(total > 127);
}

// A first-order linear recurrence h_t = a_t h_{t-1} + b_t as a scan of affine maps (Mamba's,
// Triton's example): composing maps is associative but not commutative, so a scan that swapped
// its operands anywhere gives other numbers. Integers: exact.
TEST_CASE("scan: an order-sensitive combine over two tiles (affine maps) matches the recurrence") {
  for (bool reverse : {false, true}) {
    INFO("reverse " << reverse);
    const Kernel k = rows_kernel(i32, [reverse](Builder& b, const Tile& x) {
      auto Y = b.tensor("Y", i32, 2), A = b.tensor("A", i32, 2);
      Tile a = (x % 3) - 1, bias = x;
      // p comes first in the scan's direction (backwards too): the map q applies after p
      std::vector<Tile> h = associative_scan({a, bias}, 1, [](const std::vector<Tile>& p, const std::vector<Tile>& q) {
        return std::vector<Tile>{p[0] * q[0], q[0] * p[1] + q[1]};
      }, reverse);
      store_rc(Y, h[1]);
      store_rc(A, h[0]);
    });
    rt::HostTensor x(i32, {R, C}), y(i32, {R, C}), a(i32, {R, C});
    x.fill_uniform(7, -9, 9);
    rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(y), rt::Arg(a)});
    for (int64_t r = 0; r < R; ++r) {
      int64_t h = 0, prod = 1;
      for (int64_t t = 0; t < C; ++t) {
        const int64_t c = reverse ? C - 1 - t : t;
        const auto xv = static_cast<int64_t>(x.get({r, c}));
        const int64_t av = ((xv % 3) + 3) % 3 == 0 ? -1 : (xv % 3) - 1;  // C's remainder keeps the sign
        h = static_cast<int32_t>(av * h + xv);
        prod = static_cast<int32_t>(prod * av);
        REQUIRE(y.get({r, c}) == static_cast<double>(h));
        REQUIRE(a.get({r, c}) == static_cast<double>(prod));
      }
    }
  }
}

// argmax with its index in one reduce: the larger value wins, the first index among equals, a
// NaN beats everything (the first NaN): PyTorch's argmax.
TEST_CASE("scan: reduce over (value, index) pairs gives argmax with NaN rules; a plain reduce to a scalar") {
  const auto argmax_combine = [](const std::vector<Tile>& p, const std::vector<Tile>& q) {
    Tile p_nan = p[0] != p[0], q_nan = q[0] != q[0];
    Tile take_p = p_nan | ((!q_nan) & ((p[0] > q[0]) | ((p[0] == q[0]) & (p[1] < q[1]))));
    return std::vector<Tile>{where(take_p, p[0], q[0]), where(take_p, p[1], q[1])};
  };
  for (int axis : {0, 1}) {
    INFO("axis " << axis);
    const Kernel k = rows_kernel(f32, [&](Builder& b, const Tile& x) {
      auto V = b.pointer("V", f32), I = b.pointer("I", i32), T = b.pointer("T", f32);
      const int64_t n = axis == 0 ? C : R;
      Tile idx = axis == 0 ? broadcast_to(arange(0, R)[col], {R, C}) : broadcast_to(arange(0, C)[row], {R, C});
      std::vector<Tile> m = reduce({x, idx}, axis, argmax_combine);
      store(V + arange(0, n), m[0]);
      store(I + arange(0, n), m[1]);
      // a reduce of a reduce: the largest |x| of the tile, a scalar
      Tile biggest = reduce(reduce(abs(x), axis, [](const Tile& p, const Tile& q) { return maximum(p, q); }), 0,
                            [](const Tile& p, const Tile& q) { return maximum(p, q); });
      store(T, biggest);
    });
    rt::HostTensor x(f32, {R, C}), v(f32, {C}), ix(i32, {C}), t(f32, {1});
    x.fill_uniform(3, -4, 4);
    for (int64_t j = 0; j < C; ++j) x.set({2, j}, std::round(x.get({2, j})));  // ties
    x.set({1, 5}, NAN);
    x.set({3, 5}, NAN);
    x.set({0, 9}, 100.0);
    x.set({3, 9}, 100.0);
    rt::interpret(k.build(), {1}, {rt::Arg(x), rt::Arg(v), rt::Arg(ix), rt::Arg(t)});
    const int64_t lines = axis == 0 ? C : R, len = axis == 0 ? R : C;
    for (int64_t line = 0; line < lines; ++line) {
      int64_t best = 0;
      const auto at = [&](int64_t j) { return axis == 0 ? x.get({j, line}) : x.get({line, j}); };
      for (int64_t j = 1; j < len; ++j) {
        const double bv = at(best), xv = at(j);
        if (std::isnan(bv)) break;
        if (std::isnan(xv) || xv > bv) best = j;
      }
      CHECK(ix.get({line}) == static_cast<double>(best));
      if (std::isnan(at(best))) CHECK(std::isnan(v.get({line})));
      else CHECK(v.get({line}) == at(best));
    }
    CHECK(std::isnan(t.get({0})));  // maximum propagates the NaN
  }
}

TEST_CASE("scan: errors name the function, the argument and what is valid") {
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { cumsum(arange(0, 16), 1); }).build(),
                    doctest::Contains("cumsum: axis 1 is out of range for i32[16] (valid: 0..0 or negative from the end)"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) {
                      associative_scan(arange(0, 16), 0, [](const Tile& a, const Tile& b) { return cast(f32, a + b); });
                    }).build(),
                    doctest::Contains("the combine function's result 0 is f32, expected i32"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) {
                      reduce({arange(0, 16), arange(0, 16)}, 0,
                             [](const std::vector<Tile>& a, const std::vector<Tile>&) { return std::vector<Tile>{a[0]}; });
                    }).build(),
                    doctest::Contains("the combine function returned 1 value for 2 tiles"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) { 
                      reduce({arange(0, 16), arange(0, 8)}, 0, [](const std::vector<Tile>& a, const std::vector<Tile>&) { return a; });
                    }).build(),
                    doctest::Contains("tile 1 is i32[8], tile 0 is i32[16]"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) {
                      Tile outer = arange(0, 16);
                      reduce(outer, 0, [&](const Tile& a, const Tile& b) { return a + b + sum(outer, 0); });
                    }).build(),
                    doctest::Contains("a combine function may use only constants and elementwise operations on scalars, not 'reduce'"));
  CHECK_THROWS_WITH(kernel("bad", [](Builder&) {
                      Tile outer = arange(0, 16);
                      reduce(outer, 0, [&](const Tile& a, const Tile&) { return a + outer; });
                    }).build(),
                    doctest::Contains("combine function's result 0 is i32[16], expected i32"));
}

TEST_CASE("scan: every form lowers through both backends and assembles for sm_90a") {
  if (testing::no_ptxas()) return;
  struct Case {
    ir::Shape shape;
    int axis, warps;
    DType dtype;
  };
  // the axis in registers and lanes ([4, 64]: 4 warps over rows), across warps ([1024] over 8, and
  // [64, 64] axis 0), 64-bit and 16-bit values (widened for shuffles and shared memory)
  const Case cases[] = {{{4, 64}, 1, 4, f32}, {{4, 64}, 0, 4, i32}, {{1024}, 0, 8, f32}, {{64, 64}, 0, 4, f64},
                        {{16, 128}, 1, 8, i64}, {{32, 32}, 1, 4, bf16}, {{128}, 0, 4, i8}};
  for (const Case& c : cases) {
    const Kernel k = kernel("scan_lowering", [c](Builder& kb) {
      auto X = kb.tensor("X", c.dtype, static_cast<int>(c.shape.size()));
      auto S = kb.tensor("S", c.dtype, static_cast<int>(c.shape.size()));
      auto M = kb.tensor("M", c.dtype, static_cast<int>(c.shape.size()));
      const std::vector<Operand> zero(c.shape.size(), Operand(0));
      Tile x = load(X.block(zero, c.shape));
      Tile idx = cast(i32, x);
      Tile s = associative_scan(x, c.axis, [](const Tile& a, const Tile& b) { return a + b; }, c.warps == 8);
      std::vector<Tile> m = reduce({x, idx}, c.axis, [](const std::vector<Tile>& a, const std::vector<Tile>& b) {
        Tile take_a = a[0] >= b[0];
        return std::vector<Tile>{where(take_a, a[0], b[0]), where(take_a, a[1], b[1])};
      });
      store(S.block(zero, c.shape), s);
      Tile back = expand_dims(m[0] + cast(c.dtype, m[1]), c.axis);
      store(M.block(zero, back.shape()), back);
    });
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(ir::shape_string(c.shape) << " axis " << c.axis << " " << ir::name(c.dtype) << " " << jit::to_string(be));
      testing::assemble_sm90a(k.build(), be, c.warps);
    }
  }
  // in an MMA accumulator's layout (its axis bits are register, lane and warp bits too: no exchange)
  const Kernel mma = kernel("scan_of_dot", [](Builder& kb) {
    auto A = kb.tensor("A", bf16, 2), B = kb.tensor("B", bf16, 2), S = kb.tensor("S", f32, 2);
    Tile acc = dot(load(A.block({0, 0}, {64, 32})), load(B.block({0, 0}, {32, 64})), zeros(f32, {64, 64}));
    store(S.block({0, 0}, {64, 64}), cumsum(acc, 1) + cumsum(acc, 0, true));
  });
  for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(be));
    const jit::CompiledKernel ck = testing::assemble_sm90a(mma.build(), be, 4);
    CHECK(ck.ptx.find("mma.sync") != std::string::npos);
  }
}
