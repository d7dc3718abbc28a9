// A budget on what one kernel may ask of the compilers, checked before lowering: ptxas takes
// minutes and gigabytes on tiles far past the register file (an f32 [256, 1024] softmax on 4
// warps, 2048 elements per thread: 232 s and 2.5 GB), so such kernels are refused in
// milliseconds with what to change instead (issue 27).
#pragma once
#include <cstdint>

#include "dsl/ir/function.hpp"

namespace tilejit::jit {

struct CompileBudget {
  // One tile value's elements per thread (its size over the program's threads). The library's
  // kernels stay at or below 256; at 512 ptxas already takes ~10 s.
  static constexpr int64_t kMaxElementsPerThread = 1024;
  // The sum over the body's ops of their results' elements per thread: the straight-line code
  // the lowering unrolls (a loop body counts once).
  static constexpr int64_t kMaxUnrolledElements = int64_t{1} << 17;
};

struct BudgetUse {
  int64_t largest_per_thread = 0;  // elements per thread of the largest tile value
  int64_t unrolled = 0;            // sum over ops of their results' elements per thread
};
BudgetUse measure_budget(const ir::Function& f, int num_warps);

// Throws CompileError naming the kernel, the tile, its source line, the numbers and the limits.
void check_compile_budget(const ir::Function& f, int num_warps);

}  // namespace tilejit::jit
