// FlashAttention-2 backward in the DSL: three kernels run in order after the forward
// (kernels/attention/forward.hpp), whose LSE they reuse to recompute P; dQ's reduction (DQ_REDUCTION) is a
// schedule option: a separate dQ kernel (deterministic), atomics or split parts (deterministic).
//
// Where they live: kernels/attention/dkdv.cpp (attention_bwd_dkdv), dq.cpp (attention_bwd_dq),
// backward_small.cpp (attention_bwd_preprocess, attention_bwd_dq_convert, attention_bwd_dq_reduce),
// backward_common.hpp (what they share: HeadRows, BackwardParams, the masked walks). Each kernel's
// metas are a typed configuration in kernels/attention/config.hpp (DkdvConfig, DqConfig,
// PreprocessConfig, DqConvertConfig, DqReduceConfig): the kernel's body reads it first, callers
// pass its to_meta(). Why each default is what it is: docs/decisions/ (numbers in brackets).
#pragma once
#include "dsl/lang.hpp"
#include "kernels/attention/config.hpp"

namespace tilejit::kernels {

// Tensors follow the forward: Q, O, dO, dQ: [batch, heads_q, seq_q, head_dim]; K, V, dK, dV:
// [batch, heads_kv, seq_k, head_dim] (or all [batch, seq, heads, head_dim] with BSHD); heads_q a
// multiple of heads_kv. LSE (the forward's, natural log, -inf for a row that sees no key) and
// Delta: f32 [batch, heads_q, seq_q]. Causal masks align the last query with the last key.
//
// VARLEN (as the forward's): Q, O, dO, dQ: [total_q, heads_q, head_dim]; K, V, dK, dV: [total_k,
// heads_kv, head_dim]; LSE, Delta: f32 [heads_q, total_q]; trailing i32 pointer parameters
// cu_seqlens_q, cu_seqlens_k (batch + 1 cumulative offsets; the preprocess takes cu_seqlens_q
// only). Each sequence is differentiated as in the dense kernels (its own S_q, S_k, causal
// alignment; length 0 allowed: its gradients are 0). The grids use max_seqlen_q/k for seq_q/k and
// the number of sequences for batch; programs past their sequence's end do nothing; tokens
// outside [cu[0], cu[batch]) are neither read nor written. BSHD with VARLEN is a BuildError.
//
// DROPOUT (dK/dV and dQ; the forward's, kernels/attention/forward.hpp): five more scalars after all the
// other parameters, seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold (the forward's values);
// the kernels regenerate the forward's keep-mask from the same logical coordinates (bh = b *
// heads_q + h, query row, key) and differentiate O = dropout(P) V: dV = sum (P * keep * s)^T dO,
// dS = P * (dO V^T * keep * s - Delta), s = 256 / keep_threshold. The preprocess is unchanged
// (Delta = rowsum(dO * O), O already dropped).
// DROPOUT_BITS (dK/dV and dQ, dense only, BLOCK_N a multiple of 32; needs DROPOUT): rng =
// precomputed, as in the forward -- one more parameter after the dropout scalars, dropout_bits
// (u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)], what the dropout_mask kernel writes); the
// kernels read the mask instead of regenerating it (the same bits).
//
// MASK (dK/dV and dQ; an int, kernels::MaskKind, the forward's meta; default full): a library mask
// (kernels/attention/mask_host.hpp defines each pattern). MASK=causal is exactly CAUSAL=true (the same
// code, no parameters). Any other kind with CAUSAL=true or VARLEN=true is a BuildError (not
// supported together yet). Its parameters come after all the others (after the dropout scalars
// and dropout_bits): the mask's own, in kernels::mask_parameter_names(kind) order (i32 scalars
// mask_window_left, mask_window_right, mask_global_tokens, mask_block_q, mask_block_k; tensors
// mask_doc_ids i32 [B or 1, S_k], mask_prefix_lengths i32 [B], mask_block_table u8 [B or 1, Hq or 1,
// ..]); then, for the kinds without tile intervals (document, causal_document, share_question,
// causal_blockwise, block_sparse: !kernels::mask_has_tile_intervals), the lists of the
// block-mask pre-pass (kernels/attention/mask.hpp) run with THIS kernel's BLOCK_M and
// BLOCK_N: dK/dV reads the KV_MAJOR=true lists (per key tile, its query tiles) q_num_blocks,
// q_indices, full_q_num_blocks, full_q_indices; dQ the KV_MAJOR=false lists (per query tile, its key
// tiles) kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices (i32, [Bm, Hm, nOuter(,
// nInner)], Bm / Hm 1 or B / Hq: they broadcast). Each program visits only the non-empty blocks, in
// one flat loop (the interval kinds' runs end to end, or the partial list then the full one), and
// evaluates the element mask only in partial blocks and blocks that cross S_k (one uniform branch);
// masked elements have P = 0, hence dS = 0. The mask is per query head (dK/dV binds it per head of
// the group). Rows with no allowed key (forward LSE = -inf) get zero gradients. Dropout and masks
// are independent.

// DQ_REDUCTION (dK/dV only; an int, DqReduction; default 0): how dQ is summed over key tiles [023].
//   0 recompute: attention_bwd_dq recomputes S and P per query tile (7 matmuls in all; no
//     workspace). The dK/dV kernel is exactly the one without the meta.
//   1 atomic: the dK/dV kernel also computes each block's part dS K [BLOCK_M, D] (f32, unscaled)
//     and adds it atomically into dQ_accum; then attention_bwd_dq_convert writes dQ = DTYPE(dQ_accum *
//     softmax_scale). 5 matmuls; the f32 add order depends on timing (not bit-reproducible).
//   2 split: each part is stored to its own slot of dQ_parts; then attention_bwd_dq_reduce sums
//     the parts of each query tile in increasing key tile order from +0.0 and writes dQ: bit
//     identical whatever the order the programs ran in.
//   3 ordered: each part is added into dQ_accum in increasing key tile order, through one i32
//     semaphore per (query head, query tile) in dQ_semaphores [B * Hq, M] (zero before the call;
//     each key block waits until n_block earlier ones have added, adds, signals); then
//     attention_bwd_dq_convert as for atomic. 5 matmuls, bit-reproducible (each add is elementwise
//     and their order is fixed). Waits only on lower block indices (no deadlock whatever the
//     residency). Full and causal only [025].
//   1-3: dense tensors only (VARLEN is a BuildError), either layout (BSHD), GQA (each query head of
//   the group writes its own slots), CAUSAL, DROPOUT, DROPOUT_BITS and (atomic, split) every MASK.
//   dK and dV are computed as with 0 (the same values). attention_bwd_dq is not run.
// Q_DESCENDING (dK/dV, full/causal walks, not split): a key block visits its query tiles from the
// last to the first (DASH's descending order for causal masks) [025].
// PARTIAL_TILES_ONLY (dK/dV and dQ, full/causal walks; default true): the element mask (keys past
// seq_k, the causal diagonal) only in the tiles that need it (one uniform branch per tile), as the
// forward and the library masks do; false masks every tile (the A/B baseline). Not with a
// SCORE_MOD (the branch costs the registers the mod needs: every tile is masked then) [020].
// ROWS_AHEAD (dK/dV; default true except causal at HEAD_DIM >= 128 and with LSE_IN_RING): each
// query tile's LSE and Delta are loaded while the tile before it runs, not at its top [026]. Same values.
// LSE_IN_RING (dK/dV; default false, the API's for aligned recompute calls; not with ROWS_AHEAD=true): LSE and Delta are
// copied by TMA into each Q / dO ring stage and read from shared memory where used, not exchanged
// through shared memory behind barriers [070]. LSE and Delta must then be 16-byte aligned (S % 4 ==
// 0). Same gradients.
// MASKED_BLOCKS_APART (dK/dV; default false; dense CAUSAL walks, not Q_DESCENDING or PERSISTENT): the
// query tiles that cross the diagonal in a masked loop, the rest in a loop without mask code, both
// over one Q / dO ring [063]. Same values.
// ACCUMULATE (dK/dV and dQ; default false): the gradients are f32 and receive += (the epilogue
// loads, adds and stores; each tile is one program's): gradient accumulation, and context
// parallelism's per-call sums without a separate pass. dK/dV's dQ reductions are unaffected.
// HEAVY_FIRST_SECTIONS (dK/dV: default false; dQ: default true; dense causal only, not PERSISTENT):
// the programs take their tiles heaviest first across heads, in L2-sized sections of heads
// (kernels/attention/program_order.hpp); otherwise in launch order. Same grid, same values [018].
// PERSISTENT (dK/dV, DQ_REDUCTION=3 or 1, dense, not Q_DESCENDING): DASH's schedule on a persistent grid
// (kernels/attention/backward_schedule.hpp): launch (P, 1, 1) programs, all resident at once (P <= SM count
// times the blocks one SM holds);
// program p takes items L = p, p + P, ... (key tiles, causal pairs n / N-1-n, of each (batch, KV
// head)), visits query tiles in the shift orders and waits for each add's place in the fixed
// accumulation order (kernels/attention/backward_schedule_lang.hpp). dK, dV sum the query tiles in that visit
// order, so their last bits differ from the other walks'; every run gives the same bits for one P.
// With DQ_REDUCTION=1 (atomic; no library mask): program p takes key tiles L = p, p + P, ... of all
// (batch, KV head) in launch order, each walked as without PERSISTENT (same dK, dV bits): the last
// wave and the tiles' prologues overlap, and a ring producer prefetches across tiles.
// Workspaces (f32, contiguous, 16-byte aligned; parameter after dV, before softmax_scale):
//   dQ_accum [batch, heads_q, seq_q, head_dim] (always this order, even with BSHD); must be ZERO
//     before the dK/dV kernel (atomic and ordered add into it; rows it never adds into stay 0).
//   dQ_parts [batch * heads_q, M, N, BLOCK_M, head_dim], M = cdiv(seq_q, BLOCK_M), N = cdiv(seq_k,
//     BLOCK_N) at the dK/dV kernel's tiles (kernels/attention/backward_schedule.hpp's split layout: part (n,
//     m) of head bh = b * heads_q + h is slot (bh * M + m) * N + n). The dK/dV kernel writes exactly
//     the parts of non-empty blocks (full: all; causal: n <= the last key tile query tile m sees;
//     library masks: the blocks its walk visits); the reducer reads exactly those (the same
//     geometry, the mask's key_tiles intervals, or the pre-pass's block_classes), so no zeroing is
//     needed. Rows past seq_q in the last query tile hold 0. Size 4 * B * Hq * M * N * BLOCK_M * D
//     bytes: about seq_q * seq_k / BLOCK_N * D * 4 per head (the price of a fixed order without
//     semaphores; ordered accumulation is the next step, see backward_schedule.hpp).
// Schedule (sm_90a): with the reduction the dK/dV kernel does 5 dots. The dQ dot has M = BLOCK_M;
// wgmma runs it with M a multiple of 64, and at BLOCK_M 64 on 8 warps each warpgroup computes
// half of D's columns (Layout::wgmma_split), which must be whole 64-column chunks of K: D 128.
// There 64 x 128 on 8 warps runs every dot on wgmma with dQ's B from the same shared-memory copy of
// K; D 64 on 8 warps runs the dQ dot on mma.sync (K loaded again in the loop for it), so D 64 uses
// 64 x 64 on 4 warps. A = trans(dS^T registers) goes through shared memory into the A layout. The
// [BLOCK_M, D] part is added by atomic_add on the dQ_accum window: on sm_90a written to a swizzled
// staging tile in shared memory and added by TMA (cp.reduce.async.bulk.tensor, f32 add in L2)
// [021, 024].

// Delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] (f32).
// Params: O, dO, Delta (VARLEN: cu_seqlens_q). Meta (kernels::PreprocessConfig): DTYPE, BLOCK_M,
// HEAD_DIM, BSHD, VARLEN. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_preprocess();

// dK, dV for one key block of one key/value head, summed over the query heads of its group:
// dV = sum P^T dO, dK = scale * sum dS^T Q with dS = P * (dO V^T - Delta).
// With DQ_REDUCTION, also dQ's parts dS K (atomic: into dQ_accum; split: into dQ_parts).
// Params: Q, K, V, dO, LSE, Delta, dK, dV, (DQ_REDUCTION=1: dQ_accum; =2: dQ_parts; =3: dQ_accum,
// dQ_semaphores (i32 pointer)) softmax_scale
// (f32) (VARLEN: cu_seqlens_q, cu_seqlens_k) (DROPOUT: seed_lo, seed_hi, offset_lo, offset_hi,
// keep_threshold) (DROPOUT_BITS: dropout_bits) (MASK: the mask's parameters, then without tile
// intervals q_num_blocks, q_indices, full_q_num_blocks, full_q_indices).
// Meta (kernels::DkdvConfig): DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, MASK, DROPOUT,
// DROPOUT_BITS, PARTIAL_TILES_ONLY, DQ_REDUCTION, Q_DESCENDING, MASKED_BLOCKS_APART, PERSISTENT,
// LSE_IN_RING, ROWS_AHEAD, HEAVY_FIRST_SECTIONS, SCORE_MOD, RING_PRODUCER, ACCUMULATE. Grid: (cdiv(seq_k, BLOCK_N), heads_kv, batch); PERSISTENT: (P, 1, 1).
const lang::Kernel& attention_backward_dkdv();

// dQ = scale * sum dS K for one query block.
// Params: Q, K, V, dO, LSE, Delta, dQ, softmax_scale (f32) (VARLEN: cu_seqlens_q, cu_seqlens_k)
// (DROPOUT: seed_lo, seed_hi, offset_lo, offset_hi, keep_threshold) (DROPOUT_BITS: dropout_bits)
// (MASK: the mask's parameters, then without tile intervals kv_num_blocks, kv_indices,
// full_kv_num_blocks, full_kv_indices).
// Meta (kernels::DqConfig): DTYPE, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, BSHD, VARLEN, MASK, DROPOUT,
// DROPOUT_BITS, PARTIAL_TILES_ONLY, HEAVY_FIRST_SECTIONS, SCORE_MOD, ACCUMULATE. Grid: (cdiv(seq_q, BLOCK_M),
// heads_q, batch).
const lang::Kernel& attention_backward_dq();

// DQ_REDUCTION=1 (atomic), after the dK/dV kernel: dQ = DTYPE(dQ_accum * softmax_scale).
// Params: dQ_accum (f32 [batch, heads_q, seq_q, head_dim]), dQ (DTYPE, the dQ layout: BSHD or not),
// softmax_scale (f32). Meta (kernels::DqConvertConfig): DTYPE, BLOCK_M (any), HEAD_DIM, BSHD. Grid: (cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_dq_convert();

// DQ_REDUCTION=2 (split), after the dK/dV kernel: dQ[b, h, tile m] = DTYPE(softmax_scale * sum of the
// parts (n, m) in increasing n), over the key tiles n whose block (m, n) is non-empty; 0 for none.
// Params: dQ_parts (f32 [batch * heads_q, M, N, BLOCK_M, head_dim], as the dK/dV kernel wrote it),
// dQ (DTYPE, the dQ layout), softmax_scale (f32), S_k (i32: seq_k), then with a library MASK the
// mask's parameters (mask_parameter_names order, the dK/dV kernel's values) and, for the kinds
// without tile intervals, block_classes (u8 [Bm, Hm, M, N]: the block-mask pre-pass (attention_block_classes, attention_block_lists)'s
// classes at the dK/dV kernel's BLOCK_M x BLOCK_N -- the run whose KV_MAJOR=true lists the dK/dV
// kernel reads writes them; Bm / Hm 1 broadcast).
// Meta (kernels::DqReduceConfig): DTYPE, BLOCK_M, BLOCK_N (both the dK/dV kernel's), HEAD_DIM,
// CAUSAL, BSHD, MASK (the dK/dV kernel's). Grid: (M = cdiv(seq_q, BLOCK_M), heads_q, batch).
const lang::Kernel& attention_backward_dq_reduce();

}  // namespace tilejit::kernels
