// The attention kernels' tuned choices: where `tilejit tune attention_fwd` / `attention_bwd_dkdv` /
// `attention_bwd_dq` (or a bundle's tuning table) chose a configuration for a shape bucket,
// attention::forward / backward launch it instead of the default schedule. Only a lookup: a call never starts a tuning run.
#include <array>
#include <map>
#include <mutex>

#include "api/attention/internal.hpp"
#include "api/tuning.hpp"
#include "kernels/meta_names.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/bundle.hpp"

namespace tilejit::attention::detail {

namespace mn = kernels::meta_name;

namespace {

// The stored choice for `c`'s kernel at `shape`, as `tilejit tune` names it (BSHD; the forward with
// the call's POSITIVE_SCALE), if it is still a valid point of the space.
std::optional<runtime::TuningConfig> stored_choice(const runtime::TuningSpace& space, const runtime::Shape& shape, const Config& c) {
  lang::Meta user{{mn::kHeadDim, static_cast<int64_t>(c.head_dim)}, {mn::kCausal, c.causal}, {mn::kBshd, true}, {mn::kDtype, c.dtype}};
  if (c.pass == Pass::forward) user.push_back({mn::kPositiveScale, c.positive_scale});
  // (atomic dK/dV: `tilejit tune attention_bwd_dkdv --meta DQ_REDUCTION=1`'s table key)
  if (c.pass == Pass::bwd_dkdv && c.reduction != 0) user.push_back({mn::kDqReduction, static_cast<int64_t>(c.reduction)});
  const lang::Meta fixed = library::library_fixed_meta(space.kernel_name(), user);
  const runtime::Autotuner tuner(space);
  std::optional<runtime::TuneResult> hit = tuner.lookup(shape, fixed);
  if (!hit || space.violated(hit->best, tuner.context(shape, fixed))) return std::nullopt;
  return std::move(hit->best);
}

// The tuning space of `c`'s kernel where its call is one that space's problem describes, else null.
const runtime::TuningSpace* space_for(const Config& c, const Dims& d) {
  if (c.varlen || c.mask != 0 || c.score_mod != 0 || c.dropout || c.read_bits || d.seq_q != d.seq_k) return nullptr;
  if (c.pass == Pass::forward && !c.return_mask) return &library::attention_fwd_tuning_space();
  const bool tuned_reduction = c.reduction == static_cast<int>(DqReduction::recompute) || c.reduction == static_cast<int>(DqReduction::atomic);
  if (c.pass == Pass::bwd_dkdv && tuned_reduction && !c.q_descending && !c.accumulate && d.row_vectors_aligned)
    return &library::attention_dkdv_tuning_space();
  // (the dQ kernel runs only with the recompute reduction)
  if (c.pass == Pass::bwd_dq && !c.accumulate) return &library::attention_dq_tuning_space();
  return nullptr;
}

}  // namespace

Config with_tuned_choice(Config c, const Dims& d) {
  const runtime::TuningSpace* space = space_for(c, d);
  if (!space) return c;
  // (every call: the bucket as integers, no strings; the shape and the lookup only on a miss)
  const std::array<int64_t, 4> dims{d.batch, d.heads_q, d.seq_q, d.head_dim};  // the spaces' keys B, H, S, D
  std::array<int64_t, 4> bucket{};
  for (size_t i = 0; i < dims.size(); ++i) bucket[i] = space->key_args()[i].bucketing.apply(dims[i]);
  using Key = std::tuple<int, int, int, bool, bool, int, int, std::array<int64_t, 4>>;
  const Key key{static_cast<int>(c.pass), static_cast<int>(c.dtype), c.head_dim, c.causal, c.positive_scale, c.reduction, c.device, bucket};
  static std::mutex mu;
  static std::map<Key, std::optional<runtime::TuningConfig>> cache;
  static uint64_t generation = 0;
  std::optional<runtime::TuningConfig> choice;
  {
    std::lock_guard lock(mu);
    // a bundle loaded or unloaded since: its tuning table may answer differently (the tuning
    // store written by another process is read once a bucket and process)
    if (const uint64_t g = runtime::bundles_generation(); g != generation) {
      cache.clear();
      generation = g;
    }
    auto it = cache.find(key);
    if (it == cache.end()) {
      const runtime::Shape shape{{"B", d.batch}, {"H", d.heads_q}, {"S", d.seq_q}, {"D", d.head_dim}};
      it = cache.emplace(key, stored_choice(*space, shape, c)).first;
    }
    choice = it->second;
  }
  if (!choice) return c;
  const runtime::TuningConfig& t = *choice;
  auto value = [&](std::string_view name) { return static_cast<int>(t.get(name)); };
  c.sch = Schedule{value(mn::kBlockM), value(mn::kBlockN), value("warps"), value("stages"), value(runtime::kMinProgramsParam)};
  if (c.pass == Pass::forward) {
    c.persistent = value(mn::kPersistent) != 0;
    c.tuned = TunedOptions{value(mn::kExactNormalize) != 0, value(mn::kRingProducer) != 0, value(mn::kPipelinePv) != 0,
                           value(mn::kPipelineQk) != 0, value(mn::kTmaStore) != 0};
  } else if (c.pass == Pass::bwd_dkdv) {
    // (a table written before RING_PRODUCER / DQ_WRITER were tuned lacks them: off)
    const auto on = [&](const char* name) { return t.find(name).value_or(0) != 0; };
    c.lse_in_ring = on(mn::kLseInRing), c.ring_producer = on(mn::kRingProducer), c.dq_writer = on(mn::kDqWriter);
    c.tuned = TunedOptions{.tma_store = on(mn::kTmaStore)};
  }  // (dQ: tiles, warps, stages and the bound only)
  return c;
}

}  // namespace tilejit::attention::detail
