// Allgather mode (Llama 3's): every rank gathers K and V in global order, then each local query
// chunk attends to the key prefix its causality allows (make_plan; bottom-right alignment makes a
// prefix exact), writing O and LSE directly: nothing to merge. Backward: dK, dV of the whole
// sequence summed in f32 on each rank, then each chunk's sums sent to its owner, which adds them in
// rank order (deterministic).
#include <fmt/format.h>

#include "api/context_parallel/internal.hpp"
#include "api/context_parallel/partials.hpp"

namespace tilejit::cp::detail {

namespace {

// Every rank's chunks of `local` ([B, S_local, H, D]) into `global` ([B, S, H, D], global order),
// on the communication stream: own chunks copied, the others received.
void gather(ContextParallel::State& st, const Dims& d, const Tensor& local, const Tensor& global) {
  st.log("gather {} local rows into {}", local.size(1), global.size(1));
  const runtime::DriverApi& api = runtime::Driver::get().api();
  const int64_t es = ir::byte_size(local.dtype), row = local.size(2) * local.size(3) * es;
  for (int c : d.layout.chunks_of(d.rank)) {
    const ChunkRange g = d.layout.chunk(c);
    const int64_t at = d.layout.local_offset(c);
    for (int64_t b = 0; b < d.B; ++b)
      runtime::check_cu(api.MemcpyDtoDAsync(global.data + static_cast<uint64_t>(b * global.stride(0) * es + g.begin * row),
                                            local.data + static_cast<uint64_t>(b * local.stride(0) * es + at * row),
                                            static_cast<size_t>(g.size() * row), st.comm_stream.handle()),
                        "cuMemcpyDtoDAsync");
  }
  runtime::nccl::Group group;
  for (int p = 0; p < d.world; ++p) {
    if (p == d.rank) continue;
    for (int c : d.layout.chunks_of(d.rank)) {
      const int64_t at = d.layout.local_offset(c);
      st.send_rows(rows(local, at, at + d.layout.chunk(c).size()), p);
    }
    for (int c : d.layout.chunks_of(p)) st.recv_rows(rows(global, d.layout.chunk(c).begin, d.layout.chunk(c).end), p);
  }
  group.end();
}

// A tensor shaped like the gathered keys ([B, S, Hkv, D]; never read): what workspace sizes of
// calls against key prefixes up to the whole sequence are computed from.
Tensor gathered_shape(const Dims& d, const Tensor& k) {
  Tensor g = bshd(k.data, k.dtype, d.B, d.layout.seq_len(), d.Hkv, d.D, d.layout.seq_len(), k.device);
  return g;
}

}  // namespace

void allgather_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                       const Tensor& lse, const attention::Options& opts, CUstream stream) {
  const Plan plan = make_plan(Mode::allgather, d.layout, opts.causal || opts.mask.has_value(), d.rank, /*global_runs=*/opts.dropout_p > 0);
  const int64_t S = d.layout.seq_len();
  const size_t kv_bytes = static_cast<size_t>(d.B * S * d.Hkv * d.D * d.es());
  const size_t ws_bytes = attention::forward_workspace_bytes(q, gathered_shape(d, k), dense_options(opts));  // (a mask's block lists)
  Scratch s(st.scratch_base(2 * (kv_bytes + 256) + ws_bytes + 256, stream));
  const Tensor kg = bshd(s.take(kv_bytes), d.dtype, d.B, S, d.Hkv, d.D, S, st.device);
  const Tensor vg = bshd(s.take(kv_bytes), d.dtype, d.B, S, d.Hkv, d.D, S, st.device);
  const attention::Workspace ws{ws_bytes ? s.take(ws_bytes) : 0, ws_bytes};
  st.join(st.comm_stream.handle(), stream, 0);
  gather(st, d, k, kg);
  gather(st, d, v, vg);
  st.join(stream, st.comm_stream.handle(), 1);
  for (const AttentionCall& call : plan.steps[0].calls)
    attention::forward(rows(q, call.q_begin, call.q_end), rows(kg, call.k_begin, call.k_end), rows(vg, call.k_begin, call.k_end),
                       rows(o, call.q_begin, call.q_end), lse_rows(lse, call.q_begin, call.q_end), call_options(opts, call, d.Hq), stream,
                       ws);
}

void allgather_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const attention::Options& opts, CUstream stream) {
  const Plan plan = make_plan(Mode::allgather, d.layout, opts.causal || opts.mask.has_value(), d.rank, /*global_runs=*/opts.dropout_p > 0);
  const int64_t S = d.layout.seq_len(), W = d.world;
  const size_t ws_bytes = attention::backward_workspace_bytes(q, gathered_shape(d, k), dense_options(opts));
  const size_t kv_bytes = static_cast<size_t>(d.B * S * d.Hkv * d.D * d.es()), kv32 = static_cast<size_t>(d.B * S * d.Hkv * d.D * 4);
  const size_t in32 = static_cast<size_t>(W * d.B * d.local * d.Hkv * d.D * 4);
  Scratch s(st.scratch_base(4 * (kv_bytes + 256) + 2 * (kv32 + 256) + 2 * (in32 + 256) + ws_bytes + 256, stream));
  const Tensor kg = bshd(s.take(kv_bytes), d.dtype, d.B, S, d.Hkv, d.D, S, st.device);
  const Tensor vg = bshd(s.take(kv_bytes), d.dtype, d.B, S, d.Hkv, d.D, S, st.device);
  const Tensor dk_part = bshd(s.take(kv_bytes), d.dtype, d.B, S, d.Hkv, d.D, S, st.device);
  const Tensor dv_part = bshd(s.take(kv_bytes), d.dtype, d.B, S, d.Hkv, d.D, S, st.device);
  const Tensor dk_all = bshd(s.take(kv32), ir::DType::f32, d.B, S, d.Hkv, d.D, S, st.device);
  const Tensor dv_all = bshd(s.take(kv32), ir::DType::f32, d.B, S, d.Hkv, d.D, S, st.device);
  // the sums of this rank's chunks from every rank: [W][B, S_local, Hkv, D] f32
  const uint64_t dk_in = s.take(in32), dv_in = s.take(in32);
  const attention::Workspace ws{s.take(ws_bytes), ws_bytes};
  const runtime::DriverApi& api = runtime::Driver::get().api();
  runtime::check_cu(api.MemsetD8Async(dk_all.data, 0, kv32, stream), "cuMemsetD8Async");
  runtime::check_cu(api.MemsetD8Async(dv_all.data, 0, kv32, stream), "cuMemsetD8Async");
  st.join(st.comm_stream.handle(), stream, 0);
  gather(st, d, k, kg);
  gather(st, d, v, vg);
  st.join(stream, st.comm_stream.handle(), 1);
  for (const AttentionCall& call : plan.steps[0].calls) {
    const Tensor dkp = rows(dk_part, 0, call.k_len()), dvp = rows(dv_part, 0, call.k_len());
    attention::backward(rows(q, call.q_begin, call.q_end), rows(kg, call.k_begin, call.k_end), rows(vg, call.k_begin, call.k_end),
                        rows(o, call.q_begin, call.q_end), rows(do_, call.q_begin, call.q_end), lse_rows(lse, call.q_begin, call.q_end),
                        rows(dq, call.q_begin, call.q_end), dkp, dvp, call_options(opts, call, d.Hq), stream, ws);
    accumulate(rows(dk_all, call.k_begin, call.k_end), dkp, false, stream);
    accumulate(rows(dv_all, call.k_begin, call.k_end), dvp, false, stream);
  }
  // each chunk's sums to its owner: slot p of dk_in holds rank p's sums of this rank's rows
  auto slot = [&](uint64_t base, int64_t p) {
    return bshd(base + static_cast<uint64_t>(p * d.B * d.local * d.Hkv * d.D * 4), ir::DType::f32, d.B, d.local, d.Hkv, d.D, d.local,
                st.device);
  };
  st.join(st.comm_stream.handle(), stream, 2);
  st.log("dK/dV sums to their owners");
  {
    runtime::nccl::Group group;
    for (int p = 0; p < d.world; ++p) {
      if (p == d.rank) continue;
      for (int c : d.layout.chunks_of(p)) {
        st.send_rows(rows(dk_all, d.layout.chunk(c).begin, d.layout.chunk(c).end), p);
        st.send_rows(rows(dv_all, d.layout.chunk(c).begin, d.layout.chunk(c).end), p);
      }
      for (int c : d.layout.chunks_of(d.rank)) {
        const int64_t at = d.layout.local_offset(c), n = d.layout.chunk(c).size();
        st.recv_rows(rows(slot(dk_in, p), at, at + n), p);
        st.recv_rows(rows(slot(dv_in, p), at, at + n), p);
      }
    }
    group.end();
  }
  st.join(stream, st.comm_stream.handle(), 3);
  // sums in rank order 0, 1, ..., W - 1 (this rank's own from dk_all) into slot 0's place... each
  // chunk: acc = part_0; acc += part_p for p = 1.. (slot of this rank filled from dk_all first)
  for (int c : d.layout.chunks_of(d.rank)) {
    const int64_t at = d.layout.local_offset(c), n = d.layout.chunk(c).size(), g = d.layout.chunk(c).begin;
    const Tensor own_k = rows(dk_all, g, g + n), own_v = rows(dv_all, g, g + n);
    const Tensor acc_k = rows(slot(dk_in, d.rank), at, at + n), acc_v = rows(slot(dv_in, d.rank), at, at + n);
    accumulate(acc_k, d.rank == 0 ? own_k : rows(slot(dk_in, 0), at, at + n), true, stream);
    accumulate(acc_v, d.rank == 0 ? own_v : rows(slot(dv_in, 0), at, at + n), true, stream);
    for (int p = 1; p < d.world; ++p) {
      accumulate(acc_k, p == d.rank ? own_k : rows(slot(dk_in, p), at, at + n), false, stream);
      accumulate(acc_v, p == d.rank ? own_v : rows(slot(dv_in, p), at, at + n), false, stream);
    }
  }
  convert(slot(dk_in, d.rank), dk, stream);
  convert(slot(dv_in, d.rank), dv, stream);
}

}  // namespace tilejit::cp::detail
