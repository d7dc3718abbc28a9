// The file rules every on-disk store of tilejit shares (compile cache, tuning store, bundles, the
// CLI's outputs): read a file through one non-blocking descriptor after checking what it is, remove
// it only if it is still the file that was read, and write it atomically (unique temporary file in
// the same directory, fsync, rename).
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
// the failure (not a regular file and what it is instead, larger than `max_bytes`, unreadable).
// The open is non-blocking, so a FIFO or device where a file is expected is an error at once,
// never a hang; the size is checked before anything is read.
std::optional<Bytes> read(const std::filesystem::path& path, uint64_t max_bytes, std::string& error);

// Removes `path` only if it is still the file that was read, so that a bad entry that another
// process has meanwhile replaced with a good one is kept.
void remove_if_same(const std::filesystem::path& path, const Bytes& read);

// Writes `data` to `path` atomically: a unique temporary file `<stem><temp_marker><pid>-XXXXXX` in
// the same directory (mkostemp: every writer, thread or process, has its own; the pid says whose it
// is, see is_orphaned_temporary), fsync (after a crash the file is absent, old or complete), rename
// over the final name (of concurrent writers one complete file wins; a writer killed midway leaves
// the old file intact). `mode` is applied before the rename (mkostemp creates 0600: private entries
// of a per-user cache; build outputs others read pass 0644). Returns an empty string, or what
// failed with the reason (strerror) and the path concerned (the temporary file is removed).
std::string write_atomically(const std::filesystem::path& path, std::string_view temp_marker, const std::string& data,
                             unsigned mode = 0600);

// The writer's pid in a temporary file name that write_atomically made with `temp_marker`;
// nullopt when the name is not such a temporary or carries no pid (older tilejit versions).
std::optional<pid_t> temporary_writer(std::string_view file_name, std::string_view temp_marker);

// Whether a temporary file of write_atomically was left behind by a writer that died: its pid no
// longer exists (kill(pid, 0) gives ESRCH), or the file is older than `kOrphanAge` (no write takes
// that long; this covers a reused pid and names without a pid). A temporary of a live writer is
// never called orphaned before that age, so removing orphans cannot break a write in progress on
// this machine. (A writer on another host sharing the directory, whose pid means nothing here, may
// lose its temporary: its write then fails with a message, as for a full disk.)
inline constexpr int kOrphanAgeSeconds = 3600;
bool is_orphaned_temporary(const std::filesystem::path& path, std::string_view temp_marker);

}  // namespace tilejit::runtime::entry_file
