// Child processes for fuzzing: a crash or hang of the compiler or the GPU must cost one seed, not
// the run. Workers are forked before anything touches CUDA (this process never does), take seeds
// over a pipe and report each phase, so a dead worker names the seed and what it was doing.
#pragma once
#include <cstdint>
#include <functional>

#include "tools/fuzz/evaluate.hpp"

namespace tilejit::fuzz {

struct PoolOptions {
  int jobs = 2;
  double timeout_s = 60;  // per program: past it, the worker is killed and the seed is a hang
  EvalOptions eval;
  GenerateOptions gen;
};

struct SeedResult {
  uint64_t seed = 0;
  Outcome outcome;
};

// Seeds first, first + 1, ... below `last`, stopping early (between seeds) once `time_limit_s` > 0
// has passed; `on_result` runs here, in seed completion order.
void run_seeds(const PoolOptions& o, uint64_t first, uint64_t last, double time_limit_s,
               const std::function<void(const SeedResult&)>& on_result);

// One program in a fresh child process (the reducer's candidates).
Outcome run_isolated(Program& p, const EvalOptions& eval, double timeout_s);

}  // namespace tilejit::fuzz
