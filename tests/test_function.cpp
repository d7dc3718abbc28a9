// tilejit::Function without a GPU: every argument check (raised before anything is compiled or a
// GPU is touched), the ABI packing, and compile-on-first-use in compile-only mode.
#include "runtime/function.hpp"

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "dsl/lang.hpp"
#include "kernels/gemm.hpp"
#include "api/registry.hpp"
#include "runtime/argument_aliasing.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/interpreter.hpp"
#include "runtime/specialization.hpp"
#include "test_kernels.hpp"
#include "host_bits.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::DeviceArg;
using runtime::Grid;
using runtime::TensorView;

// GCC pairs the inlined operator new below with free() and warns; they do match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
// Counts the heap allocations of this thread while `counting` is set: checks must make none.
namespace {
thread_local bool counting = false;
long allocations = 0;
}  // namespace
void* operator new(std::size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// A tensor argument without device memory: the launcher's checks only read its description.
struct FakeTensor {
  std::vector<int64_t> sizes, strides;
  TensorView v;
  FakeTensor(DType t, std::vector<int64_t> sz, std::vector<int64_t> st, uint64_t address, int device = 0)
      : sizes(std::move(sz)), strides(std::move(st)), v{t, sizes, strides, address, device} {}
  FakeTensor(const FakeTensor&) = delete;
  operator const TensorView&() const { return v; }  // NOLINT
};

// Every parameter kind the launcher handles, and a body that uses the tensors.
Kernel checks = kernel("checks", [](Builder& k) {
  auto T = k.tensor("T", f32, 2, {.align_bytes = 16, .contiguous_last = true});
  auto P = k.pointer("P", f32, {.align_bytes = 16});
  k.scalar<int>("n");
  k.scalar<uint32_t>("u");
  auto s = k.scalar<float>("scale");
  k.scalar<bool>("flag");
  k.scalar<double>("d");
  store(P + arange(0, 16), sum(load(T.block({0, 0}, {16, 16})), 1) * s);
});

Kernel half_scalar = kernel("half_scalar", [](Builder& k) {
  auto P = k.pointer("P", f16);
  auto h = k.scalar("h", f16);
  store(P + arange(0, 16), full(f16, {16}, 0) + h);
});

// The message of the std::invalid_argument `fn` throws (fails the test when it throws nothing).
template <class Fn>
std::string invalid(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("no std::invalid_argument was thrown");
  return {};
}

using ::testing::contains;
// `msg` is evaluated once (a failing message must not re-run the call that produced it).
#define CHECK_HAS(msg, part)                                                                        \
  do {                                                                                              \
    const std::string check_has_message = (msg);                                                    \
    CHECK_MESSAGE(contains(check_has_message, part), "message: " << check_has_message << "\nexpected: " << part); \
  } while (0)

uint64_t total(const runtime::CompileCacheStats& s) { return s.memory_hits + s.disk_hits + s.compiles; }

}  // namespace

TEST_CASE("Function: well-formed arguments pass the checks, ints convert to float parameters") {
  Function f = tilejit::compile(checks);
  FakeTensor t(f32, {64, 32}, {32, 1}, 0x10000), p(f32, {100}, {1}, 0x20000);
  CHECK_NOTHROW(f.check({2, 3, 4}, t, p, 5, 7u, 1.5f, true, 0.25));
  CHECK_NOTHROW(f.check({1}, t, p, int64_t{-3}, uint64_t{7}, 3, false, 2));      // int for float is fine
  CHECK_NOTHROW(f.check({1}, t, p, short{5}, 0, 1.5, true, 1u));                    // any integer type
  FakeTensor rows(f32, {4, 8}, {64, 1}, 0x10000);                                    // padded rows (256 B pitch)
  FakeTensor t3(f32, {2, 2, 2}, {4, 2, 1}, 0x20000);                                 // a pointer takes any rank
  CHECK_NOTHROW(f.check({1}, rows, t3, 0, 0, 0.f, false, 0.));
  CHECK_FALSE(f.loaded());

  // Once the signature is built, checking (what every launch does) allocates nothing.
  runtime::LaunchPlan plan(f.signature());
  const DeviceArg args[] = {t.v, p.v, 5, 7u, 1.5f, true, 0.25};
  allocations = 0;
  counting = true;
  for (int i = 0; i < 100; ++i) {
    f.check({2, 3, 4}, t, p, 5, 7u, 1.5f, true, 0.25);
    plan.check({1}, args);
  }
  counting = false;
  CHECK(allocations == 0);
}

TEST_CASE("Function: argument count, kind, dtype, rank and device errors name the kernel, argument and value") {
  Function f = tilejit::compile(checks);
  FakeTensor t(f32, {64, 32}, {32, 1}, 0x10000), p(f32, {100}, {1}, 0x20000);

  std::string m = invalid([&] { f.check({1}, t, p); });
  CHECK_HAS(m, "kernel 'checks' takes 7 arguments (T, P, n, u, scale, flag, d), got 2");

  m = invalid([&] { f.check({1}, 3, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "tilejit: kernel 'checks', argument 0 'T': expected a device tensor of f32 (the parameter is tensor<f32,2>), got the integer 3");

  m = invalid([&] { f.check({1}, t, p, t, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 2 'n': expected a number of type i32, got the tensor f32[64,32] at 0x10000 on device 0");

  FakeTensor b(bf16, {64, 32}, {32, 1}, 0x10000);
  m = invalid([&] { f.check({1}, b, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': the tensor holds bf16 but the parameter is tensor<f32,2>");
  m = invalid([&] { f.check({1}, t, b, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 1 'P': the tensor holds bf16 but the parameter is ptr<f32>");

  FakeTensor r1(f32, {2048}, {1}, 0x10000);
  m = invalid([&] { f.check({1}, r1, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': expected a rank-2 tensor, got the tensor f32[2048]");

  FakeTensor other(f32, {64, 32}, {32, 1}, 0x10000, 1);
  m = invalid([&] { f.check({1}, other, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': the tensor f32[64,32] at 0x10000 on device 1 is on device 1 but the kernel runs on device 0");

  std::vector<int64_t> sz{4, 4}, st{4};
  TensorView ragged{f32, sz, st, 0x10000, 0};
  m = invalid([&] { f.check({1}, ragged, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "the tensor view has 2 sizes but 1 strides");
}

TEST_CASE("Function: contiguity, base alignment, row pitch and size errors say what is valid") {
  Function f = tilejit::compile(checks);
  FakeTensor p(f32, {100}, {1}, 0x20000);

  FakeTensor strided(f32, {64, 32}, {64, 2}, 0x10000);
  std::string m = invalid([&] { f.check({1}, strided, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': the innermost stride must be 1 (the parameter is declared contiguous), got 2");

  FakeTensor misaligned(f32, {64, 32}, {32, 1}, 0x10004);
  m = invalid([&] { f.check({1}, misaligned, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': base address 0x10004 is not a multiple of 16 bytes, the alignment the parameter requires");
  FakeTensor pmis(f32, {100}, {1}, 0x20008);
  m = invalid([&] { f.check({1}, FakeTensor(f32, {64, 32}, {32, 1}, 0x10000), pmis, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 1 'P': base address 0x20008 is not a multiple of 16 bytes");

  FakeTensor pitch(f32, {64, 33}, {33, 1}, 0x10000);
  m = invalid([&] { f.check({1}, pitch, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': stride 33 of dim 0 (132 bytes) is not a multiple of 16 bytes, the row alignment the parameter requires");

  FakeTensor huge(f32, {int64_t{1} << 31, 4}, {4, 1}, 0x10000);
  m = invalid([&] { f.check({1}, huge, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 0 'T': size 2147483648 of dim 0 is outside the i32 range of tensor sizes (valid: 0 to 2147483647)");
  FakeTensor negative(f32, {-1, 4}, {4, 1}, 0x10000);
  m = invalid([&] { f.check({1}, negative, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "size -1 of dim 0");
}

TEST_CASE("Function: scalar types and ranges") {
  Function f = tilejit::compile(checks);
  FakeTensor t(f32, {64, 32}, {32, 1}, 0x10000), p(f32, {100}, {1}, 0x20000);

  std::string m = invalid([&] { f.check({1}, t, p, int64_t{1} << 40, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 2 'n': the integer 1099511627776 does not fit the parameter's type i32 (valid: -2147483648 to 2147483647)");
  m = invalid([&] { f.check({1}, t, p, uint64_t{1} << 63, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 2 'n': the integer 9223372036854775808 does not fit the parameter's type i32");
  m = invalid([&] { f.check({1}, t, p, 5, -1, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 3 'u': the integer -1 does not fit the parameter's type u32 (valid: 0 to 4294967295)");
  m = invalid([&] { f.check({1}, t, p, 5, int64_t{1} << 32, 1.5f, true, 0.25); });
  CHECK_HAS(m, "(valid: 0 to 4294967295)");

  m = invalid([&] { f.check({1}, t, p, 2.5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 2 'n': expected an integer of type i32, got the float 2.5 (convert explicitly if truncation is meant)");
  m = invalid([&] { f.check({1}, t, p, true, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "argument 2 'n': expected a number of type i32, got the bool true (bool is accepted only for i1 parameters)");
  m = invalid([&] { f.check({1}, t, p, 5, 7u, 1.5f, 1, 0.25); });
  CHECK_HAS(m, "argument 5 'flag': expected a bool (the parameter is i1), got the integer 1");
  m = invalid([&] { f.check({1}, t, p, 5, 7u, false, true, 0.25); });
  CHECK_HAS(m, "argument 4 'scale': expected a number of type f32, got the bool false");
  m = invalid([&] { f.check({1}, t, p, 5, 7u, 1e300, true, 0.25); });
  CHECK_HAS(m, "argument 4 'scale': the float 1e+300 does not fit the parameter's type f32 (valid: finite values of magnitude up to");
  CHECK_NOTHROW(f.check({1}, t, p, 5, 7u, INFINITY, true, 0.25));  // infinities and NaN pass through
  CHECK_NOTHROW(f.check({1}, t, p, 5, 7u, 1.5f, true, 1e300));     // f64 holds it

  Function h = tilejit::compile(half_scalar);
  FakeTensor ph(f16, {16}, {1}, 0x10000);
  m = invalid([&] { h.check({1}, ph, 1.0); });
  CHECK_HAS(m, "kernel 'half_scalar', argument 1 'h': f16 scalars are not supported by the GPU launcher yet");
}

TEST_CASE("Function: a kernel's size relations (the GEMM's K, M and N) are checked at launch and in the interpreter") {
  // Before (issue 27): A [256,128] with B^T [64,256] ran and read the missing K as zeros.
  Function f = tilejit::compile(kernels::gemm(), {{"B_KMAJOR", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}});
  FakeTensor a(bf16, {256, 128}, {128, 1}, 0x10000), b_ok(bf16, {64, 128}, {128, 1}, 0x20000), c(f32, {256, 64}, {64, 1}, 0x30000);
  CHECK_NOTHROW(f.check({4, 1}, a, b_ok, c));
  FakeTensor b_bad(bf16, {64, 256}, {256, 1}, 0x20000);
  const std::string k = invalid([&] { f.check({4, 1}, a, b_bad, c); });
  CHECK_HAS(k, "kernel 'gemm': argument 1 'B' has size 256 in dim 1 but argument 0 'A' has size 128 in dim 1");
  CHECK_HAS(k, "the kernel requires them equal (A's K and B's K)");
  FakeTensor c_bad(f32, {200, 64}, {64, 1}, 0x30000);
  CHECK_HAS(invalid([&] { f.check({4, 1}, a, b_ok, c_bad); }), "(C's rows and A's M)");
  FakeTensor c_bad_n(f32, {256, 48}, {48, 1}, 0x30000);
  CHECK_HAS(invalid([&] { f.check({4, 1}, a, b_ok, c_bad_n); }), "(C's columns and B's N)");

  // the interpreter refuses the same arguments with the same words
  const ir::Function fn = kernels::gemm().build({{"B_KMAJOR", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}});
  runtime::HostTensor ha(bf16, {64, 32}), hb(bf16, {64, 64}), hc(f32, {64, 64});
  ha.fill_uniform(1, -1, 1);
  hb.fill_uniform(2, -1, 1);
  try {
    runtime::interpret(fn, {1, 1}, {runtime::Arg(ha), runtime::Arg(hb), runtime::Arg(hc)});
    FAIL("the interpreter ran a GEMM whose A has K 32 and B has K 64");
  } catch (const runtime::InterpretError& e) {
    CHECK_HAS(std::string(e.what()), "argument 1 'B' has size 64 in dim 1 but argument 0 'A' has size 32 in dim 1");
  }
}

TEST_CASE("Function: null bases and stride-0 dims of stored tensors are errors (issue 27)") {
  Function f = tilejit::compile(checks);
  FakeTensor t(f32, {64, 32}, {32, 1}, 0x10000), p(f32, {100}, {1}, 0x20000);
  FakeTensor null_t(f32, {64, 32}, {32, 1}, 0), null_p(f32, {100}, {1}, 0), empty_null(f32, {0, 32}, {32, 1}, 0);
  CHECK_HAS(invalid([&] { f.check({1}, null_t, p, 5, 7u, 1.5f, true, 0.25); }), "argument 0 'T': the base address is null");
  CHECK_HAS(invalid([&] { f.check({1}, t, null_p, 5, 7u, 1.5f, true, 0.25); }), "argument 1 'P': the base address is null");
  CHECK_NOTHROW(f.check({1}, empty_null, p, 5, 7u, 1.5f, true, 0.25));  // nothing to read: any address
  // C of the GEMM is stored through windows: a broadcast (stride-0) C would race; A read with a
  // stride-0 dim is fine
  Function g = tilejit::compile(kernels::gemm(), {{"B_KMAJOR", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}});
  FakeTensor a(bf16, {256, 128}, {128, 1}, 0x10000), b(bf16, {64, 128}, {128, 1}, 0x20000);
  FakeTensor c_bcast(f32, {256, 64}, {0, 1}, 0x30000), a_bcast(bf16, {256, 128}, {0, 1}, 0x10000), c(f32, {256, 64}, {64, 1}, 0x30000);
  CHECK_HAS(invalid([&] { g.check({4, 1}, a, b, c_bcast); }), "argument 2 'C': stride 0 in dim 0 of size 256");
  CHECK_NOTHROW(g.check({4, 1}, a_bcast, b, c));
}

TEST_CASE("Function: an output overlapping another argument is an error; the same view is in place (issue 27)") {
  Function f = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 128}});
  // 1000 floats each: X at 0x10000, Y at 0x20000, Out at 0x30000
  FakeTensor x(f32, {1000}, {1}, 0x10000), y(f32, {1000}, {1}, 0x20000), out(f32, {1000}, {1}, 0x30000);
  CHECK_NOTHROW(f.check({8}, x, y, out, 1000));
  CHECK_NOTHROW(f.check({8}, x, y, x, 1000));  // Out = X + Y in place: the same view
  CHECK_NOTHROW(f.check({8}, x, x, out, 1000));  // two inputs may share memory
  // Out shifted by four elements into X: program 0 writes what program 0 reads four elements later
  FakeTensor shifted(f32, {1000}, {1}, 0x10010);
  const std::string m = invalid([&] { f.check({8}, x, y, shifted, 1000); });
  CHECK_HAS(m, "argument 2 'Out': the kernel writes f32[1000] at 0x10010 on device 0, whose memory overlaps argument 0 'X'");
  CHECK_HAS(m, "which the kernel reads");
  CHECK_HAS(m, "exactly the same view, for an in-place update");
  // the same address but another view (a reshape) is not the in-place case either
  FakeTensor two_rows(f32, {2, 500}, {500, 1}, 0x10000);
  CHECK_HAS(invalid([&] { f.check({8}, x, y, two_rows, 1000); }), "overlaps argument 0 'X'");
  // element granularity, with a kernel that asks no alignment: Out = 2 X
  const Kernel twice = kernel("twice", [](Builder& k) {
    auto X = k.pointer("X", f32), Out = k.pointer("Out", f32);
    auto offs = arange(0, 128);
    store(Out + offs, load(X + offs) * 2.0f);
  });
  Function t = tilejit::compile(twice);
  FakeTensor x128(f32, {128}, {1}, 0x10000), next_to_x(f32, {128}, {1}, 0x10000 + 128 * 4);
  FakeTensor one_in(f32, {128}, {1}, 0x10000 + 127 * 4);
  CHECK_NOTHROW(t.check({1}, x128, next_to_x));
  CHECK_HAS(invalid([&] { t.check({1}, x128, one_in); }), "overlaps argument 0 'X'");
  // interleaved views (the real and the imaginary parts of complex data) do not overlap
  FakeTensor re(f32, {128}, {2}, 0x40000), im(f32, {128}, {2}, 0x40004);
  CHECK_NOTHROW(t.check({1}, re, im));
  FakeTensor re_shifted(f32, {128}, {2}, 0x40008);  // the real parts shifted by one complex number
  CHECK_HAS(invalid([&] { t.check({1}, re, re_shifted); }), "overlaps argument 0 'X'");
  // negative strides: the extent runs below the base address
  FakeTensor reversed(f32, {128}, {-1}, 0x20000 + 127 * 4), reversed_x(f32, {128}, {-1}, 0x10000 + 127 * 4);
  CHECK_NOTHROW(t.check({1}, x128, reversed));
  CHECK_HAS(invalid([&] { t.check({1}, x128, reversed_x); }), "overlaps argument 0 'X'");
  // empty views overlap nothing
  FakeTensor empty(f32, {0}, {1}, 0x10000);
  CHECK_NOTHROW(f.check({8}, x, y, empty, 0));

  // atomics write too; two outputs of one kernel must not share memory
  Function a = tilejit::compile(test_kernels::atomics);
  FakeTensor ax(f32, {64}, {1}, 0x10000), acc(f32, {64}, {1}, 0x20000), cnt(i32, {4}, {1}, 0x30000);
  FakeTensor cnt_in_acc(i32, {4}, {1}, 0x20000 + 60 * 4);
  CHECK_NOTHROW(a.check({1}, ax, acc, cnt));
  CHECK_HAS(invalid([&] { a.check({1}, ax, acc, cnt_in_acc); }), "argument 2 'Cnt' (i32[4] at 0x200f0 on device 0, which the kernel also writes)");
  CHECK_NOTHROW(a.check({1}, acc, acc, cnt));  // Acc += Acc read first: the in-place case

  // tensors written through windows, with the GEMM: C inside A
  Function g = tilejit::compile(kernels::gemm(), {{"B_KMAJOR", true}, {"BLOCK_M", 64}, {"BLOCK_N", 64}, {"BLOCK_K", 32}});
  FakeTensor ga(bf16, {256, 128}, {128, 1}, 0x100000), gb(bf16, {64, 128}, {128, 1}, 0x200000);
  FakeTensor c_in_a(f32, {256, 64}, {64, 1}, 0x100000 + 128 * 2 * 64);
  CHECK_HAS(invalid([&] { g.check({4, 1}, ga, gb, c_in_a); }), "argument 2 'C': the kernel writes f32[256,64]");
}

TEST_CASE("written_params follows pointers through arithmetic, loops and branches") {
  const Kernel k = kernel("flows", [](Builder& b) {
    auto A = b.pointer("A", f32), B = b.pointer("B", f32), C = b.pointer("C", f32);
    auto T = b.tensor("T", f32, 2), U = b.tensor("U", f32, 2);
    auto n = b.scalar<int>("n");
    auto offs = arange(0, 16);
    auto x = load(A + offs);
    // C is written through a pointer carried by a loop and reassigned in a branch
    Var p = C;
    for_range(0, n, [&](Tile) { p = p + 16; });
    if_(n > 4, [&] { p = p + 1; });
    store(p + offs, x);
    // U through a slice; T only read
    auto tile = load(T.block({0, 0}, {16, 16}));
    store(U.slice(0, program_id(0), 16).block({0, 0}, {16, 16}), tile);
    (void)B;
  });
  const std::vector<bool> w = runtime::written_params(k.build());
  CHECK(w == std::vector<bool>{false, false, true, false, true, false});
}

TEST_CASE("same_size: only tensor parameters and dims they have") {
  auto build = [](int dim) {
    return kernel("rel", [dim](Builder& k) {
      auto A = k.tensor("A", f32, 2);
      auto B = k.tensor("B", f32, 2);
      k.same_size(A, dim, B, 0);
      store(B.ptr() + arange(0, 16), load(A.ptr() + arange(0, 16)));
    }).build();
  };
  CHECK(build(1).size_relations.size() == 1);
  CHECK_THROWS_WITH(build(2), doctest::Contains("same_size: dim 2 of tensor 'A' (valid: 0 to 1)"));
  CHECK_THROWS_WITH(kernel("rel2", [](Builder& k) {
                      auto A = k.tensor("A", f32, 2);
                      auto B = k.tensor("B", f32, 2);
                      k.same_size(A.slice(0, 0, 4), 0, B, 0);
                      store(B.ptr() + arange(0, 16), load(A.ptr() + arange(0, 16)));
                    }).build(),
                    doctest::Contains("same_size: the first tensor is not a tensor parameter"));
}

TEST_CASE("Function: grid dimensions") {
  Function f = tilejit::compile(checks);
  FakeTensor t(f32, {64, 32}, {32, 1}, 0x10000), p(f32, {100}, {1}, 0x20000);
  std::string m = invalid([&] { f.check({0}, t, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "kernel 'checks': grid (0,1,1) is invalid: x must be in [1, 2147483647], y and z in [1, 65535]");
  m = invalid([&] { f.check({1, 65536}, t, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "grid (1,65536,1) is invalid");
  m = invalid([&] { f.check({1, 1, -2}, t, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "grid (1,1,-2) is invalid");
  m = invalid([&] { f.check({int64_t{1} << 31}, t, p, 5, 7u, 1.5f, true, 0.25); });
  CHECK_HAS(m, "grid (2147483648,1,1) is invalid");
  CHECK_NOTHROW(f.check({(int64_t{1} << 31) - 1, 65535, 65535}, t, p, 5, 7u, 1.5f, true, 0.25));
}

TEST_CASE("LaunchPlan: ABI slots of tensors (ptr, i32 sizes, i64 strides), pointers and scalars") {
  Function f = tilejit::compile(checks);
  runtime::LaunchPlan plan(f.signature());
  REQUIRE(plan.num_slots() == 1 + 4 + 1 + 5);
  FakeTensor t(f32, {64, 32}, {48, 1}, 0x10000), p(f32, {100}, {1}, 0x20000);
  const DeviceArg args[] = {t.v, p.v, -5, 4000000000u, 1.5f, true, -0.25};
  uint64_t slots[runtime::LaunchPlan::kMaxSlots];
  std::memset(slots, 0, sizeof slots);
  plan.pack({1}, args, slots);
  CHECK(slots[0] == 0x10000);
  CHECK(static_cast<uint32_t>(slots[1]) == 64);
  CHECK(static_cast<uint32_t>(slots[2]) == 32);
  CHECK(static_cast<int64_t>(slots[3]) == 48);
  CHECK(static_cast<int64_t>(slots[4]) == 1);
  CHECK(slots[5] == 0x20000);
  CHECK(static_cast<int32_t>(static_cast<uint32_t>(slots[6])) == -5);
  CHECK(static_cast<uint32_t>(slots[7]) == 4000000000u);
  float s;
  auto bits = static_cast<uint32_t>(slots[8]);
  std::memcpy(&s, &bits, 4);
  CHECK(s == 1.5f);
  CHECK((slots[9] & 0xFF) == 1);
  double d;
  std::memcpy(&d, &slots[10], 8);
  CHECK(d == -0.25);
}

TEST_CASE("LaunchPlan: the compiled ABI must be the flattening of the signature") {
  jit::CompileOptions ptx;
  ptx.make_cubin = false;
  Function add = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 256}}, ptx);
  Function other = tilejit::compile(checks, {}, ptx);
  runtime::LaunchPlan plan(add.signature());
  CHECK_NOTHROW(plan.check_abi(add.compiled()));
  CHECK_THROWS_AS(plan.check_abi(other.compiled()), std::logic_error);
}

TEST_CASE("Function: tensors read through TMA are checked for the layout TMA needs once compiled") {
  const library::LibraryKernel* lk = library::find("gemm");
  REQUIRE(lk);
  jit::CompileOptions o;
  o.num_warps = lk->num_warps;
  o.pipeline.stages = lk->stages;
  o.make_cubin = false;  // the descriptors are planned before PTX; no assembler needed
  Function f = tilejit::compile(kernels::gemm(), lk->default_meta, o);
  // B is K-major (B^T[N,K]); rows of A overlap: 8 elements apart, 64 long. The signature alone
  // (ALIGN 16, contiguous rows) accepts that; TMA does not.
  FakeTensor a(bf16, {256, 64}, {8, 1}, 0x100000), b(bf16, {256, 64}, {64, 1}, 0x200000), c(f32, {256, 256}, {256, 1}, 0x300000);
  Grid grid{2};
  CHECK_NOTHROW(f.check(grid, a, b, c));
  REQUIRE(f.compiled().tensor_maps.size() == 2);
  std::string m = invalid([&] { f.check(grid, a, b, c); });
  CHECK_HAS(m, "kernel 'gemm', argument 0 'A': this kernel reads it through TMA, which needs a row pitch of at least one row (128 bytes)");
  FakeTensor empty(bf16, {0, 64}, {64, 1}, 0x200000);
  m = invalid([&] { f.check(grid, FakeTensor(bf16, {256, 64}, {64, 1}, 0x100000), empty, c); });
  CHECK_HAS(m, "argument 1 'B': this kernel reads it through TMA, which needs a non-empty tensor");
  CHECK_NOTHROW(f.check(grid, FakeTensor(bf16, {256, 64}, {64, 1}, 0x100000), b, c));
}

TEST_CASE("DeviceArg: kinds of C++ arguments") {
  CHECK(DeviceArg(true).kind() == DeviceArg::Kind::Bool);
  CHECK(DeviceArg('a').kind() == DeviceArg::Kind::Int);
  CHECK(DeviceArg(size_t{3}).kind() == DeviceArg::Kind::UInt);
  CHECK(DeviceArg(1.5f).kind() == DeviceArg::Kind::Float);
  CHECK(DeviceArg(1.5f).as_double() == 1.5);
  CHECK(DeviceArg(int64_t{-7}).as_int() == -7);
  FakeTensor t(f32, {4, 8}, {16, 1}, 0xabc00);
  DeviceArg a(t.v);
  REQUIRE(a.tensor());
  CHECK(a.describe() == "the tensor f32[4,8] strides [16,1] at 0xabc00 on device 0");
  CHECK(DeviceArg(5).tensor() == nullptr);
}

TEST_CASE("Function: without a GPU the first call checks the arguments, compiles, then says a GPU is needed") {
  if (runtime::Driver::get().available()) {
    MESSAGE("SKIPPED: a GPU is present (this case covers compile-only mode; test_function_gpu runs there)");
    return;
  }
  Function f = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 128}});
  FakeTensor x(f32, {1000}, {1}, 0x10000), y(f32, {1000}, {1}, 0x20000), out(f32, {1000}, {1}, 0x30000);

  auto before = runtime::compile_cache_stats();
  std::string m = invalid([&] { f({8}, nullptr, x, y, out, 2.5); });  // bad: nothing is compiled
  CHECK_HAS(m, "argument 3 'n': expected an integer of type i32, got the float 2.5");
  CHECK(total(runtime::compile_cache_stats()) == total(before));

  for (int call = 0; call < 2; ++call) {
    try {
      f({8}, nullptr, x, y, out, 1000);
      FAIL("launching without a GPU did not throw");
    } catch (const runtime::DeviceError& e) {
      CHECK_HAS(std::string(e.what()), "tilejit: running kernel 'vector_add' needs a GPU: ");
    }
    // The first call compiled (through the cache), the second reused the compiled kernel.
    CHECK(total(runtime::compile_cache_stats()) == total(before) + 1);
  }
  CHECK_FALSE(f.loaded());
  CHECK_FALSE(f.compiled().ptx.empty());
  CHECK(f.compiled().name == "vector_add");

  // The same kernel and meta in a second Function: a memory-cache hit, nothing compiled.
  auto mid = runtime::compile_cache_stats();
  Function g = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 128}});
  CHECK(g.compiled().ptx == f.compiled().ptx);
  auto after = runtime::compile_cache_stats();
  CHECK(after.compiles == mid.compiles);
  CHECK(after.memory_hits == mid.memory_hits + 1);
  CHECK_THROWS_AS(g.gpu_kernel(), runtime::DeviceError);
}

TEST_CASE("Function: concurrent first uses build and compile once") {
  Function f = tilejit::compile(test_kernels::vector_add, {{"BLOCK", 512}});
  FakeTensor x(f32, {1000}, {1}, 0x10000), y(f32, {1000}, {1}, 0x20000), out(f32, {1000}, {1}, 0x30000);
  auto before = runtime::compile_cache_stats();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  const jit::CompiledKernel* seen[8] = {};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      f.check({2}, x, y, out, 1000);
      seen[i] = &f.compiled();
      ++ok;
    });
  for (auto& t : threads) t.join();
  CHECK(ok == 8);
  for (auto* s : seen) CHECK(s == seen[0]);
  CHECK(total(runtime::compile_cache_stats()) == total(before) + 1);
}

// Issue 26, item 4: launch-time specialisation (runtime/specialization.hpp). A kernel that declares
// nothing about a window's tensor gets a variant for 16-byte aligned, unit-stride arguments and
// integers that are multiples of 16: its loads vectorise without an ALIGN meta.
using test_kernels::undeclared_copy;

TEST_CASE("specialization: keys from what the arguments hold beyond the declaration") {
  const ir::Function f = undeclared_copy.build();
  FakeTensor aligned(bf16, {128, 256}, {256, 1}, 0x10000), shifted(bf16, {128, 255}, {256, 1}, 0x10002),
      odd_pitch(bf16, {128, 200}, {201, 1}, 0x10000), strided(bf16, {128, 128}, {256, 2}, 0x10000);
  auto key = [&](const TensorView& x, const TensorView& y, int c0) {
    const std::array<DeviceArg, 3> args{DeviceArg(x), DeviceArg(y), DeviceArg(c0)};
    return runtime::specialization_key(f, args);
  };
  const uint64_t all = key(aligned, aligned, 64);
  CHECK(all != 0);
  CHECK(runtime::describe_specialization(f, all) ==
        "X: align 16, contiguous; Y: align 16, contiguous; c0: divisible by 16");
  CHECK(runtime::describe_specialization(f, key(shifted, aligned, 8)) == "X: contiguous; Y: align 16, contiguous");
  CHECK(runtime::describe_specialization(f, key(odd_pitch, strided, -32)) == "X: contiguous; Y: align 16; c0: divisible by 16");
  // a variant carries the promises in its tile IR (so in its cache key), and its launches check them
  const ir::Function v = runtime::specialize(f, all);
  CHECK(v.params[0].spec.align_bytes == 16);
  CHECK(v.params[0].spec.contiguous_last);
  CHECK(v.params[2].spec.divisible_by == 16);
  CHECK(ir::print(v) != ir::print(f));
  CHECK(contains(ir::print(v), "divisible_by = 16"));
  const runtime::LaunchPlan plan(v);
  const std::array<DeviceArg, 3> good{DeviceArg(aligned.v), DeviceArg(aligned.v), DeviceArg(48)};
  plan.check({2}, good);
  const std::array<DeviceArg, 3> bad_int{DeviceArg(aligned.v), DeviceArg(aligned.v), DeviceArg(40)};
  CHECK_HAS(invalid([&] { plan.check({2}, bad_int); }), "argument 2 'c0': the integer 40 is not a multiple of 16");
  const std::array<DeviceArg, 3> bad_base{DeviceArg(shifted.v), DeviceArg(aligned.v), DeviceArg(48)};
  CHECK_HAS(invalid([&] { plan.check({2}, bad_base); }), "is not a multiple of 16 bytes");
}

TEST_CASE("specialization: the aligned variant vectorises its loads; the declared one does not; off by option") {
  Function f = tilejit::compile(undeclared_copy, {}, {});
  FakeTensor aligned(bf16, {128, 256}, {256, 1}, 0x10000);
  const std::array<DeviceArg, 3> args{DeviceArg(aligned.v), DeviceArg(aligned.v), DeviceArg(64)};
  CHECK(f.specialization(args) != 0);
  const std::string declared = f.compiled().ptx, special = f.compiled(args).ptx;
  CHECK(contains(special, "ld.global.v4"));
  CHECK_FALSE(contains(declared, "ld.global.v4"));
  jit::CompileOptions off;
  off.specialize = false;
  Function g = tilejit::compile(undeclared_copy, {}, off);
  CHECK(g.specialization(args) == 0);
  CHECK(g.compiled(args).ptx == declared);
}
