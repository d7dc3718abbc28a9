// Helpers of the attention API's tests: the API's view of a device tensor, and the configuration
// attention::forward / the recompute backward's dK/dV and dQ build for a dense bf16 call before any tuned
// choice (what the tuning tests hand to attention::detail::with_tuned_choice).
#pragma once

#include <algorithm>

#include "api/attention.hpp"
#include "api/attention/internal.hpp"
#include "runtime/device_buffer.hpp"

namespace testing {

inline tilejit::attention::detail::Config api_config(tilejit::attention::Pass pass, int64_t head_dim, bool causal) {
  namespace attention = tilejit::attention;
  attention::detail::Config a{};
  a.pass = pass;
  a.dtype = tilejit::ir::DType::bf16;
  a.head_dim = static_cast<int>(head_dim);
  a.causal = causal;
  a.sch = attention::default_schedule(pass, a.dtype, a.head_dim, causal, false, tilejit::kernels::DqReduction::recompute, false);
  if (pass == attention::Pass::forward) {
    a.positive_scale = true;
    a.persistent = attention::detail::forward_persistent(a.head_dim, false, 0, 0, false);
  } else if (pass == attention::Pass::bwd_dkdv) {
    a.lse_in_ring = attention::detail::dkdv_ring_options(a, true).lse_in_ring;
  }
  return a;
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
