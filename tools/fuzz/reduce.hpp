// Automatic reduction of a failing fuzz program: greedy edits (drop outputs, unwrap loops, keep
// one branch of an if, replace a value by a constant or by its operand, one program instead of
// several), each kept when the program still fails the same way (Outcome::signature).
#pragma once
#include "tools/fuzz/evaluate.hpp"

namespace tilejit::fuzz {

// Each candidate runs in a child process (run_isolated); stops after `budget_s` seconds.
Program reduce(const Program& failing, const Outcome& failure, const EvalOptions& eval, double timeout_s, double budget_s,
               int* evaluations = nullptr);

}  // namespace tilejit::fuzz
