// The library GEMM on the general ring machinery (issue 22): RING_PRODUCER (a producer warpgroup
// fills the K loop's ring; the loop leaves the GEMM-only pipeline for jit/wgmma_plan.hpp's rings)
// and PERSISTENT (a 1-D grid of any size walks the tiles in GROUP_M order). In the interpreter
// bit-identical to the one-tile-per-program GEMM for grids smaller than, equal to and larger than
// the tile count; on sm_90a the producer's launch shape (384 threads, setmaxnreg) without spills.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "kernels/gemm.hpp"
#include "ptxas_testing.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;
using rt::HostTensor;

namespace {

// Max |a - b| over two tensors of one shape.
double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  double d = 0;
  for (int64_t e = 0; e < a.numel(); ++e) d = std::max(d, std::abs(a.get_flat(e) - b.get_flat(e)));
  return d;
}

}  // namespace

TEST_CASE("gemm PERSISTENT (with and without RING_PRODUCER): bit-identical to one tile per program, any grid size") {
  // 200 x 136 x 96 in 64 x 64 tiles: 4 x 3 = 12 tiles, ragged in M and N; 3 K steps of 32
  const int M = 200, N = 136, K = 96;
  for (bool b_kmajor : {true, false}) {
    HostTensor a(bf16, {M, K}), b(bf16, b_kmajor ? ir::Shape{N, K} : ir::Shape{K, N});
    a.fill_uniform(11, -1, 1);
    b.fill_uniform(12, -1, 1);
    for (int64_t group_m : {0, 2, 8}) {
      const Meta base{{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}, {"B_KMAJOR", b_kmajor}, {"GROUP_M", group_m}};
      HostTensor ref(f32, {M, N});
      ref.poison();
      rt::interpret(kernels::gemm().build(base), group_m == 0 ? rt::Grid{4, 3} : rt::Grid{12}, {a, b, ref});
      double ref_norm = 0;
      for (int64_t e = 0; e < ref.numel(); ++e) ref_norm = std::max(ref_norm, std::abs(ref.get_flat(e)));
      REQUIRE(ref_norm > 0.5);  // a real product, not zeros
      for (bool producer : {false, true})
        for (int64_t programs : {1, 5, 12, 20}) {  // fewer, as many and more programs than tiles
          INFO(fmt::format("B {}, GROUP_M {}, RING_PRODUCER {}, {} programs", b_kmajor ? "K-major" : "MN-major", group_m, producer, programs));
          Meta meta = base;
          meta.emplace_back("PERSISTENT", true);
          meta.emplace_back("RING_PRODUCER", producer);
          HostTensor c(f32, {M, N});
          c.poison();
          rt::interpret(kernels::gemm().build(meta), {programs}, {a, b, c});
          CHECK(max_abs_diff(c, ref) == 0.0);
        }
    }
  }
}

TEST_CASE("gemm RING_PRODUCER / PERSISTENT on sm_90a: the general rings, a producer warpgroup, no spills") {
  if (testing::no_ptxas()) return;
  for (bool persistent : {false, true})
    for (bool b_kmajor : {true, false}) {
      INFO(fmt::format("PERSISTENT {}, B {}", persistent, b_kmajor ? "K-major" : "MN-major"));
      const Meta meta{{"BLOCK_N", 256}, {"B_KMAJOR", b_kmajor}, {"GROUP_M", 8}, {"OUT_DTYPE", ir::DType::bf16},
                      {"RING_PRODUCER", true}, {"PERSISTENT", persistent}};
      jit::CompileOptions o;
      o.num_warps = 8;
      o.pipeline.stages = 4;
      o.ptx_tool = jit::PtxTool::Ptxas;
      const jit::CompiledKernel k = jit::compile(kernels::gemm().build(meta), o);
      CHECK(k.num_threads == 384);  // 8 consumer warps + the producer warpgroup
      CHECK(k.ptx.find("setmaxnreg.inc.sync.aligned.u32 240") != std::string::npos);
      CHECK(k.ptx.find("setmaxnreg.dec.sync.aligned.u32 24") != std::string::npos);
      CHECK(k.ptx.find("wgmma.mma_async.sync.aligned.m64n256k16") != std::string::npos);
      CHECK(k.tensor_maps.size() == 2);  // A and B by TMA
      CHECK(k.smem_bytes > 4 * (128 + 256) * 64 * 2);  // four stages of A and B
      CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
    }
}

TEST_CASE("gemm PERSISTENT: without the producer the K loop keeps the GEMM pipeline") {
  const Meta meta{{"BLOCK_N", 256}, {"B_KMAJOR", true}, {"GROUP_M", 8}, {"PERSISTENT", true}};
  jit::CompileOptions o;
  o.num_warps = 8;
  o.pipeline.stages = 4;
  o.make_cubin = false;
  const jit::CompiledKernel k = jit::compile(kernels::gemm().build(meta), o);
  CHECK(k.num_threads == 256);
  CHECK(k.ptx.find("setmaxnreg") == std::string::npos);
  CHECK(k.ptx.find("wgmma.mma_async") != std::string::npos);
}
