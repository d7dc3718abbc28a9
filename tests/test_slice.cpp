// Tensor::slice, a view of a tensor along one dim: its IR op (printed text, hash, verifier), its
// build errors, and its semantics in the interpreter (runtime start and length, windows bounds-
// checked against the view, slices of slices, a slice outside its parent is an InterpretError) and
// its lowering (vector accesses survive a slice of the rows, not of the innermost dim).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"
#include "host_bits.hpp"

using namespace tilejit::lang;
namespace ir = tilejit::ir;
namespace rt = tilejit::runtime;
using rt::HostTensor;

namespace {

using ::testing::contains;
std::string here(int line) { return fmt::format("test_slice.cpp:{}", line); }

// Rows [s, s + n) of X, copied to the first rows of Y through an 8x8 window of the view.
Kernel copy_rows = kernel("copy_rows", [](Builder& k) {
  auto X = k.tensor("X", f32, 2), Y = k.tensor("Y", f32, 2);
  auto s = k.scalar<int>("s"), n = k.scalar<int>("n");
  store(Y.block({0, 0}, {8, 8}), load(X.slice(0, s, n).block({0, 0}, {8, 8}), -7.0));
});

std::string build_error(const Kernel::Body& body) {
  try {
    kernel("bad", body).build();
  } catch (const BuildError& e) {
    return e.what();
  }
  FAIL("expected a BuildError");
  return {};
}

std::string interpret_error(const ir::Function& fn, rt::Grid grid, const std::vector<rt::Arg>& args) {
  try {
    rt::interpret(fn, grid, args);
  } catch (const rt::InterpretError& e) {
    return e.what();
  }
  FAIL("expected an InterpretError");
  return {};
}

}  // namespace

// ======================================================================= IR

TEST_CASE("printer: a slice prints as tensor_slice with its dim; the hash changes with the dim") {
  std::string text = ir::print(copy_rows.build());
  CHECK_MESSAGE(contains(text, "= tensor_slice %X, %s, %n {dim = 0} : tensor<f32,2>\n"), text);
  auto sliced_dim = [](int dim) {
    return kernel("k", [dim](Builder& k) {
      auto X = k.tensor("X", f32, 2);
      auto s = k.scalar<int>("s");
      store(X.slice(dim, s, 4).block({0, 0}, {4, 4}), zeros(f32, {4, 4}));
    }).build();
  };
  CHECK(ir::structural_hash(sliced_dim(0)) == ir::structural_hash(sliced_dim(0)));
  CHECK(ir::structural_hash(sliced_dim(0)) != ir::structural_hash(sliced_dim(1)));
  CHECK_NOTHROW(ir::verify(sliced_dim(1)));
}

namespace {
// X: tensor<f32,2>, a: i32, w: i64; `slice` appended with the given operands and dim.
void check_slice_rejected(bool use_i64, bool on_pointer, int64_t dim, const std::string& phrase) {
  ir::Function f;
  f.name = "hand_built";
  auto param = [&](const std::string& name, ir::ParamKind kind, ir::Type t) {
    ir::ValueId v = f.new_value(t, name);
    f.params.push_back({name, kind, t, v, {}});
    f.body.args.push_back(v);
    return v;
  };
  ir::ValueId x = param("X", ir::ParamKind::Tensor, ir::Type::tensor(DType::f32, 2));
  ir::ValueId p = param("P", ir::ParamKind::Pointer, ir::Type::pointer(DType::f32));
  ir::ValueId a = param("a", ir::ParamKind::Scalar, ir::Type::scalar(DType::i32));
  ir::ValueId w = param("w", ir::ParamKind::Scalar, ir::Type::scalar(DType::i64));
  ir::Op op;
  op.kind = ir::OpKind::tensor_slice;
  op.operands = {on_pointer ? p : x, a, use_i64 ? w : a};
  op.results = {f.new_value(on_pointer ? ir::Type::pointer(DType::f32) : ir::Type::tensor(DType::f32, 2))};
  op.attrs = {{"dim", dim}};
  f.body.ops.push_back(op);
  if (phrase.empty()) {
    CHECK_NOTHROW(ir::verify(f));
    return;
  }
  try {
    ir::verify(f);
    FAIL("verify accepted malformed IR, expected: " << phrase);
  } catch (const ir::VerifyError& e) {
    CHECK_MESSAGE(contains(e.what(), phrase), e.what());
    CHECK_MESSAGE(contains(e.what(), "tensor_slice"), e.what());
  }
}
}  // namespace

TEST_CASE("verifier: tensor_slice takes a tensor, i32 start and length, and a dim inside the rank") {
  check_slice_rejected(false, false, 1, "");
  check_slice_rejected(true, false, 0, "start and length must be i32 scalars, got i32 and i64");
  check_slice_rejected(false, false, 2, "dim = 2 is out of range [0, 1]");
  check_slice_rejected(false, true, 0, "operand must be a tensor descriptor, got ptr<f32>");
}

// ======================================================================= build errors

TEST_CASE("DSL: a bad slice dim or a non-i32 start/length names the kernel, the line and what is valid") {
  int line = __LINE__ + 3;
  std::string msg = build_error([](Builder& k) {
    auto X = k.tensor("X", f32, 2);
    (void)X.slice(2, 0, 4);
  });
  CHECK_MESSAGE(contains(msg, "kernel 'bad'"), msg);
  CHECK_MESSAGE(contains(msg, here(line)), msg);
  CHECK_MESSAGE(contains(msg, "slice: dim 2 is out of range for a rank-2 tensor"), msg);
  line = __LINE__ + 3;
  msg = build_error([](Builder& k) {
    auto X = k.tensor("X", f32, 2);
    (void)X.slice(-1, 0, 4);
  });
  CHECK_MESSAGE(contains(msg, here(line)), msg);
  CHECK_MESSAGE(contains(msg, "dim -1 is out of range"), msg);
  line = __LINE__ + 4;
  msg = build_error([](Builder& k) {
    auto X = k.tensor("X", f32, 2);
    auto s = k.scalar<int64_t>("s");
    (void)X.slice(0, s, 4);
  });
  CHECK_MESSAGE(contains(msg, here(line)), msg);
  CHECK_MESSAGE(contains(msg, "slice: the start must be an i32 scalar, got i64 (convert it with cast(i32, x))"), msg);
  msg = build_error([](Builder& k) {
    auto X = k.tensor("X", f32, 2);
    (void)X.slice(0, 0, arange(0, 4));
  });
  CHECK_MESSAGE(contains(msg, "slice: the length must be an i32 scalar, got i32[4]"), msg);
}

// ======================================================================= interpreter

TEST_CASE("interpreter: a slice with runtime start and length reads its rows; outside the view reads padding") {
  HostTensor x(f32, {20, 6});
  x.fill_uniform(1, -1, 1);
  for (auto [s, n] : {std::pair{0, 8}, std::pair{3, 5}, std::pair{12, 8}, std::pair{19, 1}, std::pair{20, 0}}) {
    HostTensor y(f32, {8, 8});
    rt::interpret(copy_rows.build(), {1}, {x, y, s, n});
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 8; ++j)
        CHECK_MESSAGE(y.get({i, j}) == (i < n && j < 6 ? x.get({s + i, j}) : -7.0), fmt::format("s={} n={} [{},{}]", s, n, i, j));
  }
}

TEST_CASE("interpreter: a slice that is not inside its parent is an InterpretError naming the kernel and line") {
  int line = 0;
  auto fn = kernel("bad_slice", [&](Builder& k) {
    auto X = k.tensor("X", f32, 2);
    auto s = k.scalar<int>("s"), n = k.scalar<int>("n");
    line = __LINE__ + 1;
    auto v = X.slice(1, s, n);
    store(v.block({0, 0}, {4, 4}), zeros(f32, {4, 4}));
  }).build();
  HostTensor x(f32, {4, 10});
  for (auto [s, n, what] : {std::tuple{6, 5, "[6, 11) of dim 1"}, std::tuple{-1, 3, "start -1"}, std::tuple{2, -1, "length -1"},
                            std::tuple{11, 0, "[11, 11)"}}) {
    std::string msg = interpret_error(fn, {1}, {x, s, n});
    INFO(msg);
    CHECK(contains(msg, "kernel 'bad_slice'"));
    CHECK(contains(msg, "tensor_slice"));
    CHECK(contains(msg, here(line)));
    CHECK(contains(msg, what));
    CHECK(contains(msg, "is not inside the tensor, whose dim 1 has size 10"));
  }
  rt::interpret(fn, {1}, {x, 10, 0});  // an empty slice at the end is fine: nothing is written
  rt::interpret(fn, {1}, {x, 6, 4});
  CHECK(x.get({0, 6}) == 0.0);
  CHECK(std::isnan(x.get({0, 5})));  // HostTensor's poison: never written
}

TEST_CASE("interpreter: slices of slices compose, and size() of a view is its length") {
  HostTensor x(i32, {30, 4}), y(i32, {8, 4}), sizes(i32, {2});
  for (int64_t i = 0; i < 30; ++i)
    for (int64_t j = 0; j < 4; ++j) x.set({i, j}, static_cast<double>(100 * i + j));
  rt::interpret(kernel("nested", [](Builder& k) {
    auto X = k.tensor("X", i32, 2), Y = k.tensor("Y", i32, 2), N = k.tensor("N", i32, 1);
    auto a = k.scalar<int>("a");
    auto v = X.slice(0, a, 10).slice(0, 3, 4).slice(1, 1, 3);  // rows a+3 .. a+6, columns 1..3
    store(Y.block({0, 0}, {8, 4}), load(v.block({0, 0}, {8, 4}), -1));
    store(N.block({0}, {1}), expand_dims(v.size(0), 0));
    store(N.block({1}, {1}), expand_dims(v.size(1), 0));
  }).build(), {1}, {x, y, sizes, 5});
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 4; ++j)
      CHECK(y.get({i, j}) == (i < 4 && j < 3 ? 100.0 * (8 + i) + (j + 1) : -1.0));
  CHECK(sizes.get({0}) == 4);
  CHECK(sizes.get({1}) == 3);
}

TEST_CASE("interpreter: the GPU suite's segments kernel: offsets from memory, clipped windows, padded sums") {
  const std::vector<int> cu{0, 5, 5, 37, 38, 70};  // lengths 5, 0, 32, 1, 32; rows 70, 71 in no segment
  const int B = static_cast<int>(cu.size()) - 1, shift = 3;
  HostTensor x(bf16, {72, 64}), y(bf16, {72, 64}), z(f32, {B, 64}), w(bf16, {B, 64}), c(i32, {B + 1});
  x.fill_normal(7, 0, 1);
  for (int b = 0; b <= B; ++b) c.set({b}, cu[static_cast<size_t>(b)]);
  rt::interpret(test_kernels::segments.build(), {B}, {x, y, z, w, c, shift});
  for (int64_t r = 0; r < 72; ++r)
    for (int64_t j = 0; j < 64; ++j) {
      if (r < 70) CHECK(y.get({r, j}) == 2 * x.get({r, j}));  // exact in bf16
      else CHECK(std::isnan(y.get({r, j})));  // outside every view: never written
    }
  for (int b = 0; b < B; ++b) {
    const int start = cu[static_cast<size_t>(b)], len = cu[static_cast<size_t>(b) + 1] - start;
    const int padded = (len + 15) / 16 * 16 - len;
    for (int64_t j = 0; j < 64; ++j) {
      double ref = -padded;
      for (int r = start; r < start + len; ++r) ref += x.get({r, j});
      CHECK_MESSAGE(std::abs(z.get({b, j}) - ref) <= 1e-5 * (1 + std::abs(ref)), fmt::format("Z[{}, {}]", b, j));
      double wref = len > 0 && j + shift < 64 ? x.get({start, j + shift}) : 5.0;
      CHECK_MESSAGE(w.get({b, j}) == wref, fmt::format("W[{}, {}]", b, j));
    }
  }
}

// ======================================================================= GPU lowering (PTX only)

TEST_CASE("lowering: windows on a slice of the rows keep 16-byte vector accesses; a slice of the innermost dim does not") {
  auto ptx_of = [](int slice_dim) {
    tilejit::jit::CompileOptions o;
    o.make_cubin = false;
    return tilejit::jit::compile(kernel("view_copy", [slice_dim](Builder& k) {
      const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
      auto X = k.tensor("X", bf16, 2, row_major), Y = k.tensor("Y", bf16, 2, row_major);
      auto s = k.scalar<int>("s");
      auto x = X.slice(slice_dim, s, X.size(slice_dim) - s);
      store(Y.block({0, 0}, {16, 64}), load(x.block({0, 0}, {16, 64})));
    }).build()).ptx;
  };
  std::string rows = ptx_of(0), cols = ptx_of(1);
  CHECK(contains(rows, "ld.global.v4"));
  CHECK_FALSE(contains(cols, "ld.global.v4"));
  CHECK(contains(cols, "st.global.v4"));  // Y itself is still aligned
}
