// Attention forward: for a block of query rows, stream key/value blocks, keep the running row
// max m, row sum l and output accumulator, rescaling by exp2(m_old - m_new) as the max grows.
// Variable-length batches (VARLEN) run the same code on views: sequence b is the slice of the
// packed tokens [cu_seqlens[b], cu_seqlens[b + 1]), and windows are bounds-checked against it.
#include "kernels/attention/forward.hpp"

#include <cmath>
#include <fmt/format.h>

#include <functional>
#include <optional>
#include <tuple>
#include <utility>

#include "kernels/attention/mask.hpp"
#include "kernels/philox.hpp"
#include "kernels/attention/program_order.hpp"

namespace tilejit::kernels {

using namespace lang;

AttentionDropout::AttentionDropout(Builder& kb)
    : seed_lo(kb.scalar<uint32_t>("seed_lo")),
      seed_hi(kb.scalar<uint32_t>("seed_hi")),
      offset_lo(kb.scalar<uint32_t>("offset_lo")),
      offset_hi(kb.scalar<uint32_t>("offset_hi")),
      keep_threshold(kb.scalar<uint32_t>("keep_threshold")),
      // threshold 0 (everything dropped) gives inf here, but it only scales kept values. rcp, not
      // '/': a division's slow path is a subroutine call, and ptxas then serialises every wgmma
      scale(256.0f * rcp(cast(f32, keep_threshold))) {}

bool AttentionDropout::precomputed_meta(Builder& kb, bool dropout, bool varlen, int64_t block_n) {
  // DROPOUT_BITS: read the keep-mask, precomputed and packed by the dropout_mask kernel (the same
  // bits), instead of generating it: issue 7's "precomputed" RNG, e.g. overlapped with a GEMM.
  const bool precomputed = kb.meta<bool>("DROPOUT_BITS", false);
  if (precomputed && (!dropout || varlen))
    kb.fail(Loc::current(), "DROPOUT_BITS reads a precomputed mask: it needs DROPOUT=true and dense (not VARLEN) tensors");
  if (precomputed && block_n % 32 != 0)
    kb.fail(Loc::current(), fmt::format("DROPOUT_BITS needs BLOCK_N to be a multiple of 32 (whole mask words), got {}", block_n));
  return precomputed;
}

void AttentionDropout::declare_bits(Builder& kb) {
  bits = kb.tensor("dropout_bits", u32, 3, {.align_bytes = 4, .contiguous_last = true});
}

Tile AttentionDropout::keep(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0, int64_t num_cols) const {
  return keep_mask(batch_head, row0, num_rows, col0, num_cols) != 0u;
}

AttentionDropout::Ahead AttentionDropout::keep_ahead(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                                    int64_t num_cols) const {
  if (bits.descriptor().valid()) return {std::nullopt, precompute(bits_words(batch_head, row0, num_rows, col0, num_cols))};
  if (num_cols % 64 != 0) return {};  // (per element at the use)
  return {dropout_keep_calls(batch_head, row0 + arange(0, num_rows), col0, num_cols, seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold),
          Tile()};
}

Tile AttentionDropout::keep_mask_of(const Ahead& ahead, const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                    int64_t num_cols) const {
  if (ahead.words.valid()) return expand_keep_words(ahead.words, num_rows, num_cols);
  return ahead.calls ? dropout_keep_mask_of(*ahead.calls) : keep_mask(batch_head, row0, num_rows, col0, num_cols);
}

Tile AttentionDropout::keep_pairs_of(const Ahead& ahead, const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                     int64_t num_cols) const {
  if (ahead.words.valid()) return expand_keep_word_pairs(ahead.words, num_rows, num_cols);
  if (ahead.calls) return dropout_keep_pairs_of(*ahead.calls);
  if (bits.descriptor().valid()) return expand_keep_word_pairs(bits_words(batch_head, row0, num_rows, col0, num_cols), num_rows, num_cols);
  return dropout_keep_pairs_block(batch_head, row0 + arange(0, num_rows), col0, num_cols, seed_lo, seed_hi, offset_lo, offset_hi,
                                  keep_threshold);
}

Tile AttentionDropout::keep_mask(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0, int64_t num_cols) const {
  if (!bits.descriptor().valid())
    return dropout_keep_mask_block(batch_head, row0 + arange(0, num_rows), col0, num_cols, seed_lo, seed_hi, offset_lo, offset_hi,
                                   keep_threshold);
  return expand_keep_words(bits_words(batch_head, row0, num_rows, col0, num_cols), num_rows, num_cols);
}

Tile AttentionDropout::bits_words(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0, int64_t num_cols) const {
  // past the end: 0 (dropped). Read at the use, in the score block's layout: no shared-memory exchange.
  return load_at_use(bits.block({batch_head, row0, col0 / 32}, {num_rows, num_cols / 32}));
}

Tile AttentionDropout::keep_mask_transposed(const Tile& batch_head, const Tile& row0, int64_t num_rows, const Tile& col0,
                                            int64_t num_cols) const {
  if (bits.descriptor().valid() || num_cols % 64 != 0) return trans(keep_mask(batch_head, row0, num_rows, col0, num_cols));
  // Fused: the packed words of the block, computed in their own layout (dropout_keep_words ends in
  // a reduction, whose layout is a concrete one where each thread owns whole Philox calls), then
  // moved through shared memory into the transposed block's layout and expanded there. Generated
  // in the transposed layout instead, a thread would compute 16 calls a 64 x 64 block and use 2
  // bytes of each (its keys are rows, and one call covers 16 keys of one query row).
  Tile words = dropout_keep_words(batch_head, row0 + arange(0, num_rows), col0 / 32, num_cols / 32, seed_lo, seed_hi, offset_lo,
                                  offset_hi, keep_threshold);
  return trans(expand_keep_words(words, num_rows, num_cols));
}

Tile expand_keep_words(const Tile& words, int64_t num_rows, int64_t num_cols) {
  // Column 32 w + 8 k + b: the word shifted so that bit 8 k + b lands on bit 7 of byte k (one
  // shift serves the 4 columns of each b), then one prmt replicates that bit into all 32. (Shifts
  // alone -- to the sign, then arithmetically back -- make a value LLVM knows is 0 or ~0, and it
  // turns the AND with it back into a select, which it then sinks past the bf16 conversion.)
  auto b = reshape(cast(u32, arange(0, 8)), {1, 1, 1, 8}), k = reshape(cast(u32, arange(0, 4)), {1, 1, 4, 1});
  auto up = reshape(words, {num_rows, num_cols / 32, 1, 1}) << (7u - b);
  return reshape(byte_perm(up, 0u, (k | 8u) * 0x1111u), {num_rows, num_cols});
}

Tile expand_keep_word_pairs(const Tile& words, int64_t num_rows, int64_t num_cols) {
  // Pair 16 w + 4 k + t = columns 32 w + 8 k + 2 t + {0, 1}: the word shifted so that bit 8 k + 2 t
  // lands on bit 7 of byte k (one shift serves the 4 pairs of each t), and shifted once more for
  // bit 8 k + 2 t + 1; one prmt replicates the first into bytes 0-1 and the second into bytes 2-3.
  auto t = reshape(cast(u32, arange(0, 4)), {1, 1, 1, 4}), k = reshape(cast(u32, arange(0, 4)), {1, 1, 4, 1});
  auto w = reshape(words, {num_rows, num_cols / 32, 1, 1});
  auto low = w << (7u - 2u * t), high = w << (6u - 2u * t);
  return reshape(byte_perm(low, high, (k | 8u) * 0x11u + ((k + 4u) | 8u) * 0x1100u), {num_rows, num_cols / 2});
}

const Kernel& attention_forward() {
  static const Kernel k = kernel("attention_fwd", [](Builder& kb) {
    auto T = kb.meta_dtype("DTYPE", bf16);
    auto BM = kb.meta<int>("BLOCK_M", 64), BN = kb.meta<int>("BLOCK_N", 64), D = kb.meta<int>("HEAD_DIM", 64);
    auto causal = kb.meta<bool>("CAUSAL", false);
    // MASK (issue 8): a library mask (kernels/attention/mask.hpp); causal is the CAUSAL path.
    const MaskKind mask_kind = mask_kind_meta(kb);
    if (mask_kind == MaskKind::causal) causal = true;
    const bool general_mask = mask_kind != MaskKind::full && mask_kind != MaskKind::causal;
    // BSHD: tensors are [batch, seq, heads, head_dim] (else [batch, heads, seq, head_dim]).
    auto bshd = kb.meta<bool>("BSHD", false);
    // VARLEN: packed sequences, [total, heads, head_dim], with cumulative offsets per sequence.
    auto varlen = kb.meta<bool>("VARLEN", false);
    if (varlen && bshd)
      kb.fail(Loc::current(), "VARLEN tensors are [total_tokens, heads, head_dim]; BSHD does not apply to them");
    if (general_mask && (causal || varlen))
      kb.fail(Loc::current(), fmt::format("MASK={} ({}) does not combine with {} (use the mask alone; document masks cover packed "
                                          "sequences)", static_cast<int>(mask_kind), mask_kind_name(mask_kind),
                                          causal ? "CAUSAL=true" : "VARLEN=true"));
    // DROPOUT: O = dropout(softmax(S)) V (Philox keep-mask of logical coordinates, kernels/philox.hpp);
    // RETURN_MASK (tests): also write the keep bits of every visited block.
    auto dropout = kb.meta<bool>("DROPOUT", false), return_mask = kb.meta<bool>("RETURN_MASK", false);
    if (return_mask && !dropout) kb.fail(Loc::current(), "RETURN_MASK returns the dropout mask: it needs DROPOUT=true");
    auto dropout_bits = AttentionDropout::precomputed_meta(kb, dropout, varlen, BN);
    // PINGPONG: the two warpgroups of an 8-warp program take turns issuing their MMAs
    // (lang::warpgroup_turn, FlashAttention-3's schedule), so one's softmax (and dropout) runs
    // while the other's MMAs do; without it both wait for the same K block and run in step.
    auto pingpong = kb.meta<bool>("PINGPONG", false);
    auto in_turn = [pingpong](const std::function<void()>& issue) {
      if (pingpong) warpgroup_turn(issue);
      else issue();
    };
    // EXACT_NORMALIZE: O = acc / l by IEEE division instead of acc * rcp(l). A division's slow path
    // is a subroutine call, and nvJitLink's ptxas then serialises every wgmma (C7509): measured on
    // H100 (S4k, bf16), that is slower at D128 (475 vs 547 TFLOP/s) and at D64 with dropout (223 vs
    // 262), yet faster at D64 without (434 vs 340): the default there.
    auto exact_normalize = kb.meta<bool>("EXACT_NORMALIZE", static_cast<int64_t>(D) == 64 && !dropout);
    const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
    const int rank = varlen ? 3 : 4;
    auto Q = kb.tensor("Q", T, rank, row_major), K = kb.tensor("K", T, rank, row_major), V = kb.tensor("V", T, rank, row_major);
    auto O = kb.tensor("O", T, rank, row_major);
    auto LSE = kb.tensor("LSE", f32, rank - 1, {.contiguous_last = true});  // [batch, heads, seq_q] or [heads, total_q]
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    Tile cu_q, cu_k;  // VARLEN: i32[batch + 1] offsets of the sequences in the packed tokens
    if (varlen) cu_q = kb.pointer("cu_seqlens_q", i32), cu_k = kb.pointer("cu_seqlens_k", i32);
    std::optional<AttentionDropout> drop;  // DROPOUT: the trailing seed/offset/threshold scalars
    if (dropout) drop.emplace(kb);
    Tensor mask;  // RETURN_MASK: u8 [batch * heads_q, seq_q, seq_k]
    if (return_mask) mask = kb.tensor("dropout_mask", u8, 3, {.contiguous_last = true});
    if (dropout_bits) drop->declare_bits(kb);  // u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)]
    // MASK: the mask's parameters, then (masks without tile intervals) the pre-pass's lists
    std::optional<AttentionMask> amask;
    std::optional<BlockMaskLists> lists;
    if (general_mask) {
      amask.emplace(kb, mask_kind);
      if (!amask->has_tile_intervals()) lists.emplace(kb, /*kv_major=*/false);
    }
    // SCORE_MOD (issue 8): a library score mod (ALiBi, tanh soft-capping) on the natural-unit scores
    // q . k * softmax_scale before masking and the softmax; its parameter comes last.
    const AttentionScoreMod score_mod(kb, score_mod_kind_meta(kb));
    const bool modded = score_mod.kind != ScoreModKind::none;
    // PIPELINE_QK: issue the next block's S = Q K^T before this block's softmax, so that the
    // tensor cores work on it while the softmax (and dropout) run; one more S tile in registers.
    // Measured on H100 S4k (two runs) once ptxas no longer serialised its wgmmas (C7514, see
    // jit/lower.cpp's carried copies): D128 1.04-1.05x full / 1.02x causal without dropout, 0.89x
    // with fused dropout, 0.93-0.97x reading bits; D64 0.70x (214 registers: one program per SM
    // instead of two).
    // PIPELINE_PV: FlashAttention-3's intra-warpgroup overlap. Iteration j issues S_j = Q K_j^T and
    // then P_{j-1} V_{j-1} (the previous block's probabilities, carried in registers), and runs
    // block j's softmax while the tensor cores work on P_{j-1} V_{j-1}; the last block's P V
    // follows the loop. Same arithmetic, in the same order, as without it.
    // Both (FlashAttention-3's full intra-warpgroup overlap): iteration j issues S_{j+1} and
    // P_{j-1} V_{j-1}, then runs block j's softmax while both MMAs are in flight: over PIPELINE_QK
    // alone 1.027-1.028x full, 1.036-1.040x causal at D128 (two runs), but 255 registers with
    // 48-56 B of spills (136 B through nvrtc) and 224 KB of shared memory: not the default.
    // PIPELINE_QK alone is the default at D128 without dropout on dense full/causal blocks without
    // a score mod (masks, varlen and mods unmeasured; with dropout and at D64 it is slower).
    auto pipeline_qk = kb.meta<bool>("PIPELINE_QK", static_cast<int64_t>(D) == 128 && !dropout && !general_mask && !varlen && !modded);
    auto pipeline_pv = kb.meta<bool>("PIPELINE_PV", false);
    // POSITIVE_SCALE: the caller promises softmax_scale > 0, so the row max can be taken over the
    // raw scores q . k and each probability is exp2(fma(s, scale log2 e, -max scale log2 e)): one
    // FFMA an element instead of a multiply and a subtract (FlashAttention-3's softmax). A scale
    // <= 0 breaks the promise (the max of raw scores is then the min of scaled ones): the kernel
    // then writes NaN, never a silently wrong output. Not with a score mod (it needs scaled scores).
    auto positive_scale = kb.meta<bool>("POSITIVE_SCALE", false);
    // (default: on when reading the packed mask -- its word loads then overlap S's MMA: H100 S4k
    // +1-10% -- off for fused Philox, measured 0.89-0.95x)
    const bool dropout_ahead = kb.meta<bool>("DROPOUT_AHEAD", dropout_bits);
    // DROPOUT_PAIRS (default): the keep-mask applied to the rounded 16-bit probabilities two at a
    // time (AttentionDropout::keep_pairs_of, apply_keep_pairs); false: per element on the f32
    // ones. The same bits either way; pairs take half the mask instructions.
    const bool dropout_pairs = kb.meta<bool>("DROPOUT_PAIRS", true);
    if (positive_scale && modded) kb.fail(Loc::current(), "POSITIVE_SCALE takes no SCORE_MOD: the mod needs the scaled scores");

    const int seq_dim = varlen ? 0 : bshd ? 1 : 2, head_dim = varlen ? 1 : bshd ? 2 : 1;
    // Causal: the last query blocks see the most keys; start them first so that the light ones
    // fill the tail of the grid instead of the heavy ones. HEAVY_FIRST_SECTIONS (default, dense
    // causal): across heads too, in L2-sized sections of heads (kernels/attention/program_order.hpp); else
    // within each head only. H100, one process, alternated rounds: 1.05-1.09x at S 4k / 8k (D 64 /
    // 128), 1.01-1.05x at S 16k.
    const bool sections = kb.meta<bool>("HEAVY_FIRST_SECTIONS", true) && causal && !varlen;
    Tile m_block = causal ? num_programs(0) - 1 - program_id(0) : program_id(0);
    Tile h = program_id(1), b = program_id(2);
    if (sections) {
      const GridSlot slot = heavy_first_sections(/*heavy_at_end=*/true, K.size(seq_dim), 2 * D * ir::byte_size(T));  // K and V rows
      m_block = slot.tile, h = slot.head, b = slot.batch;
    }
    if (amask) std::tie(m_block, h) = amask->program_order(BM, m_block, h);  // heavy query blocks first
    auto m0 = m_block * BM;
    // Sequence b of each tensor: the tensor itself, or with VARLEN the view of its tokens
    // [cu[b], cu[b + 1]) along `dim` (i32 offsets, B + 1 of them).
    auto sequence_of = [&](const Tile& cu) {
      Tile start = load(cu + b), length = load(cu + (b + 1)) - start;
      return [=](const Tensor& t, int dim) { return t.slice(dim, start, length); };
    };
    Tensor Qs = Q, Ks = K, Vs = V, Os = O, LSEs = LSE;
    if (varlen) {
      auto q_seq = sequence_of(cu_q), k_seq = sequence_of(cu_k);
      Qs = q_seq(Q, 0), Os = q_seq(O, 0), LSEs = q_seq(LSE, 1), Ks = k_seq(K, 0), Vs = k_seq(V, 0);
    }
    auto S_q = Qs.size(seq_dim), S_k = Ks.size(seq_dim);
    // grouped-query attention: query heads h of one group share key/value head h / group
    auto kv_h = h / (Q.size(head_dim) / K.size(head_dim));
    // the per-(batch, head) windows: rows [s0, s0 + n) of head `hh` in each layout (LSE: [n])
    auto rows_of = [&](const Tensor& t, const Tile& hh, const Operand& s0, int64_t n) {
      if (t.rank() == rank - 1) return varlen ? t.block({hh, s0}, {n}) : t.block({b, hh, s0}, {n});
      if (varlen) return t.block({s0, hh, 0}, {n, D}, {0, 2});
      return bshd ? t.block({b, s0, hh, 0}, {n, D}, {1, 3}) : t.block({b, hh, s0, 0}, {n, D}, {2, 3});
    };
    Tile qk_scale = softmax_scale * 1.4426950408889634;  // log2(e): exp(x) = exp2(x * log2 e)
    if (positive_scale) qk_scale = where(softmax_scale > 0.0f, qk_scale, NAN);  // the broken promise: NaN
    // Causal masks align the last query with the last key (FlashAttention's convention when
    // S_q != S_k): row i sees keys j <= i + (S_k - S_q).
    auto diag = S_k - S_q;
    // DROPOUT: the mask's coordinates are (bh = b * heads_q + h, row within the sequence, key)
    Tile bh;
    if (dropout) bh = b * Q.size(head_dim) + h;
    Tile n_end = causal ? minimum(S_k, m0 + BM + diag) : S_k;
    // a program past its (shorter) sequence's end reads no key; its stores fall outside the view
    if (varlen) n_end = where(m0 < S_q, n_end, 0);
    // RNG_WARPS = w > 0 (fused dropout, full or causal, dense): warp specialisation. w more warps
    // (a warp role, lang::warp_roles) run the Philox calls of each key block's keep-mask, as the
    // packed words the dropout_mask kernel writes, and pass them through a two-slot shared-memory
    // channel; the MMA warps read them as with DROPOUT_BITS. The same bits. The launch has
    // num_warps = the MMA warps + w; MMA_REGISTERS / RNG_REGISTERS (both or neither) move registers
    // between the roles (setmaxnreg: 12 warps start with 168 a thread).
    const int64_t rng_warps = kb.meta<int>("RNG_WARPS", 0);
    const int64_t mma_registers = rng_warps ? kb.meta<int>("MMA_REGISTERS", 0) : 0, rng_registers = rng_warps ? kb.meta<int>("RNG_REGISTERS", 0) : 0;
    if (rng_warps && (!dropout || dropout_bits || general_mask || varlen || pingpong || BN % 64 != 0))
      kb.fail(Loc::current(), fmt::format("RNG_WARPS = {} generates the fused dropout mask on warps of its own: it needs DROPOUT=true "
                                          "without DROPOUT_BITS, a full or causal mask, dense tensors, no PINGPONG and BLOCK_N a multiple "
                                          "of 64 (got BLOCK_N = {})", rng_warps, BN));
    std::optional<Channel> keep_words;  // u32 [BM, BN / 32] per key block
    if (rng_warps) keep_words.emplace(u32, ir::Shape{BM, BN / 32}, 2);
    auto mma_role = [&] {
      auto rows = m0 + arange(0, BM);

      auto q = load(rows_of(Qs, h, m0, BM));
      Var acc = zeros(f32, {BM, D});
      Var m = full(f32, {BM}, -INFINITY);  // running row max (log2 units; POSITIVE_SCALE: raw q . k units)
      Var l = zeros(f32, {BM});            // running row sum of exp2
      std::optional<SequenceMask> seq;
      if (general_mask) seq = amask->bind(b, h, S_q, S_k);
      // S = Q K^T of the key block at n0 (unscaled).
      auto scores = [&](const Tile& n0) { return dot(q, trans(load(rows_of(Ks, kv_h, n0, BN)))); };
      // One key block given its scores: masked only when `partial` (a uniform branch: blocks entirely
      // inside the mask skip the per-element compare and select), then the online softmax update.
      // Returns P (of dtype T, dropped elements zeroed) and the rescale factor alpha of the output.
      auto softmax_block = [&](const Tile& n0, const Tile& partial, const Tile& s_raw, const AttentionDropout::Ahead& ahead) {
        Var s = modded ? score_mod.mod(s_raw * softmax_scale, mask_indices(b, h, rows, n0 + arange(0, BN), S_q, S_k)) * 1.4426950408889634
                       : positive_scale ? s_raw : s_raw * qk_scale;
        if_(partial, [&] {
          auto cols = n0 + arange(0, BN);
          Tile valid = cols[row] < S_k;
          if (causal) valid = valid & (cols[row] <= rows[col] + diag);
          if (general_mask) valid = valid & seq->allowed(rows, cols);
          s = where(valid, s, -INFINITY);
        });
        auto m_new = maximum(m, max(s, 1));
        // rows with no visible key so far keep m = -inf: exponentiate against 0 instead of -inf
        auto m_use = where(m_new == -INFINITY, 0.0f, m_new);
        Tile p = positive_scale ? exp2(fma(s, qk_scale, (-(m_use * qk_scale))[col])) : exp2(s - m_use[col]);
        Tile alpha = positive_scale ? exp2((m - m_use) * qk_scale) : exp2(m - m_use);
        l = l * alpha + sum(p, 1);  // the undropped row sum: LSE is that of softmax(S)
        Tile p16;
        if (dropout && dropout_pairs) {
          // the 1 / keep probability scale is uniform: applied once to the output, not per element.
          // Dropped probabilities zeroed after rounding, a pair at a time: one prmt and one AND per
          // two elements (the same bits as zeroing the f32 values: +0 either way).
          Tile pairs = drop->keep_pairs_of(ahead, bh, m0, BM, n0, BN);
          p16 = apply_keep_pairs(cast(T, p), pairs);
          if (return_mask) store(mask.block({bh, m0, n0}, {BM, BN}), cast(u8, unpack_pairs(u16, pairs) & 1));
        } else if (dropout) {
          // per element: an AND with a 0 / ~0 mask, not where() (LLVM sinks a select past the bf16
          // conversion)
          Tile keep = drop->keep_mask_of(ahead, bh, m0, BM, n0, BN);
          p16 = cast(T, apply_keep_mask(p, keep));
          if (return_mask) store(mask.block({bh, m0, n0}, {BM, BN}), cast(u8, keep & 1u));
        } else {
          p16 = cast(T, p);
        }
        m = m_new;
        return std::pair{p16, alpha};
      };
      // ... then O = O * alpha + P V: rescaled, then accumulated onto by the MMA (its own
      // accumulator: no separate add).
      // DROPOUT_AHEAD: the block's mask inputs right after issuing its S = Q K^T and before anything
      // waits for it, to run while the tensor cores compute S: fused, its Philox calls (measured
      // slower on H100, D64/D128 S4k, bit-identical outputs: 0.89-0.92x, with the commit fenced so
      // that they do not delay the wgmmas' issue); DROPOUT_BITS, the loads of its packed words (their
      // latency then overlaps the MMA instead of the softmax: the default there).
      // RNG_WARPS: the block's words from the RNG role, read here (a channel pop reads where it
      // stands, in the layout of its use).
      auto mask_ahead = [&](const Tile& n0, const Tile& j) {
        if (keep_words) return AttentionDropout::Ahead{std::nullopt, keep_words->pop(j)};
        return drop && dropout_ahead ? drop->keep_ahead(bh, m0, BM, n0, BN) : AttentionDropout::Ahead{};
      };
      auto key_block = [&](const Tile& n0, const Tile& partial, const Tile& s_raw, const AttentionDropout::Ahead& ahead) {
        auto [p16, alpha] = softmax_block(n0, partial, s_raw, ahead);
        Tile v = load(rows_of(Vs, kv_h, n0, BN)), rescaled = acc * alpha[col];
        in_turn([&] { acc = dot(p16, v, rescaled); });
      };
      // The key blocks this query block visits, as one flat loop j = 0 .. trips - 1 (one loop, so the
      // K/V ring prefetches across all of them: block j's start is a function of j alone):
      // block_at(j) = (n0, partial).
      Tile trips;
      std::function<std::pair<Tile, Tile>(const Tile&)> block_at;
      if (!general_mask) {
        // Only a block that crosses the last key or (causal) the first row's diagonal needs a mask.
        trips = cdiv(n_end, BN);
        block_at = [&](const Tile& j) {
          Tile n0 = j * BN, edge = n0 + BN > S_k;
          if (causal) edge = edge | (n0 + BN - 1 > m0 + diag);
          return std::pair{n0, edge};
        };
      } else if (lists) {
        // From the pre-pass's lists: the partial blocks, then the full ones.
        Tile pc = lists->partial_count(b, h, m_block), fc = lists->full_count(b, h, m_block);
        trips = pc + fc;
        block_at = [&, pc](const Tile& j) {
          Tile partial = j < pc;
          Tile index = where(partial, lists->partial_block(b, h, m_block, minimum(j, maximum(pc - 1, 0))),
                             lists->full_block(b, h, m_block, maximum(j - pc, 0)));
          Tile n0 = index * BN;
          return std::pair{n0, partial | (n0 + BN > S_k)};
        };
      } else {
        // From the mask's key-tile intervals (scalar arithmetic): one or two runs of blocks.
        const TileRanges r = seq->key_tiles(m0, BM, BN);
        Tile trips0 = cdiv(maximum(r.end[0] - r.begin[0], 0), BN);
        trips = r.runs == 2 ? trips0 + cdiv(maximum(r.end[1] - r.begin[1], 0), BN) : trips0;
        block_at = [&, r, trips0](const Tile& j) {
          Tile n0 = r.runs == 2 ? where(j < trips0, r.begin[0] + j * BN, r.begin[1] + (j - trips0) * BN) : r.begin[0] + j * BN;
          return std::pair{n0, (!seq->tile_is_full(m0, BM, n0, BN)) | (n0 + BN > S_k)};
        };
      }
      if (pipeline_pv) {
        // P_{-1} = 0: iteration 0's P V adds nothing (0 V, V being the first visited block). The
        // output is rescaled at the end of an iteration, once that iteration's P V has landed (as
        // FlashAttention-3 does): rescaling at the next iteration's top, with S_j in flight, makes
        // ptxas wait for every MMA there (C7517). With PIPELINE_QK too, S_j is carried from the
        // previous iteration (the prologue issues S_0) and the iteration issues S_{j+1} (the last
        // one a spare S of its own block, as PIPELINE_QK alone does).
        Var s_cur = pipeline_qk ? scores(block_at(zeros(i32, {})).first) : zeros(f32, {});
        Var p_prev = zeros(T, {BM, BN});
        for_range(0, trips, [&](Tile j) {
          auto [n0, partial] = block_at(j);
          // The K block first: the dots are issued in their operands' order, and S must go first (a
          // softmax waits for its S alone, while P_{j-1} V_{j-1} stays in flight). V_{j-1} from the
          // counter (not a carried value): the ring then prefetches it like the K block.
          Tile k_block = load(rows_of(Ks, kv_h, pipeline_qk ? block_at(minimum(j + 1, maximum(trips - 1, 0))).first : n0, BN));
          Tile v = load(rows_of(Vs, kv_h, block_at(maximum(j - 1, 0)).first, BN));
          Tile s_raw = pipeline_qk ? Tile(s_cur) : Tile();
          in_turn([&] {
            Tile s = dot(q, trans(k_block));
            if (pipeline_qk) s_cur = s;
            else s_raw = s;
            acc = dot(p_prev, v, acc);
          });
          auto [p16, alpha] = softmax_block(n0, partial, s_raw, mask_ahead(n0, j));
          p_prev = p16;
          acc = acc * alpha[col];
        });
        acc = dot(p_prev, load(rows_of(Vs, kv_h, block_at(maximum(trips - 1, 0)).first, BN)), acc);
      } else if (pipeline_qk) {
        // S of block j + 1 is issued before block j's softmax (the last iteration recomputes its own
        // block's: one spare MMA instead of a branch, which would wait for every MMA in flight).
        Var s_next = scores(block_at(zeros(i32, {})).first);
        for_range(0, trips, [&](Tile j) {
          auto [n0, partial] = block_at(j);
          Tile s_raw = s_next;
          s_next = scores(block_at(minimum(j + 1, maximum(trips - 1, 0))).first);
          key_block(n0, partial, s_raw, mask_ahead(n0, j));
        });
      } else {
        for_range(0, trips, [&](Tile j) {
          auto [n0, partial] = block_at(j);
          Tile s_raw;
          in_turn([&] { s_raw = scores(n0); });
          key_block(n0, partial, s_raw, mask_ahead(n0, j));
        });
      }
      // A row that sees no key (causal with S_q > S_k, or S_k = 0) outputs 0 and LSE = -inf.
      // A NaN row sum (NaN or infinite inputs, or POSITIVE_SCALE's broken promise) stays NaN, as in
      // PyTorch's attention: `seen` only tells key-less rows (l = 0) apart.
      auto seen = (l > 0.0f) | (l != l);
      Tile out = exact_normalize ? acc / l[col] : acc * rcp(l)[col];
      if (dropout) out = out * drop->scale;
      store(rows_of(Os, h, m0, BM), cast(T, where(seen[col], out, 0.0f)));
      Tile m_log2 = positive_scale ? m * qk_scale : Tile(m);
      store(rows_of(LSEs, h, m0, BM), where(seen, (m_log2 + log2(l)) * 0.6931471805599453, -INFINITY));  // natural log
    };
    if (!rng_warps) {
      mma_role();
    } else {
      warp_roles({{.warps = 0, .max_registers = static_cast<int>(mma_registers), .body = mma_role},
                  {.warps = static_cast<int>(rng_warps), .max_registers = static_cast<int>(rng_registers), .body = [&] {
                     for_range(0, cdiv(n_end, BN), [&](Tile j) {
                       keep_words->push(j, dropout_keep_words(bh, m0 + arange(0, BM), j * (BN / 32), BN / 32, drop->seed_lo, drop->seed_hi,
                                                              drop->offset_lo, drop->offset_hi, drop->keep_threshold));
                     });
                   }}});
    }
  });
  return k;
}

}  // namespace tilejit::kernels
