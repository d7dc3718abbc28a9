// Tuning spaces: what a kernel lets the autotuner choose (meta values, warps, stages), which
// choices are invalid together, and which runtime arguments select a tuning entry (the key).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/builder.hpp"
#include "jit/compile.hpp"
#include "runtime/gpu_kernel.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"

namespace tilejit::runtime {

// The names the schedule options go by in a space and in config strings (everything else is a
// meta-parameter of the kernel).
inline constexpr std::string_view kWarpsParam = "warps";
inline constexpr std::string_view kStagesParam = "stages";
// CompileOptions::min_programs_per_sm (0: no bound): registers capped for that many programs per SM.
inline constexpr std::string_view kMinProgramsParam = "min_programs";

// One point of a space: a value for every tuned parameter, in the space's declaration order.
struct TuningConfig {
  std::vector<std::pair<std::string, int64_t>> values;

  // The value of `name`; std::out_of_range naming the parameter when the config has none.
  int64_t get(std::string_view name) const;
  std::optional<int64_t> find(std::string_view name) const;
  // "BLOCK_M=128,BLOCK_N=256,warps=8,stages=4": the identity persisted per config, stable for a
  // given set of values (declaration order).
  std::string id() const;
  // The meta-parameters (every value but warps / stages / min_programs), to layer over the call's fixed meta.
  lang::Meta meta() const;
  // `base` with warps / stages / min_programs set from the config where it has them.
  jit::CompileOptions options(jit::CompileOptions base = {}) const;
  bool operator==(const TuningConfig&) const = default;
};
// Parses TuningConfig::id() back ("A=1,B=2"); std::invalid_argument on malformed text.
TuningConfig parse_config(std::string_view id);

// How one key argument is rounded into a bucket, so that nearby shapes share one tuning entry.
struct Bucketing {
  enum class Kind { Exact, NextPowerOfTwo, RoundUp };
  Kind kind = Kind::NextPowerOfTwo;
  int64_t step = 1;   // RoundUp: the multiple
  int64_t min = 1;    // values below are raised to it first (tiny shapes share one entry)
  int64_t max = std::numeric_limits<int64_t>::max();  // bucket values above are clamped to it

  int64_t apply(int64_t v) const;
  std::string describe() const;  // "pow2", "exact", "round up to 128", with bounds when set
  static Bucketing exact() { return {Kind::Exact, 1, std::numeric_limits<int64_t>::min()}; }
  static Bucketing pow2(int64_t min = 1, int64_t max = std::numeric_limits<int64_t>::max()) {
    return {Kind::NextPowerOfTwo, 1, min, max};
  }
  static Bucketing round_up(int64_t step) { return {Kind::RoundUp, step, 1}; }
};

// The problem a tuning run is for: named integer dimensions (the key arguments, not bucketed),
// e.g. {{"M", 4096}, {"N", 4096}, {"K", 4096}}.
using Shape = std::vector<std::pair<std::string, int64_t>>;
int64_t shape_get(const Shape& s, std::string_view name);  // std::out_of_range naming the dim
std::string describe_shape(const Shape& s);                // "M=4096,N=4096,K=4096"

struct KeyArg {
  std::string name;  // "M"
  Bucketing bucketing;
  // Reads the dimension from a call's arguments (for TunedKernel); fixed: the call's fixed meta.
  std::function<int64_t(std::span<const DeviceArg> args, const lang::Meta& fixed)> extract;
};

// A kernel whose main loop is a chain of steps per warpgroup, each step some tensor-core work
// and some work on the SM's other units (a FlashAttention key block: S = Q K^T, softmax, P V), so
// that what it costs depends on how many chains an SM runs at once and whether one chain
// overlaps its own MMAs with the rest (docs/performance-model.md). Absent: the roofline alone.
struct ChainWorkload {
  bool present = false;
  double steps = 0;            // warpgroup steps in the launch (every warpgroup's key blocks)
  double mma_flops = 0;        // per step
  double operand_bytes = 0;    // per step: shared-memory bytes the tensor cores read (A and B)
  double exponentials = 0;     // per step (MUFU)
  double fp32_ops = 0;         // per step: scalar lane-ops on the FP32 pipe (scale, max, sum, rescale, cvt)
  bool overlapped = false;     // one chain keeps an MMA in flight beside its other work (pipelined)
  bool producer = false;       // loads issued by warps of their own (a shorter chain)
  int chains_per_program = 1;  // consumer warpgroups
  int register_demand = 0;     // per consumer thread: accumulators and live tiles, estimated
  int register_cap = 255;      // what the launch leaves a consumer thread (setmaxnreg or a bound)
  bool persistent = false;     // a resident grid walks the tiles: no tail wave, tiles' ends overlap
  double tiles = 0;            // output tiles in the launch (each pays a prologue and an epilogue)
  bool bulk_epilogue = false;  // the output leaves by TMA bulk stores (the epilogue overlaps them)
  double slowdown = 1;         // a whole-kernel factor the steps do not show (a division's subroutine: 1.1)
  bool row_reductions = true;  // a step waits on cross-lane row reductions (the online softmax's max)
  bool lockstep = false;       // the program's chains meet at a CTA barrier every step
  bool async_steps = false;    // steps only issue and retire MMAs (a GEMM's K loop): no softmax latency
  int loads_ahead = 0;         // ring stages a program has in flight beyond the one it reads (0: not modelled)
};

// What the autotuner needs of one launch to estimate its cost (runtime/cost_model.hpp).
struct Workload {
  double flops = 0;            // useful floating-point operations (TFLOP/s is reported on these)
  double mma_flops = 0;        // tensor-core operations executed, edge tiles' padding included
  bool wgmma = false;          // on the asynchronous warpgroup MMA path (full tensor-core rate)
  double dram_bytes = 0;       // compulsory HBM traffic: inputs read once, outputs written once
  double l2_bytes = 0;         // every byte the programs load (tiles re-read from L2 included)
  double smem_bytes = 0;       // shared-memory traffic of one launch (writes and reads)
  int64_t programs = 1;        // grid size
  int threads = 128;           // per program
  int stages = 1;              // loads in flight per program (latency hiding)
  double k_iterations = 1;     // main-loop trips per program (pipeline fill amortisation)
  // Estimates before compiling (the compiled KernelInfo replaces them when there is one).
  int est_registers = 0;       // per thread
  int64_t est_smem_bytes = 0;  // per program
  ChainWorkload chain;         // the per-step model where the kernel has one
};

// Inputs for timing one problem on the GPU: host tensors (copied to the device once), the argument
// list over them, which arguments the kernel writes (checked against the default config's output),
// and the tolerance of that check.
struct ProblemData {
  std::vector<std::unique_ptr<HostTensor>> tensors;
  std::vector<Arg> args;        // Buffer args point into `tensors`
  std::vector<size_t> outputs;  // indices into args
  double tolerance = 1e-2;      // relative L2 error allowed against the default config's output
};

// What constraints and workloads see besides the config: the problem, the fixed meta of the call
// and the target.
struct TuningContext {
  Shape shape;
  lang::Meta fixed;               // the caller's meta (dtype, layouts): part of the tuning key
  std::string arch = "sm_90a";
  int64_t smem_limit = 227 * 1024;  // per block (the device's opt-in maximum)
  int sm_count = 132;               // for wave footprints (which tiles a wave shares in L2)
  int64_t meta_int(std::string_view name, int64_t fallback) const;
  bool meta_bool(std::string_view name, bool fallback) const;
};

struct Constraint {
  std::string description;  // "BLOCK_M divisible by 64 * warpgroups (wgmma path)"
  std::function<bool(const TuningConfig&, const TuningContext&)> holds;
};

struct RejectedConfig {
  TuningConfig config;
  std::string reason;  // the description of the first constraint it breaks
};

class TuningSpace {
 public:
  TuningSpace(std::string kernel, const lang::Kernel& (*build)());

  // ---- declaration (chainable) ----
  TuningSpace& param(std::string name, std::vector<int64_t> values);  // meta, or "warps"/"stages"
  // A bool meta-parameter (values 0 and 1 in configs and their ids; a bool in the kernel's meta).
  TuningSpace& param_bool(std::string name);
  TuningSpace& constrain(std::string description, std::function<bool(const TuningConfig&, const TuningContext&)> holds);
  TuningSpace& key(std::string name, Bucketing b,
                   std::function<int64_t(std::span<const DeviceArg>, const lang::Meta&)> extract = {});
  // The config the autotuner falls back to and checks every other config's output against. Must
  // give a value to every parameter (checked at enumerate time).
  TuningSpace& default_config(TuningConfig c);
  // The default for one problem, where it depends on the problem (attention: the API's schedule for
  // the head dim and mask); default_config(c) still names every parameter for spaces without one.
  TuningSpace& default_for(std::function<TuningConfig(const TuningContext&)> f);
  TuningSpace& workload(std::function<Workload(const TuningConfig&, const TuningContext&)> w);
  TuningSpace& problem(std::function<ProblemData(const TuningContext&)> make);
  TuningSpace& grid(std::function<Grid(const TuningConfig&, const TuningContext&)> g);

  // ---- use ----
  const std::string& kernel_name() const { return kernel_; }
  const lang::Kernel& kernel() const { return build_(); }
  auto kernel_source() const { return build_; }  // (for a bundle entry of the tuned kernel)
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& params() const { return params_; }
  const std::vector<Constraint>& constraints() const { return constraints_; }
  const std::vector<KeyArg>& key_args() const { return key_; }
  const TuningConfig& default_config() const { return default_; }
  // The default of `ctx`'s problem (default_for's, else default_config()).
  TuningConfig default_config(const TuningContext& ctx) const { return default_for_ ? default_for_(ctx) : default_; }

  // Every point of the cartesian product that satisfies all constraints, in declaration order
  // (the last parameter varies fastest); `rejected`, when given, gets the others with the reason.
  // Throws std::invalid_argument naming the kernel when the space is empty or malformed.
  std::vector<TuningConfig> enumerate(const TuningContext& ctx, std::vector<RejectedConfig>* rejected = nullptr) const;
  size_t size() const;  // points before constraints
  // The first constraint `c` breaks, or nullopt.
  std::optional<std::string> violated(const TuningConfig& c, const TuningContext& ctx) const;

  // The bucketed key ("M=4096,N=4096,K=4096" with each value bucketed); std::invalid_argument
  // naming the kernel and dimension when the shape lacks a key dimension.
  std::string bucket(const Shape& shape) const;
  // The unbucketed shape read from a call's arguments; std::logic_error if a key has no extractor.
  Shape shape_of(std::span<const DeviceArg> args, const lang::Meta& fixed) const;

  Workload workload_of(const TuningConfig& c, const TuningContext& ctx) const;
  bool can_make_problem() const { return static_cast<bool>(problem_); }
  ProblemData make_problem(const TuningContext& ctx) const;
  Grid grid_of(const TuningConfig& c, const TuningContext& ctx) const;
  // The specialised tile IR for `c` (the fixed meta under the config's).
  ir::Function build_ir(const TuningConfig& c, const lang::Meta& fixed) const;
  // `c`'s meta-parameters as the kernel reads them (bool parameters as bools).
  lang::Meta meta_of(const TuningConfig& c) const;

 private:
  std::string kernel_;
  const lang::Kernel& (*build_)();
  std::vector<std::pair<std::string, std::vector<int64_t>>> params_;
  std::vector<std::string> bool_params_;
  std::vector<Constraint> constraints_;
  std::vector<KeyArg> key_;
  TuningConfig default_;
  std::function<TuningConfig(const TuningContext&)> default_for_;
  std::function<Workload(const TuningConfig&, const TuningContext&)> workload_;
  std::function<ProblemData(const TuningContext&)> problem_;
  std::function<Grid(const TuningConfig&, const TuningContext&)> grid_;
};

// lang::Meta a over b: a's entries, then b's entries whose names a does not have.
lang::Meta layer_meta(const lang::Meta& over, const lang::Meta& under);
// "B_KMAJOR=true,OUT_DTYPE=bf16" sorted by name: the fixed meta's part of a tuning key.
std::string describe_fixed_meta(const lang::Meta& m);

}  // namespace tilejit::runtime
