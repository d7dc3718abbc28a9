// The table of library kernels.
#include "api/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/dropout_mask.hpp"
#include "kernels/gemm.hpp"

namespace tilejit::library {

using namespace kernels;

// Default schedules: those of the attention API (attention::default_schedule) for dense shapes
// without a dQ reduction; the API picks others per call (64 x 128 on 8 warps for a reduction at
// D 128, generic-path tiles for varlen, ...).
const std::vector<LibraryKernel>& all() {
  static const std::vector<LibraryKernel> all{
      {"gemm", &gemm, "C = A @ B, bf16/f16 in, f32 accumulate (TMA + wgmma pipeline when K-major on sm_90a)",
       {{"BLOCK_M", 128}, {"BLOCK_N", 256}, {"BLOCK_K", 64}, {"B_KMAJOR", true}, {"GROUP_M", 8}}, 8, 4},
      {"attention_fwd", &attention_forward, "FlashAttention forward with online softmax, optional causal mask",
       {{"BLOCK_M", 128}, {"BLOCK_N", 128}}, 8, 2},
      {"attention_bwd_preprocess", &attention_backward_preprocess, "attention backward, step 1: Delta = rowsum(dO * O)", {}, 4, 3},
      {"attention_bwd_dkdv", &attention_backward_dkdv, "attention backward: dK, dV per key block, summed over the GQA group (DQ_REDUCTION: also dQ's parts, atomic or split)",
       {{"BLOCK_M", 64}, {"BLOCK_N", 64}}, 4, 2},
      {"attention_bwd_dq", &attention_backward_dq, "attention backward: dQ per query block (no atomics)", {{"BLOCK_M", 64}, {"BLOCK_N", 64}}, 4, 2},
      {"attention_bwd_dq_convert", &attention_backward_dq_convert, "attention backward, DQ_REDUCTION=atomic: dQ = scale * dQ_accum (f32 workspace)", {{"BLOCK_M", 64}}, 4, 2},
      {"attention_bwd_dq_reduce", &attention_backward_dq_reduce, "attention backward, DQ_REDUCTION=split: dQ = scale * the parts in key tile order", {{"BLOCK_M", 64}, {"BLOCK_N", 128}}, 4, 2},
      // the block-mask pre-pass at the API's schedules (forward tiles; the backward's: BLOCK_M=64,
      // BLOCK_N=64, warps=4), so that bundles can ship it for masks without tile intervals
      {"attention_block_classes", &attention_block_classes,
       "block-mask pre-pass, step 1: every (query tile, key tile) of a library mask (MASK) classified empty/partial/full",
       {{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"TILES", kBlockClassTiles}}, 8, 2},
      {"attention_block_lists", &attention_block_lists, "block-mask pre-pass, step 2: FlexAttention-style block lists from the classes",
       {{"KV_MAJOR", false}}, 4, 2},
      {"dropout_mask", &dropout_mask, "packed attention dropout keep-mask (Philox4x32-10, 1 bit per element, u32 words along keys)",
       {{"BLOCK_M", 64}, {"BLOCK_W", 4}}, 4, 3},
  };
  return all;
}

const LibraryKernel* find(const std::string& name) {
  for (const LibraryKernel& k : all())
    if (k.name == name) return &k;
  return nullptr;
}

runtime::BundleEntrySpec bundle_spec(const std::string& kernel, lang::Meta meta) {
  const LibraryKernel* k = find(kernel);
  if (!k) {
    std::vector<std::string> known;
    for (const auto& e : all()) known.push_back(e.name);
    throw std::invalid_argument(fmt::format("tilejit: '{}' is not a library kernel (known: {})", kernel, fmt::join(known, ", ")));
  }
  runtime::BundleEntrySpec s;
  s.kernel = kernel;
  s.source = k->kernel;
  s.meta = std::move(meta);
  s.default_meta = k->default_meta;
  s.options.num_warps = k->num_warps;
  s.options.pipeline.stages = k->stages;
  return s;
}

}  // namespace tilejit::library
