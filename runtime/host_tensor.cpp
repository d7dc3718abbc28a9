// Host tensors and the exact element conversions shared with the interpreter.
#include "runtime/host_tensor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace tilejit::runtime {

using ir::DType;

namespace element {
namespace {

template <class T>
T load_as(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void store_as(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Round-to-odd from double to float: the float neighbour of x whose last mantissa bit is 1 when x
// is not exact. A second RNE rounding to any format with at most 22 mantissa bits then gives the
// same result as rounding x directly, which RNE-through-f32 would not (ties created by the first
// rounding).
float to_float_odd(double x) {
  if (std::isnan(x) || std::isinf(x)) return static_cast<float>(x);
  if (std::fabs(x) > static_cast<double>(FLT_MAX)) return std::copysign(FLT_MAX, static_cast<float>(x));  // odd bits
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x) return f;
  if (std::bit_cast<uint32_t>(f) & 1u) return f;
  return std::nextafter(f, x > static_cast<double>(f) ? INFINITY : -INFINITY);
}

// |v| as stored for `src`, rounded to odd at 53 bits, with its sign: exact for |v| < 2^53 and a
// correct first step toward any narrower float otherwise.
double int_to_double_odd(int64_t v, bool is_unsigned) {
  bool neg = !is_unsigned && v < 0;
  uint64_t mag = neg ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  if (mag >= (uint64_t{1} << 53)) {
    int s = 64 - std::countl_zero(mag) - 53;
    uint64_t low = mag & ((uint64_t{1} << s) - 1);
    mag = (mag >> s) << s;
    if (low) mag |= uint64_t{1} << s;
  }
  double d = static_cast<double>(mag);  // exact: at most 53 significant bits
  return neg ? -d : d;
}

// A NaN keeps its sign and payload in the top mantissa bits of the double, so loads, stores,
// bitcasts and copies give back the exact bits; double arithmetic on it yields a quiet NaN, as
// the GPU's does. (A plain float -> double conversion would quiet signalling NaNs.)
double nan_with_payload(bool negative, uint64_t mant, int mbits) {
  return std::bit_cast<double>((uint64_t{negative} << 63) | (uint64_t{0x7FF} << 52) | (mant << (52 - mbits)));
}

uint64_t nan_payload(double x, int mbits) {
  uint64_t m = (std::bit_cast<uint64_t>(x) >> (52 - mbits)) & ((uint64_t{1} << mbits) - 1);
  return m ? m : uint64_t{1} << (mbits - 1);  // payload only in bits the format lacks: quiet NaN
}

bool sign_bit(double x) { return (std::bit_cast<uint64_t>(x) >> 63) != 0; }

double decode(DType t, uint64_t bits) {
  switch (t) {
    case DType::f64: return std::bit_cast<double>(bits);
    case DType::f32: {
      auto u = static_cast<uint32_t>(bits);
      if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return nan_with_payload(u >> 31, u & 0x7FFFFFu, 23);
      return std::bit_cast<float>(u);
    }
    case DType::f16: {
      auto h = static_cast<uint16_t>(bits);
      if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu)) return nan_with_payload(h >> 15, h & 0x3FFu, 10);
      return ir::f16_bits_to_f32(h);
    }
    case DType::bf16: {
      auto h = static_cast<uint16_t>(bits);
      if ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu)) return nan_with_payload(h >> 15, h & 0x7Fu, 7);
      return ir::bf16_bits_to_f32(h);
    }
    case DType::f8e4m3: {
      auto b = static_cast<uint8_t>(bits);
      if ((b & 0x7Fu) == 0x7Fu) return nan_with_payload(b >> 7, 7, 3);
      return ir::f8e4m3_bits_to_f32(b);
    }
    case DType::f8e5m2: {
      auto b = static_cast<uint8_t>(bits);
      if ((b & 0x7Cu) == 0x7Cu && (b & 3u)) return nan_with_payload(b >> 7, b & 3u, 2);
      return ir::f8e5m2_bits_to_f32(b);
    }
    default: throw std::logic_error(fmt::format("decode: {} is not a float dtype", ir::name(t)));
  }
}

// `x` must already be representable in `t` (or NaN).
uint64_t encode(DType t, double x) {
  if (t == DType::f64) return std::bit_cast<uint64_t>(x);
  if (std::isnan(x)) {
    const uint64_t s = sign_bit(x);
    switch (t) {
      case DType::f32: return (s << 31) | 0x7F800000u | nan_payload(x, 23);
      case DType::f16: return (s << 15) | 0x7C00u | nan_payload(x, 10);
      case DType::bf16: return (s << 15) | 0x7F80u | nan_payload(x, 7);
      case DType::f8e4m3: return (s << 7) | 0x7Fu;
      case DType::f8e5m2: return (s << 7) | 0x7Cu | nan_payload(x, 2);
      default: break;
    }
  }
  const auto f = static_cast<float>(x);
  switch (t) {
    case DType::f32: return std::bit_cast<uint32_t>(f);
    case DType::f16: return ir::f32_to_f16_bits(f);
    case DType::bf16: return ir::f32_to_bf16_bits(f);
    case DType::f8e4m3: return ir::f32_to_f8e4m3_bits(f);
    case DType::f8e5m2: return ir::f32_to_f8e5m2_bits(f);
    default: throw std::logic_error(fmt::format("encode: {} is not a float dtype", ir::name(t)));
  }
}

}  // namespace

double round_float(DType t, double x) {
  switch (t) {
    case DType::f64: return x;
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    case DType::f16: case DType::bf16: case DType::f8e4m3: case DType::f8e5m2:
      return static_cast<double>(ir::round_to(t, to_float_odd(x)));
    default: throw std::logic_error(fmt::format("round_float: {} is not a float dtype", ir::name(t)));
  }
}

double int_to_float(DType t, int64_t v, DType src) {
  bool is_unsigned = !ir::is_signed(src);
  if (t == DType::f64) return is_unsigned ? static_cast<double>(static_cast<uint64_t>(v)) : static_cast<double>(v);
  return round_float(t, int_to_double_odd(v, is_unsigned));
}

int64_t float_to_int(DType t, double x) { return ir::float_to_int(t, x); }

int64_t int_to_int(DType t, int64_t v) {
  if (t == DType::i1) return v != 0 ? 1 : 0;
  return ir::wrap_int(t, v);
}

uint64_t to_bits(DType t, double f, int64_t i) {
  if (ir::is_float(t)) return encode(t, f);
  const int w = ir::bit_width(t);
  const auto u = static_cast<uint64_t>(i);
  return w == 64 ? u : u & ((uint64_t{1} << w) - 1);
}

void from_bits(DType t, uint64_t bits, double& f, int64_t& i) {
  if (ir::is_float(t)) f = decode(t, bits);
  else i = ir::wrap_int(t, static_cast<int64_t>(bits));
}

double read_float(DType t, const std::byte* p) {
  switch (ir::byte_size(t)) {
    case 1: return decode(t, load_as<uint8_t>(p));
    case 2: return decode(t, load_as<uint16_t>(p));
    case 4: return decode(t, load_as<uint32_t>(p));
    default: return decode(t, load_as<uint64_t>(p));
  }
}

int64_t read_int(DType t, const std::byte* p) {
  switch (t) {
    case DType::i1: return load_as<uint8_t>(p) != 0 ? 1 : 0;
    case DType::i8: return load_as<int8_t>(p);
    case DType::i16: return load_as<int16_t>(p);
    case DType::i32: return load_as<int32_t>(p);
    case DType::i64: return load_as<int64_t>(p);
    case DType::u8: return load_as<uint8_t>(p);
    case DType::u16: return load_as<uint16_t>(p);
    case DType::u32: return load_as<uint32_t>(p);
    case DType::u64: return static_cast<int64_t>(load_as<uint64_t>(p));
    default: throw std::logic_error(fmt::format("read_int: {} is not an integer dtype", ir::name(t)));
  }
}

void write_float(DType t, std::byte* p, double v) {
  const uint64_t bits = encode(t, v);
  switch (ir::byte_size(t)) {
    case 1: store_as(p, static_cast<uint8_t>(bits)); return;
    case 2: store_as(p, static_cast<uint16_t>(bits)); return;
    case 4: store_as(p, static_cast<uint32_t>(bits)); return;
    default: store_as(p, bits); return;
  }
}

void write_int(DType t, std::byte* p, int64_t v) {
  switch (t) {
    case DType::i1: store_as(p, static_cast<uint8_t>(v != 0)); return;
    case DType::i8: case DType::u8: store_as(p, static_cast<uint8_t>(v)); return;
    case DType::i16: case DType::u16: store_as(p, static_cast<uint16_t>(v)); return;
    case DType::i32: case DType::u32: store_as(p, static_cast<uint32_t>(v)); return;
    case DType::i64: case DType::u64: store_as(p, static_cast<uint64_t>(v)); return;
    default: throw std::logic_error(fmt::format("write_int: {} is not an integer dtype", ir::name(t)));
  }
}

}  // namespace element

namespace {

// Truncate toward zero, then wrap modulo 2^64 (and then to the dtype), as HostTensor::set promises.
int64_t truncate_and_wrap(DType t, double v) {
  if (!std::isfinite(v))
    throw std::invalid_argument(fmt::format("HostTensor::set: {} cannot be stored in an {} tensor", v, ir::name(t)));
  if (t == DType::i1) return v != 0 ? 1 : 0;
  double tr = std::trunc(v);
  if (std::fabs(tr) < 0x1.0p63) return ir::wrap_int(t, static_cast<int64_t>(tr));
  // |tr| >= 2^63 is a multiple of 2^11, so fmod and the shift by 2^64 below are exact.
  double m = std::fmod(tr, 0x1.0p64);
  if (m < -0x1.0p63) m += 0x1.0p64;
  int64_t bits = m >= 0x1.0p63 ? static_cast<int64_t>(static_cast<uint64_t>(m)) : static_cast<int64_t>(m);
  return ir::wrap_int(t, bits);
}

// Uniform in [0, 1) with 53 random bits: the same sequence on every standard library.
double unit_uniform(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

}  // namespace

void HostTensor::AlignedDelete::operator()(std::byte* p) const {
  ::operator delete(p, std::align_val_t{kAlignment});
}

HostTensor::HostTensor(DType dtype, ir::Shape sizes) : dtype_(dtype), sizes_(std::move(sizes)) {
  strides_.assign(sizes_.size(), 1);
  for (size_t d = sizes_.size(); d-- > 1;) strides_[d - 1] = strides_[d] * std::max<int64_t>(sizes_[d], 1);
  allocate();
}

HostTensor::HostTensor(DType dtype, ir::Shape sizes, ir::Shape strides)
    : dtype_(dtype), sizes_(std::move(sizes)), strides_(std::move(strides)) {
  if (strides_.size() != sizes_.size())
    throw std::invalid_argument(fmt::format("HostTensor: {} strides given for {} sizes", strides_.size(), sizes_.size()));
  for (int64_t s : strides_)
    if (s < 0) throw std::invalid_argument(fmt::format("HostTensor: strides must be non-negative, got {}", ir::shape_string(strides_)));
  allocate();
}

HostTensor::HostTensor(const HostTensor& o)
    : dtype_(o.dtype_), sizes_(o.sizes_), strides_(o.strides_), numel_(o.numel_), bytes_(o.bytes_) {
  if (o.data_) {
    data_.reset(static_cast<std::byte*>(::operator new(bytes_, std::align_val_t{kAlignment})));
    std::memcpy(data_.get(), o.data_.get(), bytes_);
  }
}

HostTensor::HostTensor(HostTensor&& o) noexcept
    : dtype_(o.dtype_),
      sizes_(std::exchange(o.sizes_, {})),
      strides_(std::exchange(o.strides_, {})),
      numel_(std::exchange(o.numel_, 0)),
      bytes_(std::exchange(o.bytes_, 0)),
      data_(std::move(o.data_)) {}

HostTensor& HostTensor::operator=(HostTensor&& o) noexcept {
  if (this != &o) {
    dtype_ = o.dtype_;
    sizes_ = std::exchange(o.sizes_, {});
    strides_ = std::exchange(o.strides_, {});
    numel_ = std::exchange(o.numel_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    data_ = std::move(o.data_);
  }
  return *this;
}

HostTensor& HostTensor::operator=(const HostTensor& o) {
  if (this != &o) *this = HostTensor(o);
  return *this;
}

void HostTensor::allocate() {
  constexpr int64_t kMaxElements = int64_t{1} << 40;  // far beyond host memory; keeps products exact
  numel_ = 1;
  int64_t max_offset = 0;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    if (sizes_[d] < 0) throw std::invalid_argument(fmt::format("HostTensor: sizes must be non-negative, got {}", ir::shape_string(sizes_)));
    if (sizes_[d] > kMaxElements || (sizes_[d] > 0 && numel_ > kMaxElements / sizes_[d]))
      throw std::length_error(fmt::format("HostTensor: {} {} has more than 2^40 elements (valid: at most 2^40)",
                                          ir::name(dtype_), ir::shape_string(sizes_)));
    numel_ *= sizes_[d];
    if (sizes_[d] > 0) {
      if (strides_[d] > kMaxElements)
        throw std::length_error(fmt::format("HostTensor: stride {} is larger than 2^40 elements", strides_[d]));
      max_offset += (sizes_[d] - 1) * strides_[d];
      if (max_offset > kMaxElements)
        throw std::length_error(fmt::format("HostTensor: {} {} with strides {} spans more than 2^40 elements (valid: at most 2^40)",
                                            ir::name(dtype_), ir::shape_string(sizes_), ir::shape_string(strides_)));
    }
  }
  int64_t elements = numel_ == 0 ? 0 : max_offset + 1;
  bytes_ = static_cast<size_t>(elements) * static_cast<size_t>(ir::byte_size(dtype_));
  try {
    data_.reset(static_cast<std::byte*>(::operator new(bytes_, std::align_val_t{kAlignment})));
  } catch (const std::bad_alloc&) {  // name the tensor and the size, not just "std::bad_alloc"
    throw std::length_error(fmt::format("HostTensor: {} {} needs {:.1f} GiB of host memory, which could not be allocated",
                                        ir::name(dtype_), ir::shape_string(sizes_), static_cast<double>(bytes_) / (1 << 30)));
  }
  poison();
}

int64_t HostTensor::offset_of(const int64_t* index, size_t n) const {
  if (n != sizes_.size())
    throw std::out_of_range(fmt::format("HostTensor {}: index [{}] has {} coordinates, the tensor has rank {}", describe(),
                                        fmt::join(index, index + n, ","), n, sizes_.size()));
  int64_t off = 0;
  for (size_t d = 0; d < n; ++d) {
    if (index[d] < 0 || index[d] >= sizes_[d])
      throw std::out_of_range(fmt::format("HostTensor {}: index [{}] is out of range in dim {}", describe(),
                                          fmt::join(index, index + n, ","), d));
    off += index[d] * strides_[d];
  }
  return off;
}

int64_t HostTensor::offset_of_flat(int64_t i) const {
  if (i < 0 || i >= numel_)
    throw std::out_of_range(fmt::format("HostTensor {}: flat index {} is out of range [0, {})", describe(), i, numel_));
  int64_t off = 0;
  for (size_t d = sizes_.size(); d-- > 0;) {
    off += (i % sizes_[d]) * strides_[d];
    i /= sizes_[d];
  }
  return off;
}

namespace {

double read_value(DType t, const std::byte* p) {
  if (ir::is_float(t)) return element::read_float(t, p);
  int64_t v = element::read_int(t, p);
  return t == DType::u64 ? static_cast<double>(static_cast<uint64_t>(v)) : static_cast<double>(v);
}

void write_value(DType t, std::byte* p, double v) {
  if (ir::is_float(t)) element::write_float(t, p, element::round_float(t, v));
  else element::write_int(t, p, truncate_and_wrap(t, v));
}

}  // namespace

double HostTensor::get(const std::vector<int64_t>& index) const {
  return read_value(dtype_, data_.get() + offset_of(index.data(), index.size()) * ir::byte_size(dtype_));
}

double HostTensor::get(std::initializer_list<int64_t> index) const {
  return read_value(dtype_, data_.get() + offset_of(index.begin(), index.size()) * ir::byte_size(dtype_));
}

void HostTensor::set(const std::vector<int64_t>& index, double v) {
  write_value(dtype_, data_.get() + offset_of(index.data(), index.size()) * ir::byte_size(dtype_), v);
}

void HostTensor::set(std::initializer_list<int64_t> index, double v) {
  write_value(dtype_, data_.get() + offset_of(index.begin(), index.size()) * ir::byte_size(dtype_), v);
}

double HostTensor::get_flat(int64_t i) const {
  return read_value(dtype_, data_.get() + offset_of_flat(i) * ir::byte_size(dtype_));
}

void HostTensor::set_flat(int64_t i, double v) {
  write_value(dtype_, data_.get() + offset_of_flat(i) * ir::byte_size(dtype_), v);
}

std::vector<double> HostTensor::to_f64() const {
  std::vector<double> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[static_cast<size_t>(i)] = get_flat(i);
  return out;
}

void HostTensor::fill_uniform(uint64_t seed, double lo, double hi) {
  std::mt19937_64 g(seed);
  if (ir::is_float(dtype_)) {
    for (int64_t i = 0; i < numel_; ++i) set_flat(i, lo + (hi - lo) * unit_uniform(g));
    return;
  }
  // Integers: [ceil(lo), floor(hi)] clipped to the dtype's range, drawn as lo_bits + r with r
  // uniform in [0, span] by rejection, all in uint64 so that no step overflows.
  const int w = ir::bit_width(dtype_);
  const bool sgn = ir::is_signed(dtype_);
  const double dmin = sgn ? -std::ldexp(1.0, w - 1) : 0.0, dend = std::ldexp(1.0, sgn ? w - 1 : w);
  double clo = std::max(std::ceil(lo), dmin), chi = std::floor(hi);
  if (!(clo <= chi) || clo >= dend)
    throw std::invalid_argument(fmt::format("HostTensor::fill_uniform: no {} integers in [{}, {}]", ir::name(dtype_), lo, hi));
  auto bits_of = [](double x) {  // an integral double in [-2^63, 2^64) as two's complement bits
    return x < 0 ? static_cast<uint64_t>(static_cast<int64_t>(x)) : static_cast<uint64_t>(x);
  };
  const uint64_t lo_bits = bits_of(clo);
  const uint64_t hi_bits = chi >= dend ? (w == 64 ? (sgn ? uint64_t{1} << 63 : 0) - 1 : bits_of(dend - 1)) : bits_of(chi);
  const uint64_t span = hi_bits - lo_bits;
  const size_t es = static_cast<size_t>(ir::byte_size(dtype_));
  for (int64_t i = 0; i < numel_; ++i) {
    uint64_t r;
    if (span == std::numeric_limits<uint64_t>::max()) {
      r = g();
    } else {
      uint64_t n = span + 1, limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
      do r = g(); while (r >= limit);
      r %= n;
    }
    int64_t v = static_cast<int64_t>(lo_bits + r);
    element::write_int(dtype_, data_.get() + static_cast<size_t>(offset_of_flat(i)) * es, element::int_to_int(dtype_, v));
  }
}

void HostTensor::fill_normal(uint64_t seed, double mean, double stddev) {
  std::mt19937_64 g(seed);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < numel_; ++i) {
    // Box-Muller; u1 in (0, 1] so the log is finite.
    double u1 = 1.0 - unit_uniform(g), u2 = unit_uniform(g);
    set_flat(i, mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
  }
}

namespace {

// Whether logical position i is element i of the allocation (row-major, contiguous): then fills
// write it directly instead of through set_flat's index arithmetic.
bool row_major(const ir::Shape& sizes, const ir::Shape& strides) {
  int64_t expect = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

// Runs chunk(k) for k in [0, chunks) on `threads` threads (chunk k on thread k mod threads).
void for_chunks(int64_t chunks, unsigned threads, const std::function<void(int64_t)>& chunk) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<int64_t>(threads, std::max<int64_t>(1, chunks)));
  std::vector<std::thread> pool;
  auto run = [&](unsigned t) {
    for (int64_t k = t; k < chunks; k += threads) chunk(k);
  };
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(run, t);
  run(0);
  for (std::thread& th : pool) th.join();
}

constexpr int64_t kFillChunk = int64_t{1} << 20;

// The generator of chunk k of a fill with `seed` (splitmix64 of both, so that neighbouring seeds
// and chunks start far apart).
std::mt19937_64 chunk_generator(uint64_t seed, int64_t k) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(k) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return std::mt19937_64(z ^ (z >> 31));
}

// The parallel fills: chunk k of t's logical elements from chunk_generator(seed, k), `draw` giving
// one or two values a call (a pair cut at the chunk's end loses its second), written directly
// where t is row-major. Float dtypes only.
template <class Draw>
void fill_chunked(HostTensor& t, const char* what, uint64_t seed, unsigned threads, Draw draw) {
  if (!ir::is_float(t.dtype()))
    throw std::invalid_argument(fmt::format("HostTensor::{}: dtype {} is not a float dtype", what, ir::name(t.dtype())));
  const bool direct = row_major(t.sizes(), t.strides());
  const int64_t bytes = static_cast<int64_t>(ir::byte_size(t.dtype())), n = t.numel();
  std::byte* data = static_cast<std::byte*>(t.data());
  for_chunks((n + kFillChunk - 1) / kFillChunk, threads, [&](int64_t k) {
    std::mt19937_64 g = chunk_generator(seed, k);
    const int64_t end = std::min(n, (k + 1) * kFillChunk);
    for (int64_t i = k * kFillChunk; i < end;) {
      double v[2];
      const int count = draw(g, v);
      for (int j = 0; j < count && i < end; ++j, ++i) {
        if (direct) write_value(t.dtype(), data + i * bytes, v[j]);
        else t.set_flat(i, v[j]);
      }
    }
  });
}

}  // namespace

void HostTensor::fill_normal_parallel(uint64_t seed, double mean, double stddev, unsigned threads) {
  fill_chunked(*this, "fill_normal_parallel", seed, threads, [&](std::mt19937_64& g, double* v) {
    // Box-Muller, both outputs; u1 in (0, 1] so the log is finite
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const double u1 = 1.0 - unit_uniform(g), u2 = unit_uniform(g), r = stddev * std::sqrt(-2.0 * std::log(u1));
    v[0] = mean + r * std::cos(kTwoPi * u2);
    v[1] = mean + r * std::sin(kTwoPi * u2);
    return 2;
  });
}

void HostTensor::fill_uniform_parallel(uint64_t seed, double lo, double hi, unsigned threads) {
  fill_chunked(*this, "fill_uniform_parallel", seed, threads, [&](std::mt19937_64& g, double* v) {
    v[0] = lo + (hi - lo) * unit_uniform(g);
    return 1;
  });
}

void HostTensor::fill(double v) {
  for (int64_t i = 0; i < numel_; ++i) set_flat(i, v);
}

void HostTensor::poison() {
  if (bytes_) std::memset(data_.get(), 0xFF, bytes_);
}

std::string HostTensor::describe() const {
  std::string s = fmt::format("{}{}", ir::name(dtype_), ir::shape_string(sizes_));
  int64_t expect = 1;
  bool contiguous = true;
  for (size_t d = sizes_.size(); d-- > 0;) {
    if (sizes_[d] != 1 && strides_[d] != expect) contiguous = false;
    expect *= sizes_[d];
  }
  if (!contiguous) s += fmt::format(" strides {}", ir::shape_string(strides_));
  return s;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size())
    throw std::invalid_argument(fmt::format("rel_error: {} values compared with {} reference values", got.size(), ref.size()));
  double diff = 0, norm_ref = 0, norm_got = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = got[i] - ref[i];
    diff += d * d;
    norm_ref += ref[i] * ref[i];
    norm_got += got[i] * got[i];
  }
  if (norm_ref == 0) return std::sqrt(norm_got);
  return std::sqrt(diff) / std::sqrt(norm_ref);
}

double max_abs_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size())
    throw std::invalid_argument(fmt::format("max_abs_error: {} values compared with {} reference values", got.size(), ref.size()));
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = std::fabs(got[i] - ref[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace tilejit::runtime
