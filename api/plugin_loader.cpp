// Plugins: dlopen, the stamp check, registration (decision 048).
#include "api/plugin_loader.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "api/plugin.hpp"
#include "api/registry.hpp"

namespace tilejit::plugin {

namespace fs = std::filesystem;

namespace {

// `where`: the source and the path as given ("--plugin ./libk.so").
[[noreturn]] void refuse(const std::string& where, const std::string& problem) {
  throw PluginError(fmt::format("tilejit: {}: {}", where, problem));
}

std::string describe(uint32_t abi, const char* version, const char* cxx_library) {
  return fmt::format("tilejit {} (plugin ABI {}, {})", version, abi, cxx_library);
}

// Everything before the registration call: the library and its stamp. Returns the registration
// function.
RegisterFunction open_checked(const fs::path& file, const std::string& where) {
  ::dlerror();
  // RTLD_LOCAL: two plugins may both define the entry points. Never closed: the registered rows
  // point into the library, and a refused one's static initialisers may have run.
  void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = ::dlerror();
    refuse(where, fmt::format("cannot be loaded as a shared library: {}", err ? err : "dlopen failed"));
  }
  auto stamp = reinterpret_cast<StampFunction>(::dlsym(handle, kStampSymbol));
  if (!stamp)
    refuse(where, fmt::format("not a tilejit plugin: it exports no {} (a plugin defines its entry points with "
                              "TILEJIT_PLUGIN(registrar) {{ ... }} from api/plugin.hpp)",
                              kStampSymbol));
  const tilejit_plugin_abi_stamp* s = stamp();
  if (!s || !s->tilejit_version || !s->cxx_library) refuse(where, fmt::format("its {} returned no stamp", kStampSymbol));
  const std::string_view version = runtime::codec::kTilejitVersion;
  if (s->abi != kAbi || s->tilejit_version != version || std::strcmp(s->cxx_library, kCxxLibrary) != 0)
    refuse(where, fmt::format("built against {}; this is {}: rebuild the plugin against this tilejit's headers and library",
                              describe(s->abi, s->tilejit_version, s->cxx_library), describe(kAbi, version.data(), kCxxLibrary)));
  auto reg = reinterpret_cast<RegisterFunction>(::dlsym(handle, kRegisterSymbol));
  if (!reg)
    refuse(where,
           fmt::format("exports {} but not {} (define both with TILEJIT_PLUGIN from api/plugin.hpp)", kStampSymbol, kRegisterSymbol));
  return reg;
}

}  // namespace

void load(const fs::path& path, std::string_view source) {
  const std::string where = fmt::format("{} {}", source, path.string());
  const std::string valid = "give the path of a shared library built with TILEJIT_PLUGIN (api/plugin.hpp)";
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) refuse(where, fmt::format("no such file ({})", valid));
  if (!fs::is_regular_file(st)) refuse(where, fmt::format("not a regular file ({})", valid));
  const fs::path file = fs::canonical(path, ec);
  if (ec) refuse(where, fmt::format("cannot resolve the path: {}", ec.message()));

  static std::mutex mutex;
  // dlopen() maps one file once whatever path or link names it: its entry point identifies it.
  static std::set<RegisterFunction> loaded;
  std::lock_guard lock(mutex);
  const RegisterFunction reg = open_checked(file, where);
  if (loaded.count(reg)) return;
  Registrar registrar;
  try {
    reg(registrar);
  } catch (const std::exception& e) {
    refuse(where, fmt::format("its registration failed: {}", e.what()));
  } catch (...) {
    refuse(where, "its registration threw something that is not a std::exception");
  }
  if (registrar.kernels().empty()) refuse(where, "it registers no kernel (call registrar.add(...) in its TILEJIT_PLUGIN body)");
  try {
    library::register_kernels(registrar.kernels(), where);
  } catch (const std::invalid_argument& e) {
    throw PluginError(e.what());
  }
  loaded.insert(reg);
}

void load_from_environment() {
  const char* value = std::getenv("TILEJIT_PLUGINS");
  if (!value) return;
  const std::string list = value;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t colon = std::min(list.find(':', start), list.size());
    if (colon > start) load(list.substr(start, colon - start), "TILEJIT_PLUGINS");
    start = colon + 1;
  }
}

}  // namespace tilejit::plugin
