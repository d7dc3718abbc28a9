// Variable-length attention forward (VARLEN) in the CPU interpreter: packed [total, H, D] tokens,
// cumulative offsets per sequence, ragged lengths (0 and 1 included), S_q != S_k per sequence,
// causal (bottom-right per sequence) and not, grouped- and multi-query heads. Each sequence is
// checked against the float64 dense reference applied to a copy of its tokens; the outputs start
// NaN-poisoned, and tokens outside every sequence must stay so.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention_reference.hpp"
#include "kernels/attention/document_ids.hpp"
#include "kernels/attention/forward.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

struct VarlenCase {
  int Hq, Hkv, D;
  std::vector<int> seqlens_q, seqlens_k;
  bool causal;
  int gap = 3;  // unused tokens after the last sequence (never read, never written)
};

std::vector<int> offsets(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// Tokens [start, start + n) of a packed [total, H, D] tensor as a dense [1, n, H, D] tensor.
HostTensor sequence(const HostTensor& t, int start, int n) {
  const int64_t H = t.sizes()[1], D = t.sizes()[2];
  HostTensor s(t.dtype(), {1, std::max(n, 1), H, D});
  for (int i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) s.set({0, i, h, d}, t.get({start + i, h, d}));
  return s;
}

void check_varlen(const VarlenCase& c) {
  const int B = static_cast<int>(c.seqlens_q.size());
  const std::vector<int> cu_q = offsets(c.seqlens_q), cu_k = offsets(c.seqlens_k);
  const int total_q = cu_q.back() + c.gap, total_k = cu_k.back() + c.gap;
  const int max_q = *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end());
  INFO(fmt::format("Hq={} Hkv={} D={} causal={} seqlens_q={} seqlens_k={}", c.Hq, c.Hkv, c.D, c.causal,
                   fmt::join(c.seqlens_q, ","), fmt::join(c.seqlens_k, ",")));
  HostTensor q(bf16, {total_q, c.Hq, c.D}), k(bf16, {total_k, c.Hkv, c.D}), v(bf16, {total_k, c.Hkv, c.D});
  HostTensor o(bf16, {total_q, c.Hq, c.D}), lse(f32, {c.Hq, total_q});  // NaN-poisoned (0xFF bytes)
  HostTensor cq(i32, {B + 1}), ck(i32, {B + 1});
  for (int b = 0; b <= B; ++b) {
    cq.set({b}, cu_q[static_cast<size_t>(b)]);
    ck.set({b}, cu_k[static_cast<size_t>(b)]);
  }
  q.fill_normal(21, 0, 1);
  k.fill_normal(22, 0, 1);
  v.fill_normal(23, 0, 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  auto fn = kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"VARLEN", true}});
  runtime::interpret(fn, {cdiv(std::max(max_q, 1), 64), c.Hq, B}, {q, k, v, o, lse, static_cast<float>(scale), cq, ck});

  std::vector<double> o_got, o_ref, lse_got, lse_ref;
  int keyless = 0, keyless_wrong = 0;
  for (int b = 0; b < B; ++b) {
    const int q0 = cu_q[static_cast<size_t>(b)], k0 = cu_k[static_cast<size_t>(b)];
    const testing::AttentionCase dense{1, c.Hq, c.Hkv, c.seqlens_q[static_cast<size_t>(b)], c.seqlens_k[static_cast<size_t>(b)],
                                       c.D, c.causal, true};
    if (dense.Sq == 0) continue;
    testing::AttentionForwardRef ref = testing::attention_forward_ref(
        dense, sequence(q, q0, dense.Sq), sequence(k, k0, dense.Sk), sequence(v, k0, dense.Sk), scale);
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < dense.Sq; ++i) {
        const double l = lse.get({h, q0 + i});
        if (dense.visible(i) == 0) {  // no key: O = 0, LSE = -inf
          ++keyless;
          bool ok = l == -INFINITY;
          for (int d = 0; d < c.D; ++d) ok = ok && o.get({q0 + i, h, d}) == 0.0;
          keyless_wrong += ok ? 0 : 1;
          continue;
        }
        for (int d = 0; d < c.D; ++d) {
          o_got.push_back(o.get({q0 + i, h, d}));
          o_ref.push_back(ref.o[testing::flat_index(dense.q_shape(), dense.at(0, h, i, d))]);
        }
        lse_got.push_back(l);
        lse_ref.push_back(ref.lse[static_cast<size_t>(h * dense.Sq + i)]);
      }
  }
  const double e_o = testing::rel_error(o_got, o_ref), e_lse = testing::rel_error(lse_got, lse_ref);
  MESSAGE(fmt::format("varlen Hq={} Hkv={} D={} causal={}: rel. error O {:.2e}, LSE {:.2e} over {} rows ({} without a key)", c.Hq,
                      c.Hkv, c.D, c.causal, e_o, e_lse, lse_got.size(), keyless));
  CHECK(e_o < 1e-2);
  CHECK(e_lse < 1e-4);
  CHECK(keyless_wrong == 0);
  int expected_keyless = 0;  // rows of sequences with no key, and causal rows above the diagonal
  for (int b = 0; b < B; ++b) {
    const int sq = c.seqlens_q[static_cast<size_t>(b)], sk = c.seqlens_k[static_cast<size_t>(b)];
    expected_keyless += c.Hq * (sk == 0 ? sq : c.causal ? std::max(0, sq - sk) : 0);
  }
  CHECK(keyless == expected_keyless);
  // the tokens after the last sequence keep their poison
  for (int t = cu_q.back(); t < total_q; ++t)
    for (int h = 0; h < c.Hq; ++h) {
      CHECK(std::isnan(lse.get({h, t})));
      for (int d = 0; d < c.D; ++d) CHECK(std::isnan(o.get({t, h, d})));
    }
}

}  // namespace

TEST_CASE("varlen attention forward: ragged batches (lengths 0 and 1, S_q != S_k both ways), grouped-query heads") {
  for (bool causal : {false, true})
    check_varlen({4, 2, 64, {0, 1, 70, 129, 5, 64}, {3, 0, 130, 64, 1, 64}, causal});
}

TEST_CASE("varlen attention forward: multi-query heads, head dim 128, empty key sequences") {
  check_varlen({2, 1, 128, {17, 0, 40, 3}, {33, 9, 0, 80}, true});
}

TEST_CASE("varlen attention forward: BSHD does not apply to packed tensors") {
  CHECK_THROWS_AS(kernels::attention_forward().build({{"VARLEN", true}, {"BSHD", true}}), BuildError);
}

// Options::varlen_documents' ids (decision 113): attention_document_ids writes b for every token of
// sequence b, empty sequences and a one-token one included, and nothing past the last offset.
TEST_CASE("attention_document_ids: each packed token gets its sequence's index") {
  const std::vector<int> lens{37, 0, 1, 300, 0, 64, 2};
  const std::vector<int> cu = offsets(lens);
  const int B = static_cast<int>(lens.size()), total = cu.back(), gap = 5;
  HostTensor cq(i32, {B + 1}), ids(i32, {1, total + gap});
  for (int b = 0; b <= B; ++b) cq.set({b}, cu[static_cast<size_t>(b)]);
  for (int t = 0; t < total + gap; ++t) ids.set({0, t}, -7);
  runtime::interpret(kernels::attention_document_ids().build(), {B, 1, 1}, {cq, ids});
  int wrong = 0;
  for (int b = 0; b < B; ++b)
    for (int t = cu[static_cast<size_t>(b)]; t < cu[static_cast<size_t>(b) + 1]; ++t) wrong += ids.get({0, t}) == b ? 0 : 1;
  CHECK(wrong == 0);
  for (int t = total; t < total + gap; ++t) CHECK(ids.get({0, t}) == -7);  // past the last offset: untouched
}
