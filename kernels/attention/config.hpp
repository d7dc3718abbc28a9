// The typed configurations of the attention kernels: every compile-time choice of a kernel as a
// field with its default. A kernel's body reads its configuration first (Config::read declares
// the metas, checks their combinations, resolves the defaults); callers build one and pass
// to_meta(). The meta names live in kernels/meta_names.hpp; the default *schedules* (tiles,
// warps, stages per shape) in api/attention/schedules.cpp.
#pragma once
#include <cstdint>
#include <optional>

#include "dsl/lang.hpp"
#include "kernels/attention/mask_host.hpp"

namespace tilejit::kernels {

// How the backward sums dQ over the key tiles (the dK/dV kernel's DQ_REDUCTION; the API's
// attention::DqReduction is this type): recompute (a separate dQ kernel, the default), atomic,
// split, ordered. api/attention.hpp documents each.
enum class DqReduction : int { recompute = 0, atomic = 1, split = 2, ordered = 3 };
inline const char* dq_reduction_name(DqReduction r) {
  switch (r) {
    case DqReduction::recompute: return "recompute";
    case DqReduction::atomic: return "atomic";
    case DqReduction::split: return "split";
    case DqReduction::ordered: return "ordered";
  }
  return "?";
}

// What every attention kernel of one call is specialised on: element type, head dim, memory
// layout and the function computed (mask, score mod, dropout). The forward and the backward
// kernels of a call share it.
struct AttentionSpec {
  ir::DType dtype = ir::DType::bf16;
  int64_t head_dim = 64;
  bool bshd = false;    // tensors [B, S, H, D] (else [B, H, S, D])
  bool varlen = false;  // packed sequences [total, H, D] with cumulative offsets
  bool causal = false;  // bottom-right aligned (MASK = causal is the same)
  MaskKind mask = MaskKind::full;  // a library mask is any kind but full and causal
  ScoreModKind score_mod = ScoreModKind::none;
  bool dropout = false;
  bool dropout_bits = false;  // read the precomputed packed keep-mask instead of running Philox

  bool library_mask() const { return mask != MaskKind::full && mask != MaskKind::causal; }
  bool modded() const { return score_mod != ScoreModKind::none; }
};

// attention_fwd (kernels/attention/forward.cpp). The schedule choices and why each default is
// what it is: docs/decisions/ (numbers in brackets).
struct ForwardConfig {
  AttentionSpec spec;
  int64_t block_m = 64, block_n = 64;
  bool return_mask = false;  // tests: also write the keep bits of every visited block (needs dropout)

  std::optional<bool> exact_normalize;  // O = acc / l by division; unset: D 64 without dropout [002, 003]
  std::optional<bool> pipeline_qk;      // S_{j+1} issued before softmax_j; unset: D 128 dense, no dropout, no PV [006]
  bool positive_scale = false;          // the caller promises softmax_scale > 0: the fma softmax [009]
  std::optional<bool> dropout_ahead;    // the mask's inputs issued beside S's MMA; unset: off (measured slower: 096) [012, 013]
  bool dropout_pairs = true;            // the keep-mask on rounded 16-bit pairs [011]
  bool heavy_first_sections = true;     // dense causal: heaviest query tiles first across heads [018]
  // K / V rings filled by a producer warpgroup; unset: D 128 dense (no library mask, varlen or mod) [044]
  std::optional<bool> ring_producer;
  std::optional<bool> pipeline_pv;  // P_{j-1} V_{j-1} in flight during softmax_j; unset: with the producer [007, 045]
  std::optional<bool> pingpong;     // warpgroups take turns issuing MMAs; unset: off [008, 045]
  // PIPELINE_PV without PIPELINE_QK: block 0's S and softmax before the loop (K_0 a one-off tile), so
  // no iteration multiplies P_{-1} = 0 by V_0, and the last V copied in the prologue; unset: no dropout [045]
  std::optional<bool> pv_peel;
  // A persistent 1-D grid walks the tiles (the launch gives it one program per multiprocessor);
  // the ring producer then copies the next tile's blocks during this one's end; unset: off
  std::optional<bool> persistent;
  // O leaves through a shared staging tile and TMA bulk stores (lang::StoreOptions::tma: issue
  // 22's epilogue), so the next tile's work overlaps its global writes; unset: off (not yet
  // measured on the GPU)
  std::optional<bool> tma_store;
  // With TMA_STORE: the staging offsets computed in the epilogue (StoreOptions::offsets_at_store)
  // rather than hoisted to the kernel's entry, where they held ~16 registers through the key loop
  // and ptxas scheduled its softmax worse (full +1-2%; causal level); unset: on [076]
  std::optional<bool> store_offsets_late;
  // Every dot's wgmma descriptors built at the dot (DotOptions::descriptors_at_use), not hoisted
  // into registers live through the key loop (Q's: two a k step); unset: off (full 0.98-0.99x,
  // causal 1.01x: nothing spills here) [077]
  std::optional<bool> descriptors_at_use;
  // With PV_PEEL: the tile's K_0 is loaded before its last V block, so that the producer (which
  // copies in program order) is not held at the last V's stage -- the previous tile's O staging
  // until its TMA store has read it -- before it copies K_0; unset: on (D128 full S 1k 1.018x,
  // 1.002-1.008x elsewhere) [078]
  std::optional<bool> k0_before_v_last;
  // PERSISTENT with PV_PEEL: a tile's S_0 is issued beside the previous tile's last P V, its
  // softmax_0 runs while that P V computes, and the previous tile's O is stored after it
  // (forward_experimental.cpp), so the tensor cores do not idle through a whole tile boundary;
  // unset: off (0.93-0.955x: the next Q has no buffer to land in early, and ptxas swaps P's
  // halves every block) [079]
  std::optional<bool> overlap_tiles;
  // O's rescale by lang::scale_lazily: a warp whose rows kept their running max skips the 64
  // multiplies a thread (bit-identical); unset: off (not yet measured on a GPU)
  std::optional<bool> lazy_rescale;
  // With RING_PRODUCER: RingProducer::coordinates_at_use (the consumers' layout coordinates
  // inside loops from opaque copies of the lane and warp: the document masks' 64 hoisted key-column
  // indices and conversion addresses); unset: off (untimed) [114]
  std::optional<bool> coordinates_at_use;
  // Instrumentation: a last parameter `timeline` (u64 [tiles, kTimelineStamps, 32]; tile (b, h, m) =
  // (b * heads + h) * query blocks + m) takes each
  // warp's cycle counter at the tile's start, around every key block's phases and at its end
  // (lang::timestamp; attention_bench --timeline reads it). Off: no parameter, no code.
  bool timeline = false;
  static constexpr int64_t kTimelineStamps = 648;  // 2 + 5 x 129 blocks + the end: S 16k at BLOCK_N 128
  static constexpr int64_t kTimelineEpilogue = kTimelineStamps - 4;  // last P V issued, O normalised, O stored
  // Variants that measured slower (kernels/attention/forward_experimental.cpp):
  int64_t rng_warps = 0, mma_registers = 0, rng_registers = 0;  // Philox on warps of its own [014]

  // The metas: the tiles and the spec's dtype, head dim, causal and layout always, everything else
  // where it differs from its default.
  lang::Meta to_meta() const;
  // In attention_fwd's body: reads (declares) every meta, refuses bad combinations, resolves the
  // defaults (the optionals come back set).
  static ForwardConfig read(lang::Builder& kb);
};

// The DROPOUT_BITS meta (read by the forward, dK/dV and dQ), checked against their other metas.
bool read_dropout_bits(lang::Builder& kb, bool dropout, bool varlen, int64_t block_n);

// ---- the backward (kernels/attention/backward.hpp documents each kernel and meta) ----
//
// The backward kernels read the spec's metas in the order DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM,
// CAUSAL, BSHD, VARLEN, MASK, DROPOUT, DROPOUT_BITS (each kernel the ones it has), their own
// choices after them and SCORE_MOD last. Library masks there do not combine with CAUSAL or VARLEN.

// attention_bwd_dkdv (kernels/attention/dkdv.cpp): dK, dV per key tile and, with a dQ reduction,
// dQ's parts.
struct DkdvConfig {
  AttentionSpec spec;
  int64_t block_m = 64, block_n = 64;  // the query and key tile [021]
  bool partial_tiles_only = true;      // the element mask on partial tiles only (not with a score mod) [020]
  DqReduction dq_reduction = DqReduction::recompute;  // [023]; atomic [024]; ordered [025]
  bool q_descending = false;           // full / causal walks, not split: query tiles last to first [025]
  // Causal walks: the query blocks that cross the diagonal (or a key tile past S_k) in a loop of
  // their own with the element mask, the rest in a second loop with no mask code (FlashAttention-3's
  // split); the two loops share one Q / dO ring (a ring chain) [063]
  bool masked_blocks_apart = false;
  bool persistent = false;             // dense, not q_descending: ordered on DASH's grid [025]; atomic in launch order [071]
  std::optional<bool> rows_ahead;      // LSE / Delta a query block ahead; unset: not causal at D >= 128 [026]
  // LSE and Delta by TMA into each Q / dO stage, read from shared memory in S^T's layout where used:
  // no exchange through shared memory, no barrier in the loop (FA3's way; issue 23). Not with
  // ROWS_AHEAD=true (its default becomes false); off here, the API's choice per call [070]
  bool lse_in_ring = false;
  bool heavy_first_sections = false;   // dense causal, not persistent: heavy key tiles first across heads [018]
  // Q / dO rings filled by a producer warpgroup (lang::ring_producer; setmaxnreg 240 for the
  // consumers); unset: off here; the API's for the atomic reduction at D 128 full [070]
  std::optional<bool> ring_producer;
  // dK and dV are f32 and receive += the gradients (gradient accumulation; context parallelism's
  // sums without a separate pass): the epilogue loads, adds and stores
  bool accumulate = false;
  // The atomic or ordered reduction under RING_PRODUCER, full or causal: a warp of the producer
  // warpgroup issues dQ's TMA adds (lang::RingProducer::reduce_writer, FlashAttention-3's dQ
  // writer); ordered, it also waits for each add's turn and passes it on [073, 074]
  bool dq_writer = false;
  // Every dot's wgmma descriptors computed at the dot (DotOptions::descriptors_at_use) instead of
  // hoisted out of the query loop into registers live through it (two per k step of K and V);
  // unset: at D 128 with the atomic or split reduction, or ordered on a causal or descending walk
  // (1.06-1.22x there; ordered full 0.93-0.96x and recompute 0.96-0.99x, so off) [077]
  std::optional<bool> descriptors_at_use;
  // Instrumentation (as the forward's): a last parameter `timeline` (u64 [key tiles, kTimelineStamps,
  // 32]; key tile (b, kv head, n) = (b * kv heads + kv head) * key tiles + n) takes each warp's
  // cycle counter at the key tile's start, at the phases of every query block it visits and at its
  // end (bench/attention_timeline --backward reads it). Dense tensors. Off: no parameter, no code.
  bool timeline = false;
  // dK and dV by TMA stores (staged in shared memory, offsets computed at the store, coordinates
  // clamped into TMA's range so that no element-store fallback holds registers through the query
  // loop; not with ACCUMULATE); unset: atomic, recompute and ordered causal at D 128, dense [080]
  std::optional<bool> tma_store;
  // With RING_PRODUCER: the producer warpgroup's registers under setmaxnreg: 24 (the consumers get
  // 240), 32 or 40 (232: the ordered walk's producer and writer then do not spill, but it measured
  // level); unset: 24 [080]
  std::optional<int> producer_registers;
  // fused dropout: the mask's packed words this kernel draws also stored to `dropout_bits_out`
  // (u32 [B * Hq, S_q, cdiv(S_k, 32)]), for a dQ reading them (DROPOUT_BITS) instead of drawing
  // them again (docs/dropout-backward-mask-once.md)
  bool dropout_write_bits = false;
  // with dropout_write_bits: `dropout_bits_out` takes any strides, for the API's key-major words
  // (strides [W * S_q, 1, S_q]: a block's words are whole runs of rows; row-major, each 32-byte
  // sector took 8 bytes from each of 4 key tiles at different times: 1.08-1.22x dK/dV: decision 097)
  bool dropout_words_key_major = false;
  // fused dropout: the block's Philox words computed right after S^T = K Q^T is issued (under its MMA
  // and the exponent) instead of after dP^T's issue; off by default (untimed) [098]
  bool dropout_ahead = false;
  // DQ_REDUCTION atomic, or ordered on the dQ writer (the adds by TMA): dQ's part staged in 32-byte rows without swizzle
  // (lang::AddOptions::narrow_staging): its fragment stores without the 2-way bank conflicts of the
  // 128-byte swizzled rows (33.7 M at D 128 S 4k: decision 100), at 4x the TMA adds; on for atomic
  // (1.02-1.07x), off for ordered (0.87x) [101]
  bool dq_narrow_staging = false;
  // A reduction: dS^T's staging for the dQ dot at offsets computed at use (lang::DotOptions::
  // staging_at_use): 16 registers fewer through the loop, ~25 ALU instructions more a visit; on where
  // the kernels spilled (D 64 on 128-row blocks, dropout, library masks, no producer), untimed [103]
  std::optional<bool> dq_staging_at_use;
  // With RING_PRODUCER: RingProducer::coordinates_at_use (the consumers' layout coordinates inside
  // loops from opaque lane and warp copies); unset: off (untimed) [114]
  std::optional<bool> coordinates_at_use;
  static constexpr int64_t kTimelinePhases = 6;  // top, S^T landed, P^T, dS^T, dV and dK issued, dQ's part
  static constexpr int64_t kTimelineStamps = 2 + kTimelinePhases * 256;  // the start, 256 visits (S 16k at BLOCK_M 64), the end

  // The metas: the tiles and the spec's dtype, head dim, causal and layout always, everything else
  // where it differs from its default.
  lang::Meta to_meta() const;
  // In attention_bwd_dkdv's body: reads every meta, refuses bad combinations, resolves the defaults.
  static DkdvConfig read(lang::Builder& kb);
};

// attention_bwd_dq (kernels/attention/dq.cpp): dQ per query tile, recomputing S and P (the
// recompute reduction's second kernel).
struct DqConfig {
  AttentionSpec spec;
  int64_t block_m = 64, block_n = 64;  // [021, 028]
  bool partial_tiles_only = true;      // [020]
  bool heavy_first_sections = true;    // dense causal: heavy query tiles first across heads [018]
  bool accumulate = false;             // dQ is f32 and receives += the gradient (as DkdvConfig's)
  bool dropout_ahead = false;          // DROPOUT_BITS: a block's mask words loaded before its dots; off by default (measured slower) [095, 096]
  bool dropout_words_key_major = false;  // DROPOUT_BITS: `dropout_bits` takes any strides (dK/dV's key-major words) [097]

  lang::Meta to_meta() const;  // as DkdvConfig's
  static DqConfig read(lang::Builder& kb);
};

// attention_bwd_preprocess (kernels/attention/backward_small.cpp): Delta = rowsum(dO * O). Of the
// spec it reads the dtype, head dim, layout and varlen.
struct PreprocessConfig {
  AttentionSpec spec;
  int64_t block_m = 64;

  lang::Meta to_meta() const;  // DTYPE, BLOCK_M, HEAD_DIM, BSHD; VARLEN when set
  static PreprocessConfig read(lang::Builder& kb);
};

// attention_bwd_dq_convert (backward_small.cpp): dQ = dQ_accum * scale after the atomic and
// ordered reductions. Of the spec: the dtype, head dim and layout (dense only).
struct DqConvertConfig {
  AttentionSpec spec;
  int64_t block_m = 64;  // any: the convert is elementwise
  // ACCUMULATE: dQ is f32 and receives += scale * dQ_accum (accumulate_gradients with the atomic
  // reduction) instead of being written in the dtype
  bool accumulate = false;

  lang::Meta to_meta() const;  // DTYPE, BLOCK_M, HEAD_DIM, BSHD, ACCUMULATE
  static DqConvertConfig read(lang::Builder& kb);
};

// attention_bwd_dq_reduce (backward_small.cpp): dQ from the split reduction's parts. The tiles and
// the mask are the dK/dV kernel's (they say which parts exist). Of the spec: the dtype, head dim,
// causal, layout and mask (dense only).
struct DqReduceConfig {
  AttentionSpec spec;
  int64_t block_m = 64, block_n = 64;

  lang::Meta to_meta() const;  // DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD; MASK for a library mask
  static DqReduceConfig read(lang::Builder& kb);
};

// ---- the block-mask pre-pass (kernels/attention/mask.hpp) ----

// attention_block_classes: the class of every (query tile, key tile) at the attention kernel's
// tiles. block_classes_kernel (a mask of one's own) reads the same metas but MASK.
struct BlockClassesConfig {
  int64_t block_m = 128, block_n = 128;
  int64_t tiles = 1;  // key tiles per program, in sequence: grid (nQB, cdiv(nKB, TILES), Bm * Hm); the API's: kBlockClassTiles
  MaskKind mask = MaskKind::full;

  lang::Meta to_meta() const;  // all four
  // library_mask: the library kernel's MASK too (after the others).
  static BlockClassesConfig read(lang::Builder& kb, bool library_mask = true);
};

// attention_block_lists: the lists from the classes.
struct BlockListsConfig {
  bool kv_major = false;  // per key tile its query tiles (dK/dV's lists), else per query tile its key tiles

  lang::Meta to_meta() const;  // KV_MAJOR
  static BlockListsConfig read(lang::Builder& kb);
};

}  // namespace tilejit::kernels
