// A JIT-compiled kernel loaded on the GPU and called with device tensors and numbers: checks the
// arguments against the kernel's signature, writes them into the kernel ABI and launches.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/compile.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::runtime {

// What the launcher needs to know of a tensor argument, without owning it: DeviceTensor converts
// to one, and tests build them by hand (argument checks run without a GPU). The spans must stay
// valid until the launch call returns.
struct TensorView {
  ir::DType dtype = ir::DType::f32;
  std::span<const int64_t> sizes;
  std::span<const int64_t> strides;  // in elements, one per size
  uint64_t address = 0;              // device address of element [0, ..., 0]
  int device = 0;

  int rank() const { return static_cast<int>(sizes.size()); }
  std::string describe() const;  // "bf16[128,64] strides [80,1] at 0x7f2a00000000 on device 0"
};
TensorView view(const DeviceTensor& t);

// One argument: a tensor (DeviceTensor or TensorView) for pointer and tensor parameters, a number
// for scalars. Small and trivially copyable, so the variadic call path builds an array of them
// on the stack.
class DeviceArg {
 public:
  enum class Kind : uint8_t { Tensor, Int, UInt, Float, Bool };

  DeviceArg(const DeviceTensor& t) : kind_(Kind::Tensor), view_(view(t)) {}  // NOLINT: implicit on purpose
  DeviceArg(const TensorView& v) : kind_(Kind::Tensor), view_(v) {}         // NOLINT
  template <class T>
    requires std::is_arithmetic_v<T>
  DeviceArg(T v) {  // NOLINT
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = Kind::Bool;
      u_ = v ? 1 : 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      kind_ = Kind::Float;
      f_ = static_cast<double>(v);
    } else if constexpr (std::is_signed_v<T>) {
      kind_ = Kind::Int;
      i_ = static_cast<int64_t>(v);
    } else {
      kind_ = Kind::UInt;
      u_ = static_cast<uint64_t>(v);
    }
  }

  Kind kind() const { return kind_; }
  const TensorView* tensor() const { return kind_ == Kind::Tensor ? &view_ : nullptr; }
  int64_t as_int() const { return i_; }
  uint64_t as_uint() const { return u_; }
  double as_double() const { return f_; }
  bool as_bool() const { return u_ != 0; }
  std::string describe() const;  // "the tensor f32[1024] at 0x... on device 0", "the integer 5", "the float 0.5"

 private:
  Kind kind_ = Kind::Int;
  union {
    int64_t i_ = 0;
    uint64_t u_;
    double f_;
  };
  TensorView view_;
};

// The argument checks and ABI slots of one kernel signature, worked out once so that a launch is
// a loop of compares and stores: per parameter its first ABI slot (a tensor takes 1 + 2 * rank:
// pointer, sizes as i32, strides as i64), its dtype, rank, alignment, contiguity, the scalar's
// valid range and, for tensors the compiled kernel reads through TMA, the layout TMA needs. Needs
// no GPU: Function::check and tests use it directly.
class LaunchPlan {
 public:
  static constexpr int kMaxSlots = 256;  // ABI parameters one launch can pass (4 KB of kernel params)

  explicit LaunchPlan(const ir::Function& signature, int device = 0);

  // Tensors read through TMA descriptors (CompiledKernel::tensor_maps) must also be rank 2 with a
  // unit innermost stride, a 16-byte aligned base, a non-empty shape and a row pitch that is a
  // multiple of 16 bytes and covers a row.
  void require_tma(const std::vector<jit::pir::TensorMapSpec>& specs);
  // Throws std::logic_error when `k.abi` is not the flattening of this signature (plus its tensor maps).
  void check_abi(const jit::CompiledKernel& k) const;

  // Checks `grid` and `args` (count, kind, dtype, device, rank, contiguity, alignment, sizes,
  // scalar types and ranges) and writes the num_slots() ABI values to `slots` (8 bytes each, the
  // value in the low bytes). Throws std::invalid_argument naming the kernel, the argument and the
  // value, before anything is written that matters.
  void pack(Grid grid, std::span<const DeviceArg> args, uint64_t* slots) const;
  void check(Grid grid, std::span<const DeviceArg> args) const;

  int num_slots() const { return num_slots_; }
  const std::string& kernel_name() const { return name_; }
  const std::vector<ir::Param>& params() const { return params_; }
  int device() const { return device_; }

 private:
  enum class Scalar : uint8_t { None, Signed, Unsigned, Bool, F32, F64, Unsupported };
  struct Param {
    ir::ParamKind kind{};
    ir::DType dtype{};
    Scalar scalar = Scalar::None;
    bool contiguous_last = false;
    bool tma = false;
    bool stored = false;    // a window store (not an atomic add) writes it: no stride-0 dims of size > 1
    bool written = false;   // anything writes through it: its memory must not overlap another argument's
    int rank = 0;
    int slot = 0;
    uint64_t align = 1;     // bytes: base address and every outer stride
    uint64_t divisible_by = 0;  // integer scalar: the value a multiple of this power of two (0: any)
    int64_t elem_bytes = 1;
    int64_t lo = 0;         // Signed: valid range
    uint64_t hi = 0;        // Signed/Unsigned: upper bound
  };

  void pack_scalar_value(size_t i, const Param& p, const DeviceArg& a, uint64_t* slots) const;
  void pack_scalar(size_t i, const Param& p, const DeviceArg& a, uint64_t* slots) const;
  void pack_tensor(size_t i, const Param& p, const DeviceArg& a, uint64_t* slots) const;
  void check_tma(size_t i, const TensorView& t) const;
  void check_aliasing(std::span<const DeviceArg> args) const;
  [[noreturn]] void bad(size_t i, const std::string& msg) const;
  [[noreturn]] void bad_relation(const ir::SizeRelation& r, int64_t a, int64_t b) const;
  [[noreturn]] void bad_count(size_t got) const;
  [[noreturn]] void bad_grid(Grid grid) const;

  std::string name_;
  std::vector<ir::Param> params_;
  std::vector<ir::SizeRelation> relations_;
  std::vector<Param> plan_;
  int num_slots_ = 0;
  int device_ = 0;
  bool any_written_ = false;
};

// "" when `k` is the compiled form of `signature` (name, ABI parameters, tensor maps), else what
// differs: a cache entry or bundle kernel is checked with this before it is served.
std::string abi_mismatch(const ir::Function& signature, const jit::CompiledKernel& k);

class GpuKernel {
 public:
  // `signature` is the ir::Function the kernel was compiled from (parameters and specs). Loads the
  // module (DeviceError "needs a GPU" in compile-only mode) and raises the function's dynamic
  // shared memory limit when the kernel needs more than 48 KB.
  GpuKernel(const ir::Function& signature, jit::CompiledKernel compiled, int device = 0);
  GpuKernel(GpuKernel&&) noexcept;
  GpuKernel& operator=(GpuKernel&&) noexcept;
  ~GpuKernel();

  // Asynchronous launch of `grid` programs on `stream`; throws std::invalid_argument for bad
  // arguments (naming kernel, argument and value), DeviceError for driver failures. Safe to call
  // from several threads at once; allocates nothing.
  void operator()(Grid grid, const std::vector<DeviceArg>& args, CUstream stream = nullptr) const {
    launch(grid, args, stream);
  }
  void launch(Grid grid, std::span<const DeviceArg> args, CUstream stream = nullptr) const;
  // The checks a launch makes, without launching.
  void check(Grid grid, std::span<const DeviceArg> args) const { plan_.check(grid, args); }

  const jit::CompiledKernel& compiled() const { return compiled_; }
  const LaunchPlan& plan() const { return plan_; }
  CUfunction function() const { return function_; }  // for benchmarks that launch it raw
  // Blocks of this kernel one multiprocessor holds at once (its threads and dynamic shared memory).
  // Queried once, when the kernel is loaded.
  int max_resident_per_sm() const { return resident_per_sm_; }
  // A persistent grid of this kernel (1-D): as many programs as the device holds at once (SMs x
  // resident blocks per SM), no more than `items`, at least one.
  Grid persistent_grid(int64_t items) const;
  int device() const { return device_; }

 private:
  struct TmaCache;
  void launch_with_tma(Grid grid, std::span<const DeviceArg> args, CUstream stream, void** ptrs) const;
  void enqueue(Grid grid, CUstream stream, void** ptrs) const;

  LaunchPlan plan_;
  jit::CompiledKernel compiled_;
  Module module_;
  CUfunction function_ = nullptr;
  int device_ = 0;
  const Context* context_ = nullptr;
  PFN_cuLaunchKernel_v4000 launch_kernel_ = nullptr;
  unsigned block_threads_ = 0;
  unsigned smem_bytes_ = 0;
  int resident_per_sm_ = 0;
  int num_abi_ = 0;  // plan slots + one per tensor map
  // TMA descriptors (only for kernels that have them): encoded from the tensor arguments and
  // passed by value, re-encoded only for a layout (address, sizes, strides) not among the last few.
  std::unique_ptr<TmaCache> tma_;
};

}  // namespace tilejit::runtime
