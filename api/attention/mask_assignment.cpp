// assign_mask_tiles: which GEMM writes which share of the dropout keep-mask (issue 30), from each
// GEMM's measured hiding curve (decision 094). Host arithmetic only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "api/attention/internal.hpp"

namespace tilejit::attention {

using namespace detail;

namespace {

void check_curve(const Checker& c, const MaskHidingCurve& curve, size_t index) {
  if (curve.points.empty()) c.fail("curves[{}] has no points; give at least one (tiles > 0, extra ms)", index);
  int64_t previous = 0;
  for (size_t i = 0; i < curve.points.size(); ++i) {
    const auto [tiles, ms] = curve.points[i];
    if (tiles <= previous)
      c.fail("curves[{}].points[{}] has tiles = {}; tiles must be > 0 and ascending (the one before: {})", index, i, tiles, previous);
    if (!std::isfinite(ms)) c.fail("curves[{}].points[{}] has extra ms = {}; it must be finite", index, i, ms);
    previous = tiles;
  }
}

// the extra at a real-valued tile count (the assignment's granules need not be whole tiles)
double extra_at(const MaskHidingCurve& curve, double tiles) {
  if (tiles <= 0) return 0.0;
  const auto& p = curve.points;
  // the segment holding `tiles`: from (0, 0) to the first point, between points, or past the last
  double x0 = 0.0, y0 = 0.0, x1 = static_cast<double>(p[0].first), y1 = p[0].second;
  for (size_t i = 1; i < p.size() && tiles > x1; ++i) {
    x0 = x1, y0 = y1;
    x1 = static_cast<double>(p[i].first), y1 = p[i].second;
  }
  // one point: carrying fewer tiles than it costs its extra in proportion (the mask work scales)
  return y0 + (y1 - y0) * (tiles - x0) / (x1 - x0);
}

}  // namespace

double mask_hiding_extra_ms(const MaskHidingCurve& curve, int64_t tiles) {
  const Checker c("mask_hiding_extra_ms");
  check_curve(c, curve, 0);
  if (tiles < 0) c.fail("tiles = {} is negative", tiles);
  return extra_at(curve, static_cast<double>(tiles));
}

std::vector<int64_t> assign_mask_tiles(const std::vector<MaskHidingCurve>& curves, int64_t tiles, int64_t granule) {
  const Checker c("assign_mask_tiles");
  if (curves.empty()) c.fail("curves is empty; give one curve per GEMM that may carry tiles");
  for (size_t i = 0; i < curves.size(); ++i) check_curve(c, curves[i], i);
  if (tiles < 0) c.fail("tiles = {} is negative", tiles);
  if (granule < 0) c.fail("granule = {} is negative; 0 picks tiles / 256", granule);
  const size_t n = curves.size();
  std::vector<int64_t> counts(n, 0);
  if (tiles == 0) return counts;
  const int64_t units = granule > 0 ? (tiles + granule - 1) / granule : std::min<int64_t>(tiles, 256);
  const double per_unit = static_cast<double>(tiles) / static_cast<double>(units);
  const auto g = static_cast<size_t>(units);
  // best[i][u]: least extra of the first i GEMMs carrying u units; take[i][u]: GEMM i-1's units there
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(g + 1, kInf));
  std::vector<std::vector<size_t>> take(n + 1, std::vector<size_t>(g + 1, 0));
  best[0][0] = 0.0;
  for (size_t i = 1; i <= n; ++i)
    for (size_t u = 0; u <= g; ++u)
      for (size_t k = 0; k <= u; ++k) {
        const double prior = best[i - 1][u - k];
        if (prior == kInf) continue;
        const double total = prior + extra_at(curves[i - 1], static_cast<double>(k) * per_unit);
        if (total < best[i][u]) best[i][u] = total, take[i][u] = k;
      }
  std::vector<size_t> unit_counts(n);
  for (size_t i = n, u = g; i > 0; --i) unit_counts[i - 1] = take[i][u], u -= take[i][u];
  // whole tiles by cumulative rounding: the counts sum to `tiles` exactly
  size_t cumulative = 0;
  int64_t assigned = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += unit_counts[i];
    const int64_t upto = std::llround(static_cast<double>(cumulative) * per_unit);
    counts[i] = upto - assigned;
    assigned = upto;
  }
  return counts;
}

}  // namespace tilejit::attention
