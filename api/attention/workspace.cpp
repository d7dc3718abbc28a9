// Workspace planning: where a call's scratch arrays (Delta, the block-mask lists, the dQ reduction's
// buffers) sit, how many bytes it needs, and the public sizers (*_workspace_bytes, block_mask_bytes).
#include <algorithm>
#include <cstddef>
#include <initializer_list>

#include "api/attention/internal.hpp"
#include "kernels/meta_names.hpp"

namespace tilejit::attention::detail {

size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }

namespace {
namespace mn = kernels::meta_name;

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

// Whether dK/dV stores the fused dropout mask's words for dQ to read (Options::dropout_words_max_bytes):
// kernels that can (mask_once_kernels), no precomputed bits, words indexed by this call's own
// coordinates (the kernels write and read them at b * Hq + h), S_k known (a sizer without k cannot
// place them).
// Split phases decide alike (the same options and workspace): the dkdv phase leaves the words for
// the dq phase, as it leaves Delta.
bool mask_once_fits(const Tensor& q, const Options& opts, const Dims& d) {
  const auto& g = opts.dropout_coordinates;
  const bool own_coordinates = g.row_offset == 0 && g.col_offset == 0 && g.head_offset == 0 && (g.heads == 0 || g.heads == d.heads_q);
  if (d.read_bits || d.seq_k <= 0 || !own_coordinates ||
      !mask_once_kernels(d.dropout, d.reduction, d.varlen, library_mask(d.mask), d.dkdv.block_n, schedule_for(Pass::bwd_dq, q, d, opts).block_n))
    return false;
  const double bytes = 4.0 * double(d.batch) * double(d.heads_q) * double(d.seq_q) * double(lang::cdiv(d.seq_k, 32));
  // the default: where the whole backward measured faster (H200 S 4k, decision 097: full 1.041x at D 64,
  // 1.009x at D 128; causal 0.965x / 0.974x, though each kernel alone says it should gain)
  const bool measured_faster = !d.causal && (d.head_dim == 64 || d.head_dim == 128);
  // (and below 2^56 bytes whatever the budget: the array's byte count must not overflow)
  return bytes <= 0x1p56 && bytes <= double(opts.dropout_words_max_bytes.value_or(measured_faster ? size_t{512} << 20 : 0));
}

size_t delta_bytes(const Dims& d) {
  const int64_t n = d.varlen ? d.heads_q * d.total_q : d.batch * d.heads_q * d.seq_q;
  return round_up_256(static_cast<size_t>(n) * 4);
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

}  // namespace

bool mask_once_kernels(bool dropout, DqReduction reduction, bool varlen, bool library_mask, int64_t dkdv_block_n, int64_t dq_block_n) {
  return dropout && reduction == DqReduction::recompute && !varlen && !library_mask && dkdv_block_n % 64 == 0 && dq_block_n % 32 == 0 &&
         declares(Pass::bwd_dkdv, mn::kDropoutWriteBits) && declares(Pass::bwd_dq, mn::kDropoutBits);
}

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

// The workspace of a checked call. Forward: the pre-pass lists (opts.mask of a kind without tile
// intervals) at offset 0, unless options.block_mask holds them. Backward: Delta; the lists of dK/dV
// (and, with recompute, of dQ: the reductions run no dQ kernel); then the reduction's dQ_accum or
// dQ_parts, and the semaphores.
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
  if (mask_once_fits(q, opts, d)) {
    d.mask_once = true;
    // key-major (the kernels' DROPOUT_WORDS_KEY_MAJOR): [B * Hq, S_q, W] with strides [W * S_q, 1,
    // S_q], so that a key tile's words are whole runs of rows, written at once (decision 097)
    const int64_t w = lang::cdiv(d.seq_k, 32);
    d.dropout_words = workspace_array(ir::DType::u32, {d.batch * d.heads_q, w, d.seq_q}, at);
    d.dropout_words.sizes = {d.batch * d.heads_q, d.seq_q, w};
    d.dropout_words.strides = {w * d.seq_q, 1, d.seq_q};
  }
}

size_t forward_bytes(const Dims& d) { return d.lists && d.lists_base == 0 ? d.fwd_lists.end : 0; }
size_t backward_bytes(const Dims& d) { return d.backward_end + (d.mask_once ? d.dropout_words.bytes : 0); }

void check_workspace(const Checker& c, const Workspace& ws, size_t need, const char* sizer) {
  if (ws.data == 0 && ws.bytes != 0) c.fail("workspace has {} bytes but a null pointer", ws.bytes);
  if (ws.data != 0) {
    if (ws.data % kAlign != 0) c.fail("workspace address {:#x} is not a multiple of {} bytes", ws.data, kAlign);
    if (ws.bytes < need) c.fail("workspace has {} bytes; this call needs {} ({})", ws.bytes, need, sizer);
  }
}

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
  // (what places the dropout mask's words; the calls check the dropout options themselves)
  d.dropout = opts.dropout_p > 0;
  d.read_bits = d.dropout && opts.dropout_bits.has_value();
  plan_workspace(c, q, opts, d, backward);
  return d;
}

}  // namespace tilejit::attention::detail

namespace tilejit::attention {
using namespace detail;

size_t forward_workspace_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  if (opts.varlen_documents) return documents_forward_bytes(q, k, opts);
  return forward_bytes(workspace_dims("forward_workspace_bytes", q, &k, opts, false));
}

size_t backward_workspace_bytes(const Tensor& q, const Options& opts) {
  if (opts.varlen_documents) return documents_backward_bytes(q, nullptr, opts);
  return backward_bytes(workspace_dims("backward_workspace_bytes", q, nullptr, opts, true));
}

size_t backward_workspace_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  if (opts.varlen_documents) return documents_backward_bytes(q, &k, opts);
  return backward_bytes(workspace_dims("backward_workspace_bytes", q, &k, opts, true));
}

size_t block_mask_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  Options o = opts;
  o.block_mask = nullptr;  // (sizing a new one)
  const Dims d = workspace_dims("block_mask_bytes", q, &k, o, true);
  return d.lists ? block_mask_layout(Checker("block_mask_bytes"), q, d, o).end : 0;
}

}  // namespace tilejit::attention
