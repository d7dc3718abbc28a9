// Library masks in the attention backward (issue 8 part 1; kernels/attention/backward.hpp, MASK): for
// every MaskKind, a float64 masked forward (O, LSE) on the host, then the preprocess, the
// block-mask pre-pass (both orders, for the kinds without tile intervals), dK/dV and dQ in
// the interpreter, against the float64 gradients with the host's dense mask (kernels/
// attention_mask_host.hpp). Small ragged bf16 shapes (S_q != S_k both ways), 16x16 / 32x16 / 16x32
// tiles, grouped-query heads, per-head block tables, per-batch documents and prefixes, two-run
// global windows, dropout with two kinds; rows with no allowed key and keys no row sees get zero
// gradients. Blocks a mask empties are never visited (NaN in their rows does not reach anything);
// end to end from the masked forward kernel (other tiles, its own lists); MASK=causal is CAUSAL=true
// bit for bit; build errors and the parameter order; PTX for sm_90a at the default schedules (skips
// visibly without ptxas).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dropout_key_args.hpp"
#include "ptxas_testing.hpp"
#include "attention_mask_testing.hpp"
#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/attention/mask_host.hpp"
#include "kernels/philox_host.hpp"
#include "api/registry.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace km = tilejit::kernels;
namespace rt = tilejit::runtime;
using km::MaskKind, km::MaskSpec, rt::HostTensor;

namespace {

// One masked backward problem: [B, H, S, D] bf16 tensors, the mask and its data, the kernels' tiles.
struct Problem : testing::MaskedProblemCore {
  double dropout_p = 0;  // 0: no dropout
  static constexpr int64_t D = 64;

  std::string describe() const {
    return fmt::format("{}: B={} Hq={} Hkv={} Sq={} Sk={} tiles {}x{}{}", label, B, Hq, Hkv, Sq, Sk, bm, bn,
                       dropout_p > 0 ? fmt::format(" dropout {}", dropout_p) : "");
  }
  bool uses_lists() const { return !km::mask_has_tile_intervals(spec.kind); }
  int64_t group() const { return Hq / Hkv; }
  km::DropoutRngHost rng() const { return {0x5eed5eed12345678ULL, 0x0000000300000007ULL, km::dropout_keep_threshold(dropout_p)}; }
};

// A random block table [rows, heads, cdiv(S_q, bq), cdiv(S_k, bk)] with about `density` ones.
void random_table(Problem& p, int64_t rows, int64_t heads, double density, std::mt19937& rng) {
  p.table_shape = {rows, heads, (p.Sq + p.spec.block_q - 1) / p.spec.block_q, (p.Sk + p.spec.block_k - 1) / p.spec.block_k};
  p.table.resize(static_cast<size_t>(rows * heads * p.table_shape[2] * p.table_shape[3]));
  for (uint8_t& x : p.table) x = static_cast<uint8_t>(std::uniform_real_distribution<double>(0, 1)(rng) < density);
}

// Every mask kind on a ragged shape, some with grouped-query heads, two with dropout.
std::vector<Problem> problems() {
  std::mt19937 rng(8);
  std::vector<Problem> ps;
  auto add = [&](auto&&... a) { return testing::add_problem(ps, std::forward<decltype(a)>(a)...); };
  add("full", MaskSpec::full(), 2, 2, 1, 45, 70, 16, 16);
  add("causal, S_q > S_k", MaskSpec::causal(), 1, 2, 2, 70, 45, 32, 16);
  add("sliding_window 21/35", MaskSpec::sliding_window(21, 35), 2, 2, 2, 70, 90, 16, 16);
  add("sliding_window 4/2, S_q > S_k", MaskSpec::sliding_window(4, 2), 1, 2, 1, 90, 37, 16, 32);
  add("causal_sliding_window 45", MaskSpec::causal_sliding_window(45), 1, 2, 2, 77, 77, 32, 16);
  add("global_sliding_window G=5 20/24 (two runs)", MaskSpec::global_sliding_window(5, 20, 24), 1, 4, 2, 90, 90, 16, 16);
  add("global_sliding_window G=20 2/2, S_q < S_k", MaskSpec::global_sliding_window(20, 2, 2), 1, 2, 2, 61, 83, 32, 16);
  Problem* prefix = add("prefix_lm per batch", MaskSpec::prefix_lm(), 3, 2, 2, 50, 60, 16, 16);
  prefix->prefix = {0, 23, 100};  // none, inside, past the end
  // the segment kinds: id rows per batch or one broadcast row ([1, S_k]), documents long enough
  // for full blocks as well as partial ones
  struct Segments {
    MaskSpec spec;
    int64_t id_rows, Hq, Sq, Sk, bm, bn;
  };
  for (const Segments& s : {Segments{MaskSpec::document(), 2, 2, 70, 50, 16, 32}, Segments{MaskSpec::causal_document(), 1, 4, 80, 80, 16, 16},
                            Segments{MaskSpec::share_question(), 2, 2, 50, 75, 16, 16}, Segments{MaskSpec::causal_blockwise(), 2, 2, 75, 75, 32, 16}}) {
    Problem* p = add(fmt::format("{} ids [{}, S_k]", km::mask_kind_name(s.spec.kind), s.id_rows), s.spec, 2, s.Hq, 2, s.Sq, s.Sk, s.bm, s.bn);
    p->docs_shape = {s.id_rows, s.Sk};
    p->docs = testing::mask_documents(s.id_rows, s.Sk, 64, rng);
  }
  random_table(*add("block_sparse 8x16 per-head table", MaskSpec::block_sparse(8, 16), 2, 4, 2, 60, 70, 16, 16), 2, 4, 0.4, rng);
  random_table(*add("block_sparse 5x7 table [1, 1, ..]", MaskSpec::block_sparse(5, 7), 1, 2, 2, 45, 52, 32, 16), 1, 1, 0.85, rng);
  // dropout with an interval kind and a list kind
  Problem with_dropout = ps[2];
  with_dropout.dropout_p = 0.2;
  ps.push_back(with_dropout);
  for (const Problem& p : std::vector<Problem>(ps))
    if (p.spec.kind == MaskKind::causal_document) {
      ps.push_back(p);
      ps.back().dropout_p = 0.3;
    }
  for (const Problem& p : ps) km::check_mask(p.spec, p.data(), p.extent());
  return ps;
}

// The block-mask pre-pass at the problem's (backward kernels') tiles, in the interpreter.
testing::BlockMaskRun block_lists(const Problem& p, const testing::MaskArgs& mask, bool kv_major) {
  return testing::BlockMaskRun(p.spec, p.data(), mask, p.B, p.Sq, p.Sk, p.bm, p.bn, kv_major);
}

// The inputs (random, then NaN where `poison` says), the forward's O and LSE (from the float64
// reference), and the gradients of the exact masked attention.
struct Backward {
  HostTensor q, k, v, dout, o, lse;
  std::vector<uint8_t> mask;  // dense [B, Hq, S_q, S_k]
  std::vector<double> dq, dk, dv, delta;
};

size_t at4(int64_t b, int64_t h, int64_t s, int64_t d, int64_t H, int64_t S, int64_t D) {
  return static_cast<size_t>(((b * H + h) * S + s) * D + d);
}

// Tiles a mask leaves empty: the query tiles (per b, query head) whose rows all see no key, and the
// key tiles (per b, kv head) no row of the group sees.
struct EmptyTiles {
  std::vector<uint8_t> q_tile, k_tile;  // [B, Hq, nQB], [B, Hkv, nKB]: 1 = empty
};
EmptyTiles empty_tiles(const Problem& p, const std::vector<uint8_t>& mask) {
  EmptyTiles e{std::vector<uint8_t>(static_cast<size_t>(p.B * p.Hq * p.q_tiles()), 1),
               std::vector<uint8_t>(static_cast<size_t>(p.B * p.Hkv * p.k_tiles()), 1)};
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i)
        for (int64_t j = 0; j < p.Sk; ++j)
          if (mask[at4(b, h, i, j, p.Hq, p.Sq, p.Sk)]) {
            e.q_tile[static_cast<size_t>((b * p.Hq + h) * p.q_tiles() + i / p.bm)] = 0;
            e.k_tile[static_cast<size_t>((b * p.Hkv + h / p.group()) * p.k_tiles() + j / p.bn)] = 0;
          }
  return e;
}

// Random inputs; with `poison_empty`, NaN in the Q/dO rows of empty query tiles and the K/V rows of
// empty key tiles (a kernel that visited such a block would spread it). Then the float64 forward
// with the dense mask and dropout: O (stored as bf16, as a forward would) and LSE (-inf for a row
// with no allowed key); then the gradients given the stored O (Delta = rowsum(dO * O), as the
// kernels and FlashAttention compute it): dV = sum Pd^T dO, dP = dO V^T * keep * s, dS = P (dP - Delta).
Backward reference(const Problem& p, double scale, bool poison_empty) {
  const int64_t D = Problem::D;
  Backward r{HostTensor(bf16, {p.B, p.Hq, p.Sq, D}), HostTensor(bf16, {p.B, p.Hkv, p.Sk, D}), HostTensor(bf16, {p.B, p.Hkv, p.Sk, D}),
             HostTensor(bf16, {p.B, p.Hq, p.Sq, D}), HostTensor(bf16, {p.B, p.Hq, p.Sq, D}), HostTensor(f32, {p.B, p.Hq, p.Sq}),
             km::dense_mask(p.spec, p.data(), p.extent()), {}, {}, {}, {}};
  r.q.fill_normal(21, 0, 1), r.k.fill_normal(22, 0, 1), r.v.fill_normal(23, 0, 1), r.dout.fill_normal(24, 0, 1);
  if (poison_empty) {
    const EmptyTiles e = empty_tiles(p, r.mask);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t h = 0; h < p.Hq; ++h)
          for (int64_t i = 0; i < p.Sq; ++i)
            if (e.q_tile[static_cast<size_t>((b * p.Hq + h) * p.q_tiles() + i / p.bm)]) r.q.set({b, h, i, d}, NAN), r.dout.set({b, h, i, d}, NAN);
        for (int64_t h = 0; h < p.Hkv; ++h)
          for (int64_t j = 0; j < p.Sk; ++j)
            if (e.k_tile[static_cast<size_t>((b * p.Hkv + h) * p.k_tiles() + j / p.bn)]) r.k.set({b, h, j, d}, NAN), r.v.set({b, h, j, d}, NAN);
      }
  }
  testing::MaskedBackwardRef g =
      testing::masked_backward_ref({p.B, p.Hq, p.Hkv, p.Sq, p.Sk, D, false}, r.mask, r.q, r.k, r.v, r.dout, scale, p.rng(), r.o, r.lse);
  r.dq = std::move(g.dq), r.dk = std::move(g.dk), r.dv = std::move(g.dv), r.delta = std::move(g.delta);
  return r;
}

struct Gradients {
  HostTensor dq, dk, dv, delta;
};

// The dropout scalars the attention kernels take after their own parameters (none without dropout).
std::vector<rt::Arg> dropout_args(const Problem& p) {
  if (p.dropout_p == 0) return {};
  const km::DropoutRngHost rng = p.rng();
  return testing::attention_dropout_args(rng);
}

// Preprocess, pre-pass (when the kind needs it), dK/dV and dQ in the interpreter; `meta` adds to
// the kernels' metas (MASK is the problem's unless `meta` names it).
Gradients run_backward(const Problem& p, Backward& in, double scale, const Meta& meta = {}) {
  const int64_t D = Problem::D;
  Gradients g{HostTensor(bf16, in.q.sizes()), HostTensor(bf16, in.k.sizes()), HostTensor(bf16, in.v.sizes()), HostTensor(f32, {p.B, p.Hq, p.Sq})};
  for (HostTensor* t : {&g.dq, &g.dk, &g.dv, &g.delta}) t->poison();
  rt::interpret(km::attention_backward_preprocess().build({{"BLOCK_M", p.bm}, {"HEAD_DIM", D}}), {p.q_tiles(), p.Hq, p.B}, {in.o, in.dout, g.delta});
  Meta kmeta{{"BLOCK_M", p.bm}, {"BLOCK_N", p.bn}, {"HEAD_DIM", D}, {"DROPOUT", p.dropout_p > 0}};
  const bool names_mask = std::any_of(meta.begin(), meta.end(), [](const auto& m) { return m.first == "MASK"; });
  if (!names_mask) kmeta.emplace_back("MASK", static_cast<int>(p.spec.kind));
  kmeta.insert(kmeta.end(), meta.begin(), meta.end());
  std::vector<rt::Arg> tail = dropout_args(p);  // after the kernel's own parameters: dropout, mask, lists
  testing::MaskArgs mask(p.spec, p.data());
  tail.insert(tail.end(), mask.args.begin(), mask.args.end());
  const auto scale_f = static_cast<float>(scale);
  for (bool kv_major : {true, false}) {
    std::vector<rt::Arg> args{in.q, in.k, in.v, in.dout, in.lse, g.delta};
    if (kv_major) args.insert(args.end(), {g.dk, g.dv, scale_f});
    else args.insert(args.end(), {g.dq, scale_f});
    args.insert(args.end(), tail.begin(), tail.end());
    std::optional<testing::BlockMaskRun> lists;
    if (p.uses_lists()) lists.emplace(block_lists(p, mask, kv_major)), lists->append_to(args);
    if (kv_major) rt::interpret(km::attention_backward_dkdv().build(kmeta), {p.k_tiles(), p.Hkv, p.B}, args);
    else rt::interpret(km::attention_backward_dq().build(kmeta), {p.q_tiles(), p.Hq, p.B}, args);
  }
  return g;
}

// Rows of dQ whose query sees no key, and rows of dK / dV whose key no query of the group sees,
// that are not exactly zero.
size_t nonzero_unattended_rows(const Problem& p, const Backward& in, const Gradients& g) {
  size_t bad = 0;
  const int64_t D = Problem::D;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        const uint8_t* row = &in.mask[at4(b, h, i, 0, p.Hq, p.Sq, p.Sk)];
        if (std::find(row, row + p.Sk, 1) != row + p.Sk) continue;
        for (int64_t d = 0; d < D; ++d) bad += g.dq.get({b, h, i, d}) != 0.0;
      }
    for (int64_t kh = 0; kh < p.Hkv; ++kh)
      for (int64_t j = 0; j < p.Sk; ++j) {
        bool seen = false;
        for (int64_t h = kh * p.group(); h < (kh + 1) * p.group() && !seen; ++h)
          for (int64_t i = 0; i < p.Sq && !seen; ++i) seen = in.mask[at4(b, h, i, j, p.Hq, p.Sq, p.Sk)] != 0;
        if (seen) continue;
        for (int64_t d = 0; d < D; ++d) bad += (g.dk.get({b, kh, j, d}) != 0.0) + (g.dv.get({b, kh, j, d}) != 0.0);
      }
  }
  return bad;
}

struct Errors {
  double dq, dk, dv, delta;
  size_t nonzero_unattended, unattended_rows;
  int64_t full_blocks, partial_blocks;  // over every (b, h): the blocks that skip the mask and those that apply it
};

Errors check_problem(const Problem& p, bool poison_empty = false) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(Problem::D));
  Backward in = reference(p, scale, poison_empty);
  const Gradients g = run_backward(p, in, scale);
  Errors e{rt::rel_error(g.dq.to_f64(), in.dq), rt::rel_error(g.dk.to_f64(), in.dk), rt::rel_error(g.dv.to_f64(), in.dv), 0,
           nonzero_unattended_rows(p, in, g), 0, 0, 0};
  // Delta where a row sees a key (a poisoned empty row's Delta is NaN, and never read)
  std::vector<double> got = g.delta.to_f64();
  for (size_t r = 0; r < got.size(); ++r) {
    const uint8_t* row = &in.mask[r * static_cast<size_t>(p.Sk)];
    if (std::find(row, row + p.Sk, 1) == row + p.Sk) got[r] = 0, ++e.unattended_rows;
  }
  e.delta = rt::rel_error(got, in.delta);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (km::BlockClass c : km::classify_blocks_brute_force(p.spec, p.data(), p.extent(), b, h, p.bm, p.bn))
        e.full_blocks += c == km::BlockClass::full, e.partial_blocks += c == km::BlockClass::partial;
  MESSAGE(fmt::format("{}: rel. error dQ {:.2e} dK {:.2e} dV {:.2e} Delta {:.2e}; {} rows without a key, {} full and {} partial blocks",
                      p.describe(), e.dq, e.dk, e.dv, e.delta, e.unattended_rows, e.full_blocks, e.partial_blocks));
  return e;
}

std::vector<std::string> param_names(const ir::Function& fn) {
  std::vector<std::string> names;
  for (const auto& prm : fn.params) names.push_back(prm.name);
  return names;
}

}  // namespace

TEST_CASE("every library mask: dQ, dK, dV of the masked backward match float64 with the dense mask (GQA, dropout, ragged)") {
  // per kind: blocks that skip the element mask and blocks that apply it (every kind has both but full)
  std::vector<int64_t> full_blocks(km::kMaskKindCount, 0), partial_blocks(km::kMaskKindCount, 0);
  int with_dropout = 0, with_gqa = 0;
  size_t keyless_rows = 0;
  for (const Problem& p : problems()) {
    INFO(p.describe());
    const Errors e = check_problem(p);
    CHECK(e.dq < 1e-2);
    CHECK(e.dk < 1e-2);
    CHECK(e.dv < 1e-2);
    CHECK(e.delta < 1e-2);
    CHECK(e.nonzero_unattended == 0);
    full_blocks[static_cast<size_t>(p.spec.kind)] += e.full_blocks;
    partial_blocks[static_cast<size_t>(p.spec.kind)] += e.partial_blocks;
    with_dropout += p.dropout_p > 0;
    with_gqa += p.Hq > p.Hkv;
    keyless_rows += e.unattended_rows;
  }
  for (int kind = 0; kind < km::kMaskKindCount; ++kind) {
    INFO(km::mask_kind_name(static_cast<MaskKind>(kind)));
    CHECK(full_blocks[static_cast<size_t>(kind)] > 0);
    CHECK((partial_blocks[static_cast<size_t>(kind)] > 0) == (kind != static_cast<int>(MaskKind::full)));
  }
  CHECK(with_dropout == 2);
  CHECK(with_gqa >= 3);
  CHECK(keyless_rows > 0);
}

TEST_CASE("blocks a mask leaves empty are never visited: NaN in their Q, dO, K, V rows reaches no gradient") {
  std::mt19937 rng(99);
  std::vector<Problem> ps;
  for (auto [label, spec, Sq, Sk] : {std::tuple{"sliding_window S_q < S_k", MaskSpec::sliding_window(4), 32, 96},
                                     std::tuple{"sliding_window S_q > S_k", MaskSpec::sliding_window(4), 96, 32},
                                     std::tuple{"causal_document S_q > S_k", MaskSpec::causal_document(), 80, 48},
                                     std::tuple{"block_sparse", MaskSpec::block_sparse(16, 16), 64, 80}}) {
    Problem p;
    p.label = label, p.spec = spec, p.B = 1, p.Hq = 2, p.Hkv = 1, p.Sq = Sq, p.Sk = Sk;
    if (spec.kind == MaskKind::causal_document) p.docs_shape = {1, Sk}, p.docs = testing::mask_documents(1, Sk, 20, rng);
    if (spec.kind == MaskKind::block_sparse) {
      random_table(p, 1, 2, 0.5, rng);
      const int64_t nq = p.table_shape[2], nk = p.table_shape[3];
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t t = 0; t < nk; ++t) p.table[static_cast<size_t>((h * nq + 1) * nk + t)] = 0;  // query tile 1 sees no key
        for (int64_t t = 0; t < nq; ++t) p.table[static_cast<size_t>((h * nq + t) * nk + 2)] = 0;  // no query sees key tile 2
      }
    }
    ps.push_back(p);
  }
  for (const Problem& p : ps) {
    INFO(p.describe());
    const EmptyTiles empty = empty_tiles(p, km::dense_mask(p.spec, p.data(), p.extent()));
    CHECK(std::count(empty.q_tile.begin(), empty.q_tile.end(), 1) + std::count(empty.k_tile.begin(), empty.k_tile.end(), 1) > 0);
    const Errors e = check_problem(p, /*poison_empty=*/true);
    CHECK(e.dq < 1e-2);  // NaN anywhere would make these NaN
    CHECK(e.dk < 1e-2);
    CHECK(e.dv < 1e-2);
    CHECK(e.nonzero_unattended == 0);
  }
}

TEST_CASE("end to end: the masked forward kernel's O and LSE, then the backward at other tiles (each with its own pre-pass lists)") {
  const double scale = 1.0 / std::sqrt(static_cast<double>(Problem::D));
  int checked = 0;
  for (Problem p : problems()) {
    // one problem of each walk (intervals, two runs, lists, per-head lists, dropout) and causal
    if (!(p.label.starts_with("sliding_window 21/35") || p.label.starts_with("global_sliding_window G=5") || p.label.starts_with("causal,") ||
          p.label.starts_with("document") || p.label.starts_with("block_sparse 8x16")))
      continue;
    INFO(p.describe());
    Backward in = reference(p, scale, false);
    Problem fwd = p;  // the forward's tiles
    fwd.bm = 32, fwd.bn = 32;
    HostTensor o(bf16, in.o.sizes()), lse(f32, in.lse.sizes());
    o.poison(), lse.poison();
    std::vector<rt::Arg> args{in.q, in.k, in.v, o, lse, static_cast<float>(scale)};
    const std::vector<rt::Arg> drop = dropout_args(p);
    args.insert(args.end(), drop.begin(), drop.end());
    testing::MaskArgs mask(p.spec, p.data());
    args.insert(args.end(), mask.args.begin(), mask.args.end());
    std::optional<testing::BlockMaskRun> lists;
    if (p.uses_lists()) lists.emplace(block_lists(fwd, mask, /*kv_major=*/false)), lists->append_to(args);
    const Meta meta{{"BLOCK_M", fwd.bm}, {"BLOCK_N", fwd.bn}, {"HEAD_DIM", Problem::D}, {"DROPOUT", p.dropout_p > 0},
                    {"MASK", static_cast<int>(p.spec.kind)}};
    rt::interpret(km::attention_forward().build(meta), {fwd.q_tiles(), p.Hq, p.B}, args);
    CHECK(rt::rel_error(o.to_f64(), in.o.to_f64()) < 1e-2);
    size_t bad_lse = 0;
    for (int64_t i = 0; i < lse.numel(); ++i) {
      const double want = in.lse.get_flat(i), got = lse.get_flat(i);
      bad_lse += std::isinf(want) ? got != want : !(std::abs(got - want) < 1e-4 * std::max(1.0, std::abs(want)));
    }
    CHECK(bad_lse == 0);
    in.o = o, in.lse = lse;  // the backward runs on the forward kernel's outputs
    const Gradients g = run_backward(p, in, scale);
    CHECK(rt::rel_error(g.dq.to_f64(), in.dq) < 1e-2);
    CHECK(rt::rel_error(g.dk.to_f64(), in.dk) < 1e-2);
    CHECK(rt::rel_error(g.dv.to_f64(), in.dv) < 1e-2);
    CHECK(nonzero_unattended_rows(p, in, g) == 0);
    ++checked;
  }
  CHECK(checked == 6);
}

TEST_CASE("MASK=causal is CAUSAL=true bit for bit; MASK=full is the default") {
  const double scale = 0.125;
  Problem p;
  p.label = "causal", p.spec = MaskSpec::causal(), p.B = 1, p.Hq = 2, p.Hkv = 1, p.Sq = 50, p.Sk = 40, p.bm = 32, p.bn = 16;
  Backward in = reference(p, scale, false);
  const Gradients by_mask = run_backward(p, in, scale);
  Problem plain = p;
  plain.spec = MaskSpec::full();
  const Gradients by_causal = run_backward(plain, in, scale, {{"CAUSAL", true}});
  for (auto [a, b] : {std::pair{&by_mask.dq, &by_causal.dq}, std::pair{&by_mask.dk, &by_causal.dk}, std::pair{&by_mask.dv, &by_causal.dv}})
    CHECK(std::memcmp(a->data(), b->data(), a->bytes()) == 0);
  CHECK(rt::rel_error(by_mask.dq.to_f64(), in.dq) < 1e-2);
  // the same kernel text: MASK=causal adds nothing to CAUSAL=true's program but the meta itself
  for (const Kernel* k : {&km::attention_backward_dkdv(), &km::attention_backward_dq()}) {
    CHECK(param_names(k->build({{"MASK", static_cast<int>(MaskKind::causal)}})) == param_names(k->build({{"CAUSAL", true}})));
    CHECK(param_names(k->build({{"MASK", 0}})) == param_names(k->build()));
  }
}

TEST_CASE("parameter order: the kernel's, dropout's, dropout_bits, the mask's, then the pre-pass's lists") {
  const std::vector<std::string> dkdv_own{"Q", "K", "V", "dO", "LSE", "Delta", "dK", "dV", "softmax_scale"};
  const std::vector<std::string> dq_own{"Q", "K", "V", "dO", "LSE", "Delta", "dQ", "softmax_scale"};
  const std::vector<std::string> dropout{"seed_lo",   "seed_hi",           "offset_lo", "offset_hi", "keep_threshold",
                                             "rng_state", "rng_state_in_memory", "dropout_row_offset", "dropout_col_offset",
                                             "dropout_head_offset", "dropout_heads", "dropout_bits"};
  for (int kind = 0; kind < km::kMaskKindCount; ++kind)
    for (bool kv_major : {true, false}) {
      const MaskKind mk = static_cast<MaskKind>(kind);
      INFO(km::mask_kind_name(mk) << (kv_major ? " dK/dV" : " dQ"));
      const Kernel& k = kv_major ? km::attention_backward_dkdv() : km::attention_backward_dq();
      std::vector<std::string> want = kv_major ? dkdv_own : dq_own;
      want.insert(want.end(), dropout.begin(), dropout.end());
      for (const std::string& n : km::mask_parameter_names(mk)) want.push_back(n);
      if (!km::mask_has_tile_intervals(mk))
        for (const char* n : kv_major ? std::vector<const char*>{"q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"}
                                      : std::vector<const char*>{"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"})
          want.push_back(n);
      CHECK(param_names(k.build({{"MASK", kind}, {"DROPOUT", true}, {"DROPOUT_BITS", true}})) == want);
    }
}

TEST_CASE("build errors: library masks with CAUSAL or VARLEN, an unknown MASK") {
  for (const Kernel* k : {&km::attention_backward_dkdv(), &km::attention_backward_dq()}) {
    CHECK_THROWS_WITH_AS(k->build({{"MASK", static_cast<int>(MaskKind::document)}, {"CAUSAL", true}}),
                         doctest::Contains("MASK=5 (document) does not combine with CAUSAL=true yet"), BuildError);
    CHECK_THROWS_WITH_AS(k->build({{"MASK", static_cast<int>(MaskKind::sliding_window)}, {"VARLEN", true}}),
                         doctest::Contains("MASK=2 (sliding_window) does not combine with VARLEN=true yet"), BuildError);
    CHECK_THROWS_WITH_AS(k->build({{"MASK", 11}}), doctest::Contains("meta-parameter MASK = 11 is not a mask kind; valid: 0 full"), BuildError);
    // causal is CAUSAL: it combines with both
    CHECK_NOTHROW(k->build({{"MASK", static_cast<int>(MaskKind::causal)}, {"CAUSAL", true}, {"VARLEN", true}}));
  }
}

// The registry's default schedules (api/registry.cpp) with an interval mask, a two-run one and a
// list one, through both backends, without spills.
TEST_CASE("masked dK/dV and dQ assemble for sm_90a at the default schedules without spills") {
  if (testing::no_ptxas()) return;
  for (const std::string name : {"attention_bwd_dkdv", "attention_bwd_dq"})
    for (MaskKind kind : {MaskKind::sliding_window, MaskKind::global_sliding_window, MaskKind::causal_document}) {
      const tilejit::library::LibraryKernel* lk = tilejit::library::find(name);
      REQUIRE(lk != nullptr);
      Meta meta = lk->default_meta;
      meta.emplace_back("MASK", static_cast<int>(kind));
      const ir::Function fn = lk->kernel().build(meta);
      for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
        INFO(name << " MASK=" << km::mask_kind_name(kind) << " via " << jit::to_string(backend));
        const jit::CompiledKernel k = testing::assemble_sm90a(fn, backend, lk->num_warps);
        CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
        CHECK_MESSAGE(k.info.spill_load_bytes == 0, k.info.to_string());
        MESSAGE(fmt::format("{} MASK={} via {}: {}", name, km::mask_kind_name(kind), jit::to_string(backend), k.info.to_string()));
      }
    }
}
