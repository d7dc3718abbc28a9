// tilejit::attention argument checks, without a GPU: every rejected argument gives one
// std::invalid_argument naming the function, the argument, the value and what is valid, before
// anything compiles or launches; a valid call without a GPU stops at the driver, not earlier.
#include "api/attention.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "api/attention/internal.hpp"
#include "kernels/attention/backward.hpp"
#include "runtime/driver.hpp"

using namespace tilejit;
using namespace tilejit::attention;
using ir::DType;

namespace {

constexpr uint64_t kBase = 0x7f0000000000;  // a fake, well-aligned device address (never dereferenced)

// A valid call: B=2, S_q=100, S_k=300, Hq=8, Hkv=2, D=64, bf16, all [B, S, H, D] contiguous.
struct Call {
  Tensor q = contiguous(kBase, DType::bf16, {2, 100, 8, 64});
  Tensor k = contiguous(kBase + 0x1000000, DType::bf16, {2, 300, 2, 64});
  Tensor v = contiguous(kBase + 0x2000000, DType::bf16, {2, 300, 2, 64});
  Tensor o = contiguous(kBase + 0x3000000, DType::bf16, {2, 100, 8, 64});
  Tensor lse = contiguous(kBase + 0x4000000, DType::f32, {2, 8, 100});
  Tensor dout = contiguous(kBase + 0x5000000, DType::bf16, {2, 100, 8, 64});
  Tensor dq = contiguous(kBase + 0x6000000, DType::bf16, {2, 100, 8, 64});
  Tensor dk = contiguous(kBase + 0x7000000, DType::bf16, {2, 300, 2, 64});
  Tensor dv = contiguous(kBase + 0x8000000, DType::bf16, {2, 300, 2, 64});
  Options opts;
  Workspace ws;

  void check_fwd() const { check_forward(q, k, v, o, lse, opts); }
  void check_bwd() const { check_backward(q, k, v, o, dout, lse, dq, dk, dv, opts, ws); }
};

// A valid variable-length call: 3 sequences packed into q/o/do/dq [total_q = 300, 8, 64] and
// k/v/dk/dv [total_k = 500, 2, 64], lse [8, 300], the longest 200 queries and 250 keys.
Call packed_call() {
  Call c;
  c.q = contiguous(kBase, DType::bf16, {300, 8, 64});
  c.o = contiguous(kBase + 0x3000000, DType::bf16, {300, 8, 64});
  c.k = contiguous(kBase + 0x1000000, DType::bf16, {500, 2, 64});
  c.v = contiguous(kBase + 0x2000000, DType::bf16, {500, 2, 64});
  c.lse = contiguous(kBase + 0x4000000, DType::f32, {8, 300});
  c.dout = contiguous(kBase + 0x5000000, DType::bf16, {300, 8, 64});
  c.dq = contiguous(kBase + 0x6000000, DType::bf16, {300, 8, 64});
  c.dk = contiguous(kBase + 0x7000000, DType::bf16, {500, 2, 64});
  c.dv = contiguous(kBase + 0x8000000, DType::bf16, {500, 2, 64});
  c.opts.cu_seqlens_q = contiguous(kBase + 0xa000000, DType::i32, {4});
  c.opts.cu_seqlens_k = contiguous(kBase + 0xb000000, DType::i32, {4});
  c.opts.max_seqlen_q = 200;
  c.opts.max_seqlen_k = 250;
  return c;
}

// The Call shapes in [B, H, S, D] memory, passed as their permuted [B, S, H, D] views, head dim d
// (the calls here never run).
Call bhsd_call(int64_t d) {
  Call c;
  c.q = permute(contiguous(kBase, DType::bf16, {2, 8, 100, d}), {0, 2, 1, 3});
  c.o = permute(contiguous(kBase + 0x3000000, DType::bf16, {2, 8, 100, d}), {0, 2, 1, 3});
  c.k = permute(contiguous(kBase + 0x1000000, DType::bf16, {2, 2, 300, d}), {0, 2, 1, 3});
  c.v = permute(contiguous(kBase + 0x2000000, DType::bf16, {2, 2, 300, d}), {0, 2, 1, 3});
  c.dout = permute(contiguous(kBase + 0x5000000, DType::bf16, {2, 8, 100, d}), {0, 2, 1, 3});
  c.dq = permute(contiguous(kBase + 0x6000000, DType::bf16, {2, 8, 100, d}), {0, 2, 1, 3});
  c.dk = permute(contiguous(kBase + 0x7000000, DType::bf16, {2, 2, 300, d}), {0, 2, 1, 3});
  c.dv = permute(contiguous(kBase + 0x8000000, DType::bf16, {2, 2, 300, d}), {0, 2, 1, 3});
  return c;
}

// The message of the invalid_argument `f` throws (fails the test when it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("no std::invalid_argument");
  return {};
}

#define CHECK_FWD_ERROR(call, ...)                                               \
  do {                                                                           \
    const std::string msg = error_of([&] { (call).check_fwd(); });               \
    INFO(msg);                                                                   \
    CHECK(msg.starts_with("tilejit::attention::forward: "));                     \
    for (const char* part : {__VA_ARGS__}) CHECK(msg.find(part) != std::string::npos); \
  } while (0)
#define CHECK_BWD_ERROR(call, ...)                                               \
  do {                                                                           \
    const std::string msg = error_of([&] { (call).check_bwd(); });               \
    INFO(msg);                                                                   \
    CHECK(msg.starts_with("tilejit::attention::backward: "));                    \
    for (const char* part : {__VA_ARGS__}) CHECK(msg.find(part) != std::string::npos); \
  } while (0)

}  // namespace

TEST_CASE("attention API: a valid call passes the checks (forward, backward, BHSD as a permuted view)") {
  Call c;
  CHECK_NOTHROW(c.check_fwd());
  if (backward_available()) CHECK_NOTHROW(c.check_bwd());
  // [B, H, S, D] memory passed as its [B, S, H, D] view.
  c.q = permute(contiguous(kBase, DType::f16, {2, 8, 100, 64}), {0, 2, 1, 3});
  c.k = permute(contiguous(kBase + 0x1000000, DType::f16, {2, 2, 300, 64}), {0, 2, 1, 3});
  c.v = c.k;
  c.v.data += 0x1000000;
  c.o = c.q;
  c.o.data += 0x3000000;
  CHECK(c.q.sizes == std::array<int64_t, 4>{2, 100, 8, 64});
  CHECK(c.q.strides == std::array<int64_t, 4>{8 * 100 * 64, 64, 100 * 64, 1});
  CHECK_NOTHROW(c.check_fwd());
  c.opts.softmax_scale = 0.3f;
  c.opts.causal = true;
  CHECK_NOTHROW(c.check_fwd());
}

TEST_CASE("attention API: dtypes") {
  Call c;
  c.q.dtype = DType::f32;
  CHECK_FWD_ERROR(c, "q has dtype f32", "supported: bf16, f16");
  c = Call{};
  c.k.dtype = DType::f16;
  CHECK_FWD_ERROR(c, "k has dtype f16 but q has bf16", "must share one dtype");
  c = Call{};
  c.o.dtype = DType::f16;
  CHECK_FWD_ERROR(c, "o has dtype f16 but q has bf16");
  c = Call{};
  c.lse.dtype = DType::bf16;
  CHECK_FWD_ERROR(c, "lse has dtype bf16", "must be f32");
  if (backward_available()) {
    c = Call{};
    c.dk.dtype = DType::f16;
    CHECK_BWD_ERROR(c, "dk has dtype f16 but q has bf16", "q, k, v, o, do, dq, dk, dv");
  }
}

TEST_CASE("attention API: head dims and shapes") {
  Call c;
  for (Tensor* t : {&c.q, &c.k, &c.v, &c.o}) *t = contiguous(t->data, t->dtype, {t->sizes[0], t->sizes[1], t->sizes[2], 96});
  CHECK_FWD_ERROR(c, "head dim D = 96", "supported: 64, 128, 256");
  c = Call{};
  c.k = contiguous(c.k.data, DType::bf16, {2, 300, 2, 128});
  CHECK_FWD_ERROR(c, "k has head dim D = 128 but q has D = 64");
  c = Call{};
  c.k = contiguous(c.k.data, DType::bf16, {3, 300, 2, 64});
  c.v = contiguous(c.v.data, DType::bf16, {3, 300, 2, 64});
  CHECK_FWD_ERROR(c, "k has batch size B = 3 but q has B = 2");
  c = Call{};
  c.k = contiguous(c.k.data, DType::bf16, {2, 300, 3, 64});
  c.v = contiguous(c.v.data, DType::bf16, {2, 300, 3, 64});
  CHECK_FWD_ERROR(c, "q has Hq = 8 heads, not a multiple of k's Hkv = 3");
  c = Call{};
  c.v = contiguous(c.v.data, DType::bf16, {2, 299, 2, 64});
  CHECK_FWD_ERROR(c, "v has sizes [2,299,2,64] but k has [2,300,2,64]", "v must match k");
  c = Call{};
  c.o = contiguous(c.o.data, DType::bf16, {2, 101, 8, 64});
  CHECK_FWD_ERROR(c, "o has sizes [2,101,8,64] but q has [2,100,8,64]");
  c = Call{};
  c.lse = contiguous(c.lse.data, DType::f32, {2, 100, 8});
  CHECK_FWD_ERROR(c, "lse has sizes [2,100,8] but must be [B, Hq, S_q] = [2,8,100]");
  c = Call{};
  c.lse = contiguous(c.lse.data, DType::f32, {2, 8, 100, 1});
  CHECK_FWD_ERROR(c, "lse must be rank 3 [B, Hq, S_q], got rank 4");
  c = Call{};
  c.q = contiguous(c.q.data, DType::bf16, {200, 8, 64});
  CHECK_FWD_ERROR(c, "q must be rank 4 [B, S_q, Hq, D], got rank 3");
  c = Call{};
  c.q = contiguous(c.q.data, DType::bf16, {2, 0, 8, 64});
  c.o = contiguous(c.o.data, DType::bf16, {2, 0, 8, 64});
  CHECK_FWD_ERROR(c, "q is empty", "every size must be at least 1");
  c = Call{};
  c.q = contiguous(c.q.data, DType::bf16, {2, 100, 70000, 64});
  c.o = contiguous(c.o.data, DType::bf16, {2, 100, 70000, 64});
  c.k = contiguous(c.k.data, DType::bf16, {2, 300, 70000, 64});
  c.v = contiguous(c.v.data, DType::bf16, {2, 300, 70000, 64});
  CHECK_FWD_ERROR(c, "Hq = 70000 heads; at most 65535");
  if (backward_available()) {
    c = Call{};
    c.dq = contiguous(c.dq.data, DType::bf16, {2, 100, 8, 128});
    CHECK_BWD_ERROR(c, "dq has sizes [2,100,8,128] but q has [2,100,8,64]");
    c = Call{};
    c.dv = contiguous(c.dv.data, DType::bf16, {2, 300, 4, 64});
    CHECK_BWD_ERROR(c, "dv has sizes [2,300,4,64] but v has [2,300,2,64]");
    c = Call{};
    c.dout = contiguous(c.dout.data, DType::bf16, {1, 100, 8, 64});
    CHECK_BWD_ERROR(c, "do has sizes [1,100,8,64] but q has [2,100,8,64]");
  }
}

TEST_CASE("attention API: strides, pointers and alignment") {
  Call c;
  c.q = strided(c.q.data, DType::bf16, {2, 100, 8, 64}, {100 * 8 * 128, 8 * 128, 128, 2});
  CHECK_FWD_ERROR(c, "q has stride 2 on its last dim", "unit stride");
  c = Call{};
  c.k.data += 8;
  CHECK_FWD_ERROR(c, "k's base address 0x7f0001000008 is not a multiple of 16 bytes");
  c = Call{};
  // A row pitch of 8 * 64 + 4 elements = 1032 bytes: not a multiple of 16.
  c.v = strided(c.v.data, DType::bf16, {2, 300, 2, 64}, {300 * 516, 516, 64, 1});
  CHECK_FWD_ERROR(c, "v's stride 516 of dim 1 is 1032 bytes, not a multiple of 16 bytes");
  c = Call{};
  c.o.data = 0;
  CHECK_FWD_ERROR(c, "o is a null pointer");
  c = Call{};
  c.lse = strided(c.lse.data, DType::f32, {2, 8, 100}, {1600, 1, 8});
  CHECK_FWD_ERROR(c, "lse has stride 8 on its last dim");
  c = Call{};
  c.q = strided(c.q.data, DType::bf16, {2, 100, 8, 64}, {-51200, 512, 64, 1});
  CHECK_FWD_ERROR(c, "negative stride -51200 in dim 0");
  c = Call{};
  c.k.device = 1;
  CHECK_FWD_ERROR(c, "k is on device 1 but q is on device 0");
  if (backward_available()) {
    c = Call{};
    c.dq.data += 2;
    CHECK_BWD_ERROR(c, "dq's base address", "not a multiple of 16 bytes");
    c = Call{};
    c.ws = Workspace{kBase + 0x9000000, 100};
    CHECK_BWD_ERROR(c, "workspace has 100 bytes; this call needs 6400");
    CHECK(backward_workspace_bytes(c.q) == 6400);
    c.ws = Workspace{kBase + 0x9000008, 1 << 20};
    CHECK_BWD_ERROR(c, "workspace address 0x7f0009000008 is not a multiple of 16 bytes");
    c.ws = Workspace{0, 4096};
    CHECK_BWD_ERROR(c, "workspace has 4096 bytes but a null pointer");
  }
}

TEST_CASE("attention API: outputs share no memory with inputs, each other or the workspace (issue 27)") {
  Call c;
  c.o = c.q;  // in place: every program reads all of k and v, but other launches read q again
  CHECK_FWD_ERROR(c, "the output o (bf16[2,100,8,64] at 0x7f0000000000 on device 0) shares memory with q",
                  "attention writes no output in place");
  c = Call{};
  c.lse.data = c.v.data + 64 * 2;  // inside v
  CHECK_FWD_ERROR(c, "the output lse", "shares memory with v");
  c = Call{};
  c.lse.data = c.o.data + 16;  // o and lse overlap each other
  CHECK_FWD_ERROR(c, "the output lse", "shares memory with o");
  if (backward_available()) {
    c = Call{};
    c.dk = c.dv;
    CHECK_BWD_ERROR(c, "the output dv", "shares memory with dk");
    c = Call{};
    c.dq = c.dout;
    CHECK_BWD_ERROR(c, "the output dq", "shares memory with do");
    c = Call{};
    c.ws = Workspace{c.dv.data - 4096, 1 << 20};
    CHECK_BWD_ERROR(c, "the output dv", "overlaps the workspace (1048576 bytes at 0x7f0007fff000)");
    // the interleaved halves of one [.., 2, D] buffer are separate memory: dk and dv in one tensor
    c = Call{};
    c.dk = strided(kBase + 0xd000000, DType::bf16, {2, 300, 2, 64}, {300 * 2 * 128, 2 * 128, 128, 1});
    c.dv = strided(kBase + 0xd000000 + 128, DType::bf16, {2, 300, 2, 64}, {300 * 2 * 128, 2 * 128, 128, 1});
    CHECK_NOTHROW(check_backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts, c.ws));
    // packed QKV (a projection's [B, S, (8 + 2 + 2) * 64] output) and its gradient the same way: q,
    // k, v and dq, dk, dv as column ranges of one buffer each (rows of 768 elements)
    const auto packed = [](uint64_t base, int64_t first_head, int64_t heads) {
      return strided(base + static_cast<uint64_t>(first_head * 64 * 2), DType::bf16, {2, 300, heads, 64}, {300 * 768, 768, 64, 1});
    };
    Call p;
    const uint64_t qkv = kBase + 0x10000000, dqkv = kBase + 0x20000000;
    p.q = packed(qkv, 0, 8), p.k = packed(qkv, 8, 2), p.v = packed(qkv, 10, 2);
    p.dq = packed(dqkv, 0, 8), p.dk = packed(dqkv, 8, 2), p.dv = packed(dqkv, 10, 2);
    p.o = contiguous(kBase + 0x3000000, DType::bf16, {2, 300, 8, 64});
    p.dout = contiguous(kBase + 0x5000000, DType::bf16, {2, 300, 8, 64});
    p.lse = contiguous(kBase + 0x4000000, DType::f32, {2, 8, 300});
    CHECK_NOTHROW(p.check_fwd());
    CHECK_NOTHROW(p.check_bwd());
    p.dk = packed(dqkv, 7, 2);  // its first head is dq's last
    CHECK_BWD_ERROR(p, "the output dk", "shares memory with dq");
  }
}

TEST_CASE("attention API: options") {
  Call c;
  c.opts.softmax_scale = INFINITY;
  CHECK_FWD_ERROR(c, "options.softmax_scale = inf is not finite");
  c = Call{};
  c.opts.schedule = Schedule{48, 64, 4, 3};
  CHECK_FWD_ERROR(c, "block_m = 48", "powers of two from 16 to 256");
  c.opts.schedule = Schedule{64, 64, 3, 3};
  CHECK_FWD_ERROR(c, "num_warps = 3");
  c.opts.schedule = Schedule{64, 64, 4, 0};
  CHECK_FWD_ERROR(c, "stages = 0");
  c = Call{};
  c.opts.max_seqlen_q = 100;
  CHECK_FWD_ERROR(c, "max_seqlen_q/k = 100/0 are set without cu_seqlens_q/k");
}

// Dropout (issue 7): p in [0, 1), the test mask's dtype and sizes; a valid dropout call (with the
// mask, dense and varlen) reaches the driver after the kernels' launch checks (every DROPOUT and
// RETURN_MASK parameter bound).
TEST_CASE("attention API: dropout options") {
  CHECK(dropout_supported());
  Call c;
  for (double p : {-0.1, 1.0, 1.5, static_cast<double>(NAN)}) {
    c.opts.dropout_p = p;
    CHECK_FWD_ERROR(c, "options.dropout_p = ", "is not in [0, 1)");
    if (backward_available()) CHECK_BWD_ERROR(c, "options.dropout_p = ", "is not in [0, 1)");
  }
  for (double p : {0.0, 0.1, 0.5, 0.999}) {
    c.opts.dropout_p = p;
    c.opts.seed = 0xffffffffffffffffULL;
    c.opts.offset = 1ULL << 40;
    CHECK_NOTHROW(c.check_fwd());
    if (backward_available()) CHECK_NOTHROW(c.check_bwd());
  }
  // the mask for tests: u8 [B * Hq, S_q, S_k], only with dropout
  c = Call{};
  c.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {16, 100, 300});
  CHECK_FWD_ERROR(c, "options.dropout_mask is set but options.dropout_p = 0");
  c.opts.dropout_p = 0.1;
  CHECK_NOTHROW(c.check_fwd());
  if (backward_available()) CHECK_NOTHROW(c.check_bwd());  // the backward ignores the mask
  c.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {2, 100, 300});
  CHECK_FWD_ERROR(c, "options.dropout_mask has sizes [2,100,300] but must be [B * Hq, S_q, S_k] = [16,100,300]");
  c.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::i32, {16, 100, 300});
  CHECK_FWD_ERROR(c, "options.dropout_mask has dtype i32; it must be u8");
  c.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {16, 100, 300}, 1);
  CHECK_FWD_ERROR(c, "options.dropout_mask is on device 1 but q is on device 0");
  c.opts.dropout_mask = strided(kBase + 0xc000000, DType::u8, {16, 100, 300}, {30000, 300, 2});
  CHECK_FWD_ERROR(c, "options.dropout_mask has stride 2 on its last dim");
  // the precomputed packed mask (issue 7): u32 [B * Hq, S_q, cdiv(S_k, 32)], only with dropout
  c = Call{};
  c.opts.dropout_bits = contiguous(kBase + 0xd000000, DType::u32, {16, 100, 10});
  CHECK_FWD_ERROR(c, "options.dropout_bits is set but options.dropout_p = 0");
  c.opts.dropout_p = 0.1;
  CHECK_NOTHROW(c.check_fwd());
  if (backward_available()) CHECK_NOTHROW(c.check_bwd());  // the backward regenerates the same bits
  c.opts.dropout_bits = contiguous(kBase + 0xd000000, DType::u32, {16, 100, 9});
  CHECK_FWD_ERROR(c, "options.dropout_bits has sizes [16,100,9] but must be [B * Hq, S_q, cdiv(S_k, 32)] = [16,100,10]");
  c.opts.dropout_bits = contiguous(kBase + 0xd000000, DType::u8, {16, 100, 10});
  CHECK_FWD_ERROR(c, "options.dropout_bits has dtype u8; it must be u32");
  c.opts.dropout_bits = contiguous(kBase + 0xd000002, DType::u32, {16, 100, 10});
  CHECK_FWD_ERROR(c, "is not a multiple of 4 bytes");
  if (backward_available()) CHECK_BWD_ERROR(c, "options.dropout_bits", "is not a multiple of 4 bytes");  // the backward reads it too
  c.opts.dropout_bits = contiguous(kBase + 0xd000000, DType::u32, {16, 100, 10});
  c.opts.schedule = Schedule{.block_m = 64, .block_n = 16, .num_warps = 4, .stages = 2};
  CHECK_FWD_ERROR(c, "options.schedule.block_n = 16 with options.dropout_bits", "multiple of 32");
  // global coordinates (context parallelism): where the call sits in a larger attention's mask
  c = Call{};
  c.opts.dropout_p = 0.1;
  c.opts.dropout_coordinates = {.row_offset = 4096, .col_offset = 8192, .head_offset = 16, .heads = 64};
  CHECK_NOTHROW(c.check_fwd());
  if (backward_available()) CHECK_NOTHROW(c.check_bwd());
  c.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {16, 100, 300});
  CHECK_NOTHROW(c.check_fwd());  // (the returned mask is written at this call's positions)
  c.opts.dropout_mask.reset();
  c.opts.dropout_coordinates.col_offset = 100;
  CHECK_FWD_ERROR(c, "options.dropout_coordinates.col_offset = 100 is not a multiple of 64");
  c.opts.dropout_coordinates.col_offset = 0;
  c.opts.dropout_coordinates.row_offset = -1;
  CHECK_FWD_ERROR(c, "options.dropout_coordinates.row_offset = -1");
  c.opts.dropout_coordinates.row_offset = (int64_t{1} << 31) - 50;
  CHECK_FWD_ERROR(c, "row_offset = 2147483598; it must be in [0, 2^31 - 100]");
  c.opts.dropout_coordinates.row_offset = 0;
  c.opts.dropout_coordinates.heads = 20;
  CHECK_FWD_ERROR(c, "options.dropout_coordinates.heads = 20", "at least head_offset + Hq = 16 + 8");
  c.opts.dropout_coordinates.heads = 0;
  c.opts.dropout_bits = contiguous(kBase + 0xd000000, DType::u32, {16, 100, 10});
  CHECK_FWD_ERROR(c, "options.dropout_coordinates with options.dropout_bits");
  // varlen: heads place a call (b is the sequence), rows and keys count inside each sequence
  Call vc = packed_call();
  vc.opts.dropout_p = 0.1;
  vc.opts.dropout_coordinates = {.head_offset = 8, .heads = 32};
  CHECK_NOTHROW(vc.check_fwd());
  if (backward_available()) CHECK_NOTHROW(vc.check_bwd());
  vc.opts.dropout_coordinates.row_offset = 64;
  CHECK_FWD_ERROR(vc, "options.dropout_coordinates.row_offset / col_offset = 64 / 0 with cu_seqlens");

  // seed and offset in device memory (CUDA graphs): i64 / u64 [2], 8-byte aligned, only with dropout
  c = Call{};
  c.opts.rng_state = contiguous(kBase + 0xe000000, DType::i64, {2});
  CHECK_FWD_ERROR(c, "options.rng_state is set but options.dropout_p = 0");
  c.opts.dropout_p = 0.1;
  CHECK_NOTHROW(c.check_fwd());
  if (backward_available()) CHECK_NOTHROW(c.check_bwd());
  c.opts.rng_state = contiguous(kBase + 0xe000000, DType::u64, {2});
  CHECK_NOTHROW(c.check_fwd());
  c.opts.rng_state = contiguous(kBase + 0xe000000, DType::i32, {4});
  CHECK_FWD_ERROR(c, "options.rng_state has dtype i32; it must be i64 or u64");
  c.opts.rng_state = contiguous(kBase + 0xe000000, DType::i64, {3});
  CHECK_FWD_ERROR(c, "options.rng_state has sizes [3] but must be [2] = [seed, offset]");
  c.opts.rng_state = contiguous(kBase + 0xe000004, DType::i64, {2});
  CHECK_FWD_ERROR(c, "options.rng_state's base address", "is not a multiple of 8 bytes");
  if (backward_available()) CHECK_BWD_ERROR(c, "options.rng_state's base address", "is not a multiple of 8 bytes");
  c.opts.rng_state = contiguous(kBase + 0xe000000, DType::i64, {2}, 1);
  CHECK_FWD_ERROR(c, "options.rng_state is on device 1 but q is on device 0");
  c.opts.rng_state = strided(kBase + 0xe000000, DType::i64, {2}, {2});
  CHECK_FWD_ERROR(c, "options.rng_state has stride 2 on its last dim");

  // generate_dropout_bits: the mask for those options; every argument checked before a launch
  const auto gen_error = [](const Tensor& bits, int64_t b, int64_t h, int64_t sq, int64_t sk, double p) {
    Options o;
    o.dropout_p = p;
    return error_of([&] { generate_dropout_bits(bits, b, h, sq, sk, o); });
  };
  const Tensor good = contiguous(kBase + 0xd000000, DType::u32, {16, 100, 10});
  CHECK(gen_error(good, 2, 8, 100, 300, 0.0).find("options.dropout_p = 0 is not in (0, 1)") != std::string::npos);
  CHECK(gen_error(good, 2, 8, 100, 0, 0.1).find("seq_k = 0 is not in [1, ") != std::string::npos);
  CHECK(gen_error(good, 2, 8, 100, 330, 0.1).find("bits has sizes [16,100,10] but must be [B * Hq, S_q, cdiv(S_k, 32)] = [16,100,11]") !=
        std::string::npos);
  CHECK(gen_error(contiguous(kBase + 0xd000000, DType::i32, {16, 100, 10}), 2, 8, 100, 300, 0.1).find("bits has dtype i32") !=
        std::string::npos);
  {
    Options o;
    o.dropout_p = 0.1;
    CHECK(error_of([&] { generate_dropout_bits(good, 2, 8, 100, 300, o, nullptr, -1); }).find("programs = -1 is not in [0, ") !=
          std::string::npos);
    o.rng_state = contiguous(kBase + 0xe000000, DType::f32, {2});
    CHECK(error_of([&] { generate_dropout_bits(good, 2, 8, 100, 300, o); }).find("options.rng_state has dtype f32") != std::string::npos);
  }
  if (!runtime::Driver::get().available()) {
    Options o;
    o.dropout_p = 0.1;
    CHECK_THROWS_AS(generate_dropout_bits(good, 2, 8, 100, 300, o), runtime::DeviceError);
  }

  if (runtime::Driver::get().available()) return;  // the fake pointers must not reach a launch
  const auto needs_gpu = [](auto&& call) { CHECK_THROWS_AS(call(), runtime::DeviceError); };
  for (bool causal : {false, true}) {
    Call d;
    d.opts.causal = causal;
    d.opts.dropout_p = 0.2;
    d.opts.seed = 7;
    needs_gpu([&] { forward(d.q, d.k, d.v, d.o, d.lse, d.opts); });
    if (backward_available()) needs_gpu([&] { backward(d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.opts); });
    d.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {16, 100, 300});
    needs_gpu([&] { forward(d.q, d.k, d.v, d.o, d.lse, d.opts); });
    Call v = packed_call();
    v.opts.causal = causal;
    v.opts.dropout_p = 0.5;
    needs_gpu([&] { forward(v.q, v.k, v.v, v.o, v.lse, v.opts); });
    if (backward_available()) needs_gpu([&] { backward(v.q, v.k, v.v, v.o, v.dout, v.lse, v.dq, v.dk, v.dv, v.opts); });
    v.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {3 * 8, 200, 250});
    needs_gpu([&] { forward(v.q, v.k, v.v, v.o, v.lse, v.opts); });
    v.opts.dropout_mask = contiguous(kBase + 0xc000000, DType::u8, {3 * 8, 300, 500});
    CHECK_FWD_ERROR(v, "options.dropout_mask has sizes [24,300,500] but must be [B * Hq, max_seqlen_q, max_seqlen_k] = [24,200,250]");
  }
}

TEST_CASE("attention API: variable-length batches") {
  Call c = packed_call();
  const Call varlen = c;
  if (!varlen_supported(false)) {
    CHECK_FWD_ERROR(c, "not supported by this build's forward kernels", "VARLEN");
    return;
  }
  CHECK_NOTHROW(c.check_fwd());
  if (!runtime::Driver::get().available()) {
    // Every kernel parameter bound (cu_seqlens included) and the kernel's launch checks passed.
    CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts), runtime::DeviceError);
    if (varlen_supported(true))
      CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts), runtime::DeviceError);
  }
  c.opts.cu_seqlens_k.reset();
  CHECK_FWD_ERROR(c, "options.cu_seqlens_q is set but options.cu_seqlens_k is not");
  c = varlen;
  c.opts.cu_seqlens_k = contiguous(kBase + 0xb000000, DType::i32, {5});
  CHECK_FWD_ERROR(c, "cu_seqlens_q has 4 entries but options.cu_seqlens_k has 5");
  c = varlen;
  c.opts.cu_seqlens_q = contiguous(kBase + 0xa000000, DType::i64, {4});
  CHECK_FWD_ERROR(c, "options.cu_seqlens_q has dtype i64; it must be i32");
  c = varlen;
  c.opts.cu_seqlens_q = contiguous(kBase + 0xa000000, DType::i32, {1});
  c.opts.cu_seqlens_k = contiguous(kBase + 0xb000000, DType::i32, {1});
  CHECK_FWD_ERROR(c, "has 1 entries; it needs B + 1 >= 2");
  c = varlen;
  c.opts.max_seqlen_q = 301;
  CHECK_FWD_ERROR(c, "options.max_seqlen_q = 301", "between 1 and q's total tokens 300");
  c = varlen;
  c.opts.max_seqlen_k = 0;
  CHECK_FWD_ERROR(c, "options.max_seqlen_k = 0");
  c = varlen;
  c.lse = contiguous(kBase + 0x4000000, DType::f32, {3, 8, 100});
  CHECK_FWD_ERROR(c, "lse must be rank 2 [Hq, total_q] (varlen)");
  c = varlen;
  c.q = contiguous(kBase, DType::bf16, {3, 100, 8, 64});
  CHECK_FWD_ERROR(c, "q must be rank 3 [total_q, Hq, D] (varlen), got rank 4");
}

TEST_CASE("attention API: variable-length backward") {
  Call c = packed_call();
  const Call varlen = c;
  if (!backward_available()) return;
  // This build's backward kernels declare VARLEN.
  REQUIRE(varlen_supported(true));
  CHECK_NOTHROW(c.check_bwd());
  c.opts.causal = true;
  c.opts.softmax_scale = 0.25f;
  CHECK_NOTHROW(c.check_bwd());
  // Delta: f32 [Hq, total_q] = 8 * 300 * 4 = 9600 bytes, rounded up to 256.
  CHECK(backward_workspace_bytes(c.q, c.opts) == 9728);
  c.ws = Workspace{kBase + 0x9000000, 9728};
  CHECK_NOTHROW(c.check_bwd());
  c.ws.bytes = 9600;
  CHECK_BWD_ERROR(c, "workspace has 9600 bytes; this call needs 9728");
  // A packed q without the offsets is not a dense q.
  CHECK(error_of([&] { (void)backward_workspace_bytes(c.q); }).find("q must be rank 4") != std::string::npos);

  // Gradients shaped like the packed inputs.
  c = varlen;
  c.dq = contiguous(c.dq.data, DType::bf16, {299, 8, 64});
  CHECK_BWD_ERROR(c, "dq has sizes [299,8,64] but q has [300,8,64]");
  c = varlen;
  c.dk = contiguous(c.dk.data, DType::bf16, {500, 8, 64});
  CHECK_BWD_ERROR(c, "dk has sizes [500,8,64] but k has [500,2,64]");
  c = varlen;
  c.dv = contiguous(c.dv.data, DType::bf16, {1, 500, 2, 64});
  CHECK_BWD_ERROR(c, "dv must be rank 3 [total_k, Hkv, D] (varlen), got rank 4");
  c = varlen;
  c.dout = contiguous(c.dout.data, DType::bf16, {300, 8, 128});
  CHECK_BWD_ERROR(c, "do has sizes [300,8,128] but q has [300,8,64]");
  c = varlen;
  c.dq.dtype = DType::f16;
  CHECK_BWD_ERROR(c, "dq has dtype f16 but q has bf16", "q, k, v, o, do, dq, dk, dv");
  c = varlen;
  c.dk = strided(c.dk.data, DType::bf16, {500, 2, 64}, {136, 68, 1});  // a 136-byte head pitch
  CHECK_BWD_ERROR(c, "dk's stride 68 of dim 1 is 136 bytes, not a multiple of 16 bytes");
  // The offsets: both or neither, one count, i32, and the lse of the packed layout.
  c = varlen;
  c.opts.cu_seqlens_q.reset();
  CHECK_BWD_ERROR(c, "options.cu_seqlens_k is set but options.cu_seqlens_q is not");
  c = varlen;
  c.opts.cu_seqlens_q = contiguous(kBase + 0xa000000, DType::i32, {3});
  CHECK_BWD_ERROR(c, "options.cu_seqlens_q has 3 entries but options.cu_seqlens_k has 4");
  c = varlen;
  c.opts.cu_seqlens_k = contiguous(kBase + 0xb000000, DType::i64, {4});
  CHECK_BWD_ERROR(c, "options.cu_seqlens_k has dtype i64; it must be i32");
  c = varlen;
  c.opts.cu_seqlens_k->data += 2;
  CHECK_BWD_ERROR(c, "options.cu_seqlens_k's base address", "not a multiple of 4 bytes");
  c = varlen;
  c.opts.max_seqlen_k = 501;
  CHECK_BWD_ERROR(c, "options.max_seqlen_k = 501", "between 1 and k's total tokens 500");
  c = varlen;
  c.lse = contiguous(c.lse.data, DType::f32, {8, 299});
  CHECK_BWD_ERROR(c, "lse has sizes [8,299] but must be [Hq, total_q] (varlen) = [8,300]");
  if (!runtime::Driver::get().available()) {
    // Every parameter of the three varlen kernels bound (the preprocess takes cu_seqlens_q only)
    // and their launch checks passed, with and without a caller's workspace.
    c = varlen;
    CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts), runtime::DeviceError);
    c.opts.causal = true;
    CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts, nullptr,
                             Workspace{kBase + 0x9000000, backward_workspace_bytes(c.q, c.opts)}),
                    runtime::DeviceError);
  }
}

// Options::varlen_documents (decision 113): a packed self-attention call (one cu_seqlens tensor for
// queries and keys) runs as one dense call with a document mask. Checked as the varlen call it is,
// then as the dense call; the workspace holds the ids, then the dense call's lists (and the
// backward's Delta and reduction buffers).
TEST_CASE("attention API: variable-length self-attention as a document mask") {
  if (!masks_supported() || !varlen_supported(false)) {
    MESSAGE("SKIPPED: this build lacks library masks or varlen kernels");
    return;
  }
  Call c = packed_call();
  c.k = contiguous(kBase + 0x1000000, DType::bf16, {300, 2, 64});
  c.v = contiguous(kBase + 0x2000000, DType::bf16, {300, 2, 64});
  c.dk = contiguous(kBase + 0x7000000, DType::bf16, {300, 2, 64});
  c.dv = contiguous(kBase + 0x8000000, DType::bf16, {300, 2, 64});
  c.opts.cu_seqlens_k = c.opts.cu_seqlens_q;
  c.opts.max_seqlen_k = c.opts.max_seqlen_q;
  c.opts.varlen_documents = true;
  const Call docs = c;
  CHECK_NOTHROW(c.check_fwd());
  // the ids (300 x 4 B, rounded up to 256), then the lists of a [1, 300] document mask at the
  // forward's tiles: nothing else
  const size_t fwd = forward_workspace_bytes(c.q, c.k, c.opts);
  Options dense;
  dense.mask = Mask{kernels::MaskSpec{}, contiguous(kBase, DType::i32, {1, 300}), {}, {}};
  dense.mask->spec.kind = kernels::MaskKind::document;
  const size_t lists = forward_workspace_bytes(contiguous(kBase, DType::bf16, {1, 300, 8, 64}), contiguous(kBase, DType::bf16, {1, 300, 2, 64}), dense);
  CHECK(lists > 0);
  CHECK(fwd == 1280 + lists);
  c.opts.causal = true;
  CHECK(forward_workspace_bytes(c.q, c.k, c.opts) == fwd);  // (causal_document: the same lists)
  c.ws = Workspace{kBase + 0x9000000, fwd - 1};
  CHECK_THROWS_WITH_AS(check_forward(c.q, c.k, c.v, c.o, c.lse, c.opts, c.ws), doctest::Contains("options.varlen_documents needs"),
                       std::invalid_argument);
  if (backward_available()) {
    const size_t bwd = backward_workspace_bytes(c.q, c.opts);
    CHECK(bwd == backward_workspace_bytes(c.q, c.k, c.opts));
    CHECK(bwd > 1280 + 8 * 300 * 4);  // the ids, Delta and the dK/dV lists at least
    c.ws = Workspace{kBase + 0x9000000, bwd};
    CHECK_NOTHROW(c.check_bwd());
    c.opts.backward_phase = BackwardPhase::dkdv;
    c.ws = {};
    CHECK_BWD_ERROR(c, "options.backward_phase = dkdv without a workspace");
  }
  // what the option needs: one offsets tensor, as many keys as queries, no dropout or block mask
  c = docs;
  c.opts.cu_seqlens_k = contiguous(kBase + 0xb000000, DType::i32, {4});
  CHECK_FWD_ERROR(c, "options.varlen_documents = true needs options.cu_seqlens_q and cu_seqlens_k to be the same tensor");
  c = docs;
  c.opts.dropout_p = 0.1f;
  CHECK_FWD_ERROR(c, "options.varlen_documents = true with dropout_p = 0.1");
  c = docs;
  c.k = contiguous(kBase + 0x1000000, DType::bf16, {500, 2, 64});
  c.v = contiguous(kBase + 0x2000000, DType::bf16, {500, 2, 64});
  c.opts.max_seqlen_k = 250;
  CHECK_FWD_ERROR(c, "options.varlen_documents = true: k has 500 tokens but q has 300");
  c = docs;
  c.opts.varlen_documents = true;
  c.opts.cu_seqlens_q.reset(), c.opts.cu_seqlens_k.reset();
  c.opts.max_seqlen_q = c.opts.max_seqlen_k = 0;
  c.q = contiguous(kBase, DType::bf16, {1, 300, 8, 64});
  CHECK(error_of([&] { c.check_fwd(); }).find("options.varlen_documents = true without options.cu_seqlens_q / _k") != std::string::npos);
  if (!runtime::Driver::get().available()) {
    // both checks passed (the dense call's kernels bound at the ids' placeholder): the driver next
    c = docs;
    CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts), runtime::DeviceError);
    if (backward_available()) {
      c.opts.causal = true;
      CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts), runtime::DeviceError);
    }
  }
}

// forward/backward bind every kernel parameter and run the kernels' own launch checks (built
// tile IR, no compile) before they ask for the driver: without a GPU a valid call gets that far.
TEST_CASE("attention API: without a GPU a valid call stops at the driver, after the kernels' launch checks") {
  if (runtime::Driver::get().available()) {
    MESSAGE("SKIPPED: this machine has a GPU (the fake pointers here must not reach a launch)");
    return;
  }
  const auto needs_gpu = [](auto&& call, const char* what) {
    try {
      call();
      FAIL("ran without a GPU");
    } catch (const runtime::DeviceError& e) {
      INFO(std::string(e.what()));
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  for (bool causal : {false, true})
    for (DType t : {DType::bf16, DType::f16}) {
      Call c;
      for (Tensor* x : {&c.q, &c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv}) x->dtype = t;
      c.opts.causal = causal;
      needs_gpu([&] { forward(c.q, c.k, c.v, c.o, c.lse, c.opts); }, "tilejit::attention::forward needs a GPU");
      if (backward_available()) {
        needs_gpu([&] { backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts); },
                  "tilejit::attention::backward needs a GPU");
        c.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(c.q)};
        needs_gpu([&] { backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts, nullptr, c.ws); },
                  "tilejit::attention::backward needs a GPU");
      }
    }
  // options.persistent either way (the forward's grid: one program per tile, or resident programs)
  for (bool persistent : {false, true}) {
    Call c;
    for (Tensor* x : {&c.q, &c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv}) x->dtype = DType::bf16;
    c.opts.persistent = persistent;
    needs_gpu([&] { forward(c.q, c.k, c.v, c.o, c.lse, c.opts); }, "tilejit::attention::forward needs a GPU");
  }
  // D = 256 and [B, H, S, D] memory as permuted views.
  Call c = bhsd_call(256);
  needs_gpu([&] { forward(c.q, c.k, c.v, c.o, c.lse, c.opts); }, "needs a GPU");
  // An invalid argument is reported as such even without a GPU (the checks come first).
  c.q.dtype = DType::f32;
  CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts), std::invalid_argument);
}

// dK/dV reads LSE and Delta through TMA (LSE_IN_RING; with RING_PRODUCER for atomic D 128) only
// where they are 16-byte aligned; other calls take the kernel that exchanges them, and the launch's
// alignment checks pass either way.
TEST_CASE("attention API: lse alignment picks the dK/dV kernel the launch accepts") {
  if (runtime::Driver::get().available() || !backward_available()) {
    MESSAGE("SKIPPED: needs a machine without a GPU (fake pointers) and the backward kernels");
    return;
  }
  struct Case {
    const char* what;
    int64_t seq_q;
    uint64_t lse_offset;  // bytes past kBase + 0x4000000
    int64_t lse_row_stride;
  };
  for (const Case& cs : {Case{"aligned (S_q % 4 == 0)", 100, 0, 100}, Case{"S_q = 101", 101, 0, 101},
                         Case{"lse 4 bytes past 16-byte alignment", 100, 4, 100}, Case{"lse rows 101 apart", 100, 0, 101}})
    for (bool causal : {false, true})
      for (int64_t d : {64, 128})
        for (DqReduction reduction : {DqReduction::recompute, DqReduction::atomic}) {
          if (!dq_reduction_supported(reduction)) continue;
          INFO(cs.what << ", causal " << causal << ", D " << d << ", " << name(reduction));
          Call c;
          c.q = contiguous(kBase, DType::bf16, {2, cs.seq_q, 8, d});
          c.k = contiguous(kBase + 0x1000000, DType::bf16, {2, 300, 2, d});
          c.v = contiguous(kBase + 0x2000000, DType::bf16, {2, 300, 2, d});
          c.o = contiguous(kBase + 0x3000000, DType::bf16, {2, cs.seq_q, 8, d});
          c.lse = strided(kBase + 0x4000000 + cs.lse_offset, DType::f32, {2, 8, cs.seq_q}, {8 * cs.lse_row_stride, cs.lse_row_stride, 1});
          c.dout = contiguous(kBase + 0x5000000, DType::bf16, {2, cs.seq_q, 8, d});
          c.dq = contiguous(kBase + 0x6000000, DType::bf16, {2, cs.seq_q, 8, d});
          c.dk = contiguous(kBase + 0x7000000, DType::bf16, {2, 300, 2, d});
          c.dv = contiguous(kBase + 0x8000000, DType::bf16, {2, 300, 2, d});
          c.opts.causal = causal;
          c.opts.dq_reduction = reduction;
          try {
            backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts);
            FAIL("ran without a GPU");
          } catch (const runtime::DeviceError& e) {
            CHECK(std::string(e.what()).find("tilejit::attention::backward needs a GPU") != std::string::npos);
          }
        }
}

// The atomic dK/dV at D 128 takes a ring producer only at its default schedule: a caller's schedule
// with a launch bound of 2 programs an SM compiles (setmaxnreg needs the whole register file).
TEST_CASE("attention API: prepare at a caller's schedule with a register bound (atomic, D 128)") {
  if (!backward_available() || !dq_reduction_supported(DqReduction::atomic)) {
    MESSAGE("SKIPPED: the atomic backward kernels are not in this build");
    return;
  }
  const Schedule bounded{64, 128, 8, 2, 2};
  CHECK_NOTHROW(prepare(DType::bf16, 128, false, false, true, bounded, 0, false, DqReduction::atomic));
}

TEST_CASE("attention API: the schedule table covers every dtype, head dim and mask") {
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (Pass p : {Pass::forward, Pass::bwd_preprocess, Pass::bwd_dkdv, Pass::bwd_dq}) {
          const Schedule s = default_schedule(p, t, d, causal);
          CHECK(s.block_m >= 16);
          CHECK(s.block_n >= 16);
          CHECK(s.num_warps >= 1);
          CHECK(s.stages >= 1);
        }
  CHECK(std::string(name(Pass::bwd_dkdv)) == "attention_bwd_dkdv");
  // Varlen backward: the generic path's schedules (slices never take the wgmma path); the dense
  // ones are the Hopper-tuned table.
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      CHECK(default_schedule(Pass::bwd_dkdv, DType::bf16, d, causal, true) == Schedule{64, 64, 8, 2});
      CHECK(default_schedule(Pass::bwd_dq, DType::f16, d, causal, true) == Schedule{64, 64, 4, 2});
      CHECK(default_schedule(Pass::bwd_preprocess, DType::bf16, d, causal, true) == Schedule{64, 64, 4, 1});
    }
  CHECK(default_schedule(Pass::bwd_dkdv, DType::bf16, 128, false) == Schedule{64, 64, 4, 2});  // (measured: 64 x 128 on 8 warps was slower)
  // dQ at D 128 dense: 128 x 128 on 8 warps (085); D 64, dropout and library masks keep 64 x 64
  CHECK(default_schedule(Pass::bwd_dq, DType::bf16, 128, true) == Schedule{128, 128, 8, 2});
  CHECK(default_schedule(Pass::bwd_dq, DType::bf16, 64, false) == Schedule{64, 64, 4, 2});
  CHECK(default_schedule(Pass::bwd_dq, DType::bf16, 128, false, false, DqReduction::recompute, false, true) == Schedule{64, 64, 4, 2});
  // the forward with dropout: 64 x 128 on 4 warps at D 64 only
  CHECK(default_schedule(Pass::forward, DType::bf16, 64, false, false, DqReduction::recompute, true) == Schedule{64, 128, 4, 2});
  CHECK(default_schedule(Pass::forward, DType::bf16, 128, true, false, DqReduction::recompute, true) == Schedule{128, 128, 8, 2});
  // without dropout the D 64 forward is register-bound for two programs per SM (any mask)
  CHECK(default_schedule(Pass::forward, DType::bf16, 64, true, false, DqReduction::recompute, false) == Schedule{128, 128, 8, 2, 2});
  CHECK(default_schedule(Pass::forward, DType::bf16, 64, false, false, DqReduction::recompute, false, true) == Schedule{128, 128, 8, 2, 2});
  CHECK(default_schedule(Pass::forward, DType::bf16, 128, false, false, DqReduction::recompute, false) == Schedule{128, 128, 8, 2});
  // with dropout too (dK/dV builds its transposed mask from packed words: no more spills of ~600 B)
  for (int d : {64, 128}) {
    CHECK(default_schedule(Pass::bwd_dkdv, DType::bf16, d, false, false, DqReduction::recompute, true) == Schedule{64, 64, 4, 2});
    // (a library mask: no register bound either)
    CHECK(default_schedule(Pass::bwd_dkdv, DType::bf16, d, false, false, DqReduction::recompute, false, true) == Schedule{64, 64, 4, 2});
    // dQ with dropout: D 128 on 128 x 128 tiles as without it (decision 089), D 64 on 64 x 64
    const Schedule dq = d == 128 ? Schedule{128, 128, 8, 2} : Schedule{64, 64, 4, 2};
    CHECK(default_schedule(Pass::bwd_dq, DType::bf16, d, true, false, DqReduction::recompute, true) == dq);
  }
}

// Options::dq_reduction unset: the table default_reduction reads (decisions 100, 101, 104, 111). Atomic on
// the dQ writer where it measured > 5% faster than the fastest deterministic reduction, recompute or
// ordered with `deterministic` or where atomic has no writer.
TEST_CASE("attention API: the default dQ reduction per head dim, mask, length and determinism") {
  if (!backward_available() || !dq_reduction_supported(DqReduction::atomic) || !dq_reduction_supported(DqReduction::ordered) ||
      !masks_supported()) {
    MESSAGE("SKIPPED: this build lacks the backward, the atomic or ordered reduction, or library masks");
    return;
  }
  const auto pick = [](int64_t d, int64_t s, kernels::MaskKind mask, bool deterministic, bool dropout = false) {
    detail::Dims dims;
    dims.batch = 1, dims.heads_q = dims.heads_kv = 4, dims.seq_q = dims.seq_k = s, dims.head_dim = d;
    dims.causal = mask == kernels::MaskKind::causal;
    dims.mask = dims.causal ? kernels::MaskKind::full : mask;
    dims.row_vectors_aligned = s % 4 == 0;
    Options o;
    o.deterministic = deterministic;
    o.dropout_p = dropout ? 0.1f : 0.0f;
    return detail::default_reduction(dims, o);
  };
  using kernels::MaskKind;
  // dense D 128: atomic from S_q 1k; deterministic: recompute, ordered from 8k full / 16k causal
  CHECK(pick(128, 1024, MaskKind::full, false) == DqReduction::atomic);
  CHECK(pick(128, 512, MaskKind::full, false) == DqReduction::recompute);
  CHECK(pick(128, 4096, MaskKind::full, true) == DqReduction::recompute);
  CHECK(pick(128, 8192, MaskKind::full, true) == DqReduction::ordered);
  CHECK(pick(128, 8192, MaskKind::causal, true) == DqReduction::recompute);
  CHECK(pick(128, 16384, MaskKind::causal, true) == DqReduction::ordered);
  // dense D 64: atomic from S_q 4k
  CHECK(pick(64, 2048, MaskKind::full, false) == DqReduction::recompute);
  CHECK(pick(64, 4096, MaskKind::causal, false) == DqReduction::atomic);
  // library masks: atomic at D 128 from S_q 2k (104) and at D 64 from 4k but for global + window
  // (111); never ordered; dropout recompute
  CHECK(pick(64, 16384, MaskKind::global_sliding_window, false) == DqReduction::recompute);
  CHECK(pick(128, 16384, MaskKind::global_sliding_window, false) == DqReduction::atomic);
  for (const MaskKind m : {MaskKind::sliding_window, MaskKind::causal_document, MaskKind::prefix_lm, MaskKind::block_sparse}) {
    INFO(kernels::mask_kind_name(m));
    CHECK(pick(128, 2048, m, false) == DqReduction::atomic);
    CHECK(pick(128, 16384, m, false) == DqReduction::atomic);
    CHECK(pick(128, 1024, m, false) == DqReduction::recompute);
    CHECK(pick(128, 16384, m, true) == DqReduction::recompute);
    CHECK(pick(64, 16384, m, false) == DqReduction::atomic);
    CHECK(pick(64, 4096, m, false) == DqReduction::atomic);
    CHECK(pick(64, 2048, m, false) == DqReduction::recompute);
    CHECK(pick(64, 16384, m, true) == DqReduction::recompute);
    CHECK(pick(128, 16384, m, false, true) == DqReduction::recompute);
    CHECK(pick(128, 4098, m, false) == DqReduction::recompute);  // (LSE rows not 16-byte aligned: no writer)
  }
}

// Library masks (Options::mask): the kind, its integers (kernels::check_mask's rules), the
// tensors it reads (none it does not), combinations with causal and varlen, the workspace that
// holds the pre-pass's lists; a valid masked call reaches the driver after the launch checks of
// the pre-pass and of every kernel (all mask parameters and lists bound).
namespace {

using kernels::MaskKind;
using kernels::MaskSpec;

// The mask tensors of the Call shapes (B = 2, S_q = 100, S_k = 300, Hq = 8).
Tensor doc_ids(int64_t rows = 2) { return contiguous(kBase + 0xe000000, DType::i32, {rows, 300}); }
Tensor prefix_lengths() { return contiguous(kBase + 0xe100000, DType::i32, {2}); }
// block_q = 64, block_k = 128: cdiv(100, 64) = 2 query blocks, cdiv(300, 128) = 3 key blocks
Tensor block_table(int64_t batch = 1, int64_t heads = 8) { return contiguous(kBase + 0xe200000, DType::u8, {batch, heads, 2, 3}); }

// A valid mask of every kind for the Call shapes.
Mask valid_mask(MaskKind kind) {
  Mask m;
  switch (kind) {
    case MaskKind::sliding_window: m.spec = MaskSpec::sliding_window(10, 20); break;
    case MaskKind::causal_sliding_window: m.spec = MaskSpec::causal_sliding_window(64); break;
    case MaskKind::global_sliding_window: m.spec = MaskSpec::global_sliding_window(16, 32, 0); break;
    case MaskKind::prefix_lm: m.spec = MaskSpec::prefix_lm(), m.prefix_lengths = prefix_lengths(); break;
    case MaskKind::block_sparse: m.spec = MaskSpec::block_sparse(64, 128), m.block_table = block_table(); break;
    default:
      m.spec.kind = kind;
      if (kernels::mask_uses_doc_ids(kind)) m.doc_ids = doc_ids();
  }
  return m;
}

Call masked_call(MaskKind kind) {
  Call c;
  c.opts.mask = valid_mask(kind);
  return c;
}

}  // namespace

TEST_CASE("attention API: masks, valid calls and the workspace") {
  CHECK(masks_supported());
  for (int kind = 0; kind < kernels::kMaskKindCount; ++kind) {
    INFO("mask " << std::string(kernels::mask_kind_name(MaskKind(kind))));
    Call c = masked_call(MaskKind(kind));
    CHECK_NOTHROW(c.check_fwd());
    if (backward_available()) CHECK_NOTHROW(c.check_bwd());
    c.opts.dropout_p = 0.1;  // masks and dropout are independent
    CHECK_NOTHROW(c.check_fwd());
    if (backward_available()) CHECK_NOTHROW(c.check_bwd());
    // interval kinds need no lists: nothing for the forward, Delta alone for the backward
    if (kernels::mask_has_tile_intervals(MaskKind(kind))) {
      CHECK(forward_workspace_bytes(c.q, c.k, c.opts) == 0);
      CHECK(backward_workspace_bytes(c.q, c.opts) == 6400);
      // (and, full with dropout, the mask's words dK/dV stores for dQ: decision 097)
      const bool words = MaskKind(kind) == MaskKind::full;  // (causal: measured slower, off by default)
      CHECK(backward_workspace_bytes(c.q, c.k, c.opts) == 6400 + (words ? 64000 : 0));
    }
  }
  // causal (or full) through the mask is the causal (unmasked) path, varlen included
  Call c = masked_call(MaskKind::causal);
  c.opts.causal = true;
  CHECK_NOTHROW(c.check_fwd());
  Call v = packed_call();
  for (MaskKind kind : {MaskKind::full, MaskKind::causal}) {
    v.opts.mask = Mask{MaskSpec{kind}, {}, {}, {}};
    CHECK_NOTHROW(v.check_fwd());
    if (backward_available()) CHECK_NOTHROW(v.check_bwd());
  }
  // broadcast extents: one document row for the batch, one table for every head (or per batch)
  c = masked_call(MaskKind::document);
  c.opts.mask->doc_ids = doc_ids(1);
  CHECK_NOTHROW(c.check_fwd());
  c = masked_call(MaskKind::block_sparse);
  c.opts.mask->block_table = block_table(2, 1);
  CHECK_NOTHROW(c.check_fwd());
  // a zero row stride broadcasts too (no alignment rule broken)
  c = masked_call(MaskKind::causal_blockwise);
  c.opts.mask->doc_ids = strided(kBase + 0xe000000, DType::i32, {2, 300}, {0, 1});
  CHECK_NOTHROW(c.check_fwd());

  // Lists workspace (document ids [2, 300]: Bm = 2, Hm = 1). Forward at 128 x 128: nQB = 1,
  // nKB = 3; five arrays of 8, 24, 8, 24 and 6 bytes, each rounded up to 256.
  c = masked_call(MaskKind::document);
  CHECK(forward_workspace_bytes(c.q, c.k, c.opts) == 1280);
  // backward: Delta (2 * 8 * 100 * 4 = 6400), dK/dV's KV_MAJOR lists at 64 x 128 (3 x 2 blocks),
  // dQ's at 128 x 64 (1 x 5): 1280 each
  CHECK(backward_workspace_bytes(c.q, c.k, c.opts) == 6400 + 1280 + 1280);
  CHECK(error_of([&] { (void)backward_workspace_bytes(c.q, c.opts); })
            .find("tilejit::attention::backward_workspace_bytes: options.mask has kind document, whose block-mask lists depend on "
                  "S_k: call backward_workspace_bytes(q, k, opts)") != std::string::npos);
  // per-head tables: Bm = 1, Hm = 8; forward lists 8 * (4 + 12 + 4 + 12 + 3) bytes -> 5 x 256
  c = masked_call(MaskKind::block_sparse);
  CHECK(forward_workspace_bytes(c.q, c.k, c.opts) == 1280);
  // a long sequence: S_q = S_k = 4096, one document row, forward 128 x 128 tiles (32 x 32 blocks):
  // 4 * 32 (x2) + 4 * 32 * 32 (x2) + 32 * 32 bytes -> 256 + 4096 + 256 + 4096 + 1024
  {
    Call l;
    l.q = contiguous(kBase, DType::bf16, {1, 4096, 8, 64});
    l.k = contiguous(kBase + 0x1000000, DType::bf16, {1, 4096, 2, 64});
    l.opts.mask = Mask{MaskSpec::causal_document(), contiguous(kBase + 0xe000000, DType::i32, {1, 4096}), {}, {}};
    CHECK(forward_workspace_bytes(l.q, l.k, l.opts) == 256 + 4096 + 256 + 4096 + 1024);
    // the options' schedule sets every kernel's tiles: 64 x 64 gives 64 x 64 blocks
    l.opts.schedule = Schedule{64, 64, 4, 2};
    CHECK(forward_workspace_bytes(l.q, l.k, l.opts) == 256 + 16384 + 256 + 16384 + 4096);
    l.opts.schedule = Schedule{48, 64, 4, 2};
    CHECK(error_of([&] { (void)forward_workspace_bytes(l.q, l.k, l.opts); })
              .find("tilejit::attention::forward_workspace_bytes: options.schedule has block_m = 48") != std::string::npos);
    l.opts.schedule = Schedule{64, 64, 4, 2, 40};
    CHECK(error_of([&] { (void)forward_workspace_bytes(l.q, l.k, l.opts); })
              .find("options.schedule.min_programs_per_sm = 40; valid: 0 (no bound) to 32") != std::string::npos);
  }
  c = masked_call(MaskKind::document);
  c.ws = Workspace{kBase + 0x9000000, 1280};
  CHECK_NOTHROW(check_forward(c.q, c.k, c.v, c.o, c.lse, c.opts, c.ws));
  c.ws.bytes = 1279;
  CHECK(error_of([&] { check_forward(c.q, c.k, c.v, c.o, c.lse, c.opts, c.ws); })
            .find("tilejit::attention::forward: workspace has 1279 bytes; this call needs 1280 (forward_workspace_bytes)") !=
        std::string::npos);
  c.ws = Workspace{kBase + 0x9000004, 4096};
  CHECK(error_of([&] { check_forward(c.q, c.k, c.v, c.o, c.lse, c.opts, c.ws); })
            .find("workspace address 0x7f0009000004 is not a multiple of 16 bytes") != std::string::npos);
  if (backward_available()) {
    c.ws = Workspace{kBase + 0x9000000, 8960};
    CHECK_NOTHROW(c.check_bwd());
    c.ws.bytes = 6400;  // Delta alone
    CHECK_BWD_ERROR(c, "workspace has 6400 bytes; this call needs 8960 (backward_workspace_bytes)");
  }
  // The forward_workspace_bytes checks are the forward's: a bad mask is reported there as well.
  c = masked_call(MaskKind::document);
  c.opts.mask->doc_ids = doc_ids(3);
  CHECK(error_of([&] { (void)forward_workspace_bytes(c.q, c.k, c.opts); })
            .find("tilejit::attention::forward_workspace_bytes: options.mask.doc_ids has sizes [3,300]") != std::string::npos);
  CHECK(error_of([&] { (void)forward_workspace_bytes(c.q, contiguous(kBase, DType::bf16, {300, 2, 64}), c.opts); })
            .find("k must be rank 4") != std::string::npos);
}

// A block mask built once (block_mask_bytes, build_block_mask) and passed as options.block_mask:
// its size, the workspace the calls then need, and every mismatch a call refuses.
TEST_CASE("attention API: a block mask built once (options.block_mask)") {
  Call c = masked_call(MaskKind::document);  // S_q 100, S_k 300, doc ids [2, 300]: Bm = 2, Hm = 1
  // the forward's lists at 128 x 128, then dK/dV's and dQ's at 64 x 64: 1280 bytes each (five
  // arrays rounded up to 256)
  const size_t bytes = block_mask_bytes(c.q, c.k, c.opts);
  CHECK(bytes == 3 * 1280);
  CHECK(block_mask_bytes(c.q, c.k, masked_call(MaskKind::sliding_window).opts) == 0);  // intervals: nothing to build
  Options atomic = c.opts;
  atomic.dq_reduction = DqReduction::atomic;
  CHECK(block_mask_bytes(c.q, c.k, atomic) == 2 * 1280);  // no dQ kernel, no dQ lists
  // what build_block_mask returns for these options
  const BlockMask bm{Workspace{kBase + 0xa000000, bytes}, MaskKind::document, 100, 300, 2, 1, 0, {128, 128}, {64, 64}, {64, 64}};
  c.opts.block_mask = &bm;
  CHECK(forward_workspace_bytes(c.q, c.k, c.opts) == 0);     // no lists in the workspace
  CHECK(backward_workspace_bytes(c.q, c.k, c.opts) == 6400);  // Delta alone
  CHECK_NOTHROW(c.check_fwd());
  if (backward_available()) CHECK_NOTHROW(c.check_bwd());
  const auto refused = [&](BlockMask other, const std::string& what) {
    Call x = c;
    x.opts.block_mask = &other;
    CHECK(error_of([&] { x.check_fwd(); }).find(what) != std::string::npos);
  };
  BlockMask other = bm;
  other.kind = MaskKind::causal_document;
  refused(other, "tilejit::attention::forward: options.block_mask was built for mask causal_document, this call's mask is document");
  other = bm;
  other.seq_k = 200;
  refused(other, "options.block_mask was built for S_q = 100, S_k = 200; this call has S_q = 100, S_k = 300");
  other = bm;
  other.mask_batch = 1;
  refused(other, "options.block_mask was built for mask extents Bm = 1, Hm = 1; this call's mask data has Bm = 2, Hm = 1");
  other = bm;
  other.forward_tiles[1] = 64;
  refused(other, "options.block_mask holds the forward lists at 128x64 tiles, but this call's forward kernel runs at 128x128");
  other = bm;
  other.storage.bytes = 1279;  // the forward reads the first 1280
  refused(other, "options.block_mask.storage has 1279 bytes, its lists need 1280 (block_mask_bytes)");
  if (backward_available()) {
    Call x = c;
    other.storage.bytes = bytes - 1;
    x.opts.block_mask = &other;
    const std::string want = fmt::format("options.block_mask.storage has {} bytes, its lists need {} (block_mask_bytes)", bytes - 1, bytes);
    CHECK_BWD_ERROR(x, want.c_str());
    // built for split (no dQ lists): a forward takes it, a recompute backward does not
    other = bm;
    other.storage.bytes = 2 * 1280;
    other.dq_tiles[0] = other.dq_tiles[1] = 0;
    x.opts.block_mask = &other;
    CHECK_NOTHROW(x.check_fwd());
    CHECK_BWD_ERROR(x, "options.block_mask holds the dQ lists at 0x0 tiles, but this call's dQ kernel runs at 64x64");
    other = bm;
    other.dkdv_tiles[1] = 128;
    CHECK_NOTHROW(x.check_fwd());
    CHECK_BWD_ERROR(x, "options.block_mask holds the dK/dV lists at 64x128 tiles, but this call's dK/dV kernel runs at 64x64");
  }
  other = bm;
  other.storage = {};
  refused(other, "options.block_mask has no storage: make it with build_block_mask");
  if (backward_available()) {
    // dropout at D 64 runs the forward at 64 x 128 (and the backward at the same tiles): a block
    // mask built without it does not fit the forward
    Call x = c;
    x.opts.dropout_p = 0.1;
    CHECK(error_of([&] { x.check_fwd(); }).find("options.block_mask holds the forward lists at 128x128 tiles, but this call's forward "
                                                 "kernel runs at 64x128") != std::string::npos);
    CHECK_BWD_ERROR(x, "options.block_mask holds the forward lists at 128x128 tiles, but this call's forward kernel runs at 64x128");
    // calls at other tiles (a schedule for every kernel: here 64 x 128) do not fit; the backward
    // checks every list the block mask holds, the forward's included
    x.opts.schedule = Schedule{64, 128, 8, 2};
    CHECK_BWD_ERROR(x, "options.block_mask holds the forward lists at 128x128 tiles, but this call's forward kernel runs at 64x128 "
                       "(build it with the options of the calls");
  }
  // build_block_mask: its storage checked first, then a GPU needed
  Options plain = c.opts;
  plain.block_mask = nullptr;
  CHECK(error_of([&] { (void)build_block_mask(c.q, c.k, plain, Workspace{kBase + 0xa000000, 100}); })
            .find(fmt::format("tilejit::attention::build_block_mask: storage has 100 bytes at 0x7f000a000000; the lists need {} bytes",
                              bytes)) != std::string::npos);
  CHECK(error_of([&] { (void)build_block_mask(c.q, c.k, plain, Workspace{kBase + 0xa000004, bytes + 16}); })
            .find("storage address 0x7f000a000004 is not a multiple of 16 bytes") != std::string::npos);
  if (!runtime::Driver::get().available()) {
    CHECK_THROWS_AS((void)build_block_mask(c.q, c.k, plain, Workspace{kBase + 0xa000000, bytes}), runtime::DeviceError);
    CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts), runtime::DeviceError);  // after the launch checks
  }
  // a mask with intervals: an empty block mask, which the calls ignore
  Call w = masked_call(MaskKind::sliding_window);
  Options wo = w.opts;
  if (!runtime::Driver::get().available()) {
    const BlockMask none = build_block_mask(w.q, w.k, wo, {});
    CHECK(none.kind == MaskKind::sliding_window);
    w.opts.block_mask = &none;
    CHECK_NOTHROW(w.check_fwd());
  }
}

TEST_CASE("attention API: mask errors") {
  // the kind
  Call c;
  c.opts.mask = Mask{MaskSpec{static_cast<MaskKind>(11)}, {}, {}, {}};
  CHECK_FWD_ERROR(c, "options.mask.spec.kind = 11 is not a mask kind; valid: 0 full, 1 causal, 2 sliding_window", "10 block_sparse");
  c.opts.mask->spec.kind = static_cast<MaskKind>(-1);
  CHECK_FWD_ERROR(c, "options.mask.spec.kind = -1 is not a mask kind");
  if (backward_available()) CHECK_BWD_ERROR(c, "options.mask.spec.kind = -1 is not a mask kind");
  // with causal, with varlen
  c = masked_call(MaskKind::sliding_window);
  c.opts.causal = true;
  CHECK_FWD_ERROR(c, "options.mask has kind sliding_window and options.causal = true", "does not combine with causal",
                  "causal_sliding_window");
  if (backward_available()) CHECK_BWD_ERROR(c, "options.mask has kind sliding_window and options.causal = true");
  Call v = packed_call();
  v.opts.mask = valid_mask(MaskKind::causal_document);
  CHECK_FWD_ERROR(v, "options.mask has kind causal_document with variable-length batches (options.cu_seqlens_q/k)",
                  "dense batches only");
  if (backward_available()) CHECK_BWD_ERROR(v, "options.mask has kind causal_document with variable-length batches");
  // integers: kernels::check_mask's rules (0 <= window, G <= 2^29; block sizes >= 1)
  c = masked_call(MaskKind::sliding_window);
  c.opts.mask->spec.window_left = -1;
  CHECK_FWD_ERROR(c, "options.mask.spec: attention mask 'sliding_window': window_left = -1 is invalid", "(0 <= window_left <= 2^29)");
  c.opts.mask->spec.window_left = 0;
  c.opts.mask->spec.window_right = (int64_t{1} << 29) + 1;
  CHECK_FWD_ERROR(c, "window_right = 536870913 is invalid");
  c = masked_call(MaskKind::causal_sliding_window);
  c.opts.mask->spec.window_left = -5;
  CHECK_FWD_ERROR(c, "attention mask 'causal_sliding_window': window_left = -5 is invalid");
  c.opts.mask->spec.window_left = 5;
  c.opts.mask->spec.window_right = -5;  // not read by this kind: ignored
  CHECK_NOTHROW(c.check_fwd());
  c = masked_call(MaskKind::global_sliding_window);
  c.opts.mask->spec.global_tokens = -2;
  CHECK_FWD_ERROR(c, "attention mask 'global_sliding_window': global_tokens = -2 is invalid", "a token count");
  if (backward_available()) CHECK_BWD_ERROR(c, "global_tokens = -2 is invalid");
  c = masked_call(MaskKind::block_sparse);
  c.opts.mask->spec.block_q = 0;
  CHECK_FWD_ERROR(c, "attention mask 'block_sparse': block_q = 0 is invalid", "(1 <= block_q <= 2^29)");
  c.opts.mask->spec.block_q = 64;
  c.opts.mask->spec.block_k = -128;
  CHECK_FWD_ERROR(c, "block_k = -128 is invalid");
  // the tensors a kind reads, and no others
  c = masked_call(MaskKind::document);
  c.opts.mask->doc_ids.reset();
  CHECK_FWD_ERROR(c, "options.mask.doc_ids is not set; mask kind document needs it: i32 [B or 1, S_k]");
  c = masked_call(MaskKind::prefix_lm);
  c.opts.mask->prefix_lengths.reset();
  CHECK_FWD_ERROR(c, "options.mask.prefix_lengths is not set; mask kind prefix_lm needs it: i32 [B]");
  c = masked_call(MaskKind::block_sparse);
  c.opts.mask->block_table.reset();
  CHECK_FWD_ERROR(c, "options.mask.block_table is not set; mask kind block_sparse needs it: u8 [B or 1, Hq or 1, cdiv(S_q, block_q)");
  c = masked_call(MaskKind::sliding_window);
  c.opts.mask->doc_ids = doc_ids();
  CHECK_FWD_ERROR(c, "options.mask.doc_ids is set but mask kind sliding_window does not read it",
                  "(read by: document, causal_document, share_question, causal_blockwise)");
  c = masked_call(MaskKind::causal);
  c.opts.mask->block_table = block_table();
  CHECK_FWD_ERROR(c, "options.mask.block_table is set but mask kind causal does not read it (read by: block_sparse)");
  c = masked_call(MaskKind::document);
  c.opts.mask->prefix_lengths = prefix_lengths();
  CHECK_FWD_ERROR(c, "options.mask.prefix_lengths is set but mask kind document does not read it");
  // doc_ids: dtype, rank, sizes, pointer, device, strides, alignment
  c = masked_call(MaskKind::causal_document);
  c.opts.mask->doc_ids->dtype = DType::i64;
  CHECK_FWD_ERROR(c, "options.mask.doc_ids has dtype i64; it must be i32 [B or 1, S_k]");
  c.opts.mask->doc_ids = contiguous(kBase + 0xe000000, DType::i32, {600});
  CHECK_FWD_ERROR(c, "options.mask.doc_ids must be rank 2 [B or 1, S_k], got rank 1");
  c.opts.mask->doc_ids = contiguous(kBase + 0xe000000, DType::i32, {2, 299});
  CHECK_FWD_ERROR(c, "options.mask.doc_ids has sizes [2,299] but must be [B or 1, S_k] = [2 or 1,300] (a document id per key token)");
  c.opts.mask->doc_ids = doc_ids(3);
  CHECK_FWD_ERROR(c, "options.mask.doc_ids has sizes [3,300] but must be [B or 1, S_k] = [2 or 1,300]");
  if (backward_available()) CHECK_BWD_ERROR(c, "options.mask.doc_ids has sizes [3,300]");
  c.opts.mask->doc_ids = doc_ids();
  c.opts.mask->doc_ids->data = 0;
  CHECK_FWD_ERROR(c, "options.mask.doc_ids is a null pointer");
  c.opts.mask->doc_ids = doc_ids();
  c.opts.mask->doc_ids->device = 1;
  CHECK_FWD_ERROR(c, "options.mask.doc_ids is on device 1 but q is on device 0");
  c.opts.mask->doc_ids = strided(kBase + 0xe000000, DType::i32, {2, 300}, {600, 2});
  CHECK_FWD_ERROR(c, "options.mask.doc_ids has stride 2 on its last dim");
  c.opts.mask->doc_ids = doc_ids();
  c.opts.mask->doc_ids->data += 2;
  CHECK_FWD_ERROR(c, "options.mask.doc_ids's base address 0x7f000e000002 is not a multiple of 4 bytes");
  // prefix_lengths
  c = masked_call(MaskKind::prefix_lm);
  c.opts.mask->prefix_lengths = contiguous(kBase + 0xe100000, DType::i32, {3});
  CHECK_FWD_ERROR(c, "options.mask.prefix_lengths has sizes [3] but must be [B] = [2] (one prefix length per batch row)");
  c.opts.mask->prefix_lengths = contiguous(kBase + 0xe100000, DType::u32, {2});
  CHECK_FWD_ERROR(c, "options.mask.prefix_lengths has dtype u32; it must be i32 [B]");
  c.opts.mask->prefix_lengths = contiguous(kBase + 0xe100000, DType::i32, {2, 1});
  CHECK_FWD_ERROR(c, "options.mask.prefix_lengths must be rank 1 [B], got rank 2");
  // block_table: extents against the tiles its blocks cover
  c = masked_call(MaskKind::block_sparse);
  c.opts.mask->block_table = contiguous(kBase + 0xe200000, DType::u8, {1, 8, 2, 2});
  CHECK_FWD_ERROR(c, "options.mask.block_table has sizes [1,8,2,2] but must be [B or 1, Hq or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)] = "
                     "[2 or 1,8 or 1,2,3] (block_q = 64, block_k = 128, S_q = 100, S_k = 300)");
  c.opts.mask->block_table = block_table(1, 2);  // Hkv heads: the table is per query head
  CHECK_FWD_ERROR(c, "options.mask.block_table has sizes [1,2,2,3]");
  c.opts.mask->block_table = block_table(3, 8);
  CHECK_FWD_ERROR(c, "options.mask.block_table has sizes [3,8,2,3]");
  c.opts.mask->spec.block_q = 50;  // cdiv(100, 50) = 2, cdiv(300, 100) = 3: the same table fits other block sizes
  c.opts.mask->spec.block_k = 100;
  c.opts.mask->block_table = block_table();
  CHECK_NOTHROW(c.check_fwd());
  c.opts.mask->spec.block_q = 32;  // cdiv(100, 32) = 4
  CHECK_FWD_ERROR(c, "= [2 or 1,8 or 1,4,3] (block_q = 32, block_k = 100");
  c = masked_call(MaskKind::block_sparse);
  c.opts.mask->block_table->dtype = DType::i32;
  CHECK_FWD_ERROR(c, "options.mask.block_table has dtype i32; it must be u8");
  c = masked_call(MaskKind::block_sparse);
  c.opts.mask->block_table = strided(kBase + 0xe200000, DType::u8, {1, 8, 2, 3}, {96, 12, 6, 2});
  CHECK_FWD_ERROR(c, "options.mask.block_table has stride 2 on its last dim");
  if (backward_available()) CHECK_BWD_ERROR(c, "options.mask.block_table has stride 2 on its last dim");

  // prepare: the kind's range; library masks are dense only (nothing compiles before the checks)
  CHECK(error_of([] { prepare(DType::bf16, 64, static_cast<MaskKind>(12)); })
            .find("tilejit::attention::prepare: mask = 12 is not a mask kind; valid: 0 full") != std::string::npos);
  CHECK(error_of([] { prepare(DType::bf16, 64, MaskKind::document, /*varlen=*/true); })
            .find("tilejit::attention::prepare: mask document with varlen = true: library masks take dense batches only") !=
        std::string::npos);
  // prepare refuses what forward refuses, before compiling anything (issue 27: f32 and stages 0
  // compiled; D 96 failed deep in the lowering)
  CHECK(error_of([] { prepare(DType::f32, 64, false); }).find("tilejit::attention::prepare: dtype f32; supported: bf16, f16") !=
        std::string::npos);
  CHECK(error_of([] { prepare(DType::bf16, 96, false); })
            .find("tilejit::attention::prepare: head dim D = 96 is not supported; supported: 64, 128, 256") != std::string::npos);
  Schedule zero_stages;
  zero_stages.stages = 0;
  CHECK(error_of([&] { prepare(DType::bf16, 64, false, false, true, zero_stages); })
            .find("tilejit::attention::prepare: options.schedule.stages = 0; valid: 1 to 8") != std::string::npos);
}

// Without a GPU a valid masked call gets as far as the driver: the pre-pass (at the forward's,
// dK/dV's and dQ's tiles) and every kernel bound and checked, with and without a workspace.
TEST_CASE("attention API: masked calls stop at the driver without a GPU") {
  if (runtime::Driver::get().available()) {
    MESSAGE("SKIPPED: this machine has a GPU (the fake pointers here must not reach a launch)");
    return;
  }
  for (int kind = 0; kind < kernels::kMaskKindCount; ++kind)
    for (bool dropout : {false, true}) {
      INFO("mask " << std::string(kernels::mask_kind_name(MaskKind(kind))) << " dropout " << dropout);
      Call c = masked_call(MaskKind(kind));
      if (dropout) c.opts.dropout_p = 0.25;
      CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts), runtime::DeviceError);
      const Workspace fw{kBase + 0x9000000, forward_workspace_bytes(c.q, c.k, c.opts)};
      CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts, nullptr, fw), runtime::DeviceError);
      if (!backward_available()) continue;
      CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts), runtime::DeviceError);
      c.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(c.q, c.k, c.opts)};
      CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts, nullptr, c.ws), runtime::DeviceError);
    }
  // per-batch tables and [B, H, S, D] memory as permuted views, D = 128
  Call c = bhsd_call(128);
  c.opts.mask = valid_mask(MaskKind::block_sparse);
  c.opts.mask->block_table = block_table(2, 1);
  CHECK_THROWS_AS(forward(c.q, c.k, c.v, c.o, c.lse, c.opts), runtime::DeviceError);
  if (backward_available()) CHECK_THROWS_AS(backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts), runtime::DeviceError);
}

// Options::dq_reduction (recompute, atomic, split, ordered) and q_descending: the backward's
// checks (what the dK/dV kernel refuses, refused first), the workspace each needs, the schedule
// table, prepare's checks, and valid calls reaching the driver after every launch check (the
// dK/dV kernel with DQ_REDUCTION and its workspace tensors, the convert or reduce kernel).
namespace {

constexpr DqReduction kReductions[] = {DqReduction::recompute, DqReduction::atomic, DqReduction::split, DqReduction::ordered};

}  // namespace

TEST_CASE("attention API: dQ reductions, errors") {
  if (!backward_available()) return;
  CHECK(std::string(name(DqReduction::recompute)) == "recompute");
  CHECK(std::string(name(DqReduction::ordered)) == "ordered");
  CHECK(std::string(name(Pass::bwd_dq_convert)) == "attention_bwd_dq_convert");
  CHECK(std::string(name(Pass::bwd_dq_reduce)) == "attention_bwd_dq_reduce");
  CHECK(dq_reduction_supported(DqReduction::recompute));
  CHECK(dq_reduction_supported(DqReduction::atomic));
  CHECK(dq_reduction_supported(DqReduction::split));
  CHECK(dq_reduction_supported(DqReduction::ordered));
  CHECK_FALSE(dq_reduction_supported(static_cast<DqReduction>(4)));
  // the value
  Call c;
  c.opts.dq_reduction = static_cast<DqReduction>(7);
  CHECK_BWD_ERROR(c, "options.dq_reduction = 7 is not a dQ reduction; valid: 0 recompute, 1 atomic, 2 split, 3 ordered");
  CHECK_NOTHROW(c.check_fwd());  // the forward ignores the backward's options
  c.opts.dq_reduction = static_cast<DqReduction>(-1);
  CHECK(error_of([&] { (void)backward_workspace_bytes(c.q, c.opts); })
            .find("tilejit::attention::backward_workspace_bytes: options.dq_reduction = -1 is not a dQ reduction") != std::string::npos);
  // dense batches only
  for (DqReduction r : {DqReduction::atomic, DqReduction::split, DqReduction::ordered}) {
    Call v = packed_call();
    v.opts.dq_reduction = r;
    INFO(std::string(name(r)));
    const std::string want = fmt::format("options.dq_reduction = {} with variable-length batches (options.cu_seqlens_q/k); the atomic, "
                                         "split and ordered reductions take dense batches only", name(r));
    CHECK_BWD_ERROR(v, want.c_str(), "use recompute");
    CHECK_NOTHROW(v.check_fwd());
    if (r != DqReduction::split)
      CHECK(error_of([&] { (void)backward_workspace_bytes(v.q, v.opts); })
                .find("tilejit::attention::backward_workspace_bytes: options.dq_reduction = ") != std::string::npos);
  }
  // ordered: the full and causal masks only (causal through the mask is causal)
  for (MaskKind kind : {MaskKind::sliding_window, MaskKind::causal_sliding_window, MaskKind::document, MaskKind::block_sparse}) {
    c = masked_call(kind);
    c.opts.dq_reduction = DqReduction::ordered;
    const std::string want = fmt::format("options.dq_reduction = ordered with options.mask of kind {}; ordered takes the full and causal "
                                         "masks only", kernels::mask_kind_name(kind));
    CHECK_BWD_ERROR(c, want.c_str(), "use atomic or split with library masks");
    c.opts.dq_reduction = DqReduction::atomic;  // atomic and split take every mask
    CHECK_NOTHROW(c.check_bwd());
    c.opts.dq_reduction = DqReduction::split;
    CHECK_NOTHROW(c.check_bwd());
  }
  for (MaskKind kind : {MaskKind::full, MaskKind::causal}) {
    c = masked_call(kind);
    c.opts.dq_reduction = DqReduction::ordered;
    CHECK_NOTHROW(c.check_bwd());
  }
  // q_descending: not with split or library masks
  c = Call{};
  c.opts.causal = true;
  c.opts.q_descending = true;
  c.opts.dq_reduction = DqReduction::split;
  CHECK_BWD_ERROR(c, "options.q_descending = true with options.dq_reduction = split; the dK/dV kernel takes Q_DESCENDING with "
                     "recompute, atomic and ordered only");
  CHECK_NOTHROW(c.check_fwd());
  c = masked_call(MaskKind::sliding_window);
  c.opts.q_descending = true;
  c.opts.dq_reduction = DqReduction::atomic;
  CHECK_BWD_ERROR(c, "options.q_descending = true with options.mask of kind sliding_window; the descending walk is for the full and "
                     "causal masks only");
  for (DqReduction r : {DqReduction::recompute, DqReduction::atomic, DqReduction::ordered})
    for (bool causal : {false, true}) {
      c = Call{};
      c.opts.causal = causal;
      c.opts.q_descending = true;
      c.opts.dq_reduction = r;
      CHECK_NOTHROW(c.check_bwd());
    }
  // the workspace a reduction needs (a caller's, too small)
  c = Call{};
  c.opts.dq_reduction = DqReduction::atomic;
  c.ws = Workspace{kBase + 0x9000000, 6400};  // Delta alone
  CHECK_BWD_ERROR(c, "workspace has 6400 bytes; this call needs 416000 (backward_workspace_bytes)");
  c.ws.bytes = 416000;
  CHECK_NOTHROW(c.check_bwd());
  // split's dQ_parts depend on S_k
  c.opts.dq_reduction = DqReduction::split;
  CHECK(error_of([&] { (void)backward_workspace_bytes(c.q, c.opts); })
            .find("tilejit::attention::backward_workspace_bytes: options.dq_reduction = split, whose dQ_parts depend on S_k (N = "
                  "cdiv(S_k, BLOCK_N) key tiles): call backward_workspace_bytes(q, k, opts)") != std::string::npos);

  // prepare: the same rules under its argument names, before anything compiles
  const auto prepare_error = [](auto&& call) {
    const std::string msg = error_of(call);
    CHECK(msg.starts_with("tilejit::attention::prepare: "));
    return msg;
  };
  CHECK(prepare_error([] { prepare(DType::bf16, 64, false, false, true, {}, 0, false, static_cast<DqReduction>(9)); })
            .find("dq_reduction = 9 is not a dQ reduction; valid: 0 recompute, 1 atomic, 2 split, 3 ordered") != std::string::npos);
  CHECK(prepare_error([] { prepare(DType::bf16, 64, false, /*varlen=*/true, true, {}, 0, false, DqReduction::atomic); })
            .find("dq_reduction = atomic with varlen = true; the atomic, split and ordered reductions take dense batches only") !=
        std::string::npos);
  CHECK(prepare_error([] { prepare(DType::bf16, 64, MaskKind::document, false, true, {}, 0, false, DqReduction::ordered); })
            .find("dq_reduction = ordered with mask document; ordered takes the full and causal masks only") != std::string::npos);
  CHECK(prepare_error([] { prepare(DType::bf16, 128, true, false, true, {}, 0, false, DqReduction::split, true); })
            .find("q_descending = true with dq_reduction = split") != std::string::npos);
  CHECK(prepare_error([] { prepare(DType::bf16, 128, MaskKind::sliding_window, false, true, {}, 0, false, DqReduction::atomic, true); })
            .find("q_descending = true with mask sliding_window") != std::string::npos);
}

// Bytes: Delta (2 * 8 * 100 * 4 = 6400), then the reduction's buffers at dK/dV's tiles, 64 x 64
// with a reduction: M = cdiv(100, 64) = 2, N = cdiv(300, 64) = 5.
TEST_CASE("attention API: dQ reductions, workspace sizes and schedules") {
  if (!backward_available()) return;
  Call c;
  const auto bytes = [&](DqReduction r) {
    c.opts.dq_reduction = r;
    return backward_workspace_bytes(c.q, c.k, c.opts);
  };
  constexpr size_t delta = 6400, accum = 4 * 2 * 8 * 100 * 64, parts = 4 * 2 * 8 * 2 * 5 * 64 * 64;
  CHECK(bytes(DqReduction::recompute) == delta);
  CHECK(bytes(DqReduction::atomic) == delta + accum);                // 416000
  CHECK(bytes(DqReduction::ordered) == delta + accum + 256);         // semaphores 4 * 16 * 2 -> 256
  CHECK(bytes(DqReduction::split) == delta + parts);                 // 2627840
  for (DqReduction r : {DqReduction::recompute, DqReduction::atomic, DqReduction::ordered}) {
    c.opts.dq_reduction = r;
    CHECK(backward_workspace_bytes(c.q, c.opts) == backward_workspace_bytes(c.q, c.k, c.opts));  // no S_k in them
  }
  c.opts.causal = true;  // causal writes fewer parts, but the layout is the same
  CHECK(bytes(DqReduction::split) == delta + parts);
  // the options' schedule sets dK/dV's (and the reduce kernel's) tiles: 32 x 128 gives M = 4, N = 3
  c.opts.schedule = Schedule{32, 128, 4, 2};
  CHECK(bytes(DqReduction::split) == delta + 4 * 2 * 8 * 4 * 3 * 32 * 64);
  CHECK(bytes(DqReduction::ordered) == delta + accum + 256);  // 4 * 16 * 4 = 256
  // D = 128 at its default 64 x 128: N = 3 key tiles (BHSD views: the workspace does not depend on
  // q's strides)
  c = bhsd_call(128);
  CHECK(bytes(DqReduction::atomic) == delta + 2 * accum);
  CHECK(bytes(DqReduction::split) == delta + 4 * 2 * 8 * 2 * 3 * 64 * 128);
  // a list mask: dK/dV's lists at its tiles (64 x 64: 5 key tiles of 2 query tiles; five arrays of
  // 40, 80, 40, 80 and 20 bytes, 256 each), no dQ lists (no dQ kernel runs), then the buffers
  c = masked_call(MaskKind::document);
  CHECK(bytes(DqReduction::recompute) == delta + 1280 + 1280);
  CHECK(bytes(DqReduction::atomic) == delta + 1280 + accum);
  CHECK(bytes(DqReduction::split) == delta + 1280 + parts);
  // an interval mask: no lists
  c = masked_call(MaskKind::sliding_window);
  CHECK(bytes(DqReduction::split) == delta + parts);

  // The schedule table: dK/dV with a reduction at 64 x 64 on 4 warps (D 64; atomic 128 x 128 on 8)
  // or 64 x 128 on 8 (D 128: the dQ dot's warpgroups split D), the reduce kernel at dK/dV's tiles,
  // recompute unchanged
  for (DType t : {DType::bf16, DType::f16})
    for (bool causal : {false, true}) {
      for (int d : {64, 128}) {
        // (D 64 recompute: full 128 query rows a visit on one warpgroup (decision 083), causal
        // registers bounded for three programs an SM (022))
        const Schedule recompute = d == 128 ? Schedule{64, 64, 4, 2} : causal ? Schedule{64, 64, 4, 2, 3} : Schedule{128, 64, 4, 2};
        CHECK(default_schedule(Pass::bwd_dkdv, t, d, causal) == recompute);
        CHECK(default_schedule(Pass::bwd_dkdv, t, d, causal, false, DqReduction::recompute, true) == Schedule{64, 64, 4, 2});
        for (DqReduction r : {DqReduction::atomic, DqReduction::split, DqReduction::ordered}) {
          // (D 64 atomic: 128 x 128 on 8 warps, dS K split by rows: decision 101)
          const Schedule kv = d == 128                    ? Schedule{64, 128, 8, 2}
                              : r == DqReduction::atomic ? Schedule{128, 128, 8, 2}
                                                          : Schedule{64, 64, 4, 2};
          CHECK(default_schedule(Pass::bwd_dkdv, t, d, causal, false, r) == kv);
          CHECK(default_schedule(Pass::bwd_dq_reduce, t, d, causal, false, r) == Schedule{kv.block_m, kv.block_n, 4, 2});
          CHECK(default_schedule(Pass::bwd_dq_convert, t, d, causal, false, r) == Schedule{64, 64, 4, 2});
          CHECK(default_schedule(Pass::bwd_dq, t, d, causal, false, r) == default_schedule(Pass::bwd_dq, t, d, causal));
        }
      }
      // D 256: 8 warps hold dK/dV's two f32 [64, 256] accumulators without spilling (decision 093)
      CHECK(default_schedule(Pass::bwd_dkdv, t, 256, causal) == Schedule{32, 64, 8, 2});
      CHECK(default_schedule(Pass::bwd_dkdv, t, 256, causal, false, DqReduction::split) == Schedule{32, 64, 8, 2});
      CHECK(default_schedule(Pass::bwd_dq_reduce, t, 256, causal, false, DqReduction::split) == Schedule{32, 64, 4, 2});
      CHECK(default_schedule(Pass::bwd_dq_convert, t, 256, causal, false, DqReduction::atomic) == Schedule{32, 64, 4, 2});
    }
}

// Options::dq_reduction unset: the fastest reduction for the shape, deterministic unless a
// non-deterministic one measured more than 5% faster (decision 100): atomic on the dQ writer at D 128
// dense from S_q 1024, at D 64 from 4096 (101); with Options::deterministic the faster deterministic one (decision 075):
// ordered on the writer from S_q 8192 (full) / 16384 (causal), recompute elsewhere and wherever a
// call needs it; the workspace follows, and prepare's / bundle_specs' lists hold every reduction's
// kernels the default may pick.
TEST_CASE("attention API: the default dQ reduction: the fastest, or the fastest deterministic one") {
  if (!backward_available() || !dq_reduction_supported(DqReduction::ordered) || !dq_reduction_supported(DqReduction::atomic)) return;
  const auto q_of = [](int64_t S, int64_t D) { return contiguous(kBase, DType::bf16, {1, S, 4, D}); };
  const auto bytes = [&](int64_t S, int64_t D, const Options& o) { return backward_workspace_bytes(q_of(S, D), o); };
  const auto with = [&](int64_t S, int64_t D, Options o, DqReduction r) {
    o.dq_reduction = r;
    return bytes(S, D, o);
  };
  // (the three reductions' workspaces differ: recompute none, atomic dQ_accum, ordered also semaphores)
  CHECK(with(4096, 128, {}, DqReduction::recompute) < with(4096, 128, {}, DqReduction::atomic));
  CHECK(with(4096, 128, {}, DqReduction::atomic) < with(4096, 128, {}, DqReduction::ordered));
  for (bool causal : {false, true}) {
    Options fastest, det;
    fastest.causal = det.causal = causal;
    det.deterministic = true;
    CAPTURE(causal);
    // the default: atomic from S_q 1024 at D 128 dense
    CHECK(bytes(512, 128, fastest) == with(512, 128, fastest, DqReduction::recompute));
    for (int64_t S : {1024, 4096, 16384}) CHECK(bytes(S, 128, fastest) == with(S, 128, fastest, DqReduction::atomic));
    // D 64: atomic on the writer's 128 x 128 tiles from S_q 4096 (decision 101)
    CHECK(bytes(2048, 64, fastest) == with(2048, 64, fastest, DqReduction::recompute));
    for (int64_t S : {4096, 8192}) CHECK(bytes(S, 64, fastest) == with(S, 64, fastest, DqReduction::atomic));
    CHECK(bytes(8190, 128, fastest) == with(8190, 128, fastest, DqReduction::recompute));  // (S_q % 4: no LSE ring)
    // deterministic: ordered from S_q 8192 (full) / 16384 (causal), recompute below
    CHECK(bytes(4096, 128, det) == with(4096, 128, det, DqReduction::recompute));
    CHECK(bytes(8192, 128, det) == with(8192, 128, det, causal ? DqReduction::recompute : DqReduction::ordered));
    CHECK(bytes(16384, 128, det) == with(16384, 128, det, DqReduction::ordered));
    CHECK(bytes(8192, 64, det) == with(8192, 64, det, DqReduction::recompute));
    // an explicit reduction wins over `deterministic`
    CHECK(with(8192, 128, det, DqReduction::atomic) == with(8192, 128, fastest, DqReduction::atomic));
  }
  // calls that need recompute, or that the writer does not take
  const Options full;
  Options o = full;
  o.dropout_p = 0.1;
  CHECK(bytes(8192, 128, o) == with(8192, 128, o, DqReduction::recompute));
  o = full;
  o.accumulate_gradients = true;
  CHECK(bytes(8192, 128, o) == with(8192, 128, o, DqReduction::recompute));
  o = full;
  o.backward_phase = BackwardPhase::dkdv;
  CHECK(bytes(8192, 128, o) == with(8192, 128, o, DqReduction::recompute));
  o = full;
  o.schedule = Schedule{64, 64, 4, 2};
  CHECK(bytes(8192, 128, o) == with(8192, 128, o, DqReduction::recompute));
  o = full;
  o.q_descending = true;
  CHECK(bytes(8192, 128, o) == with(8192, 128, o, DqReduction::recompute));
  // prepare's list: every reduction's kernels at D 128 dense (they share the forward, the
  // preprocess kernel and, atomic and ordered, the convert kernel), recompute's and atomic's at D 64,
  // recompute's alone with dropout
  const auto names = [](int d, bool dropout, std::optional<DqReduction> r) {
    std::vector<std::string> n;
    for (const runtime::BundleEntrySpec& s : bundle_specs(DType::bf16, d, MaskKind::full, false, true, {}, dropout, r)) n.push_back(s.kernel);
    return n;
  };
  const auto has = [](const std::vector<std::string>& n, const char* k) { return std::find(n.begin(), n.end(), k) != n.end(); };
  const std::vector<std::string> d128 = names(128, false, std::nullopt);
  CHECK(has(d128, "attention_bwd_dq"));
  CHECK(has(d128, "attention_bwd_dq_convert"));
  CHECK(d128.size() == names(128, false, DqReduction::recompute).size() + names(128, false, DqReduction::ordered).size() +
                           names(128, false, DqReduction::atomic).size() - 5);
  // D 64: recompute's and atomic's (the convert kernel); with dropout recompute's alone
  const std::vector<std::string> d64 = names(64, false, std::nullopt);
  CHECK(has(d64, "attention_bwd_dq"));
  CHECK(has(d64, "attention_bwd_dq_convert"));
  CHECK_FALSE(has(names(64, true, std::nullopt), "attention_bwd_dq_convert"));
  CHECK_FALSE(has(names(128, true, std::nullopt), "attention_bwd_dq_convert"));
}

// The dropout backward's kernels as prepare compiles them (decisions 089, 090): dK/dV with TMA
// stores and descriptors at use, LSE and Delta ahead (the LSE ring at D 128 causal), dQ on 128 x 128
// tiles at D 128; reading the packed mask, the dK/dV kernel's own defaults do the same.
TEST_CASE("attention API: the dropout backward's kernels and metas") {
  if (!backward_available() || !dropout_supported()) {
    MESSAGE("SKIPPED: the backward or dropout kernels are not in this build");
    return;
  }
  const auto meta = [](const ir::Function& fn, const char* name) {
    const ir::MetaEntry* m = fn.find_meta(name);
    REQUIRE(m != nullptr);
    return m->value;
  };
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      INFO("D " << d << " causal " << causal);
      int seen = 0;
      for (const runtime::BundleEntrySpec& spec :
           bundle_specs(DType::bf16, d, causal ? MaskKind::causal : MaskKind::full, false, true, {}, true, DqReduction::recompute)) {
        const ir::Function fn = spec.build();
        if (spec.kernel == "attention_bwd_dkdv") {
          // (prepare also compiles the kernel for LSE rows that are not 16-byte aligned: no ring)
          const bool ring = std::get<bool>(meta(fn, "LSE_IN_RING"));
          CHECK(std::get<bool>(meta(fn, "DROPOUT")));
          CHECK(std::get<bool>(meta(fn, "TMA_STORE")));
          CHECK(std::get<bool>(meta(fn, "DESCRIPTORS_AT_USE")));
          CHECK(std::get<bool>(meta(fn, "ROWS_AHEAD")) == !ring);
          if (ring) CHECK((d == 128 && causal));
          ++seen;
        } else if (spec.kernel == "attention_bwd_dq") {
          CHECK(std::get<int64_t>(meta(fn, "BLOCK_M")) == (d == 128 ? 128 : 64));
          CHECK(std::get<int64_t>(meta(fn, "BLOCK_N")) == (d == 128 ? 128 : 64));
          ++seen;
        }
      }
      CHECK(seen >= 2);
      // reading the packed mask: the dK/dV kernel's own defaults (the API adds no ring for bits)
      const ir::Function bits = kernels::attention_backward_dkdv().build(
          {{"DTYPE", DType::bf16}, {"HEAD_DIM", int64_t{d}}, {"BSHD", true}, {"CAUSAL", causal}, {"BLOCK_M", int64_t{64}},
           {"BLOCK_N", int64_t{64}}, {"DROPOUT", true}, {"DROPOUT_BITS", true}});
      CHECK(std::get<bool>(meta(bits, "TMA_STORE")));
      CHECK(std::get<bool>(meta(bits, "DESCRIPTORS_AT_USE")));
      CHECK(std::get<bool>(meta(bits, "ROWS_AHEAD")));
      CHECK_FALSE(std::get<bool>(meta(bits, "LSE_IN_RING")));
    }
}

// Options::dropout_words_max_bytes (decision 097): with fused dropout dK/dV stores the mask's words in
// the workspace for dQ to read, where they fit the budget and the call allows it; the sizer with k
// counts them (after Delta), the one without k cannot; bundle_specs lists the pair; a call stops
// at the driver either way (its dry launches bind the words to both kernels).
TEST_CASE("attention API: the fused dropout backward's mask words in the workspace") {
  if (!backward_available() || !dropout_supported()) {
    MESSAGE("SKIPPED: the backward or dropout kernels are not in this build");
    return;
  }
  Call c;
  c.opts.dropout_p = 0.1;
  const size_t delta = 6400, words = 2 * 8 * 100 * 10 * 4;  // B * Hq * S_q * cdiv(300, 32) u32 (64000: a multiple of 256)
  CHECK(backward_workspace_bytes(c.q, c.opts) == delta);
  CHECK(backward_workspace_bytes(c.q, c.k, c.opts) == delta + words);
  const auto bytes_with = [&](auto&& change) {
    Call d = c;
    change(d.opts);
    return backward_workspace_bytes(d.q, d.k, d.opts);
  };
  CHECK(bytes_with([](Options& o) { o.causal = true; }) == delta);  // (the default: measured slower with the causal mask)
  CHECK(bytes_with([](Options& o) { o.causal = true, o.dropout_words_max_bytes = 64000; }) == delta + words);
  CHECK(bytes_with([](Options& o) { o.dropout_words_max_bytes = 64000; }) == delta + words);
  CHECK(bytes_with([](Options& o) { o.dropout_words_max_bytes = 63999; }) == delta);
  CHECK(bytes_with([](Options& o) { o.dropout_words_max_bytes = 0; }) == delta);
  CHECK(bytes_with([](Options& o) { o.dropout_p = 0; }) == delta);
  CHECK(bytes_with([](Options& o) { o.dropout_coordinates.heads = 8; }) == delta + words);  // (Hq: this call's own)
  CHECK(bytes_with([](Options& o) { o.dropout_coordinates.heads = 16; }) == delta);
  CHECK(bytes_with([](Options& o) { o.dropout_coordinates.row_offset = 100; }) == delta);
  CHECK(bytes_with([](Options& o) { o.dropout_coordinates.col_offset = 64; }) == delta);
  CHECK(bytes_with([](Options& o) { o.backward_phase = BackwardPhase::dkdv; }) == delta + words);  // (left for the dq phase)
  CHECK(bytes_with([](Options& o) { o.schedule = Schedule{64, 32, 4, 2}; }) == delta);  // dK/dV's BLOCK_N 32: half a Philox group
  CHECK(bytes_with([](Options& o) { o.schedule = Schedule{64, 64, 4, 2}; }) == delta + words);
  // the default where it measured faster: D 64 and D 128 without the causal mask
  for (bool causal : {false, true}) {
    Call h = bhsd_call(128);
    h.opts.dropout_p = 0.1;
    h.opts.causal = causal;
    CHECK(backward_workspace_bytes(h.q, h.k, h.opts) == delta + (causal ? 0 : words));
    h.opts.dropout_words_max_bytes = size_t{1} << 30;
    CHECK(backward_workspace_bytes(h.q, h.k, h.opts) == delta + words);
  }
  if (dq_reduction_supported(DqReduction::atomic)) {
    Call d = c;
    d.opts.dq_reduction = DqReduction::atomic;
    CHECK(backward_workspace_bytes(d.q, d.k, d.opts) == backward_workspace_bytes(d.q, d.opts));
  }
  // the pair prepare compiles beside the kernels that draw the mask twice
  const auto flag = [](const ir::Function& fn, const char* name) {
    const ir::MetaEntry* m = fn.find_meta(name);
    return m != nullptr && std::get<bool>(m->value);
  };
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      INFO("D " << d << " causal " << causal);
      int writers = 0, readers = 0, drawing = 0;
      for (const runtime::BundleEntrySpec& spec : bundle_specs(DType::bf16, d, causal ? MaskKind::causal : MaskKind::full, false, true, {}, true)) {
        const ir::Function fn = spec.build();
        if (spec.kernel == "attention_bwd_dkdv") writers += flag(fn, "DROPOUT_WRITE_BITS") ? 1 : 0;
        if (spec.kernel == "attention_bwd_dq") (flag(fn, "DROPOUT_BITS") ? readers : drawing) += 1;
      }
      CHECK(writers >= 1);
      CHECK(readers == 1);
      CHECK(drawing == 1);
    }
  if (runtime::Driver::get().available()) return;  // (the fake pointers below must not reach a launch)
  const auto stops_at_driver = [](Call& d, size_t ws_bytes) {
    d.ws = ws_bytes ? Workspace{kBase + 0x9000000, ws_bytes} : Workspace{};
    try {
      backward(d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.opts, nullptr, d.ws);
      FAIL("ran without a GPU");
    } catch (const runtime::DeviceError& e) {
      CHECK(std::string(e.what()).find("tilejit::attention::backward needs a GPU") != std::string::npos);
    }
  };
  for (bool causal : {false, true}) {
    Call d = c;
    d.opts.causal = causal;
    d.opts.dropout_words_max_bytes = size_t{1} << 30;  // (causal's default draws the mask twice)
    stops_at_driver(d, 0);
    stops_at_driver(d, delta + words);
    stops_at_driver(d, delta);  // (room for Delta only: dQ draws the mask again)
    CHECK(error_of([&] { stops_at_driver(d, delta - 256); }).find("workspace has 6144 bytes; this call needs 6400") != std::string::npos);
  }
}

// Without a GPU a valid call with each reduction gets as far as the driver: the dK/dV kernel with
// DQ_REDUCTION (and Q_DESCENDING) bound with dQ_accum / dQ_parts / dQ_semaphores, the convert or
// reduce kernel (the reduce kernel with a mask's parameters and dK/dV's block classes) checked.
TEST_CASE("attention API: dQ reductions stop at the driver without a GPU") {
  if (!backward_available()) return;
  if (runtime::Driver::get().available()) {
    MESSAGE("SKIPPED: this machine has a GPU (the fake pointers here must not reach a launch)");
    return;
  }
  const auto needs_gpu = [](Call& c) {
    try {
      backward(c.q, c.k, c.v, c.o, c.dout, c.lse, c.dq, c.dk, c.dv, c.opts, nullptr, c.ws);
      FAIL("ran without a GPU");
    } catch (const runtime::DeviceError& e) {
      INFO(std::string(e.what()));
      CHECK(std::string(e.what()).find("tilejit::attention::backward needs a GPU") != std::string::npos);
    }
  };
  for (DqReduction r : kReductions) {
    for (bool causal : {false, true})
      for (bool dropout : {false, true})
        for (bool descending : {false, true}) {
          if (descending && r == DqReduction::split) continue;
          INFO(std::string(name(r)) << " causal " << causal << " dropout " << dropout << " q_descending " << descending);
          Call c;
          c.opts.dq_reduction = r;
          c.opts.causal = causal;
          c.opts.q_descending = descending;
          if (dropout) c.opts.dropout_p = 0.2, c.opts.seed = 99;
          needs_gpu(c);  // the API's own workspace
          c.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(c.q, c.k, c.opts)};
          needs_gpu(c);
        }
    // D = 128, [B, H, S, D] memory as permuted views, a schedule of the caller's (BLOCK_M > BLOCK_N)
    Call c = bhsd_call(128);
    c.opts.dq_reduction = r;
    needs_gpu(c);
    c.opts.schedule = Schedule{128, 64, 8, 2};
    needs_gpu(c);
    // the precomputed dropout mask
    c = Call{};
    c.opts.dq_reduction = r;
    c.opts.dropout_p = 0.1;
    c.opts.dropout_bits = contiguous(kBase + 0xd000000, DType::u32, {16, 100, 10});
    needs_gpu(c);
  }
  // library masks with atomic and split (interval kinds, list kinds: the reduce kernel reads the
  // classes of dK/dV's pre-pass), with and without a workspace
  for (int kind = 0; kind < kernels::kMaskKindCount; ++kind)
    for (DqReduction r : {DqReduction::atomic, DqReduction::split}) {
      INFO("mask " << std::string(kernels::mask_kind_name(MaskKind(kind))) << " " << std::string(name(r)));
      Call c = masked_call(MaskKind(kind));
      c.opts.dq_reduction = r;
      needs_gpu(c);
      c.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(c.q, c.k, c.opts)};
      needs_gpu(c);
    }
}

// A valid backward call without a GPU: its checks and the kernels' launch checks pass, then it stops
// at the driver.
static void backward_stops_at_driver(const Call& x) {
  try {
    backward(x.q, x.k, x.v, x.o, x.dout, x.lse, x.dq, x.dk, x.dv, x.opts, nullptr, x.ws);
    FAIL("ran without a GPU");
  } catch (const runtime::DeviceError& e) {
    CHECK(std::string(e.what()).find("tilejit::attention::backward needs a GPU") != std::string::npos);
  }
}

// options.accumulate_gradients: dq, dk, dv are f32 sums (+=), recompute only; valid calls pass the
// checks and stop at the driver (the ACCUMULATE kernels' launch checks run dry first).
TEST_CASE("attention API: accumulate_gradients") {
  if (!backward_available()) return;
  Call c;
  c.opts.accumulate_gradients = true;
  CHECK_BWD_ERROR(c, "dq has dtype bf16; with options.accumulate_gradients the gradients are f32 sums (+=)");
  c.dq = contiguous(kBase + 0x6000000, DType::f32, {2, 100, 8, 64});
  CHECK_BWD_ERROR(c, "dk has dtype bf16; with options.accumulate_gradients");
  c.dk = contiguous(kBase + 0x7000000, DType::f32, {2, 300, 2, 64});
  c.dv = contiguous(kBase + 0x8000000, DType::f32, {2, 300, 2, 64});
  CHECK_NOTHROW(c.check_bwd());
  CHECK_NOTHROW(c.check_fwd());  // the forward ignores it
  Call wrong = c;
  wrong.dout = contiguous(kBase + 0x5000000, DType::f32, {2, 100, 8, 64});  // do stays q's dtype
  CHECK_BWD_ERROR(wrong, "do has dtype f32 but q has bf16");
  for (DqReduction r : {DqReduction::split, DqReduction::ordered}) {
    Call x = c;
    x.opts.dq_reduction = r;
    const std::string want = fmt::format("options.accumulate_gradients with options.dq_reduction = {}; the accumulating kernels add "
                                         "dQ in attention_bwd_dq (recompute) or attention_bwd_dq_convert (atomic) only", name(r));
    CHECK_BWD_ERROR(x, want.c_str());
  }
  if (dq_reduction_supported(DqReduction::atomic)) {  // (dK/dV add, the convert pass adds dQ)
    Call x = c;
    x.opts.dq_reduction = DqReduction::atomic;
    CHECK_NOTHROW(x.check_bwd());
  }
  if (runtime::Driver::get().available()) {
    MESSAGE("SKIPPED (the driver stop): this machine has a GPU");
    return;
  }
  for (bool causal : {false, true}) {
    Call x = c;
    x.opts.causal = causal;
    x.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(x.q, x.k, x.opts)};
    backward_stops_at_driver(x);
  }
}

// options.backward_phase: dK/dV and dQ in two calls sharing a workspace (recompute only, the
// caller's workspace); each phase passes the checks and stops at the driver, masks included.
TEST_CASE("attention API: backward phases") {
  if (!backward_available()) return;
  CHECK(std::string(name(BackwardPhase::dkdv)) == "dkdv");
  Call c;
  c.opts.backward_phase = BackwardPhase::dq;
  CHECK_BWD_ERROR(c, "options.backward_phase = dq without a workspace: the dq phase reads the Delta the dkdv phase left there");
  c.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(c.q, c.k, c.opts)};
  CHECK_NOTHROW(c.check_bwd());
  Call r = c;
  r.opts.dq_reduction = DqReduction::atomic;
  r.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(r.q, r.k, r.opts)};
  CHECK_BWD_ERROR(r, "options.backward_phase = dq with options.dq_reduction = atomic: split phases need recompute");
  // a gradient the phase leaves alone may be f32 (the dkdv phase adding into f32 sums, the dq phase
  // writing dQ, the same tensors passed to both), but not another dtype
  {
    Call x = c;
    x.dk = contiguous(kBase + 0x7000000, DType::f32, {2, 300, 2, 64});
    x.dv = contiguous(kBase + 0xc000000, DType::f32, {2, 300, 2, 64});
    CHECK_NOTHROW(x.check_bwd());  // dq phase, dq bf16, dk/dv f32 sums untouched
    x.opts.backward_phase = BackwardPhase::dkdv;
    CHECK_BWD_ERROR(x, "dk has dtype f32 but q has bf16");  // written, not accumulating
    x.opts.accumulate_gradients = true;
    CHECK_NOTHROW(x.check_bwd());  // dq untouched: bf16 is fine
    x.dq = contiguous(kBase + 0x6000000, DType::f16, {2, 100, 8, 64});
    CHECK_BWD_ERROR(x, "dq has dtype f16; options.backward_phase = dkdv leaves it alone, but it must be f32 or q's dtype bf16");
    x.opts.backward_phase = BackwardPhase::dq;
    CHECK_BWD_ERROR(x, "dq has dtype f16; with options.accumulate_gradients the gradients are f32 sums (+=)");
  }
  c.opts.backward_phase = static_cast<BackwardPhase>(5);
  CHECK_BWD_ERROR(c, "options.backward_phase = 5 is not a phase; valid: 0 all, 1 dkdv, 2 dq");
  if (runtime::Driver::get().available()) {
    MESSAGE("SKIPPED (the driver stop): this machine has a GPU");
    return;
  }
  for (int kind : {0, static_cast<int>(MaskKind::causal), static_cast<int>(MaskKind::document)})
    for (BackwardPhase phase : {BackwardPhase::dkdv, BackwardPhase::dq}) {
      INFO("mask " << kind << " phase " << name(phase));
      Call x = kind == 0 ? Call{} : masked_call(MaskKind(kind));
      x.opts.backward_phase = phase;
      x.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(x.q, x.k, x.opts)};
      backward_stops_at_driver(x);
    }
}

TEST_CASE("attention API: score mods, errors and calls that stop at the driver without a GPU") {
  using kernels::ScoreModKind;
  Call c;
  c.opts.score_mod.kind = ScoreModKind::alibi;
  CHECK_FWD_ERROR(c, "options.score_mod.kind = alibi needs options.score_mod.alibi_slopes (f32 [Hq] = [8])");
  c.opts.score_mod.alibi_slopes = contiguous(kBase + 0xc000000, DType::bf16, {8});
  CHECK_FWD_ERROR(c, "options.score_mod.alibi_slopes has dtype bf16; it must be f32");
  c.opts.score_mod.alibi_slopes = contiguous(kBase + 0xc000000, DType::f32, {2});
  CHECK_BWD_ERROR(c, "options.score_mod.alibi_slopes has sizes [2] but must be [Hq] = [8]");
  c.opts.score_mod.alibi_slopes = contiguous(kBase + 0xc000000, DType::f32, {8});
  CHECK_NOTHROW(c.check_fwd());
  c.opts.score_mod = {ScoreModKind::softcap, std::nullopt, 0.0f};
  CHECK_FWD_ERROR(c, "options.score_mod.softcap = 0; with kind softcap it must be finite and > 0");
  c.opts.score_mod.softcap = INFINITY;
  CHECK_BWD_ERROR(c, "options.score_mod.softcap = inf");
  c.opts.score_mod.softcap = 30.0f;
  CHECK_NOTHROW(c.check_fwd());
  c.opts.score_mod.kind = static_cast<ScoreModKind>(7);
  CHECK_FWD_ERROR(c, "options.score_mod.kind = 7 is not a score mod; valid: 0 none, 1 alibi, 2 softcap");
  if (runtime::Driver::get().available()) return;  // (the fake pointers must not reach a launch)
  // valid calls: the kernels' launch checks bind the mod's parameter, then the driver is missing
  for (ScoreModKind kind : {ScoreModKind::alibi, ScoreModKind::softcap}) {
    Call v;
    v.opts.score_mod = {kind, contiguous(kBase + 0xc000000, DType::f32, {8}), 30.0f};
    v.opts.causal = true;
    try {
      forward(v.q, v.k, v.v, v.o, v.lse, v.opts);
      FAIL("ran without a GPU");
    } catch (const runtime::DeviceError& e) {
      CHECK(std::string(e.what()).find("needs a GPU") != std::string::npos);
    }
    if (!backward_available()) continue;
    for (DqReduction r : {DqReduction::recompute, DqReduction::atomic}) {
      v.opts.dq_reduction = r;
      v.ws = Workspace{kBase + 0x9000000, backward_workspace_bytes(v.q, v.opts)};
      try {
        backward(v.q, v.k, v.v, v.o, v.dout, v.lse, v.dq, v.dk, v.dv, v.opts, nullptr, v.ws);
        FAIL("ran without a GPU");
      } catch (const runtime::DeviceError& e) {
        CHECK(std::string(e.what()).find("needs a GPU") != std::string::npos);
      }
    }
  }
}

// Issue 30 (decision 094): the mask's tiles over the GEMMs that carry them, from measured curves.
TEST_CASE("attention API: assign_mask_tiles gives each GEMM the tiles it hides best") {
  const auto error_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  // A hides 1,000 tiles for free, then 1 ms a 1,000; B costs 0.5 ms a 1,000 from its first tile
  const MaskHidingCurve a{{{1000, 0.0}, {4000, 3.0}}}, b{{{4000, 2.0}}};
  CHECK(mask_hiding_extra_ms(a, 0) == 0.0);
  CHECK(mask_hiding_extra_ms(a, 500) == doctest::Approx(0.0));
  CHECK(mask_hiding_extra_ms(a, 2500) == doctest::Approx(1.5));
  CHECK(mask_hiding_extra_ms(a, 5000) == doctest::Approx(4.0));  // past the last point: its slope
  CHECK(mask_hiding_extra_ms(b, 1000) == doctest::Approx(0.5));
  CHECK(assign_mask_tiles({a, b}, 2000, 100) == std::vector<int64_t>{1000, 1000});
  CHECK(assign_mask_tiles({a, b}, 800, 100) == std::vector<int64_t>{800, 0});
  CHECK(assign_mask_tiles({b, a}, 3000, 100) == std::vector<int64_t>{2000, 1000});
  // not convex: C costs 0.3 ms whatever it carries (its mask variant's own cost), D 0.1 ms a 1,000
  const MaskHidingCurve c{{{100, 0.3}, {10000, 0.3}}}, d{{{10000, 1.0}}};
  CHECK(assign_mask_tiles({c, d}, 2000, 100) == std::vector<int64_t>{0, 2000});
  CHECK(assign_mask_tiles({c, d}, 8000, 100) == std::vector<int64_t>{8000, 0});
  // counts are whole tiles summing to the mask, whatever the granule
  for (int64_t tiles : {1, 7, 1001, 65536, 131071}) {
    const std::vector<int64_t> got = assign_mask_tiles({a, b, c, d}, tiles);
    int64_t sum = 0;
    for (int64_t n : got) {
      CHECK(n >= 0);
      sum += n;
    }
    CHECK(sum == tiles);
  }
  CHECK(assign_mask_tiles({a}, 0) == std::vector<int64_t>{0});
  // bad input names the function, the argument and what is valid
  CHECK(error_of([] { assign_mask_tiles({}, 10); }).find("assign_mask_tiles: curves is empty") != std::string::npos);
  CHECK(error_of([&] { assign_mask_tiles({a, MaskHidingCurve{}}, 10); }).find("curves[1] has no points") != std::string::npos);
  CHECK(error_of([] { assign_mask_tiles({MaskHidingCurve{{{10, 0.1}, {10, 0.2}}}}, 10); })
            .find("curves[0].points[1] has tiles = 10; tiles must be > 0 and ascending") != std::string::npos);
  CHECK(error_of([] { assign_mask_tiles({MaskHidingCurve{{{10, std::nan("")}}}}, 10); }).find("must be finite") != std::string::npos);
  CHECK(error_of([&] { assign_mask_tiles({a}, -1); }).find("tiles = -1 is negative") != std::string::npos);
  CHECK(error_of([&] { assign_mask_tiles({a}, 10, -2); }).find("granule = -2 is negative") != std::string::npos);
  CHECK(error_of([&] { mask_hiding_extra_ms(a, -3); }).find("mask_hiding_extra_ms: tiles = -3") != std::string::npos);
}
