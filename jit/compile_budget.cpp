#include "jit/compile_budget.hpp"

#include <fmt/format.h>

#include "jit/compile.hpp"

namespace tilejit::jit {
namespace {

int64_t per_thread(const ir::Type& t, int64_t threads) {
  if (t.kind != ir::TypeKind::Value || t.shape.empty()) return 0;
  return (t.numel() + threads - 1) / threads;
}

}  // namespace

BudgetUse measure_budget(const ir::Function& f, int num_warps) {
  const int64_t threads = int64_t{32} * std::max(1, num_warps);
  BudgetUse u;
  ir::walk(f.body, [&](const ir::Op& op) {
    for (ir::ValueId r : op.results) {
      const int64_t n = per_thread(f.type(r), threads);
      u.largest_per_thread = std::max(u.largest_per_thread, n);
      u.unrolled += n;
    }
  });
  return u;
}

void check_compile_budget(const ir::Function& f, int num_warps) {
  const int64_t threads = int64_t{32} * std::max(1, num_warps);
  int64_t unrolled = 0;  // one walk: the per-value limit and the sum
  ir::walk(f.body, [&](const ir::Op& op) {
    for (ir::ValueId r : op.results) {
      const ir::Type& t = f.type(r);
      const int64_t n = per_thread(t, threads);
      unrolled += n;
      if (n > CompileBudget::kMaxElementsPerThread)
        throw CompileError(fmt::format(
            "tilejit: kernel '{}': the tile {} at {} holds {} elements per thread on {} warps (valid: at most {}; ptxas "
            "would take minutes and gigabytes on it): use more warps, a smaller tile or a loop over smaller tiles",
            f.name, ir::to_string(t), op.loc.str(), n, num_warps, CompileBudget::kMaxElementsPerThread));
    }
  });
  if (unrolled > CompileBudget::kMaxUnrolledElements)
    throw CompileError(fmt::format(
        "tilejit: kernel '{}': its ops produce {} tile elements per thread on {} warps (valid: at most {}; the unrolled "
        "code would take ptxas minutes): use more warps, smaller tiles or loops over smaller tiles",
        f.name, unrolled, num_warps, CompileBudget::kMaxUnrolledElements));
}

}  // namespace tilejit::jit
