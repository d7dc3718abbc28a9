// Allgather mode (Llama 3's): every rank gathers K and V in global order, then each local query
// chunk attends to the key prefix its causality allows (make_plan; bottom-right alignment makes a
// prefix exact), writing O and LSE directly: nothing to merge. Backward: dK, dV of the whole
// sequence summed in f32 on each rank (the dK/dV kernels add into the sums: accumulate_gradients),
// then each chunk's sums sent to its owner, which adds them in rank order (deterministic). The calls
// run in two phases (attention::BackwardPhase): every call's dK/dV first, then, while the sums
// travel, every call's dQ (written in the inputs' dtype).
//
// Head groups (Options::head_groups): the gather runs per group of key/value heads (with their
// query heads) on the communication stream, so that group g's calls run while group g + 1's keys
// arrive; in the backward group g's sums travel while group g + 1's calls run. Per head the same
// kernel sees the same rows, so the result does not depend on the grouping.
#include <fmt/format.h>

#include <vector>

#include "api/context_parallel/heads.hpp"
#include "api/context_parallel/internal.hpp"
#include "api/context_parallel/partials.hpp"

namespace tilejit::cp::detail {

namespace {

// Event indices of head group g: its keys and values gathered (communication stream), its calls
// done (the caller's stream), its dK/dV sums received (communication stream).
size_t gathered(int g) { return 10 + 3 * static_cast<size_t>(g); }
size_t computed(int g) { return 11 + 3 * static_cast<size_t>(g); }
size_t summed(int g) { return 12 + 3 * static_cast<size_t>(g); }

// Head group g of G: its key/value heads and the query heads that read them (whole GQA groups).
struct HeadGroup {
  HeadRange q, kv;
};
HeadGroup head_group(const Dims& d, int g, int G) { return {slice({0, d.Hq}, g, G), slice({0, d.Hkv}, g, G)}; }

// Every rank's chunks of `local` ([B, S_local, h, D], maybe a head slice) into `global` ([B, S, h,
// D] contiguous, global order), on the communication stream: own chunks copied, the others
// received; sent from `local`, or from `stage` (contiguous like it) packed first when its rows are
// not contiguous.
void gather(ContextParallel::State& st, const Dims& d, const Tensor& local, const Tensor& global, const Tensor& stage) {
  st.log("gather {} local rows of {} heads into {}", local.size(1), local.size(2), global.size(1));
  const CUstream comm = st.comm_stream.handle();
  for (int c : d.layout.chunks_of(d.rank)) {
    const ChunkRange g = d.layout.chunk(c);
    const int64_t at = d.layout.local_offset(c);
    copy_view(rows(global, g.begin, g.end), rows(local, at, at + g.size()), comm);
  }
  const bool direct = contiguous_rows(local);
  if (!direct) copy_view(stage, local, comm);
  const Tensor& src = direct ? local : stage;
  runtime::nccl::Group group;
  for (int p = 0; p < d.world; ++p) {
    if (p == d.rank) continue;
    for (int c : d.layout.chunks_of(d.rank)) {
      const int64_t at = d.layout.local_offset(c);
      st.send_rows(rows(src, at, at + d.layout.chunk(c).size()), p);
    }
    for (int c : d.layout.chunks_of(p)) st.recv_rows(rows(global, d.layout.chunk(c).begin, d.layout.chunk(c).end), p);
  }
  group.end();
}

// A tensor shaped like one group's gathered keys ([B, S, h, D]; never read): what workspace sizes of
// calls against key prefixes up to the whole sequence are computed from.
Tensor gathered_shape(const Dims& d, const Tensor& k, int64_t h) {
  return bshd(k.data, k.dtype, d.B, d.layout.seq_len(), h, d.D, d.layout.seq_len(), k.device);
}

// Each group's options: its heads placed (dropout's head index, per-head mask tensors); pipelined
// groups on one program per tile.
std::vector<attention::Options> group_options(const Dims& d, const attention::Options& opts, int G) {
  std::vector<attention::Options> a;
  for (int g = 0; g < G; ++g) {
    a.push_back(head_options(opts, head_group(d, g, G).q, d.Hq));
    if (G > 1) per_tile_unless_chosen(a.back());
  }
  return a;
}

// A group's gathered keys and values, and (G > 1) the packed copies of its local heads sent.
struct GroupKv {
  Tensor k, v, k_stage, v_stage;
};
GroupKv carve_group_kv(Scratch& s, const Dims& d, int64_t h, bool staged, int device) {
  const int64_t S = d.layout.seq_len();
  const size_t kv_bytes = static_cast<size_t>(d.B * S * h * d.D * d.es()), stage_bytes = static_cast<size_t>(d.B * d.local * h * d.D * d.es());
  GroupKv x;
  x.k = bshd(s.take(kv_bytes), d.dtype, d.B, S, h, d.D, S, device);
  x.v = bshd(s.take(kv_bytes), d.dtype, d.B, S, h, d.D, S, device);
  if (staged) {
    x.k_stage = bshd(s.take(stage_bytes), d.dtype, d.B, d.local, h, d.D, d.local, device);
    x.v_stage = bshd(s.take(stage_bytes), d.dtype, d.B, d.local, h, d.D, d.local, device);
  }
  return x;
}

// Queues every group's gather on the communication stream (after the work queued on `stream`),
// marking gathered(g) after group g.
void gather_groups(ContextParallel::State& st, const Dims& d, const Tensor& k, const Tensor& v, const std::vector<GroupKv>& kv,
                   CUstream stream) {
  const int G = static_cast<int>(kv.size());
  st.join(st.comm_stream.handle(), stream, 0);
  for (int g = 0; g < G; ++g) {
    const HeadRange h = head_group(d, g, G).kv;
    gather(st, d, heads(k, h), kv[static_cast<size_t>(g)].k, kv[static_cast<size_t>(g)].k_stage);
    gather(st, d, heads(v, h), kv[static_cast<size_t>(g)].v, kv[static_cast<size_t>(g)].v_stage);
    st.mark(gathered(g), st.comm_stream.handle());
    st.stamp(st.comm_stream.handle(), "head group {}: K/V gathered", g);
  }
}

}  // namespace

void allgather_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                       const Tensor& lse, const attention::Options& opts, int head_groups, CUstream stream) {
  const Plan plan = make_plan(Mode::allgather, d.layout, opts.causal || opts.mask.has_value(), d.rank, /*global_runs=*/opts.dropout_p > 0);
  const int G = allgather_head_groups(static_cast<int>(d.Hkv), head_groups);
  const std::vector<attention::Options> a = group_options(d, opts, G);
  const HeadGroup first = head_group(d, 0, G);
  // (a mask's block lists)
  const size_t ws_bytes = attention::forward_workspace_bytes(heads(q, first.q), gathered_shape(d, k, first.kv.count), dense_options(a[0]));
  auto carve = [&](uint64_t base) {
    Scratch s(base);
    std::vector<GroupKv> kv;
    for (int g = 0; g < G; ++g) kv.push_back(carve_group_kv(s, d, first.kv.count, G > 1, st.device));
    const attention::Workspace ws{ws_bytes ? s.take(ws_bytes) : 0, ws_bytes};
    return std::tuple{kv, ws, s.used()};
  };
  const auto [kv, ws, used] = carve(st.scratch_base(std::get<2>(carve(0)), stream));
  gather_groups(st, d, k, v, kv, stream);
  for (int g = 0; g < G; ++g) {
    const HeadGroup h = head_group(d, g, G);
    const GroupKv& x = kv[static_cast<size_t>(g)];
    const Tensor qg = heads(q, h.q), og = heads(o, h.q), lg = lse_heads(lse, h.q);
    st.wait(stream, gathered(g));
    for (const AttentionCall& call : plan.steps[0].calls) {
      attention::forward(rows(qg, call.q_begin, call.q_end), rows(x.k, call.k_begin, call.k_end), rows(x.v, call.k_begin, call.k_end),
                         rows(og, call.q_begin, call.q_end), lse_rows(lg, call.q_begin, call.q_end),
                         call_options(a[static_cast<size_t>(g)], call, d.Hq), stream, ws);
      st.stamp(stream, "head group {}: forward q {}-{} k {}-{}", g, call.q_begin, call.q_end, call.k_begin, call.k_end);
    }
  }
}

void allgather_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const attention::Options& opts, int head_groups, CUstream stream) {
  const Plan plan = make_plan(Mode::allgather, d.layout, opts.causal || opts.mask.has_value(), d.rank, /*global_runs=*/opts.dropout_p > 0);
  const int G = allgather_head_groups(static_cast<int>(d.Hkv), head_groups);
  const std::vector<attention::Options> a = group_options(d, opts, G);
  const HeadGroup first = head_group(d, 0, G);
  const int64_t S = d.layout.seq_len(), W = d.world, h = first.kv.count;
  const size_t ws_bytes = attention::backward_workspace_bytes(heads(q, first.q), gathered_shape(d, k, h), dense_options(a[0]));
  const size_t kv32 = static_cast<size_t>(d.B * S * h * d.D * 4);
  const size_t in32 = static_cast<size_t>(W * d.B * d.local * h * d.D * 4);
  // atomic (runner: recompute or atomic): each call's whole backward (dQ inside dK/dV), adding every
  // gradient (accumulate_gradients): dQ into f32 sums of this rank's rows, converted at the end
  const bool whole = whole_calls(opts);
  const size_t dq32_bytes = whole ? static_cast<size_t>(d.B * d.local * d.Hq * d.D * 4) : 0;
  // Per group: the gathered keys and values, dK / dV of the whole sequence summed in f32, and the
  // sums of this rank's chunks from every rank ([W][B, S_local, h, D] f32). Shared by the groups
  // (one stream): the workspaces.
  struct GroupGrads {
    Tensor dk_all, dv_all;
    uint64_t dk_in = 0, dv_in = 0;
  };
  auto carve = [&](uint64_t base) {
    Scratch s(base);
    std::vector<GroupKv> kv;
    std::vector<GroupGrads> grads;
    for (int g = 0; g < G; ++g) {
      kv.push_back(carve_group_kv(s, d, h, G > 1, st.device));
      GroupGrads x;
      x.dk_all = bshd(s.take(kv32), ir::DType::f32, d.B, S, h, d.D, S, st.device);
      x.dv_all = bshd(s.take(kv32), ir::DType::f32, d.B, S, h, d.D, S, st.device);
      x.dk_in = s.take(in32), x.dv_in = s.take(in32);
      grads.push_back(x);
    }
    // one workspace a call: its dQ phase reads the Delta its dK/dV phase left there
    std::vector<attention::Workspace> ws;
    for (size_t i = 0; i < plan.steps[0].calls.size(); ++i) ws.push_back({s.take(ws_bytes), ws_bytes});
    const Tensor dq32 = whole ? bshd(s.take(dq32_bytes), ir::DType::f32, d.B, d.local, d.Hq, d.D, d.local, st.device) : Tensor{};
    return std::tuple{kv, grads, ws, dq32, s.used()};
  };
  const auto [kv, grads, ws, dq32, used] = carve(st.scratch_base(std::get<4>(carve(0)), stream));
  const runtime::DriverApi& api = runtime::Driver::get().api();
  if (whole) runtime::check_cu(api.MemsetD8Async(dq32.data, 0, dq32_bytes, stream), "cuMemsetD8Async");
  for (const GroupGrads& x : grads) {
    runtime::check_cu(api.MemsetD8Async(x.dk_all.data, 0, kv32, stream), "cuMemsetD8Async");
    runtime::check_cu(api.MemsetD8Async(x.dv_all.data, 0, kv32, stream), "cuMemsetD8Async");
  }
  st.stamp(stream, "sums zeroed");
  gather_groups(st, d, k, v, kv, stream);
  for (int g = 0; g < G; ++g) {
    const HeadGroup hg = head_group(d, g, G);
    const GroupKv& x = kv[static_cast<size_t>(g)];
    const GroupGrads& y = grads[static_cast<size_t>(g)];
    const Tensor qg = heads(q, hg.q), og = heads(o, hg.q), dog = heads(do_, hg.q), lg = lse_heads(lse, hg.q), dqg = heads(dq, hg.q);
    st.wait(stream, gathered(g));
    // every call's dK/dV phase, its kernels adding into the f32 sums (accumulate_gradients, in call
    // order); then (the sums on their way: below) the dQ phases, writing dQ. Atomic: the whole
    // calls, dQ added into dq32, before the sums leave
    const Tensor dq_out = whole ? heads(dq32, hg.q) : dqg;
    auto call_backward = [&](size_t i, attention::BackwardPhase phase) {
      const AttentionCall& call = plan.steps[0].calls[i];
      attention::Options co = call_options(a[static_cast<size_t>(g)], call, d.Hq);
      co.backward_phase = phase;
      co.accumulate_gradients = phase != attention::BackwardPhase::dq;
      attention::backward(rows(qg, call.q_begin, call.q_end), rows(x.k, call.k_begin, call.k_end), rows(x.v, call.k_begin, call.k_end),
                          rows(og, call.q_begin, call.q_end), rows(dog, call.q_begin, call.q_end), lse_rows(lg, call.q_begin, call.q_end),
                          rows(dq_out, call.q_begin, call.q_end), rows(y.dk_all, call.k_begin, call.k_end),
                          rows(y.dv_all, call.k_begin, call.k_end), co, stream, ws[i]);
      st.stamp(stream, "head group {}: {} phase q {}-{} k {}-{}", g, attention::name(phase), call.q_begin, call.q_end, call.k_begin,
               call.k_end);
    };
    for (size_t i = 0; i < plan.steps[0].calls.size(); ++i)
      call_backward(i, whole ? attention::BackwardPhase::all : attention::BackwardPhase::dkdv);
    st.mark(computed(g), stream);
    if (!whole)
      for (size_t i = 0; i < plan.steps[0].calls.size(); ++i) call_backward(i, attention::BackwardPhase::dq);
  }
  if (whole) convert(dq32, dq, stream);
  // each chunk's sums to its owner: slot p of dk_in holds rank p's sums of this rank's rows
  auto slot = [&](uint64_t base, int64_t p) {
    return bshd(base + static_cast<uint64_t>(p * d.B * d.local * h * d.D * 4), ir::DType::f32, d.B, d.local, h, d.D, d.local, st.device);
  };
  const CUstream comm = st.comm_stream.handle();
  for (int g = 0; g < G; ++g) {
    const GroupGrads& y = grads[static_cast<size_t>(g)];
    st.wait(comm, computed(g));
    st.log("dK/dV sums of head group {} to their owners", g);
    runtime::nccl::Group group;
    for (int p = 0; p < d.world; ++p) {
      if (p == d.rank) continue;
      for (int c : d.layout.chunks_of(p)) {
        st.send_rows(rows(y.dk_all, d.layout.chunk(c).begin, d.layout.chunk(c).end), p);
        st.send_rows(rows(y.dv_all, d.layout.chunk(c).begin, d.layout.chunk(c).end), p);
      }
      for (int c : d.layout.chunks_of(d.rank)) {
        const int64_t at = d.layout.local_offset(c), n = d.layout.chunk(c).size();
        st.recv_rows(rows(slot(y.dk_in, p), at, at + n), p);
        st.recv_rows(rows(slot(y.dv_in, p), at, at + n), p);
      }
    }
    group.end();
    st.mark(summed(g), comm);
    st.stamp(comm, "head group {}: dK/dV sums exchanged", g);
  }
  // per group and chunk, the sums in rank order 0, 1, ..., W - 1 (this rank's own from dk_all)
  // into this rank's slot, then converted into its heads of dk, dv
  for (int g = 0; g < G; ++g) {
    const GroupGrads& y = grads[static_cast<size_t>(g)];
    st.wait(stream, summed(g));
    for (int c : d.layout.chunks_of(d.rank)) {
      const int64_t at = d.layout.local_offset(c), n = d.layout.chunk(c).size(), b = d.layout.chunk(c).begin;
      const Tensor own_k = rows(y.dk_all, b, b + n), own_v = rows(y.dv_all, b, b + n);
      const Tensor acc_k = rows(slot(y.dk_in, d.rank), at, at + n), acc_v = rows(slot(y.dv_in, d.rank), at, at + n);
      accumulate(acc_k, d.rank == 0 ? own_k : rows(slot(y.dk_in, 0), at, at + n), true, stream);
      accumulate(acc_v, d.rank == 0 ? own_v : rows(slot(y.dv_in, 0), at, at + n), true, stream);
      for (int p = 1; p < d.world; ++p) {
        accumulate(acc_k, p == d.rank ? own_k : rows(slot(y.dk_in, p), at, at + n), false, stream);
        accumulate(acc_v, p == d.rank ? own_v : rows(slot(y.dv_in, p), at, at + n), false, stream);
      }
    }
    const HeadRange kvh = head_group(d, g, G).kv;
    convert(slot(y.dk_in, d.rank), heads(dk, kvh), stream);
    convert(slot(y.dv_in, d.rank), heads(dv, kvh), stream);
    st.stamp(stream, "head group {}: sums added in rank order, converted", g);
  }
}

}  // namespace tilejit::cp::detail
