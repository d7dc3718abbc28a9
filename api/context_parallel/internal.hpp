// What the context-parallel runner's files share (api/context_parallel/*.cpp): the call's
// dimensions, views of rows, the runner's state (communication stream, events, scratch) and the
// NCCL transfers of row blocks.
#pragma once
#include <cuda.h>

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/attention.hpp"
#include "api/context_parallel.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/nccl.hpp"

namespace tilejit::cp::detail {

using attention::Tensor;

// The call's shape: local shard of `rank`, the layout over the group.
struct Dims {
  int64_t B = 0, Hq = 0, Hkv = 0, D = 0;
  ir::DType dtype = ir::DType::bf16;
  int64_t local = 0;  // this rank's rows
  int rank = 0, world = 1;
  ShardLayout layout{Layout::contiguous, 1, 1};
  int64_t es() const { return ir::byte_size(dtype); }
};

// Whether the rows of a [B, n, H, D] view are contiguous (strides [any, H*D, D, 1]): runs of rows
// travel as one message.
inline bool contiguous_rows(const Tensor& t) { return t.stride(3) == 1 && t.stride(2) == t.size(3) && t.stride(1) == t.size(2) * t.size(3); }
// Rows [begin, end) of a [B, S, H, D] tensor; of an LSE [B, H, S].
Tensor rows(const Tensor& t, int64_t begin, int64_t end);
Tensor lse_rows(const Tensor& lse, int64_t begin, int64_t end);
// A [B, rows, H, D] tensor of `dtype` at `data` whose batches are `batch_rows` rows apart.
Tensor bshd(uint64_t data, ir::DType dtype, int64_t B, int64_t rows, int64_t H, int64_t D, int64_t batch_rows, int device);
// An f32 LSE [B, H, rows] whose heads are `head_rows` apart.
Tensor bhs(uint64_t data, int64_t B, int64_t H, int64_t rows, int64_t head_rows, int device);

runtime::nccl::DataType nccl_type(ir::DType t);
// The single-GPU options of one planned call (rows of one run, keys of one run): its causality,
// a prefix mask's document ids cut to its keys, dropout placed at its rows, keys and (packed
// documents) its document's heads among `heads_q` query heads.
attention::Options call_options(const attention::Options& opts, const AttentionCall& call, int64_t heads_q);
// opts without cu_seqlens: the chunk modes' calls are dense (each inside one document), and so is
// the workspace sized for them
attention::Options dense_options(const attention::Options& opts);
// The chunk modes' backward runs each call whole (dQ summed inside dK/dV: the atomic reduction), not
// in the dkdv and dq phases of recompute (the runner admits those two; decision 112).
inline bool whole_calls(const attention::Options& opts) {
  return opts.dq_reduction && *opts.dq_reduction != attention::DqReduction::recompute;
}

// Scratch carved from the runner's buffer: take() hands out 256-byte aligned pieces.
class Scratch {
 public:
  explicit Scratch(uint64_t base) : base_(base) {}
  uint64_t take(size_t bytes) {
    const uint64_t at = base_ + used_;
    used_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t used() const { return used_; }

 private:
  uint64_t base_;
  size_t used_ = 0;
};

}  // namespace tilejit::cp::detail

namespace tilejit::cp {

// The communication stream: high priority (NCCL's kernels start before queued attention kernels
// take every SM), created on first use so that a call's argument checks need no GPU.
class CommStream {
 public:
  explicit CommStream(int device) : device_(device) {}
  CUstream handle() {
    if (!stream_) stream_.emplace(device_, runtime::Stream::Priority::high);
    return stream_->handle();
  }
  void synchronize() const {
    if (stream_) stream_->synchronize();
  }

 private:
  int device_;
  std::optional<runtime::Stream> stream_;
};

struct ContextParallel::State {
  runtime::nccl::Communicator* comm = nullptr;
  int device = 0;
  CommStream comm_stream;
  std::vector<CUevent> events;  // a pool, reused call after call (timing off)
  runtime::DeviceBuffer scratch;
  runtime::DeviceBuffer usp_scratch;  // usp's head shards and all-to-all stages, beside the ring's scratch
  // The communicator ranks of the group a mode runs in (usp: a Ulysses group, then a ring), by
  // index in the group; empty: the whole communicator. send_rows / recv_rows and the all-to-all
  // address peers by that index.
  std::vector<int> peers;
  int peer(int j) const { return peers.empty() ? j : peers[static_cast<size_t>(j)]; }
  // TILEJIT_CP_TRACE=1: one stderr line per communication group, wait and attention call (host
  // side, in queueing order), to find where a hung rank stopped.
  bool trace = false;
  // TILEJIT_CP_PROFILE=1: timing events at the steps of a call on both streams (stamp), printed
  // with their times at the end of the call (report; which synchronises the host): where a call's
  // time goes without a profiler.
  bool profile = false;
  struct Stamp {
    std::string label;
    bool comm = false;
    CUevent event = nullptr;
  };
  std::vector<Stamp> stamps;

  State(runtime::nccl::Communicator& c);
  template <class... A>
  void log(fmt::format_string<A...> f, A&&... args) const {
    if (trace) log_line(fmt::format(f, std::forward<A>(args)...));
  }
  void log_line(const std::string& line) const;
  template <class... A>
  void stamp(CUstream s, fmt::format_string<A...> f, A&&... args) {
    if (profile) stamp_line(s, fmt::format(f, std::forward<A>(args)...));
  }
  void stamp_line(CUstream s, std::string label);
  // Prints the call's stamps (time since its first, since the one before on the same stream) and
  // drops them; nothing without TILEJIT_CP_PROFILE.
  void report(const char* call);
  ~State();
  // Event i of the pool (created on first use).
  CUevent event(size_t i);
  // `waiter` waits for the work queued so far on `stream` (through event i).
  void join(CUstream waiter, CUstream stream, size_t i);
  // The same in two steps: event i marks the work queued so far on `stream`; later, `waiter` waits
  // for that mark (not for what was queued on `stream` since).
  void mark(size_t i, CUstream stream);
  void wait(CUstream waiter, size_t i);
  // At least `bytes` of scratch; growing it first waits for the work queued on `stream` and on
  // the communication stream (the old buffer may still be in use).
  uint64_t scratch_base(size_t bytes, CUstream stream) { return grow(scratch, bytes, stream); }
  uint64_t usp_scratch_base(size_t bytes, CUstream stream) { return grow(usp_scratch, bytes, stream); }
  uint64_t grow(runtime::DeviceBuffer& buffer, size_t bytes, CUstream stream);
  // Sends / receives the rows of a [B, n, H, D] tensor whose rows are contiguous (one message per
  // batch) on the communication stream.
  void send_rows(const attention::Tensor& t, int peer);
  void recv_rows(const attention::Tensor& t, int peer);
};

namespace detail {
void ring_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& lse, const attention::Options& opts, CUstream stream);
// fused_sums: Options::fused_sums (the kernels add into the f32 sums).
void ring_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                   const attention::Options& opts, bool fused_sums, CUstream stream);
void allgather_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& o, const Tensor& lse, const attention::Options& opts, int head_groups, CUstream stream);
void allgather_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const attention::Options& opts, int head_groups, CUstream stream);
void usp_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                 const Tensor& lse, const attention::Options& opts, int ulysses_degree, CUstream stream);
void usp_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                  const attention::Options& opts, int ulysses_degree, bool fused_sums, CUstream stream);
void ulysses_forward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, const attention::Options& opts, int head_groups, CUstream stream);
void ulysses_backward(ContextParallel::State& st, const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const Tensor& do_, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                      const attention::Options& opts, int head_groups, CUstream stream);
}  // namespace detail

}  // namespace tilejit::cp
