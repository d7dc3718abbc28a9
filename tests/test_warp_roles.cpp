// Warp roles (lang::warp_roles) and channels between them (lang::Channel): splits and misuse are
// errors that name the value; roles compute on their own warps (in the interpreter, and on sm_90a
// with their own named barriers); a channel carries tiles from one role to another in order
// through shared-memory slots behind full/empty mbarriers, read in the layout of their use.
#include <doctest/doctest.h>
#include <unistd.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "dsl/lang.hpp"
#include "host_bits.hpp"
#include "jit/compile.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/gemm.hpp"
#include "ptxas_testing.hpp"
#include "runtime/emulator.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;
using rt::HostTensor;
using testing::raw;
using testing::contains;

TEST_CASE("warp_roles: bad splits and misuse are errors that name the value") {
  const Meta mask{{"DROPOUT_MASK", true}, {"MASK_WARPS", 4}};
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 4;  // nothing left for the GEMM's role
  CHECK_THROWS_WITH(jit::compile(kernels::gemm().build(mask), o), doctest::Contains("asks for warps 0 + 4 but the launch has num_warps = 4"));
  o.num_warps = 6;
  CHECK_THROWS_WITH(jit::compile(kernels::gemm().build(mask), o), doctest::Contains("num_warps = 6 (valid: 1, 2, 4, 8, 16, 32, or with warp roles"));
  o.num_warps = 16;  // the GEMM's role would get 12 warps: not a power of two
  CHECK_THROWS_WITH(jit::compile(kernels::gemm().build(mask), o), doctest::Contains("asks for warps 0 + 4 but the launch has num_warps = 16"));
  o.num_warps = 12;
  CHECK_THROWS_WITH(jit::compile(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_WARPS", 4}, {"MMA_REGISTERS", 256}, {"MASK_REGISTERS", 256}}), o),
                    doctest::Contains("registers in all"));
  // setmaxnreg takes the whole register file: no launch bound of more programs an SM (ptxas refused
  // the dK/dV ring producer at the API's 3 programs an SM with a message about its own counts)
  o.min_programs_per_sm = 2;
  CHECK_THROWS_WITH(jit::compile(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_WARPS", 4}, {"MMA_REGISTERS", 232}, {"MASK_REGISTERS", 40}}), o),
                    doctest::Contains("min_programs_per_sm = 2 with warp roles with max_registers"));
  o.num_warps = 4;
  CHECK_THROWS_WITH(jit::compile(kernels::attention_backward_dkdv().build({{"HEAD_DIM", 64}, {"BSHD", true}, {"RING_PRODUCER", true}}), o),
                    doctest::Contains("kernel 'attention_bwd_dkdv': min_programs_per_sm = 2 with a ring producer"));
  o.min_programs_per_sm = 1;  // the cap it needs
  CHECK_NOTHROW(jit::compile(kernels::attention_backward_dkdv().build({{"HEAD_DIM", 64}, {"BSHD", true}, {"RING_PRODUCER", true}}), o));
  o.min_programs_per_sm = 0;
  CHECK_THROWS_WITH(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_WARPS", 6}}), doctest::Contains("role 1 has warps = 6"));
  CHECK_THROWS_WITH(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_WARPS", 4}, {"MMA_REGISTERS", 232}}),
                    doctest::Contains("give max_registers to every role or to none"));
  CHECK_THROWS_WITH(kernels::gemm().build({{"DROPOUT_MASK", true}, {"MASK_WARPS", 4}, {"MMA_REGISTERS", 230}, {"MASK_REGISTERS", 40}}),
                    doctest::Contains("role 0 has max_registers = 230"));
  // a tile from outside a role, a Var assigned inside one, and code after the roles
  const Kernel shares_tile = kernel("shares_tile", [](Builder& kb) {
    auto out = kb.pointer("out", f32);
    Tile t = arange(0, 128);
    warp_roles({{.warps = 4, .body = [&] { store(out + t, cast(f32, t) * 2.0f); }}, {.warps = 4, .body = [&] {}}});
  });
  CHECK_THROWS_WITH(shares_tile.build({}), doctest::Contains("a warp role reads the tile"));
  const Kernel assigns = kernel("assigns", [](Builder& kb) {
    auto out = kb.pointer("out", f32);
    Var x = zeros(f32, {});
    warp_roles({{.warps = 4, .body = [&] { x = x + 1.0f; }}, {.warps = 4, .body = [&] {}}});
    store(out, x);
  });
  CHECK_THROWS_WITH(assigns.build({}), doctest::Contains("role 0 assigns the Var declared at"));
  const Kernel after = kernel("after", [](Builder& kb) {
    auto out = kb.pointer("out", f32);
    warp_roles({{.warps = 4, .body = [&] {}}, {.warps = 4, .body = [&] {}}});
    store(out, 1.0f);
  });
  CHECK_THROWS_WITH(after.build({}), doctest::Contains("warp roles end the kernel"));
}

TEST_CASE("warp_roles in the interpreter and on sm_90a: each role's tiles on its own warps, its own barriers and scratch") {
  // Role 0 (8 warps) and role 1 (4 warps) each reduce a tile across warps (an exchange through
  // shared memory) and store it: in the interpreter the values; on sm_90a the named barriers.
  const Kernel k = kernel("two_roles", [](Builder& kb) {
    auto out = kb.pointer("out", f32);
    Tile pid = program_id(0);
    warp_roles({{.warps = 8, .body = [&] { store(out + pid * 2, sum(cast(f32, arange(0, 1024)), 0)); }},
                {.warps = 0, .body = [&] { store(out + (pid * 2 + 1), max(cast(f32, arange(0, 512)) * 3.0f, 0)); }}});
  });
  const ir::Function f = k.build({});
  HostTensor out(f32, {4});
  out.poison();
  rt::interpret(f, {2}, {out});
  const std::vector<float> got = raw<float>(out);
  CHECK(got == std::vector<float>{523776.0f, 1533.0f, 523776.0f, 1533.0f});
  if (testing::no_ptxas()) return;
  const jit::CompiledKernel c = testing::assemble_sm90a(f, jit::Backend::Llvm, 12);
  CHECK(contains(c.ptx, "bar.sync %r"));
  CHECK(c.num_threads == 384);
  const jit::CompiledKernel n = testing::assemble_sm90a(f, jit::Backend::Nvrtc, 12);
  CHECK(n.num_threads == 384);
}


TEST_CASE("Channel: tiles pushed by one role arrive in the other, in order, in the interpreter") {
  for (int stages : {1, 2, 3}) {
    INFO("stages " << stages);
    const int programs = 2, n = 7;
    HostTensor out(u32, {programs, n, 8});
    out.poison();
    rt::interpret(test_kernels::channel_kernel().build({{"STAGES", stages}}), {programs}, {out, n});
    CHECK(raw<uint32_t>(out) == test_kernels::channel_expected(programs, n));
  }
}

TEST_CASE("Channel on sm_90a: slots behind full/empty mbarriers, the pop read in its use's layout, the roles' own barriers") {
  if (testing::no_ptxas()) return;
  const jit::CompiledKernel k = testing::assemble_sm90a(test_kernels::channel_kernel().build({{"STAGES", 2}}), jit::Backend::Llvm, 12);
  CHECK(k.num_threads == 384);
  CHECK(contains(k.ptx, "mbarrier.try_wait.parity"));
  CHECK(contains(k.ptx, "mbarrier.arrive"));
  CHECK(k.info.spill_store_bytes == 0);
  const jit::CompiledKernel n = testing::assemble_sm90a(test_kernels::channel_kernel().build({{"STAGES", 2}}), jit::Backend::Nvrtc, 12);
  CHECK(contains(n.ptx, "mbarrier"));
}

TEST_CASE("Channel misuse: a push or pop outside the roles, two roles pushing, a push of the wrong tile") {
  const Kernel outside = kernel("outside", [](Builder& kb) {
    auto out = kb.pointer("out", u32);
    Channel ring(u32, {4}, 2);
    ring.push(0, cast(u32, arange(0, 4)));
    store(out + arange(0, 4), ring.pop(0));
  });
  CHECK_THROWS_WITH(outside.build({}), doctest::Contains("inside warp roles"));
  const Kernel same_role = kernel("same_role", [](Builder& kb) {
    auto out = kb.pointer("out", u32);
    Channel ring(u32, {4}, 2);
    warp_roles({{.warps = 4, .body = [&] {
                   ring.push(0, cast(u32, arange(0, 4)));
                   store(out + arange(0, 4), ring.pop(0));
                 }},
                {.warps = 4, .body = [&] {}}});
  });
  CHECK_THROWS_WITH(same_role.build({}), doctest::Contains("pushed and popped by the same role"));
  const Kernel wrong = kernel("wrong", [](Builder&) {
    Channel ring(u32, {4}, 2);
    warp_roles({{.warps = 4, .body = [&] { ring.push(0, cast(u32, arange(0, 8))); }}, {.warps = 4, .body = [&] {}}});
  });
  CHECK_THROWS_WITH(wrong.build({}), doctest::Contains("the channel carries u32[4], got u32[8]"));
  CHECK_THROWS_WITH(kernel("stages", [](Builder&) { Channel ring(u32, {4}, 0); }).build({}), doctest::Contains("stages = 0 (valid: 1 to 16)"));
}

TEST_CASE("qk_registers on sm_90a: A from registers (Q without TMA), K by TMA, alone and in a warp role") {
  if (testing::no_ptxas()) return;
  for (const bool role : {false, true})
    for (const int variant : {0, 1, 2}) {  // plain, OUTER, CHANNEL (roles only)
      const bool outer = variant == 1, channel = variant == 2;
      if (channel && !role) continue;
      INFO("role " << role << " outer " << outer << " channel " << channel);
      const jit::CompiledKernel k = testing::assemble_sm90a(
          test_kernels::qk_registers().build({{"HEAD_DIM", 128}, {"ROLE", role}, {"OUTER", outer}, {"CHANNEL", channel}}),
          jit::Backend::Llvm, role ? 8 : 4);
      CHECK(k.tensor_maps.size() == 1);  // K only
      CHECK(contains(k.ptx, "wgmma.mma_async"));
      CHECK(contains(k.ptx, "st.shared"));  // Q's exchange into the A fragment layout
    }
}

// ptxas (CUDA 13.0) takes a register that only wgmma reads as dead after the loop's last wgmma
// that reads it, and reuses it within the iteration: a loop-invariant A operand (Q loaded once
// without TMA) was overwritten by the next dot's A fragments, and the next iteration multiplied
// those (the GPU test "A from registers" with ACC; the attention backward with K, V through
// registers). The lowering keeps such registers alive at the loop body's end (pir keep_alive).
TEST_CASE("a loop-invariant wgmma A operand in registers is kept alive across the loop's back edge") {
  if (testing::no_ptxas()) return;
  for (const bool inner : {false, true}) {  // inner: the A operand computed in the loop from loop-invariant values
  INFO("inner " << inner);
  const lang::Meta meta{{"HEAD_DIM", 128}, {"ACC", true}, {"INNER", inner}};
  const jit::CompiledKernel k = testing::assemble_sm90a(test_kernels::qk_registers().build(meta), jit::Backend::Llvm, 4);
  // Q's A fragments (8 k16 steps x 4 registers), not those of bf16(S), which the loop defines
  size_t uses = 0;
  for (size_t at = k.ptx.find("st.shared.b32 [S1]"); at != std::string::npos; at = k.ptx.find("st.shared.b32 [S1]", at + 1)) ++uses;
  CHECK(uses == 32);
  const jit::CompiledKernel n = testing::assemble_sm90a(test_kernels::qk_registers().build(meta), jit::Backend::Nvrtc, 4);
  CHECK(contains(n.ptx, "st.shared.b32 [S1]"));
  // Where cuobjdump is installed: the two dots' HGMMAs read different A registers.
  if (std::system("command -v cuobjdump > /dev/null 2>&1") != 0) {
    MESSAGE("cuobjdump not installed: the SASS check is skipped");
    continue;
  }
  const std::string base = (std::filesystem::temp_directory_path() / fmt::format("tilejit-keepalive-{}", ::getpid())).string();
  const std::string cubin = base + ".cubin", sass = base + ".sass";
  struct Cleanup {
    std::string a, b;
    ~Cleanup() { std::remove(a.c_str()), std::remove(b.c_str()); }
  } cleanup{cubin, sass};
  FILE* f = std::fopen(cubin.c_str(), "wb");
  REQUIRE(f);
  std::fwrite(k.cubin.data(), 1, k.cubin.size(), f);
  std::fclose(f);
  REQUIRE(std::system(fmt::format("cuobjdump -sass '{}' > '{}'", cubin, sass).c_str()) == 0);
  std::vector<std::string> a_regs;  // HGMMA.64x128x16.F32.BF16 Rd, Ra, gdesc[..]: Ra of each
  FILE* in = std::fopen(sass.c_str(), "r");
  REQUIRE(in);
  char buf[512];
  while (std::fgets(buf, sizeof buf, in)) {
    const char* h = std::strstr(buf, "HGMMA.");
    if (!h) continue;
    const char* comma = std::strchr(h, ',');
    if (!comma) continue;
    a_regs.push_back(std::string(comma + 2, std::strcspn(comma + 2, ",")));
  }
  std::fclose(in);
  REQUIRE(a_regs.size() == 16);  // S = Q K^T, then acc += bf16(S) K: 8 k16 steps each
  for (size_t i = 0; i < 8; ++i)
    for (size_t j = 8; j < 16; ++j) CHECK_MESSAGE(a_regs[i] != a_regs[j], "HGMMA " << i << " and " << j << " both read " << a_regs[i]);
  }
}

// The attention kernels with every once-loaded A window through registers (PipelineOptions::
// once_by_tma = false; the GPU suite compares their outputs with the TMA path's): they assemble,
// and the backward's loop-invariant A fragments (K, V in dK/dV; Q, dO in dQ) are kept alive.
TEST_CASE("attention kernels with once-loaded windows through registers assemble, with keep-alives in the backward") {
  if (testing::no_ptxas()) return;
  for (const int64_t d : {64, 128}) {
    INFO("HEAD_DIM " << d);
    const lang::Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", d}, {"BSHD", true}, {"CAUSAL", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}};
    for (const Kernel* kernel : {&kernels::attention_backward_dkdv(), &kernels::attention_backward_dq()}) {
      jit::CompileOptions o;
      o.num_warps = 4;
      o.pipeline.stages = 2;
      o.pipeline.once_by_tma = false;
      o.ptx_tool = jit::PtxTool::Ptxas;
      const jit::CompiledKernel k = jit::compile(kernel->build(meta), o);
      CHECK(k.cubin.size() > 1000);
      CHECK(contains(k.ptx, "st.shared.b32 [S1]"));
    }
  }
}

// lang::ring_producer: the rings are filled by a warpgroup of their own; the interpreter ignores
// it (the same values as without), the GPU suite compares the outputs (test_jit_gpu.cpp).
TEST_CASE("ring_producer: the interpreter ignores it; on sm_90a a producer warpgroup, per-tile barriers, setmaxnreg honoured") {
  const ir::Function plain = test_kernels::ring_kernel().build({}), with = test_kernels::ring_kernel().build({{"PRODUCER", true}});
  auto run = [](const ir::Function& f) {
    HostTensor q(bf16, {128, 64}), k(bf16, {200, 64}), v(bf16, {200, 64}), o(f32, {128, 64});
    q.fill_normal(1, 0, 1), k.fill_normal(2, 0, 1), v.fill_normal(3, 0, 1);
    o.poison();
    rt::interpret(f, {2}, {q, k, v, o});
    return raw<float>(o);
  };
  const std::vector<float> a = run(plain), b = run(with);
  CHECK(a == b);
  CHECK(std::any_of(a.begin(), a.end(), [](float x) { return x != 0.0f; }));
  if (testing::no_ptxas()) return;
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO("backend " << jit::to_string(backend));
    const jit::CompiledKernel c = testing::assemble_sm90a(with, backend, 4, 3);
    CHECK(c.num_threads == 256);  // 4 consumer warps + the producer warpgroup
    CHECK(contains(c.ptx, "setmaxnreg.dec.sync.aligned.u32 24"));  // (256 threads start with 256 registers)
    CHECK(contains(c.ptx, "exit;"));  // the producer does not reach the consumers' blocks
    CHECK(c.info.spill_store_bytes == 0);
    for (const std::string& w : c.warnings) CHECK_MESSAGE(!contains(w, "serialises"), w);
  }
  // The library's D128 forward with a producer: ptxas gives the consumers their 240 registers
  // (with the count at entry, 168, ptxas serialises the wgmma: C7512)
  const ir::Function fwd = kernels::attention_forward().build(
      {{"HEAD_DIM", 128}, {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"BSHD", true}, {"POSITIVE_SCALE", true}, {"RING_PRODUCER", true}});
  const jit::CompiledKernel f = testing::assemble_sm90a(fwd, jit::Backend::Llvm, 8, 2);
  CHECK(f.num_threads == 384);
  CHECK(contains(f.ptx, "setmaxnreg.inc.sync.aligned.u32 240"));
  CHECK(f.info.spill_store_bytes == 0);
  for (const std::string& w : f.warnings) CHECK_MESSAGE(!contains(w, "serialises"), w);
}

TEST_CASE("ring_producer misuse: bad registers, a ring in a branch, warp roles, offsets from tiles, too many registers") {
  auto error_of = [](const lang::Meta& meta, int num_warps = 4) -> std::string {
    try {
      jit::CompileOptions o;
      o.num_warps = num_warps;
      o.make_cubin = false;
      (void)jit::compile(test_kernels::ring_kernel().build(meta), o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THROWS_WITH(kernel("bad_registers", [](Builder&) { ring_producer({.producer_registers = 20}); }).build({}),
                    doctest::Contains("ring_producer: producer_registers = 20 (valid: a multiple of 8 in [24, 256])"));
  CHECK(contains(error_of({{"PRODUCER", true}, {"IN_BRANCH", true}}), "stands inside the if at"));
  CHECK(error_of({{"PRODUCER", true}, {"NESTED", true}}) == "");  // (a loop around the ring's: fine, decision 050)
  CHECK(contains(error_of({{"PRODUCER", true}, {"ROLES", true}}, 8), "the kernel has warp_roles too"));
  CHECK(contains(error_of({{"PRODUCER", true}, {"TILE_OFFSET", true}}), "ring_producer: the producer warp computes the rings' loop bounds"));
  CHECK(contains(error_of({{"PRODUCER", true}}, 16), "16 consumer warps x 32 x 240 registers + 4 producer warps x 32 x 24"));
  // (the launch's registers, not the multiprocessor's 65536: setmaxnreg.inc past them waits forever)
  CHECK(contains(error_of({{"PRODUCER", true}}, 16), "the launch gives its 640 threads 96 each (61440 in all)"));
  CHECK(contains(error_of({{"PRODUCER", true}}, 16), "at most 112 here"));
  CHECK(error_of({{"PRODUCER", true}}) == "");
}

TEST_CASE("ring_producer reduce_writer: the producer's writer warp adds each part; the emulator and ptxas agree") {
  for (const int warps : {4, 8}) {  // one part of all consumers; a part per warpgroup (32 columns each)
    INFO(warps << " consumer warps");
    const ir::Function fn = test_kernels::writer_kernel().build({{"WRITER", true}});
    jit::CompileOptions o;
    o.num_warps = warps;
    o.pipeline.stages = 2;
    jit::CompileOptions plan = o;
    plan.make_cubin = false;
    plan.dump_after = "plan-wgmma";
    CHECK(contains(jit::compile(fn, plan).dump, "issued by the producer's reduce writer"));
    HostTensor q(bf16, {128, 64}), k(bf16, {192, 64}), v(bf16, {192, 64}), acc(f32, {128, 64}), out(f32, {128, 64}), sem(i32, {1});
    q.fill_normal(11, 0, 1), k.fill_normal(12, 0, 1), v.fill_normal(13, 0, 1);
    sem.fill(0);
    for (const rt::EmulatorSchedule& sched : {rt::EmulatorSchedule{}, rt::EmulatorSchedule{true, 1}, rt::EmulatorSchedule{true, 2}}) {
      INFO("schedule seed " << sched.seed);
      HostTensor ref_acc = acc, emu_acc = acc;
      ref_acc.fill(0), emu_acc.fill(0);
      rt::interpret(fn, {2}, {q, k, v, ref_acc, out, sem});
      rt::emulate(fn, {2}, {q, k, v, emu_acc, out, sem}, o, sched);
      const std::vector<float> a = raw<float>(ref_acc), b = raw<float>(emu_acc);
      CHECK(std::any_of(a.begin(), a.end(), [](float x) { return std::fabs(x) > 0.1f; }));
      for (size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(std::fabs(a[i] - b[i]) <= 1e-3f * (1 + std::fabs(a[i])), i);
    }
    if (testing::no_ptxas()) continue;
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO("backend " << jit::to_string(backend));
      const jit::CompiledKernel c = testing::assemble_sm90a(fn, backend, warps, 2);
      CHECK(contains(c.ptx, "cp.reduce.async.bulk.tensor"));
      CHECK(contains(c.ptx, warps == 8 ? "cp.async.bulk.wait_group.read 1" : "cp.async.bulk.wait_group.read 0"));
      for (const std::string& w : c.warnings) CHECK_MESSAGE(!contains(w, "serialises"), w);
    }
  }
}

// An ordered add that passes its turn on (atomic_add's signal): in the interpreter the programs add
// in turn (each waits for every add before its own), the sum is the sequential one bit for bit; on
// sm_90a thread 0 waits, the TMA adds are issued, and thread 0 signals once they are complete; both
// backends assemble it. With the reduce writer (decision 074) its warp waits, adds and signals.
TEST_CASE("ordered atomic_add with a signal: adds in turn in the interpreter; waits and signals on sm_90a") {
  for (const bool writer : {false, true}) {
  INFO("reduce writer " << writer);
  const ir::Function fn = test_kernels::writer_kernel().build({{"ORDERED", true}, {"WRITER", writer}});
  HostTensor q(bf16, {256, 64}), k(bf16, {128, 64}), v(bf16, {128, 64}), acc(f32, {256, 64}), out(f32, {256, 64}), sem(i32, {1});
  q.fill_normal(21, 0, 1), k.fill_normal(22, 0, 1), v.fill_normal(23, 0, 1);
  acc.fill(0), sem.fill(0);
  rt::interpret(fn, {4}, {q, k, v, acc, out, sem});
  CHECK(raw<int32_t>(sem)[0] == 4 * 2);  // every add signalled once
  // the same sums, bit for bit, as the interpreter's programs one after the other, unordered
  HostTensor seq = acc;
  seq.fill(0);
  rt::interpret(test_kernels::writer_kernel().build({{"FIRST_WINDOW", true}}), {4}, {q, k, v, seq, out, sem});
  CHECK(raw<float>(seq) == raw<float>(acc));
  const std::vector<float> a = raw<float>(acc);
  CHECK(std::any_of(a.begin(), a.begin() + 64 * 64, [](float x) { return std::fabs(x) > 0.1f; }));
  CHECK(std::all_of(a.begin() + 64 * 64, a.end(), [](float x) { return x == 0.0f; }));  // (all into the first window)
  // the lowered program (its programs run in order in the emulator, so each turn has come)
  HostTensor emu = acc, emu_sem = sem;
  emu.fill(0), emu_sem.fill(0);
  jit::CompileOptions o8;
  o8.num_warps = 8;
  o8.pipeline.stages = 2;
  rt::emulate(fn, {4}, {q, k, v, emu, out, emu_sem}, o8);
  CHECK(raw<int32_t>(emu_sem)[0] == 4 * 2);
  const std::vector<float> e = raw<float>(emu);  // (the MMAs' rounding differs from the interpreter's dots)
  for (size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(std::fabs(a[i] - e[i]) <= 1e-3f * (1 + std::fabs(a[i])), i);
  if (testing::no_ptxas()) continue;
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO("backend " << jit::to_string(backend));
    const jit::CompiledKernel c = testing::assemble_sm90a(fn, backend, 8, 2);
    CHECK(contains(c.ptx, "red.release.gpu.global.add"));  // (the signals)
    CHECK(contains(c.ptx, "ld.acquire.gpu"));              // (the waits)
    CHECK(contains(c.ptx, "cp.reduce.async.bulk.tensor"));
    for (const std::string& w : c.warnings) CHECK_MESSAGE(!contains(w, "serialises"), w);
  }
  }
}

TEST_CASE("ring_producer reduce_writer misuse: adds it cannot follow and memory it cannot order are errors that say why") {
  auto error_of = [](const lang::Meta& meta) -> std::string {
    try {
      jit::CompileOptions o;
      o.num_warps = 4;
      o.make_cubin = false;
      (void)jit::compile(test_kernels::writer_kernel().build(meta), o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of({{"WRITER", true}}) == "");
  CHECK(error_of({{"AFTER", true}}) == "");  // (without the writer: the consumers add)
  CHECK(contains(error_of({{"WRITER", true}, {"AFTER", true}}), "ring_producer(reduce_writer): the TMA add at"));
  CHECK(contains(error_of({{"WRITER", true}, {"AFTER", true}}), "is not at the top level of a ring's loop body"));
  CHECK(contains(error_of({{"WRITER", true}, {"IN_BRANCH", true}}), "is not at the top level of a ring's loop body"));
  CHECK(contains(error_of({{"WRITER", true}, {"READ_BACK", true}}), "uses the tensor the writer adds into"));
  CHECK(contains(error_of({{"WRITER", true}, {"SIGNAL", true}}), "the signal_add at"));
  CHECK(error_of({{"WRITER", true}, {"ORDERED", true}}) == "");  // (the writer waits and signals: decision 074)
  // the attention kernel's DQ_WRITER: the atomic and ordered reductions on the producer, one key
  // tile a program or PERSISTENT (decisions 073, 074)
  const lang::Meta writer{{"DTYPE", bf16}, {"HEAD_DIM", 128}, {"BLOCK_M", 64}, {"BLOCK_N", 128}, {"CAUSAL", true},
                          {"PERSISTENT", true}, {"RING_PRODUCER", true}, {"DQ_WRITER", true}};
  lang::Meta atomic = writer, ordered = writer, split = writer;
  atomic.emplace_back("DQ_REDUCTION", 1);
  ordered.emplace_back("DQ_REDUCTION", 3);
  split.emplace_back("DQ_REDUCTION", 2);
  split.erase(std::find_if(split.begin(), split.end(), [](const auto& e) { return e.first == "PERSISTENT"; }));
  CHECK_NOTHROW(kernels::attention_backward_dkdv().build(atomic));
  CHECK_NOTHROW(kernels::attention_backward_dkdv().build(ordered));
  CHECK_THROWS_WITH(kernels::attention_backward_dkdv().build(split),
                    doctest::Contains("it needs DQ_REDUCTION=1 (atomic) or 3 (ordered) and RING_PRODUCER=true; got DQ_REDUCTION=2, "
                                      "RING_PRODUCER=true"));
  // a library mask's walk (intervals or lists) takes the writer too (decision 102)
  lang::Meta masked = atomic;
  std::erase_if(masked, [](const auto& e) { return e.first == "CAUSAL" || e.first == "PERSISTENT"; });
  masked.emplace_back("MASK", 2);
  CHECK_NOTHROW(kernels::attention_backward_dkdv().build(masked));
}

// The LLVM backend's spin waits are convergent: LLVM tail-duplicated an mbarrier wait into both
// sides of a lane-0 branch of the persistent dK/dV's consumers (`wait K; if (lane 0) arrive; wait
// V`), and the diverged warp hung on the GPU (decision 074). Every wait of the lowered program
// appears once in the PTX (the nvrtc backend's asm is convergent as CUDA C's).
TEST_CASE("ring producer: every mbarrier wait stays one wait in the LLVM backend's PTX") {
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    const ir::Function fn = kernels::attention_backward_dkdv().build({{"DTYPE", bf16}, {"HEAD_DIM", 64}, {"BLOCK_M", 64}, {"BLOCK_N", 64},
                                                                      {"BSHD", true}, {"CAUSAL", causal}, {"DQ_REDUCTION", 1},
                                                                      {"RING_PRODUCER", true}, {"PERSISTENT", true}});
    jit::CompileOptions o;
    o.num_warps = 4;
    o.pipeline.stages = 2;
    o.make_cubin = false;
    int waits = 0;
    std::function<void(const jit::pir::Block&)> walk = [&](const jit::pir::Block& blk) {
      for (const jit::pir::Inst& in : blk.insts) {
        waits += in.op == jit::pir::Op::mbar_wait;
        for (const jit::pir::Block& r : in.regions) walk(r);
      }
    };
    walk(jit::lower(fn, o).body);
    const std::string ptx = jit::compile(fn, o).ptx;
    size_t in_ptx = 0;
    for (size_t at = ptx.find("mbarrier.try_wait"); at != std::string::npos; at = ptx.find("mbarrier.try_wait", at + 1)) ++in_ptx;
    CHECK(waits > 4);
    CHECK(in_ptx == static_cast<size_t>(waits));
  }
}
