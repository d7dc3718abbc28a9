// The interpreter's Machine: one object that runs programs of a grid op by op over flat row-major
// element vectors (runtime/interpreter.hpp is the public entry). Its members are grouped by op
// family, each group defined in the runtime/interpreter/*.cpp file named at its section comment;
// this header is shared by those files only (internal to runtime/).
#pragma once
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dsl/ir/atomic.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::runtime::interp {

using ir::DType;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

// The run-time value of one SSA value: floats in `f` (each exactly representable in its dtype),
// integers, i1, pointers and tensor descriptors ([base, sizes..., strides...]) in `i`. Slots are
// indexed by ValueId and reused, so a loop body allocates only on its first iteration.
struct Slot {
  std::vector<double> f;
  std::vector<int64_t> i;
};

// An argument's allocation: the only memory a kernel may touch.
struct Buffer {
  uint64_t start = 0;
  uint64_t bytes = 0;
  size_t arg = 0;
  std::string name;
};

// Integer wrapping to a dtype's width without a call or a switch per element.
struct Wrap {
  int shift = 0;  // 64 - width
  bool sign = false;
  explicit Wrap(DType t) : shift(64 - ir::bit_width(t)), sign(ir::is_signed(t)) {}
  int64_t operator()(uint64_t v) const {
    if (shift == 0) return static_cast<int64_t>(v);
    if (sign) return static_cast<int64_t>(v << shift) >> shift;
    return static_cast<int64_t>((v << shift) >> shift);
  }
};

// Calls body(round) with `round` the rounding of a double result to float dtype `t`, chosen once
// so that the element loops inside `body` are specialised per rounding.
template <class F>
void with_rounder(DType t, F&& body) {
  switch (t) {
    case DType::f64: body([](double x) { return x; }); return;
    case DType::f32: body([](double x) { return static_cast<double>(static_cast<float>(x)); }); return;
    default: body([t](double x) { return element::round_float(t, x); }); return;
  }
}

// PTX min/max.NaN semantics: a NaN operand gives NaN; -0 orders below +0.
inline double min_nan(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
inline double max_nan(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

// The GPU's .ftz: a subnormal (below 2^-126 in magnitude) becomes a zero of the same sign.
inline double flush_subnormal(double v) { return v != 0 && std::fabs(v) < 0x1p-126 ? std::copysign(0.0, v) : v; }

// An atomic float add as the GPU computes it: f32 (PTX atom/red.add.f32 and the TMA reduce-add)
// flushes subnormal inputs and results to sign-preserving zero; other float types round only.
inline double atomic_float_add(DType d, double old, double x) {
  if (d != DType::f32) return element::round_float(d, old + x);
  return flush_subnormal(element::round_float(d, flush_subnormal(old) + flush_subnormal(x)));
}

// One element's update by `rmw` (not compare-and-swap): the new value of a float element.
inline double rmw_float(ir::AtomicRmw rmw, DType d, double old, double x) {
  switch (rmw) {
    case ir::AtomicRmw::add: return atomic_float_add(d, old, x);
    case ir::AtomicRmw::max: return std::fmax(old, x);
    case ir::AtomicRmw::min: return std::fmin(old, x);
    default: return x;  // xchg (floats take no bitwise op)
  }
}

// ... and of an integer element (values held sign- or zero-extended to 64 bits by dtype, so the
// comparisons are the dtype's own).
inline int64_t rmw_int(ir::AtomicRmw rmw, DType d, int64_t old, int64_t x) {
  const Wrap wrap(d);
  const auto uo = static_cast<uint64_t>(old), ux = static_cast<uint64_t>(x);
  const bool sg = ir::is_signed(d);
  switch (rmw) {
    case ir::AtomicRmw::add: return wrap(uo + ux);
    case ir::AtomicRmw::max: return sg ? std::max(old, x) : static_cast<int64_t>(std::max(uo, ux));
    case ir::AtomicRmw::min: return sg ? std::min(old, x) : static_cast<int64_t>(std::min(uo, ux));
    case ir::AtomicRmw::and_: return wrap(uo & ux);
    case ir::AtomicRmw::or_: return wrap(uo | ux);
    case ir::AtomicRmw::xor_: return wrap(uo ^ ux);
    case ir::AtomicRmw::xchg: return x;
  }
  return x;
}

// The high 64 bits of a 64 x 64-bit product (mul.hi.u64).
inline uint64_t umulhi64(uint64_t a, uint64_t b) {
  // Schoolbook on 32-bit halves (no __int128, which -Wpedantic rejects).
  uint64_t al = a & 0xFFFFFFFFu, ah = a >> 32, bl = b & 0xFFFFFFFFu, bh = b >> 32;
  uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
  uint64_t mid = (ll >> 32) + (lh & 0xFFFFFFFFu) + (hl & 0xFFFFFFFFu);
  return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
}

// PTX prmt.b32, default mode: result byte i is byte (nibble i of s) & 7 of the 8 bytes {b:a}, or,
// when the nibble's bit 3 is set, that byte's bit 7 in all 8 bits.
inline uint32_t byte_perm32(uint32_t a, uint32_t b, uint32_t s) {
  const uint64_t src = uint64_t{b} << 32 | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = (s >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (nibble & 7u))) & 0xFFu;
    if (nibble & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
}

// A numeric attribute (int64 or double) converted to dtype `t` the way a cast would
// (interpreter/elementwise.cpp).
void convert_attr(const ir::Attr& a, DType t, double& f, int64_t& i);

// Kernels that wait on semaphores run each program on its own thread (a program may wait for one
// that comes later in the grid). Semaphore updates and atomics are serialised by `mu`; a wait
// sleeps on `cv`. When every live program is waiting, none can ever proceed: a deadlock, reported
// as an error by every waiter instead of a hang.
struct Concurrency {
  std::mutex mu;
  std::condition_variable cv;
  int64_t alive = 0;
  int64_t waiting = 0;      // programs asleep since the last signal (a signal wakes and uncounts them all)
  uint64_t generation = 0;  // signals so far
  bool deadlock = false;
};

class Machine {
 public:
  // ------------------------------------------------------------ programs (interpreter/program.cpp)
  Machine(const ir::Function& f, Grid grid, const std::vector<Arg>& args);
  void run();  // every program of the grid, z outer, then y, then x
  // One program, beside the others (concurrent mode).
  void run_program(int64_t x, int64_t y, int64_t z, Concurrency& sync);

 private:
  // ------------------------------------------------------------ launch checks (interpreter/program.cpp)
  [[noreturn]] void arg_error(size_t i, const std::string& msg) const;
  void check_grid() const;
  void bind(const std::vector<Arg>& args);
  void bind_scalar(size_t i, const Arg& a, Slot& s) const;
  void bind_buffer(size_t i, const Arg& a, Slot& s);

  // ------------------------------------------------------------ execution (interpreter/program.cpp)
  Slot& S(ValueId v) { return slots_[v]; }
  const ir::Type& T(ValueId v) const { return f_.values[v].type; }
  size_t N(ValueId v) const { return static_cast<size_t>(numel_[v]); }
  bool is_float_slot(ValueId v) const { return T(v).is_value() && ir::is_float(T(v).dtype); }
  static void copy_slot(Slot& dst, const Slot& src) {
    dst.f = src.f;  // assignment keeps dst's capacity: no allocation once warm
    dst.i = src.i;
  }
  // Runs the ops of `b` up to its yield, which it returns (nullptr for the kernel body).
  const Op* run_block(const ir::Block& b) {
    for (const Op& op : b.ops) {
      if (op.kind == OpKind::yield) return &op;
      exec(op);
    }
    return nullptr;
  }
  void exec(const Op& op);  // one op, dispatched to its family below

  // ------------------------------------------------------------ elementwise, conversions, shapes (interpreter/elementwise.cpp)
  void constant_op(const Op& op);
  void arange_op(const Op& op);
  void splat_op(const Op& op);
  void broadcast_op(const Op& op);
  void trans_op(const Op& op);
  void permute(const Op& op, const std::vector<int64_t>& src_strides);
  void binary(const Op& op);  // every elementwise binary op and cmp
  void unary(const Op& op);
  void byte_perm_op(const Op& op);
  void fma_op(const Op& op);
  void select_op(const Op& op);
  void cast_op(const Op& op);
  void bitcast_op(const Op& op);
  void pairs_op(const Op& op);  // pack_pairs, unpack_pairs

  // ------------------------------------------------------------ reductions (interpreter/reductions.cpp)
  void reduce_op(const Op& op);
  void histogram_op(const Op& op);

  // ------------------------------------------------------------ scans and reductions with a combine region (interpreter/combine.cpp)
  void combine_op(const Op& op);  // scan, reduce_with
  void xor_permute_op(const Op& op);
  void gather_op(const Op& op);
  void combine_pair(const Op& op, const std::vector<const Slot*>& a, const std::vector<size_t>& ai, const std::vector<const Slot*>& b,
                    const std::vector<size_t>& bi, std::vector<Slot>& out);

  // ------------------------------------------------------------ dot (interpreter/dot.cpp)
  void dot_op(const Op& op);

  // ------------------------------------------------------------ faults and memory (interpreter/memory.cpp)
  [[noreturn]] void fault(const Op& op, const std::string& msg, int64_t elem = -1, const ir::Shape* tile = nullptr) const;
  // The host address of `size` bytes at device address `addr`, after checking that they lie inside
  // one argument buffer and are aligned to `size`.
  std::byte* access(const Op& op, uint64_t addr, uint64_t size, const char* verb, int64_t elem, const ir::Shape& tile);
  std::string out_of_bounds(uint64_t addr, uint64_t size, const char* verb) const;
  void addptr_op(const Op& op);
  void load_op(const Op& op);
  void store_op(const Op& op);
  void atomic_add_op(const Op& op);
  void atomic_rmw_op(const Op& op);  // and atomic_cas
  void slice_op(const Op& op);
  void block_op(const Op& op);  // block_load, block_store

  // ------------------------------------------------------------ control flow and synchronisation (interpreter/control_flow.cpp)
  void for_op(const Op& op);
  void if_op(const Op& op);
  void warp_roles_op(const Op& op);
  void channel_push_op(const Op& op);
  void channel_pop_op(const Op& op);
  void wait_op(const Op& op);
  // Until *sem >= target (the semaphore operand and the target operand of `op`).
  void wait_until(const Op& op, ir::ValueId sem, ir::ValueId target_id);
  void signal_op(const Op& op);
  void signal_by(const Op& op, ir::ValueId sem, int64_t add);  // *sem += add (release): waiters wake

  // ------------------------------------------------------------ state
  const ir::Function& f_;
  std::vector<Slot> slots_;
  std::vector<int64_t> numel_;
  std::vector<Buffer> buffers_;
  size_t last_ = 0;  // the buffer the previous access hit: consecutive accesses usually share it
  int64_t grid_[3] = {1, 1, 1};
  int64_t pid_[3] = {0, 0, 0};
  std::vector<double> row_f_;  // dot's row accumulators, kept to avoid a per-dot allocation
  std::vector<int64_t> row_i_;
  std::vector<double> tf32_a_, tf32_b_;  // a tf32 dot's rounded inputs
  Concurrency* sync_ = nullptr;  // concurrent mode (kernels that wait on semaphores)
  std::map<std::pair<int64_t, int64_t>, Slot> channel_;  // lang::Channel tiles pushed, not yet popped: (channel, index)
};

}  // namespace tilejit::runtime::interp
