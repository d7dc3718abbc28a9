// The base the rest of the lowering emits through: instruction and constant helpers, the kernel's
// parameters, and values (a tile's registers per layout, cached per frame; thread coordinates).
#include "jit/lower/lowerer.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tilejit::jit::lower {

void Lowerer::push_block(pir::Block* b) {
  blocks_.push_back(b);
  block_ids_.push_back(++block_serial_);
}

void Lowerer::pop_block() {
  blocks_.pop_back();
  block_ids_.pop_back();
}

void Lowerer::fail(const ir::Op* op, const std::string& msg) const {
  if (!op) throw LoweringError(fmt::format("tilejit: kernel '{}': {}", f_.name, msg));
  throw LoweringError(fmt::format("tilejit: kernel '{}': {} at {}: {}", f_.name, ir::op_name(op->kind), op->loc.str(), msg));
}

V Lowerer::emit(Op op, pir::Ty ty, std::vector<V> args, int64_t imm, double fimm) {
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

void Lowerer::emit0(Op op, std::vector<V> args, int64_t imm) {
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
  if (op == Op::barrier || op == Op::named_barrier_sync) {
    // a barrier of all threads (a role's own, in a role) orders their global accesses; a turn's
    // named barriers join two warpgroups' turns, not every thread
    if (op == Op::barrier || role_barrier_) global_barrier_emitted();
  }
  pir::Inst in;
  in.op = op;
  in.args = std::move(args);
  in.imm = imm;
  blocks_.back()->insts.push_back(std::move(in));
}

V Lowerer::cint(DType d, int64_t v) {
  auto key = std::make_pair(d, v);
  auto it = const_ints_.find(key);
  if (it != const_ints_.end() && blocks_.size() == 1) return it->second;
  V r = emit(Op::constant, pir::scalar(d), {}, v);
  if (blocks_.size() == 1) const_ints_[key] = r;
  return r;
}

V Lowerer::cast(V v, DType to) {
  if (out_.types[v] == pir::scalar(to)) return v;
  return emit(Op::cast, pir::scalar(to), {v});
}

V Lowerer::constant_value(DType d, const ir::Attr& a) {
  if (ir::is_float(d)) {
    double v = std::holds_alternative<double>(a) ? std::get<double>(a) : static_cast<double>(std::get<int64_t>(a));
    return cfloat(d, v);
  }
  // a float value converts like a cast (saturating, NaN -> 0), as the interpreter does
  if (const double* f = std::get_if<double>(&a)) return cint(d, ir::wrap_int(d, ir::float_to_int(d, *f)));
  return cint(d, ir::wrap_int(d, std::get<int64_t>(a)));
}

V Lowerer::scratch(V offset) { return scratch_base_ ? bin(Op::add, offset, ci32(scratch_base_)) : offset; }

int64_t Lowerer::reserve_smem(int64_t bytes) {
  smem_bytes_ = std::max(smem_bytes_, scratch_base_ + bytes);
  return 0;  // every exchange is bracketed by barriers, so all reuse offset 0
}

void Lowerer::params() {
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

V Lowerer::scalar(ir::ValueId v) {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto f = it->scalars.find(v);
    if (f != it->scalars.end()) return f->second;
  }
  fail(def_.count(v) ? def_.at(v) : nullptr, fmt::format("internal: scalar value {} used before it was lowered", v));
}

std::optional<size_t> Lowerer::frame_of(ir::ValueId v, const std::string& key) const {
  for (size_t i = frames_.size(); i-- > 0;) {
    if (frames_[i].tiles.count({v, key})) return i;
    if (frames_[i].role) break;
  }
  return std::nullopt;
}

const Regs* Lowerer::cached(ir::ValueId v, const std::string& key) const {
  const std::optional<size_t> i = frame_of(v, key);
  return i ? &frames_[*i].tiles.at({v, key}) : nullptr;
}

void Lowerer::check_shape(const ir::Op* op, const ir::Type& t) const {
  for (int64_t d : t.shape)
    if (!is_power_of_two(d))
      fail(op, fmt::format("tile dimensions must be powers of two for the GPU backend, got {}", ir::to_string(t)));
}

Regs Lowerer::get(ir::ValueId v, const Layout& L) {
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
    // load_at_use: read the window again in L (its first read is dead code if no use keeps it);
    // a vector tile from its ring stage, which stays until the iteration ends
    if (smem_vectors_.count(v)) {
      regs = smem_vector_regs(plan_.hopper.tiles.at(def_.at(v)), L);
    } else if (again != reloadable_.end() && again->second == std::pair{memory_epoch_, frames_.size()}) {
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

void Lowerer::put(ir::ValueId v, const Layout& L, Regs regs) { frames_.back().tiles[{v, L.str()}] = std::move(regs); }

Regs Lowerer::at_level(size_t level, const std::function<Regs()>& emit_code) {
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

const std::vector<V>& Lowerer::thread_coords(const Layout& L) {
  std::string key = L.str();
  // (coordinates at use: only this frame's, computed from opaque copies: LLVM hoisted the loop-
  // invariant coordinates and the per-register values made from them out of the loop, decision 114)
  const bool at_use = coordinates_at_use_ && !loop_heads_.empty();
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto f = it->thread_coords.find(key);
    if (f != it->thread_coords.end()) return f->second;
    if (it->role || at_use) break;
  }
  return frames_.back().thread_coords[key] = at_use ? thread_coords_at_use(L) : thread_coords_of(L, lane_, warp_);
}

std::vector<V> Lowerer::thread_coords_at_use(const Layout& L) {
  auto opaque = [&](V x) { return emit_multi(Op::opaque, {x}, 1, pir::scalar(DType::i32), pir::kOpaqueCopy)[0]; };
  return thread_coords_of(L, opaque(lane_), opaque(warp_));
}

std::vector<V> Lowerer::thread_coords_of(const Layout& L, V lane, V warp) {
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
    add_bits(L.lane, lane);
    add_bits(L.warp, warp);
    c.push_back(acc);
  }
  return c;
}

V Lowerer::coord(const Layout& L, uint32_t r, size_t d) { return coord(L, r, d, thread_coords(L)[d]); }

V Lowerer::coord(const Layout& L, uint32_t r, size_t d, V tc) {
  int64_t rc = L.reg_coords(r)[d];
  if (rc == 0) return tc;
  int64_t thread_bits = 0;
  for (const auto* bs : {&L.lane, &L.warp})
    for (const Coord& c : *bs) thread_bits |= c[d];
  return bin((thread_bits & rc) == 0 ? Op::add : Op::bit_xor, tc, ci32(rc));
}

bool Lowerer::additive(const Layout& L) {
  for (size_t d = 0; d < L.shape.size(); ++d) {
    int64_t reg_bits = 0, thread_bits = 0;
    for (const Coord& c : L.reg) reg_bits |= c[d];
    for (const auto* bs : {&L.lane, &L.warp})
      for (const Coord& c : *bs) thread_bits |= c[d];
    if (reg_bits & thread_bits) return false;
  }
  return true;
}

V Lowerer::tile_offset(const Layout& L, uint32_t r) {
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

bool Lowerer::duplicate_reg(const Layout& L, uint32_t r) const {
  for (size_t i = 0; i < L.reg.size(); ++i)
    if ((r >> i & 1) && std::all_of(L.reg[i].begin(), L.reg[i].end(), [](int64_t x) { return x == 0; })) return true;
  return false;
}

std::optional<V> Lowerer::owner(const Layout& L) {
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

}  // namespace tilejit::jit::lower
