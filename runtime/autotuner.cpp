// The autotuner: the tuning store (same file rules as the compile cache), bundles' tuning tables,
// the GPU bench, and the run itself: enumerate -> model (estimated resources) -> compile the best
// compile_k in parallel -> model again (compiled resources; spills and shared-memory overflows
// dropped) -> time the best top_k plus the default (reusing stored measurements) -> persist.
#include "runtime/autotuner.hpp"

#include "runtime/entry_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dsl/ir/sha256.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/kernel_codec.hpp"

namespace tilejit::runtime {

namespace fs = std::filesystem;

bool autotune_enabled() {
  const char* v = std::getenv("TILEJIT_AUTOTUNE");
  if (!v) return true;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(s == "0" || s == "false" || s == "off" || s == "no");
}

// ---- identity --------------------------------------------------------------------------------

std::string TuningIdentity::text() const {
  return fmt::format(
      "tilejit-tuning-key v1\ntilejit={}\nkernel={}\nfixed={}\nbucket={}\ngpu={}\nsm_count={}\ndriver={}\narch={}\n"
      "backend={}\n",
      codec::kTilejitVersion, kernel, fixed, bucket, gpu, sm_count, driver_version, arch, backend);
}

std::string TuningIdentity::key() const { return ir::sha256_hex(text()); }

// ---- the store -------------------------------------------------------------------------------

namespace {

constexpr char kMagic[8] = {'T', 'I', 'L', 'E', 'J', 'I', 'T', 'T'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kHeaderSize = 16;
constexpr size_t kChecksumSize = 32;
constexpr std::string_view kSuffix = ".tjt";
constexpr std::string_view kTempMarker = ".tjt.tmp-";
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 20;  // entries are a few hundred bytes
constexpr uint8_t kMeasurementKind = 1, kChoiceKind = 2;

uint64_t f64_bits(double v) { return std::bit_cast<uint64_t>(v); }
double bits_f64(uint64_t v) { return std::bit_cast<double>(v); }

uint32_t read_u32_at(std::string_view d, size_t pos) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(d[pos + i])} << (8 * i);
  return v;
}

std::string encode_measurement(const Measurement& m) {
  codec::Writer w;
  w.str(m.config);
  w.u64(f64_bits(m.ms));
  w.u8(m.correct ? 1 : 0);
  w.str(m.note);
  w.i32(m.resources.registers);
  w.i64(m.resources.smem_bytes);
  w.i32(m.resources.spill_bytes);
  w.i32(m.resources.threads);
  return std::move(w.out());
}

Measurement decode_measurement(codec::Reader& r) {
  Measurement m;
  m.config = r.str("config");
  m.ms = bits_f64(r.u64("ms"));
  uint8_t ok = r.u8("correct");
  if (ok > 1) throw codec::DecodeError(fmt::format("correct flag {} is not 0 or 1", ok));
  m.correct = ok == 1;
  m.note = r.str("note");
  m.resources.registers = r.i32("registers");
  m.resources.smem_bytes = r.i64("smem bytes");
  m.resources.spill_bytes = r.i32("spill bytes");
  m.resources.threads = r.i32("threads");
  if (!std::isfinite(m.ms) || m.ms < 0) throw codec::DecodeError(fmt::format("time {} ms is not a time", m.ms));
  return m;
}

std::string encode_choice(const Choice& c) {
  codec::Writer w;
  w.str(c.config);
  w.u64(f64_bits(c.ms));
  w.str(c.fingerprint);
  w.u8(c.exhaustive ? 1 : 0);
  w.i32(c.top_k);
  return std::move(w.out());
}

Choice decode_choice(codec::Reader& r) {
  Choice c;
  c.config = r.str("config");
  c.ms = bits_f64(r.u64("ms"));
  c.fingerprint = r.str("fingerprint");
  uint8_t ex = r.u8("exhaustive");
  if (ex > 1) throw codec::DecodeError(fmt::format("exhaustive flag {} is not 0 or 1", ex));
  c.exhaustive = ex == 1;
  c.top_k = r.i32("top_k");
  if (!std::isfinite(c.ms) || c.ms < 0) throw codec::DecodeError(fmt::format("time {} ms is not a time", c.ms));
  return c;
}

}  // namespace

TuningStore& TuningStore::global() {
  static TuningStore store = [] {
    fs::path dir = CompileCache::default_dir();
    return TuningStore(dir, CompileCache::default_enabled() && !dir.empty());
  }();
  return store;
}

TuningStore::TuningStore(fs::path dir, bool enabled) : dir_(std::move(dir)), enabled_(enabled && !dir_.empty()) {}

fs::path TuningStore::measurement_path(const TuningIdentity& id, const std::string& config) const {
  return dir_ / (ir::sha256_hex(id.text() + "config=" + config + "\n") + std::string(kSuffix));
}

fs::path TuningStore::choice_path(const TuningIdentity& id) const {
  return dir_ / (ir::sha256_hex(id.text() + "choice\n") + std::string(kSuffix));
}

void TuningStore::warn_once(const std::string& message) const {
  std::call_once(warned_, [&] {
    std::fprintf(stderr, "tilejit: warning: %s (further tuning-store warnings for %s are not shown)\n", message.c_str(),
                 dir_.c_str());
  });
}

std::optional<std::string> TuningStore::load_body(const fs::path& path, const std::string& key, uint8_t kind,
                                                  std::string* problem) const {
  if (problem) problem->clear();
  if (!enabled_) return std::nullopt;
  std::string error;
  std::optional<entry_file::Bytes> file = entry_file::read(path, kMaxEntryBytes, error);
  if (!file) {
    if (!error.empty()) {
      if (problem) *problem = error;
      warn_once(fmt::format("tuning entry {}: {}; it is re-tuned", path.string(), error));
    }
    return std::nullopt;
  }
  const std::string_view d = file->data;
  std::string bad;
  std::string body;
  if (d.size() >= sizeof kMagic && std::memcmp(d.data(), kMagic, sizeof kMagic) != 0) {
    bad = "not a tilejit tuning entry (wrong magic)";
  } else if (d.size() < kHeaderSize + kChecksumSize) {
    bad = fmt::format("truncated: {} bytes, fewer than the header and checksum alone", d.size());
  } else if (uint32_t v = read_u32_at(d, 8); v != kFormatVersion) {
    bad = fmt::format("format version {} (this tilejit reads version {})", v, kFormatVersion);
  } else if (uint32_t h = read_u32_at(d, 12); h < kHeaderSize || h > d.size() - kChecksumSize) {
    bad = fmt::format("header size {} out of range", h);
  } else {
    const size_t end = d.size() - kChecksumSize;
    auto sum = ir::sha256(d.substr(0, end));
    if (std::memcmp(sum.data(), d.data() + end, kChecksumSize) != 0) {
      bad = "checksum mismatch: the entry is truncated or corrupt";
    } else {
      try {
        codec::Reader r(d, read_u32_at(d, 12), end);
        std::string stored = r.str("key");
        (void)r.str("identity");
        uint8_t k = r.u8("kind");
        if (stored != key) bad = "holds the entry of another key (a foreign entry copied or renamed here)";
        else if (k != kind) bad = fmt::format("holds an entry of kind {}, expected {}", k, kind);
        else body = std::string(d.substr(r.pos(), end - r.pos()));
      } catch (const codec::DecodeError& e) {
        bad = e.what();
      }
    }
  }
  if (bad.empty()) return body;
  entry_file::remove_if_same(path, *file);
  if (problem) *problem = bad;
  warn_once(fmt::format("tuning entry {}: {}; removed, it is re-tuned", path.string(), bad));
  return std::nullopt;
}

bool TuningStore::store_body(const fs::path& path, const std::string& key, const std::string& identity, uint8_t kind,
                             const std::string& body) const {
  if (!enabled_) return false;
  codec::Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.u32(kFormatVersion);
  w.u32(kHeaderSize);
  w.str(key);
  w.str(identity);
  w.u8(kind);
  w.bytes(body.data(), body.size());
  auto sum = ir::sha256(w.out());
  w.bytes(sum.data(), sum.size());
  const std::string& data = w.out();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    warn_once(fmt::format("cannot create the tuning directory {}: {}; results are not kept", dir_.string(), ec.message()));
    return false;
  }
  std::string failure = entry_file::write_atomically(path, kTempMarker, data);
  if (!failure.empty()) {
    warn_once(fmt::format("cannot write tuning entry {}: {}", path.string(), failure));
    return false;
  }
  return true;
}

std::optional<Measurement> TuningStore::load_measurement(const TuningIdentity& id, const std::string& config,
                                                         std::string* problem) const {
  const fs::path path = measurement_path(id, config);
  std::optional<std::string> body = load_body(path, path.stem().string(), kMeasurementKind, problem);
  if (!body) return std::nullopt;
  try {
    codec::Reader r(*body, 0, body->size());
    Measurement m = decode_measurement(r);
    if (r.left() != 0 || m.config != config) throw codec::DecodeError("fields do not match the entry's name");
    return m;
  } catch (const codec::DecodeError& e) {
    ::unlink(path.c_str());
    if (problem) *problem = e.what();
    return std::nullopt;
  }
}

bool TuningStore::store_measurement(const TuningIdentity& id, const Measurement& m) const {
  const fs::path path = measurement_path(id, m.config);
  return store_body(path, path.stem().string(), id.text() + "config=" + m.config + "\n", kMeasurementKind, encode_measurement(m));
}

std::optional<Choice> TuningStore::load_choice(const TuningIdentity& id, std::string* problem) const {
  const fs::path path = choice_path(id);
  std::optional<std::string> body = load_body(path, path.stem().string(), kChoiceKind, problem);
  if (!body) return std::nullopt;
  try {
    codec::Reader r(*body, 0, body->size());
    Choice c = decode_choice(r);
    if (r.left() != 0) throw codec::DecodeError("unexpected bytes after the last field");
    return c;
  } catch (const codec::DecodeError& e) {
    ::unlink(path.c_str());
    if (problem) *problem = e.what();
    return std::nullopt;
  }
}

bool TuningStore::store_choice(const TuningIdentity& id, const Choice& c) const {
  const fs::path path = choice_path(id);
  return store_body(path, path.stem().string(), id.text() + "choice\n", kChoiceKind, encode_choice(c));
}

size_t TuningStore::clear() const {
  size_t removed = 0;
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (it->path().extension() == kSuffix || name.find(kTempMarker) != std::string::npos) doomed.push_back(it->path());
  }
  for (const fs::path& p : doomed) {
    std::error_code rec;
    if (fs::remove(p, rec) && p.extension() == kSuffix) ++removed;
  }
  return removed;
}

size_t TuningStore::count() const {
  size_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == kSuffix) ++n;
  return n;
}

// ---- tuning tables ---------------------------------------------------------------------------

std::string encode_tuning_table(const std::vector<TuningTableEntry>& entries) {
  codec::Writer w;
  w.count(entries.size());
  for (const TuningTableEntry& e : entries) {
    const TuningIdentity& i = e.identity;
    w.str(i.kernel);
    w.str(i.fixed);
    w.str(i.bucket);
    w.str(i.gpu);
    w.str(i.arch);
    w.str(i.backend);
    w.i32(i.sm_count);
    w.i32(i.driver_version);
    w.str(e.config);
    w.u64(f64_bits(e.ms));
  }
  return std::move(w.out());
}

std::vector<TuningTableEntry> decode_tuning_table(std::string_view bytes) {
  std::vector<TuningTableEntry> out;
  if (bytes.empty()) return out;
  try {
    codec::Reader r(bytes, 0, bytes.size());
    size_t n = r.count("tuning entries", 7 * 8 + 16);
    for (size_t k = 0; k < n; ++k) {
      TuningTableEntry e;
      TuningIdentity& i = e.identity;
      i.kernel = r.str("kernel");
      i.fixed = r.str("fixed meta");
      i.bucket = r.str("bucket");
      i.gpu = r.str("gpu");
      i.arch = r.str("arch");
      i.backend = r.str("backend");
      i.sm_count = r.i32("sm count");
      i.driver_version = r.i32("driver version");
      e.config = r.str("config");
      e.ms = bits_f64(r.u64("ms"));
      (void)parse_config(e.config);  // throws for a malformed config
      out.push_back(std::move(e));
    }
    if (r.left() != 0) throw codec::DecodeError(fmt::format("{} unexpected bytes after the last entry", r.left()));
  } catch (const codec::DecodeError& e) {
    throw std::runtime_error(fmt::format("tilejit: bundle tuning table: damaged: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("tilejit: bundle tuning table: {}", e.what()));
  }
  return out;
}

std::vector<TuningTableEntry> loaded_tuning_tables() {
  std::vector<TuningTableEntry> all;
  for (const LoadedBundle& b : loaded_bundles()) {
    if (b.tuning.empty() || b.tuning_version != kBundleTuningVersion) continue;
    try {
      std::vector<TuningTableEntry> t = decode_tuning_table(b.tuning);
      all.insert(all.end(), t.begin(), t.end());
    } catch (const std::exception& e) {
      // The bundle's kernels are still good (the file's checksum passed); only its table is unusable.
      std::fprintf(stderr, "%s (bundle %s); its kernels still load, their choices fall back to the defaults\n", e.what(),
                   b.name.c_str());
    }
  }
  return all;
}

// ---- the GPU bench ---------------------------------------------------------------------------

namespace {

struct OutputCompare {
  double rel = 0;
  int64_t nonfinite = 0;  // elements finite in the reference but not in the candidate
};

// Identical bytes are the common case (same K order) and cost a memcmp; otherwise a streaming
// relative L2 error, so 100M-element outputs need no second copy.
OutputCompare compare_outputs(const HostTensor& got, const HostTensor& ref) {
  OutputCompare c;
  if (got.bytes() == ref.bytes() && std::memcmp(got.data(), ref.data(), got.bytes()) == 0) return c;
  double num = 0, den = 0;
  for (int64_t i = 0, n = ref.numel(); i < n; ++i) {
    double r = ref.get_flat(i), g = got.get_flat(i);
    if (std::isfinite(r) && !std::isfinite(g)) {
      ++c.nonfinite;
      continue;
    }
    if (!std::isfinite(r)) continue;
    num += (g - r) * (g - r);
    den += r * r;
  }
  c.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

class GpuBench final : public Bench {
 public:
  explicit GpuBench(const BenchOptions& o) : o_(o) {}

  void prepare(const TuningSpace& space, const TuningContext& ctx, const Candidate& reference) override {
    Driver& drv = Driver::get();
    drv.require(fmt::format("timing kernel '{}'", space.kernel_name()));
    data_ = space.make_problem(ctx);
    dev_.clear();
    dev_.reserve(data_.args.size());
    args_.clear();
    for (const Arg& a : data_.args)
      if (a.kind() == Arg::Kind::Buffer) dev_.push_back(DeviceTensor::from_host(*a.tensor(), o_.device));
    size_t t = 0;
    for (const Arg& a : data_.args) {
      switch (a.kind()) {
        case Arg::Kind::Buffer: args_.emplace_back(dev_[t++]); break;
        case Arg::Kind::Float: args_.emplace_back(a.as_double()); break;
        case Arg::Kind::UInt: args_.emplace_back(a.as_uint()); break;
        case Arg::Kind::Bool: args_.emplace_back(a.as_bool()); break;
        case Arg::Kind::Int: args_.emplace_back(a.as_int()); break;
      }
    }
    if (o_.flush_l2 && !flush_.bytes()) {
      size_t l2 = drv.props(o_.device).l2_bytes;
      flush_ = DeviceBuffer(std::max<size_t>(2 * l2, size_t{64} << 20), o_.device);
    }
    if (!stream_) stream_ = std::make_unique<Stream>(o_.device);
    GpuKernel k(*reference.fn, *reference.compiled, o_.device);
    ref_ = run_once(k, reference.grid);
  }

  Result measure(const Candidate& c) override {
    Result res;
    GpuKernel k(*c.fn, *c.compiled, o_.device);
    std::vector<HostTensor> out = run_once(k, c.grid);
    for (size_t i = 0; i < out.size(); ++i) {
      OutputCompare cmp = compare_outputs(out[i], ref_[i]);
      if (cmp.nonfinite > 0 || !(cmp.rel <= data_.tolerance)) {
        res.correct = false;
        res.note = fmt::format("output {} differs from the default config's: {} non-finite elements, rel. error {:.3g} "
                               "(tolerance {:.3g})",
                               data_.outputs[i], cmp.nonfinite, cmp.rel, data_.tolerance);
        return res;
      }
    }
    res.ms = time(k, c.grid);
    return res;
  }

 private:
  std::vector<HostTensor> run_once(const GpuKernel& k, Grid grid) {
    size_t t = 0;
    std::vector<size_t> tensor_index(data_.args.size(), 0);
    for (size_t i = 0; i < data_.args.size(); ++i)
      if (data_.args[i].kind() == Arg::Kind::Buffer) tensor_index[i] = t++;
    for (size_t o : data_.outputs) dev_[tensor_index[o]].poison();  // unwritten outputs show as NaN
    k.launch(grid, args_, stream_->handle());
    stream_->synchronize();
    std::vector<HostTensor> out;
    for (size_t o : data_.outputs) out.push_back(dev_[tensor_index[o]].to_host());
    return out;
  }

  double time(const GpuKernel& k, Grid grid) {
    CUstream s = stream_->handle();
    const DriverApi& api = Driver::get().api();
    auto flush = [&] {
      if (flush_.bytes()) check_cu(api.MemsetD8Async(flush_.ptr(), 0, flush_.bytes(), s), "cuMemsetD8Async (L2 flush)");
    };
    // Warm-up, also measuring one launch to size the repetitions.
    Event w0(o_.device), w1(o_.device);
    int warm = 0;
    double warm_ms = 0, one_ms = 0;
    while (warm < 1 || warm_ms < o_.warmup_ms) {
      flush();
      w0.record(s);
      k.launch(grid, args_, s);
      w1.record(s);
      w1.synchronize();
      one_ms = w1.elapsed_ms(w0);
      warm_ms += std::max(one_ms, 1e-3);
      if (++warm >= 1000) break;
    }
    const int reps = std::clamp(static_cast<int>(o_.rep_ms / std::max(one_ms, 1e-3)), o_.min_reps, o_.max_reps);
    std::vector<Event> starts, ends;
    starts.reserve(static_cast<size_t>(reps));
    ends.reserve(static_cast<size_t>(reps));
    for (int i = 0; i < reps; ++i) {
      starts.emplace_back(o_.device);
      ends.emplace_back(o_.device);
    }
    for (int i = 0; i < reps; ++i) {
      flush();  // outside the events: the kernel starts with a cold L2
      starts[static_cast<size_t>(i)].record(s);
      k.launch(grid, args_, s);
      ends[static_cast<size_t>(i)].record(s);
    }
    ends.back().synchronize();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) ms.push_back(ends[static_cast<size_t>(i)].elapsed_ms(starts[static_cast<size_t>(i)]));
    std::nth_element(ms.begin(), ms.begin() + static_cast<long>(ms.size() / 2), ms.end());
    return ms[ms.size() / 2];
  }

  BenchOptions o_;
  ProblemData data_;
  std::vector<DeviceTensor> dev_;
  std::vector<DeviceArg> args_;
  std::vector<HostTensor> ref_;
  DeviceBuffer flush_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

std::unique_ptr<Bench> make_gpu_bench(const BenchOptions& o) { return std::make_unique<GpuBench>(o); }

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

namespace {

std::string fingerprint(const std::vector<TuningConfig>& configs) {
  std::string all;
  for (const TuningConfig& c : configs) all += c.id() + "\n";
  return ir::sha256_hex(all);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TuneResult Autotuner::model_only(const Shape& shape, const lang::Meta& fixed) const {
  TuneResult r;
  r.kernel = space_.kernel_name();
  r.shape = shape;
  r.bucket = space_.bucket(shape);
  r.identity = identity(shape, fixed);
  r.source = "model";
  const TuningContext ctx = context(shape, fixed);
  std::vector<TuningConfig> configs = space_.enumerate(ctx);
  r.space_size = space_.size();
  r.valid = configs.size();
  std::vector<CostEstimate> est;
  for (const TuningConfig& c : configs) est.push_back(estimate(space_.workload_of(c, ctx), device_));
  std::vector<size_t> order = rank_by_model(est);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t k = order[i];
    ConfigResult cr;
    cr.config = configs[k];
    cr.estimate = est[k];
    cr.model_rank = static_cast<int>(i + 1);
    cr.status = est[k].feasible ? ConfigStatus::Pruned : ConfigStatus::Dropped;
    cr.note = est[k].reason;
    r.configs.push_back(std::move(cr));
  }
  r.flops = configs.empty() ? 0 : space_.workload_of(configs.front(), ctx).flops;
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
  r.best = space_.default_config();
  r.source = "default";
  r.space_size = space_.size();
  return r;
}

TuneResult Autotuner::run(const Shape& shape, const lang::Meta& fixed) {
  const auto t_start = std::chrono::steady_clock::now();
  const TuningContext ctx = context(shape, fixed);
  const TuningIdentity id = identity(shape, fixed);
  const TuningStore* store = opts_.persist ? (store_ ? store_ : &TuningStore::global()) : nullptr;

  TuneResult r;
  r.kernel = space_.kernel_name();
  r.shape = shape;
  r.bucket = id.bucket;
  r.identity = id;
  r.source = "tuned";
  r.space_size = space_.size();

  std::vector<TuningConfig> configs = space_.enumerate(ctx);
  r.valid = configs.size();
  const TuningConfig& def = space_.default_config();
  size_t def_index = configs.size();
  for (size_t i = 0; i < configs.size(); ++i)
    if (configs[i] == def) def_index = i;
  if (def_index == configs.size()) {  // the reference is compiled and timed even outside the constraints
    configs.push_back(def);
    def_index = configs.size() - 1;
  }
  const size_t n = configs.size();
  std::vector<Workload> work(n);
  std::vector<ConfigResult> res(n);
  for (size_t i = 0; i < n; ++i) {
    work[i] = space_.workload_of(configs[i], ctx);
    res[i].config = configs[i];
    res[i].estimate = estimate(work[i], device_);
    res[i].status = res[i].estimate.feasible ? ConfigStatus::Pruned : ConfigStatus::Dropped;
    res[i].note = res[i].estimate.reason;
  }
  r.flops = work[def_index].flops;

  // Stored measurements: a config measured before needs neither compile nor timing.
  std::vector<std::optional<Measurement>> stored(n);
  if (store)
    for (size_t i = 0; i < n; ++i) stored[i] = store->load_measurement(id, configs[i].id());

  // First pass: compile the best compile_k by the model (every feasible config when exhaustive).
  const size_t top_k = static_cast<size_t>(std::max(1, opts_.top_k));
  const size_t compile_k = opts_.compile_k > 0 ? static_cast<size_t>(opts_.compile_k) : 2 * top_k;
  std::vector<size_t> order;
  {
    std::vector<CostEstimate> e;
    for (const ConfigResult& c : res) e.push_back(c.estimate);
    order = rank_by_model(e);
  }
  std::vector<bool> wanted(n, false);
  size_t picked = 0;
  for (size_t k : order) {
    if (!res[k].estimate.feasible) continue;
    if (!opts_.exhaustive && picked >= std::max(compile_k, top_k)) break;
    wanted[k] = true;
    ++picked;
  }
  wanted[def_index] = true;

  // Configs with a stored measurement take their resources from it; the rest are compiled, and
  // the default always is (it makes the reference output).
  std::vector<ir::Function> fns(n);
  std::vector<std::optional<jit::CompiledKernel>> compiled(n);
  std::vector<std::string> errors(n);
  std::vector<size_t> jobs;
  for (size_t i = 0; i < n; ++i)
    if (wanted[i] && (!stored[i] || i == def_index)) jobs.push_back(i);
  const auto t_compile = std::chrono::steady_clock::now();
  for (size_t i : jobs) {
    try {
      fns[i] = space_.build_ir(configs[i], fixed);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  {
    std::atomic<size_t> next{0}, done{0};
    std::mutex progress_mutex;
    unsigned threads = opts_.threads ? opts_.threads : std::max(1u, std::thread::hardware_concurrency());
    threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(jobs.size(), 1)));
    auto worker = [&] {
      for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
        const size_t i = jobs[j];
        if (errors[i].empty()) {
          try {
            compiled[i] = compile_(fns[i], configs[i].options(opts_.base));
          } catch (const std::exception& e) {
            errors[i] = e.what();
          }
        }
        size_t d = ++done;
        if (opts_.progress) {
          std::lock_guard lock(progress_mutex);
          opts_.progress({"compile", d, jobs.size(), configs[i].id()});
        }
      }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
  }
  r.compile_s = seconds_since(t_compile);

  // Second pass: the model with compiled (or stored) resources.
  for (size_t i = 0; i < n; ++i) {
    if (!wanted[i]) continue;
    const KernelResources* rs = nullptr;
    KernelResources from;
    Workload w = work[i];
    if (compiled[i]) {
      from = KernelResources::of(*compiled[i]);
      rs = &from;
      ++r.compiled;
      // The wgmma path is what the compiler chose, not what the space hoped for.
      if (w.wgmma && compiled[i]->tensor_maps.empty()) w.wgmma = false;
    } else if (stored[i]) {
      from = stored[i]->resources;
      rs = &from;
    }
    if (!errors[i].empty()) {
      res[i].status = ConfigStatus::CompileFailed;
      res[i].note = errors[i];
      res[i].estimate.feasible = false;
      res[i].estimate.ms = INFINITY;
      continue;
    }
    res[i].estimate = estimate(w, device_, rs);
    res[i].status = res[i].estimate.feasible ? ConfigStatus::Pruned : ConfigStatus::Dropped;
    res[i].note = res[i].estimate.reason;
  }
  {
    std::vector<CostEstimate> e;
    for (const ConfigResult& c : res) e.push_back(c.estimate);
    order = rank_by_model(e);
    for (size_t p = 0; p < order.size(); ++p) res[order[p]].model_rank = static_cast<int>(p + 1);
  }

  // Timing: the best top_k by the second pass (all feasible when exhaustive), plus the default.
  std::vector<size_t> timing;
  for (size_t k : order) {
    if (!wanted[k] || !res[k].estimate.feasible) continue;
    if (!opts_.exhaustive && timing.size() >= top_k) break;
    timing.push_back(k);
  }
  if (std::find(timing.begin(), timing.end(), def_index) == timing.end() && res[def_index].estimate.feasible)
    timing.push_back(def_index);

  const auto t_timing = std::chrono::steady_clock::now();
  bool prepared = false, bench_failed = false;
  std::string bench_error;
  size_t done = 0;
  for (size_t i : timing) {
    ConfigResult& cr = res[i];
    if (stored[i]) {
      cr.status = stored[i]->correct ? ConfigStatus::Cached : ConfigStatus::WrongOutput;
      cr.ms = stored[i]->ms;
      cr.note = stored[i]->note;
      ++r.cached;
    } else if (bench_failed) {
      cr.status = ConfigStatus::Failed;
      cr.note = bench_error;
    } else if (seconds_since(t_start) > opts_.budget_s) {
      cr.status = ConfigStatus::OverBudget;
      cr.note = fmt::format("the {:.0f} s budget ran out", opts_.budget_s);
      r.over_budget = true;
    } else {
      try {
        if (!prepared) {
          if (!compiled[def_index])
            throw std::runtime_error(fmt::format("the default config {} did not compile: {}", def.id(), errors[def_index]));
          Candidate ref{&configs[def_index], &fns[def_index], &*compiled[def_index], space_.grid_of(configs[def_index], ctx)};
          bench().prepare(space_, ctx, ref);
          prepared = true;
        }
        if (!compiled[i]) {  // stored resources but no measurement cannot happen; compile late if it does
          fns[i] = space_.build_ir(configs[i], fixed);
          compiled[i] = compile_(fns[i], configs[i].options(opts_.base));
        }
        Candidate c{&configs[i], &fns[i], &*compiled[i], space_.grid_of(configs[i], ctx)};
        Bench::Result m = bench().measure(c);
        Measurement rec{configs[i].id(), m.correct ? m.ms : 0.0, m.correct, m.note, KernelResources::of(*compiled[i])};
        if (store) store->store_measurement(id, rec);
        cr.status = m.correct ? ConfigStatus::Timed : ConfigStatus::WrongOutput;
        cr.ms = m.correct ? m.ms : 0.0;
        cr.note = m.note;
        ++r.timed;
      } catch (const std::exception& e) {
        cr.status = ConfigStatus::Failed;
        cr.note = e.what();
        if (!prepared) {  // nothing can be timed without inputs and a reference
          bench_failed = true;
          bench_error = e.what();
        }
      }
    }
    if (opts_.progress) opts_.progress({"time", ++done, timing.size(), configs[i].id()});
  }
  r.timing_s = seconds_since(t_timing);

  // Measured ranks and the winner.
  std::vector<size_t> measured;
  for (size_t i = 0; i < n; ++i)
    if (res[i].status == ConfigStatus::Timed || res[i].status == ConfigStatus::Cached) {
      measured.push_back(i);
      if (res[i].ms > 0) res[i].tflops = r.flops / (res[i].ms * 1e-3) / 1e12;
    }
  std::stable_sort(measured.begin(), measured.end(), [&](size_t a, size_t b) { return res[a].ms < res[b].ms; });
  // Finalists: configs within 10% of the best are timed again in alternating rounds and ranked by
  // the median of those, so that clock and power drift over the sweep cannot decide between
  // near-equals (measured on an H100: one config 751 vs 659 TFLOP/s minutes apart).
  if (prepared && !bench_failed && measured.size() > 1 && opts_.finalist_rounds > 0 &&
      seconds_since(t_start) < opts_.budget_s) {
    std::vector<size_t> finalists;
    for (size_t k = 0; k < measured.size() && finalists.size() < 3; ++k)
      if (res[measured[k]].ms <= res[measured.front()].ms * 1.10) finalists.push_back(measured[k]);
    if (finalists.size() > 1) {
      std::vector<std::vector<double>> rounds(finalists.size());
      try {
        for (int round = 0; round < opts_.finalist_rounds; ++round)
          for (size_t f = 0; f < finalists.size(); ++f) {
            size_t i = finalists[f];
            if (!compiled[i]) {
              fns[i] = space_.build_ir(configs[i], fixed);
              compiled[i] = compile_(fns[i], configs[i].options(opts_.base));
            }
            Candidate c{&configs[i], &fns[i], &*compiled[i], space_.grid_of(configs[i], ctx)};
            Bench::Result m = bench().measure(c);
            if (m.correct) rounds[f].push_back(m.ms);
          }
        for (size_t f = 0; f < finalists.size(); ++f) {
          if (rounds[f].empty()) continue;
          std::sort(rounds[f].begin(), rounds[f].end());
          res[finalists[f]].ms = rounds[f][rounds[f].size() / 2];
          res[finalists[f]].tflops = r.flops / (res[finalists[f]].ms * 1e-3) / 1e12;
        }
        std::stable_sort(measured.begin(), measured.end(), [&](size_t a, size_t b) { return res[a].ms < res[b].ms; });
      } catch (const std::exception&) {
        // keep the sweep's ranking: a failure here does not invalidate the measurements
      }
    }
  }
  for (size_t p = 0; p < measured.size(); ++p) res[measured[p]].measured_rank = static_cast<int>(p + 1);
  if (!measured.empty()) {
    r.best = configs[measured.front()];
    r.best_ms = res[measured.front()].ms;
    if (store)
      store->store_choice(id, Choice{r.best.id(), r.best_ms, fingerprint(space_.enumerate(ctx)), opts_.exhaustive,
                                     opts_.top_k});
  } else {
    r.best = def;
    r.source = bench_failed ? "default (nothing could be timed: " + bench_error + ")" : "default";
  }
  std::sort(res.begin(), res.end(), [](const ConfigResult& a, const ConfigResult& b) {
    if ((a.model_rank == 0) != (b.model_rank == 0)) return b.model_rank == 0;
    return a.model_rank < b.model_rank;
  });
  r.configs = std::move(res);
  return r;
}

// ---- bundles ---------------------------------------------------------------------------------

void add_to_bundle_content(TunedBundleContent& content, const TuningSpace& space, const TuneResult& r,
                           const lang::Meta& fixed, const jit::CompileOptions& base) {
  BundleEntrySpec spec;
  spec.kernel = space.kernel_name();
  spec.source = space.kernel_source();
  // The full specialisation, so that a default meta (which BundleEntrySpec layers
  // under it) cannot change the kernel.
  for (const ir::MetaEntry& m : space.build_ir(r.best, fixed).meta) spec.meta.push_back({m.name, m.value});
  spec.options = r.best.options(base);
  content.specs.push_back(std::move(spec));
  content.table.push_back({r.identity, r.best.id(), r.best_ms});
}

// ---- TunedKernel -----------------------------------------------------------------------------

struct TunedKernel::Entry {
  TuningConfig config;
  std::unique_ptr<Function> fn;
};

TunedKernel::TunedKernel(const TuningSpace& space, lang::Meta fixed, AutotuneOptions opts, int device)
    : space_(space), fixed_(std::move(fixed)), opts_(std::move(opts)), device_(device) {
  opts_.bench.device = device;
}

TunedKernel::~TunedKernel() = default;

TunedKernel::Entry& TunedKernel::entry_for(std::span<const DeviceArg> args, Shape& shape) {
  shape = space_.shape_of(args, fixed_);
  const std::string bucket = space_.bucket(shape);
  std::lock_guard lock(mutex_);
  for (auto& [b, e] : entries_)
    if (b == bucket) return *e;
  Autotuner tuner(space_, opts_);
  TuneResult r = tuner.choose(shape, fixed_);
  auto e = std::make_unique<Entry>();
  e->config = r.best;
  e->fn = std::make_unique<Function>(space_.kernel(), layer_meta(r.best.meta(), fixed_), r.best.options(opts_.base), device_);
  entries_.push_back({bucket, std::move(e)});
  return *entries_.back().second;
}

void TunedKernel::launch(CUstream stream, std::span<const DeviceArg> args) {
  Shape shape;
  Entry& e = entry_for(args, shape);
  TuningContext ctx;
  ctx.shape = shape;
  ctx.fixed = fixed_;
  ctx.arch = opts_.base.arch;
  e.fn->launch(space_.grid_of(e.config, ctx), stream, args);
}

TuningConfig TunedKernel::config_for(std::span<const DeviceArg> args) {
  Shape shape;
  return entry_for(args, shape).config;
}

}  // namespace tilejit::runtime
