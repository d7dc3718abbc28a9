// Atomic output files of the `tilejit` commands (output_file.hpp).
#include "output_file.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <system_error>

#include "runtime/entry_file.hpp"

namespace tilejit::cli {

void write_output(std::string_view command, const std::filesystem::path& path, std::string_view data) {
  if (path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec)
      throw std::runtime_error(fmt::format("tilejit {}: cannot write {}: cannot create the directory {}: {}", command,
                                           path.string(), path.parent_path().string(), ec.message()));
  }
  std::string failure =
      runtime::entry_file::write_atomically(path, path.extension().string() + ".tmp-", std::string(data), 0644);
  if (!failure.empty())
    throw std::runtime_error(fmt::format("tilejit {}: cannot write {}: {}", command, path.string(), failure));
}

}  // namespace tilejit::cli
