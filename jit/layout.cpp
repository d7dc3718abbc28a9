// Linear layouts: construction of blocked and mma layouts, and the layout algebra that makes
// reductions, expand_dims, transposes, reshapes and broadcasts free of data movement.
#include "jit/layout.hpp"

#include <fmt/format.h>

#include <algorithm>

#include <stdexcept>

namespace tilejit::jit {
namespace {

Coord unit(size_t rank, size_t dim, int64_t value) {
  Coord c(rank, 0);
  c[dim] = value;
  return c;
}

bool is_zero(const Coord& c) {
  for (int64_t v : c)
    if (v) return false;
  return true;
}

std::string bases_str(const std::vector<Coord>& bs) {
  std::vector<std::string> s;
  for (const Coord& c : bs) s.push_back(fmt::format("({})", fmt::join(c, ",")));
  return fmt::format("[{}]", fmt::join(s, " "));
}

// An mma.sync operand: the fragment's register and lane bases (`frag`, `lanes`), then register
// bits stepping K by `k_step` (the next mma) and the other dim (M by 16 for A, N by 8 for B) over
// the warp's share, in the order the lowering walks them; warps split that dim, and the operand is
// replicated over the warps splitting the other one.
Layout mma_operand(bool is_a, int64_t rows, int64_t cols, int warps_m, int warps_n, std::vector<Coord> frag, std::vector<Coord> lanes,
                   int64_t k_step) {
  Layout L;
  L.shape = {rows, cols};
  L.reg = std::move(frag);
  L.lane = std::move(lanes);
  const size_t k_dim = is_a ? 1 : 0, o_dim = 1 - k_dim;  // K, and M (A) or N (B)
  const int64_t k = is_a ? cols : rows, o = is_a ? rows : cols, wo = o / (is_a ? warps_m : warps_n);
  for (int64_t x = k_step; x < k; x *= 2) L.reg.push_back(unit(2, k_dim, x));
  for (int64_t x = is_a ? 16 : 8; x < wo; x *= 2) L.reg.push_back(unit(2, o_dim, x));
  if (!is_a)
    for (int w = 1; w < warps_m; w *= 2) L.warp.push_back({0, 0});
  for (int64_t x = wo; x < o; x *= 2) L.warp.push_back(unit(2, o_dim, x));
  if (is_a)
    for (int w = 1; w < warps_n; w *= 2) L.warp.push_back({0, 0});
  return L;
}

}  // namespace

bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

int log2_exact(int64_t x) {
  if (!is_power_of_two(x)) throw std::logic_error(fmt::format("log2_exact({}): not a power of two", x));
  int n = 0;
  while ((int64_t{1} << n) < x) ++n;
  return n;
}

Coord Layout::reg_coords(uint32_t r) const {
  Coord c(shape.size(), 0);
  for (size_t i = 0; i < reg.size(); ++i)
    if (r >> i & 1)
      for (size_t d = 0; d < c.size(); ++d) c[d] ^= reg[i][d];
  return c;
}

Coord Layout::coords(uint32_t r, uint32_t l, uint32_t w) const {
  Coord c = reg_coords(r);
  for (size_t i = 0; i < lane.size(); ++i)
    if (l >> i & 1)
      for (size_t d = 0; d < c.size(); ++d) c[d] ^= lane[i][d];
  for (size_t i = 0; i < warp.size(); ++i)
    if (w >> i & 1)
      for (size_t d = 0; d < c.size(); ++d) c[d] ^= warp[i][d];
  return c;
}

int64_t Layout::row_major_offset(const Coord& c) const {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + c[d];
  return off;
}

std::string Layout::str() const {
  return fmt::format("#layout<{} reg={} lane={} warp={}>", ir::shape_string(shape), bases_str(reg), bases_str(lane),
                     bases_str(warp));
}

Layout Layout::blocked(const ir::Shape& shape, int num_warps, int vec) {
  Layout L;
  L.shape = shape;
  size_t rank = shape.size();
  std::vector<int> bits(rank), used(rank, 0);
  for (size_t d = 0; d < rank; ++d) bits[d] = log2_exact(shape[d]);
  // next unused coordinate bit, fastest dim (last) first; a zero basis once all are used
  auto next = [&]() -> Coord {
    for (size_t i = rank; i-- > 0;)
      if (used[i] < bits[i]) return unit(rank, i, int64_t{1} << used[i]++);
    return Coord(rank, 0);
  };
  // Narrow the vector when the tile is too small to give every thread a full one.
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  while (vec > 1 && numel < int64_t{vec} * 32 * num_warps) vec /= 2;
  if (rank > 0)
    for (int v = 1; v < vec && used[rank - 1] < bits[rank - 1]; v *= 2) L.reg.push_back(next());
  for (int i = 0; i < 5; ++i) L.lane.push_back(next());
  for (int w = 1; w < num_warps; w *= 2) L.warp.push_back(next());
  for (size_t d = rank; d-- > 0;)
    while (used[d] < bits[d]) L.reg.push_back(unit(rank, d, int64_t{1} << used[d]++));
  return L;
}

Layout Layout::mma_acc(int64_t m, int64_t n, int warps_m, int warps_n) {
  Layout L;
  L.shape = {m, n};
  int64_t wm = m / warps_m, wn = n / warps_n;  // the tile of one warp
  L.reg = {{0, 1}, {8, 0}};
  for (int64_t x = 8; x < wn; x *= 2) L.reg.push_back({0, x});
  for (int64_t x = 16; x < wm; x *= 2) L.reg.push_back({x, 0});
  L.lane = {{0, 2}, {0, 4}, {1, 0}, {2, 0}, {4, 0}};
  for (int64_t x = wm; x < m; x *= 2) L.warp.push_back({x, 0});
  for (int64_t x = wn; x < n; x *= 2) L.warp.push_back({0, x});
  return L;
}

Layout::WgmmaSplit Layout::wgmma_split(int64_t m, int num_warps) {
  WgmmaSplit s;
  const int warpgroups = std::max(num_warps / 4, 1);
  while (s.m < warpgroups && m % (64 * 2 * s.m) == 0) s.m *= 2;
  s.n = warpgroups / s.m;
  return s;
}

Layout Layout::wgmma_acc(int64_t m, int64_t n, int num_warps) {
  const WgmmaSplit s = wgmma_split(m, num_warps);
  const int64_t wn = n / s.n;  // one warpgroup's columns
  Layout L;
  L.shape = {m, n};
  L.reg = {{0, 1}, {8, 0}};
  for (int64_t x = 8; x < wn; x *= 2) L.reg.push_back({0, x});
  for (int64_t x = 64 * s.m; x < m; x *= 2) L.reg.push_back({x, 0});
  L.lane = {{0, 2}, {0, 4}, {1, 0}, {2, 0}, {4, 0}};
  for (int64_t x = 16; x < 64 * s.m; x *= 2) L.warp.push_back({x, 0});
  for (int64_t x = wn; x < n; x *= 2) L.warp.push_back({0, x});
  return L;
}

Layout Layout::wgmma_a(int64_t m, int64_t k, int num_warps) {
  const WgmmaSplit s = wgmma_split(m, num_warps);
  Layout L = wgmma_acc(m, k, 4 * s.m);
  for (int g = 1; g < s.n; g *= 2) L.warp.push_back({0, 0});
  return L;
}

Layout Layout::mma_a(int64_t m, int64_t k, int warps_m, int warps_n) {
  return mma_operand(true, m, k, warps_m, warps_n, {{0, 1}, {8, 0}, {0, 8}}, {{0, 2}, {0, 4}, {1, 0}, {2, 0}, {4, 0}}, 16);
}

Layout Layout::mma_b(int64_t k, int64_t n, int warps_m, int warps_n) {
  return mma_operand(false, k, n, warps_m, warps_n, {{1, 0}, {8, 0}}, {{2, 0}, {4, 0}, {0, 1}, {0, 2}, {0, 4}}, 16);
}

// mma.sync m16n8k8 .tf32 fragments (PTX ISA "Matrix Fragments for mma.m16n8k8"), lane l, g = l / 4,
// q = l % 4: A's four registers hold (g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4); B's two hold
// (q, g), (q + 4, g).
Layout Layout::mma_a_tf32(int64_t m, int64_t k, int warps_m, int warps_n) {
  return mma_operand(true, m, k, warps_m, warps_n, {{8, 0}, {0, 4}}, {{0, 1}, {0, 2}, {1, 0}, {2, 0}, {4, 0}}, 8);
}

Layout Layout::mma_b_tf32(int64_t k, int64_t n, int warps_m, int warps_n) {
  return mma_operand(false, k, n, warps_m, warps_n, {{4, 0}}, {{1, 0}, {2, 0}, {0, 1}, {0, 2}, {0, 4}}, 8);
}

Layout Layout::batched(int64_t batch, int warps_b) const {
  Layout L = expand_dims(0);
  L.shape[0] = batch;
  const size_t rank = L.shape.size();
  int64_t x = 1;
  for (; x < warps_b; x *= 2) L.warp.push_back(unit(rank, 0, x));
  for (; x < batch; x *= 2) L.reg.push_back(unit(rank, 0, x));
  return L;
}

Layout Layout::slice(int axis) const { return drop_dim(axis).without_zero_regs(); }

bool Layout::has_replication() const {
  for (const auto* bs : {&reg, &lane, &warp})
    for (const Coord& c : *bs)
      if (is_zero(c)) return true;
  return false;
}

bool Layout::axis_bits_separate(int axis) const {
  const auto a = static_cast<size_t>(axis);
  int64_t seen = 0;
  for (const auto* bs : {&reg, &lane, &warp})
    for (const Coord& c : *bs) {
      if (c[a] == 0) continue;
      for (size_t d = 0; d < c.size(); ++d)
        if (d != a && c[d] != 0) return false;
      if (!is_power_of_two(c[a]) || (seen & c[a]) != 0) return false;
      seen |= c[a];
    }
  return seen + 1 == shape[a];
}

Layout Layout::drop_dim(int axis) const {
  Layout L;
  L.shape = shape;
  L.shape.erase(L.shape.begin() + axis);
  auto drop = [&](const std::vector<Coord>& in) {
    std::vector<Coord> out;
    for (Coord c : in) {
      c.erase(c.begin() + axis);
      out.push_back(c);
    }
    return out;
  };
  L.reg = drop(reg);
  L.lane = drop(lane);
  L.warp = drop(warp);
  return L;
}

Layout Layout::expand_dims(int axis) const {
  Layout L = *this;
  L.shape.insert(L.shape.begin() + axis, 1);
  for (auto* bs : {&L.reg, &L.lane, &L.warp})
    for (Coord& c : *bs) c.insert(c.begin() + axis, 0);
  return L;
}

Layout Layout::permute(const std::vector<int64_t>& perm) const {
  Layout L;
  for (int64_t p : perm) L.shape.push_back(shape[static_cast<size_t>(p)]);
  auto apply = [&](const std::vector<Coord>& in) {
    std::vector<Coord> out;
    for (const Coord& c : in) {
      Coord o;
      for (int64_t p : perm) o.push_back(c[static_cast<size_t>(p)]);
      out.push_back(o);
    }
    return out;
  };
  L.reg = apply(reg);
  L.lane = apply(lane);
  L.warp = apply(warp);
  return L;
}

Layout Layout::collapse(int axis) const {
  Layout L = *this;
  L.shape[static_cast<size_t>(axis)] = 1;
  for (auto* bs : {&L.reg, &L.lane, &L.warp})
    for (Coord& c : *bs) c[static_cast<size_t>(axis)] = 0;
  return L;
}

std::optional<Layout> Layout::reshape(const ir::Shape& to) const {
  // Row-major flattening of power-of-two shapes concatenates coordinate bits, so it is linear
  // over GF(2) and a reshape only re-reads each basis in the new shape.
  for (int64_t d : to)
    if (!is_power_of_two(d)) return std::nullopt;
  Layout L;
  L.shape = to;
  auto convert = [&](const std::vector<Coord>& in, std::vector<Coord>& out) {
    for (const Coord& c : in) {
      int64_t flat = row_major_offset(c);  // linear over GF(2): flattening concatenates bits
      Coord o(to.size(), 0);
      for (size_t d = to.size(); d-- > 0;) {
        o[d] = flat % to[d];
        flat /= to[d];
      }
      out.push_back(o);
    }
  };
  convert(reg, L.reg);
  convert(lane, L.lane);
  convert(warp, L.warp);
  return L;
}

std::optional<Layout> Layout::pack_pairs() const {
  const size_t last = shape.size() - 1;
  Coord unit(shape.size(), 0);
  unit[last] = 1;
  auto it = std::find(reg.begin(), reg.end(), unit);
  if (shape.empty() || it == reg.end()) return std::nullopt;
  Layout L = *this;
  L.reg.erase(L.reg.begin() + (it - reg.begin()));
  L.shape[last] /= 2;
  for (auto* bs : {&L.reg, &L.lane, &L.warp})
    for (Coord& c : *bs) {
      if (c[last] % 2 != 0) return std::nullopt;
      c[last] /= 2;
    }
  return L;
}

Layout Layout::unpack_pairs() const {
  const size_t last = shape.size() - 1;
  Layout L = *this;
  L.shape[last] *= 2;
  for (auto* bs : {&L.reg, &L.lane, &L.warp})
    for (Coord& c : *bs) c[last] *= 2;
  Coord unit(shape.size(), 0);
  unit[last] = 1;
  L.reg.insert(L.reg.begin(), unit);
  return L;
}

Layout Layout::without_zero_regs() const {
  Layout L = *this;
  L.reg.clear();
  for (const Coord& c : reg)
    if (!is_zero(c)) L.reg.push_back(c);
  return L;
}

}  // namespace tilejit::jit
