// The attention forward's tuned choices: where `tilejit tune attention_fwd` (or a bundle's tuning
// table) chose a configuration for a shape bucket, attention::forward launches it instead of the
// default schedule. Only a lookup: a call never starts a tuning run.
#include <map>
#include <mutex>

#include "api/attention/internal.hpp"
#include "api/tuning.hpp"
#include "kernels/meta_names.hpp"
#include "runtime/autotuner.hpp"

namespace tilejit::attention::detail {

namespace mn = kernels::meta_name;

namespace {

// The stored choice for the forward of `c` at `shape`, as `tilejit tune attention_fwd` names it
// (BSHD, the call's POSITIVE_SCALE), if it is still a valid point of the space.
std::optional<runtime::TuningConfig> stored_choice(const runtime::TuningSpace& space, const runtime::Shape& shape, const Config& c) {
  const lang::Meta user{{mn::kHeadDim, static_cast<int64_t>(c.head_dim)},
                        {mn::kCausal, c.causal},
                        {mn::kPositiveScale, c.positive_scale},
                        {mn::kBshd, true},
                        {mn::kDtype, c.dtype}};
  const lang::Meta fixed = library::library_fixed_meta("attention_fwd", user);
  const runtime::Autotuner tuner(space);
  std::optional<runtime::TuneResult> hit = tuner.lookup(shape, fixed);
  if (!hit || space.violated(hit->best, tuner.context(shape, fixed))) return std::nullopt;
  return std::move(hit->best);
}

}  // namespace

Config with_tuned_choice(Config c, const Dims& d) {
  if (c.pass != Pass::forward || c.varlen || c.mask != 0 || c.score_mod != 0 || c.dropout || c.return_mask || c.read_bits ||
      d.seq_q != d.seq_k)
    return c;
  const runtime::TuningSpace& space = library::attention_fwd_tuning_space();
  const runtime::Shape shape{{"B", d.batch}, {"H", d.heads_q}, {"S", d.seq_q}, {"D", d.head_dim}};
  using Key = std::tuple<int, int, bool, bool, int, std::string>;
  const Key key{static_cast<int>(c.dtype), c.head_dim, c.causal, c.positive_scale, c.device, space.bucket(shape)};
  static std::mutex mu;
  static std::map<Key, std::optional<runtime::TuningConfig>> cache;  // (bundles loaded later are not seen)
  std::optional<runtime::TuningConfig> choice;
  {
    std::lock_guard lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, stored_choice(space, shape, c)).first;
    choice = it->second;
  }
  if (!choice) return c;
  const runtime::TuningConfig& t = *choice;
  auto value = [&](std::string_view name) { return static_cast<int>(t.get(name)); };
  c.sch = Schedule{value(mn::kBlockM), value(mn::kBlockN), value("warps"), value("stages"), value(runtime::kMinProgramsParam)};
  c.persistent = value(mn::kPersistent) != 0;
  c.tuned = TunedForward{value(mn::kExactNormalize) != 0, value(mn::kRingProducer) != 0, value(mn::kPipelinePv) != 0,
                         value(mn::kPipelineQk) != 0, value(mn::kTmaStore) != 0};
  return c;
}

}  // namespace tilejit::attention::detail
