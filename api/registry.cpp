// The table of library kernels.
#include "api/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "api/attention.hpp"
#include "api/tuning.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/document_ids.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/context_parallel.hpp"
#include "kernels/dropout_mask.hpp"
#include "kernels/gemm.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::library {

using namespace kernels;

namespace {

namespace mn = meta_name;

// The attention kernels' rows take the API's own schedule (attention::default_schedule, the one
// table: api/attention/) at bf16, D 128, dense, full, so that `tilejit compile` and `tilejit
// bundle` make the kernels the API launches for that shape (HEAD_DIM stays the kernel's default
// unless --meta sets it). The API picks other tiles per call (D 64, a dQ reduction, varlen, ...) and
// at D 128 runs the forward PERSISTENT (a 1-D grid; this row keeps the one-tile-per-program grid).
attention::Schedule api_schedule(attention::Pass pass) {
  return attention::default_schedule(pass, ir::DType::bf16, 128, /*causal=*/false, /*varlen=*/false,
                                     pass == attention::Pass::bwd_dq_reduce ? attention::DqReduction::split
                                                                              : attention::DqReduction::recompute);
}
// A row at the API's schedule for `pass`: its tiles (BLOCK_N only for kernels that tile keys),
// warps and stages.
LibraryKernel attention_row(std::string name, const lang::Kernel& (*kernel)(), std::string summary, attention::Pass pass,
                            bool block_n = true, const runtime::TuningSpace& (*tuning_space)() = nullptr) {
  const attention::Schedule s = api_schedule(pass);
  lang::Meta meta{{mn::kBlockM, s.block_m}};
  if (block_n) meta.emplace_back(mn::kBlockN, s.block_n);
  return {std::move(name), kernel, std::move(summary), std::move(meta), s.num_warps, s.stages, tuning_space};
}

std::vector<LibraryKernel> make_library() {
  using attention::Pass;
  GemmConfig gemm_default;  // the best of the GEMM schedules measured on the H100 (docs/decisions/034)
  gemm_default.block_n = 256;
  gemm_default.b_kmajor = true;
  gemm_default.group_m = 8;
  const attention::Schedule fwd_tiles = api_schedule(Pass::forward);
  return {
      {"gemm", &gemm, "C = A @ B, bf16/f16 in, f32 accumulate (TMA + wgmma pipeline on sm_90a, either operand majorness)", gemm_default.to_meta(),
       8, 4, &gemm_tuning_space},
      attention_row("attention_fwd", &attention_forward, "FlashAttention forward with online softmax, optional causal mask",
                    Pass::forward, /*block_n=*/true, &attention_fwd_tuning_space),
      attention_row("attention_bwd_preprocess", &attention_backward_preprocess, "attention backward, step 1: Delta = rowsum(dO * O)",
                    Pass::bwd_preprocess, /*block_n=*/false),
      attention_row("attention_bwd_dkdv", &attention_backward_dkdv,
                    "attention backward: dK, dV per key block, summed over the GQA group (DQ_REDUCTION: also dQ's parts, atomic or split)",
                    Pass::bwd_dkdv, /*block_n=*/true, &attention_dkdv_tuning_space),
      attention_row("attention_bwd_dq", &attention_backward_dq, "attention backward: dQ per query block (no atomics)", Pass::bwd_dq,
                    /*block_n=*/true, &attention_dq_tuning_space),
      attention_row("attention_bwd_dq_convert", &attention_backward_dq_convert,
                    "attention backward, DQ_REDUCTION=atomic: dQ = scale * dQ_accum (f32 workspace)", Pass::bwd_dq_convert, /*block_n=*/false),
      attention_row("attention_bwd_dq_reduce", &attention_backward_dq_reduce,
                    "attention backward, DQ_REDUCTION=split: dQ = scale * the parts in key tile order", Pass::bwd_dq_reduce),
      // the block-mask pre-pass at the forward's tiles (the API's block_classes_function; the
      // backward's run at 64 x 64 on 4 warps), so that bundles can ship it for masks without tile
      // intervals
      {"attention_block_classes", &attention_block_classes,
       "block-mask pre-pass, step 1: every (query tile, key tile) of a library mask (MASK) classified empty/partial/full",
       {{mn::kBlockM, fwd_tiles.block_m}, {mn::kBlockN, fwd_tiles.block_n}, {mn::kTiles, kBlockClassTiles}}, 8, 2, nullptr},
      {"attention_block_lists", &attention_block_lists, "block-mask pre-pass, step 2: FlexAttention-style block lists from the classes",
       {{mn::kKvMajor, false}}, 4, 2, nullptr},
      {"attention_document_ids", &attention_document_ids,
       "packed documents: doc_ids[0, t] = b for the tokens of sequence b (cu_seqlens), the document masks' ids", {}, 4, 2, nullptr},
      {"dropout_mask", &dropout_mask, "packed attention dropout keep-mask (Philox4x32-10, 1 bit per element, u32 words along keys)",
       DropoutMaskConfig{}.to_meta(), 4, 3, nullptr},
      {"attention_cp_merge", &attention_cp_merge, "context parallelism: merge a partial O, LSE into f32 accumulators (log-sum-exp weights)",
       CpPartialConfig{}.to_meta(), 4, 3, nullptr},
      {"attention_cp_accumulate", &attention_cp_accumulate, "context parallelism: f32 acc += a gradient partial (FIRST: acc = part)",
       CpPartialConfig{}.to_meta(), 4, 3, nullptr},
      {"attention_cp_convert", &attention_cp_convert, "context parallelism: dst = an f32 accumulator rounded to DTYPE",
       CpConvertConfig{}.to_meta(), 4, 3, nullptr},
  };
}

}  // namespace

const std::vector<LibraryKernel>& all() {
  static const std::vector<LibraryKernel> library = make_library();
  return library;
}

namespace {

// Rows registered at run time: a deque, so that a row keeps its address while others are added.
struct Registered {
  std::mutex mutex;
  std::deque<LibraryKernel> kernels;
  std::deque<std::string> origins;
};
Registered& registered_rows() {
  static Registered r;
  return r;
}

bool valid_name(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

const LibraryKernel* find_library(const std::string& name) {
  for (const LibraryKernel& k : all())
    if (k.name == name) return &k;
  return nullptr;
}

// The index of registered kernel `name` (the caller holds the mutex).
std::optional<size_t> find_registered(const Registered& r, const std::string& name) {
  for (size_t i = 0; i < r.kernels.size(); ++i)
    if (r.kernels[i].name == name) return i;
  return std::nullopt;
}

}  // namespace

const LibraryKernel* find(const std::string& name) {
  if (const LibraryKernel* k = find_library(name)) return k;
  Registered& r = registered_rows();
  std::lock_guard lock(r.mutex);
  const std::optional<size_t> i = find_registered(r, name);
  return i ? &r.kernels[*i] : nullptr;
}

void register_kernels(const std::vector<LibraryKernel>& kernels, const std::string& origin) {
  Registered& r = registered_rows();
  std::lock_guard lock(r.mutex);
  for (size_t i = 0; i < kernels.size(); ++i) {
    const LibraryKernel& k = kernels[i];
    if (!valid_name(k.name))
      throw std::invalid_argument(fmt::format("tilejit: {}: kernel name '{}' is not valid (letters, digits and '_', not starting "
                                              "with a digit: it is typed in `tilejit bundle KERNEL:NAME=VALUE`)",
                                              origin, k.name));
    if (!k.kernel) throw std::invalid_argument(fmt::format("tilejit: {}: kernel '{}' has no kernel function", origin, k.name));
    if (find_library(k.name))
      throw std::invalid_argument(fmt::format("tilejit: {}: kernel '{}' is already a library kernel; give yours a name of its own "
                                              "(the library's names: `tilejit kernels`)",
                                              origin, k.name));
    if (const std::optional<size_t> j = find_registered(r, k.name))
      throw std::invalid_argument(fmt::format("tilejit: {}: kernel '{}' is already registered by {}", origin, k.name, r.origins[*j]));
    for (size_t j = 0; j < i; ++j)
      if (kernels[j].name == k.name)
        throw std::invalid_argument(fmt::format("tilejit: {}: kernel '{}' is registered twice", origin, k.name));
  }
  for (const LibraryKernel& k : kernels) {
    r.kernels.push_back(k);
    r.origins.push_back(origin);
  }
}

std::vector<RegisteredKernel> registered() {
  Registered& r = registered_rows();
  std::lock_guard lock(r.mutex);
  std::vector<RegisteredKernel> out;
  for (size_t i = 0; i < r.kernels.size(); ++i) out.push_back({&r.kernels[i], r.origins[i]});
  return out;
}

std::string origin_of(const std::string& name) {
  Registered& r = registered_rows();
  std::lock_guard lock(r.mutex);
  const std::optional<size_t> i = find_registered(r, name);
  return i ? r.origins[*i] : std::string();
}

runtime::BundleEntrySpec bundle_spec(const std::string& kernel, lang::Meta meta) {
  const LibraryKernel* k = find(kernel);
  if (!k) {
    std::vector<std::string> known;
    for (const auto& e : all()) known.push_back(e.name);
    for (const RegisteredKernel& e : registered()) known.push_back(e.kernel->name);
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
