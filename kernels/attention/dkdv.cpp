// attention_bwd_dkdv (kernels/attention/backward.hpp): one program per key tile of one key/value
// head accumulates dK and dV over the query heads of its group and the query tiles that see the
// key tile; with DQ_REDUCTION it also computes each block's part of dQ and adds or stores it.
// The steps: DkdvProgram (the configuration, the parameters in their order, the program's place),
// KeyTile (one key tile: its query heads, the walk over their query tiles, one query tile, the dQ
// part, the epilogue) and run() (the program's key tiles: its own, or PERSISTENT's items).
#include <functional>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "kernels/attention/backward.hpp"
#include "kernels/attention/backward_common.hpp"
#include "kernels/attention/backward_schedule_lang.hpp"
#include "kernels/attention/program_order.hpp"
#include "kernels/attention/timeline.hpp"

namespace tilejit::kernels {
namespace backward_detail {
namespace {

using namespace lang;

// x itself where it is a valid tensor coordinate, clamped so that the compiler can prove it lies in
// TMA's range (0 .. 2^31 - 1 - a box): a TMA store or add at such coordinates needs no run-time test
// with an element-store fallback (which the dQ writer lacks, and which holds registers) [073, 080].
Tile in_tma_range(const Tile& x) { return minimum(maximum(x, 0), std::numeric_limits<int32_t>::max() - 256); }

// The kernel's configuration and parameters, and where the program starts.
struct DkdvProgram {
  explicit DkdvProgram(Builder& kb);

  const DkdvConfig cfg;
  BackwardParams a;  // Q, K, V, dO, LSE, Delta; the mask and the score mod
  Tensor dK, dV;
  Tensor dq_ws;  // atomic, ordered: dQ_accum f32 [B, Hq, S_q, D]; split: dQ_parts f32 [B * Hq, M, N, BM, D]
  Tile dq_sem;   // ordered: i32 [B * Hq, M] semaphores (zero before the call): key tiles added so far
  Tile softmax_scale;
  std::optional<AttentionDropout> drop;
  // The program's key tile first_n of KV head first_kv_h in batch first_b (not PERSISTENT), and
  // that batch's rows (PERSISTENT: batch 0's, for the sequence lengths).
  Tile first_n, first_kv_h, first_b;
  std::optional<HeadRows> rows0;
  Tile S_q, S_k;  // dense: every batch's
  BwdScheduleLang sched{};  // PERSISTENT: DASH's schedule
  lang::DotOptions dots{.descriptors_at_use = *cfg.descriptors_at_use};  // every dot's [077]

  Tile timeline;  // TIMELINE: u64 [key tiles, kTimelineStamps, 32]

  DqReduction reduction() const { return cfg.dq_reduction; }
  // TIMELINE: each warp's cycle counter into stamp `index` (clamped to the last) of key tile
  // `key_tile` (DkdvConfig::timeline's index).
  void stamp(const Tile& key_tile, const Tile& index) const { timeline_stamp(timeline, key_tile, index, DkdvConfig::kTimelineStamps); }
};

DkdvProgram::DkdvProgram(Builder& kb)
    : cfg(DkdvConfig::read(kb)), a(kb, cfg.spec, cfg.block_m, cfg.block_n, cfg.partial_tiles_only, cfg.lse_in_ring) {
  const DqReduction r = cfg.dq_reduction;
  const ir::DType grad = cfg.accumulate ? f32 : a.T;  // ACCUMULATE: f32 sums
  dK = kb.tensor("dK", grad, a.rank, kRowMajor), dV = kb.tensor("dV", grad, a.rank, kRowMajor);
  if (r == DqReduction::atomic || r == DqReduction::ordered) dq_ws = kb.tensor("dQ_accum", f32, 4, kRowMajor);
  if (r == DqReduction::split) dq_ws = kb.tensor("dQ_parts", f32, 5, kRowMajor);
  if (r == DqReduction::ordered) dq_sem = kb.pointer("dQ_semaphores", i32);
  softmax_scale = kb.scalar<float>("softmax_scale");

  // HEAVY_FIRST_SECTIONS (dense causal; not PERSISTENT, which has its own order): the key tiles
  // heaviest first (tile 0 sees every query) across heads too, in L2-sized sections of heads
  // (kernels/attention/program_order.hpp); else in launch order (heaviest first within each head;
  // off by default here [018]). The ordered reduction stays deadlock-free with it: a head's lower
  // key tiles still start first.
  const bool sections = cfg.heavy_first_sections && !cfg.persistent && a.causal && !a.varlen;
  first_n = program_id(0);
  first_kv_h = program_id(1);
  first_b = program_id(2);
  if (sections) {
    const GridSlot slot = heavy_first_sections(/*heavy_at_end=*/false, a.Q.size(a.bshd ? 1 : 2), 2 * a.D * ir::byte_size(a.T));
    first_n = slot.tile, first_kv_h = slot.head, first_b = slot.batch;  // (Q and dO rows)
  }
  rows0.emplace(a.sequence(kb, cfg.persistent ? zeros(i32, {}) : first_b, drop));
  if (cfg.dropout_write_bits) drop->declare_bits_out(kb, cfg.dropout_words_key_major);
  a.declare_mask(kb, /*kv_major=*/true);
  a.declare_score_mod(kb);
  if (cfg.timeline) timeline = kb.pointer("timeline", u64);
  S_q = rows0->seq_len(a.Q), S_k = rows0->seq_len(a.K);
  sched = BwdScheduleLang{S_q, S_k, a.BM, a.BN, a.causal};
}

// One query head h of a key tile's group.
struct QueryHead {
  Tile h;
  Tile bh;                          // DROPOUT: the mask's batch*heads index
  std::optional<SequenceMask> seq;  // a library mask: per query head (block_sparse tables may differ)
};

// Where a query block's dQ part goes (DQ_REDUCTION ordered): the semaphore count to wait for
// before adding (invalid: n_block), and `deferred`: where to leave this add's semaphore index for
// the caller to signal later (PERSISTENT).
struct OrderedAdd {
  Tile wait_target;
  Var* deferred = nullptr;
};

// One key tile of one (batch, KV head): dK, dV over its group's query heads and query tiles.
// PERSISTENT: `slot` and `stage` say where it stands in DASH's schedule. Construct it with the
// tile after the mask's program order (key_tile()).
struct KeyTile {
  KeyTile(DkdvProgram& p, HeadRows rows, Tile n_block, Tile kv_h, const BwdScheduleLang::Slot* slot, Tile stage);

  // dK and dV over the group's query heads, then stored.
  void run();
  // The query tiles of head q, in the walk's order (the shift order, the plain range or the mask's).
  void visit_query_tiles(const QueryHead& q);
  // The walk over query tiles j in [begin, end) at m0_at(j), each with its LSE and Delta
  // (ROWS_AHEAD: loaded while the tile before it runs [026]).
  // (begin unset: 0)
  void walk_blocks(const QueryHead& q, const std::optional<Tile>& begin, const Tile& end, const std::function<Tile(const Tile&)>& m0_at,
                   const std::function<void(const Tile& j, const Tile& m0, const RowVectors&)>& body);
  // The causal walk (MASKED_BLOCKS_APART) as two loops: the blocks that need the mask, then the rest.
  void walk_causal_apart(const QueryHead& q);
  // Full and causal walks: which blocks get the element mask. by_block: those partial_tile() names,
  // tested in the block; every / none: all of them (the split's first loop) or none (its second).
  enum class CausalMask { by_block, every, none };
  // One query tile at m0: P^T, dS^T, then dV and dK accumulated and (DQ_REDUCTION) dQ's part.
  // `ahead`: its LSE and Delta; needs_mask (library masks): whether its P^T needs the element mask
  // (a partial block or keys past S_k; rows past S_q have P = 0 already: LSE = +inf there).
  void query_block(const QueryHead& q, const Tile& m0, const RowVectors& ahead, const Tile& needs_mask, const OrderedAdd& ordered = {},
                   CausalMask causal_mask = CausalMask::by_block);
  // DQ_REDUCTION: the query tile's part of dQ, dS K, added into or stored to the workspace.
  void dq_part(const QueryHead& q, const Tile& m0, const Tile& dst_t, const OrderedAdd& ordered);
  // dK = scale * sum dS^T Q, dV = sum P^T dO (DROPOUT: times 1 / keep probability), stored.
  void store_gradients();
  // TIMELINE: stamp `index` of this key tile; phase `phase` of the current query block visit; the
  // key tile's row of the timeline ((b * kv heads + kv_h) * key tiles + n_block).
  void stamp(int64_t index) const;
  void stamp_phase(int64_t phase) const;
  Tile timeline_tile() const;

  DkdvProgram& p;
  const BackwardParams& a;
  const HeadRows rows;
  const Tile n_block, kv_h;
  const BwdScheduleLang::Slot* const slot;
  const Tile stage;
  const Tile n0;
  const Tensor dK_t, dV_t;  // the rows' views
  const Tile group;
  const Tile k, v;
  const Tile keys;  // [BN, 1]: this program's blocks are transposed, S^T
  Var dk, dv;
  std::optional<Var> visit;  // TIMELINE: the query blocks visited so far
  // Causal: the first query block with a row that sees key n0 (row i sees n0 from i = n0 - diag).
  const Tile m_begin;
  const Tile m_end;
};

KeyTile::KeyTile(DkdvProgram& prog, HeadRows rows_, Tile n_block_, Tile kv_h_, const BwdScheduleLang::Slot* slot_, Tile stage_)
    : p(prog),
      a(prog.a),
      rows(std::move(rows_)),
      n_block(std::move(n_block_)),
      kv_h(std::move(kv_h_)),
      slot(slot_),
      stage(std::move(stage_)),
      n0(n_block * a.BN),
      dK_t(rows.keys(p.dK)),
      dV_t(rows.keys(p.dV)),
      group(a.group(rows)),
      k(load(rows(a.K, kv_h, n0, a.BN))),
      v(load(rows(a.V, kv_h, n0, a.BN))),
      keys((n0 + arange(0, a.BN))[col]),
      dk(zeros(f32, {a.BN, a.D})),
      dv(zeros(f32, {a.BN, a.D})),
      m_begin(a.causal ? maximum(n0 - (p.S_k - p.S_q), 0) / a.BM * a.BM : zeros(i32, {})),
      m_end(rows.unless_past(n0, p.S_k, p.S_q)) {}

Tile KeyTile::timeline_tile() const { return (rows.b * a.K.size(rows.head_dim()) + kv_h) * cdiv(p.S_k, a.BN) + n_block; }

void KeyTile::stamp(int64_t index) const {
  if (p.cfg.timeline) p.stamp(timeline_tile(), scalar_constant(i32, index));
}

void KeyTile::stamp_phase(int64_t phase) const {
  if (p.cfg.timeline) p.stamp(timeline_tile(), 1 + *visit * DkdvConfig::kTimelinePhases + phase);
}

void KeyTile::run() {
  if (p.cfg.timeline) visit.emplace(zeros(i32, {}));
  stamp(0);
  for_range(0, group, [&](Tile g) {  // the query heads of this key/value head's group
    QueryHead q;
    q.h = kv_h * group + g;
    if (a.dropout) q.bh = p.drop->batch_head(rows.b, a.Q.size(rows.head_dim()), q.h);
    if (a.mask) q.seq = a.mask->bind(rows.b, q.h, p.S_q, p.S_k);
    visit_query_tiles(q);
  });
  store_gradients();
  stamp(DkdvConfig::kTimelineStamps - 1);
}

void KeyTile::visit_query_tiles(const QueryHead& q) {
  const BwdScheduleLang& sched = p.sched;
  if (slot) {  // PERSISTENT: the shift order; each add waits for its place in the fixed order [025]
    // (DQ_WRITER: the writer defers each signal itself)
    std::optional<Var> deferred;  // the last add's semaphore, not signalled yet
    if (!p.cfg.dq_writer) deferred.emplace(full(i32, {}, -1));
    auto query_tile = [&](const Tile& t) { return sched.visit_query_tile(*slot, stage, n_block, t); };
    walk_blocks(q, std::nullopt, sched.visit_count(n_block), [&](const Tile& t) { return query_tile(t) * a.BM; },
                [&](const Tile& t, const Tile& m0, const RowVectors& rv) {
                  query_block(q, m0, rv, Tile(), {sched.wait_target(*slot, stage, n_block, query_tile(t)), deferred ? &*deferred : nullptr});
                });
    if (deferred) if_(*deferred >= 0, [&] { signal_add(p.dq_sem + *deferred, 1); });
    return;
  }
  if (!q.seq && p.cfg.masked_blocks_apart) return walk_causal_apart(q);
  if (!q.seq) {
    Tile trips = cdiv(maximum(m_end - m_begin, 0), a.BM);
    walk_blocks(q, std::nullopt, trips, [&](const Tile& j) { return m_begin + (p.cfg.q_descending ? trips - 1 - j : j) * a.BM; },
                [&](const Tile&, const Tile& m0, const RowVectors& rv) { query_block(q, m0, rv, Tile()); });
    return;
  }
  // the query blocks that see this key block: the mask's intervals or the pre-pass's lists
  auto is_full = [&](const Tile& m0) { return q.seq->tile_is_full(m0, a.BM, n0, a.BN); };
  const MaskedTileWalk walk = a.lists ? list_walk(*a.lists, rows.b, q.h, n_block, a.BM)
                                      : interval_walk(q.seq->query_tiles(n0, a.BN, a.BM), a.BM, is_full);
  Tile keys_edge = n0 + a.BN > p.S_k;
  walk_blocks(q, std::nullopt, walk.count, [&](const Tile& j) { return walk.at(j).start; },
              [&](const Tile& j, const Tile& m0, const RowVectors& rv) { query_block(q, m0, rv, walk.at(j).partial | keys_edge); });
}

void KeyTile::walk_causal_apart(const QueryHead& q) {
  // Block m0 = m_begin + j BM crosses the diagonal while m0 < n0 + BN - 1 - (S_k - S_q), i.e. for
  // j < cdiv(that - m_begin, BM); a key tile running past S_k masks every block. Both counts are
  // known before the first loop, which lets the second loop's first Q / dO tiles be prefetched
  // during the first loop's last blocks (one ring over both loops).
  const Tile trips = cdiv(maximum(m_end - m_begin, 0), a.BM);
  const Tile crossing = cdiv(maximum(n0 + (a.BN - 1) - (p.S_k - p.S_q) - m_begin, 0), a.BM);
  const Tile masked = where(n0 + a.BN > p.S_k, trips, minimum(crossing, trips));
  auto m0_at = [&](const Tile& j) { return m_begin + j * a.BM; };
  walk_blocks(q, std::nullopt, masked, m0_at,
              [&](const Tile&, const Tile& m0, const RowVectors& rv) { query_block(q, m0, rv, Tile(), {}, CausalMask::every); });
  walk_blocks(q, masked, trips, m0_at,
              [&](const Tile&, const Tile& m0, const RowVectors& rv) { query_block(q, m0, rv, Tile(), {}, CausalMask::none); });
}

void KeyTile::walk_blocks(const QueryHead& q, const std::optional<Tile>& begin, const Tile& end, const std::function<Tile(const Tile&)>& m0_at,
                          const std::function<void(const Tile& j, const Tile& m0, const RowVectors&)>& body) {
  const Operand lb = begin ? Operand(*begin) : Operand(0);
  // Blocks past the end read padding (rows past S_q), never outside the tensors.
  if (!*p.cfg.rows_ahead) {
    for_range(lb, end, [&](Tile j) {
      const Tile m0 = m0_at(j);
      body(j, m0, a.row_vectors(rows, q.h, m0, p.cfg.lse_in_ring));
    });
    return;
  }
  const RowVectors first = a.row_vectors(rows, q.h, begin ? where(end > *begin, m0_at(*begin), 0) : where(end > 0, m0_at(zeros(i32, {})), 0));
  Var lse = first.lse, delta = first.delta;
  for_range(lb, end, [&](Tile j) {
    const RowVectors current{lse, delta};
    const RowVectors next = a.row_vectors(rows, q.h, m0_at(minimum(j + 1, begin ? maximum(end - 1, *begin) : maximum(end - 1, 0))));
    lse = next.lse;
    delta = next.delta;
    body(j, m0_at(j), current);
  });
}

void KeyTile::query_block(const QueryHead& qh, const Tile& m0, const RowVectors& ahead, const Tile& needs_mask, const OrderedAdd& ordered,
                          CausalMask causal_mask) {
  const Tile& h = qh.h;
  const Tile &S_q = p.S_q, &S_k = p.S_k;
  stamp_phase(0);  // TIMELINE: the block's top
  auto q = load(rows(a.Q, h, m0, a.BM)), dout = load(rows(a.dO, h, m0, a.BM));
  // [1, BM]. LSE_IN_RING under a ring producer (two consumer warpgroups): broadcast first, so that
  // the loads at use read the ring in S^T's column layout; an op on the 1-D vector before the
  // broadcast left it in a layout of its own, converted through shared memory behind two barriers of
  // both consumer warpgroups a visit (atomic D 128 causal 1.025x, full 1.006x). One warpgroup
  // (recompute) keeps the conversion: 16 ops a thread instead of one measured 0.95-0.97x there.
  const bool at_use = p.cfg.lse_in_ring && *p.cfg.ring_producer;
  auto lse = at_use ? a.lse_log2_of(ahead.lse[row]) : a.lse_log2_of(ahead.lse)[row];
  auto delta = at_use ? a.loop_delta(ahead.delta[row], p.drop) : a.loop_delta(ahead.delta, p.drop)[row];
  Tile pt;          // P^T
  Tile mod_grad_t;  // SCORE_MOD with a derivative: d mod / d score, transposed
  const Tile st = dot(k, trans(q), p.dots);  // S^T
  // DROPOUT_AHEAD: the block's Philox words issued while S^T's MMA runs [098]
  std::optional<Tile> words_ahead;
  if (p.cfg.dropout_ahead) words_ahead = p.drop->keep_words_ahead(qh.bh, m0, a.BM, n0, a.BN);
  const Tile e_t = a.log2_p_exponent(st, lse, p.softmax_scale, rows, h, m0, n0, S_q, S_k, /*transposed=*/true, &mod_grad_t);
  stamp_phase(1);  // S^T landed (its exponent computed)
  if (qh.seq) {
    Var p_t = exp2(e_t);
    if_(needs_mask, [&] { p_t = where(trans(qh.seq->allowed(m0 + arange(0, a.BM), n0 + arange(0, a.BN))), p_t, 0.0f); });
    pt = p_t;
  } else {
    auto visible = [&] { return a.visible((m0 + arange(0, a.BM))[row], keys, S_q, S_k); };
    pt = causal_mask == CausalMask::none    ? exp2(e_t)
         : causal_mask == CausalMask::every ? where(visible(), exp2(e_t), 0.0f)
                                            : a.mask_partial(exp2(e_t), a.partial_tile(m0, n0, S_q, S_k), visible);
  }
  // DROPOUT: the block is transposed (rows are keys, columns query rows): the forward's mask of
  // (query rows m0.., keys n0..), transposed [017]; s = 1 / keep probability is applied to dV once
  // at the end
  stamp_phase(2);  // P^T
  Tile pt_kept = pt;
  Tile dpt = dot(v, trans(dout), p.dots);  // dP^T (of the dropped P: times keep * s)
  Tile dst;                        // dS^T = P^T * (dP^T - Delta)
  if (a.dropout) {
    // One use of the mask, before dV's MMA is issued (its 0 / ~0 words, one register per element,
    // then die early instead of staying live across that MMA): dS^T = P^T (Z s dP^T - Delta) =
    // (P^T Z) s dP^T - P^T Delta, Z the mask (at bf16 all of it over s: fold_dropout_scale; dK and
    // a reduction's dQ parts times s, so that dK stays bit-identical across the reductions).
    Tile keep_t = p.drop->keep_mask_transposed(qh.bh, m0, a.BM, n0, a.BN, words_ahead ? &*words_ahead : nullptr);  // [BN, BM]
    pt_kept = apply_keep_mask(pt, keep_t);
    dst = pt_kept * a.loop_dp(dpt, *p.drop) - pt * delta;
  } else {
    dst = pt * (dpt - delta);
  }
  stamp_phase(3);  // dS^T (dP^T landed)
  dv = dot(cast(a.T, pt_kept), dout, dv, p.dots);
  if (mod_grad_t.valid()) dst = dst * mod_grad_t;  // the gradient of the raw score
  auto dst_t = cast(a.T, dst);
  dk = dot(dst_t, q, dk, p.dots);
  stamp_phase(4);  // dV's and dK's MMAs issued
  if (p.reduction() != DqReduction::recompute) dq_part(qh, m0, dst_t, ordered);
  stamp_phase(5);  // dQ's part issued (its add or store)
  if (visit) *visit = *visit + 1;
}

void KeyTile::dq_part(const QueryHead& qh, const Tile& m0, const Tile& dst_t, const OrderedAdd& ordered) {
  const Tile& h = qh.h;
  const DqReduction reduction = p.reduction();
  // dS K = trans(dS^T) K [BM, D], unscaled: the convert / reduce kernel multiplies by softmax_scale
  // once, as the dQ kernel does. A is dS^T's registers transposed (the lowering moves them through
  // shared memory into the A layout). B: the program's K window, the same shared-memory copy of K
  // the S^T dots read, wherever wgmma can run this dot too: M = BLOCK_M a multiple of 64, and at
  // 64 rows on two warpgroups each takes half of D's columns, which must be whole 64-column chunks
  // (D 128). Elsewhere (e.g. D 64 on 8 warps) it falls to mma.sync, which takes B from registers;
  // a use outside wgmma would also take the K window out of shared memory for the S^T dots, so that
  // dot reads its own copy of K, loaded in the loop (it spilled otherwise) [024].
  const bool k_on_wgmma = a.BM % 64 == 0 && (a.BM >= a.BN || a.D % 128 == 0);
  Tile k_b = k_on_wgmma ? k : load(rows(a.K, kv_h, n0, a.BN));
  lang::DotOptions dq_dots = p.dots;
  dq_dots.staging_at_use = *p.cfg.dq_staging_at_use;  // (dS^T staged for wgmma's A) [103]
  Tile dq_part = dot(trans(dst_t), k_b, dq_dots);
  if (a.fold_dropout_scale()) dq_part = dq_part * p.drop->scale;  // (dS^T was divided by s)
  // dQ_accum's window. DQ_WRITER: at coordinates the compiler can prove in TMA's range (the writer
  // has no element fallback); they are (b, h, m0 index the tensor), but the causal walk's start
  // (S_k - S_q) hides it [073]
  auto window = [&] {
    auto coordinate = [&](const Tile& x) { return p.cfg.dq_writer ? in_tma_range(x) : x; };
    return p.dq_ws.block({coordinate(rows.b), coordinate(h), coordinate(m0), 0}, {a.BM, a.D}, {2, 3});
  };
  const AddOptions add{.narrow_staging = p.cfg.dq_narrow_staging};
  if (reduction == DqReduction::atomic) {
    atomic_add(window(), dq_part, add);  // on Hopper: TMA adds the tile from shared memory [024]
  } else if (reduction == DqReduction::ordered) {
    // Key blocks add into dQ tile m in increasing order: this one waits for the n_block before it
    // (every earlier key block reaches m: full, or causal, whose query range only grows towards
    // earlier keys). dQ_accum starts at zero. Waits are on lower block indices only: no deadlock
    // whatever the residency. Each add is elementwise, so the order of the key blocks fixes every
    // element's sum.
    Tile sem_index = a.batch_head(rows, h) * cdiv(p.S_q, a.BM) + m0 / a.BM;
    const Tile target = ordered.wait_target.valid() ? ordered.wait_target : n_block;
    if (p.cfg.dq_writer) {  // the writer waits for the turn, adds, and signals one add later [074]
      atomic_add(window(), dq_part, p.dq_sem + sem_index, target, p.dq_sem + sem_index, add);
      return;
    }
    // PERSISTENT: the previous block's signal is given only now, one block of work after its add
    // was issued: a signal first waits for the add's writes to complete in L2, which stalled the
    // whole program when it came right after the add [025]. Still before this block waits, so
    // every wait's predecessor has been signalled: no new waits arise.
    Var* deferred = ordered.deferred;
    if (deferred) if_(*deferred >= 0, [&] { signal_add(p.dq_sem + *deferred, 1); });
    // the add waits for its turn (on the TMA path only the issuing thread waits)
    atomic_add(window(), dq_part, p.dq_sem + sem_index, target);
    if (deferred) *deferred = sem_index;
    else signal_add(p.dq_sem + sem_index, 1);
  } else {
    store(p.dq_ws.block({a.batch_head(rows, h), m0 / a.BM, n_block, 0, 0}, {a.BM, a.D}, {3, 4}), dq_part);
  }
}

void KeyTile::store_gradients() {
  const Tile dk_out = dk * a.sum_scale(p.softmax_scale, p.drop);
  Tile dv_out = dv;
  if (a.dropout) dv_out = dv_out * p.drop->scale;
  // ACCUMULATE: f32 += (each key tile is this program's alone: no atomics), the old sums read in
  // the accumulators' layout (load_at_use): no exchange through shared memory [068]
  if (p.cfg.accumulate) {
    store(rows(dK_t, kv_h, n0, a.BN), dk_out + load_at_use(rows(dK_t, kv_h, n0, a.BN)));
    store(rows(dV_t, kv_h, n0, a.BN), dv_out + load_at_use(rows(dV_t, kv_h, n0, a.BN)));
    return;
  }
  if (!*p.cfg.tma_store) {
    store(rows(dK_t, kv_h, n0, a.BN), cast(a.T, dk_out));
    store(rows(dV_t, kv_h, n0, a.BN), cast(a.T, dv_out));
    return;
  }
  // TMA_STORE: staged in shared memory, offsets computed here (not hoisted through the loops), at
  // coordinates the compiler can prove in TMA's range -- (b, kv_h, n0) index the tensors, but the
  // persistent walk's arithmetic hides it, and the element stores of the run-time fallback held
  // their ~60 column offsets and tensor strides in registers through the query loop [080]
  HeadRows at = rows;
  at.b = in_tma_range(rows.b);
  const Tile hh = in_tma_range(kv_h), s0 = in_tma_range(n0);
  const StoreOptions late{.tma = true, .offsets_at_store = true};
  store(at(dK_t, hh, s0, a.BN), cast(a.T, dk_out), late);
  store(at(dV_t, hh, s0, a.BN), cast(a.T, dv_out), late);
}

// One key tile: the mask's program order first (heavy key blocks first), then KeyTile.
void key_tile(DkdvProgram& p, const HeadRows& rows, Tile n_block, Tile kv_h, const BwdScheduleLang::Slot* slot, const Tile& stage) {
  if (p.a.mask) std::tie(n_block, kv_h) = p.a.mask->program_order(p.a.BN, n_block, kv_h);
  KeyTile(p, rows, n_block, kv_h, slot, stage).run();
}

// The program's key tiles: its own; PERSISTENT atomic: every num_programs(0)-th key tile of all
// (batch, KV head) in launch order (the adds need no order; the grid's last wave and each tile's
// prologue and epilogue overlap the others' work, and a ring producer prefetches across tiles);
// PERSISTENT ordered: DASH's schedule (kernels/attention/backward_schedule.hpp) [025]:
// num_programs(0) programs, all resident, take the items (key tiles; causal: pairs n, N-1-n) of
// every (batch, KV head) in turn; tiles of one wave visit query tiles in the shift orders, and each
// adds into dQ[m] when the accumulation order says (wait_target), so no tile waits in the full case.
void run(DkdvProgram& p) {
  const BackwardParams& a = p.a;
  const BwdScheduleLang& sched = p.sched;
  if (!p.cfg.persistent) {
    key_tile(p, *p.rows0, p.first_n, p.first_kv_h, nullptr, Tile());
    return;
  }
  const Tile heads_kv = a.K.size(p.rows0->head_dim());
  if (p.reduction() == DqReduction::atomic) {
    const Tile key_tiles = cdiv(p.S_k, a.BN);
    for_range(program_id(0), a.K.size(0) * heads_kv * key_tiles, num_programs(0), [&](Tile linear) {
      const Tile bh = linear / key_tiles;
      HeadRows rows(bh / heads_kv, a.D, a.bshd, false);
      key_tile(p, rows, linear % key_tiles, bh % heads_kv, nullptr, Tile());
    });
    return;
  }
  // item L = (batch * KV heads + KV head) * items + i: the model's heads are the KV heads (a
  // program runs the whole query group of its KV head, in the same order for every query head)
  const Tile total = a.K.size(0) * heads_kv * sched.items_per_head();
  for_range(program_id(0), total, num_programs(0), [&](Tile linear) {
    const BwdScheduleLang::Slot s = sched.slot(linear, num_programs(0));
    HeadRows rows(s.head / heads_kv, a.D, a.bshd, false);
    for_range(0, sched.stages(s), [&](Tile stage) { key_tile(p, rows, sched.stage_tile(s, stage), s.head % heads_kv, &s, stage); });
  });
}

}  // namespace
}  // namespace backward_detail

const lang::Kernel& attention_backward_dkdv() {
  static const lang::Kernel kern = lang::kernel("attention_bwd_dkdv", [](lang::Builder& kb) {
    backward_detail::DkdvProgram p(kb);
    if (*p.cfg.ring_producer) {  // (after the parameters, as the forward's)
      const int producer = *p.cfg.producer_registers;
      lang::ring_producer({.producer_registers = producer,
                           .consumer_registers = producer > 24 ? 232 : 240,
                           .reduce_writer = p.cfg.dq_writer,
                           .coordinates_at_use = *p.cfg.coordinates_at_use});
    }
    backward_detail::run(p);
  });
  return kern;
}

}  // namespace tilejit::kernels
