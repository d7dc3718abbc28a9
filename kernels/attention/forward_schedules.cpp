// How attention_fwd's key-block loop is arranged: the same arithmetic in the same order, with
// different overlap between the tensor cores and the softmax. The default at D 128 (dense, no
// dropout or score mod) is PIPELINE_QK [decision 006]; elsewhere the plain loop.
#include "kernels/attention/forward_program.hpp"

namespace tilejit::kernels::forward_detail {

using namespace lang;

void key_block_loop(ForwardTile& t, const KeyBlocks& blocks) {
  if (*t.p.cfg.pipeline_qk) {
    // S of block j + 1 is issued before block j's softmax, so the tensor cores work on it while
    // the softmax runs (one more S tile in registers). The last iteration recomputes its own
    // block's S: one spare MMA instead of a branch, which would wait for every MMA in flight.
    Var s_next = t.scores(blocks.at(zeros(i32, {})).first);
    for_range(0, blocks.trips, [&](Tile j) {
      auto [n0, partial] = blocks.at(j);
      Tile s_raw = s_next;
      s_next = t.scores(blocks.at(minimum(j + 1, maximum(blocks.trips - 1, 0))).first);
      t.key_block(n0, partial, s_raw, t.mask_ahead(n0, j));
    });
  } else {
    for_range(0, blocks.trips, [&](Tile j) {
      auto [n0, partial] = blocks.at(j);
      Tile s_raw;
      t.in_turn([&] { s_raw = t.scores(n0); });
      t.key_block(n0, partial, s_raw, t.mask_ahead(n0, j));
    });
  }
}

}  // namespace tilejit::kernels::forward_detail
