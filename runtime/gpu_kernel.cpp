// Argument checking and ABI packing planned once per signature (LaunchPlan), launches without
// allocation (GpuKernel), and the TMA descriptors kept in device memory per tensor layout.
#include "runtime/gpu_kernel.hpp"

#include "runtime/argument_aliasing.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

namespace tilejit::runtime {

using ir::DType;

namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kGridYZMax = 65535;

bool row_major(std::span<const int64_t> sizes, std::span<const int64_t> strides) {
  int64_t expect = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

std::string list(std::span<const int64_t> v) { return fmt::format("[{}]", fmt::join(v, ",")); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Arguments

std::string TensorView::describe() const {
  std::string s = fmt::format("{}{}", ir::name(dtype), list(sizes));
  if (strides.size() != sizes.size() || !row_major(sizes, strides)) s += fmt::format(" strides {}", list(strides));
  return s + fmt::format(" at {:#x} on device {}", address, device);
}

TensorView view(const DeviceTensor& t) {
  return TensorView{t.dtype(), t.sizes(), t.strides(), static_cast<uint64_t>(t.ptr()), t.buffer().device()};
}

std::string DeviceArg::describe() const {
  switch (kind_) {
    case Kind::Tensor: return "the tensor " + view_.describe();
    case Kind::Int: return fmt::format("the integer {}", i_);
    case Kind::UInt: return fmt::format("the integer {}", u_);
    case Kind::Float: return fmt::format("the float {}", f_);
    case Kind::Bool: return fmt::format("the bool {}", u_ != 0);
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// LaunchPlan

LaunchPlan::LaunchPlan(const ir::Function& signature, int device)
    : name_(signature.name), params_(signature.params), relations_(signature.size_relations), device_(device) {
  int slot = 0;
  plan_.reserve(params_.size());
  for (const ir::Param& ip : params_) {
    Param p;
    p.kind = ip.kind;
    p.dtype = ip.type.dtype;
    p.slot = slot;
    p.elem_bytes = ir::byte_size(p.dtype);
    if (ip.kind == ir::ParamKind::Scalar) {
      const DType d = p.dtype;
      const int w = ir::bit_width(d);
      if (d == DType::i1) p.scalar = Scalar::Bool;
      else if (d == DType::f32) p.scalar = Scalar::F32;
      else if (d == DType::f64) p.scalar = Scalar::F64;
      else if (ir::is_float(d)) p.scalar = Scalar::Unsupported;
      else if (ir::is_signed(d)) {
        p.scalar = Scalar::Signed;
        const int64_t hi = w == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (w - 1)) - 1;
        p.lo = -hi - 1;
        p.hi = static_cast<uint64_t>(hi);
      } else {
        p.scalar = Scalar::Unsigned;
        p.hi = w == 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << w) - 1;
      }
      if (ir::is_int(d) && d != DType::i1 && ip.spec.divisible_by > 1) p.divisible_by = static_cast<uint64_t>(ip.spec.divisible_by);
      slot += 1;
    } else {
      p.align = static_cast<uint64_t>(std::max<int64_t>(ip.spec.align_bytes, p.elem_bytes));
      p.contiguous_last = ip.spec.contiguous_last;
      p.rank = ip.kind == ir::ParamKind::Tensor ? ip.type.rank : 0;
      slot += 1 + 2 * p.rank;
    }
    plan_.push_back(p);
  }
  // Tensors a window store writes (through slices too): two elements at one address would race.
  std::map<ir::ValueId, size_t> param_of;
  for (size_t i = 0; i < params_.size(); ++i) param_of[params_[i].value] = i;
  ir::walk(signature.body, [&](const ir::Op& op) {
    if (op.kind == ir::OpKind::tensor_slice && param_of.count(op.operands[0])) param_of[op.results[0]] = param_of[op.operands[0]];
    const bool adds = op.has_attr("reduce");
    if (op.kind == ir::OpKind::block_store && !adds && param_of.count(op.operands[0])) plan_[param_of[op.operands[0]]].stored = true;
  });
  const std::vector<bool> written = written_params(signature);
  for (size_t i = 0; i < plan_.size(); ++i) {
    plan_[i].written = written[i] && plan_[i].kind != ir::ParamKind::Scalar;
    any_written_ = any_written_ || plan_[i].written;
  }
  num_slots_ = slot;
  if (num_slots_ > kMaxSlots)
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}' has {} ABI parameters, more than the {} the launcher supports",
                                            name_, num_slots_, kMaxSlots));
}

void LaunchPlan::require_tma(const std::vector<jit::pir::TensorMapSpec>& specs) {
  for (const jit::pir::TensorMapSpec& s : specs) {
    if (s.param_index < 0 || static_cast<size_t>(s.param_index) >= plan_.size() ||
        plan_[static_cast<size_t>(s.param_index)].rank < 2 || plan_[static_cast<size_t>(s.param_index)].rank > 5 ||
        s.box.size() != static_cast<size_t>(plan_[static_cast<size_t>(s.param_index)].rank))
      throw std::logic_error(fmt::format("tilejit: kernel '{}': a TMA descriptor refers to parameter {}, which is not a "
                                         "tensor of rank 2 to 5 matching its box in the signature",
                                         name_, s.param_index));
    plan_[static_cast<size_t>(s.param_index)].tma = true;
  }
}

void LaunchPlan::check_abi(const jit::CompiledKernel& k) const {
  auto fail = [&](const std::string& what) {
    throw std::logic_error(fmt::format("tilejit: kernel '{}': the compiled kernel's ABI does not match the signature it is "
                                       "launched with ({}); was it compiled from another signature?",
                                       name_, what));
  };
  if (k.name != name_) fail(fmt::format("compiled as '{}'", k.name));
  const size_t expect = static_cast<size_t>(num_slots_) + k.tensor_maps.size();
  if (k.abi.size() != expect) fail(fmt::format("{} ABI parameters, expected {}", k.abi.size(), expect));
  auto slot_is = [&](int s, jit::pir::Ty ty) {
    if (!(k.abi[static_cast<size_t>(s)].ty == ty)) fail(fmt::format("ABI parameter {} '{}'", s, k.abi[static_cast<size_t>(s)].name));
  };
  for (const Param& p : plan_) {
    if (p.kind == ir::ParamKind::Scalar) {
      slot_is(p.slot, jit::pir::scalar(p.dtype));
      continue;
    }
    slot_is(p.slot, jit::pir::pointer(p.dtype));
    for (int d = 0; d < p.rank; ++d) {
      slot_is(p.slot + 1 + d, jit::pir::scalar(DType::i32));
      slot_is(p.slot + 1 + p.rank + d, jit::pir::scalar(DType::i64));
    }
  }
  for (size_t m = 0; m < k.tensor_maps.size(); ++m)
    if (k.tensor_maps[m].abi_slot != num_slots_ + static_cast<int>(m)) fail(fmt::format("tensor map {} is not a trailing parameter", m));
}

std::string abi_mismatch(const ir::Function& signature, const jit::CompiledKernel& k) {
  try {
    LaunchPlan plan(signature);
    plan.require_tma(k.tensor_maps);
    plan.check_abi(k);
    return {};
  } catch (const std::logic_error& e) {
    return e.what();
  }
}

void LaunchPlan::bad(size_t i, const std::string& msg) const {
  throw std::invalid_argument(fmt::format("tilejit: kernel '{}', argument {} '{}': {}", name_, i, params_[i].name, msg));
}

void LaunchPlan::bad_count(size_t got) const {
  std::vector<std::string> names;
  for (const auto& p : params_) names.push_back(p.name);
  throw std::invalid_argument(fmt::format("tilejit: kernel '{}' takes {} argument{} ({}), got {}", name_, params_.size(),
                                          params_.size() == 1 ? "" : "s", fmt::join(names, ", "), got));
}

void LaunchPlan::bad_grid(Grid g) const {
  throw std::invalid_argument(fmt::format("tilejit: kernel '{}': grid ({},{},{}) is invalid: x must be in [1, {}], y and z in "
                                          "[1, {}]",
                                          name_, g.x, g.y, g.z, kI32Max, kGridYZMax));
}

void LaunchPlan::check(Grid grid, std::span<const DeviceArg> args) const {
  uint64_t scratch[kMaxSlots];
  pack(grid, args, scratch);
}

void LaunchPlan::pack(Grid grid, std::span<const DeviceArg> args, uint64_t* slots) const {
  if (args.size() != plan_.size()) [[unlikely]]
    bad_count(args.size());
  if (grid.x < 1 || grid.x > kI32Max || grid.y < 1 || grid.y > kGridYZMax || grid.z < 1 || grid.z > kGridYZMax) [[unlikely]]
    bad_grid(grid);
  for (size_t i = 0; i < plan_.size(); ++i) {
    const Param& p = plan_[i];
    if (p.kind == ir::ParamKind::Scalar) pack_scalar(i, p, args[i], slots);
    else pack_tensor(i, p, args[i], slots);
  }
  for (const ir::SizeRelation& r : relations_) {
    const int64_t a = args[r.a].tensor()->sizes[static_cast<size_t>(r.a_dim)], b = args[r.b].tensor()->sizes[static_cast<size_t>(r.b_dim)];
    if (a != b) [[unlikely]]
      bad_relation(r, a, b);
  }
  if (any_written_) check_aliasing(args);
}

void LaunchPlan::check_aliasing(std::span<const DeviceArg> args) const {
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (!plan_[i].written) continue;
    const TensorView& w = *args[i].tensor();
    for (size_t j = 0; j < plan_.size(); ++j) {
      if (j == i || plan_[j].kind == ir::ParamKind::Scalar || (plan_[j].written && j < i)) continue;
      const TensorView& o = *args[j].tensor();
      if (!views_overlap(w, o) || (!plan_[j].written && same_view(w, o))) [[likely]]
        continue;
      bad(i, fmt::format("the kernel writes {}, whose memory overlaps argument {} '{}' ({}, which the kernel {}): its "
                         "programs would race (valid: disjoint memory, or {})",
                         w.describe(), j, params_[j].name, o.describe(), plan_[j].written ? "also writes" : "reads",
                         plan_[j].written ? "one output per buffer" : "exactly the same view, for an in-place update"));
    }
  }
}

void LaunchPlan::bad_relation(const ir::SizeRelation& r, int64_t a, int64_t b) const {
  ir::Function f;  // the message names the kernel and its parameters
  f.name = name_;
  f.params = params_;
  throw std::invalid_argument("tilejit: " + ir::size_relation_error(f, r, a, b));
}

void LaunchPlan::pack_scalar(size_t i, const Param& p, const DeviceArg& a, uint64_t* slots) const {
  pack_scalar_value(i, p, a, slots);
  // a kernel specialised on this value's divisibility (runtime/specialization.hpp) must not see another
  if (p.divisible_by > 1 && (slots[p.slot] & (p.divisible_by - 1)) != 0) [[unlikely]]
    bad(i, fmt::format("{} is not a multiple of {}, which this compiled variant of the kernel assumes", a.describe(), p.divisible_by));
}

void LaunchPlan::pack_scalar_value(size_t i, const Param& p, const DeviceArg& a, uint64_t* slots) const {
  using K = DeviceArg::Kind;
  const std::string_view dn = ir::name(p.dtype);
  uint64_t& s = slots[p.slot];
  if (a.kind() == K::Tensor) [[unlikely]]
    bad(i, fmt::format("expected a number of type {}, got {}", dn, a.describe()));
  auto out_of_range = [&](const std::string& valid) {
    bad(i, fmt::format("{} does not fit the parameter's type {} (valid: {})", a.describe(), dn, valid));
  };
  switch (p.scalar) {
    case Scalar::Signed:
      if (a.kind() == K::Int) {
        if (a.as_int() < p.lo || a.as_int() > static_cast<int64_t>(p.hi)) [[unlikely]]
          out_of_range(fmt::format("{} to {}", p.lo, p.hi));
        s = static_cast<uint64_t>(a.as_int());
        return;
      }
      if (a.kind() == K::UInt) {
        if (a.as_uint() > p.hi) [[unlikely]]
          out_of_range(fmt::format("{} to {}", p.lo, p.hi));
        s = a.as_uint();
        return;
      }
      break;
    case Scalar::Unsigned:
      if (a.kind() == K::Int) {
        if (a.as_int() < 0 || static_cast<uint64_t>(a.as_int()) > p.hi) [[unlikely]]
          out_of_range(fmt::format("0 to {}", p.hi));
        s = static_cast<uint64_t>(a.as_int());
        return;
      }
      if (a.kind() == K::UInt) {
        if (a.as_uint() > p.hi) [[unlikely]]
          out_of_range(fmt::format("0 to {}", p.hi));
        s = a.as_uint();
        return;
      }
      break;
    case Scalar::Bool:
      if (a.kind() == K::Bool) {
        s = a.as_bool() ? 1 : 0;
        return;
      }
      bad(i, fmt::format("expected a bool (the parameter is i1), got {}", a.describe()));
    case Scalar::F32: {
      float f;
      if (a.kind() == K::Float) {
        f = static_cast<float>(a.as_double());
        if (std::isinf(f) && std::isfinite(a.as_double())) [[unlikely]]
          out_of_range(fmt::format("finite values of magnitude up to {}, infinities and NaN", std::numeric_limits<float>::max()));
      } else if (a.kind() == K::Int) {
        f = static_cast<float>(a.as_int());
      } else if (a.kind() == K::UInt) {
        f = static_cast<float>(a.as_uint());
      } else {
        break;
      }
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      s = bits;
      return;
    }
    case Scalar::F64: {
      double d;
      if (a.kind() == K::Float) d = a.as_double();
      else if (a.kind() == K::Int) d = static_cast<double>(a.as_int());
      else if (a.kind() == K::UInt) d = static_cast<double>(a.as_uint());
      else break;
      std::memcpy(&s, &d, 8);
      return;
    }
    case Scalar::Unsupported:
      bad(i, fmt::format("{} scalars are not supported by the GPU launcher yet (pass an f32 parameter and cast in the kernel)", dn));
    case Scalar::None: break;
  }
  // A kind the parameter does not take.
  if (a.kind() == K::Float)
    bad(i, fmt::format("expected an integer of type {}, got {} (convert explicitly if truncation is meant)", dn, a.describe()));
  if (a.kind() == K::Bool)
    bad(i, fmt::format("expected a number of type {}, got {} (bool is accepted only for i1 parameters)", dn, a.describe()));
  bad(i, fmt::format("expected a number of type {}, got {}", dn, a.describe()));
}

void LaunchPlan::pack_tensor(size_t i, const Param& p, const DeviceArg& a, uint64_t* slots) const {
  const TensorView* t = a.tensor();
  if (!t) [[unlikely]]
    bad(i, fmt::format("expected a device tensor of {} (the parameter is {}), got {}", ir::name(p.dtype),
                       ir::to_string(params_[i].type), a.describe()));
  if (t->dtype != p.dtype) [[unlikely]]
    bad(i, fmt::format("the tensor holds {} but the parameter is {}", ir::name(t->dtype), ir::to_string(params_[i].type)));
  if (t->device != device_) [[unlikely]]
    bad(i, fmt::format("{} is on device {} but the kernel runs on device {}", a.describe(), t->device, device_));
  if (t->address % p.align != 0) [[unlikely]]
    bad(i, fmt::format("base address {:#x} is not a multiple of {} bytes, the alignment the parameter requires", t->address,
                       p.align));
  slots[p.slot] = t->address;
  if (t->address == 0) [[unlikely]] {
    bool empty = false;
    for (int64_t sz : t->sizes) empty = empty || sz == 0;
    if (!empty) bad(i, fmt::format("the base address is null ({})", a.describe()));
  }
  if (p.kind == ir::ParamKind::Pointer) return;

  const int rank = p.rank;
  if (t->rank() != rank) [[unlikely]]
    bad(i, fmt::format("expected a rank-{} tensor, got {}", rank, a.describe()));
  if (t->strides.size() != t->sizes.size()) [[unlikely]]
    bad(i, fmt::format("the tensor view has {} sizes but {} strides", t->sizes.size(), t->strides.size()));
  const int64_t* sizes = t->sizes.data();
  const int64_t* strides = t->strides.data();
  if (p.contiguous_last && rank > 0 && strides[rank - 1] != 1) [[unlikely]]
    bad(i, fmt::format("the innermost stride must be 1 (the parameter is declared contiguous), got {} in {}", strides[rank - 1],
                       a.describe()));
  const auto align = static_cast<int64_t>(p.align);
  for (int d = 0; d + 1 < rank; ++d)
    if ((strides[d] * p.elem_bytes) % align != 0) [[unlikely]]
      bad(i, fmt::format("stride {} of dim {} ({} bytes) is not a multiple of {} bytes, the row alignment the parameter "
                         "requires",
                         strides[d], d, strides[d] * p.elem_bytes, align));
  uint64_t* out = slots + p.slot + 1;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] < 0 || sizes[d] > kI32Max) [[unlikely]]
      bad(i, fmt::format("size {} of dim {} is outside the i32 range of tensor sizes (valid: 0 to {})", sizes[d], d, kI32Max));
    out[d] = static_cast<uint32_t>(sizes[d]);
    out[rank + d] = static_cast<uint64_t>(strides[d]);
    if (p.stored && strides[d] == 0 && sizes[d] > 1) [[unlikely]]
      bad(i, fmt::format("stride 0 in dim {} of size {}: the kernel stores windows into this tensor, and its {} elements "
                         "along that dim would share one address (valid: a non-zero stride)", d, sizes[d], sizes[d]));
  }
  if (p.tma) check_tma(i, *t);
}

void LaunchPlan::check_tma(size_t i, const TensorView& t) const {
  const int64_t es = ir::byte_size(t.dtype);
  const int r = t.rank();
  std::string need;  // formatted only on failure: this runs on every launch
  auto outer_strides_ok = [&] {
    for (int d = 0; d + 1 < r; ++d) {
      const int64_t bytes = t.strides[static_cast<size_t>(d)] * es;
      if (t.sizes[static_cast<size_t>(d)] > 1 && (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t{1} << 40))) return false;
    }
    return true;
  };
  auto non_empty = [&] {
    for (int64_t n : t.sizes)
      if (n < 1 || n > (int64_t{1} << 32)) return false;
    return true;
  };
  if (r < 2 || r > 5 || t.strides[static_cast<size_t>(r - 1)] != 1) need = "a tensor of rank 2 to 5 with unit innermost stride";
  else if (t.address % 16 != 0) need = "a 16-byte aligned base address";
  else if (!non_empty()) need = "a non-empty tensor (sizes 1 to 2^32)";
  else if (!outer_strides_ok()) need = "strides (except the innermost) that are positive multiples of 16 bytes below 2^40";
  else if (r == 2 && t.sizes[0] > 1 && t.strides[0] * es < t.sizes[1] * es)
    need = fmt::format("a row pitch of at least one row ({} bytes)", t.sizes[1] * es);
  else return;
  bad(i, fmt::format("this kernel reads it through TMA, which needs {}; got {} (compile with "
                     "CompileOptions::pipeline.enabled = false for arbitrary layouts)",
                     need, t.describe()));
}

// ---------------------------------------------------------------------------------------------
// TMA descriptors

// Descriptors travel by value: each is a 128-byte kernel parameter (__grid_constant__), which
// cuLaunchKernel copies at the launch -- a captured CUDA graph carries its own copy, and nothing
// in device memory can change under it. Encoding costs ~1 us per descriptor, so the sets for the
// last kSets layouts of the TMA tensors (address, sizes, row pitch) are kept on the host, the last
// one compared first (a kernel called again on the same tensors encodes nothing); a new layout
// takes the least recently used set. The mutex covers the lookup and the launch (which reads the
// set), so a set is never rewritten while a launch in another thread still reads it.
struct GpuKernel::TmaCache {
  static constexpr int kSets = 16;
  static constexpr int kMaxMaps = 16;
  static constexpr int kKeyWords = 10;  // address, 5 sizes, 4 outer strides (elements; unused ones 0)
  static_assert(sizeof(CUtensorMap) == jit::pir::kTensorMapBytes && alignof(CUtensorMap) >= 64);

  std::vector<jit::pir::TensorMapSpec> specs;
  size_t words = 0;
  std::mutex mutex;
  std::vector<uint64_t> keys;      // kSets * words
  std::vector<CUtensorMap> maps;   // kSets * specs.size()
  std::vector<uint64_t> last_use;  // per set: the launch that last used it (0: empty)
  uint64_t launches = 0;
  int last = -1;                   // the set of the previous launch
};

namespace {

CUtensorMapDataType tensor_map_dtype(DType d, const std::string& kernel) {
  switch (d) {
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::f16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::f32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::f64: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
    case DType::i32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
    case DType::u32: return CU_TENSOR_MAP_DATA_TYPE_UINT32;
    case DType::i64: return CU_TENSOR_MAP_DATA_TYPE_INT64;
    case DType::u64: return CU_TENSOR_MAP_DATA_TYPE_UINT64;
    case DType::i16:
    case DType::u16: return CU_TENSOR_MAP_DATA_TYPE_UINT16;
    case DType::i8:
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    default: break;
  }
  throw std::logic_error(fmt::format("tilejit: kernel '{}': no TMA data type for {}", kernel, ir::name(d)));
}

CUtensorMapSwizzle tensor_map_swizzle(int bytes, const std::string& kernel) {
  switch (bytes) {
    case 0: return CU_TENSOR_MAP_SWIZZLE_NONE;
    case 32: return CU_TENSOR_MAP_SWIZZLE_32B;
    case 64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case 128: return CU_TENSOR_MAP_SWIZZLE_128B;
    default: break;
  }
  throw std::logic_error(fmt::format("tilejit: kernel '{}': no TMA swizzle of {} bytes", kernel, bytes));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GpuKernel

GpuKernel::GpuKernel(const ir::Function& signature, jit::CompiledKernel compiled, int device)
    : plan_(signature, device), compiled_(std::move(compiled)), device_(device) {
  const std::string& name = plan_.kernel_name();
  plan_.check_abi(compiled_);
  plan_.require_tma(compiled_.tensor_maps);
  num_abi_ = plan_.num_slots() + static_cast<int>(compiled_.tensor_maps.size());
  if (num_abi_ > LaunchPlan::kMaxSlots)
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}' has {} ABI parameters, more than the {} the launcher supports",
                                            name, num_abi_, LaunchPlan::kMaxSlots));
  if (compiled_.tensor_maps.size() > static_cast<size_t>(TmaCache::kMaxMaps))
    throw std::invalid_argument(fmt::format("tilejit: kernel '{}' uses {} TMA descriptors, more than the {} the launcher supports",
                                            name, compiled_.tensor_maps.size(), TmaCache::kMaxMaps));

  Driver& d = Driver::get();
  d.require(fmt::format("running kernel '{}'", name));
  if (compiled_.cubin.empty()) module_ = Module::from_ptx(compiled_.ptx, name + ".ptx", device);
  else module_ = Module::from_cubin(compiled_.cubin.data(), compiled_.cubin.size(), name + ".cubin", device);
  function_ = module_.function(name);
  context_ = &d.context(device);
  launch_kernel_ = d.api().LaunchKernel;
  block_threads_ = static_cast<unsigned>(compiled_.num_threads);
  smem_bytes_ = static_cast<unsigned>(compiled_.smem_bytes);
  // Once here rather than per launch: the limit is a property of the function and only grows.
  if (smem_bytes_ > 0) d.ensure_dynamic_smem(function_, smem_bytes_, device, name);
  // Likewise the occupancy (after the shared-memory limit it depends on): persistent grids ask per call.
  resident_per_sm_ = max_resident_blocks_per_sm(function_, static_cast<int>(block_threads_), smem_bytes_, device_);

  if (!compiled_.tensor_maps.empty()) {
    tma_ = std::make_unique<TmaCache>();
    tma_->specs = compiled_.tensor_maps;
    tma_->words = TmaCache::kKeyWords * tma_->specs.size();
    tma_->keys.resize(TmaCache::kSets * tma_->words);
    tma_->maps.resize(TmaCache::kSets * tma_->specs.size());
    tma_->last_use.assign(TmaCache::kSets, 0);
  }
}

Grid GpuKernel::persistent_grid(int64_t items) const {
  const int64_t resident = int64_t{Driver::get().props(device_).sm_count} * std::max(1, resident_per_sm_);
  return Grid{std::max<int64_t>(1, std::min(resident, items))};
}

GpuKernel::GpuKernel(GpuKernel&&) noexcept = default;
GpuKernel& GpuKernel::operator=(GpuKernel&&) noexcept = default;
GpuKernel::~GpuKernel() = default;

void GpuKernel::enqueue(Grid grid, CUstream stream, void** ptrs) const {
  check_cu_kernel(launch_kernel_(function_, static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y),
                                 static_cast<unsigned>(grid.z), block_threads_, 1, 1, smem_bytes_, stream, ptrs, nullptr),
                  "cuLaunchKernel", plan_.kernel_name());
}

void GpuKernel::launch(Grid grid, std::span<const DeviceArg> args, CUstream stream) const {
  // Uninitialised on purpose: pack() writes every slot the kernel reads.
  uint64_t slots[LaunchPlan::kMaxSlots];
  void* ptrs[LaunchPlan::kMaxSlots];
  plan_.pack(grid, args, slots);
  for (int i = 0; i < num_abi_; ++i) ptrs[i] = &slots[i];
  context_->make_current();
  if (tma_) [[unlikely]] {
    launch_with_tma(grid, args, stream, ptrs);
    return;
  }
  enqueue(grid, stream, ptrs);
}

void GpuKernel::launch_with_tma(Grid grid, std::span<const DeviceArg> args, CUstream stream,
                                void** ptrs) const {
  TmaCache& c = *tma_;
  const std::string& name = plan_.kernel_name();
  uint64_t key[TmaCache::kKeyWords * TmaCache::kMaxMaps];
  for (size_t m = 0; m < c.specs.size(); ++m) {
    const TensorView& t = *args[static_cast<size_t>(c.specs[m].param_index)].tensor();  // checked by pack()
    uint64_t* k = key + TmaCache::kKeyWords * m;
    std::fill(k, k + TmaCache::kKeyWords, uint64_t{0});
    k[0] = t.address;
    for (size_t d = 0; d < t.sizes.size(); ++d) k[1 + d] = static_cast<uint64_t>(t.sizes[d]);
    for (size_t d = 0; d + 1 < t.sizes.size(); ++d) k[6 + d] = static_cast<uint64_t>(t.strides[d]);
  }
  const size_t key_bytes = c.words * sizeof(uint64_t);

  std::lock_guard lock(c.mutex);
  auto set_key = [&](int s) { return c.keys.data() + static_cast<size_t>(s) * c.words; };
  int set = c.last >= 0 && std::memcmp(key, set_key(c.last), key_bytes) == 0 ? c.last : -1;
  for (int s = 0; s < TmaCache::kSets && set < 0; ++s)
    if (c.last_use[static_cast<size_t>(s)] && std::memcmp(key, set_key(s), key_bytes) == 0) set = s;
  if (set < 0) {
    set = static_cast<int>(std::min_element(c.last_use.begin(), c.last_use.end()) - c.last_use.begin());
    const DriverApi& api = Driver::get().api();
    for (size_t m = 0; m < c.specs.size(); ++m) {
      const jit::pir::TensorMapSpec& spec = c.specs[m];
      const TensorView& t = *args[static_cast<size_t>(spec.param_index)].tensor();
      const auto es = static_cast<cuuint64_t>(ir::byte_size(t.dtype));
      // innermost first; a size-1 dim's stride may be anything: give it a valid one
      const auto rank = static_cast<size_t>(t.rank());
      cuuint64_t dims[5], strides[4];
      cuuint32_t box[5], unit[5];
      for (size_t d = 0; d < rank; ++d) {
        dims[d] = static_cast<cuuint64_t>(t.sizes[rank - 1 - d]);
        box[d] = static_cast<cuuint32_t>(spec.box[d]);
        unit[d] = 1;
      }
      for (size_t d = 0; d + 1 < rank; ++d) {
        const size_t td = rank - 2 - d;
        strides[d] = t.sizes[td] > 1 ? static_cast<cuuint64_t>(t.strides[td]) * es : 16;
      }
      check_cu_kernel(api.TensorMapEncodeTiled(&c.maps[static_cast<size_t>(set) * c.specs.size() + m], tensor_map_dtype(t.dtype, name),
                                               static_cast<cuuint32_t>(rank), reinterpret_cast<void*>(t.address), dims, strides, box,
                                               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, tensor_map_swizzle(spec.swizzle_bytes, name),
                                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                      "cuTensorMapEncodeTiled", name);
    }
    std::memcpy(set_key(set), key, key_bytes);
  }
  c.last = set;
  c.last_use[static_cast<size_t>(set)] = ++c.launches;
  for (size_t m = 0; m < c.specs.size(); ++m) ptrs[plan_.num_slots() + static_cast<int>(m)] = &c.maps[static_cast<size_t>(set) * c.specs.size() + m];
  enqueue(grid, stream, ptrs);
}

}  // namespace tilejit::runtime
