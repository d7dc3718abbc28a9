// Calling a kernel like a C++ function: tilejit::compile(kernel, meta) gives a Function that
// JIT-compiles on its first call (through the compile cache) and launches with checked arguments.
#pragma once
#include <array>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "dsl/builder.hpp"
#include "jit/compile.hpp"
#include "runtime/gpu_kernel.hpp"

namespace tilejit {

// A kernel specialised for one meta binding and schedule, compiled on first use (through the
// compile cache), then launched with arguments checked against the signature.
//
//   auto add = tilejit::compile(vector_add, {{"BLOCK", 1024}});
//   add({cdiv(n, 1024)}, stream, x, y, out, n);   // DeviceTensors and numbers, in parameter order
//
// The first call builds the tile IR, checks the arguments (before anything is compiled), compiles
// (runtime::compile_cached: memory, then disk, then the JIT) and loads the module. Later calls
// only check and pack the arguments into a stack buffer and call cuLaunchKernel: no hashing, no
// lookups, no allocation (kernels with TMA descriptors also take a mutex and compare the TMA
// tensors' layouts with the previous launch's). After the first call a Function may be called
// from several threads at once; concurrent first calls compile once.
//
// Arguments that hold more than the parameters declare -- 16-byte aligned tensors and pointers,
// unit innermost strides, integers that are multiples of 16 -- get a variant compiled for those
// facts (as Triton specialises; runtime/specialization.hpp), once per combination; a call whose
// combination differs from the previous call's takes a lock to find its variant.
class Function {
 public:
  // `device` is the GPU whose primary context loads the module and runs the kernel.
  Function(const lang::Kernel& k, lang::Meta meta = {}, jit::CompileOptions opts = {}, int device = 0);
  Function(Function&&) noexcept;
  Function& operator=(Function&&) noexcept;
  ~Function();

  // Arguments in parameter order: DeviceTensor (or runtime::TensorView) for pointer and tensor
  // parameters, arithmetic values for scalars. Throws std::invalid_argument for bad arguments or
  // grid, runtime::DeviceError for driver failures (and without a GPU), the JIT's errors on the
  // first call.
  template <class... Args>
  void operator()(runtime::Grid grid, CUstream stream, const Args&... args) {
    static_assert((std::is_constructible_v<runtime::DeviceArg, const Args&> && ...),
                  "tilejit::Function arguments are DeviceTensor, runtime::TensorView or arithmetic values");
    const std::array<runtime::DeviceArg, sizeof...(Args)> packed{runtime::DeviceArg(args)...};
    launch(grid, stream, packed);
  }
  template <class... Args>
  void operator()(runtime::Grid grid, const runtime::Stream& stream, const Args&... args) {
    (*this)(grid, stream.handle(), args...);
  }
  // The dynamic form (argument lists built at run time).
  void launch(runtime::Grid grid, CUstream stream, std::span<const runtime::DeviceArg> args);

  // The checks a launch makes (with those of the TMA layout once compiled), without compiling,
  // loading or launching anything: works without a GPU.
  void check(runtime::Grid grid, std::span<const runtime::DeviceArg> args) const;
  template <class... Args>
  void check(runtime::Grid grid, const Args&... args) const {
    const std::array<runtime::DeviceArg, sizeof...(Args)> packed{runtime::DeviceArg(args)...};
    check(grid, std::span<const runtime::DeviceArg>(packed));
  }

  // The variant as declared (no specialisation):
  const jit::CompiledKernel& compiled();   // compiles if needed (no GPU needed)
  const ir::Function& signature() const;   // builds the tile IR if needed
  const runtime::GpuKernel& gpu_kernel();  // compiles and loads if needed (needs a GPU)
  bool loaded() const;                     // whether a module is loaded (a call succeeded)
  // Launch-time specialisation (CompileOptions::specialize, runtime/specialization.hpp): the key
  // of the variant these arguments get (0: the declared one), and that variant compiled.
  uint64_t specialization(std::span<const runtime::DeviceArg> args) const;
  const jit::CompiledKernel& compiled(std::span<const runtime::DeviceArg> args);
  const std::string& name() const;
  const lang::Meta& meta() const;
  const jit::CompileOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Function(k, meta, opts, device): nothing is built or compiled until the first call.
Function compile(const lang::Kernel& k, lang::Meta meta = {}, jit::CompileOptions opts = {}, int device = 0);

}  // namespace tilejit
