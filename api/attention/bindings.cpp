// Argument binding: the tensors and scalars of a call by kernels::Arg, and the launch of one
// Function with them in its signature's order (or, dry, only its argument checks: no GPU needed).
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/attention/internal.hpp"

namespace tilejit::attention::detail {

using kernels::Arg;

// Launches `fn` with the bound arguments in its parameter order, or (dry) only runs the launch's
// argument checks, which need no GPU: a missing binding or a signature the API does not expect
// shows up in CI, before any driver call. Each parameter's slot is its name's kernels::Arg.
void launch(Function& fn, runtime::Grid grid, CUstream stream, const KernelArgs& a, bool dry) {
  std::vector<runtime::DeviceArg> args;
  for (const ir::Param& p : fn.signature().params) {
    const std::optional<Arg> slot = kernels::argument_of(p.name);
    if (!slot || !a[*slot])
      throw std::logic_error(fmt::format("tilejit::attention: kernel '{}' has a parameter '{}' the API does not bind", fn.name(),
                                         p.name));
    args.push_back(*a[*slot]);
  }
  if (dry) fn.check(grid, std::span<const runtime::DeviceArg>(args));
  else fn.launch(grid, stream, args);
}

void require_gpu(const char* fn, int device) {
  auto& drv = runtime::Driver::get();
  drv.require(fmt::format("tilejit::attention::{}", fn));
  if (device >= drv.device_count())
    throw std::invalid_argument(
        fmt::format("tilejit::attention::{}: q is on device {} but this machine has {} GPU(s)", fn, device, drv.device_count()));
}

// The tensors and scalars every kernel of a call may take (views point into the callers' Tensors).
void bind_common(KernelArgs& a, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                 const Dims& d, const Options& opts) {
  a.set(Arg::Q, q.view());
  a.set(Arg::K, k.view());
  a.set(Arg::V, v.view());
  a.set(Arg::O, o.view());
  a.set(Arg::LSE, lse.view());
  a.set(Arg::softmax_scale, d.scale);
  if (d.varlen) {
    a.set(Arg::cu_seqlens_q, opts.cu_seqlens_q->view());
    a.set(Arg::cu_seqlens_k, opts.cu_seqlens_k->view());
  }
  if (d.dropout) a.set_dropout(d.philox, d.rng_state, q.device);
  if (d.return_mask) a.set(Arg::dropout_mask, opts.dropout_mask->view());
  if (d.read_bits) a.set(Arg::dropout_bits, opts.dropout_bits->view());
}

// A library mask's own parameters (kernels::mask_parameter_names, through the kernels' table), for
// the attention kernels and the pre-pass alike; the integers were checked to fit (<= 2^29).
void bind_mask(KernelArgs& a, const Options& opts, const Dims& d) {
  if (!library_mask(d.mask)) return;
  const Mask& m = *opts.mask;
  for (const std::string& n : kernels::mask_parameter_names(d.mask)) {
    const auto unbound = [&] {
      return std::logic_error(fmt::format("tilejit::attention: mask parameter '{}' the API does not bind", n));
    };
    const std::optional<Arg> slot = kernels::argument_of(n);
    if (!slot) throw unbound();
    switch (*slot) {
      case Arg::mask_window_left: a.set(*slot, static_cast<int32_t>(m.spec.window_left)); break;
      case Arg::mask_window_right: a.set(*slot, static_cast<int32_t>(m.spec.window_right)); break;
      case Arg::mask_global_tokens: a.set(*slot, static_cast<int32_t>(m.spec.global_tokens)); break;
      case Arg::mask_block_q: a.set(*slot, static_cast<int32_t>(m.spec.block_q)); break;
      case Arg::mask_block_k: a.set(*slot, static_cast<int32_t>(m.spec.block_k)); break;
      case Arg::mask_doc_ids: a.set(*slot, m.doc_ids->view()); break;
      case Arg::mask_prefix_lengths: a.set(*slot, m.prefix_lengths->view()); break;
      case Arg::mask_block_table: a.set(*slot, m.block_table->view()); break;
      default: throw unbound();
    }
  }
}

// The score mod's parameter (kernels::score_mod_parameter_names).
void bind_score_mod(KernelArgs& a, const Options& opts, const Dims& d) {
  if (d.score_mod == kernels::ScoreModKind::alibi) a.set(Arg::score_alibi_slopes, opts.score_mod.alibi_slopes->view());
  if (d.score_mod == kernels::ScoreModKind::softcap) a.set(Arg::score_softcap, opts.score_mod.softcap);
}

// The four lists a kernel reads (kv_* per query tile, KV_MAJOR q_* per key tile), at `base`.
void bind_lists(KernelArgs& a, const PrePassLists& l, uint64_t base) {
  a.set(l.kv_major ? Arg::q_num_blocks : Arg::kv_num_blocks, l.num(base));
  a.set(l.kv_major ? Arg::q_indices : Arg::kv_indices, l.indices(base));
  a.set(l.kv_major ? Arg::full_q_num_blocks : Arg::full_kv_num_blocks, l.full_num(base));
  a.set(l.kv_major ? Arg::full_q_indices : Arg::full_kv_indices, l.full_indices(base));
}

}  // namespace tilejit::attention::detail
