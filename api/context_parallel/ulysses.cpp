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
#include <fmt/format.h>

#include <algorithm>

#include "api/context_parallel/internal.hpp"
#include "api/context_parallel/partials.hpp"

namespace tilejit::cp::detail {

namespace {

struct HeadRange {
  int64_t begin = 0, count = 0;
};

// Heads [h.begin, h.begin + h.count) of a [B, n, H, D] tensor; of an LSE [B, H, n].
Tensor heads(const Tensor& t, HeadRange h) {
  Tensor r = t;
  r.data += static_cast<uint64_t>(h.begin * t.stride(2) * ir::byte_size(t.dtype));
  r.sizes[2] = h.count;
  return r;
}
Tensor lse_heads(const Tensor& lse, HeadRange h) {
  Tensor r = lse;
  r.data += static_cast<uint64_t>(h.begin * lse.stride(1) * 4);
  r.sizes[1] = h.count;
  return r;
}

// dst = src for two views of one shape: [B, n, h, D] with (h, D) contiguous in each row, or an LSE
// [B, h, n]; one 2D copy per batch.
void copy_view(const Tensor& dst, const Tensor& src, CUstream stream) {
  const int64_t es = ir::byte_size(src.dtype);
  const bool lse = src.rank == 3;
  const int64_t height = src.size(1), width = lse ? src.size(2) * es : src.size(2) * src.size(3) * es;
  for (int64_t b = 0; b < src.size(0); ++b) {
    CUDA_MEMCPY2D c{};
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src.data + static_cast<uint64_t>(b * src.stride(0) * es);
    c.dstDevice = dst.data + static_cast<uint64_t>(b * dst.stride(0) * es);
    c.srcPitch = static_cast<size_t>(src.stride(1) * es);
    c.dstPitch = static_cast<size_t>(dst.stride(1) * es);
    c.WidthInBytes = static_cast<size_t>(width);
    c.Height = static_cast<size_t>(height);
    runtime::check_cu(runtime::Driver::get().api().Memcpy2DAsync(&c, stream), "cuMemcpy2DAsync");
  }
}

Tensor lse_cols(const Tensor& lse, int64_t begin, int64_t end) { return lse_rows(lse, begin, end); }

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

  // LSE [B, h_r, S] of the head shard -> the q_heads(j) rows of `lse` ([B, Hq, n_r]).
  void lse_to_sequence(const Tensor& shard, const Tensor& lse, Scratch& s) {
    const int r = d_.rank;
    std::vector<Tensor> send(static_cast<size_t>(d_.world)), recv(static_cast<size_t>(d_.world));
    for (int j = 0; j < d_.world; ++j) {
      const int64_t nj = d_.layout.local_len(j);
      // columns of rank j's tokens, packed [B, h_r, n_j] (this rank's own go straight to lse)
      const Tensor dst = j == r ? lse_heads(lse, q_heads(r)) : packed_lse(s, q_heads(r).count, nj);
      send[static_cast<size_t>(j)] = dst;
      for (int c : d_.layout.chunks_of(j)) {
        const int64_t at = d_.layout.local_offset(c);
        copy_view(lse_cols(dst, at, at + d_.layout.chunk(c).size()), lse_cols(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end),
                  comm_);
      }
      if (j != r) recv[static_cast<size_t>(j)] = packed_lse(s, q_heads(j).count, d_.local);
    }
    exchange(send, recv);
    for (int j = 0; j < d_.world; ++j)
      if (j != r) copy_view(lse_heads(lse, q_heads(j)), recv[static_cast<size_t>(j)], comm_);
  }

  // The reverse: `lse` ([B, Hq, n_r]) -> the head shard's LSE [B, h_r, S].
  void lse_to_heads(const Tensor& lse, const Tensor& shard, Scratch& s) {
    const int r = d_.rank;
    std::vector<Tensor> send(static_cast<size_t>(d_.world)), recv(static_cast<size_t>(d_.world));
    for (int j = 0; j < d_.world; ++j) {
      const Tensor from = lse_heads(lse, q_heads(j));
      if (j == r) {
        recv[static_cast<size_t>(j)] = from;
        continue;
      }
      send[static_cast<size_t>(j)] = packed_lse(s, q_heads(j).count, d_.local);
      copy_view(send[static_cast<size_t>(j)], from, comm_);
      recv[static_cast<size_t>(j)] = packed_lse(s, q_heads(r).count, d_.layout.local_len(j));
    }
    exchange(send, recv);
    for (int j = 0; j < d_.world; ++j)
      for (int c : d_.layout.chunks_of(j)) {
        const int64_t at = d_.layout.local_offset(c);
        copy_view(lse_cols(shard, d_.layout.chunk(c).begin, d_.layout.chunk(c).end),
                  lse_cols(recv[static_cast<size_t>(j)], at, at + d_.layout.chunk(c).size()), comm_);
      }
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
      st_.comm->send(out.data, count(out), runtime::nccl::DataType::f32, j, comm_);
      st_.comm->recv(in.data, count(in), runtime::nccl::DataType::f32, j, comm_);
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
size_t ulysses_bytes(const Dims& d, const UlyssesHeads& mine, bool backward, size_t ws_bytes) {
  const size_t S = static_cast<size_t>(d.layout.seq_len()), n = static_cast<size_t>(d.layout.max_local_len());
  const size_t es = static_cast<size_t>(d.es()), B = static_cast<size_t>(d.B), D = static_cast<size_t>(d.D);
  const size_t Hq = static_cast<size_t>(d.Hq), Hkv_sent = static_cast<size_t>(std::max<int64_t>(d.Hkv, d.world));
  const size_t hq = static_cast<size_t>(mine.q_count), hkv = static_cast<size_t>(mine.kv_count);
  const size_t k = backward ? 4 : 2;  // q-like and kv-like tensors moved each way
  const size_t shards = k * B * S * (hq + hkv) * D * es;
  const size_t stages = k * B * n * (Hq + Hkv_sent) * D * es;
  const size_t lse = 2 * B * (S * hq + n * Hq) * 4;
  const size_t sums = backward ? 2 * B * n * static_cast<size_t>(d.Hkv) * D * 4 : 0;
  const size_t pieces = 256 * (16 * static_cast<size_t>(d.world) + 32);
  return shards + stages + lse + sums + ws_bytes + pieces;
}

// The call's options on this rank's heads: per-head tensors (ALiBi slopes, a per-head block table)
// sliced to them.
attention::Options head_options(const attention::Options& opts, HeadRange h, int64_t Hq) {
  attention::Options a = opts;
  if (a.score_mod.alibi_slopes) {
    Tensor& t = *a.score_mod.alibi_slopes;
    t.data += static_cast<uint64_t>(h.begin * t.stride(0) * 4);
    t.sizes[0] = h.count;
  }
  if (a.mask && a.mask->block_table && a.mask->block_table->size(1) == Hq && Hq > 1) {
    Tensor& t = *a.mask->block_table;
    t.data += static_cast<uint64_t>(h.begin * t.stride(1));
    t.sizes[1] = h.count;
  }
  return a;
}

}  // namespace

void ulysses_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, const attention::Options& opts, CUstream stream) {
  Ulysses u(st, d);
  const int r = d.rank;
  const int64_t S = d.layout.seq_len(), hq = u.q_heads(r).count, hkv = u.kv_heads(r).count;
  // a mask's block lists (document kinds) in the scratch too: the call then allocates nothing
  const attention::Options a = head_options(opts, u.q_heads(r), d.Hq);
  const size_t ws_bytes = attention::forward_workspace_bytes(u.shard_shape(hq), u.shard_shape(hkv), a);
  Scratch s(st.scratch_base(ulysses_bytes(d, u.mine(), false, ws_bytes), stream));
  const Tensor qh = u.packed(s, d.dtype, S, hq), kh = u.packed(s, d.dtype, S, hkv), vh = u.packed(s, d.dtype, S, hkv);
  const Tensor oh = u.packed(s, d.dtype, S, hq), lseh = u.packed_lse(s, hq, S);
  const attention::Workspace ws{ws_bytes ? s.take(ws_bytes) : 0, ws_bytes};
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  const auto qs = [&](int j) { return u.q_heads(j); };
  const auto kvs = [&](int j) { return u.kv_heads(j); };
  u.to_heads(q, qh, qs, s);
  u.to_heads(k, kh, kvs, s);
  u.to_heads(v, vh, kvs, s);
  st.join(stream, comm, 1);
  attention::forward(qh, kh, vh, oh, lseh, a, stream, ws);
  st.join(comm, stream, 2);
  u.to_sequence(oh, o, qs, s, stream);
  u.lse_to_sequence(lseh, lse, s);
  st.join(stream, comm, 3);
}

void ulysses_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                      const attention::Options& opts, CUstream stream) {
  Ulysses u(st, d);
  const int r = d.rank;
  const int64_t S = d.layout.seq_len(), hq = u.q_heads(r).count, hkv = u.kv_heads(r).count;
  const attention::Options a = head_options(opts, u.q_heads(r), d.Hq);
  const size_t ws_bytes = attention::backward_workspace_bytes(u.shard_shape(hq), u.shard_shape(hkv), a);
  Scratch s(st.scratch_base(ulysses_bytes(d, u.mine(), true, ws_bytes), stream));
  const Tensor qh = u.packed(s, d.dtype, S, hq), kh = u.packed(s, d.dtype, S, hkv), vh = u.packed(s, d.dtype, S, hkv);
  const Tensor oh = u.packed(s, d.dtype, S, hq), doh = u.packed(s, d.dtype, S, hq), lseh = u.packed_lse(s, hq, S);
  const Tensor dqh = u.packed(s, d.dtype, S, hq), dkh = u.packed(s, d.dtype, S, hkv), dvh = u.packed(s, d.dtype, S, hkv);
  const attention::Workspace ws{s.take(ws_bytes), ws_bytes};
  const CUstream comm = st.comm_stream.handle();
  st.join(comm, stream, 0);
  const auto qs = [&](int j) { return u.q_heads(j); };
  const auto kvs = [&](int j) { return u.kv_heads(j); };
  u.to_heads(q, qh, qs, s);
  u.to_heads(k, kh, kvs, s);
  u.to_heads(v, vh, kvs, s);
  u.to_heads(o, oh, qs, s);
  u.to_heads(do_, doh, qs, s);
  u.lse_to_heads(lse, lseh, s);
  st.join(stream, comm, 1);
  attention::backward(qh, kh, vh, oh, doh, lseh, dqh, dkh, dvh, a, stream, ws);
  st.join(comm, stream, 2);
  u.to_sequence(dqh, dq, qs, s, stream);
  if (u.replicated()) {
    const Tensor dk_sum = u.packed(s, ir::DType::f32, d.local, d.Hkv), dv_sum = u.packed(s, ir::DType::f32, d.local, d.Hkv);
    u.to_sequence(dkh, dk, kvs, s, stream, &dk_sum);
    st.join(comm, stream, 4);  // the next all-to-all's stage buffers are fresh, but keep the order simple
    u.to_sequence(dvh, dv, kvs, s, stream, &dv_sum);
  } else {
    u.to_sequence(dkh, dk, kvs, s, stream);
    u.to_sequence(dvh, dv, kvs, s, stream);
  }
  st.join(stream, comm, 3);
}

}  // namespace tilejit::cp::detail
