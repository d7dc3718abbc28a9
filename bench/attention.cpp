// bench/attention: FlashAttention forward and backward through tilejit::attention (the C++ API a
// framework calls), timed with CUDA events; bench/attention.py runs it next to PyTorch SDPA and
// prints one table. A second mode runs cases written by the script (--check) for its comparison
// against PyTorch's float32 math. This file holds the grid and the forward / dK/dV / meta / tool
// A/Bs and main(); the other modes live in attention_*.cpp (attention_modes.hpp lists them).
//
//   attention_bench [--quick] [--reps N] [--dtype bf16|f16] [--gqa G] [--synced]   one line per config (--gqa:
//     K / V with H / G heads, grouped-query attention; calls queued back to back, --synced: one call
//     between events with a synchronisation after it, the older tables' method):
//     RESULT dtype=bf16 B=4 S=4096 H=16 Hkv=16 D=128 causal=0 fwd_ms=.. fwd_tflops=.. bwd_ms=.. bwd_tflops=..
//   attention_bench --dropout [P]          fused dropout's cost (issue 7): D128 S4k bf16, full and
//     causal, forward and backward with dropout_p = P (default 0.1) against without, alternated:
//     DROPOUT dtype=bf16 B=4 S=4096 H=16 D=128 causal=0 p=0.1 fwd_ms=.. fwd_dropout_ms=.. fwd_slowdown=..
//       bwd_ms=.. bwd_dropout_ms=.. bwd_slowdown=.. bwd_twice_ms=.. (the mask drawn in dK/dV and dQ) bwd_twice_slowdown=..
//     DROPOUT_PHASES causal=0 p=0.1 none_dkdv_ms=.. none_dq_ms=.. once_dkdv_ms=.. once_dq_ms=.. twice_dkdv_ms=..
//       twice_dq_ms=..   (--phases: the backward's two phases, Delta + dK/dV and dQ, each timed alone)
//     (--head-dim D: D 64 or 128 instead of 128; H = 2048 / D)
//     DROPOUT_PRECOMPUTED causal=0 p=0.1 fwd_ms=.. fwd_bits_ms=.. ... mask_kernel_ms=..   (rng = precomputed)
//     GEMM_RNG MASK_BLOCK_M=64 MASK_BLOCK_W=4 MASK_TILES_PER_STEP=2 MASK_WARPS=0 MMA_REGISTERS=0 MASK_REGISTERS=0
//       gemm_ms=.. gemm_rng_ms=.. slowdown=.. bits_identical=1   (the QKV GEMM writing the mask, gemm's
//       DROPOUT_MASK: in its K loop, or with MASK_WARPS on warps of their own beside the GEMM's)
//     E2E causal=0 p=0.1 M=16384 N=6144 K=2048 gemm_ms=.. none_ms=.. fused_ms=.. overlapped_ms=..
//       serial_bits_ms=.. gemm_rng_ms=.. (QKV projection GEMM then the attention forward; issue 7's
//       table; gemm_rng: the best GEMM_RNG, then the forward reading its bits; for causal=1 the
//       best variant with MASK_CAUSAL, checked first: GEMM_RNG_CAUSAL visible_words_identical=1)
//   attention_bench --dropout [P] --e2e-only   only the GEMM_RNG and E2E lines (and E2E_PARTS: each
//     E2E kernel timed alone)
//   attention_bench --tool-ab              the API's forward (also with fused dropout p 0.1), dK/dV and dQ kernels assembled by nvJitLink and by
//     ptxas (whole-program), alternated rounds, S 4k/8k, D 64/128, full/causal:
//     TOOL_AB kernel=attention_bwd_dkdv S=4096 D=128 causal=0 nvjitlink_ms=.. ptxas_ms=.. speedup=.. registers=../.. outputs_identical=1
//   attention_bench --pairs-ab             the same kernels without and with CompileOptions::packed_loop_pairs
//     (loop-carried bf16 values as packed pairs, decision 092), outputs compared bit for bit:
//     PAIRS_AB kernel=attention_fwd+dropout S=4096 D=128 causal=0 off_ms=.. on_ms=.. speedup=.. registers=../.. outputs_identical=1
//   attention_bench --dq-variants          the recompute dQ kernel alone at other BLOCK_M / BLOCK_N / warps / stages:
//     DQ_VARIANT D=128 causal=0 default=64x64/4w/2s variant=64x32/4w/2s programs_per_sm=.. default_ms=..
//       variant_ms=.. speedup=.. outputs_identical=..
//   attention_bench --mask-kernel          the dropout_mask kernel alone per tiling and warps (D128 S4k's
//     mask), bits compared with the default's:
//     MASK_KERNEL BLOCK_M=64 BLOCK_W=4 warps=4 registers=.. programs_per_sm=.. ms=.. bits_identical=1
//   attention_bench --deterministic [--head-dim D] [--seq S] [--mode KEY] [--causal 0|1]  the backward per dQ reduction
//     (--mode: only that one, e.g. atomic, to profile one kernel; --causal: only full / causal) (recompute, atomic, split, ordered,
//     causal also ordered with q_descending), D 64/128, S 1k-16k, full and causal, alternated rounds:
//     DETERMINISTIC dtype=bf16 D=128 S=4096 causal=1 B=4 H=16 recompute_ms=.. recompute_tflops=.. atomic_ms=..
//       ... split_ms=.. (or skipped(workspace=..GB>16GB)) ordered_ms=.. ordered_desc_ms=.. ordered_vs_atomic=..
//   attention_bench --schedule-ab META [--with M=0|1,..] [--head-dim D] [--causal 0|1] [--no-dropout] [--seq S]
//     a bool forward schedule meta off/on (D 64/128, S4k or S (B*S = 16k; dropout only at S <= 4k),
//     +-causal, +-dropout; --with: other bool metas set in both variants), outputs compared bit for bit:
//     SCHEDULE_AB PINGPONG D=128 causal=0 dropout=0 off_ms=.. on_ms=.. off_tflops=.. on_tflops=.. speedup=.. outputs_identical=1
//   attention_bench --dropout P --schedule BM,BN,W,S   the same, the dropout backward at those tiles
//   attention_bench --forward-variants [--head-dim D] [--dropout P] [--quick]  the forward at other
//     tiles/warps/stages than the default (S4k, full and causal; with dropout p when given; --quick:
//     the default alone, e.g. under a profiler; --with META: a bool meta on in every variant), outputs
//     checked against the default's:
//     FWD_VARIANT D=128 causal=0 dropout=1 tile=64x64 warps=4 stages=2 exact=0 min_programs_per_sm=0 programs_per_sm=2 ms=..
//       vs_default=.. (min_programs_per_sm: the variant's register bound, CompileOptions::min_programs_per_sm)
//   attention_bench --backward-ab META[,META...] [--reduction atomic|ordered] [--with META,...] [--schedule BM,BN,W,S[,MIN_PROGRAMS]] [--dropout P] [--gqa G]
//     the dK/dV kernel (recompute, or the 5-matmul one adding dQ's parts atomically or in order;
//     ordered runs PERSISTENT, which the bench sets: not in --with) with bool metas
//     all off / all on (--with: on in both; PERSISTENT: on a grid of resident programs; --schedule:
//     the "on" kernel at these tiles, warps and stages) (D 64/128, S4k, +-causal), dK and dV compared
//     bit for bit:
//     BACKWARD_AB ROWS_AHEAD kernel=attention_bwd_dkdv reduction=recompute D=128 causal=0 off_ms=.. on_ms=.. speedup=..
//       outputs_identical=1
//   attention_bench --dq-ab META [--dropout P] [--with M,..]  the dQ kernel alone, META off / on (DROPOUT_BITS: random words)
//   attention_bench --meta-ab META [--kernels fwd,dkdv,dq]  each listed kernel (API default schedules)
//     with a bool meta off/on (S 4k-16k, D 64/128, +-causal, and B 1 x 8 heads at S 8k), outputs
//     compared bit for bit:
//     META_AB HEAVY_FIRST_SECTIONS kernel=dq S=8192 D=128 B=2 H=16 causal=1 off_ms=.. on_ms=.. speedup=.. outputs_identical=1
//   attention_bench --cp [...]             context parallelism on every GPU (bench/attention_cp.cpp)
//   attention_bench --build-ab OTHER.tjb   the API's forward, dK/dV and dQ kernels (D 64/128, S 4k, full
//     and causal) as this build compiles them against the same configurations from a bundle another
//     build wrote (`tilejit bundle -o OTHER.tjb --attention D=128 ...` there): a lowering change A/B'd
//     in one process (attention_build_ab.cpp):
//     BUILD_AB kernel=attention_fwd D=128 causal=0 meta=.. this_ms=.. other_ms=.. speedup=.. registers=../.. outputs_identical=1
//   attention_bench --timing-ab            D128 / D64 forward and backward timed queued, synced and as the tuner
//     does (an L2 flush before each call), alternated: TIMING_AB kernel=fwd D=.. queued_ms=.. synced_ms=.. flushed_ms=..
//   attention_bench --capabilities         "backward=1 varlen_fwd=1 varlen_bwd=1 dropout=1"
//   attention_bench --check DIR            reads DIR/cases.txt and the inputs, writes the outputs
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/attention/forward.hpp"
#include "api/attention.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/dropout_mask.hpp"
#include "jit/compile.hpp"
#include "kernels/gemm.hpp"
#include "api/registry.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/function.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/host_tensor.hpp"
#include "kernels/meta_names.hpp"
#include "bench/bench_util.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"

using namespace tilejit;
using bench_util::add_dropout_key;
using bench_util::median;
using bench_util::no_rng_state;
using bench_util::parse_with;
using bench_util::random_buffer;
using runtime::DeviceBuffer;
using namespace tilejit::attention_bench;

namespace {

namespace mn = tilejit::kernels::meta_name;

// The main grid (bench/attention.py's table). `dt` bf16 or f16; `gqa` > 1: K / V with H / gqa heads
// (grouped-query attention, e.g. 4: Hq 32 / Hkv 8 at D64, 16 / 4 at D128).
int bench(bool quick, int max_reps, ir::DType dt, int64_t gqa, bool synced) {
  std::vector<Config> configs;
  if (quick) {
    configs = {{1024, 128, false}, {4096, 128, false}, {4096, 128, true}, {4096, 64, false}, {16384, 128, true}};
  } else {
    for (int64_t D : {64, 128})
      for (bool causal : {false, true})
        for (int64_t S : {1024, 2048, 4096, 8192, 16384}) configs.push_back({S, D, causal});
  }
  const bool bwd = attention::backward_available();
  // Compile every kernel up front, in parallel (JIT and caches need no GPU).
  {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int64_t D : {64, 128})
      for (bool causal : {false, true})
        pool.emplace_back([=] { attention::prepare(dt, static_cast<int>(D), causal, false, bwd); });
    for (auto& t : pool) t.join();
    std::fprintf(stderr, "compiled in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const Buffers buf(dt);
  runtime::Stream stream;
  for (const Config& c : configs) {
    const int64_t B = c.B(), S = c.S, H = c.H(), D = c.D, Hkv = H / std::max<int64_t>(gqa, 1);
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c, Hkv);
    attention::Options opts;
    opts.causal = c.causal;
    double fwd_ms = NAN, bwd_ms = NAN;
    try {
      const auto timed = [&](auto&& fn) { return synced ? time_ms(fn, stream, max_reps) : queued_ms(fn, stream); };
      fwd_ms = timed([&] { attention::forward(Q, K, V, O, L, opts, stream.handle()); });
      if (bwd)
        bwd_ms = timed([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), {buf.ws.ptr(), buf.ws.bytes()}); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "S=%ld D=%ld causal=%d: %s\n", static_cast<long>(S), static_cast<long>(D), c.causal, e.what());
    }
    const double f = c.fwd_flops();
    std::printf("RESULT dtype=%s B=%ld S=%ld H=%ld Hkv=%ld D=%ld causal=%d fwd_ms=%.4f fwd_tflops=%.1f bwd_ms=%.4f bwd_tflops=%.1f\n",
                std::string(ir::name(dt)).c_str(), static_cast<long>(B), static_cast<long>(S), static_cast<long>(H), static_cast<long>(Hkv),
                static_cast<long>(D), c.causal ? 1 : 0, fwd_ms, f / (fwd_ms * 1e-3) / 1e12, bwd_ms, 2.5 * f / (bwd_ms * 1e-3) / 1e12);
    std::fflush(stdout);
  }
  return 0;
}

// --schedule-ab META: the forward with a bool schedule meta (PINGPONG, PIPELINE_QK, ...) off and
// on, D 64/128, S 4k, full and causal, without dropout, with fused dropout (p = 0.1; dropout=1) and
// reading the packed mask (DROPOUT_BITS; dropout=2), alternated rounds;
// direct launches at the API's default schedule. A schedule must not change values: the outputs
// of both variants are compared bit for bit (outputs_identical=1).
int bench_schedule_ab(const std::string& meta_name, int max_reps, const std::string& with, int64_t only_d, int only_causal,
                      bool no_dropout, int64_t seq) {
  const Buffers buf;
  runtime::Stream stream;
  // dropout 0: none, 1: fused, 2: reading the packed mask (DROPOUT_BITS), generated here first
  const int64_t max_words = kTokens / 4096 * (kHidden / 64) * 4096 * (4096 / 32);  // B * H * S * S / 32 at S4k, D 64
  const DeviceBuffer bits(static_cast<size_t>(max_words) * 4);
  for (int64_t D : {64, 128})
    for (bool causal : {false, true})
      for (int dropout_mode : {0, 1, 2}) {
        // (the packed mask's buffer holds S <= 4k)
        if ((only_d && D != only_d) || (only_causal >= 0 && causal != (only_causal != 0)) ||
            ((no_dropout || seq > 4096) && dropout_mode))
          continue;
        const bool dropout = dropout_mode > 0;
        const Config c{seq, D, causal};
        const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
        const attention::Schedule sch = attention::default_schedule(attention::Pass::forward, ir::DType::bf16, static_cast<int>(D), causal);
        std::vector<Function> fns;
        for (bool on : {false, true}) {
          lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D}, {mn::kBlockM, sch.block_m}, {mn::kBlockN, sch.block_n}, {mn::kBshd, true},
                          {mn::kCausal, causal}, {mn::kDropout, dropout}};
          // META, or "A=1,B=0:A=0,B=1" (the metas of the off and the on variant)
          if (const size_t colon = meta_name.find(':'); colon != std::string::npos) {
            for (const auto& [name, value] : parse_with(on ? meta_name.substr(colon + 1) : meta_name.substr(0, colon)))
              meta.emplace_back(name, value);
          } else {
            meta.emplace_back(meta_name, on);
          }
          if (dropout_mode == 2) meta.emplace_back(mn::kDropoutBits, true);
          for (const auto& [name, value] : parse_with(with)) meta.emplace_back(name, value);
          // on top of the fma softmax, as the API launches it (softmax_scale > 0)
          if (meta_name != mn::kPositiveScale) meta.emplace_back(mn::kPositiveScale, true);
          jit::CompileOptions o;
          o.num_warps = sch.num_warps;
          o.pipeline.stages = sch.stages;
          // the API's register bound (D 64: two programs per SM), except for a variant with a
          // producer warpgroup, which holds an SM alone (168 registers x 384 threads)
          bool producer = false;
          for (const auto& [name, value] : meta)
            if (name == mn::kRingProducer) producer = std::get<bool>(value);
          if (!producer) o.min_programs_per_sm = sch.min_programs_per_sm;
          // and, under that bound, the rcp normalisation the API picks (schedules.cpp; D 64's
          // unbounded default divides, 7-8% slower here: decision 078)
          bool exact_given = false;
          for (const auto& [name, value] : meta) exact_given |= name == mn::kExactNormalize;
          if (o.min_programs_per_sm > 0 && !exact_given) meta.emplace_back(mn::kExactNormalize, false);
          fns.emplace_back(kernels::attention_forward(), meta, o);
        }
        std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(double(D)))};
        if (dropout)
          add_dropout_key(args, 0.1);
        // (outlives args: a DeviceArg views the tensor's shape and strides)
        const attention::Tensor bits_view = attention::contiguous(bits.ptr(), ir::DType::u32, {c.B() * c.H(), c.S, c.S / 32});
        if (dropout_mode == 2) {
          attention::Options gen;
          gen.dropout_p = 0.1, gen.seed = 1234, gen.offset = 7;
          attention::generate_dropout_bits(bits_view, c.B(), c.H(), c.S, c.S, gen, stream.handle());
          args.emplace_back(bits_view.view());
        }
        // PERSISTENT: as many programs as are resident at once (at most one per tile), on a 1-D grid
        std::array<runtime::Grid, 2> grids;
        for (size_t i = 0; i < 2; ++i) {
          const int64_t tiles = lang::cdiv(c.S, sch.block_m) * c.H() * c.B();
          grids[i] = meta_flag(fns[i], mn::kPersistent) ? fns[i].gpu_kernel().persistent_grid(tiles) : runtime::Grid{lang::cdiv(c.S, sch.block_m), c.H(), c.B()};
        }
        const AbResult r = ab_measure_grids(fns, grids, stream, args, {&buf.o}, static_cast<size_t>(c.B() * c.S * c.H() * D * 2), max_reps);
        const double f = c.fwd_flops(), a = r.off_ms, b = r.on_ms;
        std::printf("SCHEDULE_AB %s S=%ld D=%ld causal=%d dropout=%d off_ms=%.4f on_ms=%.4f off_tflops=%.1f on_tflops=%.1f speedup=%.3f "
                    "outputs_identical=%d\n",
                    meta_name.c_str(), static_cast<long>(c.S), static_cast<long>(D), causal ? 1 : 0, dropout_mode, a, b, f / (a * 1e-3) / 1e12,
                    f / (b * 1e-3) / 1e12, a / b, r.identical ? 1 : 0);
        std::fflush(stdout);
      }
  return 0;
}

// --backward-ab META: the dK/dV kernel alone (recompute, or --reduction atomic; the API's default
// tiles for it) with a bool meta
// off and on, D 64/128, S 4k, full and causal, alternated rounds; dK and dV compared bit for bit.
// LSE from the forward; Delta from the preprocess kernel, as the API runs them. --windows: the
// library masks sliding_window (512 left, 511 right) and causal_sliding_window (1023) instead of
// full and causal (interval masks: no pre-pass lists; the API's masked tiles).
int bench_backward_ab(const std::string& meta_name, int max_reps, attention::DqReduction reduction, const std::string& with_meta,
                      const std::optional<attention::Schedule>& on_schedule, double dropout_p, int64_t only_d, int64_t gqa, bool windows) {
  const bool dropout = dropout_p > 0;  // --dropout P: fused dropout in both variants (the dropout backward's tiles)
  const Buffers buf;
  runtime::Stream stream;
  // --reduction atomic: the 5-matmul dK/dV adding dQ's parts into an f32 [B, H, S, D] accumulator
  // (not zeroed between launches: only dK and dV are compared and timed); ordered: the same on
  // DASH's persistent grid, its semaphores zeroed before every launch (timed in both variants)
  const bool atomic = reduction != attention::DqReduction::recompute, ordered = reduction == attention::DqReduction::ordered;
  const DeviceBuffer dq_accum(atomic ? Buffers::bytes * 2 : 16), semaphores(Buffers::lse_bytes);
  for (int64_t D : only_d ? std::vector<int64_t>{only_d} : std::vector<int64_t>{64, 128})
    for (bool causal : {false, true}) {
      const Config c{4096, D, causal};
      const int64_t Hkv = c.H() / gqa;  // --gqa G: K and V with H / G heads, a program per KV head's key tile
      const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c, Hkv);
      const DeltaBuffer delta = forward_and_delta(buf, c, stream, Hkv);
      const attention::Tensor& delta_view = delta.view;
      // (--windows: `causal` picks the causal window; the kernel's CAUSAL meta stays off)
      const kernels::MaskKind window = causal ? kernels::MaskKind::causal_sliding_window : kernels::MaskKind::sliding_window;
      const attention::Schedule base = attention::default_schedule(attention::Pass::bwd_dkdv, ir::DType::bf16, static_cast<int>(D),
                                                                   causal && !windows, false, reduction, dropout, windows);
      const std::array<attention::Schedule, 2> schedules{base, on_schedule.value_or(base)};
      std::vector<Function> fns;
      for (bool on : {false, true}) {
        const attention::Schedule& sch = schedules[on ? 1 : 0];
        lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D}, {mn::kBlockM, sch.block_m}, {mn::kBlockN, sch.block_n},
                        {mn::kBshd, true}, {mn::kCausal, causal && !windows}};
        if (windows) meta.emplace_back(mn::kMask, static_cast<int64_t>(window));
        if (dropout) meta.emplace_back(mn::kDropout, true);
        // "A,B": all off, then all on; or "A=1,B=24:A=0,B=40" (the off and the on variant's metas)
        if (const size_t colon = meta_name.find(':'); colon != std::string::npos) {
          for (auto& m : bench_util::parse_with_values(on ? meta_name.substr(colon + 1) : meta_name.substr(0, colon))) meta.push_back(std::move(m));
        } else {
          for (const auto& [name, value] : bench_util::parse_with(meta_name)) meta.emplace_back(name, on && value);
        }
        for (const auto& [name, value] : bench_util::parse_with(with_meta)) meta.emplace_back(name, value);
        if (atomic) meta.emplace_back(mn::kDqReduction, static_cast<int64_t>(reduction));
        if (ordered) meta.emplace_back(mn::kPersistent, true);
        jit::CompileOptions o;
        o.num_warps = sch.num_warps;
        o.pipeline.stages = sch.stages;
        o.min_programs_per_sm = sch.min_programs_per_sm;  // (as the API compiles it: D64's dK/dV has 3)
        fns.emplace_back(kernels::attention_backward_dkdv(), meta, o);
      }
      const attention::Tensor accum = attention::contiguous(dq_accum.ptr(), ir::DType::f32, {c.B(), c.H(), c.S, D});
      const int64_t m_blocks = lang::cdiv(c.S, schedules[0].block_m);
      const attention::Tensor sems = attention::contiguous(semaphores.ptr(), ir::DType::i32, {c.B() * c.H() * m_blocks});
      std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), dO.view(), L.view(), delta_view.view(), dK.view(), dV.view()};
      if (atomic) args.emplace_back(accum.view());
      if (ordered) args.emplace_back(sems.view());
      const size_t sem_bytes = static_cast<size_t>(c.B() * c.H() * m_blocks) * 4;
      const std::function<void()> zero_semaphores = [&] {
        runtime::check_cu(runtime::Driver::get().api().MemsetD8Async(semaphores.ptr(), 0, sem_bytes, stream.handle()), "cuMemsetD8Async");
      };
      args.emplace_back(static_cast<float>(1 / std::sqrt(double(D))));
      if (dropout) add_dropout_key(args, dropout_p);
      if (windows)  // the mask's scalars, after the kernel's own parameters
        for (const std::string& name : kernels::mask_parameter_names(window))
          args.emplace_back(static_cast<int32_t>(name == "mask_window_left" ? (causal ? 1023 : 512) : 511));
      // --with DROPOUT_BITS: the packed keep-mask read from memory (random words: timing only)
      const auto bits_buffer = add_random_mask_words(args, c, meta_flag(fns[0], mn::kDropoutBits));
      // DROPOUT_WRITE_BITS (a variant's own parameter, after the key): where it stores the mask's words
      std::array<std::vector<runtime::DeviceArg>, 2> variant_args{args, args};
      std::array<std::unique_ptr<MaskWords>, 2> words_out;
      for (size_t i = 0; i < 2; ++i)
        words_out[i] = add_random_mask_words(variant_args[i], c, meta_flag(fns[i], mn::kDropoutWriteBits), false,
                                             meta_flag(fns[i], mn::kDropoutWordsKeyMajor));
      AbResult r;
      try {  // (a Function compiles at its first launch)
        // PERSISTENT: as many programs as are resident at once (at most one per key tile), on a 1-D grid
        std::array<runtime::Grid, 2> grids;
        for (size_t i = 0; i < 2; ++i) {
          const int64_t key_tiles = lang::cdiv(c.S, schedules[i].block_n);
          grids[i] = meta_flag(fns[i], mn::kPersistent) ? fns[i].gpu_kernel().persistent_grid(key_tiles * Hkv * c.B())
                                                        : runtime::Grid{key_tiles, Hkv, c.B()};
        }
        const auto launch = [&](size_t i) { return [&, i] { fns[i].launch(grids[i], stream.handle(), variant_args[i]); }; };
        r = ab_measure_launches({launch(0), launch(1)}, stream, {&buf.dk, &buf.dv}, static_cast<size_t>(c.B() * c.S * Hkv * D * 2),
                                max_reps, ordered ? zero_semaphores : std::function<void()>{});
      } catch (const std::exception& e) {
        std::printf("BACKWARD_AB %s kernel=attention_bwd_dkdv D=%ld causal=%d skipped=\"%s\"\n", meta_name.c_str(), static_cast<long>(D),
                    causal ? 1 : 0, e.what());
        continue;
      }
      const attention::Schedule& on_s = schedules[1];
      std::printf("BACKWARD_AB %s kernel=attention_bwd_dkdv reduction=%s dropout=%g D=%ld gqa=%ld causal=%d%s on_tiles=%dx%d/%dw/%ds off_ms=%.4f "
                  "on_ms=%.4f speedup=%.3f outputs_identical=%d\n",
                  meta_name.c_str(), ordered ? "ordered" : atomic ? "atomic" : "recompute", dropout ? dropout_p : 0.0, static_cast<long>(D),
                  static_cast<long>(gqa), causal ? 1 : 0, windows ? (causal ? " mask=causal_sliding_window" : " mask=sliding_window") : "",
                  on_s.block_m, on_s.block_n,
                  on_s.num_warps, on_s.stages, r.off_ms, r.on_ms, r.off_ms / r.on_ms, r.identical ? 1 : 0);
      std::fflush(stdout);
    }
  return 0;
}

// --meta-ab META [--kernels fwd,dkdv,dq]: each listed kernel (the API's default schedules: the
// forward, the recompute dK/dV and dQ) with a bool meta off and on, in alternated rounds, outputs
// compared bit for bit. S 4k/8k/16k, D 64/128, full and causal, and a grid of few heads (B 2 x 8
// heads, S 8k, D 128) where a causal grid's tail matters most.
int bench_meta_ab(const std::string& meta_name, const std::string& kernels_list, int max_reps) {
  const Buffers buf;
  runtime::Stream stream;
  const ir::DType dt = ir::DType::bf16;
  std::vector<Config> configs;
  for (int64_t S : {4096, 8192, 16384})
    for (int64_t D : {64, 128})
      for (bool causal : {false, true}) configs.push_back({S, D, causal});
  for (bool causal : {false, true}) configs.push_back({8192, 128, causal, 8});
  for (const Config& c : configs) {
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
    const DeltaBuffer delta = forward_and_delta(buf, c, stream);
    const float scale = static_cast<float>(1 / std::sqrt(double(c.D)));
    const size_t bytes = static_cast<size_t>(c.B() * c.S * c.H() * c.D * 2);
    for (const attention::Pass pass : {attention::Pass::forward, attention::Pass::bwd_dkdv, attention::Pass::bwd_dq}) {
      const char* key = pass == attention::Pass::forward ? "fwd" : pass == attention::Pass::bwd_dkdv ? "dkdv" : "dq";
      if (kernels_list.find(key) == std::string::npos) continue;
      const attention::Schedule sch = attention::default_schedule(pass, dt, static_cast<int>(c.D), c.causal);
      std::vector<Function> fns;
      for (bool on : {false, true}) {
        lang::Meta meta{{mn::kDtype, dt}, {mn::kHeadDim, c.D}, {mn::kBlockM, sch.block_m}, {mn::kBlockN, sch.block_n},
                        {mn::kBshd, true}, {mn::kCausal, c.causal}, {meta_name, on}};
        if (pass == attention::Pass::forward) meta.emplace_back(mn::kPositiveScale, true);  // as the API launches it
        if (pass == attention::Pass::forward && sch.min_programs_per_sm > 0) meta.emplace_back(mn::kExactNormalize, false);
        jit::CompileOptions o;
        o.num_warps = sch.num_warps;
        o.pipeline.stages = sch.stages;
        o.min_programs_per_sm = sch.min_programs_per_sm;
        const auto& kernel = pass == attention::Pass::forward    ? kernels::attention_forward()
                             : pass == attention::Pass::bwd_dkdv ? kernels::attention_backward_dkdv()
                                                                 : kernels::attention_backward_dq();
        fns.emplace_back(kernel, meta, o);
      }
      AbResult r;
      if (pass == attention::Pass::forward)
        r = ab_measure(fns, {lang::cdiv(c.S, sch.block_m), c.H(), c.B()}, stream, {Q.view(), K.view(), V.view(), O.view(), L.view(), scale},
                       {&buf.o}, bytes, max_reps);
      else if (pass == attention::Pass::bwd_dkdv)
        r = ab_measure(fns, {lang::cdiv(c.S, sch.block_n), c.H(), c.B()}, stream,
                       {Q.view(), K.view(), V.view(), dO.view(), L.view(), delta.view.view(), dK.view(), dV.view(), scale},
                       {&buf.dk, &buf.dv}, bytes, max_reps);
      else
        r = ab_measure(fns, {lang::cdiv(c.S, sch.block_m), c.H(), c.B()}, stream,
                       {Q.view(), K.view(), V.view(), dO.view(), L.view(), delta.view.view(), dQ.view(), scale}, {&buf.dq}, bytes, max_reps);
      std::printf("META_AB %s kernel=%s S=%ld D=%ld B=%ld H=%ld causal=%d off_ms=%.4f on_ms=%.4f speedup=%.3f outputs_identical=%d\n",
                  meta_name.c_str(), key, static_cast<long>(c.S), static_cast<long>(c.D), static_cast<long>(c.B()), static_cast<long>(c.H()),
                  c.causal ? 1 : 0, r.off_ms, r.on_ms, r.off_ms / r.on_ms, r.identical ? 1 : 0);
      std::fflush(stdout);
    }
  }
  return 0;
}

// --tool-ab: each kernel of the API's default attention (forward, dK/dV, dQ) assembled by nvJitLink
// (relocatable code, the default) and by ptxas (whole-program code; TILEJIT_PTX_TOOL=ptxas), timed
// in alternated rounds, outputs compared bit for bit (the PTX is the same). S 4k and 8k, D 64/128.
// packed_pairs (--pairs-ab): CompileOptions::packed_loop_pairs off and on instead (same outputs).
int bench_tool_ab(int max_reps, bool packed_pairs) {
  const Buffers buf;
  runtime::Stream stream;
  const ir::DType dt = ir::DType::bf16;
  for (int64_t S : {4096, 8192})
    for (int64_t D : {64, 128})
      for (bool causal : {false, true}) {
        const Config c{S, D, causal};
        const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
        const DeltaBuffer delta = forward_and_delta(buf, c, stream);
        const attention::Tensor& delta_view = delta.view;
        const float scale = static_cast<float>(1 / std::sqrt(double(D)));
        const size_t bytes = static_cast<size_t>(c.B() * c.S * c.H() * D * 2);
        // (the forward twice: without and with fused dropout, p = 0.1)
        for (int row = 0; row < 4; ++row) {
          const attention::Pass pass = row == 2 ? attention::Pass::bwd_dkdv : row == 3 ? attention::Pass::bwd_dq : attention::Pass::forward;
          const bool dropout = row == 1;
          const attention::Schedule sch =
              attention::default_schedule(pass, dt, static_cast<int>(D), causal, false, attention::DqReduction::recompute, dropout);
          lang::Meta meta{{mn::kDtype, dt}, {mn::kHeadDim, D}, {mn::kBlockM, sch.block_m}, {mn::kBlockN, sch.block_n}, {mn::kBshd, true}, {mn::kCausal, causal}};
          if (dropout) meta.emplace_back(mn::kDropout, true);
          if (pass == attention::Pass::forward) meta.emplace_back(mn::kPositiveScale, true);  // as the API launches it
          if (pass == attention::Pass::forward && sch.min_programs_per_sm > 0) meta.emplace_back(mn::kExactNormalize, false);
          const auto& kernel = pass == attention::Pass::forward    ? kernels::attention_forward()
                               : pass == attention::Pass::bwd_dkdv ? kernels::attention_backward_dkdv()
                                                                   : kernels::attention_backward_dq();
          std::vector<Function> fns;
          // --tool-ab: nvJitLink, then ptxas; --pairs-ab: CompileOptions::packed_loop_pairs off, then on
          for (int variant : {0, 1}) {
            jit::CompileOptions o;
            o.num_warps = sch.num_warps;
            o.pipeline.stages = sch.stages;
            o.min_programs_per_sm = sch.min_programs_per_sm;
            if (packed_pairs) o.packed_loop_pairs = variant == 1;
            else o.ptx_tool = variant == 0 ? jit::PtxTool::NvJitLink : jit::PtxTool::Ptxas;
            fns.emplace_back(kernel, meta, o);
          }
          // (the forward rewrites O and LSE, which the backward kernels read, with the same values)
          AbResult r;
          if (pass == attention::Pass::forward) {
            std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), scale};
            if (dropout)
              add_dropout_key(args, 0.1);
            r = ab_measure(fns, {lang::cdiv(c.S, sch.block_m), c.H(), c.B()}, stream, args, {&buf.o}, bytes, max_reps);
            if (dropout) forward_and_delta(buf, c, stream);  // (O and LSE without dropout again, for the backward rows)
          }
          else if (pass == attention::Pass::bwd_dkdv)
            r = ab_measure(fns, {lang::cdiv(c.S, sch.block_n), c.H(), c.B()}, stream,
                           {Q.view(), K.view(), V.view(), dO.view(), L.view(), delta_view.view(), dK.view(), dV.view(), scale},
                           {&buf.dk, &buf.dv}, bytes, max_reps);
          else
            r = ab_measure(fns, {lang::cdiv(c.S, sch.block_m), c.H(), c.B()}, stream,
                           {Q.view(), K.view(), V.view(), dO.view(), L.view(), delta_view.view(), dQ.view(), scale}, {&buf.dq}, bytes,
                           max_reps);
          const auto regs = [](Function& f) { return f.compiled().info.registers; };
          std::printf(packed_pairs ? "PAIRS_AB kernel=%s%s S=%ld D=%ld causal=%d off_ms=%.4f on_ms=%.4f speedup=%.3f registers=%d/%d "
                                     "outputs_identical=%d\n"
                                   : "TOOL_AB kernel=%s%s S=%ld D=%ld causal=%d nvjitlink_ms=%.4f ptxas_ms=%.4f speedup=%.3f registers=%d/%d "
                                     "outputs_identical=%d\n",
                      attention::name(pass), dropout ? "+dropout" : "", static_cast<long>(S), static_cast<long>(D), causal ? 1 : 0, r.off_ms,
                      r.on_ms, r.off_ms / r.on_ms,
                      regs(fns[0]), regs(fns[1]), r.identical ? 1 : 0);
          std::fflush(stdout);
        }
      }
  return 0;
}

}  // namespace

int run_cp_bench(int argc, char** argv);  // attention_cp.cpp

int main(int argc, char** argv) {
  // library kernels timed as the API launches them: declared, not specialised per call
  // (runtime/specialization.hpp; TILEJIT_SPECIALIZE=1 set by the caller overrides)
  setenv("TILEJIT_SPECIALIZE", "0", /*overwrite=*/0);
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--cp") return run_cp_bench(argc, argv);
  bool quick = false;
  int reps = 20;
  ir::DType grid_dtype = ir::DType::bf16;  // the main grid: --dtype f16, --gqa G (K / V heads = H / G)
  int64_t gqa = 1;
  bool windows = false;  // --backward-ab --windows: the sliding-window masks instead of full / causal
  attention::DqReduction ab_reduction = attention::DqReduction::recompute;  // --backward-ab ... --reduction atomic|ordered
  std::string check_dir;
  double dropout_p = -1;
  bool varlen_ab = false;  // --varlen-ab: the varlen kernels against Options::varlen_documents
  bool masks = false, deterministic = false, forward_variants = false, e2e_only = false, mask_kernel = false, dq_variants = false;
  std::string schedule_ab, with_meta, backward_ab, meta_ab, dq_ab, meta_ab_kernels = "fwd,dkdv,dq";
  int64_t only_d = 0, only_s = 0;  // --deterministic: only this head dim / sequence length
  std::string only_mode;            // --deterministic --mode KEY: only that reduction (recompute, atomic, ...; e.g. for ncu)
  int only_causal = -1;             // --deterministic --causal 0|1: only full / causal
  std::string build_ab;  // --build-ab OTHER.tjb: this build's API kernels against another build's (attention_build_ab.cpp)
  bool timing_ab = false;  // --timing-ab: the grid's timing methods against each other (attention_timing_ab.cpp)
  bool synced = false;   // --synced: the grid timed one call at a time (time_ms), not queued (queued_ms)
  bool tool_ab = false, pairs_ab = false, no_dropout = false, phases = false;  // --schedule-ab --no-dropout: only the runs without dropout; --dropout --phases: each backward phase timed
  std::optional<attention::Schedule> schedule;  // --deterministic --schedule: recompute's kernels at these tiles
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--synced") synced = true;
    else if (a == "--timing-ab") timing_ab = true;
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dtype" && i + 1 < argc && (std::string(argv[i + 1]) == "f16" || std::string(argv[i + 1]) == "bf16"))
      grid_dtype = std::string(argv[++i]) == "f16" ? ir::DType::f16 : ir::DType::bf16;
    else if (a == "--gqa" && i + 1 < argc && (std::atoi(argv[i + 1]) == 1 || std::atoi(argv[i + 1]) == 2 || std::atoi(argv[i + 1]) == 4 ||
                                               std::atoi(argv[i + 1]) == 8))
      gqa = std::atoi(argv[++i]);
    else if (a == "--check" && i + 1 < argc) check_dir = argv[++i];
    else if (a == "--masks") masks = true;
    else if (a == "--varlen-ab") varlen_ab = true;
    else if (a == "--e2e-only") e2e_only = true;
    else if (a == "--phases") phases = true;
    else if (a == "--mask-kernel") mask_kernel = true;
    else if (a == "--dq-variants") dq_variants = true;
    else if (a == "--dq-ab" && i + 1 < argc) dq_ab = argv[++i];
    else if (a == "--pipeline-ab") schedule_ab = mn::kPipelineQk;
    else if (a == "--schedule-ab" && i + 1 < argc) schedule_ab = argv[++i];
    else if (a == "--backward-ab" && i + 1 < argc) backward_ab = argv[++i];
    else if (a == "--windows") windows = true;
    else if (a == "--forward-variants") forward_variants = true;
    else if (a == "--with" && i + 1 < argc) with_meta = argv[++i];
    else if (a == "--deterministic") deterministic = true;
    else if (a == "--no-dropout") no_dropout = true;
    else if (a == "--head-dim" && i + 1 < argc) {
      only_d = std::atoll(argv[++i]);
      if (only_d != 64 && only_d != 128 && only_d != 256) {
        std::fprintf(stderr, "attention_bench: --head-dim %s: valid: 64, 128, 256\n", argv[i]);
        return 2;
      }
    }
    else if (a == "--seq" && i + 1 < argc) only_s = std::atoll(argv[++i]);
    else if (a == "--mode" && i + 1 < argc) only_mode = argv[++i];
    else if (a == "--reduction" && i + 1 < argc && (std::string(argv[i + 1]) == "atomic" || std::string(argv[i + 1]) == "ordered")) {
      ab_reduction = std::string(argv[++i]) == "atomic" ? attention::DqReduction::atomic : attention::DqReduction::ordered;
    }
    else if (a == "--tool-ab") tool_ab = true;
    else if (a == "--pairs-ab") pairs_ab = true;
    else if (a == "--build-ab" && i + 1 < argc) build_ab = argv[++i];
    else if (a == "--meta-ab" && i + 1 < argc) meta_ab = argv[++i];
    else if (a == "--kernels" && i + 1 < argc) meta_ab_kernels = argv[++i];
    else if (a == "--causal" && i + 1 < argc) only_causal = std::atoi(argv[++i]);
    else if (a == "--schedule" && i + 1 < argc) {
      attention::Schedule s;
      // (a fifth number: min_programs_per_sm, the register bound)
      const int n = std::sscanf(argv[++i], "%d,%d,%d,%d,%d", &s.block_m, &s.block_n, &s.num_warps, &s.stages, &s.min_programs_per_sm);
      if (n != 4 && n != 5) {
        std::fprintf(stderr, "--schedule wants BLOCK_M,BLOCK_N,WARPS,STAGES[,MIN_PROGRAMS_PER_SM]\n");
        return 2;
      }
      schedule = s;
    }
    else if (a == "--dropout") {
      dropout_p = 0.1;
      if (i + 1 < argc && argv[i + 1][0] != '-') dropout_p = std::atof(argv[++i]);
    }
    else if (a == "--capabilities") {
      std::printf("backward=%d varlen_fwd=%d varlen_bwd=%d dropout=%d\n", attention::backward_available() ? 1 : 0,
                  attention::varlen_supported(false) ? 1 : 0, attention::varlen_supported(true) ? 1 : 0,
                  attention::dropout_supported() ? 1 : 0);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N] [--dtype bf16|f16] [--gqa 1|2|4|8] | --dropout [P] [--schedule BM,BN,W,S] [--e2e-only] [--phases] [--head-dim D] | --mask-kernel | --dq-variants [--dropout P] [--head-dim D] | --dq-ab META [--dropout P] [--with M,..] [--head-dim D] | --tool-ab | --pairs-ab | --build-ab OTHER.tjb | --meta-ab META [--kernels fwd,dkdv,dq] | --forward-variants [--head-dim D] [--dropout P] | --masks [--seq S] [--head-dim 64] [--with M=V,..] | --varlen-ab [--head-dim 64] | --schedule-ab META | --backward-ab META [--dropout P] [--head-dim D] [--gqa G] [--windows] | --deterministic [--head-dim D] [--seq S] [--mode KEY] [--causal 0|1] [--schedule BM,BN,W,S] | --check DIR | "
                   "--capabilities\n", argv[0]);
      return 2;
    }
  }
  auto& driver = runtime::Driver::get();
  if (!driver.available()) {
    std::fprintf(stderr, "bench/attention needs a GPU: %s\n", driver.unavailable_reason().c_str());
    return 2;
  }
  try {
    std::fprintf(stderr, "GPU: %s\n", driver.props(0).name.c_str());
    if (forward_variants) return bench_forward_variants(reps, only_d, dropout_p, quick, with_meta);
    if (mask_kernel) return bench_mask_kernel(dropout_p >= 0 ? dropout_p : 0.1, reps);
    if (dq_variants || !dq_ab.empty()) return bench_dq_variants(reps, dropout_p, only_d, dq_ab, with_meta);
    if (!backward_ab.empty()) return bench_backward_ab(backward_ab, reps, ab_reduction, with_meta, schedule, dropout_p, only_d, gqa, windows);
    if (dropout_p >= 0) return bench_dropout(dropout_p, reps, schedule, e2e_only, only_d ? only_d : 128, phases);
    if (masks) return bench_masks(reps, only_s, with_meta, only_d ? only_d : 128);
    if (varlen_ab) return bench_varlen_ab(reps, only_d ? only_d : 128);
    if (!schedule_ab.empty()) return bench_schedule_ab(schedule_ab, reps, with_meta, only_d, only_causal, no_dropout, only_s ? only_s : 4096);
    if (tool_ab || pairs_ab) return bench_tool_ab(reps, pairs_ab);
    if (!build_ab.empty()) return bench_build_ab(build_ab, reps);
    if (timing_ab) return bench_timing_ab(reps);
    if (!meta_ab.empty()) return bench_meta_ab(meta_ab, meta_ab_kernels, reps);
    if (deterministic) return bench_deterministic(only_d, only_s, schedule, only_mode, only_causal);
    return check_dir.empty() ? bench(quick, reps, grid_dtype, gqa, synced) : check(check_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench/attention: %s\n", e.what());
    return 1;
  }
}
