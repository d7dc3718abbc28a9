// Deterministic attention backward schedules (kernels/attention/backward_schedule.hpp) and their simulator
// (kernels/attention/backward_schedule_sim.hpp): every needed block visited once, wait targets equal to the
// reference accumulation order, no deadlock, the same add order whatever the block costs, DASH's
// rules reproduced, and the makespans that motivate descending and shift orders.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention/backward_schedule.hpp"
#include "kernels/attention/backward_schedule_sim.hpp"

namespace {

using namespace tilejit::kernels;

constexpr std::array kReductions{Reduction::atomic, Reduction::ordered, Reduction::split};
constexpr std::array kOrders{QOrder::ascending, QOrder::descending, QOrder::shift};
constexpr std::array kMasks{BwdMask::full, BwdMask::causal};

const char* name(QOrder order) {
  return order == QOrder::ascending ? "ascending" : order == QOrder::descending ? "descending" : "shift";
}
const char* name(Reduction r) { return r == Reduction::atomic ? "atomic" : r == Reduction::ordered ? "ordered" : "split"; }
const char* name(BwdMask mask) { return mask == BwdMask::full ? "full" : "causal"; }

std::string describe(const BwdProblem& p, QOrder order, int programs) {
  return fmt::format("{} {} heads {} S_q {} S_k {} BM {} BN {} (M {} N {}) P {}", name(p.mask), name(order), p.heads,
                     p.seq_q, p.seq_k, p.block_m, p.block_n, p.query_tiles(), p.key_tiles(), programs);
}

// M query tiles and N key tiles of the given block sizes; the sequences end `ragged` rows short of
// the last tile's end (0 <= ragged < block size), which moves the causal diagonal.
BwdProblem make_problem(int heads, int m_tiles, int n_tiles, int block_m, int block_n, BwdMask mask, int ragged_q, int ragged_k) {
  return {heads, m_tiles * block_m - ragged_q, n_tiles * block_n - ragged_k, block_m, block_n, mask};
}

std::vector<int> iota_to(int count) {
  std::vector<int> v(static_cast<size_t>(std::max(count, 0)));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Block costs drawn once per block from a seeded generator, so that a simulation is repeatable.
SimCosts random_costs(const BwdProblem& p, unsigned seed, double reduce_cost) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> cost(0.25, 1.75);
  auto table = std::make_shared<std::vector<double>>();
  for (int i = 0; i < p.heads * p.key_tiles() * p.query_tiles(); ++i) table->push_back(cost(rng));
  const int n_tiles = p.key_tiles(), m_tiles = p.query_tiles();
  return {[table, n_tiles, m_tiles](int bh, int n, int m) {
            return (*table)[static_cast<size_t>((bh * n_tiles + n) * m_tiles + m)];
          },
          reduce_cost};
}

// Every needed block (bh, n, m) is visited exactly once, and no other.
bool covers_each_needed_block_once(const BwdProblem& p, QOrder order, int programs) {
  std::vector<int> visits(static_cast<size_t>(p.heads * p.key_tiles() * p.query_tiles()), 0);
  for (const auto& tiles : program_schedule(p, programs))
    for (const KeyTileSlot& s : tiles)
      for (int m : visit_order(p, order, s)) {
        if (m < 0 || m >= p.query_tiles()) return false;
        ++visits[static_cast<size_t>((s.bh * p.key_tiles() + s.n) * p.query_tiles() + m)];
      }
  for (int bh = 0; bh < p.heads; ++bh)
    for (int n = 0; n < p.key_tiles(); ++n)
      for (int m = 0; m < p.query_tiles(); ++m)
        if (visits[static_cast<size_t>((bh * p.key_tiles() + n) * p.query_tiles() + m)] != (p.needs(n, m) ? 1 : 0)) return false;
  return true;
}

// The accumulation order of every dQ tile, [bh][m].
std::vector<std::vector<std::vector<int>>> all_accumulation_orders(const BwdProblem& p, QOrder order, int programs) {
  std::vector<std::vector<std::vector<int>>> orders(static_cast<size_t>(p.heads));
  for (int bh = 0; bh < p.heads; ++bh)
    for (int m = 0; m < p.query_tiles(); ++m) orders[static_cast<size_t>(bh)].push_back(accumulation_order(p, order, programs, bh, m));
  return orders;
}

// wait_target (the kernel's arithmetic) is each tile's position in accumulation_order (the sorted
// reference), and each order holds exactly the key tiles that add into the dQ tile.
bool wait_targets_match(const BwdProblem& p, QOrder order, int programs, const std::vector<std::vector<std::vector<int>>>& orders) {
  for (int bh = 0; bh < p.heads; ++bh)
    for (int m = 0; m < p.query_tiles(); ++m) {
      const std::vector<int>& tiles = orders[static_cast<size_t>(bh)][static_cast<size_t>(m)];
      std::vector<int> sorted = tiles;
      std::sort(sorted.begin(), sorted.end());
      if (sorted != iota_to(p.last_key_tile(m) + 1)) return false;
      for (size_t k = 0; k < tiles.size(); ++k)
        if (wait_target(p, order, key_tile_slot(p, programs, bh, tiles[k]), m) != static_cast<int>(k)) return false;
    }
  return true;
}

bool is_permutation_of_contributors(const BwdProblem& p, const SimResult& r) {
  for (int bh = 0; bh < p.heads; ++bh)
    for (int m = 0; m < p.query_tiles(); ++m) {
      std::vector<int> sorted = r.added[static_cast<size_t>(bh)][static_cast<size_t>(m)];
      std::sort(sorted.begin(), sorted.end());
      if (sorted != iota_to(p.last_key_tile(m) + 1)) return false;
    }
  return true;
}

long long needed_blocks(const BwdProblem& p) {
  long long blocks = 0;
  for (int m = 0; m < p.query_tiles(); ++m) blocks += p.last_key_tile(m) + 1;
  return blocks * p.heads;
}

// Everything the schedule promises, for one problem, order and program count.
void check_schedule(const BwdProblem& p, QOrder order, int programs) {
  const std::string what = describe(p, order, programs);
  REQUIRE_MESSAGE(covers_each_needed_block_once(p, order, programs), what);
  const auto orders = all_accumulation_orders(p, order, programs);
  REQUIRE_MESSAGE(wait_targets_match(p, order, programs, orders), what);
  for (Reduction reduction : kReductions) {
    const SimResult r = simulate(p, reduction, order, programs, {{}, 0.5});
    const std::string run = what + " " + name(reduction);
    REQUIRE_MESSAGE(!r.deadlocked, run);
    REQUIRE_MESSAGE(r.blocks_run == needed_blocks(p), run);
    REQUIRE_MESSAGE(is_permutation_of_contributors(p, r), run);
    if (reduction == Reduction::ordered) REQUIRE_MESSAGE(r.added == orders, run);
    if (reduction != Reduction::ordered) REQUIRE_MESSAGE(r.total_wait == 0.0, run);
    if (reduction == Reduction::split)
      for (int m = 0; m < p.query_tiles(); ++m) REQUIRE_MESSAGE(r.added[0][static_cast<size_t>(m)] == iota_to(p.last_key_tile(m) + 1), run);
  }
  // Whatever the timing, ordered adds land in the same order: the sum is bit-identical.
  for (unsigned seed : {1u, 2u}) {
    const SimResult r = simulate(p, Reduction::ordered, order, programs, random_costs(p, seed, 0.3));
    const std::string run = what + fmt::format(" random costs seed {}", seed);
    REQUIRE_MESSAGE(!r.deadlocked, run);
    REQUIRE_MESSAGE(r.added == orders, run);
  }
}

// FlashAttention-3's deterministic mode, the baseline DASH improves on: one key tile per item (no
// causal pairs), parts add in ascending n, the visit order ascending or descending.
std::vector<std::vector<SimBlock>> fa3_blocks(const BwdProblem& p, QOrder order, int programs) {
  std::vector<std::vector<SimBlock>> blocks(static_cast<size_t>(programs));
  for (int bh = 0; bh < p.heads; ++bh)
    for (int n = 0; n < p.key_tiles(); ++n) {
      auto& sequence = blocks[static_cast<size_t>((bh * p.key_tiles() + n) % programs)];
      const int lo = p.first_query_tile(n), m_tiles = p.query_tiles();
      for (int t = 0; t < m_tiles - lo; ++t)
        sequence.push_back({bh, n, order == QOrder::descending ? m_tiles - 1 - t : lo + t, n});
    }
  return blocks;
}

}  // namespace

TEST_CASE("causal geometry: first_query_tile and last_key_tile follow the row rule") {
  for (int block_m : {16, 32})
    for (int block_n : {16, 32, 64})
      for (int seq_q : {1, 17, 48, 100})
        for (int seq_k : {1, 16, 33, 100}) {
          const BwdProblem p{1, seq_q, seq_k, block_m, block_n, BwdMask::causal};
          for (int n = 0; n < p.key_tiles(); ++n)
            for (int m = 0; m < p.query_tiles(); ++m) {
              bool some_row_sees_the_tile = false;  // row i sees keys j <= i + S_k - S_q
              for (int i = m * block_m; i < std::min(m * block_m + block_m, seq_q); ++i)
                some_row_sees_the_tile = some_row_sees_the_tile || i + seq_k - seq_q >= n * block_n;
              REQUIRE(p.needs(n, m) == some_row_sees_the_tile);
              REQUIRE((m >= p.first_query_tile(n)) == some_row_sees_the_tile);
            }
          for (int n = 0; n < p.key_tiles(); ++n) REQUIRE(p.needs(n, p.query_tiles() - 1));  // every key tile has work
        }
}

TEST_CASE("every reduction x order x mask: coverage, wait targets, no deadlock, timing-independent order") {
  int configurations = 0;
  for (BwdMask mask : kMasks)
    for (QOrder order : kOrders)
      for (int m_tiles = 1; m_tiles <= 9; ++m_tiles)
        for (int n_tiles = 1; n_tiles <= 9; ++n_tiles)
          for (int heads = 1; heads <= 3; ++heads) {
            for (int programs = 1; programs <= 12; ++programs, ++configurations)
              check_schedule(make_problem(heads, m_tiles, n_tiles, 16, 16, mask, 0, 0), order, programs);
            // Unequal block sizes and ragged ends move the causal diagonal off the tile corners.
            for (int programs = 1; programs <= 12; ++programs) {
              check_schedule(make_problem(heads, m_tiles, n_tiles, 16, 32, mask, 5, 3), order, programs);
              check_schedule(make_problem(heads, m_tiles, n_tiles, 32, 16, mask, 0, 7), order, programs);
              configurations += 2;
            }
          }
  MESSAGE(fmt::format("{} schedules checked under atomic, ordered and split", configurations));
}

TEST_CASE("full-mask shift is DASH's ShiftScheduler and ShiftDependency") {
  // DASH: with A tiles of a head in flight after `finished` earlier ones, tile a visits (a + t) mod M
  // and waits for finished + (min(m, A - 1) - a) mod A parts (valid for A <= M).
  int compared = 0;
  for (int m_tiles = 1; m_tiles <= 9; ++m_tiles)
    for (int n_tiles = 1; n_tiles <= 9; ++n_tiles)
      for (int programs = 1; programs <= 12; ++programs)
        for (int heads = 1; heads <= 3; ++heads) {
          const BwdProblem p = make_problem(heads, m_tiles, n_tiles, 16, 16, BwdMask::full, 0, 0);
          for (const auto& tiles : program_schedule(p, programs))
            for (const KeyTileSlot& s : tiles) {
              const int finished = s.group_first, running = s.group_size, a = s.n - finished;
              if (running > m_tiles) continue;
              for (int t = 0; t < m_tiles; ++t) {
                const int m = (a + t) % m_tiles;
                REQUIRE(visit_query_tile(p, QOrder::shift, s, t) == m);
                REQUIRE(wait_target(p, QOrder::shift, s, m) == finished + (std::min(m, running - 1) - a + running) % running);
                ++compared;
              }
            }
        }
  MESSAGE(fmt::format("{} blocks agree with DASH", compared));
  CHECK(compared > 0);
}

TEST_CASE("causal shift is DASH's ShiftCausalScheduler and ShiftCausalDependency (S_q = S_k, BN = stride * BM, N even)") {
  int compared = 0;
  for (int stride : {1, 2})
    for (int n_tiles = 2; n_tiles <= 10; n_tiles += 2)
      for (int programs = 1; programs <= 12; ++programs)
        for (int heads = 1; heads <= 3; ++heads) {
          const int block_m = 16, block_n = 16 * stride, m_tiles = n_tiles * stride;
          const BwdProblem p{heads, n_tiles * block_n, n_tiles * block_n, block_m, block_n, BwdMask::causal};
          REQUIRE(p.query_tiles() == m_tiles);
          for (const auto& tiles : program_schedule(p, programs))
            for (const KeyTileSlot& s : tiles) {
              // DASH's terms: pair j = the item, sm = its index among the `running` pairs of its head in
              // flight, `finished` pairs of the head before them; the rectangle starts where the
              // group's last pair's first tile starts.
              const int j = s.item, finished = s.group_first, running = s.group_size, sm = j - finished;
              const int rectangle_start = (finished + running - 1) * stride, rectangle = m_tiles - rectangle_start;
              if (running > rectangle) continue;  // DASH assumes no more tiles in flight than rows
              for (int t = 0; t < visit_count(p, s); ++t) {
                int m = 0, dash_target = 0;
                if (s.stage == 0) {
                  m = t < rectangle ? (sm + t) % rectangle + rectangle_start : j * stride + (t - rectangle);
                } else {
                  m = m_tiles - t - 1;
                }
                const int executed = finished + std::max(0, finished - (m_tiles - m - 1) / stride);
                if (s.stage == 0 && t < rectangle) {
                  dash_target = executed + (std::min((sm + t) % rectangle, running - 1) - sm + running) % running;
                } else if (s.stage == 0) {
                  dash_target = (t - rectangle) / stride + executed;
                } else {
                  dash_target = running - 1 - sm + executed + running;
                }
                REQUIRE(visit_query_tile(p, QOrder::shift, s, t) == m);
                REQUIRE(wait_target(p, QOrder::shift, s, m) == dash_target);
                ++compared;
              }
            }
        }
  MESSAGE(fmt::format("{} blocks agree with DASH", compared));
  CHECK(compared > 0);
}

TEST_CASE("shift never waits: full mask with at most M tiles of a head in flight; causal with S_q = S_k, BM = BN, N even") {
  int zero_wait_runs = 0;
  for (int m_tiles = 1; m_tiles <= 9; ++m_tiles)
    for (int n_tiles = 1; n_tiles <= 9; ++n_tiles)
      for (int programs = 1; programs <= 12; ++programs)
        for (int heads = 1; heads <= 3; ++heads)
          for (BwdMask mask : kMasks) {
            const bool full_claim = mask == BwdMask::full && std::min(programs, n_tiles) <= m_tiles;
            const bool causal_claim = mask == BwdMask::causal && m_tiles == n_tiles && n_tiles % 2 == 0;
            if (!full_claim && !causal_claim) continue;
            const BwdProblem p = make_problem(heads, m_tiles, n_tiles, 16, 16, mask, 0, 0);
            for (double reduce_cost : {0.0, 0.5, 2.0}) {
              const SimResult r = simulate(p, Reduction::ordered, QOrder::shift, programs, {{}, reduce_cost});
              REQUIRE_MESSAGE(r.total_wait == 0.0, describe(p, QOrder::shift, programs));
              REQUIRE(r.makespan == simulate(p, Reduction::atomic, QOrder::shift, programs, {{}, reduce_cost}).makespan);
              ++zero_wait_runs;
            }
          }
  MESSAGE(fmt::format("{} shift runs without a single wait", zero_wait_runs));
  // Outside those conditions shift may wait: an odd N leaves the middle tile as a shorter item.
  const BwdProblem odd = make_problem(2, 9, 9, 16, 16, BwdMask::causal, 0, 0);
  CHECK(simulate(odd, Reduction::ordered, QOrder::shift, 5, {{}, 0.5}).total_wait > 0.0);
}

TEST_CASE("causal M = N = 16, P = 16: makespans of the orders, and FlashAttention-3's order for reference") {
  for (int heads = 1; heads <= 3; ++heads)
    for (double reduce_cost : {0.0, 0.5}) {
      const BwdProblem p = make_problem(heads, 16, 16, 128, 128, BwdMask::causal, 0, 0);
      const int programs = 16;
      const SimCosts costs{{}, reduce_cost};
      const SimResult ascending = simulate(p, Reduction::ordered, QOrder::ascending, programs, costs);
      const SimResult descending = simulate(p, Reduction::ordered, QOrder::descending, programs, costs);
      const SimResult shift = simulate(p, Reduction::ordered, QOrder::shift, programs, costs);
      const SimResult atomic = simulate(p, Reduction::atomic, QOrder::shift, programs, costs);
      const SimResult fa3_ascending = simulate_blocks(heads, 16, 16, Reduction::ordered, fa3_blocks(p, QOrder::ascending, programs), costs);
      const SimResult fa3_descending = simulate_blocks(heads, 16, 16, Reduction::ordered, fa3_blocks(p, QOrder::descending, programs), costs);
      MESSAGE(fmt::format("heads {} add cost {}: ascending {} (wait {}), descending {} (wait {}), shift {} (wait {}), atomic {}; "
                          "FA3 order (unpaired, ascending n): ascending {} (wait {}), descending {} (wait {})",
                          heads, reduce_cost, ascending.makespan, ascending.total_wait, descending.makespan, descending.total_wait,
                          shift.makespan, shift.total_wait, atomic.makespan, fa3_ascending.makespan, fa3_ascending.total_wait,
                          fa3_descending.makespan, fa3_descending.total_wait));
      REQUIRE(!fa3_ascending.deadlocked);
      REQUIRE(!fa3_descending.deadlocked);
      // Shift never waits: it is as fast as atomics.
      CHECK(shift.total_wait == 0.0);
      CHECK(shift.makespan == atomic.makespan);
      // Under FA3's order (ascending n) descending iteration waits less; with a serial add it is faster.
      CHECK(fa3_descending.total_wait < fa3_ascending.total_wait);
      if (reduce_cost > 0) CHECK(fa3_descending.makespan < fa3_ascending.makespan);
      // Here the add order follows the visit order, so ascending is no worse than descending; both
      // wait only when adds take time, and then shift beats them.
      CHECK(ascending.makespan == descending.makespan);
      if (reduce_cost > 0) {
        CHECK(shift.makespan < ascending.makespan);
      } else {
        CHECK(ascending.total_wait == 0.0);
        CHECK(descending.total_wait == 0.0);
      }
    }
}

TEST_CASE("atomic add order depends on timing; ordered does not") {
  const BwdProblem p = make_problem(2, 8, 8, 64, 64, BwdMask::full, 0, 0);
  const auto reference = simulate(p, Reduction::ordered, QOrder::ascending, 8, random_costs(p, 100, 0.2)).added;
  bool atomic_order_changed = false;
  const auto first_atomic = simulate(p, Reduction::atomic, QOrder::ascending, 8, random_costs(p, 100, 0.2)).added;
  for (unsigned seed = 101; seed < 106; ++seed) {
    CHECK(simulate(p, Reduction::ordered, QOrder::ascending, 8, random_costs(p, seed, 0.2)).added == reference);
    atomic_order_changed = atomic_order_changed || simulate(p, Reduction::atomic, QOrder::ascending, 8, random_costs(p, seed, 0.2)).added != first_atomic;
  }
  CHECK(atomic_order_changed);
}

TEST_CASE("the simulator reports deadlocks instead of hanging") {
  // Two programs each wait for a part the other adds only after its own wait.
  const std::vector<std::vector<SimBlock>> crossed{{{0, 0, 0, 1}, {0, 0, 1, 0}}, {{0, 1, 1, 1}, {0, 1, 0, 0}}};
  const SimResult r = simulate_blocks(1, 2, 2, Reduction::ordered, crossed);
  CHECK(r.deadlocked);
  CHECK(r.blocks_run == 0);
  // Why the accumulation key starts with the wave: causal pairs adding in plain ascending n deadlock
  // on one program (tile N-1 of the first pair waits for tile N-2, which runs later on that program).
  const BwdProblem p = make_problem(1, 4, 4, 16, 16, BwdMask::causal, 0, 0);
  std::vector<std::vector<SimBlock>> ascending_n = schedule_blocks(p, QOrder::descending, 1);
  for (auto& sequence : ascending_n)
    for (SimBlock& b : sequence) b.target = b.n;  // causal contributors of dQ[m] are 0..last_key_tile(m)
  CHECK(simulate_blocks(1, 4, 4, Reduction::ordered, ascending_n).deadlocked);
  CHECK(!simulate(p, Reduction::ordered, QOrder::descending, 1).deadlocked);
}

TEST_CASE("split: every needed part has its own workspace slot") {
  for (BwdMask mask : kMasks) {
    const BwdProblem p = make_problem(3, 5, 7, 16, 32, mask, 3, 1);
    std::vector<int> used(static_cast<size_t>(split_workspace_slots(p)), 0);
    for (int bh = 0; bh < p.heads; ++bh)
      for (int m = 0; m < p.query_tiles(); ++m)
        for (int n = 0; n <= p.last_key_tile(m); ++n) {
          const long long slot = split_workspace_slot(p, bh, m, n);
          REQUIRE(slot >= 0);
          REQUIRE(slot < split_workspace_slots(p));
          ++used[static_cast<size_t>(slot)];
        }
    CHECK(std::all_of(used.begin(), used.end(), [](int u) { return u <= 1; }));
  }
}

TEST_CASE("invalid problems are rejected with the offending value") {
  CHECK_THROWS_WITH_AS(program_schedule(BwdProblem{1, 0, 16, 16, 16, BwdMask::full}, 4),
                       "backward schedule: seq_q = 0, want >= 1", std::invalid_argument);
  CHECK_THROWS_AS(key_tile_slot(BwdProblem{1, 16, 16, 16, 16, BwdMask::full}, 0, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(key_tile_slot(BwdProblem{1, 16, 16, 16, 16, BwdMask::full}, 4, 1, 0), std::invalid_argument);
}
