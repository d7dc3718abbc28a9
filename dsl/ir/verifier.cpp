// Structural verifier: SSA definitions before uses with region scoping, each op's result types
// equal to its type rule, loop/if regions well formed and terminated by a matching yield.
#include <fmt/format.h>

#include <map>
#include <optional>

#include "dsl/ir/function.hpp"

namespace tilejit::ir {
namespace {

class Verifier {
 public:
  explicit Verifier(const Function& f)
      : f_(f), visible_(f.values.size(), false), defined_(f.values.size(), false), role_of_(f.values.size(), 0) {}

  void run() {
    if (f_.body.args.size() != f_.params.size()) fail(nullptr, "body arguments do not match the parameter list");
    for (size_t i = 0; i < f_.params.size(); ++i) {
      const Param& p = f_.params[i];
      if (f_.body.args[i] != p.value) fail(nullptr, fmt::format("parameter '{}' is not body argument {}", p.name, i));
      define(nullptr, p.value);
      if (f_.type(p.value) != p.type) fail(nullptr, fmt::format("parameter '{}' has a mismatched value type", p.name));
      for (size_t j = 0; j < i; ++j)
        if (f_.params[j].name == p.name) fail(nullptr, fmt::format("parameter name '{}' is used twice", p.name));
    }
    block(f_.body, {}, /*top_level=*/true);
  }

 private:
  [[noreturn]] void fail(const Op* op, const std::string& msg) const {
    if (!op) throw VerifyError(fmt::format("verify: kernel '{}': {}", f_.name, msg));
    throw VerifyError(fmt::format("verify: kernel '{}': op '{}' (built at {}): {}", f_.name, op_name(op->kind), op->loc.str(), msg));
  }

  void define(const Op* op, ValueId v) {
    if (v >= f_.values.size()) fail(op, fmt::format("value id {} is outside the value table", v));
    if (defined_[v]) fail(op, fmt::format("value id {} is defined twice", v));
    defined_[v] = visible_[v] = true;
    role_of_[v] = role_;
  }

  // Verify `b`; if `yield_types` is given the block must end with a yield of exactly those types.
  void block(const Block& b, const std::optional<std::vector<Type>>& yield_types, bool top_level = false) {
    std::vector<ValueId> scope;
    for (const Op& op : b.ops) {
      bool last = &op == &b.ops.back();
      if (op.kind == OpKind::yield) {
        if (top_level || !last) fail(&op, "yield must be the last op of a loop or if region");
      }
      top_level_op_ = top_level;
      if (op.kind == OpKind::warp_roles && !last)
        fail(&op, "warp roles end the kernel: no op may follow them (put that work inside a role)");
      check(op);
      for (ValueId r : op.results) {
        define(&op, r);
        scope.push_back(r);
      }
    }
    if (yield_types) {
      if (b.ops.empty() || b.ops.back().kind != OpKind::yield) fail(nullptr, "a region does not end with yield");
      const Op& y = b.ops.back();
      std::vector<Type> got;
      for (ValueId v : y.operands) got.push_back(f_.type(v));
      if (got != *yield_types) fail(&y, "yielded types do not match the results of the enclosing op");
    }
    for (ValueId v : scope) visible_[v] = false;
  }

  void check(const Op& op) {
    std::vector<Type> in;
    for (ValueId v : op.operands) {
      if (v >= f_.values.size() || !visible_[v]) fail(&op, fmt::format("uses value id {} that is not defined before it in scope", v));
      // A warp role's tiles are spread over its own warps: a tile of another role's (or of the
      // code before the roles) has no registers there. Scalars, pointers and tensors are uniform.
      if (role_ && role_of_[v] != role_ && f_.type(v).is_value() && !f_.type(v).is_scalar())
        fail(&op, fmt::format("a warp role reads the tile %{} ({}) defined outside it: roles share only scalars, pointers and "
                              "tensors (compute the tile inside the role)", v, to_string(f_.type(v))));
      in.push_back(f_.type(v));
    }
    for (ValueId r : op.results)
      if (r >= f_.values.size()) fail(&op, fmt::format("result id {} is outside the value table", r));
    std::vector<Type> out;
    for (ValueId r : op.results) out.push_back(f_.type(r));

    if (op.kind == OpKind::if_) {
      if (in.size() != 1 || in[0] != Type::scalar(DType::i1)) fail(&op, "condition must be one i1 scalar");
      if (op.regions.size() != 2) fail(&op, "needs a then and an else region");
      for (const Block& r : op.regions) {
        if (!r.args.empty()) fail(&op, "if regions take no arguments");
        block(r, out);
      }
      return;
    }
    if (op.kind == OpKind::warp_roles) {
      if (!top_level_op_) fail(&op, "warp roles split the whole program: they must stand at the kernel's top level (not in a loop, an "
                                    "if or another role)");
      if (!op.results.empty()) fail(&op, "warp roles yield no values");
      try {
        infer_result_types(op.kind, in, op.attrs);
      } catch (const TypeError& e) {
        fail(&op, e.what());
      }
      if (op.regions.size() != op.ints_attr("warps").size()) fail(&op, "needs one region per role");
      for (size_t i = 0; i < op.regions.size(); ++i) {
        if (!op.regions[i].args.empty()) fail(&op, "role regions take no arguments");
        role_ = static_cast<int>(i) + 1;
        block(op.regions[i], std::vector<Type>{});
        role_ = 0;
      }
      return;
    }
    if (op.kind == OpKind::channel_push || op.kind == OpKind::channel_pop) {
      const bool push = op.kind == OpKind::channel_push;
      if (!role_) fail(&op, "a channel is pushed and popped inside warp roles (lang::warp_roles), one role each");
      ChannelEnds& c = channels_[op.int_attr("channel")];
      int& end = push ? c.pusher : c.popper;
      if (end && end != role_) fail(&op, fmt::format("channel {} is {} by two roles ({} and {}): one role each", op.int_attr("channel"),
                                                     push ? "pushed" : "popped", end - 1, role_ - 1));
      end = role_;
      if (c.pusher && c.pusher == c.popper) fail(&op, fmt::format("channel {} is pushed and popped by the same role ({})", op.int_attr("channel"), role_ - 1));
    }
    std::vector<Type> want;
    try {
      want = infer_result_types(op.kind, in, op.attrs);
    } catch (const TypeError& e) {
      fail(&op, e.what());
    }
    if (want != out) fail(&op, "result types differ from the op's type rule");
    if (op.kind == OpKind::for_) {
      if (op.regions.size() != 1) fail(&op, "needs one body region");
      const Block& body = op.regions[0];
      if (body.args.size() != out.size() + 1) fail(&op, "body needs the induction variable and one argument per carried value");
      if (f_.type(body.args[0]) != in[0]) fail(&op, "induction variable type differs from the bounds");
      for (size_t i = 0; i < out.size(); ++i)
        if (f_.type(body.args[i + 1]) != out[i]) fail(&op, fmt::format("carried value {} changes type", i));
      for (ValueId a : body.args) define(&op, a);
      block(body, out);
      for (ValueId a : body.args) visible_[a] = false;
    } else if (op.kind == OpKind::scan || op.kind == OpKind::reduce_with) {
      combine_region(op, in);
    } else if (!op.regions.empty()) {
      fail(&op, "has regions but takes none");
    }
  }

  // A scan's or reduce_with's combine: arguments a_0..a_{n-1}, b_0..b_{n-1}, scalars of the
  // operands' dtypes; constants and elementwise ops on scalars only (it runs per element pair, in
  // registers), yielding n scalars of those dtypes.
  void combine_region(const Op& op, const std::vector<Type>& in) {
    if (op.regions.size() != 1) fail(&op, "needs one combine region");
    const Block& body = op.regions[0];
    if (body.args.size() != 2 * in.size()) fail(&op, fmt::format("the combine region needs {} arguments, has {}", 2 * in.size(), body.args.size()));
    std::vector<Type> scalars;
    for (const Type& t : in) scalars.push_back(Type::scalar(t.dtype));
    for (size_t i = 0; i < body.args.size(); ++i)
      if (f_.type(body.args[i]) != scalars[i % in.size()])
        fail(&op, fmt::format("combine argument {} is {}, expected {}", i, to_string(f_.type(body.args[i])), to_string(scalars[i % in.size()])));
    for (const Op& inner : body.ops) {
      const bool allowed = inner.kind == OpKind::yield || inner.kind == OpKind::constant ||
                           (is_elementwise(inner.kind) && inner.kind != OpKind::addptr && inner.kind != OpKind::precompute);
      if (!allowed)
        fail(&inner, fmt::format("a combine function may use only constants and elementwise operations on scalars, not '{}'",
                                 op_name(inner.kind)));
      for (ValueId v : inner.operands)
        if (v < f_.values.size() && !f_.type(v).is_scalar())
          fail(&inner, fmt::format("a combine function reads the tile %{} ({}): it sees only scalars (its arguments, constants, "
                                   "scalars from outside)", v, to_string(f_.type(v))));
      for (ValueId r : inner.results)
        if (r < f_.values.size() && !f_.type(r).is_scalar()) fail(&inner, "a combine function makes only scalars");
    }
    for (ValueId a : body.args) define(&op, a);
    block(body, scalars);
    for (ValueId a : body.args) visible_[a] = false;
  }

  const Function& f_;
  std::vector<bool> visible_;
  std::vector<bool> defined_;
  struct ChannelEnds {
    int pusher = 0, popper = 0;  // 1-based roles
  };
  std::map<int64_t, ChannelEnds> channels_;
  std::vector<int> role_of_;  // per value: the warp role (1-based) it was defined in, 0 outside any
  int role_ = 0;              // the role being verified
  bool top_level_op_ = false; // the op being checked stands in the function's own body
};

}  // namespace

void verify(const Function& f) { Verifier(f).run(); }

}  // namespace tilejit::ir
