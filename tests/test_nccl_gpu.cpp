// NCCL communicators on 2 or more GPUs (runtime/nccl.hpp; ctest labels gpu, multi_gpu): one thread
// and communicator per GPU, all from one UniqueId. A ring exchange in a Group (both directions at
// once), all-gather, reduce-scatter and all-reduce (sum, max; i32 and i64 exact, f32 against a
// float64 sum), broadcast, wrap() of a live handle, abort(). Every buffer holds seeded, non-zero,
// per-rank data and every output starts poisoned (0xFF), so a transfer that did not happen shows.
// A watchdog aborts a test that hangs and says which. Skips visibly with fewer than two GPUs or
// without NCCL.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/nccl.hpp"
#include "hang_guard.hpp"

namespace rt = tilejit::runtime;
namespace nccl = tilejit::runtime::nccl;
using nccl::Communicator;
using nccl::DataType;
using nccl::ReduceOp;
using rt::DeviceBuffer;

using testing::HangGuard;

namespace {

constexpr std::chrono::seconds kDeadline{60};

// False, with a visible message, without 2 GPUs and NCCL: the test then passes as skipped.
bool ready() {
  rt::Driver& d = rt::Driver::get();
  if (!d.available()) {
    MESSAGE("SKIPPED: no GPU: " << d.unavailable_reason());
    return false;
  }
  if (d.device_count() < 2) {
    MESSAGE("SKIPPED: 2 GPUs needed, " << d.device_count() << " found");
    return false;
  }
  if (!nccl::available()) {
    MESSAGE("SKIPPED: NCCL: " << nccl::unavailable_reason());
    return false;
  }
  setenv("NCCL_DEBUG", "WARN", 0);  // NCCL's own reason next to ours when something fails
  return true;
}

int world_size() { return rt::Driver::get().device_count(); }

struct Rank {
  Communicator& comm;
  rt::Stream& stream;
  int r, world;
  CUstream s() const { return stream.handle(); }
};

// One thread per GPU, each with its communicator (from one UniqueId) and a stream; every rank's
// exception becomes a failure naming the rank.
void run_ranks(const std::function<void(Rank&)>& body) {
  const int world = world_size();
  const nccl::UniqueId id = nccl::make_unique_id();
  std::mutex m;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm = Communicator::create(id, r, world, r);
        rt::Stream stream(r);
        Rank rank{comm, stream, r, world};
        body(rank);
        stream.synchronize();
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        errors.push_back(fmt::format("rank {}: {}", r, e.what()));
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) FAIL(e);
}

// Seeded, non-zero, distinct per (test, rank) values. Integers stay small enough that a sum over
// the ranks is exact in every type used (f32 included, for the exact f32 checks).
template <class T>
std::vector<T> seeded(size_t n, uint32_t test, int rank, int lo = 1, int hi = 1000) {
  std::mt19937 rng(test * 7919u + static_cast<uint32_t>(rank) * 104729u + 1u);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

std::vector<float> seeded_floats(size_t n, uint32_t test, int rank) {
  std::mt19937 rng(test * 7919u + static_cast<uint32_t>(rank) * 104729u + 1u);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    const float f = dist(rng);
    x = f == 0.0f ? 0.5f : f;  // non-zero
  }
  return v;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& host, int device) {
  DeviceBuffer b(host.size() * sizeof(T), device);
  b.upload(host.data(), b.bytes());
  return b;
}

DeviceBuffer poisoned(size_t bytes, int device) {
  DeviceBuffer b(bytes, device);
  b.fill_bytes(0xFF);
  return b;
}

template <class T>
std::vector<T> download(const DeviceBuffer& b) {
  std::vector<T> v(b.bytes() / sizeof(T));
  b.download(v.data(), b.bytes());
  return v;
}

// The first differing index, for a readable failure; -1 when equal.
template <class T>
long first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

}  // namespace

TEST_CASE("nccl/gpu: ring exchange in a Group, both directions at once") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: ring exchange", kDeadline);
  constexpr size_t n = (1u << 20) + 3;  // 4 MiB of i32 and an odd tail
  run_ranks([&](Rank& k) {
    const int next = (k.r + 1) % k.world, prev = (k.r + k.world - 1) % k.world;
    DeviceBuffer out = upload(seeded<int32_t>(n, 1, k.r, -1000000, 1000000), k.r);
    DeviceBuffer from_prev = poisoned(n * 4, k.r), from_next = poisoned(n * 4, k.r);
    nccl::Group group;  // every rank sends before it receives: only a group makes that safe
    k.comm.send(out.ptr(), n, DataType::i32, next, k.s());
    k.comm.send(out.ptr(), n, DataType::i32, prev, k.s());
    k.comm.recv(from_prev.ptr(), n, DataType::i32, prev, k.s());
    k.comm.recv(from_next.ptr(), n, DataType::i32, next, k.s());
    group.end();
    k.stream.synchronize();
    const long dp = first_difference(download<int32_t>(from_prev), seeded<int32_t>(n, 1, prev, -1000000, 1000000));
    const long dn = first_difference(download<int32_t>(from_next), seeded<int32_t>(n, 1, next, -1000000, 1000000));
    if (dp >= 0 || dn >= 0)
      throw std::runtime_error(fmt::format("received data differs from the sender's (index {} from prev, {} from next)", dp, dn));
  });
}

TEST_CASE("nccl/gpu: bf16 point to point is a bit-exact copy") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: bf16 point to point", kDeadline);
  constexpr size_t n = 4099;
  run_ranks([&](Rank& k) {
    const int next = (k.r + 1) % k.world, prev = (k.r + k.world - 1) % k.world;
    // arbitrary bit patterns (NaNs included): NCCL must move them untouched
    DeviceBuffer out = upload(seeded<uint16_t>(n, 2, k.r, 1, 65535), k.r), in = poisoned(n * 2, k.r);
    nccl::Group group;
    k.comm.send(out.ptr(), n, DataType::bf16, next, k.s());
    k.comm.recv(in.ptr(), n, DataType::bf16, prev, k.s());
    group.end();
    k.stream.synchronize();
    const long d = first_difference(download<uint16_t>(in), seeded<uint16_t>(n, 2, prev, 1, 65535));
    if (d >= 0) throw std::runtime_error(fmt::format("bf16 bits differ at index {}", d));
  });
}

TEST_CASE("nccl/gpu: all_gather puts rank r's block at r * count") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: all_gather", kDeadline);
  constexpr size_t n = 100003;
  run_ranks([&](Rank& k) {
    DeviceBuffer mine = upload(seeded<int64_t>(n, 3, k.r, -1000000000, 1000000000), k.r);
    DeviceBuffer all = poisoned(n * 8 * static_cast<size_t>(k.world), k.r);
    k.comm.all_gather(mine.ptr(), all.ptr(), n, DataType::i64, k.s());
    k.stream.synchronize();
    std::vector<int64_t> want;
    for (int p = 0; p < k.world; ++p) {
      const std::vector<int64_t> block = seeded<int64_t>(n, 3, p, -1000000000, 1000000000);
      want.insert(want.end(), block.begin(), block.end());
    }
    const long d = first_difference(download<int64_t>(all), want);
    if (d >= 0) throw std::runtime_error(fmt::format("all_gather differs at index {} (block {})", d, d / static_cast<long>(n)));
  });
}

TEST_CASE("nccl/gpu: reduce_scatter sums block r into rank r (i32 and integral f32 exact)") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: reduce_scatter", kDeadline);
  constexpr size_t n = 65537;  // per rank
  run_ranks([&](Rank& k) {
    const size_t total = n * static_cast<size_t>(k.world);
    DeviceBuffer si = upload(seeded<int32_t>(total, 4, k.r, -1000, 1000), k.r), ri = poisoned(n * 4, k.r);
    DeviceBuffer sf = upload(seeded<float>(total, 5, k.r, -1000, 1000), k.r), rf = poisoned(n * 4, k.r);
    k.comm.reduce_scatter(si.ptr(), ri.ptr(), n, DataType::i32, ReduceOp::sum, k.s());
    k.comm.reduce_scatter(sf.ptr(), rf.ptr(), n, DataType::f32, ReduceOp::sum, k.s());
    k.stream.synchronize();
    std::vector<int32_t> want_i(n, 0);
    std::vector<float> want_f(n, 0.0f);  // integers below 2^24: every order of the sum is exact
    for (int p = 0; p < k.world; ++p) {
      const std::vector<int32_t> vi = seeded<int32_t>(total, 4, p, -1000, 1000);
      const std::vector<float> vf = seeded<float>(total, 5, p, -1000, 1000);
      for (size_t i = 0; i < n; ++i) {
        want_i[i] += vi[static_cast<size_t>(k.r) * n + i];
        want_f[i] += vf[static_cast<size_t>(k.r) * n + i];
      }
    }
    const long di = first_difference(download<int32_t>(ri), want_i), df = first_difference(download<float>(rf), want_f);
    if (di >= 0 || df >= 0) throw std::runtime_error(fmt::format("reduce_scatter differs (i32 at {}, f32 at {})", di, df));
  });
}

TEST_CASE("nccl/gpu: all_reduce: f32 sum against float64, i32 max, in place") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: all_reduce", kDeadline);
  constexpr size_t n = 262147;
  run_ranks([&](Rank& k) {
    DeviceBuffer sf = upload(seeded_floats(n, 6, k.r), k.r), rf = poisoned(n * 4, k.r);
    DeviceBuffer inplace = upload(seeded<int32_t>(n, 7, k.r, -1000000, 1000000), k.r);
    k.comm.all_reduce(sf.ptr(), rf.ptr(), n, DataType::f32, ReduceOp::sum, k.s());
    k.comm.all_reduce(inplace.ptr(), inplace.ptr(), n, DataType::i32, ReduceOp::max, k.s());
    k.stream.synchronize();
    std::vector<double> sum(n, 0.0);
    std::vector<int32_t> max(n, INT32_MIN);
    for (int p = 0; p < k.world; ++p) {
      const std::vector<float> vf = seeded_floats(n, 6, p);
      const std::vector<int32_t> vi = seeded<int32_t>(n, 7, p, -1000000, 1000000);
      for (size_t i = 0; i < n; ++i) {
        sum[i] += vf[i];
        max[i] = std::max(max[i], vi[i]);
      }
    }
    const std::vector<float> got = download<float>(rf);
    double worst = 0;  // f32 rounding of up to world - 1 additions of values below 2 * world
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(static_cast<double>(got[i]) - sum[i]));
    const double bound = 4.0 * k.world * k.world * 6e-8;
    const long dm = first_difference(download<int32_t>(inplace), max);
    if (!(worst <= bound) || dm >= 0)
      throw std::runtime_error(fmt::format("all_reduce: f32 sum off by {} (bound {}), i32 max differs at {}", worst, bound, dm));
  });
}

TEST_CASE("nccl/gpu: broadcast from the last rank") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: broadcast", kDeadline);
  constexpr size_t n = 33333;
  run_ranks([&](Rank& k) {
    const int root = k.world - 1;
    DeviceBuffer src = upload(seeded<uint32_t>(n, 8, k.r, 1, 1 << 30), k.r), dst = poisoned(n * 4, k.r);
    k.comm.broadcast(src.ptr(), dst.ptr(), n, DataType::u32, root, k.s());
    k.stream.synchronize();
    const long d = first_difference(download<uint32_t>(dst), seeded<uint32_t>(n, 8, root, 1, 1 << 30));
    if (d >= 0) throw std::runtime_error(fmt::format("broadcast differs from the root's data at index {}", d));
  });
}

TEST_CASE("nccl/gpu: wrap() reads rank, size and device; abort() ends a communicator") {
  if (!ready()) return;
  HangGuard guard("nccl/gpu: wrap and abort", kDeadline);
  run_ranks([&](Rank& k) {
    {
      Communicator view = Communicator::wrap(k.comm.handle());
      if (view.rank() != k.r || view.world() != k.world || view.device() != k.r || view.owned())
        throw std::runtime_error(fmt::format("wrap() saw rank {} of {} on device {}", view.rank(), view.world(), view.device()));
    }  // not owned: the communicator lives on
    DeviceBuffer one = upload(seeded<int32_t>(1, 9, k.r), k.r), sum = poisoned(4, k.r);
    k.comm.all_reduce(one.ptr(), sum.ptr(), 1, DataType::i32, ReduceOp::sum, k.s());
    k.stream.synchronize();
    k.comm.check_async_error();
    int32_t want = 0;
    for (int p = 0; p < k.world; ++p) want += seeded<int32_t>(1, 9, p)[0];
    if (download<int32_t>(sum)[0] != want) throw std::runtime_error("all_reduce through the wrapped communicator's owner differs");
    k.comm.abort();
    if (k.comm.handle() != nullptr) throw std::runtime_error("abort() left a handle");
    bool refused = false;
    try {
      k.comm.send(one.ptr(), 1, DataType::i32, 0, k.s());
    } catch (const std::logic_error&) {
      refused = true;
    }
    if (!refused) throw std::runtime_error("send after abort() was not refused");
  });
}
