// The attention mask patterns, one struct each (issue 21): the metadata both the host twin
// (mask_host.hpp) and the DSL (mask.hpp) read -- name, runtime parameters, which data it reads --
// and the element predicate, written once as a template over the value type: int64_t / bool on
// the host (mask_allowed), lang::Tile in the DSL (SequenceMask::allowed). Plain C++, no tilejit
// dependency. mask_host.hpp states what each pattern allows.
//
// allowed(q, p, k, x): q the query row, p its key position q + (S_k - S_q), k the key; x supplies
// what the side reads:
//   x.always                                  true (the DSL passes its in-bounds mask: the result
//                                             is ANDed with the bounds anyway)
//   x.p_is_token                              0 <= p < S_k
//   x.window_left, x.window_right, x.global_tokens
//   x.prefix()                                prefix_lengths[b]
//   x.doc(t)                                  the document id of token t (-1 outside [0, S_k): the
//                                             predicates read doc(p) also where p is not a token)
//   x.question_doc(), x.last_doc()            doc(0), doc(S_k - 1)
//   x.block_table(q, k)                       table[b'][h'][q / block_q][k / block_k]
// Only `<`, `<=`, `==`, `!=`, `-`, `+`, `&` and `|` (both sides' operators; no short-circuit, so
// the host's accessors must be safe everywhere). The DSL creates ops in the order C++ evaluates
// these expressions, so each is kept in the form the kernels were generated from: changing one
// (even reordering the operands of `&`) changes generated code.
#pragma once
#include <array>
#include <cstddef>
#include <tuple>
#include <utility>

namespace tilejit::kernels {

// The value of the attention kernels' compile-time MASK meta-parameter.
enum class MaskKind : int {
  full = 0,
  causal = 1,
  sliding_window = 2,
  causal_sliding_window = 3,
  global_sliding_window = 4,
  document = 5,
  causal_document = 6,
  prefix_lm = 7,
  share_question = 8,
  causal_blockwise = 9,
  block_sparse = 10,
};
inline constexpr int kMaskKindCount = 11;

namespace mask_patterns {

// What every pattern states besides `allowed`:
//   kind, name; parameters: the runtime parameters it adds to a kernel, in declaration order
//   (mask_parameter_names); uses_doc_ids: reads mask_doc_ids (the segment patterns);
//   has_tile_intervals: the kernels classify its tiles by scalar arithmetic (AttentionMask's
//   key_tiles, query_tiles, tile_is_full) rather than the block-mask pre-pass.
template <MaskKind K, std::size_t N, bool DocIds, bool Intervals>
struct Pattern {
  static constexpr MaskKind kind = K;
  static constexpr bool uses_doc_ids = DocIds;
  static constexpr bool has_tile_intervals = Intervals;
  using Parameters = std::array<const char*, N>;
};

struct Full : Pattern<MaskKind::full, 0, false, true> {
  static constexpr const char* name = "full";
  static constexpr Parameters parameters{};
  template <class V, class X>
  static auto allowed(const V&, const V&, const V&, const X& x) { return x.always; }
};

struct Causal : Pattern<MaskKind::causal, 0, false, true> {
  static constexpr const char* name = "causal";
  static constexpr Parameters parameters{};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X&) { return k <= p; }
};

struct SlidingWindow : Pattern<MaskKind::sliding_window, 2, false, true> {
  static constexpr const char* name = "sliding_window";
  static constexpr Parameters parameters{"mask_window_left", "mask_window_right"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) {
    return (k >= p - x.window_left) & (k <= p + x.window_right);
  }
};

struct CausalSlidingWindow : Pattern<MaskKind::causal_sliding_window, 1, false, true> {
  static constexpr const char* name = "causal_sliding_window";
  static constexpr Parameters parameters{"mask_window_left"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) { return (k >= p - x.window_left) & (k <= p); }
};

struct GlobalSlidingWindow : Pattern<MaskKind::global_sliding_window, 3, false, true> {
  static constexpr const char* name = "global_sliding_window";
  static constexpr Parameters parameters{"mask_global_tokens", "mask_window_left", "mask_window_right"};
  template <class V, class X>
  static auto allowed(const V& q, const V& p, const V& k, const X& x) {
    return (k < x.global_tokens) | (p < x.global_tokens) | SlidingWindow::allowed(q, p, k, x);
  }
};

struct Document : Pattern<MaskKind::document, 1, true, false> {
  static constexpr const char* name = "document";
  static constexpr Parameters parameters{"mask_doc_ids"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) { return x.p_is_token & (x.doc(p) == x.doc(k)); }
};

struct CausalDocument : Pattern<MaskKind::causal_document, 1, true, false> {
  static constexpr const char* name = "causal_document";
  static constexpr Parameters parameters{"mask_doc_ids"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) {
    return x.p_is_token & (k <= p) & (x.doc(p) == x.doc(k));
  }
};

struct PrefixLm : Pattern<MaskKind::prefix_lm, 1, false, true> {
  static constexpr const char* name = "prefix_lm";
  static constexpr Parameters parameters{"mask_prefix_lengths"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) { return (k <= p) | (k < x.prefix()); }
};

struct ShareQuestion : Pattern<MaskKind::share_question, 1, true, false> {
  static constexpr const char* name = "share_question";
  static constexpr Parameters parameters{"mask_doc_ids"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) {
    const auto dk = x.doc(k);
    return x.p_is_token & (k <= p) & ((dk == x.doc(p)) | (dk == x.question_doc()));
  }
};

struct CausalBlockwise : Pattern<MaskKind::causal_blockwise, 1, true, false> {
  static constexpr const char* name = "causal_blockwise";
  static constexpr Parameters parameters{"mask_doc_ids"};
  template <class V, class X>
  static auto allowed(const V&, const V& p, const V& k, const X& x) {
    const auto dp = x.doc(p);
    return x.p_is_token & (k <= p) & ((x.doc(k) == dp) | (dp == x.last_doc()));
  }
};

struct BlockSparse : Pattern<MaskKind::block_sparse, 3, false, false> {
  static constexpr const char* name = "block_sparse";
  static constexpr Parameters parameters{"mask_block_q", "mask_block_k", "mask_block_table"};
  template <class V, class X>
  static auto allowed(const V& q, const V&, const V& k, const X& x) { return x.block_table(q, k) != 0; }
};

// Every pattern, in MaskKind order.
using All = std::tuple<Full, Causal, SlidingWindow, CausalSlidingWindow, GlobalSlidingWindow, Document, CausalDocument, PrefixLm,
                       ShareQuestion, CausalBlockwise, BlockSparse>;
static_assert(std::tuple_size_v<All> == static_cast<std::size_t>(kMaskKindCount));
static_assert([]<std::size_t... I>(std::index_sequence<I...>) {
  return ((static_cast<std::size_t>(std::tuple_element_t<I, All>::kind) == I) && ...);
}(std::make_index_sequence<kMaskKindCount>{}));

}  // namespace mask_patterns

// f(pattern) for every pattern (a default-constructed struct), in MaskKind order.
template <class F>
constexpr void for_each_mask_pattern(F&& f) {
  std::apply([&](auto... p) { (f(p), ...); }, mask_patterns::All{});
}

// f(pattern) for the pattern of `kind`; `otherwise` when kind is out of range. Every f(pattern)
// must convert to the type of `otherwise`.
template <class R, class F>
constexpr R visit_mask_pattern(MaskKind kind, F&& f, R otherwise) {
  for_each_mask_pattern([&](auto p) {
    if (decltype(p)::kind == kind) otherwise = f(p);
  });
  return otherwise;
}

}  // namespace tilejit::kernels
