// The packed dropout keep-mask kernel: one program writes BLOCK_M rows x BLOCK_W words, each
// thread computing whole Philox calls (kernels::dropout_keep_words) and storing whole words.
#include "kernels/dropout_mask.hpp"

#include "kernels/meta_names.hpp"

#include <fmt/format.h>

#include "kernels/philox.hpp"

namespace tilejit::kernels {

using namespace lang;

DropoutMaskTiles::DropoutMaskTiles(Builder& kb, int64_t block_m, int64_t block_w, bool causal, int align_bytes, bool ranged)
    : block_m_(block_m),
      block_w_(block_w),
      causal_(causal),
      // (4 is the element size: spelled 0, the default, so the default kernels are unchanged)
      mask_(kb.tensor("Mask", u32, 3, {.align_bytes = align_bytes == 4 ? 0 : align_bytes, .contiguous_last = true})),
      s_k_(kb.scalar<int>("S_k")),
      key_(DropoutKey::declare(kb)) {
  if (align_bytes != 4 && align_bytes != 16)
    kb.fail(Loc::current(), fmt::format("dropout mask tiles: MASK_ALIGN / ALIGN = {} (valid: 4, or 16 when every mask row is a "
                                        "multiple of 4 words)", align_bytes));
  if (block_w % 2 != 0)
    kb.fail(Loc::current(), fmt::format("dropout mask tiles: BLOCK_W must be even (one Philox call group covers 64 key columns = "
                                        "2 words), got {}", block_w));
  if (ranged) {
    // (a range past the mask, or backwards, writes nothing rather than another tensor's bytes)
    const Tile first = kb.scalar<int>("mask_tile_first"), end = kb.scalar<int>("mask_tile_end");
    first_ = minimum(maximum(first, 0), all_tiles());
    end_ = minimum(maximum(end, *first_), all_tiles());
  }
}

Tile DropoutMaskTiles::all_tiles() const { return cdiv(mask_.size(1), block_m_) * cdiv(mask_.size(2), block_w_) * mask_.size(0); }

Tile DropoutMaskTiles::count() const { return first_ ? *end_ - *first_ : all_tiles(); }

void DropoutMaskTiles::write(const Tile& tile) const {
  const Tile t = first_ ? *first_ + tile : tile;
  const Tile row_tiles = cdiv(mask_.size(1), block_m_), word_tiles = cdiv(mask_.size(2), block_w_);
  write(t % row_tiles * block_m_, t / row_tiles % word_tiles * block_w_, t / (row_tiles * word_tiles));
}

void DropoutMaskTiles::write(const Tile& m0, const Tile& w0, const Tile& bh) const {
  if (causal_) {
    // row i sees keys j <= i + (S_k - S_q): the tile matters unless its first column is past that for its last row
    if_(w0 * 32 <= m0 + (block_m_ - 1) + (s_k_ - mask_.size(1)), [&] { write_words(m0, w0, bh); });
  } else {
    write_words(m0, w0, bh);
  }
}

void DropoutMaskTiles::write_words(const Tile& m0, const Tile& w0, const Tile& bh) const {
  Tile words = dropout_keep_words(bh, m0 + arange(0, block_m_), w0, block_w_, key_);
  // the bits of columns >= S_k are 0: word w keeps its low clamp(S_k - 32 w, 0, 32) bits
  Tile valid_bits = s_k_ - (w0 + arange(0, block_w_)) * 32;
  Tile low = where(valid_bits >= 32, 0xFFFFFFFFu, (1u << cast(u32, maximum(valid_bits, 0))) - 1u);
  store(mask_.block({bh, m0, w0}, {block_m_, block_w_}), words & low[row]);
}

namespace mn = meta_name;

Meta DropoutMaskConfig::to_meta() const {
  const DropoutMaskConfig d;
  Meta m;
  m.emplace_back(mn::kBlockM, block_m);  // (the tiles always: callers read them back)
  m.emplace_back(mn::kBlockW, block_w);
  if (align != d.align) m.emplace_back(mn::kAlign, align);
  if (causal != d.causal) m.emplace_back(mn::kCausal, causal);
  if (persistent != d.persistent) m.emplace_back(mn::kPersistent, persistent);
  return m;
}

DropoutMaskConfig DropoutMaskConfig::read(Builder& kb) {
  DropoutMaskConfig c;
  c.block_m = kb.meta<int>(mn::kBlockM, 64);
  c.block_w = kb.meta<int>(mn::kBlockW, 4);
  c.align = kb.meta<int>(mn::kAlign, 4);
  c.causal = kb.meta<bool>(mn::kCausal, false);
  c.persistent = kb.meta<bool>(mn::kPersistent, false);
  return c;
}

const Kernel& dropout_mask() {
  static const Kernel k = kernel("dropout_mask", [](Builder& kb) {
    const DropoutMaskConfig c = DropoutMaskConfig::read(kb);
    const DropoutMaskTiles tiles(kb, c.block_m, c.block_w, c.causal, static_cast<int>(c.align));
    if (c.persistent) {
      // programs stride over all tiles: a grid of one program per SM leaves room on every SM for
      // a concurrent kernel (the GEMM it hides behind)
      for_range(program_id(0), tiles.count(), num_programs(0), [&](Tile t) { tiles.write(t); });
    } else {
      tiles.write(program_id(0) * c.block_m, program_id(1) * c.block_w, program_id(2));
    }
  });
  return k;
}

}  // namespace tilejit::kernels
