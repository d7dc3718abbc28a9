// Attention masks in the DSL: the library patterns element by element (mask_patterns.hpp's
// predicates, the host twin's, on i32 tiles), their tile-level intervals, score mods and the
// block-classification pre-pass.
#include "kernels/attention/mask.hpp"

#include <fmt/format.h>

#include "kernels/attention/config.hpp"

namespace tilejit::kernels {

using namespace lang;

Tile MaskIndices::position() const { return q + (s_k - s_q); }

MaskIndices mask_indices(const Tile& b, const Tile& h, const Tile& rows, const Tile& cols, const Tile& s_q, const Tile& s_k, Loc loc) {
  Builder& kb = Builder::current(loc);
  if (rows.rank() != 1 || cols.rank() != 1)
    kb.fail(loc, fmt::format("mask_indices: rows and cols must be 1-D i32 tiles, got ranks {} and {}", rows.rank(), cols.rank()));
  return {b, h, rows[col], cols[row], s_q, s_k};
}

Tile evaluate_mask(const MaskMod& mask, const MaskIndices& idx, Loc loc) {
  Tile m = mask(idx);
  if (m.dtype() != i1) Builder::current(loc).fail(loc, fmt::format("mask_mod: must return an i1 tile, got {}", ir::to_string(m.type())));
  return broadcast_to(m, idx.shape(), loc);
}

MaskMod mask_and(MaskMod a, MaskMod b) {
  return [a = std::move(a), b = std::move(b)](const MaskIndices& i) { return a(i) & b(i); };
}
MaskMod mask_or(MaskMod a, MaskMod b) {
  return [a = std::move(a), b = std::move(b)](const MaskIndices& i) { return a(i) | b(i); };
}

Tile ScoreMod::gradient(const Tile& score, const MaskIndices& idx, Loc loc) const {
  if (derivative) return derivative(score, idx);
  return full(f32, score.shape(), 1.0f, loc);
}

ScoreMod alibi_score_mod(const Tensor& slopes) {
  return {[slopes](const Tile& score, const MaskIndices& i) {
            Tile slope = load(slopes.ptr() + i.h * slopes.stride(0));
            return score + slope * cast(f32, i.kv - i.position());
          },
          {}};
}

ScoreMod softcap_score_mod(const Tile& cap) {
  return {[cap](const Tile& score, const MaskIndices&) { return cap * tanh(score / cap); },
          [cap](const Tile& score, const MaskIndices&) {
            Tile t = tanh(score / cap);
            return 1.0f - t * t;
          }};
}

MaskKind mask_kind_meta(Builder& kb, const std::string& name, MaskKind def, Loc loc) {
  const int64_t v = kb.meta_int(name, static_cast<int64_t>(def), loc);
  if (v < 0 || v >= kMaskKindCount)
    kb.fail(loc, fmt::format("meta-parameter {} = {} is not a mask kind; valid: {}", name, v, mask_kind_list()));
  return static_cast<MaskKind>(v);
}

ScoreModKind score_mod_kind_meta(Builder& kb, const std::string& name, ScoreModKind def, Loc loc) {
  const int64_t v = kb.meta_int(name, static_cast<int64_t>(def), loc);
  if (v < 0 || v >= kScoreModKindCount)
    kb.fail(loc, fmt::format("meta-parameter {} = {} is not a score mod kind; valid: 0 none, 1 alibi, 2 softcap", name, v));
  return static_cast<ScoreModKind>(v);
}

void TileRanges::for_each(int64_t block, const std::function<void(Tile)>& body, Loc loc) const {
  for (int r = 0; r < runs; ++r) for_range(begin[static_cast<size_t>(r)], end[static_cast<size_t>(r)], block, body, loc);
}

// ---- AttentionMask ----

AttentionMask::AttentionMask(Builder& kb, MaskKind kind, Loc loc) : kind_(kind) {
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) >= kMaskKindCount)
    kb.fail(loc, fmt::format("AttentionMask: kind {} is not one of {}", static_cast<int>(kind), mask_kind_list()));
  // Declared in mask_parameter_names(kind) order: the host binds arguments by that list.
  for (const std::string& name : mask_parameter_names(kind)) {
    if (name == "mask_window_left") window_left = kb.scalar(name, i32, loc);
    else if (name == "mask_window_right") window_right = kb.scalar(name, i32, loc);
    else if (name == "mask_global_tokens") global_tokens = kb.scalar(name, i32, loc);
    else if (name == "mask_block_q") block_q = kb.scalar(name, i32, loc);
    else if (name == "mask_block_k") block_k = kb.scalar(name, i32, loc);
    else if (name == "mask_doc_ids") doc_ids = kb.tensor(name, i32, 2, {.contiguous_last = true}, loc);
    else if (name == "mask_prefix_lengths") prefix_lengths = kb.tensor(name, i32, 1, {}, loc);
    else if (name == "mask_block_table") block_table = kb.tensor(name, u8, 4, {.contiguous_last = true}, loc);
    else kb.fail(loc, "AttentionMask: no declaration for parameter " + name);
  }
}

SequenceMask AttentionMask::bind(const Tile& b, const Tile& h, const Tile& s_q, const Tile& s_k, Loc loc) const {
  SequenceMask m(*this);
  m.b = b, m.h = h, m.s_q = s_q, m.s_k = s_k;
  if (kind_ == MaskKind::prefix_lm) m.prefix = load(prefix_lengths.ptr() + b * prefix_lengths.stride(0), loc);
  // the segment ids that define the question (token 0) and the last segment (token S_k - 1)
  if (kind_ == MaskKind::share_question) m.question_doc = m.doc_at(zeros(i32, {}, loc), loc);
  if (kind_ == MaskKind::causal_blockwise) m.last_doc = m.doc_at(s_k - 1, loc);
  return m;
}

MaskMod AttentionMask::mask_mod() const {
  return [mask = *this](const MaskIndices& i) { return mask.bind(i.b, i.h, i.s_q, i.s_k).allowed(i); };
}

// ---- SequenceMask: elements ----

MaskIndices SequenceMask::indices(const Tile& rows, const Tile& cols, Loc loc) const { return mask_indices(b, h, rows, cols, s_q, s_k, loc); }

Tile SequenceMask::allowed(const Tile& rows, const Tile& cols, Loc loc) const { return allowed(indices(rows, cols, loc), loc); }

Tile SequenceMask::doc_at(const Tile& tokens, Loc loc) const {
  const Tensor& d = mask_.doc_ids;
  Tile row_of_b = where(d.size(0, loc) == 1, 0, b, loc);  // a [1, S_k] id tensor serves every batch row
  Tile inside = (tokens >= 0) & (tokens < s_k);
  return load(d.ptr(loc) + row_of_b * d.stride(0, loc) + tokens * d.stride(1, loc), inside, -1, loc);
}

// What mask_patterns' predicates read in the DSL (see mask_patterns.hpp): the bound scalars and loads.
struct SequenceMask::Element {
  const SequenceMask& m;
  Loc loc;
  const Tile &always, &p_is_token;  // always: the in-bounds mask
  const Tile &window_left, &window_right, &global_tokens;
  Tile doc(const Tile& tokens) const { return m.doc_at(tokens, loc); }
  const Tile& question_doc() const { return m.question_doc; }
  const Tile& last_doc() const { return m.last_doc; }
  const Tile& prefix() const { return m.prefix; }
  Tile block_table(const Tile& q, const Tile& k) const {
    const Tensor& t = m.mask_.block_table;
    const AttentionMask& mask = m.mask_;
    Tile tb = where(t.size(0, loc) == 1, 0, m.b, loc), th = where(t.size(1, loc) == 1, 0, m.h, loc);
    Tile ptr = t.ptr(loc) + tb * t.stride(0, loc) + th * t.stride(1, loc) + (q / mask.block_q) * t.stride(2, loc) +
               (k / mask.block_k) * t.stride(3, loc);
    return load(ptr, always, 0, loc);
  }
};

Tile SequenceMask::allowed(const MaskIndices& i, Loc loc) const {
  const Tile p = i.position(), k = i.kv;
  const Tile in_bounds = (i.q >= 0) & (i.q < s_q) & (k >= 0) & (k < s_k);
  // positions inside the key sequence: the segment patterns read the id of the query's own token
  const Tile p_is_token = (p >= 0) & (p < s_k);
  const Element x{*this, loc, in_bounds, p_is_token, mask_.window_left, mask_.window_right, mask_.global_tokens};
  const Tile m = visit_mask_pattern(mask_.kind(), [&](auto pattern) -> Tile { return pattern.allowed(i.q, p, k, x); }, Tile());
  return broadcast_to(m & in_bounds, i.shape(), loc);
}

// ---- SequenceMask: tiles ----
//
// The tile arithmetic (key_tiles, query_tiles, tile_is_full, tile_verdict) stays here, per kind:
// the host has no per-tile form of it (MaskIntervals works per row, the host classifies blocks by
// counting), so there is no second copy to share it with.

void SequenceMask::require_intervals(const char* what, Loc loc) const {
  if (!mask_has_tile_intervals(mask_.kind()))
    Builder::current(loc).fail(loc, fmt::format("{}: mask '{}' has no interval form (its blocks depend on data): classify them with the "
                                                "block-mask pre-pass and read its lists (BlockMaskLists)",
                                                what, mask_kind_name(mask_.kind())));
}

namespace {

// The key positions of the in-bounds rows of query tile [m0, m0 + block_m): [first, last], and
// whether the tile has any row below S_q.
struct RowSpan {
  Tile first, last, any;
};
RowSpan row_span(const Tile& m0, int64_t block_m, const Tile& s_q, const Tile& s_k) {
  Tile d = s_k - s_q;
  return {m0 + d, minimum(m0 + block_m, s_q) - 1 + d, m0 < s_q};
}

// A run visiting the tiles that overlap [lo, hi) (lo >= 0), none when lo >= hi; `not_before`
// (a multiple of the block) moves its start past tiles an earlier run visits.
void set_run(TileRanges& r, int index, const Tile& lo, const Tile& hi, int64_t block, const Tile& live, const Tile* not_before = nullptr) {
  Tile begin = (lo / block) * block;
  if (not_before) begin = maximum(begin, *not_before);
  r.begin[static_cast<size_t>(index)] = begin;
  r.end[static_cast<size_t>(index)] = where(live & (lo < hi), hi, begin);
}

}  // namespace

TileRanges SequenceMask::key_tiles(const Tile& m0, int64_t block_m, int64_t block_n, Loc loc) const {
  require_intervals("key_tiles", loc);
  if (block_m <= 0 || block_n <= 0) Builder::current(loc).fail(loc, fmt::format("key_tiles: block sizes must be positive, got {} x {}", block_m, block_n));
  const RowSpan rs = row_span(m0, block_m, s_q, s_k);
  const Tile zero = zeros(i32, {}, loc);
  TileRanges r;
  switch (mask_.kind()) {
    case MaskKind::full: set_run(r, 0, zero, s_k, block_n, rs.any); break;
    case MaskKind::causal: set_run(r, 0, zero, minimum(s_k, rs.last + 1), block_n, rs.any); break;
    case MaskKind::sliding_window:
      set_run(r, 0, maximum(rs.first - mask_.window_left, 0), minimum(s_k, rs.last + mask_.window_right + 1), block_n, rs.any);
      break;
    case MaskKind::causal_sliding_window:
      set_run(r, 0, maximum(rs.first - mask_.window_left, 0), minimum(s_k, rs.last + 1), block_n, rs.any);
      break;
    case MaskKind::global_sliding_window: {
      // A tile with a global row (position < G) sees every key: one run. Otherwise the global keys
      // [0, G), then the window's keys at or past G, starting after the global run's last tile.
      const Tile& G = mask_.global_tokens;
      Tile global_row = rs.first < G, g_end = minimum(G, s_k);
      set_run(r, 0, zero, where(global_row, s_k, g_end), block_n, rs.any);
      Tile after_global = cdiv(g_end, block_n) * block_n;
      set_run(r, 1, maximum(rs.first - mask_.window_left, G), minimum(s_k, rs.last + mask_.window_right + 1), block_n, rs.any & !global_row,
              &after_global);
      r.runs = 2;
      break;
    }
    case MaskKind::prefix_lm: set_run(r, 0, zero, minimum(s_k, maximum(prefix, rs.last + 1)), block_n, rs.any); break;
    default: break;  // require_intervals refused the rest
  }
  return r;
}

TileRanges SequenceMask::query_tiles(const Tile& n0, int64_t block_n, int64_t block_m, Loc loc) const {
  require_intervals("query_tiles", loc);
  if (block_m <= 0 || block_n <= 0) Builder::current(loc).fail(loc, fmt::format("query_tiles: block sizes must be positive, got {} x {}", block_n, block_m));
  // Keys [n0, n1) and the rows i whose position p = i + d reaches them.
  Tile d = s_k - s_q, n1 = minimum(n0 + block_n, s_k), any_key = n0 < s_k;
  const Tile zero = zeros(i32, {}, loc);
  auto row_of = [&](const Tile& position) { return maximum(position - d, 0); };  // clamped row of a position
  TileRanges r;
  switch (mask_.kind()) {
    case MaskKind::full: set_run(r, 0, zero, s_q, block_m, any_key); break;
    case MaskKind::causal: set_run(r, 0, row_of(n0), s_q, block_m, any_key); break;
    case MaskKind::sliding_window:  // p - w_l <= k <= p + w_r for some k in [n0, n1): p in [n0 - w_r, n1 - 1 + w_l]
      set_run(r, 0, row_of(n0 - mask_.window_right), minimum(s_q, n1 + mask_.window_left - d), block_m, any_key);
      break;
    case MaskKind::causal_sliding_window:
      set_run(r, 0, row_of(n0), minimum(s_q, n1 + mask_.window_left - d), block_m, any_key);
      break;
    case MaskKind::global_sliding_window: {
      // A tile holding a global key is seen by every row. Otherwise the global rows (p < G), then
      // the rows whose window reaches the tile, starting after the global run's last tile.
      const Tile& G = mask_.global_tokens;
      Tile global_key = n0 < G, g_rows = minimum(s_q, row_of(G));
      set_run(r, 0, zero, where(global_key, s_q, g_rows), block_m, any_key);
      Tile after_global = cdiv(g_rows, block_m) * block_m;
      set_run(r, 1, maximum(row_of(n0 - mask_.window_right), row_of(G)), minimum(s_q, n1 + mask_.window_left - d), block_m,
              any_key & !global_key, &after_global);
      r.runs = 2;
      break;
    }
    case MaskKind::prefix_lm: set_run(r, 0, where(n0 < prefix, zero, row_of(n0)), s_q, block_m, any_key); break;
    default: break;
  }
  return r;
}

Tile SequenceMask::tile_is_full(const Tile& m0, int64_t block_m, const Tile& n0, int64_t block_n, Loc loc) const {
  require_intervals("tile_is_full", loc);
  const RowSpan rs = row_span(m0, block_m, s_q, s_k);
  Tile last_key = minimum(n0 + block_n, s_k) - 1;
  const Tile &wl = mask_.window_left, &wr = mask_.window_right, &G = mask_.global_tokens;
  // Every row position in [first, last] allows every key in [n0, last_key]:
  switch (mask_.kind()) {
    case MaskKind::full: return scalar_constant(i1, true, loc);
    case MaskKind::causal: return last_key <= rs.first;
    case MaskKind::sliding_window: return (rs.last - wl <= n0) & (last_key <= rs.first + wr);
    case MaskKind::causal_sliding_window: return (rs.last - wl <= n0) & (last_key <= rs.first);
    case MaskKind::global_sliding_window:
      // all rows global, all keys global, or the non-global keys inside every non-global row's window
      return (rs.last < G) | (last_key < G) | ((rs.last - wl <= maximum(n0, G)) & (last_key <= maximum(rs.first, G) + wr));
    case MaskKind::prefix_lm: return last_key < maximum(prefix, rs.first + 1);
    default: break;
  }
  return scalar_constant(i1, false, loc);
}

std::optional<TileVerdict> SequenceMask::tile_verdict(const Tile& m0, int64_t block_m, const Tile& n0, int64_t block_n, Loc loc) const {
  const MaskKind kind = mask_.kind();
  if (!mask_uses_doc_ids(kind)) return std::nullopt;
  // Rows are allowed keys only where their position p = q + S_k - S_q is a token (inside the key
  // sequence). With the ids' ranges [qlo, qhi] over the in-bounds rows and [klo, khi] over the
  // in-bounds keys: disjoint ranges mean no pair shares an id; one id everywhere, and every
  // in-bounds row a token, means every pair does. Counts, not the extremes, say whether any row or
  // key is there (ids may be any i32).
  Tile q = m0 + arange(0, block_m, loc), k = n0 + arange(0, block_n, loc);
  Tile p = q + (s_k - s_q);
  Tile q_in = q < s_q, row_ok = q_in & (p >= 0) & (p < s_k), k_in = k < s_k;
  Tile dq = doc_at(p, loc), dk = doc_at(k, loc);
  Tile qlo = min(where(row_ok, dq, INT32_MAX, loc), loc), qhi = max(where(row_ok, dq, INT32_MIN, loc), loc);
  Tile klo = min(where(k_in, dk, INT32_MAX, loc), loc), khi = max(where(k_in, dk, INT32_MIN, loc), loc);
  Tile rows = sum(cast(i32, row_ok, loc), loc), keys = sum(cast(i32, k_in, loc), loc);
  Tile non_token_rows = sum(cast(i32, q_in & !row_ok, loc), loc);  // in-bounds rows that see nothing
  Tile nothing = (rows == 0) | (keys == 0);
  Tile every_row = (non_token_rows == 0) & (rows > 0) & (keys > 0);
  Tile no_shared_id = (qhi < klo) | (khi < qlo);
  Tile one_id = (qlo == qhi) & (klo == khi) & (qlo == klo);
  // The causal kinds allow key k only up to the row's position: every pair when all keys are <=
  // the first row's position, none when the first key is past the last row's.
  const RowSpan rs = row_span(m0, block_m, s_q, s_k);
  Tile causal_none = n0 > rs.last, causal_all = minimum(n0 + block_n, s_k) - 1 <= rs.first;
  switch (kind) {
    case MaskKind::document: return TileVerdict{nothing | no_shared_id, every_row & one_id};
    case MaskKind::causal_document: return TileVerdict{nothing | no_shared_id | causal_none, every_row & one_id & causal_all};
    case MaskKind::share_question: {
      // also every key of the question's segment (id of token 0): none of them when its id is
      // outside the keys' range; all pairs when every key is in it
      Tile no_question = (question_doc < klo) | (question_doc > khi);
      Tile all_question = (klo == khi) & (klo == question_doc);
      return TileVerdict{nothing | causal_none | (no_shared_id & no_question), every_row & causal_all & (one_id | all_question)};
    }
    default: {  // causal_blockwise: also every row of the last segment (id of token S_k - 1) sees every earlier key
      Tile no_last = (last_doc < qlo) | (last_doc > qhi);
      Tile all_last = (qlo == qhi) & (qlo == last_doc);
      return TileVerdict{nothing | causal_none | (no_shared_id & no_last), every_row & causal_all & (one_id | all_last)};
    }
  }
}

// ---- score mods ----

AttentionScoreMod::AttentionScoreMod(Builder& kb, ScoreModKind k, Loc loc) : kind(k) {
  if (k == ScoreModKind::alibi) {
    alibi_slopes = kb.tensor("score_alibi_slopes", f32, 1, {}, loc);
    mod = alibi_score_mod(alibi_slopes);
  } else if (k == ScoreModKind::softcap) {
    softcap = kb.scalar("score_softcap", f32, loc);
    mod = softcap_score_mod(softcap);
  } else if (k != ScoreModKind::none) {
    kb.fail(loc, fmt::format("AttentionScoreMod: kind {} is not one of 0 none, 1 alibi, 2 softcap", static_cast<int>(k)));
  }
}

// ---- the block-classification pre-pass ----

namespace {

// The element of a tensor at integer scalar coordinates, as a pointer (i64 strides).
Tile element(const Tensor& t, std::initializer_list<Tile> coords) {
  Tile p = t.ptr();
  int dim = 0;
  for (const Tile& c : coords) p = p + c * t.stride(dim++);
  return p;
}

std::array<std::string, 4> list_names(bool kv_major) {
  if (kv_major) return {"q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"};
  return {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"};
}

// The classes kernel's body after its metas: its parameters (then the mask's, from `declare`) and
// the classification of TILES key tiles.
void classify_blocks(Builder& kb, const BlockClassesConfig& cfg, const std::function<BlockClassifier(Builder&)>& declare) {
  const int64_t BM = cfg.block_m, BN = cfg.block_n, tiles = cfg.tiles;
  auto Classes = kb.tensor("block_classes", u8, 4);
  auto S_q = kb.scalar<int>("S_q"), S_k = kb.scalar<int>("S_k");
  const BlockClassifier classifier = declare(kb);
  Tile qb = program_id(0), heads = Classes.size(1), n_kb = Classes.size(3);
  Tile b = program_id(2) / heads, h = program_id(2) % heads;
  Tile rows = qb * BM + arange(0, BM);
  constexpr auto kFull = static_cast<int32_t>(BlockClass::full), kPartial = static_cast<int32_t>(BlockClass::partial),
                 kEmpty = static_cast<int32_t>(BlockClass::empty);
  auto classify = [&](const Tile& kb_) {
    // every element: the mask over the tile, counted
    auto exact = [&] {
      Tile cols = kb_ * BN + arange(0, BN);
      MaskIndices idx = mask_indices(b, h, rows, cols, S_q, S_k);
      Tile in_bounds = (rows < S_q)[col] & (cols < S_k)[row];
      Tile allowed = sum(cast(i32, evaluate_mask(classifier.mask, idx) & in_bounds));
      Tile elements = minimum(S_q - qb * BM, BM) * minimum(S_k - kb_ * BN, BN);
      Tile is_full = allowed == elements, is_partial = (allowed > 0) & (allowed < elements);
      return where(is_full, kFull, where(is_partial, kPartial, kEmpty));
    };
    std::optional<TileVerdict> v;
    if (classifier.verdict) v = classifier.verdict(b, h, S_q, S_k, qb * BM, BM, kb_ * BN, BN);
    Tile cls;
    if (v) {
      // the elements only where the verdict does not decide (a uniform branch per tile)
      Var c = where(v->empty, kEmpty, where(v->full, kFull, kPartial));
      if_(!(v->empty | v->full), [&] { c = exact(); });
      cls = c;
    } else {
      cls = exact();
    }
    store(element(Classes, {b, h, qb, kb_}), cast(u8, cls));
  };
  if (tiles == 1) classify(program_id(1));
  else for_range(program_id(1) * tiles, minimum(program_id(1) * tiles + tiles, n_kb), [&](Tile kb_) { classify(kb_); });
}

}  // namespace

Kernel block_classes_kernel(std::string name, std::function<MaskMod(Builder&)> declare_mask) {
  return block_classes_kernel(std::move(name), [declare_mask](Builder& kb) { return BlockClassifier{declare_mask(kb), {}}; });
}

Kernel block_classes_kernel(std::string name, std::function<BlockClassifier(Builder&)> declare) {
  return kernel(std::move(name), [declare](Builder& kb) {
    classify_blocks(kb, BlockClassesConfig::read(kb, /*library_mask=*/false), declare);
  });
}

const Kernel& attention_block_classes() {
  static const Kernel k = kernel("attention_block_classes", [](Builder& kb) {
    const BlockClassesConfig cfg = BlockClassesConfig::read(kb);
    classify_blocks(kb, cfg, [kind = cfg.mask](Builder& builder) {
      const AttentionMask mask(builder, kind);
      TileVerdictFn verdict;
      if (mask_uses_doc_ids(kind))
        verdict = [mask](const Tile& b, const Tile& h, const Tile& s_q, const Tile& s_k, const Tile& m0, int64_t bm, const Tile& n0,
                         int64_t bn) { return mask.bind(b, h, s_q, s_k).tile_verdict(m0, bm, n0, bn); };
      return BlockClassifier{mask.mask_mod(), verdict};
    });
  });
  return k;
}

const Kernel& attention_block_lists() {
  static const Kernel k = kernel("attention_block_lists", [](Builder& kb) {
    const bool kv_major = BlockListsConfig::read(kb).kv_major;
    constexpr int64_t C = 64;  // classes per step
    const auto names = list_names(kv_major);
    auto Classes = kb.tensor("block_classes", u8, 4);
    auto Num = kb.tensor(names[0], i32, 3), Idx = kb.tensor(names[1], i32, 4);
    auto FullNum = kb.tensor(names[2], i32, 3), FullIdx = kb.tensor(names[3], i32, 4);
    auto outer = program_id(0), h = program_id(1), b = program_id(2);
    Tile n_inner = Classes.size(kv_major ? 2 : 3);
    // before[i, j] = i < j: an exclusive prefix sum over a step is a masked column sum
    Tile before = arange(0, C)[col] < arange(0, C)[row];
    Var partial_count = zeros(i32, {}), full_count = zeros(i32, {});
    for_range(0, n_inner, C, [&](Tile i0) {
      Tile j = i0 + arange(0, C);
      // classes (outer, i0 + 0..C) of the row (KV_MAJOR: the column); past the end: empty (0)
      Tile cls = cast(i32, load(kv_major ? Classes.block({b, h, i0, outer}, {C}, {2}) : Classes.block({b, h, outer, i0}, {C}, {3})));
      auto append = [&](Var& count, const Tensor& list, int32_t which) {
        Tile hit = cls == which;
        Tile at = sum(where(before, cast(i32, hit)[col], 0), 0);  // hits before each: its slot
        store(element(list, {b, h, outer, count}) + at * list.stride(3), j, hit);
        count = count + sum(cast(i32, hit));
      };
      append(partial_count, Idx, static_cast<int32_t>(BlockClass::partial));
      append(full_count, FullIdx, static_cast<int32_t>(BlockClass::full));
    });
    store(element(Num, {b, h, outer}), partial_count.value());
    store(element(FullNum, {b, h, outer}), full_count.value());
  });
  return k;
}

// ---- reading the lists ----

BlockMaskLists::BlockMaskLists(Builder& kb, bool kv_major, Loc loc) {
  const auto names = list_names(kv_major);
  num = kb.tensor(names[0], i32, 3, {}, loc);
  indices = kb.tensor(names[1], i32, 4, {}, loc);
  full_num = kb.tensor(names[2], i32, 3, {}, loc);
  full_indices = kb.tensor(names[3], i32, 4, {}, loc);
}

namespace {

// (b, h) of a list tensor whose batch or head extent may be 1 (broadcast).
std::pair<Tile, Tile> list_coords(const Tensor& t, const Tile& b, const Tile& h, Loc loc) {
  return {where(t.size(0, loc) == 1, 0, b, loc), where(t.size(1, loc) == 1, 0, h, loc)};
}

Tile count_of(const Tensor& t, const Tile& b, const Tile& h, const Tile& tile, Loc loc) {
  auto [bb, hh] = list_coords(t, b, h, loc);
  return load(element(t, {bb, hh, tile}), loc);
}

Tile entry_of(const Tensor& t, const Tile& b, const Tile& h, const Tile& tile, const Tile& j, Loc loc) {
  auto [bb, hh] = list_coords(t, b, h, loc);
  return load(element(t, {bb, hh, tile, j}), loc);
}

}  // namespace

Tile BlockMaskLists::partial_count(const Tile& b, const Tile& h, const Tile& tile, Loc loc) const { return count_of(num, b, h, tile, loc); }
Tile BlockMaskLists::full_count(const Tile& b, const Tile& h, const Tile& tile, Loc loc) const { return count_of(full_num, b, h, tile, loc); }
Tile BlockMaskLists::partial_block(const Tile& b, const Tile& h, const Tile& tile, const Tile& j, Loc loc) const {
  return entry_of(indices, b, h, tile, j, loc);
}
Tile BlockMaskLists::full_block(const Tile& b, const Tile& h, const Tile& tile, const Tile& j, Loc loc) const {
  return entry_of(full_indices, b, h, tile, j, loc);
}

std::pair<Tile, Tile> AttentionMask::program_order(int64_t block, const Tile& tile, const Tile& head, Loc loc) const {
  if (kind_ != MaskKind::global_sliding_window) return {tile, head};
  Tile n = num_programs(0, loc), heads = num_programs(1, loc), p = program_id(0, loc) + program_id(1, loc) * n;
  Tile heavy = minimum(cdiv(maximum(global_tokens, 0), block, loc), n), first = heads * heavy, rest = maximum(n - heavy, 1);
  return {where(p < first, p / heads, heavy + (p - first) % rest), where(p < first, p % heads, (p - first) / rest)};
}

}  // namespace tilejit::kernels
