// The tile-IR interpreter: argument checking, then every program of the grid run op by op over
// flat row-major element vectors, with every memory access checked against the argument buffers.
#include "runtime/interpreter.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace tilejit::runtime {
namespace {

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

// exp and exp2 below f64 run as ex2.approx.ftz on the GPU: results under 2^-126 are zero.
inline double flush_exp(ir::DType d, double v) { return d != ir::DType::f64 && v < 0x1p-126 ? 0.0 : v; }

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

// A numeric attribute (int64 or double) converted to dtype `t` the way a cast would.
void convert_attr(const ir::Attr& a, DType t, double& f, int64_t& i) {
  if (const auto* iv = std::get_if<int64_t>(&a)) {
    if (ir::is_float(t)) f = element::int_to_float(t, *iv, DType::i64);
    else i = element::int_to_int(t, *iv);
  } else {
    double d = std::get<double>(a);
    if (ir::is_float(t)) f = element::round_float(t, d);
    else i = element::float_to_int(t, d);
  }
}

// dst[flat] = src[offset] over `shape` in row-major order, offset = sum idx[d] * strides[d].
template <class T>
void gather(const std::vector<T>& src, std::vector<T>& dst, const ir::Shape& shape, const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  dst.resize(static_cast<size_t>(n));
  if (shape.empty()) {
    dst[0] = src[0];
    return;
  }
  const size_t r = shape.size();
  const int64_t inner = shape[r - 1], istride = strides[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t flat = 0; flat < n; flat += inner) {
    for (int64_t j = 0; j < inner; ++j) dst[static_cast<size_t>(flat + j)] = src[static_cast<size_t>(off + j * istride)];
    for (size_t d = r - 1; d-- > 0;) {
      off += strides[d];
      if (++idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

std::vector<int64_t> row_major_strides(const ir::Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

std::string unravel(int64_t flat, const ir::Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ","));
}

enum class Pred { eq, ne, lt, le, gt, ge };

Pred parse_pred(const std::string& p) {
  if (p == "eq") return Pred::eq;
  if (p == "ne") return Pred::ne;
  if (p == "lt") return Pred::lt;
  if (p == "le") return Pred::le;
  if (p == "gt") return Pred::gt;
  if (p == "ge") return Pred::ge;
  throw std::logic_error("cmp: unknown predicate " + p);
}

template <class T>
inline bool compare(Pred p, T a, T b) {
  switch (p) {
    case Pred::eq: return a == b;
    case Pred::ne: return a != b;
    case Pred::lt: return a < b;
    case Pred::le: return a <= b;
    case Pred::gt: return a > b;
    case Pred::ge: return a >= b;
  }
  return false;
}

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
  Machine(const ir::Function& f, Grid grid, const std::vector<Arg>& args) : f_(f), slots_(f.values.size()) {
    grid_[0] = grid.x;
    grid_[1] = grid.y;
    grid_[2] = grid.z;
    numel_.resize(f.values.size());
    for (size_t v = 0; v < f.values.size(); ++v) numel_[v] = f.values[v].type.numel();
    check_grid();
    bind(args);
  }

  void run() {
    for (pid_[2] = 0; pid_[2] < grid_[2]; ++pid_[2])
      for (pid_[1] = 0; pid_[1] < grid_[1]; ++pid_[1])
        for (pid_[0] = 0; pid_[0] < grid_[0]; ++pid_[0]) run_block(f_.body);
  }
  // One program, beside the others (concurrent mode).
  void run_program(int64_t x, int64_t y, int64_t z, Concurrency& sync) {
    pid_[0] = x, pid_[1] = y, pid_[2] = z;
    sync_ = &sync;
    run_block(f_.body);
  }

 private:
  // ---- launch checks -------------------------------------------------------------------------

  [[noreturn]] void arg_error(size_t i, const std::string& msg) const {
    throw InterpretError(fmt::format("kernel '{}': argument {} '{}': {}", f_.name, i, f_.params[i].name, msg));
  }

  void check_grid() const {
    for (int64_t g : grid_)
      if (g < 1 || g > kI32Max)
        throw InterpretError(fmt::format("kernel '{}': grid ({},{},{}) is invalid: every dimension must be in [1, {}]",
                                         f_.name, grid_[0], grid_[1], grid_[2], kI32Max));
  }

  void bind(const std::vector<Arg>& args) {
    if (args.size() != f_.params.size()) {
      std::vector<std::string> names;
      for (const auto& p : f_.params) names.push_back(p.name);
      throw InterpretError(fmt::format("kernel '{}' takes {} argument{} ({}), got {}", f_.name, f_.params.size(),
                                       f_.params.size() == 1 ? "" : "s", fmt::join(names, ", "), args.size()));
    }
    for (size_t i = 0; i < args.size(); ++i) {
      const ir::Param& p = f_.params[i];
      Slot& s = slots_[p.value];
      if (p.kind == ir::ParamKind::Scalar) bind_scalar(i, args[i], s);
      else bind_buffer(i, args[i], s);
    }
  }

  void bind_scalar(size_t i, const Arg& a, Slot& s) const {
    const ir::Param& p = f_.params[i];
    const DType d = p.type.dtype;
    const std::string dn(ir::name(d));
    if (a.kind() == Arg::Kind::Buffer)
      arg_error(i, fmt::format("got {} but the parameter is the scalar {}", a.describe(), dn));
    if (d == DType::i1) {
      if (a.kind() != Arg::Kind::Bool) arg_error(i, fmt::format("got {} but the parameter is i1: pass a bool", a.describe()));
      s.i.assign(1, a.as_bool() ? 1 : 0);
      return;
    }
    if (a.kind() == Arg::Kind::Bool)
      arg_error(i, fmt::format("got a bool but the parameter is {}: bool is accepted only for i1 parameters", dn));
    if (ir::is_float(d)) {
      double v = a.kind() == Arg::Kind::Float ? element::round_float(d, a.as_double())
                 : a.kind() == Arg::Kind::Int ? element::int_to_float(d, a.as_int(), DType::i64)
                                              : element::int_to_float(d, static_cast<int64_t>(a.as_uint()), DType::u64);
      s.f.assign(1, v);
      return;
    }
    if (a.kind() == Arg::Kind::Float)
      arg_error(i, fmt::format("got {} but the parameter is the integer type {}: pass an integer (convert explicitly if "
                               "truncation is meant)", a.describe(), dn));
    const int w = ir::bit_width(d);
    bool fits;
    std::string range;
    if (ir::is_signed(d)) {
      const int64_t hi = w == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (w - 1)) - 1, lo = -hi - 1;
      fits = a.kind() == Arg::Kind::Int ? a.as_int() >= lo && a.as_int() <= hi : a.as_uint() <= static_cast<uint64_t>(hi);
      range = fmt::format("{} to {}", lo, hi);
    } else {
      const uint64_t hi = w == 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << w) - 1;
      fits = a.kind() == Arg::Kind::Int ? a.as_int() >= 0 && static_cast<uint64_t>(a.as_int()) <= hi : a.as_uint() <= hi;
      range = fmt::format("0 to {}", hi);
    }
    if (!fits) arg_error(i, fmt::format("{} does not fit the parameter's type {} (valid: {})", a.describe(), dn, range));
    s.i.assign(1, a.kind() == Arg::Kind::Int ? a.as_int() : static_cast<int64_t>(a.as_uint()));
  }

  void bind_buffer(size_t i, const Arg& a, Slot& s) {
    const ir::Param& p = f_.params[i];
    const std::string pt = ir::to_string(p.type);
    if (a.kind() != Arg::Kind::Buffer) arg_error(i, fmt::format("got {} but the parameter is {}: pass a HostTensor", a.describe(), pt));
    const HostTensor& t = *a.tensor();
    if (t.dtype() != p.type.dtype)
      arg_error(i, fmt::format("buffer holds {} but the parameter is {}", ir::name(t.dtype()), pt));
    const auto base = reinterpret_cast<uint64_t>(t.data());
    const uint64_t es = static_cast<uint64_t>(ir::byte_size(t.dtype()));
    const uint64_t align = p.spec.align_bytes > 0 ? static_cast<uint64_t>(p.spec.align_bytes) : es;
    if (base % align != 0)
      arg_error(i, fmt::format("base address {:#x} is not a multiple of {} bytes, the alignment the parameter requires", base, align));
    if (p.kind == ir::ParamKind::Pointer) {
      s.i.assign(1, static_cast<int64_t>(base));
    } else {
      if (t.rank() != p.type.rank)
        arg_error(i, fmt::format("buffer {} has rank {} but the parameter is {}", t.describe(), t.rank(), pt));
      if (p.spec.contiguous_last && t.rank() > 0 && t.strides().back() != 1)
        arg_error(i, fmt::format("buffer {} has innermost stride {} but the parameter requires it to be 1", t.describe(),
                                 t.strides().back()));
      for (int d = 0; d + 1 < t.rank(); ++d)
        if ((static_cast<uint64_t>(t.strides()[static_cast<size_t>(d)]) * es) % align != 0)
          arg_error(i, fmt::format("buffer {} has stride {} ({} bytes) in dim {}, not a multiple of {} bytes, the alignment the "
                                   "parameter requires of its rows",
                                   t.describe(), t.strides()[static_cast<size_t>(d)],
                                   static_cast<uint64_t>(t.strides()[static_cast<size_t>(d)]) * es, d, align));
      for (int d = 0; d < t.rank(); ++d)
        if (t.sizes()[static_cast<size_t>(d)] > kI32Max)
          arg_error(i, fmt::format("buffer {} has size {} in dim {}; tensor sizes must fit in i32 (at most {})", t.describe(),
                                   t.sizes()[static_cast<size_t>(d)], d, kI32Max));
      s.i.clear();
      s.i.push_back(static_cast<int64_t>(base));
      s.i.insert(s.i.end(), t.sizes().begin(), t.sizes().end());
      s.i.insert(s.i.end(), t.strides().begin(), t.strides().end());
    }
    buffers_.push_back({base, static_cast<uint64_t>(t.bytes()), i, p.name});
  }

  // ---- faults and memory ---------------------------------------------------------------------

  [[noreturn]] void fault(const Op& op, const std::string& msg, int64_t elem = -1, const ir::Shape* tile = nullptr) const {
    std::string where = elem >= 0 && tile && !tile->empty() ? ", tile element " + unravel(elem, *tile) : std::string{};
    throw InterpretError(fmt::format("kernel '{}': {} at {} in program ({},{},{}){}: {}", f_.name, ir::op_name(op.kind),
                                     op.loc.str(), pid_[0], pid_[1], pid_[2], where, msg));
  }

  // The host address of `size` bytes at device address `addr`, after checking that they lie inside
  // one argument buffer and are aligned to `size`.
  std::byte* access(const Op& op, uint64_t addr, uint64_t size, const char* verb, int64_t elem, const ir::Shape& tile) {
    auto inside = [&](const Buffer& b) {
      uint64_t off = addr - b.start;  // wraps to a huge value below the start
      return off < b.bytes && b.bytes - off >= size;
    };
    if (last_ >= buffers_.size() || !inside(buffers_[last_])) {
      size_t k = 0;
      while (k < buffers_.size() && !inside(buffers_[k])) ++k;
      if (k == buffers_.size()) fault(op, out_of_bounds(addr, size, verb), elem, &tile);
      last_ = k;
    }
    if (addr % size != 0) {
      const Buffer& b = buffers_[last_];
      fault(op, fmt::format("{} {} bytes at offset {} of argument {} '{}', which is not a multiple of {} (misaligned access)",
                            verb, size, addr - b.start, b.arg, b.name, size), elem, &tile);
    }
    return reinterpret_cast<std::byte*>(addr);
  }

  std::string out_of_bounds(uint64_t addr, uint64_t size, const char* verb) const {
    if (buffers_.empty()) return fmt::format("{} {} bytes at address {:#x}, but no buffer was passed to the kernel", verb, size, addr);
    const Buffer* best = nullptr;
    uint64_t best_dist = 0;
    for (const Buffer& b : buffers_) {
      uint64_t dist = addr < b.start ? b.start - addr : addr - b.start < b.bytes ? 0 : addr - b.start - b.bytes;
      if (!best || dist < best_dist) best = &b, best_dist = dist;
    }
    const int64_t off = static_cast<int64_t>(addr - best->start);
    const char* rel = off < 0 ? "before the start of"
                      : static_cast<uint64_t>(off) >= best->bytes ? "past the end of"
                                                                  : "running past the end of";
    return fmt::format("{} {} bytes at offset {} {} argument {} '{}' ({} bytes)", verb, size, off, rel, best->arg, best->name,
                       best->bytes);
  }

  // ---- execution -----------------------------------------------------------------------------

  Slot& S(ValueId v) { return slots_[v]; }
  const ir::Type& T(ValueId v) const { return f_.values[v].type; }
  size_t N(ValueId v) const { return static_cast<size_t>(numel_[v]); }

  // Runs the ops of `b` up to its yield, which it returns (nullptr for the kernel body).
  const Op* run_block(const ir::Block& b) {
    for (const Op& op : b.ops) {
      if (op.kind == OpKind::yield) return &op;
      exec(op);
    }
    return nullptr;
  }

  static void copy_slot(Slot& dst, const Slot& src) {
    dst.f = src.f;  // assignment keeps dst's capacity: no allocation once warm
    dst.i = src.i;
  }

  void exec(const Op& op) {
    using enum OpKind;
    if (ir::is_elementwise_binary(op.kind) || op.kind == cmp) return binary(op);
    if (ir::is_elementwise_unary(op.kind)) return unary(op);
    switch (op.kind) {
      case constant: return constant_op(op);
      case arange: {
        Slot& r = S(op.results[0]);
        const int64_t start = op.int_attr("start");
        r.i.resize(N(op.results[0]));
        for (size_t k = 0; k < r.i.size(); ++k) r.i[k] = start + static_cast<int64_t>(k);
        return;
      }
      case splat: {
        const Slot& a = S(op.operands[0]);
        Slot& r = S(op.results[0]);
        if (is_float_slot(op.operands[0])) r.f.assign(N(op.results[0]), a.f[0]);
        else r.i.assign(N(op.results[0]), a.i[0]);
        return;
      }
      case broadcast: {
        const ir::Shape& in = T(op.operands[0]).shape;
        std::vector<int64_t> st = row_major_strides(in);
        for (size_t d = 0; d < in.size(); ++d)
          if (in[d] == 1) st[d] = 0;
        return permute(op, st);
      }
      case trans: {
        const auto& perm = op.ints_attr("perm");
        std::vector<int64_t> in_st = row_major_strides(T(op.operands[0]).shape), st(perm.size());
        for (size_t d = 0; d < perm.size(); ++d) st[d] = in_st[static_cast<size_t>(perm[d])];
        return permute(op, st);
      }
      case expand_dims:
      case reshape: return copy_slot(S(op.results[0]), S(op.operands[0]));
      case select: return select_op(op);
      case byte_perm: {
        const auto &a = S(op.operands[0]).i, &b = S(op.operands[1]).i, &sel = S(op.operands[2]).i;
        auto& r = S(op.results[0]).i;
        const Wrap wrap(T(op.results[0]).dtype);  // i32 results sign-extended, as every i32 slot
        r.resize(a.size());
        for (size_t k = 0; k < a.size(); ++k)
          r[k] = wrap(byte_perm32(static_cast<uint32_t>(a[k]), static_cast<uint32_t>(b[k]), static_cast<uint32_t>(sel[k])));
        return;
      }
      case fma: {
        const auto &a = S(op.operands[0]).f, &b = S(op.operands[1]).f, &c = S(op.operands[2]).f;
        auto& r = S(op.results[0]).f;
        const bool single = T(op.results[0]).dtype == DType::f32;
        r.resize(a.size());
        for (size_t k = 0; k < a.size(); ++k)
          r[k] = single ? static_cast<double>(std::fma(static_cast<float>(a[k]), static_cast<float>(b[k]), static_cast<float>(c[k])))
                        : std::fma(a[k], b[k], c[k]);
        return;
      }
      case cast: return cast_op(op);
      case bitcast: return bitcast_op(op);
      case pack_pairs:
      case unpack_pairs: return pairs_op(op);
      case precompute: S(op.results[0]) = S(op.operands[0]); return;  // the same value
      case reduce: return reduce_op(op);
      case dot: return dot_op(op);
      case program_id: S(op.results[0]).i.assign(1, pid_[op.int_attr("axis")]); return;
      case num_programs: S(op.results[0]).i.assign(1, grid_[op.int_attr("axis")]); return;
      case tensor_ptr: S(op.results[0]).i.assign(1, S(op.operands[0]).i[0]); return;
      case tensor_dim: S(op.results[0]).i.assign(1, S(op.operands[0]).i[1 + static_cast<size_t>(op.int_attr("dim"))]); return;
      case tensor_stride: {
        const size_t rank = static_cast<size_t>(T(op.operands[0]).rank);
        S(op.results[0]).i.assign(1, S(op.operands[0]).i[1 + rank + static_cast<size_t>(op.int_attr("dim"))]);
        return;
      }
      case tensor_slice: return slice_op(op);
      case addptr: {
        const auto es = static_cast<uint64_t>(ir::byte_size(T(op.operands[0]).dtype));
        const auto& p = S(op.operands[0]).i;
        const auto& off = S(op.operands[1]).i;
        auto& r = S(op.results[0]).i;
        r.resize(p.size());
        for (size_t k = 0; k < p.size(); ++k)
          r[k] = static_cast<int64_t>(static_cast<uint64_t>(p[k]) + static_cast<uint64_t>(off[k]) * es);
        return;
      }
      case load: return load_op(op);
      case store: return store_op(op);
      case atomic_add: {
        std::unique_lock<std::mutex> lock;
        if (sync_) lock = std::unique_lock(sync_->mu);
        return atomic_add_op(op);
      }
      case wait_ge: return wait_op(op);
      case signal_add: return signal_op(op);
      case turn_begin:
      case turn_end: return;  // a schedule of warpgroups: no effect on values
      case block_load: return block_op(op);
      case block_store: {
        if (op.attrs.count("after_semaphore")) wait_until(op, op.operands[op.operands.size() - 2], op.operands.back());
        std::unique_lock<std::mutex> lock;  // atomic_add on a window: one update at a time
        if (sync_ && op.attrs.count("reduce")) lock = std::unique_lock(sync_->mu);
        return block_op(op);
      }
      case for_: return for_op(op);
      case if_: return if_op(op);
      case warp_roles: {
        // the roles share no tiles or Vars, only channels: one after the other, the pushing roles
        // first (a role that pops and pushes runs after the roles it pops from)
        std::vector<const ir::Block*> order;
        for (bool pushing : {true, false})
          for (const ir::Block& role : op.regions) {
            bool pushes = false;
            ir::walk(role, [&](const Op& o) { pushes = pushes || o.kind == channel_push; });
            if (pushes == pushing) order.push_back(&role);
          }
        for (const ir::Block* role : order) run_block(*role);
        return;
      }
      case channel_push: {
        auto key = std::pair{op.int_attr("channel"), S(op.operands[0]).i[0]};
        if (channel_.count(key)) fault(op, fmt::format("channel index {} is pushed twice", key.second));
        channel_[key] = S(op.operands[1]);
        return;
      }
      case channel_pop: {
        auto key = std::pair{op.int_attr("channel"), S(op.operands[0]).i[0]};
        auto it = channel_.find(key);
        if (it == channel_.end()) fault(op, fmt::format("channel index {} is popped before it was pushed (or twice)", key.second));
        S(op.results[0]) = std::move(it->second);
        channel_.erase(it);
        return;
      }
      default: break;
    }
    fault(op, "the interpreter does not implement this op");
  }

  bool is_float_slot(ValueId v) const { return T(v).is_value() && ir::is_float(T(v).dtype); }

  void constant_op(const Op& op) {
    const ValueId res = op.results[0];
    double f = 0;
    int64_t i = 0;
    convert_attr(op.attrs.at("value"), T(res).dtype, f, i);
    if (is_float_slot(res)) S(res).f.assign(N(res), f);
    else S(res).i.assign(N(res), i);
  }

  void permute(const Op& op, const std::vector<int64_t>& src_strides) {
    const Slot& a = S(op.operands[0]);
    Slot& r = S(op.results[0]);
    const ir::Shape& out = T(op.results[0]).shape;
    if (is_float_slot(op.operands[0])) gather(a.f, r.f, out, src_strides);
    else gather(a.i, r.i, out, src_strides);
  }

  void binary(const Op& op) {
    using enum OpKind;
    const DType d = T(op.operands[0]).dtype;
    const size_t n = N(op.operands[0]);
    const Slot& A = S(op.operands[0]);
    const Slot& B = S(op.operands[1]);
    Slot& R = S(op.results[0]);
    if (op.kind == cmp) {
      const Pred p = parse_pred(op.str_attr("pred"));
      R.i.resize(n);
      if (ir::is_float(d)) {
        for (size_t k = 0; k < n; ++k) R.i[k] = compare(p, A.f[k], B.f[k]);
      } else if (ir::is_signed(d)) {
        for (size_t k = 0; k < n; ++k) R.i[k] = compare(p, A.i[k], B.i[k]);
      } else {
        for (size_t k = 0; k < n; ++k) R.i[k] = compare(p, static_cast<uint64_t>(A.i[k]), static_cast<uint64_t>(B.i[k]));
      }
      return;
    }
    if (ir::is_float(d)) {
      R.f.resize(n);
      const double* a = A.f.data();
      const double* b = B.f.data();
      double* r = R.f.data();
      with_rounder(d, [&](auto rnd) {
        switch (op.kind) {
          case add: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] + b[k]); return;
          case sub: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] - b[k]); return;
          case mul: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] * b[k]); return;
          case div: for (size_t k = 0; k < n; ++k) r[k] = rnd(a[k] / b[k]); return;
          case rem: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::fmod(a[k], b[k])); return;
          case minimum: for (size_t k = 0; k < n; ++k) r[k] = min_nan(a[k], b[k]); return;
          case maximum: for (size_t k = 0; k < n; ++k) r[k] = max_nan(a[k], b[k]); return;
          default: fault(op, "not defined for floating-point operands");
        }
      });
      return;
    }
    R.i.resize(n);
    const int64_t* a = A.i.data();
    const int64_t* b = B.i.data();
    int64_t* r = R.i.data();
    const Wrap wrap(d);
    const bool sgn = ir::is_signed(d);
    const int w = ir::bit_width(d);
    const uint64_t wmask = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
    auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    switch (op.kind) {
      case add: for (size_t k = 0; k < n; ++k) r[k] = wrap(u(a[k]) + u(b[k])); return;
      case sub: for (size_t k = 0; k < n; ++k) r[k] = wrap(u(a[k]) - u(b[k])); return;
      case mul: for (size_t k = 0; k < n; ++k) r[k] = wrap(u(a[k]) * u(b[k])); return;
      case div:
        // Never traps: x/0 is all bits set, MIN/-1 wraps to MIN (what the GPU's div gives).
        for (size_t k = 0; k < n; ++k) {
          if (b[k] == 0) r[k] = wrap(~uint64_t{0});
          else if (sgn) r[k] = b[k] == -1 ? wrap(0 - u(a[k])) : a[k] / b[k];
          else r[k] = wrap(u(a[k]) / u(b[k]));
        }
        return;
      case rem:
        for (size_t k = 0; k < n; ++k) {
          if (b[k] == 0) r[k] = a[k];
          else if (sgn) r[k] = b[k] == -1 ? 0 : a[k] % b[k];
          else r[k] = wrap(u(a[k]) % u(b[k]));
        }
        return;
      case minimum:
        if (sgn) for (size_t k = 0; k < n; ++k) r[k] = std::min(a[k], b[k]);
        else for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(std::min(u(a[k]), u(b[k])));
        return;
      case maximum:
        if (sgn) for (size_t k = 0; k < n; ++k) r[k] = std::max(a[k], b[k]);
        else for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(std::max(u(a[k]), u(b[k])));
        return;
      case bit_and: for (size_t k = 0; k < n; ++k) r[k] = a[k] & b[k]; return;
      case bit_or: for (size_t k = 0; k < n; ++k) r[k] = a[k] | b[k]; return;
      case bit_xor: for (size_t k = 0; k < n; ++k) r[k] = a[k] ^ b[k]; return;
      case shl:
        // The amount is read as an unsigned number of the operand width; >= width shifts everything out.
        for (size_t k = 0; k < n; ++k) {
          uint64_t s = u(b[k]) & wmask;
          r[k] = s >= static_cast<uint64_t>(w) ? 0 : wrap(u(a[k]) << s);
        }
        return;
      case shr:
        for (size_t k = 0; k < n; ++k) {
          uint64_t s = u(b[k]) & wmask;
          if (sgn) r[k] = s >= static_cast<uint64_t>(w) ? (a[k] < 0 ? -1 : 0) : a[k] >> s;
          else r[k] = s >= static_cast<uint64_t>(w) ? 0 : static_cast<int64_t>(u(a[k]) >> s);
        }
        return;
      case umulhi:
        if (w == 32) {
          for (size_t k = 0; k < n; ++k) r[k] = wrap(((u(a[k]) & 0xFFFFFFFFu) * (u(b[k]) & 0xFFFFFFFFu)) >> 32);
        } else {
          for (size_t k = 0; k < n; ++k) r[k] = static_cast<int64_t>(umulhi64(u(a[k]), u(b[k])));
        }
        return;
      default: fault(op, "not defined for integer operands");
    }
  }

  void unary(const Op& op) {
    using enum OpKind;
    const DType d = T(op.operands[0]).dtype;
    const size_t n = N(op.operands[0]);
    const Slot& A = S(op.operands[0]);
    Slot& R = S(op.results[0]);
    if (ir::is_float(d)) {
      R.f.resize(n);
      const double* a = A.f.data();
      double* r = R.f.data();
      with_rounder(d, [&](auto rnd) {
        switch (op.kind) {
          case neg: for (size_t k = 0; k < n; ++k) r[k] = -a[k]; return;
          case abs: for (size_t k = 0; k < n; ++k) r[k] = std::fabs(a[k]); return;
          // The GPU's ex2.approx.ftz flushes results below 2^-126 to zero (for f32, f16, bf16).
          case exp: for (size_t k = 0; k < n; ++k) r[k] = rnd(flush_exp(d, std::exp(a[k]))); return;
          case exp2: for (size_t k = 0; k < n; ++k) r[k] = rnd(flush_exp(d, std::exp2(a[k]))); return;
          case log: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::log(a[k])); return;
          case log2: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::log2(a[k])); return;
          case sqrt: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::sqrt(a[k])); return;
          case rsqrt: for (size_t k = 0; k < n; ++k) r[k] = rnd(1.0 / std::sqrt(a[k])); return;
          case rcp:  // rcp.approx.ftz below f64: subnormal inputs read as zero, subnormal results flush
            for (size_t k = 0; k < n; ++k) {
              const bool ftz = d != DType::f64;
              const double x = ftz && std::fabs(a[k]) < 0x1p-126 ? std::copysign(0.0, a[k]) : a[k];
              const double v = rnd(1.0 / x);
              r[k] = ftz && std::fabs(v) < 0x1p-126 ? std::copysign(0.0, v) : v;
            }
            return;
          case floor: for (size_t k = 0; k < n; ++k) r[k] = std::floor(a[k]); return;
          case ceil: for (size_t k = 0; k < n; ++k) r[k] = std::ceil(a[k]); return;
          case tanh: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::tanh(a[k])); return;
          case sin: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::sin(a[k])); return;
          case cos: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::cos(a[k])); return;
          case erf: for (size_t k = 0; k < n; ++k) r[k] = rnd(std::erf(a[k])); return;
          default: fault(op, "not defined for floating-point operands");
        }
      });
      return;
    }
    R.i.resize(n);
    const int64_t* a = A.i.data();
    int64_t* r = R.i.data();
    const Wrap wrap(d);
    auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    switch (op.kind) {
      case neg: for (size_t k = 0; k < n; ++k) r[k] = wrap(0 - u(a[k])); return;
      case bit_not: for (size_t k = 0; k < n; ++k) r[k] = wrap(~u(a[k])); return;
      case abs:
        if (ir::is_signed(d)) for (size_t k = 0; k < n; ++k) r[k] = a[k] < 0 ? wrap(0 - u(a[k])) : a[k];
        else std::copy(a, a + n, r);
        return;
      default: fault(op, "not defined for integer operands");
    }
  }

  void select_op(const Op& op) {
    const auto& c = S(op.operands[0]).i;
    const Slot& A = S(op.operands[1]);
    const Slot& B = S(op.operands[2]);
    Slot& R = S(op.results[0]);
    const size_t n = c.size();
    if (is_float_slot(op.operands[1])) {
      R.f.resize(n);
      for (size_t k = 0; k < n; ++k) R.f[k] = c[k] ? A.f[k] : B.f[k];
    } else {
      R.i.resize(n);
      for (size_t k = 0; k < n; ++k) R.i[k] = c[k] ? A.i[k] : B.i[k];
    }
  }

  void cast_op(const Op& op) {
    const DType from = T(op.operands[0]).dtype, to = T(op.results[0]).dtype;
    const size_t n = N(op.operands[0]);
    const Slot& A = S(op.operands[0]);
    Slot& R = S(op.results[0]);
    const bool ff = ir::is_float(from), tf = ir::is_float(to);
    if (from == to) {  // a no-op, also for NaN payloads (an f32 round trip would quiet them)
      copy_slot(R, A);
    } else if (ff && tf) {
      R.f.resize(n);
      with_rounder(to, [&](auto rnd) {
        for (size_t k = 0; k < n; ++k) R.f[k] = rnd(A.f[k]);
      });
    } else if (!ff && tf) {
      R.f.resize(n);
      for (size_t k = 0; k < n; ++k) R.f[k] = element::int_to_float(to, A.i[k], from);
    } else if (ff) {
      R.i.resize(n);
      for (size_t k = 0; k < n; ++k) R.i[k] = element::float_to_int(to, A.f[k]);
    } else {
      R.i.resize(n);
      for (size_t k = 0; k < n; ++k) R.i[k] = element::int_to_int(to, A.i[k]);
    }
  }

  void bitcast_op(const Op& op) {
    const DType from = T(op.operands[0]).dtype, to = T(op.results[0]).dtype;
    const size_t n = N(op.operands[0]);
    const Slot& A = S(op.operands[0]);
    Slot& R = S(op.results[0]);
    const bool ff = ir::is_float(from), tf = ir::is_float(to);
    if (tf) R.f.resize(n);
    else R.i.resize(n);
    double f = 0;
    int64_t i = 0;
    for (size_t k = 0; k < n; ++k) {
      element::from_bits(to, element::to_bits(from, ff ? A.f[k] : 0.0, ff ? 0 : A.i[k]), f, i);
      if (tf) R.f[k] = f;
      else R.i[k] = i;
    }
  }

  // pack_pairs: word j = bits of elements 2j, 2j + 1 (low, high); unpack_pairs: the inverse.
  void pairs_op(const Op& op) {
    const DType from = T(op.operands[0]).dtype, to = T(op.results[0]).dtype;
    const Slot& A = S(op.operands[0]);
    Slot& R = S(op.results[0]);
    const bool ff = ir::is_float(from), tf = ir::is_float(to);
    const size_t n = N(op.results[0]);
    if (tf) R.f.resize(n);
    else R.i.resize(n);
    auto bits = [&](size_t k) { return element::to_bits(from, ff ? A.f[k] : 0.0, ff ? 0 : A.i[k]); };
    double f = 0;
    int64_t i = 0;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t v = op.kind == OpKind::pack_pairs ? (bits(2 * k) & 0xFFFF) | (bits(2 * k + 1) & 0xFFFF) << 16
                                                       : bits(k / 2) >> (16 * (k % 2)) & 0xFFFF;
      element::from_bits(to, v, f, i);
      if (tf) R.f[k] = f;
      else R.i[k] = i;
    }
  }

  void reduce_op(const Op& op) {
    const ir::Type& t = T(op.operands[0]);
    const auto axis = static_cast<size_t>(op.int_attr("axis"));
    const std::string& kind = op.str_attr("kind");
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < axis; ++d) outer *= t.shape[d];
    for (size_t d = axis + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
    const int64_t len = t.shape[axis];
    const Slot& A = S(op.operands[0]);
    Slot& R = S(op.results[0]);
    const auto at = [&](int64_t o, int64_t j, int64_t in) { return static_cast<size_t>((o * len + j) * inner + in); };
    const auto out = [&](int64_t o, int64_t in) { return static_cast<size_t>(o * inner + in); };
    if (ir::is_float(t.dtype)) {
      R.f.resize(static_cast<size_t>(outer * inner));
      with_rounder(t.dtype, [&](auto rnd) {
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t in = 0; in < inner; ++in) {
            double acc = A.f[at(o, 0, in)];
            if (kind == "sum") {
              // One rounding at the end: the reference the GPU's tree order is measured against.
              for (int64_t j = 1; j < len; ++j) acc += A.f[at(o, j, in)];
              acc = rnd(acc);
            } else if (kind == "max") {
              for (int64_t j = 1; j < len; ++j) acc = max_nan(acc, A.f[at(o, j, in)]);
            } else {
              for (int64_t j = 1; j < len; ++j) acc = min_nan(acc, A.f[at(o, j, in)]);
            }
            R.f[out(o, in)] = acc;
          }
      });
      return;
    }
    R.i.resize(static_cast<size_t>(outer * inner));
    const Wrap wrap(t.dtype);
    const bool sgn = ir::is_signed(t.dtype);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        int64_t acc = A.i[at(o, 0, in)];
        for (int64_t j = 1; j < len; ++j) {
          int64_t x = A.i[at(o, j, in)];
          if (kind == "sum") acc = wrap(static_cast<uint64_t>(acc) + static_cast<uint64_t>(x));
          else if (sgn) acc = kind == "max" ? std::max(acc, x) : std::min(acc, x);
          else {
            auto ua = static_cast<uint64_t>(acc), ux = static_cast<uint64_t>(x);
            acc = static_cast<int64_t>(kind == "max" ? std::max(ua, ux) : std::min(ua, ux));
          }
        }
        R.i[out(o, in)] = acc;
      }
  }

  void dot_op(const Op& op) {
    const ir::Shape& as = T(op.operands[0]).shape;
    const ir::Shape& bs = T(op.operands[1]).shape;
    const size_t M = static_cast<size_t>(as[0]), K = static_cast<size_t>(as[1]), Nn = static_cast<size_t>(bs[1]);
    const Slot& A = S(op.operands[0]);
    const Slot& B = S(op.operands[1]);
    const Slot& C = S(op.operands[2]);
    Slot& R = S(op.results[0]);
    if (ir::is_float(T(op.operands[0]).dtype)) {
      // m, k, n order: the inner loop runs over contiguous rows of b and of the row sum.
      R.f.resize(M * Nn);
      row_f_.resize(Nn);
      for (size_t m = 0; m < M; ++m) {
        std::fill(row_f_.begin(), row_f_.end(), 0.0);
        for (size_t k = 0; k < K; ++k) {
          const double av = A.f[m * K + k];
          const double* brow = B.f.data() + k * Nn;
          for (size_t n = 0; n < Nn; ++n) row_f_[n] += av * brow[n];
        }
        for (size_t n = 0; n < Nn; ++n)
          R.f[m * Nn + n] = static_cast<double>(static_cast<float>(C.f[m * Nn + n] + row_f_[n]));
      }
      return;
    }
    R.i.resize(M * Nn);
    row_i_.resize(Nn);
    for (size_t m = 0; m < M; ++m) {
      std::fill(row_i_.begin(), row_i_.end(), 0);
      for (size_t k = 0; k < K; ++k) {
        const int64_t av = A.i[m * K + k];
        const int64_t* brow = B.i.data() + k * Nn;
        for (size_t n = 0; n < Nn; ++n) row_i_[n] += av * brow[n];  // |sum| < 2^14 * K: no overflow
      }
      for (size_t n = 0; n < Nn; ++n)
        R.i[m * Nn + n] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(C.i[m * Nn + n] + row_i_[n])));
    }
  }

  void load_op(const Op& op) {
    const ir::Type& pt = T(op.operands[0]);
    const DType d = pt.dtype;
    const auto es = static_cast<uint64_t>(ir::byte_size(d));
    const auto& p = S(op.operands[0]).i;
    const bool masked = op.operands.size() == 3;
    const std::vector<int64_t>* mask = masked ? &S(op.operands[1]).i : nullptr;
    const Slot* other = masked ? &S(op.operands[2]) : nullptr;
    Slot& R = S(op.results[0]);
    const size_t n = p.size();
    if (ir::is_float(d)) {
      R.f.resize(n);
      for (size_t k = 0; k < n; ++k)
        R.f[k] = mask && !(*mask)[k]
                     ? other->f[k]
                     : element::read_float(d, access(op, static_cast<uint64_t>(p[k]), es, "reads", static_cast<int64_t>(k), pt.shape));
    } else {
      R.i.resize(n);
      for (size_t k = 0; k < n; ++k)
        R.i[k] = mask && !(*mask)[k]
                     ? other->i[k]
                     : element::read_int(d, access(op, static_cast<uint64_t>(p[k]), es, "reads", static_cast<int64_t>(k), pt.shape));
    }
  }

  void store_op(const Op& op) {
    const ir::Type& pt = T(op.operands[0]);
    const DType d = pt.dtype;
    const auto es = static_cast<uint64_t>(ir::byte_size(d));
    const auto& p = S(op.operands[0]).i;
    const Slot& V = S(op.operands[1]);
    const std::vector<int64_t>* mask = op.operands.size() == 3 ? &S(op.operands[2]).i : nullptr;
    const bool fl = ir::is_float(d);
    for (size_t k = 0; k < p.size(); ++k) {
      if (mask && !(*mask)[k]) continue;
      std::byte* q = access(op, static_cast<uint64_t>(p[k]), es, "writes", static_cast<int64_t>(k), pt.shape);
      if (fl) element::write_float(d, q, V.f[k]);
      else element::write_int(d, q, V.i[k]);
    }
  }

  void atomic_add_op(const Op& op) {
    const ir::Type& pt = T(op.operands[0]);
    const DType d = pt.dtype;
    const auto es = static_cast<uint64_t>(ir::byte_size(d));
    const auto& p = S(op.operands[0]).i;
    const Slot& V = S(op.operands[1]);
    const std::vector<int64_t>* mask = op.operands.size() == 3 ? &S(op.operands[2]).i : nullptr;
    Slot& R = S(op.results[0]);
    const size_t n = p.size();
    if (ir::is_float(d)) {
      R.f.assign(n, 0.0);  // masked-off elements return 0
      for (size_t k = 0; k < n; ++k) {
        if (mask && !(*mask)[k]) continue;
        std::byte* q = access(op, static_cast<uint64_t>(p[k]), es, "atomically updates", static_cast<int64_t>(k), pt.shape);
        const double old = element::read_float(d, q);
        element::write_float(d, q, element::round_float(d, old + V.f[k]));
        R.f[k] = old;
      }
    } else {
      R.i.assign(n, 0);
      const Wrap wrap(d);
      for (size_t k = 0; k < n; ++k) {
        if (mask && !(*mask)[k]) continue;
        std::byte* q = access(op, static_cast<uint64_t>(p[k]), es, "atomically updates", static_cast<int64_t>(k), pt.shape);
        const int64_t old = element::read_int(d, q);
        element::write_int(d, q, wrap(static_cast<uint64_t>(old) + static_cast<uint64_t>(V.i[k])));
        R.i[k] = old;
      }
    }
  }

  std::byte* semaphore(const Op& op, const char* verb) {
    static const ir::Shape scalar_shape;
    return access(op, static_cast<uint64_t>(S(op.operands[0]).i[0]), 4, verb, -1, scalar_shape);
  }

  void wait_op(const Op& op) { wait_until(op, op.operands[0], op.operands[1]); }
  // Until *sem >= target (the semaphore operand and the target operand of `op`).
  void wait_until(const Op& op, ir::ValueId sem, ir::ValueId target_id) {
    static const ir::Shape scalar_shape;
    std::byte* p = access(op, static_cast<uint64_t>(S(sem).i[0]), 4, "waits on", -1, scalar_shape);
    const int64_t target = S(target_id).i[0];
    auto value = [&] { return element::read_int(DType::i32, p); };
    // kernels that wait always run concurrently (interpret() checks), so sync_ is set here
    std::unique_lock lock(sync_->mu);
    while (value() < target) {
      if (sync_->deadlock) break;
      if (++sync_->waiting == sync_->alive) {  // everyone asleep and no signal since: nobody can wake them
        sync_->deadlock = true;
        sync_->cv.notify_all();
        break;
      }
      const uint64_t gen = sync_->generation;
      sync_->cv.wait(lock, [&] { return sync_->generation != gen || sync_->deadlock; });
      if (sync_->generation == gen) --sync_->waiting;  // (a signal already uncounted it)
    }
    if (value() < target)
      fault(op, fmt::format("deadlock: waits for the semaphore to reach {} but it is {}, and every program still running waits too",
                            target, value()));
  }

  void signal_op(const Op& op) {
    std::byte* p = semaphore(op, "signals");
    std::unique_lock<std::mutex> lock;
    if (sync_) lock = std::unique_lock(sync_->mu);
    const int64_t v = element::read_int(DType::i32, p) + S(op.operands[1]).i[0];
    element::write_int(DType::i32, p, static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v))));
    if (sync_) {
      ++sync_->generation;
      sync_->waiting = 0;
      sync_->cv.notify_all();
    }
  }

  // A view of a tensor: dim `dim` starts at `start` and has `length` elements. It must lie inside
  // the parent, so that windows bounds-checked against the view never leave the parent either.
  void slice_op(const Op& op) {
    const auto rank = static_cast<size_t>(T(op.operands[0]).rank);
    const auto dim = static_cast<size_t>(op.int_attr("dim"));
    const std::vector<int64_t>& parent = S(op.operands[0]).i;
    const int64_t start = S(op.operands[1]).i[0], length = S(op.operands[2]).i[0], size = parent[1 + dim];
    if (start < 0 || length < 0 || start > size - length)
      fault(op, fmt::format("the slice [{}, {}) of dim {} (start {}, length {}) is not inside the tensor, whose dim {} has size {}",
                            start, start + length, dim, start, length, dim, size));
    std::vector<int64_t>& r = S(op.results[0]).i;
    r = parent;
    const auto es = static_cast<uint64_t>(ir::byte_size(T(op.operands[0]).dtype));
    r[0] = static_cast<int64_t>(static_cast<uint64_t>(parent[0]) + static_cast<uint64_t>(start * parent[1 + rank + dim]) * es);
    r[1 + dim] = length;
  }

  // block_load / block_store: a window of a strided tensor, element (t_0..t_{k-1}) at coordinate
  // c[dims[i]] = off[dims[i]] + t_i, c[d] = off[d] elsewhere; out-of-range elements are padding
  // (load) or skipped (store).
  void block_op(const Op& op) {
    const bool is_load = op.kind == OpKind::block_load;
    const bool add = !is_load && op.attrs.count("reduce");  // atomic_add on a window
    const ir::Type& tt = T(op.operands[0]);
    const DType d = tt.dtype;
    const Wrap wrap(d);
    const auto rank = static_cast<size_t>(tt.rank);
    const auto es = static_cast<uint64_t>(ir::byte_size(d));
    const auto& desc = S(op.operands[0]).i;
    const uint64_t base = static_cast<uint64_t>(desc[0]);
    const int64_t* size = desc.data() + 1;
    const int64_t* stride = desc.data() + 1 + rank;
    const size_t first_off = is_load ? 1 : 2;
    std::vector<int64_t> off(rank);
    for (size_t j = 0; j < rank; ++j) off[j] = S(op.operands[first_off + j]).i[0];
    const auto& dims = op.ints_attr("dims");
    const ir::Shape& tile = is_load ? op.ints_attr("shape") : T(op.operands[1]).shape;
    const size_t k = dims.size();

    // The dims the window does not span contribute one fixed coordinate each.
    bool fixed_in = true;
    int64_t fixed = 0;
    for (size_t j = 0; j < rank; ++j) {
      if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(j)) != dims.end()) continue;
      if (off[j] < 0 || off[j] >= size[j]) fixed_in = false;
      else fixed += off[j] * stride[j];
    }

    const bool fl = ir::is_float(d);
    double pad_f = 0;
    int64_t pad_i = 0;
    Slot* R = nullptr;
    const Slot* V = nullptr;
    int64_t n = 1;
    for (int64_t s : tile) n *= s;
    if (is_load) {
      convert_attr(op.attrs.at("padding"), d, pad_f, pad_i);
      R = &S(op.results[0]);
      if (fl) R->f.resize(static_cast<size_t>(n));
      else R->i.resize(static_cast<size_t>(n));
    } else {
      V = &S(op.operands[1]);
    }

    std::vector<int64_t> t(k, 0);
    for (int64_t e = 0; e < n; ++e) {
      bool in = fixed_in;
      int64_t elem_off = fixed;
      for (size_t i = 0; i < k && in; ++i) {
        const auto dim = static_cast<size_t>(dims[i]);
        // off + t in [0, size) without forming off + t, which may overflow for wild offsets
        if (off[dim] < -t[i] || off[dim] >= size[dim] - t[i]) in = false;
        else elem_off += (off[dim] + t[i]) * stride[dim];
      }
      const auto ue = static_cast<size_t>(e);
      if (is_load) {
        if (!in) {
          if (fl) R->f[ue] = pad_f;
          else R->i[ue] = pad_i;
        } else {
          const std::byte* q = access(op, base + static_cast<uint64_t>(elem_off) * es, es, "reads", e, tile);
          if (fl) R->f[ue] = element::read_float(d, q);
          else R->i[ue] = element::read_int(d, q);
        }
      } else if (in && add) {
        std::byte* q = access(op, base + static_cast<uint64_t>(elem_off) * es, es, "atomically updates", e, tile);
        if (fl) element::write_float(d, q, element::round_float(d, element::read_float(d, q) + V->f[ue]));
        else element::write_int(d, q, wrap(static_cast<uint64_t>(element::read_int(d, q)) + static_cast<uint64_t>(V->i[ue])));
      } else if (in) {
        std::byte* q = access(op, base + static_cast<uint64_t>(elem_off) * es, es, "writes", e, tile);
        if (fl) element::write_float(d, q, V->f[ue]);
        else element::write_int(d, q, V->i[ue]);
      }
      for (size_t i = k; i-- > 0;) {  // next tile index, row-major
        if (++t[i] < tile[i]) break;
        t[i] = 0;
      }
    }
  }

  void for_op(const Op& op) {
    const ir::Block& body = op.regions[0];
    const DType bt = T(op.operands[0]).dtype;
    const bool uns = !ir::is_signed(bt);
    const int64_t lb = S(op.operands[0]).i[0], ub = S(op.operands[1]).i[0], step = S(op.operands[2]).i[0];
    if (uns ? step == 0 : step <= 0) fault(op, fmt::format("for_range step must be positive, got {}", step));
    const size_t carried = op.operands.size() - 3;
    for (size_t j = 0; j < carried; ++j) copy_slot(S(body.args[1 + j]), S(op.operands[3 + j]));
    std::vector<Slot> next(carried);  // yields are staged here first: they may read the carried args
    // The iteration count is ceil((ub - lb) / step) computed without wrap-around: the loop stops
    // instead of letting iv + step overflow the bound dtype.
    const auto ustep = static_cast<uint64_t>(step);
    for (int64_t iv = lb; uns ? static_cast<uint64_t>(iv) < static_cast<uint64_t>(ub) : iv < ub;) {
      S(body.args[0]).i.assign(1, iv);
      const Op* y = run_block(body);
      for (size_t j = 0; j < carried; ++j) copy_slot(next[j], S(y->operands[j]));
      for (size_t j = 0; j < carried; ++j) std::swap(S(body.args[1 + j]), next[j]);
      if (uns ? static_cast<uint64_t>(iv) > std::numeric_limits<uint64_t>::max() - ustep
              : iv > std::numeric_limits<int64_t>::max() - step)
        break;
      iv = static_cast<int64_t>(static_cast<uint64_t>(iv) + ustep);
    }
    for (size_t j = 0; j < carried; ++j) copy_slot(S(op.results[j]), S(body.args[1 + j]));
  }

  void if_op(const Op& op) {
    const Op* y = run_block(op.regions[S(op.operands[0]).i[0] != 0 ? 0 : 1]);
    if (!y) {
      if (!op.results.empty()) fault(op, "a region ends without a yield");
      return;
    }
    for (size_t j = 0; j < op.results.size(); ++j) copy_slot(S(op.results[j]), S(y->operands[j]));
  }

  const ir::Function& f_;
  std::vector<Slot> slots_;
  std::vector<int64_t> numel_;
  std::vector<Buffer> buffers_;
  size_t last_ = 0;  // the buffer the previous access hit: consecutive accesses usually share it
  int64_t grid_[3] = {1, 1, 1};
  int64_t pid_[3] = {0, 0, 0};
  std::vector<double> row_f_;  // dot's row accumulators, kept to avoid a per-dot allocation
  std::vector<int64_t> row_i_;
  Concurrency* sync_ = nullptr;  // concurrent mode (kernels that wait on semaphores)
  std::map<std::pair<int64_t, int64_t>, Slot> channel_;  // lang::Channel tiles pushed, not yet popped: (channel, index)
};

bool waits_on_semaphores(const ir::Block& b) {
  for (const ir::Op& op : b.ops) {
    if (op.kind == OpKind::wait_ge || (op.kind == OpKind::block_store && op.attrs.count("after_semaphore"))) return true;
    for (const ir::Block& r : op.regions)
      if (waits_on_semaphores(r)) return true;
  }
  return false;
}

constexpr int64_t kMaxConcurrentPrograms = 4096;

// Every program on its own thread; the first error any program raised is rethrown.
void run_concurrently(const ir::Function& f, Grid grid, const std::vector<Arg>& args) {
  const int64_t n = grid.x * grid.y * grid.z;
  if (n > kMaxConcurrentPrograms)
    throw InterpretError(fmt::format("kernel '{}' waits on semaphores, so the interpreter runs its programs concurrently; grid ({},{},{}) "
                                     "has {} programs, more than the {} it runs at once (a GPU would not keep them resident either)",
                                     f.name, grid.x, grid.y, grid.z, n, kMaxConcurrentPrograms));
  Concurrency sync;
  sync.alive = n;
  std::vector<std::unique_ptr<Machine>> machines;
  for (int64_t i = 0; i < n; ++i) machines.push_back(std::make_unique<Machine>(f, grid, args));
  std::mutex err_mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        machines[static_cast<size_t>(i)]->run_program(i % grid.x, i / grid.x % grid.y, i / (grid.x * grid.y), sync);
      } catch (...) {
        std::lock_guard g(err_mu);
        if (!first) first = std::current_exception();
      }
      std::lock_guard lock(sync.mu);
      if (--sync.alive > 0 && sync.waiting == sync.alive) sync.deadlock = true;
      sync.cv.notify_all();
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace

std::string Arg::describe() const {
  switch (kind_) {
    case Kind::Buffer: return "the buffer " + tensor_->describe();
    case Kind::Int: return fmt::format("the integer {}", i_);
    case Kind::UInt: return fmt::format("the integer {}", u_);
    case Kind::Float: return fmt::format("the float {}", f_);
    case Kind::Bool: return fmt::format("the bool {}", u_ != 0);
  }
  return "?";
}

void interpret(const ir::Function& f, Grid grid, const std::vector<Arg>& args) {
  ir::verify(f);
  if (waits_on_semaphores(f.body)) return run_concurrently(f, grid, args);
  Machine m(f, grid, args);
  m.run();
}

}  // namespace tilejit::runtime
