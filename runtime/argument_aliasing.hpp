// Which kernel arguments may share memory. A kernel that writes a tensor while another argument
// reads (or writes) overlapping memory races between its programs, and the result depends on the
// schedule: the launcher refuses it. An output that is exactly an input's view (same address,
// dtype, sizes and strides) is allowed: that is the in-place kernel, which is well defined when
// each program reads its part before writing it (the kernel's author decides).
#pragma once

#include <vector>

#include "dsl/ir/function.hpp"

namespace tilejit::runtime {

struct TensorView;

// One flag per parameter: some store, atomic add, block store or semaphore signal may write
// through it (following pointers and tensor views through arithmetic, slices, selects, loop-carried
// values and branch results).
std::vector<bool> written_params(const ir::Function& f);

// Whether the bytes of two views can overlap. Interleaved views are told apart when their rows
// (unit-stride runs) or elements start at different offsets modulo a common step: the real and
// imaginary parts of complex data, or dK and dV as the two halves of one [.., 2, D] buffer, are
// disjoint. Otherwise conservative (overlap when the extents do). Empty views overlap nothing.
bool views_overlap(const TensorView& a, const TensorView& b);
bool same_view(const TensorView& a, const TensorView& b);

}  // namespace tilejit::runtime
