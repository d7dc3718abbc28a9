// `tilejit calibrate`: the cost model's unit rates measured on this machine's GPU by
// microbenchmarks (exponentials, FP32 fused multiply-adds: kernels/microbench.hpp; and, for the
// record, the library GEMM at 8192^3), per SM and clock, for runtime::store_calibration.
#pragma once
#include <string>

#include "runtime/calibration.hpp"

namespace tilejit::library {

struct CalibrationRun {
  runtime::Calibration rates;
  runtime::DeviceModel device;  // the model the rates are per clock of (its clock_hz, SM count)
  std::string details;          // one line per microbenchmark: what ran, its time, its rate
};

// Runs the microbenchmarks on GPU 0 (each output checked against a second launch of itself);
// throws runtime::DeviceError without a GPU.
CalibrationRun calibrate_device();

}  // namespace tilejit::library
