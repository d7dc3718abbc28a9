// Argument checking, ABI flattening (tensor -> ptr, sizes as i32, strides as i64) and launch.
#include "runtime/gpu_kernel.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace tilejit::runtime {

using ir::DType;

GpuKernel::GpuKernel(const ir::Function& signature, jit::CompiledKernel compiled, int device)
    : params_(signature.params), name_(signature.name), compiled_(std::move(compiled)), device_(device) {
  Driver::get().require(fmt::format("running kernel '{}'", name_).c_str());
  if (compiled_.cubin.empty()) module_ = Module::from_ptx(compiled_.ptx, name_ + ".ptx", device);
  else module_ = Module::from_cubin(compiled_.cubin.data(), compiled_.cubin.size(), name_ + ".cubin", device);
  function_ = module_.function(name_);
}

void GpuKernel::operator()(Grid grid, const std::vector<DeviceArg>& args, CUstream stream) const {
  auto bad = [&](size_t i, const std::string& msg) {
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}', argument {} '{}': {}", name_, i, params_[i].name, msg));
  };
  if (args.size() != params_.size()) {
    std::vector<std::string> names;
    for (const auto& p : params_) names.push_back(p.name);
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}' takes {} arguments ({}), got {}", name_, params_.size(),
                                            fmt::join(names, ", "), args.size()));
  }
  for (int64_t g : {grid.x, grid.y, grid.z})
    if (g < 1 || g > INT32_MAX) throw std::invalid_argument(fmt::format("tilejit: kernel '{}': grid dimension {} (valid: 1..2^31-1)", name_, g));

  // 8-byte slots: the driver reads each parameter's size from its slot.
  std::vector<uint64_t> slots;
  slots.reserve(64);
  auto push = [&](const void* p, size_t n) {
    uint64_t s = 0;
    std::memcpy(&s, p, n);
    slots.push_back(s);
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const ir::Param& p = params_[i];
    const DeviceArg& a = args[i];
    if (p.kind == ir::ParamKind::Scalar) {
      if (a.tensor()) bad(i, fmt::format("expected a number of type {}, got the tensor {}", ir::name(p.type.dtype), a.tensor()->describe()));
      const Arg& n = a.number();
      DType d = p.type.dtype;
      if (ir::is_float(d)) {
        double v = n.kind() == Arg::Kind::Float ? n.as_double() : n.kind() == Arg::Kind::Int ? static_cast<double>(n.as_int()) : static_cast<double>(n.as_uint());
        if (d == DType::f32) { float f = static_cast<float>(v); push(&f, 4); }
        else if (d == DType::f64) push(&v, 8);
        else bad(i, fmt::format("{} scalars are not supported by the GPU launcher yet", ir::name(d)));
      } else {
        if (n.kind() == Arg::Kind::Float) bad(i, fmt::format("expected an integer of type {}, got {}", ir::name(d), n.describe()));
        int64_t v = n.kind() == Arg::Kind::UInt ? static_cast<int64_t>(n.as_uint()) : n.kind() == Arg::Kind::Bool ? (n.as_bool() ? 1 : 0) : n.as_int();
        if (ir::bit_width(d) < 64 && ir::wrap_int(d, v) != v)
          bad(i, fmt::format("the value {} does not fit in {}", v, ir::name(d)));
        push(&v, static_cast<size_t>(ir::byte_size(d)));
      }
      continue;
    }
    const DeviceTensor* t = a.tensor();
    if (!t) bad(i, fmt::format("expected a device tensor of {}, got {}", ir::name(p.type.dtype), a.number().describe()));
    if (t->dtype() != p.type.dtype) bad(i, fmt::format("the tensor holds {} but the parameter is {}", ir::name(t->dtype()), ir::to_string(p.type)));
    CUdeviceptr base = t->ptr();
    int align = std::max(p.spec.align_bytes, ir::byte_size(p.type.dtype));
    if (base % static_cast<CUdeviceptr>(align) != 0) bad(i, fmt::format("address {:#x} is not aligned to {} bytes", base, align));
    push(&base, 8);
    if (p.kind == ir::ParamKind::Tensor) {
      if (t->rank() != p.type.rank) bad(i, fmt::format("expected a rank-{} tensor, got {}", p.type.rank, t->describe()));
      if (p.spec.contiguous_last && t->strides().back() != 1)
        bad(i, fmt::format("the innermost stride must be 1 (declared contiguous), got {}", t->strides().back()));
      for (int64_t s : t->sizes()) {
        if (s > INT32_MAX) bad(i, fmt::format("size {} exceeds the i32 range of tensor sizes", s));
        auto v = static_cast<int32_t>(s);
        push(&v, 4);
      }
      for (int64_t s : t->strides()) push(&s, 8);
    }
  }
  std::vector<void*> ptrs;
  for (uint64_t& s : slots) ptrs.push_back(&s);
  LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y), static_cast<unsigned>(grid.z)};
  cfg.block = {static_cast<unsigned>(compiled_.num_threads), 1, 1};
  cfg.dynamic_smem_bytes = static_cast<unsigned>(compiled_.smem_bytes);
  cfg.stream = stream;
  cfg.device = device_;
  launch(function_, cfg, ptrs.data(), name_);
}

}  // namespace tilejit::runtime
