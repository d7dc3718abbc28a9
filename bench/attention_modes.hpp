// attention_bench's modes defined outside attention.cpp (one file each), called from its main().
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "api/attention.hpp"

namespace tilejit::attention_bench {

// attention_dropout.cpp
int bench_dropout(double p, int max_reps, std::optional<attention::Schedule> bwd_schedule, bool e2e_only, int64_t head_dim,
                  bool phases);
// attention_deterministic.cpp
int bench_deterministic(int64_t only_d, int64_t only_s, std::optional<attention::Schedule> recompute_schedule,
                        const std::string& only_mode, int only_causal);
// attention_variants.cpp
int bench_forward_variants(int max_reps, int64_t only_d, double dropout_p, bool only_default, const std::string& extra_meta);
int bench_dq_variants(int max_reps, double dropout_p, int64_t only_d, const std::string& ab_meta = {}, const std::string& with_meta = {});
int bench_mask_kernel(double p, int max_reps);
// attention_masks.cpp
int bench_masks(int max_reps, int64_t only_s, const std::string& forward_with, int64_t head_dim);
// --varlen-ab [--head-dim 64]: packed self-attention, the varlen kernels against Options::varlen_documents (attention_varlen.cpp)
int bench_varlen_ab(int max_reps, int64_t head_dim);
// attention_check.cpp
int check(const std::string& dir);
// attention_build_ab.cpp, attention_timing_ab.cpp
int bench_build_ab(const std::string& path, int max_reps);
int bench_timing_ab(int max_reps);

}  // namespace tilejit::attention_bench
