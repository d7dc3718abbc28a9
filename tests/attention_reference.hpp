// Float64 attention references shared by the attention suites: the forward (O, LSE) and the
// backward (dQ, dK, dV, Delta) of the exact inputs, in either tensor layout, with grouped-query
// heads, S_q != S_k and bottom-right causal alignment (rows that see no key: O = 0, LSE = -inf,
// zero gradients), and optionally a dense mask on top (a library mask as kernels::dense_mask writes
// it: u8 [B, Hq, S_q, S_k], 1 = attend): a masked element contributes nothing, a row left with no
// key is a row that sees no key.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/host_tensor.hpp"

namespace testing {

struct AttentionCase {
  int B, Hq, Hkv, Sq, Sk, D;
  bool causal, bshd;

  std::string describe() const {
    return fmt::format("B={} Hq={} Hkv={} Sq={} Sk={} D={} causal={} {}", B, Hq, Hkv, Sq, Sk, D, causal, bshd ? "BSHD" : "BHSD");
  }
  tilejit::ir::Shape shape(int h, int s) const {
    return bshd ? tilejit::ir::Shape{B, s, h, D} : tilejit::ir::Shape{B, h, s, D};
  }
  tilejit::ir::Shape q_shape() const { return shape(Hq, Sq); }
  tilejit::ir::Shape kv_shape() const { return shape(Hkv, Sk); }
  double default_scale() const { return 1.0 / std::sqrt(static_cast<double>(D)); }
  // How many keys query row i sees.
  int visible(int i) const { return causal ? std::min(Sk, std::max(0, i + (Sk - Sq) + 1)) : Sk; }
  // Index of (b, h, s, d) in a tensor of this case's layout.
  std::vector<int64_t> at(int b, int h, int s, int d) const {
    return bshd ? std::vector<int64_t>{b, s, h, d} : std::vector<int64_t>{b, h, s, d};
  }
  int kv_head(int h) const { return h / (Hq / Hkv); }
};

// Logical row-major position of `index` in a tensor of `sizes`.
inline size_t flat_index(const tilejit::ir::Shape& sizes, const std::vector<int64_t>& index) {
  int64_t f = 0;
  for (size_t i = 0; i < sizes.size(); ++i) f = f * sizes[i] + index[i];
  return static_cast<size_t>(f);
}

// A dense mask over [B, Hq, S_q, S_k], row-major, 1 = attend (kernels::dense_mask's layout).
using DenseMask = std::vector<uint8_t>;

// Probabilities of query row i of (b, h) over its visible keys [0, visible(i)) (masked keys: 0;
// empty: no key), and the row's LSE.
inline std::vector<double> attention_row(const AttentionCase& c, const tilejit::runtime::HostTensor& q,
                                         const tilejit::runtime::HostTensor& k, int b, int h, int i, double scale,
                                         double& lse, const DenseMask* mask = nullptr) {
  const int visible = c.visible(i), kh = c.kv_head(h);
  const size_t row = flat_index({c.B, c.Hq, c.Sq}, {b, h, i}) * static_cast<size_t>(c.Sk);
  auto allowed = [&](int j) { return !mask || (*mask)[row + static_cast<size_t>(j)] != 0; };
  std::vector<double> p(static_cast<size_t>(visible));
  lse = -INFINITY;
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < visible; ++j) {
    if (!allowed(j)) continue;
    double dotv = 0;
    for (int d = 0; d < c.D; ++d) dotv += q.get(c.at(b, h, i, d)) * k.get(c.at(b, kh, j, d));
    p[static_cast<size_t>(j)] = dotv * scale;
    mx = std::max(mx, p[static_cast<size_t>(j)]);
  }
  if (mx == -INFINITY) return {};
  for (int j = 0; j < visible; ++j) sum += (p[static_cast<size_t>(j)] = allowed(j) ? std::exp(p[static_cast<size_t>(j)] - mx) : 0.0);
  for (double& x : p) x /= sum;
  lse = mx + std::log(sum);
  return p;
}

struct AttentionForwardRef {
  std::vector<double> o;    // logical row-major, q's shape
  std::vector<double> lse;  // [B, Hq, Sq]; -inf for a row that sees no key
};

inline AttentionForwardRef attention_forward_ref(const AttentionCase& c, const tilejit::runtime::HostTensor& q,
                                                 const tilejit::runtime::HostTensor& k, const tilejit::runtime::HostTensor& v,
                                                 double scale, const DenseMask* mask = nullptr) {
  AttentionForwardRef r;
  r.o.assign(static_cast<size_t>(q.numel()), 0.0);
  r.lse.assign(static_cast<size_t>(c.B) * static_cast<size_t>(c.Hq) * static_cast<size_t>(c.Sq), -INFINITY);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Sq; ++i) {
        double lse = 0;
        std::vector<double> p = attention_row(c, q, k, b, h, i, scale, lse, mask);
        r.lse[flat_index({c.B, c.Hq, c.Sq}, {b, h, i})] = lse;
        for (int d = 0; d < c.D; ++d) {
          double acc = 0;
          for (size_t j = 0; j < p.size(); ++j) acc += p[j] * v.get(c.at(b, c.kv_head(h), static_cast<int>(j), d));
          r.o[flat_index(c.q_shape(), c.at(b, h, i, d))] = acc;
        }
      }
  return r;
}

struct AttentionBackwardRef {
  std::vector<double> dq, dk, dv;  // logical row-major, shaped like q, k, v
  std::vector<double> delta;       // [B, Hq, Sq]: rowsum(dO * O)
};

inline AttentionBackwardRef attention_backward_ref(const AttentionCase& c, const tilejit::runtime::HostTensor& q,
                                                   const tilejit::runtime::HostTensor& k, const tilejit::runtime::HostTensor& v,
                                                   const tilejit::runtime::HostTensor& dout, double scale,
                                                   const DenseMask* mask = nullptr) {
  AttentionBackwardRef r;
  r.dq.assign(static_cast<size_t>(q.numel()), 0.0);
  r.dk.assign(static_cast<size_t>(k.numel()), 0.0);
  r.dv.assign(static_cast<size_t>(v.numel()), 0.0);
  r.delta.assign(static_cast<size_t>(c.B) * static_cast<size_t>(c.Hq) * static_cast<size_t>(c.Sq), 0.0);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      const int kh = c.kv_head(h);
      for (int i = 0; i < c.Sq; ++i) {
        double lse = 0;
        std::vector<double> p = attention_row(c, q, k, b, h, i, scale, lse, mask);
        if (p.empty()) continue;
        // O_i, Delta_i = dO_i . O_i, dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - Delta_i)
        double delta = 0;
        for (int d = 0; d < c.D; ++d) {
          double o = 0;
          for (size_t j = 0; j < p.size(); ++j) o += p[j] * v.get(c.at(b, kh, static_cast<int>(j), d));
          delta += dout.get(c.at(b, h, i, d)) * o;
        }
        r.delta[flat_index({c.B, c.Hq, c.Sq}, {b, h, i})] = delta;
        for (size_t j = 0; j < p.size(); ++j) {
          const int jj = static_cast<int>(j);
          double dp = 0;
          for (int d = 0; d < c.D; ++d) dp += dout.get(c.at(b, h, i, d)) * v.get(c.at(b, kh, jj, d));
          const double ds = p[j] * (dp - delta);
          for (int d = 0; d < c.D; ++d) {
            r.dv[flat_index(c.kv_shape(), c.at(b, kh, jj, d))] += p[j] * dout.get(c.at(b, h, i, d));
            r.dq[flat_index(c.q_shape(), c.at(b, h, i, d))] += scale * ds * k.get(c.at(b, kh, jj, d));
            r.dk[flat_index(c.kv_shape(), c.at(b, kh, jj, d))] += scale * ds * q.get(c.at(b, h, i, d));
          }
        }
      }
    }
  return r;
}

// Relative error sqrt(sum (got - ref)^2 / sum ref^2).
inline double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (got.size() != ref.size()) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double rel_error(const AttentionCase&, const tilejit::runtime::HostTensor& got, const std::vector<double>& ref) {
  return rel_error(got.to_f64(), ref);
}

}  // namespace testing
