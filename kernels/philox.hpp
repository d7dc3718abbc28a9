// Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32_R(10, ...)) as DSL library
// functions, and the attention dropout keep-mask built on it. Everything here records tile IR in
// the kernel being built (call from a kernel body); the host twin is kernels/philox_host.hpp.
//
// Dropout keep-mask scheme (identical in philox_host.hpp, the dropout_mask kernel and attention):
//   element (bh, i, j): bh = batch * heads_q + query head, i = query row, j = key column (logical
//   coordinates: the mask does not depend on tile sizes, warps or schedule);
//   with j = 64 q + 8 k + 2 t + e (e < 2, t < 4, k < 8): counter = {4 q + t, i, bh, offset_lo},
//   key = {seed_lo, seed_hi ^ offset_hi} (64-bit seed and offset; for a fixed seed, distinct
//   (offset, bh, i, 4 q + t) give distinct Philox inputs); one call's 128 bits serve the 16
//   columns 64 q + 8 k + 2 t + e, element j taking byte 2 k + e (bits 8 * (b % 4) + 0..7 of
//   output word b / 4) -- the columns one thread of a wgmma/mma accumulator holds, so that no
//   thread recomputes a call another thread needs;
//   kept iff that byte < keep_threshold, keep_threshold = round((1 - p) * 256) in [0, 256]
//   (kernels::dropout_keep_threshold(p)); effective keep probability keep_threshold / 256
//   (p = 0.1: 230 / 256 = 0.8984375, i.e. p_eff = 0.1015625), so scale kept values by
//   256 / keep_threshold for an unbiased dropout.
#pragma once
#include <array>
#include <cstdint>

#include "dsl/lang.hpp"

namespace tilejit::kernels {

// Philox4x32-10 on u32 tiles: 10 rounds of (hi, lo) = M * c (M0 = 0xD2511F53 on c0, M1 =
// 0xCD9E8D57 on c2), c = {hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0}, the key bumped by the Weyl
// constants (0x9E3779B9, 0xBB67AE85) between rounds. Inputs are tiles or scalars of any shapes
// that broadcast together (integer tiles other than u32 are cast, wrapping); the four outputs are
// u32 tiles of the broadcast shape, one Philox evaluation per element of that shape.
std::array<lang::Tile, 4> philox4x32_10(std::array<lang::Tile, 4> counter, std::array<lang::Tile, 2> key,
                                        lang::Loc loc = lang::Loc::current());

// A uniform f32 in [0, 1) from u32 bits: cast(f32, x >> 8) * 2^-24 (exact; 24-bit resolution,
// largest value 1 - 2^-24). Same shape as x.
lang::Tile uniform_f32(const lang::Operand& x, lang::Loc loc = lang::Loc::current());

// The Philox key and keep threshold of a dropout keep-mask as a kernel sees them: the u32 halves of
// the 64-bit seed and offset, and keep_threshold = round((1 - p) * 256) (the scheme above). The
// DSL twin of the host's kernels::PhiloxKey (kernels/attention/arguments.hpp), which fills these
// five parameters; every keep-mask function below takes one. Plain tiles: passing a key creates
// no ops.
struct DropoutKey {
  lang::Tile seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold;

  // Declares the five u32 scalar parameters seed_lo, seed_hi, offset_lo, offset_hi,
  // keep_threshold, then `rng_state` (u32 pointer: seed_lo, seed_hi, offset_lo, offset_hi, i.e. a
  // little-endian u64 [seed, offset]) and the u32 scalar `rng_state_in_memory`, in that order, at this
  // point of the kernel's parameter list. rng_state_in_memory != 0: seed and offset are read from
  // rng_state when the kernel runs (CUDA graphs), else they are the scalars (rng_state may be null).
  static DropoutKey declare(lang::Builder& kb);
};

// The dropout keep-mask (i1 [M, N], true = keep) of query rows `rows` (i32 [M]) and key columns
// `cols` (i32 [N], any values >= 0) of batch*heads index `batch_head` (i32 scalar) under `key`.
// General form: one Philox call per element (16x the work of dropout_keep_block, whose bits it
// reproduces exactly); for tests and ragged uses.
lang::Tile dropout_keep(const lang::Operand& batch_head, const lang::Tile& rows, const lang::Tile& cols, const DropoutKey& key,
                        lang::Loc loc = lang::Loc::current());

// The same mask for the contiguous key columns [col0, col0 + num_cols): i1 [M, num_cols]. One
// Philox call per 16 elements (on an [M, num_cols / 64, 4] tile) when num_cols is a multiple of
// 64 and col0 (i32 scalar, runtime) a multiple of 64 (not checked: e.g. a block start
// n0 = k * BLOCK_N with BLOCK_N >= 64); other widths take the per-element form (same bits).
// `dropout_keep_mask_block(...) != 0`: consumers that zero dropped values want that mask instead.
lang::Tile dropout_keep_block(const lang::Operand& batch_head, const lang::Tile& rows, const lang::Operand& col0, int64_t num_cols,
                              const DropoutKey& key, lang::Loc loc = lang::Loc::current());

// The same mask as u32 [M, num_cols]: 0xFFFFFFFF = keep, 0 = drop (arguments as
// dropout_keep_block). Built to be cheap per element: the SWAR keep flags of each Philox word (3
// ops per 4 elements, dropout_keep_flags) and one prmt (byte_perm) per element that spreads an
// element's flag over 32 bits; apply_keep_mask then zeroes dropped values with one AND. (A
// compare + select costs more, and LLVM sinks a select of floats past a bf16 conversion into
// 16-bit selects and repacking.)
lang::Tile dropout_keep_mask_block(const lang::Operand& batch_head, const lang::Tile& rows, const lang::Operand& col0, int64_t num_cols,
                                   const DropoutKey& key, lang::Loc loc = lang::Loc::current());

// The Philox calls of such a block, for consumers that take the mask in steps (num_cols a
// multiple of 64, col0 too): one call per (row, 64-column group q, lane slot t), the four outputs
// [M, num_cols / 64, 4] each. dropout_calls returns the raw outputs (flags = false), whose keep
// flags dropout_keep_mask_of / dropout_keep_pairs_of take at the use (only of the words they use);
// a caller may instead replace the words by their flags first (dropout_keep_flags, flags = true),
// e.g. under `precompute` where it has nothing else to issue (AttentionDropout::keep_ahead).
// dropout_keep_mask_block is dropout_keep_mask_of(dropout_calls(...)) for such blocks.
struct DropoutKeepCalls {
  std::array<lang::Tile, 4> words;
  bool flags = false;         // words are already the keep flags
  lang::Tile keep_threshold;  // (when not)
  int64_t num_rows = 0, num_cols = 0;
};
DropoutKeepCalls dropout_calls(const lang::Operand& batch_head, const lang::Tile& rows, const lang::Operand& col0, int64_t num_cols,
                               const DropoutKey& key, lang::Loc loc = lang::Loc::current());
// The per-element mask of the calls' block, as dropout_keep_mask_block: u32 [M, num_cols].
lang::Tile dropout_keep_mask_of(const DropoutKeepCalls& calls, lang::Loc loc = lang::Loc::current());

// The same mask for packed pairs of neighbouring columns: u32 [M, num_cols / 2], half h of word j
// 0xFFFF (keep) or 0 (drop) for column 2 j + h. The two flags of a pair sit in neighbouring bytes of
// one Philox output, so one prmt makes a pair's mask (dropout_keep_mask_of takes one per element);
// apply_keep_pairs then zeroes dropped 16-bit values with one AND per pair.
lang::Tile dropout_keep_pairs_of(const DropoutKeepCalls& calls, lang::Loc loc = lang::Loc::current());

// x (a 16-bit tile [M, N], e.g. probabilities rounded to bf16) with every element whose half of
// `pairs` (u32 [M, N / 2], from dropout_keep_pairs_of or expand_keep_word_pairs) is 0 set to +0:
// unpack_pairs(pack_pairs(x) & pairs). The same bits as zeroing the f32 values before rounding.
lang::Tile apply_keep_pairs(const lang::Tile& x, const lang::Tile& pairs, lang::Loc loc = lang::Loc::current());

// x where mask is 0xFFFFFFFF, +0.0 where it is 0 (x f32, mask u32 of x's shape, e.g. from
// dropout_keep_mask_block): bitcast(f32, bitcast(u32, x) & mask), the same bits as
// where(mask != 0, x, 0.0f) in one AND per element.
lang::Tile apply_keep_mask(const lang::Tile& x, const lang::Tile& mask, lang::Loc loc = lang::Loc::current());

// SWAR keep flags of Philox output words (u32 tile): bit 7 of byte b of the result is 1 iff byte
// b of `words` is < keep_threshold (u32 scalar in [0, 256]); the other bits are unspecified. Per
// word: t = (w & 0x7F7F7F7F) + ADD, keep = ~majority(w, MAJ, t), with ADD and MAJ uniform: bit 7
// of each byte is the inverted carry out of x + (256 - T) (see philox.cpp).
lang::Tile dropout_keep_flags(const lang::Operand& words, const lang::Operand& keep_threshold, lang::Loc loc = lang::Loc::current());

// The same mask packed 32 columns per u32 word: u32 [M, num_words], bit b of word w holds key
// column 32 (word0 + w) + b (1 = keep; no bound on the columns: the caller clears bits past the
// sequence). num_words must be even and word0 (runtime) even: whole 64-column call groups. Laid
// out so that a thread owns whole Philox calls: the four calls t = 0..3 of one (row, group) fill
// its two words (call t gives bits 8 k' + 2 t + e of word 2 q + k / 4, k' = k % 4), OR-ed by a
// reduction over t that stays in one thread's registers (the blocked layout's innermost 4). This
// is what the dropout_mask kernel runs; the [M, num_cols] forms above suit MMA-layout consumers.
lang::Tile dropout_keep_words(const lang::Operand& batch_head, const lang::Tile& rows, const lang::Operand& word0, int64_t num_words,
                              const DropoutKey& key, lang::Loc loc = lang::Loc::current());

}  // namespace tilejit::kernels
