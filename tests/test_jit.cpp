// JIT in CI (no GPU): every library, example and test kernel lowers through the pipeline, its PTX
// assembles for sm_90a with ptxas, without spills; pass dumps and errors behave.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <set>

#include "jit/compile.hpp"
#include "jit/ptxas_workarounds.hpp"
#include "jit/lower.hpp"
#include "jit/scalar_facts.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/dropout_mask.hpp"
#include "kernels/gemm.hpp"
#include "api/registry.hpp"
#include "runtime/bundle.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/interpreter.hpp"
#include "jit/nvrtc.hpp"
#include "ptxas_testing.hpp"
#include "test_kernels.hpp"

using namespace tilejit;
using namespace tilejit::lang;

namespace {

struct Case {
  std::string label;
  ir::Function fn;
  int num_warps = 4;
  bool must_not_spill = true;  // the default configurations; larger ones are reported, not asserted
  // bytes nvrtc's build may spill where LLVM's does not (the CUDA C path is the fallback backend)
  int64_t nvrtc_spill_allowed = 0;
};

std::vector<Case> all_kernels() {
  std::vector<Case> cases;
  cases.push_back({"vector_add", test_kernels::vector_add.build()});
  for (DType t : {f32, bf16}) cases.push_back({fmt::format("softmax {}", ir::name(t)), test_kernels::softmax.build({{"DTYPE", t}, {"ROWS", 4}})});
  for (int w : {1, 4, 8}) cases.push_back({fmt::format("reductions w{}", w), test_kernels::reductions.build(), w, w > 1});
  cases.push_back({"elementwise", test_kernels::elementwise.build()});
  cases.push_back({"atomics", test_kernels::atomics.build()});
  cases.push_back({"atomic_ops (rmw, cas, orders, scopes)", test_kernels::atomic_ops().build()});
  cases.push_back({"window_atomics (max, min, and, or, xor on windows)", test_kernels::window_atomics().build()});
  for (DType out : {f32, bf16, f16})
    cases.push_back({fmt::format("gemm 128x128x32 -> {}", ir::name(out)), kernels::gemm().build({{"OUT_DTYPE", out}}), 8});
  cases.push_back({"gemm 64x64x32", kernels::gemm().build({{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}})});
  // the library's default GEMM schedule (TMA + wgmma on sm_90a), as `tilejit compile gemm` uses it
  const library::LibraryKernel* g = library::find("gemm");
  cases.push_back({"gemm default schedule", kernels::gemm().build(g->default_meta), g->num_warps});
  // The generic (mma.sync) attention path is register-heavy; issue #6 brings its Hopper schedule.
  for (bool causal : {false, true})
    cases.push_back({fmt::format("attention causal={}", causal), kernels::attention_forward().build({{"CAUSAL", causal}}), 4, false});
  cases.push_back({"attention D128", kernels::attention_forward().build({{"HEAD_DIM", 128}}), 4, false});
  cases.push_back({"attention varlen causal", kernels::attention_forward().build({{"CAUSAL", true}, {"VARLEN", true}}), 4, false});
  // Hopper schedule options of the forward (8 warps: two warpgroups): warpgroup turns, P V pipelined
  const lang::Meta hopper_fwd{{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 128}};
  // (the D128 default is PIPELINE_PV with the ring producer and PV_PEEL [045]: here with PINGPONG,
  // without PV_PEEL, and the previous default, PIPELINE_QK without the producer)
  for (const lang::Meta& opt : {lang::Meta{{"PINGPONG", true}}, lang::Meta{{"PV_PEEL", false}},
                                lang::Meta{{"RING_PRODUCER", false}, {"PIPELINE_PV", false}}, lang::Meta{{"PERSISTENT", true}},
                                lang::Meta{{"PERSISTENT", true}, {"CAUSAL", true}}}) {
    lang::Meta m = hopper_fwd;
    m.insert(m.end(), opt.begin(), opt.end());
    // the persistent causal default with O by TMA stores (decision 056): nvrtc spills 4 B
    const bool persistent_causal = opt.size() == 2;
    cases.push_back({fmt::format("attention D128 {}={}{}", opt[0].first, std::get<bool>(opt[0].second), persistent_causal ? " causal" : ""),
                     kernels::attention_forward().build(m), 8, true, persistent_causal ? 8 : 0});
  }
  cases.push_back({"segments (Tensor::slice)", test_kernels::segments.build()});
  cases.push_back({"ordered_sum (semaphores)", test_kernels::ordered_sum.build()});
  cases.push_back({"ordered_tile_add (atomic_add after a semaphore, TMA)", test_kernels::ordered_tile_add.build()});
  // the packed dropout keep-mask (Philox4x32-10 per 16 elements): the default schedule, and a wider
  // one (reported: nvrtc spills 8 B there, 2026-11)
  const library::LibraryKernel* dm = library::find("dropout_mask");
  cases.push_back({"dropout_mask default schedule", kernels::dropout_mask().build(dm->default_meta), dm->num_warps});
  cases.push_back({"dropout_mask 32x8 words", kernels::dropout_mask().build({{"BLOCK_M", 32}, {"BLOCK_W", 8}}), 4, false});
  return cases;
}

}  // namespace

TEST_CASE("every kernel lowers through both backends to PTX that ptxas assembles for sm_90a without spills") {
  for (const Case& c : all_kernels())
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(c.label << " via " << jit::to_string(backend));
    jit::CompileOptions o;
    o.backend = backend;
    o.num_warps = c.num_warps;
    o.ptx_tool = jit::PtxTool::Ptxas;
    jit::CompiledKernel k = jit::compile(c.fn, o);
    CHECK(k.ptx.find(".entry " + c.fn.name) != std::string::npos);
    CHECK(k.cubin.size() > 1000);
    CHECK(k.info.registers > 0);
    if (c.must_not_spill) {
      const int64_t allowed = backend == jit::Backend::Nvrtc ? c.nvrtc_spill_allowed : 0;
      CHECK_MESSAGE(k.info.spill_store_bytes <= allowed, k.info.to_string());
      CHECK_MESSAGE(k.info.spill_load_bytes <= allowed, k.info.to_string());
    }
    // (a ring producer's warpgroup comes on top: lang::ring_producer)
    CHECK(k.num_threads == 32 * c.num_warps + (k.tile_ir.find("ring_producer") != std::string::npos ? 128 : 0));
    MESSAGE(fmt::format("{} via {}: {}; IR->PTX {:.1f} ms, PTX->cubin {:.1f} ms", c.label, jit::to_string(backend), k.info.to_string(),
                        k.timings.passes_ms + k.timings.backend_ms, k.timings.ptx_to_cubin_ms));
  }
}

// min_programs_per_sm: a launch bound both backends hand to ptxas (.minnctapersm), which then caps
// the registers: the D64 dK/dV kernel (201 registers unbounded through LLVM) fits three programs of 128
// threads per SM (<= 168); 0 emits nothing; a value past 32 is a clear error.
TEST_CASE("atomics in PTX: order and scope on every atom; float max at sys scope refused by the llvm backend") {
  for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(b));
    jit::CompileOptions o;
    o.backend = b;
    o.make_cubin = false;
    const std::string ptx = jit::compile(test_kernels::atomic_ops().build(), o).ptx;
    for (const char* want : {"atom.relaxed.gpu.global.add", "atom.acquire.gpu.global.and.b32", "atom.acq_rel.sys.global.xor.b32",
                             "atom.acq_rel.gpu.global.max.s64", "atom.acquire.gpu.global.cas.b32", "atom.acq_rel.cta.global.exch.b64",
                             "fence.acq_rel.gpu"})
      CHECK_MESSAGE(ptx.find(want) != std::string::npos, want);
  }
  const Kernel sys_max = kernel("sys_max", [](Builder& k) {
    atomic_max(k.pointer("P", f32), load(k.pointer("X", f32) + arange(0, 32)), {.scope = MemScope::sys});
  });
  jit::CompileOptions o;
  o.make_cubin = false;
  CHECK_THROWS_WITH(jit::compile(sys_max.build(), o),
                    doctest::Contains("atomic_max on f32 at scope sys is not supported by the llvm backend"));
  o.backend = jit::Backend::Nvrtc;
  CHECK(jit::compile(sys_max.build(), o).ptx.find("atom.relaxed.sys.global.cas.b32") != std::string::npos);
}

TEST_CASE("min_programs_per_sm: .minnctapersm in the PTX, registers capped for that many programs per SM") {
  const ir::Function f = kernels::attention_backward_dkdv().build({{"HEAD_DIM", 64}, {"BLOCK_M", 64}, {"BLOCK_N", 64}, {"CAUSAL", true}});
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(backend));
    jit::CompileOptions o;
    o.backend = backend;
    o.num_warps = 4;
    o.pipeline.stages = 2;
    o.ptx_tool = jit::PtxTool::Ptxas;
    const jit::CompiledKernel free = jit::compile(f, o);
    o.min_programs_per_sm = 3;
    const jit::CompiledKernel bounded = jit::compile(f, o);
    CHECK(free.ptx.find(".minnctapersm") == std::string::npos);
    CHECK(bounded.ptx.find(".minnctapersm 3") != std::string::npos);
    if (backend == jit::Backend::Llvm) CHECK(free.info.registers > 168);  // (the nvrtc build happens to need 164)
    CHECK(bounded.info.registers <= 168);
    MESSAGE(fmt::format("D64 causal dK/dV via {}: {} unbounded, {} for 3 programs per SM", jit::to_string(backend), free.info.to_string(),
                        bounded.info.to_string()));
  }
  jit::CompileOptions bad;
  bad.min_programs_per_sm = 33;
  CHECK_THROWS_WITH_AS(jit::compile(f, bad), doctest::Contains("min_programs_per_sm = 33 (valid: 0 = no bound, 1 to 32)"), jit::CompileError);
  for (int stages : {0, -1, 9, 1000}) {  // issue 27: accepted before (the pipeline silently off)
    jit::CompileOptions s;
    s.pipeline.stages = stages;
    CHECK_THROWS_WITH_AS(jit::compile(f, s), doctest::Contains(fmt::format("pipeline stages = {} (valid: 1 to 8", stages).c_str()),
                         jit::CompileError);
  }
}

TEST_CASE("compile budget: tiles far past the register file are refused in milliseconds, not minutes in ptxas") {
  // issue 27: an f32 [256, 1024] softmax on 4 warps (2048 elements per thread) took ptxas 232 s
  // and 2.5 GB; [128, 512] (512 per thread) 10 s
  auto softmax = [](int64_t r, int64_t c) {
    return kernel("big_softmax", [r, c](Builder& b) {
      auto X = b.tensor("X", f32, 2), Y = b.tensor("Y", f32, 2);
      Tile x = load(X.block({0, 0}, {r, c}));
      Tile e = exp(x - max(x, 1)[col]);
      store(Y.block({0, 0}, {r, c}), e / sum(e, 1)[col]);
    }).build();
  };
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 4;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    jit::compile(softmax(256, 1024), o);
    FAIL("compiled a tile of 2048 elements per thread");
  } catch (const jit::CompileError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("kernel 'big_softmax': the tile f32[256,1024] at ") != std::string::npos, what);
    CHECK_MESSAGE(what.find("holds 2048 elements per thread on 4 warps (valid: at most 1024") != std::string::npos, what);
    CHECK_MESSAGE(what.find("test_jit.cpp:") != std::string::npos, what);  // the user's line
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
  o.num_warps = 16;  // the same tile on 16 warps: 512 per thread, compiled
  CHECK(jit::compile(softmax(256, 1024), o).ptx.find(".entry big_softmax") != std::string::npos);

  // many ops on moderate tiles: the unrolled code past the budget
  const ir::Function chain = kernel("long_chain", [](Builder& b) {
    auto X = b.tensor("X", f32, 2), Y = b.tensor("Y", f32, 2);
    Tile x = load(X.block({0, 0}, {128, 128}));
    for (int i = 0; i < 1100; ++i) x = x * 1.0001f + float(i);  // 2 ops of 128 per thread each
    store(Y.block({0, 0}, {128, 128}), x);
  }).build();
  o.num_warps = 4;
  CHECK_THROWS_WITH_AS(jit::compile(chain, o), doctest::Contains("tile elements per thread on 4 warps (valid: at most 131072"),
                       jit::CompileError);
}

TEST_CASE("a kernel that spills says so: CompiledKernel::warnings and stderr (issue 26)") {
  if (testing::no_ptxas()) return;
  const ir::Function f = kernel("spilling_softmax", [](Builder& b) {
    auto X = b.tensor("X", f32, 2), Y = b.tensor("Y", f32, 2);
    Tile x = load(X.block({0, 0}, {64, 512}));  // 256 f32 per thread on 4 warps, twice over
    Tile e = exp(x - max(x, 1)[col]);
    store(Y.block({0, 0}, {64, 512}), e / sum(e, 1)[col]);
  }).build();
  jit::CompileOptions o;
  o.num_warps = 4;
  o.ptx_tool = jit::PtxTool::Ptxas;
  const jit::CompiledKernel k = jit::compile(f, o);
  REQUIRE(k.info.spill_store_bytes > 0);
  REQUIRE(k.warnings.size() == 1);
  CHECK_MESSAGE(k.warnings[0].find("kernel 'spilling_softmax' spills ") != std::string::npos, k.warnings[0]);
  CHECK_MESSAGE(k.warnings[0].find("smaller tiles or more warps") != std::string::npos, k.warnings[0]);
  // the library GEMM does not spill: no warning
  o.num_warps = 8;
  CHECK(jit::compile(kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}}), o).warnings.empty());
}

TEST_CASE("the K-major GEMM on sm_90a is a TMA + wgmma pipeline: wgmma.mma_async, cp.async.bulk.tensor, mbarriers") {
  jit::CompileOptions o;
  o.num_warps = 8;
  o.ptx_tool = jit::PtxTool::Ptxas;
  auto k = jit::compile(kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}}), o);
  CHECK(k.ptx.find("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") != std::string::npos);
  CHECK(k.ptx.find("cp.async.bulk.tensor.2d") != std::string::npos);
  CHECK(k.ptx.find("mbarrier.try_wait.parity") != std::string::npos);
  CHECK(k.tensor_maps.size() == 2);
  CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
  CHECK_MESSAGE(k.info.spill_load_bytes == 0, k.info.to_string());
  // B[K,N] (MN-major) also takes the pipeline: 64-column TMA boxes, wgmma with B transposed
  auto mn = jit::compile(kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", false}}), o);
  CHECK(mn.ptx.find("p, 1, 1, 0, 1;") != std::string::npos);
  REQUIRE(mn.tensor_maps.size() == 2);
  CHECK(mn.tensor_maps[1].box == std::vector<int64_t>{64, 64});
  CHECK_MESSAGE(mn.info.spill_store_bytes == 0, mn.info.to_string());
  // without the pipeline (or on another arch) the same kernel takes the portable path
  o.pipeline.enabled = false;
  o.make_cubin = false;
  auto g = jit::compile(kernels::gemm().build({{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"B_KMAJOR", true}}), o);
  CHECK(g.ptx.find("wgmma") == std::string::npos);
  CHECK(g.ptx.find("mma.sync.aligned.m16n8k16") != std::string::npos);
}

TEST_CASE("min_programs_per_sm too high for a wgmma tile: a tilejit error naming the bound, the cap and the need") {
  if (testing::no_ptxas()) return;
  jit::CompileOptions o;
  o.num_warps = 8;
  o.ptx_tool = jit::PtxTool::Ptxas;
  o.min_programs_per_sm = 2;  // 65536 / (256 threads x 2) = 128 registers; a 128 x 256 tile's wgmma needs more
  const ir::Function f = kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}});
  try {
    jit::compile(f, o);
    FAIL("compiled with a register cap of 128");
  } catch (const jit::CompileError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("tilejit: kernel 'gemm': min_programs_per_sm = 2 caps registers at 128 per thread") == 0, what);
    CHECK_MESSAGE(what.find("needs 1") != std::string::npos, what);  // ptxas's number (154 with ptxas 13)
    CHECK_MESSAGE(what.find("lower min_programs_per_sm") != std::string::npos, what);
    CHECK_MESSAGE(what.find("C7602") != std::string::npos, what);  // ptxas's own text kept below
  }
  o.min_programs_per_sm = 1;  // the same tile under the bound that allows 255
  CHECK(jit::compile(f, o).cubin.size() > 1000);
}

namespace {

// The warp-collective asm calls (mma.sync, wgmma.*) in a kernel's LLVM IR and whether each carries
// the convergent attribute (a call's trailing "#N" and the module's "attributes #N = { ... }").
std::vector<std::pair<std::string, bool>> collective_asm_calls(const std::string& ir) {
  std::map<std::string, std::string> groups;
  std::vector<std::string> lines;
  for (size_t at = 0; at < ir.size();) {
    size_t end = ir.find('\n', at);
    if (end == std::string::npos) end = ir.size();
    lines.push_back(ir.substr(at, end - at));
    at = end + 1;
  }
  for (const std::string& l : lines)
    if (l.rfind("attributes #", 0) == 0) groups[l.substr(11, l.find(' ', 11) - 11)] = l;
  std::vector<std::pair<std::string, bool>> calls;
  for (const std::string& l : lines) {
    if (l.find(" asm ") == std::string::npos && l.find(" asm sideeffect ") == std::string::npos) continue;
    if (l.find("mma.sync") == std::string::npos && l.find("wgmma.") == std::string::npos) continue;
    const size_t hash = l.rfind(" #");
    const std::string group = hash == std::string::npos ? "" : l.substr(hash + 1);
    calls.push_back({l.substr(0, 120), groups.count(group) && groups[group].find("convergent") != std::string::npos});
  }
  return calls;
}

}  // namespace

TEST_CASE("8/16-bit abs, neg, 0 - x and x * -1 never reach ptxas as abs.s16 / neg.s16 (both backends)") {
  // ptxas gives abs.s16 / neg.s16 of -32768 as +32768 in a register later read as 16 bits (found by
  // the fuzzer on the H100): -(i8 -128) read as i16 was 128
  for (DType d : {i8, i16}) {
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(ir::name(d) << " " << jit::to_string(be));
      jit::CompileOptions o;
      o.make_cubin = false;
      o.backend = be;
      const std::string ptx = jit::compile(test_kernels::narrow_int_negation().build({{"DTYPE", d}}), o).ptx;
      CHECK(ptx.find(".entry narrow_int_negation") != std::string::npos);
      CHECK_MESSAGE(ptx.find("neg.s16") == std::string::npos, ptx);
      CHECK_MESSAGE(ptx.find("abs.s16") == std::string::npos, ptx);
    }
  }
}

TEST_CASE("integer negations reach ptxas as not + add 1: ptxas 13.0 drops one inside a fused VIMNMX3 (fuzzer seed 723574)") {
  std::string ptx =
      "\tneg.s32 \t%r23, %r1;\n"
      "\t@%p3 neg.s16 %rs2, %rs1;\n"
      "\tsub.s32 %r5, 0, %r4;\n"
      "\tmul.lo.s32 %r7, %r6, -1;\n"
      "\tmul.lo.u32 %r9, -1, %r8;\n"
      "\tneg.s64 %rd2, %rd1;\n"          // 64-bit min/max is not fused: left alone
      "\tsub.s32 %r11, %r10, %r1;\n"     // a real subtraction
      "\tneg.f32 %f2, %f1;\n"
      "\tmax.s32 %r12, %r23, %r5;";
  CHECK(jit::rewrite_integer_negations(ptx) == 5);
  CHECK(ptx == "\t{ .reg .b32 %tj_not; not.b32 %tj_not, %r1; add.s32 %r23, %tj_not, 1; }\n"
               "\t{ .reg .b16 %tj_not; @%p3 not.b16 %tj_not, %rs1; @%p3 add.s16 %rs2, %tj_not, 1; }\n"
               "\t{ .reg .b32 %tj_not; not.b32 %tj_not, %r4; add.s32 %r5, %tj_not, 1; }\n"
               "\t{ .reg .b32 %tj_not; not.b32 %tj_not, %r6; add.s32 %r7, %tj_not, 1; }\n"
               "\t{ .reg .b32 %tj_not; not.b32 %tj_not, %r8; add.s32 %r9, %tj_not, 1; }\n"
               "\tneg.s64 %rd2, %rd1;\n"
               "\tsub.s32 %r11, %r10, %r1;\n"
               "\tneg.f32 %f2, %f1;\n"
               "\tmax.s32 %r12, %r23, %r5;");
  for (DType d : {i32, i16, i8})
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(ir::name(d) << " " << jit::to_string(be));
      jit::CompileOptions o;
      o.backend = be;
      o.make_cubin = !jit::find_ptxas().empty();
      o.ptx_tool = jit::PtxTool::Ptxas;
      const jit::CompiledKernel k = jit::compile(test_kernels::negated_min_max().build({{"DTYPE", d}}), o);
      CHECK(k.ptx.find(".entry negated_min_max") != std::string::npos);
      CHECK(k.ptx.find("not.b") != std::string::npos);
      CHECK_MESSAGE(k.ptx.find("neg.s32") == std::string::npos, k.ptx);
      CHECK_MESSAGE(k.ptx.find("neg.s16") == std::string::npos, k.ptx);
      if (o.make_cubin) CHECK(!k.cubin.empty());
    }
}

TEST_CASE("constant i32 window offsets near 2^31 are computed in 64 bits: nvrtc cannot rebuild an index from a wrapping sum") {
  jit::CompileOptions o;
  o.make_cubin = false;
  o.backend = jit::Backend::Nvrtc;
  const std::string ptx = jit::compile(test_kernels::wrapping_window_offset().build(), o).ptx;
  // the miscompile's signature (fuzzer seed 407120): a column rebuilt as sext(2^31 - 1 + x) - (2^31 - 1)
  CHECK_MESSAGE(ptx.find(", -2147483647;") == std::string::npos, ptx);
  o.backend = jit::Backend::Llvm;
  CHECK(jit::compile(test_kernels::wrapping_window_offset().build(), o).ptx.find(".entry wrapping_window_offset") != std::string::npos);
}

TEST_CASE("LLVM: mma.sync and wgmma asm are convergent, so LLVM cannot sink them into a divergent branch") {
  // Found by the fuzzer (issue 28): an mma.sync whose result only an atomic's element-add fallback
  // read was sunk into that per-element branch; the .aligned instruction then hung the warp.
  const Kernel k = kernel("mma_beside_atomic", [](Builder& b) {
    auto A = b.tensor("A", bf16, 2, {.align_bytes = 16, .contiguous_last = true});
    auto B = b.tensor("B", bf16, 2, {.align_bytes = 16, .contiguous_last = true});
    auto Acc = b.tensor("Acc", i64, 2);
    auto row0 = b.scalar("row0", i64);
    Tile d = dot(load(A.block({0, 0}, {128, 16})), load(B.block({0, 0}, {16, 16})));
    atomic_add(Acc.block({row0, 1}, {128, 16}), cast(i64, d));
  });
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 8;
  const std::string mma_ir = jit::compile(k.build(), o).backend_source;
  o.num_warps = 8;
  const std::string wgmma_ir = jit::compile(kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}}), o).backend_source;
  for (const std::string* ir : {&mma_ir, &wgmma_ir}) {
    const auto calls = collective_asm_calls(*ir);
    CHECK(calls.size() >= 2);
    for (const auto& [call, convergent] : calls) CHECK_MESSAGE(convergent, call);
  }
  CHECK(mma_ir.find("mma.sync") != std::string::npos);
  CHECK(wgmma_ir.find("wgmma.mma_async") != std::string::npos);
}

TEST_CASE("load_at_use: the window is read again in its consumer's layout, unless something was stored in between") {
  jit::CompileOptions o;
  o.make_cubin = false;
  auto count = [](const std::string& ptx, const std::string& what) {
    size_t n = 0;
    for (size_t at = ptx.find(what); at != std::string::npos; at = ptx.find(what, at + 1)) ++n;
    return n;
  };
  const std::string plain = jit::compile(test_kernels::masked_product.build({{"AT_USE", false}}), o).ptx;
  const std::string at_use = jit::compile(test_kernels::masked_product.build(), o).ptx;
  const std::string stored = jit::compile(test_kernels::masked_product.build({{"STORE_BETWEEN", true}}), o).ptx;
  MESSAGE(fmt::format("bar.sync: load {}, load_at_use {}, load_at_use with a store between {}", count(plain, "bar.sync"),
                      count(at_use, "bar.sync"), count(stored, "bar.sync")));
  // the word tile's exchange through shared memory (a write, two barriers, a read) is gone...
  CHECK(count(at_use, "bar.sync") + 2 <= count(plain, "bar.sync"));
  // ...and comes back when W was overwritten between the load and its use
  CHECK(count(stored, "bar.sync") >= count(plain, "bar.sync"));
  // replicated registers load once: 64 x 2 words over 128 threads, each thread's 16 rows x 2 words
  // of an m16n8 accumulator at most, never one load per element (64 per thread)
  CHECK(count(at_use, "ld.global") <= 2 * 16 + 16);
}

TEST_CASE("semaphores: the interpreter runs waiting programs concurrently in the order they impose; a deadlock is an error; PTX") {
  const int64_t P = 12;
  tilejit::runtime::HostTensor x(f32, {P, 256}), acc(f32, {256}), order(i32, {P}), sem(i32, {1});
  x.fill_normal(3, 0, 1e3);
  for (int64_t e = 0; e < acc.numel(); ++e) acc.set_flat(e, 0.1);
  order.poison();
  sem.set_flat(0, 0);
  tilejit::runtime::interpret(test_kernels::ordered_sum.build(), {P}, {x, acc, order, sem});
  for (int64_t p = 0; p < P; ++p) CHECK(order.get_flat(p) == static_cast<double>(P - 1 - p));  // the last program went first
  CHECK(sem.get_flat(0) == static_cast<double>(P));
  int64_t differ = 0;  // the sum in that order, in f32, bit for bit
  for (int64_t c = 0; c < 256; ++c) {
    float s = 0.1f;
    for (int64_t p = P - 1; p >= 0; --p) s += static_cast<float>(x.get({p, c}));
    differ += acc.get_flat(c) != static_cast<double>(s) ? 1 : 0;
  }
  CHECK(differ == 0);
  // nobody can start: every program waits, reported instead of hanging
  sem.set_flat(0, 0);
  CHECK_THROWS_WITH_AS(tilejit::runtime::interpret(test_kernels::ordered_sum.build({{"OFFSET", 1}}), {P}, {x, acc, order, sem}),
                       doctest::Contains("deadlock: waits for the semaphore to reach"), tilejit::runtime::InterpretError);
  // on sm_90a: thread 0 spins on acquire loads, then a barrier; a barrier, then a release add
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(backend));
    jit::CompileOptions o;
    o.backend = backend;
    o.make_cubin = false;
    const std::string ptx = jit::compile(test_kernels::ordered_sum.build(), o).ptx;
    CHECK(ptx.find("ld.acquire.gpu.global") != std::string::npos);
    CHECK(ptx.find("red.release.gpu.global.add.s32") != std::string::npos);
    CHECK(ptx.find("fence.acq_rel.gpu") != std::string::npos);
  }
}

TEST_CASE("atomic_add on a window after a semaphore: the interpreter adds in the imposed order; sm_90a adds by TMA, thread 0 waits") {
  const int64_t P = 9;
  tilejit::runtime::HostTensor x(f32, {P * 64, 64}), acc(f32, {64, 64}), sem(i32, {1});
  x.fill_normal(4, 0, 1e3);
  for (int64_t e = 0; e < acc.numel(); ++e) acc.set_flat(e, 0.1);
  sem.set_flat(0, 0);
  tilejit::runtime::interpret(test_kernels::ordered_tile_add.build(), {P}, {x, acc, sem});
  CHECK(sem.get_flat(0) == static_cast<double>(P));
  int64_t differ = 0;  // the last program's tile first, in f32, bit for bit
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 64; ++c) {
      float s = 0.1f;
      for (int64_t p = P - 1; p >= 0; --p) s += static_cast<float>(x.get({p * 64 + r, c}));
      differ += acc.get({r, c}) != static_cast<double>(s) ? 1 : 0;
    }
  CHECK(differ == 0);
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(backend));
    jit::CompileOptions o;
    o.backend = backend;
    o.make_cubin = false;
    const std::string ptx = jit::compile(test_kernels::ordered_tile_add.build(), o).ptx;
    CHECK(ptx.find("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group") != std::string::npos);
    CHECK(ptx.find("ld.acquire.gpu.global") != std::string::npos);
    CHECK(ptx.find("fence.proxy.async.global") != std::string::npos);
    CHECK(ptx.find("cp.async.bulk.wait_group 0") != std::string::npos);  // the signal waits for the add's writes
  }
}

TEST_CASE("warpgroup turns: named barriers with 8 warps (none with 4); a nested turn is a BuildError; PIPELINE_PV keeps one MMA in flight") {
  const lang::Meta m{{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 128}, {"PINGPONG", true}, {"PIPELINE_PV", true}, {"PIPELINE_QK", false}};
  const ir::Function fn = kernels::attention_forward().build(m);
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(backend));
    jit::CompileOptions o;
    o.backend = backend;
    o.num_warps = 8;
    o.ptx_tool = jit::PtxTool::Ptxas;
    const jit::CompiledKernel k = jit::compile(fn, o);
    // warpgroup 1 hands the first turn over, each turn starts with bar.sync and ends with bar.arrive
    CHECK(k.ptx.find("bar.arrive") != std::string::npos);
    CHECK(k.ptx.find("bar.sync %r") != std::string::npos);
    // S_j's wait leaves P_{j-1} V_{j-1} in flight; the later wait is fenced (a never-taken loop)
    CHECK(k.ptx.find("wgmma.wait_group.sync.aligned 1;") != std::string::npos);
    CHECK(k.ptx.find("%smid") != std::string::npos);
    CHECK(k.info.spill_store_bytes == 0);
    o.num_warps = 4;  // one warpgroup: the turns are no-ops
    const jit::CompiledKernel k4 = jit::compile(kernels::attention_forward().build(
                                                    {{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"HEAD_DIM", 64}, {"PINGPONG", true}}),
                                                o);
    CHECK(k4.ptx.find("bar.arrive") == std::string::npos);
  }
  auto nested = kernel("nested_turns", [](Builder& kb) {
    auto X = kb.pointer("X", f32);
    warpgroup_turn([&] { warpgroup_turn([&] { store(X + arange(0, 8), zeros(f32, {8})); }); });
  });
  CHECK_THROWS_WITH_AS(nested.build(), doctest::Contains("turns do not nest"), BuildError);
  // a reduction across warps exchanges through shared memory (bar.sync 0): inside a turn the
  // other warpgroup never gets there, so the lowering refuses it
  auto exchange = kernel("exchange_in_turn", [](Builder& kb) {
    auto X = kb.pointer("X", f32), Y = kb.pointer("Y", f32);
    Tile t = load(X + (arange(0, 64)[col] * 64 + arange(0, 64)[row]));
    warpgroup_turn([&] { store(Y + arange(0, 64), sum(t, 0)); });
  });
  jit::CompileOptions o;
  o.num_warps = 8;
  CHECK_THROWS_WITH_AS(jit::compile(exchange.build(), o), doctest::Contains("a warpgroup turn must not contain"), jit::LoweringError);
}

TEST_CASE("dot lowers to mma.sync for 16-bit operands and to FMA otherwise") {
  jit::CompileOptions o;
  o.make_cubin = false;
  o.arch = "sm_80";  // before Hopper: no wgmma, no TMA
  auto k = jit::compile(kernels::gemm().build({{"BLOCK_K", 32}}), o);
  CHECK(k.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos);
  Kernel f32dot = kernel("f32dot", [](Builder& b) {
    auto A = b.tensor("A", f32, 2), C = b.tensor("C", f32, 2);
    auto a = load(A.block({0, 0}, {32, 32}));
    store(C.block({0, 0}, {32, 32}), dot(a, a));
  });
  auto f = jit::compile(f32dot.build(), o);
  CHECK(f.ptx.find("mma.sync") == std::string::npos);
  CHECK(f.ptx.find("fma.rn.f32") == std::string::npos);  // no contraction: mul then add, like the interpreter
}

TEST_CASE("--dump-after prints the IR after the chosen pass; unknown passes are rejected") {
  auto fn = test_kernels::vector_add.build();
  for (const std::string& pass : jit::pass_names()) {
    jit::CompileOptions o;
    o.dump_after = pass;
    o.make_cubin = pass == "ptx-to-cubin";
    auto k = jit::compile(fn, o);
    if (pass != "ptx-to-cubin") CHECK_MESSAGE(!k.dump.empty(), pass);
  }
  jit::CompileOptions o;
  o.make_cubin = false;
  o.dump_after = "lower";
  CHECK(jit::compile(fn, o).dump.find("thread_func @vector_add") != std::string::npos);
  o.dump_after = "assign-layouts";
  CHECK(jit::compile(fn, o).dump.find("#layout<") != std::string::npos);
  o.dump_after = "no-such-pass";
  CHECK_THROWS_WITH_AS(jit::compile(fn, o), doctest::Contains("unknown pass 'no-such-pass'"), jit::CompileError);
}

TEST_CASE("canonicalize removes duplicate and dead tile ops") {
  auto fn = kernels::gemm().build();
  jit::CompileOptions o;
  o.make_cubin = false;
  auto k = jit::compile(fn, o);
  CHECK(k.tile_ir.size() < ir::print(fn).size());
}

TEST_CASE("a tile dimension that is not a power of two is a clear lowering error") {
  Kernel odd = kernel("odd", [](Builder& b) {
    auto X = b.pointer("X", f32);
    auto offs = arange(0, 100);
    store(X + offs, load(X + offs) * 2);
  });
  jit::CompileOptions o;
  o.make_cubin = false;
  CHECK_THROWS_WITH_AS(jit::compile(odd.build(), o), doctest::Contains("powers of two"), jit::LoweringError);
}

TEST_CASE("JIT latency: the Hopper GEMM goes from tile IR to PTX through LLVM in well under 100 ms") {
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 8;
  auto fn = kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}, {"GROUP_M", 8}});
  jit::compile(fn, o);  // warm LLVM's one-time initialisation
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    auto k = jit::compile(fn, o);
    best = std::min(best, k.timings.passes_ms + k.timings.backend_ms);
  }
  MESSAGE(fmt::format("gemm tile IR -> PTX: {:.1f} ms (best of 3)", best));
  CHECK(best < 1000);  // a loose bound for loaded CI machines; the figure itself goes to BENCHMARKS.md
}

// precompute (a schedule hint): the value of a chain whose layout its use decides (aranges and the
// math on them) is computed where precompute stands -- in the layout the use asks for, found by a
// first lowering run -- through an opaque op the backends turn into an empty volatile asm. Same
// values as without it (the interpreter copies), both backends.
TEST_CASE("precompute computes a flexible chain ahead, in its use's layout, behind an optimisation barrier") {
  auto build = [](bool ahead) {
    return kernel(ahead ? "precompute_ahead" : "precompute_at_use", [ahead](Builder& kb) {
      auto X = kb.pointer("X", u32), Y = kb.pointer("Y", u32);
      auto n = kb.scalar<int>("n");
      Tile idx = arange(0, 64)[col] * 64 + arange(0, 64)[row];
      Tile hash = umulhi(cast(u32, idx) * 2654435769u, 0xD2511F53u) ^ 0x9E3779B9u;  // flexible: no load in it
      if (ahead) hash = precompute(hash);
      Tile x = load(X + idx);  // the use's layout: the load's
      Tile scaled = x * 3u;    // a value with a layout of its own (the load's)
      if (ahead) scaled = precompute(scaled);
      Var acc = x;
      for_range(0, n, [&](Tile) { acc = acc + x; });
      if_(n > 2, [&] { acc = (acc ^ hash) + scaled; });
      store(Y + idx, acc);
    });
  };
  std::vector<uint32_t> in(64 * 64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint32_t>(i * 7919u);
  std::vector<std::vector<uint32_t>> outs;
  for (bool ahead : {false, true}) {
    runtime::HostTensor x(u32, {64 * 64}), y(u32, {64 * 64});
    for (size_t i = 0; i < in.size(); ++i) x.set_flat(static_cast<int64_t>(i), in[i]);
    runtime::interpret(build(ahead).build(), {1, 1, 1}, {x, y, 3});
    std::vector<uint32_t> o;
    for (int64_t i = 0; i < y.numel(); ++i) o.push_back(static_cast<uint32_t>(y.get_flat(i)));
    outs.push_back(o);
  }
  CHECK(outs[0] == outs[1]);
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 4;
  const auto lowered = jit::compile(build(true).build(), [&] { auto p = o; p.dump_after = "lower"; return p; }());
  CHECK(lowered.dump.find("opaque") != std::string::npos);
  // LLVM: the multiplies sit before the loop (ahead), not in the if's block after it
  const auto ptx = jit::compile(build(true).build(), o).ptx, late = jit::compile(build(false).build(), o).ptx;
  const size_t loop = ptx.find("$L__BB0_"), mul = ptx.find("mul.hi.u32");
  REQUIRE(mul != std::string::npos);
  CHECK(mul < loop);
  CHECK(late.find("mul.hi.u32") > late.find("$L__BB0_"));
  // nvrtc's backend prints the barrier as an empty asm with the values tied in and out
  o.backend = jit::Backend::Nvrtc;
  o.dump_after = "backend";
  const auto cuda = jit::compile(build(true).build(), o);
  CHECK(cuda.dump.find("asm volatile(\"\" : \"+r\"(") != std::string::npos);
}

// CompileOptions::packed_loop_pairs (decision 092): the LLVM backend carries consecutive 16-bit
// float loop values as one i32 phi (the D 128 forward's pipelined P, masked by dropout), ptxas
// assembles it without spills, and the option is part of the compile cache's key.
TEST_CASE("packed_loop_pairs: bf16 loop values travel as i32 phis, and the cache key says so") {
  const ir::Function fn = kernels::attention_forward().build(
      {{"HEAD_DIM", 128}, {"BSHD", true}, {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"POSITIVE_SCALE", true}, {"DROPOUT", true}});
  jit::CompileOptions o;
  o.num_warps = 8;
  const jit::CompiledKernel plain = jit::compile(fn, o);
  o.packed_loop_pairs = true;
  const jit::CompiledKernel packed = jit::compile(fn, o);
  CHECK(plain.backend_source.find("phi bfloat") != std::string::npos);
  CHECK(packed.backend_source.find("phi bfloat") == std::string::npos);
  CHECK(packed.backend_source.find("phi i32") != std::string::npos);
  CHECK(packed.info.spill_store_bytes == 0);
  CHECK(packed.ptx.find("wgmma.mma_async") != std::string::npos);
  jit::CompileOptions off = o;
  off.packed_loop_pairs = false;
  CHECK(runtime::cache_key(fn, o) != runtime::cache_key(fn, off));
  CHECK(runtime::describe_schedule(o) != runtime::describe_schedule(off));
  // (nvrtc's backend has no such option: its key does not move)
  o.backend = off.backend = jit::Backend::Nvrtc;
  CHECK(runtime::cache_key(fn, o) == runtime::cache_key(fn, off));
}

// Callers read a library row's tiles back from its default meta (to size a grid, to layer their
// own values over it): every row states the tiles it runs at, each meta once, and builds.
TEST_CASE("library rows state their tiles once and build") {
  for (const library::LibraryKernel& k : library::all()) {
    INFO(k.name);
    std::set<std::string> seen;
    for (const auto& [name, value] : k.default_meta) CHECK_MESSAGE(seen.insert(name).second, name << " twice");
    // (untiled: the lists kernel walks one row of classes, the document ids one sequence, a program each)
    const bool tiled = k.name != "attention_block_lists" && k.name != "attention_document_ids";
    if (tiled) CHECK(seen.contains("BLOCK_M"));
    if (k.name == "gemm") CHECK((seen.contains("BLOCK_N") && seen.contains("BLOCK_K")));
    if (k.name == "dropout_mask") CHECK(seen.contains("BLOCK_W"));
    CHECK_NOTHROW((void)k.kernel().build(k.default_meta));
  }
}

// Issue 28, item 6: the LLVM backend aborted the process on a bitcast between bf16 and f16 of a
// computed tile ("LLVM ERROR: Cannot select: f16 = bitcast"); nvrtc compiled it. Both directions,
// used in arithmetic, now compile through both backends and assemble.
const lang::Kernel mixed_half_bitcast = lang::kernel("mixed_half_bitcast", [](lang::Builder& k) {
  auto X = k.pointer("X", bf16), Y = k.pointer("Y", f16), Out = k.pointer("Out", f16), Out2 = k.pointer("Out2", bf16);
  auto i = lang::arange(0, 64);
  auto x = lang::load(X + i), y = lang::load(Y + i);
  lang::store(Out + i, lang::bitcast(f16, x * x) + y);
  lang::store(Out2 + i, lang::bitcast(bf16, y * y) + x);
  // the same through pairs: f16 halves packed into words and read back as bf16 (found by the fuzzer)
  lang::store(Out2 + i, lang::unpack_pairs(bf16, lang::pack_pairs(y / y)) * x);
  // and through i16 pairs, then a bitcast
  lang::store(Out2 + i, lang::bitcast(bf16, lang::unpack_pairs(i16, lang::pack_pairs(y / y))) - x);
});

namespace {
// Compile options for each backend there is here (nvrtc may be missing), with a cubin where ptxas is.
std::vector<jit::CompileOptions> backends_here() {
  std::vector<jit::CompileOptions> v;
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    if (backend == jit::Backend::Nvrtc && !jit::nvrtc_available()) continue;
    jit::CompileOptions o;
    o.backend = backend;
    o.make_cubin = !testing::no_ptxas();
    v.push_back(o);
  }
  return v;
}
}  // namespace

TEST_CASE("issue 28: a bf16 <-> f16 bitcast of computed tiles, direct or through pairs, compiles through both backends") {
  const ir::Function fn = mixed_half_bitcast.build();
  for (const jit::CompileOptions& o : backends_here()) {
    INFO(jit::to_string(o.backend));
    const jit::CompiledKernel c = jit::compile(fn, o);
    CHECK(c.ptx.find(".entry mixed_half_bitcast") != std::string::npos);
  }
}

// Issue 28, item 10: reductions of 64-bit tiles and of 8/16-bit integer tiles across lanes were
// refused ("cross-lane reductions of 64-bit values are not supported yet"; narrow integers now
// accumulate in 32 bits, 64-bit values shuffle as two halves), and pack_pairs of a tile spread one
// element per thread found no layout (kernels in test_kernels.hpp). All compile through both
// backends and assemble; the GPU suite compares them with the interpreter.
TEST_CASE("issue 28: 64-bit and narrow integer reductions across lanes and warps, pack_pairs of a thin tile: both backends") {
  std::vector<ir::Function> fns{test_kernels::small_pack_pairs.build()};
  for (DType d : {DType::i64, DType::u64, DType::f64, DType::i8, DType::u8, DType::i16, DType::u16})
    fns.push_back(test_kernels::wide_and_narrow_reductions.build({{"DTYPE", d}}));
  for (const ir::Function& fn : fns)
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(fn.name << " " << jit::to_string(backend));
      if (backend == jit::Backend::Nvrtc && !jit::nvrtc_available()) continue;
      jit::CompileOptions o;
      o.backend = backend;
      o.make_cubin = !testing::no_ptxas();
      const jit::CompiledKernel c = jit::compile(fn, o);
      CHECK(c.ptx.find(".entry " + fn.name) != std::string::npos);
    }
}

// Issue 28, item 1: window offsets of every integer type compile through both backends and
// assemble (the GPU suite compares what they compute with the interpreter); TMA (copies, reduce,
// the K-loop pipeline) takes only offsets that fit in i32, as its coordinates are 32-bit.
TEST_CASE("issue 28: window offsets of every integer type compile through both backends; TMA only for offsets that fit in i32") {
  for (jit::CompileOptions o : backends_here()) {
    INFO(jit::to_string(o.backend));
    o.ptx_tool = jit::PtxTool::Ptxas;
    const jit::CompiledKernel w = jit::compile(test_kernels::wide_offsets().build(), o);
    CHECK(w.ptx.find(".entry wide_offsets") != std::string::npos);
    for (DType t : {i32, i16, u16, u8, i64, u32, u64}) {
      INFO("OFFSET_DTYPE " << ir::name(t));
      const jit::CompiledKernel k = jit::compile(test_kernels::wide_offset_tma().build({{"OFFSET_DTYPE", t}, {"COUNTER_DTYPE", i64}}), o);
      const bool tma = ir::fits_i32(t);
      CHECK((k.ptx.find("cp.async.bulk.tensor.2d") != std::string::npos) == tma);
      // the reduce's row offset is a parameter whose sign is unknown for the signed types: the
      // TMA reduce (which faults at a negative coordinate) is guarded by a test of it, and elements
      // are added one by one when it is negative
      CHECK((k.ptx.find("cp.reduce.async.bulk.tensor") != std::string::npos) == tma);
      CHECK((k.ptx.find("red.global.add.f32") != std::string::npos || k.ptx.find("atom.global.add.f32") != std::string::npos) ==
            (!tma || ir::is_signed(t)));
      if (o.make_cubin) CHECK(k.cubin.size() > 1000);
    }
    // the K loop: a TMA + wgmma pipeline with an i32 counter, the generic path with an i64 one
    // (offsets of the once-loaded windows are i64 here, so the loop's are the only TMA copies)
    for (DType c : {i32, i64}) {
      INFO("COUNTER_DTYPE " << ir::name(c));
      const jit::CompiledKernel k = jit::compile(test_kernels::wide_offset_tma().build({{"OFFSET_DTYPE", i64}, {"COUNTER_DTYPE", c}}), o);
      CHECK((k.ptx.find("cp.async.bulk.tensor.2d") != std::string::npos) == (c == i32));
    }
  }
}

// Found by the fuzzer (a dot of windows at K offset 3: CUDA_ERROR_ILLEGAL_INSTRUCTION): TMA boxes
// are planned only where the offset on the contiguous dim is known to start on 16 bytes
// (jit/scalar_facts.hpp: constants, products, loop counters from their bounds and step).
TEST_CASE("issue 28: TMA copies and reduces only for windows whose contiguous offset is a known multiple of 16 bytes") {
  for (jit::CompileOptions o : backends_here()) {
    INFO(jit::to_string(o.backend));
    o.ptx_tool = jit::PtxTool::Ptxas;
    for (int step : {1, 8}) {
      INFO("STEP " << step);
      const jit::CompiledKernel k = jit::compile(test_kernels::unaligned_tma_windows().build({{"STEP", step}}), o);
      CHECK((k.ptx.find("cp.async.bulk.tensor.2d") != std::string::npos) == (step == 8));
      CHECK((k.ptx.find("cp.reduce.async.bulk.tensor") != std::string::npos) == (step == 8));
    }
  }
}

// Issue 28, item 3: float % is the exact remainder on both backends (the GPU suite compares it
// with the interpreter bit for bit): f32 / f64 steps of fma after a rounded division (f16 / bf16 in
// f32), no longer x - trunc(x / y) * y, and the PTX assembles.
TEST_CASE("issue 28: float % compiles to the exact remainder through both backends and assembles") {
  for (jit::CompileOptions o : backends_here()) {
    INFO(jit::to_string(o.backend));
    o.ptx_tool = jit::PtxTool::Ptxas;
    for (DType d : {f32, f64, f16, bf16}) {
      INFO(ir::name(d));
      const jit::CompiledKernel k = jit::compile(test_kernels::float_rem().build({{"DTYPE", d}}), o);
      CHECK(k.ptx.find(d == f64 ? "fma.rn.f64" : "fma.rn.f32") != std::string::npos);
      CHECK(k.ptx.find(d == f64 ? "div.rn.f64" : "div.rn.f32") != std::string::npos);
      if (o.make_cubin) CHECK(k.cubin.size() > 1000);
    }
  }
}

// Found by the fuzzer: LLVM 19's simplification of float min/max crashed the process (SIGSEGV in
// getInverseMinMaxIntrinsic) when an operand was another intrinsic's result sharing an operand with
// it, as minimum(fma(a, b, a), minimum(a, b)) here; such operands now reach it through an opaque mov.
TEST_CASE("issue 28: minimum of an fma and a minimum sharing its operands compiles (LLVM 19 crash)") {
  const lang::Kernel k = lang::kernel("min_of_fma", [](lang::Builder& b) {
    auto X = b.pointer("X", f32), Y = b.pointer("Y", f32), Out = b.pointer("Out", f32);
    auto i = lang::arange(0, 64);
    auto x = lang::load(X + i), y = lang::load(Y + i);
    lang::store(Out + i, lang::minimum(lang::fma(x, y, x), lang::minimum(x, y)));
    lang::store(Out + i + 64, lang::maximum(lang::fma(x, y, x), lang::maximum(x, y)));
  });
  for (jit::CompileOptions o : backends_here()) {
    INFO(jit::to_string(o.backend));
    const jit::CompiledKernel c = jit::compile(k.build(), o);
    CHECK(c.ptx.find("min.NaN.f32") != std::string::npos);
  }
}

// A program's global accesses are ordered between its threads where they could race: a [32] row
// vector is held by every warp of 4 (replicated), so storing it back in place after loading it
// needs a barrier between (else a late warp may load what an early warp already stored: the CP merge
// kernel's LSE, d6c0b4a). Accesses to other tensors, or in one unreplicated layout, need none.
TEST_CASE("global memory between threads: a barrier where an in-place update could race, none elsewhere") {
  const auto count = [](const std::string& ptx) {
    size_t n = 0;
    for (size_t at = ptx.find("bar.sync"); at != std::string::npos; at = ptx.find("bar.sync", at + 1)) ++n;
    return n;
  };
  const Kernel inplace = kernel("inplace_row", [](Builder& k) {
    auto X = k.tensor("X", f32, 1);
    store(X.block({0}, {32}), load(X.block({0}, {32})) * 2.0f);
  });
  const Kernel other = kernel("other_row", [](Builder& k) {
    auto X = k.tensor("X", f32, 1), Y = k.tensor("Y", f32, 1);
    store(Y.block({0}, {32}), load(X.block({0}, {32})) * 2.0f);
  });
  const Kernel own = kernel("own_elements", [](Builder& k) {  // [1024] over 128 threads: no replica
    auto X = k.tensor("X", f32, 1);
    store(X.block({0}, {1024}), load(X.block({0}, {1024})) * 2.0f);
  });
  const Kernel looped = kernel("inplace_loop", [](Builder& k) {
    auto X = k.tensor("X", f32, 1);
    auto n = k.scalar<int>("n");
    for_range(0, n, [&](Tile) { store(X.block({0}, {32}), load(X.block({0}, {32})) + 1.0f); });
  });
  for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(b));
    jit::CompileOptions o;
    o.backend = b;
    o.make_cubin = false;
    o.num_warps = 4;
    const std::string in_place = jit::compile(inplace.build(), o).ptx;
    CHECK(count(in_place) == 1);
    CHECK(in_place.find("bar.sync") > in_place.find("ld.global"));
    CHECK(in_place.find("bar.sync") < in_place.find("st.global"));
    CHECK(count(jit::compile(other.build(), o).ptx) == 0);
    CHECK(count(jit::compile(own.build(), o).ptx) == 0);
    // before the store, and at the body's end (the next iteration's load after this one's store);
    // nvrtc unrolls the loop, copying both
    const size_t loop_barriers = count(jit::compile(looped.build(), o).ptx);
    CHECK(loop_barriers >= 2);
    CHECK(loop_barriers % 2 == 0);
  }
  // the fuzzer's seeds 706338 / 718605: a pointer store whose value first changes layout through
  // shared memory (f64 loads hold 2 per vector, f32 stores 4); the exchange's own barriers come
  // before the store and must not count as ordering it against the column read after it
  const Kernel converted = kernel("store_converted_then_read", [](Builder& k) {
    auto A = k.tensor("A", f64, 2), X = k.tensor("X", f32, 2), Y = k.tensor("Y", f32, 2);
    Tile r = arange(0, 16), c = arange(0, 128);
    Tile a = load(A.ptr() + r[col] * A.stride(0) + c[row] * A.stride(1));
    store(X.ptr() + r[col] * X.stride(0) + c[row] * X.stride(1), cast(f32, a));
    store(Y.block({0, 0}, {16, 1}), load(X.block({0, 104}, {16, 1})));
  });
  for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO(jit::to_string(b));
    jit::CompileOptions o;
    o.backend = b;
    o.make_cubin = false;
    o.num_warps = 8;
    const std::string ptx = jit::compile(converted.build(), o).ptx;
    const size_t column_load = ptx.find("ld.global", ptx.find("st.global"));
    REQUIRE(column_load != std::string::npos);
    const size_t last_store_x = ptx.rfind("st.global", column_load);
    CHECK(ptx.find("bar.sync", last_store_x) < column_load);
  }
  // the interpreter's sequential semantics are what the barrier keeps: 2 x each element
  runtime::HostTensor x(f32, {32});
  for (int64_t i = 0; i < 32; ++i) x.set_flat(i, static_cast<double>(i + 1));
  runtime::interpret(inplace.build(), {1}, {x});
  CHECK(x.get_flat(31) == 64.0);
}

// Found by `tilejit_fuzz --gpu --tma-stores` (seeds 2588, 5103, 706: CUDA_ERROR_ILLEGAL_INSTRUCTION):
// a TMA store at a coordinate "proved" non-negative although i8 53 * 8 wraps to -88 (and i32
// 2^31 - 1 times 8 to -8), or at one whose box passes 2^31 - 1. Ranges now see wrap-around; indices
// (program ids, counts, their reversed order, times small constants) stay non-negative without a
// run-time test; the rest is tested at run time (jit/lower/memory.cpp tma_bulk_write).
TEST_CASE("scalar facts: ranges see wrap-around, indices stay non-negative") {
  const lang::Kernel k = lang::kernel("facts", [](lang::Builder& b) {
    auto O = b.tensor("O", f32, 2, {.align_bytes = 16, .contiguous_last = true});
    auto s = b.scalar("s", i32);
    auto st = [&](const lang::Tile& r) {
      lang::store(O.block({r, lang::scalar_constant(i32, int64_t{0})}, {8, 32}), lang::full(f32, {8, 32}, 1.0));
    };
    st(lang::scalar_constant(i8, int64_t{53}) * lang::scalar_constant(i8, int64_t{8}));
    st(lang::scalar_constant(i32, int64_t{INT32_MAX}) * lang::scalar_constant(i32, int64_t{8}));
    st((lang::Tile(s) >> lang::program_id(0)) << lang::scalar_constant(i32, int64_t{2}));
    st(lang::program_id(0) * 128);
    st((lang::num_programs(0) - 1 - lang::program_id(0)) * 128);
    st(lang::scalar_constant(i32, int64_t{100}) + lang::scalar_constant(i32, int64_t{20}));
    st(lang::cast(i32, lang::cast(u16, lang::Tile(s))));
    st(lang::program_id(0) * int64_t{INT32_MAX});
  });
  const ir::Function f = k.build();
  const jit::ScalarFacts facts(f);
  std::vector<ir::ValueId> rows;
  for (const ir::Op& op : f.body.ops)
    if (op.kind == ir::OpKind::block_store) rows.push_back(op.operands[2]);
  REQUIRE(rows.size() == 8);
  CHECK_FALSE(facts.range(rows[0]));  // i8 53 * 8 wraps
  CHECK_FALSE(facts.non_negative(rows[0]));
  CHECK_FALSE(facts.non_negative(rows[1]));  // i32 (2^31 - 1) * 8 wraps
  CHECK_FALSE(facts.non_negative(rows[2]));  // a shift by a program id: unknown
  CHECK(facts.index_like(rows[3]));
  CHECK(facts.non_negative(rows[3]));
  CHECK(facts.index_like(rows[4]));  // reversed program order
  REQUIRE(facts.range(rows[5]));
  CHECK(facts.range(rows[5])->lo == 120);
  CHECK(facts.range(rows[5])->hi == 120);
  REQUIRE(facts.range(rows[6]));
  CHECK(facts.range(rows[6])->lo == 0);
  CHECK(facts.range(rows[6])->hi == 65535);
  CHECK_FALSE(facts.index_like(rows[7]));  // a program id times a large constant may wrap
  CHECK_FALSE(facts.non_negative(rows[7]));
}
