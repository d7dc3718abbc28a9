// Linear layouts: every constructor covers each tile element (replication aside), the fragment
// layouts match the PTX ISA's register maps, and the layout algebra (slice, expand, permute,
// reshape, collapse) agrees with the element coordinates it claims.
#include <doctest/doctest.h>

#include <array>
#include <map>
#include <optional>
#include <set>

#include "jit/layout.hpp"

using namespace tilejit::jit;

namespace {

// How many (reg, lane, warp) triples hold each element; every element must appear.
std::map<Coord, int> coverage(const Layout& L) {
  std::map<Coord, int> seen;
  for (uint32_t w = 0; w < static_cast<uint32_t>(L.num_warps()); ++w)
    for (uint32_t l = 0; l < 32; ++l)
      for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) ++seen[L.coords(r, l, w)];
  return seen;
}

int64_t numel(const Layout& L) {
  int64_t n = 1;
  for (int64_t d : L.shape) n *= d;
  return n;
}

void check_covers(const Layout& L) {
  auto seen = coverage(L);
  CHECK_MESSAGE(static_cast<int64_t>(seen.size()) == numel(L), L.str());
  int copies = -1;
  for (const auto& [c, n] : seen) {
    for (size_t d = 0; d < c.size(); ++d) CHECK((c[d] >= 0 && c[d] < L.shape[d]));
    if (copies < 0) copies = n;
    CHECK_MESSAGE(n == copies, "uneven replication in " << L.str());  // linear maps replicate uniformly
  }
}

}  // namespace

TEST_CASE("blocked layouts cover every element, coalesced along the last dim") {
  for (auto shape : std::vector<tilejit::ir::Shape>{{64, 64}, {128, 32}, {16}, {1024}, {4, 128}, {2, 8, 64}, {1, 1}})
    for (int warps : {1, 4, 8})
      for (int vec : {1, 4, 8}) {
        Layout L = Layout::blocked(shape, warps, vec);
        INFO(L.str());
        check_covers(L);
        // lane 1 sits right after lane 0's vector along the fastest dim when the tile is wide enough
        if (shape.back() >= 64 && numel(L) >= int64_t{vec} * 32 * warps) {
          Coord c0 = L.coords(0, 0, 0), c1 = L.coords(0, 1, 0);
          CHECK(c1.back() - c0.back() == vec);
        }
      }
}

TEST_CASE("a tile smaller than the CTA replicates instead of dropping elements") {
  Layout L = Layout::blocked({16}, 4, 4);
  check_covers(L);
  CHECK(L.has_replication());
}

TEST_CASE("mma.sync m16n8k16 fragments match the PTX ISA register maps") {
  // C/D: c0,c1 at (g, 2t), (g, 2t+1); c2,c3 at (g+8, ...), g = lane/4, t = lane%4
  Layout C = Layout::mma_acc(16, 8, 1, 1);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    int64_t g = lane / 4, t = lane % 4;
    CHECK(C.coords(0, lane, 0) == Coord{g, 2 * t});
    CHECK(C.coords(1, lane, 0) == Coord{g, 2 * t + 1});
    CHECK(C.coords(2, lane, 0) == Coord{g + 8, 2 * t});
    CHECK(C.coords(3, lane, 0) == Coord{g + 8, 2 * t + 1});
  }
  // A (16x16): a0..a7 = (g,2t) (g,2t+1) (g+8,2t) (g+8,2t+1) (g,2t+8) (g,2t+9) (g+8,2t+8) (g+8,2t+9)
  Layout A = Layout::mma_a(16, 16, 1, 1);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    int64_t g = lane / 4, t = lane % 4;
    CHECK(A.coords(4, lane, 0) == Coord{g, 2 * t + 8});
    CHECK(A.coords(7, lane, 0) == Coord{g + 8, 2 * t + 9});
  }
  // B (16x8, k x n): b0,b1 = (2t, g), (2t+1, g); b2,b3 = (2t+8, g), (2t+9, g)
  Layout B = Layout::mma_b(16, 8, 1, 1);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    int64_t g = lane / 4, t = lane % 4;
    CHECK(B.coords(1, lane, 0) == Coord{2 * t + 1, g});
    CHECK(B.coords(2, lane, 0) == Coord{2 * t + 8, g});
  }
  for (auto [m, n, wm, wn] : std::vector<std::array<int, 4>>{{{64, 64, 4, 1}}, {{128, 128, 2, 2}}, {{64, 32, 1, 4}}}) {
    check_covers(Layout::mma_acc(m, n, wm, wn));
    check_covers(Layout::mma_a(m, 32, wm, wn));
    check_covers(Layout::mma_b(32, n, wm, wn));
  }
}

TEST_CASE("mma.sync m16n8k8 .tf32 fragments match the PTX ISA register maps; batched layouts cover [B, M, N]") {
  // A (16x8): a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B (8x8, k x n): b0 (t, g), b1 (t+4, g)
  Layout A = Layout::mma_a_tf32(16, 8, 1, 1), B = Layout::mma_b_tf32(8, 8, 1, 1);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    int64_t g = lane / 4, t = lane % 4;
    CHECK(A.coords(0, lane, 0) == Coord{g, t});
    CHECK(A.coords(1, lane, 0) == Coord{g + 8, t});
    CHECK(A.coords(2, lane, 0) == Coord{g, t + 4});
    CHECK(A.coords(3, lane, 0) == Coord{g + 8, t + 4});
    CHECK(B.coords(0, lane, 0) == Coord{t, g});
    CHECK(B.coords(1, lane, 0) == Coord{t + 4, g});
  }
  // the next registers step K by 8 (the next mma), then M by 16 (A) or N by 8 (B), as the lowering walks them
  CHECK(Layout::mma_a_tf32(32, 16, 1, 1).coords(4, 0, 0) == Coord{0, 8});
  CHECK(Layout::mma_a_tf32(32, 16, 1, 1).coords(8, 0, 0) == Coord{16, 0});
  CHECK(Layout::mma_b_tf32(16, 16, 1, 1).coords(2, 0, 0) == Coord{8, 0});
  CHECK(Layout::mma_b_tf32(16, 16, 1, 1).coords(4, 0, 0) == Coord{0, 8});
  for (auto [m, n, wm, wn] : std::vector<std::array<int, 4>>{{{64, 64, 4, 1}}, {{128, 128, 2, 2}}, {{64, 32, 1, 4}}}) {
    check_covers(Layout::mma_a_tf32(m, 32, wm, wn));
    check_covers(Layout::mma_b_tf32(32, n, wm, wn));
  }
  // batched: batch bits on the warps' high bits (warps_b of them), the rest in the registers' high bits
  const Layout C = Layout::mma_acc(16, 8, 1, 1).batched(8, 4);
  CHECK(C.shape == tilejit::ir::Shape{8, 16, 8});
  check_covers(C);
  CHECK(C.num_regs() == 2 * 4);
  CHECK(C.coords(0, 0, 3) == Coord{3, 0, 0});      // warp 3: batch 3
  CHECK(C.coords(4, 0, 1) == Coord{5, 0, 0});      // register 4 (the next batch slab): batch 1 + 4
  CHECK(C.coords(1, 5, 0) == Coord{0, 1, 3});      // the 2-D fragment inside each batch
  check_covers(Layout::mma_a(32, 32, 2, 1).batched(4, 2));
  check_covers(Layout::mma_b_tf32(16, 64, 2, 2).batched(2, 1));
}

TEST_CASE("the wgmma m64nNk16 accumulator matches the PTX ISA map and covers the tile") {
  // d[i]: row = 16*warp + lane/4 + 8*((i/2)%2), col = 8*(i/4) + 2*(lane%4) + i%2
  Layout L = Layout::wgmma_acc(64, 256, 4);
  for (uint32_t w = 0; w < 4; ++w)
    for (uint32_t lane = 0; lane < 32; ++lane)
      for (uint32_t i = 0; i < 128; i += 13) {
        int64_t row = 16 * w + lane / 4 + 8 * ((i / 2) % 2), colv = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        CHECK(L.coords(i, lane, w) == Coord{row, colv});
      }
  check_covers(L);
  check_covers(Layout::wgmma_acc(128, 256, 8));
  check_covers(Layout::wgmma_acc(256, 128, 8));  // repeats in registers
  check_covers(Layout::wgmma_acc(128, 128, 4));
}

TEST_CASE("wgmma with warpgroups splitting N: M = 64 on two warpgroups, each with half the columns") {
  CHECK(Layout::wgmma_split(64, 8).m == 1);
  CHECK(Layout::wgmma_split(64, 8).n == 2);
  CHECK(Layout::wgmma_split(128, 8).m == 2);
  CHECK(Layout::wgmma_split(128, 8).n == 1);
  CHECK(Layout::wgmma_split(128, 16).m == 2);
  CHECK(Layout::wgmma_split(128, 16).n == 2);
  CHECK(Layout::wgmma_split(64, 4).n == 1);
  // warpgroup g (warps 4g..4g+3) holds columns [64g, 64g + 64) in the m64n64 instruction's map
  Layout L = Layout::wgmma_acc(64, 128, 8);
  for (uint32_t w = 0; w < 8; ++w)
    for (uint32_t lane = 0; lane < 32; ++lane)
      for (uint32_t i = 0; i < 32; i += 3) {
        int64_t row = 16 * (w % 4) + lane / 4 + 8 * ((i / 2) % 2), colv = 64 * (w / 4) + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        CHECK(L.coords(i, lane, w) == Coord{row, colv});
      }
  check_covers(L);
  check_covers(Layout::wgmma_acc(128, 256, 16));
  // the A operand from registers: every warpgroup holds the whole [64, K] (the M split's fragments)
  Layout A = Layout::wgmma_a(64, 128, 8);
  for (uint32_t lane = 0; lane < 32; lane += 5)
    for (uint32_t i = 0; i < 64; i += 7) CHECK(A.coords(i, lane, 1) == A.coords(i, lane, 5));
  CHECK(A.has_replication());
  CHECK(Layout::wgmma_a(128, 64, 8) == Layout::wgmma_acc(128, 64, 8));
}

TEST_CASE("slice, expand_dims, permute, reshape and collapse agree with element coordinates") {
  Layout L = Layout::blocked({64, 128}, 4, 4);
  // slice: coordinates with the axis dropped
  Layout S = L.slice(1);
  CHECK(S.shape == tilejit::ir::Shape{64});
  check_covers(S);
  Layout D = L.drop_dim(1);
  for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); r += 3)
    CHECK(D.coords(r, 5, 2) == Coord{L.coords(r, 5, 2)[0]});
  // expand_dims inserts a zero coordinate
  Layout E = S.expand_dims(1);
  CHECK(E.coords(0, 7, 1) == Coord{S.coords(0, 7, 1)[0], 0});
  // permute swaps coordinates
  Layout P = L.permute({1, 0});
  CHECK(P.shape == tilejit::ir::Shape{128, 64});
  CHECK(P.coords(3, 9, 2) == Coord{L.coords(3, 9, 2)[1], L.coords(3, 9, 2)[0]});
  // reshape keeps each element's row-major flat index
  auto R = L.reshape({8192});
  REQUIRE(R.has_value());
  for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); r += 5)
    CHECK(R->coords(r, 11, 3)[0] == L.row_major_offset(L.coords(r, 11, 3)));
  CHECK_FALSE(L.reshape({96, 32}).has_value());  // not a power-of-two shape
  // collapse: the broadcast source keeps the register count and zeroes the axis
  Layout C = L.collapse(1);
  CHECK(C.num_regs() == L.num_regs());
  CHECK(C.coords(2, 4, 1) == Coord{L.coords(2, 4, 1)[0], 0});
}

TEST_CASE("pack_pairs / unpack_pairs layouts: a thread holds both of each pair; unpacking restores the layout") {
  // the wgmma accumulator (8 warps, 128 x 128): register bit 0 is column bit 0, so pairs stay in
  // their thread and unpacking gives the accumulator layout back, register for register
  const Layout acc = Layout::wgmma_acc(128, 128, 8);
  const std::optional<Layout> packed = acc.pack_pairs();
  REQUIRE(packed);
  CHECK(packed->shape == tilejit::ir::Shape{128, 64});
  CHECK(packed->num_regs() * 2 == acc.num_regs());
  CHECK(packed->unpack_pairs() == acc);
  for (const auto& [c, n] : coverage(*packed)) CHECK(n == 1);
  CHECK(coverage(*packed).size() == 128 * 64);
  // packed register r of a thread holds the pair whose low half is unpacked register 2r
  const Layout un = packed->unpack_pairs();
  for (uint32_t l = 0; l < 32; ++l)
    for (uint32_t r = 0; r < static_cast<uint32_t>(packed->num_regs()); ++r) {
      const Coord p = packed->coords(r, l, 3), lo = un.coords(2 * r, l, 3), hi = un.coords(2 * r + 1, l, 3);
      CHECK(lo[0] == p[0]);
      CHECK(lo[1] == 2 * p[1]);
      CHECK(hi[1] == 2 * p[1] + 1);
    }
  // blocked 16-bit layouts hold 8 neighbours per thread: packable
  const Layout blocked = Layout::blocked({64, 64}, 4, 8);
  REQUIRE(blocked.pack_pairs());
  CHECK(blocked.pack_pairs()->unpack_pairs().pack_pairs() == blocked.pack_pairs());
  // one element per thread along the last dim: a pair straddles lanes, no packed layout
  CHECK_FALSE(Layout::blocked({64, 64}, 4, 1).pack_pairs());
}
