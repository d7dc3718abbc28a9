// Helpers of the attention API's tests: the API's view of a device tensor, the configuration
// attention::forward / the backward's dK/dV (recompute or atomic) and dQ build for a dense bf16 call
// before any tuned choice, and such a call's dimensions (what the tuning tests hand to
// attention::detail::with_tuned_choice).
#pragma once

#include <algorithm>

#include "api/attention.hpp"
#include "api/attention/internal.hpp"
#include "runtime/device_buffer.hpp"

namespace testing {

inline tilejit::attention::detail::Config api_config(tilejit::attention::Pass pass, int64_t head_dim, bool causal,
                                                     tilejit::kernels::DqReduction reduction = tilejit::kernels::DqReduction::recompute) {
  namespace attention = tilejit::attention;
  attention::detail::Config a{};
  a.pass = pass;
  a.dtype = tilejit::ir::DType::bf16;
  a.head_dim = static_cast<int>(head_dim);
  a.causal = causal;
  if (pass == attention::Pass::bwd_dkdv) a.reduction = static_cast<int>(reduction);
  a.sch = attention::default_schedule(pass, a.dtype, a.head_dim, causal, false, reduction, false);
  if (pass == attention::Pass::forward) {
    a.positive_scale = true;
    a.persistent = attention::detail::forward_persistent(a.head_dim, false, 0, 0, false);
  } else if (pass == attention::Pass::bwd_dkdv) {
    const attention::detail::DkdvRingOptions r = attention::detail::dkdv_ring_options(a, true);
    a.lse_in_ring = r.lse_in_ring, a.ring_producer = r.ring_producer, a.dq_writer = r.dq_writer;
  }
  return a;
}

// A dense call's dimensions: B, H (query and key heads), S (both lengths), D, causal; LSE rows
// 16-byte aligned (S % 4 == 0), as the API records them.
inline tilejit::attention::detail::Dims dense_dims(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim, bool causal) {
  tilejit::attention::detail::Dims d;
  d.batch = batch, d.heads_q = d.heads_kv = heads, d.seq_q = d.seq_k = seq, d.head_dim = head_dim, d.causal = causal;
  d.row_vectors_aligned = seq % 4 == 0;
  return d;
}

// The API's logical [B, S, H, D] view of a device tensor ([B, H, S, D] memory when `bhsd`).
inline tilejit::attention::Tensor api_view(const tilejit::runtime::DeviceTensor& t, bool bhsd) {
  tilejit::attention::Tensor v;
  v.data = t.ptr();
  v.dtype = t.dtype();
  v.rank = t.rank();
  std::copy(t.sizes().begin(), t.sizes().end(), v.sizes.begin());
  std::copy(t.strides().begin(), t.strides().end(), v.strides.begin());
  v.device = t.buffer().device();
  return bhsd ? tilejit::attention::permute(v, {0, 2, 1, 3}) : v;
}

}  // namespace testing
