/* tilejit's C ABI (issue 25): FlashAttention forward and backward, their workspace sizes and
 * prepare, over plain structs, for bindings that must not link C++ (the PyTorch package, ctypes,
 * other languages). Every call returns a status; on failure tilejit_last_error() holds the
 * library's one-line message (the function, the argument, its value and what is valid), per
 * thread until the next call. Semantics are those of api/attention.hpp (README "The attention
 * API"): this header only restates its inputs in C. */
#ifndef TILEJIT_C_H
#define TILEJIT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TILEJIT_C_ABI_VERSION 4 /* bumped with any change to these structs or signatures */

typedef enum tilejit_status {
  TILEJIT_OK = 0,
  TILEJIT_INVALID_ARGUMENT = 1, /* a bad argument (nothing ran) */
  TILEJIT_DEVICE_ERROR = 2,     /* no GPU, or a CUDA driver / launch failure */
  TILEJIT_ERROR = 3             /* anything else (a compile failure, an internal error) */
} tilejit_status;

typedef enum tilejit_dtype { /* ir::DType's values */
  TILEJIT_I32 = 3,
  TILEJIT_I64 = 4,
  TILEJIT_U8 = 5,
  TILEJIT_U32 = 7,
  TILEJIT_U64 = 8,
  TILEJIT_F16 = 9,
  TILEJIT_BF16 = 10,
  TILEJIT_F32 = 11
} tilejit_dtype;

/* A device tensor view, not owned: element [0, ...] at `data`; sizes and strides in elements. */
typedef struct tilejit_tensor {
  uint64_t data;
  int32_t dtype; /* tilejit_dtype */
  int32_t rank;  /* 1..4 */
  int64_t sizes[4];
  int64_t strides[4];
  int32_t device;
} tilejit_tensor;

typedef enum tilejit_mask_kind { /* kernels::MaskKind's values */
  TILEJIT_MASK_FULL = 0,
  TILEJIT_MASK_CAUSAL = 1,
  TILEJIT_MASK_SLIDING_WINDOW = 2,
  TILEJIT_MASK_CAUSAL_SLIDING_WINDOW = 3,
  TILEJIT_MASK_GLOBAL_SLIDING_WINDOW = 4,
  TILEJIT_MASK_DOCUMENT = 5,
  TILEJIT_MASK_CAUSAL_DOCUMENT = 6,
  TILEJIT_MASK_PREFIX_LM = 7,
  TILEJIT_MASK_SHARE_QUESTION = 8,
  TILEJIT_MASK_CAUSAL_BLOCKWISE = 9,
  TILEJIT_MASK_BLOCK_SPARSE = 10
} tilejit_mask_kind;

typedef enum tilejit_dq_reduction { /* attention::DqReduction's values */
  TILEJIT_DQ_DETERMINISTIC = -2, /* unset with Options::deterministic: the fastest deterministic one */
  TILEJIT_DQ_DEFAULT = -1,  /* Options::dq_reduction unset: the fastest for the shape (atomic at D 128 dense) */
  TILEJIT_DQ_RECOMPUTE = 0,
  TILEJIT_DQ_ATOMIC = 1,
  TILEJIT_DQ_SPLIT = 2,
  TILEJIT_DQ_ORDERED = 3
} tilejit_dq_reduction;

/* attention::Options. Zero-initialise (tilejit_attention_options_init) and set what differs;
 * pointers to tensors are optional (NULL: unset). */
typedef struct tilejit_attention_options {
  int32_t has_softmax_scale; /* 0: 1 / sqrt(head_dim) */
  float softmax_scale;
  int32_t causal;
  const tilejit_tensor* cu_seqlens_q; /* varlen: both or neither */
  const tilejit_tensor* cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k;
  double dropout_p;
  uint64_t seed, offset;
  const tilejit_tensor* dropout_mask; /* forward only, for tests */
  const tilejit_tensor* dropout_bits; /* precomputed keep-mask */
  int32_t mask_kind;                  /* tilejit_mask_kind; FULL: no library mask */
  int64_t mask_window_left, mask_window_right, mask_global_tokens, mask_block_q, mask_block_k;
  const tilejit_tensor* mask_doc_ids;
  const tilejit_tensor* mask_prefix_lengths;
  const tilejit_tensor* mask_block_table;
  int32_t score_mod; /* 0 none, 1 alibi, 2 softcap */
  const tilejit_tensor* alibi_slopes;
  float softcap;
  int32_t dq_reduction; /* tilejit_dq_reduction (backward) */
  int32_t q_descending;
  /* a block mask built once for these options (tilejit_block_mask_build): the calls read its lists
   * and run no pre-pass (FlexAttention's create_block_mask). NULL: none. */
  const struct tilejit_block_mask* block_mask;
  /* dropout's seed and offset in device memory, read when the kernels run (i64 / u64 [2] =
   * [seed, offset]; then `seed` and `offset` are ignored): a CUDA graph that refreshes it before
   * each replay draws a new mask per replay. NULL: the scalars. */
  const tilejit_tensor* rng_state;
} tilejit_attention_options;

/* attention::BlockMask behind a handle: the pre-pass lists of a forward and a backward with some
 * options, in caller memory (`storage` of tilejit_block_mask_bytes bytes, 16-byte aligned device
 * memory on q's device), built asynchronously on `stream`. Free the handle (not the storage) with
 * tilejit_block_mask_free; rebuild after changing the mask's data (doc ids, block table...). */
typedef struct tilejit_block_mask tilejit_block_mask;

void tilejit_attention_options_init(tilejit_attention_options* opts);

/* The library's version string ("0.1.4") and this ABI's version (TILEJIT_C_ABI_VERSION): a binding
 * refuses a library whose ABI version differs from the header it was built with. */
const char* tilejit_version(void);
int tilejit_c_abi_version(void);
/* The message of this thread's last failed call ("" after a success). */
const char* tilejit_last_error(void);

/* attention::forward / backward on `stream` (a CUstream as an integer; 0: the legacy default
 * stream), with `workspace` of `workspace_bytes` (0 / 0: the call allocates and synchronises). */
tilejit_status tilejit_attention_forward(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                         const tilejit_tensor* o, const tilejit_tensor* lse,
                                         const tilejit_attention_options* opts, uint64_t stream, uint64_t workspace,
                                         size_t workspace_bytes);
tilejit_status tilejit_attention_backward(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                          const tilejit_tensor* o, const tilejit_tensor* dout, const tilejit_tensor* lse,
                                          const tilejit_tensor* dq, const tilejit_tensor* dk, const tilejit_tensor* dv,
                                          const tilejit_attention_options* opts, uint64_t stream, uint64_t workspace,
                                          size_t workspace_bytes);
/* attention::generate_dropout_bits: the packed keep-mask of a call with these options (dropout_p > 0,
 * seed / offset or rng_state) into `bits`, u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)], bit j % 32 of
 * word j / 32 = key column j kept; a varlen call's mask is that of batch = its sequence count and
 * seq_q / seq_k = max_seqlen_q / k, rows and columns inside each sequence. programs: 0 (one per tile)
 * or a persistent grid's size. Asynchronous on `stream`. */
tilejit_status tilejit_generate_dropout_bits(const tilejit_tensor* bits, int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k,
                                             const tilejit_attention_options* opts, uint64_t stream, int32_t programs);
/* Bytes a block mask for these options needs (0: a mask kind with tile intervals, nothing to build). */
tilejit_status tilejit_block_mask_bytes(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_attention_options* opts,
                                        size_t* bytes);
tilejit_status tilejit_block_mask_build(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_attention_options* opts,
                                        uint64_t storage, size_t storage_bytes, uint64_t stream, tilejit_block_mask** mask);
void tilejit_block_mask_free(tilejit_block_mask* mask); /* NULL: nothing */
/* Workspace sizes (attention::forward_workspace_bytes, backward_workspace_bytes with k). */
tilejit_status tilejit_attention_forward_workspace_bytes(const tilejit_tensor* q, const tilejit_tensor* k,
                                                         const tilejit_attention_options* opts, size_t* bytes);
tilejit_status tilejit_attention_backward_workspace_bytes(const tilejit_tensor* q, const tilejit_tensor* k,
                                                          const tilejit_attention_options* opts, size_t* bytes);
/* Compiles (or finds in the caches) every kernel a call with this configuration launches, without
 * a GPU (attention::prepare with a mask kind): call at start-up so the first step does not JIT.
 * backward, dropout, q_descending: 0 / 1; mask_kind: tilejit_mask_kind (CAUSAL = causal). */
tilejit_status tilejit_attention_prepare(int32_t dtype, int32_t head_dim, int32_t mask_kind, int32_t varlen, int32_t backward,
                                         int32_t device, int32_t dropout, int32_t dq_reduction, int32_t q_descending);

/* The argument checks alone (no GPU, nothing compiled). */
tilejit_status tilejit_attention_check_forward(const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                               const tilejit_tensor* o, const tilejit_tensor* lse,
                                               const tilejit_attention_options* opts);

/* ---- context parallelism (api/context_parallel.hpp): one runner per rank ---- */

typedef struct tilejit_cp tilejit_cp; /* a communicator and its runner; opaque */

typedef enum tilejit_cp_mode { TILEJIT_CP_ULYSSES = 0, TILEJIT_CP_ALLGATHER = 1, TILEJIT_CP_RING = 2 } tilejit_cp_mode;
typedef enum tilejit_cp_layout { TILEJIT_CP_CONTIGUOUS = 0, TILEJIT_CP_ZIGZAG = 1 } tilejit_cp_layout;

/* NCCL's 128-byte unique id (rank 0 makes it and shares it). */
tilejit_status tilejit_nccl_unique_id(uint8_t id[128]);
/* A runner over a new communicator (collective: every rank calls it with the same id), or over an
 * ncclComm_t the caller owns and keeps alive (e.g. PyTorch's process group's). */
tilejit_status tilejit_cp_create(const uint8_t id[128], int32_t rank, int32_t world, int32_t device, tilejit_cp** out);
tilejit_status tilejit_cp_wrap(void* nccl_comm, int32_t rank, int32_t world, int32_t device, tilejit_cp** out);
void tilejit_cp_destroy(tilejit_cp* cp);
/* ContextParallel::forward / backward: this rank's shard of a sequence of seq_len tokens. */
tilejit_status tilejit_cp_forward(tilejit_cp* cp, const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                  const tilejit_tensor* o, const tilejit_tensor* lse, int64_t seq_len, int32_t mode, int32_t layout,
                                  const tilejit_attention_options* opts, uint64_t stream);
tilejit_status tilejit_cp_backward(tilejit_cp* cp, const tilejit_tensor* q, const tilejit_tensor* k, const tilejit_tensor* v,
                                   const tilejit_tensor* o, const tilejit_tensor* dout, const tilejit_tensor* lse,
                                   const tilejit_tensor* dq, const tilejit_tensor* dk, const tilejit_tensor* dv, int64_t seq_len,
                                   int32_t mode, int32_t layout, const tilejit_attention_options* opts, uint64_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TILEJIT_C_H */
