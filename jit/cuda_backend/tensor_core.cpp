// Tensor cores and TMA: mma.sync, wgmma (with its fence, commit and wait), TMA copies and
// reductions with their bulk groups, and the async-proxy fences.
#include "jit/cuda_backend/printer.hpp"

namespace tilejit::jit::cuda_backend {

// mma_16816 (imm: f16 or bf16 operands, packed in pairs) or mma_1688_tf32 (one tf32 bit pattern a
// register, from cvt_tf32): the fragments in "r" registers, the accumulators in "f" ones.
void Printer::mma(const pir::Inst& in) {
  check_args(in, 10, 10);
  check_results(in, 4);
  const bool tf32 = in.op == Op::mma_1688_tf32;
  const char* name = tf32 ? "mma_1688_tf32" : "mma_16816";
  std::string shape_types;
  if (tf32) {
    shape_types = "m16n8k8.row.col.f32.tf32.tf32.f32";
  } else {
    const auto od = static_cast<DType>(in.imm);
    if (od != DType::f16 && od != DType::bf16) fail(fmt::format("mma_16816 operands must be f16 or bf16 (imm is {})", in.imm));
    shape_types = fmt::format("m16n8k16.row.col.f32.{0}.{0}.f32", od == DType::bf16 ? "bf16" : "f16");
  }
  std::vector<std::string> ins;
  for (size_t i = 0; i < 10; ++i) {
    V v = in.args[i];
    const bool f32 = i >= 6;
    if (ty(v).ptr || dt(v) != (f32 ? DType::f32 : DType::u32))
      fail(fmt::format("{} operand {} is {}, expected {}", name, i, pir::type_name(ty(v)), f32 ? "f32" : "u32"));
    ins.push_back(fmt::format("\"{}\"({})", f32 ? "f" : "r", n(v)));
  }
  for (V r : in.results)
    if (ty(r) != pir::scalar(DType::f32)) fail(fmt::format("{} results must be f32", name));
  line(fmt::format("float v{}, v{}, v{}, v{};", in.results[0], in.results[1], in.results[2], in.results[3]));
  for (V r : in.results) mark(r);
  line(fmt::format("asm(\"mma.sync.aligned.{0} {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
                   "{{%10,%11,%12,%13}};\"\n{5}    : \"=f\"(v{1}), \"=f\"(v{2}), \"=f\"(v{3}), \"=f\"(v{4})\n{5}    : {6});",
                   shape_types, in.results[0], in.results[1], in.results[2], in.results[3], std::string(static_cast<size_t>(depth_) * 2, ' '),
                   fmt::join(ins, ", ")));
}

// f32 -> the tf32 bit pattern (u32) that mma_1688_tf32 reads: PTX cvt.rna.tf32.f32.
void Printer::cvt_tf32(const pir::Inst& in) {
  check_args(in, 1, 1);
  check_results(in, 1);
  if (ty(in.args[0]) != pir::scalar(DType::f32) || ty(in.results[0]) != pir::scalar(DType::u32))
    fail(fmt::format("cvt_tf32 takes an f32 and gives a u32, got {} -> {}", pir::type_name(ty(in.args[0])), pir::type_name(ty(in.results[0]))));
  declare(in.results[0]);
  line(fmt::format("asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(v{}) : \"f\"({}));", in.results[0], n(in.args[0])));
}

// wgmma and wgmma_wait: the results are the accumulators, tied to the inputs ("+f"), as the LLVM
// backend ties its outputs to its inputs.
void Printer::wgmma(const pir::Inst& in) {
  const bool is_wait = in.op == Op::wgmma_wait, rs = in.op == Op::wgmma_rs;
  const size_t nr = in.results.size();
  const size_t first_acc = is_wait ? 0 : rs ? 5 : 2;
  if (in.args.size() != first_acc + nr)
    fail(fmt::format("{} has {} operands for {} accumulators (expected {})", pir::op_name(in.op), in.args.size(), nr, first_acc + nr));
  // imm bit 25 (wgmma, wgmma_rs): D = A*B, scale-d = 0: the accumulator inputs are not read.
  const bool overwrite = !is_wait && ((in.imm >> 25) & 1);
  for (size_t i = 0; i < nr; ++i) {
    if (ty(in.args[first_acc + i]) != pir::scalar(DType::f32) || ty(in.results[i]) != pir::scalar(DType::f32))
      fail(fmt::format("{}: accumulators must be f32", pir::op_name(in.op)));
    if (overwrite) declare(in.results[i]);
    else def(in.results[i], n(in.args[first_acc + i]));
  }
  const char* scale_d = overwrite ? "0" : "1";
  std::string text;
  std::string inputs;
  if (is_wait) {
    const int64_t groups = in.imm & 0xFF;
    if (in.imm < 0 || groups > 7) fail(fmt::format("wgmma_wait: {} groups in flight is not in [0, 7]", groups));
    text = fmt::format("wgmma.wait_group.sync.aligned {};", groups);
    // as the LLVM backend: a never-taken loop keeps ptxas from moving code across the wait
    if (in.imm & pir::kWaitFenced) text = ptxas_fence(text, "TJ_WGWAIT");
  } else {
    const int64_t nn = in.imm & 0xFFFF;
    const auto od = static_cast<DType>((in.imm >> 16) & 0xFF);
    const int64_t trans_b = (in.imm >> 24) & 1, trans_a = (in.imm >> 26) & 1;
    if (od != DType::f16 && od != DType::bf16) fail(fmt::format("wgmma operands must be f16 or bf16 (imm is {:#x})", in.imm));
    if (nn < 8 || nn > 256 || nn % 8 || static_cast<size_t>(nn / 2) != nr)
      fail(fmt::format("wgmma m64n{}k16 needs {} accumulators, got {}", nn, nn / 2, nr));
    const size_t first_desc = rs ? 4 : 0;
    for (size_t i = first_desc; i < first_acc; ++i)
      if (ty(in.args[i]).ptr || ir::bit_width(dt(in.args[i])) != 64) fail("wgmma: the descriptors must be 64-bit integers");
    for (size_t i = 0; i < first_desc; ++i)
      if (ty(in.args[i]) != pir::scalar(DType::u32)) fail("wgmma_rs: the A fragment must be four u32 registers");
    const char* t = od == DType::bf16 ? "bf16" : "f16";
    std::string regs;
    for (size_t i = 0; i < nr; ++i) regs += fmt::format("{}%{}", i ? ", " : "", i);
    if (rs) {
      text = fmt::format("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{}, 0;\\n\\twgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} "
                         "{{{}}}, {{%{}, %{}, %{}, %{}}}, %{}, p, 1, 1, {};\\n\\t}}",
                         nr + 5, nn, t, t, regs, nr, nr + 1, nr + 2, nr + 3, nr + 4, trans_b);
      inputs = fmt::format("\"r\"({}), \"r\"({}), \"r\"({}), \"r\"({}), \"l\"({}), \"r\"({})", n(in.args[0]), n(in.args[1]),
                           n(in.args[2]), n(in.args[3]), n(in.args[4]), scale_d);
    } else {
      text = fmt::format("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{}, 0;\\n\\twgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} "
                         "{{{}}}, %{}, %{}, p, 1, 1, {}, {};\\n\\t}}",
                         nr + 2, nn, t, t, regs, nr, nr + 1, trans_a, trans_b);
      inputs = fmt::format("\"l\"({}), \"l\"({}), \"r\"({})", n(in.args[0]), n(in.args[1]), scale_d);
    }
  }
  std::vector<std::string> outs;
  for (V r : in.results) outs.push_back(fmt::format("\"{}f\"(v{})", overwrite ? "=" : "+", r));
  line(fmt::format("asm volatile(\"{}\"\n{}    : {}\n{}    : {} : \"memory\");", text, indent(), fmt::join(outs, ", "), indent(), inputs));
}

void Printer::tensor_inst(const pir::Inst& in) {
  auto a = [&](size_t i) { return in.args.at(i); };
  switch (in.op) {
    case Op::tma_load_2d:
      check_args(in, 5, 5);
      if (!ty(a(1)).ptr && ir::bit_width(dt(a(1))) != 64) fail("tma_load_2d: the tensor map must be a pointer or a 64-bit address");
      line(fmt::format("asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{%2, %3}}], "
                       "[%4];\"\n{}    :: \"r\"({}), \"l\"({}), \"r\"({}), \"r\"({}), \"r\"({}) : \"memory\");",
                       indent(), u32(a(0)), n(a(1)), u32(a(2)), u32(a(3)), u32(a(4))));
      return;
    case Op::tma_load:
    case Op::tma_reduce_add:
    case Op::tma_store: {
      // (shared addr, map, coordinates[, mbarrier]): the copy's operands, then "{c0, c1, ...}"
      const bool load = in.op == Op::tma_load;
      const char* what = load ? "tma_load" : in.op == Op::tma_store ? "tma_store" : "tma_reduce_add";
      const auto rank = static_cast<size_t>(in.imm);
      if (rank < 1 || rank > 5) fail(fmt::format("{}: rank {} is not in [1, 5]", what, rank));
      check_args(in, rank + (load ? 3 : 2), rank + (load ? 3 : 2));
      if (!ty(a(1)).ptr && ir::bit_width(dt(a(1))) != 64) fail(fmt::format("{}: the tensor map must be a pointer or a 64-bit address", what));
      std::string coords, ins = load ? fmt::format("\"r\"({}), \"l\"({})", u32(a(0)), n(a(1))) : fmt::format("\"l\"({}), \"r\"({})", n(a(1)), u32(a(0)));
      for (size_t i = 0; i < rank; ++i) {
        coords += fmt::format("{}%{}", i ? ", " : "", i + 2);
        ins += fmt::format(", \"r\"({})", u32(a(2 + i)));
      }
      if (!load) {
        line(fmt::format("asm volatile(\"{}.{}d.global.shared::cta.{}tile.bulk_group [%0, {{{}}}], [%1];\"\n{}    :: {} : \"memory\");",
                         in.op == Op::tma_store ? "cp.async.bulk.tensor" : "cp.reduce.async.bulk.tensor", rank,
                         in.op == Op::tma_store ? "" : "add.", coords, indent(), ins));
        return;
      }
      ins += fmt::format(", \"r\"({})", u32(a(2 + rank)));
      line(fmt::format("asm volatile(\"cp.async.bulk.tensor.{}d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{{}}}], "
                       "[%{}];\"\n{}    :: {} : \"memory\");",
                       rank, coords, rank + 2, indent(), ins));
      return;
    }
    case Op::bulk_commit: line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");"); return;
    case Op::bulk_wait:
      line(fmt::format("asm volatile(\"cp.async.bulk.wait_group{} {};\" ::: \"memory\");", in.imm & pir::kBulkWaitRead ? ".read" : "",
                       in.imm & 0xFF));
      return;
    case Op::fence_proxy_async_global: line("asm volatile(\"fence.proxy.async.global;\" ::: \"memory\");"); return;
    case Op::fence_proxy_async: line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");"); return;
    case Op::wgmma_fence: line("asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");"); return;
    case Op::wgmma_commit:
      // fenced (pir::kCommitFenced) as the LLVM backend does: no code hoisted into the group
      // (an asm without operands: nvrtc keeps "%%" as is there, so the fence's %smid is written "%")
      line(fmt::format("asm volatile(\"{}\" ::: \"memory\");", in.imm & pir::kCommitFenced
                                                                   ? without_operands(ptxas_fence_after("wgmma.commit_group.sync.aligned;", "TJ_WGCOMMIT"))
                                                                   : std::string("wgmma.commit_group.sync.aligned;")));
      return;
    default: break;
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

}  // namespace tilejit::jit::cuda_backend
