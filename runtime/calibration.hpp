// The cost model's unit rates measured on one GPU (`tilejit calibrate`, api/calibrate.cpp) and kept
// in the tuning store per GPU (name, SM count, driver), so that DeviceModel::current() takes them
// instead of Hopper's data-sheet figures.
#pragma once
#include <optional>
#include <string>

#include "runtime/autotuner.hpp"

namespace tilejit::runtime {

// Per multiprocessor and clock (the clock the driver reports), as achieved by the microbenchmarks:
// a GEMM's flops, exponentials (MUFU), FP32 fused multiply-adds. The cost model takes the last two;
// the GEMM's rate is the library's achieved one (its epilogue and pipeline included), not the
// per-instruction wgmma rate a chain step needs, so it is kept for the record only.
struct Calibration {
  double mma_flops_per_clock = 0, exponentials_per_clock = 0, fp32_per_clock = 0;
  // Every rate within [1/4, 2] x Hopper's figure (4096, 16, 128): anything else is a failed
  // measurement (a throttled or shared GPU), not a property of the part.
  bool plausible() const;
  std::string describe() const;  // "15.8 exponentials, 121 FP32 (GEMM 2900 flops) per SM and clock"
};

// The store entry's identity: kernel "device_calibration" on `d`'s GPU.
TuningIdentity calibration_identity(const DeviceModel& d);
bool store_calibration(const TuningStore& store, const DeviceModel& d, const Calibration& c);
// The stored calibration of `d`'s GPU if there is a plausible one.
std::optional<Calibration> load_calibration(const TuningStore& store, const DeviceModel& d);
// `d` with `c`'s exponential and FP32 rates.
void apply_calibration(DeviceModel& d, const Calibration& c);

}  // namespace tilejit::runtime
