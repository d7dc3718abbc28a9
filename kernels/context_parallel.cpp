// Context parallelism's small kernels (context_parallel.hpp): merge, accumulate, convert. Each
// program handles BLOCK_M rows of one head; windows are bounds-checked against the views, so the
// tail block of a sub-range of rows writes nothing outside it.
#include "kernels/context_parallel.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>

#include "kernels/meta_names.hpp"

namespace tilejit::kernels {

using namespace lang;
namespace mn = meta_name;

namespace {

inline constexpr double kLog2e = 1.4426950408889634, kLn2 = 0.6931471805599453;  // exp(x) = exp2(x log2 e)
// O-like tensors: rows of D >= 64 elements, so any row range of an aligned tensor stays aligned.
const ParamSpec kRows{.align_bytes = 16, .contiguous_last = true};
// LSE: a range of rows starts at any element.
const ParamSpec kLse{.contiguous_last = true};

// This program's place: BLOCK_M rows from m0 of head h in batch b.
struct RowBlock {
  int64_t BM, D;
  Tile b = program_id(2), h = program_id(1), m0 = program_id(0) * BM;

  BlockRef o(const Tensor& t) const { return t.block({b, m0, h, 0}, {BM, D}, {1, 3}); }  // [BM, D] of [B, S, H, D]
  BlockRef lse(const Tensor& t) const { return t.block({b, h, m0}, {BM}); }            // [BM] of [B, H, S]
};

// The shared checks of the metas: dtypes the host passes, head dims of the attention kernels.
void check_metas(Builder& kb, ir::DType dtype, int64_t head_dim, int64_t block_m) {
  if (dtype != ir::DType::bf16 && dtype != ir::DType::f16 && dtype != ir::DType::f32)
    kb.fail(Loc::current(), fmt::format("DTYPE = {}; valid: bf16, f16, f32", ir::name(dtype)));
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    kb.fail(Loc::current(), fmt::format("HEAD_DIM = {}; valid: 64, 128, 256", head_dim));
  if (block_m < 1 || !std::has_single_bit(static_cast<uint64_t>(block_m)))
    kb.fail(Loc::current(), fmt::format("BLOCK_M = {}; valid: a power of two", block_m));
}

// Launch requirements: `b` has `a`'s sizes (both [B, S, H, D]).
void same_sizes(Builder& kb, const Tensor& a, const Tensor& b, const char* why) {
  for (int d = 0; d < 4; ++d) kb.same_size(a, d, b, d, why);
}
// An LSE [B, H, S] of the rows of O [B, S, H, D].
void lse_of(Builder& kb, const Tensor& lse, const Tensor& o, const char* why) {
  kb.same_size(lse, 0, o, 0, why);
  kb.same_size(lse, 1, o, 2, why);
  kb.same_size(lse, 2, o, 1, why);
}

}  // namespace

const Kernel& attention_cp_merge() {
  static const Kernel kern = kernel("attention_cp_merge", [](Builder& kb) {
    const CpPartialConfig cfg = CpPartialConfig::read(kb);
    auto O_acc = kb.tensor("O_acc", f32, 4, kRows), LSE_acc = kb.tensor("LSE_acc", f32, 3, kLse);
    auto O_part = kb.tensor("O_part", cfg.dtype, 4, kRows), LSE_part = kb.tensor("LSE_part", f32, 3, kLse);
    same_sizes(kb, O_part, O_acc, "O_part's [B, S, H, D] and O_acc's");
    lse_of(kb, LSE_acc, O_acc, "LSE_acc's [B, H, S] and O_acc's [B, S, H, D]");
    lse_of(kb, LSE_part, O_acc, "LSE_part's [B, H, S] and O_acc's [B, S, H, D]");
    const RowBlock at{cfg.block_m, cfg.head_dim};
    Tile o_part = cast(f32, load(at.o(O_part))), lse_part = load(at.lse(LSE_part), -INFINITY);
    if (cfg.first) {
      store(at.o(O_acc), o_part);
      store(at.lse(LSE_acc), lse_part);
      return;
    }
    Tile lse_acc = load(at.lse(LSE_acc), -INFINITY);
    // both -inf: m = 0 makes both weights exp(-inf) = 0, never exp(-inf - -inf) = NaN
    Tile m = maximum(lse_acc, lse_part);
    m = where(m == -INFINITY, 0.0f, m);
    Tile w_acc = exp2((lse_acc - m) * kLog2e), w_part = exp2((lse_part - m) * kLog2e);
    Tile total = w_acc + w_part;  // in [1, 2], or 0 when both are -inf (log2: the row stays -inf)
    Tile inv = rcp(maximum(total, 1.0f));  // within 1 ulp; 0 / 1 = 0 weights for an empty row
    store(at.o(O_acc), load(at.o(O_acc)) * (w_acc * inv)[col] + o_part * (w_part * inv)[col]);
    // The LSE last: its [BM] row vector is held (and loaded) by several warps, and nothing orders
    // one warp's store before another warp's load of the same row -- stored first, the GPU merged
    // some rows with their new LSE (different bits each run; the ring at W = 4 measured 10x the
    // single-GPU error). After the O store, it follows the broadcast's exchange (a CTA barrier
    // that every warp reaches after its loads). The lowering should order this itself (NOTES).
    store(at.lse(LSE_acc), m + log2(total) * kLn2);
  });
  return kern;
}

const Kernel& attention_cp_accumulate() {
  static const Kernel kern = kernel("attention_cp_accumulate", [](Builder& kb) {
    const CpPartialConfig cfg = CpPartialConfig::read(kb);
    auto acc = kb.tensor("acc", f32, 4, kRows), part = kb.tensor("part", cfg.dtype, 4, kRows);
    same_sizes(kb, part, acc, "part's [B, S, H, D] and acc's");
    const RowBlock at{cfg.block_m, cfg.head_dim};
    Tile p = cast(f32, load(at.o(part)));
    store(at.o(acc), cfg.first ? p : load(at.o(acc)) + p);
  });
  return kern;
}

const Kernel& attention_cp_convert() {
  static const Kernel kern = kernel("attention_cp_convert", [](Builder& kb) {
    const CpConvertConfig cfg = CpConvertConfig::read(kb);
    auto src = kb.tensor("src", f32, 4, kRows), dst = kb.tensor("dst", cfg.dtype, 4, kRows);
    same_sizes(kb, dst, src, "dst's [B, S, H, D] and src's");
    const RowBlock at{cfg.block_m, cfg.head_dim};
    store(at.o(dst), cast(cfg.dtype, load(at.o(src))));
  });
  return kern;
}

Meta CpPartialConfig::to_meta() const {
  return Meta{{mn::kDtype, dtype}, {mn::kHeadDim, head_dim}, {mn::kBlockM, block_m}, {mn::kFirst, first}};
}

CpPartialConfig CpPartialConfig::read(Builder& kb) {
  CpPartialConfig c;
  c.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  c.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  c.block_m = kb.meta<int>(mn::kBlockM, static_cast<int>(cp_block_m(c.head_dim)));
  c.first = kb.meta<bool>(mn::kFirst, false);
  check_metas(kb, c.dtype, c.head_dim, c.block_m);
  return c;
}

Meta CpConvertConfig::to_meta() const { return Meta{{mn::kDtype, dtype}, {mn::kHeadDim, head_dim}, {mn::kBlockM, block_m}}; }

CpConvertConfig CpConvertConfig::read(Builder& kb) {
  CpConvertConfig c;
  c.dtype = kb.meta_dtype(mn::kDtype, ir::DType::bf16);
  c.head_dim = kb.meta<int>(mn::kHeadDim, 64);
  c.block_m = kb.meta<int>(mn::kBlockM, static_cast<int>(cp_block_m(c.head_dim)));
  check_metas(kb, c.dtype, c.head_dim, c.block_m);
  return c;
}

}  // namespace tilejit::kernels
