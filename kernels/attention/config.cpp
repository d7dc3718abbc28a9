// Reading and writing the attention kernels' typed configurations (config.hpp). read() declares
// the metas in the order the kernels always have (the order is part of the tile IR and its hash).
#include "kernels/attention/config.hpp"

#include <fmt/format.h>

#include "kernels/attention/mask.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::kernels {

using namespace lang;
namespace mn = meta_name;

namespace {

// DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM and CAUSAL: the first metas of the forward, dK/dV, dQ and dQ
// reduce kernels, in this order.
void read_core(Builder& kb, AttentionSpec& s, int64_t& block_m, int64_t& block_n) {
  s.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  block_m = kb.meta<int>(mn::kBlockM, 64);
  block_n = kb.meta<int>(mn::kBlockN, 64);
  s.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  s.causal = kb.meta<bool>(mn::kCausal, false);
}

// The metas every attention kernel's caller passes: tiles, dtype, head dim, causal, layout.
void put_core(Meta& m, const AttentionSpec& s, int64_t block_m, int64_t block_n) {
  m.emplace_back(mn::kDtype, s.dtype);
  m.emplace_back(mn::kBlockM, block_m);
  m.emplace_back(mn::kBlockN, block_n);
  m.emplace_back(mn::kHeadDim, s.head_dim);
  m.emplace_back(mn::kCausal, s.causal || s.mask == MaskKind::causal);
  m.emplace_back(mn::kBshd, s.bshd);
}

// The spec's other metas where they differ from their defaults.
void put_spec(Meta& m, const AttentionSpec& s) {
  if (s.varlen) m.emplace_back(mn::kVarlen, true);
  if (s.dropout) m.emplace_back(mn::kDropout, true);
  if (s.dropout_bits) m.emplace_back(mn::kDropoutBits, true);
  if (s.library_mask()) m.emplace_back(mn::kMask, static_cast<int64_t>(s.mask));
  if (s.modded()) m.emplace_back(mn::kScoreMod, static_cast<int64_t>(s.score_mod));
}

void put_if(Meta& m, const char* name, bool value, bool def) {
  if (value != def) m.emplace_back(name, value);
}
void put_if(Meta& m, const char* name, const std::optional<bool>& value) {
  if (value) m.emplace_back(name, *value);
}

}  // namespace

bool read_dropout_bits(Builder& kb, bool dropout, bool varlen, int64_t block_n) {
  const bool precomputed = kb.meta<bool>(mn::kDropoutBits, false);
  if (precomputed && (!dropout || varlen))
    kb.fail(Loc::current(), "DROPOUT_BITS reads a precomputed mask: it needs DROPOUT=true and dense (not VARLEN) tensors");
  if (precomputed && block_n % 32 != 0)
    kb.fail(Loc::current(), fmt::format("DROPOUT_BITS needs BLOCK_N to be a multiple of 32 (whole mask words), got {}", block_n));
  return precomputed;
}

Meta ForwardConfig::to_meta() const {
  Meta m;
  put_core(m, spec, block_m, block_n);
  put_spec(m, spec);
  put_if(m, mn::kReturnMask, return_mask, false);
  put_if(m, mn::kExactNormalize, exact_normalize);
  put_if(m, mn::kPipelineQk, pipeline_qk);
  put_if(m, mn::kPositiveScale, positive_scale, false);
  put_if(m, mn::kDropoutAhead, dropout_ahead);
  put_if(m, mn::kDropoutPairs, dropout_pairs, true);
  put_if(m, mn::kHeavyFirstSections, heavy_first_sections, true);
  put_if(m, mn::kPingpong, pingpong);
  put_if(m, mn::kPipelinePv, pipeline_pv);
  if (rng_warps != 0) {
    m.emplace_back(mn::kRngWarps, rng_warps);
    m.emplace_back(mn::kMmaRegisters, mma_registers);
    m.emplace_back(mn::kRngRegisters, rng_registers);
  }
  put_if(m, mn::kRingProducer, ring_producer);
  put_if(m, mn::kPvPeel, pv_peel);
  put_if(m, mn::kPersistent, persistent);
  put_if(m, mn::kTmaStore, tma_store);
  put_if(m, mn::kStoreOffsetsLate, store_offsets_late);
  put_if(m, mn::kDescriptorsAtUse, descriptors_at_use);
  put_if(m, mn::kK0BeforeVLast, k0_before_v_last);
  put_if(m, mn::kOverlapTiles, overlap_tiles);
  put_if(m, mn::kLazyRescale, lazy_rescale);
  put_if(m, mn::kCoordinatesAtUse, coordinates_at_use);
  if (timeline) m.emplace_back(mn::kTimeline, true);
  return m;
}

ForwardConfig ForwardConfig::read(Builder& kb) {
  ForwardConfig c;
  AttentionSpec& s = c.spec;
  read_core(kb, s, c.block_m, c.block_n);
  s.mask = mask_kind_meta(kb, mn::kMask);
  if (s.mask == MaskKind::causal) s.causal = true;
  s.bshd = kb.meta<bool>(mn::kBshd, false);
  s.varlen = kb.meta<bool>(mn::kVarlen, false);
  if (s.varlen && s.bshd) kb.fail(Loc::current(), "VARLEN tensors are [total_tokens, heads, head_dim]; BSHD does not apply to them");
  if (s.library_mask() && (s.causal || s.varlen))
    kb.fail(Loc::current(), fmt::format("MASK={} ({}) does not combine with {} (use the mask alone; document masks cover packed "
                                        "sequences)", static_cast<int>(s.mask), mask_kind_name(s.mask),
                                        s.causal ? "CAUSAL=true" : "VARLEN=true"));
  s.dropout = kb.meta<bool>(mn::kDropout, false);
  c.return_mask = kb.meta<bool>(mn::kReturnMask, false);
  if (c.return_mask && !s.dropout) kb.fail(Loc::current(), "RETURN_MASK returns the dropout mask: it needs DROPOUT=true");
  s.dropout_bits = read_dropout_bits(kb, s.dropout, s.varlen, c.block_n);
  c.exact_normalize = kb.meta<bool>(mn::kExactNormalize, s.head_dim == 64 && !s.dropout);
  s.score_mod = score_mod_kind_meta(kb, mn::kScoreMod);
  c.rng_warps = kb.meta<int>(mn::kRngWarps, 0);
  if (c.rng_warps) {
    c.mma_registers = kb.meta<int>(mn::kMmaRegisters, 0);
    c.rng_registers = kb.meta<int>(mn::kRngRegisters, 0);
  }
  // The loop's schedule (decisions 006, 044, 045). At D 128 on dense tensors (no library mask,
  // varlen or score mod): a producer warpgroup fills the K / V rings, and P_{j-1} V_{j-1} stays in
  // flight during softmax_j (+5-8% over PIPELINE_QK with the producer; PIPELINE_QK beside them
  // does not fit the consumers' 240 registers). PINGPONG stays off: +3.0% then 0.996 causal, and a
  // Q loaded through registers (once_by_tma off) converts inside the turn. Without the producer,
  // PIPELINE_QK without dropout. D 64 keeps the plain loop: its two programs per multiprocessor do
  // not fit beside a producer [044]. Library masks at D 128 take the same loop (the producer replays
  // their intervals or lists): 1.12-1.23x the plain loop for the window, document, prefix-LM and
  // block-sparse masks at S 8k / 16k [105, 110]; share_question (260 B spilled) and causal_blockwise
  // (76 B) keep the plain loop, as do dropout and score mods under a mask (untimed there).
  const bool dense128 = s.head_dim == 128 && !s.library_mask() && !s.varlen && !s.modded();
  const bool masked128 = s.head_dim == 128 && s.library_mask() && s.mask != MaskKind::share_question &&
                         s.mask != MaskKind::causal_blockwise && !s.varlen && !s.modded() && !s.dropout;
  c.ring_producer = kb.meta<bool>(mn::kRingProducer, (dense128 || masked128) && !c.rng_warps);
  if (*c.ring_producer && c.rng_warps)
    kb.fail(Loc::current(), "RING_PRODUCER and RNG_WARPS each add a warp role; use one of them");
  c.pipeline_pv = kb.meta<bool>(mn::kPipelinePv, *c.ring_producer);
  c.pipeline_qk = kb.meta<bool>(mn::kPipelineQk, dense128 && !s.dropout && !*c.pipeline_pv);
  c.pingpong = kb.meta<bool>(mn::kPingpong, false);
  c.positive_scale = kb.meta<bool>(mn::kPositiveScale, false);
  // off by default: ahead of S's wait the words (or Philox) measured 2-15% slower than at their use [096]
  c.dropout_ahead = kb.meta<bool>(mn::kDropoutAhead, false);
  c.dropout_pairs = kb.meta<bool>(mn::kDropoutPairs, true);
  if (c.positive_scale && s.modded()) kb.fail(Loc::current(), "POSITIVE_SCALE takes no SCORE_MOD: the mod needs the scaled scores");
  c.heavy_first_sections = kb.meta<bool>(mn::kHeavyFirstSections, true);
  if (c.rng_warps && (!s.dropout || s.dropout_bits || s.library_mask() || s.varlen || *c.pingpong || c.block_n % 64 != 0))
    kb.fail(Loc::current(), fmt::format("RNG_WARPS = {} generates the fused dropout mask on warps of its own: it needs DROPOUT=true "
                                        "without DROPOUT_BITS, a full or causal mask, dense tensors, no PINGPONG and BLOCK_N a "
                                        "multiple of 64 (got BLOCK_N = {})", c.rng_warps, c.block_n));
  // +7% at S1k, +1-3% at S2k-16k; with fused dropout 0.83-0.88 (the Philox softmax twice) [045]
  // (with RNG_WARPS the keep words come through a channel popped in the loop)
  c.pv_peel = kb.meta<bool>(mn::kPvPeel, !s.dropout) && *c.pipeline_pv && !*c.pipeline_qk && !c.rng_warps;
  c.persistent = kb.meta<bool>(mn::kPersistent, false);
  if (*c.persistent && (s.varlen || c.rng_warps))
    kb.fail(Loc::current(), fmt::format("PERSISTENT walks the tiles of dense batches without warp roles of its own; it does not combine "
                                        "with {}", s.varlen ? "VARLEN=true" : "RNG_WARPS"));
  // O by TMA stores, staged in the last V block's tile (the persistent grid) or Q's (decisions 056,
  // 076): causal +1-10% (S 1k-16k); full +1-8% once the staging offsets stay out of the key loop
  // (STORE_OFFSETS_LATE). (BLOCK_N >= BLOCK_M: a tile to stage in, so that no staging tile of its
  // own has to fit beside the rings; not persistent with dropout, which then spills 312 B.)
  // D 64 dense without dropout (no producer; staged in Q's tile): 1.005-1.025 full, 1.015-1.024 causal [078].
  const bool d64_plain = s.head_dim == 64 && !s.library_mask() && !s.varlen && !s.modded() && !s.dropout;
  c.tma_store = kb.meta<bool>(mn::kTmaStore, (*c.ring_producer || d64_plain) && c.block_n >= c.block_m && !(s.dropout && *c.persistent));
  c.timeline = kb.meta<bool>(mn::kTimeline, false);
  if (c.timeline && (c.rng_warps || s.varlen))
    kb.fail(Loc::current(), "TIMELINE stamps dense tiles on the consumer warps: not with RNG_WARPS or VARLEN");
  c.store_offsets_late = kb.meta<bool>(mn::kStoreOffsetsLate, true) && *c.tma_store;  // [076]
  c.descriptors_at_use = kb.meta<bool>(mn::kDescriptorsAtUse, false);  // [077]
  c.k0_before_v_last = kb.meta<bool>(mn::kK0BeforeVLast, true) && *c.pv_peel;  // [078]
  c.overlap_tiles = kb.meta<bool>(mn::kOverlapTiles, false);  // [079]
  if (*c.overlap_tiles && !(*c.persistent && *c.pv_peel && !*c.pingpong && !s.library_mask()))
    kb.fail(Loc::current(), fmt::format("OVERLAP_TILES runs a tile's first key block beside the previous tile's last P V: it needs "
                                        "PERSISTENT=true and PV_PEEL (PIPELINE_PV without PIPELINE_QK), no PINGPONG and a full or "
                                        "causal mask (got PERSISTENT={} PV_PEEL={} PINGPONG={} MASK={})",
                                        *c.persistent, *c.pv_peel, *c.pingpong, mask_kind_name(s.mask)));
  c.lazy_rescale = kb.meta<bool>(mn::kLazyRescale, false);
  c.coordinates_at_use = kb.meta<bool>(mn::kCoordinatesAtUse, false);  // [114]
  if (*c.coordinates_at_use && !*c.ring_producer)
    kb.fail(Loc::current(), "COORDINATES_AT_USE is a choice of the ring producer's consumers: it needs RING_PRODUCER=true");
  return c;
}

// ---- the backward ----

namespace {

// VARLEN, refused with BSHD (as in the forward).
bool read_varlen(Builder& kb, bool bshd) {
  const bool varlen = kb.meta<bool>(mn::kVarlen, false);
  if (varlen && bshd)
    kb.fail(Loc::current(), "VARLEN tensors are [total_tokens, heads, head_dim]; BSHD does not apply to them");
  return varlen;
}

// MASK (the forward's): full and causal run the CAUSAL code path (MASK=causal is CAUSAL=true);
// the other kinds are library masks, on dense batches without CAUSAL for now. `causal` as read.
MaskKind read_backward_mask(Builder& kb, bool causal, bool varlen) {
  const MaskKind kind = mask_kind_meta(kb, mn::kMask);
  if (kind != MaskKind::full && kind != MaskKind::causal && (causal || varlen))
    kb.fail(Loc::current(), fmt::format("MASK={} ({}) does not combine with {} yet (use the mask alone: the causal kinds cover causal "
                                        "patterns, document masks packed sequences)",
                                        static_cast<int>(kind), mask_kind_name(kind), causal ? "CAUSAL=true" : "VARLEN=true"));
  return kind;
}

// DQ_REDUCTION (dense batches only for the atomic, split and ordered forms).
DqReduction read_dq_reduction(Builder& kb, bool varlen) {
  const int64_t value = kb.meta<int>(mn::kDqReduction, 0);
  if (value < 0 || value > 3)
    kb.fail(Loc::current(), fmt::format("meta-parameter DQ_REDUCTION = {} is not a dQ reduction; valid: 0 recompute (the "
                                        "attention_bwd_dq kernel), 1 atomic, 2 split, 3 ordered",
                                        value));
  const auto reduction = static_cast<DqReduction>(value);
  if (reduction != DqReduction::recompute && varlen)
    kb.fail(Loc::current(), fmt::format("DQ_REDUCTION={} ({}) does not combine with VARLEN=true yet (its workspaces are laid out "
                                        "per dense [batch, heads_q, seq_q]); use DQ_REDUCTION=0 (recompute)",
                                        value, dq_reduction_name(reduction)));
  return reduction;
}

// The spec and tiles of the dK/dV and dQ kernels: DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD,
// VARLEN, MASK, DROPOUT, DROPOUT_BITS (SCORE_MOD comes after the kernel's own metas).
void read_gradient_spec(Builder& kb, AttentionSpec& s, int64_t& block_m, int64_t& block_n) {
  s.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  block_m = kb.meta<int>(mn::kBlockM, 64);
  block_n = kb.meta<int>(mn::kBlockN, 64);
  s.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  s.causal = kb.meta<bool>(mn::kCausal, false);
  s.bshd = kb.meta<bool>(mn::kBshd, false);
  s.varlen = read_varlen(kb, s.bshd);
  s.mask = read_backward_mask(kb, s.causal, s.varlen);
  if (s.mask == MaskKind::causal) s.causal = true;
  s.dropout = kb.meta<bool>(mn::kDropout, false);
  s.dropout_bits = read_dropout_bits(kb, s.dropout, s.varlen, block_n);
}

}  // namespace

Meta DkdvConfig::to_meta() const {
  Meta m;
  put_core(m, spec, block_m, block_n);
  put_spec(m, spec);
  put_if(m, mn::kPartialTilesOnly, partial_tiles_only, true);
  if (dq_reduction != DqReduction::recompute) m.emplace_back(mn::kDqReduction, static_cast<int64_t>(dq_reduction));
  put_if(m, mn::kQDescending, q_descending, false);
  put_if(m, mn::kMaskedBlocksApart, masked_blocks_apart, false);
  put_if(m, mn::kPersistent, persistent, false);
  put_if(m, mn::kRowsAhead, rows_ahead);
  put_if(m, mn::kLseInRing, lse_in_ring, false);
  put_if(m, mn::kHeavyFirstSections, heavy_first_sections, false);
  put_if(m, mn::kRingProducer, ring_producer);
  put_if(m, mn::kAccumulate, accumulate, false);
  put_if(m, mn::kDqWriter, dq_writer, false);
  put_if(m, mn::kDescriptorsAtUse, descriptors_at_use);
  if (timeline) m.emplace_back(mn::kTimeline, true);
  put_if(m, mn::kTmaStore, tma_store);
  if (producer_registers) m.emplace_back(mn::kProducerRegisters, static_cast<int64_t>(*producer_registers));
  put_if(m, mn::kDropoutWriteBits, dropout_write_bits, false);
  put_if(m, mn::kDropoutWordsKeyMajor, dropout_words_key_major, false);
  put_if(m, mn::kDropoutAhead, dropout_ahead, false);
  put_if(m, mn::kDqNarrowStaging, dq_narrow_staging, false);
  put_if(m, mn::kDqStagingAtUse, dq_staging_at_use);
  put_if(m, mn::kCoordinatesAtUse, coordinates_at_use);
  return m;
}

DkdvConfig DkdvConfig::read(Builder& kb) {
  DkdvConfig c;
  AttentionSpec& s = c.spec;
  read_gradient_spec(kb, s, c.block_m, c.block_n);
  c.partial_tiles_only = kb.meta<bool>(mn::kPartialTilesOnly, true);
  c.dq_reduction = read_dq_reduction(kb, s.varlen);
  c.q_descending = kb.meta<bool>(mn::kQDescending, false);
  c.masked_blocks_apart = kb.meta<bool>(mn::kMaskedBlocksApart, false);
  c.persistent = kb.meta<bool>(mn::kPersistent, false);
  // on except causal at D >= 128, where the registers it takes cost more than the latency it hides [026]
  c.lse_in_ring = kb.meta<bool>(mn::kLseInRing, false);
  // (LSE_IN_RING reads them from each block's own stage: nothing to load ahead). Dropout on recompute
  // (dense, D <= 128): on, measured beside TMA_STORE and DESCRIPTORS_AT_USE below [089]
  const bool dropout_dense = s.dropout && c.dq_reduction == DqReduction::recompute && s.head_dim <= 128 && !s.library_mask() && !s.varlen;
  c.rows_ahead = kb.meta<bool>(mn::kRowsAhead, (!(s.causal && s.head_dim >= 128) || dropout_dense) && !c.lse_in_ring);
  // off: dK/dV's launch order is heaviest first within a head already; sections do not pay here [018]
  c.heavy_first_sections = kb.meta<bool>(mn::kHeavyFirstSections, false);
  s.score_mod = score_mod_kind_meta(kb, mn::kScoreMod);
  const DqReduction r = c.dq_reduction;
  if (r == DqReduction::ordered && s.library_mask())
    kb.fail(Loc::current(), "DQ_REDUCTION=3 (ordered) takes the full and causal masks only (its wait targets count every earlier "
                            "key block); use atomic or split with library masks");
  if (c.q_descending && (s.library_mask() || r == DqReduction::split))
    kb.fail(Loc::current(), "Q_DESCENDING applies to the full and causal walks without the split reduction");
  if (c.masked_blocks_apart && (!s.causal || c.q_descending || c.persistent || s.library_mask()))
    kb.fail(Loc::current(), fmt::format("MASKED_BLOCKS_APART splits the causal walk (CAUSAL=true, ascending, not PERSISTENT, no library "
                                        "mask); got CAUSAL={}{}{}{}", s.causal, c.q_descending ? ", Q_DESCENDING" : "",
                                        c.persistent ? ", PERSISTENT" : "", s.library_mask() ? ", MASK" : ""));
  if (c.persistent && ((r != DqReduction::ordered && r != DqReduction::atomic) || c.q_descending || s.varlen ||
                       (r == DqReduction::atomic && s.library_mask())))
    kb.fail(Loc::current(), fmt::format("PERSISTENT takes DQ_REDUCTION=3 (ordered: DASH's shift order) or 1 (atomic: launch order, "
                                        "no library mask) on dense batches without Q_DESCENDING; got DQ_REDUCTION={}{}{}{}",
                                        static_cast<int>(r), c.q_descending ? ", Q_DESCENDING" : "", s.varlen ? ", VARLEN" : "",
                                        s.library_mask() ? ", MASK" : ""));
  c.ring_producer = kb.meta<bool>(mn::kRingProducer, false);
  c.accumulate = kb.meta<bool>(mn::kAccumulate, false);
  c.dq_writer = kb.meta<bool>(mn::kDqWriter, false);
  // (GPU-run: full and causal walks, one key tile a program or PERSISTENT's launch order; the
  // persistent runs hung until the LLVM backend's waits became convergent, decision 074. Library
  // masks' walks (intervals, the pre-pass's lists): the emulator only so far, decision 102)
  if (c.dq_writer && ((r != DqReduction::atomic && r != DqReduction::ordered) || !*c.ring_producer))
    kb.fail(Loc::current(), fmt::format("DQ_WRITER hands dQ's adds to a warp of the producer warpgroup: it needs DQ_REDUCTION=1 "
                                        "(atomic) or 3 (ordered) and RING_PRODUCER=true; got DQ_REDUCTION={}, RING_PRODUCER={}",
                                        static_cast<int>(r), *c.ring_producer));
  if (c.lse_in_ring && *c.rows_ahead)
    kb.fail(Loc::current(), "LSE_IN_RING reads LSE and Delta from each block's own ring stage: not with ROWS_AHEAD=true (which carries "
                            "them to the next block)");
  // Ordered full on the writer (the deterministic default from S 8k): spill-free (248 -> 0 B) with
  // descriptors at use, TMA stores and a producer of 40 registers, measured level (0.993x after
  // 086's lowering fixes; 0.977-0.989x before them, 080): taken for issue 23's "no spills" [101]
  const bool ordered_full_writer = r == DqReduction::ordered && !s.causal && !c.q_descending && c.dq_writer && s.head_dim == 128;
  const bool adds = r == DqReduction::atomic || r == DqReduction::split || (r == DqReduction::ordered && (s.causal || c.q_descending)) ||
                    ordered_full_writer;
  // Dropout (recompute, dense, D <= 128): with TMA_STORE the spills go 240 -> 28-80 B at D 128 and
  // the kernel runs 1.18x / 1.22x (fused, full / causal) and 1.03x / 1.14x (reading bits); D 64
  // 1.01-1.03x [089]
  const bool dropout_recompute = dropout_dense && !s.modded();
  // (D 64 with a reduction on 128-row blocks, atomic's default there: hoisted descriptors spilled
  // 108 B, reloaded in the loop; at use 12-16 B, 0 B with 103's offsets; untimed [101, 102])
  c.descriptors_at_use =
      kb.meta<bool>(mn::kDescriptorsAtUse, ((s.head_dim == 128 || c.block_m == 128) && adds) || dropout_recompute);  // [077, 080, 089]
  c.timeline = kb.meta<bool>(mn::kTimeline, false);
  if (c.timeline && (s.varlen || s.library_mask()))
    kb.fail(Loc::current(), "TIMELINE stamps the key tiles of dense full or causal batches: not with VARLEN or a library MASK");
  // Atomic: 1.017 / 1.122 at D 128 full / causal, 1.022 at D 64; recompute 1.021 / 1.031 at D 128,
  // 1.017 / 1.018 at D 64; ordered causal at D 128 ~1.04 (S 4k, dense, same-process A/Bs). Ordered
  // full: above (without the writer element stores); masks,
  // score mods, varlen, D64 ordered, D > 128 and dropout beside a reduction are not measured [080];
  // dropout on recompute: with DESCRIPTORS_AT_USE, above [089].
  // (library masks on the dQ writer: spills 300-508 B without TMA stores, 0-384 B with them; untimed [102])
  const bool measured = (s.head_dim <= 128 && !s.library_mask() && !s.dropout && !s.modded() && !s.varlen) || dropout_recompute ||
                        (c.dq_writer && s.library_mask() && !s.dropout && !s.modded());
  const bool ordered_causal = r == DqReduction::ordered && s.causal && !c.q_descending && s.head_dim == 128;
  const bool tma_reduction = r == DqReduction::atomic || r == DqReduction::recompute || ordered_causal || ordered_full_writer;
  c.tma_store = kb.meta<bool>(mn::kTmaStore, measured && tma_reduction && !c.accumulate);
  if (*c.tma_store && c.accumulate)
    kb.fail(Loc::current(), "TMA_STORE stores dK and dV by TMA: not with ACCUMULATE (f32 sums read, added and stored per element)");
  // (40 takes the ordered walk's spills out of its producer and writer: level, 0.988x full, 1.0x
  // causal beside TMA_STORE [080]; ordered full on the writer takes it, above)
  c.producer_registers = kb.meta<int>(mn::kProducerRegisters, ordered_full_writer ? 40 : 24);
  if (*c.producer_registers != 24 && *c.producer_registers != 32 && *c.producer_registers != 40)
    kb.fail(Loc::current(), fmt::format("PRODUCER_REGISTERS = {} (valid: 24, 32 or 40; the consumers get 240 registers at 24 and 232 "
                                        "above)", *c.producer_registers));
  if (*c.producer_registers != 24 && !*c.ring_producer)
    kb.fail(Loc::current(), "PRODUCER_REGISTERS sets the producer warpgroup's registers: it needs RING_PRODUCER=true");
  c.dropout_write_bits = kb.meta<bool>(mn::kDropoutWriteBits, false);
  if (c.dropout_write_bits && (!s.dropout || s.dropout_bits || s.varlen || s.library_mask() || r != DqReduction::recompute ||
                               c.block_n % 64 != 0))
    kb.fail(Loc::current(), fmt::format("DROPOUT_WRITE_BITS stores the fused mask's words for a dQ kernel to read: it needs DROPOUT=true "
                                        "without DROPOUT_BITS, dense tensors, the full or causal mask, DQ_REDUCTION=0 (recompute) and "
                                        "BLOCK_N a multiple of 64 (whole Philox groups); got DROPOUT={}, DROPOUT_BITS={}, VARLEN={}, "
                                        "MASK={}, DQ_REDUCTION={}, BLOCK_N={}",
                                        s.dropout, s.dropout_bits, s.varlen, s.library_mask(), static_cast<int>(r), c.block_n));
  c.dropout_words_key_major = kb.meta<bool>(mn::kDropoutWordsKeyMajor, false);
  if (c.dropout_words_key_major && !c.dropout_write_bits)
    kb.fail(Loc::current(), "DROPOUT_WORDS_KEY_MAJOR lays out the words DROPOUT_WRITE_BITS stores: it needs DROPOUT_WRITE_BITS=true");
  c.dropout_ahead = kb.meta<bool>(mn::kDropoutAhead, false);
  if (c.dropout_ahead && (!s.dropout || s.dropout_bits || c.block_n % 64 != 0))
    kb.fail(Loc::current(), fmt::format("DROPOUT_AHEAD in dK/dV computes the fused mask's Philox words under S^T's MMA: it needs "
                                        "DROPOUT=true without DROPOUT_BITS and BLOCK_N a multiple of 64; got DROPOUT={}, "
                                        "DROPOUT_BITS={}, BLOCK_N={}", s.dropout, s.dropout_bits, c.block_n));
  // On where timed: atomic, dense, D <= 128: 1.028 / 1.024 at D128 full / causal, 1.074 / 1.071 at
  // D64 (S 4k, --backward-ab on the writer, outputs identical); ordered 0.87-0.88x (its writer waits
  // for each add's 16 smaller copies before it signals the next); the rest untimed [100]
  c.dq_narrow_staging = kb.meta<bool>(mn::kDqNarrowStaging, measured && !dropout_recompute && r == DqReduction::atomic);
  if (c.dq_narrow_staging && r != DqReduction::atomic && r != DqReduction::ordered)
    kb.fail(Loc::current(), fmt::format("DQ_NARROW_STAGING lays out dQ's parts for their TMA adds: it needs DQ_REDUCTION=1 (atomic) or "
                                        "3 (ordered), got DQ_REDUCTION={}", static_cast<int>(r)));
  // (D 64 writer 12 / 16 -> 0 B spilled, dropout on the writer 252 -> 104 B, causal document 120 ->
  // 48 B, block sparse 332 -> 260 B, without the producer at the 255 cap: D 128 causal atomic 144 ->
  // 84 B, ordered 296 -> 256 B; with the ring vectors' reads at use. D 128 dense on the producer
  // spills nothing without it, and the recomputed offsets cost ~25 instructions a visit) [103]
  const bool tight = c.block_m == 128 || s.dropout || s.library_mask() || !*c.ring_producer;
  c.dq_staging_at_use = kb.meta<bool>(mn::kDqStagingAtUse, r != DqReduction::recompute && tight);
  c.coordinates_at_use = kb.meta<bool>(mn::kCoordinatesAtUse, false);  // [114]
  if (*c.coordinates_at_use && !*c.ring_producer)
    kb.fail(Loc::current(), "COORDINATES_AT_USE is a choice of the ring producer's consumers: it needs RING_PRODUCER=true");
  return c;
}

Meta DqConfig::to_meta() const {
  Meta m;
  put_core(m, spec, block_m, block_n);
  put_spec(m, spec);
  put_if(m, mn::kPartialTilesOnly, partial_tiles_only, true);
  put_if(m, mn::kHeavyFirstSections, heavy_first_sections, true);
  put_if(m, mn::kAccumulate, accumulate, false);
  put_if(m, mn::kDropoutAhead, dropout_ahead, false);
  put_if(m, mn::kDropoutWordsKeyMajor, dropout_words_key_major, false);
  return m;
}

DqConfig DqConfig::read(Builder& kb) {
  DqConfig c;
  AttentionSpec& s = c.spec;
  read_gradient_spec(kb, s, c.block_m, c.block_n);
  c.partial_tiles_only = kb.meta<bool>(mn::kPartialTilesOnly, true);
  c.heavy_first_sections = kb.meta<bool>(mn::kHeavyFirstSections, true);
  s.score_mod = score_mod_kind_meta(kb, mn::kScoreMod);
  c.accumulate = kb.meta<bool>(mn::kAccumulate, false);
  // (the words' global-load latency under S's and dP's wgmmas; fused Philox ahead would hold its
  // calls' registers through both dots: not offered). Off by default: 0.96-1.01x measured [095, 096]
  c.dropout_ahead = kb.meta<bool>(mn::kDropoutAhead, false);
  if (c.dropout_ahead && !s.dropout_bits)
    kb.fail(Loc::current(), "DROPOUT_AHEAD in dQ loads the precomputed mask's words ahead: it needs DROPOUT_BITS=true");
  c.dropout_words_key_major = kb.meta<bool>(mn::kDropoutWordsKeyMajor, false);
  if (c.dropout_words_key_major && !s.dropout_bits)
    kb.fail(Loc::current(), "DROPOUT_WORDS_KEY_MAJOR reads key-major mask words (dK/dV's DROPOUT_WRITE_BITS): it needs DROPOUT_BITS=true");
  return c;
}

Meta PreprocessConfig::to_meta() const {
  Meta m{{mn::kDtype, spec.dtype}, {mn::kBlockM, block_m}, {mn::kHeadDim, spec.head_dim}, {mn::kBshd, spec.bshd}};
  if (spec.varlen) m.emplace_back(mn::kVarlen, true);
  return m;
}

PreprocessConfig PreprocessConfig::read(Builder& kb) {
  PreprocessConfig c;
  AttentionSpec& s = c.spec;
  s.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  c.block_m = kb.meta<int>(mn::kBlockM, 64);
  s.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  s.bshd = kb.meta<bool>(mn::kBshd, false);
  s.varlen = read_varlen(kb, s.bshd);
  return c;
}

Meta DqConvertConfig::to_meta() const {
  return Meta{{mn::kDtype, spec.dtype}, {mn::kBlockM, block_m}, {mn::kHeadDim, spec.head_dim}, {mn::kBshd, spec.bshd},
              {mn::kAccumulate, accumulate}};
}

DqConvertConfig DqConvertConfig::read(Builder& kb) {
  DqConvertConfig c;
  AttentionSpec& s = c.spec;
  s.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  c.block_m = kb.meta<int>(mn::kBlockM, 64);
  s.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  s.bshd = kb.meta<bool>(mn::kBshd, false);
  c.accumulate = kb.meta<bool>(mn::kAccumulate, false);
  return c;
}

Meta DqReduceConfig::to_meta() const {
  Meta m;
  put_core(m, spec, block_m, block_n);
  if (spec.library_mask()) m.emplace_back(mn::kMask, static_cast<int64_t>(spec.mask));
  return m;
}

DqReduceConfig DqReduceConfig::read(Builder& kb) {
  DqReduceConfig c;
  AttentionSpec& s = c.spec;
  read_core(kb, s, c.block_m, c.block_n);
  s.bshd = kb.meta<bool>(mn::kBshd, false);
  s.mask = read_backward_mask(kb, s.causal, /*varlen=*/false);
  if (s.mask == MaskKind::causal) s.causal = true;
  return c;
}

// ---- the block-mask pre-pass ----

Meta BlockClassesConfig::to_meta() const {
  return Meta{{mn::kBlockM, block_m}, {mn::kBlockN, block_n}, {mn::kMask, static_cast<int64_t>(mask)}, {mn::kTiles, tiles}};
}

BlockClassesConfig BlockClassesConfig::read(Builder& kb, bool library_mask) {
  BlockClassesConfig c;
  c.block_m = kb.meta<int>(mn::kBlockM, 128);
  c.block_n = kb.meta<int>(mn::kBlockN, 128);
  c.tiles = kb.meta<int>(mn::kTiles, 1);
  if (c.tiles < 1) kb.fail(Loc::current(), fmt::format("TILES = {} must be at least 1", c.tiles));
  if (library_mask) c.mask = mask_kind_meta(kb, mn::kMask);
  return c;
}

Meta BlockListsConfig::to_meta() const { return Meta{{mn::kKvMajor, kv_major}}; }

BlockListsConfig BlockListsConfig::read(Builder& kb) {
  BlockListsConfig c;
  c.kv_major = kb.meta<bool>(mn::kKvMajor, false);
  return c;
}

}  // namespace tilejit::kernels
