// Rewrites of our PTX that keep known ptxas bugs from miscompiling it. Applied by compile() to
// both backends' PTX before it is assembled, so the PTX a user sees is the PTX that ran.
#pragma once
#include <string>

namespace tilejit::jit {

// ptxas 13.0 (the CLI and nvJitLink alike, sm_90a) folds two signed 16/32-bit min/max into one
// VIMNMX3 and drops the negation of the inner min/max's second operand: max(max(-a, -b), -c)
// runs as max(-a, b, -c) (fuzzer seed 723574; decision 064). It sees a negation in neg.s16/s32,
// sub 0, x and mul x, -1; a not followed by add 1 it leaves alone. So every such negation is
// rewritten as not + add 1 (an exact identity, INT_MIN included). Returns how many were rewritten.
int rewrite_integer_negations(std::string& ptx);

}  // namespace tilejit::jit
