// Random well-typed programs. The generator builds the kernel while it chooses (each node is
// emitted through the Emitter at once, so the DSL's own type rules give every result's dtype and
// shape), and keeps, per value, whether the README promises it bit for bit on the GPU: approximate
// math and order-dependent float sums taint a value, and a tainted value only flows into operations
// that keep an error small (never into comparisons, integer casts, bitcasts or divisions).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include "tools/fuzz/emitter.hpp"

namespace tilejit::fuzz {

using namespace tilejit::lang;
using ir::OpKind;

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t bits() { return g_(); }
  int64_t range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(g_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(g_() >> 11) * 0x1p-53 < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    if (v.empty()) throw std::logic_error("fuzz: picking from an empty list");
    return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))];
  }

 private:
  std::mt19937_64 g_;
};

bool is_small_float_fill(const TensorSpec& t) { return t.fill == Fill::SmallInts; }

bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    int64_t x = a[a.size() - 1 - i], y = b[b.size() - 1 - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  Shape r(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < r.size(); ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    r[r.size() - 1 - i] = std::max(x, y);
  }
  return r;
}

bool is_approx_unary(OpKind k) {
  return k == OpKind::exp || k == OpKind::exp2 || k == OpKind::log || k == OpKind::log2 || k == OpKind::rsqrt ||
         k == OpKind::rcp || k == OpKind::tanh || k == OpKind::sin || k == OpKind::cos || k == OpKind::erf;
}

struct VarInfo {
  bool exact = true;
  bool bounded = false;  // updates keep it bounded (no products, bounded operands)
};

bool magnitude_ok(double v) { return !std::isfinite(v) || std::fabs(v) <= 0x1p20; }

bool magnitude_ok(DType d, int64_t v) {
  if (ir::is_float(d)) return true;  // (callers pass floats as doubles)
  if (ir::is_signed(d)) return v >= -(int64_t{1} << 20) && v <= (int64_t{1} << 20);
  return static_cast<uint64_t>(v) <= (uint64_t{1} << 20);
}

class Generator {
 public:
  Generator(Program& p, Builder& b, const GenerateOptions& o) : p_(p), rng_(p.seed), hints_(p.seed ^ 0x48494E5453ull), o_(o), e_(b, p) {}

  void run() {
    plan();
    e_.declare_params();
    scopes_.emplace_back();
    add_leaves();
    if (dot_a_ >= 0 && rng_.chance(0.6)) gemm_loop();
    body(o_.max_nodes);
    if (epilogue_ >= 0) tma_epilogue();
    for (size_t t = 0; t < p_.tensors.size(); ++t)
      if (p_.tensors[t].output && !p_.tensors[t].accumulator && !written_[t] && static_cast<int>(t) != readback_)
        store_into(static_cast<int>(t), scopes_.back().empty() ? constant(p_.tensors[t].dtype, {p_.R, p_.C})
                                                               : rng_.pick(scopes_.back()));
    // (every TMA output is written by now, at the top level at the latest)
    if (readback_ >= 0 && !written_[static_cast<size_t>(readback_)]) after_tma_store(rng_.pick(tma_outs_));
  }

 private:
  // ---- the signature: shapes, tensors and scalars ----
  void plan() {
    p_.num_warps = static_cast<int>(rng_.pick(std::vector<int64_t>{1, 2, 4, 4, 4, 8}));
    p_.programs = rng_.range(1, 3);
    // --tma-stores: most programs get a main tile and outputs that a TMA store can take (GenerateOptions::tma_stores;
    // without the flag nothing is drawn here, so the seeds' programs stay as they were)
    tma_ = o_.tma_stores && rng_.chance(0.7);
    const std::vector<int64_t> sizes{1, 2, 4, 8, 16, 32, 64, 128};
    do {
      p_.R = rng_.pick(sizes);
      p_.C = rng_.pick(sizes);
    } while (p_.R * p_.C > 4096);
    if (tma_) tma_shape();
    const bool dot = rng_.chance(0.3);
    // --tma-stores: half the dot programs end in an epilogue (tma_epilogue), mostly shaped so that
    // its TMA store can stage in a tile of the dot (wgmma, 16-bit, C 64, K 64)
    const bool epilogue = dot && tma_ && rng_.chance(0.5);
    const bool staged = epilogue && rng_.chance(0.7);
    if (dot) {  // shapes a tensor-core dot can take (wgmma: M a multiple of 64 on 4 or 8 warps)
      bool wg = o_.wgmma && (staged || rng_.chance(0.6));
      p_.R = wg ? rng_.pick(std::vector<int64_t>{64, 128}) : rng_.pick(std::vector<int64_t>{16, 32, 64});
      p_.C = staged ? 64 : rng_.pick(tma_ ? std::vector<int64_t>{32, 64, 64} : std::vector<int64_t>{8, 16, 32, 64});
      if (wg) p_.num_warps = p_.R == 128 ? 8 : 4;
      dot_k_ = staged ? 64 : rng_.pick(std::vector<int64_t>{16, 32, 64});
      std::vector<DType> dts{DType::bf16, DType::f16, DType::bf16, DType::i8, DType::f32};
      if (o_.fp8) dts.push_back(DType::f8e4m3);
      DType d = staged ? rng_.pick(std::vector<DType>{DType::bf16, DType::f16}) : rng_.pick(dts);
      dot_a_ = input(d, {p_.R * rng_.range(1, 2), dot_k_ * rng_.range(1, 3)}, Fill::SmallInts, true);
      dot_b_ = input(d, {p_.tensors[static_cast<size_t>(dot_a_)].shape[1], p_.C}, Fill::SmallInts, true);
      if (tma_)  // (--tma-stores: TMA tiles where the shapes allow, for a TMA store to stage in)
        for (int t : {dot_a_, dot_b_}) {
          TensorSpec& ts = p_.tensors[static_cast<size_t>(t)];
          if ((ts.shape[1] * ir::byte_size(ts.dtype)) % 16 == 0) ts.align = 16;
        }
    }
    int n_inputs = static_cast<int>(rng_.range(1, 3));
    for (int i = 0; i < n_inputs; ++i) {
      DType d = value_dtype();
      Fill f = rng_.pick(std::vector<Fill>{Fill::SmallInts, Fill::Normal, Fill::Normal, Fill::Specials, Fill::Bits});
      input(d, {p_.R * rng_.range(1, 2) + rng_.range(-1, 1) * (p_.R > 1), p_.C + rng_.range(0, 1) * p_.C}, f,
            rng_.chance(0.5));
    }
    int n_outputs = static_cast<int>(rng_.range(1, 3));
    for (int i = 0; i < n_outputs; ++i) {
      TensorSpec t;
      t.dtype = value_dtype();
      t.shape = {p_.programs, p_.R, p_.C};
      t.output = true;
      t.contiguous = rng_.chance(0.5);
      if (i == 0 && epilogue) {  // kept for tma_epilogue (2-byte elements: staged in a dot's tile)
        epilogue_ = static_cast<int>(p_.tensors.size());
        tma_output(t, staged);
      } else if (tma_ && (i == 0 || rng_.chance(0.5))) {
        tma_output(t, false);
      }
      p_.tensors.push_back(t);
    }
    // --tma-stores: an output for what is read back of a TMA output (after_tma_store); drawn apart, so
    // that the other programs stay as they were before read-backs
    if (tma_ && Rng(p_.seed ^ 0x7EADBACCull).chance(0.4)) {
      TensorSpec t;
      t.dtype = value_dtype();
      t.shape = {p_.programs, p_.R, p_.C};
      t.output = true;
      t.contiguous = rng_.chance(0.5);
      readback_ = static_cast<int>(p_.tensors.size());
      p_.tensors.push_back(t);
    }
    if (rng_.chance(0.3)) {  // pointer atomics: each program its own slice, old values returned
      TensorSpec t;
      t.dtype = rng_.pick(std::vector<DType>{DType::f32, DType::f32, DType::i32, DType::u32, DType::i64, DType::u64,
                                              DType::f16, DType::bf16, DType::f64});
      t.shape = {p_.programs, p_.R, p_.C};
      t.output = t.accumulator = true;
      t.fill = rng_.pick(std::vector<Fill>{Fill::SmallInts, Fill::Normal, Fill::Specials});
      t.seed = rng_.bits();
      atomic_ptr_ = static_cast<int>(p_.tensors.size());
      p_.tensors.push_back(t);
    }
    if (rng_.chance(0.25)) {  // window atomics shared by every program (integers: order-free)
      TensorSpec t;
      t.dtype = rng_.pick(std::vector<DType>{DType::i32, DType::u32, DType::i64, DType::u64});
      t.shape = {p_.R + rng_.range(0, 3), p_.C + rng_.range(0, 3)};
      t.output = t.accumulator = true;
      t.fill = Fill::SmallInts;
      t.seed = rng_.bits();
      t.contiguous = rng_.chance(0.5);
      atomic_block_ = static_cast<int>(p_.tensors.size());
      // one update for every window atomic of the program: mixing two would make the result depend
      // on the programs' order (add, max, min, and, or, xor)
      block_rmw_ = static_cast<int>(rng_.range(0, 5));
      p_.tensors.push_back(t);
    }
    written_.assign(p_.tensors.size(), false);
    stored_exact_.assign(p_.tensors.size(), true);
    tma_at_.assign(p_.tensors.size(), {-1, -1});
    int n_scalars = static_cast<int>(rng_.range(0, 3));
    for (int i = 0; i < n_scalars; ++i) p_.scalars.push_back(scalar_param());
  }

  DType value_dtype() {
    return rng_.pick(std::vector<DType>{DType::f32, DType::f32, DType::f32, DType::bf16, DType::f16, DType::f64,
                                        DType::i32, DType::i32, DType::i64, DType::u32, DType::u64, DType::i8,
                                        DType::u8, DType::i16, DType::u16});
  }

  // ---- --tma-stores: windows that jit/wgmma_plan.cpp's tma_reduce() plans as TMA stores ----
  // (sm_90a, 4 or 8 warps; a 16-byte aligned tensor parameter with contiguous_last, 2- or 4-byte
  // elements; rows a multiple of 8 up to 256, cols whole 128-byte chunks; i32-sized offsets, the
  // inner one provably a multiple of 16 bytes)
  void tma_shape() {
    p_.C = rng_.pick(std::vector<int64_t>{32, 64, 64, 128});
    std::vector<int64_t> rows;
    for (int64_t r : {8, 16, 32, 64, 128})
      if (r * p_.C <= 4096) rows.push_back(r);
    p_.R = rng_.pick(rows);
    if (p_.C == 32 && rng_.chance(0.1)) p_.R = 256;  // the most rows a TMA box takes
    p_.num_warps = static_cast<int>(rng_.pick(std::vector<int64_t>{4, 4, 8}));
  }

  // An output that only window stores write, as a TMA store wants it: its dtype's 128-byte chunks
  // divide C, declared contiguous_last and 16-byte aligned, and often not [R, C] per program (rows
  // and cols cut or added, strides kept multiples of 16 bytes), so that windows are ragged.
  void tma_output(TensorSpec& t, bool narrow) {
    std::vector<DType> ds;
    for (DType d : {DType::bf16, DType::f16, DType::i16, DType::u16, DType::f32, DType::f32, DType::i32, DType::u32})
      if (p_.C % (128 / ir::byte_size(d)) == 0 && (!narrow || ir::byte_size(d) == 2)) ds.push_back(d);
    t.dtype = rng_.pick(ds);
    t.contiguous = true;
    t.align = 16;
    const int64_t unit = 16 / ir::byte_size(t.dtype);
    if (rng_.chance(0.5)) t.shape[1] = std::max<int64_t>(1, p_.R + rng_.range(-p_.R / 2, p_.R / 2));
    if (rng_.chance(0.5)) t.shape[2] = std::max<int64_t>(unit, p_.C + unit * rng_.range(-p_.C / unit / 2, p_.C / unit / 2));
    tma_outs_.push_back(static_cast<int>(p_.tensors.size()));
  }

  // A dot of windows loaded once, stored into an output for TMA stores (a 16-bit one first): the
  // store may stage in one of the dot's tiles (jit/wgmma_plan.cpp borrow_staging: outside loops, a
  // tile loaded once whose readers all come before the store).
  void tma_epilogue() {
    const int d = dot_node(-1);
    store_into(epilogue_, d);
  }

  // --tma-stores: reads back (and sometimes writes again) TMA output t after a TMA store into it, in
  // the same program and at the top level: the lowering must order them after the TMA unit's
  // asynchronous write (jit/lower/memory.cpp tma_bulk_write). Before the read, sometimes a generic
  // window store (write after write) or a second TMA store into a window overlapping the first; then
  // one or two windows overlapping it (the same, shifted by rows or 16-byte chunks, partly outside)
  // are loaded and stored into the read-back output, so the result depends on what was stored.
  void after_tma_store(int t) {
    written_[static_cast<size_t>(readback_)] = true;  // (before any store below: no second read-back)
    const TensorSpec& ts = p_.tensors[static_cast<size_t>(t)];
    const int64_t unit = 16 / ir::byte_size(ts.dtype);
    auto value = [&] {
      int x = find([](const Node&) { return true; });
      return x < 0 ? constant(ts.dtype, {p_.R, p_.C}) : x;
    };
    auto [r0, c0] = tma_at_[static_cast<size_t>(t)];
    int mode = static_cast<int>(rng_.range(0, 3));  // 0, 1: read only; 2: a generic store first; 3: a TMA store
    if (r0 < 0) mode = 3;  // (stored only in a loop or branch: a TMA store here, at offsets to read back)
    if (mode >= 2) {
      int r1 = r0 < 0 ? tma_offset(p_.R, 1) : shifted(r0, rng_.pick(std::vector<int64_t>{0, 8, -8, p_.R / 2}));
      int c1 = r0 < 0 ? tma_offset(p_.C, unit) : shifted(c0, unit * rng_.pick(std::vector<int64_t>{0, 0, 1, -1}));
      window_store(t, value(), r1, c1, mode == 3);
      if (r0 < 0 || rng_.chance(0.5)) r0 = r1, c0 = c1;  // (read around the first or the second)
    }
    auto read = [&] {
      Node n;
      n.kind = NodeKind::LoadOutput;
      n.tensor = t;
      const int64_t pick = rng_.range(0, 9);
      n.shape = pick < 7 ? Shape{p_.R, p_.C} : pick < 8 ? Shape{1, p_.C} : Shape{p_.R, 1};
      n.args = {shifted(r0, rng_.pick(std::vector<int64_t>{0, 0, 8, -8, p_.R - 1, 1})),
                shifted(c0, rng_.pick(std::vector<int64_t>{0, 0, 0, unit, -unit, p_.C / 2, 1}))};
      const int i = add(n);
      node(i).exact = stored_exact_[static_cast<size_t>(t)];
      return i;
    };
    int x = read();
    if (rng_.chance(0.4)) {  // a second window, added (ints: xor)
      const int y = read();
      Node b;
      b.kind = NodeKind::Binary;
      b.sub = static_cast<int>(ir::is_float(ts.dtype) || rng_.chance(0.5) ? OpKind::add : OpKind::bit_xor);
      b.args = {x, y};
      x = add(b);
    }
    store_into(readback_, x);
  }

  // x (an integer scalar) + delta in x's dtype (0: x itself)
  int shifted(int x, int64_t delta) {
    if (delta == 0) return x;
    Node c;
    c.kind = NodeKind::Constant;
    c.dtype = node(x).dtype;
    c.ivalue = ir::wrap_int(c.dtype, delta);
    Node b;
    b.kind = NodeKind::Binary;
    b.sub = static_cast<int>(OpKind::add);
    b.args = {x, add(c)};
    return add(b);
  }

  // A window store into output t at (r, c): by TMA or (tma false) a generic one (Store sub 3).
  void window_store(int t, int x, int r, int c, bool tma) {
    x = stored_value(t, x);
    Node n;
    n.kind = NodeKind::Store;
    n.tensor = t;
    n.sub = tma ? 1 : 3;
    n.ivalue = tma && hints_.chance(0.5);  // StoreOptions::offsets_at_store
    n.args = {x, r, c};
    int i = add(n);
    node(i).exact = node(x).exact;
    stored_exact_[static_cast<size_t>(t)] = stored_exact_[static_cast<size_t>(t)] && node(x).exact;
    if (tma && depth_ == 0) tma_at_[static_cast<size_t>(t)] = {r, c};
  }

  bool is_tma_output(int t) const { return std::find(tma_outs_.begin(), tma_outs_.end(), t) != tma_outs_.end(); }

  // A window offset of a TMA-store output along a dim of `extent` elements: an integer scalar of a
  // type that fits i32, a multiple of `unit` elements that the scalar facts (jit/scalar_facts.hpp)
  // prove -- a constant, program_id times a constant, a value shifted left or multiplied -- from
  // before the tile to past its end; provably non-negative or not (the lowering then tests the sign
  // at run time). Now and then any offset (offset_node), which may not qualify. Loop-invariant.
  int tma_offset(int64_t extent, int64_t unit) {
    auto make_constant = [&](DType d, int64_t v) {
      Node n;
      n.kind = NodeKind::Constant;
      n.dtype = d;
      n.ivalue = ir::wrap_int(d, v);
      return add(n);
    };
    auto binary = [&](OpKind k, int x, int y) {
      Node n;
      n.kind = NodeKind::Binary;
      n.sub = static_cast<int>(k);
      n.args = {x, y};
      return add(n);
    };
    const int64_t steps = std::max<int64_t>(1, extent / unit);
    const int r = static_cast<int>(rng_.range(0, 9));
    if (r < 4) {  // (u8 wraps a negative value to a large one: still a multiple of unit, which divides 256)
      const DType d = rng_.pick(std::vector<DType>{DType::i32, DType::i32, DType::i32, DType::i16, DType::u8});
      const bool far = rng_.chance(0.2);  // also windows wholly outside the tensor
      return make_constant(d, unit * (far ? rng_.range(-steps - 1, 2 * steps + 1) : rng_.range(-steps / 2, steps - 1)));
    }
    if (r < 6) {  // program_id(0) * k unit (+ c unit): never negative
      Node pid;
      pid.kind = NodeKind::ProgramId;
      int x = binary(OpKind::mul, add(pid), make_constant(DType::i32, unit * rng_.range(0, steps / 2)));
      if (rng_.chance(0.4)) x = binary(OpKind::add, x, make_constant(DType::i32, unit * rng_.range(-1, 1)));
      return x;
    }
    if (r < 8) {  // a value computed before (top level: the same in every iteration), times unit
      std::vector<int> cand;
      for (int v : scopes_.front())
        if (is_int_scalar(v) && ir::fits_i32(node(v).dtype) && node(v).dtype != DType::i1 && node(v).exact) cand.push_back(v);
      if (!cand.empty()) {
        const int x = rng_.pick(cand);
        const DType d = node(x).dtype;
        if (unit == 1) return x;
        if (rng_.chance(0.5)) return binary(OpKind::shl, x, make_constant(d, static_cast<int64_t>(std::log2(unit))));
        return binary(OpKind::mul, x, make_constant(d, unit * rng_.range(-2, 3)));
      }
      return make_constant(DType::i32, unit * rng_.range(0, steps));
    }
    return offset_node(false, extent / 2 + 1, depth_ > 0);
  }

  int input(DType d, Shape shape, Fill f, bool contiguous) {
    for (auto& s : shape) s = std::max<int64_t>(s, 1);
    TensorSpec t;
    t.dtype = d;
    t.shape = shape;
    t.fill = f;
    t.scale = rng_.pick(std::vector<double>{1, 3, 100});
    t.seed = rng_.bits();
    t.contiguous = contiguous;
    if (contiguous && (shape[1] * ir::byte_size(d)) % 16 == 0 && rng_.chance(0.7)) t.align = 16;
    p_.tensors.push_back(t);
    return static_cast<int>(p_.tensors.size()) - 1;
  }

  ScalarParam scalar_param() {
    ScalarParam s;
    s.dtype = rng_.pick(std::vector<DType>{DType::i32, DType::i32, DType::i64, DType::u32, DType::u64, DType::f32,
                                           DType::f64});
    if (ir::is_float(s.dtype)) s.fvalue = special_float(s.dtype);
    else s.ivalue = special_int(s.dtype, true);
    return s;
  }

  // ---- interesting values ----
  double special_float(DType d) {
    double big = d == DType::f16 ? 65504.0 : d == DType::bf16 ? 3.3895313892515355e38 : d == DType::f32 ? 3.4028234663852886e38 : 1.7976931348623157e308;
    double tiny = d == DType::f16 ? 0x1p-24 : d == DType::bf16 ? 0x1p-133 : d == DType::f32 ? 0x1p-149 : 0x1p-1074;
    switch (rng_.range(0, 14)) {
      case 0: return 0.0;
      case 1: return -0.0;
      case 2: return std::numeric_limits<double>::infinity();
      case 3: return -std::numeric_limits<double>::infinity();
      case 4: return std::numeric_limits<double>::quiet_NaN();
      case 5: return tiny * static_cast<double>(rng_.range(1, 7));
      case 6: return big;
      case 7: return -big;
      case 8: return std::ldexp(1.0, static_cast<int>(rng_.range(-30, 30)));
      case 9: return static_cast<double>(rng_.range(-5, 5)) + 0.5;
      default: return ir::round_to(d, static_cast<double>(rng_.range(-1000, 1000)) / static_cast<double>(rng_.range(1, 64)));
    }
  }

  int64_t special_int(DType d, bool huge_ok) {
    const int w = ir::bit_width(d);
    if (d == DType::i1) return rng_.range(0, 1);
    if (huge_ok && rng_.chance(0.3)) {
      uint64_t v = rng_.pick(std::vector<uint64_t>{0, 1, ~0ull, 1ull << 31, (1ull << 31) - 1, 1ull << 32, (1ull << 32) - 1,
                                                   (1ull << 32) + 1, 1ull << 63, (1ull << 63) - 1, rng_.bits()});
      return ir::wrap_int(d, static_cast<int64_t>(v));
    }
    (void)w;
    int64_t v = rng_.range(-9, 40);
    return ir::wrap_int(d, v);
  }

  // An i32/other integer scalar offset around [-R, 2R], sometimes huge (window bounds).
  int offset_node(bool i32_or_i64_only, int64_t around, bool constant_only = false) {
    std::vector<int> cand;
    for (int v : visible())
      if (is_int_scalar(v) && (!i32_or_i64_only || node(v).dtype == DType::i32 || node(v).dtype == DType::i64) && !constant_only)
        cand.push_back(v);
    if (!cand.empty() && rng_.chance(0.35)) return rng_.pick(cand);
    Node n;
    n.kind = NodeKind::Constant;
    n.dtype = i32_or_i64_only ? (rng_.chance(0.8) ? DType::i32 : DType::i64)
                              : rng_.pick(std::vector<DType>{DType::i32, DType::i32, DType::i64, DType::u32, DType::u64,
                                                             DType::i16, DType::u8, DType::i8});
    n.ivalue = rng_.chance(0.85) ? ir::wrap_int(n.dtype, rng_.range(-around, 2 * around)) : special_int(n.dtype, true);
    if (i32_or_i64_only && rng_.chance(0.5)) n.ivalue = ir::wrap_int(n.dtype, rng_.range(-around, 2 * around));
    return add(n);
  }

  // ---- program text ----
  void add_leaves() {
    for (size_t t = 0; t < p_.tensors.size(); ++t)
      if (!p_.tensors[t].output && rng_.chance(0.8)) load_input(static_cast<int>(t));
    for (size_t s = 0; s < p_.scalars.size(); ++s) {
      Node n;
      n.kind = NodeKind::Scalar;
      n.ivalue = static_cast<int64_t>(s);
      add(n);
    }
    if (rng_.chance(0.5)) {
      Node n;
      n.kind = NodeKind::ProgramId;
      add(n);
    }
  }

  void load_input(int t) {
    const TensorSpec& ts = p_.tensors[static_cast<size_t>(t)];
    Node n;
    n.tensor = t;
    n.small = is_small_float_fill(ts);
    n.shape = {p_.R, p_.C};
    if (rng_.chance(0.5)) {
      n.kind = NodeKind::LoadPtr;
      n.args = {offset_node(true, p_.R), offset_node(true, p_.C)};
    } else {
      n.kind = NodeKind::LoadBlock;
      n.args = {offset_node(false, p_.R), offset_node(false, p_.C)};
    }
    if (ir::is_float(ts.dtype)) n.value = rng_.chance(0.7) ? 0.0 : special_float(ts.dtype);
    else if (n.kind == NodeKind::LoadPtr) n.ivalue = special_int(ts.dtype, false);
    else n.value = rng_.chance(0.6) ? static_cast<double>(rng_.range(-3, 300)) : special_float(DType::f32);
    if (n.kind == NodeKind::LoadBlock && std::isnan(n.value)) n.value = 0;
    if (n.small && n.value != 0 && n.value != std::floor(n.value)) n.small = false;
    add(n);
  }

  // Reads back part of an output this program stores (before or after the store, in a loop both):
  // a full tile, a row or a column, so the load's layout differs from the store's (a row over every
  // warp is replicated). Exact where the GPU must match bit for bit: outside loops, before the
  // store (poison) or after an exact one.
  void load_output() {
    std::vector<int> outs;
    for (size_t t = 0; t < p_.tensors.size(); ++t)
      if (p_.tensors[t].output && !p_.tensors[t].accumulator) outs.push_back(static_cast<int>(t));
    if (outs.empty()) return;
    const int t = rng_.pick(outs);
    Node n;
    n.kind = NodeKind::LoadOutput;
    n.tensor = t;
    const int pick = static_cast<int>(rng_.range(0, 2));
    n.shape = pick == 0 ? Shape{p_.R, p_.C} : pick == 1 ? Shape{1, p_.C} : Shape{p_.R, 1};
    n.args = {offset_node(false, p_.R / 2 + 1, depth_ > 0), offset_node(false, p_.C / 2 + 1, depth_ > 0)};
    const int i = add(n);
    node(i).exact = depth_ == 0 && (!written_[static_cast<size_t>(t)] || stored_exact_[static_cast<size_t>(t)]);
  }

  void body(int budget) {
    for (int i = 0; i < budget; ++i) step();
  }

  void step() {
    int r = static_cast<int>(rng_.range(0, 99));
    if (r < 22) binary();
    else if (r < 34) unary();
    else if (r < 42) cast();
    else if (r < 47) compare_select();
    else if (r < 52) { if (o_.axis_ops && rng_.chance(0.4)) axis_op(); else reduce(); }
    else if (r < 56) constant_leaf();
    else if (r < 60) { for (size_t t = 0; t < p_.tensors.size(); ++t) if (!p_.tensors[t].output && rng_.chance(0.5)) { load_input(static_cast<int>(t)); break; } }
    else if (r < 64) bitcast();
    else if (r < 67) fma_node();
    else if (r < 70 && o_.pack_pairs) pairs();
    else if (r < 74 && depth_ == 0) var_decl();
    else if (r < 80) var_update();
    else if (r < 84 && depth_ < 2) loop();
    else if (r < 88 && depth_ < 2) branch();
    else if (r < 90) store_some();
    else if (r < 92) load_output();
    else if (r < 96) atomics();
    else if (r < 98 && dot_a_ >= 0) dot_node(-1);
    else broadcast_some();
  }

  // ---- node helpers ----
  Node& node(int i) { return p_.nodes[static_cast<size_t>(i)]; }
  std::vector<int> visible() const {
    std::vector<int> v;
    for (const auto& s : scopes_) v.insert(v.end(), s.begin(), s.end());
    return v;
  }
  bool is_value(int i) {
    const Node& n = node(i);
    if (n.kind == NodeKind::LoopBegin) return true;  // the induction variable
    return n.kind != NodeKind::Store && n.kind != NodeKind::AtomicBlock && !is_marker(n.kind) &&
           n.kind != NodeKind::VarAssign;
  }
  bool is_int_scalar(int i) { return is_value(i) && node(i).shape.empty() && ir::is_int(node(i).dtype) && node(i).dtype != DType::i1; }

  int add(Node n) {
    p_.nodes.push_back(n);
    const size_t i = p_.nodes.size() - 1;
    e_.ensure_size();
    Node& m = p_.nodes[i];
    for (int a : m.args) {
      m.exact = m.exact && node(a).exact;
      m.approx_depth = std::max(m.approx_depth, node(a).approx_depth);
    }
    if (!is_marker(m.kind)) e_.emit(i);
    if (is_value(static_cast<int>(i))) m.bounded = bounded_result(m);
    // fp8 values are storage only (no arithmetic): only the cast or dot that follows uses them
    if (!is_marker(m.kind) && m.kind != NodeKind::Store && m.kind != NodeKind::AtomicBlock && !ir::is_fp8(m.dtype))
      scopes_.back().push_back(static_cast<int>(i));
    return static_cast<int>(i);
  }

  // Node::bounded for a new node (its dtype known, its arguments' flags set).
  bool bounded_result(const Node& m) {
    if (m.dtype == DType::i1 || m.dtype == DType::f16 || (ir::is_int(m.dtype) && ir::bit_width(m.dtype) <= 16)) return true;
    auto arg = [&](size_t k) { return node(m.args[k]).bounded; };
    auto fill_ok = [&](int t) {
      const Fill f = p_.tensors[static_cast<size_t>(t)].fill;
      return f == Fill::SmallInts || f == Fill::Normal;
    };
    switch (m.kind) {
      case NodeKind::Scalar: {
        const ScalarParam& sp = p_.scalars[static_cast<size_t>(m.ivalue)];
        return ir::is_float(sp.dtype) ? magnitude_ok(sp.fvalue) : magnitude_ok(sp.dtype, sp.ivalue);
      }
      case NodeKind::Constant: return ir::is_float(m.dtype) ? magnitude_ok(m.value) : magnitude_ok(m.dtype, m.ivalue);
      case NodeKind::Arange: case NodeKind::ProgramId: case NodeKind::LoopBegin: case NodeKind::Dot: return true;
      case NodeKind::LoadPtr:
        return fill_ok(m.tensor) && (ir::is_float(m.dtype) ? magnitude_ok(m.value) : magnitude_ok(m.dtype, m.ivalue));
      case NodeKind::LoadBlock: return fill_ok(m.tensor) && magnitude_ok(m.value);
      case NodeKind::AtomicAdd: return fill_ok(m.tensor) && arg(0);
      case NodeKind::Unary: {
        const auto k = static_cast<OpKind>(m.sub);
        return (k == OpKind::neg || k == OpKind::abs || k == OpKind::floor || k == OpKind::ceil || k == OpKind::sqrt ||
                k == OpKind::precompute) && arg(0);
      }
      case NodeKind::Binary: {
        const auto k = static_cast<OpKind>(m.sub);
        if (k == OpKind::add || k == OpKind::sub || k == OpKind::minimum || k == OpKind::maximum) return arg(0) && arg(1);
        if (k == OpKind::mul) return arg(0) && arg(1) && (node(m.args[0]).small || node(m.args[1]).small);
        if (k == OpKind::rem) return arg(0);
        return false;
      }
      case NodeKind::Select: return arg(1) && arg(2);
      case NodeKind::Cast: case NodeKind::Broadcast: case NodeKind::Trans: case NodeKind::Reduce: return arg(0);
      case NodeKind::XorPermute: case NodeKind::Gather: return arg(0);
      case NodeKind::Histogram: return true;  // counts, at most the tile's elements
      case NodeKind::Scan: case NodeKind::ReduceWith: return m.sub != 0 && arg(0);  // selections keep the bound
      case NodeKind::VarRead: return vars_[static_cast<size_t>(m.var)].bounded;
      default: return false;
    }
  }

  // Runs `f` one scope and one nesting level deeper (a loop or if body); `visible`: a node the
  // body sees first (the loop's induction variable).
  template <class F>
  void nested(F&& f, int visible = -1) {
    scopes_.emplace_back();
    if (visible >= 0) scopes_.back().push_back(visible);
    ++depth_;
    f();
    --depth_;
    scopes_.pop_back();
  }

  // A random visible value satisfying `ok` (-1 if none).
  template <class F>
  int find(F ok) {
    std::vector<int> c;
    for (int v : visible())
      if (is_value(v) && ok(node(v))) c.push_back(v);
    return c.empty() ? -1 : rng_.pick(c);
  }

  int constant_of(DType d, Shape s, double v) {
    Node n;
    n.kind = NodeKind::Constant;
    n.dtype = d;
    n.shape = std::move(s);
    n.value = v;
    n.ivalue = static_cast<int64_t>(v);
    n.small = v == std::floor(v) && std::fabs(v) <= 3;
    return add(n);
  }

  int constant(DType d, Shape s) {
    Node n;
    n.kind = NodeKind::Constant;
    n.dtype = d;
    n.shape = std::move(s);
    if (ir::is_float(d)) {
      n.value = rng_.chance(0.5) ? static_cast<double>(rng_.range(-3, 3)) : special_float(d);
      n.small = n.value == std::floor(n.value) && std::fabs(n.value) <= 3;
    } else {
      n.ivalue = special_int(d, true);
    }
    return add(n);
  }

  void constant_leaf() {
    Shape s = rng_.pick(std::vector<Shape>{{}, {p_.R, p_.C}, {p_.R, 1}, {1, p_.C}, {p_.C}});
    if (rng_.chance(0.2)) {
      Node n;
      n.kind = NodeKind::Arange;
      n.ivalue = rng_.chance(0.5) ? p_.R : p_.C;
      n.sub = n.ivalue == p_.R ? static_cast<int>(rng_.range(0, 1)) : static_cast<int>(rng_.range(0, 2)) == 1 ? 2 : 0;
      if (n.ivalue == p_.R && n.sub == 0 && p_.R != p_.C) n.sub = 1;
      n.small = n.ivalue <= 4;
      add(n);
      return;
    }
    constant(value_dtype(), s);
  }

  // A value of dtype d whose shape broadcasts with `with` (casting or making one when needed).
  int operand_like(DType d, const Shape& with, bool need_exact) {
    int v = find([&](const Node& n) { return n.dtype == d && broadcastable(n.shape, with) && (n.exact || !need_exact); });
    if (v >= 0 && rng_.chance(0.8)) return v;
    int src = find([&](const Node& n) {
      return broadcastable(n.shape, with) && n.dtype != DType::i1 && (n.exact || ir::is_float(d)) && (n.exact || !need_exact);
    });
    if (src >= 0 && rng_.chance(0.6)) return cast_to(d, src);
    return constant(d, rng_.chance(0.5) ? Shape{} : with);
  }

  int cast_to(DType d, int src) {
    Node n;
    n.kind = NodeKind::Cast;
    n.dtype = d;
    n.args = {src};
    n.small = node(src).small && d != DType::i1;
    return add(n);
  }

  // ---- operations ----
  void binary() {
    static const std::vector<OpKind> arith{OpKind::add, OpKind::sub, OpKind::mul, OpKind::div, OpKind::rem,
                                           OpKind::minimum, OpKind::maximum};
    static const std::vector<OpKind> bits{OpKind::bit_and, OpKind::bit_or, OpKind::bit_xor, OpKind::shl, OpKind::shr,
                                          OpKind::umulhi};
    int x = find([&](const Node& n) { return n.dtype != DType::i1 || rng_.chance(0.3); });
    if (x < 0) return;
    DType d = node(x).dtype;
    OpKind k;
    if (d == DType::i1) k = rng_.pick(std::vector<OpKind>{OpKind::bit_and, OpKind::bit_or, OpKind::bit_xor});
    else if (ir::is_int(d) && rng_.chance(0.4)) k = rng_.pick(bits);
    else k = rng_.pick(arith);
    if (k == OpKind::umulhi && ir::bit_width(d) < 32) k = OpKind::add;
    bool tolerant = k == OpKind::add || k == OpKind::sub || k == OpKind::mul || k == OpKind::minimum || k == OpKind::maximum;
    if (!node(x).exact && !tolerant) return;
    int y = operand_like(d, node(x).shape, !tolerant);
    if (rng_.chance(0.5)) std::swap(x, y);
    Node n;
    n.kind = NodeKind::Binary;
    n.sub = static_cast<int>(k);
    n.args = {x, y};
    // a third of the float multiplies as lang::scale_lazily (flag in ivalue; chosen without a draw,
    // so that the rest of every seed's program stays as it was)
    if (k == OpKind::mul && ir::is_float(d) && p_.nodes.size() % 3 == 0) n.ivalue = 1;
    add(n);
  }

  void unary() {
    int x = find([&](const Node& n) { return n.dtype != DType::i1; });
    if (x < 0) return;
    DType d = node(x).dtype;
    OpKind k;
    if (ir::is_float(d)) {
      k = rng_.pick(std::vector<OpKind>{OpKind::neg, OpKind::abs, OpKind::floor, OpKind::ceil, OpKind::sqrt, OpKind::exp,
                                        OpKind::exp2, OpKind::log, OpKind::log2, OpKind::rsqrt, OpKind::rcp, OpKind::tanh,
                                        OpKind::sin, OpKind::cos, OpKind::erf, OpKind::precompute});
    } else {
      k = rng_.pick(std::vector<OpKind>{OpKind::neg, OpKind::bit_not, OpKind::abs, OpKind::precompute});
    }
    const Node& xn = node(x);
    bool approx = is_approx_unary(k);
    if (approx && d == DType::f64) return;
    if (!xn.exact && !(k == OpKind::neg || k == OpKind::abs || (approx && xn.approx_depth < 2 && k != OpKind::rcp &&
                                                                k != OpKind::rsqrt && k != OpKind::log && k != OpKind::log2)))
      return;
    if (k == OpKind::exp || k == OpKind::exp2 || k == OpKind::sin || k == OpKind::cos) x = clamp(x, k == OpKind::exp ? 80 : k == OpKind::exp2 ? 120 : 100);
    Node n;
    n.kind = NodeKind::Unary;
    n.sub = static_cast<int>(k);
    n.args = {x};
    n.small = k == OpKind::precompute && xn.small;
    int i = add(n);
    if (approx) {
      node(i).exact = false;
      node(i).approx_depth += 1;
    }
  }

  // x limited to [-lim, lim] (the range the approximate instructions are accurate on).
  int clamp(int x, double lim) {
    DType d = node(x).dtype;
    Node lo;
    lo.kind = NodeKind::Binary;
    lo.sub = static_cast<int>(OpKind::maximum);
    Node c;
    c.kind = NodeKind::Constant;
    c.dtype = d;
    c.value = -lim;
    lo.args = {x, add(c)};
    int a = add(lo);
    c.value = lim;
    Node hi;
    hi.kind = NodeKind::Binary;
    hi.sub = static_cast<int>(OpKind::minimum);
    hi.args = {a, add(c)};
    return add(hi);
  }

  void cast() {
    int x = find([](const Node&) { return true; });
    if (x < 0) return;
    DType d = rng_.chance(0.1) ? DType::i1 : value_dtype();
    if (o_.fp8 && rng_.chance(0.1)) d = rng_.chance(0.5) ? DType::f8e4m3 : DType::f8e5m2;
    if (!node(x).exact && !ir::is_float(d)) return;
    int c = cast_to(d, x);
    if (ir::is_fp8(d)) cast_to(rng_.pick(std::vector<DType>{DType::f32, DType::bf16, DType::f16}), c);
  }

  // x with every NaN replaced by 0: a NaN's sign and payload are not promised (the GPU returns its
  // canonical NaN), so its bits must not reach an output through a bitcast or pack_pairs.
  int without_nan(int x) {
    if (!ir::is_float(node(x).dtype)) return x;
    Node c;
    c.kind = NodeKind::Binary;
    c.sub = static_cast<int>(OpKind::cmp);
    c.ivalue = 0;  // x == x
    c.args = {x, x};
    Node z;
    z.kind = NodeKind::Constant;
    z.dtype = node(x).dtype;
    Node w;
    w.kind = NodeKind::Select;
    w.args = {add(c), x, add(z)};
    return add(w);
  }

  void bitcast() {
    int x = find([&](const Node& n) { return n.exact && n.dtype != DType::i1; });
    if (x < 0) return;
    x = without_nan(x);
    std::vector<DType> same;
    for (DType d : {DType::i8, DType::u8, DType::i16, DType::u16, DType::f16, DType::bf16, DType::i32, DType::u32,
                    DType::f32, DType::i64, DType::u64, DType::f64})
      if (ir::bit_width(d) == ir::bit_width(node(x).dtype)) same.push_back(d);
    Node n;
    n.kind = NodeKind::Bitcast;
    n.dtype = rng_.pick(same);
    n.args = {x};
    add(n);
  }

  void compare_select() {
    int x = find([&](const Node& n) { return n.exact && n.dtype != DType::i1; });
    if (x < 0) return;
    int y = operand_like(node(x).dtype, node(x).shape, true);
    Node c;
    c.kind = NodeKind::Binary;
    c.sub = static_cast<int>(OpKind::cmp);
    c.ivalue = rng_.range(0, 5);
    c.args = {x, y};
    int cond = add(c);
    if (rng_.chance(0.3)) return;
    int a = find([&](const Node& n) { return broadcastable(n.shape, node(cond).shape); });
    if (a < 0) return;
    int b = operand_like(node(a).dtype, node(a).shape, false);
    if (!broadcastable(node(cond).shape, node(b).shape) || !broadcastable(node(a).shape, node(b).shape)) return;
    Node n;
    n.kind = NodeKind::Select;
    n.args = {cond, a, b};
    int i = add(n);
    node(i).small = node(a).small && node(b).small;
  }

  void reduce() {
    int x = find([&](const Node& n) {
      return !n.shape.empty() && n.dtype != DType::i1 && (o_.narrow_reductions || ir::bit_width(n.dtype) >= 32 || ir::is_float(n.dtype));
    });
    if (x < 0) return;
    Node n;
    n.kind = NodeKind::Reduce;
    n.sub = static_cast<int>(rng_.range(0, 2));
    n.ivalue = rng_.chance(0.3) ? -1 : rng_.range(0, static_cast<int64_t>(node(x).shape.size()) - 1);
    n.args = {x};
    // A float sum over values that may be huge overflows in one order and not in another.
    if (n.sub == 0 && ir::is_float(node(x).dtype) && !node(x).bounded) n.sub = static_cast<int>(rng_.range(1, 2));
    int i = add(n);
    if (n.sub == 0 && ir::is_float(node(x).dtype) && !node(x).small) {
      node(i).exact = false;
      node(i).approx_depth += 1;
    }
  }

  // a scan, a reduction with a combine, an xor_permute or a gather along one axis of a tile, or a
  // histogram of the whole tile
  void axis_op() {
    int x = find([&](const Node& n) { return !n.shape.empty() && n.dtype != DType::i1 && !ir::is_fp8(n.dtype); });
    if (x < 0) return;
    const Shape shape = node(x).shape;
    const DType d = node(x).dtype;
    Node n;
    n.args = {x};
    n.ivalue = rng_.range(0, static_cast<int64_t>(shape.size()) - 1);
    const int64_t len = shape[static_cast<size_t>(n.ivalue)];
    switch (rng_.range(0, 4)) {
      case 0: n.kind = NodeKind::Scan; n.value = rng_.chance(0.5) ? 1 : 0; break;
      case 4: {  // R, C or 1 bins: a length the program's other tiles have (ballots; fewer than 32 too)
        if (!ir::is_int(d)) return;
        n.kind = NodeKind::Histogram;
        n.sub = std::countr_zero(static_cast<uint64_t>(rng_.pick(std::vector<int64_t>{1, p_.R, p_.C})));
        const int i = add(n);
        node(i).small = true;
        return;
      }
      case 1: n.kind = NodeKind::ReduceWith; break;
      case 2:
        if (len < 2) return;
        n.kind = NodeKind::XorPermute;
        n.sub = static_cast<int>(rng_.range(1, len - 1));
        break;
      default: {
        int y = find([&](const Node& m) { return m.shape == shape && ir::is_int(m.dtype) && m.dtype != DType::i1; });
        if (y < 0) return;
        n.kind = NodeKind::Gather;
        n.args.push_back(y);
        break;
      }
    }
    const bool combines = n.kind == NodeKind::Scan || n.kind == NodeKind::ReduceWith;
    if (combines) n.sub = static_cast<int>(rng_.range(0, 4));
    // a float sum over values that may be huge overflows in one order and not in another; a 16-bit
    // one over values that are not small integers rounds each partial sum to 8 or 11 bits, and a tree
    // and a sequence then differ by many ulps of a result that cancels (seed 700725: 4.5 vs 14.5)
    if (combines && n.sub == 0 && ir::is_float(d) && (!node(x).bounded || (ir::bit_width(d) < 32 && !node(x).small))) n.sub = 1;
    int i = add(n);
    if (combines && n.sub == 0 && ir::is_float(d) && !node(x).small) {  // rounding in another order
      node(i).exact = false;
      node(i).approx_depth += 1;
    }
  }

  void fma_node() {
    int x = find([&](const Node& n) { return n.dtype == DType::f32 || n.dtype == DType::f64; });
    if (x < 0) return;
    DType d = node(x).dtype;
    int y = operand_like(d, node(x).shape, false), z = operand_like(d, node(x).shape, false);
    if (!broadcastable(node(y).shape, node(z).shape) || !broadcastable(broadcast_shape(node(x).shape, node(y).shape), node(z).shape)) return;
    if (!(node(x).exact && node(y).exact && node(z).exact)) return;  // a tainted product may cancel
    Node n;
    n.kind = NodeKind::Fma;
    n.args = {x, y, z};
    add(n);
  }

  void pairs() {
    int x = find([&](const Node& n) {
      return n.exact && ir::bit_width(n.dtype) == 16 && !n.shape.empty() && n.shape.back() % 2 == 0;
    });
    if (x >= 0) {
      Node n;
      n.kind = NodeKind::PackPairs;
      n.args = {without_nan(x)};
      int w = add(n);
      if (rng_.chance(0.6)) {
        Node u;
        u.kind = NodeKind::UnpackPairs;
        u.dtype = rng_.pick(std::vector<DType>{DType::bf16, DType::f16, DType::i16, DType::u16});
        u.args = {w};
        add(u);
      }
    }
  }

  void broadcast_some() {
    int x = find([&](const Node& n) { return n.shape.size() <= 2 && n.shape != Shape{p_.R, p_.C}; });
    if (x >= 0) to_main_shape(x);
    else if (int t = find([&](const Node& n) { return n.shape.size() == 2; }); t >= 0) {
      Node n;
      n.kind = NodeKind::Trans;
      n.args = {t};
      add(n);
    }
  }

  // x as a [R, C] tile (or -1 when its shape cannot get there).
  int to_main_shape(int x) {
    const Shape main{p_.R, p_.C};
    const Shape s = node(x).shape;
    if (s == main) return x;
    Node n;
    n.kind = NodeKind::Broadcast;
    n.shape = main;
    n.args = {x};
    n.small = node(x).small;
    if (s.size() == 1) {
      if (s[0] == p_.C && (p_.C != p_.R || rng_.chance(0.5))) n.sub = 2;
      else if (s[0] == p_.R) n.sub = 1;
      else if (s[0] == 1) n.sub = 0;
      else return -1;
    } else if (s.size() > 2 || !broadcastable(s, main) || broadcast_shape(s, main) != main) {
      return -1;
    }
    return add(n);
  }

  int var_count_ = 0;
  std::vector<VarInfo> vars_;

  void var_decl() {
    int x = find([&](const Node& n) { return n.dtype != DType::i1 || rng_.chance(0.2); });
    if (x < 0) return;
    Node n;
    n.kind = NodeKind::VarDecl;
    n.var = var_count_++;
    n.args = {x};
    add(n);
    vars_.push_back({node(x).exact, node(x).bounded});
  }

  void var_update() {
    if (vars_.empty()) return;
    int v = static_cast<int>(rng_.range(0, static_cast<int64_t>(vars_.size()) - 1));
    Node rd;
    rd.kind = NodeKind::VarRead;
    rd.var = v;
    int cur = add(rd);
    node(cur).exact = vars_[static_cast<size_t>(v)].exact;
    DType d = node(cur).dtype;
    Shape s = node(cur).shape;
    OpKind k = d == DType::i1 ? OpKind::bit_xor
                              : rng_.pick(std::vector<OpKind>{OpKind::add, OpKind::mul, OpKind::sub, OpKind::maximum,
                                                              OpKind::minimum});
    int y = find([&](const Node& n) {
      return n.dtype == d && broadcastable(n.shape, s) && broadcast_shape(n.shape, s) == s &&
             (n.exact || !vars_[static_cast<size_t>(v)].exact);
    });
    if (y < 0) y = constant(d, {});
    VarInfo& info = vars_[static_cast<size_t>(v)];
    if (info.bounded && (k == OpKind::mul || !node(y).bounded)) {  // keep it bounded: sums of it stay comparable
      if (!node(y).bounded) y = constant_of(d, {}, 1.0);
      if (k == OpKind::mul) k = OpKind::add;
    }
    Node b;
    b.kind = NodeKind::Binary;
    b.sub = static_cast<int>(k);
    b.args = rng_.chance(0.5) ? std::vector<int>{cur, y} : std::vector<int>{y, cur};
    int val = add(b);
    Node as;
    as.kind = NodeKind::VarAssign;
    as.var = v;
    as.args = {val};
    add(as);
  }

  void loop() {
    Node lb, ub;
    lb.kind = ub.kind = NodeKind::Constant;
    lb.dtype = ub.dtype = rng_.chance(0.8) ? DType::i32 : DType::i64;
    lb.ivalue = rng_.range(-2, 2);
    int64_t step = rng_.range(1, 3);
    ub.ivalue = lb.ivalue + step * rng_.range(0, 3) + rng_.range(0, 1);
    Node b;
    b.kind = NodeKind::LoopBegin;
    b.ivalue = step;
    int l = add(lb), u = add(ub);
    if (rng_.chance(0.3)) {  // a bound that differs between programs
      int pid = find([](const Node& n) { return n.kind == NodeKind::ProgramId; });
      if (pid >= 0 && node(pid).dtype == node(u).dtype) {
        Node s;
        s.kind = NodeKind::Binary;
        s.sub = static_cast<int>(OpKind::add);
        s.args = {u, pid};
        u = add(s);
      }
    }
    b.args = {l, u};
    open_loop(b, [&] { body(static_cast<int>(rng_.range(2, 8))); });
  }

  template <class F>
  void open_loop(Node b, F inner) {
    int begin = add(b);
    Node& bn = node(begin);
    bn.dtype = node(bn.args[0]).dtype == DType::i64 || node(bn.args[1]).dtype == DType::i64 ? DType::i64 : DType::i32;
    bn.shape = {};
    const Tile lbv = e_.value(bn.args[0]), ubv = e_.value(bn.args[1]);
    const int64_t step = bn.ivalue;
    for_range(lbv, ubv, step, [&](Tile iv) {
      e_.set_value(static_cast<size_t>(begin), iv);
      nested(inner, begin);
    });
    node(begin).dtype = e_.value(begin).dtype();
    Node end;
    end.kind = NodeKind::LoopEnd;
    add(end);
  }

  void branch() {
    int x = find([&](const Node& n) { return n.exact && n.shape.empty() && n.dtype != DType::i1; });
    if (x < 0) return;
    int y = operand_like(node(x).dtype, {}, true);
    if (!node(y).shape.empty()) return;
    Node cmpn;
    cmpn.kind = NodeKind::Binary;
    cmpn.sub = static_cast<int>(OpKind::cmp);
    cmpn.ivalue = rng_.range(0, 5);
    cmpn.args = {x, y};
    int cond = add(cmpn);
    Node b;
    b.kind = NodeKind::IfBegin;
    b.args = {cond};
    add(b);
    if_(
        e_.value(cond),
        [&] {
          nested([&] { body(static_cast<int>(rng_.range(1, 5))); });
          Node m;
          m.kind = NodeKind::IfElse;
          add(m);
        },
        [&] {
          nested([&] { body(static_cast<int>(rng_.range(0, 4))); });
        });
    Node end;
    end.kind = NodeKind::IfEnd;
    add(end);
  }

  // The K loop of a GEMM (wgmma and TMA when the shapes allow): acc += A[m0, k] @ B[k, n0].
  void gemm_loop() {
    const TensorSpec& A = p_.tensors[static_cast<size_t>(dot_a_)];
    const DType acc_t = A.dtype == DType::i8 ? DType::i32 : DType::f32;
    Node zn;
    zn.kind = NodeKind::Constant;
    zn.dtype = acc_t;
    zn.shape = {p_.R, p_.C};
    zn.small = true;
    int z = add(zn);
    Node vd;
    vd.kind = NodeKind::VarDecl;
    vd.var = var_count_++;
    vd.args = {z};
    add(vd);
    vars_.push_back({true});
    const int var = vd.var;
    Node lb, ub;
    lb.kind = ub.kind = NodeKind::Constant;
    lb.dtype = ub.dtype = DType::i32;
    lb.ivalue = 0;
    ub.ivalue = A.shape[1] / dot_k_ + rng_.range(0, 1);
    Node b;
    b.kind = NodeKind::LoopBegin;
    b.ivalue = 1;
    b.args = {add(lb), add(ub)};
    open_loop(b, [&] {
      const int iv = scopes_.back().front();  // the loop's begin node: its value is the counter
      Node kk;
      kk.kind = NodeKind::Constant;
      kk.dtype = DType::i32;
      kk.ivalue = dot_k_;
      Node m;
      m.kind = NodeKind::Binary;
      m.sub = static_cast<int>(OpKind::mul);
      m.args = {iv, add(kk)};
      const int k0 = add(m);
      Node rd;
      rd.kind = NodeKind::VarRead;
      rd.var = var;
      int acc = add(rd);
      dot_node(k0, acc);
    });
  }

  // dot of windows of the two dot inputs (at K offset k0 when >= 0), plus acc when given.
  int dot_node(int k0, int acc = -1) {
    Node z;
    z.kind = NodeKind::Constant;
    z.dtype = DType::i32;
    z.ivalue = 0;
    int zero = add(z);
    if (k0 < 0 && tma_ && rng_.chance(0.5)) {  // a K offset of whole 16 bytes: A's window may be a TMA tile
      Node c;
      c.kind = NodeKind::Constant;
      c.dtype = DType::i32;
      c.ivalue = 8 * rng_.range(0, dot_k_ / 8);
      k0 = add(c);
    }
    if (k0 < 0) k0 = offset_node(true, dot_k_);
    if (node(k0).dtype != DType::i32) k0 = cast_to(DType::i32, k0);
    Node a;
    a.kind = NodeKind::LoadBlock;
    a.tensor = dot_a_;
    a.shape = {p_.R, dot_k_};
    a.args = {zero, k0};
    a.small = true;
    Node bb = a;
    bb.tensor = dot_b_;
    bb.shape = {dot_k_, p_.C};
    bb.args = {k0, zero};
    Node d;
    d.kind = NodeKind::Dot;
    d.ivalue = hints_.chance(0.5);  // DotOptions::descriptors_at_use
    d.args = {add(a), add(bb)};
    if (acc >= 0) d.args.push_back(acc);
    int r = add(d);
    if (acc >= 0) {
      Node as;
      as.kind = NodeKind::VarAssign;
      as.var = node(acc).var;
      as.args = {r};
      add(as);
    }
    return r;
  }

  void store_some() {
    std::vector<int> free;
    for (size_t t = 0; t < p_.tensors.size(); ++t)
      if (p_.tensors[t].output && !p_.tensors[t].accumulator && !written_[t] && static_cast<int>(t) != epilogue_ &&
          static_cast<int>(t) != readback_)
        free.push_back(static_cast<int>(t));
    int x = find([](const Node&) { return true; });
    if (free.empty() || x < 0) return;
    store_into(rng_.pick(free), x);
  }

  // x as a [R, C] tile of output t's dtype (exact for an integer output)
  int stored_value(int t, int x) {
    x = to_main_shape(x);
    if (x < 0) x = constant(p_.tensors[static_cast<size_t>(t)].dtype, {p_.R, p_.C});
    const TensorSpec& ts = p_.tensors[static_cast<size_t>(t)];
    if (!node(x).exact && !ir::is_float(ts.dtype)) x = constant(ts.dtype, {p_.R, p_.C});
    if (node(x).dtype != ts.dtype) x = cast_to(ts.dtype, x);
    return x;
  }

  void store_into(int t, int x) {
    x = stored_value(t, x);
    const TensorSpec& ts = p_.tensors[static_cast<size_t>(t)];
    Node n;
    n.kind = NodeKind::Store;
    n.tensor = t;
    // (an output for TMA stores: only window stores, which may be ragged or outside it)
    n.sub = is_tma_output(t) ? 1 : static_cast<int>(rng_.range(0, 2));
    n.ivalue = n.sub == 1 && hints_.chance(0.5);  // StoreOptions::offsets_at_store (with --tma-stores)
    n.args = {x};
    if (n.sub == 1 && is_tma_output(t)) {
      n.args.push_back(tma_offset(p_.R, 1));
      n.args.push_back(tma_offset(p_.C, 16 / ir::byte_size(ts.dtype)));
    } else if (n.sub == 1) {
      // Inside a loop, offsets that do not move between iterations: a window that moves would have
      // other threads store an element again, which the GPU orders only across a barrier (README).
      n.args.push_back(offset_node(false, p_.R / 2 + 1, depth_ > 0));
      n.args.push_back(offset_node(false, p_.C / 2 + 1, depth_ > 0));
    } else if (n.sub == 2) {
      int m = find([&](const Node& c) {
        return c.dtype == DType::i1 && c.exact && broadcastable(c.shape, {p_.R, p_.C}) &&
               broadcast_shape(c.shape, {p_.R, p_.C}) == Shape{p_.R, p_.C};
      });
      if (m < 0) n.sub = 0;
      else n.args.push_back(m);
    }
    written_[static_cast<size_t>(t)] = true;
    int i = add(n);
    node(i).exact = node(x).exact;
    stored_exact_[static_cast<size_t>(t)] = node(x).exact;
    if (tma_ && is_tma_output(t) && depth_ == 0) {  // (--tma-stores: read back now or at the end, run())
      tma_at_[static_cast<size_t>(t)] = {n.args[1], n.args[2]};
      if (readback_ >= 0 && !written_[static_cast<size_t>(readback_)] && rng_.chance(0.5)) after_tma_store(t);
    }
  }

  void atomics() {
    if (atomic_ptr_ >= 0 && rng_.chance(0.6)) {
      DType d = p_.tensors[static_cast<size_t>(atomic_ptr_)].dtype;
      int x = find([&](const Node& n) { return n.exact && broadcastable(n.shape, {p_.R, p_.C}); });
      if (x < 0) return;
      x = to_main_shape(x);
      if (x < 0) return;
      if (node(x).dtype != d) x = cast_to(d, x);
      Node n;
      n.kind = NodeKind::AtomicAdd;
      n.tensor = atomic_ptr_;
      n.args = {x};
      add(n);
      atomic_ptr_ = -1;  // once per program: a second add would return order-dependent values
    } else if (atomic_block_ >= 0) {
      DType d = p_.tensors[static_cast<size_t>(atomic_block_)].dtype;
      int x = find([&](const Node& n) { return n.exact && ir::is_int(n.dtype) && n.dtype != DType::i1; });
      if (x < 0) return;
      x = to_main_shape(x);
      if (x < 0) return;
      if (node(x).dtype != d) x = cast_to(d, x);
      Node n;
      n.kind = NodeKind::AtomicBlock;
      n.sub = block_rmw_;
      n.tensor = atomic_block_;
      n.args = {x, offset_node(false, 2), offset_node(false, 2)};
      add(n);
    }
  }

  Program& p_;
  Rng rng_;
  // Schedule hints with no effect on values (Node::ivalue of dots and TMA stores): drawn from a
  // stream of their own, so that a seed's program is the one it was before the hints existed
  Rng hints_;
  GenerateOptions o_;
  Emitter e_;
  std::vector<std::vector<int>> scopes_;
  std::vector<bool> written_, stored_exact_;  // per tensor: stored yet; that store exact
  int depth_ = 0;
  int dot_a_ = -1, dot_b_ = -1;
  int64_t dot_k_ = 16;
  int atomic_ptr_ = -1, atomic_block_ = -1, block_rmw_ = 0;
  bool tma_ = false;           // --tma-stores: this program's shapes and some outputs suit TMA stores
  std::vector<int> tma_outs_;  // those outputs (only window stores write them: tma_output)
  std::vector<std::array<int, 2>> tma_at_;  // per tensor: the offsets of its last top-level TMA store
  int readback_ = -1;          // the output that after_tma_store stores what it read back into (-1: none)
  int epilogue_ = -1;          // the one of them that tma_epilogue stores a dot into (-1: none)
};

}  // namespace

Program generate(uint64_t seed, const GenerateOptions& opts) {
  Program p;
  p.seed = seed;
  p.tma_stores = opts.tma_stores;
  kernel("fuzz", [&](Builder& b) { Generator(p, b, opts).run(); }).build();
  return p;
}

}  // namespace tilejit::fuzz
