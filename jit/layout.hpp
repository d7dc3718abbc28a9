// Distributed layouts of tiles over the threads of a CTA, as linear maps over GF(2) (Triton's
// "linear layouts"): each bit of the register index, lane id and warp id maps to a tile coordinate.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsl/ir/type.hpp"

namespace tilejit::jit {

using Coord = std::vector<int64_t>;  // one entry per tile dimension

// An IR construct the GPU backend cannot lower (e.g. a tile dimension that is not a power of two);
// the message names the kernel, the op and its source line.
struct LoweringError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The lowered kernel needs more shared memory than a multiprocessor has (jit::compile then tries
// fewer pipeline stages before it gives up).
struct SharedMemoryOverflow : LoweringError {
  using LoweringError::LoweringError;
};

// coords(r, l, w) = XOR of the bases selected by the set bits of r, l and w. A zero basis means
// replication (two registers/lanes/warps hold the same element). Shapes are powers of two.
struct Layout {
  ir::Shape shape;
  std::vector<Coord> reg, lane, warp;  // lane: always 5 bases (32 lanes)

  int num_regs() const { return 1 << reg.size(); }
  int num_warps() const { return 1 << warp.size(); }
  Coord coords(uint32_t r, uint32_t l, uint32_t w) const;
  Coord reg_coords(uint32_t r) const;  // the register part only
  int64_t row_major_offset(const Coord& c) const;
  bool operator==(const Layout&) const = default;
  std::string str() const;

  // Each thread holds `vec` consecutive elements of the last dim, lanes then warps then further
  // registers fill the dims fastest-first. Coalesced for row-major tiles.
  static Layout blocked(const ir::Shape& shape, int num_warps, int vec);
  // mma.sync m16n8k16 layouts for C[M,N] (f32 accumulator), A[M,K] and B[K,N] (16-bit operands),
  // with warps arranged warps_m x warps_n over the output.
  static Layout mma_acc(int64_t m, int64_t n, int warps_m, int warps_n);
  static Layout mma_a(int64_t m, int64_t k, int warps_m, int warps_n);
  static Layout mma_b(int64_t k, int64_t n, int warps_m, int warps_n);
  // mma.sync m16n8k8 .tf32 layouts for A[M,K] and B[K,N] (one 32-bit element a register; the
  // accumulator is mma_acc's), warps as for mma_a / mma_b.
  static Layout mma_a_tf32(int64_t m, int64_t k, int warps_m, int warps_n);
  static Layout mma_b_tf32(int64_t k, int64_t n, int warps_m, int warps_n);
  // This layout with a leading batch dimension of `batch` (a batched dot's operands): its low
  // log2(warps_b) bits on further warp bits (the warp index's high bits), the rest on further
  // register bits (the register index's high bits: a thread's registers are its batches' 2-D
  // fragments one after another).
  Layout batched(int64_t batch, int warps_b) const;

  // How a wgmma dot's warpgroups share C[M, N]: `m` of them split M in 64-row slabs (as many as
  // M has, further slabs repeat in registers), the other `n` split N in equal column slabs (each
  // warpgroup's instruction then has N / n columns). E.g. M = 64 on two warpgroups: n = 2.
  struct WgmmaSplit {
    int m = 1, n = 1;
  };
  static WgmmaSplit wgmma_split(int64_t m, int num_warps);
  // wgmma m64nNk16 accumulator for C[M,N] under wgmma_split(m, num_warps).
  static Layout wgmma_acc(int64_t m, int64_t n, int num_warps);
  // The A operand [M, K] of such a dot read from registers: the m64k16 fragments are the
  // accumulator layout of [M, K] over the M-splitting warpgroups, replicated across the N-splitting ones.
  static Layout wgmma_a(int64_t m, int64_t k, int num_warps);

  Layout slice(int axis) const;        // the layout of a reduction over `axis` (axis removed)
  Layout drop_dim(int axis) const;     // `axis` removed, registers kept (replicating ones too)
  Layout expand_dims(int axis) const;  // a size-1 dimension inserted
  Layout permute(const std::vector<int64_t>& perm) const;
  // This layout with dimension `axis` collapsed to size 1: what the source of a broadcast along
  // `axis` must look like for the broadcast to be a register copy.
  Layout collapse(int axis) const;
  std::optional<Layout> reshape(const ir::Shape& to) const;
  // The layout of pack_pairs' result ([..., 2n] 16-bit -> [..., n] 32-bit): the register basis
  // that is last-dim coordinate 1 removed (each thread then holds both of a pair) and every
  // last-dim coordinate halved; nullopt where no register basis is that unit, or another basis
  // has an odd last-dim coordinate (a pair would straddle threads).
  std::optional<Layout> pack_pairs() const;
  // The inverse ([..., n] -> [..., 2n]): register 2r + h holds half h of packed register r.
  Layout unpack_pairs() const;
  bool has_replication() const;  // some zero basis: several threads or registers hold one element
  // Each basis moving along `axis` moves along it only, by a distinct power of two: the bits of an
  // element's axis coordinate are then register, lane or warp bits, which a scan combines bit by
  // bit (jit/lower/scans.cpp). Blocked and MMA layouts have this form.
  bool axis_bits_separate(int axis) const;
  // Layout equality up to registers that replicate (zero register bases are dropped).
  Layout without_zero_regs() const;
};

bool is_power_of_two(int64_t x);
int log2_exact(int64_t x);

}  // namespace tilejit::jit
