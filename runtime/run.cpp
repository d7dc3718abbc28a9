// The GPU-or-interpreter runner used by the examples and the main job.
#include "runtime/run.hpp"

#include "runtime/compile_cache.hpp"
#include "runtime/gpu_kernel.hpp"

namespace tilejit::runtime {

RunReport run(const ir::Function& f, Grid grid, const std::vector<Arg>& args, const jit::CompileOptions& opts) {
  RunReport report;
  Driver& driver = Driver::get();
  if (!driver.available()) {
    report.why_not_gpu = driver.unavailable_reason();
    interpret(f, grid, args);
    return report;
  }
  report.where = Where::Gpu;
  report.compiled = compile_cached(f, opts);  // memory, then the on-disk cache, then the JIT
  GpuKernel kernel(f, report.compiled);
  std::vector<DeviceTensor> device;
  device.reserve(args.size());
  for (const Arg& a : args)
    if (a.kind() == Arg::Kind::Buffer) device.push_back(DeviceTensor::from_host(*a.tensor()));
  std::vector<DeviceArg> dargs;
  size_t t = 0;
  for (const Arg& a : args) {
    switch (a.kind()) {
      case Arg::Kind::Buffer: dargs.emplace_back(device[t++]); break;
      case Arg::Kind::Int: dargs.emplace_back(a.as_int()); break;
      case Arg::Kind::UInt: dargs.emplace_back(a.as_uint()); break;
      case Arg::Kind::Float: dargs.emplace_back(a.as_double()); break;
      case Arg::Kind::Bool: dargs.emplace_back(a.as_bool()); break;
    }
  }
  kernel(grid, dargs);
  t = 0;
  for (const Arg& a : args)
    if (a.kind() == Arg::Kind::Buffer) device[t++].to_host(*a.tensor());
  return report;
}

}  // namespace tilejit::runtime
