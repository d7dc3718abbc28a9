/* The C ABI (bindings/c/tilejit_c.h), compiled as C: versions, a valid call's checks, workspace
 * sizes, and bad arguments as TILEJIT_INVALID_ARGUMENT with the library's message. No GPU needed
 * (nothing launches: every call here stops at the checks or computes sizes). */
#include <stdio.h>
#include <string.h>

#include "bindings/c/tilejit_c.h"

static int failures = 0;
#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      ++failures;                                                \
    }                                                            \
  } while (0)

static tilejit_tensor contiguous(uint64_t data, int dtype, int rank, const int64_t* sizes) {
  tilejit_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = stride;
    stride *= sizes[i];
  }
  return t;
}

/* a call that fails with `status` and a message containing `want` */
#define EXPECT_FAILS(call, status, want)                                                             \
  do {                                                                                               \
    tilejit_status s_ = (call);                                                                      \
    EXPECT(s_ == (status), "status %d, message '%s'", (int)s_, tilejit_last_error());                \
    EXPECT(strstr(tilejit_last_error(), (want)) != NULL, "message '%s' lacks '%s'", tilejit_last_error(), (want)); \
  } while (0)

int main(void) {
  EXPECT(tilejit_c_abi_version() == TILEJIT_C_ABI_VERSION, "abi %d", tilejit_c_abi_version());
  EXPECT(strlen(tilejit_version()) > 0, "empty version");

  const uint64_t base = 0x7f0000000000ull; /* fake, aligned addresses: never dereferenced */
  const int64_t qs[4] = {2, 100, 8, 64}, ks[4] = {2, 300, 2, 64}, ls[3] = {2, 8, 100};
  tilejit_tensor q = contiguous(base, TILEJIT_BF16, 4, qs), k = contiguous(base + 0x1000000, TILEJIT_BF16, 4, ks);
  tilejit_tensor v = contiguous(base + 0x2000000, TILEJIT_BF16, 4, ks), o = contiguous(base + 0x3000000, TILEJIT_BF16, 4, qs);
  tilejit_tensor lse = contiguous(base + 0x4000000, TILEJIT_F32, 3, ls);
  tilejit_attention_options opts;
  tilejit_attention_options_init(&opts);
  opts.causal = 1;

  EXPECT(tilejit_attention_check_forward(&q, &k, &v, &o, &lse, &opts) == TILEJIT_OK, "%s", tilejit_last_error());
  EXPECT(strcmp(tilejit_last_error(), "") == 0, "'%s' after a success", tilejit_last_error());
  EXPECT(tilejit_attention_check_forward(&q, &k, &v, &o, &lse, NULL) == TILEJIT_OK, "NULL options: %s", tilejit_last_error());

  size_t bytes = 0;
  EXPECT(tilejit_attention_backward_workspace_bytes(&q, &k, &opts, &bytes) == TILEJIT_OK, "%s", tilejit_last_error());
  EXPECT(bytes >= (size_t)(4 * 2 * 8 * 100), "Delta needs 6400 bytes, got %zu", bytes); /* Delta: f32 [B, Hq, S_q] */
  EXPECT(tilejit_attention_forward_workspace_bytes(&q, &k, &opts, &bytes) == TILEJIT_OK && bytes == 0, "forward %zu", bytes);

  /* block masks: nothing to build for a mask with tile intervals; document masks need lists */
  EXPECT(tilejit_block_mask_bytes(&q, &k, &opts, &bytes) == TILEJIT_OK && bytes == 0, "causal: %zu (%s)", bytes, tilejit_last_error());
  const int64_t ds[2] = {2, 300};
  tilejit_tensor doc_ids = contiguous(base + 0x5000000, TILEJIT_I32, 2, ds);
  tilejit_attention_options docs = opts;
  docs.causal = 0;
  docs.mask_kind = TILEJIT_MASK_DOCUMENT;
  docs.mask_doc_ids = &doc_ids;
  EXPECT(tilejit_block_mask_bytes(&q, &k, &docs, &bytes) == TILEJIT_OK && bytes > 0, "document: %zu (%s)", bytes, tilejit_last_error());
  tilejit_block_mask* mask = (tilejit_block_mask*)0x1;
  EXPECT_FAILS(tilejit_block_mask_build(&q, &k, &docs, base + 0x6000000, 16, 0, &mask), TILEJIT_INVALID_ARGUMENT,
               "storage has 16 bytes");
  EXPECT(mask == NULL, "a failed build leaves no handle");
  EXPECT_FAILS(tilejit_block_mask_build(&q, &k, &docs, base + 0x6000000, bytes, 0, NULL), TILEJIT_INVALID_ARGUMENT, "mask is NULL");
  EXPECT_FAILS(tilejit_block_mask_bytes(&q, &k, &docs, NULL), TILEJIT_INVALID_ARGUMENT, "bytes is NULL");
  tilejit_block_mask_free(NULL);

  /* the C side's own checks */
  tilejit_tensor bad = q;
  bad.dtype = 99;
  EXPECT_FAILS(tilejit_attention_check_forward(&bad, &k, &v, &o, &lse, &opts), TILEJIT_INVALID_ARGUMENT, "q has dtype code 99");
  EXPECT_FAILS(tilejit_attention_check_forward(&q, NULL, &v, &o, &lse, &opts), TILEJIT_INVALID_ARGUMENT, "k is NULL");
  bad = q;
  bad.rank = 5;
  EXPECT_FAILS(tilejit_attention_check_forward(&bad, &k, &v, &o, &lse, &opts), TILEJIT_INVALID_ARGUMENT, "q has rank 5");
  tilejit_attention_options m = opts;
  m.mask_kind = 42;
  EXPECT_FAILS(tilejit_attention_check_forward(&q, &k, &v, &o, &lse, &m), TILEJIT_INVALID_ARGUMENT, "options.mask_kind is 42");
  EXPECT_FAILS(tilejit_attention_backward_workspace_bytes(&q, &k, &opts, NULL), TILEJIT_INVALID_ARGUMENT, "bytes is NULL");
  /* TILEJIT_DQ_DEFAULT: the library's default reduction for the shape (D 128 full, S_q 8192: atomic,
   * whose dQ accumulator makes the workspace larger than recompute's); TILEJIT_DQ_DETERMINISTIC: the
   * fastest deterministic one (there ordered: the accumulator and its semaphores) */
  {
    const int64_t qs2[] = {1, 8192, 4, 128}, ks2[] = {1, 8192, 4, 128};
    tilejit_tensor q2 = contiguous(base, TILEJIT_BF16, 4, qs2), k2 = contiguous(base + 0x10000000, TILEJIT_BF16, 4, ks2);
    tilejit_attention_options d;
    tilejit_attention_options_init(&d);
    size_t recompute = 0, dflt = 0, atomic = 0, deterministic = 0, ordered = 0;
    EXPECT(tilejit_attention_backward_workspace_bytes(&q2, &k2, &d, &recompute) == TILEJIT_OK, "%s", tilejit_last_error());
    d.dq_reduction = TILEJIT_DQ_DEFAULT;
    EXPECT(tilejit_attention_backward_workspace_bytes(&q2, &k2, &d, &dflt) == TILEJIT_OK, "%s", tilejit_last_error());
    d.dq_reduction = TILEJIT_DQ_ATOMIC;
    EXPECT(tilejit_attention_backward_workspace_bytes(&q2, &k2, &d, &atomic) == TILEJIT_OK, "%s", tilejit_last_error());
    d.dq_reduction = TILEJIT_DQ_DETERMINISTIC;
    EXPECT(tilejit_attention_backward_workspace_bytes(&q2, &k2, &d, &deterministic) == TILEJIT_OK, "%s", tilejit_last_error());
    d.dq_reduction = TILEJIT_DQ_ORDERED;
    EXPECT(tilejit_attention_backward_workspace_bytes(&q2, &k2, &d, &ordered) == TILEJIT_OK, "%s", tilejit_last_error());
    EXPECT(dflt == atomic && atomic > recompute && deterministic == ordered && ordered > atomic,
           "default %zu, atomic %zu, deterministic %zu, ordered %zu, recompute %zu", dflt, atomic, deterministic, ordered, recompute);
    d.dq_reduction = -3;
    EXPECT_FAILS(tilejit_attention_backward_workspace_bytes(&q2, &k2, &d, &dflt), TILEJIT_INVALID_ARGUMENT,
                 "options.dq_reduction is -3; valid: -2 the fastest deterministic one");
  }

  /* the library's checks, message passed through */
  const int64_t q7[4] = {2, 100, 7, 64};
  tilejit_tensor q_odd = contiguous(base, TILEJIT_BF16, 4, q7), o_odd = contiguous(base + 0x3000000, TILEJIT_BF16, 4, q7);
  EXPECT_FAILS(tilejit_attention_check_forward(&q_odd, &k, &v, &o_odd, &lse, &opts), TILEJIT_INVALID_ARGUMENT, "tilejit::attention");
  tilejit_attention_options d = opts;
  d.dropout_p = 1.5;
  EXPECT_FAILS(tilejit_attention_forward(&q, &k, &v, &o, &lse, &d, 0, 0, 0), TILEJIT_INVALID_ARGUMENT, "dropout_p");
  /* dropout's seed and offset in device memory: i64 [2] passes the checks, other shapes do not */
  const int64_t two[1] = {2}, three[1] = {3};
  tilejit_tensor state = contiguous(base + 0x7000000, TILEJIT_I64, 1, two);
  d.dropout_p = 0.1;
  d.rng_state = &state;
  EXPECT(tilejit_attention_check_forward(&q, &k, &v, &o, &lse, &d) == TILEJIT_OK, "%s", tilejit_last_error());
  state = contiguous(base + 0x7000000, TILEJIT_I64, 1, three);
  EXPECT_FAILS(tilejit_attention_check_forward(&q, &k, &v, &o, &lse, &d), TILEJIT_INVALID_ARGUMENT,
               "options.rng_state has sizes [3] but must be [2]");
  /* the packed keep-mask: its checks run before any launch */
  const int64_t bs[3] = {16, 100, 9};
  tilejit_tensor bits = contiguous(base + 0x8000000, TILEJIT_U32, 3, bs);
  EXPECT_FAILS(tilejit_generate_dropout_bits(&bits, 2, 8, 100, 300, &d, 0, 0), TILEJIT_INVALID_ARGUMENT,
               "bits has sizes [16,100,9] but must be [B * Hq, S_q, cdiv(S_k, 32)] = [16,100,10]");
  EXPECT_FAILS(tilejit_generate_dropout_bits(NULL, 2, 8, 100, 300, &d, 0, 0), TILEJIT_INVALID_ARGUMENT, "bits is NULL");

  EXPECT_FAILS(tilejit_attention_prepare(TILEJIT_F32, 128, TILEJIT_MASK_CAUSAL, 0, 1, 0, 0, 0, 0), TILEJIT_INVALID_ARGUMENT,
               "dtype code 11");
  EXPECT_FAILS(tilejit_attention_prepare(TILEJIT_BF16, 100, TILEJIT_MASK_CAUSAL, 0, 0, 0, 0, 0, 0), TILEJIT_INVALID_ARGUMENT,
               "100");

  /* context parallelism over a wrapped (fake, never called) communicator: argument errors */
  tilejit_cp* cp = NULL;
  EXPECT(tilejit_cp_wrap((void*)0x10, 0, 2, 0, &cp) == TILEJIT_OK && cp != NULL, "%s", tilejit_last_error());
  const int64_t cq[4] = {1, 8, 4, 64}, ckv[4] = {1, 8, 2, 64}, cl[3] = {1, 4, 8};
  tilejit_tensor sq = contiguous(base, TILEJIT_BF16, 4, cq), sk = contiguous(base + 0x100000, TILEJIT_BF16, 4, ckv);
  tilejit_tensor sv = contiguous(base + 0x200000, TILEJIT_BF16, 4, ckv), so = contiguous(base + 0x300000, TILEJIT_BF16, 4, cq);
  tilejit_tensor sl = contiguous(base + 0x400000, TILEJIT_F32, 3, cl);
  EXPECT_FAILS(tilejit_cp_forward(cp, &sq, &sk, &sv, &so, &sl, 16, 7, TILEJIT_CP_ZIGZAG, &opts, 0), TILEJIT_INVALID_ARGUMENT,
               "mode is 7");
  EXPECT_FAILS(tilejit_cp_forward(cp, &sq, &sk, &sv, &so, &sl, 18, TILEJIT_CP_RING, TILEJIT_CP_ZIGZAG, &opts, 0),
               TILEJIT_INVALID_ARGUMENT, "holds 9 tokens of seq_len 18");
  EXPECT_FAILS(tilejit_cp_forward(NULL, &sq, &sk, &sv, &so, &sl, 16, TILEJIT_CP_RING, TILEJIT_CP_ZIGZAG, &opts, 0),
               TILEJIT_INVALID_ARGUMENT, "cp is NULL");
  tilejit_cp_destroy(cp);
  EXPECT_FAILS(tilejit_cp_wrap(NULL, 0, 2, 0, &cp), TILEJIT_INVALID_ARGUMENT, "");

  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("test_c_abi: all checks passed\n");
  return failures ? 1 : 0;
}
