// `tilejit calibrate [--show]`: measures the cost model's unit rates on this GPU (api/calibrate.hpp)
// and stores them next to the tuning results, where DeviceModel::current() takes them.
#include <fmt/format.h>

#include <cstdio>

#include "api/calibrate.hpp"
#include "commands.hpp"

namespace tilejit::cli {

int cmd_calibrate(const Args& args) {
  bool show = false;
  for (const std::string& a : args) {
    if (a == "--show") show = true;
    else throw UsageError(fmt::format("unknown option '{}' (calibrate takes --show)", a));
  }
  const runtime::TuningStore& store = runtime::TuningStore::global();
  const runtime::DeviceModel hopper;
  std::printf("data sheet (Hopper, per SM and clock): %s\n",
              runtime::Calibration{hopper.mma_flops_per_clock, hopper.exponentials_per_clock, hopper.fp32_per_clock}.describe().c_str());
  if (show) {
    runtime::Driver& drv = runtime::Driver::get();
    drv.require("tilejit calibrate --show");
    const runtime::DeviceModel d = runtime::DeviceModel::from_props(drv.props(0), drv.driver_version());
    const std::optional<runtime::Calibration> c = runtime::load_calibration(store, d);
    std::printf("%s: %s\n", d.name.c_str(), c ? c->describe().c_str() : "no calibration stored (the data sheet's figures are used)");
    return 0;
  }
  const library::CalibrationRun run = library::calibrate_device();
  std::printf("%s, %d SMs at %.0f MHz (the driver's clock):\n%s", run.device.name.c_str(), run.device.sm_count, run.device.clock_hz / 1e6,
              run.details.c_str());
  std::printf("measured: %s\n", run.rates.describe().c_str());
  if (!run.rates.plausible()) {
    std::printf("not stored: a rate is outside [1/4, 2] x the data sheet's (a throttled or shared GPU?)\n");
    return 1;
  }
  if (!runtime::store_calibration(store, run.device, run.rates)) {
    std::printf("not stored: the tuning store (%s) is not writable or disabled\n", store.dir().string().c_str());
    return 1;
  }
  std::printf("stored in %s: the cost model uses the exponential and FP32 rates on this GPU from now on\n", store.dir().string().c_str());
  return 0;
}

}  // namespace tilejit::cli
