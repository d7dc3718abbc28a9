// The autotuner: enumerates a tuning space, prunes it with the cost model, compiles the survivors
// in parallel, times them on the GPU and persists the results per config and per shape bucket.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/bundle.hpp"
#include "runtime/cost_model.hpp"
#include "runtime/function.hpp"
#include "runtime/tuning_space.hpp"

namespace tilejit::runtime {

// False when TILEJIT_AUTOTUNE is "0", "false", "off" or "no" (any case), read on every call: then
// choices come from loaded bundles or the disk store, else the space's default config, and nothing
// is ever timed.
bool autotune_enabled();

// ---- persistence ----------------------------------------------------------------------------

// What a tuning result is valid for: results never cross kernels, fixed meta, shape buckets, GPUs,
// drivers, tilejit versions, archs or backends.
struct TuningIdentity {
  std::string kernel, fixed, bucket, gpu, arch, backend;
  int sm_count = 0;
  int driver_version = 0;
  std::string text() const;  // one "name=value" line per component (what key() hashes)
  std::string key() const;   // 64 hex digits
};

// One timed config (or one rejected for a wrong output): stored per config so that a changed space
// re-times only the configs it has not seen.
struct Measurement {
  std::string config;  // TuningConfig::id()
  double ms = 0;       // median
  bool correct = true;
  std::string note;
  KernelResources resources;  // of the compiled kernel (the model's second pass uses it)
};

// The winner of one tuning run.
struct Choice {
  std::string config;       // TuningConfig::id()
  double ms = 0;
  std::string fingerprint;  // of the valid configs the run chose among
  bool exhaustive = false;
  int top_k = 0;
};

// Tuning entries live in the compile cache's directory as <key>.tjt, written and read with the
// same rules as its .tjk entries: temp file + fsync + rename, magic, format version, the stored
// identity and a SHA-256 checked on every read; a damaged or foreign entry is removed (if still
// the file read) and treated as a miss. An unwritable directory warns once and is never fatal.
//   "TILEJITT" | u32 format version | u32 header size (16) | str key | str identity text
//   | u8 kind (1 measurement, 2 choice) | kind fields | SHA-256 of everything before it
class TuningStore {
 public:
  // The compile cache's directory and switch (TILEJIT_CACHE_DIR, TILEJIT_CACHE=0, ...).
  static TuningStore& global();
  explicit TuningStore(std::filesystem::path dir, bool enabled = true);
  TuningStore(const TuningStore&) = delete;
  TuningStore& operator=(const TuningStore&) = delete;

  bool enabled() const { return enabled_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path measurement_path(const TuningIdentity& id, const std::string& config) const;
  std::filesystem::path choice_path(const TuningIdentity& id) const;

  // nullopt for a miss or a bad entry (then `problem` says what was wrong and the file is gone).
  std::optional<Measurement> load_measurement(const TuningIdentity& id, const std::string& config,
                                              std::string* problem = nullptr) const;
  bool store_measurement(const TuningIdentity& id, const Measurement& m) const;
  std::optional<Choice> load_choice(const TuningIdentity& id, std::string* problem = nullptr) const;
  bool store_choice(const TuningIdentity& id, const Choice& c) const;
  // Removes every tuning entry (and temporary files of dead writers); returns how many entries.
  size_t clear() const;
  size_t count() const;  // tuning entries in the directory

 private:
  std::optional<std::string> load_body(const std::filesystem::path& path, const std::string& key, uint8_t kind,
                                       std::string* problem) const;
  bool store_body(const std::filesystem::path& path, const std::string& key, const std::string& identity, uint8_t kind,
                  const std::string& body) const;
  void warn_once(const std::string& message) const;

  std::filesystem::path dir_;
  bool enabled_;
  mutable std::once_flag warned_;
};

// ---- bundles' tuning tables ------------------------------------------------------------------

struct TuningTableEntry {
  TuningIdentity identity;
  std::string config;
  double ms = 0;
};
// The bundle's tuning section (version kBundleTuningVersion):
//   u32 n | n x (str kernel | str fixed | str bucket | str gpu | str arch | str backend | i32 sm_count
//                | i32 driver | str config | u64 ms bits)
std::string encode_tuning_table(const std::vector<TuningTableEntry>& entries);
std::vector<TuningTableEntry> decode_tuning_table(std::string_view bytes);  // throws std::runtime_error
// The tables of every loaded bundle (runtime/bundle.hpp) that carries one of this version.
std::vector<TuningTableEntry> loaded_tuning_tables();

// ---- timing ----------------------------------------------------------------------------------

// One compiled config ready to time.
struct Candidate {
  const TuningConfig* config = nullptr;
  const ir::Function* fn = nullptr;
  const jit::CompiledKernel* compiled = nullptr;
  Grid grid;
};

// Times candidates of one problem. The GPU bench (make_gpu_bench) is the real one; tests inject a
// fake so that everything around timing runs without a GPU.
class Bench {
 public:
  struct Result {
    double ms = 0;
    bool correct = true;
    std::string note;  // why it is wrong, or what failed
  };
  virtual ~Bench() = default;
  // Once per tuning run, before measure(): make the inputs and the reference output with
  // `reference` (the space's default config).
  virtual void prepare(const TuningSpace& space, const TuningContext& ctx, const Candidate& reference) = 0;
  virtual Result measure(const Candidate& c) = 0;
  // How many programs of `c` one SM holds at once, as the driver counts them (0: unknown; the
  // model's occupancy rule stands). Needs no inputs: asked before prepare(), to rank.
  virtual int resident_programs(const Candidate&) { return 0; }
};

struct BenchOptions {
  int device = 0;
  double warmup_ms = 20;   // launches before timing, at least one
  double rep_ms = 60;      // time spent in timed repetitions per config
  int min_reps = 7, max_reps = 100;
  bool flush_l2 = true;    // overwrite a buffer twice the L2 size before every repetition
};
// CUDA events around every launch, warm-up, median of the repetitions, L2 flushed in between; each
// candidate's outputs are first checked against the reference's (a fast wrong config is rejected).
std::unique_ptr<Bench> make_gpu_bench(const BenchOptions& o = {});

// ---- the autotuner ---------------------------------------------------------------------------

struct TuneProgress {
  std::string phase;  // "compile" or "time"
  size_t done = 0, total = 0;
  std::string config;
};

struct AutotuneOptions {
  int top_k = 6;             // configs timed after the model's second ranking (the default is always timed too)
  int compile_k = 0;         // configs compiled for that ranking; 0: 2 * top_k
  bool exhaustive = false;   // compile and time every valid config
  bool force = false;        // ignore a stored choice (per-config measurements are still reused)
  int finalist_rounds = 5;   // re-time the (up to 3) configs within 10% of the best this many alternating rounds
  double budget_s = 120;     // the whole run; configs left untimed when it runs out are reported
  unsigned threads = 0;      // compile threads; 0: every core
  bool persist = true;       // read and write the tuning store
  jit::CompileOptions base;  // arch, backend, pipeline switch (warps/stages come from configs)
  BenchOptions bench;
  std::function<void(const TuneProgress&)> progress;
};

enum class ConfigStatus { Timed, Cached, Pruned, CompileFailed, Dropped, WrongOutput, OverBudget, Failed };
std::string_view to_string(ConfigStatus s);

struct ConfigResult {
  TuningConfig config;
  ConfigStatus status = ConfigStatus::Pruned;
  std::string note;
  CostEstimate estimate;     // the compiled one when compiled or measured, else the first pass
  int model_rank = 0;        // 1-based over every valid config, by `estimate`
  double ms = 0;             // measured median (Timed/Cached)
  int measured_rank = 0;     // 1-based among the correct measured configs, 0 otherwise
  double tflops = 0;
  Workload workload;           // what the model was given (printed term by term: `tilejit tune --csv`)
  KernelResources resources;   // of the compiled kernel, when compiled or measured (threads = 0 otherwise)
  bool is_default = false;     // the space's default: the configuration the API launches untuned
};

struct TuneResult {
  std::string kernel, bucket;
  Shape shape;
  TuningIdentity identity;
  TuningConfig best;
  double best_ms = 0;
  TuningConfig default_config;  // what the API launches without a tuned choice
  double default_ms = 0;        // its measured time (0 when it was not timed correctly)
  std::string source;        // "tuned", "disk", "bundle", "default", "model"
  size_t space_size = 0, valid = 0, compiled = 0, timed = 0, cached = 0;
  double wall_s = 0, compile_s = 0, timing_s = 0;
  double flops = 0;
  bool over_budget = false;
  std::vector<ConfigResult> configs;  // by model rank (empty for a cache hit)
};

using CompileFn = std::function<jit::CompiledKernel(const ir::Function&, const jit::CompileOptions&)>;

class Autotuner {
 public:
  explicit Autotuner(const TuningSpace& space, AutotuneOptions opts = {});
  Autotuner(Autotuner&&) noexcept = default;
  ~Autotuner();

  // Seams (tests): the compiler (default runtime::compile_cached), the bench (default the GPU
  // one, made on first need), the device model (default DeviceModel::current()), the store
  // (default TuningStore::global()).
  void set_compiler(CompileFn f) { compile_ = std::move(f); }
  void set_bench(std::unique_ptr<Bench> b);
  void set_device(DeviceModel d) { device_ = std::move(d); }
  void set_store(const TuningStore* s) { store_ = s; }
  const DeviceModel& device() const { return device_; }
  const AutotuneOptions& options() const { return opts_; }

  TuningContext context(const Shape& shape, const lang::Meta& fixed) const;
  TuningIdentity identity(const Shape& shape, const lang::Meta& fixed) const;
  // The kernel's whole non-tuned specialisation under `fixed` (defaults spelled out).
  lang::Meta canonical_fixed(const lang::Meta& fixed) const;

  // The model's ranking of every valid config: no compile, no GPU.
  TuneResult model_only(const Shape& shape, const lang::Meta& fixed) const;
  // A stored choice (bundles, then disk) acceptable for these options, or nullopt. Only a lookup.
  std::optional<TuneResult> lookup(const Shape& shape, const lang::Meta& fixed) const;
  // lookup(), else a tuning run (which reuses every stored per-config measurement).
  TuneResult tune(const Shape& shape, const lang::Meta& fixed);
  // What a kernel call uses: tune() when autotune_enabled(), else lookup() or the default config.
  TuneResult choose(const Shape& shape, const lang::Meta& fixed);

 private:
  class Sweep;  // one run()'s state and named steps (runtime/autotuner_run.cpp)
  TuneResult run(const Shape& shape, const lang::Meta& fixed);
  Bench& bench();

  const TuningSpace& space_;
  AutotuneOptions opts_;
  CompileFn compile_;
  std::unique_ptr<Bench> bench_;
  DeviceModel device_;
  const TuningStore* store_ = nullptr;
};

// A library of choices to put into a bundle: the kernels of the chosen configs (as bundle specs)
// and the tuning table that maps each identity to its config.
struct TunedBundleContent {
  std::vector<BundleEntrySpec> specs;  // the chosen configs' kernels (full meta, schedule)
  std::vector<TuningTableEntry> table;
};
void add_to_bundle_content(TunedBundleContent& content, const TuningSpace& space, const TuneResult& r,
                           const lang::Meta& fixed, const jit::CompileOptions& base);

// A kernel called like tilejit::Function whose config is chosen per shape bucket (Autotuner::choose
// on the first call of a bucket; later calls of the bucket only hash the key and launch; a bucket
// that got the default is chosen again once a bundle is loaded or unloaded). The grid comes from
// the space. Thread safe.
class TunedKernel {
 public:
  TunedKernel(const TuningSpace& space, lang::Meta fixed = {}, AutotuneOptions opts = {}, int device = 0);
  ~TunedKernel();
  void launch(CUstream stream, std::span<const DeviceArg> args);
  template <class... Args>
  void operator()(CUstream stream, const Args&... args) {
    const std::array<DeviceArg, sizeof...(Args)> packed{DeviceArg(args)...};
    launch(stream, packed);
  }
  // The config a call with these arguments uses (choosing it if needed; no launch).
  TuningConfig config_for(std::span<const DeviceArg> args);

 private:
  struct Entry;
  std::shared_ptr<Entry> entry_for(std::span<const DeviceArg> args, Shape& shape);
  const TuningSpace& space_;
  lang::Meta fixed_;
  AutotuneOptions opts_;
  int device_;
  std::mutex mutex_;
  std::vector<std::pair<std::string, std::shared_ptr<Entry>>> entries_;
};

}  // namespace tilejit::runtime
