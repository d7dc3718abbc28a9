// The emulator's values, conversions, memory and atomics (machine.hpp): the interpreter's element
// rules (runtime/interpreter/elementwise.cpp), which model the PTX the backends emit.
#include <bit>

#include "dsl/ir/input_precision.hpp"
#include "runtime/emulator/machine.hpp"

namespace tilejit::runtime::emu {

Val Emulator::binary(const pir::Inst& in, pir::Ty type, const Val& a, const Val& b, int t) const {
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

Val Emulator::unary(const pir::Inst& in, pir::Ty type, const Val& a, int t) const {
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
    case Op::popc: r.i = std::popcount(u); break;  // (u32 operands: no bits above 32)
    default: fault(in, t, "not defined for integer operands");
  }
  return r;
}

Val Emulator::convert(pir::Ty from, pir::Ty to, const Val& a) const {
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

Val Emulator::reinterpret(pir::Ty from, pir::Ty to, const Val& a) const {
  Val r;
  if (from.ptr || to.ptr) {
    r.i = a.i;
    return r;
  }
  element::from_bits(to.dtype, element::to_bits(from.dtype, a.f, a.i), r.f, r.i);
  return r;
}

void Emulator::inst(const pir::Inst& in, const Mask& m) {
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
    case Op::read_clock: {
      const int64_t now = ++clock_;
      each(m, [&](int t) { set(0, t, Val{0, now}); });
      return;
    }
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
    case Op::neg: case Op::bit_not: case Op::abs: case Op::popc: case Op::exp2: case Op::log2: case Op::exp: case Op::log:
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
    case Op::cvt_tf32:  // (the f32's bits, as cvt.rna.tf32.f32 rounds them)
      each(m, [&](int t) {
        const auto b = static_cast<uint32_t>(element::to_bits(DType::f32, arg(0, t).f, arg(0, t).i));
        set(0, t, Val{0, static_cast<int64_t>(ir::tf32_rna_bits(b))});
      });
      return;
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

void Emulator::memory_inst(const pir::Inst& in, const Mask& m) {
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
    case Op::ballot: {
      const std::vector<Val> votes = vals(in.args[0]);
      std::vector<uint32_t> warp_bits((votes.size() + 31) / 32, 0);
      each(m, [&](int t) {
        if (votes[static_cast<size_t>(t)].i) warp_bits[static_cast<size_t>(t / 32)] |= 1u << (t & 31);
      });
      each(m, [&](int t) { set(0, t, Val{0, static_cast<int64_t>(warp_bits[static_cast<size_t>(t / 32)])}); });
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

void Emulator::atomic(const pir::Inst& in, const Mask& m) {
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

}  // namespace tilejit::runtime::emu
