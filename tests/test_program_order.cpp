// Heavy-first program order in L2-sized head sections (kernels/attention/program_order.hpp), run in the
// interpreter: every (tile, head, batch) taken by exactly one program, heads grouped in sections of
// the size the L2 budget gives, and inside a section the heaviest tiles first, heads fastest.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dsl/lang.hpp"
#include "kernels/attention/program_order.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;
namespace km = tilejit::kernels;

namespace {

// out[p] = (tile, head, batch) of the program at launch index p (x fastest).
const Kernel& order_probe() {
  static const Kernel k = kernel("program_order_probe", [](Builder& kb) {
    const bool heavy_at_end = kb.meta<bool>("HEAVY_AT_END", true);
    const int64_t bytes_per_row = kb.meta<int>("BYTES_PER_ROW", 512);
    auto out = kb.pointer("out", i32);
    auto seq_len = kb.scalar<int>("seq_len");
    const km::GridSlot s = km::heavy_first_sections(heavy_at_end, seq_len, bytes_per_row);
    const Tile p = program_id(0) + num_programs(0) * (program_id(1) + num_programs(1) * program_id(2));
    store(out + p * 3, s.tile);
    store(out + (p * 3 + 1), s.head);
    store(out + (p * 3 + 2), s.batch);
  });
  return k;
}

struct Grid {
  int64_t tiles, heads, batches;
};

}  // namespace

TEST_CASE("heavy_first_sections: a permutation of the grid, in sections of heads, heaviest tiles first") {
  int cases = 0;
  for (Grid g : {Grid{8, 4, 2}, Grid{5, 3, 3}, Grid{1, 7, 1}, Grid{16, 1, 1}, Grid{3, 2, 5}})
    for (int64_t seq_len : {int64_t{1} << 20, int64_t{1} << 17, int64_t{40000}, int64_t{1} << 14, int64_t{4096}, int64_t{4095}, int64_t{0}})
      for (bool heavy_at_end : {true, false}) {
        const int64_t bytes_per_row = 512;  // (K and V rows of D 128, bf16)
        const int64_t units = g.heads * g.batches, n = g.tiles * units;
        // the section size the budget gives: 32 MB / 512 B = 65536 rows of budget
        // (below kSectionsMinSeqLen: launch order, i.e. one head after another, G = 1)
        const bool sectioned = seq_len >= km::kSectionsMinSeqLen;
        const int64_t G = sectioned ? std::clamp<int64_t>(km::kSectionL2Bytes / bytes_per_row / std::max<int64_t>(seq_len, 1), 1, units) : 1;
        INFO(fmt::format("grid {}x{}x{} seq_len {} heavy_at_end {} (section {} heads)", g.tiles, g.heads, g.batches, seq_len, heavy_at_end, G));
        rt::HostTensor out(ir::DType::i32, {n, 3});
        out.fill(-1);
        rt::interpret(order_probe().build({{"HEAVY_AT_END", heavy_at_end}, {"BYTES_PER_ROW", int64_t{512}}}), {g.tiles, g.heads, g.batches},
                      {out, static_cast<int32_t>(seq_len)});
        std::vector<int> taken(static_cast<size_t>(n), 0);
        size_t out_of_range = 0, wrong_section = 0, not_heavy_first = 0;
        for (int64_t p = 0; p < n; ++p) {
          const int64_t tile = static_cast<int64_t>(out.get_flat(p * 3)), head = static_cast<int64_t>(out.get_flat(p * 3 + 1)),
                        batch = static_cast<int64_t>(out.get_flat(p * 3 + 2));
          if (tile < 0 || tile >= g.tiles || head < 0 || head >= g.heads || batch < 0 || batch >= g.batches) {
            ++out_of_range;
            continue;
          }
          const int64_t unit = batch * g.heads + head;
          ++taken[static_cast<size_t>(unit * g.tiles + tile)];
          // section s holds units [s G, s G + G) and launch indices [s G T, (s G + in) T)
          const int64_t section = p / (G * g.tiles), first = section * G, in = std::min(G, units - first);
          wrong_section += unit < first || unit >= first + in;
          // within the section: rank r = (p - first T) / in, the r-th heaviest tile, heads fastest
          const int64_t rank = (p - first * g.tiles) / in;
          not_heavy_first += tile != (heavy_at_end ? g.tiles - 1 - rank : rank) || unit != first + (p - first * g.tiles) % in;
        }
        CHECK(out_of_range == 0);
        CHECK(std::all_of(taken.begin(), taken.end(), [](int t) { return t == 1; }));
        CHECK(wrong_section == 0);
        CHECK(not_heavy_first == 0);
        ++cases;
      }
  CHECK(cases == 70);
}

TEST_CASE("heavy_first_sections: sections follow the L2 budget; short sequences keep the launch order") {
  // 4 tiles x 6 heads: at seq_len 2^20 (512 MB of rows a head) each head is its own section: the
  // launch order's first 4 programs are head 0's tiles, heaviest first; at 8k (4 MB) all six heads
  // share one section: the first 4 programs are heads 0-3's heaviest tile; at 2k (below
  // kSectionsMinSeqLen) the launch order: head 0's tiles, heaviest first.
  for (auto [seq_len, first_heads] : {std::pair<int64_t, std::vector<int64_t>>{int64_t{1} << 20, {0, 0, 0, 0}},
                                      std::pair<int64_t, std::vector<int64_t>>{int64_t{8192}, {0, 1, 2, 3}},
                                      std::pair<int64_t, std::vector<int64_t>>{int64_t{2048}, {0, 0, 0, 0}}}) {
    rt::HostTensor out(ir::DType::i32, {24, 3});
    out.fill(-1);
    rt::interpret(order_probe().build({{"HEAVY_AT_END", true}, {"BYTES_PER_ROW", int64_t{512}}}), {4, 6, 1}, {out, static_cast<int32_t>(seq_len)});
    for (int64_t p = 0; p < 4; ++p) {
      CHECK(static_cast<int64_t>(out.get_flat(p * 3 + 1)) == first_heads[static_cast<size_t>(p)]);
      CHECK(static_cast<int64_t>(out.get_flat(p * 3)) == (seq_len == 8192 ? 3 : 3 - p));  // heaviest (last) tile first
    }
  }
}
