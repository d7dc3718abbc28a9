// What bundles carry of the autotuner: the tuning table (identity -> chosen config) encoded into a
// bundle's tuning section, the tables of the loaded bundles, and the content (kernels and table)
// a tool collects to write a bundle of tuned choices.
#include <fmt/format.h>

#include <cstdio>
#include <stdexcept>

#include "runtime/autotuner.hpp"
#include "runtime/autotuner_internal.hpp"
#include "runtime/kernel_codec.hpp"

namespace tilejit::runtime {

using tuning_detail::bits_f64;
using tuning_detail::f64_bits;

// ---- tuning tables ---------------------------------------------------------------------------

std::string encode_tuning_table(const std::vector<TuningTableEntry>& entries) {
  codec::Writer w;
  w.count(entries.size());
  for (const TuningTableEntry& e : entries) {
    const TuningIdentity& i = e.identity;
    w.str(i.kernel);
    w.str(i.fixed);
    w.str(i.bucket);
    w.str(i.gpu);
    w.str(i.arch);
    w.str(i.backend);
    w.i32(i.sm_count);
    w.i32(i.driver_version);
    w.str(e.config);
    w.u64(f64_bits(e.ms));
  }
  return std::move(w.out());
}

std::vector<TuningTableEntry> decode_tuning_table(std::string_view bytes) {
  std::vector<TuningTableEntry> out;
  if (bytes.empty()) return out;
  try {
    codec::Reader r(bytes, 0, bytes.size());
    size_t n = r.count("tuning entries", 7 * 8 + 16);
    for (size_t k = 0; k < n; ++k) {
      TuningTableEntry e;
      TuningIdentity& i = e.identity;
      i.kernel = r.str("kernel");
      i.fixed = r.str("fixed meta");
      i.bucket = r.str("bucket");
      i.gpu = r.str("gpu");
      i.arch = r.str("arch");
      i.backend = r.str("backend");
      i.sm_count = r.i32("sm count");
      i.driver_version = r.i32("driver version");
      e.config = r.str("config");
      e.ms = bits_f64(r.u64("ms"));
      (void)parse_config(e.config);  // throws for a malformed config
      out.push_back(std::move(e));
    }
    if (r.left() != 0) throw codec::DecodeError(fmt::format("{} unexpected bytes after the last entry", r.left()));
  } catch (const codec::DecodeError& e) {
    throw std::runtime_error(fmt::format("tilejit: bundle tuning table: damaged: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("tilejit: bundle tuning table: {}", e.what()));
  }
  return out;
}

std::vector<TuningTableEntry> loaded_tuning_tables() {
  std::vector<TuningTableEntry> all;
  for (const LoadedBundle& b : loaded_bundles()) {
    if (b.tuning.empty() || b.tuning_version != kBundleTuningVersion) continue;
    try {
      std::vector<TuningTableEntry> t = decode_tuning_table(b.tuning);
      all.insert(all.end(), t.begin(), t.end());
    } catch (const std::exception& e) {
      // The bundle's kernels are still good (the file's checksum passed); only its table is unusable.
      std::fprintf(stderr, "%s (bundle %s); its kernels still load, their choices fall back to the defaults\n", e.what(),
                   b.name.c_str());
    }
  }
  return all;
}

// ---- bundles ---------------------------------------------------------------------------------

void add_to_bundle_content(TunedBundleContent& content, const TuningSpace& space, const TuneResult& r,
                           const lang::Meta& fixed, const jit::CompileOptions& base) {
  BundleEntrySpec spec;
  spec.kernel = space.kernel_name();
  spec.source = space.kernel_source();
  // The full specialisation, so that a default meta (which BundleEntrySpec layers
  // under it) cannot change the kernel.
  for (const ir::MetaEntry& m : space.build_ir(r.best, fixed).meta) spec.meta.push_back({m.name, m.value});
  spec.options = r.best.options(base);
  content.specs.push_back(std::move(spec));
  content.table.push_back({r.identity, r.best.id(), r.best_ms});
}

}  // namespace tilejit::runtime
