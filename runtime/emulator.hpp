// Runs a kernel's per-thread program -- what the lowering hands to the LLVM and CUDA backends
// (jit::lower) -- on the host: every thread of a program in lockstep, one instruction for all of
// them before the next, with masks for divergent branches and loops, warp shuffles between the
// threads of a warp, shared memory per program and host memory for the arguments. Programs with
// warp roles (setmaxnreg, exits, named barriers: producer and consumer warpgroups that wait for
// each other) run each warp on a thread of its own, one at a time, handing over at waits and
// barriers; wgmma is then a rendezvous of its warpgroup. CI has no GPU: comparing this with the
// interpreter (which runs the tile IR) checks layouts, scans, reductions, layout conversions,
// masks, mma.sync fragments and the Hopper pipelines (TMA boxes into 128-byte swizzled tiles,
// mbarrier phases, wgmma from shared-memory descriptors or registers) without one. Asynchronous
// copies and MMAs complete when issued, and the schedule is one legal one, so a missing barrier,
// fence or wait may go unnoticed here (the GPU suites judge timing and races). Cross-program
// semaphores are not modelled (EmulatorUnsupported); a wait nothing can satisfy is a deadlock
// (EmulatorFault).
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

// How the threads of a program take turns. By default, lockstep unless the program has warp roles.
// warp_by_warp: every program warp by warp, barriers real (a missing one can show); seed != 0:
// besides at waits, the running warp hands over at random shared-memory accesses, barrier
// arrivals, TMA issues and mbarrier arrivals (one schedule per seed), so that a wait or barrier the
// lowering forgot shows as a read of data not yet written.
struct EmulatorSchedule {
  bool warp_by_warp = false;
  uint64_t seed = 0;
};

// Lowers `f` with `opts` (jit::lower: arch, warps, pipeline) and runs every program of `grid` on
// the host with `args` as interpret() takes them (HostTensors for pointers and tensors, numbers
// for scalars; outputs written in place).
void emulate(const ir::Function& f, Grid grid, const std::vector<Arg>& args, const jit::CompileOptions& opts = {},
             EmulatorSchedule schedule = {});

// The same for a per-thread program lowered already (its parameters are `f`'s, flattened).
void emulate(const jit::pir::Func& program, const ir::Function& f, Grid grid, const std::vector<Arg>& args,
             EmulatorSchedule schedule = {});

}  // namespace tilejit::runtime
