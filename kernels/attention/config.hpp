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
  std::optional<bool> pipeline_qk;      // S_{j+1} issued before softmax_j; unset: D 128 dense, no dropout/mod [006]
  bool positive_scale = false;          // the caller promises softmax_scale > 0: the fma softmax [009]
  std::optional<bool> dropout_ahead;    // the mask's inputs issued beside S's MMA; unset: with dropout_bits [012, 013]
  bool dropout_pairs = true;            // the keep-mask on rounded 16-bit pairs [011]
  bool heavy_first_sections = true;     // dense causal: heaviest query tiles first across heads [018]
  // Variants that measured slower (kernels/attention/forward_experimental.cpp):
  bool pingpong = false;     // warpgroups take turns issuing MMAs [008]
  bool pipeline_pv = false;  // P_{j-1} V_{j-1} in flight during softmax_j [007]
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

}  // namespace tilejit::kernels
