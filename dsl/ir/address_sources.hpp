// Which parameters each pointer or tensor value of a kernel may point into: the provenance that the
// launcher's aliasing check (runtime/argument_aliasing) and the lowering's ordering of global
// memory between threads (jit/lower) both need.
#pragma once
#include <cstddef>
#include <map>
#include <set>

#include "dsl/ir/function.hpp"

namespace tilejit::ir {

using AddressSources = std::map<ValueId, std::set<size_t>>;  // value -> parameter indices

// A parameter's address flows to every address-carrying result of an op that reads it, and through
// region ops to their block arguments and results (loop-carried pointers, branch results): a
// fixpoint over the whole body. Values absent from the map carry no parameter's address.
AddressSources address_sources(const Function& f);

}  // namespace tilejit::ir
