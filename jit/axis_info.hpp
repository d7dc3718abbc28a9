// Per-dimension facts about integer and pointer tiles, as Triton's AxisInfo: along each dim,
// runs of `contiguity` elements whose values step by one (pointers: by one element), the power of
// two dividing each run's first value (`divisibility`; pointers in bytes), and runs of
// `constancy` equal elements. Runs start at indices that are multiples of their length. The
// lowering vectorises pointer loads where a thread's consecutive registers fall in one aligned
// run and the mask is constant across them.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/scalar_facts.hpp"

namespace tilejit::jit {

struct AxisFacts {
  std::vector<int64_t> contiguity, divisibility, constancy;  // one per dim
};

class AxisInfo {
 public:
  static constexpr int64_t kMaxDivisibility = 1 << 12;
  AxisInfo(const ir::Function& f, const ScalarFacts& facts);
  // The facts of tile v (all ones for what is not modelled; nothing for scalars).
  AxisFacts of(ir::ValueId v) const;

 private:
  void visit(const ir::Block& b);
  AxisFacts compute(const ir::Op& op) const;
  // integers by ScalarFacts, pointers by their spec; a tensor parameter's base and outer strides by
  // its align_bytes
  int64_t scalar_divisibility(ir::ValueId v) const;
  // Whether v is 1 wherever it is computed: a constant, or the innermost stride of a tensor
  // parameter declared contiguous_last (each launch checks it)
  bool is_one(ir::ValueId v) const;
  const ir::Param* tensor_param(ir::ValueId v) const;
  const ir::Function& f_;
  const ScalarFacts& facts_;
  std::map<ir::ValueId, int64_t> pointer_align_;  // pointer parameters: their declared alignment in bytes
  std::map<ir::ValueId, const ir::Param*> tensor_params_;
  std::map<ir::ValueId, const ir::Op*> def_;
  std::map<ir::ValueId, AxisFacts> facts_of_;
};

}  // namespace tilejit::jit
