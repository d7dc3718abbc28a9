// Views of a range of heads ([B, n, H, D] tensors and LSEs [B, H, n]), the 2D copies that pack or
// place them, and the single-GPU options of a call on some heads: what Ulysses' head shards and
// allgather's pipelined head groups share.
#pragma once
#include "api/context_parallel/internal.hpp"

namespace tilejit::cp::detail {

struct HeadRange {
  int64_t begin = 0, count = 0;
};

// Heads [h.begin, h.begin + h.count) of a [B, n, H, D] tensor; of an LSE [B, H, n].
inline Tensor heads(const Tensor& t, HeadRange h) {
  Tensor r = t;
  r.data += static_cast<uint64_t>(h.begin * t.stride(2) * ir::byte_size(t.dtype));
  r.sizes[2] = h.count;
  return r;
}
inline Tensor lse_heads(const Tensor& lse, HeadRange h) {
  Tensor r = lse;
  r.data += static_cast<uint64_t>(h.begin * lse.stride(1) * 4);
  r.sizes[1] = h.count;
  return r;
}

// A batch of one without its batch dim: [1, n, H, D] as the varlen API's [n, H, D], an LSE
// [1, H, n] as [H, n] (packed documents: the single-GPU call takes the whole packed sequence).
inline Tensor without_batch(const Tensor& t) {
  Tensor r = t;
  r.rank = t.rank - 1;
  for (int i = 0; i < r.rank; ++i) {
    r.sizes[static_cast<size_t>(i)] = t.size(i + 1);
    r.strides[static_cast<size_t>(i)] = t.stride(i + 1);
  }
  r.sizes[static_cast<size_t>(r.rank)] = r.strides[static_cast<size_t>(r.rank)] = 0;
  return r;
}

// dst = src for two views of one shape: [B, n, h, D] with (h, D) contiguous in each row, or an LSE
// [B, h, n]; one 2D copy per batch.
inline void copy_view(const Tensor& dst, const Tensor& src, CUstream stream) {
  const int64_t es = ir::byte_size(src.dtype);
  const bool lse = src.rank == 3;
  const int64_t height = src.size(1), width = lse ? src.size(2) * es : src.size(2) * src.size(3) * es;
  for (int64_t b = 0; b < src.size(0); ++b) {
    CUDA_MEMCPY2D c{};
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src.data + static_cast<uint64_t>(b * src.stride(0) * es);
    c.dstDevice = dst.data + static_cast<uint64_t>(b * dst.stride(0) * es);
    c.srcPitch = static_cast<size_t>(src.stride(1) * es);
    c.dstPitch = static_cast<size_t>(dst.stride(1) * es);
    c.WidthInBytes = static_cast<size_t>(width);
    c.Height = static_cast<size_t>(height);
    runtime::check_cu(runtime::Driver::get().api().Memcpy2DAsync(&c, stream), "cuMemcpy2DAsync");
  }
}

inline Tensor lse_cols(const Tensor& lse, int64_t begin, int64_t end) { return lse_rows(lse, begin, end); }

// Slice g of G equal parts of a head range.
inline HeadRange slice(HeadRange h, int g, int G) { return {h.begin + g * (h.count / G), h.count / G}; }

// The call's options on this rank's heads: per-head tensors (ALiBi slopes, a per-head block table)
// sliced to them; dropout placed at the heads' global index, so that the keep-mask is the
// single-GPU call's (composed with coordinates the caller gave for the whole call).
inline attention::Options head_options(const attention::Options& opts, HeadRange h, int64_t Hq) {
  attention::Options a = opts;
  if (a.dropout_p > 0) {
    auto& c = a.dropout_coordinates;
    if (c.heads == 0) c.heads = Hq;
    c.head_offset += h.begin;
  }
  if (a.score_mod.alibi_slopes) {
    Tensor& t = *a.score_mod.alibi_slopes;
    t.data += static_cast<uint64_t>(h.begin * t.stride(0) * 4);
    t.sizes[0] = h.count;
  }
  if (a.mask && a.mask->block_table && a.mask->block_table->size(1) == Hq && Hq > 1) {
    Tensor& t = *a.mask->block_table;
    t.data += static_cast<uint64_t>(h.begin * t.stride(1));
    t.sizes[1] = h.count;
  }
  return a;
}

// Calls pipelined beside communication (head groups) launch one program per tile unless the
// caller chose: NCCL's kernels hold SMs that a persistent grid (one program per SM) waits for
// (decision 062).
inline void per_tile_unless_chosen(attention::Options& a) {
  if (!a.persistent) a.persistent = false;
}

}  // namespace tilejit::cp::detail
