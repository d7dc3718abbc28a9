// The dot plan (dot_plan.hpp): mma.sync or FMA, the warp arrangement, and a batch's place.
#include "jit/dot_plan.hpp"

namespace tilejit::jit {
namespace {

// One 2-D dot [M,K] @ [K,N] on `warps` warps: as many warps along M as 16-row slabs allow, the
// rest along N (each needs >= 8 columns).
DotPlan plan_2d(int64_t m, int64_t k, int64_t n, bool tensor_core_inputs, bool tf32, int warps) {
  DotPlan p;
  p.tf32 = tf32;
  if (!tensor_core_inputs || k % p.k_step() != 0) return p;
  int wm = 1;
  while (wm < warps && m % (16 * wm * 2) == 0) wm *= 2;
  int wn = warps / wm;
  if (m % (16 * wm) != 0 || n % (8 * wn) != 0) return p;
  p.mma = true;
  p.warps_m = wm;
  p.warps_n = wn;
  return p;
}

}  // namespace

DotPlan plan_dot(const ir::Type& a, const ir::Type& b, int num_warps, ir::InputPrecision precision) {
  const bool sixteen_bit = a.dtype == ir::DType::f16 || a.dtype == ir::DType::bf16;
  const bool tf32 = precision == ir::InputPrecision::tf32 && a.dtype == ir::DType::f32;
  const size_t r = a.shape.size();
  const int64_t m = a.shape[r - 2], k = a.shape[r - 1], n = b.shape[r - 1];
  if (r == 2) return plan_2d(m, k, n, sixteen_bit || tf32, tf32, num_warps);
  // Batched: as many warps on the batch as it has (up to all of them) while one batch's share of
  // the warps still runs the mma; batches on different warps replicate neither A nor B.
  const int64_t batch = a.shape[0];
  int wb = 1;
  while (wb * 2 <= num_warps && wb * 2 <= batch) wb *= 2;
  for (; wb >= 1; wb /= 2) {
    DotPlan p = plan_2d(m, k, n, sixteen_bit || tf32, tf32, num_warps / wb);
    if (!p.mma) continue;
    p.batch = batch;
    p.warps_b = wb;
    return p;
  }
  DotPlan p;
  p.tf32 = tf32;
  p.batch = batch;
  return p;
}

Layout DotPlan::a_layout(const ir::Shape& a) const {
  const size_t r = a.size();
  Layout L = tf32 ? Layout::mma_a_tf32(a[r - 2], a[r - 1], warps_m, warps_n) : Layout::mma_a(a[r - 2], a[r - 1], warps_m, warps_n);
  return batch > 0 ? L.batched(batch, warps_b) : L;
}

Layout DotPlan::b_layout(const ir::Shape& b) const {
  const size_t r = b.size();
  Layout L = tf32 ? Layout::mma_b_tf32(b[r - 2], b[r - 1], warps_m, warps_n) : Layout::mma_b(b[r - 2], b[r - 1], warps_m, warps_n);
  return batch > 0 ? L.batched(batch, warps_b) : L;
}

Layout DotPlan::acc_layout(const ir::Shape& c) const {
  const size_t r = c.size();
  Layout L = Layout::mma_acc(c[r - 2], c[r - 1], warps_m, warps_n);  // (m16n8k8 .tf32 has m16n8k16's C)
  return batch > 0 ? L.batched(batch, warps_b) : L;
}

}  // namespace tilejit::jit
