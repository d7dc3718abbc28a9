// attention_bench --cp: context-parallel attention (api/context_parallel.hpp) on every GPU of this
// machine, one thread and NCCL communicator per GPU, next to the single-GPU call on the same global
// sequence. Per-GPU TFLOP/s with the Long-Context Attention Benchmark's formula: 4 x allowed area x
// Hq x D (backward 2.5x) over the slowest rank's time, divided by W; efficiency = that over the
// single-GPU call's TFLOP/s at the same global length (same formula).
//
//   attention_bench --cp [--world W] [--tokens N] [--heads Hq] [--kv-heads Hkv] [--modes ring,ringF,ringP,ringA,allgather,allgather4,allgatherA,ulysses,ulysses4,ulyssesD,usp,usp4,uspA]
//                        [--causal 0|1 | --documents] [--dropout P] [--persistent 0|1] [--reps R]
//   default: W = every GPU, the benchmark's 8K tokens per GPU with 64 / 8 heads and 16 / 16 heads at
//   8K and 16K per GPU; full and causal, and the benchmark's causal documents (lengths log-uniform in
//   1K-32K; ring and usp as packed documents; --documents: only those); D 128 bf16, zigzag layout. One line per run:
//     CP mode=ring W=2 tokens_per_gpu=8192 S=16384 Hq=16 Hkv=16 D=128 mask=causal fwd_ms=.. bwd_ms=..
//       fwd_tflops_per_gpu=.. bwd_tflops_per_gpu=.. single_fwd_tflops=.. single_bwd_tflops=.. fwd_eff=.. bwd_eff=..
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/attention.hpp"
#include "api/context_parallel.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/nccl.hpp"
#include "bench/bench_util.hpp"

using namespace tilejit;

namespace {

struct CpConfig {
  int64_t tokens = 8192, Hq = 16, Hkv = 16, D = 128;
  bool causal = true;
  bool documents = false;  // causal documents (the benchmark's causal_document mask; ring and usp: packed documents)
  double dropout = 0;      // dropout_p (--dropout): the fused keep-mask in every call
  int persistent = -1;     // --persistent 0|1: the forward's grid in the context-parallel calls (-1: the runner's choice)
  double area(int64_t S) const {
    if (documents) {
      double a = 0;
      for (int64_t len : document_lengths(S)) a += double(len) * double(len + 1) / 2;
      return a;
    }
    return causal ? double(S) * double(S + 1) / 2 : double(S) * double(S);
  }
  double fwd_flops(int64_t S) const { return 4.0 * area(S) * double(Hq) * double(D); }
  // Packed documents of a long-context training batch: lengths drawn log-uniformly between 1K and
  // 32K tokens (seeded), multiples of 64 (usp cuts each document into 2W chunks), the last one cut
  // at S.
  static std::vector<int64_t> document_lengths(int64_t S) {
    std::vector<int64_t> out;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t at = 0; at < S;) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(x >> 11) / 9007199254740992.0;
      const int64_t len = std::min<int64_t>(S - at, static_cast<int64_t>(1024.0 * std::pow(32.0, u)) / 64 * 64);
      out.push_back(len);
      at += len;
    }
    return out;
  }
  std::string mask_name() const { return documents ? "causal_document" : causal ? "causal" : "full"; }
};

// The document id of every token (i32 [1, S]) on `device`.
runtime::DeviceBuffer document_ids(int64_t S, int device) {
  std::vector<int32_t> ids;
  int32_t d = 0;
  for (int64_t len : CpConfig::document_lengths(S)) {
    ids.insert(ids.end(), static_cast<size_t>(len), d);
    ++d;
  }
  runtime::DeviceBuffer buf(ids.size() * 4, device);
  buf.upload(ids.data(), ids.size() * 4);
  return buf;
}

// The documents' offsets (i32 [documents + 1]: 0, len_0, ..., S) on `device`: packed documents'
// cu_seqlens.
runtime::DeviceBuffer document_offsets(int64_t S, int device) {
  std::vector<int32_t> at{0};
  for (int64_t len : CpConfig::document_lengths(S)) at.push_back(at.back() + static_cast<int32_t>(len));
  runtime::DeviceBuffer buf(at.size() * 4, device);
  buf.upload(at.data(), at.size() * 4);
  return buf;
}

// The call's mask (causal, or causal documents over `ids`) and dropout.
void set_mask(attention::Options& a, const CpConfig& c, const runtime::DeviceBuffer& ids, int64_t S, int device) {
  a.causal = c.causal && !c.documents;
  a.dropout_p = c.dropout;
  if (c.documents)
    a.mask = attention::Mask{kernels::MaskSpec::causal_document(),
                             attention::contiguous(ids.ptr(), ir::DType::i32, {1, S}, device), {}, {}};
}

// `elems` random bf16 values on `device`.
runtime::DeviceBuffer random_on(int device, size_t elems, uint64_t seed) {
  return bench_util::random_buffer(elems * 2, ir::DType::bf16, seed, device);
}

// Milliseconds of `fn` on `stream`: `reps` runs after two warm-ups, each between events, median;
// every rank passes `sync` before each run so that all start together.
template <class F>
double time_rank(F&& fn, runtime::Stream& stream, int reps, std::barrier<>& sync) {
  for (int i = 0; i < 2; ++i) {
    fn();
    stream.synchronize();
  }
  runtime::Event a(stream.device()), b(stream.device());
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    sync.arrive_and_wait();
    a.record(stream);
    fn();
    b.record(stream);
    b.synchronize();
    ms.push_back(b.elapsed_ms(a));
  }
  return bench_util::median(ms);
}

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
};

// The single-GPU call on the whole sequence (device 0).
Timing single_gpu(const CpConfig& c, int64_t S, int reps) {
  runtime::Driver::get().context(0).make_current();
  runtime::Stream stream(0);
  const size_t nq = static_cast<size_t>(S * c.Hq * c.D), nkv = static_cast<size_t>(S * c.Hkv * c.D);
  runtime::DeviceBuffer q = random_on(0, nq, 1), k = random_on(0, nkv, 2), v = random_on(0, nkv, 3), dout = random_on(0, nq, 4);
  runtime::DeviceBuffer o(nq * 2), lse(static_cast<size_t>(c.Hq * S) * 4), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
  using attention::contiguous;
  const auto T = ir::DType::bf16;
  const attention::Tensor Q = contiguous(q.ptr(), T, {1, S, c.Hq, c.D}), K = contiguous(k.ptr(), T, {1, S, c.Hkv, c.D}),
                          V = contiguous(v.ptr(), T, {1, S, c.Hkv, c.D}), O = contiguous(o.ptr(), T, {1, S, c.Hq, c.D}),
                          dO = contiguous(dout.ptr(), T, {1, S, c.Hq, c.D}), L = contiguous(lse.ptr(), ir::DType::f32, {1, c.Hq, S}),
                          dQ = contiguous(dq.ptr(), T, {1, S, c.Hq, c.D}), dK = contiguous(dk.ptr(), T, {1, S, c.Hkv, c.D}),
                          dV = contiguous(dv.ptr(), T, {1, S, c.Hkv, c.D});
  attention::Options opts;
  const runtime::DeviceBuffer ids = document_ids(S, 0);
  set_mask(opts, c, ids, S, 0);
  runtime::DeviceBuffer ws(std::max(attention::backward_workspace_bytes(Q, K, opts), attention::forward_workspace_bytes(Q, K, opts)));
  std::barrier<> one(1);
  Timing t;
  t.fwd_ms = time_rank([&] { attention::forward(Q, K, V, O, L, opts, stream.handle(), {ws.ptr(), ws.bytes()}); }, stream, reps, one);
  t.bwd_ms = time_rank([&] { attention::backward(Q, K, V, O, dO, L, dQ, dK, dV, opts, stream.handle(), {ws.ptr(), ws.bytes()}); },
                       stream, reps, one);
  return t;
}

// Every rank of a W-GPU group on its own thread; the slowest rank's median times.
// A --modes entry: "ring", "allgather", "ulysses", "usp"; "usp" (Ulysses groups of 2, a ring across
// them) or "uspU" (groups of U); "ulyssesG" / "allgatherG": the all-to-all / the gather pipelined
// over G head groups (plain: the default); "ringF" / "ringP": the ring with fused_sums on / off (the
// kernels add into the f32 sums, or write bf16 parts that separate passes add). A trailing "A": the
// atomic dQ reduction (decision 112); "D": attention.deterministic (ulysses: its single-GPU call's
// deterministic reduction). Plain: the defaults.
struct ModeRun {
  cp::Mode mode = cp::Mode::ring;
  int ulysses_degree = 0, head_groups = 0;
  bool fused_sums = cp::Options{}.fused_sums;
  std::optional<attention::DqReduction> reduction;
  bool deterministic = false;
};

ModeRun parse_mode(std::string name) {
  ModeRun m;
  if (name.size() > 1 && name.back() == 'A') m.reduction = attention::DqReduction::atomic, name.pop_back();
  else if (name.size() > 1 && name.back() == 'D') m.deterministic = true, name.pop_back();
  const bool usp = name.rfind("usp", 0) == 0, uly = name.rfind("ulysses", 0) == 0, ag = name.rfind("allgather", 0) == 0,
             fused_named = name == "ringF" || name == "ringP";
  if (name == "ringP") m.fused_sums = false;
  if (name == "ringF") m.fused_sums = true;
  m.ulysses_degree = !usp ? 0 : name.size() > 3 ? std::atoi(name.c_str() + 3) : 2;
  m.head_groups = uly && name.size() > 7 ? std::atoi(name.c_str() + 7) : ag && name.size() > 9 ? std::atoi(name.c_str() + 9) : 0;
  m.mode = usp ? cp::Mode::usp : name == "ring" || fused_named ? cp::Mode::ring : ag ? cp::Mode::allgather : cp::Mode::ulysses;
  return m;
}

Timing context_parallel(const CpConfig& c, const ModeRun& run, int W, int reps) {
  const cp::Mode mode = run.mode;
  const runtime::nccl::UniqueId id = runtime::nccl::make_unique_id();
  const int64_t S = c.tokens * W;
  std::barrier<> sync(W);
  std::mutex m;
  Timing worst;
  std::vector<std::string> errors;
  auto rank_main = [&](int r) {
    try {
      runtime::Driver::get().context(r).make_current();
      runtime::nccl::Communicator comm = runtime::nccl::Communicator::create(id, r, W, r);
      cp::ContextParallel runner(comm);
      cp::Options opts;
      opts.mode = mode;
      opts.ulysses_degree = run.ulysses_degree;
      opts.head_groups = run.head_groups;
      opts.fused_sums = run.fused_sums;
      opts.attention.dq_reduction = run.reduction;
      opts.attention.deterministic = run.deterministic;
      const runtime::DeviceBuffer ids = document_ids(S, r), offsets = document_offsets(S, r);
      // ring and usp take no library masks: the same documents as packed documents (each its own
      // causal attention, cut into zigzag chunks of its own), the others as the causal_document mask
      const bool packed = c.documents && (mode == cp::Mode::ring || mode == cp::Mode::usp);
      if (packed) {
        opts.document_lengths = CpConfig::document_lengths(S);
        opts.attention.causal = true;
        opts.attention.dropout_p = c.dropout;
        const auto docs = static_cast<int64_t>(opts.document_lengths.size());
        opts.attention.cu_seqlens_q = opts.attention.cu_seqlens_k = attention::contiguous(offsets.ptr(), ir::DType::i32, {docs + 1}, r);
        opts.attention.max_seqlen_q = opts.attention.max_seqlen_k =
            *std::max_element(opts.document_lengths.begin(), opts.document_lengths.end());
      } else {
        set_mask(opts.attention, c, ids, S, r);
      }
      if (c.persistent >= 0) opts.attention.persistent = c.persistent == 1;
      const int64_t n = packed ? cp::ShardLayout(opts.layout, W, opts.document_lengths).local_len(r)
                               : cp::ShardLayout(opts.layout, W, S).local_len(r);
      const size_t nq = static_cast<size_t>(n * c.Hq * c.D), nkv = static_cast<size_t>(n * c.Hkv * c.D);
      const uint64_t seed = 100 * static_cast<uint64_t>(r);
      runtime::DeviceBuffer q = random_on(r, nq, seed + 1), k = random_on(r, nkv, seed + 2), v = random_on(r, nkv, seed + 3),
                            dout = random_on(r, nq, seed + 4);
      runtime::DeviceBuffer o(nq * 2, r), lse(static_cast<size_t>(c.Hq * n) * 4, r), dq(nq * 2, r), dk(nkv * 2, r), dv(nkv * 2, r);
      const auto T = ir::DType::bf16;
      using attention::contiguous;
      const attention::Tensor Q = contiguous(q.ptr(), T, {1, n, c.Hq, c.D}, r), K = contiguous(k.ptr(), T, {1, n, c.Hkv, c.D}, r),
                              V = contiguous(v.ptr(), T, {1, n, c.Hkv, c.D}, r), O = contiguous(o.ptr(), T, {1, n, c.Hq, c.D}, r),
                              dO = contiguous(dout.ptr(), T, {1, n, c.Hq, c.D}, r),
                              L = contiguous(lse.ptr(), ir::DType::f32, {1, c.Hq, n}, r),
                              dQ = contiguous(dq.ptr(), T, {1, n, c.Hq, c.D}, r), dK = contiguous(dk.ptr(), T, {1, n, c.Hkv, c.D}, r),
                              dV = contiguous(dv.ptr(), T, {1, n, c.Hkv, c.D}, r);
      runtime::Stream stream(r);
      const double f = time_rank([&] { runner.forward(Q, K, V, O, L, S, opts, stream.handle()); }, stream, reps, sync);
      const double b = time_rank([&] { runner.backward(Q, K, V, O, dO, L, dQ, dK, dV, S, opts, stream.handle()); }, stream, reps, sync);
      std::lock_guard lock(m);
      worst.fwd_ms = std::max(worst.fwd_ms, f);
      worst.bwd_ms = std::max(worst.bwd_ms, b);
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      errors.push_back(fmt::format("rank {}: {}", r, e.what()));
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      std::abort();  // the other ranks would wait in NCCL forever
    }
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < W; ++r) ranks.emplace_back(rank_main, r);
  for (std::thread& t : ranks) t.join();
  return worst;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

}  // namespace

int run_cp_bench(int argc, char** argv) {
  runtime::Driver& drv = runtime::Driver::get();
  if (!drv.available()) {
    std::fprintf(stderr, "attention_bench --cp: no GPU: %s\n", drv.unavailable_reason().c_str());
    return 1;
  }
  if (!runtime::nccl::available()) {
    std::fprintf(stderr, "attention_bench --cp: %s\n", runtime::nccl::unavailable_reason().c_str());
    return 1;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  int world = drv.device_count(), reps = 10, only_causal = -1;
  bool documents_only = false;  // --documents: only the causal-document runs
  std::vector<CpConfig> configs;
  CpConfig custom;
  bool has_custom = false;
  std::vector<std::string> modes{"ring", "allgather", "ulysses"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--cp") continue;
    if (a == "--world") world = std::atoi(next().c_str());
    else if (a == "--tokens") custom.tokens = std::atoll(next().c_str()), has_custom = true;
    else if (a == "--heads") custom.Hq = std::atoll(next().c_str()), has_custom = true;
    else if (a == "--kv-heads") custom.Hkv = std::atoll(next().c_str()), has_custom = true;
    else if (a == "--modes") modes = split(next());
    else if (a == "--causal") only_causal = std::atoi(next().c_str());
    else if (a == "--documents") documents_only = true;
    else if (a == "--dropout") custom.dropout = std::atof(next().c_str()), has_custom = true;
    else if (a == "--persistent") custom.persistent = std::atoi(next().c_str()), has_custom = true;
    else if (a == "--reps") reps = std::max(1, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "attention_bench --cp: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (world < 1 || world > drv.device_count()) {
    std::fprintf(stderr, "attention_bench --cp: --world %d but %d GPUs\n", world, drv.device_count());
    return 2;
  }
  if (has_custom) {
    if (custom.Hkv > custom.Hq || custom.Hq % custom.Hkv) custom.Hkv = custom.Hq;
    configs.push_back(custom);
  } else {
    configs = {CpConfig{8192, 64, 8, 128, true}, CpConfig{8192, 16, 16, 128, true}, CpConfig{16384, 16, 16, 128, true}};
  }
  for (CpConfig base : configs)
    for (int variant : {0, 1, 2}) {  // full, causal, causal documents (the benchmark's configuration only)
      const bool docs = variant == 2;
      if (docs && !(base.Hq == 64 && base.Hkv == 8) && !documents_only) continue;
      if (documents_only != docs) continue;
      if (!docs && only_causal >= 0 && variant != only_causal) continue;
      CpConfig c = base;
      c.causal = variant != 0;
      c.documents = docs;
      const int64_t S = c.tokens * world;
      const Timing one = single_gpu(c, S, reps);
      const double f1 = c.fwd_flops(S) / one.fwd_ms * 1e-9, b1 = 2.5 * c.fwd_flops(S) / one.bwd_ms * 1e-9;
      for (const std::string& mode_name : modes) {
        const ModeRun run = parse_mode(mode_name);
        if (run.mode == cp::Mode::usp && (run.ulysses_degree < 1 || world % run.ulysses_degree)) {
          fmt::print("CP mode={} W={} skipped=ulysses_degree {} does not divide the world\n", mode_name, world, run.ulysses_degree);
          continue;
        }
        if (run.reduction && c.documents && (run.mode == cp::Mode::ring || run.mode == cp::Mode::usp)) {
          fmt::print("CP mode={} W={} skipped=packed documents take the recompute reduction only\n", mode_name, world);
          continue;
        }
        const Timing t = context_parallel(c, run, world, reps);
        const double f = c.fwd_flops(S) / t.fwd_ms * 1e-9 / world, b = 2.5 * c.fwd_flops(S) / t.bwd_ms * 1e-9 / world;
        fmt::print(
            "CP mode={} W={} tokens_per_gpu={} S={} Hq={} Hkv={} D={} mask={} dropout={} fwd_ms={:.3f} bwd_ms={:.3f} fwd_tflops_per_gpu={:.1f} "
            "bwd_tflops_per_gpu={:.1f} single_fwd_tflops={:.1f} single_bwd_tflops={:.1f} fwd_eff={:.3f} bwd_eff={:.3f}\n",
            mode_name, world, c.tokens, S, c.Hq, c.Hkv, c.D, c.mask_name(), c.dropout, t.fwd_ms, t.bwd_ms, f, b, f1, b1, f / f1, b / b1);
        std::fflush(stdout);
      }
    }
  return 0;
}
