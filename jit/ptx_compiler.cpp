#include "jit/ptx_compiler.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>

extern char** environ;

namespace tilejit::jit {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// --- nvJitLink, declared here rather than through <nvJitLink.h> so that building tilejit needs no
// CUDA headers. The C ABI is stable: results and input kinds are plain ints, the handle is opaque.

constexpr int kNvJitLinkInputPtx = 2;  // NVJITLINK_INPUT_PTX

const char* nvjitlink_result_name(int r) {
  static const char* const names[] = {
      "NVJITLINK_SUCCESS",
      "NVJITLINK_ERROR_UNRECOGNIZED_OPTION",
      "NVJITLINK_ERROR_MISSING_ARCH",
      "NVJITLINK_ERROR_INVALID_INPUT",
      "NVJITLINK_ERROR_PTX_COMPILE",
      "NVJITLINK_ERROR_NVVM_COMPILE",
      "NVJITLINK_ERROR_INTERNAL",
      "NVJITLINK_ERROR_THREADPOOL",
      "NVJITLINK_ERROR_UNRECOGNIZED_INPUT",
      "NVJITLINK_ERROR_FINALIZE",
      "NVJITLINK_ERROR_NULL_INPUT",
      "NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS",
      "NVJITLINK_ERROR_INCORRECT_INPUT_TYPE",
      "NVJITLINK_ERROR_ARCH_MISMATCH",
      "NVJITLINK_ERROR_OUTDATED_LIBRARY",
      "NVJITLINK_ERROR_MISSING_FATBIN",
      "NVJITLINK_ERROR_UNRECOGNIZED_ARCH",
      "NVJITLINK_ERROR_UNSUPPORTED_ARCH",
      "NVJITLINK_ERROR_LTO_NOT_ENABLED",
  };
  return r >= 0 && r < int(std::size(names)) ? names[r] : "NVJITLINK_ERROR_UNKNOWN";
}

struct NvJitLinkApi {
  using Handle = void*;
  int (*create)(Handle*, uint32_t, const char**) = nullptr;
  int (*destroy)(Handle*) = nullptr;
  int (*add_data)(Handle, int, const void*, size_t, const char*) = nullptr;
  int (*complete)(Handle) = nullptr;
  int (*cubin_size)(Handle, size_t*) = nullptr;
  int (*cubin)(Handle, void*) = nullptr;
  int (*error_log_size)(Handle, size_t*) = nullptr;
  int (*error_log)(Handle, char*) = nullptr;
  int (*info_log_size)(Handle, size_t*) = nullptr;
  int (*info_log)(Handle, char*) = nullptr;
  int (*version)(unsigned*, unsigned*) = nullptr;
  std::string version_text;  // "13.0"
  std::string error;         // why it is unavailable; empty when loaded
};

// Loaded once per process (the documented "library handle" cache): dlopen is not free and the
// library's state is process-wide anyway.
const NvJitLinkApi& nvjitlink_api() {
  static const NvJitLinkApi api = [] {
    NvJitLinkApi a;
    void* lib = detail::open_cuda_library({"libnvJitLink.so.13", "libnvJitLink.so"}, a.error);
    if (!lib) return a;
    // The headers of CUDA 12.x/13.x map each call to a versioned symbol (__nvJitLinkCreate_13_0);
    // the plain names remain for older callers. Prefer the versioned ABI this code was written
    // against, fall back to the plain one for a differently versioned library.
    auto resolve = [&](auto& fn, const char* name, bool versioned) {
      void* p = versioned ? ::dlsym(lib, fmt::format("__{}_13_0", name).c_str()) : nullptr;
      if (!p) p = ::dlsym(lib, name);
      if (!p && a.error.empty()) a.error = fmt::format("libnvJitLink has no symbol {}", name);
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    resolve(a.create, "nvJitLinkCreate", true);
    resolve(a.destroy, "nvJitLinkDestroy", true);
    resolve(a.add_data, "nvJitLinkAddData", true);
    resolve(a.complete, "nvJitLinkComplete", true);
    resolve(a.cubin_size, "nvJitLinkGetLinkedCubinSize", true);
    resolve(a.cubin, "nvJitLinkGetLinkedCubin", true);
    resolve(a.error_log_size, "nvJitLinkGetErrorLogSize", true);
    resolve(a.error_log, "nvJitLinkGetErrorLog", true);
    resolve(a.info_log_size, "nvJitLinkGetInfoLogSize", true);
    resolve(a.info_log, "nvJitLinkGetInfoLog", true);
    resolve(a.version, "nvJitLinkVersion", false);
    if (!a.error.empty()) return a;
    unsigned major = 0, minor = 0;
    if (a.version(&major, &minor) != 0) {
      a.error = "nvJitLinkVersion failed";
      return a;
    }
    a.version_text = fmt::format("{}.{}", major, minor);
    return a;
  }();
  return api;
}

// --- ptxas as a subprocess

struct ProcessResult {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  std::string output;   // stdout and stderr interleaved, as a user would have seen them
};

// Runs argv[0] (a path: no PATH lookup, no shell, so nothing in argv is ever interpreted) in `cwd`
// with stdin from /dev/null and stdout+stderr captured through one pipe. Throws CompileError
// (naming `what`) only when the process cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& cwd,
                          const std::string& what) {
  int fds[2];
  // O_CLOEXEC: a ptxas spawned concurrently by another thread must not inherit our write end, or
  // our read would only see EOF once that unrelated process exits.
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw CompileError(fmt::format("{}: pipe failed: {}", what, std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw CompileError(fmt::format("{}: cannot run {}: {}", what, argv[0], std::strerror(rc)));
  }

  ProcessResult result;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      result.output.append(buf, size_t(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

// "ptxas --version" costs a process start (~10 ms), so each ptxas binary is asked once per process
// (the documented tool-version cache, keyed by path because $TILEJIT_PTXAS may change).
std::string ptxas_version(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::string> cache;
  {
    std::lock_guard lock(mutex);
    if (auto it = cache.find(path); it != cache.end()) return it->second;
  }
  std::string version = "unknown";
  try {
    ProcessResult r = run_process({path, "--version"}, "", "ptxas --version");
    std::smatch m;
    static const std::regex full(R"(V(\d+\.\d+\.\d+))"), release(R"(release (\d+\.\d+))");
    if (std::regex_search(r.output, m, full) || std::regex_search(r.output, m, release))
      version = m[1].str();
  } catch (const CompileError&) {
    // Not runnable: the compile that follows reports it with the kernel's name.
  }
  std::lock_guard lock(mutex);
  cache.emplace(path, version);
  return version;
}

// A private temporary directory, removed with everything in it however the compile ends.
class TempDir {
 public:
  explicit TempDir(const std::string& what) {
    std::string base = env_or_empty("TMPDIR");
    if (base.empty()) base = "/tmp";
    std::string templ = base + "/tilejit-ptxas-XXXXXX";
    if (!::mkdtemp(templ.data()))
      throw CompileError(fmt::format("{}: cannot create a temporary directory in {}: {}", what, base,
                                     std::strerror(errno)));
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The kernel's name as a file name, so that ptxas's messages read "vadd.ptx, line 37".
std::string file_stem(const std::string& kernel_name) {
  std::string s;
  for (char c : kernel_name.substr(0, 100))
    s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') ? c : '_';
  if (s.empty() || s[0] == '.' || s[0] == '-') s = "kernel" + s;
  return s;
}

CubinResult via_nvjitlink(const std::string& ptx, const std::string& arch, const std::string& kernel,
                          const std::vector<std::string>& extra) {
  const NvJitLinkApi& api = nvjitlink_api();
  CubinResult out;
  out.tool = "nvJitLink " + api.version_text;
  const std::string where = fmt::format("tilejit: kernel '{}': PTX -> cubin for {} with {}", kernel, arch, out.tool);

  // -verbose makes the info log carry ptxas's -v lines (registers, spills) plus a link summary.
  std::vector<std::string> opts = {"-arch=" + arch, "-verbose"};
  opts.insert(opts.end(), extra.begin(), extra.end());
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());

  NvJitLinkApi::Handle handle = nullptr;
  int rc = api.create(&handle, uint32_t(copts.size()), copts.data());
  if (rc != 0) {
    // No handle means no log: name the options, they are the usual culprit.
    throw CompileError(fmt::format("{} failed ({}); options: {}", where, nvjitlink_result_name(rc),
                                   fmt::join(opts, " ")));
  }
  struct Guard {
    const NvJitLinkApi& api;
    NvJitLinkApi::Handle& h;
    ~Guard() { api.destroy(&h); }
  } guard{api, handle};

  auto read_log = [&](int (*size_fn)(NvJitLinkApi::Handle, size_t*), int (*log_fn)(NvJitLinkApi::Handle, char*)) {
    size_t n = 0;
    if (size_fn(handle, &n) != 0 || n == 0) return std::string();
    std::string s(n, '\0');
    if (log_fn(handle, s.data()) != 0) return std::string();
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  };
  auto logs = [&] {
    std::string info = read_log(api.info_log_size, api.info_log);
    std::string err = read_log(api.error_log_size, api.error_log);
    if (!info.empty() && !err.empty() && info.back() != '\n') info += '\n';
    return info + err;
  };

  // AddData already runs ptxas on the PTX (Complete then succeeds with an empty image), so its
  // result must be checked, not just Complete's.
  const std::string input_name = file_stem(kernel) + ".ptx";
  rc = api.add_data(handle, kNvJitLinkInputPtx, ptx.data(), ptx.size(), input_name.c_str());
  if (rc == 0) rc = api.complete(handle);
  if (rc != 0) throw CompileError(fmt::format("{} failed ({}):\n{}", where, nvjitlink_result_name(rc), logs()));

  size_t size = 0;
  rc = api.cubin_size(handle, &size);
  if (rc == 0 && size > 0) {
    out.cubin.resize(size);
    rc = api.cubin(handle, out.cubin.data());
  }
  if (rc != 0 || size == 0)
    throw CompileError(fmt::format("{}: no cubin ({}):\n{}", where, nvjitlink_result_name(rc), logs()));
  out.log = logs();
  return out;
}

CubinResult via_ptxas(const std::string& ptx, const std::string& arch, const std::string& kernel,
                      const std::vector<std::string>& extra) {
  const std::string ptxas = find_ptxas();
  if (ptxas.empty())
    throw CompileError(fmt::format(
        "tilejit: kernel '{}': ptxas not found (set TILEJIT_PTXAS, put it on PATH or install the "
        "CUDA toolkit under {})", kernel, cuda_root()));
  if (!is_executable_file(ptxas)) {
    bool from_env = !env_or_empty("TILEJIT_PTXAS").empty();
    throw CompileError(fmt::format("tilejit: kernel '{}': {}{} is not an executable file", kernel,
                                   from_env ? "TILEJIT_PTXAS=" : "ptxas ", ptxas));
  }
  CubinResult out;
  out.tool = "ptxas " + ptxas_version(ptxas);
  const std::string where = fmt::format("tilejit: kernel '{}': PTX -> cubin for {} with {}", kernel, arch, out.tool);

  TempDir dir(where);
  const std::string stem = file_stem(kernel);
  const std::string in = stem + ".ptx", cubin = stem + ".cubin";
  {
    std::ofstream f(dir.path() + "/" + in, std::ios::binary);
    f.write(ptx.data(), std::streamsize(ptx.size()));
    if (!f.flush())
      throw CompileError(fmt::format("{}: cannot write {}/{}", where, dir.path(), in));
  }
  std::vector<std::string> argv = {ptxas, "-arch=" + arch, "-v"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"-o", cubin, in});
  ProcessResult r = run_process(argv, dir.path(), where);
  out.log = std::move(r.output);
  if (r.exit_code != 0) {
    std::string how = r.signal ? fmt::format("killed by signal {}", r.signal) : fmt::format("exit code {}", r.exit_code);
    throw CompileError(fmt::format("{} failed ({}):\n{}", where, how, out.log));
  }
  std::ifstream f(dir.path() + "/" + cubin, std::ios::binary);
  out.cubin.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (out.cubin.empty())
    throw CompileError(fmt::format("{}: ptxas succeeded but wrote no cubin:\n{}", where, out.log));
  return out;
}

// Entry names in declaration order, so KernelInfo order does not depend on the tool (ptxas and
// nvJitLink report kernels in different orders).
std::vector<std::string> ptx_entries(const std::string& ptx) {
  static const std::regex entry(R"(\.entry\s+([A-Za-z_$%][A-Za-z0-9_$]*))");
  std::vector<std::string> names;
  for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), entry); it != std::sregex_iterator(); ++it)
    names.push_back((*it)[1].str());
  return names;
}

}  // namespace

namespace detail {

void* open_cuda_library(const std::vector<std::string>& names, std::string& error) {
  std::vector<std::string> candidates = names;
  const std::string root = cuda_root();
  for (const char* sub : {"/lib64/", "/lib/"})
    for (const auto& n : names) candidates.push_back(root + sub + n);
  std::string reasons;
  for (const auto& c : candidates) {
    if (c.find('/') != std::string::npos && ::access(c.c_str(), F_OK) != 0) continue;
    if (void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      error.clear();
      return h;
    }
    const char* e = ::dlerror();
    if (!reasons.empty()) reasons += "; ";
    reasons += e ? e : c;
  }
  error = reasons.empty() ? fmt::format("{} not found", fmt::join(names, " / ")) : reasons;
  return nullptr;
}

void check_arch(const std::string& arch, const std::string& kernel_name, bool allow_compute) {
  static const std::regex sm(R"(sm_\d{2,3}[af]?)"), any(R"((sm|compute)_\d{2,3}[af]?)");
  if (!std::regex_match(arch, allow_compute ? any : sm))
    throw CompileError(fmt::format("tilejit: kernel '{}': invalid GPU architecture '{}' (expected {}like "
                                   "\"sm_90a\": sm_ followed by the compute capability and an optional a/f suffix)",
                                   kernel_name, arch, allow_compute ? "sm_NN or compute_NN, " : ""));
}

}  // namespace detail

std::string KernelInfo::to_string() const {
  return fmt::format("{} {}: {} registers, {} B shared, {} B spill stores, {} B spill loads, {} B stack", name, arch,
                     registers, shared_bytes, spill_store_bytes, spill_load_bytes, stack_frame_bytes);
}

std::string_view to_string(PtxTool tool) {
  switch (tool) {
    case PtxTool::Auto: return "auto";
    case PtxTool::NvJitLink: return "nvJitLink";
    case PtxTool::Ptxas: return "ptxas";
  }
  return "?";
}

std::string cuda_root() {
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    std::string v = env_or_empty(var);
    if (!v.empty()) return v;
  }
  return "/usr/local/cuda";
}

std::string find_ptxas() {
  if (std::string env = env_or_empty("TILEJIT_PTXAS"); !env.empty()) {
    // Made absolute because ptxas runs inside its temporary directory.
    if (env.find('/') != std::string::npos) return fs::absolute(env).string();
    // A bare name is looked up on PATH, as a shell would.
    const std::string path = env_or_empty("PATH");
    for (size_t b = 0; b <= path.size();) {
      size_t e = std::min(path.find(':', b), path.size());
      std::string c = fs::absolute(fs::path(e > b ? path.substr(b, e - b) : ".") / env).string();
      if (is_executable_file(c)) return c;
      b = e + 1;
    }
    return env;  // reported as not executable by the caller
  }
  const std::string path = env_or_empty("PATH");
  for (size_t b = 0; b <= path.size();) {
    size_t e = std::min(path.find(':', b), path.size());
    if (e > b) {
      std::string c = fs::absolute(fs::path(path.substr(b, e - b)) / "ptxas").string();
      if (is_executable_file(c)) return c;
    }
    b = e + 1;
  }
  std::string c = cuda_root() + "/bin/ptxas";
  return is_executable_file(c) ? c : std::string();
}

bool nvjitlink_available(std::string* why) {
  const NvJitLinkApi& api = nvjitlink_api();
  if (why) *why = api.error;
  return api.error.empty();
}

PtxTool resolve_ptx_tool(PtxTool tool) {
  if (tool != PtxTool::Auto) return tool;
  const std::string v = env_or_empty("TILEJIT_PTX_TOOL");
  if (v.empty()) return PtxTool::Auto;  // (ptx_to_cubin picks; cache keys keep saying "auto")
  std::string lower(v);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "ptxas") return PtxTool::Ptxas;
  if (lower == "nvjitlink") return PtxTool::NvJitLink;
  throw CompileError(fmt::format("tilejit: TILEJIT_PTX_TOOL='{}' is not a PTX assembler; valid: ptxas, nvjitlink (or unset: "
                                 "nvJitLink when it loads, else ptxas)", v));
}

std::string ptx_tool_versions() {
  const NvJitLinkApi& api = nvjitlink_api();
  std::string ptxas = find_ptxas();
  std::string pv = !ptxas.empty() && is_executable_file(ptxas) ? ptxas_version(ptxas) : "none";
  return fmt::format("nvJitLink {}; ptxas {}", api.error.empty() ? api.version_text : "none", pv);
}

std::vector<KernelInfo> parse_kernel_info(std::string_view log, std::string_view arch) {
  // Built once: std::regex construction costs far more than matching a short log.
  struct Patterns {
    std::regex entry{R"(Compiling entry function '([^']+)' for '([^']+)')"};
    // ptxas: "Function properties for vadd"; nvJitLink/nvlink link summary: "... for 'vadd':"
    std::regex props{R"(Function properties for (?:'([^']+)'|(\S+)))"};
    std::regex frame{R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)"};
    std::regex used{R"([Uu]sed (\d+) registers)"};
    std::regex smem{R"((\d+) bytes smem)"};
    std::regex cmem{R"((\d+) bytes cmem\[\d+\])"};
    std::regex cumulative{R"((\d+) bytes cumulative stack size)"};
    std::regex link_stack{R"((\d+) stack\b)"};
  };
  static const Patterns re;

  struct Raw {
    bool entry = false;
    std::string arch;
    // Figures from ptxas's own lines and from a link summary are kept apart: they disagree (the
    // link summary's smem includes the 1 KB the driver reserves per block once any is used).
    std::optional<int> regs_ptxas, smem_ptxas, cmem_ptxas, regs_link, smem_link, cmem_link;
    int frame = 0, spill_stores = 0, spill_loads = 0, call_stack = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Raw> raw;
  auto get = [&](const std::string& name) -> Raw& {
    auto [it, inserted] = raw.try_emplace(name);
    if (inserted) order.push_back(name);
    return it->second;
  };

  // Lines apply to the function named by the latest header; which kind of header it was tells
  // ptxas figures from link-summary ones.
  std::string target;
  bool link_section = false;
  size_t pos = 0;
  while (pos < log.size()) {
    size_t end = std::min(log.find('\n', pos), log.size());
    std::string line(log.substr(pos, end - pos));
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::smatch m;
    if (std::regex_search(line, m, re.entry)) {
      target = m[1].str();
      link_section = false;
      Raw& r = get(target);
      r.entry = true;
      r.arch = m[2].str();
    } else if (std::regex_search(line, m, re.props)) {
      link_section = m[1].matched;
      target = link_section ? m[1].str() : m[2].str();
      Raw& r = get(target);
      if (link_section) r.entry = true;  // link summaries list kernels only
    } else if (target.empty()) {
      continue;
    } else if (std::regex_search(line, m, re.frame)) {
      Raw& r = get(target);
      r.frame = std::stoi(m[1].str());
      r.spill_stores = std::stoi(m[2].str());
      r.spill_loads = std::stoi(m[3].str());
    } else if (std::regex_search(line, m, re.used)) {
      Raw& r = get(target);
      int regs = std::stoi(m[1].str());
      std::optional<int> smem;
      if (std::smatch s; std::regex_search(line, s, re.smem)) smem = std::stoi(s[1].str());
      std::optional<int> cmem;
      for (auto it = std::sregex_iterator(line.begin(), line.end(), re.cmem); it != std::sregex_iterator(); ++it)
        cmem = cmem.value_or(0) + std::stoi((*it)[1].str());
      if (std::smatch s; std::regex_search(line, s, re.cumulative))
        r.call_stack = std::max(r.call_stack, std::stoi(s[1].str()));
      if (std::smatch s; std::regex_search(line, s, re.link_stack))
        r.call_stack = std::max(r.call_stack, std::stoi(s[1].str()));
      if (link_section) {
        r.regs_link = regs;
        r.smem_link = smem;
        r.cmem_link = cmem;
      } else {
        r.regs_ptxas = regs;
        r.smem_ptxas = smem.value_or(0);  // ptxas omits "bytes smem" when there is none
        r.cmem_ptxas = cmem;
      }
    }
  }

  std::vector<KernelInfo> kernels;
  for (const auto& name : order) {
    const Raw& r = raw.at(name);
    if (!r.entry) continue;
    KernelInfo k;
    k.name = name;
    k.arch = r.arch.empty() ? std::string(arch) : r.arch;
    k.registers = r.regs_ptxas.value_or(r.regs_link.value_or(0));
    k.shared_bytes = r.regs_ptxas ? r.smem_ptxas.value_or(0) : r.smem_link.value_or(0);
    k.constant_bytes = r.cmem_ptxas ? *r.cmem_ptxas : r.cmem_link.value_or(0);
    k.spill_store_bytes = r.spill_stores;
    k.spill_load_bytes = r.spill_loads;
    k.stack_frame_bytes = std::max(r.frame, r.call_stack);
    kernels.push_back(std::move(k));
  }
  return kernels;
}

CubinResult ptx_to_cubin(const std::string& ptx, const std::string& arch, const std::string& kernel_name_for_errors,
                         PtxTool tool, const std::vector<std::string>& extra_options) {
  const auto start = Clock::now();
  const std::string& kernel = kernel_name_for_errors;
  detail::check_arch(arch, kernel, false);
  if (ptx.find_first_not_of(" \t\r\n") == std::string::npos)
    throw CompileError(fmt::format("tilejit: kernel '{}': the PTX to assemble for {} is empty", kernel, arch));

  std::string why;
  tool = resolve_ptx_tool(tool);
  if (tool == PtxTool::Auto) {
    // setmaxnreg (warp roles, a ring producer): nvJitLink's relocatable code keeps every role at
    // the register count at entry (the consumers' wgmma serialised: C7512, 3.7x slower on the
    // attention forward); ptxas's whole program gives each role its own
    if (ptx.find("setmaxnreg.") != std::string::npos && !find_ptxas().empty()) {
      tool = PtxTool::Ptxas;
    } else if (nvjitlink_available(&why)) {
      tool = PtxTool::NvJitLink;
    } else if (!find_ptxas().empty()) {
      tool = PtxTool::Ptxas;
    } else {
      throw CompileError(fmt::format(
          "tilejit: kernel '{}': cannot assemble PTX for {}: neither nvJitLink ({}) nor ptxas (set TILEJIT_PTXAS, "
          "PATH or CUDA_HOME) is available; install the CUDA 13 toolkit or load a prebuilt bundle",
          kernel, arch, why));
    }
  } else if (tool == PtxTool::NvJitLink && !nvjitlink_available(&why)) {
    throw CompileError(fmt::format("tilejit: kernel '{}': nvJitLink is not available: {} (use PtxTool::Ptxas or "
                                   "install the CUDA 13 toolkit)", kernel, why));
  }

  CubinResult out = tool == PtxTool::NvJitLink ? via_nvjitlink(ptx, arch, kernel, extra_options)
                                               : via_ptxas(ptx, arch, kernel, extra_options);
  static constexpr uint8_t elf_magic[4] = {0x7F, 'E', 'L', 'F'};
  if (out.cubin.size() < 4 || !std::equal(elf_magic, elf_magic + 4, out.cubin.begin()))
    throw CompileError(fmt::format("tilejit: kernel '{}': {} produced {} bytes that are not an ELF cubin", kernel,
                                   out.tool, out.cubin.size()));

  // One KernelInfo per .entry in declaration order; an entry the log does not describe still gets
  // one (figures 0) so that callers can rely on the names.
  std::vector<KernelInfo> parsed = parse_kernel_info(out.log, arch);
  for (const auto& name : ptx_entries(ptx)) {
    auto it = std::find_if(parsed.begin(), parsed.end(), [&](const KernelInfo& k) { return k.name == name; });
    if (it != parsed.end()) {
      out.kernels.push_back(std::move(*it));
      parsed.erase(it);
    } else if (std::none_of(out.kernels.begin(), out.kernels.end(), [&](const KernelInfo& k) { return k.name == name; })) {
      out.kernels.push_back(KernelInfo{.name = name, .arch = arch});
    }
  }
  for (auto& k : parsed) out.kernels.push_back(std::move(k));
  out.milliseconds = elapsed_ms(start);
  return out;
}

}  // namespace tilejit::jit
