// generate_dropout_bits: the packed dropout keep-mask written ahead of attention by the dropout_mask
// library kernel (e.g. on a second stream beside the QKV GEMM), its own checks and Function cache.
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <variant>

#include "api/attention/internal.hpp"
#include "api/registry.hpp"
#include "kernels/philox_host.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention {

namespace mn = kernels::meta_name;
using namespace detail;

void generate_dropout_bits(const Tensor& bits, int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k, const Options& opts,
                           CUstream stream, int programs) {
  const Checker c("generate_dropout_bits");
  if (!(opts.dropout_p > 0.0 && opts.dropout_p < 1.0))
    c.fail("options.dropout_p = {} is not in (0, 1): there is no mask to generate", opts.dropout_p);
  for (auto [name, v] : {std::pair{"batch", batch}, {"heads_q", heads_q}, {"seq_q", seq_q}, {"seq_k", seq_k}})
    if (v < 1 || v > kI32Max) c.fail("{} = {} is not in [1, {}]", name, v, kI32Max);
  if (bits.dtype != ir::DType::u32) c.fail("bits has dtype {}; it must be u32 (packed bits)", ir::name(bits.dtype));
  c.tensor("bits", bits, 3, "[B * Hq, S_q, cdiv(S_k, 32)]", 4);
  const std::array<int64_t, 3> want{batch * heads_q, seq_q, (seq_k + 31) / 32};
  if (bits.size(0) != want[0] || bits.size(1) != want[1] || bits.size(2) != want[2])
    c.fail("bits has sizes {} but must be [B * Hq, S_q, cdiv(S_k, 32)] = {}", list(sizes_of(bits)), list(want));
  if (want[0] > kGridYZMax) c.fail("batch * heads_q = {} exceeds the grid limit {}", want[0], kGridYZMax);
  const library::LibraryKernel* lib = library::find("dropout_mask");
  if (!lib) throw std::logic_error("tilejit::attention: kernel 'dropout_mask' is not in the library");
  if (programs < 0 || programs > kI32Max) c.fail("programs = {} is not in [0, {}] (0: one program per tile)", programs, kI32Max);
  const bool persistent = programs > 0;
  static std::mutex mu;
  static std::map<std::pair<int, bool>, std::unique_ptr<Function>> per_device;
  Function* fn;
  {
    std::lock_guard lock(mu);
    auto& slot = per_device[{bits.device, persistent}];
    if (!slot) {
      jit::CompileOptions o;
      o.specialize = false;  // (library kernels declare what they need; bundles hold that variant)
      o.num_warps = lib->num_warps;
      o.pipeline.stages = lib->stages;
      lang::Meta meta = lib->default_meta;
      meta.emplace_back(mn::kPersistent, persistent);
      slot = std::make_unique<Function>(lib->kernel(), meta, o, bits.device);
    }
    fn = slot.get();
  }
  const int64_t block_m = std::get<int64_t>(fn->signature().find_meta(mn::kBlockM)->value),
                block_w = std::get<int64_t>(fn->signature().find_meta(mn::kBlockW)->value);
  KernelArgs args;
  args.set(kernels::Arg::Mask, bits.view());
  args.set(kernels::Arg::S_k, static_cast<int32_t>(seq_k));
  args.set_dropout(kernels::PhiloxKey::dropout(opts.seed, opts.offset, opts.dropout_p),
                   opts.rng_state ? check_rng_state(c, *opts.rng_state, bits.device) : 0, bits.device);
  const runtime::Grid grid = persistent ? runtime::Grid{programs}
                                        : runtime::Grid{lang::cdiv(seq_q, block_m), lang::cdiv(want[2], block_w), want[0]};
  launch(*fn, grid, stream, args, true);
  require_gpu("generate_dropout_bits", bits.device);
  // all shared memory: only then do its programs fit beside a GEMM's (the overlap it exists for)
  static std::once_flag carveout_set[2][64];
  std::call_once(carveout_set[persistent ? 1 : 0][bits.device % 64],
                 [&] { runtime::set_shared_memory_carveout(fn->gpu_kernel().function(), 100, bits.device); });
  launch(*fn, grid, stream, args, false);
}

}  // namespace tilejit::attention
