// The deterministic attention backward's schedule (issue 8 part 2, DASH, arXiv 2601.21824): which
// program runs which key tile, the order in which a key tile visits query tiles, and the fixed order
// in which key tiles add into each dQ tile. Plain C++ so that the tests, the simulator
// (kernels/attention/backward_schedule_sim.hpp) and the GPU kernels share one definition; no tilejit dependency.
//
// Model. A dK/dV program holds one key tile n (keys [n*BN, n*BN + BN)) of one dQ head bh (batch *
// query head) at a time, visits query tiles m, keeps dK[n], dV[n] in registers and adds a part
// dQ_part(n, m) into dQ[bh][m]. Three ways to sum the parts (Reduction):
//   atomic   red.add of each part: fast, but the add order depends on timing (not reproducible).
//   ordered  parts add in the fixed order accumulation_order(), enforced by one i32 semaphore per
//            (bh, m): bit-identical results whatever the timing.
//   split    each part goes to its own workspace slot; a second kernel sums them in ascending n.
//
// Masks. full: every key tile needs every query tile. causal, bottom-right aligned (diag = S_k - S_q,
// query row i sees keys j <= i + diag): key tile n needs query tile m iff some row i of
// [m*BM, m*BM + BM) has i + diag >= n*BN, i.e. m*BM + BM - 1 + diag >= n*BN. So key tile n needs
// [first_query_tile(n), M) and dQ[m] receives parts from key tiles [0, last_key_tile(m)]. The last
// query tile needs every key tile, so every key tile has work; a query tile with last_key_tile = -1
// (S_q > S_k: rows that see no key) gets no part, and the kernels must still write its dQ (zeros).
// With BM = BN and S_q = S_k this is "key tile n visits m >= n".
//
// Persistent grid: P programs, all resident at once (P <= SM count x CTAs per SM). Work comes in items:
//   full:   item i of a head is key tile i (N items per head).
//   causal: item i is the pair (i, N-1-i) for i < N/2, plus the middle tile alone when N is odd
//           ((N+1)/2 items). The pair's first tile needs the most query tiles and its second the
//           fewest, so items cost about the same (DASH's CausalBwdChunkScheduler,
//           hopper/tile_scheduler.hpp, pairs tiles the same way).
//   Items are numbered L = bh * items_per_head + i; program p runs L = p, p + P, p + 2P, ... in that
//   order (DASH's StaticPersistentTileScheduler order), an item's first tile (stage 0) before its
//   second (stage 1). Item L is in wave L / P. A tile's concurrency group is its head's items in its
//   wave, [g, g + A): DASH's get_kv_status (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp) calls A the
//   running count and g the finished count.
//
// Visit orders (visit_query_tile(step t), t in [0, visit_count)), lo = first_query_tile(n), a = i - g:
//   ascending   lo + t.
//   descending  M - 1 - t ("descending Q-tile iteration": under a causal mask every tile starts on
//               the last query tile, the one all of them need).
//   shift, full: (a + t) mod M. The A concurrent tiles start on distinct query tiles (when A <= M)
//               and move in step, so no two add into one dQ tile at the same step (DASH's
//               ShiftScheduler, hopper/tile_m_scheduler.hpp).
//   shift, causal, stage 0: first the rectangle [rho, M), rho = first_query_tile(g + A - 1), which
//               every stage-0 tile of the group needs, rotated as above with R = M - rho:
//               rho + (a + t) mod R for t < R; then the tile's own triangle ascending, lo + t - R.
//   shift, causal, stage 1: descending (both as DASH's ShiftCausalScheduler).
//   In the simulator shift never waits when no group exceeds M tiles (full) and when S_q = S_k,
//   BM = BN, N even (causal); elsewhere it may (an odd N's middle tile is a shorter item).
//
// Accumulation order (ordered). Block (n, m) gets the key (wave, stage, step of m in n's visit
// order, n); the parts of dQ[bh][m] add in increasing key order. That is the order in which they
// arrive when blocks cost the same and items are equal, ties broken by n. Where DASH's dependency
// rules apply (ShiftDependency, ShiftCausalDependency in hopper/tile_m_dependency.hpp: at most as
// many tiles in flight as rows in the rotation; causal with S_q = S_k, BN a multiple of BM, N even)
// they are this order written out (tests/test_backward_schedule.cpp compares them block by block);
// For ascending/descending under a full mask it is FlashAttention-3's order, ascending n; under a
// causal mask plain ascending n would deadlock (a pair's second tile would wait for later items).
// Why it cannot deadlock: a program runs its blocks in strictly increasing key order (waves in
// order, stage 0 before stage 1, steps in order), and a block waits only for blocks with smaller
// keys. The unfinished block with the smallest key therefore has every block before it in its
// program and every block it waits for finished: it can run. This needs all P programs resident
// at once; with more CTAs than fit, a waiter could hold the SM its predecessor needs.
//
// Semaphore protocol (ordered). sem[bh][m]: i32, zero before the kernel; it counts the parts already
// added. Block (n, m): compute the part; one thread spins until ld.acquire.gpu(sem) ==
// wait_target(n, m); CTA barrier; the CTA adds its part into the f32 accumulator dQacc[bh][m] (a
// plain load-add-store is enough: access is exclusive); CTA barrier; one thread does
// fence.acq_rel.gpu and red.release.gpu.add(sem, 1). The last contributor (wait_target ==
// last_key_tile(m)) may convert dQacc[bh][m] to dQ itself and store 0 to sem, leaving it ready for
// the next launch.
// wait_target() is integer arithmetic on (bh, n, m, P) and the shape: no table.
//
// split workspace: f32 [heads, M, N, BM, D]; part (n, m) of head bh is slot (bh * M + m) * N + n
// (split_workspace_slot). Under a causal mask slots n > last_key_tile(m) are never written (the
// dense layout keeps the arithmetic trivial at the price of about twice the memory). The second
// kernel, one program per (bh, m), sums slots n = 0, 1, ..., last_key_tile(m) in that order from
// +0.0f, then scales and casts.
//
// Not modelled: GQA. Here a head is a dQ head; tilejit's dK/dV kernel loops over the query heads of
// a KV group inside one program, which visits G query heads' dQ tiles, not M.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace tilejit::kernels {

enum class Reduction { atomic, ordered, split };
enum class QOrder { ascending, descending, shift };
enum class BwdMask { full, causal };

// Integer division rounding down, also for negative numerators (C++ truncates towards zero).
inline int floor_div(int a, int b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0); }

// Tile counts and the mask of one backward problem.
struct BwdProblem {
  int heads = 1;          // batch * query heads: each has its own dQ and semaphores
  int seq_q = 1, seq_k = 1;
  int block_m = 1;        // BM: query rows per query tile
  int block_n = 1;        // BN: keys per key tile
  BwdMask mask = BwdMask::full;

  int query_tiles() const { return (seq_q + block_m - 1) / block_m; }  // M
  int key_tiles() const { return (seq_k + block_n - 1) / block_n; }    // N
  int diag() const { return seq_k - seq_q; }

  // The first query tile key tile n needs (0 under a full mask).
  int first_query_tile(int n) const {
    if (mask == BwdMask::full) return 0;
    return std::max(0, -floor_div(-(n * block_n - diag() - block_m + 1), block_m));  // ceil
  }
  // The last key tile that adds into dQ[m]; -1 when none does.
  int last_key_tile(int m) const {
    if (mask == BwdMask::full) return key_tiles() - 1;
    return std::clamp(floor_div(m * block_m + block_m - 1 + diag(), block_n), -1, key_tiles() - 1);
  }
  bool needs(int n, int m) const { return n <= last_key_tile(m); }

  void validate() const {
    auto bad = [](const std::string& what, int value, const char* valid) {
      throw std::invalid_argument("backward schedule: " + what + " = " + std::to_string(value) + ", want " + valid);
    };
    if (heads < 1) bad("heads", heads, ">= 1");
    if (seq_q < 1) bad("seq_q", seq_q, ">= 1");
    if (seq_k < 1) bad("seq_k", seq_k, ">= 1");
    if (block_m < 1) bad("block_m", block_m, ">= 1");
    if (block_n < 1) bad("block_n", block_n, ">= 1");
  }
};

// Items (what a program takes at a time) per head: key tiles, or causal pairs.
inline int items_per_head(const BwdProblem& p) {
  return p.mask == BwdMask::causal ? (p.key_tiles() + 1) / 2 : p.key_tiles();
}

// The half-open key tile range [begin, end) of items [i0, i1) at a stage (stage 1: the causal pairs'
// second tiles, N-1-i for i < N/2).
struct TileRange {
  int begin = 0, end = 0;
};
inline TileRange stage_tiles(const BwdProblem& p, int stage, int i0, int i1) {
  if (stage == 0) return {i0, i1};
  const int n = p.key_tiles(), pairs = n / 2;
  return {n - std::min(i1, pairs), n - std::min(i0, pairs)};
}

// Where key tile n of head bh runs: its item, stage, program and wave, and its concurrency group.
struct KeyTileSlot {
  int bh = 0, n = 0;
  int item = 0, stage = 0;
  int program = 0, wave = 0;
  int group_first = 0, group_size = 0;  // the head's items in this wave: [g, g + A)
};

inline void validate_programs(int programs) {
  if (programs < 1) throw std::invalid_argument("backward schedule: programs = " + std::to_string(programs) + ", want >= 1");
}

inline KeyTileSlot key_tile_slot(const BwdProblem& p, int programs, int bh, int n) {
  validate_programs(programs);
  if (bh < 0 || bh >= p.heads || n < 0 || n >= p.key_tiles())
    throw std::invalid_argument("backward schedule: tile (bh " + std::to_string(bh) + ", n " + std::to_string(n) +
                                ") outside heads " + std::to_string(p.heads) + " x key tiles " + std::to_string(p.key_tiles()));
  const int items = items_per_head(p);
  KeyTileSlot s;
  s.bh = bh;
  s.n = n;
  s.stage = n < items ? 0 : 1;
  s.item = s.stage == 0 ? n : p.key_tiles() - 1 - n;
  const int linear = bh * items + s.item;
  s.program = linear % programs;
  s.wave = linear / programs;
  s.group_first = std::max(0, s.wave * programs - bh * items);
  s.group_size = std::min(items, (s.wave + 1) * programs - bh * items) - s.group_first;
  return s;
}

// Every program's key tiles in execution order.
inline std::vector<std::vector<KeyTileSlot>> program_schedule(const BwdProblem& p, int programs) {
  p.validate();
  validate_programs(programs);
  std::vector<std::vector<KeyTileSlot>> schedule(static_cast<size_t>(programs));
  const int items = items_per_head(p), n_tiles = p.key_tiles();
  for (int bh = 0; bh < p.heads; ++bh)
    for (int i = 0; i < items; ++i) {
      const KeyTileSlot first = key_tile_slot(p, programs, bh, i);
      schedule[static_cast<size_t>(first.program)].push_back(first);
      if (p.mask == BwdMask::causal && i < n_tiles / 2)
        schedule[static_cast<size_t>(first.program)].push_back(key_tile_slot(p, programs, bh, n_tiles - 1 - i));
    }
  return schedule;
}

// How many query tiles a key tile visits.
inline int visit_count(const BwdProblem& p, const KeyTileSlot& s) { return p.query_tiles() - p.first_query_tile(s.n); }

// The query tile a key tile visits at step t (0 <= t < visit_count): the kernel's loop body.
inline int visit_query_tile(const BwdProblem& p, QOrder order, const KeyTileSlot& s, int t) {
  const int m_tiles = p.query_tiles(), lo = p.first_query_tile(s.n), a = s.item - s.group_first;
  if (order == QOrder::ascending) return lo + t;
  if (order == QOrder::descending || s.stage == 1) return m_tiles - 1 - t;
  if (p.mask == BwdMask::full) return (a + t) % m_tiles;
  const int rho = p.first_query_tile(s.group_first + s.group_size - 1), rows = m_tiles - rho;
  return t < rows ? rho + (a + t) % rows : lo + (t - rows);
}

inline std::vector<int> visit_order(const BwdProblem& p, QOrder order, const KeyTileSlot& s) {
  std::vector<int> order_m;
  for (int t = 0; t < visit_count(p, s); ++t) order_m.push_back(visit_query_tile(p, order, s, t));
  return order_m;
}

// The reference definition of the ordered reduction: the key tiles adding into dQ[bh][m], sorted by
// (wave, stage, step of m in the tile's visit order, n). Enumerates; the kernels use wait_target().
inline std::vector<int> accumulation_order(const BwdProblem& p, QOrder order, int programs, int bh, int m) {
  std::vector<std::tuple<int, int, int, int>> keys;
  for (int n = 0; n <= p.last_key_tile(m); ++n) {
    const KeyTileSlot s = key_tile_slot(p, programs, bh, n);
    const std::vector<int> visits = visit_order(p, order, s);
    const int step = static_cast<int>(std::find(visits.begin(), visits.end(), m) - visits.begin());
    keys.emplace_back(s.wave, s.stage, step, n);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<int> tiles;
  for (const auto& key : keys) tiles.push_back(std::get<3>(key));
  return tiles;
}

// Size of [a0, a1) intersected with [b0, b1).
inline int overlap(int a0, int a1, int b0, int b1) { return std::max(0, std::min(a1, b1) - std::max(a0, b0)); }

// In a rotation of A tiles over R rows (tile a' is on row (a' + t) mod R at step t), how many tiles
// reach row r before tile a does; tiles reaching it at the same step (only when A > R) go in order
// of a'. For A <= R this equals DASH's ShiftDependency, (min(r, A-1) - a) mod A.
inline int shift_rank(int tiles, int rows, int r, int a) {
  const int step = ((r - a) % rows + rows) % rows;  // when tile a reaches row r
  const int cycles = tiles / rows, rest = tiles % rows;  // row residue c holds cycles + (c < rest) tiles
  // Steps 0 .. step-1 bring the tiles of residues r, r-1, ..., r-step+1 (mod R); count those below rest.
  const int low = r - step + 1;
  const int early_rest = low >= 0 ? std::max(0, std::min(r + 1, rest) - low)
                                  : std::min(r + 1, rest) + std::max(0, rest - (low + rows));
  return cycles * step + early_rest + a / rows;
}

// ordered: the value of sem[bh][m] that key tile s.n waits for before adding its part into dQ[bh][m]
// (its position in accumulation_order). Integer arithmetic only; this is what the kernel evaluates.
inline int wait_target(const BwdProblem& p, QOrder order, const KeyTileSlot& s, int m) {
  const int g = s.group_first, group_end = s.group_first + s.group_size;
  const int contributors_end = p.last_key_tile(m) + 1;  // parts come from key tiles [0, contributors_end)
  const bool causal = p.mask == BwdMask::causal;
  auto parts_from = [&](int stage, int i0, int i1) {
    const TileRange r = stage_tiles(p, stage, i0, i1);
    return overlap(r.begin, r.end, 0, contributors_end);
  };
  // 1. Everything the head's items in earlier waves add; 2. stage 1 waits for this wave's stage 0.
  int target = parts_from(0, 0, g) + (causal ? parts_from(1, 0, g) : 0);
  if (s.stage == 1) target += parts_from(0, g, group_end);
  // 3. This wave's same-stage tiles with a smaller (step, n): they are the key tiles [u, w).
  const TileRange group = stage_tiles(p, s.stage, g, group_end);
  const int u = std::max(group.begin, 0), w = std::min(group.end, contributors_end);
  const int rho = p.first_query_tile(group_end - 1);  // causal shift: the group's rectangle [rho, M)
  if (order == QOrder::descending || (order == QOrder::shift && s.stage == 1)) {
    return target + (s.n - u);  // every tile of the stage is at the same step: n decides
  }
  if (order == QOrder::shift && !causal) return target + shift_rank(s.group_size, p.query_tiles(), m, s.item - g);
  if (order == QOrder::shift && m >= rho)
    return target + shift_rank(s.group_size, p.query_tiles() - rho, m - rho, s.item - g);
  // Ascending, and the causal shift's triangle: the step of m is m - lo + const, so tiles with a
  // later first query tile come first, and tiles with the same first query tile go by n.
  const int lo = p.first_query_tile(s.n);
  const int later_lo_from = p.last_key_tile(lo) + 1;               // first tile with a larger lo
  const int same_lo_from = lo > 0 ? p.last_key_tile(lo - 1) + 1 : 0;  // first tile with this lo
  return target + std::max(0, w - std::max(u, later_lo_from)) + (s.n - std::max(u, same_lo_from));
}

// split: the workspace slot of part (n, m) of head bh (element offset slot * BM * head_dim).
inline long long split_workspace_slot(const BwdProblem& p, int bh, int m, int n) {
  return (static_cast<long long>(bh) * p.query_tiles() + m) * p.key_tiles() + n;
}
inline long long split_workspace_slots(const BwdProblem& p) {
  return static_cast<long long>(p.heads) * p.query_tiles() * p.key_tiles();
}

}  // namespace tilejit::kernels
