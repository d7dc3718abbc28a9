// Control flow and synchronisation: for loops (carried values, no wrap-around past the bound),
// ifs, warp roles run one after the other with the channels between them, and semaphores
// (wait_ge / signal_add) between programs that run concurrently.
#include <fmt/format.h>

#include <limits>

#include "runtime/interpreter/machine.hpp"

namespace tilejit::runtime::interp {

void Machine::for_op(const Op& op) {
  const ir::Block& body = op.regions[0];
  const DType bt = T(op.operands[0]).dtype;
  const bool uns = !ir::is_signed(bt);
  const int64_t lb = S(op.operands[0]).i[0], ub = S(op.operands[1]).i[0], step = S(op.operands[2]).i[0];
  if (uns ? step == 0 : step <= 0) fault(op, fmt::format("for_range step must be positive, got {}", step));
  const size_t carried = op.operands.size() - 3;
  for (size_t j = 0; j < carried; ++j) copy_slot(S(body.args[1 + j]), S(op.operands[3 + j]));
  std::vector<Slot> next(carried);  // yields are staged here first: they may read the carried args
  // The iteration count is ceil((ub - lb) / step) computed without wrap-around: the loop stops
  // instead of letting iv + step overflow the bound dtype.
  const auto ustep = static_cast<uint64_t>(step);
  for (int64_t iv = lb; uns ? static_cast<uint64_t>(iv) < static_cast<uint64_t>(ub) : iv < ub;) {
    S(body.args[0]).i.assign(1, iv);
    const Op* y = run_block(body);
    for (size_t j = 0; j < carried; ++j) copy_slot(next[j], S(y->operands[j]));
    for (size_t j = 0; j < carried; ++j) std::swap(S(body.args[1 + j]), next[j]);
    if (uns ? static_cast<uint64_t>(iv) > std::numeric_limits<uint64_t>::max() - ustep
            : iv > std::numeric_limits<int64_t>::max() - step)
      break;
    iv = static_cast<int64_t>(static_cast<uint64_t>(iv) + ustep);
  }
  for (size_t j = 0; j < carried; ++j) copy_slot(S(op.results[j]), S(body.args[1 + j]));
}

void Machine::if_op(const Op& op) {
  const Op* y = run_block(op.regions[S(op.operands[0]).i[0] != 0 ? 0 : 1]);
  if (!y) {
    if (!op.results.empty()) fault(op, "a region ends without a yield");
    return;
  }
  for (size_t j = 0; j < op.results.size(); ++j) copy_slot(S(op.results[j]), S(y->operands[j]));
}

void Machine::warp_roles_op(const Op& op) {
  // the roles share no tiles or Vars, only channels: one after the other, the pushing roles
  // first (a role that pops and pushes runs after the roles it pops from)
  std::vector<const ir::Block*> order;
  for (bool pushing : {true, false})
    for (const ir::Block& role : op.regions) {
      bool pushes = false;
      ir::walk(role, [&](const Op& o) { pushes = pushes || o.kind == OpKind::channel_push; });
      if (pushes == pushing) order.push_back(&role);
    }
  for (const ir::Block* role : order) run_block(*role);
}

void Machine::channel_push_op(const Op& op) {
  auto key = std::pair{op.int_attr("channel"), S(op.operands[0]).i[0]};
  if (channel_.count(key)) fault(op, fmt::format("channel index {} is pushed twice", key.second));
  channel_[key] = S(op.operands[1]);
}

void Machine::channel_pop_op(const Op& op) {
  auto key = std::pair{op.int_attr("channel"), S(op.operands[0]).i[0]};
  auto it = channel_.find(key);
  if (it == channel_.end()) fault(op, fmt::format("channel index {} is popped before it was pushed (or twice)", key.second));
  S(op.results[0]) = std::move(it->second);
  channel_.erase(it);
}

void Machine::wait_op(const Op& op) { wait_until(op, op.operands[0], op.operands[1]); }

void Machine::wait_until(const Op& op, ir::ValueId sem, ir::ValueId target_id) {
  static const ir::Shape scalar_shape;
  std::byte* p = access(op, static_cast<uint64_t>(S(sem).i[0]), 4, "waits on", -1, scalar_shape);
  const int64_t target = S(target_id).i[0];
  auto value = [&] { return element::read_int(DType::i32, p); };
  // kernels that wait always run concurrently (interpret() checks), so sync_ is set here
  std::unique_lock lock(sync_->mu);
  while (value() < target) {
    if (sync_->deadlock) break;
    if (++sync_->waiting == sync_->alive) {  // everyone asleep and no signal since: nobody can wake them
      sync_->deadlock = true;
      sync_->cv.notify_all();
      break;
    }
    const uint64_t gen = sync_->generation;
    sync_->cv.wait(lock, [&] { return sync_->generation != gen || sync_->deadlock; });
    if (sync_->generation == gen) --sync_->waiting;  // (a signal already uncounted it)
  }
  if (value() < target)
    fault(op, fmt::format("deadlock: waits for the semaphore to reach {} but it is {}, and every program still running waits too",
                          target, value()));
}

void Machine::signal_op(const Op& op) { signal_by(op, op.operands[0], S(op.operands[1]).i[0]); }

void Machine::signal_by(const Op& op, ir::ValueId sem, int64_t add) {
  static const ir::Shape scalar_shape;
  std::byte* p = access(op, static_cast<uint64_t>(S(sem).i[0]), 4, "signals", -1, scalar_shape);
  std::unique_lock<std::mutex> lock;
  if (sync_) lock = std::unique_lock(sync_->mu);
  const int64_t v = element::read_int(DType::i32, p) + add;
  element::write_int(DType::i32, p, static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v))));
  if (sync_) {
    ++sync_->generation;
    sync_->waiting = 0;
    sync_->cv.notify_all();
  }
}

}  // namespace tilejit::runtime::interp
