// The pieces the attention backward kernels share (backward_common.hpp).
#include "kernels/attention/backward_common.hpp"

#include <cmath>
#include <utility>

namespace tilejit::kernels::backward_detail {

using namespace lang;

HeadRows::HeadRows(Tile batch, int64_t head_dim_, bool bshd_, bool varlen_, const Tile& cu_q, const Tile& cu_k)
    : b(std::move(batch)), D(head_dim_), bshd(bshd_), varlen(varlen_) {
  if (!varlen) return;
  q_start = load(cu_q + b), q_len = load(cu_q + (b + 1)) - q_start;
  if (cu_k.valid()) k_start = load(cu_k + b), k_len = load(cu_k + (b + 1)) - k_start;
}

BlockRef HeadRows::operator()(const Tensor& t, const Operand& hh, const Operand& s0, int64_t n) const {
  if (t.rank() == rank() - 1) return varlen ? t.block({hh, s0}, {n}) : t.block({b, hh, s0}, {n});
  if (varlen) return t.block({s0, hh, 0}, {n, D}, {0, 2});
  return bshd ? t.block({b, s0, hh, 0}, {n, D}, {1, 3}) : t.block({b, hh, s0, 0}, {n, D}, {2, 3});
}

Tile HeadRows::unless_past(const Tile& first, const Tile& len, const Tile& end) const { return varlen ? where(first < len, end, 0) : end; }

Tile element_pointer(const Tensor& t, std::initializer_list<Tile> at) {
  Tile p = t.ptr();
  int dim = 0;
  for (const Tile& i : at) p = p + i * t.stride(dim++);
  return p;
}

MaskedTileWalk interval_walk(const TileRanges& r, int64_t block, std::function<Tile(const Tile& start)> full) {
  auto trips = [&](size_t run) { return cdiv(maximum(r.end[run] - r.begin[run], 0), block); };
  const Tile trips0 = trips(0);
  const Tile count = r.runs == 2 ? trips0 + trips(1) : trips0;
  return {count, [r, block, trips0, full = std::move(full)](const Tile& j) {
            Tile start = r.begin[0] + j * block;
            if (r.runs == 2) start = where(j < trips0, start, r.begin[1] + (j - trips0) * block);
            return MaskedTile{start, !full(start)};
          }};
}

MaskedTileWalk list_walk(const BlockMaskLists& lists, const Tile& b, const Tile& h, const Tile& outer, int64_t block) {
  const Tile pc = lists.partial_count(b, h, outer), fc = lists.full_count(b, h, outer);
  return {pc + fc, [&lists, b, h, outer, block, pc](const Tile& j) {
            Tile partial = j < pc;
            Tile index = where(partial, lists.partial_block(b, h, outer, where(partial, j, 0)),
                               lists.full_block(b, h, outer, where(partial, 0, j - pc)));
            return MaskedTile{index * block, partial};
          }};
}

BackwardParams::BackwardParams(Builder& kb, const AttentionSpec& spec, int64_t block_m, int64_t block_n, bool partial_tiles_only_,
                               bool row_vectors_aligned)
    : T(spec.dtype),
      BM(block_m),
      BN(block_n),
      D(spec.head_dim),
      causal(spec.causal),
      bshd(spec.bshd),
      varlen(spec.varlen),
      mask_kind(spec.mask),
      score_mod_kind(spec.score_mod),
      dropout(spec.dropout),
      dropout_bits(spec.dropout_bits),
      partial_tiles_only(partial_tiles_only_),
      rank(varlen ? 3 : 4),
      Q(kb.tensor("Q", T, rank, kRowMajor)),
      K(kb.tensor("K", T, rank, kRowMajor)),
      V(kb.tensor("V", T, rank, kRowMajor)),
      dO(kb.tensor("dO", T, rank, kRowMajor)),
      LSE(kb.tensor("LSE", f32, rank - 1, {.align_bytes = row_vectors_aligned ? 16 : 0, .contiguous_last = true})),
      Delta(kb.tensor("Delta", f32, rank - 1, {.align_bytes = row_vectors_aligned ? 16 : 0, .contiguous_last = true})) {}

void BackwardParams::declare_mask(Builder& kb, bool kv_major) {
  if (!library_mask()) return;
  mask.emplace(kb, mask_kind);
  if (!mask->has_tile_intervals()) lists.emplace(kb, kv_major);
}

void BackwardParams::declare_score_mod(Builder& kb) { smod.emplace(kb, score_mod_kind); }

Tile BackwardParams::log2_p_exponent(const Tile& raw, const Tile& lse_log2, const Tile& softmax_scale, const HeadRows& rows, const Tile& h,
                                     const Tile& m0, const Tile& n0, const Tile& S_q, const Tile& S_k, bool transposed,
                                     Tile* derivative) const {
  if (!smod || smod->kind == ScoreModKind::none) return fma(raw, softmax_scale * kLog2e, -lse_log2);
  const MaskIndices idx = mask_indices(rows.b, h, m0 + arange(0, BM), n0 + arange(0, BN), S_q, S_k);
  const Tile s = transposed ? trans(raw * softmax_scale) : raw * softmax_scale;  // [BM, BN]
  auto back = [&](const Tile& t) { return transposed ? trans(t) : t; };
  if (smod->mod.derivative) *derivative = back(smod->mod.gradient(s, idx));
  return back(smod->mod(s, idx)) * kLog2e - lse_log2;
}

HeadRows BackwardParams::sequence(Builder& kb, Tile b, std::optional<AttentionDropout>& drop, bool bits_any_strides) {
  Tile cu_q, cu_k;  // VARLEN: i32[batch + 1] offsets of the sequences in the packed tokens
  if (varlen) cu_q = kb.pointer("cu_seqlens_q", i32), cu_k = kb.pointer("cu_seqlens_k", i32);
  if (dropout) drop.emplace(kb);
  if (dropout_bits) drop->declare_bits(kb, bits_any_strides);
  HeadRows rows(std::move(b), D, bshd, varlen, cu_q, cu_k);
  Q = rows.queries(Q), dO = rows.queries(dO), LSE = rows.queries(LSE), Delta = rows.queries(Delta);
  K = rows.keys(K), V = rows.keys(V);
  return rows;
}

Tile BackwardParams::batch_head(const HeadRows& rows, const Tile& h) const { return rows.b * Q.size(rows.head_dim()) + h; }

Tile BackwardParams::group(const HeadRows& rows) const { return Q.size(rows.head_dim()) / K.size(rows.head_dim()); }

Tile BackwardParams::lse_log2_of(const Tile& lse) const { return where(lse == -INFINITY, INFINITY, lse * kLog2e); }

RowVectors BackwardParams::row_vectors(const HeadRows& rows, const Tile& h, const Tile& m0, bool in_ring) const {
  if (in_ring) return {load_at_use(rows(LSE, h, m0, BM)), load_at_use(rows(Delta, h, m0, BM))};
  return {load(rows(LSE, h, m0, BM), /*padding=*/INFINITY), load(rows(Delta, h, m0, BM))};
}

Tile BackwardParams::visible(const Tile& qrows, const Tile& keys, const Tile& S_q, const Tile& S_k) const {
  Tile v = keys < S_k;
  if (causal) v = v & (keys <= qrows + (S_k - S_q));
  return v;
}

Tile BackwardParams::partial_tile(const Tile& m0, const Tile& n0, const Tile& S_q, const Tile& S_k) const {
  Tile partial = n0 + BN > S_k;
  if (causal) partial = partial | (n0 + (BN - 1) > m0 + (S_k - S_q));
  return partial;
}

Tile BackwardParams::mask_partial(const Tile& p, const Tile& partial, const std::function<Tile()>& allowed) const {
  // not with a score mod: the branch costs the registers the mod's terms need (they spilled) [020]
  if (!partial_tiles_only || (smod && smod->kind != ScoreModKind::none)) return where(allowed(), p, 0.0f);
  Var masked = p;
  if_(partial, [&] { masked = where(allowed(), masked, 0.0f); });
  return masked;
}

}  // namespace tilejit::kernels::backward_detail
