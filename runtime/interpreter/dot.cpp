// dot: C + A x B with f32 accumulation (one rounding per output element) or i8 x i8 -> i32.
#include <algorithm>

#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {

void Machine::dot_op(const Op& op) {
  const ir::Shape& as = T(op.operands[0]).shape;
  const ir::Shape& bs = T(op.operands[1]).shape;
  const size_t M = static_cast<size_t>(as[0]), K = static_cast<size_t>(as[1]), Nn = static_cast<size_t>(bs[1]);
  const Slot& A = S(op.operands[0]);
  const Slot& B = S(op.operands[1]);
  const Slot& C = S(op.operands[2]);
  Slot& R = S(op.results[0]);
  if (ir::is_float(T(op.operands[0]).dtype)) {
    // m, k, n order: the inner loop runs over contiguous rows of b and of the row sum.
    R.f.resize(M * Nn);
    row_f_.resize(Nn);
    for (size_t m = 0; m < M; ++m) {
      std::fill(row_f_.begin(), row_f_.end(), 0.0);
      for (size_t k = 0; k < K; ++k) {
        const double av = A.f[m * K + k];
        const double* brow = B.f.data() + k * Nn;
        for (size_t n = 0; n < Nn; ++n) row_f_[n] += av * brow[n];
      }
      for (size_t n = 0; n < Nn; ++n)
        R.f[m * Nn + n] = static_cast<double>(static_cast<float>(C.f[m * Nn + n] + row_f_[n]));
    }
    return;
  }
  R.i.resize(M * Nn);
  row_i_.resize(Nn);
  for (size_t m = 0; m < M; ++m) {
    std::fill(row_i_.begin(), row_i_.end(), 0);
    for (size_t k = 0; k < K; ++k) {
      const int64_t av = A.i[m * K + k];
      const int64_t* brow = B.i.data() + k * Nn;
      for (size_t n = 0; n < Nn; ++n) row_i_[n] += av * brow[n];  // |sum| < 2^14 * K: no overflow
    }
    for (size_t n = 0; n < Nn; ++n)
      R.i[m * Nn + n] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(C.i[m * Nn + n] + row_i_[n])));
  }
}

}  // namespace tilejit::runtime::interp
