// One fuzz program run end to end in this process: built, run in the interpreter, compiled by
// each backend (and, with a GPU, launched and compared element by element). It may crash or hang
// on a compiler bug: the pool runs it in a child process (pool.hpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "jit/compile.hpp"
#include "tools/fuzz/program.hpp"

namespace tilejit::fuzz {

enum class Status : uint8_t {
  Ok,
  GeneratorError,  // the program is not well-typed or faults in the interpreter: a fuzzer bug
  Refused,         // a backend refused the program with an error (LoweringError, CompileError...)
  Mismatch,        // the GPU computed something else than the interpreter
  Fault,           // the GPU reported an error running it (illegal instruction, address...)
  Crash,           // the process died (signal or abort) -- set by the pool
  Hang,            // past the time limit -- set by the pool
  NotEmulated,     // --emulate: the lowered program uses Hopper instructions the emulator does not model
};
std::string_view to_string(Status s);
bool parse_status(std::string_view s, Status& out);

struct Outcome {
  Status status = Status::Ok;
  std::string backend;  // the backend that failed ("" when none or before compiling)
  std::string detail;   // the error message or the first mismatches
  std::string phase;    // what was running (the pool fills it in for crashes and hangs)
  // --tma-stores: the lowered program (jit::lower, what the backends receive) has a TMA store
  // (pir::Op::tma_store), i.e. a window store took the TMA store path
  bool tma_store = false;

  // A failure is the "same" while reducing when status, backend and the message's kind agree.
  std::string signature() const;
};

struct EvalOptions {
  std::vector<jit::Backend> backends{jit::Backend::Llvm, jit::Backend::Nvrtc};
  bool gpu = false;       // launch and compare (needs a GPU)
  // run the lowered program in the host emulator (runtime/emulator.hpp) and compare: the lowering
  // checked without a GPU; the backends then only compile when asked for (compile_backends)
  bool emulate = false;
  bool compile_backends = true;
  // --emulate-races: warp by warp with random hand-overs (one schedule per program seed), every
  // barrier real: a missing barrier or wait in the lowering shows as a mismatch
  bool emulate_races = false;
  bool assemble = true;   // compile-only: also assemble the PTX (ptxas or nvJitLink) when one is found
  // --specialize: lower and compile the program as tilejit::Function would for its arguments
  // (runtime/specialization.hpp: 16-byte aligned tensors, unit strides, integers % 16 declared);
  // the interpreter runs it as written
  bool specialize = false;
  // --packed-loop-pairs: the backends compile with CompileOptions::packed_loop_pairs (LLVM: loop
  // values of 16-bit floats carried as packed pairs, decision 092)
  bool packed_loop_pairs = false;
};

// `progress` is told each phase before it starts ("build", "interpret", "compile llvm", "run
// nvrtc"...), so that the pool can name what a crash or hang interrupted.
Outcome evaluate(Program& p, const EvalOptions& o, const std::function<void(const std::string&)>& progress = {});

// The program's backend source (LLVM IR or CUDA C++) and PTX from one backend (no cubin, no GPU),
// or the error that stopped it in both: for reading what a GPU-only failure ran.
struct CompiledText {
  std::string source, ptx;
};
CompiledText compiled_text(Program& p, jit::Backend b);

}  // namespace tilejit::fuzz
