#include "tools/fuzz/emitter.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace tilejit::fuzz {

using namespace tilejit::lang;
using ir::OpKind;

bool is_marker(NodeKind k) {
  return k == NodeKind::LoopBegin || k == NodeKind::LoopEnd || k == NodeKind::IfBegin || k == NodeKind::IfElse ||
         k == NodeKind::IfEnd;
}

Emitter::Emitter(Builder& b, Program& p) : b_(b), p_(p) { values_.resize(p.nodes.size()); }

void Emitter::declare_params() {
  for (size_t i = 0; i < p_.tensors.size(); ++i) {
    const TensorSpec& t = p_.tensors[i];
    tensors_.push_back(b_.tensor(fmt::format("T{}", i), t.dtype, static_cast<int>(t.shape.size()),
                                 {.align_bytes = t.align, .contiguous_last = t.contiguous}));
  }
  for (size_t i = 0; i < p_.scalars.size(); ++i) scalars_.push_back(b_.scalar(fmt::format("s{}", i), p_.scalars[i].dtype));
}

Operand Emitter::literal(DType d, double v, int64_t iv) const {
  if (d == DType::i1) return Operand(iv != 0);
  if (ir::is_float(d)) return Operand(v);
  if (d == DType::u64) return Operand(static_cast<uint64_t>(iv));
  return Operand(iv);
}

Tile Emitter::store_pointers(const Tensor& o) const {
  Tile r = arange(0, p_.R), c = arange(0, p_.C);
  return o.ptr() + program_id(0) * o.stride(0) + r[col] * o.stride(1) + c[row] * o.stride(2);
}

// scans, combine reductions, xor_permute and gather (program.hpp's NodeKind::Scan ...)
Tile Emitter::along_axis(const Node& n) {
  const int axis = static_cast<int>(n.ivalue);
  const auto a = [&](size_t k) { return value(n.args[k]); };
  if (n.kind == NodeKind::XorPermute) return xor_permute(a(0), axis, n.sub);
  if (n.kind == NodeKind::Gather) return gather(a(0), cast(DType::i32, a(1)) & (a(0).shape()[static_cast<size_t>(axis)] - 1), axis);
  if (n.kind == NodeKind::Histogram) return histogram(a(0), int64_t{1} << n.sub);
  const int sub = n.sub;
  const Combine1 combine = [sub](const Tile& p, const Tile& q) {
    switch (sub) {
      case 0: return p + q;
      case 1: return maximum(p, q);
      case 2: return minimum(p, q);
      case 3: return p;
      default: return q;
    }
  };
  return n.kind == NodeKind::Scan ? associative_scan(a(0), axis, combine, n.value != 0) : reduce(a(0), axis, combine);
}

void Emitter::emit(size_t i) {
  Node& n = p_.nodes[i];
  auto a = [&](size_t k) -> const Tile& { return values_.at(static_cast<size_t>(n.args.at(k))); };
  Tile r;
  switch (n.kind) {
    case NodeKind::Scalar: r = scalars_.at(static_cast<size_t>(n.ivalue)); break;
    case NodeKind::Constant:
      r = n.shape.empty() ? scalar_constant(n.dtype, literal(n.dtype, n.value, n.ivalue))
                          : full(n.dtype, n.shape, literal(n.dtype, n.value, n.ivalue));
      break;
    case NodeKind::Arange: {
      Tile t = arange(0, n.ivalue);
      r = n.sub == 0 ? t : n.sub == 1 ? t[col] : t[row];
      break;
    }
    case NodeKind::ProgramId: r = program_id(0); break;
    case NodeKind::LoadPtr: {
      const Tensor& t = tensors_.at(static_cast<size_t>(n.tensor));
      Tile rows = (a(0) + arange(0, n.shape[0]))[col], cols = (a(1) + arange(0, n.shape[1]))[row];
      Tile mask = (rows >= 0) & (rows < t.size(0)) & (cols >= 0) & (cols < t.size(1));
      r = load(t.ptr() + rows * t.stride(0) + cols * t.stride(1), mask, literal(t.dtype(), n.value, n.ivalue));
      break;
    }
    case NodeKind::LoadBlock:
      r = load(tensors_.at(static_cast<size_t>(n.tensor)).block({a(0), a(1)}, n.shape), n.value);
      break;
    case NodeKind::LoadOutput: {
      const Tensor& o = tensors_.at(static_cast<size_t>(n.tensor));
      r = load(o.block({program_id(0), a(0), a(1)}, n.shape, {1, 2}), 0.0);
      break;
    }
    case NodeKind::Unary:
      switch (static_cast<OpKind>(n.sub)) {
        case OpKind::neg: r = -a(0); break;
        case OpKind::bit_not: r = ~a(0); break;
        case OpKind::abs: r = abs(a(0)); break;
        case OpKind::exp: r = exp(a(0)); break;
        case OpKind::exp2: r = exp2(a(0)); break;
        case OpKind::log: r = log(a(0)); break;
        case OpKind::log2: r = log2(a(0)); break;
        case OpKind::sqrt: r = sqrt(a(0)); break;
        case OpKind::rsqrt: r = rsqrt(a(0)); break;
        case OpKind::rcp: r = rcp(a(0)); break;
        case OpKind::floor: r = floor(a(0)); break;
        case OpKind::ceil: r = ceil(a(0)); break;
        case OpKind::tanh: r = tanh(a(0)); break;
        case OpKind::sin: r = sin(a(0)); break;
        case OpKind::cos: r = cos(a(0)); break;
        case OpKind::erf: r = erf(a(0)); break;
        case OpKind::precompute: r = precompute(a(0)); break;
        default: throw std::logic_error("fuzz: unknown unary op");
      }
      break;
    case NodeKind::Binary:
      switch (static_cast<OpKind>(n.sub)) {
        case OpKind::add: r = a(0) + a(1); break;
        case OpKind::sub: r = a(0) - a(1); break;
        case OpKind::mul: r = n.ivalue != 0 ? scale_lazily(a(0), a(1)) : a(0) * a(1); break;
        case OpKind::div: r = a(0) / a(1); break;
        case OpKind::rem: r = a(0) % a(1); break;
        case OpKind::minimum: r = minimum(a(0), a(1)); break;
        case OpKind::maximum: r = maximum(a(0), a(1)); break;
        case OpKind::bit_and: r = a(0) & a(1); break;
        case OpKind::bit_or: r = a(0) | a(1); break;
        case OpKind::bit_xor: r = a(0) ^ a(1); break;
        case OpKind::shl: r = a(0) << a(1); break;
        case OpKind::shr: r = a(0) >> a(1); break;
        case OpKind::umulhi: r = umulhi(a(0), a(1)); break;
        case OpKind::cmp:
          switch (n.ivalue) {
            case 0: r = a(0) == a(1); break;
            case 1: r = a(0) != a(1); break;
            case 2: r = a(0) < a(1); break;
            case 3: r = a(0) <= a(1); break;
            case 4: r = a(0) > a(1); break;
            default: r = a(0) >= a(1); break;
          }
          break;
        default: throw std::logic_error("fuzz: unknown binary op");
      }
      break;
    case NodeKind::Select: r = where(a(0), a(1), a(2)); break;
    case NodeKind::Fma: r = fma(a(0), a(1), a(2)); break;
    case NodeKind::Cast: r = cast(n.dtype, a(0)); break;
    case NodeKind::Bitcast: r = bitcast(n.dtype, a(0)); break;
    case NodeKind::Broadcast: {
      Tile x = a(0);
      if (n.sub == 1) x = x[col];
      if (n.sub == 2) x = x[row];
      r = broadcast_to(x, n.shape);
      break;
    }
    case NodeKind::Trans: r = trans(a(0)); break;
    case NodeKind::Reduce: {
      const int axis = static_cast<int>(n.ivalue);
      if (axis < 0) r = n.sub == 0 ? sum(a(0)) : n.sub == 1 ? max(a(0)) : min(a(0));
      else r = n.sub == 0 ? sum(a(0), axis) : n.sub == 1 ? max(a(0), axis) : min(a(0), axis);
      break;
    }
    case NodeKind::Scan:
    case NodeKind::ReduceWith:
    case NodeKind::XorPermute:
    case NodeKind::Gather:
    case NodeKind::Histogram: r = along_axis(n); break;
    case NodeKind::Dot: {
      const DotOptions o{.descriptors_at_use = n.ivalue != 0};
      r = n.args.size() == 3 ? dot(a(0), a(1), a(2), o) : dot(a(0), a(1), o);
      break;
    }
    case NodeKind::PackPairs: r = pack_pairs(a(0)); break;
    case NodeKind::UnpackPairs: r = unpack_pairs(n.dtype, a(0)); break;
    case NodeKind::VarDecl:
      if (vars_.size() <= static_cast<size_t>(n.var)) vars_.resize(static_cast<size_t>(n.var) + 1);
      vars_[static_cast<size_t>(n.var)] = std::make_unique<Var>(a(0));
      r = a(0);
      break;
    case NodeKind::VarRead: r = vars_.at(static_cast<size_t>(n.var))->value(); break;
    case NodeKind::VarAssign:
      *vars_.at(static_cast<size_t>(n.var)) = a(0);
      r = a(0);
      break;
    case NodeKind::Store: {
      const Tensor& o = tensors_.at(static_cast<size_t>(n.tensor));
      if (n.sub == 1) store(o.block({program_id(0), a(1), a(2)}, {p_.R, p_.C}, {1, 2}), a(0), StoreOptions{.tma = p_.tma_stores, .offsets_at_store = p_.tma_stores && n.ivalue != 0});
      else if (n.sub == 3) store(o.block({program_id(0), a(1), a(2)}, {p_.R, p_.C}, {1, 2}), a(0));
      else if (n.sub == 2) store(store_pointers(o), a(0), a(1));
      else store(store_pointers(o), a(0));
      return;
    }
    case NodeKind::AtomicAdd: r = atomic_add(store_pointers(tensors_.at(static_cast<size_t>(n.tensor))), a(0)); break;
    case NodeKind::AtomicBlock: {
      const BlockRef blk = tensors_.at(static_cast<size_t>(n.tensor)).block({a(1), a(2)}, {p_.R, p_.C});
      switch (n.sub) {
        case 1: atomic_max(blk, a(0)); break;
        case 2: atomic_min(blk, a(0)); break;
        case 3: atomic_and(blk, a(0)); break;
        case 4: atomic_or(blk, a(0)); break;
        case 5: atomic_xor(blk, a(0)); break;
        default: atomic_add(blk, a(0));
      }
      return;
    }
    default: throw std::logic_error("fuzz: emit called on a marker");
  }
  values_[i] = r;
  n.dtype = r.dtype();
  n.shape = r.shape();
}

size_t Emitter::replay_block(size_t i) {
  while (i < p_.nodes.size()) {
    Node& n = p_.nodes[i];
    if (n.removed) {
      ++i;
      continue;
    }
    if (n.kind == NodeKind::LoopEnd || n.kind == NodeKind::IfElse || n.kind == NodeKind::IfEnd) return i;
    if (n.kind == NodeKind::LoopBegin) {
      size_t end = i;
      for_range(value(n.args.at(0)), value(n.args.at(1)), n.ivalue, [&](Tile iv) {
        values_[i] = iv;
        end = replay_block(i + 1);
      });
      i = end + 1;
    } else if (n.kind == NodeKind::IfBegin) {
      size_t mid = i, end = i;
      if_(value(n.args.at(0)), [&] { mid = replay_block(i + 1); }, [&] { end = replay_block(mid + 1); });
      i = end + 1;
    } else {
      emit(i);
      ++i;
    }
  }
  return i;
}

void Emitter::replay() {
  size_t end = replay_block(0);
  if (end != p_.nodes.size()) throw std::logic_error("fuzz: unbalanced loop/if markers");
}

ir::Function build(Program& p) {
  return kernel("fuzz", [&](Builder& b) {
           Emitter e(b, p);
           e.declare_params();
           e.replay();
         })
      .build();
}

bool Program::has_output() const {
  for (const Node& n : nodes)
    if (!n.removed && (n.kind == NodeKind::Store || n.kind == NodeKind::AtomicAdd || n.kind == NodeKind::AtomicBlock))
      return true;
  return false;
}

}  // namespace tilejit::fuzz
