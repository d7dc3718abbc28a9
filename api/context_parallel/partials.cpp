// The launches of context parallelism's merge, accumulate and convert kernels (partials.hpp): the
// arguments checked on the host, one compiled Function per configuration and device, the launch's
// own checks run dry (no GPU needed) before the driver is touched.
#include "api/context_parallel/partials.hpp"

#include <fmt/format.h>

#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/context_parallel.hpp"
#include "runtime/argument_aliasing.hpp"
#include "runtime/driver.hpp"
#include "runtime/function.hpp"

namespace tilejit::cp {

namespace {

using attention::Tensor;
using ir::DType;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kGridYZMax = 65535;
constexpr int64_t kAlign = 16;  // the kernels' ParamSpec::align_bytes for O-like tensors

// The checks of one call: every failure names the function, the argument, the value and what is valid.
class Check {
 public:
  explicit Check(const char* fn) : fn_(fn) {}

  template <class... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) const {
    throw std::invalid_argument(fmt::format("tilejit::cp::{}: {}", fn_, fmt::format(f, std::forward<A>(args)...)));
  }

  // An O-like [B, S, H, D] view: f32 (an accumulator) or a part's dtype (bf16, f16, f32).
  void rows(const char* name, const Tensor& t, bool f32_only) const {
    if (f32_only && t.dtype != DType::f32) fail("{} has dtype {}; valid: f32", name, ir::name(t.dtype));
    if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
      fail("{} has dtype {}; valid: bf16, f16, f32", name, ir::name(t.dtype));
    common(name, t, 4, "[B, S, H, D]");
    if (t.size(3) != 64 && t.size(3) != 128 && t.size(3) != 256) fail("{} has head dim D = {}; valid: 64, 128, 256", name, t.size(3));
    if (t.size(0) > kGridYZMax || t.size(2) > kGridYZMax)
      fail("{} has B = {}, H = {}; at most {} each (the launch grid's z and y dimensions)", name, t.size(0), t.size(2), kGridYZMax);
    if (t.data % kAlign != 0) fail("{}'s base address {:#x} is not a multiple of {} bytes: {}", name, t.data, kAlign, t.describe());
    for (int d = 0; d < 3; ++d)
      if (t.stride(d) * ir::byte_size(t.dtype) % kAlign != 0)
        fail("{}'s stride {} of dim {} is not a multiple of {} bytes: {}", name, t.stride(d), d, kAlign, t.describe());
  }
  // An f32 LSE [B, H, S] of the rows of `o`.
  void lse(const char* name, const Tensor& t, const char* o_name, const Tensor& o) const {
    if (t.dtype != DType::f32) fail("{} has dtype {}; valid: f32", name, ir::name(t.dtype));
    common(name, t, 3, "[B, H, S]");
    if (t.size(0) != o.size(0) || t.size(1) != o.size(2) || t.size(2) != o.size(1))
      fail("{} has sizes [{},{},{}] but {} is [B, S, H, D] = [{},{},{},{}]; valid: [B, H, S] = [{},{},{}]", name, t.size(0), t.size(1),
           t.size(2), o_name, o.size(0), o.size(1), o.size(2), o.size(3), o.size(0), o.size(2), o.size(1));
  }
  void same_sizes(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const {
    for (int d = 0; d < 4; ++d)
      if (t.size(d) != ref.size(d)) fail("{} has sizes {} but {} has {} (they must match)", name, t.describe(), ref_name, ref.describe());
  }
  void same_device(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const {
    if (t.device != ref.device) fail("{} is on device {} but {} is on device {} (valid: one device)", name, t.device, ref_name, ref.device);
  }
  // The output `out` shares no byte with `other` (the kernels read and write whole tiles).
  void disjoint(const char* out_name, const Tensor& out, const char* name, const Tensor& other) const {
    if (runtime::views_overlap(out.view(), other.view()))
      fail("{} ({}) overlaps {} ({}); valid: separate memory", out_name, out.describe(), name, other.describe());
  }

 private:
  void common(const char* name, const Tensor& t, int rank, const char* layout) const {
    if (t.rank != rank) fail("{} must be rank {} {}, got rank {}: {}", name, rank, layout, t.rank, t.describe());
    if (t.data == 0) fail("{} is a null pointer: {}", name, t.describe());
    if (t.device < 0) fail("{} is on device {}; device ordinals start at 0", name, t.device);
    for (int d = 0; d < rank; ++d) {
      if (t.size(d) < 1 || t.size(d) > kI32Max)
        fail("{} has size {} in dim {}: {}; valid: 1 to {}", name, t.size(d), d, t.describe(), kI32Max);
      if (t.stride(d) < 0) fail("{} has a negative stride {} in dim {}: {}", name, t.stride(d), d, t.describe());
    }
    if (t.stride(rank - 1) != 1)
      fail("{} has stride {} on its last dim; valid: 1 (unit stride): {}", name, t.stride(rank - 1), t.describe());
  }
  const char* fn_;
};

// One Function per kernel, meta binding and device, created once and kept for the life of the
// process (as the attention API's caches); Function compiles once under concurrent first calls.
Function& function_for(const lang::Kernel& k, const lang::Meta& meta, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const lang::Kernel*, lang::Meta, int>, std::unique_ptr<Function>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[{&k, meta, device}];
  if (!slot) {
    jit::CompileOptions o;
    o.specialize = false;  // (library kernels declare what they need; bundles hold that variant)
    o.num_warps = 4;
    slot = std::make_unique<Function>(k, meta, o, device);
  }
  return *slot;
}

// Launches over the rows of `o` ([B, S, H, D]) at `block_m` rows a program, the arguments in the
// kernel's parameter order; the launch's checks run first without a GPU.
void launch(const char* fn, const lang::Kernel& k, const lang::Meta& meta, int64_t block_m, const Tensor& o,
            std::initializer_list<const Tensor*> args, CUstream stream) {
  Function& f = function_for(k, meta, o.device);
  std::vector<runtime::DeviceArg> a;
  for (const Tensor* t : args) a.emplace_back(t->view());
  const runtime::Grid grid{lang::cdiv(o.size(1), block_m), o.size(2), o.size(0)};
  f.check(grid, std::span<const runtime::DeviceArg>(a));
  auto& drv = runtime::Driver::get();
  drv.require(fmt::format("tilejit::cp::{}", fn));
  if (o.device >= drv.device_count())
    throw std::invalid_argument(fmt::format("tilejit::cp::{}: the tensors are on device {} but this machine has {} GPU(s)", fn, o.device,
                                            drv.device_count()));
  f.launch(grid, stream, a);
}

}  // namespace

void merge_partial(const Tensor& o_acc, const Tensor& lse_acc, const Tensor& o_part, const Tensor& lse_part, bool first, CUstream stream) {
  const Check c("merge_partial");
  c.rows("o_acc", o_acc, /*f32_only=*/true);
  c.rows("o_part", o_part, /*f32_only=*/false);
  c.same_sizes("o_part", o_part, "o_acc", o_acc);
  c.lse("lse_acc", lse_acc, "o_acc", o_acc);
  c.lse("lse_part", lse_part, "o_acc", o_acc);
  for (auto [name, t] : {std::pair{"lse_acc", &lse_acc}, std::pair{"o_part", &o_part}, std::pair{"lse_part", &lse_part}})
    c.same_device(name, *t, "o_acc", o_acc);
  for (auto [name, t] : {std::pair{"lse_acc", &lse_acc}, std::pair{"o_part", &o_part}, std::pair{"lse_part", &lse_part}})
    c.disjoint("o_acc", o_acc, name, *t);
  c.disjoint("lse_acc", lse_acc, "o_part", o_part);
  c.disjoint("lse_acc", lse_acc, "lse_part", lse_part);
  kernels::CpPartialConfig cfg;
  cfg.dtype = o_part.dtype, cfg.head_dim = o_acc.size(3), cfg.block_m = kernels::cp_block_m(cfg.head_dim), cfg.first = first;
  launch("merge_partial", kernels::attention_cp_merge(), cfg.to_meta(), cfg.block_m, o_acc, {&o_acc, &lse_acc, &o_part, &lse_part}, stream);
}

void accumulate(const Tensor& acc, const Tensor& part, bool first, CUstream stream) {
  const Check c("accumulate");
  c.rows("acc", acc, /*f32_only=*/true);
  c.rows("part", part, /*f32_only=*/false);
  c.same_sizes("part", part, "acc", acc);
  c.same_device("part", part, "acc", acc);
  c.disjoint("acc", acc, "part", part);
  kernels::CpPartialConfig cfg;
  cfg.dtype = part.dtype, cfg.head_dim = acc.size(3), cfg.block_m = kernels::cp_block_m(cfg.head_dim), cfg.first = first;
  launch("accumulate", kernels::attention_cp_accumulate(), cfg.to_meta(), cfg.block_m, acc, {&acc, &part}, stream);
}

void convert(const Tensor& src_f32, const Tensor& dst, CUstream stream) {
  const Check c("convert");
  c.rows("src_f32", src_f32, /*f32_only=*/true);
  c.rows("dst", dst, /*f32_only=*/false);
  c.same_sizes("dst", dst, "src_f32", src_f32);
  c.same_device("dst", dst, "src_f32", src_f32);
  c.disjoint("dst", dst, "src_f32", src_f32);
  kernels::CpConvertConfig cfg;
  cfg.dtype = dst.dtype, cfg.head_dim = src_f32.size(3), cfg.block_m = kernels::cp_block_m(cfg.head_dim);
  launch("convert", kernels::attention_cp_convert(), cfg.to_meta(), cfg.block_m, src_f32, {&src_f32, &dst}, stream);
}

}  // namespace tilejit::cp
