// Function: lazy IR build, checked first call, compile through the cache, then a lock-free path.
#include "runtime/function.hpp"

#include <atomic>
#include <mutex>
#include <optional>

#include "runtime/compile_cache.hpp"

namespace tilejit {

// Everything a Function holds, behind one pointer so that Function stays movable (the mutex and
// atomics are not). Members are written once, under `mutex`, and published through the atomics;
// the hot path reads only `ready` and then the immutable GpuKernel.
struct Function::State {
  lang::Kernel kernel;
  lang::Meta meta;
  jit::CompileOptions opts;
  int device = 0;

  std::mutex mutex;
  std::optional<ir::Function> fn;
  std::optional<runtime::LaunchPlan> plan;  // the checks before compiling (with TMA's once compiled)
  std::optional<jit::CompiledKernel> compiled;
  std::unique_ptr<runtime::GpuKernel> gpu;
  std::atomic<const ir::Function*> signature{nullptr};
  std::atomic<const jit::CompiledKernel*> compiled_ptr{nullptr};
  std::atomic<const runtime::GpuKernel*> ready{nullptr};

  State(const lang::Kernel& k, lang::Meta m, jit::CompileOptions o, int d)
      : kernel(k), meta(std::move(m)), opts(std::move(o)), device(d) {}

  // The *_locked functions need `mutex` held.
  const ir::Function& signature_locked() {
    if (!fn) {
      fn.emplace(kernel.build(meta));
      plan.emplace(*fn, device);
      signature.store(&*fn, std::memory_order_release);
    }
    return *fn;
  }
  const jit::CompiledKernel& compiled_locked() {
    if (!compiled) {
      const ir::Function& f = signature_locked();
      jit::CompiledKernel k = runtime::compile_cached(f, opts);
      plan->require_tma(k.tensor_maps);
      compiled.emplace(std::move(k));
      compiled_ptr.store(&*compiled, std::memory_order_release);
    }
    return *compiled;
  }
  const runtime::GpuKernel& kernel_locked() {
    if (!gpu) {
      const jit::CompiledKernel& k = compiled_locked();
      gpu = std::make_unique<runtime::GpuKernel>(*fn, k, device);
      ready.store(gpu.get(), std::memory_order_release);
    }
    return *gpu;
  }

  // The slow path of the first call(s): the arguments are checked against the signature before
  // anything is compiled or a GPU is touched, so a bad first call costs no compile.
  const runtime::GpuKernel& first_call(runtime::Grid grid, std::span<const runtime::DeviceArg> args) {
    std::lock_guard lock(mutex);
    if (gpu) return *gpu;
    signature_locked();
    plan->check(grid, args);
    return kernel_locked();
  }
};

Function::Function(const lang::Kernel& k, lang::Meta meta, jit::CompileOptions opts, int device)
    : s_(std::make_unique<State>(k, std::move(meta), std::move(opts), device)) {}
Function::Function(Function&&) noexcept = default;
Function& Function::operator=(Function&&) noexcept = default;
Function::~Function() = default;

void Function::launch(runtime::Grid grid, CUstream stream, std::span<const runtime::DeviceArg> args) {
  const runtime::GpuKernel* k = s_->ready.load(std::memory_order_acquire);
  if (!k) [[unlikely]]
    k = &s_->first_call(grid, args);
  k->launch(grid, args, stream);
}

void Function::check(runtime::Grid grid, std::span<const runtime::DeviceArg> args) const {
  if (const runtime::GpuKernel* k = s_->ready.load(std::memory_order_acquire)) return k->check(grid, args);
  std::lock_guard lock(s_->mutex);
  s_->signature_locked();
  s_->plan->check(grid, args);
}

const jit::CompiledKernel& Function::compiled() {
  if (const jit::CompiledKernel* k = s_->compiled_ptr.load(std::memory_order_acquire)) return *k;
  std::lock_guard lock(s_->mutex);
  return s_->compiled_locked();
}

const ir::Function& Function::signature() const {
  if (const ir::Function* f = s_->signature.load(std::memory_order_acquire)) return *f;
  std::lock_guard lock(s_->mutex);
  return s_->signature_locked();
}

const runtime::GpuKernel& Function::gpu_kernel() {
  if (const runtime::GpuKernel* k = s_->ready.load(std::memory_order_acquire)) return *k;
  std::lock_guard lock(s_->mutex);
  return s_->kernel_locked();
}

bool Function::loaded() const { return s_->ready.load(std::memory_order_acquire) != nullptr; }
const std::string& Function::name() const { return s_->kernel.name(); }
const lang::Meta& Function::meta() const { return s_->meta; }
const jit::CompileOptions& Function::options() const { return s_->opts; }

Function compile(const lang::Kernel& k, lang::Meta meta, jit::CompileOptions opts, int device) {
  return Function(k, std::move(meta), std::move(opts), device);
}

}  // namespace tilejit
