#include "tools/fuzz/pool.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace tilejit::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  return s;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void report(int fd, const Outcome& o) {
  write_all(fd, fmt::format("R\t{}\t{}\t{}\t{}\n", to_string(o.status), o.backend, o.tma_store ? "tma_store" : "-",
                            one_line(o.detail)));
}

// Parses "R\tstatus\tbackend\tflags\tdetail" or "P\tphase"; returns true for an R line.
bool parse_line(const std::string& line, Outcome& o, std::string& phase) {
  if (line.rfind("P\t", 0) == 0) {
    phase = line.substr(2);
    return false;
  }
  if (line.rfind("R\t", 0) != 0) return false;
  size_t a = line.find('\t', 2), b = a == std::string::npos ? a : line.find('\t', a + 1);
  size_t c = b == std::string::npos ? b : line.find('\t', b + 1);
  if (c == std::string::npos) return false;
  parse_status(line.substr(2, a - 2), o.status);
  o.backend = line.substr(a + 1, b - a - 1);
  o.tma_store = line.substr(b + 1, c - b - 1) == "tma_store";
  o.detail = line.substr(c + 1);
  o.phase = phase;
  return true;
}

std::string death(int wstatus) {
  if (WIFSIGNALED(wstatus)) return fmt::format("killed by signal {} ({})", WTERMSIG(wstatus), strsignal(WTERMSIG(wstatus)));
  if (WIFEXITED(wstatus)) return fmt::format("exited with status {} without a result", WEXITSTATUS(wstatus));
  return "ended without a result";
}

struct Worker {
  pid_t pid = -1;
  int to = -1, from = -1;
  bool busy = false;
  uint64_t seed = 0;
  Clock::time_point started;
  std::string buffer, phase;
};

[[noreturn]] void worker_main(int in, int out, const PoolOptions& o) {
  for (;;) {
    uint64_t seed = 0;
    size_t got = 0;
    while (got < sizeof seed) {
      ssize_t n = ::read(in, reinterpret_cast<char*>(&seed) + got, sizeof seed - got);
      if (n <= 0) _exit(0);
      got += static_cast<size_t>(n);
    }
    auto progress = [&](const std::string& s) { write_all(out, "P\t" + s + "\n"); };
    Outcome r;
    progress("generate");
    try {
      Program p = generate(seed, o.gen);
      r = evaluate(p, o.eval, progress);
    } catch (const std::exception& e) {
      r.status = Status::GeneratorError;
      r.detail = fmt::format("generate: {}", e.what());
    }
    report(out, r);
    if (r.status == Status::Fault) _exit(0);  // the CUDA context is lost: start afresh
  }
}

Worker spawn(const PoolOptions& o) {
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) throw std::runtime_error("fuzz: pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fuzz: fork failed");
  if (pid == 0) {
    ::close(down[1]);
    ::close(up[0]);
    worker_main(down[0], up[1], o);
  }
  ::close(down[0]);
  ::close(up[1]);
  Worker w;
  w.pid = pid;
  w.to = down[1];
  w.from = up[0];
  return w;
}

void retire(Worker& w, bool kill) {
  if (w.to >= 0) ::close(w.to);
  if (kill) ::kill(w.pid, SIGKILL);
  ::close(w.from);
  w.to = w.from = -1;
}

}  // namespace

void run_seeds(const PoolOptions& o, uint64_t first, uint64_t last, double time_limit_s,
               const std::function<void(const SeedResult&)>& on_result) {
  ::signal(SIGPIPE, SIG_IGN);
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  uint64_t next = first;
  auto more = [&] { return next < last && (time_limit_s <= 0 || elapsed() < time_limit_s); };
  std::vector<Worker> ws;
  for (int i = 0; i < o.jobs && more(); ++i) ws.push_back(spawn(o));
  auto assign = [&](Worker& w) {
    if (!more()) {
      if (w.to >= 0) ::close(w.to);
      w.to = -1;
      return;
    }
    w.seed = next++;
    w.busy = true;
    w.started = Clock::now();
    w.phase = "sent";
    write_all(w.to, std::string(reinterpret_cast<const char*>(&w.seed), sizeof w.seed));
  };
  for (auto& w : ws) assign(w);
  while (true) {
    std::vector<pollfd> fds;
    std::vector<size_t> idx;
    for (size_t i = 0; i < ws.size(); ++i)
      if (ws[i].from >= 0) {
        fds.push_back({ws[i].from, POLLIN, 0});
        idx.push_back(i);
      }
    if (fds.empty()) break;
    ::poll(fds.data(), fds.size(), 500);
    for (size_t k = 0; k < fds.size(); ++k) {
      Worker& w = ws[idx[k]];
      bool dead = false;
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[4096];
        ssize_t n = ::read(w.from, buf, sizeof buf);
        if (n <= 0) dead = true;
        else w.buffer.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = w.buffer.find('\n')) != std::string::npos) {
          std::string line = w.buffer.substr(0, nl);
          w.buffer.erase(0, nl + 1);
          Outcome r;
          if (parse_line(line, r, w.phase) && w.busy) {
            w.busy = false;
            on_result({w.seed, r});
            if (r.status != Status::Fault) assign(w);
          }
        }
      }
      const bool late = w.busy && std::chrono::duration<double>(Clock::now() - w.started).count() > o.timeout_s;
      if (!dead && !late) continue;
      retire(w, late);
      int st = 0;
      ::waitpid(w.pid, &st, 0);
      if (w.busy) {
        Outcome r;
        r.status = late ? Status::Hang : Status::Crash;
        r.phase = w.phase;
        r.detail = late ? fmt::format("no result after {} s (while: {})", o.timeout_s, w.phase)
                        : fmt::format("{} (while: {})", death(st), w.phase);
        w.busy = false;
        on_result({w.seed, r});
      }
      if (more()) {
        w = spawn(o);
        assign(w);
      }
    }
  }
  for (auto& w : ws)
    if (w.pid > 0) ::waitpid(w.pid, nullptr, WNOHANG);
}

Outcome run_isolated(Program& p, const EvalOptions& eval, double timeout_s) {
  int up[2];
  if (::pipe(up) != 0) throw std::runtime_error("fuzz: pipe failed");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(up[0]);
    Outcome r;
    try {
      r = evaluate(p, eval, [&](const std::string& s) { write_all(up[1], "P\t" + s + "\n"); });
    } catch (const std::exception& e) {
      r.status = Status::GeneratorError;
      r.detail = e.what();
    }
    report(up[1], r);
    _exit(0);
  }
  ::close(up[1]);
  const auto t0 = Clock::now();
  std::string buffer, phase;
  Outcome r;
  bool have = false, late = false;
  while (!have) {
    pollfd fd{up[0], POLLIN, 0};
    ::poll(&fd, 1, 200);
    if (fd.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      ssize_t n = ::read(up[0], buf, sizeof buf);
      if (n <= 0) break;
      buffer.append(buf, static_cast<size_t>(n));
      size_t nl;
      while (!have && (nl = buffer.find('\n')) != std::string::npos) {
        have = parse_line(buffer.substr(0, nl), r, phase);
        buffer.erase(0, nl + 1);
      }
    }
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
      late = true;
      ::kill(pid, SIGKILL);
      break;
    }
  }
  ::close(up[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!have) {
    r.status = late ? Status::Hang : Status::Crash;
    r.phase = phase;
    r.detail = late ? fmt::format("no result after {} s (while: {})", timeout_s, phase) : fmt::format("{} (while: {})", death(st), phase);
  }
  return r;
}

}  // namespace tilejit::fuzz
