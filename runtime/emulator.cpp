// The emulator's entry points (emulator.hpp); the machine is runtime/emulator/machine.hpp.
#include "runtime/emulator.hpp"

#include "runtime/emulator/machine.hpp"

namespace tilejit::runtime {

void emulate(const jit::pir::Func& program, const ir::Function& f, Grid grid, const std::vector<Arg>& args, EmulatorSchedule schedule) {
  emu::Emulator(program, f, args, schedule).run(grid);
}

void emulate(const ir::Function& f, Grid grid, const std::vector<Arg>& args, const jit::CompileOptions& opts, EmulatorSchedule schedule) {
  const jit::pir::Func program = jit::lower(f, opts);
  emulate(program, f, grid, args, schedule);
}

}  // namespace tilejit::runtime
