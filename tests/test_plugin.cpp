// Plugins (api/plugin.hpp) from an application's side: the example plugin (examples/plugin) loaded
// by path, its kernel registered like a library kernel and interpreted against float64; the bundle
// `tilejit --plugin ... bundle` wrote (ctest plugin.bundle) loaded with the compilers disabled and
// its entries found through the registry's specs; plugins that must be refused refused with errors
// naming the path and what is valid, registering nothing. No GPU.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include "temp_dir.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "api/plugin.hpp"
#include "api/plugin_loader.hpp"
#include "api/registry.hpp"
#include "api/tuning.hpp"
#include "runtime/bundle.hpp"
#include "runtime/compile_cache.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
namespace fs = std::filesystem;
using tilejit::testing::ScopedEnv;

namespace {

const fs::path kPlugin = TILEJIT_TEST_PLUGIN;

size_t registered_count(const std::string& name) {
  const std::vector<library::RegisteredKernel> all = library::registered();
  return static_cast<size_t>(std::count_if(all.begin(), all.end(), [&](const auto& r) { return r.kernel->name == name; }));
}

// Out = X + Alpha[row] * Y through the interpreter at `meta`, against float64; returns the
// relative error.
double interpreted_error(ir::DType dtype, const lang::Meta& meta, int64_t rows, int64_t cols) {
  const runtime::BundleEntrySpec spec = library::bundle_spec("row_scale_add", meta);
  const ir::Function fn = spec.build();
  runtime::HostTensor x(dtype, {rows, cols}), y(dtype, {rows, cols}), alpha(ir::DType::f32, {rows}), out(dtype, {rows, cols});
  x.fill_uniform(1, -1, 1);
  y.fill_uniform(2, -1, 1);
  alpha.fill_uniform(3, -2, 2);
  const int64_t br = std::get<int64_t>(fn.find_meta("BLOCK_R")->value), bc = std::get<int64_t>(fn.find_meta("BLOCK_C")->value);
  runtime::interpret(fn, {(rows + br - 1) / br, (cols + bc - 1) / bc}, {x, y, alpha, out});
  std::vector<double> ref;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ref.push_back(x.get({r, c}) + alpha.get({r}) * y.get({r, c}));
  return runtime::rel_error(out.to_f64(), ref);
}

}  // namespace

TEST_CASE("the example plugin's kernel is registered like a library kernel and computes Out = X + Alpha[row] * Y") {
  plugin::load(kPlugin, "test");
  const library::LibraryKernel* k = library::find("row_scale_add");
  REQUIRE(k != nullptr);
  CHECK(k->num_warps == 4);
  CHECK(library::origin_of("row_scale_add") == "test " + kPlugin.string());
  CHECK(library::origin_of("gemm").empty());
  CHECK(library::find_tuning_space("row_scale_add") != nullptr);
  const std::vector<std::string> tunable = library::tunable_kernels();
  CHECK(std::find(tunable.begin(), tunable.end(), "row_scale_add") != tunable.end());
  CHECK(library::library_shape("row_scale_add", {100, 200}) == runtime::Shape{{"R", 100}, {"C", 200}});
  CHECK_THROWS_WITH_AS(library::library_shape("row_scale_add", {1, 2, 3}), doctest::Contains("--shape takes R,C"),
                       std::invalid_argument);

  // the same file under another spelling of its path registers nothing twice
  plugin::load(kPlugin.parent_path() / "." / kPlugin.filename(), "again");
  CHECK(registered_count("row_scale_add") == 1);

  // ragged edges in both dims, the default tiles and others
  CHECK(interpreted_error(ir::DType::f32, {}, 37, 300) < 1e-6);
  CHECK(interpreted_error(ir::DType::f32, {{"BLOCK_R", 8}, {"BLOCK_C", 64}}, 37, 300) < 1e-6);
  CHECK(interpreted_error(ir::DType::bf16, {{"DTYPE", ir::DType::bf16}}, 20, 130) < 1e-2);
}

TEST_CASE("an application loads the plugin and the CLI's bundle, runs with the compilers disabled, finds every entry") {
  const fs::path bundle = TILEJIT_TEST_PLUGIN_BUNDLE;
  REQUIRE_MESSAGE(fs::exists(bundle), "run through ctest: the plugin.bundle test writes ", bundle.string());
  runtime::unload_all_bundles();
  runtime::reset_memory_cache();
  ScopedEnv no_compilers("TILEJIT_DISABLE_COMPILERS", "1");
  ScopedEnv no_disk_cache("TILEJIT_CACHE", "0");  // bundles only: no entry from an earlier run
  plugin::load(kPlugin, "test");  // the kernels' IR (names, metas, schedules); nothing compiles
  runtime::load_bundle(bundle);

  // what `tilejit bundle row_scale_add row_scale_add:DTYPE=bf16,BLOCK_C=256,warps=8` built
  runtime::BundleEntrySpec plain = library::bundle_spec("row_scale_add");
  runtime::BundleEntrySpec bf16 = library::bundle_spec("row_scale_add", {{"DTYPE", ir::DType::bf16}, {"BLOCK_C", 256}});
  bf16.options.num_warps = 8;
  for (runtime::BundleEntrySpec* spec : {&plain, &bf16}) {
    spec->options.arch = "sm_90a";
    const std::optional<jit::CompiledKernel> found = runtime::find_bundled(spec->key());
    REQUIRE(found.has_value());
    CHECK(found->ptx.find(".entry row_scale_add") != std::string::npos);
    CHECK(!found->cubin.empty());
    spec->options.make_cubin = true;
    const jit::CompiledKernel served = runtime::compile_cached(spec->build(), spec->options);
    CHECK(served.cubin == found->cubin);
  }
  CHECK(runtime::compile_cache_stats().compiles == 0);

  // a specialisation the bundle does not hold is an error naming the kernel, never a compile
  runtime::BundleEntrySpec missing = library::bundle_spec("row_scale_add", {{"BLOCK_C", 64}});
  missing.options.arch = "sm_90a";
  CHECK_THROWS_WITH(runtime::compile_cached(missing.build(), missing.options), doctest::Contains("row_scale_add"));
  CHECK(runtime::compile_cache_stats().compiles == 0);
  runtime::unload_all_bundles();
}

TEST_CASE("refused plugins: errors name the source, the path, the problem and what is valid; nothing is registered") {
  const auto refused = [](const fs::path& path, const std::string& problem) {
    CHECK_THROWS_WITH_AS(plugin::load(path, "--plugin"), doctest::Contains(("tilejit: --plugin " + path.string() + ": " + problem).c_str()),
                         plugin::PluginError);
  };
  refused("/no/such/libk.so", "no such file (give the path of a shared library built with TILEJIT_PLUGIN (api/plugin.hpp))");
  refused(fs::path(TILEJIT_TEST_PLUGIN).parent_path(), "not a regular file");
  refused(TILEJIT_SOURCE_DIR "/README.md", "cannot be loaded as a shared library: ");
  refused(TILEJIT_TEST_BAD_PLUGIN_NO_ENTRY, "not a tilejit plugin: it exports no tilejit_plugin_stamp");
  refused(TILEJIT_TEST_BAD_PLUGIN_STALE,
          fmt::format("built against tilejit 0.0.9 (plugin ABI 1, {0}); this is tilejit {1} (plugin ABI 1, {0}): rebuild the plugin "
                      "against this tilejit's headers and library",
                      plugin::kCxxLibrary, runtime::codec::kTilejitVersion));
  refused(TILEJIT_TEST_BAD_PLUGIN_DUPLICATE, "kernel 'gemm' is already a library kernel");
  refused(TILEJIT_TEST_BAD_PLUGIN_THROWS, "its registration failed: the plugin's own configuration is missing");
  CHECK(library::find("gemm") == &library::all().front());
  CHECK(library::origin_of("gemm").empty());
}

TEST_CASE("registration is all or none, and names must be typeable in bundle specs") {
  const auto body = []() -> const lang::Kernel& {
    static const lang::Kernel k = lang::kernel("fresh", [](lang::Builder& b) { b.scalar<int>("n"); });
    return k;
  };
  const library::LibraryKernel fresh{
      .name = "fresh_kernel", .kernel = body, .summary = "new", .default_meta = {}, .num_warps = 4, .stages = 3, .tuning_space = nullptr};
  library::LibraryKernel clash = fresh;
  clash.name = "attention_fwd";
  CHECK_THROWS_WITH_AS(library::register_kernels({fresh, clash}, "batch"),
                       doctest::Contains("tilejit: batch: kernel 'attention_fwd' is already a library kernel"), std::invalid_argument);
  CHECK(library::find("fresh_kernel") == nullptr);
  CHECK_THROWS_WITH_AS(library::register_kernels({fresh, fresh}, "batch"), doctest::Contains("kernel 'fresh_kernel' is registered twice"),
                       std::invalid_argument);
  for (const char* bad : {"", "1st", "a:b", "a,b", "a=b", "a b"}) {
    library::LibraryKernel k = fresh;
    k.name = bad;
    CHECK_THROWS_WITH_AS(library::register_kernels({k}, "batch"), doctest::Contains("is not valid (letters, digits and '_'"),
                         std::invalid_argument);
  }
  library::LibraryKernel no_body = fresh;
  no_body.kernel = nullptr;
  CHECK_THROWS_WITH_AS(library::register_kernels({no_body}, "batch"), doctest::Contains("has no kernel function"), std::invalid_argument);
  CHECK(library::find("fresh_kernel") == nullptr);

  library::register_kernels({fresh}, "batch");
  CHECK(library::find("fresh_kernel") != nullptr);
  CHECK_THROWS_WITH_AS(library::register_kernels({fresh}, "another"), doctest::Contains("'fresh_kernel' is already registered by batch"),
                       std::invalid_argument);
}

TEST_CASE("TILEJIT_PLUGINS: paths separated by ':', empty entries skipped, errors name the variable and the entry") {
  {
    ScopedEnv env("TILEJIT_PLUGINS", nullptr);
    CHECK_NOTHROW(plugin::load_from_environment());
  }
  {
    ScopedEnv env("TILEJIT_PLUGINS", ("::" + kPlugin.string() + ":").c_str());
    CHECK_NOTHROW(plugin::load_from_environment());
    CHECK(registered_count("row_scale_add") == 1);
  }
  ScopedEnv env("TILEJIT_PLUGINS", (kPlugin.string() + ":/no/such/libk.so").c_str());
  CHECK_THROWS_WITH_AS(plugin::load_from_environment(), doctest::Contains("tilejit: TILEJIT_PLUGINS /no/such/libk.so: no such file"),
                       plugin::PluginError);
}
