#include "runtime/argument_aliasing.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>
#include <set>

#include "dsl/ir/address_sources.hpp"
#include "runtime/gpu_kernel.hpp"

namespace tilejit::runtime {

std::vector<bool> written_params(const ir::Function& f) {
  const ir::AddressSources sources = ir::address_sources(f);
  auto of = [&](ir::ValueId v) -> const std::set<size_t>* {
    auto it = sources.find(v);
    return it == sources.end() ? nullptr : &it->second;
  };
  std::vector<bool> written(f.params.size(), false);
  ir::walk(f.body, [&](const ir::Op& op) {
    const bool writes = op.kind == ir::OpKind::store || op.kind == ir::OpKind::atomic_add || op.kind == ir::OpKind::atomic_rmw ||
                        op.kind == ir::OpKind::atomic_cas ||
                        op.kind == ir::OpKind::block_store || op.kind == ir::OpKind::signal_add ||
                        op.kind == ir::OpKind::timestamp;
    if (!writes || op.operands.empty()) return;
    if (const std::set<size_t>* s = of(op.operands[0]))
      for (size_t i : *s) written[i] = true;
  });
  return written;
}

bool same_view(const TensorView& a, const TensorView& b) {
  return a.address == b.address && a.dtype == b.dtype && std::ranges::equal(a.sizes, b.sizes) &&
         std::ranges::equal(a.strides, b.strides);
}

bool views_overlap(const TensorView& a, const TensorView& b) {
  __extension__ typedef __int128 I128;  // sizes times strides of two i64s, without overflow
  // This runs on every launch: the byte extents first (disjoint buffers stop here), the
  // interleaving test only for views whose extents meet.
  struct Extent {
    I128 lo = 0, hi = 0;  // bytes [lo, hi)
    bool empty = false;
  };
  auto extent = [](const TensorView& t) {
    const int64_t es = ir::byte_size(t.dtype);
    Extent e{t.address, t.address, false};
    const size_t rank = std::min(t.sizes.size(), t.strides.size());
    for (size_t d = 0; d < rank; ++d) {
      if (t.sizes[d] <= 0) return Extent{0, 0, true};
      int64_t span64;  // 64-bit arithmetic unless it overflows
      I128 span;
      if (__builtin_mul_overflow(t.sizes[d] - 1, t.strides[d], &span64) || __builtin_mul_overflow(span64, es, &span64))
        span = I128{t.sizes[d] - 1} * t.strides[d] * es;
      else
        span = span64;
      (span < 0 ? e.lo : e.hi) += span;
    }
    e.hi += es;
    return e;
  };
  const Extent ea = extent(a), eb = extent(b);
  if (ea.empty || eb.empty || ea.hi <= eb.lo || eb.hi <= ea.lo) return false;
  // A view is a set of contiguous runs of `run` bytes -- its unit-stride dim together with every
  // dim whose stride is the run so far (the heads and head dim of a packed [B, S, 3 * H * D] QKV
  // view make one run of H * D) -- whose starts are the base plus multiples of `step`, the gcd of
  // both views' byte strides along their other dims of size > 1.
  uint64_t step = 0;
  auto run_bytes = [&step](const TensorView& t) {
    const int64_t es = ir::byte_size(t.dtype);
    const size_t rank = std::min(t.sizes.size(), t.strides.size());
    std::vector<bool> in_run(rank, false);
    I128 run_elems = 1;
    for (bool grew = true; grew;) {  // (each pass adds the dim whose stride is the run so far)
      grew = false;
      for (size_t d = 0; d < rank; ++d)
        if (!in_run[d] && t.sizes[d] > 1 && I128{t.strides[d]} == run_elems) {
          in_run[d] = true, run_elems *= t.sizes[d], grew = true;
          break;
        }
    }
    for (size_t d = 0; d < rank; ++d) {
      if (t.sizes[d] == 1 || in_run[d]) continue;
      const I128 s = I128{t.strides[d]} * es;
      step = std::gcd(step, static_cast<uint64_t>(s < 0 ? -s : s));
    }
    return run_elems * es;
  };
  const I128 run_a = run_bytes(a), run_b = run_bytes(b);
  if (step == 0) return true;  // one run each, and their extents overlap
  // A run of a starts at a.address + k * step and one of b at b.address + m * step: they can meet
  // only if b's start minus a's, modulo step, falls within (-run_b, run_a).
  const I128 g = step;
  const I128 diff = (I128{b.address} - I128{a.address}) % g;
  const I128 r = diff < 0 ? diff + g : diff;
  return r < run_a || r > g - run_b;
}

}  // namespace tilejit::runtime
