#include "api/context_parallel/plan.hpp"

#include <fmt/format.h>

#include <optional>
#include <stdexcept>

namespace tilejit::cp {

const char* name(Mode mode) {
  switch (mode) {
    case Mode::ulysses: return "ulysses";
    case Mode::allgather: return "allgather";
    case Mode::ring: return "ring";
    case Mode::usp: return "usp";
  }
  return "?";
}

namespace {

// What a query chunk sees of a key chunk under global causality (or everything: full).
enum class Sees { none, all, diagonal };

// A run of chunks laid back to back in a buffer: their global ranges, where each starts, and the
// document each belongs to (packed documents: no query sees another document's keys).
struct ChunkRun {
  std::vector<ChunkRange> chunks;
  std::vector<int64_t> offsets;  // row of each chunk in the buffer
  std::vector<int> documents;
  void add(ChunkRange c, int64_t offset, int document) {
    chunks.push_back(c);
    offsets.push_back(offset);
    documents.push_back(document);
  }
};

Sees truth(const ChunkRun& qs, size_t i, const ChunkRun& ks, size_t j, bool causal) {
  if (qs.documents[i] != ks.documents[j]) return Sees::none;
  const ChunkRange q = qs.chunks[i], k = ks.chunks[j];
  if (!causal || k.end <= q.begin) return Sees::all;
  if (k.begin == q.begin && k.end == q.end) return q.size() == 1 ? Sees::all : Sees::diagonal;  // (a 1 x 1 diagonal is all)
  if (k.begin >= q.end) return Sees::none;
  throw std::logic_error("cp::make_plan: chunks overlap partially");  // chunks of one layout never do
}

// What a call over buffer rows [qa, qb) x [ka, kb) gives the rows [q0, q1) and keys [k0, k1) inside
// it: bottom-right causal row i sees keys j <= i + (kb - ka) - (qb - qa) (call coordinates); nullopt
// when the block is cut partially otherwise than on its diagonal.
std::optional<Sees> call_gives(const AttentionCall& call, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  if (!call.causal) return Sees::all;
  const int64_t shift = call.k_len() - call.q_len();
  const int64_t first_row_last_key = (q0 - call.q_begin) + shift, last_row_last_key = (q1 - 1 - call.q_begin) + shift;
  const int64_t kfirst = k0 - call.k_begin, klast = k1 - 1 - call.k_begin;
  if (first_row_last_key >= klast) return Sees::all;
  if (last_row_last_key < kfirst) return Sees::none;
  if (first_row_last_key == kfirst && q1 - q0 == k1 - k0) return Sees::diagonal;
  return std::nullopt;
}

// Whether chunks [a, b) of a run lie back to back in the global sequence too, in one document.
bool globally_adjacent(const ChunkRun& run, size_t a, size_t b) {
  for (size_t i = a + 1; i < b; ++i)
    if (run.chunks[i].begin != run.chunks[i - 1].end || run.documents[i] != run.documents[i - 1]) return false;
  return true;
}

// A run cut where its chunks stop being adjacent in the global sequence (a zigzag shard's two) or
// a document ends.
std::vector<ChunkRun> global_pieces(const ChunkRun& run) {
  std::vector<ChunkRun> pieces;
  for (size_t i = 0; i < run.chunks.size(); ++i) {
    if (i == 0 || !globally_adjacent(run, i - 1, i + 1)) pieces.emplace_back();
    pieces.back().add(run.chunks[i], run.offsets[i], run.documents[i]);
  }
  return pieces;
}

class Planner {
 public:
  Planner(const ChunkRun& queries, bool causal, bool global_runs)
      : q_(queries), causal_(causal), global_runs_(global_runs), touched_(queries.chunks.size(), false) {}

  // The calls that give query chunks [qa, qb) exactly the keys they see in `keys` (with global
  // runs: in each globally adjacent piece of `keys`, one call or more each).
  void cover_all(const ChunkRun& keys, size_t qa, size_t qb, std::vector<AttentionCall>& out) {
    if (!global_runs_) return cover(keys, qa, qb, out);
    for (const ChunkRun& piece : global_pieces(keys)) cover(piece, qa, qb, out);
  }

  // The calls that give query chunks [qa, qb) exactly the keys they see in `keys`.
  void cover(const ChunkRun& keys, size_t qa, size_t qb, std::vector<AttentionCall>& out) {
    // the key chunks any of these queries sees must be one run
    std::optional<size_t> first, last;
    for (size_t i = qa; i < qb; ++i)
      for (size_t j = 0; j < keys.chunks.size(); ++j)
        if (truth(q_, i, keys, j, causal_) != Sees::none) {
          first = first ? std::min(*first, j) : j;
          last = last ? std::max(*last, j) : j;
        }
    if (!first) return;
    for (bool causal : {false, true}) {
      AttentionCall call{q_.offsets[qa],   q_.offsets[qb - 1] + q_.chunks[qb - 1].size(),
                         keys.offsets[*first], keys.offsets[*last] + keys.chunks[*last].size(),
                         causal,           false,
                         q_.chunks[qa].begin, keys.chunks[*first].begin,
                         q_.documents[qa], 0};
      if (exact(call, keys, qa, qb) && uniform_touch(qa, qb) && (!global_runs_ || globally_adjacent(q_, qa, qb))) {
        call.first = !touched_[qa];
        for (size_t i = qa; i < qb; ++i) touched_[i] = true;
        out.push_back(call);
        return;
      }
    }
    if (qb - qa == 1) throw std::logic_error("cp::make_plan: a query chunk's keys are not one causal or full call");
    const size_t mid = qa + (qb - qa) / 2;
    cover(keys, qa, mid, out);
    cover(keys, mid, qb, out);
  }

  std::vector<std::pair<int64_t, int64_t>> untouched() const {
    std::vector<std::pair<int64_t, int64_t>> rows;
    for (size_t i = 0; i < touched_.size(); ++i)
      if (!touched_[i]) rows.emplace_back(q_.offsets[i], q_.offsets[i] + q_.chunks[i].size());
    return rows;
  }

 private:
  // every (query chunk, key chunk) block of the call gets what global causality gives it (key
  // chunks outside the call's run: nothing)
  bool exact(const AttentionCall& call, const ChunkRun& keys, size_t qa, size_t qb) const {
    for (size_t i = qa; i < qb; ++i)
      for (size_t j = 0; j < keys.chunks.size(); ++j) {
        const Sees want = truth(q_, i, keys, j, causal_);
        const int64_t k0 = keys.offsets[j], k1 = k0 + keys.chunks[j].size();
        const bool inside = k0 >= call.k_begin && k1 <= call.k_end;
        const int64_t q0 = q_.offsets[i], q1 = q0 + q_.chunks[i].size();
        const std::optional<Sees> got = inside ? call_gives(call, q0, q1, k0, k1) : std::optional<Sees>(Sees::none);
        if (got != want) return false;
      }
    return true;
  }
  // a call either starts all its rows (first) or merges into all of them
  bool uniform_touch(size_t qa, size_t qb) const {
    for (size_t i = qa + 1; i < qb; ++i)
      if (touched_[i] != touched_[qa]) return false;
    return true;
  }

  const ChunkRun& q_;
  bool causal_, global_runs_;
  std::vector<bool> touched_;
};

ChunkRun shard_run(const ShardLayout& layout, int rank) {
  ChunkRun run;
  int64_t offset = 0;
  for (int c : layout.chunks_of(rank)) {
    run.add(layout.chunk(c), offset, layout.document_of(c));
    offset += layout.chunk(c).size();
  }
  return run;
}

}  // namespace

Plan make_plan(Mode mode, const ShardLayout& layout, bool causal, int rank, bool global_runs) {
  if (mode == Mode::ulysses) throw std::invalid_argument("cp::make_plan: mode ulysses has no chunk plan (see cp::ulysses_heads)");
  if (mode == Mode::usp)
    throw std::invalid_argument("cp::make_plan: mode usp runs the ring's plan over its groups (see cp::UspGroups)");
  if (rank < 0 || rank >= layout.world())
    throw std::invalid_argument(fmt::format("cp::make_plan: rank is {}; valid: 0..{}", rank, layout.world() - 1));
  const int W = layout.world();
  Plan plan;
  plan.mode = mode;
  plan.rank = rank;
  plan.send_to = (rank + 1) % W;
  plan.recv_from = (rank + W - 1) % W;
  const ChunkRun queries = shard_run(layout, rank);
  Planner planner(queries, causal, global_runs);
  const size_t nq = queries.chunks.size();
  if (mode == Mode::ring) {
    for (int s = 0; s < W; ++s) {
      PlanStep step;
      step.kv_rank = (rank - s + W) % W;
      planner.cover_all(shard_run(layout, step.kv_rank), 0, nq, step.calls);
      plan.steps.push_back(std::move(step));
    }
  } else {
    ChunkRun global;  // the gathered sequence, in global order
    for (int c = 0; c < layout.chunk_count(); ++c) global.add(layout.chunk(c), layout.chunk(c).begin, layout.document_of(c));
    PlanStep step;
    // one call per query chunk when causal (each its own key prefix), else one for all
    if (causal)
      for (size_t i = 0; i < nq; ++i) planner.cover_all(global, i, i + 1, step.calls);
    else
      planner.cover_all(global, 0, nq, step.calls);
    plan.steps.push_back(std::move(step));
  }
  plan.unvisited_rows = planner.untouched();
  for (PlanStep& step : plan.steps)
    for (AttentionCall& call : step.calls) call.document_begin = layout.document_begin(call.document);
  return plan;
}

std::string Plan::describe() const {
  std::string s = fmt::format("{} rank {}:", name(mode), rank);
  for (const PlanStep& step : steps) {
    s += fmt::format(" [kv {}:", step.kv_rank);
    for (const AttentionCall& c : step.calls)
      s += fmt::format(" q{}-{} k{}-{}{}{}", c.q_begin, c.q_end, c.k_begin, c.k_end, c.causal ? " causal" : "", c.first ? " first" : "");
    s += "]";
  }
  return s;
}

bool prefix_mask(kernels::MaskKind kind) {
  return kind == kernels::MaskKind::causal || kind == kernels::MaskKind::causal_sliding_window ||
         kind == kernels::MaskKind::causal_document;
}

UlyssesHeads ulysses_heads(int heads_q, int heads_kv, int world, int rank) {
  if (heads_q % world != 0)
    throw std::invalid_argument(fmt::format("cp::ulysses: {} query heads over {} ranks; ulysses needs heads_q divisible by the world size",
                                            heads_q, world));
  if (heads_kv < 1 || heads_q % heads_kv != 0)
    throw std::invalid_argument(fmt::format("cp::ulysses: heads_kv is {}; it must divide heads_q ({})", heads_kv, heads_q));
  const int per_rank = heads_q / world, group = heads_q / heads_kv;
  UlyssesHeads h{rank * per_rank, per_rank, 0, 0};
  if (per_rank % group == 0) {  // whole groups: Hkv / W key/value heads each
    h.kv_begin = h.q_begin / group;
    h.kv_count = per_rank / group;
  } else if (group % per_rank == 0) {  // inside one group: its key/value head, replicated
    h.kv_begin = h.q_begin / group;
    h.kv_count = 1;
  } else {
    throw std::invalid_argument(fmt::format("cp::ulysses: {} query heads per rank and GQA groups of {}: each rank must hold whole groups "
                                            "or lie inside one group",
                                            per_rank, group));
  }
  return h;
}

int ulysses_head_groups(int heads_q, int heads_kv, int world, int requested) {
  const UlyssesHeads h = ulysses_heads(heads_q, heads_kv, world, 0);
  const bool whole_groups = h.q_count % (heads_q / heads_kv) == 0;
  if (requested == 0) return whole_groups && h.kv_count % kDefaultHeadGroups == 0 ? kDefaultHeadGroups : 1;
  if (requested < 0 || (requested > 1 && (!whole_groups || h.kv_count % requested != 0)))
    throw std::invalid_argument(fmt::format(
        "cp::ulysses: head_groups is {}; valid: 0 (auto), 1, or a divisor of the {} key/value heads a rank holds{}", requested,
        h.kv_count, whole_groups ? "" : " (here 1 only: the rank's query heads share one replicated key/value head)"));
  return requested;
}

int allgather_head_groups(int heads_kv, int requested) {
  if (requested == 0) return heads_kv % kDefaultAllgatherHeadGroups == 0 ? kDefaultAllgatherHeadGroups : 1;
  if (requested < 0 || heads_kv % requested != 0)
    throw std::invalid_argument(fmt::format("cp::allgather: head_groups is {}; valid: 0 (auto), 1, or a divisor of the {} key/value heads",
                                            requested, heads_kv));
  return requested;
}

UspGroups usp_groups(int world, int ulysses_degree) {
  if (ulysses_degree < 1 || ulysses_degree > world || world % ulysses_degree != 0)
    throw std::invalid_argument(fmt::format("cp::usp: ulysses_degree is {}; valid: a divisor of the world size {} (1 .. {})",
                                            ulysses_degree, world, world));
  return {ulysses_degree, world / ulysses_degree};
}

UspLayouts usp_layouts(const UspGroups& groups, const ShardLayout& world) {
  const int W = groups.ulysses * groups.ring;
  if (world.kind() != Layout::zigzag || world.world() != W)
    throw std::invalid_argument(fmt::format("cp::usp: the layout is {} over {} ranks; usp needs zigzag over {}", name(world.kind()),
                                            world.world(), W));
  std::vector<int64_t> lengths, parts;
  for (int d = 0; d < world.documents(); ++d) {
    const int64_t len = world.document_begin(d + 1) - world.document_begin(d);
    if (len % (2 * W) != 0)
      throw std::invalid_argument(fmt::format("cp::usp: {} has {} tokens; usp needs a multiple of 2 x world = {} (equal zigzag "
                                              "chunks; ring and allgather take any)",
                                              world.documents() > 1 ? fmt::format("document {}", d) : "the sequence", len, 2 * W));
    lengths.push_back(len);
    parts.push_back(len / groups.ring);
  }
  return {ShardLayout(Layout::zigzag, groups.ring, lengths), ShardLayout(Layout::zigzag, groups.ulysses, parts)};
}

std::vector<int> UspGroups::group_ranks(int rank) const {
  std::vector<int> r;
  for (int u = 0; u < ulysses; ++u) r.push_back(group(rank) * ulysses + u);
  return r;
}

std::vector<int> UspGroups::ring_ranks(int rank) const {
  std::vector<int> r;
  for (int g = 0; g < ring; ++g) r.push_back(g * ulysses + member(rank));
  return r;
}

}  // namespace tilejit::cp
