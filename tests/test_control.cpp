// Structured control flow: for_range with loop-carried Vars (what is and is not carried, runtime
// and program-dependent bounds, zero-trip loops, steps, nesting), if_ with Vars changed in one or
// both branches, Var compound assignment, and the build errors for misuse, with their locations.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dsl/lang.hpp"
#include "runtime/interpreter.hpp"
#include "host_bits.hpp"

using namespace tilejit::lang;
namespace ir = tilejit::ir;
namespace rt = tilejit::runtime;
using rt::HostTensor;

namespace {

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

void expect_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  std::string detail;
  for (size_t i = 0; i < got.size(); ++i)
    if (!same(got[i], want[i]) && ++bad <= 6) detail += fmt::format("\n  [{}] got {}, want {}", i, got[i], want[i]);
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} of {} elements differ{}", what, bad, got.size(), detail));
}

float f32_add(float a, float b) { return static_cast<float>(double(a) + double(b)); }

// The ops of `kind` anywhere in the function, outer before inner.
std::vector<const ir::Op*> find_ops(const ir::Function& f, ir::OpKind kind) {
  std::vector<const ir::Op*> found;
  ir::walk(f.body, [&](const ir::Op& op) {
    if (op.kind == kind) found.push_back(&op);
  });
  return found;
}

// The BuildError message of building `k` (fails the test if it builds).
std::string build_error(const Kernel& k) {
  try {
    k.build();
  } catch (const BuildError& e) {
    return e.what();
  }
  FAIL("kernel '" << k.name() << "' built, but a BuildError was expected");
  return {};
}

// "test_control.cpp:<line>", as the error messages print a location of this file.
std::string here(int line) { return fmt::format("test_control.cpp:{}", line); }

using ::testing::contains;

}  // namespace

// ======================================================================= loops and carried values

TEST_CASE("for_range carries a running sum: f32 adds in loop order, one loop-carried value") {
  const int64_t K = 24, N = 16;
  HostTensor x(f32, {K, N}), out(f32, {N});
  x.fill_normal(1, 0, 1);
  auto fn = kernel("running_sum", [&](Builder& k) {
    auto X = k.pointer("X", f32), Out = k.pointer("Out", f32);
    auto offs = arange(0, N);
    Var acc = zeros(f32, {N});
    for_range(0, K, [&](Tile i) { acc = acc + load(X + i * N + offs); });
    store(Out + offs, acc);
  }).build();
  rt::interpret(fn, {1}, {x, out});
  std::vector<double> want;
  for (int64_t j = 0; j < N; ++j) {
    float s = 0;
    for (int64_t i = 0; i < K; ++i) s = f32_add(s, static_cast<float>(x.get({i, j})));
    want.push_back(s);
  }
  expect_same(out.to_f64(), want, "running sum");
  auto loops = find_ops(fn, ir::OpKind::for_);
  REQUIRE(loops.size() == 1);
  CHECK(loops[0]->results.size() == 1);
  CHECK(loops[0]->regions[0].args.size() == 2);  // induction variable + acc
}

TEST_CASE("several Vars are carried at once; a Var only read in the body is not carried") {
  const int64_t K = 10, N = 8;
  HostTensor x(f32, {K, N}), sums(f32, {N}), maxes(f32, {N}), count(i32, {1}), scale_out(f32, {N});
  x.fill_uniform(2, -3, 3);
  auto fn = kernel("multi_carry", [&](Builder& k) {
    auto X = k.pointer("X", f32), S = k.pointer("S", f32), M = k.pointer("M", f32), C = k.pointer("C", i32),
         SO = k.pointer("SO", f32);
    auto offs = arange(0, N);
    Var scale = full(f32, {N}, 0.5);  // read inside, never reassigned: stays a plain outer value
    Var s = zeros(f32, {N});
    Var m = full(f32, {N}, -INFINITY);
    Var c = zeros(i32, {});
    for_range(0, K, [&](Tile i) {
      auto row = load(X + i * N + offs) * scale;
      s = s + row;
      m = maximum(m, row);
      c = c + 1;
    });
    store(S + offs, s);
    store(M + offs, m);
    store(C, c);
    store(SO + offs, scale);
  }).build();
  rt::interpret(fn, {1}, {x, sums, maxes, count, scale_out});
  std::vector<double> ws, wm;
  for (int64_t j = 0; j < N; ++j) {
    float s = 0, m = -INFINITY;
    for (int64_t i = 0; i < K; ++i) {
      float v = static_cast<float>(x.get({i, j}) * 0.5);
      s = f32_add(s, v);
      m = std::max(m, v);
    }
    ws.push_back(s);
    wm.push_back(m);
  }
  expect_same(sums.to_f64(), ws, "carried sum");
  expect_same(maxes.to_f64(), wm, "carried max");
  CHECK(count.get_flat(0) == K);
  expect_same(scale_out.to_f64(), std::vector<double>(N, 0.5), "read-only Var after the loop");

  auto loops = find_ops(fn, ir::OpKind::for_);
  REQUIRE(loops.size() == 1);
  CHECK(loops[0]->results.size() == 3);              // s, m, c -- not scale
  CHECK(loops[0]->regions[0].args.size() == 4);      // iv + 3 carried
  CHECK(loops[0]->operands.size() == 3 + 3);         // lb, ub, step + 3 inits
  std::string text = ir::print(fn);
  CHECK(contains(text, "iter("));
  CHECK(contains(text, ": f32[8], f32[8], i32 {"));  // exactly the three carried types
}

TEST_CASE("a loop that reassigns no Var has no carried values") {
  const int64_t N = 8;
  HostTensor out(i32, {4, N});
  auto fn = kernel("no_carry", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    Var unused = zeros(i32, {N});
    for_range(0, 4, [&](Tile i) { store(Out + i * N + arange(0, N), unused + i); });
  }).build();
  rt::interpret(fn, {1}, {out});
  std::vector<double> want;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < N; ++j) want.push_back(i);
  expect_same(out.to_f64(), want, "stores from the body");
  auto loops = find_ops(fn, ir::OpKind::for_);
  REQUIRE(loops.size() == 1);
  CHECK(loops[0]->results.empty());
  CHECK(loops[0]->regions[0].args.size() == 1);
  CHECK_FALSE(contains(ir::print(fn), "iter("));
}

TEST_CASE("runtime bounds from scalar parameters, including zero-trip loops that keep the initial values") {
  const int64_t N = 8;
  auto fn = kernel("runtime_bounds", [&](Builder& k) {
    auto Init = k.pointer("Init", f32), Out = k.pointer("Out", f32), Cnt = k.pointer("Cnt", i32);
    auto lb = k.scalar<int>("lb"), ub = k.scalar<int>("ub");
    auto offs = arange(0, N);
    Var acc = load(Init + offs);
    Var cnt = full(i32, {}, 100);
    for_range(lb, ub, [&](Tile i) {
      acc = acc + cast(f32, i);
      cnt = cnt + 1;
    });
    store(Out + offs, acc);
    store(Cnt, cnt);
  }).build();
  HostTensor init(f32, {N});
  init.fill_uniform(3, -10, 10);
  for (auto [lb, ub] : std::vector<std::pair<int, int>>{{3, 10}, {-4, 3}, {5, 5}, {9, 2}, {0, 1}}) {
    INFO("lb = ", lb, ", ub = ", ub);
    HostTensor out(f32, {N}), cnt(i32, {1});
    rt::interpret(fn, {1}, {init, out, cnt, lb, ub});
    std::vector<double> want;
    for (double v : init.to_f64()) {
      float s = static_cast<float>(v);
      for (int i = lb; i < ub; ++i) s = f32_add(s, static_cast<float>(i));
      want.push_back(s);
    }
    expect_same(out.to_f64(), want, fmt::format("acc after for_range({}, {})", lb, ub));
    CHECK(cnt.get_flat(0) == 100 + std::max(0, ub - lb));
  }
}

TEST_CASE("non-unit steps, literal and runtime, visit lb, lb+step, ... below ub") {
  auto fn = kernel("steps", [&](Builder& k) {
    auto Out = k.pointer("Out", i64);
    auto lb = k.scalar<int>("lb"), ub = k.scalar<int>("ub"), step = k.scalar<int>("step");
    Var sum = zeros(i64, {}), count = zeros(i64, {}), sum3 = zeros(i64, {});
    for_range(lb, ub, step, [&](Tile i) {
      sum = sum + cast(i64, i) * 1000 + count;  // order-sensitive: the visit order matters
      count = count + 1;
    });
    for_range(lb, ub, 3, [&](Tile i) { sum3 = sum3 + cast(i64, i); });
    store(Out, sum);
    store(Out + 1, count);
    store(Out + 2, sum3);
  }).build();
  const std::vector<std::tuple<int, int, int>> cases{{-7, 20, 3}, {0, 10, 4}, {5, 6, 10}, {2, 2, 1}, {1, 100, 7}};
  for (auto [lb, ub, step] : cases) {
    INFO("lb = ", lb, ", ub = ", ub, ", step = ", step);
    HostTensor out(i64, {3});
    rt::interpret(fn, {1}, {out, lb, ub, step});
    int64_t sum = 0, count = 0, sum3 = 0;
    for (int i = lb; i < ub; i += step) sum += int64_t{i} * 1000 + count, ++count;
    for (int i = lb; i < ub; i += 3) sum3 += i;
    CHECK(out.get_flat(0) == sum);
    CHECK(out.get_flat(1) == count);
    CHECK(out.get_flat(2) == sum3);
  }
}

TEST_CASE("64-bit bounds give an i64 induction variable that counts past 2^32") {
  DType iv_dtype{};
  auto fn = kernel("i64_loop", [&](Builder& k) {
    auto Out = k.pointer("Out", i64);
    auto lb = k.scalar<int64_t>("lb"), ub = k.scalar<int64_t>("ub");
    Var sum = zeros(i64, {}), count = zeros(i32, {});
    for_range(lb, ub, 3, [&](Tile i) {
      iv_dtype = i.dtype();
      sum = sum + i;
      count = count + 1;
    });
    store(Out, sum);
    store(Out + 1, cast(i64, count));
  }).build();
  CHECK(iv_dtype == i64);
  const int64_t lb = (int64_t{1} << 33) - 4, ub = (int64_t{1} << 33) + 10;
  HostTensor out(i64, {2});
  rt::interpret(fn, {1}, {out, lb, ub});
  int64_t sum = 0, count = 0;
  for (int64_t i = lb; i < ub; i += 3) sum += i, ++count;
  CHECK(static_cast<int64_t>(out.get_flat(0)) == sum);
  CHECK(out.get_flat(1) == count);
}

TEST_CASE("a Var copied from another Var is a separate variable") {
  HostTensor out(i32, {2});
  auto fn = kernel("var_copy", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    Var a = full(i32, {}, 5);
    Var b = a;  // same value, separate variable
    for_range(0, 4, [&](Tile i) { b = b + i; });
    store(Out, a);
    store(Out + 1, b);
  }).build();
  rt::interpret(fn, {1}, {out});
  CHECK(out.get_flat(0) == 5);
  CHECK(out.get_flat(1) == 5 + 0 + 1 + 2 + 3);
  auto loops = find_ops(fn, ir::OpKind::for_);
  REQUIRE(loops.size() == 1);
  CHECK(loops[0]->results.size() == 1);
}

TEST_CASE("nested loops: the inner bound depends on the outer induction variable") {
  const int64_t N = 4;
  auto fn = kernel("nested", [&](Builder& k) {
    auto X = k.pointer("X", f32), Out = k.pointer("Out", f32), Tri = k.pointer("Tri", i32);
    auto n = k.scalar<int>("n");
    auto offs = arange(0, N);
    Var tri = zeros(i32, {});
    Var acc = zeros(f32, {N});
    for_range(0, n, [&](Tile i) {
      for_range(0, i, [&](Tile j) {
        tri = tri + i * 10 + j;
        acc = acc + load(X + (i * n + j) * N + offs);
      });
    });
    store(Tri, tri);
    store(Out + offs, acc);
  }).build();
  const int n = 7;
  HostTensor x(f32, {n, n, N}), out(f32, {N}), tri(i32, {1});
  x.fill_normal(4, 0, 1);
  rt::interpret(fn, {1}, {x, out, tri, n});
  int want_tri = 0;
  std::vector<double> want;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) want_tri += i * 10 + j;
  for (int64_t l = 0; l < N; ++l) {
    float s = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j) s = f32_add(s, static_cast<float>(x.get({i, j, l})));
    want.push_back(s);
  }
  CHECK(tri.get_flat(0) == want_tri);
  expect_same(out.to_f64(), want, "triangular f32 sum");
  auto loops = find_ops(fn, ir::OpKind::for_);
  REQUIRE(loops.size() == 2);
  CHECK(loops[0]->results.size() == 2);  // the outer loop carries both
  CHECK(loops[1]->results.size() == 2);
}

TEST_CASE("loop bounds that depend on the program: program_id and a value loaded per program") {
  const int64_t P = 6;
  HostTensor lens(i32, {P}), counts(i32, {P}), sums(i32, {P});
  lens.fill_uniform(5, 0, 40);
  rt::interpret(kernel("per_program", [&](Builder& k) {
    auto Lens = k.pointer("Lens", i32), Counts = k.pointer("Counts", i32), Sums = k.pointer("Sums", i32);
    auto p = program_id(0);
    Var c = zeros(i32, {});
    for_range(0, p + 1, [&](Tile) { c = c + 1; });
    Var s = zeros(i32, {});
    for_range(0, load(Lens + p), 2, [&](Tile i) { s = s + i; });
    store(Counts + p, c);
    store(Sums + p, s);
  }).build(), {P, 1, 1}, {lens, counts, sums});
  for (int64_t p = 0; p < P; ++p) {
    int len = static_cast<int>(lens.get_flat(p)), s = 0;
    for (int i = 0; i < len; i += 2) s += i;
    CHECK(counts.get_flat(p) == p + 1);
    CHECK(sums.get_flat(p) == s);
  }
}

// ======================================================================= if_

TEST_CASE("if_ without and with else, on a runtime condition") {
  const int64_t N = 16;
  auto fn = kernel("branches", [&](Builder& k) {
    auto X = k.pointer("X", f32), Out = k.pointer("Out", f32);
    auto flag = k.scalar<int>("flag");
    auto offs = arange(0, N);
    Var v = load(X + offs);
    if_(flag > 0, [&] { v = v * 2.0; });
    if_(flag > 1, [&] { v = v + 1.0; }, [&] { v = v - 1.0; });
    store(Out + offs, v);
  }).build();
  HostTensor x(f32, {N});
  x.fill_normal(6, 0, 1);
  for (int flag : {0, 1, 2}) {
    HostTensor out(f32, {N});
    rt::interpret(fn, {1}, {x, out, flag});
    std::vector<double> want;
    for (double xv : x.to_f64()) {
      float v = static_cast<float>(xv);
      if (flag > 0) v = v * 2.0f;
      v = flag > 1 ? f32_add(v, 1.0f) : f32_add(v, -1.0f);
      want.push_back(v);
    }
    expect_same(out.to_f64(), want, fmt::format("flag = {}", flag));
  }
  auto ifs = find_ops(fn, ir::OpKind::if_);
  REQUIRE(ifs.size() == 2);
  CHECK(ifs[0]->results.size() == 1);
  CHECK(ifs[1]->results.size() == 1);
}

TEST_CASE("Vars changed in only one branch keep their value on the other path") {
  auto fn = kernel("one_branch", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    auto flag = k.scalar<int>("flag");
    Var a = full(i32, {}, 10), b = full(i32, {}, 20), untouched = full(i32, {}, 30);
    if_(flag == 1, [&] { a = a + 1; }, [&] { b = b * 3; });
    store(Out, a);
    store(Out + 1, b);
    store(Out + 2, untouched);
  }).build();
  for (int flag : {0, 1}) {
    HostTensor out(i32, {3});
    rt::interpret(fn, {1}, {out, flag});
    CHECK(out.get_flat(0) == (flag == 1 ? 11 : 10));
    CHECK(out.get_flat(1) == (flag == 1 ? 20 : 60));
    CHECK(out.get_flat(2) == 30);
  }
  auto ifs = find_ops(fn, ir::OpKind::if_);
  REQUIRE(ifs.size() == 1);
  CHECK(ifs[0]->results.size() == 2);  // a and b, not `untouched`
}

TEST_CASE("if_ nested in for_range: the carried Var flows through both branches") {
  auto fn = kernel("if_in_loop", [&](Builder& k) {
    auto Out = k.pointer("Out", i32);
    auto n = k.scalar<int>("n");
    Var acc = zeros(i32, {}), odd = zeros(i32, {});
    for_range(0, n, [&](Tile i) {
      if_(i % 3 == 0, [&] { acc = acc + i; }, [&] { acc = acc - 1; });
      if_(i % 2 == 1, [&] { odd = odd + 1; });
    });
    store(Out, acc);
    store(Out + 1, odd);
  }).build();
  for (int n : {0, 1, 10, 31}) {
    HostTensor out(i32, {2});
    rt::interpret(fn, {1}, {out, n});
    int acc = 0, odd = 0;
    for (int i = 0; i < n; ++i) {
      acc += i % 3 == 0 ? i : -1;
      odd += i % 2;
    }
    CHECK(out.get_flat(0) == acc);
    CHECK(out.get_flat(1) == odd);
  }
}

TEST_CASE("Var compound assignment += -= *= /= outside and inside loops") {
  const int64_t N = 16;
  HostTensor x(f32, {N}), y(f32, {N}), out(f32, {N}), loop_out(f32, {N}), iout(i32, {1});
  x.fill_normal(7, 0, 2);
  y.fill_uniform(8, 0.5, 2);
  rt::interpret(kernel("compound", [&](Builder& k) {
    auto X = k.pointer("X", f32), Y = k.pointer("Y", f32), Out = k.pointer("Out", f32), LO = k.pointer("LO", f32),
         IO = k.pointer("IO", i32);
    auto offs = arange(0, N);
    Var v = load(X + offs);
    v += 2.5;
    v -= load(Y + offs);
    v *= 3;
    v /= load(Y + offs);
    store(Out + offs, v);
    Var w = load(X + offs);
    Var iv = full(i32, {}, 1);
    for_range(0, 5, [&](Tile i) {
      w *= 0.5;
      w += load(Y + offs);
      iv *= 3;
      iv -= i;
    });
    store(LO + offs, w);
    store(IO, iv);
  }).build(), {1}, {x, y, out, loop_out, iout});
  std::vector<double> want, want_loop;
  for (int64_t j = 0; j < N; ++j) {
    float xv = static_cast<float>(x.get_flat(j)), yv = static_cast<float>(y.get_flat(j));
    float v = f32_add(xv, 2.5f);
    v = f32_add(v, -yv);
    v = v * 3.0f;
    v = v / yv;
    want.push_back(v);
    float w = xv;
    for (int i = 0; i < 5; ++i) w = f32_add(w * 0.5f, yv);
    want_loop.push_back(w);
  }
  int iv = 1;
  for (int i = 0; i < 5; ++i) iv = iv * 3 - i;
  expect_same(out.to_f64(), want, "v += 2.5; v -= y; v *= 3; v /= y");
  expect_same(loop_out.to_f64(), want_loop, "w *= 0.5; w += y in a loop");
  CHECK(iout.get_flat(0) == iv);
}

// ======================================================================= build errors

TEST_CASE("a Var whose type changes inside a loop body is a BuildError naming its declaration and both types") {
  int decl_line = 0, loop_line = 0;
  auto k = kernel("type_change", [&](Builder& kb) {
    auto X = kb.pointer("X", bf16);
    decl_line = __LINE__ + 1;
    Var v = zeros(f32, {8});
    loop_line = __LINE__ + 1;
    for_range(0, 4, [&](Tile) { v = cast(bf16, v); });
    store(X + arange(0, 8), cast(bf16, v));
  });
  std::string msg = build_error(k);
  INFO(msg);
  CHECK(contains(msg, "kernel 'type_change'"));
  CHECK(contains(msg, "Var declared at"));
  CHECK(contains(msg, here(decl_line)));
  CHECK(contains(msg, here(loop_line)));
  CHECK(contains(msg, "from f32[8] to bf16[8]"));
  CHECK_THROWS_WITH_AS(k.build(), doctest::Contains("changes type inside the loop body"), BuildError);
}

TEST_CASE("a Var whose type changes inside an if_ branch is a BuildError naming its declaration") {
  int decl_line = 0;
  auto k = kernel("if_type_change", [&](Builder& kb) {
    auto X = kb.pointer("X", i32);
    auto flag = kb.scalar<int>("flag");
    decl_line = __LINE__ + 1;
    Var v = zeros(i32, {8});
    if_(flag > 0, [&] { v = cast(i64, v); });
    store(X + arange(0, 8), v);
  });
  std::string msg = build_error(k);
  INFO(msg);
  CHECK(contains(msg, here(decl_line)));
  CHECK(contains(msg, "from i32[8] to i64[8]"));
}

TEST_CASE("a plain Tile assigned in a loop body and used after it is a BuildError that suggests Var") {
  int use_line = 0;
  auto k = kernel("escaping_tile", [&](Builder& kb) {
    auto X = kb.pointer("X", f32);
    auto offs = arange(0, 8);
    Tile t = zeros(f32, {8});
    for_range(0, 4, [&](Tile) { t = t + 1.0; });
    use_line = __LINE__ + 1;
    store(X + offs, t);
  });
  std::string msg = build_error(k);
  INFO(msg);
  CHECK(contains(msg, "kernel 'escaping_tile'"));
  CHECK(contains(msg, here(use_line)));
  CHECK(contains(msg, "outside that body"));
  CHECK(contains(msg, "Var"));

  // The same for a Tile assigned in an if_ branch.
  int if_use_line = 0;
  auto k2 = kernel("escaping_if_tile", [&](Builder& kb) {
    auto X = kb.pointer("X", f32);
    auto flag = kb.scalar<int>("flag");
    Tile t = zeros(f32, {8});
    if_(flag > 0, [&] { t = t * 2.0; });
    if_use_line = __LINE__ + 1;
    store(X + arange(0, 8), t);
  });
  std::string msg2 = build_error(k2);
  INFO(msg2);
  CHECK(contains(msg2, here(if_use_line)));
  CHECK(contains(msg2, "Var"));
}

TEST_CASE("a non-positive or non-integer literal step is a BuildError at the for_range") {
  for (double step : {0.0, -2.0, 1.5}) {
    int line = 0;
    auto k = kernel("bad_step", [&](Builder& kb) {
      auto X = kb.pointer("X", f32);
      Var v = zeros(f32, {8});
      const Operand step_operand = step == 1.5 ? Operand(1.5) : Operand(static_cast<int>(step));
      line = __LINE__ + 1;
      for_range(0, 10, step_operand, [&](Tile) { v = v + 1.0; });
      store(X + arange(0, 8), v);
    });
    std::string msg = build_error(k);
    INFO(msg);
    CHECK(contains(msg, "step must be a positive integer"));
    CHECK(contains(msg, fmt::format("got {}", step)));
    CHECK(contains(msg, here(line)));
  }
}

TEST_CASE("an if_ condition that is not an i1 scalar is a BuildError") {
  int line = 0;
  auto k = kernel("int_condition", [&](Builder& kb) {
    auto X = kb.pointer("X", i32);
    auto flag = kb.scalar<int>("flag");
    Var v = zeros(i32, {8});
    line = __LINE__ + 1;
    if_(flag, [&] { v = v + 1; });
    store(X + arange(0, 8), v);
  });
  std::string msg = build_error(k);
  INFO(msg);
  CHECK(contains(msg, "condition must be a boolean (i1) scalar, got i32"));
  CHECK(contains(msg, here(line)));

  auto k2 = kernel("tile_condition", [&](Builder& kb) {
    auto X = kb.pointer("X", i32);
    Var v = zeros(i32, {8});
    if_(arange(0, 8) > 3, [&] { v = v + 1; });
    store(X + arange(0, 8), v);
  });
  CHECK_THROWS_WITH_AS(k2.build(), doctest::Contains("got i1[8]"), BuildError);
}
