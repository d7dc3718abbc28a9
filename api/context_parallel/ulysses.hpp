// The all-to-all of Ulysses mode (ulysses.cpp) and of usp's Ulysses groups (usp.cpp): sequence
// shards <-> head shards among the ranks of a group (Dims' world and rank; State::peers maps them
// to the communicator's ranks), packed head slices, the LSE's columns, and the scratch they need.
#pragma once
#include <algorithm>
#include <vector>

#include "api/context_parallel/heads.hpp"
#include "api/context_parallel/internal.hpp"
#include "api/context_parallel/partials.hpp"

namespace tilejit::cp::detail {

class Ulysses {
 public:
  Ulysses(ContextParallel::State& st, const Dims& d) : st_(st), d_(d), comm_(st.comm_stream.handle()) {
    for (int j = 0; j < d.world; ++j) {
      const UlyssesHeads h = ulysses_heads(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), d.world, j);
      q_.push_back({h.q_begin, h.q_count});
      kv_.push_back({h.kv_begin, h.kv_count});
    }
  }
  HeadRange q_heads(int j) const { return q_[static_cast<size_t>(j)]; }
  UlyssesHeads mine() const { return ulysses_heads(static_cast<int>(d_.Hq), static_cast<int>(d_.Hkv), d_.world, d_.rank); }
  HeadRange kv_heads(int j) const { return kv_[static_cast<size_t>(j)]; }
  // whether some key/value head is held by more than one rank (a rank's query heads inside one group)
  bool replicated() const { return d_.Hq / d_.world < d_.Hq / d_.Hkv; }

  // Sequence shard `local` ([B, n_r, H, D]) -> head shard `shard` ([B, S, h_r, D]); `heads(j)`:
  // the heads rank j receives. `stage`: W packed [B, n_r, h_j, D] send buffers.
  template <class Heads>
  void to_heads(const Tensor& local, const Tensor& shard, Heads heads_of, Scratch& s) {
    const int r = d_.rank;
    st_.log("all-to-all to heads: {} local rows of {} heads", local.size(1), local.size(2));
    std::vector<Tensor> stage(static_cast<size_t>(d_.world));
    for (int j = 0; j < d_.world; ++j) {
      const HeadRange h = heads_of(j);
      if (j == r) {
        for (int c : d_.layout.chunks_of(r)) {
          const int64_t at = d_.layout.local_offset(c);
          copy_view(rows(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end), rows(heads(local, h), at, at + d_.layout.chunk(c).size()),
                    comm_);
        }
        continue;
      }
      stage[static_cast<size_t>(j)] = packed(s, local.dtype, d_.local, h.count);
      copy_view(stage[static_cast<size_t>(j)], heads(local, h), comm_);
    }
    runtime::nccl::Group group;
    for (int j = 0; j < d_.world; ++j) {
      if (j == r) continue;
      for (int c : d_.layout.chunks_of(r)) {
        const int64_t at = d_.layout.local_offset(c);
        st_.send_rows(rows(stage[static_cast<size_t>(j)], at, at + d_.layout.chunk(c).size()), j);
      }
      for (int c : d_.layout.chunks_of(j)) st_.recv_rows(rows(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end), j);
    }
    group.end();
  }

  // Head shard `shard` ([B, S, h_r, D]) -> the heads(j) slices of `local` ([B, n_r, H, D]) from
  // every rank j. With `sum` (replicated key/value heads' gradients): the parts of each head are
  // added in f32 in rank order into `sum` ([B, n_r, H, D] f32) and converted into `local`.
  template <class Heads>
  void to_sequence(const Tensor& shard, const Tensor& local, Heads heads_of, Scratch& s, CUstream stream, const Tensor* sum = nullptr) {
    const int r = d_.rank;
    st_.log("all-to-all to sequence: {} rows of {} heads", shard.size(1), shard.size(2));
    std::vector<Tensor> stage(static_cast<size_t>(d_.world));
    for (int j = 0; j < d_.world; ++j) stage[static_cast<size_t>(j)] = packed(s, shard.dtype, d_.local, heads_of(j).count);
    {
      runtime::nccl::Group group;
      for (int j = 0; j < d_.world; ++j) {
        if (j == r) continue;
        for (int c : d_.layout.chunks_of(j)) st_.send_rows(rows(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end), j);
        for (int c : d_.layout.chunks_of(r)) {
          const int64_t at = d_.layout.local_offset(c);
          st_.recv_rows(rows(stage[static_cast<size_t>(j)], at, at + d_.layout.chunk(c).size()), j);
        }
      }
      group.end();
    }
    for (int c : d_.layout.chunks_of(r)) {  // this rank's own part, from the shard
      const int64_t at = d_.layout.local_offset(c);
      copy_view(rows(stage[static_cast<size_t>(r)], at, at + d_.layout.chunk(c).size()),
                rows(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end), comm_);
    }
    if (!sum) {
      for (int j = 0; j < d_.world; ++j) copy_view(heads(local, heads_of(j)), stage[static_cast<size_t>(j)], comm_);
      return;
    }
    st_.join(stream, comm_, 20);
    std::vector<bool> started(static_cast<size_t>(local.size(2)), false);
    for (int j = 0; j < d_.world; ++j) {
      const HeadRange h = heads_of(j);
      accumulate(heads(*sum, h), stage[static_cast<size_t>(j)], !started[static_cast<size_t>(h.begin)], stream);
      for (int64_t x = h.begin; x < h.begin + h.count; ++x) started[static_cast<size_t>(x)] = true;
    }
    convert(*sum, local, stream);
  }

  // LSE [B, h_r, S] of the head shard -> the heads_of(j) rows of `lse` ([B, Hq, n_r]).
  template <class Heads>
  void lse_to_sequence(const Tensor& shard, const Tensor& lse, Heads heads_of, Scratch& s) {
    const int r = d_.rank;
    std::vector<Tensor> send(static_cast<size_t>(d_.world)), recv(static_cast<size_t>(d_.world));
    for (int j = 0; j < d_.world; ++j) {
      const int64_t nj = d_.layout.local_len(j);
      // columns of rank j's tokens, packed [B, h_r, n_j] (this rank's own go straight to lse)
      const Tensor dst = j == r ? lse_heads(lse, heads_of(r)) : packed_lse(s, heads_of(r).count, nj);
      send[static_cast<size_t>(j)] = dst;
      for (int c : d_.layout.chunks_of(j)) {
        const int64_t at = d_.layout.local_offset(c);
        copy_view(lse_cols(dst, at, at + d_.layout.chunk(c).size()), lse_cols(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end),
                  comm_);
      }
      if (j != r) recv[static_cast<size_t>(j)] = packed_lse(s, heads_of(j).count, d_.local);
    }
    exchange(send, recv);
    for (int j = 0; j < d_.world; ++j)
      if (j != r) copy_view(lse_heads(lse, heads_of(j)), recv[static_cast<size_t>(j)], comm_);
  }

  // The reverse: `lse` ([B, Hq, n_r]) -> the head shard's LSE [B, h_r, S].
  template <class Heads>
  void lse_to_heads(const Tensor& lse, const Tensor& shard, Heads heads_of, Scratch& s) {
    const int r = d_.rank;
    std::vector<Tensor> send(static_cast<size_t>(d_.world)), recv(static_cast<size_t>(d_.world));
    for (int j = 0; j < d_.world; ++j) {
      const Tensor from = lse_heads(lse, heads_of(j));
      if (j == r) {
        recv[static_cast<size_t>(j)] = from;
        continue;
      }
      send[static_cast<size_t>(j)] = packed_lse(s, heads_of(j).count, d_.local);
      copy_view(send[static_cast<size_t>(j)], from, comm_);
      recv[static_cast<size_t>(j)] = packed_lse(s, heads_of(r).count, d_.layout.local_len(j));
    }
    exchange(send, recv);
    for (int j = 0; j < d_.world; ++j)
      for (int c : d_.layout.chunks_of(j)) {
        const int64_t at = d_.layout.local_offset(c);
        copy_view(lse_cols(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end),
                  lse_cols(recv[static_cast<size_t>(j)], at, at + d_.layout.chunk(c).size()), comm_);
      }
  }

  // Head group g of G: the g-th of G equal slices of each rank's query and key/value heads (G
  // divides this rank's key/value heads, so each slice holds whole GQA groups; G = 1: all).
  HeadRange q_group(int j, int g, int G) const { return slice(q_heads(j), g, G); }
  HeadRange kv_group(int j, int g, int G) const { return slice(kv_heads(j), g, G); }

  // The head shards of one call (head group g of G; rows: the group's whole sequence): q, k, v,
  // o and the LSE; for a backward also dO, dQ, dK, dV.
  struct Shards {
    Tensor q, k, v, o, lse, do_, dq, dk, dv;
  };
  Shards shards(Scratch& s, bool backward, int G = 1) const {
    const int64_t S = d_.layout.seq_len(), hq = q_group(d_.rank, 0, G).count, hkv = kv_group(d_.rank, 0, G).count;
    Shards h;
    h.q = packed(s, d_.dtype, S, hq), h.k = packed(s, d_.dtype, S, hkv), h.v = packed(s, d_.dtype, S, hkv);
    h.o = packed(s, d_.dtype, S, hq), h.lse = packed_lse(s, hq, S);
    if (backward) {
      h.do_ = packed(s, d_.dtype, S, hq);
      h.dq = packed(s, d_.dtype, S, hq), h.dk = packed(s, d_.dtype, S, hkv), h.dv = packed(s, d_.dtype, S, hkv);
    }
    return h;
  }

  // q, k, v (and a backward's o, dO and LSE) -> head group g's shards.
  void inputs_to_heads(const Tensor& q, const Tensor& k, const Tensor& v, const Shards& h, Scratch& s, const Tensor* o = nullptr,
                       const Tensor* do_ = nullptr, const Tensor* lse = nullptr, int g = 0, int G = 1) {
    const auto qs = [&](int j) { return q_group(j, g, G); };
    const auto kvs = [&](int j) { return kv_group(j, g, G); };
    to_heads(q, h.q, qs, s);
    to_heads(k, h.k, kvs, s);
    to_heads(v, h.v, kvs, s);
    if (o) to_heads(*o, h.o, qs, s);
    if (do_) to_heads(*do_, h.do_, qs, s);
    if (lse) lse_to_heads(*lse, h.lse, qs, s);
  }

  // The forward's O and LSE shards of head group g -> this rank's rows of o and lse.
  void outputs_to_sequence(const Shards& h, const Tensor& o, const Tensor& lse, Scratch& s, CUstream stream, int g = 0, int G = 1) {
    const auto qs = [&](int j) { return q_group(j, g, G); };
    to_sequence(h.o, o, qs, s, stream);
    lse_to_sequence(h.lse, lse, qs, s);
  }

  // The backward's dQ, dK, dV shards of head group g -> this rank's rows; key/value heads several
  // ranks hold (then G = 1) get their parts summed in f32 in rank order.
  void gradients_to_sequence(const Shards& h, const Tensor& dq, const Tensor& dk, const Tensor& dv, Scratch& s, CUstream stream,
                             int g = 0, int G = 1) {
    const auto kvs = [&](int j) { return kv_group(j, g, G); };
    to_sequence(h.dq, dq, [&](int j) { return q_group(j, g, G); }, s, stream);
    if (!replicated()) {
      to_sequence(h.dk, dk, kvs, s, stream);
      to_sequence(h.dv, dv, kvs, s, stream);
      return;
    }
    const Tensor dk_sum = packed(s, ir::DType::f32, d_.local, d_.Hkv), dv_sum = packed(s, ir::DType::f32, d_.local, d_.Hkv);
    to_sequence(h.dk, dk, kvs, s, stream, &dk_sum);
    st_.join(comm_, stream, 4);  // the next all-to-all's stage buffers are fresh, but keep the order simple
    to_sequence(h.dv, dv, kvs, s, stream, &dv_sum);
  }

  Tensor packed(Scratch& s, ir::DType dtype, int64_t n, int64_t h) const {
    return bshd(s.take(static_cast<size_t>(d_.B * n * h * d_.D * ir::byte_size(dtype))), dtype, d_.B, n, h, d_.D, n, st_.device);
  }
  // A tensor shaped like this rank's head shard of `heads` heads (never read): what the
  // single-GPU call's workspace sizes are computed from.
  Tensor shard_shape(int64_t heads) const {
    return bshd(1 << 8, d_.dtype, d_.B, d_.layout.seq_len(), heads, d_.D, d_.layout.seq_len(), st_.device);
  }
  Tensor packed_lse(Scratch& s, int64_t h, int64_t n) const {
    return bhs(s.take(static_cast<size_t>(d_.B * h * n * 4)), d_.B, h, n, n, st_.device);
  }

 private:
  // send[j] to rank j and recv[j] from it, every other rank, each packed LSE buffer one message
  void exchange(const std::vector<Tensor>& send, const std::vector<Tensor>& recv) {
    const auto count = [](const Tensor& t) { return static_cast<size_t>(t.size(0) * t.size(1) * t.size(2)); };
    runtime::nccl::Group group;
    for (int j = 0; j < d_.world; ++j) {
      if (j == d_.rank) continue;
      const Tensor &out = send[static_cast<size_t>(j)], &in = recv[static_cast<size_t>(j)];
      st_.comm->send(out.data, count(out), runtime::nccl::DataType::f32, st_.peer(j), comm_);
      st_.comm->recv(in.data, count(in), runtime::nccl::DataType::f32, st_.peer(j), comm_);
    }
    group.end();
  }

  ContextParallel::State& st_;
  const Dims& d_;
  CUstream comm_;
  std::vector<HeadRange> q_, kv_;
};

// Scratch bytes of a Ulysses call: the head shards, the packed sends and receives (a rank sends
// at most max(Hkv, W) key/value heads in all: replicated heads go to each rank that reads them),
// the LSE's packed columns, the replicated heads' f32 sums, and 256 bytes of rounding per piece.
inline size_t ulysses_bytes(const Dims& d, const UlyssesHeads& mine, bool backward, size_t ws_bytes, int head_groups = 1) {
  const size_t S = static_cast<size_t>(d.layout.seq_len()), n = static_cast<size_t>(d.layout.max_local_len());
  const size_t es = static_cast<size_t>(d.es()), B = static_cast<size_t>(d.B), D = static_cast<size_t>(d.D);
  const size_t Hq = static_cast<size_t>(d.Hq), Hkv_sent = static_cast<size_t>(std::max<int64_t>(d.Hkv, d.world));
  const size_t hq = static_cast<size_t>(mine.q_count), hkv = static_cast<size_t>(mine.kv_count);
  const size_t k = backward ? 4 : 2;  // q-like and kv-like tensors moved each way
  const size_t shards = k * B * S * (hq + hkv) * D * es;
  const size_t stages = k * B * n * (Hq + Hkv_sent) * D * es;
  const size_t lse = 2 * B * (S * hq + n * Hq) * 4;
  const size_t sums = backward ? 2 * B * n * static_cast<size_t>(d.Hkv) * D * 4 : 0;
  const size_t pieces = 256 * (16 * static_cast<size_t>(d.world) + 32) * static_cast<size_t>(head_groups);
  return shards + stages + lse + sums + ws_bytes + pieces;
}

}  // namespace tilejit::cp::detail
