// The table of library kernels.
#include "kernels/registry.hpp"

#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"

namespace tilejit::kernels {

const std::vector<LibraryKernel>& library() {
  static const std::vector<LibraryKernel> all{
      {"gemm", &gemm, "C = A @ B, bf16/f16 in, f32 accumulate (TMA + wgmma pipeline when K-major on sm_90a)"},
      {"attention_fwd", &attention_forward, "FlashAttention forward with online softmax, optional causal mask"},
  };
  return all;
}

const LibraryKernel* find(const std::string& name) {
  for (const LibraryKernel& k : library())
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace tilejit::kernels
