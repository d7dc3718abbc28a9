// The host (plain C++) twin of the attention mask library (kernels/attention/mask.hpp): what every
// mask pattern allows, element by element, its interval description, block classification and the
// count of unmasked elements. Tests and reference implementations use it; no tilejit dependency.
// Each pattern is one struct in mask_patterns.hpp (its name, parameters and element predicate, the
// predicate shared with the DSL's SequenceMask::allowed); this header evaluates it on host values.
//
// Coordinates. A mask is a function of (b, h, q, k): batch b, query head h, query row q in
// [0, S_q), key k in [0, S_k). Query row q sits at key position p = q + (S_k - S_q): the last query
// is aligned with the last key (FlashAttention's bottom-right convention when S_q != S_k, the one
// the attention kernels use for causal masks). Every pattern but block_sparse is written in terms
// of p; with S_q > S_k the first S_q - S_k rows have p < 0 (no key precedes them).
//
// The patterns (w_l = window_left, w_r = window_right, G = global_tokens, doc = document ids of
// the key tokens, P = prefix_lengths[b]); (q, k) is allowed iff:
//   full                   always
//   causal                 k <= p
//   sliding_window         p - w_l <= k <= p + w_r          (symmetric |p - k| <= w: w_l = w_r = w)
//   causal_sliding_window  p - w_l <= k <= p                (the w_l keys before p, and p itself)
//   global_sliding_window  k < G  or  p < G  or  p - w_l <= k <= p + w_r
//                          (Longformer/BigBird: the first G tokens see and are seen by everyone)
//   document               0 <= p < S_k and doc[p] == doc[k]          (packed sequences, bidirectional)
//   causal_document        0 <= p < S_k and doc[p] == doc[k] and k <= p
//   prefix_lm              k <= p  or  k < P               (bidirectional in the prefix, causal after)
//   share_question         0 <= p < S_k and k <= p and (doc[k] == doc[p] or doc[k] == doc[0])
//                          (the Long-Context Attention Benchmark's pattern: the segment holding
//                          token 0 is the question; every other segment is an answer that sees the
//                          question and itself, causally; the question sees itself causally)
//   causal_blockwise       0 <= p < S_k and k <= p and (doc[k] == doc[p] or doc[p] == doc[S_k - 1])
//                          (the benchmark's pattern: every segment attends to itself causally, the
//                          last segment -- the one holding the last key -- attends to everything before it)
//   block_sparse           table[b'][h'][q / block_q][k / block_k] != 0  (b' = b or 0, h' = h or 0
//                          when the table's batch or head dim is 1: it broadcasts). Indexed by the
//                          query ROW q, not p: the table tiles the [S_q, S_k] score matrix.
// doc: i32 [B or 1, S_k] (a batch dim of 1 broadcasts); segments are the maximal runs of equal ids.
// prefix_lengths: i32 [B], values >= 0. table: u8 [B or 1, H or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)].
// Windows, G, block sizes and sequence lengths are at most 2^29, so that the kernels' i32
// position arithmetic (sums of three such values, e.g. n1 + w_l - (S_k - S_q)) cannot overflow.
//
// Block classes (FlexAttention's BlockMask): tile (qb, kb) covers rows [qb*BM, qb*BM + BM) and keys
// [kb*BN, kb*BN + BN) clipped to [0, S_q) x [0, S_k); it is empty when no element inside the clip
// is allowed, full when every element inside it is, partial otherwise. A full tile that crosses S_k
// still needs the kernel's own bounds mask (keys >= S_k), as the kernels apply today.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention/mask_patterns.hpp"

namespace tilejit::kernels {

inline const char* mask_kind_name(MaskKind k) {
  return visit_mask_pattern(k, [](auto p) { return decltype(p)::name; }, "unknown");
}

inline std::string mask_kind_list() {
  std::string s;
  for (int i = 0; i < kMaskKindCount; ++i) s += (i ? ", " : "") + std::to_string(i) + " " + mask_kind_name(MaskKind(i));
  return s;
}

// Which per-token data a kind reads: document ids (the segment patterns), prefix lengths, a block table.
inline bool mask_uses_doc_ids(MaskKind k) {
  return visit_mask_pattern(k, [](auto p) { return decltype(p)::uses_doc_ids; }, false);
}
// Whether the kernels can classify tiles with scalar arithmetic alone (AttentionMask's key_tiles,
// query_tiles, tile_is_full); the other kinds need the block-mask pre-pass (attention_block_classes, attention_block_lists).
inline bool mask_has_tile_intervals(MaskKind k) {
  return visit_mask_pattern(k, [](auto p) { return decltype(p)::has_tile_intervals; }, false);
}

// The runtime parameters a kind adds to a kernel, in declaration order (after the kernel's own):
// scalars are i32, mask_doc_ids an i32 [B or 1, S_k] tensor, mask_prefix_lengths an i32 [B]
// tensor, mask_block_table a u8 [B or 1, H or 1, nQB, nKB] tensor.
inline std::vector<std::string> mask_parameter_names(MaskKind k) {
  return visit_mask_pattern(
      k, [](auto p) { return std::vector<std::string>(decltype(p)::parameters.begin(), decltype(p)::parameters.end()); },
      std::vector<std::string>{});
}

// A mask pattern and its integer parameters (the fields a kind does not use are ignored).
struct MaskSpec {
  MaskKind kind = MaskKind::full;
  int64_t window_left = 0;    // keys before the query's position a window includes
  int64_t window_right = 0;   // keys after it (sliding_window, global_sliding_window)
  int64_t global_tokens = 0;  // G of global_sliding_window
  int64_t block_q = 0;        // block_sparse: the table's query rows per block
  int64_t block_k = 0;        // and keys per block

  static MaskSpec full() { return {MaskKind::full}; }
  static MaskSpec causal() { return {MaskKind::causal}; }
  static MaskSpec sliding_window(int64_t w) { return {MaskKind::sliding_window, w, w}; }
  static MaskSpec sliding_window(int64_t left, int64_t right) { return {MaskKind::sliding_window, left, right}; }
  static MaskSpec causal_sliding_window(int64_t left) { return {MaskKind::causal_sliding_window, left}; }
  static MaskSpec global_sliding_window(int64_t global, int64_t left, int64_t right) {
    return {MaskKind::global_sliding_window, left, right, global};
  }
  static MaskSpec document() { return {MaskKind::document}; }
  static MaskSpec causal_document() { return {MaskKind::causal_document}; }
  static MaskSpec prefix_lm() { return {MaskKind::prefix_lm}; }
  static MaskSpec share_question() { return {MaskKind::share_question}; }
  static MaskSpec causal_blockwise() { return {MaskKind::causal_blockwise}; }
  static MaskSpec block_sparse(int64_t bq, int64_t bk) { return {MaskKind::block_sparse, 0, 0, 0, bq, bk}; }
};

// A row-major host array and its shape.
template <class T>
struct MaskArray {
  std::span<const T> values;
  std::vector<int64_t> shape;
};

// The mask's tensors (only those its kind reads need to be set).
struct MaskData {
  MaskArray<int32_t> doc_ids;         // [B or 1, S_k]
  MaskArray<int32_t> prefix_lengths;  // [B]
  MaskArray<uint8_t> block_table;     // [B or 1, H or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)]
};

// The problem a mask applies to.
struct MaskProblem {
  int64_t batch = 1, heads = 1, s_q = 0, s_k = 0;
};

inline constexpr int64_t kMaskMaxExtent = int64_t{1} << 29;  // windows, G, blocks, sequence lengths

namespace mask_detail {

inline std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

[[noreturn]] inline void fail(const MaskSpec& spec, const std::string& what) {
  throw std::invalid_argument(std::string("attention mask '") + mask_kind_name(spec.kind) + "': " + what);
}

inline void check_extent(const MaskSpec& spec, const char* name, int64_t v, int64_t min, const char* meaning) {
  if (v < min || v > kMaskMaxExtent)
    fail(spec, std::string(name) + " = " + std::to_string(v) + " is invalid: " + meaning + " (" + std::to_string(min) +
                   " <= " + name + " <= 2^29)");
}

template <class T>
void check_array(const MaskSpec& spec, const char* name, const MaskArray<T>& a, const std::vector<int64_t>& want, const std::string& rule) {
  bool ok = a.shape.size() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = a.shape[i] == want[i] || (want[i] < 0 && (a.shape[i] == 1 || a.shape[i] == -want[i]));
  if (!ok) fail(spec, std::string(name) + " has shape " + shape_text(a.shape) + " but must be " + rule);
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  if (static_cast<int64_t>(a.values.size()) != n)
    fail(spec, std::string(name) + " holds " + std::to_string(a.values.size()) + " values but its shape " + shape_text(a.shape) +
                   " needs " + std::to_string(n));
}

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace mask_detail

// Throws std::invalid_argument naming the mask, the argument, its value and what is valid when the
// spec or its data do not fit the problem (a negative window, a prefix-length tensor of the wrong
// shape, a block table that does not tile [S_q, S_k] at its block size, ...).
inline void check_mask(const MaskSpec& spec, const MaskData& data, const MaskProblem& pr) {
  using namespace mask_detail;
  if (static_cast<int>(spec.kind) < 0 || static_cast<int>(spec.kind) >= kMaskKindCount)
    throw std::invalid_argument("attention mask: kind " + std::to_string(static_cast<int>(spec.kind)) + " is not one of " + mask_kind_list());
  if (pr.batch < 1 || pr.heads < 1) fail(spec, "batch and heads must be >= 1, got " + std::to_string(pr.batch) + " and " + std::to_string(pr.heads));
  check_extent(spec, "S_q", pr.s_q, 0, "a sequence length");
  check_extent(spec, "S_k", pr.s_k, 0, "a sequence length");
  const std::string B = std::to_string(pr.batch), H = std::to_string(pr.heads);
  // the rules of each parameter the kind reads (mask_parameter_names order)
  for (const std::string& name : mask_parameter_names(spec.kind)) {
    if (name == "mask_window_left") {
      check_extent(spec, "window_left", spec.window_left, 0, "windows count keys before the query");
    } else if (name == "mask_window_right") {
      check_extent(spec, "window_right", spec.window_right, 0, "windows count keys after the query");
    } else if (name == "mask_global_tokens") {
      check_extent(spec, "global_tokens", spec.global_tokens, 0, "a token count");
    } else if (name == "mask_doc_ids") {
      check_array(spec, "doc_ids", data.doc_ids, {-pr.batch, pr.s_k},
                  "[B or 1, S_k] = [" + B + " or 1, " + std::to_string(pr.s_k) + "] (a document id per key token)");
    } else if (name == "mask_prefix_lengths") {
      check_array(spec, "prefix_lengths", data.prefix_lengths, {pr.batch}, "[B] = [" + B + "] (one prefix length per batch row)");
      for (size_t b = 0; b < data.prefix_lengths.values.size(); ++b)
        if (data.prefix_lengths.values[b] < 0)
          fail(spec, "prefix_lengths[" + std::to_string(b) + "] = " + std::to_string(data.prefix_lengths.values[b]) +
                         " is negative (a prefix is a count of tokens >= 0)");
    } else if (name == "mask_block_q") {
      check_extent(spec, "block_q", spec.block_q, 1, "the table's query rows per block");
    } else if (name == "mask_block_k") {
      check_extent(spec, "block_k", spec.block_k, 1, "the table's keys per block");
    } else if (name == "mask_block_table") {
      const int64_t nq = cdiv(pr.s_q, spec.block_q), nk = cdiv(pr.s_k, spec.block_k);
      check_array(spec, "block_table", data.block_table, {-pr.batch, -pr.heads, nq, nk},
                  "[B or 1, H or 1, cdiv(S_q, block_q), cdiv(S_k, block_k)] = [" + B + " or 1, " + H + " or 1, " + std::to_string(nq) + ", " +
                      std::to_string(nk) + "] (block_q = " + std::to_string(spec.block_q) + ", block_k = " + std::to_string(spec.block_k) +
                      ", S_q = " + std::to_string(pr.s_q) + ", S_k = " + std::to_string(pr.s_k) + ")");
    }
  }
}

// What mask_patterns' predicates read on the host (see mask_patterns.hpp): plain values and array reads.
struct MaskHostElement {
  const MaskSpec& spec;
  const MaskData& data;
  int64_t b, h, s_k;
  bool always, p_is_token;
  int64_t window_left, window_right, global_tokens;
  int32_t doc(int64_t t) const {  // -1 outside [0, S_k), as the kernels' masked load
    if (t < 0 || t >= s_k) return -1;
    const int64_t row = data.doc_ids.shape.at(0) == 1 ? 0 : b;
    return data.doc_ids.values[static_cast<size_t>(row * s_k + t)];
  }
  int32_t question_doc() const { return doc(0); }
  int32_t last_doc() const { return doc(s_k - 1); }
  int32_t prefix() const { return data.prefix_lengths.values[static_cast<size_t>(b)]; }
  uint8_t block_table(int64_t q, int64_t k) const {
    const auto& t = data.block_table;
    const int64_t tb = t.shape[0] == 1 ? 0 : b, th = t.shape[1] == 1 ? 0 : h;
    return t.values[static_cast<size_t>(((tb * t.shape[1] + th) * t.shape[2] + q / spec.block_q) * t.shape[3] + k / spec.block_k)];
  }
};

// Whether (b, h, q, k) is allowed (true = attend). Out-of-range q or k: false.
inline bool mask_allowed(const MaskSpec& spec, const MaskData& data, int64_t b, int64_t h, int64_t q, int64_t k, int64_t s_q, int64_t s_k) {
  if (q < 0 || q >= s_q || k < 0 || k >= s_k) return false;
  const int64_t p = q + (s_k - s_q);
  const MaskHostElement x{spec, data, b, h, s_k, true, p >= 0 && p < s_k, spec.window_left, spec.window_right, spec.global_tokens};
  return visit_mask_pattern(spec.kind, [&](auto pattern) { return static_cast<bool>(pattern.allowed(q, p, k, x)); }, false);
}

// The whole mask as u8 [B][H][S_q][S_k] (1 = allowed), row-major.
inline std::vector<uint8_t> dense_mask(const MaskSpec& spec, const MaskData& data, const MaskProblem& pr) {
  std::vector<uint8_t> m(static_cast<size_t>(pr.batch * pr.heads * pr.s_q * pr.s_k));
  size_t i = 0;
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t h = 0; h < pr.heads; ++h)
      for (int64_t q = 0; q < pr.s_q; ++q)
        for (int64_t k = 0; k < pr.s_k; ++k) m[i++] = mask_allowed(spec, data, b, h, q, k, pr.s_q, pr.s_k);
  return m;
}

// ---- interval description: the allowed keys of one query row as at most two intervals ----

struct KeyInterval {
  int64_t begin = 0, end = 0;  // keys [begin, end)
};
// Sorted, disjoint, non-empty, inside [0, S_k); count 0..2.
struct KeyIntervals {
  int count = 0;
  std::array<KeyInterval, 2> at{};
};

// The per-row interval form of a mask (host only: the DSL's interval arithmetic, key_tiles /
// query_tiles / tile_is_full in mask.cpp, works per tile and differs in form, so each side keeps its own): every kind but block_sparse, provided each document id
// forms one contiguous run per batch row (packed sequences; segment patterns are defined for any
// ids, but the interval form needs runs). build() returns nullopt otherwise.
class MaskIntervals {
 public:
  static std::optional<MaskIntervals> build(const MaskSpec& spec, const MaskData& data, const MaskProblem& pr) {
    if (spec.kind == MaskKind::block_sparse) return std::nullopt;
    MaskIntervals m(spec, data, pr);
    if (mask_uses_doc_ids(spec.kind)) {
      const int64_t rows = data.doc_ids.shape.at(0);
      m.run_begin_.resize(static_cast<size_t>(rows * pr.s_k));
      m.run_end_.resize(static_cast<size_t>(rows * pr.s_k));
      for (int64_t r = 0; r < rows; ++r) {
        std::map<int32_t, bool> seen;
        const int32_t* ids = data.doc_ids.values.data() + r * pr.s_k;
        for (int64_t t = 0; t < pr.s_k;) {
          int64_t e = t + 1;
          while (e < pr.s_k && ids[e] == ids[t]) ++e;
          if (seen[ids[t]]) return std::nullopt;  // an id that reappears after another: not a run
          seen[ids[t]] = true;
          for (int64_t u = t; u < e; ++u) m.run_begin_[static_cast<size_t>(r * pr.s_k + u)] = t, m.run_end_[static_cast<size_t>(r * pr.s_k + u)] = e;
          t = e;
        }
      }
    }
    return m;
  }

  // The keys query row q of (b, h) may attend to.
  KeyIntervals row(int64_t b, int64_t /*h*/, int64_t q) const {
    const int64_t s_k = pr_.s_k, p = q + (s_k - pr_.s_q);
    KeyIntervals out;
    auto add = [&](int64_t lo, int64_t hi) {
      lo = std::max<int64_t>(lo, 0), hi = std::min(hi, s_k);
      if (lo >= hi) return;
      // merge with the previous interval when they touch (inputs come in increasing order of lo)
      if (out.count > 0 && lo <= out.at[static_cast<size_t>(out.count - 1)].end) {
        auto& last = out.at[static_cast<size_t>(out.count - 1)];
        last.end = std::max(last.end, hi);
        return;
      }
      out.at[static_cast<size_t>(out.count++)] = {lo, hi};
    };
    if (q < 0 || q >= pr_.s_q) return out;
    const MaskSpec& s = spec_;
    const bool p_is_token = p >= 0 && p < s_k;
    const int64_t doc_row = mask_uses_doc_ids(s.kind) ? (data_.doc_ids.shape.at(0) == 1 ? 0 : b) : 0;
    auto run_begin = [&](int64_t t) { return run_begin_[static_cast<size_t>(doc_row * s_k + t)]; };
    auto run_end = [&](int64_t t) { return run_end_[static_cast<size_t>(doc_row * s_k + t)]; };
    switch (s.kind) {
      case MaskKind::full: add(0, s_k); break;
      case MaskKind::causal: add(0, p + 1); break;
      case MaskKind::sliding_window: add(p - s.window_left, p + s.window_right + 1); break;
      case MaskKind::causal_sliding_window: add(p - s.window_left, p + 1); break;
      case MaskKind::global_sliding_window:
        if (p < s.global_tokens) {
          add(0, s_k);
        } else {
          add(0, s.global_tokens);
          add(std::max(p - s.window_left, s.global_tokens), p + s.window_right + 1);
        }
        break;
      case MaskKind::prefix_lm: add(0, std::max<int64_t>(data_.prefix_lengths.values[static_cast<size_t>(b)], p + 1)); break;
      case MaskKind::document:
        if (p_is_token) add(run_begin(p), run_end(p));
        break;
      case MaskKind::causal_document:
        if (p_is_token) add(run_begin(p), p + 1);
        break;
      case MaskKind::share_question:
        if (!p_is_token) break;
        if (run_begin(p) == 0) {  // p is in the question (the run of token 0)
          add(0, p + 1);
        } else {
          add(0, run_end(0));
          add(run_begin(p), p + 1);
        }
        break;
      case MaskKind::causal_blockwise:
        if (!p_is_token) break;
        add(run_begin(p) == run_begin(s_k - 1) ? 0 : run_begin(p), p + 1);
        break;
      case MaskKind::block_sparse: break;  // build() refuses it
    }
    return out;
  }

 private:
  MaskIntervals(const MaskSpec& spec, const MaskData& data, const MaskProblem& pr) : spec_(spec), data_(data), pr_(pr) {}
  MaskSpec spec_;
  MaskData data_;
  MaskProblem pr_;
  std::vector<int64_t> run_begin_, run_end_;  // per doc row and token: its segment [begin, end)
};

// ---- block classification ----

// Scoped, so that `full` / `empty` do not shadow lang::full in kernels/ code; the values are what the
// pre-pass stores (u8).
enum class BlockClass : uint8_t { empty = 0, partial = 1, full = 2 };

struct BlockGrid {
  int64_t block_m = 0, block_n = 0, q_blocks = 0, k_blocks = 0;
  BlockGrid(int64_t bm, int64_t bn, const MaskProblem& pr)
      : block_m(bm), block_n(bn), q_blocks(mask_detail::cdiv(pr.s_q, bm)), k_blocks(mask_detail::cdiv(pr.s_k, bn)) {}
};

inline BlockClass block_class_of(int64_t allowed, int64_t in_bounds) {
  return allowed == 0 ? BlockClass::empty : allowed == in_bounds ? BlockClass::full : BlockClass::partial;
}

// Classes of (b, h)'s [q_blocks x k_blocks] tiles, row-major, by evaluating every element.
inline std::vector<BlockClass> classify_blocks_brute_force(const MaskSpec& spec, const MaskData& data, const MaskProblem& pr, int64_t b,
                                                           int64_t h, int64_t block_m, int64_t block_n) {
  const BlockGrid g(block_m, block_n, pr);
  std::vector<BlockClass> c(static_cast<size_t>(g.q_blocks * g.k_blocks));
  for (int64_t qb = 0; qb < g.q_blocks; ++qb)
    for (int64_t kb = 0; kb < g.k_blocks; ++kb) {
      const int64_t q1 = std::min(pr.s_q, (qb + 1) * block_m), k1 = std::min(pr.s_k, (kb + 1) * block_n);
      int64_t allowed = 0;
      for (int64_t q = qb * block_m; q < q1; ++q)
        for (int64_t k = kb * block_n; k < k1; ++k) allowed += mask_allowed(spec, data, b, h, q, k, pr.s_q, pr.s_k);
      c[static_cast<size_t>(qb * g.k_blocks + kb)] = block_class_of(allowed, (q1 - qb * block_m) * (k1 - kb * block_n));
    }
  return c;
}

// The same classes from the interval form: per row, the overlap of its intervals with each key tile.
inline std::vector<BlockClass> classify_blocks_by_intervals(const MaskIntervals& iv, const MaskProblem& pr, int64_t b, int64_t h,
                                                            int64_t block_m, int64_t block_n) {
  const BlockGrid g(block_m, block_n, pr);
  std::vector<BlockClass> c(static_cast<size_t>(g.q_blocks * g.k_blocks));
  std::vector<int64_t> allowed(static_cast<size_t>(g.k_blocks));
  for (int64_t qb = 0; qb < g.q_blocks; ++qb) {
    std::fill(allowed.begin(), allowed.end(), 0);
    const int64_t q1 = std::min(pr.s_q, (qb + 1) * block_m);
    for (int64_t q = qb * block_m; q < q1; ++q) {
      const KeyIntervals r = iv.row(b, h, q);
      for (int i = 0; i < r.count; ++i) {
        const KeyInterval& in = r.at[static_cast<size_t>(i)];
        for (int64_t kb = in.begin / block_n; kb * block_n < in.end; ++kb)
          allowed[static_cast<size_t>(kb)] += std::min(in.end, (kb + 1) * block_n) - std::max(in.begin, kb * block_n);
      }
    }
    for (int64_t kb = 0; kb < g.k_blocks; ++kb)
      c[static_cast<size_t>(qb * g.k_blocks + kb)] =
          block_class_of(allowed[static_cast<size_t>(kb)], (q1 - qb * block_m) * (std::min(pr.s_k, (kb + 1) * block_n) - kb * block_n));
  }
  return c;
}

// The number of allowed (unmasked) elements over all B x H x S_q x S_k: the work attention does
// (benchmarks count FLOPs of these only). Intervals when the mask has them, else every element.
inline int64_t allowed_count(const MaskSpec& spec, const MaskData& data, const MaskProblem& pr) {
  int64_t n = 0;
  if (auto iv = MaskIntervals::build(spec, data, pr)) {
    for (int64_t b = 0; b < pr.batch; ++b)
      for (int64_t q = 0; q < pr.s_q; ++q) {
        const KeyIntervals r = iv->row(b, 0, q);
        for (int i = 0; i < r.count; ++i) n += r.at[static_cast<size_t>(i)].end - r.at[static_cast<size_t>(i)].begin;
      }
    return n * pr.heads;  // interval kinds do not depend on the head
  }
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t h = 0; h < pr.heads; ++h)
      for (int64_t q = 0; q < pr.s_q; ++q)
        for (int64_t k = 0; k < pr.s_k; ++k) n += mask_allowed(spec, data, b, h, q, k, pr.s_q, pr.s_k);
  return n;
}

// FlexAttention-style compact lists of one (b, h)'s classes. Row-major classes [q_blocks x
// k_blocks]; kv_major = false: per query tile ("outer") the key tiles ("inner") that are partial
// (num/indices) and full (full_num/full_indices), in increasing order; kv_major = true: per key
// tile the query tiles. indices hold num[outer] valid entries at [outer * inner_count + j]; the
// rest is -1 here (the pre-pass kernel leaves it unwritten).
struct BlockLists {
  std::vector<int32_t> num, indices, full_num, full_indices;
};
inline BlockLists block_lists(const std::vector<BlockClass>& classes, int64_t q_blocks, int64_t k_blocks, bool kv_major) {
  const int64_t outer = kv_major ? k_blocks : q_blocks, inner = kv_major ? q_blocks : k_blocks;
  BlockLists l{std::vector<int32_t>(static_cast<size_t>(outer), 0), std::vector<int32_t>(static_cast<size_t>(outer * inner), -1),
               std::vector<int32_t>(static_cast<size_t>(outer), 0), std::vector<int32_t>(static_cast<size_t>(outer * inner), -1)};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const BlockClass c = classes[static_cast<size_t>(kv_major ? i * k_blocks + o : o * k_blocks + i)];
      auto& n = c == BlockClass::full ? l.full_num : l.num;
      auto& idx = c == BlockClass::full ? l.full_indices : l.indices;
      if (c != BlockClass::empty) idx[static_cast<size_t>(o * inner + n[static_cast<size_t>(o)]++)] = static_cast<int32_t>(i);
    }
  return l;
}

// ---- score modifications (natural-log units: score = q . k * softmax_scale, before softmax) ----

// The value of the attention kernels' compile-time SCORE_MOD meta-parameter, and the runtime
// parameters each adds (after the mask's): score_alibi_slopes f32 [H] (one slope per query
// head), score_softcap f32 (the cap, > 0).
enum class ScoreModKind : int { none = 0, alibi = 1, softcap = 2 };
inline constexpr int kScoreModKindCount = 3;
inline const char* score_mod_kind_name(ScoreModKind k) {
  return k == ScoreModKind::none ? "none" : k == ScoreModKind::alibi ? "alibi" : k == ScoreModKind::softcap ? "softcap" : "unknown";
}
inline std::vector<std::string> score_mod_parameter_names(ScoreModKind k) {
  if (k == ScoreModKind::alibi) return {"score_alibi_slopes"};
  if (k == ScoreModKind::softcap) return {"score_softcap"};
  return {};
}

// ALiBi (Press et al.): score + slope[h] * (k - p), p the query's key position; f32 as the kernels compute it.
inline float alibi_score_host(float score, float slope, int64_t q, int64_t k, int64_t s_q, int64_t s_k) {
  const float distance = static_cast<float>(static_cast<int32_t>(k - (q + (s_k - s_q))));
  const float bias = slope * distance;
  return score + bias;
}
// Gemma-2 style soft-capping: cap * tanh(score / cap), and its derivative 1 - tanh(score / cap)^2.
inline float softcap_score_host(float score, float cap, float* derivative = nullptr) {
  const float t = static_cast<float>(std::tanh(static_cast<double>(score / cap)));
  if (derivative) *derivative = 1.0f - t * t;
  return cap * t;
}

}  // namespace tilejit::kernels
