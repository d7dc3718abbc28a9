// The matcher for TMA + wgmma pipelined K loops; see tma_pipeline.hpp for the shape it accepts.
#include "jit/tma_pipeline.hpp"

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
  for (const ir::Op& op : body.ops)  // the other offset must be loop-invariant
    for (ir::ValueId r : op.results)
      if (r == other) return false;
  return true;
}

}  // namespace

std::optional<TmaDotLoop> match_tma_dot_loop(const ir::Function& f, const ir::Op& loop, int num_warps,
                                             const std::string& arch, const PipelineOptions& opts) {
  if (!opts.enabled || arch != "sm_90a" || loop.kind != OpKind::for_ || num_warps % 4 != 0) return std::nullopt;
  if (opts.stages < 2 || opts.stages > 8) return std::nullopt;
  const ir::Block& body = loop.regions[0];
  if (loop.results.size() != 1) return std::nullopt;
  ir::ValueId iv = body.args[0], acc_arg = body.args[1];
  // The body: two windows, a trans, the dot, the yield (and nothing else with effects or tiles).
  TmaDotLoop m;
  m.loop = &loop;
  m.stages = opts.stages;
  const ir::Op* trans = nullptr;
  for (const ir::Op& op : body.ops) {
    switch (op.kind) {
      case OpKind::block_load: (m.load_a ? m.load_b : m.load_a) = &op; break;
      case OpKind::trans: trans = &op; break;
      case OpKind::dot: m.dot = &op; break;
      case OpKind::yield: break;
      default:
        for (ir::ValueId r : op.results)
          if (!f.type(r).is_scalar()) return std::nullopt;
        if (op.kind == OpKind::store || op.kind == OpKind::atomic_add || op.kind == OpKind::load) return std::nullopt;
    }
  }
  if (!m.load_a || !m.load_b || !m.dot) return std::nullopt;
  // dot(a, trans(bt), acc) or dot(a, b, acc): which load is A is decided by the dot's operands
  if (m.dot->operands[0] == m.load_b->results[0]) std::swap(m.load_a, m.load_b);
  if (m.dot->operands[0] != m.load_a->results[0] || m.dot->operands[2] != acc_arg) return std::nullopt;
  if (trans) {
    if (trans->operands[0] != m.load_b->results[0] || m.dot->operands[1] != trans->results[0]) return std::nullopt;
  } else {
    if (m.dot->operands[1] != m.load_b->results[0]) return std::nullopt;
    m.b_mn_major = true;
  }
  if (body.ops.back().operands.at(0) != m.dot->results[0]) return std::nullopt;
  const ir::Type& a = f.type(m.load_a->results[0]);
  const ir::Type& b = f.type(m.load_b->results[0]);
  m.bm = a.shape[0];
  m.bk = a.shape[1];
  m.bn = m.b_mn_major ? b.shape[1] : b.shape[0];
  if (a.dtype != b.dtype || m.bk != 64) return std::nullopt;  // 128-byte swizzled rows
  int warpgroups = num_warps / 4;
  if (m.bm % (64 * warpgroups) != 0 || m.bn % 8 != 0 || m.bn > 256 || m.bm > 256) return std::nullopt;
  if (m.b_mn_major && m.bn % 64 != 0) return std::nullopt;  // whole 128-byte (64-element) column chunks
  if (!tma_window(f, *m.load_a, iv, body, {m.bm, m.bk}, 1)) return std::nullopt;
  if (m.b_mn_major ? !tma_window(f, *m.load_b, iv, body, {m.bk, m.bn}, 0) : !tma_window(f, *m.load_b, iv, body, {m.bn, m.bk}, 1))
    return std::nullopt;
  // the step must be the constant BK
  return m;
}

}  // namespace tilejit::jit
