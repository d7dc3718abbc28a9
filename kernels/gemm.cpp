// The GEMM kernel: tensor windows (bounds-checked, TMA-shaped) for the operands, an f32
// accumulator carried through the K loop, one rounding to the output dtype at the end.
#include "kernels/gemm.hpp"

#include <fmt/format.h>

#include <optional>

#include "kernels/dropout_mask.hpp"

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
    // ALIGN: the bytes the base addresses and row pitches are multiples of (16 enables vector
    // accesses and TMA; 2 accepts any bf16/f16 layout, e.g. K = 70).
    auto align = b.meta<int>("ALIGN", 16);
    const ParamSpec row_major{.align_bytes = static_cast<int>(align), .contiguous_last = true};
    auto A = b.tensor("A", T, 2, row_major);
    auto B = b.tensor("B", T, 2, row_major);
    auto C = b.tensor("C", OUT, 2, row_major);
    auto K = a_kmajor ? A.size(1) : A.size(0);
    auto M = C.size(0), N = C.size(1);

    // GROUP_M = 0: a 2-D grid, program (i, j) computes tile (i, j). GROUP_M = g > 0: a 1-D grid
    // walked g tile-rows at a time, so that consecutive programs share A and B tiles in L2.
    auto group_m = b.meta<int>("GROUP_M", 0);
    Tile pid_m, pid_n;
    if (group_m == 0) {
      pid_m = program_id(0);
      pid_n = program_id(1);
    } else {
      auto pid = program_id(0);
      auto tiles_m = cdiv(M, BM), tiles_n = cdiv(N, BN);
      auto group = pid / (group_m * tiles_n);
      auto first_m = group * group_m;
      auto rows = minimum(tiles_m - first_m, group_m);
      pid_m = first_m + pid % rows;
      pid_n = (pid % (group_m * tiles_n)) / rows;
    }
    auto m0 = pid_m * BM, n0 = pid_n * BN;
    // DROPOUT_MASK (issue 7, RNG hidden with the GEMM): the program also writes tiles of an
    // attention layer's packed dropout keep-mask (the dropout_mask kernel's parameters follow C).
    // Program p writes tiles p, p + P, ... (P programs). Two schedules:
    // - MASK_WARPS = 0: the MMA warps write MASK_TILES_PER_STEP tiles in each K step, where they
    //   run while the step's wgmmas do (the pipeline lowers them as side work: tma_pipeline.hpp);
    //   those left after the K loop, after it.
    // - MASK_WARPS = w > 0: warp specialisation (lang::warp_roles): w more warps write the tiles
    //   while the others run the GEMM, neither waiting for the other's instructions; the launch has
    //   num_warps = the GEMM's warps + w (e.g. 12 = 8 + 4). MMA_REGISTERS / MASK_REGISTERS
    //   (both or neither; 0 = off) move registers between them (setmaxnreg).
    // MASK_CAUSAL: only the tiles a causal layer reads (kernels::DropoutMaskTiles); MASK_ALIGN 16:
    // the mask 16-byte aligned (vector stores).
    std::optional<DropoutMaskTiles> mask;
    if (b.meta<bool>("DROPOUT_MASK", false))
      mask.emplace(b, b.meta<int>("MASK_BLOCK_M", 64), b.meta<int>("MASK_BLOCK_W", 4), b.meta<bool>("MASK_CAUSAL", false),
                   static_cast<int>(b.meta<int>("MASK_ALIGN", 4)));
    const int64_t per_step = mask ? b.meta<int>("MASK_TILES_PER_STEP", 1) : 0;
    if (mask && per_step < 1) b.fail(Loc::current(), fmt::format("gemm: MASK_TILES_PER_STEP = {} must be at least 1", per_step));
    const int64_t mask_warps = mask ? b.meta<int>("MASK_WARPS", 0) : 0;
    const int64_t mma_registers = mask_warps ? b.meta<int>("MMA_REGISTERS", 0) : 0;
    const int64_t mask_registers = mask_warps ? b.meta<int>("MASK_REGISTERS", 0) : 0;
    Tile program, programs;  // (linear program index and count: only the mask's tiles need them)
    if (mask) {
      program = group_m == 0 ? program_id(0) + program_id(1) * num_programs(0) : program_id(0);
      programs = group_m == 0 ? num_programs(0) * num_programs(1) : num_programs(0);
    }
    auto mask_tiles_from = [&](const Tile& first) { for_range(first, mask->count(), programs, [&](Tile t) { mask->write(t); }); };
    auto gemm_tile = [&](int64_t tiles_per_step) {
      Var acc = zeros(f32, {BM, BN});
      for_range(0, K, BK, [&](Tile k0) {
        Tile a = a_kmajor ? load(A.block({m0, k0}, {BM, BK})) : trans(load(A.block({k0, m0}, {BK, BM})));
        Tile bt = b_kmajor ? trans(load(B.block({n0, k0}, {BN, BK}))) : load(B.block({k0, n0}, {BK, BN}));
        acc = dot(a, bt, acc);
        for (int64_t r = 0; r < tiles_per_step; ++r) {
          Tile t = program + (k0 / BK * tiles_per_step + r) * programs;
          if_(t < mask->count(), [&] { mask->write(t); });
        }
      });
      if (tiles_per_step) mask_tiles_from(program + cdiv(K, BK) * tiles_per_step * programs);
      store(C.block({m0, n0}, {BM, BN}), cast(OUT, acc));
    };
    if (mask_warps == 0) {
      gemm_tile(per_step);
    } else {
      warp_roles({{.warps = 0, .max_registers = static_cast<int>(mma_registers), .body = [&] { gemm_tile(0); }},
                  {.warps = static_cast<int>(mask_warps), .max_registers = static_cast<int>(mask_registers),
                   .body = [&] { mask_tiles_from(program); }}});
    }
  });
  return k;
}

}  // namespace tilejit::kernels
