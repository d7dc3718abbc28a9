// ContextParallel: the checks every call makes first, the runner's state, and the dispatch to the
// modes (ring.cpp, allgather.cpp, ulysses.cpp, usp.cpp).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "api/context_parallel/internal.hpp"

namespace tilejit::cp {

using detail::Dims;
using detail::Tensor;

namespace detail {

Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  Tensor r = t;
  r.data += static_cast<uint64_t>(begin * t.stride(1) * ir::byte_size(t.dtype));
  r.sizes[1] = end - begin;
  return r;
}

Tensor lse_rows(const Tensor& lse, int64_t begin, int64_t end) {
  Tensor r = lse;
  r.data += static_cast<uint64_t>(begin * 4);
  r.sizes[2] = end - begin;
  return r;
}

Tensor bshd(uint64_t data, ir::DType dtype, int64_t B, int64_t n, int64_t H, int64_t D, int64_t batch_rows, int device) {
  return attention::strided(data, dtype, {B, n, H, D}, {batch_rows * H * D, H * D, D, 1}, device);
}

Tensor bhs(uint64_t data, int64_t B, int64_t H, int64_t n, int64_t head_rows, int device) {
  return attention::strided(data, ir::DType::f32, {B, H, n}, {H * head_rows, head_rows, 1}, device);
}

runtime::nccl::DataType nccl_type(ir::DType t) {
  switch (t) {
    case ir::DType::bf16: return runtime::nccl::DataType::bf16;
    case ir::DType::f16: return runtime::nccl::DataType::f16;
    case ir::DType::f32: return runtime::nccl::DataType::f32;
    default: throw std::logic_error("cp: no NCCL type for " + std::string(ir::name(t)));
  }
}

attention::Options dense_options(const attention::Options& opts) {
  attention::Options a = opts;
  a.cu_seqlens_q.reset(), a.cu_seqlens_k.reset();
  a.max_seqlen_q = a.max_seqlen_k = 0;
  return a;
}

attention::Options call_options(const attention::Options& opts, const AttentionCall& call, int64_t heads_q) {
  // packed documents: every call lies inside one document, a dense call on its rows
  attention::Options a = dense_options(opts);
  if (a.dropout_p > 0) {  // (the plan has global runs: the call's rows and keys each one stretch)
    // packed documents: the single-GPU varlen mask's coordinates, rows and keys inside the
    // document and b = the document: this call's batch of one at head offset document x (the
    // heads a batch row spans), whose b = 0 reads no head count
    auto& c = a.dropout_coordinates;
    c.row_offset += call.q_global - call.document_begin;
    c.col_offset += call.k_global - call.document_begin;
    if (opts.cu_seqlens_q) {
      c.head_offset += call.document * (c.heads > 0 ? c.heads : heads_q);
      c.heads = 0;
    }
  }
  if (!a.mask) {
    a.causal = call.causal;
    return a;
  }
  // a prefix mask (allgather): causal itself, applied bottom-right aligned on the call's key
  // prefix, whose document ids are the prefix of the sequence's
  if (call.k_begin != 0) throw std::logic_error("cp: a masked call's keys do not start at the sequence's first token");
  if (a.mask->doc_ids) a.mask->doc_ids->sizes[static_cast<size_t>(a.mask->doc_ids->rank - 1)] = call.k_end;
  return a;
}

}  // namespace detail

ContextParallel::State::State(runtime::nccl::Communicator& c)
    : comm(&c), device(c.device()), comm_stream(c.device()) {
  const char* t = std::getenv("TILEJIT_CP_TRACE");
  trace = t && *t && std::string(t) != "0";
  const char* p = std::getenv("TILEJIT_CP_PROFILE");
  profile = p && *p && std::string(p) != "0";
}

void ContextParallel::State::stamp_line(CUstream s, std::string label) {
  const runtime::DriverApi& api = runtime::Driver::get().api();
  Stamp x{std::move(label), s == comm_stream.handle(), nullptr};
  runtime::check_cu(api.EventCreate(&x.event, CU_EVENT_DEFAULT), "cuEventCreate");
  runtime::check_cu(api.EventRecord(x.event, s), "cuEventRecord");
  stamps.push_back(std::move(x));
}

void ContextParallel::State::report(const char* call) {
  if (stamps.empty()) return;
  const runtime::DriverApi& api = runtime::Driver::get().api();
  for (const Stamp& x : stamps) runtime::check_cu(api.EventSynchronize(x.event), "cuEventSynchronize");
  std::string out;
  CUevent last[2] = {stamps.front().event, stamps.front().event};
  for (const Stamp& x : stamps) {
    float since_start = 0, since_last = 0;
    runtime::check_cu(api.EventElapsedTime(&since_start, stamps.front().event, x.event), "cuEventElapsedTime");
    runtime::check_cu(api.EventElapsedTime(&since_last, last[x.comm], x.event), "cuEventElapsedTime");
    last[x.comm] = x.event;
    out += fmt::format("[cp profile rank {} {}] {:8.3f} ms  +{:7.3f}  {:7}  {}\n", comm->rank(), call, since_start, since_last,
                       x.comm ? "comm" : "compute", x.label);
  }
  fmt::print(stderr, "{}", out);
  for (const Stamp& x : stamps) api.EventDestroy(x.event);
  stamps.clear();
}

void ContextParallel::State::log_line(const std::string& line) const {
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  fmt::print(stderr, "[cp rank {} {:.3f} ms] {}\n", comm->rank(), std::fmod(ms, 1e6), line);
}

ContextParallel::State::~State() {
  if (events.empty()) return;
  const runtime::DriverApi& api = runtime::Driver::get().api();
  for (CUevent e : events)
    if (e) api.EventDestroy(e);
}

CUevent ContextParallel::State::event(size_t i) {
  if (i >= events.size()) events.resize(i + 1, nullptr);
  if (!events[i]) {
    runtime::Driver::get().context(device).make_current();
    runtime::check_cu(runtime::Driver::get().api().EventCreate(&events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  return events[i];
}

void ContextParallel::State::join(CUstream waiter, CUstream stream, size_t i) {
  mark(i, stream);
  wait(waiter, i);
}

void ContextParallel::State::mark(size_t i, CUstream stream) {
  runtime::check_cu(runtime::Driver::get().api().EventRecord(event(i), stream), "cuEventRecord");
}

void ContextParallel::State::wait(CUstream waiter, size_t i) {
  runtime::check_cu(runtime::Driver::get().api().StreamWaitEvent(waiter, event(i), 0), "cuStreamWaitEvent");
}

uint64_t ContextParallel::State::grow(runtime::DeviceBuffer& buffer, size_t bytes, CUstream stream) {
  if (buffer.bytes() < bytes) {
    const runtime::DriverApi& api = runtime::Driver::get().api();
    runtime::check_cu(api.StreamSynchronize(stream), "cuStreamSynchronize");
    comm_stream.synchronize();
    log("scratch grows to {} bytes", bytes);
    buffer = runtime::DeviceBuffer(bytes, device);
  }
  return buffer.ptr();
}

void ContextParallel::State::send_rows(const Tensor& t, int peer) {
  const int64_t n = t.size(1) * t.size(2) * t.size(3);
  for (int64_t b = 0; b < t.size(0); ++b)
    comm->send(t.data + static_cast<uint64_t>(b * t.stride(0) * ir::byte_size(t.dtype)), static_cast<size_t>(n),
               detail::nccl_type(t.dtype), this->peer(peer), comm_stream.handle());
}

void ContextParallel::State::recv_rows(const Tensor& t, int peer) {
  const int64_t n = t.size(1) * t.size(2) * t.size(3);
  for (int64_t b = 0; b < t.size(0); ++b)
    comm->recv(t.data + static_cast<uint64_t>(b * t.stride(0) * ir::byte_size(t.dtype)), static_cast<size_t>(n),
               detail::nccl_type(t.dtype), this->peer(peer), comm_stream.handle());
}

namespace {

template <class... A>
[[noreturn]] void fail(const char* fn, fmt::format_string<A...> f, A&&... args) {
  throw std::invalid_argument(fmt::format("tilejit::cp::{}: {}", fn, fmt::format(f, std::forward<A>(args)...)));
}

// Rows contiguous ([any, H*D, D, 1]): one NCCL message per batch carries a run of rows.
void check_rows(const char* fn, const char* name, const Tensor& t, const Tensor& q) {
  if (t.rank != 4) fail(fn, "{} must be rank 4 [B, S_local, H, D], got {}", name, t.describe());
  if (!detail::contiguous_rows(t))
    fail(fn, "{} must have contiguous rows (strides [any, H*D, D, 1]) so that runs of rows travel as one message: {}", name,
         t.describe());
  if (t.dtype != q.dtype) fail(fn, "{} has dtype {} but q has {}", name, ir::name(t.dtype), ir::name(q.dtype));
  if (t.device != q.device) fail(fn, "{} is on device {} but q is on device {}", name, t.device, q.device);
  if (t.size(0) != q.size(0) || t.size(1) != q.size(1) || t.size(3) != q.size(3))
    fail(fn, "{} has sizes [{}, {}, {}, {}] but q has [{}, {}, {}, {}] (B, S_local and D must match)", name, t.size(0), t.size(1),
         t.size(2), t.size(3), q.size(0), q.size(1), q.size(2), q.size(3));
}

Dims check_call(const char* fn, ContextParallel::State& st, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                const Tensor& lse, int64_t seq_len, const Options& opts) {
  const attention::Options& a = opts.attention;
  const kernels::MaskKind kind = a.mask ? a.mask->spec.kind : kernels::MaskKind::full;
  if ((opts.mode == Mode::ring || opts.mode == Mode::usp) && kind != kernels::MaskKind::full && kind != kernels::MaskKind::causal)
    fail(fn, "options.attention.mask of kind {}: mode {} takes the full and causal masks only (allgather also causal "
         "windows and causal documents; ulysses every mask)", kernels::mask_kind_name(kind), name(opts.mode));
  if (opts.mode == Mode::allgather && kind != kernels::MaskKind::full && !prefix_mask(kind))
    fail(fn, "options.attention.mask of kind {}: mode allgather takes masks that never look past the query (full, causal, "
         "causal_sliding_window, causal_document; ulysses every mask)", kernels::mask_kind_name(kind));
  if (opts.mode != Mode::ulysses && a.mask && a.mask->doc_ids && a.mask->doc_ids->size(a.mask->doc_ids->rank - 1) != seq_len)
    fail(fn, "options.attention.mask.doc_ids has {} keys; give the whole sequence's ({}, seq_len): {}",
         a.mask->doc_ids->size(a.mask->doc_ids->rank - 1), seq_len, a.mask->doc_ids->describe());
  if (opts.mode != Mode::ulysses) {
    if (a.score_mod.kind != kernels::ScoreModKind::none)
      fail(fn, "options.attention.score_mod: mode {} takes none (ulysses takes every score mod)", name(opts.mode));
  }
  if (a.dropout_mask || a.dropout_bits)
    fail(fn, "options.attention.dropout_mask / dropout_bits: a per-call mask tensor; not with context parallelism (the fused mask "
         "is the single-GPU one)");
  const bool documents = !opts.document_lengths.empty();
  if (documents && opts.mode != Mode::ulysses && a.mask)
    fail(fn, "options.document_lengths with options.attention.mask: mode {} takes full or causal packed documents (each document "
         "its own attention); ulysses takes every mask", name(opts.mode));
  if (documents && (!a.cu_seqlens_q || !a.cu_seqlens_k))
    fail(fn, "options.document_lengths is set but options.attention.cu_seqlens_q / _k are not (give the whole batch's offsets)");
  if (!documents && (a.cu_seqlens_q || a.cu_seqlens_k))
    fail(fn, "options.attention.cu_seqlens_q / _k are set but options.document_lengths is not (the host needs the documents' "
         "lengths to know which tokens each rank holds)");
  if (documents && q.size(0) != 1)
    fail(fn, "q has batch size {} with options.document_lengths; packed documents take B = 1 ([1, S_local, Hq, D])", q.size(0));
  if (a.block_mask) fail(fn, "options.attention.block_mask: a block mask is built for one GPU's call; not with context parallelism");
  // (refused here, before any rank queues communication: a call's own check failing midway on one
  // rank would leave the others waiting)
  if (a.dq_reduction) {
    const attention::DqReduction r = *a.dq_reduction;
    if (opts.mode != Mode::ulysses && r != attention::DqReduction::recompute && r != attention::DqReduction::atomic)
      fail(fn, "options.attention.dq_reduction {}: mode {} runs recompute (unset) or atomic; ulysses passes any reduction to its "
           "single-GPU call", attention::name(r), name(opts.mode));
    if (r != attention::DqReduction::recompute && !opts.document_lengths.empty())
      fail(fn, "options.attention.dq_reduction {} with options.document_lengths: packed documents run varlen calls, which take "
           "recompute only", attention::name(r));
    if (r != attention::DqReduction::recompute && !attention::dq_reduction_supported(r))
      fail(fn, "options.attention.dq_reduction {}: this build's attention kernels do not take it", attention::name(r));
  }
  check_rows(fn, "q", q, q);
  check_rows(fn, "k", k, q);
  check_rows(fn, "v", v, q);
  check_rows(fn, "o", o, q);
  if (k.size(2) != v.size(2)) fail(fn, "k has {} heads but v has {}", k.size(2), v.size(2));
  if (o.size(2) != q.size(2)) fail(fn, "o has {} heads but q has {}", o.size(2), q.size(2));
  Dims d;
  d.B = q.size(0);
  d.Hq = q.size(2);
  d.Hkv = k.size(2);
  d.D = q.size(3);
  d.dtype = q.dtype;
  d.rank = st.comm->rank();
  d.world = st.comm->world();
  if (q.device != st.device) fail(fn, "q is on device {} but the communicator's device is {}", q.device, st.device);
  try {
    d.layout = documents ? ShardLayout(opts.layout, d.world, opts.document_lengths) : ShardLayout(opts.layout, d.world, seq_len);
  } catch (const std::invalid_argument& e) {
    fail(fn, "seq_len {}: {}", seq_len, e.what());
  }
  if (documents && d.layout.seq_len() != seq_len)
    fail(fn, "options.document_lengths sum to {} tokens but seq_len is {}", d.layout.seq_len(), seq_len);
  d.local = d.layout.local_len(d.rank);
  // Dropout draws the single-GPU keep-mask: Ulysses places each rank's heads (head_options), the
  // chunk modes each call's rows and keys (call_options), whose keys must start on whole Philox
  // groups of 64.
  if (a.dropout_p > 0 && opts.mode != Mode::ulysses)
    for (int c = 0; c < d.layout.chunk_count(); ++c) {
      const int64_t in_document = d.layout.chunk(c).begin - d.layout.document_begin(d.layout.document_of(c));
      if (in_document % 64 != 0)
        fail(fn, "options.attention.dropout_p {} in mode {}: the {} layout of seq_len {} over {} ranks has a chunk at token {}{}; with "
             "dropout every chunk must start at a multiple of 64 (seq_len, or each document's length, a multiple of {})",
             a.dropout_p, name(opts.mode), name(opts.layout), seq_len, d.layout.world(), in_document,
             documents ? fmt::format(" of document {}", d.layout.document_of(c)) : "", 64 * d.layout.chunks_per_document());
    }
  if (opts.mode == Mode::usp) {
    if (opts.layout != Layout::zigzag)
      fail(fn, "options.layout is {}; mode usp runs on the zigzag layout only", name(opts.layout));
    if (!documents && seq_len % (2 * d.world) != 0)
      fail(fn, "seq_len {}: mode usp needs a multiple of 2 x world = {} (equal zigzag chunks; ring and allgather take any)", seq_len,
           2 * d.world);
    if (opts.head_groups > 1)
      fail(fn, "options.head_groups is {}; mode usp exchanges all heads at once (0 or 1; ulysses pipelines over groups)",
           opts.head_groups);
    try {
      const UspGroups g = usp_groups(d.world, opts.ulysses_degree);
      ulysses_heads(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), g.ulysses, g.member(d.rank));
    } catch (const std::invalid_argument& e) {
      fail(fn, "options.ulysses_degree {}: {}", opts.ulysses_degree, e.what());
    }
    if (documents) try {
        usp_layouts(usp_groups(d.world, opts.ulysses_degree), d.layout);
      } catch (const std::invalid_argument& e) {
        fail(fn, "options.document_lengths: {}", e.what());
      }
  }
  if (opts.mode == Mode::allgather) {
    try {
      allgather_head_groups(static_cast<int>(d.Hkv), opts.head_groups);
    } catch (const std::invalid_argument& e) {
      fail(fn, "{}", e.what());
    }
  }
  if (opts.mode == Mode::ring && opts.head_groups > 1)
    fail(fn, "options.head_groups is {}; mode ring sends all heads each step (0 or 1; ulysses and allgather pipeline over groups)",
         opts.head_groups);
  if (opts.mode == Mode::ulysses) {
    try {
      ulysses_heads(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), d.world, d.rank);
      ulysses_head_groups(static_cast<int>(d.Hq), static_cast<int>(d.Hkv), d.world, opts.head_groups);
    } catch (const std::invalid_argument& e) {
      fail(fn, "{}", e.what());
    }
  }
  if (q.size(1) != d.local)
    fail(fn, "q has {} rows but rank {} of a {} layout holds {} tokens of seq_len {}", q.size(1), d.rank, name(opts.layout), d.local,
         seq_len);
  if (lse.rank != 3 || lse.dtype != ir::DType::f32 || lse.size(0) != d.B || lse.size(1) != d.Hq || lse.size(2) != d.local ||
      lse.stride(2) != 1)
    fail(fn, "lse must be f32 [B, Hq, S_local] = [{}, {}, {}] with unit stride on S_local, got {}", d.B, d.Hq, d.local,
         lse.describe());
  return d;
}

// The options ring and allgather plan with: a causal mask as options.causal (the plan's calls set
// it per call); any other library mask kept (allgather's prefix masks, applied inside each call).
attention::Options chunk_options(attention::Options a) {
  if (a.mask && (a.mask->spec.kind == kernels::MaskKind::causal || a.mask->spec.kind == kernels::MaskKind::full)) {
    a.causal = a.causal || a.mask->spec.kind == kernels::MaskKind::causal;
    a.mask.reset();
  }
  return a;
}

}  // namespace

ContextParallel::ContextParallel(runtime::nccl::Communicator& comm) : state_(std::make_unique<State>(comm)) {}
ContextParallel::~ContextParallel() = default;
int ContextParallel::rank() const { return state_->comm->rank(); }
int ContextParallel::world() const { return state_->comm->world(); }

void ContextParallel::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, int64_t seq_len,
                              const Options& opts, CUstream stream) {
  const Dims d = check_call("forward", *state_, q, k, v, o, lse, seq_len, opts);
  runtime::Driver::get().context(state_->device).make_current();
  State& st = *state_;
  st.stamp(stream, "{} forward starts", name(opts.mode));
  const attention::Options a = chunk_options(opts.attention);
  if (opts.mode == Mode::ulysses)
    detail::ulysses_forward(st, d, q, k, v, o, lse, opts.attention, opts.head_groups, stream);
  else if (opts.mode == Mode::usp)
    detail::usp_forward(st, d, q, k, v, o, lse, a, opts.ulysses_degree, stream);
  else if (opts.mode == Mode::ring)
    detail::ring_forward(st, d, q, k, v, o, lse, a, stream);
  else
    detail::allgather_forward(st, d, q, k, v, o, lse, a, opts.head_groups, stream);
  st.stamp(stream, "forward done");
  st.report("fwd");
}

void ContextParallel::backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t seq_len, const Options& opts,
                               CUstream stream) {
  const Dims d = check_call("backward", *state_, q, k, v, o, lse, seq_len, opts);
  check_rows("backward", "do", do_, q);
  check_rows("backward", "dq", dq, q);
  check_rows("backward", "dk", dk, q);
  check_rows("backward", "dv", dv, q);
  if (dq.size(2) != d.Hq || do_.size(2) != d.Hq || dk.size(2) != d.Hkv || dv.size(2) != d.Hkv)
    fail("backward", "heads: do and dq need {} (q's), dk and dv {} (k's); got {}, {}, {}, {}", d.Hq, d.Hkv, do_.size(2), dq.size(2),
         dk.size(2), dv.size(2));
  runtime::Driver::get().context(state_->device).make_current();
  State& st = *state_;
  st.stamp(stream, "{} backward starts", name(opts.mode));
  // ulysses: its single-GPU call on the whole sequence takes dq_reduction and deterministic as they
  // are (unset: the single-GPU default). The chunk modes: recompute unless atomic is asked for (its
  // phases put the dK/dV sums' transfer behind the dQ kernels, decision 068; atomic: 112)
  attention::Options pinned = opts.attention;
  if (!pinned.dq_reduction) pinned.dq_reduction = attention::DqReduction::recompute;
  const attention::Options a = chunk_options(pinned);
  if (opts.mode == Mode::ulysses)
    detail::ulysses_backward(st, d, q, k, v, o, do_, lse, dq, dk, dv, opts.attention, opts.head_groups, stream);
  else if (opts.mode == Mode::usp)
    detail::usp_backward(st, d, q, k, v, o, do_, lse, dq, dk, dv, a, opts.ulysses_degree, opts.fused_sums, stream);
  else if (opts.mode == Mode::ring)
    detail::ring_backward(st, d, q, k, v, o, do_, lse, dq, dk, dv, a, opts.fused_sums, stream);
  else
    detail::allgather_backward(st, d, q, k, v, o, do_, lse, dq, dk, dv, a, opts.head_groups, stream);
  st.stamp(stream, "backward done");
  st.report("bwd");
}

}  // namespace tilejit::cp
