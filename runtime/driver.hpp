// The CUDA driver API loaded at run time (dlopen + cuGetProcAddress, never linked) and what is built
// directly on it: device properties, primary contexts, modules, launches, streams, events, errors.
#pragma once
// <cuda.h> is used for its types, enums and nothing else: every entry point is resolved through
// cuGetProcAddress at run time, so libtilejit has no libcuda dependency and loads on machines
// without a GPU (compile-only mode).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tilejit::runtime {

// Every failure of the GPU path: a driver call that returned an error (call() names it, result()
// is its CUresult), or a GPU operation attempted in compile-only mode (call() empty, result()
// CUDA_SUCCESS). what() is one line naming the call, the kernel or module, and the result's name
// and description, e.g. "tilejit: cuLaunchKernel for kernel 'gemm' failed: CUDA_ERROR_INVALID_VALUE
// (invalid argument)".
class DeviceError;
// Work on a stream that did not finish in time (Stream::synchronize_within): the GPU is likely
// hung in a kernel, and nothing more can run in this process's context.
class GpuHang : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DeviceError : public std::runtime_error {
 public:
  explicit DeviceError(const std::string& message, std::string call = {}, CUresult result = CUDA_SUCCESS)
      : std::runtime_error(message), call_(std::move(call)), result_(result) {}
  const std::string& call() const { return call_; }
  CUresult result() const { return result_; }

 private:
  std::string call_;
  CUresult result_;
};

// Throws DeviceError for a failed driver call. `subject` names what the call worked on ("kernel
// 'gemm'", "module 'attn.cubin'", or empty); `detail` is appended after the result (a JIT log, a
// size). Out of line so that the success path of check_cu stays a compare and a branch.
[[noreturn]] void throw_cu_error(CUresult result, std::string_view call, std::string_view subject = {},
                                 std::string_view detail = {});
inline void check_cu(CUresult result, std::string_view call) {
  if (result != CUDA_SUCCESS) [[unlikely]]
    throw_cu_error(result, call);
}
// For calls made on behalf of a kernel: the message names it.
[[noreturn]] void throw_cu_kernel_error(CUresult result, std::string_view call, std::string_view kernel);
inline void check_cu_kernel(CUresult result, std::string_view call, std::string_view kernel) {
  if (result != CUDA_SUCCESS) [[unlikely]]
    throw_cu_kernel_error(result, call, kernel);
}

// The driver entry points tilejit uses, resolved with cuGetProcAddress at CUDA version 12000. The
// prototypes are cudaTypedefs.h's versioned ones that version 12000 selects (cuMemAlloc ->
// cuMemAlloc_v2 = PFN_cuMemAlloc_v3020, cuEventElapsedTime -> the 2000 ABI, cuCtxSynchronize ->
// the argument-less 2000 ABI, not 13000's), so a newer driver or toolkit never changes the ABI we
// call. Members drop the "cu" prefix because cuda.h #defines several of the plain names
// (cuMemAlloc -> cuMemAlloc_v2; *_ptsz variants under per-thread default streams).
#define TILEJIT_CUDA_DRIVER_ENTRY_POINTS(X)                                   \
  X(GetErrorName, "cuGetErrorName", PFN_cuGetErrorName_v6000)                 \
  X(GetErrorString, "cuGetErrorString", PFN_cuGetErrorString_v6000)           \
  X(Init, "cuInit", PFN_cuInit_v2000)                                         \
  X(DriverGetVersion, "cuDriverGetVersion", PFN_cuDriverGetVersion_v2020)     \
  X(DeviceGet, "cuDeviceGet", PFN_cuDeviceGet_v2000)                          \
  X(DeviceGetCount, "cuDeviceGetCount", PFN_cuDeviceGetCount_v2000)           \
  X(DeviceGetName, "cuDeviceGetName", PFN_cuDeviceGetName_v2000)              \
  X(DeviceGetAttribute, "cuDeviceGetAttribute", PFN_cuDeviceGetAttribute_v2000) \
  X(DeviceTotalMem, "cuDeviceTotalMem", PFN_cuDeviceTotalMem_v3020)           \
  X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", PFN_cuDevicePrimaryCtxRetain_v7000) \
  X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", PFN_cuDevicePrimaryCtxRelease_v11000) \
  X(CtxGetCurrent, "cuCtxGetCurrent", PFN_cuCtxGetCurrent_v4000)              \
  X(CtxSetCurrent, "cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000)              \
  X(CtxSynchronize, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000)           \
  X(ModuleLoadDataEx, "cuModuleLoadDataEx", PFN_cuModuleLoadDataEx_v2010)     \
  X(ModuleUnload, "cuModuleUnload", PFN_cuModuleUnload_v2000)                 \
  X(ModuleGetFunction, "cuModuleGetFunction", PFN_cuModuleGetFunction_v2000)  \
  X(FuncGetAttribute, "cuFuncGetAttribute", PFN_cuFuncGetAttribute_v2020)     \
  X(FuncSetAttribute, "cuFuncSetAttribute", PFN_cuFuncSetAttribute_v9000)     \
  X(FuncGetModule, "cuFuncGetModule", PFN_cuFuncGetModule_v11000)             \
  X(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor",                \
    PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050)                    \
  X(LaunchKernel, "cuLaunchKernel", PFN_cuLaunchKernel_v4000)                 \
  X(LaunchKernelEx, "cuLaunchKernelEx", PFN_cuLaunchKernelEx_v11060)          \
  X(StreamCreate, "cuStreamCreate", PFN_cuStreamCreate_v2000)                 \
  X(StreamDestroy, "cuStreamDestroy", PFN_cuStreamDestroy_v4000)              \
  X(StreamSynchronize, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000)  \
  X(StreamQuery, "cuStreamQuery", PFN_cuStreamQuery_v2000)                    \
  X(StreamWaitEvent, "cuStreamWaitEvent", PFN_cuStreamWaitEvent_v3020)        \
  X(StreamCreateWithPriority, "cuStreamCreateWithPriority", PFN_cuStreamCreateWithPriority_v5050) \
  X(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", PFN_cuCtxGetStreamPriorityRange_v5050) \
  X(EventCreate, "cuEventCreate", PFN_cuEventCreate_v2000)                    \
  X(EventDestroy, "cuEventDestroy", PFN_cuEventDestroy_v4000)                 \
  X(EventRecord, "cuEventRecord", PFN_cuEventRecord_v2000)                    \
  X(EventSynchronize, "cuEventSynchronize", PFN_cuEventSynchronize_v2000)     \
  X(EventElapsedTime, "cuEventElapsedTime", PFN_cuEventElapsedTime_v2000)     \
  X(MemGetInfo, "cuMemGetInfo", PFN_cuMemGetInfo_v3020)                       \
  X(MemAlloc, "cuMemAlloc", PFN_cuMemAlloc_v3020)                             \
  X(MemFree, "cuMemFree", PFN_cuMemFree_v3020)                                \
  X(MemcpyHtoD, "cuMemcpyHtoD", PFN_cuMemcpyHtoD_v3020)                       \
  X(MemcpyDtoH, "cuMemcpyDtoH", PFN_cuMemcpyDtoH_v3020)                       \
  X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync", PFN_cuMemcpyHtoDAsync_v3020)        \
  X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", PFN_cuMemcpyDtoHAsync_v3020)        \
  X(MemsetD8, "cuMemsetD8", PFN_cuMemsetD8_v3020)                             \
  X(MemsetD8Async, "cuMemsetD8Async", PFN_cuMemsetD8Async_v3020)              \
  X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync", PFN_cuMemcpyDtoDAsync_v3020)        \
  X(Memcpy2DAsync, "cuMemcpy2DAsync", PFN_cuMemcpy2DAsync_v3020)              \
  X(TensorMapEncodeTiled, "cuTensorMapEncodeTiled", PFN_cuTensorMapEncodeTiled_v12000) \
  X(StreamBeginCapture, "cuStreamBeginCapture", PFN_cuStreamBeginCapture_v10010)      \
  X(StreamEndCapture, "cuStreamEndCapture", PFN_cuStreamEndCapture_v10000)            \
  X(GraphInstantiate, "cuGraphInstantiateWithFlags", PFN_cuGraphInstantiateWithFlags_v11040) \
  X(GraphLaunch, "cuGraphLaunch", PFN_cuGraphLaunch_v10000)                           \
  X(GraphExecDestroy, "cuGraphExecDestroy", PFN_cuGraphExecDestroy_v10000)            \
  X(GraphDestroy, "cuGraphDestroy", PFN_cuGraphDestroy_v10000)

struct DriverApi {
#define TILEJIT_DECLARE_ENTRY_POINT(member, symbol, type) type member = nullptr;
  TILEJIT_CUDA_DRIVER_ENTRY_POINTS(TILEJIT_DECLARE_ENTRY_POINT)
#undef TILEJIT_DECLARE_ENTRY_POINT
};

struct DeviceProps {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int ordinal = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t smem_per_block = 0;        // without opt-in (48 KB): dynamic smem above it needs cuFuncSetAttribute
  size_t smem_per_block_optin = 0;  // the most one block can get (227 KB on H100)
  size_t smem_per_sm = 0;
  size_t l2_bytes = 0;
  size_t global_mem_bytes = 0;
  int max_threads_per_block = 0;
  int warp_size = 0;
  int driver_version = 0;  // cuDriverGetVersion: 13000 for CUDA 13.0
  int clock_khz = 0;       // CU_DEVICE_ATTRIBUTE_CLOCK_RATE: the SM clock the driver reports (boost)

  // The ptxas/nvJitLink target: "sm_90a" for cc 9.0 (tilejit uses the arch-specific wgmma/TMA/
  // setmaxnreg features there), else "sm_XY".
  std::string arch() const;
};

// A device's primary context (the one the CUDA runtime and PyTorch share), retained on first use
// and kept for the life of the process. Every runtime operation makes it current on the calling
// thread first, so callers never manage contexts; the previous current context is not restored.
class Context {
 public:
  int device() const { return device_; }
  CUcontext handle() const { return ctx_; }
  void make_current() const;  // cuCtxSetCurrent, skipped when it already is current

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  friend class Driver;
  Context(const DriverApi* api, int device, CUcontext ctx) : api_(api), device_(device), ctx_(ctx) {}
  const DriverApi* api_;
  int device_;
  CUcontext ctx_;
};

// The process-wide driver: the only global state of the runtime. Created on first use (C++ static
// initialisation is thread-safe) and deliberately never destroyed, so that buffers, modules or
// streams destroyed during static destruction still find it, and libcuda is never unloaded or
// called from exit handlers. Construction never throws for a missing or unusable driver: it
// records why in unavailable_reason() (compile-only mode) and every GPU operation then throws a
// DeviceError carrying that sentence.
//
// The library is "libcuda.so.1" from the loader's search path; the environment variable
// TILEJIT_LIBCUDA names another file instead (tests point it at the toolkit's stub library).
class Driver {
 public:
  static Driver& get();

  bool available() const { return available_; }
  // One sentence saying why there is no GPU path (empty when available()).
  const std::string& unavailable_reason() const { return reason_; }
  // Throws DeviceError("tilejit: <what> needs a GPU: <reason>") when !available().
  void require(std::string_view what) const {
    if (!available_) [[unlikely]]
      throw_unavailable(what);
  }

  const std::string& library() const { return library_; }  // what was dlopen'ed
  int driver_version() const { return driver_version_; }   // 0 when unavailable
  int device_count() const { return static_cast<int>(props_.size()); }  // 0 when unavailable
  const DeviceProps& props(int device = 0) const;  // requires a GPU; std::out_of_range for a bad ordinal

  // The resolved entry points; requires a GPU.
  const DriverApi& api() const {
    require("the CUDA driver API");
    return api_;
  }
  // The device's primary context, retained on first use (thread-safe).
  const Context& context(int device = 0);

  // cuGetErrorName / cuGetErrorString, with a fallback when the driver cannot say.
  std::string error_name(CUresult result) const;
  std::string error_string(CUresult result) const;

  // Used by launch(): raises the function's dynamic shared memory limit when `bytes` exceeds what
  // it allows, remembering per function what was set; clear DeviceError above the device's opt-in.
  void ensure_dynamic_smem(CUfunction f, unsigned bytes, int device, std::string_view kernel);
  // Module's destructor: drops the remembered limits of the module's functions (handles are reused).
  void forget_module(CUmodule module);

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

 private:
  Driver();
  ~Driver() = default;  // never runs (see above)
  void load();
  [[noreturn]] void throw_unavailable(std::string_view what) const;

  struct ContextSlot {
    std::once_flag once;
    std::unique_ptr<Context> context;
  };
  struct FunctionSmem {
    CUmodule module;         // for forget_module
    int static_bytes;        // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    int max_dynamic_bytes;   // the limit currently set (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
  };

  DriverApi api_;
  void* handle_ = nullptr;  // dlopen handle, never closed
  std::string library_;
  bool available_ = false;
  std::string reason_;
  int driver_version_ = 0;
  std::vector<DeviceProps> props_;
  std::unique_ptr<ContextSlot[]> contexts_;  // one per device; once_flag is immovable
  std::mutex smem_mutex_;
  std::unordered_map<CUfunction, FunctionSmem> smem_;
};

// A loaded module (cubin, fatbin or PTX) in a device's primary context; unloaded on destruction.
class Module {
 public:
  // `image` is an ELF cubin or a fatbin (the driver does not take a size: `size` is used to
  // validate the header). `name` only labels errors ("attn_fwd.cubin").
  static Module from_cubin(const void* image, size_t size, std::string name, int device = 0);
  // PTX text JIT-compiled by the driver for the device: the fallback when no cubin was built. A
  // compile error's DeviceError carries the driver's JIT log.
  static Module from_ptx(const std::string& ptx, std::string name, int device = 0);

  Module() = default;  // empty
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module();

  // cuModuleGetFunction; a DeviceError names the kernel and the module when it is missing.
  CUfunction function(const std::string& kernel_name) const;
  CUmodule handle() const { return module_; }
  const std::string& name() const { return name_; }
  int device() const { return device_; }
  const std::string& info_log() const { return info_log_; }  // the JIT's info log (PTX), may be empty

 private:
  static Module load(const void* image, std::string name, int device, bool is_ptx);
  void reset() noexcept;

  CUmodule module_ = nullptr;
  std::string name_;
  int device_ = 0;
  std::string info_log_;
};

struct LaunchConfig {
  std::array<unsigned, 3> grid = {1, 1, 1};
  std::array<unsigned, 3> block = {1, 1, 1};
  unsigned dynamic_smem_bytes = 0;
  CUstream stream = nullptr;  // nullptr: the legacy default stream
  int device = 0;             // whose primary context holds the function
};

// cuLaunchKernel, asynchronous. `kernel_params[i]` points at the i-th argument's value (for a
// buffer, at a CUdeviceptr variable). Dynamic shared memory above the function's current limit
// (48 KB by default) raises the limit first (once per function and size); more than the device's
// opt-in maximum is a DeviceError before any driver call. `kernel_name` labels errors.
void launch(CUfunction f, const LaunchConfig& cfg, void** kernel_params, const std::string& kernel_name);

// A non-blocking stream (no implicit synchronisation with the legacy default stream).
class Stream {
 public:
  explicit Stream(int device = 0);
  // Scheduling priority relative to other streams: kernels of a high-priority stream get free
  // SMs first (e.g. a GEMM that a low-priority mask kernel should only fill the gaps of).
  enum class Priority { low, normal, high };
  Stream(int device, Priority priority);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  CUstream handle() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;  // surfaces asynchronous kernel errors as a DeviceError
  // synchronize(), but a GpuHang (naming `what`) when the stream has not finished within `seconds`:
  // a kernel that never ends (a wait no one signals) cannot be stopped, and the context stays busy.
  void synchronize_within(double seconds, const std::string& what) const;
  // Later work on this stream waits until `e` (recorded on any stream) has completed: how two
  // streams join, e.g. attention after a mask kernel that ran beside a GEMM.
  void wait(const class Event& e) const;

 private:
  void reset() noexcept;
  CUstream stream_ = nullptr;
  int device_ = 0;
};

// A timing event.
class Event {
 public:
  explicit Event(int device = 0);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  void record(CUstream stream = nullptr);
  void record(const Stream& stream) { record(stream.handle()); }
  void synchronize() const;
  // Milliseconds from `start` to this event; both recorded, this one completed (synchronize()).
  float elapsed_ms(const Event& start) const;
  CUevent handle() const { return event_; }

 private:
  void reset() noexcept;
  CUevent event_ = nullptr;
  int device_ = 0;
};

// Asks the driver to configure the SMs running `f` with `percent` of the unified L1/shared memory
// as shared memory (cuFuncSetAttribute PREFERRED_SHARED_MEMORY_CARVEOUT, 0-100). Kernels whose
// carveouts differ cannot share an SM: a small kernel meant to run beside a shared-memory-heavy one
// (a dropout-mask kernel beside a GEMM) asks for 100 so that it fits into the GEMM's SMs.
void set_shared_memory_carveout(CUfunction f, int percent, int device = 0);

// What the compiled function uses (cuFuncGetAttribute): the register and spill figures that tests
// and the autotuner check.
struct FunctionAttributes {
  int num_regs = 0;
  int shared_size_bytes = 0;  // static shared memory
  int const_size_bytes = 0;
  int local_size_bytes = 0;   // per thread; non-zero means spills or a local array
  int max_threads_per_block = 0;
  int max_dynamic_shared_size_bytes = 0;  // the limit currently set
  int ptx_version = 0;     // the virtual architecture it was compiled for, major*10+minor (90)
  int binary_version = 0;  // the binary architecture, major*10+minor (90 for sm_90/sm_90a)
};
FunctionAttributes attributes(CUfunction f, const std::string& kernel_name = {}, int device = 0);

// How many blocks of `f` (block_threads threads, dynamic_smem bytes) one multiprocessor holds at
// once (cuOccupancyMaxActiveBlocksPerMultiprocessor): what a persistent grid whose programs wait on
// each other may launch per SM, at most.
int max_resident_blocks_per_sm(CUfunction f, int block_threads, size_t dynamic_smem, int device = 0);

}  // namespace tilejit::runtime
