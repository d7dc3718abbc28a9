// The GPU bench: the space's problem on the device, each candidate's outputs checked against the
// default config's, then CUDA events around every launch (warm-up, L2 flushed before each
// repetition, the median). How timings are compared: docs/decisions/040-timing-method.md.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/autotuner.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/gpu_kernel.hpp"

namespace tilejit::runtime {

namespace {

struct OutputCompare {
  double rel = 0;
  int64_t nonfinite = 0;  // elements finite in the reference but not in the candidate
};

// A launch that has not finished by then is taken for a hang (GpuHang): the slowest valid config
// of a tuning problem runs milliseconds.
constexpr double kFirstLaunchS = 20;

// The element at logical position i of a contiguous bf16 / f16 / f32 tensor (what to_host gives).
template <class Raw>
double element(const Raw* p, int64_t i, ir::DType t) {
  if constexpr (sizeof(Raw) == 4) {
    return static_cast<double>(reinterpret_cast<const float*>(p)[i]);
  } else {
    uint16_t h = p[i];
    if (t == ir::DType::bf16) {
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    // f16: sign, 5-bit exponent, 10-bit mantissa
    const int e = (h >> 10) & 31, m = h & 1023;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31) return m ? NAN : sign * INFINITY;
    return sign * (e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24));
  }
}

// Identical bytes are the common case (same K order) and cost a memcmp; otherwise a streaming
// relative L2 error, so 100M-element outputs need no second copy. (Outputs come back contiguous:
// read them directly, not through get_flat's index arithmetic, which took ~1 s a config for
// a 33M-element attention output.)
OutputCompare compare_outputs(const HostTensor& got, const HostTensor& ref) {
  OutputCompare c;
  if (got.bytes() == ref.bytes() && std::memcmp(got.data(), ref.data(), got.bytes()) == 0) return c;
  double num = 0, den = 0;
  auto accumulate = [&](double r, double g) {
    if (std::isfinite(r) && !std::isfinite(g)) {
      ++c.nonfinite;
      return;
    }
    if (!std::isfinite(r)) return;
    num += (g - r) * (g - r);
    den += r * r;
  };
  const ir::DType t = ref.dtype();
  const bool direct = got.dtype() == t && got.bytes() == ref.bytes() && ref.bytes() == static_cast<size_t>(ref.numel()) * ir::byte_size(t) &&
                      (t == ir::DType::f32 || t == ir::DType::bf16 || t == ir::DType::f16);
  const int64_t n = ref.numel();
  if (direct && t == ir::DType::f32) {
    const auto* r = static_cast<const uint32_t*>(ref.data());
    const auto* g = static_cast<const uint32_t*>(got.data());
    for (int64_t i = 0; i < n; ++i) accumulate(element(r, i, t), element(g, i, t));
  } else if (direct) {
    const auto* r = static_cast<const uint16_t*>(ref.data());
    const auto* g = static_cast<const uint16_t*>(got.data());
    for (int64_t i = 0; i < n; ++i) accumulate(element(r, i, t), element(g, i, t));
  } else {
    for (int64_t i = 0; i < n; ++i) accumulate(ref.get_flat(i), got.get_flat(i));
  }
  c.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

class GpuBench final : public Bench {
 public:
  explicit GpuBench(const BenchOptions& o) : o_(o) {}

  void prepare(const TuningSpace& space, const TuningContext& ctx, const Candidate& reference) override {
    Driver& drv = Driver::get();
    drv.require(fmt::format("timing kernel '{}'", space.kernel_name()));
    data_ = space.make_problem(ctx);
    dev_.clear();
    dev_.reserve(data_.args.size());
    args_.clear();
    for (const Arg& a : data_.args)
      if (a.kind() == Arg::Kind::Buffer) dev_.push_back(DeviceTensor::from_host(*a.tensor(), o_.device));
    size_t t = 0;
    for (const Arg& a : data_.args) {
      switch (a.kind()) {
        case Arg::Kind::Buffer: args_.emplace_back(dev_[t++]); break;
        case Arg::Kind::Float: args_.emplace_back(a.as_double()); break;
        case Arg::Kind::UInt: args_.emplace_back(a.as_uint()); break;
        case Arg::Kind::Bool: args_.emplace_back(a.as_bool()); break;
        case Arg::Kind::Int: args_.emplace_back(a.as_int()); break;
      }
    }
    if (o_.flush_l2 && !flush_.bytes()) {
      size_t l2 = drv.props(o_.device).l2_bytes;
      flush_ = DeviceBuffer(std::max<size_t>(2 * l2, size_t{64} << 20), o_.device);
    }
    if (!stream_) stream_ = std::make_unique<Stream>(o_.device);
    GpuKernel k(*reference.fn, *reference.compiled, o_.device);
    ref_ = run_once(k, reference.grid);
  }

  int resident_programs(const Candidate& c) override {
    try {
      return GpuKernel(*c.fn, *c.compiled, o_.device).max_resident_per_sm();  // (loads the module only)
    } catch (const std::exception&) {
      return 0;  // the model's rule; a launch problem shows when the config is timed
    }
  }

  Result measure(const Candidate& c) override {
    Result res;
    GpuKernel k(*c.fn, *c.compiled, o_.device);
    std::vector<HostTensor> out = run_once(k, c.grid);
    for (size_t i = 0; i < out.size(); ++i) {
      OutputCompare cmp = compare_outputs(out[i], ref_[i]);
      if (cmp.nonfinite > 0 || !(cmp.rel <= data_.tolerance)) {
        res.correct = false;
        res.note = fmt::format("output {} differs from the default config's: {} non-finite elements, rel. error {:.3g} "
                               "(tolerance {:.3g})",
                               data_.outputs[i], cmp.nonfinite, cmp.rel, data_.tolerance);
        return res;
      }
    }
    res.ms = time(k, c.grid);
    return res;
  }

 private:
  std::vector<HostTensor> run_once(const GpuKernel& k, Grid grid) {
    size_t t = 0;
    std::vector<size_t> tensor_index(data_.args.size(), 0);
    for (size_t i = 0; i < data_.args.size(); ++i)
      if (data_.args[i].kind() == Arg::Kind::Buffer) tensor_index[i] = t++;
    for (size_t o : data_.outputs) dev_[tensor_index[o]].poison();  // unwritten outputs show as NaN
    k.launch(grid, args_, stream_->handle());
    stream_->synchronize_within(kFirstLaunchS, "the candidate's first launch");
    std::vector<HostTensor> out;
    for (size_t o : data_.outputs) out.push_back(dev_[tensor_index[o]].to_host());
    return out;
  }

  double time(const GpuKernel& k, Grid grid) {
    CUstream s = stream_->handle();
    const DriverApi& api = Driver::get().api();
    auto flush = [&] {
      if (flush_.bytes()) check_cu(api.MemsetD8Async(flush_.ptr(), 0, flush_.bytes(), s), "cuMemsetD8Async (L2 flush)");
    };
    // Warm-up, also measuring one launch to size the repetitions.
    Event w0(o_.device), w1(o_.device);
    int warm = 0;
    double warm_ms = 0, one_ms = 0;
    while (warm < 1 || warm_ms < o_.warmup_ms) {
      flush();
      w0.record(s);
      k.launch(grid, args_, s);
      w1.record(s);
      stream_->synchronize_within(kFirstLaunchS, "a warm-up launch");
      one_ms = w1.elapsed_ms(w0);
      warm_ms += std::max(one_ms, 1e-3);
      if (++warm >= 1000) break;
    }
    const int reps = std::clamp(static_cast<int>(o_.rep_ms / std::max(one_ms, 1e-3)), o_.min_reps, o_.max_reps);
    std::vector<Event> starts, ends;
    starts.reserve(static_cast<size_t>(reps));
    ends.reserve(static_cast<size_t>(reps));
    for (int i = 0; i < reps; ++i) {
      starts.emplace_back(o_.device);
      ends.emplace_back(o_.device);
    }
    for (int i = 0; i < reps; ++i) {
      flush();  // outside the events: the kernel starts with a cold L2
      starts[static_cast<size_t>(i)].record(s);
      k.launch(grid, args_, s);
      ends[static_cast<size_t>(i)].record(s);
    }
    stream_->synchronize_within(kFirstLaunchS + 4e-3 * reps * one_ms, "the timed launches");
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) ms.push_back(ends[static_cast<size_t>(i)].elapsed_ms(starts[static_cast<size_t>(i)]));
    std::nth_element(ms.begin(), ms.begin() + static_cast<long>(ms.size() / 2), ms.end());
    return ms[ms.size() / 2];
  }

  BenchOptions o_;
  ProblemData data_;
  std::vector<DeviceTensor> dev_;
  std::vector<DeviceArg> args_;
  std::vector<HostTensor> ref_;
  DeviceBuffer flush_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

std::unique_ptr<Bench> make_gpu_bench(const BenchOptions& o) { return std::make_unique<GpuBench>(o); }

}  // namespace tilejit::runtime
