#include "jit/nvrtc.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <chrono>

#include <fmt/format.h>

namespace tilejit::jit {

namespace {

// nvrtc's C API, declared here so that building tilejit needs no CUDA headers; results are plain
// ints (nvrtcResult), the program handle is opaque.
struct NvrtcApi {
  using Program = void*;
  int (*create)(Program*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile)(Program, int, const char* const*) = nullptr;
  int (*ptx_size)(Program, size_t*) = nullptr;
  int (*ptx)(Program, char*) = nullptr;
  int (*log_size)(Program, size_t*) = nullptr;
  int (*log)(Program, char*) = nullptr;
  int (*destroy)(Program*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*version)(int*, int*) = nullptr;
  std::string version_text;  // "13.0"
  std::string error;         // why it is unavailable; empty when loaded
};

// Loaded once per process (the documented library-handle cache).
const NvrtcApi& nvrtc_api() {
  static const NvrtcApi api = [] {
    NvrtcApi a;
    void* lib = detail::open_cuda_library({"libnvrtc.so.13", "libnvrtc.so"}, a.error);
    if (!lib) return a;
    auto resolve = [&](auto& fn, const char* name) {
      void* p = ::dlsym(lib, name);
      if (!p && a.error.empty()) a.error = fmt::format("libnvrtc has no symbol {}", name);
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    resolve(a.create, "nvrtcCreateProgram");
    resolve(a.compile, "nvrtcCompileProgram");
    resolve(a.ptx_size, "nvrtcGetPTXSize");
    resolve(a.ptx, "nvrtcGetPTX");
    resolve(a.log_size, "nvrtcGetProgramLogSize");
    resolve(a.log, "nvrtcGetProgramLog");
    resolve(a.destroy, "nvrtcDestroyProgram");
    resolve(a.error_string, "nvrtcGetErrorString");
    resolve(a.version, "nvrtcVersion");
    if (!a.error.empty()) return a;
    int major = 0, minor = 0;
    if (a.version(&major, &minor) != 0) {
      a.error = "nvrtcVersion failed";
      return a;
    }
    a.version_text = fmt::format("{}.{}", major, minor);
    return a;
  }();
  return api;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

bool nvrtc_available(std::string* why) {
  const NvrtcApi& api = nvrtc_api();
  if (why) *why = api.error;
  return api.error.empty();
}

std::string nvrtc_version() {
  const NvrtcApi& api = nvrtc_api();
  return "nvrtc " + (api.error.empty() ? api.version_text : std::string("none"));
}

NvrtcResult nvrtc_compile(const std::string& source, const std::string& program_name, const std::string& arch,
                          const std::vector<std::string>& extra_options) {
  const auto start = std::chrono::steady_clock::now();
  detail::check_arch(arch, program_name, true);
  const NvrtcApi& api = nvrtc_api();
  if (!api.error.empty())
    throw CompileError(fmt::format("tilejit: nvrtc is not available: {} (compiling program '{}'; install the CUDA 13 "
                                   "toolkit's libnvrtc or use the LLVM backend)", api.error, program_name));

  // A compute_ target makes nvrtc emit PTX (and no cubin: nvrtcGetCUBINSize is 0); ptx_to_cubin
  // assembles it for the sm_ target.
  const std::string virtual_arch = arch.rfind("sm_", 0) == 0 ? "compute_" + arch.substr(3) : arch;
  const std::string where = fmt::format("tilejit: nvrtc {} compiling program '{}' for {}", api.version_text,
                                        program_name, virtual_arch);
  std::vector<std::string> opts = {"--gpu-architecture=" + virtual_arch, "--std=c++17", "-default-device"};
  // Only existing include directories: where the headers are missing the compile error names the
  // header, which says more than an option pointing nowhere.
  const std::string root = cuda_root();
  for (const std::string& dir : {root + "/include", root + "/include/cccl"})
    if (is_directory(dir)) opts.push_back("-I" + dir);
  opts.insert(opts.end(), extra_options.begin(), extra_options.end());
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());

  // The name shows in nvrtc's messages ("attention_fwd.cu(12): error: ..."), so make it look like a file.
  const std::string file_name = program_name.ends_with(".cu") ? program_name : program_name + ".cu";
  NvrtcApi::Program prog = nullptr;
  int rc = api.create(&prog, source.c_str(), file_name.c_str(), 0, nullptr, nullptr);
  if (rc != 0) throw CompileError(fmt::format("{}: nvrtcCreateProgram failed ({})", where, api.error_string(rc)));
  struct Guard {
    const NvrtcApi& api;
    NvrtcApi::Program& p;
    ~Guard() { api.destroy(&p); }
  } guard{api, prog};

  NvrtcResult out;
  rc = api.compile(prog, int(copts.size()), copts.data());
  size_t n = 0;
  if (api.log_size(prog, &n) == 0 && n > 1) {
    out.log.assign(n, '\0');
    if (api.log(prog, out.log.data()) != 0) out.log.clear();
    while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  }
  if (rc != 0) throw CompileError(fmt::format("{} failed ({}):\n{}", where, api.error_string(rc), out.log));

  n = 0;
  rc = api.ptx_size(prog, &n);
  if (rc == 0 && n > 1) {
    out.ptx.assign(n, '\0');
    rc = api.ptx(prog, out.ptx.data());
    while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  }
  if (rc != 0 || out.ptx.empty())
    throw CompileError(fmt::format("{}: nvrtc returned no PTX ({}):\n{}", where, api.error_string(rc), out.log));
  out.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace tilejit::jit
