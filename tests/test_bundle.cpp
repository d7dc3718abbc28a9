// Bundles without a GPU: write -> read -> verify round trips, keys that leave the compilers out,
// lookups through compile_cached with the compilers disabled (nothing compiled), the error for a
// kernel no bundle holds, damaged files refused with clear errors, the --emit-cpp source.
//
// Built twice: test_bundle (everything below) and, with TILEJIT_TEST_EMBEDDED_BUNDLE, linked with a
// source `tilejit bundle --emit-cpp` wrote at build time, to show that linking it registers the
// kernels before main() runs.
#include <doctest/doctest.h>

#include "child_process.hpp"
#include "compiled_kernel_checks.hpp"
#include "temp_dir.hpp"
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "dsl/ir/sha256.hpp"
#include "kernels/attention/mask.hpp"
#include "api/attention.hpp"
#include "api/attention/internal.hpp"
#include "api/tuning.hpp"
#include "api/registry.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/bundle.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/driver.hpp"

using namespace tilejit;
using tilejit::testing::check_same;

namespace fs = std::filesystem;
using runtime::Bundle;
using runtime::BundleEntry;
using runtime::BundleEntrySpec;
using runtime::BundleError;

namespace {

using tilejit::testing::ScopedEnv;

// Every test starts and ends with no bundle loaded and empty compile-cache statistics.
struct CleanRegistry {
  CleanRegistry() {
    runtime::unload_all_bundles();
    runtime::reset_memory_cache();
  }
  ~CleanRegistry() {
    runtime::unload_all_bundles();
    runtime::reset_memory_cache();
  }
};

}  // namespace

#ifndef TILEJIT_TEST_EMBEDDED_BUNDLE

namespace {



struct TempDir : tilejit::testing::TempDir {
  TempDir() : tilejit::testing::TempDir("tilejit-bundle-test") {}
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, std::string_view data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::span<const uint8_t> as_span(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// Replace the trailing SHA-256 so that only the deliberate damage is wrong.
std::string reseal(std::string data) {
  data.resize(data.size() - 32);
  auto sum = ir::sha256(data);
  data.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  return data;
}

// The error read_bundle_bytes gives for `bytes` (empty when it reads them without one).
std::string read_error(std::string_view bytes, const std::string& name = "victim.tjb") {
  try {
    runtime::read_bundle_bytes(as_span(bytes), name);
  } catch (const BundleError& e) {
    return e.what();
  }
  return {};
}

// Small, every field set to something unusual (tensor maps, 64-bit values, NUL bytes): cheap
// enough to damage at every byte.
jit::CompiledKernel synthetic(const std::string& name, const std::string& arch) {
  using namespace jit::pir;
  jit::CompiledKernel k;
  k.name = name;
  k.arch = arch;
  k.backend = jit::Backend::Nvrtc;
  k.num_threads = 384;
  k.smem_bytes = (int64_t{1} << 33) + 5;
  k.abi = {{"A", pointer(ir::DType::bf16)}, {"A_size0", scalar(ir::DType::i32)}, {"x", scalar(ir::DType::f8e5m2)}};
  k.tensor_maps = {{5, 0, {64, 128}, 128}};
  k.tile_ir = "kernel @" + name + "() {}\n";
  k.ptx = ".version 8.5\n.target " + arch + "\n";
  for (int i = 0; i < 64; ++i) k.cubin.push_back(static_cast<uint8_t>(i * 7));
  k.info = {name, arch, 168, 1024, -1, 8, 16, 400};
  k.ptx_tool = "nvJitLink 13.0";
  return k;
}

Bundle synthetic_bundle(const std::vector<std::string>& archs = {"sm_90a"}) {
  Bundle b;
  b.name = "synthetic";
  for (const std::string& arch : archs)
    for (const char* kernel : {"alpha", "beta"}) {
      BundleEntry e;
      e.key = ir::sha256_hex(fmt::format("{} {}", kernel, arch));
      e.kernel = kernel;
      e.meta = "BLOCK=64";
      e.schedule = "warps=4,stages=3,pipeline=on,backend=nvrtc";
      e.arch = arch;
      e.compiled = synthetic(kernel, arch);
      b.entries.push_back(std::move(e));
    }
  b.archs = archs;
  return b;
}

std::vector<BundleEntrySpec> two_gemms() {
  return {library::bundle_spec("gemm"),
          library::bundle_spec("gemm", {{"BLOCK_N", 128}, {"OUT_DTYPE", ir::DType::bf16}})};
}

// The real bundle of the suite (two GEMM specialisations), made once.
const Bundle& gemm_bundle() {
  static const Bundle b = [] {
    ScopedEnv on("TILEJIT_DISABLE_COMPILERS", nullptr);  // whichever test asks first
    return runtime::make_bundle(two_gemms());
  }();
  return b;
}

}  // namespace

TEST_CASE("bundle keys leave the compilers out and keep what changes the code") {
  const BundleEntrySpec spec = library::bundle_spec("gemm");
  CHECK(spec.options.num_warps == 8);
  CHECK(spec.options.pipeline.stages == 4);
  const ir::Function f = spec.build();
  const jit::CompileOptions& o = spec.options;
  const std::string k0 = runtime::bundle_key(f, o);
  CHECK(k0.size() == 64);
  CHECK(k0.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(spec.key() == k0);
  CHECK(runtime::bundle_key(spec.build(), o) == k0);  // rebuilt IR, same key
  CHECK(runtime::bundle_key_from_hash(ir::structural_hash(f), f.name, o) == k0);
  CHECK(k0 != runtime::cache_key(f, o));

  auto with = [&](auto change) {
    jit::CompileOptions c = o;
    change(c);
    return runtime::bundle_key(f, c);
  };
  // Compiler choices do not move it: a shipped application has no compilers to ask.
  CHECK(with([](auto& c) { c.backend = jit::Backend::Nvrtc; }) == k0);
  CHECK(with([](auto& c) { c.ptx_tool = jit::PtxTool::Ptxas; }) == k0);
  CHECK(with([](auto& c) { c.make_cubin = false; }) == k0);
  CHECK(with([](auto& c) { c.dump_after = "lower"; }) == k0);
  std::string text = runtime::bundle_key_text(f, o);
  for (const char* absent : {"llvm=", "ptx_tools=", "nvrtc=", "backend="})
    CHECK_MESSAGE(text.find(absent) == std::string::npos, absent);
  for (const char* present : {"tilejit=0.1.16", "ir=", "kernel=gemm", "arch=sm_90a", "num_warps=8", "pipeline=enabled:1,stages:4"})
    CHECK_MESSAGE(text.find(present) != std::string::npos, present);
  CHECK(ir::sha256_hex(text) == k0);
  // a register bound is named only when set (keys without one stay what they were), and in the
  // schedule a bundle lists
  CHECK(text.find("min_programs_per_sm") == std::string::npos);
  jit::CompileOptions bounded = o;
  bounded.min_programs_per_sm = 3;
  CHECK(runtime::bundle_key_text(f, bounded).find("min_programs_per_sm=3\n") != std::string::npos);
  CHECK(runtime::describe_schedule(bounded) == "warps=8,stages=4,min_programs_per_sm=3,pipeline=on,backend=llvm");
  CHECK(runtime::describe_schedule(o) == "warps=8,stages=4,pipeline=on,backend=llvm");
  jit::CompileOptions registers = o;  // once-loaded A windows through registers: also named only when set
  registers.pipeline.once_by_tma = false;
  CHECK(text.find("once_by_tma") == std::string::npos);
  CHECK(runtime::bundle_key_text(f, registers).find("once_by_tma=0\n") != std::string::npos);
  CHECK(runtime::describe_schedule(registers) == "warps=8,stages=4,pipeline=on,once_by_tma=off,backend=llvm");

  // What changes the code does.
  std::set<std::string> seen{k0};
  for (const std::string& k :
       {with([](auto& c) { c.arch = "sm_80"; }), with([](auto& c) { c.num_warps = 4; }),
        with([](auto& c) { c.pipeline.stages = 3; }), with([](auto& c) { c.pipeline.enabled = false; }),
        with([](auto& c) { c.min_programs_per_sm = 3; }), with([](auto& c) { c.pipeline.once_by_tma = false; }),
        runtime::bundle_key(library::bundle_spec("gemm", {{"BLOCK_N", 128}}).build(), o),
        runtime::bundle_key(library::bundle_spec("attention_fwd").build(), o)})
    CHECK(seen.insert(k).second);

  // The user's meta lies over the library defaults; unknown kernels are named.
  CHECK(library::bundle_spec("gemm", {{"BLOCK_N", 256}}).key() == k0);
  CHECK_THROWS_WITH_AS(library::bundle_spec("no_such_kernel"),
                       doctest::Contains("'no_such_kernel' is not a library kernel (known: gemm"), std::invalid_argument);

  // The block-mask pre-pass at its registry defaults is what the attention API compiles for a
  // forward with a list mask (api/attention/functions.cpp: 4 key tiles a program, 8 warps at
  // 128 x 128, 2 stages; the lists on 4 warps), so a bundle entry `attention_block_classes:MASK=6`
  // serves it with no compiler.
  jit::CompileOptions api;
  api.num_warps = 8;
  api.pipeline.stages = 2;
  CHECK(library::bundle_spec("attention_block_classes", {{"MASK", 6}}).key() ==
        runtime::bundle_key(kernels::attention_block_classes().build({{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"MASK", 6}, {"TILES", 4}}), api));
  api.num_warps = 4;
  CHECK(library::bundle_spec("attention_block_lists", {{"KV_MAJOR", true}}).key() ==
        runtime::bundle_key(kernels::attention_block_lists().build({{"KV_MAJOR", true}}), api));
}

TEST_CASE("write -> read -> verify: every field of every entry round-trips") {
  TempDir tmp;
  const Bundle& made = gemm_bundle();
  REQUIRE(made.entries.size() == 2);
  const fs::path path = tmp.path / "sub" / "gemms.tjb";
  runtime::save_bundle(path, made);
  CHECK(fs::exists(path));
  // Only the bundle is left in the directory (the temporary file was renamed).
  CHECK(std::distance(fs::directory_iterator(path.parent_path()), fs::directory_iterator()) == 1);

  const Bundle read = runtime::read_bundle(path);
  CHECK(read.name == path.string());
  CHECK(read.format_version == 2);  // 2: TMA descriptors by value
  CHECK(read.tilejit_version == "0.1.16");
  CHECK(read.archs == std::vector<std::string>{"sm_90a"});
  CHECK(read.bytes == fs::file_size(path));
  CHECK(read.tuning_version == runtime::kBundleTuningVersion);
  CHECK(read.tuning.empty());
  REQUIRE(read.entries.size() == made.entries.size());
  const std::vector<BundleEntrySpec> specs = two_gemms();
  for (size_t i = 0; i < read.entries.size(); ++i) {
    const BundleEntry& a = made.entries[i];
    const BundleEntry& b = read.entries[i];
    INFO("entry " << i);
    CHECK(b.key == a.key);
    CHECK(b.key == specs[i].key());
    CHECK(b.kernel == "gemm");
    CHECK(b.arch == "sm_90a");
    CHECK(b.meta == a.meta);
    CHECK(b.schedule == "warps=8,stages=4,pipeline=on,backend=llvm");
    CHECK(!b.compiled.cubin.empty());
    CHECK(!b.compiled.ptx.empty());
    CHECK(b.compiled.tensor_maps.size() == 2);  // the TMA + wgmma schedule
    check_same(a.compiled, b.compiled);
  }
  CHECK(read.entries[0].meta.find("BLOCK_N=256") != std::string::npos);
  CHECK(read.entries[1].meta.find("BLOCK_N=128") != std::string::npos);
  CHECK(read.entries[1].meta.find("OUT_DTYPE=bf16") != std::string::npos);

  // Canonical: re-encoding what was read gives the same bytes; bytes and file read alike.
  CHECK(runtime::encode_bundle(read) == read_bytes(path));
  const std::string bytes = read_bytes(path);
  CHECK(runtime::read_bundle_bytes(as_span(bytes), "copy").entries.size() == 2);

  // A spec repeated (here as the same key through a different backend) is built once.
  std::vector<BundleEntrySpec> repeated = {specs[1], specs[1]};
  repeated[1].options.backend = jit::Backend::Nvrtc;
  CHECK(runtime::make_bundle(repeated).entries.size() == 1);

  // write_bundle is make + save.
  runtime::write_bundle(tmp.path / "one.tjb", {specs[1]});
  CHECK(runtime::read_bundle(tmp.path / "one.tjb").entries.at(0).key == specs[1].key());
}

TEST_CASE("synthetic bundles: several archs, tuning bytes kept, every value round-trips") {
  Bundle b = synthetic_bundle({"sm_90a", "sm_80"});
  b.tuning = std::string("\0tuning\xff", 8);
  const std::string bytes = runtime::encode_bundle(b);
  const Bundle r = runtime::read_bundle_bytes(as_span(bytes), "mem");
  CHECK(r.name == "mem");
  CHECK(r.archs == std::vector<std::string>{"sm_90a", "sm_80"});
  CHECK(r.tuning == b.tuning);
  REQUIRE(r.entries.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(r.entries[i].key == b.entries[i].key);
    CHECK(r.entries[i].meta == b.entries[i].meta);
    CHECK(r.entries[i].schedule == b.entries[i].schedule);
    check_same(b.entries[i].compiled, r.entries[i].compiled);
  }
  // An empty bundle is valid too.
  Bundle empty;
  CHECK(runtime::read_bundle_bytes(as_span(runtime::encode_bundle(empty))).entries.empty());
}

TEST_CASE("compile_cached finds bundled kernels with the compilers disabled and compiles nothing") {
  CleanRegistry clean;
  TempDir tmp;
  const fs::path path = tmp.path / "gemms.tjb";
  runtime::save_bundle(path, gemm_bundle());
  runtime::CompileCache disk(tmp.path / "cache");

  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  REQUIRE(jit::compilers_disabled());
  tilejit::load_bundle(path);  // the alias an application calls
  REQUIRE(runtime::loaded_bundles().size() == 1);
  CHECK(runtime::loaded_bundles()[0].name == path.string());
  CHECK(runtime::loaded_bundles()[0].entries == 2);
  CHECK(runtime::bundles_loaded());

  for (size_t i = 0; i < 2; ++i) {
    const BundleEntrySpec spec = two_gemms()[i];
    jit::CompiledKernel k = runtime::compile_cached(spec.build(), spec.options, disk);
    check_same(k, gemm_bundle().entries[i].compiled);
    CHECK(k.timings.passes_ms == 0);
  }
  // Another backend asks for the same computation: the bundled kernel serves it.
  BundleEntrySpec nvrtc = two_gemms()[0];
  nvrtc.options.backend = jit::Backend::Nvrtc;
  CHECK(runtime::compile_cached(nvrtc.build(), nvrtc.options, disk).cubin == gemm_bundle().entries[0].compiled.cubin);
  // And through the global cache (what runtime::run uses).
  CHECK(!runtime::compile_cached(two_gemms()[1].build(), two_gemms()[1].options).cubin.empty());

  const runtime::CompileCacheStats s = runtime::compile_cache_stats();
  CHECK(s.compiles == 0);
  CHECK(s.bundle_hits == 4);
  CHECK(s.disk_hits == 0);
  CHECK(s.memory_hits == 0);
  CHECK(!fs::exists(tmp.path / "cache"));  // nothing was stored either

  // find_bundled directly.
  CHECK(runtime::find_bundled(two_gemms()[0].key()));
  CHECK(!runtime::find_bundled(std::string(64, '0')));

  // Loading the same kernels again is harmless; the first copy stays.
  runtime::load_bundle(path);
  CHECK(runtime::loaded_bundles().size() == 2);
  CHECK(runtime::loaded_bundles()[1].new_entries == 0);
  runtime::unload_all_bundles();
  CHECK(!runtime::bundles_loaded());
  CHECK(!runtime::find_bundled(two_gemms()[0].key()));
}

TEST_CASE("with compilers enabled, bundles still come first; without a bundle the JIT runs") {
  CleanRegistry clean;
  TempDir tmp;
  runtime::CompileCache disk(tmp.path / "cache");
  ScopedEnv on("TILEJIT_DISABLE_COMPILERS", nullptr);
  const std::string bytes = runtime::encode_bundle(gemm_bundle());
  runtime::load_bundle_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "in memory");
  const BundleEntrySpec spec = two_gemms()[1];
  runtime::compile_cached(spec.build(), spec.options, disk);
  CHECK(runtime::compile_cache_stats().bundle_hits == 1);
  CHECK(runtime::compile_cache_stats().compiles == 0);
  runtime::unload_all_bundles();
  jit::CompiledKernel k = runtime::compile_cached(spec.build(), spec.options, disk);
  CHECK(runtime::compile_cache_stats().compiles == 1);
  CHECK(k.cubin.size() > 0);
}

// An application that ships the attention API: the kernels `attention::prepare` compiles for its
// configuration, written as a bundle, serve every one of prepare's lookups with the compilers
// disabled (both dK/dV kernels: for 16-byte aligned lse and for the others).
TEST_CASE("attention::bundle_specs: the API's kernels, bundled, serve prepare with the compilers disabled") {
  if (!attention::backward_available()) {
    MESSAGE("SKIPPED: the backward kernels are not in this build");
    return;
  }
  CleanRegistry clean;
  TempDir tmp;
  const std::vector<BundleEntrySpec> specs = attention::bundle_specs(ir::DType::bf16, 64, kernels::MaskKind::causal);
  std::multiset<std::string> names;
  for (const BundleEntrySpec& s : specs) names.insert(s.kernel);
  // (recompute's dK/dV and dQ; atomic's dK/dV and convert, the default from S_q 4k: decision 101)
  CHECK(names == std::multiset<std::string>{"attention_fwd", "attention_bwd_preprocess", "attention_bwd_dkdv", "attention_bwd_dkdv",
                                            "attention_bwd_dq", "attention_bwd_dkdv", "attention_bwd_dkdv", "attention_bwd_dq_convert"});
  const fs::path path = tmp.path / "attention.tjb";
  runtime::write_bundle(path, specs);
  runtime::reset_memory_cache();  // (zeroes the statistics)
  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  tilejit::load_bundle(path);
  attention::prepare(ir::DType::bf16, 64, kernels::MaskKind::causal);
  const runtime::CompileCacheStats st = runtime::compile_cache_stats();
  CHECK(st.compiles == 0);
  CHECK(st.disk_hits == 0);
  CHECK(st.bundle_hits == specs.size());
  // checked as prepare checks, in its own name
  CHECK_THROWS_WITH_AS(attention::bundle_specs(ir::DType::f32, 64, kernels::MaskKind::full),
                       doctest::Contains("tilejit::attention::bundle_specs: dtype f32; supported: bf16, f16"), std::invalid_argument);
}

// What `tilejit tune attention_fwd --shape 4,16,4096,128 --bundle tuned.tjb` writes (a chosen config's
// kernel and the tuning table), loaded by an application without compilers: attention::forward's
// tuned configuration finds that kernel, and its table entry.
TEST_CASE("a tuned attention bundle serves the API's tuned forward with the compilers disabled (issue 29)") {
  CleanRegistry clean;
  TempDir tmp;
  const runtime::TuningSpace& space = library::attention_fwd_tuning_space();
  const lang::Meta fixed = library::library_fixed_meta(
      "attention_fwd", {{"HEAD_DIM", int64_t{128}}, {"CAUSAL", true}, {"POSITIVE_SCALE", true}, {"BSHD", true}, {"DTYPE", ir::DType::bf16}});
  const runtime::Shape shape{{"B", 4}, {"H", 16}, {"S", 4096}, {"D", 128}};
  runtime::TuneResult r;
  r.identity = runtime::Autotuner(space).identity(shape, fixed);
  r.best = runtime::parse_config(
      "BLOCK_M=128,BLOCK_N=128,warps=8,stages=3,min_programs=0,EXACT_NORMALIZE=0,PERSISTENT=1,RING_PRODUCER=1,PIPELINE_PV=1,"
      "PIPELINE_QK=0,TMA_STORE=1");
  r.best_ms = 0.44;
  jit::CompileOptions base;
  base.specialize = false;  // (tilejit tune attention_fwd compiles as the API does)
  runtime::TunedBundleContent content;
  runtime::add_to_bundle_content(content, space, r, fixed, base);
  runtime::Bundle b = runtime::make_bundle(content.specs);
  b.tuning = runtime::encode_tuning_table(content.table);
  const fs::path path = tmp.path / "tuned.tjb";
  runtime::save_bundle(path, b);
  runtime::reset_memory_cache();
  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  tilejit::load_bundle(path);

  attention::detail::Config c{};
  c.pass = attention::Pass::forward;
  c.dtype = ir::DType::bf16;
  c.head_dim = 128;
  c.causal = true;
  c.positive_scale = true;
  c.sch = attention::default_schedule(attention::Pass::forward, c.dtype, 128, true);
  c.persistent = true;
  attention::detail::Dims d;
  d.batch = 4, d.heads_q = d.heads_kv = 16, d.seq_q = d.seq_k = 4096, d.head_dim = 128;
  const attention::detail::Config t = attention::detail::with_tuned_choice(c, d);
  REQUIRE(t.tuned.has_value());
  CHECK(t.sch.stages == 3);
  attention::detail::function_for(t).compiled();
  const runtime::CompileCacheStats st = runtime::compile_cache_stats();
  CHECK(st.compiles == 0);
  CHECK(st.bundle_hits == 1);
  runtime::unload_all_bundles();
}

TEST_CASE("a kernel no loaded bundle holds, with compilers disabled, is a clear error") {
  CleanRegistry clean;
  TempDir tmp;
  runtime::CompileCache disk(tmp.path / "cache");
  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  const BundleEntrySpec missing = library::bundle_spec("gemm", {{"BLOCK_N", 64}});
  const ir::Function f = missing.build();

  // jit::compile refuses at once, before any compiler.
  CHECK_THROWS_WITH_AS(jit::compile(f, missing.options),
                       doctest::Contains("tilejit: kernel 'gemm' is not in a loaded bundle and compilers are disabled "
                                         "(TILEJIT_DISABLE_COMPILERS=1)"),
                       jit::CompileError);

  // No bundle at all.
  std::string none;
  try {
    runtime::compile_cached(f, missing.options, disk);
  } catch (const jit::CompileError& e) {
    none = e.what();
  }
  MESSAGE(none);
  CHECK(none.find("tilejit: kernel 'gemm' is not in a loaded bundle and compilers are disabled "
                  "(TILEJIT_DISABLE_COMPILERS=1)") == 0);
  CHECK(none.find("no bundle is loaded") != std::string::npos);
  CHECK(none.find("BLOCK_N=64") != std::string::npos);
  CHECK(none.find(runtime::bundle_key(f, missing.options)) != std::string::npos);
  CHECK(none.find("tilejit bundle -o FILE --arch sm_90a gemm:") != std::string::npos);

  // A bundle with other GEMMs: the error lists what it does hold.
  const std::string bytes = runtime::encode_bundle(gemm_bundle());
  runtime::load_bundle_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "gemms.tjb");
  std::string other;
  try {
    runtime::compile_cached(f, missing.options, disk);
  } catch (const jit::CompileError& e) {
    other = e.what();
  }
  MESSAGE(other);
  CHECK(other.find("loaded bundles: gemms.tjb (2 kernels)") != std::string::npos);
  CHECK(other.find("BLOCK_N=256") != std::string::npos);
  CHECK(other.find("BLOCK_N=128") != std::string::npos);

  // Another arch of a bundled kernel is not the same kernel.
  BundleEntrySpec sm80 = two_gemms()[0];
  sm80.options.arch = "sm_80";
  CHECK_THROWS_AS(runtime::compile_cached(sm80.build(), sm80.options, disk), jit::CompileError);
  // A dump request needs the compiler.
  jit::CompileOptions dump = two_gemms()[0].options;
  dump.dump_after = "lower";
  CHECK_THROWS_AS(runtime::compile_cached(two_gemms()[0].build(), dump, disk), jit::CompileError);

  const runtime::CompileCacheStats s = runtime::compile_cache_stats();
  CHECK(s.compiles == 0);
  CHECK(s.bundle_hits == 0);
  CHECK(!fs::exists(tmp.path / "cache"));
}

TEST_CASE("the switch: TILEJIT_DISABLE_COMPILERS values") {
  for (const char* v : {"1", "true", "TRUE", "yes", "on"}) {
    ScopedEnv e("TILEJIT_DISABLE_COMPILERS", v);
    CHECK_MESSAGE(jit::compilers_disabled(), v);
  }
  for (const char* v : {"0", "", "false", "off", "no", "2"}) {
    ScopedEnv e("TILEJIT_DISABLE_COMPILERS", v);
    CHECK_MESSAGE(!jit::compilers_disabled(), v);
  }
  ScopedEnv unset("TILEJIT_DISABLE_COMPILERS", nullptr);
  CHECK(!jit::compilers_disabled());
}

TEST_CASE("damaged bundles are refused with errors naming the file and the problem, never a crash") {
  const Bundle b = synthetic_bundle();
  const std::string good = runtime::encode_bundle(b);
  REQUIRE(read_error(good).empty());

  SUBCASE("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) {
      INFO("length " << n << " of " << good.size());
      std::string e = read_error(good.substr(0, n));
      CHECK(e.find("tilejit: bundle victim.tjb: truncated") == 0);
    }
    CHECK(read_error(good.substr(0, 1000)).find(fmt::format("truncated: 1000 of {} bytes", good.size())) !=
          std::string::npos);
  }
  SUBCASE("one flipped bit at every position") {
    for (size_t i = 0; i < good.size(); ++i) {
      INFO("byte " << i);
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
      std::string e = read_error(bad);
      CHECK(e.find("tilejit: bundle victim.tjb: ") == 0);
      if (i >= 24) CHECK(e.find("checksum mismatch") != std::string::npos);
    }
  }
  SUBCASE("wrong magic, a cache entry, garbage, empty") {
    std::string bad = good;
    bad.replace(0, 8, "TRITONBB");
    CHECK(read_error(bad).find("not a tilejit bundle (wrong magic: the file starts with \"TRITONBB\"") != std::string::npos);
    bad.replace(0, 8, "TILEJITK");
    CHECK(read_error(bad).find("compile-cache entry") != std::string::npos);
    CHECK(read_error(std::string(1000, '\x01')).find("wrong magic: the file starts with \"\\x01") != std::string::npos);
    CHECK(read_error("").find("truncated: 0 bytes") != std::string::npos);
  }
  SUBCASE("wrong format version and header size (checksum intact)") {
    std::string bad = good;
    bad[8] = 3;
    CHECK(read_error(reseal(bad)).find("format version 3 (this tilejit reads version 2, so a newer tilejit wrote it)") !=
          std::string::npos);
    bad = good;
    bad[12] = 4;
    CHECK(read_error(reseal(bad)).find("header size 4 out of range") != std::string::npos);
  }
  SUBCASE("trailing bytes") {
    std::string bad = good + "extra";
    CHECK(read_error(bad).find("5 unexpected bytes after the end of the bundle") != std::string::npos);
  }
  SUBCASE("inconsistent fields behind a valid checksum") {
    std::string bad = good;
    bad[24 + 7] = 0x7f;  // the top byte of the tilejit version's length
    CHECK(read_error(reseal(bad)).find("damaged: tilejit version: needs") != std::string::npos);
    Bundle dup = b;
    dup.entries[1].key = dup.entries[0].key;
    CHECK(read_error(runtime::encode_bundle(dup)).find("damaged: entry 1 repeats the key") != std::string::npos);
    Bundle badkey = b;
    badkey.entries[0].key = "../../etc";
    CHECK(read_error(runtime::encode_bundle(badkey)).find("is not a bundle key") != std::string::npos);
    Bundle mismatch = b;
    mismatch.entries[0].compiled.name = "gamma";
    CHECK(read_error(runtime::encode_bundle(mismatch)).find("holds a kernel 'gamma'") != std::string::npos);
  }
  SUBCASE("random flips in a real bundle") {
    const std::string real = runtime::encode_bundle(gemm_bundle());
    std::mt19937 rng(11);
    for (int n = 0; n < 64; ++n) {
      std::string bad = real;
      size_t i = std::uniform_int_distribution<size_t>(0, real.size() - 1)(rng);
      bad[i] = static_cast<char>(~bad[i]);
      CHECK(!read_error(bad, "real.tjb").empty());
    }
  }
}

TEST_CASE("files: missing, directories and damaged files name the file; a failed load registers nothing") {
  CleanRegistry clean;
  TempDir tmp;
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const BundleError& e) {
      return e.what();
    }
    return {};
  };
  const fs::path missing = tmp.path / "missing.tjb";
  CHECK(error_of([&] { runtime::read_bundle(missing); }) ==
        fmt::format("tilejit: bundle {}: cannot open: No such file or directory", missing.string()));
  CHECK(error_of([&] { runtime::read_bundle(tmp.path); }).find("not a regular file") != std::string::npos);

  const fs::path cut = tmp.path / "cut.tjb";
  const std::string good = runtime::encode_bundle(synthetic_bundle());
  write_bytes(cut, good.substr(0, good.size() / 2));
  std::string e = error_of([&] { runtime::load_bundle(cut); });
  CHECK(e.find(fmt::format("tilejit: bundle {}: truncated: {} of {} bytes", cut.string(), good.size() / 2, good.size())) ==
        0);
  CHECK(runtime::loaded_bundles().empty());
  CHECK(!runtime::bundles_loaded());

  // The failure is remembered: a later lookup's error says why the kernel is missing.
  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  const BundleEntrySpec spec = two_gemms()[0];
  try {
    runtime::compile_cached(spec.build(), spec.options, runtime::CompileCache(tmp.path / "c"));
    FAIL("expected a CompileError");
  } catch (const jit::CompileError& err) {
    CHECK(std::string(err.what()).find(fmt::format("failed to load: tilejit: bundle {}: truncated", cut.string())) !=
          std::string::npos);
  }
}

TEST_CASE("arch check: a bundle without this GPU's arch is refused (compile-only: any bundle loads)") {
  CleanRegistry clean;
  const std::string sm80 = runtime::encode_bundle(synthetic_bundle({"sm_80"}));
  runtime::Driver& d = runtime::Driver::get();
  if (!d.available()) {
    MESSAGE("compile-only mode (" << d.unavailable_reason() << "): the arch check has no GPU to compare with");
    runtime::load_bundle_bytes(reinterpret_cast<const uint8_t*>(sm80.data()), sm80.size(), "sm80.tjb");
    CHECK(runtime::loaded_bundles().size() == 1);
    return;
  }
  const std::string arch = d.props(0).arch();
  if (arch == "sm_80") return;
  const std::string expected =
      fmt::format("tilejit: bundle sm80.tjb holds sm_80 kernels; this GPU is {} ({})", arch, d.props(0).name);
  CHECK_THROWS_WITH_AS(
      runtime::load_bundle_bytes(reinterpret_cast<const uint8_t*>(sm80.data()), sm80.size(), "sm80.tjb"),
      doctest::Contains(expected.c_str()), BundleError);
  CHECK(runtime::loaded_bundles().empty());
}

TEST_CASE("concurrent loads and lookups") {
  CleanRegistry clean;
  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  const std::string bytes = runtime::encode_bundle(gemm_bundle());
  const BundleEntrySpec spec = two_gemms()[0];
  const ir::Function f = spec.build();
  std::atomic<int> found{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      runtime::load_bundle_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                 fmt::format("copy {}", t).c_str());
    });
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (auto k = runtime::find_bundled(spec.key())) {
          ++found;
          if (k->cubin != gemm_bundle().entries[0].compiled.cubin) ++wrong;
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(runtime::loaded_bundles().size() == 4);
  CHECK(runtime::compile_cached(f, spec.options).cubin == gemm_bundle().entries[0].compiled.cubin);
  MESSAGE(found.load() << " of 200 concurrent lookups ran after a load had finished");
}

TEST_CASE("--emit-cpp source: embeds the bytes and compiles") {
  TempDir tmp;
  Bundle b = synthetic_bundle();
  const std::string bytes = runtime::encode_bundle(b);
  const std::string name = "odd \"name\"\\ with\tescapes.tjb";
  const std::string src = runtime::bundle_cpp_source(bytes, name);
  CHECK(src.find(fmt::format("tilejit_bundle_data[{}]", bytes.size())) != std::string::npos);
  CHECK(src.find("load_bundle_bytes(tilejit_bundle_data") != std::string::npos);
  CHECK(src.find("0x54,0x49,0x4c,0x45,0x4a,0x49,0x54,0x42,") != std::string::npos);  // "TILEJITB"
  // The source embeds every byte in order: parse the array back.
  std::string parsed;
  for (size_t pos = src.find("= {\n") + 4; src.compare(pos, 2, "0x") == 0;) {
    parsed.push_back(static_cast<char>(std::stoi(src.substr(pos + 2, 2), nullptr, 16)));
    pos += 5;
    if (src[pos] == '\n') ++pos;
  }
  CHECK(parsed == bytes);

  const fs::path cpp = tmp.path / "embedded.cpp";
  write_bytes(cpp, src);
  const std::string cmd = fmt::format("{} -std=c++20 -fsyntax-only -Wall -Wextra -Werror '{}' 2>&1", TILEJIT_TEST_CXX,
                                      cpp.string());
  INFO(cmd);
  CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("a FIFO where a bundle is expected: an error at once naming it, never a hang") {
  CleanRegistry clean;
  TempDir tmp;
  const fs::path fifo = tmp.path / "app.tjb";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // In a child with a deadline: a blocking open() would hang the suite instead of failing it.
  tilejit::testing::ChildResult r = tilejit::testing::probe_in_child([&] {
    try {
      runtime::load_bundle(fifo);
    } catch (const BundleError& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  });
  INFO(r.output);
  REQUIRE(r.finished);
  CHECK(r.seconds < 1.0);
  CHECK(r.output == fmt::format("tilejit: bundle {}: not a regular file but a FIFO (named pipe)", fifo.string()));
}

TEST_CASE("a huge (sparse) bundle is refused at once, with its size and the limit, unread") {
  CleanRegistry clean;
  TempDir tmp;
  const fs::path huge = tmp.path / "huge.tjb";
  write_bytes(huge, runtime::encode_bundle(synthetic_bundle()));
  const uint64_t size = (uint64_t{4} << 30) + 1;
  fs::resize_file(huge, size);  // sparse: no disk space, but reading it would take 4 GiB of memory
  REQUIRE(fs::file_size(huge) == size);
  auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    runtime::load_bundle(huge);
  } catch (const BundleError& e) {
    error = e.what();
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
  CHECK(error == fmt::format("tilejit: bundle {}: 4294967297 bytes, more than the limit of 4294967296 bytes (larger "
                             "than any file tilejit writes; not read)",
                             huge.string()));
  CHECK(runtime::loaded_bundles().empty());
}

TEST_CASE("--emit-cpp: a bundle name with a newline, quotes, */ and a trigraph appears only escaped") {
  TempDir tmp;
  const std::string bytes = runtime::encode_bundle(synthetic_bundle());
  const std::string name = "evil\n#error injected */ \"quoted\" ?\?/\n\\ /* end";
  const std::string src = runtime::bundle_cpp_source(bytes, name);
  // No line of the source starts (after blanks) with the injected directive.
  size_t lines = 0, injected = 0;
  for (size_t pos = 0; pos < src.size();) {
    size_t eol = src.find('\n', pos);
    std::string line = src.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
    pos = eol == std::string::npos ? src.size() : eol + 1;
    ++lines;
    size_t first = line.find_first_not_of(" \t");
    CHECK_MESSAGE((first == std::string::npos || line.compare(first, 6, "#error") != 0), line);
    if (line.find("#error injected") != std::string::npos) {
      ++injected;
      CHECK(line.find("\\012#error injected") != std::string::npos);  // only after an escaped newline
    }
  }
  CHECK(lines > 10);
  CHECK(injected == 2);  // the leading comment and the registration's name, both escaped
  // The compiler agrees: the source compiles (no #error), with the name intact in the literal.
  const fs::path cpp = tmp.path / "evil.cpp";
  write_bytes(cpp, src);
  const std::string cmd =
      fmt::format("{} -std=c++20 -fsyntax-only -Wall -Wextra -Werror -Wtrigraphs '{}' 2>&1", TILEJIT_TEST_CXX, cpp.string());
  INFO(cmd);
  CHECK(std::system(cmd.c_str()) == 0);
  CHECK(src.find(R"x("evil\012#error injected */ \"quoted\" \?\?/\012\\ /* end (embedded)")x") != std::string::npos);
}

#else  // TILEJIT_TEST_EMBEDDED_BUNDLE: linked with the source `tilejit bundle --emit-cpp` wrote

TEST_CASE("a linked --emit-cpp source registers its bundle before main(); its kernels need no compiler") {
  const std::vector<runtime::LoadedBundle> loaded = runtime::loaded_bundles();
  REQUIRE(loaded.size() == 1);
  CHECK(loaded[0].name == "embedded.tjb (embedded)");
  CHECK(loaded[0].entries == 1);
  ScopedEnv off("TILEJIT_DISABLE_COMPILERS", "1");
  const BundleEntrySpec spec = library::bundle_spec("gemm", {{"BLOCK_N", 128}});
  runtime::reset_memory_cache();
  jit::CompiledKernel k = runtime::compile_cached(spec.build(), spec.options);
  CHECK(!k.cubin.empty());
  CHECK(k.name == "gemm");
  CHECK(runtime::compile_cache_stats().compiles == 0);
  CHECK(runtime::compile_cache_stats().bundle_hits == 1);
}

#endif
