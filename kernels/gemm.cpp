// The GEMM kernel: tensor windows (bounds-checked, TMA-shaped) for the operands, an f32
// accumulator carried through the K loop, one rounding to the output dtype at the end.
#include "kernels/gemm.hpp"

namespace tilejit::kernels {

using namespace lang;

const Kernel& gemm() {
  static const Kernel k = kernel("gemm", [](Builder& b) {
    auto T = b.meta_dtype("DTYPE", bf16);
    auto OUT = b.meta_dtype("OUT_DTYPE", f32);
    auto BM = b.meta<int>("BLOCK_M", 128), BN = b.meta<int>("BLOCK_N", 128), BK = b.meta<int>("BLOCK_K", 64);
    // Operand storage: K-major means K is the contiguous dim. A K-major is A[M,K] row-major; A not
    // K-major is passed as A^T[K,M] row-major. Likewise B K-major is B^T[N,K], else B[K,N].
    auto a_kmajor = b.meta<bool>("A_KMAJOR", true), b_kmajor = b.meta<bool>("B_KMAJOR", false);
    const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
    auto A = b.tensor("A", T, 2, row_major);
    auto B = b.tensor("B", T, 2, row_major);
    auto C = b.tensor("C", OUT, 2, row_major);
    auto K = a_kmajor ? A.size(1) : A.size(0);

    auto m0 = program_id(0) * BM, n0 = program_id(1) * BN;
    Var acc = zeros(f32, {BM, BN});
    for_range(0, K, BK, [&](Tile k0) {
      Tile a = a_kmajor ? load(A.block({m0, k0}, {BM, BK})) : trans(load(A.block({k0, m0}, {BK, BM})));
      Tile bt = b_kmajor ? trans(load(B.block({n0, k0}, {BN, BK}))) : load(B.block({k0, n0}, {BK, BN}));
      acc = dot(a, bt, acc);
    });
    store(C.block({m0, n0}, {BM, BN}), cast(OUT, acc));
  });
  return k;
}

}  // namespace tilejit::kernels
