// LayerNorm over the last dim, forward and backward: one program per row, the whole row (up to
// BLOCK = 1024 f32) in one tile. The forward saves each row's mean and 1/std for the backward;
// the backward's dW and dB sum over rows: each program sums its ROWS rows' parts, then adds them
// atomically.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "gpu_timing.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

Kernel layernorm_fwd = kernel("layernorm_fwd", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 1024);
  auto X = k.pointer("X", f32), W = k.pointer("W", f32), B = k.pointer("B", f32);
  auto Y = k.pointer("Y", f32), Mean = k.pointer("Mean", f32), Rstd = k.pointer("Rstd", f32);
  auto n = k.scalar<int>("n");
  auto eps = k.scalar<float>("eps");

  auto r = program_id(0);
  auto cols = arange(0, BLOCK);
  auto mask = cols < n;
  auto x = load(X + r * n + cols, mask, 0.0f);
  auto mean = sum(x) / cast(f32, n);
  auto xc = where(mask, x - mean, 0.0f);  // the padding must not count in the variance
  auto rstd = rsqrt(sum(xc * xc) / cast(f32, n) + eps);
  store(Y + r * n + cols, xc * rstd * load(W + cols, mask) + load(B + cols, mask), mask);
  store(Mean + r, mean);
  store(Rstd + r, rstd);
});

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w; dW += dy * xhat, dB += dy.
// A program takes ROWS rows and sums its dW / dB parts in registers first, then adds them with one
// atomic per column: ROWS times fewer atomics on the same 2 x n addresses (one atomic add per row
// and column serialised on them: 218 GB/s at 65536 x 1024 on the H100). Its rows are strided by
// the program count (program p takes rows p, p + P, ...), so the programs in flight read
// neighbouring rows: 2692 vs 2508 GB/s for ROWS consecutive rows a program (H100, 2026-11-27).
Kernel layernorm_bwd = kernel("layernorm_bwd", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 1024), ROWS = k.meta<int>("ROWS", 64);
  auto X = k.pointer("X", f32), W = k.pointer("W", f32), DY = k.pointer("DY", f32);
  auto Mean = k.pointer("Mean", f32), Rstd = k.pointer("Rstd", f32);
  auto DX = k.pointer("DX", f32), DW = k.pointer("DW", f32), DB = k.pointer("DB", f32);
  auto m = k.scalar<int>("m"), n = k.scalar<int>("n");

  auto cols = arange(0, BLOCK);
  auto w = load(W + cols, cols < n, 0.0f);
  Var dw = zeros(f32, {BLOCK}), db = zeros(f32, {BLOCK});
  for_range(0, ROWS, [&](Tile i) {
    auto r = program_id(0) + i * num_programs(0);  // launched with cdiv(m, ROWS) programs
    auto row_ok = r < m;
    auto mask = (cols < n) & row_ok;
    auto rstd = load(Rstd + r, row_ok, 0.0f);
    auto xhat = where(mask, (load(X + r * n + cols, mask, 0.0f) - load(Mean + r, row_ok, 0.0f)) * rstd, 0.0f);
    auto dy = load(DY + r * n + cols, mask, 0.0f);
    auto g = dy * w;
    // (in this order: sum(g) first measured 297 vs 347 us, and C++ leaves an expression's order open)
    auto sum_g = sum(g);
    auto sum_gx = sum(g * xhat);
    auto dx = rstd * (g - sum_g / cast(f32, n) - xhat * (sum_gx / cast(f32, n)));
    store(DX + r * n + cols, dx, mask);
    dw = dw + dy * xhat;  // (zero on masked columns and rows)
    db = db + dy;
  });
  atomic_add(DW + cols, dw, cols < n);
  atomic_add(DB + cols, db, cols < n);
});

int main(int argc, char** argv) {
  auto fwd = layernorm_fwd.build({{"BLOCK", 1024}});
  auto bwd = layernorm_bwd.build({{"BLOCK", 1024}, {"ROWS", 4}});
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(fwd) | compile_both_backends(bwd);
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs((tilejit::ir::print(fwd) + tilejit::ir::print(bwd)).c_str(), stdout);
    return 0;
  }

  const int rows = 7, n = 1000;  // ragged: n < BLOCK
  const float eps = 1e-5f;
  HostTensor x(f32, {rows, n}), w(f32, {n}), b(f32, {n}), y(f32, {rows, n}), mean(f32, {rows}), rstd(f32, {rows});
  HostTensor dy(f32, {rows, n}), dx(f32, {rows, n}), dw(f32, {n}), db(f32, {n});
  x.fill_normal(1, 0.5, 2), w.fill_normal(2, 1, 0.2), b.fill_normal(3, 0, 0.2), dy.fill_normal(4, 0, 1);
  dw.fill(0), db.fill(0);
  auto report = tilejit::runtime::run(fwd, {rows}, {x, w, b, y, mean, rstd, n, eps});
  tilejit::runtime::run(bwd, {(rows + 3) / 4}, {x, w, dy, mean, rstd, dx, dw, db, rows, n});  // 2 programs: rows 0, 2, 4, 6 and 1, 3, 5 (the 8th is past the end)

  // float64 reference, forward and backward
  std::vector<double> ry(static_cast<size_t>(rows * n)), rdx(ry.size()), rdw(static_cast<size_t>(n), 0), rdb(rdw);
  for (int i = 0; i < rows; ++i) {
    double m = 0, v = 0, gm = 0, gxm = 0;
    for (int j = 0; j < n; ++j) m += x.get({i, j}) / n;
    for (int j = 0; j < n; ++j) v += (x.get({i, j}) - m) * (x.get({i, j}) - m) / n;
    double rs = 1 / std::sqrt(v + eps);
    auto xh = [&](int j) { return (x.get({i, j}) - m) * rs; };
    for (int j = 0; j < n; ++j) {
      double g = dy.get({i, j}) * w.get({j});
      gm += g / n, gxm += g * xh(j) / n;
      ry[static_cast<size_t>(i * n + j)] = xh(j) * w.get({j}) + b.get({j});
      rdw[static_cast<size_t>(j)] += dy.get({i, j}) * xh(j), rdb[static_cast<size_t>(j)] += dy.get({i, j});
    }
    for (int j = 0; j < n; ++j)
      rdx[static_cast<size_t>(i * n + j)] = rs * (dy.get({i, j}) * w.get({j}) - gm - xh(j) * gxm);
  }
  using tilejit::runtime::rel_error;
  double err = std::max({rel_error(y.to_f64(), ry), rel_error(dx.to_f64(), rdx), rel_error(dw.to_f64(), rdw),
                         rel_error(db.to_f64(), rdb)});
  bool gpu = report.where == tilejit::runtime::Where::Gpu;
  std::printf("layernorm fwd+bwd (%s): %dx%d, largest relative error (y, dx, dW, dB) vs float64 = %.3g (limit 1e-5)\n",
              gpu ? "GPU" : "CPU interpreter", rows, n, err);
  if (!(err < 1e-5)) return 1;

  if (gpu) {  // bandwidth at a large shape (W, B, mean and rstd traffic left out: small)
    const int R = 65536, N = 1024;
    HostTensor hx(f32, {R, N}), hw(f32, {N});
    hx.fill_normal(5, 0, 1), hw.fill(1);
    using tilejit::runtime::DeviceTensor;
    auto dX = DeviceTensor::from_host(hx), dW = DeviceTensor::from_host(hw), dB = DeviceTensor::from_host(hw);
    DeviceTensor dY(f32, {R, N}), dMean(f32, {R}), dRstd(f32, {R}), dDX(f32, {R, N}), dDW(f32, {N}), dDB(f32, {N});
    auto f = tilejit::compile(layernorm_fwd, {{"BLOCK", 1024}});
    auto g = tilejit::compile(layernorm_bwd, {{"BLOCK", 1024}, {"ROWS", 128}});
    report_bandwidth("layernorm_fwd 65536x1024 f32", 2.0 * R * N * 4,
                     [&](const tilejit::runtime::Stream& s) { f({R}, s, dX, dW, dB, dY, dMean, dRstd, N, eps); });
    report_bandwidth("layernorm_bwd 65536x1024 f32", 3.0 * R * N * 4,  // X and dY read, dX written
                     [&](const tilejit::runtime::Stream& s) { g({R / 128}, s, dX, dW, dY, dMean, dRstd, dDX, dDW, dDB, R, N); });
  }
  return 0;
}
