// Ring mode: K and V travel around the ring, one shard per step (step s holds the shard of rank
// r - s), while each step's calls (make_plan) run on the caller's stream. Forward: partials
// merged into f32 O and the caller's LSE. Backward: dQ summed locally in f32; dK and dV summed in
// f32 travel with their shard, each rank adding its part to what arrives, so every shard's sum is
// taken in the same ring order each run (deterministic), and the last hop returns it to its owner.
//
// Streams: the communication stream prefetches step s + 1's shard while step s computes; a receive
// into a buffer waits for the step that last read it (events). Backward: each step runs its calls'
// dK/dV phases, adds the sums that arrived, and sends the shard's sums on while its dQ phases and
// step s + 1's dK/dV phases run (the caller's stream waits for them only where it adds them); the
// last hop hides behind the last step's dQ phases (decision 068). With the atomic reduction a
// step runs its calls whole (dQ inside dK/dV) and the sums go after them (decision 112).
#include <fmt/format.h>

#include "api/context_parallel/internal.hpp"
#include "api/context_parallel/partials.hpp"

namespace tilejit::cp::detail {

namespace {

// Device buffers of one ring call, carved from the runner's scratch.
struct KvSlots {
  Tensor k[2], v[2];  // [B, max_local, Hkv, D] each
};

KvSlots carve_kv(Scratch& s, const Dims& d, int device, ir::DType dtype, int64_t heads) {
  const int64_t n = d.layout.max_local_len();
  const size_t bytes = static_cast<size_t>(d.B * n * heads * d.D * ir::byte_size(dtype));
  KvSlots slots;
  for (int i = 0; i < 2; ++i) {
    slots.k[i] = bshd(s.take(bytes), dtype, d.B, n, heads, d.D, n, device);
    slots.v[i] = bshd(s.take(bytes), dtype, d.B, n, heads, d.D, n, device);
  }
  return slots;
}

// Rank r's shard at step s: its own at step 0, else a slot holding rank r - s's rows.
struct ShardAt {
  Tensor k, v;
};

class RingSteps {
 public:
  RingSteps(ContextParallel::State& st, const Dims& d, const Plan& plan, CUstream stream)
      : st_(st), d_(d), plan_(plan), stream_(stream), kv_arrived_(static_cast<size_t>(d.world) + 1), sums_arrived_(kv_arrived_) {}

  // Queues on the communication stream: send step s's shard on, receive step s + 1's into the other
  // slot (after the step that last read that slot).
  void prefetch(int s, const ShardAt& cur, const KvSlots& slots) {
    if (s + 1 >= d_.world) return;
    if (s >= 1) wait_compute(s - 1);
    const int64_t n = d_.layout.local_len(plan_.steps[static_cast<size_t>(s + 1)].kv_rank);
    const int i = (s + 1) % 2;
    st_.log("step {}: send K/V ({} rows) to {}, receive {} rows from {}", s, cur.k.size(1), plan_.send_to, n, plan_.recv_from);
    {
      runtime::nccl::Group group;
      st_.send_rows(cur.k, plan_.send_to);
      st_.send_rows(cur.v, plan_.send_to);
      st_.recv_rows(rows(slots.k[i], 0, n), plan_.recv_from);
      st_.recv_rows(rows(slots.v[i], 0, n), plan_.recv_from);
    }
    kv_arrived_[static_cast<size_t>(s + 1)] = mark_comm();
    st_.stamp(st_.comm_stream.handle(), "step {}: K/V for step {} received", s, s + 1);
  }
  // The caller's stream waits for step s's shard only (not for sums queued after its prefetch).
  void wait_kv(int s) {
    st_.log("step {}: compute waits for its K/V", s);
    st_.wait(stream_, kv_arrived_[static_cast<size_t>(s)]);
    st_.stamp(stream_, "step {}: K/V ready", s);
  }
  // Backward: the sums for step s's shard were queued (receive done at this mark); the caller's
  // stream waits for them only where it adds them, after step s's calls.
  void sums_queued(int s) { sums_arrived_[static_cast<size_t>(s)] = mark_comm(); }
  void wait_sums(int s) {
    st_.log("step {}: compute waits for the dK/dV sums", s);
    st_.wait(stream_, sums_arrived_[static_cast<size_t>(s)]);
    st_.stamp(stream_, "step {}: dK/dV sums ready", s);
  }
  ShardAt shard(int s, const Tensor& k, const Tensor& v, const KvSlots& slots) const {
    if (s == 0) return {k, v};
    const int64_t n = d_.layout.local_len(plan_.steps[static_cast<size_t>(s)].kv_rank);
    return {rows(slots.k[s % 2], 0, n), rows(slots.v[s % 2], 0, n)};
  }
  // The caller's stream waits for what the communication stream queued so far.
  void wait_comm() {
    st_.log("compute waits for communication");
    st_.join(stream_, st_.comm_stream.handle(), next_event());
  }
  // The communication stream waits for step s's compute (recorded by compute_done).
  void compute_done(int s) {
    const size_t e = next_event();
    compute_events_.resize(static_cast<size_t>(s + 1));
    compute_events_[static_cast<size_t>(s)] = e;
    runtime::check_cu(runtime::Driver::get().api().EventRecord(st_.event(e), stream_), "cuEventRecord");
  }
  void wait_compute(int s) {
    runtime::check_cu(runtime::Driver::get().api().StreamWaitEvent(st_.comm_stream.handle(),
                                                                   st_.event(compute_events_[static_cast<size_t>(s)]), 0),
                      "cuStreamWaitEvent");
  }
  // The communication stream starts after the caller's earlier work (the inputs).
  void start() { st_.join(st_.comm_stream.handle(), stream_, next_event()); }
  size_t next_event() { return event_++; }

 private:
  // An event marking what the communication stream queued so far; its index.
  size_t mark_comm() {
    const size_t e = next_event();
    st_.mark(e, st_.comm_stream.handle());
    return e;
  }

  ContextParallel::State& st_;
  const Dims& d_;
  const Plan& plan_;
  CUstream stream_;
  size_t event_ = 0;
  std::vector<size_t> compute_events_;
  std::vector<size_t> kv_arrived_, sums_arrived_;  // by step: the event after its K/V's, its sums' receive
};

}  // namespace

void ring_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& lse, const attention::Options& opts, CUstream stream) {
  const Plan plan = make_plan(Mode::ring, d.layout, opts.causal, d.rank, /*global_runs=*/opts.dropout_p > 0);
  if (!plan.unvisited_rows.empty()) throw std::logic_error("cp::forward: a row sees no key under a full or causal mask");
  const int64_t nmax = d.layout.max_local_len();
  // the buffer: two K/V slots, a partial O and LSE, the f32 O accumulator
  auto carve = [&](uint64_t base) {
    Scratch s(base);
    KvSlots slots = carve_kv(s, d, st.device, d.dtype, d.Hkv);
    Tensor o_part = bshd(s.take(static_cast<size_t>(d.B * nmax * d.Hq * d.D * d.es())), d.dtype, d.B, nmax, d.Hq, d.D, nmax, st.device);
    Tensor lse_part = bhs(s.take(static_cast<size_t>(d.B * d.Hq * nmax * 4)), d.B, d.Hq, nmax, nmax, st.device);
    Tensor o_acc = bshd(s.take(static_cast<size_t>(d.B * d.local * d.Hq * d.D * 4)), ir::DType::f32, d.B, d.local, d.Hq, d.D, d.local,
                        st.device);
    return std::tuple{slots, o_part, lse_part, o_acc, s.used()};
  };
  const size_t need = std::get<4>(carve(0));
  auto [slots, o_part, lse_part, o_acc, used] = carve(st.scratch_base(need, stream));
  RingSteps ring(st, d, plan, stream);
  ring.start();
  for (int s = 0; s < d.world; ++s) {
    const ShardAt cur = ring.shard(s, k, v, slots);
    if (s > 0) ring.wait_kv(s);  // this step's shard
    ring.prefetch(s, cur, slots);
    for (const AttentionCall& call : plan.steps[static_cast<size_t>(s)].calls) {
      st.log("step {}: forward q {}-{} k {}-{}{}", s, call.q_begin, call.q_end, call.k_begin, call.k_end, call.causal ? " causal" : "");
      const Tensor op = rows(o_part, 0, call.q_len()), lp = lse_rows(lse_part, 0, call.q_len());
      // one program per tile: the next shard's send / recv kernels on the comm stream get SMs at
      // tile boundaries (a persistent grid holds every SM until the call ends: 1.17 vs 1.04 ms
      // forward, 2 x H200, 8K a GPU, 16 heads causal; BENCHMARKS "Context parallelism")
      attention::Options fo = call_options(opts, call, d.Hq);
      if (!fo.persistent) fo.persistent = false;
      attention::forward(rows(q, call.q_begin, call.q_end), rows(cur.k, call.k_begin, call.k_end), rows(cur.v, call.k_begin, call.k_end),
                         op, lp, fo, stream);
      st.stamp(stream, "step {}: forward q {}-{} k {}-{}", s, call.q_begin, call.q_end, call.k_begin, call.k_end);
      merge_partial(rows(o_acc, call.q_begin, call.q_end), lse_rows(lse, call.q_begin, call.q_end), op, lp, call.first, stream);
      st.stamp(stream, "step {}: merge", s);
    }
    ring.compute_done(s);
  }
  convert(o_acc, o, stream);
  ring.wait_comm();  // the last sends read buffers the next call may reuse
}

void ring_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                   const attention::Options& opts, bool fused_sums, CUstream stream) {
  const Plan plan = make_plan(Mode::ring, d.layout, opts.causal, d.rank, /*global_runs=*/opts.dropout_p > 0);
  const bool whole = whole_calls(opts);
  const int64_t nmax = d.layout.max_local_len();
  const size_t ws_bytes = attention::backward_workspace_bytes(q, k, dense_options(opts));
  size_t max_calls = 0;
  for (const PlanStep& step : plan.steps) max_calls = std::max(max_calls, step.calls.size());
  auto carve = [&](uint64_t base) {
    Scratch s(base);
    KvSlots kv = carve_kv(s, d, st.device, d.dtype, d.Hkv);
    KvSlots dkv_local = carve_kv(s, d, st.device, ir::DType::f32, d.Hkv);  // this step's sums, sent on
    KvSlots dkv_in = carve_kv(s, d, st.device, ir::DType::f32, d.Hkv);     // the sums that arrive
    const size_t kv_bytes = static_cast<size_t>(d.B * nmax * d.Hkv * d.D * d.es());
    Tensor dk_part = bshd(s.take(kv_bytes), d.dtype, d.B, nmax, d.Hkv, d.D, nmax, st.device);
    Tensor dv_part = bshd(s.take(kv_bytes), d.dtype, d.B, nmax, d.Hkv, d.D, nmax, st.device);
    Tensor dq_part = bshd(s.take(static_cast<size_t>(d.B * nmax * d.Hq * d.D * d.es())), d.dtype, d.B, nmax, d.Hq, d.D, nmax, st.device);
    Tensor dq_acc = bshd(s.take(static_cast<size_t>(d.B * d.local * d.Hq * d.D * 4)), ir::DType::f32, d.B, d.local, d.Hq, d.D, d.local,
                         st.device);
    // one workspace a call of a step: its dQ phase reads the Delta its dK/dV phase left there
    std::vector<attention::Workspace> ws;
    for (size_t c = 0; c < max_calls; ++c) ws.push_back({s.take(ws_bytes), ws_bytes});
    return std::tuple{kv, dkv_local, dkv_in, dk_part, dv_part, dq_part, dq_acc, ws, s.used()};
  };
  const size_t need = std::get<8>(carve(0));
  auto [kv, dkv_local, dkv_in, dk_part, dv_part, dq_part, dq_acc, ws, used] = carve(st.scratch_base(need, stream));
  const runtime::DriverApi& api = runtime::Driver::get().api();
  auto zero = [&](const Tensor& t) {
    runtime::check_cu(api.MemsetD8Async(t.data, 0, static_cast<size_t>(t.size(0) * t.stride(0) * 4), stream), "cuMemsetD8Async");
  };
  RingSteps ring(st, d, plan, stream);
  // the sums for step s's shard go on to the next rank once ready (after step W - 1: back to their
  // owner); the next step's arrive in the other slot of dkv_in
  auto send_sums = [&](int s, const Tensor& dk_sum, const Tensor& dv_sum, size_t ready) {
    const int64_t n_next = d.layout.local_len(s + 1 < d.world ? plan.steps[static_cast<size_t>(s + 1)].kv_rank : d.rank);
    st.wait(st.comm_stream.handle(), ready);
    st.log("step {}: send dK/dV sums ({} rows) to {}, receive {} rows from {}", s, dk_sum.size(1), plan.send_to, n_next, plan.recv_from);
    runtime::nccl::Group group;
    st.send_rows(dk_sum, plan.send_to);
    st.send_rows(dv_sum, plan.send_to);
    st.recv_rows(rows(dkv_in.k[(s + 1) % 2], 0, n_next), plan.recv_from);
    st.recv_rows(rows(dkv_in.v[(s + 1) % 2], 0, n_next), plan.recv_from);
    group.end();
    st.stamp(st.comm_stream.handle(), "step {}: dK/dV sums sent on", s);
    if (s + 1 < d.world) ring.sums_queued(s + 1);
  };
  ring.start();
  zero(dq_acc);
  for (int s = 0; s < d.world; ++s) {
    const ShardAt cur = ring.shard(s, k, v, kv);
    // this step's K and V (the sums from the rank before are waited for where they are added: their
    // transfer overlaps this step's calls). Waiting for them implies the sums sent from this step's
    // slot two steps ago have left (queued before on the communication stream): it can be zeroed.
    if (s > 0) ring.wait_kv(s);
    ring.prefetch(s, cur, kv);
    const int i = s % 2;
    const int64_t n = cur.k.size(1);
    const Tensor dk_sum = rows(dkv_local.k[i], 0, n), dv_sum = rows(dkv_local.v[i], 0, n);
    zero(dkv_local.k[i]);
    zero(dkv_local.v[i]);
    // every call's dK/dV phase, then this shard's sums go on (below) while the dQ phases run: the
    // last hop (the sums back to their owner) hides behind the last step's dQ kernels
    const std::vector<AttentionCall>& calls = plan.steps[static_cast<size_t>(s)].calls;
    auto call_backward = [&](size_t c, attention::BackwardPhase phase) {
      const AttentionCall& call = calls[c];
      const Tensor qc = rows(q, call.q_begin, call.q_end), kc = rows(cur.k, call.k_begin, call.k_end),
                   vc = rows(cur.v, call.k_begin, call.k_end), oc = rows(o, call.q_begin, call.q_end),
                   doc = rows(do_, call.q_begin, call.q_end), lc = lse_rows(lse, call.q_begin, call.q_end);
      const Tensor dq_into = rows(dq_acc, call.q_begin, call.q_end), dk_into = rows(dk_sum, call.k_begin, call.k_end),
                   dv_into = rows(dv_sum, call.k_begin, call.k_end);
      attention::Options a = call_options(opts, call, d.Hq);
      a.backward_phase = phase;
      a.accumulate_gradients = fused_sums;  // the kernels add into the f32 sums
      st.log("step {}: {} phase q {}-{} k {}-{}{}", s, attention::name(phase), call.q_begin, call.q_end, call.k_begin, call.k_end,
             call.causal ? " causal" : "");
      if (fused_sums) {
        attention::backward(qc, kc, vc, oc, doc, lc, dq_into, dk_into, dv_into, a, stream, ws[c]);
      } else {
        const Tensor dqp = rows(dq_part, 0, call.q_len()), dkp = rows(dk_part, 0, call.k_len()), dvp = rows(dv_part, 0, call.k_len());
        attention::backward(qc, kc, vc, oc, doc, lc, dqp, dkp, dvp, a, stream, ws[c]);
        if (phase != attention::BackwardPhase::dq) {
          accumulate(dk_into, dkp, false, stream);
          accumulate(dv_into, dvp, false, stream);
        }
        if (phase != attention::BackwardPhase::dkdv) accumulate(dq_into, dqp, false, stream);
      }
      st.stamp(stream, "step {}: {} phase q {}-{} k {}-{}{}", s, attention::name(phase), call.q_begin, call.q_end, call.k_begin,
               call.k_end, fused_sums ? " (into the sums)" : ", part added");
    };
    // (atomic: each call's whole backward here -- dQ's parts are added inside dK/dV -- and no dQ
    // phases below: the sums leave after the calls, the last hop exposed; decision 112)
    for (size_t c = 0; c < calls.size(); ++c) call_backward(c, whole ? attention::BackwardPhase::all : attention::BackwardPhase::dkdv);
    if (s > 0) {  // what the ranks before added to this shard, in ring order
      ring.wait_sums(s);
      accumulate(dk_sum, rows(dkv_in.k[i], 0, n), false, stream);
      accumulate(dv_sum, rows(dkv_in.v[i], 0, n), false, stream);
      st.stamp(stream, "step {}: arrived sums added", s);
    }
    const size_t sums_ready = ring.next_event();
    st.mark(sums_ready, stream);
    if (d.world > 1) send_sums(s, dk_sum, dv_sum, sums_ready);
    if (!whole)
      for (size_t c = 0; c < calls.size(); ++c) call_backward(c, attention::BackwardPhase::dq);
    ring.compute_done(s);  // releases this step's K/V slot (the dQ phases read it)
  }
  convert(dq_acc, dq, stream);
  if (d.world == 1) {
    convert(rows(dkv_local.k[0], 0, d.local), dk, stream);
    convert(rows(dkv_local.v[0], 0, d.local), dv, stream);
  } else {
    ring.wait_comm();
    convert(rows(dkv_in.k[d.world % 2], 0, d.local), dk, stream);
    convert(rows(dkv_in.v[d.world % 2], 0, d.local), dv, stream);
  }
  ring.wait_comm();
}

}  // namespace tilejit::cp::detail
