// The configuration of the attention kernels: THE table of default schedules (default_schedule, where
// every pass's schedule is chosen), the metas each kernel declares, and Config with its metas.
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "api/attention/internal.hpp"
#include "api/registry.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention {

namespace mn = kernels::meta_name;

// ---------------------------------------------------------------------------------------------
// THE TABLE OF DEFAULT SCHEDULES: the one place schedules are chosen, for the dense shapes of the
// Hopper (wgmma) path; varlen (tensor slices) runs on the generic path with its own, smaller tiles.
// The measurements behind each rule are in the decision records, docs/decisions/NNN-*.md.
Schedule default_schedule(Pass pass, ir::DType dtype, int head_dim, bool causal, bool varlen, DqReduction reduction, bool dropout,
                          bool library_mask, bool score_mod) {
  const int warps = head_dim >= 256 ? 8 : 4;
  switch (pass) {
    // 128 x 128 tiles (BLOCK_N 64 at D 256) on 8 warps, 2 stages (decision 001). D 64 with
    // dropout: 64 x 128 on 4 warps, three programs per SM and more warps to hide the RNG's latency
    // (decision 005). D 64 without dropout: 128 x 128 on 8 warps with registers bounded for two
    // programs per SM and the rcp normalisation (meta_of: EXACT_NORMALIZE=false) (decision 004).
    case Pass::forward:
      if (!varlen && head_dim == 64 && dropout) return {64, 128, 4, 2};
      if (!varlen && head_dim == 64) return {128, 128, 8, 2, 2};
      if (!varlen) return {128, head_dim >= 256 ? 64 : 128, 8, 2};
      return {64, head_dim >= 256 ? 32 : 64, warps, 3};
    case Pass::bwd_preprocess: return {64, 64, 4, 1};
    // dK/dV and dQ: every dot on wgmma up to D = 128; D = 256 dK/dV keeps two f32 [64, 256]
    // accumulators, on 8 warps to hold them. Varlen windows are tensor slices, which never take the Hopper wgmma
    // path: the generic path's schedules for both gradient passes.
    // With a dQ reduction (dense only) the kernel's fifth dot, dS K, has M = BLOCK_M: at 64 x 128 on
    // 8 warps each warpgroup takes half of D's columns on wgmma, which needs D / 2 in whole 64-column
    // chunks (D 128); D 64 would run it on mma.sync with K loaded twice, so it takes 64 x 64 on 4
    // warps (every dot on wgmma), or (atomic) 128-row blocks, where each warpgroup takes 64 rows.
    // D = 256 keeps its 32 x 64 tiles (the dot then on mma.sync) on 8 warps: 4 spilled 1.8 KB (3.2 KB
    // with a reduction), 8 none (0.6 KB with one); 3.0-3.1x at S 4k (093).
    // Without a reduction (recompute) dK/dV and dQ take 64 x 64 tiles on 4 warps, two programs per SM
    // instead of one (decision 021); with dropout too since dK/dV builds its transposed mask from
    // packed words (decision 017).
    case Pass::bwd_dkdv:
      if (varlen) return {64, 64, 8, 2};
      if (head_dim >= 256) return {32, 64, 8, 2};
      // a reduction: 8 warps at D 128, where the dQ dot's split fits
      if (reduction != DqReduction::recompute && head_dim % 128 == 0) return {64, 128, 8, 2};
      // D 64 atomic: 128 x 128 on 8 warps (FA3's D 64 tiles) with the ring producer and the dQ
      // writer (dkdv_ring_options): 1.03-1.15x recompute's backward from S 2k, dense (decision 101);
      // under library masks too (108: emulator-checked, untimed; recompute stays their D 64 default)
      if (reduction == DqReduction::atomic && head_dim == 64 && !dropout && !score_mod) return {128, 128, 8, 2};
      // D 64 recompute without dropout or a library mask: full, 128 query rows a visit on one
      // warpgroup, two programs an SM (254 registers): 1.03-1.13x decision 022's 64 x 64 at three
      // programs an SM in the H200 tuning sweeps (083). Causal keeps 022's: 128-row visits lost 7%
      // at S 1k (gained 8-11% from S 4k: a tuning table's choice there).
      if (reduction == DqReduction::recompute && head_dim == 64 && !dropout && !library_mask)
        return causal ? Schedule{64, 64, 4, 2, 3} : Schedule{128, 64, 4, 2};
      return {64, 64, 4, 2};
    // dQ (recompute): D 128 dense without a library mask or a score mod: 128 x 128 on 8 warps, one
    // program an SM: 1.13-1.19x 64 x 64 on 4 warps at S 4k and 1.09-1.26x at S 1k-16k in the H200
    // tuning sweeps (085; the model ranks it first); with fused dropout 1.056x / 1.045x full /
    // causal at S 4k (089); with softcapping it spills 248 B. D 64: 64 x 64 is the sweeps' best.
    case Pass::bwd_dq:
      if (!varlen && head_dim == 128 && !library_mask && !score_mod) return {128, 128, 8, 2};
      return {64, 64, 4, 2};
    // Elementwise over dQ_accum: [BLOCK_M, D] f32 per program, 4 warps.
    case Pass::bwd_dq_convert: return {head_dim >= 256 ? 32 : 64, 64, 4, 2};
    // The parts are read at dK/dV's tiles: its BLOCK_M and BLOCK_N, an f32 [BLOCK_M, D] sum on 4 warps.
    case Pass::bwd_dq_reduce: {
      Schedule s = default_schedule(Pass::bwd_dkdv, dtype, head_dim, causal, varlen, reduction, dropout);
      s.num_warps = 4;
      s.stages = 2;
      return s;
    }
  }
  return {};
}

namespace detail {
namespace {

const lang::Kernel* kernel_of(Pass p) {
  if (p == Pass::forward) return &kernels::attention_forward();
  const library::LibraryKernel* lk = library::find(name(p));
  return lk ? &lk->kernel() : nullptr;
}

constexpr size_t kPasses = 6;

}  // namespace

const KernelInfo& info(Pass p) {
  static std::once_flag once[kPasses];
  static KernelInfo infos[kPasses];
  const auto i = static_cast<size_t>(p);
  std::call_once(once[i], [&] {
    KernelInfo& ki = infos[i];
    ki.kernel = kernel_of(p);
    if (!ki.kernel) return;
    try {
      const ir::Function fn = ki.kernel->build({});
      ki.metas.emplace();
      for (const ir::MetaEntry& m : fn.meta) ki.metas->insert(m.name);
    } catch (const std::exception&) {
    }
  });
  return infos[i];
}

bool declares(Pass p, const char* meta) {
  const KernelInfo& ki = info(p);
  return ki.kernel && (!ki.metas || ki.metas->contains(meta));
}

// Whether dK/dV runs ordered on a persistent grid with DASH's shift schedule (PERSISTENT): ordered
// without the descending walk. The grid holds as many programs as are resident at once (sized by
// occupancy, not one per SM: decision 025).
bool persistent_ordered(int reduction, bool q_descending) {
  return reduction == static_cast<int>(DqReduction::ordered) && !q_descending;
}

// The ring producer's kernels (ForwardConfig::read: D 128 dense, no library mask or score mod) run
// persistent without dropout: +2-11% at S 1k-8k, 0.99-1.00 at S 16k; with fused dropout 0.86-0.91
// (decision 050).
bool forward_persistent(int head_dim, bool varlen, int mask, int score_mod, bool dropout) {
  return head_dim == 128 && !varlen && mask == 0 && score_mod == 0 && !dropout && declares(Pass::forward, mn::kPersistent);
}

// dK/dV alone, the same process, on the H200 (decision 070), against the plain kernel:
// - recompute, LSE_IN_RING: 1.01-1.05x at D 64 and D 128 full; 0.98-1.02 at D 128 causal (off);
//   RING_PRODUCER loses 0.76-0.83x (its warpgroup halves the programs an SM at 64 x 64 tiles);
// - atomic (BLOCK_N 128 on 8 warps, one program an SM): both 1.097x at D 128 full (LSE_IN_RING
//   alone 1.02x: schedules the producer does not fit); 0.88 causal and 0.77 at D 64 (off). With the
//   dQ writer (DQ_WRITER, decision 073) all three against the plain kernel: 1.131x D 128 full,
//   1.367x D 128 causal (on), 0.80-0.81x D 64 (off).
// Unmeasured (off): varlen, library masks, score mods, dropout, the split and ordered reductions.
// Options::dq_reduction unset: atomic on the dQ writer where it runs (decision 100); with
// Options::deterministic, the faster deterministic reduction, as measured side by side (H200,
// attention_bench --deterministic --head-dim 128, decisions 075, 085): with dQ on 128 x 128 tiles
// (085) ordered on the dQ writer takes 0.97 / 0.96 of recompute's time at full S 8k / 16k and 0.97
// causal at S 16k; recompute is faster at full S 4k (ordered 1.05x) and below (1.15-1.25x), and
// level at causal S 8k (1.00x: recompute, which needs no workspace) and faster below (1.09-1.14x). Unmeasured (recompute):
// D 64 (ordered has no writer there: 1.4-1.6x atomic's time), the other configurations the ring
// options leave out, and calls that need recompute (accumulation, split phases).
namespace {
// A call the dQ writer takes (LSE ring, ring producer, writer), whichever reduction adds; dense, or
// (atomic only, dkdv_ring_options) under a library mask.
bool writer_may_run(bool varlen, bool dropout, bool score_mod, bool schedule, bool q_descending) {
  return !varlen && !dropout && !score_mod && !schedule && !q_descending && declares(Pass::bwd_dkdv, mn::kLseInRing) &&
         declares(Pass::bwd_dkdv, mn::kRingProducer) && declares(Pass::bwd_dkdv, mn::kDqWriter);
}
}  // namespace

bool ordered_may_be_default(int head_dim, kernels::MaskKind mask, bool varlen, bool dropout, bool score_mod, bool schedule,
                            bool q_descending) {
  return head_dim == 128 && !library_mask(mask) && writer_may_run(varlen, dropout, score_mod, schedule, q_descending) &&
         dq_reduction_supported(DqReduction::ordered) && declares(Pass::bwd_dkdv, mn::kPersistent);
}

// D 64 runs atomic on the dQ writer at 128 x 128 tiles (default_schedule, dkdv_ring_options); ordered
// has no writer there (decision 101). Library masks: the writer walking the mask at D 128 (102, 104)
// and at D 64 (108, 111), but for D 64's global + window (0.80-0.81x recompute; cause open: 111).
bool atomic_may_be_default(int head_dim, kernels::MaskKind mask, bool varlen, bool dropout, bool score_mod, bool schedule,
                           bool q_descending) {
  if (library_mask(mask))
    return (head_dim == 128 || (head_dim == 64 && mask != kernels::MaskKind::global_sliding_window)) &&
           writer_may_run(varlen, dropout, score_mod, schedule, q_descending) && dq_reduction_supported(DqReduction::atomic) &&
           declares(Pass::bwd_dkdv, mn::kMask);
  if (head_dim == 128) return ordered_may_be_default(head_dim, mask, varlen, dropout, score_mod, schedule, q_descending);
  return head_dim == 64 && writer_may_run(varlen, dropout, score_mod, schedule, q_descending) &&
         dq_reduction_supported(DqReduction::atomic);
}

DqReduction default_reduction(const Dims& d, const Options& opts) {
  const bool dropout = opts.dropout_p > 0, score_mod = d.score_mod != kernels::ScoreModKind::none, schedule = opts.schedule.has_value();
  const bool whole_call = !opts.accumulate_gradients && opts.backward_phase == BackwardPhase::all && d.seq_q % 4 == 0;
  const bool writer = whole_call && atomic_may_be_default(d.head_dim, d.mask, d.varlen, dropout, score_mod, schedule, opts.q_descending);
  // atomic where it beat the fastest deterministic reduction by more than 5% (settled, H200), unless
  // the call asks for determinism: D 128 at S_q 1k-16k full 1.09-1.14x, causal 1.05-1.17x (decision
  // 100; below S_q 1024 unmeasured); D 64 from S_q 4k 1.05-1.15x (S 2k 1.03x, S 1k 0.94-0.99x: 101);
  // library masks at D 128 from S_q 2k: 1.12-1.30x recompute (global + window level at S 2k; below
  // S_q 2048 unmeasured: decision 104); at D 64 from S_q 4k as dense D 64: 1.17-1.35x at S 8k / 16k,
  // alike at both (111; S 4k unmeasured)
  const int64_t atomic_from = library_mask(d.mask) && d.head_dim == 128 ? 2048 : d.head_dim == 64 ? 4096 : 1024;
  if (writer && !opts.deterministic && d.seq_q >= atomic_from) return DqReduction::atomic;
  const bool ordered = writer && d.head_dim == 128 && !library_mask(d.mask);
  return ordered && d.seq_q >= (d.causal ? 16384 : 8192) ? DqReduction::ordered : DqReduction::recompute;
}

DkdvRingOptions dkdv_ring_options(const Config& c, bool row_vectors_aligned) {
  if (!row_vectors_aligned || c.varlen || c.score_mod != 0 || !declares(Pass::bwd_dkdv, mn::kLseInRing)) return {};
  // (the producer at the measured schedule only: it needs whole warpgroups and one program an SM)
  const bool measured_tiles = c.sch.block_n == 128 && c.sch.num_warps == 8 && c.sch.min_programs_per_sm <= 1;
  // Library masks: atomic on the measured tiles (D 128: 64 x 128, decisions 102 and 104; D 64:
  // 128 x 128, 108), with the producer and the dQ writer walking the mask's intervals or lists;
  // otherwise none
  if (c.mask != 0) {
    const bool tiles = (c.head_dim == 128 && c.sch.block_m == 64) || (c.head_dim == 64 && c.sch.block_m == 128);
    const bool writer = c.reduction == static_cast<int>(DqReduction::atomic) && tiles && !c.dropout && measured_tiles &&
                        declares(Pass::bwd_dkdv, mn::kRingProducer) && declares(Pass::bwd_dkdv, mn::kDqWriter);
    if (!writer) return {};
    return {.lse_in_ring = true, .ring_producer = true, .dq_writer = true};
  }
  const bool d128_full = c.head_dim == 128 && !c.causal;
  // dropout (recompute, TMA_STORE and DESCRIPTORS_AT_USE): fused at D 128 causal 1.05x ROWS_AHEAD,
  // level full; reading bits 0.90-0.97x (decision 089)
  if (c.dropout)
    return {.lse_in_ring = c.reduction == static_cast<int>(DqReduction::recompute) && c.head_dim == 128 && c.causal && !c.read_bits};
  if (c.reduction == static_cast<int>(DqReduction::recompute)) return {.lse_in_ring = c.head_dim == 64 || d128_full};
  // ordered: on DASH's persistent grid, its writer waits for each add's turn (decision 074)
  const bool adds = c.reduction == static_cast<int>(DqReduction::atomic) || persistent_ordered(c.reduction, c.q_descending);
  // D 64: atomic at 128-row blocks only, where dS K splits by rows (default_schedule)
  const bool d64_rows = c.head_dim == 64 && c.reduction == static_cast<int>(DqReduction::atomic) && c.sch.block_m == 128;
  if (!adds || (c.head_dim != 128 && !d64_rows)) return {};
  // (causal only with the writer: the producer alone loses there)
  const bool producer = measured_tiles && declares(Pass::bwd_dkdv, mn::kRingProducer);
  const bool writer = producer && declares(Pass::bwd_dkdv, mn::kDqWriter);
  if (c.causal && !writer) return {};
  return {.lse_in_ring = true, .ring_producer = producer, .dq_writer = writer};
}

// The call's configuration as the pass's typed kernel configuration (kernels/attention/config.hpp),
// written as metas; only those its kernel declares are kept (a library build may lack some: the
// API then passes what it has, and the checks refuse options that need the missing ones).
lang::Meta meta_of(const Config& c) {
  kernels::AttentionSpec spec;
  spec.dtype = c.dtype;
  spec.head_dim = c.head_dim;
  spec.bshd = !c.varlen;  // (packed varlen tensors are [total, H, D])
  spec.varlen = c.varlen;
  spec.causal = c.causal;
  spec.mask = c.mask != 0 ? static_cast<kernels::MaskKind>(c.mask) : kernels::MaskKind::full;
  spec.score_mod = static_cast<kernels::ScoreModKind>(c.score_mod);
  spec.dropout = c.dropout;
  spec.dropout_bits = c.read_bits;
  // the pass's config with the call's spec and tiles
  auto tiled = [&](auto k) {
    k.spec = spec;
    k.block_m = c.sch.block_m;
    if constexpr (requires { k.block_n; }) k.block_n = c.sch.block_n;
    return k;
  };
  lang::Meta all;
  switch (c.pass) {
    case Pass::forward: {
      kernels::ForwardConfig f = tiled(kernels::ForwardConfig{});
      f.return_mask = c.return_mask;
      f.positive_scale = c.positive_scale;
      f.persistent = c.persistent;
      // a register bound normalises by rcp: the division's subroutine makes ptxas serialise every
      // wgmma, which only paid (D 64) as a way to fit two programs per SM (decisions 003, 004)
      if (c.sch.min_programs_per_sm > 0) f.exact_normalize = false;
      // a bound of several programs an SM leaves no register file for setmaxnreg to move between the
      // producer and the consumers (the jit refuses the pair): the D 128 forward without its producer
      if (c.sch.min_programs_per_sm > 1) f.ring_producer = false;
      if (c.tuned) {
        f.exact_normalize = c.tuned->exact_normalize;
        f.ring_producer = c.tuned->ring_producer;
        f.pipeline_pv = c.tuned->pipeline_pv;
        f.pipeline_qk = c.tuned->pipeline_qk;
        f.tma_store = c.tuned->tma_store;
      }
      all = f.to_meta();
      break;
    }
    case Pass::bwd_dkdv: {
      kernels::DkdvConfig k = tiled(kernels::DkdvConfig{});
      k.dq_reduction = static_cast<DqReduction>(c.reduction);
      k.q_descending = c.q_descending;
      k.persistent = persistent_ordered(c.reduction, c.q_descending);
      k.accumulate = c.accumulate;
      k.lse_in_ring = c.lse_in_ring;
      if (c.ring_producer) k.ring_producer = true;
      k.dq_writer = c.dq_writer;
      k.dropout_write_bits = c.write_bits;
      k.dropout_words_key_major = c.words_key_major;
      if (c.tuned) k.tma_store = c.tuned->tma_store;
      all = k.to_meta();
      break;
    }
    case Pass::bwd_preprocess: all = tiled(kernels::PreprocessConfig{}).to_meta(); break;
    case Pass::bwd_dq: {
      kernels::DqConfig k = tiled(kernels::DqConfig{});
      k.accumulate = c.accumulate;
      k.dropout_words_key_major = c.words_key_major;
      all = k.to_meta();
      break;
    }
    case Pass::bwd_dq_convert: {
      kernels::DqConvertConfig k = tiled(kernels::DqConvertConfig{});
      k.accumulate = c.accumulate;
      all = k.to_meta();
      break;
    }
    case Pass::bwd_dq_reduce: all = tiled(kernels::DqReduceConfig{}).to_meta(); break;
  }
  lang::Meta used;
  for (auto& m : all)
    if (declares(c.pass, m.first.c_str())) used.push_back(std::move(m));
  return used;
}

Schedule schedule_for(Pass p, const Tensor& q, const Dims& d, const Options& opts) {
  return opts.schedule ? *opts.schedule
                       : default_schedule(p, q.dtype, static_cast<int>(d.head_dim), d.causal, opts.cu_seqlens_q.has_value(),
                                          d.reduction, d.dropout, library_mask(d.mask), d.score_mod != kernels::ScoreModKind::none);
}

Config config(Pass p, const Tensor& q, const Dims& d, const Options& opts) {
  Config c{p,
                q.dtype,
                static_cast<int>(d.head_dim),
                d.causal,
                d.varlen,
                schedule_for(p, q, d, opts),
                q.device,
                d.dropout && declares(p, mn::kDropout),
                p == Pass::forward && d.return_mask,
                (d.read_bits || (p == Pass::bwd_dq && d.mask_once)) && declares(p, mn::kDropoutBits),
                library_mask(d.mask) && declares(p, mn::kMask) ? static_cast<int>(d.mask) : 0,
                p == Pass::bwd_dkdv ? static_cast<int>(d.reduction) : 0,
                p == Pass::bwd_dkdv && d.q_descending,
                d.score_mod != kernels::ScoreModKind::none && declares(p, mn::kScoreMod) ? static_cast<int>(d.score_mod) : 0,
                // the fma softmax where the scale allows it (the kernel with it is a separate
                // specialisation: a negative scale keeps the general one)
                p == Pass::forward && d.scale > 0 && d.score_mod == kernels::ScoreModKind::none && declares(p, mn::kPositiveScale)};
  c.persistent = p == Pass::forward && declares(p, mn::kPersistent) && !c.varlen &&
                 opts.persistent.value_or(forward_persistent(c.head_dim, c.varlen, c.mask, c.score_mod, c.dropout));
  c.accumulate = d.accumulate && (p == Pass::bwd_dkdv || p == Pass::bwd_dq || p == Pass::bwd_dq_convert);
  c.write_bits = p == Pass::bwd_dkdv && d.mask_once;
  c.words_key_major = (p == Pass::bwd_dkdv || p == Pass::bwd_dq) && d.mask_once;
  if (p == Pass::bwd_dkdv) {
    const DkdvRingOptions r = dkdv_ring_options(c, d.row_vectors_aligned);
    c.lse_in_ring = r.lse_in_ring, c.ring_producer = r.ring_producer, c.dq_writer = r.dq_writer;
  }
  return c;
}

}  // namespace detail

using namespace detail;

bool backward_available() {
  return info(Pass::bwd_preprocess).kernel && info(Pass::bwd_dkdv).kernel && info(Pass::bwd_dq).kernel;
}

bool varlen_supported(bool backward) {
  auto has = [](Pass p) {
    const KernelInfo& ki = info(p);
    return ki.kernel && ki.metas && ki.metas->contains(mn::kVarlen);
  };
  if (!has(Pass::forward)) return false;
  return !backward || (has(Pass::bwd_preprocess) && has(Pass::bwd_dkdv) && has(Pass::bwd_dq));
}

bool dropout_supported() {
  if (!declares(Pass::forward, mn::kDropout)) return false;
  return !backward_available() || (declares(Pass::bwd_dkdv, mn::kDropout) && declares(Pass::bwd_dq, mn::kDropout));
}

bool masks_supported() {
  if (!declares(Pass::forward, mn::kMask)) return false;
  return !backward_available() || (declares(Pass::bwd_dkdv, mn::kMask) && declares(Pass::bwd_dq, mn::kMask));
}

bool dq_reduction_supported(DqReduction reduction) {
  const int r = static_cast<int>(reduction);
  if (r < 0 || r > 3 || !backward_available()) return false;
  if (reduction == DqReduction::recompute) return true;
  if (!info(dq_pass(reduction)).kernel || !declares(Pass::bwd_dkdv, mn::kDqReduction)) return false;
  // the values the dK/dV kernel takes: one build with each (its other metas at their defaults)
  static std::once_flag once[4];
  static bool builds[4];
  std::call_once(once[r], [&] {
    try {
      (void)info(Pass::bwd_dkdv).kernel->build({{mn::kDqReduction, r}});
      builds[r] = true;
    } catch (const std::exception&) {
      builds[r] = false;
    }
  });
  return builds[r];
}

}  // namespace tilejit::attention
