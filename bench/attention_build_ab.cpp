// attention_bench --build-ab OTHER.tjb: the API's attention kernels as this build compiles them
// against the same configurations' kernels from a bundle that another tilejit build wrote, in one
// process (alternated rounds, outputs compared bit for bit). The way to time a change that moves
// no meta -- a lowering change, a new LLVM, a kernel's code -- without comparing two processes:
//   (the other build)  tools/build_ab_bundle.sh COMMIT other.tjb   (`tilejit bundle --attention ...` of
//                        D 64 / 128, full / causal, with and without dropout, from that commit's build)
//   (this build)       attention_bench --build-ab other.tjb
// An entry is paired with this build's kernel of the same name, full specialisation (every meta),
// schedule and arch; its ABI (parameters, tensor maps) must match this build's signature.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/attention_ab.hpp"
#include "kernels/meta_names.hpp"
#include "runtime/bundle.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/kernel_codec.hpp"

namespace tilejit::attention_bench {

namespace {

namespace mn = tilejit::kernels::meta_name;

int64_t meta_int(const ir::Function& fn, const char* name) {
  const ir::MetaEntry* m = fn.find_meta(name);
  return m ? std::get<int64_t>(m->value) : 0;
}
bool meta_bool(const ir::Function& fn, const char* name) {
  const ir::MetaEntry* m = fn.find_meta(name);
  return m && std::get<bool>(m->value);
}

// The other bundle's entry built from the same configuration as `fn` with `o`, if any.
const runtime::BundleEntry* paired_entry(const runtime::Bundle& other, const ir::Function& fn, const jit::CompileOptions& o) {
  const std::string meta = runtime::describe_meta(fn.meta), schedule = runtime::describe_schedule(o);
  for (const runtime::BundleEntry& e : other.entries)
    if (e.kernel == fn.name && e.meta == meta && e.schedule == schedule && e.arch == o.arch) return &e;
  return nullptr;
}

}  // namespace

int bench_build_ab(const std::string& path, int max_reps) {
  const runtime::Bundle other = runtime::read_bundle(path);
  std::printf("BUILD_AB this=tilejit %s other=%s (tilejit %s, %zu kernels)\n", std::string(runtime::codec::kTilejitVersion).c_str(),
              path.c_str(), other.tilejit_version.c_str(), other.entries.size());
  const Buffers buf;
  runtime::Stream stream;
  int paired = 0;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true})
      for (bool dropout : {false, true}) {
      const Config c{4096, D, causal};
      const auto [Q, K, V, O, dO, dQ, dK, dV, L] = buf.views(c);
      const DeltaBuffer delta = forward_and_delta(buf, c, stream);
      const float scale = static_cast<float>(1 / std::sqrt(double(D)));
      const size_t bytes = static_cast<size_t>(c.B() * c.S * c.H() * D * 2);
      // the recompute reduction's kernels, and (without dropout) the atomic reduction's dK/dV kernel
      // (the 5-matmul kernel: at D 128 on the ring producer with the dQ writer)
      for (const attention::DqReduction reduction : {attention::DqReduction::recompute, attention::DqReduction::atomic})
      for (const runtime::BundleEntrySpec& spec :
           attention::bundle_specs(ir::DType::bf16, static_cast<int>(D), causal ? kernels::MaskKind::causal : kernels::MaskKind::full,
                                   false, true, {}, dropout, reduction)) {
        const bool atomic = reduction == attention::DqReduction::atomic;
        if (atomic && (dropout || spec.kernel != "attention_bwd_dkdv")) continue;
        if (spec.kernel != "attention_fwd" && spec.kernel != "attention_bwd_dkdv" && spec.kernel != "attention_bwd_dq") continue;
        const ir::Function fn = spec.build();
        if (meta_bool(fn, mn::kDropoutBits)) continue;  // (reads a precomputed mask: not one of the API's default kernels)
        jit::CompileOptions o = spec.options;
        o.make_cubin = true;  // (as a bundle's entries are built)
        const std::string label = fmt::format("kernel={} D={} causal={} dropout={} reduction={} meta={}", fn.name, D, causal ? 1 : 0,
                                              dropout ? 1 : 0, attention::name(reduction), runtime::describe_meta(fn.meta));
        const runtime::BundleEntry* e = paired_entry(other, fn, o);
        if (!e) {
          std::printf("BUILD_AB %s skipped=\"no entry in %s with this specialisation and schedule (%s)\"\n", label.c_str(), path.c_str(),
                      runtime::describe_schedule(o).c_str());
          continue;
        }
        if (const std::string why = runtime::abi_mismatch(fn, e->compiled); !why.empty()) {
          std::printf("BUILD_AB %s skipped=\"the other build's kernel has another ABI: %s\"\n", label.c_str(), why.c_str());
          continue;
        }
        lang::Meta meta;
        for (const ir::MetaEntry& m : fn.meta) meta.emplace_back(m.name, m.value);
        Function mine(spec.source(), meta, o);
        const runtime::GpuKernel theirs(fn, e->compiled);
        // grids and arguments as bench_tool_ab launches the recompute kernels; PERSISTENT: the
        // resident programs on a 1-D grid
        const bool fwd = fn.name == "attention_fwd", dkdv = fn.name == "attention_bwd_dkdv";
        const int64_t block = dkdv ? meta_int(fn, mn::kBlockN) : meta_int(fn, mn::kBlockM);
        const runtime::Grid tiles{lang::cdiv(c.S, block), c.H(), c.B()};
        const bool persistent = meta_bool(fn, mn::kPersistent);
        const int64_t items = tiles.x * tiles.y * tiles.z;
        const std::array<runtime::Grid, 2> grids{persistent ? mine.gpu_kernel().persistent_grid(items) : tiles,
                                                 persistent ? theirs.persistent_grid(items) : tiles};
        // atomic: dQ's parts added into an f32 [B, H, S, D] accumulator on the workspace buffer (never
        // zeroed between launches: the adds cost the same; dQ is not compared, its order is not fixed)
        const attention::Tensor dq_accum = attention::contiguous(buf.ws.ptr(), ir::DType::f32, {c.B(), c.H(), c.S, D});
        std::vector<runtime::DeviceArg> args;
        if (fwd) {
          args = {Q.view(), K.view(), V.view(), O.view(), L.view(), scale};
        } else if (dkdv) {
          args = {Q.view(), K.view(), V.view(), dO.view(), L.view(), delta.view.view(), dK.view(), dV.view()};
          if (atomic) args.emplace_back(dq_accum.view());
          args.emplace_back(scale);
        } else {
          args = {Q.view(), K.view(), V.view(), dO.view(), L.view(), delta.view.view(), dQ.view(), scale};
        }
        if (meta_bool(fn, mn::kDropout)) bench_util::add_dropout_key(args, 0.1);  // (fused: the keep-mask made in the kernel)
        const AbResult r = ab_measure_launches(
            {[&] { mine.launch(grids[0], stream.handle(), args); }, [&] { theirs.launch(grids[1], args, stream.handle()); }}, stream,
            fwd ? std::initializer_list<const DeviceBuffer*>{&buf.o}
                : dkdv ? std::initializer_list<const DeviceBuffer*>{&buf.dk, &buf.dv} : std::initializer_list<const DeviceBuffer*>{&buf.dq},
            bytes, max_reps);
        if (fwd) forward_and_delta(buf, c, stream);  // (O and LSE as the backward rows read them)
        std::printf("BUILD_AB %s this_ms=%.4f other_ms=%.4f speedup=%.3f registers=%d/%d outputs_identical=%d\n", label.c_str(), r.off_ms,
                    r.on_ms, r.on_ms / r.off_ms, mine.compiled().info.registers, e->compiled.info.registers, r.identical ? 1 : 0);
        std::fflush(stdout);
        ++paired;
      }
    }
  if (paired == 0) {
    std::fprintf(stderr, "attention_bench --build-ab: no kernel of %s matches this build's API kernels (write it with `tilejit bundle "
                         "--attention D=128 ...` from the other build)\n", path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace tilejit::attention_bench
