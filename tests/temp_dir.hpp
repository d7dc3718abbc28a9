// Test helpers for suites that touch the file system and the environment: a fresh temporary
// directory removed at scope exit, and an environment variable set (or unset) for one scope.
#pragma once
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
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

// Sets (or unsets, for nullptr) an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) old = v;
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace tilejit::testing
