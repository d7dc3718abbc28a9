// The C ABI over api/attention.hpp (tilejit_c.h): plain structs to the C++ types, every exception
// to a status and this thread's last-error message.
#include "bindings/c/tilejit_c.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

#include "api/attention.hpp"
#include "api/context_parallel.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_codec.hpp"
#include "runtime/nccl.hpp"

namespace {

using namespace tilejit;

static_assert(TILEJIT_I32 == static_cast<int>(ir::DType::i32) && TILEJIT_U8 == static_cast<int>(ir::DType::u8) &&
              TILEJIT_U32 == static_cast<int>(ir::DType::u32) && TILEJIT_F16 == static_cast<int>(ir::DType::f16) &&
              TILEJIT_BF16 == static_cast<int>(ir::DType::bf16) && TILEJIT_F32 == static_cast<int>(ir::DType::f32) &&
              TILEJIT_I64 == static_cast<int>(ir::DType::i64) && TILEJIT_U64 == static_cast<int>(ir::DType::u64));
static_assert(TILEJIT_MASK_BLOCK_SPARSE == static_cast<int>(kernels::MaskKind::block_sparse) &&
              TILEJIT_MASK_CAUSAL_DOCUMENT == static_cast<int>(kernels::MaskKind::causal_document));
static_assert(TILEJIT_DQ_ORDERED == static_cast<int>(attention::DqReduction::ordered) &&
              TILEJIT_DQ_SPLIT == static_cast<int>(attention::DqReduction::split));

thread_local std::string last_error;

}  // namespace

struct tilejit_block_mask {
  tilejit::attention::BlockMask mask;
};

namespace {

[[noreturn]] void bad(const char* fn, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", fn, what));
}

attention::Tensor tensor(const char* fn, const char* name, const tilejit_tensor* t) {
  if (!t) bad(fn, fmt::format("{} is NULL", name));
  const int d = t->dtype;
  if (d != TILEJIT_I32 && d != TILEJIT_I64 && d != TILEJIT_U8 && d != TILEJIT_U32 && d != TILEJIT_U64 && d != TILEJIT_F16 &&
      d != TILEJIT_BF16 && d != TILEJIT_F32)
    bad(fn, fmt::format("{} has dtype code {}; valid: {} i32, {} i64, {} u8, {} u32, {} u64, {} f16, {} bf16, {} f32", name, d,
                        int(TILEJIT_I32), int(TILEJIT_I64), int(TILEJIT_U8), int(TILEJIT_U32), int(TILEJIT_U64), int(TILEJIT_F16),
                        int(TILEJIT_BF16), int(TILEJIT_F32)));
  if (t->rank < 1 || t->rank > 4) bad(fn, fmt::format("{} has rank {}; valid: 1 to 4", name, t->rank));
  attention::Tensor out;
  out.data = t->data;
  out.dtype = static_cast<ir::DType>(d);
  out.rank = t->rank;
  for (int i = 0; i < t->rank; ++i) {
    out.sizes[static_cast<size_t>(i)] = t->sizes[i];
    out.strides[static_cast<size_t>(i)] = t->strides[i];
  }
  out.device = t->device;
  return out;
}

std::optional<attention::Tensor> optional_tensor(const char* fn, const char* name, const tilejit_tensor* t) {
  if (!t) return std::nullopt;
  return tensor(fn, name, t);
}

attention::Options options(const char* fn, const tilejit_attention_options* c) {
  attention::Options o;
  if (!c) return o;
  if (c->has_softmax_scale) o.softmax_scale = c->softmax_scale;
  o.causal = c->causal != 0;
  o.cu_seqlens_q = optional_tensor(fn, "options.cu_seqlens_q", c->cu_seqlens_q);
  o.cu_seqlens_k = optional_tensor(fn, "options.cu_seqlens_k", c->cu_seqlens_k);
  o.max_seqlen_q = c->max_seqlen_q;
  o.max_seqlen_k = c->max_seqlen_k;
  o.dropout_p = c->dropout_p;
  o.seed = c->seed;
  o.offset = c->offset;
  o.dropout_mask = optional_tensor(fn, "options.dropout_mask", c->dropout_mask);
  o.dropout_bits = optional_tensor(fn, "options.dropout_bits", c->dropout_bits);
  o.rng_state = optional_tensor(fn, "options.rng_state", c->rng_state);
  if (c->mask_kind < 0 || c->mask_kind >= kernels::kMaskKindCount)
    bad(fn, fmt::format("options.mask_kind is {}; valid: 0 to {} (tilejit_mask_kind)", c->mask_kind, kernels::kMaskKindCount - 1));
  if (c->mask_kind != TILEJIT_MASK_FULL) {
    kernels::MaskSpec spec{static_cast<kernels::MaskKind>(c->mask_kind), c->mask_window_left, c->mask_window_right,
                           c->mask_global_tokens, c->mask_block_q, c->mask_block_k};
    o.mask = attention::Mask{spec, optional_tensor(fn, "options.mask_doc_ids", c->mask_doc_ids),
                             optional_tensor(fn, "options.mask_prefix_lengths", c->mask_prefix_lengths),
                             optional_tensor(fn, "options.mask_block_table", c->mask_block_table)};
  }
  if (c->score_mod < 0 || c->score_mod >= kernels::kScoreModKindCount)
    bad(fn, fmt::format("options.score_mod is {}; valid: 0 none, 1 alibi, 2 softcap", c->score_mod));
  o.score_mod.kind = static_cast<kernels::ScoreModKind>(c->score_mod);
  o.score_mod.alibi_slopes = optional_tensor(fn, "options.alibi_slopes", c->alibi_slopes);
  o.score_mod.softcap = c->softcap;
  if (c->dq_reduction < TILEJIT_DQ_DETERMINISTIC || c->dq_reduction > TILEJIT_DQ_ORDERED)
    bad(fn, fmt::format("options.dq_reduction is {}; valid: -2 the fastest deterministic one, -1 the default (the fastest), "
                        "0 recompute, 1 atomic, 2 split, 3 ordered", c->dq_reduction));
  if (c->dq_reduction >= 0) o.dq_reduction = static_cast<attention::DqReduction>(c->dq_reduction);
  o.deterministic = c->dq_reduction == TILEJIT_DQ_DETERMINISTIC;
  o.q_descending = c->q_descending != 0;
  o.block_mask = c->block_mask ? &c->block_mask->mask : nullptr;
  return o;
}

// Runs `body`, mapping what it throws to a status and the last-error message.
template <class F>
tilejit_status guarded(F&& body) {
  try {
    body();
    last_error.clear();
    return TILEJIT_OK;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return TILEJIT_INVALID_ARGUMENT;
  } catch (const runtime::DeviceError& e) {
    last_error = e.what();
    return TILEJIT_DEVICE_ERROR;
  } catch (const std::exception& e) {
    last_error = e.what();
    return TILEJIT_ERROR;
  } catch (...) {
    last_error = "tilejit: an unknown exception";
    return TILEJIT_ERROR;
  }
}

cp::Options cp_options(const char* fn, int32_t mode, int32_t layout, const tilejit_attention_options* opts) {
  if (mode < TILEJIT_CP_ULYSSES || mode > TILEJIT_CP_RING)
    bad(fn, fmt::format("mode is {}; valid: 0 ulysses, 1 allgather, 2 ring", mode));
  if (layout != TILEJIT_CP_CONTIGUOUS && layout != TILEJIT_CP_ZIGZAG)
    bad(fn, fmt::format("layout is {}; valid: 0 contiguous, 1 zigzag", layout));
  cp::Options o;
  o.mode = static_cast<cp::Mode>(mode);
  o.layout = layout == TILEJIT_CP_ZIGZAG ? cp::Layout::zigzag : cp::Layout::contiguous;
  o.attention = options(fn, opts);
  return o;
}

}  // namespace

// The communicator first: the runner refers to it.
struct tilejit_cp {
  runtime::nccl::Communicator comm;
  std::unique_ptr<cp::ContextParallel> runner;
  explicit tilejit_cp(runtime::nccl::Communicator c) : comm(std::move(c)), runner(std::make_unique<cp::ContextParallel>(comm)) {}
};

static_assert(TILEJIT_CP_ULYSSES == static_cast<int>(cp::Mode::ulysses) && TILEJIT_CP_ALLGATHER == static_cast<int>(cp::Mode::allgather) &&
              TILEJIT_CP_RING == static_cast<int>(cp::Mode::ring));

extern "C" {

void tilejit_attention_options_init(tilejit_attention_options* opts) {
  if (opts) *opts = tilejit_attention_options{};
}

const char* tilejit_version(void) {
  static const std::string v(runtime::codec::kTilejitVersion);
  return v.c_str();
}

int tilejit_c_abi_version(void) { return TILEJIT_C_ABI_VERSION; }

const char* tilejit_last_error(void) { return last_error.c_str(); }

tilejit_status tilejit_attention_forward(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                         const tilejit_tensor* o, const tilejit_tensor* lse, const tilejit_attention_options* opts,
                                         uint64_t stream, uint64_t workspace, size_t workspace_bytes) {
  const char* fn = "tilejit_attention_forward";
  return guarded([&] {
    attention::forward(tensor(fn, "q", q), tensor(fn, "k", k), tensor(fn, "v", v), tensor(fn, "o", o), tensor(fn, "lse", lse),
                       options(fn, opts), reinterpret_cast<CUstream>(stream), {workspace, workspace_bytes});
  });
}

tilejit_status tilejit_attention_backward(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                          const tilejit_tensor* o, const tilejit_tensor* dout, const tilejit_tensor* lse,
                                          const tilejit_tensor* dq, const tilejit_tensor* dk, const tilejit_tensor* dv,
                                          const tilejit_attention_options* opts, uint64_t stream, uint64_t workspace,
                                          size_t workspace_bytes) {
  const char* fn = "tilejit_attention_backward";
  return guarded([&] {
    attention::backward(tensor(fn, "q", q), tensor(fn, "k", k), tensor(fn, "v", v), tensor(fn, "o", o), tensor(fn, "dout", dout),
                        tensor(fn, "lse", lse), tensor(fn, "dq", dq), tensor(fn, "dk", dk), tensor(fn, "dv", dv), options(fn, opts),
                        reinterpret_cast<CUstream>(stream), {workspace, workspace_bytes});
  });
}

tilejit_status tilejit_generate_dropout_bits(const tilejit_tensor* bits, int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k,
                                             const tilejit_attention_options* opts, uint64_t stream, int32_t programs) {
  const char* fn = "tilejit_generate_dropout_bits";
  return guarded([&] {
    attention::generate_dropout_bits(tensor(fn, "bits", bits), batch, heads_q, seq_q, seq_k, options(fn, opts),
                                     reinterpret_cast<CUstream>(stream), programs);
  });
}

tilejit_status tilejit_block_mask_bytes(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_attention_options* opts,
                                        size_t* bytes) {
  const char* fn = "tilejit_block_mask_bytes";
  return guarded([&] {
    if (!bytes) bad(fn, "bytes is NULL");
    *bytes = attention::block_mask_bytes(tensor(fn, "q", q), tensor(fn, "k", k), options(fn, opts));
  });
}

tilejit_status tilejit_block_mask_build(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_attention_options* opts,
                                        uint64_t storage, size_t storage_bytes, uint64_t stream, tilejit_block_mask** mask) {
  const char* fn = "tilejit_block_mask_build";
  return guarded([&] {
    if (!mask) bad(fn, "mask is NULL (where the handle goes)");
    *mask = nullptr;
    auto built = std::make_unique<tilejit_block_mask>();
    built->mask = attention::build_block_mask(tensor(fn, "q", q), tensor(fn, "k", k), options(fn, opts),
                                              attention::Workspace{storage, storage_bytes}, reinterpret_cast<CUstream>(stream));
    *mask = built.release();
  });
}

void tilejit_block_mask_free(tilejit_block_mask* mask) { delete mask; }

tilejit_status tilejit_attention_forward_workspace_bytes(const tilejit_tensor* q, const tilejit_tensor* k,
                                                         const tilejit_attention_options* opts, size_t* bytes) {
  const char* fn = "tilejit_attention_forward_workspace_bytes";
  return guarded([&] {
    if (!bytes) bad(fn, "bytes is NULL");
    *bytes = attention::forward_workspace_bytes(tensor(fn, "q", q), tensor(fn, "k", k), options(fn, opts));
  });
}

tilejit_status tilejit_attention_backward_workspace_bytes(const tilejit_tensor* q, const tilejit_tensor* k,
                                                          const tilejit_attention_options* opts, size_t* bytes) {
  const char* fn = "tilejit_attention_backward_workspace_bytes";
  return guarded([&] {
    if (!bytes) bad(fn, "bytes is NULL");
    *bytes = attention::backward_workspace_bytes(tensor(fn, "q", q), tensor(fn, "k", k), options(fn, opts));
  });
}

tilejit_status tilejit_attention_prepare(int32_t dtype, int32_t head_dim, int32_t mask_kind, int32_t varlen, int32_t backward,
                                         int32_t device, int32_t dropout, int32_t dq_reduction, int32_t q_descending) {
  const char* fn = "tilejit_attention_prepare";
  return guarded([&] {
    if (dtype != TILEJIT_BF16 && dtype != TILEJIT_F16)
      bad(fn, fmt::format("dtype code {}; valid: {} f16, {} bf16", dtype, int(TILEJIT_F16), int(TILEJIT_BF16)));
    if (mask_kind < 0 || mask_kind >= kernels::kMaskKindCount)
      bad(fn, fmt::format("mask_kind is {}; valid: 0 to {} (tilejit_mask_kind)", mask_kind, kernels::kMaskKindCount - 1));
    if (dq_reduction < TILEJIT_DQ_DETERMINISTIC || dq_reduction > TILEJIT_DQ_ORDERED)
      bad(fn, fmt::format("dq_reduction is {}; valid: -2 the fastest deterministic one, -1 the default, 0 recompute, 1 atomic, "
                          "2 split, 3 ordered", dq_reduction));
    const std::optional<attention::DqReduction> r =
        dq_reduction < 0 ? std::nullopt : std::optional(static_cast<attention::DqReduction>(dq_reduction));  // (-2: among the default's)
    attention::prepare(static_cast<ir::DType>(dtype), head_dim, static_cast<kernels::MaskKind>(mask_kind), varlen != 0, backward != 0,
                       std::nullopt, device, dropout != 0, r, q_descending != 0);
  });
}

tilejit_status tilejit_attention_check_forward(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                               const tilejit_tensor* o, const tilejit_tensor* lse,
                                               const tilejit_attention_options* opts) {
  const char* fn = "tilejit_attention_check_forward";
  return guarded([&] {
    attention::check_forward(tensor(fn, "q", q), tensor(fn, "k", k), tensor(fn, "v", v), tensor(fn, "o", o), tensor(fn, "lse", lse),
                             options(fn, opts));
  });
}

tilejit_status tilejit_nccl_unique_id(uint8_t id[128]) {
  return guarded([&] {
    if (!id) bad("tilejit_nccl_unique_id", "id is NULL");
    const runtime::nccl::UniqueId u = runtime::nccl::make_unique_id();
    std::memcpy(id, u.bytes.data(), u.bytes.size());
  });
}

tilejit_status tilejit_cp_create(const uint8_t id[128], int32_t rank, int32_t world, int32_t device, tilejit_cp** out) {
  const char* fn = "tilejit_cp_create";
  return guarded([&] {
    if (!id || !out) bad(fn, "id and out must not be NULL");
    *out = nullptr;
    runtime::nccl::UniqueId u;
    std::memcpy(u.bytes.data(), id, u.bytes.size());
    *out = new tilejit_cp(runtime::nccl::Communicator::create(u, rank, world, device));
  });
}

tilejit_status tilejit_cp_wrap(void* nccl_comm, int32_t rank, int32_t world, int32_t device, tilejit_cp** out) {
  return guarded([&] {
    if (!out) bad("tilejit_cp_wrap", "out is NULL");
    *out = nullptr;
    *out = new tilejit_cp(runtime::nccl::Communicator::wrap(nccl_comm, rank, world, device));
  });
}

void tilejit_cp_destroy(tilejit_cp* cp) { delete cp; }

tilejit_status tilejit_cp_forward(tilejit_cp* cp, const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                  const tilejit_tensor* o, const tilejit_tensor* lse, int64_t seq_len, int32_t mode, int32_t layout,
                                  const tilejit_attention_options* opts, uint64_t stream) {
  const char* fn = "tilejit_cp_forward";
  return guarded([&] {
    if (!cp) bad(fn, "cp is NULL");
    cp->runner->forward(tensor(fn, "q", q), tensor(fn, "k", k), tensor(fn, "v", v), tensor(fn, "o", o), tensor(fn, "lse", lse), seq_len,
                        cp_options(fn, mode, layout, opts), reinterpret_cast<CUstream>(stream));
  });
}

tilejit_status tilejit_cp_backward(tilejit_cp* cp, const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                   const tilejit_tensor* o, const tilejit_tensor* dout, const tilejit_tensor* lse,
                                   const tilejit_tensor* dq, const tilejit_tensor* dk, const tilejit_tensor* dv, int64_t seq_len,
                                   int32_t mode, int32_t layout, const tilejit_attention_options* opts, uint64_t stream) {
  const char* fn = "tilejit_cp_backward";
  return guarded([&] {
    if (!cp) bad(fn, "cp is NULL");
    cp->runner->backward(tensor(fn, "q", q), tensor(fn, "k", k), tensor(fn, "v", v), tensor(fn, "o", o), tensor(fn, "dout", dout),
                         tensor(fn, "lse", lse), tensor(fn, "dq", dq), tensor(fn, "dk", dk), tensor(fn, "dv", dv), seq_len,
                         cp_options(fn, mode, layout, opts), reinterpret_cast<CUstream>(stream));
  });
}

}  // extern "C"
