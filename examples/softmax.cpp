// Row-wise softmax: one program per row, the whole row in one tile (BLOCK >= number of columns),
// padded with -inf so the ragged tail does not change the max or the sum. Runs for f32 and bf16.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

Kernel softmax_kernel = kernel("softmax", [](Builder& k) {
  auto T = k.meta_dtype("DTYPE", f32);
  auto BLOCK = k.meta<int>("BLOCK", 128);
  auto X = k.tensor("X", T, 2);
  auto Y = k.tensor("Y", T, 2);

  auto r = program_id(0);
  auto x = cast(f32, load(X.block({r, 0}, {1, BLOCK}), -INFINITY));  // [1, BLOCK], -inf past the end
  auto z = x - max(x, 1)[col];
  auto e = exp(z);
  store(Y.block({r, 0}, {1, BLOCK}), cast(T, e / sum(e, 1)[col]));
});

int run(DType dtype, double tolerance) {
  const int rows = 37, cols = 100;
  auto fn = softmax_kernel.build({{"DTYPE", dtype}, {"BLOCK", 128}});
  HostTensor x(dtype, {rows, cols}), y(dtype, {rows, cols});
  x.fill_normal(7, 0, 3);
  auto report = tilejit::runtime::run(fn, {rows}, {x, y});

  std::vector<double> ref(static_cast<size_t>(rows * cols));
  for (int i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < cols; ++j) m = std::max(m, x.get({i, j}));
    for (int j = 0; j < cols; ++j) s += std::exp(x.get({i, j}) - m);
    for (int j = 0; j < cols; ++j) ref[static_cast<size_t>(i * cols + j)] = std::exp(x.get({i, j}) - m) / s;
  }
  double err = tilejit::runtime::rel_error(y.to_f64(), ref);
  std::printf("softmax %s (%s): %dx%d, relative error vs float64 reference = %.3g (limit %.0e)\n",
              std::string(tilejit::ir::name(dtype)).c_str(),
              report.where == tilejit::runtime::Where::Gpu ? "GPU" : "CPU interpreter", rows, cols, err, tolerance);
  return err < tolerance ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(softmax_kernel.build({{"DTYPE", bf16}}));
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(softmax_kernel.build()).c_str(), stdout);
    return 0;
  }
  return run(f32, 1e-5) | run(bf16, 1e-2);
}
