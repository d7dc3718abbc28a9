// Tuning spaces of the library kernels (GEMM, attention forward): their parameters, constraints,
// keys, cost-model workloads and timing inputs, found by kernel name for `tilejit tune` (with the
// spaces of registered plugin kernels: a registry row's tuning_space).
#pragma once
#include <string>
#include <vector>

#include "runtime/tuning_space.hpp"

namespace tilejit::library {

// GEMM: BLOCK_M/N in {64,128,256}, BLOCK_K in {32,64} (32 only off the TMA path), GROUP_M in {0,8},
// warps {4,8}, stages {2..5}; key M, N, K rounded up to powers of two (at least 16).
const runtime::TuningSpace& gemm_tuning_space();
// Attention forward: BLOCK_M {64,128}, BLOCK_N {32,64,128}, warps {4,8}; key batch*heads and the
// sequence length (powers of two), head dim exact.
const runtime::TuningSpace& attention_fwd_tuning_space();
// Attention backward, dK/dV with the recompute reduction: BLOCK_M, BLOCK_N {64, 128}, warps {4, 8},
// stages {2, 3}, min_programs {0, 2, 3}, LSE_IN_RING, TMA_STORE; key B, H, S, D; the API's dK/dV kernel
// as each problem's default.
const runtime::TuningSpace& attention_dkdv_tuning_space();
const runtime::TuningSpace& attention_dq_tuning_space();

// The space of a library or registered kernel, or nullptr.
const runtime::TuningSpace* find_tuning_space(const std::string& kernel);
std::vector<std::string> tunable_kernels();  // the library's, then registered ones

// The fixed meta `tilejit tune` and bundles use for a library kernel: the user's values over the
// library's default meta (runtime/registry), without the tuned parameters.
lang::Meta library_fixed_meta(const std::string& kernel, const lang::Meta& user);

// A kernel's shape from `--shape` values: its space's key dimensions in declaration order (gemm
// M,N,K; attention_fwd B,H,S,D). std::invalid_argument naming the dimensions on a wrong count.
runtime::Shape library_shape(const std::string& kernel, const std::vector<int64_t>& values);
// Those dimensions, as --shape takes them: "M,N,K".
std::string shape_names(const std::string& kernel);

}  // namespace tilejit::library
