// Argument binding: the tensors and scalars of a call by kernel parameter name, and the launch of
// one Function with them (or, dry, only its argument checks: no GPU needed).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/attention/internal.hpp"

namespace tilejit::attention::detail {

std::string normalise(std::string_view s) {
  std::string out;
  for (char ch : s)
    if (ch != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Launches `fn` with the bound arguments in its parameter order, or (dry) only runs the launch's
// argument checks, which need no GPU: a missing binding or a signature the API does not expect
// shows up in CI, before any driver call.
void launch(Function& fn, runtime::Grid grid, CUstream stream, const Bindings& b, bool dry) {
  std::vector<runtime::DeviceArg> args;
  for (const ir::Param& p : fn.signature().params) {
    const std::string n = normalise(p.name);
    auto it = std::ranges::find_if(b.named, [&](const auto& e) { return e.first == n; });
    if (it == b.named.end())
      throw std::logic_error(fmt::format("tilejit::attention: kernel '{}' has a parameter '{}' the API does not bind", fn.name(),
                                         p.name));
    args.push_back(it->second);
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
void bind_common(Bindings& b, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                 const Dims& d, const Options& opts) {
  b.add("q", q.view());
  b.add("k", k.view());
  b.add("v", v.view());
  b.add("o", o.view());
  b.add("lse", lse.view());
  b.add("softmaxscale", d.scale);
  if (d.varlen) {
    b.add("cuseqlensq", opts.cu_seqlens_q->view());
    b.add("cuseqlensk", opts.cu_seqlens_k->view());
    b.add("maxseqlenq", d.seq_q);
    b.add("maxseqlenk", d.seq_k);
  }
  if (d.dropout) {
    b.add("seedlo", static_cast<uint32_t>(opts.seed));
    b.add("seedhi", static_cast<uint32_t>(opts.seed >> 32));
    b.add("offsetlo", static_cast<uint32_t>(opts.offset));
    b.add("offsethi", static_cast<uint32_t>(opts.offset >> 32));
    b.add("keepthreshold", d.keep_threshold);
  }
  if (d.return_mask) b.add("dropoutmask", opts.dropout_mask->view());
  if (d.read_bits) b.add("dropoutbits", opts.dropout_bits->view());
}

// A library mask's own parameters (kernels::mask_parameter_names), for the attention kernels and
// the pre-pass alike; the integers were checked to fit (<= 2^29).
void bind_mask(Bindings& b, const Options& opts, const Dims& d) {
  if (!library_mask(d.mask)) return;
  const Mask& m = *opts.mask;
  for (const std::string& n : kernels::mask_parameter_names(d.mask)) {
    const std::string key = normalise(n);
    if (n == "mask_window_left") b.add(key, static_cast<int32_t>(m.spec.window_left));
    else if (n == "mask_window_right") b.add(key, static_cast<int32_t>(m.spec.window_right));
    else if (n == "mask_global_tokens") b.add(key, static_cast<int32_t>(m.spec.global_tokens));
    else if (n == "mask_block_q") b.add(key, static_cast<int32_t>(m.spec.block_q));
    else if (n == "mask_block_k") b.add(key, static_cast<int32_t>(m.spec.block_k));
    else if (n == "mask_doc_ids") b.add(key, m.doc_ids->view());
    else if (n == "mask_prefix_lengths") b.add(key, m.prefix_lengths->view());
    else if (n == "mask_block_table") b.add(key, m.block_table->view());
    else throw std::logic_error(fmt::format("tilejit::attention: mask parameter '{}' the API does not bind", n));
  }
}

// The score mod's parameter (kernels::score_mod_parameter_names).
void bind_score_mod(Bindings& b, const Options& opts, const Dims& d) {
  if (d.score_mod == kernels::ScoreModKind::alibi) b.add("scorealibislopes", opts.score_mod.alibi_slopes->view());
  if (d.score_mod == kernels::ScoreModKind::softcap) b.add("scoresoftcap", opts.score_mod.softcap);
}

// The four lists a kernel reads (kv_* per query tile, KV_MAJOR q_* per key tile), at `base`.
void bind_lists(Bindings& b, const PrePassLists& l, uint64_t base) {
  const char* prefix = l.kv_major ? "q" : "kv";
  b.add(fmt::format("{}numblocks", prefix), l.num(base));
  b.add(fmt::format("{}indices", prefix), l.indices(base));
  b.add(fmt::format("full{}numblocks", prefix), l.full_num(base));
  b.add(fmt::format("full{}indices", prefix), l.full_indices(base));
}

}  // namespace tilejit::attention::detail
