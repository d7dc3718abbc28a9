// Test helpers that run something in a forked child: with a deadline (so a test of "never hangs"
// fails instead of hanging), as an unprivileged user (so permission checks apply even when the
// tests run as root), or as a separate program with its output captured (the `tilejit` CLI).
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tilejit::testing {

struct ChildResult {
  bool finished = false;  // false: killed at the deadline
  int exit_code = -1;     // the exit status; -1 when it died of a signal
  int signal = 0;         // the signal that ended it, if any
  std::string output;     // what it wrote to the pipe (stdout and stderr for programs)
  pid_t pid = 0;
  double seconds = 0;
};

// Runs `body` in a forked child that writes its report to `out_fd` and returns its exit status;
// kills it (SIGKILL) after `deadline_s`, or as soon as `kill_when` (polled) says so.
// `unprivileged`: the child drops root to nobody first.
inline ChildResult run_child(const std::function<int(int out_fd)>& body, double deadline_s, bool unprivileged = false,
                             const std::function<bool()>& kill_when = {}) {
  ChildResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  r.pid = pid;
  if (pid == 0) {
    ::close(fds[0]);
    if (unprivileged && ::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(125);
    ::_exit(body(fds[1]));
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  int status = 0;
  char buf[4096];
  for (;;) {
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) r.output.append(buf, static_cast<size_t>(n));
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      r.finished = true;
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > deadline_s ||
        (kill_when && kill_when())) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) r.output.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// Writes a report from inside run_child's body.
inline void report(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Runs `probe` in a child with a deadline; its result comes back as the output. For checks that
// something returns at once: if it hangs, the child is killed and `finished` is false.
inline ChildResult probe_in_child(const std::function<std::string()>& probe, double deadline_s = 10) {
  return run_child(
      [&](int fd) {
        report(fd, probe());
        return 0;
      },
      deadline_s);
}

// Runs a program (argv[0] a path) with extra environment variables, stdout and stderr captured.
inline ChildResult run_program(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                               double deadline_s = 60, bool unprivileged = false) {
  return run_child(
      [&](int out_fd) {
        ::dup2(out_fd, 1);
        ::dup2(out_fd, 2);
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> args;
        for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        ::execv(args[0], args.data());
        return 127;
      },
      deadline_s, unprivileged);
}

}  // namespace tilejit::testing
