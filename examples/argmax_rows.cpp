// The column of each row's largest element (greedy decoding, classification): one program per
// row, the whole row in one tile, argmax (dsl/math.hpp) with PyTorch's rules: the first index among
// equal values, and a NaN counts as the largest. -inf pads the ragged tail, which never wins (a real
// -inf ties with it and has the smaller index).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "gpu_timing.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

Kernel argmax_kernel = kernel("argmax_rows", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 1024);
  auto X = k.tensor("X", f32, 2);
  auto Out = k.tensor("Out", i32, 1);

  auto r = program_id(0);
  auto x = load(X.block({r, 0}, {1, BLOCK}), -INFINITY);  // [1, BLOCK]
  store(Out.block({r}, {1}), argmax(x, 1));                // [1]: the axis disappears
});

int main(int argc, char** argv) {
  auto fn = argmax_kernel.build({{"BLOCK", 1024}});
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(fn);
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(fn).c_str(), stdout);
    return 0;
  }

  const int rows = 8, cols = 1000;  // ragged: cols < BLOCK
  HostTensor x(f32, {rows, cols}), out(i32, {rows});
  x.fill_normal(8, 0, 1);
  x.set({1, 300}, 50), x.set({1, 200}, 50);  // equal maxima: the first index
  x.set({2, 900}, NAN), x.set({2, 950}, NAN), x.set({2, 10}, INFINITY);  // the first NaN wins
  for (int j = 0; j < cols; ++j) x.set({3, j}, -INFINITY);  // all -inf: index 0
  x.set({4, 7}, 0.0), x.set({4, 3}, -0.0);
  for (int j = 0; j < cols; ++j)
    if (j != 3 && j != 7) x.set({4, j}, -1);  // -0.0 equals +0.0: index 3
  auto report = tilejit::runtime::run(fn, {rows}, {x, out});

  int bad = 0;
  for (int i = 0; i < rows; ++i) {
    int best = 0;
    for (int j = 1; j < cols; ++j) {
      double b = x.get({i, best}), v = x.get({i, j});
      if (!std::isnan(b) && (std::isnan(v) || v > b)) best = j;
    }
    if (out.get({i}) != best) ++bad;
  }
  bool gpu = report.where == tilejit::runtime::Where::Gpu;
  std::printf("argmax_rows (%s): %dx%d, %d of %d rows differ from the host reference\n",
              gpu ? "GPU" : "CPU interpreter", rows, cols, bad, rows);
  if (bad) return 1;

  if (gpu) {  // bandwidth at a large shape: X read once, one i32 per row written
    const int R = 65536, C = 1024;
    HostTensor hx(f32, {R, C});
    hx.fill_normal(9, 0, 1);
    auto dx = tilejit::runtime::DeviceTensor::from_host(hx);
    tilejit::runtime::DeviceTensor dout(i32, {R});
    auto f = tilejit::compile(argmax_kernel, {{"BLOCK", 1024}});
    report_bandwidth("argmax_rows 65536x1024 f32", (double(R) * C + R) * 4,
                     [&](const tilejit::runtime::Stream& s) { f({R}, s, dx, dout); });
  }
  return 0;
}
