// attention_fwd's schedule variants that measured slower than the defaults and stay as options
// for A/Bs (tests keep them correct): RNG_WARPS [014].
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

}  // namespace tilejit::kernels::forward_detail
