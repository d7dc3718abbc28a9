// dot: C + A x B with f32 accumulation (one rounding per output element) or i8 x i8 -> i32; batched
// (3-D tiles: the 2-D dot per leading index); input_precision tf32 rounds each f32 input first.
#include <algorithm>

#include "dsl/ir/input_precision.hpp"
#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {

void Machine::dot_op(const Op& op) {
  const ir::Shape& as = T(op.operands[0]).shape;
  const ir::Shape& bs = T(op.operands[1]).shape;
  const size_t rank = as.size();
  const size_t batch = rank == 3 ? static_cast<size_t>(as[0]) : 1;
  const size_t M = static_cast<size_t>(as[rank - 2]), K = static_cast<size_t>(as[rank - 1]), Nn = static_cast<size_t>(bs[rank - 1]);
  const Slot& A = S(op.operands[0]);
  const Slot& B = S(op.operands[1]);
  const Slot& C = S(op.operands[2]);
  Slot& R = S(op.results[0]);
  if (ir::is_float(T(op.operands[0]).dtype)) {
    const double* a_in = A.f.data();
    const double* b_in = B.f.data();
    if (ir::input_precision(op) == ir::InputPrecision::tf32) {
      // each f32 input as cvt.rna.tf32.f32 rounds it (dsl/ir/input_precision.hpp)
      const auto round = [](const std::vector<double>& in, std::vector<double>& out) {
        out.resize(in.size());
        std::transform(in.begin(), in.end(), out.begin(),
                       [](double x) { return static_cast<double>(ir::round_to_tf32(static_cast<float>(x))); });
        return out.data();
      };
      a_in = round(A.f, tf32_a_);
      b_in = round(B.f, tf32_b_);
    }
    // m, k, n order: the inner loop runs over contiguous rows of b and of the row sum; products
    // are exact in double (24-bit significands), the sum rounds to f32 once
    R.f.resize(batch * M * Nn);
    row_f_.resize(Nn);
    for (size_t p = 0; p < batch; ++p)
      for (size_t m = 0; m < M; ++m) {
        std::fill(row_f_.begin(), row_f_.end(), 0.0);
        for (size_t k = 0; k < K; ++k) {
          const double av = a_in[(p * M + m) * K + k];
          const double* brow = b_in + (p * K + k) * Nn;
          for (size_t n = 0; n < Nn; ++n) row_f_[n] += av * brow[n];
        }
        const size_t o = (p * M + m) * Nn;
        for (size_t n = 0; n < Nn; ++n) R.f[o + n] = static_cast<double>(static_cast<float>(C.f[o + n] + row_f_[n]));
      }
    return;
  }
  R.i.resize(batch * M * Nn);
  row_i_.resize(Nn);
  for (size_t p = 0; p < batch; ++p)
    for (size_t m = 0; m < M; ++m) {
      std::fill(row_i_.begin(), row_i_.end(), 0);
      for (size_t k = 0; k < K; ++k) {
        const int64_t av = A.i[(p * M + m) * K + k];
        const int64_t* brow = B.i.data() + (p * K + k) * Nn;
        for (size_t n = 0; n < Nn; ++n) row_i_[n] += av * brow[n];  // |sum| < 2^14 * K: no overflow
      }
      const size_t o = (p * M + m) * Nn;
      for (size_t n = 0; n < Nn; ++n)
        R.i[o + n] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(C.i[o + n] + row_i_[n])));
    }
}

}  // namespace tilejit::runtime::interp
