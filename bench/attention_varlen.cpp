// attention_bench --varlen-ab [--head-dim 64]: packed self-attention (cu_seqlens) through the varlen
// kernels against Options::varlen_documents (one dense call with a document mask, decision 113), in
// one process, alternated rounds. 16k tokens packed from the masks bench's document lengths (and a
// batch of short documents), D128 with 16 heads (D64: 32), bf16, causal and not; forward and
// forward + backward through the API with caller-owned workspaces. One VARLEN_AB line per case:
// the times, their ratio (varlen / documents: > 1 means the document route is faster), TFLOP/s of
// the route over the allowed area, and the largest relative difference of O between the two.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "api/attention.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/host_tensor.hpp"

namespace tilejit::attention_bench {

int bench_varlen_ab(int max_reps, int64_t head_dim) {
  const ir::DType dt = ir::DType::bf16;
  const Buffers buf;
  runtime::Stream stream;
  const int64_t D = head_dim, H = kHidden / D;
  struct Packing {
    const char* label;
    std::vector<int64_t> lens;
  };
  const std::vector<int64_t> masks_bench{1024, 3072, 512, 2560, 1536, 4096, 768, 2816};  // (bench/attention_masks.cpp's, cycled)
  std::vector<Packing> packings{{"documents_512_4096", {}}, {"documents_256", {}}};
  for (int64_t t = 0, i = 0; t < kTokens; ++i) {
    const int64_t n = std::min(masks_bench[static_cast<size_t>(i % 8)], kTokens - t);
    packings[0].lens.push_back(n), t += n;
  }
  for (int64_t t = 0; t < kTokens; t += 256) packings[1].lens.push_back(256);
  for (const Packing& p : packings)
    for (const bool causal : {false, true}) {
      const int64_t total = kTokens;
      std::vector<int32_t> cu{0};
      double area = 0;
      for (int64_t n : p.lens) cu.push_back(cu.back() + static_cast<int32_t>(n)), area += causal ? n * (n + 1) / 2.0 : double(n) * n;
      runtime::DeviceBuffer d_cu(cu.size() * 4);
      d_cu.upload(cu.data(), cu.size() * 4);
      using attention::contiguous;
      const auto packed = [&](const runtime::DeviceBuffer& b) { return contiguous(b.ptr(), dt, {total, H, D}); };
      const attention::Tensor Q = packed(buf.q), K = packed(buf.k), V = packed(buf.v), O = packed(buf.o), dO = packed(buf.dout),
                              dQ = packed(buf.dq), dK = packed(buf.dk), dV = packed(buf.dv),
                              L = contiguous(buf.lse.ptr(), ir::DType::f32, {H, total});
      attention::Options opts[2];
      for (int r = 0; r < 2; ++r) {
        opts[r].causal = causal;
        opts[r].cu_seqlens_q = opts[r].cu_seqlens_k = contiguous(d_cu.ptr(), ir::DType::i32, {static_cast<int64_t>(cu.size())});
        opts[r].max_seqlen_q = opts[r].max_seqlen_k = *std::max_element(p.lens.begin(), p.lens.end());
        opts[r].varlen_documents = r == 1;
      }
      const size_t ws_bytes = std::max({attention::forward_workspace_bytes(Q, K, opts[0]), attention::forward_workspace_bytes(Q, K, opts[1]),
                                        attention::backward_workspace_bytes(Q, K, opts[0]), attention::backward_workspace_bytes(Q, K, opts[1])});
      runtime::DeviceBuffer ws(std::max<size_t>(ws_bytes, 256));
      const attention::Workspace w{ws.ptr(), ws.bytes()};
      auto fwd = [&](int r) { attention::forward(Q, K, V, O, L, opts[r], stream.handle(), w); };
      auto both = [&](int r) {
        fwd(r);
        attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts[r], stream.handle(), w);
      };
      // O of each route (the difference is rounding: other tiles, another summation order)
      std::vector<double> outs[2];
      for (int r = 0; r < 2; ++r) {
        fwd(r);
        stream.synchronize();
        runtime::HostTensor h(dt, {total, H, D});
        buf.o.download(h.data(), h.bytes());
        outs[r] = h.to_f64();
      }
      double worst = 0, big = 0;
      for (size_t i = 0; i < outs[0].size(); ++i) worst = std::max(worst, std::abs(outs[0][i] - outs[1][i])), big = std::max(big, std::abs(outs[0][i]));
      settle([&] { both(0); }, stream);  // (decision 099: time at the clock the power cap allows)
      double ms[2][2] = {};  // [forward, both][route]
      std::vector<double> rounds[2][2];
      for (int round = 0; round < 4; ++round)
        for (int i = 0; i < 2; ++i) {
          const int r = round % 2 == 0 ? i : 1 - i;  // order swapped each round
          rounds[0][r].push_back(time_ms([&] { fwd(r); }, stream, max_reps));
          rounds[1][r].push_back(time_ms([&] { both(r); }, stream, max_reps));
        }
      for (int k = 0; k < 2; ++k)
        for (int r = 0; r < 2; ++r) ms[k][r] = median(rounds[k][r]);
      const double flops = 4.0 * area * double(H) * double(D) * 1e-9;
      std::printf("VARLEN_AB packing=%s docs=%zu D=%ld H=%ld causal=%d fwd_varlen_ms=%.4f fwd_documents_ms=%.4f fwd_speedup=%.3f "
                  "fwdbwd_varlen_ms=%.4f fwdbwd_documents_ms=%.4f fwdbwd_speedup=%.3f documents_fwd_tflops=%.1f "
                  "documents_fwdbwd_tflops=%.1f o_max_abs_diff=%.3g o_max_abs=%.3g\n",
                  p.label, p.lens.size(), static_cast<long>(D), static_cast<long>(H), causal ? 1 : 0, ms[0][0], ms[0][1], ms[0][0] / ms[0][1],
                  ms[1][0], ms[1][1], ms[1][0] / ms[1][1], flops / ms[0][1], 3.5 * flops / ms[1][1], worst, big);
      std::fflush(stdout);
    }
  return 0;
}

}  // namespace tilejit::attention_bench
