// What the files of the attention API (api/attention/*.cpp) share: the checks' Checker, the shape of
// a checked call (Dims), kernel configurations, argument bindings, and the functions used across files.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/attention.hpp"
#include "dsl/builder.hpp"
#include "kernels/attention/arguments.hpp"
#include "kernels/attention/mask.hpp"
#include "runtime/function.hpp"

namespace tilejit::attention::detail {

inline constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kGridYZMax = 65535;
inline constexpr uint64_t kAlign = 16;  // the kernels' ParamSpec::align_bytes for Q, K, V, O and gradients

inline std::string list(std::span<const int64_t> v) {
  return fmt::format("[{}]", fmt::join(v, ","));
}
inline std::span<const int64_t> sizes_of(const Tensor& t) { return {t.sizes.data(), static_cast<size_t>(t.rank)}; }

// The checks of one API call: every failure names the function, the argument, the value and what
// would be valid.
class Checker {
 public:
  explicit Checker(const char* fn) : fn_(fn) {}

  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) const {
    throw std::invalid_argument(fmt::format("tilejit::attention::{}: {}", fn_, fmt::format(f, std::forward<A>(args)...)));
  }

  // Pointer, rank, sizes, strides and alignment of one tensor (dtype checked by the caller).
  void tensor(const char* name, const Tensor& t, int rank, const char* layout, uint64_t align) const {
    if (t.rank != rank) fail("{} must be rank {} {}, got rank {}: {}", name, rank, layout, t.rank, t.describe());
    if (t.data == 0) fail("{} is a null pointer: {}", name, t.describe());
    if (t.device < 0) fail("{} is on device {}; device ordinals start at 0", name, t.device);
    for (int d = 0; d < rank; ++d) {
      if (t.size(d) < 1) fail("{} is empty: {} (layout {}); every size must be at least 1", name, t.describe(), layout);
      if (t.size(d) > kI32Max) fail("{} has size {} in dim {}, over the kernels' i32 limit {}", name, t.size(d), d, kI32Max);
      if (t.stride(d) < 0) fail("{} has a negative stride {} in dim {}: {}; strides must be >= 0", name, t.stride(d), d, t.describe());
    }
    if (t.stride(rank - 1) != 1)
      fail("{} has stride {} on its last dim; the kernels need unit stride there: {}", name, t.stride(rank - 1), t.describe());
    if (t.data % align != 0)
      fail("{}'s base address {:#x} is not a multiple of {} bytes (the kernels' alignment): {}", name, t.data, align, t.describe());
    const int64_t es = ir::byte_size(t.dtype);
    for (int d = 0; d + 1 < rank; ++d)
      if ((t.stride(d) * es) % static_cast<int64_t>(align) != 0)
        fail("{}'s stride {} of dim {} is {} bytes, not a multiple of {} bytes (the row pitch the kernels' vector loads need): {}",
             name, t.stride(d), d, t.stride(d) * es, align, t.describe());
  }
  void same_dtype(const char* name, const Tensor& t, const Tensor& q, const char* group) const {
    if (t.dtype != q.dtype)
      fail("{} has dtype {} but q has {} ({} must share one dtype)", name, ir::name(t.dtype), ir::name(q.dtype), group);
  }
  void same_device(const char* name, const Tensor& t, const Tensor& q) const {
    if (t.device != q.device) fail("{} is on device {} but q is on device {} (all tensors must be on one device)", name, t.device, q.device);
  }
  void same_sizes(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const {
    if (!std::ranges::equal(sizes_of(t), sizes_of(ref)))
      fail("{} has sizes {} but {} has {} ({} must match {})", name, list(sizes_of(t)), ref_name, list(sizes_of(ref)), name,
           ref_name);
  }

 private:
  const char* fn_;
};

// The outputs of one block-mask pre-pass run (for one kernel's tiles and order) and where they
// sit in the workspace: five arrays, each starting on a 256-byte boundary. The views point into
// this struct: keep it in place while they are used.
struct PrePassLists {
  int64_t block_m = 0, block_n = 0;
  bool kv_major = false;
  int64_t q_blocks = 0, k_blocks = 0, outer = 0, mask_batch = 1, mask_heads = 1;
  std::array<int64_t, 4> cls_sizes{}, cls_strides{}, idx_sizes{}, idx_strides{};
  std::array<int64_t, 3> num_sizes{}, num_strides{};
  size_t num_at = 0, idx_at = 0, full_num_at = 0, full_idx_at = 0, cls_at = 0, end = 0;  // byte offsets in the workspace
  int device = 0;

  runtime::TensorView classes(uint64_t base) const { return view(base + cls_at, ir::DType::u8, cls_sizes, cls_strides); }
  runtime::TensorView num(uint64_t base) const { return view(base + num_at, ir::DType::i32, num_sizes, num_strides); }
  runtime::TensorView indices(uint64_t base) const { return view(base + idx_at, ir::DType::i32, idx_sizes, idx_strides); }
  runtime::TensorView full_num(uint64_t base) const { return view(base + full_num_at, ir::DType::i32, num_sizes, num_strides); }
  runtime::TensorView full_indices(uint64_t base) const { return view(base + full_idx_at, ir::DType::i32, idx_sizes, idx_strides); }

 private:
  template <size_t N>
  runtime::TensorView view(uint64_t address, ir::DType t, const std::array<int64_t, N>& sizes, const std::array<int64_t, N>& strides) const {
    return runtime::TensorView{t, std::span<const int64_t>(sizes), std::span<const int64_t>(strides), address, device};
  }
};

// A row-major array of the backward's workspace (the dQ reduction's buffers): its byte offset,
// size (rounded up to 256) and extents. The views point into this struct: keep it in place while
// they are used.
struct WorkspaceArray {
  ir::DType dtype = ir::DType::f32;
  size_t rank = 0;
  std::array<int64_t, 5> sizes{}, strides{};
  size_t at = 0, bytes = 0;

  runtime::TensorView view(uint64_t base, int device) const {
    return runtime::TensorView{dtype, std::span<const int64_t>(sizes.data(), rank), std::span<const int64_t>(strides.data(), rank),
                               base + at, device};
  }
};

// The shape of one call, worked out by the checks.
struct Dims {
  bool varlen = false;
  int64_t batch = 0, seq_q = 0, seq_k = 0;  // varlen: max_seqlen_q/k
  int64_t total_q = 0, total_k = 0;         // varlen: packed token counts
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  float scale = 0;
  bool dropout = false;         // options.dropout_p > 0
  kernels::PhiloxKey philox;    // when `dropout`: options.seed, offset and dropout_p's keep threshold
  uint64_t rng_state = 0;       // options.rng_state's address: seed and offset in device memory (0: philox's)
  bool return_mask = false;     // forward: options.dropout_mask
  bool read_bits = false;       // options.dropout_bits (forward, dK/dV, dQ)
  // options.mask: full and causal fold into `causal`; `mask` is a library kind (MASK meta) or full
  bool causal = false;          // options.causal or mask kind causal
  kernels::MaskKind mask = kernels::MaskKind::full;
  kernels::ScoreModKind score_mod = kernels::ScoreModKind::none;  // options.score_mod.kind
  bool lists = false;           // the mask needs the pre-pass (no tile intervals)
  int64_t mask_batch = 1, mask_heads = 1;  // the pre-pass grid's Bm, Hm: the mask tensor's extents
  PrePassLists fwd_lists, dkdv_lists, dq_lists;  // when `lists` (the backward's after Delta)
  uint64_t lists_base = 0;  // options.block_mask's storage, where the lists are (0: the workspace; pre-passes run)
  // backward: options.dq_reduction and q_descending (the forward leaves them off), dK/dV's tiles,
  // and the reduction's buffers in the workspace: dQ_accum (atomic, ordered) or dQ_parts (split),
  // and the semaphores (ordered)
  DqReduction reduction = DqReduction::recompute;
  bool q_descending = false;
  bool accumulate = false;  // options.accumulate_gradients: dQ, dK, dV f32, added into
  // backward: lse and Delta (at the workspace's base) as TMA copies them: 16-byte aligned bases and
  // outer strides (S_q % 4 == 0, dense), for dK/dV's LSE_IN_RING
  bool row_vectors_aligned = false;
  Schedule dkdv;
  WorkspaceArray dq_ws, dq_sem;
  size_t backward_end = 0;  // the backward's workspace bytes, without the mask's words
  // backward with fused dropout: dK/dV stores the keep-mask's words (DROPOUT_WRITE_BITS) at
  // `dropout_words` (after backward_end; key-major, u32 [B * Hq, cdiv(S_k, 32), S_q]) and dQ reads
  // them (DROPOUT_BITS): Options::dropout_words_max_bytes
  bool mask_once = false;
  WorkspaceArray dropout_words;
};

// A kind other than full and causal: the kernels' MASK meta (full and causal are CAUSAL's paths).
inline bool library_mask(kernels::MaskKind k) { return k != kernels::MaskKind::full && k != kernels::MaskKind::causal; }

// The pass that finishes dQ after dK/dV: the dQ kernel (recompute), the convert kernel (atomic,
// ordered: dQ_accum to dQ) or the reduce kernel (split: the parts to dQ).
inline Pass dq_pass(DqReduction r) {
  return r == DqReduction::recompute ? Pass::bwd_dq : r == DqReduction::split ? Pass::bwd_dq_reduce : Pass::bwd_dq_convert;
}

// ---------------------------------------------------------------------------------------------
// checks.cpp: the argument checks

void check_schedule(const Checker& c, const Options& opts);
// options.mask against the call (fills d.causal, d.mask, d.mask_batch/heads, d.lists).
void check_mask_option(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward);
// options.score_mod (fills d.score_mod).
void check_score_mod_option(const Checker& c, const Tensor& q, const Options& opts, Dims& d);

// How a caller names the reduction options: the call's Options fields, or prepare's arguments.
struct ReductionArgs {
  const char* reduction = "options.dq_reduction";
  const char* descending = "options.q_descending";
  const char* varlen = "variable-length batches (options.cu_seqlens_q/k)";
  const char* mask = "options.mask of kind";
};
// The dQ reduction and query-tile order against the call and this build's kernels.
void check_dq_reduction(const Checker& c, DqReduction reduction, bool q_descending, bool varlen, kernels::MaskKind mask,
                        const ReductionArgs& a = {});
// options.dq_reduction and q_descending of a backward call (the forward ignores them).
void check_reduction_option(const Checker& c, const Options& opts, Dims& d, bool backward);

// Every check of a forward or backward call but the backward's gradients and the workspace (the
// call's shape, its options, and the workspace plan): what forward and backward share.
Dims check_common(const Checker& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                  const Options& opts, bool backward);
// check_common plus the workspace of a forward call, and its outputs disjoint from the rest.
Dims check_forward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                        const Options& opts, Workspace ws);
// check_common plus do, dq, dk, dv and the workspace of a backward call, and its outputs disjoint
// from the rest.
Dims check_backward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_,
                         const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts,
                         Workspace ws);

// ---------------------------------------------------------------------------------------------
// workspace.cpp: workspace planning

size_t round_up_256(size_t n);  // every workspace array's size and offset

// Where a block mask's lists sit in its storage: the forward's, then dK/dV's and (recompute) dQ's,
// each at its kernel's tiles for these options.
struct BlockMaskLayout {
  PrePassLists fwd, dkdv, dq;
  bool has_dq = false;
  size_t end = 0;
};
BlockMaskLayout block_mask_layout(const Checker& c, const Tensor& q, const Dims& d, const Options& opts);

// The workspace of a checked call (fills the lists' and the dQ reduction's places in `d`).
void plan_workspace(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward);
size_t forward_bytes(const Dims& d);
size_t backward_bytes(const Dims& d);
// Whether a backward's kernels can draw its fused dropout mask once (dK/dV's DROPOUT_WRITE_BITS,
// dQ's DROPOUT_BITS: decision 097): recompute, dense, the full or causal mask, dK/dV's BLOCK_N a
// multiple of 64 (whole Philox groups), dQ's of 32 (whole words), and kernels that declare both.
bool mask_once_kernels(bool dropout, DqReduction reduction, bool varlen, bool library_mask, int64_t dkdv_block_n, int64_t dq_block_n);
void check_workspace(const Checker& c, const Workspace& ws, size_t need, const char* sizer);
// What the workspace sizes depend on, from q (and k, when given) alone.
Dims workspace_dims(const char* fn, const Tensor& q, const Tensor* k, const Options& opts, bool backward);

// ---------------------------------------------------------------------------------------------
// schedules.cpp: the configuration (schedules, declared metas, Config and its metas)

// options.schedule, else default_schedule for this call.
Schedule schedule_for(Pass p, const Tensor& q, const Dims& d, const Options& opts);

// The meta names a kernel declares (its build with every default), or nullopt when it has a meta
// without a default (then every meta the API knows is passed).
struct KernelInfo {
  const lang::Kernel* kernel = nullptr;
  std::optional<std::set<std::string>> metas;
};
const KernelInfo& info(Pass p);
// Whether the pass's kernel declares `meta` (every meta when its metas are unknown).
bool declares(Pass p, const char* meta);

// The schedule options a tuning table chose (`tilejit tune attention_fwd` / `attention_bwd_dkdv`,
// a bundle's table or the tuning store; tuned.cpp), applied over the kernel's defaults: the
// forward reads every one, dK/dV `tma_store` (its LSE_IN_RING is Config::lse_in_ring).
struct TunedOptions {
  bool exact_normalize = false, ring_producer = false, pipeline_pv = false, pipeline_qk = false, tma_store = false;
  auto operator<=>(const TunedOptions&) const = default;
};

struct Config {
  Pass pass;
  ir::DType dtype;
  int head_dim;
  bool causal, varlen;
  Schedule sch;
  int device;
  bool dropout = false, return_mask = false, read_bits = false;
  int mask = 0;  // the MASK meta: a library kernels::MaskKind (not full or causal: those are `causal`), 0 = none
  int reduction = 0;          // dK/dV's DQ_REDUCTION (DqReduction), 0 = recompute: the kernel without the meta
  bool q_descending = false;  // dK/dV's Q_DESCENDING
  int score_mod = 0;          // SCORE_MOD (kernels::ScoreModKind), 0 = none: the kernel without the meta
  bool positive_scale = false;  // the forward's POSITIVE_SCALE (softmax_scale > 0, no score mod: the fma softmax)
  bool persistent = false;      // the forward's PERSISTENT (forward_persistent): a 1-D grid of resident programs
  bool accumulate = false;      // dK/dV's and dQ's ACCUMULATE (options.accumulate_gradients)
  bool lse_in_ring = false;     // dK/dV's LSE_IN_RING (dkdv_ring_options)
  bool ring_producer = false;   // dK/dV's RING_PRODUCER (dkdv_ring_options)
  bool dq_writer = false;       // dK/dV's DQ_WRITER (dkdv_ring_options)
  bool write_bits = false;      // dK/dV's DROPOUT_WRITE_BITS (Dims::mask_once; dQ then has read_bits)
  bool words_key_major = false;  // Dims::mask_once: dK/dV writes, dQ reads key-major words (DROPOUT_WORDS_KEY_MAJOR)
  std::optional<TunedOptions> tuned = {};  // options from a tuning table; unset: the kernel's defaults
  auto key() const {
    return std::tuple(static_cast<int>(pass), static_cast<int>(dtype), head_dim, causal, varlen, sch.block_m, sch.block_n,
                      sch.num_warps, sch.stages, sch.min_programs_per_sm, device, dropout, return_mask, read_bits, mask, reduction, q_descending, score_mod,
                      positive_scale, persistent, accumulate, lse_in_ring, ring_producer, dq_writer, write_bits, words_key_major, tuned);
  }
  bool operator<(const Config& o) const { return key() < o.key(); }
};

// Whether dK/dV runs ordered on a persistent grid (PERSISTENT): ordered without the descending walk.
bool persistent_ordered(int reduction, bool q_descending);
// Whether the forward runs on a persistent grid (PERSISTENT): where its ring producer fills the
// rings (D 128, dense, no library mask or score mod), which then prefetches across tiles; not
// with dropout (slower there).
bool forward_persistent(int head_dim, bool varlen, int mask, int score_mod, bool dropout);
// dK/dV's ring options: LSE and Delta read from its TMA ring (LSE_IN_RING), a producer warpgroup
// filling the ring (RING_PRODUCER) and a warp of it adding dQ's parts (DQ_WRITER), where they
// measured faster (decisions 070, 073) and TMA can copy LSE and Delta (row_vectors_aligned). `c` is
// dK/dV's configuration without them.
struct DkdvRingOptions {
  bool lse_in_ring = false, ring_producer = false, dq_writer = false;
};
DkdvRingOptions dkdv_ring_options(const Config& c, bool row_vectors_aligned);
// Options::dq_reduction unset: whether a configuration may run atomic or ordered (on the dQ
// writer) by default, and the reduction a call with these dims and options runs (decisions 075, 100).
bool ordered_may_be_default(int head_dim, kernels::MaskKind mask, bool varlen, bool dropout, bool score_mod, bool schedule,
                            bool q_descending);
bool atomic_may_be_default(int head_dim, kernels::MaskKind mask, bool varlen, bool dropout, bool score_mod, bool schedule,
                           bool q_descending);
DqReduction default_reduction(const Dims& d, const Options& opts);
// The metas of a configuration that its kernel declares.
lang::Meta meta_of(const Config& c);
// `c` (the forward's, dK/dV's or dQ's, without options.schedule) with the tuned choice for its
// shape bucket where a tuning table holds one (bundles first, then the tuning store:
// Autotuner::lookup; never a tuning run): tiles, warps, stages, register bound and the schedule
// options. The forward for dense calls (no varlen, library mask, score mod or dropout); dK/dV for
// those with the recompute reduction, ascending, not accumulating, LSE rows 16-byte aligned; dQ
// (the recompute reduction's) not accumulating; all with S_q = S_k (the tuned problem). Otherwise,
// or with no entry, `c` unchanged. One lookup per bucket and process until a bundle is loaded or
// unloaded (runtime::bundles_generation).
Config with_tuned_choice(Config c, const Dims& d);
// The configuration of pass `p` in a checked call.
Config config(Pass p, const Tensor& q, const Dims& d, const Options& opts);

// ---------------------------------------------------------------------------------------------
// functions.cpp: the compiled-Function caches

Function& function_for(const Config& c);
inline constexpr int64_t kClassTiles = kernels::kBlockClassTiles;  // key tiles per classification program
Function& block_classes_function(const PrePassLists& l, kernels::MaskKind kind);
Function& block_lists_function(const PrePassLists& l);
Function& document_ids_function(int device);  // attention_document_ids

// ---------------------------------------------------------------------------------------------
// varlen_documents.cpp: Options::varlen_documents (a varlen self-attention call as one dense call
// with a document mask; decision 113)

size_t documents_forward_bytes(const Tensor& q, const Tensor& k, const Options& opts);
size_t documents_backward_bytes(const Tensor& q, const Tensor* k, const Options& opts);
// (the checks return the workspace bytes the call needs)
size_t check_documents_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Options& opts, Workspace workspace);
size_t check_documents_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, Workspace workspace);
void documents_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const Options& opts,
                       CUstream stream, Workspace workspace);
void documents_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, CUstream stream, Workspace workspace);

// options.rng_state: i64 / u64 [2] = [seed, offset], unit stride, 8-byte aligned, on `device`
// (checks.cpp). Returns its address.
uint64_t check_rng_state(const Checker& c, const Tensor& s, int device);

// ---------------------------------------------------------------------------------------------
// bindings.cpp: the arguments of a call by kernels::Arg, and the launches of one Function

// The tensors and scalars of one call, one slot per kernels::Arg (views point into the callers'
// Tensors). A launch takes the slots its kernel's signature names (kernels::argument_of).
class KernelArgs {
 public:
  void set(kernels::Arg a, runtime::DeviceArg v) { slots_[kernels::arg_index(a)] = v; }
  // The dropout key: the five scalars (seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold), its
  // coordinates (the attention kernels' dropout_row_offset ... dropout_heads) and,
  // when rng_state != 0, that device address of [seed, offset] (read instead; else a null pointer).
  void set_dropout(const kernels::PhiloxKey& key, uint64_t rng_state, int device) {
    static constexpr int64_t kWords[1] = {4}, kEmpty[1] = {0}, kUnit[1] = {1};
    for (const auto& [a, v] : key.arguments()) set(a, v);
    for (const auto& [a, v] : key.coordinates.arguments()) set(a, v);
    set(kernels::Arg::rng_state, runtime::TensorView{ir::DType::u32, rng_state ? kWords : kEmpty, kUnit, rng_state, device});
    set(kernels::Arg::rng_state_in_memory, static_cast<uint32_t>(rng_state != 0));
  }
  const std::optional<runtime::DeviceArg>& operator[](kernels::Arg a) const { return slots_[kernels::arg_index(a)]; }

 private:
  std::array<std::optional<runtime::DeviceArg>, kernels::kArgCount> slots_;
};
// Launches `fn` with the bound arguments in its parameter order, or (dry) only runs the launch's
// argument checks, which need no GPU: a missing binding or a signature the API does not expect
// shows up in CI, before any driver call.
void launch(Function& fn, runtime::Grid grid, CUstream stream, const KernelArgs& args, bool dry);
// Throws without a driver or when `device` is not on this machine.
void require_gpu(const char* fn, int device);

// The tensors and scalars every kernel of a call may take (views point into the callers' Tensors).
void bind_common(KernelArgs& a, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                 const Dims& d, const Options& opts);
// A library mask's own parameters, for the attention kernels and the pre-pass alike.
void bind_mask(KernelArgs& a, const Options& opts, const Dims& d);
// The score mod's parameter.
void bind_score_mod(KernelArgs& a, const Options& opts, const Dims& d);
// The four lists a kernel reads (kv_* per query tile, KV_MAJOR q_* per key tile), at `base`.
void bind_lists(KernelArgs& a, const PrePassLists& l, uint64_t base);

// ---------------------------------------------------------------------------------------------
// block_mask.cpp: the block-mask pre-pass

// One pre-pass run: the classification (grid (nQB, cdiv(nKB, kClassTiles), Bm * Hm)) unless `classified` already
// classified these tiles into its block_classes (the dK/dV lists' run, for dQ's at the same
// tiles), then the lists (grid (nOuter, Hm, Bm)).
struct PrePass {
  struct Step {
    Function* fn = nullptr;
    runtime::Grid grid;
    KernelArgs args;
  };
  std::vector<Step> steps;
};
PrePass pre_pass(const PrePassLists& l, const Options& opts, const Dims& d, uint64_t base, const PrePassLists* classified = nullptr);
void launch(const PrePass& p, CUstream stream, bool dry);

}  // namespace tilejit::attention::detail
