// attention_bench --dropout: fused and precomputed dropout against none, forward and backward (and
// the backward's phases), then the QKV GEMM + attention end to end.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "api/attention.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/dropout_mask.hpp"
#include "jit/compile.hpp"
#include "kernels/gemm.hpp"
#include "api/registry.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/function.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "kernels/meta_names.hpp"
#include "bench/bench_util.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"

namespace tilejit::attention_bench {

namespace {
namespace mn = tilejit::kernels::meta_name;
}  // namespace

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

}  // namespace tilejit::attention_bench
