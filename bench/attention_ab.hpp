// attention_bench's measuring harness, shared by its modes (bench/attention.cpp and the files
// beside it): the grid's shapes, timing with CUDA events, A/B rounds, the device buffers.
#pragma once
#include <algorithm>
#include <memory>
#include <array>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <vector>

#include "api/attention.hpp"
#include "kernels/meta_names.hpp"
#include "bench/bench_util.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/function.hpp"

namespace tilejit::attention_bench {

namespace mn = kernels::meta_name;
using bench_util::add_dropout_key;
using bench_util::median;
using bench_util::no_rng_state;
using bench_util::parse_with;
using bench_util::random_buffer;
using runtime::DeviceBuffer;

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

constexpr int64_t kTokens = 16384, kHidden = 2048;  // B * S and H * D of the grid

struct Config {
  int64_t S, D;
  bool causal;
  int64_t heads = 0;  // 0: kHidden / D (else fewer heads than the grid's: B * S * heads * D <= the buffers)
  int64_t B() const { return kTokens / S; }
  int64_t H() const { return heads ? heads : kHidden / D; }
  double fwd_flops() const { return 4.0 * static_cast<double>(B() * H()) * double(S) * double(S) * double(D) / (causal ? 2 : 1); }
};

// Times `fn` on `stream`: one warm-up call (compiles on the first config), then repeats until
// ~0.3 s or `max_reps`, each between its own pair of events; returns the median in ms.
template <class F>
double time_ms(F&& fn, const runtime::Stream& stream, int max_reps) {
  fn();
  stream.synchronize();
  runtime::Event a, b;
  a.record(stream);
  fn();
  b.record(stream);
  b.synchronize();
  const double first = b.elapsed_ms(a);
  const int reps = std::clamp(static_cast<int>(300.0 / std::max(first, 1e-3)), 3, max_reps);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    a.record(stream);
    fn();
    b.record(stream);
    b.synchronize();
    ms.push_back(b.elapsed_ms(a));
  }
  return median(ms);
}

// Times `fn` as a training step runs it: calls queued back to back between one pair of events (as
// many as fill ~5 ms, 3 to 64), the per-call mean of each of 7 batches, their median, after the
// calls ran back to back for kSettleMs. time_ms's synchronisation after every call puts the host's
// own work (checks, planning, the launch; for SDPA, Python) between the events and lets the GPU
// idle: at S 1k it moved SDPA's forward 15% (bench/timing_methods.py). The settling: under
// attention the H200 reaches its 700 W cap and its SM clock falls from 1,980 to ~1,650-1,800 MHz
// within ~200 ms (bench/power_probe.py), so a burst after a pause runs up to 15% faster than the
// same kernel sustained (decision 099). bench/attention.py's table times both sides this way.
inline constexpr double kSettleMs = 500;
// Runs `fn` back to back for kSettleMs (batches of ~50 ms), so that what is timed next runs at the
// clock the power cap allows; returns one call's time in ms (the first batch's call).
template <class F>
double settle(F&& fn, const runtime::Stream& stream) {
  fn();
  stream.synchronize();
  runtime::Event a, b;
  a.record(stream);
  fn();
  b.record(stream);
  b.synchronize();
  const double one = std::max<double>(b.elapsed_ms(a), 1e-3);
  for (double settled = 0; settled < kSettleMs;) {
    const int n = std::clamp(static_cast<int>(50.0 / one) + 1, 1, 4096);
    a.record(stream);
    for (int i = 0; i < n; ++i) fn();
    b.record(stream);
    b.synchronize();
    settled += b.elapsed_ms(a);
  }
  return one;
}
template <class F>
double queued_ms(F&& fn, const runtime::Stream& stream) {
  const int calls = std::clamp(static_cast<int>(5.0 / settle(fn, stream)) + 1, 3, 64);
  runtime::Event a, b;
  std::vector<double> ms;
  for (int batch = 0; batch < 7; ++batch) {
    a.record(stream);
    for (int i = 0; i < calls; ++i) fn();
    b.record(stream);
    b.synchronize();
    ms.push_back(b.elapsed_ms(a) / calls);
  }
  return median(ms);
}

// The rounds of an A/B: six, the variants' order swapped every round. (Three rounds in a fixed
// order measured two identical kernels -- the same PTX -- at 0.91-1.00x of each other: clock drift
// over seconds favours whichever runs first.)
template <class F>
void ab_rounds(F&& measure) {
  for (int round = 0; round < 6; ++round)
    for (int i : {0, 1}) measure(round % 2 == 0 ? i : 1 - i);
}

// An A/B of two variants on the same arguments: each launched once, the first `bytes` of each of
// `outputs` read back and compared, then both timed in ab_rounds (medians). `launch[i]` queues
// variant i on the stream (any kernel object: a Function, a bundle's GpuKernel, an API call).
// (before_launch: work queued on the stream before every launch, timed too, e.g. zeroing the
// ordered reduction's semaphores: it adds the same time to both variants)
struct AbResult {
  double off_ms = 0, on_ms = 0;
  bool identical = false;
};
AbResult ab_measure_launches(const std::array<std::function<void()>, 2>& launch, const runtime::Stream& stream,
                             std::initializer_list<const DeviceBuffer*> outputs, size_t bytes, int max_reps,
                             const std::function<void()>& before_launch = {});
// Two Functions, each on its own grid (variants with other tiles).
AbResult ab_measure_grids(std::vector<Function>& fns, const std::array<runtime::Grid, 2>& grids, const runtime::Stream& stream,
                          const std::vector<runtime::DeviceArg>& args, std::initializer_list<const DeviceBuffer*> outputs, size_t bytes,
                          int max_reps, const std::function<void()>& before_launch = {});
AbResult ab_measure(std::vector<Function>& fns, const runtime::Grid& grid, const runtime::Stream& stream,
                    const std::vector<runtime::DeviceArg>& args, std::initializer_list<const DeviceBuffer*> outputs, size_t bytes,
                    int max_reps);

// A bool meta of a compiled variant (false when the kernel was built without it: its default).
inline bool meta_flag(const Function& fn, const char* name) {
  for (const auto& [n, value] : fn.meta())
    if (n == name) return std::get<bool>(value);
  return false;
}

// Mask words for a kernel A/B: their memory and the tensor whose sizes an argument's view points
// into (both must outlive the launches: a DeviceArg of a temporary Tensor read freed sizes).
struct MaskWords {
  DeviceBuffer buffer;
  attention::Tensor tensor;
};
// DROPOUT_BITS (or DROPOUT_WRITE_BITS) in a kernel A/B: packed mask words for configuration c --
// random (timing only: about half the elements kept) or, `random` false, uninitialised (written) --
// appended to args as the u32 [B * H, S, cdiv(S, 32)] mask (key_major: with strides [W * S, 1, S], as
// the API lays out the words dK/dV stores for dQ: DROPOUT_WORDS_KEY_MAJOR). Without `bits` nothing is appended.
inline std::unique_ptr<MaskWords> add_random_mask_words(std::vector<runtime::DeviceArg>& args, const Config& c, bool bits,
                                                        bool random = true, bool key_major = false) {
  const int64_t words = (c.S + 31) / 32;
  const size_t bytes = bits ? static_cast<size_t>(c.B() * c.H() * c.S * words) * 4 : 16;
  auto w = std::make_unique<MaskWords>(MaskWords{random ? bench_util::random_buffer(bytes, ir::DType::bf16, 17) : DeviceBuffer(bytes), {}});
  w->tensor = key_major ? attention::strided(w->buffer.ptr(), ir::DType::u32, {c.B() * c.H(), c.S, words}, {words * c.S, 1, c.S})
                        : attention::contiguous(w->buffer.ptr(), ir::DType::u32, {c.B() * c.H(), c.S, words});
  if (bits) args.emplace_back(w->tensor.view());
  return w;
}

// Device buffers of the largest tensors of the grid (B * S = 16k tokens, H * D = 2048) and the
// [B, S, H, D] views of one configuration on them.
struct Buffers {
  static constexpr size_t bytes = static_cast<size_t>(kTokens * kHidden * 2);
  static constexpr size_t lse_bytes = static_cast<size_t>(kTokens * (kHidden / 64)) * 4;  // B * H * S for the smallest D
  ir::DType dt;  // bf16 or f16 (16-bit elements: the sizes above hold either)
  DeviceBuffer q, k, v, dout;
  // the backward's workspace for the default options: Delta, and where the default reduction is
  // ordered (D 128 from S 4k, decision 075) its f32 dQ accumulator and semaphores, or with fused
  // dropout the mask's words (decision 097; up to S 4k at D 64: B * H * S * S / 8 bytes)
  static constexpr size_t ws_bytes = 2 * lse_bytes + std::max(static_cast<size_t>(kTokens * kHidden) * 4,
                                                              static_cast<size_t>(kTokens * (kHidden / 64)) * 4096 / 8) + 1024;
  DeviceBuffer o{bytes}, dq{bytes}, dk{bytes}, dv{bytes}, lse{lse_bytes}, ws{ws_bytes};
  explicit Buffers(ir::DType dtype = ir::DType::bf16)
      : dt(dtype), q(bench_util::random_buffer(bytes, dtype, 1)), k(bench_util::random_buffer(bytes, dtype, 2)), v(bench_util::random_buffer(bytes, dtype, 3)),
        dout(bench_util::random_buffer(bytes, dtype, 4)) {}

  struct Views {
    attention::Tensor Q, K, V, O, dO, dQ, dK, dV, L;
  };
  // kv_heads: the K / V heads (grouped-query attention), 0 = as many as Q's
  Views views(const Config& c, int64_t kv_heads = 0) const {
    using attention::contiguous;
    const int64_t B = c.B(), S = c.S, H = c.H(), D = c.D, Hkv = kv_heads ? kv_heads : H;
    auto t = [&](const DeviceBuffer& b, int64_t heads) { return contiguous(b.ptr(), dt, {B, S, heads, D}); };
    return {t(q, H), t(k, Hkv), t(v, Hkv), t(o, H), t(dout, H), t(dq, H), t(dk, Hkv), t(dv, Hkv),
            contiguous(lse.ptr(), ir::DType::f32, {B, H, S})};
  }
};

// What a backward kernel alone reads besides Q, K, V, dO: the forward's O and LSE (into buf) and
// Delta = rowsum(dO * O) from the preprocess kernel, f32 [B, H, S] (returned).
struct DeltaBuffer {
  DeviceBuffer buffer;
  attention::Tensor view;  // f32 [B, H, S] on `buffer`
};
// kv_heads: K and V with that many heads (GQA; 0: H).
DeltaBuffer forward_and_delta(const Buffers& buf, const Config& c, const runtime::Stream& stream, int64_t kv_heads = 0);

}  // namespace tilejit::attention_bench
