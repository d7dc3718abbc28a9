// attention_bench --deterministic: the backward per dQ reduction on the grid.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "api/attention.hpp"
#include "jit/compile.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "bench/bench_util.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"

namespace tilejit::attention_bench {

namespace {
namespace mn = tilejit::kernels::meta_name;
}  // namespace

// --deterministic: the backward with each dQ reduction (attention::Options::dq_reduction:
// recompute, atomic, split, ordered; causal also ordered with q_descending) through the API on the
// grid (D 64/128, S 1k-16k, full and causal), 3 rounds in rotated order, each timing queued and
// settled (queued_ms), the median of each mode's rounds; every mode at its default schedule, with a caller workspace (Delta and the reduction's
// buffers; the API zeroes atomic's dQ_accum and ordered's semaphores inside the timed call).
// Split is skipped where its dQ_parts would exceed 16 GB (S >= 8k at these shapes).
int bench_deterministic(int64_t only_d, int64_t only_s, std::optional<attention::Schedule> recompute_schedule,
                        const std::string& only_mode, int only_causal) {
  using attention::DqReduction;
  const ir::DType dt = ir::DType::bf16;
  struct Mode {
    const char* key;
    DqReduction reduction;
    bool descending;
  };
  const Mode modes[] = {{"recompute", DqReduction::recompute, false},
                        {"atomic", DqReduction::atomic, false},
                        {"split", DqReduction::split, false},
                        {"ordered", DqReduction::ordered, false},
                        {"ordered_desc", DqReduction::ordered, true}};
  constexpr size_t kModes = std::size(modes);
  constexpr double kSplitLimit = 16e9;  // bytes of workspace
  for (const Mode& m : modes)
    if (!attention::dq_reduction_supported(m.reduction)) {
      std::fprintf(stderr, "bench/attention --deterministic: this build's backward does not take dq_reduction = %s\n",
                   attention::name(m.reduction));
      return 2;
    }
  std::vector<Config> configs;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true})
      for (int64_t S : {1024, 2048, 4096, 8192, 16384})
        if ((!only_d || D == only_d) && (!only_s || S == only_s) && (only_causal < 0 || causal == (only_causal == 1)))
          configs.push_back({S, D, causal});
  const auto options = [&](const Config& c, const Mode& m) {
    attention::Options o;
    o.causal = c.causal;
    o.dq_reduction = m.reduction;
    o.q_descending = m.descending;
    if (m.reduction == DqReduction::recompute) o.schedule = recompute_schedule;  // --schedule (A/Bs)
    return o;
  };
  const auto runs = [](const Config& c, const Mode& m) { return !m.descending || c.causal; };  // descending: causal only
  // Compile every kernel up front, in parallel (JIT and caches need no GPU).
  {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int64_t D : {64, 128})
      for (bool causal : {false, true})
        for (const Mode& m : modes)
          if ((!m.descending || causal) && (!only_d || D == only_d))
            pool.emplace_back([=] { attention::prepare(dt, static_cast<int>(D), causal, false, true, {}, 0, false, m.reduction, m.descending); });
    for (auto& t : pool) t.join();
    std::fprintf(stderr, "compiled in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const Buffers buf;
  // One workspace for the grid: the largest any timed mode needs.
  size_t ws_bytes = 0;
  for (const Config& c : configs) {
    const auto v = buf.views(c);
    for (const Mode& m : modes) {
      const size_t n = attention::backward_workspace_bytes(v.Q, v.K, options(c, m));
      if (runs(c, m) && (m.reduction != DqReduction::split || static_cast<double>(n) <= kSplitLimit)) ws_bytes = std::max(ws_bytes, n);
    }
  }
  const DeviceBuffer ws(ws_bytes);
  std::fprintf(stderr, "workspace %.2f GB\n", static_cast<double>(ws_bytes) / 1e9);
  runtime::Stream stream;
  for (const Config& c : configs) {
    const int64_t B = c.B(), S = c.S, H = c.H(), D = c.D;
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
    std::vector<double> ms[kModes];
    std::string note[kModes];
    try {
      attention::Options fwd;
      fwd.causal = c.causal;
      attention::forward(Q, K, V, O, L, fwd, stream.handle());
      for (size_t i = 0; i < kModes; ++i) {
        const size_t need = attention::backward_workspace_bytes(Q, K, options(c, modes[i]));
        if (!runs(c, modes[i]) || (!only_mode.empty() && only_mode != modes[i].key)) note[i] = "-";
        else if (modes[i].reduction == DqReduction::split && static_cast<double>(need) > kSplitLimit)
          note[i] = fmt::format("skipped(workspace={:.1f}GB>16GB)", static_cast<double>(need) / 1e9);
      }
      // the modes' order rotated every round and each timing settled (queued_ms): a fixed order
      // timed after a pause favoured the first mode by the clock's burst (decision 099)
      bench_util::rotated_rounds(3, static_cast<int>(kModes), [&](int m) {
        const auto i = static_cast<size_t>(m);
        if (!note[i].empty()) return;
        const attention::Options opts = options(c, modes[i]);
        ms[i].push_back(queued_ms([&] {
          attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), {ws.ptr(), ws.bytes()});
        }, stream));
      });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "S=%ld D=%ld causal=%d: %s\n", static_cast<long>(S), static_cast<long>(D), c.causal, e.what());
    }
    const double flops = 2.5 * c.fwd_flops();
    double t[kModes];
    std::string line = fmt::format("DETERMINISTIC dtype=bf16 D={} S={} causal={} B={} H={}", D, S, c.causal ? 1 : 0, B, H);
    for (size_t i = 0; i < kModes; ++i) {
      t[i] = ms[i].empty() ? NAN : median(ms[i]);
      if (!note[i].empty()) line += fmt::format(" {}_ms={}", modes[i].key, note[i]);
      else line += fmt::format(" {}_ms={:.4f} {}_tflops={:.1f}", modes[i].key, t[i], modes[i].key, flops / (t[i] * 1e-3) / 1e12);
    }
    // time ratios (> 1: slower than the second)
    line += fmt::format(" ordered_vs_atomic={:.3f} ordered_vs_recompute={:.3f} atomic_vs_recompute={:.3f} split_vs_atomic={:.3f}",
                        t[3] / t[1], t[3] / t[0], t[1] / t[0], t[2] / t[1]);
    if (c.causal) line += fmt::format(" ordered_desc_vs_ordered={:.3f}", t[4] / t[3]);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tilejit::attention_bench
