// `tilejit cache ls|clear|verify|dir`: the on-disk compile cache (runtime/compile_cache.hpp).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "commands.hpp"
#include "runtime/compile_cache.hpp"

namespace tilejit::cli {
namespace {

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
  if (what == "ls" || what == "verify") {
    auto entries = cache.list();
    size_t bad = 0, bytes = 0;
    for (const auto& e : entries) {
      bytes += e.bytes;
      if (!e.valid) ++bad;
      if (what == "ls")
        std::printf("%.16s  %-16s %-8s %8zu B  %5s ago%s\n", e.key.c_str(), e.valid ? e.kernel.c_str() : "?", e.arch.c_str(), e.bytes,
                    age(e.written).c_str(), e.valid ? "" : "  INVALID");
      else if (!e.valid)
        std::printf("invalid: %s: %s\n", cache.entry_path(e.key).string().c_str(), e.problem.c_str());
    }
    std::printf("%zu entries, %zu bytes, %zu invalid, in %s\n", entries.size(), bytes, bad, cache.dir().string().c_str());
    // verify: invalid entries are reported (they would be rebuilt on use, never loaded)
    return what == "verify" && bad ? 1 : 0;
  }
  if (what == "clear") {
    size_t n = cache.clear();
    std::printf("removed %zu entries from %s\n", n, cache.dir().string().c_str());
    return 0;
  }
  throw UsageError(fmt::format("unknown cache command '{}' (valid: ls, clear, verify, dir)", what));
}

}  // namespace tilejit::cli
