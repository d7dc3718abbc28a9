// dQ's reduction as a schedule option of the attention backward (issue 8 part 2; DQ_REDUCTION on
// attention_bwd_dkdv, kernels/attention/backward.hpp): recompute (the dQ kernel), atomic (dQ_accum +
// attention_bwd_dq_convert) and split (dQ_parts + attention_bwd_dq_reduce), in the interpreter
// against float64 over GQA, both layouts, causal both ways (rows that see no key), ragged shapes,
// interval and list masks, dropout fused and precomputed. dK, dV do not depend on the reduction (bit
// for bit); atomic dQ is within rounding of recompute's; split writes exactly the parts of non-empty
// blocks (backward_schedule.hpp's layout and, for causal, its needs()) and gives the same bits
// whatever the workspace held before. Parameter order, build errors, and the new kernels assembled
// for sm_90a at the default schedules (registers, spills, whether the dQ dot runs on wgmma; skips
// visibly without ptxas).
//
// Program order: the interpreter runs a grid's programs in one fixed order (z, y, x) and cannot
// shuffle them. Split's independence of the order is structural and checked as such: the dK/dV
// kernel never reads dQ_parts (checked on its IR), every slot the reducer reads is written by
// exactly one program's block (the written set is checked against the non-empty blocks with a
// NaN-poisoned workspace), and the reducer's order is fixed (increasing key tile).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dropout_key_args.hpp"
#include "ptxas_testing.hpp"
#include "attention_mask_testing.hpp"
#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/attention/mask_host.hpp"
#include "kernels/attention/backward_schedule.hpp"
#include "kernels/attention/backward_schedule_lang.hpp"
#include "kernels/philox_host.hpp"
#include "api/registry.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace km = tilejit::kernels;
namespace rt = tilejit::runtime;
using km::DqReduction, km::MaskKind, km::MaskSpec, rt::HostTensor;

namespace {

constexpr int64_t D = 64;

struct Problem : testing::MaskedProblemCore {
  bool causal_meta = false;  // CAUSAL=true (spec stays full) instead of MASK=causal
  bool bshd = false;
  double dropout_p = 0;
  bool dropout_bits = false;  // rng = precomputed (DROPOUT_BITS), BLOCK_N a multiple of 32

  // the mask the reference applies (CAUSAL=true is the causal mask)
  MaskSpec effective() const { return causal_meta ? MaskSpec::causal() : spec; }
  bool library() const { return spec.kind != MaskKind::full && spec.kind != MaskKind::causal; }
  bool uses_lists() const { return library() && !km::mask_has_tile_intervals(spec.kind); }
  km::DropoutRngHost rng() const { return {0x0123456789abcdefULL, 0x0000000500000003ULL, km::dropout_keep_threshold(dropout_p)}; }
  std::string describe() const {
    return fmt::format("{}: B={} Hq={} Hkv={} Sq={} Sk={} tiles {}x{}{}{}", label, B, Hq, Hkv, Sq, Sk, bm, bn, bshd ? " BSHD" : "",
                       dropout_p > 0 ? fmt::format(" dropout {}{}", dropout_p, dropout_bits ? " (bits)" : "") : "");
  }
  ir::Shape q_shape() const { return bshd ? ir::Shape{B, Sq, Hq, D} : ir::Shape{B, Hq, Sq, D}; }
  ir::Shape kv_shape() const { return bshd ? ir::Shape{B, Sk, Hkv, D} : ir::Shape{B, Hkv, Sk, D}; }
  testing::MaskedAttentionDims dims() const { return {B, Hq, Hkv, Sq, Sk, D, bshd}; }
};

std::vector<Problem> problems() {
  std::mt19937 rng(81);
  std::vector<Problem> ps;
  auto add = [&](auto&&... a) { return testing::add_problem(ps, std::forward<decltype(a)>(a)...); };
  add("full, GQA, BSHD", MaskSpec::full(), 2, 4, 2, 45, 70, 16, 32)->bshd = true;
  add("CAUSAL=true, S_q > S_k (rows without keys)", MaskSpec::full(), 1, 2, 1, 70, 45, 32, 16)->causal_meta = true;
  Problem* c = add("MASK=causal, S_q < S_k, GQA, dropout", MaskSpec::causal(), 1, 4, 2, 50, 77, 16, 16);
  c->dropout_p = 0.2;
  Problem* bits = add("CAUSAL=true, dropout from packed bits", MaskSpec::full(), 1, 2, 1, 60, 75, 16, 32);
  bits->causal_meta = true, bits->dropout_p = 0.25, bits->dropout_bits = true;
  add("sliding_window 21/35", MaskSpec::sliding_window(21, 35), 2, 2, 2, 70, 90, 16, 16);
  add("global_sliding_window G=5 20/24 (two runs), GQA", MaskSpec::global_sliding_window(5, 20, 24), 1, 4, 2, 90, 90, 16, 16);
  Problem* doc = add("causal_document (lists), GQA, dropout", MaskSpec::causal_document(), 2, 4, 2, 80, 80, 16, 16);
  doc->docs_shape = {2, 80}, doc->docs = testing::mask_documents(2, 80, 40, rng), doc->dropout_p = 0.3;
  Problem* bs = add("block_sparse per-head table (lists)", MaskSpec::block_sparse(8, 16), 2, 4, 2, 60, 70, 16, 16);
  bs->table_shape = {2, 4, (60 + 7) / 8, (70 + 15) / 16};
  bs->table.resize(static_cast<size_t>(2 * 4 * bs->table_shape[2] * bs->table_shape[3]));
  for (uint8_t& x : bs->table) x = static_cast<uint8_t>(rng() % 10 < 4);
  add("causal, default tiles 64x128", MaskSpec::causal(), 1, 2, 1, 200, 260, 64, 128);
  for (const Problem& p : ps) km::check_mask(p.effective(), p.data(), p.extent());
  return ps;
}

// The exact masked (dropout) attention of bf16 inputs in float64: O stored as bf16 and LSE (the
// forward's outputs), and the gradients given the stored O (Delta = rowsum(dO * O), as the kernels).
struct Reference {
  HostTensor q, k, v, dout, o, lse;
  std::vector<uint8_t> mask;  // dense [B, Hq, S_q, S_k]
  std::vector<double> dq, dk, dv;
};

Reference reference(const Problem& p, double scale) {
  Reference r{HostTensor(bf16, p.q_shape()), HostTensor(bf16, p.kv_shape()), HostTensor(bf16, p.kv_shape()), HostTensor(bf16, p.q_shape()),
              HostTensor(bf16, p.q_shape()), HostTensor(f32, {p.B, p.Hq, p.Sq}), km::dense_mask(p.effective(), p.data(), p.extent()), {}, {}, {}};
  r.q.fill_normal(31, 0, 1), r.k.fill_normal(32, 0, 1), r.v.fill_normal(33, 0, 1), r.dout.fill_normal(34, 0, 1);
  testing::MaskedBackwardRef g =
      testing::masked_backward_ref(p.dims(), r.mask, r.q, r.k, r.v, r.dout, scale, p.rng(), r.o, r.lse);
  r.dq = std::move(g.dq), r.dk = std::move(g.dk), r.dv = std::move(g.dv);
  return r;
}

// What the kernels read after their own parameters: the dropout scalars and packed bits, then the
// mask's parameters.
struct Tail {
  HostTensor bits;
  std::vector<rt::Arg> dropout;
  testing::MaskArgs mask;
  explicit Tail(const Problem& p) : mask(p.spec, p.data()) {
    if (p.dropout_p == 0) return;
    const km::DropoutRngHost rng = p.rng();
    dropout = testing::attention_dropout_args(rng);
    if (p.dropout_bits) {
      const std::vector<uint32_t> packed = km::dropout_mask_packed_host(rng, p.B * p.Hq, p.Sq, p.Sk);
      bits = HostTensor(u32, {p.B * p.Hq, p.Sq, (p.Sk + 31) / 32});
      for (int64_t e = 0; e < bits.numel(); ++e) bits.set_flat(e, packed[static_cast<size_t>(e)]);
      dropout.emplace_back(bits);
    }
  }
};

// The block-mask pre-pass at the problem's tiles.
testing::BlockMaskRun block_lists(const Problem& p, const Tail& tail, bool kv_major) {
  return testing::BlockMaskRun(p.spec, p.data(), tail.mask, p.B, p.Sq, p.Sk, p.bm, p.bn, kv_major);
}

struct Gradients {
  HostTensor dq, dk, dv;
};

struct Run {
  Gradients g;
  HostTensor workspace;  // dQ_accum or dQ_parts as the dK/dV kernel left it
};

Meta kernel_meta(const Problem& p) {
  Meta m{{"BLOCK_M", p.bm}, {"BLOCK_N", p.bn}, {"HEAD_DIM", D}, {"BSHD", p.bshd}, {"DROPOUT", p.dropout_p > 0}, {"DROPOUT_BITS", p.dropout_bits}};
  if (p.causal_meta) m.emplace_back("CAUSAL", true);
  else m.emplace_back("MASK", static_cast<int>(p.spec.kind));
  return m;
}

// The whole backward after the forward: preprocess, the pre-pass (list kinds), dK/dV with the
// reduction, then the dQ kernel (recompute), the convert (atomic) or the reduce (split).
// `workspace_fill`: what the split workspace holds before (NaN: poison; else that value everywhere).
// `persistent_programs` > 0: ordered with PERSISTENT on that many programs (DASH's shift schedule).
Run run_backward(const Problem& p, Reference& in, double scale, DqReduction reduction, double workspace_fill = NAN,
                 bool q_descending = false, int persistent_programs = 0) {
  Run r{{HostTensor(bf16, p.q_shape()), HostTensor(bf16, p.kv_shape()), HostTensor(bf16, p.kv_shape())}, {}};
  for (HostTensor* t : {&r.g.dq, &r.g.dk, &r.g.dv}) t->poison();
  HostTensor delta(f32, {p.B, p.Hq, p.Sq});
  delta.poison();
  rt::interpret(km::attention_backward_preprocess().build({{"BLOCK_M", p.bm}, {"HEAD_DIM", D}, {"BSHD", p.bshd}}), {p.q_tiles(), p.Hq, p.B},
                {in.o, in.dout, delta});
  Tail tail(p);
  std::optional<testing::BlockMaskRun> kv_lists;  // KV_MAJOR (dK/dV's lists; its classes are the reducer's)
  if (p.uses_lists()) kv_lists.emplace(block_lists(p, tail, true));
  const auto scale_f = static_cast<float>(scale);
  Meta meta = kernel_meta(p);
  meta.emplace_back("DQ_REDUCTION", static_cast<int>(reduction));
  if (q_descending) meta.emplace_back("Q_DESCENDING", true);
  if (persistent_programs) meta.emplace_back("PERSISTENT", true);
  std::vector<rt::Arg> args{in.q, in.k, in.v, in.dout, in.lse, delta, r.g.dk, r.g.dv};
  HostTensor semaphores(i32, {p.B * p.Hq, p.q_tiles()});
  if (reduction == DqReduction::atomic) {
    r.workspace = HostTensor(f32, {p.B, p.Hq, p.Sq, D});
    r.workspace.fill(0.0);  // the caller zeroes dQ_accum
    args.emplace_back(r.workspace);
  } else if (reduction == DqReduction::ordered) {
    r.workspace = HostTensor(f32, {p.B, p.Hq, p.Sq, D});
    r.workspace.fill(0.0);  // the caller zeroes dQ_accum (every key block adds)
    semaphores.fill(0.0);  // the semaphores do
    args.emplace_back(r.workspace);
    args.emplace_back(semaphores);
  } else if (reduction == DqReduction::split) {
    r.workspace = HostTensor(f32, {p.B * p.Hq, p.q_tiles(), p.k_tiles(), p.bm, D});
    if (std::isnan(workspace_fill)) r.workspace.poison();
    else r.workspace.fill(workspace_fill);
    args.emplace_back(r.workspace);
  }
  args.emplace_back(scale_f);
  args.insert(args.end(), tail.dropout.begin(), tail.dropout.end());
  args.insert(args.end(), tail.mask.args.begin(), tail.mask.args.end());
  if (kv_lists) kv_lists->append_to(args);
  if (persistent_programs) rt::interpret(km::attention_backward_dkdv().build(meta), {persistent_programs, 1, 1}, args);
  else rt::interpret(km::attention_backward_dkdv().build(meta), {p.k_tiles(), p.Hkv, p.B}, args);

  Meta out_meta{{"BLOCK_M", p.bm}, {"HEAD_DIM", D}, {"BSHD", p.bshd}};
  if (reduction == DqReduction::recompute) {
    std::vector<rt::Arg> q_args{in.q, in.k, in.v, in.dout, in.lse, delta, r.g.dq, scale_f};
    q_args.insert(q_args.end(), tail.dropout.begin(), tail.dropout.end());
    q_args.insert(q_args.end(), tail.mask.args.begin(), tail.mask.args.end());
    std::optional<testing::BlockMaskRun> q_lists;
    if (p.uses_lists()) q_lists.emplace(block_lists(p, tail, false)), q_lists->append_to(q_args);
    rt::interpret(km::attention_backward_dq().build(kernel_meta(p)), {p.q_tiles(), p.Hq, p.B}, q_args);
  } else if (reduction == DqReduction::atomic || reduction == DqReduction::ordered) {
    HostTensor accum = r.workspace;  // the convert must not write the workspace (it reads it)
    rt::interpret(km::attention_backward_dq_convert().build(out_meta), {p.q_tiles(), p.Hq, p.B}, {r.workspace, r.g.dq, scale_f});
    CHECK(std::memcmp(accum.data(), r.workspace.data(), accum.bytes()) == 0);
  } else {
    out_meta.insert(out_meta.end(), {{"BLOCK_N", p.bn}});
    if (p.causal_meta) out_meta.emplace_back("CAUSAL", true);
    else out_meta.emplace_back("MASK", static_cast<int>(p.spec.kind));
    std::vector<rt::Arg> red_args{r.workspace, r.g.dq, scale_f, static_cast<int32_t>(p.Sk)};
    red_args.insert(red_args.end(), tail.mask.args.begin(), tail.mask.args.end());
    if (kv_lists) red_args.emplace_back(kv_lists->classes);
    rt::interpret(km::attention_backward_dq_reduce().build(out_meta), {p.q_tiles(), p.Hq, p.B}, red_args);
  }
  return r;
}

bool same_bits(const HostTensor& a, const HostTensor& b) { return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0; }

// dQ rows whose query sees no key that are not exactly zero.
size_t nonzero_keyless_rows(const Problem& p, const Reference& in, const HostTensor& dq) {
  size_t bad = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        const uint8_t* row = &in.mask[static_cast<size_t>(((b * p.Hq + h) * p.Sq + i) * p.Sk)];
        if (std::find(row, row + p.Sk, 1) != row + p.Sk) continue;
        for (int64_t d = 0; d < D; ++d) bad += dq.get_flat(static_cast<int64_t>(p.dims().q_at(b, h, i, d))) != 0.0;
      }
  return bad;
}

// Whether block (query tile m, key tile n) of (b, h) has an allowed element.
bool block_nonempty(const Problem& p, const Reference& in, int64_t b, int64_t h, int64_t m, int64_t n) {
  for (int64_t i = m * p.bm; i < std::min(p.Sq, (m + 1) * p.bm); ++i)
    for (int64_t j = n * p.bn; j < std::min(p.Sk, (n + 1) * p.bn); ++j)
      if (in.mask[static_cast<size_t>(((b * p.Hq + h) * p.Sq + i) * p.Sk + j)]) return true;
  return false;
}

}  // namespace

TEST_CASE("atomic and split dQ: dQ, dK, dV match float64 (GQA, layouts, causal, masks, dropout); dK, dV as recompute's bit for bit") {
  int with_dropout = 0, with_gqa = 0, with_lists = 0;
  size_t keyless = 0;
  for (const Problem& p : problems()) {
    INFO(p.describe());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Reference in = reference(p, scale);
    const Run base = run_backward(p, in, scale, DqReduction::recompute);
    const Run atomic = run_backward(p, in, scale, DqReduction::atomic);
    const Run split = run_backward(p, in, scale, DqReduction::split);
    std::vector<double> errors;
    for (const Run* r : {&base, &atomic, &split}) {
      for (auto [got, want] : {std::pair{&r->g.dq, &in.dq}, std::pair{&r->g.dk, &in.dk}, std::pair{&r->g.dv, &in.dv}}) {
        errors.push_back(rt::rel_error(got->to_f64(), *want));
        CHECK(errors.back() < 1e-2);
      }
      CHECK(nonzero_keyless_rows(p, in, r->g.dq) == 0);
    }
    for (const Run* r : {&atomic, &split}) {
      CHECK(same_bits(r->g.dk, base.g.dk));
      CHECK(same_bits(r->g.dv, base.g.dv));
    }
    // PERSISTENT atomic (full and causal): key tiles in launch order on fewer programs, each walked
    // as without it (dK, dV the same bits; dQ's adds in another order)
    if (!p.library())
      for (int programs : {1, 3}) {
        INFO("atomic PERSISTENT on ", programs, " programs");
        const Run persistent = run_backward(p, in, scale, DqReduction::atomic, NAN, false, programs);
        CHECK(same_bits(persistent.g.dk, base.g.dk));
        CHECK(same_bits(persistent.g.dv, base.g.dv));
        CHECK(rt::rel_error(persistent.g.dq.to_f64(), in.dq) < 1e-2);
        CHECK(rt::rel_error(persistent.g.dq.to_f64(), base.g.dq.to_f64()) < 5e-3);
        CHECK(nonzero_keyless_rows(p, in, persistent.g.dq) == 0);
      }
    const double atomic_vs_recompute = rt::rel_error(atomic.g.dq.to_f64(), base.g.dq.to_f64());
    const double split_vs_recompute = rt::rel_error(split.g.dq.to_f64(), base.g.dq.to_f64());
    CHECK(atomic_vs_recompute < 5e-3);
    CHECK(split_vs_recompute < 5e-3);
    MESSAGE(fmt::format("{}: rel. error vs float64 dQ/dK/dV recompute {:.2e}/{:.2e}/{:.2e} atomic {:.2e} split {:.2e}; dQ vs recompute "
                        "atomic {:.2e} split {:.2e}",
                        p.describe(), errors[0], errors[1], errors[2], errors[3], errors[6], atomic_vs_recompute, split_vs_recompute));
    with_dropout += p.dropout_p > 0, with_gqa += p.Hq > p.Hkv, with_lists += p.uses_lists();
    for (int64_t r = 0; r < p.B * p.Hq * p.Sq; ++r) {
      const uint8_t* row = &in.mask[static_cast<size_t>(r * p.Sk)];
      keyless += std::find(row, row + p.Sk, 1) == row + p.Sk;
    }
  }
  CHECK(with_dropout >= 3);
  CHECK(with_gqa >= 3);
  CHECK(with_lists == 2);
  CHECK(keyless > 0);
}

TEST_CASE("split: exactly the non-empty blocks' parts are written (backward_schedule.hpp's slots), and dQ is the same bits whatever the workspace held") {
  for (const Problem& p : problems()) {
    INFO(p.describe());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Reference in = reference(p, scale);
    const Run poisoned = run_backward(p, in, scale, DqReduction::split);
    const Run filled = run_backward(p, in, scale, DqReduction::split, 1e30);
    CHECK(same_bits(poisoned.g.dq, filled.g.dq));
    // which slots the dK/dV kernel wrote (a NaN-poisoned slot it skipped stays NaN)
    km::BwdProblem sched{.heads = static_cast<int>(p.B * p.Hq), .seq_q = static_cast<int>(p.Sq), .seq_k = static_cast<int>(p.Sk),
                         .block_m = static_cast<int>(p.bm), .block_n = static_cast<int>(p.bn),
                         .mask = p.effective().kind == MaskKind::causal ? km::BwdMask::causal : km::BwdMask::full};
    REQUIRE(sched.query_tiles() == p.q_tiles());
    REQUIRE(sched.key_tiles() == p.k_tiles());
    size_t wrong = 0, written = 0, half_written = 0;
    const auto* ws = static_cast<const float*>(poisoned.workspace.data());
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t m = 0; m < p.q_tiles(); ++m)
          for (int64_t n = 0; n < p.k_tiles(); ++n) {
            const int bh = static_cast<int>(b * p.Hq + h);
            const long long slot = km::split_workspace_slot(sched, bh, static_cast<int>(m), static_cast<int>(n));
            size_t nans = 0;
            for (int64_t e = 0; e < p.bm * D; ++e) nans += std::isnan(ws[slot * p.bm * D + e]);
            const bool was_written = nans == 0;
            half_written += nans != 0 && nans != static_cast<size_t>(p.bm * D);
            written += was_written;
            const bool want = block_nonempty(p, in, b, h, m, n);
            wrong += was_written != want;
            if (!p.library()) wrong += want != sched.needs(static_cast<int>(n), static_cast<int>(m));  // the model's geometry
          }
    MESSAGE(fmt::format("{}: {} of {} parts written", p.describe(), written, p.B * p.Hq * p.q_tiles() * p.k_tiles()));
    CHECK(wrong == 0);
    CHECK(half_written == 0);
  }
}

TEST_CASE("split: the dK/dV kernel never reads its workspace (no load of dQ_parts); DQ_REDUCTION=0 builds today's kernel") {
  for (int red : {1, 2}) {
    const ir::Function fn = km::attention_backward_dkdv().build({{"DQ_REDUCTION", red}, {"CAUSAL", true}});
    const std::string ws = red == 1 ? "dQ_accum" : "dQ_parts";
    const ir::Param* prm = fn.find_param(ws);
    REQUIRE(prm != nullptr);
    // the workspace's descriptor feeds only its pointer/stride/size queries and the block stores
    size_t loads = 0;
    ir::walk(fn.body, [&](const ir::Op& op) {
      if (op.kind == ir::OpKind::block_load && !op.operands.empty() && op.operands[0] == prm->value) ++loads;
    });
    CHECK(loads == 0);
  }
  // DQ_REDUCTION=0: the same parameters and the same ops as the kernel built without the meta
  for (bool causal : {false, true}) {
    const ir::Function a = km::attention_backward_dkdv().build({{"CAUSAL", causal}});
    const ir::Function b = km::attention_backward_dkdv().build({{"CAUSAL", causal}, {"DQ_REDUCTION", 0}});
    std::string ta = ir::print(a), tb = ir::print(b);
    CHECK(ta == tb);
  }
}

TEST_CASE("parameter order of the dK/dV kernel with DQ_REDUCTION and of the convert / reduce kernels") {
  auto names = [](const ir::Function& fn) {
    std::vector<std::string> v;
    for (const auto& prm : fn.params) v.push_back(prm.name);
    return v;
  };
  const std::vector<std::string> head{"Q", "K", "V", "dO", "LSE", "Delta", "dK", "dV"};
  const std::vector<std::string> tail{"softmax_scale",  "seed_lo",   "seed_hi",
                                         "offset_lo",      "offset_hi", "keep_threshold",
                                         "rng_state",      "rng_state_in_memory", "dropout_row_offset",
                                         "dropout_col_offset", "dropout_head_offset", "dropout_heads", "dropout_bits"};
  for (auto [red, ws] : {std::pair{1, "dQ_accum"}, std::pair{2, "dQ_parts"}}) {
    std::vector<std::string> want = head;
    want.push_back(ws);
    want.insert(want.end(), tail.begin(), tail.end());
    for (const std::string& n : km::mask_parameter_names(MaskKind::document)) want.push_back(n);
    for (const char* n : {"q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"}) want.push_back(n);
    CHECK(names(km::attention_backward_dkdv().build({{"DQ_REDUCTION", red},
                                                     {"DROPOUT", true},
                                                     {"DROPOUT_BITS", true},
                                                     {"MASK", static_cast<int>(MaskKind::document)}})) == want);
  }
  CHECK(names(km::attention_backward_dq_convert().build()) == std::vector<std::string>{"dQ_accum", "dQ", "softmax_scale"});
  CHECK(names(km::attention_backward_dq_reduce().build()) == std::vector<std::string>{"dQ_parts", "dQ", "softmax_scale", "S_k"});
  std::vector<std::string> want{"dQ_parts", "dQ", "softmax_scale", "S_k"};
  for (const std::string& n : km::mask_parameter_names(MaskKind::block_sparse)) want.push_back(n);
  want.push_back("block_classes");
  CHECK(names(km::attention_backward_dq_reduce().build({{"MASK", static_cast<int>(MaskKind::block_sparse)}})) == want);
  want = {"dQ_parts", "dQ", "softmax_scale", "S_k"};
  for (const std::string& n : km::mask_parameter_names(MaskKind::sliding_window)) want.push_back(n);
  CHECK(names(km::attention_backward_dq_reduce().build({{"MASK", static_cast<int>(MaskKind::sliding_window)}})) == want);
}

TEST_CASE("build errors: DQ_REDUCTION out of range, with VARLEN; the reducer's mask rules") {
  const Kernel& dkdv = km::attention_backward_dkdv();
  CHECK_THROWS_WITH_AS(dkdv.build({{"DQ_REDUCTION", 4}}), doctest::Contains("DQ_REDUCTION = 4 is not a dQ reduction; valid: 0 recompute"),
                       BuildError);
  CHECK_THROWS_WITH_AS(dkdv.build({{"DQ_REDUCTION", 2}, {"VARLEN", true}}),
                       doctest::Contains("DQ_REDUCTION=2 (split) does not combine with VARLEN=true yet"), BuildError);
  CHECK_THROWS_WITH_AS(dkdv.build({{"DQ_REDUCTION", 1}, {"VARLEN", true}}),
                       doctest::Contains("DQ_REDUCTION=1 (atomic) does not combine with VARLEN=true yet"), BuildError);
  CHECK_NOTHROW(dkdv.build({{"DQ_REDUCTION", 0}, {"VARLEN", true}}));
  CHECK_THROWS_WITH_AS(km::attention_backward_dq_reduce().build({{"MASK", static_cast<int>(MaskKind::document)}, {"CAUSAL", true}}),
                       doctest::Contains("does not combine with CAUSAL=true"), BuildError);
}

// The new kernels through both backends for sm_90a. Checked without spills: the dK/dV kernel with
// DQ_REDUCTION at the reduction schedule kernels/attention/backward.hpp recommends (64 x 64, 4 warps,
// head dim 64; every dot on wgmma, the dQ dot included: more wgmma instructions than DQ_REDUCTION=0
// at the same schedule, no mma.sync), full and causal, and the convert / reduce kernels at the
// registry's defaults. Reported only (MESSAGE): the registry's dK/dV default 64 x 128 on 8 warps
// (the dQ dot's M = 64 is half a warpgroup pair: mma.sync) and head dim 128.
TEST_CASE("atomic / split kernels assemble for sm_90a without spills (the reduction schedule, the convert / reduce defaults)") {
  if (testing::no_ptxas()) return;
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  struct Build {
    std::string name;
    Meta meta;
    int warps = 0;     // 0: the registry's
    bool checked = true;  // spills are a failure (else reported)
    bool nvrtc_checked = true;  // also through nvrtc (else reported there)
  };
  std::vector<Build> builds;
  const Meta reduction_schedule{{"BLOCK_M", 64}, {"BLOCK_N", 64}};
  for (int red : {0, 1, 2})
    for (bool causal : {false, true}) {
      Meta m = reduction_schedule;
      m.insert(m.end(), {{"DQ_REDUCTION", red}, {"CAUSAL", causal}});
      builds.push_back({"attention_bwd_dkdv", m, 4});
    }
  for (int red : {1, 2}) {
    Meta d128 = reduction_schedule;
    d128.insert(d128.end(), {{"DQ_REDUCTION", red}, {"HEAD_DIM", 128}});
    builds.push_back({"attention_bwd_dkdv", d128, 4, false});
    builds.push_back({"attention_bwd_dkdv", {{"DQ_REDUCTION", red}}, 0, false});  // the registry's 64 x 128, 8 warps
  }
  // the API's D 128 schedule for the reductions (64 x 128, 8 warps: the dQ dot's warpgroups split D)
  // and ordered's persistent DASH schedule at both head dims (reported: D 128 spills ~250-300 B)
  for (int red : {1, 3}) {
    Meta m{{"DQ_REDUCTION", red}, {"HEAD_DIM", 128}};
    if (red == 3) m.emplace_back("PERSISTENT", true);
    builds.push_back({"attention_bwd_dkdv", m, 8, false});
  }
  builds.push_back({"attention_bwd_dkdv", {{"BLOCK_N", 64}, {"DQ_REDUCTION", 3}, {"PERSISTENT", true}}, 4, false});
  // the API's atomic D 128 full kernel (the producer, the LSE ring, the dQ writer): without spills
  // through LLVM (the library's backend) since its dots' descriptors are built at use
  // (DESCRIPTORS_AT_USE, decision 077; 128 B before); nvrtc's build spills 16 B (reported)
  builds.push_back({"attention_bwd_dkdv",
                    {{"BLOCK_M", 64}, {"BLOCK_N", 128}, {"DQ_REDUCTION", 1}, {"HEAD_DIM", 128}, {"BSHD", true}, {"LSE_IN_RING", true},
                     {"RING_PRODUCER", true}, {"DQ_WRITER", true}},
                    8, true, false});
  builds.push_back({"attention_bwd_dq_convert", {}});
  builds.push_back({"attention_bwd_dq_convert", {{"HEAD_DIM", 128}, {"BSHD", true}}});
  for (bool causal : {false, true}) builds.push_back({"attention_bwd_dq_reduce", {{"CAUSAL", causal}}});
  builds.push_back({"attention_bwd_dq_reduce", {{"MASK", static_cast<int>(MaskKind::sliding_window)}}});
  builds.push_back({"attention_bwd_dq_reduce", {{"MASK", static_cast<int>(MaskKind::causal_document)}, {"HEAD_DIM", 128}}});
  std::map<std::string, size_t> wgmma;  // by backend and causal, at the reduction schedule
  for (const Build& bd : builds) {
    const tilejit::library::LibraryKernel* lk = tilejit::library::find(bd.name);
    REQUIRE(lk != nullptr);
    Meta meta = lk->default_meta;  // then bd.meta's values, replacing the defaults' of the same name
    for (const auto& [name, value] : bd.meta) {
      auto same = std::find_if(meta.begin(), meta.end(), [&](const auto& m) { return m.first == name; });
      if (same != meta.end()) same->second = value;
      else meta.emplace_back(name, value);
    }
    const ir::Function fn = lk->kernel().build(meta);
    const int warps = bd.warps ? bd.warps : lk->num_warps;
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      std::string label = fmt::format("{} {} warps", bd.name, warps);
      for (const auto& [k, v] : bd.meta) label += fmt::format(" {}={}", k, ir::to_string(v));
      INFO(label << " via " << jit::to_string(backend));
      const jit::CompiledKernel k = testing::assemble_sm90a(fn, backend, warps, lk->stages);
      if (bd.checked && (backend == jit::Backend::Llvm || bd.nvrtc_checked)) {
        CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
        CHECK_MESSAGE(k.info.spill_load_bytes == 0, k.info.to_string());
      }
      const size_t mma_async = count(k.ptx, "wgmma.mma_async"), mma_sync = count(k.ptx, "mma.sync");
      MESSAGE(fmt::format("{} via {}: {}; shared {} B; PTX: {} wgmma.mma_async, {} mma.sync, {} atom.global, {} bar.sync{}", label,
                          jit::to_string(backend), k.info.to_string(), k.smem_bytes, mma_async, mma_sync, count(k.ptx, "atom.global"),
                          count(k.ptx, "bar.sync"), bd.checked ? "" : " (reported, not checked)"));
      if (bd.name == "attention_bwd_dkdv" && bd.warps == 8) {  // every dot on wgmma, dQ added by TMA
        CHECK(mma_sync == 0);
        CHECK(count(k.ptx, "cp.reduce.async.bulk.tensor") > 0);
      }
      if (bd.name == "attention_bwd_dkdv" && bd.warps == 4 && bd.checked) {
        auto meta_of = [&](const std::string& name) {
          return std::find_if(bd.meta.begin(), bd.meta.end(), [&](const auto& m) { return m.first == name; })->second;
        };
        const auto red = std::get<int64_t>(meta_of("DQ_REDUCTION"));
        const std::string key = fmt::format("{} causal {}", jit::to_string(backend), ir::to_string(meta_of("CAUSAL")));
        if (red == 0) wgmma[key] = mma_async;
        else CHECK_MESSAGE(mma_async > wgmma.at(key), "the dQ dot is not on wgmma");  // 5 dots on wgmma instead of 4
        CHECK(mma_sync == 0);
      }
    }
  }
}

// ordered (DQ_REDUCTION=3): dQ tiles accumulated in increasing key-block order through semaphores;
// the interpreter runs the programs concurrently (they wait on each other). The same float32 adds
// in the same order on every run: dQ equals recompute's within rounding, dK/dV its bits; Q_DESCENDING
// (causal walk from the last query block) gives the same bits as ascending (same add order).
TEST_CASE("ordered dQ: semaphore-ordered accumulation matches float64 and is the same bits in any visit order") {
  int checked = 0;
  for (const Problem& p : problems()) {
    if (p.library()) continue;  // ordered takes full and causal only
    INFO(p.describe());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Reference in = reference(p, scale);
    const Run base = run_backward(p, in, scale, DqReduction::recompute);
    const Run ordered = run_backward(p, in, scale, DqReduction::ordered);
    const Run again = run_backward(p, in, scale, DqReduction::ordered, NAN, /*q_descending=*/true);
    // DASH's shift schedule on persistent grids of several sizes: another fixed order, for dQ's
    // adds and for the query tiles dK and dV sum over (so those differ from ascending's in the last
    // bits); one program visits in ascending order, as the default
    for (int programs : {1, 3, 7}) {
      INFO("PERSISTENT on ", programs, " programs");
      const Run shift = run_backward(p, in, scale, DqReduction::ordered, NAN, false, programs);
      CHECK(rt::rel_error(shift.g.dq.to_f64(), in.dq) < 1e-2);
      CHECK(rt::rel_error(shift.g.dq.to_f64(), base.g.dq.to_f64()) < 5e-3);
      CHECK(rt::rel_error(shift.g.dk.to_f64(), in.dk) < 1e-2);
      CHECK(rt::rel_error(shift.g.dv.to_f64(), in.dv) < 1e-2);
      if (programs == 1) CHECK(same_bits(shift.g.dk, base.g.dk));
      if (programs == 1) CHECK(same_bits(shift.g.dv, base.g.dv));
      CHECK(nonzero_keyless_rows(p, in, shift.g.dq) == 0);
    }
    CHECK(rt::rel_error(ordered.g.dq.to_f64(), in.dq) < 1e-2);
    CHECK(rt::rel_error(ordered.g.dq.to_f64(), base.g.dq.to_f64()) < 5e-3);
    CHECK(same_bits(ordered.g.dk, base.g.dk));
    CHECK(same_bits(ordered.g.dv, base.g.dv));
    CHECK(same_bits(ordered.g.dq, again.g.dq));
    CHECK(nonzero_keyless_rows(p, in, ordered.g.dq) == 0);
    ++checked;
  }
  CHECK(checked >= 4);
  CHECK_THROWS_WITH_AS(km::attention_backward_dkdv().build({{"DQ_REDUCTION", 3}, {"MASK", static_cast<int>(MaskKind::sliding_window)}}),
                       doctest::Contains("ordered) takes the full and causal masks only"), BuildError);
  CHECK_THROWS_WITH_AS(km::attention_backward_dkdv().build({{"DQ_REDUCTION", 2}, {"PERSISTENT", true}}),
                       doctest::Contains("PERSISTENT takes DQ_REDUCTION=3 (ordered: DASH's shift order) or 1 (atomic"), BuildError);
  CHECK_THROWS_WITH_AS(km::attention_backward_dkdv().build({{"DQ_REDUCTION", 1}, {"PERSISTENT", true}, {"MASK", static_cast<int>(MaskKind::sliding_window)}}),
                       doctest::Contains("got DQ_REDUCTION=1, MASK"), BuildError);
}

namespace {

// The persistent dK/dV kernel's schedule arithmetic (kernels/attention/backward_schedule_lang.hpp) as a DSL
// kernel of its own: for every item, stage and step it writes the query tile visited and the
// ordered wait target, [items * heads, 2 stages, M steps, 2] (-1 where nothing runs).
const Kernel& schedule_probe() {
  static const Kernel k = kernel("schedule_probe", [](Builder& kb) {
    const int64_t BM = kb.meta<int>("BLOCK_M", 64), BN = kb.meta<int>("BLOCK_N", 64);
    const bool causal = kb.meta<bool>("CAUSAL", false);
    auto out = kb.pointer("out", i32);
    auto heads = kb.scalar<int>("heads"), S_q = kb.scalar<int>("S_q"), S_k = kb.scalar<int>("S_k");
    const km::BwdScheduleLang sched{S_q, S_k, BM, BN, causal};
    const Tile M = sched.query_tiles();
    for_range(program_id(0), heads * sched.items_per_head(), num_programs(0), [&](Tile linear) {
      const km::BwdScheduleLang::Slot s = sched.slot(linear, num_programs(0));
      for_range(0, sched.stages(s), [&](Tile stage) {
        const Tile n = sched.stage_tile(s, stage);
        for_range(0, sched.visit_count(n), [&](Tile t) {
          const Tile m = sched.visit_query_tile(s, stage, n, t);
          const Tile at = ((linear * 2 + stage) * M + t) * 2;
          store(out + at, m);
          store(out + (at + 1), sched.wait_target(s, stage, n, m));
        });
      });
    });
  });
  return k;
}

}  // namespace

// The kernel's DSL arithmetic against the host model (kernels/attention/backward_schedule.hpp), which
// tests/test_backward_schedule.cpp checks against DASH's rules and the simulator.
TEST_CASE("PERSISTENT schedule: the DSL's visit orders and wait targets are the host model's (shift order)") {
  int compared = 0;
  for (bool causal : {false, true})
    for (auto [sq, sk, bm, bn] : {std::array{512, 512, 64, 64}, std::array{500, 380, 64, 128}, std::array{300, 520, 32, 64},
                                  std::array{1024, 1024, 64, 128}, std::array{130, 900, 64, 64}})
      for (int programs : {1, 3, 5, 16}) {
        km::BwdProblem p{.heads = 3, .seq_q = sq, .seq_k = sk, .block_m = bm, .block_n = bn,
                         .mask = causal ? km::BwdMask::causal : km::BwdMask::full};
        INFO(fmt::format("causal {} S_q {} S_k {} BM {} BN {} P {}", causal, sq, sk, bm, bn, programs));
        const int items = km::items_per_head(p), M = p.query_tiles();
        HostTensor out(i32, {p.heads * items, 2, M, 2});
        out.fill(-1.0);
        rt::interpret(schedule_probe().build({{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"CAUSAL", causal}}), {programs, 1, 1},
                      {out, static_cast<int32_t>(p.heads), static_cast<int32_t>(sq), static_cast<int32_t>(sk)});
        const auto* got = static_cast<const int32_t*>(out.data());
        for (int bh = 0; bh < p.heads; ++bh)
          for (int n = 0; n < p.key_tiles(); ++n) {
            const km::KeyTileSlot s = km::key_tile_slot(p, programs, bh, n);
            const std::vector<int> visits = km::visit_order(p, km::QOrder::shift, s);
            for (size_t t = 0; t < visits.size(); ++t) {
              const size_t at = ((static_cast<size_t>(bh * items + s.item) * 2 + static_cast<size_t>(s.stage)) * static_cast<size_t>(M) + t) * 2;
              INFO("head ", bh, " key tile ", n, " step ", t);
              REQUIRE(got[at] == visits[t]);
              CHECK(got[at + 1] == km::wait_target(p, km::QOrder::shift, s, visits[t]));
              ++compared;
            }
          }
      }
  CHECK(compared > 1000);
}
