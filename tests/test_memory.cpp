// Memory operations in the CPU interpreter: masked loads and stores through pointer tiles, strided
// tensors, block windows (padding, non-trailing and transposed dims, clipped stores), atomic adds,
// and the element encodings of the narrow dtypes.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dsl/lang.hpp"
#include "host_bits.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"

using namespace tilejit::lang;
namespace rt = tilejit::runtime;
using rt::HostTensor;
using testing::raw;

namespace {

void run(const std::string& name, Kernel::Body body, const std::vector<rt::Arg>& args, rt::Grid grid = {1, 1, 1}) {
  rt::interpret(kernel(name, std::move(body)).build(), grid, args);
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

// Exact equality (floats: value and sign; NaN matches NaN); lists the first differences.
void expect_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  std::string detail;
  for (size_t i = 0; i < got.size(); ++i)
    if (!same(got[i], want[i]) && ++bad <= 6) detail += fmt::format("\n  [{}] got {}, want {}", i, got[i], want[i]);
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} of {} elements differ{}", what, bad, got.size(), detail));
}

// Element offsets (in elements) of every logical element of a strided tensor.
std::set<int64_t> logical_offsets(const HostTensor& t) {
  std::set<int64_t> s;
  std::vector<int64_t> idx(static_cast<size_t>(t.rank()), 0);
  for (int64_t e = 0; e < t.numel(); ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
    s.insert(off);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.sizes()[d]) break;
      idx[d] = 0;
    }
  }
  return s;
}

// How many bytes of the allocation outside the logical elements lost HostTensor's 0xFF poison.
size_t gap_bytes_written(const HostTensor& t) {
  const auto es = static_cast<size_t>(tilejit::ir::byte_size(t.dtype()));
  std::set<int64_t> used = logical_offsets(t);
  const auto* p = static_cast<const unsigned char*>(t.data());
  size_t bad = 0;
  for (size_t b = 0; b < t.bytes(); ++b)
    if (!used.count(static_cast<int64_t>(b / es)) && p[b] != 0xFF) ++bad;
  return bad;
}

bool is_poison(const HostTensor& t, int64_t flat_index) {
  const auto es = static_cast<size_t>(tilejit::ir::byte_size(t.dtype()));
  const auto* p = static_cast<const unsigned char*>(t.data()) + static_cast<size_t>(flat_index) * es;
  return std::all_of(p, p + es, [](unsigned char c) { return c == 0xFF; });
}

template <class T>
void set_raw(HostTensor& t, int64_t i, T v) {
  std::memcpy(static_cast<std::byte*>(t.data()) + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

// Pointer tile into a 2-D strided tensor: T.ptr() + r[col] * stride(0) + c[row] * stride(1).
Tile ptr2d(const Tensor& t, const Tile& r, const Tile& c) { return t.ptr() + r[col] * t.stride(0) + c[row] * t.stride(1); }
Tile in2d(const Tensor& t, const Tile& r, const Tile& c) { return (r[col] < t.size(0)) & (c[row] < t.size(1)); }

}  // namespace

// ======================================================================= masked pointer loads/stores

TEST_CASE("masked load returns the padding value for masked-off lanes and never reads them") {
  const int n = 100, BLOCK = 128;  // the tile runs 28 elements past the end of X
  HostTensor x(f32, {n});
  x.fill_uniform(1, -1, 1);
  HostTensor with_other(f32, {BLOCK}), with_zero(f32, {BLOCK}), with_tile(f32, {BLOCK}), far(f32, {BLOCK});
  run("masked_load", [&](Builder& k) {
    auto X = k.pointer("X", f32);
    auto O1 = k.pointer("O1", f32), O2 = k.pointer("O2", f32), O3 = k.pointer("O3", f32), O4 = k.pointer("O4", f32);
    auto len = k.scalar<int>("n");
    auto offs = arange(0, BLOCK);
    auto mask = offs < len;
    store(O1 + offs, load(X + offs, mask, -1.5));
    store(O2 + offs, load(X + offs, mask));                           // default padding 0
    store(O3 + offs, load(X + offs, mask, cast(f32, offs) * -1.0));  // per-lane padding tile
    // masked-off lanes point far outside X, above and below: reading any would be a fault
    auto wild = where(mask, offs, where(offs % 2 == 0, offs + 1000000, -offs - 1000));
    store(O4 + offs, load(X + wild, mask, 7.0));
  }, {x, with_other, with_zero, with_tile, far, n});
  std::vector<double> w1, w2, w3, w4;
  for (int i = 0; i < BLOCK; ++i) {
    bool in = i < n;
    double v = in ? x.get_flat(i) : 0;
    w1.push_back(in ? v : -1.5);
    w2.push_back(in ? v : 0.0);
    w3.push_back(in ? v : -double(i));
    w4.push_back(in ? v : 7.0);
  }
  expect_same(with_other.to_f64(), w1, "load(ptr, mask, -1.5)");
  expect_same(with_zero.to_f64(), w2, "load(ptr, mask)");
  expect_same(with_tile.to_f64(), w3, "load(ptr, mask, tile)");
  expect_same(far.to_f64(), w4, "masked-off lanes far out of bounds");

  // The same access without the mask does read past the end: the bounds check is live.
  HostTensor out(f32, {BLOCK});
  CHECK_THROWS_AS(run("unmasked_load", [&](Builder& k) {
    auto X = k.pointer("X", f32), O = k.pointer("O", f32);
    auto offs = arange(0, BLOCK);
    store(O + offs, load(X + offs));
  }, {x, out}), rt::InterpretError);
}

TEST_CASE("masked load broadcasts a row mask over a 2-D pointer tile") {
  const int64_t R = 8, C = 16, valid_rows = 5;
  HostTensor x(i32, {valid_rows, C}), out(i32, {R, C});
  x.fill_uniform(2, -1000, 1000);
  run("row_mask", [&](Builder& k) {
    auto X = k.pointer("X", i32), O = k.pointer("O", i32);
    auto r = arange(0, R), c = arange(0, C);
    auto offs = r[col] * C + c[row];  // [R, C]
    auto v = load(X + offs, r[col] < valid_rows, -7);  // mask [R, 1], other literal
    CHECK(v.shape() == Shape{R, C});
    store(O + offs, v);
  }, {x, out});
  std::vector<double> want;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) want.push_back(i < valid_rows ? x.get({i, j}) : -7.0);
  expect_same(out.to_f64(), want, "row-masked 2-D load");
}

TEST_CASE("masked store writes only the enabled lanes; the others keep their old contents") {
  const int n = 100, BLOCK = 128;
  HostTensor x(f32, {BLOCK}), out(f32, {n});
  x.fill_normal(3, 0, 1);
  run("masked_store", [&](Builder& k) {
    auto X = k.pointer("X", f32), O = k.pointer("O", f32);
    auto offs = arange(0, BLOCK);
    // lanes >= n would write past the end of O; lanes with offs % 3 == 0 are skipped on purpose
    store(O + offs, load(X + offs) * 2.0, (offs < n) & (offs % 3 != 0));
  }, {x, out});
  size_t bad = 0;
  for (int i = 0; i < n; ++i) {
    bool ok = i % 3 == 0 ? is_poison(out, i) : out.get_flat(i) == static_cast<float>(2 * x.get_flat(i));
    if (!ok) ++bad;
  }
  CHECK_MESSAGE(bad == 0, fmt::format("{} elements of the masked store are wrong", bad));

  // Scalar pointers take a scalar mask too.
  HostTensor s(f32, {2});
  run("scalar_store", [&](Builder& k) {
    auto S = k.pointer("S", f32);
    auto flag = k.scalar<int>("flag");
    store(S, 3.5, flag == 1);
    store(S + 1, 4.5, flag == 0);
  }, {s, 1});
  CHECK(s.get_flat(0) == 3.5);
  CHECK(is_poison(s, 1));
}

// ======================================================================= strided tensors

TEST_CASE("2-D pointer tiles built from the strides of non-contiguous tensors") {
  const int64_t BR = 32, BC = 32;  // covers every case below
  auto copy = kernel("strided_copy", [&](Builder& k) {
    auto X = k.tensor("X", f32, 2), O = k.tensor("O", f32, 2);
    auto r = arange(0, BR), c = arange(0, BC);
    auto v = load(ptr2d(X, r, c), in2d(X, r, c), 0);
    store(ptr2d(O, r, c), v, in2d(O, r, c));
  }).build();
  struct Case {
    const char* what;
    Shape sizes, strides;
  };
  const Case cases[] = {
      {"padded rows, every other column", {12, 20}, {48, 2}},
      {"column-major", {20, 12}, {1, 20}},
      {"contiguous", {16, 32}, {32, 1}},
  };
  uint64_t seed = 10;
  for (const Case& c : cases) {
    HostTensor x(f32, c.sizes, c.strides);
    x.fill_uniform(seed++, -5, 5);
    // the output is strided too (row stride 40), so the gaps between its rows must stay untouched
    HostTensor o(f32, c.sizes, {40, 1});
    HostTensor o_cm(f32, c.sizes, {1, c.sizes[0] + 3});  // and column-major with gaps
    rt::interpret(copy, {1}, {x, o});
    rt::interpret(copy, {1}, {x, o_cm});
    expect_same(o.to_f64(), x.to_f64(), fmt::format("{} -> row stride 40", c.what));
    expect_same(o_cm.to_f64(), x.to_f64(), fmt::format("{} -> column-major with gaps", c.what));
    CHECK_MESSAGE(gap_bytes_written(o) == 0, c.what);
    CHECK_MESSAGE(gap_bytes_written(o_cm) == 0, c.what);
  }
}

// ======================================================================= block windows

namespace {

// Loads [BM, BN] windows of X with `padding` and stores them into O (exactly tiled by the windows).
void window_copy(HostTensor& x, HostTensor& o, int64_t BM, int64_t BN, double padding) {
  run("window_copy", [&](Builder& k) {
    auto X = k.tensor("X", x.dtype(), 2), O = k.tensor("O", o.dtype(), 2);
    auto r0 = program_id(0) * BM, c0 = program_id(1) * BN;
    store(O.block({r0, c0}, {BM, BN}), load(X.block({r0, c0}, {BM, BN}), padding));
  }, {x, o}, {o.sizes()[0] / BM, o.sizes()[1] / BN, 1});
}

}  // namespace

TEST_CASE("block loads of windows read the padding value outside the tensor (-inf, 7.0, ints)") {
  const int64_t R = 37, C = 50, BM = 16, BN = 32;
  HostTensor x(f32, {R, C});
  x.fill_normal(20, 0, 1);
  for (double pad : {-double(INFINITY), 7.0}) {
    HostTensor o(f32, {48, 64});
    window_copy(x, o, BM, BN, pad);
    std::vector<double> want;
    for (int64_t i = 0; i < 48; ++i)
      for (int64_t j = 0; j < 64; ++j) want.push_back(i < R && j < C ? x.get({i, j}) : pad);
    expect_same(o.to_f64(), want, fmt::format("3x2 windows of [37,50], padding {}", pad));
  }
  HostTensor xi(i32, {R, C}), oi(i32, {48, 64});
  xi.fill_uniform(21, -100, 100);
  window_copy(xi, oi, BM, BN, -1);
  std::vector<double> want;
  for (int64_t i = 0; i < 48; ++i)
    for (int64_t j = 0; j < 64; ++j) want.push_back(i < R && j < C ? xi.get({i, j}) : -1.0);
  expect_same(oi.to_f64(), want, "i32 windows, padding -1");
}

TEST_CASE("block load of a window at negative offsets of a strided tensor") {
  HostTensor x(f32, {20, 30}, {64, 2});
  x.fill_uniform(22, -3, 3);
  HostTensor o(f32, {8, 8});
  run("negative_window", [&](Builder& k) {
    auto X = k.tensor("X", f32, 2), O = k.tensor("O", f32, 2);
    auto r0 = k.scalar<int>("r0"), c0 = k.scalar<int>("c0");
    store(O.block({0, 0}, {8, 8}), load(X.block({r0, c0}, {8, 8}), 7.0));
  }, {x, o, -5, 25});
  std::vector<double> want;
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      int64_t r = i - 5, c = j + 25;
      want.push_back(r >= 0 && r < 20 && c < 30 ? x.get({r, c}) : 7.0);
    }
  expect_same(o.to_f64(), want, "window at (-5, 25)");
}

// Issue 28, item 1: an offset is an integer of its own type, taken at its value: an i64 2^32 + 3
// is past the end (the GPU had cut it to 3), a u32 0xFFFFFFFF is past the end (not -1), a u64 of
// 2^64 - 1 is past the end with every tile coordinate added to it (the interpreter had read it as
// -1: a window from row -1), and tile coordinates added to INT64_MAX - 2 do not wrap.
TEST_CASE("issue 28: window offsets of every integer type are taken at their value (loads, stores, atomic adds)") {
  using tilejit::ir::DType;
  const auto& types = test_kernels::kWideOffsetTypes;
  const auto n = static_cast<int64_t>(std::size(types));
  HostTensor x(f32, {40, 48});
  x.fill_uniform(23, -3, 3);
  const int64_t max64 = std::numeric_limits<int64_t>::max(), min64 = std::numeric_limits<int64_t>::min();
  for (int64_t off : {int64_t{0}, int64_t{5}, int64_t{-3}, int64_t{30}, (int64_t{1} << 32) + 3, int64_t{0xFFFFFFFF}, int64_t{-1},
                      (int64_t{1} << 16) + 2, (int64_t{1} << 31) - 2, max64 - 2, min64, -(int64_t{1} << 32) + 7}) {
    INFO("off = " << off);
    HostTensor o(f32, {n, 16, 32}), p(f32, {n, 16, 32}), r(f32, {n, 32}), s(f32, {n, 40, 48}), a(f32, {n, 40, 64});
    a.fill_uniform(24, -1, 1);
    const HostTensor a0 = a;
    rt::interpret(test_kernels::wide_offsets().build(), {1}, {x, o, p, r, s, a, off});
    std::vector<double> wo, wp, wr, ws, wa;
    for (int64_t t = 0; t < n; ++t) {
      const DType d = types[static_cast<size_t>(t)];
      const int64_t w = tilejit::ir::wrap_int(d, off);  // the offset's bits (u64: as int64)
      // every window is within 64 of the offset: far values (u64 >= 2^63 included) touch nothing
      const bool near = !(d == DType::u64 && w < 0) && w > -64 && w < 64;
      auto in = [&](int64_t i, int64_t size) { return near && w + i >= 0 && w + i < size; };
      for (int64_t i = 0; i < 16; ++i)
        for (int64_t j = 0; j < 32; ++j) {
          wo.push_back(in(i, 40) ? x.get({w + i, j}) : -1.0);
          wp.push_back(in(j, 48) ? x.get({i, w + j}) : -3.0);
        }
      for (int64_t j = 0; j < 32; ++j) wr.push_back(in(0, 40) ? x.get({w, j}) : -2.0);
      for (int64_t i = 0; i < 40; ++i)
        for (int64_t j = 0; j < 48; ++j) ws.push_back(near && i - w >= 0 && i - w < 16 && j < 32 ? x.get({i - w, j}) : NAN);
      for (int64_t i = 0; i < 40; ++i)
        for (int64_t j = 0; j < 64; ++j) {
          const bool hit = near && i - w >= 0 && i - w < 16 && j - w >= 0 && j - w < 16;
          const double old = a0.get({t, i, j});
          wa.push_back(hit ? static_cast<double>(static_cast<float>(old) + static_cast<float>(x.get({i - w, j - w}))) : old);
        }
    }
    expect_same(o.to_f64(), wo, "rows [o, o + 16)");
    expect_same(p.to_f64(), wp, "cols [o, o + 32)");
    expect_same(r.to_f64(), wr, "row o (a fixed dim)");
    expect_same(s.to_f64(), ws, "store at row o");
    expect_same(a.to_f64(), wa, "atomic_add at (o, o)");
  }
}

TEST_CASE("block windows over non-trailing dims: a [B,S,H,D] tensor read and written with dims {1,3}") {
  const int64_t B = 2, S = 20, H = 3, D = 8, BS = 16;
  HostTensor x(f32, {B, S, H, D});
  x.fill_normal(23, 0, 1);
  HostTensor heads(f32, {B, H, 32, D});  // [B, H, S padded to 32, D]
  HostTensor back(f32, {B, S, H, D});    // written back through the same window: clipped at S
  run("bshd", [&](Builder& k) {
    auto X = k.tensor("X", f32, 4), O = k.tensor("O", f32, 4), Y = k.tensor("Y", f32, 4);
    auto s0 = program_id(0) * BS, h = program_id(1), b = program_id(2);
    Tile t = load(X.block({b, s0, h, 0}, {BS, D}, {1, 3}), -2.5);  // [BS, D]: X[b, s0+i, h, j]
    CHECK(t.shape() == Shape{BS, D});
    store(O.block({b, h, s0, 0}, {BS, D}), t);
    store(Y.block({b, s0, h, 0}, {BS, D}, {1, 3}), t * 3.0);
  }, {x, heads, back}, {2, H, B});
  std::vector<double> want_heads, want_back;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < 32; ++s)
        for (int64_t d = 0; d < D; ++d) want_heads.push_back(s < S ? x.get({b, s, h, d}) : -2.5);
  for (double v : x.to_f64()) want_back.push_back(static_cast<float>(v * 3.0));
  expect_same(heads.to_f64(), want_heads, "X[b, s, h, :] windows gathered per head");
  expect_same(back.to_f64(), want_back, "windows stored back with dims {1,3}");
}

TEST_CASE("a transposed window (dims {1,0}) reads X[r0 + j][c0 + i] at tile position [i][j]") {
  const int64_t R = 20, C = 12, TI = 16, TJ = 32;
  HostTensor x(f32, {R, C});
  x.fill_uniform(24, -1, 1);
  HostTensor o(f32, {TI, TJ}), back(f32, {R, C});
  const int r0 = 8, c0 = 3;
  run("transposed_window", [&](Builder& k) {
    auto X = k.tensor("X", f32, 2), O = k.tensor("O", f32, 2), Y = k.tensor("Y", f32, 2);
    Tile t = load(X.block({r0, c0}, {TI, TJ}, {1, 0}), -INFINITY);
    store(O.block({0, 0}, {TI, TJ}), t);
    store(Y.block({0, 0}, {TI, TJ}, {1, 0}), load(X.block({0, 0}, {TI, TJ}, {1, 0})));  // round trip
  }, {x, o, back});
  std::vector<double> want;
  for (int64_t i = 0; i < TI; ++i)
    for (int64_t j = 0; j < TJ; ++j) {
      int64_t r = r0 + j, c = c0 + i;
      want.push_back(r < R && c < C ? x.get({r, c}) : -INFINITY);
    }
  expect_same(o.to_f64(), want, "transposed window at (8, 3)");
  expect_same(back.to_f64(), x.to_f64(), "transposed load then transposed store is the identity");
}

TEST_CASE("block stores are clipped at the tensor edge: nothing is written outside, not even into row gaps") {
  const int64_t R = 37, C = 50, BM = 16, BN = 32;
  HostTensor x(f32, {R, C});
  x.fill_normal(25, 0, 1);
  for (Shape strides : {Shape{C, 1}, Shape{64, 1}, Shape{1, 40}}) {
    HostTensor y(f32, {R, C}, strides);
    run("clipped_store", [&](Builder& k) {
      auto X = k.tensor("X", f32, 2), Y = k.tensor("Y", f32, 2);
      auto r0 = program_id(0) * BM, c0 = program_id(1) * BN;
      // the padding (-1) would land in Y if the store were not clipped
      store(Y.block({r0, c0}, {BM, BN}), load(X.block({r0, c0}, {BM, BN}), -1.0) * 2.0 + 1.0);
    }, {x, y}, {3, 2, 1});
    std::vector<double> want;
    for (double v : x.to_f64()) want.push_back(static_cast<float>(static_cast<float>(v * 2.0) + 1.0));
    expect_same(y.to_f64(), want, fmt::format("clipped store, strides {}", tilejit::ir::shape_string(strides)));
    CHECK_MESSAGE(gap_bytes_written(y) == 0, tilejit::ir::shape_string(strides));
  }
}

// ======================================================================= atomics

namespace {

// Each lane's history of an atomic counter: the values returned to the P programs plus the final
// value must be the initial value plus the values returned, each advanced by its own increment,
// whatever order the programs ran in.
template <class T>
void check_atomic_history(const std::vector<T>& init, const std::vector<std::vector<T>>& inc,
                          const std::vector<std::vector<T>>& prev, const std::vector<T>& fin, const std::string& what) {
  size_t bad = 0;
  for (size_t lane = 0; lane < init.size(); ++lane) {
    std::multiset<T> before{init[lane]}, after{fin[lane]};
    for (size_t p = 0; p < inc.size(); ++p) {
      before.insert(static_cast<T>(prev[p][lane] + inc[p][lane]));
      after.insert(prev[p][lane]);
    }
    if (before != after) ++bad;
  }
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} lanes have an inconsistent atomic history", what, bad));
}

}  // namespace

TEST_CASE("atomic_add from many programs onto the same f32 and i32 locations sums them and returns the old values") {
  const int64_t P = 8, N = 32;
  HostTensor vf(f32, {P, N}), accf(f32, {N}), prevf(f32, {P, N});
  HostTensor vi(i32, {P, N}), acci(i32, {N}), previ(i32, {P, N});
  // quarter-integers: every partial sum is exact in f32, so the total does not depend on the order
  vf.fill_uniform(30, -64, 64);
  for (int64_t i = 0; i < vf.numel(); ++i) vf.set_flat(i, std::round(vf.get_flat(i) * 4) / 4);
  accf.fill_uniform(31, -16, 16);
  for (int64_t i = 0; i < N; ++i) accf.set_flat(i, std::round(accf.get_flat(i) * 4) / 4);
  vi.fill_uniform(32, -1000000, 1000000);
  acci.fill_uniform(33, -1000, 1000);
  const HostTensor accf0 = accf, acci0 = acci;
  run("atomics", [&](Builder& k) {
    auto VF = k.pointer("VF", f32), AF = k.pointer("AF", f32), PF = k.pointer("PF", f32);
    auto VI = k.pointer("VI", i32), AI = k.pointer("AI", i32), PI = k.pointer("PI", i32);
    auto p = program_id(0) + program_id(1) * num_programs(0);  // a 4x2 grid of programs
    auto offs = arange(0, N);
    store(PF + p * N + offs, atomic_add(AF + offs, load(VF + p * N + offs)));
    store(PI + p * N + offs, atomic_add(AI + offs, load(VI + p * N + offs)));
  }, {vf, accf, prevf, vi, acci, previ}, {4, 2, 1});

  std::vector<double> want_f, init_f = accf0.to_f64(), fin_f = accf.to_f64();
  std::vector<double> want_i, init_i = acci0.to_f64(), fin_i = acci.to_f64();
  std::vector<std::vector<double>> inc_f(P), prev_f(P), inc_i(P), prev_i(P);
  for (int64_t lane = 0; lane < N; ++lane) {
    double sf = accf0.get({lane}), si = acci0.get({lane});
    for (int64_t p = 0; p < P; ++p) sf += vf.get({p, lane}), si += vi.get({p, lane});
    want_f.push_back(sf);
    want_i.push_back(si);
  }
  for (int64_t p = 0; p < P; ++p)
    for (int64_t lane = 0; lane < N; ++lane) {
      inc_f[static_cast<size_t>(p)].push_back(vf.get({p, lane}));
      prev_f[static_cast<size_t>(p)].push_back(prevf.get({p, lane}));
      inc_i[static_cast<size_t>(p)].push_back(vi.get({p, lane}));
      prev_i[static_cast<size_t>(p)].push_back(previ.get({p, lane}));
    }
  expect_same(fin_f, want_f, "f32 atomic_add total");
  expect_same(fin_i, want_i, "i32 atomic_add total");
  check_atomic_history(init_f, inc_f, prev_f, fin_f, "f32 atomic_add returned values");
  check_atomic_history(init_i, inc_i, prev_i, fin_i, "i32 atomic_add returned values");
}

TEST_CASE("atomic max/min/add/and/or/xor/xchg/cas from many programs, every order and scope (issue 26)") {
  const int64_t P = 8;
  test_kernels::AtomicOpsArgs args(P);
  auto& [x, amax, hist, bits, ext, slot, swap, old] = args;
  rt::interpret(test_kernels::atomic_ops().build(), {P}, {x, amax, hist, bits, ext, slot, swap, old});

  double mx = -100, mn = 100;
  for (int64_t i = 0; i < P * 64; ++i)
    if (!std::isnan(x.get_flat(i))) mx = std::max(mx, x.get_flat(i)), mn = std::min(mn, x.get_flat(i));
  std::vector<double> want_hist(16, 0);
  uint32_t o = 0, a = 0xFFFFFFFFu, xr = 0x5A5A5A5Au;
  double emax = -1e15, emin = 1e15;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t l = 0; l < 64; l += 2) want_hist[static_cast<size_t>((p * 7 + l * 3) % 16)] += 1;
    const uint32_t w = static_cast<uint32_t>(p * 40503 + 17);
    o |= w, a &= w | 0xFF00u, xr ^= w;
    for (int64_t l = 0; l < 64; ++l) {
      const double v = static_cast<double>(l - 32 + p) * 3000000000.0;
      emax = std::max(emax, v);
      if (l < 48) emin = std::min(emin, v);
    }
  }
  expect_same(amax.to_f64(), {mx, mn}, "Amax (max, min; NaN ignored)");
  expect_same(hist.to_f64(), want_hist, "Hist (masked adds)");
  expect_same(bits.to_f64(), {double(o), double(a), double(xr)}, "Bits (or, and, xor)");
  expect_same(ext.to_f64(), {emax, emin}, "Ext (i64 max, masked min)");
  expect_same(slot.to_f64(), {1, 1}, "Slot (claimed once, one winner)");
  std::vector<double> want_swap, want_old;
  for (int64_t p = 0; p < P; ++p) want_swap.push_back(double(p * 3)), want_old.push_back(double(1000 + p));
  expect_same(swap.to_f64(), want_swap, "Swap (exchanged)");
  expect_same(old.to_f64(), want_old, "Old (the exchanged values)");
}

// Window atomics beyond add against a host replay (the ops commute, so any program order gives
// the same result); elements outside the tensors are skipped.
TEST_CASE("atomic max/min/and/or/xor on windows from many programs, clipped at the edges (issue 26)") {
  const int64_t P = 6, R = 64, C = 48;
  HostTensor x(f32, {P * 8, 64}), f(f32, {R, C}), i(i32, {R, C}), u(u32, {R, C}), l(i64, {R, C});
  x.fill_uniform(51, -5, 5);
  f.fill_uniform(52, -1, 1), i.fill_uniform(53, -2000, 2000), u.fill_uniform(54, 0, 4e9), l.fill_uniform(55, -1e12, 1e12);
  HostTensor wf = f, wi = i, wu = u, wl = l;  // the host replay
  for (int64_t p = 0; p < P; ++p) {
    const int64_t r0 = p * 3 - 2, c0 = p * 5 - 8;
    for (int64_t a = 0; a < 8; ++a)
      for (int64_t c = 0; c < 64; ++c) {
        const double xv = x.get({p * 8 + a, c});
        const auto xi = static_cast<int32_t>(static_cast<float>(xv) * 1000.0f);
        const uint32_t w = static_cast<uint32_t>(xi) * 2654435761u + static_cast<uint32_t>(p);
        const auto at = [&](HostTensor& t, int64_t row, const std::function<double(double)>& update) {
          if (row >= 0 && row < R && c0 + c >= 0 && c0 + c < C) t.set({row, c0 + c}, update(t.get({row, c0 + c})));
        };
        at(wf, r0 + a, [&](double old) { return std::fmax(old, xv); });
        at(wf, r0 + 24 + a, [&](double old) { return std::fmin(old, xv); });
        at(wi, r0 + a, [&](double old) { return std::max<double>(old, xi); });
        at(wi, r0 + 24 + a, [&](double old) { return std::min<double>(old, xi); });
        at(wu, r0 + a, [&](double old) { return static_cast<uint32_t>(old) & (w | 0x0F0F0F0Fu); });
        at(wu, r0 + 24 + a, [&](double old) { return static_cast<uint32_t>(old) | (w & 0x00FF00FFu); });
        at(wu, r0 + 48 + a, [&](double old) { return static_cast<uint32_t>(old) ^ w; });
        at(wl, r0 + a, [&](double old) { return std::max<double>(old, static_cast<double>(int64_t{xi} * 5000000000)); });
      }
  }
  const HostTensor f0 = f, u0 = u;
  rt::interpret(test_kernels::window_atomics().build(), {P}, {rt::Arg(x), rt::Arg(f), rt::Arg(i), rt::Arg(u), rt::Arg(l)});
  for (const auto& [got, want, what] : {std::tuple{&f, &wf, "f32 max / min"}, std::tuple{&i, &wi, "i32 max / min"},
                                         std::tuple{&u, &wu, "u32 and / or / xor"}, std::tuple{&l, &wl, "i64 max"}}) {
    size_t bad = 0;
    for (int64_t e = 0; e < R * C; ++e) bad += got->get_flat(e) == want->get_flat(e) ? 0 : 1;
    CHECK_MESSAGE(bad == 0, std::string(what) << ": " << bad << " elements differ from the host replay");
  }
  // the windows reached into the tensors: many elements changed
  size_t changed_f = 0, changed_u = 0;
  for (int64_t e = 0; e < R * C; ++e) changed_f += f.get_flat(e) != f0.get_flat(e), changed_u += u.get_flat(e) != u0.get_flat(e);
  CHECK(changed_f > 500);
  CHECK(changed_u > 500);
  CHECK_THROWS_WITH_AS(kernel("bad", [](Builder& b) {
                         auto T = b.tensor("T", f32, 2);
                         atomic_and(T.block({0, 0}, {8, 8}), zeros(f32, {8, 8}));
                       }).build(),
                       doctest::Contains("atomic_and on a window of f32 elements: atomic_and takes i32 u32 i64 u64 tensors"), tilejit::lang::BuildError);
}

TEST_CASE("atomic rmw and cas: dtype errors name the op and the valid types") {
  auto error = [](const std::function<void(Builder&)>& body) {
    try {
      kernel("bad_atomic", body).build();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string m = error([](Builder& k) { atomic_and(k.pointer("P", f32), 1.0f); });
  CHECK_MESSAGE(m.find("atomic_and: the pointer points to f32; atomic_and takes i32 u32 i64 u64") != std::string::npos, m);
  m = error([](Builder& k) { atomic_max(k.pointer("P", bf16) + arange(0, 16), cast(bf16, arange(0, 16))); });
  CHECK_MESSAGE(m.find("atomic_max: the pointer points to bf16; atomic_max takes i32 u32 i64 u64 f32 f64") != std::string::npos, m);
  m = error([](Builder& k) { atomic_cas(k.pointer("P", f32), 0.0f, 1.0f); });
  CHECK_MESSAGE(m.find("atomic_cas: the pointer points to f32; atomic_cas takes i32 u32 i64 u64") != std::string::npos, m);
  m = error([](Builder& k) { atomic_xchg(k.pointer("P", i32), cast(i64, arange(0, 16))); });
  CHECK_MESSAGE(m.find("atomic_xchg: the value is i64[16] but the pointer points to i32") != std::string::npos, m);
}

TEST_CASE("atomic_add on a scalar counter hands out distinct tickets; masked lanes are untouched") {
  const int64_t P = 12;
  HostTensor counter(i32, {1}), tickets(i32, {P});
  counter.fill(0);
  HostTensor hist(f32, {10}), vals(f32, {16});
  hist.fill_uniform(40, -4, 4);
  for (int64_t i = 0; i < 10; ++i) hist.set_flat(i, std::round(hist.get_flat(i)));
  const HostTensor hist0 = hist;
  vals.fill_uniform(41, -4, 4);
  for (int64_t i = 0; i < 16; ++i) vals.set_flat(i, std::round(vals.get_flat(i)));
  run("tickets", [&](Builder& k) {
    auto C = k.pointer("C", i32), T = k.pointer("T", i32), Hst = k.pointer("H", f32), V = k.pointer("V", f32);
    auto p = program_id(0);
    store(T + p, atomic_add(C, 1));
    // lanes 10..15 of a 16-wide tile point past the end of H: masked off, they must not be touched
    auto offs = arange(0, 16);
    atomic_add(Hst + offs, load(V + offs), offs < 10);
  }, {counter, tickets, hist, vals}, {P, 1, 1});
  CHECK(counter.get_flat(0) == P);
  auto t = tickets.to_f64();
  std::sort(t.begin(), t.end());
  std::vector<double> want;
  for (int64_t i = 0; i < P; ++i) want.push_back(static_cast<double>(i));
  expect_same(t, want, "tickets are 0..P-1 in some order");
  std::vector<double> want_h;
  for (int64_t i = 0; i < 10; ++i) want_h.push_back(hist0.get_flat(i) + static_cast<double>(P) * vals.get_flat(i));
  expect_same(hist.to_f64(), want_h, "masked f32 atomic_add");
}

// ======================================================================= dtypes in memory

TEST_CASE("loads and stores of bf16 and f16 move the exact bits (inf, -0, subnormals, NaN payloads)") {
  const int64_t n = 64;
  for (DType d : {bf16, f16}) {
    HostTensor x(d, {n}), y(d, {n});
    x.fill_normal(50, 0, 100);
    // bf16 and f16 infinities, zeros, subnormals, max-finite, quiet and signalling NaNs with payloads
    const uint16_t specials[] = {0x7F80, 0xFF80, 0x8000, 0x0001, 0x8003, 0x7FC0, 0x7C00, 0xFC00, 0x7E00,
                                 0x03FF, 0x7BFF, 0x7F81, 0xFFA5, 0x7D01, 0xFE33, 0x7F7F};
    for (size_t i = 0; i < std::size(specials); ++i) set_raw<uint16_t>(x, static_cast<int64_t>(i), specials[i]);
    run("copy16", [&](Builder& k) {
      auto X = k.pointer("X", d), Y = k.pointer("Y", d);
      auto offs = arange(0, n);
      store(Y + offs, load(X + offs));
    }, {x, y});
    std::vector<double> got, want;
    for (uint16_t v : raw<uint16_t>(y)) got.push_back(v);
    for (uint16_t v : raw<uint16_t>(x)) want.push_back(v);
    expect_same(got, want, fmt::format("{} copy, bit patterns", tilejit::ir::name(d)));
  }
}

TEST_CASE("f32 loads and stores move the exact bits, signalling NaNs included") {
  const int64_t n = 32;
  HostTensor x(f32, {n}), y(f32, {n});
  x.fill_normal(55, 0, 1);
  const uint32_t specials[] = {0x7F800001u, 0xFFBFFFFFu, 0x7FC12345u, 0x00000001u, 0x80000000u, 0x7F7FFFFFu};
  for (size_t i = 0; i < std::size(specials); ++i) set_raw<uint32_t>(x, static_cast<int64_t>(i), specials[i]);
  run("copy32", [&](Builder& k) {
    auto X = k.pointer("X", f32), Y = k.pointer("Y", f32);
    auto offs = arange(0, n);
    store(Y + offs, load(X + offs));
  }, {x, y});
  std::vector<double> got, want;
  for (uint32_t v : raw<uint32_t>(y)) got.push_back(v);
  for (uint32_t v : raw<uint32_t>(x)) want.push_back(v);
  expect_same(got, want, "f32 copy, bit patterns");
}

TEST_CASE("narrow dtypes in arithmetic: bf16 load -> f32 math -> bf16 store rounds once; literals are rounded to bf16") {
  const int64_t n = 128;
  HostTensor x(bf16, {n}), y(bf16, {n}), z(bf16, {n}), h(f16, {n}), hf(f32, {n});
  x.fill_normal(51, 0, 3);
  h.fill_uniform(52, -60000, 60000);
  run("narrow_math", [&](Builder& k) {
    auto X = k.pointer("X", bf16), Y = k.pointer("Y", bf16), Z = k.pointer("Z", bf16), Hp = k.pointer("H", f16),
         HF = k.pointer("HF", f32);
    auto offs = arange(0, n);
    store(Y + offs, cast(bf16, cast(f32, load(X + offs)) * 3.0f));
    store(Z + offs, 0.1);  // a literal stored through a bf16 pointer
    store(HF + offs, cast(f32, load(Hp + offs)) * 0.5);
  }, {x, y, z, h, hf});
  std::vector<double> wy, wz(static_cast<size_t>(n), tilejit::ir::round_to(bf16, 0.1f)), wh;
  for (double v : x.to_f64()) wy.push_back(tilejit::ir::round_to(bf16, static_cast<float>(v * 3.0)));
  for (double v : h.to_f64()) wh.push_back(v * 0.5);
  expect_same(y.to_f64(), wy, "bf16 * 3 through f32");
  expect_same(z.to_f64(), wz, "store(bf16 ptr, 0.1)");
  expect_same(hf.to_f64(), wh, "f16 load widened to f32");
}

TEST_CASE("i8 and u8 loads sign- and zero-extend; stores wrap to 8 bits") {
  const int64_t n = 64;
  HostTensor s(i8, {n}), u(u8, {n}), s32(i32, {n}), u32o(i32, {n}), back8(u8, {n}), copy8(i8, {n});
  s.fill_uniform(53, -128, 127);
  u.fill_uniform(54, 0, 255);
  set_raw<int8_t>(s, 0, -128);
  set_raw<int8_t>(s, 1, -1);
  set_raw<uint8_t>(u, 0, 255);
  set_raw<uint8_t>(u, 1, 128);
  run("bytes", [&](Builder& k) {
    auto S = k.pointer("S", i8), U = k.pointer("U", u8), S32 = k.pointer("S32", i32), U32 = k.pointer("U32", i32),
         B8 = k.pointer("B8", u8), C8 = k.pointer("C8", i8);
    auto offs = arange(0, n);
    auto sv = load(S + offs);
    auto uv = load(U + offs);
    store(S32 + offs, cast(i32, sv));
    store(U32 + offs, cast(i32, uv));
    store(B8 + offs, cast(u8, cast(i32, sv) * 3 + 1));  // wraps modulo 256
    store(C8 + offs, sv);
  }, {s, u, s32, u32o, back8, copy8});
  std::vector<double> ws, wu, wb;
  for (int8_t v : raw<int8_t>(s)) ws.push_back(v), wb.push_back(static_cast<uint8_t>(v * 3 + 1));
  for (uint8_t v : raw<uint8_t>(u)) wu.push_back(v);
  expect_same(s32.to_f64(), ws, "i8 -> i32");
  expect_same(u32o.to_f64(), wu, "u8 -> i32");
  expect_same(back8.to_f64(), wb, "i32 -> u8 wraps");
  expect_same(copy8.to_f64(), s.to_f64(), "i8 copy");
}

TEST_CASE("storing a value of another dtype is a build error that suggests cast") {
  int line = 0;
  auto k = kernel("wrong_store", [&](Builder& kb) {
    auto X = kb.pointer("X", bf16);
    auto offs = arange(0, 16);
    line = __LINE__ + 1;
    store(X + offs, zeros(f32, {16}));
  });
  CHECK_THROWS_WITH_AS(k.build(), doctest::Contains("cast(bf16, value)"), BuildError);
  try {
    k.build();
  } catch (const BuildError& e) {
    CHECK(std::string(e.what()).find(fmt::format("test_memory.cpp:{}", line)) != std::string::npos);
    CHECK(std::string(e.what()).find("f32[16]") != std::string::npos);
  }
}
