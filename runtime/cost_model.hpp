// The autotuner's analytical cost model: a roofline-style time estimate per config (tensor cores,
// HBM, L2, shared memory, wave quantisation, occupancy) used to prune a space before timing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jit/compile.hpp"
#include "runtime/driver.hpp"
#include "runtime/tuning_space.hpp"

namespace tilejit::runtime {

// What the model knows of a GPU. The CUDA driver gives the counts and sizes; peak rates are not
// queryable, so they come from the part's data sheet by name (H100 SXM figures otherwise, scaled
// by SM count). Every number is a field so that tests and other parts can set their own.
struct DeviceModel {
  std::string name = "NVIDIA H100 80GB HBM3";
  int sm_count = 132;
  int driver_version = 0;
  int64_t l2_bytes = 50 * 1024 * 1024;
  int64_t smem_per_sm = 228 * 1024;
  int64_t smem_per_block = 227 * 1024;  // opt-in maximum of one block
  int regs_per_sm = 65536;
  int max_threads_per_sm = 2048;
  int max_blocks_per_sm = 32;
  double mma_flops_per_s = 989e12;       // dense bf16/f16 wgmma peak
  double mma_sync_fraction = 0.33;       // mma.sync + shared-memory operand path: ~FA2 speed
  double hbm_bytes_per_s = 3.35e12;
  double l2_bytes_per_s = 10e12;
  double smem_bytes_per_s_per_sm = 128 * 1.755e9;  // 128 B/clock
  double launch_s = 4e-6;                // launch and grid start
  double program_fill_s = 1.2e-6;        // per wave: first loads in flight, epilogue stores
  // Per multiprocessor and clock, for chains (ChainWorkload): the units' issue rates and the
  // fixed latency of one step (a wgmma's round trip, the barriers around it). The rates are
  // Hopper's per-SM figures (4096 dense bf16 flops, 16 MUFU exponentials, 128 FP32 lanes,
  // 128 B of shared memory); the latencies and overheads were set against exhaustive sweeps
  // (docs/performance-model.md), not yet measured per GPU by microbenchmarks.
  double clock_hz = 1.755e9;
  double mma_flops_per_clock = 4096;
  double exponentials_per_clock = 16;
  double fp32_per_clock = 128;
  double smem_bytes_per_clock = 128;
  double step_latency_clocks = 1400;     // a step's chain beyond its work (wgmma wait, barriers, loads)
  double elementwise_step_latency_clocks = 650;  // ... without row reductions (the backward's P = exp(S - LSE))
  double async_step_latency_clocks = 300;        // ... that only issues a wgmma and retires the previous (a GEMM)
  double load_latency_clocks = 3000;             // a ring's TMA load under a saturated L2, issue to arrival
  double producer_latency_saving = 600;  // loads issued by a producer warpgroup take that off the chain
  double overlap_residue = 0.3;          // a pipelined chain still pays this share of its shorter half
  double round_bound_norm = 6;           // a round: the p-norm of the units' time and one chain's (2^(1/6) = 1.12 at equal)
  double tile_clocks = 3000;             // a tile's prologue and epilogue (first loads, O's store)
  double persistent_tile_share = 0.4;    // ... of which a persistent grid hides the rest under the next tile
  double bulk_epilogue_share = 0.8;      // ... and TMA bulk stores of the output leave this much of it
  double serialized_factor = 4;          // wgmma serialised by ptxas (accumulators above the registers) ...
  double serialized_overflow_registers = 64;  // ... fully from this overflow, in proportion below it

  static DeviceModel h100();
  // From the driver's properties (name, SM count, L2, shared memory, driver version) with the
  // rates of the named part (H100, H200, H800, GH200; else H100's per SM, scaled).
  static DeviceModel from_props(const DeviceProps& p, int driver_version);
  // Device 0 when a GPU is present, else h100() renamed to say the figures are assumed.
  static DeviceModel current();
};

// The compiled facts of a config, when it has been compiled (the model estimates them otherwise).
struct KernelResources {
  int registers = 0;       // per thread
  int64_t smem_bytes = 0;  // static + dynamic, per block
  int spill_bytes = 0;     // spill stores + loads
  int threads = 0;
  int resident_programs = 0;  // per SM as the driver counts them for this launch (0: the model's occupancy rule)
  static KernelResources of(const jit::CompiledKernel& k);
};

struct CostEstimate {
  bool feasible = true;
  std::string reason;        // why not: "spills 64 B", "needs 240 KB of shared memory (the limit is 227 KB)"
  double ms = 0;             // predicted launch time
  int blocks_per_sm = 0;
  int64_t waves = 0;
  double wave_efficiency = 0;  // programs / (waves * SMs * blocks per SM)
  double compute_ms = 0, dram_ms = 0, l2_ms = 0, smem_ms = 0, overhead_ms = 0;
  // Chains (ChainWorkload): per SM, the tensor cores' and the other units' busy time, the chains'
  // own latency bound, the rounds and the chains running at once; `serialized` when the register
  // demand exceeds the cap (ptxas then serialises every wgmma).
  double mufu_ms = 0, fp32_ms = 0, chain_ms = 0;
  int chains_per_sm = 0;
  bool serialized = false;
  std::string bound;         // "tensor cores", "HBM", "L2", "shared memory", "latency"
  bool from_compiled = false;  // resources from the compiled KernelInfo (else estimated)
};

// The estimate of `w` on `d`; with `res` the occupancy comes from the compiled kernel and spills or
// shared memory above the device's limit make the config infeasible (dropped before timing).
CostEstimate estimate(const Workload& w, const DeviceModel& d, const KernelResources* res = nullptr);

// Indices of `e` by increasing predicted time, infeasible ones last (stable for ties).
std::vector<size_t> rank_by_model(const std::vector<CostEstimate>& e);

// Spearman's rank correlation between the model's and the measured order of the same configs
// (1: identical order): the number `tilejit tune` prints to show the model's quality.
double rank_correlation(const std::vector<int>& model_rank, const std::vector<int>& measured_rank);

}  // namespace tilejit::runtime
