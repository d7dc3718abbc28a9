// A watchdog for multi-GPU tests: aborts the process if the guarded scope has not finished by the
// deadline. A rank waiting for a peer that never comes blocks forever, and failing with the test's
// name beats a CI job's silent timeout.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace testing {

class HangGuard {
 public:
  HangGuard(std::string what, std::chrono::seconds deadline) : what_(std::move(what)) {
    thread_ = std::thread([this, deadline] {
      std::unique_lock lock(mutex_);
      if (!cv_.wait_for(lock, deadline, [this] { return done_; })) {
        std::fprintf(stderr, "HANG: %s did not finish within %lld s; aborting\n", what_.c_str(),
                     static_cast<long long>(deadline.count()));
        std::abort();
      }
    });
  }
  ~HangGuard() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  HangGuard(const HangGuard&) = delete;
  HangGuard& operator=(const HangGuard&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace testing
