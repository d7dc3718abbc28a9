// Runs a kernel's per-thread program -- what the lowering hands to the LLVM and CUDA backends
// (jit::lower) -- on the host: every thread of a program in lockstep, one instruction for all of
// them before the next, with masks for divergent branches and loops, warp shuffles between the
// threads of a warp, shared memory per program and host memory for the arguments. CI has no GPU:
// comparing this with the interpreter (which runs the tile IR) checks layouts, scans, reductions,
// layout conversions, masks, mma.sync fragments and the Hopper pipelines (TMA boxes into 128-byte
// swizzled tiles, mbarrier phases, wgmma from shared-memory descriptors or registers) without one.
// Asynchronous copies and MMAs complete when issued; lockstep execution is one legal schedule, so
// a missing barrier or fence goes unnoticed here (the GPU suites judge timing and races). Not
// modelled: cross-program semaphores, and warp-specialised roles whose waits come before the other
// role's arrivals in program order (they would need warps that run concurrently): such programs
// raise EmulatorUnsupported.
#pragma once
#include <stdexcept>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/compile.hpp"
#include "jit/thread_ir.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::runtime {

// The program uses an instruction the emulator does not model (the message names it).
struct EmulatorUnsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A fault of the lowered program: an access outside every argument's memory or outside shared
// memory (the message names the instruction, the program and the thread).
struct EmulatorFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Lowers `f` with `opts` (jit::lower: arch, warps, pipeline) and runs every program of `grid` on
// the host with `args` as interpret() takes them (HostTensors for pointers and tensors, numbers
// for scalars; outputs written in place).
void emulate(const ir::Function& f, Grid grid, const std::vector<Arg>& args, const jit::CompileOptions& opts = {});

// The same for a per-thread program lowered already (its parameters are `f`'s, flattened).
void emulate(const jit::pir::Func& program, const ir::Function& f, Grid grid, const std::vector<Arg>& args);

}  // namespace tilejit::runtime
