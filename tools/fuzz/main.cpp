// tilejit_fuzz: differential testing of the compiler. Random well-typed DSL programs run in the
// CPU interpreter and are compiled by both backends; with --gpu each is launched and every output
// compared with the interpreter's (bit for bit where the README promises it). Each program runs in
// a child process, so a compiler crash or a GPU hang names its seed; failures are reduced to small
// programs printed as C++.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tools/fuzz/emitter.hpp"
#include "tools/fuzz/pool.hpp"
#include "tools/fuzz/reduce.hpp"
#include "runtime/driver.hpp"
#include <sys/wait.h>

using namespace tilejit;
using namespace tilejit::fuzz;

namespace {

constexpr const char* kUsage = R"(usage: tilejit_fuzz [options]
  --seeds A:B        run seeds A .. B-1 (default 0:200)
  --time S           stop starting new seeds after S seconds
  --jobs N           worker processes (default: the CPU count)
  --gpu              launch on the GPU and compare (default: compile only, PTX assembled by ptxas)
  --emulate          run each lowered program in the host emulator and compare (no GPU, no backend;
                     programs the emulator cannot run count as not-emulated)
  --emulate-races    the same, warp by warp with a random schedule per seed (missing barriers and
                     waits show as mismatches)
  --backends L       llvm,nvrtc (default both)
  --timeout S        seconds per program before it counts as a hang (default 60)
  --reduce N         reduce up to N distinct failures (default 3) ...
  --reduce-time S    ... spending at most S seconds on each (default 120)
  --max-nodes N      operations per program (default 40)
  --fp8              also generate fp8 casts and fp8 dot inputs
  --no-pack-pairs    do not generate pack_pairs / unpack_pairs
  --no-axis-ops      do not generate scans, combine reductions, xor_permute, gather or histogram (as before 0.1.4)
  --specialize       lower and compile each program as tilejit::Function specialises it for its
                     arguments (aligned, unit-stride tensors; integer scalars that are multiples of
                     16 declared divisible: runtime/specialization.hpp); the interpreter runs it as is
  --packed-loop-pairs  compile with CompileOptions::packed_loop_pairs (the LLVM backend carries loop values
                     of 16-bit floats as packed pairs; decision 092)
  --tma-stores       window stores ask for TMA (StoreOptions::tma), and ~70% of the programs are drawn
                     so that some of them qualify (sm_90a, 4/8 warps, 16-byte aligned contiguous
                     outputs of 2- or 4-byte elements, rows a multiple of 8, 128-byte column chunks,
                     aligned inner offsets; ragged and possibly negative windows); the summary counts
                     the programs whose lowering has a TMA store (other seeds' programs than without)
  --expect-tma-stores P  with --tma-stores: fail (exit 1) when fewer than P% of the programs were
                     lowered with a TMA store (the generator no longer reaches the path)
  --no-narrow-reductions  do not reduce 8- and 16-bit integer tiles
  --print SEED       print the program of SEED as C++ and exit (after --out DIR: also what both
                     backends made of it, DIR/seed_SEED.{ll,cu,llvm.ptx,nvrtc.ptx})
  --out DIR          write every failure to DIR/failures.txt, reduced programs to DIR/reduced_SEED.cpp
                     and what the backends made of them (DIR/reduced_SEED.{ll,cu,llvm.ptx,nvrtc.ptx})
  --quiet            only the summary
Exit status: 0 when every program passed, 1 when any failed, 2 for bad usage.
)";

[[noreturn]] void usage_error(const std::string& msg) {
  fmt::print(stderr, "tilejit_fuzz: {}\n{}", msg, kUsage);
  std::exit(2);
}

uint64_t number(const std::string& flag, const std::string& s) {
  try {
    size_t used = 0;
    uint64_t v = std::stoull(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    usage_error(fmt::format("{}: '{}' is not a non-negative integer", flag, s));
  }
}

void write_ptx(Program& p, const std::string& dir, const std::string& stem) {
  std::system(fmt::format("mkdir -p '{}'", dir).c_str());
  for (jit::Backend b : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    CompiledText t = compiled_text(p, b);
    std::ofstream(fmt::format("{}/{}.{}.ptx", dir, stem, jit::to_string(b))) << t.ptx;
    std::ofstream(fmt::format("{}/{}.{}", dir, stem, b == jit::Backend::Llvm ? "ll" : "cu")) << t.source;
  }
}

// "" when a GPU is usable, else why not (found out in a child process).
std::string gpu_unavailable_reason() {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string why = runtime::Driver::get().available() ? "" : runtime::Driver::get().unavailable_reason();
    if (why.empty() && runtime::Driver::get().device_count() == 0) why = "no device";
    (void)::write(fds[1], why.data(), why.size());
    _exit(0);
  }
  ::close(fds[1]);
  std::string why;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) why.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st)) return "the GPU probe crashed";
  return why;
}

}  // namespace

int main(int argc, char** argv) {
  // Random programs spill by design: the compiler's spill warnings would bury the results.
  // A user's own TILEJIT_QUIET=0 still wins.
  setenv("TILEJIT_QUIET", "1", /*overwrite=*/0);
  PoolOptions o;
  o.jobs = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  uint64_t first = 0, last = 200;
  double time_limit = 0, reduce_time = 120;
  int reduce_n = 3;
  double expect_tma_pct = -1;  // --expect-tma-stores
  bool quiet = false;
  std::string out_dir;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) usage_error(fmt::format("{} needs a value", a));
      return args[++i];
    };
    if (a == "--seeds") {
      std::string v = value();
      size_t c = v.find(':');
      if (c == std::string::npos) usage_error(fmt::format("--seeds: '{}' is not A:B", v));
      first = number(a, v.substr(0, c));
      last = number(a, v.substr(c + 1));
      if (last <= first) usage_error(fmt::format("--seeds: the range {}:{} is empty", first, last));
    } else if (a == "--time") time_limit = static_cast<double>(number(a, value()));
    else if (a == "--jobs") o.jobs = static_cast<int>(std::max<uint64_t>(1, number(a, value())));
    else if (a == "--gpu") o.eval.gpu = true;
    else if (a == "--emulate") o.eval.emulate = true, o.eval.compile_backends = false;
    else if (a == "--emulate-races") o.eval.emulate = o.eval.emulate_races = true, o.eval.compile_backends = false;
    else if (a == "--timeout") o.timeout_s = static_cast<double>(number(a, value()));
    else if (a == "--reduce") reduce_n = static_cast<int>(number(a, value()));
    else if (a == "--reduce-time") reduce_time = static_cast<double>(number(a, value()));
    else if (a == "--max-nodes") o.gen.max_nodes = static_cast<int>(number(a, value()));
    else if (a == "--fp8") o.gen.fp8 = true;
    else if (a == "--no-pack-pairs") o.gen.pack_pairs = false;
    else if (a == "--no-axis-ops") o.gen.axis_ops = false;
    else if (a == "--tma-stores") o.gen.tma_stores = true;
    else if (a == "--specialize") o.eval.specialize = true;
    else if (a == "--packed-loop-pairs") o.eval.packed_loop_pairs = true;
    else if (a == "--expect-tma-stores") expect_tma_pct = static_cast<double>(number(a, value()));
    else if (a == "--no-narrow-reductions") o.gen.narrow_reductions = false;
    else if (a == "--out") out_dir = value();
    else if (a == "--quiet") quiet = true;
    else if (a == "--backends") {
      o.eval.backends.clear();
      std::string v = value();
      for (size_t s = 0; s <= v.size();) {
        size_t e = v.find(',', s);
        std::string name = v.substr(s, e == std::string::npos ? std::string::npos : e - s);
        if (name == "llvm") o.eval.backends.push_back(jit::Backend::Llvm);
        else if (name == "nvrtc") o.eval.backends.push_back(jit::Backend::Nvrtc);
        else usage_error(fmt::format("--backends: unknown backend '{}' (valid: llvm, nvrtc)", name));
        if (e == std::string::npos) break;
        s = e + 1;
      }
    } else if (a == "--print") {
      uint64_t seed = number(a, value());
      Program p = generate(seed, o.gen);
      fmt::print("{}", to_cpp(p));
      if (!out_dir.empty()) write_ptx(p, out_dir, fmt::format("seed_{}", seed));
      return 0;
    } else if (a == "--help" || a == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    } else {
      usage_error(fmt::format("unknown option '{}'", a));
    }
  }
  if (expect_tma_pct >= 0 && !o.gen.tma_stores) usage_error("--expect-tma-stores needs --tma-stores");
  if (expect_tma_pct >= 0 && !o.eval.emulate && !o.eval.compile_backends) usage_error("--expect-tma-stores: nothing is lowered");
  if (!out_dir.empty()) std::system(fmt::format("mkdir -p '{}'", out_dir).c_str());
  if (o.eval.gpu) {  // asked in a child: this process must not touch CUDA before it forks workers
    std::string why = gpu_unavailable_reason();
    if (!why.empty()) {
      fmt::print("SKIPPED: --gpu needs a GPU: {}\n", why);
      return 77;
    }
  }

  std::ofstream failures;
  if (!out_dir.empty()) failures.open(out_dir + "/failures.txt");
  const auto t0 = std::chrono::steady_clock::now();
  std::map<Status, int64_t> counts;
  int64_t tma_store_programs = 0;  // --tma-stores: programs lowered with a TMA store (Outcome::tma_store)
  std::map<std::string, std::vector<uint64_t>> by_signature;
  std::map<std::string, Outcome> example;
  uint64_t lowest = UINT64_MAX, highest = 0;
  run_seeds(o, first, last, time_limit, [&](const SeedResult& r) {
    ++counts[r.outcome.status];
    tma_store_programs += r.outcome.tma_store;
    lowest = std::min(lowest, r.seed);
    highest = std::max(highest, r.seed);
    if (r.outcome.status == Status::Ok || r.outcome.status == Status::NotEmulated) return;
    const std::string sig = r.outcome.signature();
    by_signature[sig].push_back(r.seed);
    if (!example.count(sig)) example[sig] = r.outcome;
    if (!quiet)
      fmt::print("seed {}: {} {} {}\n", r.seed, to_string(r.outcome.status), r.outcome.backend, r.outcome.detail.substr(0, 600));
    if (failures.is_open())
      failures << fmt::format("seed {}: {} {} {}\n", r.seed, to_string(r.outcome.status), r.outcome.backend, r.outcome.detail)
               << std::flush;
    std::fflush(stdout);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t total = 0, failed = 0;
  for (auto& [s, n] : counts) {
    total += n;
    if (s != Status::Ok && s != Status::NotEmulated) failed += n;
  }

  fmt::print("\n==== tilejit_fuzz summary ====\n");
  fmt::print("mode {}, backends", o.eval.gpu        ? "gpu (launched and compared)"
                                  : o.eval.emulate ? "emulate (lowered programs run on the host and compared)"
                                                   : "compile-only");
  for (auto b : o.eval.backends) fmt::print(" {}", jit::to_string(b));
  fmt::print(", seeds {}..{}, {} programs in {:.0f} s ({:.1f}/s), {} jobs\n", total ? lowest : 0, total ? highest : 0, total,
             secs, static_cast<double>(total) / std::max(secs, 1e-9), o.jobs);
  for (auto& [s, n] : counts) fmt::print("  {:16} {}\n", to_string(s), n);
  const double tma_pct = 100.0 * static_cast<double>(tma_store_programs) / static_cast<double>(std::max<int64_t>(total, 1));
  if (o.gen.tma_stores && (o.eval.emulate || o.eval.compile_backends))
    fmt::print("  TMA stores: {} of {} programs ({:.0f}%) lowered with pir tma_store\n", tma_store_programs, total, tma_pct);
  const bool too_few_tma = expect_tma_pct >= 0 && tma_pct < expect_tma_pct;
  if (too_few_tma)
    fmt::print("  FAILED: fewer TMA stores than --expect-tma-stores {}% (the generator no longer meets jit/wgmma_plan.cpp "
               "tma_reduce()'s conditions?)\n", expect_tma_pct);
  for (auto& [sig, seeds] : by_signature) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(seeds.size(), 8); ++i) list += fmt::format(" {}", seeds[i]);
    fmt::print("  {} x{}: seeds{}{}\n", sig, seeds.size(), list, seeds.size() > 8 ? " ..." : "");
  }
  // Each reduction runs in a child of its own: regenerating a program that crashed the generator
  // must not end this process.
  int reduced = 0;
  for (auto& [sig, seeds] : by_signature) {
    if (reduced >= reduce_n) break;
    if (example[sig].status == Status::GeneratorError) continue;  // the fuzzer's own bug: nothing to reduce
    ++reduced;
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) {
      Program p = generate(seeds.front(), o.gen);
      int evals = 0;
      Program small = reduce(p, example[sig], o.eval, o.timeout_s, reduce_time, &evals);
      Outcome again = run_isolated(small, o.eval, o.timeout_s);
      std::string text = fmt::format("// {}: {} {}\n// {}\n{}", sig, to_string(again.status), again.backend, again.detail,
                                     to_cpp(small));
      fmt::print("\n==== reduced seed {} ({} evaluations) ====\n{}", seeds.front(), evals, text);
      if (!out_dir.empty()) {
        std::ofstream(fmt::format("{}/reduced_{}.cpp", out_dir, seeds.front())) << text;
        write_ptx(small, out_dir, fmt::format("reduced_{}", seeds.front()));
      }
      std::fflush(stdout);
      _exit(0);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fmt::print("\nseed {}: the reduction ended abnormally\n", seeds.front());
  }
  return failed || too_few_tma ? 1 : 0;
}
