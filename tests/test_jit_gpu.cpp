// GPU suite (ctest label "gpu"): kernels compiled by the JIT and run on the GPU must match the CPU
// interpreter on the same random inputs (outputs poisoned first). Skips visibly without a GPU.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <variant>

#include "dropout_key_args.hpp"
#include "axis_op_kernels.hpp"
#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/dropout_mask.hpp"
#include "kernels/gemm.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/interpreter.hpp"
#include "test_kernels.hpp"
#include "tf32_test_data.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

bool have_gpu() {
  if (runtime::Driver::get().available()) return true;
  MESSAGE("SKIPPED: no GPU: " << runtime::Driver::get().unavailable_reason());
  return false;
}

using HostArg = std::variant<HostTensor*, int64_t, double>;

struct Comparison {
  double rel_error = 0;      // over elements both sides hold numbers
  int64_t nan_mismatch = 0;  // elements NaN on one side only (poison left, or a real NaN)
};

Comparison compare(const HostTensor& gpu, const HostTensor& ref) {
  auto g = gpu.to_f64(), r = ref.to_f64();
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    bool gn = std::isnan(g[i]), rn = std::isnan(r[i]);
    if (gn || rn) {
      if (gn != rn) ++c.nan_mismatch;
      continue;
    }
    if (std::isinf(g[i]) || std::isinf(r[i])) {
      if (g[i] != r[i]) ++c.nan_mismatch;
      continue;
    }
    num += (g[i] - r[i]) * (g[i] - r[i]);
    den += r[i] * r[i];
  }
  c.rel_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

// Runs `fn` in the interpreter and on the GPU (compiled with `opts`) on copies of `args`; every
// tensor argument must then agree within `tol` (relative norm), NaN/inf positions exactly.
void check_one_backend(const ir::Function& fn, runtime::Grid grid, std::vector<HostArg> args, double tol,
                       jit::CompileOptions opts) {
  std::vector<HostTensor> ref_store, gpu_in;
  ref_store.reserve(args.size());
  std::vector<runtime::Arg> ref_args;
  for (auto& a : args) {
    if (auto* t = std::get_if<HostTensor*>(&a)) ref_store.push_back(**t);
  }
  size_t ti = 0;
  for (auto& a : args) {
    if (std::holds_alternative<HostTensor*>(a)) ref_args.emplace_back(ref_store[ti++]);
    else if (auto* i = std::get_if<int64_t>(&a)) ref_args.emplace_back(*i);
    else ref_args.emplace_back(std::get<double>(a));
  }
  runtime::interpret(fn, grid, ref_args);

  jit::CompiledKernel ck = jit::compile(fn, opts);  // (spills are asserted in CI by test_jit.cpp)
  runtime::GpuKernel k(fn, ck);
  std::vector<runtime::DeviceTensor> dev;
  dev.reserve(args.size());
  std::vector<runtime::DeviceArg> dargs;
  for (auto& a : args)
    if (auto* t = std::get_if<HostTensor*>(&a)) dev.push_back(runtime::DeviceTensor::from_host(**t));
  ti = 0;
  for (auto& a : args) {
    if (std::holds_alternative<HostTensor*>(a)) dargs.emplace_back(dev[ti++]);
    else if (auto* i = std::get_if<int64_t>(&a)) dargs.emplace_back(*i);
    else dargs.emplace_back(static_cast<float>(std::get<double>(a)));
  }
  k(grid, dargs);
  for (size_t i = 0; i < dev.size(); ++i) {
    HostTensor out = dev[i].to_host();
    Comparison c = compare(out, ref_store[i]);
    INFO(fmt::format("kernel {} tensor #{} ({}): rel. error {:.3g}, NaN/inf mismatches {}", fn.name, i, out.describe(),
                     c.rel_error, c.nan_mismatch));
    CHECK(c.nan_mismatch == 0);
    CHECK(c.rel_error <= tol);
  }
}

// Both backends (LLVM and nvrtc) when `both`, else LLVM only.
void check_against_interpreter(const ir::Function& fn, runtime::Grid grid, std::vector<HostArg> args, double tol,
                               jit::CompileOptions opts = {}, bool both = false) {
  for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    if (b == jit::Backend::Nvrtc && !both) break;
    INFO("backend " << jit::to_string(b));
    opts.backend = b;
    check_one_backend(fn, grid, args, tol, opts);
  }
}

}  // namespace

TEST_CASE("gpu: vector add over a ragged length matches exactly") {
  if (!have_gpu()) return;
  for (int block : {128, 256, 1024}) {
    const int n = 1000;
    HostTensor x(f32, {n}), y(f32, {n}), out(f32, {n});
    x.fill_uniform(1, -1, 1);
    y.fill_uniform(2, -1, 1);
    check_against_interpreter(test_kernels::vector_add.build({{"BLOCK", block}}), {cdiv(n, block)}, {&x, &y, &out, int64_t{n}}, 0.0,
                              {}, true);
  }
}

TEST_CASE("gpu: row softmax with -inf padding, one and several rows per program, f32 and bf16") {
  if (!have_gpu()) return;
  for (DType t : {f32, bf16})
    for (int rows_per : {1, 4})
      for (int warps : {1, 4}) {
        const int rows = 37, cols = 100;
        HostTensor x(t, {rows, cols}), y(t, {rows, cols});
        x.fill_normal(7, 0, 3);
        jit::CompileOptions o;
        o.num_warps = warps;
        check_against_interpreter(test_kernels::softmax.build({{"DTYPE", t}, {"ROWS", rows_per}}), {cdiv(rows, rows_per)}, {&x, &y},
                                  t == f32 ? 2e-6 : 1e-2, o, true);
      }
}

TEST_CASE("gpu: GEMM on tensor cores (mma.sync path) over ragged shapes and every operand majorness") {
  if (!have_gpu()) return;
  struct Shape3 {
    int m, n, k;
  };
  for (Shape3 s : {Shape3{64, 64, 32}, Shape3{150, 90, 70}, Shape3{256, 128, 256}, Shape3{33, 200, 48}})
    for (bool a_kmajor : {true, false})
      for (bool b_kmajor : {true, false}) {
        DType out_t = a_kmajor == b_kmajor ? f32 : bf16;
        INFO(fmt::format("{}x{}x{} A_KMAJOR={} B_KMAJOR={}", s.m, s.n, s.k, a_kmajor, b_kmajor));
        HostTensor a(bf16, a_kmajor ? ir::Shape{s.m, s.k} : ir::Shape{s.k, s.m});
        HostTensor b(bf16, b_kmajor ? ir::Shape{s.n, s.k} : ir::Shape{s.k, s.n});
        HostTensor c(out_t, {s.m, s.n});
        a.fill_uniform(11, -1, 1);
        b.fill_uniform(12, -1, 1);
        Meta meta{{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}, {"OUT_DTYPE", out_t},
                  {"A_KMAJOR", a_kmajor}, {"B_KMAJOR", b_kmajor}, {"ALIGN", 2}};
        check_against_interpreter(kernels::gemm().build(meta), {cdiv(s.m, 64), cdiv(s.n, 64)}, {&a, &b, &c},
                                  out_t == f32 ? 1e-5 : 1e-2, {}, true);
      }
}

TEST_CASE("gpu: attention forward, full and causal, ragged sequence") {
  if (!have_gpu()) return;
  for (bool causal : {false, true}) {
    const int B = 2, H = 2, S = 200, D = 64;
    HostTensor q(bf16, {B, H, S, D}), k(bf16, {B, H, S, D}), v(bf16, {B, H, S, D}), o(bf16, {B, H, S, D}), lse(f32, {B, H, S});
    q.fill_normal(1, 0, 1);
    k.fill_normal(2, 0, 1);
    v.fill_normal(3, 0, 1);
    check_against_interpreter(kernels::attention_forward().build({{"CAUSAL", causal}}), {cdiv(S, 64), H, B},
                              {&q, &k, &v, &o, &lse, 1.0 / std::sqrt(double(D))}, 1e-2);
  }
}

// CompileOptions::packed_loop_pairs (decision 092): loop-carried bf16 values as packed pairs in the
// LLVM backend -- a tile carried through a loop, and the D 128 forward whose P V is pipelined (P
// carried to the next key block) on the ring producer -- against the interpreter.
TEST_CASE("gpu: packed_loop_pairs: loop-carried bf16 tiles and the pipelined D 128 forward") {
  if (!have_gpu()) return;
  jit::CompileOptions o;
  o.packed_loop_pairs = true;
  const lang::Kernel carried = lang::kernel("carried_bf16", [](lang::Builder& kb) {
    auto X = kb.pointer("X", bf16), Y = kb.pointer("Y", bf16);
    auto n = kb.scalar<int>("n");
    lang::Tile idx = lang::arange(0, 64)[lang::col] * 64 + lang::arange(0, 64)[lang::row];
    lang::Var acc = lang::load(X + idx);
    lang::for_range(0, n, [&](lang::Tile) { acc = lang::cast(bf16, lang::cast(f32, acc) * 0.5f + 1.0f); });
    lang::store(Y + idx, acc);
  });
  HostTensor x(bf16, {64 * 64}), y(bf16, {64 * 64});
  x.fill_uniform(5, -4, 4);
  check_against_interpreter(carried.build(), {1}, {&x, &y, int64_t{5}}, 0.0, o);
  const int B = 2, H = 2, S = 300, D = 128;
  for (bool causal : {false, true}) {
    INFO("attention D 128 causal " << causal);
    HostTensor q(bf16, {B, S, H, D}), k(bf16, {B, S, H, D}), v(bf16, {B, S, H, D}), out(bf16, {B, S, H, D}), lse(f32, {B, H, S});
    q.fill_normal(1, 0, 1);
    k.fill_normal(2, 0, 1);
    v.fill_normal(3, 0, 1);
    jit::CompileOptions a = o;
    a.num_warps = 8;
    check_against_interpreter(kernels::attention_forward().build({{"HEAD_DIM", D}, {"BSHD", true}, {"CAUSAL", causal}, {"BLOCK_M", 128},
                                                                  {"BLOCK_N", 128}, {"POSITIVE_SCALE", true}}),
                              {cdiv(S, 128), H, B}, {&q, &k, &v, &out, &lse, 1.0 / std::sqrt(double(D))}, 1e-2, a);
  }
}

TEST_CASE("gpu: attention forward with grouped-query heads, S_q != S_k, [B,S,H,D] layout, rows with no key") {
  if (!have_gpu()) return;
  struct Case {
    int B, Hq, Hkv, Sq, Sk, D;
    bool causal, bshd;
  };
  for (Case c : {Case{1, 4, 2, 70, 130, 64, true, false}, Case{2, 2, 1, 100, 100, 64, true, true},
                 Case{1, 2, 2, 130, 50, 64, true, false}, Case{1, 4, 1, 256, 192, 128, false, true}}) {
    INFO(fmt::format("B={} Hq={} Hkv={} Sq={} Sk={} D={} causal={} bshd={}", c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.causal, c.bshd));
    auto shape = [&](int h, int sl) { return c.bshd ? ir::Shape{c.B, sl, h, c.D} : ir::Shape{c.B, h, sl, c.D}; };
    HostTensor q(bf16, shape(c.Hq, c.Sq)), k(bf16, shape(c.Hkv, c.Sk)), v(bf16, shape(c.Hkv, c.Sk)), o(bf16, shape(c.Hq, c.Sq));
    HostTensor lse(f32, {c.B, c.Hq, c.Sq});
    q.fill_normal(1, 0, 1);
    k.fill_normal(2, 0, 1);
    v.fill_normal(3, 0, 1);
    auto fn = kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"CAUSAL", c.causal}, {"BSHD", c.bshd}});
    check_against_interpreter(fn, {cdiv(c.Sq, 64), c.Hq, c.B}, {&q, &k, &v, &o, &lse, 1.0 / std::sqrt(double(c.D))}, 1e-2);
  }
}

TEST_CASE("gpu: Tensor::slice views with offsets from memory: clipped windows, padded sums, an innermost-dim slice") {
  if (!have_gpu()) return;
  const std::vector<int> cu{0, 5, 5, 37, 38, 70};  // lengths 5, 0, 32, 1, 32; rows 70, 71 in no view
  const int B = static_cast<int>(cu.size()) - 1;
  HostTensor x(bf16, {72, 64}), y(bf16, {72, 64}), z(f32, {B, 64}), w(bf16, {B, 64}), c(i32, {B + 1});
  x.fill_normal(7, 0, 1);
  for (int b = 0; b <= B; ++b) c.set({b}, cu[static_cast<size_t>(b)]);
  check_against_interpreter(test_kernels::segments.build(), {B}, {&x, &y, &z, &w, &c, int64_t{3}}, 1e-5, {}, true);
}

TEST_CASE("gpu: varlen attention forward (packed sequences, lengths 0 and 1, S_q != S_k, GQA)") {
  if (!have_gpu()) return;
  const std::vector<int> lq{0, 1, 70, 129, 5, 64}, lk{3, 0, 130, 64, 1, 64};
  const int B = static_cast<int>(lq.size()), Hq = 4, Hkv = 2, D = 64;
  HostTensor cq(i32, {B + 1}), ck(i32, {B + 1});
  int tq = 0, tk = 0;
  for (int b = 0; b <= B; ++b) {
    cq.set({b}, tq);
    ck.set({b}, tk);
    if (b < B) tq += lq[static_cast<size_t>(b)], tk += lk[static_cast<size_t>(b)];
  }
  for (bool causal : {false, true}) {
    INFO("causal=" << causal);
    HostTensor q(bf16, {tq + 3, Hq, D}), k(bf16, {tk + 3, Hkv, D}), v(bf16, {tk + 3, Hkv, D}), o(bf16, {tq + 3, Hq, D});
    HostTensor lse(f32, {Hq, tq + 3});
    q.fill_normal(1, 0, 1);
    k.fill_normal(2, 0, 1);
    v.fill_normal(3, 0, 1);
    auto fn = kernels::attention_forward().build({{"CAUSAL", causal}, {"VARLEN", true}});
    check_against_interpreter(fn, {cdiv(129, 64), Hq, B}, {&q, &k, &v, &o, &lse, 1.0 / std::sqrt(double(D)), &cq, &ck}, 1e-2);
  }
}

TEST_CASE("gpu: reductions across registers, lanes and warps; loops and ifs") {
  if (!have_gpu()) return;
  for (int warps : {1, 2, 4, 8}) {
    HostTensor x(f32, {64, 128}), r0(f32, {128}), r1(f32, {64}), s(f32, {1});
    x.fill_uniform(3, -1, 1);
    jit::CompileOptions o;
    o.num_warps = warps;
    check_against_interpreter(test_kernels::reductions.build(), {1}, {&x, &r0, &r1, &s, int64_t{5}}, 1e-5, o);
  }
}

TEST_CASE("gpu: elementwise ops, integer edge cases and casts match the interpreter") {
  if (!have_gpu()) return;
  HostTensor a(f32, {256}), b(f32, {256}), i(i32, {256}), j(i32, {256}), f(f32, {20, 256}), g(i32, {22, 256}), h(bf16, {256});
  a.fill_uniform(21, -2, 2);
  b.fill_uniform(22, -2, 2);
  i.fill_uniform(23, -1000000, 1000000);
  j.fill_uniform(24, -40, 40);
  // approximate PTX math (ex2/lg2/tanh/sin/rsqrt.approx) is within ~1e-6 relative
  check_against_interpreter(test_kernels::elementwise.build(), {1}, {&a, &b, &i, &j, &f, &g, &h}, 2e-6);
}

TEST_CASE("gpu: atomic_add from many programs into shared locations") {
  if (!have_gpu()) return;
  HostTensor x(f32, {32 * 64}), acc(f32, {64}), cnt(i32, {4});
  x.fill_uniform(5, 0, 1);
  acc.fill(0);
  cnt.fill(0);
  check_against_interpreter(test_kernels::atomics.build(), {32}, {&x, &acc, &cnt}, 1e-5);
}

TEST_CASE("gpu: atomic max/min/add/and/or/xor/xchg/cas with orders and scopes match the interpreter (issue 26)") {
  if (!have_gpu()) return;
  test_kernels::AtomicOpsArgs a(64);
  // the final memory does not depend on the programs' order: exact, both backends
  check_against_interpreter(test_kernels::atomic_ops().build(), {64},
                            {&a.x, &a.amax, &a.hist, &a.bits, &a.ext, &a.slot, &a.swap, &a.old}, 0.0, {}, true);
}

TEST_CASE("gpu: max/min/and/or/xor on windows match the interpreter (issue 26)") {
  if (!have_gpu()) return;
  HostTensor x(f32, {6 * 8, 64}), f(f32, {64, 48}), i(i32, {64, 48}), u(u32, {64, 48}), l(i64, {64, 48});
  x.fill_uniform(51, -5, 5);
  f.fill_uniform(52, -1, 1), i.fill_uniform(53, -2000, 2000), u.fill_uniform(54, 0, 4e9), l.fill_uniform(55, -1e12, 1e12);
  // order-independent updates: exact, both backends
  check_against_interpreter(test_kernels::window_atomics().build(), {6}, {&x, &f, &i, &u, &l}, 0.0, {}, true);
}

TEST_CASE("gpu: GEMM through the TMA + wgmma pipeline (B K-major and MN-major, ragged M and N)") {
  if (!have_gpu()) return;
  struct Shape3 {
    int m, n, k;
  };
  struct Config {
    int bm, bn, warps, stages;
    bool producer = false;   // RING_PRODUCER: the general rings, a producer warpgroup
    int persistent = 0;      // PERSISTENT with this many programs (fewer than the tiles: each walks several)
  };
  for (bool b_kmajor : {true, false})
  for (Config cfg : {Config{128, 128, 4, 3}, Config{128, 256, 8, 3}, Config{64, 64, 4, 2}, Config{256, 128, 8, 4},
                     Config{128, 256, 8, 4, true}, Config{128, 256, 8, 4, true, 2}, Config{128, 128, 8, 3, false, 3}})
    for (Shape3 s : {Shape3{256, 256, 128}, Shape3{200, 136, 192}, Shape3{130, 296, 64}, Shape3{64, 64, 1024}}) {  // N * 2 bytes: 16-byte row pitches
      INFO(fmt::format("{}x{}x{} with {}x{} tiles, {} warps, {} stages, B {}, producer {}, persistent {}", s.m, s.n, s.k, cfg.bm,
                       cfg.bn, cfg.warps, cfg.stages, b_kmajor ? "K-major" : "MN-major", cfg.producer, cfg.persistent));
      HostTensor a(bf16, {s.m, s.k}), bt(bf16, b_kmajor ? ir::Shape{s.n, s.k} : ir::Shape{s.k, s.n}), c(f32, {s.m, s.n});
      a.fill_uniform(31, -1, 1);
      bt.fill_uniform(32, -1, 1);
      Meta meta{{"BLOCK_M", cfg.bm}, {"BLOCK_N", cfg.bn}, {"BLOCK_K", 64}, {"B_KMAJOR", b_kmajor}, {"GROUP_M", cfg.bm == 64 ? 4 : 0},
                {"RING_PRODUCER", cfg.producer}, {"PERSISTENT", cfg.persistent > 0}};
      jit::CompileOptions o;
      o.num_warps = cfg.warps;
      o.pipeline.stages = cfg.stages;
      auto fn = kernels::gemm().build(meta);
      jit::CompileOptions ptx_only = o;
      ptx_only.make_cubin = false;
      REQUIRE(!jit::compile(fn, ptx_only).tensor_maps.empty());  // the pipeline was chosen
      runtime::Grid grid = cfg.persistent ? runtime::Grid{cfg.persistent}
                           : cfg.bm == 64 ? runtime::Grid{cdiv(s.m, cfg.bm) * cdiv(s.n, cfg.bn)}
                                          : runtime::Grid{cdiv(s.m, cfg.bm), cdiv(s.n, cfg.bn)};
      check_against_interpreter(fn, grid, {&a, &bt, &c}, 1e-5, o, true);
    }
}

// A given as A^T[K, M] (a weight gradient, dY^T X): MN-major A by TMA in 64-column chunks, read by
// wgmma transposed (imm-trans-a), with B either way; both operands by TMA.
TEST_CASE("gpu: GEMM through the TMA + wgmma pipeline with A^T (MN-major A), ragged M and N") {
  if (!have_gpu()) return;
  struct Shape3 {
    int m, n, k;
  };
  // (producer 1: RING_PRODUCER, the general planner's ring; 2: also PERSISTENT on 3 programs)
  for (bool b_kmajor : {false, true})
    for (auto [bm, bn, warps, stages, producer] :
         {std::array{128, 256, 8, 4, 0}, std::array{128, 128, 4, 3, 0}, std::array{64, 64, 4, 2, 0}, std::array{128, 256, 8, 4, 1},
          std::array{128, 256, 8, 4, 2}})
      for (Shape3 s : {Shape3{256, 256, 128}, Shape3{200, 136, 192}, Shape3{64, 296, 1024}}) {  // M, N * 2 bytes: 16-byte pitches
        INFO(fmt::format("{}x{}x{} with {}x{} tiles, {} warps, {} stages, B {}, producer {}", s.m, s.n, s.k, bm, bn, warps, stages,
                         b_kmajor ? "K-major" : "MN-major", producer));
        HostTensor at(bf16, {s.k, s.m}), bt(bf16, b_kmajor ? ir::Shape{s.n, s.k} : ir::Shape{s.k, s.n}), c(f32, {s.m, s.n});
        at.fill_uniform(33, -1, 1);
        bt.fill_uniform(34, -1, 1);
        Meta meta{{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"BLOCK_K", 64}, {"A_KMAJOR", false}, {"B_KMAJOR", b_kmajor}, {"GROUP_M", 8},
                  {"RING_PRODUCER", producer > 0}, {"PERSISTENT", producer > 1}};
        jit::CompileOptions o;
        o.num_warps = warps;
        o.pipeline.stages = stages;
        auto fn = kernels::gemm().build(meta);
        jit::CompileOptions ptx_only = o;
        ptx_only.make_cubin = false;
        REQUIRE(jit::compile(fn, ptx_only).tensor_maps.size() == 2);  // A and B by TMA: the pipeline or ring took A^T
        check_against_interpreter(fn, producer > 1 ? runtime::Grid{3} : runtime::Grid{cdiv(s.m, bm) * cdiv(s.n, bn)}, {&at, &bt, &c}, 1e-5,
                                  o, true);
      }
}

TEST_CASE("gpu: semaphores order the programs' accumulation (the last program first): bit-identical to the interpreter") {
  if (!have_gpu()) return;
  for (int64_t P : {4, 64, 132}) {  // at most one program per SM: all resident
    INFO("programs " << P);
    HostTensor x(f32, {P, 256}), acc(f32, {256}), order(i32, {P}), sem(i32, {1});
    x.fill_normal(3, 0, 1e3);
    for (int64_t e = 0; e < acc.numel(); ++e) acc.set_flat(e, 0.1);
    order.poison();
    sem.set_flat(0, 0);
    check_against_interpreter(test_kernels::ordered_sum.build(), {P}, {&x, &acc, &order, &sem}, 0.0, {}, true);
  }
}

TEST_CASE("gpu: atomic_add on a window after a semaphore (TMA add, thread 0 waits): bit-identical to the interpreter") {
  if (!have_gpu()) return;
  for (int64_t P : {3, 64, 132}) {
    INFO("programs " << P);
    HostTensor x(f32, {P * 64, 64}), acc(f32, {64, 64}), sem(i32, {1});
    x.fill_normal(5, 0, 1e3);
    for (int64_t e = 0; e < acc.numel(); ++e) acc.set_flat(e, 0.1);
    sem.set_flat(0, 0);
    check_against_interpreter(test_kernels::ordered_tile_add.build(), {P}, {&x, &acc, &sem}, 0.0, {}, true);
  }
}

TEST_CASE("gpu: load_at_use (re-read in the MMA layout) and its fallback when the window was overwritten match the interpreter") {
  if (!have_gpu()) return;
  HostTensor a(bf16, {128, 32}), b(bf16, {32, 64}), w(u32, {128, 2});
  a.fill_uniform(1, -1, 1);
  b.fill_uniform(2, -1, 1);
  std::mt19937 bits(3);
  for (int64_t e = 0; e < w.numel(); ++e) w.set_flat(e, static_cast<double>(bits()));
  for (bool at_use : {false, true})
    for (bool store_between : {false, true}) {
      INFO("AT_USE=" << at_use << " STORE_BETWEEN=" << store_between);
      HostTensor c(f32, {128, 64}), w_copy = w;
      c.poison();
      check_against_interpreter(test_kernels::masked_product.build({{"AT_USE", at_use}, {"STORE_BETWEEN", store_between}}), {2},
                                {&a, &b, &w_copy, &c}, 1e-5, {}, true);
    }
}

TEST_CASE("gpu: packed dropout keep-mask (Philox4x32-10) matches the interpreter bit for bit, ragged S_k") {
  if (!have_gpu()) return;
  struct Case {
    int bh, s_q, s_k, bm, bw, warps;
  };
  for (Case c : {Case{3, 100, 77, 64, 4, 4}, Case{2, 256, 1000, 64, 4, 4}, Case{1, 33, 512, 32, 8, 4}, Case{4, 128, 128, 16, 2, 1}, Case{2, 300, 4100, 128, 4, 4}}) {
    INFO(fmt::format("BH={} S_q={} S_k={} BLOCK_M={} BLOCK_W={} warps={}", c.bh, c.s_q, c.s_k, c.bm, c.bw, c.warps));
    const int words = static_cast<int>(cdiv(c.s_k, 32));
    HostTensor mask(u32, {c.bh, c.s_q, words});
    mask.poison();
    jit::CompileOptions o;
    o.num_warps = c.warps;
    // seed 0x0123456789abcdef, offset 0x0000000500000007, p = 0.1 (threshold 230); rng_state holds
    // the same key: read with rng_state_in_memory = 1 (the scalars then wrong), ignored with 0
    HostTensor state = testing::rng_state_tensor(0x0123456789abcdefull, 0x0000000500000007ull);
    check_against_interpreter(kernels::dropout_mask().build({{"BLOCK_M", c.bm}, {"BLOCK_W", c.bw}}),
                              {cdiv(c.s_q, c.bm), cdiv(words, c.bw), c.bh},
                              {&mask, int64_t{c.s_k}, int64_t{0x89abcdef}, int64_t{0x01234567}, int64_t{7}, int64_t{5}, int64_t{230}, &state,
                               int64_t{0}},
                              0.0, o, true);
    check_against_interpreter(kernels::dropout_mask().build({{"BLOCK_M", c.bm}, {"BLOCK_W", c.bw}}),
                              {cdiv(c.s_q, c.bm), cdiv(words, c.bw), c.bh},
                              {&mask, int64_t{c.s_k}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{230}, &state, int64_t{1}}, 0.0, o);
    // the persistent form: a grid of 5 programs striding over the same tiles
    check_against_interpreter(kernels::dropout_mask().build({{"BLOCK_M", c.bm}, {"BLOCK_W", c.bw}, {"PERSISTENT", true}}), {5},
                              {&mask, int64_t{c.s_k}, int64_t{0x89abcdef}, int64_t{0x01234567}, int64_t{7}, int64_t{5}, int64_t{230}, &state,
                               int64_t{0}},
                              0.0, o);
  }
}

// Library masks in the default Hopper forward schedule (128 x 128 blocks, 8 warps, 2 stages, K/V
// by TMA -- for list masks the ring prefetches block indices read from the pre-pass's lists): the
// GPU matches the interpreter; the pre-pass itself matches it exactly.
TEST_CASE("gpu: attention forward with library masks (interval skipping, pre-pass lists on the TMA ring) matches the interpreter") {
  if (!have_gpu()) return;
  using kernels::MaskKind;
  const int64_t B = 2, H = 2, S = 300, D = 128, BM = 128, BN = 128, nb = (S + 127) / 128;
  HostTensor q(bf16, {B, H, S, D}), k(bf16, {B, H, S, D}), v(bf16, {B, H, S, D});
  q.fill_normal(1, 0, 1);
  k.fill_normal(2, 0, 1);
  v.fill_normal(3, 0, 1);
  HostTensor docs(i32, {B, S}), prefix(i32, {B}), table(u8, {1, H, nb, nb});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) docs.set({b, t}, 10.0 + (b == 0 ? (t < 70 ? 0 : t < 200 ? 1 : 2) : (t < 150 ? 0 : 1)));
  prefix.set({0}, 100);
  prefix.set({1}, 37);
  std::mt19937 g(5);
  for (int64_t e = 0; e < table.numel(); ++e) table.set_flat(e, g() % 2);
  const jit::CompileOptions o = [] {
    jit::CompileOptions x;
    x.num_warps = 8;
    x.pipeline.stages = 2;
    return x;
  }();
  for (MaskKind kind : {MaskKind::sliding_window, MaskKind::causal_sliding_window, MaskKind::global_sliding_window, MaskKind::document,
                        MaskKind::causal_document, MaskKind::prefix_lm, MaskKind::share_question, MaskKind::causal_blockwise,
                        MaskKind::block_sparse}) {
    INFO("MASK=" << kernels::mask_kind_name(kind));
    std::vector<HostArg> mask_args;
    for (const std::string& name : kernels::mask_parameter_names(kind)) {
      if (name == "mask_window_left") mask_args.emplace_back(int64_t{50});
      else if (name == "mask_window_right") mask_args.emplace_back(int64_t{20});
      else if (name == "mask_global_tokens") mask_args.emplace_back(int64_t{16});
      else if (name == "mask_block_q" || name == "mask_block_k") mask_args.emplace_back(int64_t{128});
      else if (name == "mask_doc_ids") mask_args.emplace_back(&docs);
      else if (name == "mask_prefix_lengths") mask_args.emplace_back(&prefix);
      else if (name == "mask_block_table") mask_args.emplace_back(&table);
      else FAIL("no argument for " << name);
    }
    HostTensor o_out(bf16, {B, H, S, D}), lse(f32, {B, H, S});
    o_out.poison();
    lse.poison();
    std::vector<HostArg> args{&q, &k, &v, &o_out, &lse, 0.088};
    args.insert(args.end(), mask_args.begin(), mask_args.end());
    HostTensor classes, num, idx, full_num, full_idx;
    if (!kernels::mask_has_tile_intervals(kind)) {
      const int64_t mb = kind == MaskKind::block_sparse ? 1 : B, mh = kind == MaskKind::block_sparse ? H : 1;
      classes = HostTensor(u8, {mb, mh, nb, nb}), num = HostTensor(i32, {mb, mh, nb}), idx = HostTensor(i32, {mb, mh, nb, nb});
      full_num = HostTensor(i32, {mb, mh, nb}), full_idx = HostTensor(i32, {mb, mh, nb, nb});
      for (HostTensor* t : {&classes, &num, &idx, &full_num, &full_idx})  // (entries past a count stay 0)
        for (int64_t e = 0; e < t->numel(); ++e) t->set_flat(e, 0);
      // the pre-pass: classes, then lists; GPU == interpreter, bit for bit, then the interpreter's
      // outputs feed the next step and the forward
      auto step = [&](const ir::Function& fn, runtime::Grid grid, const std::vector<HostArg>& a) {
        check_against_interpreter(fn, grid, a, 0.0, o);
        std::vector<runtime::Arg> ref;
        for (const HostArg& x : a) {
          if (auto* t = std::get_if<HostTensor*>(&x)) ref.emplace_back(**t);
          else ref.emplace_back(std::get<int64_t>(x));
        }
        runtime::interpret(fn, grid, ref);
      };
      std::vector<HostArg> pre{&classes, S, S};
      pre.insert(pre.end(), mask_args.begin(), mask_args.end());
      step(kernels::attention_block_classes().build({{"BLOCK_M", BM}, {"BLOCK_N", BN}, {"MASK", static_cast<int>(kind)}}),
           {nb, nb, mb * mh}, pre);
      step(kernels::attention_block_lists().build(), {nb, mh, mb}, {&classes, &num, &idx, &full_num, &full_idx});
      for (HostTensor* t : {&num, &idx, &full_num, &full_idx}) args.emplace_back(t);
    }
    check_against_interpreter(
        kernels::attention_forward().build({{"HEAD_DIM", D}, {"BLOCK_M", BM}, {"BLOCK_N", BN}, {"MASK", static_cast<int>(kind)}}),
        {nb, H, B}, args, 2e-2, o);
  }
}

TEST_CASE("gpu: score mods (ALiBi, soft-capping) in the attention forward, dK/dV (recompute and atomic) and dQ match the interpreter") {
  if (!have_gpu()) return;
  using kernels::ScoreModKind;
  const int64_t B = 1, Hq = 4, Hkv = 2, S = 300, D = 128;
  HostTensor q(bf16, {B, Hq, S, D}), k(bf16, {B, Hkv, S, D}), v(bf16, {B, Hkv, S, D}), dout(bf16, {B, Hq, S, D}), slopes(f32, {Hq});
  q.fill_normal(1, 0, 1), k.fill_normal(2, 0, 1), v.fill_normal(3, 0, 1), dout.fill_normal(4, 0, 1);
  for (int64_t h = 0; h < Hq; ++h) slopes.set({h}, 0.5 / static_cast<double>(h + 1));
  const double scale = 1.0 / std::sqrt(double(D));
  auto opts = [](int warps) {
    jit::CompileOptions x;
    x.num_warps = warps;
    x.pipeline.stages = 2;
    return x;
  };
  for (ScoreModKind mod : {ScoreModKind::alibi, ScoreModKind::softcap})
    for (bool causal : {false, true}) {
      INFO(kernels::score_mod_kind_name(mod) << " causal=" << causal);
      const HostArg mod_arg = mod == ScoreModKind::alibi ? HostArg{&slopes} : HostArg{1.5};
      const lang::Meta common{{"HEAD_DIM", D}, {"CAUSAL", causal}, {"SCORE_MOD", static_cast<int>(mod)}};
      auto meta = [&](int64_t bm, int64_t bn) {
        lang::Meta m = common;
        m.emplace_back("BLOCK_M", bm), m.emplace_back("BLOCK_N", bn);
        return m;
      };
      HostTensor o(bf16, {B, Hq, S, D}), lse(f32, {B, Hq, S}), delta(f32, {B, Hq, S});
      const ir::Function fwd = kernels::attention_forward().build(meta(128, 128));
      check_against_interpreter(fwd, {cdiv(S, 128), Hq, B}, {&q, &k, &v, &o, &lse, scale, mod_arg}, 1e-2, opts(8));
      // the backward's inputs: the interpreter's forward and Delta
      runtime::Arg m_arg = mod == ScoreModKind::alibi ? runtime::Arg(slopes) : runtime::Arg(1.5f);
      runtime::interpret(fwd, {cdiv(S, 128), Hq, B}, {q, k, v, o, lse, static_cast<float>(scale), m_arg});
      runtime::interpret(kernels::attention_backward_preprocess().build({{"BLOCK_M", 64}, {"HEAD_DIM", D}}), {cdiv(S, 64), Hq, B}, {o, dout, delta});
      for (int reduction : {0, 1}) {
        INFO("DQ_REDUCTION " << reduction);
        HostTensor dk(bf16, {B, Hkv, S, D}), dv(bf16, {B, Hkv, S, D}), accum(f32, {B, Hq, S, D});
        accum.fill(0.0);
        lang::Meta m = meta(64, 128);
        std::vector<HostArg> args{&q, &k, &v, &dout, &lse, &delta, &dk, &dv};
        if (reduction) m.emplace_back("DQ_REDUCTION", 1), args.emplace_back(&accum);
        args.insert(args.end(), {scale, mod_arg});
        check_against_interpreter(kernels::attention_backward_dkdv().build(m), {cdiv(S, 128), Hkv, B}, args, 1e-2, opts(8));
      }
      HostTensor dq(bf16, {B, Hq, S, D});
      check_against_interpreter(kernels::attention_backward_dq().build(meta(128, 64)), {cdiv(S, 128), Hq, B},
                                {&q, &k, &v, &dout, &lse, &delta, &dq, scale, mod_arg}, 1e-2, opts(8));
    }
}

TEST_CASE("gpu: integer padding converts like a cast, as in the interpreter (issue 28, item 2)") {
  if (!have_gpu()) return;
  HostTensor u(u8, {16}), i(i8, {16}), ou(u8, {16}), oi(i8, {16});
  u.fill_uniform(61, 0, 255);
  i.fill_uniform(62, -128, 127);
  for (int64_t off : {0, 10, 16, -20})
    check_against_interpreter(test_kernels::int_padding().build(), {1}, {&u, &i, &ou, &oi, off}, 0.0, {}, true);
}

TEST_CASE("gpu: f32 atomic_add with subnormal inputs, memory and results (issue 28, item 4)") {
  if (!have_gpu()) return;
  HostTensor x(f32, {64}), acc(f32, {64}), old(f32, {64}), acc2(f32, {64});
  const float tiny = 1e-39f, small = 1.5e-38f;  // subnormal; normal (min normal 1.18e-38)
  const std::array<float, 8> xs{tiny, -tiny, small, -small, 0.0f, 1.0f, tiny, -2 * tiny};
  const std::array<float, 8> accs{0.0f, tiny, -small, small, tiny, -tiny, 2e-38f, -1e-38f};
  for (int64_t k = 0; k < 64; ++k) {
    x.set({k}, xs[static_cast<size_t>(k) % 8] * static_cast<float>(1 + k / 8));
    acc.set({k}, accs[static_cast<size_t>(k / 8) % 8]);
    acc2.set({k}, accs[static_cast<size_t>(k / 8) % 8]);
  }
  check_against_interpreter(test_kernels::atomic_subnormals().build(), {1}, {&x, &acc, &old, &acc2}, 0.0, {}, true);
}

TEST_CASE("gpu: 64-bit and narrow integer reductions across lanes and warps; pack_pairs of a thin tile (issue 28, item 10)") {
  if (!have_gpu()) return;
  for (DType d : {i64, u64, f64, i8, u8, i16, u16}) {
    INFO(ir::name(d));
    HostTensor x(d, {32, 64}), rows(d, {32}), cols(d, {64}), all(d, {1});
    if (ir::is_signed(d) || d == f64) x.fill_uniform(70, -100, 100);
    else x.fill_uniform(71, 0, 200);  // sums wrap for 8/16 bits, as in the interpreter
    // f64 sums add in another order on the GPU (lanes, then warps): rounding differences only
    check_against_interpreter(test_kernels::wide_and_narrow_reductions.build({{"DTYPE", d}}), {1}, {&x, &rows, &cols, &all},
                              d == f64 ? 1e-14 : 0.0, {}, true);
  }
  HostTensor h(f16, {128}), w(u32, {64});
  h.fill_normal(72, 0, 2);
  check_against_interpreter(test_kernels::small_pack_pairs.build(), {1}, {&h, &w}, 0.0, {}, true);
}

TEST_CASE("gpu: window offsets of every integer type, as in the interpreter (issue 28, item 1)") {
  if (!have_gpu()) return;
  const auto n = static_cast<int64_t>(std::size(test_kernels::kWideOffsetTypes));
  HostTensor x(f32, {40, 48}), o(f32, {n, 16, 32}), p(f32, {n, 16, 32}), r(f32, {n, 32}), s(f32, {n, 40, 48}), a(f32, {n, 40, 64});
  x.fill_uniform(63, -3, 3);
  a.fill_uniform(64, -1, 1);
  const int64_t max64 = std::numeric_limits<int64_t>::max(), min64 = std::numeric_limits<int64_t>::min();
  // i64 2^32 (row 0 on the GPU before), u32 0xFFFFFFFF (-1 before), negative i64, u64 >= 2^63, i16 / u8 wraps
  for (int64_t off : {int64_t{0}, int64_t{5}, int64_t{-3}, int64_t{30}, int64_t{1} << 32, (int64_t{1} << 32) + 3, int64_t{0xFFFFFFFF},
                      int64_t{-1}, int64_t{-20}, (int64_t{1} << 16) + 2, (int64_t{1} << 31) - 2, max64 - 2, min64, -(int64_t{1} << 32) + 7}) {
    INFO("off = " << off);
    check_against_interpreter(test_kernels::wide_offsets().build(), {1}, {&x, &o, &p, &r, &s, &a, off}, 0.0, {}, true);
  }
}

TEST_CASE("gpu: TMA copies, TMA reduce and the TMA pipeline with offsets wider than i32 take the generic paths (issue 28, item 1)") {
  if (!have_gpu()) return;
  HostTensor a(bf16, {100, 256}), b(bf16, {64, 256}), c(f32, {100, 64}), d(f32, {64, 64});
  // small integers: every product and sum is exact in f32, so the check is exact
  for (int64_t i = 0; i < a.numel(); ++i) a.set_flat(i, static_cast<double>(i * 7 % 5) - 2);
  for (int64_t i = 0; i < b.numel(); ++i) b.set_flat(i, static_cast<double>(i * 3 % 7) - 3);
  for (int64_t i = 0; i < c.numel(); ++i) c.set_flat(i, static_cast<double>(i % 11));
  for (DType t : {i32, i64, u32, u64, i16})
    for (int64_t off : {int64_t{0}, int64_t{40}, (int64_t{1} << 32) + 40, -(int64_t{1} << 32) + 8, int64_t{0xFFFFFFFF}, int64_t{-10}}) {
      INFO("OFFSET_DTYPE " << ir::name(t) << ", off = " << off);
      const ir::Function fn = test_kernels::wide_offset_tma().build({{"OFFSET_DTYPE", t}, {"COUNTER_DTYPE", t == i32 ? i32 : i64}});
      check_against_interpreter(fn, {1}, {&a, &b, &c, &d, off}, 0.0, {}, true);
    }
}

TEST_CASE("gpu: constant i32 window offsets whose coordinates wrap past 2^31 (issue 28, fuzzer)") {
  if (!have_gpu()) return;
  HostTensor src(i32, {128, 16}), ones(f32, {1, 64, 16}), masked(f32, {1, 64, 16}), acc(i64, {66, 16});
  src.fill_uniform(5, -1000, 1000);
  for (int64_t i = 0; i < acc.numel(); ++i) acc.set_flat(i, static_cast<double>(i % 7));
  check_against_interpreter(test_kernels::wrapping_window_offset().build(), {1}, {&src, &ones, &masked, &acc}, 0.0, {}, true);
}

TEST_CASE("gpu: windows at contiguous offsets that are not 16-byte multiples take the generic path (issue 28, fuzzer)") {
  if (!have_gpu()) return;
  HostTensor a(bf16, {64, 256}), b(bf16, {64, 256}), o(f32, {64, 256});
  // small integers: products and sums exact in f32, so the check is exact
  for (int64_t i = 0; i < a.numel(); ++i) a.set_flat(i, static_cast<double>(i * 7 % 5) - 2);
  for (int64_t i = 0; i < b.numel(); ++i) b.set_flat(i, static_cast<double>(i * 3 % 7) - 3);
  for (int64_t i = 0; i < o.numel(); ++i) o.set_flat(i, static_cast<double>(i % 11));
  for (int step : {1, 8})
    for (int64_t k : {0, 1, 3, 8, 63}) {
      INFO("STEP " << step << ", k = " << k);
      check_against_interpreter(test_kernels::unaligned_tma_windows().build({{"STEP", step}}), {1}, {&a, &b, &o, k}, 0.0, {}, true);
    }
}

TEST_CASE("gpu: float % is the exact remainder, as fmod in the interpreter, bit for bit (issue 28, item 3)") {
  if (!have_gpu()) return;
  for (DType d : {f32, f64, f16, bf16}) {
    INFO(ir::name(d));
    const std::vector<std::pair<double, double>> xy = test_kernels::float_rem_inputs(d, 65);
    const auto n = static_cast<int64_t>(xy.size());
    HostTensor x(d, {n}), y(d, {n}), r(d, {n}), bits(u32, {2 * n});
    for (int64_t i = 0; i < n; ++i) x.set_flat(i, xy[static_cast<size_t>(i)].first), y.set_flat(i, xy[static_cast<size_t>(i)].second);
    check_against_interpreter(test_kernels::float_rem().build({{"DTYPE", d}}), {cdiv(n, 256)}, {&x, &y, &r, &bits, n}, 0.0, {},
                              true);
  }
}

TEST_CASE("gpu: neg, 0 - x, x * -1 and abs of the smallest i8 / i16 wrap, as in the interpreter (issue 28, fuzzer)") {
  if (!have_gpu()) return;
  for (DType d : {i8, i16}) {
    INFO(ir::name(d));
    HostTensor x(d, {64}), out(i32, {320});
    x.fill_uniform(81, d == i8 ? -128 : -32768, d == i8 ? 127 : 32767);
    x.set({0}, d == i8 ? -128 : -32768);
    x.set({1}, d == i8 ? -127 : -32767);
    x.set({2}, -128);
    x.set({3}, d == i16 ? 128 : 127);
    check_against_interpreter(test_kernels::narrow_int_negation().build({{"DTYPE", d}}), {1}, {&x, &out}, 0.0, {}, true);
  }
}

TEST_CASE("gpu: signed min/max of negated values equal the interpreter, i32 / i16 / i8, both backends (fuzzer seed 723574)") {
  if (!have_gpu()) return;
  for (DType d : {i32, i16, i8}) {
    INFO(ir::name(d));
    const double lo = d == i32 ? -2147483648.0 : d == i16 ? -32768 : -128, hi = -lo - 1;
    HostTensor x(d, {16, 32}), out(i32, {5, 32});
    x.fill_uniform(723574, lo, hi);
    x.set({0, 3}, lo);  // the smallest value: its negation wraps to itself
    for (int c = 0; c < 32; ++c) x.set({1, c}, 3 + c % 5), x.set({2, c}, -7 + c);  // a small spread that max(-a, b, -c) gets wrong
    check_against_interpreter(test_kernels::negated_min_max().build({{"DTYPE", d}}), {1}, {&x, &out}, 0.0, {}, true);
  }
}

TEST_CASE("gpu: dsl/math functions equal the interpreter (exact ones bit for bit), both backends (issue 26)") {
  if (!have_gpu()) return;
  for (DType d : {f32, bf16, f64}) {
    INFO(ir::name(d));
    const Kernel exact = kernel("math_exact", [d](Builder& b) {
      auto X = b.pointer("X", d), Y = b.pointer("Y", d), P = b.pointer("P", i32);
      auto i = arange(0, 256);
      Tile x = load(X + i);
      store(Y + i, trunc(x));
      store(Y + 256 + i, round(x));
      store(Y + 512 + i, clamp(x, -1.0f, 2.0f));
      store(P + i, cast(i32, isnan(x)) + cast(i32, isinf(x)) * 2 + cast(i32, isfinite(x)) * 4 + cast(i32, signbit(x)) * 8 +
                       broadcast_to(sum(isnan(x)), {256}) * 16);
      Tile m = reshape(x, {16, 16});  // argmax / argmin along both axes (the NaN row and the zeros)
      store(P + 256 + arange(0, 16), argmax(m, 1) + argmin(m, 1) * 32);
      store(P + 272 + arange(0, 16), argmax(m, 0) + argmin(m, 0) * 32);
    });
    HostTensor x(d, {256}), y(d, {768}), p(i32, {288});
    x.fill_uniform(91, -1e4, 1e4);
    const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 0.5, -0.5, 1.5, 2.5, -2.5, 0x1p23 - 0.5, 1e-30, -0.3};
    for (int64_t i = 0; i < 13; ++i) x.set({i}, special[i]);
    check_against_interpreter(exact.build(), {1}, {&x, &y, &p}, 0.0, {}, true);
    if (d == f64) continue;  // (f64 exp/log are refused on the GPU: README)
    const Kernel approx = kernel("math_approx", [d](Builder& b) {
      auto X = b.pointer("X", d), Y = b.pointer("Y", d);
      auto i = arange(0, 256);
      Tile v = load(X + i) * 0.001f;
      store(Y + i, sigmoid(v));
      store(Y + 256 + i, log1p(v));
      store(Y + 512 + i, expm1(v));
    });
    check_against_interpreter(approx.build(), {1}, {&x, &y}, d == bf16 ? 1e-2 : 1e-5, {}, true);
  }
}

// dsl/combine.hpp (issue 26): scans and reductions with a combine, the axis carried by registers,
// lanes and warps (and an MMA accumulator's layout), against the interpreter: integers bit for bit
// (an order-sensitive combine included), floats within the tree order's rounding.
TEST_CASE("gpu: associative_scan, reduce with a combine, cumsum equal the interpreter, both backends") {
  if (!have_gpu()) return;
  const axis_ops::Case cases[] = {{{4, 64}, 1, 4, i32},  {{4, 64}, 0, 4, i32},  {{1024}, 0, 8, i32},    {{64, 64}, 0, 4, i64},
                                  {{16, 128}, 1, 8, i8}, {{32, 32}, 1, 4, f32}, {{128, 16}, 0, 8, f32}, {{256}, 0, 4, bf16}};
  for (const axis_ops::Case& c : cases)
    for (bool reverse : {false, true}) {
      INFO(ir::shape_string(c.shape) << " axis " << c.axis << " warps " << c.warps << " " << ir::name(c.dtype) << " reverse " << reverse);
      std::vector<HostTensor> t = axis_ops::combine_tensors(c);
      jit::CompileOptions o;
      o.num_warps = c.warps;
      check_against_interpreter(axis_ops::combine_kernel(c, reverse).build(), {1}, {&t[0], &t[1], &t[2], &t[3]},
                                ir::is_float(c.dtype) ? 1e-5 : 0.0, o, true);
    }
  // the axis in an MMA accumulator's layout (a dot's result), not a blocked one
  const Kernel mma = kernel("scan_of_dot", [](Builder& kb) {
    auto Aa = kb.tensor("A", bf16, 2), Bb = kb.tensor("B", bf16, 2), S = kb.tensor("S", f32, 2), T = kb.tensor("T", f32, 2);
    Tile acc = dot(load(Aa.block({0, 0}, {64, 32})), load(Bb.block({0, 0}, {32, 64})), zeros(f32, {64, 64}));
    store(S.block({0, 0}, {64, 64}), cumsum(acc, 1));
    store(T.block({0, 0}, {64, 64}), cumsum(acc, 0, true));
  });
  HostTensor a(bf16, {64, 32}), b(bf16, {32, 64}), s(f32, {64, 64}), t(f32, {64, 64});
  a.fill_uniform(8, -2, 2);
  b.fill_uniform(9, -2, 2);
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t j = 0; j < 32; ++j) {  // small integers: every product and sum exact, any order
      a.set({i, j}, std::round(a.get({i, j})));
      b.set({j, i}, std::round(b.get({j, i})));
    }
  check_against_interpreter(mma.build(), {1}, {&a, &b, &s, &t}, 0.0, {}, true);
}

// dsl/sort.hpp (issue 26): xor_permute across register, lane and warp bits, and the bitonic
// network over it (sort, argsort, topk, flip), bit for bit against the interpreter.
TEST_CASE("gpu: sort, argsort, topk and flip equal the interpreter bit for bit, both backends") {
  if (!have_gpu()) return;
  const axis_ops::Case cases[] = {{{4, 64}, 1, 4, f32}, {{1024}, 0, 8, f32}, {{64, 16}, 0, 4, i32}, {{16, 128}, 1, 8, bf16}, {{256}, 0, 4, u8}};
  for (const axis_ops::Case& c : cases)
    for (bool descending : {false, true}) {
      INFO(ir::shape_string(c.shape) << " axis " << c.axis << " warps " << c.warps << " " << ir::name(c.dtype) << " descending " << descending);
      std::vector<HostTensor> t = axis_ops::sort_tensors(c);
      jit::CompileOptions o;
      o.num_warps = c.warps;
      check_against_interpreter(axis_ops::sort_kernel(c, descending).build(), {1}, {&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]}, 0.0,
                                o, true);
    }
}

TEST_CASE("gpu: gather along either axis equals the interpreter bit for bit, both backends") {
  if (!have_gpu()) return;
  for (int warps : {4, 8}) {
    INFO("warps " << warps);
    const Kernel k = kernel("gather_gpu", [](Builder& kb) {
      auto X = kb.tensor("X", bf16, 2), I0 = kb.tensor("I0", i32, 2), I1 = kb.tensor("I1", i64, 2);
      auto Y0 = kb.tensor("Y0", bf16, 2), Y1 = kb.tensor("Y1", bf16, 2);
      Tile x = load(X.block({0, 0}, {32, 128}));
      store(Y0.block({0, 0}, {64, 128}), gather(x, load(I0.block({0, 0}, {64, 128})), 0));
      store(Y1.block({0, 0}, {32, 32}), gather(x, load(I1.block({0, 0}, {32, 32})), 1));
    });
    HostTensor x(bf16, {32, 128}), i0(i32, {64, 128}), i1(i64, {32, 32}), y0(bf16, {64, 128}), y1(bf16, {32, 32});
    x.fill_uniform(31, -8, 8);
    i0.fill_uniform(32, 0, 31);
    i1.fill_uniform(33, 0, 127);
    jit::CompileOptions o;
    o.num_warps = warps;
    check_against_interpreter(k.build(), {1}, {&x, &i0, &i1, &y0, &y1}, 0.0, o, true);
  }
}

TEST_CASE("gpu: histogram equals the interpreter, both backends and both methods") {
  if (!have_gpu()) return;
  const Kernel k = kernel("histogram_gpu", [](Builder& kb) {
    auto X = kb.pointer("X", i32), H = kb.pointer("H", i32);
    Tile x = load(X + program_id(0) * 512 + arange(0, 512));
    atomic_add(H + arange(0, 64), histogram(x, 64));  // the programs' histograms summed
  });
  HostTensor x(i32, {8 * 512}), h(i32, {64});
  x.fill_uniform(41, -10, 70);
  check_against_interpreter(k.build(), {8}, {&x, &h}, 0.0, {}, true);
  for (const axis_ops::HistogramCase& c : axis_ops::histogram_cases()) {  // both lowerings
    INFO(ir::shape_string(c.shape) << " " << ir::name(c.dtype) << " bins " << c.bins << " warps " << c.warps);
    std::vector<HostTensor> t = axis_ops::histogram_tensors(c);
    jit::CompileOptions o;
    o.num_warps = c.warps;
    check_against_interpreter(axis_ops::histogram_kernel(c).build(), {1}, {&t[0], &t[1]}, 0.0, o, true);
    // HistogramMethod::shared_atomics: the atomics below 1024 bins too, the same counts
    if (c.bins <= 1024) check_against_interpreter(axis_ops::histogram_kernel(c, HistogramMethod::shared_atomics).build(), {1}, {&t[0], &t[1]}, 0.0, o, true);
  }
}

TEST_CASE("gpu: abs of the smallest i8 / i16 wraps, as in the interpreter (issue 28, fuzzer)") {
  if (!have_gpu()) return;
  for (DType d : {i8, i16}) {
    INFO(ir::name(d));
    const Kernel k = kernel("abs_wrap", [&](Builder& b) {
      auto X = b.pointer("X", d), Out = b.pointer("Out", i32);
      auto i = arange(0, 64);
      store(Out + i, cast(i32, abs(load(X + i))));
    });
    HostTensor x(d, {64}), out(i32, {64});
    x.fill_uniform(80, d == i8 ? -128 : -32768, d == i8 ? 127 : 32767);
    x.set({0}, d == i8 ? -128 : -32768);
    x.set({1}, d == i8 ? -127 : -32767);
    check_against_interpreter(k.build(), {1}, {&x, &out}, 0.0, {}, true);
  }
}

// lang::ring_producer (issue 22): a producer warpgroup fills the K / V rings; the consumers wait
// per tile and free each stage after its last reader. The values are the interpreter's (ragged key
// counts: TMA's zero fill), on both backends, for a small kernel and the attention forward.
TEST_CASE("gpu: ring_producer: rings filled by a producer warpgroup give the interpreter's values") {
  if (!have_gpu()) return;
  HostTensor q(bf16, {128, 64}), k(bf16, {200, 64}), v(bf16, {200, 64}), o(f32, {128, 64});
  q.fill_normal(1, 0, 1);
  k.fill_normal(2, 0, 1);
  v.fill_normal(3, 0, 1);
  for (int stages : {2, 3}) {
    INFO("stages " << stages);
    jit::CompileOptions opts;
    opts.pipeline.stages = stages;
    check_against_interpreter(test_kernels::ring_kernel().build({{"PRODUCER", true}}), {2}, {&q, &k, &v, &o}, 1e-2, opts, true);
    // the key loop run twice inside another loop: the ring's stages and phases continue across runs
    check_against_interpreter(test_kernels::ring_kernel().build({{"PRODUCER", true}, {"NESTED", true}}), {2}, {&q, &k, &v, &o}, 1e-2, opts,
                              true);
  }
  // RingProducer::reduce_writer: the producer's second warp adds each key block's part into one
  // window (one part of all consumers on 4 warps, one a warpgroup on 8)
  HostTensor kw(bf16, {192, 64}), vw(bf16, {192, 64}), acc(f32, {128, 64}), out(f32, {128, 64}), sem(i32, {1});
  kw.fill_normal(4, 0, 1);
  vw.fill_normal(5, 0, 1);
  acc.fill(0), out.fill(0), sem.fill(0);
  for (int warps : {4, 8}) {
    INFO("reduce_writer, " << warps << " consumer warps");
    jit::CompileOptions opts;
    opts.num_warps = warps;
    opts.pipeline.stages = 2;
    check_against_interpreter(test_kernels::writer_kernel().build({{"WRITER", true}}), {2}, {&q, &kw, &vw, &acc, &out, &sem}, 1e-3, opts, true);
    // ordered adds that pass their turn on (atomic_add's signal), issued by the consumers, and by
    // the writer (it waits for each turn and signals one add later: decision 074)
    for (const bool writer : {false, true}) {
      sem.fill(0);
      check_against_interpreter(test_kernels::writer_kernel().build({{"ORDERED", true}, {"WRITER", writer}}), {2},
                                {&q, &kw, &vw, &acc, &out, &sem}, 1e-3, opts, true);
    }
  }
  struct Case {
    int64_t D, block;
    int warps;
    bool causal;
    int Hq, Hkv, Sq, Sk;
  };
  // (the last: causal with S_q > S_k, query tiles that see no key run their key loop no trip)
  for (Case c : {Case{128, 128, 8, true, 4, 2, 300, 300}, Case{128, 128, 8, false, 2, 2, 200, 333}, Case{64, 64, 4, true, 2, 1, 190, 130},
                 Case{128, 128, 8, true, 2, 1, 600, 70}}) {
    INFO(fmt::format("D={} block={} warps={} causal={} Hq={} Hkv={} Sq={} Sk={}", c.D, c.block, c.warps, c.causal, c.Hq, c.Hkv, c.Sq, c.Sk));
    HostTensor aq(bf16, {1, c.Sq, c.Hq, c.D}), ak(bf16, {1, c.Sk, c.Hkv, c.D}), av(bf16, {1, c.Sk, c.Hkv, c.D}), ao(bf16, {1, c.Sq, c.Hq, c.D});
    HostTensor lse(f32, {1, c.Hq, c.Sq});
    aq.fill_normal(4, 0, 1);
    ak.fill_normal(5, 0, 1);
    av.fill_normal(6, 0, 1);
    auto fn = kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"BLOCK_M", c.block}, {"BLOCK_N", c.block}, {"CAUSAL", c.causal},
                                                  {"BSHD", true}, {"RING_PRODUCER", true}});
    jit::CompileOptions opts;
    opts.num_warps = c.warps;
    opts.pipeline.stages = 2;
    check_against_interpreter(fn, {cdiv(c.Sq, c.block), c.Hq, 1}, {&aq, &ak, &av, &ao, &lse, 1.0 / std::sqrt(double(c.D))}, 1e-2, opts, true);
    // PERSISTENT: the rings count on across a program's tiles (the producer copies the next tile's
    // Q and first blocks early) -- on grids that leave programs with different tile counts
    // (and without PV_PEEL: Q is then read only inside the key loop)
    for (bool peel : {true, false}) {
      auto persistent = kernels::attention_forward().build({{"HEAD_DIM", c.D}, {"BLOCK_M", c.block}, {"BLOCK_N", c.block}, {"CAUSAL", c.causal},
                                                            {"BSHD", true}, {"RING_PRODUCER", true}, {"PERSISTENT", true}, {"PV_PEEL", peel}});
      for (int64_t programs : {int64_t{1}, int64_t{2}, int64_t{3}}) {
        INFO("PERSISTENT on " << programs << " programs, PV_PEEL " << peel);
        check_against_interpreter(persistent, {programs}, {&aq, &ak, &av, &ao, &lse, 1.0 / std::sqrt(double(c.D))}, 1e-2, opts, true);
      }
    }
  }
}

// Found by `tilejit_fuzz --gpu --tma-stores` at ccd3780 (seeds 5142, 4649, 706; the reduced
// programs). Each runs in its own process on the device (a fault would poison the context).
TEST_CASE("gpu fuzz: abs of the smallest i32 / i64 is negative, also inside a branch condition") {
  if (!have_gpu()) return;
  for (DType d : {i32, i64}) {
    INFO(ir::name(d));
    const Kernel k = kernel("abs_min_int", [&](Builder& b) {
      auto X = b.pointer("X", d), Out = b.pointer("Out", i32);
      auto s = b.scalar("s", d);
      auto i = arange(0, 64);
      Tile x = load(X + i);
      store(Out + i, cast(i32, abs(x) < cast(d, scalar_constant(i32, int64_t{0}))));
      store(Out + 64 + i, cast(i32, abs(x) >> cast(d, scalar_constant(i32, int64_t{16}))));
      Tile zero = scalar_constant(i32, int64_t{1}) % scalar_constant(i32, int64_t{1});
      if_(cast(d, zero) <= abs(Tile(s)), [&] { store(Out + 128 + i, full(i32, {64}, int64_t{7})); }, [&] {});
    });
    HostTensor x(d, {64}), out(i32, {192});
    x.fill_uniform(80, -1000, 1000);
    const int64_t min = d == i32 ? int64_t{-2147483647} - 1 : std::numeric_limits<int64_t>::min();
    x.set({0}, static_cast<double>(min));
    x.set({1}, static_cast<double>(min + 1));
    for (int64_t i = 0; i < out.numel(); ++i) out.set_flat(i, 3);
    check_against_interpreter(k.build(), {1}, {&x, &out, min}, 0.0, {}, true);
  }
}

TEST_CASE("gpu fuzz: a TMA store then a plain store of the same window: the plain values win") {
  if (!have_gpu()) return;
  const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
  const Kernel k = kernel("tma_then_plain", [&](Builder& b) {
    auto A = b.tensor("A", f16, 2, rm), B = b.tensor("B", f16, 2, rm), O = b.tensor("O", f16, 3, rm);
    Tile z = scalar_constant(i32, int64_t{0});
    Tile acc = dot(load(A.block({z, z}, {128, 64}), 0.0), load(B.block({z, z}, {64, 64}), 0.0));
    Tile r = scalar_constant(i32, int64_t{71});
    Tile c = scalar_constant(u32, int64_t{27});
    store(O.block({program_id(0), r, c}, {128, 64}, {1, 2}), cast(f16, acc), {.tma = true});
    store(O.block({program_id(0), r, c}, {128, 64}, {1, 2}), cast(f16, full(i32, {128, 64}, int64_t{1})));
  });
  HostTensor a(f16, {128, 192}), bt(f16, {192, 64}), o(f16, {1, 128, 64});
  for (int64_t i = 0; i < a.numel(); ++i) a.set_flat(i, static_cast<double>(i * 7 % 5) - 2);
  for (int64_t i = 0; i < bt.numel(); ++i) bt.set_flat(i, static_cast<double>(i * 3 % 7) - 3);
  o.poison();
  jit::CompileOptions opts;
  opts.num_warps = 8;
  for (int rep = 0; rep < 20; ++rep) check_against_interpreter(k.build(), {1}, {&a, &bt, &o}, 0.0, opts, true);
}

TEST_CASE("gpu fuzz: a TMA store whose column coordinate is near 2^31 writes nothing there (no fault)") {
  if (!have_gpu()) return;
  const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
  const Kernel k = kernel("tma_store_far", [&](Builder& b) {
    auto O = b.tensor("O", f32, 3, rm);
    auto s = b.scalar("s", i32);
    Tile col = (Tile(s) >> program_id(0)) << scalar_constant(i32, int64_t{2});
    store(O.block({program_id(0), scalar_constant(i32, int64_t{26}), col}, {32, 128}, {1, 2}), full(f32, {32, 128}, 1.0), {.tma = true});
  });
  HostTensor o(f32, {3, 32, 128});
  o.poison();
  jit::CompileOptions opts;
  opts.num_warps = 8;
  check_against_interpreter(k.build(), {3}, {&o, int64_t{2147483647}}, 0.0, opts, true);
}

// Issue 26 item 3: an f32 dot with input_precision tf32 and batched (3-D) dots. Kernel: programs
// along axis 0 each take `batch` batches (or, 2-D, one row block) of A, B and C and store D.
namespace {

Kernel batched_dot_kernel(DType in, int64_t batch, int64_t m, int64_t k, int64_t n, InputPrecision p) {
  return kernel("batched_dot_gpu", [=](Builder& kb) {
    const bool b3 = batch > 0;
    const int r = b3 ? 3 : 2;
    auto A = kb.tensor("A", in, r), B = kb.tensor("B", in, r), C = kb.tensor("C", f32, r), D = kb.tensor("D", f32, r);
    Tile pid = program_id(0);
    if (b3) {
      Tile b0 = pid * batch;
      Tile acc = dot(load(A.block({b0, 0, 0}, {batch, m, k})), load(B.block({b0, 0, 0}, {batch, k, n})), load(C.block({b0, 0, 0}, {batch, m, n})),
                     {.input_precision = p});
      store(D.block({b0, 0, 0}, {batch, m, n}), acc);
    } else {
      Tile m0 = pid * m;
      Tile acc = dot(load(A.block({m0, 0}, {m, k})), load(B.block({0, 0}, {k, n})), load(C.block({m0, 0}, {m, n})), {.input_precision = p});
      store(D.block({m0, 0}, {m, n}), acc);
    }
  });
}

}  // namespace

TEST_CASE("gpu: f32 dot with input_precision tf32 (mma.sync m16n8k8, and FMA on rounded inputs) matches the interpreter, both backends") {
  if (!have_gpu()) return;
  struct Case {
    int64_t m, k, n;
    int warps;
  };
  for (Case c : {Case{64, 64, 64, 4}, Case{128, 32, 64, 8}, Case{16, 64, 32, 4}, Case{8, 32, 16, 4}}) {
    INFO(fmt::format("[{},{}] @ [{},{}] on {} warps", c.m, c.k, c.k, c.n, c.warps));
    const int64_t programs = 3;
    HostTensor a(f32, {programs * c.m, c.k}), b(f32, {c.k, c.n}), acc(f32, {programs * c.m, c.n}), d(f32, {programs * c.m, c.n});
    jit::CompileOptions o;
    o.num_warps = c.warps;
    const ir::Function fn = batched_dot_kernel(f32, 0, c.m, c.k, c.n, InputPrecision::tf32).build();
    // exact data: bit for bit
    testing::fill_tf32_near_integers(a, 1, 8);
    testing::fill_tf32_near_integers(b, 2, 8);
    acc.fill_uniform(3, -4, 4);
    for (int64_t i = 0; i < acc.numel(); ++i) acc.set_flat(i, std::round(acc.get_flat(i)));
    check_against_interpreter(fn, {programs}, {&a, &b, &acc, &d}, 0.0, o, true);
    // normal data: the sums' order differs (the MMA rounds per k step of 8), the rounding of the inputs must not
    a.fill_normal(4, 0, 1);
    b.fill_normal(5, 0, 1);
    acc.fill_normal(6, 0, 1);
    check_against_interpreter(fn, {programs}, {&a, &b, &acc, &d}, 1e-5, o, true);
  }
}

TEST_CASE("gpu: batched dot on 3-D tiles (bf16 / f16 mma, f32 tf32 mma, f32 FMA) matches the interpreter, both backends") {
  if (!have_gpu()) return;
  struct Case {
    DType in;
    int64_t batch, m, k, n;
    InputPrecision p;
    int warps;
  };
  const Case cases[] = {
      {bf16, 4, 32, 64, 32, InputPrecision::ieee, 4},  {f16, 8, 16, 16, 16, InputPrecision::ieee, 4},
      {bf16, 2, 64, 32, 64, InputPrecision::ieee, 8},  {f32, 4, 16, 32, 16, InputPrecision::tf32, 4},
      {f32, 2, 32, 16, 32, InputPrecision::tf32, 8},   {f32, 2, 16, 16, 16, InputPrecision::ieee, 4},
      {bf16, 2, 16, 8, 16, InputPrecision::ieee, 4},
  };
  for (const Case& c : cases) {
    INFO(fmt::format("{} [{},{},{}] @ [{},{},{}] {} on {} warps", ir::name(c.in), c.batch, c.m, c.k, c.batch, c.k, c.n, ir::name(c.p), c.warps));
    const int64_t programs = 3, total = programs * c.batch;
    HostTensor a(c.in, {total, c.m, c.k}), b(c.in, {total, c.k, c.n}), acc(f32, {total, c.m, c.n}), d(f32, {total, c.m, c.n});
    a.fill_normal(7, 0, 1);
    b.fill_normal(8, 0, 1);
    acc.fill_normal(9, 0, 1);
    jit::CompileOptions o;
    o.num_warps = c.warps;
    check_against_interpreter(batched_dot_kernel(c.in, c.batch, c.m, c.k, c.n, c.p).build(), {programs}, {&a, &b, &acc, &d},
                              c.in == f32 && c.p == InputPrecision::ieee ? 1e-6 : 1e-5, o, true);
  }
}

TEST_CASE("gpu: tf32 rounding of edge values (ties both signs, subnormals, near overflow, inf, NaN) is the interpreter's, bit for bit") {
  if (!have_gpu()) return;
  // D = A @ I: every element is A's TF32 rounding, through the MMA (16 rows) and through FMA (8 rows)
  const uint32_t edge[] = {0x3f801000, 0xbf801000, 0x3f803000, 0x3f800fff, 0x3f801001, 0x00001000, 0x80001000,
                           0x007ff000, 0x00abcdef, 0x7f7fefff, 0x7f7fd000, 0x40490fdb, 0xc0490fdb, 0x3eaaaaab};
  for (int64_t m : {16, 8}) {
    INFO("rows " << m);
    HostTensor a(f32, {m, 16}), eye(f32, {16, 16}), zero(f32, {m, 16}), d(f32, {m, 16});
    std::mt19937_64 rng(static_cast<uint64_t>(m));
    for (int64_t i = 0; i < a.numel(); ++i) a.set_flat(i, static_cast<double>(std::bit_cast<float>(edge[rng() % std::size(edge)])));
    a.set({m - 3, 2}, INFINITY);
    a.set({m - 2, 6}, -INFINITY);
    a.set({m - 1, 9}, NAN);
    eye.fill(0);
    zero.fill(0);
    for (int64_t k = 0; k < 16; ++k) eye.set({k, k}, 1.0);
    check_against_interpreter(batched_dot_kernel(f32, 0, m, 16, 16, InputPrecision::tf32).build(), {1}, {&a, &eye, &zero, &d}, 0.0, {}, true);
  }
}
