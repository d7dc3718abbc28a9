// The cost model: per-SM work of the busiest SM (waves x co-resident programs) against the SM's
// share of the tensor-core and shared-memory rates, device-wide traffic against HBM and L2
// bandwidth, partial overlap of the two depending on pipeline depth and occupancy, plus a fixed
// cost per wave. Absolute times are rough; the ranking is what pruning relies on.
#include "runtime/cost_model.hpp"

#include "runtime/calibration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tilejit::runtime {

DeviceModel DeviceModel::h100() { return DeviceModel{}; }

DeviceModel DeviceModel::from_props(const DeviceProps& p, int driver_version) {
  DeviceModel d;
  const std::string& n = p.name;
  const double per_sm_mma = d.mma_flops_per_s / d.sm_count;  // H100 SXM per SM
  d.name = p.name;
  d.sm_count = std::max(1, p.sm_count);
  d.driver_version = driver_version;
  if (p.l2_bytes) d.l2_bytes = static_cast<int64_t>(p.l2_bytes);
  if (p.smem_per_sm) d.smem_per_sm = static_cast<int64_t>(p.smem_per_sm);
  if (p.smem_per_block_optin) d.smem_per_block = static_cast<int64_t>(p.smem_per_block_optin);
  d.mma_flops_per_s = per_sm_mma * d.sm_count;
  if (p.clock_khz > 0) d.clock_hz = p.clock_khz * 1e3;
  if (n.find("H200") != std::string::npos || n.find("GH200") != std::string::npos) d.hbm_bytes_per_s = 4.8e12;
  else if (n.find("PCIe") != std::string::npos) d.hbm_bytes_per_s = 2.0e12;
  else if (n.find("H100") == std::string::npos && n.find("H800") == std::string::npos)
    d.hbm_bytes_per_s = 3.35e12 * d.sm_count / 132.0;  // an unknown part: scale with its size
  return d;
}

DeviceModel DeviceModel::current() {
  Driver& drv = Driver::get();
  if (drv.available() && drv.device_count() > 0) {
    DeviceModel d = from_props(drv.props(0), drv.driver_version());
    // the rates `tilejit calibrate` measured on this GPU, where it ran
    if (const std::optional<Calibration> c = load_calibration(TuningStore::global(), d)) apply_calibration(d, *c);
    return d;
  }
  DeviceModel d = h100();
  d.name = "no GPU (H100 figures assumed)";
  return d;
}

KernelResources KernelResources::of(const jit::CompiledKernel& k) {
  KernelResources r;
  r.registers = k.info.registers;
  r.smem_bytes = k.smem_bytes + k.info.shared_bytes;
  r.spill_bytes = k.info.spill_store_bytes + k.info.spill_load_bytes;
  r.threads = k.num_threads;
  return r;
}

namespace {

std::string kb(int64_t bytes) { return fmt::format("{} KB", (bytes + 1023) / 1024); }

// ChainWorkload: per SM, `chains` = warpgroups resident at once each run their steps; a round (every
// chain one step) takes the longest of the tensor cores' share, the other units' share and one
// chain's own latency; the SM runs steps / (SMs x chains) rounds, plus each tile's ends.
CostEstimate chain_estimate(const Workload& w, const DeviceModel& d, CostEstimate e, double mem_s) {
  const ChainWorkload& c = w.chain;
  const double hz = d.clock_hz;
  const int64_t slots = static_cast<int64_t>(d.sm_count) * e.blocks_per_sm;
  const double chains = static_cast<double>(std::max(1, c.chains_per_program) * e.blocks_per_sm);
  e.chains_per_sm = static_cast<int>(chains);
  const double mma = std::max(c.mma_flops / (d.mma_flops_per_clock * (w.wgmma ? 1.0 : d.mma_sync_fraction)),
                              c.operand_bytes / d.smem_bytes_per_clock);
  const double mufu = c.exponentials / d.exponentials_per_clock, fp32 = c.fp32_ops / d.fp32_per_clock;
  const double rest = mufu + fp32;
  // a step's own latency: the softmax's row reductions, an elementwise step's waits, or only a
  // wgmma's issue and retirement; a producer's loads shorten the first two
  double own = (c.overlapped ? std::max(mma, rest) + d.overlap_residue * std::min(mma, rest) : mma + rest);
  if (c.async_steps) own += d.async_step_latency_clocks;
  else own += (c.row_reductions ? d.step_latency_clocks : d.elementwise_step_latency_clocks) - (c.producer ? d.producer_latency_saving : 0.0);
  // a ring `loads_ahead` stages deep hides a load's latency over that many rounds
  const double load_wait = c.loads_ahead > 0 ? d.load_latency_clocks / c.loads_ahead : 0.0;
  // chains that meet at a CTA barrier every step cannot run one's MMA beside another's softmax
  if (c.lockstep) own += (c.chains_per_program - 1) * std::min(mma, rest);
  // a round is bound by the units' throughput or by one chain's latency; near equal, neither is
  // reached (a chain waits for a unit another holds): a smooth maximum, the p-norm of the two
  const double units = std::max(chains * mma, chains * rest), p = d.round_bound_norm;
  double round = std::pow(std::pow(units, p) + std::pow(own, p) + std::pow(load_wait, p), 1.0 / p);
  e.serialized = w.wgmma && c.register_demand > c.register_cap;
  // the further the accumulators overflow the registers, the more wgmmas ptxas serialises
  if (e.serialized)
    round *= 1.0 + (d.serialized_factor - 1.0) * std::min(1.0, (c.register_demand - c.register_cap) / d.serialized_overflow_registers);
  round *= c.slowdown;
  // a persistent grid walks tile t on program t mod slots: the busiest takes ceil(tiles / slots),
  // and with fewer tiles than slots the rest idle; otherwise the last wave's idle slots cost as if busy
  const double per_slot = c.tiles / static_cast<double>(slots);
  const double eff = !c.persistent ? e.wave_efficiency : per_slot > 0 ? per_slot / std::ceil(per_slot) : 1.0;
  const double rounds = c.steps / d.sm_count / chains;
  const double per_sm_s = rounds * round / eff / hz;
  const double tiles_per_slot = c.tiles / static_cast<double>(slots) / eff;
  const double tile_s = tiles_per_slot * d.tile_clocks * (c.persistent ? d.persistent_tile_share : 1.0) *
                        (c.bulk_epilogue ? d.bulk_epilogue_share : 1.0) / hz;
  e.compute_ms = rounds * chains * mma / eff / hz * 1e3;
  e.mufu_ms = rounds * chains * mufu / eff / hz * 1e3;
  e.fp32_ms = rounds * chains * fp32 / eff / hz * 1e3;
  e.chain_ms = rounds * own / eff / hz * 1e3;
  e.overhead_ms = (d.launch_s + tile_s) * 1e3;
  e.ms = (std::max(per_sm_s, mem_s) + tile_s + d.launch_s) * 1e3;
  const double top = std::max({chains * mma, chains * rest, own, load_wait});
  e.bound = e.serialized                ? "serialised wgmma (registers)"
            : mem_s > per_sm_s          ? (e.dram_ms >= e.l2_ms ? "HBM" : "L2")
            : top == chains * mma       ? "tensor cores"
            : top == chains * rest      ? (mufu >= fp32 ? "exponentials" : "FP32 pipe")
            : top == own                ? "chain latency"
                                        : "load latency (ring depth)";
  return e;
}

}  // namespace

CostEstimate estimate(const Workload& w, const DeviceModel& d, const KernelResources* res) {
  CostEstimate e;
  e.from_compiled = res != nullptr;
  const int threads = res && res->threads > 0 ? res->threads : std::max(1, w.threads);
  const int regs = res ? res->registers : w.est_registers;
  const int64_t smem = res ? res->smem_bytes : w.est_smem_bytes;
  auto infeasible = [&](std::string why) {
    e.feasible = false;
    e.reason = std::move(why);
    e.ms = INFINITY;
    return e;
  };
  if (res && res->spill_bytes > 0) return infeasible(fmt::format("spills {} B of registers", res->spill_bytes));
  if (smem > d.smem_per_block)
    return infeasible(fmt::format("needs {} of shared memory (the limit is {})", kb(smem), kb(d.smem_per_block)));
  if (regs > 255) return infeasible(fmt::format("needs {} registers per thread (at most 255)", regs));
  if (threads > 1024) return infeasible(fmt::format("{} threads per block (at most 1024)", threads));

  // Occupancy: registers are allocated per warp in units of 256, shared memory with 1 KB reserved
  // per block.
  const int warps = (threads + 31) / 32;
  int by_regs = d.max_blocks_per_sm;
  if (regs > 0) {
    const int per_warp = (regs * 32 + 255) / 256 * 256;
    by_regs = d.regs_per_sm / (per_warp * warps);
  }
  const int by_smem = smem > 0 ? static_cast<int>(d.smem_per_sm / (smem + 1024)) : d.max_blocks_per_sm;
  const int by_threads = d.max_threads_per_sm / (warps * 32);
  e.blocks_per_sm = std::min({by_regs, by_smem, by_threads, d.max_blocks_per_sm});
  // the driver's count where the tuner loaded the kernel: it knows the reserved shared memory and
  // the allocation granularities the rule above approximates (a 116,352-B dK/dV program ran two
  // to an SM where the rule said one)
  if (res && res->resident_programs > 0) e.blocks_per_sm = std::min(res->resident_programs, d.max_blocks_per_sm);
  if (e.blocks_per_sm <= 0)
    return infeasible(fmt::format("no block fits on an SM ({} registers x {} threads, {} of shared memory)", regs, threads, kb(smem)));

  // Wave quantisation: the busiest SM runs waves * blocks_per_sm programs, sharing its rates.
  const int64_t programs = std::max<int64_t>(1, w.programs);
  const int64_t slots = static_cast<int64_t>(d.sm_count) * e.blocks_per_sm;
  e.waves = (programs + slots - 1) / slots;
  e.wave_efficiency = static_cast<double>(programs) / static_cast<double>(e.waves * slots);
  const double per_sm_programs = static_cast<double>(e.waves * e.blocks_per_sm);
  const double per_sm_rate = d.mma_flops_per_s / d.sm_count * (w.wgmma ? 1.0 : d.mma_sync_fraction);
  const double compute_s = w.mma_flops / programs * per_sm_programs / per_sm_rate;
  const double smem_s = w.smem_bytes / programs * per_sm_programs / d.smem_bytes_per_s_per_sm;
  // Bandwidth needs enough SMs issuing: a grid that occupies a quarter of the SMs cannot pull
  // full HBM bandwidth.
  const double busy = std::min<double>(1.0, 2.0 * std::min<double>(programs, d.sm_count) / d.sm_count);
  const double dram_s = w.dram_bytes / (d.hbm_bytes_per_s * busy);
  const double l2_s = w.l2_bytes / (d.l2_bytes_per_s * busy);
  const double mem_s = std::max(dram_s, l2_s);
  const double core_s = std::max(compute_s, smem_s);
  // Overlap of loads with math grows with the loads in flight: pipeline stages and co-resident
  // programs. Full overlap from ~3 stages at one block per SM.
  const double in_flight = std::max(1, w.stages - 1) * static_cast<double>(e.blocks_per_sm);
  const double overlap = std::clamp(in_flight / 3.0, 0.0, 1.0);
  const double body_s = std::max(core_s, mem_s) + (1.0 - overlap) * std::min(core_s, mem_s);
  // Per wave: the pipeline fill (stages tiles before the first MMA, amortised over the K loop)
  // and the epilogue.
  const double fill_s = d.program_fill_s * (1.0 + std::min<double>(w.stages, std::max(1.0, w.k_iterations)) / 4.0);
  const double overhead_s = d.launch_s + static_cast<double>(e.waves) * fill_s;
  if (w.chain.present) {
    e.dram_ms = dram_s * 1e3;
    e.l2_ms = l2_s * 1e3;
    e.smem_ms = smem_s * 1e3;
    return chain_estimate(w, d, e, std::max(dram_s, l2_s));
  }
  e.compute_ms = compute_s * 1e3;
  e.smem_ms = smem_s * 1e3;
  e.dram_ms = dram_s * 1e3;
  e.l2_ms = l2_s * 1e3;
  e.overhead_ms = overhead_s * 1e3;
  e.ms = (body_s + overhead_s) * 1e3;
  const double top = std::max({compute_s, smem_s, dram_s, l2_s, overhead_s});
  e.bound = top == compute_s ? "tensor cores" : top == dram_s ? "HBM" : top == l2_s ? "L2" : top == smem_s ? "shared memory" : "latency";
  return e;
}

std::vector<size_t> rank_by_model(const std::vector<CostEstimate>& e) {
  std::vector<size_t> idx(e.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    if (e[a].feasible != e[b].feasible) return e[a].feasible;
    return e[a].ms < e[b].ms;
  });
  return idx;
}

double rank_correlation(const std::vector<int>& a, const std::vector<int>& b) {
  const size_t n = std::min(a.size(), b.size());
  if (n < 2) return 1.0;
  // Ranks are re-ranked within the pairs given (the model ranks the whole space).
  auto rerank = [n](const std::vector<int>& r) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), size_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return r[x] < r[y]; });
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[idx[i]] = static_cast<double>(i + 1);
    return out;
  };
  std::vector<double> ra = rerank(a), rb = rerank(b);
  double d2 = 0;
  for (size_t i = 0; i < n; ++i) d2 += (ra[i] - rb[i]) * (ra[i] - rb[i]);
  const double nn = static_cast<double>(n);
  return 1.0 - 6.0 * d2 / (nn * (nn * nn - 1.0));
}

}  // namespace tilejit::runtime
