// usp mode (unified sequence parallelism, as yunchang's LongContextAttention): W = U x R ranks.
// Inside each Ulysses group of U ranks an all-to-all turns the members' sequence shards into the
// group's whole shard for Hq / U heads; the zigzag ring over the R groups (ring.cpp, its peers the
// ranks of one member index) runs on that; an all-to-all turns the outputs back. The all-to-all
// carries U - 1 / U of the local rows instead of the ring's W - 1 K/V steps, and the ring's steps
// are R instead of W: larger calls, fewer merges.
//
// Under the zigzag layout over W (S a multiple of 2W, so every chunk has S / 2W tokens) the
// chunks of group g's members, member u holding chunks gU + u and 2W - 1 - gU - u, are the chunks
// of a zigzag layout over U of the group's shard, and that shard is the zigzag shard of rank g
// over R: the Ulysses exchange and the ring need no layouts of their own (UspGroups, plan.hpp).
#include <utility>

#include "api/context_parallel/ulysses.hpp"

namespace tilejit::cp::detail {

namespace {

// The group's all-to-all and the ring, each as a Dims of its own: rank, world and layout inside
// the Ulysses group (all heads), and inside the ring (the member's heads).
struct UspDims {
  UspGroups groups;
  Dims ulysses, ring;
};

UspDims usp_dims(const Dims& d, int ulysses_degree) {
  UspDims u{usp_groups(d.world, ulysses_degree), d, d};
  const UspLayouts layouts = usp_layouts(u.groups, d.layout);
  u.ulysses.world = u.groups.ulysses;
  u.ulysses.rank = u.groups.member(d.rank);
  u.ulysses.layout = layouts.group;
  const UlyssesHeads h = ulysses_heads(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), u.groups.ulysses, u.ulysses.rank);
  u.ring.Hq = h.q_count;
  u.ring.Hkv = h.kv_count;
  u.ring.world = u.groups.ring;
  u.ring.rank = u.groups.group(d.rank);
  u.ring.layout = layouts.ring;
  u.ring.local = u.ring.layout.local_len(u.ring.rank);
  return u;
}

// The communicator ranks of a group as the peers of what runs inside the scope.
class Peers {
 public:
  Peers(ContextParallel::State& st, std::vector<int> ranks) : st_(st), saved_(std::exchange(st.peers, std::move(ranks))) {}
  ~Peers() { st_.peers = std::move(saved_); }
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

 private:
  ContextParallel::State& st_;
  std::vector<int> saved_;
};

// One usp call: the members' rows to the group's shard for their heads (`in`), the ring across
// the groups on them (`ring`, with the member's head options), the shards back to rows (`out`),
// each among its peers; the caller's stream waits for the exchanges it needs.
template <class In, class Ring, class Out>
void usp_call(ContextParallel::State& st, const Dims& d, int ulysses_degree, bool backward, const attention::Options& opts,
              CUstream stream, In in, Ring ring, Out out) {
  const UspDims ud = usp_dims(d, ulysses_degree);
  Ulysses u(st, ud.ulysses);
  Scratch s(st.usp_scratch_base(ulysses_bytes(ud.ulysses, u.mine(), backward, 0), stream));
  const Ulysses::Shards h = u.shards(s, backward);
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  {
    Peers group(st, ud.groups.group_ranks(d.rank));
    in(u, h, s);
  }
  st.join(stream, comm, 1);
  {
    Peers peers(st, ud.groups.ring_ranks(d.rank));
    ring(ud.ring, h, head_options(opts, u.q_heads(ud.ulysses.rank), d.Hq));
  }
  st.join(comm, stream, 2);
  Peers group(st, ud.groups.group_ranks(d.rank));
  out(u, h, s);
  st.join(stream, comm, 3);
}

}  // namespace

void usp_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                 const Tensor& lse, const attention::Options& opts, int ulysses_degree, CUstream stream) {
  usp_call(
      st, d, ulysses_degree, false, opts, stream, [&](Ulysses& u, const Ulysses::Shards& h, Scratch& s) { u.inputs_to_heads(q, k, v, h, s); },
      [&](const Dims& ring, const Ulysses::Shards& h, const attention::Options& a) {
        ring_forward(st, ring, h.q, h.k, h.v, h.o, h.lse, a, stream);
      },
      [&](Ulysses& u, const Ulysses::Shards& h, Scratch& s) { u.outputs_to_sequence(h, o, lse, s, stream); });
}

void usp_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                  const attention::Options& opts, int ulysses_degree, bool fused_sums, CUstream stream) {
  usp_call(
      st, d, ulysses_degree, true, opts, stream,
      [&](Ulysses& u, const Ulysses::Shards& h, Scratch& s) { u.inputs_to_heads(q, k, v, h, s, &o, &do_, &lse); },
      [&](const Dims& ring, const Ulysses::Shards& h, const attention::Options& a) {
        ring_backward(st, ring, h.q, h.k, h.v, h.o, h.do_, h.lse, h.dq, h.dk, h.dv, a, fused_sums, stream);
      },
      [&](Ulysses& u, const Ulysses::Shards& h, Scratch& s) { u.gradients_to_sequence(h, dq, dk, dv, s, stream); });
}

}  // namespace tilejit::cp::detail
