// Which dots run on Hopper's warpgroup MMA with operands in shared memory (sm_90a), outside the
// GEMM K-loop pipeline (tma_pipeline.hpp): the general form attention needs.
//
// A dot qualifies when its B operand is a TMA-shaped window load (used directly: B[K, N] is
// MN-major; or through trans: B^T[N, K] is K-major) and its A operand is either a TMA-shaped
// K-major window load or any value in registers (wgmma reads A from registers in the layout of its
// own accumulator, so P = softmax(dot(Q, K^T)) feeds dot(P, V) without moving). Window loads that
// feed such dots are "shared-memory tiles": never loaded into registers, but copied by TMA into
// 128-byte-swizzled shared memory, either once (loads outside loops) or through a ring of stages
// that runs ahead of a loop (loads directly in a loop, at any depth, whose offsets are the loop
// counter or invariant in that loop): per stage a full mbarrier (TMA bytes landed) and a release
// counter (the last warp done with a stage refills it, so no warp waits for another).
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dsl/ir/function.hpp"
#include "jit/tma_pipeline.hpp"

namespace tilejit::jit {

// A [rows, cols] window whose cols run along the tensor's contiguous dim; stored as cols/64 chunks
// of [rows x 64] elements (128-byte rows, 128-byte swizzle), chunk c at offset + c * rows * 128.
struct SmemTile {
  const ir::Op* load = nullptr;
  int param_index = 0;
  int row_dim = 0;              // the tensor dim of the tile's rows
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> box;     // TMA box, innermost dim first: 64, rows along row_dim, 1 elsewhere
  const ir::Op* ring = nullptr;  // the loop whose ring stages hold it; nullptr: loaded once
  // Ring tiles whose offsets are computed in the loop from its counter (e.g. a key tile index read
  // from a list): those scalar ops, in program order, which the refill re-evaluates for the
  // iteration it prefetches (the counter replaced). Loads among them must read memory the kernel
  // does not write.
  std::vector<const ir::Op*> offset_ops;
  int64_t offset = 0;           // bytes: from the start of shared memory (once) or of a stage (ring)
  int64_t barrier = 0;          // once: its mbarrier
  // A ring tile under lang::ring_producer: its own barriers, stages of each, 8 bytes apart: full
  // (the producer's copy landed) and empty (every consumer warp is done with the stage).
  int64_t full = 0, empty = 0;
  // A TMA store whose staging tile is this tile's shared memory once its readers are done
  // (TmaReduce::staging_tile): the store is the tile's last reader, and the producer issues
  // the tile's next copy last in its iteration, after the other tiles of the ring.
  const ir::Op* lends_staging_to = nullptr;
  // A row vector read where it is used (lang::load_at_use of a 1-D window in a ring's loop, e.g.
  // attention's LSE next to its Q block): copied by TMA into the ring's stage without swizzle
  // (rows = 1, one box of `cols` elements), each use reading the elements its layout needs from
  // shared memory (no exchange between threads, no barrier) [issue 23]. Under a ring producer the
  // consumers free it at the iteration's end (its reads are not wgmma groups to retire).
  bool vector = false;
  int64_t elem_bytes = 2;
  int64_t bytes() const { return rows * cols * elem_bytes; }
  int64_t chunk_bytes() const { return rows * 128; }
  int64_t chunk_cols() const { return vector ? cols : 64; }  // columns per TMA box
  int swizzle_bytes() const { return vector ? 0 : 128; }
};

struct SmemRing {
  const ir::Op* loop = nullptr;
  int stages = 2;
  int64_t base = 0, stage_bytes = 0;
  int64_t full = 0;      // stages mbarriers, 8 bytes apart
  int64_t released = 0;  // stages u32 counters, 8 bytes apart: warps done with the stage, ever
  // The loop sits inside another loop (or an if): its barriers are reset after each run, so that
  // every run starts at phase 0 (the counters end each run at a multiple of the warp count).
  // Never under a producer: there a nested ring's iterations are counted across runs (the
  // enclosing loops carry the count) and the producer fills the next run's stages early.
  bool rerun = false;
  // lang::ring_producer: a producer warpgroup fills the stages; each tile has its own barriers
  // (SmemTile::full / empty) instead of the ring's full / released.
  bool producer = false;
  std::vector<const ir::Op*> loads;
  // Consecutive loops of one block whose rings load the same windows (tensor, shape, order), with
  // nothing between them that writes memory, share one ring (decision 063): the loops in program
  // order, on every member (empty: a ring of its own). The stages, memory and barriers are the
  // first loop's; its iterations are counted across the chain, so the last stages of one loop
  // prefetch the next loop's first tiles, and only the first loop fills the ring ahead (prologue)
  // and only the last one resets it (`rerun`).
  std::vector<const ir::Op*> chain;
  const ir::Op* head() const { return chain.empty() ? loop : chain.front(); }
  bool follower() const { return !chain.empty() && chain.front() != loop; }
  bool last_in_chain() const { return chain.empty() || chain.back() == loop; }
};

struct WgmmaDot {
  const ir::Op* dot = nullptr;
  const ir::Op* a_tile = nullptr;  // nullptr: A from registers (or staged)
  // A = trans(x) with x in registers (e.g. dQ = dS K from dS^T): x's registers are written as they
  // are into the staging tile (A^T [K, M], M contiguous in 64-column chunks, 128-byte swizzle) and
  // wgmma reads A MN-major from there (transpose-A), instead of moving x through shared memory
  // into A's register fragments (every warpgroup would hold all of A when warpgroups split N).
  const ir::Op* a_staged = nullptr;  // the trans op
  // a_tile used through a trans (A^T [K, M] loaded, e.g. a weight gradient's dY^T): read MN-major
  // from its 64-column chunks (transpose-A), like a staged A
  bool a_mn_major = false;
  const ir::Op* b_tile = nullptr;
  bool b_mn_major = false;
};

// atomic_add on a window (block_store with reduce = "add") of an f32 tensor parameter whose cols
// run along its contiguous dim: the value is written into a staging tile in shared memory (cols/32
// chunks of [rows x 32] f32, 128-byte swizzle) and added into global memory by TMA
// (cp.reduce.async.bulk.tensor), one box per chunk. One staging tile serves every such store: the
// next one waits until TMA has read it.
struct TmaReduce {
  const ir::Op* store = nullptr;
  int param_index = 0;
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> box;  // innermost first: 128 / elem_bytes, rows along the row dim, 1 elsewhere
  // A TMA store or reduce at a negative coordinate, or one whose box passes 2^31 - 1, faults on
  // the H100: where the offsets' ranges (jit/scalar_facts.hpp) do not exclude that, the lowering
  // tests them and writes element by element when one is out of that range.
  bool check_coordinates = false;
  // The window's extent along tensor dim d (row_dim: the dim its rows run along)
  int64_t extent(int64_t d, int64_t row_dim, int64_t rank) const { return d == row_dim ? rows : d == rank - 1 ? cols : 1; }
  // a plain store (StoreOptions::tma: cp.async.bulk.tensor) rather than an add; the element size
  // (4 for adds: f32; 2 or 4 for stores), so 128 / elem_bytes columns a chunk
  bool store_only = false;
  bool offsets_at_store = false;  // StoreOptions::offsets_at_store (IR: ir::kOffsetsAtStoreAttr)
  int64_t elem_bytes = 4;
  // A store under lang::ring_producer, in the body of a ring's loop, after every reader of one of
  // that ring's tiles: it stages in that tile (FlashAttention-3's O over V) instead of a tile of
  // its own, and frees the tile's stage once TMA has read it. nullptr: the shared staging tile.
  const ir::Op* staging_tile = nullptr;
  // ReduceWriter: the ring loop whose body holds this add (its iteration counts the adds)
  const ir::Op* loop = nullptr;
  // A chunk's columns (the box's inner extent) and the staging's swizzle: 128 / elem_bytes columns in
  // 128-byte swizzled rows, or (AddOptions::narrow_staging) 32 / elem_bytes in 32-byte rows without
  // swizzle, where an MMA accumulator's 64-bit fragment stores fill each half-warp's 128 bytes
  // without bank conflicts [100]
  int64_t chunk_cols() const { return box[0]; }
  int swizzle_bytes() const { return chunk_cols() * elem_bytes == 128 ? 128 : 0; }
  int64_t chunk_bytes() const { return rows * chunk_cols() * elem_bytes; }
};

// lang::RingProducer::reduce_writer: a warp of the producer warpgroup issues every TMA add (all
// on the shared staging tile, one at the top level of each loop of `ring`'s chain). The consumers
// stage a part, arrive on its full barrier and go on; the writer waits there, adds the part, and
// arrives on the part's empty barrier once TMA has read it. A part is one consumer warpgroup's
// column chunks where each chunk is one warpgroup's (wgmma's column slabs), else the whole tile.
// Both sides take each barrier's phase from the ring's iteration (one add per iteration).
struct ReduceWriter {
  static constexpr int kMaxParts = 4;
  const ir::Op* ring = nullptr;  // the head loop of the ring (chain) whose iterations the adds follow
  int64_t barriers = 0;          // part p: full at barriers + 16 p, empty 8 bytes after it
  int64_t pending_signal = 0;    // 8 bytes: the semaphore the last ordered add signals once complete (0: none)
};

struct HopperPlan {
  std::map<const ir::Op*, WgmmaDot> dots;
  std::map<const ir::Op*, TmaReduce> reduces;  // by block_store
  int64_t reduce_staging = 0, reduce_staging_bytes = 0;  // offset and size of the staging tile
  int64_t a_staging = 0, a_staging_bytes = 0;  // the staged A operands' tile (WgmmaDot::a_staged)
  std::map<const ir::Op*, SmemTile> tiles;  // by block_load
  std::map<const ir::Op*, SmemRing> rings;  // by for loop
  std::vector<const ir::Op*> tile_order, ring_order;  // program order (ABI and code order)
  int64_t persistent_bytes = 0;  // tiles, rings and barriers; scratch exchanges go above
  bool ring_producer = false;    // lang::ring_producer: rings filled by a producer warpgroup
  std::optional<ReduceWriter> reduce_writer;
  bool empty() const { return dots.empty() && reduces.empty() && tiles.empty(); }
};

// The second Hopper step of layout assignment (assign_layouts.hpp), after match_tma_loops: the
// loops of `tma` are the GEMM pipeline's, and their dots are not planned again. An empty plan where
// nothing qualifies. `op_warps`: ops inside warp roles, with their role's warps (others run on
// num_warps).
HopperPlan plan_wgmma(const ir::Function& f, int num_warps, const std::map<const ir::Op*, int>& op_warps,
                      const std::string& arch, const PipelineOptions& opts, const TmaPlan& tma);
// `f`'s text, then the plan's dots, tiles, rings and TMA reduces in program order
// (--dump-after plan-wgmma).
std::string print_hopper_plan(const ir::Function& f, const HopperPlan& plan);

}  // namespace tilejit::jit
