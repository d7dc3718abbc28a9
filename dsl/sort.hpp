// Moving elements along an axis: gather, xor_permute (element i takes element i ^ mask), and what
// is composed from the latter and elementwise ops, exactly alike in the interpreter
// and on the GPU: flip, and a bitonic sorting network (sort, argsort, topk). Axes of a power-of-two
// length (as every tile dimension is).
#pragma once
#include <vector>

#include "dsl/ops.hpp"

namespace tilejit::lang {

// out[..., i, ...] = x[..., i ^ mask, ...] along `axis`; 0 <= mask < the axis length.
Tile xor_permute(const Operand& x, int axis, int64_t mask, Loc loc = Loc::current());
// The axis reversed (xor_permute with mask n - 1).
Tile flip(const Operand& x, int axis, Loc loc = Loc::current());
// Triton's tl.gather / numpy's take_along_axis: out has index's shape (x's, but for the axis) and
// out[..., i, ...] = x[..., index[..., i, ...], ...]. An index outside the axis is an error in the
// interpreter; on the GPU it wraps modulo the axis length (never a read outside the tile). Through
// shared memory: one exchange.
Tile gather(const Operand& x, const Operand& index, int axis, Loc loc = Loc::current());

// The order: integers by value; floats by value with -0.0 before +0.0 and NaN after everything
// (torch.sort's place for NaN), so any two elements compare and the result is one permutation.
// sort of several tiles of one shape moves them together, ordered by tiles[0] (descending if asked)
// with ties broken by tiles[1], tiles[2], ... ascending: with the positions as the last tile it is
// a stable sort, and argsort / topk are that.
std::vector<Tile> sort(const std::vector<Tile>& tiles, int axis, bool descending = false, Loc loc = Loc::current());
Tile sort(const Operand& x, int axis, bool descending = false, Loc loc = Loc::current());
// The i32 positions that sort x (stable: equal elements keep their order).
Tile argsort(const Operand& x, int axis, bool descending = false, Loc loc = Loc::current());

// The k largest elements along `axis`, largest first (NaN counts largest), and their i32 positions
// (the first position among equals first); k a power of two no larger than the axis.
struct TopK {
  Tile values, indices;
};
TopK topk(const Operand& x, int64_t k, int axis, Loc loc = Loc::current());

}  // namespace tilejit::lang
