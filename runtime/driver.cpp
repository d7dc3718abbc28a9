#include "runtime/driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

namespace tilejit::runtime {

namespace {

// Every entry point is requested at the ABI of CUDA 12.0 (see TILEJIT_CUDA_DRIVER_ENTRY_POINTS).
constexpr int kAbiVersion = 12000;
constexpr const char* kCompileOnly = "tilejit runs in compile-only mode (compiling, caching and bundling still work)";
// Not in the driver's CUresult enum (it is the runtime's cudaErrorInsufficientDriver), yet cuInit
// returns it when the kernel driver is older than libcuda expects.
constexpr CUresult kInsufficientDriver = static_cast<CUresult>(35);

// Names for the results the driver may be unable to name itself (no library, the stub).
const char* fallback_error_name(CUresult r) {
  switch (static_cast<int>(r)) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    default: return nullptr;
  }
}

// Destructors must not throw: make the device's context current if that can be done at all.
void bind_noexcept(int device) noexcept {
  try {
    Driver::get().context(device).make_current();
  } catch (...) {
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Errors

void throw_cu_error(CUresult result, std::string_view call, std::string_view subject, std::string_view detail) {
  const Driver& d = Driver::get();
  std::string msg = fmt::format("tilejit: {}{}{} failed: {} ({})", call, subject.empty() ? "" : " for ", subject,
                                d.error_name(result), d.error_string(result));
  if (!detail.empty()) msg += fmt::format("; {}", detail);
  throw DeviceError(msg, std::string(call), result);
}

void throw_cu_kernel_error(CUresult result, std::string_view call, std::string_view kernel) {
  throw_cu_error(result, call, fmt::format("kernel '{}'", kernel));
}

std::string Driver::error_name(CUresult result) const {
  const char* s = nullptr;
  if (api_.GetErrorName && api_.GetErrorName(result, &s) == CUDA_SUCCESS && s) return s;
  if (const char* f = fallback_error_name(result)) return f;
  return fmt::format("CUresult {}", static_cast<int>(result));
}

std::string Driver::error_string(CUresult result) const {
  const char* s = nullptr;
  if (api_.GetErrorString && api_.GetErrorString(result, &s) == CUDA_SUCCESS && s) return s;
  return "no description from the driver";
}

void Driver::throw_unavailable(std::string_view what) const {
  throw DeviceError(fmt::format("tilejit: {} needs a GPU: {}", what, reason_));
}

// ---------------------------------------------------------------------------------------------
// Loading

std::string DeviceProps::arch() const {
  if (cc_major == 9 && cc_minor == 0) return "sm_90a";
  return fmt::format("sm_{}{}", cc_major, cc_minor);
}

Driver& Driver::get() {
  // Thread-safe lazy construction ([stmt.dcl]: concurrent callers wait for the one that runs the
  // constructor), deliberately leaked: see the class comment.
  static Driver* const instance = new Driver();
  return *instance;
}

Driver::Driver() { load(); }

void Driver::load() {
  const char* override_path = std::getenv("TILEJIT_LIBCUDA");
  library_ = (override_path && *override_path) ? override_path : "libcuda.so.1";

  dlerror();
  handle_ = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* err = dlerror();
    reason_ = fmt::format("no NVIDIA driver could be loaded ({}); {}", err ? err : library_ + ": dlopen failed",
                          kCompileOnly);
    return;
  }

  // cuGetProcAddress_v2 (CUDA 12+) reports why a symbol is missing; the plain symbol is the 11.3
  // ABI without that out-parameter.
  auto get_proc_v2 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(handle_, "cuGetProcAddress_v2"));
  auto get_proc_v1 =
      get_proc_v2 ? nullptr : reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(handle_, "cuGetProcAddress"));
  if (!get_proc_v2 && !get_proc_v1) {
    reason_ = fmt::format("{} has no cuGetProcAddress (an NVIDIA driver older than CUDA 11.3); {}", library_,
                          kCompileOnly);
    return;
  }

  // Returns "" or why `symbol` could not be resolved; `result` gets the CUresult.
  auto resolve = [&](const char* symbol, void** fn, CUresult& result) -> std::string {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    *fn = nullptr;
    result = get_proc_v2 ? get_proc_v2(symbol, fn, kAbiVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
                         : get_proc_v1(symbol, fn, kAbiVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    if (result != CUDA_SUCCESS) return error_name(result);
    if (status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) return "the driver is too old for it";
    if (status != CU_GET_PROC_ADDRESS_SUCCESS || !*fn) return "symbol not found";
    return {};
  };
  auto stub_reason = [&] {
    return fmt::format("{} is the CUDA toolkit's stub library, not an NVIDIA driver (CUDA_ERROR_STUB_LIBRARY); {}",
                       library_, kCompileOnly);
  };

  // The error-name functions first (they work before cuInit and name every later failure), then
  // cuInit, which decides between a GPU and compile-only mode.
  CUresult r = CUDA_SUCCESS;
  std::string why = resolve("cuGetErrorName", reinterpret_cast<void**>(&api_.GetErrorName), r);
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    reason_ = stub_reason();
    return;
  }
  if (!why.empty()) api_.GetErrorName = nullptr;
  if (!resolve("cuGetErrorString", reinterpret_cast<void**>(&api_.GetErrorString), r).empty())
    api_.GetErrorString = nullptr;
  why = resolve("cuInit", reinterpret_cast<void**>(&api_.Init), r);
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    reason_ = stub_reason();
    return;
  }
  if (!why.empty()) {
    reason_ = fmt::format("{} has no usable cuInit ({}); {}", library_, why, kCompileOnly);
    return;
  }
  r = api_.Init(0);
  if (r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_STUB_LIBRARY)
      reason_ = stub_reason();
    else if (r == CUDA_ERROR_NO_DEVICE)
      reason_ = fmt::format("no CUDA-capable GPU is visible (cuInit: CUDA_ERROR_NO_DEVICE; check CUDA_VISIBLE_DEVICES); {}",
                            kCompileOnly);
    else if (r == kInsufficientDriver)
      reason_ = fmt::format("the NVIDIA kernel driver is older than its libcuda (cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER); {}",
                            kCompileOnly);
    else
      reason_ = fmt::format("cuInit failed ({}: {}); {}", error_name(r), error_string(r), kCompileOnly);
    return;
  }

  // Everything else. A driver that lacks one of these is unusable for tilejit as a whole.
#define TILEJIT_RESOLVE_ENTRY_POINT(member, symbol, type)                                               \
  if (!api_.member) {                                                                                   \
    why = resolve(symbol, reinterpret_cast<void**>(&api_.member), r);                                   \
    if (!why.empty()) {                                                                                 \
      api_.member = nullptr;                                                                            \
      reason_ = fmt::format("the NVIDIA driver in {} lacks {} at the CUDA 12.0 ABI ({}); {}", library_, \
                            symbol, why, kCompileOnly);                                                 \
      return;                                                                                           \
    }                                                                                                   \
  }
  TILEJIT_CUDA_DRIVER_ENTRY_POINTS(TILEJIT_RESOLVE_ENTRY_POINT)
#undef TILEJIT_RESOLVE_ENTRY_POINT

  // Device properties, read once: they never change and cost no context.
  auto fail = [&](std::string_view call, CUresult res) {
    reason_ = fmt::format("{} failed ({}: {}); {}", call, error_name(res), error_string(res), kCompileOnly);
    props_.clear();
  };
  if ((r = api_.DriverGetVersion(&driver_version_)) != CUDA_SUCCESS) return fail("cuDriverGetVersion", r);
  int count = 0;
  if ((r = api_.DeviceGetCount(&count)) != CUDA_SUCCESS) return fail("cuDeviceGetCount", r);
  if (count <= 0) {
    reason_ = fmt::format("the NVIDIA driver sees no CUDA device (cuDeviceGetCount returned 0); {}", kCompileOnly);
    return;
  }
  for (int i = 0; i < count; ++i) {
    DeviceProps p;
    p.ordinal = i;
    p.driver_version = driver_version_;
    CUdevice dev = 0;
    if ((r = api_.DeviceGet(&dev, i)) != CUDA_SUCCESS) return fail(fmt::format("cuDeviceGet({})", i), r);
    char name[256] = {};
    if ((r = api_.DeviceGetName(name, sizeof(name) - 1, dev)) != CUDA_SUCCESS)
      return fail(fmt::format("cuDeviceGetName({})", i), r);
    p.name = name;
    size_t total = 0;
    if ((r = api_.DeviceTotalMem(&total, dev)) != CUDA_SUCCESS) return fail(fmt::format("cuDeviceTotalMem({})", i), r);
    p.global_mem_bytes = total;
    struct Query {
      CUdevice_attribute attr;
      const char* name;
      int* out;
    };
    int smem_block = 0, smem_optin = 0, smem_sm = 0, l2 = 0;
    const Query queries[] = {
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT", &p.sm_count},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "COMPUTE_CAPABILITY_MAJOR", &p.cc_major},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "COMPUTE_CAPABILITY_MINOR", &p.cc_minor},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, "MAX_SHARED_MEMORY_PER_BLOCK", &smem_block},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", &smem_optin},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", &smem_sm},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2_CACHE_SIZE", &l2},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK", &p.max_threads_per_block},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, "WARP_SIZE", &p.warp_size},
        {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, "CLOCK_RATE", &p.clock_khz},
    };
    for (const Query& q : queries)
      if ((r = api_.DeviceGetAttribute(q.out, q.attr, dev)) != CUDA_SUCCESS)
        return fail(fmt::format("cuDeviceGetAttribute({}) for device {}", q.name, i), r);
    p.smem_per_block = static_cast<size_t>(smem_block);
    p.smem_per_block_optin = static_cast<size_t>(smem_optin);
    p.smem_per_sm = static_cast<size_t>(smem_sm);
    p.l2_bytes = static_cast<size_t>(l2);
    props_.push_back(std::move(p));
  }
  contexts_ = std::make_unique<ContextSlot[]>(props_.size());
  available_ = true;
}

const DeviceProps& Driver::props(int device) const {
  require("reading device properties");
  if (device < 0 || device >= device_count())
    throw std::out_of_range(fmt::format("tilejit: no CUDA device {} (there are {})", device, device_count()));
  return props_[static_cast<size_t>(device)];
}

// ---------------------------------------------------------------------------------------------
// Contexts

const Context& Driver::context(int device) {
  props(device);  // requires a GPU and checks the ordinal
  ContextSlot& slot = contexts_[static_cast<size_t>(device)];
  // A failed retain throws out of call_once, which leaves the flag unset: the next call retries.
  std::call_once(slot.once, [&] {
    CUdevice dev = 0;
    check_cu(api_.DeviceGet(&dev, device), "cuDeviceGet");
    CUcontext ctx = nullptr;
    CUresult r = api_.DevicePrimaryCtxRetain(&ctx, dev);
    if (r != CUDA_SUCCESS) throw_cu_error(r, "cuDevicePrimaryCtxRetain", fmt::format("device {}", device));
    // Never released: the context lives as long as the process (and the Driver).
    slot.context.reset(new Context(&api_, device, ctx));
  });
  return *slot.context;
}

void Context::make_current() const {
  CUcontext current = nullptr;
  check_cu(api_->CtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != ctx_) check_cu(api_->CtxSetCurrent(ctx_), "cuCtxSetCurrent");
}

// ---------------------------------------------------------------------------------------------
// Dynamic shared memory limits

void Driver::ensure_dynamic_smem(CUfunction f, unsigned bytes, int device, std::string_view kernel) {
  const DeviceProps& p = props(device);
  if (bytes > p.smem_per_block_optin)
    throw DeviceError(fmt::format(
        "tilejit: kernel '{}' asks for {} bytes of dynamic shared memory, more than the {} bytes per block that "
        "device {} ({}) allows with opt-in",
        kernel, bytes, p.smem_per_block_optin, device, p.name));

  std::lock_guard lock(smem_mutex_);
  auto it = smem_.find(f);
  if (it == smem_.end()) {
    FunctionSmem entry{};
    check_cu_kernel(api_.FuncGetAttribute(&entry.static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f),
                    "cuFuncGetAttribute(SHARED_SIZE_BYTES)", kernel);
    check_cu_kernel(
        api_.FuncGetAttribute(&entry.max_dynamic_bytes, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f),
        "cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", kernel);
    // Without the module the entry can never be forgotten, which is harmless unless handles are
    // reused; cuFuncGetModule only fails for functions not loaded through a module.
    if (api_.FuncGetModule(&entry.module, f) != CUDA_SUCCESS) entry.module = nullptr;
    it = smem_.emplace(f, entry).first;
  }
  FunctionSmem& e = it->second;
  if (static_cast<int64_t>(bytes) <= e.max_dynamic_bytes) return;
  if (bytes + static_cast<size_t>(e.static_bytes) > p.smem_per_block_optin)
    throw DeviceError(fmt::format(
        "tilejit: kernel '{}' asks for {} bytes of dynamic shared memory on top of {} bytes of static shared "
        "memory, more than the {} bytes per block that device {} ({}) allows with opt-in",
        kernel, bytes, e.static_bytes, p.smem_per_block_optin, device, p.name));
  CUresult r = api_.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes));
  if (r != CUDA_SUCCESS)
    throw_cu_error(r, fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {})", bytes),
                   fmt::format("kernel '{}'", kernel));
  e.max_dynamic_bytes = static_cast<int>(bytes);
}

void Driver::forget_module(CUmodule module) {
  std::lock_guard lock(smem_mutex_);
  std::erase_if(smem_, [&](const auto& kv) { return kv.second.module == module; });
}

// ---------------------------------------------------------------------------------------------
// Modules

Module Module::from_cubin(const void* image, size_t size, std::string name, int device) {
  Driver::get().require(fmt::format("loading module '{}'", name));
  // The driver reads the size from the header; check that there is one so that PTX text or a
  // truncated file gives a clear error instead of CUDA_ERROR_INVALID_IMAGE (or a read past the end).
  const auto* bytes = static_cast<const unsigned char*>(image);
  constexpr unsigned char kElf[4] = {0x7f, 'E', 'L', 'F'};
  constexpr unsigned char kFatbin[4] = {0x50, 0xed, 0x55, 0xba};  // 0xBA55ED50, little endian
  if (!image || size < 64 || (std::memcmp(bytes, kElf, 4) != 0 && std::memcmp(bytes, kFatbin, 4) != 0))
    throw std::invalid_argument(fmt::format(
        "tilejit: module '{}': the image ({} bytes) is neither an ELF cubin nor a fatbin (PTX goes to from_ptx)",
        name, image ? size : 0));
  return load(image, std::move(name), device, false);
}

Module Module::from_ptx(const std::string& ptx, std::string name, int device) {
  Driver::get().require(fmt::format("loading module '{}'", name));
  return load(ptx.c_str(), std::move(name), device, true);
}

Module Module::load(const void* image, std::string name, int device, bool is_ptx) {
  Driver& d = Driver::get();
  d.context(device).make_current();
  // The logs matter for PTX (JIT errors and ptxas-style info); for a cubin they stay empty.
  constexpr size_t kLogBytes = 16384;
  std::string error_log(kLogBytes, '\0'), info_log(kLogBytes, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(kLogBytes - 1)),
                    info_log.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(kLogBytes - 1))};
  CUmodule module = nullptr;
  CUresult r = d.api().ModuleLoadDataEx(&module, image, 4, options, values);
  error_log.resize(std::strlen(error_log.c_str()));
  info_log.resize(std::strlen(info_log.c_str()));
  if (r != CUDA_SUCCESS)
    throw_cu_error(r, "cuModuleLoadDataEx", fmt::format("{} module '{}'", is_ptx ? "PTX" : "cubin", name),
                   error_log.empty() ? std::string() : fmt::format("JIT log:\n{}", error_log));
  Module m;
  m.module_ = module;
  m.name_ = std::move(name);
  m.device_ = device;
  m.info_log_ = std::move(info_log);
  return m;
}

Module::Module(Module&& other) noexcept
    : module_(std::exchange(other.module_, nullptr)),
      name_(std::move(other.name_)),
      device_(other.device_),
      info_log_(std::move(other.info_log_)) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    reset();
    module_ = std::exchange(other.module_, nullptr);
    name_ = std::move(other.name_);
    device_ = other.device_;
    info_log_ = std::move(other.info_log_);
  }
  return *this;
}

Module::~Module() { reset(); }

void Module::reset() noexcept {
  if (!module_) return;
  Driver& d = Driver::get();
  d.forget_module(module_);
  bind_noexcept(device_);
  // An error here (a context already torn down at exit) leaves nothing to recover.
  (void)d.api().ModuleUnload(module_);
  module_ = nullptr;
}

CUfunction Module::function(const std::string& kernel_name) const {
  if (!module_) throw std::logic_error(fmt::format("tilejit: function('{}') on an empty Module", kernel_name));
  Driver& d = Driver::get();
  d.context(device_).make_current();
  CUfunction f = nullptr;
  CUresult r = d.api().ModuleGetFunction(&f, module_, kernel_name.c_str());
  if (r != CUDA_SUCCESS)
    throw_cu_error(r, "cuModuleGetFunction", fmt::format("kernel '{}' in module '{}'", kernel_name, name_));
  return f;
}

// ---------------------------------------------------------------------------------------------
// Launches

void launch(CUfunction f, const LaunchConfig& cfg, void** kernel_params, const std::string& kernel_name) {
  Driver& d = Driver::get();
  if (!d.available()) d.require(fmt::format("launching kernel '{}'", kernel_name));
  if (!f) throw std::invalid_argument(fmt::format("tilejit: launching kernel '{}': the CUfunction is null", kernel_name));
  d.context(cfg.device).make_current();
  if (cfg.dynamic_smem_bytes > 0) d.ensure_dynamic_smem(f, cfg.dynamic_smem_bytes, cfg.device, kernel_name);
  check_cu_kernel(d.api().LaunchKernel(f, cfg.grid[0], cfg.grid[1], cfg.grid[2], cfg.block[0], cfg.block[1],
                                       cfg.block[2], cfg.dynamic_smem_bytes, cfg.stream, kernel_params, nullptr),
                  "cuLaunchKernel", kernel_name);
}

int max_resident_blocks_per_sm(CUfunction f, int block_threads, size_t dynamic_smem, int device) {
  Driver& d = Driver::get();
  d.require("querying occupancy");
  d.context(device).make_current();
  int blocks = 0;
  check_cu(d.api().OccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, block_threads, dynamic_smem),
           "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

FunctionAttributes attributes(CUfunction f, const std::string& kernel_name, int device) {
  Driver& d = Driver::get();
  d.require("reading function attributes");
  d.context(device).make_current();
  FunctionAttributes a;
  struct Query {
    CUfunction_attribute attr;
    const char* call;
    int* out;
  };
  const Query queries[] = {
      {CU_FUNC_ATTRIBUTE_NUM_REGS, "cuFuncGetAttribute(NUM_REGS)", &a.num_regs},
      {CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "cuFuncGetAttribute(SHARED_SIZE_BYTES)", &a.shared_size_bytes},
      {CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, "cuFuncGetAttribute(CONST_SIZE_BYTES)", &a.const_size_bytes},
      {CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "cuFuncGetAttribute(LOCAL_SIZE_BYTES)", &a.local_size_bytes},
      {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)", &a.max_threads_per_block},
      {CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, "cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
       &a.max_dynamic_shared_size_bytes},
      {CU_FUNC_ATTRIBUTE_PTX_VERSION, "cuFuncGetAttribute(PTX_VERSION)", &a.ptx_version},
      {CU_FUNC_ATTRIBUTE_BINARY_VERSION, "cuFuncGetAttribute(BINARY_VERSION)", &a.binary_version},
  };
  for (const Query& q : queries) check_cu_kernel(d.api().FuncGetAttribute(q.out, q.attr, f), q.call, kernel_name);
  return a;
}

// ---------------------------------------------------------------------------------------------
// Streams and events

Stream::Stream(int device) : device_(device) {
  Driver& d = Driver::get();
  d.require("creating a stream");
  d.context(device).make_current();
  check_cu(d.api().StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

void set_shared_memory_carveout(CUfunction f, int percent, int device) {
  if (percent < 0 || percent > 100)
    throw std::invalid_argument(fmt::format("tilejit: shared memory carveout {}% is not in [0, 100]", percent));
  Driver& d = Driver::get();
  d.require("setting a shared memory carveout");
  d.context(device).make_current();
  check_cu(d.api().FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent),
           "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)");
}

Stream::Stream(int device, Priority priority) : device_(device) {
  Driver& d = Driver::get();
  d.require("creating a stream");
  d.context(device).make_current();
  int least = 0, greatest = 0;  // CUDA: numerically lower is higher priority
  check_cu(d.api().CtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
  const int value = priority == Priority::low ? least : priority == Priority::high ? greatest : 0;
  check_cu(d.api().StreamCreateWithPriority(&stream_, CU_STREAM_NON_BLOCKING, value), "cuStreamCreateWithPriority");
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Stream::~Stream() { reset(); }

void Stream::reset() noexcept {
  if (!stream_) return;
  bind_noexcept(device_);
  (void)Driver::get().api().StreamDestroy(stream_);  // returns at once; pending work still completes
  stream_ = nullptr;
}

void Stream::synchronize_within(double seconds, const std::string& what) const {
  if (!stream_) throw std::logic_error("tilejit: synchronize_within() on an empty Stream");
  Driver& d = Driver::get();
  d.context(device_).make_current();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  for (;;) {
    const CUresult r = d.api().StreamQuery(stream_);
    if (r != CUDA_ERROR_NOT_READY) return check_cu(r, "cuStreamQuery");
    if (std::chrono::steady_clock::now() > deadline)
      throw GpuHang(fmt::format("tilejit: {} did not finish within {:.0f} s: the GPU is likely hung in it (a wait that is never "
                                "signalled); this process cannot use the GPU any more",
                                what, seconds));
    // yield through the first millisecond (a short kernel's launch-to-launch gap stays as small as
    // a blocking sync's), then poll every 200 us
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Stream::synchronize() const {
  if (!stream_) throw std::logic_error("tilejit: synchronize() on an empty Stream");
  Driver& d = Driver::get();
  d.context(device_).make_current();
  check_cu(d.api().StreamSynchronize(stream_), "cuStreamSynchronize");
}

void Stream::wait(const Event& e) const {
  if (!stream_ || !e.handle()) throw std::logic_error("tilejit: Stream::wait() needs a stream and an event");
  Driver& d = Driver::get();
  d.context(device_).make_current();
  check_cu(d.api().StreamWaitEvent(stream_, e.handle(), 0), "cuStreamWaitEvent");
}

Event::Event(int device) : device_(device) {
  Driver& d = Driver::get();
  d.require("creating an event");
  d.context(device).make_current();
  check_cu(d.api().EventCreate(&event_, CU_EVENT_DEFAULT), "cuEventCreate");  // DEFAULT: timing enabled
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Event::~Event() { reset(); }

void Event::reset() noexcept {
  if (!event_) return;
  bind_noexcept(device_);
  (void)Driver::get().api().EventDestroy(event_);
  event_ = nullptr;
}

void Event::record(CUstream stream) {
  if (!event_) throw std::logic_error("tilejit: record() on an empty Event");
  Driver& d = Driver::get();
  d.context(device_).make_current();
  check_cu(d.api().EventRecord(event_, stream), "cuEventRecord");
}

void Event::synchronize() const {
  if (!event_) throw std::logic_error("tilejit: synchronize() on an empty Event");
  Driver& d = Driver::get();
  d.context(device_).make_current();
  check_cu(d.api().EventSynchronize(event_), "cuEventSynchronize");
}

float Event::elapsed_ms(const Event& start) const {
  if (!event_ || !start.event_) throw std::logic_error("tilejit: elapsed_ms() with an empty Event");
  Driver& d = Driver::get();
  d.context(device_).make_current();
  float ms = 0.0f;
  check_cu(d.api().EventElapsedTime(&ms, start.event_, event_), "cuEventElapsedTime");
  return ms;
}

}  // namespace tilejit::runtime
