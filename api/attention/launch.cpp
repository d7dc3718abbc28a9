// The launches: forward and backward (check, compile or find, launch on the stream), prepare (compile
// ahead of the first call), and the workspace's stream helpers they use.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include "api/attention/internal.hpp"
#include "api/registry.hpp"
#include "kernels/attention/backward_schedule.hpp"
#include "runtime/device_buffer.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention {

namespace mn = kernels::meta_name;
using namespace detail;
using kernels::Arg;

namespace {

// Where the launches' scratch arrays point before the workspace exists (the dry launches check
// layouts, never memory): any aligned non-null address.
constexpr uint64_t kPlaceholder = 256;

void synchronize(CUstream stream) {
  runtime::check_cu(runtime::Driver::get().api().StreamSynchronize(stream), "cuStreamSynchronize");
}

// Zeroes `bytes` at `address` on `stream` (asynchronous, in order with the launches around it).
void zero_async(uint64_t address, size_t bytes, CUstream stream, int device) {
  auto& drv = runtime::Driver::get();
  drv.context(device).make_current();
  runtime::check_cu(drv.api().MemsetD8Async(static_cast<CUdeviceptr>(address), 0, bytes, stream), "cuMemsetD8Async");
}

}  // namespace

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const Options& opts,
             CUstream stream, Workspace workspace) {
  if (opts.varlen_documents) return documents_forward(q, k, v, o, lse, opts, stream, workspace);
  const Dims d = check_forward_dims(q, k, v, o, lse, opts, workspace);
  const Config c = opts.schedule ? config(Pass::forward, q, d, opts) : with_tuned_choice(config(Pass::forward, q, d, opts), d);
  Function& fn = function_for(c);
  runtime::Grid grid{lang::cdiv(d.seq_q, c.sch.block_m), d.heads_q, d.batch};
  // PERSISTENT: as many programs as are resident at once, no more than tiles (without a GPU one:
  // only the dry launches use the grid)
  if (c.persistent) grid = runtime::Driver::get().available() ? fn.gpu_kernel().persistent_grid(grid.x * grid.y * grid.z) : runtime::Grid{1};
  // The launches at a workspace base: the pre-pass (masks without tile intervals), the forward.
  const auto bind = [&](uint64_t base) {
    KernelArgs a;
    bind_common(a, q, k, v, o, lse, d, opts);
    bind_mask(a, opts, d);
    bind_score_mod(a, opts, d);
    if (d.lists) bind_lists(a, d.fwd_lists, d.lists_base ? d.lists_base : base);
    return a;
  };
  KernelArgs args = bind(workspace.data ? workspace.data : kPlaceholder);
  std::optional<PrePass> pre;
  const bool pre_passes = d.lists && d.lists_base == 0;  // (options.block_mask: built already)
  if (pre_passes) pre = pre_pass(d.fwd_lists, opts, d, workspace.data ? workspace.data : kPlaceholder);
  if (pre) launch(*pre, stream, true);
  launch(fn, grid, stream, args, true);
  require_gpu("forward", q.device);
  runtime::DeviceBuffer owned;
  if (pre_passes && workspace.data == 0) {
    owned = runtime::DeviceBuffer(forward_bytes(d), q.device);
    args = bind(owned.ptr());
    pre = pre_pass(d.fwd_lists, opts, d, owned.ptr());
  }
  if (pre) launch(*pre, stream, false);
  launch(fn, grid, stream, args, false);
  if (owned.bytes() != 0) synchronize(stream);
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
              const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, CUstream stream, Workspace workspace) {
  if (opts.varlen_documents) return documents_backward(q, k, v, o, do_, lse, dq, dk, dv, opts, stream, workspace);
  const Dims d = check_backward_dims(q, k, v, o, do_, lse, dq, dk, dv, opts, workspace);
  // Delta: f32 [B, Hq, S_q] (varlen [Hq, total_q]), contiguous, at the start of the workspace.
  const std::array<int64_t, 3> dsizes = d.varlen ? std::array<int64_t, 3>{d.heads_q, d.total_q, 0}
                                                 : std::array<int64_t, 3>{d.batch, d.heads_q, d.seq_q};
  const std::array<int64_t, 3> dstrides = d.varlen ? std::array<int64_t, 3>{d.total_q, 1, 0}
                                                   : std::array<int64_t, 3>{d.heads_q * d.seq_q, d.seq_q, 1};
  const size_t drank = d.varlen ? 2 : 3;
  // The launches at a workspace base: preprocess, [pre-pass at dK/dV's tiles], [zeroing], dK/dV,
  // then [pre-pass at dQ's tiles] and dQ (recompute), the convert kernel (atomic, ordered) or the
  // reduce kernel (split).
  const bool reduce = d.reduction != DqReduction::recompute;
  const auto bind = [&](uint64_t base) {
    KernelArgs a;
    bind_common(a, q, k, v, o, lse, d, opts);
    a.set(Arg::dO, do_.view());
    a.set(Arg::dQ, dq.view());
    a.set(Arg::dK, dk.view());
    a.set(Arg::dV, dv.view());
    a.set(Arg::Delta, runtime::TensorView{ir::DType::f32, std::span<const int64_t>(dsizes.data(), drank),
                                          std::span<const int64_t>(dstrides.data(), drank), base, q.device});
    bind_mask(a, opts, d);
    bind_score_mod(a, opts, d);
    const uint64_t lists_at = d.lists_base ? d.lists_base : base;
    if (d.lists) {
      bind_lists(a, d.dkdv_lists, lists_at);
      if (!reduce) bind_lists(a, d.dq_lists, lists_at);
    }
    if (d.mask_once) {  // dK/dV writes the mask's words, dQ reads them
      a.set(Arg::dropout_bits_out, d.dropout_words.view(base, q.device));
      a.set(Arg::dropout_bits, d.dropout_words.view(base, q.device));
    }
    if (reduce) {
      a.set(d.reduction == DqReduction::split ? Arg::dQ_parts : Arg::dQ_accum, d.dq_ws.view(base, q.device));
      if (d.reduction == DqReduction::ordered) a.set(Arg::dQ_semaphores, d.dq_sem.view(base, q.device));
      a.set(Arg::S_k, static_cast<int32_t>(d.seq_k));  // the reduce kernel's S_k
      if (d.lists) a.set(Arg::block_classes, d.dkdv_lists.classes(lists_at));  // (the reduce kernel's: dK/dV's pre-pass writes them)
    }
    return a;
  };
  const Config pre = config(Pass::bwd_preprocess, q, d, opts),
               kv = opts.schedule ? config(Pass::bwd_dkdv, q, d, opts) : with_tuned_choice(config(Pass::bwd_dkdv, q, d, opts), d),
               dqc = opts.schedule ? config(dq_pass(d.reduction), q, d, opts) : with_tuned_choice(config(dq_pass(d.reduction), q, d, opts), d);
  // the reduce kernel reads dK/dV's parts at dK/dV's tiles (the schedule table and an
  // options.schedule give both the same tiles)
  if (d.reduction == DqReduction::split && (dqc.sch.block_m != kv.sch.block_m || dqc.sch.block_n != kv.sch.block_n))
    throw std::logic_error(fmt::format("tilejit::attention: attention_bwd_dq_reduce at {}x{} tiles but dK/dV at {}x{}", dqc.sch.block_m,
                                       dqc.sch.block_n, kv.sch.block_m, kv.sch.block_n));
  Function &pre_fn = function_for(pre), &kv_fn = function_for(kv), &dq_fn = function_for(dqc);
  runtime::Grid pre_grid{lang::cdiv(d.seq_q, pre.sch.block_m), d.heads_q, d.batch},
      kv_grid{lang::cdiv(d.seq_k, kv.sch.block_n), d.heads_kv, d.batch}, dq_grid{lang::cdiv(d.seq_q, dqc.sch.block_m), d.heads_q, d.batch};
  if (persistent_ordered(static_cast<int>(d.reduction), d.q_descending) && declares(Pass::bwd_dkdv, mn::kPersistent)) {
    // PERSISTENT: as many programs as the GPU holds at once (all resident: the programs wait on
    // each other), no more than there are items (key tiles, or causal pairs of them)
    const kernels::BwdProblem model{.seq_q = static_cast<int>(d.seq_q), .seq_k = static_cast<int>(d.seq_k), .block_m = kv.sch.block_m,
                                    .block_n = kv.sch.block_n, .mask = d.causal ? kernels::BwdMask::causal : kernels::BwdMask::full};
    const int64_t items = d.batch * d.heads_kv * kernels::items_per_head(model);
    kv_grid = runtime::Driver::get().available() ? kv_fn.gpu_kernel().persistent_grid(items) : runtime::Grid{1};  // (dry: one)
  }
  // options.backward_phase: the dkdv phase stops before dQ, the dq phase starts there (Delta and
  // dK/dV's mask classes already in the workspace)
  const bool dkdv_phase = opts.backward_phase != BackwardPhase::dq, dq_phase = opts.backward_phase != BackwardPhase::dkdv;
  const auto run = [&](uint64_t base, bool dry) {
    const KernelArgs args = bind(base);
    std::optional<PrePass> kv_lists, dq_lists;
    if (d.lists && d.lists_base == 0) {
      if (dkdv_phase) kv_lists = pre_pass(d.dkdv_lists, opts, d, base);
      if (!reduce && dq_phase) dq_lists = pre_pass(d.dq_lists, opts, d, base, &d.dkdv_lists);  // dK/dV's classes at the same tiles
    }
    if (dkdv_phase) {
      launch(pre_fn, pre_grid, stream, args, dry);
      if (kv_lists) launch(*kv_lists, stream, dry);
      // what the dK/dV kernel needs zero: dQ_accum for atomic and ordered (both add into it), and
      // ordered's semaphores
      if (!dry && (d.reduction == DqReduction::atomic || d.reduction == DqReduction::ordered))
        zero_async(base + d.dq_ws.at, d.dq_ws.bytes, stream, q.device);
      if (!dry && d.reduction == DqReduction::ordered) zero_async(base + d.dq_sem.at, d.dq_sem.bytes, stream, q.device);
      launch(kv_fn, kv_grid, stream, args, dry);
    }
    if (!dq_phase) return;
    if (dq_lists) launch(*dq_lists, stream, dry);
    launch(dq_fn, dq_grid, stream, args, dry);
  };
  run(workspace.data ? workspace.data : kPlaceholder, true);
  require_gpu("backward", q.device);
  runtime::DeviceBuffer owned;
  if (workspace.data == 0) owned = runtime::DeviceBuffer(backward_bytes(d), q.device);
  run(workspace.data ? workspace.data : owned.ptr(), false);
  if (owned.bytes() != 0) synchronize(stream);
}

void prepare(ir::DType dtype, int head_dim, bool causal, bool varlen, bool backward, std::optional<Schedule> schedule,
             int device, bool dropout, std::optional<DqReduction> dq_reduction, bool q_descending) {
  prepare(dtype, head_dim, causal ? kernels::MaskKind::causal : kernels::MaskKind::full, varlen, backward, schedule, device, dropout,
          dq_reduction, q_descending);
}

namespace {

// The API's functions for calls with this configuration (what `prepare` compiles and
// `bundle_specs` lists), after the checks a call makes, in `fn`'s name.
std::vector<Function*> functions_for(const char* fn, ir::DType dtype, int head_dim, kernels::MaskKind mask, bool varlen, bool backward,
                                     std::optional<Schedule> schedule, int device, bool dropout, std::optional<DqReduction> dq_reduction,
                                     bool q_descending) {
  const Checker c(fn);
  // what forward/backward refuse, refused here in the same words (issue 27: prepare compiled
  // f32 and stages 0, and failed deep in lowering at D 96)
  if (dtype != ir::DType::bf16 && dtype != ir::DType::f16) c.fail("dtype {}; supported: bf16, f16", ir::name(dtype));
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    c.fail("head dim D = {} is not supported; supported: 64, 128, 256", head_dim);
  {
    Options o;
    o.schedule = schedule;
    check_schedule(c, o);
  }
  if (static_cast<int>(mask) < 0 || static_cast<int>(mask) >= kernels::kMaskKindCount)
    c.fail("mask = {} is not a mask kind; valid: {}", static_cast<int>(mask), kernels::mask_kind_list());
  if (library_mask(mask) && varlen)
    c.fail("mask {} with varlen = true: library masks take dense batches only", kernels::mask_kind_name(mask));
  // the reductions whose kernels calls of this configuration run: the one asked for, or (unset)
  // every one the default may choose (recompute; atomic and, deterministic, ordered where they may
  // run on the dQ writer)
  std::vector<DqReduction> reductions{dq_reduction.value_or(DqReduction::recompute)};
  if (backward && !dq_reduction && ordered_may_be_default(head_dim, mask, varlen, dropout, false, schedule.has_value(), q_descending))
    reductions.insert(reductions.end(), {DqReduction::ordered, DqReduction::atomic});
  else if (backward && !dq_reduction && atomic_may_be_default(head_dim, mask, varlen, dropout, false, schedule.has_value(), q_descending))
    reductions.push_back(DqReduction::atomic);
  if (backward)
    for (DqReduction r : reductions)
      check_dq_reduction(c, r, q_descending, varlen, mask, {"dq_reduction", "q_descending", "varlen = true", "mask"});
  else {
    reductions = {DqReduction::recompute};  // (the forward has neither)
    q_descending = false;
  }
  const bool causal = mask == kernels::MaskKind::causal;
  const int lib = library_mask(mask) ? static_cast<int>(mask) : 0;
  std::vector<std::pair<Pass, DqReduction>> passes{{Pass::forward, reductions[0]}};
  if (backward) {
    passes.emplace_back(Pass::bwd_preprocess, reductions[0]);
    for (DqReduction r : reductions) passes.insert(passes.end(), {{Pass::bwd_dkdv, r}, {dq_pass(r), r}});
  }
  std::vector<Function*> out;
  for (const auto& [p, reduction] : passes) {
    const auto schedule_of = [&](Pass q) {
      return schedule ? *schedule : default_schedule(q, dtype, head_dim, causal, varlen, reduction, dropout, lib != 0);
    };
    const Schedule s = schedule_of(p);
    Config cfg{p, dtype, head_dim, causal, varlen, s, device, dropout && declares(p, mn::kDropout), false, false,
               lib != 0 && declares(p, mn::kMask) ? lib : 0, p == Pass::bwd_dkdv ? static_cast<int>(reduction) : 0,
               p == Pass::bwd_dkdv && q_descending, 0,
               // calls with a positive softmax_scale (the default 1/sqrt(head_dim) is)
               p == Pass::forward && declares(p, mn::kPositiveScale)};
    cfg.persistent = p == Pass::forward && forward_persistent(head_dim, varlen, cfg.mask, 0, cfg.dropout);
    // and, with fused dropout, the pair that draws the mask once (dK/dV writes its words, dQ reads
    // them: Dims::mask_once) where the kernels allow it; calls over Options::dropout_words_max_bytes
    // run the others
    const bool mask_once = (p == Pass::bwd_dkdv || p == Pass::bwd_dq) &&
                           mask_once_kernels(cfg.dropout, reduction, varlen, lib != 0, schedule_of(Pass::bwd_dkdv).block_n,
                                             schedule_of(Pass::bwd_dq).block_n);
    for (bool once : {false, true}) {
      if (once && !mask_once) continue;
      Config v = cfg;
      v.write_bits = once && p == Pass::bwd_dkdv;
      v.read_bits = once && p == Pass::bwd_dq;
      v.words_key_major = once;
      out.push_back(&function_for(v));  // (dK/dV: the kernel of calls whose lse is not 16-byte aligned, S_q % 4 != 0)
      if (p == Pass::bwd_dkdv) {  // and of those whose lse is: LSE and Delta from the ring
        const DkdvRingOptions r = dkdv_ring_options(v, true);
        v.lse_in_ring = r.lse_in_ring, v.ring_producer = r.ring_producer, v.dq_writer = r.dq_writer;
        if (r.lse_in_ring || r.ring_producer) out.push_back(&function_for(v));
      }
    }
    // the pre-pass at this kernel's tiles (the preprocess, convert and reduce kernels read no lists)
    if (lib != 0 && !kernels::mask_has_tile_intervals(mask) &&
        (p == Pass::forward || p == Pass::bwd_dkdv || p == Pass::bwd_dq)) {
      PrePassLists l;
      l.block_m = s.block_m;
      l.block_n = s.block_n;
      l.kv_major = p == Pass::bwd_dkdv;
      l.device = device;
      out.push_back(&block_classes_function(l, mask));
      out.push_back(&block_lists_function(l));
    }
  }
  // the document masks: the ids of a packed batch (Options::varlen_documents runs its calls as
  // these masks and writes the ids first: decision 113)
  if (lib != 0 && kernels::mask_uses_doc_ids(mask)) out.push_back(&document_ids_function(device));
  // (once each: the reductions share the forward and the preprocess kernel)
  std::vector<Function*> unique;
  for (Function* f : out)
    if (std::find(unique.begin(), unique.end(), f) == unique.end()) unique.push_back(f);
  return unique;
}

}  // namespace

void prepare(ir::DType dtype, int head_dim, kernels::MaskKind mask, bool varlen, bool backward, std::optional<Schedule> schedule,
             int device, bool dropout, std::optional<DqReduction> dq_reduction, bool q_descending) {
  for (Function* f : functions_for("prepare", dtype, head_dim, mask, varlen, backward, schedule, device, dropout, dq_reduction, q_descending))
    f->compiled();
}

std::vector<runtime::BundleEntrySpec> bundle_specs(ir::DType dtype, int head_dim, kernels::MaskKind mask, bool varlen, bool backward,
                                                   std::optional<Schedule> schedule, bool dropout, std::optional<DqReduction> dq_reduction,
                                                   bool q_descending) {
  std::vector<runtime::BundleEntrySpec> specs;
  for (const Function* f :
       functions_for("bundle_specs", dtype, head_dim, mask, varlen, backward, schedule, 0, dropout, dq_reduction, q_descending)) {
    runtime::BundleEntrySpec spec = library::bundle_spec(f->name(), f->meta());
    spec.options = f->options();  // (the API's warps, stages and register bound)
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace tilejit::attention
