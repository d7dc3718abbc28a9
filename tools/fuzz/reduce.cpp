#include "tools/fuzz/reduce.hpp"

#include <chrono>

#include "tools/fuzz/emitter.hpp"
#include "tools/fuzz/pool.hpp"

namespace tilejit::fuzz {
namespace {

bool has_effect(NodeKind k) { return k == NodeKind::Store || k == NodeKind::AtomicAdd || k == NodeKind::AtomicBlock; }

bool pure_value(NodeKind k) {
  return !has_effect(k) && !is_marker(k) && k != NodeKind::VarDecl && k != NodeKind::VarAssign;
}

// The index of the marker that closes the block opened at `begin` (LoopEnd, or IfElse/IfEnd).
size_t matching(const Program& p, size_t begin, NodeKind want) {
  int depth = 0;
  for (size_t i = begin + 1; i < p.nodes.size(); ++i) {
    NodeKind k = p.nodes[i].kind;
    if (p.nodes[i].removed) continue;
    if (k == NodeKind::LoopBegin || k == NodeKind::IfBegin) ++depth;
    else if (depth == 0 && k == want) return i;
    else if (k == NodeKind::LoopEnd || k == NodeKind::IfEnd) --depth;
  }
  return p.nodes.size();
}

bool used(const Program& p, size_t i) {
  for (const Node& n : p.nodes)
    if (!n.removed)
      for (int a : n.args)
        if (a == static_cast<int>(i)) return true;
  return false;
}

bool var_used(const Program& p, int var, bool reads_only) {
  for (const Node& n : p.nodes)
    if (!n.removed && n.var == var && (n.kind == NodeKind::VarRead || (!reads_only && n.kind == NodeKind::VarAssign)))
      return true;
  return false;
}

bool live_between(const Program& p, size_t a, size_t b) {
  for (size_t i = a + 1; i < b; ++i)
    if (!p.nodes[i].removed && !is_marker(p.nodes[i].kind)) return true;
  return false;
}

// Removes what nothing uses: values without users, Vars never read, empty loops and ifs.
void dead_code(Program& p) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = p.nodes.size(); i-- > 0;) {
      Node& n = p.nodes[i];
      if (n.removed) continue;
      bool dead = false;
      if (pure_value(n.kind)) dead = !used(p, i);
      else if (n.kind == NodeKind::VarAssign) dead = !var_used(p, n.var, true);
      else if (n.kind == NodeKind::VarDecl) dead = !used(p, i) && !var_used(p, n.var, false);
      else if (n.kind == NodeKind::LoopBegin) {
        size_t e = matching(p, i, NodeKind::LoopEnd);
        if (e < p.nodes.size() && !live_between(p, i, e)) {
          p.nodes[e].removed = true;
          dead = true;
        }
      } else if (n.kind == NodeKind::IfBegin) {
        size_t m = matching(p, i, NodeKind::IfElse), e = m < p.nodes.size() ? matching(p, m, NodeKind::IfEnd) : m;
        if (e < p.nodes.size() && !live_between(p, i, e)) {
          p.nodes[m].removed = p.nodes[e].removed = true;
          dead = true;
        }
      }
      if (dead) {
        n.removed = true;
        changed = true;
      }
    }
  }
}

void redirect(Program& p, size_t from, int to) {
  for (Node& n : p.nodes)
    for (int& a : n.args)
      if (a == static_cast<int>(from)) a = to;
}

// Candidate edits of `p`, smallest-effect last; each is a whole program (without what nothing
// uses when `prune`).
std::vector<Program> candidates(const Program& p, bool prune) {
  std::vector<Program> out;
  auto edit = [&](auto f) {
    Program q = p;
    if (f(q)) {
      if (prune) dead_code(q);
      out.push_back(std::move(q));
    }
  };
  int effects = 0;
  for (const Node& n : p.nodes) effects += !n.removed && has_effect(n.kind);
  if (p.programs > 1) edit([](Program& q) {
      for (auto& t : q.tensors)
        if (t.output && t.shape.size() == 3) t.shape[0] = 1;
      q.programs = 1;
      return true;
    });
  for (size_t i = p.nodes.size(); i-- > 0;) {
    const Node& n = p.nodes[i];
    if (n.removed) continue;
    if ((has_effect(n.kind) && effects > 1) || n.kind == NodeKind::VarAssign)
      edit([&](Program& q) { return q.nodes[i].removed = true; });
    if (n.kind == NodeKind::LoopBegin) {
      edit([&](Program& q) {  // the body once, at the lower bound
        size_t e = matching(q, i, NodeKind::LoopEnd);
        if (e >= q.nodes.size()) return false;
        redirect(q, i, q.nodes[i].args[0]);
        q.nodes[i].removed = q.nodes[e].removed = true;
        return true;
      });
    }
    if (n.kind == NodeKind::IfBegin) {
      for (int keep = 0; keep < 2; ++keep)
        edit([&](Program& q) {
          size_t m = matching(q, i, NodeKind::IfElse), e = m < q.nodes.size() ? matching(q, m, NodeKind::IfEnd) : m;
          if (e >= q.nodes.size()) return false;
          size_t a = keep == 0 ? m : i, b = keep == 0 ? e : m;  // the branch to drop: (a, b)
          for (size_t k = a + 1; k < b; ++k) q.nodes[k].removed = true;
          q.nodes[i].removed = q.nodes[m].removed = q.nodes[e].removed = true;
          return true;
        });
    }
    if (pure_value(n.kind) && n.kind != NodeKind::Constant && !ir::is_fp8(n.dtype)) {
      edit([&](Program& q) {
        Node& m = q.nodes[i];
        m.kind = NodeKind::Constant;
        m.args.clear();
        m.value = 1;
        m.ivalue = 1;
        return true;
      });
      for (int a : n.args) {
        const Node& an = p.nodes[static_cast<size_t>(a)];
        if (an.dtype == n.dtype && an.shape == n.shape && an.kind != NodeKind::LoopBegin)
          edit([&](Program& q) {
            redirect(q, i, a);
            q.nodes[i].removed = true;
            return true;
          });
      }
    }
  }
  return out;
}

}  // namespace

Program reduce(const Program& failing, const Outcome& failure, const EvalOptions& eval, double timeout_s, double budget_s,
               int* evaluations) {
  const auto t0 = std::chrono::steady_clock::now();
  auto left = [&] { return budget_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const std::string want = failure.signature();
  Program best = failing;
  dead_code(best);
  int tries = 1;
  // Values nothing uses can matter (seed 14438 of --tma-stores: the compiler keeps a dot in a loop
  // whose result nothing uses, and its tiles' ring makes the program refused for shared memory):
  // then the reduction keeps them.
  const bool prune = run_isolated(best, eval, timeout_s).signature() == want;
  if (!prune) best = failing;
  for (bool progress = true; progress && left() > 0;) {
    progress = false;
    for (Program& c : candidates(best, prune)) {
      if (left() <= 0) break;
      ++tries;
      if (run_isolated(c, eval, timeout_s).signature() == want) {
        best = std::move(c);
        progress = true;
        break;
      }
    }
  }
  if (evaluations) *evaluations = tries;
  return best;
}

}  // namespace tilejit::fuzz
