// CUDA C++ source -> PTX through nvrtc, loaded with dlopen at first use: the second backend's
// compiler. Its PTX then goes through ptx_to_cubin like the LLVM backend's.
#pragma once
#include <string>
#include <vector>

#include "jit/ptx_compiler.hpp"  // CompileError

namespace tilejit::jit {

struct NvrtcResult {
  std::string ptx;
  std::string log;          // nvrtc's warnings (empty when there are none)
  double milliseconds = 0;  // wall time of the whole call
};

// Compile `source` for `arch` ("sm_90a"; nvrtc is asked for compute_90a PTX, since with a
// compute_ target it returns no cubin). Options: -I<cuda root>/include and .../include/cccl (so
// <cuda/std/...> and <cuda_bf16.h> resolve), --std=c++17, -default-device; no --use_fast_math,
// because exact IEEE division and sqrt are what the reference interpreter computes.
// `extra_options` are appended verbatim. `program_name` names the source in nvrtc's messages and
// in CompileError. Throws CompileError when nvrtc is missing or the source does not compile.
NvrtcResult nvrtc_compile(const std::string& source, const std::string& program_name, const std::string& arch,
                          const std::vector<std::string>& extra_options = {});

// "nvrtc 13.0", or "nvrtc none" where the library does not load; part of compile-cache keys.
std::string nvrtc_version();

// Whether libnvrtc loads here; when it does not, `why` (if given) receives the reason.
bool nvrtc_available(std::string* why = nullptr);

}  // namespace tilejit::jit
