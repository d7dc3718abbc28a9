// The packed dropout keep-mask kernel: one program writes BLOCK_M rows x BLOCK_W words, each
// thread computing whole Philox calls (kernels::dropout_keep_words) and storing whole words.
#include "kernels/dropout_mask.hpp"

#include "kernels/philox.hpp"

namespace tilejit::kernels {

using namespace lang;

const Kernel& dropout_mask() {
  static const Kernel k = kernel("dropout_mask", [](Builder& kb) {
    auto BM = kb.meta<int>("BLOCK_M", 64), BW = kb.meta<int>("BLOCK_W", 4);
    auto Mask = kb.tensor("Mask", u32, 3, {.contiguous_last = true});
    auto S_k = kb.scalar<int>("S_k");
    auto seed_lo = kb.scalar("seed_lo", u32), seed_hi = kb.scalar("seed_hi", u32);
    auto offset_lo = kb.scalar("offset_lo", u32), offset_hi = kb.scalar("offset_hi", u32);
    auto threshold = kb.scalar("keep_threshold", u32);
    if (BW % 2 != 0) kb.fail(Loc::current(), "dropout_mask: BLOCK_W must be even (one Philox call group covers 64 key columns = 2 words)");
    // One [BLOCK_M, BLOCK_W] tile of the mask: rows m0.., words w0.. of batch*head bh.
    auto tile = [&](const Tile& m0, const Tile& w0, const Tile& bh) {
      Tile words = dropout_keep_words(bh, m0 + arange(0, BM), w0, BW, seed_lo, seed_hi, offset_lo, offset_hi, threshold);
      // the bits of columns >= S_k are 0: word w keeps its low clamp(S_k - 32 w, 0, 32) bits
      Tile valid_bits = S_k - (w0 + arange(0, BW)) * 32;
      Tile low = where(valid_bits >= 32, 0xFFFFFFFFu, (1u << cast(u32, maximum(valid_bits, 0))) - 1u);
      store(Mask.block({bh, m0, w0}, {BM, BW}), words & low[row]);
    };
    // PERSISTENT: a 1-D grid of any size whose programs stride over all tiles -- a grid of one
    // program per SM leaves room on every SM for a concurrent kernel (the GEMM it hides behind).
    if (kb.meta<bool>("PERSISTENT", false)) {
      auto row_tiles = cdiv(Mask.size(1), BM), word_tiles = cdiv(Mask.size(2), BW);
      for_range(program_id(0), row_tiles * word_tiles * Mask.size(0), num_programs(0), [&](Tile t) {
        tile(t % row_tiles * BM, t / row_tiles % word_tiles * BW, t / (row_tiles * word_tiles));
      });
    } else {
      tile(program_id(0) * BM, program_id(1) * BW, program_id(2));
    }
  });
  return k;
}

}  // namespace tilejit::kernels
