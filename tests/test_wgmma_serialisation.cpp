// The library's wgmma pipelines assemble for sm_90a without ptxas serialising their wgmmas
// (C7509-C7520: "wgmma.mma_async instructions are serialized due to ..."), which costs every MMA
// its overlap and shows nowhere but in ptxas's log and the time. Pins the lowering rules that
// avoid it: a carried MMA result that is double-buffered (PIPELINE_QK's next S) is copied into
// its carried register after the wait that completes it; the GEMM's K loop sits under nk > 0 with
// its final wait; rcp instead of a division's subroutine. And no warpgroup.arrive injected by ptxas
// (C7519): it came with a dummy HGMMA group after a fenced commit inside a loop, which made the next
// `wgmma.wait_group N` wait for one group more (decision 096). Skips visibly without ptxas.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/gemm.hpp"
#include "ptxas_testing.hpp"

using namespace tilejit;
using lang::Meta;

namespace {

struct Case {
  std::string label;
  const lang::Kernel& (*kernel)();
  Meta meta;
  int warps, stages;
  int max_spill_bytes = 0;  // a measured, accepted spill (both forward pipelines at D128)
  int min_programs_per_sm = 0;
};

}  // namespace

TEST_CASE("wgmma pipelines of the library kernels: no serialised wgmma, no unexpected spills (forward variants, backward, GEMM)") {
  if (testing::no_ptxas()) return;
  const Meta fwd128{{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 128}};
  const Meta fwd64{{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 64}, {"EXACT_NORMALIZE", false}, {"BSHD", true}};
  const auto with = [](Meta m, const char* name, ir::MetaValue v) {
    m.emplace_back(name, v);
    return m;
  };
  const std::vector<Case> cases{
      {"forward D128 (PIPELINE_QK by default)", &kernels::attention_forward, fwd128, 8, 2},
      {"forward D128 causal (PIPELINE_QK by default)", &kernels::attention_forward, with(fwd128, "CAUSAL", true), 8, 2},
      // OVERLAP_TILES: a tile's S_0 beside the previous tile's last P V, across the persistent walk
      // (40 B of spills: the producer's, at 24 registers -- 8-12 B with 32, which the launch lacks)
      {"forward D128 OVERLAP_TILES", &kernels::attention_forward,
       with(with(with(fwd128, "BSHD", true), "PERSISTENT", true), "OVERLAP_TILES", true), 8, 2, 40},
      {"forward D128 causal OVERLAP_TILES", &kernels::attention_forward,
       with(with(with(with(fwd128, "BSHD", true), "PERSISTENT", true), "OVERLAP_TILES", true), "CAUSAL", true), 8, 2, 40},
      // both pipelines: 255 registers and a measured, accepted ~50 B of spills (not the default)
      // (without the default ring producer: with it, the consumers' 240 registers do not hold both pipelines)
      {"forward D128 PIPELINE_QK + PIPELINE_PV", &kernels::attention_forward, with(with(fwd128, "PIPELINE_PV", true), "RING_PRODUCER", false), 8, 2, 64},
      {"forward D128 PIPELINE_PV alone", &kernels::attention_forward, with(with(fwd128, "PIPELINE_QK", false), "PIPELINE_PV", true), 8, 2},
      // LAZY_RESCALE: O's rescale behind a warp vote, on the API's D128 loop (ring producer, PIPELINE_PV, persistent)
      {"forward D128 LAZY_RESCALE", &kernels::attention_forward,
       with(with(with(with(with(fwd128, "BSHD", true), "PERSISTENT", true), "PIPELINE_PV", true), "POSITIVE_SCALE", true), "LAZY_RESCALE", true),
       8, 2},
      {"forward D128 causal LAZY_RESCALE", &kernels::attention_forward,
       with(with(with(with(with(with(fwd128, "BSHD", true), "PERSISTENT", true), "PIPELINE_PV", true), "POSITIVE_SCALE", true),
                      "LAZY_RESCALE", true), "CAUSAL", true),
       8, 2},
      {"forward D128 no pipeline", &kernels::attention_forward, with(with(fwd128, "PIPELINE_QK", false), "PIPELINE_PV", false), 8, 2},
      {"forward D128 fused dropout", &kernels::attention_forward, with(fwd128, "DROPOUT", true), 8, 2},
      {"forward D64 PIPELINE_QK", &kernels::attention_forward, {{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 64}, {"PIPELINE_QK", true}}, 8, 2},
      // the API's D64 forward: rcp normalisation, registers bounded for two programs per SM
      {"forward D64, two programs per SM", &kernels::attention_forward, fwd64, 8, 2, 0, 2},
      {"forward D64 causal, two programs per SM", &kernels::attention_forward, with(fwd64, "CAUSAL", true), 8, 2, 0, 2},
      {"forward D64 ALiBi, two programs per SM", &kernels::attention_forward, with(fwd64, "SCORE_MOD", int64_t{1}), 8, 2, 999, 2},
      {"forward D64 soft-cap, two programs per SM", &kernels::attention_forward, with(fwd64, "SCORE_MOD", int64_t{2}), 8, 2, 999, 2},
      {"forward D64 sliding window, two programs per SM", &kernels::attention_forward, with(fwd64, "MASK", int64_t{2}), 8, 2, 999, 2},
      // fenced commits (work issued under a group: DROPOUT_AHEAD): fused Philox and precomputed words
      {"forward D128 fused dropout, DROPOUT_AHEAD", &kernels::attention_forward,
       with(with(with(fwd128, "BSHD", true), "DROPOUT", true), "DROPOUT_AHEAD", true), 8, 2},
      {"forward D128 dropout bits, DROPOUT_AHEAD", &kernels::attention_forward,
       with(with(with(with(fwd128, "BSHD", true), "DROPOUT", true), "DROPOUT_BITS", true), "DROPOUT_AHEAD", true), 8, 2},
      {"dQ D128 dropout bits, DROPOUT_AHEAD", &kernels::attention_backward_dq,
       {{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 128}, {"BSHD", true}, {"DROPOUT", true}, {"DROPOUT_BITS", true}, {"DROPOUT_AHEAD", true}},
       8, 2},
      // (dK/dV's fused Philox words under S^T's MMA: its accepted spills, below the 80 B without it)
      {"dK/dV D128 fused dropout, DROPOUT_AHEAD", &kernels::attention_backward_dkdv,
       {{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"HEAD_DIM", 128}, {"BSHD", true}, {"DROPOUT", true}, {"DROPOUT_AHEAD", true}}, 4, 2, 80},
      {"dK/dV D128", &kernels::attention_backward_dkdv, {{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"HEAD_DIM", 128}}, 4, 2},
      // the atomic 5-matmul dK/dV with a producer warpgroup (an experiment for issue 23, off by
      // default): its ~180 B of spills are the kernel's own (184 B without the producer)
      {"dK/dV D128 atomic, RING_PRODUCER", &kernels::attention_backward_dkdv,
       {{"BLOCK_M", 64}, {"BLOCK_N", 128}, {"HEAD_DIM", 128}, {"BSHD", true}, {"DQ_REDUCTION", int64_t{1}}, {"RING_PRODUCER", true}}, 8, 2, 256},
      {"dQ D128", &kernels::attention_backward_dq, {{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"HEAD_DIM", 128}}, 4, 2},
      {"GEMM 128x256", &kernels::gemm, {{"BLOCK_N", 256}, {"B_KMAJOR", true}, {"GROUP_M", 8}, {"OUT_DTYPE", ir::DType::bf16}}, 8, 4},
      // the GEMM on the general rings with a producer warpgroup, and on a persistent grid
      {"GEMM 128x256 RING_PRODUCER", &kernels::gemm,
       {{"BLOCK_N", 256}, {"B_KMAJOR", true}, {"GROUP_M", 8}, {"OUT_DTYPE", ir::DType::bf16}, {"RING_PRODUCER", true}}, 8, 4},
      {"GEMM 128x256 RING_PRODUCER + PERSISTENT", &kernels::gemm,
       {{"BLOCK_N", 256}, {"B_KMAJOR", true}, {"GROUP_M", 8}, {"OUT_DTYPE", ir::DType::bf16}, {"RING_PRODUCER", true}, {"PERSISTENT", true}}, 8, 4},
      {"GEMM 128x256 MN-major B, RING_PRODUCER + PERSISTENT", &kernels::gemm,
       {{"BLOCK_N", 256}, {"GROUP_M", 8}, {"OUT_DTYPE", ir::DType::bf16}, {"RING_PRODUCER", true}, {"PERSISTENT", true}}, 8, 4},
  };
  for (const Case& c : cases) {
    INFO(c.label);
    jit::CompileOptions o;
    o.backend = jit::Backend::Llvm;
    o.num_warps = c.warps;
    o.pipeline.stages = c.stages;
    o.min_programs_per_sm = c.min_programs_per_sm;
    o.ptx_tool = jit::PtxTool::Ptxas;
    const jit::CompiledKernel k = jit::compile(c.kernel().build(c.meta), o);
    CHECK(k.ptx.find("wgmma.mma_async") != std::string::npos);
    const std::string log = jit::ptx_to_cubin(k.ptx, "sm_90a", k.name, jit::PtxTool::Ptxas).log;
    CHECK_MESSAGE(log.find("serialized") == std::string::npos, log);
    CHECK_MESSAGE(log.find("C7519") == std::string::npos, log);
    CHECK(k.ptx.find(":\n\twgmma.commit_group") == std::string::npos);  // no commit at a loop's head
    CHECK_MESSAGE(k.info.spill_store_bytes <= c.max_spill_bytes, k.info.to_string());
    MESSAGE(fmt::format("{}: {}", c.label, k.info.to_string()));
  }
}
