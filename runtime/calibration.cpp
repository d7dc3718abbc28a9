// Calibration entries are tuning-store choices (same atomic writes, checksums and removal of damaged
// files) whose config holds the rates in thousandths: "MMA=4012000,EXP=15800,FP32=121000".
#include "runtime/calibration.hpp"

#include <fmt/format.h>

#include <cmath>

namespace tilejit::runtime {

namespace {

constexpr const char* kKernel = "device_calibration";

bool within(double v, double nominal) { return std::isfinite(v) && v >= nominal / 4 && v <= nominal * 2; }

}  // namespace

bool Calibration::plausible() const {
  const DeviceModel hopper;
  return within(mma_flops_per_clock, hopper.mma_flops_per_clock) && within(exponentials_per_clock, hopper.exponentials_per_clock) &&
         within(fp32_per_clock, hopper.fp32_per_clock);
}

std::string Calibration::describe() const {
  return fmt::format("{:.1f} exponentials, {:.0f} FP32 (GEMM {:.0f} flops) per SM and clock", exponentials_per_clock, fp32_per_clock,
                     mma_flops_per_clock);
}

TuningIdentity calibration_identity(const DeviceModel& d) {
  TuningIdentity id;
  id.kernel = kKernel;
  id.gpu = d.name;
  id.sm_count = d.sm_count;
  id.driver_version = d.driver_version;
  return id;
}

bool store_calibration(const TuningStore& store, const DeviceModel& d, const Calibration& c) {
  auto milli = [](double v) { return static_cast<int64_t>(std::llround(v * 1000)); };
  TuningConfig values;
  values.values = {{"MMA", milli(c.mma_flops_per_clock)}, {"EXP", milli(c.exponentials_per_clock)}, {"FP32", milli(c.fp32_per_clock)}};
  return store.store_choice(calibration_identity(d), Choice{values.id(), 0, "", false, 0});
}

std::optional<Calibration> load_calibration(const TuningStore& store, const DeviceModel& d) {
  const std::optional<Choice> choice = store.load_choice(calibration_identity(d));
  if (!choice) return std::nullopt;
  Calibration c;
  try {
    const TuningConfig v = parse_config(choice->config);
    c.mma_flops_per_clock = static_cast<double>(v.get("MMA")) / 1000;
    c.exponentials_per_clock = static_cast<double>(v.get("EXP")) / 1000;
    c.fp32_per_clock = static_cast<double>(v.get("FP32")) / 1000;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!c.plausible()) return std::nullopt;
  return c;
}

void apply_calibration(DeviceModel& d, const Calibration& c) {
  d.exponentials_per_clock = c.exponentials_per_clock;
  d.fp32_per_clock = c.fp32_per_clock;
}

}  // namespace tilejit::runtime
