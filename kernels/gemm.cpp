// The GEMM kernel: tensor windows (bounds-checked, TMA-shaped) for the operands, an f32
// accumulator carried through the K loop, one rounding to the output dtype at the end.
#include "kernels/gemm.hpp"

#include <fmt/format.h>

#include <optional>
#include <utility>

#include "kernels/dropout_mask.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::kernels {

using namespace lang;

namespace mn = meta_name;

Meta GemmConfig::to_meta() const {
  const GemmConfig d;
  Meta m;
  auto put = [&](const char* name, auto value, auto def) {
    if (value != def) m.emplace_back(name, value);
  };
  put(mn::kDtype, dtype, d.dtype);
  put(mn::kOutDtype, out_dtype, d.out_dtype);
  m.emplace_back(mn::kBlockM, block_m);  // (the tiles always: callers read them back)
  m.emplace_back(mn::kBlockN, block_n);
  m.emplace_back(mn::kBlockK, block_k);
  put(mn::kAKmajor, a_kmajor, d.a_kmajor);
  put(mn::kBKmajor, b_kmajor, d.b_kmajor);
  put(mn::kAlign, align, d.align);
  put(mn::kGroupM, group_m, d.group_m);
  put(mn::kRingProducer, ring_producer, d.ring_producer);
  put(mn::kPersistent, persistent, d.persistent);
  if (!dropout_mask) {
    put(mn::kTmaStore, tma_store, d.tma_store);
    return m;
  }
  m.emplace_back(mn::kDropoutMask, true);
  put(mn::kMaskBlockM, mask_block_m, d.mask_block_m);
  put(mn::kMaskBlockW, mask_block_w, d.mask_block_w);
  put(mn::kMaskCausal, mask_causal, d.mask_causal);
  put(mn::kMaskAlign, mask_align, d.mask_align);
  put(mn::kMaskTilesPerStep, mask_tiles_per_step, d.mask_tiles_per_step);
  put(mn::kMaskWarps, mask_warps, d.mask_warps);
  put(mn::kMaskRange, mask_range, d.mask_range);
  if (mask_warps == 0) return m;
  put(mn::kMmaRegisters, mma_registers, d.mma_registers);
  put(mn::kMaskRegisters, mask_registers, d.mask_registers);
  return m;
}

GemmConfig GemmConfig::read(Builder& b) {
  GemmConfig c;
  c.dtype = b.meta_dtype(mn::kDtype, c.dtype);
  c.out_dtype = b.meta_dtype(mn::kOutDtype, c.out_dtype);
  c.block_m = b.meta<int>(mn::kBlockM, 128);
  c.block_n = b.meta<int>(mn::kBlockN, 128);
  c.block_k = b.meta<int>(mn::kBlockK, 64);
  c.a_kmajor = b.meta<bool>(mn::kAKmajor, true);
  c.b_kmajor = b.meta<bool>(mn::kBKmajor, false);
  c.align = b.meta<int>(mn::kAlign, 16);
  c.group_m = b.meta<int>(mn::kGroupM, 0);
  c.dropout_mask = b.meta<bool>(mn::kDropoutMask, false);
  if (!c.dropout_mask) {
    c.ring_producer = b.meta<bool>(mn::kRingProducer, false);
    c.persistent = b.meta<bool>(mn::kPersistent, false);
    c.tma_store = b.meta<bool>(mn::kTmaStore, false);
    return c;
  }
  // (this order -- align, causal, words, rows -- is the one the metas have always been declared in)
  c.mask_align = b.meta<int>(mn::kMaskAlign, 4);
  c.mask_causal = b.meta<bool>(mn::kMaskCausal, false);
  c.mask_block_w = b.meta<int>(mn::kMaskBlockW, 4);
  c.mask_block_m = b.meta<int>(mn::kMaskBlockM, 64);
  c.mask_tiles_per_step = b.meta<int>(mn::kMaskTilesPerStep, 1);
  if (c.mask_tiles_per_step < 1)
    b.fail(Loc::current(), fmt::format("gemm: MASK_TILES_PER_STEP = {} must be at least 1", c.mask_tiles_per_step));
  c.mask_warps = b.meta<int>(mn::kMaskWarps, 0);
  c.mask_range = b.meta<bool>(mn::kMaskRange, false);
  if (c.mask_warps == 0) return c;
  c.mma_registers = b.meta<int>(mn::kMmaRegisters, 0);
  c.mask_registers = b.meta<int>(mn::kMaskRegisters, 0);
  return c;
}

const Kernel& gemm() {
  static const Kernel k = kernel("gemm", [](Builder& b) {
    const GemmConfig c = GemmConfig::read(b);
    const DType T = c.dtype, OUT = c.out_dtype;
    const int64_t BM = c.block_m, BN = c.block_n, BK = c.block_k;
    const bool a_kmajor = c.a_kmajor, b_kmajor = c.b_kmajor;
    // Operand storage: K-major means K is the contiguous dim. A K-major is A[M,K] row-major; A not
    // K-major is passed as A^T[K,M] row-major. Likewise B K-major is B^T[N,K], else B[K,N].
    // ALIGN: the bytes the base addresses and row pitches are multiples of (16 enables vector
    // accesses and TMA; 2 accepts any bf16/f16 layout, e.g. K = 70).
    const ParamSpec row_major{.align_bytes = static_cast<int>(c.align), .contiguous_last = true};
    auto A = b.tensor("A", T, 2, row_major);
    auto B = b.tensor("B", T, 2, row_major);
    auto C = b.tensor("C", OUT, 2, row_major);
    auto K = a_kmajor ? A.size(1) : A.size(0);
    auto M = C.size(0), N = C.size(1);
    // Launch requirements: mismatched operands are an error, not a K read as zeros past B's end
    b.same_size(A, a_kmajor ? 1 : 0, B, b_kmajor ? 1 : 0, "A's K and B's K");
    b.same_size(C, 0, A, a_kmajor ? 0 : 1, "C's rows and A's M");
    b.same_size(C, 1, B, b_kmajor ? 0 : 1, "C's columns and B's N");

    // GROUP_M = 0: a 2-D grid, program (i, j) computes tile (i, j). GROUP_M = g > 0: a 1-D grid
    // walked g tile-rows at a time, so that consecutive programs share A and B tiles in L2.
    // PERSISTENT: the same order, each program taking every num_programs-th tile.
    const int64_t group_m = c.group_m;
    auto tile_of = [&](const Tile& t) -> std::pair<Tile, Tile> {  // tile t's (row, column) of tiles
      const Tile tiles_m = cdiv(M, BM), tiles_n = cdiv(N, BN);
      if (group_m == 0) return {t / tiles_n, t % tiles_n};
      auto group = t / (group_m * tiles_n);
      auto first_m = group * group_m;
      auto rows = minimum(tiles_m - first_m, group_m);
      return {first_m + t % rows, (t % (group_m * tiles_n)) / rows};
    };
    if (c.ring_producer) ring_producer();
    // not persistent: the program's own tile (GROUP_M = 0: program (i, j) takes tile (i, j))
    std::pair<Tile, Tile> own;
    if (!c.persistent) own = group_m == 0 ? std::pair<Tile, Tile>{program_id(0), program_id(1)} : tile_of(program_id(0));
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
    if (c.dropout_mask) mask.emplace(b, c.mask_block_m, c.mask_block_w, c.mask_causal, static_cast<int>(c.mask_align), c.mask_range);
    const int64_t per_step = mask ? c.mask_tiles_per_step : 0;
    const int64_t mask_warps = c.mask_warps, mma_registers = c.mma_registers, mask_registers = c.mask_registers;
    Tile program, programs;  // (linear program index and count: only the mask's tiles need them)
    if (mask) {
      program = group_m == 0 ? program_id(0) + program_id(1) * num_programs(0) : program_id(0);
      programs = group_m == 0 ? num_programs(0) * num_programs(1) : num_programs(0);
    }
    auto mask_tiles_from = [&](const Tile& first) { for_range(first, mask->count(), programs, [&](Tile t) { mask->write(t); }); };
    auto gemm_tile = [&](const Tile& pid_m, const Tile& pid_n, int64_t tiles_per_step) {
      const Tile m0 = pid_m * BM, n0 = pid_n * BN;
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
      store(C.block({m0, n0}, {BM, BN}), cast(OUT, acc), {.tma = c.tma_store});
    };
    if (c.persistent) {
      for_range(program_id(0), cdiv(M, BM) * cdiv(N, BN), num_programs(0), [&](Tile t) {
        auto [pm, pn] = tile_of(t);
        gemm_tile(pm, pn, 0);
      });
      return;
    }
    const auto& [pid_m, pid_n] = own;
    if (mask_warps == 0) {
      gemm_tile(pid_m, pid_n, per_step);
    } else {
      warp_roles({{.warps = 0, .max_registers = static_cast<int>(mma_registers), .body = [&] { gemm_tile(pid_m, pid_n, 0); }},
                  {.warps = static_cast<int>(mask_warps), .max_registers = static_cast<int>(mask_registers),
                   .body = [&] { mask_tiles_from(program); }}});
    }
  });
  return k;
}

}  // namespace tilejit::kernels
