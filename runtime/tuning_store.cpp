// Persisted tuning results: the identity a result is valid for, and the tuning store (per-config
// measurements and per-identity choices as .tjt entries, with the compile cache's file rules).
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "dsl/ir/sha256.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/autotuner_internal.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/entry_file.hpp"
#include "runtime/kernel_codec.hpp"

namespace tilejit::runtime {

namespace fs = std::filesystem;
using tuning_detail::bits_f64;
using tuning_detail::f64_bits;

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
    // a temporary of a running writer is kept: removing it would fail that write
    if (it->path().extension() == kSuffix ||
        (name.find(kTempMarker) != std::string::npos && entry_file::is_orphaned_temporary(it->path(), kTempMarker)))
      doomed.push_back(it->path());
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

}  // namespace tilejit::runtime
