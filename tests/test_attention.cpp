// Attention forward in the CPU interpreter against a float64 reference: both tensor layouts,
// grouped-query and multi-query heads, S_q != S_k with bottom-right causal alignment, rows that
// see no key, ragged lengths. (The GPU suite runs the same kernel on the GPU.)
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>

#include "kernels/attention.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

struct Case {
  int B, Hq, Hkv, Sq, Sk, D;
  bool causal, bshd;
};

// Index of (b, h, s, d) in a tensor of either layout.
std::vector<int64_t> at(const Case& c, int b, int h, int s, int d) {
  return c.bshd ? std::vector<int64_t>{b, s, h, d} : std::vector<int64_t>{b, h, s, d};
}

void check_case(const Case& c) {
  INFO(fmt::format("B={} Hq={} Hkv={} Sq={} Sk={} D={} causal={} {}", c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.causal,
                   c.bshd ? "BSHD" : "BHSD"));
  auto shape = [&](int h, int s) { return c.bshd ? ir::Shape{c.B, s, h, c.D} : ir::Shape{c.B, h, s, c.D}; };
  HostTensor q(bf16, shape(c.Hq, c.Sq)), k(bf16, shape(c.Hkv, c.Sk)), v(bf16, shape(c.Hkv, c.Sk)), o(bf16, shape(c.Hq, c.Sq));
  HostTensor lse(f32, {c.B, c.Hq, c.Sq});
  q.fill_normal(11, 0, 1);
  k.fill_normal(12, 0, 1);
  v.fill_normal(13, 0, 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  auto fn = kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"BSHD", c.bshd}});
  runtime::interpret(fn, {cdiv(c.Sq, 64), c.Hq, c.B}, {q, k, v, o, lse, static_cast<float>(scale)});

  double num = 0, den = 0, lnum = 0, lden = 0;
  int masked_rows = 0;
  std::vector<double> p(static_cast<size_t>(c.Sk));
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      int kh = h / (c.Hq / c.Hkv);
      for (int i = 0; i < c.Sq; ++i) {
        int visible = c.causal ? std::min(c.Sk, std::max(0, i + (c.Sk - c.Sq) + 1)) : c.Sk;
        if (visible == 0) {  // no key: O = 0, LSE = -inf
          ++masked_rows;
          CHECK(lse.get({b, h, i}) == -INFINITY);
          for (int d = 0; d < c.D; ++d) CHECK(o.get(at(c, b, h, i, d)) == 0.0);
          continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < visible; ++j) {
          double dotv = 0;
          for (int d = 0; d < c.D; ++d) dotv += q.get(at(c, b, h, i, d)) * k.get(at(c, b, kh, j, d));
          p[static_cast<size_t>(j)] = dotv * scale;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        for (int j = 0; j < visible; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
        for (int d = 0; d < c.D; ++d) {
          double ref = 0;
          for (int j = 0; j < visible; ++j) ref += p[static_cast<size_t>(j)] * v.get(at(c, b, kh, j, d));
          ref /= sum;
          double got = o.get(at(c, b, h, i, d));
          num += (got - ref) * (got - ref);
          den += ref * ref;
        }
        double lref = mx + std::log(sum), lgot = lse.get({b, h, i});
        lnum += (lgot - lref) * (lgot - lref);
        lden += lref * lref;
      }
    }
  CHECK(std::sqrt(num / den) < 1e-2);
  CHECK(std::sqrt(lnum / lden) < 1e-4);
  if (c.causal && c.Sq > c.Sk) CHECK(masked_rows == c.B * c.Hq * (c.Sq - c.Sk));
}

}  // namespace

TEST_CASE("attention forward: grouped-query heads, S_q != S_k, full and causal (bottom-right)") {
  for (bool causal : {false, true}) check_case({1, 4, 2, 70, 130, 64, causal, false});
}

TEST_CASE("attention forward: [B, S, H, D] layout and multi-query heads") {
  for (bool causal : {false, true}) check_case({2, 2, 1, 100, 100, 64, causal, true});
}

TEST_CASE("attention forward: causal with S_q > S_k leaves the first rows with no key (O = 0, LSE = -inf)") {
  check_case({1, 2, 2, 130, 50, 64, true, false});
  check_case({1, 2, 1, 90, 40, 64, true, true});
}

TEST_CASE("attention forward: head dim 128") {
  check_case({1, 2, 2, 80, 80, 128, true, false});
}
