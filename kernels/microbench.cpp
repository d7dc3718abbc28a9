#include "kernels/microbench.hpp"

#include "dsl/lang.hpp"

namespace tilejit::kernels {

using lang::Tile;

namespace {

// The shared shape: load a BLOCK tile, `step` it ITERS times, store it back.
lang::Kernel chain(const char* name, Tile (*step)(const Tile&)) {
  return lang::kernel(name, [step](lang::Builder& k) {
    using namespace lang;
    auto X = k.pointer("X", f32, {.align_bytes = 16});
    auto iters = k.scalar<int>("iters");
    auto BLOCK = k.meta<int>("BLOCK", 2048);
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    Var x = load(X + offs);
    for_range(0, iters, [&](Tile) { x = step(x); });
    store(X + offs, Tile(x));
  });
}

}  // namespace

const lang::Kernel& exp2_chain() {
  static const lang::Kernel k = chain("exp2_chain", [](const Tile& x) { return lang::exp2(x * -0.25f); });
  return k;
}

const lang::Kernel& fma_chain() {
  static const lang::Kernel k = chain("fma_chain", [](const Tile& x) { return lang::fma(x, 0.999f, 0.001f); });
  return k;
}

}  // namespace tilejit::kernels
