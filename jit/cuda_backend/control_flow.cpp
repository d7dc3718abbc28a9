// Control flow: for loops with carried values, and ifs with results (the regions' yields).
#include "jit/cuda_backend/printer.hpp"

namespace tilejit::jit::cuda_backend {

const pir::Inst* Printer::yield_of(const pir::Block& b) {
  return !b.insts.empty() && b.insts.back().op == Op::yield ? &b.insts.back() : nullptr;
}
void Printer::region_body(const pir::Block& b) {
  for (const pir::Inst& in : b.insts)
    if (in.op != Op::yield) inst(in);
}

void Printer::for_loop(const pir::Inst& in) {
  if (in.regions.size() != 1) fail("for has one region");
  const pir::Block& body = in.regions[0];
  if (in.args.size() < 3 || body.args.size() != in.args.size() - 2 || in.results.size() != body.args.size() - 1)
    fail(fmt::format("for: {} operands, {} region arguments and {} results do not match (expected lb, ub, step, init... / iv, "
                     "carried... / results...)", in.args.size(), body.args.size(), in.results.size()));
  const pir::Inst* y = yield_of(body);
  const size_t nc = in.results.size();
  if ((y ? y->args.size() : 0) != nc) fail(fmt::format("for: the body yields {} values for {} carried ones", y ? y->args.size() : 0, nc));
  V iv = body.args[0];
  DType id = dt(iv);
  if (ty(iv).ptr || ir::is_float(id) || id == DType::i1) fail("for: the induction variable must be an integer");
  // Carried values live in the enclosing scope so that the results can read them after the loop.
  for (size_t i = 0; i < nc; ++i) def(body.args[i + 1], n(in.args[i + 3]));
  const std::string lb = n(in.args[0]), ub = n(in.args[1]), step = n(in.args[2]);
  const char* S = sexact(id);
  const char* U = uwide(id);
  // Signed comparison and wrapping increment, as the LLVM backend's loop header and latch.
  line(fmt::format("for ({0} v{1} = {2}; ({3})v{1} < ({3}){4}; v{1} = ({0})(({5})v{1} + ({5}){6})) {{", scalar_ctype(id), iv, lb, S,
                   ub, U, step));
  ++depth_;
  open_scope();
  mark(iv);
  region_body(body);
  // Every yield reads the values of this iteration: go through temporaries where a yield reads a
  // carried value that an earlier assignment would overwrite.
  bool direct = true;
  for (size_t i = 0; i < nc && direct; ++i)
    for (size_t j = 0; j < nc; ++j)
      if (y->args[i] == body.args[j + 1] && j != i) direct = false;
  if (direct) {
    for (size_t i = 0; i < nc; ++i)
      if (y->args[i] != body.args[i + 1]) line(fmt::format("v{} = {};", body.args[i + 1], n(y->args[i])));
  } else {
    line("{");
    ++depth_;
    for (size_t i = 0; i < nc; ++i) line(fmt::format("{} t{} = {};", ctype(ty(body.args[i + 1])), i, n(y->args[i])));
    for (size_t i = 0; i < nc; ++i) line(fmt::format("v{} = t{};", body.args[i + 1], i));
    --depth_;
    line("}");
  }
  close_scope();
  --depth_;
  line("}");
  for (size_t i = 0; i < nc; ++i) {
    if (ty(in.results[i]) != ty(body.args[i + 1])) fail("for: a result's type differs from its carried value's");
    def(in.results[i], n(body.args[i + 1]));
  }
}

void Printer::if_op(const pir::Inst& in) {
  check_args(in, 1, 1);
  if (in.regions.size() != 2) fail("if has two regions (then, else)");
  for (V r : in.results) declare(r);
  for (int side = 0; side < 2; ++side) {
    const pir::Block& b = in.regions[static_cast<size_t>(side)];
    const pir::Inst* y = yield_of(b);
    if ((y ? y->args.size() : 0) != in.results.size())
      fail(fmt::format("if: the {} region yields {} values for {} results", side == 0 ? "then" : "else", y ? y->args.size() : 0,
                       in.results.size()));
    line(side == 0 ? fmt::format("if ({}) {{", n(in.args[0])) : std::string("} else {"));
    ++depth_;
    open_scope();
    region_body(b);
    for (size_t i = 0; i < in.results.size(); ++i) line(fmt::format("v{} = {};", in.results[i], n(y->args[i])));
    close_scope();
    --depth_;
  }
  line("}");
}

}  // namespace tilejit::jit::cuda_backend
