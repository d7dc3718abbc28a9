// Memory operations of the DSL: loads and stores through pointer tiles (with masks and a padding
// value), block loads/stores of a window of a strided tensor, and atomics.
#pragma once
#include <source_location>

#include "dsl/builder.hpp"
#include "dsl/ir/atomic.hpp"

namespace tilejit::lang {

// Elementwise through pointer tiles; ptr, mask and other broadcast together (numpy rules).
Tile load(const Operand& ptr, std::source_location loc = std::source_location::current());
Tile load(const Operand& ptr, const Operand& mask, std::source_location loc = std::source_location::current());
Tile load(const Operand& ptr, const Operand& mask, const Operand& other,
          std::source_location loc = std::source_location::current());
// The value must already have the pointee dtype (numbers adapt); masked-off elements are not written.
void store(const Operand& ptr, const Operand& value, std::source_location loc = std::source_location::current());
void store(const Operand& ptr, const Operand& value, const Operand& mask,
           std::source_location loc = std::source_location::current());
// Returns the previous values. Supported: f32 f64 f16 bf16 i32 u32 i64 u64.
Tile atomic_add(const Operand& ptr, const Operand& value, std::source_location loc = std::source_location::current());
Tile atomic_add(const Operand& ptr, const Operand& value, const Operand& mask,
                std::source_location loc = std::source_location::current());

// Read-modify-write atomics through pointer tiles, element by element (ptr, values and mask
// broadcast together); each returns the previous values (masked-off elements are not updated and
// return 0). Order and scope as in PTX and Triton (default acq_rel at GPU scope): sem relaxed,
// acquire (later accesses stay after it), release (earlier ones stay before it) or acq_rel;
// scope cta (this program), gpu or sys (the host and other GPUs too). Types: add, max, min and
// xchg take i32 u32 i64 u64 f32 f64 (float max / min ignore a NaN operand, as fmaxf does: on the
// GPU a compare-and-swap loop); and, or, xor and atomic_cas take i32 u32 i64 u64. The elements of
// one call are independent atomics: two elements at one address both apply, in some order.
// e.g. a try-lock: if_(atomic_cas(lock, 0, 1, {.sem = acquire}) == 0, [&] { ...;
// atomic_xchg(lock, 0, {.sem = release}); }) (the DSL has no data-dependent loop to spin in; to wait
// for other programs use wait_ge / signal_add); an amax: atomic_max(amax_ptr, max(abs(x), 0)).
using ir::MemScope;
using ir::MemSem;
struct AtomicOptions {
  MemSem sem = MemSem::acq_rel;
  MemScope scope = MemScope::gpu;
};
Tile atomic_add(const Operand& ptr, const Operand& value, AtomicOptions o,
                std::source_location loc = std::source_location::current());
Tile atomic_add(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o,
                std::source_location loc = std::source_location::current());
Tile atomic_max(const Operand& ptr, const Operand& value, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_max(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_min(const Operand& ptr, const Operand& value, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_min(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_and(const Operand& ptr, const Operand& value, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_and(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_or(const Operand& ptr, const Operand& value, AtomicOptions o = {},
               std::source_location loc = std::source_location::current());
Tile atomic_or(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o = {},
               std::source_location loc = std::source_location::current());
Tile atomic_xor(const Operand& ptr, const Operand& value, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_xor(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_xchg(const Operand& ptr, const Operand& value, AtomicOptions o = {},
                 std::source_location loc = std::source_location::current());
Tile atomic_xchg(const Operand& ptr, const Operand& value, const Operand& mask, AtomicOptions o = {},
                 std::source_location loc = std::source_location::current());
// *ptr = value where *ptr == compare (bit for bit); returns the previous values.
Tile atomic_cas(const Operand& ptr, const Operand& compare, const Operand& value, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());
Tile atomic_cas(const Operand& ptr, const Operand& compare, const Operand& value, const Operand& mask, AtomicOptions o = {},
                std::source_location loc = std::source_location::current());

// Ordering between programs through i32 semaphores in global memory (e.g. a fixed order in which
// programs accumulate into one output tile: deterministic reductions). Every thread of the program
// takes part; call them where every thread reaches them (not under a divergent branch).
// wait_at_least: until *semaphore >= target; the program's later reads see every write that the
// signals which raised it released (acquire, GPU scope). Programs that wait on each other must all
// be resident at once on the GPU (e.g. a persistent grid no larger than the SM count); the
// interpreter runs such kernels' programs concurrently and reports a deadlock as an error.
void wait_at_least(const Operand& semaphore, const Operand& target, std::source_location loc = std::source_location::current());
// signal_add: once the program's earlier writes are done, *semaphore += value, once per program
// (release, GPU scope).
void signal_add(const Operand& semaphore, const Operand& value, std::source_location loc = std::source_location::current());

// Instrumentation: lane 0 of every warp that runs this stores the multiprocessor's cycle counter
// (%clock64) at slot + (the warp's index in the program), `slot` a scalar pointer to u64 -- e.g. a
// u64 buffer [programs, stamps, 32] and slot = buf + (program * stamps + stamp) * 32, to see when
// each warp reached each point. Cycles of one multiprocessor compare only with each other. The
// interpreter stores nothing; the host emulator a count of the stamps taken (monotonic).
void timestamp(const Operand& slot, std::source_location loc = std::source_location::current());

// A window of a tensor (Tensor::block); elements outside the tensor read as `padding`.
Tile load(const BlockRef& block, double padding = 0.0, std::source_location loc = std::source_location::current());
void store(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
// tma: on sm_90a, where the window allows (a 16-byte aligned tensor with unit innermost stride, rows
// a multiple of 8 up to 256, 128-byte column chunks), the tile goes through a shared-memory staging
// tile and one TMA bulk store per chunk, so its global writes leave the SMs asynchronously (the
// next work overlaps them); elsewhere the same values by ordinary stores.
struct StoreOptions {
  bool tma = false;
  // With tma: the staging's shared-memory offsets computed at the store, from the thread's
  // coordinates passed opaquely, so that the compiler cannot hoist them out of the loops around
  // it, where they would hold registers through every loop (an epilogue after a long loop).
  bool offsets_at_store = false;
};
void store(const BlockRef& block, const Operand& value, StoreOptions opts,
           std::source_location loc = std::source_location::current());
// block[...] += value, element by element and atomically (elements outside the tensor are
// skipped); no previous values are returned. Several programs may add into one window at once (e.g.
// dQ's parts in an attention backward). On Hopper an f32 window whose rows run along the tensor's
// contiguous dim is staged in shared memory and added by TMA (cp.reduce.async.bulk.tensor: whole
// 128-byte lines in L2 instead of one atomic per element); otherwise one red.global.add per element.
void atomic_add(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
// The same add, made once *semaphore >= target (acquire, GPU scope): wait_at_least + atomic_add
// in one op, for adds in a fixed order (signal_add afterwards releases the next one). On the TMA
// path only the thread that issues the add waits, so the program does not stop at a barrier for it.
void atomic_add(const BlockRef& block, const Operand& value, const Operand& semaphore, const Operand& target,
                std::source_location loc = std::source_location::current());
// The same ordered add, and once its writes are complete, *signal += 1 (release, GPU scope): one op
// for "wait for my turn, add, pass the turn on", which a ring producer's reduce writer can run
// entirely off the consumers' path (it signals each add one add later, when it is long complete).
void atomic_add(const BlockRef& block, const Operand& value, const Operand& semaphore, const Operand& target, const Operand& signal,
                std::source_location loc = std::source_location::current());
// Options of a block add on the TMA path.
struct AddOptions {
  // Stage the tile in chunks of 32-byte rows without swizzle (8 f32 columns a chunk, one TMA add
  // each) instead of 128-byte swizzled rows: an MMA accumulator's fragment (a warp's 64-bit stores
  // cover 8 rows x 32 bytes) then fills each half-warp's 128 bytes without bank conflicts; in the
  // swizzled rows, rows r and r ^ 1 of a half-warp share their two 16-byte units (2-way) [100].
  bool narrow_staging = false;
};
void atomic_add(const BlockRef& block, const Operand& value, AddOptions opts, std::source_location loc = std::source_location::current());
void atomic_add(const BlockRef& block, const Operand& value, const Operand& semaphore, const Operand& target, const Operand& signal,
                AddOptions opts, std::source_location loc = std::source_location::current());
// block[...] = max / min / and / or / xor (block[...], value), element by element and atomically
// (relaxed, GPU scope; elements outside the tensor are skipped; no previous values returned): one
// atom.global per element (an amax or a bitmask over a window). max and min take i32 u32 i64 u64
// f32 f64 (float max / min ignore a NaN operand, as for pointers), the bitwise ones the integers.
void atomic_max(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
void atomic_min(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
void atomic_and(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
void atomic_or(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
void atomic_xor(const BlockRef& block, const Operand& value, std::source_location loc = std::source_location::current());
// load(block), with leave for the GPU backend to read the window again at each use, directly in
// the register layout that use needs (when nothing was stored in between), instead of loading it
// once and exchanging it through shared memory. Same values everywhere; meant for small read-only
// data consumed in an MMA layout (e.g. dropout mask words next to an attention score block). On
// sm_90a a 1-D window directly in a loop whose other windows ride a TMA ring (or any such loop),
// read only inside that loop, is copied by TMA into the ring's stages and read from shared memory
// at each use instead (jit/wgmma_plan.hpp, SmemTile::vector; zero padding, 16-byte aligned tensor).
Tile load_at_use(const BlockRef& block, double padding = 0.0, std::source_location loc = std::source_location::current());

}  // namespace tilejit::lang
