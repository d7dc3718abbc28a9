// attention_fwd's schedule variants that measured slower than the defaults and stay as options
// for A/Bs (tests keep them correct): PIPELINE_PV [decision 007] and RNG_WARPS [014]. PINGPONG
// [008] is ForwardTile::in_turn.
#include "kernels/attention/forward_program.hpp"

namespace tilejit::kernels::forward_detail {

using namespace lang;

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
  Var s_cur = pipeline_qk ? t.scores(blocks.at(zeros(i32, {})).first) : zeros(f32, {});
  Var p_prev = zeros(p.cfg.spec.dtype, {p.BM, p.BN});
  for_range(0, blocks.trips, [&](Tile j) {
    auto [n0, partial] = blocks.at(j);
    // The K block first: the dots are issued in their operands' order, and S must go first (a
    // softmax waits for its S alone, while P_{j-1} V_{j-1} stays in flight). V_{j-1} from the
    // counter (not a carried value): the ring then prefetches it like the K block.
    Tile k_block = load(p.rows_of(p.Ks, p.kv_h, pipeline_qk ? blocks.at(minimum(j + 1, maximum(blocks.trips - 1, 0))).first : n0, p.BN));
    Tile v = load(p.rows_of(p.Vs, p.kv_h, blocks.at(maximum(j - 1, 0)).first, p.BN));
    Tile s_raw = pipeline_qk ? Tile(s_cur) : Tile();
    t.in_turn([&] {
      Tile s = dot(t.q, trans(k_block));
      if (pipeline_qk) s_cur = s;
      else s_raw = s;
      t.acc = dot(p_prev, v, t.acc);
    });
    auto [p16, alpha] = t.softmax_block(n0, partial, s_raw, t.mask_ahead(n0, j));
    p_prev = p16;
    t.acc = t.acc * alpha[col];
  });
  t.acc = dot(p_prev, load(p.rows_of(p.Vs, p.kv_h, blocks.at(maximum(blocks.trips - 1, 0)).first, p.BN)), t.acc);
}

void with_rng_warps(ForwardProgram& p, const Channel& keep_words, const std::function<void()>& mma) {
  // w more warps (a warp role) run the Philox calls of each key block's keep-mask, as the packed
  // words the dropout_mask kernel writes, and pass them through a two-slot shared-memory channel;
  // the MMA warps read them as with DROPOUT_BITS. The same bits. MMA_REGISTERS / RNG_REGISTERS
  // (both or neither) move registers between the roles (setmaxnreg).
  const AttentionDropout& drop = *p.drop;
  warp_roles({{.warps = 0, .max_registers = static_cast<int>(p.cfg.mma_registers), .body = mma},
              {.warps = static_cast<int>(p.cfg.rng_warps), .max_registers = static_cast<int>(p.cfg.rng_registers), .body = [&] {
                 for_range(0, cdiv(p.n_end, p.BN), [&](Tile j) {
                   keep_words.push(j, drop.keep_words(p.bh, p.m0 + arange(0, p.BM), j * (p.BN / 32), p.BN / 32));
                 });
               }}});
}

}  // namespace tilejit::kernels::forward_detail
