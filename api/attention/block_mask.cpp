// The block-mask pre-pass (masks without tile intervals): its runs, which classify tiles and build
// the lists the kernels read, and build_block_mask, which runs them once into caller memory.
#include <utility>
#include <vector>

#include "api/attention/internal.hpp"

namespace tilejit::attention::detail {

using kernels::Arg;

PrePass pre_pass(const PrePassLists& l, const Options& opts, const Dims& d, uint64_t base, const PrePassLists* classified) {
  if (classified && (classified->block_m != l.block_m || classified->block_n != l.block_n)) classified = nullptr;
  const PrePassLists& cls = classified ? *classified : l;
  PrePass p;
  if (!classified) {
    PrePass::Step s{&block_classes_function(l, d.mask), runtime::Grid{l.q_blocks, lang::cdiv(l.k_blocks, kClassTiles), l.mask_batch * l.mask_heads}, {}};
    s.args.set(Arg::block_classes, l.classes(base));
    s.args.set(Arg::S_q, static_cast<int32_t>(d.seq_q));
    s.args.set(Arg::S_k, static_cast<int32_t>(d.seq_k));
    bind_mask(s.args, opts, d);
    p.steps.push_back(std::move(s));
  }
  PrePass::Step s{&block_lists_function(l), runtime::Grid{l.outer, l.mask_heads, l.mask_batch}, {}};
  s.args.set(Arg::block_classes, cls.classes(base));
  bind_lists(s.args, l, base);
  p.steps.push_back(std::move(s));
  return p;
}
void launch(const PrePass& p, CUstream stream, bool dry) {
  for (const PrePass::Step& s : p.steps) launch(*s.fn, s.grid, stream, s.args, dry);
}

}  // namespace tilejit::attention::detail

namespace tilejit::attention {
using namespace detail;

BlockMask build_block_mask(const Tensor& q, const Tensor& k, const Options& opts, Workspace storage, CUstream stream) {
  const Checker c("build_block_mask");
  Options o = opts;
  o.block_mask = nullptr;  // (building a new one)
  const Dims d = workspace_dims("build_block_mask", q, &k, o, true);
  BlockMask bm;
  bm.storage = storage;
  bm.kind = d.mask;
  bm.seq_q = d.seq_q;
  bm.seq_k = d.seq_k;
  bm.mask_batch = d.mask_batch;
  bm.mask_heads = d.mask_heads;
  bm.device = q.device;
  if (!d.lists) return bm;  // a mask with tile intervals (or none): the calls build nothing either
  const BlockMaskLayout l = block_mask_layout(c, q, d, o);
  if (storage.data == 0 || storage.bytes < l.end)
    c.fail("storage has {} bytes at {:#x}; the lists need {} bytes of device memory (block_mask_bytes(q, k, opts))", storage.bytes,
           storage.data, l.end);
  if (storage.data % kAlign != 0) c.fail("storage address {:#x} is not a multiple of {} bytes", storage.data, kAlign);
  bm.forward_tiles[0] = l.fwd.block_m, bm.forward_tiles[1] = l.fwd.block_n;
  bm.dkdv_tiles[0] = l.dkdv.block_m, bm.dkdv_tiles[1] = l.dkdv.block_n;
  if (l.has_dq) bm.dq_tiles[0] = l.dq.block_m, bm.dq_tiles[1] = l.dq.block_n;
  std::vector<PrePass> passes{pre_pass(l.fwd, o, d, storage.data), pre_pass(l.dkdv, o, d, storage.data)};
  if (l.has_dq) passes.push_back(pre_pass(l.dq, o, d, storage.data, &l.dkdv));  // dK/dV's classes when the tiles agree
  for (const PrePass& p : passes) launch(p, stream, true);
  require_gpu("build_block_mask", q.device);
  for (const PrePass& p : passes) launch(p, stream, false);
  return bm;
}

}  // namespace tilejit::attention
