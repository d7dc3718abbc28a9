// A mutation fuzzer of the parsers of stored kernels (runtime/kernel_codec), bundles
// (runtime/bundle), compile-cache entries (runtime/compile_cache, read from files through
// runtime/entry_file), tuning-store entries (runtime/tuning_store), bundles' tuning tables
// (runtime/tuning_table) and tuning config ids (runtime/tuning_space), built with AddressSanitizer and UndefinedBehaviorSanitizer: this executable
// compiles its own instrumented copies of those files (its symbols take precedence over the shared
// library's), so any out-of-bounds read, overflow or bad cast in them aborts the run.
// Mutations keep the bundle's checksum and size fields right more often than not, so the parser
// gets past them into every field. Usage: fuzz_parsers [SECONDS (default 30)] [SEED].
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "dsl/ir/sha256.hpp"
#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/bundle.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/kernel_codec.hpp"

using namespace tilejit;
using namespace tilejit::lang;

namespace {

jit::CompiledKernel sample_kernel() {
  const Kernel k = kernel("fuzz_sample", [](Builder& b) {
    auto X = b.tensor("X", f32, 2, {.align_bytes = 16, .contiguous_last = true});
    auto Y = b.pointer("Y", f32);
    store(Y + arange(0, 64), sum(load(X.block({0, 0}, {64, 64})), 1));
  });
  jit::CompileOptions o;
  o.make_cubin = false;  // no assembler needed: the parser does not look inside the PTX
  jit::CompiledKernel c = jit::compile(k.build(), o);
  c.cubin.assign(300, 0xAB);  // stand-in bytes: only their length and checksum matter here
  c.tensor_maps.push_back({3, 0, {64, 64}, 128});
  return c;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  size_t below(size_t n) { return n ? static_cast<size_t>(rng_() % n) : 0; }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // One to four edits of `s` between [lo, hi): bit flips, bytes set to edge values, an 8-byte
  // length field made huge or off by a little, truncation, insertion, deletion.
  void mutate(std::string& s, size_t lo, size_t hi) {
    const int edits = 1 + static_cast<int>(below(4));
    for (int e = 0; e < edits && hi > lo && hi <= s.size(); ++e) {
      const size_t at = lo + below(hi - lo);
      switch (below(7)) {
        case 0: s[at] = static_cast<char>(s[at] ^ (1 << below(8))); break;
        case 1: s[at] = static_cast<char>(std::vector<int>{0, 1, 0x7f, 0x80, 0xff}[below(5)]); break;
        case 2: {
          const uint64_t v = std::vector<uint64_t>{~0ull, 1ull << 63, 1ull << 32, 0xFFFFFFFFull, 0, 7}[below(6)];
          for (size_t i = 0; i < 8 && at + i < hi; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
          break;
        }
        case 3:
          for (size_t i = 0; i < 8 && at + i < hi; ++i) s[at + i] = static_cast<char>(s[at + i] + (i == 0 ? below(5) - 2 : 0));
          break;
        case 4: s.resize(at); hi = std::min(hi, s.size()); break;
        case 5: s.insert(at, std::string(1 + below(16), static_cast<char>(below(256)))); hi += 0; break;
        default: s.erase(at, 1 + below(std::min<size_t>(16, hi - at))); hi = std::min(hi, s.size()); break;
      }
    }
  }

 private:
  std::mt19937_64 rng_;
};

// A cache entry's SHA-256 trailer recomputed for `s` (its header carries no size).
void reseal_entry(std::string& s) {
  if (s.size() < 48) return;
  s.resize(s.size() - 32);
  const auto h = ir::sha256(s);
  s.append(reinterpret_cast<const char*>(h.data()), h.size());
}

// The bundle's header size field (bytes 16..23) and SHA-256 trailer recomputed for `s`.
void reseal(std::string& s) {
  if (s.size() < 56) return;
  s.resize(s.size() - 32);
  const uint64_t total = s.size() + 32;
  for (int i = 0; i < 8; ++i) s[16 + static_cast<size_t>(i)] = static_cast<char>(total >> (8 * i));
  const auto h = ir::sha256(s);
  s.append(reinterpret_cast<const char*>(h.data()), h.size());
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 30;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const jit::CompiledKernel k = sample_kernel();
  runtime::codec::Writer w;
  runtime::codec::write_kernel(w, k);
  const std::string kernel_bytes = w.out();
  runtime::Bundle b;
  b.archs = {"sm_90a", "sm_80"};
  for (int i = 0; i < 2; ++i)
    b.entries.push_back({ir::sha256_hex(fmt::format("key{}", i)), "fuzz_sample", "BLOCK=64", "warps=4", "sm_90a", k});
  b.tuning = "tuning tables";
  const std::string bundle_bytes = runtime::encode_bundle(b);
  {  // the unmutated inputs parse
    runtime::codec::Reader r(kernel_bytes, 0, kernel_bytes.size());
    if (runtime::codec::read_kernel(r).ptx != k.ptx) return fmt::print("kernel round trip failed\n"), 1;
    std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(bundle_bytes.data()), bundle_bytes.size());
    if (runtime::read_bundle_bytes(data, "fuzz").entries.size() != 2) return fmt::print("bundle round trip failed\n"), 1;
  }
  // a cache entry written by the cache itself, in a directory of this run
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("tilejit_fuzz_parsers_{}", ::getpid());
  fs::create_directories(dir);
  runtime::CompileCache cache(dir);
  const std::string key = ir::sha256_hex("fuzz entry");
  if (!cache.store(key, k)) return fmt::print("cache store failed\n"), 1;
  std::string entry_bytes;
  {
    std::ifstream f(cache.entry_path(key), std::ios::binary);
    entry_bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  if (!cache.load(key)) return fmt::print("cache round trip failed\n"), 1;
  // tuning entries (a measurement and a choice) written by the store itself, and a tuning table
  runtime::TuningStore tuning(dir);
  const runtime::TuningIdentity tid{"fuzz_sample", "BLOCK=64", "S=4096", "NVIDIA H100", "sm_90a", "llvm", 132, 13000};
  const runtime::Measurement meas{"BLOCK_M=128,stages=2,warps=8", 0.5, true, "a note", {128, 65536, 0, 256}};
  const runtime::Choice choice{"BLOCK_M=128,stages=2,warps=8", 0.5, "fingerprint", true, 3};
  if (!tuning.store_measurement(tid, meas) || !tuning.store_choice(tid, choice)) return fmt::print("tuning store failed\n"), 1;
  auto file_bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const fs::path meas_path = tuning.measurement_path(tid, meas.config), choice_path = tuning.choice_path(tid);
  const std::string meas_bytes = file_bytes(meas_path), choice_bytes = file_bytes(choice_path);
  if (!tuning.load_measurement(tid, meas.config) || !tuning.load_choice(tid)) return fmt::print("tuning round trip failed\n"), 1;
  std::vector<runtime::TuningTableEntry> table(2, {tid, meas.config, 0.5});
  table[1].identity.bucket = "S=8192";
  const std::string table_bytes = runtime::encode_tuning_table(table);
  if (runtime::decode_tuning_table(table_bytes).size() != 2) return fmt::print("tuning table round trip failed\n"), 1;
  uint64_t tuning_runs = 0, tuning_ok = 0;

  uint64_t entry_runs = 0, entry_ok = 0;
  Mutator m(seed);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t runs = 0, kernel_ok = 0, bundle_ok = 0, rejected = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    for (int batch = 0; batch < 64; ++batch, ++runs) {
      std::string s = kernel_bytes;
      m.mutate(s, 0, s.size());
      try {
        runtime::codec::Reader r(s, 0, s.size());
        runtime::codec::read_kernel(r);
        ++kernel_ok;
      } catch (const runtime::codec::DecodeError&) {
        ++rejected;
      } catch (const std::length_error&) {
        ++rejected;
      }
      std::string t = bundle_bytes;
      m.mutate(t, m.chance(0.2) ? 0 : 24, t.size() - (m.chance(0.2) ? 0 : 32));
      if (m.chance(0.85)) reseal(t);
      try {
        std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(t.data()), t.size());
        runtime::read_bundle_bytes(data, "fuzz");
        ++bundle_ok;
      } catch (const runtime::BundleError&) {
        ++rejected;
      }
      if (batch % 8 == 0) {  // (a file write and read each: fewer of them)
        std::string e = entry_bytes;
        m.mutate(e, m.chance(0.2) ? 0 : 16, e.size() - (m.chance(0.2) ? 0 : 32));
        if (m.chance(0.85)) reseal_entry(e);
        std::ofstream(cache.entry_path(key), std::ios::binary | std::ios::trunc) << e;
        std::string problem;
        if (cache.load(key, &problem)) ++entry_ok;  // load never throws for a bad file
        else ++rejected;
        ++entry_runs;
        // tuning entries: each kind through its file, resealed most of the time
        const bool is_choice = m.chance(0.5);
        std::string te = is_choice ? choice_bytes : meas_bytes;
        m.mutate(te, m.chance(0.2) ? 0 : 16, te.size() - (m.chance(0.2) ? 0 : 32));
        if (m.chance(0.85)) reseal_entry(te);
        std::ofstream(is_choice ? choice_path : meas_path, std::ios::binary | std::ios::trunc) << te;
        const bool loaded = is_choice ? tuning.load_choice(tid, &problem).has_value()
                                      : tuning.load_measurement(tid, meas.config, &problem).has_value();
        if (loaded) ++tuning_ok;  // loads never throw for a bad file either
        else ++rejected;
        ++tuning_runs;
      }
      std::string tt = table_bytes;
      m.mutate(tt, 0, tt.size());
      try {
        runtime::decode_tuning_table(tt);
        ++tuning_ok;
      } catch (const std::runtime_error&) {
        ++rejected;
      }
      std::string config = meas.config;
      m.mutate(config, 0, config.size());
      try {
        runtime::parse_config(config);
      } catch (const std::invalid_argument&) {
        ++rejected;
      }
    }
  }
  fs::remove_all(dir);
  fmt::print("fuzz_parsers: {} kernel, {} bundle, {} tuning-table, {} config, {} cache-entry and {} tuning-entry inputs in "
             "{:.0f} s (seed {}): {} rejected with a clear error, {} kernels, {} bundles, {} cache entries and {} tuning "
             "entries or tables still parsed; no crash, no sanitizer report\n",
             runs, runs, runs, runs, entry_runs, tuning_runs, seconds, seed, rejected, kernel_ok, bundle_ok, entry_ok, tuning_ok);
  return 0;
}
