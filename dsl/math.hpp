// Math functions composed from the DSL's primitive ops (no new IR): the interpreter and both GPU
// backends compute them from the same primitives, so each is exactly as exact as its parts. Float
// tiles only unless said; 16-bit floats are computed in f32 and rounded once at the end.
#pragma once
#include "dsl/ops.hpp"

namespace tilejit::lang {

// i1 tiles; integers are never NaN or infinite (all false / all true for isfinite).
Tile isnan(const Operand& x, Loc loc = Loc::current());
Tile isinf(const Operand& x, Loc loc = Loc::current());
Tile isfinite(const Operand& x, Loc loc = Loc::current());
// True where the sign bit is set (-0.0 and negative NaNs included); integers: x < 0.
Tile signbit(const Operand& x, Loc loc = Loc::current());
// minimum(maximum(x, lo), hi): NaN in x, lo or hi gives NaN (the NaN-propagating min/max). Any dtype.
Tile clamp(const Operand& x, const Operand& lo, const Operand& hi, Loc loc = Loc::current());
// Toward zero, keeping -0.0 (trunc(-0.5) = -0.0). Exact.
Tile trunc(const Operand& x, Loc loc = Loc::current());
// To the nearest integer, ties to even (C's rint / nearbyint: round(2.5) = 2, round(-0.5) = -0.0).
// Exact: (|x| + 2^23) - 2^23 in round-to-nearest-even arithmetic (2^52 for f64).
Tile round(const Operand& x, Loc loc = Loc::current());
// 1 / (1 + exp(-x)): 0 at -inf, 1 at +inf; as approximate as exp.
Tile sigmoid(const Operand& x, Loc loc = Loc::current());
// log(1 + x) and exp(x) - 1, accurate near 0 (Goldberg's and Kahan's corrections of the
// approximate log / exp: relative error a few ulp of f32 beyond theirs); inf, -1, -inf and NaN
// give what C's log1p / expm1 give.
Tile log1p(const Operand& x, Loc loc = Loc::current());
Tile expm1(const Operand& x, Loc loc = Loc::current());

// The i32 index along `axis` of the largest (smallest) element, as PyTorch's argmax / argmin: the
// first index among equal values (-0.0 equals +0.0), and a NaN counts as larger (smaller) than
// everything, so a row with a NaN gives its first NaN's index. Any dtype; the axis disappears.
// Two reductions (the value, then the first index holding it).
Tile argmax(const Operand& x, int axis, Loc loc = Loc::current());
Tile argmin(const Operand& x, int axis, Loc loc = Loc::current());

// Triton's tl.histogram: i32[num_bins], bin b counting the elements of the integer tile x (any
// shape) equal to b; values outside [0, num_bins) are not counted. num_bins: a power of two up to
// ir::kMaxHistogramBins (16384). On the GPU a warp counts 32 elements at once: log2(num_bins) + 1
// ballots, then a popcount per bin a lane owns (up to 1024 bins; more: shared-memory atomics);
// the warps' counts are summed. Across programs, atomic_add the result into a bins tensor
// (docs/from-triton.md).
Tile histogram(const Operand& x, int64_t num_bins, Loc loc = Loc::current());
// How the GPU counts (the values are the same): ballots take the same time on any data;
// shared_atomics (one relaxed shared-memory atomic add per element into per-warp counts) measured
// 1.4x faster on spread values and 2x slower where a warp's values coincide (decision 059). Above
// 1024 bins both are shared atomics.
enum class HistogramMethod { ballots, shared_atomics };
Tile histogram(const Operand& x, int64_t num_bins, HistogramMethod method, Loc loc = Loc::current());

}  // namespace tilejit::lang
