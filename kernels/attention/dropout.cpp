// The attention kernels' dropout (dropout.hpp): parameters, keep-masks fused or precomputed, and
// the expansion of packed mask words into per-element and per-pair masks.
#include "kernels/attention/dropout.hpp"

namespace tilejit::kernels {

using namespace lang;

AttentionDropout::AttentionDropout(Builder& kb)
    : key(DropoutKey::declare(kb)),
      row_offset(kb.scalar<int>("dropout_row_offset")),
      col_offset(kb.scalar<int>("dropout_col_offset")),
      head_offset(kb.scalar<int>("dropout_head_offset")),
      heads(kb.scalar<int>("dropout_heads")),
      // threshold 0 (everything dropped) gives inf here, but it only scales kept values. rcp, not
      // '/': a division's slow path is a subroutine call, and ptxas then serialises every wgmma
      scale(256.0f * rcp(cast(f32, key.keep_threshold))) {}

Tile AttentionDropout::inverse_scale() const { return cast(f32, key.keep_threshold) * (1.0f / 256.0f); }

Tile AttentionDropout::batch_head(const Tile& b, const Tile& call_heads, const Tile& h) const {
  return b * where(heads > 0, heads, call_heads) + head_offset + h;
}

Tile AttentionDropout::global_rows(const Tile& row0, int64_t num_rows) const { return row0 + row_offset + arange(0, num_rows); }

Tile AttentionDropout::global_col(const Tile& col0) const { return col0 + col_offset; }

void AttentionDropout::declare_bits(Builder& kb, bool any_strides) {
  bits = kb.tensor("dropout_bits", u32, 3, {.align_bytes = 4, .contiguous_last = !any_strides});
}

void AttentionDropout::declare_bits_out(Builder& kb, bool any_strides) {
  bits_out = kb.tensor("dropout_bits_out", u32, 3, {.align_bytes = 4, .contiguous_last = !any_strides});
}

Tile AttentionDropout::keep(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0, int64_t num_cols) const {
  return keep_mask(batch_head, row0, num_rows, col0, num_cols) != 0u;
}

AttentionDropout::Ahead AttentionDropout::keep_ahead(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                                    int64_t num_cols) const {
  if (bits.descriptor().valid()) return {std::nullopt, precompute(bits_words(batch_head, row0, num_rows, col0, num_cols))};
  if (num_cols % 64 != 0) return {};  // (per element at the use)
  // The block's Philox calls and the keep flags of all four outputs (3 ops a word; 16 registers a
  // thread in a 128 x 128 block on 8 warps), computed here under precompute -- otherwise the whole
  // Philox chain, whose layout its use decides, would be computed at the use; only the prmts wait.
  DropoutKeepCalls calls = dropout_calls(batch_head, global_rows(row0, num_rows), global_col(col0), num_cols, key);
  for (Tile& w : calls.words) w = precompute(dropout_keep_flags(w, key.keep_threshold));
  calls.flags = true;
  return {calls, Tile()};
}

Tile AttentionDropout::keep_mask_of(const Ahead& ahead, const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                    int64_t num_cols) const {
  if (ahead.words.valid()) return expand_keep_words(ahead.words, num_rows, num_cols);
  return ahead.calls ? dropout_keep_mask_of(*ahead.calls) : keep_mask(batch_head, row0, num_rows, col0, num_cols);
}

Tile AttentionDropout::keep_pairs_of(const Ahead& ahead, const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                     int64_t num_cols) const {
  if (ahead.words.valid()) return expand_keep_word_pairs(ahead.words, num_rows, num_cols);
  if (ahead.calls) return dropout_keep_pairs_of(*ahead.calls);
  if (bits.descriptor().valid()) return expand_keep_word_pairs(bits_words(batch_head, row0, num_rows, col0, num_cols), num_rows, num_cols);
  // Fused: pairs of the Philox outputs; fewer than whole 64-column groups: the per-element mask (the
  // same bits), packed.
  if (num_cols % 64 != 0) return pack_pairs(cast(u16, keep_mask(batch_head, row0, num_rows, col0, num_cols)));
  return dropout_keep_pairs_of(dropout_calls(batch_head, global_rows(row0, num_rows), global_col(col0), num_cols, key));
}

Tile AttentionDropout::keep_mask(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0, int64_t num_cols) const {
  if (!bits.descriptor().valid())
    return dropout_keep_mask_block(batch_head, global_rows(row0, num_rows), global_col(col0), num_cols, key);
  return expand_keep_words(bits_words(batch_head, row0, num_rows, col0, num_cols), num_rows, num_cols);
}

Tile AttentionDropout::bits_words(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0, int64_t num_cols,
                                  bool at_use) const {
  // past the end: 0 (dropped). At the use: in the score block's layout, no shared-memory exchange.
  const BlockRef words = words_block(bits, batch_head, row0, num_rows, col0, num_cols);
  return at_use ? load_at_use(words) : load(words);
}

BlockRef AttentionDropout::words_block(const Tensor& mask, const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                       int64_t num_cols) {
  return mask.block({batch_head, row0, col0 / 32}, {num_rows, num_cols / 32});
}

Tile AttentionDropout::keep_words_ahead(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                        int64_t num_cols) const {
  return precompute(keep_words(batch_head, row0 + arange(0, num_rows), col0 / 32, num_cols / 32));
}

Tile AttentionDropout::keep_mask_transposed(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                            int64_t num_cols, const Tile* words_ahead) const {
  if (num_cols % 64 != 0) return trans(keep_mask(batch_head, row0, num_rows, col0, num_cols));
  // Read: the words loaded in a layout of their own (a plain load, pipelined with the block's
  // tiles) and moved through shared memory like the fused words below. Read at the use instead
  // (keep_mask's load_at_use, right for the forward and dQ), each thread loaded the word of every
  // query row it holds and used 2 bits of each: 18 loads, 14-15% more of the loop's instructions
  // and 1.03-1.05x the backward's time [090].
  if (bits.descriptor().valid())
    return trans(expand_keep_words(bits_words(batch_head, row0, num_rows, col0, num_cols, /*at_use=*/false), num_rows, num_cols));
  // Fused: the packed words of the block, computed in their own layout (dropout_keep_words ends in
  // a reduction, whose layout is a concrete one where each thread owns whole Philox calls), then
  // moved through shared memory into the transposed block's layout and expanded there. Generated
  // in the transposed layout instead, a thread would compute 16 calls a 64 x 64 block and use 2
  // bytes of each (its keys are rows, and one call covers 16 keys of one query row).
  Tile words = words_ahead ? *words_ahead : keep_words(batch_head, row0 + arange(0, num_rows), col0 / 32, num_cols / 32);
  if (bits_out.descriptor().valid())
    store(words_block(bits_out, batch_head, row0, num_rows, col0, num_cols), words);
  return trans(expand_keep_words(words, num_rows, num_cols));
}

Tile AttentionDropout::keep_words(const Tile& batch_head, const Tile& rows, const Tile& word0, int64_t num_words) const {
  return dropout_keep_words(batch_head, rows + row_offset, word0 + col_offset / 32, num_words, key);
}

Tile expand_keep_words(const Tile& words, int64_t num_rows, int64_t num_cols) {
  // Column 32 w + 8 k + b: the word shifted so that bit 8 k + b lands on bit 7 of byte k (one
  // shift serves the 4 columns of each b), then one prmt replicates that bit into all 32. (Shifts
  // alone -- to the sign, then arithmetically back -- make a value LLVM knows is 0 or ~0, and it
  // turns the AND with it back into a select, which it then sinks past the bf16 conversion.)
  auto b = reshape(cast(u32, arange(0, 8)), {1, 1, 1, 8}), k = reshape(cast(u32, arange(0, 4)), {1, 1, 4, 1});
  auto up = reshape(words, {num_rows, num_cols / 32, 1, 1}) << (7u - b);
  return reshape(byte_perm(up, 0u, (k | 8u) * 0x1111u), {num_rows, num_cols});
}

Tile expand_keep_word_pairs(const Tile& words, int64_t num_rows, int64_t num_cols) {
  // Pair 16 w + 4 k + t = columns 32 w + 8 k + 2 t + {0, 1}: the word shifted so that bit 8 k + 2 t
  // lands on bit 7 of byte k (one shift serves the 4 pairs of each t), and shifted once more for
  // bit 8 k + 2 t + 1; one prmt replicates the first into bytes 0-1 and the second into bytes 2-3.
  auto t = reshape(cast(u32, arange(0, 4)), {1, 1, 1, 4}), k = reshape(cast(u32, arange(0, 4)), {1, 1, 4, 1});
  auto w = reshape(words, {num_rows, num_cols / 32, 1, 1});
  auto low = w << (7u - 2u * t), high = w << (6u - 2u * t);
  return reshape(byte_perm(low, high, (k | 8u) * 0x11u + ((k + 4u) | 8u) * 0x1100u), {num_rows, num_cols / 2});
}

}  // namespace tilejit::kernels
