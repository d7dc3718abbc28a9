// Executes tile IR for a whole grid on host memory with the exact rounding of every dtype, so
// kernels are testable without a GPU (and the GPU backend has a bit-exact reference to meet).
#pragma once
#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dsl/ir/function.hpp"
#include "runtime/host_tensor.hpp"

namespace tilejit::runtime {

struct Grid {
  int64_t x = 1, y = 1, z = 1;
};

// One kernel argument, matched by position to Function::params: a HostTensor for pointer and
// tensor parameters (the tensor must outlive the interpret() call), a number for scalars.
class Arg {
 public:
  enum class Kind : uint8_t { Buffer, Int, UInt, Float, Bool };

  Arg(HostTensor& t) : kind_(Kind::Buffer), tensor_(&t) {}
  Arg(bool v) : kind_(Kind::Bool), u_(v ? 1 : 0) {}
  // Every integer type, so that int, long, size_t, uint32_t... all convert without ambiguity.
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Arg(T v) {
    if constexpr (std::is_signed_v<T>) {
      kind_ = Kind::Int;
      i_ = static_cast<int64_t>(v);
    } else {
      kind_ = Kind::UInt;
      u_ = static_cast<uint64_t>(v);
    }
  }
  template <std::floating_point T>
  Arg(T v) : kind_(Kind::Float), f_(static_cast<double>(v)) {}

  Kind kind() const { return kind_; }
  HostTensor* tensor() const { return tensor_; }
  int64_t as_int() const { return i_; }
  uint64_t as_uint() const { return u_; }
  double as_double() const { return f_; }
  bool as_bool() const { return u_ != 0; }
  std::string describe() const;  // for error messages: "the buffer f32[1024]", "the integer 5"

 private:
  Kind kind_ = Kind::Int;
  HostTensor* tensor_ = nullptr;
  int64_t i_ = 0;
  uint64_t u_ = 0;
  double f_ = 0;
};

// A bad launch (arguments, grid) or a run-time fault of the kernel (out-of-bounds or misaligned
// access, non-positive loop step); the message names the kernel and, for faults, the op's source
// location, the program id and the tile element.
struct InterpretError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs every program of `grid` sequentially (z outer, then y, then x). Verifies `f` first
// (ir::VerifyError on malformed IR), then checks the arguments against the parameters and their
// ParamSpecs.
struct InterpretOptions {
  // Refuse what the GPU refuses (tile dims that are not powers of two, grid y or z above 65535), so
  // a kernel that runs here also compiles and launches; false runs such kernels on the CPU anyway.
  bool gpu_rules = true;
};
void interpret(const ir::Function& f, Grid grid, const std::vector<Arg>& args, InterpretOptions opts = {});

}  // namespace tilejit::runtime
