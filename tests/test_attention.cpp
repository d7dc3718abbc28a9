// Attention forward in the CPU interpreter against a float64 reference: both tensor layouts,
// grouped-query and multi-query heads, S_q != S_k with bottom-right causal alignment, rows that
// see no key, ragged lengths. (The GPU suite runs the same kernel on the GPU.)
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "attention_reference.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/forward.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;
using Case = testing::AttentionCase;

namespace {

void check_case(const Case& c, lang::Meta extra = {}, std::optional<double> softmax_scale = {}) {
  INFO(c.describe() << " extra metas " << extra.size());
  HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape()), o(bf16, c.q_shape());
  HostTensor lse(f32, {c.B, c.Hq, c.Sq});
  q.fill_normal(11, 0, 1);
  k.fill_normal(12, 0, 1);
  v.fill_normal(13, 0, 1);
  const double scale = softmax_scale.value_or(c.default_scale());
  lang::Meta meta{{"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"BSHD", c.bshd}};
  meta.insert(meta.end(), extra.begin(), extra.end());
  auto fn = kernels::attention_forward().build(meta);
  runtime::interpret(fn, {cdiv(c.Sq, 64), c.Hq, c.B}, {q, k, v, o, lse, static_cast<float>(scale)});

  testing::AttentionForwardRef ref = testing::attention_forward_ref(c, q, k, v, scale);
  int masked_rows = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Sq; ++i)
        if (c.visible(i) == 0) {  // no key: O = 0, LSE = -inf
          ++masked_rows;
          CHECK(lse.get({b, h, i}) == -INFINITY);
          for (int d = 0; d < c.D; ++d) CHECK(o.get(c.at(b, h, i, d)) == 0.0);
        }
  CHECK(testing::rel_error(c, o, ref.o) < 1e-2);
  // LSE over the rows that see a key (-inf - -inf is NaN)
  std::vector<double> lse_got = lse.to_f64(), lse_ref = ref.lse;
  for (size_t r = 0; r < lse_ref.size(); ++r)
    if (lse_ref[r] == -INFINITY) lse_got[r] = lse_ref[r] = 0;
  CHECK(testing::rel_error(lse_got, lse_ref) < 1e-4);
  if (c.causal && c.Sq > c.Sk) CHECK(masked_rows == c.B * c.Hq * (c.Sq - c.Sk));
}

// Q, K and V of case c, N(0, 1) from seeds seed, seed + 1, seed + 2.
struct ForwardInputs {
  HostTensor q, k, v;
};
ForwardInputs random_forward_inputs(const Case& c, uint64_t seed) {
  ForwardInputs in{HostTensor(bf16, c.q_shape()), HostTensor(bf16, c.kv_shape()), HostTensor(bf16, c.kv_shape())};
  in.q.fill_normal(seed, 0, 1);
  in.k.fill_normal(seed + 1, 0, 1);
  in.v.fill_normal(seed + 2, 0, 1);
  return in;
}

// attention_fwd with `meta` on `grid` in the interpreter: O then LSE, as doubles. The outputs start
// as noise, so an element nobody writes shows.
std::vector<double> interpret_forward(const Case& c, ForwardInputs& in, const lang::Meta& meta, runtime::Grid grid) {
  HostTensor o(bf16, c.q_shape()), lse(f32, {c.B, c.Hq, c.Sq});
  o.fill_normal(44, 0, 1);
  lse.fill_normal(45, 0, 1);
  runtime::interpret(kernels::attention_forward().build(meta), grid, {in.q, in.k, in.v, o, lse, static_cast<float>(c.default_scale())});
  std::vector<double> out = o.to_f64(), l = lse.to_f64();
  out.insert(out.end(), l.begin(), l.end());
  return out;
}

// The elements of got that differ from want's (NaN equals NaN).
size_t values_differ(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))) ++differ;
  return differ;
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
  check_case({1, 2, 2, 200, 40, 128, true, false});  // D128: PIPELINE_QK by default (a program with no key block at all)
}

TEST_CASE("attention forward: head dim 128") {
  check_case({1, 2, 2, 80, 80, 128, true, false});
}

// Schedule options of the same algorithm: the next block's S issued before this block's softmax
// (PIPELINE_QK), and the output normalised by an IEEE division instead of rcp (EXACT_NORMALIZE).
// PIPELINE_QK, PIPELINE_PV (P_{j-1} V_{j-1} issued after S_j, the output rescaled at the end of
// an iteration; PV_PEEL: block 0 before the loop), both together, and PINGPONG (warpgroup turns, a
// no-op in the interpreter) do the same arithmetic in the same order: the outputs are
// bit-identical to no pipeline's.
TEST_CASE("attention forward: PIPELINE_QK, PIPELINE_PV, both, and PINGPONG give bit-identical results") {
  for (bool causal : {false, true})
    for (const Case& c : {Case{1, 4, 2, 70, 130, 64, causal, false}, Case{2, 2, 1, 100, 45, 128, causal, true}}) {
      INFO(c.describe());
      ForwardInputs in = random_forward_inputs(c, 21);
      auto run = [&](lang::Meta extra) {
        lang::Meta meta{{"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"BSHD", c.bshd}};
        meta.insert(meta.end(), extra.begin(), extra.end());
        return interpret_forward(c, in, meta, {cdiv(c.Sq, 64), c.Hq, c.B});
      };
      const std::vector<double> want = run({{"PIPELINE_QK", false}, {"PIPELINE_PV", false}});
      const auto both = [](bool qk, bool pv, bool pingpong, bool peel = true) {
        return lang::Meta{{"PIPELINE_QK", qk}, {"PIPELINE_PV", pv}, {"PINGPONG", pingpong}, {"PV_PEEL", peel}};
      };
      // each pipeline alone (PIPELINE_PV with and without PV_PEEL), both (FlashAttention-3's full
      // overlap), and with PINGPONG; the S_q > S_k causal case has rows that see no key
      for (const lang::Meta& extra : {both(true, false, false), both(false, true, false), both(false, true, false, false),
                                      both(true, true, false), both(false, false, true), both(false, true, true),
                                      both(true, true, true)}) {
        const size_t differ = values_differ(run(extra), want);
        CHECK_MESSAGE(differ == 0, fmt::format("PIPELINE_QK={} PIPELINE_PV={} PINGPONG={} PV_PEEL={}: {} values differ",
                                               std::get<bool>(extra[0].second), std::get<bool>(extra[1].second),
                                               std::get<bool>(extra[2].second), std::get<bool>(extra[3].second), differ));
      }
      check_case(c, {{"PIPELINE_PV", true}});  // and against the float64 reference
      check_case(c, {{"PIPELINE_PV", true}, {"PIPELINE_QK", true}});
    }
}

// PERSISTENT: a 1-D grid of any size walks the tiles (causal: heaviest query tiles first); every
// tile is computed once and exactly as on the one-program-per-tile grid, with the D128 schedule
// (ring producer, PIPELINE_PV, PV_PEEL; the interpreter runs its arithmetic) and without it.
TEST_CASE("attention forward: PERSISTENT on grids of any size gives bit-identical results") {
  for (bool causal : {false, true})
    for (const Case& c : {Case{2, 4, 2, 300, 200, 128, causal, true}, Case{1, 3, 1, 70, 130, 64, causal, false}}) {
      INFO(c.describe());
      ForwardInputs in = random_forward_inputs(c, 41);
      const int64_t BM = c.D == 128 ? 128 : 64;
      // OVERLAP_TILES: each tile's first key block beside the previous tile's last P V (PIPELINE_PV
      // set for D 64, whose default loop is the plain one)
      auto run = [&](bool persistent, int64_t programs, bool overlap = false) {
        lang::Meta meta{{"HEAD_DIM", c.D}, {"BLOCK_M", BM}, {"BLOCK_N", BM}, {"CAUSAL", c.causal}, {"BSHD", c.bshd},
                        {"PERSISTENT", persistent}};
        if (overlap) meta.insert(meta.end(), {{"PIPELINE_PV", true}, {"OVERLAP_TILES", true}});
        return interpret_forward(c, in, meta, persistent ? runtime::Grid{programs} : runtime::Grid{cdiv(c.Sq, BM), c.Hq, c.B});
      };
      const std::vector<double> want = run(false, 0);
      const int64_t tiles = cdiv(c.Sq, BM) * c.Hq * c.B;
      for (int64_t programs : {int64_t{1}, int64_t{3}, tiles - 1, tiles + 5})
        for (bool overlap : {false, true}) {
          const size_t differ = values_differ(run(true, programs, overlap), want);
          CHECK_MESSAGE(differ == 0, fmt::format("PERSISTENT{} on {} programs ({} tiles): {} values differ",
                                                 overlap ? " + OVERLAP_TILES" : "", programs, tiles, differ));
        }
    }
  CHECK_THROWS_WITH_AS(kernels::attention_forward().build({{"PERSISTENT", true}, {"VARLEN", true}}),
                       doctest::Contains("PERSISTENT walks the tiles of dense batches"), lang::BuildError);
  CHECK_THROWS_WITH_AS(kernels::attention_forward().build({{"HEAD_DIM", 128}, {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"OVERLAP_TILES", true}}),
                       doctest::Contains("OVERLAP_TILES runs a tile's first key block beside the previous tile's last P V: it needs "
                                         "PERSISTENT=true and PV_PEEL"),
                       lang::BuildError);
}

TEST_CASE("attention forward: PIPELINE_QK and EXACT_NORMALIZE give the same results") {
  for (bool causal : {false, true}) {
    check_case({1, 4, 2, 70, 130, 64, causal, false}, {{"PIPELINE_QK", true}});
    check_case({2, 2, 1, 100, 45, 128, causal, true}, {{"PIPELINE_QK", true}, {"EXACT_NORMALIZE", true}});
    check_case({1, 2, 2, 33, 200, 64, causal, false}, {{"EXACT_NORMALIZE", false}});
  }
}

// POSITIVE_SCALE: the row max over raw scores and one fma per probability (FlashAttention-3's
// softmax), for softmax_scale > 0: against the float64 reference on the shapes above (key-less
// rows, GQA, D128, with the P V pipeline), and at a scale that is not 1/sqrt(D).
TEST_CASE("attention forward: POSITIVE_SCALE (fma softmax) matches the reference") {
  const lang::Meta pos{{"POSITIVE_SCALE", true}};
  for (bool causal : {false, true}) {
    check_case({1, 4, 2, 70, 130, 64, causal, false}, pos);
    check_case({2, 2, 1, 100, 45, 128, causal, true}, {{"POSITIVE_SCALE", true}, {"PIPELINE_PV", true}});
    check_case({1, 2, 2, 33, 200, 64, causal, false}, pos, 0.37);
  }
  check_case({1, 2, 2, 130, 50, 64, true, false}, pos);  // rows with no key: O = 0, LSE = -inf
}

// A negative scale is valid attention (the general kernel computes it); POSITIVE_SCALE's promise
// is then broken, and the kernel writes NaN instead of a silently wrong output.
TEST_CASE("attention forward: a negative softmax_scale -- general kernel right, POSITIVE_SCALE NaN") {
  const Case c{1, 2, 2, 70, 90, 64, true, false};
  check_case(c, {}, -0.2);
  HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape()), o(bf16, c.q_shape());
  HostTensor lse(f32, {c.B, c.Hq, c.Sq});
  q.fill_normal(31, 0, 1);
  k.fill_normal(32, 0, 1);
  v.fill_normal(33, 0, 1);
  runtime::interpret(kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"CAUSAL", true}, {"POSITIVE_SCALE", true}}),
                     {cdiv(c.Sq, 64), c.Hq, c.B}, {q, k, v, o, lse, -0.2f});
  size_t nan = 0;
  for (double x : o.to_f64()) nan += std::isnan(x) ? 1 : 0;
  CHECK(nan == o.to_f64().size());
  CHECK_THROWS_WITH_AS(kernels::attention_forward().build({{"POSITIVE_SCALE", true}, {"SCORE_MOD", 1}}),
                       doctest::Contains("POSITIVE_SCALE takes no SCORE_MOD"), lang::BuildError);
}

// The API's D 128 forward (128 x 128 tiles, the ring producer, PIPELINE_PV, PV_PEEL) when the keys
// fit in one partial block and the queries span two tiles: context parallelism's ring calls (all
// queries against the first zigzag chunk of another rank, 125 keys) measured 10x the single-GPU
// error on the GPU at W = 4.
TEST_CASE("attention forward: the API's D128 schedule with one partial key block") {
  for (bool causal : {false, true})
    for (const Case& c : {Case{1, 2, 2, 250, 125, 128, causal, true}, Case{1, 2, 2, 125, 250, 128, causal, true}}) {
      INFO(c.describe());
      HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape()), o(bf16, c.q_shape());
      HostTensor lse(f32, {c.B, c.Hq, c.Sq});
      q.fill_normal(31, 0, 1);
      k.fill_normal(32, 0, 1);
      v.fill_normal(33, 0, 1);
      kernels::ForwardConfig cfg;
      cfg.spec.dtype = bf16;
      cfg.spec.head_dim = 128;
      cfg.spec.bshd = true;
      cfg.spec.causal = causal;
      cfg.block_m = cfg.block_n = 128;
      runtime::interpret(kernels::attention_forward().build(cfg.to_meta()), {cdiv(c.Sq, 128), c.Hq, c.B},
                         {q, k, v, o, lse, static_cast<float>(c.default_scale())});
      const testing::AttentionForwardRef ref = testing::attention_forward_ref(c, q, k, v, c.default_scale());
      CHECK(testing::rel_error(c, o, ref.o) < 1e-2);
    }
}
