// Faults and memory: every access checked against the argument buffers (out of bounds and
// misalignment are InterpretErrors naming the op, the program and the tile element), pointer
// loads, stores and atomics, tensor slices and windows (block_load / block_store).
#include <fmt/format.h>

#include <algorithm>

#include "dsl/ir/atomic.hpp"
#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {
namespace {

std::string unravel(int64_t flat, const ir::Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ","));
}

}  // namespace

void Machine::fault(const Op& op, const std::string& msg, int64_t elem, const ir::Shape* tile) const {
  std::string where = elem >= 0 && tile && !tile->empty() ? ", tile element " + unravel(elem, *tile) : std::string{};
  throw InterpretError(fmt::format("kernel '{}': {} at {} in program ({},{},{}){}: {}", f_.name, ir::op_name(op.kind),
                                   op.loc.str(), pid_[0], pid_[1], pid_[2], where, msg));
}

std::byte* Machine::access(const Op& op, uint64_t addr, uint64_t size, const char* verb, int64_t elem, const ir::Shape& tile) {
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

std::string Machine::out_of_bounds(uint64_t addr, uint64_t size, const char* verb) const {
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

void Machine::addptr_op(const Op& op) {
  const auto es = static_cast<uint64_t>(ir::byte_size(T(op.operands[0]).dtype));
  const auto& p = S(op.operands[0]).i;
  const auto& off = S(op.operands[1]).i;
  auto& r = S(op.results[0]).i;
  r.resize(p.size());
  for (size_t k = 0; k < p.size(); ++k)
    r[k] = static_cast<int64_t>(static_cast<uint64_t>(p[k]) + static_cast<uint64_t>(off[k]) * es);
}

void Machine::load_op(const Op& op) {
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

void Machine::store_op(const Op& op) {
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

void Machine::atomic_add_op(const Op& op) {
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
      element::write_float(d, q, atomic_float_add(d, old, V.f[k]));
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


// atomic_rmw / atomic_cas, element by element (the elements of one op are independent updates).
// Float max / min ignore a NaN operand as the GPU's do (fmax / fmin).
void Machine::atomic_rmw_op(const Op& op) {
  const bool cas = op.kind == OpKind::atomic_cas;
  const size_t values = cas ? 2 : 1;
  const ir::Type& pt = T(op.operands[0]);
  const DType d = pt.dtype;
  const auto es = static_cast<uint64_t>(ir::byte_size(d));
  const auto& p = S(op.operands[0]).i;
  const Slot& V = S(op.operands[values]);
  const Slot* C = cas ? &S(op.operands[1]) : nullptr;
  const std::vector<int64_t>* mask = op.operands.size() == 2 + values ? &S(op.operands.back()).i : nullptr;
  const ir::AtomicRmw rmw = cas ? ir::AtomicRmw::xchg : *ir::parse_atomic_rmw(op.str_attr("rmw"));
  Slot& R = S(op.results[0]);
  const size_t n = p.size();
  const bool fl = ir::is_float(d);
  if (fl) R.f.assign(n, 0.0);  // masked-off elements return 0
  else R.i.assign(n, 0);
  const Wrap wrap(d);
  for (size_t k = 0; k < n; ++k) {
    if (mask && !(*mask)[k]) continue;
    std::byte* q = access(op, static_cast<uint64_t>(p[k]), es, "atomically updates", static_cast<int64_t>(k), pt.shape);
    if (fl) {
      const double old = element::read_float(d, q);
      element::write_float(d, q, rmw_float(rmw, d, old, V.f[k]));
      R.f[k] = old;
      continue;
    }
    const int64_t old = element::read_int(d, q), x = V.i[k];
    element::write_int(d, q, cas ? (old == C->i[k] ? x : old) : rmw_int(rmw, d, old, x));
    R.i[k] = old;
  }
}

// A view of a tensor: dim `dim` starts at `start` and has `length` elements. It must lie inside
// the parent, so that windows bounds-checked against the view never leave the parent either.
void Machine::slice_op(const Op& op) {
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
void Machine::block_op(const Op& op) {
  const bool is_load = op.kind == OpKind::block_load;
  // atomic_add / _max / ... on a window
  const bool atomic = !is_load && op.attrs.count("reduce");
  const ir::AtomicRmw rmw = atomic ? ir::parse_atomic_rmw(op.str_attr("reduce")).value_or(ir::AtomicRmw::add) : ir::AtomicRmw::add;
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
  // Offsets are integers of any type, taken at their value: a u64 offset >= 2^63 (held as a
  // negative int64) is out of range like any other value >= the size, and so is every element.
  std::vector<int64_t> off(rank);
  for (size_t j = 0; j < rank; ++j) {
    off[j] = S(op.operands[first_off + j]).i[0];
    if (off[j] < 0 && T(op.operands[first_off + j]).dtype == DType::u64) off[j] = std::numeric_limits<int64_t>::max();
  }
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
    } else if (in && atomic) {
      std::byte* q = access(op, base + static_cast<uint64_t>(elem_off) * es, es, "atomically updates", e, tile);
      if (fl) element::write_float(d, q, rmw_float(rmw, d, element::read_float(d, q), V->f[ue]));
      else element::write_int(d, q, rmw_int(rmw, d, element::read_int(d, q), V->i[ue]));
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

}  // namespace tilejit::runtime::interp
