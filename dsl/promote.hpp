// Internal to the DSL: how operands meet. Numpy broadcasting, Triton-like dtype promotion,
// literal materialisation. Shared by the operators, memory ops and control flow.
#pragma once
#include <initializer_list>
#include <string_view>

#include "dsl/builder.hpp"

namespace tilejit::lang::detail {

using Loc = std::source_location;

// The builder of the first tile among the operands (all tiles must share it), else the current one.
Builder& builder_for(std::initializer_list<const Operand*> ops, const Loc& loc);
// numpy rules: align on the right, each dim equal or 1.
Shape broadcast_shapes(Builder& b, const Shape& x, const Shape& y, const Loc& loc, std::string_view what);
Tile broadcast_to(Builder& b, const Tile& t, const Shape& shape, const Loc& loc);
// The dtype two operands are computed in (error on f16 vs bf16, fp8 arithmetic, ...).
DType common_dtype(Builder& b, const Operand& x, const Operand& y, const Loc& loc, std::string_view what);
// The operand as a tile of exactly this dtype and shape (literal -> constant, tile -> cast+broadcast).
Tile materialize(Builder& b, const Operand& o, DType dtype, const Shape& shape, const Loc& loc, std::string_view what);
// The operand as-is if it is a tile, or a literal in its default dtype (f32, i32/i64, i1).
Tile to_tile(Builder& b, const Operand& o, const Loc& loc);
DType default_literal_dtype(const Operand& o);
// `axis` of a tile of type t (rank >= 1) counted from 0, negative from the end; an error naming
// `what` and the valid range when out of range.
int normalize_axis(Builder& b, std::string_view what, const ir::Type& t, int axis, const Loc& loc);
// The integer dtype sums and running sums / products count in (Triton's rule): i1, i8, i16 -> i32,
// u8, u16 -> u32; every other dtype as it is.
DType widened_integer(DType d);

}  // namespace tilejit::lang::detail
