// attention_bench --timing-ab: the same API calls timed three ways in alternated rounds of one
// process, to tell the timing method's share of a figure from the kernels':
//   queued   calls back to back between one pair of events (the table's method, queued_ms)
//   synced   one call between events, then a synchronisation (the older tables, time_ms)
//   flushed  the tuner's method (runtime/gpu_bench.cpp): a 256 MB memset (L2 flush) queued before
//            every call, events around the call alone, the median call
// and the forward queued with Options::persistent = false (a grid of tiles), and its kernel launched
// as a Function of the library kernel (--forward-variants' way), without and with launch-time
// specialisation.
// TIMING_AB kernel=fwd|bwd D=.. S=.. causal=.. queued_ms=.. synced_ms=.. flushed_ms=.. (and TFLOP/s)
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/attention_ab.hpp"
#include "jit/compile.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention_bench {

namespace {

template <class F>
double flushed_ms(F&& fn, const runtime::Stream& stream, const DeviceBuffer& flush) {
  const auto& api = runtime::Driver::get().api();
  fn();
  stream.synchronize();
  constexpr int kReps = 15;
  std::vector<runtime::Event> a(kReps), b(kReps);
  for (int i = 0; i < kReps; ++i) {
    runtime::check_cu(api.MemsetD8Async(flush.ptr(), 0, flush.bytes(), stream.handle()), "cuMemsetD8Async (L2 flush)");
    a[static_cast<size_t>(i)].record(stream);
    fn();
    b[static_cast<size_t>(i)].record(stream);
  }
  stream.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < kReps; ++i) ms.push_back(b[static_cast<size_t>(i)].elapsed_ms(a[static_cast<size_t>(i)]));
  return median(ms);
}

}  // namespace

int bench_timing_ab(int max_reps) {
  const Buffers buf;
  const DeviceBuffer flush(size_t{256} << 20);
  runtime::Stream stream;
  const std::vector<Config> configs = {{1024, 128, false}, {4096, 128, false}, {4096, 128, true}, {4096, 64, false}, {4096, 64, true}};
  for (const Config& c : configs) attention::prepare(ir::DType::bf16, static_cast<int>(c.D), c.causal, false, true);
  for (const Config& c : configs) {
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c, 0);
    attention::Options opts;
    opts.causal = c.causal;
    attention::Options grid_per_tile = opts;  // the forward on a grid of tiles (not persistent), queued
    grid_per_tile.persistent = false;
    const auto fwd = [&] { attention::forward(Q, K, V, O, L, opts, stream.handle()); };
    const auto fwd_tiles = [&] { attention::forward(Q, K, V, O, L, grid_per_tile, stream.handle()); };
    // the same kernel launched as --forward-variants does (a Function of the library kernel, a grid
    // of tiles), with and without launch-time specialisation
    namespace mn = kernels::meta_name;
    const lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, c.D},       {mn::kBlockM, 128},          {mn::kBlockN, 128},
                          {mn::kBshd, true},            {mn::kCausal, c.causal}, {mn::kDropout, false},       {mn::kExactNormalize, false},
                          {mn::kPositiveScale, true}};
    std::unique_ptr<Function> direct[2];
    for (int sp = 0; sp < 2; ++sp) {
      jit::CompileOptions o;
      o.num_warps = 8;
      o.pipeline.stages = 2;
      o.min_programs_per_sm = c.D == 64 ? 2 : 0;
      o.specialize = sp == 1;
      direct[sp] = std::make_unique<Function>(kernels::attention_forward(), meta, o);
    }
    const std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(double(c.D)))};
    const runtime::Grid grid{lang::cdiv(c.S, 128), c.H(), c.B()};
    const auto bwd = [&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), {buf.ws.ptr(), buf.ws.bytes()}); };
    for (int kernel = 0; kernel < 2; ++kernel) {
      std::vector<double> t[6];
      const auto run = [&](auto&& fn) {
        bench_util::rotated_rounds(6, kernel ? 3 : 6, [&](int v) {
          t[v].push_back(v == 0   ? queued_ms(fn, stream)
                         : v == 1 ? time_ms(fn, stream, max_reps)
                         : v == 2 ? flushed_ms(fn, stream, flush)
                         : v == 3 ? queued_ms(fwd_tiles, stream)
                                  : queued_ms([&] { direct[v - 4]->launch(grid, stream.handle(), args); }, stream));
        });
      };
      if (kernel == 0) run(fwd);
      else run(bwd);
      const double f = c.fwd_flops() * (kernel ? 2.5 : 1.0), q = median(t[0]), s = median(t[1]), fl = median(t[2]);
      std::printf("TIMING_AB kernel=%s D=%ld S=%ld causal=%d queued_ms=%.4f synced_ms=%.4f flushed_ms=%.4f queued_tflops=%.1f "
                  "synced_tflops=%.1f flushed_tflops=%.1f",
                  kernel ? "bwd" : "fwd", static_cast<long>(c.D), static_cast<long>(c.S), c.causal ? 1 : 0, q, s, fl, f / q / 1e9, f / s / 1e9,
                  f / fl / 1e9);
      if (!kernel)
        std::printf(" not_persistent_queued_ms=%.4f direct_queued_ms=%.4f direct_specialised_queued_ms=%.4f", median(t[3]), median(t[4]),
                    median(t[5]));
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace tilejit::attention_bench
