// PTX text -> cubin for one GPU architecture, through nvJitLink (loaded with dlopen) or a ptxas
// subprocess, plus the per-kernel resource figures (registers, shared memory, spills) ptxas reports.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tilejit::jit {

// What the assembler reports for one kernel (.entry) of a module. Users read it to check register
// pressure and spills; the CLI prints to_string().
struct KernelInfo {
  std::string name;               // the PTX entry name (mangled if the source was C++)
  std::string arch;               // e.g. "sm_90a"
  int registers = 0;              // per thread
  int shared_bytes = 0;           // static shared memory per block (dynamic smem is a launch setting)
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  // Per-thread stack: the larger of the kernel's own frame and the whole call tree's stack where
  // the tool reports it (ptxas "cumulative stack size", nvJitLink's link summary).
  int stack_frame_bytes = 0;
  // Sum of the kernel's constant banks (cmem[N]: parameters, driver constants, literals). ptxas 13
  // no longer prints them, so only nvJitLink (and older ptxas versions) fill this in.
  int constant_bytes = 0;

  // One line, e.g. "gemm sm_90a: 128 registers, 0 B shared, 0 B spill stores, 0 B spill loads, 0 B stack"
  std::string to_string() const;
};

struct CubinResult {
  std::vector<uint8_t> cubin;        // an ELF image for the driver (cuModuleLoadData)
  std::vector<KernelInfo> kernels;   // one per .entry, in the order the PTX declares them
  std::string log;                   // the tool's full info/warning output
  std::string tool;                  // "nvJitLink 13.0" or "ptxas 13.0.88"
  double milliseconds = 0;           // wall time of the whole call
};

enum class PtxTool {
  Auto,       // nvJitLink when its library loads, else ptxas; ptxas first for PTX with setmaxnreg
  NvJitLink,  // in process, no temporary files
  Ptxas,      // subprocess; the reference tool that DESIGN's CI figures come from
};
std::string_view to_string(PtxTool tool);

// Every failure to produce code (bad PTX, missing tool, bad arch). The message names the kernel
// and carries the tool's error log, so it can be shown to a user as is.
struct CompileError : std::runtime_error {
  using runtime_error::runtime_error;
};

// Assemble `ptx` for `arch` ("sm_90a", "sm_90", "sm_100a", ...). `extra_options` go to the chosen
// tool verbatim, so they are tool specific (nvJitLink: "-Xptxas=--maxrregcount=128", "-lineinfo";
// ptxas: "--maxrregcount=128", "-lineinfo"). Thread safe: the autotuner compiles in parallel.
CubinResult ptx_to_cubin(const std::string& ptx, const std::string& arch,
                         const std::string& kernel_name_for_errors, PtxTool tool = PtxTool::Auto,
                         const std::vector<std::string>& extra_options = {});

// What PtxTool::Auto means in this process: $TILEJIT_PTX_TOOL ("ptxas" or "nvjitlink", e.g. to
// compare the two: nvJitLink assembles relocatable code, ptxas whole-program code, and the SASS
// differs); Auto itself when it is unset (ptx_to_cubin then takes nvJitLink when it loads, else
// ptxas). Other tools are returned as given. Any other value of the variable is a CompileError
// that names it. Compile-cache keys hold the result.
PtxTool resolve_ptx_tool(PtxTool tool);

// The versions of both tools, e.g. "nvJitLink 13.0; ptxas 13.0.88" ("none" for a missing one).
// Different assemblers may produce different code, so this belongs in compile-cache keys.
std::string ptx_tool_versions();

// Whether libnvJitLink loads here; when it does not, `why` (if given) receives the reason.
bool nvjitlink_available(std::string* why = nullptr);

// The ptxas that PtxTool::Ptxas would run: $TILEJIT_PTXAS if set (no fallback: an explicit choice
// that is wrong must be reported, not papered over), else the first on $PATH, else
// <cuda root>/bin/ptxas. Empty when there is none.
std::string find_ptxas();

// The CUDA toolkit root: $CUDA_HOME, else $CUDA_PATH, else /usr/local/cuda (which may not exist).
std::string cuda_root();

// Parse the verbose output of ptxas (-v) or nvJitLink (-verbose) into one KernelInfo per entry
// function, in the order the log first names them. Tolerates the formats of older ptxas versions
// (cmem banks and cumulative stack on the "Used N registers" line) and nvlink-style link
// summaries. `arch` fills KernelInfo::arch where the log does not say.
std::vector<KernelInfo> parse_kernel_info(std::string_view log, std::string_view arch);

namespace detail {
// dlopen (RTLD_NOW | RTLD_LOCAL) the first of `names` that loads, trying each as given (the
// loader's search path) and then under <cuda root>/lib64 and <cuda root>/lib. Returns nullptr and
// the loader's reasons in `error` when none does. Handles are never closed: the CUDA libraries
// keep process-wide state and unloading them is not supported.
void* open_cuda_library(const std::vector<std::string>& names, std::string& error);
// "sm_90a"-style architecture check shared by the tools; throws CompileError naming the kernel,
// the value and the accepted form.
void check_arch(const std::string& arch, const std::string& kernel_name, bool allow_compute);
}  // namespace detail

}  // namespace tilejit::jit
