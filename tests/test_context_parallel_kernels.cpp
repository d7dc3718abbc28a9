// Context parallelism's small kernels (kernels/context_parallel.hpp) in the CPU interpreter against
// float64: merging partial O / LSE (FIRST and not, rows at -inf on one side and on both, bf16 and
// f32 parts), accumulating gradient partials, converting f32 to the caller's dtype. Every tensor is
// a view of the first S of S_total rows of each batch of a larger buffer, S not a multiple of
// BLOCK_M: the rows between the views (after batch b's, before batch b + 1's) must keep their bytes.
// Also: each kernel assembled for sm_90a without spills, and the host wrappers' argument checks.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/context_parallel/partials.hpp"
#include "kernels/context_parallel.hpp"
#include "ptxas_testing.hpp"
#include "runtime/driver.hpp"
#include "runtime/emulator.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Rows {
  int64_t B = 2, S = 45, S_total = 70, H = 3, D = 64;
  int64_t block_m = 16;  // 0: the kernels' default (cp_block_m(D))
  int64_t bm() const { return block_m ? block_m : kernels::cp_block_m(D); }
  runtime::Grid grid() const { return {cdiv(S, bm()), H, B}; }
  std::string describe() const { return fmt::format("B {} S {} of {} H {} D {} BLOCK_M {}", B, S, S_total, H, D, bm()); }
};

// [B, S, H, D] rows of a [B, S_total, H, D] buffer; LSE [B, H, S] of [B, H, S_total]. Poisoned
// first (0xFF bytes: NaN), so that the bytes outside the view and any unread input are visible.
HostTensor o_view(DType t, const Rows& s) {
  HostTensor x(t, {s.B, s.S, s.H, s.D}, {s.S_total * s.H * s.D, s.H * s.D, s.D, 1});
  x.poison();
  return x;
}
HostTensor lse_view(const Rows& s) {
  HostTensor x(f32, {s.B, s.H, s.S}, {s.H * s.S_total, s.S_total, 1});
  x.poison();
  return x;
}

std::vector<std::byte> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const std::byte*>(t.data());
  return {p, p + t.bytes()};
}

// Every element of the allocation outside the view still holds its bytes from `before`.
void check_outside_unchanged(const HostTensor& t, const std::vector<std::byte>& before, const char* name) {
  const auto es = static_cast<size_t>(ir::byte_size(t.dtype()));
  std::vector<bool> inside(t.bytes() / es, false);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = 0, rest = n;
    for (int d = t.rank() - 1; d >= 0; --d) {
      off += rest % t.sizes()[static_cast<size_t>(d)] * t.strides()[static_cast<size_t>(d)];
      rest /= t.sizes()[static_cast<size_t>(d)];
    }
    inside[static_cast<size_t>(off)] = true;
  }
  const auto* now = static_cast<const std::byte*>(t.data());
  size_t changed = 0;
  for (size_t e = 0; e < inside.size(); ++e)
    if (!inside[e] && std::memcmp(now + e * es, before.data() + e * es, es) != 0) ++changed;
  CHECK_MESSAGE(changed == 0, name << ": " << changed << " elements outside the view were written");
}

// Row i's class for partial j of `parts`: whether its LSE is -inf (its O row is then 0). Rows
// i % 8 == 0: every partial -inf; 1: only the first finite; 2: only the last; 3: the second -inf.
bool empty_row(int64_t i, int j, int parts) {
  switch (i % 8) {
    case 0: return true;
    case 1: return j != 0;
    case 2: return j != parts - 1;
    case 3: return j == 1;
    default: return false;
  }
}

struct Partial {
  HostTensor o, lse;
};

// Seeded random O and LSE, every row finite.
Partial dense_partial(DType t, const Rows& s, int j) {
  Partial p{o_view(t, s), lse_view(s)};
  p.o.fill_normal(100 + static_cast<uint64_t>(j), 0, 1);
  p.lse.fill_uniform(200 + static_cast<uint64_t>(j), -10, 10);
  return p;
}

// Partial j of `parts`, with the -inf rows of empty_row (O = 0 there, as attention writes them).
Partial make_partial(DType t, const Rows& s, int j, int parts) {
  Partial p = dense_partial(t, s, j);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.S; ++i) {
        if (!empty_row(i, j, parts)) continue;
        p.lse.set({b, h, i}, -kInf);
        for (int64_t d = 0; d < s.D; ++d) p.o.set({b, i, h, d}, 0.0);
      }
  return p;
}

// Merges `parts` partials in order (the first with FIRST) and compares with float64's
// log-sum-exp over all of them; rows with one finite partial must be exact copies of it.
void check_merge(DType part_t, const Rows& s, int parts) {
  INFO(s.describe() << " part " << ir::name(part_t) << ", " << parts << " partials");
  std::vector<Partial> p;
  for (int j = 0; j < parts; ++j) p.push_back(make_partial(part_t, s, j, parts));
  HostTensor o_acc = o_view(f32, s), lse_acc = lse_view(s);  // inside the view NaN: FIRST must not read it
  HostTensor o_emu = o_acc, lse_emu = lse_acc;
  const auto o_before = bytes_of(o_acc), lse_before = bytes_of(lse_acc);
  for (int j = 0; j < parts; ++j) {
    kernels::CpPartialConfig c;
    c.dtype = part_t, c.head_dim = s.D, c.block_m = s.bm(), c.first = j == 0;
    runtime::interpret(kernels::attention_cp_merge().build(c.to_meta()), s.grid(), {o_acc, lse_acc, p[j].o, p[j].lse});
    // the lowered kernel on the host (runtime/emulator.hpp): the same bits as the interpreter
    runtime::emulate(kernels::attention_cp_merge().build(c.to_meta()), s.grid(), {o_emu, lse_emu, p[j].o, p[j].lse});
  }
  CHECK(bytes_of(o_emu) == bytes_of(o_acc));
  CHECK(bytes_of(lse_emu) == bytes_of(lse_acc));
  check_outside_unchanged(o_acc, o_before, "O_acc");
  check_outside_unchanged(lse_acc, lse_before, "LSE_acc");
  double worst_o = 0, worst_lse = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.S; ++i) {
        double m = -kInf;
        for (const Partial& q : p) m = std::max(m, q.lse.get({b, h, i}));
        const double got_lse = lse_acc.get({b, h, i});
        if (m == -kInf) {  // no partial saw a key: O = 0, LSE = -inf, never NaN
          REQUIRE(got_lse == -kInf);
          for (int64_t d = 0; d < s.D; ++d) REQUIRE(o_acc.get({b, i, h, d}) == 0.0);
          continue;
        }
        double total = 0;
        for (const Partial& q : p) total += std::exp(q.lse.get({b, h, i}) - m);
        const double ref_lse = m + std::log(total);
        worst_lse = std::max(worst_lse, std::abs(got_lse - ref_lse) / std::max(1.0, std::abs(ref_lse)));
        const int only = i % 8 == 1 ? 0 : i % 8 == 2 ? parts - 1 : -1;  // the one finite partial, if so
        if (only >= 0) REQUIRE(got_lse == p[static_cast<size_t>(only)].lse.get({b, h, i}));
        for (int64_t d = 0; d < s.D; ++d) {
          double ref = 0, scale = 1;
          for (const Partial& q : p) {
            ref += std::exp(q.lse.get({b, h, i}) - ref_lse) * q.o.get({b, i, h, d});
            scale = std::max(scale, std::abs(q.o.get({b, i, h, d})));
          }
          const double got = o_acc.get({b, i, h, d});
          if (only >= 0) REQUIRE(got == p[static_cast<size_t>(only)].o.get({b, i, h, d}));
          worst_o = std::max(worst_o, std::abs(got - ref) / scale);
        }
      }
  MESSAGE(fmt::format("merge {} {}x: max error O {:.2e} (of max |O_i|), LSE {:.2e}", s.describe(), parts, worst_o, worst_lse));
  CHECK(worst_o < 4e-6);
  CHECK(worst_lse < 2e-6);
}

}  // namespace

TEST_CASE("attention_cp_merge: FIRST then merges vs float64 log-sum-exp, -inf rows, strided row views, tail blocks") {
  for (DType t : {bf16, f32}) {
    check_merge(t, Rows{}, 1);  // FIRST alone: an exact copy
    check_merge(t, Rows{}, 3);
    check_merge(t, Rows{.B = 2, .S = 37, .S_total = 50, .H = 2, .D = 128, .block_m = 0}, 3);
  }
  check_merge(f16, Rows{.B = 1, .S = 20, .S_total = 29, .H = 2, .D = 64, .block_m = 0}, 2);
}

TEST_CASE("attention_cp_merge: a weight that underflows, equal LSEs") {
  // row 1: LSEs 200 apart, the smaller partial's weight underflows to 0 in f32 (no NaN, no inf)
  const Rows s{.B = 1, .S = 3, .S_total = 5, .H = 1, .D = 64, .block_m = 0};
  Partial a = dense_partial(f32, s, 4), b = dense_partial(f32, s, 5);
  HostTensor o_acc = o_view(f32, s), lse_acc = lse_view(s);
  a.lse.set({0, 0, 1}, 1.0), b.lse.set({0, 0, 1}, 201.0);
  a.lse.set({0, 0, 2}, 1.0), b.lse.set({0, 0, 2}, 1.0);  // equal: weights 1/2 each, LSE + log 2
  for (int j = 0; j < 2; ++j) {
    kernels::CpPartialConfig c;
    c.dtype = f32, c.head_dim = s.D, c.first = j == 0, c.block_m = s.bm();
    Partial& q = j == 0 ? a : b;
    runtime::interpret(kernels::attention_cp_merge().build(c.to_meta()), s.grid(), {o_acc, lse_acc, q.o, q.lse});
  }
  CHECK(lse_acc.get({0, 0, 1}) == 201.0);
  CHECK(lse_acc.get({0, 0, 2}) == doctest::Approx(1.0 + std::log(2.0)).epsilon(1e-6));
  for (int64_t d = 0; d < s.D; ++d) {
    CHECK(o_acc.get({0, 1, 0, d}) == b.o.get({0, 1, 0, d}));
    CHECK(o_acc.get({0, 2, 0, d}) == doctest::Approx(0.5 * (a.o.get({0, 2, 0, d}) + b.o.get({0, 2, 0, d}))).epsilon(1e-5));
  }
}

namespace {

// acc = part_0 (FIRST), then += part_j, against float64 sums; the view's outside untouched.
void check_accumulate(DType part_t, const Rows& s, int parts) {
  INFO(s.describe() << " part " << ir::name(part_t));
  HostTensor acc = o_view(f32, s);  // NaN inside: FIRST must not read it
  const auto before = bytes_of(acc);
  std::vector<HostTensor> p;
  for (int j = 0; j < parts; ++j) {
    p.push_back(o_view(part_t, s));
    p.back().fill_normal(300 + static_cast<uint64_t>(j), 0, 1);
    kernels::CpPartialConfig c;
    c.dtype = part_t, c.head_dim = s.D, c.block_m = s.bm(), c.first = j == 0;
    runtime::interpret(kernels::attention_cp_accumulate().build(c.to_meta()), s.grid(), {acc, p.back()});
    if (j == 0) {
      const std::vector<double> got = acc.to_f64(), want = p[0].to_f64();
      REQUIRE(got == want);  // FIRST: an exact copy
    }
  }
  check_outside_unchanged(acc, before, "acc");
  std::vector<double> ref(static_cast<size_t>(acc.numel()), 0.0), scale(ref.size(), 1e-30);
  for (const HostTensor& q : p) {
    const std::vector<double> v = q.to_f64();
    for (size_t e = 0; e < ref.size(); ++e) ref[e] += v[e], scale[e] = std::max(scale[e], std::abs(v[e]));
  }
  const std::vector<double> got = acc.to_f64();
  double worst = 0;
  for (size_t e = 0; e < ref.size(); ++e) worst = std::max(worst, std::abs(got[e] - ref[e]) / scale[e]);
  MESSAGE(fmt::format("accumulate {} x{}: max error {:.2e} (of max |part|)", s.describe(), parts, worst));
  CHECK(worst < 1e-6);  // f32 sums of a few terms
}

void check_convert(DType dst_t, const Rows& s) {
  INFO(s.describe() << " dst " << ir::name(dst_t));
  HostTensor src = o_view(f32, s), dst = o_view(dst_t, s);
  src.fill_normal(400, 0, 3);
  const auto before = bytes_of(dst);
  kernels::CpConvertConfig c;
  c.dtype = dst_t, c.head_dim = s.D, c.block_m = s.bm();
  runtime::interpret(kernels::attention_cp_convert().build(c.to_meta()), s.grid(), {src, dst});
  check_outside_unchanged(dst, before, "dst");
  const std::vector<double> from = src.to_f64(), got = dst.to_f64();
  size_t wrong = 0;
  for (size_t e = 0; e < got.size(); ++e)
    if (got[e] != runtime::element::round_float(dst_t, from[e])) ++wrong;  // round to nearest even, once
  CHECK_MESSAGE(wrong == 0, wrong << " elements not rounded to nearest even");
}

}  // namespace

TEST_CASE("attention_cp_accumulate: FIRST copies, then f32 sums vs float64; strided row views, tail blocks") {
  for (DType t : {bf16, f32}) {
    check_accumulate(t, Rows{}, 3);
    check_accumulate(t, Rows{.B = 2, .S = 37, .S_total = 50, .H = 2, .D = 128, .block_m = 0}, 3);
  }
  check_accumulate(f16, Rows{.B = 1, .S = 20, .S_total = 29, .H = 2, .D = 64, .block_m = 0}, 2);
}

TEST_CASE("attention_cp_convert: f32 to bf16, f16, f32 rounded once; strided row views, tail blocks") {
  for (DType t : {bf16, f16, f32}) {
    check_convert(t, Rows{});
    check_convert(t, Rows{.B = 2, .S = 37, .S_total = 50, .H = 2, .D = 128, .block_m = 0});
  }
}

TEST_CASE("context-parallel kernels: metas refused with what is valid") {
  kernels::CpPartialConfig c;
  c.head_dim = 96;
  CHECK_THROWS_WITH_AS(kernels::attention_cp_merge().build(c.to_meta()), doctest::Contains("HEAD_DIM = 96; valid: 64, 128, 256"),
                       BuildError);
  c.head_dim = 64, c.block_m = 48;
  CHECK_THROWS_WITH_AS(kernels::attention_cp_accumulate().build(c.to_meta()), doctest::Contains("BLOCK_M = 48"), BuildError);
  kernels::CpConvertConfig v;
  v.dtype = i32;
  CHECK_THROWS_WITH_AS(kernels::attention_cp_convert().build(v.to_meta()), doctest::Contains("valid: bf16, f16, f32"), BuildError);
}

TEST_CASE("context-parallel kernels assemble for sm_90a without spills (D 64, 128, 256)") {
  if (testing::no_ptxas()) return;
  for (int64_t D : {64, 128, 256}) {
    for (DType t : {bf16, f32}) {
      std::vector<ir::Function> fns;
      for (bool first : {false, true}) {
        kernels::CpPartialConfig c;
        c.dtype = t, c.head_dim = D, c.block_m = kernels::cp_block_m(D), c.first = first;
        fns.push_back(kernels::attention_cp_merge().build(c.to_meta()));
        fns.push_back(kernels::attention_cp_accumulate().build(c.to_meta()));
      }
      kernels::CpConvertConfig v;
      v.dtype = t, v.head_dim = D, v.block_m = kernels::cp_block_m(D);
      fns.push_back(kernels::attention_cp_convert().build(v.to_meta()));
      for (const ir::Function& fn : fns) {
        INFO(fn.name << " D " << D << " " << ir::name(t));
        const jit::CompiledKernel k = testing::assemble_sm90a(fn, jit::Backend::Llvm, 4);
        CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
        CHECK_MESSAGE(k.info.spill_load_bytes == 0, k.info.to_string());
      }
    }
  }
}

// The host wrappers check their arguments before any GPU work; valid arguments pass the launch's
// own checks (the signature, run dry) and only then need a GPU.
TEST_CASE("cp::merge_partial, accumulate, convert: argument checks name the function, argument and what is valid") {
  const uint64_t at = 1 << 20;
  const attention::Tensor o_acc = attention::contiguous(at, f32, {2, 40, 3, 64});
  const attention::Tensor lse_acc = attention::contiguous(at + (1 << 20), f32, {2, 3, 40});
  const attention::Tensor o_part = attention::contiguous(at + (2 << 20), bf16, {2, 40, 3, 64});
  const attention::Tensor lse_part = attention::contiguous(at + (3 << 20), f32, {2, 3, 40});
  using attention::Tensor;
  auto merge_throws = [&](const Tensor& oa, const Tensor& la, const Tensor& op, const Tensor& lp, const char* what) {
    CHECK_THROWS_WITH_AS(cp::merge_partial(oa, la, op, lp, false, nullptr), doctest::Contains(what), std::invalid_argument);
  };
  merge_throws(o_part, lse_acc, o_part, lse_part, "tilejit::cp::merge_partial: o_acc has dtype bf16; valid: f32");
  merge_throws(o_acc, lse_acc, attention::contiguous(at + (2 << 20), bf16, {2, 40, 3, 96}), lse_part, "o_part has head dim D = 96");
  merge_throws(o_acc, lse_acc, attention::contiguous(at + (2 << 20), bf16, {2, 41, 3, 64}), lse_part, "o_part has sizes");
  merge_throws(o_acc, attention::contiguous(at + (1 << 20), f32, {2, 40, 3}), o_part, lse_part, "valid: [B, H, S] = [2,3,40]");
  merge_throws(o_acc, lse_acc, attention::strided(at + (2 << 20), bf16, {2, 40, 3, 64}, {7680, 192, 1, 3}), lse_part,
               "o_part has stride 3 on its last dim");
  merge_throws(o_acc, lse_acc, o_part, attention::contiguous(at, f32, {2, 3, 40}), "overlaps lse_part");
  attention::Tensor other = lse_part;
  other.device = 1;
  merge_throws(o_acc, lse_acc, o_part, other, "lse_part is on device 1 but o_acc is on device 0");
  CHECK_THROWS_WITH_AS(cp::accumulate(o_acc, attention::contiguous(at + (2 << 20), i32, {2, 40, 3, 64}), true, nullptr),
                       doctest::Contains("tilejit::cp::accumulate: part has dtype i32; valid: bf16, f16, f32"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(cp::convert(o_part, o_acc, nullptr), doctest::Contains("tilejit::cp::convert: src_f32 has dtype bf16; valid: f32"),
                       std::invalid_argument);
  // valid arguments: past the checks (host and launch), then a GPU is needed
  if (runtime::Driver::get().available()) return;
  CHECK_THROWS_AS(cp::merge_partial(o_acc, lse_acc, o_part, lse_part, true, nullptr), runtime::DeviceError);
  CHECK_THROWS_AS(cp::accumulate(o_acc, o_part, false, nullptr), runtime::DeviceError);
  CHECK_THROWS_AS(cp::convert(o_acc, o_part, nullptr), runtime::DeviceError);
}
