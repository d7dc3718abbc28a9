// The compile cache without a GPU: entries round-trip every field, keys move with every component,
// damaged or foreign entries are refused and removed, concurrent writers leave one good entry.
#include <doctest/doctest.h>

#include "child_process.hpp"
#include "compiled_kernel_checks.hpp"
#include "temp_dir.hpp"
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <random>
#include <thread>

#include "dsl/ir/sha256.hpp"
#include "kernels/gemm.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/entry_file.hpp"
#include "test_kernels.hpp"

using namespace tilejit;
using runtime::CompileCache;
using tilejit::testing::check_same;
using tilejit::testing::ChildResult;
using tilejit::testing::run_child;
using tilejit::testing::run_program;

namespace fs = std::filesystem;

namespace {

struct TempDir : tilejit::testing::TempDir {
  TempDir() : tilejit::testing::TempDir("tilejit-cache-test") {}
};

using tilejit::testing::ScopedEnv;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, std::string_view data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// Replace the trailing SHA-256 so that only the deliberate damage is wrong.
std::string reseal(std::string data) {
  data.resize(data.size() - 32);
  auto sum = ir::sha256(data);
  data.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  return data;
}

std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string key_of(std::string_view seed) { return ir::sha256_hex(seed); }

// The pid of a process that has exited and been reaped: nothing runs under it (until reused).
pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// Small, with every field set to something other than its default (tensor maps, every dtype
// position, 64-bit values, NUL bytes in the cubin): cheap enough to damage at every byte.
jit::CompiledKernel synthetic() {
  using namespace jit::pir;
  jit::CompiledKernel k;
  k.name = "synthetic";
  k.arch = "sm_90a";
  k.backend = jit::Backend::Nvrtc;
  k.num_threads = 384;
  k.smem_bytes = (int64_t{1} << 33) + 5;
  k.abi = {{"A", pointer(ir::DType::bf16)}, {"A_size0", scalar(ir::DType::i32)}, {"A_stride0", scalar(ir::DType::i64)},
           {"x", scalar(ir::DType::f8e5m2)}, {"", scalar(ir::DType::i1)}};
  k.tensor_maps = {{5, 0, {64, 128}, 128}, {6, 2, {64, 256, 1}, 64}};
  k.tile_ir = "kernel @synthetic() {}\n";
  k.ptx = ".version 8.5\n.target sm_90a\n";
  for (int i = 0; i < 256; ++i) k.cubin.push_back(static_cast<uint8_t>(i));
  k.info = {"synthetic", "sm_90a", 168, 1024, -1, 8, 16, 400};
  k.ptx_tool = "nvJitLink 13.0";
  k.backend_source = "not kept";
  k.dump = "not kept";
  k.timings.passes_ms = 1;
  return k;
}

jit::CompileOptions cubin_options() {
  jit::CompileOptions o;
  o.make_cubin = true;  // ptxas / nvJitLink are part of CI here
  return o;
}

// The real thing, compiled once for the whole suite.
const jit::CompiledKernel& vector_add_compiled() {
  static const jit::CompiledKernel k = jit::compile(test_kernels::vector_add.build(), cubin_options());
  return k;
}

}  // namespace

TEST_CASE("round trip: a compiled vector add, every field equal") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  const jit::CompiledKernel& k = vector_add_compiled();
  REQUIRE(!k.cubin.empty());
  REQUIRE(!k.ptx.empty());
  const std::string key = runtime::cache_key(test_kernels::vector_add.build(), cubin_options());
  CHECK(key.size() == 64);
  CHECK(!cache.load(key));  // a miss before the store
  REQUIRE(cache.store(key, k));
  CHECK(file_names(tmp.path) == std::vector<std::string>{key + ".tjk"});
  std::string problem = "stale";
  auto loaded = cache.load(key, &problem);
  REQUIRE(loaded);
  CHECK(problem.empty());
  check_same(k, *loaded);
  // Loading does not consume the entry.
  CHECK(cache.load(key));
}

TEST_CASE("round trip: synthetic kernel with tensor maps and unusual values") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  auto k = synthetic();
  const std::string key = key_of("synthetic");
  REQUIRE(cache.store(key, k));
  auto loaded = cache.load(key);
  REQUIRE(loaded);
  check_same(k, *loaded);
  CHECK(loaded->backend_source.empty());
  CHECK(loaded->dump.empty());
  CHECK(loaded->timings.passes_ms == 0);
  // An empty kernel (no cubin, no tile IR) round-trips too.
  jit::CompiledKernel empty;
  REQUIRE(cache.store(key_of("empty"), empty));
  auto e = cache.load(key_of("empty"));
  REQUIRE(e);
  check_same(empty, *e);
}

TEST_CASE("round trip: TMA GEMM (tensor maps from the real pipeline)") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  jit::CompileOptions o = cubin_options();
  o.num_warps = 8;
  ir::Function f = kernels::gemm().build({{"BLOCK_N", 256}, {"B_KMAJOR", true}, {"GROUP_M", 8}});
  jit::CompiledKernel k = jit::compile(f, o);
  CHECK(!k.tensor_maps.empty());
  const std::string key = runtime::cache_key(f, o);
  REQUIRE(cache.store(key, k));
  auto loaded = cache.load(key);
  REQUIRE(loaded);
  check_same(k, *loaded);
}

TEST_CASE("the key moves with every component and only with them") {
  const ir::Function f = test_kernels::vector_add.build();
  const jit::CompileOptions base;
  const std::string k0 = runtime::cache_key(f, base);
  CHECK(k0.size() == 64);
  CHECK(k0.find_first_not_of("0123456789abcdef") == std::string::npos);
  // A rebuild of the same kernel (a new ir::Function, new value ids and all) gives the same key.
  CHECK(runtime::cache_key(test_kernels::vector_add.build(), base) == k0);
  CHECK(runtime::cache_key(test_kernels::vector_add.build({{"BLOCK", 256}}), base) == k0);  // 256 is the default

  auto with = [&](auto change) {
    jit::CompileOptions o = base;
    change(o);
    return runtime::cache_key(f, o);
  };
  std::vector<std::pair<std::string, std::string>> variants = {
      {"meta BLOCK=128", runtime::cache_key(test_kernels::vector_add.build({{"BLOCK", 128}}), base)},
      {"other kernel", runtime::cache_key(test_kernels::atomics.build(), base)},
      {"num_warps", with([](auto& o) { o.num_warps = 8; })},
      {"backend", with([](auto& o) { o.backend = jit::Backend::Nvrtc; })},
      {"arch", with([](auto& o) { o.arch = "sm_80"; })},
      {"pipeline stages", with([](auto& o) { o.pipeline.stages = 2; })},
      {"pipeline off", with([](auto& o) { o.pipeline.enabled = false; })},
      {"ptx tool", with([](auto& o) { o.ptx_tool = jit::PtxTool::Ptxas; })},
      {"no cubin", with([](auto& o) { o.make_cubin = false; })},
      {"min_programs_per_sm", with([](auto& o) { o.min_programs_per_sm = 3; })},
      {"once-loaded windows through registers", with([](auto& o) { o.pipeline.once_by_tma = false; })},
  };
  std::set<std::string> seen{k0};
  for (const auto& [what, key] : variants) {
    INFO(what);
    CHECK(key != k0);
    CHECK(seen.insert(key).second);  // also distinct from each other
  }
  // TILEJIT_PTX_TOOL changes what Auto assembles with, so it moves Auto's key (to the explicit
  // tool's); unset, the key says "auto" as before.
  {
    ::setenv("TILEJIT_PTX_TOOL", "ptxas", 1);
    const std::string via_env = runtime::cache_key(f, base);
    ::unsetenv("TILEJIT_PTX_TOOL");
    CHECK(via_env != k0);
    CHECK(via_env == with([](auto& o) { o.ptx_tool = jit::PtxTool::Ptxas; }));
    CHECK(runtime::cache_key(f, base) == k0);
  }
  {  // the LLVM backend's instrumented waits (TILEJIT_DEBUG_WAITS) get keys of their own
    ::setenv("TILEJIT_DEBUG_WAITS", "1000", 1);
    const std::string debug = runtime::cache_key(f, base);
    const std::string debug_text = runtime::cache_key_text(f, base);
    ::unsetenv("TILEJIT_DEBUG_WAITS");
    CHECK(debug != k0);
    CHECK(debug_text.find("debug_waits=1000") != std::string::npos);
    CHECK(runtime::cache_key(f, base) == k0);
  }
  // Asking for a pass dump changes what is reported, not the code.
  CHECK(with([](auto& o) { o.dump_after = "lower"; }) == k0);

  // The text names every component; nvrtc's version only for its backend.
  std::string text = runtime::cache_key_text(f, base);
  for (const char* part : {"entry-format=", "tilejit=0.1.16", "ir=", "arch=sm_90a", "backend=llvm", "num_warps=4",
                           "pipeline=", "ptx_tool=", "make_cubin=", "llvm=", "ptx_tools="})
    CHECK_MESSAGE(text.find(part) != std::string::npos, part);
  CHECK(text.find("nvrtc=") == std::string::npos);
  jit::CompileOptions nv;
  nv.backend = jit::Backend::Nvrtc;
  CHECK(runtime::cache_key_text(f, nv).find("nvrtc=nvrtc ") != std::string::npos);
}

TEST_CASE("truncated entries are refused and removed") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  auto check_all_lengths = [&](const std::string& key, const jit::CompiledKernel& k, const std::vector<size_t>& lengths) {
    REQUIRE(cache.store(key, k));
    const fs::path path = cache.entry_path(key);
    const std::string good = read_bytes(path);
    for (size_t n : lengths) {
      INFO("length " << n << " of " << good.size());
      write_bytes(path, std::string_view(good).substr(0, n));
      std::string problem;
      CHECK(!cache.load(key, &problem));
      CHECK(!problem.empty());
      CHECK(!fs::exists(path));
    }
    // Rebuilt: a new store is loaded again.
    REQUIRE(cache.store(key, k));
    CHECK(cache.load(key));
    return good.size();
  };
  // Every length of a small entry.
  const std::string small = key_of("small");
  std::string good = [&] {
    CompileCache c(tmp.path);
    c.store(small, synthetic());
    return read_bytes(c.entry_path(small));
  }();
  std::vector<size_t> every(good.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = i;
  check_all_lengths(small, synthetic(), every);
  // 50 lengths of a real entry, the interesting edges included.
  const std::string real = key_of("real");
  std::vector<size_t> sample{0, 1, 7, 8, 15, 16, 47, 48};
  std::mt19937 rng(12345);
  CompileCache probe(tmp.path);
  probe.store(real, vector_add_compiled());
  const size_t real_size = fs::file_size(probe.entry_path(real));
  sample.push_back(real_size - 1);
  sample.push_back(real_size - 32);
  while (sample.size() < 50) sample.push_back(std::uniform_int_distribution<size_t>(0, real_size - 1)(rng));
  check_all_lengths(real, vector_add_compiled(), sample);
}

TEST_CASE("flipped bytes, wrong magic, wrong version, foreign entries are refused and removed") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  const std::string key = key_of("victim");
  REQUIRE(cache.store(key, synthetic()));
  const fs::path path = cache.entry_path(key);
  const std::string good = read_bytes(path);

  auto expect_refused = [&](const std::string& bytes, std::string_view why) {
    write_bytes(path, bytes);
    std::string problem;
    CHECK(!cache.load(key, &problem));
    CHECK_MESSAGE(problem.find(why) != std::string::npos, problem);
    CHECK(!fs::exists(path));
  };

  SUBCASE("one flipped bit at every position") {
    for (size_t i = 0; i < good.size(); ++i) {
      INFO("byte " << i);
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
      write_bytes(path, bad);
      std::string problem;
      CHECK(!cache.load(key, &problem));
      CHECK(!problem.empty());
      CHECK(!fs::exists(path));
    }
  }
  SUBCASE("flipped bytes in a real entry") {
    const std::string real_key = key_of("real victim");
    REQUIRE(cache.store(real_key, vector_add_compiled()));
    const fs::path real_path = cache.entry_path(real_key);
    const std::string real_good = read_bytes(real_path);
    std::mt19937 rng(7);
    for (int n = 0; n < 64; ++n) {
      size_t i = n == 0 ? real_good.size() - 1 : std::uniform_int_distribution<size_t>(0, real_good.size() - 1)(rng);
      std::string bad = real_good;
      bad[i] = static_cast<char>(~bad[i]);
      write_bytes(real_path, bad);
      CHECK(!cache.load(real_key));
      CHECK(!fs::exists(real_path));
    }
  }
  SUBCASE("wrong magic") {
    std::string bad = good;
    bad.replace(0, 8, "TRITONKK");
    expect_refused(bad, "wrong magic");
  }
  SUBCASE("wrong format version (checksum intact)") {
    std::string bad = good;
    bad[8] = 3;  // (a newer format than this build's 2)
    expect_refused(reseal(bad), "format version 3");
  }
  SUBCASE("header size out of range (checksum intact)") {
    std::string bad = good;
    bad[12] = 4;
    expect_refused(reseal(bad), "header size");
  }
  SUBCASE("a length that overruns the file (checksum intact)") {
    std::string bad = good;
    bad[16 + 7] = 0x7f;  // the top byte of the key's length
    expect_refused(reseal(bad), "key: needs");
  }
  SUBCASE("trailing bytes (checksum intact)") {
    std::string bad = good;
    bad.insert(bad.size() - 32, "extra");
    expect_refused(reseal(bad), "unexpected bytes");
  }
  SUBCASE("another key's entry renamed to this key") {
    const std::string other = key_of("other");
    REQUIRE(cache.store(other, synthetic()));
    fs::rename(cache.entry_path(other), path);
    expect_refused(read_bytes(path), "foreign");
  }
  SUBCASE("garbage and an empty file") {
    expect_refused(std::string(1000, 'x'), "wrong magic");
    expect_refused("", "truncated");
  }
  // After all of that the entry is rebuilt normally.
  REQUIRE(cache.store(key, synthetic()));
  CHECK(cache.load(key));
}

TEST_CASE("concurrent writers and readers of one key") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  const std::string key = key_of("contended");
  const jit::CompiledKernel& k = vector_add_compiled();
  std::atomic<int> loads{0}, bad{0}, failed_stores{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < 8; ++w)
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i)
        if (!cache.store(key, k)) ++failed_stores;
    });
  for (int r = 0; r < 8; ++r)
    threads.emplace_back([&] {
      while (!stop) {
        std::string problem;
        if (auto got = cache.load(key, &problem)) {
          ++loads;
          if (got->cubin != k.cubin || got->ptx != k.ptx || got->name != k.name) ++bad;
        } else if (!problem.empty()) {
          ++bad;  // a reader must never see a partial entry
        }
      }
    });
  for (int w = 0; w < 8; ++w) threads[w].join();
  stop = true;
  for (size_t r = 8; r < threads.size(); ++r) threads[r].join();
  CHECK(failed_stores == 0);
  CHECK(bad == 0);
  CHECK(loads > 0);
  MESSAGE(loads.load() << " complete loads during 200 concurrent stores");
  CHECK(file_names(tmp.path) == std::vector<std::string>{key + ".tjk"});  // no temp files left
  auto final = cache.load(key);
  REQUIRE(final);
  check_same(k, *final);
}

TEST_CASE("concurrent writer processes of one key") {
  TempDir tmp;
  const std::string key = key_of("processes");
  const jit::CompiledKernel k = synthetic();
  std::vector<pid_t> children;
  for (int p = 0; p < 6; ++p) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      CompileCache cache(tmp.path);
      int status = 0;
      for (int i = 0; i < 40; ++i) {
        if (!cache.store(key, k)) status = 1;
        std::string problem;
        auto got = cache.load(key, &problem);
        if (!problem.empty() || (got && got->cubin != k.cubin)) status = 2;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(file_names(tmp.path) == std::vector<std::string>{key + ".tjk"});
  CompileCache cache(tmp.path);
  CHECK(cache.load(key));
}

TEST_CASE("a disabled cache reads and writes nothing") {
  TempDir tmp;
  const std::string key = key_of("disabled");
  CompileCache on(tmp.path);
  REQUIRE(on.store(key, synthetic()));
  CompileCache off(tmp.path, false);
  CHECK(!off.enabled());
  CHECK(!off.load(key));
  CHECK(fs::exists(on.entry_path(key)));  // a disabled cache does not remove anything either
  CompileCache off_new(tmp.path / "never", false);
  CHECK(!off_new.store(key, synthetic()));
  CHECK(!fs::exists(tmp.path / "never"));
  CHECK(!CompileCache(fs::path(), true).enabled());  // no directory, no cache
}

TEST_CASE("the directory and the switch come from the environment") {
  ScopedEnv dir("TILEJIT_CACHE_DIR", nullptr), xdg("XDG_CACHE_HOME", nullptr), home("HOME", nullptr),
      sw("TILEJIT_CACHE", nullptr);
  CHECK(CompileCache::default_dir().empty());
  CHECK(!CompileCache::from_environment().enabled());
  {
    ScopedEnv h("HOME", "/home/someone");
    CHECK(CompileCache::default_dir() == fs::path("/home/someone/.cache/tilejit"));
    ScopedEnv relative("XDG_CACHE_HOME", "relative/cache");  // invalid per the XDG spec: ignored
    CHECK(CompileCache::default_dir() == fs::path("/home/someone/.cache/tilejit"));
    ScopedEnv x("XDG_CACHE_HOME", "/xdg");
    CHECK(CompileCache::default_dir() == fs::path("/xdg/tilejit"));
    ScopedEnv d("TILEJIT_CACHE_DIR", "/custom/dir");
    CHECK(CompileCache::default_dir() == fs::path("/custom/dir"));
  }
  TempDir tmp;
  ScopedEnv d("TILEJIT_CACHE_DIR", tmp.path.c_str());
  {
    CompileCache c = CompileCache::from_environment();
    CHECK(c.enabled());
    CHECK(c.dir() == tmp.path);
    REQUIRE(c.store(key_of("env"), synthetic()));
    CHECK(fs::exists(tmp.path / (key_of("env") + ".tjk")));
  }
  for (const char* off : {"0", "false", "OFF", "no"}) {
    ScopedEnv s("TILEJIT_CACHE", off);
    CHECK_MESSAGE(!CompileCache::default_enabled(), off);
    CompileCache c = CompileCache::from_environment();
    CHECK(!c.enabled());
    CHECK(!c.load(key_of("env")));
    CHECK(!c.store(key_of("env2"), synthetic()));
  }
  for (const char* on : {"1", "yes", ""}) {
    ScopedEnv s("TILEJIT_CACHE", on);
    CHECK(CompileCache::default_enabled());
  }
  CHECK(!fs::exists(tmp.path / (key_of("env2") + ".tjk")));
}

TEST_CASE("write failures are warnings, reported once, never fatal") {
  TempDir tmp;
  write_bytes(tmp.path / "a-file", "x");
  CompileCache cache(tmp.path / "a-file" / "cache");  // a directory that cannot be created
  // Capture stderr to count the warnings.
  const fs::path log = tmp.path / "stderr.txt";
  std::fflush(stderr);
  int saved = ::dup(2);
  FILE* f = std::fopen(log.c_str(), "w");
  REQUIRE(f);
  ::dup2(::fileno(f), 2);
  bool first = cache.store(key_of("a"), synthetic());
  bool second = cache.store(key_of("b"), synthetic());
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(f);
  CHECK(!first);
  CHECK(!second);
  CHECK(!cache.load(key_of("a")));
  std::string text = read_bytes(log);
  INFO(text);
  size_t count = 0;
  for (size_t p = text.find("tilejit: warning:"); p != std::string::npos; p = text.find("tilejit: warning:", p + 1))
    ++count;
  CHECK(count == 1);
  CHECK(text.find((tmp.path / "a-file" / "cache").string()) != std::string::npos);  // names the directory
}

TEST_CASE("keys that are not plain tokens are refused before touching the file system") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  for (const char* bad : {"", "../escape", "a/b", "with space", "dot.dot"}) {
    INFO(bad);
    CHECK_THROWS_AS(cache.load(bad), std::invalid_argument);
    CHECK_THROWS_AS(cache.store(bad, synthetic()), std::invalid_argument);
  }
}

TEST_CASE("list and clear") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  CHECK(cache.list().empty());
  const std::string a = key_of("a"), b = key_of("b"), c = key_of("c"), d = key_of("d");
  REQUIRE(cache.store(a, vector_add_compiled()));
  REQUIRE(cache.store(b, synthetic()));
  write_bytes(cache.entry_path(c), "garbage that is not an entry at all");
  std::string truncated = read_bytes(cache.entry_path(b));
  write_bytes(cache.entry_path(d), truncated.substr(0, truncated.size() / 2));
  write_bytes(tmp.path / "notes.txt", "not ours");
  // Temporaries: of a dead writer (its pid is gone), of a live one (this process), and one without
  // a pid (an older tilejit) that is two hours old.
  const std::string orphan = fmt::format("{}.tjk.tmp-{}-Ab12Cd", a, dead_pid());
  const std::string live = fmt::format("{}.tjk.tmp-{}-Xy34Zw", b, ::getpid());
  write_bytes(tmp.path / orphan, "an interrupted write");
  write_bytes(tmp.path / live, "a write in progress");
  write_bytes(tmp.path / (c + ".tjk.tmp-Ab12Cd"), "an old interrupted write");
  fs::last_write_time(tmp.path / (c + ".tjk.tmp-Ab12Cd"), fs::file_time_type::clock::now() - std::chrono::hours(2));

  auto entries = cache.list();
  REQUIRE(entries.size() == 4);
  std::map<std::string, CompileCache::Entry> by_key;
  for (const auto& e : entries) by_key[e.key] = e;
  REQUIRE(by_key.size() == 4);
  CHECK(std::is_sorted(entries.begin(), entries.end(), [](auto& x, auto& y) { return x.key < y.key; }));
  CHECK(by_key[a].valid);
  CHECK(by_key[a].kernel == "vector_add");
  CHECK(by_key[a].arch == "sm_90a");
  CHECK(by_key[a].bytes == fs::file_size(cache.entry_path(a)));
  CHECK(by_key[a].problem.empty());
  CHECK(fs::file_time_type::clock::now() - by_key[a].written < std::chrono::minutes(10));
  CHECK(by_key[b].valid);
  CHECK(by_key[b].kernel == "synthetic");
  CHECK(!by_key[c].valid);
  CHECK(by_key[c].problem.find("wrong magic") != std::string::npos);
  CHECK(!by_key[d].valid);
  CHECK(by_key[d].problem.find("checksum") != std::string::npos);
  CHECK(by_key[d].kernel.empty());
  // list() changes nothing: the bad entries are still there.
  CHECK(fs::exists(cache.entry_path(c)));
  CHECK(fs::exists(cache.entry_path(d)));

  auto temps = cache.temporaries();
  REQUIRE(temps.size() == 3);
  std::map<std::string, bool> orphaned;
  for (const auto& t : temps) orphaned[t.path.filename().string()] = t.orphaned;
  CHECK(orphaned.at(orphan));
  CHECK(!orphaned.at(live));
  CHECK(orphaned.at(c + ".tjk.tmp-Ab12Cd"));

  CompileCache::Cleared cleared = cache.clear();
  CHECK(cleared.entries == 4);
  CHECK(cleared.temporaries == 2);
  CHECK(cleared.live_temporaries == 1);
  CHECK(cleared.failures.empty());
  // other files, and the live writer's temporary, are left alone
  CHECK(file_names(tmp.path) == std::vector<std::string>{live, "notes.txt"});
  CHECK(cache.list().empty());
  CHECK(cache.clear().entries == 0);
  CHECK(CompileCache(tmp.path / "missing").clear().entries == 0);
  CHECK(CompileCache(tmp.path / "missing").clear().failures.empty());
  CHECK(CompileCache(tmp.path / "missing").list().empty());
  // a file where the directory should be cannot be listed: an error naming it, not "no entries"
  CHECK_THROWS_WITH_AS(CompileCache(tmp.path / "notes.txt").list(), doctest::Contains("notes.txt"), std::runtime_error);
}

static std::optional<pid_t> entry_file_writer(const fs::path& p) {
  return runtime::entry_file::temporary_writer(p.filename().string(), ".tjk.tmp-");
}

TEST_CASE("compile_cached: memory, then disk, then compile") {
  TempDir tmp;
  runtime::reset_memory_cache();
  const ir::Function f = test_kernels::vector_add.build({{"BLOCK", 512}});
  const jit::CompileOptions o = cubin_options();
  CompileCache cache(tmp.path);

  auto t0 = std::chrono::steady_clock::now();
  jit::CompiledKernel first = runtime::compile_cached(f, o, cache);
  double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto s = runtime::compile_cache_stats();
  CHECK(s.compiles == 1);
  CHECK(s.disk_hits == 0);
  CHECK(s.memory_hits == 0);
  CHECK(fs::exists(cache.entry_path(runtime::cache_key(f, o))));

  // Same process: from memory. The best of a few calls, so a busy CI machine does not decide it.
  const ir::Function rebuilt = test_kernels::vector_add.build({{"BLOCK", 512}});
  double best_ms = 1e9;
  for (int i = 0; i < 20; ++i) {
    auto t = std::chrono::steady_clock::now();
    jit::CompiledKernel again = runtime::compile_cached(rebuilt, o, cache);
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    if (i == 0) check_same(first, again);
  }
  s = runtime::compile_cache_stats();
  CHECK(s.compiles == 1);
  CHECK(s.memory_hits == 20);
  CHECK(best_ms < 1.0);

  // A new process, simulated: empty memory cache, a new CompileCache on the same directory.
  runtime::reset_memory_cache();
  CompileCache next_process(tmp.path);
  auto t1 = std::chrono::steady_clock::now();
  jit::CompiledKernel from_disk = runtime::compile_cached(f, o, next_process);
  double disk_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  s = runtime::compile_cache_stats();
  CHECK(s.compiles == 0);
  CHECK(s.disk_hits == 1);
  check_same(first, from_disk);
  auto t2 = std::chrono::steady_clock::now();
  const std::string key = runtime::cache_key(f, o);
  double key_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t2).count();
  MESSAGE(fmt::format("vector_add: compile {:.1f} ms, disk hit {:.3f} ms, memory hit {:.4f} ms (of which the key {:.4f} ms)",
                      compile_ms, disk_ms, best_ms, key_ms));

  // Another option is another kernel; a dump request always compiles and caches nothing new.
  jit::CompileOptions w8 = o;
  w8.num_warps = 8;
  runtime::compile_cached(f, w8, next_process);
  CHECK(runtime::compile_cache_stats().compiles == 1);
  jit::CompileOptions dump = o;
  dump.dump_after = "lower";
  CHECK(!runtime::compile_cached(f, dump, next_process).dump.empty());
  CHECK(runtime::compile_cache_stats().compiles == 2);

  // A damaged entry is rebuilt.
  runtime::reset_memory_cache();
  write_bytes(next_process.entry_path(runtime::cache_key(f, o)), "damaged");
  check_same(first, runtime::compile_cached(f, o, next_process));
  CHECK(runtime::compile_cache_stats().compiles == 1);
  CHECK(next_process.load(runtime::cache_key(f, o)));
}

TEST_CASE("compile_cached: concurrent callers of one key compile once; failures are not cached") {
  TempDir tmp;
  runtime::reset_memory_cache();
  CompileCache cache(tmp.path);
  const ir::Function f = test_kernels::vector_add.build({{"BLOCK", 1024}});
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      if (runtime::compile_cached(f, cubin_options(), cache).cubin.empty()) ++wrong;
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  auto s = runtime::compile_cache_stats();
  CHECK(s.compiles == 1);
  CHECK(s.memory_hits == 7);

  jit::CompileOptions bad = cubin_options();
  bad.num_warps = 3;
  CHECK_THROWS_AS(runtime::compile_cached(f, bad, cache), jit::CompileError);
  CHECK_THROWS_AS(runtime::compile_cached(f, bad, cache), jit::CompileError);  // tried again, not a cached failure
  CHECK(runtime::compile_cache_stats().compiles == 3);
  runtime::reset_memory_cache();
}

TEST_CASE("the global cache is built from the environment") {
  // global() reads the environment once; whatever it chose, it must be usable and consistent.
  CompileCache& g = CompileCache::global();
  CHECK(&g == &CompileCache::global());
  if (g.enabled()) CHECK(!g.dir().empty());
}

// ---- issue 27: no hang, no silent wrong answer, no lost file ----------------------------------

TEST_CASE("a FIFO where an entry is expected: an error at once, never a hang; the kernel is rebuilt") {
  TempDir tmp;
  runtime::reset_memory_cache();
  CompileCache cache(tmp.path);
  const ir::Function f = test_kernels::vector_add.build({{"BLOCK", 256}});
  const jit::CompileOptions o;  // no cubin: cheap
  const std::string key = runtime::cache_key(f, o);
  REQUIRE(::mkfifo(cache.entry_path(key).c_str(), 0600) == 0);

  // In a child first, with a deadline: a blocking open() would hang the suite, not fail it.
  ChildResult r = tilejit::testing::probe_in_child([&] {
    std::string problem;
    if (cache.load(key, &problem)) return std::string("loaded");
    auto entries = cache.list();
    return problem + "\n" + (entries.size() == 1 ? entries[0].problem : "no entry listed");
  });
  INFO(r.output);
  REQUIRE(r.finished);
  CHECK(r.seconds < 1.0);
  CHECK(r.output.find("not a regular file but a FIFO") != std::string::npos);
  CHECK(r.output.find("\nnot a regular file but a FIFO") != std::string::npos);  // list() too

  // The miss is rebuilt and the entry replaces the FIFO (rename over it).
  jit::CompiledKernel k = runtime::compile_cached(f, o, cache);
  CHECK(k.name == "vector_add");
  CHECK(runtime::compile_cache_stats().compiles == 1);
  CHECK(fs::is_regular_file(cache.entry_path(key)));
  CHECK(cache.load(key));
  runtime::reset_memory_cache();
}

TEST_CASE("an entry bigger than any entry is refused without being read") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  const std::string key = key_of("huge");
  {
    std::ofstream touch(cache.entry_path(key));
  }
  fs::resize_file(cache.entry_path(key), (uint64_t{1} << 30) + 1);  // sparse: no disk space used
  auto t0 = std::chrono::steady_clock::now();
  std::string problem;
  CHECK(!cache.load(key, &problem));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
  CHECK_MESSAGE(problem.find("1073741825 bytes, more than the limit of 1073741824 bytes") != std::string::npos, problem);
}

TEST_CASE("a writer killed mid-write leaves the old entry intact and an orphan that clear removes") {
  TempDir tmp;
  CompileCache cache(tmp.path);
  const std::string key = key_of("killed");
  REQUIRE(cache.store(key, synthetic()));
  const std::string old_bytes = read_bytes(cache.entry_path(key));
  jit::CompiledKernel big = synthetic();
  big.cubin.assign(size_t{8} << 20, 0x5a);

  SUBCASE("killed at a known point: the file size limit (SIGXFSZ) stops it after 1 MiB") {
    ChildResult r = run_child(
        [&](int) {
          struct rlimit lim {1 << 20, 1 << 20};
          ::setrlimit(RLIMIT_FSIZE, &lim);
          ::signal(SIGXFSZ, SIG_DFL);
          cache.store(key, big);
          return 0;  // not reached
        },
        30);
    REQUIRE(r.finished);
    CHECK(r.signal == SIGXFSZ);
    CHECK(read_bytes(cache.entry_path(key)) == old_bytes);  // the old entry, byte for byte
    auto temps = cache.temporaries();
    REQUIRE(temps.size() == 1);
    CHECK(temps[0].bytes == (size_t{1} << 20));  // it really died mid-write
    CHECK(temps[0].orphaned);
    CHECK(entry_file_writer(temps[0].path) == r.pid);
  }
  SUBCASE("killed at a random point (SIGKILL while the temporary grows)") {
    ChildResult r = run_child(
        [&](int) {
          for (;;) cache.store(key, big);
          return 0;
        },
        30, false, [&] {
          // the kill comes as soon as a temporary has data in it
          for (const auto& e : fs::directory_iterator(tmp.path))
            if (e.path().filename().string().find(".tmp-") != std::string::npos && fs::file_size(e.path()) > 0) return true;
          return false;
        });
    CHECK(r.signal == SIGKILL);
    std::string problem;
    std::optional<jit::CompiledKernel> k = cache.load(key, &problem);
    REQUIRE_MESSAGE(k, problem);  // never a truncated entry: the old one or the new one, complete
    CHECK((k->cubin.size() == 256 || k->cubin == big.cubin));
  }
  // The dead writer's temporary is an orphan: listed, and removed by clear.
  auto temps = cache.temporaries();
  for (const auto& t : temps) CHECK(t.orphaned);
  CompileCache::Cleared c = cache.clear();
  CHECK(c.temporaries == temps.size());
  CHECK(c.failures.empty());
  CHECK(file_names(tmp.path).empty());
}

TEST_CASE("write_atomically into a read-only directory: the reason, and the old file intact") {
  TempDir tmp;
  const fs::path dir = tmp.path / "ro";
  fs::create_directories(dir);
  write_bytes(dir / "out.bin", "old content");
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  // As nobody when the tests run as root: root ignores directory permissions.
  ChildResult r = run_child(
      [&](int fd) {
        tilejit::testing::report(fd, runtime::entry_file::write_atomically(dir / "out.bin", ".bin.tmp-", "new content"));
        return 0;
      },
      10, true);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output == fmt::format("cannot create a temporary file in {}: Permission denied", dir.string()));
  CHECK(read_bytes(dir / "out.bin") == "old content");
  CHECK(file_names(dir) == std::vector<std::string>{"out.bin"});
}

TEST_CASE("compile_cached serves an intact entry only if it holds the kernel asked for") {
  TempDir tmp;
  runtime::reset_memory_cache();
  CompileCache cache(tmp.path);
  const ir::Function f = test_kernels::vector_add.build({{"BLOCK", 128}});
  const jit::CompileOptions o;
  const std::string key = runtime::cache_key(f, o);
  const jit::CompiledKernel good = jit::compile(f, o);

  auto rebuilt = [&](std::string_view why) {
    runtime::reset_memory_cache();
    jit::CompiledKernel k = runtime::compile_cached(f, o, cache);
    CHECK(runtime::compile_cache_stats().compiles == 1);  // refused and rebuilt, not served
    CHECK(runtime::compile_cache_stats().disk_hits == 0);
    CHECK(k.name == "vector_add");
    CHECK(k.arch == o.arch);
    CHECK(k.ptx == good.ptx);
    std::optional<jit::CompiledKernel> now = cache.load(key);  // the rebuilt entry replaced it
    REQUIRE(now);
    CHECK(now->ptx == good.ptx);
    std::string problem;
    jit::CompiledKernel other = good;
    other.name = "other";
    cache.store(key, other);
    CHECK(!cache.load_expected(key, f, o.arch, o.backend, &problem));
    CHECK_MESSAGE(problem.find(why) != std::string::npos, problem);
    CHECK(!fs::exists(cache.entry_path(key)));  // treated as damaged: removed
  };
  SUBCASE("another kernel sealed under this key (checksum and inner key valid)") {
    REQUIRE(cache.store(key, synthetic()));
    rebuilt("holds kernel 'other'");
  }
  SUBCASE("the same kernel for another arch") {
    jit::CompiledKernel k = good;
    k.arch = "sm_80";
    REQUIRE(cache.store(key, k));
    rebuilt("not the 'vector_add' for sm_90a");
  }
  SUBCASE("a kernel of the same name and arch compiled from another signature") {
    using namespace tilejit::lang;
    const Kernel other_signature = kernel("vector_add", [](Builder& k) {
      auto X = k.pointer("X", f32, {.align_bytes = 16});
      auto n = k.scalar<int64_t>("n");
      auto offs = arange(0, 128);
      store(X + offs, load(X + offs, offs < n) * 2.0f, offs < n);
    });
    REQUIRE(cache.store(key, jit::compile(other_signature.build(), o)));
    std::string why;
    CHECK(!cache.load_expected(key, f, o.arch, o.backend, &why));
    CHECK_MESSAGE(why.find("the compiled kernel's ABI does not match the signature") != std::string::npos, why);
    CHECK(!fs::exists(cache.entry_path(key)));
    REQUIRE(cache.store(key, jit::compile(other_signature.build(), o)));
    runtime::reset_memory_cache();
    jit::CompiledKernel k = runtime::compile_cached(f, o, cache);
    CHECK(runtime::compile_cache_stats().compiles == 1);
    CHECK(k.ptx == good.ptx);
  }
  SUBCASE("another key's entry file copied over this key's") {
    jit::CompileOptions w8 = o;
    w8.num_warps = 8;
    runtime::compile_cached(f, w8, cache);
    fs::copy_file(cache.entry_path(runtime::cache_key(f, w8)), cache.entry_path(key));
    rebuilt("holds kernel 'other'");
  }
  runtime::reset_memory_cache();
}

TEST_CASE("tilejit cache: a missing or wrong directory, orphans, and a clear that fails exit non-zero") {
  TempDir tmp;
  const std::string cli = TILEJIT_CLI_PATH;
  auto cache_cmd = [&](const std::string& what, const fs::path& dir, bool unprivileged = false) {
    return run_program({cli, "cache", what}, {{"TILEJIT_CACHE_DIR", dir.string()}, {"TILEJIT_CACHE", "1"}}, 60, unprivileged);
  };
  for (const char* what : {"ls", "verify", "clear"}) {
    INFO(what);
    ChildResult r = cache_cmd(what, tmp.path / "missing");
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("no such directory") != std::string::npos);
    CHECK(r.output.find("0 entries") == std::string::npos);
    write_bytes(tmp.path / "a-file", "x");
    r = cache_cmd(what, tmp.path / "a-file");
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("not a directory") != std::string::npos);
  }

  const fs::path dir = tmp.path / "cache";
  CompileCache cache(dir);
  REQUIRE(cache.store(key_of("x"), synthetic()));
  const std::string orphan = fmt::format("{}.tjk.tmp-{}-AAAAAA", key_of("y"), dead_pid());
  write_bytes(dir / orphan, "left by a killed writer");
  ChildResult ls = cache_cmd("ls", dir);
  INFO(ls.output);
  CHECK(ls.exit_code == 0);
  CHECK(ls.output.find("orphaned temporary: " + (dir / orphan).string()) != std::string::npos);
  CHECK(ls.output.find("1 entries, ") != std::string::npos);
  CHECK(ls.output.find("1 orphaned temporaries") != std::string::npos);
  ChildResult verify = cache_cmd("verify", dir);
  CHECK(verify.exit_code == 0);  // an orphan is reported, but is no damage
  CHECK(verify.output.find("orphaned temporary") != std::string::npos);

  // Read-only: the files stay, so the command must fail and say why.
  fs::permissions(dir, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write, fs::perm_options::remove);
  ChildResult ro = cache_cmd("clear", dir, true);
  INFO(ro.output);
  CHECK(ro.exit_code == 1);
  CHECK(ro.output.find("Permission denied") != std::string::npos);
  CHECK(ro.output.find("the cache is not clear") != std::string::npos);
  CHECK(file_names(dir).size() == 2);
  fs::permissions(dir, fs::perms::owner_write, fs::perm_options::add);
  ChildResult ok = cache_cmd("clear", dir);
  CHECK(ok.exit_code == 0);
  CHECK(ok.output.find("removed 1 entries and 1 orphaned temporaries") != std::string::npos);
  CHECK(file_names(dir).empty());
}

TEST_CASE("tilejit compile -o and bundle --emit-cpp into a read-only directory: the reason, old files intact") {
  TempDir tmp;
  const std::string cli = TILEJIT_CLI_PATH;
  const fs::path dir = tmp.path / "out";
  fs::create_directories(dir);
  write_bytes(dir / "gemm.tir", "old ir");
  write_bytes(dir / "app.cpp", "old source");
  fs::permissions(dir, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write, fs::perm_options::remove);
  // As nobody when the tests run as root: root ignores directory permissions.
  ChildResult c = run_program({cli, "compile", "gemm", "--emit", "ir", "-o", dir.string()}, {}, 120, true);
  INFO(c.output);
  CHECK(c.exit_code == 1);
  CHECK(c.output.find(fmt::format("tilejit compile: cannot write {}: cannot create a temporary file in {}: Permission denied",
                                  (dir / "gemm.tir").string(), dir.string())) != std::string::npos);
  ChildResult b = run_program({cli, "bundle", "--emit-cpp", (dir / "app.cpp").string(), "gemm"}, {}, 120, true);
  INFO(b.output);
  CHECK(b.exit_code == 1);
  CHECK(b.output.find(fmt::format("tilejit bundle: cannot write {}: cannot create a temporary file in {}: Permission denied",
                                  (dir / "app.cpp").string(), dir.string())) != std::string::npos);
  CHECK(read_bytes(dir / "gemm.tir") == "old ir");
  CHECK(read_bytes(dir / "app.cpp") == "old source");
  CHECK(file_names(dir) == std::vector<std::string>{"app.cpp", "gemm.tir"});
  // Writable again: the outputs are replaced whole.
  fs::permissions(dir, fs::perms::owner_write, fs::perm_options::add);
  ChildResult ok = run_program({cli, "compile", "gemm", "--emit", "ir", "-o", dir.string()}, {}, 120);
  CHECK(ok.exit_code == 0);
  CHECK(read_bytes(dir / "gemm.tir").find("gemm") != std::string::npos);
  CHECK(file_names(dir) == std::vector<std::string>{"app.cpp", "gemm.tir"});
}
