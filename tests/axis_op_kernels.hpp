// Kernels over one axis of a tile -- scans, combine reductions, sorts -- shared by the suites that
// run them against the interpreter: on the GPU (test_jit_gpu.cpp) and in the emulator
// (test_emulator.cpp). Each case is a shape, the axis, the warps and a dtype; the kernel works on
// one program's whole tile.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "dsl/lang.hpp"
#include "runtime/host_tensor.hpp"

namespace axis_ops {

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

struct Case {
  tilejit::ir::Shape shape;
  int axis, warps;
  DType dtype;
};

// X -> S = cumsum (i64 / f32), A = affine maps composed along the axis (order-sensitive), M =
// argmax with its index in one reduce (first among equals, NaN first).
inline Kernel combine_kernel(const Case& c, bool reverse) {
  return kernel("combine_axis", [c, reverse](Builder& kb) {
    const int rank = static_cast<int>(c.shape.size());
    const bool integer = !tilejit::ir::is_float(c.dtype);
    auto X = kb.tensor("X", c.dtype, rank), S = kb.tensor("S", integer ? i64 : f32, rank), A = kb.tensor("A", i32, rank);
    auto M = kb.tensor("M", i32, rank);
    const std::vector<Operand> zero(c.shape.size(), Operand(0));
    Tile x = load(X.block(zero, c.shape));
    store(S.block(zero, c.shape), cast(integer ? i64 : f32, cumsum(x, c.axis, reverse)));
    Tile xi = cast(i32, x);
    std::vector<Tile> h = associative_scan({(xi % 3) - 1, xi}, c.axis, [](const std::vector<Tile>& p, const std::vector<Tile>& q) {
      return std::vector<Tile>{p[0] * q[0], q[0] * p[1] + q[1]};
    }, reverse);
    store(A.block(zero, c.shape), h[1] * 7 + h[0]);
    Tile idx = cast(i32, x) * 0;
    for (int d = 0; d < rank; ++d) {
      Tile ar = arange(0, c.shape[static_cast<size_t>(d)]);
      if (rank == 2) ar = d == 0 ? ar[col] : ar[row];
      if (d == c.axis) idx = idx + broadcast_to(ar, c.shape);
    }
    std::vector<Tile> m = reduce({x, idx}, c.axis, [](const std::vector<Tile>& p, const std::vector<Tile>& q) {
      Tile p_nan = p[0] != p[0], q_nan = q[0] != q[0];
      Tile take_p = p_nan | ((!q_nan) & ((p[0] > q[0]) | ((p[0] == q[0]) & (p[1] < q[1]))));
      return std::vector<Tile>{where(take_p, p[0], q[0]), where(take_p, p[1], q[1])};
    });
    Tile back = expand_dims(m[1], c.axis);
    store(M.block(zero, back.shape()), back);
  });
}

// combine_kernel's tensors: X filled (integers in a small range, floats in [-1, 1] with a NaN),
// the outputs S, A, M.
inline std::vector<HostTensor> combine_tensors(const Case& c) {
  const bool integer = !tilejit::ir::is_float(c.dtype);
  tilejit::ir::Shape reduced = c.shape;
  reduced[static_cast<size_t>(c.axis)] = 1;
  std::vector<HostTensor> t;
  t.emplace_back(c.dtype, c.shape);
  if (integer) t[0].fill_uniform(5, c.dtype == i8 ? -100 : -1000, c.dtype == i8 ? 100 : 1000);
  else t[0].fill_uniform(5, -1, 1);
  if (!integer) t[0].set(std::vector<int64_t>(c.shape.size(), 1), NAN);
  t.emplace_back(integer ? i64 : f32, c.shape);
  t.emplace_back(i32, c.shape);
  t.emplace_back(i32, reduced);
  return t;
}

// X -> S = sort, A = argsort, F = flip (descending) or xor_permute by 5, TV / TI = top 4.
inline Kernel sort_kernel(const Case& c, bool descending) {
  return kernel("sort_axis", [c, descending](Builder& kb) {
    const int rank = static_cast<int>(c.shape.size());
    tilejit::ir::Shape top_shape = c.shape;
    top_shape[static_cast<size_t>(c.axis)] = 4;
    auto X = kb.tensor("X", c.dtype, rank), S = kb.tensor("S", c.dtype, rank), A = kb.tensor("A", i32, rank);
    auto F = kb.tensor("F", c.dtype, rank), TV = kb.tensor("TV", c.dtype, rank), TI = kb.tensor("TI", i32, rank);
    const std::vector<Operand> zero(c.shape.size(), Operand(0));
    Tile x = load(X.block(zero, c.shape));
    store(S.block(zero, c.shape), sort(x, c.axis, descending));
    store(A.block(zero, c.shape), argsort(x, c.axis, descending));
    store(F.block(zero, c.shape), descending ? flip(x, c.axis) : xor_permute(x, c.axis, 5));
    TopK top = topk(x, 4, c.axis);
    store(TV.block(zero, top_shape), top.values);
    store(TI.block(zero, top_shape), top.indices);
  });
}

// sort_kernel's tensors: X (floats with NaN, signed zeros and infinities; integers with many ties,
// which show argsort's stability), then S, A, F, TV, TI.
inline std::vector<HostTensor> sort_tensors(const Case& c) {
  tilejit::ir::Shape top_shape = c.shape;
  top_shape[static_cast<size_t>(c.axis)] = 4;
  std::vector<HostTensor> t;
  t.emplace_back(c.dtype, c.shape);
  if (tilejit::ir::is_float(c.dtype)) {
    t[0].fill_uniform(12, -4, 4);
    const double special[] = {NAN, -0.0, 0.0, INFINITY, -INFINITY, 1.0, 1.0, NAN};
    for (int64_t i = 0; i < 8; ++i) t[0].set_flat(i * 37 % t[0].numel(), special[i]);
  } else {
    t[0].fill_uniform(12, 0, c.dtype == u8 ? 20 : 50);
  }
  t.emplace_back(c.dtype, c.shape);
  t.emplace_back(i32, c.shape);
  t.emplace_back(c.dtype, c.shape);
  t.emplace_back(c.dtype, top_shape);
  t.emplace_back(i32, top_shape);
  return t;
}

// histogram's two lowerings (jit/lower/histogram.cpp): ballots and popcounts up to 1024 bins (fewer
// bins than lanes, several bins per lane, elements several threads hold, 1 to 8 warps), shared
// atomics above; values below 0 and past the last bin, 8- to 64-bit dtypes.
struct HistogramCase {
  tilejit::ir::Shape shape;
  DType dtype;
  int64_t bins;
  int warps;
};

inline std::vector<HistogramCase> histogram_cases() {
  return {{{1024}, i32, 64, 4}, {{16}, i32, 8, 4},        {{16, 16}, u8, 64, 8}, {{256}, i64, 2048, 4},  {{2048}, i32, 1, 2},
          {{64}, i16, 256, 1},  {{8, 128}, u32, 1024, 4}, {{512}, i32, 32, 4},   {{4096}, i32, 16384, 4}};
}

// X (the case's shape and dtype) -> H = histogram(X, bins, method)
inline Kernel histogram_kernel(const HistogramCase& c, HistogramMethod method = HistogramMethod::ballots) {
  return kernel("histogram_case", [c, method](Builder& b) {
    auto X = b.tensor("X", c.dtype, static_cast<int>(c.shape.size())), H = b.tensor("H", i32, 1);
    const std::vector<Operand> origin(c.shape.size(), Operand(0));
    store(H.block({0}, {c.bins}), histogram(load(X.block(origin, c.shape)), c.bins, method));
  });
}

// {X, H}: whole values from just below 0 to past the last bin (or the dtype's top), H at -1
inline std::vector<HostTensor> histogram_tensors(const HistogramCase& c) {
  HostTensor x(c.dtype, c.shape), h(i32, {c.bins});
  x.fill_uniform(21, tilejit::ir::is_signed(c.dtype) ? -8 : 0, static_cast<double>(std::min<int64_t>(c.bins + 8, 250)));
  for (int64_t e = 0; e < x.numel(); ++e) x.set_flat(e, std::floor(x.get_flat(e)));
  h.fill(-1);
  return {x, h};
}

}  // namespace axis_ops
