// The DSL twin of kernels/attention/backward_schedule.hpp for the dK/dV kernel's persistent grid (PERSISTENT):
// the same formulas (items, concurrency groups, DASH shift visit orders, ordered wait targets)
// written over scalar i32 tiles, so that the kernel evaluates per (item, step) what the host model
// enumerates. Read backward_schedule.hpp for what each quantity means; the function names match.
// tests/test_backward_schedule.cpp runs these in the interpreter against the host model.
#pragma once
#include "dsl/lang.hpp"

namespace tilejit::kernels {

struct BwdScheduleLang {
  lang::Tile seq_q, seq_k;  // i32 scalars
  int64_t block_m, block_n;
  bool causal;

  lang::Tile diag() const { return seq_k - seq_q; }
  lang::Tile query_tiles() const { return lang::cdiv(seq_q, block_m); }  // M
  lang::Tile key_tiles() const { return lang::cdiv(seq_k, block_n); }    // N
  lang::Tile items_per_head() const { return causal ? (key_tiles() + 1) / 2 : key_tiles(); }

  // a / b rounded down for b > 0 (the DSL's integer division truncates towards zero, as C++'s)
  static lang::Tile floor_div(const lang::Tile& a, int64_t b) {
    return lang::where((a % b != 0) & (a < 0), a / b - 1, a / b);
  }
  lang::Tile first_query_tile(const lang::Tile& n) const {
    if (!causal) return lang::zeros(ir::DType::i32, {});
    return lang::maximum(-floor_div(-(n * block_n - diag() - block_m + 1), block_m), 0);
  }
  lang::Tile last_key_tile(const lang::Tile& m) const {
    if (!causal) return key_tiles() - 1;
    return lang::minimum(lang::maximum(floor_div(m * block_m + block_m - 1 + diag(), block_n), -1),
                         key_tiles() - 1);
  }

  // Item L of a persistent program: head, item index, wave and the head's items in this wave [g, g + A).
  struct Slot {
    lang::Tile head, item, wave, group_first, group_size;
  };
  Slot slot(const lang::Tile& linear, const lang::Tile& programs) const {
    const lang::Tile items = items_per_head();
    Slot s;
    s.head = linear / items;
    s.item = linear % items;
    s.wave = linear / programs;
    s.group_first = lang::maximum(s.wave * programs - s.head * items, 0);
    s.group_size = lang::minimum(items, (s.wave + 1) * programs - s.head * items) - s.group_first;
    return s;
  }
  // Stage 0 runs key tile `item`; stage 1 (causal pairs) key tile N - 1 - item, when item < N / 2.
  lang::Tile stages(const Slot& s) const { return causal ? lang::where(s.item < key_tiles() / 2, 2, 1) : lang::full(ir::DType::i32, {}, 1); }
  lang::Tile stage_tile(const Slot& s, const lang::Tile& stage) const { return lang::where(stage == 0, s.item, key_tiles() - 1 - s.item); }

  lang::Tile visit_count(const lang::Tile& n) const { return query_tiles() - first_query_tile(n); }
  // The query tile key tile n (of slot s, at `stage`) visits at step t: DASH's shift orders.
  lang::Tile visit_query_tile(const Slot& s, const lang::Tile& stage, const lang::Tile& n, const lang::Tile& t) const {
    const lang::Tile m_tiles = query_tiles(), a = s.item - s.group_first;
    if (!causal) return (a + t) % m_tiles;
    const lang::Tile rho = first_query_tile(s.group_first + s.group_size - 1), rows = m_tiles - rho;
    const lang::Tile stage0 = lang::where(t < rows, rho + (a + t) % rows, first_query_tile(n) + (t - rows));
    return lang::where(stage == 1, m_tiles - 1 - t, stage0);
  }

  static lang::Tile overlap(const lang::Tile& a0, const lang::Tile& a1, const lang::Tile& b0, const lang::Tile& b1) {
    return lang::maximum(lang::minimum(a1, b1) - lang::maximum(a0, b0), 0);
  }
  struct Range {
    lang::Tile begin, end;
  };
  Range stage_tiles(int stage, const lang::Tile& i0, const lang::Tile& i1) const {
    if (stage == 0) return {i0, i1};
    const lang::Tile n = key_tiles(), pairs = n / 2;
    return {n - lang::minimum(i1, pairs), n - lang::minimum(i0, pairs)};
  }
  static lang::Tile shift_rank(const lang::Tile& tiles, const lang::Tile& rows, const lang::Tile& r, const lang::Tile& a) {
    const lang::Tile step = ((r - a) % rows + rows) % rows;
    const lang::Tile cycles = tiles / rows, rest = tiles % rows;
    const lang::Tile low = r - step + 1, top = lang::minimum(r + 1, rest);
    const lang::Tile early_rest = lang::where(low >= 0, lang::maximum(top - low, 0), top + lang::maximum(rest - (low + rows), 0));
    return cycles * step + early_rest + a / rows;
  }
  // ordered: the count sem[head][m] waits for before key tile n (slot s, `stage`) adds into dQ[m].
  lang::Tile wait_target(const Slot& s, const lang::Tile& stage, const lang::Tile& n, const lang::Tile& m) const {
    const lang::Tile g = s.group_first, group_end = s.group_first + s.group_size;
    const lang::Tile contributors_end = last_key_tile(m) + 1;
    auto parts_from = [&](int st, const lang::Tile& i0, const lang::Tile& i1) {
      const Range r = stage_tiles(st, i0, i1);
      return overlap(r.begin, r.end, lang::zeros(ir::DType::i32, {}), contributors_end);
    };
    const lang::Tile zero = lang::zeros(ir::DType::i32, {});
    lang::Tile before = parts_from(0, zero, g);
    if (!causal) return before + shift_rank(s.group_size, query_tiles(), m, s.item - g);
    before = before + parts_from(1, zero, g);
    // stage 1: after this wave's stage 0; the tiles of the stage are at the same step, n decides
    const Range group1 = stage_tiles(1, g, group_end);
    const lang::Tile target1 = before + parts_from(0, g, group_end) + (n - lang::maximum(group1.begin, 0));
    // stage 0: the group's rectangle [rho, M) rotates; below it each tile's own triangle ascends
    const lang::Tile rho = first_query_tile(group_end - 1);
    const lang::Tile rect = before + shift_rank(s.group_size, query_tiles() - rho, m - rho, s.item - g);
    const Range group0 = stage_tiles(0, g, group_end);
    const lang::Tile u = lang::maximum(group0.begin, 0), w = lang::minimum(group0.end, contributors_end);
    const lang::Tile lo = first_query_tile(n);
    const lang::Tile later_lo_from = last_key_tile(lo) + 1;
    const lang::Tile same_lo_from = lang::where(lo > 0, last_key_tile(lo - 1) + 1, 0);
    const lang::Tile triangle = before + lang::maximum(w - lang::maximum(u, later_lo_from), 0) + (n - lang::maximum(u, same_lo_from));
    return lang::where(stage == 1, target1, lang::where(m >= rho, rect, triangle));
  }
};

}  // namespace tilejit::kernels
