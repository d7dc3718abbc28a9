// A discrete-event simulator of the attention backward's dK/dV programs under a schedule of
// kernels/attention/backward_schedule.hpp: makespan, time spent waiting on dQ semaphores, deadlock detection,
// and the order in which parts actually reached each dQ tile. Host-only; tests and design notes use it.
//
// Time model: a program runs its blocks one after another. Block (n, m) computes for
// block_cost(bh, n, m), then adds its part for reduce_cost. ordered: the add may only start once
// sem[bh][m] equals the block's wait target and the previous add into dQ[bh][m] has finished, and the
// program waits for that (a kernel could overlap the wait with the next block's compute: not
// modelled). atomic: adds never wait and may overlap; the recorded order is by finishing time
// (ties by program: the hardware's order is arbitrary). split: no waits; the recorded order is the
// second kernel's (ascending n), whose own time is not in the makespan.
#pragma once
#include <algorithm>
#include <functional>
#include <tuple>
#include <vector>

#include "kernels/attention/backward_schedule.hpp"

namespace tilejit::kernels {

struct SimCosts {
  std::function<double(int bh, int n, int m)> block_cost;  // empty: every block costs 1
  double reduce_cost = 0;                                 // time one add into a dQ tile takes
};

struct SimResult {
  bool deadlocked = false;
  double makespan = 0;
  double total_wait = 0;  // sum over blocks of (add start - compute end)
  long long blocks_run = 0;
  std::vector<std::vector<std::vector<int>>> added;  // [bh][m]: key tiles in the order their parts landed
};

// One block of a program's sequence; target is the semaphore value it waits for (ordered only).
struct SimBlock {
  int bh = 0, n = 0, m = 0, target = 0;
};

// Runs explicit per-program block sequences (exposed so that tests can feed a bad schedule).
inline SimResult simulate_blocks(int heads, int query_tiles, int key_tiles, Reduction reduction,
                                 const std::vector<std::vector<SimBlock>>& programs, const SimCosts& costs = {}) {
  const size_t n_programs = programs.size();
  const auto tile_index = [&](const SimBlock& b) { return static_cast<size_t>(b.bh) * static_cast<size_t>(query_tiles) + static_cast<size_t>(b.m); };
  const size_t dq_tiles = static_cast<size_t>(heads) * static_cast<size_t>(query_tiles);
  std::vector<int> sem(dq_tiles, 0);
  std::vector<double> dq_free_at(dq_tiles, 0.0);
  // waiter[tile][value]: the program whose next block waits for sem[tile] == value (-1: none).
  std::vector<std::vector<int>> waiter(dq_tiles, std::vector<int>(static_cast<size_t>(key_tiles), -1));
  std::vector<size_t> next(n_programs, 0);
  std::vector<double> clock(n_programs, 0.0);
  std::vector<std::tuple<double, size_t, int, size_t>> atomic_adds;  // (finish, program, n, tile)
  std::vector<size_t> ready;
  for (size_t p = 0; p < n_programs; ++p) ready.push_back(p);

  SimResult result;
  result.added.assign(static_cast<size_t>(heads), std::vector<std::vector<int>>(static_cast<size_t>(query_tiles)));
  // Whatever order programs are advanced in, each add's time depends only on its program's previous
  // block and on the previous add into its dQ tile, both fixed before it runs: the result is exact.
  while (!ready.empty()) {
    const size_t p = ready.back();
    ready.pop_back();
    while (next[p] < programs[p].size()) {
      const SimBlock& b = programs[p][next[p]];
      const size_t tile = tile_index(b);
      if (reduction == Reduction::ordered && sem[tile] != b.target) {
        if (b.target > sem[tile] && b.target < key_tiles) waiter[tile][static_cast<size_t>(b.target)] = static_cast<int>(p);
        break;  // a target already passed or out of range never comes: detected as a deadlock below
      }
      const double computed = clock[p] + (costs.block_cost ? costs.block_cost(b.bh, b.n, b.m) : 1.0);
      const double add_start = reduction == Reduction::ordered ? std::max(computed, dq_free_at[tile]) : computed;
      result.total_wait += add_start - computed;
      clock[p] = add_start + costs.reduce_cost;
      ++next[p];
      ++result.blocks_run;
      if (reduction == Reduction::atomic) atomic_adds.emplace_back(clock[p], p, b.n, tile);
      if (reduction == Reduction::split) result.added[static_cast<size_t>(b.bh)][static_cast<size_t>(b.m)].push_back(b.n);
      if (reduction == Reduction::ordered) {
        result.added[static_cast<size_t>(b.bh)][static_cast<size_t>(b.m)].push_back(b.n);
        dq_free_at[tile] = clock[p];
        ++sem[tile];
        if (sem[tile] < key_tiles) {
          int& woken = waiter[tile][static_cast<size_t>(sem[tile])];
          if (woken >= 0) ready.push_back(static_cast<size_t>(woken));
          woken = -1;
        }
      }
    }
  }
  for (size_t p = 0; p < n_programs; ++p) {
    result.deadlocked = result.deadlocked || next[p] < programs[p].size();
    result.makespan = std::max(result.makespan, clock[p]);
  }
  std::sort(atomic_adds.begin(), atomic_adds.end());
  for (const auto& [finish, program, n, tile] : atomic_adds)
    result.added[tile / static_cast<size_t>(query_tiles)][tile % static_cast<size_t>(query_tiles)].push_back(n);
  if (reduction == Reduction::split)
    for (auto& head : result.added)
      for (auto& tiles : head) std::sort(tiles.begin(), tiles.end());
  return result;
}

// The blocks each program runs under a schedule, in order, with their wait targets.
inline std::vector<std::vector<SimBlock>> schedule_blocks(const BwdProblem& p, QOrder order, int programs) {
  std::vector<std::vector<SimBlock>> blocks;
  for (const auto& tiles : program_schedule(p, programs)) {
    blocks.emplace_back();
    for (const KeyTileSlot& s : tiles)
      for (int t = 0; t < visit_count(p, s); ++t) {
        const int m = visit_query_tile(p, order, s, t);
        blocks.back().push_back({s.bh, s.n, m, wait_target(p, order, s, m)});
      }
  }
  return blocks;
}

inline SimResult simulate(const BwdProblem& p, Reduction reduction, QOrder order, int programs, const SimCosts& costs = {}) {
  return simulate_blocks(p.heads, p.query_tiles(), p.key_tiles(), reduction, schedule_blocks(p, order, programs), costs);
}

}  // namespace tilejit::kernels
