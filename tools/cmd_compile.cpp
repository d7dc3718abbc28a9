// `tilejit kernels` and `tilejit compile`: list the library and the plugins' kernels; compile one
// kernel and write the artefacts of the chosen stages.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "commands.hpp"
#include "output_file.hpp"

namespace tilejit::cli {
namespace {

void write_file(const std::filesystem::path& p, const void* data, size_t n) {
  write_output("compile", p, std::string_view(static_cast<const char*>(data), n));  // atomic: never truncated
}

}  // namespace

ir::MetaValue parse_meta_value(const std::string& context, const std::string& name, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  if (auto d = ir::parse_dtype(v)) return *d;
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size()) return static_cast<int64_t>(x);
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("{} {}={}: the value must be an integer, true/false or a dtype", context, name, v));
}

int parse_int(const std::string& context, const std::string& v) {
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("{}: '{}' is not an integer", context, v));
}

const std::string& option_value(const Args& args, size_t& i) {
  if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", args[i]));
  return args[++i];
}

KernelSelection select_kernel(const std::string& name) {
  KernelSelection sel;
  sel.kernel = library::find(name);
  if (!sel.kernel)
    throw UsageError(fmt::format("unknown kernel '{}' (see `tilejit kernels`; a plugin's kernels need --plugin PATH)", name));
  sel.options.num_warps = sel.kernel->num_warps;
  sel.options.pipeline.stages = sel.kernel->stages;
  return sel;
}

ir::Function KernelSelection::build() const {
  lang::Meta full = meta;
  for (const auto& [name, value] : kernel->default_meta)
    if (std::none_of(meta.begin(), meta.end(), [&](const auto& m) { return m.first == name; })) full.push_back({name, value});
  return kernel->kernel().build(full);
}

bool parse_kernel_option(const Args& args, size_t& i, KernelSelection& sel) {
  const std::string& a = args[i];
  if (a == "--meta") {
    const std::string& kv = option_value(args, i);
    auto eq = kv.find('=');
    if (eq == std::string::npos) throw UsageError(fmt::format("--meta {}: expected NAME=VALUE", kv));
    sel.meta.push_back({kv.substr(0, eq), parse_meta_value("--meta", kv.substr(0, eq), kv.substr(eq + 1))});
  } else if (a == "--backend") {
    const std::string& b = option_value(args, i);
    if (b == "llvm") sel.options.backend = jit::Backend::Llvm;
    else if (b == "nvrtc") sel.options.backend = jit::Backend::Nvrtc;
    else throw UsageError(fmt::format("--backend {}: valid: llvm, nvrtc", b));
  } else if (a == "--arch") {
    sel.options.arch = option_value(args, i);
  } else if (a == "--num-warps") {
    sel.options.num_warps = parse_int(a, option_value(args, i));
  } else if (a == "--stages") {
    sel.options.pipeline.stages = parse_int(a, option_value(args, i));
  } else if (a == "--min-programs-per-sm") {
    sel.options.min_programs_per_sm = parse_int(a, option_value(args, i));
  } else if (a == "--no-pipeline") {
    sel.options.pipeline.enabled = false;
  } else if (a == "--packed-loop-pairs") {
    sel.options.packed_loop_pairs = true;
  } else {
    return false;
  }
  return true;
}

int cmd_kernels(const Args& args) {
  if (!args.empty()) throw UsageError(fmt::format("kernels takes no arguments, got '{}'", args[0]));
  for (const auto& k : library::all()) std::printf("%-16s %s\n", k.name.c_str(), k.summary.c_str());
  for (const library::RegisteredKernel& r : library::registered())
    std::printf("%-16s %s  [from %s]\n", r.kernel->name.c_str(), r.kernel->summary.c_str(), r.origin.c_str());
  return 0;
}

int cmd_compile(const Args& args) {
  if (args.empty()) throw UsageError("compile needs a kernel name (see `tilejit kernels`)");
  KernelSelection sel = select_kernel(args[0]);
  std::vector<std::string> emit;
  std::filesystem::path out_dir = ".";
  for (size_t i = 1; i < args.size(); ++i) {
    if (parse_kernel_option(args, i, sel)) continue;
    const std::string& a = args[i];
    if (a == "--emit") {
      const std::string& e = option_value(args, i);
      if (e == "all") {
        emit = {"ir", "source", "ptx", "cubin"};
      } else if (e == "ir" || e == "source" || e == "ptx" || e == "cubin") {
        emit.push_back(e);
      } else {
        throw UsageError(fmt::format("--emit {}: valid: ir, source, ptx, cubin, all", e));
      }
    } else if (a == "--dump-after") {
      sel.options.dump_after = option_value(args, i);
    } else if (a == "-o") {
      out_dir = option_value(args, i);
    } else {
      throw UsageError(fmt::format("unknown option '{}'", a));
    }
  }
  if (emit.empty()) emit = {"ptx", "cubin"};
  sel.options.make_cubin = std::find(emit.begin(), emit.end(), "cubin") != emit.end() || !sel.options.dump_after.empty();
  ir::Function fn = sel.build();
  jit::CompiledKernel k = jit::compile(fn, sel.options);
  std::filesystem::create_directories(out_dir);
  for (const std::string& e : emit) {
    std::filesystem::path p = out_dir / fn.name;
    if (e == "ir") write_file(p.replace_extension(".tir"), k.tile_ir.data(), k.tile_ir.size());
    if (e == "source")
      write_file(p.replace_extension(sel.options.backend == jit::Backend::Llvm ? ".ll" : ".cu"), k.backend_source.data(),
                 k.backend_source.size());
    if (e == "ptx") write_file(p.replace_extension(".ptx"), k.ptx.data(), k.ptx.size());
    if (e == "cubin") write_file(p.replace_extension(".cubin"), k.cubin.data(), k.cubin.size());
  }
  if (!k.dump.empty()) std::fputs(k.dump.c_str(), stdout);
  std::printf("%s: %d threads, %lld B dynamic shared memory, %zu TMA descriptors\n", fn.name.c_str(), k.num_threads,
              static_cast<long long>(k.smem_bytes), k.tensor_maps.size());
  if (sel.options.make_cubin) std::printf("%s (%s)\n", k.info.to_string().c_str(), k.ptx_tool.c_str());
  std::printf("timings: passes %.1f ms, %s -> PTX %.1f ms, PTX -> cubin %.1f ms\n", k.timings.passes_ms,
              std::string(jit::to_string(sel.options.backend)).c_str(), k.timings.backend_ms, k.timings.ptx_to_cubin_ms);
  return 0;
}

}  // namespace tilejit::cli
