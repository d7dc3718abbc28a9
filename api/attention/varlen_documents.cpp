// Options::varlen_documents: variable-length self-attention as one dense call on the packed
// sequence with a document mask (decision 113). The call is first checked as the varlen call it is
// (cu_seqlens, shapes, dtypes); then its tensors are viewed dense ([total, H, D] as [1, total, H, D],
// lse [Hq, total] as [1, Hq, total]), attention_document_ids writes the ids at the workspace's base,
// and the dense forward / backward runs on the rest of the workspace with the mask
// causal_document (causal: bottom-right per sequence is top-left when a sequence's queries are its
// keys) or document.
#include <fmt/format.h>

#include <vector>

#include "api/attention/internal.hpp"
#include "kernels/attention/document_ids.hpp"
#include "runtime/device_buffer.hpp"

namespace tilejit::attention::detail {

namespace {

constexpr uint64_t kPlaceholder = 256;  // an aligned address for the checks before the workspace exists

Tensor packed_as_dense(const Tensor& t) {  // [total, H, D] -> [1, total, H, D]
  Tensor d = t;
  d.rank = 4;
  d.sizes = {1, t.size(0), t.size(1), t.size(2)};
  d.strides = {t.size(0) * t.stride(0), t.stride(0), t.stride(1), t.stride(2)};
  return d;
}

Tensor lse_as_dense(const Tensor& t) {  // [Hq, total] -> [1, Hq, total]
  Tensor d = t;
  d.rank = 3;
  d.sizes = {1, t.size(0), t.size(1), 0};
  d.strides = {t.size(0) * t.stride(0), t.stride(0), t.stride(1), 0};
  return d;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.sizes == b.sizes && a.strides == b.strides && a.device == b.device;
}

size_t ids_bytes(int64_t total) { return round_up_256(static_cast<size_t>(total) * 4); }

// What the option needs beyond a valid varlen call (checked first, in the calling function's name).
void require_documents(const Checker& c, const Tensor& q, const Tensor& k, const Options& opts) {
  if (!opts.cu_seqlens_q || !opts.cu_seqlens_k)
    c.fail("options.varlen_documents = true without options.cu_seqlens_q / _k: it runs variable-length self-attention");
  if (!same_tensor(*opts.cu_seqlens_q, *opts.cu_seqlens_k))
    c.fail("options.varlen_documents = true needs options.cu_seqlens_q and cu_seqlens_k to be the same tensor (each sequence's "
           "queries attend to its own keys); got {} and {}", opts.cu_seqlens_q->describe(), opts.cu_seqlens_k->describe());
  if (q.rank != 3 || k.rank != 3 || k.size(0) != q.size(0))
    c.fail("options.varlen_documents = true: k has {} tokens but q has {} (self-attention packs the same tokens; q {}, k {})",
           k.rank == 3 ? k.size(0) : -1, q.rank == 3 ? q.size(0) : -1, q.describe(), k.describe());
  if (opts.block_mask)
    c.fail("options.varlen_documents = true with options.block_mask: the call builds its document mask's lists itself");
  if (opts.dropout_p > 0)
    c.fail("options.varlen_documents = true with dropout_p = {}: the varlen keep-mask counts rows per sequence, the packed "
           "call would draw another mask; leave varlen_documents off with dropout", opts.dropout_p);
}

// The call's dense options, the ids at `ids_at`.
Options dense_options(const Tensor& q, const Options& opts, uint64_t ids_at) {
  Options o = opts;
  o.varlen_documents = false;
  o.cu_seqlens_q.reset(), o.cu_seqlens_k.reset();
  o.max_seqlen_q = o.max_seqlen_k = 0;
  Mask m;
  m.spec.kind = opts.causal ? kernels::MaskKind::causal_document : kernels::MaskKind::document;
  m.doc_ids = contiguous(ids_at, ir::DType::i32, {1, q.size(0)}, q.device);
  o.mask = m;
  o.causal = false;
  return o;
}

Options without_documents(const Options& opts) {
  Options o = opts;
  o.varlen_documents = false;
  return o;
}

// The ids from the offsets, at `ids_at` (one program per sequence).
void write_document_ids(const Tensor& cu, const Tensor& q, uint64_t ids_at, CUstream stream) {
  const Tensor ids = contiguous(ids_at, ir::DType::i32, {1, q.size(0)}, q.device);
  Function& fn = document_ids_function(q.device);
  const std::vector<runtime::DeviceArg> args{cu.view(), ids.view()};
  fn.launch(runtime::Grid{std::max<int64_t>(cu.size(0) - 1, 1)}, stream, args);
}

// The base the call uses: the caller's workspace (checked), or `owned`, allocated.
uint64_t workspace_base(Workspace ws, size_t need, runtime::DeviceBuffer& owned, int device) {
  if (ws.data != 0) return ws.data;
  owned = runtime::DeviceBuffer(need, device);
  return owned.ptr();
}

}  // namespace

size_t documents_forward_bytes(const Tensor& q, const Tensor& k, const Options& opts) {
  require_documents(Checker("forward_workspace_bytes"), q, k, opts);
  const Options dense = dense_options(q, opts, kPlaceholder);
  return ids_bytes(q.size(0)) + forward_workspace_bytes(packed_as_dense(q), packed_as_dense(k), dense);
}

size_t documents_backward_bytes(const Tensor& q, const Tensor* k, const Options& opts) {
  const Tensor& keys = k ? *k : q;  // (self-attention: k packs as many tokens as q; the lists depend on no head count)
  require_documents(Checker("backward_workspace_bytes"), q, keys, opts);
  const Options dense = dense_options(q, opts, kPlaceholder);
  return ids_bytes(q.size(0)) + backward_workspace_bytes(packed_as_dense(q), packed_as_dense(keys), dense);
}

size_t check_documents_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Options& opts, Workspace workspace) {
  const Checker c("forward");
  require_documents(c, q, k, opts);
  const size_t ids = ids_bytes(q.size(0)), need = documents_forward_bytes(q, k, opts);
  if (workspace.data != 0 && workspace.bytes < need)
    c.fail("workspace holds {} bytes; options.varlen_documents needs {} (forward_workspace_bytes with the same options)", workspace.bytes,
           need);
  check_forward(q, k, v, o, lse, without_documents(opts), workspace);  // the call as the varlen call it is (the workspace apart)
  check_forward(packed_as_dense(q), packed_as_dense(k), packed_as_dense(v), packed_as_dense(o), lse_as_dense(lse),
                dense_options(q, opts, kPlaceholder), {kPlaceholder + ids, need - ids});
  return need;
}

void documents_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const Options& opts,
                       CUstream stream, Workspace workspace) {
  const size_t ids = ids_bytes(q.size(0)), need = check_documents_forward(q, k, v, o, lse, opts, workspace);
  require_gpu("forward", q.device);
  runtime::DeviceBuffer owned;
  const uint64_t base = workspace_base(workspace, need, owned, q.device);
  write_document_ids(*opts.cu_seqlens_q, q, base, stream);
  forward(packed_as_dense(q), packed_as_dense(k), packed_as_dense(v), packed_as_dense(o), lse_as_dense(lse),
          dense_options(q, opts, base), stream, {base + ids, need - ids});
  if (owned.bytes() != 0) runtime::check_cu(runtime::Driver::get().api().StreamSynchronize(stream), "cuStreamSynchronize");
}

size_t check_documents_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, Workspace workspace) {
  const Checker c("backward");
  require_documents(c, q, k, opts);
  // as the varlen call it is, whichever dQ reduction (the dense call takes atomic and ordered too);
  // its phases need a workspace, which the dense call gets
  Options unphased = without_documents(opts);
  unphased.backward_phase = BackwardPhase::all;
  unphased.dq_reduction.reset();
  if (opts.backward_phase != BackwardPhase::all && workspace.data == 0)
    c.fail("options.backward_phase = {} without a workspace: the dq phase reads the Delta the dkdv phase left there (pass one "
           "sized by backward_workspace_bytes to both calls)", name(opts.backward_phase));
  const size_t ids = ids_bytes(q.size(0)), need = documents_backward_bytes(q, &k, opts);
  if (workspace.data != 0 && workspace.bytes < need)
    c.fail("workspace holds {} bytes; options.varlen_documents needs {} (backward_workspace_bytes with the same options)", workspace.bytes,
           need);
  check_backward(q, k, v, o, do_, lse, dq, dk, dv, unphased, workspace);  // (the workspace apart from the gradients)
  check_backward(packed_as_dense(q), packed_as_dense(k), packed_as_dense(v), packed_as_dense(o), packed_as_dense(do_), lse_as_dense(lse),
                 packed_as_dense(dq), packed_as_dense(dk), packed_as_dense(dv), dense_options(q, opts, kPlaceholder),
                 {kPlaceholder + ids, need - ids});
  return need;
}

void documents_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_, const Tensor& lse,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts, CUstream stream, Workspace workspace) {
  const size_t ids = ids_bytes(q.size(0)), need = check_documents_backward(q, k, v, o, do_, lse, dq, dk, dv, opts, workspace);
  require_gpu("backward", q.device);
  runtime::DeviceBuffer owned;
  const uint64_t base = workspace_base(workspace, need, owned, q.device);
  write_document_ids(*opts.cu_seqlens_q, q, base, stream);
  backward(packed_as_dense(q), packed_as_dense(k), packed_as_dense(v), packed_as_dense(o), packed_as_dense(do_), lse_as_dense(lse),
           packed_as_dense(dq), packed_as_dense(dk), packed_as_dense(dv), dense_options(q, opts, base), stream,
           {base + ids, need - ids});
  if (owned.bytes() != 0) runtime::check_cu(runtime::Driver::get().api().StreamSynchronize(stream), "cuStreamSynchronize");
}

}  // namespace tilejit::attention::detail
