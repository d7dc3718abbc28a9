// The packed dropout keep-mask of a layer's attention, precomputed by its own kernel (issue 7:
// the RNG moved out of attention, e.g. run concurrently with the QKV projection GEMM); attention
// then reads bits instead of running Philox. Bits are those of kernels::dropout_keep (philox.hpp).
#pragma once
#include <optional>
#include <cstdint>

#include "dsl/lang.hpp"
#include "kernels/philox.hpp"

namespace tilejit::kernels {

// Mask: u32 [batch * heads_q, S_q, cdiv(S_k, 32)] (unit innermost stride): bit j % 32 of word
// mask[bh, i, j / 32] is 1 iff element (bh, i, j) is kept; the bits of columns >= S_k are 0.
// Scalars: S_k (i32), seed_lo, seed_hi, offset_lo, offset_hi (u32 halves of the 64-bit seed and
// offset), keep_threshold (u32, round((1 - p) * 256), see kernels::dropout_keep_threshold).
// Meta: BLOCK_M (query rows per program), BLOCK_W (mask words per program, even: 32 * BLOCK_W key
// columns), PERSISTENT (default false). Grid: (cdiv(S_q, BLOCK_M), cdiv(cdiv(S_k, 32), BLOCK_W),
// batch * heads_q); PERSISTENT: (any P), program p doing tiles p, p + P, ... (rows fastest).
const lang::Kernel& dropout_mask();

// dropout_mask's compile-time choices with their defaults.
struct DropoutMaskConfig {
  int64_t block_m = 64, block_w = 4;
  int64_t align = 4;        // 16: the mask's base and rows 16-byte aligned (16-byte stores)
  bool causal = false;      // only the tiles a causal layer reads (DropoutMaskTiles)
  bool persistent = false;  // a 1-D grid of any size striding over the tiles

  lang::Meta to_meta() const;  // the tiles, and the other metas that differ from their defaults
  static DropoutMaskConfig read(lang::Builder& kb);
};

// The mask's tiles of block_m rows x block_w words, numbered t = (bh * word_tiles + w) * row_tiles
// + r (rows fastest), each written by whole Philox calls per thread (kernels::dropout_keep_words).
// The constructor declares the parameters above (Mask, S_k, seed_lo, seed_hi, offset_lo,
// offset_hi, keep_threshold), in that order, after the kernel's own: dropout_mask uses it, and so
// does the GEMM that writes the mask in its K loop's spare issue slots (gemm.hpp, DROPOUT_MASK).
class DropoutMaskTiles {
 public:
  // causal: tiles whose every word lies above the causal diagonal (first column > last row +
  // S_k - S_q, FlashAttention's bottom-right alignment) are not written -- a causal attention
  // layer never reads them with a nonzero probability -- which halves the Philox work at S_q = S_k.
  // align_bytes: what the Mask tensor's base and row pitch are multiples of (4: any; 16 lets the
  // stores be 16-byte vectors, and needs cdiv(S_k, 32) to be a multiple of 4).
  // ranged: two more i32 parameters after the key's, mask_tile_first and mask_tile_end: this
  // kernel writes tiles [first, end) of the mask only (clamped to the mask's), so that several
  // kernels -- e.g. the GEMMs that run before the attention layer -- share one mask's work.
  DropoutMaskTiles(lang::Builder& kb, int64_t block_m, int64_t block_w, bool causal = false, int align_bytes = 4, bool ranged = false);
  lang::Tile count() const;                      // how many tiles this kernel writes
  void write(const lang::Tile& t) const;         // its tile t (0 <= t < count()): the mask's tile first + t
  void write(const lang::Tile& row0, const lang::Tile& word0, const lang::Tile& batch_head) const;

 private:
  void write_words(const lang::Tile& row0, const lang::Tile& word0, const lang::Tile& batch_head) const;

  int64_t block_m_, block_w_;
  bool causal_;
  lang::Tensor mask_;
  lang::Tile s_k_;
  DropoutKey key_;  // seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold
  std::optional<lang::Tile> first_, end_;  // ranged: the tiles written, clamped to [0, all_tiles()]
  lang::Tile all_tiles() const;
};

}  // namespace tilejit::kernels
