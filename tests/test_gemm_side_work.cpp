// Side work in the GEMM's pipelined K loop (jit/tma_pipeline.hpp) and on warps of its own
// (lang::warp_roles): the library GEMM's DROPOUT_MASK (issue 7: the attention dropout mask written
// beside the QKV projection) in the interpreter against the host mask and the plain GEMM, bit for
// bit; on sm_90a still the TMA + wgmma pipeline with two MMA groups in flight and no wgmma
// serialisation, and with MASK_WARPS the roles' setmaxnreg; and the matcher's rule that side work
// may not read the pipeline's tiles.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dropout_key_args.hpp"
#include "dsl/lang.hpp"
#include "host_bits.hpp"
#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"
#include "jit/tma_pipeline.hpp"
#include "kernels/gemm.hpp"
#include "kernels/philox.hpp"
#include "kernels/philox_host.hpp"
#include "ptxas_testing.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;
using rt::HostTensor;
using testing::raw;
using testing::contains;

namespace {

// One assembled kernel's ptxas log (-v: it names serialised wgmmas, C7514-C7520).
std::string ptxas_log(const jit::CompiledKernel& k) {
  return jit::ptx_to_cubin(k.ptx, "sm_90a", k.name, jit::PtxTool::Ptxas).log;
}

}  // namespace

TEST_CASE("gemm DROPOUT_MASK: C bit-identical to the plain GEMM, the mask the host's bit for bit (tiles in and after the K loop)") {
  const int M = 128, N = 64, K = 96;  // 2 programs of 64 x 64 (2-D grid) or 1-D with GROUP_M; 3 K steps of 32
  HostTensor a(bf16, {M, K}), b(bf16, {N, K});
  a.fill_uniform(5, -1, 1);
  b.fill_uniform(6, -1, 1);
  const Meta base{{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}, {"B_KMAJOR", true}};
  HostTensor c0(f32, {M, N});
  rt::interpret(kernels::gemm().build(base), {2, 1}, {a, b, c0});
  struct Case {
    int bh, s_q, s_k, block_m, block_w, per_step, group_m, mask_warps = 0, mask_align = 4;
  };
  // 56 tiles for 2 x 3 in-loop slots (most after the loop); 8 per step (48 in the loop, 8 after);
  // one tile and 12 slots; a 1-D grid (GROUP_M) with ragged rows and words; the same on a warp
  // role of their own (MASK_WARPS: every tile in the role's loop, none in the K loop).
  const Case cases[] = {{2, 100, 200, 16, 2, 1, 0},    {2, 100, 200, 16, 2, 8, 0},   {1, 5, 1, 16, 2, 2, 0}, {3, 40, 70, 32, 4, 1, 8},
                        {2, 100, 200, 16, 2, 1, 0, 4}, {3, 40, 70, 32, 4, 1, 8, 4}, {1, 5, 1, 16, 2, 1, 0, 8},
                        {2, 100, 256, 16, 4, 1, 0, 4, 16}};  // (MASK_ALIGN 16: rows of 8 words)
  const kernels::DropoutRngHost rngs[] = {{0x0123456789abcdefull, 0x0000000500000007ull, 230}, {42, 1ull << 40, 13}};
  for (const Case& t : cases)
    for (const auto& r : rngs) {
      INFO(fmt::format("BH={} S_q={} S_k={} MASK_BLOCK_M={} MASK_BLOCK_W={} MASK_TILES_PER_STEP={} GROUP_M={} MASK_WARPS={} seed {:#x}", t.bh,
                       t.s_q, t.s_k, t.block_m, t.block_w, t.per_step, t.group_m, t.mask_warps, r.seed));
      Meta meta = base;
      meta.emplace_back("GROUP_M", t.group_m);
      meta.emplace_back("DROPOUT_MASK", true);
      meta.emplace_back("MASK_BLOCK_M", t.block_m);
      meta.emplace_back("MASK_BLOCK_W", t.block_w);
      meta.emplace_back("MASK_TILES_PER_STEP", t.per_step);
      meta.emplace_back("MASK_WARPS", t.mask_warps);
      meta.emplace_back("MASK_ALIGN", t.mask_align);
      const int words = static_cast<int>(cdiv(t.s_k, 32));
      HostTensor c(f32, {M, N}), mask(u32, {t.bh, t.s_q, words});
      c.poison();
      mask.poison();  // a tile never written stays poisoned
      const rt::Grid grid = t.group_m ? rt::Grid{2} : rt::Grid{2, 1};
      std::vector<rt::Arg> args{a, b, c, mask, t.s_k};
      for (const rt::Arg& x : testing::dropout_key_args(r)) args.push_back(x);
      rt::interpret(kernels::gemm().build(meta), grid, args);
      CHECK(raw<uint32_t>(c) == raw<uint32_t>(c0));
      const std::vector<uint32_t> got = raw<uint32_t>(mask), want = kernels::dropout_mask_packed_host(r, t.bh, t.s_q, t.s_k);
      REQUIRE(got.size() == want.size());
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
      CHECK(bad == 0);
    }
}

TEST_CASE("gemm DROPOUT_MASK with MASK_RANGE: GEMMs that split one mask's tiles write it together, each only its own") {
  const int M = 128, N = 64, K = 96;
  HostTensor a(bf16, {M, K}), b(bf16, {N, K});
  a.fill_uniform(5, -1, 1);
  b.fill_uniform(6, -1, 1);
  const int bh = 2, s_q = 100, s_k = 200, words = 7;  // tiles of 16 rows x 2 words: 7 x 4 x 2 = 56
  const kernels::DropoutRngHost r{0x0123456789abcdefull, 0x0000000500000007ull, 230};
  const std::vector<uint32_t> want = kernels::dropout_mask_packed_host(r, bh, s_q, s_k);
  for (int mask_warps : {0, 4}) {
    Meta meta{{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}, {"B_KMAJOR", true}, {"DROPOUT_MASK", true}, {"MASK_BLOCK_M", 16},
              {"MASK_BLOCK_W", 2}, {"MASK_WARPS", mask_warps}, {"MASK_RANGE", true}};
    const ir::Function fn = kernels::gemm().build(meta);
    HostTensor mask(u32, {bh, s_q, words}), untouched(u32, {bh, s_q, words});
    mask.poison();
    untouched.poison();
    const std::vector<uint32_t> poisoned = raw<uint32_t>(untouched);
    const auto run = [&](int first, int end) {
      HostTensor c(f32, {M, N});
      std::vector<rt::Arg> args{a, b, c, mask, s_k};
      for (const rt::Arg& x : testing::dropout_key_args(r)) args.push_back(x);
      args.insert(args.end(), {first, end});
      rt::interpret(fn, {2, 1}, args);
    };
    // tiles [10, 20) alone: tile t is rows 16 (t % 7), words 2 (t / 7 % 4), batch-head t / 28
    run(10, 20);
    const std::vector<uint32_t> part = raw<uint32_t>(mask);
    size_t bad = 0, written = 0;
    for (int h = 0; h < bh; ++h)
      for (int i = 0; i < s_q; ++i)
        for (int w = 0; w < words; ++w) {
          const int t = i / 16 + 7 * (w / 2) + 28 * h;
          const size_t at = static_cast<size_t>((h * s_q + i) * words + w);
          const bool mine = t >= 10 && t < 20;
          written += part[at] != poisoned[at];
          bad += mine ? part[at] != want[at] : part[at] != poisoned[at];
        }
    CHECK(bad == 0);
    CHECK(written > 0);
    // the rest in two more GEMMs (one range past the end, clamped): the whole mask
    run(0, 10);
    run(20, 1000);
    CHECK(raw<uint32_t>(mask) == want);
    // a backwards or negative range writes nothing
    mask.poison();
    run(30, 5);
    run(-8, 0);
    CHECK(raw<uint32_t>(mask) == poisoned);
  }
}

TEST_CASE("gemm DROPOUT_MASK: MASK_ALIGN 16 stores 16-byte vectors; other alignments are a build error") {
  CHECK_THROWS_WITH(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_ALIGN", 8}}), doctest::Contains("MASK_ALIGN / ALIGN = 8 (valid: 4, or 16"));
  if (testing::no_ptxas()) return;
  const Meta meta{{"BLOCK_M", 128}, {"BLOCK_N", 256},     {"BLOCK_K", 64},     {"B_KMAJOR", true}, {"GROUP_M", 8},      {"OUT_DTYPE", bf16},
                  {"DROPOUT_MASK", true}, {"MASK_BLOCK_W", 16}, {"MASK_WARPS", 4}, {"MASK_ALIGN", 16}};
  const jit::CompiledKernel k = testing::assemble_sm90a(kernels::gemm().build(meta), jit::Backend::Llvm, 12, 4);
  CHECK(contains(k.ptx, "st.global.v4"));
}

TEST_CASE("gemm DROPOUT_MASK: a zero MASK_TILES_PER_STEP or an odd MASK_BLOCK_W is a build error naming the value") {
  CHECK_THROWS_WITH(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_TILES_PER_STEP", 0}}),
                    doctest::Contains("MASK_TILES_PER_STEP = 0 must be at least 1"));
  CHECK_THROWS_WITH(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_BLOCK_W", 3}}), doctest::Contains("BLOCK_W must be even (one Philox call group covers 64 key columns = 2 words), got 3"));
}

TEST_CASE("gemm DROPOUT_MASK on sm_90a: the TMA + wgmma pipeline, two groups in flight, no serialised wgmma, no spills") {
  if (testing::no_ptxas()) return;
  const Meta plain{{"BLOCK_M", 128}, {"BLOCK_N", 256}, {"BLOCK_K", 64}, {"B_KMAJOR", true}, {"GROUP_M", 8}, {"OUT_DTYPE", bf16}};
  Meta with = plain;
  with.emplace_back("DROPOUT_MASK", true);
  with.emplace_back("MASK_BLOCK_W", 8);
  for (const bool side : {false, true}) {
    const Meta* meta = side ? &with : &plain;
    INFO("DROPOUT_MASK=" << side);
    const jit::CompiledKernel k = testing::assemble_sm90a(kernels::gemm().build(*meta), jit::Backend::Llvm, 8, 4);
    CHECK(contains(k.ptx, "cp.async.bulk.tensor"));
    CHECK(contains(k.ptx, "wgmma.mma_async"));
    // the side work runs with this step's and the previous step's MMAs queued
    CHECK(contains(k.ptx, side ? "wgmma.wait_group.sync.aligned 2" : "wgmma.wait_group.sync.aligned 1"));
    const std::string log = ptxas_log(k);
    CHECK_MESSAGE(!contains(log, "serialized"), log);
    CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
  }
}

TEST_CASE("gemm MASK_WARPS on sm_90a: the GEMM on 8 warps beside 4 mask warps, registers moved by setmaxnreg, still the pipeline") {
  if (testing::no_ptxas()) return;
  const Meta base{{"BLOCK_M", 128}, {"BLOCK_N", 256},  {"BLOCK_K", 64},     {"B_KMAJOR", true}, {"GROUP_M", 8},
                  {"OUT_DTYPE", bf16}, {"DROPOUT_MASK", true}, {"MASK_BLOCK_W", 8}, {"MASK_WARPS", 4}};
  for (const bool registers : {false, true}) {
    INFO("setmaxnreg: " << registers);
    Meta meta = base;
    if (registers) meta.insert(meta.end(), {{"MMA_REGISTERS", 224}, {"MASK_REGISTERS", 56}});
    const jit::CompiledKernel k = testing::assemble_sm90a(kernels::gemm().build(meta), jit::Backend::Llvm, 12, 4);
    CHECK(k.num_threads == 384);
    CHECK(contains(k.ptx, "cp.async.bulk.tensor"));
    CHECK(contains(k.ptx, "wgmma.mma_async"));
    // no side work in the K loop: one group in flight, as in the plain GEMM
    CHECK(contains(k.ptx, "wgmma.wait_group.sync.aligned 1"));
    CHECK_FALSE(contains(k.ptx, "wgmma.wait_group.sync.aligned 2"));
    // the roles' own barriers: the GEMM's 8 warps, the mask's 4 (never all 384 threads past the start)
    CHECK(contains(k.ptx, ", 256;"));
    CHECK(contains(k.ptx, ", 128;"));
    CHECK(contains(k.ptx, "setmaxnreg.inc.sync.aligned.u32 224;") == registers);
    CHECK(contains(k.ptx, "setmaxnreg.dec.sync.aligned.u32 56;") == registers);
    CHECK(contains(k.ptx, ".minnctapersm 1") == registers);  // the cap at entry setmaxnreg needs
    const std::string log = ptxas_log(k);
    CHECK_MESSAGE(!contains(log, "serialized"), log);
    CHECK_MESSAGE(!contains(log, "C7508"), log);  // setmaxnreg ignored
    CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
    CHECK(k.info.registers <= 168);  // 65536 / 384 threads at entry
  }
}

namespace {

// A K loop of the pipeline's shape plus one store in its body: of the loaded A tile (which only
// exists in shared memory when pipelined) or of a value that reads none of the pipeline's tiles.
const Kernel& gemm_with_store() {
  static const Kernel k = kernel("gemm_with_store", [](Builder& kb) {
    const bool reads_a = kb.meta<bool>("READS_A", false);
    const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
    auto A = kb.tensor("A", bf16, 2, rm), B = kb.tensor("B", bf16, 2, rm), C = kb.tensor("C", f32, 2, rm), Out = kb.tensor("Out", bf16, 2, rm);
    Tile m0 = program_id(0) * 64, n0 = program_id(1) * 64;  // (window offsets from outside the loop)
    Var acc = zeros(f32, {64, 64});
    for_range(0, A.size(1), 64, [&](Tile k0) {
      Tile a = load(A.block({m0, k0}, {64, 64}));
      acc = dot(a, trans(load(B.block({n0, k0}, {64, 64}))), acc);
      store(Out.block({m0, k0}, {64, 64}), reads_a ? a : cast(bf16, k0 + arange(0, 64))[row] + zeros(bf16, {64, 64}));
    });
    store(C.block({m0, n0}, {64, 64}), acc);
  });
  return k;
}

}  // namespace

TEST_CASE("TMA pipeline matcher: side work that reads a pipelined tile is refused; other side work is kept, scalar offsets are not") {
  for (bool reads_a : {false, true}) {
    INFO("READS_A=" << reads_a);
    const ir::Function f = gemm_with_store().build({{"READS_A", reads_a}});
    const ir::Op* loop = nullptr;
    ir::walk(f.body, [&](const ir::Op& op) {
      if (op.kind == ir::OpKind::for_) loop = &op;
    });
    REQUIRE(loop);
    const auto m = jit::match_tma_dot_loop(f, *loop, 4, "sm_90a", {});
    CHECK(m.has_value() == !reads_a);
    if (m) CHECK(std::any_of(m->side_ops.begin(), m->side_ops.end(), [](const ir::Op* op) { return op->kind == ir::OpKind::block_store; }));
  }
  // the plain GEMM: a match without side work
  const ir::Function g = kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}});
  const ir::Op* loop = nullptr;
  ir::walk(g.body, [&](const ir::Op& op) {
    if (op.kind == ir::OpKind::for_) loop = &op;
  });
  REQUIRE(loop);
  const auto m = jit::match_tma_dot_loop(g, *loop, 8, "sm_90a", {});
  REQUIRE(m.has_value());
  CHECK(m->side_ops.empty());
}
