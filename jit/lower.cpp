// Tile IR -> per-thread IR. Ops with a concrete layout in the plan are emitted in program order;
// flexible ones (constants, aranges, splats, views) are materialised on demand, directly in the
// layout each use asks for, which makes broadcasts of reductions and transposes free.
#include "jit/lower.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <unordered_set>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

namespace tilejit::jit {
namespace {

using ir::DType;
using ir::OpKind;
using pir::Op;
using pir::V;
using Regs = std::vector<V>;

struct TensorDesc {
  V ptr;
  std::vector<V> sizes, strides;  // i32, i64
  ir::ParamSpec spec;             // what the parameter promises, as it holds for this view
};

// Scoped caches: what was materialised inside a loop or if body is not visible after it.
struct Frame {
  bool loop_body = false;  // a for loop's body: conversions of values from outside move before the loop
  // (loop bodies) the body, and the wgmma A registers that are the same in every iteration, kept
  // alive at the body's end (pir::Op::keep_alive says why)
  const ir::Block* body = nullptr;
  std::vector<V> keep_alive;
  // a warp role's region: tiles and thread coordinates of the frames outside are another warp
  // numbering's (lookups stop here); scalars are shared
  bool role = false;
  std::map<std::pair<ir::ValueId, std::string>, Regs> tiles;
  std::unordered_map<ir::ValueId, V> scalars;
  std::map<std::string, std::vector<V>> thread_coords;
};

class Lowerer {
 public:
  // `precomputed`: for each flexible precompute result, the layout its first use asked for on an
  // earlier run of the lowering (empty on the first run; see lower_to_threads).
  Lowerer(const ir::Function& f, const LayoutPlan& plan, std::map<ir::ValueId, Layout> precomputed = {})
      : f_(f), plan_(plan), precomputed_(std::move(precomputed)) {}
  // The layouts the uses of flexible precompute results asked for (first request of each).
  const std::map<ir::ValueId, Layout>& precompute_requests() const { return precompute_requests_; }

  pir::Func run() {
    out_.name = f_.name;
    out_.num_threads = 32 * plan_.num_warps;
    warps_ = plan_.num_warps;
    ir::walk(f_.body, [&](const ir::Op& op) {
      for (ir::ValueId r : op.results) def_[r] = &op;
      if (op.kind == OpKind::for_) iv_loop_[op.regions[0].args[0]] = &op;
    });
    push_block(&out_.body);
    frames_.emplace_back();
    params();
    tensor_map_params();
    tid_ = emit(Op::thread_id, pir::scalar(DType::i32), {});
    lane_ = emit(Op::bit_and, pir::scalar(DType::i32), {tid_, ci32(31)});
    warp_ = emit(Op::shr, pir::scalar(DType::i32), {tid_, ci32(5)});
    turns_init();
    hopper_init();
    channels_init();
    block(f_.body);
    // TMA reduces still reading the staging tile when the program ends: shared memory must outlive them.
    if (!plan_.hopper.reduces.empty())
      pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
    out_.smem_bytes = smem_bytes_;
    // The largest dynamic shared memory a block may have on sm_80/sm_90 (227 KB): a larger kernel
    // would only fail at launch.
    constexpr int64_t kMaxSmem = 227 * 1024;
    if (smem_bytes_ > kMaxSmem) {
      const HopperPlan& h = plan_.hopper;
      fail(nullptr, fmt::format("needs {} B of shared memory ({} B of TMA tiles and stages, the rest for exchanges between "
                                "layouts); at most {} B fit on one multiprocessor: use smaller blocks or fewer stages",
                                smem_bytes_, h.persistent_bytes, kMaxSmem));
    }
    return std::move(out_);
  }

 private:
  // ---------------------------------------------------------------- emission helpers
  // The pir block being emitted into; each gets a fresh id (straight-line facts are keyed by it).
  void push_block(pir::Block* b) {
    blocks_.push_back(b);
    block_ids_.push_back(++block_serial_);
  }
  void pop_block() {
    blocks_.pop_back();
    block_ids_.pop_back();
  }
  [[noreturn]] void fail(const ir::Op* op, const std::string& msg) const {
    if (!op) throw LoweringError(fmt::format("tilejit: kernel '{}': {}", f_.name, msg));
    throw LoweringError(fmt::format("tilejit: kernel '{}': {} at {}: {}", f_.name, ir::op_name(op->kind), op->loc.str(), msg));
  }

  V emit(Op op, pir::Ty ty, std::vector<V> args, int64_t imm = 0, double fimm = 0) {
    if (op == Op::load_shared) args[0] = scratch(args[0]);
    pir::Inst in;
    in.op = op;
    in.args = std::move(args);
    in.imm = imm;
    in.fimm = fimm;
    V r = out_.new_value(ty);
    in.results.push_back(r);
    blocks_.back()->insts.push_back(std::move(in));
    return r;
  }
  void emit0(Op op, std::vector<V> args, int64_t imm = 0) {
    if (op == Op::store_shared) args[0] = scratch(args[0]);
    // The other warpgroup waits for this one's turn to end: a barrier of all threads here deadlocks.
    if (op == Op::barrier && in_turn_)
      fail(in_turn_, "a warpgroup turn must not contain an exchange through shared memory or another barrier of all threads "
                     "(the other warpgroup is waiting for the turn to end); move that work out of the turn");
    // In a warp role, a barrier of "all threads" is one of the role's threads: its named barrier.
    if (op == Op::barrier && role_barrier_) {
      op = Op::named_barrier_sync;
      args = {ci32(role_barrier_)};
      imm = 32 * warps_ | pir::kBarrierUnfenced;
    }
    pir::Inst in;
    in.op = op;
    in.args = std::move(args);
    in.imm = imm;
    blocks_.back()->insts.push_back(std::move(in));
  }
  pir::Ty ty_of(ir::DType d) const { return pir::scalar(d); }
  pir::Ty value_ty(const ir::Type& t) const { return t.is_pointer() ? pir::pointer(t.dtype) : pir::scalar(t.dtype); }

  V cint(DType d, int64_t v) {
    auto key = std::make_pair(d, v);
    auto it = const_ints_.find(key);
    if (it != const_ints_.end() && blocks_.size() == 1) return it->second;
    V r = emit(Op::constant, pir::scalar(d), {}, v);
    if (blocks_.size() == 1) const_ints_[key] = r;
    return r;
  }
  V ci32(int64_t v) { return cint(DType::i32, v); }
  V cfloat(DType d, double v) { return emit(Op::constant, pir::scalar(d), {}, 0, v); }
  V bin(Op op, V a, V b) { return emit(op, out_.types[a], {a, b}); }
  V cmp(pir::Pred p, V a, V b) { return emit(Op::cmp, pir::scalar(DType::i1), {a, b}, static_cast<int64_t>(p)); }
  V cast(V v, DType to) {
    if (out_.types[v] == pir::scalar(to)) return v;
    return emit(Op::cast, pir::scalar(to), {v});
  }
  V land(V a, V b) { return bin(Op::bit_and, a, b); }

  V constant_value(DType d, const ir::Attr& a) {
    if (ir::is_float(d)) {
      double v = std::holds_alternative<double>(a) ? std::get<double>(a) : static_cast<double>(std::get<int64_t>(a));
      return cfloat(d, v);
    }
    int64_t v = std::holds_alternative<int64_t>(a) ? std::get<int64_t>(a) : static_cast<int64_t>(std::get<double>(a));
    return cint(d, ir::wrap_int(d, v));
  }

  // Scratch exchanges (load_shared/store_shared offsets) live above the persistent shared-memory
  // tiles, rings and barriers of the Hopper plan.
  V scratch(V offset) { return scratch_base_ ? bin(Op::add, offset, ci32(scratch_base_)) : offset; }
  int64_t reserve_smem(int64_t bytes) {
    smem_bytes_ = std::max(smem_bytes_, scratch_base_ + bytes);
    return 0;  // every exchange is bracketed by barriers, so all reuse offset 0
  }

  // ---------------------------------------------------------------- parameters
  void params() {
    int slot = 0;
    for (const ir::Param& p : f_.params) {
      auto add = [&](const std::string& name, pir::Ty t) {
        out_.params.push_back({name, t});
        return emit(Op::param, t, {}, slot++);
      };
      switch (p.kind) {
        case ir::ParamKind::Scalar: frames_[0].scalars[p.value] = add(p.name, pir::scalar(p.type.dtype)); break;
        case ir::ParamKind::Pointer: frames_[0].scalars[p.value] = add(p.name, pir::pointer(p.type.dtype)); break;
        case ir::ParamKind::Tensor: {
          TensorDesc d;
          d.ptr = add(p.name, pir::pointer(p.type.dtype));
          d.spec = p.spec;
          for (int i = 0; i < p.type.rank; ++i) d.sizes.push_back(add(fmt::format("{}_size{}", p.name, i), pir::scalar(DType::i32)));
          for (int i = 0; i < p.type.rank; ++i) d.strides.push_back(add(fmt::format("{}_stride{}", p.name, i), pir::scalar(DType::i64)));
          tensors_[p.value] = d;
          break;
        }
      }
    }
  }

  // ---------------------------------------------------------------- values
  V scalar(ir::ValueId v) {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->scalars.find(v);
      if (f != it->scalars.end()) return f->second;
    }
    fail(def_.count(v) ? def_.at(v) : nullptr, fmt::format("internal: scalar value {} used before it was lowered", v));
  }

  // The innermost frame holding `v` in the layout `key`, if any.
  std::optional<size_t> frame_of(ir::ValueId v, const std::string& key) const {
    for (size_t i = frames_.size(); i-- > 0;) {
      if (frames_[i].tiles.count({v, key})) return i;
      if (frames_[i].role) break;
    }
    return std::nullopt;
  }
  const Regs* cached(ir::ValueId v, const std::string& key) const {
    const std::optional<size_t> i = frame_of(v, key);
    return i ? &frames_[*i].tiles.at({v, key}) : nullptr;
  }

  void check_shape(const ir::Op* op, const ir::Type& t) const {
    for (int64_t d : t.shape)
      if (!is_power_of_two(d))
        fail(op, fmt::format("tile dimensions must be powers of two for the GPU backend, got {}", ir::to_string(t)));
  }

  // The registers of tile value `v` in layout `L`.
  Regs get(ir::ValueId v, const Layout& L) {
    if (f_.type(v).is_scalar()) return Regs(static_cast<size_t>(L.num_regs()), scalar(v));  // uniform
    wait_for(v);
    std::string key = L.str();
    if (const Regs* r = cached(v, key)) return *r;
    Regs regs;
    const auto& nat = plan_.natural[v];
    if (nat) {
      const Regs* n = cached(v, nat->str());
      if (!n) fail(def_.count(v) ? def_.at(v) : nullptr, fmt::format("internal: value {} used before it was lowered", v));
      auto again = reloadable_.find(v);
      // load_at_use: read the window again in L (its first read is dead code if no use keeps it)
      if (again != reloadable_.end() && again->second == std::pair{memory_epoch_, frames_.size()}) {
        regs = block_load_regs(*def_.at(v), L);
      } else {
        // A value from outside the loops being lowered is converted before them: once, not at every
        // iteration (e.g. the dQ kernel's row vectors LSE and Delta, loaded before its key loop and
        // used in the MMA layout inside it). Not out of an if: that would run it when not taken.
        const size_t home = frame_of(v, nat->str()).value_or(0);
        size_t at = frames_.size() - 1;
        while (at > home && frames_[at].loop_body) --at;
        const Regs natural = *n;
        if (at + 1 == frames_.size()) {
          regs = convert(natural, *nat, L, f_.type(v));
        } else {
          regs = at_level(at, [&] { return convert(natural, *nat, L, f_.type(v)); });
          frames_[at].tiles[{v, key}] = regs;  // visible from there on (the loops are inside it)
          return regs;
        }
      }
    } else {
      auto it = def_.find(v);
      if (it == def_.end()) fail(nullptr, fmt::format("internal: flexible value {} has no defining op", v));
      regs = materialize(*it->second, L);
    }
    frames_.back().tiles[{v, key}] = regs;
    return regs;
  }

  void put(ir::ValueId v, const Layout& L, Regs regs) { frames_.back().tiles[{v, L.str()}] = std::move(regs); }

  // Runs `emit_code` as if the lowering stood at frame `level` (an enclosing one): its code goes to
  // the end of that level's block -- before the loop being lowered, whose instruction is appended
  // to that block only once its body is done -- and what it caches to that frame.
  Regs at_level(size_t level, const std::function<Regs()>& emit_code) {
    std::vector<Frame> frames(std::make_move_iterator(frames_.begin() + static_cast<std::ptrdiff_t>(level + 1)),
                              std::make_move_iterator(frames_.end()));
    std::vector<pir::Block*> blocks(blocks_.begin() + static_cast<std::ptrdiff_t>(level + 1), blocks_.end());
    std::vector<int64_t> ids(block_ids_.begin() + static_cast<std::ptrdiff_t>(level + 1), block_ids_.end());
    frames_.resize(level + 1);
    blocks_.resize(level + 1);
    block_ids_.resize(level + 1);
    Regs out = emit_code();
    for (Frame& f : frames) frames_.push_back(std::move(f));
    blocks_.insert(blocks_.end(), blocks.begin(), blocks.end());
    block_ids_.insert(block_ids_.end(), ids.begin(), ids.end());
    return out;
  }

  // Per dim, the lane/warp part of each element's coordinate in this thread (i32).
  const std::vector<V>& thread_coords(const Layout& L) {
    std::string key = L.str();
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->thread_coords.find(key);
      if (f != it->thread_coords.end()) return f->second;
      if (it->role) break;
    }
    std::vector<V> c;
    for (size_t d = 0; d < L.shape.size(); ++d) {
      V acc = ci32(0);
      auto add_bits = [&](const std::vector<Coord>& bases, V id) {
        for (size_t i = 0; i < bases.size(); ++i) {
          if (bases[i][d] == 0) continue;
          V bit = land(bin(Op::shr, id, ci32(static_cast<int64_t>(i))), ci32(1));
          acc = bin(Op::bit_xor, acc, bin(Op::mul, bit, ci32(bases[i][d])));
        }
      };
      add_bits(L.lane, lane_);
      add_bits(L.warp, warp_);
      c.push_back(acc);
    }
    return frames_.back().thread_coords[key] = c;
  }

  // Coordinate d of register r in this thread. When the register bits and the lane/warp bits of
  // dim d are disjoint (always, for blocked and mma layouts) XOR is an add, which LLVM folds into
  // address immediates.
  V coord(const Layout& L, uint32_t r, size_t d) {
    int64_t rc = L.reg_coords(r)[d];
    V tc = thread_coords(L)[d];
    if (rc == 0) return tc;
    int64_t thread_bits = 0;
    for (const auto* bs : {&L.lane, &L.warp})
      for (const Coord& c : *bs) thread_bits |= c[d];
    return bin((thread_bits & rc) == 0 ? Op::add : Op::bit_xor, tc, ci32(rc));
  }

  // Whether register bits and lane/warp bits never overlap within a dim: coordinates then add.
  static bool additive(const Layout& L) {
    for (size_t d = 0; d < L.shape.size(); ++d) {
      int64_t reg_bits = 0, thread_bits = 0;
      for (const Coord& c : L.reg) reg_bits |= c[d];
      for (const auto* bs : {&L.lane, &L.warp})
        for (const Coord& c : *bs) thread_bits |= c[d];
      if (reg_bits & thread_bits) return false;
    }
    return true;
  }

  // Element offset (row-major over the tile) of register r in this thread: one per-thread base
  // plus a compile-time constant per register where the layout is additive, so that the backend
  // folds the constants into address immediates and keeps a single base register live.
  V tile_offset(const Layout& L, uint32_t r) {
    std::vector<int64_t> row_stride(L.shape.size());
    int64_t stride = 1;
    for (size_t d = L.shape.size(); d-- > 0;) {
      row_stride[d] = stride;
      stride *= L.shape[d];
    }
    if (additive(L)) {
      std::string key = "offset:" + L.str();
      V base;
      auto& cache = frames_.back().thread_coords;
      const std::vector<V>* found = nullptr;
      for (auto it = frames_.rbegin(); it != frames_.rend() && !found; ++it) {
        auto f = it->thread_coords.find(key);
        if (f != it->thread_coords.end()) found = &f->second;
        if (it->role) break;
      }
      if (found) {
        base = (*found)[0];
      } else {
        base = ci32(0);
        const std::vector<V>& tc = thread_coords(L);
        for (size_t d = 0; d < L.shape.size(); ++d) base = bin(Op::add, base, bin(Op::mul, tc[d], ci32(row_stride[d])));
        cache[key] = {base};
      }
      Coord rc = L.reg_coords(r);
      int64_t c = 0;
      for (size_t d = 0; d < L.shape.size(); ++d) c += rc[d] * row_stride[d];
      return c == 0 ? base : bin(Op::add, base, ci32(c));
    }
    V off = ci32(0);
    for (size_t d = 0; d < L.shape.size(); ++d) off = bin(Op::add, off, bin(Op::mul, coord(L, r, d), ci32(row_stride[d])));
    return off;
  }

  // Registers that replicate an earlier register of the same thread (skipped by stores).
  bool duplicate_reg(const Layout& L, uint32_t r) const {
    for (size_t i = 0; i < L.reg.size(); ++i)
      if ((r >> i & 1) && std::all_of(L.reg[i].begin(), L.reg[i].end(), [](int64_t x) { return x == 0; })) return true;
    return false;
  }

  // i1 true in the one thread of each replica group that owns the element (nullopt: all own).
  std::optional<V> owner(const Layout& L) {
    int64_t lane_mask = 0, warp_mask = 0;
    auto zero = [](const Coord& c) { return std::all_of(c.begin(), c.end(), [](int64_t x) { return x == 0; }); };
    for (size_t i = 0; i < L.lane.size(); ++i)
      if (zero(L.lane[i])) lane_mask |= int64_t{1} << i;
    for (size_t i = 0; i < L.warp.size(); ++i)
      if (zero(L.warp[i])) warp_mask |= int64_t{1} << i;
    if (!lane_mask && !warp_mask) return std::nullopt;
    V ok_l = cmp(pir::Pred::eq, land(lane_, ci32(lane_mask)), ci32(0));
    V ok_w = cmp(pir::Pred::eq, land(warp_, ci32(warp_mask)), ci32(0));
    return land(ok_l, ok_w);
  }

  // ---------------------------------------------------------------- layout conversion
  Regs convert(const Regs& regs, const Layout& from, const Layout& to, const ir::Type& t) {
    if (from == to) return regs;
    if (from.lane == to.lane && from.warp == to.warp && from.shape == to.shape) {
      // Same elements per thread: a register renaming.
      std::map<Coord, V> by_coord;
      for (uint32_t r = 0; r < static_cast<uint32_t>(from.num_regs()); ++r) by_coord.emplace(from.reg_coords(r), regs[r]);
      Regs outr;
      bool ok = true;
      for (uint32_t r = 0; r < static_cast<uint32_t>(to.num_regs()) && ok; ++r) {
        auto it = by_coord.find(to.reg_coords(r));
        if (it == by_coord.end()) ok = false;
        else outr.push_back(it->second);
      }
      if (ok) return outr;
    }
    return through_smem(regs, from, to, t);
  }

  // Storage type of a tile element in shared memory.
  pir::Ty smem_ty(const ir::Type& t) const {
    if (t.is_pointer()) return pir::scalar(DType::u64);
    if (t.dtype == DType::i1) return pir::scalar(DType::u8);
    return pir::scalar(t.dtype);
  }
  V to_smem(V v, const ir::Type& t) {
    if (t.is_pointer()) return emit(Op::bitcast, pir::scalar(DType::u64), {v});
    if (t.dtype == DType::i1) return cast(v, DType::u8);
    return v;
  }
  V from_smem(V v, const ir::Type& t) {
    if (t.is_pointer()) return emit(Op::bitcast, pir::pointer(t.dtype), {v});
    if (t.dtype == DType::i1) return cmp(pir::Pred::ne, v, cint(DType::u8, 0));
    return v;
  }

  Regs through_smem(const Regs& regs, const Layout& from, const Layout& to, const ir::Type& t) {
    pir::Ty st = smem_ty(t);
    int64_t esize = ir::byte_size(st.dtype);
    int64_t numel = 1;
    for (int64_t d : to.shape) numel *= d;
    reserve_smem(numel * esize);
    for (uint32_t r = 0; r < regs.size(); ++r) {
      if (duplicate_reg(from, r)) continue;
      V off = bin(Op::mul, tile_offset(from, r), ci32(esize));
      emit0(Op::store_shared, {off, to_smem(regs[r], t)});
    }
    emit0(Op::barrier, {});
    Regs outr;
    for (uint32_t r = 0; r < static_cast<uint32_t>(to.num_regs()); ++r) {
      V off = bin(Op::mul, tile_offset(to, r), ci32(esize));
      outr.push_back(from_smem(emit(Op::load_shared, st, {off}), t));
    }
    emit0(Op::barrier, {});
    return outr;
  }

  // ---------------------------------------------------------------- flexible values
  Regs materialize(const ir::Op& op, const Layout& L) {
    const ir::Type& t = f_.type(op.results[0]);
    check_shape(&op, t);
    auto n = static_cast<uint32_t>(L.num_regs());
    switch (op.kind) {
      case OpKind::constant: return Regs(n, constant_value(t.dtype, op.attrs.at("value")));
      case OpKind::splat: return Regs(n, scalar(op.operands[0]));
      case OpKind::arange: {
        Regs r;
        for (uint32_t i = 0; i < n; ++i) r.push_back(bin(Op::add, coord(L, i, 0), ci32(op.int_attr("start"))));
        return r;
      }
      case OpKind::broadcast: {
        const ir::Type& src = f_.type(op.operands[0]);
        Layout S = L;
        for (size_t d = 0; d < src.shape.size(); ++d)
          if (src.shape[d] == 1 && t.shape[d] != 1) S = S.collapse(static_cast<int>(d));
        return get(op.operands[0], S);
      }
      case OpKind::expand_dims: return get(op.operands[0], L.drop_dim(static_cast<int>(op.int_attr("axis"))));
      case OpKind::channel_pop:
        // first run: read at its first use, and the layout recorded; the second reads it at the
        // pop itself (channel_pop below), once
        precompute_requests_.try_emplace(op.results[0], L);
        return channel_read(op, L);
      case OpKind::precompute:
        // A use asks for a flexible precompute result that was not computed ahead in this layout
        // (first run, or another layout): recorded, and computed here.
        precompute_requests_.try_emplace(op.results[0], L);
        return get(op.operands[0], L);
      case OpKind::trans: {
        const auto& perm = op.ints_attr("perm");
        std::vector<int64_t> inv(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
        return get(op.operands[0], L.permute(inv));
      }
      case OpKind::reshape: {
        auto S = L.reshape(f_.type(op.operands[0]).shape);
        if (!S) fail(&op, "reshape of a layout that is not linear in the flat index");
        return get(op.operands[0], *S);
      }
      default:
        if (ir::is_elementwise(op.kind)) return elementwise(op, L);
        fail(&op, "internal: not a flexible op");
    }
  }

  // ---------------------------------------------------------------- channels between warp roles
  // lang::Channel: `stages` slots of the tile (row-major) after the Hopper plan's shared memory,
  // then a full and an empty mbarrier per slot. Full counts the pushing role's threads, empty the
  // popping role's: every thread arrives once it has written (mbarrier.arrive releases its
  // st.shared) or read its part. The pusher waits for the empty phase before the slot's previous
  // use (a fresh barrier passes a wait on the phase before its first), the popper for the full one.
  struct ChannelPlan {
    int64_t slots = 0, bytes = 0, full = 0, empty = 0;
    int stages = 1;
  };

  void channels_init() {
    std::map<int64_t, int> pushers, poppers;  // channel -> threads of its pushing / popping role
    ir::walk(f_.body, [&](const ir::Op& op) {
      for (ir::ValueId v : op.operands) used_.insert(v);
      if (op.kind != OpKind::channel_push && op.kind != OpKind::channel_pop) return;
      const int64_t id = op.int_attr("channel");
      if (!plan_.op_warps.count(&op)) fail(&op, "a channel's push and pop stand inside warp roles");
      (op.kind == OpKind::channel_push ? pushers : poppers)[id] = 32 * plan_.op_warps.at(&op);
      ChannelPlan& c = channels_[id];
      c.stages = static_cast<int>(op.int_attr("stages"));
      const ir::Shape& shape = op.ints_attr("shape");
      c.bytes = ir::byte_size(std::get<ir::DType>(op.attrs.at("dtype")));
      for (int64_t d : shape) c.bytes *= d;
    });
    if (channels_.empty()) return;
    int64_t at = (scratch_base_ + 127) / 128 * 128;
    for (auto& [id, c] : channels_) {
      if (!pushers.count(id) || !poppers.count(id)) fail(nullptr, fmt::format("channel {} is {}: it needs a push and a pop", id, pushers.count(id) ? "never popped" : "never pushed"));
      c.slots = at;
      at += (c.stages * c.bytes + 15) / 16 * 16;
      c.full = at;
      c.empty = at + 8 * c.stages;
      at += 16 * c.stages;
    }
    scratch_base_ = (at + 127) / 128 * 128;
    smem_bytes_ = std::max(smem_bytes_, scratch_base_);
    pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
      for (const auto& [id, c] : channels_)
        for (int s = 0; s < c.stages; ++s) {
          emit0(Op::mbar_init, {smem_at(c.full + 8 * s), ci32(pushers.at(id))});
          emit0(Op::mbar_init, {smem_at(c.empty + 8 * s), ci32(poppers.at(id))});
        }
      emit0(Op::fence_mbar_init, {});
    });
    emit0(Op::barrier, {});
  }

  // The slot of `index` (i32) and the parity of its use: slot index % stages, use index / stages.
  std::pair<V, V> channel_slot(const ChannelPlan& c, V index) {
    V stage = bin(Op::rem, index, ci32(c.stages));
    return {stage, bin(Op::bit_and, bin(Op::div, index, ci32(c.stages)), ci32(1))};
  }
  V channel_bar(int64_t base, V stage) { return bin(Op::add, smem_at(base), cast(bin(Op::mul, stage, ci32(8)), DType::u32)); }
  // Byte offset (absolute, not scratch-relative) of register r's element of layout L in the slot.
  V channel_offset(const ChannelPlan& c, V stage, const Layout& L, uint32_t r, DType d) {
    V slot = bin(Op::add, ci32(c.slots), bin(Op::mul, stage, ci32(c.bytes)));
    return bin(Op::add, slot, bin(Op::mul, tile_offset(L, r), ci32(ir::byte_size(d))));
  }

  void channel_push(const ir::Op& op) {
    const ChannelPlan& c = channels_.at(op.int_attr("channel"));
    const ir::Type& t = f_.type(op.operands[1]);
    const Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
    const Regs v = get(op.operands[1], L);
    auto [stage, parity] = channel_slot(c, cast(scalar(op.operands[0]), DType::i32));
    emit0(Op::mbar_wait, {channel_bar(c.empty, stage), bin(Op::bit_xor, parity, ci32(1))});
    for (uint32_t r = 0; r < v.size(); ++r) store_shared_at(channel_offset(c, stage, L, r, t.dtype), v[r], std::nullopt);
    emit0(Op::mbar_arrive, {channel_bar(c.full, stage)});
  }

  Regs channel_read(const ir::Op& op, const Layout& L) {
    if (!read_pops_.insert(op.results[0]).second)
      fail(&op, "a channel pop is read once: its tile is used in two layouts (compute one from the other, or pop into one use)");
    const ChannelPlan& c = channels_.at(op.int_attr("channel"));
    const DType d = f_.type(op.results[0]).dtype;
    auto [stage, parity] = channel_slot(c, cast(scalar(op.operands[0]), DType::i32));
    emit0(Op::mbar_wait, {channel_bar(c.full, stage), parity});
    Regs out;
    for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) out.push_back(load_shared_at(channel_offset(c, stage, L, r, d), d));
    emit0(Op::mbar_arrive, {channel_bar(c.empty, stage)});
    return out;
  }

  // ---------------------------------------------------------------- warp roles
  // lang::warp_roles: an if/else chain on the warp index, one branch per role (setmaxnreg needs
  // each warpgroup's role to be one branch of a single if/else). Inside a branch the thread and
  // warp indices count from the role's first warp, tiles spread over the role's warps, a barrier
  // is the role's named barrier, and exchanges through shared memory use the role's own scratch.
  static constexpr int kRoleBarrier = 3;  // ids 3.. (1 and 2: warpgroup turns; 0: all threads)

  void warp_roles(const ir::Op& op) {
    const std::vector<WarpRolePlan>& roles = plan_.roles.at(&op);
    if (roles.size() > 16 - kRoleBarrier) fail(&op, fmt::format("{} warp roles; at most {} (one named barrier each)", roles.size(), 16 - kRoleBarrier));
    const int cap = entry_register_cap(plan_.num_warps);
    if (roles[0].max_registers > 0) {  // (then every role has one)
      out_.min_programs_per_sm = 1;    // the cap setmaxnreg needs (ptxas ignores it without one: C7508)
      if (cap < 24)
        fail(&op, fmt::format("num_warps = {} leaves {} registers a thread at entry; setmaxnreg needs at least 24", plan_.num_warps, cap));
    }
    const V tid = tid_, warp = warp_;
    const int64_t scratch0 = scratch_base_;
    std::function<void(size_t)> role_at = [&](size_t i) {
      const WarpRolePlan& r = roles[i];
      auto body = [&] {
        if (r.max_registers > 0 && r.max_registers != cap)
          emit0(Op::set_max_registers, {}, r.max_registers > cap ? r.max_registers : -r.max_registers);
        tid_ = bin(Op::sub, tid, ci32(32 * r.first_warp));
        warp_ = bin(Op::sub, warp, ci32(r.first_warp));
        warps_ = r.warps;
        role_barrier_ = kRoleBarrier + static_cast<int>(i);
        // the branch's own frame (pir_if_values pushed it with its block: frames and blocks stay
        // paired, which at_level relies on) marks the role's boundary
        frames_.back().role = true;
        block(op.regions[i]);
        // the next role's exchanges run at the same time as this one's: their own scratch
        scratch_base_ = (smem_bytes_ + 127) / 128 * 128;
        tid_ = tid, warp_ = warp, warps_ = plan_.num_warps, role_barrier_ = 0;
      };
      if (i + 1 == roles.size()) return body();
      pir_if_values(cmp(pir::Pred::lt, warp, ci32(r.first_warp + r.warps)), {}, [&] {
        body();
        return Regs{};
      }, [&] {
        role_at(i + 1);
        return Regs{};
      });
    };
    role_at(0);
    scratch_base_ = scratch0;
  }

  // ---------------------------------------------------------------- warpgroup turns
  // FlashAttention-3's ping-pong: named barrier 1 + w is warpgroup w's turn. A turn starts with
  // bar.sync on its own barrier (256 threads: its 128 and the 128 of the other warpgroup's
  // arrive) and ends with bar.arrive on the other's, without waiting for the MMAs issued inside.
  // Warpgroup 1 hands warpgroup 0 the first turn. Both run the same turns (uniform control flow),
  // so the only arrival left at exit is that first one's counterpart, which the hardware discards.
  // With another number of warpgroups the turns are no-ops.
  static constexpr int kTurnBarrier = 1;  // ids 1 and 2; 0 is bar.sync 0 (all threads)
  static constexpr int kWarpgroupThreads = 128;

  void turns_init() {
    bool any = false;
    ir::walk(f_.body, [&](const ir::Op& op) { any = any || op.kind == OpKind::turn_begin; });
    turns_ = any && plan_.num_warps == 8 && plan_.roles.empty();
    if (!turns_) return;
    // computed once, at the top level: every turn of the kernel uses the same two barriers
    V warpgroup = emit(Op::shr, pir::scalar(DType::i32), {warp_, ci32(2)});
    own_turn_ = emit(Op::add, pir::scalar(DType::i32), {warpgroup, ci32(kTurnBarrier)});
    other_turn_ = emit(Op::sub, pir::scalar(DType::i32), {ci32(kTurnBarrier + 1), warpgroup});
    pir_if(cmp(pir::Pred::eq, warpgroup, ci32(1)),
           [&] { emit0(Op::named_barrier_arrive, {ci32(kTurnBarrier)}, 2 * kWarpgroupThreads); });
  }
  void turn_begin(const ir::Op& op) {
    if (!turns_) return;
    in_turn_ = &op;
    emit0(Op::named_barrier_sync, {own_turn_}, 2 * kWarpgroupThreads);
  }
  void turn_end() {
    if (!turns_) return;
    in_turn_ = nullptr;
    emit0(Op::named_barrier_arrive, {other_turn_}, 2 * kWarpgroupThreads);
  }

  // ---------------------------------------------------------------- elementwise
  V scalar_op(const ir::Op& op, const std::vector<V>& a) {
    const ir::Type& rt = f_.type(op.results[0]);
    pir::Ty ty = value_ty(rt);
    switch (op.kind) {
      case OpKind::cmp: {
        static const std::map<std::string, pir::Pred> preds{{"eq", pir::Pred::eq}, {"ne", pir::Pred::ne}, {"lt", pir::Pred::lt},
                                                            {"le", pir::Pred::le}, {"gt", pir::Pred::gt}, {"ge", pir::Pred::ge}};
        return cmp(preds.at(op.str_attr("pred")), a[0], a[1]);
      }
      case OpKind::select: return emit(Op::select, ty, {a[0], a[1], a[2]});
      case OpKind::cast: return emit(Op::cast, ty, {a[0]});
      case OpKind::bitcast: return emit(Op::bitcast, ty, {a[0]});
      case OpKind::addptr: return emit(Op::gep, ty, {a[0], a[1]});
      default: break;
    }
    static const std::map<OpKind, Op> direct{
        {OpKind::add, Op::add}, {OpKind::sub, Op::sub}, {OpKind::mul, Op::mul}, {OpKind::div, Op::div},
        {OpKind::rem, Op::rem}, {OpKind::minimum, Op::minimum}, {OpKind::maximum, Op::maximum},
        {OpKind::bit_and, Op::bit_and}, {OpKind::bit_or, Op::bit_or}, {OpKind::bit_xor, Op::bit_xor},
        {OpKind::shl, Op::shl}, {OpKind::shr, Op::shr}, {OpKind::umulhi, Op::umulhi}, {OpKind::byte_perm, Op::byte_perm}, {OpKind::fma, Op::fma},
        {OpKind::neg, Op::neg}, {OpKind::bit_not, Op::bit_not}, {OpKind::abs, Op::abs}, {OpKind::exp, Op::exp}, {OpKind::exp2, Op::exp2},
        {OpKind::log, Op::log}, {OpKind::log2, Op::log2}, {OpKind::sqrt, Op::sqrt}, {OpKind::rsqrt, Op::rsqrt}, {OpKind::rcp, Op::rcp},
        {OpKind::floor, Op::floor}, {OpKind::ceil, Op::ceil}, {OpKind::tanh, Op::tanh}, {OpKind::sin, Op::sin},
        {OpKind::cos, Op::cos}, {OpKind::erf, Op::erf}};
    auto it = direct.find(op.kind);
    if (it == direct.end()) fail(&op, "internal: no per-thread lowering");
    return emit(it->second, ty, a);
  }

  Regs elementwise(const ir::Op& op, const Layout& L) {
    std::vector<Regs> in;
    for (ir::ValueId v : op.operands) in.push_back(get(v, L));
    Regs outr;
    for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) {
      std::vector<V> a;
      for (const Regs& x : in) a.push_back(x[r]);
      outr.push_back(scalar_op(op, a));
    }
    return outr;
  }

  // ---------------------------------------------------------------- program order
  void block(const ir::Block& b) {
    for (const ir::Op& op : b.ops) {
      // counted once lowered: a wait triggered by the op's own read sees only the ops before it
      const bool counts = op.kind != OpKind::dot && op.kind != OpKind::yield;
      if (op.regions.empty()) {
        lower(op);
        if (counts) ++ops_lowered_;
        continue;
      }
      // A region that runs MMAs itself waits for every MMA in flight first; one that reads MMA
      // results still in flight waits for those (and the groups committed before them: waits
      // count groups in order), so that later groups stay in flight through it (e.g. a mask
      // applied under a branch to S_j while P_{j-1} V_{j-1} runs). Any other region runs while they
      // all stay in flight: it cannot touch their registers, and they are not its to wait for.
      if (const std::optional<int> upto = region_waits_for(op)) wait_groups(*upto);
      std::vector<PendingDot> outer = std::move(pending_);
      pending_.clear();
      lower(op);
      pending_ = std::move(outer);
      ++ops_lowered_;
    }
    wait_pending();
  }

  bool all_scalar(const ir::Op& op) const {
    for (ir::ValueId r : op.results)
      if (!f_.type(r).is_scalar()) return false;
    return true;
  }

  void lower(const ir::Op& op) {
    switch (op.kind) {
      case OpKind::for_: return for_loop(op);
      case OpKind::if_: return if_op(op);
      case OpKind::yield: return;  // handled by the enclosing op
      case OpKind::store: return store(op);
      case OpKind::block_store: return block_store(op);
      case OpKind::load: return load(op);
      case OpKind::block_load: return block_load(op);
      case OpKind::atomic_add: return atomic_add(op);
      case OpKind::wait_ge: {
        // thread 0 spins with acquire loads, then the barrier hands the acquired view to the CTA
        ++memory_epoch_;
        V ptr = scalar(op.operands[0]), target = scalar(op.operands[1]);
        pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
          emit0(Op::sem_wait, {ptr, target});
          // TMA reduces issued after the wait (async proxy) see what the signals released
          if (!plan_.hopper.reduces.empty()) emit0(Op::fence_proxy_async_global, {});
        });
        emit0(Op::barrier, {});
        return;
      }
      case OpKind::signal_add: {
        // every thread's earlier writes are done (barrier), then thread 0 releases them
        ++memory_epoch_;
        V ptr = scalar(op.operands[0]), value = scalar(op.operands[1]);
        emit0(Op::barrier, {});
        pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
          if (!plan_.hopper.reduces.empty()) {
            // thread 0 issued the program's TMA reduces: their global writes complete first
            emit0(Op::bulk_wait, {}, 0);
            emit0(Op::fence_proxy_async_global, {});
          }
          emit0(Op::sem_signal, {ptr, value});
        });
        return;
      }
      case OpKind::warp_roles: return warp_roles(op);
      case OpKind::channel_push: return channel_push(op);
      case OpKind::channel_pop: {
        auto it = precomputed_.find(op.results[0]);
        if (it != precomputed_.end()) return put(op.results[0], it->second, channel_read(op, it->second));
        // never used: read (and freed) here all the same, or the pushing role would wait for the slot
        if (!used_.count(op.results[0])) channel_read(op, Layout::blocked(f_.type(op.results[0]).shape, warps_, 1));
        return;
      }
      case OpKind::pack_pairs: {
        // the result's layout unpacked has the pair bit as register bit 0: registers 2r, 2r + 1
        const Layout& L = *plan_.natural[op.results[0]];
        const Regs halves = get(op.operands[0], L.unpack_pairs());
        Regs words;
        for (size_t r = 0; r + 1 < halves.size(); r += 2) words.push_back(pack(halves[r], halves[r + 1]));
        put(op.results[0], L, words);
        return;
      }
      case OpKind::unpack_pairs: {
        const Layout& L = *plan_.natural[op.results[0]];
        const std::optional<Layout> packed = L.pack_pairs();
        if (!packed) fail(&op, "internal: unpack_pairs' layout holds no pairs");
        const Regs words = get(op.operands[0], *packed);
        const DType d = f_.type(op.results[0]).dtype;
        Regs halves;
        for (V w : words) {
          Regs two = emit_multi(Op::unpack2, {w}, 2, pir::scalar(d), 0);
          unpacked_[two[0]] = {w, 0};
          unpacked_[two[1]] = {w, 1};
          halves.insert(halves.end(), two.begin(), two.end());
        }
        put(op.results[0], L, halves);
        return;
      }
      case OpKind::turn_begin: return turn_begin(op);
      case OpKind::turn_end: return turn_end();
      case OpKind::reduce: return reduce(op);
      case OpKind::dot: return dot(op);
      case OpKind::program_id:
        frames_.back().scalars[op.results[0]] = emit(Op::block_id, pir::scalar(DType::i32), {}, op.int_attr("axis"));
        return;
      case OpKind::num_programs:
        frames_.back().scalars[op.results[0]] = emit(Op::grid_dim, pir::scalar(DType::i32), {}, op.int_attr("axis"));
        return;
      case OpKind::tensor_ptr: frames_.back().scalars[op.results[0]] = tensors_.at(op.operands[0]).ptr; return;
      case OpKind::tensor_dim:
        frames_.back().scalars[op.results[0]] = tensors_.at(op.operands[0]).sizes.at(static_cast<size_t>(op.int_attr("dim")));
        return;
      case OpKind::tensor_stride:
        frames_.back().scalars[op.results[0]] =
            tensors_.at(op.operands[0]).strides.at(static_cast<size_t>(op.int_attr("dim")));
        return;
      case OpKind::tensor_slice: {
        // the view's base is parent + start * stride(dim), its size(dim) = length; rows stay
        // aligned unless the innermost dim is sliced (its start moves the base by elements)
        TensorDesc d = tensors_.at(op.operands[0]);
        auto dim = static_cast<size_t>(op.int_attr("dim"));
        V off = bin(Op::mul, cast(scalar(op.operands[1]), DType::i64), d.strides[dim]);
        d.ptr = emit(Op::gep, out_.types[d.ptr], {d.ptr, off});
        d.sizes[dim] = scalar(op.operands[2]);
        if (dim + 1 == d.sizes.size()) d.spec.align_bytes = 0;
        tensors_[op.results[0]] = d;
        return;
      }
      case OpKind::constant:
        if (all_scalar(op)) frames_.back().scalars[op.results[0]] = constant_value(f_.type(op.results[0]).dtype, op.attrs.at("value"));
        return;
      case OpKind::precompute: return precompute(op);
      default: break;
    }
    if (all_scalar(op)) {
      std::vector<V> a;
      for (ir::ValueId v : op.operands) a.push_back(scalar(v));
      frames_.back().scalars[op.results[0]] = scalar_op(op, a);
      return;
    }
    const auto& nat = plan_.natural[op.results[0]];
    if (!nat) return;  // flexible: materialised where used
    check_shape(&op, f_.type(op.results[0]));
    put(op.results[0], *nat, elementwise(op, *nat));
  }

  // precompute: the operand's registers now, in its natural layout or (flexible) in the layout its
  // use asked for on the previous run, through an opaque op so that the backend cannot compute them
  // later. A flexible result no use asked for is left to its uses.
  void precompute(const ir::Op& op) {
    const ir::ValueId x = op.operands[0], y = op.results[0];
    if (f_.type(y).is_scalar()) {
      frames_.back().scalars[y] = scalar(x);
      return;
    }
    std::optional<Layout> L = plan_.natural[y];
    if (!L) {
      auto it = precomputed_.find(y);
      if (it == precomputed_.end()) return;
      L = it->second;
    }
    check_shape(&op, f_.type(y));
    // Work meant to run while MMAs are in flight must not delay their issue: ptxas would otherwise
    // interleave it with the wgmma instructions of the group just committed (measured: 0.9x).
    if (!pending_.empty()) pending_.back().commit_block->insts[pending_.back().commit_at].imm |= pir::kCommitFenced;
    Regs r = get(x, *L);
    put(y, *L, emit_multi(Op::opaque, r, r.size(), pir::scalar(f_.type(y).dtype), 0));
  }

  // ---------------------------------------------------------------- memory
  Layout memory_layout(const ir::Type& t) const {
    return Layout::blocked(t.shape, warps_, vector_width(t.dtype, t.shape.back()));
  }

  void load(const ir::Op& op) {
    const ir::Type& t = f_.type(op.results[0]);
    pir::Ty ty = pir::scalar(t.dtype);
    if (t.is_scalar()) {
      std::vector<V> a{scalar(op.operands[0])};
      if (op.operands.size() == 3) a = {a[0], scalar(op.operands[1]), scalar(op.operands[2])};
      frames_.back().scalars[op.results[0]] = emit(Op::load, ty, a);
      return;
    }
    check_shape(&op, t);
    const Layout& L = *plan_.natural[op.results[0]];
    Regs ptr = get(op.operands[0], L), mask, other;
    if (op.operands.size() == 3) {
      mask = get(op.operands[1], L);
      other = get(op.operands[2], L);
    }
    Regs outr;
    for (size_t r = 0; r < ptr.size(); ++r)
      outr.push_back(mask.empty() ? emit(Op::load, ty, {ptr[r]}) : emit(Op::load, ty, {ptr[r], mask[r], other[r]}));
    put(op.results[0], L, outr);
  }

  // Combine an optional owner predicate and an optional mask.
  std::optional<V> and_pred(std::optional<V> a, std::optional<V> b) {
    if (!a) return b;
    if (!b) return a;
    return land(*a, *b);
  }

  void store(const ir::Op& op) {
    ++memory_epoch_;  // load_at_use windows read before this may have changed
    const ir::Type& t = f_.type(op.operands[1]);
    if (t.is_scalar()) {
      std::optional<V> pred = cmp(pir::Pred::eq, tid_, ci32(0));
      if (op.operands.size() == 3) pred = land(*pred, scalar(op.operands[2]));
      emit0(Op::store, {scalar(op.operands[0]), scalar(op.operands[1]), *pred});
      return;
    }
    check_shape(&op, t);
    Layout L = memory_layout(t);
    Regs ptr = get(op.operands[0], L), val = get(op.operands[1], L), mask;
    if (op.operands.size() == 3) mask = get(op.operands[2], L);
    std::optional<V> own = owner(L);
    for (uint32_t r = 0; r < ptr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      std::optional<V> pred = and_pred(own, mask.empty() ? std::nullopt : std::optional<V>(mask[r]));
      if (pred) emit0(Op::store, {ptr[r], val[r], *pred});
      else emit0(Op::store, {ptr[r], val[r]});
    }
  }

  void atomic_add(const ir::Op& op) {
    ++memory_epoch_;  // load_at_use windows read before this may have changed
    const ir::Type& t = f_.type(op.results[0]);
    pir::Ty ty = pir::scalar(t.dtype);
    if (t.is_scalar()) {
      V pred = cmp(pir::Pred::eq, tid_, ci32(0));
      if (op.operands.size() == 3) pred = land(pred, scalar(op.operands[2]));
      V old = emit(Op::atomic_add, ty, {scalar(op.operands[0]), scalar(op.operands[1]), pred});
      // thread 0 holds the previous value; every thread needs it (scalars are uniform)
      reserve_smem(8);
      emit0(Op::store_shared, {ci32(0), old, cmp(pir::Pred::eq, tid_, ci32(0))});
      emit0(Op::barrier, {});
      frames_.back().scalars[op.results[0]] = emit(Op::load_shared, ty, {ci32(0)});
      emit0(Op::barrier, {});
      return;
    }
    check_shape(&op, t);
    const Layout& L = *plan_.natural[op.results[0]];
    Regs ptr = get(op.operands[0], L), val = get(op.operands[1], L), mask;
    if (op.operands.size() == 3) mask = get(op.operands[2], L);
    std::optional<V> own = owner(L);
    Regs old(ptr.size());
    for (uint32_t r = 0; r < ptr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      std::optional<V> pred = and_pred(own, mask.empty() ? std::nullopt : std::optional<V>(mask[r]));
      old[r] = pred ? emit(Op::atomic_add, ty, {ptr[r], val[r], *pred}) : emit(Op::atomic_add, ty, {ptr[r], val[r]});
    }
    if (L.has_replication()) {
      // Only owners performed the add: share the previous values with the replicas.
      int64_t es = ir::byte_size(t.dtype);
      reserve_smem(t.numel() * es);
      for (uint32_t r = 0; r < ptr.size(); ++r) {
        if (duplicate_reg(L, r)) continue;
        V off = bin(Op::mul, tile_offset(L, r), ci32(es));
        if (own) emit0(Op::store_shared, {off, old[r], *own});
        else emit0(Op::store_shared, {off, old[r]});
      }
      emit0(Op::barrier, {});
      for (uint32_t r = 0; r < ptr.size(); ++r) old[r] = emit(Op::load_shared, ty, {bin(Op::mul, tile_offset(L, r), ci32(es))});
      emit0(Op::barrier, {});
    }
    put(op.results[0], L, old);
  }

  // Address and in-bounds predicate of each register of a tensor window.
  void window(const ir::Op& op, size_t first_offset, const Layout& L, Regs& addr, Regs& inb, V* all_ok = nullptr) {
    const TensorDesc& td = tensors_.at(op.operands[0]);
    const auto& dims = op.ints_attr("dims");
    size_t rank = td.sizes.size();
    std::vector<V> off;
    for (size_t d = 0; d < rank; ++d) off.push_back(cast(scalar(op.operands[first_offset + d]), DType::i32));
    // Fixed (non-tile) dims: one uniform check and one address term.
    V base_ok = emit(Op::constant, pir::scalar(DType::i1), {}, 1);
    V base_off = cint(DType::i64, 0);
    for (size_t d = 0; d < rank; ++d) {
      if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end()) continue;
      base_ok = land(base_ok, land(cmp(pir::Pred::ge, off[d], ci32(0)), cmp(pir::Pred::lt, off[d], td.sizes[d])));
      base_off = bin(Op::add, base_off, bin(Op::mul, cast(off[d], DType::i64), td.strides[d]));
    }
    // Per tile dim, the in-bounds test and the address term of each distinct coordinate a
    // register can have, computed once: registers differ by compile-time steps, and a declared
    // unit innermost stride turns the innermost term into a constant (an address immediate).
    bool unit_last = td.spec.contiguous_last;
    std::vector<std::map<int64_t, std::pair<V, V>>> per_dim(dims.size());  // coord const -> (ok, i64 term)
    auto term = [&](size_t i, uint32_t r) -> std::pair<V, V> {
      auto d = static_cast<size_t>(dims[i]);
      int64_t rc = L.reg_coords(r)[i];
      auto it = per_dim[i].find(rc);
      if (it != per_dim[i].end()) return it->second;
      V x = bin(Op::add, off[d], rc == 0 ? thread_coords(L)[i] : bin(Op::add, thread_coords(L)[i], ci32(rc)));
      V ok = land(cmp(pir::Pred::ge, x, ci32(0)), cmp(pir::Pred::lt, x, td.sizes[d]));
      V t = (unit_last && d == rank - 1) ? cast(x, DType::i64) : bin(Op::mul, cast(x, DType::i64), td.strides[d]);
      return per_dim[i][rc] = {ok, t};
    };
    bool add_ok = additive(L);
    pir::Ty pty = pir::pointer(f_.type(op.operands[0]).dtype);
    V thread_ptr = 0;
    std::vector<std::pair<V, V>> base_terms;
    if (add_ok) {
      // one per-thread pointer; each register adds (rc * stride) for its register coordinates
      V o = base_off;
      for (size_t i = 0; i < dims.size(); ++i) o = bin(Op::add, o, term(i, 0).second);
      thread_ptr = emit(Op::gep, pty, {td.ptr, o});
    }
    for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) {
      V ok = base_ok;
      V extra = 0;
      bool has_extra = false;
      for (size_t i = 0; i < dims.size(); ++i) {
        auto [okd, t] = term(i, r);
        ok = land(ok, okd);
        if (!add_ok) continue;
        auto d = static_cast<size_t>(dims[i]);
        int64_t rc = L.reg_coords(r)[i];
        if (rc == 0) continue;
        V step = (unit_last && d == rank - 1) ? cint(DType::i64, rc) : bin(Op::mul, cint(DType::i64, rc), td.strides[d]);
        extra = has_extra ? bin(Op::add, extra, step) : step;
        has_extra = true;
      }
      if (add_ok) {
        addr.push_back(has_extra ? emit(Op::gep, pty, {thread_ptr, extra}) : thread_ptr);
      } else {
        V o = base_off;
        for (size_t i = 0; i < dims.size(); ++i) o = bin(Op::add, o, term(i, r).second);
        addr.push_back(emit(Op::gep, pty, {td.ptr, o}));
      }
      inb.push_back(ok);
    }
    if (all_ok) {
      // every element in bounds = every distinct per-dim test holds (short, unlike a chain over
      // all registers, which also makes LLVM's implied-condition analysis quadratic)
      V all = base_ok;
      for (const auto& terms : per_dim)
        for (const auto& [rc, t] : terms) all = land(all, t.first);
      *all_ok = all;
    }
  }

  // Largest power of two known to divide a scalar integer (alignment of window offsets).
  int64_t divisor(ir::ValueId v) {
    constexpr int64_t kCap = int64_t{1} << 20;
    if (auto it = divisors_.find(v); it != divisors_.end()) return it->second;
    int64_t d = 1;
    if (auto loop = iv_loop_.find(v); loop != iv_loop_.end()) {
      d = std::min(divisor(loop->second->operands[0]), divisor(loop->second->operands[2]));
    } else if (auto it = def_.find(v); it != def_.end()) {
      const ir::Op& op = *it->second;
      auto low_bit = [&](int64_t x) { return x == 0 ? kCap : std::min(kCap, x & -x); };
      switch (op.kind) {
        case OpKind::constant:
          if (auto* i = std::get_if<int64_t>(&op.attrs.at("value"))) d = low_bit(*i < 0 ? -*i : *i);
          break;
        case OpKind::mul: d = std::min(kCap, divisor(op.operands[0]) * divisor(op.operands[1])); break;
        case OpKind::add: case OpKind::sub: case OpKind::minimum: case OpKind::maximum:
          d = std::min(divisor(op.operands[0]), divisor(op.operands[1]));
          break;
        case OpKind::select: d = std::min(divisor(op.operands[1]), divisor(op.operands[2])); break;
        case OpKind::cast:
          if (ir::is_int(f_.type(op.operands[0]).dtype)) d = divisor(op.operands[0]);
          break;
        default: break;
      }
    }
    return divisors_[v] = d;
  }

  // How many consecutive registers of a window can move as one vector access: they must be
  // consecutive along the tensor's unit-stride innermost dim, aligned as the parameter promises.
  int vector_group(const ir::Op& op, size_t first_offset, const Layout& L, DType d) {
    int es = ir::byte_size(d);
    if (es != 2 && es != 4) return 1;
    const TensorDesc& td = tensors_.at(op.operands[0]);
    const auto& dims = op.ints_attr("dims");
    auto rank = static_cast<int64_t>(td.sizes.size());
    if (!td.spec.contiguous_last || dims.back() != rank - 1) return 1;
    int max_bytes = std::min(16, td.spec.align_bytes);
    size_t last = dims.size() - 1;
    int g = 1;
    for (size_t k = 0; k < L.reg.size() && g * es * 2 <= max_bytes; ++k) {
      Coord want(L.shape.size(), 0);
      want[last] = g;
      if (L.reg[k] != want) break;
      g *= 2;
    }
    for (const auto* bs : {&L.lane, &L.warp})
      for (const Coord& c : *bs)
        if (c[last] % g != 0) return 1;
    if (g * es < 4 || divisor(op.operands[first_offset + static_cast<size_t>(rank - 1)]) % g != 0) return 1;
    return g;
  }

  // if (cond) then_body() else else_body(), both yielding registers of the given types.
  Regs pir_if_values(V cond, const std::vector<pir::Ty>& types, const std::function<Regs()>& then_body,
                     const std::function<Regs()>& else_body) {
    pir::Inst in;
    in.op = Op::if_;
    in.args = {cond};
    for (int side = 0; side < 2; ++side) {
      pir::Block pb;
      push_block(&pb);
      frames_.emplace_back();
      Regs ys = side == 0 ? then_body() : else_body();
      pir::Inst y;
      y.op = Op::yield;
      y.args = ys;
      pb.insts.push_back(std::move(y));
      frames_.pop_back();
      pop_block();
      in.regions.push_back(std::move(pb));
    }
    for (const pir::Ty& t : types) in.results.push_back(out_.new_value(t));
    Regs r = in.results;
    blocks_.back()->insts.push_back(std::move(in));
    return r;
  }

  // Registers <-> 32-bit words of one vector group.
  Regs to_words(const Regs& vals, size_t head, int g, DType d) {
    Regs w;
    for (int j = 0; j < g; j += ir::byte_size(d) == 2 ? 2 : 1) {
      size_t r = head + static_cast<size_t>(j);
      if (ir::byte_size(d) == 2) w.push_back(pack(vals[r], vals[r + 1]));
      else w.push_back(emit(Op::bitcast, pir::scalar(DType::u32), {vals[r]}));
    }
    return w;
  }
  Regs from_words(const Regs& words, DType d) {
    Regs v;
    for (V w : words) {
      if (ir::byte_size(d) == 2) {
        Regs two = emit_multi(Op::unpack2, {w}, 2, pir::scalar(d), 0);
        v.insert(v.end(), two.begin(), two.end());
      } else {
        v.push_back(emit(Op::bitcast, pir::scalar(d), {w}));
      }
    }
    return v;
  }

  void block_load(const ir::Op& op) {
    if (plan_.hopper.tiles.count(&op)) return smem_tile_load(op);
    check_shape(&op, f_.type(op.results[0]));
    const Layout& L = *plan_.natural[op.results[0]];
    put(op.results[0], L, block_load_regs(op, L));
    if (op.attrs.count("at_use")) reloadable_[op.results[0]] = {memory_epoch_, frames_.size()};
  }

  // The registers of a block load's window in layout L. Registers that replicate (zero register
  // bases: e.g. a word tile read in the layout of the score block it masks) load once and copy.
  Regs block_load_regs(const ir::Op& op, const Layout& L) {
    if (L.without_zero_regs().reg.size() != L.reg.size()) {
      const Regs compact = block_load_regs(op, L.without_zero_regs());
      Regs out;
      for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) {
        uint32_t c = 0, bit = 0;  // r's bits at the non-zero bases, in order
        for (size_t i = 0; i < L.reg.size(); ++i) {
          if (std::all_of(L.reg[i].begin(), L.reg[i].end(), [](int64_t x) { return x == 0; })) continue;
          c |= ((r >> i) & 1u) << bit++;
        }
        out.push_back(compact[c]);
      }
      return out;
    }
    const ir::Type& t = f_.type(op.results[0]);
    Regs addr, inb;
    V all_ok = 0;
    window(op, 1, L, addr, inb, &all_ok);
    V pad = cfloat(DType::f64, op.float_attr("padding"));
    V other = ir::is_float(t.dtype) ? cast(pad, t.dtype) : cint(t.dtype, static_cast<int64_t>(op.float_attr("padding")));
    pir::Ty ty = pir::scalar(t.dtype);
    auto scalar_path = [&] {
      Regs r;
      for (size_t i = 0; i < addr.size(); ++i) r.push_back(emit(Op::load, ty, {addr[i], inb[i], other}));
      return r;
    };
    int g = vector_group(op, 1, L, t.dtype);
    if (g == 1) return scalar_path();
    // Interior windows take one vector load per group; windows that cross an edge, the scalar path.
    size_t words = static_cast<size_t>(g * ir::byte_size(t.dtype) / 4);
    return pir_if_values(all_ok, std::vector<pir::Ty>(addr.size(), ty), [&] {
      Regs r;
      for (size_t h = 0; h < addr.size(); h += static_cast<size_t>(g)) {
        Regs w = emit_multi(Op::load_vec, {addr[h]}, words, pir::scalar(DType::u32), static_cast<int64_t>(words));
        Regs v = from_words(w, t.dtype);
        r.insert(r.end(), v.begin(), v.end());
      }
      return r;
    }, scalar_path);
  }

  // atomic_add on a window: by TMA from a staging tile in shared memory (jit/wgmma_plan.hpp,
  // TmaReduce) or one atomic add per element.
  void block_atomic_add(const ir::Op& op) {
    ++memory_epoch_;
    const ir::Type& t = f_.type(op.operands[1]);
    check_shape(&op, t);
    Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
    Regs val = get(op.operands[1], L);
    std::optional<V> own = owner(L);
    // ordered (after_semaphore): the add waits until *semaphore >= target
    const bool ordered = op.attrs.count("after_semaphore") != 0;
    V sem = ordered ? scalar(op.operands[op.operands.size() - 2]) : 0, target = ordered ? scalar(op.operands.back()) : 0;
    auto it = plan_.hopper.reduces.find(&op);
    if (it == plan_.hopper.reduces.end()) {
      if (ordered) {  // every thread adds: thread 0 waits, the barrier hands the acquired view on
        pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] { emit0(Op::sem_wait, {sem, target}); });
        emit0(Op::barrier, {});
      }
      Regs addr, inb;
      window(op, 2, L, addr, inb);
      for (uint32_t r = 0; r < addr.size(); ++r) {
        if (duplicate_reg(L, r)) continue;
        emit(Op::atomic_add, pir::scalar(t.dtype), {addr[r], val[r], *and_pred(own, inb[r])});
      }
      return;
    }
    const TmaReduce& red = it->second;
    V is0 = cmp(pir::Pred::eq, tid_, ci32(0));
    // The staging tile is free once the previous reduce has read it (thread 0 issued it), unless a
    // barrier after such a wait was already met in this block (e.g. staging dQ's A operand).
    if (reduce_staging_free_in_ != block_ids_.back()) {
      pir_if(is0, [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
      emit0(Op::barrier, {});
    }
    reduce_staging_free_in_ = -1;
    // f32 element (r, c): 32 a swizzled row, the TMA add reads the chunks of 32 columns
    for (uint32_t r = 0; r < val.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      V off = swizzled_offset(coord(L, r, 0), coord(L, r, 1), 4, red.chunk_bytes());
      store_shared_at(bin(Op::add, off, ci32(plan_.hopper.reduce_staging)), val[r], std::nullopt);
    }
    emit0(Op::fence_proxy_async, {});
    emit0(Op::barrier, {});
    V base = smem_at(plan_.hopper.reduce_staging);
    pir_if(is0, [&] {
      // ordered: only this thread issues the add, so only it waits (no barrier for the others)
      if (ordered) {
        emit0(Op::sem_wait, {sem, target});
        emit0(Op::fence_proxy_async_global, {});  // the TMA add comes after what the signals released
      }
      const size_t rank = tensors_.at(op.operands[0]).sizes.size();
      V map = tensor_map(red.param_index, red.box);
      for (int64_t k = 0; k < red.cols / 32; ++k) {
        std::vector<V> args{bin(Op::add, base, cint(DType::u32, k * red.chunk_bytes())), map};
        for (size_t i = 0; i < rank; ++i) {  // innermost first
          V x = cast(scalar(op.operands[2 + rank - 1 - i]), DType::i32);
          args.push_back(i == 0 && k ? bin(Op::add, x, ci32(32 * k)) : x);
        }
        emit0(Op::tma_reduce_add, args, static_cast<int64_t>(rank));
      }
      emit0(Op::bulk_commit, {});
    });
  }

  void block_store(const ir::Op& op) {
    if (op.attrs.count("reduce")) return block_atomic_add(op);
    ++memory_epoch_;  // load_at_use windows read before this may have changed
    const ir::Type& t = f_.type(op.operands[1]);
    check_shape(&op, t);
    // Store from the value's own layout when it has one: no exchange through shared memory.
    Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
    Regs val = get(op.operands[1], L), addr, inb;
    V all_ok = 0;
    window(op, 2, L, addr, inb, &all_ok);
    std::optional<V> own = owner(L);
    auto scalar_path = [&] {
      for (uint32_t r = 0; r < addr.size(); ++r) {
        if (duplicate_reg(L, r)) continue;
        emit0(Op::store, {addr[r], val[r], *and_pred(own, inb[r])});
      }
      return Regs{};
    };
    int g = vector_group(op, 2, L, t.dtype);
    if (g == 1) {
      scalar_path();
      return;
    }
    pir_if_values(all_ok, {}, [&] {
      auto stores = [&] {
        for (size_t h = 0; h < addr.size(); h += static_cast<size_t>(g)) {
          if (duplicate_reg(L, static_cast<uint32_t>(h))) continue;
          Regs args{addr[h]};
          Regs w = to_words(val, h, g, t.dtype);
          args.insert(args.end(), w.begin(), w.end());
          emit0(Op::store_vec, args);
        }
      };
      if (own) pir_if(*own, stores);
      else stores();
      return Regs{};
    }, scalar_path);
  }

  // ---------------------------------------------------------------- reductions
  V combine(const std::string& kind, V a, V b) {
    if (kind == "sum") return bin(Op::add, a, b);
    if (kind == "max") return bin(Op::maximum, a, b);
    return bin(Op::minimum, a, b);
  }

  void reduce(const ir::Op& op) {
    const ir::Type& in_t = f_.type(op.operands[0]);
    const ir::Type& out_t = f_.type(op.results[0]);
    check_shape(&op, in_t);
    const std::string& kind = op.str_attr("kind");
    int axis = static_cast<int>(op.int_attr("axis"));
    Layout L = plan_.natural[op.operands[0]] ? *plan_.natural[op.operands[0]] : memory_layout(in_t);
    Regs in = get(op.operands[0], L);
    // Narrow floats accumulate in f32 and round once.
    DType acc_t = (in_t.dtype == DType::f16 || in_t.dtype == DType::bf16) ? DType::f32 : in_t.dtype;
    Layout D = L.drop_dim(axis);  // registers kept
    Layout O = D.without_zero_regs();
    std::map<Coord, uint32_t> out_index;
    for (uint32_t r = 0; r < static_cast<uint32_t>(O.num_regs()); ++r) out_index.emplace(O.reg_coords(r), r);
    std::vector<std::optional<V>> acc(static_cast<size_t>(O.num_regs()));
    for (uint32_t r = 0; r < in.size(); ++r) {
      uint32_t o = out_index.at(D.reg_coords(r));
      V x = cast(in[r], acc_t);
      acc[o] = acc[o] ? combine(kind, *acc[o], x) : x;
    }
    Regs part;
    for (auto& a : acc) part.push_back(*a);
    // across lanes
    bool word = ir::bit_width(acc_t) == 32;
    for (size_t i = 0; i < L.lane.size(); ++i) {
      if (L.lane[i][static_cast<size_t>(axis)] == 0) continue;
      if (!word) fail(&op, "cross-lane reductions of 64-bit values are not supported yet");
      for (V& p : part) p = combine(kind, p, emit(Op::shfl_xor, pir::scalar(acc_t), {p}, int64_t{1} << i));
    }
    // across warps, through shared memory in a fixed order (deterministic)
    int64_t axis_warps = 0;
    for (size_t i = 0; i < L.warp.size(); ++i)
      if (L.warp[i][static_cast<size_t>(axis)] != 0) axis_warps |= int64_t{1} << i;
    if (axis_warps) {
      int64_t onumel = 1;
      for (int64_t d : O.shape) onumel *= d;
      int64_t es = ir::byte_size(acc_t);
      reserve_smem(warps_ * onumel * es);
      for (uint32_t r = 0; r < part.size(); ++r) {
        V off = bin(Op::mul, bin(Op::add, bin(Op::mul, warp_, ci32(onumel)), O.shape.empty() ? ci32(0) : tile_offset(O, r)), ci32(es));
        emit0(Op::store_shared, {off, part[r]});
      }
      emit0(Op::barrier, {});
      V base_w = land(warp_, ci32(~axis_warps));
      std::vector<int64_t> combos{0};
      for (int64_t bit = 1; bit <= axis_warps; bit <<= 1)
        if (axis_warps & bit) {
          size_t n = combos.size();
          for (size_t j = 0; j < n; ++j) combos.push_back(combos[j] | bit);
        }
      std::sort(combos.begin(), combos.end());
      for (uint32_t r = 0; r < part.size(); ++r) {
        V elem = O.shape.empty() ? ci32(0) : tile_offset(O, r);
        std::optional<V> total;
        for (int64_t c : combos) {
          V w = bin(Op::bit_or, base_w, ci32(c));
          V off = bin(Op::mul, bin(Op::add, bin(Op::mul, w, ci32(onumel)), elem), ci32(es));
          V x = emit(Op::load_shared, pir::scalar(acc_t), {off});
          total = total ? combine(kind, *total, x) : x;
        }
        part[r] = *total;
      }
      emit0(Op::barrier, {});
    }
    for (V& p : part) p = cast(p, out_t.dtype);
    if (out_t.is_scalar()) frames_.back().scalars[op.results[0]] = part[0];
    else put(op.results[0], *plan_.natural[op.results[0]], part);
  }

  // ---------------------------------------------------------------- dot
  void dot(const ir::Op& op) {
    const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]), &C = f_.type(op.results[0]);
    for (const ir::Type* t : {&A, &B, &C}) check_shape(&op, *t);
    if (auto it = plan_.hopper.dots.find(&op); it != plan_.hopper.dots.end()) return wgmma_dot(op, it->second);
    DotPlan dp = plan_dot(A, B, warps_);
    const Layout& LC = *plan_.natural[op.results[0]];
    if (dp.mma) return mma(op, dp, LC);
    fma_dot(op, LC);
  }

  // (the two halves of one unpacked word, in order: that word)
  V pack(V lo, V hi) {
    auto l = unpacked_.find(lo), h = unpacked_.find(hi);
    if (l != unpacked_.end() && h != unpacked_.end() && l->second.first == h->second.first && l->second.second == 0 && h->second.second == 1)
      return l->second.first;
    return emit(Op::pack2, pir::scalar(DType::u32), {lo, hi});
  }

  void mma(const ir::Op& op, const DotPlan& dp, const Layout& LC) {
    const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]);
    int64_t M = A.shape[0], K = A.shape[1], N = B.shape[1];
    Layout LA = Layout::mma_a(M, K, dp.warps_m, dp.warps_n), LB = Layout::mma_b(K, N, dp.warps_m, dp.warps_n);
    Regs a = get(op.operands[0], LA), b = get(op.operands[1], LB), c = get(op.operands[2], LC);
    int64_t m_reps = M / dp.warps_m / 16, n_reps = N / dp.warps_n / 8, k_steps = K / 16;
    for (int64_t mi = 0; mi < m_reps; ++mi)
      for (int64_t ni = 0; ni < n_reps; ++ni) {
        size_t cb = static_cast<size_t>(4 * (ni + n_reps * mi));
        for (int64_t ki = 0; ki < k_steps; ++ki) {
          size_t ab = static_cast<size_t>(8 * (ki + k_steps * mi)), bb = static_cast<size_t>(4 * (ki + k_steps * ni));
          std::vector<V> args{pack(a[ab], a[ab + 1]), pack(a[ab + 2], a[ab + 3]), pack(a[ab + 4], a[ab + 5]),
                              pack(a[ab + 6], a[ab + 7]), pack(b[bb], b[bb + 1]), pack(b[bb + 2], b[bb + 3]),
                              c[cb], c[cb + 1], c[cb + 2], c[cb + 3]};
          pir::Inst in;
          in.op = Op::mma_16816;
          in.args = args;
          in.imm = static_cast<int64_t>(A.dtype);
          for (int j = 0; j < 4; ++j) in.results.push_back(out_.new_value(pir::scalar(DType::f32)));
          for (int j = 0; j < 4; ++j) c[cb + static_cast<size_t>(j)] = in.results[static_cast<size_t>(j)];
          blocks_.back()->insts.push_back(std::move(in));
        }
      }
    put(op.results[0], LC, c);
  }

  // CUDA-core fallback: operands in shared memory, each thread accumulates its outputs over K.
  void fma_dot(const ir::Op& op, const Layout& LC) {
    const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]), &C = f_.type(op.results[0]);
    int64_t M = A.shape[0], K = A.shape[1], N = B.shape[1];
    Layout LA = memory_layout(A), LB = memory_layout(B);
    Regs a = get(op.operands[0], LA), b = get(op.operands[1], LB), c = get(op.operands[2], LC);
    int64_t es = ir::byte_size(A.dtype);
    int64_t b_base = M * K * es;
    reserve_smem(b_base + K * N * es);
    for (uint32_t r = 0; r < a.size(); ++r)
      if (!duplicate_reg(LA, r)) emit0(Op::store_shared, {bin(Op::mul, tile_offset(LA, r), ci32(es)), a[r]});
    for (uint32_t r = 0; r < b.size(); ++r)
      if (!duplicate_reg(LB, r))
        emit0(Op::store_shared, {bin(Op::add, bin(Op::mul, tile_offset(LB, r), ci32(es)), ci32(b_base)), b[r]});
    emit0(Op::barrier, {});
    // for k in [0, K): acc[r] += A[m_r, k] * B[k, n_r]
    pir::Inst loop;
    loop.op = Op::for_;
    loop.args = {ci32(0), ci32(K), ci32(1)};
    for (V x : c) loop.args.push_back(x);
    pir::Block body;
    V k = out_.new_value(pir::scalar(DType::i32));
    body.args.push_back(k);
    for (size_t i = 0; i < c.size(); ++i) body.args.push_back(out_.new_value(pir::scalar(C.dtype)));
    push_block(&body);
    frames_.emplace_back();
    pir::Inst y;
    y.op = Op::yield;
    for (uint32_t r = 0; r < c.size(); ++r) {
      V m = coord(LC, r, 0), n = coord(LC, r, 1);
      V ao = bin(Op::mul, bin(Op::add, bin(Op::mul, m, ci32(K)), k), ci32(es));
      V bo = bin(Op::add, bin(Op::mul, bin(Op::add, bin(Op::mul, k, ci32(N)), n), ci32(es)), ci32(b_base));
      V av = cast(emit(Op::load_shared, pir::scalar(A.dtype), {ao}), C.dtype);
      V bv = cast(emit(Op::load_shared, pir::scalar(B.dtype), {bo}), C.dtype);
      y.args.push_back(bin(Op::add, body.args[r + 1], bin(Op::mul, av, bv)));
    }
    body.insts.push_back(std::move(y));
    frames_.pop_back();
    pop_block();
    for (size_t i = 0; i < c.size(); ++i) loop.results.push_back(out_.new_value(pir::scalar(C.dtype)));
    loop.regions.push_back(std::move(body));
    Regs res = loop.results;
    blocks_.back()->insts.push_back(std::move(loop));
    emit0(Op::barrier, {});
    put(op.results[0], LC, res);
  }

  // ---------------------------------------------------------------- control flow
  // Flatten a carried value to registers (scalars: one register).
  Regs carried(ir::ValueId v, const std::optional<Layout>& L) { return L ? get(v, *L) : Regs{scalar(v)}; }
  Regs fresh(ir::ValueId v, const std::optional<Layout>& L) {
    size_t n = L ? static_cast<size_t>(L->num_regs()) : 1;
    Regs r;
    for (size_t i = 0; i < n; ++i) r.push_back(out_.new_value(value_ty(f_.type(v))));
    return r;
  }
  void bind(ir::ValueId v, const std::optional<Layout>& L, const Regs& regs) {
    if (L) put(v, *L, regs);
    else frames_.back().scalars[v] = regs.at(0);
  }

  void for_loop(const ir::Op& op) {
    ++memory_epoch_;  // load_at_use windows read before this may have changed
    if (auto it = plan_.tma_loops.find(&op); it != plan_.tma_loops.end()) return tma_loop(op, it->second);
    const ir::Block& body = op.regions[0];
    pir::Inst loop;
    loop.op = Op::for_;
    loop.args = {scalar(op.operands[0]), scalar(op.operands[1]), scalar(op.operands[2])};
    std::vector<std::optional<Layout>> lay;
    for (size_t i = 0; i < op.results.size(); ++i) {
      lay.push_back(plan_.natural[op.results[i]]);
      for (V x : carried(op.operands[3 + i], lay.back())) loop.args.push_back(x);
    }
    const SmemRing* ring = nullptr;
    if (auto it = plan_.hopper.rings.find(&op); it != plan_.hopper.rings.end()) ring = &it->second;
    if (ring) ring_prologue(op, *ring);
    pir::Block pb;
    V iv = out_.new_value(pir::scalar(f_.type(body.args[0]).dtype));
    pb.args.push_back(iv);
    std::vector<Regs> arg_regs;
    for (size_t i = 0; i < op.results.size(); ++i) {
      arg_regs.push_back(fresh(body.args[i + 1], lay[i]));
      for (V x : arg_regs.back()) pb.args.push_back(x);
    }
    push_block(&pb);
    frames_.emplace_back();
    frames_.back().loop_body = true;
    frames_.back().body = &body;
    frames_.back().scalars[body.args[0]] = iv;
    for (size_t i = 0; i < op.results.size(); ++i) bind(body.args[i + 1], lay[i], arg_regs[i]);
    if (ring) ring_top(op, *ring, iv);
    block(body);
    if (ring) ring_bottom(*ring);
    if (!frames_.back().keep_alive.empty()) emit0(Op::keep_alive, frames_.back().keep_alive);
    pir::Inst y;
    y.op = Op::yield;
    const ir::Op& iy = body.ops.back();
    for (size_t i = 0; i < op.results.size(); ++i) {
      Regs r = carried(iy.operands[i], lay[i]);
      // A carried MMA result still in flight at the loop's end and double-buffered (the body
      // reads the carried value after issuing the MMA that makes the next one: PIPELINE_QK's S)
      // was just waited for. Its copy into the carried register must come after that wait: as
      // copies of their own (pir::kOpaqueCopy), not as the wait's tied operands, which LLVM copies
      // before the wait, where ptxas sees a read of an in-flight accumulator (C7514).
      if (std::any_of(r.begin(), r.end(), [&](V x) { return wait_outputs_.count(x) > 0; }) &&
          read_after_def(body, body.args[i + 1], iy.operands[i]))
        r = emit_multi(Op::opaque, r, r.size(), pir::scalar(f_.type(iy.operands[i]).dtype), pir::kOpaqueCopy);
      for (V x : r) y.args.push_back(x);
    }
    pb.insts.push_back(std::move(y));
    frames_.pop_back();
    pop_block();
    std::vector<Regs> res;
    for (size_t i = 0; i < op.results.size(); ++i) {
      res.push_back(fresh(op.results[i], lay[i]));
      for (V x : res.back()) loop.results.push_back(x);
    }
    loop.regions.push_back(std::move(pb));
    blocks_.back()->insts.push_back(std::move(loop));
    if (ring && ring->rerun) reset_ring(*ring);
    for (size_t i = 0; i < op.results.size(); ++i) bind(op.results[i], lay[i], res[i]);
  }

  // Whether an op of `body` after the one defining `v` (at the body's top level) reads `x`.
  static bool read_after_def(const ir::Block& body, ir::ValueId x, ir::ValueId v) {
    bool after = false, reads = false;
    for (const ir::Op& op : body.ops) {
      if (after) {
        const auto check = [&](const ir::Op& inner) {
          reads |= std::find(inner.operands.begin(), inner.operands.end(), x) != inner.operands.end();
        };
        check(op);
        for (const ir::Block& region : op.regions) ir::walk(region, check);
      }
      after |= std::find(op.results.begin(), op.results.end(), v) != op.results.end();
    }
    return reads;
  }

  void if_op(const ir::Op& op) {
    ++memory_epoch_;  // load_at_use windows read before this may have changed
    pir::Inst in;
    in.op = Op::if_;
    in.args = {scalar(op.operands[0])};
    std::vector<std::optional<Layout>> lay;
    for (ir::ValueId r : op.results) lay.push_back(plan_.natural[r]);
    for (int side = 0; side < 2; ++side) {
      const ir::Block& region = op.regions[static_cast<size_t>(side)];
      pir::Block pb;
      push_block(&pb);
      frames_.emplace_back();
      block(region);
      pir::Inst y;
      y.op = Op::yield;
      for (size_t i = 0; i < op.results.size(); ++i)
        for (V x : carried(region.ops.back().operands[i], lay[i])) y.args.push_back(x);
      pb.insts.push_back(std::move(y));
      frames_.pop_back();
      pop_block();
      in.regions.push_back(std::move(pb));
    }
    std::vector<Regs> res;
    for (size_t i = 0; i < op.results.size(); ++i) {
      res.push_back(fresh(op.results[i], lay[i]));
      for (V x : res.back()) in.results.push_back(x);
    }
    blocks_.back()->insts.push_back(std::move(in));
    for (size_t i = 0; i < op.results.size(); ++i) bind(op.results[i], lay[i], res[i]);
  }

  // ---------------------------------------------------------------- Hopper TMA + wgmma pipeline
  // One tensor map per (tensor parameter, box): trailing ABI parameters the launcher fills.
  void tensor_map_params() {
    for (const ir::Op* op : plan_.hopper.tile_order) {
      const SmemTile& t = plan_.hopper.tiles.at(op);
      tensor_map(t.param_index, t.box);
    }
    for (const auto& [loop, m] : plan_.tma_loops) {
      tensor_map(param_index(m.load_a->operands[0]), gemm_box(m, false));
      tensor_map(param_index(m.load_b->operands[0]), gemm_box(m, true));
    }
  }
  // The GEMM pipeline's boxes: K-major tiles are one box of 64 K-elements per row; an MN-major B
  // is loaded in 64-column chunks (a 128-byte swizzled row holds 64 elements), each BK rows tall.
  static std::vector<int64_t> gemm_box(const TmaDotLoop& m, bool b) {
    if (b && m.b_mn_major) return {64, m.bk};
    return {m.bk, b ? m.bn : m.bm};
  }
  int param_index(ir::ValueId tensor) const {
    int index = 0;
    while (f_.params[static_cast<size_t>(index)].value != tensor) ++index;
    return index;
  }
  // One tensor map per (tensor parameter, box): a trailing ABI parameter the launcher fills
  // (named <param>_tensor_map, then <param>_tensor_map1, ... for further boxes of that parameter).
  V tensor_map(int param, const std::vector<int64_t>& box) {
    auto key = std::make_pair(param, box);
    if (auto it = tensor_maps_.find(key); it != tensor_maps_.end()) return it->second;
    pir::TensorMapSpec spec;
    spec.abi_slot = static_cast<int>(out_.params.size());
    spec.param_index = param;
    spec.box = box;
    out_.tensor_maps.push_back(spec);
    int earlier = 0;
    for (const auto& [k, v] : tensor_maps_) earlier += k.first == param ? 1 : 0;
    const std::string& name = f_.params[static_cast<size_t>(param)].name;
    pir::Ty ty = pir::pointer(DType::u8);
    out_.params.push_back({earlier ? fmt::format("{}_tensor_map{}", name, earlier) : name + "_tensor_map", ty});
    return tensor_maps_[key] = emit(Op::param, ty, {}, spec.abi_slot);
  }
  // ceil((ub - lb) / step), 0 when ub <= lb (i32)
  V trip_count(V lb, V ub, V step) {
    V span = bin(Op::sub, ub, lb);
    return emit(Op::select, pir::scalar(DType::i32),
                {cmp(pir::Pred::gt, span, ci32(0)), bin(Op::div, bin(Op::sub, bin(Op::add, span, step), ci32(1)), step), ci32(0)});
  }

  // Structured helpers for code the pipeline emits directly: an if without results.
  void pir_if(V cond, const std::function<void()>& then_body) {
    pir_if_values(cond, {}, [&] {
      then_body();
      return Regs{};
    }, [] { return Regs{}; });
  }
  Regs emit_multi(Op op, std::vector<V> args, size_t n, pir::Ty ty, int64_t imm) {
    pir::Inst in;
    in.op = op;
    in.args = std::move(args);
    in.imm = imm;
    for (size_t i = 0; i < n; ++i) in.results.push_back(out_.new_value(ty));
    Regs r = in.results;
    blocks_.back()->insts.push_back(std::move(in));
    return r;
  }

  // The K loop's side work (TmaDotLoop::side_ops), lowered where iteration `i`'s wgmmas run: the
  // loop counter bound to its K offset, and any shared memory it needs (layout exchanges) placed
  // past the pipeline's stages and barriers (`ring_bytes`).
  void side_work(const ir::Op& op, const TmaDotLoop& m, V i, int64_t ring_bytes) {
    if (m.side_ops.empty()) return;
    const ir::Block& body = op.regions[0];
    const DType t = f_.type(body.args[0]).dtype;
    frames_.back().scalars[body.args[0]] =
        bin(Op::add, scalar(op.operands[0]), bin(Op::mul, cast(i, t), scalar(op.operands[2])));
    const int64_t outer_scratch = scratch_base_;
    scratch_base_ += ring_bytes;
    for (const ir::Op* side : m.side_ops) lower(*side);
    scratch_base_ = outer_scratch;
  }

  // A wgmma shared-memory matrix descriptor with 128-byte swizzle: 8-row groups 1024 B apart (the
  // stride byte offset). The leading byte offset matters only for MN-major operands: the distance
  // between 64-element column chunks.
  V descriptor(V addr, int64_t leading_bytes = 16) {
    const uint64_t fixed = (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
    V a = bin(Op::bit_and, bin(Op::shr, cast(addr, DType::u64), cint(DType::u64, 4)), cint(DType::u64, 0x3FFF));
    return bin(Op::bit_or, a, cint(DType::u64, static_cast<int64_t>(fixed)));
  }

  void tma_loop(const ir::Op& op, const TmaDotLoop& m) {
    const int S = m.stages, W = warps_, WG = W / 4;
    const ir::Type& at = f_.type(m.load_a->results[0]);
    const int64_t a_bytes = m.bm * m.bk * 2, b_bytes = m.bn * m.bk * 2, stage = a_bytes + b_bytes;
    const int64_t bar0 = S * stage;
    reserve_smem(bar0 + 16 * S);
    auto i32 = [&](ir::ValueId v) { return cast(scalar(v), DType::i32); };
    V lb = i32(op.operands[0]), ub = i32(op.operands[1]), step = i32(op.operands[2]);
    V nk = trip_count(lb, ub, step);
    V m_off = i32(m.load_a->operands[1]), n_off = i32(m.load_b->operands[m.b_mn_major ? 2 : 1]);
    V map_a = tensor_map(param_index(m.load_a->operands[0]), gemm_box(m, false));
    V map_b = tensor_map(param_index(m.load_b->operands[0]), gemm_box(m, true));
    V is0 = cmp(pir::Pred::eq, tid_, ci32(0));
    V base = emit(Op::smem_addr, pir::scalar(DType::u32), {ci32(0)});
    auto addr = [&](V byte_off) { return bin(Op::add, base, cast(byte_off, DType::u32)); };
    auto full = [&](V s) { return addr(bin(Op::add, ci32(bar0), bin(Op::mul, s, ci32(8)))); };
    auto empty = [&](V s) { return addr(bin(Op::add, ci32(bar0 + 8 * S), bin(Op::mul, s, ci32(8)))); };
    auto issue = [&](V j, V s) {
      V k = bin(Op::add, lb, bin(Op::mul, j, step));
      V stage_off = bin(Op::mul, s, ci32(stage));
      emit0(Op::mbar_expect_tx, {full(s), ci32(a_bytes + b_bytes)});
      emit0(Op::tma_load_2d, {addr(stage_off), map_a, k, m_off, full(s)});
      V b_off = bin(Op::add, stage_off, ci32(a_bytes));
      if (!m.b_mn_major) {
        emit0(Op::tma_load_2d, {addr(b_off), map_b, k, n_off, full(s)});
      } else {
        for (int64_t c = 0; c < m.bn / 64; ++c)  // chunk c: columns n + 64c.., BK rows, at b_off + c*64*BK*2
          emit0(Op::tma_load_2d, {addr(bin(Op::add, b_off, ci32(c * 64 * m.bk * 2))), map_b,
                                  bin(Op::add, n_off, ci32(64 * c)), k, full(s)});
      }
    };
    pir_if(is0, [&] {
      for (int s = 0; s < S; ++s) {
        emit0(Op::mbar_init, {full(ci32(s)), ci32(1)});
        emit0(Op::mbar_init, {empty(ci32(s)), ci32(W)});
      }
      emit0(Op::fence_mbar_init, {});
    });
    emit0(Op::barrier, {});
    pir_if(is0, [&] {
      for (int j = 0; j < S; ++j) pir_if(cmp(pir::Pred::lt, ci32(j), nk), [&] { issue(ci32(j), ci32(j)); });
    });

    const Layout& LC = *plan_.natural[m.dot->results[0]];
    Regs acc0 = get(op.operands[3], LC);
    // The loop and its final wait only where it runs (nk > 0): when the path that skips it
    // reached the wait too, LLVM could materialise the initial accumulators there in the wgmmas'
    // own registers, which ptxas counts as non-wgmma code inside the pipeline stage and then
    // serialises every wgmma (C7514/C7515, seen once the loop had side work).
    const std::vector<pir::Ty> acc_types(acc0.size(), pir::scalar(DType::f32));
    Regs res = pir_if_values(cmp(pir::Pred::gt, nk, ci32(0)), acc_types, [&]() -> Regs {
      const int64_t per = m.bn / 2;  // accumulator registers per wgmma
      const int64_t reps = m.bm / (64 * WG);
      pir::Inst loop;
      loop.op = Op::for_;
      loop.args = {ci32(0), nk, ci32(1)};
      for (V x : acc0) loop.args.push_back(x);
      pir::Block body;
      V i = out_.new_value(pir::scalar(DType::i32));
      body.args.push_back(i);
      Regs acc;
      for (size_t r = 0; r < acc0.size(); ++r) acc.push_back(out_.new_value(pir::scalar(DType::f32)));
      body.args.insert(body.args.end(), acc.begin(), acc.end());
      push_block(&body);
      frames_.emplace_back();
      {
        V s = bin(Op::rem, i, ci32(S));
        V parity = bin(Op::bit_and, bin(Op::div, i, ci32(S)), ci32(1));
        emit0(Op::mbar_wait, {full(s), parity});
        emit0(Op::wgmma_fence, {});
        V stage_off = bin(Op::mul, s, ci32(stage));
        V wg = bin(Op::shr, warp_, ci32(2));
        // K-major B advances 32 bytes (16 elements) per k16 step inside its swizzled rows; MN-major
        // B advances 16 rows of 128 bytes.
        V desc_b = m.b_mn_major ? descriptor(addr(bin(Op::add, stage_off, ci32(a_bytes))), 64 * m.bk * 2)
                                : descriptor(addr(bin(Op::add, stage_off, ci32(a_bytes))));
        const int64_t b_step = m.b_mn_major ? 16 * 128 / 16 : 2;  // in descriptor units (16 bytes)
        int64_t imm = m.bn | (static_cast<int64_t>(at.dtype) << 16) | (int64_t{m.b_mn_major} << 24);
        for (int64_t r = 0; r < reps; ++r) {
          V row0 = bin(Op::add, bin(Op::mul, wg, ci32(64)), ci32(r * 64 * WG));
          V desc_a = descriptor(addr(bin(Op::add, stage_off, bin(Op::mul, row0, ci32(m.bk * 2)))));
          for (int64_t kk = 0; kk < m.bk / 16; ++kk) {
            std::vector<V> args{bin(Op::add, desc_a, cint(DType::u64, 2 * kk)), bin(Op::add, desc_b, cint(DType::u64, b_step * kk))};
            for (int64_t j = 0; j < per; ++j) args.push_back(acc[static_cast<size_t>(r * per + j)]);
            Regs out = emit_multi(Op::wgmma, args, static_cast<size_t>(per), pir::scalar(DType::f32), imm);
            for (int64_t j = 0; j < per; ++j) acc[static_cast<size_t>(r * per + j)] = out[static_cast<size_t>(j)];
          }
        }
        emit0(Op::wgmma_commit, {});
        // Only the next iteration's wgmma (ordered after this asm) reads the accumulators inside the
        // loop, so this wait needs no register ties; the one after the loop has them. With side
        // work, two groups stay in flight (the tensor cores queue this step's and the last one's
        // while the side work runs, instead of idling once this step's are done).
        const int inflight = m.side_ops.empty() || S < 3 ? 1 : 2;
        emit_multi(Op::wgmma_wait, {}, 0, pir::scalar(DType::f32), inflight);
        // The stage read by iteration i-inflight is free: release it and refill it with that
        // iteration + S.
        pir_if(cmp(pir::Pred::ge, i, ci32(inflight)), [&] {
          V prev = bin(Op::sub, i, ci32(inflight));
          V ps = bin(Op::rem, prev, ci32(S));
          pir_if(cmp(pir::Pred::eq, lane_, ci32(0)), [&] { emit0(Op::mbar_arrive, {empty(ps)}); });
          V j = bin(Op::add, prev, ci32(S));
          pir_if(land(is0, cmp(pir::Pred::lt, j, nk)), [&] {
            V use = bin(Op::sub, bin(Op::div, j, ci32(S)), ci32(1));
            emit0(Op::mbar_wait, {empty(ps), bin(Op::bit_and, use, ci32(1))});
            issue(j, ps);
          });
        });
        side_work(op, m, i, bar0 + 16 * S);
        pir::Inst y;
        y.op = Op::yield;
        y.args = acc;
        body.insts.push_back(std::move(y));
      }
      frames_.pop_back();
      pop_block();
      Regs out;
      for (size_t r = 0; r < acc0.size(); ++r) out.push_back(out_.new_value(pir::scalar(DType::f32)));
      loop.results = out;
      loop.regions.push_back(std::move(body));
      blocks_.back()->insts.push_back(std::move(loop));
      return emit_multi(Op::wgmma_wait, out, out.size(), pir::scalar(DType::f32), 0);
    }, [&] { return acc0; });
    emit0(Op::barrier, {});  // no warp reuses the stages while another still reads them
    put(op.results[0], LC, res);
  }

  // ---------------------------------------------------------------- wgmma with shared-memory tiles
  // (jit/wgmma_plan.hpp: tiles copied by TMA once or through a ring of stages ahead of a loop)
  V smem_at(int64_t offset) { return emit(Op::smem_addr, pir::scalar(DType::u32), {ci32(offset)}); }

  void hopper_init() {
    const HopperPlan& h = plan_.hopper;
    scratch_base_ = h.persistent_bytes;
    smem_bytes_ = std::max(smem_bytes_, h.persistent_bytes);
    if (h.tiles.empty()) return;
    pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
      for (const ir::Op* op : h.tile_order)
        if (const SmemTile& t = h.tiles.at(op); !t.ring) emit0(Op::mbar_init, {smem_at(t.barrier), ci32(1)});
      for (const ir::Op* loop : h.ring_order) init_ring_barriers(h.rings.at(loop));
      emit0(Op::fence_mbar_init, {});
    });
    emit0(Op::barrier, {});
  }
  void init_ring_barriers(const SmemRing& r, bool counters = true) {
    for (int s = 0; s < r.stages; ++s) {
      emit0(Op::mbar_init, {smem_at(r.full + 8 * s), ci32(1)});
      if (counters) emit(Op::atom_shared, pir::scalar(DType::u32), {smem_at(r.released + 8 * s), cint(DType::u32, 0)}, 1);
    }
  }
  // After a run of a ring loop that may run again: every copy has landed and every warp is past
  // the loop, so the barriers are reset to phase 0 for the next run.
  void reset_ring(const SmemRing& r) {
    emit0(Op::barrier, {});
    pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
      for (int s = 0; s < r.stages; ++s) emit0(Op::mbar_inval, {smem_at(r.full + 8 * s)});
      init_ring_barriers(r, /*counters=*/false);  // each run leaves them at a multiple of the warp count
      emit0(Op::fence_mbar_init, {});
    });
    emit0(Op::barrier, {});
  }

  // The TMA copies of one tile into shared memory at `dst` (u32 address), completing on `bar`:
  // one box per 64-column chunk. `row_offset` replaces the loop counter's offset (rings).
  void issue_tile(const SmemTile& t, V dst, V bar, const ir::Op* loop = nullptr, V counter_value = 0) {
    const ir::Op& load = *t.load;
    const size_t rank = load.operands.size() - 1;
    // Offsets computed in the loop body are evaluated again with the counter of the prefetched
    // iteration (the planner collected their scalar ops).
    std::map<ir::ValueId, V> at_counter;
    if (loop) {
      at_counter[loop->regions[0].args[0]] = counter_value;
      for (const ir::Op* op : t.offset_ops) {
        std::vector<V> a;
        const bool of_tensor = op->kind == OpKind::tensor_ptr || op->kind == OpKind::tensor_dim || op->kind == OpKind::tensor_stride;
        if (!of_tensor)
          for (ir::ValueId o : op->operands) a.push_back(at_counter.count(o) ? at_counter.at(o) : scalar(o));
        V r = 0;
        auto tensor = [&] { return tensors_.at(op->operands[0]); };
        const auto dim = [&] { return static_cast<size_t>(op->int_attr("dim")); };
        if (op->kind == OpKind::constant) r = constant_value(f_.type(op->results[0]).dtype, op->attrs.at("value"));
        else if (op->kind == OpKind::load) r = emit(Op::load, pir::scalar(f_.type(op->results[0]).dtype), a);
        else if (op->kind == OpKind::tensor_ptr) r = tensor().ptr;
        else if (op->kind == OpKind::tensor_dim) r = tensor().sizes.at(dim());
        else if (op->kind == OpKind::tensor_stride) r = tensor().strides.at(dim());
        else r = scalar_op(*op, a);
        at_counter[op->results[0]] = r;
      }
    }
    std::vector<V> off;
    for (size_t d = 0; d < rank; ++d) {
      ir::ValueId v = load.operands[1 + d];
      off.push_back(cast(at_counter.count(v) ? at_counter.at(v) : scalar(v), DType::i32));
    }
    V map = tensor_map(t.param_index, t.box);
    for (int64_t c = 0; c < t.cols / 64; ++c) {
      std::vector<V> args{bin(Op::add, dst, cint(DType::u32, c * t.chunk_bytes())), map};
      for (size_t i = 0; i < rank; ++i) {  // innermost first
        V x = off[rank - 1 - i];
        args.push_back(i == 0 && c ? bin(Op::add, x, ci32(64 * c)) : x);
      }
      args.push_back(bar);
      emit0(Op::tma_load, args, static_cast<int64_t>(rank));
    }
  }

  void smem_tile_load(const ir::Op& op) {
    const SmemTile& t = plan_.hopper.tiles.at(&op);
    if (t.ring) return;  // the ring of its loop copies it
    pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
      V bar = smem_at(t.barrier);
      emit0(Op::mbar_expect_tx, {bar, ci32(t.bytes())});
      issue_tile(t, smem_at(t.offset), bar);
    });
  }

  struct RingState {
    V lb, step, trips;
    V iter = 0, stage = 0;  // inside the body: the iteration (from 0) and its stage
  };

  V ring_stage_addr(const SmemRing& r, V stage, int64_t offset) {
    return bin(Op::add, smem_at(r.base + offset), cast(bin(Op::mul, stage, ci32(r.stage_bytes)), DType::u32));
  }

  // Thread 0 fills stage `s` with iteration j's tiles.
  void ring_issue(const ir::Op& loop, const SmemRing& r, const RingState& st, V j, V s) {
    int64_t bytes = 0;
    for (const ir::Op* l : r.loads) bytes += plan_.hopper.tiles.at(l).bytes();
    V full = bin(Op::add, smem_at(r.full), cast(bin(Op::mul, s, ci32(8)), DType::u32));
    emit0(Op::mbar_expect_tx, {full, ci32(bytes)});
    V counter = bin(Op::add, st.lb, bin(Op::mul, j, st.step));
    for (const ir::Op* l : r.loads) {
      const SmemTile& t = plan_.hopper.tiles.at(l);
      issue_tile(t, ring_stage_addr(r, s, t.offset), full, &loop, counter);
    }
  }

  void ring_prologue(const ir::Op& loop, const SmemRing& r) {
    RingState st;
    st.lb = cast(scalar(loop.operands[0]), DType::i32);
    st.step = cast(scalar(loop.operands[2]), DType::i32);
    st.trips = trip_count(st.lb, cast(scalar(loop.operands[1]), DType::i32), st.step);
    pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] {
      for (int j = 0; j < r.stages; ++j)
        pir_if(cmp(pir::Pred::lt, ci32(j), st.trips), [&] { ring_issue(loop, r, st, ci32(j), ci32(j)); });
    });
    rings_[&loop] = st;
  }

  // Top of iteration i: wait for its tiles.
  void ring_top(const ir::Op& loop, const SmemRing& r, V iv) {
    RingState& st = rings_.at(&loop);
    const int S = r.stages;
    st.iter = bin(Op::div, bin(Op::sub, cast(iv, DType::i32), st.lb), st.step);
    st.stage = bin(Op::rem, st.iter, ci32(S));
    V full = bin(Op::add, smem_at(r.full), cast(bin(Op::mul, st.stage, ci32(8)), DType::u32));
    emit0(Op::mbar_wait, {full, bin(Op::bit_and, bin(Op::div, st.iter, ci32(S)), ci32(1))});
  }

  // End of iteration i: every wgmma that read the stage has completed (each dot waits for its own
  // group). Lane 0 of each warp counts the warp out; the last warp refills the stage with
  // iteration i + S. Nobody waits for another warp, so warpgroups drift apart freely (one's
  // softmax overlaps the other's MMAs) within the ring's S iterations.
  void ring_bottom(const SmemRing& r) {
    const RingState& st = rings_.at(r.loop);
    const int W = warps_;
    V counter = bin(Op::add, smem_at(r.released), cast(bin(Op::mul, st.stage, ci32(8)), DType::u32));
    pir_if(cmp(pir::Pred::eq, lane_, ci32(0)), [&] {
      V old = emit(Op::atom_shared, pir::scalar(DType::u32), {counter, cint(DType::u32, 1)}, 0);
      V last = cmp(pir::Pred::eq, bin(Op::rem, old, cint(DType::u32, W)), cint(DType::u32, W - 1));
      V j = bin(Op::add, st.iter, ci32(r.stages));
      pir_if(land(last, cmp(pir::Pred::lt, j, st.trips)), [&] { ring_issue(*r.loop, r, st, j, st.stage); });
    });
  }

  // The u32 shared address of a tile in the current iteration (ring) or its fixed place (once);
  // waits for a once-loaded tile's copy to land.
  V tile_addr(const SmemTile& t) {
    if (!t.ring) {
      emit0(Op::mbar_wait, {smem_at(t.barrier), ci32(0)});
      return smem_at(t.offset);
    }
    const SmemRing& r = plan_.hopper.rings.at(t.ring);
    return ring_stage_addr(r, rings_.at(t.ring).stage, t.offset);
  }

  void wgmma_dot(const ir::Op& op, const WgmmaDot& w) {
    const ir::Type &A = f_.type(op.operands[0]), &B = f_.type(op.operands[1]);
    const int64_t M = A.shape[0], K = A.shape[1], N = B.shape[1];
    const int W = warps_;
    // Warpgroup g takes row slab g % split.m and column slab g / split.m (Layout::wgmma_split).
    const Layout::WgmmaSplit split = Layout::wgmma_split(M, W);
    const int64_t reps = M / (64 * split.m), wn = N / split.n, per = wn / 2;
    const Layout& LC = *plan_.natural[op.results[0]];
    Regs acc = get(op.operands[2], LC);
    V wg = bin(Op::shr, warp_, ci32(2));
    V wg_m = split.m > 1 ? bin(Op::bit_and, wg, ci32(split.m - 1)) : ci32(0);
    V wg_n = split.n > 1 ? bin(Op::shr, wg, ci32(std::countr_zero(static_cast<unsigned>(split.m)))) : ci32(0);
    // B: K-major tiles (B^T[N, K] rows) step 32 bytes per k16 inside a chunk and a chunk per 4
    // steps; MN-major tiles (B[K, N]) step 16 rows of 128 bytes, chunks `leading` bytes apart. A
    // warpgroup's column slab starts wn rows (K-major) or wn / 64 chunks (MN-major) in.
    const SmemTile& tb = plan_.hopper.tiles.at(w.b_tile);
    V b_base = tile_addr(tb);
    if (split.n > 1) {
      const int64_t slab_bytes = w.b_mn_major ? wn / 64 * tb.chunk_bytes() : wn * 128;
      b_base = bin(Op::add, b_base, cast(bin(Op::mul, wg_n, ci32(slab_bytes)), DType::u32));
    }
    V desc_b = w.b_mn_major ? descriptor(b_base, tb.chunk_bytes()) : descriptor(b_base);
    auto b_step = [&](int64_t kk) { return w.b_mn_major ? kk * 2048 / 16 : ((kk / 4) * tb.chunk_bytes() + (kk % 4) * 32) / 16; };
    V desc_a = 0;
    Regs a;
    const SmemTile* ta = w.a_tile ? &plan_.hopper.tiles.at(w.a_tile) : nullptr;
    const int64_t a_chunk = K * 128;  // staged A^T [K, M]: bytes per 64-column chunk of M
    if (ta) {
      desc_a = descriptor(bin(Op::add, tile_addr(*ta), cast(bin(Op::mul, wg_m, ci32(64 * 128)), DType::u32)));
    } else if (w.a_staged) {
      stage_a(*w.a_staged);
      // warpgroup wg_m's first 64 rows of M are chunk wg_m; slab r adds split.m chunks
      desc_a = descriptor(bin(Op::add, smem_at(plan_.hopper.a_staging), cast(bin(Op::mul, wg_m, ci32(a_chunk)), DType::u32)), a_chunk);
    } else {
      // A in registers: the m64k16 A fragment is the accumulator layout of a [M, K] tile, k16 chunk
      // kk of slab r being registers {col bit 0, row 8, col 8} + 16 kk (jit/layout.cpp).
      Layout LA = Layout::wgmma_a(M, K, W);
      Regs ar = get(op.operands[0], LA);
      std::map<Coord, V> by_coord;
      for (uint32_t r = 0; r < static_cast<uint32_t>(LA.num_regs()); ++r) by_coord.emplace(LA.reg_coords(r), ar[r]);
      for (int64_t r = 0; r < reps; ++r)
        for (int64_t kk = 0; kk < K / 16; ++kk)
          for (int64_t c : {0, 8})
            for (int64_t h : {0, 8}) {
              int64_t row = r * 64 * split.m + h, col = 16 * kk + c;
              a.push_back(pack(by_coord.at({row, col}), by_coord.at({row, col + 1})));
            }
      // A value the same in every iteration of the innermost loop around this dot (from outside
      // it, or computed in it from such values alone, which LLVM hoists): ptxas must be shown that
      // its registers live across the loop's back edge.
      for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
        if (f->loop_body) {
          if (loop_invariant(op.operands[0], *f->body)) f->keep_alive.insert(f->keep_alive.end(), a.begin(), a.end());
          break;
        }
    }
    const int64_t imm = wn | (static_cast<int64_t>(A.dtype) << 16) | (int64_t{w.b_mn_major} << 24) | (int64_t{w.a_staged != nullptr} << 26);
    // dot(a, b) (a zero accumulator): the first k-step overwrites instead of reading zeros, so no
    // zero registers are materialised (LLVM shares one zero, and ptxas would then make a later
    // group wait for this one: C7517).
    const ir::Op* acc_def = def_.count(op.operands[2]) ? def_.at(op.operands[2]) : nullptr;
    const double* acc_value = acc_def && acc_def->kind == OpKind::constant ? std::get_if<double>(&acc_def->attrs.at("value")) : nullptr;
    const bool zero_acc = acc_value && *acc_value == 0.0;
    emit0(Op::wgmma_fence, {});
    for (int64_t r = 0; r < reps; ++r)
      for (int64_t kk = 0; kk < K / 16; ++kk) {
        std::vector<V> args;
        if (ta) {
          int64_t a_off = (kk / 4) * ta->chunk_bytes() + r * 64 * split.m * 128 + (kk % 4) * 32;
          args.push_back(bin(Op::add, desc_a, cint(DType::u64, a_off / 16)));
        } else if (w.a_staged) {
          const int64_t a_off = r * split.m * a_chunk + kk * 2048;  // a k16 step: 16 rows of 128 bytes
          args.push_back(bin(Op::add, desc_a, cint(DType::u64, a_off / 16)));
        } else {
          size_t base = static_cast<size_t>(4 * (r * (K / 16) + kk));
          args.insert(args.end(), a.begin() + static_cast<std::ptrdiff_t>(base), a.begin() + static_cast<std::ptrdiff_t>(base + 4));
        }
        args.push_back(bin(Op::add, desc_b, cint(DType::u64, b_step(kk))));
        for (int64_t j = 0; j < per; ++j) args.push_back(acc[static_cast<size_t>(r * per + j)]);
        const int64_t overwrite = zero_acc && kk == 0 ? int64_t{1} << 25 : 0;
        Regs out = emit_multi(ta || w.a_staged ? Op::wgmma : Op::wgmma_rs, args, static_cast<size_t>(per), pir::scalar(DType::f32),
                              imm | overwrite);
        for (int64_t j = 0; j < per; ++j) acc[static_cast<size_t>(r * per + j)] = out[static_cast<size_t>(j)];
      }
    emit0(Op::wgmma_commit, {});
    // The group stays in flight until something reads the result (get() waits for it then), so
    // independent MMAs and the code between them overlap: e.g. dP^T = V dO^T runs while P^T's
    // exponentials are computed.
    pending_.push_back({++committed_, op.results[0], LC, acc, ops_lowered_, blocks_.back(), blocks_.back()->insts.size() - 1});
    if (w.a_staged) staged_a_group_ = committed_;
    put(op.results[0], LC, acc);
  }

  // Whether x is the same in every iteration of the loop with this body: defined outside it, or
  // inside by register-only ops (no memory, no asm barrier: nothing LLVM keeps in the loop) from
  // such values. Block arguments (the counter, carried values) and everything else vary.
  bool loop_invariant(ir::ValueId x, const ir::Block& body) const {
    std::unordered_set<ir::ValueId> inside(body.args.begin(), body.args.end());
    ir::walk(body, [&](const ir::Op& inner) {
      inside.insert(inner.results.begin(), inner.results.end());
      for (const ir::Block& region : inner.regions) inside.insert(region.args.begin(), region.args.end());
    });
    std::unordered_map<ir::ValueId, bool> memo;
    std::function<bool(ir::ValueId)> invariant = [&](ir::ValueId v) {
      if (!inside.count(v)) return true;
      if (auto it = memo.find(v); it != memo.end()) return it->second;
      auto d = def_.find(v);
      if (d == def_.end()) return memo[v] = false;  // a block argument
      const ir::Op& op = *d->second;
      const OpKind k = op.kind;
      const bool register_only = ir::is_elementwise(k) || k == OpKind::constant || k == OpKind::arange || k == OpKind::splat ||
                                 k == OpKind::broadcast || k == OpKind::expand_dims || k == OpKind::reshape || k == OpKind::trans ||
                                 k == OpKind::pack_pairs || k == OpKind::unpack_pairs || k == OpKind::program_id ||
                                 k == OpKind::num_programs || k == OpKind::tensor_dim || k == OpKind::tensor_stride || k == OpKind::tensor_ptr;
      bool r = register_only;
      for (size_t i = 0; r && i < op.operands.size(); ++i) r = invariant(op.operands[i]);
      return memo[v] = r;
    };
    return invariant(x);
  }

  // The byte offset of element (row, col) of a staging tile in the 128-byte swizzle TMA and wgmma
  // read (SWIZZLE_128B): columns in chunks of one 128-byte row each (chunk_bytes apart), row `row`
  // at 128 * row inside its chunk, and the row's 16-byte unit u stored at u ^ (row % 8).
  V swizzled_offset(V row, V col, int64_t elem_bytes, int64_t chunk_bytes) {
    const int64_t per_row = 128 / elem_bytes, per_unit = 16 / elem_bytes;
    V chunk = bin(Op::shr, col, ci32(std::countr_zero(static_cast<uint64_t>(per_row)))), within = land(col, ci32(per_row - 1));
    V unit = bin(Op::bit_xor, bin(Op::shr, within, ci32(std::countr_zero(static_cast<uint64_t>(per_unit)))), land(row, ci32(7)));
    return bin(Op::add, bin(Op::mul, chunk, ci32(chunk_bytes)),
               bin(Op::add, bin(Op::mul, row, ci32(128)),
                   bin(Op::add, bin(Op::mul, unit, ci32(16)), bin(Op::mul, land(within, ci32(per_unit - 1)), ci32(elem_bytes)))));
  }

  // A shared-memory store at an absolute byte offset (the staging tiles lie below the scratch area,
  // whose base emit0 would add).
  // Shared-memory accesses at an absolute byte offset (emit/emit0 add the scratch base to theirs).
  void store_shared_at(V offset, V value, std::optional<V> pred) {
    pir::Inst st;
    st.op = Op::store_shared;
    st.args = {offset, value};
    if (pred) st.args.push_back(*pred);
    blocks_.back()->insts.push_back(std::move(st));
  }
  V load_shared_at(V offset, DType d) {
    pir::Inst ld;
    ld.op = Op::load_shared;
    ld.args = {offset};
    ld.results.push_back(out_.new_value(pir::scalar(d)));
    const V r = ld.results[0];
    blocks_.back()->insts.push_back(std::move(ld));
    return r;
  }

  // Writes x of A = trans(x) (x [K, M] 16-bit, in its own layout) into the A staging tile: element
  // (k, m) at chunk m / 64, row k (128 bytes), 16-byte unit (m % 64) / 8 XOR k % 8 (the 128-byte
  // swizzle), adjacent m pairs as one 32-bit store. The previous staged dot's MMAs must be done
  // reading it, in every warpgroup: this thread waits for its group, then all meet at a barrier.
  void stage_a(const ir::Op& trans) {
    if (std::any_of(pending_.begin(), pending_.end(), [&](const PendingDot& p) { return p.group == staged_a_group_; }))
      wait_groups(staged_a_group_);
    // the same barrier tells every thread that earlier TMA reduces have read their staging tile
    if (!plan_.hopper.reduces.empty()) pir_if(cmp(pir::Pred::eq, tid_, ci32(0)), [&] { emit0(Op::bulk_wait, {}, pir::kBulkWaitRead); });
    emit0(Op::barrier, {});
    if (!plan_.hopper.reduces.empty()) reduce_staging_free_in_ = block_ids_.back();
    const ir::ValueId x = trans.operands[0];
    const ir::Type& t = f_.type(x);
    const int64_t K = t.shape[0];
    Layout L = plan_.natural[x] ? *plan_.natural[x] : memory_layout(t);
    Regs xr = get(x, L);
    std::map<Coord, uint32_t> reg_of;
    for (uint32_t r = 0; r < xr.size(); ++r) reg_of.emplace(L.reg_coords(r), r);
    std::optional<V> own = owner(L);
    for (uint32_t r = 0; r < xr.size(); ++r) {
      if (duplicate_reg(L, r)) continue;
      const Coord c = L.reg_coords(r);
      auto pair = reg_of.find({c[0], c[1] + 1});
      // a pair when the thread's own column part is even and the next column is its next register
      const bool paired = c[1] % 2 == 0 && pair != reg_of.end() && additive(L);
      if (c[1] % 2 == 1 && reg_of.count({c[0], c[1] - 1}) && additive(L)) continue;  // stored with its pair
      V off = swizzled_offset(coord(L, r, 0), coord(L, r, 1), 2, K * 128);
      store_shared_at(bin(Op::add, off, ci32(plan_.hopper.a_staging)), paired ? pack(xr[r], xr[pair->second]) : xr[r], own);
    }
    emit0(Op::fence_proxy_async, {});
    emit0(Op::barrier, {});
  }

  // The last wgmma group a region op must wait for before it runs (none: it may run with every
  // group in flight): all of them if it runs dots, else the latest group among the in-flight
  // results it reads.
  std::optional<int> region_waits_for(const ir::Op& op) const {
    if (pending_.empty()) return std::nullopt;
    std::optional<int> upto;
    auto note = [&](ir::ValueId v) {
      for (const PendingDot& p : pending_)
        if (p.value == v) upto = std::max(upto.value_or(p.group), p.group);
    };
    bool runs_dots = false;
    for (ir::ValueId v : op.operands) note(v);
    for (const ir::Block& r : op.regions)
      ir::walk(r, [&](const ir::Op& inner) {
        runs_dots = runs_dots || inner.kind == OpKind::dot;
        for (ir::ValueId v : inner.operands) note(v);
      });
    if (runs_dots) return pending_.back().group;
    return upto;
  }

  // wgmma groups committed in this straight-line block whose results nobody has read yet.
  struct PendingDot {
    int group;
    ir::ValueId value;
    Layout layout;
    Regs regs;
    int64_t ops_at_issue = 0;  // ops_lowered_ when it was issued
    pir::Block* commit_block = nullptr;  // its wgmma_commit: the block and the index there
    size_t commit_at = 0;
  };
  // Waits until `v`'s group (if pending) is complete: wait_group(n) with n the groups committed
  // after it; every group it completes gets its registers redefined by the wait (the asm ties
  // them), so nothing reads an accumulator before the MMA wrote it.
  void wait_for(ir::ValueId v) {
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const PendingDot& p) { return p.value == v; });
    if (it == pending_.end()) return;
    wait_groups(it->group);
  }
  void wait_pending() {
    if (!pending_.empty()) wait_groups(pending_.back().group);
  }
  void wait_groups(int upto) {
    Regs tied;
    std::vector<PendingDot> done, rest;
    for (PendingDot& p : pending_) (p.group <= upto ? done : rest).push_back(std::move(p));
    for (const PendingDot& p : done) tied.insert(tied.end(), p.regs.begin(), p.regs.end());
    // Fenced when work was lowered since the issue (e.g. a softmax meant to run while the MMA
    // does): that overlap exists only if the wait stays after it. A wait right at the issue (a
    // result read at once) is left to ptxas to place.
    const bool overlapped = std::any_of(done.begin(), done.end(), [&](const PendingDot& p) { return ops_lowered_ > p.ops_at_issue; });
    Regs out = emit_multi(Op::wgmma_wait, tied, tied.size(), pir::scalar(DType::f32),
                          (committed_ - upto) | (overlapped ? pir::kWaitFenced : 0));
    wait_outputs_.insert(out.begin(), out.end());
    pending_ = std::move(rest);  // before put(): get() must not see them pending again
    size_t at = 0;
    for (const PendingDot& p : done) {
      put(p.value, p.layout, Regs(out.begin() + static_cast<std::ptrdiff_t>(at), out.begin() + static_cast<std::ptrdiff_t>(at + p.regs.size())));
      at += p.regs.size();
    }
  }

  const ir::Function& f_;
  const LayoutPlan& plan_;
  std::map<ir::ValueId, Layout> precomputed_, precompute_requests_;
  pir::Func out_;
  std::map<const ir::Op*, RingState> rings_;
  std::vector<PendingDot> pending_;
  std::set<V> wait_outputs_;  // registers a wgmma wait redefined (wait_groups)
  int64_t ops_lowered_ = 0;  // ops of the tile IR lowered so far, dots excepted
  int committed_ = 0;
  int staged_a_group_ = 0;  // the wgmma group of the last dot that read the A staging tile
  int64_t scratch_base_ = 0;
  std::map<std::pair<int, std::vector<int64_t>>, V> tensor_maps_;  // by (tensor parameter, box)
  std::unordered_map<ir::ValueId, int64_t> divisors_;
  std::unordered_map<ir::ValueId, const ir::Op*> iv_loop_;
  std::vector<pir::Block*> blocks_;
  std::vector<int64_t> block_ids_;
  int64_t block_serial_ = 0;
  // The block (id) in which, since the last TMA reduce was issued, thread 0 waited for every earlier
  // reduce to read its staging tile and all threads then met at a barrier: a reduce issued later in
  // that block finds the staging tile free without another wait and barrier. -1: none.
  int64_t reduce_staging_free_in_ = -1;
  std::vector<Frame> frames_;
  std::unordered_map<ir::ValueId, const ir::Op*> def_;
  // load_at_use results: the memory epoch (stores, atomics and regions lowered so far) and frame
  // depth of their load; a use that finds both unchanged may read the window again.
  std::unordered_map<ir::ValueId, std::pair<int64_t, size_t>> reloadable_;
  int64_t memory_epoch_ = 0;
  // Warpgroup turns (lang::warpgroup_turn): on with exactly two warpgroups; the turn_begin being lowered.
  bool turns_ = false;
  const ir::Op* in_turn_ = nullptr;
  V own_turn_ = 0, other_turn_ = 0;  // named barrier ids: this warpgroup's turn, the other's
  std::unordered_map<ir::ValueId, TensorDesc> tensors_;
  std::map<std::pair<DType, int64_t>, V> const_ints_;
  V tid_ = 0, lane_ = 0, warp_ = 0;  // in a warp role, counted from the role's first warp
  int warps_ = 0;                    // the warps of the code being lowered (a role's, else the launch's)
  int role_barrier_ = 0;             // in a warp role: its named barrier
  std::unordered_map<V, std::pair<V, int>> unpacked_;  // unpack_pairs' halves: (word, half)
  std::map<int64_t, ChannelPlan> channels_;            // lang::Channel, by id
  std::set<ir::ValueId> used_, read_pops_;             // values with a use; channel pops already read
  int64_t smem_bytes_ = 0;
};

}  // namespace

pir::Func lower_to_threads(const ir::Function& f, const LayoutPlan& plan) {
  // A flexible precompute result's layout is that of its use, known only once the use is lowered:
  // a first run records it, a second computes the value ahead in it.
  Lowerer first(f, plan);
  pir::Func out = first.run();
  if (first.precompute_requests().empty()) return out;
  return Lowerer(f, plan, first.precompute_requests()).run();
}

}  // namespace tilejit::jit
