// The Hopper wgmma planner (jit/wgmma_plan): which dots run as wgmma with shared-memory tiles, which
// window loads become TMA copies (once, or through a ring of stages ahead of a loop),
// the fallbacks, and the shared-memory placement. Then the library's attention forward, compiled
// for sm_90a through both backends, must use it (wgmma with A from shared memory and from
// registers, 4-d TMA copies, mbarrier waits) and assemble without spills. Needs no GPU; the
// compile checks skip visibly without ptxas or nvrtc.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>

#include "jit/assign_layouts.hpp"
#include "jit/canonicalize.hpp"
#include "jit/compile.hpp"
#include "jit/nvrtc.hpp"
#include "jit/ptx_compiler.hpp"
#include "kernels/attention/forward.hpp"
#include "kernels/attention/backward.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;

namespace {

const ParamSpec kRowMajor{.align_bytes = 16, .contiguous_last = true};

// Attention's shape on [S, D] matrices: S = Q K^T, an elementwise softmax-like P, acc += P V.
// EXTRA_USE_V / EXTRA_USE_Q: the V (Q) window is also summed into R, a use other than a dot.
const Kernel attn_like = kernel("attn_like", [](Builder& k) {
  auto BM = k.meta<int>("BLOCK_M", 128), BN = k.meta<int>("BLOCK_N", 128), D = k.meta<int>("HEAD_DIM", 64);
  auto extra_v = k.meta<bool>("EXTRA_USE_V", false), extra_q = k.meta<bool>("EXTRA_USE_Q", false);
  auto Q = k.tensor("Q", bf16, 2, kRowMajor), K = k.tensor("K", bf16, 2, kRowMajor), V = k.tensor("V", bf16, 2, kRowMajor);
  auto O = k.tensor("O", f32, 2, kRowMajor), R = k.tensor("R", f32, 1, kRowMajor);
  auto n = k.scalar<int>("n");
  auto m0 = program_id(0) * BM;
  auto q = load(Q.block({m0, 0}, {BM, D}));
  Var acc = zeros(f32, {BM, D});
  Var r = zeros(f32, {D});
  for_range(0, n, BN, [&](Tile n0) {
    auto s = dot(q, trans(load(K.block({n0, 0}, {BN, D}))));
    auto p = exp2(s - max(s, 1)[col]);
    auto v = load(V.block({n0, 0}, {BN, D}));
    acc = acc + dot(cast(bf16, p), v);
    if (extra_v) r = r + sum(cast(f32, v), 0);
  });
  if (extra_q) r = r + sum(cast(f32, q), 0);
  store(O.block({m0, 0}, {BM, D}), acc);
  store(R.block({0}, {D}), r);
});

// B is computed (a scaled copy of a window), not a load.
const Kernel computed_b = kernel("computed_b", [](Builder& k) {
  auto A = k.tensor("A", bf16, 2, kRowMajor), B = k.tensor("B", bf16, 2, kRowMajor), C = k.tensor("C", f32, 2, kRowMajor);
  auto a = load(A.block({0, 0}, {128, 64}));
  auto bw = load(B.block({0, 0}, {64, 128}));
  auto b = bw + bw;
  store(C.block({0, 0}, {128, 128}), dot(a, b));
});

// S = Q K^T summed over K windows that no ring ahead of a top-level loop can fetch. WHERE 0: in a
// loop nested in another; 1: at an offset computed in the loop (not its counter); 2: under an if.
const Kernel k_in_loop = kernel("k_in_loop", [](Builder& k) {
  auto where_ = k.meta<int>("WHERE", 0);
  auto Q = k.tensor("Q", bf16, 2, kRowMajor), K = k.tensor("K", bf16, 2, kRowMajor), O = k.tensor("O", f32, 2, kRowMajor);
  auto n = k.scalar<int>("n");
  auto q = load(Q.block({0, 0}, {128, 64}));
  Var acc = zeros(f32, {128, 64});
  auto step = [&](Tile n0) {
    if (where_ == 1) n0 = n0 * 2 + 64;
    auto s = dot(q, trans(load(K.block({n0, 0}, {64, 64}))));
    acc = acc + s;
  };
  if (where_ == 0) for_range(0, n, [&](Tile) { for_range(0, n, 64, step); });
  if (where_ == 1) for_range(0, n, 64, step);
  if (where_ == 2) for_range(0, n, 64, [&](Tile n0) { if_(n0 < n - 64, [&] { step(n0); }); });
  store(O.block({0, 0}, {128, 64}), acc);
});

// One dot outside loops, B[K, N] MN-major: both tiles loaded once.
const Kernel once = kernel("once", [](Builder& k) {
  auto A = k.tensor("A", f16, 2, kRowMajor), B = k.tensor("B", f16, 2, kRowMajor), C = k.tensor("C", f32, 2, kRowMajor);
  auto a = load(A.block({0, 0}, {128, 128}));
  auto b = load(B.block({0, 0}, {128, 256}));
  store(C.block({0, 0}, {128, 256}), dot(a, b));
});

// A function and the layout plan of it (the plan points into the function: kept together, unmoved).
struct Planned {
  ir::Function fn;
  jit::LayoutPlan plan;
  const jit::HopperPlan& hopper() const { return plan.hopper; }
};

std::unique_ptr<Planned> plan_of(const Kernel& kern, const Meta& meta, int num_warps = 8, const std::string& arch = "sm_90a",
                                 int stages = 2) {
  auto p = std::make_unique<Planned>();
  p->fn = kern.build(meta);
  jit::canonicalize(p->fn);
  jit::PipelineOptions opts;
  opts.stages = stages;
  p->plan = jit::assign_layouts(p->fn, num_warps, arch, opts);
  return p;
}

void collect(const ir::Block& b, ir::OpKind kind, std::vector<const ir::Op*>& out) {
  for (const ir::Op& op : b.ops) {
    if (op.kind == kind) out.push_back(&op);
    for (const ir::Block& r : op.regions) collect(r, kind, out);
  }
}
// The ops of one kind in program order.
std::vector<const ir::Op*> ops_of(const ir::Function& f, ir::OpKind kind) {
  std::vector<const ir::Op*> v;
  collect(f.body, kind, v);
  return v;
}

// The tensor parameter a tile load reads, by name.
std::string param_name(const Planned& p, const jit::SmemTile& t) { return p.fn.params.at(static_cast<size_t>(t.param_index)).name; }
const jit::SmemTile* tile_of(const Planned& p, const std::string& param) {
  for (const auto& [op, t] : p.hopper().tiles)
    if (param_name(p, t) == param) return &t;
  return nullptr;
}

// Every invariant of the placement: 1024-byte-aligned tiles and stages that do not overlap, then
// the barriers (8 bytes each, after all the data), all within persistent_bytes.
void check_placement(const jit::HopperPlan& h) {
  int64_t data_end = 0;
  std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end) of once tiles and whole rings
  for (const ir::Op* op : h.tile_order) {
    const jit::SmemTile& t = h.tiles.at(op);
    CHECK(t.offset % 1024 == 0);
    CHECK(t.bytes() == t.rows * t.cols * 2);
    if (t.ring) {
      const jit::SmemRing& r = h.rings.at(t.ring);
      CHECK(t.offset + t.bytes() <= r.stage_bytes);
    } else {
      spans.emplace_back(t.offset, t.offset + t.bytes());
      data_end = std::max(data_end, t.offset + t.bytes());
    }
  }
  for (const ir::Op* loop : h.ring_order) {
    const jit::SmemRing& r = h.rings.at(loop);
    CHECK(r.base % 1024 == 0);
    CHECK(r.stage_bytes % 1024 == 0);
    CHECK(r.stages >= 2);
    CHECK(r.stages <= 8);
    spans.emplace_back(r.base, r.base + r.stages * r.stage_bytes);
    data_end = std::max(data_end, r.base + r.stages * r.stage_bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) CHECK(spans[i - 1].second <= spans[i].first);
  std::vector<int64_t> barriers;
  for (const ir::Op* op : h.tile_order)
    if (!h.tiles.at(op).ring) barriers.push_back(h.tiles.at(op).barrier);
  for (const ir::Op* loop : h.ring_order) {
    const jit::SmemRing& r = h.rings.at(loop);
    CHECK(r.released == r.full + 8 * r.stages);
    for (int s = 0; s < r.stages; ++s) barriers.push_back(r.full + 8 * s), barriers.push_back(r.released + 8 * s);
  }
  std::sort(barriers.begin(), barriers.end());
  for (size_t i = 0; i < barriers.size(); ++i) {
    CHECK(barriers[i] % 8 == 0);
    CHECK(barriers[i] >= data_end);
    if (i) CHECK(barriers[i] >= barriers[i - 1] + 8);
    CHECK(barriers[i] + 8 <= h.persistent_bytes);
  }
  CHECK(data_end <= h.persistent_bytes);
  CHECK(h.persistent_bytes % 128 == 0);
}

// The placement as plain numbers (by parameter and program order), to compare two builds.
std::vector<int64_t> placement_numbers(const Planned& p) {
  const jit::HopperPlan& h = p.hopper();
  std::vector<int64_t> v{h.persistent_bytes};
  for (const ir::Op* op : h.tile_order) {
    const jit::SmemTile& t = h.tiles.at(op);
    v.insert(v.end(), {t.param_index, t.offset, t.barrier, t.ring != nullptr, t.rows, t.cols});
  }
  for (const ir::Op* loop : h.ring_order) {
    const jit::SmemRing& r = h.rings.at(loop);
    v.insert(v.end(), {r.stages, r.base, r.stage_bytes, r.full, r.released, static_cast<int64_t>(r.loads.size())});
  }
  return v;
}

}  // namespace

TEST_CASE("wgmma plan: attention's loop runs both dots on wgmma, Q once, K and V through one ring, P from registers") {
  for (int d : {64, 128, 256}) {
    INFO("HEAD_DIM " << d);
    const int bn = d == 256 ? 64 : 128;
    auto p = plan_of(attn_like, {{"HEAD_DIM", d}, {"BLOCK_N", bn}});
    const jit::HopperPlan& h = p->hopper();
    const auto dots = ops_of(p->fn, ir::OpKind::dot);
    const auto loops = ops_of(p->fn, ir::OpKind::for_);
    REQUIRE(dots.size() == 2);
    REQUIRE(loops.size() == 1);
    REQUIRE(h.dots.size() == 2);
    REQUIRE(h.tiles.size() == 3);
    REQUIRE(h.rings.size() == 1);
    const jit::SmemTile *q = tile_of(*p, "Q"), *kt = tile_of(*p, "K"), *v = tile_of(*p, "V");
    REQUIRE(q);
    REQUIRE(kt);
    REQUIRE(v);
    // Q: loaded once (outside the loop), [128, d] as d/64 chunks, box {64, 128}
    CHECK(q->ring == nullptr);
    CHECK(q->rows == 128);
    CHECK(q->cols == d);
    CHECK(q->row_dim == 0);
    CHECK(q->box == std::vector<int64_t>{64, 128});
    CHECK(q->chunk_bytes() == 128 * 128);
    // K and V: one ring ahead of the loop, in program order
    CHECK(kt->ring == loops[0]);
    CHECK(v->ring == loops[0]);
    CHECK(kt->box == std::vector<int64_t>{64, bn});
    const jit::SmemRing& ring = h.rings.at(loops[0]);
    CHECK(ring.loop == loops[0]);
    CHECK(ring.loads == std::vector<const ir::Op*>{kt->load, v->load});
    CHECK(ring.stages == 2);
    CHECK(h.tile_order == std::vector<const ir::Op*>{q->load, kt->load, v->load});
    CHECK(h.ring_order == std::vector<const ir::Op*>{loops[0]});
    // S = Q K^T: A = the Q tile, B = K through trans (K-major)
    const jit::WgmmaDot& s = h.dots.at(dots[0]);
    CHECK(s.a_tile == q->load);
    CHECK(s.b_tile == kt->load);
    CHECK_FALSE(s.b_mn_major);
    // acc += P V: A = cast(P) from registers, B = V[BN, D] directly (MN-major)
    const jit::WgmmaDot& pv = h.dots.at(dots[1]);
    CHECK(pv.a_tile == nullptr);
    CHECK(pv.b_tile == v->load);
    CHECK(pv.b_mn_major);
    check_placement(h);
    // both dots accumulate in the wgmma layout
    for (const ir::Op* dot : dots) {
      const auto& layout = p->plan.natural.at(dot->results[0]);
      REQUIRE(layout.has_value());
    }
  }
}

TEST_CASE("wgmma plan: four warps, one warpgroup, BLOCK_M 64") {
  auto p = plan_of(attn_like, {{"BLOCK_M", 64}, {"BLOCK_N", 64}}, 4);
  CHECK(p->hopper().dots.size() == 2);
  CHECK(p->hopper().tiles.size() == 3);
  check_placement(p->hopper());
}

TEST_CASE("wgmma plan: a dot whose B is computed, not loaded, is not planned (nor its A window)") {
  auto p = plan_of(computed_b, {});
  CHECK(p->hopper().empty());
  CHECK(p->hopper().tiles.empty());
  CHECK(p->hopper().rings.empty());
  CHECK(p->hopper().persistent_bytes == 0);
}

TEST_CASE("wgmma plan: a window with a use other than a wgmma operand stays in registers") {
  SUBCASE("V also summed: the P V dot falls back, S = Q K^T keeps its tiles") {
    auto p = plan_of(attn_like, {{"EXTRA_USE_V", true}});
    const jit::HopperPlan& h = p->hopper();
    const auto dots = ops_of(p->fn, ir::OpKind::dot);
    REQUIRE(dots.size() == 2);
    CHECK(h.dots.size() == 1);
    CHECK(h.dots.count(dots[0]) == 1);
    CHECK(h.dots.count(dots[1]) == 0);
    CHECK(tile_of(*p, "V") == nullptr);
    REQUIRE(tile_of(*p, "Q"));
    REQUIRE(tile_of(*p, "K"));
    REQUIRE(h.rings.size() == 1);
    CHECK(h.rings.begin()->second.loads == std::vector<const ir::Op*>{tile_of(*p, "K")->load});
    check_placement(h);
  }
  SUBCASE("Q also summed: S = Q K^T takes A from registers, K stays a tile") {
    auto p = plan_of(attn_like, {{"EXTRA_USE_Q", true}});
    const jit::HopperPlan& h = p->hopper();
    const auto dots = ops_of(p->fn, ir::OpKind::dot);
    REQUIRE(dots.size() == 2);
    CHECK(h.dots.size() == 2);
    CHECK(tile_of(*p, "Q") == nullptr);
    REQUIRE(h.dots.count(dots[0]) == 1);
    CHECK(h.dots.at(dots[0]).a_tile == nullptr);
    CHECK(h.dots.at(dots[0]).b_tile == tile_of(*p, "K")->load);
    CHECK(h.tiles.size() == 2);
    check_placement(h);
  }
}

TEST_CASE("wgmma plan: a window under an if is not a tile (its dot falls back); one at an offset computed from the counter is") {
  {
    auto p = plan_of(k_in_loop, {{"WHERE", 2}});
    CHECK(ops_of(p->fn, ir::OpKind::dot).size() == 1);
    CHECK(p->hopper().empty());
    CHECK(p->hopper().tiles.empty());
    CHECK(p->hopper().rings.empty());
  }
  {
    // n0 * 2 + 64: a ring tile whose refill evaluates the offset's ops again for the iteration it
    // prefetches (what lets a masked attention walk key blocks read from a list)
    auto p = plan_of(k_in_loop, {{"WHERE", 1}});
    const jit::HopperPlan& h = p->hopper();
    REQUIRE(h.rings.size() == 1);
    const jit::SmemTile* k = tile_of(*p, "K");
    REQUIRE(k);
    CHECK(k->ring != nullptr);
    std::vector<ir::OpKind> kinds;  // the multiply, then the add (and any constants they use)
    for (const ir::Op* op : k->offset_ops)
      if (op->kind != ir::OpKind::constant) kinds.push_back(op->kind);
    CHECK(kinds == std::vector<ir::OpKind>{ir::OpKind::mul, ir::OpKind::add});
  }
}

// (At e4f1393 a window in a nested loop is not a tile; work in progress gives the inner loop a ring
// that is reset after each run. Either way no ring runs ahead of the outer loop.)
TEST_CASE("wgmma plan: a window in a nested loop rides the inner loop's ring, never the outer loop's") {
  auto p = plan_of(k_in_loop, {{"WHERE", 0}});
  const auto loops = ops_of(p->fn, ir::OpKind::for_);
  REQUIRE(loops.size() == 2);
  CHECK(p->hopper().rings.count(loops[0]) == 0);
  const jit::SmemTile* kt = tile_of(*p, "K");
  REQUIRE(kt);
  CHECK(kt->ring == loops[1]);
  CHECK(p->hopper().dots.size() == 1);
  CHECK(p->hopper().rings.at(loops[1]).rerun);  // reset after each run of the inner loop
  check_placement(p->hopper());
}

TEST_CASE("wgmma plan: empty for M not a multiple of 64, for sm_80, without the pipeline, and for odd columns") {
  SUBCASE("BLOCK_M 32") {
    CHECK(plan_of(attn_like, {{"BLOCK_M", 32}})->hopper().empty());
    CHECK(plan_of(attn_like, {{"BLOCK_M", 32}}, 4)->hopper().empty());
    CHECK_FALSE(plan_of(attn_like, {{"BLOCK_M", 64}}, 4)->hopper().empty());
  }
  SUBCASE("warps not a multiple of 4") { CHECK(plan_of(attn_like, {}, 2)->hopper().empty()); }
  SUBCASE("sm_80") {
    auto p = plan_of(attn_like, {}, 8, "sm_80");
    CHECK(p->hopper().empty());
    CHECK(p->hopper().tiles.empty());
    CHECK(p->hopper().persistent_bytes == 0);
  }
  SUBCASE("pipeline disabled") {
    auto p = std::make_unique<Planned>();
    p->fn = attn_like.build();
    jit::canonicalize(p->fn);
    jit::PipelineOptions opts;
    opts.enabled = false;
    p->plan = jit::assign_layouts(p->fn, 8, "sm_90a", opts);
    CHECK(p->hopper().empty());
  }
  SUBCASE("tile columns not a multiple of 64 (HEAD_DIM 16 and 32)") {
    for (int d : {16, 32}) {
      INFO("HEAD_DIM " << d);
      auto p = plan_of(attn_like, {{"HEAD_DIM", d}});
      CHECK(p->hopper().empty());
      CHECK(p->hopper().tiles.empty());
    }
  }
}

TEST_CASE("wgmma plan: tiles loaded once (B MN-major), each with its barrier after the data") {
  auto p = plan_of(once, {});
  const jit::HopperPlan& h = p->hopper();
  REQUIRE(h.dots.size() == 1);
  const jit::WgmmaDot& w = h.dots.begin()->second;
  const jit::SmemTile *a = tile_of(*p, "A"), *b = tile_of(*p, "B");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(w.a_tile == a->load);
  CHECK(w.b_tile == b->load);
  CHECK(w.b_mn_major);
  CHECK(h.rings.empty());
  CHECK(a->ring == nullptr);
  CHECK(b->ring == nullptr);
  CHECK(a->offset == 0);
  CHECK(b->offset == 128 * 128 * 2);
  CHECK(b->box == std::vector<int64_t>{64, 128});  // B[K = 128, N = 256]: rows are K
  CHECK(a->barrier == 128 * 128 * 2 + 128 * 256 * 2);
  CHECK(b->barrier == a->barrier + 8);
  CHECK(h.persistent_bytes == 98304 + 128);
  check_placement(h);
}

TEST_CASE("wgmma plan: stages are cut to fit the 200 KB budget, clamped to [2, 8], and the placement is deterministic") {
  auto stages_of = [](const Planned& p) {
    REQUIRE(p.hopper().rings.size() == 1);
    return p.hopper().rings.begin()->second.stages;
  };
  SUBCASE("D 128, BLOCK_N 128, 4 stages asked: Q 32 KB + 64 KB a stage leaves room for 2") {
    auto p = plan_of(attn_like, {{"HEAD_DIM", 128}}, 8, "sm_90a", 4);
    CHECK(stages_of(*p) == 2);
    CHECK(p->hopper().rings.begin()->second.stage_bytes == 65536);
    CHECK(p->hopper().persistent_bytes <= 200 * 1024);
    check_placement(p->hopper());
  }
  SUBCASE("D 128, BLOCK_N 64, 4 stages asked: 32 KB a stage, all 4 fit") {
    auto p = plan_of(attn_like, {{"HEAD_DIM", 128}, {"BLOCK_N", 64}}, 8, "sm_90a", 4);
    CHECK(stages_of(*p) == 4);
    CHECK(p->hopper().persistent_bytes <= 200 * 1024);
    check_placement(p->hopper());
  }
  SUBCASE("D 256, BLOCK_N 64, 4 stages asked: 2 (Q 64 KB + 2 x 64 KB)") {
    auto p = plan_of(attn_like, {{"HEAD_DIM", 256}, {"BLOCK_N", 64}}, 8, "sm_90a", 4);
    CHECK(stages_of(*p) == 2);
    CHECK(p->hopper().persistent_bytes <= 200 * 1024);
    check_placement(p->hopper());
  }
  SUBCASE("clamped: 1 asked gives 2, 12 asked gives at most 8") {
    CHECK(stages_of(*plan_of(attn_like, {{"BLOCK_N", 64}}, 8, "sm_90a", 1)) == 2);
    auto p = plan_of(attn_like, {{"BLOCK_N", 64}}, 8, "sm_90a", 12);  // Q 16 KB, 16 KB a stage
    CHECK(stages_of(*p) == 8);
    check_placement(p->hopper());
  }
  SUBCASE("the same kernel built twice gives the same placement") {
    for (int d : {64, 128, 256}) {
      const Meta meta{{"HEAD_DIM", d}, {"BLOCK_N", d == 256 ? 64 : 128}};
      auto a = plan_of(attn_like, meta, 8, "sm_90a", 3);
      auto b = plan_of(attn_like, meta, 8, "sm_90a", 3);
      CHECK(placement_numbers(*a) == placement_numbers(*b));
      CHECK(placement_numbers(*a).size() > 1);
    }
  }
}

// The library's attention forward with its Hopper schedule: BLOCK_M 128, BLOCK_N 128 (64 for head
// dim 256), 8 warps, 2 stages.
TEST_CASE("attention forward on sm_90a: wgmma (A from shared memory and registers), 4-d TMA, mbarriers; ptxas, no spills") {
  if (jit::find_ptxas().empty()) {
    MESSAGE("skipped: no ptxas on TILEJIT_PTXAS, PATH or the CUDA root");
    return;
  }
  std::string why;
  const bool have_nvrtc = jit::nvrtc_available(&why);
  if (!have_nvrtc) MESSAGE("skipping the nvrtc backend: " << why);
  for (int d : {64, 128, 256})
  for (bool causal : {false, true}) {
    const int bn = d == 256 ? 64 : 128;
    ir::Function fn = kernels::attention_forward().build({{"HEAD_DIM", d}, {"CAUSAL", causal}, {"BLOCK_M", 128}, {"BLOCK_N", bn}});
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      if (backend == jit::Backend::Nvrtc && !have_nvrtc) continue;
      INFO("HEAD_DIM " << d << " causal=" << causal << " via " << jit::to_string(backend));
      jit::CompileOptions o;
      o.backend = backend;
      o.num_warps = 8;
      o.pipeline.stages = 2;
      o.ptx_tool = jit::PtxTool::Ptxas;
      jit::CompiledKernel k = jit::compile(fn, o);
      // the two forms of wgmma, one line each: "{acc}, {%r, %r, %r, %r}, %rd" (A in registers) and
      // "{acc}, %rd, %rd" (A and B descriptors)
      int smem_a = 0, reg_a = 0;
      bool s_shape = false, pv_shape = false;
      size_t at = 0;
      while ((at = k.ptx.find("wgmma.mma_async", at)) != std::string::npos) {
        const size_t eol = k.ptx.find('\n', at);
        const std::string line = k.ptx.substr(at, eol - at);
        at = eol;
        if (line.find("}, {%r") != std::string::npos) {
          ++reg_a;
          pv_shape |= line.find(fmt::format("m64n{}k16.f32.bf16.bf16", d)) != std::string::npos;
        } else if (line.find("}, %rd") != std::string::npos) {
          ++smem_a;
          s_shape |= line.find(fmt::format("m64n{}k16.f32.bf16.bf16", bn)) != std::string::npos;
        }
      }
      CHECK(smem_a > 0);
      CHECK(reg_a > 0);
      CHECK(s_shape);   // S = Q K^T: m64n{BLOCK_N}
      CHECK(pv_shape);  // acc += P V: m64n{HEAD_DIM}
      CHECK(k.ptx.find("cp.async.bulk.tensor.4d") != std::string::npos);
      CHECK(k.ptx.find("mbarrier.try_wait") != std::string::npos);
      CHECK(k.ptx.find("wgmma.fence") != std::string::npos);
      CHECK(k.ptx.find("wgmma.commit_group") != std::string::npos);
      CHECK(k.ptx.find("wgmma.wait_group") != std::string::npos);
      // Q, K, V; and O where it leaves by TMA stores (the D 64 and D 128 default, decisions 056, 076)
      CHECK(k.tensor_maps.size() == (d <= 128 ? 4u : 3u));
      CHECK(k.smem_bytes > 0);
      CHECK(k.cubin.size() > 1000);
      if (d <= 128) {
        CHECK_MESSAGE(k.info.spill_store_bytes == 0, k.info.to_string());
        CHECK_MESSAGE(k.info.spill_load_bytes == 0, k.info.to_string());
      } else {
        // D 256: the [128, 256] f32 accumulator alone is 128 registers a thread; a few hundred bytes
        // spill at 255 registers (reported; bounded so that a blow-up fails)
        CHECK_MESSAGE(k.info.spill_store_bytes <= 1024, k.info.to_string());
      }
      MESSAGE(fmt::format("attention D{} causal={} via {}: {} wgmma lines (A smem) + {} (A regs), {} B dynamic smem; {}", d, causal,
                          jit::to_string(backend), smem_a, reg_a, k.smem_bytes, k.info.to_string()));
    }
  }
}

TEST_CASE("wgmma plan: a nested loop gets its own ring, reset after each run; tiles beyond shared memory are a clear error") {
  // attention_bwd_dkdv loops over the query heads of a group, then over query blocks: the inner
  // loop's Q and dO windows ride a ring that is reset (barriers re-initialised) after each run.
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 8;
  o.pipeline.stages = 2;
  auto dkdv = kernels::attention_backward_dkdv().build({{"HEAD_DIM", 128}, {"BLOCK_N", 128}, {"BLOCK_M", 64}});
  jit::CompiledKernel k = jit::compile(dkdv, o);
  CHECK(k.ptx.find("wgmma.mma_async") != std::string::npos);
  CHECK(k.ptx.find("mma.sync") == std::string::npos);
  CHECK(k.ptx.find("mbarrier.inval.shared::cta.b64") != std::string::npos);
  CHECK(k.ptx.find("cp.async.bulk.tensor.4d") != std::string::npos);
  // 128x128 tiles at D = 256 with two stages need 320 KB: an error at compile time, not at launch.
  auto big = kernels::attention_forward().build({{"HEAD_DIM", 256}, {"BLOCK_M", 128}, {"BLOCK_N", 128}});
  CHECK_THROWS_WITH_AS(jit::compile(big, o),
                       doctest::Contains("needs 327808 B of shared memory"), jit::LoweringError);
}

TEST_CASE("schedule: independent dots issue early and stay in flight until their results are read") {
  // dK/dV: S^T = K Q^T and dP^T = V dO^T do not depend on each other: both issue before P^T's
  // exponentials, which wait for the first only (wait_group 1), and dV's MMA overlaps dS^T.
  jit::CompileOptions o;
  o.make_cubin = false;
  o.num_warps = 8;
  o.pipeline.stages = 2;
  o.dump_after = "schedule";
  auto dkdv = kernels::attention_backward_dkdv().build({{"HEAD_DIM", 128}, {"BLOCK_N", 128}, {"BLOCK_M", 64}});
  jit::CompiledKernel k = jit::compile(dkdv, o);
  const size_t first_dot = k.dump.find(" = dot "), second_dot = k.dump.find(" = dot ", first_dot + 1);
  const size_t first_exp = k.dump.find(" = exp2 ");
  REQUIRE(first_exp != std::string::npos);
  CHECK(second_dot < first_exp);
  CHECK(k.ptx.find("wgmma.wait_group.sync.aligned 1;") != std::string::npos);
  // Without the Hopper path nothing moves (the dump equals the canonical IR).
  o.arch = "sm_80";
  jit::CompiledKernel g = jit::compile(dkdv, o);
  CHECK(g.dump == g.tile_ir);
}

// Issue 28, found by random programs: the planner divided by zero on a 16-bit dot with one output
// column on two warpgroups (SIGFPE), and dot hoisting moved a constant twice when a dot read it as
// both operands (two equal tiles merged by CSE): heap corruption. Both compile now, and the second
// computes what the interpreter does.
const Kernel one_column_dot = kernel("one_column_dot", [](Builder& k) {
  auto A = k.tensor("A", bf16, 2, kRowMajor), B = k.tensor("B", bf16, 2, kRowMajor), C = k.tensor("C", f32, 2, kRowMajor);
  store(C.block({0, 0}, {64, 1}), dot(load(A.block({0, 0}, {64, 16})), load(B.block({0, 0}, {16, 1}))));
});
const Kernel same_constant_dot = kernel("same_constant_dot", [](Builder& k) {
  auto C = k.tensor("C", f32, 2, kRowMajor);
  auto n = k.scalar<int>("n");
  Var acc = zeros(f32, {64, 64});
  for_range(0, n, [&](Tile) { acc = dot(full(bf16, {64, 64}, 1.0), full(bf16, {64, 64}, 1.0), acc); });
  store(C.block({0, 0}, {64, 64}), acc);
});

TEST_CASE("issue 28: a one-column dot on 8 warps and a dot of one constant with itself compile") {
  for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
    if (backend == jit::Backend::Nvrtc && !jit::nvrtc_available()) continue;
    jit::CompileOptions o;
    o.backend = backend;
    o.make_cubin = false;
    o.num_warps = 8;
    INFO(jit::to_string(backend));
    const jit::CompiledKernel a = jit::compile(one_column_dot.build(), o);
    CHECK(a.ptx.find(".entry one_column_dot") != std::string::npos);
    o.num_warps = 4;
    const jit::CompiledKernel b = jit::compile(same_constant_dot.build(), o);
    CHECK(b.ptx.find(".entry same_constant_dot") != std::string::npos);
  }
  // what it computes: n steps of 64 ones times ones
  runtime::HostTensor c(f32, {64, 64});
  runtime::interpret(same_constant_dot.build(), {1}, {c, int32_t{3}});
  for (int64_t i = 0; i < 64 * 64; ++i) REQUIRE(c.get_flat(i) == 192.0);
}
