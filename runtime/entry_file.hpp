// The file rules every on-disk store of tilejit shares (compile cache, tuning store): read an
// entry through one descriptor, remove it only if it is still the file that was read, and write
// it atomically (unique temporary file in the same directory, fsync, rename).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace tilejit::runtime::entry_file {

struct Bytes {
  std::string data;
  dev_t dev = 0;  // the identity of exactly the bytes read (a concurrent rename cannot change it)
  ino_t ino = 0;
  std::filesystem::file_time_type written;
};

// The whole file, or nullopt with `error` empty when it does not exist (a plain miss) or naming
// the failure (not a regular file, larger than `max_bytes`, unreadable).
std::optional<Bytes> read(const std::filesystem::path& path, uint64_t max_bytes, std::string& error);

// Removes `path` only if it is still the file that was read, so that a bad entry that another
// process has meanwhile replaced with a good one is kept.
void remove_if_same(const std::filesystem::path& path, const Bytes& read);

// Writes `data` to `path` atomically: a unique temporary file `<stem><temp_marker>XXXXXX` in the
// same directory (mkostemp: every writer, thread or process, has its own), fsync (after a crash
// the entry is absent or complete), rename over the final name (of concurrent writers one
// complete file wins). `mode` is applied before the rename (mkostemp creates 0600: private entries
// of a per-user cache; build outputs others read pass 0644). Returns an empty string, or what
// failed (the temporary file is removed).
std::string write_atomically(const std::filesystem::path& path, std::string_view temp_marker, const std::string& data,
                             unsigned mode = 0600);

}  // namespace tilejit::runtime::entry_file
