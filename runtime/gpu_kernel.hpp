// A JIT-compiled kernel loaded on the GPU and called with device tensors and numbers: checks the
// arguments against the kernel's signature, flattens them to the kernel ABI and launches.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/compile.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::runtime {

// One argument: a DeviceTensor for pointer and tensor parameters, a number for scalars.
class DeviceArg {
 public:
  DeviceArg(const DeviceTensor& t) : tensor_(&t) {}  // NOLINT: implicit on purpose
  template <class T>
    requires std::is_arithmetic_v<T>
  DeviceArg(T v) : number_(v) {}  // NOLINT
  const DeviceTensor* tensor() const { return tensor_; }
  const Arg& number() const { return number_; }

 private:
  const DeviceTensor* tensor_ = nullptr;
  Arg number_{0};
};

class GpuKernel {
 public:
  // `signature` is the ir::Function the kernel was compiled from (parameters and specs).
  GpuKernel(const ir::Function& signature, jit::CompiledKernel compiled, int device = 0);
  // Asynchronous launch of `grid` programs on `stream`; throws InterpretError-style
  // std::invalid_argument for bad arguments (naming kernel, argument and value), DeviceError for
  // driver failures.
  void operator()(Grid grid, const std::vector<DeviceArg>& args, CUstream stream = nullptr) const;
  const jit::CompiledKernel& compiled() const { return compiled_; }

 private:
  std::vector<ir::Param> params_;
  std::string name_;
  jit::CompiledKernel compiled_;
  Module module_;
  CUfunction function_ = nullptr;
  int device_ = 0;
  // TMA tensor maps live in global memory; re-uploaded only when an argument's layout changes.
  mutable DeviceBuffer tensor_maps_;
  mutable std::vector<uint8_t> uploaded_maps_;
};

}  // namespace tilejit::runtime
