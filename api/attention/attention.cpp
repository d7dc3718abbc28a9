// tilejit::attention: argument checks (host only), the schedule table, a cache of compiled
// kernels per configuration, and the launches of the forward and the three backward kernels.
#include "api/attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "dsl/builder.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/attention/backward_schedule.hpp"
#include "kernels/philox_host.hpp"
#include "api/registry.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/function.hpp"

namespace tilejit::attention {

// Options::dq_reduction's values are the dK/dV kernel's DQ_REDUCTION meta.
static_assert(static_cast<int>(DqReduction::recompute) == static_cast<int>(kernels::DqReduction::recompute) &&
              static_cast<int>(DqReduction::atomic) == static_cast<int>(kernels::DqReduction::atomic) &&
              static_cast<int>(DqReduction::split) == static_cast<int>(kernels::DqReduction::split) &&
              static_cast<int>(DqReduction::ordered) == static_cast<int>(kernels::DqReduction::ordered));

namespace {

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kGridYZMax = 65535;
constexpr uint64_t kAlign = 16;  // the kernels' ParamSpec::align_bytes for Q, K, V, O and gradients

std::string list(std::span<const int64_t> v) {
  return fmt::format("[{}]", fmt::join(v, ","));
}
std::span<const int64_t> sizes_of(const Tensor& t) { return {t.sizes.data(), static_cast<size_t>(t.rank)}; }

bool is_pow2_in(int v, int lo, int hi) { return v >= lo && v <= hi && std::has_single_bit(static_cast<unsigned>(v)); }

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
  uint32_t keep_threshold = 256;  // kernels::dropout_keep_threshold(dropout_p)
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
  Schedule dkdv;
  WorkspaceArray dq_ws, dq_sem;
  size_t backward_end = 0;  // the backward's workspace bytes
};

// A kind other than full and causal: the kernels' MASK meta (full and causal are CAUSAL's paths).
bool library_mask(kernels::MaskKind k) { return k != kernels::MaskKind::full && k != kernels::MaskKind::causal; }

bool declares(Pass p, const char* meta);

// The pass that finishes dQ after dK/dV: the dQ kernel (recompute), the convert kernel (atomic,
// ordered: dQ_accum to dQ) or the reduce kernel (split: the parts to dQ).
Pass dq_pass(DqReduction r) {
  return r == DqReduction::recompute ? Pass::bwd_dq : r == DqReduction::split ? Pass::bwd_dq_reduce : Pass::bwd_dq_convert;
}

std::string group_name(bool backward) { return backward ? "q, k, v, o, do, dq, dk, dv" : "q, k, v, o"; }

Schedule schedule_for(Pass p, const Tensor& q, const Dims& d, const Options& opts);

void check_schedule(const Checker& c, const Options& opts) {
  if (const auto& sch = opts.schedule) {
    if (!is_pow2_in(sch->block_m, 16, 256) || !is_pow2_in(sch->block_n, 16, 256))
      c.fail("options.schedule has block_m = {}, block_n = {}; both must be powers of two from 16 to 256", sch->block_m,
             sch->block_n);
    if (!is_pow2_in(sch->num_warps, 1, 16)) c.fail("options.schedule.num_warps = {}; valid: 1, 2, 4, 8, 16", sch->num_warps);
    if (sch->stages < 1 || sch->stages > 8) c.fail("options.schedule.stages = {}; valid: 1 to 8", sch->stages);
    if (sch->min_programs_per_sm < 0 || sch->min_programs_per_sm > 32)
      c.fail("options.schedule.min_programs_per_sm = {}; valid: 0 (no bound) to 32", sch->min_programs_per_sm);
  }
}

// options.mask against the call: the kind, its integers (kernels::check_mask's rules), the tensors
// the kind reads (dtype, rank, sizes, device, strides) and none it does not, and the kernels'
// support. Nothing is read from device memory: tensor values are the caller's responsibility.
void check_mask_option(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward) {
  using kernels::MaskKind;
  d.causal = opts.causal;
  if (!opts.mask) return;
  const Mask& m = *opts.mask;
  const int kind = static_cast<int>(m.spec.kind);
  if (kind < 0 || kind >= kernels::kMaskKindCount)
    c.fail("options.mask.spec.kind = {} is not a mask kind; valid: {}", kind, kernels::mask_kind_list());
  const MaskKind k = m.spec.kind;
  const char* kname = kernels::mask_kind_name(k);
  struct MaskTensor {
    const char* name;
    const std::optional<Tensor>* t;
    bool read;
    const char* readers;
    ir::DType dtype;
    int rank;
    const char* layout;
    uint64_t align;
  };
  const std::array<MaskTensor, 3> tensors{{
      {"options.mask.doc_ids", &m.doc_ids, kernels::mask_uses_doc_ids(k), "document, causal_document, share_question, causal_blockwise",
       ir::DType::i32, 2, "[B or 1, S_k]", 4},
      {"options.mask.prefix_lengths", &m.prefix_lengths, k == MaskKind::prefix_lm, "prefix_lm", ir::DType::i32, 1, "[B]", 4},
      {"options.mask.block_table", &m.block_table, k == MaskKind::block_sparse, "block_sparse", ir::DType::u8, 4,
       "[B or 1, Hq or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)]", 1},
  }};
  for (const MaskTensor& t : tensors) {
    if (t.t->has_value() && !t.read) c.fail("{} is set but mask kind {} does not read it (read by: {})", t.name, kname, t.readers);
    if (!t.t->has_value() && t.read) c.fail("{} is not set; mask kind {} needs it: {} {}", t.name, kname, ir::name(t.dtype), t.layout);
  }
  if (!library_mask(k)) {
    d.causal = d.causal || k == MaskKind::causal;
    return;
  }
  if (opts.causal)
    c.fail("options.mask has kind {} and options.causal = true; a library mask does not combine with causal (the causal patterns are "
           "kinds of their own: causal_sliding_window, causal_document, share_question, causal_blockwise; or causal alone)",
           kname);
  if (d.varlen)
    c.fail("options.mask has kind {} with variable-length batches (options.cu_seqlens_q/k); library masks take dense batches only "
           "(packed sequences are a document mask: options.mask.doc_ids)",
           kname);
  for (Pass p : {Pass::forward, Pass::bwd_dkdv, Pass::bwd_dq})
    if ((p == Pass::forward || backward) && !declares(p, "MASK"))
      c.fail("options.mask has kind {}: this build's {} kernel has no MASK meta (library masks are not supported)", kname, name(p));
  // kernels::check_mask's rules: all of them for the kinds without tensors; the others' tensor
  // rules need host values, so their shapes are checked below and their integers here.
  const kernels::MaskProblem pr{d.batch, d.heads_q, d.seq_q, d.seq_k};
  try {
    if (std::ranges::none_of(tensors, [](const MaskTensor& t) { return t.read; })) {
      kernels::check_mask(m.spec, {}, pr);
    } else {
      kernels::mask_detail::check_extent(m.spec, "S_q", pr.s_q, 0, "a sequence length");
      kernels::mask_detail::check_extent(m.spec, "S_k", pr.s_k, 0, "a sequence length");
      if (k == MaskKind::block_sparse) {
        kernels::mask_detail::check_extent(m.spec, "block_q", m.spec.block_q, 1, "the table's query rows per block");
        kernels::mask_detail::check_extent(m.spec, "block_k", m.spec.block_k, 1, "the table's keys per block");
      }
    }
  } catch (const std::invalid_argument& e) {
    c.fail("options.mask.spec: {}", e.what());
  }
  for (const MaskTensor& t : tensors) {
    if (!t.read) continue;
    const Tensor& x = **t.t;
    if (x.dtype != t.dtype) c.fail("{} has dtype {}; it must be {} {}", t.name, ir::name(x.dtype), ir::name(t.dtype), t.layout);
    c.tensor(t.name, x, t.rank, t.layout, t.align);
    c.same_device(t.name, x, q);
  }
  if (m.doc_ids) {
    const Tensor& x = *m.doc_ids;
    if ((x.size(0) != 1 && x.size(0) != d.batch) || x.size(1) != d.seq_k)
      c.fail("options.mask.doc_ids has sizes {} but must be [B or 1, S_k] = [{} or 1,{}] (a document id per key token)",
             list(sizes_of(x)), d.batch, d.seq_k);
    d.mask_batch = x.size(0);
  }
  if (m.prefix_lengths && m.prefix_lengths->size(0) != d.batch)
    c.fail("options.mask.prefix_lengths has sizes {} but must be [B] = [{}] (one prefix length per batch row)",
           list(sizes_of(*m.prefix_lengths)), d.batch);
  if (m.block_table) {
    const Tensor& x = *m.block_table;
    const int64_t nq = lang::cdiv(d.seq_q, m.spec.block_q), nk = lang::cdiv(d.seq_k, m.spec.block_k);
    if ((x.size(0) != 1 && x.size(0) != d.batch) || (x.size(1) != 1 && x.size(1) != d.heads_q) || x.size(2) != nq || x.size(3) != nk)
      c.fail("options.mask.block_table has sizes {} but must be [B or 1, Hq or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)] = "
             "[{} or 1,{} or 1,{},{}] (block_q = {}, block_k = {}, S_q = {}, S_k = {})",
             list(sizes_of(x)), d.batch, d.heads_q, nq, nk, m.spec.block_q, m.spec.block_k, d.seq_q, d.seq_k);
    d.mask_batch = x.size(0);
    d.mask_heads = x.size(1);
  }
  d.mask = k;
  d.lists = !kernels::mask_has_tile_intervals(k);
}

// options.score_mod: its kind, and the slopes (alibi) or the cap (softcap) it needs.
void check_score_mod_option(const Checker& c, const Tensor& q, const Options& opts, Dims& d) {
  const ScoreMod& s = opts.score_mod;
  const int kind = static_cast<int>(s.kind);
  if (kind < 0 || kind >= kernels::kScoreModKindCount)
    c.fail("options.score_mod.kind = {} is not a score mod; valid: 0 none, 1 alibi, 2 softcap", kind);
  if (s.kind == kernels::ScoreModKind::none) return;
  if (!declares(Pass::forward, "SCORE_MOD"))
    c.fail("options.score_mod.kind = {}: this build's attention kernels have no SCORE_MOD meta", kernels::score_mod_kind_name(s.kind));
  if (s.kind == kernels::ScoreModKind::alibi) {
    if (!s.alibi_slopes) c.fail("options.score_mod.kind = alibi needs options.score_mod.alibi_slopes (f32 [Hq] = [{}])", d.heads_q);
    const Tensor& t = *s.alibi_slopes;
    if (t.dtype != ir::DType::f32) c.fail("options.score_mod.alibi_slopes has dtype {}; it must be f32", ir::name(t.dtype));
    c.tensor("options.score_mod.alibi_slopes", t, 1, "[Hq]", 4);
    c.same_device("options.score_mod.alibi_slopes", t, q);
    if (t.size(0) != d.heads_q) c.fail("options.score_mod.alibi_slopes has sizes {} but must be [Hq] = [{}]", list(sizes_of(t)), d.heads_q);
  } else if (!(std::isfinite(s.softcap) && s.softcap > 0)) {
    c.fail("options.score_mod.softcap = {}; with kind softcap it must be finite and > 0", s.softcap);
  }
  d.score_mod = s.kind;
}

size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }

// How a caller names the reduction options: the call's Options fields, or prepare's arguments.
struct ReductionArgs {
  const char* reduction = "options.dq_reduction";
  const char* descending = "options.q_descending";
  const char* varlen = "variable-length batches (options.cu_seqlens_q/k)";
  const char* mask = "options.mask of kind";
};

std::string supported_reductions() {
  std::vector<std::string> ok;
  for (DqReduction r : {DqReduction::recompute, DqReduction::atomic, DqReduction::split, DqReduction::ordered})
    if (dq_reduction_supported(r)) ok.push_back(fmt::format("{} {}", static_cast<int>(r), name(r)));
  return ok.empty() ? std::string("none (no backward kernels)") : fmt::format("{}", fmt::join(ok, ", "));
}

// The backward's dQ reduction and query-tile order against the call (varlen, the mask kind) and
// what the dK/dV kernel refuses (kernels/attention/backward.hpp: the reductions with VARLEN,
// ordered with a library MASK, Q_DESCENDING with split or a library MASK), before anything runs.
void check_dq_reduction(const Checker& c, DqReduction reduction, bool q_descending, bool varlen, kernels::MaskKind mask,
                        const ReductionArgs& a = {}) {
  const int r = static_cast<int>(reduction);
  if (r < 0 || r > 3) c.fail("{} = {} is not a dQ reduction; valid: 0 recompute, 1 atomic, 2 split, 3 ordered", a.reduction, r);
  const char* rname = name(reduction);
  if (reduction != DqReduction::recompute) {
    if (varlen)
      c.fail("{} = {} with {}; the atomic, split and ordered reductions take dense batches only (their workspaces are laid out "
             "per dense [B, Hq, S_q]); use recompute",
             a.reduction, rname, a.varlen);
    if (reduction == DqReduction::ordered && library_mask(mask))
      c.fail("{} = ordered with {} {}; ordered takes the full and causal masks only (its semaphore waits count every earlier key "
             "tile); use atomic or split with library masks",
             a.reduction, a.mask, kernels::mask_kind_name(mask));
    if (!dq_reduction_supported(reduction))
      c.fail("{} = {}: this build's attention_bwd_dkdv kernel does not take DQ_REDUCTION = {} (or the {} kernel is missing); "
             "valid here: {}",
             a.reduction, rname, r, reduction == DqReduction::split ? "attention_bwd_dq_reduce" : "attention_bwd_dq_convert",
             supported_reductions());
  }
  if (!q_descending) return;
  if (reduction == DqReduction::split)
    c.fail("{} = true with {} = split; the dK/dV kernel takes Q_DESCENDING with recompute, atomic and ordered only", a.descending,
           a.reduction);
  if (library_mask(mask))
    c.fail("{} = true with {} {}; the descending walk is for the full and causal masks only", a.descending, a.mask,
           kernels::mask_kind_name(mask));
  if (!declares(Pass::bwd_dkdv, "Q_DESCENDING"))
    c.fail("{} = true: this build's attention_bwd_dkdv kernel has no Q_DESCENDING meta", a.descending);
}

// options.dq_reduction and q_descending of a backward call (the forward ignores them).
void check_reduction_option(const Checker& c, const Options& opts, Dims& d, bool backward) {
  if (!backward) return;
  check_dq_reduction(c, opts.dq_reduction, opts.q_descending, d.varlen, d.mask);
  d.reduction = opts.dq_reduction;
  d.q_descending = opts.q_descending;
}

// A row-major array of `t` with these extents at byte `at`, its size rounded up to 256.
WorkspaceArray workspace_array(ir::DType t, std::initializer_list<int64_t> sizes, size_t at) {
  WorkspaceArray a;
  a.dtype = t;
  a.rank = sizes.size();
  std::ranges::copy(sizes, a.sizes.begin());
  int64_t n = 1;
  for (size_t i = a.rank; i-- > 0;) {
    a.strides[i] = n;
    n *= a.sizes[i];
  }
  a.at = at;
  a.bytes = round_up_256(static_cast<size_t>(n) * static_cast<size_t>(ir::byte_size(t)));
  return a;
}

// Where one pre-pass run's outputs go, from byte `offset` of the workspace: the lists of the
// kernel with schedule `s` (kv_major: per key tile, for dK/dV), for the mask's Bm x Hm.
PrePassLists plan_lists(const Checker& c, const Dims& d, const Schedule& s, bool kv_major, size_t offset, int device) {
  PrePassLists l;
  l.block_m = s.block_m;
  l.block_n = s.block_n;
  l.kv_major = kv_major;
  l.device = device;
  l.q_blocks = lang::cdiv(d.seq_q, s.block_m);
  l.k_blocks = lang::cdiv(d.seq_k, s.block_n);
  l.outer = kv_major ? l.k_blocks : l.q_blocks;
  l.mask_batch = d.mask_batch;
  l.mask_heads = d.mask_heads;
  const int64_t inner = kv_major ? l.q_blocks : l.k_blocks, bh = d.mask_batch * d.mask_heads;
  // (sizes up to 2^29 per dim: the product can overflow 64 bits; refuse anything near)
  if (static_cast<double>(bh) * static_cast<double>(l.outer) * static_cast<double>(inner) > 0x1p56)
    c.fail("options.mask: the block-mask lists at {}x{} tiles would hold {} x {} x {} entries, more than 2^56", s.block_m, s.block_n, bh,
           l.outer, inner);
  // the classification's grid is (nQB, nKB, Bm * Hm): the driver's y and z limits
  if (l.k_blocks > 65535 || bh > 65535)
    c.fail("options.mask: the block-mask pre-pass at {}x{} tiles launches {} key tiles x {} mask batches*heads; at most 65535 each", s.block_m,
           s.block_n, l.k_blocks, bh);
  l.cls_sizes = {d.mask_batch, d.mask_heads, l.q_blocks, l.k_blocks};
  l.cls_strides = {d.mask_heads * l.q_blocks * l.k_blocks, l.q_blocks * l.k_blocks, l.k_blocks, 1};
  l.idx_sizes = {d.mask_batch, d.mask_heads, l.outer, inner};
  l.idx_strides = {d.mask_heads * l.outer * inner, l.outer * inner, inner, 1};
  l.num_sizes = {d.mask_batch, d.mask_heads, l.outer};
  l.num_strides = {d.mask_heads * l.outer, l.outer, 1};
  const size_t num_bytes = round_up_256(static_cast<size_t>(bh * l.outer) * 4);
  const size_t idx_bytes = round_up_256(static_cast<size_t>(bh * l.outer * inner) * 4);
  l.num_at = round_up_256(offset);
  l.idx_at = l.num_at + num_bytes;
  l.full_num_at = l.idx_at + idx_bytes;
  l.full_idx_at = l.full_num_at + num_bytes;
  l.cls_at = l.full_idx_at + idx_bytes;
  l.end = l.cls_at + round_up_256(static_cast<size_t>(bh * l.q_blocks * l.k_blocks));
  return l;
}

size_t delta_bytes(const Dims& d) {
  const int64_t n = d.varlen ? d.heads_q * d.total_q : d.batch * d.heads_q * d.seq_q;
  return round_up_256(static_cast<size_t>(n) * 4);
}

// Where a block mask's lists sit in its storage: the forward's, then dK/dV's and (recompute) dQ's,
// each at its kernel's tiles for these options.
struct BlockMaskLayout {
  PrePassLists fwd, dkdv, dq;
  bool has_dq = false;
  size_t end = 0;
};
BlockMaskLayout block_mask_layout(const Checker& c, const Tensor& q, const Dims& d, const Options& opts) {
  BlockMaskLayout l;
  l.fwd = plan_lists(c, d, schedule_for(Pass::forward, q, d, opts), false, 0, q.device);
  l.dkdv = plan_lists(c, d, schedule_for(Pass::bwd_dkdv, q, d, opts), true, l.fwd.end, q.device);
  l.end = l.dkdv.end;
  if (d.reduction == DqReduction::recompute) {
    l.dq = plan_lists(c, d, schedule_for(Pass::bwd_dq, q, d, opts), false, l.end, q.device);
    l.has_dq = true;
    l.end = l.dq.end;
  }
  return l;
}

// options.block_mask for a call whose mask needs lists: built for this call (else a clear error),
// then its lists are read from its storage.
void use_block_mask(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward) {
  const BlockMask& bm = *opts.block_mask;
  if (bm.storage.data == 0) c.fail("options.block_mask has no storage: make it with build_block_mask");
  if (bm.kind != d.mask)
    c.fail("options.block_mask was built for mask {}, this call's mask is {}", kernels::mask_kind_name(bm.kind), kernels::mask_kind_name(d.mask));
  if (bm.seq_q != d.seq_q || bm.seq_k != d.seq_k)
    c.fail("options.block_mask was built for S_q = {}, S_k = {}; this call has S_q = {}, S_k = {}", bm.seq_q, bm.seq_k, d.seq_q, d.seq_k);
  if (bm.mask_batch != d.mask_batch || bm.mask_heads != d.mask_heads)
    c.fail("options.block_mask was built for mask extents Bm = {}, Hm = {}; this call's mask data has Bm = {}, Hm = {}", bm.mask_batch,
           bm.mask_heads, d.mask_batch, d.mask_heads);
  if (bm.device != q.device) c.fail("options.block_mask is on device {}, this call's tensors on device {}", bm.device, q.device);
  const BlockMaskLayout l = block_mask_layout(c, q, d, opts);
  const auto same = [&](const int64_t (&t)[2], const PrePassLists& p, const char* kernel) {
    if (t[0] != p.block_m || t[1] != p.block_n)
      c.fail("options.block_mask holds the {} lists at {}x{} tiles, but this call's {} kernel runs at {}x{} (build it with the "
             "options of the calls: dropout, dq_reduction and schedule change the tiles)",
             kernel, t[0], t[1], kernel, p.block_m, p.block_n);
  };
  same(bm.forward_tiles, l.fwd, "forward");  // (its size places the backward's lists)
  if (backward) {
    same(bm.dkdv_tiles, l.dkdv, "dK/dV");
    if (l.has_dq) same(bm.dq_tiles, l.dq, "dQ");
  }
  // (a forward knows no dq_reduction: it reads only the forward's lists, at the start)
  const size_t need = backward ? l.end : l.fwd.end;
  if (bm.storage.bytes < need)
    c.fail("options.block_mask.storage has {} bytes, its lists need {} (block_mask_bytes)", bm.storage.bytes, need);
  d.lists_base = bm.storage.data;
  d.fwd_lists = l.fwd;
  d.dkdv_lists = l.dkdv;
  d.dq_lists = l.dq;
}

// The workspace of a checked call. Forward: the pre-pass lists (opts.mask of a kind without tile
// intervals) at offset 0, unless options.block_mask holds them. Backward: Delta; the lists of dK/dV (and, with recompute, of dQ: the
// reductions run no dQ kernel); then the reduction's dQ_accum or dQ_parts, and the semaphores.
void plan_workspace(const Checker& c, const Tensor& q, const Options& opts, Dims& d, bool backward) {
  if (d.lists && opts.block_mask) use_block_mask(c, q, opts, d, backward);
  const bool lists_here = d.lists && d.lists_base == 0;  // in the workspace, written by this call's pre-passes
  if (!backward) {
    if (lists_here) d.fwd_lists = plan_lists(c, d, schedule_for(Pass::forward, q, d, opts), false, 0, q.device);
    return;
  }
  d.dkdv = schedule_for(Pass::bwd_dkdv, q, d, opts);
  size_t at = delta_bytes(d);
  if (lists_here) {
    d.dkdv_lists = plan_lists(c, d, d.dkdv, true, at, q.device);
    at = d.dkdv_lists.end;
    if (d.reduction == DqReduction::recompute) {
      d.dq_lists = plan_lists(c, d, schedule_for(Pass::bwd_dq, q, d, opts), false, at, q.device);
      at = d.dq_lists.end;
    }
  }
  if (d.reduction != DqReduction::recompute) {
    const int64_t bh = d.batch * d.heads_q, m = lang::cdiv(d.seq_q, d.dkdv.block_m), n = lang::cdiv(d.seq_k, d.dkdv.block_n);
    const bool split = d.reduction == DqReduction::split;
    // (sizes up to 2^31 per dim: refuse what would overflow the byte count or the kernels' i32
    // head-and-tile indices)
    const double elems = split ? double(bh) * double(m) * double(n) * double(d.dkdv.block_m) * double(d.head_dim)
                               : double(bh) * double(d.seq_q) * double(d.head_dim);
    if (elems * 4 > 0x1p56)
      c.fail("options.dq_reduction = {}: its workspace would need {:.3g} bytes, more than 2^56", name(d.reduction), elems * 4);
    if (double(bh) * double(m) > double(kI32Max))
      c.fail("options.dq_reduction = {}: B * Hq * cdiv(S_q, BLOCK_M) = {} * {} * {} tiles exceed the kernels' i32 index range",
             name(d.reduction), d.batch, d.heads_q, m);
    d.dq_ws = split ? workspace_array(ir::DType::f32, {bh, m, n, d.dkdv.block_m, d.head_dim}, at)
                    : workspace_array(ir::DType::f32, {d.batch, d.heads_q, d.seq_q, d.head_dim}, at);
    at += d.dq_ws.bytes;
    if (d.reduction == DqReduction::ordered) {
      d.dq_sem = workspace_array(ir::DType::i32, {bh, m}, at);
      at += d.dq_sem.bytes;
    }
  }
  d.backward_end = at;
}

size_t forward_bytes(const Dims& d) { return d.lists && d.lists_base == 0 ? d.fwd_lists.end : 0; }
size_t backward_bytes(const Dims& d) { return d.backward_end; }

void check_workspace(const Checker& c, const Workspace& ws, size_t need, const char* sizer) {
  if (ws.data == 0 && ws.bytes != 0) c.fail("workspace has {} bytes but a null pointer", ws.bytes);
  if (ws.data != 0) {
    if (ws.data % kAlign != 0) c.fail("workspace address {:#x} is not a multiple of {} bytes", ws.data, kAlign);
    if (ws.bytes < need) c.fail("workspace has {} bytes; this call needs {} ({})", ws.bytes, need, sizer);
  }
}

Dims check_common(const Checker& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                  const Options& opts, bool backward) {
  Dims d;
  const bool has_q = opts.cu_seqlens_q.has_value(), has_k = opts.cu_seqlens_k.has_value();
  if (has_q != has_k)
    c.fail("{} is set but {} is not (variable-length batches need both)", has_q ? "options.cu_seqlens_q" : "options.cu_seqlens_k",
           has_q ? "options.cu_seqlens_k" : "options.cu_seqlens_q");
  d.varlen = has_q;
  if (!d.varlen && (opts.max_seqlen_q != 0 || opts.max_seqlen_k != 0))
    c.fail("options.max_seqlen_q/k = {}/{} are set without cu_seqlens_q/k (they only apply to variable-length batches)",
           opts.max_seqlen_q, opts.max_seqlen_k);

  // dtype first: it decides the byte sizes of the alignment checks.
  if (q.dtype != ir::DType::bf16 && q.dtype != ir::DType::f16)
    c.fail("q has dtype {}; supported: bf16, f16", ir::name(q.dtype));
  const std::string group = group_name(backward);
  c.same_dtype("k", k, q, group.c_str());
  c.same_dtype("v", v, q, group.c_str());
  c.same_dtype("o", o, q, group.c_str());

  const int rank = d.varlen ? 3 : 4;
  const char* q_layout = d.varlen ? "[total_q, Hq, D] (varlen)" : "[B, S_q, Hq, D]";
  const char* k_layout = d.varlen ? "[total_k, Hkv, D] (varlen)" : "[B, S_k, Hkv, D]";
  c.tensor("q", q, rank, q_layout, kAlign);
  c.tensor("k", k, rank, k_layout, kAlign);
  c.tensor("v", v, rank, k_layout, kAlign);
  c.tensor("o", o, rank, q_layout, kAlign);
  c.same_device("k", k, q);
  c.same_device("v", v, q);
  c.same_device("o", o, q);

  const int s = d.varlen ? 0 : 1, h = s + 1, dd = s + 2;  // dims of S, H, D
  d.head_dim = q.size(dd);
  if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256)
    c.fail("head dim D = {} (q.sizes[{}]) is not supported; supported: 64, 128, 256", d.head_dim, dd);
  if (k.size(dd) != d.head_dim) c.fail("k has head dim D = {} but q has D = {} (they must match)", k.size(dd), d.head_dim);
  if (!d.varlen && k.size(0) != q.size(0))
    c.fail("k has batch size B = {} but q has B = {} (they must match)", k.size(0), q.size(0));
  c.same_sizes("v", v, "k", k);
  c.same_sizes("o", o, "q", q);
  d.heads_q = q.size(h);
  d.heads_kv = k.size(h);
  if (d.heads_q % d.heads_kv != 0)
    c.fail("q has Hq = {} heads, not a multiple of k's Hkv = {} (grouped-query attention needs Hq % Hkv == 0)", d.heads_q,
           d.heads_kv);
  if (d.heads_q > kGridYZMax) c.fail("q has Hq = {} heads; at most {} (the launch grid's y dimension)", d.heads_q, kGridYZMax);

  if (d.varlen) {
    const Tensor& cq = *opts.cu_seqlens_q;
    const Tensor& ck = *opts.cu_seqlens_k;
    for (auto [name, t] : {std::pair{"options.cu_seqlens_q", &cq}, std::pair{"options.cu_seqlens_k", &ck}}) {
      if (t->dtype != ir::DType::i32) c.fail("{} has dtype {}; it must be i32 (B + 1 offsets)", name, ir::name(t->dtype));
      c.tensor(name, *t, 1, "[B + 1]", 4);
      c.same_device(name, *t, q);
      if (t->size(0) < 2) c.fail("{} has {} entries; it needs B + 1 >= 2 (offsets 0, ..., total)", name, t->size(0));
    }
    if (cq.size(0) != ck.size(0))
      c.fail("options.cu_seqlens_q has {} entries but options.cu_seqlens_k has {} (both are B + 1 offsets)", cq.size(0), ck.size(0));
    d.batch = cq.size(0) - 1;
    d.total_q = q.size(0);
    d.total_k = k.size(0);
    if (opts.max_seqlen_q < 1 || opts.max_seqlen_q > d.total_q)
      c.fail("options.max_seqlen_q = {}; with cu_seqlens it must be between 1 and q's total tokens {}", opts.max_seqlen_q, d.total_q);
    if (opts.max_seqlen_k < 1 || opts.max_seqlen_k > d.total_k)
      c.fail("options.max_seqlen_k = {}; with cu_seqlens it must be between 1 and k's total tokens {}", opts.max_seqlen_k, d.total_k);
    d.seq_q = opts.max_seqlen_q;
    d.seq_k = opts.max_seqlen_k;
  } else {
    d.batch = q.size(0);
    d.seq_q = q.size(1);
    d.seq_k = k.size(1);
  }
  if (d.batch > kGridYZMax) c.fail("batch size B = {}; at most {} (the launch grid's z dimension)", d.batch, kGridYZMax);

  // lse: f32 [B, Hq, S_q] (varlen [Hq, total_q]), unit stride on the sequence.
  if (lse.dtype != ir::DType::f32) c.fail("lse has dtype {}; it must be f32", ir::name(lse.dtype));
  const char* lse_layout = d.varlen ? "[Hq, total_q] (varlen)" : "[B, Hq, S_q]";
  c.tensor("lse", lse, d.varlen ? 2 : 3, lse_layout, 4);
  c.same_device("lse", lse, q);
  const bool lse_ok = d.varlen ? lse.size(0) == d.heads_q && lse.size(1) == d.total_q
                               : lse.size(0) == d.batch && lse.size(1) == d.heads_q && lse.size(2) == d.seq_q;
  if (!lse_ok)
    c.fail("lse has sizes {} but must be {} = {}", list(sizes_of(lse)), lse_layout,
           d.varlen ? fmt::format("[{},{}]", d.heads_q, d.total_q) : fmt::format("[{},{},{}]", d.batch, d.heads_q, d.seq_q));

  d.scale = opts.softmax_scale.value_or(static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim))));
  if (!std::isfinite(d.scale)) c.fail("options.softmax_scale = {} is not finite", d.scale);

  check_schedule(c, opts);
  if (d.varlen && !varlen_supported(backward))
    c.fail("variable-length batches (options.cu_seqlens_q/k) are not supported by this build's {} kernels (no VARLEN meta)",
           backward ? "backward" : "forward");

  // Dropout: p in [0, 1); the mask for tests (forward).
  if (!(opts.dropout_p >= 0.0 && opts.dropout_p < 1.0))
    c.fail("options.dropout_p = {} is not in [0, 1) (0: no dropout)", opts.dropout_p);
  d.dropout = opts.dropout_p > 0.0;
  if (d.dropout) {
    for (Pass p : {Pass::forward, Pass::bwd_dkdv, Pass::bwd_dq})
      if ((p == Pass::forward || backward) && !declares(p, "DROPOUT"))
        c.fail("options.dropout_p = {}: this build's {} kernel has no DROPOUT meta (dropout is not supported)", opts.dropout_p, name(p));
    d.keep_threshold = kernels::dropout_keep_threshold(opts.dropout_p);
  }
  if (opts.dropout_mask && !backward) {
    if (!d.dropout) c.fail("options.dropout_mask is set but options.dropout_p = 0 (the mask is dropout's; set dropout_p > 0)");
    const Tensor& m = *opts.dropout_mask;
    if (m.dtype != ir::DType::u8) c.fail("options.dropout_mask has dtype {}; it must be u8 (1 = kept)", ir::name(m.dtype));
    const char* layout = d.varlen ? "[B * Hq, max_seqlen_q, max_seqlen_k]" : "[B * Hq, S_q, S_k]";
    c.tensor("options.dropout_mask", m, 3, layout, 1);
    c.same_device("options.dropout_mask", m, q);
    const std::array<int64_t, 3> want{d.batch * d.heads_q, d.seq_q, d.seq_k};
    if (m.size(0) != want[0] || m.size(1) != want[1] || m.size(2) != want[2])
      c.fail("options.dropout_mask has sizes {} but must be {} = {}", list(sizes_of(m)), layout, list(want));
    d.return_mask = true;
  }
  if (opts.dropout_bits) {
    if (!d.dropout) c.fail("options.dropout_bits is set but options.dropout_p = 0 (the bits are dropout's; set dropout_p > 0)");
    if (d.varlen) c.fail("options.dropout_bits: the precomputed mask is for dense batches (not with cu_seqlens)");
    for (Pass p : {Pass::forward, Pass::bwd_dkdv, Pass::bwd_dq})
      if ((p == Pass::forward || backward) && !declares(p, "DROPOUT_BITS"))
        c.fail("options.dropout_bits: this build's {} kernel cannot read a precomputed mask (no DROPOUT_BITS meta)", name(p));
    if (opts.schedule && opts.schedule->block_n % 32 != 0)
      c.fail("options.schedule.block_n = {} with options.dropout_bits: the kernels read whole 32-column mask words, so block_n "
             "must be a multiple of 32", opts.schedule->block_n);
    const Tensor& m = *opts.dropout_bits;
    if (m.dtype != ir::DType::u32) c.fail("options.dropout_bits has dtype {}; it must be u32 (packed bits)", ir::name(m.dtype));
    c.tensor("options.dropout_bits", m, 3, "[B * Hq, S_q, cdiv(S_k, 32)]", 4);
    c.same_device("options.dropout_bits", m, q);
    const std::array<int64_t, 3> want{d.batch * d.heads_q, d.seq_q, (d.seq_k + 31) / 32};
    if (m.size(0) != want[0] || m.size(1) != want[1] || m.size(2) != want[2])
      c.fail("options.dropout_bits has sizes {} but must be [B * Hq, S_q, cdiv(S_k, 32)] = {}", list(sizes_of(m)), list(want));
    d.read_bits = true;
  }
  check_mask_option(c, q, opts, d, backward);
  check_score_mod_option(c, q, opts, d);
  check_reduction_option(c, opts, d, backward);
  plan_workspace(c, q, opts, d, backward);
  return d;
}

Dims check_backward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_,
                         const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts,
                         Workspace ws) {
  const Checker c("backward");
  const Dims d = check_common(c, q, k, v, o, lse, opts, true);
  if (!backward_available())
    c.fail("the backward kernels (attention_bwd_preprocess, attention_bwd_dkdv, attention_bwd_dq) are not in this build's "
           "kernel library");
  const std::string group = group_name(true);
  const int rank = d.varlen ? 3 : 4;
  const char* q_layout = d.varlen ? "[total_q, Hq, D] (varlen)" : "[B, S_q, Hq, D]";
  const char* k_layout = d.varlen ? "[total_k, Hkv, D] (varlen)" : "[B, S_k, Hkv, D]";
  for (auto [name, t, ref_name, ref, layout] :
       {std::tuple{"do", &do_, "q", &q, q_layout}, std::tuple{"dq", &dq, "q", &q, q_layout},
        std::tuple{"dk", &dk, "k", &k, k_layout}, std::tuple{"dv", &dv, "v", &v, k_layout}}) {
    c.same_dtype(name, *t, q, group.c_str());
    c.tensor(name, *t, rank, layout, kAlign);
    c.same_device(name, *t, q);
    c.same_sizes(name, *t, ref_name, *ref);
  }
  check_workspace(c, ws, backward_bytes(d), "backward_workspace_bytes");
  return d;
}

// ---------------------------------------------------------------------------------------------
// Kernels, their declared metas, and the compiled-function cache

const lang::Kernel* kernel_of(Pass p) {
  if (p == Pass::forward) return &kernels::attention_forward();
  const library::LibraryKernel* lk = library::find(name(p));
  return lk ? &lk->kernel() : nullptr;
}

// The meta names a kernel declares (its build with every default), or nullopt when it has a meta
// without a default (then every meta the API knows is passed).
struct KernelInfo {
  const lang::Kernel* kernel = nullptr;
  std::optional<std::set<std::string>> metas;
};
constexpr size_t kPasses = 6;
const KernelInfo& info(Pass p) {
  static std::once_flag once[kPasses];
  static KernelInfo infos[kPasses];
  const auto i = static_cast<size_t>(p);
  std::call_once(once[i], [&] {
    KernelInfo& ki = infos[i];
    ki.kernel = kernel_of(p);
    if (!ki.kernel) return;
    try {
      const ir::Function fn = ki.kernel->build({});
      ki.metas.emplace();
      for (const ir::MetaEntry& m : fn.meta) ki.metas->insert(m.name);
    } catch (const std::exception&) {
    }
  });
  return infos[i];
}

bool declares(Pass p, const char* meta) {
  const KernelInfo& ki = info(p);
  return ki.kernel && (!ki.metas || ki.metas->contains(meta));
}

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
  auto key() const {
    return std::tuple(static_cast<int>(pass), static_cast<int>(dtype), head_dim, causal, varlen, sch.block_m, sch.block_n,
                      sch.num_warps, sch.stages, sch.min_programs_per_sm, device, dropout, return_mask, read_bits, mask, reduction, q_descending, score_mod,
                      positive_scale);
  }
  bool operator<(const Config& o) const { return key() < o.key(); }
};

// Whether dK/dV runs ordered on a persistent grid with DASH's shift schedule (PERSISTENT): ordered
// without the descending walk. The grid holds as many programs as are resident at once (occupancy:
// at D 64 two per SM; one per SM there was 0.71x as fast as the non-persistent walk, H100 S4k).
bool persistent_ordered(int reduction, bool q_descending) {
  return reduction == static_cast<int>(DqReduction::ordered) && !q_descending;
}

lang::Meta meta_of(const Config& c) {
  lang::Meta all{{"DTYPE", c.dtype},    {"BLOCK_M", c.sch.block_m}, {"BLOCK_N", c.sch.block_n},
                 {"HEAD_DIM", c.head_dim}, {"CAUSAL", c.causal},       {"BSHD", !c.varlen}};
  // Packed varlen tensors are [total, H, D] whatever BSHD says; the kernels refuse both at once.
  if (c.varlen) all.emplace_back("VARLEN", true);
  // Dropout only when asked for: without it the kernels are the ones without dropout.
  if (c.dropout) all.emplace_back("DROPOUT", true);
  if (c.return_mask) all.emplace_back("RETURN_MASK", true);
  if (c.read_bits) all.emplace_back("DROPOUT_BITS", true);
  // MASK only for library masks: full and causal keep the kernels (and cache entries) without it
  if (c.mask != 0) all.emplace_back("MASK", c.mask);
  // likewise the reduction and the descending walk: recompute's dK/dV is the kernel without them
  if (c.reduction != 0) all.emplace_back("DQ_REDUCTION", c.reduction);
  if (c.q_descending) all.emplace_back("Q_DESCENDING", true);
  if (persistent_ordered(c.reduction, c.q_descending)) all.emplace_back("PERSISTENT", true);
  if (c.score_mod != 0) all.emplace_back("SCORE_MOD", c.score_mod);
  if (c.positive_scale) all.emplace_back("POSITIVE_SCALE", true);
  // A forward with a register bound normalises by rcp: the exact division's subroutine makes ptxas
  // serialise every wgmma, which only paid (D 64) as a way to fit two programs per SM.
  if (c.pass == Pass::forward && c.sch.min_programs_per_sm > 0) all.emplace_back("EXACT_NORMALIZE", false);
  lang::Meta used;
  for (auto& m : all)
    if (declares(c.pass, m.first.c_str())) used.push_back(std::move(m));
  return used;
}

// One Function per configuration, created once and kept for the life of the process (the
// documented cache of this module); Function itself compiles once under concurrent first calls.
Function& function_for(const Config& c) {
  static std::mutex mu;
  static std::map<Config, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[c];
  if (!slot) {
    const KernelInfo& ki = info(c.pass);
    if (!ki.kernel) throw std::logic_error(fmt::format("tilejit::attention: kernel '{}' is not in the library", name(c.pass)));
    jit::CompileOptions o;
    o.num_warps = c.sch.num_warps;
    o.pipeline.stages = c.sch.stages;
    o.min_programs_per_sm = c.sch.min_programs_per_sm;
    slot = std::make_unique<Function>(*ki.kernel, meta_of(c), o, c.device);
  }
  return *slot;
}

constexpr int64_t kClassTiles = kernels::kBlockClassTiles;  // key tiles per classification program

// The pre-pass's kernels for one kernel's lists (its tiles, its order) and mask kind, per device,
// created once (the same documented cache as function_for): the classification (8 warps for
// 128 x 128 tiles, each program evaluates a [128, 128] tile and 4 warps spill; 4 below), then the
// lists (4 warps).
Function& block_classes_function(const PrePassLists& l, kernels::MaskKind kind) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int, int>, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[{l.block_m, l.block_n, static_cast<int>(kind), l.device}];
  if (!slot) {
    jit::CompileOptions o;
    o.num_warps = l.block_m * l.block_n >= 128 * 128 ? 8 : 4;
    o.pipeline.stages = 2;
    const lang::Meta meta{{"BLOCK_M", l.block_m}, {"BLOCK_N", l.block_n}, {"MASK", static_cast<int>(kind)}, {"TILES", kClassTiles}};
    slot = std::make_unique<Function>(kernels::attention_block_classes(), meta, o, l.device);
  }
  return *slot;
}
Function& block_lists_function(const PrePassLists& l) {
  static std::mutex mu;
  static std::map<std::tuple<bool, int>, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[{l.kv_major, l.device}];
  if (!slot) {
    jit::CompileOptions o;
    o.num_warps = 4;
    o.pipeline.stages = 2;
    slot = std::make_unique<Function>(kernels::attention_block_lists(), lang::Meta{{"KV_MAJOR", l.kv_major}}, o, l.device);
  }
  return *slot;
}

Schedule schedule_for(Pass p, const Tensor& q, const Dims& d, const Options& opts) {
  return opts.schedule ? *opts.schedule
                       : default_schedule(p, q.dtype, static_cast<int>(d.head_dim), d.causal, opts.cu_seqlens_q.has_value(),
                                          d.reduction, d.dropout, library_mask(d.mask));
}

// The tensors and scalars of one call by normalised parameter name (lower case, no '_').
struct Bindings {
  std::vector<std::pair<std::string, runtime::DeviceArg>> named;
  void add(std::string name, runtime::DeviceArg a) { named.emplace_back(std::move(name), a); }
  void set(const std::string& name, runtime::DeviceArg a) {
    for (auto& e : named)
      if (e.first == name) e.second = a;
  }
};
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

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string Tensor::describe() const { return view().describe(); }

runtime::TensorView Tensor::view() const {
  const auto n = static_cast<size_t>(std::clamp(rank, 0, 4));
  return runtime::TensorView{dtype, std::span<const int64_t>(sizes.data(), n), std::span<const int64_t>(strides.data(), n), data,
                             device};
}

Tensor contiguous(uint64_t data, ir::DType dtype, std::initializer_list<int64_t> sizes, int device) {
  if (sizes.size() > 4) throw std::invalid_argument(fmt::format("tilejit::attention::contiguous: rank {} > 4", sizes.size()));
  Tensor t{data, dtype, static_cast<int>(sizes.size()), {}, {}, device};
  std::ranges::copy(sizes, t.sizes.begin());
  int64_t s = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[static_cast<size_t>(d)] = s;
    s *= t.size(d);
  }
  return t;
}

Tensor strided(uint64_t data, ir::DType dtype, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
               int device) {
  if (sizes.size() > 4 || sizes.size() != strides.size())
    throw std::invalid_argument(fmt::format("tilejit::attention::strided: {} sizes and {} strides (rank at most 4, one stride per size)",
                                            sizes.size(), strides.size()));
  Tensor t{data, dtype, static_cast<int>(sizes.size()), {}, {}, device};
  std::ranges::copy(sizes, t.sizes.begin());
  std::ranges::copy(strides, t.strides.begin());
  return t;
}

Tensor permute(const Tensor& t, std::initializer_list<int> order) {
  if (static_cast<int>(order.size()) != t.rank)
    throw std::invalid_argument(fmt::format("tilejit::attention::permute: {} dims in the order for {}", order.size(), t.describe()));
  Tensor r = t;
  size_t i = 0;
  for (int src : order) {
    if (src < 0 || src >= t.rank) throw std::invalid_argument(fmt::format("tilejit::attention::permute: no dim {} in {}", src, t.describe()));
    r.sizes[i] = t.size(src);
    r.strides[i] = t.stride(src);
    ++i;
  }
  return r;
}

const char* name(Pass p) {
  switch (p) {
    case Pass::forward: return "attention_fwd";
    case Pass::bwd_preprocess: return "attention_bwd_preprocess";
    case Pass::bwd_dkdv: return "attention_bwd_dkdv";
    case Pass::bwd_dq: return "attention_bwd_dq";
    case Pass::bwd_dq_convert: return "attention_bwd_dq_convert";
    case Pass::bwd_dq_reduce: return "attention_bwd_dq_reduce";
  }
  return "?";
}

const char* name(DqReduction r) { return kernels::dq_reduction_name(static_cast<kernels::DqReduction>(r)); }

// The one place schedules are chosen: measured on the H100 for the Hopper (wgmma) path of dense
// shapes; varlen (tensor slices) runs on the generic path with its own, smaller tiles.
Schedule default_schedule(Pass pass, ir::DType dtype, int head_dim, bool causal, bool varlen, DqReduction reduction, bool dropout,
                          bool library_mask) {
  const int warps = head_dim >= 256 ? 8 : 4;
  switch (pass) {
    // Measured on H100 (BENCHMARKS.md): 128x128 tiles and 8 warps beat 64-row blocks by 25%. D 64
    // with dropout: 64 x 128 on 4 warps (three programs per SM, more warps to hide the RNG's
    // latency), 1.09x full / 1.13x causal at S4k (`attention_bench --forward-variants --dropout`).
    // D 64 without dropout: 128 x 128 on 8 warps with registers bounded for two programs per SM
    // and the rcp normalisation (meta_of: EXACT_NORMALIZE=false), 1.07-1.08x full / 1.08-1.10x
    // causal at S4k over the unbounded kernel with the exact division (whose subroutine made ptxas
    // serialise the wgmmas, which is how it had fitted two programs), two runs of `attention_bench
    // --forward-variants --head-dim 64`. 127-128 registers, no spills (also with masks and score
    // mods, which were not timed).
    case Pass::forward:
      if (!varlen && head_dim == 64 && dropout) return {64, 128, 4, 2};
      if (!varlen && head_dim == 64) return {128, 128, 8, 2, 2};
      if (!varlen) return {128, head_dim >= 256 ? 64 : 128, 8, 2};
      return {64, head_dim >= 256 ? 32 : 64, warps, 3};
    case Pass::bwd_preprocess: return {64, 64, 4, 1};
    // dK/dV and dQ: every dot on wgmma up to D = 128; D = 256 dK/dV keeps two f32 [64, 256]
    // accumulators and spills. Varlen windows are tensor slices, which never take the Hopper wgmma
    // path: the generic path's schedules for both gradient passes.
    // With a dQ reduction (dense only) the kernel's fifth dot, dS K, has M = BLOCK_M: at 64 x 128 on
    // 8 warps each warpgroup takes half of D's columns on wgmma, which needs D / 2 in whole 64-column
    // chunks (D 128); D 64 would run it on mma.sync with K loaded twice, so it takes 64 x 64 on 4
    // warps (every dot on wgmma). D = 256 keeps its 32 x 64 tiles (the dot then on mma.sync).
    // Without a reduction (recompute) dK/dV and dQ take 64 x 64 tiles on 4 warps: measured on H100
    // (bf16, S 4k; `attention_bench --deterministic --schedule`), 1.29x faster at D 64 and 1.13x at D
    // 128 than 64 x 128 / 128 x 64 on 8 warps (two programs per SM instead of one). With dropout
    // too since dK/dV builds its transposed mask from packed words (AttentionDropout::
    // keep_mask_transposed; it had spilled ~600 B here): H100 D128 S4k p 0.1, the dropout backward
    // 1.35x / 1.45x (full / causal) of no dropout at 64 x 64 on 4 warps vs 1.40x / 1.66x on 8 warps.
    case Pass::bwd_dkdv:
      if (varlen) return {64, 64, 8, 2};
      if (head_dim >= 256) return {32, 64, 4, 2};
      // a reduction: 8 warps at D 128, where the dQ dot's split fits
      if (reduction != DqReduction::recompute && head_dim % 128 == 0) return {64, 128, 8, 2};
      // D 64 recompute: registers for three programs per SM (168 a thread; 170-201 unbounded, two
      // fit): H100, S 4k/16k, the backward 1.09-1.11x full, 1.04-1.05x causal (0-32 B of spills).
      // Not with dropout or a library mask: 168 registers spill 90-260 B there (not measured).
      if (reduction == DqReduction::recompute && head_dim == 64 && !dropout && !library_mask) return {64, 64, 4, 2, 3};
      return {64, 64, 4, 2};
    case Pass::bwd_dq: return {64, 64, 4, 2};
    // Elementwise over dQ_accum: [BLOCK_M, D] f32 per program, 4 warps.
    case Pass::bwd_dq_convert: return {head_dim >= 256 ? 32 : 64, 64, 4, 2};
    // The parts are read at dK/dV's tiles: its BLOCK_M and BLOCK_N, an f32 [BLOCK_M, D] sum on 4 warps.
    case Pass::bwd_dq_reduce: {
      Schedule s = default_schedule(Pass::bwd_dkdv, dtype, head_dim, causal, varlen, reduction, dropout);
      s.num_warps = 4;
      s.stages = 2;
      return s;
    }
  }
  return {};
}

bool backward_available() {
  return info(Pass::bwd_preprocess).kernel && info(Pass::bwd_dkdv).kernel && info(Pass::bwd_dq).kernel;
}

bool varlen_supported(bool backward) {
  auto has = [](Pass p) {
    const KernelInfo& ki = info(p);
    return ki.kernel && ki.metas && ki.metas->contains("VARLEN");
  };
  if (!has(Pass::forward)) return false;
  return !backward || (has(Pass::bwd_preprocess) && has(Pass::bwd_dkdv) && has(Pass::bwd_dq));
}

bool dropout_supported() {
  if (!declares(Pass::forward, "DROPOUT")) return false;
  return !backward_available() || (declares(Pass::bwd_dkdv, "DROPOUT") && declares(Pass::bwd_dq, "DROPOUT"));
}

bool masks_supported() {
  if (!declares(Pass::forward, "MASK")) return false;
  return !backward_available() || (declares(Pass::bwd_dkdv, "MASK") && declares(Pass::bwd_dq, "MASK"));
}

bool dq_reduction_supported(DqReduction reduction) {
  const int r = static_cast<int>(reduction);
  if (r < 0 || r > 3 || !backward_available()) return false;
  if (reduction == DqReduction::recompute) return true;
  if (!info(dq_pass(reduction)).kernel || !declares(Pass::bwd_dkdv, "DQ_REDUCTION")) return false;
  // the values the dK/dV kernel takes: one build with each (its other metas at their defaults)
  static std::once_flag once[4];
  static bool builds[4];
  std::call_once(once[r], [&] {
    try {
      (void)info(Pass::bwd_dkdv).kernel->build({{"DQ_REDUCTION", r}});
      builds[r] = true;
    } catch (const std::exception&) {
      builds[r] = false;
    }
  });
  return builds[r];
}

void check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const Options& opts,
                   Workspace workspace) {
  const Checker c("forward");
  const Dims d = check_common(c, q, k, v, o, lse, opts, false);
  check_workspace(c, workspace, forward_bytes(d), "forward_workspace_bytes");
}

void check_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                    const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, Workspace workspace) {
  check_backward_dims(q, k, v, o, do_, lse, dq, dk, dv, opts, workspace);
}

namespace {

// What the workspace sizes depend on, from q (and k, when given) alone: the batch, heads and
// sequence lengths, opts.schedule and opts.mask (checked against them as forward/backward do).
Dims workspace_dims(const char* fn, const Tensor& q, const Tensor* k, const Options& opts, bool backward) {
  const Checker c(fn);
  const bool varlen = opts.cu_seqlens_q.has_value();
  const int rank = varlen ? 3 : 4;
  if (q.rank != rank) c.fail("q must be rank {}, got {}", rank, q.describe());
  if (k && k->rank != rank) c.fail("k must be rank {}, got {}", rank, k->describe());
  Dims d;
  d.varlen = varlen;
  d.heads_q = q.size(varlen ? 1 : 2);
  d.head_dim = q.size(rank - 1);
  d.total_q = q.size(0);
  d.batch = q.size(0);
  d.seq_q = varlen ? 0 : q.size(1);
  d.seq_k = k && !varlen ? k->size(1) : 0;
  if (!k && opts.mask) {
    const int kind = static_cast<int>(opts.mask->spec.kind);
    if (kind >= 0 && kind < kernels::kMaskKindCount && !kernels::mask_has_tile_intervals(opts.mask->spec.kind))
      c.fail("options.mask has kind {}, whose block-mask lists depend on S_k: call backward_workspace_bytes(q, k, opts)",
             kernels::mask_kind_name(opts.mask->spec.kind));
  }
  if (!k && backward && opts.dq_reduction == DqReduction::split)
    c.fail("options.dq_reduction = split, whose dQ_parts depend on S_k (N = cdiv(S_k, BLOCK_N) key tiles): call "
           "backward_workspace_bytes(q, k, opts)");
  check_schedule(c, opts);
  check_mask_option(c, q, opts, d, backward);
  check_score_mod_option(c, q, opts, d);
  check_reduction_option(c, opts, d, backward);
  plan_workspace(c, q, opts, d, backward);
  return d;
}

}  // namespace

size_t forward_workspace_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  return forward_bytes(workspace_dims("forward_workspace_bytes", q, &k, opts, false));
}

size_t backward_workspace_bytes(const Tensor& q, const Options& opts) {
  return backward_bytes(workspace_dims("backward_workspace_bytes", q, nullptr, opts, true));
}

size_t backward_workspace_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  return backward_bytes(workspace_dims("backward_workspace_bytes", q, &k, opts, true));
}

size_t block_mask_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  Options o = opts;
  o.block_mask = nullptr;  // (sizing a new one)
  const Dims d = workspace_dims("block_mask_bytes", q, &k, o, true);
  return d.lists ? block_mask_layout(Checker("block_mask_bytes"), q, d, o).end : 0;
}

namespace {

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

// One pre-pass run: the classification (grid (nQB, cdiv(nKB, kClassTiles), Bm * Hm)) unless `classified` already
// classified these tiles into its block_classes (the dK/dV lists' run, for dQ's at the same
// tiles), then the lists (grid (nOuter, Hm, Bm)).
struct PrePass {
  struct Step {
    Function* fn = nullptr;
    runtime::Grid grid;
    Bindings b;
  };
  std::vector<Step> steps;
};
PrePass pre_pass(const PrePassLists& l, const Options& opts, const Dims& d, uint64_t base, const PrePassLists* classified = nullptr) {
  if (classified && (classified->block_m != l.block_m || classified->block_n != l.block_n)) classified = nullptr;
  const PrePassLists& cls = classified ? *classified : l;
  PrePass p;
  if (!classified) {
    PrePass::Step s{&block_classes_function(l, d.mask), runtime::Grid{l.q_blocks, lang::cdiv(l.k_blocks, kClassTiles), l.mask_batch * l.mask_heads}, {}};
    s.b.add("blockclasses", l.classes(base));
    s.b.add("sq", static_cast<int32_t>(d.seq_q));
    s.b.add("sk", static_cast<int32_t>(d.seq_k));
    bind_mask(s.b, opts, d);
    p.steps.push_back(std::move(s));
  }
  PrePass::Step s{&block_lists_function(l), runtime::Grid{l.outer, l.mask_heads, l.mask_batch}, {}};
  s.b.add("blockclasses", cls.classes(base));
  bind_lists(s.b, l, base);
  p.steps.push_back(std::move(s));
  return p;
}
void launch(const PrePass& p, CUstream stream, bool dry) {
  for (const PrePass::Step& s : p.steps) launch(*s.fn, s.grid, stream, s.b, dry);
}

Config config(Pass p, const Tensor& q, const Dims& d, const Options& opts) {
  return Config{p,
                q.dtype,
                static_cast<int>(d.head_dim),
                d.causal,
                d.varlen,
                schedule_for(p, q, d, opts),
                q.device,
                d.dropout && declares(p, "DROPOUT"),
                p == Pass::forward && d.return_mask,
                d.read_bits && declares(p, "DROPOUT_BITS"),
                library_mask(d.mask) && declares(p, "MASK") ? static_cast<int>(d.mask) : 0,
                p == Pass::bwd_dkdv ? static_cast<int>(d.reduction) : 0,
                p == Pass::bwd_dkdv && d.q_descending,
                d.score_mod != kernels::ScoreModKind::none && declares(p, "SCORE_MOD") ? static_cast<int>(d.score_mod) : 0,
                // the fma softmax where the scale allows it (the kernel with it is a separate
                // specialisation: a negative scale keeps the general one)
                p == Pass::forward && d.scale > 0 && d.score_mod == kernels::ScoreModKind::none && declares(p, "POSITIVE_SCALE")};
}

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
  const Checker ch("forward");
  const Dims d = check_common(ch, q, k, v, o, lse, opts, false);
  check_workspace(ch, workspace, forward_bytes(d), "forward_workspace_bytes");
  const Config c = config(Pass::forward, q, d, opts);
  Function& fn = function_for(c);
  const runtime::Grid grid{lang::cdiv(d.seq_q, c.sch.block_m), d.heads_q, d.batch};
  // The launches at a workspace base: the pre-pass (masks without tile intervals), the forward.
  const auto bind = [&](uint64_t base) {
    Bindings b;
    bind_common(b, q, k, v, o, lse, d, opts);
    bind_mask(b, opts, d);
    bind_score_mod(b, opts, d);
    if (d.lists) bind_lists(b, d.fwd_lists, d.lists_base ? d.lists_base : base);
    return b;
  };
  Bindings b = bind(workspace.data ? workspace.data : kPlaceholder);
  std::optional<PrePass> pre;
  const bool pre_passes = d.lists && d.lists_base == 0;  // (options.block_mask: built already)
  if (pre_passes) pre = pre_pass(d.fwd_lists, opts, d, workspace.data ? workspace.data : kPlaceholder);
  if (pre) launch(*pre, stream, true);
  launch(fn, grid, stream, b, true);
  require_gpu("forward", q.device);
  runtime::DeviceBuffer owned;
  if (pre_passes && workspace.data == 0) {
    owned = runtime::DeviceBuffer(forward_bytes(d), q.device);
    b = bind(owned.ptr());
    pre = pre_pass(d.fwd_lists, opts, d, owned.ptr());
  }
  if (pre) launch(*pre, stream, false);
  launch(fn, grid, stream, b, false);
  if (owned.bytes() != 0) synchronize(stream);
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
              const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, CUstream stream, Workspace workspace) {
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
    Bindings b;
    bind_common(b, q, k, v, o, lse, d, opts);
    b.add("do", do_.view());
    b.add("dq", dq.view());
    b.add("dk", dk.view());
    b.add("dv", dv.view());
    b.add("delta", runtime::TensorView{ir::DType::f32, std::span<const int64_t>(dsizes.data(), drank),
                                       std::span<const int64_t>(dstrides.data(), drank), base, q.device});
    bind_mask(b, opts, d);
    bind_score_mod(b, opts, d);
    const uint64_t lists_at = d.lists_base ? d.lists_base : base;
    if (d.lists) {
      bind_lists(b, d.dkdv_lists, lists_at);
      if (!reduce) bind_lists(b, d.dq_lists, lists_at);
    }
    if (reduce) {
      b.add(d.reduction == DqReduction::split ? "dqparts" : "dqaccum", d.dq_ws.view(base, q.device));
      if (d.reduction == DqReduction::ordered) b.add("dqsemaphores", d.dq_sem.view(base, q.device));
      b.add("sk", static_cast<int32_t>(d.seq_k));  // the reduce kernel's S_k
      if (d.lists) b.add("blockclasses", d.dkdv_lists.classes(lists_at));  // (the reduce kernel's: dK/dV's pre-pass writes them)
    }
    return b;
  };
  const Config pre = config(Pass::bwd_preprocess, q, d, opts), kv = config(Pass::bwd_dkdv, q, d, opts),
               dqc = config(dq_pass(d.reduction), q, d, opts);
  // the reduce kernel reads dK/dV's parts at dK/dV's tiles (the schedule table and an
  // options.schedule give both the same tiles)
  if (d.reduction == DqReduction::split && (dqc.sch.block_m != kv.sch.block_m || dqc.sch.block_n != kv.sch.block_n))
    throw std::logic_error(fmt::format("tilejit::attention: attention_bwd_dq_reduce at {}x{} tiles but dK/dV at {}x{}", dqc.sch.block_m,
                                       dqc.sch.block_n, kv.sch.block_m, kv.sch.block_n));
  Function &pre_fn = function_for(pre), &kv_fn = function_for(kv), &dq_fn = function_for(dqc);
  runtime::Grid pre_grid{lang::cdiv(d.seq_q, pre.sch.block_m), d.heads_q, d.batch},
      kv_grid{lang::cdiv(d.seq_k, kv.sch.block_n), d.heads_kv, d.batch}, dq_grid{lang::cdiv(d.seq_q, dqc.sch.block_m), d.heads_q, d.batch};
  if (persistent_ordered(static_cast<int>(d.reduction), d.q_descending) && declares(Pass::bwd_dkdv, "PERSISTENT")) {
    // PERSISTENT: as many programs as the GPU holds at once (all resident: the programs wait on
    // each other), no more than there are items (key tiles, or causal pairs of them)
    const kernels::BwdProblem model{.seq_q = static_cast<int>(d.seq_q), .seq_k = static_cast<int>(d.seq_k), .block_m = kv.sch.block_m,
                                    .block_n = kv.sch.block_n, .mask = d.causal ? kernels::BwdMask::causal : kernels::BwdMask::full};
    const int64_t items = d.batch * d.heads_kv * kernels::items_per_head(model);
    auto& drv = runtime::Driver::get();
    int64_t resident = 1;  // (without a GPU: only the dry launches use the grid)
    if (drv.available()) resident = int64_t{drv.props(q.device).sm_count} * std::max(1, kv_fn.gpu_kernel().max_resident_per_sm());
    kv_grid = {std::max<int64_t>(1, std::min(resident, items)), 1, 1};
  }
  const auto run = [&](uint64_t base, bool dry) {
    const Bindings b = bind(base);
    std::optional<PrePass> kv_lists, dq_lists;
    if (d.lists && d.lists_base == 0) {
      kv_lists = pre_pass(d.dkdv_lists, opts, d, base);
      if (!reduce) dq_lists = pre_pass(d.dq_lists, opts, d, base, &d.dkdv_lists);  // dK/dV's classes at the same tiles
    }
    launch(pre_fn, pre_grid, stream, b, dry);
    if (kv_lists) launch(*kv_lists, stream, dry);
    // what the dK/dV kernel needs zero: dQ_accum for atomic and ordered (both add into it), and
    // ordered's semaphores
    if (!dry && (d.reduction == DqReduction::atomic || d.reduction == DqReduction::ordered))
      zero_async(base + d.dq_ws.at, d.dq_ws.bytes, stream, q.device);
    if (!dry && d.reduction == DqReduction::ordered) zero_async(base + d.dq_sem.at, d.dq_sem.bytes, stream, q.device);
    launch(kv_fn, kv_grid, stream, b, dry);
    if (dq_lists) launch(*dq_lists, stream, dry);
    launch(dq_fn, dq_grid, stream, b, dry);
  };
  run(workspace.data ? workspace.data : kPlaceholder, true);
  require_gpu("backward", q.device);
  runtime::DeviceBuffer owned;
  if (workspace.data == 0) owned = runtime::DeviceBuffer(backward_bytes(d), q.device);
  run(workspace.data ? workspace.data : owned.ptr(), false);
  if (owned.bytes() != 0) synchronize(stream);
}

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
      o.num_warps = lib->num_warps;
      o.pipeline.stages = lib->stages;
      lang::Meta meta = lib->default_meta;
      meta.emplace_back("PERSISTENT", persistent);
      slot = std::make_unique<Function>(lib->kernel(), meta, o, bits.device);
    }
    fn = slot.get();
  }
  const int64_t block_m = std::get<int64_t>(fn->signature().find_meta("BLOCK_M")->value),
                block_w = std::get<int64_t>(fn->signature().find_meta("BLOCK_W")->value);
  Bindings b;
  b.add("mask", bits.view());
  b.add("sk", static_cast<int32_t>(seq_k));
  b.add("seedlo", static_cast<uint32_t>(opts.seed));
  b.add("seedhi", static_cast<uint32_t>(opts.seed >> 32));
  b.add("offsetlo", static_cast<uint32_t>(opts.offset));
  b.add("offsethi", static_cast<uint32_t>(opts.offset >> 32));
  b.add("keepthreshold", kernels::dropout_keep_threshold(opts.dropout_p));
  const runtime::Grid grid = persistent ? runtime::Grid{programs}
                                        : runtime::Grid{lang::cdiv(seq_q, block_m), lang::cdiv(want[2], block_w), want[0]};
  launch(*fn, grid, stream, b, true);
  require_gpu("generate_dropout_bits", bits.device);
  // all shared memory: only then do its programs fit beside a GEMM's (the overlap it exists for)
  static std::once_flag carveout_set[2][64];
  std::call_once(carveout_set[persistent ? 1 : 0][bits.device % 64],
                 [&] { runtime::set_shared_memory_carveout(fn->gpu_kernel().function(), 100, bits.device); });
  launch(*fn, grid, stream, b, false);
}

void prepare(ir::DType dtype, int head_dim, bool causal, bool varlen, bool backward, std::optional<Schedule> schedule,
             int device, bool dropout, DqReduction dq_reduction, bool q_descending) {
  prepare(dtype, head_dim, causal ? kernels::MaskKind::causal : kernels::MaskKind::full, varlen, backward, schedule, device, dropout,
          dq_reduction, q_descending);
}

void prepare(ir::DType dtype, int head_dim, kernels::MaskKind mask, bool varlen, bool backward, std::optional<Schedule> schedule,
             int device, bool dropout, DqReduction dq_reduction, bool q_descending) {
  const Checker c("prepare");
  if (static_cast<int>(mask) < 0 || static_cast<int>(mask) >= kernels::kMaskKindCount)
    c.fail("mask = {} is not a mask kind; valid: {}", static_cast<int>(mask), kernels::mask_kind_list());
  if (library_mask(mask) && varlen)
    c.fail("mask {} with varlen = true: library masks take dense batches only", kernels::mask_kind_name(mask));
  if (backward)
    check_dq_reduction(c, dq_reduction, q_descending, varlen, mask, {"dq_reduction", "q_descending", "varlen = true", "mask"});
  else {
    dq_reduction = DqReduction::recompute;  // (the forward has neither)
    q_descending = false;
  }
  const bool causal = mask == kernels::MaskKind::causal;
  const int lib = library_mask(mask) ? static_cast<int>(mask) : 0;
  std::vector<Pass> passes{Pass::forward};
  if (backward) passes.insert(passes.end(), {Pass::bwd_preprocess, Pass::bwd_dkdv, dq_pass(dq_reduction)});
  for (Pass p : passes) {
    const Schedule s = schedule ? *schedule : default_schedule(p, dtype, head_dim, causal, varlen, dq_reduction, dropout, lib != 0);
    function_for(Config{p, dtype, head_dim, causal, varlen, s, device, dropout && declares(p, "DROPOUT"), false, false,
                        lib != 0 && declares(p, "MASK") ? lib : 0, p == Pass::bwd_dkdv ? static_cast<int>(dq_reduction) : 0,
                        p == Pass::bwd_dkdv && q_descending, 0,
                        // calls with a positive softmax_scale (the default 1/sqrt(head_dim) is)
                        p == Pass::forward && declares(p, "POSITIVE_SCALE")})
        .compiled();
    // the pre-pass at this kernel's tiles (the preprocess, convert and reduce kernels read no lists)
    if (lib != 0 && !kernels::mask_has_tile_intervals(mask) &&
        (p == Pass::forward || p == Pass::bwd_dkdv || p == Pass::bwd_dq)) {
      PrePassLists l;
      l.block_m = s.block_m;
      l.block_n = s.block_n;
      l.kv_major = p == Pass::bwd_dkdv;
      l.device = device;
      block_classes_function(l, mask).compiled();
      block_lists_function(l).compiled();
    }
  }
}

BlockMask build_block_mask(const Tensor& q, const Tensor& k, const Options& opts, Workspace storage, CUstream stream) {
  const Checker c("build_block_mask");
  Options o = opts;
  o.block_mask = nullptr;  // (building a new one)
  const Dims d = workspace_dims("build_block_mask", q, &k, o, true);
  BlockMask bm;
  bm.storage = storage;
  bm.kind = d.mask;
  bm.seq_q = d.seq_q;
  bm.seq_k = d.seq_k;
  bm.mask_batch = d.mask_batch;
  bm.mask_heads = d.mask_heads;
  bm.device = q.device;
  if (!d.lists) return bm;  // a mask with tile intervals (or none): the calls build nothing either
  const BlockMaskLayout l = block_mask_layout(c, q, d, o);
  if (storage.data == 0 || storage.bytes < l.end)
    c.fail("storage has {} bytes at {:#x}; the lists need {} bytes of device memory (block_mask_bytes(q, k, opts))", storage.bytes,
           storage.data, l.end);
  if (storage.data % kAlign != 0) c.fail("storage address {:#x} is not a multiple of {} bytes", storage.data, kAlign);
  bm.forward_tiles[0] = l.fwd.block_m, bm.forward_tiles[1] = l.fwd.block_n;
  bm.dkdv_tiles[0] = l.dkdv.block_m, bm.dkdv_tiles[1] = l.dkdv.block_n;
  if (l.has_dq) bm.dq_tiles[0] = l.dq.block_m, bm.dq_tiles[1] = l.dq.block_n;
  std::vector<PrePass> passes{pre_pass(l.fwd, o, d, storage.data), pre_pass(l.dkdv, o, d, storage.data)};
  if (l.has_dq) passes.push_back(pre_pass(l.dq, o, d, storage.data, &l.dkdv));  // dK/dV's classes when the tiles agree
  for (const PrePass& p : passes) launch(p, stream, true);
  require_gpu("build_block_mask", q.device);
  for (const PrePass& p : passes) launch(p, stream, false);
  return bm;
}

}  // namespace tilejit::attention
