// The GEMM kernel: tensor windows (bounds-checked, TMA-shaped) for the operands, an f32
// accumulator carried through the K loop, one rounding to the output dtype at the end.
#include "kernels/gemm.hpp"

namespace tilejit::kernels {

using namespace lang;

const Kernel& gemm() {
  static const Kernel k = kernel("gemm", [](Builder& b) {
    auto T = b.meta_dtype("DTYPE", bf16);
    auto OUT = b.meta_dtype("OUT_DTYPE", f32);
    auto BM = b.meta<int>("BLOCK_M", 128), BN = b.meta<int>("BLOCK_N", 128), BK = b.meta<int>("BLOCK_K", 32);
    auto A = b.tensor("A", T, 2, {.align_bytes = 16});
    auto B = b.tensor("B", T, 2, {.align_bytes = 16});
    auto C = b.tensor("C", OUT, 2, {.align_bytes = 16});
    auto K = A.size(1);

    auto m0 = program_id(0) * BM, n0 = program_id(1) * BN;
    Var acc = zeros(f32, {BM, BN});
    for_range(0, K, BK, [&](Tile k0) {
      acc = dot(load(A.block({m0, k0}, {BM, BK})), load(B.block({k0, n0}, {BK, BN})), acc);
    });
    store(C.block({m0, n0}, {BM, BN}), cast(OUT, acc));
  });
  return k;
}

}  // namespace tilejit::kernels
