// Structured control flow: counted loops with loop-carried Vars, and ifs on scalar conditions.
// The body lambdas run once, at build time, to record the loop/if body as an IR region.
#pragma once
#include <functional>
#include <source_location>

#include "dsl/builder.hpp"

namespace tilejit::lang {

// for (i = lb; i < ub; i += step) body(i). Bounds are runtime integer scalars (or numbers); step
// must be positive. Every Var declared outside and reassigned inside becomes loop-carried.
void for_range(const Operand& lb, const Operand& ub, const Operand& step, const std::function<void(Tile)>& body,
               std::source_location loc = std::source_location::current());
void for_range(const Operand& lb, const Operand& ub, const std::function<void(Tile)>& body,
               std::source_location loc = std::source_location::current());

// if (cond) then_body() else else_body(). cond is an i1 scalar. Vars reassigned in either branch
// take the branch's value afterwards.
void if_(const Operand& cond, const std::function<void()>& then_body,
         std::source_location loc = std::source_location::current());
void if_(const Operand& cond, const std::function<void()>& then_body, const std::function<void()>& else_body,
         std::source_location loc = std::source_location::current());

}  // namespace tilejit::lang
