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

namespace {

// The single-GPU call's view of a head shard: as is, or (packed documents, B = 1) without the batch dim.
Tensor call_view(const Tensor& t, const attention::Options& opts) { return opts.cu_seqlens_q ? without_batch(t) : t; }

// Event indices of head group g: its shards exchanged (on the communication stream), its call done
// (on the caller's stream).
size_t exchanged(int g) { return 10 + 2 * static_cast<size_t>(g); }
size_t computed(int g) { return 11 + 2 * static_cast<size_t>(g); }

}  // namespace

// With G head groups the communication stream runs: to heads (0), to heads (1), [call 0 done] back
// (0), to heads (2), [call 1 done] back (1), ...; the caller's stream runs call g after to heads (g)
// only. Each group's call sees its heads' whole rows, as one call on all of them would: the same
// kernel and schedule (default_schedule does not depend on the head count), so the same bits.
void ulysses_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, const attention::Options& opts, int head_groups, CUstream stream) {
  Ulysses u(st, d);
  const int r = d.rank, G = ulysses_head_groups(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), d.world, head_groups);
  // a mask's block lists (document kinds) in the scratch too: the call then allocates nothing
  std::vector<attention::Options> a;
  for (int g = 0; g < G; ++g) a.push_back(head_options(opts, u.q_group(r, g, G), d.Hq));
  if (G > 1)
    for (attention::Options& x : a) per_tile_unless_chosen(x);
  const size_t ws_bytes =
      attention::forward_workspace_bytes(call_view(u.shard_shape(u.q_group(r, 0, G).count), opts),
                                         call_view(u.shard_shape(u.kv_group(r, 0, G).count), opts), a[0]);
  Scratch s(st.scratch_base(ulysses_bytes(d, u.mine(), false, ws_bytes, G), stream));
  std::vector<Ulysses::Shards> h;
  for (int g = 0; g < G; ++g) h.push_back(u.shards(s, false, G));
  const attention::Workspace ws{ws_bytes ? s.take(ws_bytes) : 0, ws_bytes};
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  u.inputs_to_heads(q, k, v, h[0], s, nullptr, nullptr, nullptr, 0, G);
  st.mark(exchanged(0), comm);
  st.stamp(comm, "head group 0: to heads");
  for (int g = 0; g < G; ++g) {
    const Ulysses::Shards& x = h[static_cast<size_t>(g)];
    st.wait(stream, exchanged(g));
    const auto cv = [&](const Tensor& t) { return call_view(t, opts); };
    attention::forward(cv(x.q), cv(x.k), cv(x.v), cv(x.o), cv(x.lse), a[static_cast<size_t>(g)], stream, ws);
    st.mark(computed(g), stream);
    st.stamp(stream, "head group {}: forward", g);
    if (g + 1 < G) {
      u.inputs_to_heads(q, k, v, h[static_cast<size_t>(g + 1)], s, nullptr, nullptr, nullptr, g + 1, G);
      st.mark(exchanged(g + 1), comm);
      st.stamp(comm, "head group {}: to heads", g + 1);
    }
    st.wait(comm, computed(g));
    u.outputs_to_sequence(x, o, lse, s, stream, g, G);
    st.stamp(comm, "head group {}: back to sequence", g);
  }
  st.join(stream, comm, 3);
}

void ulysses_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                      const attention::Options& opts, int head_groups, CUstream stream) {
  Ulysses u(st, d);
  const int r = d.rank, G = ulysses_head_groups(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), d.world, head_groups);
  std::vector<attention::Options> a;
  for (int g = 0; g < G; ++g) a.push_back(head_options(opts, u.q_group(r, g, G), d.Hq));
  const size_t ws_bytes =
      attention::backward_workspace_bytes(call_view(u.shard_shape(u.q_group(r, 0, G).count), opts),
                                          call_view(u.shard_shape(u.kv_group(r, 0, G).count), opts), a[0]);
  Scratch s(st.scratch_base(ulysses_bytes(d, u.mine(), true, ws_bytes, G), stream));
  std::vector<Ulysses::Shards> h;
  for (int g = 0; g < G; ++g) h.push_back(u.shards(s, true, G));
  const attention::Workspace ws{s.take(ws_bytes), ws_bytes};
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  u.inputs_to_heads(q, k, v, h[0], s, &o, &do_, &lse, 0, G);
  st.mark(exchanged(0), comm);
  st.stamp(comm, "head group 0: to heads");
  for (int g = 0; g < G; ++g) {
    const Ulysses::Shards& x = h[static_cast<size_t>(g)];
    st.wait(stream, exchanged(g));
    const auto cv = [&](const Tensor& t) { return call_view(t, opts); };
    attention::backward(cv(x.q), cv(x.k), cv(x.v), cv(x.o), cv(x.do_), cv(x.lse), cv(x.dq), cv(x.dk), cv(x.dv),
                        a[static_cast<size_t>(g)], stream, ws);
    st.mark(computed(g), stream);
    st.stamp(stream, "head group {}: backward", g);
    if (g + 1 < G) {
      u.inputs_to_heads(q, k, v, h[static_cast<size_t>(g + 1)], s, &o, &do_, &lse, g + 1, G);
      st.mark(exchanged(g + 1), comm);
      st.stamp(comm, "head group {}: to heads", g + 1);
    }
    st.wait(comm, computed(g));
    u.gradients_to_sequence(x, dq, dk, dv, s, stream, g, G);
    st.stamp(comm, "head group {}: gradients back to sequence", g);
  }
  st.join(stream, comm, 3);
}

}  // namespace tilejit::cp::detail
