// Synchronisation and ordering: barriers, shuffles, mbarriers, semaphores, shared-memory atomics,
// register reallocation, and what keeps ptxas from moving code (ptxas_fence, opaque, keep_alive).
#include <cstdlib>

#include "jit/cuda_backend/printer.hpp"

namespace tilejit::jit::cuda_backend {

// `ptx` (inline-asm text with %N operands) inside a never-taken loop on %smid (the LLVM backend's
// ptxas_fence): ptxas moves no code across it. As C++ string-literal text, with a fresh label.
std::string Printer::ptxas_fence(const std::string& ptx, const char* label) {
  const int id = asm_labels_++;
  return fmt::format("{}\\t{}_{}:\\n\\t{}\\n\\t@P1 bra.uni {}_{};\\n\\t}}", kNeverTrueP1, label, id, ptx, label, id);
}

// `ptx`, then a never-taken loop re-reading %smid (the LLVM backend's ptxas_fence_after): code after
// it does not move above `ptx`, which runs once in ptxas's view (decision 096).
std::string Printer::ptxas_fence_after(const std::string& ptx, const char* label) {
  const int id = asm_labels_++;
  return fmt::format("{{\\n\\t.reg .pred P1;\\n\\t.reg .b32 S1;\\n\\t{}\\n\\t{}_{}:\\n\\tmov.u32 S1, %%smid;\\n\\t"
                     "setp.gt.u32 P1, S1, 2147483647;\\n\\t@P1 bra.uni {}_{};\\n\\t}}",
                     ptx, label, id, label, id);
}

std::string Printer::without_operands(std::string text) {
  for (size_t at = text.find("%%"); at != std::string::npos; at = text.find("%%", at + 1)) text.erase(at, 1);
  return text;
}

void Printer::sync_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return in.args.at(i); };
  switch (in.op) {
    case Op::barrier: line("__syncthreads();"); return;
    case Op::named_barrier_sync:
    case Op::named_barrier_arrive:
    {
      // fenced as in the LLVM backend (unless pir::kBarrierUnfenced): ptxas would sink the
      // arithmetic computed before a turn (the softmax) past the bar.sync, into the turn
      check_args(in, 1, 1);
      const std::string op = in.op == Op::named_barrier_sync ? "bar.sync %0, %1;" : "bar.arrive %0, %1;";
      line(fmt::format("asm volatile(\"{}\" :: \"r\"({}), \"r\"({}) : \"memory\");",
                       in.imm & pir::kBarrierUnfenced ? op : ptxas_fence(op, "TJ_TURN"), u32(a(0)), in.imm & (pir::kBarrierUnfenced - 1)));
      return;
    }
    case Op::ballot:
      check_args(in, 1, 1);
      check_results(in, 1);
      return def(in.results[0], fmt::format("__ballot_sync(0xffffffffu, {})", n(a(0))));
    case Op::shfl_xor: {
      check_args(in, 1, 1);
      check_results(in, 1);
      V x = a(0);
      const std::string mask = fmt::format("{}", static_cast<int>(in.imm));
      if (ty(x).ptr) {
        return def(in.results[0], fmt::format("reinterpret_cast<{}>(__shfl_xor_sync(0xffffffffu, reinterpret_cast<unsigned long long>({}), {}))",
                                              ctype(ty(x)), n(x), mask));
      }
      switch (dt(x)) {
        case DType::i32: case DType::u32: case DType::i64: case DType::u64: case DType::f32: case DType::f64: case DType::f16:
        case DType::bf16:
          return def(in.results[0], fmt::format("__shfl_xor_sync(0xffffffffu, {}, {})", n(x), mask));
        default:  // 1, 8 and 16-bit integers (and fp8 bits) travel as a 32-bit word
          return def(in.results[0], from_bits(dt(x), fmt::format("__shfl_xor_sync(0xffffffffu, (unsigned){}, {})", bits(x), mask)));
      }
    }
    case Op::mbar_init:
      check_args(in, 2, 2);
      line(fmt::format("asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"({}), \"r\"({}) : \"memory\");", u32(a(0)),
                       u32(a(1))));
      return;
    case Op::mbar_expect_tx:
      check_args(in, 2, 2);
      line(fmt::format("asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"({}), \"r\"({}) : \"memory\");",
                       u32(a(0)), u32(a(1))));
      return;
    case Op::mbar_arrive:
      check_args(in, 1, 1);
      line(fmt::format("asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"({}) : \"memory\");", u32(a(0))));
      return;
    case Op::sem_wait:
      check_args(in, 2, 2);
      line(fmt::format("tj_sem_wait((const int*){}, (int){});", n(a(0)), n(a(1))));
      return;
    case Op::read_clock:
      check_args(in, 0, 0);
      check_results(in, 1);
      return def(in.results[0], "(unsigned long long)clock64()");
    case Op::sem_signal:
      check_args(in, 2, 2);
      line(fmt::format("tj_sem_signal((int*){}, (int){});", n(a(0)), n(a(1))));
      return;
    case Op::mbar_wait: check_args(in, 2, 2); line(fmt::format("tj_mbar_wait({}, {});", u32(a(0)), u32(a(1)))); return;
    case Op::atom_shared:
      check_args(in, 2, 2);
      declare(in.results[0]);
      line(fmt::format("asm volatile(\"atom.{}.cta.shared::cta.{} %0, [%1], %2;\" : \"=r\"(v{}) : \"r\"({}), \"r\"({}) : \"memory\");",
                       in.imm == pir::kAtomSharedCount ? "relaxed" : "acq_rel", in.imm == pir::kAtomSharedExch ? "exch.b32" : "add.u32",
                       in.results[0], u32(a(0)), u32(a(1))));
      return;
    case Op::mbar_inval:
      check_args(in, 1, 1);
      line(fmt::format("asm volatile(\"mbarrier.inval.shared::cta.b64 [%0];\" :: \"r\"({}) : \"memory\");", u32(a(0))));
      return;
    case Op::set_max_registers:
      line(fmt::format("asm volatile(\"setmaxnreg.{}.sync.aligned.u32 {};\" ::: \"memory\");", in.imm > 0 ? "inc" : "dec",
                       std::abs(in.imm)));
      return;
    case Op::fence_mbar_init: line("asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");"); return;
    case Op::exit_thread: line("asm volatile(\"exit;\" ::: \"memory\");"); return;
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

void Printer::opaque(const pir::Inst& in) {
  // copies tied in/out of an empty volatile asm: computed before it, never sunk past it
  if (in.args.size() != in.results.size()) fail("opaque takes as many values as it returns");
  std::vector<std::string> tied;
  for (size_t i = 0; i < in.args.size(); ++i) {
    if (ty(in.results[i]) != ty(in.args[i])) fail("opaque returns its arguments' types");
    if (in.imm & pir::kOpaqueCopy) {  // a copy of its own (not tied): see pir::kOpaqueCopy
      const pir::Ty t = ty(in.results[i]);
      const int w = ir::bit_width(t.dtype);
      const char* c = t.ptr || t.dtype == DType::i1 ? nullptr
                      : w == 64                    ? (t.dtype == DType::f64 ? "d" : "l")
                      : w == 32                    ? (t.dtype == DType::f32 ? "f" : "r")
                      : w == 16                    ? "h"
                                                   : nullptr;
      if (!c) {
        def(in.results[i], n(in.args[i]));
        continue;
      }
      declare(in.results[i]);
      line(fmt::format("asm volatile(\"mov.b{} %0, %1;\" : \"={}\"(v{}) : \"{}\"({}));", w, c, in.results[i], c, n(in.args[i])));
      continue;
    }
    def(in.results[i], n(in.args[i]));
    const pir::Ty t = ty(in.results[i]);
    const int w = ir::bit_width(t.dtype);
    const char* c = t.ptr || t.dtype == DType::i1 ? nullptr  // pass through, as in the LLVM backend
                    : w == 64                    ? (t.dtype == DType::f64 ? "+d" : "+l")
                    : w == 32                    ? (t.dtype == DType::f32 ? "+f" : "+r")
                    : t.dtype == DType::i16 || t.dtype == DType::u16 ? "+h"
                                                                    : nullptr;
    if (c) tied.push_back(fmt::format("\"{}\"(v{})", c, in.results[i]));
  }
  if (!tied.empty()) line(fmt::format("asm volatile(\"\" : {});", fmt::join(tied, ", ")));
}

void Printer::keep_alive(const pir::Inst& in) {
  // (thread_ir.hpp) predicated-off shared stores of each register
  std::string text = kNeverTrueP1;
  std::vector<std::string> ins;
  for (size_t k = 0; k < in.args.size(); ++k) {
    const pir::Ty t = ty(in.args[k]);
    const bool wide = ir::bit_width(t.dtype) == 64 || t.ptr;
    text += fmt::format("\\t@P1 st.shared.b{} [S1], %{};\\n", wide ? 64 : 32, ins.size());
    ins.push_back(wide ? fmt::format("\"l\"((unsigned long long){})", n(in.args[k]))
                       : t.dtype == DType::f32 ? fmt::format("\"r\"(__float_as_uint({}))", n(in.args[k]))
                                               : fmt::format("\"r\"((unsigned){})", n(in.args[k])));
  }
  text += "}";
  line(fmt::format("asm volatile(\"{}\" :: {});", text, fmt::join(ins, ", ")));
}

}  // namespace tilejit::jit::cuda_backend
