// Bundles: keys, building from specs, the file format (bundle.hpp documents it),
// defensive reading, the process-wide registry of loaded kernels, and the embedding source.
#include "runtime/bundle.hpp"

#include "runtime/entry_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>

#include "dsl/ir/sha256.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_codec.hpp"

namespace tilejit::runtime {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'T', 'I', 'L', 'E', 'J', 'I', 'T', 'B'};
constexpr char kCacheMagic[8] = {'T', 'I', 'L', 'E', 'J', 'I', 'T', 'K'};
constexpr uint32_t kFormatVersion = 2;  // 2: TMA descriptors by value (kernel parameters changed)
constexpr uint32_t kHeaderSize = 24;  // magic, version, header size, file size
constexpr size_t kChecksumSize = 32;
// Far above any real bundle; a bigger file is not ours, and reading it whole could exhaust memory.
constexpr uint64_t kMaxBundleBytes = uint64_t{4} << 30;

[[noreturn]] void fail(std::string_view name, std::string_view problem) {
  throw BundleError(fmt::format("tilejit: bundle {}: {}", name, problem));
}

bool is_bundle_key(std::string_view k) {
  return k.size() == 64 && k.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// The first bytes of a foreign file, for the wrong-magic message.
std::string printable_prefix(std::string_view d) {
  std::string out;
  for (char c : d.substr(0, 8)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return out;
}

uint32_t read_u32_at(std::string_view d, size_t pos) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(d[pos + i])} << (8 * i);
  return v;
}

uint64_t read_u64_at(std::string_view d, size_t pos) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(d[pos + i])} << (8 * i);
  return v;
}

// Every check, cheapest and most specific first, so the problem names the cause.
Bundle decode(std::string_view d, const std::string& name) {
  const size_t size = d.size();
  if (std::memcmp(d.data(), kMagic, std::min(size, sizeof kMagic)) != 0) {
    if (size >= sizeof kCacheMagic && std::memcmp(d.data(), kCacheMagic, sizeof kCacheMagic) == 0)
      fail(name, "not a bundle but a compile-cache entry (magic TILEJITK); write bundles with `tilejit bundle`");
    fail(name, fmt::format("not a tilejit bundle (wrong magic: the file starts with \"{}\", a bundle with \"TILEJITB\")",
                           printable_prefix(d)));
  }
  if (size < kHeaderSize + kChecksumSize)
    fail(name, fmt::format("truncated: {} bytes, fewer than the header and checksum alone ({} bytes)", size,
                           kHeaderSize + kChecksumSize));
  if (uint32_t v = read_u32_at(d, 8); v != kFormatVersion)
    fail(name, fmt::format("format version {} (this tilejit reads version {}{}); write it again with this tilejit's "
                           "`tilejit bundle`",
                           v, kFormatVersion, v > kFormatVersion ? ", so a newer tilejit wrote it" : ""));
  const uint32_t header = read_u32_at(d, 12);
  if (header < kHeaderSize || header > size - kChecksumSize)
    fail(name, fmt::format("header size {} out of range (at least {}, at most {} in a file of {} bytes)", header,
                           kHeaderSize, size - kChecksumSize, size));
  if (uint64_t total = read_u64_at(d, 16); total != size) {
    if (size < total) fail(name, fmt::format("truncated: {} of {} bytes (the file was cut short; copy it again)", size, total));
    fail(name, fmt::format("{} unexpected bytes after the end of the bundle ({} bytes)", size - total, total));
  }
  const size_t body_end = size - kChecksumSize;
  auto sum = ir::sha256(d.substr(0, body_end));
  if (std::memcmp(sum.data(), d.data() + body_end, kChecksumSize) != 0)
    fail(name, "checksum mismatch: the file is corrupt (its bytes changed after it was written)");

  Bundle b;
  b.name = name;
  b.format_version = kFormatVersion;
  b.bytes = size;
  try {
    codec::Reader r(d, header, body_end);
    b.tilejit_version = r.str("tilejit version");
    size_t n = r.count("archs", 8);
    for (size_t i = 0; i < n; ++i) {
      b.archs.push_back(r.str("arch"));
      if (b.archs.back().empty()) throw codec::DecodeError(fmt::format("arch {} is empty", i));
    }
    n = r.count("entries", 6 * 8);
    b.entries.reserve(n);
    std::set<std::string_view> keys;
    for (size_t i = 0; i < n; ++i) {
      BundleEntry e;
      e.key = r.str("entry key");
      e.kernel = r.str("entry kernel");
      e.meta = r.str("entry meta");
      e.schedule = r.str("entry schedule");
      e.arch = r.str("entry arch");
      std::string_view blob = r.view("entry kernel bytes");
      codec::Reader kr(blob, 0, blob.size());
      e.compiled = codec::read_kernel(kr);
      std::string where = fmt::format("entry {} ({} for {})", i, e.kernel, e.arch);
      if (kr.left() != 0)
        throw codec::DecodeError(fmt::format("{}: {} unexpected bytes after the kernel", where, kr.left()));
      if (!is_bundle_key(e.key)) throw codec::DecodeError(fmt::format("{}: '{}' is not a bundle key", where, e.key));
      if (e.compiled.name != e.kernel || e.compiled.arch != e.arch)
        throw codec::DecodeError(fmt::format("{}: holds a kernel '{}' for {}", where, e.compiled.name, e.compiled.arch));
      if (std::find(b.archs.begin(), b.archs.end(), e.arch) == b.archs.end())
        throw codec::DecodeError(fmt::format("{}: arch {} is not among the bundle's archs", where, e.arch));
      b.entries.push_back(std::move(e));
    }
    for (size_t i = 0; i < b.entries.size(); ++i)
      if (!keys.insert(b.entries[i].key).second)
        throw codec::DecodeError(fmt::format("entry {} repeats the key of an earlier entry", i));
    b.tuning_version = r.u32("tuning version");
    b.tuning = r.str("tuning tables");
    if (r.left() != 0) throw codec::DecodeError(fmt::format("{} unexpected bytes after the last field", r.left()));
  } catch (const codec::DecodeError& e) {
    fail(name, fmt::format("damaged: {}", e.what()));
  }
  return b;
}

// Through entry_file::read: a non-blocking open (a FIFO is refused at once, never waited on) and
// the size checked before a byte is read.
std::string read_whole_file(const fs::path& path) {
  const std::string name = path.string();
  std::string error;
  std::optional<entry_file::Bytes> file = entry_file::read(path, kMaxBundleBytes, error);
  if (!file) fail(name, error.empty() ? fmt::format("cannot open: {}", std::strerror(ENOENT)) : error);
  return std::move(file->data);
}

// ---- the registry of loaded kernels ----------------------------------------------------------

struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const BundleEntry>> entries;  // by key
  std::vector<LoadedBundle> bundles;
  std::vector<std::string> failures;  // one line per bundle that failed to load
  std::atomic<bool> any{false};
};

// Never destroyed: embedded bundles register from static initializers, and kernels may be looked
// up from static destructors, in any order relative to this file's statics.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

void record_failure(const std::string& what) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  r.failures.push_back(what);
}

template <class F>
void recording_failures(F&& load) {
  try {
    load();
  } catch (const std::exception& e) {
    record_failure(e.what());
    throw;
  }
}

void check_arch(const Bundle& b) {
  Driver& driver = Driver::get();
  if (!driver.available() || driver.device_count() == 0) return;  // compile-only mode: nothing to run on
  const DeviceProps& p = driver.props(0);
  const std::string arch = p.arch();
  if (std::any_of(b.entries.begin(), b.entries.end(), [&](const BundleEntry& e) { return e.arch == arch; })) return;
  std::set<std::string> held;
  for (const BundleEntry& e : b.entries) held.insert(e.arch);
  throw BundleError(fmt::format(
      "tilejit: bundle {} holds {}; this GPU is {} ({}): write one for it with `tilejit bundle --arch {} ...`", b.name,
      held.empty() ? std::string("no kernels") : fmt::format("{} kernels", fmt::join(held, ", ")), arch, p.name, arch));
}

std::string cli_spec(const ir::Function& f, const jit::CompileOptions& opts) {
  std::vector<std::string> parts;
  for (const auto& m : f.meta) parts.push_back(fmt::format("{}={}", m.name, ir::to_string(m.value)));
  parts.push_back(fmt::format("warps={}", opts.num_warps));
  parts.push_back(fmt::format("stages={}", opts.pipeline.stages));
  if (opts.min_programs_per_sm > 0) parts.push_back(fmt::format("min_programs_per_sm={}", opts.min_programs_per_sm));
  if (!opts.pipeline.enabled) parts.push_back("pipeline=off");
  if (!opts.pipeline.once_by_tma) parts.push_back("once_by_tma=off");
  return fmt::format("{}:{}", f.name, fmt::join(parts, ","));
}

std::string c_string_literal(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\' || c == '?') out += fmt::format("\\{}", c);  // '?': no trigraphs
    else if (u < 0x20 || u >= 0x7f) out += fmt::format("\\{:03o}", u);
    else out += c;
  }
  return out + "\"";
}

}  // namespace

// ---- keys ------------------------------------------------------------------------------------

namespace {

std::string key_text(std::string_view ir_hash, std::string_view kernel, const jit::CompileOptions& opts) {
  std::string text = fmt::format(
      "tilejit-bundle-key v1\n"
      "tilejit={}\n"
      "ir={}\n"
      "kernel={}\n"
      "arch={}\n"
      "num_warps={}\n"
      "pipeline=enabled:{},stages:{}\n",
      codec::kTilejitVersion, ir_hash, kernel, opts.arch, opts.num_warps, opts.pipeline.enabled ? 1 : 0,
      opts.pipeline.stages);
  // only when set: the keys of every kernel without the bound stay what they were
  if (opts.min_programs_per_sm > 0) text += fmt::format("min_programs_per_sm={}\n", opts.min_programs_per_sm);
  if (!opts.pipeline.once_by_tma) text += "once_by_tma=0\n";
  return text;
}

}  // namespace

std::string bundle_key_from_hash(std::string_view ir_hash, std::string_view kernel, const jit::CompileOptions& opts) {
  return ir::sha256_hex(key_text(ir_hash, kernel, opts));
}

std::string bundle_key_text(const ir::Function& f, const jit::CompileOptions& opts) {
  return key_text(ir::structural_hash(f), f.name, opts);
}

std::string bundle_key(const ir::Function& f, const jit::CompileOptions& opts) {
  return bundle_key_from_hash(ir::structural_hash(f), f.name, opts);
}

// ---- specs -----------------------------------------------------------------------------------

ir::Function BundleEntrySpec::build() const {
  if (!source)
    throw std::invalid_argument(fmt::format("tilejit: bundle entry '{}' has no kernel to build (library kernels: "
                                            "tilejit::library::bundle_spec)", kernel));
  lang::Meta full = meta;
  for (const auto& [name, value] : default_meta)
    if (std::none_of(meta.begin(), meta.end(), [&](const auto& m) { return m.first == name; }))
      full.push_back({name, value});
  return source().build(full);
}

std::string describe_meta(const std::vector<ir::MetaEntry>& meta) {
  std::vector<std::string> parts;
  for (const auto& m : meta) parts.push_back(fmt::format("{}={}", m.name, ir::to_string(m.value)));
  return fmt::format("{}", fmt::join(parts, ","));
}

std::string describe_schedule(const jit::CompileOptions& opts) {
  return fmt::format("warps={},stages={},{}pipeline={},{}{}backend={}", opts.num_warps, opts.pipeline.stages,
                     opts.min_programs_per_sm > 0 ? fmt::format("min_programs_per_sm={},", opts.min_programs_per_sm) : std::string(),
                     opts.pipeline.enabled ? "on" : "off", opts.pipeline.once_by_tma ? "" : "once_by_tma=off,",
                     opts.packed_loop_pairs && opts.backend == jit::Backend::Llvm ? "packed_loop_pairs=on," : "", jit::to_string(opts.backend));
}

// ---- writing ---------------------------------------------------------------------------------

Bundle make_bundle(const std::vector<BundleEntrySpec>& specs) {
  Bundle b;
  b.format_version = kFormatVersion;
  b.tilejit_version = std::string(codec::kTilejitVersion);
  std::set<std::string> seen;
  const size_t total = specs.size();
  for (size_t i = 0; i < total; ++i) {
    const BundleEntrySpec& spec = specs[i];
    ir::Function fn = spec.build();
    jit::CompileOptions o = spec.options;
    o.make_cubin = true;
    o.dump_after.clear();
    BundleEntry e;
    e.key = bundle_key(fn, o);
    e.kernel = fn.name;
    e.meta = describe_meta(fn.meta);
    e.schedule = describe_schedule(o);
    e.arch = o.arch;
    if (!seen.insert(e.key).second) {
      std::fprintf(stderr, "tilejit bundle: [%zu/%zu] %s for %s: the same kernel as an earlier entry, skipped\n", i + 1,
                   total, fn.name.c_str(), o.arch.c_str());
      continue;
    }
    std::fprintf(stderr, "tilejit bundle: [%zu/%zu] %s for %s (%s; %s) ... ", i + 1, total, fn.name.c_str(),
                 o.arch.c_str(), e.meta.c_str(), e.schedule.c_str());
    std::fflush(stderr);
    auto t0 = std::chrono::steady_clock::now();
    try {
      e.compiled = jit::compile(fn, o);
    } catch (...) {
      std::fprintf(stderr, "failed\n");
      throw;
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%.0f ms: %s\n", ms, e.compiled.info.to_string().c_str());
    // Not stored (see kernel_codec.hpp); cleared so the in-memory bundle equals the file.
    e.compiled.backend_source.clear();
    e.compiled.dump.clear();
    e.compiled.timings = {};
    if (std::find(b.archs.begin(), b.archs.end(), e.arch) == b.archs.end()) b.archs.push_back(e.arch);
    b.entries.push_back(std::move(e));
  }
  return b;
}

std::string encode_bundle(const Bundle& b) {
  std::vector<std::string> archs = b.archs;
  for (const BundleEntry& e : b.entries)
    if (std::find(archs.begin(), archs.end(), e.arch) == archs.end()) archs.push_back(e.arch);
  codec::Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.u32(kFormatVersion);
  w.u32(kHeaderSize);
  w.u64(0);  // the file size, patched below
  w.str(b.tilejit_version.empty() ? codec::kTilejitVersion : std::string_view(b.tilejit_version));
  w.count(archs.size());
  for (const std::string& a : archs) w.str(a);
  w.count(b.entries.size());
  for (const BundleEntry& e : b.entries) {
    w.str(e.key);
    w.str(e.kernel);
    w.str(e.meta);
    w.str(e.schedule);
    w.str(e.arch);
    codec::Writer k;
    codec::write_kernel(k, e.compiled);
    w.str(k.out());
  }
  w.u32(b.tuning_version);
  w.str(b.tuning);
  std::string& out = w.out();
  const uint64_t total = out.size() + kChecksumSize;
  for (int i = 0; i < 8; ++i) out[16 + i] = static_cast<char>(static_cast<uint8_t>(total >> (8 * i)));
  auto sum = ir::sha256(out);
  w.bytes(sum.data(), sum.size());
  return std::move(out);
}

void save_bundle(const fs::path& path, const Bundle& b) {
  const std::string data = encode_bundle(b);
  const std::string name = path.string();
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(name, fmt::format("cannot create the directory {}: {}", dir.string(), ec.message()));
  // atomic, and 0644: a bundle is a build output others read
  std::string failure = entry_file::write_atomically(path, path.extension().string() + ".tmp-", data, 0644);
  if (!failure.empty()) fail(name, fmt::format("cannot write: {}", failure));
}

void write_bundle(const fs::path& path, const std::vector<BundleEntrySpec>& specs) { save_bundle(path, make_bundle(specs)); }

// ---- reading and loading ---------------------------------------------------------------------

Bundle read_bundle(const fs::path& path) {
  std::string data = read_whole_file(path);
  return decode(data, path.string());
}

Bundle read_bundle_bytes(std::span<const uint8_t> data, std::string name) {
  return decode(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()), name);
}

namespace {
std::atomic<uint64_t> g_bundles_generation{0};  // bundles_generation()
}  // namespace

void load_bundle(const Bundle& b) {
  recording_failures([&] {
    check_arch(b);
    Registry& r = registry();
    std::unique_lock lock(r.mutex);
    LoadedBundle info{b.name, b.archs, b.entries.size(), 0, b.tuning_version, b.tuning};
    for (const BundleEntry& e : b.entries)
      if (r.entries.try_emplace(e.key, std::make_shared<const BundleEntry>(e)).second) ++info.new_entries;
    r.bundles.push_back(std::move(info));
    r.any.store(true, std::memory_order_release);
    g_bundles_generation.fetch_add(1, std::memory_order_acq_rel);
  });
}

void load_bundle(const fs::path& path) {
  Bundle b;
  recording_failures([&] { b = read_bundle(path); });
  load_bundle(b);
}

void load_bundle_bytes(const uint8_t* data, size_t size, const char* name) {
  Bundle b;
  recording_failures([&] { b = read_bundle_bytes(std::span<const uint8_t>(data, size), name ? name : "<memory>"); });
  load_bundle(b);
}

bool bundles_loaded() { return registry().any.load(std::memory_order_acquire); }

uint64_t bundles_generation() { return g_bundles_generation.load(std::memory_order_acquire); }

std::optional<jit::CompiledKernel> find_bundled(const std::string& key) {
  Registry& r = registry();
  if (!r.any.load(std::memory_order_acquire)) return std::nullopt;
  std::shared_ptr<const BundleEntry> e;
  {
    std::shared_lock lock(r.mutex);
    auto it = r.entries.find(key);
    if (it == r.entries.end()) return std::nullopt;
    e = it->second;
  }
  return e->compiled;
}

std::vector<LoadedBundle> loaded_bundles() {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  return r.bundles;
}

void unload_all_bundles() {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  r.entries.clear();
  r.bundles.clear();
  r.failures.clear();
  r.any.store(false, std::memory_order_release);
  g_bundles_generation.fetch_add(1, std::memory_order_acq_rel);
}

void throw_not_bundled(const ir::Function& f, const jit::CompileOptions& opts, const std::string& key) {
  std::string msg = fmt::format(
      "tilejit: kernel '{}' is not in a loaded bundle and compilers are disabled (TILEJIT_DISABLE_COMPILERS={}): "
      "wanted {} [{}] ({}) for {}, bundle key {}",
      f.name, std::getenv("TILEJIT_DISABLE_COMPILERS") ? std::getenv("TILEJIT_DISABLE_COMPILERS") : "", f.name, describe_meta(f.meta), describe_schedule(opts), opts.arch, key);
  Registry& r = registry();
  {
    std::shared_lock lock(r.mutex);
    if (r.bundles.empty()) {
      msg += "; no bundle is loaded (call tilejit::load_bundle(path), or link the source `tilejit bundle --emit-cpp` writes)";
    } else {
      std::vector<std::string> names;
      for (const LoadedBundle& b : r.bundles) names.push_back(fmt::format("{} ({} kernels)", b.name, b.entries));
      msg += fmt::format("; loaded bundles: {}", fmt::join(names, ", "));
      std::vector<std::string> same;
      for (const auto& [k, e] : r.entries)
        if (e->kernel == f.name) same.push_back(fmt::format("[{}] ({}) for {}", e->meta, e->schedule, e->arch));
      std::sort(same.begin(), same.end());
      if (same.empty()) msg += fmt::format("; none of them holds '{}'", f.name);
      else msg += fmt::format("; their '{}' entries: {}", f.name, fmt::join(same, "; "));
    }
    for (const std::string& failure : r.failures) msg += fmt::format("; failed to load: {}", failure);
  }
  msg += fmt::format("; for a library kernel, a bundle holding it: tilejit bundle -o FILE --arch {} {}", opts.arch, cli_spec(f, opts));
  throw jit::CompileError(msg);
}

// ---- embedding -------------------------------------------------------------------------------

std::string bundle_cpp_source(std::string_view bytes, std::string_view name) {
  std::string out = fmt::format(
      "// Generated by `tilejit bundle --emit-cpp` from the bundle {} ({} bytes); do not edit, regenerate it.\n"
      "// Linking this file into an application (as a source or object of the executable or shared\n"
      "// library, not through a static library, whose unreferenced members the linker drops) loads\n"
      "// the bundle before main() runs, so its kernels run with no compiler present.\n"
      "#include <cstddef>\n"
      "#include <cstdio>\n"
      "#include <exception>\n"
      "\n"
      "namespace tilejit::runtime {{\n"
      "void load_bundle_bytes(const unsigned char* data, std::size_t size, const char* name);  // runtime/bundle.hpp\n"
      "}}\n"
      "\n"
      "namespace {{\n"
      "\n"
      "alignas(16) const unsigned char tilejit_bundle_data[{}] = {{\n",
      c_string_literal(name), bytes.size(), std::max<size_t>(bytes.size(), 1));  // escaped: a newline would end the comment
  out.reserve(out.size() + bytes.size() * 5 + 4096);
  for (size_t i = 0; i < bytes.size(); ++i) {
    out += fmt::format("0x{:02x},", static_cast<uint8_t>(bytes[i]));
    if (i % 20 == 19 || i + 1 == bytes.size()) out += '\n';
  }
  out += fmt::format(
      "}};\n"
      "\n"
      "// Registers the bundle during static initialisation; an exception must not escape it (that\n"
      "// would terminate the program), so a bundle that fails to load is reported here, and the\n"
      "// kernels' own errors later say that it failed.\n"
      "struct TilejitBundleRegistration {{\n"
      "  TilejitBundleRegistration() {{\n"
      "    try {{\n"
      "      tilejit::runtime::load_bundle_bytes(tilejit_bundle_data, {}, {});\n"
      "    }} catch (const std::exception& e) {{\n"
      "      std::fprintf(stderr, \"%s\\n\", e.what());\n"
      "    }}\n"
      "  }}\n"
      "}};\n"
      "const TilejitBundleRegistration tilejit_bundle_registration;\n"
      "\n"
      "}}  // namespace\n",
      bytes.size(), c_string_literal(fmt::format("{} (embedded)", name)));
  return out;
}

}  // namespace tilejit::runtime
