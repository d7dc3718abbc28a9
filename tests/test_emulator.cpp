// The lowering checked without a GPU (runtime/emulator.hpp): kernels lowered to the per-thread
// program and run on the host agree with the interpreter -- scans and combine reductions over
// register, lane and warp bits (both directions, several warps), sorts over xor_permute, a scan
// of an mma.sync accumulator, plain reductions and a transpose through shared memory. Integer
// results bit for bit; floats within a tolerance where the order of additions differs.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <array>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_mask_testing.hpp"
#include "axis_op_kernels.hpp"
#include "dropout_key_args.hpp"
#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "jit/nvrtc.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/gemm.hpp"
#include "kernels/philox_host.hpp"
#include "ptxas_testing.hpp"
#include "runtime/emulator.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

// Copies of `tensors` run in the interpreter (with `ref_tail` after them) and in the emulator (with
// `emu_tail`: e.g. the dropout key from memory where the interpreter takes it as scalars).
struct Runs {
  std::vector<HostTensor> ref, emu;
};
Runs run_both(const ir::Function& fn, runtime::Grid grid, const std::vector<HostTensor>& tensors, const std::vector<runtime::Arg>& ref_tail,
              const std::vector<runtime::Arg>& emu_tail, const jit::CompileOptions& opts, runtime::EmulatorSchedule schedule = {}) {
  Runs r{tensors, tensors};
  std::vector<runtime::Arg> ra, ea;
  for (HostTensor& t : r.ref) ra.emplace_back(t);
  for (HostTensor& t : r.emu) ea.emplace_back(t);
  ra.insert(ra.end(), ref_tail.begin(), ref_tail.end());
  ea.insert(ea.end(), emu_tail.begin(), emu_tail.end());
  runtime::interpret(fn, grid, ra);
  runtime::emulate(fn, grid, ea, opts, schedule);
  return r;
}

// Elements of `b` (the emulator's) farther than tol * (1 + |a|) from `a` (the interpreter's), NaNs
// and infinities in the same places; the first few are reported.
size_t count_apart(const HostTensor& ref, const HostTensor& emu, double tol) {
  const std::vector<double> a = ref.to_f64(), b = emu.to_f64();
  size_t bad = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const bool ok = std::isnan(a[k]) ? std::isnan(b[k]) : a[k] == b[k] || std::fabs(a[k] - b[k]) <= tol * (1 + std::fabs(a[k]));
    if (!ok && bad++ < 4) MESSAGE(fmt::format("element {}: interpreter {} emulator {}", k, a[k], b[k]));
  }
  return bad;
}

// max |a - b| <= tol * (1 + max |a|): sums whose order differs (gradients over many keys).
bool close_in_max_norm(const HostTensor& ref, const HostTensor& emu, double tol) {
  const std::vector<double> a = ref.to_f64(), b = emu.to_f64();
  double worst = 0, norm = 0;
  for (size_t e = 0; e < a.size(); ++e) worst = std::max(worst, std::fabs(a[e] - b[e])), norm = std::max(norm, std::fabs(a[e]));
  return worst <= tol * (1 + norm);
}

// The interpreter and the emulator on copies of `tensors` (scalars none); every tensor must agree:
// tol 0 bit for bit, else count_apart's rule.
void check_emulator(const ir::Function& fn, runtime::Grid grid, const std::vector<HostTensor*>& tensors, double tol,
                    const jit::CompileOptions& opts = {}) {
  std::vector<HostTensor> copies;
  for (HostTensor* t : tensors) copies.push_back(*t);
  const Runs r = run_both(fn, grid, copies, {}, {}, opts);
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO(fmt::format("kernel {} tensor #{} ({})", fn.name, i, r.ref[i].describe()));
    if (tol == 0) CHECK(std::memcmp(r.ref[i].data(), r.emu[i].data(), r.ref[i].bytes()) == 0);
    else CHECK(count_apart(r.ref[i], r.emu[i], tol) == 0);
  }
}

// How many instructions of each kind a lowered program holds (regions included).
std::map<jit::pir::Op, int> count_ops(const jit::pir::Func& program) {
  std::map<jit::pir::Op, int> ops;
  std::function<void(const jit::pir::Block&)> walk = [&](const jit::pir::Block& blk) {
    for (const jit::pir::Inst& in : blk.insts) {
      ++ops[in.op];
      for (const jit::pir::Block& r : in.regions) walk(r);
    }
  };
  walk(program.body);
  return ops;
}

// A backward's inputs in BSHD: random Q, K, V, dO (seeds seed..seed + 3), the forward's O and LSE
// and the preprocess's Delta, both from the interpreter under `meta` (BLOCK_M = BM).
struct BackwardInputs {
  HostTensor q, k, v, dout, o, lse, delta;
};
BackwardInputs backward_inputs(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D, int64_t BM, const Meta& meta,
                               float scale, uint64_t seed) {
  BackwardInputs in{HostTensor(bf16, {B, Sq, Hq, D}), HostTensor(bf16, {B, Sk, Hkv, D}), HostTensor(bf16, {B, Sk, Hkv, D}),
                    HostTensor(bf16, {B, Sq, Hq, D}), HostTensor(bf16, {B, Sq, Hq, D}), HostTensor(f32, {B, Hq, Sq}),
                    HostTensor(f32, {B, Hq, Sq})};
  in.q.fill_normal(seed, 0, 1);
  in.k.fill_normal(seed + 1, 0, 1);
  in.v.fill_normal(seed + 2, 0, 1);
  in.dout.fill_normal(seed + 3, 0, 1);
  std::vector<runtime::Arg> fa{in.q, in.k, in.v, in.o, in.lse, scale};
  runtime::interpret(kernels::attention_forward().build(meta), {cdiv(Sq, BM), Hq, B}, fa);
  runtime::interpret(kernels::attention_backward_preprocess().build({{"DTYPE", bf16}, {"BLOCK_M", BM}, {"HEAD_DIM", D}, {"BSHD", true}}),
                     {cdiv(Sq, BM), Hq, B}, {in.o, in.dout, in.delta});
  return in;
}

}  // namespace

TEST_CASE("emulator: associative_scan, cumsum and a combine reduce equal the interpreter") {
  // blocked layouts whose axis has register, lane and warp bits in several orders: short rows,
  // columns, long rows (runs of 4 in registers, then lanes, warps, more registers), 1-D
  const axis_ops::Case cases[] = {{{4, 64}, 1, 4, i32},   {{4, 64}, 0, 4, i32},   {{1024}, 0, 8, i32},    {{64, 64}, 0, 4, i64},
                                  {{16, 128}, 1, 8, i8},  {{32, 32}, 1, 4, f32},  {{128, 16}, 0, 8, f32}, {{256}, 0, 4, bf16},
                                  {{1, 4096}, 1, 4, i32}, {{2, 2048}, 1, 2, i32}, {{8, 256}, 1, 1, i32},  {{512, 2}, 0, 4, i32}};
  for (const axis_ops::Case& c : cases)
    for (bool reverse : {false, true}) {
      INFO(ir::shape_string(c.shape) << " axis " << c.axis << " warps " << c.warps << " " << ir::name(c.dtype) << " reverse " << reverse);
      std::vector<HostTensor> t = axis_ops::combine_tensors(c);
      jit::CompileOptions o;
      o.num_warps = c.warps;
      check_emulator(axis_ops::combine_kernel(c, reverse).build(), {1}, {&t[0], &t[1], &t[2], &t[3]}, ir::is_float(c.dtype) ? 1e-5 : 0.0,
                     o);
    }
}

// A reduce whose combine commutes element by element (a sum, an integer max, an xor) lowers as a
// reduction does (jit/lower/scans.cpp `commutes`): every tile in one shared-memory round, with the
// interpreter's values (small whole numbers: the f32 sums are exact in any order).
TEST_CASE("emulator: reduces of commuting combines run as one reduction of all their tiles") {
  const axis_ops::Case cases[] = {{{4, 64}, 1, 4, f32},  {{64, 4}, 0, 4, f32},   {{1024}, 0, 8, f32}, {{16, 128}, 1, 8, f32},
                                  {{1, 4096}, 1, 4, f32}, {{512, 2}, 0, 4, f32}, {{32, 32}, 1, 1, f32}};
  for (const axis_ops::Case& c : cases) {
    INFO(ir::shape_string(c.shape) << " axis " << c.axis << " warps " << c.warps);
    const Kernel k = kernel("commuting_reduce", [c](Builder& kb) {
      const int rank = static_cast<int>(c.shape.size());
      auto X = kb.tensor("X", f32, rank), S = kb.tensor("S", f32, rank), M = kb.tensor("M", i32, rank), Z = kb.tensor("Z", i32, rank);
      const std::vector<Operand> zero(c.shape.size(), Operand(0));
      Tile x = load(X.block(zero, c.shape));
      Tile xi = cast(i32, x);
      std::vector<Tile> r = reduce({x, xi * 3, xi}, c.axis, [](const std::vector<Tile>& p, const std::vector<Tile>& q) {
        return std::vector<Tile>{p[0] + q[0], maximum(q[1], p[1]), p[2] ^ q[2]};
      });
      tilejit::ir::Shape kept = c.shape;
      kept[static_cast<size_t>(c.axis)] = 1;
      store(S.block(zero, kept), expand_dims(r[0], c.axis));
      store(M.block(zero, kept), expand_dims(r[1], c.axis));
      store(Z.block(zero, kept), expand_dims(r[2], c.axis));
    });
    tilejit::ir::Shape kept = c.shape;
    kept[static_cast<size_t>(c.axis)] = 1;
    HostTensor x(f32, c.shape), s(f32, kept), m(i32, kept), z(i32, kept);
    x.fill_uniform(9, -50, 50);
    for (int64_t e = 0; e < x.numel(); ++e) x.set_flat(e, std::round(x.get_flat(e)));
    jit::CompileOptions o;
    o.num_warps = c.warps;
    check_emulator(k.build(), {1}, {&x, &s, &m, &z}, 0.0, o);
    // one shared-memory round when the axis spans warps: two barriers, not two per warp bit
    const int64_t axis_len = c.shape[static_cast<size_t>(c.axis)];
    if (axis_len >= 1024 && c.warps >= 4) CHECK(count_ops(jit::lower(k.build(), o))[jit::pir::Op::barrier] == 2);
  }
}

TEST_CASE("emulator: sort, argsort, topk, flip and xor_permute equal the interpreter bit for bit") {
  const axis_ops::Case cases[] = {{{4, 64}, 1, 4, f32},   {{1024}, 0, 8, f32}, {{64, 16}, 0, 4, i32}, {{16, 128}, 1, 8, bf16},
                                  {{256}, 0, 4, u8},      {{1, 2048}, 1, 4, f32}};
  for (const axis_ops::Case& c : cases)
    for (bool descending : {false, true}) {
      INFO(ir::shape_string(c.shape) << " axis " << c.axis << " warps " << c.warps << " " << ir::name(c.dtype) << " descending " << descending);
      std::vector<HostTensor> t = axis_ops::sort_tensors(c);
      jit::CompileOptions o;
      o.num_warps = c.warps;
      check_emulator(axis_ops::sort_kernel(c, descending).build(), {1}, {&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]}, 0.0, o);
    }
}

TEST_CASE("emulator: histogram (ballots, shared atomics) equals the interpreter") {
  for (const axis_ops::HistogramCase& c : axis_ops::histogram_cases()) {
    INFO(ir::shape_string(c.shape) << " " << ir::name(c.dtype) << " bins " << c.bins << " warps " << c.warps);
    const Kernel k = axis_ops::histogram_kernel(c);
    jit::CompileOptions o;
    o.num_warps = c.warps;
    const Runs r = run_both(k.build(), {1}, axis_ops::histogram_tensors(c), {}, {}, o);
    int64_t counted = 0;
    for (int64_t b = 0; b < c.bins; ++b) counted += static_cast<int64_t>(r.ref[1].get_flat(b));
    CHECK(counted > 0);
    CHECK(std::memcmp(r.ref[1].data(), r.emu[1].data(), r.ref[1].bytes()) == 0);
    if (testing::no_ptxas()) continue;
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) testing::assemble_sm90a(k.build(), be, c.warps);
  }
  // HistogramMethod::shared_atomics below 1024 bins: atomics instead of ballots, the same counts
  for (const axis_ops::HistogramCase& c : {axis_ops::HistogramCase{{1024}, i32, 64, 4}, axis_ops::HistogramCase{{16, 16}, u8, 8, 8}}) {
    INFO("shared_atomics " << ir::shape_string(c.shape) << " bins " << c.bins);
    const Kernel k = axis_ops::histogram_kernel(c, HistogramMethod::shared_atomics);
    jit::CompileOptions o;
    o.num_warps = c.warps;
    const std::map<jit::pir::Op, int> ops = count_ops(jit::lower(k.build(), o));
    CHECK(ops.count(jit::pir::Op::atom_shared));
    CHECK(!ops.count(jit::pir::Op::ballot));
    CHECK(count_ops(jit::lower(axis_ops::histogram_kernel(c).build(), o)).count(jit::pir::Op::ballot));
    const Runs r = run_both(k.build(), {1}, axis_ops::histogram_tensors(c), {}, {}, o);
    CHECK(r.ref[1].get_flat(1) > 0);
    CHECK(std::memcmp(r.ref[1].data(), r.emu[1].data(), r.ref[1].bytes()) == 0);
    if (testing::no_ptxas()) continue;
    for (jit::Backend be : {jit::Backend::Llvm, jit::Backend::Nvrtc}) testing::assemble_sm90a(k.build(), be, c.warps);
  }
}

TEST_CASE("emulator: a dot on mma.sync, scans of its accumulator, reductions and a transpose") {
  // sm_80: the dot takes mma.sync m16n8k16 (on sm_90a it would take wgmma, not emulated); small
  // integers make every product and sum exact in any order
  const Kernel k = kernel("mma_emu", [](Builder& kb) {
    auto Aa = kb.tensor("A", bf16, 2), Bb = kb.tensor("B", bf16, 2), S = kb.tensor("S", f32, 2), T = kb.tensor("T", f32, 2);
    auto R = kb.tensor("R", f32, 2), Q = kb.tensor("Q", f32, 2);
    Tile acc = dot(load(Aa.block({0, 0}, {64, 32})), load(Bb.block({0, 0}, {32, 64})), zeros(f32, {64, 64}));
    store(S.block({0, 0}, {64, 64}), cumsum(acc, 1));
    store(T.block({0, 0}, {64, 64}), cumsum(acc, 0, true));
    store(R.block({0, 0}, {64, 1}), expand_dims(max(acc, 1), 1) + expand_dims(sum(acc, 1), 1));
    store(Q.block({0, 0}, {64, 64}), trans(acc));
  });
  HostTensor a(bf16, {64, 32}), b(bf16, {32, 64}), s(f32, {64, 64}), t(f32, {64, 64}), r(f32, {64, 1}), q(f32, {64, 64});
  a.fill_uniform(8, -2, 2);
  b.fill_uniform(9, -2, 2);
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t j = 0; j < 32; ++j) {
      a.set({i, j}, std::round(a.get({i, j})));
      b.set({j, i}, std::round(b.get({j, i})));
    }
  for (int warps : {4, 8}) {
    INFO("warps " << warps);
    jit::CompileOptions o;
    o.arch = "sm_80";
    o.num_warps = warps;
    check_emulator(k.build(), {1}, {&a, &b, &s, &t, &r, &q}, 0.0, o);
  }
}

TEST_CASE("emulator: row softmax over several programs, masked loads and stores past the end") {
  const Kernel k = kernel("softmax_emu", [](Builder& kb) {
    auto X = kb.tensor("X", f32, 2), Y = kb.tensor("Y", f32, 2);
    auto r = program_id(0);
    Tile x = load(X.block({r, 0}, {1, 128}), -INFINITY);
    Tile e = exp(x - expand_dims(max(x, 1), 1));
    store(Y.block({r, 0}, {1, 128}), e / expand_dims(sum(e, 1), 1));
  });
  HostTensor x(f32, {5, 100}), y(f32, {5, 100});
  x.fill_normal(4, 0, 2);
  for (int warps : {1, 4}) {
    jit::CompileOptions o;
    o.num_warps = warps;
    check_emulator(k.build(), {5}, {&x, &y}, 1e-6, o);
  }
}

TEST_CASE("emulator: faults name the access") {
  // a pointer load past the end of its buffer (the interpreter refuses it too)
  const Kernel oob = kernel("oob_emu", [](Builder& kb) {
    auto P = kb.pointer("P", f32), Q = kb.pointer("Q", f32);
    store(Q + arange(0, 64), load(P + arange(0, 64)));
  });
  HostTensor p(f32, {32}), q(f32, {64});
  std::vector<runtime::Arg> args{p, q};
  try {
    runtime::emulate(oob.build(), {1}, args);
    FAIL("no fault");
  } catch (const runtime::EmulatorFault& e) {
    CHECK(std::string(e.what()).find("outside every argument's memory") != std::string::npos);
    CHECK(std::string(e.what()).find("oob_emu") != std::string::npos);
  }
}

// sm_90a: a GEMM K loop on the TMA ring (128-byte swizzled tiles, mbarriers) and wgmma from shared
// descriptors, 8 warps = two warpgroups; B K-major (trans) and MN-major; small integers so that
// every sum is exact in any order.
TEST_CASE("emulator: the TMA + wgmma GEMM pipeline equals the interpreter") {
  for (bool b_kmajor : {true, false}) {
    const std::string b_major = b_kmajor ? "B K-major" : "B MN-major";
    INFO(b_major);
    const Kernel gemm = kernel("gemm_emu", [b_kmajor](Builder& kb) {
      const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
      auto A = kb.tensor("A", bf16, 2, rm), B = kb.tensor("B", bf16, 2, rm), C = kb.tensor("C", f32, 2, rm);
      Tile m0 = program_id(0) * 128, n0 = program_id(1) * 128;
      Var acc = zeros(f32, {128, 128});
      for_range(0, A.size(1), 64, [&](Tile k0) {
        Tile b = b_kmajor ? trans(load(B.block({n0, k0}, {128, 64}))) : load(B.block({k0, n0}, {64, 128}));
        acc = dot(load(A.block({m0, k0}, {128, 64})), b, acc);
      });
      store(C.block({m0, n0}, {128, 128}), acc);
    });
    const int64_t M = 256, N = 256, K = 320;
    HostTensor a(bf16, {M, K}), b(bf16, b_kmajor ? ir::Shape{N, K} : ir::Shape{K, N}), c(f32, {M, N});
    a.fill_uniform(21, -3, 3);
    b.fill_uniform(22, -3, 3);
    for (HostTensor* t : {&a, &b})
      for (int64_t e = 0; e < t->numel(); ++e) t->set_flat(e, std::round(t->get_flat(e)));
    jit::CompileOptions o;
    o.num_warps = 8;
    const ir::Function fn = gemm.build();
    const jit::pir::Func program = jit::lower(fn, o);
    // (the Hopper path, not the generic one: tensor maps, TMA loads and wgmma in the program)
    std::map<jit::pir::Op, int> ops = count_ops(program);
    CHECK(!program.tensor_maps.empty());
    CHECK(ops[jit::pir::Op::tma_load] + ops[jit::pir::Op::tma_load_2d] > 0);
    CHECK(ops[jit::pir::Op::wgmma] > 0);
    check_emulator(fn, {M / 128, N / 128}, {&a, &b, &c}, 0.0, o);
  }
}

// An accumulator plus a tile loaded once (a GEMM's residual; gradient accumulation) takes the
// accumulator's layout, the tile read straight into it, whichever side of the + it stands on: no
// exchange through shared memory, so the epilogue adds nothing to the kernel's footprint (it had cost
// the D 128 backward half its programs per SM: decision 068). Both MMA paths, against the interpreter.
TEST_CASE("emulator: acc + load(residual) reads the residual in the accumulator's layout (no shared memory)") {
  for (const char* arch : {"sm_90a", "sm_80"}) {
    int64_t plain_smem = 0;  // form 0's
    for (int form : {0, 1, 2}) {  // 0: acc alone; 1: acc + load; 2: load + acc
      INFO(arch << " form " << form);
      const Kernel gemm = kernel("gemm_residual", [form](Builder& kb) {
        const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
        auto A = kb.tensor("A", bf16, 2, rm), B = kb.tensor("B", bf16, 2, rm), R = kb.tensor("R", f32, 2, rm);
        auto C = kb.tensor("C", f32, 2, rm);
        Tile m0 = program_id(0) * 128, n0 = program_id(1) * 128;
        Var acc = zeros(f32, {128, 128});
        for_range(0, A.size(1), 64, [&](Tile k0) {
          acc = dot(load(A.block({m0, k0}, {128, 64})), load(B.block({k0, n0}, {64, 128})), acc);
        });
        const BlockRef r = R.block({m0, n0}, {128, 128});
        store(C.block({m0, n0}, {128, 128}), form == 0 ? Tile(acc) : form == 1 ? acc + load(r) : load(r) + acc);
      });
      const int64_t M = 256, N = 256, K = 192;
      HostTensor a(bf16, {M, K}), b(bf16, {K, N}), r(f32, {M, N}), c(f32, {M, N});
      a.fill_uniform(31, -3, 3);
      b.fill_uniform(32, -3, 3);
      r.fill_uniform(33, -100, 100);
      for (HostTensor* t : {&a, &b, &r})
        for (int64_t e = 0; e < t->numel(); ++e) t->set_flat(e, std::round(t->get_flat(e)));
      jit::CompileOptions o;
      o.arch = arch;
      o.num_warps = 8;
      const ir::Function fn = gemm.build();
      const int64_t smem = jit::lower(fn, o).smem_bytes;
      if (form == 0) plain_smem = smem;
      CHECK(smem == plain_smem);
      check_emulator(fn, {M / 128, N / 128}, {&a, &b, &r, &c}, 0.0, o);
    }
  }
}

// The library's attention kernels lowered for sm_80 (mma.sync) and sm_90a (TMA tiles, wgmma), forward
// and backward, with and without causal masking and dropout (its key from device memory, decision
// 054; placed in a larger attention's mask, decision 065), against the interpreter: GQA, S_q !=
// S_k, ragged tiles.
TEST_CASE("emulator: the attention forward and backward kernels equal the interpreter (mma.sync and wgmma paths)") {
  const int64_t B = 1, Hq = 2, Hkv = 1, Sq = 100, Sk = 130, D = 64, BM = 64, BN = 64;
  for (const char* arch : {"sm_80", "sm_90a"})
  for (bool causal : {false, true})
    // none, fused, the packed mask read (DROPOUT_BITS; backward only), fused with dK/dV also storing
    // the words it draws (DROPOUT_WRITE_BITS), and storing them key-major (strides [W * S_q, 1, S_q]:
    // DROPOUT_WORDS_KEY_MAJOR, as the API does: decision 097), and fused with dK/dV computing its
    // Philox words while S^T's MMA runs (DROPOUT_AHEAD: decision 098)
    for (int dropout_mode : {0, 1, 2, 3, 4, 5}) {
      const bool dropout = dropout_mode > 0, bits = dropout_mode == 2, write_bits = dropout_mode == 3 || dropout_mode == 4,
                 key_major = dropout_mode == 4, ahead = dropout_mode == 5;
      if (bits && std::string(arch) != "sm_90a") continue;
      INFO(arch << " causal " << causal << " dropout " << dropout << " bits " << bits << " write_bits " << write_bits << " key-major "
                << key_major << " dK/dV ahead " << ahead);
      HostTensor q(bf16, {B, Sq, Hq, D}), k(bf16, {B, Sk, Hkv, D}), v(bf16, {B, Sk, Hkv, D}), dout(bf16, {B, Sq, Hq, D});
      HostTensor o(bf16, {B, Sq, Hq, D}), lse(f32, {B, Hq, Sq}), delta(f32, {B, Hq, Sq});
      HostTensor dq(bf16, {B, Sq, Hq, D}), dk(bf16, {B, Sk, Hkv, D}), dv(bf16, {B, Sk, Hkv, D});
      q.fill_normal(41, 0, 1);
      k.fill_normal(42, 0, 1);
      v.fill_normal(43, 0, 1);
      dout.fill_normal(44, 0, 1);
      const float scale = 0.125f;
      const kernels::DropoutRngHost rng{0x0123456789abcdefull, 0x0000000200000001ull, kernels::dropout_keep_threshold(0.2)};
      HostTensor state = testing::rng_state_tensor(rng.seed, rng.offset);
      const kernels::DropoutRngHost wrong{1, 2, rng.keep_threshold};  // (the scalars the state overrides)
      Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", causal}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN},
                {"DROPOUT", dropout}};
      Meta fwd_meta = meta;  // on sm_90a O leaves by TMA stores (TMA_STORE) when dropout is off
      const bool tma_store = std::string(arch) == "sm_90a" && !dropout;
      fwd_meta.emplace_back("TMA_STORE", tma_store);
      jit::CompileOptions o80;
      o80.arch = arch;
      o80.num_warps = 4;
      const int64_t q_blocks = cdiv(Sq, BM), k_blocks = cdiv(Sk, BN);
      // the key as scalars for the interpreter, from memory (wrong scalars beside it) for the emulator
      std::vector<runtime::Arg> ref_tail{scale}, emu_tail{scale};
      if (dropout) {
        // placed in a larger attention (rows 96.., keys 128.., heads 1.. of 5: context parallelism)
        const std::array<int32_t, 4> placed{96, 128, 1, 5};
        for (const runtime::Arg& a : testing::attention_dropout_args(rng, nullptr, placed)) ref_tail.push_back(a);
        for (const runtime::Arg& a : testing::attention_dropout_args(wrong, &state, placed)) emu_tail.push_back(a);
      }
      // the packed mask (random words: about half the elements kept), read by dK/dV through shared
      // memory into the transposed block's layout and by dQ at its use
      HostTensor mask_bits(ir::DType::u32, {B * Hq, Sq, cdiv(Sk, 32)});
      // forward: o, lse
      {
        const ir::Function fn = kernels::attention_forward().build(fwd_meta);
        std::map<jit::pir::Op, int> ops = count_ops(jit::lower(fn, o80));
        CHECK((ops[jit::pir::Op::wgmma] + ops[jit::pir::Op::wgmma_rs] > 0) == (std::string(arch) == "sm_90a"));
        CHECK((ops[jit::pir::Op::tma_store] > 0) == tma_store);
        const Runs r = run_both(fn, {q_blocks, Hq, B}, {q, k, v, o, lse}, ref_tail, emu_tail, o80);
        for (size_t i : {size_t{3}, size_t{4}}) {
          INFO("forward output " << i);
          CHECK(count_apart(r.ref[i], r.emu[i], 1e-2) == 0);
        }
        o = r.ref[3], lse = r.ref[4];
      }
      if (bits) {
        mask_bits.fill_uniform(45, 0, 4294967295.0);
        meta.emplace_back("DROPOUT_BITS", true);
        ref_tail.push_back(mask_bits);
        emu_tail.push_back(mask_bits);
      }
      // backward: Delta, then dK / dV and dQ from the interpreter's forward outputs
      runtime::interpret(kernels::attention_backward_preprocess().build({{"DTYPE", bf16}, {"BLOCK_M", BM}, {"HEAD_DIM", D}, {"BSHD", true}}),
                         {q_blocks, Hq, B}, {o, dout, delta});
      for (int pass = 0; pass < 2; ++pass) {
        INFO((pass == 0 ? "dK/dV" : "dQ"));
        const std::vector<HostTensor> tensors = pass == 0 ? std::vector<HostTensor>{q, k, v, dout, lse, delta, dk, dv}
                                                          : std::vector<HostTensor>{q, k, v, dout, lse, delta, dq};
        Meta pass_meta = meta;
        std::vector<runtime::Arg> pass_ref_tail = ref_tail, pass_emu_tail = emu_tail;
        // the stored words: [heads 5 of the placed attention, S_q, words] (its batch*heads index), one
        // tensor for each side, poisoned: blocks past the causal diagonal stay unwritten on both
        const int64_t W = cdiv(Sk, 32);
        const auto words = [&] {
          return key_major ? HostTensor(ir::DType::u32, {5, Sq, W}, {W * Sq, 1, Sq}) : HostTensor(ir::DType::u32, {5, Sq, W});
        };
        HostTensor written_ref = words(), written_emu = words();
        if (pass == 0 && ahead) pass_meta.emplace_back("DROPOUT_AHEAD", true);
        if (pass == 0 && write_bits) {
          written_ref.poison();
          written_emu.poison();
          pass_meta.emplace_back("DROPOUT_WRITE_BITS", true);
          if (key_major) pass_meta.emplace_back("DROPOUT_WORDS_KEY_MAJOR", true);
          pass_ref_tail.push_back(written_ref);
          pass_emu_tail.push_back(written_emu);
        }
        const ir::Function fn = (pass == 0 ? kernels::attention_backward_dkdv() : kernels::attention_backward_dq()).build(pass_meta);
        const runtime::Grid grid = pass == 0 ? runtime::Grid{k_blocks, Hkv, B} : runtime::Grid{q_blocks, Hq, B};
        const Runs r = run_both(fn, grid, tensors, pass_ref_tail, pass_emu_tail, o80);
        for (size_t i = 6; i < tensors.size(); ++i) {
          INFO("output " << i);
          CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
        }
        if (pass == 0 && write_bits) {
          CHECK(count_apart(written_ref, written_emu, 0.0) == 0);
          int64_t stored = 0;  // (words the kernel wrote: not all poison)
          for (int64_t e = 0; e < written_ref.numel(); ++e) stored += written_ref.get_flat(e) != 4294967295.0 ? 1 : 0;
          CHECK(stored > 0);
        }
      }
    }
}

// The D 128 forward's default schedule on sm_90a: FlashAttention-3's loop under a ring producer (a
// warpgroup issuing TMA, setmaxnreg, the consumers' P V pipelined) -- warp roles that wait for each
// other, so the emulator runs each warp on its own, handing over at waits. Full and causal,
// S_q != S_k, ragged tiles; PERSISTENT (a 1-D grid of 3 programs walking 8 tiles: rings counted
// across tiles) and TMA_STORE (O staged in the last V block's tile, which the producer refills
// only after TMA has read it), also with random hand-overs between warps.
TEST_CASE("emulator: the D 128 ring-producer forward (warp roles, persistent, TMA stores, late offsets) equals the interpreter") {
  const int64_t B = 1, Hq = 2, Hkv = 2, Sq = 500, Sk = 300, D = 128, BM = 128, BN = 128;
  // variants 4, 5: TMA stores whose staging offsets are hoisted (STORE_OFFSETS_LATE=false); 6, 7:
  // K_0 copied before the last V block (K0_BEFORE_V_LAST: the producer's order changes); 9, 11:
  // OVERLAP_TILES (persistent: a tile's S_0 beside the previous tile's last P V), with and
  // without TMA stores
  for (int variant = 0; variant < 12; ++variant)
    for (bool causal : {false, true}) {
      const bool overlap = variant >= 8, persistent = variant & 1;
      if (overlap && !persistent) continue;
      const bool tma_store = overlap ? variant == 9 : variant >= 2, late = variant < 4 || variant >= 6, k0_first = variant >= 6;
      INFO("causal " << causal << " persistent " << persistent << " TMA_STORE " << tma_store << " STORE_OFFSETS_LATE " << late
                     << " K0_BEFORE_V_LAST " << k0_first << " OVERLAP_TILES " << overlap);
      HostTensor q(bf16, {B, Sq, Hq, D}), k(bf16, {B, Sk, Hkv, D}), v(bf16, {B, Sk, Hkv, D});
      HostTensor o(bf16, {B, Sq, Hq, D}), lse(f32, {B, Hq, Sq});
      q.fill_normal(51, 0, 1);
      k.fill_normal(52, 0, 1);
      v.fill_normal(53, 0, 1);
      const auto meta_of = [&](bool offsets_late) {
        return Meta{{"DTYPE", bf16}, {"HEAD_DIM", D},   {"CAUSAL", causal},        {"BSHD", true},
                    {"BLOCK_M", BM}, {"BLOCK_N", BN}, {"PERSISTENT", persistent}, {"TMA_STORE", tma_store},
                    {"STORE_OFFSETS_LATE", offsets_late}, {"K0_BEFORE_V_LAST", k0_first}, {"OVERLAP_TILES", overlap}};
      };
      const ir::Function fn = kernels::attention_forward().build(meta_of(late));
      jit::CompileOptions o8;
      o8.num_warps = 8;
      o8.pipeline.stages = 2;
      std::map<jit::pir::Op, int> ops = count_ops(jit::lower(fn, o8));
      CHECK(ops[jit::pir::Op::set_max_registers] > 0);  // (the producer's role)
      CHECK(ops[jit::pir::Op::wgmma] + ops[jit::pir::Op::wgmma_rs] > 0);
      CHECK((ops[jit::pir::Op::tma_store] > 0) == tma_store);
      // the store's warps arrive and warp 0 waits and issues (FlashAttention-3's epilogue); late
      // offsets come from two opaque copies of the thread's coordinates
      CHECK((ops[jit::pir::Op::named_barrier_arrive] > 0) == tma_store);
      if (tma_store && late)
        CHECK(ops[jit::pir::Op::opaque] == count_ops(jit::lower(kernels::attention_forward().build(meta_of(false)), o8))[jit::pir::Op::opaque] + 2);
      // (OVERLAP_TILES with seed 7: 10 programs for 8 tiles, two of which have none)
      for (uint64_t seed : {uint64_t{0}, uint64_t{7}}) {
        if (seed && !tma_store) continue;
        INFO("schedule seed " << seed);
        const runtime::Grid grid = persistent ? runtime::Grid{overlap && seed ? 10 : 3, 1, 1} : runtime::Grid{cdiv(Sq, BM), Hq, B};
        const Runs r = run_both(fn, grid, {q, k, v, o, lse}, {0.088f}, {0.088f}, o8, runtime::EmulatorSchedule{seed != 0, seed});
        for (size_t i : {size_t{3}, size_t{4}}) {
          INFO("output " << i);
          CHECK(count_apart(r.ref[i], r.emu[i], 1e-2) == 0);
        }
      }
    }
}

// Library masks on the forward's FA3 loop: the ring producer replays the mask's walk (its key-tile
// intervals, one run or two, or the pre-pass's lists) and the consumers pipeline P V (PV_PEEL, O by
// TMA stores), also on a persistent grid. A sliding window with S_q > S_k leaves query tile 0
// without a key (an empty interval), a block-sparse table query tile 1 (empty lists, whose entry 0
// is unwritten): the peeled block 0 is then key block 0, masked element by element (O 0, LSE
// -inf). Against the interpreter and the plain masked kernel, warp by warp and with random
// hand-overs. (Block-sparse fits beside the rings since its table is gathered in S's layout: 107.)
TEST_CASE("emulator: the masked forward on the ring producer equals the interpreter and the plain kernel") {
  const int64_t B = 1, Hq = 2, Hkv = 1, D = 128, BM = 128, BN = 128;
  std::mt19937 rng(29);
  const std::vector<int32_t> docs = testing::mask_documents(1, 384, 150, rng);
  // block-sparse tiles of 128: query tile 1 sees no key tile (an empty list), tile 2 two of three
  const std::vector<uint8_t> table{1, 0, 0, 0, 0, 0, 1, 0, 1};
  struct Case {
    kernels::MaskSpec spec;
    int64_t s_q, s_k;
    int64_t empty_tile;  // a query tile that sees no key (-1: none)
  };
  for (const Case& c : {Case{kernels::MaskSpec::sliding_window(90, 40), 512, 256, 0}, Case{kernels::MaskSpec::global_sliding_window(16, 60, 30), 384, 384, -1},
                        Case{kernels::MaskSpec::causal_document(), 384, 384, -1}, Case{kernels::MaskSpec::block_sparse(128, 128), 384, 384, 1}}) {
    const kernels::MaskSpec& spec = c.spec;
    INFO("mask " << std::string(kernels::mask_kind_name(spec.kind)));
    kernels::MaskData data;
    if (kernels::mask_uses_doc_ids(spec.kind)) data.doc_ids = {docs, {1, c.s_k}};
    if (spec.kind == kernels::MaskKind::block_sparse) data.block_table = {table, {1, 1, 3, 3}};
    kernels::check_mask(spec, data, {B, Hq, c.s_q, c.s_k});
    const testing::MaskArgs mask(spec, data);
    std::vector<runtime::Arg> tail{0.088f};
    tail.insert(tail.end(), mask.args.begin(), mask.args.end());
    std::optional<testing::BlockMaskRun> lists;
    if (!kernels::mask_has_tile_intervals(spec.kind)) lists.emplace(spec, data, mask, B, c.s_q, c.s_k, BM, BN, false), lists->append_to(tail);
    HostTensor q(bf16, {B, c.s_q, Hq, D}), k(bf16, {B, c.s_k, Hkv, D}), v(bf16, {B, c.s_k, Hkv, D}), o(bf16, {B, c.s_q, Hq, D}),
        lse(f32, {B, Hq, c.s_q});
    q.fill_normal(61, 0, 1);
    k.fill_normal(62, 0, 1);
    v.fill_normal(63, 0, 1);
    const auto build = [&](bool producer, bool persistent, bool coordinates_at_use = false) {
      lang::Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN},
                      {"MASK", static_cast<int>(spec.kind)}, {"RING_PRODUCER", producer}, {"PERSISTENT", persistent}};
      if (coordinates_at_use) meta.emplace_back("COORDINATES_AT_USE", true);
      return kernels::attention_forward().build(meta);
    };
    jit::CompileOptions o8;
    o8.num_warps = 8;
    o8.pipeline.stages = 2;
    const runtime::Grid grid{cdiv(c.s_q, BM), Hq, B};
    HostTensor plain_o = o, plain_lse = lse;
    std::vector<runtime::Arg> plain_args{q, k, v, plain_o, plain_lse};
    plain_args.insert(plain_args.end(), tail.begin(), tail.end());
    runtime::interpret(build(false, false), grid, plain_args);
    // (PERSISTENT: 3 programs walk the 6 or 8 tiles, the rings counting on across them; variant 2:
    // COORDINATES_AT_USE, the consumers' layout coordinates in the loops from opaque lane and warp
    // copies, decision 114)
    for (const int variant : {0, 1, 2}) {
      const bool persistent = variant == 1, at_use = variant == 2;
      INFO("persistent " << persistent << " coordinates at use " << at_use);
      const ir::Function fn = build(true, persistent, at_use);
      std::map<jit::pir::Op, int> ops = count_ops(jit::lower(fn, o8));
      CHECK(ops[jit::pir::Op::set_max_registers] > 0);  // (the producer's role)
      CHECK(ops[jit::pir::Op::tma_store] > 0);
      if (at_use) CHECK(ops[jit::pir::Op::opaque] > count_ops(jit::lower(build(true, false), o8))[jit::pir::Op::opaque]);
      for (const runtime::EmulatorSchedule& sched : {runtime::EmulatorSchedule{}, runtime::EmulatorSchedule{true, 5}}) {
        INFO("schedule seed " << sched.seed);
        const Runs r = run_both(fn, persistent ? runtime::Grid{3, 1, 1} : grid, {q, k, v, o, lse}, tail, tail, o8, sched);
        CHECK(count_apart(r.ref[3], r.emu[3], 1e-2) == 0);
        CHECK(count_apart(r.ref[4], r.emu[4], 1e-2) == 0);
        CHECK(count_apart(r.emu[3], plain_o, 1e-2) == 0);
        CHECK(count_apart(r.emu[4], plain_lse, 1e-2) == 0);
        double seen = 0;
        for (int64_t row = 0; row < c.s_q; ++row) seen = std::max(seen, std::fabs(r.emu[3].get({0, row, 0, 0})));
        CHECK(seen > 0.01);  // (real outputs)
        if (c.empty_tile >= 0) {  // (the window's diagonal at S_k - S_q: rows 0..215 see no key; the table's row 1)
          for (int64_t row = c.empty_tile * BM; row < (c.empty_tile + 1) * BM; ++row) {
            CHECK(std::isinf(r.emu[4].get({0, 1, row})));
            CHECK(r.emu[3].get({0, row, 1, 5}) == 0.0);
          }
        }
      }
    }
  }
}

// LAZY_RESCALE (lang::scale_lazily): O's rescale behind a warp vote. The emulated kernel equals the
// interpreter and, bit for bit, the kernel that always multiplies; the lowered program votes.
TEST_CASE("emulator: the forward with LAZY_RESCALE equals the interpreter and the always-rescaling kernel") {
  const int64_t B = 1, H = 2, Sq = 300, Sk = 400, D = 128;
  for (bool pipelined : {true, false})
    for (bool causal : {false, true})
      for (bool settled : {false, true}) {
        // settled: keys past the first block are zero (scores 0, below the first block's maximum), so
        // no row's max moves after block 0 and every warp takes the skipping side
        INFO("PIPELINE_PV " << pipelined << " causal " << causal << " settled " << settled);
        HostTensor q(bf16, {B, Sq, H, D}), k(bf16, {B, Sk, H, D}), v(bf16, {B, Sk, H, D});
        HostTensor o(bf16, {B, Sq, H, D}), lse(f32, {B, H, Sq});
        q.fill_normal(61, 0, 1);
        k.fill_normal(62, 0, 1);
        v.fill_normal(63, 0, 1);
        if (settled)
          for (int64_t j = 128; j < Sk; ++j)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) k.set({0, j, h, d}, 0.0);
        jit::CompileOptions o8;
        o8.num_warps = 8;
        o8.pipeline.stages = 2;
        std::vector<std::vector<HostTensor>> emulated;
        for (bool lazy : {false, true}) {
          const ir::Function fn = kernels::attention_forward().build(Meta{{"DTYPE", bf16},     {"HEAD_DIM", D},          {"CAUSAL", causal},
                                                                          {"BSHD", true},      {"BLOCK_M", int64_t{128}}, {"BLOCK_N", int64_t{128}},
                                                                          {"RING_PRODUCER", pipelined}, {"PIPELINE_PV", pipelined},
                                                                          {"LAZY_RESCALE", lazy}});
          CHECK((count_ops(jit::lower(fn, o8))[jit::pir::Op::ballot] > 0) == lazy);
          const Runs r = run_both(fn, {cdiv(Sq, 128), H, B}, {q, k, v, o, lse}, {0.088f}, {0.088f}, o8);
          for (size_t i : {size_t{3}, size_t{4}}) {
            INFO("output " << i << " LAZY_RESCALE " << lazy);
            CHECK(count_apart(r.ref[i], r.emu[i], 1e-2) == 0);
          }
          emulated.push_back(r.emu);
        }
        for (size_t i : {size_t{3}, size_t{4}}) CHECK(emulated[0][i].to_f64() == emulated[1][i].to_f64());
      }
}

// The library GEMM as it runs on the H100 (sm_90a, 8 warps, 4 stages, BLOCK_N 256): the TMA +
// wgmma pipeline, and RING_PRODUCER / PERSISTENT (a producer warpgroup, a 1-D grid walking the
// tiles in GROUP_M order), B K-major and MN-major, ragged M and N; small integers, so bit for bit.
// TMA_STORE (C bf16 by TMA stores from a staging tile of its own) on the pipeline (3 stages) and
// on the persistent ring producer.
TEST_CASE("emulator: the library GEMM (pipeline, ring producer, persistent, TMA stores) equals the interpreter") {
  const int64_t M = 200, N = 296, K = 192;
  // (A^T given -- A_KMAJOR=false, a weight gradient's dY^T -- runs the pipeline with MN-major A)
  for (bool a_kmajor : {true, false})
  for (bool b_kmajor : {true, false})
    for (int variant = 0; variant < 5; ++variant) {  // plain, ring producer, + persistent; TMA_STORE: plain, persistent
      if (!a_kmajor && b_kmajor && variant > 0) continue;  // (one A^T B^T case is enough)
      INFO("A K-major " << a_kmajor << " B K-major " << b_kmajor << " variant " << variant);
      const bool tma_store = variant >= 3;
      HostTensor a(bf16, a_kmajor ? ir::Shape{M, K} : ir::Shape{K, M}), b(bf16, b_kmajor ? ir::Shape{N, K} : ir::Shape{K, N}),
          c(tma_store ? bf16 : f32, {M, N});
      a.fill_uniform(61, -3, 3);
      b.fill_uniform(62, -3, 3);
      for (HostTensor* t : {&a, &b})
        for (int64_t e = 0; e < t->numel(); ++e) t->set_flat(e, std::round(t->get_flat(e)));
      Meta meta{{"BLOCK_N", 256}, {"A_KMAJOR", a_kmajor}, {"B_KMAJOR", b_kmajor}, {"GROUP_M", 8}};
      const bool persistent = variant == 2 || variant == 4;
      if (variant == 1 || persistent) meta.emplace_back("RING_PRODUCER", true);
      if (persistent) meta.emplace_back("PERSISTENT", true);
      if (tma_store) meta.emplace_back("OUT_DTYPE", bf16), meta.emplace_back("TMA_STORE", true);
      jit::CompileOptions o;
      o.num_warps = 8;
      o.pipeline.stages = variant == 3 ? 3 : 4;
      const ir::Function fn = kernels::gemm().build(meta);
      const jit::pir::Func program = jit::lower(fn, o);
      CHECK((count_ops(program)[jit::pir::Op::tma_store] > 0) == tma_store);
      CHECK(program.tensor_maps.size() >= 2);  // A and B by TMA, whichever major, with or without the producer
      const int64_t tiles = cdiv(M, 128) * cdiv(N, 256);
      check_emulator(fn, persistent ? runtime::Grid{3} : runtime::Grid{tiles}, {&a, &b, &c}, 0.0, o);
    }
}

// A^T (MN-major A) at the smaller schedules the GPU test runs too: 64 x 64 on 4 warps, 128 x 128 on 4
TEST_CASE("emulator: the GEMM pipeline with A^T at 64 x 64 and 128 x 128 tiles on one warpgroup equals the interpreter") {
  const int64_t M = 200, N = 136, K = 192;
  for (auto [bm, bn, stages] : {std::array<int64_t, 3>{64, 64, 2}, std::array<int64_t, 3>{128, 128, 3}}) {
    INFO(bm << "x" << bn);
    HostTensor a(bf16, {K, M}), b(bf16, {K, N}), c(f32, {M, N});
    a.fill_uniform(71, -3, 3);
    b.fill_uniform(72, -3, 3);
    for (HostTensor* t : {&a, &b})
      for (int64_t e = 0; e < t->numel(); ++e) t->set_flat(e, std::round(t->get_flat(e)));
    const Meta meta{{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"A_KMAJOR", false}, {"B_KMAJOR", false}, {"GROUP_M", 8}};
    jit::CompileOptions o;
    o.num_warps = 4;
    o.pipeline.stages = static_cast<int>(stages);
    const ir::Function fn = kernels::gemm().build(meta);
    CHECK(jit::lower(fn, o).tensor_maps.size() == 2);
    check_emulator(fn, {cdiv(M, bm) * cdiv(N, bn)}, {&a, &b, &c}, 0.0, o);
  }
}

// The backward at D 128 on sm_90a (dK/dV and dQ recomputed, wgmma), causal, GQA, ragged; also
// accumulating into f32 gradients (ACCUMULATE).
TEST_CASE("emulator: the D 128 backward kernels on sm_90a equal the interpreter") {
  const int64_t B = 1, Hq = 2, Hkv = 1, Sq = 150, Sk = 150, D = 128, BM = 64, BN = 64;
  const float scale = 0.088f;
  const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", true}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN}};
  const auto [q, k, v, dout, o, lse, delta] = backward_inputs(B, Hq, Hkv, Sq, Sk, D, BM, meta, scale, 71);
  HostTensor dq(bf16, {B, Sq, Hq, D}), dk(bf16, {B, Sk, Hkv, D}), dv(bf16, {B, Sk, Hkv, D});
  jit::CompileOptions o4;
  o4.num_warps = 4;
  // ACCUMULATE: f32 gradients, prefilled, receive += (the epilogue's loads beside the accumulators)
  HostTensor sq(f32, {B, Sq, Hq, D}), sk(f32, {B, Sk, Hkv, D}), sv(f32, {B, Sk, Hkv, D});
  sq.fill_normal(75, 0, 1);
  sk.fill_normal(76, 0, 1);
  sv.fill_normal(77, 0, 1);
  // passes 4 and 5: dK/dV's causal walk as a masked and a mask-free loop over one Q / dO ring
  // (MASKED_BLOCKS_APART), without and with the producer warpgroup; its interpreter run must also
  // equal the one-loop kernel's
  for (int pass = 0; pass < 6; ++pass) {
    const bool accumulate = pass == 2 || pass == 3, dkdv = pass % 2 == 0 || pass == 5, apart = pass >= 4;
    INFO((dkdv ? "dK/dV" : "dQ") << (accumulate ? " ACCUMULATE" : "") << (apart ? " MASKED_BLOCKS_APART" : "") << (pass == 5 ? " RING_PRODUCER" : ""));
    Meta m = meta;
    if (accumulate) m.emplace_back("ACCUMULATE", true);
    if (apart) m.emplace_back("MASKED_BLOCKS_APART", true);
    if (pass == 5) m.emplace_back("RING_PRODUCER", true);
    const ir::Function fn = (dkdv ? kernels::attention_backward_dkdv() : kernels::attention_backward_dq()).build(m);
    std::map<jit::pir::Op, int> ops = count_ops(jit::lower(fn, o4));
    CHECK(ops[jit::pir::Op::wgmma] + ops[jit::pir::Op::wgmma_rs] > 0);
    const std::vector<HostTensor> tensors = dkdv ? std::vector<HostTensor>{q, k, v, dout, lse, delta, accumulate ? sk : dk, accumulate ? sv : dv}
                                                 : std::vector<HostTensor>{q, k, v, dout, lse, delta, accumulate ? sq : dq};
    const runtime::Grid grid = dkdv ? runtime::Grid{cdiv(Sk, BN), Hkv, B} : runtime::Grid{cdiv(Sq, BM), Hq, B};
    const Runs r = run_both(fn, grid, tensors, {scale}, {scale}, o4);
    for (size_t i = 6; i < tensors.size(); ++i) {
      INFO("output " << i);
      CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
    }
    if (!apart) continue;
    std::vector<HostTensor> one_loop = tensors;
    std::vector<runtime::Arg> args;
    for (HostTensor& t : one_loop) args.emplace_back(t);
    args.emplace_back(scale);
    runtime::interpret(kernels::attention_backward_dkdv().build(meta), grid, args);
    for (size_t i = 6; i < tensors.size(); ++i) CHECK(close_in_max_norm(one_loop[i], r.ref[i], 1e-5));
  }
}

// LSE_IN_RING: LSE and Delta copied by TMA into each Q / dO stage (vector tiles, no swizzle) and read
// from shared memory in S^T's layout where used, instead of loaded and exchanged through shared
// memory behind barriers. dK/dV in the emulator against the interpreter, and the interpreter's
// gradients against the plain kernel's (zero LSE past S_q instead of +inf: no contribution either
// way), D 64 and 128, full and causal, GQA, ragged S (a multiple of 4: TMA needs 16-byte strides), and
// at D 128 with the producer warpgroup (it fills the vectors' stages too; freed at the block's end).
TEST_CASE("emulator: dK/dV with LSE and Delta in the Q / dO ring equals the interpreter and the plain kernel") {
  const int64_t B = 1, Hq = 2, Hkv = 1, Sq = 152, Sk = 200, BM = 64, BN = 64;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true})
    for (bool producer : {false, true}) {
      if (producer && D == 64) continue;  // (the producer's setmaxnreg split is D128's)
      INFO("D " << D << " causal " << causal << " RING_PRODUCER " << producer);
      const float scale = 0.088f;
      const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", causal}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN}};
      const auto [q, k, v, dout, o, lse, delta] = backward_inputs(B, Hq, Hkv, Sq, Sk, D, BM, meta, scale, 81);
      HostTensor dk(bf16, {B, Sk, Hkv, D}), dv(bf16, {B, Sk, Hkv, D});
      Meta in_ring = meta;
      in_ring.emplace_back("LSE_IN_RING", true);
      in_ring.emplace_back("ROWS_AHEAD", false);
      in_ring.emplace_back("RING_PRODUCER", producer);
      const ir::Function fn = kernels::attention_backward_dkdv().build(in_ring);
      jit::CompileOptions o4;
      o4.num_warps = 4;
      const jit::pir::Func lowered = jit::lower(fn, o4);
      CHECK(lowered.tensor_maps.size() >= 4);  // Q, dO, LSE, Delta (K and V once)
      CHECK(std::count_if(lowered.tensor_maps.begin(), lowered.tensor_maps.end(), [](const jit::pir::TensorMapSpec& t) { return t.swizzle_bytes == 0; }) == 2);
      const std::vector<HostTensor> tensors{q, k, v, dout, lse, delta, dk, dv};
      const runtime::Grid grid{cdiv(Sk, BN), Hkv, B};
      const Runs r = run_both(fn, grid, tensors, {scale}, {scale}, o4);
      std::vector<HostTensor> plain = tensors;
      std::vector<runtime::Arg> args;
      for (HostTensor& t : plain) args.emplace_back(t);
      args.emplace_back(scale);
      runtime::interpret(kernels::attention_backward_dkdv().build(meta), grid, args);
      for (size_t i : {size_t{6}, size_t{7}}) {
        INFO("output " << i);
        CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
        CHECK(close_in_max_norm(plain[i], r.ref[i], 1e-5));
        CHECK(plain[i].to_f64() != std::vector<double>(static_cast<size_t>(plain[i].numel()), 0.0));
      }
    }
}

// Warp by warp with random hand-overs (EmulatorSchedule::seed): every barrier real, the running warp
// yielding at shared accesses, barrier arrivals, TMA issues and mbarrier arrivals -- the same
// results, whatever the interleaving, for the kernels that exchange through shared memory across
// warps (scans over warp bits, sorts, a transpose) and the warp-specialised ones.
TEST_CASE("emulator: random warp schedules give the same results (barriers and waits hold)") {
  for (uint64_t seed : {1, 2, 3}) {
    INFO("seed " << seed);
    const runtime::EmulatorSchedule sched{true, seed};
    {
      const axis_ops::Case c{{1024}, 0, 8, i32};
      jit::CompileOptions o;
      o.num_warps = c.warps;
      const Runs r = run_both(axis_ops::combine_kernel(c, false).build(), {1}, axis_ops::combine_tensors(c), {}, {}, o, sched);
      for (size_t i = 1; i < r.ref.size(); ++i) CHECK(std::memcmp(r.ref[i].data(), r.emu[i].data(), r.ref[i].bytes()) == 0);
    }
    {
      const int64_t B = 1, H = 2, S = 200, D = 128;
      HostTensor q(bf16, {B, S, H, D}), k(bf16, {B, S, H, D}), v(bf16, {B, S, H, D}), o(bf16, {B, S, H, D}), lse(f32, {B, H, S});
      q.fill_normal(81, 0, 1);
      k.fill_normal(82, 0, 1);
      v.fill_normal(83, 0, 1);
      const ir::Function fn = kernels::attention_forward().build(
          {{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", true}, {"BSHD", true}, {"BLOCK_M", 128}, {"BLOCK_N", 128}});
      jit::CompileOptions o8;
      o8.num_warps = 8;
      o8.pipeline.stages = 2;
      const Runs r = run_both(fn, {cdiv(S, 128), H, B}, {q, k, v, o, lse}, {0.088f}, {0.088f}, o8, sched);
      CHECK(count_apart(r.ref[3], r.emu[3], 1e-2) == 0);
    }
  }
}

// StoreOptions::tma (issue 22's epilogue through shared memory and a TMA store): bf16 and f32
// windows at program offsets into ragged tensors (the edges clipped by TMA), several programs, a
// store inside a loop (the staging tile reused after the previous copy read it); the same bits as
// the interpreter, through tma_store; both backends assemble it.
TEST_CASE("emulator: TMA stores (StoreOptions::tma) equal the interpreter and assemble") {
  const Kernel k = kernel("tma_store_emu", [](Builder& kb) {
    const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
    auto X = kb.tensor("X", f32, 2, rm), Y = kb.tensor("Y", bf16, 2, rm), Z = kb.tensor("Z", f32, 2, rm);
    Tile r0 = program_id(0) * 64;
    Tile x = load(X.block({r0, 0}, {64, 128}));
    store(Y.block({r0, 0}, {64, 128}), cast(bf16, x * 2.0f), {.tma = true});
    for_range(0, 2, [&](Tile j) {
      store(Z.block({r0 / 2 + j * 16, 32 * j}, {32, 64}), load(X.block({r0, 32 * j}, {32, 64})) + cast(f32, j), {.tma = true});
    });
  });
  const ir::Function fn = k.build();
  jit::CompileOptions o;
  o.num_warps = 4;
  std::map<jit::pir::Op, int> ops = count_ops(jit::lower(fn, o));
  CHECK(ops[jit::pir::Op::tma_store] > 0);
  HostTensor x(f32, {150, 120}), y(bf16, {150, 120}), z(f32, {100, 100});
  x.fill_uniform(91, -4, 4);
  y.poison();
  z.poison();
  check_emulator(fn, {3}, {&x, &y, &z}, 0.0, o);
  for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    INFO("backend " << jit::to_string(b));
    jit::CompileOptions c = o;
    c.backend = b;
    c.make_cubin = !jit::find_ptxas().empty();
    c.ptx_tool = jit::PtxTool::Ptxas;
    const jit::CompiledKernel ck = jit::compile(fn, c);
    CHECK(ck.ptx.find("cp.async.bulk.tensor.2d.global.shared::cta") != std::string::npos);
  }
}

// A TMA store's global writes land when its bulk group completes, not in any thread's program
// order: a later read of the tensor (or a later write of it) waits -- thread 0
// cp.async.bulk.wait_group 0 and fence.proxy.async.global, then a barrier -- between the store
// and the read (found by reading the lowering: the fuzzer's --tma-stores programs do this).
// The emulator completes TMA stores at once, so the check is on the lowered program.
TEST_CASE("TMA stores: a later read of the stored tensor waits for the bulk writes") {
  for (bool read_back : {false, true}) {
    INFO("read back " << read_back);
    const Kernel k = kernel("tma_store_read_back", [&](Builder& kb) {
      const ParamSpec rm{.align_bytes = 16, .contiguous_last = true};
      auto X = kb.tensor("X", bf16, 2, rm), O = kb.tensor("O", bf16, 2, rm), P = kb.tensor("P", bf16, 2, rm);
      store(O.block({0, 0}, {16, 64}), load(X.block({0, 0}, {16, 64})), {.tma = true});
      if (read_back) store(P.block({0, 0}, {16, 64}), load(O.block({8, 0}, {16, 64})));
      else store(P.block({0, 0}, {16, 64}), load(X.block({8, 0}, {16, 64})));
    });
    const ir::Function fn = k.build();
    jit::CompileOptions o;
    o.num_warps = 4;
    const jit::pir::Func prog = jit::lower(fn, o);
    // the instructions after the tma_store, in order (regions flattened)
    std::vector<const jit::pir::Inst*> flat;
    std::function<void(const jit::pir::Block&)> walk = [&](const jit::pir::Block& blk) {
      for (const jit::pir::Inst& in : blk.insts) {
        flat.push_back(&in);
        for (const jit::pir::Block& r : in.regions) walk(r);
      }
    };
    walk(prog.body);
    size_t store_at = flat.size(), full_wait = flat.size(), first_load_after = flat.size();
    for (size_t i = 0; i < flat.size(); ++i) {
      if (flat[i]->op == jit::pir::Op::tma_store && store_at == flat.size()) store_at = i;
      if (i > store_at && flat[i]->op == jit::pir::Op::bulk_wait && flat[i]->imm == 0 && full_wait == flat.size()) full_wait = i;
      if (i > store_at && (flat[i]->op == jit::pir::Op::load || flat[i]->op == jit::pir::Op::load_vec) && first_load_after == flat.size())
        first_load_after = i;
    }
    REQUIRE(store_at < flat.size());
    REQUIRE(first_load_after < flat.size());
    if (read_back) CHECK(full_wait < first_load_after);  // waited for before O is read
    else CHECK(full_wait > first_load_after);            // X's read needs no wait
    HostTensor x(bf16, {40, 64}), out(bf16, {40, 64}), p(bf16, {40, 64});
    x.fill_uniform(5, -4, 4);
    out.poison();
    p.poison();
    check_emulator(fn, {1}, {&x, &out, &p}, 0.0, o);
  }
}

// dK/dV with the atomic dQ reduction at D 128 on sm_90a (64 x 128 on 8 warps, five dots): its dQ
// parts go into dQ_accum by TMA add-reduces from the swizzled staging tile (tma_bulk_write, shared
// with TMA stores since 5465c24). Equal to the interpreter within the add order's rounding.
// With RING_PRODUCER and DQ_WRITER (lang::RingProducer::reduce_writer) a warp of the producer
// warpgroup issues the adds: each consumer warpgroup stages its column chunks and goes on; the
// barriers' phases follow the ring's iteration, counted across the group's query heads (Hq / Hkv
// runs of the query loop a program).
// DQ_NARROW_STAGING: dQ's part staged in unswizzled 32-byte rows, one TMA add per 8 columns (decision 100).
// D 64 (the API's atomic default there, decision 101) on 128 x 128 tiles: dS K split by rows, 64 a
// warpgroup, on the writer.
TEST_CASE("emulator: dK/dV with the atomic dQ reduction (TMA add-reduces) equals the interpreter") {
  for (const int64_t D : {128, 64})
  for (const bool narrow : {false, true})
  for (const bool writer : {false, true}) {
    if (D == 64 && !writer) continue;
    const int64_t B = 1, Hq = 2, Sq = 128, Sk = 256, BM = D == 128 ? 64 : 128, BN = 128;
    INFO("D " << D << ", RING_PRODUCER, LSE_IN_RING and DQ_WRITER " << writer << ", DQ_NARROW_STAGING " << narrow);
    const int64_t Hkv = writer ? 1 : 2;  // (the writer: two query heads a program)
    const float scale = 0.088f;
    const Meta fwd{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", false}, {"BSHD", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}};
    const auto [q, k, v, dout, o, lse, delta] = backward_inputs(B, Hq, Hkv, Sq, Sk, D, 64, fwd, scale, 91);
    HostTensor dk(bf16, {B, Sk, Hkv, D}), dv(bf16, {B, Sk, Hkv, D}), acc(f32, {B, Hq, Sq, D});
    Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", false}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN}, {"DQ_REDUCTION", 1}};
    if (writer) meta.insert(meta.end(), {{"RING_PRODUCER", true}, {"LSE_IN_RING", true}, {"DQ_WRITER", true}});
    meta.emplace_back("DQ_NARROW_STAGING", narrow);  // (on by default for atomic: decision 100)
    const ir::Function fn = kernels::attention_backward_dkdv().build(meta);
    jit::CompileOptions o8;
    o8.num_warps = 8;
    const jit::pir::Func lowered = jit::lower(fn, o8);
    std::map<jit::pir::Op, int> ops = count_ops(lowered);
    // a 64 x 128 part: 4 chunks of 32 columns, or 16 of 8 (narrow), in the emitted code once; D 64:
    // each warpgroup's 64 x 64, 2 chunks or 8
    CHECK(ops[jit::pir::Op::tma_reduce_add] == (D / (narrow ? 8 : 32)));
    bool unswizzled_add_map = false;
    for (const jit::pir::TensorMapSpec& m : lowered.tensor_maps)
      unswizzled_add_map |= m.swizzle_bytes == 0 && m.box.size() == 4 && m.box[0] == 8 && m.box[1] == BM;
    CHECK(unswizzled_add_map == narrow);
    CHECK(ops[jit::pir::Op::tma_store] > 0);  // dK and dV by TMA stores (TMA_STORE: the atomic reduction's default)
    jit::CompileOptions plan = o8;
    plan.make_cubin = false;
    plan.dump_after = "plan-wgmma";
    CHECK((jit::compile(fn, plan).dump.find("issued by the producer's reduce writer") != std::string::npos) == writer);
    // the writer also warp by warp with random hand-overs: a consumer that staged early or a
    // writer that added early would show (the emulator's copies complete when issued)
    std::vector<runtime::EmulatorSchedule> schedules{{}};
    if (writer) schedules.insert(schedules.end(), {{true, 1}, {true, 2}});
    for (const runtime::EmulatorSchedule& sched : schedules) {
      INFO("schedule seed " << sched.seed);
      for (int64_t e = 0; e < acc.numel(); ++e) acc.set_flat(e, 0.0);
      const Runs r = run_both(fn, {cdiv(Sk, BN), Hkv, B}, {q, k, v, dout, lse, delta, dk, dv, acc}, {scale}, {scale}, o8, sched);
      for (size_t i = 6; i < r.ref.size(); ++i) {
        INFO("output " << i << " (dK, dV, dQ_accum)");
        double norm = 0;
        for (double x : r.ref[i].to_f64()) norm = std::max(norm, std::fabs(x));
        CHECK(norm > 0.1);  // (a real gradient)
        CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
      }
    }
  }
}

// The dQ writer under a library mask (decisions 102, 108: the masks backward's route, D 128 and D 64):
// the producer and the writer follow the walk the mask gives -- its intervals (sliding window, whose
// key tiles see different query-tile counts) or the pre-pass's lists (causal document, ragged
// documents) -- over two query heads a program, warp by warp with random hand-overs too.
TEST_CASE("emulator: atomic dK/dV on the dQ writer with a library mask equals the interpreter") {
  const int64_t B = 1, Hq = 2, Hkv = 1, S = 384, BN = 128;
  const float scale = 0.088f;
  std::mt19937 rng(17);
  // D 128 on 64 x 128 tiles (decision 102), D 64 on 128 x 128 (dS K split by rows: 108)
  // (and the causal document with COORDINATES_AT_USE: decision 114)
  for (const auto& [D, BM] : {std::pair<int64_t, int64_t>{128, 64}, std::pair<int64_t, int64_t>{64, 128}})
  for (const int variant : {0, 1, 2}) {
    const kernels::MaskSpec spec = variant == 0 ? kernels::MaskSpec::sliding_window(90, 40) : kernels::MaskSpec::causal_document();
    const bool at_use = variant == 2;
    INFO("D " << D << " mask " << std::string(kernels::mask_kind_name(spec.kind)) << " coordinates at use " << at_use);
    const bool lists = !kernels::mask_has_tile_intervals(spec.kind);
    kernels::MaskData data;
    if (kernels::mask_uses_doc_ids(spec.kind)) data.doc_ids = {testing::mask_documents(1, S, 150, rng), {1, S}};
    kernels::check_mask(spec, data, {B, Hq, S, S});
    const testing::MaskArgs mask(spec, data);
    const Meta fwd{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", false}, {"BSHD", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}};
    const auto [q, k, v, dout, o, lse, delta] = backward_inputs(B, Hq, Hkv, S, S, D, 64, fwd, scale, 97);
    HostTensor dk(bf16, {B, S, Hkv, D}), dv(bf16, {B, S, Hkv, D}), acc(f32, {B, Hq, S, D});
    Meta meta{{"DTYPE", bf16},       {"HEAD_DIM", D},          {"MASK", static_cast<int>(spec.kind)}, {"BSHD", true},
              {"BLOCK_M", BM},       {"BLOCK_N", BN},          {"DQ_REDUCTION", 1},                   {"RING_PRODUCER", true},
              {"LSE_IN_RING", true}, {"DQ_WRITER", true},      {"DESCRIPTORS_AT_USE", true},          {"TMA_STORE", true}};
    if (at_use) meta.emplace_back("COORDINATES_AT_USE", true);
    const ir::Function fn = kernels::attention_backward_dkdv().build(meta);
    jit::CompileOptions o8;
    o8.num_warps = 8;
    jit::CompileOptions plan = o8;
    plan.make_cubin = false;
    plan.dump_after = "plan-wgmma";
    CHECK(jit::compile(fn, plan).dump.find("issued by the producer's reduce writer") != std::string::npos);
    std::vector<runtime::Arg> tail{scale};
    tail.insert(tail.end(), mask.args.begin(), mask.args.end());
    std::optional<testing::BlockMaskRun> kv_lists;
    if (lists) kv_lists.emplace(spec, data, mask, B, S, S, BM, BN, true), kv_lists->append_to(tail);
    for (const runtime::EmulatorSchedule& sched : {runtime::EmulatorSchedule{}, runtime::EmulatorSchedule{true, 3}}) {
      INFO("schedule seed " << sched.seed);
      for (int64_t e = 0; e < acc.numel(); ++e) acc.set_flat(e, 0.0);
      const Runs r = run_both(fn, {cdiv(S, BN), Hkv, B}, {q, k, v, dout, lse, delta, dk, dv, acc}, tail, tail, o8, sched);
      for (size_t i = 6; i < r.ref.size(); ++i) {
        INFO("output " << i << " (dK, dV, dQ_accum)");
        double norm = 0;
        for (double x : r.ref[i].to_f64()) norm = std::max(norm, std::fabs(x));
        CHECK(norm > 0.1);  // (a real gradient)
        CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
      }
    }
  }
}

// PERSISTENT atomic dK/dV on the producer and the dQ writer: a 1-D grid of 3 programs walking
// the key tiles of two heads in launch order, causal (items of unequal length: the rings' and the
// writer's barrier phases count on across them) and full, D 64 on 4 consumer warps and D 128 on 8,
// warp by warp with random hand-overs too. (On the GPU it hung until the LLVM backend's waits became
// convergent: decision 074.)
TEST_CASE("emulator: persistent atomic dK/dV with the dQ writer equals the interpreter") {
  for (int64_t D : {64, 128})
    for (bool causal : {true, false}) {
      const int64_t BM = 64, BN = D == 128 ? 128 : 64, B = 1, Hq = 2, Hkv = 2, S = D == 128 ? 384 : 256;
      INFO("D " << D << " causal " << causal);
      const float scale = 0.088f;
      const Meta fmeta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", causal}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", 64}};
      const auto [q, k, v, dout, o, lse, delta] = backward_inputs(B, Hq, Hkv, S, S, D, BM, fmeta, scale, 91);
      HostTensor dk(bf16, {B, S, Hkv, D}), dv(bf16, {B, S, Hkv, D}), acc(f32, {B, Hq, S, D});
      acc.fill(0);
      const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", causal}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN}, {"DQ_REDUCTION", 1},
                      {"RING_PRODUCER", true}, {"LSE_IN_RING", true}, {"DQ_WRITER", true}, {"PERSISTENT", true}};
      const ir::Function fn = kernels::attention_backward_dkdv().build(meta);
      jit::CompileOptions opts;
      opts.num_warps = D == 128 ? 8 : 4;
      for (uint64_t seed : {0, 3}) {
        INFO("schedule seed " << seed);
        const Runs r = run_both(fn, {3}, {q, k, v, dout, lse, delta, dk, dv, acc}, {scale}, {scale}, opts, {seed != 0, seed});
        for (size_t i = 6; i < r.ref.size(); ++i) {
          INFO("output " << i << " (dK, dV, dQ_accum)");
          CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
        }
      }
    }
}

// The ordered (deterministic) reduction on the dQ writer (decision 074): DASH's persistent schedule
// on one program (the emulator runs programs one after another, so a program whose waits count
// other programs' adds would wait for ever; one program walking every item waits on its own), the
// writer waiting for each add's turn and signalling one add later, full and causal, D 128, warp by
// warp with random hand-overs too. Every semaphore ends at the count of key tiles that reach its
// query tile.
// TMA_STORE (dK, dV by TMA stores at clamped coordinates) too, and full with PRODUCER_REGISTERS 40.
TEST_CASE("emulator: ordered dK/dV on the dQ writer equals the interpreter") {
  for (bool tma_store : {false, true})
  for (bool causal : {false, true}) {
    const int64_t BM = 64, BN = 128, B = 1, Hq = 2, Hkv = 2, S = 384, D = 128;
    INFO("causal " << causal << " TMA_STORE " << tma_store);
    const float scale = 0.088f;
    const Meta fmeta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", causal}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", 64}};
    const auto [q, k, v, dout, o, lse, delta] = backward_inputs(B, Hq, Hkv, S, S, D, BM, fmeta, scale, 95);
    HostTensor dk(bf16, {B, S, Hkv, D}), dv(bf16, {B, S, Hkv, D}), acc(f32, {B, Hq, S, D}), sem(i32, {B * Hq * (S / BM)});
    acc.fill(0);
    sem.fill(0);
    const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"CAUSAL", causal}, {"BSHD", true}, {"BLOCK_M", BM}, {"BLOCK_N", BN}, {"DQ_REDUCTION", 3},
                    {"RING_PRODUCER", true}, {"LSE_IN_RING", true}, {"DQ_WRITER", true}, {"PERSISTENT", true}, {"TMA_STORE", tma_store},
                    {"PRODUCER_REGISTERS", int64_t{tma_store && !causal ? 40 : 24}}};
    const ir::Function fn = kernels::attention_backward_dkdv().build(meta);
    jit::CompileOptions opts;
    opts.num_warps = 8;
    CHECK((count_ops(jit::lower(fn, opts))[jit::pir::Op::tma_store] > 0) == tma_store);
    // (the producer and the writer at 24 registers by default; PRODUCER_REGISTERS 40 runs below)
    int64_t producer_registers = 0;
    ir::walk(fn.body, [&](const ir::Op& op) {
      if (op.kind == ir::OpKind::ring_producer) producer_registers = op.int_attr("producer_registers");
    });
    CHECK(producer_registers == (tma_store && !causal ? 40 : 24));
    for (uint64_t seed : {0, 5}) {
      INFO("schedule seed " << seed);
      const Runs r = run_both(fn, {1}, {q, k, v, dout, lse, delta, dk, dv, acc, sem}, {scale}, {scale}, opts, {seed != 0, seed});
      for (size_t i = 6; i < 9; ++i) {
        INFO("output " << i << " (dK, dV, dQ_accum)");
        CHECK(close_in_max_norm(r.ref[i], r.emu[i], 2e-2));
      }
      CHECK(std::memcmp(r.ref[9].data(), r.emu[9].data(), r.ref[9].bytes()) == 0);  // (the semaphores' counts)
      const std::vector<double> counts = r.emu[9].to_f64();
      CHECK(std::all_of(counts.begin(), counts.end(), [](double c) { return c >= 1; }));
    }
  }
}

// lang::timestamp: lane 0 of each warp stores its clock at slot + warp. The emulator's clock is a
// count of the stamps taken (monotonic per warp), the interpreter stores nothing; both backends'
// PTX assembles. The D 128 forward's TIMELINE stamps every consumer warp and leaves O as it was.
TEST_CASE("timestamp: each warp's clock at slot + warp; the forward's TIMELINE stamps its warps") {
  const Kernel k = kernel("stamps", [](Builder& kb) {
    Tile buf = kb.pointer("buf", u64);
    for_range(0, 3, [&](Tile i) { timestamp(buf + (cast(i64, program_id(0)) * 3 + cast(i64, i)) * 32); });
  });
  const ir::Function fn = k.build();
  jit::CompileOptions o;
  o.num_warps = 4;
  CHECK(count_ops(jit::lower(fn, o))[jit::pir::Op::read_clock] == 1);
  HostTensor emu(u64, {2 * 3 * 32}), ref(u64, {2 * 3 * 32});
  emu.fill(0);
  ref.fill(0);
  runtime::interpret(fn, {2}, {ref});
  runtime::emulate(fn, {2}, {emu}, o);
  for (int64_t e = 0; e < ref.numel(); ++e) CHECK(ref.get_flat(e) == 0);
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t w = 0; w < 32; ++w)
      for (int64_t i = 0; i < 3; ++i) {
        INFO("program " << p << " warp " << w << " stamp " << i);
        const double t = emu.get_flat((p * 3 + i) * 32 + w);
        if (w >= 4) {
          CHECK(t == 0);  // no such warp
        } else {
          CHECK(t > 0);
          if (i > 0) CHECK(t > emu.get_flat((p * 3 + i - 1) * 32 + w));
        }
      }
  if (!jit::find_ptxas().empty())
    for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      if (b == jit::Backend::Nvrtc && !jit::nvrtc_available()) continue;
      jit::CompileOptions c = o;
      c.backend = b;
      c.ptx_tool = jit::PtxTool::Ptxas;
      CHECK(jit::compile(fn, c).ptx.find("%clock64") != std::string::npos);
    }

  // the forward (D 128, ring producer: 8 consumer warps stamp, the producer's 4 do not)
  const int64_t S = 300, D = 128;
  HostTensor q(bf16, {1, S, 1, D}), kk(bf16, {1, S, 1, D}), v(bf16, {1, S, 1, D}), out(bf16, {1, S, 1, D}), lse(f32, {1, 1, S});
  q.fill_normal(81, 0, 1);
  kk.fill_normal(82, 0, 1);
  v.fill_normal(83, 0, 1);
  const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"BSHD", true}, {"BLOCK_M", 128}, {"BLOCK_N", 128}};
  jit::CompileOptions o8;
  o8.num_warps = 8;
  o8.pipeline.stages = 2;
  const int64_t tiles = cdiv(S, 128), stamps = kernels::ForwardConfig::kTimelineStamps;
  HostTensor ref_o = out, ref_lse = lse;
  runtime::interpret(kernels::attention_forward().build(meta), {tiles, 1, 1}, {q, kk, v, ref_o, ref_lse, 0.088f});
  for (bool persistent : {false, true}) {  // (stamps by tile: persistent, 2 programs walk the 3 tiles)
    INFO("persistent " << persistent);
    Meta timed = meta;
    timed.emplace_back("TIMELINE", true);
    timed.emplace_back("PERSISTENT", persistent);
    HostTensor emu_o = out, emu_lse = lse, tl(u64, {tiles * stamps * 32});
    tl.fill(0);
    runtime::emulate(kernels::attention_forward().build(timed), persistent ? runtime::Grid{2} : runtime::Grid{tiles, 1, 1},
                     {q, kk, v, emu_o, emu_lse, 0.088f, tl}, o8);
    CHECK(count_apart(ref_o, emu_o, 1e-2) == 0);
    CHECK(count_apart(ref_lse, emu_lse, 1e-2) == 0);
    for (int64_t t = 0; t < tiles; ++t)
      for (int64_t w = 0; w < 12; ++w) {
        INFO("tile " << t << " warp " << w);
        const double start = tl.get_flat((t * stamps) * 32 + w), end = tl.get_flat((t * stamps + stamps - 1) * 32 + w);
        if (w < 8) {
          CHECK(start > 0);
          CHECK(end > start);
        } else {
          CHECK(start == 0);  // (the producer warpgroup)
        }
      }
  }
}

// The dK/dV kernel's TIMELINE (bench/attention_timeline --backward): every consumer warp stamps
// its key tile's start and end and each query block visit's phases in order; dK and dV as they were.
TEST_CASE("the dK/dV kernel's TIMELINE stamps each visit's phases in order and leaves dK, dV as they were") {
  const int64_t S = 192, D = 64, B = 64;  // 3 key tiles, each visited by 3 query blocks
  HostTensor q(bf16, {1, S, 1, D}), k(bf16, {1, S, 1, D}), v(bf16, {1, S, 1, D}), dout(bf16, {1, S, 1, D});
  HostTensor lse(f32, {1, 1, S}), delta(f32, {1, 1, S}), dk(bf16, {1, S, 1, D}), dv(bf16, {1, S, 1, D});
  q.fill_normal(91, 0, 1), k.fill_normal(92, 0, 1), v.fill_normal(93, 0, 1), dout.fill_normal(94, 0, 1);
  lse.fill_normal(95, 5, 0.5), delta.fill_normal(96, 0, 0.1);
  const Meta meta{{"DTYPE", bf16}, {"HEAD_DIM", D}, {"BSHD", true}, {"BLOCK_M", B}, {"BLOCK_N", B}};
  jit::CompileOptions o4;
  o4.num_warps = 4;
  o4.pipeline.stages = 2;
  const int64_t tiles = S / B, stamps = kernels::DkdvConfig::kTimelineStamps, phases = kernels::DkdvConfig::kTimelinePhases;
  HostTensor ref_dk = dk, ref_dv = dv, emu_dk = dk, emu_dv = dv, tl(u64, {tiles * stamps * 32});
  tl.fill(0);
  runtime::interpret(kernels::attention_backward_dkdv().build(meta), {tiles, 1, 1}, {q, k, v, dout, lse, delta, ref_dk, ref_dv, 0.125f});
  Meta timed = meta;
  timed.emplace_back("TIMELINE", true);
  runtime::emulate(kernels::attention_backward_dkdv().build(timed), {tiles, 1, 1}, {q, k, v, dout, lse, delta, emu_dk, emu_dv, 0.125f, tl}, o4);
  CHECK(close_in_max_norm(ref_dk, emu_dk, 2e-2));
  CHECK(close_in_max_norm(ref_dv, emu_dv, 2e-2));
  const auto at = [&](int64_t t, int64_t s, int64_t w) { return tl.get_flat((t * stamps + s) * 32 + w); };
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t w = 0; w < 32; ++w) {
      INFO("key tile " << t << " warp " << w);
      if (w >= 4) {
        CHECK(at(t, 0, w) == 0);  // no such warp
        continue;
      }
      double last = at(t, 0, w);
      CHECK(last > 0);
      for (int64_t j = 0; j < S / B; ++j)
        for (int64_t ph = 0; ph < phases; ++ph) {
          INFO("visit " << j << " phase " << ph);
          CHECK(at(t, 1 + j * phases + ph, w) > last);
          last = at(t, 1 + j * phases + ph, w);
        }
      CHECK(at(t, 1 + (S / B) * phases, w) == 0);  // (no fourth visit)
      CHECK(at(t, stamps - 1, w) > last);
    }
  CHECK_THROWS_WITH_AS(kernels::attention_backward_dkdv().build({{"VARLEN", true}, {"TIMELINE", true}}),
                       doctest::Contains("TIMELINE stamps the key tiles of dense full or causal batches"), lang::BuildError);
  CHECK_THROWS_WITH_AS(kernels::attention_backward_dkdv().build({{"PRODUCER_REGISTERS", int64_t{36}}}),
                       doctest::Contains("PRODUCER_REGISTERS = 36 (valid: 24, 32 or 40"), lang::BuildError);
  CHECK_THROWS_WITH_AS(kernels::attention_backward_dkdv().build({{"PRODUCER_REGISTERS", int64_t{40}}}),
                       doctest::Contains("PRODUCER_REGISTERS sets the producer warpgroup's registers: it needs RING_PRODUCER=true"),
                       lang::BuildError);
}

// A kernel whose rings at the requested stages leave no room for its layout exchanges is compiled
// with fewer stages, and says so, rather than refused (fuzzer seeds 14438, 20359): the GEMM at
// 128 x 256 with C by TMA stores asks for 4 stages (262 KB) and gets 3; the same values.
TEST_CASE("compile: stages that do not fit shared memory shrink (with a warning)") {
  const int64_t M = 200, N = 296, K = 192;
  const ir::Function fn =
      kernels::gemm().build({{"BLOCK_N", 256}, {"GROUP_M", 8}, {"OUT_DTYPE", bf16}, {"TMA_STORE", true}, {"B_KMAJOR", true}});
  jit::CompileOptions o;
  o.num_warps = 8;
  o.pipeline.stages = 4;
  o.make_cubin = false;
  const jit::CompiledKernel ck = jit::compile(fn, o);
  CHECK(ck.smem_bytes <= 227 * 1024);
  REQUIRE(ck.warnings.size() >= 1);
  CHECK(ck.warnings[0].find("4 pipeline stages do not fit") != std::string::npos);
  CHECK(ck.warnings[0].find("compiled with 3") != std::string::npos);
  HostTensor a(bf16, {M, K}), b(bf16, {N, K}), c(bf16, {M, N});
  a.fill_uniform(61, -3, 3);
  b.fill_uniform(62, -3, 3);
  for (HostTensor* t : {&a, &b})
    for (int64_t e = 0; e < t->numel(); ++e) t->set_flat(e, std::round(t->get_flat(e)));
  check_emulator(fn, {cdiv(M, 128) * cdiv(N, 256)}, {&a, &b, &c}, 0.0, o);
}

// Pointer loads vectorise where AxisInfo (jit/axis_info.hpp) proves a thread's consecutive
// registers one aligned run with one mask value: a 1-D masked add whose length is declared a
// multiple of 16 (as the launch-time specialisation does), and a 2-D tile over rows of a constant
// pitch. Blocks inside n take the vector loads, the block crossing n = 1008 the scalar fallback;
// the values are the interpreter's either way.
TEST_CASE("pointer loads and stores vectorise on proven runs and masks, with the interpreter's values") {
  for (DType d : {f32, bf16}) {
    INFO(ir::name(d));
    const Kernel k = kernel("ptr_add", [&](Builder& b) {
      auto X = b.pointer("X", d, {.align_bytes = 16}), Y = b.pointer("Y", d, {.align_bytes = 16});
      auto Out = b.pointer("Out", d, {.align_bytes = 16});
      auto n = b.scalar<int>("n");
      auto offs = program_id(0) * 512 + arange(0, 512);
      auto mask = offs < n;
      store(Out + offs, load(X + offs, mask, 0.0) + load(Y + offs, mask, 0.0), mask);
      // 2-D: rows of 64 elements
      auto r = arange(0, 16), c = arange(0, 64);
      auto p = program_id(0) * 1024 + r[col] * 64 + c[row];
      store(Out + 1024 * 4 + p, load(X + p) * 2.0);
    });
    ir::Function fn = k.build();
    fn.params[3].spec.divisible_by = 16;  // n, as runtime/specialization.hpp declares it
    jit::CompileOptions o;
    o.num_warps = 4;
    const std::map<jit::pir::Op, int> ops = count_ops(jit::lower(fn, o));
    CHECK(ops.count(jit::pir::Op::load_vec));
    CHECK(ops.count(jit::pir::Op::store_vec));
    const ir::Function plain = k.build();  // n not declared: the masked loads and stores stay scalar
    std::map<jit::pir::Op, int> plain_ops = count_ops(jit::lower(plain, o));
    CHECK(plain_ops[jit::pir::Op::load_vec] < ops.at(jit::pir::Op::load_vec));
    CHECK(plain_ops[jit::pir::Op::store_vec] < ops.at(jit::pir::Op::store_vec));
    CHECK(plain_ops[jit::pir::Op::store_vec] > 0);  // the unmasked 2-D store
    for (int64_t n : {int64_t{1024}, int64_t{1008}}) {
      INFO("n = " << n);
      HostTensor x(d, {8192}), y(d, {8192}), out(d, {8192});
      x.fill_uniform(3, -4, 4);
      y.fill_uniform(4, -4, 4);
      out.poison();
      std::vector<HostTensor> ts{x, y, out};
      const Runs r = run_both(fn, {2}, ts, {n}, {n}, o);
      CHECK(count_apart(r.ref[2], r.emu[2], 0.0) == 0);
    }
  }
}
