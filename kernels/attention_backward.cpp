// Attention backward (FlashAttention-2, deterministic): Delta = rowsum(dO * O) first; then one
// program per key block accumulates dK and dV over the query heads of its group and the query
// blocks that see it, and one program per query block accumulates dQ over the key blocks it sees.
// Both recompute P = exp2(S * scale * log2 e - LSE * log2 e) from the forward's LSE.
#include "kernels/attention_backward.hpp"

#include <cmath>

namespace tilejit::kernels {

using namespace lang;

namespace {

constexpr double kLog2e = 1.4426950408889634;
const ParamSpec kRowMajor{.align_bytes = 16, .contiguous_last = true};

// Where the rows of one (batch, head) live: every window the backward kernels read or write comes
// from here, and so do the sequence lengths. (Variable-length batches change only this.)
struct HeadRows {
  Tile b;  // the batch
  int64_t D;
  bool bshd;  // tensors are [batch, seq, heads, head_dim] (else [batch, heads, seq, head_dim])

  int seq_dim() const { return bshd ? 1 : 2; }
  int head_dim() const { return bshd ? 2 : 1; }
  Tile seq_len(const Tensor& t) const { return t.size(seq_dim()); }
  // Rows [s0, s0 + n) of head hh: an [n, D] window of a rank-4 tensor in either layout, or [n] of
  // a [batch, heads, seq] statistics tensor (LSE, Delta).
  BlockRef operator()(const Tensor& t, const Operand& hh, const Operand& s0, int64_t n) const {
    if (t.rank() == 3) return t.block({b, hh, s0}, {n});
    return bshd ? t.block({b, s0, hh, 0}, {n, D}, {1, 3}) : t.block({b, hh, s0, 0}, {n, D}, {2, 3});
  }
};

// The meta-parameters and leading parameters (Q, K, V, dO, LSE, Delta) of the dK/dV and dQ kernels.
struct BackwardParams {
  DType T;
  int64_t BM, BN, D;
  bool causal, bshd;
  Tensor Q, K, V, dO, LSE, Delta;

  explicit BackwardParams(Builder& kb)
      : T(kb.meta_dtype("DTYPE", bf16)),
        BM(kb.meta<int>("BLOCK_M", 64)),
        BN(kb.meta<int>("BLOCK_N", 64)),
        D(kb.meta<int>("HEAD_DIM", 64)),
        causal(kb.meta<bool>("CAUSAL", false)),
        bshd(kb.meta<bool>("BSHD", false)),
        Q(kb.tensor("Q", T, 4, kRowMajor)),
        K(kb.tensor("K", T, 4, kRowMajor)),
        V(kb.tensor("V", T, 4, kRowMajor)),
        dO(kb.tensor("dO", T, 4, kRowMajor)),
        LSE(kb.tensor("LSE", f32, 3, {.contiguous_last = true})),
        Delta(kb.tensor("Delta", f32, 3, {.contiguous_last = true})) {}

  // Query heads per key/value head (grouped-query attention).
  Tile group(const HeadRows& rows) const { return Q.size(rows.head_dim()) / K.size(rows.head_dim()); }
  // The LSE of rows [m0, m0 + BM) of head h in log2 units, +inf for a row that sees no key
  // (LSE = -inf) or lies past the end: its P = exp2(s - inf) = 0, never exp2(-inf - -inf) = NaN.
  Tile lse_log2(const HeadRows& rows, const Tile& h, const Tile& m0) const {
    auto lse = load(rows(LSE, h, m0, BM), /*padding=*/INFINITY);
    return where(lse == -INFINITY, INFINITY, lse * kLog2e);
  }
  // Which (query row, key) pairs count: keys inside the sequence and, when causal, the forward's
  // bottom-right alignment (row i sees keys j <= i + S_k - S_q). Arguments broadcast to the block.
  Tile visible(const Tile& qrows, const Tile& keys, const Tile& S_q, const Tile& S_k) const {
    Tile v = keys < S_k;
    if (causal) v = v & (keys <= qrows + (S_k - S_q));
    return v;
  }
};

}  // namespace

const Kernel& attention_backward_preprocess() {
  static const Kernel kern = kernel("attention_bwd_preprocess", [](Builder& kb) {
    auto T = kb.meta_dtype("DTYPE", bf16);
    auto BM = kb.meta<int>("BLOCK_M", 64), D = kb.meta<int>("HEAD_DIM", 64);
    auto bshd = kb.meta<bool>("BSHD", false);
    auto O = kb.tensor("O", T, 4, kRowMajor), dO = kb.tensor("dO", T, 4, kRowMajor);
    auto Delta = kb.tensor("Delta", f32, 3, {.contiguous_last = true});
    auto m0 = program_id(0) * BM, h = program_id(1);
    HeadRows rows{program_id(2), D, bshd};
    auto o = cast(f32, load(rows(O, h, m0, BM))), dout = cast(f32, load(rows(dO, h, m0, BM)));
    store(rows(Delta, h, m0, BM), sum(o * dout, 1));
  });
  return kern;
}

const Kernel& attention_backward_dkdv() {
  static const Kernel kern = kernel("attention_bwd_dkdv", [](Builder& kb) {
    BackwardParams a(kb);
    auto dK = kb.tensor("dK", a.T, 4, kRowMajor), dV = kb.tensor("dV", a.T, 4, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    auto qk_scale = softmax_scale * kLog2e;

    auto n0 = program_id(0) * a.BN, kv_h = program_id(1);
    HeadRows rows{program_id(2), a.D, a.bshd};
    auto S_q = rows.seq_len(a.Q), S_k = rows.seq_len(a.K);
    auto group = a.group(rows);
    auto k = load(rows(a.K, kv_h, n0, a.BN)), v = load(rows(a.V, kv_h, n0, a.BN));
    auto keys = (n0 + arange(0, a.BN))[col];  // [BN, 1]: this program's blocks are transposed, S^T
    Var dk = zeros(f32, {a.BN, a.D});
    Var dv = zeros(f32, {a.BN, a.D});
    // Causal: the first query block with a row that sees key n0 (row i sees n0 from i = n0 - diag).
    Tile m_begin = a.causal ? maximum(n0 - (S_k - S_q), 0) / a.BM * a.BM : zeros(i32, {});
    for_range(0, group, [&](Tile g) {  // the query heads of this key/value head's group
      auto h = kv_h * group + g;
      for_range(m_begin, S_q, a.BM, [&](Tile m0) {
        auto q = load(rows(a.Q, h, m0, a.BM)), dout = load(rows(a.dO, h, m0, a.BM));
        auto lse = a.lse_log2(rows, h, m0)[row];  // [1, BM]
        auto delta = load(rows(a.Delta, h, m0, a.BM))[row];
        auto qrows = (m0 + arange(0, a.BM))[row];
        auto pt = where(a.visible(qrows, keys, S_q, S_k), exp2(dot(k, trans(q)) * qk_scale - lse), 0.0f);  // P^T
        dv = dot(cast(a.T, pt), dout, dv);
        auto dst = pt * (dot(v, trans(dout)) - delta);  // dS^T = P^T * (dP^T - Delta)
        dk = dot(cast(a.T, dst), q, dk);
      });
    });
    store(rows(dK, kv_h, n0, a.BN), cast(a.T, dk * softmax_scale));
    store(rows(dV, kv_h, n0, a.BN), cast(a.T, dv));
  });
  return kern;
}

const Kernel& attention_backward_dq() {
  static const Kernel kern = kernel("attention_bwd_dq", [](Builder& kb) {
    BackwardParams a(kb);
    auto dQ = kb.tensor("dQ", a.T, 4, kRowMajor);
    auto softmax_scale = kb.scalar<float>("softmax_scale");
    auto qk_scale = softmax_scale * kLog2e;

    auto m0 = program_id(0) * a.BM, h = program_id(1);
    HeadRows rows{program_id(2), a.D, a.bshd};
    auto S_q = rows.seq_len(a.Q), S_k = rows.seq_len(a.K);
    auto kv_h = h / a.group(rows);
    auto q = load(rows(a.Q, h, m0, a.BM)), dout = load(rows(a.dO, h, m0, a.BM));
    auto lse = a.lse_log2(rows, h, m0)[col];  // [BM, 1]
    auto delta = load(rows(a.Delta, h, m0, a.BM))[col];
    auto qrows = (m0 + arange(0, a.BM))[col];
    Var dq = zeros(f32, {a.BM, a.D});
    // Causal: stop after the last key the block's last row sees (none for key-less blocks).
    Tile n_end = a.causal ? minimum(S_k, m0 + a.BM + (S_k - S_q)) : S_k;
    for_range(0, n_end, a.BN, [&](Tile n0) {
      auto k = load(rows(a.K, kv_h, n0, a.BN)), v = load(rows(a.V, kv_h, n0, a.BN));
      auto keys = (n0 + arange(0, a.BN))[row];
      auto p = where(a.visible(qrows, keys, S_q, S_k), exp2(dot(q, trans(k)) * qk_scale - lse), 0.0f);
      auto ds = p * (dot(dout, trans(v)) - delta);  // dS = P * (dP - Delta)
      dq = dot(cast(a.T, ds), k, dq);
    });
    store(rows(dQ, h, m0, a.BM), cast(a.T, dq * softmax_scale));
  });
  return kern;
}

}  // namespace tilejit::kernels
