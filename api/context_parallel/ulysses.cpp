// Ulysses mode (DeepSpeed-Ulysses): an all-to-all turns sequence shards into head shards (every
// rank then holds the whole sequence for Hq / W query heads and the key/value heads they read),
// the single-GPU call runs on them, and an all-to-all turns the outputs back into sequence shards.
// Every mask without tensors works unchanged, and with whole GQA groups per rank the result is the
// single-GPU call's bit for bit (the same kernel sees the same rows). Key/value heads shared by
// several ranks (Hkv < W) are sent to each, and their dK, dV parts summed in f32 in rank order.
//
// Messages: runs of rows (one per batch and chunk) go straight into place on the receiving side;
// head slices, which are not contiguous, are packed or unpacked with 2D copies on the
// communication stream.
#include "api/context_parallel/ulysses.hpp"

namespace tilejit::cp::detail {

void ulysses_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, const attention::Options& opts, CUstream stream) {
  Ulysses u(st, d);
  const int r = d.rank;
  // a mask's block lists (document kinds) in the scratch too: the call then allocates nothing
  const attention::Options a = head_options(opts, u.q_heads(r), d.Hq);
  const size_t ws_bytes =
      attention::forward_workspace_bytes(u.shard_shape(u.q_heads(r).count), u.shard_shape(u.kv_heads(r).count), a);
  Scratch s(st.scratch_base(ulysses_bytes(d, u.mine(), false, ws_bytes), stream));
  const Ulysses::Shards h = u.shards(s, false);
  const attention::Workspace ws{ws_bytes ? s.take(ws_bytes) : 0, ws_bytes};
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  u.inputs_to_heads(q, k, v, h, s);
  st.join(stream, comm, 1);
  attention::forward(h.q, h.k, h.v, h.o, h.lse, a, stream, ws);
  st.join(comm, stream, 2);
  u.outputs_to_sequence(h, o, lse, s, stream);
  st.join(stream, comm, 3);
}

void ulysses_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                      const attention::Options& opts, CUstream stream) {
  Ulysses u(st, d);
  const int r = d.rank;
  const attention::Options a = head_options(opts, u.q_heads(r), d.Hq);
  const size_t ws_bytes =
      attention::backward_workspace_bytes(u.shard_shape(u.q_heads(r).count), u.shard_shape(u.kv_heads(r).count), a);
  Scratch s(st.scratch_base(ulysses_bytes(d, u.mine(), true, ws_bytes), stream));
  const Ulysses::Shards h = u.shards(s, true);
  const attention::Workspace ws{s.take(ws_bytes), ws_bytes};
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  u.inputs_to_heads(q, k, v, h, s, &o, &do_, &lse);
  st.join(stream, comm, 1);
  attention::backward(h.q, h.k, h.v, h.o, h.do_, h.lse, h.dq, h.dk, h.dv, a, stream, ws);
  st.join(comm, stream, 2);
  u.gradients_to_sequence(h, dq, dk, dv, s, stream);
  st.join(stream, comm, 3);
}

}  // namespace tilejit::cp::detail
