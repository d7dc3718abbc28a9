// The matcher for TMA + wgmma pipelined K loops; see tma_pipeline.hpp for the shape it accepts.
#include "jit/tma_pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "dsl/ir/input_precision.hpp"
#include "jit/scalar_facts.hpp"

namespace tilejit::jit {
namespace {

using ir::OpKind;

const ir::Param* tensor_param(const ir::Function& f, ir::ValueId v) {
  for (const ir::Param& p : f.params)
    if (p.value == v && p.kind == ir::ParamKind::Tensor) return &p;
  return nullptr;
}

// A rank-2, unit-innermost-stride, 16-byte aligned bf16/f16 window with zero padding, of the given
// shape, whose offset `k_dim` is the loop counter and whose other offset is loop-invariant.
bool tma_window(const ir::Function& f, const ir::Op& load, ir::ValueId iv, const ir::Block& body,
                std::vector<int64_t> shape, int k_dim) {
  if (load.kind != OpKind::block_load || load.operands.size() != 3) return false;
  const ir::Param* p = tensor_param(f, load.operands[0]);
  if (!p || p->type.rank != 2 || !p->spec.contiguous_last || p->spec.align_bytes < 16) return false;
  if (p->type.dtype != ir::DType::bf16 && p->type.dtype != ir::DType::f16) return false;
  if (load.float_attr("padding") != 0.0 || load.ints_attr("dims") != std::vector<int64_t>{0, 1}) return false;
  if (load.ints_attr("shape") != shape) return false;
  ir::ValueId k_off = load.operands[1 + static_cast<size_t>(k_dim)], other = load.operands[2 - static_cast<size_t>(k_dim)];
  if (k_off != iv || other == iv) return false;
  // TMA coordinates are i32: wider offsets (i64 / u32 / u64) take the generic, 64-bit checked path
  if (!ir::fits_i32(f.type(k_off).dtype) || !ir::fits_i32(f.type(other).dtype)) return false;
  for (const ir::Op& op : body.ops)  // the other offset must be loop-invariant
    for (ir::ValueId r : op.results)
      if (r == other) return false;
  // the box must start on 16 bytes of the contiguous dim in every iteration
  return tma_inner_offset_aligned(ScalarFacts(f), load.operands[2], p->type.dtype);
}

}  // namespace

std::optional<TmaDotLoop> match_tma_dot_loop(const ir::Function& f, const ir::Op& loop, int num_warps,
                                             const std::string& arch, const PipelineOptions& opts) {
  if (!opts.enabled || arch != "sm_90a" || loop.kind != OpKind::for_ || num_warps % 4 != 0) return std::nullopt;
  if (opts.stages < 2 || opts.stages > 8) return std::nullopt;
  const ir::Block& body = loop.regions[0];
  if (loop.results.size() != 1) return std::nullopt;
  ir::ValueId iv = body.args[0], acc_arg = body.args[1];
  // The body: the dot of two windows (B through a trans or not), the yield, and side work that
  // does not touch them (see TmaDotLoop::side_ops).
  TmaDotLoop m;
  m.loop = &loop;
  m.stages = opts.stages;
  std::map<ir::ValueId, const ir::Op*> def;
  for (const ir::Op& op : body.ops) {
    for (ir::ValueId r : op.results) def[r] = &op;
    if (op.kind != OpKind::dot) continue;
    if (m.dot) return std::nullopt;  // one dot per K loop
    m.dot = &op;
  }
  if (!m.dot || m.dot->operands[2] != acc_arg) return std::nullopt;
  // a wgmma pipeline: 2-D dots at the default precision only (batched and tf32 dots take mma.sync)
  if (f.type(m.dot->operands[0]).shape.size() != 2 || ir::input_precision(*m.dot) != ir::InputPrecision::ieee) return std::nullopt;
  auto defined = [&](ir::ValueId v, OpKind kind) -> const ir::Op* {
    auto it = def.find(v);
    return it != def.end() && it->second->kind == kind ? it->second : nullptr;
  };
  const ir::Op* trans_a = defined(m.dot->operands[0], OpKind::trans);
  m.load_a = defined(trans_a ? trans_a->operands[0] : m.dot->operands[0], OpKind::block_load);
  m.a_mn_major = trans_a != nullptr;
  const ir::Op* trans = defined(m.dot->operands[1], OpKind::trans);
  m.load_b = defined(trans ? trans->operands[0] : m.dot->operands[1], OpKind::block_load);
  m.b_mn_major = !trans;
  if (!m.load_a || !m.load_b || m.load_a == m.load_b) return std::nullopt;
  // The pipeline's own values (registers it owns, or tiles that never exist outside shared
  // memory): nothing else may read them.
  const std::set<const ir::Op*> own{m.load_a, m.load_b, trans, trans_a, m.dot};
  std::set<ir::ValueId> owned{acc_arg, m.load_a->results[0], m.load_b->results[0], m.dot->results[0]};
  if (trans) owned.insert(trans->results[0]);
  if (trans_a) owned.insert(trans_a->results[0]);
  bool reads_owned = false;
  for (const ir::Op& op : body.ops) {
    if (own.count(&op) || op.kind == OpKind::yield) continue;
    const auto check = [&](const ir::Op& inner) {
      for (ir::ValueId v : inner.operands) reads_owned |= owned.count(v) > 0;
      if (inner.kind == OpKind::dot) reads_owned = true;  // side work runs no MMAs
    };
    check(op);
    for (const ir::Block& region : op.regions) ir::walk(region, check);
    m.side_ops.push_back(&op);
  }
  if (reads_owned) return std::nullopt;
  // Scalar arithmetic alone (the windows' offsets) is no side work; with side work it is lowered
  // too, as the side work may read it.
  const bool work = std::any_of(m.side_ops.begin(), m.side_ops.end(), [&](const ir::Op* op) {
    if (!op->regions.empty() || op->kind == OpKind::store || op->kind == OpKind::atomic_add || op->kind == OpKind::atomic_rmw ||
        op->kind == OpKind::atomic_cas || op->kind == OpKind::load)
      return true;
    return std::any_of(op->results.begin(), op->results.end(), [&](ir::ValueId r) { return !f.type(r).is_scalar(); });
  });
  if (!work) m.side_ops.clear();
  if (body.ops.back().operands.at(0) != m.dot->results[0]) return std::nullopt;
  const ir::Type& a = f.type(m.load_a->results[0]);
  const ir::Type& b = f.type(m.load_b->results[0]);
  m.bm = a.shape[m.a_mn_major ? 1 : 0];
  m.bk = a.shape[m.a_mn_major ? 0 : 1];
  m.bn = m.b_mn_major ? b.shape[1] : b.shape[0];
  if (a.dtype != b.dtype || m.bk != 64) return std::nullopt;  // 128-byte swizzled rows
  int warpgroups = num_warps / 4;
  if (m.bm % (64 * warpgroups) != 0 || m.bn % 8 != 0 || m.bn > 256 || m.bm > 256) return std::nullopt;
  if (m.b_mn_major && m.bn % 64 != 0) return std::nullopt;  // whole 128-byte (64-element) column chunks
  if (m.a_mn_major ? !tma_window(f, *m.load_a, iv, body, {m.bk, m.bm}, 0) : !tma_window(f, *m.load_a, iv, body, {m.bm, m.bk}, 1))
    return std::nullopt;
  if (m.b_mn_major ? !tma_window(f, *m.load_b, iv, body, {m.bk, m.bn}, 0) : !tma_window(f, *m.load_b, iv, body, {m.bn, m.bk}, 1))
    return std::nullopt;
  // the step must be the constant BK
  return m;
}

TmaPlan match_tma_loops(const ir::Function& f, int num_warps, const std::map<const ir::Op*, int>& op_warps,
                        const std::string& arch, const PipelineOptions& opts) {
  TmaPlan plan;
  // Under lang::ring_producer every K loop is a ring of the general planner (wgmma_plan.hpp),
  // which a producer warpgroup fills; this pipeline's consumers fill their own ring.
  bool producer = false;
  ir::walk(f.body, [&](const ir::Op& op) { producer = producer || op.kind == OpKind::ring_producer; });
  if (producer) return plan;
  ir::walk(f.body, [&](const ir::Op& op) {
    if (op.kind != OpKind::for_) return;
    auto w = op_warps.find(&op);
    if (auto m = match_tma_dot_loop(f, op, w == op_warps.end() ? num_warps : w->second, arch, opts)) plan.loops[&op] = *m;
  });
  return plan;
}

std::string print_tma_plan(const ir::Function& f, const TmaPlan& plan) {
  std::string out = ir::print(f);
  out += plan.loops.empty() ? "// TMA + wgmma K loops: none\n" : "// TMA + wgmma K loops, in program order:\n";
  ir::walk(f.body, [&](const ir::Op& op) {
    auto it = plan.loops.find(&op);
    if (it == plan.loops.end()) return;
    const TmaDotLoop& m = it->second;
    out += fmt::format("//   for at {}: dot at {}, BM = {}, BN = {}, BK = {}, B {}{}, {} stages, {} side ops\n", op.loc.str(), m.dot->loc.str(),
                       m.bm, m.bn, m.bk, m.b_mn_major ? "MN-major" : "K-major", m.a_mn_major ? ", A MN-major" : "", m.stages, m.side_ops.size());
  });
  return out;
}

}  // namespace tilejit::jit
