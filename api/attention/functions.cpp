// The compiled-Function caches: one Function per attention kernel configuration and per pre-pass
// kernel, created once and kept for the life of the process (thread-safe).
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "api/attention/internal.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/document_ids.hpp"

namespace tilejit::attention::detail {

// One Function per configuration, created once and kept for the life of the process (the
// documented cache of this module); Function itself compiles once under concurrent first calls.
Function& function_for(const Config& c) {
  static std::mutex mu;
  static std::map<Config, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[c];
  if (!slot) {
    const KernelInfo& ki = info(c.pass);
    if (!ki.kernel) throw std::logic_error(fmt::format("tilejit::attention: kernel '{}' is not in the library", name(c.pass)));
    jit::CompileOptions o;
    o.specialize = false;  // (library kernels declare what they need; bundles hold that variant)
    o.num_warps = c.sch.num_warps;
    o.pipeline.stages = c.sch.stages;
    o.min_programs_per_sm = c.sch.min_programs_per_sm;
    slot = std::make_unique<Function>(*ki.kernel, meta_of(c), o, c.device);
  }
  return *slot;
}

// The pre-pass's kernels for one kernel's lists (its tiles, its order) and mask kind, per device,
// created once (the same documented cache as function_for): the classification (8 warps for
// 128 x 128 tiles, where 4 warps spill: decision 039; 4 below), then the lists (4 warps).
Function& block_classes_function(const PrePassLists& l, kernels::MaskKind kind) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int, int>, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[{l.block_m, l.block_n, static_cast<int>(kind), l.device}];
  if (!slot) {
    jit::CompileOptions o;
    o.specialize = false;  // (library kernels declare what they need; bundles hold that variant)
    o.num_warps = l.block_m * l.block_n >= 128 * 128 ? 8 : 4;
    o.pipeline.stages = 2;
    kernels::BlockClassesConfig c;
    c.block_m = l.block_m, c.block_n = l.block_n, c.tiles = kClassTiles, c.mask = kind;
    slot = std::make_unique<Function>(kernels::attention_block_classes(), c.to_meta(), o, l.device);
  }
  return *slot;
}
Function& block_lists_function(const PrePassLists& l) {
  static std::mutex mu;
  static std::map<std::tuple<bool, int>, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[{l.kv_major, l.device}];
  if (!slot) {
    jit::CompileOptions o;
    o.specialize = false;  // (library kernels declare what they need; bundles hold that variant)
    o.num_warps = 4;
    o.pipeline.stages = 2;
    kernels::BlockListsConfig c;
    c.kv_major = l.kv_major;
    slot = std::make_unique<Function>(kernels::attention_block_lists(), c.to_meta(), o, l.device);
  }
  return *slot;
}

Function& document_ids_function(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[device];
  if (!slot) {
    jit::CompileOptions o;
    o.specialize = false;  // (library kernels declare what they need; bundles hold that variant)
    o.num_warps = 4;
    o.pipeline.stages = 2;
    slot = std::make_unique<Function>(kernels::attention_document_ids(), lang::Meta{}, o, device);
  }
  return *slot;
}

}  // namespace tilejit::attention::detail
