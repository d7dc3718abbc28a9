// Test helper: a fresh, uniquely named directory under the system temp directory, removed when
// the object goes out of scope (the cache, bundle and autotuner suites write real files).
#pragma once
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string_view>

namespace tilejit::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(std::string_view prefix) {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / fmt::format("{}-{}-{}-{:08x}", prefix, ::getpid(), counter++, rd());
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace tilejit::testing
