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
  put_if(m, mn::kPingpong, pingpong, false);
  put_if(m, mn::kPipelinePv, pipeline_pv, false);
  if (rng_warps != 0) {
    m.emplace_back(mn::kRngWarps, rng_warps);
    m.emplace_back(mn::kMmaRegisters, mma_registers);
    m.emplace_back(mn::kRngRegisters, rng_registers);
  }
  return m;
}

ForwardConfig ForwardConfig::read(Builder& kb) {
  ForwardConfig c;
  AttentionSpec& s = c.spec;
  s.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  c.block_m = kb.meta<int>(mn::kBlockM, 64);
  c.block_n = kb.meta<int>(mn::kBlockN, 64);
  s.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  s.causal = kb.meta<bool>(mn::kCausal, false);
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
  c.pingpong = kb.meta<bool>(mn::kPingpong, false);
  c.exact_normalize = kb.meta<bool>(mn::kExactNormalize, s.head_dim == 64 && !s.dropout);
  s.score_mod = score_mod_kind_meta(kb, mn::kScoreMod);
  c.pipeline_qk = kb.meta<bool>(mn::kPipelineQk, s.head_dim == 128 && !s.dropout && !s.library_mask() && !s.varlen && !s.modded());
  c.pipeline_pv = kb.meta<bool>(mn::kPipelinePv, false);
  c.positive_scale = kb.meta<bool>(mn::kPositiveScale, false);
  c.dropout_ahead = kb.meta<bool>(mn::kDropoutAhead, s.dropout_bits);
  c.dropout_pairs = kb.meta<bool>(mn::kDropoutPairs, true);
  if (c.positive_scale && s.modded()) kb.fail(Loc::current(), "POSITIVE_SCALE takes no SCORE_MOD: the mod needs the scaled scores");
  c.heavy_first_sections = kb.meta<bool>(mn::kHeavyFirstSections, true);
  c.rng_warps = kb.meta<int>(mn::kRngWarps, 0);
  if (c.rng_warps) {
    c.mma_registers = kb.meta<int>(mn::kMmaRegisters, 0);
    c.rng_registers = kb.meta<int>(mn::kRngRegisters, 0);
  }
  if (c.rng_warps && (!s.dropout || s.dropout_bits || s.library_mask() || s.varlen || c.pingpong || c.block_n % 64 != 0))
    kb.fail(Loc::current(), fmt::format("RNG_WARPS = {} generates the fused dropout mask on warps of its own: it needs DROPOUT=true "
                                        "without DROPOUT_BITS, a full or causal mask, dense tensors, no PINGPONG and BLOCK_N a "
                                        "multiple of 64 (got BLOCK_N = {})", c.rng_warps, c.block_n));
  return c;
}

}  // namespace tilejit::kernels
