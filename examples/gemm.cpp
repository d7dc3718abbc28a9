// A tiled GEMM, C[M,N] = A[M,K] @ B[K,N], written the classic Triton way: pointer tiles built from
// strides, masked loads at the ragged edges, and an accumulator Var carried through the K loop.
// `gemm --ir` prints the tile IR; `gemm --hash` its structural hash (the compile-cache key).
#include <cstdio>
#include <cstring>
#include <tilejit/tilejit.hpp>

#include "compile_check.hpp"
#include "runtime/run.hpp"

using namespace tilejit::lang;
using tilejit::runtime::HostTensor;

Kernel gemm = kernel("gemm", [](Builder& k) {
  auto T = k.meta_dtype("DTYPE", bf16);
  auto BM = k.meta<int>("BLOCK_M", 64), BN = k.meta<int>("BLOCK_N", 64), BK = k.meta<int>("BLOCK_K", 32);
  auto A = k.tensor("A", T, 2), B = k.tensor("B", T, 2), C = k.tensor("C", f32, 2);
  auto M = A.size(0), K = A.size(1), N = B.size(1);

  auto rm = program_id(0) * BM + arange(0, BM);  // rows of C this program owns
  auto rn = program_id(1) * BN + arange(0, BN);  // columns of C this program owns
  auto rk = arange(0, BK);
  Var acc = zeros(f32, {BM, BN});
  for_range(0, K, BK, [&](Tile k0) {
    auto ka = k0 + rk;
    auto a = load(A.ptr() + rm[col] * A.stride(0) + ka[row] * A.stride(1), (rm[col] < M) & (ka[row] < K), 0);
    auto b = load(B.ptr() + ka[col] * B.stride(0) + rn[row] * B.stride(1), (ka[col] < K) & (rn[row] < N), 0);
    acc = dot(a, b, acc);
  });
  store(C.ptr() + rm[col] * C.stride(0) + rn[row] * C.stride(1), acc, (rm[col] < M) & (rn[row] < N));
});

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--compile") == 0) return compile_both_backends(gemm.build());
  auto fn = gemm.build();
  if (argc > 1 && std::strcmp(argv[1], "--ir") == 0) {
    std::fputs(tilejit::ir::print(fn).c_str(), stdout);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--hash") == 0) {
    std::printf("%s\n", tilejit::ir::structural_hash(fn).c_str());
    return 0;
  }
  const int M = 150, N = 90, K = 70;  // ragged against the 64x64x32 tiles
  HostTensor a(bf16, {M, K}), b(bf16, {K, N}), c(f32, {M, N});
  a.fill_uniform(11, -1, 1);
  b.fill_uniform(12, -1, 1);
  auto report = tilejit::runtime::run(fn, {cdiv(M, 64), cdiv(N, 64)}, {a, b, c});

  std::vector<double> ref(static_cast<size_t>(M * N), 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int p = 0; p < K; ++p) ref[static_cast<size_t>(i * N + j)] += a.get({i, p}) * b.get({p, j});
  double err = tilejit::runtime::rel_error(c.to_f64(), ref);
  std::printf("gemm bf16 -> f32 (%s): %dx%dx%d, relative error vs float64 reference = %.3g\n",
              report.where == tilejit::runtime::Where::Gpu ? "GPU" : "CPU interpreter", M, N, K, err);
  return err < 1e-5 ? 0 : 1;
}
