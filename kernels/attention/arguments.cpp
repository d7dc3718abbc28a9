// The table of the attention-family kernels' parameters (arguments.hpp): each name as the kernels
// declare it, and its Arg.
#include "kernels/attention/arguments.hpp"

namespace tilejit::kernels {
namespace {

struct Row {
  std::string_view name;
  Arg arg;
};

// One row per Arg, in enum order (checked below): argument_name indexes it, argument_of searches it.
constexpr std::array<Row, kArgCount> kArguments{{
    {"Q", Arg::Q},
    {"K", Arg::K},
    {"V", Arg::V},
    {"O", Arg::O},
    {"LSE", Arg::LSE},
    {"dO", Arg::dO},
    {"dQ", Arg::dQ},
    {"dK", Arg::dK},
    {"dV", Arg::dV},
    {"Delta", Arg::Delta},
    {"softmax_scale", Arg::softmax_scale},
    {"S_q", Arg::S_q},
    {"S_k", Arg::S_k},
    {"cu_seqlens_q", Arg::cu_seqlens_q},
    {"cu_seqlens_k", Arg::cu_seqlens_k},
    {"seed_lo", Arg::seed_lo},
    {"seed_hi", Arg::seed_hi},
    {"offset_lo", Arg::offset_lo},
    {"offset_hi", Arg::offset_hi},
    {"keep_threshold", Arg::keep_threshold},
    {"rng_state", Arg::rng_state},
    {"rng_state_in_memory", Arg::rng_state_in_memory},
    {"dropout_row_offset", Arg::dropout_row_offset},
    {"dropout_col_offset", Arg::dropout_col_offset},
    {"dropout_head_offset", Arg::dropout_head_offset},
    {"dropout_heads", Arg::dropout_heads},
    {"dropout_mask", Arg::dropout_mask},
    {"dropout_bits", Arg::dropout_bits},
    {"Mask", Arg::Mask},
    {"dropout_bits_out", Arg::dropout_bits_out},
    {"dQ_accum", Arg::dQ_accum},
    {"dQ_parts", Arg::dQ_parts},
    {"dQ_semaphores", Arg::dQ_semaphores},
    {"mask_window_left", Arg::mask_window_left},
    {"mask_window_right", Arg::mask_window_right},
    {"mask_global_tokens", Arg::mask_global_tokens},
    {"mask_block_q", Arg::mask_block_q},
    {"mask_block_k", Arg::mask_block_k},
    {"mask_doc_ids", Arg::mask_doc_ids},
    {"mask_prefix_lengths", Arg::mask_prefix_lengths},
    {"mask_block_table", Arg::mask_block_table},
    {"block_classes", Arg::block_classes},
    {"kv_num_blocks", Arg::kv_num_blocks},
    {"kv_indices", Arg::kv_indices},
    {"full_kv_num_blocks", Arg::full_kv_num_blocks},
    {"full_kv_indices", Arg::full_kv_indices},
    {"q_num_blocks", Arg::q_num_blocks},
    {"q_indices", Arg::q_indices},
    {"full_q_num_blocks", Arg::full_q_num_blocks},
    {"full_q_indices", Arg::full_q_indices},
    {"score_alibi_slopes", Arg::score_alibi_slopes},
    {"score_softcap", Arg::score_softcap},
}};

// Every Arg has its row at its own index, and no name is in the table twice.
constexpr bool well_formed() {
  for (size_t i = 0; i < kArguments.size(); ++i) {
    if (arg_index(kArguments[i].arg) != i || kArguments[i].name.empty()) return false;
    for (size_t j = 0; j < i; ++j)
      if (kArguments[j].name == kArguments[i].name) return false;
  }
  return true;
}
static_assert(well_formed(), "kArguments: one row per Arg, in enum order, each name once");

}  // namespace

std::optional<Arg> argument_of(std::string_view parameter) {
  for (const Row& r : kArguments)
    if (r.name == parameter) return r.arg;
  return std::nullopt;
}

std::string_view argument_name(Arg a) { return arg_index(a) < kArguments.size() ? kArguments[arg_index(a)].name : "?"; }

}  // namespace tilejit::kernels
