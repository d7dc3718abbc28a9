// attention_bwd_dq (kernels/attention/backward.hpp): one program per query tile accumulates dQ =
// scale * sum dS K over the key tiles it sees, recomputing S and P (the recompute reduction's
// second kernel). The steps: DqProgram (the configuration, the parameters in their order, the
// program's place and rows), key_block (one key tile) and run() (the walk, then the store).
#include <optional>
#include <tuple>

#include "kernels/attention/backward.hpp"
#include "kernels/attention/backward_common.hpp"
#include "kernels/attention/program_order.hpp"

namespace tilejit::kernels {
namespace backward_detail {
namespace {

using namespace lang;

// The kernel's configuration and parameters, and the program's query tile.
struct DqProgram {
  explicit DqProgram(Builder& kb);

  const DqConfig cfg;
  BackwardParams a;  // Q, K, V, dO, LSE, Delta; the mask and the score mod
  Tensor dQ;
  Tile softmax_scale;
  std::optional<AttentionDropout> drop;
  // the program's place: query tile m_block (rows m0..) of query head h in batch b
  Tile m_block, h, b;
  std::optional<HeadRows> rows;
  Tile m0, S_q, S_k, kv_h;
};

DqProgram::DqProgram(Builder& kb) : cfg(DqConfig::read(kb)), a(kb, cfg.spec, cfg.block_m, cfg.block_n, cfg.partial_tiles_only) {
  dQ = kb.tensor("dQ", cfg.accumulate ? f32 : a.T, a.rank, kRowMajor);  // ACCUMULATE: f32 sums
  softmax_scale = kb.scalar<float>("softmax_scale");

  // Heavy query blocks first (longest job first: the last programs launched are light, so the
  // grid's tail is short): a causal block m sees m + 1 key blocks, so the walk is descending.
  // HEAVY_FIRST_SECTIONS (default, dense causal): across heads too, in L2-sized sections of heads
  // (kernels/attention/program_order.hpp); else within each head only [018].
  const bool sections = cfg.heavy_first_sections && a.causal && !a.varlen;
  m_block = a.causal ? num_programs(0) - 1 - program_id(0) : program_id(0);
  h = program_id(1);
  b = program_id(2);
  if (sections) {
    const GridSlot slot = heavy_first_sections(/*heavy_at_end=*/true, a.K.size(a.bshd ? 1 : 2), 2 * a.D * ir::byte_size(a.T));
    m_block = slot.tile, h = slot.head, b = slot.batch;  // (K and V rows)
  }
  rows.emplace(a.sequence(kb, b, drop, cfg.dropout_words_key_major));
  a.declare_mask(kb, /*kv_major=*/false);
  a.declare_score_mod(kb);
  if (a.mask) std::tie(m_block, h) = a.mask->program_order(a.BM, program_id(0), h);
  m0 = m_block * a.BM;
  dQ = rows->queries(dQ);
  S_q = rows->seq_len(a.Q), S_k = rows->seq_len(a.K);
  kv_h = h / a.group(*rows);
}

// dQ of one query tile over its key tiles.
struct QueryTile {
  explicit QueryTile(DqProgram& p);

  // One key block at n0; needs_mask (library masks): whether its P needs the element mask (a
  // partial block or keys past S_k).
  void key_block(const Tile& n0, const Tile& needs_mask);
  // Every key block the tile sees, then dQ = scale * sum dS K stored.
  void run();

  DqProgram& p;
  const BackwardParams& a;
  const HeadRows& rows;
  const Tile q, dout;
  const RowVectors row_vectors;  // LSE and Delta, as loaded
  const Tile lse;                // [BM, 1], log2 units
  const Tile delta;              // [BM, 1] (BackwardParams::fold_dropout_scale: Delta / s)
  const Tile qrows;              // [BM, 1]
  Var dq;
  Tile bh;                          // DROPOUT: the mask's batch*heads index
  std::optional<SequenceMask> seq;  // a library mask
};

QueryTile::QueryTile(DqProgram& prog)
    : p(prog),
      a(prog.a),
      rows(*prog.rows),
      q(load(rows(a.Q, p.h, p.m0, a.BM))),
      dout(load(rows(a.dO, p.h, p.m0, a.BM))),
      row_vectors(a.row_vectors(rows, p.h, p.m0)),
      lse(a.lse_log2_of(row_vectors.lse)[col]),
      delta(a.loop_delta(row_vectors.delta, prog.drop)[col]),
      qrows((p.m0 + arange(0, a.BM))[col]),
      dq(zeros(f32, {a.BM, a.D})) {
  if (a.dropout) bh = p.drop->batch_head(rows.b, a.Q.size(rows.head_dim()), p.h);
  if (a.mask) seq = a.mask->bind(rows.b, p.h, p.S_q, p.S_k);
}

void QueryTile::key_block(const Tile& n0, const Tile& needs_mask) {
  const Tile &h = p.h, &m0 = p.m0, &S_q = p.S_q, &S_k = p.S_k;
  auto k = load(rows(a.K, p.kv_h, n0, a.BN)), v = load(rows(a.V, p.kv_h, n0, a.BN));
  // DROPOUT_BITS: the block's mask words loaded before its dots, their global-load latency under
  // S's and dP's wgmmas (loaded at the use they came after dP's wait, every block) [095]
  AttentionDropout::Ahead ahead;
  if (p.cfg.dropout_ahead) ahead = p.drop->keep_ahead(bh, m0, a.BM, n0, a.BN);
  Tile pm;
  Tile mod_grad;  // SCORE_MOD with a derivative: d mod / d score
  const Tile e = a.log2_p_exponent(dot(q, trans(k)), lse, p.softmax_scale, rows, h, m0, n0, S_q, S_k, /*transposed=*/false, &mod_grad);
  if (seq) {
    Var masked = exp2(e);
    if_(needs_mask, [&] { masked = where(seq->allowed(m0 + arange(0, a.BM), n0 + arange(0, a.BN)), masked, 0.0f); });
    pm = masked;
  } else {
    pm = a.mask_partial(exp2(e), a.partial_tile(m0, n0, S_q, S_k), [&] { return a.visible(qrows, (n0 + arange(0, a.BN))[row], S_q, S_k); });
  }
  Tile dp = dot(dout, trans(v));  // dP (of the dropped P: times keep * s)
  // (bf16: s folded out of the loop, dS / s = P * (Z dP - Delta / s), times s once in run() [091])
  if (a.dropout) dp = apply_keep_mask(a.loop_dp(dp, *p.drop), p.drop->keep_mask_of(ahead, bh, m0, a.BM, n0, a.BN));
  Tile ds = pm * (dp - delta);  // dS = P * (dP - Delta)
  if (mod_grad.valid()) ds = ds * mod_grad;  // the gradient of the raw score
  dq = dot(cast(a.T, ds), k, dq);
}

void QueryTile::run() {
  const Tile &h = p.h, &m0 = p.m0, &S_q = p.S_q, &S_k = p.S_k;
  if (seq) {
    // the key blocks this query block sees: the mask's intervals or the pre-pass's lists [039]
    auto is_full = [&](const Tile& n0) { return seq->tile_is_full(m0, a.BM, n0, a.BN); };
    const MaskedTileWalk walk = a.lists ? list_walk(*a.lists, rows.b, h, p.m_block, a.BN)
                                        : interval_walk(seq->key_tiles(m0, a.BM, a.BN), a.BN, is_full);
    for_range(0, walk.count, [&](Tile j) {
      const MaskedTile t = walk.at(j);
      key_block(t.start, t.partial | (t.start + a.BN > S_k));
    });
  } else {
    // Causal: stop after the last key the block's last row sees (none for key-less blocks).
    Tile n_end = rows.unless_past(m0, S_q, a.causal ? minimum(S_k, m0 + a.BM + (S_k - S_q)) : S_k);
    for_range(0, n_end, a.BN, [&](Tile n0) { key_block(n0, Tile()); });
  }
  // ACCUMULATE: f32 += (each query tile is this program's alone), the old sums read in dQ's MMA
  // layout (load_at_use) where they are added: no exchange through 32 KB of shared memory at D 128,
  // which halved the programs per SM [068]
  const Tile sum_scale = a.sum_scale(p.softmax_scale, p.drop);
  if (p.cfg.accumulate)
    store(rows(p.dQ, h, m0, a.BM), dq * sum_scale + load_at_use(rows(p.dQ, h, m0, a.BM)));
  else
    store(rows(p.dQ, h, m0, a.BM), cast(a.T, dq * sum_scale));
}

}  // namespace
}  // namespace backward_detail

const lang::Kernel& attention_backward_dq() {
  static const lang::Kernel kern = lang::kernel("attention_bwd_dq", [](lang::Builder& kb) {
    backward_detail::DqProgram p(kb);
    backward_detail::QueryTile(p).run();
  });
  return kern;
}

}  // namespace tilejit::kernels
