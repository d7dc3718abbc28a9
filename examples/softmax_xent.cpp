// Softmax cross-entropy, forward and backward fused: one program per row of logits (up to
// BLOCK = 4096 classes in one tile) and its i32 label; loss = logsumexp(x) - x[label] and
// dlogits = softmax(x) - onehot(label) (the gradient of the summed loss), so the logits are read once.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "gpu_timing.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

Kernel xent_kernel = kernel("softmax_xent", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 4096);
  auto X = k.pointer("X", f32), Labels = k.pointer("Labels", i32);
  auto Loss = k.pointer("Loss", f32), DX = k.pointer("DX", f32);
  auto C = k.scalar<int>("C");

  auto r = program_id(0);
  auto cols = arange(0, BLOCK);
  auto mask = cols < C;
  auto x = load(X + r * C + cols, mask, -INFINITY);  // -inf: exp gives 0 past the end
  auto is_label = cols == load(Labels + r);
  auto m = max(x);
  auto e = exp(x - m);
  auto s = sum(e);
  store(Loss + r, m + log(s) - sum(where(is_label, x, 0.0f)));
  store(DX + r * C + cols, e / s - cast(f32, is_label), mask);
});

int main(int argc, char** argv) {
  auto fn = xent_kernel.build({{"BLOCK", 4096}});
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(fn);
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(fn).c_str(), stdout);
    return 0;
  }

  const int rows = 6, C = 3000;  // ragged: C < BLOCK
  HostTensor x(f32, {rows, C}), labels(i32, {rows}), loss(f32, {rows}), dx(f32, {rows, C});
  x.fill_normal(11, 0, 3);
  for (int i = 0; i < rows; ++i) labels.set({i}, (i * 977 + 5) % C);
  auto report = tilejit::runtime::run(fn, {rows}, {x, labels, loss, dx, C});

  std::vector<double> rloss(static_cast<size_t>(rows)), rdx(static_cast<size_t>(rows * C));
  for (int i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0;
    int label = static_cast<int>(labels.get({i}));
    for (int j = 0; j < C; ++j) m = std::max(m, x.get({i, j}));
    for (int j = 0; j < C; ++j) s += std::exp(x.get({i, j}) - m);
    rloss[static_cast<size_t>(i)] = m + std::log(s) - x.get({i, label});
    for (int j = 0; j < C; ++j)
      rdx[static_cast<size_t>(i * C + j)] = std::exp(x.get({i, j}) - m) / s - (j == label ? 1 : 0);
  }
  using tilejit::runtime::rel_error;
  double err = std::max(rel_error(loss.to_f64(), rloss), rel_error(dx.to_f64(), rdx));
  bool gpu = report.where == tilejit::runtime::Where::Gpu;
  std::printf("softmax_xent fwd+bwd (%s): %dx%d, largest relative error (loss, dlogits) vs float64 = %.3g (limit 1e-5)\n",
              gpu ? "GPU" : "CPU interpreter", rows, C, err);
  if (!(err < 1e-5)) return 1;

  if (gpu) {  // bandwidth at a large shape: logits read once, dlogits written once
    const int R = 16384, N = 4096;
    HostTensor hx(f32, {R, N}), hl(i32, {R});
    hx.fill_normal(12, 0, 3);
    for (int i = 0; i < R; ++i) hl.set({i}, i % N);
    using tilejit::runtime::DeviceTensor;
    auto dX = DeviceTensor::from_host(hx), dL = DeviceTensor::from_host(hl);
    DeviceTensor dLoss(f32, {R}), dDX(f32, {R, N});
    auto f = tilejit::compile(xent_kernel, {{"BLOCK", 4096}});
    report_bandwidth("softmax_xent 16384x4096 f32", 2.0 * R * N * 4,
                     [&](const tilejit::runtime::Stream& s) { f({R}, s, dX, dL, dLoss, dDX, N); });
  }
  return 0;
}
