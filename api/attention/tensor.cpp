// The public Tensor helpers (view, describe, contiguous, strided, permute) and the names of passes and
// dQ reductions: plain value code, no kernels.
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <stdexcept>

#include "api/attention.hpp"
#include "kernels/attention/backward.hpp"

namespace tilejit::attention {

std::string Tensor::describe() const { return view().describe(); }

runtime::TensorView Tensor::view() const {
  const auto n = static_cast<size_t>(std::clamp(rank, 0, 4));
  return runtime::TensorView{dtype, std::span<const int64_t>(sizes.data(), n), std::span<const int64_t>(strides.data(), n), data,
                             device};
}

Tensor contiguous(uint64_t data, ir::DType dtype, std::initializer_list<int64_t> sizes, int device) {
  if (sizes.size() > 4) throw std::invalid_argument(fmt::format("tilejit::attention::contiguous: rank {} > 4", sizes.size()));
  Tensor t{data, dtype, static_cast<int>(sizes.size()), {}, {}, device};
  std::ranges::copy(sizes, t.sizes.begin());
  int64_t s = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[static_cast<size_t>(d)] = s;
    s *= t.size(d);
  }
  return t;
}

Tensor strided(uint64_t data, ir::DType dtype, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
               int device) {
  if (sizes.size() > 4 || sizes.size() != strides.size())
    throw std::invalid_argument(fmt::format("tilejit::attention::strided: {} sizes and {} strides (rank at most 4, one stride per size)",
                                            sizes.size(), strides.size()));
  Tensor t{data, dtype, static_cast<int>(sizes.size()), {}, {}, device};
  std::ranges::copy(sizes, t.sizes.begin());
  std::ranges::copy(strides, t.strides.begin());
  return t;
}

Tensor permute(const Tensor& t, std::initializer_list<int> order) {
  if (static_cast<int>(order.size()) != t.rank)
    throw std::invalid_argument(fmt::format("tilejit::attention::permute: {} dims in the order for {}", order.size(), t.describe()));
  Tensor r = t;
  size_t i = 0;
  for (int src : order) {
    if (src < 0 || src >= t.rank) throw std::invalid_argument(fmt::format("tilejit::attention::permute: no dim {} in {}", src, t.describe()));
    r.sizes[i] = t.size(src);
    r.strides[i] = t.stride(src);
    ++i;
  }
  return r;
}

const char* name(Pass p) {
  switch (p) {
    case Pass::forward: return "attention_fwd";
    case Pass::bwd_preprocess: return "attention_bwd_preprocess";
    case Pass::bwd_dkdv: return "attention_bwd_dkdv";
    case Pass::bwd_dq: return "attention_bwd_dq";
    case Pass::bwd_dq_convert: return "attention_bwd_dq_convert";
    case Pass::bwd_dq_reduce: return "attention_bwd_dq_reduce";
  }
  return "?";
}

const char* name(DqReduction r) { return kernels::dq_reduction_name(static_cast<kernels::DqReduction>(r)); }

const char* name(BackwardPhase p) {
  switch (p) {
    case BackwardPhase::all: return "all";
    case BackwardPhase::dkdv: return "dkdv";
    case BackwardPhase::dq: return "dq";
  }
  return "?";
}

}  // namespace tilejit::attention
