// `tilejit tune`: tunes a library or plugin kernel ahead of time for given shapes (model ranking,
// parallel compiles, GPU timing, persisted results), prints the model's and the measured ranking
// side by side, and optionally writes the chosen kernels and tuning table into a bundle.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/meta_names.hpp"
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>

#include "commands.hpp"
#include "api/tuning.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/bundle.hpp"

namespace tilejit::cli {

namespace mn = kernels::meta_name;
namespace {

std::vector<int64_t> parse_ints(const std::string& what, const std::string& s) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string part = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      v.push_back(std::stoll(part, &used));
      if (used != part.size() || v.back() <= 0) throw std::invalid_argument("not positive");
    } catch (const std::exception&) {
      throw UsageError(fmt::format("{} {}: expected comma-separated positive integers", what, s));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

double parse_double(const std::string& what, const std::string& s) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    if (used == s.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("{} {}: expected a positive number", what, s));
}

// A progress bar on stderr: redrawn in place on a terminal, one line per phase otherwise.
class ProgressBar {
 public:
  void update(const runtime::TuneProgress& p) {
    std::lock_guard lock(mutex_);
    const bool tty = ::isatty(2);
    const int width = 30;
    const int filled = p.total ? static_cast<int>(width * p.done / p.total) : width;
    if (tty) {
      std::fprintf(stderr, "\r%-7s [%s%s] %zu/%zu %-60.60s", p.phase.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(width - filled), '.').c_str(), p.done, p.total, p.config.c_str());
      if (p.done == p.total) std::fputc('\n', stderr);
    } else if (p.phase == "time") {  // (a log then names the config a hang is in: the next one)
      std::fprintf(stderr, "time %zu/%zu %s\n", p.done, p.total, p.config.c_str());
    } else if (p.done == p.total) {
      std::fprintf(stderr, "%-7s [%s] %zu/%zu\n", p.phase.c_str(), std::string(static_cast<size_t>(width), '#').c_str(), p.done, p.total);
    }
    std::fflush(stderr);
  }

 private:
  std::mutex mutex_;
};

std::string ms_text(double ms) { return ms > 0 && std::isfinite(ms) ? fmt::format("{:.4f}", ms) : "-"; }

void print_table(const runtime::TuneResult& r, bool all, bool measured) {
  std::printf("%-62s %10s %6s %10s %6s %8s  %-22s %s\n", "config", "model ms", "model#", measured ? "measured" : "",
              measured ? "meas#" : "", measured ? "TFLOP/s" : "", "model's bound", "status");
  size_t pruned_shown = 0;
  for (const runtime::ConfigResult& c : r.configs) {
    if (c.status == runtime::ConfigStatus::Pruned && !all && ++pruned_shown > 10) continue;
    std::string status(runtime::to_string(c.status));
    if (c.is_default) status += " (default)";
    if (!c.note.empty()) status += ": " + c.note.substr(0, 120);
    std::printf("%-62s %10s %6s %10s %6s %8s  %-22s %s\n", c.config.id().c_str(), ms_text(c.estimate.ms).c_str(),
                c.model_rank ? std::to_string(c.model_rank).c_str() : "-", ms_text(c.ms).c_str(),
                c.measured_rank ? std::to_string(c.measured_rank).c_str() : "-",
                c.tflops > 0 ? fmt::format("{:.1f}", c.tflops).c_str() : "-", c.estimate.bound.c_str(), status.c_str());
  }
  if (!all && pruned_shown > 10) std::printf("(%zu more configs pruned by the model; --all lists them)\n", pruned_shown - 10);
}

// The model's terms for one config beside its measurement (issue 29: "prints the model's
// prediction term by term"): the busy time of each unit, the chains' own latency, memory, the tile
// ends and launch, and the occupancy they assume.
void print_terms(const char* what, const runtime::ConfigResult& c) {
  const runtime::CostEstimate& e = c.estimate;
  if (!e.feasible) return;
  std::string units = fmt::format("tensor cores {}", ms_text(e.compute_ms));
  if (c.workload.chain.present) units += fmt::format(", MUFU {}, FP32 {}, chain latency {}", ms_text(e.mufu_ms), ms_text(e.fp32_ms), ms_text(e.chain_ms));
  else units += fmt::format(", shared memory {}", ms_text(e.smem_ms));
  std::printf("  %s %s: %s, HBM %s, L2 %s, tile ends + launch %s; %d program(s) an SM%s%s -> %s ms predicted (%s), %s ms measured\n",
              what, c.config.id().c_str(), units.c_str(), ms_text(e.dram_ms).c_str(), ms_text(e.l2_ms).c_str(),
              ms_text(e.overhead_ms).c_str(), e.blocks_per_sm,
              c.workload.chain.present ? fmt::format(", {} chain(s)", e.chains_per_sm).c_str() : "",
              c.resources.resident_programs > 0 ? " (the driver's count)" : "", ms_text(e.ms).c_str(), e.bound.c_str(),
              ms_text(c.ms).c_str());
}

// --csv: one row per config of every shape, the model's terms beside the measurement and the
// compiled resources (what docs/performance-model.md checks the model against).
class CsvFile {
 public:
  explicit CsvFile(const std::string& path) : f_(std::fopen(path.c_str(), "w")) {
    if (!f_) throw UsageError(fmt::format("--csv {}: cannot open for writing", path));
    std::fprintf(f_, "kernel,shape,fixed,config,status,model_ms,model_rank,measured_ms,measured_rank,compute_ms,smem_ms,dram_ms,"
                     "l2_ms,overhead_ms,bound,blocks_per_sm,waves,programs,threads,stages,wgmma,mma_flops,registers,smem_bytes,"
                     "spill_bytes,mufu_ms,fp32_ms,chain_ms,chains_per_sm,serialized,note,is_default,resident_programs\n");
  }
  ~CsvFile() {
    if (f_) std::fclose(f_);
  }
  CsvFile(const CsvFile&) = delete;
  CsvFile& operator=(const CsvFile&) = delete;
  void write(const runtime::TuneResult& r, const std::string& fixed) {  // every config of one shape
    auto quoted = [](std::string s) {
      for (char& ch : s)
        if (ch == '"' || ch == '\n') ch = '\'';
      return "\"" + s + "\"";
    };
    for (const runtime::ConfigResult& c : r.configs) {
      const runtime::CostEstimate& e = c.estimate;
      std::fprintf(f_, "%s,%s,%s,%s,%s,%.6g,%d,%.6g,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%s,%d,%lld,%lld,%d,%d,%d,%.6g,%d,%lld,%d,%.6g,%.6g,%.6g,%d,%d,%s,%d,%d\n",
                   r.kernel.c_str(), quoted(runtime::describe_shape(r.shape)).c_str(), quoted(fixed).c_str(),
                   quoted(c.config.id()).c_str(), std::string(runtime::to_string(c.status)).c_str(), e.ms, c.model_rank, c.ms,
                   c.measured_rank, e.compute_ms, e.smem_ms, e.dram_ms, e.l2_ms, e.overhead_ms, quoted(e.bound).c_str(),
                   e.blocks_per_sm, static_cast<long long>(e.waves), static_cast<long long>(c.workload.programs),
                   c.resources.threads ? c.resources.threads : c.workload.threads, c.workload.stages, c.workload.wgmma ? 1 : 0,
                   c.workload.mma_flops, c.resources.registers, static_cast<long long>(c.resources.smem_bytes),
                   c.resources.spill_bytes, e.mufu_ms, e.fp32_ms, e.chain_ms, e.chains_per_sm, e.serialized ? 1 : 0,
                   quoted(c.note.substr(0, 200)).c_str(), c.is_default ? 1 : 0, c.resources.resident_programs);
    }
    std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

}  // namespace

int cmd_tune(const Args& args) {
  const std::string tunable = fmt::format("{}", fmt::join(library::tunable_kernels(), ", "));
  if (args.empty()) throw UsageError(fmt::format("tune needs a kernel name (tunable: {})", tunable));
  const std::string kernel = args[0];
  KernelSelection sel = select_kernel(kernel);
  const runtime::TuningSpace* space = library::find_tuning_space(kernel);
  if (!space) throw UsageError(fmt::format("kernel '{}' has no tuning space (tunable: {})", kernel, tunable));
  runtime::AutotuneOptions opts;
  std::vector<std::vector<int64_t>> shapes;
  std::string bundle, csv_path;
  bool all = false, model_only = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--num-warps" || a == "--stages") throw UsageError(fmt::format("{}: warps and stages are tuned", a));
    if (parse_kernel_option(args, i, sel)) continue;
    if (a == "--shape") shapes.push_back(parse_ints(a, option_value(args, i)));
    else if (a == "--top-k") opts.top_k = static_cast<int>(parse_ints(a, option_value(args, i)).at(0));
    else if (a == "--compile-k") opts.compile_k = static_cast<int>(parse_ints(a, option_value(args, i)).at(0));
    else if (a == "--budget-s") opts.budget_s = parse_double(a, option_value(args, i));
    else if (a == "--exhaustive") opts.exhaustive = true;
    else if (a == "--force") opts.force = true;
    else if (a == "--model-only") model_only = true;
    else if (a == "--all") all = true;
    else if (a == "--bundle") bundle = option_value(args, i);
    else if (a == "--csv") csv_path = option_value(args, i);
    else if (a == "--rep-ms") opts.bench.rep_ms = parse_double(a, option_value(args, i));
    else throw UsageError(fmt::format("unknown option '{}'", a));
  }
  if (shapes.empty()) throw UsageError(fmt::format("give at least one --shape {}", library::shape_names(kernel)));
  opts.base = sel.options;
  opts.base.num_warps = 4;  // set per config
  // as attention::forward compiles it, so that a tuned bundle's kernels are the ones the API looks up
  if (kernel == "attention_fwd" || kernel == "attention_bwd_dkdv" || kernel == "attention_bwd_dq") opts.base.specialize = false;
  ProgressBar bar;
  opts.progress = [&](const runtime::TuneProgress& p) { bar.update(p); };

  runtime::Driver& drv = runtime::Driver::get();
  const bool gpu = drv.available() && drv.device_count() > 0 && !model_only;
  if (!gpu && !bundle.empty()) throw UsageError("--bundle needs measured choices, so a GPU");
  if (!runtime::autotune_enabled())
    std::fprintf(stderr, "tilejit tune: note: TILEJIT_AUTOTUNE=%s is ignored here (tuning is what was asked for)\n",
                 std::getenv("TILEJIT_AUTOTUNE"));
  runtime::TunedBundleContent content;
  std::optional<CsvFile> csv;
  if (!csv_path.empty()) csv.emplace(csv_path);
  for (const std::vector<int64_t>& values : shapes) {
    runtime::Shape shape;
    try {
      shape = library::library_shape(kernel, values);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    lang::Meta user = sel.meta;
    auto unset = [&](const char* name) { return std::none_of(user.begin(), user.end(), [&](const auto& m) { return m.first == name; }); };
    const bool attention = kernel == "attention_fwd" || kernel == "attention_bwd_dkdv" || kernel == "attention_bwd_dq";
    if (attention && unset(mn::kHeadDim)) user.push_back({mn::kHeadDim, runtime::shape_get(shape, "D")});
    // the API's kernel for a positive scale (the tuning problem's is 1 / sqrt(D)): the fma softmax
    if (kernel == "attention_fwd" && unset(mn::kPositiveScale)) user.push_back({mn::kPositiveScale, true});
    if (attention && unset(mn::kBshd)) user.push_back({mn::kBshd, true});  // the API's layout
    lang::Meta fixed;
    try {
      fixed = library::library_fixed_meta(kernel, user);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    runtime::Autotuner tuner(*space, opts);
    const runtime::TuningIdentity id = tuner.identity(shape, fixed);
    std::printf("== %s %s (bucket %s) on %s, fixed %s\n", kernel.c_str(), runtime::describe_shape(shape).c_str(), id.bucket.c_str(),
                tuner.device().name.c_str(), id.fixed.c_str());
    if (!gpu) {
      std::printf("%s: the model's ranking only, nothing compiled or timed\n",
                  model_only ? "--model-only" : fmt::format("no GPU ({})", drv.unavailable_reason()).c_str());
      runtime::TuneResult r = tuner.model_only(shape, fixed);
      print_table(r, all, false);
      if (csv) csv->write(r, r.identity.fixed);
      std::printf("space: %zu configs, %zu satisfy the constraints; model's best: %s (%.4f ms estimated)\n", r.space_size, r.valid,
                  r.best.id().c_str(), r.best_ms);
      std::printf("the model's terms (per launch, each unit's busy time on the busiest SM):\n");
      for (const runtime::ConfigResult& c : r.configs) {
        if (c.model_rank == 1) print_terms("model's best", c);
        if (c.is_default && c.model_rank != 1) print_terms("default", c);
      }
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    runtime::TuneResult r;
    {
      // Autotuning is what was asked for, whatever TILEJIT_AUTOTUNE says.
      r = tuner.tune(shape, fixed);
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.source == "tuned") {
      print_table(r, all, true);
      if (csv) csv->write(r, r.identity.fixed);
      std::vector<int> model_rank, measured_rank;
      for (const runtime::ConfigResult& c : r.configs)
        if (c.measured_rank && c.estimate.feasible) {  // (a spilling default is timed, not ranked by the model)
          model_rank.push_back(c.model_rank);
          measured_rank.push_back(c.measured_rank);
        }
      std::printf("space: %zu configs, %zu valid, %zu compiled, %zu timed, %zu measurements reused; wall %.2f s (compile %.2f s, "
                  "timing %.2f s)%s\n",
                  r.space_size, r.valid, r.compiled, r.timed, r.cached, wall, r.compile_s, r.timing_s,
                  r.over_budget ? "; the time budget ran out" : "");
      if (measured_rank.size() > 1)
        std::printf("model vs measured rank correlation (Spearman, %zu configs): %.2f\n", measured_rank.size(),
                    runtime::rank_correlation(model_rank, measured_rank));
    } else {
      std::printf("from the %s (nothing compiled or timed): wall %.3f ms\n", r.source == "disk" ? "tuning store" : r.source.c_str(),
                  wall * 1e3);
    }
    const double tflops = r.best_ms > 0 ? r.flops / (r.best_ms * 1e-3) / 1e12 : 0;
    std::printf("best: %s  %s ms%s  [%s]\n", r.best.id().c_str(), ms_text(r.best_ms).c_str(),
                tflops > 0 ? fmt::format("  {:.1f} TFLOP/s", tflops).c_str() : "", r.source.c_str());
    if (r.source == "tuned") {
      std::printf("the model's terms (per launch, each unit's busy time on the busiest SM):\n");
      for (const runtime::ConfigResult& c : r.configs) {
        if (c.measured_rank == 1) print_terms("choice ", c);
        if (c.is_default && c.measured_rank != 1) print_terms("default", c);
      }
    }
    if (r.source == "tuned" && r.default_ms > 0)
      std::printf("default (what the API launches untuned): %s  %s ms; the choice is %.3fx faster\n", r.default_config.id().c_str(),
                  ms_text(r.default_ms).c_str(), r.default_ms / r.best_ms);
    if (!bundle.empty()) runtime::add_to_bundle_content(content, *space, r, fixed, opts.base);
  }
  if (!bundle.empty()) {
    runtime::Bundle b = runtime::make_bundle(content.specs);
    b.name = bundle;
    b.tuning = runtime::encode_tuning_table(content.table);
    runtime::save_bundle(bundle, b);
    std::printf("wrote %s: %zu kernels, a tuning table of %zu entries\n", bundle.c_str(), b.entries.size(), content.table.size());
  }
  return 0;
}

}  // namespace tilejit::cli
