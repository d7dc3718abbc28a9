// One TMA ring over consecutive loops (jit/wgmma_plan.hpp SmemRing::chain, decision 063): two
// loops of one block that load the same K and V windows share the first loop's stages and
// barriers, its iterations counted on into the second loop, whose first tiles the first loop's
// last iterations prefetch. Planned (one ring's memory), lowered and run in the emulator against
// the interpreter bit for bit (small integers) at trip counts of 0, 1, fewer than the stages and
// more, alone and nested in an outer loop (reset after the chain's last loop), with and without a
// producer warpgroup; then assembled for sm_90a through both backends. Needs no GPU.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "dsl/lang.hpp"
#include "jit/assign_layouts.hpp"
#include "jit/canonicalize.hpp"
#include "jit/compile.hpp"
#include "jit/nvrtc.hpp"
#include "jit/wgmma_plan.hpp"
#include "ptxas_testing.hpp"
#include "runtime/emulator.hpp"
#include "runtime/host_tensor.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
using runtime::HostTensor;

namespace {

const ParamSpec kRowMajor{.align_bytes = 16, .contiguous_last = true};

// Attention's inner loop on [S, 64] matrices, the key range cut at `split` into two loops with
// different bodies (scale 1/8, then 1/4): acc += cast(bf16, (Q K^T) * scale) V. ONE_LOOP: one loop
// over the whole range (the shape whose shared memory the chain must equal). NESTED: the loops
// run `reps` times inside an outer loop. PRODUCER: lang::ring_producer.
const Kernel two_loops = kernel("two_loops_one_ring", [](Builder& k) {
  auto one_loop = k.meta<bool>("ONE_LOOP", false), nested = k.meta<bool>("NESTED", false), producer = k.meta<bool>("PRODUCER", false);
  auto Q = k.tensor("Q", bf16, 2, kRowMajor), K = k.tensor("K", bf16, 2, kRowMajor), V = k.tensor("V", bf16, 2, kRowMajor);
  auto O = k.tensor("O", f32, 2, kRowMajor);
  auto split = k.scalar<int>("split"), n = k.scalar<int>("n"), reps = k.scalar<int>("reps");
  if (producer) ring_producer();
  auto m0 = program_id(0) * 128;
  auto q = load(Q.block({m0, 0}, {128, 64}));
  Var acc = zeros(f32, {128, 64});
  auto block = [&](const Tile& n0, const Tile& scale) {
    auto s = dot(q, trans(load(K.block({n0, 0}, {64, 64}))));
    acc = dot(cast(bf16, s * scale), load(V.block({n0, 0}, {64, 64})), acc);
  };
  auto walk = [&] {
    if (one_loop) {
      for_range(0, n, 64, [&](Tile n0) { block(n0, where(n0 < split, full(f32, {}, 0.125f), full(f32, {}, 0.25f))); });
      return;
    }
    for_range(0, split, 64, [&](Tile n0) { block(n0, full(f32, {}, 0.125f)); });
    for_range(split, n, 64, [&](Tile n0) { block(n0, full(f32, {}, 0.25f)); });  // (its bounds' ops stand between the loops)
  };
  if (nested) for_range(0, reps, [&](Tile) { walk(); });
  else walk();
  store(O.block({m0, 0}, {128, 64}), acc);
});

// The kernel's Hopper plan's rings, by loop in program order (the function and plan kept together).
struct Planned {
  ir::Function fn;
  jit::LayoutPlan plan;
};
std::unique_ptr<Planned> plan_of(const Meta& meta, int stages) {
  auto p = std::make_unique<Planned>();
  p->fn = two_loops.build(meta);
  jit::canonicalize(p->fn);
  jit::PipelineOptions opts;
  opts.stages = stages;
  p->plan = jit::assign_layouts(p->fn, 8, "sm_90a", opts);
  return p;
}

jit::CompileOptions options(int stages) {
  jit::CompileOptions o;
  o.num_warps = 8;
  o.pipeline.stages = stages;
  return o;
}

// Small integers: every product and sum exact in bf16 and f32, so bit for bit in any order.
HostTensor integers(std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t(bf16, std::move(shape));
  t.fill_uniform(seed, -2.49, 2.49);
  for (int64_t e = 0; e < t.numel(); ++e) t.set_flat(e, std::round(t.get_flat(e)));
  return t;
}

}  // namespace

TEST_CASE("ring chain: two consecutive loops over the same windows share one ring") {
  for (bool producer : {false, true})
    for (bool nested : {false, true}) {
      INFO("producer " << producer << " nested " << nested);
      const Meta chained{{"NESTED", nested}, {"PRODUCER", producer}};
      Meta one = chained;
      one.push_back({"ONE_LOOP", true});
      const auto p = plan_of(chained, 3), single = plan_of(one, 3);
      const jit::HopperPlan& h = p->plan.hopper;
      REQUIRE(h.ring_order.size() == 2);
      const jit::SmemRing &first = h.rings.at(h.ring_order[0]), &second = h.rings.at(h.ring_order[1]);
      CHECK(first.chain == h.ring_order);
      CHECK(second.chain == h.ring_order);
      CHECK(!first.follower());
      CHECK(second.follower());
      CHECK(second.head() == first.loop);
      // the same stages, memory and barriers; the rest of shared memory as with one loop
      CHECK(second.stages == first.stages);
      CHECK(second.base == first.base);
      CHECK(second.full == first.full);
      CHECK(second.released == first.released);
      CHECK(second.rerun == first.rerun);
      CHECK(first.rerun == (nested && !producer));
      for (size_t i = 0; i < first.loads.size(); ++i) {
        const jit::SmemTile &a = h.tiles.at(first.loads[i]), &b = h.tiles.at(second.loads[i]);
        CHECK(a.offset == b.offset);
        CHECK(a.full == b.full);
        CHECK(a.empty == b.empty);
      }
      CHECK(h.persistent_bytes == single->plan.hopper.persistent_bytes);
      CHECK(jit::print_hopper_plan(p->fn, h).find("one ring over consecutive loops") != std::string::npos);
    }
}

TEST_CASE("ring chain: not shared when a store stands between the loops or the windows differ") {
  const Kernel apart = kernel("two_loops_apart", [](Builder& k) {
    auto kind = k.meta<int>("KIND", 0);  // 0: a store between; 1: the second loop reads V, not K
    auto Q = k.tensor("Q", bf16, 2, kRowMajor), K = k.tensor("K", bf16, 2, kRowMajor), V = k.tensor("V", bf16, 2, kRowMajor);
    auto O = k.tensor("O", f32, 2, kRowMajor);
    auto n = k.scalar<int>("n");
    auto q = load(Q.block({0, 0}, {128, 64}));
    Var acc = zeros(f32, {128, 64});
    for_range(0, n, 64, [&](Tile n0) { acc = acc + dot(q, trans(load(K.block({n0, 0}, {64, 64})))); });
    if (kind == 0) store(O.block({0, 0}, {128, 64}), acc);
    for_range(0, n, 64, [&](Tile n0) { acc = acc + dot(q, trans(load((kind == 1 ? V : K).block({n0, 0}, {64, 64})))); });
    store(O.block({0, 0}, {128, 64}), acc);
  });
  for (int kind : {0, 1}) {
    INFO("kind " << kind);
    ir::Function fn = apart.build({{"KIND", kind}});
    jit::canonicalize(fn);
    const jit::LayoutPlan plan = jit::assign_layouts(fn, 8, "sm_90a", jit::PipelineOptions{});
    REQUIRE(plan.hopper.ring_order.size() == 2);
    for (const ir::Op* loop : plan.hopper.ring_order) CHECK(plan.hopper.rings.at(loop).chain.empty());
  }
}

// The chain's iterations run through the first loop into the second: trip counts 0, 1, fewer than
// the stages and more on either side, stages 2 and 3, two programs.
TEST_CASE("emulator: one ring over two consecutive loops equals the interpreter") {
  const int64_t M = 256, N = 64 * 9;
  const HostTensor q = integers({M, 64}, 61), k = integers({N, 64}, 62), v = integers({N, 64}, 63);
  for (bool producer : {false, true})
    for (bool nested : {false, true})
      for (int stages : {2, 3}) {
        const ir::Function fn = two_loops.build({{"NESTED", nested}, {"PRODUCER", producer}});
        for (auto [first_trips, second_trips] : {std::pair{0, 3}, {1, 0}, {1, 1}, {2, 1}, {4, 5}, {0, 0}, {3, 2}}) {
          INFO(fmt::format("producer {} nested {} stages {} trips {} + {}", producer, nested, stages, first_trips, second_trips));
          const int split = 64 * first_trips, n = split + 64 * second_trips, reps = nested ? 3 : 1;
          std::vector<HostTensor> ref{q, k, v, HostTensor(f32, {M, 64})}, emu = ref;
          std::vector<runtime::Arg> ra, ea;
          for (HostTensor& t : ref) ra.emplace_back(t);
          for (HostTensor& t : emu) ea.emplace_back(t);
          for (std::vector<runtime::Arg>* a : {&ra, &ea}) a->insert(a->end(), {split, n, reps});
          runtime::interpret(fn, {M / 128}, ra);
          runtime::emulate(fn, {M / 128}, ea, options(stages));
          CHECK(std::memcmp(ref[3].data(), emu[3].data(), ref[3].bytes()) == 0);
          if (first_trips + second_trips > 0) CHECK(ref[3].to_f64() != std::vector<double>(static_cast<size_t>(M * 64), 0.0));
          if (first_trips != 2) continue;
          // random warp interleavings: no warp may refill a stage another still reads
          for (uint64_t seed : {uint64_t{5}, uint64_t{17}}) {
            HostTensor o(f32, {M, 64});
            std::vector<HostTensor> in{q, k, v};
            std::vector<runtime::Arg> args;
            for (HostTensor& t : in) args.emplace_back(t);
            args.emplace_back(o);
            args.insert(args.end(), {split, n, reps});
            runtime::emulate(fn, {M / 128}, args, options(stages), runtime::EmulatorSchedule{true, seed});
            CHECK(std::memcmp(ref[3].data(), o.data(), o.bytes()) == 0);
          }
        }
      }
}

TEST_CASE("ring chain: assembles for sm_90a through both backends") {
  if (testing::no_ptxas()) return;
  for (bool producer : {false, true})
    for (jit::Backend backend : {jit::Backend::Llvm, jit::Backend::Nvrtc}) {
      if (backend == jit::Backend::Nvrtc && !jit::nvrtc_available()) continue;
      testing::assemble_sm90a(two_loops.build({{"NESTED", true}, {"PRODUCER", producer}}), backend, 8, 3);
    }
}
