// Loading plugins (api/plugin.hpp) into a process: the `tilejit` tool does it for --plugin and
// $TILEJIT_PLUGINS; an application that ships a plugin's kernels in a bundle does it to name them.
#pragma once
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tilejit::plugin {

// A plugin that cannot be used. what() names where the path came from, the path, the problem and
// what is valid: "tilejit: --plugin ./libk.so: built against tilejit 0.1.3 (plugin ABI 1,
// libstdc++ cxx11 ABI); this is tilejit 0.1.16 (...): rebuild the plugin against this
// tilejit's headers and library".
struct PluginError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Opens the shared library at `path` (a file path; never searched for on the library path), checks
// its stamp, calls its registration and registers its kernels, all or none. `source` says where
// the path came from ("--plugin", "TILEJIT_PLUGINS") in errors and in the kernels' origin. Loading
// a file already loaded (under any path) does nothing. Throws PluginError. Thread-safe.
void load(const std::filesystem::path& path, std::string_view source = "tilejit::plugin::load");

// Loads every plugin of $TILEJIT_PLUGINS (paths separated by ':', empty entries skipped), in
// order; nothing when it is unset. Throws PluginError naming the variable and the entry.
void load_from_environment();

}  // namespace tilejit::plugin
