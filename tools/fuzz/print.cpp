// A Program written back as the C++ a user would have written, so that a reduced failure reads as
// a test case.
#include <fmt/format.h>

#include <array>

#include <cmath>

#include "dsl/ir/op.hpp"
#include "tools/fuzz/emitter.hpp"

namespace tilejit::fuzz {
namespace {

std::string float_literal(double v) {
  if (std::isnan(v)) return "NAN";
  if (std::isinf(v)) return v > 0 ? "INFINITY" : "-INFINITY";
  if (v == 0 && std::signbit(v)) return "-0.0";
  return fmt::format("{:a}", v);
}

std::string literal(DType d, double v, int64_t iv) {
  if (d == DType::i1) return iv ? "true" : "false";
  if (ir::is_float(d)) return float_literal(v);
  if (d == DType::u64) return fmt::format("uint64_t{{{}u}}", static_cast<uint64_t>(iv));
  return fmt::format("int64_t{{{}}}", iv);
}

std::string shape(const Shape& s) {
  std::string r = "{";
  for (size_t i = 0; i < s.size(); ++i) r += fmt::format("{}{}", i ? ", " : "", s[i]);
  return r + "}";
}

const char* fill_name(Fill f) {
  switch (f) {
    case Fill::SmallInts: return "small integers";
    case Fill::Normal: return "normal";
    case Fill::Specials: return "special values";
    case Fill::Bits: return "random bits";
  }
  return "?";
}

std::string expression(const Program& p, const Node& n) {
  auto a = [&](size_t k) { return fmt::format("v{}", n.args.at(k)); };
  switch (n.kind) {
    case NodeKind::Scalar: return fmt::format("s{}", n.ivalue);
    case NodeKind::Constant:
      return n.shape.empty() ? fmt::format("scalar_constant({}, {})", ir::name(n.dtype), literal(n.dtype, n.value, n.ivalue))
                             : fmt::format("full({}, {}, {})", ir::name(n.dtype), shape(n.shape), literal(n.dtype, n.value, n.ivalue));
    case NodeKind::Arange: return fmt::format("arange(0, {}){}", n.ivalue, n.sub == 1 ? "[col]" : n.sub == 2 ? "[row]" : "");
    case NodeKind::ProgramId: return "program_id(0)";
    case NodeKind::LoadPtr: {
      DType d = p.tensors.at(static_cast<size_t>(n.tensor)).dtype;
      return fmt::format("load_rows_cols(T{}, {}, {}, {}, {}, /*other=*/{})", n.tensor, a(0), a(1), n.shape[0], n.shape[1],
                         literal(d, n.value, n.ivalue));
    }
    case NodeKind::LoadBlock:
      return fmt::format("load(T{}.block({{{}, {}}}, {}), /*padding=*/{})", n.tensor, a(0), a(1), shape(n.shape),
                         float_literal(n.value));
    case NodeKind::LoadOutput:
      return fmt::format("load(T{}.block({{program_id(0), {}, {}}}, {}, {{1, 2}}), /*padding=*/0)", n.tensor, a(0), a(1),
                         shape(n.shape));
    case NodeKind::Unary:
      if (static_cast<ir::OpKind>(n.sub) == ir::OpKind::neg) return fmt::format("-{}", a(0));
      if (static_cast<ir::OpKind>(n.sub) == ir::OpKind::bit_not) return fmt::format("~{}", a(0));
      return fmt::format("{}({})", ir::op_name(static_cast<ir::OpKind>(n.sub)), a(0));
    case NodeKind::Binary: {
      auto k = static_cast<ir::OpKind>(n.sub);
      static const char* preds[] = {"==", "!=", "<", "<=", ">", ">="};
      switch (k) {
        case ir::OpKind::add: return fmt::format("{} + {}", a(0), a(1));
        case ir::OpKind::sub: return fmt::format("{} - {}", a(0), a(1));
        case ir::OpKind::mul: return n.ivalue != 0 ? fmt::format("scale_lazily({}, {})", a(0), a(1)) : fmt::format("{} * {}", a(0), a(1));
        case ir::OpKind::div: return fmt::format("{} / {}", a(0), a(1));
        case ir::OpKind::rem: return fmt::format("{} % {}", a(0), a(1));
        case ir::OpKind::bit_and: return fmt::format("{} & {}", a(0), a(1));
        case ir::OpKind::bit_or: return fmt::format("{} | {}", a(0), a(1));
        case ir::OpKind::bit_xor: return fmt::format("{} ^ {}", a(0), a(1));
        case ir::OpKind::shl: return fmt::format("{} << {}", a(0), a(1));
        case ir::OpKind::shr: return fmt::format("{} >> {}", a(0), a(1));
        case ir::OpKind::cmp: return fmt::format("{} {} {}", a(0), preds[n.ivalue], a(1));
        default: return fmt::format("{}({}, {})", ir::op_name(k), a(0), a(1));
      }
    }
    case NodeKind::Select: return fmt::format("where({}, {}, {})", a(0), a(1), a(2));
    case NodeKind::Fma: return fmt::format("fma({}, {}, {})", a(0), a(1), a(2));
    case NodeKind::Cast: return fmt::format("cast({}, {})", ir::name(n.dtype), a(0));
    case NodeKind::Bitcast: return fmt::format("bitcast({}, {})", ir::name(n.dtype), a(0));
    case NodeKind::Broadcast:
      return fmt::format("broadcast_to({}{}, {})", a(0), n.sub == 1 ? "[col]" : n.sub == 2 ? "[row]" : "", shape(n.shape));
    case NodeKind::Trans: return fmt::format("trans({})", a(0));
    case NodeKind::Reduce: {
      const char* k = n.sub == 0 ? "sum" : n.sub == 1 ? "max" : "min";
      return n.ivalue < 0 ? fmt::format("{}({})", k, a(0)) : fmt::format("{}({}, {})", k, a(0), n.ivalue);
    }
    case NodeKind::Scan:
    case NodeKind::ReduceWith: {
      static const char* const combines[] = {"a + b", "maximum(a, b)", "minimum(a, b)", "a", "b"};
      const std::string fn = fmt::format("[](const Tile& a, const Tile& b) {{ return {}; }}", combines[n.sub]);
      if (n.kind == NodeKind::Scan) return fmt::format("associative_scan({}, {}, {}, {})", a(0), n.ivalue, fn, n.value != 0);
      return fmt::format("reduce({}, {}, {})", a(0), n.ivalue, fn);
    }
    case NodeKind::XorPermute: return fmt::format("xor_permute({}, {}, {})", a(0), n.ivalue, n.sub);
    case NodeKind::Histogram: return fmt::format("histogram({}, {})", a(0), int64_t{1} << n.sub);
    case NodeKind::Gather:
      return fmt::format("gather({0}, cast(i32, {1}) & ({0}.shape()[{2}] - 1), {2})", a(0), a(1), n.ivalue);
    case NodeKind::Dot: {
      const char* hint = n.ivalue ? ", {.descriptors_at_use = true}" : "";
      return n.args.size() == 3 ? fmt::format("dot({}, {}, {}{})", a(0), a(1), a(2), hint) : fmt::format("dot({}, {}{})", a(0), a(1), hint);
    }
    case NodeKind::PackPairs: return fmt::format("pack_pairs({})", a(0));
    case NodeKind::UnpackPairs: return fmt::format("unpack_pairs({}, {})", ir::name(n.dtype), a(0));
    case NodeKind::VarRead: return fmt::format("x{}.value()", n.var);
    case NodeKind::AtomicAdd: return fmt::format("atomic_add(rows_cols_of_program(T{}), {})", n.tensor, a(0));
    default: return "?";
  }
}

}  // namespace

std::string to_cpp(const Program& p) {
  std::string s = fmt::format("// fuzz seed {}: grid {{{}}}, num_warps {}, main tile [{}, {}]\n", p.seed, p.programs, p.num_warps,
                              p.R, p.C);
  s += "// load_rows_cols(T, r, c, R, C, other): load(T.ptr() + rows[col] * T.stride(0) + cols[row] * T.stride(1), rows/cols inside T, other)\n";
  s += "//   with rows = r + arange(0, R), cols = c + arange(0, C); rows_cols_of_program(O): the pointers of O[program_id(0)]\n";
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const TensorSpec& t = p.tensors[i];
    s += fmt::format("//   T{}: {}{} {}{}{}\n", i, ir::name(t.dtype), shape(t.shape),
                     t.output && !t.accumulator ? "output (poisoned)" : fill_name(t.fill),
                     t.accumulator ? " accumulator" : "", t.contiguous ? fmt::format(" contiguous_last align {}", t.align) : "");
  }
  for (size_t i = 0; i < p.scalars.size(); ++i) {
    const ScalarParam& sp = p.scalars[i];
    s += fmt::format("//   s{}: {} = {}\n", i, ir::name(sp.dtype), literal(sp.dtype, sp.fvalue, sp.ivalue));
  }
  s += "auto fuzz = kernel(\"fuzz\", [](Builder& b) {\n";
  for (size_t i = 0; i < p.tensors.size(); ++i)
    s += fmt::format("  auto T{} = b.tensor(\"T{}\", {}, {}{});\n", i, i, ir::name(p.tensors[i].dtype), p.tensors[i].shape.size(),
                     p.tensors[i].contiguous ? fmt::format(", {{.align_bytes = {}, .contiguous_last = true}}", p.tensors[i].align) : "");
  for (size_t i = 0; i < p.scalars.size(); ++i) s += fmt::format("  auto s{} = b.scalar(\"s{}\", {});\n", i, i, ir::name(p.scalars[i].dtype));
  std::string indent = "  ";
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const Node& n = p.nodes[i];
    if (n.removed) continue;
    auto a = [&](size_t k) { return fmt::format("v{}", n.args.at(k)); };
    switch (n.kind) {
      case NodeKind::LoopBegin:
        s += fmt::format("{}for_range({}, {}, {}, [&](Tile v{}) {{\n", indent, a(0), a(1), n.ivalue, i);
        indent += "  ";
        break;
      case NodeKind::IfBegin:
        s += fmt::format("{}if_({}, [&] {{\n", indent, a(0));
        indent += "  ";
        break;
      case NodeKind::IfElse: s += fmt::format("{}}}, [&] {{\n", indent.substr(2)); break;
      case NodeKind::LoopEnd:
      case NodeKind::IfEnd:
        indent = indent.substr(2);
        s += fmt::format("{}}});\n", indent);
        break;
      case NodeKind::VarDecl: s += fmt::format("{}Var x{} = {};  // v{}\n", indent, n.var, a(0), i); break;
      case NodeKind::VarAssign: s += fmt::format("{}x{} = {};\n", indent, n.var, a(0)); break;
      case NodeKind::Store:
        if (n.sub == 1 || n.sub == 3)
          s += fmt::format("{}store(T{}.block({{program_id(0), {}, {}}}, {{{}, {}}}, {{1, 2}}), {}{});\n", indent, n.tensor, a(1), a(2), p.R, p.C,
                           a(0), p.tma_stores && n.sub == 1 ? (n.ivalue ? ", {.tma = true, .offsets_at_store = true}" : ", {.tma = true}") : "");
        else if (n.sub == 2) s += fmt::format("{}store(rows_cols_of_program(T{}), {}, /*mask=*/{});\n", indent, n.tensor, a(0), a(1));
        else s += fmt::format("{}store(rows_cols_of_program(T{}), {});\n", indent, n.tensor, a(0));
        break;
      case NodeKind::AtomicBlock:
        s += fmt::format("{}atomic_{}(T{}.block({{{}, {}}}, {{{}, {}}}), {});\n", indent,
                         std::array{"add", "max", "min", "and", "or", "xor"}.at(static_cast<size_t>(n.sub)), n.tensor, a(1), a(2), p.R, p.C, a(0));
        break;
      default:
        s += fmt::format("{}Tile v{} = {};  // {}{}{}\n", indent, i, expression(p, n), ir::name(n.dtype), shape(n.shape),
                         n.exact ? "" : " (approximate)");
    }
  }
  s += "});\n";
  return s;
}

}  // namespace tilejit::fuzz
