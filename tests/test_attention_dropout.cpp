// Attention with fused dropout (issue 7) in the CPU interpreter: forward (DROPOUT, RETURN_MASK) and
// backward (dK/dV, dQ) against a float64 reference that applies the SAME keep-mask, computed on the
// host by kernels/philox_host.hpp (element (bh = b * Hq + h, query row i, key column j)). Grouped-
// and multi-query heads, causal (bottom-right) and not, S_q != S_k, ragged lengths, both layouts,
// varlen, p = 0.1 and 0.5; the mask the forward returns is the host mask bit for bit under every
// BLOCK_M x BLOCK_N; keep-rate statistics; p = 0 (threshold 256) reproduces the kernel without
// dropout bit for bit.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_reference.hpp"
#include "dropout_key_args.hpp"
#include "jit/compile.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;
using Case = testing::AttentionCase;

namespace {

// The dropout of one call: the Philox key material and the 8-bit keep threshold.
struct Rng {
  uint64_t seed = 0x0123456789abcdefULL, offset = 0xfedcba9876543210ULL;
  double p = 0.1;
  // where the call sits in a larger attention: row_offset, col_offset, head_offset, heads
  // (kernels::DropoutCoordinates; all 0: its own mask)
  std::array<int32_t, 4> coordinates{};
  // the mask's coordinates of the call's (bh = b * Hq + h, i, j)
  uint32_t global_bh(int bh, int heads_q) const {
    const int heads = coordinates[3] ? coordinates[3] : heads_q;
    return static_cast<uint32_t>(bh / heads_q * heads + coordinates[2] + bh % heads_q);
  }
  bool keep(int bh, int heads_q, int i, int j) const {
    return kernels::dropout_keep_host(host(), global_bh(bh, heads_q), static_cast<uint32_t>(i + coordinates[0]),
                                      static_cast<uint32_t>(j + coordinates[1]));
  }
  uint32_t threshold() const { return kernels::dropout_keep_threshold(p); }
  kernels::DropoutRngHost host() const { return {seed, offset, threshold()}; }
  // 1 / (effective keep probability): what kept values are scaled by
  double scale() const { return 256.0 / threshold(); }
  // the kernels' trailing scalar parameters
  std::vector<runtime::Arg> args() const {
    return testing::attention_dropout_args(host(), nullptr, coordinates);
  }
};

struct Blocks {
  int m = 64, n = 64;
};

struct DropoutRef {
  std::vector<double> o, lse, dq, dk, dv, delta;  // logical row-major like q/k/v, lse/delta [B, Hq, Sq]
};

// O = dropout(softmax(scale Q K^T)) V with the host keep-mask (kept / keep probability), LSE of the
// undropped softmax, and the exact gradients: dV = Pd^T dO, dP = (dO V^T) * keep * s, Delta =
// rowsum(dO * O) = rowsum(P * dP), dS = P * (dP - Delta). `batch0`: the batch index of c's batch 0
// in the mask's coordinates (varlen: the sequence).
DropoutRef dropout_ref(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor* dout,
                       double scale, const Rng& rng, int batch0 = 0) {
  const double s = rng.scale();
  DropoutRef r;
  const auto nq = static_cast<size_t>(c.B) * static_cast<size_t>(c.Hq) * static_cast<size_t>(c.Sq);
  r.o.assign(static_cast<size_t>(q.numel()), 0.0);
  r.lse.assign(nq, -INFINITY);
  r.delta.assign(nq, 0.0);
  if (dout) {
    r.dq.assign(static_cast<size_t>(q.numel()), 0.0);
    r.dk.assign(static_cast<size_t>(k.numel()), 0.0);
    r.dv.assign(static_cast<size_t>(v.numel()), 0.0);
  }
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      const int kh = c.kv_head(h);
      const int bh = (batch0 + b) * c.Hq + h;
      for (int i = 0; i < c.Sq; ++i) {
        double lse = 0;
        const std::vector<double> p = testing::attention_row(c, q, k, b, h, i, scale, lse);
        r.lse[testing::flat_index({c.B, c.Hq, c.Sq}, {b, h, i})] = lse;
        std::vector<double> pd(p.size());  // dropped and rescaled
        for (size_t j = 0; j < p.size(); ++j)
          pd[j] = rng.keep(bh, c.Hq, i, static_cast<int>(j)) ? p[j] * s : 0.0;
        double delta = 0;
        for (int d = 0; d < c.D; ++d) {
          double o = 0;
          for (size_t j = 0; j < p.size(); ++j) o += pd[j] * v.get(c.at(b, kh, static_cast<int>(j), d));
          r.o[testing::flat_index(c.q_shape(), c.at(b, h, i, d))] = o;
          if (dout) delta += dout->get(c.at(b, h, i, d)) * o;
        }
        if (!dout || p.empty()) continue;
        r.delta[testing::flat_index({c.B, c.Hq, c.Sq}, {b, h, i})] = delta;
        for (size_t j = 0; j < p.size(); ++j) {
          const int jj = static_cast<int>(j);
          double dp = 0;
          if (pd[j] != 0)
            for (int d = 0; d < c.D; ++d) dp += dout->get(c.at(b, h, i, d)) * v.get(c.at(b, kh, jj, d));
          dp *= pd[j] != 0 ? s : 0.0;
          const double ds = p[j] * (dp - delta);
          for (int d = 0; d < c.D; ++d) {
            r.dv[testing::flat_index(c.kv_shape(), c.at(b, kh, jj, d))] += pd[j] * dout->get(c.at(b, h, i, d));
            r.dq[testing::flat_index(c.q_shape(), c.at(b, h, i, d))] += scale * ds * k.get(c.at(b, kh, jj, d));
            r.dk[testing::flat_index(c.kv_shape(), c.at(b, kh, jj, d))] += scale * ds * q.get(c.at(b, h, i, d));
          }
        }
      }
    }
  return r;
}

std::vector<runtime::Arg> concat(std::vector<runtime::Arg> a, const std::vector<runtime::Arg>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Forward (with the mask returned) and backward through the interpreter with dropout, against the
// float64 reference with the host mask; the returned mask is the host mask wherever the forward
// visits a block, and covers every visible (row, key).
void check_dropout(const Case& c, const Rng& rng, Blocks blocks = {}, DType dtype = bf16) {
  INFO(c.describe() << " " << ir::name(dtype) << " p=" << rng.p << " BLOCK_M=" << blocks.m << " BLOCK_N=" << blocks.n);
  HostTensor q(dtype, c.q_shape()), k(dtype, c.kv_shape()), v(dtype, c.kv_shape()), dout(dtype, c.q_shape());
  HostTensor o(dtype, c.q_shape()), dq(dtype, c.q_shape()), dk(dtype, c.kv_shape()), dv(dtype, c.kv_shape());
  HostTensor lse(f32, {c.B, c.Hq, c.Sq}), delta(f32, {c.B, c.Hq, c.Sq}), mask(u8, {c.B * c.Hq, c.Sq, c.Sk});
  mask.poison();  // 0xFF: never written
  q.fill_normal(31, 0, 1);
  k.fill_normal(32, 0, 1);
  v.fill_normal(33, 0, 1);
  dout.fill_normal(34, 0, 1);
  const auto scale = static_cast<float>(c.default_scale());
  const Meta meta{{"DTYPE", dtype}, {"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"BSHD", c.bshd},
                  {"BLOCK_M", blocks.m}, {"BLOCK_N", blocks.n}, {"DROPOUT", true}};
  Meta fwd_meta = meta;
  fwd_meta.emplace_back("RETURN_MASK", true);
  const int64_t q_blocks = cdiv(c.Sq, blocks.m), k_blocks = cdiv(c.Sk, blocks.n);

  std::vector<runtime::Arg> fwd_args = concat({q, k, v, o, lse, scale}, rng.args());
  fwd_args.emplace_back(mask);
  runtime::interpret(kernels::attention_forward().build(fwd_meta), {q_blocks, c.Hq, c.B}, fwd_args);
  runtime::interpret(kernels::attention_backward_preprocess().build(
                         {{"DTYPE", dtype}, {"BLOCK_M", blocks.m}, {"HEAD_DIM", c.D}, {"BSHD", c.bshd}}),
                     {q_blocks, c.Hq, c.B}, {o, dout, delta});
  runtime::interpret(kernels::attention_backward_dkdv().build(meta), {k_blocks, c.Hkv, c.B},
                     concat({q, k, v, dout, lse, delta, dk, dv, scale}, rng.args()));
  runtime::interpret(kernels::attention_backward_dq().build(meta), {q_blocks, c.Hq, c.B},
                     concat({q, k, v, dout, lse, delta, dq, scale}, rng.args()));
  // dK/dV's DROPOUT_AHEAD (its Philox words computed while S^T's MMA runs: decision 098): the same
  // dK and dV bit for bit
  if (blocks.n % 64 == 0) {
    HostTensor dk2(dtype, c.kv_shape()), dv2(dtype, c.kv_shape());
    Meta ahead_meta = meta;
    ahead_meta.emplace_back("DROPOUT_AHEAD", true);
    runtime::interpret(kernels::attention_backward_dkdv().build(ahead_meta), {k_blocks, c.Hkv, c.B},
                       concat({q, k, v, dout, lse, delta, dk2, dv2, scale}, rng.args()));
    int64_t differ = 0;
    for (auto [x, y] : {std::pair{&dk, &dk2}, {&dv, &dv2}})
      for (int64_t e = 0; e < x->numel(); ++e) differ += x->get_flat(e) != y->get_flat(e) ? 1 : 0;
    CHECK(differ == 0);
  }

  // rng = precomputed: dK/dV and dQ reading the packed mask (DROPOUT_BITS) give the fused
  // backward's gradients bit for bit (whole 32-column words: BLOCK_N a multiple of 32).
  if (blocks.n % 32 == 0 && rng.coordinates == std::array<int32_t, 4>{}) {  // (bits are the call's own mask)
    const int64_t words = (c.Sk + 31) / 32;
    const std::vector<uint32_t> packed = kernels::dropout_mask_packed_host(rng.host(), c.B * c.Hq, c.Sq, c.Sk);
    HostTensor bits(u32, {c.B * c.Hq, c.Sq, words});
    for (int64_t e = 0; e < bits.numel(); ++e) bits.set_flat(e, packed[static_cast<size_t>(e)]);
    Meta bits_meta = meta;
    bits_meta.emplace_back("DROPOUT_BITS", true);
    // dK/dV under kv_meta, then dQ reading the mask words in `words_arg` (DROPOUT_BITS); how many
    // elements of dQ, dK and dV differ from the fused backward's
    const auto backward_differs = [&](const Meta& kv_meta, HostTensor& words_arg, const Meta& q_meta) {
      HostTensor dq2(dtype, c.q_shape()), dk2(dtype, c.kv_shape()), dv2(dtype, c.kv_shape());
      std::vector<runtime::Arg> kv_args = concat({q, k, v, dout, lse, delta, dk2, dv2, scale}, rng.args()),
                                q_args = concat({q, k, v, dout, lse, delta, dq2, scale}, rng.args());
      kv_args.emplace_back(words_arg);
      q_args.emplace_back(words_arg);
      runtime::interpret(kernels::attention_backward_dkdv().build(kv_meta), {k_blocks, c.Hkv, c.B}, kv_args);
      runtime::interpret(kernels::attention_backward_dq().build(q_meta), {q_blocks, c.Hq, c.B}, q_args);
      int64_t differ = 0;
      for (auto [a, b] : {std::pair{&dq, &dq2}, {&dk, &dk2}, {&dv, &dv2}})
        for (int64_t e = 0; e < a->numel(); ++e) differ += a->get_flat(e) != b->get_flat(e) ? 1 : 0;
      return differ;
    };
    CHECK(backward_differs(bits_meta, bits, bits_meta) == 0);

    // DROPOUT_WRITE_BITS (docs/dropout-backward-mask-once.md): the fused dK/dV also stores the words
    // it draws; dQ reading them (DROPOUT_BITS) gives the fused gradients bit for bit, and every
    // visible (row, key) of the stored words is the host mask's bit.
    // Key-major (DROPOUT_WORDS_KEY_MAJOR: the words' tensor takes any strides; the API passes
    // [B * Hq, S_q, words] with strides [words * S_q, 1, S_q]: decision 097), written and read so.
    for (bool key_major : {false, true}) {
      if (blocks.n % 64 != 0) break;
      INFO("key-major " << key_major);
      HostTensor written = key_major ? HostTensor(u32, {c.B * c.Hq, c.Sq, words}, {words * c.Sq, 1, c.Sq})
                                     : HostTensor(u32, {c.B * c.Hq, c.Sq, words});
      written.poison();  // 0xFFFFFFFF: never written (blocks dK/dV skips: past the causal diagonal)
      Meta write_meta = meta, read_meta = bits_meta;
      write_meta.emplace_back("DROPOUT_WRITE_BITS", true);
      if (key_major) {
        write_meta.emplace_back("DROPOUT_WORDS_KEY_MAJOR", true);
        read_meta.emplace_back("DROPOUT_WORDS_KEY_MAJOR", true);
      }
      CHECK(backward_differs(write_meta, written, read_meta) == 0);
      int64_t wrong_bits = 0, visible_bits = 0;
      for (int64_t bh = 0; bh < c.B * c.Hq; ++bh)
        for (int64_t i = 0; i < c.Sq; ++i)
          for (int64_t j = 0; j < c.Sk && (!c.causal || j <= i + (c.Sk - c.Sq)); ++j) {
            const int64_t w = (bh * c.Sq + i) * words + j / 32;
            const auto got = static_cast<uint32_t>(written.get({bh, i, j / 32})), want = packed[static_cast<size_t>(w)];
            ++visible_bits;
            wrong_bits += ((got ^ want) >> (j % 32) & 1u) ? 1 : 0;
          }
      CHECK(visible_bits > 0);
      CHECK(wrong_bits == 0);
    }
  }

  const DropoutRef ref = dropout_ref(c, q, k, v, &dout, scale, rng);
  std::vector<double> lse_got = lse.to_f64(), lse_ref = ref.lse;
  for (size_t r = 0; r < lse_ref.size(); ++r)
    if (lse_ref[r] == -INFINITY && lse_got[r] == -INFINITY) lse_got[r] = lse_ref[r] = 0;
  const double e_o = testing::rel_error(c, o, ref.o), e_lse = testing::rel_error(lse_got, lse_ref);
  const double e_dq = testing::rel_error(c, dq, ref.dq), e_dk = testing::rel_error(c, dk, ref.dk);
  const double e_dv = testing::rel_error(c, dv, ref.dv), e_delta = testing::rel_error(c, delta, ref.delta);
  MESSAGE(fmt::format("dropout p={} {} {} blocks {}x{}: rel. error O {:.2e} LSE {:.2e} dQ {:.2e} dK {:.2e} dV {:.2e} Delta {:.2e}",
                      rng.p, c.describe(), ir::name(dtype), blocks.m, blocks.n, e_o, e_lse, e_dq, e_dk, e_dv, e_delta));
  CHECK(e_o < 1e-2);
  CHECK(e_lse < 1e-4);
  CHECK(e_dq < 1e-2);
  CHECK(e_dk < 1e-2);
  CHECK(e_dv < 1e-2);
  CHECK(e_delta < 1e-2);

  // The returned mask: the host mask bit for bit where written; written at every visible element.
  int64_t wrong = 0, unwritten_visible = 0, kept = 0, visible = 0;
  for (int bh = 0; bh < c.B * c.Hq; ++bh)
    for (int i = 0; i < c.Sq; ++i)
      for (int j = 0; j < c.Sk; ++j) {
        const double m = mask.get({bh, i, j});
        const bool vis = j < c.visible(i);
        if (m == 255) {
          unwritten_visible += vis ? 1 : 0;
          continue;
        }
        const bool keep = rng.keep(bh, c.Hq, i, j);
        wrong += (m == 1) != keep || (m != 0 && m != 1) ? 1 : 0;
        if (vis) ++visible, kept += m == 1 ? 1 : 0;
      }
  CHECK(wrong == 0);
  CHECK(unwritten_visible == 0);
  if (visible > 2000) {  // loose: the statistics test below is the strict one
    const double rate = static_cast<double>(kept) / static_cast<double>(visible);
    CHECK(std::abs(rate - kernels::dropout_keep_probability(rng.threshold())) < 0.05);
  }
}

}  // namespace

TEST_CASE("attention dropout: grouped-query heads, S_q != S_k, full and causal, p = 0.1 and 0.5") {
  for (double p : {0.1, 0.5})
    for (bool causal : {false, true}) check_dropout({1, 4, 2, 70, 130, 64, causal, false}, Rng{.p = p});
}

TEST_CASE("attention dropout: a call placed in a larger attention (global coordinates) draws that attention's mask") {
  // rows 96.., keys 128.., heads 3.. of 11 (context parallelism's shards), forward and backward
  for (bool causal : {false, true})
    check_dropout({2, 4, 2, 70, 130, 64, causal, false}, Rng{.p = 0.3, .coordinates = {96, 128, 3, 11}});
  check_dropout({1, 2, 1, 100, 64, 64, true, true}, Rng{.seed = 9, .p = 0.5, .coordinates = {0, 64, 0, 0}}, {32, 64});
}

TEST_CASE("attention dropout: the forward on a slice of the heads, placed by head_offset, equals the whole call's heads bit for bit") {
  const Case c{2, 4, 2, 64, 96, 64, true, false};
  HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape()), o(bf16, c.q_shape());
  HostTensor lse(f32, {c.B, c.Hq, c.Sq});
  q.fill_normal(41, 0, 1), k.fill_normal(42, 0, 1), v.fill_normal(43, 0, 1);
  const auto scale = static_cast<float>(c.default_scale());
  const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", c.D}, {"CAUSAL", true}, {"BSHD", false}, {"DROPOUT", true}};
  const Rng whole{.p = 0.25};
  runtime::interpret(kernels::attention_forward().build(meta), {cdiv(c.Sq, 64), c.Hq, c.B}, concat({q, k, v, o, lse, scale}, whole.args()));
  // heads [2, 4) with their key/value head (group of 2): [B, 2, S, D] slices
  const Case half{2, 2, 1, 64, 96, 64, true, false};
  HostTensor qh(bf16, half.q_shape()), kh(bf16, half.kv_shape()), vh(bf16, half.kv_shape()), oh(bf16, half.q_shape());
  HostTensor lseh(f32, {half.B, half.Hq, half.Sq});
  for (int b = 0; b < c.B; ++b)
    for (int s = 0; s < 96; ++s)
      for (int d = 0; d < c.D; ++d) {
        if (s < 64)
          for (int h = 0; h < 2; ++h) qh.set(half.at(b, h, s, d), q.get(c.at(b, 2 + h, s, d)));
        kh.set(half.at(b, 0, s, d), k.get(c.at(b, 1, s, d)));
        vh.set(half.at(b, 0, s, d), v.get(c.at(b, 1, s, d)));
      }
  const Rng placed{.p = 0.25, .coordinates = {0, 0, 2, 4}};
  runtime::interpret(kernels::attention_forward().build(meta), {cdiv(half.Sq, 64), half.Hq, half.B},
                     concat({qh, kh, vh, oh, lseh, scale}, placed.args()));
  int64_t differ = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 64; ++s)
        for (int d = 0; d < c.D; ++d) differ += oh.get(half.at(b, h, s, d)) != o.get(c.at(b, 2 + h, s, d)) ? 1 : 0;
  CHECK(differ == 0);
  // and the slice's own mask (no coordinates) is another one
  HostTensor own(bf16, half.q_shape());
  runtime::interpret(kernels::attention_forward().build(meta), {cdiv(half.Sq, 64), half.Hq, half.B},
                     concat({qh, kh, vh, own, lseh, scale}, whole.args()));
  int64_t own_differ = 0;
  for (int64_t e = 0; e < own.numel(); ++e) own_differ += own.get_flat(e) != oh.get_flat(e) ? 1 : 0;
  CHECK(own_differ > 0);
}

TEST_CASE("attention dropout: [B, S, H, D], multi-query heads, causal with S_q > S_k (key-less rows), BLOCK_M != BLOCK_N") {
  check_dropout({2, 2, 1, 100, 45, 64, true, true}, Rng{.seed = 7, .offset = 0, .p = 0.5}, {32, 16});
  check_dropout({1, 3, 1, 40, 75, 64, false, true}, Rng{.seed = 1ULL << 40, .offset = 3ULL << 33, .p = 0.1}, {16, 32});
}

TEST_CASE("attention dropout: f16, head dim 128, ragged lengths") {
  check_dropout({1, 2, 1, 33, 81, 128, true, false}, Rng{.p = 0.1}, {64, 32}, f16);
}

// Forward alone: the returned mask and O under several tile shapes. The mask is the host mask, bit
// for bit, whatever BLOCK_M and BLOCK_N (and the outputs agree to rounding).
TEST_CASE("attention dropout: the mask does not depend on BLOCK_M / BLOCK_N") {
  const Case c{2, 2, 2, 96, 160, 64, false, false};
  const Rng rng{.seed = 42, .offset = 1234, .p = 0.3};
  HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape());
  q.fill_normal(1, 0, 1);
  k.fill_normal(2, 0, 1);
  v.fill_normal(3, 0, 1);
  const auto scale = static_cast<float>(c.default_scale());
  const std::vector<uint8_t> host = kernels::dropout_mask_host(rng.host(), c.B * c.Hq, c.Sq, c.Sk);
  std::vector<double> o_first;
  for (Blocks bl : {Blocks{64, 64}, Blocks{16, 16}, Blocks{32, 64}, Blocks{128, 32}, Blocks{16, 128}}) {
    INFO("BLOCK_M=" << bl.m << " BLOCK_N=" << bl.n);
    HostTensor o(bf16, c.q_shape()), lse(f32, {c.B, c.Hq, c.Sq}), mask(u8, {c.B * c.Hq, c.Sq, c.Sk});
    mask.poison();
    auto fn = kernels::attention_forward().build(
        {{"HEAD_DIM", c.D}, {"BLOCK_M", bl.m}, {"BLOCK_N", bl.n}, {"DROPOUT", true}, {"RETURN_MASK", true}});
    std::vector<runtime::Arg> args = concat({q, k, v, o, lse, scale}, rng.args());
    args.emplace_back(mask);
    runtime::interpret(fn, {cdiv(c.Sq, bl.m), c.Hq, c.B}, args);
    int64_t wrong = 0;
    for (int64_t e = 0; e < mask.numel(); ++e) wrong += mask.get_flat(e) != host[static_cast<size_t>(e)] ? 1 : 0;
    CHECK(wrong == 0);
    const std::vector<double> og = o.to_f64();
    if (o_first.empty()) o_first = og;
    else CHECK(testing::rel_error(og, o_first) < 1e-2);
    const DropoutRef ref = dropout_ref(c, q, k, v, nullptr, scale, rng);
    CHECK(testing::rel_error(c, o, ref.o) < 1e-2);
  }
}

// The forward's mask over 0.5M elements: the keep rate within 5 standard deviations of
// threshold / 256, and a chi-square test over the 16 byte positions of a Philox call (keep counts
// per position j % 16, binomial variance; 15 degrees of freedom).
TEST_CASE("attention dropout: keep-rate statistics of the fused mask") {
  const Case c{1, 4, 4, 256, 512, 64, false, false};
  for (double p : {0.1, 0.5}) {
    const Rng rng{.seed = 0x5eed, .offset = 77, .p = p};
    HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape()), o(bf16, c.q_shape());
    HostTensor lse(f32, {c.B, c.Hq, c.Sq}), mask(u8, {c.B * c.Hq, c.Sq, c.Sk});
    q.fill_normal(1, 0, 1);
    k.fill_normal(2, 0, 1);
    v.fill_normal(3, 0, 1);
    auto fn = kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"DROPOUT", true}, {"RETURN_MASK", true}});
    std::vector<runtime::Arg> args = concat({q, k, v, o, lse, static_cast<float>(c.default_scale())}, rng.args());
    args.emplace_back(mask);
    runtime::interpret(fn, {cdiv(c.Sq, 64), c.Hq, c.B}, args);
    const double keep_p = kernels::dropout_keep_probability(rng.threshold());
    const auto n = static_cast<double>(mask.numel());
    std::vector<double> kept_at(16, 0.0);
    double kept = 0;
    for (int64_t e = 0; e < mask.numel(); ++e) {
      const double m = mask.get_flat(e);
      REQUIRE((m == 0 || m == 1));
      kept += m;
      kept_at[static_cast<size_t>(e % c.Sk % 16)] += m;
    }
    const double rate = kept / n, sigma = std::sqrt(keep_p * (1 - keep_p) / n);
    double chi2 = 0;
    const double expect = n / 16 * keep_p, var = expect * (1 - keep_p);
    for (double x : kept_at) chi2 += (x - expect) * (x - expect) / var;
    MESSAGE(fmt::format("p={}: keep rate {:.6f} over {} elements ({} kept), expected {:.6f} (|z| = {:.3f}); chi-square over byte "
                        "positions {:.1f} (15 dof)",
                        p, rate, mask.numel(), kept, keep_p, std::abs(rate - keep_p) / sigma, chi2));
    CHECK(std::abs(rate - keep_p) < 5 * sigma);
    CHECK(chi2 < 50);  // P(chi2_15 > 50) ~ 1e-5
  }
}

// threshold 256 (p = 0) keeps everything with scale 1: bit for bit the kernels without dropout.
TEST_CASE("attention dropout: p = 0 gives the outputs and gradients of the kernels without dropout, bit for bit") {
  const Case c{1, 2, 1, 50, 70, 64, true, false};
  const Rng rng{.p = 0.0};
  REQUIRE(rng.threshold() == 256);
  HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape()), dout(bf16, c.q_shape());
  q.fill_normal(5, 0, 1);
  k.fill_normal(6, 0, 1);
  v.fill_normal(7, 0, 1);
  dout.fill_normal(8, 0, 1);
  const auto scale = static_cast<float>(c.default_scale());
  std::vector<std::vector<double>> outs[2];
  for (bool dropout : {false, true}) {
    HostTensor o(bf16, c.q_shape()), dq(bf16, c.q_shape()), dk(bf16, c.kv_shape()), dv(bf16, c.kv_shape());
    HostTensor lse(f32, {c.B, c.Hq, c.Sq}), delta(f32, {c.B, c.Hq, c.Sq});
    const Meta meta{{"HEAD_DIM", c.D}, {"CAUSAL", true}, {"DROPOUT", dropout}};
    const std::vector<runtime::Arg> extra = dropout ? rng.args() : std::vector<runtime::Arg>{};
    runtime::interpret(kernels::attention_forward().build(meta), {cdiv(c.Sq, 64), c.Hq, c.B}, concat({q, k, v, o, lse, scale}, extra));
    runtime::interpret(kernels::attention_backward_preprocess().build({{"HEAD_DIM", c.D}}), {cdiv(c.Sq, 64), c.Hq, c.B}, {o, dout, delta});
    runtime::interpret(kernels::attention_backward_dkdv().build(meta), {cdiv(c.Sk, 64), c.Hkv, c.B},
                       concat({q, k, v, dout, lse, delta, dk, dv, scale}, extra));
    runtime::interpret(kernels::attention_backward_dq().build(meta), {cdiv(c.Sq, 64), c.Hq, c.B},
                       concat({q, k, v, dout, lse, delta, dq, scale}, extra));
    outs[dropout ? 1 : 0] = {o.to_f64(), lse.to_f64(), dq.to_f64(), dk.to_f64(), dv.to_f64()};
  }
  for (size_t t = 0; t < outs[0].size(); ++t) {
    INFO("output " << t);
    CHECK(outs[0][t] == outs[1][t]);
  }
}

// Varlen: the mask's batch is the sequence index and its rows/columns are positions inside the
// sequence (what a dense call on the sequence alone with bh = b * Hq + h would use).
TEST_CASE("attention dropout: variable-length batches, forward and backward, per sequence against float64") {
  const int Hq = 4, Hkv = 2, D = 64;
  const std::vector<int> lens_q{0, 1, 70, 33}, lens_k{5, 40, 90, 0};
  const int B = static_cast<int>(lens_q.size());
  std::vector<int> cu_q{0}, cu_k{0};
  for (int b = 0; b < B; ++b) cu_q.push_back(cu_q.back() + lens_q[static_cast<size_t>(b)]), cu_k.push_back(cu_k.back() + lens_k[static_cast<size_t>(b)]);
  const int total_q = cu_q.back(), total_k = cu_k.back();
  const int max_q = *std::max_element(lens_q.begin(), lens_q.end()), max_k = *std::max_element(lens_k.begin(), lens_k.end());
  for (bool causal : {false, true}) {
    INFO("causal=" << causal);
    const Rng rng{.seed = 99, .offset = 5, .p = 0.5};
    HostTensor q(bf16, {total_q, Hq, D}), k(bf16, {total_k, Hkv, D}), v(bf16, {total_k, Hkv, D}), dout(bf16, {total_q, Hq, D});
    HostTensor o(bf16, {total_q, Hq, D}), dq(bf16, {total_q, Hq, D}), dk(bf16, {total_k, Hkv, D}), dv(bf16, {total_k, Hkv, D});
    HostTensor lse(f32, {Hq, total_q}), delta(f32, {Hq, total_q}), cq(i32, {B + 1}), ck(i32, {B + 1});
    HostTensor mask(u8, {B * Hq, max_q, max_k});
    mask.poison();
    for (int b = 0; b <= B; ++b) cq.set({b}, cu_q[static_cast<size_t>(b)]), ck.set({b}, cu_k[static_cast<size_t>(b)]);
    q.fill_normal(41, 0, 1);
    k.fill_normal(42, 0, 1);
    v.fill_normal(43, 0, 1);
    dout.fill_normal(44, 0, 1);
    const auto scale = static_cast<float>(1.0 / std::sqrt(double{D}));
    const Meta meta{{"HEAD_DIM", D}, {"CAUSAL", causal}, {"VARLEN", true}, {"DROPOUT", true}};
    Meta fwd_meta = meta;
    fwd_meta.emplace_back("RETURN_MASK", true);
    std::vector<runtime::Arg> fwd_args = concat({q, k, v, o, lse, scale, cq, ck}, rng.args());
    fwd_args.emplace_back(mask);
    runtime::interpret(kernels::attention_forward().build(fwd_meta), {cdiv(max_q, 64), Hq, B}, fwd_args);
    runtime::interpret(kernels::attention_backward_preprocess().build({{"HEAD_DIM", D}, {"VARLEN", true}}), {cdiv(max_q, 64), Hq, B},
                       {o, dout, delta, cq});
    runtime::interpret(kernels::attention_backward_dkdv().build(meta), {cdiv(max_k, 64), Hkv, B},
                       concat({q, k, v, dout, lse, delta, dk, dv, scale, cq, ck}, rng.args()));
    runtime::interpret(kernels::attention_backward_dq().build(meta), {cdiv(max_q, 64), Hq, B},
                       concat({q, k, v, dout, lse, delta, dq, scale, cq, ck}, rng.args()));

    // per sequence: a dense [1, S, H, D] copy against the reference with the sequence's batch index
    auto seq = [](const HostTensor& t, int start, int n) {
      const int64_t H = t.sizes()[1], DD = t.sizes()[2];
      HostTensor s(t.dtype(), {1, std::max(n, 1), H, DD});
      for (int i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < DD; ++d) s.set({0, i, h, d}, t.get({start + i, h, d}));
      return s;
    };
    std::vector<double> got[4], want[4];  // O, dQ, dK, dV
    const kernels::DropoutRngHost host = rng.host();
    int64_t mask_wrong = 0;
    for (int b = 0; b < B; ++b) {
      const int sq = lens_q[static_cast<size_t>(b)], sk = lens_k[static_cast<size_t>(b)];
      const int q0 = cu_q[static_cast<size_t>(b)], k0 = cu_k[static_cast<size_t>(b)];
      if (sq == 0 && sk == 0) continue;
      const Case dc{1, Hq, Hkv, std::max(sq, 1), std::max(sk, 1), D, causal, true};
      if (sq == 0 || sk == 0) {  // gradients of an empty side: 0 (checked through the totals below)
        for (int j = 0; j < sk; ++j)
          for (int h = 0; h < Hkv; ++h)
            for (int d = 0; d < D; ++d) {
              CHECK(dk.get({k0 + j, h, d}) == 0.0);
              CHECK(dv.get({k0 + j, h, d}) == 0.0);
            }
        continue;
      }
      const HostTensor qs = seq(q, q0, sq), ks = seq(k, k0, sk), vs = seq(v, k0, sk), dos = seq(dout, q0, sq);
      const DropoutRef ref = dropout_ref(dc, qs, ks, vs, &dos, scale, rng, b);
      for (int h = 0; h < Hq; ++h)
        for (int i = 0; i < sq; ++i) {
          for (int d = 0; d < D; ++d) {
            got[0].push_back(o.get({q0 + i, h, d})), want[0].push_back(ref.o[testing::flat_index(dc.q_shape(), dc.at(0, h, i, d))]);
            got[1].push_back(dq.get({q0 + i, h, d})), want[1].push_back(ref.dq[testing::flat_index(dc.q_shape(), dc.at(0, h, i, d))]);
          }
          for (int j = 0; j < dc.visible(i); ++j)
            mask_wrong += (mask.get({b * Hq + h, i, j}) == 1) !=
                          kernels::dropout_keep_host(host, static_cast<uint32_t>(b * Hq + h), static_cast<uint32_t>(i), static_cast<uint32_t>(j));
        }
      for (int h = 0; h < Hkv; ++h)
        for (int j = 0; j < sk; ++j)
          for (int d = 0; d < D; ++d) {
            got[2].push_back(dk.get({k0 + j, h, d})), want[2].push_back(ref.dk[testing::flat_index(dc.kv_shape(), dc.at(0, h, j, d))]);
            got[3].push_back(dv.get({k0 + j, h, d})), want[3].push_back(ref.dv[testing::flat_index(dc.kv_shape(), dc.at(0, h, j, d))]);
          }
    }
    const double e_o = testing::rel_error(got[0], want[0]), e_dq = testing::rel_error(got[1], want[1]);
    const double e_dk = testing::rel_error(got[2], want[2]), e_dv = testing::rel_error(got[3], want[3]);
    MESSAGE(fmt::format("varlen dropout p=0.5 causal={}: rel. error O {:.2e} dQ {:.2e} dK {:.2e} dV {:.2e}", causal, e_o, e_dq, e_dk, e_dv));
    CHECK(e_o < 1e-2);
    CHECK(e_dq < 1e-2);
    CHECK(e_dk < 1e-2);
    CHECK(e_dv < 1e-2);
    CHECK(mask_wrong == 0);
  }
}

TEST_CASE("attention dropout: RETURN_MASK needs DROPOUT; the backward kernels declare DROPOUT") {
  CHECK_THROWS_AS(kernels::attention_forward().build({{"RETURN_MASK", true}}), BuildError);
  for (const Kernel* kern : {&kernels::attention_backward_dkdv(), &kernels::attention_backward_dq()}) {
    const ir::Function fn = kern->build({{"DROPOUT", true}});
    std::vector<std::string> names;
    for (const ir::Param& p : fn.params) names.push_back(p.name);
    CHECK(names.size() >= 11);
    CHECK(std::vector<std::string>(names.end() - 11, names.end()) ==
          std::vector<std::string>{"seed_lo", "seed_hi", "offset_lo", "offset_hi", "keep_threshold", "rng_state", "rng_state_in_memory",
                                   "dropout_row_offset", "dropout_col_offset", "dropout_head_offset", "dropout_heads"});
  }
}

// Issue 7's precomputed RNG: the forward reading the packed mask (DROPOUT_BITS, the bits the
// dropout_mask kernel writes) computes exactly what the fused forward computes, bit for bit.
TEST_CASE("attention dropout: reading the precomputed packed mask gives the fused forward's outputs bit for bit") {
  for (bool causal : {false, true})
  for (int head_dim : {64, 128}) {
    INFO("causal=" << causal << " D=" << head_dim);
    const Case c{2, 4, 2, 100, 200, head_dim, causal, false};  // ragged: S_k is not a multiple of 32 or 64
    const Rng rng{.seed = 7, .offset = 99, .p = 0.2};
    HostTensor q(bf16, c.q_shape()), k(bf16, c.kv_shape()), v(bf16, c.kv_shape());
    q.fill_normal(11, 0, 1);
    k.fill_normal(12, 0, 1);
    v.fill_normal(13, 0, 1);
    const auto scale = static_cast<float>(c.default_scale());
    const int64_t words = (c.Sk + 31) / 32;
    const std::vector<uint32_t> packed = kernels::dropout_mask_packed_host(rng.host(), c.B * c.Hq, c.Sq, c.Sk);
    HostTensor bits(u32, {c.B * c.Hq, c.Sq, words});
    for (int64_t e = 0; e < bits.numel(); ++e) bits.set_flat(e, packed[static_cast<size_t>(e)]);
    // the forward's O with these metas over {HEAD_DIM, CAUSAL, DROPOUT}; reading `bits` with DROPOUT_BITS
    auto forward = [&](const Meta& extra) {
      Meta meta{{"HEAD_DIM", c.D}, {"CAUSAL", causal}, {"DROPOUT", true}};
      meta.insert(meta.end(), extra.begin(), extra.end());
      HostTensor o(bf16, c.q_shape()), l(f32, {c.B, c.Hq, c.Sq});
      std::vector<runtime::Arg> args = concat({q, k, v, o, l, scale}, rng.args());
      if (std::any_of(extra.begin(), extra.end(), [](const auto& m) { return m.first == "DROPOUT_BITS"; })) args.emplace_back(bits);
      runtime::interpret(kernels::attention_forward().build(meta), {cdiv(c.Sq, 64), c.Hq, c.B}, args);
      return o;
    };
    auto differ = [](const HostTensor& a, const HostTensor& b) {
      int64_t n = 0;
      for (int64_t e = 0; e < a.numel(); ++e) n += a.get_flat(e) != b.get_flat(e) ? 1 : 0;
      return n;
    };
    const HostTensor fused = forward({});
    // the words read at the mask's use (the default) and (DROPOUT_AHEAD) right after S = Q K^T is
    // issued: the same outputs
    const HostTensor at_use = forward({{"DROPOUT_BITS", true}});
    const HostTensor ahead = forward({{"DROPOUT_BITS", true}, {"DROPOUT_AHEAD", true}});
    CHECK(differ(fused, at_use) == 0);
    CHECK(differ(fused, ahead) == 0);
    // the mask applied per element to the f32 probabilities (DROPOUT_PAIRS=false) instead of a pair
    // at a time to the rounded ones: the same bits, fused and read, whole 64-column call groups or not
    CHECK(differ(fused, forward({{"DROPOUT_PAIRS", false}})) == 0);
    CHECK(differ(fused, forward({{"DROPOUT_BITS", true}, {"DROPOUT_PAIRS", false}})) == 0);
    // the words generated on warps of their own and passed through a shared-memory channel
    // (RNG_WARPS: warp roles; the interpreter runs the generating role first)
    CHECK(differ(fused, forward({{"RNG_WARPS", 4}})) == 0);
    CHECK(differ(fused, forward({{"RNG_WARPS", 4}, {"DROPOUT_PAIRS", false}})) == 0);
    // and beside the pipelined P V (PIPELINE_PV: the D 128 default's loop; an A/B in
    // attention_bench --forward-variants --dropout)
    CHECK(differ(fused, forward({{"RNG_WARPS", 4}, {"PIPELINE_PV", true}})) == 0);
    // (another BLOCK_N sums in another order: compared with itself)
    CHECK(differ(forward({{"BLOCK_N", 32}}), forward({{"BLOCK_N", 32}, {"DROPOUT_PAIRS", false}})) == 0);
    const DropoutRef ref = dropout_ref(c, q, k, v, nullptr, scale, rng);
    CHECK(testing::rel_error(c, ahead, ref.o) < 1e-2);
  }
  // DROPOUT_BITS without DROPOUT, or with VARLEN, or partial mask words, is a build error naming
  // what it needs (forward and backward)
  for (const Kernel* kern : {&kernels::attention_forward(), &kernels::attention_backward_dkdv(), &kernels::attention_backward_dq()}) {
    CHECK_THROWS_WITH_AS(kern->build({{"DROPOUT_BITS", true}}), doctest::Contains("needs DROPOUT=true"), BuildError);
    CHECK_THROWS_WITH_AS(kern->build({{"DROPOUT", true}, {"DROPOUT_BITS", true}, {"BLOCK_N", 16}}),
                         doctest::Contains("multiple of 32 (whole mask words), got 16"), BuildError);
  }
  CHECK_THROWS_WITH_AS(kernels::attention_forward().build({{"DROPOUT", true}, {"RNG_WARPS", 4}, {"BLOCK_N", 32}}),
                       doctest::Contains("BLOCK_N a multiple of 64 (got BLOCK_N = 32)"), BuildError);
  CHECK_THROWS_WITH_AS(kernels::attention_forward().build({{"RNG_WARPS", 4}}), doctest::Contains("it needs DROPOUT=true"), BuildError);
}

// The forward's Philox calls run while the tensor cores compute S = Q K^T with DROPOUT_AHEAD (a
// schedule option, off by default: measured slower): in the PTX they sit between an MMA group's commit and its wait
// (up to 10 rounds x 2 wide multiplies x 4 calls a block per thread at 128 x 128 on 8 warps). With
// DROPOUT_AHEAD=false they follow the wait (computed at the mask's use).
TEST_CASE("attention dropout: the forward computes its Philox calls while S = Q K^T is in flight (DROPOUT_AHEAD)") {
  auto most_in_flight = [](bool ahead) {
    const Meta meta{{"HEAD_DIM", 128}, {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"BSHD", true}, {"DROPOUT", true},
                    {"POSITIVE_SCALE", true}, {"DROPOUT_AHEAD", ahead}};
    jit::CompileOptions o;
    o.make_cubin = false;
    o.num_warps = 8;
    o.pipeline.stages = 2;
    const std::string ptx = jit::compile(kernels::attention_forward().build(meta), o).ptx;
    // and the commit before them is fenced, so that ptxas does not hoist them between the wgmmas
    CHECK((ptx.find("TILEJIT_WGCOMMIT") != std::string::npos) == ahead);
    // by a loop after the commit, not around it: a commit that might run twice made ptxas commit a
    // dummy HGMMA group after it, and `wgmma.wait_group 1` then waited for P V too (decision 096)
    CHECK((ptx.find("wgmma.commit_group.sync.aligned;\n\tTILEJIT_WGCOMMIT") != std::string::npos) == ahead);
    CHECK(ptx.find(":\n\twgmma.commit_group") == std::string::npos);  // no label (loop head) right before a commit
    size_t most = 0;
    for (size_t at = ptx.find("wgmma.commit_group"); at != std::string::npos; at = ptx.find("wgmma.commit_group", at + 1)) {
      const size_t wait = ptx.find("wgmma.wait_group", at);
      size_t n = 0;
      for (size_t m = ptx.find("mul.wide.u32", at); m != std::string::npos && m < wait; m = ptx.find("mul.wide.u32", m + 1)) ++n;
      most = std::max(most, n);
    }
    return most;
  };
  CHECK(most_in_flight(true) >= 40);  // 66 today: a few are shared between calls or hoisted out of the loop
  CHECK(most_in_flight(false) == 0);
}
