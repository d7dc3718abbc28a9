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
      for (int d = 0; d + 1 < t->rank(); ++d)
        if ((t->strides()[static_cast<size_t>(d)] * ir::byte_size(t->dtype())) % align != 0)
          bad(i, fmt::format("stride {} of dim {} ({} bytes) is not a multiple of {} bytes, the row alignment the parameter "
                             "requires", t->strides()[static_cast<size_t>(d)], d,
                             t->strides()[static_cast<size_t>(d)] * ir::byte_size(t->dtype()), align));
      for (int64_t s : t->sizes()) {
        if (s > INT32_MAX) bad(i, fmt::format("size {} exceeds the i32 range of tensor sizes", s));
        auto v = static_cast<int32_t>(s);
        push(&v, 4);
      }
      for (int64_t s : t->strides()) push(&s, 8);
    }
  }
  // TMA descriptors (trailing parameters), encoded from the tensor arguments.
  if (!compiled_.tensor_maps.empty()) {
    std::vector<uint8_t> maps(128 * compiled_.tensor_maps.size());
    for (size_t m = 0; m < compiled_.tensor_maps.size(); ++m) {
      const jit::pir::TensorMapSpec& spec = compiled_.tensor_maps[m];
      auto pi = static_cast<size_t>(spec.param_index);
      const DeviceTensor* t = args[pi].tensor();
      int es = ir::byte_size(t->dtype());
      auto need = [&](bool ok, const std::string& what) {
        if (!ok)
          bad(pi, fmt::format("this kernel was compiled with the TMA pipeline, which needs {}; got {} (compile with "
                              "CompileOptions::pipeline.enabled = false for arbitrary layouts)",
                              what, t->describe()));
      };
      need(t->rank() == 2 && t->strides()[1] == 1, "a rank-2 tensor with unit innermost stride");
      need((t->strides()[0] * es) % 16 == 0, "a row pitch that is a multiple of 16 bytes");
      need(t->ptr() % 16 == 0, "a 16-byte aligned base address");
      CUtensorMapDataType dt = t->dtype() == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      cuuint64_t dims[2] = {static_cast<cuuint64_t>(t->sizes()[1]), static_cast<cuuint64_t>(t->sizes()[0])};
      cuuint64_t strides[1] = {static_cast<cuuint64_t>(t->strides()[0] * es)};
      cuuint32_t box[2] = {static_cast<cuuint32_t>(spec.box[0]), static_cast<cuuint32_t>(spec.box[1])};
      cuuint32_t unit[2] = {1, 1};
      CUtensorMap map;
      check_cu_kernel(Driver::get().api().TensorMapEncodeTiled(&map, dt, 2, reinterpret_cast<void*>(t->ptr()), dims, strides, box,
                                                              unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                      "cuTensorMapEncodeTiled", name_);
      std::memcpy(maps.data() + 128 * m, &map, 128);
    }
    if (maps != uploaded_maps_) {
      if (tensor_maps_.bytes() < maps.size()) tensor_maps_ = DeviceBuffer(maps.size(), device_);
      tensor_maps_.upload(maps.data(), maps.size());
      uploaded_maps_ = maps;
    }
    for (size_t m = 0; m < compiled_.tensor_maps.size(); ++m) {
      CUdeviceptr p = tensor_maps_.ptr() + 128 * m;
      push(&p, 8);
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
