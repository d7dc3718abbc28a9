// bench/attention: FlashAttention forward and backward through tilejit::attention (the C++ API a
// framework calls), timed with CUDA events; bench/attention.py runs it next to PyTorch SDPA and
// prints one table. A second mode runs cases written by the script (--check) for its comparison
// against PyTorch's float32 math.
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
//   attention_bench --backward-ab META[,META...] [--reduction atomic|ordered] [--with META,...] [--schedule BM,BN,W,S[,MIN_PROGRAMS]] [--dropout P]
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

float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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

// --dropout: the same configuration timed with and without dropout, in alternating rounds (clocks
// drift over minutes by more than the difference measured); the median of each side's rounds.
// Three RNG variants: none, fused (Philox in the kernels) and precomputed (the packed mask from
// attention::generate_dropout_bits, read by forward and backward), plus the mask kernel alone.
// Then issue 7's end-to-end case: the QKV projection GEMM (B*S x 2048 -> 3 x 2048) followed by
// the attention forward on its output, for no dropout, fused dropout, and the mask generated on a
// second stream concurrently with the GEMM (the attention stream waits for both). With --schedule
// BM,BN,W,S the backward with dropout (fused and precomputed) runs at those tiles (A/B of the
// default's choice; the no-dropout backward keeps the default).
int bench_dropout(double p, int max_reps, std::optional<attention::Schedule> bwd_schedule, bool e2e_only, int64_t head_dim,
                  bool phases) {
  const ir::DType dt = ir::DType::bf16;
  const bool bwd = attention::backward_available();
  for (bool causal : {false, true})
    for (bool dropout : {false, true}) attention::prepare(dt, static_cast<int>(head_dim), causal, false, bwd, {}, 0, dropout);
  const Buffers buf;
  // attention and the GEMM on a high-priority stream; the mask kernel fills the gaps from a low one
  runtime::Stream stream(0, runtime::Stream::Priority::high), side(0, runtime::Stream::Priority::low);
  const Config base{4096, head_dim, false};
  const int64_t B = base.B(), S = base.S, H = base.H(), D = base.D, words = (S + 31) / 32;
  DeviceBuffer bits(static_cast<size_t>(B * H * S * words) * 4);
  const attention::Tensor bits_view = attention::contiguous(bits.ptr(), ir::DType::u32, {B * H, S, words});
  const auto options = [&](bool causal, int rng, int round) {  // rng: 0 none, 1 fused, 2 precomputed
    attention::Options opts;
    opts.causal = causal;
    if (rng) opts.dropout_p = p, opts.seed = 1234, opts.offset = static_cast<uint64_t>(round);
    if (rng == 2) opts.dropout_bits = bits_view;
    return opts;
  };
  const auto generate = [&](const attention::Options& opts, CUstream s, int programs = 0) {
    attention::Options gen = opts;
    gen.dropout_bits.reset();
    attention::generate_dropout_bits(bits_view, B, H, S, S, gen, s, programs);
  };
  for (bool causal : {false, true}) {
    if (e2e_only) break;
    const Config c{S, D, causal};
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
    std::vector<double> fwd[4], bwd_ms[4], mask_ms, dkdv_phase[4], dq_phase[4];
    // six rounds, the variants' order rotated each round (a fixed order biases the comparison by
    // several %: see ab_rounds); variant 3: fused, the backward drawing the mask in dK/dV and again
    // in dQ (dropout_words_max_bytes = 0; variant 1 draws it once: decision 097)
    for (int round = 0; round < 8; ++round)
      for (int slot : {0, 1, 2, 3}) {
        const int rng = (slot + round) % 4;
        attention::Options opts = options(causal, rng == 3 ? 1 : rng, round);
        if (rng == 1) opts.dropout_words_max_bytes = size_t{1} << 30;  // the mask drawn once wherever the call allows it
        if (rng == 3) opts.dropout_words_max_bytes = 0;
        if (rng == 2) mask_ms.push_back(time_ms([&] { generate(opts, stream.handle()); }, stream, max_reps));
        if (rng != 3) fwd[rng].push_back(time_ms([&] { attention::forward(Q, K, V, O, L, opts, stream.handle()); }, stream, max_reps));
        if (bwd)
          bwd_ms[rng].push_back(time_ms([&] {
            attention::Options bo = opts;
            if (rng && bwd_schedule) bo.schedule = bwd_schedule;  // --schedule: the dropout backward's tiles (A/B)
            attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, bo, stream.handle(), {buf.ws.ptr(), buf.ws.bytes()});
          }, stream, max_reps));
        // --phases: the same backward in its two phases (options.backward_phase), each timed alone:
        // Delta + dK/dV, then dQ (which of the two a variant changes)
        if (bwd && phases && rng != 2)
          for (attention::BackwardPhase ph : {attention::BackwardPhase::dkdv, attention::BackwardPhase::dq}) {
            attention::Options po = opts;
            po.backward_phase = ph;
            (ph == attention::BackwardPhase::dkdv ? dkdv_phase : dq_phase)[rng].push_back(time_ms([&] {
              attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, po, stream.handle(), {buf.ws.ptr(), buf.ws.bytes()});
            }, stream, max_reps));
          }
      }
    const double f0 = median(fwd[0]), f1 = median(fwd[1]), f2 = median(fwd[2]), gen = median(mask_ms);
    const double b0 = bwd ? median(bwd_ms[0]) : NAN, b1 = bwd ? median(bwd_ms[1]) : NAN, b2 = bwd ? median(bwd_ms[2]) : NAN,
                 b3 = bwd ? median(bwd_ms[3]) : NAN;
    std::printf("DROPOUT dtype=bf16 B=%ld S=%ld H=%ld D=%ld causal=%d p=%g fwd_ms=%.4f fwd_dropout_ms=%.4f fwd_slowdown=%.3f "
                "bwd_ms=%.4f bwd_dropout_ms=%.4f bwd_slowdown=%.3f bwd_twice_ms=%.4f bwd_twice_slowdown=%.3f\n",
                static_cast<long>(B), static_cast<long>(S), static_cast<long>(H), static_cast<long>(D), causal ? 1 : 0, p, f0, f1,
                f1 / f0, b0, b1, b1 / b0, b3, b3 / b0);
    std::printf("DROPOUT_PRECOMPUTED causal=%d p=%g fwd_ms=%.4f fwd_bits_ms=%.4f fwd_bits_slowdown=%.3f bwd_bits_ms=%.4f "
                "bwd_bits_slowdown=%.3f mask_kernel_ms=%.4f\n",
                causal ? 1 : 0, p, f0, f2, f2 / f0, b2, b2 / b0, gen);
    if (bwd && phases)
      std::printf("DROPOUT_PHASES causal=%d p=%g none_dkdv_ms=%.4f none_dq_ms=%.4f once_dkdv_ms=%.4f once_dq_ms=%.4f twice_dkdv_ms=%.4f "
                  "twice_dq_ms=%.4f\n",
                  causal ? 1 : 0, p, median(dkdv_phase[0]), median(dq_phase[0]), median(dkdv_phase[1]), median(dq_phase[1]),
                  median(dkdv_phase[3]), median(dq_phase[3]));
    std::fflush(stdout);
  }

  // End to end: X [B*S, 2048] @ W^T (W: [6144, 2048], K-major) -> QKV [B*S, 6144] = [B, S, 3, H, D],
  // then attention on its strided Q, K, V views.
  const int64_t M = B * S, N = 3 * kHidden, Kd = kHidden;
  const DeviceBuffer x = random_buffer(static_cast<size_t>(M * Kd) * 2, dt, 11), w = random_buffer(static_cast<size_t>(N * Kd) * 2, dt, 12);
  DeviceBuffer qkv(static_cast<size_t>(M * N) * 2);
  const library::LibraryKernel* gk = library::find("gemm");
  lang::Meta gmeta = gk->default_meta;
  gmeta.emplace_back(mn::kOutDtype, dt);
  jit::CompileOptions gopts;
  gopts.num_warps = gk->num_warps;
  gopts.pipeline.stages = gk->stages;
  Function gemm(kernels::gemm(), gmeta, gopts);
  const int64_t gbm = std::get<int64_t>(gemm.signature().find_meta(mn::kBlockM)->value),
                gbn = std::get<int64_t>(gemm.signature().find_meta(mn::kBlockN)->value);
  const runtime::Grid ggrid{lang::cdiv(M, gbm) * lang::cdiv(N, gbn)};
  const attention::Tensor X = attention::contiguous(x.ptr(), dt, {M, Kd}), W = attention::contiguous(w.ptr(), dt, {N, Kd}),
                          QKV = attention::contiguous(qkv.ptr(), dt, {M, N});
  const runtime::TensorView xv = X.view(), wv = W.view(), qkvv = QKV.view();
  const auto proj = [&] { gemm(ggrid, stream.handle(), xv, wv, qkvv); };
  lang::Meta meta128 = gmeta;  // the plain GEMM at 128 x 128 tiles (E2E_PARTS: the tiles of the 8 + 8 warp-role variant)
  for (auto& [k, v] : meta128)
    if (k == mn::kBlockN) v = int64_t{128};
  Function gemm128(kernels::gemm(), meta128, gopts);
  const auto head_view = [&](int which) {  // which: 0 Q, 1 K, 2 V
    return attention::strided(qkv.ptr() + static_cast<uint64_t>(which * kHidden * 2), dt, {B, S, H, D}, {S * N, N, D, 1});
  };
  const attention::Tensor Qp = head_view(0), Kp = head_view(1), Vp = head_view(2);
  const auto [Q_, K_, V_, O, dO_, dQ_, dK_, dV_, L] = buf.views(base);
  runtime::Event started, mask_done;
  // The mask kernel's schedules: alone, and beside the GEMM (how much of it the GEMM hides).
  // persistent: a grid of that many programs striding over the tiles (0: one program per tile);
  // mask_first: the mask kernel is queued before the GEMM (else after it).
  struct MaskRun {
    int bm, bw, persistent;
    bool mask_first;
  };
  const int sms = runtime::Driver::get().props(0).sm_count;
  const std::vector<MaskRun> mask_runs = e2e_only ? std::vector<MaskRun>{}
                                                  : std::vector<MaskRun>{{64, 4, 0, false}, {64, 4, sms, true}, {64, 4, 2 * sms, true},
                                                                         {64, 4, 4 * sms, true}, {128, 4, sms, true}, {64, 4, sms, false}};
  for (MaskRun r : mask_runs) {
    Function mask(kernels::dropout_mask(), {{mn::kBlockM, r.bm}, {mn::kBlockW, r.bw}, {mn::kPersistent, r.persistent > 0}}, {});
    runtime::set_shared_memory_carveout(mask.gpu_kernel().function(), 100);
    const runtime::Grid mgrid = r.persistent ? runtime::Grid{r.persistent}
                                             : runtime::Grid{lang::cdiv(S, r.bm), lang::cdiv(words, r.bw), B * H};
    const runtime::TensorView bv = bits_view.view();
    const auto run_mask = [&](CUstream s) {
      mask(mgrid, s, bv, static_cast<int32_t>(S), uint32_t{1234}, uint32_t{0}, uint32_t{0}, uint32_t{0},
           kernels::dropout_keep_threshold(p), no_rng_state, 0u);
    };
    const double alone = time_ms([&] { run_mask(stream.handle()); }, stream, max_reps), g = time_ms(proj, stream, max_reps);
    const double both = time_ms([&] {
      started.record(stream);
      side.wait(started);
      if (!r.mask_first) proj();
      run_mask(side.handle());
      if (r.mask_first) proj();
      mask_done.record(side);
      stream.wait(mask_done);
    }, stream, max_reps);
    std::printf("MASK_OVERLAP BLOCK_M=%d BLOCK_W=%d persistent=%d mask_first=%d mask_ms=%.4f gemm_ms=%.4f gemm_and_mask_ms=%.4f "
                "hidden=%.2f\n", r.bm, r.bw, r.persistent, r.mask_first ? 1 : 0, alone, g, both, (alone + g - both) / alone);
    std::fflush(stdout);
  }
  // The GEMM that writes the mask in its K loop's spare issue slots (gemm's DROPOUT_MASK): per
  // mask tiling, its time against the plain GEMM's, and its bits against the mask kernel's.
  // mask_warps > 0: on warps of their own beside the GEMM's (warp roles), with setmaxnreg when
  // mma_registers / mask_registers are given.
  // block_n > 0: the GEMM at that BLOCK_N instead of the library default's (8 mask warps fit only
  // beside 128 x 128 tiles).
  struct GemmRng {
    int bm, bw, per_step, mask_warps = 0, mma_registers = 0, mask_registers = 0, block_n = 0;
    bool causal = false;  // MASK_CAUSAL: only the tiles a causal layer reads
    int align = 4;        // MASK_ALIGN (16: vector stores; S4k's rows are 128 words)
  };
  const auto gemm_rng = [&](GemmRng r) {
    lang::Meta meta = gmeta;
    for (auto [k, v] : {std::pair{mn::kMaskBlockM, r.bm}, {mn::kMaskBlockW, r.bw}, {mn::kMaskTilesPerStep, r.per_step}})
      meta.emplace_back(k, int64_t{v});
    meta.emplace_back(mn::kDropoutMask, true);
    meta.emplace_back(mn::kMaskCausal, r.causal);
    meta.emplace_back(mn::kMaskAlign, int64_t{r.align});
    if (r.block_n)
      for (auto& [k, v] : meta)
        if (k == mn::kBlockN) v = int64_t{r.block_n};
    jit::CompileOptions o = gopts;
    if (r.mask_warps) {
      o.num_warps += r.mask_warps;
      meta.emplace_back(mn::kMaskWarps, int64_t{r.mask_warps});
      meta.emplace_back(mn::kMmaRegisters, int64_t{r.mma_registers});
      meta.emplace_back(mn::kMaskRegisters, int64_t{r.mask_registers});
    }
    return std::make_unique<Function>(kernels::gemm(), meta, o);
  };
  const runtime::TensorView bv = bits_view.view();
  // (the grid from the variant's own tiles: a 1-D GROUP_M grid of cdiv(M, BM) * cdiv(N, BN) programs)
  const auto grid_of = [&](const Function& g) {
    return runtime::Grid{lang::cdiv(M, std::get<int64_t>(g.signature().find_meta(mn::kBlockM)->value)) *
                         lang::cdiv(N, std::get<int64_t>(g.signature().find_meta(mn::kBlockN)->value))};
  };
  const auto proj_rng = [&](Function& g, const attention::Options& o) {
    g(grid_of(g), stream.handle(), xv, wv, qkvv, bv, static_cast<int32_t>(S), static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32),
      static_cast<uint32_t>(o.offset), static_cast<uint32_t>(o.offset >> 32), kernels::dropout_keep_threshold(o.dropout_p), no_rng_state,
      0u);
  };
  std::unique_ptr<Function> best_rng, best_rng_causal;
  double best_rng_ms = 1e30;
  GemmRng best_r{};
  {
    const size_t bytes = static_cast<size_t>(B * H * S * words) * 4;
    std::vector<uint32_t> want(bytes / 4), got(bytes / 4);
    const attention::Options o = options(false, 2, 7);
    generate(o, stream.handle());
    stream.synchronize();
    bits.download(want.data(), bytes);
    // C of the plain GEMM, which every variant must reproduce (all of it: a variant launched on
    // another variant's grid would compute only part of C)
    const size_t c_bytes = static_cast<size_t>(M * N) * 2;
    std::vector<uint16_t> c_want(c_bytes / 2), c_got(c_bytes / 2);
    proj();
    stream.synchronize();
    qkv.download(c_want.data(), c_bytes);
    // (8 mask warps do not fit beside a 128 x 256 GEMM tile: 16 warps leave 128 registers a thread
    // at entry, and ptxas needs 154 for the GEMM's wgmma whatever setmaxnreg asks later)
    // TILEJIT_GEMM_RNG_ONLY=i: variant i alone, launched once, then exit (one kernel to profile)
    const char* only = std::getenv("TILEJIT_GEMM_RNG_ONLY");
    int index = -1;
    // (more words per mask tile = more independent Philox calls a thread, for the latency-bound
    // mask warps; setmaxnreg gives them the registers: 256 x 176 + 128 x 152 <= 65536)
    for (GemmRng r : {GemmRng{64, 16, 1}, GemmRng{64, 16, 1, 0, 0, 0, 0, false, 16}, GemmRng{64, 16, 1, 4, 200, 104},
                      GemmRng{64, 16, 1, 4, 200, 104, 0, false, 16}, GemmRng{64, 32, 1, 4, 176, 152},
                      GemmRng{64, 32, 1, 4, 176, 152, 0, false, 16}, GemmRng{64, 16, 1, 8, 0, 0, 128, false, 16}}) {
      if (only && ++index != std::atoi(only)) continue;
      auto g = gemm_rng(r);
      if (only) {
        proj_rng(*g, o);
        stream.synchronize();
        return 0;
      }
      stream.synchronize();
      bits.upload(std::vector<uint32_t>(bytes / 4, 0u).data(), bytes);
      qkv.upload(std::vector<uint16_t>(c_bytes / 2, 0).data(), c_bytes);
      proj_rng(*g, o);
      stream.synchronize();
      bits.download(got.data(), bytes);
      qkv.download(c_got.data(), c_bytes);
      const bool same = got == want, c_same = c_got == c_want;
      std::vector<double> plain, with;
      for (int round = 0; round < 6; ++round) {
        const auto a = [&] { plain.push_back(time_ms(proj, stream, max_reps)); };
        const auto b = [&] { with.push_back(time_ms([&] { proj_rng(*g, o); }, stream, max_reps)); };
        if (round % 2) b(), a();
        else a(), b();
      }
      const double g0 = median(plain), g1 = median(with);
      std::printf("GEMM_RNG MASK_ALIGN=%d MASK_BLOCK_M=%d MASK_BLOCK_W=%d MASK_TILES_PER_STEP=%d MASK_WARPS=%d MMA_REGISTERS=%d MASK_REGISTERS=%d "
                  "BLOCK_N=%d gemm_ms=%.4f gemm_rng_ms=%.4f slowdown=%.3f bits_identical=%d c_identical=%d\n", r.align, r.bm, r.bw, r.per_step,
                  r.mask_warps, r.mma_registers, r.mask_registers, r.block_n ? r.block_n : 256, g0, g1, g1 / g0, same ? 1 : 0, c_same ? 1 : 0);
      std::fflush(stdout);
      if (!same || !c_same) return 1;
      if (g1 < best_rng_ms) best_rng_ms = g1, best_rng = std::move(g), best_r = r;
    }
    // The best variant writing only the tiles a causal layer reads (MASK_CAUSAL), for the causal
    // E2E: every word some row can see must be the full mask's.
    GemmRng rc = best_r;
    rc.causal = true;
    best_rng_causal = gemm_rng(rc);
    stream.synchronize();
    bits.upload(std::vector<uint32_t>(bytes / 4, 0u).data(), bytes);
    proj_rng(*best_rng_causal, o);
    stream.synchronize();
    bits.download(got.data(), bytes);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const int64_t word = static_cast<int64_t>(i % static_cast<size_t>(words)), row = static_cast<int64_t>(i / static_cast<size_t>(words)) % S;
      if (32 * word <= row) bad += got[i] != want[i];
    }
    std::printf("GEMM_RNG_CAUSAL visible_words_identical=%d\n", bad == 0 ? 1 : 0);
    if (bad) return 1;
  }
  for (bool causal : {false, true}) {
    // six rounds, the five variants' order rotated each round (a fixed order biases the comparison)
    std::vector<double> gemm_ms, t[5];
    std::vector<double>&none = t[0], &fused = t[1], &overlapped = t[2], &serial = t[3], &in_gemm = t[4];
    for (int round = 0; round < 6; ++round) {
      gemm_ms.push_back(time_ms(proj, stream, max_reps));
      const attention::Options o0 = options(causal, 0, round), o1 = options(causal, 1, round), o2 = options(causal, 2, round);
      const std::function<void()> variants[5] = {
          [&] { proj(); attention::forward(Qp, Kp, Vp, O, L, o0, stream.handle()); },
          [&] { proj(); attention::forward(Qp, Kp, Vp, O, L, o1, stream.handle()); },
          [&] {
            // the best arrangement MASK_OVERLAP found: a persistent mask kernel of one program per
            // SM, queued just before the GEMM (each SM keeps room for a GEMM program)
            started.record(stream);
            side.wait(started);
            generate(o2, side.handle(), sms);
            proj();
            mask_done.record(side);
            stream.wait(mask_done);
            attention::forward(Qp, Kp, Vp, O, L, o2, stream.handle());
          },
          [&] {
            generate(o2, stream.handle());
            proj();
            attention::forward(Qp, Kp, Vp, O, L, o2, stream.handle());
          },
          [&] {
            proj_rng(causal ? *best_rng_causal : *best_rng, o2);
            attention::forward(Qp, Kp, Vp, O, L, o2, stream.handle());
          }};
      for (int k = 0; k < 5; ++k) {
        const int v = (k + round) % 5;
        t[v].push_back(time_ms(variants[v], stream, max_reps));
      }
    }
    // the parts alone: the forward on the projection's views without dropout and reading bits, and
    // the mask-writing GEMM (does the sequence cost its parts' sum?)
    {
      const attention::Options o0 = options(causal, 0, 0), o2 = options(causal, 2, 0);
      const double fwd_none = time_ms([&] { attention::forward(Qp, Kp, Vp, O, L, o0, stream.handle()); }, stream, max_reps);
      const double fwd_bits = time_ms([&] { attention::forward(Qp, Kp, Vp, O, L, o2, stream.handle()); }, stream, max_reps);
      const double rng_gemm = time_ms([&] { proj_rng(causal ? *best_rng_causal : *best_rng, o2); }, stream, max_reps);
      std::printf("E2E_PARTS causal=%d gemm_ms=%.4f gemm_128x128_ms=%.4f gemm_rng_ms=%.4f fwd_none_ms=%.4f fwd_bits_ms=%.4f\n",
                  causal ? 1 : 0, median(gemm_ms), time_ms([&] { gemm128(grid_of(gemm128), stream.handle(), xv, wv, qkvv); }, stream, max_reps),
                  rng_gemm, fwd_none, fwd_bits);
    }
    const double g = median(gemm_ms), n0 = median(none), f = median(fused), ov = median(overlapped), se = median(serial),
                 ig = median(in_gemm);
    std::printf("E2E causal=%d p=%g M=%ld N=%ld K=%ld gemm_ms=%.4f none_ms=%.4f fused_ms=%.4f overlapped_ms=%.4f serial_bits_ms=%.4f "
                "gemm_rng_ms=%.4f fused_vs_none=%.3f overlapped_vs_none=%.3f serial_vs_none=%.3f gemm_rng_vs_none=%.3f\n",
                causal ? 1 : 0, p, static_cast<long>(M), static_cast<long>(N), static_cast<long>(Kd), g, n0, f, ov, se, ig, f / n0,
                ov / n0, se / n0, ig / n0);
    std::fflush(stdout);
  }
  return 0;
}

// --masks: the forward with library masks (issue 8) at S = 8k and 16k, D128, bf16, B*S = 16k,
// 16 heads; TFLOP/s count only the unmasked elements (4 * D per allowed (row, key)). Document
// masks use bench_document_lengths (bench/flex_masks.py builds the same documents for
// FlexAttention); data-dependent masks run the block-mask pre-pass first (not timed:
// FlexAttention's block mask is also built once and reused).
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

// --forward-variants: the forward at D64 S4k (full and causal) under a few schedules, with the
// output normalised by division (EXACT_NORMALIZE, which lets ptxas serialise the wgmma) or rcp;
// every variant compiled and checked first, then timed in 3 rotated rounds after the clock settled.
int bench_forward_variants(int max_reps, int64_t only_d, double dropout_p, bool only_default, const std::string& extra_meta) {
  const Buffers buf;
  runtime::Stream stream;
  struct Variant {
    int bm, bn, warps, stages;
    bool exact;
    int min_programs_per_sm = 0;  // CompileOptions::min_programs_per_sm (ptxas caps the registers)
    // RNG_WARPS (fused dropout on warps of their own: `warps` + rng_warps in all) and the roles'
    // setmaxnreg (MMA_REGISTERS / RNG_REGISTERS)
    int rng_warps = 0, mma_registers = 0, rng_registers = 0;
    bool pipeline_pv = false;  // PIPELINE_PV (the D 128 default's loop; with RNG_WARPS the producer is off)
  };
  // The first of each list is the API's default (attention::default_schedule); smaller tiles on 4
  // warps fit several programs per multiprocessor (more warps per scheduler to hide latency).
  // (D 64: without dropout the default is register-bound for two programs per SM, with dropout it
  // is 64 x 128 on 4 warps)
  const std::vector<Variant> d64{{128, 128, 8, 2, false, 2}, {128, 128, 8, 2, true},  {128, 128, 8, 2, false}, {128, 64, 8, 2, false},
                                 {64, 128, 4, 2, false},     {64, 128, 4, 2, true},   {64, 128, 4, 3, false},  {64, 64, 4, 2, false},
                                 {64, 32, 4, 2, false},      {64, 32, 4, 3, false},   {64, 128, 4, 2, false, 4}};
  const std::vector<Variant> d64_dropout{{64, 128, 4, 2, false},        {128, 128, 8, 2, false},          {128, 128, 8, 2, false, 2},
                                         {64, 128, 4, 2, false, 4},       {64, 64, 4, 2, false},            {64, 32, 4, 2, false},
                                         {64, 128, 4, 2, false, 0, 4},    {128, 128, 8, 2, false, 0, 4, 216, 72}};
  const std::vector<Variant> d128{{128, 128, 8, 2, false}, {128, 128, 8, 3, false}, {128, 64, 8, 2, false}, {128, 64, 8, 3, false},
                                  {64, 128, 4, 2, false}, {64, 64, 4, 2, false},
                                  {64, 64, 4, 3, false},   {64, 32, 4, 2, false},  {64, 32, 4, 3, false},  {64, 32, 4, 4, false}};
  const std::vector<Variant> d128_dropout{{128, 128, 8, 2, false}, {128, 128, 8, 2, false, 0, 4, 216, 72}, {128, 128, 8, 2, false, 0, 4, 232, 40},
                                          {64, 128, 4, 2, false, 0, 4}, {128, 128, 8, 2, false, 0, 4, 232, 40, true}};
  std::vector<int64_t> dims{64, 128};
  if (only_d) dims = {only_d};
  const std::vector<bool> dropouts{dropout_p > 0};
  for (int64_t D : dims)
    for (bool dropout : dropouts)
      for (bool causal : {false, true}) {
        const Config c{4096, D, causal};
        const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
        std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(double(D)))};
        if (dropout)
          add_dropout_key(args, dropout_p);
        const size_t out_elems = static_cast<size_t>(c.B() * c.S * c.H() * D);
        std::vector<uint16_t> reference, out(out_elems);
        // compiled and checked first, then timed in rotated rounds after the clock settled: timed
        // one by one, each right after its own compile (the GPU idle), they ran at burst clocks,
        // the first most (decision 099)
        struct Built {
          std::string name;
          std::unique_ptr<Function> fn;
          runtime::Grid grid;
          double max_diff = 0;
          std::vector<double> ms;
        };
        std::vector<Built> built;
        const std::vector<Variant>& variants = D == 64 ? (dropout ? d64_dropout : d64) : (dropout ? d128_dropout : d128);
        for (const Variant& v : variants) {
          if (only_default && &v != &variants.front()) break;  // --quick: the default alone (profiling)
          lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D},        {mn::kBlockM, v.bm},      {mn::kBlockN, v.bn},
                          {mn::kBshd, true},           {mn::kCausal, causal},     {mn::kDropout, dropout},   {mn::kExactNormalize, v.exact},
                          {mn::kPositiveScale, true}};  // (as the API launches it)
          for (const auto& [name, value] : parse_with(extra_meta)) meta.emplace_back(name, value);  // --with M[=0|1],..
          if (v.rng_warps)
            meta.insert(meta.end(), {{mn::kRngWarps, v.rng_warps}, {mn::kMmaRegisters, v.mma_registers}, {mn::kRngRegisters, v.rng_registers}});
          if (v.pipeline_pv) meta.emplace_back(mn::kPipelinePv, true);
          jit::CompileOptions o;
          o.num_warps = v.warps + v.rng_warps;
          o.pipeline.stages = v.stages;
          o.min_programs_per_sm = v.min_programs_per_sm;
          const std::string name = fmt::format("D={} causal={} dropout={} tile={}x{} warps={} stages={} exact={} min_programs_per_sm={} "
                                               "rng_warps={} registers={}/{}{}", D, causal ? 1 : 0, dropout ? 1 : 0, v.bm, v.bn, v.warps,
                                               v.stages, v.exact ? 1 : 0, v.min_programs_per_sm, v.rng_warps, v.mma_registers, v.rng_registers,
                                               v.pipeline_pv ? " PIPELINE_PV" : "");
          try {
            auto fn = std::make_unique<Function>(kernels::attention_forward(), meta, o);
            const runtime::Grid grid{lang::cdiv(c.S, v.bm), c.H(), c.B()};
            fn->launch(grid, stream.handle(), args);
            stream.synchronize();
            buf.o.download(out.data(), out_elems * 2);
            // every variant computes the same function (the dropout mask does not depend on tiles):
            // outputs may differ by accumulation order only
            double max_diff = 0;
            if (reference.empty()) reference = out;
            for (size_t i = 0; i < out_elems; i += 7)
              max_diff = std::max(max_diff, std::abs(double(bf16_to_float(out[i])) - double(bf16_to_float(reference[i]))));
            built.push_back({name, std::move(fn), grid, max_diff, {}});
          } catch (const std::exception& e) {
            std::printf("FWD_VARIANT %s failed: %s\n", name.c_str(), e.what());
          }
        }
        if (built.empty()) continue;
        settle([&] { built[0].fn->launch(built[0].grid, stream.handle(), args); }, stream);
        bench_util::rotated_rounds(3, static_cast<int>(built.size()), [&](int i) {
          Built& b = built[static_cast<size_t>(i)];
          b.ms.push_back(time_ms([&] { b.fn->launch(b.grid, stream.handle(), args); }, stream, max_reps));
        });
        const double default_ms = median(built[0].ms);
        for (const Built& b : built) {
          const double ms = median(b.ms);
          std::printf("FWD_VARIANT %s programs_per_sm=%d ms=%.4f tflops=%.1f vs_default=%.3f max_diff=%.3g\n", b.name.c_str(),
                      b.fn->gpu_kernel().max_resident_per_sm(), ms, c.fwd_flops() / (ms * 1e-3) / 1e12, default_ms / ms, b.max_diff);
        }
        std::fflush(stdout);
      }
  return 0;
}

// --backward-ab META: the dK/dV kernel alone (recompute, or --reduction atomic; the API's default
// tiles for it) with a bool meta
// off and on, D 64/128, S 4k, full and causal, alternated rounds; dK and dV compared bit for bit.
// LSE from the forward; Delta from the preprocess kernel, as the API runs them.

// --dq-variants [--dropout P]: the dQ kernel (recompute) alone at other BLOCK_M / BLOCK_N / warps /
// stages than the default (each on its own grid), D 64/128 S4k, full and causal, with fused dropout
// when P > 0 (the default then is dropout's); outputs compared bit for bit (a different BLOCK_N sums
// in another order: expect differences there).
// --dq-ab META [--dropout P] [--with M,..] [--head-dim D]: the dQ kernel at the API's default tiles
// with bool META off / on (--with: on in both; DROPOUT_BITS reads random mask words), S 4k, full and
// causal; outputs compared bit for bit.
int bench_dq_variants(int max_reps, double dropout_p, int64_t only_d, const std::string& ab_meta = {}, const std::string& with_meta = {}) {
  const bool dropout = dropout_p > 0;
  const Buffers buf;
  runtime::Stream stream;
  struct Variant {
    int bn, warps, stages, bm = 0;  // bm 0: the default's BLOCK_M
  };
  for (int64_t D : only_d ? std::vector<int64_t>{only_d} : std::vector<int64_t>{64, 128})
    for (bool causal : {false, true}) {
      const Config c{4096, D, causal};
      const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
      const DeltaBuffer delta = forward_and_delta(buf, c, stream);
      const attention::Tensor& delta_view = delta.view;
      const attention::Schedule sch = attention::default_schedule(attention::Pass::bwd_dq, ir::DType::bf16, static_cast<int>(D), causal,
                                                                  false, attention::DqReduction::recompute, dropout);
      const auto make = [&](Variant v, std::optional<bool> ab_on = std::nullopt) {
        lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D},      {mn::kBlockM, v.bm ? v.bm : sch.block_m},
                        {mn::kBlockN, v.bn},          {mn::kBshd, true},       {mn::kCausal, causal}};
        if (dropout) meta.emplace_back(mn::kDropout, true);
        for (const auto& [name, value] : bench_util::parse_with(with_meta)) meta.emplace_back(name, value);
        if (ab_on)
          for (const auto& [name, value] : bench_util::parse_with(ab_meta)) meta.emplace_back(name, *ab_on && value);
        jit::CompileOptions o;
        o.num_warps = v.warps;
        o.pipeline.stages = v.stages;
        return Function(kernels::attention_backward_dq(), meta, o);
      };
      std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), dO.view(), L.view(), delta_view.view(), dQ.view(),
                                           static_cast<float>(1 / std::sqrt(double(D)))};
      if (dropout) add_dropout_key(args, dropout_p);
      const bool bits = meta_flag(make({sch.block_n, sch.num_warps, sch.stages}), mn::kDropoutBits);
      const auto bits_buffer = add_random_mask_words(args, c, bits);
      if (!ab_meta.empty()) {
        std::vector<Function> fns;
        for (bool on : {false, true}) fns.push_back(make({sch.block_n, sch.num_warps, sch.stages}, on));
        // (--dq-ab DROPOUT_BITS: only the on variant takes the words; their random values differ from the
        // fused mask, so the outputs do too)
        std::array<std::vector<runtime::DeviceArg>, 2> variant_args{args, args};
        const auto ab_words = add_random_mask_words(variant_args[1], c, !bits && meta_flag(fns[1], mn::kDropoutBits));
        const runtime::Grid grid{lang::cdiv(c.S, sch.block_m), c.H(), c.B()};
        const auto launch = [&](size_t i) { return [&, i] { fns[i].launch(grid, stream.handle(), variant_args[i]); }; };
        const AbResult r = ab_measure_launches({launch(0), launch(1)}, stream, {&buf.dq}, static_cast<size_t>(c.B() * c.S * c.H() * D * 2),
                                               max_reps);
        std::printf("DQ_AB %s D=%ld causal=%d dropout=%g bits=%d tiles=%dx%d/%dw/%ds registers=%d/%d off_ms=%.4f on_ms=%.4f speedup=%.3f "
                    "outputs_identical=%d\n",
                    ab_meta.c_str(), static_cast<long>(D), causal ? 1 : 0, dropout ? dropout_p : 0.0, bits ? 1 : 0, sch.block_m, sch.block_n,
                    sch.num_warps, sch.stages, fns[0].compiled().info.registers, fns[1].compiled().info.registers, r.off_ms, r.on_ms,
                    r.off_ms / r.on_ms, r.identical ? 1 : 0);
        std::fflush(stdout);
        continue;
      }
      for (Variant v : {Variant{32, sch.num_warps, sch.stages}, Variant{sch.block_n, sch.num_warps, 1}, Variant{32, sch.num_warps, 3},
                        Variant{128, sch.num_warps, sch.stages}, Variant{sch.block_n, 8, sch.stages, 128},
                        Variant{sch.block_n, 8, 3, 128}, Variant{128, 8, sch.stages, 128}, Variant{sch.block_n, 8, sch.stages}}) {
        std::vector<Function> fns;
        fns.push_back(make({sch.block_n, sch.num_warps, sch.stages}));
        fns.push_back(make(v));
        // (each variant on its own grid: BLOCK_M sets the programs)
        const int vbm = v.bm ? v.bm : sch.block_m;
        AbResult r;
        try {  // (a Function compiles at its first launch: a variant may not fit, e.g. D 256's shared memory)
          r = ab_measure_grids(fns, {runtime::Grid{lang::cdiv(c.S, sch.block_m), c.H(), c.B()}, runtime::Grid{lang::cdiv(c.S, vbm), c.H(), c.B()}},
                               stream, args, {&buf.dq}, static_cast<size_t>(c.B() * c.S * c.H() * D * 2), max_reps);
        } catch (const std::exception& e) {
          std::printf("DQ_VARIANT D=%ld causal=%d variant=%dx%d/%dw/%ds skipped=\"%s\"\n", static_cast<long>(D), causal ? 1 : 0, vbm, v.bn,
                      v.warps, v.stages, e.what());
          std::fflush(stdout);
          continue;
        }
        std::printf("DQ_VARIANT D=%ld causal=%d dropout=%g default=%dx%d/%dw/%ds variant=%dx%d/%dw/%ds programs_per_sm=%d default_ms=%.4f variant_ms=%.4f "
                    "speedup=%.3f outputs_identical=%d\n",
                    static_cast<long>(D), causal ? 1 : 0, dropout ? dropout_p : 0.0, sch.block_m, sch.block_n, sch.num_warps, sch.stages, vbm, v.bn, v.warps,
                    v.stages, fns[1].gpu_kernel().max_resident_per_sm(), r.off_ms, r.on_ms, r.off_ms / r.on_ms, r.identical ? 1 : 0);
        std::fflush(stdout);
      }
    }
  return 0;
}

// --mask-kernel: the dropout_mask kernel alone (D128 S4k's mask: B 4 x H 16 x 4096 x 4096 bits) per
// tiling and warp count, bits compared with the library default's.
int bench_mask_kernel(double p, int max_reps) {
  const int64_t BH = 64, S = 4096, words = S / 32;
  const size_t bytes = static_cast<size_t>(BH * S * words) * 4;
  DeviceBuffer bits(bytes);
  runtime::Stream stream;
  const attention::Tensor view = attention::contiguous(bits.ptr(), ir::DType::u32, {BH, S, words});
  const runtime::TensorView bv = view.view();
  std::vector<uint32_t> want(bytes / 4), got(bytes / 4);
  struct Tiling {
    int bm, bw, warps;
  };
  const library::LibraryKernel* lib = library::find("dropout_mask");
  bool first = true;
  for (Tiling t : {Tiling{64, 4, lib->num_warps}, Tiling{32, 4, 4}, Tiling{64, 2, 4}, Tiling{64, 8, 4}, Tiling{128, 4, 4}, Tiling{128, 4, 8},
                   Tiling{64, 8, 8}, Tiling{128, 8, 8}, Tiling{32, 8, 4}, Tiling{16, 8, 4}}) {
    jit::CompileOptions o;
    o.num_warps = t.warps;
    Function mask(kernels::dropout_mask(), {{mn::kBlockM, t.bm}, {mn::kBlockW, t.bw}}, o);
    const runtime::Grid grid{lang::cdiv(S, t.bm), lang::cdiv(words, t.bw), BH};
    const auto run = [&] {
      mask(grid, stream.handle(), bv, static_cast<int32_t>(S), uint32_t{1234}, uint32_t{0}, uint32_t{3}, uint32_t{0},
           kernels::dropout_keep_threshold(p), no_rng_state, 0u);
    };
    run();
    stream.synchronize();
    bits.download((first ? want : got).data(), bytes);
    const bool same = first || got == want;
    first = false;
    std::vector<double> ms;
    for (int round = 0; round < 3; ++round) ms.push_back(time_ms(run, stream, max_reps));
    std::printf("MASK_KERNEL BLOCK_M=%d BLOCK_W=%d warps=%d registers=%d programs_per_sm=%d ms=%.4f bits_identical=%d\n", t.bm, t.bw, t.warps,
                mask.compiled().info.registers, mask.gpu_kernel().max_resident_per_sm(), median(ms), same ? 1 : 0);
    std::fflush(stdout);
  }
  return 0;
}

int bench_backward_ab(const std::string& meta_name, int max_reps, attention::DqReduction reduction, const std::string& with_meta,
                      const std::optional<attention::Schedule>& on_schedule, double dropout_p, int64_t only_d) {
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
      const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
      const DeltaBuffer delta = forward_and_delta(buf, c, stream);
      const attention::Tensor& delta_view = delta.view;
      const attention::Schedule base =
          attention::default_schedule(attention::Pass::bwd_dkdv, ir::DType::bf16, static_cast<int>(D), causal, false, reduction, dropout);
      const std::array<attention::Schedule, 2> schedules{base, on_schedule.value_or(base)};
      std::vector<Function> fns;
      for (bool on : {false, true}) {
        const attention::Schedule& sch = schedules[on ? 1 : 0];
        lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D}, {mn::kBlockM, sch.block_m}, {mn::kBlockN, sch.block_n},
                        {mn::kBshd, true}, {mn::kCausal, causal}};
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
          grids[i] = meta_flag(fns[i], mn::kPersistent) ? fns[i].gpu_kernel().persistent_grid(key_tiles * c.H() * c.B())
                                                        : runtime::Grid{key_tiles, c.H(), c.B()};
        }
        const auto launch = [&](size_t i) { return [&, i] { fns[i].launch(grids[i], stream.handle(), variant_args[i]); }; };
        r = ab_measure_launches({launch(0), launch(1)}, stream, {&buf.dk, &buf.dv}, static_cast<size_t>(c.B() * c.S * c.H() * D * 2),
                                max_reps, ordered ? zero_semaphores : std::function<void()>{});
      } catch (const std::exception& e) {
        std::printf("BACKWARD_AB %s kernel=attention_bwd_dkdv D=%ld causal=%d skipped=\"%s\"\n", meta_name.c_str(), static_cast<long>(D),
                    causal ? 1 : 0, e.what());
        continue;
      }
      const attention::Schedule& on_s = schedules[1];
      std::printf("BACKWARD_AB %s kernel=attention_bwd_dkdv reduction=%s dropout=%g D=%ld causal=%d on_tiles=%dx%d/%dw/%ds off_ms=%.4f on_ms=%.4f "
                  "speedup=%.3f outputs_identical=%d\n",
                  meta_name.c_str(), ordered ? "ordered" : atomic ? "atomic" : "recompute", dropout ? dropout_p : 0.0, static_cast<long>(D), causal ? 1 : 0, on_s.block_m, on_s.block_n,
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

const int64_t kDocumentLengths[] = {1024, 3072, 512, 2560, 1536, 4096, 768, 2816};

int bench_masks(int max_reps) {
  using kernels::MaskKind;
  const ir::DType dt = ir::DType::bf16;
  const Buffers buf;
  runtime::Stream stream;
  struct MaskRun {
    const char* label;
    MaskKind kind;
    int64_t window_left = 0, window_right = 0, global = 0;
  };
  const MaskRun runs[] = {{"causal", MaskKind::causal},
                          {"causal_sliding_window_1024", MaskKind::causal_sliding_window, 1023},
                          {"sliding_window_1024", MaskKind::sliding_window, 512, 511},
                          {"causal_document", MaskKind::causal_document},
                          {"document", MaskKind::document},
                          {"global_64_sliding_window_1024", MaskKind::global_sliding_window, 512, 511, 64},
                          {"prefix_lm_half", MaskKind::prefix_lm}};
  for (int64_t S : {8192, 16384}) {
    const Config c{S, 128, false};
    const int64_t B = c.B(), H = c.H(), D = c.D, BM = 128, BN = 128, nb = (S + 127) / 128;
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
    // document ids [B, S] and prefix lengths [B]
    std::vector<int32_t> docs;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0, d = 0, left = kDocumentLengths[0]; t < S; ++t) {
        if (left == 0) ++d, left = kDocumentLengths[d % 8];
        docs.push_back(static_cast<int32_t>(d)), --left;
      }
    const std::vector<int32_t> prefix(static_cast<size_t>(B), static_cast<int32_t>(S / 2));
    DeviceBuffer d_docs(docs.size() * 4), d_prefix(prefix.size() * 4);
    d_docs.upload(docs.data(), docs.size() * 4);
    d_prefix.upload(prefix.data(), prefix.size() * 4);
    DeviceBuffer lists(static_cast<size_t>(B * nb * (nb + 1) * 2) * 4 + static_cast<size_t>(B * nb * nb));
    for (const MaskRun& r : runs) {
      kernels::MaskSpec spec;
      spec.kind = r.kind;
      spec.window_left = r.window_left, spec.window_right = r.window_right, spec.global_tokens = r.global;
      const kernels::MaskData data{{docs, {B, S}}, {prefix, {B}}, {}};
      const int64_t allowed = kernels::allowed_count(spec, data, {B, 1, S, S}) * H;  // no kind here depends on the head
      lang::Meta meta{{mn::kDtype, dt}, {mn::kHeadDim, D}, {mn::kBlockM, BM}, {mn::kBlockN, BN}, {mn::kBshd, true}, {mn::kMask, static_cast<int>(r.kind)},
                      {mn::kPositiveScale, true}};  // as the API launches it for softmax_scale > 0
      jit::CompileOptions o;
      o.num_warps = 8;
      o.pipeline.stages = 2;
      Function fwd(kernels::attention_forward(), meta, o);
      std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(128.0))};
      const std::array<int64_t, 2> doc_sizes{B, S}, doc_strides{S, 1};
      const std::array<int64_t, 1> pre_sizes{B}, pre_strides{1};
      const runtime::TensorView docs_v{ir::DType::i32, doc_sizes, doc_strides, d_docs.ptr(), 0},
          prefix_v{ir::DType::i32, pre_sizes, pre_strides, d_prefix.ptr(), 0};
      for (const std::string& name : kernels::mask_parameter_names(r.kind)) {
        if (name == "mask_window_left") args.emplace_back(static_cast<int32_t>(r.window_left));
        else if (name == "mask_window_right") args.emplace_back(static_cast<int32_t>(r.window_right));
        else if (name == "mask_global_tokens") args.emplace_back(static_cast<int32_t>(r.global));
        else if (name == "mask_doc_ids") args.emplace_back(docs_v);
        else if (name == "mask_prefix_lengths") args.emplace_back(prefix_v);
        else throw std::logic_error("bench_masks: no argument for " + name);
      }
      // the pre-pass's lists: [B, 1, nb] counts, [B, 1, nb, nb] indices (document masks: per batch)
      const std::array<int64_t, 4> cls_sizes{B, 1, nb, nb}, cls_strides{nb * nb, nb * nb, nb, 1};
      const std::array<int64_t, 3> num_sizes{B, 1, nb}, num_strides{nb, nb, 1};
      const uint64_t base = lists.ptr(), n_bytes = static_cast<uint64_t>(B * nb) * 4, i_bytes = n_bytes * static_cast<uint64_t>(nb);
      const runtime::TensorView num{ir::DType::i32, num_sizes, num_strides, base, 0},
          idx{ir::DType::i32, cls_sizes, cls_strides, base + n_bytes, 0},
          full_num{ir::DType::i32, num_sizes, num_strides, base + n_bytes + i_bytes, 0},
          full_idx{ir::DType::i32, cls_sizes, cls_strides, base + 2 * n_bytes + i_bytes, 0},
          classes{ir::DType::u8, cls_sizes, cls_strides, base + 2 * (n_bytes + i_bytes), 0};
      double prepass_ms = 0, classes_ms = 0;  // kinds with tile intervals have no pre-pass
      if (!kernels::mask_has_tile_intervals(r.kind)) {
        // the pre-pass: classes (one program per tile), then the lists (one per query tile)
        // at the API's TILES (kernels::kBlockClassTiles key tiles per program)
        const int64_t tiles = kernels::kBlockClassTiles, gy = (nb + tiles - 1) / tiles;
        Function classify(kernels::attention_block_classes(),
                          {{mn::kBlockM, BM}, {mn::kBlockN, BN}, {mn::kMask, static_cast<int>(r.kind)}, {mn::kTiles, tiles}}, o);
        jit::CompileOptions lo;
        lo.num_warps = 4;
        Function build_lists(kernels::attention_block_lists(), {{mn::kKvMajor, false}}, lo);
        std::vector<runtime::DeviceArg> cargs{classes, static_cast<int32_t>(S), static_cast<int32_t>(S)};
        cargs.insert(cargs.end(), args.begin() + 6, args.end());
        const std::vector<runtime::DeviceArg> largs{classes, num, idx, full_num, full_idx};
        const auto pre = [&] {
          classify.launch({nb, gy, B}, stream.handle(), cargs);
          build_lists.launch({nb, 1, B}, stream.handle(), largs);
        };
        pre();
        // what one pre-pass costs (the backward runs one more per call, at its kernels' tiles), and
        // its classification alone
        prepass_ms = time_ms(pre, stream, max_reps);
        classes_ms = time_ms([&] { classify.launch({nb, gy, B}, stream.handle(), cargs); }, stream, max_reps);
        for (int t : {1, 16}) {  // the classification at other TILES, for comparison
          Function ct(kernels::attention_block_classes(), {{mn::kBlockM, BM}, {mn::kBlockN, BN}, {mn::kMask, static_cast<int>(r.kind)}, {mn::kTiles, t}}, o);
          const int64_t gt = (nb + t - 1) / t;
          ct.launch({nb, gt, B}, stream.handle(), cargs);
          std::printf("MASK_CLASSES name=%s S=%ld tiles=%d ms=%.4f\n", r.label, static_cast<long>(S), t,
                      time_ms([&] { ct.launch({nb, gt, B}, stream.handle(), cargs); }, stream, max_reps));
        }
        for (const auto& t : {num, idx, full_num, full_idx}) args.emplace_back(t);
      }
      const runtime::Grid grid{nb, H, B};
      // (the attention timings queued and settled, as bench/flex_masks.py times FlexAttention: decision 099)
      const double ms = queued_ms([&] { fwd.launch(grid, stream.handle(), args); }, stream);
      const double tflops = 4.0 * static_cast<double>(D) * static_cast<double>(allowed) / (ms * 1e-3) / 1e12;
      // The backward through the API (its pre-passes included: dK/dV's and dQ's lists are built at
      // their own tiles on every call), after one forward through the API for O and LSE.
      attention::Options opts;
      if (r.kind == MaskKind::causal) {
        opts.causal = true;
      } else {
        attention::Mask m;
        m.spec = spec;
        if (kernels::mask_uses_doc_ids(r.kind)) m.doc_ids = attention::contiguous(d_docs.ptr(), ir::DType::i32, {B, S});
        if (r.kind == MaskKind::prefix_lm) m.prefix_lengths = attention::contiguous(d_prefix.ptr(), ir::DType::i32, {B});
        opts.mask = m;
      }
      // bwd: the default (recompute: deterministic, dQ by its own kernel); bwd_atomic: dQ's parts
      // added into a workspace by the dK/dV kernel (5 matmuls, one pre-pass; FlexAttention's kind)
      attention::Options atomic = opts;
      atomic.dq_reduction = attention::DqReduction::atomic;
      DeviceBuffer ws(std::max({attention::backward_workspace_bytes(Q, K, opts), attention::backward_workspace_bytes(Q, K, atomic),
                                attention::forward_workspace_bytes(Q, K, opts)}) + 256);
      const attention::Workspace w{ws.ptr(), ws.bytes()};
      attention::forward(Q, K, V, O, L, opts, stream.handle(), {ws.ptr(), ws.bytes()});
      const double bwd_ms = queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), w); }, stream);
      const double bwd_atomic_ms =
          queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, atomic, stream.handle(), w); }, stream);
      // bwd_prebuilt: the default backward with a block mask built once (build_block_mask, not
      // timed: FlexAttention's usage, one block mask per step for every layer)
      double bwd_prebuilt_ms = bwd_ms;
      if (const size_t bm_bytes = attention::block_mask_bytes(Q, K, opts); bm_bytes > 0) {
        DeviceBuffer bm_storage(bm_bytes);
        const attention::BlockMask bm = attention::build_block_mask(Q, K, opts, {bm_storage.ptr(), bm_storage.bytes()}, stream.handle());
        attention::Options prebuilt = opts;
        prebuilt.block_mask = &bm;
        bwd_prebuilt_ms = queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, prebuilt, stream.handle(), w); }, stream);
      }
      const double bwd_flop = 2.5 * 4.0 * static_cast<double>(D) * static_cast<double>(allowed);
      std::printf("MASK name=%s S=%ld B=%ld H=%ld D=%ld density=%.4f fwd_ms=%.4f fwd_tflops=%.1f bwd_ms=%.4f bwd_tflops=%.1f "
                  "bwd_atomic_ms=%.4f bwd_atomic_tflops=%.1f bwd_prebuilt_ms=%.4f bwd_prebuilt_tflops=%.1f fwd_prepass_ms=%.4f "
                  "fwd_prepass_classes_ms=%.4f\n",
                  r.label, static_cast<long>(S), static_cast<long>(B), static_cast<long>(H), static_cast<long>(D),
                  static_cast<double>(allowed) / (static_cast<double>(B * H) * double(S) * double(S)), ms, tflops, bwd_ms,
                  bwd_flop / (bwd_ms * 1e-3) / 1e12, bwd_atomic_ms, bwd_flop / (bwd_atomic_ms * 1e-3) / 1e12, bwd_prebuilt_ms,
                  bwd_flop / (bwd_prebuilt_ms * 1e-3) / 1e12, prepass_ms, classes_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// --check DIR: cases.txt has one case per line, "key=value" fields:
//   name dtype(bf16|f16) B Hq Hkv Sq Sk D causal(0|1) scale layout(bshd|bhsd) [varlen=1 nseq total_q total_k max_q max_k]
//   [dropout_p seed offset: dropout; DIR/<name>.mask.bin then receives the forward's keep-mask, u8
//   [B * Hq, Sq, Sk] (varlen [nseq * Hq, max_q, max_k]; entries the forward does not visit: 0xFF)]
// Inputs DIR/<name>.{q,k,v,do}.bin (raw, contiguous in the layout; varlen: packed [total, H, D]),
// DIR/<name>.{cu_q,cu_k}.bin (i32, varlen). Outputs DIR/<name>.{o,dq,dk,dv}.bin in the inputs'
// layout and DIR/<name>.lse.bin (f32 [B, Hq, Sq]; varlen [Hq, total_q]).

std::vector<char> read_file(const std::string& path, size_t bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<char> data(bytes);
  f.read(data.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(f.gcount()) != bytes)
    throw std::runtime_error(fmt::format("{}: expected {} bytes, read {}", path, bytes, f.gcount()));
  return data;
}

void write_file(const std::string& path, const DeviceBuffer& buf, size_t bytes) {
  std::vector<char> data(bytes);
  buf.download(data.data(), bytes);
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(bytes));
  if (!f) throw std::runtime_error("cannot write " + path);
}

DeviceBuffer upload_file(const std::string& path, size_t bytes) {
  DeviceBuffer b(bytes);
  const auto data = read_file(path, bytes);
  b.upload(data.data(), bytes);
  return b;
}

DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xFF);
  return b;
}

int check(const std::string& dir) {
  std::ifstream list(dir + "/cases.txt");
  if (!list) {
    std::fprintf(stderr, "cannot open %s/cases.txt\n", dir.c_str());
    return 2;
  }
  int failures = 0;
  for (std::string line; std::getline(list, line);) {
    if (line.empty()) continue;
    std::map<std::string, std::string> kv;
    std::istringstream in(line);
    for (std::string field; in >> field;) {
      const auto eq = field.find('=');
      if (eq != std::string::npos) kv[field.substr(0, eq)] = field.substr(eq + 1);
    }
    const std::string name = kv["name"];
    try {
      auto num = [&](const char* key) {
        if (!kv.contains(key)) throw std::runtime_error(fmt::format("case '{}' has no {}", name, key));
        return std::stoll(kv[key]);
      };
      const ir::DType dt = kv["dtype"] == "f16" ? ir::DType::f16 : ir::DType::bf16;
      const int64_t Hq = num("Hq"), Hkv = num("Hkv"), D = num("D"), es = ir::byte_size(dt);
      const bool varlen = kv["varlen"] == "1", bhsd = kv["layout"] == "bhsd";
      attention::Options opts;
      opts.causal = num("causal") != 0;
      if (kv.contains("scale")) opts.softmax_scale = std::stof(kv["scale"]);
      if (kv.contains("dropout_p")) {
        opts.dropout_p = std::stod(kv["dropout_p"]);
        opts.seed = std::stoull(kv["seed"]);
        opts.offset = std::stoull(kv["offset"]);
      }
      const std::string base = dir + "/" + name;
      int64_t nq = 0, nk = 0, nlse = 0;  // elements of q, k, lse
      int64_t B = 0, Sq = 0, Sk = 0, total_q = 0, total_k = 0, nseq = 0;
      if (varlen) {
        nseq = num("nseq"), total_q = num("total_q"), total_k = num("total_k");
        nq = total_q * Hq * D, nk = total_k * Hkv * D, nlse = Hq * total_q;
      } else {
        B = num("B"), Sq = num("Sq"), Sk = num("Sk");
        nq = B * Sq * Hq * D, nk = B * Sk * Hkv * D, nlse = B * Hq * Sq;
      }
      const auto qb = static_cast<size_t>(nq * es), kb = static_cast<size_t>(nk * es), lb = static_cast<size_t>(nlse * 4);
      DeviceBuffer q = upload_file(base + ".q.bin", qb), k = upload_file(base + ".k.bin", kb), v = upload_file(base + ".v.bin", kb),
                   dout = upload_file(base + ".do.bin", qb);
      DeviceBuffer o = poisoned(qb), dq = poisoned(qb), dk = poisoned(kb), dv = poisoned(kb), lse = poisoned(lb);
      DeviceBuffer cuq, cuk;
      // Logical [B, S, H, D] views; [B, H, S, D] files are passed as permuted views.
      auto view = [&](const DeviceBuffer& b, int64_t S, int64_t H) {
        if (varlen) return attention::contiguous(b.ptr(), dt, {S, H, D});
        if (bhsd) return attention::permute(attention::contiguous(b.ptr(), dt, {B, H, S, D}), {0, 2, 1, 3});
        return attention::contiguous(b.ptr(), dt, {B, S, H, D});
      };
      const int64_t sq = varlen ? total_q : Sq, sk = varlen ? total_k : Sk;
      const auto L = varlen ? attention::contiguous(lse.ptr(), ir::DType::f32, {Hq, total_q})
                            : attention::contiguous(lse.ptr(), ir::DType::f32, {B, Hq, Sq});
      if (varlen) {
        const auto cb = static_cast<size_t>((nseq + 1) * 4);
        cuq = upload_file(base + ".cu_q.bin", cb);
        cuk = upload_file(base + ".cu_k.bin", cb);
        opts.cu_seqlens_q = attention::contiguous(cuq.ptr(), ir::DType::i32, {nseq + 1});
        opts.cu_seqlens_k = attention::contiguous(cuk.ptr(), ir::DType::i32, {nseq + 1});
        opts.max_seqlen_q = num("max_q");
        opts.max_seqlen_k = num("max_k");
      }
      const auto Q = view(q, sq, Hq), K = view(k, sk, Hkv), V = view(v, sk, Hkv), O = view(o, sq, Hq);
      DeviceBuffer mask;
      size_t mask_bytes = 0;
      if (opts.dropout_p > 0) {
        const int64_t mb = (varlen ? nseq : B) * Hq, mq = varlen ? num("max_q") : Sq, mk = varlen ? num("max_k") : Sk;
        mask_bytes = static_cast<size_t>(mb * mq * mk);
        mask = poisoned(mask_bytes);
        opts.dropout_mask = attention::contiguous(mask.ptr(), ir::DType::u8, {mb, mq, mk});
      }
      attention::forward(Q, K, V, O, L, opts);
      opts.dropout_mask.reset();
      if (mask_bytes) write_file(base + ".mask.bin", mask, mask_bytes);
      const bool bwd = attention::backward_available() && (!varlen || attention::varlen_supported(true));
      if (bwd) attention::backward(Q, K, V, O, view(dout, sq, Hq), L, view(dq, sq, Hq), view(dk, sk, Hkv), view(dv, sk, Hkv), opts);
      write_file(base + ".o.bin", o, qb);
      write_file(base + ".lse.bin", lse, lb);
      if (bwd) {
        write_file(base + ".dq.bin", dq, qb);
        write_file(base + ".dk.bin", dk, kb);
        write_file(base + ".dv.bin", dv, kb);
      }
      std::printf("ran %s%s\n", name.c_str(), bwd ? "" : " (forward only)");
    } catch (const std::exception& e) {
      ++failures;
      std::printf("FAILED %s: %s\n", name.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int run_cp_bench(int argc, char** argv);  // attention_cp.cpp
namespace tilejit::attention_bench {
int bench_build_ab(const std::string& path, int max_reps);  // attention_build_ab.cpp
int bench_timing_ab(int max_reps);                          // attention_timing_ab.cpp
}

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
  attention::DqReduction ab_reduction = attention::DqReduction::recompute;  // --backward-ab ... --reduction atomic|ordered
  std::string check_dir;
  double dropout_p = -1;
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
    else if (a == "--e2e-only") e2e_only = true;
    else if (a == "--phases") phases = true;
    else if (a == "--mask-kernel") mask_kernel = true;
    else if (a == "--dq-variants") dq_variants = true;
    else if (a == "--dq-ab" && i + 1 < argc) dq_ab = argv[++i];
    else if (a == "--pipeline-ab") schedule_ab = mn::kPipelineQk;
    else if (a == "--schedule-ab" && i + 1 < argc) schedule_ab = argv[++i];
    else if (a == "--backward-ab" && i + 1 < argc) backward_ab = argv[++i];
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
      std::fprintf(stderr, "usage: %s [--quick] [--reps N] [--dtype bf16|f16] [--gqa 1|2|4|8] | --dropout [P] [--schedule BM,BN,W,S] [--e2e-only] [--phases] [--head-dim D] | --mask-kernel | --dq-variants [--dropout P] [--head-dim D] | --dq-ab META [--dropout P] [--with M,..] [--head-dim D] | --tool-ab | --pairs-ab | --build-ab OTHER.tjb | --meta-ab META [--kernels fwd,dkdv,dq] | --forward-variants [--head-dim D] [--dropout P] | --masks | --schedule-ab META | --backward-ab META [--dropout P] [--head-dim D] | --deterministic [--head-dim D] [--seq S] [--mode KEY] [--causal 0|1] [--schedule BM,BN,W,S] | --check DIR | "
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
    if (!backward_ab.empty()) return bench_backward_ab(backward_ab, reps, ab_reduction, with_meta, schedule, dropout_p, only_d);
    if (dropout_p >= 0) return bench_dropout(dropout_p, reps, schedule, e2e_only, only_d ? only_d : 128, phases);
    if (masks) return bench_masks(reps);
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
