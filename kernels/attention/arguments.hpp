// The runtime parameters of the attention-family kernels (attention_fwd, attention_bwd_preprocess,
// attention_bwd_dkdv, attention_bwd_dq, attention_bwd_dq_convert, attention_bwd_dq_reduce,
// attention_block_classes, attention_block_lists, dropout_mask) as one enum, Arg, and the one table
// (arguments.cpp) that maps each name a kernel declares to its Arg. The host binds arguments by
// Arg (api/attention's KernelArgs) and turns a kernel's signature into Args through argument_of:
// outside the kernels' own declarations, that table is the only place the names are spelt.
// PhiloxKey is a dropout call's key on the host, which the kernels take as five u32 scalars.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "kernels/philox_host.hpp"

namespace tilejit::kernels {

// Every parameter an attention-family kernel can declare, spelt as the kernels declare it (so the
// table reads as a list of identities). Which of them a kernel has depends on its metas (VARLEN,
// DROPOUT, MASK, SCORE_MOD, DQ_REDUCTION, ...); its signature says which, in what order.
//
// Why an enum and not a struct of optional fields: a launch walks the kernel's signature and needs,
// for each parameter, the slot that holds its value -- a name -> slot map. An enum gives that map
// one row per parameter, an index into a flat array of values, a count to size the array and a loop
// over every slot; a struct of fields would need the same table again as member pointers beside the
// fields (two lists to keep in step) and could not be indexed or iterated.
enum class Arg : uint8_t {
  // the attention kernels' tensors: inputs, output, log-sum-exp, gradients, the backward's Delta
  Q, K, V, O, LSE, dO, dQ, dK, dV, Delta,
  softmax_scale,
  S_q, S_k,                    // sequence lengths (the block-mask pre-pass, the dQ reduce kernel, dropout_mask)
  cu_seqlens_q, cu_seqlens_k,  // VARLEN: the sequences' token offsets
  // dropout: the Philox key and keep threshold (AttentionDropout, DropoutMaskTiles: PhiloxKey), the
  // forward's returned u8 mask, the precomputed packed bits an attention kernel reads (DROPOUT_BITS)
  // and the packed bits the dropout_mask kernel writes (its Mask)
  seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold,
  rng_state, rng_state_in_memory,  // (seed, offset) in device memory instead, when the flag is set
  // where the call sits in a larger attention's mask (AttentionDropout; DropoutCoordinates)
  dropout_row_offset, dropout_col_offset, dropout_head_offset, dropout_heads,
  dropout_mask, dropout_bits, Mask,
  dropout_bits_out,  // dK/dV's DROPOUT_WRITE_BITS: the fused mask's words it stores for dQ to read
  // the dK/dV kernel's dQ reduction buffers (DQ_REDUCTION)
  dQ_accum, dQ_parts, dQ_semaphores,
  // a library mask's own parameters (AttentionMask, BlockClassifier: mask_parameter_names)
  mask_window_left, mask_window_right, mask_global_tokens, mask_block_q, mask_block_k,
  mask_doc_ids, mask_prefix_lengths, mask_block_table,
  // the block-mask pre-pass: the tile classes and the lists (BlockMaskLists), per query tile (kv_*)
  // or, KV_MAJOR, per key tile (q_*)
  block_classes,
  kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
  q_num_blocks, q_indices, full_q_num_blocks, full_q_indices,
  // a library score mod's parameter (AttentionScoreMod: score_mod_parameter_names)
  score_alibi_slopes, score_softcap,
};
inline constexpr size_t kArgCount = static_cast<size_t>(Arg::score_softcap) + 1;  // (score_softcap is the last)
inline constexpr size_t arg_index(Arg a) { return static_cast<size_t>(a); }

// The Arg of a kernel parameter name, or nullopt for a name no attention-family kernel declares.
std::optional<Arg> argument_of(std::string_view parameter);
// The name the kernels declare `a` under.
std::string_view argument_name(Arg a);

// Where an attention call's keep-mask sits in a larger attention's (AttentionDropout): query row i
// is row i + row_offset, key j is key j + col_offset, head h of batch b is bh = b * heads +
// head_offset + h (heads 0: the call's own). All zero: the call's own mask.
struct DropoutCoordinates {
  int32_t row_offset = 0, col_offset = 0, head_offset = 0, heads = 0;
  std::array<std::pair<Arg, uint32_t>, 4> arguments() const {
    return {{{Arg::dropout_row_offset, static_cast<uint32_t>(row_offset)},
             {Arg::dropout_col_offset, static_cast<uint32_t>(col_offset)},
             {Arg::dropout_head_offset, static_cast<uint32_t>(head_offset)},
             {Arg::dropout_heads, static_cast<uint32_t>(heads)}}};
  }
  bool operator==(const DropoutCoordinates&) const = default;
};

// A dropout call's Philox key and keep threshold on the host (kernels/philox_host.hpp): what the
// kernels take as seed_lo, seed_hi, offset_lo, offset_hi (the 64-bit seed and offset, low word
// first) and keep_threshold; the attention kernels also take its coordinates.
struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t keep_threshold = 256;  // keep iff the element's random byte < keep_threshold (256: keep all)
  DropoutCoordinates coordinates;

  // The key of dropout with probability p (keep_threshold = dropout_keep_threshold(p)).
  static PhiloxKey dropout(uint64_t seed, uint64_t offset, double p) { return {seed, offset, dropout_keep_threshold(p), {}}; }
  // The five scalar arguments, in the kernels' declaration order.
  std::array<std::pair<Arg, uint32_t>, 5> arguments() const {
    return {{{Arg::seed_lo, static_cast<uint32_t>(seed)},
             {Arg::seed_hi, static_cast<uint32_t>(seed >> 32)},
             {Arg::offset_lo, static_cast<uint32_t>(offset)},
             {Arg::offset_hi, static_cast<uint32_t>(offset >> 32)},
             {Arg::keep_threshold, keep_threshold}}};
  }
  // The host twin's key (the same bits as the kernels).
  DropoutRngHost host() const { return {seed, offset, keep_threshold}; }
  bool operator==(const PhiloxKey&) const = default;
};

}  // namespace tilejit::kernels
