// `tilejit cache ls|clear|verify|dir`: the on-disk compile cache (runtime/compile_cache.hpp).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "commands.hpp"
#include "runtime/compile_cache.hpp"

namespace tilejit::cli {
namespace {

namespace fs = std::filesystem;

std::string age(std::filesystem::file_time_type t) {
  auto s = std::chrono::duration_cast<std::chrono::seconds>(std::filesystem::file_time_type::clock::now() - t).count();
  if (s < 120) return fmt::format("{}s", s);
  if (s < 7200) return fmt::format("{}m", s / 60);
  if (s < 172800) return fmt::format("{}h", s / 3600);
  return fmt::format("{}d", s / 86400);
}

}  // namespace

int cmd_cache(const Args& args) {
  if (args.size() != 1) throw UsageError("cache needs one of: ls, clear, verify, dir");
  const runtime::CompileCache& cache = runtime::CompileCache::global();
  const std::string& what = args[0];
  if (what == "dir") {
    std::printf("%s (%s)\n", cache.dir().string().c_str(), cache.enabled() ? "enabled" : "disabled");
    return 0;
  }
  if (!cache.enabled()) {
    std::printf("the compile cache is disabled (TILEJIT_CACHE=0, or no cache directory could be determined)\n");
    return what == "verify" ? 0 : 0;
  }
  if (what != "ls" && what != "verify" && what != "clear")
    throw UsageError(fmt::format("unknown cache command '{}' (valid: ls, clear, verify, dir)", what));
  // A missing or wrong path is not an empty cache: saying "0 entries" would hide a typo in
  // TILEJIT_CACHE_DIR (or a cache that was never written).
  std::error_code ec;
  const fs::file_status st = fs::status(cache.dir(), ec);
  if (!fs::is_directory(st)) {
    std::fprintf(stderr, "tilejit cache %s: %s: %s\n", what.c_str(), cache.dir().c_str(),
                 !fs::exists(st) ? "no such directory (nothing has been cached there, or TILEJIT_CACHE_DIR is wrong)"
                                 : "not a directory (TILEJIT_CACHE_DIR must name a directory)");
    return 1;
  }
  if (what == "ls" || what == "verify") {
    auto entries = cache.list();
    auto temporaries = cache.temporaries();
    size_t bad = 0, bytes = 0, orphans = 0;
    for (const auto& e : entries) {
      bytes += e.bytes;
      if (!e.valid) ++bad;
      if (what == "ls")
        std::printf("%.16s  %-16s %-8s %8zu B  %5s ago%s\n", e.key.c_str(), e.valid ? e.kernel.c_str() : "?", e.arch.c_str(), e.bytes,
                    age(e.written).c_str(), e.valid ? "" : "  INVALID");
      else if (!e.valid)
        std::printf("invalid: %s: %s\n", cache.entry_path(e.key).string().c_str(), e.problem.c_str());
    }
    // Temporaries of killed writers are harmless (never read) but take space until `cache clear`.
    for (const auto& t : temporaries) {
      if (t.orphaned) ++orphans;
      if (t.orphaned || what == "ls")
        std::printf("%s: %s (%zu B)\n", t.orphaned ? "orphaned temporary" : "write in progress", t.path.c_str(), t.bytes);
    }
    std::printf("%zu entries, %zu bytes, %zu invalid, %zu orphaned temporaries, in %s\n", entries.size(), bytes, bad,
                orphans, cache.dir().string().c_str());
    // verify: invalid entries are reported (they would be rebuilt on use, never loaded)
    return what == "verify" && bad ? 1 : 0;
  }
  runtime::CompileCache::Cleared c = cache.clear();
  for (const std::string& f : c.failures) std::fprintf(stderr, "tilejit cache clear: cannot remove %s\n", f.c_str());
  std::printf("removed %zu entries and %zu orphaned temporaries from %s%s\n", c.entries, c.temporaries,
              cache.dir().string().c_str(),
              c.live_temporaries ? fmt::format(" ({} temporaries of running writers kept)", c.live_temporaries).c_str() : "");
  if (!c.failures.empty()) {
    std::fprintf(stderr, "tilejit cache clear: %zu files could not be removed; the cache is not clear\n", c.failures.size());
    return 1;
  }
  return 0;
}

}  // namespace tilejit::cli
