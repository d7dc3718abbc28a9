// Bundles: compiled kernels (kernels x specialisations x GPU archs) in one checked file that an
// application ships, loads at start-up and runs with no LLVM, nvrtc, nvJitLink or ptxas present.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/builder.hpp"
#include "dsl/ir/function.hpp"
#include "jit/compile.hpp"

namespace tilejit::runtime {

// The key a bundle stores a kernel under: 64 hex digits, the SHA-256 of bundle_key_text(). Unlike
// cache_key() it leaves out everything that describes the compilers (LLVM, nvJitLink, ptxas and
// nvrtc versions, backend, assembler choice): a shipped application has none of them, and any of
// them produces a kernel that computes the same thing. It keeps what changes the code's meaning
// or its launch: structural IR hash (meta-parameters and parameter specs included), kernel name,
// arch, num_warps, pipeline options, tilejit version.
std::string bundle_key(const ir::Function& f, const jit::CompileOptions& opts);
std::string bundle_key_text(const ir::Function& f, const jit::CompileOptions& opts);
// The same from an already computed ir::structural_hash(f) (compile_cached hashes the IR once).
std::string bundle_key_from_hash(std::string_view ir_hash, std::string_view kernel, const jit::CompileOptions& opts);

// One kernel to put in a bundle. For a library kernel by name, tilejit::library::bundle_spec
// (api/registry.hpp) fills it with the library's default schedule; the runtime knows no library.
struct BundleEntrySpec {
  std::string kernel;                          // its name: "gemm", "attention_fwd"
  const lang::Kernel& (*source)() = nullptr;   // the DSL kernel (built on demand)
  lang::Meta meta;                             // layered over default_meta (names not given keep it)
  lang::Meta default_meta;
  jit::CompileOptions options;                 // arch, warps, pipeline, backend; make_cubin is forced on

  // The specialised tile IR (default meta under `meta`); throws std::invalid_argument without a
  // source and lang::BuildError for bad meta values.
  ir::Function build() const;
  std::string key() const { return bundle_key(build(), options); }
};

struct BundleEntry {
  std::string key;       // bundle_key() of the kernel it was built from
  std::string kernel;    // "gemm"
  std::string meta;      // the full specialisation, printable: "DTYPE=bf16,OUT_DTYPE=f32,BLOCK_M=128,..."
  std::string schedule;  // "warps=8,stages=4,pipeline=on,backend=llvm"
  std::string arch;      // "sm_90a"
  jit::CompiledKernel compiled;
};

// Format version of the tuning section. The section is empty until the autotuner writes tuning
// tables (per kernel and shape bucket, the winning entry's key); readers that do not know its
// version keep its bytes unread and still load every kernel.
inline constexpr uint32_t kBundleTuningVersion = 1;

struct Bundle {
  std::string name;             // the file, or the name given to read_bundle_bytes
  uint32_t format_version = 0;  // of the file read (encode_bundle writes the current one)
  std::string tilejit_version;  // of the tilejit that wrote it
  std::vector<std::string> archs;  // the target archs, in the order given
  std::vector<BundleEntry> entries;
  uint32_t tuning_version = kBundleTuningVersion;
  std::string tuning;           // opaque here; empty until the autotuner exists
  size_t bytes = 0;             // size of the file read
};

// A bundle file that cannot be used; what() names the file and the problem:
// "tilejit: bundle app.tjb: truncated: 4096 of 81920 bytes (copy it again)",
// "tilejit: bundle app.tjb: checksum mismatch: the file is corrupt", "... not a tilejit bundle
// (wrong magic)", "... format version 2 (this tilejit reads version 1)", and, from load_bundle,
// "tilejit: bundle app.tjb holds sm_80 kernels; this GPU is sm_90a (NVIDIA H100 80GB HBM3)".
struct BundleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- writing (needs the compilers) ----------------------------------------------------------

// Builds every spec with the library registry and jit::compile (a spec whose key repeats an
// earlier one is built once); progress on stderr, one line per kernel. Throws what the compile
// throws, or std::invalid_argument for an unknown kernel.
Bundle make_bundle(const std::vector<BundleEntrySpec>& specs);
// The file's bytes:
//   header   "TILEJITB" | u32 format version | u32 header size (24; readers skip to it) | u64 file size
//   body     str tilejit version | u32 n, n x str arch
//            | u32 n, n x (str key | str kernel | str meta | str schedule | str arch | str kernel bytes)
//            | u32 tuning version | str tuning tables
//   trailer  SHA-256 (32 bytes) of everything before it
// little-endian; str is u64 length + bytes; "kernel bytes" is a CompiledKernel as
// runtime/kernel_codec.hpp writes it (the compile cache stores kernels the same way).
std::string encode_bundle(const Bundle& b);
// Writes atomically (temporary file + rename): readers never see half a bundle. Throws BundleError.
void save_bundle(const std::filesystem::path& path, const Bundle& b);
// make_bundle + save_bundle.
void write_bundle(const std::filesystem::path& path, const std::vector<BundleEntrySpec>& specs);

// ---- reading and loading (no compiler needed) ---------------------------------------------

// Reads and checks everything (size, magic, version, checksum, every field); throws BundleError.
Bundle read_bundle(const std::filesystem::path& path);
Bundle read_bundle_bytes(std::span<const uint8_t> data, std::string name = "<memory>");

// Registers the bundle's kernels process-wide (thread-safe), where compile_cached finds them
// before anything else. When a GPU is present, a bundle with no entry for its arch (device 0)
// is a BundleError and nothing is registered. Loading the same kernels twice is harmless (the
// first copy stays; equal keys mean equal code).
void load_bundle(const std::filesystem::path& path);
void load_bundle_bytes(const uint8_t* data, size_t size, const char* name);
void load_bundle(const Bundle& bundle);  // one already read

// The registered kernel for a bundle_key(), if any loaded bundle holds it.
std::optional<jit::CompiledKernel> find_bundled(const std::string& bundle_key);
// Whether any bundle is loaded (a relaxed atomic read: compile_cached's fast path).
bool bundles_loaded();
// Counts load_bundle and unload_all_bundles calls: a cache of lookups in bundles' tuning tables
// compares it to see that the tables it read may have changed.
uint64_t bundles_generation();

struct LoadedBundle {
  std::string name;
  std::vector<std::string> archs;
  size_t entries = 0;
  size_t new_entries = 0;  // not already registered by an earlier bundle
  uint32_t tuning_version = 0;  // the bundle's tuning section, for the autotuner (runtime/autotuner.hpp)
  std::string tuning;
};
std::vector<LoadedBundle> loaded_bundles();
// Forgets every loaded bundle and every recorded load failure (tests; tools that reload).
void unload_all_bundles();

// The CompileError compile_cached raises when compilers are disabled and no loaded bundle holds
// the kernel: names the kernel, its specialisation and schedule, the bundle key, what the loaded
// bundles hold for that kernel and any bundle that failed to load.
[[noreturn]] void throw_not_bundled(const ir::Function& f, const jit::CompileOptions& opts, const std::string& bundle_key);

// A C++ source that embeds `bytes` (a bundle file) as a byte array and loads it with
// load_bundle_bytes from a static initializer, so linking it into an application registers the
// kernels at start-up. It declares what it calls itself (no tilejit header needed, only libtilejit
// to link); a bundle that fails to load is reported on stderr, and kernels then fail to find it.
std::string bundle_cpp_source(std::string_view bytes, std::string_view name);

// Printable forms used by entries and errors: "BLOCK_M=128,CAUSAL=true,DTYPE=bf16" (declaration
// order) and "warps=8,stages=4,pipeline=on,backend=llvm".
std::string describe_meta(const std::vector<ir::MetaEntry>& meta);
std::string describe_schedule(const jit::CompileOptions& opts);

}  // namespace tilejit::runtime

namespace tilejit {
using runtime::load_bundle;  // tilejit::load_bundle(path): what an application calls
}
