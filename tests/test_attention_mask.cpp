// The attention mask library (kernels/attention/mask.hpp, kernels/attention/mask_host.hpp): the host
// definitions on hand-written examples, the interval form and block classification against brute
// force, every library mask in the interpreter against the host's dense mask bit for bit, the DSL's
// per-tile ranges and full tests against brute-force classes, the block-mask pre-pass (classes and
// FlexAttention-style lists, both orders), score mods, a masked attention forward through the whole
// interface against float64, errors, and PTX for sm_90a.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ptxas_testing.hpp"
#include "api/attention.hpp"
#include "dsl/lang.hpp"
#include "jit/compile.hpp"
#include "jit/ptx_compiler.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/mask.hpp"
#include "kernels/attention/mask_host.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;

// These tests run tiles of any shape (7, 13, 24 ...) to test semantics on the CPU; the GPU backends
// take powers of two only, which the interpreter otherwise enforces.
static void interpret_any_shape(const tilejit::ir::Function& f, rt::Grid grid, const std::vector<rt::Arg>& args) {
  rt::interpret(f, grid, args, {.gpu_rules = false});
}
namespace km = tilejit::kernels;
using km::BlockClass;
using km::MaskKind;
using km::MaskSpec;
using rt::HostTensor;

namespace {

// A mask problem with its data, owned, and the same data as interpreter tensors.
struct MaskCase {
  std::string label;
  MaskSpec spec;
  km::MaskProblem pr;
  std::vector<int32_t> doc_ids, prefix;
  std::vector<int64_t> doc_shape, table_shape;
  std::vector<uint8_t> table;

  km::MaskData data() const {
    return {{doc_ids, doc_shape}, {prefix, {static_cast<int64_t>(prefix.size())}}, {table, table_shape}};
  }
  int64_t mask_heads() const { return spec.kind == MaskKind::block_sparse ? table_shape[1] : 1; }
  int64_t mask_batch() const {
    if (spec.kind == MaskKind::block_sparse) return table_shape[0];
    return km::mask_uses_doc_ids(spec.kind) ? doc_shape[0] : pr.batch;
  }
};

template <class T>
HostTensor host_tensor(DType d, ir::Shape shape, const std::vector<T>& values) {
  HostTensor t(d, std::move(shape));
  REQUIRE(t.numel() == static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_flat(i, static_cast<double>(values[static_cast<size_t>(i)]));
  return t;
}

std::vector<int64_t> ints_of(const HostTensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>(t.get_flat(i));
  return v;
}

// The interpreter tensors of a case's mask parameters, and its arguments in declaration order.
struct MaskArgs {
  HostTensor doc, prefix, table;
  std::vector<rt::Arg> args;
  explicit MaskArgs(const MaskCase& c) {
    for (const std::string& name : km::mask_parameter_names(c.spec.kind)) {
      if (name == "mask_window_left") args.emplace_back(c.spec.window_left);
      else if (name == "mask_window_right") args.emplace_back(c.spec.window_right);
      else if (name == "mask_global_tokens") args.emplace_back(c.spec.global_tokens);
      else if (name == "mask_block_q") args.emplace_back(c.spec.block_q);
      else if (name == "mask_block_k") args.emplace_back(c.spec.block_k);
      else if (name == "mask_doc_ids") doc = host_tensor(i32, c.doc_shape, c.doc_ids), args.emplace_back(doc);
      else if (name == "mask_prefix_lengths") prefix = host_tensor(i32, {static_cast<int64_t>(c.prefix.size())}, c.prefix), args.emplace_back(prefix);
      else if (name == "mask_block_table") table = host_tensor(u8, c.table_shape, c.table), args.emplace_back(table);
      else FAIL("no argument for " << name);
    }
  }
  MaskArgs(const MaskArgs&) = delete;  // args point at the tensors
};

// Document ids of contiguous segments (lengths 1..max_len) for `rows` batch rows of `s` tokens;
// ids start away from 0 so that no pattern can rely on a particular id value.
std::vector<int32_t> segment_ids(int64_t rows, int64_t s, int64_t max_len, std::mt19937& g) {
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r) {
    int32_t id = 100 + static_cast<int32_t>(7 * r);
    for (int64_t t = 0; t < s;) {
      const int64_t len = 1 + static_cast<int64_t>(g() % static_cast<uint32_t>(max_len));
      for (int64_t u = 0; u < len && t < s; ++u, ++t) ids.push_back(id);
      id += 3;
    }
  }
  return ids;
}

// Every pattern with a few parameter sets on ragged shapes (S not a multiple of any tile, S_q != S_k
// both ways).
std::vector<MaskCase> mask_cases() {
  std::mt19937 g(20261122);
  const km::MaskProblem shapes[] = {{2, 3, 37, 37}, {2, 2, 23, 50}, {1, 2, 50, 23}, {3, 1, 64, 64}};
  std::vector<MaskCase> cases;
  for (const km::MaskProblem& pr : shapes) {
    const std::string shape = fmt::format("B={} H={} S_q={} S_k={}", pr.batch, pr.heads, pr.s_q, pr.s_k);
    auto add = [&](std::string what, MaskSpec spec) {
      MaskCase c{fmt::format("{} {}", what, shape), spec, pr, {}, {}, {}, {}, {}};
      cases.push_back(std::move(c));
      return &cases.back();
    };
    add("full", MaskSpec::full());
    add("causal", MaskSpec::causal());
    add("sliding_window w=5", MaskSpec::sliding_window(5));
    add("sliding_window left=3 right=9", MaskSpec::sliding_window(3, 9));
    add("sliding_window w=0", MaskSpec::sliding_window(0));
    add("causal_sliding_window 7", MaskSpec::causal_sliding_window(7));
    add("causal_sliding_window 0", MaskSpec::causal_sliding_window(0));
    add("global_sliding_window G=4 3/6", MaskSpec::global_sliding_window(4, 3, 6));
    add("global_sliding_window G=9 0/0", MaskSpec::global_sliding_window(9, 0, 0));
    add("global_sliding_window G=0 2/2", MaskSpec::global_sliding_window(0, 2, 2));
    for (int variant = 0; variant < 2; ++variant) {
      MaskCase* c = add(fmt::format("prefix_lm #{}", variant), MaskSpec::prefix_lm());
      for (int64_t b = 0; b < pr.batch; ++b)  // 0, inside, past the end
        c->prefix.push_back(b == 0 ? (variant ? 0 : 5) : static_cast<int32_t>(g() % static_cast<uint32_t>(pr.s_k + 8)));
    }
    for (MaskSpec spec : {MaskSpec::document(), MaskSpec::causal_document(), MaskSpec::share_question(), MaskSpec::causal_blockwise()})
      for (int64_t rows : {pr.batch, int64_t{1}}) {  // per batch row, and one row broadcast
        MaskCase* c = add(fmt::format("{} ids [{}, S_k]", km::mask_kind_name(spec.kind), rows), spec);
        c->doc_shape = {rows, pr.s_k};
        c->doc_ids = segment_ids(rows, pr.s_k, 12, g);
      }
    // the segment kinds again with ids that make whole tiles full (long segments) and with ids in
    // no order, repeated apart and negative (the pre-pass's quick verdict from the ids' ranges must
    // stay exact: ranges that overlap decide nothing there)
    for (MaskSpec spec : {MaskSpec::document(), MaskSpec::causal_document(), MaskSpec::share_question(), MaskSpec::causal_blockwise()}) {
      MaskCase* c = add(fmt::format("{} long segments", km::mask_kind_name(spec.kind)), spec);
      c->doc_shape = {pr.batch, pr.s_k};
      c->doc_ids = segment_ids(pr.batch, pr.s_k, 40, g);
      c = add(fmt::format("{} unordered ids", km::mask_kind_name(spec.kind)), spec);
      c->doc_shape = {1, pr.s_k};
      for (int64_t t = 0; t < pr.s_k; ++t) c->doc_ids.push_back(static_cast<int32_t>(g() % 6) - 2);
    }
    struct Sparse {
      int64_t bq, bk;
      bool per_batch_head;
    };
    for (Sparse s : {Sparse{8, 16, true}, Sparse{5, 7, false}, Sparse{16, 16, true}}) {
      MaskCase* c = add(fmt::format("block_sparse {}x{} table {}", s.bq, s.bk, s.per_batch_head ? "[B, H, ..]" : "[1, 1, ..]"),
                        MaskSpec::block_sparse(s.bq, s.bk));
      c->table_shape = {s.per_batch_head ? pr.batch : 1, s.per_batch_head ? pr.heads : 1, (pr.s_q + s.bq - 1) / s.bq, (pr.s_k + s.bk - 1) / s.bk};
      for (int64_t i = 0; i < c->table_shape[0] * c->table_shape[1] * c->table_shape[2] * c->table_shape[3]; ++i)
        c->table.push_back(static_cast<uint8_t>(g() % 2));
    }
  }
  for (const MaskCase& c : cases) km::check_mask(c.spec, c.data(), c.pr);
  return cases;
}

struct TileSize {
  int64_t m, n;
};
// Powers of two like the GPU's, and ragged ones the interpreter also takes.
const TileSize kTiles[] = {{16, 16}, {8, 32}, {32, 8}, {13, 7}, {64, 64}};

std::string classes_text(const std::vector<BlockClass>& c, int64_t k_blocks) {
  std::string s;
  for (size_t i = 0; i < c.size(); ++i) s += (i % static_cast<size_t>(k_blocks) == 0 ? "\n" : "") + std::to_string(static_cast<int>(c[i]));
  return s;
}

// ---- kernels under test ----

// Out[b, h, i, j] = the library mask's allowed(i, j) as u8, one [BLOCK_M, BLOCK_N] tile per program.
// Grid: (cdiv(S_q, BM), cdiv(S_k, BN), B * H).
const Kernel& mask_tiles_kernel() {
  static const Kernel k = kernel("mask_tiles", [](Builder& kb) {
    const int64_t BM = kb.meta<int>("BLOCK_M", 16), BN = kb.meta<int>("BLOCK_N", 16);
    const MaskKind kind = km::mask_kind_meta(kb);
    auto Out = kb.tensor("Out", u8, 4);
    auto S_q = kb.scalar<int>("S_q"), S_k = kb.scalar<int>("S_k"), H = kb.scalar<int>("H");
    km::AttentionMask mask(kb, kind);
    auto bh = program_id(2), m0 = program_id(0) * BM, n0 = program_id(1) * BN;
    auto b = bh / H, h = bh % H;
    Tile allowed = mask.bind(b, h, S_q, S_k).allowed(m0 + arange(0, BM), n0 + arange(0, BN));
    store(Out.block({b, h, m0, n0}, {BM, BN}), cast(u8, allowed));
  });
  return k;
}

// Visits[b, qb, kb] += 1 for each tile the interval functions visit, Full[b, qb, kb] = tile_is_full:
// KV_MAJOR = false walks key_tiles of query tile program_id(0); true walks query_tiles of key tile
// program_id(0). Grid: (nQB or nKB, 1, B).
const Kernel& tile_ranges_kernel() {
  static const Kernel k = kernel("mask_tile_ranges", [](Builder& kb) {
    const int64_t BM = kb.meta<int>("BLOCK_M", 16), BN = kb.meta<int>("BLOCK_N", 16);
    const bool kv_major = kb.meta<bool>("KV_MAJOR", false);
    const MaskKind kind = km::mask_kind_meta(kb);
    auto Visits = kb.tensor("Visits", i32, 3), Full = kb.tensor("Full", u8, 3);
    auto S_q = kb.scalar<int>("S_q"), S_k = kb.scalar<int>("S_k");
    km::AttentionMask mask(kb, kind);
    auto b = program_id(2), t0 = program_id(0);
    km::SequenceMask seq = mask.bind(b, zeros(i32, {}), S_q, S_k);
    auto visit = [&](const Tile& m0, const Tile& n0) {
      auto at = [&](const Tensor& t) { return t.ptr() + b * t.stride(0) + (m0 / BM) * t.stride(1) + (n0 / BN) * t.stride(2); };
      store(at(Visits), load(at(Visits)) + 1);
      store(at(Full), cast(u8, seq.tile_is_full(m0, BM, n0, BN)));
    };
    if (kv_major) seq.query_tiles(t0 * BN, BN, BM).for_each(BM, [&](Tile m0) { visit(m0, t0 * BN); });
    else seq.key_tiles(t0 * BM, BM, BN).for_each(BN, [&](Tile n0) { visit(t0 * BM, n0); });
  });
  return k;
}

// Reads the pre-pass's lists through BlockMaskLists and writes the classes they describe:
// Out[b, h, outer, inner] = 1 (partial) or 2 (full), other entries untouched. Grid: (nOuter, H, B).
const Kernel& lists_reader_kernel() {
  static const Kernel k = kernel("mask_lists_reader", [](Builder& kb) {
    const bool kv_major = kb.meta<bool>("KV_MAJOR", false);
    auto Out = kb.tensor("Out", u8, 4);
    km::BlockMaskLists lists(kb, kv_major);
    auto outer = program_id(0), h = program_id(1), b = program_id(2);
    auto put = [&](const Tile& inner, int cls) {
      store(Out.ptr() + b * Out.stride(0) + h * Out.stride(1) + outer * Out.stride(2) + inner * Out.stride(3), scalar_constant(u8, cls));
    };
    for_range(0, lists.partial_count(b, h, outer), [&](Tile j) { put(lists.partial_block(b, h, outer, j), 1); });
    for_range(0, lists.full_count(b, h, outer), [&](Tile j) { put(lists.full_block(b, h, outer, j), 2); });
  });
  return k;
}

// What the pre-pass wrote for one case and tiling, per (mask batch, mask head).
struct PrePass {
  HostTensor classes, num, indices, full_num, full_indices;
};
PrePass run_pre_pass(const MaskCase& c, int64_t bm, int64_t bn, bool kv_major) {
  const int64_t nq = (c.pr.s_q + bm - 1) / bm, nk = (c.pr.s_k + bn - 1) / bn, outer = kv_major ? nk : nq, inner = kv_major ? nq : nk;
  const int64_t B = c.mask_batch(), H = c.mask_heads();
  PrePass p{HostTensor(u8, {B, H, nq, nk}), HostTensor(i32, {B, H, outer}), HostTensor(i32, {B, H, outer, inner}),
            HostTensor(i32, {B, H, outer}), HostTensor(i32, {B, H, outer, inner})};
  for (HostTensor* t : {&p.classes, &p.num, &p.indices, &p.full_num, &p.full_indices}) t->poison();
  MaskArgs mask(c);
  std::vector<rt::Arg> args{p.classes, c.pr.s_q, c.pr.s_k};
  args.insert(args.end(), mask.args.begin(), mask.args.end());
  interpret_any_shape(km::attention_block_classes().build({{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"MASK", static_cast<int>(c.spec.kind)}}), {nq, nk, B * H},
                args);
  interpret_any_shape(km::attention_block_lists().build({{"KV_MAJOR", kv_major}}), {outer, H, B},
                {p.classes, p.num, p.indices, p.full_num, p.full_indices});
  return p;
}

}  // namespace

TEST_CASE("host definitions on hand-written masks (bottom-right alignment, segments, tables)") {
  // Each row is one query, '1' = allowed key.
  auto dense = [](const MaskSpec& spec, const km::MaskData& data, int64_t s_q, int64_t s_k) {
    std::string s;
    for (int64_t q = 0; q < s_q; ++q) {
      for (int64_t k = 0; k < s_k; ++k) s += km::mask_allowed(spec, data, 0, 0, q, k, s_q, s_k) ? '1' : '.';
      s += '\n';
    }
    return s;
  };
  const km::MaskData none{};
  // S_q = 3 < S_k = 5: row i sits at key position i + 2
  CHECK(dense(MaskSpec::causal(), none, 3, 5) == "111..\n1111.\n11111\n");
  // S_q = 4 > S_k = 2: the first two rows precede every key
  CHECK(dense(MaskSpec::causal(), none, 4, 2) == "..\n..\n1.\n11\n");
  CHECK(dense(MaskSpec::sliding_window(1, 2), none, 5, 5) == "111..\n1111.\n.1111\n..111\n...11\n");
  CHECK(dense(MaskSpec::causal_sliding_window(1), none, 4, 4) == "1...\n11..\n.11.\n..11\n");
  CHECK(dense(MaskSpec::global_sliding_window(1, 1, 0), none, 5, 5) == "11111\n11...\n111..\n1.11.\n1..11\n");
  const std::vector<int32_t> prefix{2};
  CHECK(dense(MaskSpec::prefix_lm(), {{}, {prefix, {1}}, {}}, 4, 4) == "11..\n11..\n111.\n1111\n");
  // question = tokens 0-1 (id 7), answers 2-3 (id 8) and 4-6 (id 9)
  const std::vector<int32_t> seg{7, 7, 8, 8, 9, 9, 9};
  const km::MaskData docs{{seg, {1, 7}}, {}, {}};
  CHECK(dense(MaskSpec::share_question(), docs, 7, 7) == "1......\n11.....\n111....\n1111...\n11..1..\n11..11.\n11..111\n");
  // every segment causal in itself, the last one (id 9) sees all before it
  CHECK(dense(MaskSpec::causal_blockwise(), docs, 7, 7) == "1......\n11.....\n..1....\n..11...\n11111..\n111111.\n1111111\n");
  CHECK(dense(MaskSpec::causal_document(), docs, 7, 7) == "1......\n11.....\n..1....\n..11...\n....1..\n....11.\n....111\n");
  CHECK(dense(MaskSpec::document(), docs, 3, 7) == "....111\n....111\n....111\n");  // rows at positions 4..6
  const std::vector<uint8_t> table{1, 0, 0, 1};  // [1, 1, 2, 2] at 2 x 3 blocks
  CHECK(dense(MaskSpec::block_sparse(2, 3), {{}, {}, {table, {1, 1, 2, 2}}}, 3, 5) == "111..\n111..\n...11\n");
}

TEST_CASE("check_mask: a bad spec or data is a clear error naming the mask, the argument, the value and what is valid") {
  const km::MaskProblem pr{2, 4, 100, 128};
  auto error_of = [&](const MaskSpec& spec, const km::MaskData& data) {
    try {
      km::check_mask(spec, data, pr);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of(MaskSpec::sliding_window(-3, 2), {}) ==
        "attention mask 'sliding_window': window_left = -3 is invalid: windows count keys before the query (0 <= window_left <= 2^29)");
  CHECK(error_of(MaskSpec::global_sliding_window(4, 1, -1), {}).find("'global_sliding_window': window_right = -1 is invalid") != std::string::npos);
  CHECK(error_of(MaskSpec::global_sliding_window(-4, 1, 1), {}).find("global_tokens = -4 is invalid") != std::string::npos);
  const std::vector<int32_t> three{1, 2, 3}, two{5, -2};
  CHECK(error_of(MaskSpec::prefix_lm(), {{}, {three, {3}}, {}}) ==
        "attention mask 'prefix_lm': prefix_lengths has shape [3] but must be [B] = [2] (one prefix length per batch row)");
  CHECK(error_of(MaskSpec::prefix_lm(), {{}, {two, {2}}, {}}) ==
        "attention mask 'prefix_lm': prefix_lengths[1] = -2 is negative (a prefix is a count of tokens >= 0)");
  const std::vector<uint8_t> table(1 * 1 * 3 * 4, 1);
  CHECK(error_of(MaskSpec::block_sparse(32, 32), {{}, {}, {table, {1, 1, 3, 4}}}) ==
        "attention mask 'block_sparse': block_table has shape [1, 1, 3, 4] but must be [B or 1, H or 1, cdiv(S_q, block_q), "
        "cdiv(S_k, block_k)] = [2 or 1, 4 or 1, 4, 4] (block_q = 32, block_k = 32, S_q = 100, S_k = 128)");
  CHECK(error_of(MaskSpec::block_sparse(0, 32), {}).find("block_q = 0 is invalid") != std::string::npos);
  const std::vector<int32_t> ids(3 * 128, 0);
  CHECK(error_of(MaskSpec::document(), {{ids, {3, 128}}, {}, {}}) ==
        "attention mask 'document': doc_ids has shape [3, 128] but must be [B or 1, S_k] = [2 or 1, 128] (a document id per key token)");
  CHECK(error_of(MaskSpec::causal_document(), {{ids, {2, 128}}, {}, {}}).find("doc_ids holds 384 values but its shape [2, 128] needs 256") !=
        std::string::npos);
  CHECK(error_of(MaskSpec{static_cast<MaskKind>(42)}, {}).find("kind 42 is not one of 0 full, 1 causal") != std::string::npos);
  CHECK(error_of(MaskSpec::sliding_window(3), {}) == "no error");
}

TEST_CASE("host: the interval form equals the dense mask, interval classes equal brute force, allowed_count") {
  int interval_cases = 0;
  for (const MaskCase& c : mask_cases()) {
    INFO(c.label);
    const km::MaskData data = c.data();
    const auto dense = km::dense_mask(c.spec, data, c.pr);
    int64_t allowed = 0;
    for (uint8_t v : dense) allowed += v;
    // real data: never an all-masked case, and only `full` allows everything
    CHECK(allowed > 0);
    CHECK((allowed == static_cast<int64_t>(dense.size())) == (c.spec.kind == MaskKind::full));
    CHECK(km::allowed_count(c.spec, data, c.pr) == allowed);
    const auto iv = km::MaskIntervals::build(c.spec, data, c.pr);
    // generated segments are runs, except the unordered ids'
    const bool runs = c.label.find("unordered") == std::string::npos;
    CHECK(iv.has_value() == (c.spec.kind != MaskKind::block_sparse && runs));
    if (!iv) continue;
    ++interval_cases;
    size_t bad_rows = 0;
    for (int64_t b = 0; b < c.pr.batch; ++b)
      for (int64_t q = 0; q < c.pr.s_q; ++q) {
        const km::KeyIntervals r = iv->row(b, 0, q);
        std::vector<uint8_t> from_intervals(static_cast<size_t>(c.pr.s_k), 0);
        for (int i = 0; i < r.count; ++i)
          for (int64_t k = r.at[static_cast<size_t>(i)].begin; k < r.at[static_cast<size_t>(i)].end; ++k) from_intervals[static_cast<size_t>(k)] = 1;
        for (int i = 1; i < r.count; ++i) CHECK(r.at[static_cast<size_t>(i - 1)].end < r.at[static_cast<size_t>(i)].begin);  // disjoint, sorted
        const auto* row = dense.data() + ((b * c.pr.heads) * c.pr.s_q + q) * c.pr.s_k;
        bad_rows += !std::equal(from_intervals.begin(), from_intervals.end(), row);
      }
    CHECK(bad_rows == 0);
    for (TileSize t : kTiles)
      for (int64_t b = 0; b < c.pr.batch; ++b) {
        INFO(fmt::format("tiles {}x{}, b = {}", t.m, t.n, b));
        const auto brute = km::classify_blocks_brute_force(c.spec, data, c.pr, b, 0, t.m, t.n);
        const auto by_intervals = km::classify_blocks_by_intervals(*iv, c.pr, b, 0, t.m, t.n);
        CHECK_MESSAGE(brute == by_intervals, "brute force:" << classes_text(brute, (c.pr.s_k + t.n - 1) / t.n)
                                                            << "\nintervals:" << classes_text(by_intervals, (c.pr.s_k + t.n - 1) / t.n));
      }
  }
  CHECK(interval_cases > 40);
  // ids that reappear after another segment have no interval form (the mask itself is still defined)
  const std::vector<int32_t> ids{1, 1, 2, 1};
  CHECK_FALSE(km::MaskIntervals::build(MaskSpec::document(), {{ids, {1, 4}}, {}, {}}, {1, 1, 4, 4}).has_value());
  CHECK(km::allowed_count(MaskSpec::document(), {{ids, {1, 4}}, {}, {}}, {1, 1, 4, 4}) == 10);
}

TEST_CASE("every library mask in the interpreter equals the host's dense mask bit for bit") {
  for (const MaskCase& c : mask_cases())
    for (TileSize t : {TileSize{16, 16}, TileSize{13, 7}}) {
      INFO(c.label << fmt::format(", tiles {}x{}", t.m, t.n));
      HostTensor out(u8, {c.pr.batch, c.pr.heads, c.pr.s_q, c.pr.s_k});
      out.poison();
      MaskArgs mask(c);
      std::vector<rt::Arg> args{out, c.pr.s_q, c.pr.s_k, c.pr.heads};
      args.insert(args.end(), mask.args.begin(), mask.args.end());
      interpret_any_shape(mask_tiles_kernel().build({{"BLOCK_M", t.m}, {"BLOCK_N", t.n}, {"MASK", static_cast<int>(c.spec.kind)}}),
                    {(c.pr.s_q + t.m - 1) / t.m, (c.pr.s_k + t.n - 1) / t.n, c.pr.batch * c.pr.heads}, args);
      const auto want = km::dense_mask(c.spec, c.data(), c.pr);
      const auto got = ints_of(out);
      size_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
      CHECK(bad == 0);
    }
}

TEST_CASE("DSL key_tiles / query_tiles / tile_is_full visit exactly the non-empty tiles, once, and know the full ones") {
  int checked = 0;
  for (const MaskCase& c : mask_cases()) {
    if (!km::mask_has_tile_intervals(c.spec.kind)) continue;
    for (TileSize t : kTiles)
      for (bool kv_major : {false, true}) {
        INFO(c.label << fmt::format(", tiles {}x{}, {}", t.m, t.n, kv_major ? "query_tiles per key tile" : "key_tiles per query tile"));
        const int64_t nq = (c.pr.s_q + t.m - 1) / t.m, nk = (c.pr.s_k + t.n - 1) / t.n;
        HostTensor visits(i32, {c.pr.batch, nq, nk}), full(u8, {c.pr.batch, nq, nk});
        visits.fill(0);
        full.poison();
        MaskArgs mask(c);
        std::vector<rt::Arg> args{visits, full, c.pr.s_q, c.pr.s_k};
        args.insert(args.end(), mask.args.begin(), mask.args.end());
        interpret_any_shape(tile_ranges_kernel().build({{"BLOCK_M", t.m}, {"BLOCK_N", t.n}, {"KV_MAJOR", kv_major}, {"MASK", static_cast<int>(c.spec.kind)}}),
                      {kv_major ? nk : nq, 1, c.pr.batch}, args);
        const auto v = ints_of(visits), f = ints_of(full);
        size_t wrong_visits = 0, wrong_full = 0, non_empty = 0;
        for (int64_t b = 0; b < c.pr.batch; ++b) {
          const auto brute = km::classify_blocks_brute_force(c.spec, c.data(), c.pr, b, 0, t.m, t.n);
          for (size_t i = 0; i < brute.size(); ++i) {
            const size_t at = static_cast<size_t>(b) * brute.size() + i;
            non_empty += brute[i] != BlockClass::empty;
            wrong_visits += v[at] != (brute[i] != BlockClass::empty ? 1 : 0);
            if (v[at] == 1) wrong_full += (f[at] == 1) != (brute[i] == BlockClass::full);
          }
        }
        CHECK(non_empty > 0);
        CHECK(wrong_visits == 0);
        CHECK(wrong_full == 0);
        ++checked;
      }
  }
  CHECK(checked > 400);
}

TEST_CASE("block-mask pre-pass (attention_block_classes, attention_block_lists) in the interpreter: classes and lists equal brute force, both orders") {
  int checked = 0;
  for (const MaskCase& c : mask_cases())
    for (TileSize t : {TileSize{16, 16}, TileSize{8, 32}, TileSize{13, 7}})
      for (bool kv_major : {false, true}) {
        INFO(c.label << fmt::format(", tiles {}x{}, KV_MAJOR={}", t.m, t.n, kv_major));
        const PrePass p = run_pre_pass(c, t.m, t.n, kv_major);
        const int64_t nq = (c.pr.s_q + t.m - 1) / t.m, nk = (c.pr.s_k + t.n - 1) / t.n, outer = kv_major ? nk : nq, inner = kv_major ? nq : nk;
        const auto classes = ints_of(p.classes), num = ints_of(p.num), idx = ints_of(p.indices), fnum = ints_of(p.full_num),
                   fidx = ints_of(p.full_indices);
        size_t bad_classes = 0, bad_lists = 0;
        for (int64_t b = 0; b < c.mask_batch(); ++b)
          for (int64_t h = 0; h < c.mask_heads(); ++h) {
            const auto brute = km::classify_blocks_brute_force(c.spec, c.data(), c.pr, b, h, t.m, t.n);
            const km::BlockLists want = km::block_lists(brute, nq, nk, kv_major);
            const size_t bh = static_cast<size_t>(b * c.mask_heads() + h);
            for (size_t i = 0; i < brute.size(); ++i) bad_classes += classes[bh * brute.size() + i] != static_cast<int64_t>(brute[i]);
            for (int64_t o = 0; o < outer; ++o) {
              const size_t row = bh * static_cast<size_t>(outer) + static_cast<size_t>(o);
              bad_lists += num[row] != want.num[static_cast<size_t>(o)];
              bad_lists += fnum[row] != want.full_num[static_cast<size_t>(o)];
              for (int32_t j = 0; j < want.num[static_cast<size_t>(o)]; ++j)
                bad_lists += idx[row * static_cast<size_t>(inner) + static_cast<size_t>(j)] != want.indices[static_cast<size_t>(o * inner + j)];
              for (int32_t j = 0; j < want.full_num[static_cast<size_t>(o)]; ++j)
                bad_lists += fidx[row * static_cast<size_t>(inner) + static_cast<size_t>(j)] != want.full_indices[static_cast<size_t>(o * inner + j)];
            }
          }
        CHECK(bad_classes == 0);
        CHECK(bad_lists == 0);
        ++checked;
      }
  CHECK(checked > 400);
}

TEST_CASE("BlockMaskLists reads the pre-pass's lists back into the classes (batch and head extents of 1 broadcast)") {
  for (const MaskCase& c : mask_cases()) {
    // a document mask with one id row (lists [1, 1, ...]) read by B x H programs, and a per-head table
    if (!((c.spec.kind == MaskKind::causal_document && c.doc_shape[0] == 1) || (c.spec.kind == MaskKind::block_sparse && c.table_shape[1] > 1)))
      continue;
    for (bool kv_major : {false, true}) {
      INFO(c.label << ", KV_MAJOR=" << kv_major);
      const int64_t bm = 8, bn = 16, nq = (c.pr.s_q + bm - 1) / bm, nk = (c.pr.s_k + bn - 1) / bn;
      PrePass lists = run_pre_pass(c, bm, bn, kv_major);
      HostTensor got(u8, {c.pr.batch, c.pr.heads, kv_major ? nk : nq, kv_major ? nq : nk});
      got.fill(0);
      interpret_any_shape(lists_reader_kernel().build({{"KV_MAJOR", kv_major}}), {kv_major ? nk : nq, c.pr.heads, c.pr.batch},
                    {got, lists.num, lists.indices, lists.full_num, lists.full_indices});
      const auto g = ints_of(got);
      size_t bad = 0, non_empty = 0;
      for (int64_t b = 0; b < c.pr.batch; ++b)
        for (int64_t h = 0; h < c.pr.heads; ++h) {
          const auto brute = km::classify_blocks_brute_force(c.spec, c.data(), c.pr, b, h, bm, bn);
          for (int64_t qb = 0; qb < nq; ++qb)
            for (int64_t kb = 0; kb < nk; ++kb) {
              const int64_t o = kv_major ? kb : qb, i = kv_major ? qb : kb, inner = kv_major ? nq : nk;
              const int64_t want = static_cast<int64_t>(brute[static_cast<size_t>(qb * nk + kb)]);
              non_empty += want != 0;
              bad += g[static_cast<size_t>(((b * c.pr.heads + h) * (kv_major ? nk : nq) + o) * inner + i)] != want;
            }
        }
      CHECK(non_empty > 0);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("user mask_mods: a custom mask and the and/or combinators through the generic pre-pass") {
  // keys whose index is not a multiple of 3, and-ed with causal, or-ed with a stripe at key 5
  auto not_third = [](const km::MaskIndices& i) { return (i.kv % 3) != 0; };
  auto causal = [](const km::MaskIndices& i) { return i.kv <= i.position(); };
  auto stripe = [](const km::MaskIndices& i) { return i.kv == 5; };
  const Kernel k = km::block_classes_kernel("custom_block_classes", [&](Builder&) { return km::mask_or(km::mask_and(causal, not_third), stripe); });
  auto host = [](int64_t q, int64_t kk, int64_t s_q, int64_t s_k) { return (kk <= q + s_k - s_q && kk % 3 != 0) || kk == 5; };
  const km::MaskProblem pr{1, 1, 40, 45};
  const int64_t bm = 8, bn = 8, nq = 5, nk = 6;
  for (int64_t tiles : {1, 4}) {  // TILES = 4: key tiles 0-3 and 4-5 (a ragged last program)
  INFO("TILES=" << tiles);
  HostTensor classes(u8, {1, 1, nq, nk});
  classes.poison();
  interpret_any_shape(k.build({{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"TILES", tiles}}), {nq, (nk + tiles - 1) / tiles, 1}, {classes, pr.s_q, pr.s_k});
  const auto got = ints_of(classes);
  int counts[3] = {0, 0, 0};
  for (int64_t qb = 0; qb < nq; ++qb)
    for (int64_t kb = 0; kb < nk; ++kb) {
      int64_t allowed = 0, n = 0;
      for (int64_t q = qb * bm; q < std::min(pr.s_q, (qb + 1) * bm); ++q)
        for (int64_t kk = kb * bn; kk < std::min(pr.s_k, (kb + 1) * bn); ++kk) allowed += host(q, kk, pr.s_q, pr.s_k), ++n;
      const int64_t want = static_cast<int64_t>(km::block_class_of(allowed, n));
      ++counts[want];
      CHECK(got[static_cast<size_t>(qb * nk + kb)] == want);
    }
  CHECK(counts[1] > 0);  // empty and partial tiles occur (no tile is full: every third key is masked)
  CHECK(counts[0] > 0);
  }
  // a mask_mod that does not return i1 is a build error
  const Kernel bad = km::block_classes_kernel("bad_mask", [](Builder&) { return [](const km::MaskIndices& i) { return i.kv + 1; }; });
  CHECK_THROWS_WITH_AS(bad.build(), doctest::Contains("mask_mod: must return an i1 tile, got i32"), BuildError);
}

TEST_CASE("score mods: ALiBi and tanh soft-capping (and its derivative) equal the host formulas") {
  const int64_t H = 3, S_q = 20, S_k = 29, M = 20, N = 29;
  HostTensor scores(f32, {M, N}), slopes(f32, {H}), out(f32, {H, 3, M, N});
  scores.fill_normal(11, 0.0, 40.0);  // large enough for the cap to bend them
  slopes.fill_uniform(12, 0.01, 0.5);
  out.poison();
  const float cap = 30.0f;
  Kernel k = kernel("score_mods", [&](Builder& kb) {
    auto Scores = kb.tensor("scores", f32, 2), Out = kb.tensor("Out", f32, 4);
    km::AttentionScoreMod alibi(kb, km::ScoreModKind::alibi), softcap(kb, km::ScoreModKind::softcap);
    auto h = program_id(0);
    auto idx = km::mask_indices(zeros(i32, {}), h, arange(0, M), arange(0, N), scalar_constant(i32, S_q), scalar_constant(i32, S_k));
    Tile s = load(Scores.block({0, 0}, {M, N}));
    store(Out.block({h, 0, 0, 0}, {M, N}), alibi.mod(s, idx));
    store(Out.block({h, 1, 0, 0}, {M, N}), softcap.mod(s, idx));
    store(Out.block({h, 2, 0, 0}, {M, N}), softcap.mod.gradient(s, idx) + alibi.mod.gradient(s, idx) - 1.0f);  // ALiBi's is 1
  });
  interpret_any_shape(k.build(), {H}, {scores, out, slopes, cap});
  size_t bad_alibi = 0, bad_cap = 0, bad_grad = 0, bent = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t q = 0; q < M; ++q)
      for (int64_t kk = 0; kk < N; ++kk) {
        const float s = static_cast<float>(scores.get({q, kk})), slope = static_cast<float>(slopes.get({h}));
        float derivative = 0;
        const float capped = km::softcap_score_host(s, cap, &derivative);
        bad_alibi += out.get({h, 0, q, kk}) != km::alibi_score_host(s, slope, q, kk, S_q, S_k);
        bad_cap += std::abs(out.get({h, 1, q, kk}) - capped) > 2e-6 * cap;
        bad_grad += std::abs(out.get({h, 2, q, kk}) - derivative) > 1e-6;
        bent += std::abs(capped - s) > 1.0f;
      }
  CHECK(bad_alibi == 0);
  CHECK(bad_cap == 0);
  CHECK(bad_grad == 0);
  CHECK(bent > 100);
  CHECK(km::score_mod_parameter_names(km::ScoreModKind::alibi) == std::vector<std::string>{"score_alibi_slopes"});
}

namespace {

// A small attention forward (f32, online softmax) written the way an attention kernel integrates
// the library: interval masks walk key_tiles and mask only tiles that are not full (or cross S_k);
// LISTS=true reads the pre-pass's lists instead (partial tiles masked, full ones not). A score mod
// applies to natural-unit scores. Q, K, V, O: f32 [B, H, S, D]. Grid: (cdiv(S_q, BM), H, B).
const Kernel& masked_attention_kernel() {
  static const Kernel k = kernel("masked_attention", [](Builder& kb) {
    const int64_t BM = kb.meta<int>("BLOCK_M", 16), BN = kb.meta<int>("BLOCK_N", 16), D = kb.meta<int>("HEAD_DIM", 16);
    const bool use_lists = kb.meta<bool>("LISTS", false);
    const MaskKind kind = km::mask_kind_meta(kb);
    const km::ScoreModKind score_kind = km::score_mod_kind_meta(kb);
    auto Q = kb.tensor("Q", f32, 4), K = kb.tensor("K", f32, 4), V = kb.tensor("V", f32, 4), O = kb.tensor("O", f32, 4);
    auto scale = kb.scalar<float>("softmax_scale");
    std::optional<km::BlockMaskLists> lists;
    if (use_lists) lists.emplace(kb);
    km::AttentionMask mask(kb, kind);
    km::AttentionScoreMod score_mod(kb, score_kind);
    auto m_block = program_id(0), h = program_id(1), b = program_id(2), m0 = m_block * BM;
    auto S_q = Q.size(2), S_k = K.size(2);
    km::SequenceMask seq = mask.bind(b, h, S_q, S_k);
    auto rows = m0 + arange(0, BM);
    auto q = load(Q.block({b, h, m0, 0}, {BM, D}));
    Var acc = zeros(f32, {BM, D}), m = full(f32, {BM}, -INFINITY), l = zeros(f32, {BM});
    auto step = [&](const Tile& n0, const Tile& needs_mask) {
      auto cols = n0 + arange(0, BN);
      Var s = dot(q, trans(load(K.block({b, h, n0, 0}, {BN, D})))) * scale;
      km::MaskIndices idx = seq.indices(rows, cols);
      if (score_kind != km::ScoreModKind::none) s = score_mod.mod(s, idx);
      if_(needs_mask, [&] { s = where(seq.allowed(idx) & (cols < S_k)[row], s, -INFINITY); });
      auto m_new = maximum(m, max(s, 1));
      auto m_use = where(m_new == -INFINITY, 0.0f, m_new);
      auto p = exp(s - m_use[col]);
      auto alpha = exp(m - m_use);
      l = l * alpha + sum(p, 1);
      acc = acc * alpha[col] + dot(p, load(V.block({b, h, n0, 0}, {BN, D})));
      m = m_new;
    };
    if (use_lists) {
      for_range(0, lists->partial_count(b, h, m_block), [&](Tile j) { step(lists->partial_block(b, h, m_block, j) * BN, scalar_constant(i1, true)); });
      for_range(0, lists->full_count(b, h, m_block), [&](Tile j) {
        Tile n0 = lists->full_block(b, h, m_block, j) * BN;
        step(n0, n0 + BN > S_k);
      });
    } else {
      seq.key_tiles(m0, BM, BN).for_each(BN, [&](Tile n0) { step(n0, (!seq.tile_is_full(m0, BM, n0, BN)) | (n0 + BN > S_k)); });
    }
    store(O.block({b, h, m0, 0}, {BM, D}), where((l > 0.0f)[col], acc / l[col], 0.0f));
  });
  return k;
}

// O of the float64 reference: softmax over the allowed keys of score_mod(q . k * scale); rows with
// no allowed key give 0.
std::vector<double> reference_attention(const MaskCase& c, const HostTensor& Q, const HostTensor& K, const HostTensor& V, double scale,
                                        km::ScoreModKind score_kind, const HostTensor& slopes, double cap) {
  const int64_t D = Q.sizes()[3];
  const auto mask = km::dense_mask(c.spec, c.data(), c.pr);
  std::vector<double> out(static_cast<size_t>(c.pr.batch * c.pr.heads * c.pr.s_q * D), 0.0);
  for (int64_t b = 0; b < c.pr.batch; ++b)
    for (int64_t h = 0; h < c.pr.heads; ++h)
      for (int64_t i = 0; i < c.pr.s_q; ++i) {
        std::vector<double> s(static_cast<size_t>(c.pr.s_k), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.pr.s_k; ++j) {
          if (!mask[static_cast<size_t>(((b * c.pr.heads + h) * c.pr.s_q + i) * c.pr.s_k + j)]) continue;
          double x = 0;
          for (int64_t d = 0; d < D; ++d) x += Q.get({b, h, i, d}) * K.get({b, h, j, d});
          x *= scale;
          if (score_kind == km::ScoreModKind::alibi) x += slopes.get({h}) * static_cast<double>(j - (i + c.pr.s_k - c.pr.s_q));
          if (score_kind == km::ScoreModKind::softcap) x = cap * std::tanh(x / cap);
          s[static_cast<size_t>(j)] = x, mx = std::max(mx, x);
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < c.pr.s_k; ++j) o += s[static_cast<size_t>(j)] * V.get({b, h, j, d});
          out[static_cast<size_t>(((b * c.pr.heads + h) * c.pr.s_q + i) * D + d)] = o / sum;
        }
      }
  return out;
}

}  // namespace

TEST_CASE("a masked attention forward through the interface (intervals, pre-pass lists, score mods) matches float64 with the dense mask") {
  const int64_t D = 16, bm = 16, bn = 8;
  int checked = 0;
  for (const MaskCase& c : mask_cases()) {
    const bool intervals = km::mask_has_tile_intervals(c.spec.kind);
    for (bool use_lists : {false, true}) {
      if (!use_lists && !intervals) continue;
      const km::ScoreModKind score_kind = static_cast<km::ScoreModKind>(checked % km::kScoreModKindCount);
      INFO(c.label << (use_lists ? ", pre-pass lists" : ", key_tiles") << ", score mod " << km::score_mod_kind_name(score_kind));
      HostTensor Q(f32, {c.pr.batch, c.pr.heads, c.pr.s_q, D}), K(f32, {c.pr.batch, c.pr.heads, c.pr.s_k, D}),
          V(f32, {c.pr.batch, c.pr.heads, c.pr.s_k, D}), O(f32, {c.pr.batch, c.pr.heads, c.pr.s_q, D}), slopes(f32, {c.pr.heads});
      Q.fill_normal(1 + static_cast<uint64_t>(checked), 0, 1), K.fill_normal(2, 0, 1), V.fill_normal(3, 0, 1), slopes.fill_uniform(4, 0.05, 0.5);
      O.poison();
      const double scale = 0.25, cap = 2.0;
      std::optional<PrePass> lists;
      std::vector<rt::Arg> args{Q, K, V, O, scale};
      if (use_lists) {
        lists.emplace(run_pre_pass(c, bm, bn, false));
        for (HostTensor* t : {&lists->num, &lists->indices, &lists->full_num, &lists->full_indices}) args.emplace_back(*t);
      }
      MaskArgs mask(c);
      args.insert(args.end(), mask.args.begin(), mask.args.end());
      if (score_kind == km::ScoreModKind::alibi) args.emplace_back(slopes);
      if (score_kind == km::ScoreModKind::softcap) args.emplace_back(cap);
      interpret_any_shape(masked_attention_kernel().build({{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"HEAD_DIM", D}, {"LISTS", use_lists},
                                                     {"MASK", static_cast<int>(c.spec.kind)}, {"SCORE_MOD", static_cast<int>(score_kind)}}),
                    {(c.pr.s_q + bm - 1) / bm, c.pr.heads, c.pr.batch}, args);
      const auto want = reference_attention(c, Q, K, V, scale, score_kind, slopes, cap);
      const double err = rt::rel_error(O.to_f64(), want);
      CHECK(err < 1e-5);
      ++checked;
    }
  }
  CHECK(checked > 80);
}

TEST_CASE("build errors: interval functions of data-dependent masks, bad MASK metas, parameter order") {
  Kernel tiles_of_documents = kernel("doc_tiles", [](Builder& kb) {
    km::AttentionMask mask(kb, MaskKind::document);
    auto seq = mask.bind(zeros(i32, {}), zeros(i32, {}), scalar_constant(i32, 64), scalar_constant(i32, 64));
    seq.key_tiles(zeros(i32, {}), 16, 16);
  });
  CHECK_THROWS_WITH_AS(tiles_of_documents.build(),
                       doctest::Contains("key_tiles: mask 'document' has no interval form (its blocks depend on data): classify them with "
                                         "the block-mask pre-pass"),
                       BuildError);
  CHECK_THROWS_WITH_AS(km::attention_block_classes().build({{"MASK", 42}}),
                       doctest::Contains("meta-parameter MASK = 42 is not a mask kind; valid: 0 full, 1 causal, 2 sliding_window"), BuildError);
  CHECK_THROWS_WITH_AS(masked_attention_kernel().build({{"SCORE_MOD", 7}}),
                       doctest::Contains("meta-parameter SCORE_MOD = 7 is not a score mod kind; valid: 0 none, 1 alibi, 2 softcap"), BuildError);
  // the classification declares its own parameters, then the mask's in mask_parameter_names order;
  // the lists kernel the classes and the four lists of its order
  auto names_of = [](const ir::Function& fn) {
    std::vector<std::string> names;
    for (const auto& p : fn.params) names.push_back(p.name);
    return names;
  };
  for (int kind = 0; kind < km::kMaskKindCount; ++kind) {
    std::vector<std::string> want{"block_classes", "S_q", "S_k"};
    for (const std::string& n : km::mask_parameter_names(static_cast<MaskKind>(kind))) want.push_back(n);
    CHECK(names_of(km::attention_block_classes().build({{"MASK", kind}})) == want);
  }
  CHECK(names_of(km::attention_block_lists().build()) ==
        std::vector<std::string>{"block_classes", "kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"});
  CHECK(names_of(km::attention_block_lists().build({{"KV_MAJOR", true}})) ==
        std::vector<std::string>{"block_classes", "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"});
}

TEST_CASE("the pre-pass and a masked kernel lower to PTX that ptxas assembles for sm_90a") {
  if (testing::no_ptxas()) return;
  struct Case {
    std::string label;
    ir::Function fn;
    int num_warps = 4;
  };
  const std::vector<Case> cases = {
      // the attention forward's tiles and warps (a [128, 128] tile per iteration: 4 warps spill)
      {"attention_block_classes causal_document 128x128", km::attention_block_classes().build({{"MASK", static_cast<int>(MaskKind::causal_document)}}), 8},
      {"attention_block_classes block_sparse 64x128",
       km::attention_block_classes().build({{"MASK", static_cast<int>(MaskKind::block_sparse)}, {"BLOCK_M", 64}})},
      {"attention_block_lists KV_MAJOR", km::attention_block_lists().build({{"KV_MAJOR", true}})},
      {"mask_tiles share_question 64x64", mask_tiles_kernel().build({{"BLOCK_M", 64}, {"BLOCK_N", 64}, {"MASK", static_cast<int>(MaskKind::share_question)}})},
      {"mask_tile_ranges global_sliding_window", tile_ranges_kernel().build({{"MASK", static_cast<int>(MaskKind::global_sliding_window)}})},
      {"masked_attention prefix_lm alibi 32x32",
       masked_attention_kernel().build({{"BLOCK_M", 32}, {"BLOCK_N", 32}, {"MASK", static_cast<int>(MaskKind::prefix_lm)}, {"SCORE_MOD", 1}})},
  };
  for (const Case& c : cases)
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      INFO(c.label << " via " << jit::to_string(backend));
      const jit::CompiledKernel k = testing::assemble_sm90a(c.fn, backend, c.num_warps);
      CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
      MESSAGE(fmt::format("{} via {}: {}", c.label, jit::to_string(backend), k.info.to_string()));
    }
}

// The forward kernels the API launches under each library mask (attention::bundle_specs: D 128 on
// FA3's loop since decision 110 -- ring producer, P V pipelined, TMA stores of O --, D 64 the plain
// loop at two programs an SM), assembled by ptxas: no serialised wgmma, and no more spills than
// the budget recorded here (2026-11-30, ptxas 13.0, tilejit 0.1.16; absent: 0). Lower a budget when
// a change takes spills out; raising one needs a measurement that says they cost nothing.
TEST_CASE("the API's masked forward kernels: no serialised wgmma, spills within their budget") {
  if (testing::no_ptxas()) return;
  const std::map<std::string, int64_t> budget{
      // D 128 on the producer (168 registers at entry): the document masks' element tests (the
      // ids of a tile's rows and keys) -- 200 / 420 B before decision 107 too; measured 1.12-1.19x
      // the spill-free plain loop all the same (110); block-sparse the table's gather (107)
      {"D128 document", 196},
      {"D128 causal_document", 416},
      {"D128 block_sparse", 96},
      // D 64: the plain loop under the API's register bound for two programs an SM (128 registers)
      {"D64 sliding_window", 48},
      {"D64 causal_sliding_window", 48},
      {"D64 document", 32},
      {"D64 causal_document", 88},
      {"D64 prefix_lm", 52},
      {"D64 share_question", 220},
      {"D64 causal_blockwise", 260},
      {"D64 block_sparse", 472},
  };
  struct Job {
    std::string label;
    rt::BundleEntrySpec spec;
  };
  std::vector<Job> jobs;
  for (const int d : {64, 128})
    for (int kind = static_cast<int>(MaskKind::sliding_window); kind < km::kMaskKindCount; ++kind)
      for (rt::BundleEntrySpec& spec : attention::bundle_specs(ir::DType::bf16, d, static_cast<MaskKind>(kind), false, false))
        if (spec.kernel == "attention_fwd")
          jobs.push_back({fmt::format("D{} {}", d, km::mask_kind_name(static_cast<MaskKind>(kind))), std::move(spec)});
  REQUIRE(jobs.size() >= 18);  // (9 masks at two head dims)
  // COORDINATES_AT_USE (decision 114): the document masks' hoisted coordinates stay in the loop
  for (const char* name : {"D128 document", "D128 causal_document"})
    for (const Job& j : std::vector<Job>(jobs))
      if (j.label == name) {
        Job at_use{j.label + " COORDINATES_AT_USE", j.spec};
        at_use.spec.meta.emplace_back("COORDINATES_AT_USE", true);
        jobs.push_back(std::move(at_use));
      }
  std::vector<rt::BundleEntrySpec> specs;
  for (const Job& j : jobs) specs.push_back(j.spec);
  const std::vector<testing::AssembledSpec> built = testing::assemble_specs(specs, /*with_log=*/true);
  int producer = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    const testing::AssembledSpec& j = built[i];
    INFO(job.label << ": " << j.compiled.info.to_string() << j.error);
    REQUIRE(j.error.empty());
    CHECK(j.compiled.ptx.find("wgmma.mma_async") != std::string::npos);
    CHECK_MESSAGE(j.log.find("serialized") == std::string::npos, j.log);
    producer += j.compiled.ptx.find("setmaxnreg") != std::string::npos ? 1 : 0;
    const auto b = budget.find(job.label);
    const int64_t allowed = b == budget.end() ? 0 : b->second;
    MESSAGE(fmt::format("{}: {} B spilled (budget {})", job.label, j.compiled.info.spill_store_bytes, allowed));
    CHECK(j.compiled.info.spill_store_bytes <= allowed);
  }
  CHECK(producer == 9);  // D 128: masks 2-7 and block-sparse on the producer (decision 110), two of them again with 114
}

// The library's attention forward (kernels::attention_forward, meta MASK) on every pattern: bf16
// inputs, the pre-pass's lists for data-dependent masks, interval block skipping for the others;
// O against float64 with the dense mask, LSE finite exactly where a row sees a key.
TEST_CASE("attention_forward with MASK: every library mask matches float64 with the dense mask (O, and which rows see no key)") {
  const int64_t D = 64;
  int checked = 0;
  for (const MaskCase& c : mask_cases()) {
    if (c.spec.kind == MaskKind::full || c.spec.kind == MaskKind::causal) continue;  // the CAUSAL/full paths: test_attention
    const bool intervals = km::mask_has_tile_intervals(c.spec.kind);
    for (auto [bm, bn] : {std::pair<int64_t, int64_t>{16, 16}, {32, 16}}) {
      INFO(c.label << " blocks " << bm << "x" << bn);
      HostTensor Q(bf16, {c.pr.batch, c.pr.heads, c.pr.s_q, D}), K(bf16, {c.pr.batch, c.pr.heads, c.pr.s_k, D}),
          V(bf16, {c.pr.batch, c.pr.heads, c.pr.s_k, D}), O(bf16, {c.pr.batch, c.pr.heads, c.pr.s_q, D}),
          L(f32, {c.pr.batch, c.pr.heads, c.pr.s_q}), slopes(f32, {c.pr.heads});
      Q.fill_normal(5 + static_cast<uint64_t>(checked), 0, 1), K.fill_normal(6, 0, 1), V.fill_normal(7, 0, 1);
      O.poison();
      L.poison();
      const double scale = 0.125;
      std::vector<rt::Arg> args{Q, K, V, O, L, scale};
      MaskArgs mask(c);
      args.insert(args.end(), mask.args.begin(), mask.args.end());
      std::optional<PrePass> lists;
      if (!intervals) {
        lists.emplace(run_pre_pass(c, bm, bn, false));
        for (HostTensor* t : {&lists->num, &lists->indices, &lists->full_num, &lists->full_indices}) args.emplace_back(*t);
      }
      interpret_any_shape(kernels::attention_forward().build(
                        {{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"HEAD_DIM", D}, {"MASK", static_cast<int>(c.spec.kind)}}),
                    {(c.pr.s_q + bm - 1) / bm, c.pr.heads, c.pr.batch}, args);
      const auto want = reference_attention(c, Q, K, V, scale, km::ScoreModKind::none, slopes, 0);
      CHECK(rt::rel_error(O.to_f64(), want) < 1e-2);
      // LSE = -inf exactly for the rows that see no key
      const auto dense = km::dense_mask(c.spec, c.data(), c.pr);
      int64_t wrong = 0;
      for (int64_t r = 0; r < c.pr.batch * c.pr.heads * c.pr.s_q; ++r) {
        bool any = false;
        for (int64_t j = 0; j < c.pr.s_k; ++j) any |= dense[static_cast<size_t>(r * c.pr.s_k + j)] != 0;
        wrong += any != std::isfinite(L.get_flat(r)) ? 1 : 0;
      }
      CHECK(wrong == 0);
      ++checked;
    }
  }
  CHECK(checked > 40);
  // masks other than causal do not combine with CAUSAL or VARLEN (yet): a build error naming both
  CHECK_THROWS_WITH_AS(kernels::attention_forward().build({{"MASK", static_cast<int>(MaskKind::document)}, {"CAUSAL", true}}),
                       doctest::Contains("does not combine with CAUSAL=true"), BuildError);
}
