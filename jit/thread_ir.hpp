// The per-thread IR: what one GPU thread executes, in scalar SSA form with structured loops and
// ifs. Lowering (tile IR + layouts) produces it; the LLVM and CUDA C++ printers consume it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir/atomic.hpp"
#include "dsl/ir/dtype.hpp"

namespace tilejit::jit::pir {

using ir::DType;
using V = uint32_t;  // a value id

// A scalar of `dtype`, or a global pointer to `dtype` elements (64-bit).
struct Ty {
  DType dtype = DType::i32;
  bool ptr = false;
  bool operator==(const Ty&) const = default;
};
inline Ty scalar(DType d) { return {d, false}; }
inline Ty pointer(DType d) { return {d, true}; }

enum class Op : uint8_t {
  constant,      // imm (ints, bit pattern) or fimm (floats) -> ty
  param,         // imm = parameter slot -> ty
  thread_id,     // threadIdx.x (i32)
  block_id,      // imm = axis -> blockIdx (i32)
  grid_dim,      // imm = axis -> gridDim (i32)
  // arithmetic: operands and result share the type; signedness comes from the dtype
  add, sub, mul, div, rem, minimum, maximum, bit_and, bit_or, bit_xor, shl, shr, umulhi,
  byte_perm,  // (a, b, selector) u32/i32: prmt.b32 (the tile IR's byte_perm)
  fma,        // (a, b, c) f32/f64: a * b + c, one rounding
  neg, bit_not, abs,
  popc,  // u32 -> u32: the number of set bits (popc.b32)
  exp2, log2, exp, log, sqrt, rsqrt, rcp, floor, ceil, tanh, sin, cos, erf,
  cmp,     // imm = predicate (Pred) -> i1
  select,  // (i1, a, b)
  cast,    // value conversion to ty (same rules as the tile IR's cast)
  bitcast, // same width reinterpretation
  // (x...) -> the same values, which the backend may not compute later than here: an empty
  // volatile asm with each register tied in/out (the tile IR's precompute). Registers of types
  // asm cannot name (i1) pass through untied. imm kOpaqueCopy: a volatile asm mov per register
  // instead, its result a register of its own (not tied).
  opaque,
  // (x...) -> nothing: a use of each register at this point that the assembler cannot remove (a
  // store predicated on an SM id >= 2^31, which never holds but ptxas cannot know). Lowered at the
  // end of a loop body for the A registers of a wgmma in it that come from outside the loop:
  // ptxas (CUDA 13.0) treats a register read only by wgmma as dead after the loop's last wgmma
  // that reads it and reuses it in the same iteration, so the next iteration's wgmma read other
  // values (tests/test_function_gpu.cpp, "A from registers"); a later use keeps it live.
  keep_alive,
  pack2,   // (lo, hi) 16-bit values -> u32 (for mma operands and vector accesses)
  unpack2, // (u32) -> lo, hi as the results' 16-bit dtype
  load_vec,   // (ptr) imm = words (1, 2, 4) -> that many u32: one aligned, in-bounds global load
  store_vec,  // (ptr, u32 words...): one aligned, in-bounds global store
  gep,     // (ptr, i64 element offset) -> ptr
  load,    // (ptr[, pred, other]) -> ty          global memory
  store,   // (ptr, value[, pred])
  atomic_add,  // (ptr, value[, pred]) -> old
  // (ptr, value[, pred]) imm = atomic_imm(rmw, sem, scope) -> old
  atomic_rmw,
  // (ptr, compare, value[, pred]) imm = atomic_imm(add, sem, scope) -> old
  atomic_cas,
  sem_wait,    // (ptr i32, target i32): spin until ld.acquire.gpu [ptr] >= target
  sem_signal,  // (ptr i32, value i32): fence.acq_rel.gpu; red.release.gpu.add [ptr], value
  load_shared,   // (i32 byte offset) -> ty
  store_shared,  // (i32 byte offset, value[, pred])
  barrier,       // bar.sync 0
  // (i32 barrier id 1..15), imm = threads taking part: wait until that many arrived (bar.sync id, n),
  // or arrive without waiting (bar.arrive id, n); e.g. warpgroups handing each other a turn
  named_barrier_sync,
  named_barrier_arrive,
  // imm = n > 0: setmaxnreg.inc.sync.aligned.u32 n; imm = -n: setmaxnreg.dec (sm_90a; every warp of
  // the warpgroup executes it; the kernel needs a register cap at entry: Func::min_programs_per_sm)
  set_max_registers,
  // the thread ends here (PTX exit): a warp role under setmaxnreg must not reach the kernel's end
  // through the blocks of a role with another register count, or ptxas allocates every role's
  // code for the count at entry (C7512: serialised wgmma)
  exit_thread,
  shfl_xor,      // (value, imm = lane mask) -> value
  ballot,        // (i1) -> u32: bit l set where lane l's operand is true (vote.sync.ballot.b32, all 32 lanes)
  mma_16816,     // (a0..a3 u32, b0..b1 u32, c0..c3 f32), imm = operand dtype (DType) -> 4 x f32
  // (f32) -> u32: the TF32 bit pattern of PTX cvt.rna.tf32.f32 (ir::tf32_rna_bits), low 13 bits zero
  cvt_tf32,
  // mma.sync m16n8k8 .tf32: (a0..a3 u32, b0..b1 u32 -- TF32 bit patterns, one element each --,
  // c0..c3 f32) -> 4 x f32; fragments as Layout::mma_a_tf32 / mma_b_tf32, C as mma_16816's
  mma_1688_tf32,
  // Hopper: asynchronous copies, transaction barriers and warpgroup MMA (sm_90a)
  smem_addr,          // (i32 byte offset) -> u32 address in the shared window
  mbar_init,          // (addr, i32 count)
  mbar_expect_tx,     // (addr, i32 bytes): arrive and expect that many bytes of async copies
  mbar_arrive,        // (addr)
  mbar_wait,          // (addr, i32 parity): until the phase with this parity has completed
  mbar_inval,         // (addr): before the barrier's memory is initialised again
  // (u32 shared address, u32 value) -> u32 old: atom.acq_rel.cta.shared::cta; imm kAtomSharedAdd,
  // kAtomSharedExch, or kAtomSharedCount: a relaxed add (counters no other access orders against)
  atom_shared,
  tma_load_2d,        // (dst addr, tensor-map pointer, i32 c0 (innermost), i32 c1, mbar addr)
  fence_mbar_init,    // make barrier initialisation visible to the async proxy
  fence_proxy_async,  // order generic-proxy shared writes before async-proxy reads
  wgmma_fence,
  wgmma_commit,
  // (acc f32...) imm = groups left in flight (| kWaitFenced) -> acc, readable afterwards
  wgmma_wait,
  // (desc a u64, desc b u64, acc f32 x n/2) imm = n | dtype << 16 | trans_b << 24 | overwrite << 25 | trans_a << 26
  // -> n/2 f32; overwrite: D = A*B (scale-d = 0), the accumulator inputs are ignored
  wgmma,
  // A from registers: (a0..a3 u32 (8 packed 16-bit values of the m64k16 A fragment), desc b u64,
  // acc f32 x n/2), imm as wgmma -> n/2 f32
  wgmma_rs,
  // (dst addr, tensor-map pointer, i32 coordinates innermost first x imm, mbar addr), imm = rank 1..5
  tma_load,
  // (src addr, tensor-map pointer, i32 coordinates innermost first x imm), imm = rank 1..5: global
  // box += shared tile (f32 add in L2; cp.reduce.async.bulk.tensor, bulk async-group completion)
  tma_reduce_add,
  // (src addr, tensor-map pointer, i32 coordinates innermost first x imm), imm = rank 1..5: global
  // box = shared tile (cp.async.bulk.tensor store; out-of-bounds elements are not written; bulk
  // async-group completion)
  tma_store,
  bulk_commit,  // cp.async.bulk.commit_group: the bulk operations issued since form a group
  // cp.async.bulk.wait_group: imm = groups left pending | kBulkWaitRead (only until their shared
  // memory has been read, not until their global writes are done)
  bulk_wait,
  fence_proxy_async_global,  // order the async proxy's global writes with the generic proxy's accesses
  read_clock,  // -> u64: the multiprocessor's cycle counter (%clock64), read where it stands (volatile)
  for_,    // (lb, ub, step, init...) region(iv, carried...) -> results
  if_,     // (cond) regions then/else -> results
  yield,
};

enum class Pred : uint8_t { eq, ne, lt, le, gt, ge };

// wgmma_wait imm flag: the wait stays where the lowering put it. ptxas otherwise moves independent
// arithmetic across a wait, e.g. hoists it above a softmax that was meant to run while the MMA
// is in flight; the backends then end a basic block at the wait.
constexpr int64_t kWaitFenced = int64_t{1} << 8;
// wgmma_commit imm flag: no code moves above the commit (into the group's wgmma sequence): set when
// work is meant to run after the group's issue (precompute), which ptxas would otherwise hoist
// between the wgmma instructions and so delay the MMAs.
constexpr int64_t kCommitFenced = int64_t{1} << 8;

constexpr int64_t kBulkWaitRead = int64_t{1} << 8;

// atom_shared's imm
constexpr int64_t kAtomSharedAdd = 0, kAtomSharedExch = 1, kAtomSharedCount = 2;

// named_barrier_sync/arrive imm flag (above the thread count): a plain bar.sync, without the
// fence that keeps ptxas from moving arithmetic across a warpgroup turn -- a warp role's barrier
// of its own threads, which needs no more than bar.sync 0 does.
constexpr int64_t kBarrierUnfenced = int64_t{1} << 16;

// opaque imm flag: each value copied by its own volatile asm mov (out and in not tied), so that
// LLVM keeps the copy at that point: a loop-carried MMA result's copy into the carried register
// stays after the wait that completes it (tied, LLVM may place it before the wait, where ptxas
// sees a read of an in-flight accumulator and serialises the wgmmas: C7514).
constexpr int64_t kOpaqueCopy = 1;

struct Block;

struct Inst {
  Op op{};
  std::vector<V> args;
  std::vector<V> results;
  int64_t imm = 0;
  double fimm = 0;
  std::vector<Block> regions;
};

struct Block {
  std::vector<V> args;
  std::vector<Inst> insts;
};

struct Param {
  std::string name;
  Ty ty;
  // > 0: a blob of this many bytes passed by value (a TMA tensor map: `.param .align 64 .b8
  // name[128]`, __grid_constant__); the kernel sees a generic pointer to it (ty, a u8 pointer).
  int byval_bytes = 0;
};

// A TMA tensor map the launcher encodes from a tensor argument and passes by value (a 128-byte
// kernel parameter, so a captured CUDA graph carries it) as the trailing ABI parameter `abi_slot`:
// box sizes innermost first, 128-byte swizzle.
inline constexpr int kTensorMapBytes = 128;  // sizeof(CUtensorMap)
struct TensorMapSpec {
  int abi_slot = 0;
  int param_index = 0;  // the tile-IR parameter (a rank-2 tensor, unit innermost stride)
  std::vector<int64_t> box;
  int swizzle_bytes = 128;
};

struct Func {
  std::string name;
  std::vector<Param> params;  // the flattened kernel ABI, in order
  int num_threads = 128;
  int min_programs_per_sm = 0;  // > 0: a launch bound for ptxas (CompileOptions::min_programs_per_sm)
  int64_t smem_bytes = 0;  // dynamic shared memory
  std::vector<TensorMapSpec> tensor_maps;
  std::vector<Ty> types;   // per value
  Block body;

  V new_value(Ty t) {
    types.push_back(t);
    return static_cast<V>(types.size() - 1);
  }
};

std::string op_name(Op op);
std::string type_name(Ty t);
std::string print(const Func& f);  // text form for --dump-after=lower

// The imm of atomic_rmw / atomic_cas: what it computes, its order and its scope.
struct AtomicImm {
  ir::AtomicRmw rmw = ir::AtomicRmw::add;
  ir::MemSem sem = ir::MemSem::relaxed;
  ir::MemScope scope = ir::MemScope::gpu;
  int64_t encode() const { return static_cast<int64_t>(rmw) | static_cast<int64_t>(sem) << 4 | static_cast<int64_t>(scope) << 8; }
  static AtomicImm decode(int64_t imm) {
    return {static_cast<ir::AtomicRmw>(imm & 15), static_cast<ir::MemSem>(imm >> 4 & 15), static_cast<ir::MemScope>(imm >> 8 & 15)};
  }
};

}  // namespace tilejit::jit::pir
