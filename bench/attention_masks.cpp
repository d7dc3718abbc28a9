// attention_bench --masks: the library masks forward and backward (bench/flex_masks.py times
// FlexAttention on the same masks).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention/forward.hpp"
#include "api/attention.hpp"
#include "kernels/attention/mask.hpp"
#include "jit/compile.hpp"
#include "runtime/function.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "kernels/meta_names.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"

namespace tilejit::attention_bench {

namespace {

const int64_t kDocumentLengths[] = {1024, 3072, 512, 2560, 1536, 4096, 768, 2816};

}  // namespace

// --masks [--seq S] [--head-dim 64] [--with M=V,..]: the forward with library masks (issue 8) at S = 8k and 16k (or S), D128 (or 64: 32 heads), bf16, B*S = 16k,
// 16 heads; TFLOP/s count only the unmasked elements (4 * D per allowed (row, key)). Document
// masks use bench_document_lengths (bench/flex_masks.py builds the same documents for
// FlexAttention); data-dependent masks run the block-mask pre-pass first (not timed:
// FlexAttention's block mask is also built once and reused). With --with: instead, an A/B of the
// forward (the default metas against the default plus these, alternated rounds, outputs compared
// bit for bit; PERSISTENT on a persistent grid), one MASK_AB line per mask.
int bench_masks(int max_reps, int64_t only_s, const std::string& forward_with, int64_t head_dim) {
  using kernels::MaskKind;
  const ir::DType dt = ir::DType::bf16;
  const Buffers buf;
  runtime::Stream stream;
  struct MaskRun {
    const char* label;
    MaskKind kind;
    int64_t window_left = 0, window_right = 0, global = 0;
  };
  const MaskRun runs[] = {{"causal", MaskKind::causal},
                          {"causal_sliding_window_1024", MaskKind::causal_sliding_window, 1023},
                          {"sliding_window_1024", MaskKind::sliding_window, 512, 511},
                          {"causal_document", MaskKind::causal_document},
                          {"document", MaskKind::document},
                          {"global_64_sliding_window_1024", MaskKind::global_sliding_window, 512, 511, 64},
                          {"prefix_lm_half", MaskKind::prefix_lm},
                          {"block_sparse_128", MaskKind::block_sparse}};
  const std::vector<int64_t> seqs = only_s != 0 ? std::vector<int64_t>{only_s} : std::vector<int64_t>{8192, 16384};
  for (const int64_t S : seqs) {
    const Config c{S, head_dim, false};
    // the forward's tiles as the API takes them for a masked call (D 64: two programs an SM, rcp)
    const attention::Schedule fs = attention::default_schedule(attention::Pass::forward, dt, static_cast<int>(head_dim), false, false,
                                                               attention::DqReduction::recompute, false, true);
    const int64_t B = c.B(), H = c.H(), D = c.D, BM = fs.block_m, BN = fs.block_n, nb = (S + 127) / 128;
    if (BM != 128 || BN != 128) throw std::logic_error("bench_masks: the lists and tables below assume 128 x 128 forward tiles");
    const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
    // document ids [B, S] and prefix lengths [B]
    std::vector<int32_t> docs;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0, d = 0, left = kDocumentLengths[0]; t < S; ++t) {
        if (left == 0) ++d, left = kDocumentLengths[d % 8];
        docs.push_back(static_cast<int32_t>(d)), --left;
      }
    const std::vector<int32_t> prefix(static_cast<size_t>(B), static_cast<int32_t>(S / 2));
    // a block-sparse table of 128 x 128 blocks [1, 1, nb, nb] (bench_block_table: flex_masks.py
    // builds the same): the diagonal and about a third of the blocks besides
    std::vector<uint8_t> table(static_cast<size_t>(nb * nb));
    for (int64_t i = 0; i < nb; ++i)
      for (int64_t j = 0; j < nb; ++j) table[static_cast<size_t>(i * nb + j)] = i == j || (i * 7 + j * 3) % 5 < 2 ? 1 : 0;
    DeviceBuffer d_docs(docs.size() * 4), d_prefix(prefix.size() * 4), d_table(table.size());
    d_docs.upload(docs.data(), docs.size() * 4);
    d_prefix.upload(prefix.data(), prefix.size() * 4);
    d_table.upload(table.data(), table.size());
    DeviceBuffer lists(static_cast<size_t>(B * nb * (nb + 1) * 2) * 4 + static_cast<size_t>(B * nb * nb));
    for (const MaskRun& r : runs) {
      kernels::MaskSpec spec;
      spec.kind = r.kind;
      spec.window_left = r.window_left, spec.window_right = r.window_right, spec.global_tokens = r.global;
      if (r.kind == MaskKind::block_sparse) spec.block_q = spec.block_k = 128;
      const kernels::MaskData data{{docs, {B, S}}, {prefix, {B}}, {table, {1, 1, nb, nb}}};
      const int64_t allowed = kernels::allowed_count(spec, data, {B, 1, S, S}) * H;  // no kind here depends on the head
      lang::Meta meta{{mn::kDtype, dt}, {mn::kHeadDim, D}, {mn::kBlockM, BM}, {mn::kBlockN, BN}, {mn::kBshd, true}, {mn::kMask, static_cast<int>(r.kind)},
                      {mn::kPositiveScale, true}};  // as the API launches it for softmax_scale > 0
      jit::CompileOptions o;
      o.num_warps = fs.num_warps;
      o.pipeline.stages = fs.stages;
      o.min_programs_per_sm = fs.min_programs_per_sm;
      if (fs.min_programs_per_sm > 0) meta.emplace_back(mn::kExactNormalize, false);
      Function fwd(kernels::attention_forward(), meta, o);
      std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(double(D)))};
      const std::array<int64_t, 2> doc_sizes{B, S}, doc_strides{S, 1};
      const std::array<int64_t, 1> pre_sizes{B}, pre_strides{1};
      const std::array<int64_t, 4> table_sizes{1, 1, nb, nb}, table_strides{nb * nb, nb * nb, nb, 1};
      const runtime::TensorView docs_v{ir::DType::i32, doc_sizes, doc_strides, d_docs.ptr(), 0},
          prefix_v{ir::DType::i32, pre_sizes, pre_strides, d_prefix.ptr(), 0},
          table_v{ir::DType::u8, table_sizes, table_strides, d_table.ptr(), 0};
      for (const std::string& name : kernels::mask_parameter_names(r.kind)) {
        if (name == "mask_window_left") args.emplace_back(static_cast<int32_t>(r.window_left));
        else if (name == "mask_window_right") args.emplace_back(static_cast<int32_t>(r.window_right));
        else if (name == "mask_global_tokens") args.emplace_back(static_cast<int32_t>(r.global));
        else if (name == "mask_doc_ids") args.emplace_back(docs_v);
        else if (name == "mask_prefix_lengths") args.emplace_back(prefix_v);
        else if (name == "mask_block_q" || name == "mask_block_k") args.emplace_back(int32_t{128});
        else if (name == "mask_block_table") args.emplace_back(table_v);
        else throw std::logic_error("bench_masks: no argument for " + name);
      }
      // the pre-pass's lists: [B, 1, nb] counts, [B, 1, nb, nb] indices (document masks: per batch)
      const std::array<int64_t, 4> cls_sizes{B, 1, nb, nb}, cls_strides{nb * nb, nb * nb, nb, 1};
      const std::array<int64_t, 3> num_sizes{B, 1, nb}, num_strides{nb, nb, 1};
      const uint64_t base = lists.ptr(), n_bytes = static_cast<uint64_t>(B * nb) * 4, i_bytes = n_bytes * static_cast<uint64_t>(nb);
      const runtime::TensorView num{ir::DType::i32, num_sizes, num_strides, base, 0},
          idx{ir::DType::i32, cls_sizes, cls_strides, base + n_bytes, 0},
          full_num{ir::DType::i32, num_sizes, num_strides, base + n_bytes + i_bytes, 0},
          full_idx{ir::DType::i32, cls_sizes, cls_strides, base + 2 * n_bytes + i_bytes, 0},
          classes{ir::DType::u8, cls_sizes, cls_strides, base + 2 * (n_bytes + i_bytes), 0};
      double prepass_ms = 0, classes_ms = 0;  // kinds with tile intervals have no pre-pass
      if (!kernels::mask_has_tile_intervals(r.kind)) {
        // the pre-pass: classes (one program per tile), then the lists (one per query tile)
        // at the API's TILES (kernels::kBlockClassTiles key tiles per program)
        const int64_t tiles = kernels::kBlockClassTiles, gy = (nb + tiles - 1) / tiles;
        Function classify(kernels::attention_block_classes(),
                          {{mn::kBlockM, BM}, {mn::kBlockN, BN}, {mn::kMask, static_cast<int>(r.kind)}, {mn::kTiles, tiles}}, o);
        jit::CompileOptions lo;
        lo.num_warps = 4;
        Function build_lists(kernels::attention_block_lists(), {{mn::kKvMajor, false}}, lo);
        std::vector<runtime::DeviceArg> cargs{classes, static_cast<int32_t>(S), static_cast<int32_t>(S)};
        cargs.insert(cargs.end(), args.begin() + 6, args.end());
        const std::vector<runtime::DeviceArg> largs{classes, num, idx, full_num, full_idx};
        const auto pre = [&] {
          classify.launch({nb, gy, B}, stream.handle(), cargs);
          build_lists.launch({nb, 1, B}, stream.handle(), largs);
        };
        pre();
        // what one pre-pass costs (the backward runs one more per call, at its kernels' tiles), and
        // its classification alone
        prepass_ms = time_ms(pre, stream, max_reps);
        classes_ms = time_ms([&] { classify.launch({nb, gy, B}, stream.handle(), cargs); }, stream, max_reps);
        for (int t : {1, 16}) {  // the classification at other TILES, for comparison
          Function ct(kernels::attention_block_classes(), {{mn::kBlockM, BM}, {mn::kBlockN, BN}, {mn::kMask, static_cast<int>(r.kind)}, {mn::kTiles, t}}, o);
          const int64_t gt = (nb + t - 1) / t;
          ct.launch({nb, gt, B}, stream.handle(), cargs);
          std::printf("MASK_CLASSES name=%s S=%ld tiles=%d ms=%.4f\n", r.label, static_cast<long>(S), t,
                      time_ms([&] { ct.launch({nb, gt, B}, stream.handle(), cargs); }, stream, max_reps));
        }
        for (const auto& t : {num, idx, full_num, full_idx}) args.emplace_back(t);
      }
      const runtime::Grid grid{nb, H, B};
      if (!forward_with.empty()) {
        const lang::Meta with = bench_util::parse_with_values(forward_with);
        const auto on_in = [&](const char* name) {
          return std::ranges::any_of(with, [&](const auto& m) { return m.first == name && m.second == ir::MetaValue{true}; });
        };
        const bool persistent = on_in(mn::kPersistent);
        lang::Meta on = meta;
        on.insert(on.end(), with.begin(), with.end());
        std::vector<Function> fns;
        fns.emplace_back(kernels::attention_forward(), meta, o);
        fns.emplace_back(kernels::attention_forward(), on, o);
        // (PERSISTENT: a 1-D grid of resident programs walks the tiles, as the API launches it)
        const runtime::Grid on_grid = persistent ? fns[1].gpu_kernel().persistent_grid(nb * H * B) : grid;
        const AbResult ab = ab_measure_grids(fns, {grid, on_grid}, stream, args, {&buf.o}, static_cast<size_t>(B * S * H * D * 2), max_reps);
        std::printf("MASK_AB %s name=%s S=%ld off_ms=%.4f on_ms=%.4f speedup=%.3f outputs_identical=%d\n", forward_with.c_str(), r.label,
                    static_cast<long>(S), ab.off_ms, ab.on_ms, ab.off_ms / ab.on_ms, ab.identical ? 1 : 0);
        std::fflush(stdout);
        continue;
      }
      // (the attention timings queued and settled, as bench/flex_masks.py times FlexAttention: decision 099)
      const double ms = queued_ms([&] { fwd.launch(grid, stream.handle(), args); }, stream);
      const double tflops = 4.0 * static_cast<double>(D) * static_cast<double>(allowed) / (ms * 1e-3) / 1e12;
      // The backward through the API (its pre-passes included: dK/dV's and dQ's lists are built at
      // their own tiles on every call), after one forward through the API for O and LSE.
      attention::Options opts;
      if (r.kind == MaskKind::causal) {
        opts.causal = true;
      } else {
        attention::Mask m;
        m.spec = spec;
        if (kernels::mask_uses_doc_ids(r.kind)) m.doc_ids = attention::contiguous(d_docs.ptr(), ir::DType::i32, {B, S});
        if (r.kind == MaskKind::prefix_lm) m.prefix_lengths = attention::contiguous(d_prefix.ptr(), ir::DType::i32, {B});
        if (r.kind == MaskKind::block_sparse) m.block_table = attention::contiguous(d_table.ptr(), ir::DType::u8, {1, 1, nb, nb});
        opts.mask = m;
      }
      // bwd: the API's default (atomic at D 128 since decision 104; recompute with `deterministic`);
      // bwd_recompute: deterministic, dQ by its own kernel; bwd_atomic: dQ's parts added into a
      // workspace by the dK/dV kernel (5 matmuls, one pre-pass; FlexAttention's kind)
      attention::Options atomic = opts, recompute = opts;
      atomic.dq_reduction = attention::DqReduction::atomic;
      recompute.dq_reduction = attention::DqReduction::recompute;
      DeviceBuffer ws(std::max({attention::backward_workspace_bytes(Q, K, opts), attention::backward_workspace_bytes(Q, K, atomic),
                                attention::backward_workspace_bytes(Q, K, recompute), attention::forward_workspace_bytes(Q, K, opts)}) +
                      256);
      const attention::Workspace w{ws.ptr(), ws.bytes()};
      attention::forward(Q, K, V, O, L, opts, stream.handle(), {ws.ptr(), ws.bytes()});
      const double bwd_ms = queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), w); }, stream);
      const double bwd_recompute_ms =
          queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, recompute, stream.handle(), w); }, stream);
      const double bwd_atomic_ms =
          queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, atomic, stream.handle(), w); }, stream);
      // bwd_prebuilt: the default backward with a block mask built once (build_block_mask, not
      // timed: FlexAttention's usage, one block mask per step for every layer)
      double bwd_prebuilt_ms = bwd_ms;
      if (const size_t bm_bytes = attention::block_mask_bytes(Q, K, opts); bm_bytes > 0) {
        DeviceBuffer bm_storage(bm_bytes);
        const attention::BlockMask bm = attention::build_block_mask(Q, K, opts, {bm_storage.ptr(), bm_storage.bytes()}, stream.handle());
        attention::Options prebuilt = opts;
        prebuilt.block_mask = &bm;
        bwd_prebuilt_ms = queued_ms([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, prebuilt, stream.handle(), w); }, stream);
      }
      const double bwd_flop = 2.5 * 4.0 * static_cast<double>(D) * static_cast<double>(allowed);
      std::printf("MASK name=%s S=%ld B=%ld H=%ld D=%ld density=%.4f fwd_ms=%.4f fwd_tflops=%.1f bwd_ms=%.4f bwd_tflops=%.1f "
                  "bwd_recompute_ms=%.4f bwd_recompute_tflops=%.1f bwd_atomic_ms=%.4f bwd_atomic_tflops=%.1f bwd_prebuilt_ms=%.4f bwd_prebuilt_tflops=%.1f fwd_prepass_ms=%.4f "
                  "fwd_prepass_classes_ms=%.4f\n",
                  r.label, static_cast<long>(S), static_cast<long>(B), static_cast<long>(H), static_cast<long>(D),
                  static_cast<double>(allowed) / (static_cast<double>(B * H) * double(S) * double(S)), ms, tflops, bwd_ms,
                  bwd_flop / (bwd_ms * 1e-3) / 1e12, bwd_recompute_ms, bwd_flop / (bwd_recompute_ms * 1e-3) / 1e12, bwd_atomic_ms, bwd_flop / (bwd_atomic_ms * 1e-3) / 1e12, bwd_prebuilt_ms,
                  bwd_flop / (bwd_prebuilt_ms * 1e-3) / 1e12, prepass_ms, classes_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace tilejit::attention_bench
