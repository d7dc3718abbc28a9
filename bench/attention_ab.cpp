// attention_bench's harness (attention_ab.hpp): A/B measurement and the backward's inputs.
#include "bench/attention_ab.hpp"

#include "kernels/attention/backward.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention_bench {

namespace mn = tilejit::kernels::meta_name;

AbResult ab_measure_launches(const std::array<std::function<void()>, 2>& launch, const runtime::Stream& stream,
                             std::initializer_list<const DeviceBuffer*> outputs, size_t bytes, int max_reps,
                             const std::function<void()>& before_launch) {
  std::vector<char> out[2];
  for (int on : {0, 1}) {
    if (before_launch) before_launch();
    launch[static_cast<size_t>(on)]();
    stream.synchronize();
    out[on].resize(outputs.size() * bytes);
    size_t at = 0;
    for (const DeviceBuffer* b : outputs) b->download(out[on].data() + at, bytes), at += bytes;
  }
  // the first round would otherwise run at burst clocks, before the power cap bites (decision 099)
  settle(
      [&] {
        if (before_launch) before_launch();
        launch[0]();
      },
      stream);
  std::vector<double> ms[2];
  ab_rounds([&](int on) {
    ms[on].push_back(time_ms(
        [&] {
          if (before_launch) before_launch();
          launch[static_cast<size_t>(on)]();
        },
        stream, max_reps));
  });
  return {median(ms[0]), median(ms[1]), out[0] == out[1]};
}

AbResult ab_measure_grids(std::vector<Function>& fns, const std::array<runtime::Grid, 2>& grids, const runtime::Stream& stream,
                          const std::vector<runtime::DeviceArg>& args, std::initializer_list<const DeviceBuffer*> outputs, size_t bytes,
                          int max_reps, const std::function<void()>& before_launch) {
  const auto launch = [&](size_t i) { return [&, i] { fns[i].launch(grids[i], stream.handle(), args); }; };
  return ab_measure_launches({launch(0), launch(1)}, stream, outputs, bytes, max_reps, before_launch);
}

AbResult ab_measure(std::vector<Function>& fns, const runtime::Grid& grid, const runtime::Stream& stream,
                    const std::vector<runtime::DeviceArg>& args, std::initializer_list<const DeviceBuffer*> outputs, size_t bytes,
                    int max_reps) {
  return ab_measure_grids(fns, {grid, grid}, stream, args, outputs, bytes, max_reps);
}

DeltaBuffer forward_and_delta(const Buffers& buf, const Config& c, const runtime::Stream& stream, int64_t kv_heads) {
  const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c, kv_heads);
  attention::Options fo;
  fo.causal = c.causal;
  attention::forward(Q, K, V, O, L, fo, stream.handle());
  DeviceBuffer delta(static_cast<size_t>(c.B() * c.H() * c.S) * 4);
  const attention::Schedule pre = attention::default_schedule(attention::Pass::bwd_preprocess, ir::DType::bf16, static_cast<int>(c.D), c.causal);
  jit::CompileOptions o;
  o.num_warps = pre.num_warps;
  Function prep(kernels::attention_backward_preprocess(), {{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, c.D}, {mn::kBlockM, pre.block_m}, {mn::kBshd, true}}, o);
  const attention::Tensor delta_view = attention::contiguous(delta.ptr(), ir::DType::f32, {c.B(), c.H(), c.S});
  const std::vector<runtime::DeviceArg> prep_args{O.view(), dO.view(), delta_view.view()};
  prep.launch({lang::cdiv(c.S, pre.block_m), c.H(), c.B()}, stream.handle(), prep_args);
  return {std::move(delta), delta_view};
}

}  // namespace tilejit::attention_bench
