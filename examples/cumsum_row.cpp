// Inclusive prefix sum along each row: one program per row, the whole row (up to BLOCK = 4096
// f32) in one tile, scanned with cumsum (dsl/combine.hpp). Zeros pad the ragged tail; they come
// after every real element, so they never change a stored prefix.
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "gpu_timing.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

Kernel cumsum_kernel = kernel("cumsum_row", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 4096);
  auto X = k.tensor("X", f32, 2);
  auto Y = k.tensor("Y", f32, 2);

  auto r = program_id(0);
  auto x = load(X.block({r, 0}, {1, BLOCK}), 0.0f);  // [1, BLOCK], 0 past the end of the row
  store(Y.block({r, 0}, {1, BLOCK}), cumsum(x, 1));   // elements past the end are not stored
});

int main(int argc, char** argv) {
  auto fn = cumsum_kernel.build({{"BLOCK", 4096}});
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(fn);
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(fn).c_str(), stdout);
    return 0;
  }

  const int rows = 5, cols = 4000;  // ragged: cols < BLOCK
  HostTensor x(f32, {rows, cols}), y(f32, {rows, cols});
  x.fill_uniform(3, -1, 1);
  auto report = tilejit::runtime::run(fn, {rows}, {x, y});

  std::vector<double> ref(static_cast<size_t>(rows * cols));
  for (int i = 0; i < rows; ++i) {
    double s = 0;  // float64 running sum
    for (int j = 0; j < cols; ++j) ref[static_cast<size_t>(i * cols + j)] = s += x.get({i, j});
  }
  double err = tilejit::runtime::rel_error(y.to_f64(), ref);
  bool gpu = report.where == tilejit::runtime::Where::Gpu;
  std::printf("cumsum_row (%s): %dx%d, relative error vs float64 reference = %.3g (limit 1e-5)\n",
              gpu ? "GPU" : "CPU interpreter", rows, cols, err);
  if (!(err < 1e-5)) return 1;

  if (gpu) {  // bandwidth at a large shape: read X once, write Y once
    const int R = 16384, C = 4096;
    HostTensor hx(f32, {R, C});
    hx.fill_uniform(4, -1, 1);
    auto dx = tilejit::runtime::DeviceTensor::from_host(hx), dy = tilejit::runtime::DeviceTensor(f32, {R, C});
    auto f = tilejit::compile(cumsum_kernel, {{"BLOCK", 4096}});
    report_bandwidth("cumsum_row 16384x4096 f32", 2.0 * R * C * 4,
                     [&](const tilejit::runtime::Stream& s) { f({R}, s, dx, dy); });
  }
  return 0;
}
