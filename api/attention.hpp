// The attention entry points a training framework calls: FlashAttention forward and backward on
// device tensors given as logical [B, S, H, D] views with any strides, every argument checked first.
#pragma once
#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/ir/type.hpp"
#include "kernels/attention/config.hpp"
#include "kernels/attention/mask_host.hpp"
#include "runtime/bundle.hpp"
#include "runtime/gpu_kernel.hpp"

namespace tilejit::attention {

// A device tensor the API reads or writes, not owned: element [0, ..., 0] at `data`, sizes and
// strides in elements (up to rank 4). Attention tensors are logical [B, S, H, D] (varlen:
// [total, H, D]) with unit stride on D; any other strides work, so a [B, H, S, D] tensor is
// passed as its permuted view (permute below).
struct Tensor {
  uint64_t data = 0;
  ir::DType dtype = ir::DType::bf16;
  int rank = 0;
  std::array<int64_t, 4> sizes{};
  std::array<int64_t, 4> strides{};
  int device = 0;

  int64_t size(int d) const { return sizes[static_cast<size_t>(d)]; }
  int64_t stride(int d) const { return strides[static_cast<size_t>(d)]; }
  std::string describe() const;  // "bf16[2,1000,8,64] strides [512000,512,64,1] at 0x7f... on device 0"
  runtime::TensorView view() const;  // points into this struct: keep it alive while the view is used
};
// A row-major (contiguous) tensor.
Tensor contiguous(uint64_t data, ir::DType dtype, std::initializer_list<int64_t> sizes, int device = 0);
// Explicit strides (elements), one per size.
Tensor strided(uint64_t data, ir::DType dtype, std::initializer_list<int64_t> sizes,
               std::initializer_list<int64_t> strides, int device = 0);
// The same memory with dims reordered: result dim i is dim order[i] of `t` (a [B, H, S, D]
// tensor becomes the [B, S, H, D] view the API takes with permute(t, {0, 2, 1, 3})).
Tensor permute(const Tensor& t, std::initializer_list<int> order);

// The launch configuration of one kernel: tile sizes (powers of two), warps, pipeline stages, and
// optionally the programs per multiprocessor its registers must leave room for (0: no bound;
// jit::CompileOptions::min_programs_per_sm).
struct Schedule {
  int block_m = 64;
  int block_n = 64;
  int num_warps = 4;
  int stages = 3;
  int min_programs_per_sm = 0;
  bool operator==(const Schedule&) const = default;
};
// The kernels the API launches (the last two only with a dQ reduction, see DqReduction).
enum class Pass { forward, bwd_preprocess, bwd_dkdv, bwd_dq, bwd_dq_convert, bwd_dq_reduce };
const char* name(Pass p);  // the kernel's name: "attention_fwd", "attention_bwd_dq", ...

// How the backward sums dQ over the key tiles (Options::dq_reduction; the values are the dK/dV
// kernel's DQ_REDUCTION meta, kernels/attention/backward.hpp):
//   recompute  a separate dQ kernel recomputes S and P per query tile (7 matmuls; no extra memory;
//              deterministic).
//   atomic     the dK/dV kernel adds each block's dS K into an f32 dQ_accum [B, Hq, S_q, D] with
//              atomics (5 matmuls; 4 B Hq S_q D bytes of workspace, zeroed by the call), then
//              attention_bwd_dq_convert writes dQ. The add order depends on timing: dQ's last bits
//              vary run to run (dK, dV do not).
//   split      each block's part goes to its own slot of an f32 dQ_parts [B * Hq, M, N, BLOCK_M, D]
//              (M, N: query and key tiles of dK/dV), summed in key-tile order by
//              attention_bwd_dq_reduce: bit-identical run to run, but 4 B Hq M N BLOCK_M D bytes
//              (~ S_q S_k D / BLOCK_N * 4 per head: 8.6 GB at B 4, S 4k, 16 heads of D 128; 34 GB at
//              B 1, S 16k).
//   ordered    as atomic, but tile m of dQ_accum takes its parts in increasing key-tile order,
//              enforced by i32 semaphores [B * Hq, M] (zeroed by the call; dQ_accum needs no
//              zeroing): bit-identical run to run with atomic's memory. Full and causal masks only.
// atomic, split and ordered take dense batches only (no cu_seqlens). Unset (the default): the
// fastest one for the call's shape, deterministic unless a non-deterministic one measured more than
// 5% faster side by side (issue 23's rule): atomic where it runs on the dQ writer (dense, no dropout
// or score mod, no accumulation or phases, no schedule, S_q % 4 == 0): D 128 full or causal from
// S_q 1024 (1.05-1.17x the fastest deterministic one on the H200, decision 100), D 64 full or causal
// from S_q 4096 (101), D 128 under a library mask from S_q 2048 (1.00-1.31x recompute, 104). With
// Options::deterministic: the faster deterministic one as measured side by side (decision 075):
// ordered on the dQ writer from S_q 8192 (full) or 16384 (causal) on at D 128 (085), recompute elsewhere.
using DqReduction = kernels::DqReduction;  // (the dK/dV kernel's DQ_REDUCTION meta)
const char* name(DqReduction r);  // "recompute", "atomic", "split", "ordered"

// Which kernels a backward call runs (Options::backward_phase). all: every one. Or two calls with
// the same arguments, options (but this and accumulate_gradients) and workspace, nothing else
// writing that workspace between them: dkdv (Delta, [dK/dV's mask pre-pass], dK, dV; dq untouched),
// then dq ([dQ's pre-pass], dQ from the Delta and mask classes the first left in the workspace).
// Between them a caller can overlap work that needs dK and dV (context parallelism sends their sums
// while dQ runs). A gradient a phase leaves alone may be f32 or the inputs' dtype, so the dkdv phase
// can add into f32 sums (accumulate_gradients) while the dq phase writes dQ. Split phases need the
// recompute reduction and a caller's workspace.
enum class BackwardPhase { all = 0, dkdv = 1, dq = 2 };
const char* name(BackwardPhase p);  // "all", "dkdv", "dq"

// The one table of default schedules, per pass, dtype, head dim, mask, varlen and dQ reduction.
// The dense forward runs on the Hopper wgmma path (128-row blocks over two warpgroups, a 2-stage
// K/V ring); varlen windows are tensor slices, which take the generic path with smaller tiles
// (forward and backward). With a dQ reduction the dK/dV kernel does a fifth dot (dS K, M =
// BLOCK_M) that wgmma only takes with BLOCK_M >= BLOCK_N: its tiles become 64 x 64 on 4 warps (the
// kernel author's measurement: every dot on wgmma, no spills at D 64), and
// attention_bwd_dq_reduce runs at the same tiles.
// `dropout`: the D 64 forward runs 64 x 128 on 4 warps; the backward keeps its tiles. Without it the
// D 64 forward has min_programs_per_sm = 2 (and then normalises by rcp: EXACT_NORMALIZE=false). D 64
// dK/dV (recompute) has min_programs_per_sm = 3, except with dropout or a `library_mask` (spills there).
// `library_mask`: a mask other than full and causal (Options::mask). `score_mod`: a call with a
// score mod (its D 128 dQ keeps 64 x 64 tiles: softcapping spills at 128 x 128).
Schedule default_schedule(Pass pass, ir::DType dtype, int head_dim, bool causal, bool varlen = false,
                          DqReduction reduction = DqReduction::recompute, bool dropout = false, bool library_mask = false,
                          bool score_mod = false);

// A library attention mask (kernels/attention/mask_host.hpp defines every pattern, bottom-right
// aligned when S_q != S_k like causal): the kind and its integers in `spec` (MaskSpec::
// sliding_window(w), ::document(), ::block_sparse(bq, bk), ...; fields a kind does not use are
// ignored) and the device tensors the kind reads (a tensor its kind does not read is an error):
//   doc_ids         i32 [B or 1, S_k]: document/segment id of each key token (document,
//                   causal_document, share_question, causal_blockwise); any values
//   prefix_lengths  i32 [B] (prefix_lm); values must be >= 0 (not read on the host: the caller's
//                   responsibility, like cu_seqlens)
//   block_table     u8 [B or 1, Hq or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)] (block_sparse;
//                   != 0 = attend), per query head when its head extent is Hq
// Each unit stride on its last dim, on q's device. Kinds full and causal are the unmasked and the
// causal path (kind causal is exactly options.causal = true); any other kind is dense batches only
// and does not combine with options.causal.
struct Mask {
  kernels::MaskSpec spec;
  std::optional<Tensor> doc_ids, prefix_lengths, block_table;
};

// A score mod (the kernels' SCORE_MOD): applied to q . k * softmax_scale before masking and the
// softmax, in the forward and (the same options) the backward.
//   alibi    score + alibi_slopes[h] * (key - query position): alibi_slopes f32 [Hq], contiguous,
//            on q's device (query position = row + S_k - S_q, bottom-right aligned).
//   softcap  softcap * tanh(score / softcap): softcap finite and > 0.
struct ScoreMod {
  kernels::ScoreModKind kind = kernels::ScoreModKind::none;
  std::optional<Tensor> alibi_slopes;
  float softcap = 0;
};

struct Options {
  // Multiplies QK^T before the softmax; unset: 1 / sqrt(head_dim). Must be finite.
  std::optional<float> softmax_scale;
  // Bottom-right aligned when S_q != S_k: query i sees keys j <= i + S_k - S_q; a query row that
  // sees no key gives O = 0, LSE = -inf (and zero gradients).
  bool causal = false;
  // Variable-length batches (both or neither): i32 device arrays of B + 1 offsets into the packed
  // tokens (0, len_0, len_0 + len_1, ..., total), and the longest sequence of each. q/o/dq/do are
  // then [total_q, Hq, D], k/v/dk/dv [total_k, Hkv, D], lse [Hq, total_q]. The offsets are not
  // read on the host: they must be non-decreasing, start at 0 and end at the tensors' totals.
  std::optional<Tensor> cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  // Variable-length self-attention run as one dense call on the packed sequence ([1, total, H, D])
  // with a document mask (causal_document when causal, else document), whose ids the call writes
  // from cu_seqlens into its workspace (attention_document_ids): the wgmma kernels and the masks'
  // block skipping instead of the varlen kernels (the generic mma.sync path). Needs cu_seqlens_q and
  // cu_seqlens_k to be the same tensor (each sequence attends to itself) and no dropout (the varlen
  // keep-mask counts rows per sequence); the workspace functions count the ids and the lists with
  // it. Results equal the varlen call's within rounding (other tiles, another summation order).
  // Off by default until timed against the varlen kernels (decision 113).
  bool varlen_documents = false;
  // Replaces default_schedule for every kernel of the call (tests, tuning).
  std::optional<Schedule> schedule;
  // The forward on a persistent grid (one program per SM walking the tiles: decision 050). Unset:
  // the library's choice (D 128 dense without dropout, library masks or score mods); false: one
  // program per tile (e.g. to leave SMs free at tile boundaries for a kernel on another stream);
  // true: persistent where the kernel allows it (not with varlen).
  std::optional<bool> persistent;
  // Dropout on the attention probabilities (FlashAttention's convention: O = dropout(softmax(S)) V,
  // lse that of the undropped softmax(S)); 0 <= dropout_p < 1, 0 = off (the kernels without
  // dropout run, nothing costs more). The keep-mask is Philox4x32-10 of the logical coordinates
  // (bh = b * Hq + h, query row, key column; varlen: b is the sequence, rows and columns inside it)
  // with the 64-bit `seed` and `offset` (kernels/philox.hpp): the same under any schedule, and the
  // backward (same options) regenerates it. 8-bit thresholds: the effective drop probability is
  // 1 - round((1 - p) * 256) / 256 (p = 0.1: 0.1015625), and kept values are scaled by its inverse.
  double dropout_p = 0;
  uint64_t seed = 0, offset = 0;
  // Where this call sits in a larger attention whose keep-mask it must reproduce (context
  // parallelism, or a caller that shards attention itself): query row i is row i + row_offset of
  // that attention, key j is key j + col_offset, head h of batch b is bh = b * heads + head_offset + h
  // (heads 0: this call's Hq). col_offset must be a multiple of 64 (whole Philox groups). All zero
  // (the default): this call's own mask. dropout_mask receives the bits at this call's positions. With
  // cu_seqlens only head_offset and heads (b is the sequence); not with dropout_bits.
  struct DropoutCoordinates {
    int64_t row_offset = 0, col_offset = 0, head_offset = 0, heads = 0;
  } dropout_coordinates;
  // The same seed and offset in device memory, read by the kernels when they run (then `seed` and
  // `offset` are ignored): i64 or u64 [2] = [seed, offset] on q's device, unit stride, 8-byte
  // aligned. For CUDA graphs: a replay re-reads it, so a graph that refreshes it before the call
  // (e.g. torch.randint on the device, drawn from torch's graph-safe generator) draws a new mask
  // per replay; the backward reads the forward's (keep the tensor unchanged until it has run).
  std::optional<Tensor> rng_state;
  // Forward only, for tests: u8 [B * Hq, S_q, S_k] (varlen: [B * Hq, max_seqlen_q, max_seqlen_k])
  // with unit stride on the last dim receives the keep bits (1 = kept) of every block the forward
  // visits (every (row, key) the row sees, and more; causal blocks past the diagonal are not
  // written). Needs dropout_p > 0; the backward ignores it.
  std::optional<Tensor> dropout_mask;
  // rng = precomputed (issue 7; dense batches): the packed keep-mask, u32 [B * Hq, S_q,
  // cdiv(S_k, 32)] with bit j % 32 of word j / 32, as generate_dropout_bits writes it for the same
  // seed, offset and dropout_p (e.g. on another stream while the QKV projection runs). Forward
  // and backward then read it instead of running Philox (rng = fused, when unset): the same bits,
  // so the outputs are identical either way, and a forward may read it while its backward
  // regenerates (or the other way round). Needs dropout_p > 0.
  std::optional<Tensor> dropout_bits;
  // Backward with dropout drawn from seed and offset (no dropout_bits): dK/dV stores the keep-mask's
  // packed words in the workspace (4 * B * Hq * S_q * cdiv(S_k, 32) bytes) and dQ reads them instead
  // of running Philox again -- the same bits, so the same gradients (decision 097). Taken when the
  // words take at most this many bytes and the call has dense batches, the full or causal mask,
  // dq_reduction recompute, its own mask (dropout_coordinates all zero), the default tiles (or a
  // schedule with BLOCK_N a multiple of 64), and a workspace (if given) with room for them:
  // backward_workspace_bytes(q, k, opts) counts them, the overload without k cannot (a workspace it
  // sized runs the backward that draws the mask twice). Split phases: the dkdv phase leaves the
  // words for the dq phase. 0: never. Unset: 512 MiB where it measured faster (D 64 and D 128
  // without the causal mask: 1.04x / 1.01x, H200 S 4k), else never.
  std::optional<size_t> dropout_words_max_bytes;
  // A library mask (see Mask). Kinds whose allowed blocks are not intervals (document,
  // causal_document, share_question, causal_blockwise, block_sparse) first run the
  // block-mask pre-pass on the GPU, once per kernel that reads its lists (forward: 1,
  // backward: 2, each at that kernel's tiles; 1 with a dQ reduction), into the workspace
  // (forward_workspace_bytes, backward_workspace_bytes); the other kinds classify tiles in the
  // kernels themselves.
  std::optional<Mask> mask;
  // A block mask built for these options (build_block_mask): the calls read its lists and run no
  // pre-pass (nor need workspace for lists). Caller-owned; must outlive the calls' work.
  const struct BlockMask* block_mask = nullptr;
  ScoreMod score_mod;  // none by default (see ScoreMod)
  // Backward only (the forward ignores both): how dQ is summed over key tiles (see DqReduction;
  // atomic, split and ordered need dense batches, ordered the full or causal mask); unset: the
  // fastest for the shape (atomic on most long dense calls: dQ's last bits vary run to run), or with
  // `deterministic` the fastest deterministic one. The workspace grows with it (backward_workspace_bytes).
  std::optional<DqReduction> dq_reduction;
  // Backward only: dQ bit-identical run to run (dK, dV always are): with dq_reduction unset, the
  // fastest deterministic reduction for the shape instead of atomic (torch.use_deterministic_algorithms,
  // flash-attn's deterministic=True). Ignored when dq_reduction is set.
  bool deterministic = false;
  // Backward only: each key tile of dK/dV visits its query tiles from the last to the first (the
  // Q_DESCENDING meta, DASH's descending order; meant for causal with the ordered reduction,
  // attention_bench --deterministic times it). Not with split or library masks.
  bool q_descending = false;
  // Backward only: dq, dk and dv are f32 and receive += the gradients (gradient accumulation
  // across micro-batches or context-parallel calls) instead of being overwritten; the kernels'
  // epilogues add (ACCUMULATE), so no separate pass reads them. With dq_reduction recompute (the
  // default here) or atomic (dK/dV add; attention_bwd_dq_convert adds scale * dQ_accum into dq).
  bool accumulate_gradients = false;
  // Backward only: the kernels this call runs (see BackwardPhase).
  BackwardPhase backward_phase = BackwardPhase::all;
};

// Writes the packed dropout keep-mask of an attention call with these options (opts.dropout_p,
// seed and offset or rng_state; > 0) into `bits`: u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)], unit stride on
// the last dim, 4-byte aligned; bits of columns >= seq_k are 0. Asynchronous on `stream`: run it
// on a second stream while the GEMM before attention runs, then pass `bits` as
// opts.dropout_bits (rng = precomputed). 2 MB of mask per (batch*head) at S = 4096.
// `programs` > 0: a persistent grid of that many programs striding over the mask (e.g. the SM
// count, queued just before the GEMM it should run beside: each SM keeps room for a GEMM program);
// 0: one program per tile (fastest alone). H100, S = 4096, B*H = 64: 0.44 ms alone (0); with 132
// programs 0.71 ms alone, of which ~21% hid behind a 0.65 ms GEMM (BENCHMARKS.md).
void generate_dropout_bits(const Tensor& bits, int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k, const Options& opts,
                           CUstream stream = nullptr, int programs = 0);

// Issue 30: the keep-mask written in shares by the GEMMs that run before the attention reading it
// (the gemm kernel's DROPOUT_MASK with MASK_RANGE: tiles [first, end) of the mask). How much a GEMM
// hides is measured, not assumed (decision 094): a curve per GEMM of its extra time against the
// tiles it carries, (tiles, extra ms) with tiles ascending and > 0; between points the extra is
// interpolated, past the last extrapolated along the last segment; carrying none costs nothing
// (the plain GEMM runs).
struct MaskHidingCurve {
  std::vector<std::pair<int64_t, double>> points;
};
// The curve's extra ms at `tiles` (0 at 0).
double mask_hiding_extra_ms(const MaskHidingCurve& curve, int64_t tiles);
// Splits `tiles` mask tiles over the GEMMs (in the curves' order) so that the sum of their extra
// times is least, in units of `granule` tiles (0: at most 256 units): exact over units (dynamic
// programming), so curves need not be convex (a GEMM whose mask variant costs something at its
// first tile is left out when others hide it). Returns each GEMM's count in whole tiles (units
// rounded cumulatively), summing to `tiles`.
std::vector<int64_t> assign_mask_tiles(const std::vector<MaskHidingCurve>& curves, int64_t tiles, int64_t granule = 0);

// Scratch memory: the backward's Delta (rowsum(dO * O), f32 [B, Hq, S_q] or [Hq, total_q]), for
// masks without tile intervals the block-mask pre-pass's lists (forward and backward), and the
// dQ reduction's buffers (backward). A call writes and reads it on its stream only (what must be
// zero it zeroes there itself, cuMemsetD8Async): the next call on that stream may reuse it.
struct Workspace {
  uint64_t data = 0;  // 16-byte aligned device memory on q's device; 0: allocate per call
  size_t bytes = 0;
};

// A block mask built once and reused (what FlexAttention's create_block_mask returns): the
// block-mask pre-pass's lists for a forward and a backward with these options (opts.mask of a
// kind without tile intervals: document, causal_document, share_question, causal_blockwise,
// block_sparse), in caller memory. Calls with opts.block_mask = &it launch no pre-pass and keep no
// lists in their workspace -- e.g. build it once per step and use it in every layer's forward and
// backward. The lists describe the mask's data (doc ids, prefix lengths, block table) as it was
// when built: rebuild after changing it. A call checks that it was built for its mask kind,
// sequence lengths, mask extents, device and kernel tiles (dropout, dq_reduction and a schedule
// change the backward's tiles: build with the options the calls use) and throws
// std::invalid_argument naming what differs.
struct BlockMask {
  Workspace storage;  // block_mask_bytes(q, k, opts) bytes
  // what it was built for
  kernels::MaskKind kind = kernels::MaskKind::full;
  int64_t seq_q = 0, seq_k = 0, mask_batch = 0, mask_heads = 0;
  int device = 0;
  // the tiles (BLOCK_M x BLOCK_N) of the kernels whose lists it holds: the forward, dK/dV and,
  // with dq_reduction = recompute, dQ (0 x 0: none)
  int64_t forward_tiles[2] = {0, 0}, dkdv_tiles[2] = {0, 0}, dq_tiles[2] = {0, 0};
};
// Bytes build_block_mask needs (0 for masks with tile intervals: nothing to build).
size_t block_mask_bytes(const Tensor& q, const Tensor& k, const Options& opts);
// Runs the pre-passes of a forward and a backward with these options into `storage`, on `stream`
// (asynchronous), and returns what the calls pass as opts.block_mask. Checks opts against q and k
// as forward does (std::invalid_argument), and `storage` (size, alignment).
BlockMask build_block_mask(const Tensor& q, const Tensor& k, const Options& opts, Workspace storage, CUstream stream = nullptr);

// O = softmax(scale * Q K^T [masked]) V and LSE = logsumexp of each row (natural log), on `stream`
// (asynchronous). q: [B, S_q, Hq, D], k, v: [B, S_k, Hkv, D] (Hq a multiple of Hkv: grouped- and
// multi-query attention), o like q, lse: f32 [B, Hq, S_q] with unit stride on S_q; q, k, v, o
// bf16 or f16 (all one dtype), D in {64, 128, 256}, every base address and row pitch (stride
// times element size) a multiple of 16 bytes. The first call for a (dtype, D, mask, schedule)
// compiles (memory, disk and JIT caches; thread-safe), later calls only check and launch.
// Throws std::invalid_argument naming the function, argument, value and what is valid (before
// anything runs or compiles), runtime::DeviceError without a GPU or for driver failures.
// `workspace` holds the block-mask lists of opts.mask (forward_workspace_bytes; 0 bytes without a
// mask or for kinds with tile intervals, and then unused); without one such a call allocates them
// and synchronizes `stream` before freeing them.
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
             const Options& opts = {}, CUstream stream = nullptr, Workspace workspace = {});
// Bytes the forward's workspace needs: the block-mask pre-pass's lists at the forward's tiles
// (opts.mask of a kind without tile intervals: 4 * Bm * Hm * nQB * (2 + 2 * nKB) + Bm * Hm * nQB *
// nKB, each of the five arrays rounded up to 256; Bm, Hm the mask tensor's batch and head extents,
// nQB = cdiv(S_q, BLOCK_M), nKB = cdiv(S_k, BLOCK_N)), else 0. Checks opts.mask against q and k.
size_t forward_workspace_bytes(const Tensor& q, const Tensor& k, const Options& opts = {});

// dQ, dK, dV from dO and the forward's O and LSE (same options as the forward). dq like q, dk and
// dv like k (written, not accumulated: GQA groups are summed inside the kernel; with
// opts.accumulate_gradients f32 and added into); do_ like o.
// `workspace` holds Delta (and a mask's block lists, and the dQ reduction's buffers): size it with
// backward_workspace_bytes (a framework passes one from its caching allocator); without one the
// call allocates it and synchronizes `stream` before freeing it. Launches, in order on `stream`:
// attention_bwd_preprocess (Delta); [list masks: the pre-pass at dK/dV's tiles]; then by
// opts.dq_reduction: recompute: attention_bwd_dkdv, [the pre-pass at dQ's tiles], attention_bwd_dq;
// atomic: memset(dQ_accum, 0), attention_bwd_dkdv, attention_bwd_dq_convert; ordered:
// memset(semaphores, 0), attention_bwd_dkdv, attention_bwd_dq_convert; split: attention_bwd_dkdv,
// attention_bwd_dq_reduce.
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_,
              const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts = {},
              CUstream stream = nullptr, Workspace workspace = {});
// Bytes the backward's workspace needs for this q (and opts): Delta, 4 * B * Hq * S_q rounded up
// to 256 (variable-length batches, opts.cu_seqlens_q set and q [total_q, Hq, D]: 4 * Hq *
// total_q); then opts.dq_reduction's buffers, each rounded up to 256: atomic dQ_accum 4 * B * Hq
// * S_q * D; ordered the same plus semaphores 4 * B * Hq * M; split dQ_parts 4 * B * Hq * M * N *
// BLOCK_M * D (M = cdiv(S_q, BLOCK_M), N = cdiv(S_k, BLOCK_N) at dK/dV's tiles). With opts.mask of
// a kind without tile intervals, or split, the size depends on S_k: this overload then throws
// std::invalid_argument; use the one with k.
size_t backward_workspace_bytes(const Tensor& q, const Options& opts = {});
// The same plus, for opts.mask of a kind without tile intervals, the pre-pass lists of dK/dV
// (KV_MAJOR, at its tiles) and, with recompute, of dQ (at its tiles), sized as in
// forward_workspace_bytes; in the workspace: Delta, the lists, the reduction's buffers.
size_t backward_workspace_bytes(const Tensor& q, const Tensor& k, const Options& opts);

// The argument checks of forward/backward alone (no GPU, nothing compiled): what both run first.
void check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                   const Options& opts = {}, Workspace workspace = {});
void check_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& do_,
                    const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& opts = {},
                    Workspace workspace = {});

// Whether this build's kernels take variable-length batches (the VARLEN meta), and whether the
// backward kernels exist at all (they are looked up in the kernel library by name).
bool varlen_supported(bool backward);
bool backward_available();
// Whether the forward (and the backward kernels, when present) take dropout (the DROPOUT meta).
bool dropout_supported();
// Whether the forward (and the backward kernels, when present) take library masks (the MASK meta).
bool masks_supported();
// Whether this build's backward runs with this dQ reduction (the dK/dV kernel takes its
// DQ_REDUCTION value, and attention_bwd_dq_convert or attention_bwd_dq_reduce is in the library).
bool dq_reduction_supported(DqReduction reduction);

// Compiles (or finds in the caches) every kernel a call with this configuration launches, without
// a GPU; a framework calls it at start-up so the first step does not JIT. Thread-safe.
// Calls with a positive softmax_scale (the default) and no score mod; `dropout`: the kernels of
// calls with dropout_p > 0 (without a returned mask). `dq_reduction`,
// `q_descending`: the backward's (Options::dq_reduction, q_descending), checked as a call checks
// them (std::invalid_argument before anything compiles); unset: every reduction the default may
// choose for this configuration (recompute's kernels, and ordered's where it may run). Where dK/dV reads LSE from its ring
// (16-byte aligned lse, S_q % 4 == 0) both of its kernels compile: those calls' and the others'.
void prepare(ir::DType dtype, int head_dim, bool causal, bool varlen = false, bool backward = true,
             std::optional<Schedule> schedule = {}, int device = 0, bool dropout = false,
             std::optional<DqReduction> dq_reduction = std::nullopt, bool q_descending = false);
// The same for calls with a library mask of this kind (opts.mask; causal = MaskKind::causal, full
// = no mask), with the pre-pass kernels of kinds without tile intervals.
void prepare(ir::DType dtype, int head_dim, kernels::MaskKind mask, bool varlen = false, bool backward = true,
             std::optional<Schedule> schedule = {}, int device = 0, bool dropout = false,
             std::optional<DqReduction> dq_reduction = std::nullopt, bool q_descending = false);
// The kernels `prepare` compiles for that configuration, as bundle entries: an application that
// ships them (runtime::write_bundle(path, specs), then tilejit::load_bundle(path)) runs those calls
// with every compiler disabled (TILEJIT_DISABLE_COMPILERS=1). Checked as `prepare` checks.
std::vector<runtime::BundleEntrySpec> bundle_specs(ir::DType dtype, int head_dim, kernels::MaskKind mask, bool varlen = false,
                                                   bool backward = true, std::optional<Schedule> schedule = {}, bool dropout = false,
                                                   std::optional<DqReduction> dq_reduction = std::nullopt, bool q_descending = false);

}  // namespace tilejit::attention
