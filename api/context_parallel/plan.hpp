// The attention calls each rank of a context-parallel group makes, for the modes that cut the
// work at chunk granularity (ring, allgather): a plan is the same for the forward and the
// backward, and is what both the GPU runner and the CI simulation (every rank's steps in float64,
// tests/test_context_parallel.cpp) execute. Every call is one single-GPU attention call on a run of
// local query rows and a run of key rows, unmasked or bottom-right causal, and together a rank's
// calls see exactly the keys global causality gives each of its queries (the planner checks each
// call against the chunk-level truth, tokens counted, before accepting it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "api/context_parallel/layout.hpp"
#include "kernels/attention/mask_patterns.hpp"

namespace tilejit::cp {

// How a call's keys reach a rank:
//   ulysses    all-to-all from sequence shards to head shards, the single-GPU call on the whole
//              sequence for Hq / W heads, all-to-all back (any mask; bit-identical to one GPU)
//   allgather  every rank gathers K and V; each local query chunk attends to the key prefix its
//              causality allows (Llama 3)
//   ring       K and V travel around the ring, one shard per step; partial outputs merged by LSE
//   usp        Ulysses inside groups of U ranks, ring across the W / U groups (UspGroups)
enum class Mode { ulysses, allgather, ring, usp };
const char* name(Mode mode);  // "ulysses", "allgather", "ring", "usp"

struct AttentionCall {
  int64_t q_begin = 0, q_end = 0;  // local query rows
  int64_t k_begin = 0, k_end = 0;  // rows of the step's key buffer
  bool causal = false;             // bottom-right causal inside the call (else unmasked)
  bool first = false;              // the first call on these rows: writes O and LSE instead of merging
  // the global positions of the first query row and the first key (with global_runs each run is one
  // stretch of the sequence, so row i of the call is q_global + i and key j is k_global + j)
  int64_t q_global = 0, k_global = 0;
  // packed documents, with global_runs: the document the call lies inside, and its first token
  // (0, 0: one sequence)
  int document = 0;
  int64_t document_begin = 0;
  int64_t q_len() const { return q_end - q_begin; }
  int64_t k_len() const { return k_end - k_begin; }
};

// One step: the key buffer holds the shard of rank `kv_rank` (ring; its chunks in local order) or
// the whole sequence in global order (allgather, kv_rank = -1).
struct PlanStep {
  int kv_rank = -1;
  std::vector<AttentionCall> calls;
};

struct Plan {
  Mode mode = Mode::ring;
  int rank = 0;
  std::vector<PlanStep> steps;
  // local rows no call covers (they see no key): O = 0, LSE = -inf
  std::vector<std::pair<int64_t, int64_t>> unvisited_rows;
  int send_to = 0, recv_from = 0;  // ring neighbours
  std::string describe() const;
};

// The plan of `rank` for a full (causal = false) or causal mask. Throws std::invalid_argument for
// Mode::ulysses (no chunk plan: see UlyssesHeads). `global_runs`: every call's query rows and keys
// are each one stretch of the global sequence (more, smaller calls: a rank's zigzag chunks are not
// adjacent), inside one document, so a call can be placed in the whole attention by two offsets
// (dropout's mask).
Plan make_plan(Mode mode, const ShardLayout& layout, bool causal, int rank, bool global_runs = false);

// Masks under which no query sees a key after its own position (causal, causal_sliding_window,
// causal_document): allgather's plan for them is the causal one, each query chunk against the key
// prefix that ends with it, and the mask applied bottom-right aligned inside each call is exact.
bool prefix_mask(kernels::MaskKind kind);

// Ulysses: the query and key/value heads rank `rank` computes on the whole sequence. Needs Hq % W
// == 0, and either whole GQA groups per rank (Hkv / W heads each) or every rank's query heads in
// one group (that key/value head replicated on the ranks that share it). std::invalid_argument
// otherwise, naming the heads and what is valid.
struct UlyssesHeads {
  int q_begin = 0, q_count = 0;
  int kv_begin = 0, kv_count = 0;
};
UlyssesHeads ulysses_heads(int heads_q, int heads_kv, int world, int rank);

// How many head groups a Ulysses call pipelines its all-to-all over: the exchange of group g + 1
// (and the return of g - 1) runs while group g's attention does. `requested` 0: kDefaultHeadGroups
// where it divides the key/value heads a rank holds, else 1; otherwise `requested`, which must
// divide them (and be 1 when a rank's query heads share one replicated key/value head).
// std::invalid_argument otherwise. The default is 1: on 4 H100s over NVLink two groups measured
// 0.95-1.05x of one (decision 062); the option is for slower links.
inline constexpr int kDefaultHeadGroups = 1;
int ulysses_head_groups(int heads_q, int heads_kv, int world, int requested);

// How many head groups allgather pipelines its key/value gather over: group g + 1's gather (and
// in the backward group g - 1's dK/dV sums) runs while group g's attention does. `requested` 0:
// kDefaultAllgatherHeadGroups where it divides the key/value heads, else 1; otherwise a divisor
// of heads_kv. std::invalid_argument otherwise.
inline constexpr int kDefaultAllgatherHeadGroups = 1;
int allgather_head_groups(int heads_kv, int requested);

// usp (unified sequence parallelism: Ulysses inside groups, ring across them): W = U x R ranks;
// ranks gU .. gU + U - 1 form Ulysses group g, and the ranks of one member index u across the
// groups (u, U + u, ...) form a ring. Under the zigzag layout over W with S a multiple of 2W, group
// g holds exactly the zigzag shard of rank g over R (the chunks of its members back to back): an
// all-to-all inside the group turns it into that shard for the member's Hq / U heads
// (ulysses_heads over U), the zigzag ring over R runs on it, and an all-to-all turns the outputs back.
struct UspGroups {
  int ulysses = 1, ring = 1;  // U, R
  int group(int rank) const { return rank / ulysses; }
  int member(int rank) const { return rank % ulysses; }
  std::vector<int> group_ranks(int rank) const;  // the communicator ranks of rank's Ulysses group, by member
  std::vector<int> ring_ranks(int rank) const;   // the communicator ranks of rank's ring, by group
};
// std::invalid_argument unless 1 <= ulysses_degree <= world divides world.
UspGroups usp_groups(int world, int ulysses_degree);

// The layouts usp runs on, from the zigzag layout over all W ranks: the ring's (zigzag over R of
// the sequence) and, inside a Ulysses group, the group's shard as a zigzag over U. Packed
// documents are cut one by one: each document's part of a group's shard is a document of its own
// (length / R). Needs every chunk of `world` equal: each document (or the sequence) a multiple of
// 2W tokens; std::invalid_argument otherwise.
struct UspLayouts {
  ShardLayout ring, group;
};
UspLayouts usp_layouts(const UspGroups& groups, const ShardLayout& world);

}  // namespace tilejit::cp
