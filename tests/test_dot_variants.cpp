// Dot variants (issue 26 item 3): f32 dots with input_precision tf32 and batched 3-D dots. The
// interpreter against host references (tf32 rounding edge cases included), the IR attribute, the
// lowering run in the emulator against the interpreter (mma.sync m16n8k8 .tf32, batched mma.sync
// m16n8k16 and the FMA fallbacks), and PTX through both backends assembled by ptxas for sm_90a.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dsl/ir/input_precision.hpp"
#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "ptxas_testing.hpp"
#include "tf32_test_data.hpp"
#include "runtime/emulator.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;
using testing::fill_tf32_near_integers;

namespace {

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

// An independent model of cvt.rna.tf32.f32 for finite values, from the value rather than its bits:
// the two TF32 neighbours of |x| (10 explicit mantissa bits; subnormals keep the same spacing as the
// smallest normals) and the nearer one, the one farther from zero on a tie; past the largest TF32
// value, infinity.
double reference_tf32(float x) {
  if (!std::isfinite(x) || x == 0) return x;
  const double mag = std::fabs(static_cast<double>(x));
  int e = 0;
  std::frexp(mag, &e);  // mag in [2^(e-1), 2^e): TF32 spacing 2^(e-11), 2^-136 at the bottom
  const double step = std::ldexp(1.0, std::max(e - 11, -136));
  const double lo = std::floor(mag / step) * step, hi = lo + step;
  const double r = mag - lo < hi - mag ? lo : hi;
  return std::copysign(r > std::numeric_limits<float>::max() ? INFINITY : r, static_cast<double>(x));
}

// D = dot(A, B, C) over whole tiles of rank-2 or rank-3 tensors, one program.
// `spec`: what A and B promise (16-byte aligned contiguous rows make a 2-D dot wgmma's on sm_90a).
Kernel dot_kernel(DType in, const Shape& as, const Shape& bs, DotOptions o, ir::ParamSpec spec = {}) {
  return kernel("dot_variant", [=](Builder& k) {
    const int r = static_cast<int>(as.size());
    const DType acc = in == i8 ? i32 : f32;
    auto A = k.tensor("A", in, r, spec), B = k.tensor("B", in, r, spec), C = k.tensor("C", acc, r), D = k.tensor("D", acc, r);
    Shape cs = as;
    cs.back() = bs.back();
    const std::vector<Operand> z(static_cast<size_t>(r), Operand(0));
    store(D.block(z, cs), dot(load(A.block(z, as)), load(B.block(z, bs)), load(C.block(z, cs)), o));
  });
}

// The same with the accumulator carried through a K loop in steps of `bk` (a Var in a for_range).
Kernel dot_loop_kernel(DType in, const Shape& as, const Shape& bs, int64_t bk, DotOptions o) {
  return kernel("dot_variant_loop", [=](Builder& k) {
    const int r = static_cast<int>(as.size());
    auto A = k.tensor("A", in, r), B = k.tensor("B", in, r), C = k.tensor("C", f32, r), D = k.tensor("D", f32, r);
    Shape cs = as, ab = as, bb = bs;
    cs.back() = bs.back();
    ab.back() = bk;
    bb[static_cast<size_t>(r) - 2] = bk;
    const std::vector<Operand> z(static_cast<size_t>(r), Operand(0));
    Var acc = load(C.block(z, cs));
    for_range(0, as.back(), bk, [&](Tile k0) {
      std::vector<Operand> ao = z, bo = z;
      ao.back() = k0;
      bo[static_cast<size_t>(r) - 2] = k0;
      Tile a = load(A.block(ao, ab));
      Tile b = load(B.block(bo, bb));
      acc = dot(a, b, acc, o);
    });
    store(D.block(z, cs), acc);
  });
}

// acc + a @ b per batch (rank 2: one batch): products of the inputs (tf32: rounded first) summed in
// double in k order and added to acc, rounded to the accumulator's dtype once -- the interpreter's
// documented order, so its results are this bit for bit.
std::vector<double> reference_dot(const HostTensor& a, const HostTensor& b, const HostTensor& c, bool tf32) {
  const size_t r = a.sizes().size();
  const int64_t batch = r == 3 ? a.sizes()[0] : 1, M = a.sizes()[r - 2], K = a.sizes()[r - 1], N = b.sizes()[r - 1];
  const std::vector<double> av = a.to_f64(), bv = b.to_f64(), cv = c.to_f64();
  const auto in = [&](double x) { return tf32 ? reference_tf32(static_cast<float>(x)) : x; };
  std::vector<double> out(static_cast<size_t>(batch * M * N));
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += in(av[static_cast<size_t>((p * M + m) * K + k)]) * in(bv[static_cast<size_t>((p * K + k) * N + n)]);
        const size_t o = static_cast<size_t>((p * M + m) * N + n);
        const double sum = cv[o] + s;
        out[o] = c.dtype() == i32 ? static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(sum))) : static_cast<double>(static_cast<float>(sum));
      }
  return out;
}

Shape product_shape(const Shape& as, const Shape& bs) {
  Shape cs = as;
  cs.back() = bs.back();
  return cs;
}

void fill_small_integers(HostTensor& t, uint64_t seed, int range) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-range, range);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_flat(i, value(rng));
}

// The interpreter and the emulator (the lowered per-thread program) on copies of the tensors;
// every tensor equal bit for bit (tol 0, NaNs in the same places) or within tol * (1 + |ref|).
void check_emulator(const ir::Function& fn, std::vector<HostTensor> tensors, int num_warps, double tol) {
  std::vector<HostTensor> ref = tensors, emu = tensors;
  std::vector<runtime::Arg> ra, ea;
  for (HostTensor& t : ref) ra.emplace_back(t);
  for (HostTensor& t : emu) ea.emplace_back(t);
  jit::CompileOptions o;
  o.num_warps = num_warps;
  runtime::interpret(fn, {1}, ra);
  runtime::emulate(fn, {1}, ea, o);
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<double> a = ref[i].to_f64(), b = emu[i].to_f64();
    size_t bad = 0;
    for (size_t e = 0; e < a.size(); ++e) {
      const bool ok = std::isnan(a[e]) ? std::isnan(b[e]) : a[e] == b[e] || std::fabs(a[e] - b[e]) <= tol * (1 + std::fabs(a[e]));
      if (!ok && bad++ < 4) MESSAGE(fmt::format("{} tensor #{} element {}: interpreter {} emulator {}", fn.name, i, e, a[e], b[e]));
    }
    CHECK_MESSAGE(bad == 0, fn.name << " tensor #" << i << ": " << bad << " elements differ");
  }
}

// How many instructions of each kind the lowered program holds (regions included).
std::map<jit::pir::Op, int> count_ops(const ir::Function& fn, int num_warps) {
  jit::CompileOptions o;
  o.num_warps = num_warps;
  std::map<jit::pir::Op, int> ops;
  std::function<void(const jit::pir::Block&)> walk = [&](const jit::pir::Block& blk) {
    for (const jit::pir::Inst& in : blk.insts) {
      ++ops[in.op];
      for (const jit::pir::Block& r : in.regions) walk(r);
    }
  };
  walk(jit::lower(fn, o).body);
  return ops;
}

constexpr DotOptions kTf32{.input_precision = InputPrecision::tf32};

}  // namespace

TEST_CASE("tf32 rounding is cvt.rna.tf32.f32: ties away from zero, overflow to inf, NaN/inf kept, subnormals rounded") {
  struct Case {
    uint32_t in, out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f800000, "1.0 (nothing dropped)"},
      {0x3f800fff, 0x3f800000, "just below half: down"},
      {0x3f801000, 0x3f802000, "exactly half, even kept bits: away from zero (RNE would keep 1.0)"},
      {0x3f803000, 0x3f804000, "exactly half, odd kept bits: away from zero"},
      {0x3f801001, 0x3f802000, "just above half: up"},
      {0xbf801000, 0xbf802000, "negative, exactly half: away from zero (more negative)"},
      {0xbf800fff, 0xbf800000, "negative, just below half: toward zero"},
      {0x3fffffff, 0x40000000, "carry into the exponent"},
      {0x7f7fefff, 0x7f7fe000, "largest value below the last tie: the largest TF32"},
      {0x7f7ff000, 0x7f800000, "tie above the largest TF32: infinity"},
      {0xff7fffff, 0xff800000, "negative overflow: -infinity"},
      {0x7f800000, 0x7f800000, "+inf"},
      {0xff800000, 0xff800000, "-inf"},
      {0x7fc00000, 0x7fc00000, "quiet NaN"},
      {0x7fffffff, 0x7fffe000, "the GPU's NaN: still a NaN"},
      {0xffc01234, 0xffc00000, "negative NaN with a payload: sign and high payload kept"},
      {0x00000000, 0x00000000, "+0"},
      {0x80000000, 0x80000000, "-0"},
      {0x00000fff, 0x00000000, "subnormal below half of the first TF32 subnormal: +0"},
      {0x00001000, 0x00002000, "subnormal tie: away from zero"},
      {0x80001000, 0x80002000, "negative subnormal tie: away from zero"},
      {0x007ff000, 0x00800000, "largest subnormals round up to the smallest normal"},
      {0x00abcdef, 0x00abc000, "small normal, below half"},
  };
  for (const Case& c : cases) {
    INFO(fmt::format("{:#010x}: {}", c.in, c.what));
    CHECK(ir::tf32_rna_bits(c.in) == c.out);
    const float r = ir::round_to_tf32(from_bits(c.in));
    if (std::isnan(from_bits(c.in))) CHECK(std::isnan(r));
    else CHECK(static_cast<double>(r) == reference_tf32(from_bits(c.in)));
  }
  // every exponent, random mantissas, both signs: the bit rule agrees with the value model
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const auto b = static_cast<uint32_t>(rng());
    const float x = from_bits(b);
    if (std::isnan(x)) continue;
    REQUIRE_MESSAGE(static_cast<double>(ir::round_to_tf32(x)) == reference_tf32(x), fmt::format("{:#010x}", b));
  }
}

TEST_CASE("interpreter: tf32 dot rounds each input (edge values through an identity), NaN and inf propagate") {
  // A's rows 0..13: values with exact ties, negatives, subnormals, near-overflow; row 14 one inf,
  // row 15 one NaN. D = A @ I: each element is A's rounded value (tf32) or A itself (ieee).
  const uint32_t edge[] = {0x3f801000, 0xbf801000, 0x3f803000, 0x3f800fff, 0x3f801001, 0x00001000, 0x80001000, 0x007ff000,
                           0x7f7fefff, 0x40490fdb, 0xc0490fdb, 0x3eaaaaab, 0x00000fff, 0x7f7ff000 - 0x2000};
  const int64_t K = 16;
  HostTensor a(f32, {16, K}), b(f32, {K, K}), c(f32, {16, K}), d(f32, {16, K});
  std::mt19937_64 rng(3);
  for (int64_t m = 0; m < 16; ++m)
    for (int64_t k = 0; k < K; ++k) a.set({m, k}, static_cast<double>(from_bits(edge[static_cast<size_t>(rng() % std::size(edge))])));
  a.set({14, 5}, INFINITY);
  a.set({15, 9}, NAN);
  b.fill(0);
  c.fill(0);
  for (int64_t k = 0; k < K; ++k) b.set({k, k}, 1.0);
  for (InputPrecision p : {InputPrecision::ieee, InputPrecision::tf32}) {
    INFO(ir::name(p));
    HostTensor out = d;
    runtime::interpret(dot_kernel(f32, {16, K}, {K, K}, {.input_precision = p}).build(), {1}, {a, b, c, out});
    int64_t changed = 0;
    for (int64_t m = 0; m < 14; ++m)
      for (int64_t n = 0; n < K; ++n) {
        const auto x = static_cast<float>(a.get({m, n}));
        const double want = p == InputPrecision::tf32 ? reference_tf32(x) : static_cast<double>(x);
        CHECK(out.get({m, n}) == want);
        changed += out.get({m, n}) != static_cast<double>(x);
      }
    CHECK((p == InputPrecision::tf32 ? changed > 100 : changed == 0));
    // inf x 0 = NaN in every column but its own, where it stays inf; a NaN row is NaN throughout
    for (int64_t n = 0; n < K; ++n) {
      CHECK((n == 5 ? out.get({14, n}) == INFINITY : std::isnan(out.get({14, n}))));
      CHECK(std::isnan(out.get({15, n})));
    }
  }
}

TEST_CASE("interpreter: tf32 and batched dots equal the host reference bit for bit") {
  struct Case {
    DType in;
    Shape a, b;
    InputPrecision p;
  };
  const Case cases[] = {
      {f32, {32, 64}, {64, 16}, InputPrecision::tf32},     {f32, {4, 16, 32}, {4, 32, 8}, InputPrecision::tf32},
      {bf16, {4, 16, 32}, {4, 32, 8}, InputPrecision::ieee}, {f16, {2, 32, 16}, {2, 16, 32}, InputPrecision::ieee},
      {f32, {8, 4, 8}, {8, 8, 2}, InputPrecision::ieee},      {i8, {2, 16, 32}, {2, 32, 16}, InputPrecision::ieee},
      {f32, {1, 16, 16}, {1, 16, 16}, InputPrecision::tf32},
  };
  int seed = 11;
  for (const Case& c : cases) {
    INFO(ir::name(c.in) << ir::shape_string(c.a) << " @ " << ir::shape_string(c.b) << " " << ir::name(c.p));
    const Shape cs = product_shape(c.a, c.b);
    const DType acc = c.in == i8 ? i32 : f32;
    HostTensor a(c.in, c.a), b(c.in, c.b), acc0(acc, cs), d(acc, cs);
    if (c.in == i8) {
      fill_small_integers(a, static_cast<uint64_t>(++seed), 127);
      fill_small_integers(b, static_cast<uint64_t>(++seed), 127);
      fill_small_integers(acc0, static_cast<uint64_t>(++seed), 1000);
    } else {
      a.fill_normal(static_cast<uint64_t>(++seed), 0, 1);
      b.fill_normal(static_cast<uint64_t>(++seed), 0, 1);
      acc0.fill_normal(static_cast<uint64_t>(++seed), 0, 4);
    }
    d.poison();
    runtime::interpret(dot_kernel(c.in, c.a, c.b, {.input_precision = c.p}).build(), {1}, {a, b, acc0, d});
    const std::vector<double> want = reference_dot(a, b, acc0, c.p == InputPrecision::tf32), got = d.to_f64();
    CHECK(got == want);
    if (c.p == InputPrecision::tf32) CHECK(got != reference_dot(a, b, acc0, false));  // the rounding shows
  }
}

TEST_CASE("the tile IR carries input_precision only for tf32: printed, in the hash, checked by the verifier") {
  const ir::Function ieee = dot_kernel(f32, {16, 16}, {16, 16}, {}).build();
  const ir::Function tf32 = dot_kernel(f32, {16, 16}, {16, 16}, kTf32).build();
  CHECK(ir::print(ieee).find("input_precision") == std::string::npos);  // the default: the IR as before the option
  CHECK(ir::print(tf32).find("{input_precision = \"tf32\"}") != std::string::npos);
  CHECK(ir::structural_hash(ieee) != ir::structural_hash(tf32));
  // a hand-written dot with a precision the type rule refuses
  ir::Function bad = dot_kernel(bf16, {16, 16}, {16, 16}, {}).build();
  ir::walk(bad.body, [](ir::Op& op) {
    if (op.kind == ir::OpKind::dot) op.attrs[ir::kInputPrecisionAttr] = std::string("tf32");
  });
  CHECK_THROWS_WITH(ir::verify(bad), doctest::Contains("input_precision tf32 needs f32 inputs, got bf16"));
  ir::walk(bad.body, [](ir::Op& op) {
    if (op.kind == ir::OpKind::dot) op.attrs[ir::kInputPrecisionAttr] = std::string("tf64");
  });
  CHECK_THROWS_WITH(ir::verify(bad), doctest::Contains("unknown input_precision 'tf64' (valid: ieee tf32)"));
}

TEST_CASE("lowering: tf32 dots take mma.sync m16n8k8 .tf32 after cvt.rna where the shapes fit, FMA on rounded inputs elsewhere") {
  using jit::pir::Op;
  // 64 x 32 @ 32 x 64 on 4 warps: mma (each input rounded once: 64*32 + 32*64 elements over 128 threads,
  // A replicated over the warps splitting N)
  auto ops = count_ops(dot_kernel(f32, {64, 32}, {32, 64}, kTf32).build(), 4);
  CHECK(ops[Op::mma_1688_tf32] == 64 / 16 * 64 / 8 * 32 / 8 / 4);
  CHECK(ops[Op::cvt_tf32] > 0);
  CHECK(ops[Op::mma_16816] == 0);
  CHECK(ops[Op::wgmma] == 0);
  // M = 8 has no 16-row slab: FMA, on rounded inputs
  ops = count_ops(dot_kernel(f32, {8, 16}, {16, 16}, kTf32).build(), 4);
  CHECK(ops[Op::mma_1688_tf32] == 0);
  CHECK(ops[Op::cvt_tf32] > 0);
  // ieee f32: FMA as before, no rounding
  ops = count_ops(dot_kernel(f32, {64, 32}, {32, 64}, {}).build(), 4);
  CHECK(ops[Op::mma_1688_tf32] + ops[Op::cvt_tf32] == 0);
}

TEST_CASE("lowering: batched dots run the 2-D mma per batch, never wgmma; FMA where a batch's shape does not fit") {
  using jit::pir::Op;
  // per batch 64 x 64 @ 64 x 64 bf16 from aligned windows: wgmma-shaped in 2-D, mma.sync batched
  const ir::ParamSpec aligned{.align_bytes = 16, .contiguous_last = true};
  auto ops = count_ops(dot_kernel(bf16, {2, 64, 64}, {2, 64, 64}, {}, aligned).build(), 4);
  CHECK(ops[Op::wgmma] + ops[Op::wgmma_rs] == 0);
  CHECK(ops[Op::mma_16816] == 2 * (64 / 16) * (64 / 8) * (64 / 16) / 4);
  CHECK(count_ops(dot_kernel(bf16, {64, 64}, {64, 64}, {}, aligned).build(), 4)[Op::wgmma] > 0);  // (the 2-D dot takes wgmma)
  // 8 batches of 16 x 16 @ 16 x 16 on 4 warps: a warp per batch, two batches in each warp's registers
  ops = count_ops(dot_kernel(bf16, {8, 16, 16}, {8, 16, 16}, {}).build(), 4);
  CHECK(ops[Op::mma_16816] == 8 * 2 / 4);
  // tf32 batched
  ops = count_ops(dot_kernel(f32, {4, 16, 16}, {4, 16, 8}, kTf32).build(), 4);
  CHECK(ops[Op::mma_1688_tf32] == 4 * 2 / 4);
  // K = 8 is no m16n8k16 step: FMA
  ops = count_ops(dot_kernel(bf16, {2, 16, 8}, {2, 8, 16}, {}).build(), 4);
  CHECK(ops[Op::mma_16816] == 0);
}

TEST_CASE("emulator: tf32 and batched dots, lowered, equal the interpreter") {
  struct Case {
    DType in;
    Shape a, b;
    InputPrecision p;
    int warps;
  };
  const Case cases[] = {
      {f32, {64, 32}, {32, 64}, InputPrecision::tf32, 4},     // mma m16n8k8, warps 4 x 1
      {f32, {16, 64}, {64, 32}, InputPrecision::tf32, 4},     // warps along N
      {f32, {128, 16}, {16, 32}, InputPrecision::tf32, 8},    // several M reps per warp
      {f32, {8, 16}, {16, 16}, InputPrecision::tf32, 4},      // FMA on rounded inputs
      {f32, {16, 4}, {4, 16}, InputPrecision::tf32, 4},       // K below one mma step: FMA
      {bf16, {4, 32, 32}, {4, 32, 16}, InputPrecision::ieee, 4},  // a warp per batch
      {bf16, {2, 64, 32}, {2, 32, 64}, InputPrecision::ieee, 4},  // two warps per batch
      {f16, {8, 16, 16}, {8, 16, 16}, InputPrecision::ieee, 4},   // two batches in each warp's registers
      {bf16, {16, 16, 32}, {16, 32, 8}, InputPrecision::ieee, 8},
      {bf16, {1, 32, 32}, {1, 32, 32}, InputPrecision::ieee, 4},
      {f32, {4, 16, 16}, {4, 16, 8}, InputPrecision::tf32, 4},    // batched tf32 mma
      {f32, {2, 32, 16}, {2, 16, 32}, InputPrecision::tf32, 8},
      {f32, {2, 8, 16}, {2, 16, 16}, InputPrecision::tf32, 4},    // batched tf32 FMA
      {f32, {2, 16, 8}, {2, 8, 16}, InputPrecision::ieee, 4},     // batched f32 FMA
      {bf16, {2, 16, 8}, {2, 8, 16}, InputPrecision::ieee, 4},    // batched 16-bit FMA (K = 8)
      {i8, {2, 16, 32}, {2, 32, 16}, InputPrecision::ieee, 4},    // batched i8 -> i32 (FMA)
  };
  int seed = 100;
  for (const Case& c : cases) {
    INFO(ir::name(c.in) << ir::shape_string(c.a) << " @ " << ir::shape_string(c.b) << " " << ir::name(c.p) << ", " << c.warps << " warps");
    const Shape cs = product_shape(c.a, c.b);
    const DType acc = c.in == i8 ? i32 : f32;
    HostTensor a(c.in, c.a), b(c.in, c.b), acc0(acc, cs), d(acc, cs);
    if (c.p == InputPrecision::tf32) {
      fill_tf32_near_integers(a, static_cast<uint64_t>(++seed), 8);
      fill_tf32_near_integers(b, static_cast<uint64_t>(++seed), 8);
    } else {
      fill_small_integers(a, static_cast<uint64_t>(++seed), c.in == i8 ? 100 : 8);
      fill_small_integers(b, static_cast<uint64_t>(++seed), c.in == i8 ? 100 : 8);
    }
    fill_small_integers(acc0, static_cast<uint64_t>(++seed), 50);
    d.poison();
    check_emulator(dot_kernel(c.in, c.a, c.b, {.input_precision = c.p}).build(), {a, b, acc0, d}, c.warps, 0.0);
  }
}

TEST_CASE("emulator: tf32 edge values (ties, subnormals, inf, NaN) and normal data; a batched accumulator carried through a K loop") {
  // edge values through an identity on mma m16n8k8: every rounding is the interpreter's, bit for bit
  const uint32_t edge[] = {0x3f801000, 0xbf801000, 0x3f803000, 0x3f800fff, 0x00001000, 0x80001000, 0x007ff000, 0x40490fdb};
  HostTensor a(f32, {32, 16}), eye(f32, {16, 16}), zero(f32, {32, 16}), d(f32, {32, 16});
  std::mt19937_64 rng(5);
  for (int64_t i = 0; i < a.numel(); ++i) a.set_flat(i, static_cast<double>(from_bits(edge[static_cast<size_t>(rng() % std::size(edge))])));
  a.set({20, 3}, INFINITY);
  a.set({21, 7}, -INFINITY);
  a.set({22, 11}, NAN);
  eye.fill(0);
  zero.fill(0);
  for (int64_t k = 0; k < 16; ++k) eye.set({k, k}, 1.0);
  d.poison();
  check_emulator(dot_kernel(f32, {32, 16}, {16, 16}, kTf32).build(), {a, eye, zero, d}, 4, 0.0);
  // normal data: the MMA rounds its sum once per k step of 8, the interpreter once
  HostTensor x(f32, {64, 64}), y(f32, {64, 32}), c(f32, {64, 32}), out(f32, {64, 32});
  x.fill_normal(1, 0, 1);
  y.fill_normal(2, 0, 1);
  c.fill_normal(3, 0, 1);
  out.poison();
  check_emulator(dot_kernel(f32, {64, 64}, {64, 32}, kTf32).build(), {x, y, c, out}, 4, 1e-5);
  // [4, 32, 64] @ [4, 64, 32] in K steps of 16, the accumulator a loop-carried Var (tf32 and bf16)
  for (auto [in, p] : {std::pair{f32, InputPrecision::tf32}, std::pair{bf16, InputPrecision::ieee}}) {
    INFO(ir::name(in));
    HostTensor la(in, {4, 32, 64}), lb(in, {4, 64, 32}), lc(f32, {4, 32, 32}), ld(f32, {4, 32, 32});
    if (p == InputPrecision::tf32) {
      fill_tf32_near_integers(la, 21, 6);
      fill_tf32_near_integers(lb, 22, 6);
    } else {
      fill_small_integers(la, 21, 6);
      fill_small_integers(lb, 22, 6);
    }
    fill_small_integers(lc, 23, 20);
    ld.poison();
    check_emulator(dot_loop_kernel(in, {4, 32, 64}, {4, 64, 32}, 16, {.input_precision = p}).build(), {la, lb, lc, ld}, 4, 0.0);
  }
}

TEST_CASE("PTX: tf32 and batched dots through both backends assemble with ptxas for sm_90a") {
  if (testing::no_ptxas()) return;
  struct Case {
    DType in;
    Shape a, b;
    InputPrecision p;
    int warps;
    const char* want;  // in the PTX
  };
  const Case cases[] = {
      {f32, {64, 32}, {32, 64}, InputPrecision::tf32, 4, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"},
      {f32, {8, 16}, {16, 16}, InputPrecision::tf32, 4, "cvt.rna.tf32.f32"},
      {bf16, {4, 32, 64}, {4, 64, 32}, InputPrecision::ieee, 4, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"},
      {f32, {4, 16, 16}, {4, 16, 8}, InputPrecision::tf32, 4, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"},
      {f32, {2, 16, 16}, {2, 16, 16}, InputPrecision::ieee, 4, "ld.shared"},  // FMA
  };
  for (const Case& c : cases)
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(ir::name(c.in) << ir::shape_string(c.a) << " @ " << ir::shape_string(c.b) << " " << ir::name(c.p) << " via "
                          << jit::to_string(backend));
      const jit::CompiledKernel k = testing::assemble_sm90a(dot_kernel(c.in, c.a, c.b, {.input_precision = c.p}).build(), backend, c.warps);
      CHECK(k.ptx.find(c.want) != std::string::npos);
      CHECK(k.ptx.find("wgmma") == std::string::npos);
      CHECK((k.ptx.find("mma.sync") != std::string::npos) == (std::string(c.want).find("mma.sync") != std::string::npos));
      if (c.p == InputPrecision::tf32) CHECK(k.ptx.find("cvt.rna.tf32.f32") != std::string::npos);
      CHECK(k.info.spill_store_bytes == 0);
    }
}
