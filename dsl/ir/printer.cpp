// The stable text form of the tile IR. Values are renumbered %0, %1, ... in definition order
// (parameters keep their names), attributes print sorted by key, and numbers print in their
// shortest round-trip form, so the text (and the hash taken over it) depends only on structure.
//
//   kernel @name(%A: tensor<bf16,2> {align = 16}, %n: i32) meta {BLOCK_M = 64} {
//     %0 = program_id {axis = 0} : i32
//     %3, %4 = for %5 = %0 to %1 step %2 iter(%6 = %a, %7 = %b) : f32[64,64], f32[64] { ... }
//   }
#include <fmt/format.h>

#include <charconv>
#include <unordered_map>

#include "dsl/ir/function.hpp"

namespace tilejit::ir {
namespace {

std::string number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  // keep floats recognisable as floats ("1.0", not "1")
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string attr_string(const Attr& a) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return number(v);
        else if constexpr (std::is_same_v<T, std::string>) return fmt::format("\"{}\"", v);
        else if constexpr (std::is_same_v<T, DType>) return std::string(name(v));
        else return shape_string(v);
      },
      a);
}

// Attributes that the printed result type (or inline form) already states.
bool implied_by_result(OpKind k, const std::string& key) {
  switch (k) {
    case OpKind::constant: return key == "dtype" || key == "shape" || key == "value";
    case OpKind::splat: case OpKind::broadcast: case OpKind::reshape: case OpKind::block_load: return key == "shape";
    case OpKind::cast: case OpKind::bitcast: case OpKind::unpack_pairs: return key == "dtype";
    default: return false;
  }
}

class Printer {
 public:
  Printer(const Function& f, PrintOptions o) : f_(f), opts_(o) {}

  std::string run() {
    std::string params;
    for (const Param& p : f_.params) {
      names_[p.value] = "%" + p.name;
      if (!params.empty()) params += ", ";
      params += fmt::format("%{}: {}", p.name, to_string(p.type));
      std::vector<std::string> spec;
      if (p.spec.align_bytes) spec.push_back(fmt::format("align = {}", p.spec.align_bytes));
      if (p.spec.contiguous_last) spec.push_back("contiguous");
      if (p.spec.divisible_by) spec.push_back(fmt::format("divisible_by = {}", p.spec.divisible_by));
      if (!spec.empty()) params += fmt::format(" {{{}}}", fmt::join(spec, ", "));
    }
    out_ = fmt::format("kernel @{}({})", f_.name, params);
    if (!f_.meta.empty()) {
      std::vector<std::string> m;
      for (const auto& e : f_.meta) m.push_back(fmt::format("{} = {}", e.name, to_string(e.value)));
      out_ += fmt::format(" meta {{{}}}", fmt::join(m, ", "));
    }
    out_ += " {\n";
    block(f_.body, 1);
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  const std::string& def(ValueId v) { return names_[v] = fmt::format("%{}", next_++); }
  std::string use(ValueId v) const {
    auto it = names_.find(v);
    return it == names_.end() ? fmt::format("%<undefined {}>", v) : it->second;
  }
  std::string uses(const std::vector<ValueId>& vs, size_t from = 0, size_t to = SIZE_MAX) const {
    std::vector<std::string> s;
    for (size_t i = from; i < vs.size() && i < to; ++i) s.push_back(use(vs[i]));
    return fmt::format("{}", fmt::join(s, ", "));
  }
  std::string types(const std::vector<ValueId>& vs) const {
    std::vector<std::string> s;
    for (ValueId v : vs) s.push_back(to_string(f_.type(v)));
    return fmt::format("{}", fmt::join(s, ", "));
  }
  void indent(int depth) { out_.append(static_cast<size_t>(depth) * 2, ' '); }

  void block(const Block& b, int depth) {
    for (const Op& op : b.ops) this->op(op, depth);
  }

  std::string results(const Op& op) {
    if (op.results.empty()) return "";
    std::vector<std::string> r;
    for (ValueId v : op.results) r.push_back(def(v));
    return fmt::format("{} = ", fmt::join(r, ", "));
  }

  void op(const Op& op, int depth) {
    indent(depth);
    if (op.kind == OpKind::for_) return for_op(op, depth);
    if (op.kind == OpKind::if_) return if_op(op, depth);
    if (op.kind == OpKind::warp_roles) return roles_op(op, depth);
    std::string line = results(op) + std::string(op_name(op.kind));
    if (op.kind == OpKind::constant) {
      const Attr& v = op.attrs.at("value");
      line += " " + attr_string(v);
    }
    if (!op.operands.empty()) line += " " + uses(op.operands);
    std::vector<std::string> attrs;
    for (const auto& [k, v] : op.attrs)
      if (!implied_by_result(op.kind, k)) attrs.push_back(fmt::format("{} = {}", k, attr_string(v)));
    if (!attrs.empty()) line += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
    if (!op.results.empty()) line += " : " + types(op.results);
    if (opts_.locations) line += fmt::format("  loc({})", op.loc.str());
    if (op.kind == OpKind::scan || op.kind == OpKind::reduce_with) return combine_region(op, line, depth);
    out_ += line + "\n";
  }

  void combine_region(const Op& op, const std::string& line, int depth) {
    const Block& body = op.regions.at(0);
    std::vector<std::string> args;
    for (ValueId a : body.args) args.push_back(def(a));
    out_ += fmt::format("{} combine({}) {{\n", line, fmt::join(args, ", "));
    block(body, depth + 1);
    indent(depth);
    out_ += "}\n";
  }

  void for_op(const Op& op, int depth) {
    std::string line = results(op);
    const Block& body = op.regions.at(0);
    line += fmt::format("for {} = {} to {} step {}", def(body.args.at(0)), use(op.operands[0]), use(op.operands[1]),
                        use(op.operands[2]));
    if (body.args.size() > 1) {
      std::vector<std::string> it;
      for (size_t i = 1; i < body.args.size(); ++i) it.push_back(fmt::format("{} = {}", def(body.args[i]), use(op.operands[i + 2])));
      line += fmt::format(" iter({}) : {}", fmt::join(it, ", "), types(op.results));
    }
    if (opts_.locations) line += fmt::format("  loc({})", op.loc.str());
    out_ += line + " {\n";
    block(body, depth + 1);
    indent(depth);
    out_ += "}\n";
  }

  void if_op(const Op& op, int depth) {
    std::string line = results(op) + "if " + use(op.operands.at(0));
    if (!op.results.empty()) line += " : " + types(op.results);
    if (opts_.locations) line += fmt::format("  loc({})", op.loc.str());
    out_ += line + " {\n";
    block(op.regions.at(0), depth + 1);
    indent(depth);
    out_ += "} else {\n";
    block(op.regions.at(1), depth + 1);
    indent(depth);
    out_ += "}\n";
  }

  void roles_op(const Op& op, int depth) {
    const auto& warps = op.ints_attr("warps");
    const auto& regs = op.ints_attr("max_registers");
    std::string line = "warp_roles";
    if (opts_.locations) line += fmt::format("  loc({})", op.loc.str());
    out_ += line + " {\n";
    for (size_t i = 0; i < op.regions.size(); ++i) {
      indent(depth);
      out_ += fmt::format("role {} {{warps = {}, max_registers = {}}}:\n", i, warps.at(i), regs.at(i));
      block(op.regions[i], depth + 1);
    }
    indent(depth);
    out_ += "}\n";
  }

  const Function& f_;
  PrintOptions opts_;
  std::unordered_map<ValueId, std::string> names_;  // lookup only; never iterated
  int next_ = 0;
  std::string out_;
};

}  // namespace

std::string print(const Function& f, PrintOptions opts) { return Printer(f, opts).run(); }

}  // namespace tilejit::ir
