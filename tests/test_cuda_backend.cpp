// Backend B (per-thread IR -> CUDA C++ -> nvrtc -> PTX): the printed source, a hand-built kernel
// that uses every per-thread op, and the library kernels through the pipeline, each compiled by
// nvrtc for sm_90a and assembled with no spills. Needs no GPU; skips visibly without nvrtc.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dsl/lang.hpp"
#include "jit/assign_layouts.hpp"
#include "jit/canonicalize.hpp"
#include "jit/compile.hpp"
#include "jit/cuda_backend.hpp"
#include "jit/llvm_backend.hpp"
#include "jit/lower.hpp"
#include "jit/nvrtc.hpp"
#include "jit/ptx_compiler.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/gemm.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "host_bits.hpp"

using namespace tilejit::jit;
using tilejit::ir::DType;
using pir::Op;
using pir::V;

namespace {

using ::testing::contains;

bool have_nvrtc() {
  std::string why;
  if (nvrtc_available(&why)) return true;
  MESSAGE("skipped: nvrtc is not available here (" << why << ")");
  return false;
}

// Builds a per-thread function by hand.
struct FuncBuilder {
  pir::Func f;
  std::vector<pir::Block*> blocks{&f.body};

  explicit FuncBuilder(std::string name, int threads = 128) {
    f.name = std::move(name);
    f.num_threads = threads;
  }
  pir::Inst& push(pir::Inst in) {
    blocks.back()->insts.push_back(std::move(in));
    return blocks.back()->insts.back();
  }
  V emit(Op op, pir::Ty t, std::vector<V> args, int64_t imm = 0, double fimm = 0) {
    pir::Inst in;
    in.op = op;
    in.args = std::move(args);
    in.imm = imm;
    in.fimm = fimm;
    V r = f.new_value(t);
    in.results = {r};
    push(std::move(in));
    return r;
  }
  void emit0(Op op, std::vector<V> args, int64_t imm = 0) {
    pir::Inst in;
    in.op = op;
    in.args = std::move(args);
    in.imm = imm;
    push(std::move(in));
  }
  V param(const std::string& name, pir::Ty t) {
    f.params.push_back({name, t});
    return emit(Op::param, t, {}, static_cast<int64_t>(f.params.size() - 1));
  }
  V ci(DType d, int64_t v) { return emit(Op::constant, pir::scalar(d), {}, v); }
  V cf(DType d, double v) { return emit(Op::constant, pir::scalar(d), {}, 0, v); }
  V bin(Op op, V a, V b) { return emit(op, f.types[a], {a, b}); }
  V un(Op op, V a) { return emit(op, f.types[a], {a}); }
  V cmp(pir::Pred p, V a, V b) { return emit(Op::cmp, pir::scalar(DType::i1), {a, b}, static_cast<int64_t>(p)); }
  V cast(V a, DType to) { return emit(Op::cast, pir::scalar(to), {a}); }
};

const std::vector<DType> kInts = {DType::i1, DType::i8, DType::i16, DType::i32, DType::i64, DType::u8, DType::u16, DType::u32, DType::u64};
const std::vector<DType> kFloats = {DType::f16, DType::bf16, DType::f32, DType::f64};

// A kernel that uses every per-thread op on every dtype it applies to. `llvm_subset` leaves out
// what only this backend accepts (shuffles of non-32-bit values, atomics on 8/16-bit integers), so
// that the same function also goes through the LLVM backend.
pir::Func every_op_kernel(bool llvm_subset) {
  FuncBuilder b(llvm_subset ? "every_op" : "every_op_cuda");
  b.f.smem_bytes = 1024;
  std::map<DType, V> ptr;
  for (DType d : kInts) ptr[d] = b.param(fmt::format("P_{}", tilejit::ir::name(d)), pir::pointer(d));
  for (DType d : kFloats) ptr[d] = b.param(fmt::format("P_{}", tilejit::ir::name(d)), pir::pointer(d));
  ptr[DType::f8e4m3] = b.param("P_f8", pir::pointer(DType::f8e4m3));
  V n = b.param("n", pir::scalar(DType::i32));
  V scale = b.param("scale", pir::scalar(DType::f32));
  V flag = b.param("flag", pir::scalar(DType::i1));
  V big = b.param("big", pir::scalar(DType::i64));

  V tid = b.emit(Op::thread_id, pir::scalar(DType::i32), {});
  V bx = b.emit(Op::block_id, pir::scalar(DType::i32), {}, 0);
  V by = b.emit(Op::block_id, pir::scalar(DType::i32), {}, 1);
  V bz = b.emit(Op::block_id, pir::scalar(DType::i32), {}, 2);
  V gx = b.emit(Op::grid_dim, pir::scalar(DType::i32), {}, 0);
  V gy = b.emit(Op::grid_dim, pir::scalar(DType::i32), {}, 1);
  V gz = b.emit(Op::grid_dim, pir::scalar(DType::i32), {}, 2);
  V base = b.bin(Op::add, b.bin(Op::mul, b.bin(Op::add, b.bin(Op::mul, bz, gy), by), gx), bx);
  base = b.bin(Op::add, base, b.bin(Op::sub, gz, gz));
  base = b.bin(Op::add, b.bin(Op::mul, base, b.ci(DType::i32, 128)), tid);
  V in_range = b.cmp(pir::Pred::lt, base, n);
  V base64 = b.cast(base, DType::i64);
  int slot = 0;
  // Each result is stored at its own offset, so nothing is dead.
  auto sink = [&](V v) {
    DType d = b.f.types[v].dtype;
    V off = b.bin(Op::add, base64, b.ci(DType::i64, 4096 * ++slot));
    b.emit0(Op::store, {b.emit(Op::gep, pir::pointer(d), {ptr.at(d), off}), v});
  };
  auto load2 = [&](DType d) {
    V p0 = b.emit(Op::gep, pir::pointer(d), {ptr.at(d), base});
    V p1 = b.emit(Op::gep, pir::pointer(d), {ptr.at(d), b.bin(Op::add, base64, big)});
    V other = tilejit::ir::is_float(d) ? b.cf(d, -1.5) : b.ci(d, 1);
    V x = b.emit(Op::load, pir::scalar(d), {p0});                    // unpredicated
    V y = b.emit(Op::load, pir::scalar(d), {p1, in_range, other});   // predicated, padded
    return std::pair{x, y};
  };

  for (DType d : kInts) {
    auto [x, y] = load2(d);
    for (Op op : {Op::add, Op::sub, Op::mul, Op::div, Op::rem, Op::minimum, Op::maximum, Op::bit_and, Op::bit_or, Op::bit_xor,
                  Op::shl, Op::shr, Op::umulhi})
      sink(b.bin(op, x, y));
    for (Op op : {Op::neg, Op::bit_not, Op::abs}) sink(b.un(op, x));
    for (int p = 0; p < 6; ++p) sink(b.cmp(static_cast<pir::Pred>(p), x, y));
    sink(b.emit(Op::select, b.f.types[x], {b.cmp(pir::Pred::ne, x, y), x, y}));
    if (d == DType::u32 || d == DType::i32) {
      sink(b.emit(Op::byte_perm, b.f.types[x], {x, y, x}));                    // a runtime selector
      sink(b.emit(Op::byte_perm, b.f.types[x], {x, b.ci(d, 0), b.ci(d, 0xBA98)}));  // sign replication
    }
    b.emit0(Op::store, {b.emit(Op::gep, pir::pointer(d), {ptr.at(d), base}), x, in_range});  // predicated store
  }
  for (DType d : kFloats) {
    auto [x, y] = load2(d);
    for (Op op : {Op::add, Op::sub, Op::mul, Op::div, Op::rem, Op::minimum, Op::maximum}) sink(b.bin(op, x, y));
    std::vector<Op> un{Op::neg, Op::abs, Op::sqrt, Op::floor, Op::ceil};
    if (d != DType::f64)
      for (Op op : {Op::exp2, Op::log2, Op::exp, Op::log, Op::rsqrt, Op::tanh, Op::sin, Op::cos, Op::erf}) un.push_back(op);
    for (Op op : un) sink(b.un(op, x));
    for (int p = 0; p < 6; ++p) sink(b.cmp(static_cast<pir::Pred>(p), x, y));
    sink(b.emit(Op::select, b.f.types[x], {flag, x, y}));
    if (d == DType::f32 || d == DType::f64) sink(b.emit(Op::fma, b.f.types[x], {x, y, x}));
    b.emit0(Op::store, {b.emit(Op::gep, pir::pointer(d), {ptr.at(d), base}), y, in_range});
  }
  // Shifts, divisions and remainders by constants (decided when printing) on a few widths.
  for (DType d : {DType::i8, DType::u16, DType::i32, DType::u32, DType::i64}) {
    V x = b.emit(Op::load, pir::scalar(d), {b.emit(Op::gep, pir::pointer(d), {ptr.at(d), base})});
    const int w = tilejit::ir::bit_width(d);
    for (int64_t k : {int64_t{3}, int64_t{w - 1}, int64_t{w}, int64_t{w + 5}, int64_t{-1}}) {
      sink(b.bin(Op::shl, x, b.ci(d, k)));
      sink(b.bin(Op::shr, x, b.ci(d, k)));
    }
    for (int64_t k : {int64_t{7}, int64_t{0}, int64_t{-1}, int64_t{-3}}) {
      sink(b.bin(Op::div, x, b.ci(d, k)));
      sink(b.bin(Op::rem, x, b.ci(d, k)));
    }
  }
  // Casts between every pair of (non-fp8) dtypes.
  std::vector<DType> all = kInts;
  all.insert(all.end(), kFloats.begin(), kFloats.end());
  std::map<DType, V> val;
  for (DType d : all) val[d] = b.emit(Op::load, pir::scalar(d), {b.emit(Op::gep, pir::pointer(d), {ptr.at(d), b.ci(DType::i32, 7)})});
  for (DType from : all)
    for (DType to : all)
      if (from != to) sink(b.cast(val[from], to));
  // Bitcasts of same-width scalars, and pointer <-> u64.
  const std::vector<std::pair<DType, DType>> same_width = {
      {DType::f32, DType::i32}, {DType::i32, DType::f32}, {DType::f32, DType::u32}, {DType::u32, DType::f32},
      {DType::f16, DType::i16}, {DType::u16, DType::f16}, {DType::bf16, DType::u16}, {DType::i16, DType::bf16},
      {DType::f16, DType::bf16}, {DType::f64, DType::i64}, {DType::u64, DType::f64}, {DType::i8, DType::u8}};
  for (auto [from, to] : same_width) sink(b.emit(Op::bitcast, pir::scalar(to), {val[from]}));
  V as_int = b.emit(Op::bitcast, pir::scalar(DType::u64), {ptr[DType::f32]});
  V back = b.emit(Op::bitcast, pir::pointer(DType::f32), {b.bin(Op::add, as_int, b.ci(DType::u64, 64))});
  b.emit0(Op::store, {back, scale});
  // fp8: storage only (loads, stores, constants, bit patterns).
  {
    V p8 = b.emit(Op::gep, pir::pointer(DType::f8e4m3), {ptr[DType::f8e4m3], base});
    V x8 = b.emit(Op::load, pir::scalar(DType::f8e4m3), {p8, in_range, b.ci(DType::f8e4m3, 0x38)});
    b.emit0(Op::store, {b.emit(Op::gep, pir::pointer(DType::f8e4m3), {p8, b.ci(DType::u32, 1)}), x8, flag});
    sink(b.emit(Op::bitcast, pir::scalar(DType::u8), {x8}));
  }
  // Constants that need care: infinities, NaN, -0, values exact only in the narrow type, extremes.
  for (double c : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN(), -0.0, 0.1, 65504.0, 1e-7, 3.0e38})
    for (DType d : kFloats) sink(b.cf(d, c));
  for (int64_t c : {int64_t{0}, int64_t{-1}, int64_t{1} << 31, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()})
    for (DType d : kInts) sink(b.ci(d, c));

  // Atomics, plain and predicated.
  std::vector<DType> atomic_types{DType::i32, DType::u32, DType::i64, DType::u64, DType::f32, DType::f64, DType::f16, DType::bf16};
  if (!llvm_subset)
    for (DType d : {DType::i8, DType::u8, DType::i16, DType::u16}) atomic_types.push_back(d);
  for (DType d : atomic_types) {
    V p = b.emit(Op::gep, pir::pointer(d), {ptr.at(d), b.ci(DType::i32, 3)});
    sink(b.emit(Op::atomic_add, pir::scalar(d), {p, val[d]}));
    sink(b.emit(Op::atomic_add, pir::scalar(d), {p, val[d], in_range}));
  }
  // Shared memory, barriers, shuffles.
  V off = b.bin(Op::mul, tid, b.ci(DType::i32, 4));
  b.emit0(Op::store_shared, {off, val[DType::f32]});
  b.emit0(Op::store_shared, {b.bin(Op::add, off, b.ci(DType::i32, 512)), val[DType::i32], in_range});
  b.emit0(Op::barrier, {});
  V sf = b.emit(Op::load_shared, pir::scalar(DType::f32), {b.bin(Op::bit_xor, off, b.ci(DType::i32, 4))});
  V si = b.emit(Op::load_shared, pir::scalar(DType::i32), {b.bin(Op::add, off, b.ci(DType::i32, 512))});
  V sb = b.emit(Op::load_shared, pir::scalar(DType::u8), {tid});
  b.emit0(Op::barrier, {});
  sink(sf);
  sink(si);
  sink(sb);
  for (int64_t m : {1, 2, 4, 8, 16}) {
    sink(b.emit(Op::shfl_xor, pir::scalar(DType::f32), {sf}, m));
    sink(b.emit(Op::shfl_xor, pir::scalar(DType::i32), {si}, m));
  }
  if (!llvm_subset)
    for (DType d : {DType::f16, DType::bf16, DType::i1, DType::i8, DType::u16, DType::u64, DType::f64})
      sink(b.emit(Op::shfl_xor, pir::scalar(d), {val[d]}, 1));

  // mma.sync for both operand types.
  for (DType d : {DType::bf16, DType::f16}) {
    auto [x, y] = load2(d);
    std::vector<V> args;
    for (int i = 0; i < 6; ++i) args.push_back(b.emit(Op::pack2, pir::scalar(DType::u32), {i % 2 ? x : y, i % 3 ? y : x}));
    for (int i = 0; i < 4; ++i) args.push_back(b.bin(Op::mul, scale, b.cf(DType::f32, i)));
    pir::Inst in;
    in.op = Op::mma_16816;
    in.args = args;
    in.imm = static_cast<int64_t>(d);
    for (int i = 0; i < 4; ++i) in.results.push_back(b.f.new_value(pir::scalar(DType::f32)));
    std::vector<V> rs = in.results;
    b.push(std::move(in));
    for (V r : rs) sink(r);
  }
  sink(b.emit(Op::pack2, pir::scalar(DType::u32), {val[DType::i16], val[DType::u16]}));
  // Vector accesses of 1, 2 and 4 words (aligned, unpredicated) and unpacking of 16-bit halves.
  for (int64_t words : {1, 2, 4}) {
    V p = b.emit(Op::gep, pir::pointer(DType::u32), {ptr[DType::u32], b.bin(Op::mul, base, b.ci(DType::i32, words))});
    pir::Inst lv;
    lv.op = Op::load_vec;
    lv.args = {p};
    lv.imm = words;
    for (int64_t i = 0; i < words; ++i) lv.results.push_back(b.f.new_value(pir::scalar(DType::u32)));
    std::vector<V> w = lv.results;
    b.push(std::move(lv));
    pir::Inst up;
    up.op = Op::unpack2;
    up.args = {w[0]};
    up.results = {b.f.new_value(pir::scalar(DType::bf16)), b.f.new_value(pir::scalar(DType::i16))};
    std::vector<V> halves = up.results;
    b.push(std::move(up));
    sink(halves[0]);
    sink(halves[1]);
    std::vector<V> st{b.emit(Op::gep, pir::pointer(DType::u32), {p, b.ci(DType::i32, 4096)})};
    for (V x : w) st.push_back(b.bin(Op::add, x, b.ci(DType::u32, 1)));
    b.emit0(Op::store_vec, st);
  }

  // A loop whose carried values swap (the yields must read the old values), with an if inside.
  {
    V a0 = val[DType::f32], b0 = b.cf(DType::f32, 2.0), k0 = val[DType::i64];
    pir::Inst loop;
    loop.op = Op::for_;
    loop.args = {b.ci(DType::i32, 0), n, b.ci(DType::i32, 3), a0, b0, k0};
    pir::Block body;
    V iv = b.f.new_value(pir::scalar(DType::i32));
    V ca = b.f.new_value(pir::scalar(DType::f32)), cb = b.f.new_value(pir::scalar(DType::f32));
    V ck = b.f.new_value(pir::scalar(DType::i64));
    body.args = {iv, ca, cb, ck};
    b.blocks.push_back(&body);
    V odd = b.cmp(pir::Pred::ne, b.bin(Op::bit_and, iv, b.ci(DType::i32, 1)), b.ci(DType::i32, 0));
    pir::Inst iff;
    iff.op = Op::if_;
    iff.args = {odd};
    pir::Block then_b, else_b;
    b.blocks.push_back(&then_b);
    V t = b.bin(Op::add, ca, b.cf(DType::f32, 0.5));
    b.emit0(Op::yield, {t, ck});
    b.blocks.pop_back();
    b.blocks.push_back(&else_b);
    V e = b.bin(Op::mul, cb, scale);
    b.emit0(Op::yield, {e, b.bin(Op::add, ck, b.cast(iv, DType::i64))});
    b.blocks.pop_back();
    iff.regions = {std::move(then_b), std::move(else_b)};
    V r0 = b.f.new_value(pir::scalar(DType::f32)), r1 = b.f.new_value(pir::scalar(DType::i64));
    iff.results = {r0, r1};
    b.push(std::move(iff));
    b.emit0(Op::yield, {cb, r0, r1});  // swap: a <- b, b <- if result
    b.blocks.pop_back();
    loop.regions = {std::move(body)};
    V la = b.f.new_value(pir::scalar(DType::f32)), lb = b.f.new_value(pir::scalar(DType::f32));
    V lk = b.f.new_value(pir::scalar(DType::i64));
    loop.results = {la, lb, lk};
    b.push(std::move(loop));
    sink(la);
    sink(lb);
    sink(lk);
  }
  return std::move(b.f);
}

// Hopper ops: transaction barriers, a TMA copy, warpgroup MMA from m64n8k16 to m64n256k16.
pir::Func hopper_kernel(std::vector<int64_t> widths) {
  FuncBuilder b("hopper_ops");
  b.f.smem_bytes = 4096;
  V out = b.param("Out", pir::pointer(DType::f32));
  V scale = b.param("scale", pir::scalar(DType::f32));
  V tid = b.emit(Op::thread_id, pir::scalar(DType::i32), {});
  V base = b.emit(Op::block_id, pir::scalar(DType::i32), {}, 0);
  int slot = 0;
  auto sink = [&](V v) { b.emit0(Op::store, {b.emit(Op::gep, pir::pointer(DType::f32), {out, b.bin(Op::add, tid, b.ci(DType::i32, 128 * slot++))}), v}); };
  // Hopper: transaction barriers, a TMA copy, warpgroup MMA (m64n8k16 .. m64n256k16).
  {
    V tmap = b.param("A_tensor_map", pir::pointer(DType::u8));
    V sbase = b.emit(Op::smem_addr, pir::scalar(DType::u32), {b.ci(DType::i32, 0)});
    V bar = b.bin(Op::add, sbase, b.ci(DType::u32, 512));
    b.emit0(Op::mbar_init, {bar, b.ci(DType::i32, 1)});
    b.emit0(Op::fence_mbar_init, {});
    b.emit0(Op::barrier, {});
    b.emit0(Op::mbar_expect_tx, {bar, b.ci(DType::i32, 256)});
    b.emit0(Op::tma_load_2d, {sbase, tmap, base, b.ci(DType::i32, 0), bar});
    b.emit0(Op::mbar_wait, {bar, b.ci(DType::i32, 0)});
    b.emit0(Op::mbar_arrive, {b.bin(Op::add, bar, b.ci(DType::u32, 8))});
    b.emit0(Op::fence_proxy_async, {});
    V desc = b.bin(Op::bit_or, b.cast(sbase, DType::u64), b.ci(DType::u64, int64_t{1} << 62));
    for (int64_t nn : widths) {
      for (DType d : {DType::bf16, DType::f16}) {
        b.emit0(Op::wgmma_fence, {});
        pir::Inst w;
        w.op = Op::wgmma;
        w.args = {desc, b.bin(Op::add, desc, b.ci(DType::u64, 2))};
        for (int64_t i = 0; i < nn / 2; ++i) w.args.push_back(b.bin(Op::mul, scale, b.cf(DType::f32, double(i))));
        w.imm = nn | (static_cast<int64_t>(d) << 16);
        for (int64_t i = 0; i < nn / 2; ++i) w.results.push_back(b.f.new_value(pir::scalar(DType::f32)));
        std::vector<V> acc = w.results;
        b.push(std::move(w));
        b.emit0(Op::wgmma_commit, {});
        pir::Inst wait;
        wait.op = Op::wgmma_wait;
        wait.args = acc;
        wait.imm = 0;
        for (size_t i = 0; i < acc.size(); ++i) wait.results.push_back(b.f.new_value(pir::scalar(DType::f32)));
        std::vector<V> done = wait.results;
        b.push(std::move(wait));
        V total = done[0];
        for (size_t i = 1; i < done.size(); ++i) total = b.bin(Op::add, total, done[i]);
        sink(total);
      }
    }
  }
  return std::move(b.f);
}

// Tile IR -> per-thread IR without the Hopper planners (jit::lower runs them all).
pir::Func lower_plain(const tilejit::ir::Function& input, int num_warps = 4) {
  tilejit::ir::Function f = input;
  canonicalize(f);
  LayoutPlan plan = assign_layouts(f, num_warps);
  return lower_to_threads(f, plan);
}

// nvrtc -> PTX -> cubin, and the same function through the LLVM backend: checks the entry and
// that nothing spills. Where backend A spills too (the lowering's register pressure, not this
// backend's), the spills are reported rather than failed.
void compile_and_assemble(const pir::Func& f) {
  CudaOutput out = emit_ptx_nvrtc(f, "sm_90a");
  CHECK(contains(out.ptx, ".entry " + f.name));
  CubinResult c = ptx_to_cubin(out.ptx, "sm_90a", f.name);
  REQUIRE(c.kernels.size() == 1);
  const KernelInfo& k = c.kernels[0];
  CHECK(k.name == f.name);
  CHECK(!c.cubin.empty());
  LlvmOutput l = emit_ptx_llvm(f, "sm_90a");
  CubinResult lc = ptx_to_cubin(l.ptx, "sm_90a", f.name);
  REQUIRE(lc.kernels.size() == 1);
  const KernelInfo& lk = lc.kernels[0];
  MESSAGE(fmt::format("{}: nvrtc backend {:.0f} ms, {}\n{}  LLVM backend {:.0f} ms, {}", f.name, out.nvrtc_ms, k.to_string(),
                      std::string(f.name.size(), ' '), l.ir_ms + l.ptx_ms, lk.to_string()));
  const bool llvm_spills = lk.spill_store_bytes + lk.spill_load_bytes > 0;
  if (llvm_spills) {
    MESSAGE("the LLVM backend spills too for " << f.name << ": not counted against the nvrtc backend");
  } else {
    CHECK(k.spill_store_bytes == 0);
    CHECK(k.spill_load_bytes == 0);
  }
}

}  // namespace

TEST_CASE("the printed source: signature, launch bounds, shared memory, literals") {
  FuncBuilder b("tiny", 256);
  b.f.smem_bytes = 64;
  V x = b.param("X", pir::pointer(DType::bf16));
  V flag = b.param("flag", pir::scalar(DType::i1));
  V bits = b.param("bits", pir::pointer(DType::i1));
  V n = b.param("n", pir::scalar(DType::u64));
  V h = b.param("h", pir::scalar(DType::f16));
  (void)flag;
  (void)bits;
  (void)n;
  V tid = b.emit(Op::thread_id, pir::scalar(DType::i32), {});
  V p = b.emit(Op::gep, pir::pointer(DType::bf16), {x, tid});
  V v = b.emit(Op::load, pir::scalar(DType::bf16), {p});
  V s = b.bin(Op::add, v, b.cf(DType::bf16, 0.5));
  b.emit0(Op::store, {p, b.bin(Op::mul, s, b.cast(h, DType::bf16))});
  b.emit0(Op::store_shared, {b.ci(DType::i32, 0), b.cf(DType::f32, -0.1)});
  b.emit0(Op::store_shared, {b.ci(DType::i32, 8), b.ci(DType::i64, std::numeric_limits<int64_t>::min())});
  std::string src = print_cuda(b.f);
  CHECK(contains(src, "extern \"C\" __global__ void __launch_bounds__(256) tiny("));
  CHECK(contains(src, "__nv_bfloat16* __restrict__ p0_X, bool p1_flag, unsigned char* __restrict__ p2_bits, "
                      "unsigned long long p3_n, __half p4_h)"));
  CHECK(contains(src, "extern __shared__ __align__(1024) unsigned char tilejit_smem[];"));
  CHECK(contains(src, "#include <cuda_fp16.h>"));
  CHECK(contains(src, "#include <cuda_bf16.h>"));
  CHECK(!contains(src, "<cstdint>"));
  CHECK(contains(src, "__ushort_as_bfloat16((unsigned short)0x3f00u)"));  // 0.5 in bf16
  CHECK(contains(src, "(-0x1.99999ap-4f)"));                              // -0.1 rounded to f32, exactly
  CHECK(contains(src, "(long long)0x8000000000000000ull"));
  // bf16 arithmetic runs in f32 and rounds once per op.
  CHECK(contains(src, "__float2bfloat16_rn(__fadd_rn(__bfloat162float(v"));
  if (!have_nvrtc()) return;
  compile_and_assemble(b.f);
  // Unused constants and helpers do not fill nvrtc's log with warnings.
  CHECK(nvrtc_compile(src, b.f.name, "sm_90a", {"--fmad=false"}).log.empty());
}

TEST_CASE("a kernel with every per-thread op compiles through nvrtc and assembles without spills") {
  pir::Func f = every_op_kernel(false);
  std::string src = print_cuda(f);
  for (const char* part : {"tj_ld_b16(", "tj_ld_u8(", "tj_ld_b64(", "tj_st_b32(", "__syncthreads();", "uint4", "make_uint2(", "__shfl_xor_sync(0xffffffffu",
                           "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                           "atomicAdd(", "tj_atomic_add_small(", "blockIdx.z", "gridDim.y", "tj_erf(", "tj_frem(", "tj_f2i<"})
    CHECK_MESSAGE(contains(src, part), part);
  if (!have_nvrtc()) return;
  CudaOutput out = emit_ptx_nvrtc(f, "sm_90a");
  // The approximate instructions the LLVM backend uses, and no contraction into fma: the f32 fmas
  // are the kernel's own Op::fma and the exact remainder's three steps (tj_frem_step) for each of
  // its f32, f16 and bf16 `%`.
  for (const char* part : {"ex2.approx.ftz.f32", "max.NaN.f32", "lg2.approx.f32", "rsqrt.approx.f32", "sin.approx.f32", "cos.approx.f32",
                           "tanh.approx.f32", "div.rn.f32", "sqrt.rn.f32", "ld.global.u8", "st.global.b64", "bar.sync",
                           "shfl.sync.bfly.b32", "mma.sync.aligned.m16n8k16", "prmt.b32"})
    CHECK_MESSAGE(contains(out.ptx, part), part);
  size_t fmas = 0;
  for (size_t at = out.ptx.find("fma.rn.f32"); at != std::string::npos; at = out.ptx.find("fma.rn.f32", at + 1)) ++fmas;
  CHECK(fmas == 1 + 3 * 3);
  CubinResult c = ptx_to_cubin(out.ptx, "sm_90a", f.name);
  REQUIRE(c.kernels.size() == 1);
  MESSAGE(c.kernels[0].to_string());
  CHECK(c.kernels[0].spill_store_bytes == 0);
  CHECK(c.kernels[0].spill_load_bytes == 0);
}

TEST_CASE("the every-op kernel is also valid input for the LLVM backend (same per-thread IR, both backends)") {
  pir::Func f = every_op_kernel(true);
  LlvmOutput l = emit_ptx_llvm(f, "sm_90a");
  CHECK(contains(l.ptx, ".entry every_op"));
  CHECK(contains(l.ptx, "prmt.b32"));
  if (!have_nvrtc()) return;
  compile_and_assemble(f);
}

TEST_CASE("Hopper ops: mbarrier, TMA, wgmma up to m64n256k16, through both backends") {
  pir::Func f = hopper_kernel({8, 64, 256});
  std::string src = print_cuda(f);
  for (const char* part : {"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16",
                           "wgmma.wait_group.sync.aligned 0;", "wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;",
                           "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes", "tj_mbar_wait(",
                           "mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64", "fence.mbarrier_init.release.cluster;",
                           "fence.proxy.async.shared::cta;", "__cvta_generic_to_shared"})
    CHECK_MESSAGE(contains(src, part), part);
  if (!have_nvrtc()) return;
  // 128 accumulators in one asm statement compile; this function needs more registers than there are.
  CHECK(contains(emit_ptx_nvrtc(f, "sm_90a").ptx, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"));
  compile_and_assemble(hopper_kernel({8, 32, 128}));
}

TEST_CASE("library kernels through the pipeline compile with nvrtc and assemble without spills") {
  using namespace tilejit::lang;
  Kernel vector_add = kernel("vector_add", [](Builder& k) {
    auto X = k.pointer("X", f32, {.align_bytes = 16});
    auto Y = k.pointer("Y", f32, {.align_bytes = 16});
    auto Out = k.pointer("Out", f32, {.align_bytes = 16});
    auto n = k.scalar<int>("n");
    auto offs = program_id(0) * 128 + arange(0, 128);
    auto mask = offs < n;
    store(Out + offs, load(X + offs, mask) + load(Y + offs, mask), mask);
  });
  Kernel softmax = kernel("softmax", [](Builder& k) {
    auto T = k.meta_dtype("DTYPE", f32);
    auto X = k.tensor("X", T, 2);
    auto Y = k.tensor("Y", T, 2);
    auto r = program_id(0);
    auto x = cast(f32, load(X.block({r, 0}, {1, 128}), -INFINITY));
    auto e = exp(x - max(x, 1)[col]);
    store(Y.block({r, 0}, {1, 128}), cast(T, e / sum(e, 1)[col]));
  });
  std::vector<std::pair<std::string, tilejit::ir::Function>> kernels;
  kernels.emplace_back("vector_add", vector_add.build());
  kernels.emplace_back("softmax f32", softmax.build({{"DTYPE", f32}}));
  kernels.emplace_back("softmax bf16", softmax.build({{"DTYPE", bf16}}));
  kernels.emplace_back("gemm bf16", tilejit::kernels::gemm().build({{"BLOCK_K", 32}}));  // the mma.sync path
  kernels.emplace_back("attention causal", tilejit::kernels::attention_forward().build({{"CAUSAL", true}}));
  kernels.emplace_back("attention f16", tilejit::kernels::attention_forward().build({{"DTYPE", f16}}));
  for (auto& [label, fn] : kernels) {
    CAPTURE(label);
    pir::Func f = lower_plain(fn);
    std::string src = print_cuda(f);
    CHECK(contains(src, fmt::format("__launch_bounds__({})", f.num_threads)));
    // Tensor cores either way: wgmma where an operand is a TMA-shaped window (sm_90a), mma.sync else.
    if (label.starts_with("gemm") || label.starts_with("attention"))
      CHECK((contains(src, "mma.sync.aligned.m16n8k16") || contains(src, "wgmma.mma_async")));
    if (label.starts_with("attention")) CHECK(contains(src, "wgmma.mma_async"));
    if (!have_nvrtc()) return;
    compile_and_assemble(f);
  }
}

TEST_CASE("jit::compile with Backend::Nvrtc: the generic GEMM and the TMA + wgmma GEMM") {
  if (!have_nvrtc()) return;
  CompileOptions opts;
  opts.backend = Backend::Nvrtc;
  CompiledKernel k = compile(tilejit::kernels::gemm().build({{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}}), opts);
  CHECK(contains(k.backend_source, "__launch_bounds__"));
  CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
  CHECK(!k.cubin.empty());
  opts.num_warps = 8;
  CompiledKernel t = compile(tilejit::kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}}), opts);
  CHECK(contains(t.ptx, "wgmma.mma_async"));
  CHECK(contains(t.ptx, "cp.async.bulk.tensor"));
  CHECK_MESSAGE(t.info.spill_store_bytes == 0, t.info.to_string());
}

TEST_CASE("errors name the kernel and what is wrong") {
  SUBCASE("fp8 conversions") {
    FuncBuilder b("fp8_cast");
    V p = b.param("X", pir::pointer(DType::f8e5m2));
    V x = b.emit(Op::load, pir::scalar(DType::f8e5m2), {p});
    b.emit0(Op::store, {b.param("Y", pir::pointer(DType::f32)), b.cast(x, DType::f32)});
    CHECK_THROWS_WITH(print_cuda(b.f), doctest::Contains("kernel 'fp8_cast': CUDA backend: fp8 conversions are not supported"));
  }
  SUBCASE("f64 transcendental") {
    FuncBuilder b("f64_exp");
    V s = b.param("s", pir::scalar(DType::f64));
    b.emit0(Op::store, {b.param("Y", pir::pointer(DType::f64)), b.un(Op::exp, s)});
    CHECK_THROWS_WITH(print_cuda(b.f), doctest::Contains("exp on f64 is not supported on the GPU yet"));
  }
  SUBCASE("a value used outside its region") {
    FuncBuilder b("scoped");
    V s = b.param("s", pir::scalar(DType::i1));
    pir::Inst iff;
    iff.op = Op::if_;
    iff.args = {s};
    pir::Block then_b, else_b;
    b.blocks.push_back(&then_b);
    V inner = b.emit(Op::thread_id, pir::scalar(DType::i32), {});
    b.emit0(Op::yield, {});
    b.blocks.pop_back();
    b.blocks.push_back(&else_b);
    b.emit0(Op::yield, {});
    b.blocks.pop_back();
    iff.regions = {std::move(then_b), std::move(else_b)};
    b.push(std::move(iff));
    b.emit0(Op::store, {b.param("Y", pir::pointer(DType::i32)), inner});
    const std::string expected = fmt::format("value %{} used before its definition", inner);
    CHECK_THROWS_WITH(print_cuda(b.f), doctest::Contains(expected.c_str()));
  }
  SUBCASE("a kernel name that is not an identifier") {
    FuncBuilder b("bad-name");
    CHECK_THROWS_WITH(print_cuda(b.f), doctest::Contains("must be a C identifier"));
  }
}

// ---------------------------------------------------------------- on the GPU: both backends agree

namespace {

// One elementwise kernel per source dtype: every op that applies to it, every cast from it, on
// inputs X and Y (Y loaded predicated, padded where the predicate is off). Result k of element i
// goes to Out + 8 * (k * n + i) as its own dtype (i1 as a byte).
struct DiffKernel {
  pir::Func f;
  std::vector<std::string> labels;  // per result slot
  std::vector<DType> types;
};

DiffKernel diff_kernel(DType d, int n) {
  FuncBuilder b(fmt::format("diff_{}", tilejit::ir::name(d)));
  DiffKernel out;
  V X = b.param("X", pir::pointer(d)), Y = b.param("Y", pir::pointer(d));
  V Out = b.param("Out", pir::pointer(DType::u8));
  V tid = b.emit(Op::thread_id, pir::scalar(DType::i32), {});
  V gid = b.bin(Op::add, b.bin(Op::mul, b.emit(Op::block_id, pir::scalar(DType::i32), {}, 0), b.ci(DType::i32, 128)), tid);
  V out_base = b.emit(Op::bitcast, pir::scalar(DType::u64), {Out});
  V gid64 = b.cast(gid, DType::u64);
  auto sink = [&](V v, std::string label) {
    DType t = b.f.types[v].dtype;
    V slot = b.bin(Op::add, b.bin(Op::mul, b.ci(DType::u64, static_cast<int64_t>(out.labels.size())), b.ci(DType::u64, n)), gid64);
    V addr = b.bin(Op::add, out_base, b.bin(Op::mul, slot, b.ci(DType::u64, 8)));
    b.emit0(Op::store, {b.emit(Op::bitcast, pir::pointer(t), {addr}), v});
    out.labels.push_back(std::move(label));
    out.types.push_back(t);
  };
  const bool fp = tilejit::ir::is_float(d);
  V x = b.emit(Op::load, pir::scalar(d), {b.emit(Op::gep, pir::pointer(d), {X, gid})});
  V pred = b.cmp(pir::Pred::ne, b.bin(Op::rem, gid, b.ci(DType::i32, 3)), b.ci(DType::i32, 0));
  V y = b.emit(Op::load, pir::scalar(d), {b.emit(Op::gep, pir::pointer(d), {Y, gid}), pred, fp ? b.cf(d, -2.5) : b.ci(d, 3)});
  sink(x, "load");
  sink(y, "predicated load");
  std::vector<Op> bins{Op::add, Op::sub, Op::mul, Op::div, Op::rem, Op::minimum, Op::maximum};
  if (!fp)
    for (Op op : {Op::bit_and, Op::bit_or, Op::bit_xor, Op::shl, Op::shr, Op::umulhi}) bins.push_back(op);
  for (Op op : bins) sink(b.bin(op, x, y), pir::op_name(op));
  std::vector<Op> uns{Op::neg, Op::abs};
  if (!fp) uns.push_back(Op::bit_not);
  if (fp) uns.insert(uns.end(), {Op::sqrt, Op::floor, Op::ceil});
  if (fp && d != DType::f64)
    uns.insert(uns.end(), {Op::exp2, Op::log2, Op::exp, Op::log, Op::rsqrt, Op::tanh, Op::sin, Op::cos, Op::erf});
  for (Op op : uns) sink(b.un(op, x), pir::op_name(op));
  static const char* preds[6] = {"eq", "ne", "lt", "le", "gt", "ge"};
  for (int p = 0; p < 6; ++p) sink(b.cmp(static_cast<pir::Pred>(p), x, y), fmt::format("cmp {}", preds[p]));
  sink(b.emit(Op::select, pir::scalar(d), {pred, x, y}), "select");
  if (d == DType::f32 || d == DType::f64) sink(b.emit(Op::fma, pir::scalar(d), {x, y, x}), "fma");
  if (d == DType::u32 || d == DType::i32) {
    // random selectors (y: sign-replicating nibbles included), then the dropout mask's constant form
    sink(b.emit(Op::byte_perm, pir::scalar(d), {x, y, y}), "byte_perm");
    sink(b.emit(Op::byte_perm, pir::scalar(d), {x, y, b.ci(d, 0x8D8C)}), "byte_perm sign bytes");
  }
  for (DType to : {DType::i1, DType::i8, DType::i16, DType::i32, DType::i64, DType::u8, DType::u16, DType::u32, DType::u64, DType::f16,
                   DType::bf16, DType::f32, DType::f64})
    if (to != d) sink(b.cast(x, to), fmt::format("cast to {}", tilejit::ir::name(to)));
  if (d == DType::f32 || d == DType::i32)
    for (int64_t m : {1, 16}) sink(b.emit(Op::shfl_xor, pir::scalar(d), {x}, m), fmt::format("shfl_xor {}", m));
  // constant shift amounts and divisors (decided when printing)
  if (!fp)
    for (int64_t k : {int64_t{1}, int64_t{tilejit::ir::bit_width(d) - 1}, int64_t{tilejit::ir::bit_width(d)}, int64_t{-1}}) {
      sink(b.bin(Op::shl, x, b.ci(d, k)), fmt::format("shl by constant {}", k));
      sink(b.bin(Op::shr, x, b.ci(d, k)), fmt::format("shr by constant {}", k));
      sink(b.bin(Op::div, x, b.ci(d, k)), fmt::format("div by constant {}", k));
      sink(b.bin(Op::rem, x, b.ci(d, k)), fmt::format("rem by constant {}", k));
    }
  out.f = std::move(b.f);
  return out;
}

// Inputs: random bit patterns with many special values mixed in (zeros, signs, infinities, NaN,
// subnormals, integer extremes, values at and around the saturation bounds, small shift amounts).
std::vector<uint64_t> diff_inputs(DType d, int n, uint32_t seed) {
  std::mt19937_64 gen(seed);
  const int w = tilejit::ir::bit_width(d);
  const uint64_t mask = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
  std::vector<uint64_t> special;
  auto f32 = [](float v) { return uint64_t{std::bit_cast<uint32_t>(v)}; };
  switch (d) {
    case DType::f32:
      for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -2.5f, 3.5f, 1e-40f, -1e-45f, 3.4e38f, -3.4e38f, INFINITY, -INFINITY, NAN, -NAN,
                      2147483648.0f, -2147483648.0f, 2147483520.0f, 4294967296.0f, 9.3e18f, 1.8e19f, -9.3e18f, 127.5f, -128.9f, 255.9f,
                      65504.0f, 65520.0f, 1e-8f, 7.0f, 100.25f, 1.0f / 3.0f})
        special.push_back(f32(v));
      break;
    case DType::f64:
      for (double v : {0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-310, 1.7e308, double(INFINITY), -double(INFINITY), double(NAN), 9.223372036854775807e18,
                       -9.223372036854775808e18, 1.8446744073709552e19, 2147483647.5, -2147483648.9, 4294967295.9, 1e300, 65519.99,
                       3.0e38, 3.5e38})
        special.push_back(std::bit_cast<uint64_t>(v));
      break;
    case DType::f16:
      for (uint64_t v : {0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x0001, 0x8001, 0x7bff, 0xfbff, 0x3800, 0x4100})
        special.push_back(v);
      break;
    case DType::bf16:
      for (uint64_t v : {0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x0001, 0x8001, 0x7f7f, 0xff7f, 0x4f00, 0xcf00,
                         0x5f00, 0x5f80, 0x3f00})
        special.push_back(v);
      break;
    default:
      for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, ~uint64_t{0}, uint64_t{1} << (w - 1), (uint64_t{1} << (w - 1)) - 1,
                         uint64_t(w - 1), uint64_t(w), uint64_t(w + 1), uint64_t{7}, ~uint64_t{6}})
        special.push_back(v & mask);
  }
  std::vector<uint64_t> v(static_cast<size_t>(n));
  for (auto& e : v) {
    uint64_t r = gen();
    if (r % 4 == 0) e = special[(r >> 8) % special.size()];
    else if (r % 4 == 1 && !tilejit::ir::is_float(d)) e = (r >> 8) % 80;  // small values: shift amounts, divisors
    else e = (r >> 3) & mask;
    if (d == DType::f32 && r % 16 == 2) e = f32(static_cast<float>(static_cast<int64_t>(r >> 20) % 1000) * 0.25f);  // exact halves
  }
  return v;
}

bool is_nan_bits(DType t, uint64_t v) {
  switch (t) {
    case DType::f16: return (v & 0x7c00) == 0x7c00 && (v & 0x3ff);
    case DType::bf16: return (v & 0x7f80) == 0x7f80 && (v & 0x7f);
    case DType::f32: return std::isnan(std::bit_cast<float>(static_cast<uint32_t>(v)));
    case DType::f64: return std::isnan(std::bit_cast<double>(v));
    default: return false;
  }
}

}  // namespace

TEST_CASE("the differential kernels of the GPU test compile through both backends") {
  if (!have_nvrtc()) return;
  for (DType d : {DType::i1, DType::u16, DType::i64, DType::bf16, DType::f32, DType::f64}) {
    DiffKernel k = diff_kernel(d, 128);
    CHECK(contains(emit_ptx_llvm(k.f, "sm_90a").ptx, ".entry " + k.f.name));
    CHECK(contains(emit_ptx_nvrtc(k.f, "sm_90a").ptx, ".entry " + k.f.name));
  }
}

TEST_CASE("GPU: the nvrtc and LLVM backends compute the same bits for every op, cast and input class") {
  namespace rt = tilejit::runtime;
  const rt::Driver& drv = rt::Driver::get();
  if (!drv.available()) {
    MESSAGE("SKIPPED: no GPU: " << drv.unavailable_reason());
    return;
  }
  if (!have_nvrtc()) return;
  const std::string arch = rt::Driver::get().props().arch();
  const int n = 128 * 64;
  int total_mismatch = 0;
  for (DType d : {DType::i1, DType::i8, DType::u8, DType::i16, DType::u16, DType::i32, DType::u32, DType::i64, DType::u64, DType::f16,
                  DType::bf16, DType::f32, DType::f64}) {
    CAPTURE(tilejit::ir::name(d));
    DiffKernel k = diff_kernel(d, n);
    const size_t es = static_cast<size_t>(tilejit::ir::byte_size(d));
    std::vector<uint8_t> xs(n * es), ys(n * es);
    auto xv = diff_inputs(d, n, 1), yv = diff_inputs(d, n, 2);
    for (int i = 0; i < n; ++i) {
      std::memcpy(&xs[static_cast<size_t>(i) * es], &xv[static_cast<size_t>(i)], es);
      std::memcpy(&ys[static_cast<size_t>(i) * es], &yv[static_cast<size_t>(i)], es);
    }
    rt::DeviceBuffer dx(xs.size()), dy(ys.size());
    dx.upload(xs.data(), xs.size());
    dy.upload(ys.data(), ys.size());
    const size_t out_bytes = k.labels.size() * static_cast<size_t>(n) * 8;
    std::vector<std::vector<uint8_t>> results;
    for (int backend = 0; backend < 2; ++backend) {
      std::string ptx = backend == 0 ? emit_ptx_llvm(k.f, arch).ptx : emit_ptx_nvrtc(k.f, arch).ptx;
      CubinResult c = ptx_to_cubin(ptx, arch, k.f.name);
      rt::Module m = rt::Module::from_cubin(c.cubin.data(), c.cubin.size(), k.f.name);
      CUfunction fn = m.function(k.f.name);
      rt::DeviceBuffer dout(out_bytes);
      dout.fill_bytes(0);
      CUdeviceptr px = dx.ptr(), py = dy.ptr(), po = dout.ptr();
      void* params[] = {&px, &py, &po};
      rt::LaunchConfig cfg;
      cfg.grid = {static_cast<unsigned>(n / 128), 1, 1};
      cfg.block = {128, 1, 1};
      rt::launch(fn, cfg, params, k.f.name);
      results.emplace_back(out_bytes);
      dout.download(results.back().data(), out_bytes);
    }
    for (size_t slot = 0; slot < k.labels.size(); ++slot) {
      const DType t = k.types[slot];
      const size_t ts = static_cast<size_t>(tilejit::ir::byte_size(t));
      int bad = 0, nan_payload = 0;
      std::string first;
      for (int i = 0; i < n; ++i) {
        const size_t at = (slot * static_cast<size_t>(n) + static_cast<size_t>(i)) * 8;
        uint64_t a = 0, c = 0;
        std::memcpy(&a, &results[0][at], ts);
        std::memcpy(&c, &results[1][at], ts);
        if (a == c) continue;
        if (is_nan_bits(t, a) && is_nan_bits(t, c)) {
          ++nan_payload;
          continue;
        }
        if (bad++ == 0)
          first = fmt::format("x = {:#x}, y = {:#x}: LLVM {:#x}, nvrtc {:#x}", xv[static_cast<size_t>(i)], yv[static_cast<size_t>(i)], a, c);
      }
      if (nan_payload) MESSAGE(fmt::format("{} {}: {} results differ only in the NaN payload", tilejit::ir::name(d), k.labels[slot], nan_payload));
      CHECK_MESSAGE(bad == 0, fmt::format("{} {}: {} of {} differ, first: {}", tilejit::ir::name(d), k.labels[slot], bad, n, first));
      total_mismatch += bad;
    }
  }
  MESSAGE("GPU differential run done: " << total_mismatch << " mismatching results");
}

namespace {

struct TensorArg {
  DType dtype;
  std::vector<int64_t> shape;
  bool output = false;
};

// Runs `f` (lowered from the tile IR) through both backends on the same random inputs and checks
// that every output byte agrees. Tensors are row-major; scalars are f32 (the kernels here take
// only those).
void run_both_backends(const tilejit::ir::Function& fn, const std::map<std::string, TensorArg>& tensors,
                       const std::map<std::string, float>& scalars, std::array<unsigned, 3> grid) {
  namespace rt = tilejit::runtime;
  pir::Func f = lower_plain(fn);
  if (!f.tensor_maps.empty()) {
    MESSAGE("skipped " << f.name << ": it uses TMA tensor maps, which this test does not encode");
    return;
  }
  const std::string arch = rt::Driver::get().props().arch();
  std::map<std::string, rt::DeviceBuffer> buffers;
  std::map<std::string, size_t> bytes;
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const auto& [name, t] : tensors) {
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    const size_t es = static_cast<size_t>(tilejit::ir::byte_size(t.dtype));
    bytes[name] = numel * es;
    std::vector<uint8_t> host(numel * es);
    for (size_t i = 0; i < numel; ++i) {
      float v = dist(gen);
      uint32_t b = t.dtype == DType::bf16 ? tilejit::ir::f32_to_bf16_bits(v)
                 : t.dtype == DType::f16  ? tilejit::ir::f32_to_f16_bits(v)
                                          : std::bit_cast<uint32_t>(v);
      std::memcpy(&host[i * es], &b, es);
    }
    buffers.emplace(name, rt::DeviceBuffer(host.size()));
    buffers.at(name).upload(host.data(), host.size());
  }
  std::map<std::string, std::vector<std::vector<uint8_t>>> results;
  for (int backend = 0; backend < 2; ++backend) {
    std::string ptx = backend == 0 ? emit_ptx_llvm(f, arch).ptx : emit_ptx_nvrtc(f, arch).ptx;
    CubinResult c = ptx_to_cubin(ptx, arch, f.name);
    rt::Module m = rt::Module::from_cubin(c.cubin.data(), c.cubin.size(), f.name);
    CUfunction fnc = m.function(f.name);
    for (const auto& [name, t] : tensors)
      if (t.output) buffers.at(name).fill_bytes(0xFF);
    // The flattened ABI: tensors become (pointer, sizes as i32, strides as i64).
    std::vector<std::array<uint8_t, 8>> storage(f.params.size());
    std::vector<void*> args;
    for (size_t i = 0; i < f.params.size(); ++i) {
      const pir::Param& p = f.params[i];
      uint8_t* at = storage[i].data();
      auto dim = [&](const std::string& suffix) -> std::pair<std::string, int> {
        auto pos = p.name.rfind(suffix);
        if (pos == std::string::npos) return {"", -1};
        return {p.name.substr(0, pos), std::stoi(p.name.substr(pos + suffix.size()))};
      };
      if (p.ty.ptr) {
        CUdeviceptr dp = buffers.at(p.name).ptr();
        std::memcpy(at, &dp, sizeof dp);
      } else if (auto [t, d] = dim("_size"); d >= 0 && tensors.count(t)) {
        int32_t v = static_cast<int32_t>(tensors.at(t).shape[static_cast<size_t>(d)]);
        std::memcpy(at, &v, sizeof v);
      } else if (auto [t2, d2] = dim("_stride"); d2 >= 0 && tensors.count(t2)) {
        int64_t v = 1;
        const auto& sh = tensors.at(t2).shape;
        for (size_t k = static_cast<size_t>(d2) + 1; k < sh.size(); ++k) v *= sh[k];
        std::memcpy(at, &v, sizeof v);
      } else {
        float v = scalars.at(p.name);
        std::memcpy(at, &v, sizeof v);
      }
      args.push_back(at);
    }
    rt::LaunchConfig cfg;
    cfg.grid = grid;
    cfg.block = {static_cast<unsigned>(f.num_threads), 1, 1};
    cfg.dynamic_smem_bytes = static_cast<unsigned>(f.smem_bytes);
    rt::launch(fnc, cfg, args.data(), f.name);
    for (const auto& [name, t] : tensors) {
      if (!t.output) continue;
      results[name].emplace_back(bytes.at(name));
      buffers.at(name).download(results[name].back().data(), bytes.at(name));
    }
  }
  for (const auto& [name, r] : results) {
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < r[0].size(); ++i)
      if (r[0][i] != r[1][i] && diff++ == 0) first = i;
    size_t unwritten = 0;  // 0xFF poison left in both: elements nobody wrote
    for (size_t i = 0; i + 1 < r[1].size(); i += 2) unwritten += r[1][i] == 0xFF && r[1][i + 1] == 0xFF;
    CHECK_MESSAGE(diff == 0, fmt::format("{} output {}: {} of {} bytes differ between the backends (first at byte {})", f.name, name, diff,
                                         r[0].size(), first));
    MESSAGE(fmt::format("{} output {}: {} bytes, {} differ; {} 16-bit words still poisoned", f.name, name, r[0].size(), diff, unwritten));
  }
}

}  // namespace

TEST_CASE("GPU: library kernels give bit-identical outputs through both backends") {
  namespace rt = tilejit::runtime;
  if (!rt::Driver::get().available()) {
    MESSAGE("SKIPPED: no GPU: " << rt::Driver::get().unavailable_reason());
    return;
  }
  if (!have_nvrtc()) return;
  using namespace tilejit::lang;
  {
    const int M = 150, N = 88, K = 72;  // ragged against the tiles; rows 16-byte aligned as the kernel's ParamSpec requires
    auto fn = tilejit::kernels::gemm().build({{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}});
    run_both_backends(fn, {{"A", {bf16, {M, K}}}, {"B", {bf16, {K, N}}}, {"C", {f32, {M, N}, true}}}, {},
                      {static_cast<unsigned>((M + 63) / 64), static_cast<unsigned>((N + 63) / 64), 1});
  }
  for (bool causal : {false, true}) {
    const int B = 2, H = 3, S = 200, D = 64;
    auto fn = tilejit::kernels::attention_forward().build({{"CAUSAL", causal}});
    std::vector<int64_t> qkv{B, H, S, D};
    run_both_backends(fn,
                      {{"Q", {bf16, qkv}}, {"K", {bf16, qkv}}, {"V", {bf16, qkv}}, {"O", {bf16, qkv, true}}, {"LSE", {f32, {B, H, S}, true}}},
                      {{"softmax_scale", 0.125f}}, {static_cast<unsigned>((S + 63) / 64), H, B});
  }
  {
    Kernel softmax = kernel("softmax", [](Builder& k) {
      auto X = k.tensor("X", bf16, 2);
      auto Y = k.tensor("Y", bf16, 2);
      auto r = program_id(0);
      auto x = cast(f32, load(X.block({r, 0}, {1, 128}), -INFINITY));
      auto e = exp(x - max(x, 1)[col]);
      store(Y.block({r, 0}, {1, 128}), cast(bf16, e / sum(e, 1)[col]));
    });
    run_both_backends(softmax.build(), {{"X", {bf16, {37, 96}}}, {"Y", {bf16, {37, 96}, true}}}, {}, {37, 1, 1});
  }
}

// Issue 28, item 9: with the wgmma commit fenced (work issued ahead of MMAs in flight: the forward
// reading precomputed dropout bits ahead), nvrtc printed the fence's %smid as "%%smid" in an asm
// without operands, which ptxas rejects. The library forward with DROPOUT_BITS and DROPOUT_AHEAD
// (no longer its default: decision 096) goes through nvrtc and ptxas; the fence's loop follows the
// commit (inside it, ptxas added a dummy HGMMA group: decision 096).
TEST_CASE("nvrtc: a fenced wgmma commit assembles (attention forward reading dropout bits)") {
  if (!have_nvrtc()) return;
  tilejit::jit::CompileOptions o;
  o.backend = tilejit::jit::Backend::Nvrtc;
  o.num_warps = 8;
  o.pipeline.stages = 2;
  const tilejit::ir::Function fn = tilejit::kernels::attention_forward().build(
      {{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"HEAD_DIM", 128}, {"BSHD", true}, {"DROPOUT", true}, {"DROPOUT_BITS", true},
       {"DROPOUT_AHEAD", true}});
  const tilejit::jit::CompiledKernel k = tilejit::jit::compile(fn, o);
  CHECK(!contains(k.ptx, "%%smid"));
  CHECK(contains(k.ptx, "wgmma.commit_group.sync.aligned;\n\tTJ_WGCOMMIT"));
  CHECK(!contains(k.ptx, ":\n\twgmma.commit_group"));
  CHECK(!k.cubin.empty());
}
