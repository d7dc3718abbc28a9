// Context parallelism on the host (issue 24): shard layouts and their index maps, Ulysses' head
// split, and the planner simulation: every rank's plan executed in float64 (each call a small
// attention of local queries against a run of key rows, partials merged by LSE, gradients
// accumulated by global position), compared with global attention, forward and backward, for
// ring and allgather, contiguous and zigzag layouts, W in {1, 2, 3, 4}, full and causal, GQA, and
// lengths not divisible by the chunk count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

#include "api/context_parallel.hpp"
#include "api/context_parallel/layout.hpp"
#include "api/context_parallel/plan.hpp"
#include "kernels/attention/mask_host.hpp"
#include "runtime/driver.hpp"
#include "runtime/nccl.hpp"

using namespace tilejit::cp;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// [S, H, D] float64 tensors, one sequence
struct Seq {
  int S = 0, H = 0, D = 0;
  std::vector<double> v;
  Seq(int s, int h, int d) : S(s), H(h), D(d), v(static_cast<size_t>(s * h * d), 0.0) {}
  double& at(int64_t s, int h, int d) { return v[static_cast<size_t>((s * H + h) * D + d)]; }
  double at(int64_t s, int h, int d) const { return v[static_cast<size_t>((s * H + h) * D + d)]; }
};

Seq random_seq(int S, int H, int D, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  Seq t(S, H, D);
  for (double& x : t.v) x = n(rng);
  return t;
}

struct Problem {
  int S, Hq, Hkv, D;
  bool causal;
  double scale;
  Seq q, k, v, dout;
  int kv_head(int h) const { return h / (Hq / Hkv); }
};

// Attention of query positions `qp` against key positions `kp` (global positions, any order), with
// the call's own mask: bottom-right causal in call coordinates when `call_causal`. Rows that see no
// key: O = 0, LSE = -inf. Returns O [rows, Hq, D] and LSE [Hq][rows].
struct Partial {
  std::vector<double> o, lse;
};
Partial attend(const Problem& p, const std::vector<int64_t>& qp, const std::vector<int64_t>& kp, bool call_causal) {
  const size_t nq = qp.size(), nk = kp.size();
  Partial out{std::vector<double>(nq * p.Hq * p.D, 0.0), std::vector<double>(p.Hq * nq, kNegInf)};
  const int64_t shift = static_cast<int64_t>(nk) - static_cast<int64_t>(nq);
  for (int h = 0; h < p.Hq; ++h)
    for (size_t i = 0; i < nq; ++i) {
      std::vector<double> s;
      std::vector<size_t> keys;
      for (size_t j = 0; j < nk; ++j) {
        if (call_causal && static_cast<int64_t>(j) > static_cast<int64_t>(i) + shift) continue;
        double dot = 0;
        for (int d = 0; d < p.D; ++d) dot += p.q.at(qp[i], h, d) * p.k.at(kp[j], p.kv_head(h), d);
        s.push_back(dot * p.scale);
        keys.push_back(j);
      }
      if (s.empty()) continue;
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double x : s) sum += std::exp(x - m);
      const double lse = m + std::log(sum);
      out.lse[h * nq + i] = lse;
      for (size_t t = 0; t < keys.size(); ++t)
        for (int d = 0; d < p.D; ++d) out.o[(i * p.Hq + h) * p.D + d] += std::exp(s[t] - lse) * p.v.at(kp[keys[t]], p.kv_head(h), d);
    }
  return out;
}

// Global attention: every query sees every key (causal: keys at positions <= its own).
std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = i;
  return x;
}

struct Grads {
  Seq dq, dk, dv;
};

// Backward of one call with the final O and LSE (global): adds its dQ to dq at the query positions
// and dK, dV at the key positions.
void attend_backward(const Problem& p, const std::vector<int64_t>& qp, const std::vector<int64_t>& kp, bool call_causal, const Seq& o,
                     const std::vector<double>& lse_global, Grads& g) {
  const int64_t shift = static_cast<int64_t>(kp.size()) - static_cast<int64_t>(qp.size());
  for (int h = 0; h < p.Hq; ++h) {
    const int kh = p.kv_head(h);
    for (size_t i = 0; i < qp.size(); ++i) {
      const int64_t qi = qp[i];
      const double lse = lse_global[static_cast<size_t>(h * p.S + qi)];
      if (lse == kNegInf) continue;
      double delta = 0;
      for (int d = 0; d < p.D; ++d) delta += p.dout.at(qi, h, d) * o.at(qi, h, d);
      for (size_t j = 0; j < kp.size(); ++j) {
        if (call_causal && static_cast<int64_t>(j) > static_cast<int64_t>(i) + shift) continue;
        const int64_t kj = kp[j];
        double dot = 0, dp = 0;
        for (int d = 0; d < p.D; ++d) {
          dot += p.q.at(qi, h, d) * p.k.at(kj, kh, d);
          dp += p.dout.at(qi, h, d) * p.v.at(kj, kh, d);
        }
        const double prob = std::exp(dot * p.scale - lse), ds = prob * (dp - delta);
        for (int d = 0; d < p.D; ++d) {
          g.dv.at(kj, kh, d) += prob * p.dout.at(qi, h, d);
          g.dq.at(qi, h, d) += ds * p.k.at(kj, kh, d) * p.scale;
          g.dk.at(kj, kh, d) += ds * p.q.at(qi, h, d) * p.scale;
        }
      }
    }
  }
}

// The global positions of a step's key buffer rows.
std::vector<int64_t> key_positions(const ShardLayout& layout, const PlanStep& step) {
  return step.kv_rank >= 0 ? layout.positions(step.kv_rank) : iota(layout.seq_len());
}

std::vector<int64_t> slice(const std::vector<int64_t>& x, int64_t begin, int64_t end) {
  return {x.begin() + begin, x.begin() + end};
}

// Merges a call's partial into the rank's accumulators (rows [q_begin, q_end) of the shard).
void merge(const Problem& p, const AttentionCall& call, const Partial& part, std::vector<double>& o_acc, std::vector<double>& lse_acc,
           int64_t local_len) {
  const size_t nq = static_cast<size_t>(call.q_len());
  for (int h = 0; h < p.Hq; ++h)
    for (size_t i = 0; i < nq; ++i) {
      const size_t row = static_cast<size_t>(call.q_begin) + i;
      double& la = lse_acc[static_cast<size_t>(h) * static_cast<size_t>(local_len) + row];
      const double lp = part.lse[h * nq + i];
      double wa = 0, wp = 1, lse = lp;
      if (!call.first) {
        const double m = std::max(la, lp);
        if (m == kNegInf) continue;
        lse = m + std::log(std::exp(la - m) + std::exp(lp - m));
        wa = std::exp(la - lse);
        wp = std::exp(lp - lse);
      }
      for (int d = 0; d < p.D; ++d) {
        double& oa = o_acc[(row * p.Hq + h) * p.D + d];
        oa = (call.first ? 0.0 : wa * oa) + wp * part.o[(i * p.Hq + h) * p.D + d];
      }
      la = lse;
    }
}

// `documents`: a packed batch of documents of these lengths (summing to S), each its own attention.
void check_mode(Mode mode, Layout kind, int W, int S, bool causal, bool global_runs = false, std::vector<int64_t> documents = {}) {
  CAPTURE(name(mode));
  CAPTURE(global_runs);
  CAPTURE(documents.size());
  if (documents.empty()) documents = {S};
  CAPTURE(name(kind));
  CAPTURE(W);
  CAPTURE(S);
  CAPTURE(causal);
  std::mt19937 rng(static_cast<unsigned>(W * 1000 + S * 10 + causal));
  const int Hq = 4, Hkv = 2, D = 4;
  Problem p{S, Hq, Hkv, D, causal, 0.7, random_seq(S, Hq, D, rng), random_seq(S, Hkv, D, rng), random_seq(S, Hkv, D, rng),
            random_seq(S, Hq, D, rng)};
  // each document's attention on its own (one document: the whole sequence)
  Partial global{std::vector<double>(static_cast<size_t>(S * Hq * D), 0.0), std::vector<double>(static_cast<size_t>(Hq * S), kNegInf)};
  std::vector<std::vector<int64_t>> doc_positions;
  for (int64_t begin = 0; int64_t len : documents) {
    std::vector<int64_t> pos = slice(iota(S), begin, begin + len);
    const Partial part = attend(p, pos, pos, causal);
    for (int64_t i = 0; i < len; ++i)
      for (int h = 0; h < Hq; ++h) {
        global.lse[static_cast<size_t>(h * S + begin + i)] = part.lse[static_cast<size_t>(h * len + i)];
        for (int d = 0; d < D; ++d)
          global.o[static_cast<size_t>(((begin + i) * Hq + h) * D + d)] = part.o[static_cast<size_t>((i * Hq + h) * D + d)];
      }
    doc_positions.push_back(std::move(pos));
    begin += len;
  }
  Seq o_global(S, Hq, D);
  o_global.v = global.o;
  Grads want{Seq(S, Hq, D), Seq(S, Hkv, D), Seq(S, Hkv, D)};
  for (const std::vector<int64_t>& pos : doc_positions) attend_backward(p, pos, pos, causal, o_global, global.lse, want);

  const ShardLayout layout = documents.size() > 1 ? ShardLayout(kind, W, documents) : ShardLayout(kind, W, S);
  Grads got{Seq(S, Hq, D), Seq(S, Hkv, D), Seq(S, Hkv, D)};
  for (int r = 0; r < W; ++r) {
    const Plan plan = make_plan(mode, layout, causal, r, global_runs);
    CAPTURE(plan.describe());
    const std::vector<int64_t> qpos = layout.positions(r);
    const int64_t n = layout.local_len(r);
    std::vector<double> o_acc(static_cast<size_t>(n * Hq * D), 0.0), lse_acc(static_cast<size_t>(Hq * n), kNegInf);
    std::vector<bool> written(static_cast<size_t>(n), false);
    for (const PlanStep& step : plan.steps) {
      const std::vector<int64_t> kpos = key_positions(layout, step);
      for (const AttentionCall& call : step.calls) {
        const std::vector<int64_t> qs = slice(qpos, call.q_begin, call.q_end), ks = slice(kpos, call.k_begin, call.k_end);
        CHECK(qs.front() == call.q_global);
        CHECK(ks.front() == call.k_global);
        if (global_runs) {  // each one stretch of the sequence: placed by two offsets (dropout)
          // inside its document (dropout places rows and keys from document_begin)
          const std::vector<int64_t>& doc = doc_positions[static_cast<size_t>(call.document)];
          for (const std::vector<int64_t>* run : {&qs, &ks})
            for (int64_t pos : *run) CHECK((pos >= doc.front() && pos <= doc.back()));
          CHECK(call.document_begin == doc.front());
          for (size_t i = 0; i < qs.size(); ++i) CHECK(qs[i] == call.q_global + static_cast<int64_t>(i));
          for (size_t j = 0; j < ks.size(); ++j) CHECK(ks[j] == call.k_global + static_cast<int64_t>(j));
        }
        for (int64_t i = call.q_begin; i < call.q_end; ++i) {
          CHECK(written[static_cast<size_t>(i)] == !call.first);  // `first` exactly on a row's first call
          written[static_cast<size_t>(i)] = true;
        }
        merge(p, call, attend(p, qs, ks, call.causal), o_acc, lse_acc, n);
        attend_backward(p, qs, ks, call.causal, o_global, global.lse, got);
      }
    }
    for (auto [begin, end] : plan.unvisited_rows)
      for (int64_t i = begin; i < end; ++i) CHECK_FALSE(written[static_cast<size_t>(i)]);
    // forward: every local row equals the global row at its position
    double err = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < Hq; ++h) {
        const double lg = global.lse[static_cast<size_t>(h * S + qpos[static_cast<size_t>(i)])];
        const double lr = lse_acc[static_cast<size_t>(h * n + i)];
        if (lg == kNegInf) CHECK(lr == kNegInf);
        else err = std::max(err, std::abs(lg - lr));
        for (int d = 0; d < D; ++d) err = std::max(err, std::abs(o_acc[static_cast<size_t>((i * Hq + h) * D + d)] - o_global.at(qpos[static_cast<size_t>(i)], h, d)));
      }
    CHECK(err < 1e-12);
  }
  double gerr = 0;
  for (size_t i = 0; i < want.dq.v.size(); ++i) gerr = std::max(gerr, std::abs(want.dq.v[i] - got.dq.v[i]));
  for (size_t i = 0; i < want.dk.v.size(); ++i)
    gerr = std::max({gerr, std::abs(want.dk.v[i] - got.dk.v[i]), std::abs(want.dv.v[i] - got.dv.v[i])});
  CHECK(gerr < 1e-12);
  // the gradients are not all zero (the comparison means something)
  CHECK(*std::max_element(want.dk.v.begin(), want.dk.v.end()) > 1e-3);
}

}  // namespace

// Every token held once, chunks where their owners say, the index maps inverse to each other.
void check_layout(const ShardLayout& layout) {
        const int W = layout.world();
        const int64_t S = layout.seq_len();
        CAPTURE(layout.describe());
        std::set<int64_t> seen;
        int64_t total = 0;
        for (int r = 0; r < W; ++r) {
          const std::vector<int64_t> p = layout.positions(r);
          CHECK(static_cast<int64_t>(p.size()) == layout.local_len(r));
          CHECK(layout.max_local_len() - layout.local_len(r) <= 2 * layout.documents());
          for (int c : layout.chunks_of(r)) {
            CHECK(layout.owner(c) == r);
            CHECK(p[static_cast<size_t>(layout.local_offset(c))] == layout.chunk(c).begin);
          }
          seen.insert(p.begin(), p.end());
          total += static_cast<int64_t>(p.size());
        }
        CHECK(total == S);
        CHECK(static_cast<int64_t>(seen.size()) == S);  // every token once
        const std::vector<ShardSlot> back = unshard_index(layout);
        for (int64_t g = 0; g < S; ++g)
          CHECK(layout.positions(back[static_cast<size_t>(g)].rank)[static_cast<size_t>(back[static_cast<size_t>(g)].index)] == g);
}

TEST_CASE("cp/layout: chunks, owners, positions and index maps") {
  for (Layout kind : {Layout::contiguous, Layout::zigzag})
    for (int W : {1, 2, 3, 4})
      for (int S : {W * 2 * 5, W * 2 * 5 + 3}) check_layout(ShardLayout(kind, W, S));
  const ShardLayout z(Layout::zigzag, 2, 16);
  CHECK(z.positions(0) == std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15});
  CHECK(z.positions(1) == std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11});
  const std::vector<int64_t> tokens = iota(16);
  CHECK(shard(z, 1, tokens) == std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK_THROWS_WITH_AS(ShardLayout(Layout::zigzag, 4, 7), doctest::Contains("needs at least 8 tokens"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(ShardLayout(Layout::zigzag, 0, 7), doctest::Contains("world is 0"), std::invalid_argument);
}

TEST_CASE("cp/layout: packed documents are sharded one by one") {
  // documents of 8, 13 and 4 tokens over 2 ranks, zigzag (4 chunks each)
  const std::vector<int32_t> cu{0, 8, 21, 25};
  CHECK(shard_cu_seqlens(Layout::zigzag, 2, 0, cu) == std::vector<int32_t>{0, 4, 11, 13});
  CHECK(shard_cu_seqlens(Layout::zigzag, 2, 1, cu) == std::vector<int32_t>{0, 4, 10, 12});
  CHECK_THROWS_WITH_AS(shard_cu_seqlens(Layout::zigzag, 4, 0, cu), doctest::Contains("document 2 has 4 tokens"), std::invalid_argument);
  // the same documents as one ShardLayout (what ulysses exchanges): rank 0 holds chunks 0 and 3 of
  // each document (8 -> [0, 2) [6, 8); 13 -> 4 3 3 3: [8, 12) [18, 21); 4 -> [21] [24])
  const ShardLayout docs(Layout::zigzag, 2, std::vector<int64_t>{8, 13, 4});
  CHECK(docs.documents() == 3);
  CHECK(docs.seq_len() == 25);
  CHECK(docs.positions(0) == std::vector<int64_t>{0, 1, 6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 24});
  CHECK(docs.local_len(1) == 12);
  for (int r = 0; r < 2; ++r) {  // the pieces shard_cu_seqlens counts, in the same order
    const std::vector<int32_t> local = shard_cu_seqlens(Layout::zigzag, 2, r, cu);
    const std::vector<int64_t> pos = docs.positions(r);
    for (size_t d = 0; d + 1 < cu.size(); ++d)
      for (int32_t i = local[d]; i < local[d + 1]; ++i) {
        CHECK(pos[static_cast<size_t>(i)] >= cu[d]);
        CHECK(pos[static_cast<size_t>(i)] < cu[d + 1]);
      }
  }
  for (Layout kind : {Layout::contiguous, Layout::zigzag})
    for (int W : {1, 2, 3, 4}) check_layout(ShardLayout(kind, W, std::vector<int64_t>{2 * W + 3, 7 * W, 2 * W}));
  CHECK_THROWS_WITH_AS(ShardLayout(Layout::zigzag, 2, std::vector<int64_t>{8, 3}), doctest::Contains("document 1 has 3 tokens"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ShardLayout(Layout::zigzag, 2, std::vector<int64_t>{}), doctest::Contains("no documents"), std::invalid_argument);
}

TEST_CASE("cp/plan: zigzag causal ring is the balanced schedule") {
  // rank 1 of 4 (chunks 1 and 6 of 8, 4 tokens each): step 0 causal on its shard; step 1 (rank 0's
  // chunks 0, 7): all queries against the first half; steps 2, 3 (ranks 3, 2): the second half of
  // the queries against everything
  const Plan plan = make_plan(Mode::ring, ShardLayout(Layout::zigzag, 4, 32), true, 1);
  INFO(plan.describe());
  REQUIRE(plan.steps.size() == 4);
  CHECK(plan.steps[0].calls.size() == 1);
  CHECK(plan.steps[0].calls[0].causal);
  CHECK(plan.steps[0].calls[0].first);
  CHECK(plan.steps[1].kv_rank == 0);
  CHECK((plan.steps[1].calls[0].q_begin == 0 && plan.steps[1].calls[0].q_end == 8 && plan.steps[1].calls[0].k_end == 4));
  for (int s : {2, 3}) {
    REQUIRE(plan.steps[s].calls.size() == 1);
    const AttentionCall& c = plan.steps[s].calls[0];
    CHECK((c.q_begin == 4 && c.q_end == 8 && c.k_begin == 0 && c.k_end == 8 && !c.causal && !c.first));
  }
  // every rank does the same work: W * (chunk^2 / 2 ... ) per step pattern
  for (int r = 0; r < 4; ++r) {
    int64_t area = 0;
    for (const PlanStep& st : make_plan(Mode::ring, ShardLayout(Layout::zigzag, 4, 32), true, r).steps)
      for (const AttentionCall& c : st.calls) area += c.q_len() * c.k_len();
    CHECK(area == 8 * 8 + 3 * 32);
  }
  // allgather: each query chunk against its prefix
  const Plan ag = make_plan(Mode::allgather, ShardLayout(Layout::zigzag, 4, 32), true, 1);
  REQUIRE(ag.steps[0].calls.size() == 2);
  CHECK((ag.steps[0].calls[0].k_end == 8 && ag.steps[0].calls[1].k_end == 28 && ag.steps[0].calls[1].q_begin == 4));
}

TEST_CASE("cp/plan: simulated ranks equal global attention, forward and backward") {
  for (Mode mode : {Mode::ring, Mode::allgather})
    for (Layout kind : {Layout::contiguous, Layout::zigzag})
      for (int W : {1, 2, 3, 4})
        for (bool causal : {false, true})
          for (int S : {W * 2 * 3, W * 2 * 3 + 5}) check_mode(mode, kind, W, S, causal);
}

TEST_CASE("cp/plan: packed documents (each its own attention) in ring and allgather equal per-document attention") {
  for (Mode mode : {Mode::ring, Mode::allgather})
    for (Layout kind : {Layout::contiguous, Layout::zigzag})
      for (int W : {1, 2, 3})
        for (bool causal : {false, true}) {
          const int C = kind == Layout::zigzag ? 2 * W : W;
          const std::vector<int64_t> docs{3 * C + 1, C, 2 * C + 3};
          for (bool global_runs : {false, true})
            check_mode(mode, kind, W, static_cast<int>(docs[0] + docs[1] + docs[2]), causal, global_runs, docs);
        }
}

TEST_CASE("cp/plan: with global runs (dropout) every call is one stretch of queries and of keys, still exact") {
  for (Mode mode : {Mode::ring, Mode::allgather})
    for (Layout kind : {Layout::contiguous, Layout::zigzag})
      for (int W : {1, 2, 3, 4})
        for (bool causal : {false, true}) check_mode(mode, kind, W, W * 2 * 3, causal, true);
  // rank 1 of a zigzag ring over 4 (chunks of 4 tokens): its chunks 1 and 6 are not adjacent, so
  // no call spans both; under the full mask a step is 2 x 2 (query chunk, key chunk) calls, but
  // rank 3's chunks 3 and 4 are adjacent: one call per query chunk on both
  const Plan plan = make_plan(Mode::ring, ShardLayout(Layout::zigzag, 4, 32), false, 1, true);
  for (const PlanStep& st : plan.steps) {
    CAPTURE(st.kv_rank);
    CHECK(st.calls.size() == (st.kv_rank == 3 ? 2u : 4u));
    for (const AttentionCall& c : st.calls) CHECK((c.q_len() == 4 && c.k_len() == (st.kv_rank == 3 ? 8 : 4)));
  }
}

TEST_CASE("cp/ulysses: heads per rank, GQA groups whole or replicated") {
  const UlyssesHeads a = ulysses_heads(16, 4, 2, 1);  // whole groups
  CHECK((a.q_begin == 8 && a.q_count == 8 && a.kv_begin == 2 && a.kv_count == 2));
  const UlyssesHeads b = ulysses_heads(16, 2, 4, 3);  // inside one group: replicated
  CHECK((b.q_begin == 12 && b.q_count == 4 && b.kv_begin == 1 && b.kv_count == 1));
  CHECK_THROWS_WITH_AS(ulysses_heads(12, 4, 8, 0), doctest::Contains("12 query heads over 8 ranks"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(ulysses_heads(24, 4, 6, 0), doctest::Contains("4 query heads per rank and GQA groups of 6"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_plan(Mode::ulysses, ShardLayout(Layout::zigzag, 2, 8), true, 0), doctest::Contains("no chunk plan"),
                       std::invalid_argument);
  // head groups of the pipelined all-to-all: divisors of a rank's key/value heads
  CHECK(ulysses_head_groups(16, 4, 2, 0) == kDefaultHeadGroups);
  CHECK(ulysses_head_groups(16, 4, 2, 2) == 2);   // 2 key/value heads a rank
  CHECK(ulysses_head_groups(16, 2, 2, 0) == 1);   // 1 a rank: nothing to split
  CHECK(ulysses_head_groups(16, 2, 4, 0) == 1);   // replicated key/value head: one group
  CHECK(ulysses_head_groups(64, 64, 4, 8) == 8);
  CHECK(ulysses_head_groups(16, 4, 2, 1) == 1);
  CHECK_THROWS_WITH_AS(ulysses_head_groups(24, 6, 2, 2), doctest::Contains("head_groups is 2; valid: 0 (auto), 1, or a divisor of the 3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ulysses_head_groups(16, 2, 4, 2), doctest::Contains("here 1 only"), std::invalid_argument);
  // allgather: a divisor of the key/value heads (the gather runs per group of them)
  CHECK(allgather_head_groups(8, 0) == kDefaultAllgatherHeadGroups);
  CHECK(allgather_head_groups(8, 4) == 4);
  CHECK(allgather_head_groups(8, 8) == 8);
  CHECK(allgather_head_groups(1, 1) == 1);
  CHECK_THROWS_WITH_AS(allgather_head_groups(8, 3), doctest::Contains("head_groups is 3; valid: 0 (auto), 1, or a divisor of the 8"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(allgather_head_groups(8, -1), doctest::Contains("head_groups is -1"), std::invalid_argument);
}

// usp: group g's members, laid out as a zigzag over U of the group's shard, hold exactly rank g's
// zigzag shard over R (what usp.cpp relies on: no layouts of its own), and the ring over R on it
// equals global attention (simulated like ring and allgather); every query head is some member's.
TEST_CASE("cp/usp: Ulysses groups assemble the ring's zigzag shards") {
  for (int W : {1, 2, 3, 4, 6, 8})
    for (int U = 1; U <= W; ++U) {
      if (W % U) continue;
      CAPTURE(W);
      CAPTURE(U);
      const UspGroups g = usp_groups(W, U);
      const int R = g.ring;
      CHECK(R * U == W);
      const int64_t S = 2 * W * 3;
      const ShardLayout world(Layout::zigzag, W, S), ring(Layout::zigzag, R, S), group(Layout::zigzag, U, S / R);
      for (int r = 0; r < W; ++r) {
        CHECK(g.group_ranks(r)[static_cast<size_t>(g.member(r))] == r);
        CHECK(g.ring_ranks(r)[static_cast<size_t>(g.group(r))] == r);
        const std::vector<int64_t> mine = world.positions(r), shard = ring.positions(g.group(r));
        REQUIRE(static_cast<int64_t>(shard.size()) == group.seq_len());
        for (int c : group.chunks_of(g.member(r)))  // the member's local rows of chunk c -> the shard's rows
          for (int64_t i = 0; i < group.chunk(c).size(); ++i)
            CHECK(mine[static_cast<size_t>(group.local_offset(c) + i)] == shard[static_cast<size_t>(group.chunk(c).begin + i)]);
      }
      int heads = 0;
      for (int u = 0; u < U; ++u) heads += ulysses_heads(24, 24, U, u).q_count;
      CHECK(heads == 24);
      for (bool causal : {false, true}) check_mode(Mode::ring, Layout::zigzag, R, static_cast<int>(S), causal);
    }
  // packed documents (each a multiple of 2W tokens): each document's part of a group's shard is a
  // document of its own in the group's layout, and the members' rows are the ring's shard rows
  for (int W : {2, 3, 4, 6})
    for (int U = 1; U <= W; ++U) {
      if (W % U) continue;
      CAPTURE(W);
      CAPTURE(U);
      const UspGroups g = usp_groups(W, U);
      const std::vector<int64_t> lengths{2 * W * 3, 2 * W, 2 * W * 2};
      const ShardLayout world(Layout::zigzag, W, lengths);
      const UspLayouts l = usp_layouts(g, world);
      CHECK(l.ring.documents() == 3);
      CHECK(l.group.seq_len() * g.ring == world.seq_len());
      for (int r = 0; r < W; ++r) {
        const std::vector<int64_t> mine = world.positions(r), shard = l.ring.positions(g.group(r));
        REQUIRE(static_cast<int64_t>(shard.size()) == l.group.seq_len());
        for (int c : l.group.chunks_of(g.member(r)))
          for (int64_t i = 0; i < l.group.chunk(c).size(); ++i)
            CHECK(mine[static_cast<size_t>(l.group.local_offset(c) + i)] == shard[static_cast<size_t>(l.group.chunk(c).begin + i)]);
      }
      for (bool causal : {false, true})
        check_mode(Mode::ring, Layout::zigzag, g.ring, static_cast<int>(world.seq_len()), causal, false, lengths);
    }
  CHECK_THROWS_WITH_AS(usp_layouts(usp_groups(2, 2), ShardLayout(Layout::zigzag, 2, std::vector<int64_t>{8, 6})),
                       doctest::Contains("cp::usp: document 1 has 6 tokens; usp needs a multiple of 2 x world = 4"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(usp_layouts(usp_groups(2, 2), ShardLayout(Layout::zigzag, 2, 10)),
                       doctest::Contains("cp::usp: the sequence has 10 tokens"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(usp_layouts(usp_groups(2, 2), ShardLayout(Layout::contiguous, 2, 8)), doctest::Contains("usp needs zigzag over 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(usp_groups(4, 3), doctest::Contains("ulysses_degree is 3; valid: a divisor of the world size 4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(usp_groups(4, 0), doctest::Contains("ulysses_degree is 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_plan(Mode::usp, ShardLayout(Layout::zigzag, 2, 8), true, 0), doctest::Contains("ring's plan over its groups"),
                       std::invalid_argument);
}

// ContextParallel's argument checks need neither a GPU nor NCCL (the communicator is a wrapped fake
// handle, never called): every rejected argument is one std::invalid_argument naming the function,
// the argument, its value and what is valid.
TEST_CASE("cp/runner: bad arguments are refused before anything runs") {
  using tilejit::attention::contiguous;
  using tilejit::ir::DType;
  namespace nccl = tilejit::runtime::nccl;
  nccl::Communicator comm = nccl::Communicator::wrap(reinterpret_cast<void*>(0x10), 0, 2, 0);
  ContextParallel cp(comm);
  const uint64_t base = 0x7f0000000000;
  // rank 0 of 2, zigzag over 16 tokens: 8 local rows; 4 query heads, 2 key/value heads, D 64
  auto q = contiguous(base, DType::bf16, {1, 8, 4, 64}), k = contiguous(base + 0x100000, DType::bf16, {1, 8, 2, 64});
  auto v = contiguous(base + 0x200000, DType::bf16, {1, 8, 2, 64}), o = contiguous(base + 0x300000, DType::bf16, {1, 8, 4, 64});
  auto lse = contiguous(base + 0x400000, DType::f32, {1, 4, 8});
  Options opts;
  opts.attention.causal = true;
  const auto fwd = [&](const Options& op, int64_t S = 16) { cp.forward(q, k, v, o, lse, S, op); };
  const auto refused = [&](const Options& op, const char* want, int64_t S = 16) {
    CHECK_THROWS_WITH_AS(fwd(op, S), doctest::Contains(want), std::invalid_argument);
  };
  refused(opts, "seq_len 3", 3);
  refused(opts, "q has 8 rows but rank 0 of a zigzag layout holds 9 tokens of seq_len 18", 18);
  Options sw = opts;
  sw.attention.causal = false;
  sw.attention.mask = tilejit::attention::Mask{tilejit::kernels::MaskSpec::sliding_window(4), {}, {}, {}};
  refused(sw, "mode ring takes the full and causal masks only");
  Options drop = opts;
  drop.attention.dropout_p = 0.1;
  refused(drop, "has a chunk at token 4; with dropout every chunk must start at a multiple of 64 (seq_len, or each document's length, "
                "a multiple of 256)");
  Options uly_bits = drop;
  uly_bits.mode = Mode::ulysses;
  uly_bits.attention.dropout_bits = q;
  refused(uly_bits, "options.attention.dropout_mask / dropout_bits: a per-call mask tensor");
  Options uly = opts;
  uly.mode = Mode::ulysses;
  const auto q3 = contiguous(base, DType::bf16, {1, 8, 3, 64}), o3 = contiguous(base + 0x300000, DType::bf16, {1, 8, 3, 64});
  CHECK_THROWS_WITH_AS(cp.forward(q3, k, v, o3, contiguous(base + 0x400000, DType::f32, {1, 3, 8}), 16, uly),
                       doctest::Contains("3 query heads over 2 ranks"), std::invalid_argument);
  Options usp = opts;
  usp.mode = Mode::usp;
  refused(usp, "options.ulysses_degree 0: cp::usp: ulysses_degree is 0");
  // packed documents: the whole batch's cu_seqlens, B = 1, lengths summing to seq_len; usp: each a
  // multiple of 2 x world
  Options docs = opts;
  docs.document_lengths = {8, 8};
  docs.mode = Mode::ulysses;
  refused(docs, "options.document_lengths is set but options.attention.cu_seqlens_q / _k are not");
  const auto cu = contiguous(base + 0x500000, DType::i32, {3});
  docs.attention.cu_seqlens_q = docs.attention.cu_seqlens_k = cu;
  Options usp_docs = docs;
  usp_docs.mode = Mode::usp;
  usp_docs.ulysses_degree = 2;
  usp_docs.document_lengths = {6, 10};  // (rank 0 holds 3 + 5 = 8 of the tokens: the rows check passes)
  refused(usp_docs, "options.document_lengths: cp::usp: document 0 has 6 tokens; usp needs a multiple of 2 x world = 4");
  docs.attention.max_seqlen_q = docs.attention.max_seqlen_k = 8;
  docs.document_lengths = {8, 9};
  refused(docs, "options.document_lengths sum to 17 tokens but seq_len is 16");
  docs.document_lengths = {8, 3};
  refused(docs, "document 1 has 3 tokens");
  Options cu_only = opts;
  cu_only.mode = Mode::ulysses;
  cu_only.attention.cu_seqlens_q = cu_only.attention.cu_seqlens_k = cu;
  refused(cu_only, "options.attention.cu_seqlens_q / _k are set but options.document_lengths is not");
  usp.ulysses_degree = 2;
  refused(usp, "seq_len 18: mode usp needs a multiple of 2 x world = 4", 18);
  Options usp_sw = sw;
  usp_sw.mode = Mode::usp;
  usp_sw.ulysses_degree = 2;
  refused(usp_sw, "mode usp takes the full and causal masks only");
  Options uly_groups = opts;
  uly_groups.mode = Mode::ulysses;
  uly_groups.head_groups = 2;  // 4 query heads / 2 key-value heads over 2 ranks: 1 key/value head a rank
  refused(uly_groups, "head_groups is 2; valid: 0 (auto), 1, or a divisor of the 1 key/value heads");
  Options usp_groups2 = usp;
  usp_groups2.head_groups = 2;
  refused(usp_groups2, "mode usp exchanges all heads at once");
  Options ag_groups = opts;
  ag_groups.mode = Mode::allgather;
  ag_groups.head_groups = 4;  // 2 key/value heads
  refused(ag_groups, "cp::allgather: head_groups is 4; valid: 0 (auto), 1, or a divisor of the 2 key/value heads");
  Options ring_groups = opts;
  ring_groups.mode = Mode::ring;
  ring_groups.head_groups = 2;
  refused(ring_groups, "mode ring sends all heads each step");
  Options usp_contiguous = usp;
  usp_contiguous.layout = Layout::contiguous;
  refused(usp_contiguous, "mode usp runs on the zigzag layout only");
  // dQ reductions: the chunk modes run recompute or atomic (ulysses passes any to its single-GPU
  // call); packed documents (varlen calls) recompute only
  Options ordered = opts;
  ordered.attention.dq_reduction = tilejit::attention::DqReduction::ordered;
  refused(ordered, "options.attention.dq_reduction ordered: mode ring runs recompute (unset) or atomic");
  ordered.mode = Mode::allgather;
  refused(ordered, "mode allgather runs recompute (unset) or atomic");
  Options atomic_docs = docs;
  atomic_docs.attention.dq_reduction = tilejit::attention::DqReduction::atomic;
  refused(atomic_docs, "options.attention.dq_reduction atomic with options.document_lengths: packed documents run varlen calls");
  // a [B, H, S, D] tensor seen as [B, S, H, D]: rows are not contiguous
  const auto k_bhsd = tilejit::attention::permute(contiguous(base + 0x100000, DType::bf16, {1, 2, 8, 64}), {0, 2, 1, 3});
  CHECK_THROWS_WITH_AS(cp.forward(q, k_bhsd, v, o, lse, 16, opts), doctest::Contains("k must have contiguous rows"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(cp.forward(q, k, v, o, contiguous(base + 0x400000, DType::f32, {1, 4, 7}), 16, opts),
                       doctest::Contains("lse must be f32 [B, Hq, S_local] = [1, 4, 8]"), std::invalid_argument);
  const auto dk_bad = contiguous(base + 0x500000, DType::bf16, {1, 8, 4, 64});
  CHECK_THROWS_WITH_AS(cp.backward(q, k, v, o, o, lse, q, dk_bad, v, 16, opts), doctest::Contains("dk and dv 2 (k's)"),
                       std::invalid_argument);
  // a valid call gets past every check: without a GPU it stops at the driver (atomic in a chunk mode
  // and ulysses with any reduction too)
  if (!tilejit::runtime::Driver::get().available()) {
    CHECK_THROWS_AS(fwd(opts), tilejit::runtime::DeviceError);
    Options atomic = opts;
    atomic.attention.dq_reduction = tilejit::attention::DqReduction::atomic;
    for (Mode m : {Mode::ring, Mode::allgather, Mode::ulysses}) {
      atomic.mode = m;
      CHECK_THROWS_AS(fwd(atomic), tilejit::runtime::DeviceError);
    }
    Options uly_split = uly;
    uly_split.attention.dq_reduction = tilejit::attention::DqReduction::split;
    CHECK_THROWS_AS(fwd(uly_split), tilejit::runtime::DeviceError);
  }
}

// Allgather with masks that never look past the query (causal sliding windows, causal documents):
// every call, evaluated as the kernels do (bottom-right aligned in the call, document ids of the
// call's key prefix), allows exactly the global mask's keys, and no allowed key is left out.
TEST_CASE("cp/plan: allgather's causal prefixes are exact for causal windows and documents") {
  using tilejit::kernels::MaskData;
  using tilejit::kernels::MaskKind;
  using tilejit::kernels::MaskSpec;
  CHECK(prefix_mask(MaskKind::causal_document));
  CHECK_FALSE(prefix_mask(MaskKind::sliding_window));  // symmetric windows look ahead
  CHECK_FALSE(prefix_mask(MaskKind::prefix_lm));
  std::mt19937 rng(11);
  for (Layout kind : {Layout::contiguous, Layout::zigzag})
    for (int W : {1, 2, 3, 4})
      for (int S : {W * 2 * 4, W * 2 * 4 + 5}) {
        std::vector<int32_t> docs(static_cast<size_t>(S));
        for (int t = 0, d = 0; t < S; ++t) {
          if (rng() % 5 == 0) ++d;  // documents of ~5 tokens
          docs[static_cast<size_t>(t)] = d;
        }
        for (const MaskSpec& spec : {MaskSpec::causal_sliding_window(3), MaskSpec::causal_sliding_window(11), MaskSpec::causal_document()}) {
          CAPTURE(name(kind));
          CAPTURE(W);
          CAPTURE(S);
          CAPTURE(tilejit::kernels::mask_kind_name(spec.kind));
          const ShardLayout layout(kind, W, S);
          MaskData global;
          global.doc_ids = {docs, {1, S}};
          for (int r = 0; r < W; ++r) {
            const Plan plan = make_plan(Mode::allgather, layout, true, r);
            const std::vector<int64_t> qpos = layout.positions(r);
            std::vector<int> seen(static_cast<size_t>(layout.local_len(r)) * static_cast<size_t>(S), 0);
            for (const AttentionCall& c : plan.steps[0].calls) {
              MaskData view;  // the call's keys: rows [k_begin, k_end) of the gathered sequence
              view.doc_ids = {std::span<const int32_t>(docs).subspan(static_cast<size_t>(c.k_begin), static_cast<size_t>(c.k_len())),
                              {1, c.k_len()}};
              for (int64_t t = 0; t < c.q_len(); ++t)
                for (int64_t j = 0; j < c.k_len(); ++j)
                  if (tilejit::kernels::mask_allowed(spec, view, 0, 0, t, j, c.q_len(), c.k_len()))
                    ++seen[static_cast<size_t>((c.q_begin + t) * S + c.k_begin + j)];
            }
            int bad = 0;
            for (int64_t i = 0; i < layout.local_len(r); ++i)
              for (int64_t j = 0; j < S; ++j) {
                const bool want = tilejit::kernels::mask_allowed(spec, global, 0, 0, qpos[static_cast<size_t>(i)], j, S, S);
                bad += seen[static_cast<size_t>(i * S + j)] != (want ? 1 : 0);
              }
            CHECK(bad == 0);
          }
        }
      }
}
