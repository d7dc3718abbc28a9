// Host-side strided tensors for the interpreter, tests and examples, plus the exact per-dtype
// element encoding and conversion rules that both HostTensor and the interpreter rely on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dsl/ir/type.hpp"

namespace tilejit::runtime {

// One element of a dtype, as the interpreter and HostTensor hold it: floats as a double that is
// exactly representable in the dtype, integers/i1 as int64_t (sign- or zero-extended by the dtype,
// u64 as its bit pattern). A float NaN keeps its sign and payload in the double's top mantissa
// bits, so memory round trips and bitcasts are bit-exact. These rules are shared so that a value
// written by one and read by the other never changes.
namespace element {

// Round `x` to the nearest value of the float dtype `t` (RNE, no double rounding: an inexact step
// through f32 rounds to odd). f64 returns x unchanged.
double round_float(ir::DType t, double x);
// An integer (`v` as stored for `src`: signed or unsigned) converted to the float dtype `t`,
// rounded once to nearest even.
double int_to_float(ir::DType t, int64_t v, ir::DType src);
// Float -> integer dtype: truncation toward zero, saturation at the range, NaN -> 0 (PTX
// cvt.rzi.sat); i1: x != 0.
int64_t float_to_int(ir::DType t, double x);
// Integer -> integer: sign/zero extension already happened when `v` was stored; wrap to `t`.
// i1: v != 0.
int64_t int_to_int(ir::DType t, int64_t v);
// The bits of a stored element (low bit_width bits) and back.
uint64_t to_bits(ir::DType t, double f, int64_t i);
void from_bits(ir::DType t, uint64_t bits, double& f, int64_t& i);

// Memory encoding: `p` points at byte_size(t) bytes (alignment not required).
double read_float(ir::DType t, const std::byte* p);
int64_t read_int(ir::DType t, const std::byte* p);  // i1: any non-zero byte reads as 1
void write_float(ir::DType t, std::byte* p, double v);
void write_int(ir::DType t, std::byte* p, int64_t v);

}  // namespace element

class HostTensor {
 public:
  static constexpr size_t kAlignment = 256;  // satisfies any ParamSpec::align_bytes a kernel can ask

  HostTensor() = default;
  HostTensor(ir::DType dtype, ir::Shape sizes);                     // contiguous row-major
  HostTensor(ir::DType dtype, ir::Shape sizes, ir::Shape strides);  // strides in elements, >= 0
  HostTensor(const HostTensor& other);                              // deep copy
  HostTensor& operator=(const HostTensor& other);
  HostTensor(HostTensor&& other) noexcept;  // leaves `other` empty (numel 0, no allocation)
  HostTensor& operator=(HostTensor&& other) noexcept;
  ~HostTensor() = default;

  ir::DType dtype() const { return dtype_; }
  const ir::Shape& sizes() const { return sizes_; }
  const ir::Shape& strides() const { return strides_; }
  int rank() const { return static_cast<int>(sizes_.size()); }
  int64_t numel() const { return numel_; }  // logical element count

  // The whole allocation (for a strided tensor this includes the elements between rows).
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

  // Logical index -> value (ints exact up to 2^53; narrow floats decoded). The initializer_list
  // overloads let reference loops write t.get({b, h, i, d}) without a heap allocation per call.
  double get(const std::vector<int64_t>& index) const;
  double get(std::initializer_list<int64_t> index) const;
  // Rounds with the dtype's rule: RNE for floats; ints truncate toward zero then wrap (a NaN or
  // infinity for an int dtype throws); i1 stores v != 0.
  void set(const std::vector<int64_t>& index, double v);
  void set(std::initializer_list<int64_t> index, double v);
  double get_flat(int64_t i) const;  // i = logical row-major position
  void set_flat(int64_t i, double v);
  std::vector<double> to_f64() const;  // logical row-major

  // Reproducible on every platform: std::mt19937_64 with hand-written distributions (the
  // standard ones are implementation-defined). Values are rounded to the dtype; for int dtypes
  // fill_uniform draws integers in [ceil(lo), floor(hi)].
  void fill_uniform(uint64_t seed, double lo, double hi);
  void fill_normal(uint64_t seed, double mean, double stddev);
  // Large float tensors fast (tuning problems: fill_normal took ~2 s per 33M elements): chunks of
  // 2^20 elements, each with its own generator seeded from (seed, chunk), filled on `threads` threads
  // (0: every core); the values depend on the seed only, not on the thread count, but differ from
  // fill_normal / fill_uniform's. Float dtypes only (std::invalid_argument otherwise).
  void fill_normal_parallel(uint64_t seed, double mean, double stddev, unsigned threads = 0);
  void fill_uniform_parallel(uint64_t seed, double lo, double hi, unsigned threads = 0);
  void fill(double v);
  // Every byte 0xFF (NaN for floats, -1 for ints, 1 for i1) so unwritten outputs are visible.
  void poison();

  std::string describe() const;  // "f32[4,8]" (plus strides when not contiguous)

 private:
  struct AlignedDelete {
    void operator()(std::byte* p) const;
  };

  int64_t offset_of(const int64_t* index, size_t n) const;  // in elements, checked
  int64_t offset_of_flat(int64_t i) const;
  void allocate();

  ir::DType dtype_ = ir::DType::f32;
  ir::Shape sizes_;
  ir::Shape strides_;
  int64_t numel_ = 0;
  size_t bytes_ = 0;
  std::unique_ptr<std::byte[], AlignedDelete> data_;
};

// ||got - ref||_2 / ||ref||_2 (||got||_2 when ref is all zeros). A NaN anywhere gives NaN, never a
// small number. Throws std::invalid_argument when the sizes differ.
double rel_error(const std::vector<double>& got, const std::vector<double>& ref);
// max |got - ref|; NaN if any difference is NaN.
double max_abs_error(const std::vector<double>& got, const std::vector<double>& ref);

}  // namespace tilejit::runtime
