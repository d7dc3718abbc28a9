// Context parallelism: one attention over a sequence sharded across the GPUs of an NCCL
// communicator. Each rank passes its local shard (the tokens cp::ShardLayout gives it, back to back)
// and gets its shard of O, LSE (forward) and dQ, dK, dV (backward); the result equals the
// single-GPU call on the gathered sequence (ulysses: bit for bit; ring, allgather: partial results
// merged in f32). Asynchronous on the caller's stream: communication runs on a stream of the
// runner's own, joined to the caller's with events; nothing synchronises the host inside a call.
//
//   auto comm = runtime::nccl::Communicator::create(id, rank, world, device);
//   cp::ContextParallel cp(comm);
//   cp::Options opts;  opts.mode = cp::Mode::ring;  opts.attention.causal = true;
//   cp.forward(q, k, v, o, lse, seq_len, opts, stream);        // q: [B, S_local, Hq, D] ...
//   cp.backward(q, k, v, o, do_, lse, dq, dk, dv, seq_len, opts, stream);
#pragma once
#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "api/attention.hpp"
#include "api/context_parallel/layout.hpp"
#include "api/context_parallel/plan.hpp"

namespace tilejit::runtime::nccl {
class Communicator;
}

namespace tilejit::cp {

struct Options {
  Mode mode = Mode::ring;
  // Which tokens each rank holds (ShardLayout(layout, world, seq_len)): zigzag balances causal work.
  Layout layout = Layout::zigzag;
  // usp only: the size U of its Ulysses groups, a divisor of the world size (UspGroups); the ring
  // runs across the W / U groups. usp needs the zigzag layout and seq_len a multiple of 2W.
  int ulysses_degree = 0;
  // ulysses: the all-to-all pipelined over this many groups of each rank's heads, the exchange of
  // group g + 1 and the return of g - 1 beside group g's call (ulysses_head_groups: 0 = the
  // default, today 1 = one exchange, then the call, then the return). allgather: the key/value
  // gather pipelined over this many groups of heads, group g + 1's gather (backward: and group
  // g - 1's dK/dV sums) beside group g's calls (allgather_head_groups; a divisor of Hkv). ring and
  // usp: 0 or 1.
  int head_groups = 0;
  // ring and usp backward: the attention kernels add each call's dQ, dK and dV into the ring's f32
  // sums themselves (attention::Options::accumulate_gradients) instead of writing bf16 parts that
  // separate passes add: the same sums in the same order, without the parts' bf16 rounding. On by
  // default: 3% faster (H200 x 2, 16 heads, 8K causal: 3.89 against 4.01 ms; decision 068).
  // Allgather keeps its parts (its dQ is written once, in bf16).
  bool fused_sums = true;
  // A packed batch of documents (varlen; every mode): their lengths, which sum to seq_len. Ring,
  // allgather and usp: full or causal (each document its own attention); usp: every document a
  // multiple of 2 x world tokens.
  // Every document is cut on its own (ShardLayout(layout, world, document_lengths)); q, k, v are
  // [1, S_local, H, D] (B = 1) holding this rank's pieces, and attention.cu_seqlens_q / _k hold the
  // whole batch's offsets (i32 [documents + 1] on this rank's device; the same documents, which the
  // host cannot check without a synchronisation) with max_seqlen_q / _k set. Empty: one sequence.
  std::vector<int64_t> document_lengths;
  // The single-GPU options: causal, softmax_scale, schedule, mask, score mod. Ring and usp take the full
  // and causal masks; allgather also those that never look past the query (causal_sliding_window,
  // causal_document: prefix_mask); ulysses every mask and score mod. A mask's tensors (doc_ids,
  // prefix_lengths, block_table) are given for the whole sequence, on this rank's device.
  // Dropout draws the single-GPU keep-mask (decision 065). The backward's dq_reduction: ulysses
  // passes it and `deterministic` to its single-GPU call (unset: the single-GPU default, atomic on
  // long dense calls). Ring, allgather, usp: unset = recompute (deterministic; its split phases send
  // the dK/dV sums while the dQ kernels run, decision 068); atomic = each call's 5-matmul backward
  // adding into the sums (dQ's last bits vary run to run; the sums go after the call: decision 112).
  // Packed documents take recompute only.
  attention::Options attention;
};

// The runner of one rank: the communicator (not owned: it must outlive the runner), a
// communication stream, events, and the scratch memory calls need (grown on demand, kept between
// calls; growing it waits for the previous call's work). One runner per communicator and thread:
// calls are not thread-safe.
class ContextParallel {
 public:
  explicit ContextParallel(runtime::nccl::Communicator& comm);
  ~ContextParallel();
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

  int rank() const;
  int world() const;

  // q: [B, S_local, Hq, D], k, v: [B, S_local, Hkv, D] (rows contiguous: strides [any, H*D, D, 1]),
  // o like q, lse f32 [B, Hq, S_local] (unit stride on S_local), where S_local =
  // ShardLayout(opts.layout, world, seq_len).local_len(rank) and seq_len is the global length.
  // Every rank calls it with the same seq_len and options (NCCL collectives inside).
  void forward(const attention::Tensor& q, const attention::Tensor& k, const attention::Tensor& v, const attention::Tensor& o,
               const attention::Tensor& lse, int64_t seq_len, const Options& opts, CUstream stream = nullptr);
  // dq like q, dk and dv like k; o and lse the forward's.
  void backward(const attention::Tensor& q, const attention::Tensor& k, const attention::Tensor& v, const attention::Tensor& o,
                const attention::Tensor& do_, const attention::Tensor& lse, const attention::Tensor& dq,
                const attention::Tensor& dk, const attention::Tensor& dv, int64_t seq_len, const Options& opts,
                CUstream stream = nullptr);

  struct State;  // streams, events, scratch (api/context_parallel/runner.cpp)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace tilejit::cp
