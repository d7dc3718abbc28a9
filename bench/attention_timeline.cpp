// bench/attention_timeline: where each consumer warpgroup of the forward spends a key block, from
// the kernel's own cycle stamps (attention_fwd's TIMELINE meta, lang::timestamp). One launch at
// the default D128 schedule (persistent as the API launches it: without dropout), then per
// warpgroup the median cycles of each phase of a key block over every tile, how often the two
// warpgroups' softmaxes run at once (FlashAttention-3's ping-pong wants never), and a tile's
// prologue (to its first loop block), epilogue (after its last) and, persistent, the gap before the
// program's next tile.
//
//   attention_timeline [--seq S] [--causal] [--dropout P] [--persistent 0|1] [--with A=1,B=0]
//   attention_timeline --backward [--head-dim D] [--seq S] [--causal] [--reduction recompute|atomic|ordered] [--with ...]
//                                   [--stages N]
//
// --backward: the dK/dV kernel (DkdvConfig::timeline) at the API's schedule and ring options for the
// reduction (default: the API's for the shape), alone: per consumer warpgroup the median cycles of
// each phase of a query block visit (and their means and the visit's quantiles: a median hides slow
// visits), a key tile's prologue (start -> first visit) and epilogue (last
// visit -> dK, dV stored). LSE is log S + 1/2 (the scores of unit normal inputs), Delta 0.
//
// Phases of key block j (forward_schedules.cpp): issue (top -> S_j and P_{j-1} V_{j-1} issued),
// S wait (-> S_j landed and its row max taken), softmax (-> P_j ready), rescale (-> O rescaled,
// after P_{j-1} V_{j-1} landed). Cycles are one multiprocessor's clock: programs are compared only
// with themselves.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/attention.hpp"
#include "api/attention/internal.hpp"
#include "bench/bench_util.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/meta_names.hpp"
#include "runtime/driver.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/function.hpp"

using namespace tilejit;
namespace mn = kernels::meta_name;

namespace {

constexpr int64_t kStamps = kernels::ForwardConfig::kTimelineStamps, kWarpSlots = 32;

struct Options {
  int64_t seq = 4096, head_dim = 128, tokens = 16384, hidden = 2048;
  bool causal = false;
  bool backward = false;
  int stages = 0;  // --backward: the compile option's stages (0: the API's schedule; the plan may take fewer)
  std::string reduction;  // --backward: recompute, atomic, ordered (empty: the API's default)
  double dropout = 0;
  int persistent = -1;  // -1: as the API (without dropout)
  std::string with;  // "A=1,B=0": bool metas on top of the default schedule
};

double median(std::vector<double> v) { return v.empty() ? NAN : bench_util::median(std::move(v)); }
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / static_cast<double>(v.size());
}
// the q-quantile (0..1) of v
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

int run(const Options& o) {
  const int64_t S = o.seq, D = o.head_dim, H = o.hidden / D, B = std::max<int64_t>(1, o.tokens / S);
  const attention::Schedule sch = attention::default_schedule(attention::Pass::forward, ir::DType::bf16, static_cast<int>(D), o.causal);
  lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D},     {mn::kBlockM, sch.block_m}, {mn::kBlockN, sch.block_n},
                  {mn::kBshd, true},             {mn::kCausal, o.causal}, {mn::kDropout, o.dropout > 0}, {mn::kPositiveScale, true},
                  {mn::kTimeline, true}};
  const bool persistent = o.persistent < 0 ? o.dropout == 0 : o.persistent == 1;
  meta.emplace_back(mn::kPersistent, persistent);
  for (const auto& [name, value] : bench_util::parse_with(o.with)) meta.emplace_back(name, value);
  jit::CompileOptions co;
  co.num_warps = sch.num_warps;
  co.pipeline.stages = sch.stages;
  Function fwd(kernels::attention_forward(), meta, co);

  const size_t bytes = static_cast<size_t>(B * S * H * D * 2);
  runtime::DeviceBuffer q = bench_util::random_buffer(bytes, ir::DType::bf16, 1), k = bench_util::random_buffer(bytes, ir::DType::bf16, 2),
                        v = bench_util::random_buffer(bytes, ir::DType::bf16, 3), out(bytes), lse(static_cast<size_t>(B * H * S * 4));
  const int64_t tiles = lang::cdiv(S, sch.block_m), programs = tiles * H * B;  // (programs = tiles when not persistent)
  // (one spare tile's rows: OVERLAP_TILES stamps the places that are no tile there)
  runtime::DeviceBuffer stamps(static_cast<size_t>((programs + 1) * kStamps * kWarpSlots * 8));
  const auto t4 = [&](const runtime::DeviceBuffer& b) { return attention::contiguous(b.ptr(), ir::DType::bf16, {B, S, H, D}); };
  const attention::Tensor Q = t4(q), K = t4(k), V = t4(v), O = t4(out), L = attention::contiguous(lse.ptr(), ir::DType::f32, {B, H, S});
  const attention::Tensor T = attention::contiguous(stamps.ptr(), ir::DType::u64, {(programs + 1) * kStamps * kWarpSlots});
  std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(double(D)))};
  if (o.dropout > 0) bench_util::add_dropout_key(args, o.dropout);
  args.emplace_back(T.view());
  runtime::Stream stream;
  // (gpu_kernel() compiles: the persistent grid is as many programs as are resident)
  const runtime::Grid grid = persistent ? fwd.gpu_kernel().persistent_grid(programs) : runtime::Grid{tiles, H, B};
  for (int i = 0; i < 3; ++i) fwd.launch(grid, stream.handle(), args);  // (the last launch's stamps are read)
  stream.synchronize();
  const int64_t wave = programs;  // every tile
  std::vector<uint64_t> h(static_cast<size_t>(wave * kStamps * kWarpSlots));
  stamps.download(h.data(), h.size() * 8, 0);
  const auto at = [&](int64_t p, int64_t s, int w) { return static_cast<double>(h[static_cast<size_t>((p * kStamps + s) * kWarpSlots + w)]); };

  // per warpgroup g (warp 4 g stands for it): phases of blocks 2 .. trips - 2 (steady state)
  const int64_t trips = S / sch.block_n;
  std::vector<double> phase[2][5], both_softmax, one_softmax, lag, tile, prologue, epilogue, gap, period;
  std::vector<double> peeled, epi_issue, epi_wait, epi_store, epi_lse;  // parts of the prologue and epilogue (warp 0)
  // warpgroup 1 (warp 4) in the epilogue: its store phase, and how far behind warp 0 it normalises O
  // (the TMA store's barrier makes the earlier warpgroup wait for the later one)
  std::vector<double> epi_store_wg1, epi_lag;
  // warp 1 arrives at the store's second barrier and goes on; warp 0 waits there, issues the TMA
  // store and (thread 0) waits for its read of the staging tile: how far behind warp 1 it leaves
  std::vector<double> epi_warp0_behind_1;
  const int64_t P = grid.x * grid.y * grid.z;
  for (int64_t p = 0; p < wave; ++p) {
    const int64_t last = o.causal ? std::min<int64_t>(trips, ((p % tiles) + 1) * sch.block_m / sch.block_n) : trips;
    if (last < 5) continue;
    tile.push_back(at(p, kStamps - 1, 0) - at(p, 0, 0));
    prologue.push_back(at(p, 2 + 5 * 1, 0) - at(p, 0, 0));  // (block 0 is peeled: the loop starts at block 1)
    epilogue.push_back(at(p, kStamps - 1, 0) - at(p, 2 + 5 * (last - 1) + 4, 0));
    peeled.push_back(at(p, 1, 0) - at(p, 0, 0));
    const int64_t e = kernels::ForwardConfig::kTimelineEpilogue;
    epi_issue.push_back(at(p, e, 0) - at(p, 2 + 5 * (last - 1) + 4, 0));
    epi_wait.push_back(at(p, e + 1, 0) - at(p, e, 0));
    epi_store.push_back(at(p, e + 2, 0) - at(p, e + 1, 0));
    epi_lse.push_back(at(p, kStamps - 1, 0) - at(p, e + 2, 0));
    epi_store_wg1.push_back(at(p, e + 2, 4) - at(p, e + 1, 4));
    epi_lag.push_back(at(p, e + 1, 4) - at(p, e + 1, 0));
    epi_warp0_behind_1.push_back(at(p, e + 2, 0) - at(p, e + 2, 1));
    // full, persistent: the program's next tile is p + P (tiles t = program, + P, ...)
    // (and the program's period: from this tile's start to its next's, which OVERLAP_TILES shortens)
    if (persistent && !o.causal && p + P < wave) {
      gap.push_back(at(p + P, 0, 0) - at(p, kStamps - 1, 0));
      period.push_back(at(p + P, 0, 0) - at(p, 0, 0));
    }
    double both = 0, one = 0;
    for (int64_t j = 2; j + 2 < last; ++j) {
      const int64_t s0 = 2 + 5 * j;
      for (int g = 0; g < 2; ++g) {
        const int w = 4 * g;
        for (int ph = 0; ph < 4; ++ph) phase[g][ph].push_back(at(p, s0 + ph + 1, w) - at(p, s0 + ph, w));
        phase[g][4].push_back(at(p, s0 + 5, w) - at(p, s0, w));
      }
      lag.push_back(at(p, s0, 4) - at(p, s0, 0));
      // softmax windows [S landed, P ready] of block j in each warpgroup: the cycles both are in one
      const double a0 = at(p, s0 + 2, 0), a1 = at(p, s0 + 3, 0), b0 = at(p, s0 + 2, 4), b1 = at(p, s0 + 3, 4);
      const double overlap = std::max(0.0, std::min(a1, b1) - std::max(a0, b0));
      both += overlap;
      one += (a1 - a0) + (b1 - b0) - 2 * overlap;
    }
    if (both + one > 0) both_softmax.push_back(both / (both + one)), one_softmax.push_back(one / (both + one));
  }
  std::printf("attention_fwd timeline: D %ld S %ld B %ld H %ld %s%s%s, %ld x %ld tiles, %d warps, %s (%ld programs)\n",
              static_cast<long>(D), static_cast<long>(S), static_cast<long>(B), static_cast<long>(H), o.causal ? "causal" : "full",
              o.dropout > 0 ? fmt::format(", dropout {}", o.dropout).c_str() : "", o.with.empty() ? "" : (", " + o.with).c_str(),
              static_cast<long>(sch.block_m), static_cast<long>(sch.block_n), sch.num_warps, persistent ? "persistent" : "one tile a program",
              static_cast<long>(P));
  const char* names[5] = {"issue", "S wait", "softmax", "rescale", "block"};
  for (int g = 0; g < 2; ++g) {
    std::printf("TIMELINE warpgroup %d median cycles:", g);
    for (int ph = 0; ph < 5; ++ph) std::printf(" %s %.0f", names[ph], median(phase[g][ph]));
    std::printf("\n");
  }
  std::printf("TIMELINE warpgroup 1 behind 0 at a block's top: median %.0f cycles; softmax time with both warpgroups in it: "
              "%.2f (median per tile)\n",
              median(lag), median(both_softmax));
  std::printf("TIMELINE tile %.0f cycles: prologue %.0f (to block 1's top), epilogue %.0f (after the last block), gap to the "
              "program's next tile %.0f, period (tile start to the next's) %.0f\n",
              median(tile), median(prologue), median(epilogue), median(gap), median(period));
  std::printf("TIMELINE prologue: block 0 (S_0 and its softmax) %.0f, then to block 1's top %.0f; epilogue: last P V issued %.0f, "
              "landed and O normalised %.0f, O stored %.0f, LSE stored %.0f\n",
              median(peeled), median(prologue) - median(peeled), median(epi_issue), median(epi_wait), median(epi_store), median(epi_lse));
  std::printf("TIMELINE epilogue, warpgroup 1: O stored %.0f cycles after its O normalised, which was %.0f cycles after warpgroup 0's\n",
              median(epi_store_wg1), median(epi_lag));
  std::printf("TIMELINE epilogue, warp 0 (issues the O store, waits for its read) leaves it %.0f cycles after warp 1\n",
              median(epi_warp0_behind_1));
  return 0;
}

// --backward: the dK/dV kernel's timeline.
int run_backward(const Options& o) {
  using attention::DqReduction;
  const int64_t S = o.seq, D = o.head_dim, H = o.hidden / D, B = std::max<int64_t>(1, o.tokens / S);
  // the API's default reduction, schedule, ring options and metas for this call (api/attention:
  // default_reduction, dkdv_ring_options, meta_of), so that the timeline follows what the API runs
  attention::detail::Dims dims;
  dims.batch = B, dims.heads_q = dims.heads_kv = H, dims.seq_q = dims.seq_k = S, dims.head_dim = D, dims.causal = o.causal;
  dims.row_vectors_aligned = true;
  const std::string red = !o.reduction.empty() ? o.reduction : attention::name(attention::detail::default_reduction(dims, {}));
  const DqReduction reduction = red == "atomic" ? DqReduction::atomic : red == "ordered" ? DqReduction::ordered : DqReduction::recompute;
  if (red != "atomic" && red != "ordered" && red != "recompute") throw std::invalid_argument("--reduction " + red + ": recompute, atomic or ordered");
  attention::detail::Config c{};
  c.pass = attention::Pass::bwd_dkdv;
  c.dtype = ir::DType::bf16;
  c.head_dim = static_cast<int>(D);
  c.causal = o.causal;
  c.reduction = static_cast<int>(reduction);
  c.sch = attention::default_schedule(attention::Pass::bwd_dkdv, c.dtype, c.head_dim, o.causal, false, reduction);
  const attention::detail::DkdvRingOptions rings = attention::detail::dkdv_ring_options(c, true);
  c.lse_in_ring = rings.lse_in_ring, c.ring_producer = rings.ring_producer, c.dq_writer = rings.dq_writer;
  const attention::Schedule& sch = c.sch;
  const bool adds = reduction != DqReduction::recompute;
  lang::Meta meta = attention::detail::meta_of(c);
  meta.emplace_back(mn::kTimeline, true);
  for (const auto& [name, value] : bench_util::parse_with(o.with)) meta.emplace_back(name, value);
  jit::CompileOptions co;
  co.num_warps = sch.num_warps;
  co.pipeline.stages = o.stages > 0 ? o.stages : sch.stages;
  co.min_programs_per_sm = sch.min_programs_per_sm;
  Function dkdv(kernels::attention_backward_dkdv(), meta, co);

  const size_t bytes = static_cast<size_t>(B * S * H * D * 2);
  runtime::DeviceBuffer q = bench_util::random_buffer(bytes, ir::DType::bf16, 1), k = bench_util::random_buffer(bytes, ir::DType::bf16, 2),
                        v = bench_util::random_buffer(bytes, ir::DType::bf16, 3), dout = bench_util::random_buffer(bytes, ir::DType::bf16, 4),
                        dk(bytes), dv(bytes), lse(static_cast<size_t>(B * H * S * 4)), delta(static_cast<size_t>(B * H * S * 4));
  std::vector<float> lse_host(static_cast<size_t>(B * H * S), static_cast<float>(std::log(double(S)) + 0.5)), zero(lse_host.size(), 0.0f);
  lse.upload(lse_host.data(), lse_host.size() * 4);
  delta.upload(zero.data(), zero.size() * 4);
  const int64_t m_blocks = lang::cdiv(S, sch.block_m), key_tiles = lang::cdiv(S, sch.block_n), tiles = key_tiles * H * B;
  runtime::DeviceBuffer accum(adds ? bytes * 2 : 16), sems(static_cast<size_t>(B * H * m_blocks * 4));
  runtime::DeviceBuffer stamps(static_cast<size_t>(tiles * kernels::DkdvConfig::kTimelineStamps * kWarpSlots * 8));
  stamps.fill_bytes(0);
  const auto t4 = [&](const runtime::DeviceBuffer& b, ir::DType dt) { return attention::contiguous(b.ptr(), dt, {B, S, H, D}); };
  const attention::Tensor Q = t4(q, ir::DType::bf16), K = t4(k, ir::DType::bf16), V = t4(v, ir::DType::bf16), dO = t4(dout, ir::DType::bf16),
                          dK = t4(dk, ir::DType::bf16), dV = t4(dv, ir::DType::bf16), L = attention::contiguous(lse.ptr(), ir::DType::f32, {B, H, S}),
                          Dl = attention::contiguous(delta.ptr(), ir::DType::f32, {B, H, S}),
                          A = attention::contiguous(accum.ptr(), ir::DType::f32, {B, H, S, D}),
                          Sm = attention::contiguous(sems.ptr(), ir::DType::i32, {B * H * m_blocks}),
                          T = attention::contiguous(stamps.ptr(), ir::DType::u64, {tiles * kernels::DkdvConfig::kTimelineStamps * kWarpSlots});
  std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), dO.view(), L.view(), Dl.view(), dK.view(), dV.view()};
  if (adds) args.emplace_back(A.view());
  if (reduction == DqReduction::ordered) args.emplace_back(Sm.view());
  args.emplace_back(static_cast<float>(1 / std::sqrt(double(D))));
  args.emplace_back(T.view());
  runtime::Stream stream;
  const runtime::Grid grid = reduction == DqReduction::ordered ? dkdv.gpu_kernel().persistent_grid(tiles) : runtime::Grid{key_tiles, H, B};
  for (int i = 0; i < 3; ++i) {  // (the last launch's stamps are read; the ordered semaphores start at zero)
    stream.synchronize();
    sems.fill_bytes(0);
    dkdv.launch(grid, stream.handle(), args);
  }
  stream.synchronize();
  std::vector<uint64_t> h(static_cast<size_t>(tiles * kernels::DkdvConfig::kTimelineStamps * kWarpSlots));
  stamps.download(h.data(), h.size() * 8, 0);
  constexpr int64_t kStampsB = kernels::DkdvConfig::kTimelineStamps, kPhases = kernels::DkdvConfig::kTimelinePhases;
  const auto at = [&](int64_t t, int64_t s, int w) { return static_cast<double>(h[static_cast<size_t>((t * kStampsB + s) * kWarpSlots + w)]); };
  const auto visit_at = [&](int64_t t, int64_t j, int64_t ph, int w) { return at(t, 1 + j * kPhases + ph, w); };
  std::vector<double> phase[2][kPhases + 1], prologue, epilogue, tile_cycles, lag;
  for (int64_t t = 0; t < tiles; ++t) {
    int64_t visits = 0;
    while (visits < (kStampsB - 2) / kPhases && visit_at(t, visits, 0, 0) != 0) ++visits;
    if (visits < 4) continue;
    tile_cycles.push_back(at(t, kStampsB - 1, 0) - at(t, 0, 0));
    prologue.push_back(visit_at(t, 0, 0, 0) - at(t, 0, 0));
    epilogue.push_back(at(t, kStampsB - 1, 0) - visit_at(t, visits - 1, kPhases - 1, 0));
    for (int64_t j = 1; j + 1 < visits; ++j) {  // (steady state: not the first or the last visit)
      for (int g = 0; g < 2; ++g) {
        const int w = 4 * g;
        for (int64_t ph = 0; ph + 1 < kPhases; ++ph) phase[g][ph].push_back(visit_at(t, j, ph + 1, w) - visit_at(t, j, ph, w));
        phase[g][kPhases - 1].push_back(visit_at(t, j + 1, 0, w) - visit_at(t, j, kPhases - 1, w));
        phase[g][kPhases].push_back(visit_at(t, j + 1, 0, w) - visit_at(t, j, 0, w));
      }
      lag.push_back(visit_at(t, j, 0, 4) - visit_at(t, j, 0, 0));
    }
  }
  std::printf("attention_bwd_dkdv timeline: D %ld S %ld B %ld H %ld %s, reduction %s, %ld x %ld tiles, %d warps, %d stages%s (%ld programs)\n",
              static_cast<long>(D), static_cast<long>(S), static_cast<long>(B), static_cast<long>(H), o.causal ? "causal" : "full",
              red.c_str(), static_cast<long>(sch.block_m), static_cast<long>(sch.block_n), sch.num_warps, static_cast<int>(co.pipeline.stages),
              o.with.empty() ? "" : (", " + o.with).c_str(), static_cast<long>(grid.x * grid.y * grid.z));
  std::printf("TIMELINE_BWD registers %d, spills %d B\n", dkdv.compiled().info.registers, dkdv.compiled().info.spill_store_bytes);
  const char* names[kPhases + 1] = {"S^T wait", "exp", "dP^T wait + dS", "dV dK issue", "dQ part", "to next", "visit"};
  for (int g = 0; g < 2; ++g) {
    std::printf("TIMELINE_BWD warpgroup %d median cycles:", g);
    for (int64_t ph = 0; ph <= kPhases; ++ph) std::printf(" %s %.0f", names[ph], median(phase[g][ph]));
    std::printf("\n");
  }
  // a median hides slow visits (dQ adds meeting others' in L2, a late ring stage): the mean and tail
  for (int g = 0; g < 2; ++g) {
    std::printf("TIMELINE_BWD warpgroup %d mean cycles:", g);
    for (int64_t ph = 0; ph <= kPhases; ++ph) std::printf(" %s %.0f", names[ph], mean(phase[g][ph]));
    std::printf("\n");
  }
  std::printf("TIMELINE_BWD visit p10 %.0f p50 %.0f p90 %.0f p99 %.0f cycles; key tile mean %.0f, p90 %.0f\n", quantile(phase[0][kPhases], 0.1),
              quantile(phase[0][kPhases], 0.5), quantile(phase[0][kPhases], 0.9), quantile(phase[0][kPhases], 0.99), mean(tile_cycles),
              quantile(tile_cycles, 0.9));
  std::printf("TIMELINE_BWD warpgroup 1 behind 0 at a visit's top: median %.0f cycles\n", median(lag));
  std::printf("TIMELINE_BWD key tile %.0f cycles: prologue %.0f (to the first visit), epilogue %.0f (after the last: dK, dV stored)\n",
              median(tile_cycles), median(prologue), median(epilogue));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // library kernels timed as the API launches them: declared, not specialised per call
  // (runtime/specialization.hpp; TILEJIT_SPECIALIZE=1 set by the caller overrides)
  setenv("TILEJIT_SPECIALIZE", "0", /*overwrite=*/0);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seq" && i + 1 < argc) o.seq = std::atol(argv[++i]);
    else if (a == "--causal") o.causal = true;
    else if (a == "--dropout" && i + 1 < argc) o.dropout = std::atof(argv[++i]);
    else if (a == "--with" && i + 1 < argc) o.with = argv[++i];
    else if (a == "--stages" && i + 1 < argc) o.stages = std::atoi(argv[++i]);
    else if (a == "--persistent" && i + 1 < argc) o.persistent = std::atoi(argv[++i]) != 0;
    else if (a == "--backward") o.backward = true;
    else if (a == "--head-dim" && i + 1 < argc) o.head_dim = std::atol(argv[++i]);
    else if (a == "--reduction" && i + 1 < argc) o.reduction = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--seq S] [--causal] [--dropout P] [--persistent 0|1] [--with A=1,B=0]\n"
                   "       %s --backward [--head-dim D] [--seq S] [--causal] [--reduction recompute|atomic|ordered] [--with A=1] [--stages N]\n",
                   argv[0], argv[0]);
      return 2;
    }
  }
  if (!runtime::Driver::get().available()) {
    std::fprintf(stderr, "attention_timeline needs a GPU: %s\n", runtime::Driver::get().unavailable_reason().c_str());
    return 2;
  }
  try {
    return o.backward ? run_backward(o) : run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_timeline: %s\n", e.what());
    return 1;
  }
}
