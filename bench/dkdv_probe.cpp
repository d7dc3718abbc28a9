// bench/dkdv_probe: one launch of the dK/dV kernel under chosen metas, tiles and grid, watched by a
// watchdog: prints FINISHED with the time, or HUNG after --timeout seconds (and exits 3 without
// waiting for the GPU). For schedules the emulator passes and the GPU does not finish (decision
// 073): run a matrix of variants, each in its own process, to find what the hang needs.
//
//   dkdv_probe [--dim D] [--causal 0|1] [--seq S] [--heads H] [--batch B] [--programs P]
//              [--tiles BM,BN,W,STAGES] [--meta A=1,B=0] [--reduction 0|1|3] [--tool ptxas|nvjitlink] [--backend llvm|nvrtc]
//              [--timeout SEC] [--launches N] [--debug-waits CYCLES]
//
// --programs: 0 a persistent grid as the API sizes it (as many as are resident), P > 0 that many
// programs on a 1-D grid (PERSISTENT), -1 one program per key tile (not persistent). Inputs are
// random (the kernel's control flow does not read them): only completion is checked.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "api/attention.hpp"
#include "bench/bench_util.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/meta_names.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/function.hpp"

using namespace tilejit;
namespace mn = kernels::meta_name;

namespace {

struct Options {
  int64_t dim = 64, seq = 4096, heads = 16, batch = 4, programs = 0, reduction = 1, launches = 3;
  bool causal = true;
  int block_m = 64, block_n = 0, warps = 0, stages = 2;
  std::string meta, tool, backend;
  double timeout = 20;
  long long debug_waits = 0;  // cycles: TILEJIT_DEBUG_WAITS with a record buffer (jit/llvm_backend/gpu_ops.cpp)
};

int run(const Options& o) {
  const int64_t D = o.dim, S = o.seq, H = o.heads, B = o.batch;
  const int BN = o.block_n ? o.block_n : (D == 128 ? 128 : 64), warps = o.warps ? o.warps : (D == 128 ? 8 : 4);
  lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D},     {mn::kBlockM, static_cast<int64_t>(o.block_m)},
                  {mn::kBlockN, static_cast<int64_t>(BN)}, {mn::kBshd, true}, {mn::kCausal, o.causal},
                  {mn::kDqReduction, o.reduction}};
  if (o.programs >= 0) meta.emplace_back(mn::kPersistent, true);
  for (const auto& [name, value] : bench_util::parse_with(o.meta)) meta.emplace_back(name, value);
  jit::CompileOptions co;
  co.num_warps = warps;
  co.pipeline.stages = o.stages;
  if (o.tool == "ptxas") co.ptx_tool = jit::PtxTool::Ptxas;
  else if (o.tool == "nvjitlink") co.ptx_tool = jit::PtxTool::NvJitLink;
  if (o.backend == "nvrtc") co.backend = jit::Backend::Nvrtc;
  // --debug-waits: waits give up after that many cycles and record where they stood (set before
  // the first compile; the cache would hide the instrumented code)
  runtime::DeviceBuffer records(4097 * 32);
  if (o.debug_waits > 0) {
    records.fill_bytes(0);
    setenv("TILEJIT_CACHE", "0", 1);
    setenv("TILEJIT_DEBUG_WAITS", fmt::format("{}:{:#x}", o.debug_waits, static_cast<unsigned long long>(records.ptr())).c_str(), 1);
  }
  Function fn(kernels::attention_backward_dkdv(), meta, co);

  const size_t bytes = static_cast<size_t>(B * S * H * D * 2), rows = static_cast<size_t>(B * H * S * 4);
  runtime::DeviceBuffer q = bench_util::random_buffer(bytes, ir::DType::bf16, 1), k = bench_util::random_buffer(bytes, ir::DType::bf16, 2),
                        v = bench_util::random_buffer(bytes, ir::DType::bf16, 3), dout = bench_util::random_buffer(bytes, ir::DType::bf16, 4),
                        lse = bench_util::random_buffer(rows, ir::DType::f32, 5), delta = bench_util::random_buffer(rows, ir::DType::f32, 6),
                        dk(bytes), dv(bytes), accum(bytes * 2), sems(static_cast<size_t>(B * H * S * 4));
  const auto t4 = [&](const runtime::DeviceBuffer& b) { return attention::contiguous(b.ptr(), ir::DType::bf16, {B, S, H, D}); };
  const auto v3 = [&](const runtime::DeviceBuffer& b) { return attention::contiguous(b.ptr(), ir::DType::f32, {B, H, S}); };
  // (the attention::Tensors must outlive their views)
  std::vector<attention::Tensor> tensors{t4(q), t4(k), t4(v), t4(dout), v3(lse), v3(delta), t4(dk), t4(dv)};
  if (o.reduction != 0) tensors.push_back(attention::contiguous(accum.ptr(), ir::DType::f32, {B, H, S, D}));
  if (o.reduction == 3) tensors.push_back(attention::contiguous(sems.ptr(), ir::DType::i32, {B * H * S}));
  std::vector<runtime::DeviceArg> args;
  for (const attention::Tensor& t : tensors) args.emplace_back(t.view());
  args.emplace_back(static_cast<float>(1 / std::sqrt(double(D))));
  const int64_t key_tiles = lang::cdiv(S, BN);
  const runtime::Grid grid = o.programs < 0   ? runtime::Grid{key_tiles, H, B}
                             : o.programs == 0 ? fn.gpu_kernel().persistent_grid(key_tiles * H * B)
                                               : runtime::Grid{o.programs};
  std::printf("PROBE D=%ld causal=%d S=%ld H=%ld B=%ld tiles=%dx%d/%dw/%ds grid=%ldx%ldx%ld meta=%s tool=%s backend=%s registers=%d ... ",
              static_cast<long>(D), o.causal ? 1 : 0, static_cast<long>(S), static_cast<long>(H), static_cast<long>(B), o.block_m, BN, warps,
              o.stages, static_cast<long>(grid.x), static_cast<long>(grid.y), static_cast<long>(grid.z), o.meta.c_str(),
              o.tool.empty() ? "auto" : o.tool.c_str(), o.backend.empty() ? "llvm" : o.backend.c_str(), fn.compiled().info.registers);
  std::fflush(stdout);
  runtime::Stream stream;
  static std::atomic<bool> done{false};  // (static: the detached watchdog may outlive this frame)
  std::thread([timeout = o.timeout] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done) {
      std::printf("HUNG (no completion in %.0f s)\n", timeout);
      std::fflush(stdout);
      _exit(3);
    }
  }).detach();  // (a launch that throws leaves it to the process's exit)
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.launches; ++i) {
    if (o.reduction == 3) sems.fill_bytes(0);
    fn.launch(grid, stream.handle(), args);
  }
  stream.synchronize();
  done = true;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(o.launches);
  std::printf("FINISHED %.3f ms a launch\n", ms);
  if (o.debug_waits > 0) {
    std::vector<uint32_t> h(4097 * 8);
    records.download(h.data(), h.size() * 4);
    std::printf("%u waits gave up (first 200 by clock): site program thread barrier parity clock\n", h[0]);
    std::vector<std::array<uint32_t, 6>> recs;
    for (uint32_t n = 0; n < std::min<uint32_t>(h[0], 4096); ++n) {
      std::array<uint32_t, 6> r;
      for (int i = 0; i < 6; ++i) r[static_cast<size_t>(i)] = h[8 + 8 * n + static_cast<size_t>(i)];
      recs.push_back(r);
    }
    std::sort(recs.begin(), recs.end(), [](const auto& a, const auto& b) { return a[5] < b[5]; });
    for (size_t n = 0; n < std::min<size_t>(recs.size(), 200); ++n)
      std::printf("WAIT site %u program %u thread %u barrier +%u parity %u clock %u\n", recs[n][0], recs[n][1], recs[n][2], recs[n][3],
                  recs[n][4], recs[n][5]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("TILEJIT_SPECIALIZE", "0", /*overwrite=*/0);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--dim" && has) o.dim = std::atoll(argv[++i]);
    else if (a == "--causal" && has) o.causal = std::atoi(argv[++i]) != 0;
    else if (a == "--seq" && has) o.seq = std::atoll(argv[++i]);
    else if (a == "--heads" && has) o.heads = std::atoll(argv[++i]);
    else if (a == "--batch" && has) o.batch = std::atoll(argv[++i]);
    else if (a == "--programs" && has) o.programs = std::atoll(argv[++i]);
    else if (a == "--reduction" && has) o.reduction = std::atoll(argv[++i]);
    else if (a == "--launches" && has) o.launches = std::max(1LL, std::atoll(argv[++i]));
    else if (a == "--meta" && has) o.meta = argv[++i];
    else if (a == "--tool" && has) o.tool = argv[++i];
    else if (a == "--backend" && has) o.backend = argv[++i];
    else if (a == "--debug-waits" && has) o.debug_waits = std::atoll(argv[++i]);
    else if (a == "--timeout" && has) o.timeout = std::atof(argv[++i]);
    else if (a == "--tiles" && has) {
      if (std::sscanf(argv[++i], "%d,%d,%d,%d", &o.block_m, &o.block_n, &o.warps, &o.stages) != 4) {
        std::fprintf(stderr, "--tiles wants BLOCK_M,BLOCK_N,WARPS,STAGES\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "dkdv_probe: unknown argument '%s' (see the comment at the top of bench/dkdv_probe.cpp)\n", a.c_str());
      return 2;
    }
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::printf("ERROR %s\n", e.what());
    return 1;
  }
}
