// The per-thread program on the host (emulator.hpp): values held per thread, instructions applied
// to the threads a mask lets through, structured loops and branches by masks. Arithmetic follows
// the interpreter's element rules (runtime/interpreter/elementwise.cpp), which model the PTX the
// backends emit.
#include "runtime/emulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/host_tensor.hpp"
#include "runtime/interpreter/machine.hpp"  // (the interpreter's element rules: min/max NaN, flushes, prmt)

namespace tilejit::runtime {
namespace {

namespace pir = jit::pir;
using interp::byte_perm32;
using interp::flush_subnormal;
using interp::max_nan;
using interp::min_nan;
using interp::umulhi64;
using ir::DType;
using pir::Op;

// One thread's value: floats in f (exactly representable in their dtype), integers, i1 and
// pointers (host addresses) in i.
struct Val {
  double f = 0;
  int64_t i = 0;
};

bool is_float(pir::Ty t) { return !t.ptr && ir::is_float(t.dtype); }

double emu_round(DType d, double x) {
  if (d == DType::f64) return x;
  if (d == DType::f32) return static_cast<double>(static_cast<float>(x));
  return element::round_float(d, x);
}

int64_t wrap(DType d, uint64_t v) {
  const int w = ir::bit_width(d);
  if (w >= 64) return static_cast<int64_t>(v);
  const int s = 64 - w;
  return ir::is_signed(d) ? static_cast<int64_t>(v << s) >> s : static_cast<int64_t>((v << s) >> s);
}

// The memory a program may touch: the arguments' allocations.
struct Region {
  uint64_t start = 0, bytes = 0;
  std::string name;
};

class Emulator {
 public:
  Emulator(const pir::Func& p, const ir::Function& f, const std::vector<Arg>& args, EmulatorSchedule schedule)
      : p_(p), n_(p.num_threads), schedule_(schedule), rng_(schedule.seed * 0x9E3779B97F4A7C15ull + 1) {
    if (args.size() != f.params.size())
      throw std::invalid_argument(fmt::format("tilejit emulator: kernel '{}' takes {} arguments, got {}", f.name, f.params.size(),
                                              args.size()));
    tensors_.resize(f.params.size());
    for (size_t a = 0; a < args.size(); ++a) bind(a, f.params[a], args[a]);
    // TMA tensor maps: trailing ABI slots whose value names the map (kMapTag + its index)
    for (size_t m = 0; m < p.tensor_maps.size(); ++m) {
      if (static_cast<size_t>(p.tensor_maps[m].abi_slot) != params_.size())
        throw std::logic_error(fmt::format("tilejit emulator: kernel '{}': tensor map {} at ABI slot {}, expected {}", f.name, m,
                                           p.tensor_maps[m].abi_slot, params_.size()));
      params_.push_back(Val{0, kMapTag + static_cast<int64_t>(m)});
    }
    if (params_.size() != p.params.size())
      throw std::logic_error(fmt::format("tilejit emulator: kernel '{}': {} ABI slots bound for {} parameters", f.name,
                                         params_.size(), p.params.size()));
    vals_.resize(p.types.size());
    smem_.resize(static_cast<size_t>(std::max<int64_t>(p.smem_bytes, 0)));
  }

  void run(Grid grid) {
    grid_ = {grid.x, grid.y, grid.z};
    // Warp roles (exit, setmaxnreg, named barriers) wait for each other: each warp then runs on a
    // thread of its own, one at a time, handing over at waits; otherwise the whole program in lockstep.
    per_warp_ = schedule_.warp_by_warp || schedule_.seed != 0 || uses_warp_roles(p_.body);
    for (int64_t z = 0; z < grid.z; ++z)
      for (int64_t y = 0; y < grid.y; ++y)
        for (int64_t x = 0; x < grid.x; ++x) {
          block_ = {x, y, z};
          std::fill(smem_.begin(), smem_.end(), std::byte{0xCD});  // (unwritten shared memory reads as poison)
          mbarriers_.clear();
          barriers_.clear();
          rendezvous_.clear();
          exited_.assign(static_cast<size_t>(n_), 0);
          if (per_warp_) run_warps();
          else exec(p_.body, Mask(static_cast<size_t>(n_), 1));
        }
  }

 private:
  using Mask = std::vector<char>;
  // an argument tensor as TMA sees it, and the tensor maps' parameter values
  struct TensorArg {
    uint64_t base = 0;
    DType dtype = DType::f32;
    ir::Shape sizes, strides;
  };
  static constexpr int64_t kMapTag = int64_t{0x7A3A} << 32;
  // an mbarrier: arrivals still expected in the current phase, transaction bytes, the phase
  struct Mbarrier {
    int64_t count = 0, pending = 0, tx = 0, phase = 0;
  };

  void bind(size_t index, const ir::Param& prm, const Arg& a) {
    const auto push_int = [&](int64_t v) { params_.push_back(Val{0, v}); };
    if (prm.kind == ir::ParamKind::Scalar) {
      const DType d = prm.type.dtype;
      Val v;
      switch (a.kind()) {
        case Arg::Kind::Float:
          if (ir::is_float(d)) v.f = emu_round(d, a.as_double());
          else v.i = element::float_to_int(d, a.as_double());
          break;
        case Arg::Kind::Int:
        case Arg::Kind::Bool:
          if (ir::is_float(d)) v.f = element::int_to_float(d, a.as_int(), DType::i64);
          else v.i = wrap(d, static_cast<uint64_t>(a.kind() == Arg::Kind::Bool ? int64_t{a.as_bool()} : a.as_int()));
          break;
        case Arg::Kind::UInt:
          if (ir::is_float(d)) v.f = element::int_to_float(d, static_cast<int64_t>(a.as_uint()), DType::u64);
          else v.i = wrap(d, a.as_uint());
          break;
        case Arg::Kind::Buffer:
          throw std::invalid_argument(fmt::format("tilejit emulator: parameter '{}' is a scalar, got a buffer", prm.name));
      }
      params_.push_back(v);
      return;
    }
    HostTensor* t = a.tensor();
    if (!t) throw std::invalid_argument(fmt::format("tilejit emulator: parameter '{}' needs a HostTensor", prm.name));
    const auto base = reinterpret_cast<uint64_t>(t->data());
    tensors_[index] = TensorArg{base, t->dtype(), t->sizes(), t->strides()};
    regions_.push_back({base, static_cast<uint64_t>(t->bytes()), prm.name});
    push_int(static_cast<int64_t>(base));
    if (prm.kind == ir::ParamKind::Tensor) {
      for (int64_t s : t->sizes()) push_int(s);
      for (int64_t s : t->strides()) push_int(s);
    }
  }

  std::vector<Val>& vals(pir::V v) {
    std::vector<Val>& x = vals_[v];
    if (x.empty()) x.resize(static_cast<size_t>(n_));
    return x;
  }
  pir::Ty ty(pir::V v) const { return p_.types[v]; }

  [[noreturn]] void fault(const pir::Inst& in, int t, const std::string& what) const {
    throw EmulatorFault(fmt::format("tilejit emulator: kernel '{}': {} in program ({}, {}, {}), thread {}: {}", p_.name,
                                    pir::op_name(in.op), block_[0], block_[1], block_[2], t, what));
  }

  std::byte* global(const pir::Inst& in, int t, uint64_t addr, uint64_t bytes, uint64_t align) {
    if (align > 1 && addr % align != 0) fault(in, t, fmt::format("address {:#x} is not {}-byte aligned", addr, align));
    for (const Region& r : regions_)
      if (addr >= r.start && addr + bytes <= r.start + r.bytes) return reinterpret_cast<std::byte*>(addr);
    fault(in, t, fmt::format("{} bytes at {:#x} lie outside every argument's memory", bytes, addr));
  }
  std::byte* shared(const pir::Inst& in, int t, int64_t offset, int64_t bytes) {
    if (offset < 0 || offset + bytes > static_cast<int64_t>(smem_.size()))
      fault(in, t, fmt::format("shared-memory bytes [{}, {}) outside the program's {} bytes", offset, offset + bytes, smem_.size()));
    return smem_.data() + offset;
  }

  Val read(DType d, const std::byte* p) const {
    Val v;
    if (ir::is_float(d)) v.f = element::read_float(d, p);
    else v.i = element::read_int(d, p);
    return v;
  }
  void write(DType d, std::byte* p, const Val& v) const {
    if (ir::is_float(d)) element::write_float(d, p, v.f);
    else element::write_int(d, p, v.i);
  }

  // Runs a block for the threads of `m`; returns its yield (nullptr without one).
  const pir::Inst* exec(const pir::Block& b, const Mask& m) {
    for (const pir::Inst& in : b.insts) {
      if (in.op == Op::yield) return &in;
      inst(in, m);
    }
    return nullptr;
  }

  template <class F>
  void each(const Mask& m, F&& body) {
    for (int t = 0; t < n_; ++t)
      if (m[static_cast<size_t>(t)] && !exited_[static_cast<size_t>(t)]) body(t);
  }

  static bool uses_warp_roles(const pir::Block& b) {
    for (const pir::Inst& in : b.insts) {
      if (in.op == Op::exit_thread || in.op == Op::set_max_registers || in.op == Op::named_barrier_sync ||
          in.op == Op::named_barrier_arrive)
        return true;
      for (const pir::Block& r : in.regions)
        if (uses_warp_roles(r)) return true;
    }
    return false;
  }

  // ---- per-warp execution: one OS thread per warp, exactly one running (it holds the baton) ----
  struct Aborted {};  // another warp failed: unwind

  void run_warps() {
    const int warps = (n_ + 31) / 32;
    warp_done_.assign(static_cast<size_t>(warps), 0);
    running_ = 0;
    abort_ = false;
    stalls_ = 0;
    error_ = nullptr;
    std::vector<std::thread> threads;
    for (int w = 0; w < warps; ++w) threads.emplace_back([this, w] { warp_main(w); });
    for (std::thread& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
  }

  void warp_main(int w) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return running_ == w || abort_; });
    }
    try {
      if (!abort_) {
        Mask mine(static_cast<size_t>(n_), 0);
        for (int t = 32 * w; t < std::min(n_, 32 * w + 32); ++t) mine[static_cast<size_t>(t)] = 1;
        exec(p_.body, mine);
      }
    } catch (const Aborted&) {
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
      abort_ = true;
    }
    std::lock_guard lock(mu_);
    warp_done_[static_cast<size_t>(w)] = 1;
    for (int t = 32 * w; t < std::min(n_, 32 * w + 32); ++t) exited_[static_cast<size_t>(t)] = 1;  // (counts as arrived)
    stalls_ = 0;
    running_ = next_warp(w);
    cv_.notify_all();
  }

  // The next warp after w (round robin) that has not finished; w itself when none other is left.
  int next_warp(int w) const {
    const int warps = static_cast<int>(warp_done_.size());
    for (int k = 1; k <= warps; ++k) {
      const int c = (w + k) % warps;
      if (!warp_done_[static_cast<size_t>(c)]) return c;
    }
    return w;
  }

  // The running warp waits for `ready` (checked with the baton held), handing the baton round. When
  // every unfinished warp has waited a full round twice with nothing ready: a deadlock.
  template <class Ready>
  void wait_until(int w, const pir::Inst& in, Ready&& ready) {
    std::unique_lock lock(mu_);
    while (!ready()) {
      if (abort_) throw Aborted{};
      int live = 0;
      for (char d : warp_done_) live += d ? 0 : 1;
      if (++stalls_ > 2 * live)
        throw EmulatorFault(fmt::format("tilejit emulator: kernel '{}': deadlock in program ({}, {}, {}): every warp waits ({} in "
                                        "warp {})", p_.name, block_[0], block_[1], block_[2], pir::op_name(in.op), w));
      running_ = next_warp(w);
      cv_.notify_all();
      cv_.wait(lock, [&] { return running_ == w || abort_; });
      if (abort_) throw Aborted{};
    }
    stalls_ = 0;
  }

  // The running warp hands the baton round once even though it could go on: warps interleave at
  // every mbarrier wait, so a wait the lowering forgot shows as a read of a tile not yet written.
  void yield_turn(int w) {
    std::unique_lock lock(mu_);
    if (abort_) throw Aborted{};
    const int next = next_warp(w);
    if (next == w) return;
    running_ = next;
    cv_.notify_all();
    cv_.wait(lock, [&] { return running_ == w || abort_; });
    if (abort_) throw Aborted{};
    stalls_ = 0;  // (this warp goes on running: progress)
  }

  // With a schedule seed: hand over now with probability 1/4 (warp-by-warp execution only).
  void maybe_yield(const Mask& m) {
    if (!per_warp_ || schedule_.seed == 0) return;
    rng_ ^= rng_ << 13, rng_ ^= rng_ >> 7, rng_ ^= rng_ << 17;  // xorshift64
    if ((rng_ & 3) != 0) return;
    const int t0 = first_thread(m);
    if (t0 >= 0) yield_turn(t0 / 32);
  }

  static int first_thread(const Mask& m) {
    for (size_t t = 0; t < m.size(); ++t)
      if (m[t]) return static_cast<int>(t);
    return -1;
  }
  int live_threads() const {
    int n = 0;
    for (char e : exited_) n += e ? 0 : 1;
    return n;
  }
  int active_count(const Mask& m) const {
    int n = 0;
    for (size_t t = 0; t < m.size(); ++t) n += m[t] && !exited_[t] ? 1 : 0;
    return n;
  }

  // bar.sync 0 (expected: every live thread), bar.sync / bar.arrive id, n: a warp's active threads
  // arrive; the barrier completes when the expected count has.
  void barrier(const pir::Inst& in, const Mask& m) {
    const int t0 = first_thread(m);
    if (t0 < 0) return;
    const int w = t0 / 32;
    const bool all = in.op == Op::barrier;
    const int64_t id = all ? 0 : vals(in.args[0])[static_cast<size_t>(t0)].i;
    const int64_t expected = all ? -1 : (in.imm & 0xFFFF);
    Barrier& b = barriers_[id];
    const int64_t gen = b.generation;
    b.arrived += active_count(m);
    stalls_ = 0;
    const auto complete = [&] {
      if (b.generation != gen) return true;
      if (b.arrived >= (expected < 0 ? live_threads() : expected)) {
        b.arrived = 0;
        ++b.generation;
        return true;
      }
      return false;
    };
    if (in.op == Op::named_barrier_arrive) {
      complete();
      return;
    }
    wait_until(w, in, complete);
  }

  // wgmma is warpgroup-collective: the last of a warpgroup's warps to reach it computes it for all.
  void wgmma_collective(const pir::Inst& in, const Mask& m) {
    const int t0 = first_thread(m);
    if (t0 < 0) return;
    const int w = t0 / 32, g = w / 4;
    Rendezvous& r = rendezvous_[g];
    if (r.warps == 0) r.inst = &in, r.mask.assign(static_cast<size_t>(n_), 0);
    if (r.inst != &in) throw EmulatorFault(fmt::format("tilejit emulator: kernel '{}': the warps of warpgroup {} reach different wgmma "
                                                       "instructions", p_.name, g));
    for (size_t t = 0; t < m.size(); ++t) r.mask[t] = r.mask[t] || m[t];
    ++r.warps;
    const int64_t gen = r.generation;
    int live = 0;
    for (int k = 4 * g; k < 4 * g + 4 && 32 * k < n_; ++k) live += exited_[static_cast<size_t>(32 * k)] ? 0 : 1;
    if (r.warps >= live) {
      wgmma(in, r.mask);
      r.warps = 0;
      ++r.generation;
      return;
    }
    wait_until(w, in, [&] { return r.generation != gen; });
  }

  Val binary(const pir::Inst& in, pir::Ty type, const Val& a, const Val& b, int t) const {
    const DType d = type.dtype;
    Val r;
    if (is_float(type)) {
      switch (in.op) {
        case Op::add: r.f = emu_round(d, a.f + b.f); break;
        case Op::sub: r.f = emu_round(d, a.f - b.f); break;
        case Op::mul: r.f = emu_round(d, a.f * b.f); break;
        case Op::div: r.f = emu_round(d, a.f / b.f); break;
        case Op::rem: r.f = emu_round(d, std::fmod(a.f, b.f)); break;
        case Op::minimum: r.f = min_nan(a.f, b.f); break;
        case Op::maximum: r.f = max_nan(a.f, b.f); break;
        default: fault(in, t, "not defined for floating-point operands");
      }
      return r;
    }
    const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    const bool sgn = ir::is_signed(d);
    const int w = ir::bit_width(d);
    const uint64_t wmask = w >= 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
    switch (in.op) {
      case Op::add: r.i = wrap(d, u(a.i) + u(b.i)); break;
      case Op::sub: r.i = wrap(d, u(a.i) - u(b.i)); break;
      case Op::mul: r.i = wrap(d, u(a.i) * u(b.i)); break;
      case Op::div:
        if (b.i == 0) r.i = wrap(d, ~uint64_t{0});
        else if (sgn) r.i = b.i == -1 ? wrap(d, 0 - u(a.i)) : a.i / b.i;
        else r.i = wrap(d, u(a.i) / u(b.i));
        break;
      case Op::rem:
        if (b.i == 0) r.i = a.i;
        else if (sgn) r.i = b.i == -1 ? 0 : a.i % b.i;
        else r.i = wrap(d, u(a.i) % u(b.i));
        break;
      case Op::minimum: r.i = sgn ? std::min(a.i, b.i) : static_cast<int64_t>(std::min(u(a.i), u(b.i))); break;
      case Op::maximum: r.i = sgn ? std::max(a.i, b.i) : static_cast<int64_t>(std::max(u(a.i), u(b.i))); break;
      case Op::bit_and: r.i = a.i & b.i; break;
      case Op::bit_or: r.i = a.i | b.i; break;
      case Op::bit_xor: r.i = a.i ^ b.i; break;
      case Op::shl: {
        const uint64_t s = u(b.i) & wmask;
        r.i = s >= static_cast<uint64_t>(w) ? 0 : wrap(d, u(a.i) << s);
        break;
      }
      case Op::shr: {
        const uint64_t s = u(b.i) & wmask;
        if (sgn) r.i = s >= static_cast<uint64_t>(w) ? (a.i < 0 ? -1 : 0) : a.i >> s;
        else r.i = s >= static_cast<uint64_t>(w) ? 0 : static_cast<int64_t>((u(a.i) & wmask) >> s);
        break;
      }
      case Op::umulhi:
        r.i = w == 32 ? wrap(d, ((u(a.i) & 0xFFFFFFFFu) * (u(b.i) & 0xFFFFFFFFu)) >> 32) : static_cast<int64_t>(umulhi64(u(a.i), u(b.i)));
        break;
      default: fault(in, t, "not defined for integer operands");
    }
    return r;
  }

  Val unary(const pir::Inst& in, pir::Ty type, const Val& a, int t) const {
    const DType d = type.dtype;
    Val r;
    if (is_float(type)) {
      const double x = a.f;
      const auto flush_exp = [&](double v) { return d != DType::f64 && v < 0x1p-126 ? 0.0 : v; };
      switch (in.op) {
        case Op::neg: r.f = -x; break;
        case Op::abs: r.f = std::fabs(x); break;
        case Op::exp: r.f = emu_round(d, flush_exp(std::exp(x))); break;
        case Op::exp2: r.f = emu_round(d, flush_exp(std::exp2(x))); break;
        case Op::log: r.f = emu_round(d, std::log(x)); break;
        case Op::log2: r.f = emu_round(d, std::log2(x)); break;
        case Op::sqrt: r.f = emu_round(d, std::sqrt(x)); break;
        case Op::rsqrt: r.f = emu_round(d, 1.0 / std::sqrt(x)); break;
        case Op::rcp: {
          const bool ftz = d != DType::f64;
          const double v = emu_round(d, 1.0 / (ftz ? flush_subnormal(x) : x));
          r.f = ftz ? flush_subnormal(v) : v;
          break;
        }
        case Op::floor: r.f = std::floor(x); break;
        case Op::ceil: r.f = std::ceil(x); break;
        case Op::tanh: r.f = emu_round(d, std::tanh(x)); break;
        case Op::sin: r.f = emu_round(d, std::sin(x)); break;
        case Op::cos: r.f = emu_round(d, std::cos(x)); break;
        case Op::erf: r.f = emu_round(d, std::erf(x)); break;
        default: fault(in, t, "not defined for floating-point operands");
      }
      return r;
    }
    const auto u = static_cast<uint64_t>(a.i);
    switch (in.op) {
      case Op::neg: r.i = wrap(d, 0 - u); break;
      case Op::bit_not: r.i = wrap(d, ~u); break;
      case Op::abs: r.i = ir::is_signed(d) && a.i < 0 ? wrap(d, 0 - u) : a.i; break;
      default: fault(in, t, "not defined for integer operands");
    }
    return r;
  }

  static bool compare(pir::Pred p, auto a, auto b) {
    switch (p) {
      case pir::Pred::eq: return a == b;
      case pir::Pred::ne: return a != b;
      case pir::Pred::lt: return a < b;
      case pir::Pred::le: return a <= b;
      case pir::Pred::gt: return a > b;
      case pir::Pred::ge: return a >= b;
    }
    return false;
  }

  Val convert(pir::Ty from, pir::Ty to, const Val& a) const {
    Val r;
    if (from.ptr || to.ptr) {  // pointers and their u64 / i64 images
      r.i = a.i;
      return r;
    }
    const bool ff = ir::is_float(from.dtype), tf = ir::is_float(to.dtype);
    if (from.dtype == to.dtype) return a;
    if (ff && tf) r.f = emu_round(to.dtype, a.f);
    else if (!ff && tf) r.f = element::int_to_float(to.dtype, a.i, from.dtype);
    else if (ff) r.i = element::float_to_int(to.dtype, a.f);
    else r.i = element::int_to_int(to.dtype, a.i);
    return r;
  }
  Val reinterpret(pir::Ty from, pir::Ty to, const Val& a) const {
    Val r;
    if (from.ptr || to.ptr) {
      r.i = a.i;
      return r;
    }
    element::from_bits(to.dtype, element::to_bits(from.dtype, a.f, a.i), r.f, r.i);
    return r;
  }

  // One instruction for the threads of `m`: values and control flow here, memory and
  // synchronisation in memory_inst, tensor cores and asynchronous copies in hopper_inst.
  void inst(const pir::Inst& in, const Mask& m) {
    const auto arg = [&](size_t k, int t) -> const Val& { return vals(in.args[k])[static_cast<size_t>(t)]; };
    const auto set = [&](size_t k, int t, const Val& v) { vals(in.results[k])[static_cast<size_t>(t)] = v; };
    const auto out_ty = [&](size_t k = 0) { return ty(in.results[k]); };
    switch (in.op) {
      case Op::constant:
        each(m, [&](int t) {
          Val v;
          if (is_float(out_ty())) v.f = emu_round(out_ty().dtype, in.fimm);
          else v.i = out_ty().ptr ? in.imm : wrap(out_ty().dtype, static_cast<uint64_t>(in.imm));
          set(0, t, v);
        });
        return;
      case Op::param: each(m, [&](int t) { set(0, t, params_.at(static_cast<size_t>(in.imm))); }); return;
      case Op::thread_id: each(m, [&](int t) { set(0, t, Val{0, t}); }); return;
      case Op::block_id: each(m, [&](int t) { set(0, t, Val{0, block_.at(static_cast<size_t>(in.imm))}); }); return;
      case Op::grid_dim: each(m, [&](int t) { set(0, t, Val{0, grid_.at(static_cast<size_t>(in.imm))}); }); return;
      case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::rem: case Op::minimum: case Op::maximum:
      case Op::bit_and: case Op::bit_or: case Op::bit_xor: case Op::shl: case Op::shr: case Op::umulhi:
        each(m, [&](int t) { set(0, t, binary(in, out_ty(), arg(0, t), arg(1, t), t)); });
        return;
      case Op::byte_perm:
        each(m, [&](int t) {
          const uint32_t r = byte_perm32(static_cast<uint32_t>(arg(0, t).i), static_cast<uint32_t>(arg(1, t).i),
                                         static_cast<uint32_t>(arg(2, t).i));
          set(0, t, Val{0, wrap(out_ty().dtype, r)});
        });
        return;
      case Op::fma:
        each(m, [&](int t) {
          const double a = arg(0, t).f, b = arg(1, t).f, c = arg(2, t).f;
          const double r = out_ty().dtype == DType::f32
                               ? static_cast<double>(std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)))
                               : std::fma(a, b, c);
          set(0, t, Val{r, 0});
        });
        return;
      case Op::neg: case Op::bit_not: case Op::abs: case Op::exp2: case Op::log2: case Op::exp: case Op::log:
      case Op::sqrt: case Op::rsqrt: case Op::rcp: case Op::floor: case Op::ceil: case Op::tanh: case Op::sin: case Op::cos:
      case Op::erf:
        each(m, [&](int t) { set(0, t, unary(in, out_ty(), arg(0, t), t)); });
        return;
      case Op::cmp: {
        const pir::Ty a_ty = ty(in.args[0]);
        const auto p = static_cast<pir::Pred>(in.imm);
        each(m, [&](int t) {
          const Val &a = arg(0, t), &b = arg(1, t);
          bool r;
          if (is_float(a_ty)) r = compare(p, a.f, b.f);
          else if (!a_ty.ptr && ir::is_signed(a_ty.dtype)) r = compare(p, a.i, b.i);
          else r = compare(p, static_cast<uint64_t>(a.i), static_cast<uint64_t>(b.i));
          set(0, t, Val{0, r ? 1 : 0});
        });
        return;
      }
      case Op::select: each(m, [&](int t) { set(0, t, arg(0, t).i ? arg(1, t) : arg(2, t)); }); return;
      case Op::cast: each(m, [&](int t) { set(0, t, convert(ty(in.args[0]), out_ty(), arg(0, t))); }); return;
      case Op::bitcast: each(m, [&](int t) { set(0, t, reinterpret(ty(in.args[0]), out_ty(), arg(0, t))); }); return;
      case Op::opaque:
        for (size_t k = 0; k < in.results.size(); ++k) each(m, [&](int t) { set(k, t, arg(k, t)); });
        return;
      case Op::barrier:
      case Op::named_barrier_sync:
      case Op::named_barrier_arrive:
        maybe_yield(m);
        if (per_warp_) barrier(in, m);  // (lockstep: every barrier's threads are already together)
        return;
      case Op::keep_alive:
      case Op::set_max_registers:
        return;
      case Op::exit_thread: each(m, [&](int t) { exited_[static_cast<size_t>(t)] = 1; }); return;
      case Op::pack2: {
        const DType d = ty(in.args[0]).dtype;
        each(m, [&](int t) {
          const uint64_t lo = element::to_bits(d, arg(0, t).f, arg(0, t).i) & 0xFFFFu;
          const uint64_t hi = element::to_bits(ty(in.args[1]).dtype, arg(1, t).f, arg(1, t).i) & 0xFFFFu;
          set(0, t, Val{0, wrap(out_ty().dtype, lo | hi << 16)});
        });
        return;
      }
      case Op::unpack2:
        each(m, [&](int t) {
          const auto w = static_cast<uint64_t>(arg(0, t).i);
          for (size_t k = 0; k < 2; ++k) {
            Val v;
            element::from_bits(out_ty(k).dtype, (w >> (16 * k)) & 0xFFFFu, v.f, v.i);
            set(k, t, v);
          }
        });
        return;
      case Op::for_: loop(in, m); return;
      case Op::if_: branch(in, m); return;
      default: memory_inst(in, m); return;
    }
  }

  // Global and shared memory, atomics, shuffles, barriers.
  void memory_inst(const pir::Inst& in, const Mask& m) {
    const auto arg = [&](size_t k, int t) -> const Val& { return vals(in.args[k])[static_cast<size_t>(t)]; };
    const auto set = [&](size_t k, int t, const Val& v) { vals(in.results[k])[static_cast<size_t>(t)] = v; };
    const auto out_ty = [&](size_t k = 0) { return ty(in.results[k]); };
    switch (in.op) {
      case Op::gep: {
        const DType d = ty(in.args[0]).dtype;
        const int64_t es = ir::byte_size(d);
        each(m, [&](int t) { set(0, t, Val{0, static_cast<int64_t>(static_cast<uint64_t>(arg(0, t).i) + static_cast<uint64_t>(arg(1, t).i * es))}); });
        return;
      }
      case Op::load: {
        const DType d = out_ty().dtype;
        each(m, [&](int t) {
          if (in.args.size() > 1 && !arg(1, t).i) {
            set(0, t, arg(2, t));
            return;
          }
          const auto es = static_cast<uint64_t>(ir::byte_size(d));
          set(0, t, read(d, global(in, t, static_cast<uint64_t>(arg(0, t).i), es, es)));
        });
        return;
      }
      case Op::store: {
        const DType d = ty(in.args[1]).dtype;
        each(m, [&](int t) {
          if (in.args.size() > 2 && !arg(2, t).i) return;
          const auto es = static_cast<uint64_t>(ir::byte_size(d));
          write(d, global(in, t, static_cast<uint64_t>(arg(0, t).i), es, es), arg(1, t));
        });
        return;
      }
      case Op::load_vec:
        each(m, [&](int t) {
          const auto words = static_cast<uint64_t>(in.imm);
          std::byte* p = global(in, t, static_cast<uint64_t>(arg(0, t).i), 4 * words, 4 * words);
          for (uint64_t k = 0; k < words; ++k) {
            uint32_t w;
            std::memcpy(&w, p + 4 * k, 4);
            set(k, t, Val{0, wrap(out_ty(k).dtype, w)});
          }
        });
        return;
      case Op::store_vec:
        each(m, [&](int t) {
          const uint64_t words = in.args.size() - 1;
          std::byte* p = global(in, t, static_cast<uint64_t>(arg(0, t).i), 4 * words, 4 * words);
          for (uint64_t k = 0; k < words; ++k) {
            const auto w = static_cast<uint32_t>(arg(1 + k, t).i);
            std::memcpy(p + 4 * k, &w, 4);
          }
        });
        return;
      case Op::atomic_add:
      case Op::atomic_rmw:
      case Op::atomic_cas: atomic(in, m); return;
      case Op::load_shared: {
        maybe_yield(m);
        const DType d = out_ty().dtype;
        each(m, [&](int t) { set(0, t, read(d, shared(in, t, arg(0, t).i, ir::byte_size(d)))); });
        return;
      }
      case Op::store_shared: {  // (offset, value[, pred])
        maybe_yield(m);
        const DType d = ty(in.args[1]).dtype;
        each(m, [&](int t) {
          if (in.args.size() > 2 && !arg(2, t).i) return;
          write(d, shared(in, t, arg(0, t).i, ir::byte_size(d)), arg(1, t));
        });
        return;
      }
      case Op::shfl_xor: {
        const std::vector<Val> before = vals(in.args[0]);  // (every lane reads the others' values before any write)
        each(m, [&](int t) { set(0, t, before[static_cast<size_t>((t & ~31) | ((t & 31) ^ static_cast<int>(in.imm & 31)))]); });
        return;
      }
      default: hopper_inst(in, m); return;
    }
  }

  // mma.sync, TMA, mbarriers, wgmma.
  void hopper_inst(const pir::Inst& in, const Mask& m) {
    const auto arg = [&](size_t k, int t) -> const Val& { return vals(in.args[k])[static_cast<size_t>(t)]; };
    const auto set = [&](size_t k, int t, const Val& v) { vals(in.results[k])[static_cast<size_t>(t)] = v; };
    switch (in.op) {
      case Op::mma_16816: mma(in, m); return;
      case Op::smem_addr: each(m, [&](int t) { set(0, t, Val{0, arg(0, t).i}); }); return;  // (the window starts at 0)
      case Op::fence_mbar_init:
      case Op::fence_proxy_async:
      case Op::fence_proxy_async_global:
      case Op::wgmma_fence:
      case Op::wgmma_commit:
      case Op::bulk_commit:
      case Op::bulk_wait:  // (asynchronous copies and MMAs complete when issued here)
        return;
      case Op::wgmma_wait:
        for (size_t k = 0; k < in.results.size(); ++k) each(m, [&](int t) { set(k, t, arg(k, t)); });
        return;
      case Op::mbar_init:
        each(m, [&](int t) {
          const int64_t count = arg(1, t).i;
          mbarriers_[arg(0, t).i] = Mbarrier{count, count, 0, 0};
        });
        return;
      case Op::mbar_inval: each(m, [&](int t) { mbarriers_.erase(arg(0, t).i); }); return;
      case Op::mbar_expect_tx: each(m, [&](int t) { mbar_update(in, t, arg(0, t).i, 1, arg(1, t).i); }); return;
      case Op::mbar_arrive:
        maybe_yield(m);
        each(m, [&](int t) { mbar_update(in, t, arg(0, t).i, 1, 0); });
        return;
      case Op::mbar_wait:
        if (per_warp_) {
          const int t0 = first_thread(m);
          if (t0 < 0) return;
          const int64_t addr = arg(0, t0).i, parity = arg(1, t0).i & 1;
          yield_turn(t0 / 32);
          wait_until(t0 / 32, in, [&] { return (mbarrier(in, t0, addr).phase & 1) != parity; });
          return;
        }
        each(m, [&](int t) {
          const Mbarrier& b = mbarrier(in, t, arg(0, t).i);
          if ((b.phase & 1) == (arg(1, t).i & 1))
            throw EmulatorUnsupported(fmt::format(
                "tilejit emulator: kernel '{}': thread {} waits on an mbarrier phase that has not completed; in lockstep only "
                "programs whose waits follow their arrivals run (warp-specialised roles need warps that run concurrently)",
                p_.name, t));
        });
        return;
      case Op::atom_shared:
        each(m, [&](int t) {
          std::byte* q = shared(in, t, arg(0, t).i, 4);
          const Val old = read(DType::u32, q);
          write(DType::u32, q, Val{0, in.imm == 0 ? wrap(DType::u32, static_cast<uint64_t>(old.i + arg(1, t).i)) : arg(1, t).i});
          set(0, t, old);
        });
        return;
      case Op::tma_load:
      case Op::tma_load_2d:
        maybe_yield(m);
        tma(in, m, Tma::load);
        return;
      case Op::tma_reduce_add: tma(in, m, Tma::reduce_add); return;
      case Op::tma_store: tma(in, m, Tma::store); return;
      case Op::wgmma:
      case Op::wgmma_rs:
        if (per_warp_) wgmma_collective(in, m);
        else wgmma(in, m);
        return;
      default:
        throw EmulatorUnsupported(fmt::format("tilejit emulator: kernel '{}' uses {} (not emulated: cross-program semaphores)",
                                              p_.name, pir::op_name(in.op)));
    }
  }

  Mbarrier& mbarrier(const pir::Inst& in, int t, int64_t addr) {
    auto it = mbarriers_.find(addr);
    if (it == mbarriers_.end()) fault(in, t, fmt::format("no mbarrier was initialised at shared address {}", addr));
    return it->second;
  }
  // arrivals and transaction bytes (positive: expected; negative: completed by a copy)
  void mbar_update(const pir::Inst& in, int t, int64_t addr, int64_t arrivals, int64_t tx) {
    Mbarrier& b = mbarrier(in, t, addr);
    stalls_ = 0;
    b.pending -= arrivals;
    b.tx += tx;
    if (b.pending < 0) fault(in, t, fmt::format("more arrivals than the mbarrier at {} expects ({})", addr, b.count));
    if (b.pending == 0 && b.tx == 0) {
      ++b.phase;
      b.pending = b.count;
    }
  }

  // The byte of a swizzled shared tile: 16-byte units XOR-ed with the row of 128 bytes (128-byte
  // mode), as TMA stores and wgmma descriptors read them (absolute shared addresses).
  static int64_t swizzle(int64_t addr, int64_t span) {
    switch (span) {
      case 128: return addr ^ (((addr >> 7) & 7) << 4);
      case 64: return addr ^ (((addr >> 7) & 3) << 4);
      case 32: return addr ^ (((addr >> 7) & 1) << 4);
      default: return addr;
    }
  }

  // tma_load (dst, map, coordinates innermost first, mbar) / tma_load_2d / tma_reduce_add and
  // tma_store (src, map, coordinates): the map's box between the tensor and shared memory,
  // out-of-bounds elements zero (loads) or skipped (reduces, stores); a load completes its bytes on
  // the mbarrier at once.
  enum class Tma { load, reduce_add, store };
  void tma(const pir::Inst& in, const Mask& m, Tma mode) {
    const bool reduce = mode != Tma::load;  // (reduce_add and store: shared -> global)
    each(m, [&](int t) {
      const int64_t tag = vals(in.args[1])[static_cast<size_t>(t)].i - kMapTag;
      if (tag < 0 || tag >= static_cast<int64_t>(p_.tensor_maps.size())) fault(in, t, "the tensor-map argument names no map");
      const pir::TensorMapSpec& spec = p_.tensor_maps[static_cast<size_t>(tag)];
      const TensorArg& ta = tensors_.at(static_cast<size_t>(spec.param_index));
      const size_t rank = ta.sizes.size();
      const size_t coords = in.op == Op::tma_load_2d ? 2 : static_cast<size_t>(in.imm);
      if (coords != rank || spec.box.size() != rank) fault(in, t, "a box whose rank is not the tensor's");
      const int64_t es = ir::byte_size(ta.dtype);
      std::vector<int64_t> c(rank);  // innermost first
      for (size_t d = 0; d < rank; ++d) c[d] = vals(in.args[2 + d])[static_cast<size_t>(t)].i;
      const int64_t smem0 = vals(in.args[0])[static_cast<size_t>(t)].i;
      int64_t elems = 1;
      for (int64_t b : spec.box) elems *= b;
      std::vector<int64_t> idx(rank, 0);
      for (int64_t e = 0; e < elems; ++e) {
        bool inside = true;
        int64_t offset = 0;
        for (size_t d = 0; d < rank; ++d) {
          const int64_t g = c[d] + idx[d];
          const size_t td = rank - 1 - d;
          inside = inside && g >= 0 && g < ta.sizes[td];
          offset += g * ta.strides[td];
        }
        std::byte* sm = shared(in, t, swizzle(smem0 + e * es, spec.swizzle_bytes), es);
        if (reduce) {
          if (inside) {
            std::byte* gm = global(in, t, ta.base + static_cast<uint64_t>(offset * es), static_cast<uint64_t>(es), static_cast<uint64_t>(es));
            const Val add = read(ta.dtype, sm), old = read(ta.dtype, gm);
            Val now = add;
            if (mode == Tma::reduce_add) {
              if (ir::is_float(ta.dtype)) now.f = interp::atomic_float_add(ta.dtype, old.f, add.f);
              else now.i = wrap(ta.dtype, static_cast<uint64_t>(old.i + add.i));
            }
            write(ta.dtype, gm, now);
          }
        } else if (inside) {
          const std::byte* gm = global(in, t, ta.base + static_cast<uint64_t>(offset * es), static_cast<uint64_t>(es), static_cast<uint64_t>(es));
          std::memcpy(sm, gm, static_cast<size_t>(es));
        } else {
          std::memset(sm, 0, static_cast<size_t>(es));
        }
        for (size_t d = 0; d < rank; ++d) {  // next box element, innermost fastest
          if (++idx[d] < spec.box[d]) break;
          idx[d] = 0;
        }
      }
      if (!reduce) mbar_update(in, t, vals(in.args[2 + rank])[static_cast<size_t>(t)].i, 0, -elems * es);
    });
  }

  // wgmma m64nNk16 per warpgroup: A from a shared-memory descriptor (K-major, or MN-major with
  // imm bit 26) or, wgmma_rs, from registers (each warp's 16 rows as mma.sync's A fragment); B
  // from a descriptor (K-major, or MN-major with bit 24); descriptors of 128-byte swizzled tiles:
  // start (bits 0-13), leading byte offset (16-29, the step between 64-element MN chunks), stride
  // byte offset (32-45, the step between groups of 8 rows), all in 16-byte units. The accumulator:
  // thread l of warp w holds, in register j, row 16 w + l / 4 + 8 ((j / 2) % 2), column
  // 8 (j / 4) + 2 (l % 4) + j % 2. Sums in double, rounded to f32 once.
  void wgmma(const pir::Inst& in, const Mask& m) {
    const int64_t n = in.imm & 0xFFFF;
    const auto d = static_cast<DType>((in.imm >> 16) & 0xFF);
    const bool b_mn = (in.imm >> 24) & 1, overwrite = (in.imm >> 25) & 1, a_mn = (in.imm >> 26) & 1;
    const bool rs = in.op == Op::wgmma_rs;
    if (d != DType::f16 && d != DType::bf16)
      throw EmulatorUnsupported(fmt::format("tilejit emulator: wgmma with {} operands", ir::name(d)));
    const int64_t es = 2;
    const size_t first_acc = rs ? 5 : 2;
    const auto elem = [&](const pir::Inst& i, int t, int64_t addr) {
      return read(d, shared(i, t, swizzle(addr, 128), es)).f;
    };
    struct Desc {
      int64_t start, lbo, sbo;
    };
    const auto decode = [](int64_t desc) {
      const auto u = static_cast<uint64_t>(desc);
      return Desc{static_cast<int64_t>((u & 0x3FFF) << 4), static_cast<int64_t>(((u >> 16) & 0x3FFF) << 4),
                  static_cast<int64_t>(((u >> 32) & 0x3FFF) << 4)};
    };
    // K-major: row r (M or N), column k; MN-major: the tile's rows are k, 64-element chunks of r
    const auto at = [&](const Desc& ds, bool mn_major, int64_t r, int64_t k) {
      return mn_major ? ds.start + (k / 8) * ds.sbo + (k % 8) * 128 + (r % 64) * es + (r / 64) * ds.lbo
                      : ds.start + (r / 8) * ds.sbo + (r % 8) * 128 + k * es;
    };
    for (int g0 = 0; g0 < n_; g0 += 128) {
      int lead = -1;
      for (int t = g0; t < std::min(g0 + 128, n_) && lead < 0; ++t)
        if (m[static_cast<size_t>(t)] && !exited_[static_cast<size_t>(t)]) lead = t;
      if (lead < 0) continue;
      std::vector<double> A(64 * 16), B(16 * static_cast<size_t>(n));
      const Desc db = decode(vals(in.args[rs ? 4 : 1])[static_cast<size_t>(lead)].i);
      for (int64_t k = 0; k < 16; ++k)
        for (int64_t c = 0; c < n; ++c) B[static_cast<size_t>(k * n + c)] = elem(in, lead, at(db, b_mn, c, k));
      if (rs) {
        for (int l = 0; l < 128 && g0 + l < n_; ++l) {
          const int t = g0 + l, w = l / 32, g = (l % 32) / 4, q = l % 4;
          for (int k = 0; k < 2; ++k) {
            const auto half = [&](size_t arg_index) {
              Val v;
              element::from_bits(d, (static_cast<uint64_t>(vals(in.args[arg_index])[static_cast<size_t>(t)].i) >> (16 * k)) & 0xFFFFu,
                                 v.f, v.i);
              return v.f;
            };
            const int r0 = 16 * w + g;
            A[static_cast<size_t>(r0 * 16 + 2 * q + k)] = half(0);
            A[static_cast<size_t>((r0 + 8) * 16 + 2 * q + k)] = half(1);
            A[static_cast<size_t>(r0 * 16 + 2 * q + 8 + k)] = half(2);
            A[static_cast<size_t>((r0 + 8) * 16 + 2 * q + 8 + k)] = half(3);
          }
        }
      } else {
        const Desc da = decode(vals(in.args[0])[static_cast<size_t>(lead)].i);
        for (int64_t r = 0; r < 64; ++r)
          for (int64_t k = 0; k < 16; ++k) A[static_cast<size_t>(r * 16 + k)] = elem(in, lead, at(da, a_mn, r, k));
      }
      for (int l = 0; l < 128 && g0 + l < n_; ++l) {
        const int t = g0 + l, w = l / 32, lane = l % 32;
        for (int64_t j = 0; j < n / 2; ++j) {
          const int64_t row = 16 * w + lane / 4 + 8 * ((j / 2) % 2), col = 8 * (j / 4) + 2 * (lane % 4) + (j % 2);
          double s = overwrite ? 0.0 : vals(in.args[first_acc + static_cast<size_t>(j)])[static_cast<size_t>(t)].f;
          for (int64_t k = 0; k < 16; ++k) s += A[static_cast<size_t>(row * 16 + k)] * B[static_cast<size_t>(k * n + col)];
          vals(in.results[static_cast<size_t>(j)])[static_cast<size_t>(t)] = Val{static_cast<double>(static_cast<float>(s)), 0};
        }
      }
    }
  }

  void atomic(const pir::Inst& in, const Mask& m) {
    const DType d = ty(in.args[1]).dtype;
    const bool cas = in.op == Op::atomic_cas;
    const size_t pred = cas ? 3 : 2;
    const ir::AtomicRmw rmw = in.op == Op::atomic_add ? ir::AtomicRmw::add : pir::AtomicImm::decode(in.imm).rmw;
    // one thread after another (program order among threads is one legal order)
    each(m, [&](int t) {
      const auto& args = in.args;
      if (args.size() > pred && !vals(args[pred])[static_cast<size_t>(t)].i) {
        if (!in.results.empty()) vals(in.results[0])[static_cast<size_t>(t)] = Val{};
        return;
      }
      const auto es = static_cast<uint64_t>(ir::byte_size(d));
      std::byte* p = global(in, t, static_cast<uint64_t>(vals(args[0])[static_cast<size_t>(t)].i), es, es);
      const Val old = read(d, p);
      const Val& v = vals(args[cas ? 2 : 1])[static_cast<size_t>(t)];
      Val now = old;
      if (cas) {
        const Val& cmpv = vals(args[1])[static_cast<size_t>(t)];
        if (element::to_bits(d, old.f, old.i) == element::to_bits(d, cmpv.f, cmpv.i)) now = v;
      } else if (ir::is_float(d)) {
        if (rmw != ir::AtomicRmw::add && rmw != ir::AtomicRmw::max && rmw != ir::AtomicRmw::min && rmw != ir::AtomicRmw::xchg)
          fault(in, t, "a bitwise atomic on floats");
        now.f = interp::rmw_float(rmw, d, old.f, v.f);
      } else {
        now.i = interp::rmw_int(rmw, d, old.i, v.i);
      }
      write(d, p, now);
      if (!in.results.empty()) vals(in.results[0])[static_cast<size_t>(t)] = old;
    });
  }

  // mma.sync.m16n8k16 (f16 / bf16 inputs, f32 accumulators), per warp from its lanes' fragments:
  // lane l, g = l / 4, q = l % 4 holds A (g, 2q..2q+1), (g+8, ..), (g, 2q+8..), (g+8, 2q+8..); B
  // (2q..2q+1, g), (2q+8..2q+9, g); C and D (g, 2q..2q+1), (g+8, 2q..2q+1). Products summed in
  // double and rounded to f32 once (the tensor cores' order differs: compare with a tolerance).
  void mma(const pir::Inst& in, const Mask& m) {
    const auto d = static_cast<DType>(in.imm);
    if (d != DType::f16 && d != DType::bf16)
      throw EmulatorUnsupported(fmt::format("tilejit emulator: mma_16816 with {} operands", ir::name(d)));
    const auto half = [&](int64_t word, int k) {
      Val v;
      element::from_bits(d, (static_cast<uint64_t>(word) >> (16 * k)) & 0xFFFFu, v.f, v.i);
      return v.f;
    };
    for (int w0 = 0; w0 < n_; w0 += 32) {
      bool any = false;
      for (int l = 0; l < 32; ++l) any = any || (m[static_cast<size_t>(w0 + l)] && !exited_[static_cast<size_t>(w0 + l)]);
      if (!any) continue;
      double A[16][16], B[16][8], C[16][8];
      for (int l = 0; l < 32; ++l) {
        const int t = w0 + l, g = l / 4, q = l % 4;
        const auto a = [&](size_t k) { return vals(in.args[k])[static_cast<size_t>(t)].i; };
        for (int k = 0; k < 2; ++k) {
          A[g][2 * q + k] = half(a(0), k);
          A[g + 8][2 * q + k] = half(a(1), k);
          A[g][2 * q + 8 + k] = half(a(2), k);
          A[g + 8][2 * q + 8 + k] = half(a(3), k);
          B[2 * q + k][g] = half(a(4), k);
          B[2 * q + 8 + k][g] = half(a(5), k);
        }
        C[g][2 * q] = vals(in.args[6])[static_cast<size_t>(t)].f;
        C[g][2 * q + 1] = vals(in.args[7])[static_cast<size_t>(t)].f;
        C[g + 8][2 * q] = vals(in.args[8])[static_cast<size_t>(t)].f;
        C[g + 8][2 * q + 1] = vals(in.args[9])[static_cast<size_t>(t)].f;
      }
      for (int l = 0; l < 32; ++l) {
        const int t = w0 + l, g = l / 4, q = l % 4;
        const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
        for (size_t k = 0; k < 4; ++k) {
          double s = C[rows[k]][cols[k]];
          for (int j = 0; j < 16; ++j) s += A[rows[k]][j] * B[j][cols[k]];
          vals(in.results[k])[static_cast<size_t>(t)] = Val{static_cast<double>(static_cast<float>(s)), 0};
        }
      }
    }
  }

  void loop(const pir::Inst& in, const Mask& m) {
    const pir::Block& body = in.regions.at(0);
    const size_t carried = in.args.size() - 3;
    const pir::Ty iv_ty = ty(in.args[0]);
    std::vector<Val> iv(static_cast<size_t>(n_)), ub(static_cast<size_t>(n_)), step(static_cast<size_t>(n_));
    std::vector<std::vector<Val>> state(carried, std::vector<Val>(static_cast<size_t>(n_)));
    Mask active(static_cast<size_t>(n_), 0);
    each(m, [&](int t) {
      const auto s = static_cast<size_t>(t);
      iv[s] = vals(in.args[0])[s], ub[s] = vals(in.args[1])[s], step[s] = vals(in.args[2])[s];
      if (step[s].i <= 0) fault(in, t, fmt::format("a loop step of {} (must be positive)", step[s].i));
      for (size_t k = 0; k < carried; ++k) state[k][s] = vals(in.args[3 + k])[s];
      active[s] = 1;
    });
    const bool sgn = ir::is_signed(iv_ty.dtype);
    for (;;) {
      bool any = false;
      for (int t = 0; t < n_; ++t) {
        const auto s = static_cast<size_t>(t);
        if (!active[s] || exited_[s]) continue;
        active[s] = sgn ? iv[s].i < ub[s].i : static_cast<uint64_t>(iv[s].i) < static_cast<uint64_t>(ub[s].i);
        any = any || active[s];
      }
      if (!any) break;
      each(active, [&](int t) {
        const auto s = static_cast<size_t>(t);
        vals(body.args[0])[s] = iv[s];
        for (size_t k = 0; k < carried; ++k) vals(body.args[1 + k])[s] = state[k][s];
      });
      const pir::Inst* y = exec(body, active);
      each(active, [&](int t) {
        const auto s = static_cast<size_t>(t);
        for (size_t k = 0; k < carried; ++k) state[k][s] = vals(y->args.at(k))[s];
        iv[s].i = wrap(iv_ty.dtype, static_cast<uint64_t>(iv[s].i) + static_cast<uint64_t>(step[s].i));
      });
    }
    each(m, [&](int t) {
      for (size_t k = 0; k < carried; ++k) vals(in.results[k])[static_cast<size_t>(t)] = state[k][static_cast<size_t>(t)];
    });
  }

  void branch(const pir::Inst& in, const Mask& m) {
    Mask taken(static_cast<size_t>(n_), 0), other(static_cast<size_t>(n_), 0);
    bool any_taken = false, any_other = false;
    each(m, [&](int t) {
      const bool c = vals(in.args[0])[static_cast<size_t>(t)].i != 0;
      (c ? taken : other)[static_cast<size_t>(t)] = 1;
      (c ? any_taken : any_other) = true;
    });
    const auto run = [&](size_t region, const Mask& mask) {
      if (region >= in.regions.size()) return;
      const pir::Inst* y = exec(in.regions[region], mask);
      if (in.results.empty()) return;
      each(mask, [&](int t) {
        for (size_t k = 0; k < in.results.size(); ++k)
          vals(in.results[k])[static_cast<size_t>(t)] = vals(y->args.at(k))[static_cast<size_t>(t)];
      });
    };
    if (any_taken) run(0, taken);
    if (any_other) run(1, other);
  }

  const pir::Func& p_;
  int n_;
  std::vector<TensorArg> tensors_;  // by tile-IR parameter (pointers and scalars: empty)
  // per-warp execution
  struct Barrier {
    int64_t arrived = 0, generation = 0;
  };
  struct Rendezvous {
    const pir::Inst* inst = nullptr;
    Mask mask;
    int warps = 0;
    int64_t generation = 0;
  };
  bool per_warp_ = false;
  EmulatorSchedule schedule_;
  uint64_t rng_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = -1;
  bool abort_ = false;
  int stalls_ = 0;
  std::exception_ptr error_;
  std::vector<char> warp_done_;
  std::map<int64_t, Barrier> barriers_;
  std::map<int, Rendezvous> rendezvous_;
  std::map<int64_t, Mbarrier> mbarriers_;  // by shared address
  std::vector<Val> params_;
  std::vector<Region> regions_;
  std::vector<std::vector<Val>> vals_;  // [value][thread]
  std::vector<std::byte> smem_;
  std::vector<char> exited_;
  std::array<int64_t, 3> block_{}, grid_{};
};

}  // namespace

void emulate(const jit::pir::Func& program, const ir::Function& f, Grid grid, const std::vector<Arg>& args, EmulatorSchedule schedule) {
  Emulator(program, f, args, schedule).run(grid);
}

void emulate(const ir::Function& f, Grid grid, const std::vector<Arg>& args, const jit::CompileOptions& opts, EmulatorSchedule schedule) {
  const jit::pir::Func program = jit::lower(f, opts);
  emulate(program, f, grid, args, schedule);
}

}  // namespace tilejit::runtime
