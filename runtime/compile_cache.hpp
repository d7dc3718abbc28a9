// The compile cache: compiled kernels kept in memory for this process and on disk for the next,
// keyed by everything that changes the produced code, with entries that are checked before use.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/compile.hpp"

namespace tilejit::runtime {

// The key of a compiled kernel: 64 hex digits, the SHA-256 of cache_key_text(). Two calls give the
// same key exactly when they would produce the same code: same structural IR (meta-parameters and
// parameter specs included), arch, backend, warps, pipeline options, assembler choice, tilejit
// version, entry format and the versions of LLVM, nvJitLink/ptxas and (for that backend) nvrtc.
// CompileOptions::dump_after is not part of it: it changes what is reported, not the code.
std::string cache_key(const ir::Function& f, const jit::CompileOptions& opts);
// What cache_key() hashes, one "name=value" line per component: for finding out why a kernel
// missed the cache (diff two of these).
std::string cache_key_text(const ir::Function& f, const jit::CompileOptions& opts);

// One directory of entries, one file per key (<key>.tjk). Reading never trusts a file: a short,
// damaged, foreign or older-format entry is reported, removed and treated as a miss, so the kernel
// is rebuilt. Writing is atomic (temp file + rename), so concurrent processes compiling the same
// kernel each leave a complete entry and readers see one complete entry or none. A cache that
// cannot be written (read-only, full disk) costs a recompile, never a failure: it warns once.
class CompileCache {
 public:
  // $TILEJIT_CACHE_DIR, else $XDG_CACHE_HOME/tilejit (when that is an absolute path, as the XDG
  // spec requires), else $HOME/.cache/tilejit; empty when none of them is set.
  static std::filesystem::path default_dir();
  // False when TILEJIT_CACHE is "0", "false", "off" or "no" (any case).
  static bool default_enabled();
  // The cache the environment describes (the two functions above), as global() builds it.
  static CompileCache from_environment();
  // The process-wide cache, built from the environment on first use (later changes to the
  // environment do not move it). Disabled when default_dir() is empty.
  static CompileCache& global();

  explicit CompileCache(std::filesystem::path dir, bool enabled = true);
  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  bool enabled() const { return enabled_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path entry_path(const std::string& key) const;

  // The entry for `key`, or nullopt when the cache is disabled, the entry is missing, or it is not
  // a complete, intact entry of this format for this key; such a file is removed (best effort)
  // and, when `problem` is given, what was wrong with it is written there (empty for a plain
  // miss). Never throws for a bad file; throws std::invalid_argument for a malformed key.
  std::optional<jit::CompiledKernel> load(const std::string& key, std::string* problem = nullptr) const;
  // load() that also requires the entry to hold the kernel of `signature` (its name and ABI) for
  // `arch` and `backend`: an intact entry of this key holding anything else (copied or crafted) is
  // treated as damaged, removed and reported. compile_cached serves disk entries only through this.
  std::optional<jit::CompiledKernel> load_expected(const std::string& key, const ir::Function& signature, std::string_view arch,
                                                   jit::Backend backend, std::string* problem = nullptr) const;
  // Writes the entry atomically. Returns whether it was written; failures are warned about once
  // per cache on stderr (naming the file and the reason) and are never fatal. The fields kept are
  // those a launch and `tilejit inspect` need: not backend_source, dump or timings.
  bool store(const std::string& key, const jit::CompiledKernel& k) const;

  struct Entry {
    std::string key;     // from the file name
    std::string kernel;  // empty when the entry is invalid
    std::string arch;
    size_t bytes = 0;
    std::filesystem::file_time_type written;
    bool valid = false;
    std::string problem;  // why it is not valid
  };
  // Every entry file, sorted by key; nothing is changed (`tilejit cache ls` and `verify`). Empty
  // for a missing directory; throws std::runtime_error naming the directory when it cannot be read.
  std::vector<Entry> list() const;

  // A temporary file of a write (<key>.tjk.tmp-<pid>-XXXXXX): in progress, or left by a writer
  // that was killed (orphaned: see entry_file::is_orphaned_temporary for how that is decided).
  struct Temporary {
    std::filesystem::path path;
    size_t bytes = 0;
    bool orphaned = false;
  };
  // Every temporary file, sorted by name; nothing is changed. Throws like list().
  std::vector<Temporary> temporaries() const;

  struct Cleared {
    size_t entries = 0;                 // entry files removed
    size_t temporaries = 0;             // orphaned temporaries removed
    size_t live_temporaries = 0;        // temporaries of running writers, kept
    std::vector<std::string> failures;  // "<path>: <reason>" for each file or directory that stayed
  };
  // Removes every entry and every orphaned temporary file; temporaries of writers still running
  // are kept (removing one would fail that write). Other files in the directory are left alone. A
  // missing directory is nothing to clear; whatever could not be removed is in `failures`.
  Cleared clear() const;

 private:
  void warn_once(const std::string& message) const;
  // load() with an extra check of the decoded kernel (non-empty result: why it is refused).
  std::optional<jit::CompiledKernel> load_checked(const std::string& key,
                                                  const std::function<std::string(const jit::CompiledKernel&)>& expect,
                                                  std::string* problem) const;

  std::filesystem::path dir_;
  bool enabled_;
  mutable std::atomic<bool> warned_{false};
};

// The cached compile: the loaded bundles (runtime/bundle.hpp, by bundle_key), then the
// process-wide memory cache (keyed by cache_key, thread safe; concurrent callers with the same key
// wait for one compile), then the disk cache, then jit::compile and a disk store. A
// CompileOptions::dump_after request bypasses all of them (the dump exists only while compiling).
// Kernels read from bundles or disk have zero timings. With jit::compilers_disabled() only the
// bundles are consulted (the other keys name compiler versions, which asks the compilers); a
// kernel no loaded bundle holds is then a CompileError saying what the bundles do hold.
jit::CompiledKernel compile_cached(const ir::Function& f, const jit::CompileOptions& opts = {});
// The same with a given disk cache instead of CompileCache::global().
jit::CompiledKernel compile_cached(const ir::Function& f, const jit::CompileOptions& opts, const CompileCache& disk);

// Where compile_cached's results came from since the process started (or the last reset): for
// tests, `tilejit` and benchmarks that must show a second run compiled nothing.
struct CompileCacheStats {
  uint64_t memory_hits = 0;
  uint64_t disk_hits = 0;
  uint64_t compiles = 0;
  uint64_t bundle_hits = 0;  // found in a loaded bundle
};
CompileCacheStats compile_cache_stats();
// Empties the memory cache and zeroes the statistics (tests; long-running tools that reload).
void reset_memory_cache();

}  // namespace tilejit::runtime
