// histogram on the GPU. Up to kBallotBins bins, Triton's warp-level count (an algorithm by A. P.
// Goucher): a warp counts 32 elements at once. Every lane votes whether its element lies in the
// bins and on each bit of its bin; the lane owning bin j ANDs the votes (or their complements)
// that spell j and counts the set bits. Lane l owns bins l, l + 32, l + 64, ...: the low five bits
// of j are the lane's (one XOR and AND per bit, the XOR mask computed once), the higher ones are
// known per owned bin. The warps' counts meet in shared memory. About log2(bins) + 1 ballots per 32
// elements where a one-hot compare and sum costs bins compares per element. Above kBallotBins the
// per-lane work per register (bins / 32 popcounts) outgrows one shared-memory atomic per element.
// Shared atomics below that too measured 1.4x faster on spread values but 2x slower when a warp's
// values coincide (decision 059): the ballots' time does not depend on the data.
#include <bit>

#include "jit/lower/lowerer.hpp"

namespace tilejit::jit::lower {
namespace {

constexpr int64_t kBallotBins = 1024;
constexpr int64_t kPerWarpBytes = 64 * 1024;  // 16 warps of 1024 bins

}  // namespace

void Lowerer::histogram(const ir::Op& op) {
  const ir::Type& in_t = f_.type(op.operands[0]);
  check_shape(&op, in_t);
  const int64_t bins = op.int_attr("num_bins");
  const Layout L = plan_.natural[op.operands[0]] ? *plan_.natural[op.operands[0]] : memory_layout(in_t);
  const Regs x = get(op.operands[0], L);
  const std::optional<V> owns = owner(L);  // an element several threads hold counts once
  // In range: v < bins unsigned, in 32 bits or (64-bit dtypes) 64: a negative value wraps above.
  const DType wide = ir::bit_width(in_t.dtype) > 32 ? DType::u64 : DType::u32;
  std::vector<std::pair<V, V>> elements;  // (in range, bin as u32) of each register that is no replica
  for (uint32_t r = 0; r < x.size(); ++r) {
    if (duplicate_reg(L, r)) continue;
    const V v = cast(x[r], wide);
    V in = cmp(pir::Pred::lt, v, cint(wide, bins));
    if (owns) in = land(in, *owns);
    elements.emplace_back(in, cast(v, DType::u32));
  }
  const Layout& O = *plan_.natural[op.results[0]];
  Regs out(static_cast<size_t>(O.num_regs()));
  const auto u32 = [&](int64_t c) { return cint(DType::u32, c); };

  // Each warp's counts at [warp][bin] in shared memory (one array for all warps where per-warp
  // ones would not fit): every output register sums its bin over the copies.
  const int copies = int64_t{warps_} * bins * 4 <= kPerWarpBytes ? warps_ : 1;
  reserve_smem(int64_t{copies} * bins * 4);
  const auto sum_copies = [&] {
    emit0(Op::barrier, {});
    for (uint32_t r = 0; r < out.size(); ++r) {
      const V j = tile_offset(O, r);
      V total = u32(0);
      for (int w = 0; w < copies; ++w)
        total = bin(Op::add, total, emit(Op::load_shared, pir::scalar(DType::u32), {bin(Op::mul, bin(Op::add, j, ci32(w * bins)), ci32(4))}));
      out[r] = cast(total, DType::i32);
    }
    emit0(Op::barrier, {});
    put(op.results[0], O, out);
  };
  const V copy_base = copies > 1 ? bin(Op::mul, warp_, ci32(bins)) : ci32(0);

  if (bins > kBallotBins || (op.has_attr("method") && op.str_attr("method") == "shared_atomics")) {
    // zeroed, then one relaxed atomic add per element (of 0 for those outside the bins)
    const int64_t threads = int64_t{32} * warps_, words = copies * bins;
    for (int64_t k = 0; k < std::max(words, threads); k += threads) {
      const V j = bin(Op::add, tid_, ci32(k));
      std::vector<V> args{bin(Op::mul, j, ci32(4)), u32(0)};
      if (words < threads) args.push_back(cmp(pir::Pred::lt, j, ci32(words)));
      emit0(Op::store_shared, args);
    }
    emit0(Op::barrier, {});
    for (const auto& [in, b] : elements) {
      const V at = bin(Op::mul, bin(Op::add, copy_base, cast(land(b, u32(bins - 1)), DType::i32)), ci32(4));
      emit(Op::atom_shared, pir::scalar(DType::u32), {emit(Op::smem_addr, pir::scalar(DType::u32), {scratch(at)}), cast(in, DType::u32)},
           pir::kAtomSharedCount);
    }
    sum_copies();
    return;
  }

  const int bits = std::countr_zero(static_cast<uint64_t>(bins));
  const int lane_bits = std::min(bits, 5);
  const int64_t owned = std::max<int64_t>(1, bins / 32);  // bins per lane
  // flip[i]: all ones where the lane's bit i is clear, so that vote ^ flip[i] has bit l set where
  // lane l's element agrees with this lane on bit i
  std::vector<V> flip;
  for (int i = 0; i < lane_bits; ++i) {
    const V lane_bit = cast(land(bin(Op::shr, lane_, ci32(i)), ci32(1)), DType::u32);
    flip.push_back(bin(Op::sub, lane_bit, u32(1)));
  }
  std::vector<V> counts(static_cast<size_t>(owned), u32(0));
  for (const auto& [in, b] : elements) {
    V agree = emit(Op::ballot, pir::scalar(DType::u32), {in});
    std::vector<V> votes;
    for (int i = 0; i < bits; ++i)
      votes.push_back(emit(Op::ballot, pir::scalar(DType::u32), {cmp(pir::Pred::ne, land(b, u32(int64_t{1} << i)), u32(0))}));
    for (int i = 0; i < lane_bits; ++i) agree = land(agree, bin(Op::bit_xor, votes[static_cast<size_t>(i)], flip[static_cast<size_t>(i)]));
    for (int64_t m = 0; m < owned; ++m) {
      V hits = agree;
      for (int i = 5; i < bits; ++i) {
        const V vote = votes[static_cast<size_t>(i)];
        hits = land(hits, (m >> (i - 5)) & 1 ? vote : emit(Op::bit_not, pir::scalar(DType::u32), {vote}));
      }
      counts[static_cast<size_t>(m)] = bin(Op::add, counts[static_cast<size_t>(m)], emit(Op::popc, pir::scalar(DType::u32), {hits}));
    }
  }
  // lane l's counts at [warp][l + 32 m] (copies == warps: kPerWarpBytes holds kBallotBins per warp)
  for (int64_t m = 0; m < owned; ++m) {
    std::vector<V> args{bin(Op::mul, bin(Op::add, copy_base, bin(Op::add, lane_, ci32(32 * m))), ci32(4)), counts[static_cast<size_t>(m)]};
    if (bins < 32) args.push_back(cmp(pir::Pred::lt, lane_, ci32(bins)));
    emit0(Op::store_shared, args);
  }
  sum_copies();
}

}  // namespace tilejit::jit::lower
