// What the planners may assume about an integer scalar of the tile IR on every execution, from
// the ops that compute it: the largest power of two (at most kMaxDivisor) dividing its value, and
// whether it is never negative. TMA needs both: on the H100 a box whose innermost coordinate does
// not start on 16 bytes, or a reduce at a negative coordinate, is an illegal instruction (found by
// the fuzzer: a dot of windows at K offset 3).
#pragma once
#include <cstdint>
#include <map>
#include <optional>

#include "dsl/ir/function.hpp"

namespace tilejit::jit {

class ScalarFacts {
 public:
  static constexpr int64_t kMaxDivisor = 1 << 12;
  explicit ScalarFacts(const ir::Function& f);
  // Constants, + - *, << by a constant, integer casts, a loop counter from its lower bound and
  // step; 1 for what is unknown (parameters, loads, program ids).
  int64_t divisor(ir::ValueId v) const;
  // The values v may take, from constants, program ids (axis 0 below 2^31, y and z below 2^16),
  // tensor sizes, unsigned types, loop counters and what + - * << >> / % max min select and casts
  // make of them -- nothing where an operation may wrap in its type (i8 53 * 8 is -88: a TMA
  // store at a coordinate "proved" non-negative faulted, found by the fuzzer).
  struct Range {
    int64_t lo, hi;
  };
  std::optional<Range> range(ir::ValueId v) const;
  // An index: program ids and counts, tensor sizes, loop counters from a non-negative start, and
  // + * << / % max min select of indices with small non-negative constants (below 2^16). Taken
  // never to wrap and never to pass 2^31 - 1 - a box: that needs grids or tensors of 2^31 / (the
  // constants) elements along one dim (a TMA store there would fault where the interpreter wraps).
  bool index_like(ir::ValueId v) const;
  // Whether range(v) is known and starts at 0 or above, or v is an index.
  bool non_negative(ir::ValueId v) const;
  // The value of an integer constant op (nothing for what is computed).
  std::optional<int64_t> constant(ir::ValueId v) const;

 private:
  void index(const ir::Block& b);
  const ir::Op* def(ir::ValueId v) const;
  const ir::Function& f_;
  std::map<ir::ValueId, const ir::Op*> def_;   // value -> the op that defines it
  std::map<ir::ValueId, const ir::Op*> loop_;  // a for_ counter -> its loop
  std::map<ir::ValueId, int64_t> param_divisor_;  // integer scalar parameters: ParamSpec::divisible_by
  std::optional<Range> compute_range(ir::ValueId v) const;
  mutable std::map<ir::ValueId, int64_t> divisor_;
  mutable std::map<ir::ValueId, std::optional<Range>> range_;
};

// The largest power of two dividing c, at most cap (cap for 0).
int64_t pow2_dividing(int64_t c, int64_t cap);

// Whether a TMA box at `inner_offset` (the window's offset on the tensor's contiguous dim) starts
// on a 16-byte boundary for elements of `dtype` whatever the offset's run-time value.
bool tma_inner_offset_aligned(const ScalarFacts& facts, ir::ValueId inner_offset, ir::DType dtype);

}  // namespace tilejit::jit
