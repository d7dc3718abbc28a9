// attention_fwd's schedule variants that measured slower than the defaults and stay as options
// for A/Bs (tests keep them correct): RNG_WARPS [014], OVERLAP_TILES [079].
#include "kernels/attention/forward_program.hpp"

namespace tilejit::kernels::forward_detail {

using namespace lang;

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

void overlapped_tiles(ForwardProgram& p) {
  // A persistent program's tiles as one stream of key blocks: iteration i issues tile i's S_0 and
  // then tile i - 1's last P V (what follows a key loop is the previous tile's), runs tile i's
  // softmax_0 while that P V computes, stores tile i - 1's O, and runs tile i's key loop from block
  // 1. Its ends are places that are no tile (ForwardProgram::place_tile): iteration 0's previous
  // tile (P = 0: its P V adds nothing; its stores fall past S_q) and iteration `count`'s own tile
  // (rows past S_q, no key blocks beyond block 0, whose S and softmax are thrown away): one spare
  // block a program, so that no branch holds MMAs in flight.
  // Slower (0.93-0.955x at D128 full S 1k-4k, H200 [079]): the next tile's Q is copied only once the
  // key loop's last S has read Q's one buffer, just before the boundary needs it, and with P carried
  // through the tile loop ptxas swaps its 16-bit halves at every key block's top (32 PRMT a block).
  const Tile count = p.tile_count();
  Var acc = zeros(f32, {p.BM, p.D}), m = full(f32, {p.BM}, -INFINITY), l = zeros(f32, {p.BM});  // tile i - 1's
  Var p_last = zeros(p.cfg.spec.dtype, {p.BM, p.BN});                                             // its last block's P
  for_range(0, count + 1, [&](Tile i) {
    const auto at_tile = [&] { p.place_tile(minimum(i, maximum(count - 1, 0)), i < count); };
    const auto at_previous = [&] { p.place_tile(maximum(i - 1, 0), i > 0); };
    at_tile();
    ForwardTile t(p, nullptr);  // (loads tile i's Q)
    const KeyBlocks blocks = t.key_blocks();
    p.stamp(0);
    const Tile j0 = zeros(i32, {});
    auto [n0, partial] = blocks.at(j0);
    Tile k0 = load(p.rows_of(p.Ks, p.kv_h, n0, p.BN));
    Tile s0 = dot(t.q, trans(k0), p.dots);
    at_previous();
    // (the previous place's last key block: dense tensors, blocks [0, n_end))
    Tile v_last = load(p.rows_of(p.Vs, p.kv_h, maximum(cdiv(p.n_end, p.BN) - 1, 0) * p.BN, p.BN));
    acc = dot(p_last, v_last, acc, p.dots);
    p.stamp(ForwardConfig::kTimelineEpilogue);  // TIMELINE: the previous tile's last P V issued
    at_tile();
    Var p_prev = t.softmax_block(n0, partial, s0, t.mask_ahead(n0, j0)).first;  // (acc = 0: no rescale)
    p.stamp(1);
    at_previous();
    finish_tile(p, acc, m, l);
    at_tile();
    Var s_cur = zeros(f32, {});
    pipelined_pv_blocks(t, blocks, 1, p_prev, s_cur);
    p_last = p_prev;
    acc = t.acc, m = t.m, l = t.l;
  });
}

}  // namespace tilejit::kernels::forward_detail
