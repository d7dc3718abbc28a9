// `tilejit bundle`: build library or plugin kernels into a bundle file (and/or a C++ source
// embedding it); `tilejit bundle --list FILE`: what a bundle holds.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "commands.hpp"
#include "output_file.hpp"
#include "api/attention.hpp"
#include "runtime/bundle.hpp"

namespace tilejit::cli {
namespace {

namespace fs = std::filesystem;

// A schedule switch's value: on/true or off/false.
bool parse_on_off(const std::string& text, const std::string& name, const std::string& value) {
  if (value == "on" || value == "true") return true;
  if (value == "off" || value == "false") return false;
  throw UsageError(fmt::format("{}: {}={}: valid: on, off", text, name, value));
}

// KERNEL[:NAME=VALUE,...]: upper-case names (any name but the schedule's below) are
// meta-parameters; warps, stages, min_programs_per_sm, pipeline, once_by_tma, packed_loop_pairs and backend set the
// schedule.
runtime::BundleEntrySpec parse_spec(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string kernel = text.substr(0, colon);
  if (kernel.empty()) throw UsageError(fmt::format("'{}': expected KERNEL[:NAME=VALUE,...]", text));
  (void)select_kernel(kernel);  // a usage error for an unknown name
  runtime::BundleEntrySpec spec = library::bundle_spec(kernel);
  if (colon == std::string::npos) return spec;
  std::string rest = text.substr(colon + 1);
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    std::string kv = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("{}: '{}': expected NAME=VALUE", text, kv));
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (name == "warps") {
      spec.options.num_warps = parse_int(fmt::format("{}: warps", text), value);
    } else if (name == "stages") {
      spec.options.pipeline.stages = parse_int(fmt::format("{}: stages", text), value);
    } else if (name == "min_programs_per_sm") {
      spec.options.min_programs_per_sm = parse_int(fmt::format("{}: min_programs_per_sm", text), value);
    } else if (name == "pipeline") {
      spec.options.pipeline.enabled = parse_on_off(text, name, value);
    } else if (name == "once_by_tma") {
      spec.options.pipeline.once_by_tma = parse_on_off(text, name, value);
    } else if (name == "packed_loop_pairs") {
      spec.options.packed_loop_pairs = parse_on_off(text, name, value);
    } else if (name == "backend") {
      if (value == "llvm") spec.options.backend = jit::Backend::Llvm;
      else if (value == "nvrtc") spec.options.backend = jit::Backend::Nvrtc;
      else throw UsageError(fmt::format("{}: backend={}: valid: llvm, nvrtc", text, value));
    } else {
      for (const auto& m : spec.meta)
        if (m.first == name) throw UsageError(fmt::format("{}: {} is given twice", text, name));
      spec.meta.push_back({name, parse_meta_value(text + ":", name, value)});
    }
  }
  return spec;
}

// --attention KEY=VALUE,...: the kernels the attention API launches for one configuration
// (attention::bundle_specs, what attention::prepare compiles). D is required; dtype=bf16|f16,
// mask=NAME (full, causal, or a library mask), varlen, backward, dropout, q_descending = 0|1 (a
// flag's name alone: 1), reduction=recompute|atomic|split|ordered (unset: every reduction the
// API's default may pick for the configuration, as `prepare` compiles them, so that a bundle
// serves the default calls with the compilers disabled).
std::vector<runtime::BundleEntrySpec> attention_specs(const std::string& text) {
  const std::string where = "--attention " + text;
  std::optional<int> head_dim;
  ir::DType dtype = ir::DType::bf16;
  kernels::MaskKind mask = kernels::MaskKind::full;
  bool varlen = false, backward = true, dropout = false, q_descending = false;
  std::optional<attention::DqReduction> reduction;  // (unset: the default's)
  auto flag = [&](const std::string& key, const std::string& v) {
    if (v != "0" && v != "1") throw UsageError(fmt::format("{}: {}={}: valid: 0, 1", where, key, v));
    return v == "1";
  };
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string kv = text.substr(start, comma - start);
    start = comma + 1;
    const size_t eq = kv.find('=');
    // a flag's bare name means 1 (`--attention D=128,dropout`)
    const bool bare_flag = kv == "varlen" || kv == "backward" || kv == "dropout" || kv == "q_descending";
    if (eq == std::string::npos && !bare_flag)
      throw UsageError(fmt::format("{}: '{}': expected KEY=VALUE (or a flag alone: varlen, backward, dropout, q_descending)", where, kv));
    const std::string key = kv.substr(0, eq), v = eq == std::string::npos ? "1" : kv.substr(eq + 1);
    if (key == "D") {
      if (v != "64" && v != "128" && v != "256") throw UsageError(fmt::format("{}: D={}: valid: 64, 128, 256", where, v));
      head_dim = std::stoi(v);
    } else if (key == "dtype") {
      if (v != "bf16" && v != "f16") throw UsageError(fmt::format("{}: dtype={}: valid: bf16, f16", where, v));
      dtype = v == "bf16" ? ir::DType::bf16 : ir::DType::f16;
    } else if (key == "mask") {
      int found = -1;
      for (int k = 0; k < kernels::kMaskKindCount; ++k)
        if (v == kernels::mask_kind_name(static_cast<kernels::MaskKind>(k))) found = k;
      if (found < 0) throw UsageError(fmt::format("{}: mask={}: valid: {}", where, v, kernels::mask_kind_list()));
      mask = static_cast<kernels::MaskKind>(found);
    } else if (key == "reduction") {
      int found = -1;
      for (int r = 0; r < 4; ++r)
        if (v == attention::name(static_cast<attention::DqReduction>(r))) found = r;
      if (found < 0) throw UsageError(fmt::format("{}: reduction={}: valid: recompute, atomic, split, ordered", where, v));
      reduction = static_cast<attention::DqReduction>(found);
    } else if (key == "varlen") {
      varlen = flag(key, v);
    } else if (key == "backward") {
      backward = flag(key, v);
    } else if (key == "dropout") {
      dropout = flag(key, v);
    } else if (key == "q_descending") {
      q_descending = flag(key, v);
    } else {
      throw UsageError(fmt::format("{}: unknown key '{}' (valid: D, dtype, mask, varlen, backward, dropout, reduction, q_descending)",
                                   where, key));
    }
  }
  if (!head_dim) throw UsageError(fmt::format("{}: say the head dim: D=64, 128 or 256", where));
  try {
    return attention::bundle_specs(dtype, *head_dim, mask, varlen, backward, {}, dropout, reduction, q_descending);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("{}: {}", where, e.what()));
  }
}

std::string human_bytes(size_t n) {
  if (n < 10 * 1024) return fmt::format("{} B", n);
  if (n < 10 * 1024 * 1024) return fmt::format("{} KB", (n + 512) / 1024);
  return fmt::format("{} MB", (n + 512 * 1024) / (1024 * 1024));
}

int list(const fs::path& file) {
  runtime::Bundle b = runtime::read_bundle(file);
  std::printf("%s: tilejit bundle format %u written by tilejit %s, %s, archs %s, %zu %s\n", file.c_str(),
              b.format_version, b.tilejit_version.c_str(), human_bytes(b.bytes).c_str(),
              b.archs.empty() ? "(none)" : fmt::format("{}", fmt::join(b.archs, ", ")).c_str(), b.entries.size(),
              b.entries.size() == 1 ? "entry" : "entries");
  for (const runtime::BundleEntry& e : b.entries) {
    const jit::KernelInfo& info = e.compiled.info;
    std::printf("  %-14s %-7s %s  [%s]\n", e.kernel.c_str(), e.arch.c_str(), e.schedule.c_str(), e.meta.c_str());
    std::printf("    key %s  cubin %s, %d registers, %lld B dynamic shared memory, %d B spill stores, %d threads\n",
                e.key.substr(0, 16).c_str(), human_bytes(e.compiled.cubin.size()).c_str(), info.registers,
                static_cast<long long>(e.compiled.smem_bytes), info.spill_store_bytes, e.compiled.num_threads);
  }
  std::printf("  tuning tables: %s (section version %u)\n",
              b.tuning.empty() ? "none" : human_bytes(b.tuning.size()).c_str(), b.tuning_version);
  return 0;
}

}  // namespace

int cmd_bundle(const Args& args) {
  fs::path out, cpp, list_file;
  std::vector<std::string> archs, specs_text, attention_text;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-o") out = option_value(args, i);
    else if (a == "--arch") archs.push_back(option_value(args, i));
    else if (a == "--emit-cpp") cpp = option_value(args, i);
    else if (a == "--list") list_file = option_value(args, i);
    else if (a == "--attention") attention_text.push_back(option_value(args, i));
    else if (a.starts_with("-")) throw UsageError(fmt::format("unknown option '{}'", a));
    else specs_text.push_back(a);
  }
  if (!list_file.empty()) {
    if (!out.empty() || !cpp.empty() || !archs.empty() || !specs_text.empty() || !attention_text.empty())
      throw UsageError("--list FILE takes no other arguments");
    return list(list_file);
  }
  if (out.empty() && cpp.empty()) throw UsageError("say where to write the bundle: -o FILE and/or --emit-cpp FILE.cpp");
  if (specs_text.empty() && attention_text.empty())
    throw UsageError("name at least one kernel (see `tilejit kernels`) or --attention configuration");
  if (archs.empty()) archs.push_back("sm_90a");
  for (const std::string& arch : archs)
    if (!arch.starts_with("sm_") || arch.size() < 5)
      throw UsageError(fmt::format("--arch {}: expected a GPU arch such as sm_90a or sm_80", arch));

  // Every spec is parsed and built (meta names and values checked) before anything compiles.
  std::vector<runtime::BundleEntrySpec> specs;
  for (const std::string& text : specs_text) {
    runtime::BundleEntrySpec spec = parse_spec(text);
    try {
      (void)spec.build();
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("{}: {}", text, e.what()));
    }
    for (const std::string& arch : archs) {
      spec.options.arch = arch;
      specs.push_back(spec);
    }
  }
  for (const std::string& text : attention_text)
    for (runtime::BundleEntrySpec spec : attention_specs(text))
      for (const std::string& arch : archs) {
        spec.options.arch = arch;
        specs.push_back(spec);
      }
  runtime::Bundle b = runtime::make_bundle(specs);
  const std::string name = !out.empty() ? out.filename().string() : cpp.stem().string() + ".tjb";
  b.name = name;
  std::string bytes = runtime::encode_bundle(b);
  if (!out.empty()) {
    runtime::save_bundle(out, b);
    std::printf("wrote %s: %zu kernels for %s, %s\n", out.c_str(), b.entries.size(),
                fmt::format("{}", fmt::join(b.archs, ", ")).c_str(), human_bytes(bytes.size()).c_str());
  }
  if (!cpp.empty()) {
    write_output("bundle", cpp, runtime::bundle_cpp_source(bytes, name));  // atomic, like the bundle
    std::printf("wrote %s: embeds %s (%s); link it into the application to load the kernels at start-up\n",
                cpp.c_str(), name.c_str(), human_bytes(bytes.size()).c_str());
  }
  return 0;
}

}  // namespace tilejit::cli
