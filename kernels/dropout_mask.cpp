// The packed dropout keep-mask kernel: one program writes BLOCK_M rows x BLOCK_W words.
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
    const int64_t n = int64_t{BW} * 32;  // key columns per program
    auto m0 = program_id(0) * BM, w0 = program_id(1) * BW, bh = program_id(2);
    auto col0 = w0 * 32;
    Tile keep = dropout_keep_block(bh, m0 + arange(0, BM), col0, n, seed_lo, seed_hi, offset_lo, offset_hi, threshold);
    keep = keep & ((col0 + arange(0, n)) < S_k)[row];  // the tail bits past S_k are 0
    // bit b of word w holds column 32 w + b: distinct bits, so their sum is their OR
    Tile bits = reshape(cast(u32, keep), {BM, BW, 32}) << cast(u32, arange(0, 32));
    store(Mask.block({bh, m0, w0}, {BM, BW}), sum(bits, 2));
  });
  return k;
}

}  // namespace tilejit::kernels
