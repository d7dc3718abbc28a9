// The `tilejit` command-line tool. This slice has `compile` (issue #3) and `kernels`; `run`,
// `tune`, `bundle`, `cache` and `inspect` arrive with the runtime and autotuner issues.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "jit/compile.hpp"
#include "kernels/registry.hpp"

using namespace tilejit;

namespace {

constexpr const char* kUsage = R"(usage:
  tilejit kernels
      list the library kernels
  tilejit compile KERNEL [--meta NAME=VALUE ...] [--backend llvm|nvrtc] [--arch sm_90a]
                  [--num-warps N] [--stages N] [--no-pipeline] [--emit ir|source|ptx|cubin ...]
                  [--dump-after PASS] [-o DIR]
      compile a library kernel (its default schedule, under your --meta values and options);
      writes DIR/KERNEL.{tir,ll|cu,ptx,cubin} for each --emit
      (default: ptx and cubin) and prints registers, shared memory and spills.
      VALUE is an integer, true/false, or a dtype (f32 bf16 f16 ...).
      PASS is one of: verify canonicalize assign-layouts lower backend ptx-to-cubin
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "tilejit: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

ir::MetaValue parse_meta_value(const std::string& name, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  if (auto d = ir::parse_dtype(v)) return *d;
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size()) return static_cast<int64_t>(x);
  } catch (const std::exception&) {
  }
  usage_error(fmt::format("--meta {}={}: the value must be an integer, true/false or a dtype", name, v));
}

void write_file(const std::filesystem::path& p, const void* data, size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) throw std::runtime_error(fmt::format("tilejit: cannot write {}", p.string()));
}

int compile(std::vector<std::string> args) {
  if (args.empty()) usage_error("compile needs a kernel name (see `tilejit kernels`)");
  const kernels::LibraryKernel* lk = kernels::find(args[0]);
  if (!lk) usage_error(fmt::format("unknown kernel '{}' (see `tilejit kernels`)", args[0]));
  lang::Meta meta;
  jit::CompileOptions opts;
  opts.num_warps = lk->num_warps;
  opts.pipeline.stages = lk->stages;
  std::vector<std::string> emit;
  std::filesystem::path out_dir = ".";
  for (size_t i = 1; i < args.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) usage_error(fmt::format("{} needs a value", args[i]));
      return args[++i];
    };
    const std::string& a = args[i];
    if (a == "--meta") {
      const std::string& kv = value();
      auto eq = kv.find('=');
      if (eq == std::string::npos) usage_error(fmt::format("--meta {}: expected NAME=VALUE", kv));
      meta.push_back({kv.substr(0, eq), parse_meta_value(kv.substr(0, eq), kv.substr(eq + 1))});
    } else if (a == "--backend") {
      const std::string& b = value();
      if (b == "llvm") opts.backend = jit::Backend::Llvm;
      else if (b == "nvrtc") opts.backend = jit::Backend::Nvrtc;
      else usage_error(fmt::format("--backend {}: valid: llvm, nvrtc", b));
    } else if (a == "--arch") {
      opts.arch = value();
    } else if (a == "--num-warps") {
      opts.num_warps = std::stoi(value());
    } else if (a == "--stages") {
      opts.pipeline.stages = std::stoi(value());
    } else if (a == "--no-pipeline") {
      opts.pipeline.enabled = false;
    } else if (a == "--emit") {
      const std::string& e = value();
      if (e != "ir" && e != "source" && e != "ptx" && e != "cubin") usage_error(fmt::format("--emit {}: valid: ir, source, ptx, cubin", e));
      emit.push_back(e);
    } else if (a == "--dump-after") {
      opts.dump_after = value();
    } else if (a == "-o") {
      out_dir = value();
    } else {
      usage_error(fmt::format("unknown option '{}'", a));
    }
  }
  if (emit.empty()) emit = {"ptx", "cubin"};
  opts.make_cubin = std::find(emit.begin(), emit.end(), "cubin") != emit.end() || !opts.dump_after.empty();
  // the library's default schedule under the user's --meta values
  lang::Meta full = meta;
  for (const auto& [name, value] : lk->default_meta) {
    bool given = false;
    for (const auto& m : meta) given = given || m.first == name;
    if (!given) full.push_back({name, value});
  }
  ir::Function fn = lk->kernel().build(full);
  jit::CompiledKernel k = jit::compile(fn, opts);
  std::filesystem::create_directories(out_dir);
  for (const std::string& e : emit) {
    std::filesystem::path p = out_dir / fn.name;
    if (e == "ir") write_file(p.replace_extension(".tir"), k.tile_ir.data(), k.tile_ir.size());
    if (e == "source") write_file(p.replace_extension(opts.backend == jit::Backend::Llvm ? ".ll" : ".cu"), k.backend_source.data(), k.backend_source.size());
    if (e == "ptx") write_file(p.replace_extension(".ptx"), k.ptx.data(), k.ptx.size());
    if (e == "cubin") write_file(p.replace_extension(".cubin"), k.cubin.data(), k.cubin.size());
  }
  if (!k.dump.empty()) std::fputs(k.dump.c_str(), stdout);
  std::printf("%s: %d threads, %lld B dynamic shared memory, %zu TMA descriptors\n", fn.name.c_str(), k.num_threads,
              static_cast<long long>(k.smem_bytes), k.tensor_maps.size());
  if (opts.make_cubin) std::printf("%s (%s)\n", k.info.to_string().c_str(), k.ptx_tool.c_str());
  std::printf("timings: passes %.1f ms, %s -> PTX %.1f ms, PTX -> cubin %.1f ms\n", k.timings.passes_ms,
              std::string(jit::to_string(opts.backend)).c_str(), k.timings.backend_ms, k.timings.ptx_to_cubin_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  try {
    if (args[0] == "kernels") {
      for (const auto& k : kernels::library()) std::printf("%-16s %s\n", k.name.c_str(), k.summary.c_str());
      return 0;
    }
    if (args[0] == "compile") return compile({args.begin() + 1, args.end()});
    usage_error(fmt::format("unknown command '{}'", args[0]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
