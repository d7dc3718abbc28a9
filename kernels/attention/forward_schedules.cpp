// How attention_fwd's key-block loop is arranged: the same arithmetic in the same order, with
// different overlap between the tensor cores and the softmax. The default at D 128 on dense
// tensors is PIPELINE_PV with the ring producer (and, causal, ping-pong turns) [decision 045];
// PIPELINE_QK without the producer [006]; elsewhere the plain loop.
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

void pipelined_pv_blocks(ForwardTile& t, const KeyBlocks& blocks, int first, Var& p_prev, Var& s_cur) {
  const ForwardProgram& p = t.p;
  const bool pipeline_qk = *p.cfg.pipeline_qk;
  for_range(first, blocks.trips, [&](Tile j) {
    const Tile slot = 2 + 5 * j;
    p.stamp(slot);
    auto [n0, partial] = blocks.at(j);
    // The K block first: the dots are issued in their operands' order, and S must go first (a
    // softmax waits for its S alone, while P_{j-1} V_{j-1} stays in flight). V_{j-1} from the
    // counter (not a carried value): the ring then prefetches it like the K block.
    Tile k_block = load(p.rows_of(p.Ks, p.kv_h, pipeline_qk ? blocks.at(minimum(j + 1, maximum(blocks.trips - 1, 0))).first : n0, p.BN));
    Tile v = load(p.rows_of(p.Vs, p.kv_h, blocks.at(maximum(j - 1, 0)).first, p.BN));
    Tile s_raw = pipeline_qk ? Tile(s_cur) : Tile();
    t.in_turn([&] {
      Tile s = dot(t.q, trans(k_block), p.dots);
      if (pipeline_qk) s_cur = s;
      else s_raw = s;
      t.acc = dot(p_prev, v, t.acc, p.dots);
    });
    p.stamp(slot + 1);
    if (p.cfg.timeline) t.row_max_stamp = slot + 2;
    auto [p16, alpha] = t.softmax_block(n0, partial, s_raw, t.mask_ahead(n0, j));
    p_prev = p16;
    p.stamp(slot + 3);
    t.acc = *p.cfg.lazy_rescale ? scale_lazily(t.acc, alpha[col]) : t.acc * alpha[col];
    p.stamp(slot + 4);
  });
}

void key_block_loop_pipeline_pv(ForwardTile& t, const KeyBlocks& blocks) {
  const ForwardProgram& p = t.p;
  const bool pipeline_qk = *p.cfg.pipeline_qk;
  // FlashAttention-3's intra-warpgroup overlap: iteration j issues S_j = Q K_j^T and then
  // P_{j-1} V_{j-1} (the previous block's probabilities, carried in registers), and runs block j's
  // softmax while the tensor cores work on P_{j-1} V_{j-1}; the last block's P V follows the loop.
  // P_{-1} = 0: iteration 0's P V adds nothing (0 V, V being the first visited block). The output
  // is rescaled at the end of an iteration, once that iteration's P V has landed (as FA3 does):
  // rescaling at the next iteration's top, with S_j in flight, makes ptxas wait for every MMA
  // there (C7517). With PIPELINE_QK too, S_j is carried from the previous iteration (the prologue
  // issues S_0) and the iteration issues S_{j+1}.
  // PV_PEEL: block 0's S and softmax come first (K_0 a one-off tile), and the loop starts at
  // block 1, so that no iteration multiplies P_{-1} = 0 by V_0 (1 / trips of the P V work).
  const bool peel = *p.cfg.pv_peel;
  // With PV_PEEL, the last block's V (for the P V after the loop) is copied in the prologue: a
  // one-off tile whose copy runs during the loop instead of after it.
  auto last_v = [&] { return load(p.rows_of(p.Vs, p.kv_h, blocks.at(maximum(blocks.trips - 1, 0)).first, p.BN)); };
  // K0_BEFORE_V_LAST: after K_0 instead (the producer copies in this order; V_last's stage holds
  // the previous tile's O staging until its TMA store has read it).
  std::optional<Tile> v_last;
  if (peel && !*p.cfg.k0_before_v_last) v_last = last_v();
  p.stamp(0);
  Var s_cur = pipeline_qk ? t.scores(blocks.at(zeros(i32, {})).first) : zeros(f32, {});
  Var p_prev = zeros(p.cfg.spec.dtype, {p.BM, p.BN});
  if (peel) {
    const Tile j0 = zeros(i32, {});
    auto [n0, partial] = blocks.at(j0);
    // (K_0 loaded outside the turn: a once-loaded window may go through registers and shared
    // memory, an exchange a turn must not contain)
    Tile k0 = load(p.rows_of(p.Ks, p.kv_h, n0, p.BN)), s0;
    if (*p.cfg.k0_before_v_last) v_last = last_v();
    t.in_turn([&] { s0 = dot(t.q, trans(k0), p.dots); });
    p_prev = t.softmax_block(n0, partial, s0, t.mask_ahead(n0, j0)).first;  // (acc = 0: no rescale)
    p.stamp(1);
  }
  pipelined_pv_blocks(t, blocks, peel ? 1 : 0, p_prev, s_cur);
  t.acc = dot(p_prev, v_last ? *v_last : last_v(), t.acc, p.dots);
  p.stamp(ForwardConfig::kTimelineEpilogue);  // TIMELINE: the last P V issued
}

}  // namespace tilejit::kernels::forward_detail
