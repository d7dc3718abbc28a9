// Scans and reductions with a combine function of the user's (Triton's tl.associative_scan and
// tl.reduce): the function runs on scalars, once per pair of elements, and must be associative
// (it need not be commutative: `a` always comes before `b` in the scan's direction). Several tiles of one
// shape travel together, so argmax with its index, or a (count, mean, M2) Welford triple, is one
// call. Float results may differ from the interpreter's left-to-right order in rounding (the GPU
// combines in a tree); integer and selection combines (max, argmax) agree exactly.
#pragma once
#include <functional>
#include <vector>

#include "dsl/ops.hpp"

namespace tilejit::lang {

// combine(a, b) -> one scalar per tile, each of its tile's dtype. Inside: constants and
// elementwise operations on the scalars it is given (and scalars from outside), nothing else.
using Combine = std::function<std::vector<Tile>(const std::vector<Tile>& a, const std::vector<Tile>& b)>;
using Combine1 = std::function<Tile(const Tile& a, const Tile& b)>;

// Inclusive scan along `axis`: out[i] = x[0] (+) x[1] (+) ... (+) x[i]; with `reverse`, from the
// end, `a` still the earlier in the scan's direction (as Triton's reverse scan):
// out[i] = x[n-1] (+) x[n-2] (+) ... (+) x[i].
std::vector<Tile> associative_scan(const std::vector<Tile>& xs, int axis, const Combine& combine, bool reverse = false,
                                   Loc loc = Loc::current());
Tile associative_scan(const Operand& x, int axis, const Combine1& combine, bool reverse = false, Loc loc = Loc::current());

// x[0] (+) x[1] (+) ... (+) x[n-1] along `axis` (the axis disappears).
std::vector<Tile> reduce(const std::vector<Tile>& xs, int axis, const Combine& combine, Loc loc = Loc::current());
Tile reduce(const Operand& x, int axis, const Combine1& combine, Loc loc = Loc::current());

// Running sum / product along `axis`. Like Triton's sum, booleans and integers narrower than 32
// bits accumulate (and come back) as i32 (unsigned: u32), f16 and bf16 as f32; wider dtypes as
// themselves (integers wrap).
Tile cumsum(const Operand& x, int axis, bool reverse = false, Loc loc = Loc::current());
Tile cumprod(const Operand& x, int axis, bool reverse = false, Loc loc = Loc::current());

}  // namespace tilejit::lang
