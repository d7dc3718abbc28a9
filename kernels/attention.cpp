// Attention forward: for a block of query rows, stream key/value blocks, keep the running row
// max m, row sum l and output accumulator, rescaling by exp2(m_old - m_new) as the max grows.
#include "kernels/attention.hpp"

#include <cmath>

namespace tilejit::kernels {

using namespace lang;

const Kernel& attention_forward() {
  static const Kernel k = kernel("attention_fwd", [](Builder& kb) {
    auto T = kb.meta_dtype("DTYPE", bf16);
    auto BM = kb.meta<int>("BLOCK_M", 64), BN = kb.meta<int>("BLOCK_N", 64), D = kb.meta<int>("HEAD_DIM", 64);
    auto causal = kb.meta<bool>("CAUSAL", false);
    const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
    auto Q = kb.tensor("Q", T, 4, row_major), K = kb.tensor("K", T, 4, row_major), V = kb.tensor("V", T, 4, row_major);
    auto O = kb.tensor("O", T, 4, row_major);
    auto LSE = kb.tensor("LSE", f32, 3, {.contiguous_last = true});
    auto softmax_scale = kb.scalar<float>("softmax_scale");

    auto m0 = program_id(0) * BM, h = program_id(1), b = program_id(2);
    auto S_k = K.size(2);
    auto rows = m0 + arange(0, BM);
    auto qk_scale = softmax_scale * 1.4426950408889634;  // log2(e): exp(x) = exp2(x * log2 e)

    auto q = load(Q.block({b, h, m0, 0}, {BM, D}));
    Var acc = zeros(f32, {BM, D});
    Var m = full(f32, {BM}, -INFINITY);  // running row max (log2 units)
    Var l = zeros(f32, {BM});            // running row sum of exp2
    Tile n_end = causal ? minimum(S_k, m0 + BM) : S_k;
    for_range(0, n_end, BN, [&](Tile n0) {
      auto s = dot(q, trans(load(K.block({b, h, n0, 0}, {BN, D})))) * qk_scale;
      auto cols = n0 + arange(0, BN);
      Tile valid = cols[row] < S_k;
      if (causal) valid = valid & (cols[row] <= rows[col]);
      s = where(valid, s, -INFINITY);
      auto m_new = maximum(m, max(s, 1));
      auto p = exp2(s - m_new[col]);
      auto alpha = exp2(m - m_new);
      l = l * alpha + sum(p, 1);
      acc = acc * alpha[col] + dot(cast(T, p), load(V.block({b, h, n0, 0}, {BN, D})));
      m = m_new;
    });
    store(O.block({b, h, m0, 0}, {BM, D}), cast(T, acc / l[col]));
    store(LSE.block({b, h, m0}, {BM}), (m + log2(l)) * 0.6931471805599453);  // back to natural log
  });
  return k;
}

}  // namespace tilejit::kernels
