// The top K = 16 logits of each row (e.g. for top-k sampling): one program per row, the whole row
// (up to BLOCK = 1024 f32) in one tile, topk (dsl/sort.hpp) giving the values, largest first, and
// their i32 column indices. Padding with -inf never displaces a real element: a real -inf ties with
// it and wins on its smaller index.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "gpu_timing.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

constexpr int K = 16;

Kernel topk_kernel = kernel("topk_logits", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 1024);
  auto X = k.tensor("X", f32, 2);
  auto Values = k.tensor("Values", f32, 2);
  auto Indices = k.tensor("Indices", i32, 2);

  auto r = program_id(0);
  TopK top = topk(load(X.block({r, 0}, {1, BLOCK}), -INFINITY), K, 1);  // [1, K] each
  store(Values.block({r, 0}, {1, K}), top.values);
  store(Indices.block({r, 0}, {1, K}), top.indices);
});

// topk's order: larger first, NaN largest, +0.0 above -0.0, then the smaller index first.
bool before(double a, int ia, double b, int ib) {
  if (std::isnan(a) != std::isnan(b)) return std::isnan(a);
  if (!std::isnan(a) && a != b) return a > b;
  if (!std::isnan(a) && std::signbit(a) != std::signbit(b)) return !std::signbit(a);
  return ia < ib;
}

int main(int argc, char** argv) {
  auto fn = topk_kernel.build({{"BLOCK", 1024}});
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(fn);
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(fn).c_str(), stdout);
    return 0;
  }

  const int rows = 6, cols = 1000;  // ragged: cols < BLOCK
  HostTensor x(f32, {rows, cols}), values(f32, {rows, K}), indices(i32, {rows, K});
  x.fill_normal(5, 0, 2);
  for (int64_t i = 0; i < x.numel(); ++i) x.set_flat(i, std::round(x.get_flat(i) * 4) / 4);  // many ties
  x.set({1, 700}, NAN);  // a NaN counts as the largest
  x.set({2, 10}, 100), x.set({2, 20}, 100), x.set({2, 5}, 100);  // equal maxima: index order
  auto report = tilejit::runtime::run(fn, {rows}, {x, values, indices});

  int bad = 0;
  for (int i = 0; i < rows; ++i) {
    std::vector<int> order(cols);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int a, int b) { return before(x.get({i, a}), a, x.get({i, b}), b); });
    for (int j = 0; j < K; ++j) {
      double want = x.get({i, order[static_cast<size_t>(j)]}), got = values.get({i, j});
      bool same = (std::isnan(want) && std::isnan(got)) || want == got;
      if (!same || indices.get({i, j}) != order[static_cast<size_t>(j)]) ++bad;
    }
  }
  bool gpu = report.where == tilejit::runtime::Where::Gpu;
  std::printf("topk_logits (%s): %dx%d, k=%d, %d of %d (value, index) pairs differ from std::partial_sort\n",
              gpu ? "GPU" : "CPU interpreter", rows, cols, K, bad, rows * K);
  if (bad) return 1;

  if (gpu) {  // bandwidth at a large shape: the logits read once, K values and indices written
    const int R = 65536, C = 1024;
    HostTensor hx(f32, {R, C});
    hx.fill_normal(6, 0, 2);
    auto dx = tilejit::runtime::DeviceTensor::from_host(hx);
    tilejit::runtime::DeviceTensor dv(f32, {R, K}), di(i32, {R, K});
    // two warps a row: 364.7 us vs 424.1 (1 warp), 391.6 (4), 496.2 (8) on an H100 (2026-11-27)
    tilejit::jit::CompileOptions o;
    o.num_warps = 2;
    auto f = tilejit::compile(topk_kernel, {{"BLOCK", 1024}}, o);
    report_bandwidth("topk_logits 65536x1024 f32, k=16", (double(R) * C + 2.0 * R * K) * 4,
                     [&](const tilejit::runtime::Stream& s) { f({R}, s, dx, dv, di); });
  }
  return 0;
}
