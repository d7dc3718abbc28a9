// Attention forward (FlashAttention): a program takes a block of query rows, streams the key and
// value blocks, and keeps the running row max m, row sum l and output accumulator, rescaling by
// exp2(m_old - m_new) as the max grows. Variable-length batches (VARLEN) run the same code on
// views: sequence b is the slice of the packed tokens [cu_seqlens[b], cu_seqlens[b + 1]).
// How the key-block loop is arranged (the schedule) is in forward_schedules.cpp; the parameters
// and their order in forward_program.hpp; every compile-time choice in config.hpp.
#include "kernels/attention/forward.hpp"

#include <cmath>

#include "kernels/attention/forward_program.hpp"
#include "kernels/attention/program_order.hpp"
#include "kernels/attention/timeline.hpp"

namespace tilejit::kernels {
namespace forward_detail {

using namespace lang;

constexpr double kLog2e = 1.4426950408889634;  // exp(x) = exp2(x * log2 e)

ForwardProgram::ForwardProgram(Builder& kb)
    : cfg(ForwardConfig::read(kb)),
      BM(cfg.block_m),
      BN(cfg.block_n),
      D(cfg.spec.head_dim),
      causal(cfg.spec.causal),
      varlen(cfg.spec.varlen),
      general_mask(cfg.spec.library_mask()),
      rank(varlen ? 3 : 4),
      seq_dim(varlen ? 0 : cfg.spec.bshd ? 1 : 2),
      head_dim(varlen ? 1 : cfg.spec.bshd ? 2 : 1) {
  const DType T = cfg.spec.dtype;
  const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
  Q = kb.tensor("Q", T, rank, row_major), K = kb.tensor("K", T, rank, row_major), V = kb.tensor("V", T, rank, row_major);
  O = kb.tensor("O", T, rank, row_major);
  LSE = kb.tensor("LSE", f32, rank - 1, {.contiguous_last = true});  // [batch, heads, seq_q] or [heads, total_q]
  softmax_scale = kb.scalar<float>("softmax_scale");
  if (varlen) cu_q = kb.pointer("cu_seqlens_q", i32), cu_k = kb.pointer("cu_seqlens_k", i32);
  if (cfg.spec.dropout) drop.emplace(kb);
  if (cfg.return_mask) mask_out = kb.tensor("dropout_mask", u8, 3, {.contiguous_last = true});
  if (cfg.spec.dropout_bits) drop->declare_bits(kb);  // u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)]
  if (general_mask) {
    amask.emplace(kb, cfg.spec.mask);
    if (!amask->has_tile_intervals()) lists.emplace(kb, /*kv_major=*/false);
  }
  score_mod.emplace(kb, cfg.spec.score_mod);  // (its parameter comes last, but for TIMELINE's)
  if (cfg.timeline) timeline = kb.pointer("timeline", u64);
}

void ForwardProgram::stamp(const Tile& index) const {
  if (!cfg.timeline) return;
  // by tile (batch, head, query block), whichever program takes it
  Tile tile = (b * Q.size(head_dim) + h) * cdiv(Q.size(seq_dim), BM) + m_block;
  // OVERLAP_TILES' places that are no tile stamp into a spare row after the last tile
  if (*cfg.overlap_tiles) tile = where(real, tile, cdiv(Q.size(seq_dim), BM) * Q.size(head_dim) * Q.size(0));
  timeline_stamp(timeline, tile, index, ForwardConfig::kTimelineStamps);
}

void ForwardProgram::for_each_tile(const std::function<void()>& attend) {
  // PERSISTENT: a 1-D grid of any size (one program per multiprocessor) walks the tiles: with
  // the ring producer the next tile's Q and first K / V blocks are copied while this one
  // finishes. Full: tiles t = program_id, + num_programs, ..., a head's query tiles side by side
  // (its K / V shared in L2). Causal: query tile m carries m + 1 key blocks, so a program takes
  // tiles in pairs (num_m - 1 - k, k) of one head, num_m + 1 blocks each: equal work per pair, so
  // a static order balances (the hardware's greedy start does that for the non-persistent grid).
  const Tile num_m = cdiv(Q.size(seq_dim), BM), heads = Q.size(head_dim), total = num_m * heads * Q.size(0);
  const Tile P = num_programs(0), q = program_id(0);
  if (!causal) {
    for_range(q, total, P, [&](Tile t) {
      place(t % num_m, (t / num_m) % heads, t / num_m / heads);
      attend();
    });
    return;
  }
  for_range(0, tile_count(), [&](Tile i) {
    place_causal_position(i, num_m, heads, P, q);
    attend();
  });
}

void ForwardProgram::place_causal_position(const Tile& i, const Tile& num_m, const Tile& heads, const Tile& P, const Tile& q,
                                           const std::optional<Tile>& is_tile) {
  const Tile pos = 2 * ((i / 2) * P + q) + i % 2, unit = pos / num_m, within = pos % num_m;
  // (batch, head, block: the order in which GCC built them as place()'s arguments, right to left,
  // before they were named; the persistent causal kernel's IR stays the same)
  const Tile batch = unit / heads, head = unit % heads, block = where(within % 2 == 0, num_m - 1 - within / 2, within / 2);
  place(is_tile ? where(*is_tile, block, num_m) : block, head, batch);
}

Tile ForwardProgram::tile_count() const {
  const Tile num_m = cdiv(Q.size(seq_dim), BM), heads = Q.size(head_dim), total = num_m * heads * Q.size(0);
  const Tile P = num_programs(0), q = program_id(0);
  if (!causal) return where(total > q, (total - q + P - 1) / P, 0);
  // positions 2j, 2j + 1 of a head's order num_m - 1, 0, num_m - 2, 1, ... form pair j; program
  // q takes pairs q, q + P, ... (and, for an odd total, the lone last position if it is its turn)
  const Tile pairs = total / 2, mine = where(pairs > q, (pairs - q + P - 1) / P, 0);
  const Tile lone = ((total % 2) == 1) & (pairs >= q) & (((pairs - q) % P) == 0);
  return 2 * mine + where(lone, 1, 0);
}

void ForwardProgram::place_tile(const Tile& i, const Tile& is_tile) {
  // (the same order as for_each_tile's; a place that is no tile gets query block num_m: rows past
  // S_q, which TMA and the bounds checks neither read nor write, and no key blocks)
  const Tile num_m = cdiv(Q.size(seq_dim), BM), heads = Q.size(head_dim);
  const Tile P = num_programs(0), q = program_id(0);
  if (!causal) {
    const Tile t = q + i * P;
    place(where(is_tile, t % num_m, num_m), (t / num_m) % heads, t / num_m / heads);
  } else {
    place_causal_position(i, num_m, heads, P, q, is_tile);
  }
  n_end = where(is_tile, n_end, 0);
  real = is_tile;
}

void ForwardProgram::place_from_grid() {
  // Causal: the last query blocks see the most keys; they start first, so that light ones fill
  // the grid's tail -- across heads too in L2-sized sections (program_order.hpp) [decision 018].
  const bool sections = cfg.heavy_first_sections && causal && !varlen;
  Tile mb = causal ? num_programs(0) - 1 - program_id(0) : program_id(0), hh = program_id(1), bb = program_id(2);
  if (sections) {
    const GridSlot slot = heavy_first_sections(/*heavy_at_end=*/true, K.size(seq_dim), 2 * D * ir::byte_size(cfg.spec.dtype));  // K and V rows
    mb = slot.tile, hh = slot.head, bb = slot.batch;
  }
  if (amask) std::tie(mb, hh) = amask->program_order(BM, mb, hh);  // heavy query blocks first
  place(mb, hh, bb);
}

void ForwardProgram::place(const Tile& query_block, const Tile& head, const Tile& batch) {
  m_block = query_block, h = head, b = batch;
  m0 = m_block * BM;
  // Sequence b of each tensor: the tensor itself, or with VARLEN the view of its tokens
  // [cu[b], cu[b + 1]) along `dim` (i32 offsets, B + 1 of them).
  auto sequence_of = [&](const Tile& cu) {
    Tile start = load(cu + b), length = load(cu + (b + 1)) - start;
    return [=](const Tensor& t, int dim) { return t.slice(dim, start, length); };
  };
  Qs = Q, Ks = K, Vs = V, Os = O, LSEs = LSE;
  if (varlen) {
    auto q_seq = sequence_of(cu_q), k_seq = sequence_of(cu_k);
    Qs = q_seq(Q, 0), Os = q_seq(O, 0), LSEs = q_seq(LSE, 1), Ks = k_seq(K, 0), Vs = k_seq(V, 0);
  }
  S_q = Qs.size(seq_dim), S_k = Ks.size(seq_dim);
  kv_h = h / (Q.size(head_dim) / K.size(head_dim));
  qk_scale = softmax_scale * kLog2e;
  if (cfg.positive_scale) qk_scale = where(softmax_scale > 0.0f, qk_scale, NAN);  // the broken promise: NaN
  diag = S_k - S_q;
  if (cfg.spec.dropout) bh = drop->batch_head(b, Q.size(head_dim), h);  // the mask's coordinates: (bh, row, key)
  if (cfg.return_mask) local_bh = b * Q.size(head_dim) + h;
  n_end = causal ? minimum(S_k, m0 + BM + diag) : S_k;
  // a program past its (shorter) sequence's end reads no key; its stores fall outside the view
  if (varlen) n_end = where(m0 < S_q, n_end, 0);
}

BlockRef ForwardProgram::rows_of(const Tensor& t, const Tile& hh, const Operand& s0, int64_t n) const {
  if (t.rank() == rank - 1) return varlen ? t.block({hh, s0}, {n}) : t.block({b, hh, s0}, {n});
  if (varlen) return t.block({s0, hh, 0}, {n, D}, {0, 2});
  return cfg.spec.bshd ? t.block({b, s0, hh, 0}, {n, D}, {1, 3}) : t.block({b, hh, s0, 0}, {n, D}, {2, 3});
}

ForwardTile::ForwardTile(ForwardProgram& prog, const Channel* words)
    : p(prog),
      keep_words(words),
      rows(p.m0 + arange(0, p.BM)),
      q(load(p.rows_of(p.Qs, p.h, p.m0, p.BM))),
      acc(zeros(f32, {p.BM, p.D})),
      m(full(f32, {p.BM}, -INFINITY)),
      l(zeros(f32, {p.BM})) {
  if (p.general_mask) seq = p.amask->bind(p.b, p.h, p.S_q, p.S_k);
}

Tile ForwardTile::scores(const Tile& n0) const { return dot(q, trans(load(p.rows_of(p.Ks, p.kv_h, n0, p.BN))), p.dots); }

std::pair<Tile, Tile> ForwardTile::softmax_block(const Tile& n0, const Tile& partial, const Tile& s_raw,
                                                 const AttentionDropout::Ahead& ahead) {
  const ForwardConfig& c = p.cfg;
  const int64_t BM = p.BM, BN = p.BN;
  const Tile &b = p.b, &h = p.h, &S_q = p.S_q, &S_k = p.S_k, &qk_scale = p.qk_scale;
  // scores in log2 units (POSITIVE_SCALE: raw, scaled inside the exponent's fma) [009]
  Var s = c.spec.modded() ? p.score_mod->mod(s_raw * p.softmax_scale, mask_indices(b, h, rows, n0 + arange(0, BN), S_q, S_k)) * kLog2e
                          : c.positive_scale ? s_raw : s_raw * qk_scale;
  // masked only when `partial` (a uniform branch: blocks inside the mask skip the per-element
  // compare and select)
  if_(partial, [&] {
    auto cols = n0 + arange(0, BN);
    Tile valid = cols[row] < S_k;
    if (p.causal) valid = valid & (cols[row] <= rows[col] + p.diag);
    if (p.general_mask) valid = valid & seq->allowed(rows, cols);
    s = where(valid, s, -INFINITY);
  });
  auto m_new = maximum(m, max(s, 1));
  if (row_max_stamp) p.stamp(*row_max_stamp);  // TIMELINE: S has landed
  // rows with no visible key so far keep m = -inf: exponentiate against 0 instead of -inf
  auto m_use = where(m_new == -INFINITY, 0.0f, m_new);
  Tile prob = c.positive_scale ? exp2(fma(s, qk_scale, (-(m_use * qk_scale))[col])) : exp2(s - m_use[col]);
  Tile alpha = c.positive_scale ? exp2((m - m_use) * qk_scale) : exp2(m - m_use);
  l = l * alpha + sum(prob, 1);  // the undropped row sum: LSE is that of softmax(S)
  const DType T = c.spec.dtype;
  Tile p16;
  if (c.spec.dropout && c.dropout_pairs) {
    // Dropped probabilities zeroed after rounding, a pair at a time [011]; the uniform 1 / keep
    // probability scale is applied once to the output.
    Tile pairs = p.drop->keep_pairs_of(ahead, p.bh, p.m0, BM, n0, BN);
    p16 = apply_keep_pairs(cast(T, prob), pairs);
    if (c.return_mask) store(p.mask_out.block({p.local_bh, p.m0, n0}, {BM, BN}), cast(u8, unpack_pairs(u16, pairs) & 1));
  } else if (c.spec.dropout) {
    // per element: an AND with a 0 / ~0 mask, not where() (LLVM sinks a select past the bf16
    // conversion)
    Tile keep = p.drop->keep_mask_of(ahead, p.bh, p.m0, BM, n0, BN);
    p16 = cast(T, apply_keep_mask(prob, keep));
    if (c.return_mask) store(p.mask_out.block({p.local_bh, p.m0, n0}, {BM, BN}), cast(u8, keep & 1u));
  } else {
    p16 = cast(T, prob);
  }
  m = m_new;
  return std::pair{p16, alpha};
}

AttentionDropout::Ahead ForwardTile::mask_ahead(const Tile& n0, const Tile& j) const {
  // DROPOUT_AHEAD: the block's mask inputs right after its S = Q K^T is issued, to run while the
  // tensor cores compute S: the packed words' loads (the default with DROPOUT_BITS) [013] or the
  // fused Philox calls (slower) [012]. RNG_WARPS: the words from the RNG role.
  if (keep_words) return AttentionDropout::Ahead{std::nullopt, keep_words->pop(j)};
  return p.drop && *p.cfg.dropout_ahead ? p.drop->keep_ahead(p.bh, p.m0, p.BM, n0, p.BN) : AttentionDropout::Ahead{};
}

void ForwardTile::key_block(const Tile& n0, const Tile& partial, const Tile& s_raw, const AttentionDropout::Ahead& ahead) {
  auto [p16, alpha] = softmax_block(n0, partial, s_raw, ahead);
  // O = O * alpha + P V: rescaled, then accumulated onto by the MMA (its own accumulator)
  Tile v = load(p.rows_of(p.Vs, p.kv_h, n0, p.BN)), rescaled = *p.cfg.lazy_rescale ? scale_lazily(acc, alpha[col]) : acc * alpha[col];
  in_turn([&] { acc = dot(p16, v, rescaled, p.dots); });
}

void ForwardTile::in_turn(const std::function<void()>& issue) const {
  if (*p.cfg.pingpong) warpgroup_turn(issue);
  else issue();
}

KeyBlocks ForwardTile::key_blocks() {
  const int64_t BN = p.BN;
  KeyBlocks kb;
  if (!p.general_mask) {
    // Only a block that crosses the last key or (causal) the first row's diagonal needs a mask.
    kb.trips = cdiv(p.n_end, BN);
    kb.at = [this, BN](const Tile& j) {
      Tile n0 = j * BN, edge = n0 + BN > p.S_k;
      if (p.causal) edge = edge | (n0 + BN - 1 > p.m0 + p.diag);
      return std::pair{n0, edge};
    };
  } else if (p.lists) {
    // From the pre-pass's lists: the partial blocks, then the full ones.
    const Tile &b = p.b, &h = p.h, &m_block = p.m_block;
    Tile pc = p.lists->partial_count(b, h, m_block), fc = p.lists->full_count(b, h, m_block);
    kb.trips = pc + fc;
    kb.at = [this, pc, BN](const Tile& j) {
      Tile partial = j < pc;
      Tile index = where(partial, p.lists->partial_block(p.b, p.h, p.m_block, minimum(j, maximum(pc - 1, 0))),
                         p.lists->full_block(p.b, p.h, p.m_block, maximum(j - pc, 0)));
      Tile n0 = index * BN;
      return std::pair{n0, partial | (n0 + BN > p.S_k)};
    };
  } else {
    // From the mask's key-tile intervals (scalar arithmetic): one or two runs of blocks.
    const TileRanges r = seq->key_tiles(p.m0, p.BM, BN);
    Tile trips0 = cdiv(maximum(r.end[0] - r.begin[0], 0), BN);
    kb.trips = r.runs == 2 ? trips0 + cdiv(maximum(r.end[1] - r.begin[1], 0), BN) : trips0;
    kb.at = [this, r, trips0, BN](const Tile& j) {
      Tile n0 = r.runs == 2 ? where(j < trips0, r.begin[0] + j * BN, r.begin[1] + (j - trips0) * BN) : r.begin[0] + j * BN;
      return std::pair{n0, (!seq->tile_is_full(p.m0, p.BM, n0, BN)) | (n0 + BN > p.S_k)};
    };
  }
  if (p.general_mask && (*p.cfg.pipeline_pv || *p.cfg.pipeline_qk)) {
    // The pipelined loops read block 0 (and the last V) even when a query tile sees no key (a
    // block-sparse row of zeros): key block 0, masked element by element (nothing allowed), not an
    // unwritten list entry or an empty interval's start.
    Tile empty = kb.trips == 0;
    kb.at = [at = kb.at, empty](const Tile& j) {
      auto [n0, partial] = at(j);
      return std::pair{where(empty, zeros(i32, {}), n0), partial | empty};
    };
  }
  return kb;
}

void ForwardTile::finish() { finish_tile(p, acc, m, l); }

void finish_tile(const ForwardProgram& p, const Tile& acc, const Tile& m, const Tile& l) {
  // A row that sees no key (causal with S_q > S_k, or S_k = 0) outputs 0 and LSE = -inf. A NaN
  // row sum (NaN or infinite inputs, or POSITIVE_SCALE's broken promise) stays NaN, as in
  // PyTorch's attention: `seen` only tells key-less rows (l = 0) apart.
  auto seen = (l > 0.0f) | (l != l);
  // rcp, not '/', by default: a division's slow path is a subroutine call, and ptxas then
  // serialises every wgmma [002]
  Tile out = *p.cfg.exact_normalize ? acc / l[col] : acc * rcp(l)[col];
  if (p.cfg.spec.dropout) out = out * p.drop->scale;
  // (the stamp inside the argument: the ops are created in the order they always were)
  store(p.rows_of(p.Os, p.h, p.m0, p.BM), [&] {
          Tile o16 = cast(p.cfg.spec.dtype, where(seen[col], out, 0.0f));
          p.stamp(ForwardConfig::kTimelineEpilogue + 1);  // TIMELINE: O normalised (the last P V landed)
          return o16;
        }(), {.tma = *p.cfg.tma_store, .offsets_at_store = *p.cfg.store_offsets_late});
  p.stamp(ForwardConfig::kTimelineEpilogue + 2);  // TIMELINE: O stored (issued)
  Tile m_log2 = p.cfg.positive_scale ? m * p.qk_scale : Tile(m);
  store(p.rows_of(p.LSEs, p.h, p.m0, p.BM), where(seen, (m_log2 + log2(l)) * 0.6931471805599453, -INFINITY));  // natural log
  p.stamp(ForwardConfig::kTimelineStamps - 1);
}

}  // namespace forward_detail

const lang::Kernel& attention_forward() {
  using namespace forward_detail;
  static const lang::Kernel k = lang::kernel("attention_fwd", [](lang::Builder& kb) {
    ForwardProgram p(kb);
    if (*p.cfg.ring_producer) lang::ring_producer({.coordinates_at_use = *p.cfg.coordinates_at_use});
    std::optional<lang::Channel> keep_words;  // RNG_WARPS: u32 [BM, BN / 32] per key block
    if (p.cfg.rng_warps) keep_words.emplace(lang::u32, ir::Shape{p.BM, p.BN / 32}, 2);
    auto attend = [&] {
      ForwardTile t(p, keep_words ? &*keep_words : nullptr);
      const KeyBlocks blocks = t.key_blocks();
      if (*p.cfg.pipeline_pv) key_block_loop_pipeline_pv(t, blocks);
      else key_block_loop(t, blocks);
      t.finish();
    };
    if (*p.cfg.overlap_tiles) {
      overlapped_tiles(p);
    } else if (*p.cfg.persistent) {
      p.for_each_tile(attend);
    } else {
      p.place_from_grid();  // (at the top level: RNG_WARPS' roles both read it)
      if (!keep_words) attend();
      else with_rng_warps(p, *keep_words, attend);
    }
  });
  return k;
}

}  // namespace tilejit::kernels
