// The tile-IR interpreter's entry: argument checking, then every program of the grid run op by op
// (sequentially, or each on its own thread when the kernel waits on semaphores), each op
// dispatched to its family's file (runtime/interpreter/machine.hpp lists them).
#include <fmt/format.h>

#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {

Machine::Machine(const ir::Function& f, Grid grid, const std::vector<Arg>& args) : f_(f), slots_(f.values.size()) {
  grid_[0] = grid.x;
  grid_[1] = grid.y;
  grid_[2] = grid.z;
  numel_.resize(f.values.size());
  for (size_t v = 0; v < f.values.size(); ++v) numel_[v] = f.values[v].type.numel();
  check_grid();
  bind(args);
}

void Machine::run() {
  for (pid_[2] = 0; pid_[2] < grid_[2]; ++pid_[2])
    for (pid_[1] = 0; pid_[1] < grid_[1]; ++pid_[1])
      for (pid_[0] = 0; pid_[0] < grid_[0]; ++pid_[0]) run_block(f_.body);
}

void Machine::run_program(int64_t x, int64_t y, int64_t z, Concurrency& sync) {
  pid_[0] = x, pid_[1] = y, pid_[2] = z;
  sync_ = &sync;
  run_block(f_.body);
}

// ---- launch checks -------------------------------------------------------------------------

void Machine::arg_error(size_t i, const std::string& msg) const {
  throw InterpretError(fmt::format("kernel '{}': argument {} '{}': {}", f_.name, i, f_.params[i].name, msg));
}

void Machine::check_grid() const {
  for (int64_t g : grid_)
    if (g < 1 || g > kI32Max)
      throw InterpretError(fmt::format("kernel '{}': grid ({},{},{}) is invalid: every dimension must be in [1, {}]",
                                       f_.name, grid_[0], grid_[1], grid_[2], kI32Max));
}

void Machine::bind(const std::vector<Arg>& args) {
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
  for (const ir::SizeRelation& r : f_.size_relations) {
    const std::string e = ir::size_relation_error(f_, r, args[r.a].tensor()->sizes()[static_cast<size_t>(r.a_dim)],
                                                  args[r.b].tensor()->sizes()[static_cast<size_t>(r.b_dim)]);
    if (!e.empty()) throw InterpretError(e);
  }
}

void Machine::bind_scalar(size_t i, const Arg& a, Slot& s) const {
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

void Machine::bind_buffer(size_t i, const Arg& a, Slot& s) {
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

// ---- execution -----------------------------------------------------------------------------

void Machine::exec(const Op& op) {
  using enum OpKind;
  if (ir::is_elementwise_binary(op.kind) || op.kind == cmp) return binary(op);
  if (ir::is_elementwise_unary(op.kind)) return unary(op);
  switch (op.kind) {
    case constant: return constant_op(op);
    case arange: return arange_op(op);
    case splat: return splat_op(op);
    case broadcast: return broadcast_op(op);
    case trans: return trans_op(op);
    case expand_dims:
    case reshape: return copy_slot(S(op.results[0]), S(op.operands[0]));
    case select: return select_op(op);
    case byte_perm: return byte_perm_op(op);
    case fma: return fma_op(op);
    case cast: return cast_op(op);
    case bitcast: return bitcast_op(op);
    case pack_pairs:
    case unpack_pairs: return pairs_op(op);
    case precompute: S(op.results[0]) = S(op.operands[0]); return;  // the same value
    case reduce: return reduce_op(op);
    case scan:
    case reduce_with: return combine_op(op);
    case xor_permute: return xor_permute_op(op);
    case gather: return gather_op(op);
    case histogram: return histogram_op(op);
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
    case addptr: return addptr_op(op);
    case load: return load_op(op);
    case store: return store_op(op);
    case atomic_add: {
      std::unique_lock<std::mutex> lock;
      if (sync_) lock = std::unique_lock(sync_->mu);
      return atomic_add_op(op);
    }
    case atomic_rmw:
    case atomic_cas: {
      std::unique_lock<std::mutex> lock;  // one update at a time: any order is sequentially consistent
      if (sync_) lock = std::unique_lock(sync_->mu);
      return atomic_rmw_op(op);
    }
    case wait_ge: return wait_op(op);
    case signal_add: return signal_op(op);
    case timestamp:  // (cycles: the GPU's; the interpreter stores nothing)
    case turn_begin:
    case turn_end:
    case ring_producer: return;  // a schedule of warpgroups: no effect on values
    case block_load: return block_op(op);
    case block_store: {
      const std::optional<ir::WindowOrder> order = ir::window_order(op);
      if (order) wait_until(op, order->semaphore, order->target);
      {
        std::unique_lock<std::mutex> lock;  // atomic_add on a window: one update at a time
        if (sync_ && op.attrs.count("reduce")) lock = std::unique_lock(sync_->mu);
        block_op(op);
      }
      if (order && order->signal) signal_by(op, *order->signal, 1);
      return;
    }
    case for_: return for_op(op);
    case if_: return if_op(op);
    case warp_roles: return warp_roles_op(op);
    case channel_push: return channel_push_op(op);
    case channel_pop: return channel_pop_op(op);
    default: break;
  }
  fault(op, "the interpreter does not implement this op");
}

}  // namespace tilejit::runtime::interp

namespace tilejit::runtime {
namespace {

using interp::Concurrency;
using interp::Machine;
using ir::OpKind;

bool waits_on_semaphores(const ir::Block& b) {
  for (const ir::Op& op : b.ops) {
    if (op.kind == OpKind::wait_ge || (op.kind == OpKind::block_store && op.attrs.count("after_semaphore"))) return true;
    for (const ir::Block& r : op.regions)
      if (waits_on_semaphores(r)) return true;
  }
  return false;
}

constexpr int64_t kMaxConcurrentPrograms = 4096;
constexpr int64_t kGridYZMax = 65535;

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

void interpret(const ir::Function& f, Grid grid, const std::vector<Arg>& args, InterpretOptions opts) {
  ir::verify(f);
  if (opts.gpu_rules) {
    if (const std::string why = ir::gpu_shape_violation(f); !why.empty())
      throw InterpretError(fmt::format("kernel '{}': {} (InterpretOptions::gpu_rules = false runs it on the CPU anyway)", f.name, why));
    // the launcher's limits (runtime/gpu_kernel.cpp): CUDA grids take y and z up to 65535
    if (grid.y > kGridYZMax || grid.z > kGridYZMax)
      throw InterpretError(fmt::format("kernel '{}': grid ({},{},{}) cannot launch on the GPU: y and z must be in [1, {}] (x up to {}) "
                                       "(InterpretOptions::gpu_rules = false runs it on the CPU anyway)",
                                       f.name, grid.x, grid.y, grid.z, kGridYZMax, interp::kI32Max));
  }
  if (waits_on_semaphores(f.body)) return run_concurrently(f, grid, args);
  Machine m(f, grid, args);
  m.run();
}

}  // namespace tilejit::runtime
