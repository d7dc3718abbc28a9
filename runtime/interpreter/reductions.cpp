// reduce along one axis: sum (one rounding at the end), max and min (PTX's NaN rules) for floats;
// wrapping sums and signed or unsigned max/min for integers; and histogram (counts per bin).
#include <algorithm>

#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {

void Machine::reduce_op(const Op& op) {
  const ir::Type& t = T(op.operands[0]);
  const auto axis = static_cast<size_t>(op.int_attr("axis"));
  const std::string& kind = op.str_attr("kind");
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= t.shape[d];
  for (size_t d = axis + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  const int64_t len = t.shape[axis];
  const Slot& A = S(op.operands[0]);
  Slot& R = S(op.results[0]);
  const auto at = [&](int64_t o, int64_t j, int64_t in) { return static_cast<size_t>((o * len + j) * inner + in); };
  const auto out = [&](int64_t o, int64_t in) { return static_cast<size_t>(o * inner + in); };
  if (ir::is_float(t.dtype)) {
    R.f.resize(static_cast<size_t>(outer * inner));
    with_rounder(t.dtype, [&](auto rnd) {
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t in = 0; in < inner; ++in) {
          double acc = A.f[at(o, 0, in)];
          if (kind == "sum") {
            // One rounding at the end: the reference the GPU's tree order is measured against.
            for (int64_t j = 1; j < len; ++j) acc += A.f[at(o, j, in)];
            acc = rnd(acc);
          } else if (kind == "max") {
            for (int64_t j = 1; j < len; ++j) acc = max_nan(acc, A.f[at(o, j, in)]);
          } else {
            for (int64_t j = 1; j < len; ++j) acc = min_nan(acc, A.f[at(o, j, in)]);
          }
          R.f[out(o, in)] = acc;
        }
    });
    return;
  }
  R.i.resize(static_cast<size_t>(outer * inner));
  const Wrap wrap(t.dtype);
  const bool sgn = ir::is_signed(t.dtype);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      int64_t acc = A.i[at(o, 0, in)];
      for (int64_t j = 1; j < len; ++j) {
        int64_t x = A.i[at(o, j, in)];
        if (kind == "sum") acc = wrap(static_cast<uint64_t>(acc) + static_cast<uint64_t>(x));
        else if (sgn) acc = kind == "max" ? std::max(acc, x) : std::min(acc, x);
        else {
          auto ua = static_cast<uint64_t>(acc), ux = static_cast<uint64_t>(x);
          acc = static_cast<int64_t>(kind == "max" ? std::max(ua, ux) : std::min(ua, ux));
        }
      }
      R.i[out(o, in)] = acc;
    }
}

void Machine::histogram_op(const Op& op) {
  // (an unsigned 64-bit value past 2^63 is held negative here: outside the bins either way)
  std::vector<int64_t> bins(static_cast<size_t>(op.int_attr("num_bins")), 0);
  for (int64_t v : S(op.operands[0]).i)
    if (v >= 0 && v < static_cast<int64_t>(bins.size())) ++bins[static_cast<size_t>(v)];
  S(op.results[0]).i = std::move(bins);
}

}  // namespace tilejit::runtime::interp
