// The read-modify-write atomics beyond the relaxed add (ops atomic_rmw and atomic_cas): what they
// compute, their memory ordering and their scope, as the IR's attributes name them.
#pragma once

#include <optional>
#include <string_view>

#include "dsl/ir/dtype.hpp"

namespace tilejit::ir {

enum class AtomicRmw : uint8_t { add, max, min, and_, or_, xor_, xchg };
// PTX's orders: relaxed, acquire (later accesses stay after), release (earlier ones stay before),
// acq_rel (both).
enum class MemSem : uint8_t { relaxed, acquire, release, acq_rel };
// Who the ordering and atomicity are promised to: the program (CTA), the GPU, the system.
enum class MemScope : uint8_t { cta, gpu, sys };

std::string_view name(AtomicRmw k);
std::string_view name(MemSem s);
std::string_view name(MemScope s);
std::optional<AtomicRmw> parse_atomic_rmw(std::string_view s);
std::optional<MemSem> parse_mem_sem(std::string_view s);
std::optional<MemScope> parse_mem_scope(std::string_view s);

// "" when `rmw` (or compare-and-swap, when nullopt) takes elements of `d`, else the valid dtypes.
std::string atomic_dtype_error(std::optional<AtomicRmw> rmw, DType d);

}  // namespace tilejit::ir
