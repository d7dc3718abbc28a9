// The autotuner's entry points: the context and identity of a problem, the model-only ranking, the
// lookup of a stored choice (bundles, then the tuning store), tune() / choose(), and TunedKernel.
// The tuning run itself is runtime/autotuner_run.cpp; the store runtime/tuning_store.cpp, bundles'
// tables runtime/tuning_table.cpp, the GPU bench runtime/gpu_bench.cpp.
#include "runtime/autotuner.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>

#include "runtime/autotuner_internal.hpp"
#include "runtime/bundle.hpp"
#include "runtime/compile_cache.hpp"

namespace tilejit::runtime {

using tuning_detail::fingerprint;
using tuning_detail::seconds_since;

bool autotune_enabled() {
  const char* v = std::getenv("TILEJIT_AUTOTUNE");
  if (!v) return true;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(s == "0" || s == "false" || s == "off" || s == "no");
}

// ---- the autotuner ---------------------------------------------------------------------------

std::string_view to_string(ConfigStatus s) {
  switch (s) {
    case ConfigStatus::Timed: return "timed";
    case ConfigStatus::Cached: return "cached";
    case ConfigStatus::Pruned: return "pruned";
    case ConfigStatus::CompileFailed: return "compile failed";
    case ConfigStatus::Dropped: return "dropped";
    case ConfigStatus::WrongOutput: return "wrong output";
    case ConfigStatus::OverBudget: return "over budget";
    case ConfigStatus::Failed: return "failed";
  }
  return "?";
}

Autotuner::Autotuner(const TuningSpace& space, AutotuneOptions opts)
    : space_(space), opts_(std::move(opts)), device_(DeviceModel::current()) {
  compile_ = [](const ir::Function& f, const jit::CompileOptions& o) { return compile_cached(f, o); };
}

Autotuner::~Autotuner() = default;

void Autotuner::set_bench(std::unique_ptr<Bench> b) { bench_ = std::move(b); }

Bench& Autotuner::bench() {
  if (!bench_) bench_ = make_gpu_bench(opts_.bench);
  return *bench_;
}

TuningContext Autotuner::context(const Shape& shape, const lang::Meta& fixed) const {
  TuningContext ctx;
  ctx.shape = shape;
  ctx.fixed = fixed;
  ctx.arch = opts_.base.arch;
  ctx.smem_limit = device_.smem_per_block;
  ctx.sm_count = device_.sm_count;
  return ctx;
}

lang::Meta Autotuner::canonical_fixed(const lang::Meta& fixed) const {
  // Every meta value the kernel is built with except the tuned ones, defaults included, so that
  // spelling a default out or leaving it implicit names the same tuning entry.
  lang::Meta out;
  ir::Function f = space_.build_ir(space_.default_config(), fixed);
  for (const ir::MetaEntry& m : f.meta)
    if (!space_.default_config().find(m.name)) out.push_back({m.name, m.value});
  return out;
}

TuningIdentity Autotuner::identity(const Shape& shape, const lang::Meta& fixed) const {
  TuningIdentity id;
  id.kernel = space_.kernel_name();
  id.fixed = describe_fixed_meta(canonical_fixed(fixed));
  id.bucket = space_.bucket(shape);
  id.gpu = device_.name;
  id.sm_count = device_.sm_count;
  id.driver_version = device_.driver_version;
  id.arch = opts_.base.arch;
  id.backend = std::string(jit::to_string(opts_.base.backend));
  return id;
}

TuneResult Autotuner::model_only(const Shape& shape, const lang::Meta& fixed) const {
  TuneResult r;
  r.kernel = space_.kernel_name();
  r.shape = shape;
  r.bucket = space_.bucket(shape);
  r.identity = identity(shape, fixed);
  r.source = "model";
  const TuningContext ctx = context(shape, fixed);
  std::vector<TuningConfig> configs = space_.enumerate(ctx);
  r.default_config = space_.default_config(ctx);
  r.space_size = space_.size();
  r.valid = configs.size();
  std::vector<Workload> work;
  std::vector<CostEstimate> est;
  for (const TuningConfig& c : configs) {
    work.push_back(space_.workload_of(c, ctx));
    est.push_back(estimate(work.back(), device_));
  }
  std::vector<size_t> order = rank_by_model(est);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t k = order[i];
    ConfigResult cr;
    cr.config = configs[k];
    cr.estimate = est[k];
    cr.workload = work[k];
    cr.model_rank = static_cast<int>(i + 1);
    cr.status = est[k].feasible ? ConfigStatus::Pruned : ConfigStatus::Dropped;
    cr.note = est[k].reason;
    cr.is_default = configs[k] == r.default_config;
    r.configs.push_back(std::move(cr));
  }
  r.flops = work.empty() ? 0 : work.front().flops;
  if (!r.configs.empty()) {
    r.best = r.configs.front().config;
    r.best_ms = r.configs.front().estimate.ms;
  }
  return r;
}

std::optional<TuneResult> Autotuner::lookup(const Shape& shape, const lang::Meta& fixed) const {
  const TuningIdentity id = identity(shape, fixed);
  const TuningContext ctx = context(shape, fixed);
  auto result = [&](const std::string& config, double ms, std::string source) -> std::optional<TuneResult> {
    TuningConfig c;
    try {
      c = parse_config(config);
    } catch (const std::invalid_argument&) {
      return std::nullopt;
    }
    // A stored config must still be a point of this space (a space that lost it re-tunes).
    if (c.values.size() != space_.params().size()) return std::nullopt;
    for (size_t i = 0; i < c.values.size(); ++i) {
      const auto& [name, values] = space_.params()[i];
      if (c.values[i].first != name || std::find(values.begin(), values.end(), c.values[i].second) == values.end())
        return std::nullopt;
    }
    TuneResult r;
    r.kernel = space_.kernel_name();
    r.shape = shape;
    r.bucket = id.bucket;
    r.identity = id;
    r.best = std::move(c);
    r.best_ms = ms;
    r.source = std::move(source);
    r.space_size = space_.size();
    return r;
  };
  // Bundled tables first: a shipped application never tunes. The exact GPU first, else any GPU of
  // the same arch (the table was tuned on a sibling part; still better than the default).
  std::vector<TuningTableEntry> tables = loaded_tuning_tables();
  const TuningTableEntry* same_arch = nullptr;
  for (const TuningTableEntry& e : tables) {
    const TuningIdentity& i = e.identity;
    if (i.kernel != id.kernel || i.fixed != id.fixed || i.bucket != id.bucket || i.arch != id.arch || i.backend != id.backend)
      continue;
    if (i.gpu == id.gpu && i.sm_count == id.sm_count) {
      if (auto r = result(e.config, e.ms, "bundle")) return r;
    } else if (!same_arch) {
      same_arch = &e;
    }
  }
  if (same_arch)
    if (auto r = result(same_arch->config, same_arch->ms, "bundle")) return r;
  if (!opts_.persist) return std::nullopt;
  const TuningStore& store = store_ ? *store_ : TuningStore::global();
  std::optional<Choice> c = store.load_choice(id);
  if (!c) return std::nullopt;
  // The choice must come from the same valid configs and at least as wide a search, unless
  // autotuning is off (then any stored choice beats the default).
  if (autotune_enabled()) {
    if (c->fingerprint != fingerprint(space_.enumerate(ctx))) return std::nullopt;
    if (opts_.exhaustive && !c->exhaustive) return std::nullopt;
    if (!c->exhaustive && c->top_k < opts_.top_k) return std::nullopt;
  }
  return result(c->config, c->ms, "disk");
}

TuneResult Autotuner::tune(const Shape& shape, const lang::Meta& fixed) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!opts_.force)
    if (std::optional<TuneResult> hit = lookup(shape, fixed)) {
      hit->wall_s = seconds_since(t0);
      return std::move(*hit);
    }
  TuneResult r = run(shape, fixed);
  r.wall_s = seconds_since(t0);
  return r;
}

TuneResult Autotuner::choose(const Shape& shape, const lang::Meta& fixed) {
  if (autotune_enabled()) return tune(shape, fixed);
  if (std::optional<TuneResult> hit = lookup(shape, fixed)) return std::move(*hit);
  TuneResult r;
  r.kernel = space_.kernel_name();
  r.shape = shape;
  r.bucket = space_.bucket(shape);
  r.identity = identity(shape, fixed);
  r.best = space_.default_config(context(shape, fixed));
  r.source = "default";
  r.space_size = space_.size();
  return r;
}

// ---- TunedKernel -----------------------------------------------------------------------------

struct TunedKernel::Entry {
  TuningConfig config;
  std::unique_ptr<Function> fn;
  bool settled = false;     // tuned or stored: final for the process
  uint64_t generation = 0;  // else the bundles_generation() it was chosen at: a bundle loaded since may hold a choice
};

TunedKernel::TunedKernel(const TuningSpace& space, lang::Meta fixed, AutotuneOptions opts, int device)
    : space_(space), fixed_(std::move(fixed)), opts_(std::move(opts)), device_(device) {
  opts_.bench.device = device;
}

TunedKernel::~TunedKernel() = default;

std::shared_ptr<TunedKernel::Entry> TunedKernel::entry_for(std::span<const DeviceArg> args, Shape& shape) {
  shape = space_.shape_of(args, fixed_);
  const std::string bucket = space_.bucket(shape);
  const uint64_t generation = bundles_generation();
  std::lock_guard lock(mutex_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& be) { return be.first == bucket; });
  if (it != entries_.end() && (it->second->settled || it->second->generation == generation)) return it->second;
  // the bucket's first call, or its default chosen before a bundle was loaded or unloaded
  Autotuner tuner(space_, opts_);
  TuneResult r = tuner.choose(shape, fixed_);
  auto e = std::make_shared<Entry>();
  e->config = r.best;
  e->settled = r.source != "default";
  e->generation = generation;
  e->fn = std::make_unique<Function>(space_.kernel(), layer_meta(space_.meta_of(r.best), fixed_), r.best.options(opts_.base), device_);
  if (it != entries_.end()) it->second = e;  // (a launch holding the old entry keeps it alive)
  else entries_.push_back({bucket, e});
  return e;
}

void TunedKernel::launch(CUstream stream, std::span<const DeviceArg> args) {
  Shape shape;
  const std::shared_ptr<Entry> e = entry_for(args, shape);
  TuningContext ctx;
  ctx.shape = shape;
  ctx.fixed = fixed_;
  ctx.arch = opts_.base.arch;
  e->fn->launch(space_.grid_of(e->config, ctx), stream, args);
}

TuningConfig TunedKernel::config_for(std::span<const DeviceArg> args) {
  Shape shape;
  return entry_for(args, shape)->config;
}

}  // namespace tilejit::runtime
