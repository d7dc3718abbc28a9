// The planner for wgmma dots with shared-memory tiles; see wgmma_plan.hpp for what qualifies.
#include "jit/wgmma_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "dsl/ir/input_precision.hpp"
#include "jit/scalar_facts.hpp"
#include "jit/layout.hpp"

namespace tilejit::jit {
namespace {

using ir::OpKind;

constexpr int64_t kPersistentBudget = 200 * 1024;  // leaves room for scratch exchanges (227 KB total)

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
bool sixteen_bit(ir::DType d) { return d == ir::DType::bf16 || d == ir::DType::f16; }

class Planner {
 public:
  Planner(const ir::Function& f, int num_warps, const PipelineOptions& opts, const std::set<const ir::Op*>& skip,
          const std::map<const ir::Op*, int>& op_warps)
      : f_(f), warps_(num_warps), opts_(opts), skip_(skip), op_warps_(op_warps), facts_(f) {}

  HopperPlan run() {
    index(f_.body, nullptr);
    for (const ir::Op& op : f_.body.ops)
      if (op.kind == OpKind::ring_producer) producer_ = true, writer_ = op.attrs.count("reduce_writer") > 0;
    std::vector<const ir::Op*> candidates;
    for (const ir::Op* op : in_order(parent_))
      if (op->kind == OpKind::dot && shape_ok(*op) && !inside_skipped(op)) candidates.push_back(op);
    // Drop tiles with uses other than as wgmma operands until the choice is stable.
    std::set<const ir::Op*> banned;
    for (;;) {
      plan_ = HopperPlan{};
      std::set<const ir::Op*> dots;
      for (const ir::Op* d : candidates) {
        WgmmaDot w{.dot = d};
        const ir::Op* bdef = def(d->operands[1]);
        if (bdef && bdef->kind == OpKind::trans && def(bdef->operands[0]) && tile_ok(*def(bdef->operands[0]), banned)) {
          w.b_tile = def(bdef->operands[0]);
        } else if (bdef && tile_ok(*bdef, banned)) {
          w.b_tile = bdef;
          w.b_mn_major = true;
        } else {
          continue;
        }
        if (!b_slab_ok(*d, w.b_mn_major)) continue;
        const ir::Op* adef = def(d->operands[0]);
        const ir::Op* under = adef && adef->kind == OpKind::trans ? def(adef->operands[0]) : nullptr;
        if (adef && tile_ok(*adef, banned)) {
          w.a_tile = adef;
        } else if (under && tile_ok(*under, banned) && a_slab_ok(*d)) {
          w.a_tile = under;  // A^T loaded: MN-major A
          w.a_mn_major = true;
        } else if (adef && adef->kind == OpKind::trans && !(under && under->kind == OpKind::block_load)) {
          w.a_staged = adef;
        }
        plan_.dots[d] = w;
        dots.insert(d);
      }
      const ir::Op* bad = nullptr;
      for (const auto& [d, w] : plan_.dots)
        for (const ir::Op* t : {w.a_tile, w.b_tile})
          if (t && !bad && !uses_ok(*t, dots)) bad = t;
      if (!bad) break;
      banned.insert(bad);
    }
    ir::walk(f_.body, [&](const ir::Op& op) {
      if (auto r = tma_reduce(op)) plan_.reduces[&op] = *r;
    });
    place();
    return std::move(plan_);
  }

 private:
  // The keys of an op-keyed map in program order (placement must not depend on addresses).
  template <class Map>
  std::vector<const ir::Op*> in_order(const Map& m) const {
    std::vector<const ir::Op*> v;
    for (const auto& kv : m) v.push_back(kv.first);
    std::sort(v.begin(), v.end(), [&](const ir::Op* a, const ir::Op* b) { return order_.at(a) < order_.at(b); });
    return v;
  }

  void index(const ir::Block& b, const ir::Op* parent) {
    for (const ir::Op& op : b.ops) {
      block_of_[&op] = &b;
      parent_[&op] = parent;
      order_[&op] = order_.size();
      for (ir::ValueId r : op.results) def_[r] = &op;
      for (size_t i = 0; i < op.operands.size(); ++i) users_[op.operands[i]].push_back({&op, i});
      for (const ir::Block& r : op.regions) {
        for (ir::ValueId a : r.args) region_arg_[a] = &op;
        index(r, &op);
      }
    }
  }
  const ir::Op* def(ir::ValueId v) const {
    auto it = def_.find(v);
    return it == def_.end() ? nullptr : it->second;
  }
  bool inside_skipped(const ir::Op* op) const {
    for (const ir::Op* p = parent_.at(op); p; p = parent_.at(p))
      if (skip_.count(p)) return true;
    return false;
  }
  // Whether value v is defined inside op `loop` (its region args or any op nested in it).
  bool defined_inside(ir::ValueId v, const ir::Op* loop) const {
    const ir::Op* p = nullptr;
    if (auto it = region_arg_.find(v); it != region_arg_.end()) {
      if (it->second == loop) return true;
      p = it->second;
    } else if (const ir::Op* d = def(v)) {
      p = d;
    } else {
      return false;  // a parameter
    }
    return p == loop || nested_in(p, loop);
  }
  // Whether op sits somewhere inside op `loop`.
  bool nested_in(const ir::Op* op, const ir::Op* loop) const {
    for (const ir::Op* p = parent_.at(op); p; p = parent_.at(p))
      if (p == loop) return true;
    return false;
  }

  bool shape_ok(const ir::Op& d) const {
    const ir::Type &a = f_.type(d.operands[0]), &b = f_.type(d.operands[1]);
    // batched dots and tf32 ones run on mma.sync (jit/dot_plan.hpp), never on wgmma
    if (a.shape.size() != 2 || ir::input_precision(d) != ir::InputPrecision::ieee) return false;
    const int warps = warps_of(d);
    if (warps % 4 != 0 || !is_power_of_two(warps) || !sixteen_bit(a.dtype) || a.dtype != b.dtype) return false;
    const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
    if (m % 64 != 0 || k % 16 != 0 || f_.type(d.results[0]).dtype != ir::DType::f32) return false;
    const int64_t split = Layout::wgmma_split(m, warps).n;  // warpgroups side by side along N
    if (n % split != 0) return false;                        // (N = 1 on two warpgroups: no slab)
    const int64_t wn = n / split;                            // one warpgroup's columns
    return wn % 8 == 0 && wn <= 256;
  }
  // With warpgroups splitting N (M = 64 on two warpgroups), each reads its own column slab of B:
  // an MN-major tile is stored in 64-column chunks, so a slab must be whole chunks.
  // MN-major A: each warpgroup's 64-row slab of M is one 64-column chunk of the A^T tile
  bool a_slab_ok(const ir::Op& d) const { return f_.type(d.operands[0]).shape[0] % 64 == 0; }

  bool b_slab_ok(const ir::Op& d, bool mn_major) const {
    const ir::Type &a = f_.type(d.operands[0]), &b = f_.type(d.operands[1]);
    const int splits = Layout::wgmma_split(a.shape[0], warps_of(d)).n;
    return !mn_major || splits == 1 || (b.shape[1] / splits) % 64 == 0;
  }

  const ir::Param* tensor_param(ir::ValueId v, int* index) const {
    for (size_t i = 0; i < f_.params.size(); ++i)
      if (f_.params[i].value == v && f_.params[i].kind == ir::ParamKind::Tensor) {
        *index = static_cast<int>(i);
        return &f_.params[i];
      }
    return nullptr;
  }

  // A zero-padded window of a 16-byte-aligned tensor with unit innermost stride, whose tile cols run
  // along that innermost dim in whole 128-byte chunks, placed where a TMA copy can be issued: at the
  // top level (once) or directly in a loop with offsets that are its counter or invariant in it.
  bool tile_ok(const ir::Op& load, const std::set<const ir::Op*>& banned) const {
    if (load.kind != OpKind::block_load || banned.count(&load)) return false;
    int index = 0;
    const ir::Param* p = tensor_param(load.operands[0], &index);
    if (!p || !p->spec.contiguous_last || p->spec.align_bytes < 16 || !sixteen_bit(p->type.dtype)) return false;
    const int rank = p->type.rank;
    const auto& dims = load.ints_attr("dims");
    const auto& shape = f_.type(load.results[0]).shape;
    if (rank > 5 || dims.size() != 2 || dims[1] != rank - 1 || load.float_attr("padding") != 0.0) return false;
    if (shape[0] > 256 || shape[0] % 8 != 0 || shape[1] % 64 != 0) return false;
    if (!offsets_fit_i32(load, 1, rank)) return false;
    if (!tma_inner_offset_aligned(facts_, load.operands[static_cast<size_t>(rank)], p->type.dtype)) return false;
    const ir::Op* parent = parent_.at(&load);
    // loaded once: at the kernel's top level, or at a warp role's (the role is the whole program
    // of its warps)
    if (!parent || parent->kind == OpKind::warp_roles) return opts_.once_by_tma;
    if (parent->kind != OpKind::for_ || skip_.count(parent)) return false;
    std::vector<const ir::Op*> ops;
    for (size_t i = 1; i < load.operands.size(); ++i)
      if (!counter_function(load.operands[i], parent, ops)) return false;
    return true;
  }

  // Whether scalar v is, in iterations of `loop`, a function of the loop counter alone: the counter,
  // a value defined outside the loop, or a scalar op of the loop's body (not nested deeper) over
  // such values -- arithmetic, compares, selects, casts, pointer offsets, a tensor parameter's
  // base/sizes/strides and loads through scalar pointers. Collects the ops of the body that compute it (program order, no duplicates), which a
  // ring refill evaluates again for the iteration it prefetches.
  bool counter_function(ir::ValueId v, const ir::Op* loop, std::vector<const ir::Op*>& ops, int depth = 0) const {
    if (v == loop->regions[0].args[0] || !defined_inside(v, loop)) return true;
    const ir::Op* d = def(v);
    if (!d || depth > 64 || parent_.at(d) != loop || !f_.type(v).is_scalar()) return false;  // a carried value, or nested
    const bool scalar_op = ir::is_elementwise(d->kind) || d->kind == OpKind::load || d->kind == OpKind::constant ||
                           d->kind == OpKind::tensor_ptr || d->kind == OpKind::tensor_dim || d->kind == OpKind::tensor_stride;
    if (!scalar_op) return false;
    for (ir::ValueId o : d->operands)
      if (!counter_function(o, loop, ops, depth + 1)) return false;
    if (std::find(ops.begin(), ops.end(), d) == ops.end()) ops.push_back(d);
    return true;
  }

  // Every use of the tile is as an operand of a planned dot: A (directly: K-major; through a trans
  // used only as A: MN-major) or B (directly: MN-major; through a trans used only as B: K-major).
  bool uses_ok(const ir::Op& load, const std::set<const ir::Op*>& dots) const {
    auto it = users_.find(load.results[0]);
    if (it == users_.end()) return false;
    for (auto [user, pos] : it->second) {
      if (user->kind == OpKind::dot && dots.count(user)) {
        const WgmmaDot& w = plan_.dots.at(user);
        if (pos == 0 && w.a_tile == &load) continue;
        if (pos == 1 && w.b_tile == &load && w.b_mn_major) continue;
        return false;
      }
      if (user->kind != OpKind::trans) return false;
      auto t = users_.find(user->results[0]);
      if (t == users_.end()) return false;
      for (auto [u2, p2] : t->second) {
        if (!(u2->kind == OpKind::dot && dots.count(u2))) return false;
        const WgmmaDot& w2 = plan_.dots.at(u2);
        if (!(p2 == 1 && w2.b_tile == &load && !w2.b_mn_major) && !(p2 == 0 && w2.a_tile == &load && w2.a_mn_major)) return false;
      }
    }
    return true;
  }

  // TMA coordinates are i32: a window with an i64 / u32 / u64 offset takes the generic path, which
  // bounds-checks it in 64 bits (clamping it into TMA's range would need a check of its own).
  bool offsets_fit_i32(const ir::Op& op, size_t first, int rank) const {
    for (size_t d = 0; d < static_cast<size_t>(rank); ++d)
      if (!ir::fits_i32(f_.type(op.operands.at(first + d)).dtype)) return false;
    return true;
  }

  // An atomic_add on a window that TMA can add (TmaReduce): rows along another dim than the
  // contiguous one, which the cols run along in whole 128-byte chunks.
  std::optional<TmaReduce> tma_reduce(const ir::Op& op) const {
    if (op.kind != OpKind::block_store) return std::nullopt;
    const bool add = op.attrs.count("reduce") && op.str_attr("reduce") == "add";
    const bool store = !op.attrs.count("reduce") && op.attrs.count(ir::kTmaStoreAttr) && op.int_attr(ir::kTmaStoreAttr) != 0;
    if (!add && !store) return std::nullopt;
    TmaReduce r;
    r.store = &op;
    r.store_only = store;
    r.offsets_at_store = store && op.attrs.count(ir::kOffsetsAtStoreAttr) > 0;
    const ir::Param* p = tensor_param(op.operands[0], &r.param_index);
    if (!p || !p->spec.contiguous_last || p->spec.align_bytes < 16) return std::nullopt;
    r.elem_bytes = ir::byte_size(p->type.dtype);
    if (add ? p->type.dtype != ir::DType::f32 : (r.elem_bytes != 2 && r.elem_bytes != 4)) return std::nullopt;
    const int rank = p->type.rank;
    const auto& dims = op.ints_attr("dims");
    const auto& shape = f_.type(op.operands[1]).shape;
    if (rank > 5 || dims.size() != 2 || dims[1] != rank - 1 || !offsets_fit_i32(op, 2, rank)) return std::nullopt;
    if (!tma_inner_offset_aligned(facts_, op.operands[static_cast<size_t>(rank) + 1], p->type.dtype)) return std::nullopt;
    r.rows = shape[0];
    r.cols = shape[1];
    // TMA faults at a negative store coordinate, and where coordinate + box passes 2^31 - 1
    for (int d = 0; d < rank; ++d) {
      const int64_t extent = r.extent(d, dims[0], rank);
      const ir::ValueId offset = op.operands[static_cast<size_t>(d) + 2];
      const std::optional<ScalarFacts::Range> c = facts_.range(offset);
      const bool fits = c && c->lo >= 0 && c->hi <= int64_t{INT32_MAX} - extent;
      if (!fits && !facts_.index_like(offset)) r.check_coordinates = true;
    }
    const bool narrow = add && op.attrs.count(ir::kNarrowStagingAttr) > 0;
    const int64_t per_chunk = (narrow ? 32 : 128) / r.elem_bytes;
    if (r.rows > 256 || r.rows % 8 != 0 || r.cols % per_chunk != 0) return std::nullopt;
    r.box.assign(static_cast<size_t>(rank), 1);
    r.box[0] = per_chunk;
    r.box[static_cast<size_t>(rank - 1 - dims[0])] = r.rows;
    return r;
  }

  // A load_at_use of a 1-D window directly in a loop, read only inside that loop's body (its
  // stage is refilled after the iteration), that TMA can copy: a vector tile of the loop's ring
  // (under a producer, freed at the iteration's end: its reads are not wgmma groups to retire).
  bool vector_tile_ok(const ir::Op& load) const {
    if (load.kind != OpKind::block_load || !load.attrs.count("at_use")) return false;
    const ir::Op* loop = parent_.at(&load);
    if (!loop || loop->kind != OpKind::for_ || skip_.count(loop)) return false;
    int index = 0;
    const ir::Param* p = tensor_param(load.operands[0], &index);
    if (!p || !p->spec.contiguous_last || p->spec.align_bytes < 16) return false;
    const int rank = p->type.rank;
    const auto& dims = load.ints_attr("dims");
    const auto& shape = f_.type(load.results[0]).shape;
    const int64_t es = ir::byte_size(p->type.dtype), n = shape.empty() ? 0 : shape[0];
    if (rank > 5 || dims.size() != 1 || dims[0] != rank - 1 || shape.size() != 1 || load.float_attr("padding") != 0.0) return false;
    if (es < 2 || (n * es) % 16 != 0 || n > 256 || !offsets_fit_i32(load, 1, rank)) return false;
    if (!tma_inner_offset_aligned(facts_, load.operands[static_cast<size_t>(rank)], p->type.dtype)) return false;
    std::vector<const ir::Op*> ops;
    for (size_t i = 1; i < load.operands.size(); ++i)
      if (!counter_function(load.operands[i], loop, ops)) return false;
    // every use inside the body (not carried to the next iteration by the loop's yield)
    if (auto it = users_.find(load.results[0]); it != users_.end())
      for (const auto& use : it->second)
        if (use.first == &loop->regions[0].ops.back() || !nested_in(use.first, loop)) return false;
    return true;
  }
  SmemTile describe_vector(const ir::Op& load) const {
    SmemTile t;
    t.load = &load;
    t.vector = true;
    const ir::Param* p = tensor_param(load.operands[0], &t.param_index);
    const int rank = p->type.rank;
    t.elem_bytes = ir::byte_size(p->type.dtype);
    t.row_dim = rank - 1;
    t.rows = 1;
    t.cols = f_.type(load.results[0]).shape[0];
    t.box.assign(static_cast<size_t>(rank), 1);
    t.box[0] = t.cols;
    t.ring = parent_.at(&load);
    for (size_t i = 1; i < load.operands.size(); ++i) counter_function(load.operands[i], t.ring, t.offset_ops);
    std::sort(t.offset_ops.begin(), t.offset_ops.end(), [&](const ir::Op* a, const ir::Op* b) { return order_.at(a) < order_.at(b); });
    return t;
  }

  // The ring of `loop`, set up on first use.
  SmemRing& ring_of(const ir::Op* loop) {
    SmemRing& r = plan_.rings[loop];
    if (r.loop) return r;
    r.loop = loop;
    const ir::Op* outer = parent_.at(loop);
    r.producer = producer_;
    // Under a producer, a ring inside loops (a persistent grid's tile loop) keeps counting its
    // stages across their iterations, so the producer prefetches the next run's tiles while
    // this one's are consumed; without one it is reset after each run.
    r.rerun = !producer_ && outer && outer->kind != OpKind::warp_roles;  // (a role's loop runs once, like the kernel's)
    for (const ir::Op* p = outer; producer_ && p; p = parent_.at(p))
      if (p->kind != OpKind::for_)
        throw LoweringError(fmt::format("tilejit: kernel '{}': ring_producer: the ring of the {} at {} stands inside the {} at {}; a "
                                        "producer fills rings of loops at the kernel's top level or nested directly in other "
                                        "loops (no branch or warp role around them)",
                                        f_.name, ir::op_name(loop->kind), loop->loc.str(), ir::op_name(p->kind), p->loc.str()));
    return r;
  }

  // Shared-memory placement: tiles loaded once, then each ring's stages, then the mbarriers.
  void place() {
    for (const auto& [d, w] : plan_.dots)
      for (const ir::Op* t : {w.a_tile, w.b_tile})
        if (t && !plan_.tiles.count(t)) plan_.tiles[t] = describe(*t);
    ir::walk(f_.body, [&](const ir::Op& op) {
      if (vector_tile_ok(op)) plan_.tiles[&op] = describe_vector(op);
    });
    // in a stage, the swizzled tiles first (each 1024-byte aligned), the vectors after them
    std::vector<const ir::Op*> tiles = in_order(plan_.tiles);
    std::stable_partition(tiles.begin(), tiles.end(), [&](const ir::Op* op) { return !plan_.tiles.at(op).vector; });
    int64_t at = 0, barrier_bytes = 0;
    for (const ir::Op* op : tiles) {
      SmemTile& t = plan_.tiles.at(op);
      if (t.ring) {
        // swizzled tiles 1024-byte aligned; vectors (placed last) 128
        SmemRing& r = ring_of(t.ring);
        t.offset = r.stage_bytes;
        r.stage_bytes += align_up(t.bytes(), t.vector ? 128 : 1024);
        r.loads.push_back(op);
      } else {
        t.offset = at;
        at += align_up(t.bytes(), 1024);
        barrier_bytes += 8;
      }
    }
    for (auto& [loop, r] : plan_.rings) r.stage_bytes = align_up(r.stage_bytes, 1024);  // (the next stage's swizzled tiles)
    const std::vector<const ir::Op*> rings = in_order(plan_.rings);
    link_chains(rings);
    // a chain's later loops use its first loop's memory and barriers (copied at the end)
    auto own = [&](const ir::Op* loop) { return !plan_.rings.at(loop).follower(); };
    int64_t ring_bytes = 0;
    for (const ir::Op* loop : rings) {
      if (!own(loop)) continue;
      SmemRing& r = plan_.rings.at(loop);
      r.stages = std::clamp(opts_.stages, 2, 8);
      ring_bytes += r.stages * r.stage_bytes;
      barrier_bytes += 16 * r.stages * barrier_sets(r);
    }
    // Fewer stages where the rings would not leave room for the rest (and the staging tiles, placed
    // after them): down to 2, then a ring around another ring's loop down to 1 (its tiles are
    // reloaded once per run of the inner loop, e.g. K and V per key tile of a persistent program,
    // whose load latency the inner loop's work dwarfs).
    borrow_staging();
    for (const auto& [op, r] : plan_.reduces)
      if (!r.staging_tile) plan_.reduce_staging_bytes = std::max(plan_.reduce_staging_bytes, r.rows * r.cols * r.elem_bytes);
    for (const auto& [op, w] : plan_.dots)
      if (w.a_staged) plan_.a_staging_bytes = std::max(plan_.a_staging_bytes, f_.type(op->operands[0]).numel() * 2);
    const int64_t fixed = align_up(plan_.reduce_staging_bytes, 1024) + align_up(plan_.a_staging_bytes, 1024) + 2048;
    auto over = [&] { return at + ring_bytes + barrier_bytes + fixed > kPersistentBudget; };
    auto encloses_ring = [&](const ir::Op* loop) {
      return std::any_of(rings.begin(), rings.end(), [&](const ir::Op* inner) { return nested_in(inner, loop); });
    };
    for (int floor : {2, 1})
      for (const ir::Op* loop : rings) {
        SmemRing& r = plan_.rings.at(loop);
        if (!own(loop) || (floor == 1 && !encloses_ring(loop))) continue;
        while (r.stages > floor && over()) {
          --r.stages;
          ring_bytes -= r.stage_bytes;
          barrier_bytes -= 16 * barrier_sets(r);
        }
      }
    for (const ir::Op* loop : rings) {
      SmemRing& r = plan_.rings.at(loop);
      if (!own(loop)) continue;
      r.base = at;
      at += r.stages * r.stage_bytes;
    }
    for (const ir::Op* op : tiles) {
      SmemTile& t = plan_.tiles.at(op);
      if (!t.ring) {
        t.barrier = at;
        at += 8;
      }
    }
    for (const ir::Op* loop : rings) {
      SmemRing& r = plan_.rings.at(loop);
      if (!own(loop)) continue;
      if (r.producer) {
        for (const ir::Op* op : r.loads) {
          SmemTile& t = plan_.tiles.at(op);
          t.full = at;
          t.empty = at + 8 * r.stages;
          at += 16 * r.stages;
        }
        continue;
      }
      r.full = at;
      r.released = at + 8 * r.stages;
      at += 16 * r.stages;
    }
    for (const ir::Op* loop : rings) {
      SmemRing& r = plan_.rings.at(loop);
      if (!r.follower()) continue;
      const SmemRing& head = plan_.rings.at(r.head());
      r.stages = head.stages, r.base = head.base, r.full = head.full, r.released = head.released, r.rerun = head.rerun;
      for (size_t i = 0; i < r.loads.size(); ++i) {
        SmemTile& t = plan_.tiles.at(r.loads[i]);
        const SmemTile& h = plan_.tiles.at(head.loads[i]);
        t.offset = h.offset, t.full = h.full, t.empty = h.empty;
      }
    }
    if (plan_.reduce_staging_bytes) {
      plan_.reduce_staging = align_up(at, 1024);  // the 128-byte swizzle repeats every 1024 bytes
      at = plan_.reduce_staging + plan_.reduce_staging_bytes;
    }
    if (plan_.a_staging_bytes) {
      plan_.a_staging = align_up(at, 1024);
      at = plan_.a_staging + plan_.a_staging_bytes;
    }
    if (writer_) place_reduce_writer(at);
    plan_.persistent_bytes = align_up(at, 128);
    plan_.ring_producer = producer_;
    plan_.tile_order = tiles;
    plan_.ring_order = rings;
  }

  // Rings of consecutive loops that can be one (SmemRing::chain): each ring loop joins the chain of
  // the ring loop before it in its block when their windows match and nothing between them writes
  // memory or holds a region, and when the later loop's bounds and window offsets can be computed
  // before the earlier loop starts (its first tiles are issued from there).
  void link_chains(const std::vector<const ir::Op*>& rings) {
    const ir::Op* prev = nullptr;
    for (const ir::Op* loop : rings) {
      if (prev && can_chain(prev, loop)) {
        SmemRing& head = plan_.rings.at(plan_.rings.at(prev).head());
        if (head.chain.empty()) head.chain.push_back(head.loop);
        head.chain.push_back(loop);
        for (const ir::Op* member : head.chain) plan_.rings.at(member).chain = head.chain;
      }
      prev = loop;
    }
  }

  bool can_chain(const ir::Op* first, const ir::Op* next) const {
    const ir::Block* block = block_of_.at(first);
    if (block_of_.at(next) != block) return false;
    const SmemRing &a = plan_.rings.at(first), &b = plan_.rings.at(next);
    if (a.loads.size() != b.loads.size()) return false;
    for (size_t i = 0; i < a.loads.size(); ++i) {
      const SmemTile &x = plan_.tiles.at(a.loads[i]), &y = plan_.tiles.at(b.loads[i]);
      if (x.param_index != y.param_index || x.row_dim != y.row_dim || x.rows != y.rows || x.cols != y.cols || x.box != y.box) return false;
    }
    const size_t from = order_.at(first), to = order_.at(next);
    for (const ir::Op& op : block->ops) {
      const size_t at = order_.at(&op);
      if (at <= from || at >= to) continue;
      if (!op.regions.empty() || writes_or_waits(op.kind)) return false;
    }
    // what `next` reads before its body runs: bounds, its windows' offsets from outside the loop
    std::vector<ir::ValueId> needed(next->operands.begin(), next->operands.begin() + 3);
    for (const ir::Op* l : b.loads) {
      for (size_t i = 1; i < l->operands.size(); ++i) needed.push_back(l->operands[i]);
      for (const ir::Op* op : plan_.tiles.at(l).offset_ops) needed.insert(needed.end(), op->operands.begin(), op->operands.end());
    }
    for (ir::ValueId v : needed)
      if (defined_inside(v, next)) continue;
      else if (!known_before(v, first, 0)) return false;
    return true;
  }
  static bool writes_or_waits(OpKind k) {
    return k == OpKind::store || k == OpKind::block_store || k == OpKind::atomic_add || k == OpKind::atomic_rmw ||
           k == OpKind::atomic_cas || k == OpKind::signal_add || k == OpKind::wait_ge || k == OpKind::channel_push ||
           k == OpKind::channel_pop || k == OpKind::tensor_slice || k == OpKind::precompute;
  }
  // Whether scalar v can be computed where `loop` starts: defined before it (or outside its block),
  // or between it and the next loop by arithmetic on such values (no loads: the loop may write).
  bool known_before(ir::ValueId v, const ir::Op* loop, int depth) const {
    if (defined_inside(v, loop)) return false;
    const ir::Op* d = def(v);
    if (!d || order_.at(d) < order_.at(loop) || block_of_.at(d) != block_of_.at(loop)) return true;
    if (d == loop || depth > 64 || !f_.type(v).is_scalar()) return false;  // the loop's results
    const bool pure = ir::is_elementwise(d->kind) || d->kind == OpKind::constant || d->kind == OpKind::tensor_dim ||
                      d->kind == OpKind::tensor_stride || d->kind == OpKind::tensor_ptr || d->kind == OpKind::program_id ||
                      d->kind == OpKind::num_programs;
    if (!pure) return false;
    for (ir::ValueId o : d->operands)
      if (!known_before(o, loop, depth + 1)) return false;
    return true;
  }

  // TMA stores under a producer that can stage in a ring tile (TmaReduce::staging_tile): the store
  // stands in the body of the ring's loop, after every reader of the tile, which is large enough.
  // Of several such tiles the one first read latest in the body: its next copy, which now waits
  // for the store, is needed last (the forward's O over the last V block, not over Q).
  // At the kernel's top level, a tile loaded once serves the same way (no stage to free). (Not in
  // a branch: MMAs in flight stay in flight through a region that does not read their results, and
  // the staging writes must come after every MMA reading the tile has retired.)
  void borrow_staging() {
    for (const ir::Op* store : in_order(plan_.reduces)) {
      TmaReduce& red = plan_.reduces.at(store);
      if (!red.store_only) continue;
      const ir::Op* loop = parent_.at(store);
      std::vector<const ir::Op*> lenders;
      if (loop && producer_ && plan_.rings.count(loop)) {
        lenders = plan_.rings.at(loop).loads;
      } else if (!loop) {
        for (const auto& [l, t] : plan_.tiles)
          if (!t.ring) lenders.push_back(l);
      }
      const ir::Op* best = nullptr;
      size_t best_first = 0;
      for (const ir::Op* l : lenders) {
        const SmemTile& t = plan_.tiles.at(l);
        if (t.lends_staging_to || t.bytes() < red.rows * red.cols * red.elem_bytes) continue;
        size_t first = SIZE_MAX, last = 0;
        for (const auto& [d, w] : plan_.dots)
          if (w.a_tile == l || w.b_tile == l) first = std::min(first, order_.at(d)), last = std::max(last, order_.at(d));
        if (first == SIZE_MAX || last > order_.at(store)) continue;
        if (!best || first > best_first) best = l, best_first = first;
      }
      if (!best) continue;
      red.staging_tile = best;
      plan_.tiles.at(best).lends_staging_to = store;
    }
  }

  // RingProducer::reduce_writer (ReduceWriter): every TMA add where the writer can follow it, and
  // nothing in the kernel that would need the consumers to see the adds complete; its barriers.
  void place_reduce_writer(int64_t& at) {
    const std::string where = fmt::format("tilejit: kernel '{}': ring_producer(reduce_writer)", f_.name);
    std::map<const ir::Op*, const ir::Op*> add_in;  // ring loop -> its add
    std::set<ir::ValueId> added_to;
    for (const ir::Op* store : in_order(plan_.reduces)) {
      TmaReduce& red = plan_.reduces.at(store);
      auto refuse = [&](const std::string& why) {
        throw LoweringError(fmt::format("{}: the TMA {} at {} {}", where, red.store_only ? "store" : "add", store->loc.str(), why));
      };
      if (red.store_only) {
        if (!red.staging_tile) refuse("uses the staging tile the writer's adds use (store it by plain stores, or drop reduce_writer)");
        continue;
      }
      if (red.check_coordinates)
        refuse("has coordinates that may leave TMA's range (tested at run time, element adds as the fallback; drop reduce_writer)");
      const ir::Op* loop = parent_.at(store);
      const auto ring = loop ? plan_.rings.find(loop) : plan_.rings.end();
      if (ring == plan_.rings.end())
        refuse("is not at the top level of a ring's loop body (a loop whose windows feed wgmma): the writer follows the ring's iterations");
      if (add_in.count(loop)) refuse(fmt::format("is the second add in the loop at {} (the writer takes one add a loop)", loop->loc.str()));
      if (plan_.reduce_writer && plan_.reduce_writer->ring != ring->second.head())
        refuse("stands in the loop of another ring than the first add (the writer follows one ring)");
      if (!plan_.reduce_writer) plan_.reduce_writer = ReduceWriter{.ring = ring->second.head()};
      add_in[loop] = store;
      added_to.insert(store->operands[0]);
      red.loop = loop;
    }
    if (!plan_.reduce_writer) return;  // no TMA adds: nothing to write
    const SmemRing& head = plan_.rings.at(plan_.reduce_writer->ring);
    for (const ir::Op* member : head.chain.empty() ? std::vector<const ir::Op*>{head.loop} : head.chain)
      if (!add_in.count(member))
        throw LoweringError(fmt::format("{}: the loop at {} shares the adds' ring but adds nothing (the writer counts one add a ring "
                                        "iteration)", where, member->loc.str()));
    ir::walk(f_.body, [&](const ir::Op& op) {
      if (op.kind == OpKind::wait_ge || op.kind == OpKind::signal_add)
        throw LoweringError(fmt::format("{}: the {} at {} orders memory between programs, which the writer's adds would escape (an "
                                        "ordered atomic_add with a signal does both in the writer; or drop reduce_writer)", where,
                                        ir::op_name(op.kind), op.loc.str()));
      if (op.kind == OpKind::tensor_dim || op.kind == OpKind::tensor_stride || (op.kind == OpKind::block_store && add_in.count(parent_.at(&op)) && add_in.at(parent_.at(&op)) == &op))
        return;
      for (ir::ValueId v : op.operands)
        if (added_to.count(v))
          throw LoweringError(fmt::format("{}: the {} at {} uses the tensor the writer adds into; the consumers cannot order it after "
                                          "those adds (drop reduce_writer)", where, ir::op_name(op.kind), op.loc.str()));
    });
    at = align_up(at, 8);
    plan_.reduce_writer->barriers = at;
    plan_.reduce_writer->pending_signal = at + 16 * ReduceWriter::kMaxParts;
    at += 16 * ReduceWriter::kMaxParts + 8;
  }

  // Barrier pairs per stage: one per ring, or one per tile under a producer.
  static int64_t barrier_sets(const SmemRing& r) { return r.producer ? static_cast<int64_t>(r.loads.size()) : 1; }

  SmemTile describe(const ir::Op& load) const {
    SmemTile t;
    t.load = &load;
    const ir::Param* p = tensor_param(load.operands[0], &t.param_index);
    const int rank = p->type.rank;
    const auto& dims = load.ints_attr("dims");
    const auto& shape = f_.type(load.results[0]).shape;
    t.row_dim = static_cast<int>(dims[0]);
    t.rows = shape[0];
    t.cols = shape[1];
    t.box.assign(static_cast<size_t>(rank), 1);
    t.box[0] = 64;
    t.box[static_cast<size_t>(rank - 1 - t.row_dim)] = t.rows;
    const ir::Op* parent = parent_.at(&load);
    if (parent && parent->kind != OpKind::warp_roles) {  // (in a role's own block: loaded once)
      t.ring = parent;
      for (size_t i = 1; i < load.operands.size(); ++i) counter_function(load.operands[i], parent, t.offset_ops);
      std::sort(t.offset_ops.begin(), t.offset_ops.end(), [&](const ir::Op* a, const ir::Op* b) { return order_.at(a) < order_.at(b); });
    }
    return t;
  }

  const ir::Function& f_;
  int warps_of(const ir::Op& op) const {
    auto it = op_warps_.find(&op);
    return it == op_warps_.end() ? warps_ : it->second;
  }

  int warps_;
  bool producer_ = false;  // lang::ring_producer
  bool writer_ = false;    // its reduce_writer
  PipelineOptions opts_;
  const std::set<const ir::Op*>& skip_;
  const std::map<const ir::Op*, int>& op_warps_;
  ScalarFacts facts_;  // what TMA boxes need: 16-byte starts, non-negative reduce coordinates
  std::unordered_map<const ir::Op*, const ir::Op*> parent_;
  std::unordered_map<const ir::Op*, const ir::Block*> block_of_;
  std::unordered_map<const ir::Op*, size_t> order_;
  std::unordered_map<ir::ValueId, const ir::Op*> def_, region_arg_;
  std::unordered_map<ir::ValueId, std::vector<std::pair<const ir::Op*, size_t>>> users_;
  HopperPlan plan_;
};

}  // namespace

HopperPlan plan_wgmma(const ir::Function& f, int num_warps, const std::map<const ir::Op*, int>& op_warps,
                      const std::string& arch, const PipelineOptions& opts, const TmaPlan& tma) {
  if (!opts.enabled || arch != "sm_90a" || num_warps % 4 != 0) return {};
  std::set<const ir::Op*> skip;  // the GEMM loops (they own their dots)
  for (const auto& [loop, m] : tma.loops) skip.insert(loop);
  return Planner(f, num_warps, opts, skip, op_warps).run();
}

std::string print_hopper_plan(const ir::Function& f, const HopperPlan& plan) {
  std::string out = ir::print(f);
  if (plan.empty()) return out + "// wgmma dots with shared-memory tiles: none\n";
  out += fmt::format("// wgmma dots with shared-memory tiles ({} B of shared memory for tiles, rings and barriers), in program order:\n",
                     plan.persistent_bytes);
  ir::walk(f.body, [&](const ir::Op& op) {
    if (auto d = plan.dots.find(&op); d != plan.dots.end()) {
      const WgmmaDot& w = d->second;
      const std::string a = w.a_tile ? fmt::format("tile at {}{}", w.a_tile->loc.str(), w.a_mn_major ? " (MN-major)" : "")
                            : w.a_staged ? fmt::format("staged (trans at {})", w.a_staged->loc.str())
                                         : std::string("registers");
      out += fmt::format("//   dot at {}: A {}, B tile at {} ({})\n", op.loc.str(), a, w.b_tile->loc.str(),
                         w.b_mn_major ? "MN-major" : "K-major");
    }
    if (auto t = plan.tiles.find(&op); t != plan.tiles.end())
      out += fmt::format("//   tile at {}: [{} x {}] at {} B, {}\n", op.loc.str(), t->second.rows, t->second.cols, t->second.offset,
                         t->second.ring ? fmt::format("in the ring of the for at {}", t->second.ring->loc.str()) : "loaded once");
    if (auto r = plan.rings.find(&op); r != plan.rings.end())
      out += r->second.follower()
                 ? fmt::format("//   ring of the for at {}: the ring of the for at {} (one ring over consecutive loops)\n", op.loc.str(),
                               r->second.head()->loc.str())
                 : fmt::format("//   ring of the for at {}: {} stages of {} B at {} B{}{}\n", op.loc.str(), r->second.stages,
                               r->second.stage_bytes, r->second.base, r->second.rerun ? ", reset after each run" : "",
                               r->second.chain.empty() ? "" : fmt::format(", shared by the next {} loops", r->second.chain.size() - 1));
    if (auto r = plan.reduces.find(&op); r != plan.reduces.end())
      out += fmt::format("//   TMA {} at {}: [{} x {}]{}\n", r->second.store_only ? "store" : "reduce", op.loc.str(), r->second.rows,
                         r->second.cols, r->second.staging_tile ? fmt::format(", staged in the tile at {}", r->second.staging_tile->loc.str())
                                       : r->second.loop              ? ", issued by the producer's reduce writer"
                                                                     : "");
  });
  return out;
}

}  // namespace tilejit::jit
