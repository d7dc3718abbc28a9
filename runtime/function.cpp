// Function: lazy IR build, checked first call, compile through the cache, then a lock-free path.
#include "runtime/function.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <string_view>
#include <map>
#include <mutex>
#include <optional>

#include "runtime/compile_cache.hpp"
#include "runtime/specialization.hpp"

namespace tilejit {

// Everything a Function holds, behind one pointer so that Function stays movable (the mutex and
// atomics are not). Members are written once, under `mutex`, and published through the atomics;
// the hot path reads `signature` and `last` and then an immutable GpuKernel.
struct Function::State {
  // One compiled variant of the kernel: the signature as declared (key 0) or specialised on what
  // a call's arguments hold (runtime/specialization.hpp).
  struct Variant {
    uint64_t key = 0;
    ir::Function fn;
    std::optional<runtime::LaunchPlan> plan;
    std::optional<jit::CompiledKernel> compiled;
    std::unique_ptr<runtime::GpuKernel> gpu;
  };
  // A call's key and the variant that serves it (the declared one where a specialised variant
  // could not be compiled, e.g. on a machine that runs from bundles only).
  struct Route {
    uint64_t key = 0;
    Variant* variant = nullptr;
  };

  lang::Kernel kernel;
  lang::Meta meta;
  jit::CompileOptions opts;
  int device = 0;

  std::mutex mutex;
  std::optional<ir::Function> fn;            // the signature as declared
  std::optional<runtime::LaunchPlan> plan;  // its checks (a call's arguments are checked against it first)
  std::map<uint64_t, std::unique_ptr<Variant>> variants;
  std::map<uint64_t, Route> routes;
  std::atomic<const ir::Function*> signature{nullptr};
  std::atomic<const jit::CompiledKernel*> compiled_ptr{nullptr};  // the declared variant's
  std::atomic<const runtime::GpuKernel*> ready{nullptr};          // the declared variant's
  std::atomic<const Route*> last{nullptr};                        // the latest launch's (loaded)

  State(const lang::Kernel& k, lang::Meta m, jit::CompileOptions o, int d)
      : kernel(k), meta(std::move(m)), opts(std::move(o)), device(d) {
    // TILEJIT_SPECIALIZE=0: every Function runs its kernel as declared (to compare, or to rule the
    // specialisation out while debugging)
    if (const char* e = std::getenv("TILEJIT_SPECIALIZE"); e && std::string_view(e) == "0") opts.specialize = false;
  }

  // The *_locked functions need `mutex` held.
  const ir::Function& signature_locked() {
    if (!fn) {
      fn.emplace(kernel.build(meta));
      plan.emplace(*fn, device);
      signature.store(&*fn, std::memory_order_release);
    }
    return *fn;
  }
  Variant& variant_locked(uint64_t key) {
    std::unique_ptr<Variant>& v = variants[key];
    if (!v) {
      v = std::make_unique<Variant>();
      v->key = key;
      v->fn = key ? runtime::specialize(signature_locked(), key) : signature_locked();
    }
    return *v;
  }
  const jit::CompiledKernel& compiled_locked(Variant& v) {
    if (!v.compiled) {
      jit::CompiledKernel k = runtime::compile_cached(v.fn, opts);
      v.plan.emplace(v.fn, device);
      v.plan->require_tma(k.tensor_maps);
      if (!v.key) plan->require_tma(k.tensor_maps);
      v.compiled.emplace(std::move(k));
      if (!v.key) compiled_ptr.store(&*v.compiled, std::memory_order_release);
    }
    return *v.compiled;
  }
  const runtime::GpuKernel& kernel_locked(Variant& v) {
    if (!v.gpu) {
      const jit::CompiledKernel& k = compiled_locked(v);
      v.gpu = std::make_unique<runtime::GpuKernel>(v.fn, k, device);
      if (!v.key) ready.store(v.gpu.get(), std::memory_order_release);
    }
    return *v.gpu;
  }

  // The slow path: the arguments are checked against the declared signature before anything is
  // compiled or a GPU is touched, so a bad call costs no compile; then the call's variant.
  const runtime::GpuKernel& route(runtime::Grid grid, std::span<const runtime::DeviceArg> args) {
    std::lock_guard lock(mutex);
    const ir::Function& f = signature_locked();
    plan->check(grid, args);
    const uint64_t key = opts.specialize ? runtime::specialization_key(f, args) : 0;
    Route& r = routes[key];
    if (!r.variant) {
      r.key = key;
      try {
        Variant& v = variant_locked(key);
        kernel_locked(v);
        r.variant = &v;
      } catch (const std::exception& e) {
        if (!key) throw;
        // (the declared variant still runs these arguments: a missing compiler, say, must not fail a
        // call that a bundle serves)
        fmt::print(stderr, "tilejit: warning: kernel '{}': the variant for {} did not compile ({}); running the declared one\n",
                   f.name, runtime::describe_specialization(f, key), e.what());
        Variant& v = variant_locked(0);
        kernel_locked(v);
        r.variant = &v;
      }
    }
    last.store(&r, std::memory_order_release);
    return *r.variant->gpu;
  }
};

Function::Function(const lang::Kernel& k, lang::Meta meta, jit::CompileOptions opts, int device)
    : s_(std::make_unique<State>(k, std::move(meta), std::move(opts), device)) {}
Function::Function(Function&&) noexcept = default;
Function& Function::operator=(Function&&) noexcept = default;
Function::~Function() = default;

void Function::launch(runtime::Grid grid, CUstream stream, std::span<const runtime::DeviceArg> args) {
  const ir::Function* f = s_->signature.load(std::memory_order_acquire);
  const State::Route* r = s_->last.load(std::memory_order_acquire);
  if (f && r) [[likely]] {
    const uint64_t key = s_->opts.specialize ? runtime::specialization_key(*f, args) : 0;
    if (key == r->key) [[likely]]
      return r->variant->gpu->launch(grid, args, stream);
  }
  s_->route(grid, args).launch(grid, args, stream);
}

void Function::check(runtime::Grid grid, std::span<const runtime::DeviceArg> args) const {
  std::lock_guard lock(s_->mutex);
  s_->signature_locked();
  s_->plan->check(grid, args);
}

const jit::CompiledKernel& Function::compiled() {
  if (const jit::CompiledKernel* k = s_->compiled_ptr.load(std::memory_order_acquire)) return *k;
  std::lock_guard lock(s_->mutex);
  return s_->compiled_locked(s_->variant_locked(0));
}

const ir::Function& Function::signature() const {
  if (const ir::Function* f = s_->signature.load(std::memory_order_acquire)) return *f;
  std::lock_guard lock(s_->mutex);
  return s_->signature_locked();
}

const runtime::GpuKernel& Function::gpu_kernel() {
  if (const runtime::GpuKernel* k = s_->ready.load(std::memory_order_acquire)) return *k;
  std::lock_guard lock(s_->mutex);
  return s_->kernel_locked(s_->variant_locked(0));
}

bool Function::loaded() const { return s_->last.load(std::memory_order_acquire) != nullptr || s_->ready.load(std::memory_order_acquire) != nullptr; }

uint64_t Function::specialization(std::span<const runtime::DeviceArg> args) const {
  if (!s_->opts.specialize) return 0;
  return runtime::specialization_key(signature(), args);
}

const jit::CompiledKernel& Function::compiled(std::span<const runtime::DeviceArg> args) {
  const uint64_t key = specialization(args);
  std::lock_guard lock(s_->mutex);
  return s_->compiled_locked(s_->variant_locked(key));
}
const std::string& Function::name() const { return s_->kernel.name(); }
const lang::Meta& Function::meta() const { return s_->meta; }
const jit::CompileOptions& Function::options() const { return s_->opts; }

Function compile(const lang::Kernel& k, lang::Meta meta, jit::CompileOptions opts, int device) {
  return Function(k, std::move(meta), std::move(opts), device);
}

}  // namespace tilejit
