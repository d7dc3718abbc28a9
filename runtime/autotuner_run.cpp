// One tuning run (Autotuner::run), in named steps: enumerate -> model (estimated resources) ->
// prune to the best compile_k -> compile them in parallel -> model again (compiled resources;
// spills and shared-memory overflows dropped) -> time the best top_k plus the default (reusing
// stored measurements) -> re-time the finalists -> persist the choice.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "runtime/autotuner.hpp"
#include "runtime/autotuner_internal.hpp"

namespace tilejit::runtime {

using tuning_detail::fingerprint;
using tuning_detail::seconds_since;

// The state of one run, shared by its steps; run() calls them in the order they are declared.
class Autotuner::Sweep {
 public:
  Sweep(Autotuner& tuner, const Shape& shape, const lang::Meta& fixed);

  void enumerate();         // the valid configs (the default even outside the constraints), first estimates
  void load_stored();       // configs measured before need neither compile nor timing
  void prune();             // the best compile_k by the model (every feasible one when exhaustive)
  void compile();           // those without a stored measurement, and the default, in parallel
  void rerank();            // the model again, with compiled (or stored) resources
  void time();              // the best top_k by the second ranking, plus the default
  void rank_measured();     // the correct measured configs by time
  void retime_finalists();  // near-equals timed again in alternating rounds
  TuneResult persist();     // the winner (stored as the choice) and every config's result

 private:
  void compile_in_parallel(const std::vector<size_t>& jobs);
  void time_one(size_t i);
  int resident_programs(size_t i);  // the driver's count for compiled config i (0: unknown)
  // Config i ready to time (compiled late if a stored measurement had spared it).
  Candidate candidate(size_t i);
  std::vector<size_t> model_order() const;

  Autotuner& t_;
  const lang::Meta& fixed_;
  const std::chrono::steady_clock::time_point start_;
  const TuningContext ctx_;
  const TuningIdentity id_;
  const TuningStore* const store_;
  const size_t top_k_, compile_k_;
  TuneResult r_;
  std::vector<TuningConfig> configs_;
  size_t def_index_ = 0, n_ = 0;
  std::vector<Workload> work_;
  std::vector<ConfigResult> res_;
  std::vector<std::optional<Measurement>> stored_;
  std::vector<size_t> order_;  // by the model, first pass then second pass
  std::vector<bool> wanted_;   // compiled (or measured) for the second pass
  std::vector<ir::Function> fns_;
  std::vector<std::optional<jit::CompiledKernel>> compiled_;
  std::vector<std::string> errors_;
  std::vector<size_t> timing_;
  bool prepared_ = false, bench_failed_ = false;
  std::string bench_error_;
  std::vector<size_t> measured_;
};

TuneResult Autotuner::run(const Shape& shape, const lang::Meta& fixed) {
  Sweep s(*this, shape, fixed);
  s.enumerate();
  s.load_stored();
  s.prune();
  s.compile();
  s.rerank();
  s.time();
  s.rank_measured();
  s.retime_finalists();
  return s.persist();
}

Autotuner::Sweep::Sweep(Autotuner& tuner, const Shape& shape, const lang::Meta& fixed)
    : t_(tuner),
      fixed_(fixed),
      start_(std::chrono::steady_clock::now()),
      ctx_(tuner.context(shape, fixed)),
      id_(tuner.identity(shape, fixed)),
      store_(tuner.opts_.persist ? (tuner.store_ ? tuner.store_ : &TuningStore::global()) : nullptr),
      top_k_(static_cast<size_t>(std::max(1, tuner.opts_.top_k))),
      compile_k_(tuner.opts_.compile_k > 0 ? static_cast<size_t>(tuner.opts_.compile_k) : 2 * top_k_) {
  r_.kernel = t_.space_.kernel_name();
  r_.shape = shape;
  r_.bucket = id_.bucket;
  r_.identity = id_;
  r_.source = "tuned";
  r_.space_size = t_.space_.size();
}

void Autotuner::Sweep::enumerate() {
  configs_ = t_.space_.enumerate(ctx_);
  r_.valid = configs_.size();
  const TuningConfig def = t_.space_.default_config(ctx_);
  def_index_ = configs_.size();
  for (size_t i = 0; i < configs_.size(); ++i)
    if (configs_[i] == def) def_index_ = i;
  if (def_index_ == configs_.size()) {  // the reference is compiled and timed even outside the constraints
    configs_.push_back(def);
    def_index_ = configs_.size() - 1;
  }
  n_ = configs_.size();
  work_.resize(n_);
  res_.resize(n_);
  r_.default_config = def;
  res_[def_index_].is_default = true;
  for (size_t i = 0; i < n_; ++i) {
    work_[i] = t_.space_.workload_of(configs_[i], ctx_);
    res_[i].config = configs_[i];
    res_[i].workload = work_[i];
    res_[i].estimate = estimate(work_[i], t_.device_);
    res_[i].status = res_[i].estimate.feasible ? ConfigStatus::Pruned : ConfigStatus::Dropped;
    res_[i].note = res_[i].estimate.reason;
  }
  r_.flops = work_[def_index_].flops;
}

void Autotuner::Sweep::load_stored() {
  stored_.resize(n_);
  if (store_)
    for (size_t i = 0; i < n_; ++i) stored_[i] = store_->load_measurement(id_, configs_[i].id());
}

std::vector<size_t> Autotuner::Sweep::model_order() const {
  std::vector<CostEstimate> e;
  for (const ConfigResult& c : res_) e.push_back(c.estimate);
  return rank_by_model(e);
}

void Autotuner::Sweep::prune() {
  order_ = model_order();
  wanted_.assign(n_, false);
  size_t picked = 0;
  for (size_t k : order_) {
    // (exhaustive: every valid config is compiled; only its compiled facts may drop it, never the
    // estimate's guess at registers, which once dropped 35 producer configs unseen)
    if (!res_[k].estimate.feasible && !t_.opts_.exhaustive) continue;
    if (!t_.opts_.exhaustive && picked >= std::max(compile_k_, top_k_)) break;
    wanted_[k] = true;
    ++picked;
  }
  wanted_[def_index_] = true;
}

// Configs with a stored measurement take their resources from it; the rest are compiled, and
// the default always is (it makes the reference output).
void Autotuner::Sweep::compile() {
  fns_.resize(n_);
  compiled_.resize(n_);
  errors_.resize(n_);
  std::vector<size_t> jobs;
  for (size_t i = 0; i < n_; ++i)
    if (wanted_[i] && (!stored_[i] || i == def_index_)) jobs.push_back(i);
  const auto t_compile = std::chrono::steady_clock::now();
  for (size_t i : jobs) {
    try {
      fns_[i] = t_.space_.build_ir(configs_[i], fixed_);
    } catch (const std::exception& e) {
      errors_[i] = e.what();
    }
  }
  compile_in_parallel(jobs);
  r_.compile_s = seconds_since(t_compile);
}

void Autotuner::Sweep::compile_in_parallel(const std::vector<size_t>& jobs) {
  std::atomic<size_t> next{0}, done{0};
  std::mutex progress_mutex;
  const AutotuneOptions& opts = t_.opts_;
  unsigned threads = opts.threads ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(jobs.size(), 1)));
  auto worker = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const size_t i = jobs[j];
      if (errors_[i].empty()) {
        try {
          compiled_[i] = t_.compile_(fns_[i], configs_[i].options(opts.base));
        } catch (const std::exception& e) {
          errors_[i] = e.what();
        }
      }
      size_t d = ++done;
      if (opts.progress) {
        std::lock_guard lock(progress_mutex);
        opts.progress({"compile", d, jobs.size(), configs_[i].id()});
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

int Autotuner::Sweep::resident_programs(size_t i) {
  if (bench_failed_ || !compiled_[i]) return 0;
  try {
    return t_.bench().resident_programs(candidate(i));
  } catch (const std::exception&) {
    return 0;  // no bench (no GPU): the model's rule
  }
}

void Autotuner::Sweep::rerank() {
  for (size_t i = 0; i < n_; ++i) {
    if (!wanted_[i]) continue;
    const KernelResources* rs = nullptr;
    KernelResources from;
    Workload w = work_[i];
    if (compiled_[i]) {
      from = KernelResources::of(*compiled_[i]);
      from.resident_programs = resident_programs(i);
      rs = &from;
      ++r_.compiled;
      // The wgmma path is what the compiler chose, not what the space hoped for.
      if (w.wgmma && compiled_[i]->tensor_maps.empty()) w.wgmma = false;
    } else if (stored_[i]) {
      from = stored_[i]->resources;
      rs = &from;
    }
    if (!errors_[i].empty()) {
      res_[i].status = ConfigStatus::CompileFailed;
      res_[i].note = errors_[i];
      res_[i].estimate.feasible = false;
      res_[i].estimate.ms = INFINITY;
      continue;
    }
    res_[i].workload = w;
    if (rs) res_[i].resources = *rs;
    res_[i].estimate = estimate(w, t_.device_, rs);
    res_[i].status = res_[i].estimate.feasible ? ConfigStatus::Pruned : ConfigStatus::Dropped;
    res_[i].note = res_[i].estimate.reason;
  }
  order_ = model_order();
  for (size_t p = 0; p < order_.size(); ++p) res_[order_[p]].model_rank = static_cast<int>(p + 1);
}

Candidate Autotuner::Sweep::candidate(size_t i) {
  if (!compiled_[i]) {  // stored resources but no measurement cannot happen; compile late if it does
    fns_[i] = t_.space_.build_ir(configs_[i], fixed_);
    compiled_[i] = t_.compile_(fns_[i], configs_[i].options(t_.opts_.base));
  }
  return Candidate{&configs_[i], &fns_[i], &*compiled_[i], t_.space_.grid_of(configs_[i], ctx_)};
}

void Autotuner::Sweep::time() {
  for (size_t k : order_) {
    if (!wanted_[k] || !res_[k].estimate.feasible) continue;
    if (!t_.opts_.exhaustive && timing_.size() >= top_k_) break;
    timing_.push_back(k);
  }
  // the default is timed whenever it compiled, even when the model drops it (a spill): it is what the
  // API launches untuned, so the choice must be measured against it
  if (std::find(timing_.begin(), timing_.end(), def_index_) == timing_.end() && (compiled_[def_index_] || stored_[def_index_]))
    timing_.push_back(def_index_);

  const auto t_timing = std::chrono::steady_clock::now();
  size_t done = 0;
  for (size_t i : timing_) {
    time_one(i);
    if (t_.opts_.progress) t_.opts_.progress({"time", ++done, timing_.size(), configs_[i].id()});
  }
  r_.timing_s = seconds_since(t_timing);
}

void Autotuner::Sweep::time_one(size_t i) {
  ConfigResult& cr = res_[i];
  if (stored_[i]) {
    cr.status = stored_[i]->correct ? ConfigStatus::Cached : ConfigStatus::WrongOutput;
    cr.ms = stored_[i]->ms;
    cr.note = stored_[i]->note;
    ++r_.cached;
  } else if (bench_failed_) {
    cr.status = ConfigStatus::Failed;
    cr.note = bench_error_;
  } else if (seconds_since(start_) > t_.opts_.budget_s) {
    cr.status = ConfigStatus::OverBudget;
    cr.note = fmt::format("the {:.0f} s budget ran out", t_.opts_.budget_s);
    r_.over_budget = true;
  } else {
    try {
      if (!prepared_) {
        if (!compiled_[def_index_])
          throw std::runtime_error(fmt::format("the default config {} did not compile: {}", configs_[def_index_].id(),
                                               errors_[def_index_]));
        Candidate ref{&configs_[def_index_], &fns_[def_index_], &*compiled_[def_index_],
                      t_.space_.grid_of(configs_[def_index_], ctx_)};
        t_.bench().prepare(t_.space_, ctx_, ref);
        prepared_ = true;
      }
      Candidate c = candidate(i);
      Bench::Result m = t_.bench().measure(c);
      Measurement rec{configs_[i].id(), m.correct ? m.ms : 0.0, m.correct, m.note, KernelResources::of(*compiled_[i])};
      if (store_) store_->store_measurement(id_, rec);
      cr.status = m.correct ? ConfigStatus::Timed : ConfigStatus::WrongOutput;
      cr.ms = m.correct ? m.ms : 0.0;
      // (a default the model drops is timed anyway: keep why the model dropped it)
      cr.note = cr.estimate.feasible || cr.estimate.reason.empty() ? m.note
                : m.note.empty()                                    ? cr.estimate.reason
                                                                    : cr.estimate.reason + "; " + m.note;
      ++r_.timed;
    } catch (const GpuHang& e) {  // the context is lost to the hung kernel: nothing more can be timed
      cr.status = ConfigStatus::Failed;
      cr.note = e.what();
      bench_failed_ = true;
      bench_error_ = fmt::format("config {} hung the GPU", configs_[i].id());
    } catch (const std::exception& e) {
      cr.status = ConfigStatus::Failed;
      cr.note = e.what();
      if (!prepared_) {  // nothing can be timed without inputs and a reference
        bench_failed_ = true;
        bench_error_ = e.what();
      }
    }
  }
}

void Autotuner::Sweep::rank_measured() {
  for (size_t i = 0; i < n_; ++i)
    if (res_[i].status == ConfigStatus::Timed || res_[i].status == ConfigStatus::Cached) {
      measured_.push_back(i);
      if (res_[i].ms > 0) res_[i].tflops = r_.flops / (res_[i].ms * 1e-3) / 1e12;
    }
  std::stable_sort(measured_.begin(), measured_.end(), [&](size_t a, size_t b) { return res_[a].ms < res_[b].ms; });
}

// Finalists: the (up to 3) configs within 10% of the best are timed again in finalist_rounds
// alternating rounds and ranked by the median of those, so that clock and power drift over the
// sweep cannot decide between near-equals (docs/decisions/040-timing-method.md).
void Autotuner::Sweep::retime_finalists() {
  if (!(prepared_ && !bench_failed_ && measured_.size() > 1 && t_.opts_.finalist_rounds > 0 &&
        seconds_since(start_) < t_.opts_.budget_s))
    return;
  std::vector<size_t> finalists;
  for (size_t k = 0; k < measured_.size() && finalists.size() < 3; ++k)
    if (res_[measured_[k]].ms <= res_[measured_.front()].ms * 1.10) finalists.push_back(measured_[k]);
  if (finalists.size() <= 1) return;
  std::vector<std::vector<double>> rounds(finalists.size());
  try {
    for (int round = 0; round < t_.opts_.finalist_rounds; ++round)
      for (size_t f = 0; f < finalists.size(); ++f) {
        Candidate c = candidate(finalists[f]);
        Bench::Result m = t_.bench().measure(c);
        if (m.correct) rounds[f].push_back(m.ms);
      }
    for (size_t f = 0; f < finalists.size(); ++f) {
      if (rounds[f].empty()) continue;
      std::sort(rounds[f].begin(), rounds[f].end());
      res_[finalists[f]].ms = rounds[f][rounds[f].size() / 2];
      res_[finalists[f]].tflops = r_.flops / (res_[finalists[f]].ms * 1e-3) / 1e12;
    }
    std::stable_sort(measured_.begin(), measured_.end(), [&](size_t a, size_t b) { return res_[a].ms < res_[b].ms; });
  } catch (const std::exception&) {
    // keep the sweep's ranking: a failure here does not invalidate the measurements
  }
}

TuneResult Autotuner::Sweep::persist() {
  for (size_t p = 0; p < measured_.size(); ++p) res_[measured_[p]].measured_rank = static_cast<int>(p + 1);
  if (res_[def_index_].measured_rank) r_.default_ms = res_[def_index_].ms;
  if (!measured_.empty()) {
    r_.best = configs_[measured_.front()];
    r_.best_ms = res_[measured_.front()].ms;
    if (store_)
      store_->store_choice(id_, Choice{r_.best.id(), r_.best_ms, fingerprint(t_.space_.enumerate(ctx_)), t_.opts_.exhaustive,
                                       t_.opts_.top_k});
  } else {
    r_.best = configs_[def_index_];
    r_.source = bench_failed_ ? "default (nothing could be timed: " + bench_error_ + ")" : "default";
  }
  std::sort(res_.begin(), res_.end(), [](const ConfigResult& a, const ConfigResult& b) {
    if ((a.model_rank == 0) != (b.model_rank == 0)) return b.model_rank == 0;
    return a.model_rank < b.model_rank;
  });
  r_.configs = std::move(res_);
  return std::move(r_);
}

}  // namespace tilejit::runtime
