// Code that divides the warps: channels between warp roles (mbarrier-guarded shared-memory slots),
// the roles' if/else chain on the warp index, and warpgroup turns (named barriers, FA3 ping-pong).
#include "jit/lower/lowerer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace tilejit::jit::lower {

void Lowerer::channels_init() {
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

std::pair<V, V> Lowerer::channel_slot(const ChannelPlan& c, V index) {
  V stage = bin(Op::rem, index, ci32(c.stages));
  return {stage, bin(Op::bit_and, bin(Op::div, index, ci32(c.stages)), ci32(1))};
}

V Lowerer::stage_barrier(int64_t base, V stage) { return bin(Op::add, smem_at(base), cast(bin(Op::mul, stage, ci32(8)), DType::u32)); }

V Lowerer::channel_offset(const ChannelPlan& c, V stage, const Layout& L, uint32_t r, DType d) {
  V slot = bin(Op::add, ci32(c.slots), bin(Op::mul, stage, ci32(c.bytes)));
  return bin(Op::add, slot, bin(Op::mul, tile_offset(L, r), ci32(ir::byte_size(d))));
}

void Lowerer::channel_push(const ir::Op& op) {
  const ChannelPlan& c = channels_.at(op.int_attr("channel"));
  const ir::Type& t = f_.type(op.operands[1]);
  const Layout L = plan_.natural[op.operands[1]] ? *plan_.natural[op.operands[1]] : memory_layout(t);
  const Regs v = get(op.operands[1], L);
  auto [stage, parity] = channel_slot(c, cast(scalar(op.operands[0]), DType::i32));
  emit0(Op::mbar_wait, {stage_barrier(c.empty, stage), bin(Op::bit_xor, parity, ci32(1))});
  for (uint32_t r = 0; r < v.size(); ++r) store_shared_at(channel_offset(c, stage, L, r, t.dtype), v[r], std::nullopt);
  emit0(Op::mbar_arrive, {stage_barrier(c.full, stage)});
}

Regs Lowerer::channel_read(const ir::Op& op, const Layout& L) {
  if (!read_pops_.insert(op.results[0]).second)
    fail(&op, "a channel pop is read once: its tile is used in two layouts (compute one from the other, or pop into one use)");
  const ChannelPlan& c = channels_.at(op.int_attr("channel"));
  const DType d = f_.type(op.results[0]).dtype;
  auto [stage, parity] = channel_slot(c, cast(scalar(op.operands[0]), DType::i32));
  emit0(Op::mbar_wait, {stage_barrier(c.full, stage), parity});
  Regs out;
  for (uint32_t r = 0; r < static_cast<uint32_t>(L.num_regs()); ++r) out.push_back(load_shared_at(channel_offset(c, stage, L, r, d), d));
  emit0(Op::mbar_arrive, {stage_barrier(c.empty, stage)});
  return out;
}

void Lowerer::warp_roles(const ir::Op& op) {
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
      // roles end the kernel; under setmaxnreg each ends on its own (pir::Op::exit_thread says why)
      if (r.max_registers > 0) emit0(Op::exit_thread, {});
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

void Lowerer::turns_init() {
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

void Lowerer::turn_begin(const ir::Op& op) {
  if (!turns_) return;
  in_turn_ = &op;
  emit0(Op::named_barrier_sync, {own_turn_}, 2 * kWarpgroupThreads);
}

void Lowerer::turn_end() {
  if (!turns_) return;
  in_turn_ = nullptr;
  emit0(Op::named_barrier_arrive, {other_turn_}, 2 * kWarpgroupThreads);
}

}  // namespace tilejit::jit::lower
