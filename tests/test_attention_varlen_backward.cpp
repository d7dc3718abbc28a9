// Variable-length attention backward (VARLEN) in the CPU interpreter: the varlen forward (O, LSE),
// then the preprocess (Delta), dK/dV and dQ kernels on packed [total, H, D] tokens with cumulative
// offsets, against the float64 dense backward applied to a copy of each sequence's tokens. Ragged
// lengths (0 and 1 included), S_q != S_k per sequence both ways, causal (bottom-right per
// sequence) and not, grouped- and multi-query heads, bf16 and f16, BLOCK_M != BLOCK_N. The
// sequences sit between unused tokens (before cu[0] and after cu[B]); every output starts
// NaN-poisoned and those tokens must stay so. Also: parameter order, BSHD refused, and the API's
// varlen schedules compiled for sm_90a.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "ptxas_testing.hpp"
#include "attention_reference.hpp"
#include "jit/compile.hpp"
#include "kernels/attention/forward.hpp"
#include "api/attention.hpp"
#include "kernels/attention/backward.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

struct VarlenCase {
  int Hq, Hkv, D;
  std::vector<int> seqlens_q, seqlens_k;
  bool causal;
  DType dtype = bf16;
  int block_m = 64, block_n = 64;
  int lead = 2, gap = 3;  // unused tokens before cu[0] and after cu[B] (never read, never written)

  std::string describe() const {
    return fmt::format("{} Hq={} Hkv={} D={} causal={} seqlens_q=[{}] seqlens_k=[{}] blocks {}x{}", ir::name(dtype), Hq, Hkv, D,
                       causal, fmt::join(seqlens_q, ","), fmt::join(seqlens_k, ","), block_m, block_n);
  }
};

std::vector<int> offsets(int lead, const std::vector<int>& lens) {
  std::vector<int> cu{lead};
  for (int n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// Tokens [start, start + n) of a packed [total, H, D] tensor as a dense [1, n, H, D] tensor (one
// row at least: a HostTensor has no empty dims; the reference reads only the first n).
HostTensor sequence(const HostTensor& t, int start, int n) {
  const int64_t H = t.sizes()[1], D = t.sizes()[2];
  HostTensor s(t.dtype(), {1, std::max(n, 1), H, D});
  s.fill(0);
  for (int i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) s.set({0, i, h, d}, t.get({start + i, h, d}));
  return s;
}

HostTensor offsets_tensor(const std::vector<int>& cu) {
  HostTensor t(i32, {static_cast<int64_t>(cu.size())});
  for (size_t b = 0; b < cu.size(); ++b) t.set({static_cast<int64_t>(b)}, cu[b]);
  return t;
}

void check_varlen_backward(const VarlenCase& c) {
  INFO(c.describe());
  const auto t0 = std::chrono::steady_clock::now();
  const int B = static_cast<int>(c.seqlens_q.size());
  const std::vector<int> cu_q = offsets(c.lead, c.seqlens_q), cu_k = offsets(c.lead, c.seqlens_k);
  const int total_q = cu_q.back() + c.gap, total_k = cu_k.back() + c.gap;
  const int max_q = std::max(1, *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end()));
  const int max_k = std::max(1, *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end()));
  const DType T = c.dtype;
  HostTensor q(T, {total_q, c.Hq, c.D}), k(T, {total_k, c.Hkv, c.D}), v(T, {total_k, c.Hkv, c.D}), dout(T, {total_q, c.Hq, c.D});
  HostTensor o(T, {total_q, c.Hq, c.D}), lse(f32, {c.Hq, total_q}), delta(f32, {c.Hq, total_q});
  HostTensor dq(T, {total_q, c.Hq, c.D}), dk(T, {total_k, c.Hkv, c.D}), dv(T, {total_k, c.Hkv, c.D});
  for (HostTensor* t : {&o, &lse, &delta, &dq, &dk, &dv}) t->poison();
  q.fill_normal(31, 0, 1);
  k.fill_normal(32, 0, 1);
  v.fill_normal(33, 0, 1);
  dout.fill_normal(34, 0, 1);
  HostTensor cq = offsets_tensor(cu_q), ck = offsets_tensor(cu_k);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));

  const Meta meta{{"DTYPE", T}, {"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"VARLEN", true}};
  Meta blocked = meta;
  blocked.insert(blocked.end(), {{"BLOCK_M", c.block_m}, {"BLOCK_N", c.block_n}});
  const int64_t q_blocks = cdiv(max_q, c.block_m), k_blocks = cdiv(max_k, c.block_n);
  runtime::interpret(kernels::attention_forward().build(meta), {cdiv(max_q, 64), c.Hq, B}, {q, k, v, o, lse, scale, cq, ck});
  runtime::interpret(kernels::attention_backward_preprocess().build(
                         {{"DTYPE", T}, {"BLOCK_M", c.block_m}, {"HEAD_DIM", c.D}, {"VARLEN", true}}),
                     {q_blocks, c.Hq, B}, {o, dout, delta, cq});
  runtime::interpret(kernels::attention_backward_dkdv().build(blocked), {k_blocks, c.Hkv, B},
                     {q, k, v, dout, lse, delta, dk, dv, scale, cq, ck});
  runtime::interpret(kernels::attention_backward_dq().build(blocked), {q_blocks, c.Hq, B},
                     {q, k, v, dout, lse, delta, dq, scale, cq, ck});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Per sequence: the dense float64 backward of its own tokens; gradients gathered from the packed
  // outputs in the same order as the reference's.
  std::vector<double> got[4], ref[4];  // dQ, dK, dV, Delta
  int keyless_rows = 0, bad_zero = 0;
  for (int b = 0; b < B; ++b) {
    const auto sb = static_cast<size_t>(b);
    const int q0 = cu_q[sb], k0 = cu_k[sb];
    const testing::AttentionCase dense{1, c.Hq, c.Hkv, c.seqlens_q[sb], c.seqlens_k[sb], c.D, c.causal, true};
    const testing::AttentionBackwardRef r = testing::attention_backward_ref(
        dense, sequence(q, q0, dense.Sq), sequence(k, k0, dense.Sk), sequence(v, k0, dense.Sk), sequence(dout, q0, dense.Sq), scale);
    const tilejit::ir::Shape q_shape{1, std::max(dense.Sq, 1), c.Hq, c.D}, kv_shape{1, std::max(dense.Sk, 1), c.Hkv, c.D};
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < dense.Sq; ++i) {
        const bool keyless = dense.visible(i) == 0;
        keyless_rows += keyless ? 1 : 0;
        for (int d = 0; d < c.D; ++d) {
          const double g = dq.get({q0 + i, h, d});
          got[0].push_back(g);
          ref[0].push_back(r.dq[testing::flat_index(q_shape, {0, i, h, d})]);
          if (keyless && g != 0.0) ++bad_zero;  // a row that sees no key: dQ exactly 0
        }
        got[3].push_back(delta.get({h, q0 + i}));
        ref[3].push_back(keyless ? 0.0 : r.delta[static_cast<size_t>(h * dense.Sq + i)]);
      }
    for (int h = 0; h < c.Hkv; ++h)
      for (int j = 0; j < dense.Sk; ++j)
        for (int d = 0; d < c.D; ++d) {
          const double gk = dk.get({k0 + j, h, d}), gv = dv.get({k0 + j, h, d});
          got[1].push_back(gk);
          got[2].push_back(gv);
          ref[1].push_back(r.dk[testing::flat_index(kv_shape, {0, j, h, d})]);
          ref[2].push_back(r.dv[testing::flat_index(kv_shape, {0, j, h, d})]);
          if (dense.Sq == 0 && (gk != 0.0 || gv != 0.0)) ++bad_zero;  // keys no query sees: exactly 0
        }
  }
  // Delta of a key-less row is rowsum(dO * O) with O = 0: 0 too (the reference skips those rows).
  const double e_dq = testing::rel_error(got[0], ref[0]), e_dk = testing::rel_error(got[1], ref[1]);
  const double e_dv = testing::rel_error(got[2], ref[2]), e_delta = testing::rel_error(got[3], ref[3]);
  MESSAGE(fmt::format("varlen backward {}: rel. error dQ {:.2e} dK {:.2e} dV {:.2e} Delta {:.2e} over {} query rows ({} without a "
                      "key), {} keys ({:.0f} ms in the interpreter)",
                      c.describe(), e_dq, e_dk, e_dv, e_delta, got[3].size(), keyless_rows, got[1].size() / static_cast<size_t>(c.D),
                      ms));
  CHECK(e_dq < 1e-2);
  CHECK(e_dk < 1e-2);
  CHECK(e_dv < 1e-2);
  CHECK(e_delta < 1e-2);
  CHECK(bad_zero == 0);
  int nans_inside = 0;
  for (const auto& g : got)
    for (double x : g) nans_inside += std::isnan(x) ? 1 : 0;
  CHECK(nans_inside == 0);
  // Tokens outside every sequence keep their poison (dQ, Delta on the query side; dK, dV on the key side).
  int written_outside = 0;
  for (int t = 0; t < total_q; ++t) {
    if (t >= cu_q.front() && t < cu_q.back()) continue;
    for (int h = 0; h < c.Hq; ++h) {
      written_outside += std::isnan(delta.get({h, t})) ? 0 : 1;
      for (int d = 0; d < c.D; ++d) written_outside += std::isnan(dq.get({t, h, d})) ? 0 : 1;
    }
  }
  for (int t = 0; t < total_k; ++t) {
    if (t >= cu_k.front() && t < cu_k.back()) continue;
    for (int h = 0; h < c.Hkv; ++h)
      for (int d = 0; d < c.D; ++d) written_outside += (std::isnan(dk.get({t, h, d})) ? 0 : 1) + (std::isnan(dv.get({t, h, d})) ? 0 : 1);
  }
  CHECK(written_outside == 0);
}

}  // namespace

TEST_CASE("varlen attention backward: ragged batches (lengths 0 and 1, S_q != S_k both ways), grouped-query heads") {
  for (bool causal : {false, true})
    check_varlen_backward({4, 2, 64, {0, 1, 70, 129, 5, 33}, {3, 0, 130, 64, 1, 33}, causal});
}

TEST_CASE("varlen attention backward: multi-query heads, f16, head dim 128, BLOCK_M != BLOCK_N, empty key sequences") {
  check_varlen_backward({3, 1, 128, {17, 0, 40, 3, 50}, {33, 9, 0, 80, 20}, true, f16, 32, 16});
  check_varlen_backward({2, 1, 64, {1, 45, 0}, {20, 7, 1}, false, bf16, 16, 32});
}

TEST_CASE("varlen attention backward: parameters (cu_seqlens last; the preprocess takes cu_seqlens_q only), BSHD refused") {
  auto names = [](const ir::Function& fn) {
    std::vector<std::string> n;
    for (const ir::Param& p : fn.params) n.push_back(p.name);
    return fmt::format("{}", fmt::join(n, ","));
  };
  const Meta varlen{{"VARLEN", true}};
  CHECK(names(kernels::attention_backward_preprocess().build(varlen)) == "O,dO,Delta,cu_seqlens_q");
  CHECK(names(kernels::attention_backward_dkdv().build(varlen)) ==
        "Q,K,V,dO,LSE,Delta,dK,dV,softmax_scale,cu_seqlens_q,cu_seqlens_k");
  CHECK(names(kernels::attention_backward_dq().build(varlen)) == "Q,K,V,dO,LSE,Delta,dQ,softmax_scale,cu_seqlens_q,cu_seqlens_k");
  CHECK(names(kernels::attention_backward_dq().build({})) == "Q,K,V,dO,LSE,Delta,dQ,softmax_scale");
  for (const Kernel* k : {&kernels::attention_backward_preprocess(), &kernels::attention_backward_dkdv(),
                          &kernels::attention_backward_dq()})
    CHECK_THROWS_AS(k->build({{"VARLEN", true}, {"BSHD", true}}), BuildError);
}

// What the API compiles for a varlen backward (its default schedules: the generic path), through
// both backends with ptxas for sm_90a; spills are reported, not required to be zero.
TEST_CASE("varlen attention backward: the API's varlen schedules compile for sm_90a") {
  using attention::Pass;
  for (Pass pass : {Pass::bwd_preprocess, Pass::bwd_dkdv, Pass::bwd_dq})
    for (int d : {64, 128}) {
      const bool causal = pass != Pass::bwd_preprocess;
      const attention::Schedule s = attention::default_schedule(pass, ir::DType::bf16, d, causal, true);
      const Kernel& k = pass == Pass::bwd_preprocess ? kernels::attention_backward_preprocess()
                        : pass == Pass::bwd_dkdv     ? kernels::attention_backward_dkdv()
                                                     : kernels::attention_backward_dq();
      Meta meta{{"HEAD_DIM", d}, {"VARLEN", true}, {"BLOCK_M", s.block_m}};
      if (pass != Pass::bwd_preprocess) meta.insert(meta.end(), {{"BLOCK_N", s.block_n}, {"CAUSAL", causal}});
      const ir::Function fn = k.build(meta);
      for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
        INFO(attention::name(pass) << " D=" << d << " via " << jit::to_string(backend));
        const jit::CompiledKernel ck = testing::assemble_sm90a(fn, backend, s.num_warps, s.stages);
        MESSAGE(fmt::format("{} varlen D={} {}x{} {} warps {} stages via {}: {}", attention::name(pass), d, s.block_m, s.block_n,
                            s.num_warps, s.stages, jit::to_string(backend), ck.info.to_string()));
      }
    }
}
