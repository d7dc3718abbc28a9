#include "tools/fuzz/evaluate.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "dsl/builder.hpp"
#include "jit/layout.hpp"
#include "jit/ptx_compiler.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/specialization.hpp"
#include "runtime/driver.hpp"
#include "runtime/emulator.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"
#include "tools/fuzz/emitter.hpp"

namespace tilejit::fuzz {

using runtime::HostTensor;

std::string_view to_string(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::GeneratorError: return "generator-error";
    case Status::Refused: return "refused";
    case Status::Mismatch: return "mismatch";
    case Status::Fault: return "fault";
    case Status::Crash: return "crash";
    case Status::Hang: return "hang";
    case Status::NotEmulated: return "not-emulated";
  }
  return "?";
}

bool parse_status(std::string_view s, Status& out) {
  for (Status x : {Status::Ok, Status::GeneratorError, Status::Refused, Status::Mismatch, Status::Fault, Status::Crash,
                   Status::Hang, Status::NotEmulated})
    if (to_string(x) == s) {
      out = x;
      return true;
    }
  return false;
}

std::string Outcome::signature() const {
  // The message up to its first digit: the kind of error without the values that vary.
  std::string kind;
  for (char c : detail.substr(0, 80)) {
    if (c >= '0' && c <= '9') break;
    kind += c;
  }
  if (status == Status::Mismatch) {  // "T3 i16[2,32,64]: ..." -> the output's dtype
    size_t sp = detail.find(' '), br = detail.find('[');
    kind = sp < br && br != std::string::npos ? detail.substr(sp + 1, br - sp - 1) : "";
  }
  return fmt::format("{} {} {}", to_string(status), backend, kind);
}

namespace {

// Fills a tensor as its spec says (reproducible from the spec's seed).
void fill(HostTensor& t, const TensorSpec& s) {
  std::mt19937_64 g(s.seed);
  auto unit = [&] { return static_cast<double>(g() >> 11) * 0x1p-53; };
  const DType d = s.dtype;
  const int64_t n = t.numel();
  if (s.fill == Fill::Bits) {
    auto* p = static_cast<unsigned char*>(t.data());
    for (size_t i = 0; i < t.bytes(); ++i) p[i] = static_cast<unsigned char>(g());
    if (d == DType::i1)
      for (size_t i = 0; i < t.bytes(); ++i) p[i] &= 1;
    return;
  }
  const bool uns = ir::is_int(d) && !ir::is_signed(d);
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    switch (s.fill) {
      case Fill::SmallInts: v = static_cast<double>(static_cast<int64_t>(g() % 7) - (uns ? 0 : 3)); break;
      case Fill::Normal:
        if (ir::is_float(d)) {
          double u1 = std::max(unit(), 1e-300), u2 = unit();
          v = s.scale * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
        } else {
          v = static_cast<double>(static_cast<int64_t>(g() % 2001) - (uns ? 0 : 1000));
        }
        break;
      default: {  // Specials
        static const double floats[] = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 65504.0, -65504.0, 0x1p-24, -0x1p-20, 0x1p-130,
                                        0x1p-149, -0x1p-140, 3.0e38, -3.0e38, 1e-30, 7.0, 0.1};
        if (ir::is_float(d)) {
          uint64_t r = g() % 24;
          if (r < 18) v = floats[r];
          else if (r == 18) v = std::numeric_limits<double>::infinity();
          else if (r == 19) v = -std::numeric_limits<double>::infinity();
          else if (r == 20) v = std::numeric_limits<double>::quiet_NaN();
          else v = (unit() - 0.5) * 1e6;
        } else {
          static const int64_t ints[] = {0, 1, -1, 2, 127, 128, 255, 256, 32767, 32768, 65535, 65536, 2147483647, -2147483648LL};
          v = static_cast<double>(ints[g() % 14]);
          if (!ir::is_signed(d) && v < 0) v = 0;
          v = static_cast<double>(ir::wrap_int(d, static_cast<int64_t>(v)));
        }
      }
    }
    if (!ir::is_float(d)) v = static_cast<double>(ir::wrap_int(d, static_cast<int64_t>(v)));
    t.set_flat(i, v);
  }
}

// The scalar parameters' values as launch arguments.
std::vector<runtime::DeviceArg> scalar_args(const Program& p) {
  std::vector<runtime::DeviceArg> args;
  for (const ScalarParam& s : p.scalars) {
    switch (s.dtype) {
      case DType::f32: args.emplace_back(static_cast<float>(s.fvalue)); break;
      case DType::f64: args.emplace_back(s.fvalue); break;
      case DType::i32: args.emplace_back(static_cast<int32_t>(s.ivalue)); break;
      case DType::u32: args.emplace_back(static_cast<uint32_t>(s.ivalue)); break;
      case DType::u64: args.emplace_back(static_cast<uint64_t>(s.ivalue)); break;
      default: args.emplace_back(s.ivalue); break;
    }
  }
  return args;
}

std::vector<HostTensor> make_tensors(const Program& p) {
  std::vector<HostTensor> ts;
  for (const TensorSpec& s : p.tensors) {
    HostTensor t(s.dtype, s.shape);  // poisoned (0xFF)
    if (!s.output || s.accumulator) fill(t, s);
    ts.push_back(std::move(t));
  }
  return ts;
}

// Whether every value written into tensor t is promised bit for bit.
bool exact_output(const Program& p, size_t t) {
  for (const Node& n : p.nodes)
    if (!n.removed && n.tensor == static_cast<int>(t) &&
        (n.kind == NodeKind::Store || n.kind == NodeKind::AtomicAdd || n.kind == NodeKind::AtomicBlock) && !n.exact)
      return false;
  return true;
}

double max_finite(DType d) {
  switch (d) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f32: return 3.4028234663852886e38;
    default: return std::numeric_limits<double>::max();
  }
}

// "" when equal (bit for bit where promised, else within the stated tolerance), else the first few
// differing elements.
std::string compare(const HostTensor& got, const HostTensor& ref, bool exact) {
  const DType d = ref.dtype();
  const size_t es = static_cast<size_t>(ir::byte_size(d));
  const auto* g = static_cast<const unsigned char*>(got.data());
  const auto* r = static_cast<const unsigned char*>(ref.data());
  std::vector<double> gv, rv;
  double scale = 0;
  if (ir::is_float(d)) {
    gv = got.to_f64();
    rv = ref.to_f64();
    int64_t finite = 0;
    for (double x : rv)
      if (std::isfinite(x)) {
        scale += std::fabs(x);
        ++finite;
      }
    scale = finite ? scale / static_cast<double>(finite) : 0;
  }
  const double tol = 0x1p-6;
  std::string out;
  int64_t bad = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    bool same = std::memcmp(g + static_cast<size_t>(i) * es, r + static_cast<size_t>(i) * es, es) == 0;
    if (!same && ir::is_float(d)) {
      double a = gv[static_cast<size_t>(i)], b = rv[static_cast<size_t>(i)];
      if (std::isnan(a) && std::isnan(b)) same = true;  // NaN payloads are not promised
      else if (!exact) {
        if (std::isinf(a) || std::isinf(b)) same = (a == b) || std::fabs(std::isinf(a) ? b : a) >= 0.5 * max_finite(d);
        // approximate instructions flush subnormal results (README): below f32's smallest normal
        // number values count as zero, for f64 outputs too (the GPU has no f64 transcendentals:
        // an approximate f64 value was computed in f32 and cast, e.g. erf of 1e-44, seed 637376)
        else same = std::fabs(a - b) <= tol * (std::fabs(b) + scale) + 0x1p-126;
      }
    }
    if (same) continue;
    if (++bad <= 4) {
      uint64_t gb = 0, rb = 0;
      std::memcpy(&gb, g + static_cast<size_t>(i) * es, es);
      std::memcpy(&rb, r + static_cast<size_t>(i) * es, es);
      out += fmt::format(" [{}] got 0x{:x} ({}) interpreter 0x{:x} ({});", i, gb, got.get_flat(i), rb, ref.get_flat(i));
    }
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} elements differ ({}):{}", bad, ref.numel(), exact ? "bit-exact promised" : "tolerance 2^-6", out);
}

// The first output tensor whose values (got(t), t an output's index) differ from the interpreter's
// ("T3 i16[2,32,64]: ..."), or "" when every output agrees.
std::string output_mismatch(const Program& p, const std::vector<HostTensor>& ref, const std::function<HostTensor(size_t)>& got) {
  for (size_t t = 0; t < ref.size(); ++t) {
    if (!p.tensors[t].output) continue;
    const std::string diff = compare(got(t), ref[t], exact_output(p, t));
    if (!diff.empty()) return fmt::format("T{} {}: {}", t, ref[t].describe(), diff);
  }
  return "";
}

bool has_op(const jit::pir::Block& b, jit::pir::Op op) {
  for (const jit::pir::Inst& in : b.insts) {
    if (in.op == op) return true;
    for (const jit::pir::Block& r : in.regions)
      if (has_op(r, op)) return true;
  }
  return false;
}

}  // namespace

CompiledText compiled_text(Program& p, jit::Backend b) {
  try {
    jit::CompileOptions co;
    co.backend = b;
    co.num_warps = p.num_warps;
    co.make_cubin = false;
    jit::CompiledKernel k = jit::compile(build(p), co);
    return {std::move(k.backend_source), std::move(k.ptx)};
  } catch (const std::exception& e) {
    const std::string why = fmt::format("// not compiled: {}\n", e.what());
    return {why, why};
  }
}

Outcome evaluate(Program& p, const EvalOptions& o, const std::function<void(const std::string&)>& progress) {
  auto phase = [&](const std::string& s) {
    if (progress) progress(s);
  };
  Outcome out;
  phase("build");
  ir::Function fn;
  try {
    fn = build(p);
  } catch (const std::exception& e) {
    out.status = Status::GeneratorError;
    out.detail = fmt::format("build: {}", e.what());
    return out;
  }
  phase("interpret");
  std::vector<HostTensor> ref = make_tensors(p);
  std::vector<runtime::Arg> iargs;
  for (auto& t : ref) iargs.emplace_back(t);
  for (const ScalarParam& s : p.scalars) {
    if (ir::is_float(s.dtype)) iargs.emplace_back(s.fvalue);
    else if (ir::is_signed(s.dtype)) iargs.emplace_back(s.ivalue);
    else iargs.emplace_back(static_cast<uint64_t>(s.ivalue));
  }
  try {
    runtime::interpret(fn, {p.programs}, iargs);
  } catch (const std::exception& e) {
    out.status = Status::GeneratorError;
    out.detail = fmt::format("interpreter: {}", e.what());
    return out;
  }
  if (o.specialize) {
    // the arguments' facts as the GPU path's will hold them: contiguous row-major tensors at
    // cudaMalloc-aligned addresses, the scalars' values
    std::vector<runtime::DeviceArg> fake;
    for (const HostTensor& t : ref) fake.emplace_back(runtime::TensorView{t.dtype(), t.sizes(), t.strides(), uint64_t{1} << 20, 0});
    for (const runtime::DeviceArg& a : scalar_args(p)) fake.push_back(a);
    fn = runtime::specialize(fn, runtime::specialization_key(fn, fake));
  }
  if (o.emulate) {
    out.backend = "emulator";
    phase("lower");
    jit::CompileOptions co;
    co.num_warps = p.num_warps;
    jit::pir::Func program;
    try {
      program = jit::lower(fn, co);
    } catch (const std::exception& e) {
      out.status = Status::Refused;
      out.detail = e.what();
      return out;
    }
    out.tma_store = p.tma_stores && has_op(program.body, jit::pir::Op::tma_store);
    phase("emulate");
    std::vector<HostTensor> emu = make_tensors(p);
    std::vector<runtime::Arg> eargs;
    for (auto& t : emu) eargs.emplace_back(t);
    for (size_t s = ref.size(); s < iargs.size(); ++s) eargs.push_back(iargs[s]);
    try {
      runtime::EmulatorSchedule schedule;
      if (o.emulate_races) schedule = {true, p.seed + 1};
      runtime::emulate(program, fn, {p.programs}, eargs, schedule);
    } catch (const runtime::EmulatorUnsupported& e) {
      out.status = Status::NotEmulated;
      out.detail = e.what();
      return out;
    } catch (const runtime::EmulatorFault& e) {
      out.status = Status::Fault;
      out.detail = e.what();
      return out;
    }
    phase("compare emulator");
    out.detail = output_mismatch(p, ref, [&](size_t t) { return emu[t]; });
    if (!out.detail.empty()) {
      out.status = Status::Mismatch;
      return out;
    }
  }
  if (p.tma_stores && !o.emulate && o.compile_backends) {  // (a program the lowering refuses: the backends say why)
    phase("lower");
    try {
      jit::CompileOptions co;
      co.num_warps = p.num_warps;
      out.tma_store = has_op(jit::lower(fn, co).body, jit::pir::Op::tma_store);
    } catch (const std::exception&) {
    }
  }
  for (jit::Backend b : o.backends) {
    if (!o.compile_backends) break;
    out.backend = std::string(jit::to_string(b));
    phase("compile " + out.backend);
    jit::CompileOptions co;
    co.backend = b;
    co.num_warps = p.num_warps;
    co.make_cubin = o.gpu || (o.assemble && !jit::find_ptxas().empty());
    co.packed_loop_pairs = o.packed_loop_pairs;
    if (!o.gpu) co.ptx_tool = jit::PtxTool::Ptxas;
    jit::CompiledKernel ck;
    try {
      ck = jit::compile(fn, co);
    } catch (const std::exception& e) {
      out.status = Status::Refused;
      out.detail = e.what();
      return out;
    }
    if (!o.gpu) continue;
    phase("run " + out.backend);
    try {
      runtime::GpuKernel k(fn, std::move(ck));
      std::vector<HostTensor> init = make_tensors(p);
      std::vector<runtime::DeviceTensor> dev;
      for (auto& t : init) dev.push_back(runtime::DeviceTensor::from_host(t));
      std::vector<runtime::DeviceArg> dargs;
      for (auto& t : dev) dargs.emplace_back(t);
      for (const runtime::DeviceArg& a : scalar_args(p)) dargs.push_back(a);
      k(runtime::Grid{p.programs}, dargs);
      phase("compare " + out.backend);
      out.detail = output_mismatch(p, ref, [&](size_t t) { return dev[t].to_host(); });
      if (!out.detail.empty()) {
        out.status = Status::Mismatch;
        return out;
      }
    } catch (const runtime::DeviceError& e) {
      out.status = Status::Fault;
      out.detail = e.what();
      return out;
    } catch (const std::exception& e) {
      out.status = Status::Refused;
      out.detail = fmt::format("launch: {}", e.what());
      return out;
    }
  }
  out.backend.clear();
  return out;
}

}  // namespace tilejit::fuzz
