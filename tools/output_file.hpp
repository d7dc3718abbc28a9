// The files the `tilejit` commands write (compile -o, bundle --emit-cpp, inspect's cubin): always
// through runtime/entry_file.hpp's atomic write, so an interrupted command never leaves a
// truncated output, and an existing file stays intact when the write fails.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

namespace tilejit::cli {

// Creates the parent directories, writes `data` atomically (0644: outputs others read). Throws
// std::runtime_error "tilejit COMMAND: cannot write PATH: REASON" on failure.
void write_output(std::string_view command, const std::filesystem::path& path, std::string_view data);

}  // namespace tilejit::cli
