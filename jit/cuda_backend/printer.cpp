// Per-thread IR -> CUDA C++ -> PTX (nvrtc). Every op is written so that its value is exactly the
// one the LLVM backend computes: guarded integer division and shifts, NaN-propagating min/max,
// saturating float->int casts, f16/bf16 arithmetic in f32 rounded once, the same approximate PTX
// instructions for transcendentals, and inline PTX for predicated accesses and mma.sync.
// The printer (printer.hpp) is defined by concern: this file holds the entry points, the kernel's
// frame and the dispatch of instructions; the other files of jit/cuda_backend/ the prelude,
// arithmetic, memory, synchronisation, tensor cores and control flow.
#include "jit/cuda_backend.hpp"
#include "jit/cuda_backend/printer.hpp"
#include "jit/timing.hpp"

#include <fmt/format.h>

#include <chrono>

#include "jit/nvrtc.hpp"

namespace tilejit::jit {
namespace cuda_backend {

std::string Printer::run() {
  if (f_.name.empty() || !is_ident_char(f_.name[0], true))
    fail("the kernel name must be a C identifier (letters, digits, '_', not starting with a digit)");
  for (char c : f_.name)
    if (!is_ident_char(c, false)) fail("the kernel name must be a C identifier (letters, digits, '_', not starting with a digit)");
  if (f_.num_threads <= 0) fail(fmt::format("num_threads is {}; it must be positive", f_.num_threads));
  defined_.assign(f_.types.size(), 0);
  const_bits_.assign(f_.types.size(), std::nullopt);

  std::string out = prelude();
  std::vector<std::string> params;
  for (size_t i = 0; i < f_.params.size(); ++i) {
    const pir::Param& p = f_.params[i];
    if (p.byval_bytes) {  // a TMA tensor map by value, read in place (its address: arith_inst's param)
      if (p.byval_bytes != pir::kTensorMapBytes) fail(fmt::format("a by-value parameter of {} bytes (only 128: a tensor map)", p.byval_bytes));
      params.push_back(fmt::format("const __grid_constant__ tilejit_tensor_map {}", param_name(i)));
      continue;
    }
    params.push_back(p.ty.ptr ? fmt::format("{}* __restrict__ {}", storage_ctype(p.ty.dtype), param_name(i))
                              : fmt::format("{} {}", scalar_ctype(p.ty.dtype), param_name(i)));
  }
  out += fmt::format("// {} threads, {} bytes of dynamic shared memory\n", f_.num_threads, f_.smem_bytes);
  const std::string bounds = f_.min_programs_per_sm > 0 ? fmt::format("{}, {}", f_.num_threads, f_.min_programs_per_sm)
                                                        : fmt::format("{}", f_.num_threads);
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n", bounds, f_.name, fmt::join(params, ", "));
  // Constants first: their values do not depend on where they stand, and lowering may reuse a
  // constant outside the region that first defined it (LLVM constants are not instructions).
  hoist_constants(f_.body);
  block(f_.body);
  out += body_;
  out += "}\n";
  return out;
}

void Printer::hoist_constants(const pir::Block& b) {
  for (const pir::Inst& in : b.insts) {
    if (in.op == Op::constant) {
      check_results(in, 1);
      V r = in.results[0];
      if (!ty(r).ptr && ir::is_int(dt(r))) {
        const int w = ir::bit_width(dt(r));
        const_bits_[r] = static_cast<uint64_t>(in.imm) & (w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1);
      }
      line(fmt::format("const {} v{} = {};", ctype(ty(r)), r, constant(in, ty(r))));
      mark(r);
    }
    for (const pir::Block& region : in.regions) hoist_constants(region);
  }
}

void Printer::block(const pir::Block& b) {
  for (const pir::Inst& in : b.insts) inst(in);
}

void Printer::inst(const pir::Inst& in) {
  switch (in.op) {
    case Op::constant: return;  // hoisted
    case Op::param: case Op::thread_id: case Op::block_id: case Op::grid_dim:
    case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::rem: case Op::minimum: case Op::maximum:
    case Op::bit_and: case Op::bit_or: case Op::bit_xor: case Op::shl: case Op::shr: case Op::umulhi:
    case Op::neg: case Op::bit_not: case Op::abs: case Op::popc: case Op::exp2: case Op::log2: case Op::exp: case Op::log: case Op::sqrt: case Op::rcp:
    case Op::rsqrt: case Op::floor: case Op::ceil: case Op::tanh: case Op::sin: case Op::cos: case Op::erf:
    case Op::cmp: case Op::select: case Op::byte_perm: case Op::fma: case Op::cast: case Op::bitcast: case Op::pack2: case Op::unpack2:
      return arith_inst(in);
    case Op::load: return load(in);
    case Op::store: return store(in);
    case Op::atomic_add: return atomic_add(in);
    case Op::atomic_rmw:
    case Op::atomic_cas: return atomic_rmw(in);
    case Op::load_vec: case Op::store_vec: case Op::gep: case Op::load_shared: case Op::store_shared: case Op::smem_addr:
      return memory_inst(in);
    case Op::opaque: return opaque(in);
    case Op::keep_alive: return keep_alive(in);
    case Op::barrier: case Op::named_barrier_sync: case Op::named_barrier_arrive: case Op::shfl_xor: case Op::ballot: case Op::mbar_init:
    case Op::mbar_expect_tx: case Op::mbar_arrive: case Op::mbar_wait: case Op::mbar_inval: case Op::sem_wait: case Op::sem_signal:
    case Op::atom_shared: case Op::set_max_registers: case Op::exit_thread: case Op::fence_mbar_init: case Op::read_clock:
      return sync_inst(in);
    case Op::mma_16816: case Op::mma_1688_tf32: return mma(in);
    case Op::cvt_tf32: return cvt_tf32(in);
    case Op::wgmma_wait: case Op::wgmma: case Op::wgmma_rs: return wgmma(in);
    case Op::tma_load_2d: case Op::tma_load: case Op::tma_reduce_add: case Op::tma_store: case Op::bulk_commit: case Op::bulk_wait:
    case Op::fence_proxy_async_global: case Op::fence_proxy_async: case Op::wgmma_fence: case Op::wgmma_commit:
      return tensor_inst(in);
    case Op::for_: return for_loop(in);
    case Op::if_: return if_op(in);
    case Op::yield: fail("yield outside a for or if region");
  }
  fail(fmt::format("unhandled op {}", pir::op_name(in.op)));
}

}  // namespace cuda_backend

std::string print_cuda(const pir::Func& f) { return cuda_backend::Printer(f).run(); }

CudaOutput emit_ptx_nvrtc(const pir::Func& f, const std::string& arch) {
  CudaOutput out;
  auto t0 = std::chrono::steady_clock::now();
  out.source = print_cuda(f);
  out.source_ms = ms_since(t0);
  NvrtcResult r = nvrtc_compile(out.source, f.name, arch, {"--fmad=false"});
  out.ptx = std::move(r.ptx);
  out.nvrtc_ms = r.milliseconds;
  return out;
}

}  // namespace tilejit::jit
