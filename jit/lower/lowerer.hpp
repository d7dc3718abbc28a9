// The Lowerer: one object that lowers a tile IR function to the per-thread IR (jit/lower.hpp).
// Its members are grouped by concern, each group defined in the jit/lower/*.cpp file named at its
// section comment; this header is shared by those files only (internal to jit/).
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <tuple>
#include <vector>

#include "dsl/ir/address_sources.hpp"
#include "jit/lower.hpp"
#include "jit/axis_info.hpp"
#include "jit/scalar_facts.hpp"

namespace tilejit::jit::lower {

using ir::DType;
using ir::OpKind;
using pir::Op;
using pir::V;
using Regs = std::vector<V>;

// The dtype a value crosses lanes or shared memory in: 32 or 64 bits (shuffles move no less).
DType exchange_dtype(DType d);

struct TensorDesc {
  V ptr;
  std::vector<V> sizes, strides;  // i32, i64
  ir::ParamSpec spec;             // what the parameter promises, as it holds for this view
};

// Scoped caches: what was materialised inside a loop or if body is not visible after it.
struct Frame {
  bool loop_body = false;  // a for loop's body: conversions of values from outside move before the loop
  // (loop bodies) the body, and the wgmma A registers that are the same in every iteration, kept
  // alive at the body's end (pir::Op::keep_alive says why)
  const ir::Block* body = nullptr;
  std::vector<V> keep_alive;
  // a warp role's region: tiles and thread coordinates of the frames outside are another warp
  // numbering's (lookups stop here); scalars are shared
  bool role = false;
  std::map<std::pair<ir::ValueId, std::string>, Regs> tiles;
  std::unordered_map<ir::ValueId, V> scalars;
  std::map<std::string, std::vector<V>> thread_coords;
};

class Lowerer {
 public:
  // `precomputed`: for each flexible precompute result, the layout its first use asked for on an
  // earlier run of the lowering (empty on the first run; see lower_to_threads).
  Lowerer(const ir::Function& f, const LayoutPlan& plan, std::map<ir::ValueId, Layout> precomputed = {})
      : f_(f), plan_(plan), facts_(f), axis_(f, facts_), precomputed_(std::move(precomputed)), sources_(ir::address_sources(f)) {}
  // The layouts the uses of flexible precompute results asked for (first request of each).
  const std::map<ir::ValueId, Layout>& precompute_requests() const { return precompute_requests_; }

  // The function's per-thread IR (lower/lower.cpp); one run per Lowerer.
  pir::Func run();

 private:
  // ---------------------------------------------------------------- emission helpers (lower/emit.cpp)
  // The pir block being emitted into; each gets a fresh id (straight-line facts are keyed by it).
  void push_block(pir::Block* b);
  void pop_block();
  [[noreturn]] void fail(const ir::Op* op, const std::string& msg) const;

  V emit(Op op, pir::Ty ty, std::vector<V> args, int64_t imm = 0, double fimm = 0);
  void emit0(Op op, std::vector<V> args, int64_t imm = 0);
  pir::Ty ty_of(ir::DType d) const { return pir::scalar(d); }
  pir::Ty value_ty(const ir::Type& t) const { return t.is_pointer() ? pir::pointer(t.dtype) : pir::scalar(t.dtype); }

  V cint(DType d, int64_t v);
  V ci32(int64_t v) { return cint(DType::i32, v); }
  V cfloat(DType d, double v) { return emit(Op::constant, pir::scalar(d), {}, 0, v); }
  V bin(Op op, V a, V b) { return emit(op, out_.types[a], {a, b}); }
  V cmp(pir::Pred p, V a, V b) { return emit(Op::cmp, pir::scalar(DType::i1), {a, b}, static_cast<int64_t>(p)); }
  V cast(V v, DType to);
  V land(V a, V b) { return bin(Op::bit_and, a, b); }
  V lnot(V a) { return bin(Op::bit_xor, a, emit(Op::constant, pir::scalar(DType::i1), {}, 1)); }  // (i1)

  V constant_value(DType d, const ir::Attr& a);

  // Scratch exchanges (load_shared/store_shared offsets) live above the persistent shared-memory
  // tiles, rings and barriers of the Hopper plan.
  V scratch(V offset);
  int64_t reserve_smem(int64_t bytes);

  // ---------------------------------------------------------------- parameters (lower/emit.cpp)
  void params();

  // ---------------------------------------------------------------- values (lower/emit.cpp)
  V scalar(ir::ValueId v);

  // The innermost frame holding `v` in the layout `key`, if any.
  std::optional<size_t> frame_of(ir::ValueId v, const std::string& key) const;
  const Regs* cached(ir::ValueId v, const std::string& key) const;

  void check_shape(const ir::Op* op, const ir::Type& t) const;

  // The registers of tile value `v` in layout `L`.
  Regs get(ir::ValueId v, const Layout& L);

  void put(ir::ValueId v, const Layout& L, Regs regs);

  // Runs `emit_code` as if the lowering stood at frame `level` (an enclosing one): its code goes to
  // the end of that level's block -- before the loop being lowered, whose instruction is appended
  // to that block only once its body is done -- and what it caches to that frame.
  Regs at_level(size_t level, const std::function<Regs()>& emit_code);

  // Per dim, the lane/warp part of each element's coordinate in this thread (i32).
  const std::vector<V>& thread_coords(const Layout& L);
  std::vector<V> thread_coords_of(const Layout& L, V lane, V warp);  // from the given lane and warp, not cached
  // From opaque copies of the lane and warp, not cached: values LLVM cannot hoist out of a loop
  // (offsets at a store 076, A's staging 103, coordinates at use 114)
  std::vector<V> thread_coords_at_use(const Layout& L);

  // Coordinate d of register r in this thread. When the register bits and the lane/warp bits of
  // dim d are disjoint (always, for blocked and mma layouts) XOR is an add, which LLVM folds into
  // address immediates.
  V coord(const Layout& L, uint32_t r, size_t d);
  V coord(const Layout& L, uint32_t r, size_t d, V thread_coord);  // from a given thread_coords(L)[d]

  // Whether register bits and lane/warp bits never overlap within a dim: coordinates then add.
  static bool additive(const Layout& L);

  // Element offset (row-major over the tile) of register r in this thread: one per-thread base
  // plus a compile-time constant per register where the layout is additive, so that the backend
  // folds the constants into address immediates and keeps a single base register live.
  V tile_offset(const Layout& L, uint32_t r);

  // Registers that replicate an earlier register of the same thread (skipped by stores).
  bool duplicate_reg(const Layout& L, uint32_t r) const;

  // i1 true in the one thread of each replica group that owns the element (nullopt: all own).
  std::optional<V> owner(const Layout& L);

  // ---------------------------------------------------------------- layout conversion (lower/layout_conversion.cpp)
  Regs convert(const Regs& regs, const Layout& from, const Layout& to, const ir::Type& t);

  // Storage type of a tile element in shared memory.
  pir::Ty smem_ty(const ir::Type& t) const;
  V to_smem(V v, const ir::Type& t);
  V from_smem(V v, const ir::Type& t);

  Regs through_smem(const Regs& regs, const Layout& from, const Layout& to, const ir::Type& t);
  void gather(const ir::Op& op);  // the source through shared memory, read at the indices

  // ---------------------------------------------------------------- flexible values (lower/layout_conversion.cpp)
  Regs materialize(const ir::Op& op, const Layout& L);

  // ---------------------------------------------------------------- channels between warp roles (lower/warp_roles.cpp)
  // lang::Channel: `stages` slots of the tile (row-major) after the Hopper plan's shared memory,
  // then a full and an empty mbarrier per slot. Full counts the pushing role's threads, empty the
  // popping role's: every thread arrives once it has written (mbarrier.arrive releases its
  // st.shared) or read its part. The pusher waits for the empty phase before the slot's previous
  // use (a fresh barrier passes a wait on the phase before its first), the popper for the full one.
  struct ChannelPlan {
    int64_t slots = 0, bytes = 0, full = 0, empty = 0;
    int stages = 1;
  };

  void channels_init();

  // The slot of `index` (i32) and the parity of its use: slot index % stages, use index / stages.
  std::pair<V, V> channel_slot(const ChannelPlan& c, V index);
  // The mbarrier of `stage` in an array of them 8 bytes apart from `base` (channels, producer rings).
  V stage_barrier(int64_t base, V stage);
  // Byte offset (absolute, not scratch-relative) of register r's element of layout L in the slot.
  V channel_offset(const ChannelPlan& c, V stage, const Layout& L, uint32_t r, DType d);

  void channel_push(const ir::Op& op);

  Regs channel_read(const ir::Op& op, const Layout& L);

  // ---------------------------------------------------------------- warp roles (lower/warp_roles.cpp)
  // lang::warp_roles: an if/else chain on the warp index, one branch per role (setmaxnreg needs
  // each warpgroup's role to be one branch of a single if/else). Inside a branch the thread and
  // warp indices count from the role's first warp, tiles spread over the role's warps, a barrier
  // is the role's named barrier, and exchanges through shared memory use the role's own scratch.
  static constexpr int kRoleBarrier = 3;  // ids 3.. (1 and 2: warpgroup turns; 0: all threads)
  static constexpr int kStoreIssueBarrier = 15;  // a role's TMA store: its warps' staging done (memory.cpp)

  void warp_roles(const ir::Op& op);

  // ---------------------------------------------------------------- warpgroup turns (lower/warp_roles.cpp)
  // FlashAttention-3's ping-pong: named barrier 1 + w is warpgroup w's turn. A turn starts with
  // bar.sync on its own barrier (256 threads: its 128 and the 128 of the other warpgroup's
  // arrive) and ends with bar.arrive on the other's, without waiting for the MMAs issued inside.
  // Warpgroup 1 hands warpgroup 0 the first turn. Both run the same turns (uniform control flow),
  // so the only arrival left at exit is that first one's counterpart, which the hardware discards.
  // With another number of warpgroups the turns are no-ops.
  static constexpr int kTurnBarrier = 1;  // ids 1 and 2; 0 is bar.sync 0 (all threads)
  static constexpr int kWarpgroupThreads = 128;

  void turns_init();
  void turn_begin(const ir::Op& op);
  void turn_end();

  // ---------------------------------------------------------------- elementwise (lower/elementwise.cpp)
  V scalar_op(const ir::Op& op, const std::vector<V>& a);

  Regs elementwise(const ir::Op& op, const Layout& L);
  Regs scale_lazily(const ir::Op& op, const Layout& L, const std::vector<Regs>& in);

  // ---------------------------------------------------------------- program order (lower/lower.cpp)
  // The kernel's body and what must follow it.
  void kernel_body();
  // signal_add (and an ordered add's signal_after): once the program's earlier writes are done,
  // thread 0 adds `value` to the semaphore at `ptr` (release)
  void signal_after_writes(V ptr, V value);
  void block(const ir::Block& b);

  bool all_scalar(const ir::Op& op) const;

  void lower(const ir::Op& op);

  // precompute: the operand's registers now, in its natural layout or (flexible) in the layout its
  // use asked for on the previous run, through an opaque op so that the backend cannot compute them
  // later. A flexible result no use asked for is left to its uses.
  void precompute(const ir::Op& op);

  // ---------------------------------------------------------------- memory (lower/memory.cpp)
  Layout memory_layout(const ir::Type& t) const;

  void load(const ir::Op& op);

  // Combine an optional owner predicate and an optional mask.
  std::optional<V> and_pred(std::optional<V> a, std::optional<V> b);

  void store(const ir::Op& op);

  void pointer_atomic(const ir::Op& op);  // atomic_add, atomic_rmw and atomic_cas on pointers

  // Address and in-bounds predicate of each register of a tensor window.
  void window(const ir::Op& op, size_t first_offset, const Layout& L, Regs& addr, Regs& inb, V* all_ok = nullptr);

  // Largest power of two known to divide a scalar integer (alignment of window offsets).
  int64_t divisor(ir::ValueId v);

  // How many consecutive registers of a window can move as one vector access: they must be
  // consecutive along the tensor's unit-stride innermost dim, aligned as the parameter promises.
  int vector_group(const ir::Op& op, size_t first_offset, const Layout& L, DType d);
  // The registers of L that hold consecutive elements along dim `last` (a power of two, at most
  // max_bytes of es-byte elements), 1 where lane or warp bases split such runs.
  int register_run(const Layout& L, size_t last, int es, int max_bytes);
  // The same as vector_group for a load or store of a `t` tile through a pointer tile (AxisInfo): 1
  // where it cannot vectorise; `uniform` (mask, other) must hold one value per group.
  int pointer_vector_group(ir::ValueId pointers, const ir::Type& t, const Layout& L, const std::vector<ir::ValueId>& uniform);

  // if (cond) then_body() else else_body(), both yielding registers of the given types.
  Regs pir_if_values(V cond, const std::vector<pir::Ty>& types, const std::function<Regs()>& then_body,
                     const std::function<Regs()>& else_body);

  // Registers <-> 32-bit words of one vector group.
  Regs to_words(const Regs& vals, size_t head, int g, DType d);
  Regs from_words(const Regs& words, DType d);

  void block_load(const ir::Op& op);

  // The registers of a block load's window in layout L. Registers that replicate (zero register
  // bases: e.g. a word tile read in the layout of the score block it masks) load once and copy.
  Regs block_load_regs(const ir::Op& op, const Layout& L);

  // atomic_add on a window: by TMA from a staging tile in shared memory (jit/wgmma_plan.hpp,
  // TmaReduce) or one atomic add per element.
  void block_atomic(const ir::Op& op);  // a window atomic: add (TMA reduce or red.add per element), max / min / and / or / xor
  // A block store or add planned for TMA (HopperPlan::reduces) through the staging tile.
  void tma_bulk_write(const ir::Op& op, const TmaReduce& red, const Layout& L, const Regs& val, const std::function<void()>& fallback,
                      bool ordered, V sem, V target);

  void block_store(const ir::Op& op);

  // ---------------------------------------------------------------- global memory between threads (lower/memory_order.cpp)
  // The GPU orders a program's global accesses only per thread: a tile loaded by one warp and
  // stored in place by another (a replicated row vector, a layout change) races. Each tile access
  // is recorded until the next barrier of all threads; an access that may touch an element another
  // thread touched since then, one of the two writing, gets a barrier first (bar.sync orders memory
  // between the threads it joins). Loop bodies are checked against their own next iteration, if
  // branches merged conservatively. Not inside a warpgroup turn (a barrier there deadlocks).
  struct GlobalAccess {
    std::set<size_t> params;       // the parameters it may touch (empty: unknown, so any)
    bool read = false, write = false;  // (an atomic whose old value is used does both)
    std::optional<Layout> layout;  // which thread touches which element; nullopt: not one per element
    // the address operands (pointer tile; tensor, offsets, dims and shape of a window): equal keys
    // and one unreplicated layout touch each element from one thread (empty: never assumed equal)
    std::vector<int64_t> address;
    // written by TMA (a bulk store or add-reduce issued by thread 0): no thread's program order
    // covers it and a barrier alone does not either -- the issuing thread must first wait for the
    // bulk group's writes (cp.async.bulk.wait_group 0) and fence the async proxy
    bool async = false;
    bool add = false;  // an atomic add (element-wise or TMA's reduce): adds commute with each other
    bool operator==(const GlobalAccess&) const = default;
  };
  struct LoopHead {
    std::vector<GlobalAccess> accesses;  // the body's accesses before its first barrier
    bool barrier_seen = false;
  };
  // Records an access through `address` (a pointer tile or tensor) in `layout`, after a barrier
  // when it conflicts with an unordered earlier one.
  enum class Access { read, write, read_write };
  // `add`: an atomic add; `async`: written by TMA (planned in HopperPlan::reduces), not by `layout`.
  void order_global(ir::ValueId address, Access access, std::optional<Layout> layout, std::vector<int64_t> address_key = {},
                    bool add = false, bool async = false);
  // `same_iteration`: both in one pass of the code (a loop's back edge compares this iteration's
  // accesses with the next one's, whose loop-varying addresses differ even when the operands match)
  static bool conflicts(const GlobalAccess& a, const GlobalAccess& b, bool same_iteration = true);
  std::vector<int64_t> window_key(const ir::Op& op, size_t first_offset) const;
  void global_barrier_emitted();  // emit0's hook: every recorded access is ordered now (but TMA's writes)
  // The TMA writes recorded since: thread 0 waits for them and fences, then a barrier hands them on.
  void complete_async_writes();
  void add_unordered(const std::vector<GlobalAccess>& accesses);  // (without duplicates)
  // A loop body's end: a barrier when its last accesses conflict with the next iteration's first.
  void order_loop_back_edge(LoopHead head);

  // ---------------------------------------------------------------- reductions (lower/reductions.cpp)
  V combine(const std::string& kind, V a, V b);

  void reduce(const ir::Op& op);
  // Each of `in` (registers in layout L, dtypes dt) reduced along `axis` by combine_all (on one
  // element of every tile at a time, in any order: it must commute), within threads, by shuffles
  // and through one shared-memory round for all the tiles; the registers of L.drop_dim(axis)
  // without zero registers.
  std::vector<Regs> reduce_along(const std::vector<Regs>& in, const Layout& L, int axis, const std::vector<DType>& dt,
                                 const std::function<std::vector<V>(const std::vector<V>&, const std::vector<V>&)>& combine_all);
  void histogram(const ir::Op& op);  // lower/histogram.cpp: ballots and popcounts, or shared atomics

  // ---------------------------------------------------------------- scans, reduce_with, xor_permute (lower/scans.cpp)
  void combine_along(const ir::Op& op);  // scan, reduce_with
  // reduce_with whose combine commutes element by element: reduce_along on its tiles `x` (in L).
  void reduce_commuting(const ir::Op& op, const Layout& L, const std::vector<Regs>& x, const std::vector<DType>& dt);
  // The op's combine region on one pair of element tuples (a before b along the axis).
  std::vector<V> combine_region(const ir::Op& op, const std::vector<V>& a, const std::vector<V>& b);
  // shfl.xor of a value of dtype d (narrower than 32 bits: widened for the shuffle).
  V shuffle_xor(V x, DType d, int64_t lane_mask);
  // Each register's value in the thread whose lane (or warp) differs in `bit`: [tile][register].
  std::vector<Regs> partner_values(bool across_warps, int bit, const std::vector<Regs>& values, const std::vector<DType>& dt);
  void xor_permute(const ir::Op& op);

  // ---------------------------------------------------------------- dot (lower/dot.cpp)
  void dot(const ir::Op& op);

  // (the two halves of one unpacked word, in order: that word)
  V pack(V lo, V hi);

  // f32 registers -> their TF32 bit patterns (u32, cvt.rna.tf32.f32)
  Regs to_tf32(const Regs& f32_values);

  // mma.sync per batch (jit/dot_plan.hpp), on the plan's fragment layouts.
  void mma(const ir::Op& op, const DotPlan& dp, const Layout& LC);

  // CUDA-core fallback: operands in shared memory, each thread accumulates its outputs over K
  // (tf32: of the rounded inputs).
  void fma_dot(const ir::Op& op, const DotPlan& dp, const Layout& LC);

  // ---------------------------------------------------------------- control flow (lower/control_flow.cpp)
  // Flatten a carried value to registers (scalars: one register).
  Regs carried(ir::ValueId v, const std::optional<Layout>& L);
  Regs fresh(ir::ValueId v, const std::optional<Layout>& L);
  void bind(ir::ValueId v, const std::optional<Layout>& L, const Regs& regs);

  void for_loop(const ir::Op& op);

  // Whether an op of `body` after the one defining `v` (at the body's top level) reads `x`.
  static bool read_after_def(const ir::Block& body, ir::ValueId x, ir::ValueId v);

  void if_op(const ir::Op& op);

  // ---------------------------------------------------------------- Hopper TMA + wgmma pipeline (lower/tma_pipeline.cpp)
  // One tensor map per (tensor parameter, box): trailing ABI parameters the launcher fills.
  void tensor_map_params();
  // The GEMM pipeline's boxes: K-major tiles are one box of 64 K-elements per row; an MN-major B
  // is loaded in 64-column chunks (a 128-byte swizzled row holds 64 elements), each BK rows tall.
  static std::vector<int64_t> gemm_box(const TmaDotLoop& m, bool b);
  int param_index(ir::ValueId tensor) const;
  // One tensor map per (tensor parameter, box): a trailing ABI parameter the launcher fills
  // (named <param>_tensor_map, then <param>_tensor_map1, ... for further boxes of that parameter).
  V tensor_map(int param, const std::vector<int64_t>& box, int swizzle_bytes = 128);
  // ceil((ub - lb) / step), 0 when ub <= lb (i32)
  V trip_count(V lb, V ub, V step);

  // Structured helpers for code the pipeline emits directly: an if without results.
  void pir_if(V cond, const std::function<void()>& then_body);
  Regs emit_multi(Op op, std::vector<V> args, size_t n, pir::Ty ty, int64_t imm);

  // The K loop's side work (TmaDotLoop::side_ops), lowered where iteration `i`'s wgmmas run: the
  // loop counter bound to its K offset, and any shared memory it needs (layout exchanges) placed
  // past the pipeline's stages and barriers (`ring_bytes`).
  void side_work(const ir::Op& op, const TmaDotLoop& m, V i, int64_t ring_bytes);

  // A wgmma shared-memory matrix descriptor with 128-byte swizzle: 8-row groups 1024 B apart (the
  // stride byte offset). The leading byte offset matters only for MN-major operands: the distance
  // between 64-element column chunks.
  V descriptor(V addr, int64_t leading_bytes = 16);

  void tma_loop(const ir::Op& op, const TmaDotLoop& m);

  // ---------------------------------------------------------------- wgmma with shared-memory tiles (lower/wgmma.cpp)
  // (jit/wgmma_plan.hpp: tiles copied by TMA once or through a ring of stages ahead of a loop)
  V smem_at(int64_t offset);

  void hopper_init();
  void init_ring_barriers(const SmemRing& r, bool counters = true);
  // After a run of a ring loop that may run again: every copy has landed and every warp is past
  // the loop, so the barriers are reset to phase 0 for the next run.
  void reset_ring(const SmemRing& r);

  // The TMA copies of one tile into shared memory at `dst` (u32 address), completing on `bar`:
  // one box per 64-column chunk. `row_offset` replaces the loop counter's offset (rings).
  void issue_tile(const SmemTile& t, V dst, V bar, const ir::Op* loop = nullptr, V counter_value = 0);

  void smem_tile_load(const ir::Op& op);
  // A vector tile (SmemTile::vector) in layout L: each register's element read from this
  // iteration's stage.
  Regs smem_vector_regs(const SmemTile& t, const Layout& L);
  std::set<ir::ValueId> smem_vectors_;  // values of vector tiles: every use reads the stage again

  struct RingState {
    V lb, step, trips;
    V base = 0;  // under a producer: the ring's iterations before this run (runs inside loops)
    V iter = 0, stage = 0;  // inside the body: the iteration (from 0) and its stage
    // Under a ring producer, per iteration: the body's pir block, each tile's wgmma reads issued,
    // the tiles already freed, and the block (id) where the consumer waited for each tile.
    pir::Block* body = nullptr;
    std::map<const ir::Op*, int> reads;
    std::set<const ir::Op*> released;
    std::map<const ir::Op*, int64_t> waited_in;
  };

  V ring_stage_addr(const SmemRing& r, V stage, int64_t offset);

  // Thread 0 fills stage `s` with iteration j's tiles.
  void ring_issue(const ir::Op& loop, const SmemRing& r, const RingState& st, V j, V s);

  void ring_prologue(const ir::Op& loop, const SmemRing& r);
  // The loop's lower bound, step and trip count (i32).
  RingState ring_bounds(const ir::Op& loop);
  // A chain's ring (SmemRing::chain): thread 0 fills stage `s` with the chain's iteration g, from
  // whichever loop owns it (none past the last loop).
  void ring_issue_chain(const SmemRing& r, V g, V s);
  bool inside_loop(ir::ValueId v, const ir::Op& loop) const;

  // Top of iteration i: wait for its tiles.
  void ring_top(const ir::Op& loop, const SmemRing& r, V iv);

  // End of iteration i: every wgmma that read the stage has completed (each dot waits for its own
  // group). Lane 0 of each warp counts the warp out; the last warp refills the stage with
  // iteration i + S. Nobody waits for another warp, so warpgroups drift apart freely (one's
  // softmax overlaps the other's MMAs) within the ring's S iterations.
  void ring_bottom(const SmemRing& r);

  // The u32 shared address of a tile in the current iteration (ring) or its fixed place (once);
  // waits for a once-loaded tile's copy to land (and, under a ring producer, a ring tile's).
  V tile_addr(const SmemTile& t);
  // Under a producer: waits for ring tile t's copy in this iteration, unless a wait in an
  // enclosing block of this iteration already did.
  void wait_ring_tile(const SmemTile& t, RingState& st);

  // ---------------------------------------------------------------- ring producer (lower/ring_producer.cpp)
  // lang::ring_producer: warps [0, num_warps) run the kernel (setmaxnreg up, barriers of all
  // threads become a named barrier of theirs); the warpgroup after them (setmaxnreg down) has one
  // thread compute each top-level ring loop's bounds and offsets and fill its stages, waiting on
  // each tile's empty barrier. The consumers wait on a tile's full barrier at its first read in
  // the iteration and arrive (lane 0 of each warp) on its empty barrier once the wgmma wait that
  // retires its last reader has run -- at the iteration's end where that wait is in a branch.
  void run_with_ring_producer();
  void produce_rings();
  // What a copy of the rings' loops does in each iteration of a ring's loop: its ring `r`, the
  // ring's iteration g (counted across runs and a chain's loops) and the loop counter.
  using RingIteration = std::function<void(const ir::Op& loop, const SmemRing& r, V g, V counter)>;
  // A producer-side copy of `loop` (a ring's loop, or one with rings inside): its trips, `each`
  // in each iteration of a ring's loop, and the loops with rings in its body, recursively.
  // `counts`: each nested ring's iterations so far (the stage and phase of its next tile), updated.
  void produce_loop(const ir::Op& loop, std::map<const ir::Op*, V>& counts, const RingIteration& each);
  // RingProducer::reduce_writer (HopperPlan::reduce_writer): the consumers' parts of an add, a
  // warpgroup's column chunks each where the layout gives every chunk to one warpgroup, else one
  // part of all; set by hopper_init.
  struct WriterPart {
    int first_warp = 0, warps = 0;
    std::vector<int64_t> chunks;  // TMA column chunks (128 bytes wide)
    bool operator==(const WriterPart&) const = default;
  };
  std::vector<WriterPart> writer_parts_;
  std::vector<WriterPart> writer_parts(const ir::Op& add) const;
  std::vector<WriterPart> whole_tile_part(const TmaReduce& red) const;  // one part: every consumer, every chunk
  void init_reduce_writer();
  // A consumer: waits until its part of the staging tile is free, writes it, arrives on its full barrier.
  void stage_for_writer(const TmaReduce& red, const Layout& L, const Regs& val);
  // The writer (one thread of the producer warpgroup's second warp): the rings' loops again, each
  // add's parts by TMA as they fill, each part handed back once read.
  void write_reduces();
  // One TMA store / add per listed column chunk of the staging tile at `base` (shared-memory
  // address) into `op`'s window, its offsets lowered by `offset` (in the program or the writer).
  void issue_tma_chunks(const ir::Op& op, const TmaReduce& red, V base, const std::vector<int64_t>& chunks,
                        const std::function<V(ir::ValueId)>& offset);
  // The registers of a TMA store / add into the swizzled staging tile at `staging`.
  // at_store: the offsets from opaque copies of the thread's coordinates (StoreOptions::offsets_at_store)
  void stage_registers(const TmaReduce& red, const Layout& L, const Regs& val, V staging, bool at_store = false);
  // The rings whose loops are being lowered, innermost last (a tile of the innermost may be freed
  // after a nested loop that read it last).
  std::vector<const ir::Op*> active_rings_;
  // A scalar the producer needs, lowered in its frame with what it reads (nothing but scalar
  // arithmetic, program ids, tensor shapes and scalar loads).
  V producer_value(ir::ValueId v) { return scalar_ahead(v, /*for_producer=*/true); }
  // Scalar v, lowered now from its definition if it has not been yet (pure scalar ops only): what
  // a TMA ring issues ahead of the program's order needs (the producer warp; a chain's later loops).
  V scalar_ahead(ir::ValueId v, bool for_producer = false);
  // After a wgmma wait retired `tiles`' readers: frees each whose reads in this iteration are all
  // issued and retired, if the wait stands in the loop body itself.
  void release_retired(const std::vector<const ir::Op*>& tiles);
  void release_ring_tile(const SmemTile& t, RingState& st);
  int ring_readers(const ir::Op* tile);

  void wgmma_dot(const ir::Op& op, const WgmmaDot& w);

  // Whether x is the same in every iteration of the loop with this body: defined outside it, or
  // inside by register-only ops (no memory, no asm barrier: nothing LLVM keeps in the loop) from
  // such values. Block arguments (the counter, carried values) and everything else vary.
  bool loop_invariant(ir::ValueId x, const ir::Block& body) const;

  // The byte offset of element (row, col) of a staging tile in the 128-byte swizzle TMA and wgmma
  // read (SWIZZLE_128B): columns in chunks of one 128-byte row each (chunk_bytes apart), row `row`
  // at 128 * row inside its chunk, and the row's 16-byte unit u stored at u ^ (row % 8).
  V swizzled_offset(V row, V col, int64_t elem_bytes, int64_t chunk_bytes);
  // The byte offset of element (row, col) of a staging tile of unswizzled chunks [rows x chunk_cols]
  // (chunk_cols a power of two), chunk after chunk (TmaReduce's narrow staging).
  V chunked_offset(V row, V col, int64_t elem_bytes, int64_t chunk_cols, int64_t rows);

  // A shared-memory store at an absolute byte offset (the staging tiles lie below the scratch area,
  // whose base emit0 would add).
  // Shared-memory accesses at an absolute byte offset (emit/emit0 add the scratch base to theirs).
  void store_shared_at(V offset, V value, std::optional<V> pred);
  V load_shared_at(V offset, DType d);

  // Writes x of A = trans(x) (x [K, M] 16-bit, in its own layout) into the A staging tile: element
  // (k, m) at chunk m / 64, row k (128 bytes), 16-byte unit (m % 64) / 8 XOR k % 8 (the 128-byte
  // swizzle), adjacent m pairs as one 32-bit store. The previous staged dot's MMAs must be done
  // reading it, in every warpgroup: this thread waits for its group, then all meet at a barrier.
  void stage_a(const ir::Op& trans, bool at_use);

  // The last wgmma group a region op must wait for before it runs (none: it may run with every
  // group in flight): all of them if it runs dots, else the latest group among the in-flight
  // results it reads.
  std::optional<int> region_waits_for(const ir::Op& op) const;

  // wgmma groups committed in this straight-line block whose results nobody has read yet.
  struct PendingDot {
    int group;
    ir::ValueId value;
    Layout layout;
    Regs regs;
    int64_t ops_at_issue = 0;  // ops_lowered_ when it was issued
    pir::Block* commit_block = nullptr;  // its wgmma_commit: the block and the index there
    size_t commit_at = 0;
    std::vector<const ir::Op*> ring_tiles;  // the ring tiles (block_loads) it reads
  };
  // Waits until `v`'s group (if pending) is complete: wait_group(n) with n the groups committed
  // after it; every group it completes gets its registers redefined by the wait (the asm ties
  // them), so nothing reads an accumulator before the MMA wrote it.
  void wait_for(ir::ValueId v);
  void wait_pending();
  void wait_groups(int upto);

  // ---------------------------------------------------------------- state
  const ir::Function& f_;
  const LayoutPlan& plan_;
  ScalarFacts facts_;  // constants and ranges of the tile IR's integer scalars
  AxisInfo axis_;      // contiguity, divisibility and constancy of integer and pointer tiles
  std::map<ir::ValueId, Layout> precomputed_, precompute_requests_;
  pir::Func out_;
  std::map<const ir::Op*, RingState> rings_;
  // Under a producer, each ring loop nested in other loops: its iterations so far in this program,
  // carried by the enclosing loops (the stage and phase continue across runs).
  std::map<const ir::Op*, V> ring_counts_;
  // The producer rings nested (at any depth) in `loop`'s body.
  std::vector<const ir::Op*> nested_producer_rings(const ir::Op& loop) const;
  // Whether `op` is a loop the producer copies: a ring's, or one with producer rings inside.
  bool fills_rings(const ir::Op& op) const;
  std::map<const ir::Op*, int> ring_readers_;  // ring tile -> the dots that read it
  std::vector<PendingDot> pending_;
  std::set<V> wait_outputs_;  // registers a wgmma wait redefined (wait_groups)
  int64_t ops_lowered_ = 0;  // ops of the tile IR lowered so far, dots excepted
  int committed_ = 0;
  int staged_a_group_ = 0;  // the wgmma group of the last dot that read the A staging tile
  int64_t scratch_base_ = 0;
  std::map<std::tuple<int, std::vector<int64_t>, int>, V> tensor_maps_;  // by (tensor parameter, box, swizzle)
  std::unordered_map<ir::ValueId, int64_t> divisors_;
  std::unordered_map<ir::ValueId, const ir::Op*> iv_loop_;
  std::vector<pir::Block*> blocks_;
  std::vector<int64_t> block_ids_;
  int64_t block_serial_ = 0;
  // The block (id) in which, since the last TMA reduce was issued, thread 0 waited for every earlier
  // reduce to read its staging tile and all threads then met at a barrier: a reduce issued later in
  // that block finds the staging tile free without another wait and barrier. -1: none.
  int64_t reduce_staging_free_in_ = -1;
  std::vector<Frame> frames_;
  std::unordered_map<ir::ValueId, const ir::Op*> def_;
  // load_at_use results: the memory epoch (stores, atomics and regions lowered so far) and frame
  // depth of their load; a use that finds both unchanged may read the window again.
  std::unordered_map<ir::ValueId, std::pair<int64_t, size_t>> reloadable_;
  int64_t memory_epoch_ = 0;
  ir::AddressSources sources_;              // which parameters each pointer or tensor may point into
  std::vector<GlobalAccess> unordered_;     // global accesses since the last barrier of all threads
  std::vector<LoopHead> loop_heads_;        // enclosing loop bodies, innermost last
  // Warpgroup turns (lang::warpgroup_turn): on with exactly two warpgroups; the turn_begin being lowered.
  bool turns_ = false;
  const ir::Op* in_turn_ = nullptr;
  V own_turn_ = 0, other_turn_ = 0;  // named barrier ids: this warpgroup's turn, the other's
  std::unordered_map<ir::ValueId, TensorDesc> tensors_;
  std::map<std::pair<DType, int64_t>, V> const_ints_;
  V tid_ = 0, lane_ = 0, warp_ = 0;  // in a warp role, counted from the role's first warp
  // The thread that issues the program's bulk (TMA) stores and adds and waits for their reads of the
  // staging tile: thread 0 (decision 078 measured moving it to warpgroup 1's first warp: ~1%).
  V bulk_issuer() { return cmp(pir::Pred::eq, tid_, ci32(0)); }
  int warps_ = 0;                    // the warps of the code being lowered (a role's, else the launch's)
  int role_barrier_ = 0;             // in a warp role: its named barrier
  // RingProducer::coordinates_at_use, in the consumers' code: thread_coords inside a loop from
  // opaque copies of the lane and warp, per frame (nothing from outside the loop body is reused)
  bool coordinates_at_use_ = false;
  std::unordered_map<V, std::pair<V, int>> unpacked_;  // unpack_pairs' halves: (word, half)
  std::map<int64_t, ChannelPlan> channels_;            // lang::Channel, by id
  std::set<ir::ValueId> used_, read_pops_;             // values with a use; channel pops already read
  int64_t smem_bytes_ = 0;
};

}  // namespace tilejit::jit::lower
