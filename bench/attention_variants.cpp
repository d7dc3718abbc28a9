// attention_bench --forward-variants, --dq-variants / --dq-ab and --mask-kernel: a kernel at other
// schedules than the API's default, in one process.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention/forward.hpp"
#include "api/attention.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/dropout_mask.hpp"
#include "jit/compile.hpp"
#include "api/registry.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/function.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "kernels/meta_names.hpp"
#include "bench/bench_util.hpp"
#include "bench/attention_ab.hpp"
#include "bench/attention_modes.hpp"

namespace tilejit::attention_bench {

namespace {
namespace mn = tilejit::kernels::meta_name;
}  // namespace

// --forward-variants: the forward at D64 S4k (full and causal) under a few schedules, with the
// output normalised by division (EXACT_NORMALIZE, which lets ptxas serialise the wgmma) or rcp;
// every variant compiled and checked first, then timed in 3 rotated rounds after the clock settled.
int bench_forward_variants(int max_reps, int64_t only_d, double dropout_p, bool only_default, const std::string& extra_meta) {
  const Buffers buf;
  runtime::Stream stream;
  struct Variant {
    int bm, bn, warps, stages;
    bool exact;
    int min_programs_per_sm = 0;  // CompileOptions::min_programs_per_sm (ptxas caps the registers)
    // RNG_WARPS (fused dropout on warps of their own: `warps` + rng_warps in all) and the roles'
    // setmaxnreg (MMA_REGISTERS / RNG_REGISTERS)
    int rng_warps = 0, mma_registers = 0, rng_registers = 0;
    bool pipeline_pv = false;  // PIPELINE_PV (the D 128 default's loop; with RNG_WARPS the producer is off)
  };
  // The first of each list is the API's default (attention::default_schedule); smaller tiles on 4
  // warps fit several programs per multiprocessor (more warps per scheduler to hide latency).
  // (D 64: without dropout the default is register-bound for two programs per SM, with dropout it
  // is 64 x 128 on 4 warps)
  const std::vector<Variant> d64{{128, 128, 8, 2, false, 2}, {128, 128, 8, 2, true},  {128, 128, 8, 2, false}, {128, 64, 8, 2, false},
                                 {64, 128, 4, 2, false},     {64, 128, 4, 2, true},   {64, 128, 4, 3, false},  {64, 64, 4, 2, false},
                                 {64, 32, 4, 2, false},      {64, 32, 4, 3, false},   {64, 128, 4, 2, false, 4}};
  const std::vector<Variant> d64_dropout{{64, 128, 4, 2, false},        {128, 128, 8, 2, false},          {128, 128, 8, 2, false, 2},
                                         {64, 128, 4, 2, false, 4},       {64, 64, 4, 2, false},            {64, 32, 4, 2, false},
                                         {64, 128, 4, 2, false, 0, 4},    {128, 128, 8, 2, false, 0, 4, 216, 72}};
  const std::vector<Variant> d128{{128, 128, 8, 2, false}, {128, 128, 8, 3, false}, {128, 64, 8, 2, false}, {128, 64, 8, 3, false},
                                  {64, 128, 4, 2, false}, {64, 64, 4, 2, false},
                                  {64, 64, 4, 3, false},   {64, 32, 4, 2, false},  {64, 32, 4, 3, false},  {64, 32, 4, 4, false}};
  const std::vector<Variant> d128_dropout{{128, 128, 8, 2, false}, {128, 128, 8, 2, false, 0, 4, 216, 72}, {128, 128, 8, 2, false, 0, 4, 232, 40},
                                          {64, 128, 4, 2, false, 0, 4}, {128, 128, 8, 2, false, 0, 4, 232, 40, true}};
  std::vector<int64_t> dims{64, 128};
  if (only_d) dims = {only_d};
  const std::vector<bool> dropouts{dropout_p > 0};
  for (int64_t D : dims)
    for (bool dropout : dropouts)
      for (bool causal : {false, true}) {
        const Config c{4096, D, causal};
        const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
        std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), O.view(), L.view(), static_cast<float>(1 / std::sqrt(double(D)))};
        if (dropout)
          add_dropout_key(args, dropout_p);
        const size_t out_elems = static_cast<size_t>(c.B() * c.S * c.H() * D);
        std::vector<uint16_t> reference, out(out_elems);
        // compiled and checked first, then timed in rotated rounds after the clock settled: timed
        // one by one, each right after its own compile (the GPU idle), they ran at burst clocks,
        // the first most (decision 099)
        struct Built {
          std::string name;
          std::unique_ptr<Function> fn;
          runtime::Grid grid;
          double max_diff = 0;
          std::vector<double> ms;
        };
        std::vector<Built> built;
        const std::vector<Variant>& variants = D == 64 ? (dropout ? d64_dropout : d64) : (dropout ? d128_dropout : d128);
        for (const Variant& v : variants) {
          if (only_default && &v != &variants.front()) break;  // --quick: the default alone (profiling)
          lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D},        {mn::kBlockM, v.bm},      {mn::kBlockN, v.bn},
                          {mn::kBshd, true},           {mn::kCausal, causal},     {mn::kDropout, dropout},   {mn::kExactNormalize, v.exact},
                          {mn::kPositiveScale, true}};  // (as the API launches it)
          for (const auto& [name, value] : parse_with(extra_meta)) meta.emplace_back(name, value);  // --with M[=0|1],..
          if (v.rng_warps)
            meta.insert(meta.end(), {{mn::kRngWarps, v.rng_warps}, {mn::kMmaRegisters, v.mma_registers}, {mn::kRngRegisters, v.rng_registers}});
          if (v.pipeline_pv) meta.emplace_back(mn::kPipelinePv, true);
          jit::CompileOptions o;
          o.num_warps = v.warps + v.rng_warps;
          o.pipeline.stages = v.stages;
          o.min_programs_per_sm = v.min_programs_per_sm;
          const std::string name = fmt::format("D={} causal={} dropout={} tile={}x{} warps={} stages={} exact={} min_programs_per_sm={} "
                                               "rng_warps={} registers={}/{}{}", D, causal ? 1 : 0, dropout ? 1 : 0, v.bm, v.bn, v.warps,
                                               v.stages, v.exact ? 1 : 0, v.min_programs_per_sm, v.rng_warps, v.mma_registers, v.rng_registers,
                                               v.pipeline_pv ? " PIPELINE_PV" : "");
          try {
            auto fn = std::make_unique<Function>(kernels::attention_forward(), meta, o);
            const runtime::Grid grid{lang::cdiv(c.S, v.bm), c.H(), c.B()};
            fn->launch(grid, stream.handle(), args);
            stream.synchronize();
            buf.o.download(out.data(), out_elems * 2);
            // every variant computes the same function (the dropout mask does not depend on tiles):
            // outputs may differ by accumulation order only
            double max_diff = 0;
            if (reference.empty()) reference = out;
            for (size_t i = 0; i < out_elems; i += 7)
              max_diff = std::max(max_diff, std::abs(double(bf16_to_float(out[i])) - double(bf16_to_float(reference[i]))));
            built.push_back({name, std::move(fn), grid, max_diff, {}});
          } catch (const std::exception& e) {
            std::printf("FWD_VARIANT %s failed: %s\n", name.c_str(), e.what());
          }
        }
        if (built.empty()) continue;
        settle([&] { built[0].fn->launch(built[0].grid, stream.handle(), args); }, stream);
        bench_util::rotated_rounds(3, static_cast<int>(built.size()), [&](int i) {
          Built& b = built[static_cast<size_t>(i)];
          b.ms.push_back(time_ms([&] { b.fn->launch(b.grid, stream.handle(), args); }, stream, max_reps));
        });
        const double default_ms = median(built[0].ms);
        for (const Built& b : built) {
          const double ms = median(b.ms);
          std::printf("FWD_VARIANT %s programs_per_sm=%d ms=%.4f tflops=%.1f vs_default=%.3f max_diff=%.3g\n", b.name.c_str(),
                      b.fn->gpu_kernel().max_resident_per_sm(), ms, c.fwd_flops() / (ms * 1e-3) / 1e12, default_ms / ms, b.max_diff);
        }
        std::fflush(stdout);
      }
  return 0;
}

// --dq-variants [--dropout P]: the dQ kernel (recompute) alone at other BLOCK_M / BLOCK_N / warps /
// stages than the default (each on its own grid), D 64/128 S4k, full and causal, with fused dropout
// when P > 0 (the default then is dropout's); outputs compared bit for bit (a different BLOCK_N sums
// in another order: expect differences there).
// --dq-ab META [--dropout P] [--with M,..] [--head-dim D]: the dQ kernel at the API's default tiles
// with bool META off / on (--with: on in both; DROPOUT_BITS reads random mask words), S 4k, full and
// causal; outputs compared bit for bit.
int bench_dq_variants(int max_reps, double dropout_p, int64_t only_d, const std::string& ab_meta, const std::string& with_meta) {
  const bool dropout = dropout_p > 0;
  const Buffers buf;
  runtime::Stream stream;
  struct Variant {
    int bn, warps, stages, bm = 0;  // bm 0: the default's BLOCK_M
  };
  for (int64_t D : only_d ? std::vector<int64_t>{only_d} : std::vector<int64_t>{64, 128})
    for (bool causal : {false, true}) {
      const Config c{4096, D, causal};
      const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
      const DeltaBuffer delta = forward_and_delta(buf, c, stream);
      const attention::Tensor& delta_view = delta.view;
      const attention::Schedule sch = attention::default_schedule(attention::Pass::bwd_dq, ir::DType::bf16, static_cast<int>(D), causal,
                                                                  false, attention::DqReduction::recompute, dropout);
      const auto make = [&](Variant v, std::optional<bool> ab_on = std::nullopt) {
        lang::Meta meta{{mn::kDtype, ir::DType::bf16}, {mn::kHeadDim, D},      {mn::kBlockM, v.bm ? v.bm : sch.block_m},
                        {mn::kBlockN, v.bn},          {mn::kBshd, true},       {mn::kCausal, causal}};
        if (dropout) meta.emplace_back(mn::kDropout, true);
        for (const auto& [name, value] : bench_util::parse_with(with_meta)) meta.emplace_back(name, value);
        if (ab_on)
          for (const auto& [name, value] : bench_util::parse_with(ab_meta)) meta.emplace_back(name, *ab_on && value);
        jit::CompileOptions o;
        o.num_warps = v.warps;
        o.pipeline.stages = v.stages;
        return Function(kernels::attention_backward_dq(), meta, o);
      };
      std::vector<runtime::DeviceArg> args{Q.view(), K.view(), V.view(), dO.view(), L.view(), delta_view.view(), dQ.view(),
                                           static_cast<float>(1 / std::sqrt(double(D)))};
      if (dropout) add_dropout_key(args, dropout_p);
      const bool bits = meta_flag(make({sch.block_n, sch.num_warps, sch.stages}), mn::kDropoutBits);
      const auto bits_buffer = add_random_mask_words(args, c, bits);
      if (!ab_meta.empty()) {
        std::vector<Function> fns;
        for (bool on : {false, true}) fns.push_back(make({sch.block_n, sch.num_warps, sch.stages}, on));
        // (--dq-ab DROPOUT_BITS: only the on variant takes the words; their random values differ from the
        // fused mask, so the outputs do too)
        std::array<std::vector<runtime::DeviceArg>, 2> variant_args{args, args};
        const auto ab_words = add_random_mask_words(variant_args[1], c, !bits && meta_flag(fns[1], mn::kDropoutBits));
        const runtime::Grid grid{lang::cdiv(c.S, sch.block_m), c.H(), c.B()};
        const auto launch = [&](size_t i) { return [&, i] { fns[i].launch(grid, stream.handle(), variant_args[i]); }; };
        const AbResult r = ab_measure_launches({launch(0), launch(1)}, stream, {&buf.dq}, static_cast<size_t>(c.B() * c.S * c.H() * D * 2),
                                               max_reps);
        std::printf("DQ_AB %s D=%ld causal=%d dropout=%g bits=%d tiles=%dx%d/%dw/%ds registers=%d/%d off_ms=%.4f on_ms=%.4f speedup=%.3f "
                    "outputs_identical=%d\n",
                    ab_meta.c_str(), static_cast<long>(D), causal ? 1 : 0, dropout ? dropout_p : 0.0, bits ? 1 : 0, sch.block_m, sch.block_n,
                    sch.num_warps, sch.stages, fns[0].compiled().info.registers, fns[1].compiled().info.registers, r.off_ms, r.on_ms,
                    r.off_ms / r.on_ms, r.identical ? 1 : 0);
        std::fflush(stdout);
        continue;
      }
      for (Variant v : {Variant{32, sch.num_warps, sch.stages}, Variant{sch.block_n, sch.num_warps, 1}, Variant{32, sch.num_warps, 3},
                        Variant{128, sch.num_warps, sch.stages}, Variant{sch.block_n, 8, sch.stages, 128},
                        Variant{sch.block_n, 8, 3, 128}, Variant{128, 8, sch.stages, 128}, Variant{sch.block_n, 8, sch.stages}}) {
        std::vector<Function> fns;
        fns.push_back(make({sch.block_n, sch.num_warps, sch.stages}));
        fns.push_back(make(v));
        // (each variant on its own grid: BLOCK_M sets the programs)
        const int vbm = v.bm ? v.bm : sch.block_m;
        AbResult r;
        try {  // (a Function compiles at its first launch: a variant may not fit, e.g. D 256's shared memory)
          r = ab_measure_grids(fns, {runtime::Grid{lang::cdiv(c.S, sch.block_m), c.H(), c.B()}, runtime::Grid{lang::cdiv(c.S, vbm), c.H(), c.B()}},
                               stream, args, {&buf.dq}, static_cast<size_t>(c.B() * c.S * c.H() * D * 2), max_reps);
        } catch (const std::exception& e) {
          std::printf("DQ_VARIANT D=%ld causal=%d variant=%dx%d/%dw/%ds skipped=\"%s\"\n", static_cast<long>(D), causal ? 1 : 0, vbm, v.bn,
                      v.warps, v.stages, e.what());
          std::fflush(stdout);
          continue;
        }
        std::printf("DQ_VARIANT D=%ld causal=%d dropout=%g default=%dx%d/%dw/%ds variant=%dx%d/%dw/%ds programs_per_sm=%d default_ms=%.4f variant_ms=%.4f "
                    "speedup=%.3f outputs_identical=%d\n",
                    static_cast<long>(D), causal ? 1 : 0, dropout ? dropout_p : 0.0, sch.block_m, sch.block_n, sch.num_warps, sch.stages, vbm, v.bn, v.warps,
                    v.stages, fns[1].gpu_kernel().max_resident_per_sm(), r.off_ms, r.on_ms, r.off_ms / r.on_ms, r.identical ? 1 : 0);
        std::fflush(stdout);
      }
    }
  return 0;
}

// --mask-kernel: the dropout_mask kernel alone (D128 S4k's mask: B 4 x H 16 x 4096 x 4096 bits) per
// tiling and warp count, bits compared with the library default's.
int bench_mask_kernel(double p, int max_reps) {
  const int64_t BH = 64, S = 4096, words = S / 32;
  const size_t bytes = static_cast<size_t>(BH * S * words) * 4;
  DeviceBuffer bits(bytes);
  runtime::Stream stream;
  const attention::Tensor view = attention::contiguous(bits.ptr(), ir::DType::u32, {BH, S, words});
  const runtime::TensorView bv = view.view();
  std::vector<uint32_t> want(bytes / 4), got(bytes / 4);
  struct Tiling {
    int bm, bw, warps;
  };
  const library::LibraryKernel* lib = library::find("dropout_mask");
  bool first = true;
  for (Tiling t : {Tiling{64, 4, lib->num_warps}, Tiling{32, 4, 4}, Tiling{64, 2, 4}, Tiling{64, 8, 4}, Tiling{128, 4, 4}, Tiling{128, 4, 8},
                   Tiling{64, 8, 8}, Tiling{128, 8, 8}, Tiling{32, 8, 4}, Tiling{16, 8, 4}}) {
    jit::CompileOptions o;
    o.num_warps = t.warps;
    Function mask(kernels::dropout_mask(), {{mn::kBlockM, t.bm}, {mn::kBlockW, t.bw}}, o);
    const runtime::Grid grid{lang::cdiv(S, t.bm), lang::cdiv(words, t.bw), BH};
    const auto run = [&] {
      mask(grid, stream.handle(), bv, static_cast<int32_t>(S), uint32_t{1234}, uint32_t{0}, uint32_t{3}, uint32_t{0},
           kernels::dropout_keep_threshold(p), no_rng_state, 0u);
    };
    run();
    stream.synchronize();
    bits.download((first ? want : got).data(), bytes);
    const bool same = first || got == want;
    first = false;
    std::vector<double> ms;
    for (int round = 0; round < 3; ++round) ms.push_back(time_ms(run, stream, max_reps));
    std::printf("MASK_KERNEL BLOCK_M=%d BLOCK_W=%d warps=%d registers=%d programs_per_sm=%d ms=%.4f bits_identical=%d\n", t.bm, t.bw, t.warps,
                mask.compiled().info.registers, mask.gpu_kernel().max_resident_per_sm(), median(ms), same ? 1 : 0);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tilejit::attention_bench
