// Entry files: non-blocking, type- and size-checked one-descriptor reads, identity-checked removal,
// atomic writes and the temporaries they leave when killed.
#include "runtime/entry_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace tilejit::runtime::entry_file {

namespace fs = std::filesystem;

namespace {

// What a non-regular file is, for the error: "a FIFO" says more than "not a regular file".
std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return fmt::format("a file of type {:o}", m & S_IFMT);
}

}  // namespace

std::optional<Bytes> read(const fs::path& path, uint64_t max_bytes, std::string& error) {
  // O_NONBLOCK: opening a FIFO without a writer (or some devices) would otherwise block forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno != ENOENT && errno != ENOTDIR) error = fmt::format("cannot open: {}", std::strerror(errno));
    return std::nullopt;
  }
  Bytes out;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    error = fmt::format("cannot stat: {}", std::strerror(errno));
    ::close(fd);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > max_bytes) {
    error = S_ISREG(st.st_mode)
                ? fmt::format("{} bytes, more than the limit of {} bytes (larger than any file tilejit writes; not read)",
                              st.st_size, max_bytes)
                : fmt::format("not a regular file but {}", file_kind(st.st_mode));
    ::close(fd);
    return std::nullopt;
  }
  // A regular file never blocks, but the flag is cleared anyway so that reads follow the usual rules.
  if (int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  out.dev = st.st_dev;
  out.ino = st.st_ino;
  out.data.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.data.size()) {
    ssize_t r = ::read(fd, out.data.data() + got, out.data.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      error = fmt::format("cannot read: {}", std::strerror(errno));
      ::close(fd);
      return std::nullopt;
    }
    if (r == 0) break;  // shrank since fstat: the decoder reports it as truncated
    got += static_cast<size_t>(r);
  }
  out.data.resize(got);
  ::close(fd);
  std::error_code ec;
  out.written = fs::last_write_time(path, ec);
  return out;
}

void remove_if_same(const fs::path& path, const Bytes& read) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_dev == read.dev && st.st_ino == read.ino) ::unlink(path.c_str());
}

std::string write_atomically(const fs::path& path, std::string_view temp_marker, const std::string& data, unsigned mode) {
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::string tmp =
      (dir / fmt::format("{}{}{}-XXXXXX", path.stem().string(), temp_marker, static_cast<long>(::getpid()))).string();
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0)
    return fmt::format("cannot create a temporary file in {}: {}", dir.string(), std::strerror(errno));
  std::string failure;
  size_t done = 0;
  while (done < data.size() && failure.empty()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failure = fmt::format("writing {} failed: {}", tmp, n < 0 ? std::strerror(errno) : "no progress");
    else done += static_cast<size_t>(n);
  }
  if (failure.empty() && ::fsync(fd) != 0) failure = fmt::format("fsync of {} failed: {}", tmp, std::strerror(errno));
  if (failure.empty() && mode != 0600 && ::fchmod(fd, static_cast<mode_t>(mode)) != 0)
    failure = fmt::format("chmod of {} failed: {}", tmp, std::strerror(errno));
  if (::close(fd) != 0 && failure.empty()) failure = fmt::format("close of {} failed: {}", tmp, std::strerror(errno));
  if (failure.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
    failure = fmt::format("rename to {} failed: {}", path.string(), std::strerror(errno));
  if (!failure.empty()) {
    ::unlink(tmp.c_str());
    return failure;
  }
  // The rename itself is durable once the directory is synced (best effort: some file systems refuse).
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

std::optional<pid_t> temporary_writer(std::string_view name, std::string_view temp_marker) {
  size_t at = name.find(temp_marker);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = name.substr(at + temp_marker.size());  // "<pid>-XXXXXX"
  size_t dash = rest.find('-');
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  long pid = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + dash, pid);
  if (ec != std::errc() || end != rest.data() + dash || pid <= 0) return std::nullopt;
  return static_cast<pid_t>(pid);
}

bool is_orphaned_temporary(const fs::path& path, std::string_view temp_marker) {
  std::error_code ec;
  auto written = fs::last_write_time(path, ec);
  if (!ec && fs::file_time_type::clock::now() - written > std::chrono::seconds(kOrphanAgeSeconds)) return true;
  std::optional<pid_t> pid = temporary_writer(path.filename().string(), temp_marker);
  // EPERM means the process exists (another user's): alive.
  return pid && ::kill(*pid, 0) != 0 && errno == ESRCH;
}

}  // namespace tilejit::runtime::entry_file
