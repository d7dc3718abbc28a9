#include "dsl/ir/address_sources.hpp"

#include <vector>

namespace tilejit::ir {

namespace {

bool carries_address(const Type& t) { return t.is_pointer() || t.is_tensor(); }

// Adds `from` to `into`; returns whether `into` grew.
bool merge(std::set<size_t>& into, const std::set<size_t>& from) {
  const size_t before = into.size();
  into.insert(from.begin(), from.end());
  return into.size() != before;
}

void collect_yields(const Op& op, std::vector<ValueId>& out) {
  for (const Block& b : op.regions)
    for (const Op& inner : b.ops)
      if (inner.kind == OpKind::yield) out.insert(out.end(), inner.operands.begin(), inner.operands.end());
}

}  // namespace

AddressSources address_sources(const Function& f) {
  AddressSources sources;
  for (size_t i = 0; i < f.params.size(); ++i)
    if (carries_address(f.params[i].type)) sources[f.params[i].value].insert(i);
  auto of = [&](ValueId v) -> const std::set<size_t>* {
    auto it = sources.find(v);
    return it == sources.end() ? nullptr : &it->second;
  };
  // a fixpoint, because a loop's yield feeds its own block arguments
  for (bool changed = true; changed;) {
    changed = false;
    walk(f.body, [&](const Op& op) {
      std::set<size_t> in;
      for (ValueId v : op.operands)
        if (const std::set<size_t>* s = of(v)) in.insert(s->begin(), s->end());
      std::vector<ValueId> targets = op.results;
      if (!op.regions.empty()) {
        std::vector<ValueId> yielded;
        collect_yields(op, yielded);
        for (ValueId v : yielded)
          if (const std::set<size_t>* s = of(v)) in.insert(s->begin(), s->end());
        for (const Block& b : op.regions) targets.insert(targets.end(), b.args.begin(), b.args.end());
      }
      if (in.empty()) return;
      for (ValueId r : targets)
        if (carries_address(f.type(r))) changed = merge(sources[r], in) || changed;
    });
  }
  return sources;
}

}  // namespace tilejit::ir
