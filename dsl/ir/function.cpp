// Function value table and the structural walkers shared by all passes.
#include "dsl/ir/function.hpp"

#include <fmt/format.h>

namespace tilejit::ir {

std::string to_string(const MetaValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return std::string(name(std::get<DType>(v)));
}

ValueId Function::new_value(Type t, std::string name_hint) {
  values.push_back({std::move(t), std::move(name_hint)});
  return static_cast<ValueId>(values.size() - 1);
}

std::string gpu_shape_violation(const Function& f) {
  std::string found;
  walk(f.body, [&](const Op& op) {
    if (!found.empty()) return;
    for (ValueId r : op.results) {
      const Type& t = f.type(r);
      if (t.kind != TypeKind::Value) continue;
      for (int64_t d : t.shape)
        if (d < 1 || (d & (d - 1)) != 0) {
          found = fmt::format("{} at {}: tile dimensions must be powers of two for the GPU backend, got {}", op_name(op.kind),
                              op.loc.str(), to_string(t));
          return;
        }
    }
  });
  return found;
}

std::string size_relation_error(const Function& f, const SizeRelation& r, int64_t a_size, int64_t b_size) {
  if (a_size == b_size) return {};
  return fmt::format("kernel '{}': argument {} '{}' has size {} in dim {} but argument {} '{}' has size {} in dim {}: the kernel "
                     "requires them equal{}",
                     f.name, r.b, f.params.at(r.b).name, b_size, r.b_dim, r.a, f.params.at(r.a).name, a_size, r.a_dim,
                     r.why.empty() ? "" : fmt::format(" ({})", r.why));
}

const Param* Function::find_param(std::string_view n) const {
  for (const auto& p : params)
    if (p.name == n) return &p;
  return nullptr;
}

const MetaEntry* Function::find_meta(std::string_view n) const {
  for (const auto& m : meta)
    if (m.name == n) return &m;
  return nullptr;
}

void walk(Block& b, const std::function<void(Op&)>& fn) {
  for (Op& op : b.ops) {
    fn(op);
    for (Block& r : op.regions) walk(r, fn);
  }
}

void walk(const Block& b, const std::function<void(const Op&)>& fn) {
  for (const Op& op : b.ops) {
    fn(op);
    for (const Block& r : op.regions) walk(r, fn);
  }
}

void replace_all_uses(Block& b, ValueId from, ValueId to) {
  walk(b, [&](Op& op) {
    for (ValueId& v : op.operands)
      if (v == from) v = to;
  });
}

}  // namespace tilejit::ir
