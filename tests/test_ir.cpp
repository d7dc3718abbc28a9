// Tile IR: golden printed text, verifier rejections of malformed IR, and the structural hash
// (stable for identical kernels, different for any structural change, independent of value ids).
#include <doctest/doctest.h>

#include <map>

#include "dsl/lang.hpp"

using namespace tilejit::lang;
namespace ir = tilejit::ir;

namespace {

Kernel scale_rows = kernel("scale_rows", [](Builder& k) {
  auto BLOCK = k.meta<int>("BLOCK", 16);
  auto X = k.pointer("X", f32, {.align_bytes = 16});
  auto n = k.scalar<int>("n");
  auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
  auto mask = offs < n;
  Var acc = zeros(f32, {BLOCK});
  for_range(0, 3, [&](Tile) { acc = acc + load(X + offs, mask); });
  store(X + offs, acc * 0.5f, mask);
});

const char* kGolden = R"(kernel @scale_rows(%X: ptr<f32> {align = 16}, %n: i32) meta {BLOCK = 16} {
  %0 = arange {end = 16, start = 0} : i32[16]
  %1 = program_id {axis = 0} : i32
  %2 = constant 16 : i32
  %3 = mul %1, %2 : i32
  %4 = splat %3 : i32[16]
  %5 = add %4, %0 : i32[16]
  %6 = splat %n : i32[16]
  %7 = cmp %5, %6 {pred = "lt"} : i1[16]
  %8 = constant 0.0 : f32[16]
  %9 = constant 0 : i32
  %10 = constant 3 : i32
  %11 = constant 1 : i32
  %12 = for %13 = %9 to %10 step %11 iter(%14 = %8) : f32[16] {
    %15 = splat %X : ptr<f32>[16]
    %16 = addptr %15, %5 : ptr<f32>[16]
    %17 = constant 0.0 : f32[16]
    %18 = load %16, %7, %17 : f32[16]
    %19 = add %14, %18 : f32[16]
    yield %19
  }
  %20 = constant 0.5 : f32[16]
  %21 = mul %12, %20 : f32[16]
  %22 = splat %X : ptr<f32>[16]
  %23 = addptr %22, %5 : ptr<f32>[16]
  store %23, %21, %7
}
)";

// Note: C++ leaves the evaluation order of operands unspecified, so the order of independent ops
// (here arange before program_id) is the compiler's; the text is stable for a given build.

// Build a copy of `f` whose value ids are renumbered (reversed, with gaps): the text and hash
// must not change, since they may depend only on structure.
ir::Function renumbered(const ir::Function& f) {
  ir::Function g = f;
  std::map<ir::ValueId, ir::ValueId> remap;
  size_t n = f.values.size();
  g.values.assign(2 * n + 1, {});
  for (ir::ValueId v = 0; v < n; ++v) {
    remap[v] = static_cast<ir::ValueId>(2 * (n - v));
    g.values[remap[v]] = f.values[v];
  }
  auto fix = [&](ir::ValueId& v) { v = remap.at(v); };
  for (auto& p : g.params) fix(p.value);
  std::function<void(ir::Block&)> fix_block = [&](ir::Block& b) {
    for (auto& a : b.args) fix(a);
    for (auto& op : b.ops) {
      for (auto& v : op.operands) fix(v);
      for (auto& v : op.results) fix(v);
      for (auto& r : op.regions) fix_block(r);
    }
  };
  fix_block(g.body);
  return g;
}

}  // namespace

TEST_CASE("printer: golden text of a kernel with a loop-carried Var") {
  auto fn = scale_rows.build();
  CHECK(ir::print(fn) == kGolden);
}

TEST_CASE("printer: locations are printed only on request and name this file") {
  auto fn = scale_rows.build();
  CHECK(ir::print(fn).find("loc(") == std::string::npos);
  CHECK(ir::print(fn, {.locations = true}).find("test_ir.cpp:") != std::string::npos);
}

TEST_CASE("hash: identical kernels built twice hash equal; value numbering does not matter") {
  auto a = scale_rows.build();
  auto b = scale_rows.build();
  CHECK(ir::structural_hash(a) == ir::structural_hash(b));
  CHECK(ir::structural_hash(a).size() == 64);
  auto c = renumbered(a);
  ir::verify(c);
  CHECK(ir::print(c) == ir::print(a));
  CHECK(ir::structural_hash(c) == ir::structural_hash(a));
}

TEST_CASE("hash: a one-constant change, a meta change or a renamed parameter changes the hash") {
  auto base = scale_rows.build();
  auto meta = scale_rows.build({{"BLOCK", 32}});
  CHECK(ir::structural_hash(base) != ir::structural_hash(meta));

  auto other_constant = kernel("scale_rows", [](Builder& k) {
    auto BLOCK = k.meta<int>("BLOCK", 16);
    auto X = k.pointer("X", f32, {.align_bytes = 16});
    auto n = k.scalar<int>("n");
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto mask = offs < n;
    Var acc = zeros(f32, {BLOCK});
    for_range(0, 3, [&](Tile) { acc = acc + load(X + offs, mask); });
    store(X + offs, acc * 0.25f, mask);  // 0.5 -> 0.25
  }).build();
  CHECK(ir::structural_hash(base) != ir::structural_hash(other_constant));

  auto g = base;
  g.params[0].name = "Y";
  CHECK(ir::structural_hash(base) != ir::structural_hash(g));
  auto h = base;
  h.params[0].spec.align_bytes = 32;
  CHECK(ir::structural_hash(base) != ir::structural_hash(h));
}

TEST_CASE("verifier: accepts what the DSL builds") {
  CHECK_NOTHROW(ir::verify(scale_rows.build()));
}

namespace {
// A minimal valid function: one f32 pointer parameter, and ops appended by each test.
ir::Function skeleton() {
  ir::Function f;
  f.name = "hand_built";
  ir::ValueId p = f.new_value(ir::Type::pointer(DType::f32), "P");
  f.params.push_back({"P", ir::ParamKind::Pointer, ir::Type::pointer(DType::f32), p, {}});
  f.body.args.push_back(p);
  return f;
}
ir::Op make(ir::OpKind k, std::vector<ir::ValueId> in, std::vector<ir::ValueId> out, ir::AttrMap attrs = {}) {
  ir::Op op;
  op.kind = k;
  op.operands = std::move(in);
  op.results = std::move(out);
  op.attrs = std::move(attrs);
  return op;
}
ir::AttrMap const_attrs(double v, DType d, ir::Shape s) { return {{"value", v}, {"dtype", d}, {"shape", s}}; }

void check_rejects(const ir::Function& f, const std::string& phrase) {
  try {
    ir::verify(f);
    FAIL("verify accepted malformed IR, expected: " << phrase);
  } catch (const ir::VerifyError& e) {
    std::string msg = e.what();
    CHECK_MESSAGE(msg.find(phrase) != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("hand_built") != std::string::npos, msg);
  }
}
}  // namespace

TEST_CASE("verifier: rejects a use before definition") {
  auto f = skeleton();
  ir::ValueId a = f.new_value(ir::Type::tile(DType::f32, {4}));
  ir::ValueId b = f.new_value(ir::Type::tile(DType::f32, {4}));
  f.body.ops.push_back(make(ir::OpKind::add, {a, a}, {b}));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {a}, const_attrs(1.0, DType::f32, {4})));
  check_rejects(f, "not defined before it");
}

TEST_CASE("verifier: rejects a result type that breaks the op's type rule") {
  auto f = skeleton();
  ir::ValueId a = f.new_value(ir::Type::tile(DType::f32, {4}));
  ir::ValueId b = f.new_value(ir::Type::tile(DType::f16, {4}));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {a}, const_attrs(1.0, DType::f32, {4})));
  f.body.ops.push_back(make(ir::OpKind::exp, {a}, {b}));
  check_rejects(f, "result types differ");
}

TEST_CASE("verifier: rejects mixed operand types and bad dot shapes") {
  auto f = skeleton();
  ir::ValueId a = f.new_value(ir::Type::tile(DType::f32, {4}));
  ir::ValueId b = f.new_value(ir::Type::tile(DType::f16, {4}));
  ir::ValueId c = f.new_value(ir::Type::tile(DType::f32, {4}));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {a}, const_attrs(1.0, DType::f32, {4})));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {b}, const_attrs(1.0, DType::f16, {4})));
  f.body.ops.push_back(make(ir::OpKind::add, {a, b}, {c}));
  check_rejects(f, "operand types differ");

  auto g = skeleton();
  ir::ValueId x = g.new_value(ir::Type::tile(DType::bf16, {16, 8}));
  ir::ValueId y = g.new_value(ir::Type::tile(DType::bf16, {16, 8}));
  ir::ValueId acc = g.new_value(ir::Type::tile(DType::f32, {16, 8}));
  ir::ValueId r = g.new_value(ir::Type::tile(DType::f32, {16, 8}));
  g.body.ops.push_back(make(ir::OpKind::constant, {}, {x}, const_attrs(1.0, DType::bf16, {16, 8})));
  g.body.ops.push_back(make(ir::OpKind::constant, {}, {y}, const_attrs(1.0, DType::bf16, {16, 8})));
  g.body.ops.push_back(make(ir::OpKind::constant, {}, {acc}, const_attrs(0.0, DType::f32, {16, 8})));
  g.body.ops.push_back(make(ir::OpKind::dot, {x, y, acc}, {r}));
  check_rejects(g, "inner dimensions differ");
}

TEST_CASE("verifier: rejects a value defined twice and a yield outside a region") {
  auto f = skeleton();
  ir::ValueId a = f.new_value(ir::Type::scalar(DType::i32));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {a}, const_attrs(1.0, DType::i32, {})));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {a}, const_attrs(2.0, DType::i32, {})));
  check_rejects(f, "defined twice");

  auto g = skeleton();
  g.body.ops.push_back(make(ir::OpKind::yield, {}, {}));
  check_rejects(g, "yield must be the last op");
}

TEST_CASE("verifier: rejects loops whose body yields the wrong types or uses values out of scope") {
  auto f = skeleton();
  auto i32s = ir::Type::scalar(DType::i32);
  ir::ValueId lb = f.new_value(i32s), init = f.new_value(ir::Type::tile(DType::f32, {4}));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {lb}, const_attrs(0.0, DType::i32, {})));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {init}, const_attrs(0.0, DType::f32, {4})));
  ir::ValueId iv = f.new_value(i32s), carried = f.new_value(ir::Type::tile(DType::f32, {4}));
  ir::ValueId res = f.new_value(ir::Type::tile(DType::f32, {4}));
  ir::Op loop = make(ir::OpKind::for_, {lb, lb, lb, init}, {res});
  ir::Block body;
  body.args = {iv, carried};
  body.ops.push_back(make(ir::OpKind::yield, {iv}, {}));  // yields i32, not f32[4]
  loop.regions.push_back(body);
  f.body.ops.push_back(loop);
  check_rejects(f, "yielded types do not match");

  // the induction variable used after the loop
  auto g = f;
  g.body.ops.back().regions[0].ops.back().operands = {carried};
  ir::ValueId after = g.new_value(i32s);
  g.body.ops.push_back(make(ir::OpKind::add, {iv, iv}, {after}));
  check_rejects(g, "not defined before it in scope");
}

TEST_CASE("verifier: rejects an if whose condition is not an i1 scalar") {
  auto f = skeleton();
  ir::ValueId c = f.new_value(ir::Type::scalar(DType::i32));
  f.body.ops.push_back(make(ir::OpKind::constant, {}, {c}, const_attrs(1.0, DType::i32, {})));
  ir::Op op = make(ir::OpKind::if_, {c}, {});
  ir::Block then_b, else_b;
  then_b.ops.push_back(make(ir::OpKind::yield, {}, {}));
  else_b.ops.push_back(make(ir::OpKind::yield, {}, {}));
  op.regions = {then_b, else_b};
  f.body.ops.push_back(op);
  check_rejects(f, "condition must be one i1 scalar");
}
