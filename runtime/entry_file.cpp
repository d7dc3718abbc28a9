// Entry files: one-descriptor reads, identity-checked removal, atomic writes.
#include "runtime/entry_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tilejit::runtime::entry_file {

namespace fs = std::filesystem;

std::optional<Bytes> read(const fs::path& path, uint64_t max_bytes, std::string& error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
    error = S_ISREG(st.st_mode) ? fmt::format("{} bytes, larger than any entry tilejit writes", st.st_size)
                                : "not a regular file";
    ::close(fd);
    return std::nullopt;
  }
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
  std::string tmp = (path.parent_path() / (path.stem().string() + std::string(temp_marker) + "XXXXXX")).string();
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot create a temporary file in {}: {}", path.parent_path().string(), std::strerror(errno));
  std::string failure;
  size_t done = 0;
  while (done < data.size() && failure.empty()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failure = fmt::format("write failed: {}", std::strerror(errno));
    else done += static_cast<size_t>(n);
  }
  if (failure.empty() && ::fsync(fd) != 0) failure = fmt::format("fsync failed: {}", std::strerror(errno));
  if (failure.empty() && mode != 0600) ::fchmod(fd, static_cast<mode_t>(mode));
  if (::close(fd) != 0 && failure.empty()) failure = fmt::format("close failed: {}", std::strerror(errno));
  if (failure.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
    failure = fmt::format("rename to the final name failed: {}", std::strerror(errno));
  if (!failure.empty()) ::unlink(tmp.c_str());
  return failure;
}

}  // namespace tilejit::runtime::entry_file
