// Memory: global loads, stores and atomics (predicated through the prelude's helpers), vector
// accesses, pointer arithmetic, and shared memory.
#include "jit/cuda_backend/printer.hpp"

namespace tilejit::jit::cuda_backend {

Printer::Access Printer::access(DType d) {
  switch (ir::byte_size(d)) {
    case 1: return {"u8", "unsigned short"};
    case 2: return {"b16", "unsigned short"};
    case 4: return {"b32", "unsigned"};
    default: return {"b64", "unsigned long long"};
  }
}

std::string Printer::smem(V off, DType d) const {
  return fmt::format("*reinterpret_cast<{}*>(tilejit_smem + {})", storage_ctype(d), n(off));
}
std::string Printer::to_storage(V v) const {
  return dt(v) == DType::i1 && !ty(v).ptr ? fmt::format("(unsigned char){}", n(v)) : n(v);
}

void Printer::load(const pir::Inst& in) {
  check_args(in, 1, 3);
  if (in.args.size() == 2) fail("load takes a pointer, or a pointer, a predicate and a padding value");
  check_results(in, 1);
  V r = in.results[0];
  V p = in.args[0];
  if (!ty(p).ptr) fail("load from a value that is not a pointer");
  DType d = dt(r);
  if (ty(r).ptr) fail("loads of pointers are not supported");
  if (in.args.size() == 1) return def(r, d == DType::i1 ? fmt::format("(*{} != 0)", n(p)) : fmt::format("*{}", n(p)));
  Access acc = access(d);
  def(r, from_bits(d, fmt::format("tj_ld_{}({}, {}, ({}){})", acc.suffix, n(p), n(in.args[1]), acc.reg, bits(in.args[2]))));
}

void Printer::store(const pir::Inst& in) {
  check_args(in, 2, 3);
  V p = in.args[0], x = in.args[1];
  if (!ty(p).ptr) fail("store to a value that is not a pointer");
  if (ty(x).ptr) fail("stores of pointers are not supported");
  if (in.args.size() == 2) {
    line(fmt::format("*{} = {};", n(p), to_storage(x)));
    return;
  }
  Access acc = access(dt(x));
  line(fmt::format("tj_st_{}({}, ({}){}, {});", acc.suffix, n(p), acc.reg, bits(x), n(in.args[2])));
}

void Printer::atomic_add(const pir::Inst& in) {
  check_args(in, 2, 3);
  check_results(in, 1);
  V p = in.args[0], x = in.args[1], r = in.results[0];
  DType d = dt(x);
  if (!ty(p).ptr || ty(x).ptr) fail("atomic_add takes a pointer and a value");
  std::string e;
  switch (d) {
    case DType::i32: case DType::u32: case DType::u64: case DType::f32: case DType::f64: case DType::f16: case DType::bf16:
      e = fmt::format("atomicAdd({}, {})", n(p), n(x));
      break;
    case DType::i64:
      e = fmt::format("(long long)atomicAdd(reinterpret_cast<unsigned long long*>({}), (unsigned long long){})", n(p), n(x));
      break;
    case DType::i8: case DType::u8: case DType::i16: case DType::u16:
      e = from_bits(d, fmt::format("tj_atomic_add_small({}, (unsigned){}, {}u)", n(p), bits(x), ir::byte_size(d)));
      break;
    default: fail(fmt::format("atomic_add on {} is not supported", ir::name(d)));
  }
  if (in.args.size() == 2) return def(r, e);
  def(r, zero(d));
  line(fmt::format("if ({}) v{} = {};", n(in.args[2]), r, e));
}

void Printer::atomic_rmw(const pir::Inst& in) {
  const bool cas = in.op == Op::atomic_cas;
  const size_t values = cas ? 2 : 1;
  check_args(in, 1 + values, 2 + values);
  check_results(in, 1);
  const V p = in.args[0], x = in.args[values], r = in.results[0];
  const DType d = dt(x);
  if (!ty(p).ptr || ty(x).ptr) fail("atomic_rmw / atomic_cas take a pointer and values");
  const pir::AtomicImm a = pir::AtomicImm::decode(in.imm);
  const bool wide = ir::bit_width(d) == 64, fl = ir::is_float(d);
  const std::string bt = wide ? "b64" : "b32", rc = wide ? "l" : "r", ut = wide ? "unsigned long long" : "unsigned";
  const std::string order = fmt::format("{}.{}", ir::name(a.sem), ir::name(a.scope));
  def(r, zero(d));  // masked-off elements return 0
  if (in.args.size() == 2 + values) line(fmt::format("if ({}) {{", n(in.args.back())));
  else line("{");
  if (cas) {
    line(fmt::format("{} tj_old; asm volatile(\"atom.{}.global.cas.{} %0, [%1], %2, %3;\" : \"={}\"(tj_old) : \"l\"({}), \"{}\"({}), "
                     "\"{}\"({}) : \"memory\");",
                     ut, order, bt, rc, n(p), rc, bits(in.args[1]), rc, bits(x)));
    line(fmt::format("v{} = {};", r, from_bits(d, "tj_old")));
  } else if (fl && (a.rmw == ir::AtomicRmw::max || a.rmw == ir::AtomicRmw::min)) {
    // no atom.max/min on floats: a compare-and-swap loop (fmax / fmin: a NaN operand is ignored),
    // relaxed, with the order's fences around it
    const std::string fn = fmt::format("{}{}", a.rmw == ir::AtomicRmw::max ? "fmax" : "fmin", wide ? "" : "f");
    const std::string fence = fmt::format("asm volatile(\"fence.acq_rel.{};\" ::: \"memory\");", ir::name(a.scope));
    if (a.sem == ir::MemSem::release || a.sem == ir::MemSem::acq_rel) line(fence);
    line(fmt::format("{} tj_old = *reinterpret_cast<volatile {}*>({}), tj_seen;", ut, ut, n(p)));
    line(fmt::format("do {{ tj_seen = tj_old; const {} tj_new = {}({}, {});", scalar_ctype(d), fn, from_bits(d, "tj_seen"), n(x)));
    line(fmt::format("  asm volatile(\"atom.relaxed.{}.global.cas.{} %0, [%1], %2, %3;\" : \"={}\"(tj_old) : \"l\"({}), \"{}\"(tj_seen), "
                     "\"{}\"({}) : \"memory\");",
                     ir::name(a.scope), bt, rc, n(p), rc, rc, fl && wide ? "(unsigned long long)__double_as_longlong(tj_new)" : "__float_as_uint(tj_new)"));
    line("} while (tj_old != tj_seen);");
    if (a.sem == ir::MemSem::acquire || a.sem == ir::MemSem::acq_rel) line(fence);
    line(fmt::format("v{} = {};", r, from_bits(d, "tj_old")));
  } else {
    // PTX atom: add/max/min typed (floats by value), the bitwise ops and exchange on bits
    std::string op, type = bt;
    switch (a.rmw) {
      case ir::AtomicRmw::add: op = "add"; break;
      case ir::AtomicRmw::max: op = "max"; break;
      case ir::AtomicRmw::min: op = "min"; break;
      case ir::AtomicRmw::and_: op = "and"; break;
      case ir::AtomicRmw::or_: op = "or"; break;
      case ir::AtomicRmw::xor_: op = "xor"; break;
      case ir::AtomicRmw::xchg: op = "exch"; break;
    }
    const bool arith = a.rmw == ir::AtomicRmw::add || a.rmw == ir::AtomicRmw::max || a.rmw == ir::AtomicRmw::min;
    if (arith && fl) {
      const std::string fc = wide ? "d" : "f";
      line(fmt::format("asm volatile(\"atom.{}.global.{}.{} %0, [%1], %2;\" : \"={}\"(v{}) : \"l\"({}), \"{}\"({}) : \"memory\");",
                       order, op, wide ? "f64" : "f32", fc, r, n(p), fc, n(x)));
    } else {
      // (no atom.add.s64: the unsigned add has the same bits)
      if (arith) type = fmt::format("{}{}", ir::is_signed(d) && !(a.rmw == ir::AtomicRmw::add && wide) ? "s" : "u", wide ? 64 : 32);
      line(fmt::format("{} tj_old; asm volatile(\"atom.{}.global.{}.{} %0, [%1], %2;\" : \"={}\"(tj_old) : \"l\"({}), \"{}\"({}) : "
                       "\"memory\");",
                       ut, order, op, type, rc, n(p), rc, bits(x)));
      line(fmt::format("v{} = {};", r, from_bits(d, "tj_old")));
    }
  }
  line("}");
}

void Printer::memory_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return in.args.at(i); };
  switch (in.op) {
    case Op::load_vec: {
      // one aligned vector access: uint2/uint4 (or one unsigned) through a reinterpret_cast
      check_args(in, 1, 1);
      if (!ty(a(0)).ptr) fail("load_vec takes a pointer");
      if (in.imm != static_cast<int64_t>(in.results.size()) || (in.imm != 1 && in.imm != 2 && in.imm != 4))
        fail(fmt::format("load_vec of {} words has {} results (1, 2 or 4 words, one result each)", in.imm, in.results.size()));
      for (V r : in.results)
        if (ty(r) != pir::scalar(DType::u32)) fail("load_vec results must be u32");
      const char* vt = in.results.size() == 4 ? "uint4" : in.results.size() == 2 ? "uint2" : "uint1";
      std::string tmp = fmt::format("vec{}", in.results[0]);
      line(fmt::format("const {} {} = *reinterpret_cast<const {}*>({});", vt, tmp, vt, n(a(0))));
      static const char* lanes[4] = {"x", "y", "z", "w"};
      for (size_t i = 0; i < in.results.size(); ++i) def(in.results[i], fmt::format("{}.{}", tmp, lanes[i]));
      return;
    }
    case Op::store_vec: {
      check_args(in, 2, 5);
      if (!ty(a(0)).ptr) fail("store_vec takes a pointer");
      size_t words = in.args.size() - 1;
      if (words == 3) fail("store_vec stores 1, 2 or 4 words, not 3");
      for (size_t i = 1; i < in.args.size(); ++i)
        if (ty(a(i)) != pir::scalar(DType::u32)) fail("store_vec values must be u32");
      const char* vt = words == 4 ? "uint4" : words == 2 ? "uint2" : "uint1";
      std::vector<std::string> parts;
      for (size_t i = 1; i < in.args.size(); ++i) parts.push_back(n(a(i)));
      line(fmt::format("*reinterpret_cast<{}*>({}) = make_{}({});", vt, n(a(0)), vt, fmt::join(parts, ", ")));
      return;
    }
    case Op::gep: {
      check_args(in, 2, 2);
      check_results(in, 1);
      if (!ty(a(0)).ptr || ty(a(1)).ptr) fail("gep takes a pointer and an integer offset");
      const bool s = ir::is_signed(dt(a(1)));
      return def(in.results[0], fmt::format("{} + ({}){}", n(a(0)), s ? "long long" : "unsigned long long", n(a(1))));
    }
    case Op::load_shared: {
      check_args(in, 1, 1);
      check_results(in, 1);
      DType d = dt(in.results[0]);
      std::string e = smem(a(0), ty(in.results[0]).ptr ? DType::u64 : d);
      if (ty(in.results[0]).ptr) return def(in.results[0], fmt::format("reinterpret_cast<{}>({})", ctype(ty(in.results[0])), e));
      return def(in.results[0], d == DType::i1 ? fmt::format("({} != 0)", e) : e);
    }
    case Op::store_shared: {
      check_args(in, 2, 3);
      const std::string v = ty(a(1)).ptr ? fmt::format("reinterpret_cast<unsigned long long>({})", n(a(1))) : to_storage(a(1));
      const std::string s = fmt::format("{} = {};", smem(a(0), ty(a(1)).ptr ? DType::u64 : dt(a(1))), v);
      if (in.args.size() == 3) line(fmt::format("if ({}) {}", n(a(2)), s));
      else line(s);
      return;
    }
    case Op::smem_addr:
      check_args(in, 1, 1);
      check_results(in, 1);
      return def(in.results[0], fmt::format("(unsigned)__cvta_generic_to_shared(tilejit_smem + {})", n(a(0))));
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

}  // namespace tilejit::jit::cuda_backend
