// The emulator's machine (runtime/emulator.hpp is the public entry): one Emulator per call holds the
// per-thread values, shared memory, mbarriers and the warp scheduler; its members are grouped by
// family, defined in runtime/emulator.cpp (entry points), runtime/emulator/element_ops.cpp (values,
// memory, atomics) and runtime/emulator/tensor_cores.cpp (mma.sync, TMA, mbarriers, wgmma). Internal
// to runtime/.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/emulator.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter/machine.hpp"  // (the interpreter's element rules: min/max NaN, flushes, prmt)

namespace tilejit::runtime::emu {

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

inline bool is_float(pir::Ty t) { return !t.ptr && ir::is_float(t.dtype); }

inline double emu_round(DType d, double x) {
  if (d == DType::f64) return x;
  if (d == DType::f32) return static_cast<double>(static_cast<float>(x));
  return element::round_float(d, x);
}

inline int64_t wrap(DType d, uint64_t v) {
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
          for (auto& [t, q] : tma_writes_) land_tma_writes(q, 0, true);  // (the GPU completes them by the kernel's end)
          tma_writes_.clear();
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

  Val binary(const pir::Inst& in, pir::Ty type, const Val& a, const Val& b, int t) const;

  Val unary(const pir::Inst& in, pir::Ty type, const Val& a, int t) const;

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

  Val convert(pir::Ty from, pir::Ty to, const Val& a) const;
  Val reinterpret(pir::Ty from, pir::Ty to, const Val& a) const;

  // One instruction for the threads of `m`: values and control flow here, memory and
  // synchronisation in memory_inst, tensor cores and asynchronous copies in hopper_inst.
  void inst(const pir::Inst& in, const Mask& m);

  // Global and shared memory, atomics, shuffles, barriers.
  void memory_inst(const pir::Inst& in, const Mask& m);

  // mma.sync, TMA, mbarriers, wgmma.
  void hopper_inst(const pir::Inst& in, const Mask& m);

  Mbarrier& mbarrier(const pir::Inst& in, int t, int64_t addr);
  // arrivals and transaction bytes (positive: expected; negative: completed by a copy)
  void mbar_update(const pir::Inst& in, int t, int64_t addr, int64_t arrivals, int64_t tx);

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
  void tma(const pir::Inst& in, const Mask& m, Tma mode);
  // TMA stores and add-reduces: the shared tile is read when issued, but the global writes land
  // only at the issuing thread's cp.async.bulk.wait_group (not .read) that covers their bulk group,
  // or at the program's end -- so a read the lowering did not order after that wait sees the old
  // value, as it may on the GPU.
  struct TmaWrite {
    std::byte* global = nullptr;
    DType dtype = DType::f32;
    Val value;
    bool add = false;
  };
  struct TmaWrites {
    std::vector<std::vector<TmaWrite>> committed;  // oldest first
    std::vector<TmaWrite> open;                    // since the last bulk_commit
  };
  std::map<int, TmaWrites> tma_writes_;  // by issuing thread
  void land_tma_writes(TmaWrites& q, size_t keep, bool open_too);

  // wgmma m64nNk16 per warpgroup: A from a shared-memory descriptor (K-major, or MN-major with
  // imm bit 26) or, wgmma_rs, from registers (each warp's 16 rows as mma.sync's A fragment); B
  // from a descriptor (K-major, or MN-major with bit 24); descriptors of 128-byte swizzled tiles:
  // start (bits 0-13), leading byte offset (16-29, the step between 64-element MN chunks), stride
  // byte offset (32-45, the step between groups of 8 rows), all in 16-byte units. The accumulator:
  // thread l of warp w holds, in register j, row 16 w + l / 4 + 8 ((j / 2) % 2), column
  // 8 (j / 4) + 2 (l % 4) + j % 2. Sums in double, rounded to f32 once.
  void wgmma(const pir::Inst& in, const Mask& m);

  void atomic(const pir::Inst& in, const Mask& m);

  // mma.sync.m16n8k16 (f16 / bf16 inputs, f32 accumulators), per warp from its lanes' fragments:
  // lane l, g = l / 4, q = l % 4 holds A (g, 2q..2q+1), (g+8, ..), (g, 2q+8..), (g+8, 2q+8..); B
  // (2q..2q+1, g), (2q+8..2q+9, g); C and D (g, 2q..2q+1), (g+8, 2q..2q+1). Products summed in
  // double and rounded to f32 once (the tensor cores' order differs: compare with a tolerance).
  void mma(const pir::Inst& in, const Mask& m);
  // mma.sync.m16n8k8 .tf32 (mma_1688_tf32): lane l, g = l / 4, q = l % 4 holds A (g, q), (g+8, q),
  // (g, q+4), (g+8, q+4); B (q, g), (q+4, g); C and D as mma's. A register's low 13 bits are not
  // read (the tensor cores take TF32); sums as mma's.
  void mma_tf32(const pir::Inst& in, const Mask& m);
  // The warp-wide part both share: for each warp with a live lane, `load(t, g, q, A, B)` puts
  // thread t's A and B fragment elements in place, C comes from operands 6..9, and each lane's D
  // = C + A B over `k` products, summed in double and rounded to f32 once.
  using MmaTile = std::array<std::array<double, 16>, 16>;  // [row][col] (B: [k][n])
  void warp_mma(const pir::Inst& in, const Mask& m, int k, const std::function<void(int t, int g, int q, MmaTile& A, MmaTile& B)>& load);

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
  std::atomic<int64_t> clock_{0};  // read_clock: a count of the reads so far (monotonic, not cycles)
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

}  // namespace tilejit::runtime::emu
