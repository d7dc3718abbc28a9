// FlashAttention forward (online softmax, exp2 with pre-scaled logits) written in the DSL, the
// project's main job: build the kernel, run it, print the error against a float64 reference.
// Without a GPU it runs in the CPU interpreter at a small, ragged shape.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"

#include "jit/compile.hpp"
#include "kernels/attention/forward.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

struct Shape4 {
  int B, H, S, D;
};

// float64 attention on the (already rounded) inputs; returns O and LSE flattened.
void reference(const HostTensor& q, const HostTensor& k, const HostTensor& v, Shape4 s, double scale, bool causal,
               std::vector<double>& o, std::vector<double>& lse) {
  o.assign(static_cast<size_t>(s.B * s.H * s.S * s.D), 0.0);
  lse.assign(static_cast<size_t>(s.B * s.H * s.S), 0.0);
  std::vector<double> p(static_cast<size_t>(s.S));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.S; ++i) {
        double mx = -INFINITY;
        int n = causal ? i + 1 : s.S;
        for (int j = 0; j < n; ++j) {
          double dotv = 0;
          for (int d = 0; d < s.D; ++d) dotv += q.get({b, h, i, d}) * k.get({b, h, j, d});
          p[static_cast<size_t>(j)] = dotv * scale;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (int j = 0; j < n; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
        for (int d = 0; d < s.D; ++d) {
          double acc = 0;
          for (int j = 0; j < n; ++j) acc += p[static_cast<size_t>(j)] * v.get({b, h, j, d});
          o[static_cast<size_t>(((b * s.H + h) * s.S + i) * s.D + d)] = acc / sum;
        }
        lse[static_cast<size_t>((b * s.H + h) * s.S + i)] = mx + std::log(sum);
      }
}

// Runs on the GPU when there is one (JIT-compiled through LLVM), else in the CPU interpreter.
int run_case(bool causal, bool gpu) {
  const Shape4 s = gpu ? Shape4{2, 4, 1000, 64} : Shape4{2, 2, 200, 64};  // S is ragged against 64-row tiles
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto fn = tilejit::kernels::attention_forward().build({{"CAUSAL", causal}});
  HostTensor q(bf16, {s.B, s.H, s.S, s.D}), k(bf16, {s.B, s.H, s.S, s.D}), v(bf16, {s.B, s.H, s.S, s.D});
  HostTensor o(bf16, {s.B, s.H, s.S, s.D}), lse(f32, {s.B, s.H, s.S});
  q.fill_normal(1, 0, 1);
  k.fill_normal(2, 0, 1);
  v.fill_normal(3, 0, 1);
  auto report = tilejit::runtime::run(fn, {cdiv(s.S, 64), s.H, s.B}, {q, k, v, o, lse, float(scale)});
  if (report.where == tilejit::runtime::Where::Gpu)
    std::printf("compiled %s: %s\n", fn.name.c_str(), report.compiled.info.to_string().c_str());

  std::vector<double> o_ref, lse_ref;
  reference(q, k, v, s, scale, causal, o_ref, lse_ref);
  double err_o = tilejit::runtime::rel_error(o.to_f64(), o_ref);
  double err_lse = tilejit::runtime::rel_error(lse.to_f64(), lse_ref);
  std::printf("attention forward (%s) B=%d H=%d S=%d D=%d bf16 %s: rel. error O = %.3g, LSE = %.3g\n", gpu ? "GPU" : "CPU interpreter", s.B,
              s.H, s.S, s.D, causal ? "causal" : "full", err_o, err_lse);
  return err_o < 1e-2 && err_lse < 1e-3 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(tilejit::kernels::attention_forward().build());
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(tilejit::kernels::attention_forward().build()).c_str(), stdout);
    return 0;
  }
  auto& driver = tilejit::runtime::Driver::get();
  bool gpu = driver.available();
  if (gpu) std::printf("GPU: %s\n", driver.props(0).name.c_str());
  else std::printf("no GPU (%s): running in the CPU interpreter\n", driver.unavailable_reason().c_str());
  return run_case(false, gpu) | run_case(true, gpu);
}
