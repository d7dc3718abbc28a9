// The float64 reference for attention with a score mod (ALiBi, tanh soft-capping), shared by the
// interpreter tests (test_attention_score_mod.cpp) and the GPU API test (test_attention_gpu.cpp):
// s = q . k * scale, mod(s), the dense mask, softmax; O rounded to bf16 as the forward stores it,
// LSE, then dS = P * (dP - Delta) * mod'(s) with Delta from the stored O. Tensors [B, H, S, D] bf16.
#pragma once
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention/mask.hpp"
#include "kernels/attention/mask_host.hpp"
#include "runtime/host_tensor.hpp"

namespace score_mod_testing {

namespace km = tilejit::kernels;
using tilejit::runtime::HostTensor;
using km::MaskKind, km::MaskSpec, km::ScoreModKind;
using tilejit::ir::DType;

struct Case {
  ScoreModKind mod;
  MaskSpec mask;
  int64_t B = 1, Hq = 2, Hkv = 1, Sq = 37, Sk = 45;
  int64_t bm = 16, bn = 16;  // the interpreter tests' tiles
  int64_t D = 64;
  std::string describe() const {
    return fmt::format("{} {} B={} Hq={} Hkv={} Sq={} Sk={} D={} tiles {}x{}", km::score_mod_kind_name(mod), km::mask_kind_name(mask.kind), B,
                       Hq, Hkv, Sq, Sk, D, bm, bn);
  }
  int64_t q_tiles() const { return (Sq + bm - 1) / bm; }
  int64_t k_tiles() const { return (Sk + bn - 1) / bn; }
};

inline constexpr float kCap = 1.5f;  // scores ~ N(0, 1): the cap bends many of them

// The float64 reference: s = q . k * scale, mod(s), masked softmax; O (rounded to bf16, as the
// forward stores it), LSE, then dS = P * (dP - Delta) * mod'(s) with Delta from the stored O.
struct Reference {
  HostTensor q, k, v, dout, slopes;
  std::vector<double> o, lse, dq, dk, dv;
};

inline Reference reference(const Case& c, double scale) {
  const int64_t D = c.D;
  Reference r{HostTensor(DType::bf16, {c.B, c.Hq, c.Sq, D}), HostTensor(DType::bf16, {c.B, c.Hkv, c.Sk, D}), HostTensor(DType::bf16, {c.B, c.Hkv, c.Sk, D}),
              HostTensor(DType::bf16, {c.B, c.Hq, c.Sq, D}), HostTensor(DType::f32, {c.Hq}), {}, {}, {}, {}, {}};
  r.q.fill_normal(31, 0, 1), r.k.fill_normal(32, 0, 1), r.v.fill_normal(33, 0, 1), r.dout.fill_normal(34, 0, 1);
  for (int64_t h = 0; h < c.Hq; ++h) r.slopes.set({h}, 0.25 / static_cast<double>(h + 1));
  const std::vector<uint8_t> mask = km::dense_mask(c.mask, {}, {c.B, c.Hq, c.Sq, c.Sk});
  const auto n = static_cast<size_t>(c.B * c.Hq * c.Sq);
  r.o.assign(n * D, 0), r.lse.assign(n, -INFINITY), r.dq.assign(n * D, 0);
  r.dk.assign(static_cast<size_t>(c.B * c.Hkv * c.Sk * D), 0), r.dv.assign(r.dk.size(), 0);
  const int64_t G = c.Hq / c.Hkv;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        std::vector<double> s(static_cast<size_t>(c.Sk)), grad(s.size(), 1.0), p(s.size(), 0.0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.Sk; ++j) {
          double x = 0;
          for (int64_t d = 0; d < D; ++d) x += r.q.get({b, h, i, d}) * r.k.get({b, h / G, j, d});
          x *= scale;
          if (c.mod == ScoreModKind::alibi) x += r.slopes.get({h}) * static_cast<double>(j - (i + c.Sk - c.Sq));
          if (c.mod == ScoreModKind::softcap) {
            const double t = std::tanh(x / kCap);
            x = kCap * t, grad[static_cast<size_t>(j)] = 1 - t * t;
          }
          s[static_cast<size_t>(j)] = x;
          if (mask[static_cast<size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk + j)]) mx = std::max(mx, x);
        }
        if (mx == -INFINITY) continue;  // no key: O = 0, LSE = -inf, no gradient
        double l = 0;
        for (int64_t j = 0; j < c.Sk; ++j)
          if (mask[static_cast<size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk + j)]) l += p[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx);
        const size_t row = static_cast<size_t>((b * c.Hq + h) * c.Sq + i);
        r.lse[row] = mx + std::log(l);
        std::vector<double> o(D, 0.0);
        for (int64_t j = 0; j < c.Sk; ++j) {
          p[static_cast<size_t>(j)] /= l;
          for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += p[static_cast<size_t>(j)] * r.v.get({b, h / G, j, d});
        }
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) {
          const double stored = static_cast<double>(static_cast<float>(o[static_cast<size_t>(d)]));  // bf16 rounding below
          HostTensor one(DType::bf16, {1});
          one.set({0}, stored);
          r.o[row * D + static_cast<size_t>(d)] = one.get({0});
          delta += r.dout.get({b, h, i, d}) * one.get({0});
        }
        for (int64_t j = 0; j < c.Sk; ++j) {
          const double pj = p[static_cast<size_t>(j)];
          if (pj == 0) continue;
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += r.dout.get({b, h, i, d}) * r.v.get({b, h / G, j, d});
          const double ds = pj * (dp - delta) * grad[static_cast<size_t>(j)];
          const size_t kv_row = static_cast<size_t>((b * c.Hkv + h / G) * c.Sk + j);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[row * D + static_cast<size_t>(d)] += ds * r.k.get({b, h / G, j, d}) * scale;
            r.dk[kv_row * D + static_cast<size_t>(d)] += ds * r.q.get({b, h, i, d}) * scale;
            r.dv[kv_row * D + static_cast<size_t>(d)] += pj * r.dout.get({b, h, i, d});
          }
        }
      }
  return r;
}

}  // namespace score_mod_testing
