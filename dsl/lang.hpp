// The kernel author's view of tilejit: `using namespace tilejit::lang;` then write kernels with
// kernel(), Tile, Var, the tile operations, memory operations and structured control flow.
#pragma once
#include "dsl/builder.hpp"
#include "dsl/combine.hpp"
#include "dsl/control.hpp"
#include "dsl/math.hpp"
#include "dsl/memory.hpp"
#include "dsl/ops.hpp"
#include "dsl/sort.hpp"
#include "dsl/tile.hpp"
