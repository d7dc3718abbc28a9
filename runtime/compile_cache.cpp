// The compile cache: key derivation, the entry file format (explicit little-endian fields closed by
// a SHA-256), atomic writes, defensive reads, and the memory cache in front of it all.
//
// Entry file <key>.tjk, all integers little-endian:
//   header   "TILEJITK" | u32 format version | u32 header size (16; readers skip to it)
//   fields   str key | the kernel, as runtime/kernel_codec.hpp writes it (name, arch, backend,
//            threads, shared memory, ABI, tensor maps, KernelInfo, ptx_tool, ptx, cubin, tile_ir)
//   trailer  SHA-256 (32 bytes) of everything before it
// where str is u64 length + bytes. Format changes (this file's or the codec's) bump
// kFormatVersion, which is also part of the key, so builds with different formats never fight
// over one file name.
//
// compile_cached looks in the loaded bundles (runtime/bundle.hpp) before anything else.
#include "runtime/compile_cache.hpp"

#include "runtime/entry_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "dsl/ir/sha256.hpp"
#include "jit/llvm_backend.hpp"
#include "jit/nvrtc.hpp"
#include "jit/ptx_compiler.hpp"
#include "runtime/bundle.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/kernel_codec.hpp"

namespace tilejit::runtime {
namespace {

namespace fs = std::filesystem;

using codec::kTilejitVersion;
constexpr char kMagic[8] = {'T', 'I', 'L', 'E', 'J', 'I', 'T', 'K'};
constexpr uint32_t kFormatVersion = 2;  // 2: TMA descriptors by value (kernel parameters changed)
constexpr uint32_t kHeaderSize = 16;
constexpr size_t kChecksumSize = 32;
constexpr std::string_view kEntrySuffix = ".tjk";
constexpr std::string_view kTempMarker = ".tjk.tmp-";  // <key>.tjk.tmp-XXXXXX
// Far above any real entry (cubins are KBs to a few MBs): a bigger file is not ours, and reading
// it whole could exhaust memory.
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 30;

// Keys become file names, so only a plain token is accepted (no '/', no "..").
bool is_valid_key(std::string_view key) {
  if (key.empty() || key.size() > 128) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-';
  });
}

void check_key(const std::string& key, std::string_view what) {
  if (!is_valid_key(key))
    throw std::invalid_argument(fmt::format(
        "tilejit: CompileCache::{}: key '{}' is not a cache key (1 to 128 characters of [0-9A-Za-z_-])", what, key));
}

// ---- encoding --------------------------------------------------------------------------------

std::string encode(const std::string& key, const jit::CompiledKernel& k) {
  codec::Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.u32(kFormatVersion);
  w.u32(kHeaderSize);
  w.str(key);
  codec::write_kernel(w, k);
  auto sum = ir::sha256(w.out());
  w.bytes(sum.data(), sum.size());
  return std::move(w.out());
}

// ---- decoding --------------------------------------------------------------------------------

// Thrown inside decode only (codec::DecodeError included); load() and list() turn it into a problem string.
struct BadEntry {
  std::string problem;
};

uint32_t read_u32_at(std::string_view d, size_t pos) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(d[pos + i])} << (8 * i);
  return v;
}

struct Decoded {
  std::string key;  // the key stored inside (empty when the header was already bad)
  jit::CompiledKernel kernel;
};

// Every check the format allows, cheapest and most specific first so the problem names the cause.
Decoded decode(std::string_view d) {
  const size_t size = d.size();
  if (size >= sizeof kMagic && std::memcmp(d.data(), kMagic, sizeof kMagic) != 0)
    throw BadEntry{"not a tilejit cache entry (wrong magic)"};
  if (size < kHeaderSize + kChecksumSize)
    throw BadEntry{fmt::format("truncated: {} bytes, fewer than the header and checksum alone ({} bytes)", size,
                               kHeaderSize + kChecksumSize)};
  if (uint32_t v = read_u32_at(d, 8); v != kFormatVersion)
    throw BadEntry{fmt::format("format version {} (this tilejit reads version {})", v, kFormatVersion)};
  uint32_t header = read_u32_at(d, 12);
  if (header < kHeaderSize || header > size - kChecksumSize)
    throw BadEntry{fmt::format("header size {} out of range (at least {}, at most {} in a file of {} bytes)", header,
                               kHeaderSize, size - kChecksumSize, size)};
  const size_t body_end = size - kChecksumSize;
  auto sum = ir::sha256(d.substr(0, body_end));
  if (std::memcmp(sum.data(), d.data() + body_end, kChecksumSize) != 0)
    throw BadEntry{"checksum mismatch: the entry is truncated or corrupt"};

  try {
    codec::Reader r(d, header, body_end);
    Decoded out;
    out.key = r.str("key");
    out.kernel = codec::read_kernel(r);
    if (r.left() != 0) throw BadEntry{fmt::format("{} unexpected bytes after the last field", r.left())};
    return out;
  } catch (const codec::DecodeError& e) {
    throw BadEntry{e.what()};
  }
}

// ---- files -----------------------------------------------------------------------------------

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

// ---- keys ------------------------------------------------------------------------------------

namespace {

std::string key_text(std::string_view ir_hash, const ir::Function& f, const jit::CompileOptions& opts) {
  std::string text = fmt::format(
      "tilejit-cache-key v1\n"
      "entry-format={}\n"
      "tilejit={}\n"
      "ir={}\n"
      "kernel={}\n"
      "arch={}\n"
      "backend={}\n"
      "num_warps={}\n"
      "pipeline=enabled:{},stages:{}\n"
      "ptx_tool={}\n"
      "make_cubin={}\n"
      "llvm={}\n"
      "ptx_tools={}\n",
      kFormatVersion, kTilejitVersion, ir_hash, f.name, opts.arch, jit::to_string(opts.backend), opts.num_warps,
      opts.pipeline.enabled ? 1 : 0, opts.pipeline.stages, jit::to_string(jit::resolve_ptx_tool(opts.ptx_tool)), opts.make_cubin ? 1 : 0,
      jit::llvm_version(), jit::ptx_tool_versions());
  // nvrtc is loaded only for its backend: asking its version otherwise would dlopen it for nothing.
  if (opts.backend == jit::Backend::Nvrtc) text += fmt::format("nvrtc={}\n", jit::nvrtc_version());
  // only when set: the keys of every kernel without the bound stay what they were
  if (opts.min_programs_per_sm > 0) text += fmt::format("min_programs_per_sm={}\n", opts.min_programs_per_sm);
  if (!opts.pipeline.once_by_tma) text += "once_by_tma=0\n";
  if (opts.packed_loop_pairs && opts.backend == jit::Backend::Llvm) text += "packed_loop_pairs=1\n";
  // the LLVM backend's instrumented waits (debugging hangs: they give up) never share a key with
  // the real ones (jit/llvm_backend/gpu_ops.cpp, decision 074)
  if (std::string w = env("TILEJIT_DEBUG_WAITS"); !w.empty() && opts.backend == jit::Backend::Llvm) text += fmt::format("debug_waits={}\n", w);
  return text;
}

}  // namespace

std::string cache_key_text(const ir::Function& f, const jit::CompileOptions& opts) {
  return key_text(ir::structural_hash(f), f, opts);
}

std::string cache_key(const ir::Function& f, const jit::CompileOptions& opts) {
  return ir::sha256_hex(cache_key_text(f, opts));
}

// ---- CompileCache ----------------------------------------------------------------------------

fs::path CompileCache::default_dir() {
  if (std::string d = env("TILEJIT_CACHE_DIR"); !d.empty()) return fs::path(d);
  // The XDG spec says relative values are invalid and must be ignored.
  if (std::string x = env("XDG_CACHE_HOME"); !x.empty() && fs::path(x).is_absolute()) return fs::path(x) / "tilejit";
  if (std::string h = env("HOME"); !h.empty()) return fs::path(h) / ".cache" / "tilejit";
  return {};
}

bool CompileCache::default_enabled() {
  std::string v = lower(env("TILEJIT_CACHE"));
  return !(v == "0" || v == "false" || v == "off" || v == "no");
}

CompileCache CompileCache::from_environment() {
  fs::path dir = default_dir();
  bool on = default_enabled() && !dir.empty();
  return CompileCache(std::move(dir), on);
}

CompileCache& CompileCache::global() {
  static CompileCache cache = from_environment();
  return cache;
}

CompileCache::CompileCache(fs::path dir, bool enabled) : dir_(std::move(dir)), enabled_(enabled && !dir_.empty()) {}

fs::path CompileCache::entry_path(const std::string& key) const {
  check_key(key, "entry_path");
  return dir_ / (key + std::string(kEntrySuffix));
}

void CompileCache::warn_once(const std::string& message) const {
  if (!warned_.exchange(true))
    std::fprintf(stderr, "tilejit: warning: %s (further compile-cache warnings for %s are not shown)\n",
                 message.c_str(), dir_.c_str());
}

std::optional<jit::CompiledKernel> CompileCache::load(const std::string& key, std::string* problem) const {
  check_key(key, "load");
  return load_checked(key, nullptr, problem);
}

std::optional<jit::CompiledKernel> CompileCache::load_expected(const std::string& key, const ir::Function& signature,
                                                               std::string_view arch, jit::Backend backend,
                                                               std::string* problem) const {
  check_key(key, "load_expected");
  // The key is a hash of what was asked, but the file could be anything sealed with a valid
  // checksum: what it holds is compared with the request before it is served.
  auto expect = [&](const jit::CompiledKernel& k) -> std::string {
    if (k.name != signature.name || k.arch != arch || k.backend != backend)
      return fmt::format("holds kernel '{}' for {} ({}), not the '{}' for {} ({}) its key was asked for", k.name, k.arch,
                         jit::to_string(k.backend), signature.name, arch, jit::to_string(backend));
    return abi_mismatch(signature, k);
  };
  return load_checked(key, expect, problem);
}

std::optional<jit::CompiledKernel> CompileCache::load_checked(
    const std::string& key, const std::function<std::string(const jit::CompiledKernel&)>& expect,
    std::string* problem) const {
  if (problem) problem->clear();
  if (!enabled_) return std::nullopt;
  const fs::path path = entry_path(key);
  std::string error;
  std::optional<entry_file::Bytes> file = entry_file::read(path, kMaxEntryBytes, error);
  if (!file) {
    // Unreadable is not proof of damage, so the file is left to the next store's rename.
    if (!error.empty()) {
      if (problem) *problem = error;
      warn_once(fmt::format("cache entry {}: {}; the kernel is recompiled", path.string(), error));
    }
    return std::nullopt;
  }
  try {
    Decoded d = decode(file->data);
    if (d.key != key)
      throw BadEntry{fmt::format("holds the entry for key {} (a foreign entry copied or renamed here)", d.key)};
    if (expect)
      if (std::string wrong = expect(d.kernel); !wrong.empty()) throw BadEntry{std::move(wrong)};
    return std::move(d.kernel);
  } catch (const BadEntry& bad) {
    entry_file::remove_if_same(path, *file);
    if (problem) *problem = bad.problem;
    warn_once(fmt::format("cache entry {}: {}; removed, the kernel is recompiled", path.string(), bad.problem));
  } catch (const std::exception& e) {  // bad_alloc and the like: still a miss, never a crash
    if (problem) *problem = e.what();
    warn_once(fmt::format("cache entry {}: {}; the kernel is recompiled", path.string(), e.what()));
  }
  return std::nullopt;
}

bool CompileCache::store(const std::string& key, const jit::CompiledKernel& k) const {
  check_key(key, "store");
  if (!enabled_) return false;
  const fs::path path = entry_path(key);
  std::string data;
  try {
    data = encode(key, k);
  } catch (const std::exception& e) {
    warn_once(fmt::format("cannot write cache entry {}: {}", path.string(), e.what()));
    return false;
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    warn_once(fmt::format("cannot create the cache directory {}: {}; kernels are recompiled in every process",
                          dir_.string(), ec.message()));
    return false;
  }
  // Atomic: of concurrent writers of one key one complete file wins (runtime/entry_file.hpp).
  std::string failure = entry_file::write_atomically(path, kTempMarker, data);
  if (!failure.empty()) {
    warn_once(fmt::format("cannot write cache entry {}: {}", path.string(), failure));
    return false;
  }
  return true;
}

namespace {

// The directory's files; none for a missing directory, an error naming it for anything else.
std::vector<fs::path> files_in(const fs::path& dir, std::string_view what) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (fs::directory_iterator end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  if (ec)
    throw std::runtime_error(
        fmt::format("tilejit: CompileCache::{}: cannot read the cache directory {}: {}", what, dir.string(), ec.message()));
  return out;
}

bool is_temporary(const fs::path& p) { return p.filename().string().find(kTempMarker) != std::string::npos; }

}  // namespace

std::vector<CompileCache::Entry> CompileCache::list() const {
  std::vector<Entry> out;
  for (const fs::path& p : files_in(dir_, "list")) {
    if (p.extension() != kEntrySuffix) continue;
    Entry e;
    e.key = p.stem().string();
    std::string error;
    std::optional<entry_file::Bytes> file = entry_file::read(p, kMaxEntryBytes, error);
    if (!file) {
      if (error.empty()) continue;  // removed since the directory was read
      e.problem = error;
      out.push_back(std::move(e));
      continue;
    }
    e.bytes = file->data.size();
    e.written = file->written;
    if (!is_valid_key(e.key)) {
      e.problem = "the file name is not a cache key";
    } else {
      try {
        Decoded d = decode(file->data);
        if (d.key != e.key) throw BadEntry{fmt::format("holds the entry for key {} (a foreign entry)", d.key)};
        e.kernel = d.kernel.name;
        e.arch = d.kernel.arch;
        e.valid = true;
      } catch (const BadEntry& bad) {
        e.problem = bad.problem;
      } catch (const std::exception& ex) {
        e.problem = ex.what();
      }
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.key < b.key; });
  return out;
}

std::vector<CompileCache::Temporary> CompileCache::temporaries() const {
  std::vector<Temporary> out;
  for (const fs::path& p : files_in(dir_, "temporaries")) {
    if (!is_temporary(p)) continue;
    std::error_code ec;
    uintmax_t bytes = fs::file_size(p, ec);
    out.push_back({p, ec ? 0 : static_cast<size_t>(bytes), entry_file::is_orphaned_temporary(p, kTempMarker)});
  }
  std::sort(out.begin(), out.end(), [](const Temporary& a, const Temporary& b) { return a.path < b.path; });
  return out;
}

CompileCache::Cleared CompileCache::clear() const {
  Cleared out;
  std::vector<fs::path> files;
  try {
    files = files_in(dir_, "clear");
  } catch (const std::exception& e) {
    out.failures.push_back(e.what());
    return out;
  }
  for (const fs::path& p : files) {
    const bool entry = p.extension() == kEntrySuffix;
    if (!entry && !is_temporary(p)) continue;
    if (!entry && !entry_file::is_orphaned_temporary(p, kTempMarker)) {
      ++out.live_temporaries;
      continue;
    }
    if (::unlink(p.c_str()) != 0) {
      if (errno != ENOENT) out.failures.push_back(fmt::format("{}: {}", p.string(), std::strerror(errno)));
      continue;
    }
    ++(entry ? out.entries : out.temporaries);
  }
  return out;
}

// ---- compile_cached --------------------------------------------------------------------------

namespace {

using KernelPtr = std::shared_ptr<const jit::CompiledKernel>;

// One slot per key; the first caller fills it, later and concurrent callers wait on the future.
struct MemorySlot {
  std::shared_future<KernelPtr> result;
  uint64_t id = 0;
};

struct MemoryCache {
  std::mutex mutex;
  std::unordered_map<std::string, MemorySlot> slots;
  uint64_t next_id = 0;
  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, compiles{0}, bundle_hits{0};
};

MemoryCache& memory() {
  static MemoryCache m;
  return m;
}

}  // namespace

jit::CompiledKernel compile_cached(const ir::Function& f, const jit::CompileOptions& opts) {
  return compile_cached(f, opts, CompileCache::global());
}

jit::CompiledKernel compile_cached(const ir::Function& f, const jit::CompileOptions& opts, const CompileCache& disk) {
  MemoryCache& m = memory();
  if (!opts.dump_after.empty()) {
    if (jit::compilers_disabled()) throw_not_bundled(f, opts, bundle_key(f, opts));
    ++m.compiles;
    return jit::compile(f, opts);
  }
  // The IR is hashed once for both keys: on a memory hit the hash is most of the cost.
  const std::string ir_hash = ir::structural_hash(f);
  // Loaded bundles first. Their key leaves the compiler versions out, so this lookup touches no
  // compiler (asking ptxas or nvJitLink for its version would): a shipped application with
  // compilers disabled gets its kernels here and nowhere else.
  const bool disabled = jit::compilers_disabled();
  if (disabled || bundles_loaded()) {
    const std::string bkey = bundle_key_from_hash(ir_hash, f.name, opts);
    // A bundle entry is served only if it holds what was asked (its key could be crafted).
    std::optional<jit::CompiledKernel> k = find_bundled(bkey);
    if (k && k->name == f.name && k->arch == opts.arch && abi_mismatch(f, *k).empty()) {
      ++m.bundle_hits;
      return std::move(*k);
    }
    if (disabled) throw_not_bundled(f, opts, bkey);
  }
  const std::string key = ir::sha256_hex(key_text(ir_hash, f, opts));
  std::promise<KernelPtr> promise;
  uint64_t id = 0;
  {
    std::unique_lock lock(m.mutex);
    if (auto it = m.slots.find(key); it != m.slots.end()) {
      std::shared_future<KernelPtr> result = it->second.result;
      lock.unlock();
      KernelPtr k = result.get();  // rethrows the compile error of the caller that owned the slot
      ++m.memory_hits;
      return *k;
    }
    id = ++m.next_id;
    m.slots.emplace(key, MemorySlot{promise.get_future().share(), id});
  }
  try {
    KernelPtr k;
    if (std::optional<jit::CompiledKernel> hit = disk.load_expected(key, f, opts.arch, opts.backend)) {
      ++m.disk_hits;
      k = std::make_shared<const jit::CompiledKernel>(std::move(*hit));
    } else {
      ++m.compiles;
      auto compiled = std::make_shared<const jit::CompiledKernel>(jit::compile(f, opts));
      disk.store(key, *compiled);
      k = std::move(compiled);
    }
    promise.set_value(k);
    return *k;
  } catch (...) {
    // A failed compile is not cached: the next call tries again (the toolchain may be fixed).
    {
      std::lock_guard lock(m.mutex);
      if (auto it = m.slots.find(key); it != m.slots.end() && it->second.id == id) m.slots.erase(it);
    }
    promise.set_exception(std::current_exception());
    throw;
  }
}

CompileCacheStats compile_cache_stats() {
  MemoryCache& m = memory();
  return {m.memory_hits.load(), m.disk_hits.load(), m.compiles.load(), m.bundle_hits.load()};
}

void reset_memory_cache() {
  MemoryCache& m = memory();
  std::lock_guard lock(m.mutex);
  m.slots.clear();
  m.memory_hits = 0;
  m.disk_hits = 0;
  m.compiles = 0;
  m.bundle_hits = 0;
}

}  // namespace tilejit::runtime
