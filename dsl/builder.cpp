// Builder: parameters, meta-parameters, op emission with type checking, region scoping.
#include "dsl/builder.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tilejit::lang {
namespace {

thread_local Builder* tl_current = nullptr;

struct CurrentBuilder {
  explicit CurrentBuilder(Builder* b) : saved(tl_current) { tl_current = b; }
  ~CurrentBuilder() { tl_current = saved; }
  CurrentBuilder(const CurrentBuilder&) = delete;
  CurrentBuilder& operator=(const CurrentBuilder&) = delete;
  Builder* saved;
};

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::string meta_kind(const ir::MetaValue& v) {
  if (std::holds_alternative<int64_t>(v)) return "an int";
  if (std::holds_alternative<bool>(v)) return "a bool";
  return "a dtype";
}

}  // namespace

BuildError::BuildError(std::string k, std::string w, std::string m)
    : std::runtime_error(fmt::format("tilejit: kernel '{}': {}: {}", k, w, m)),
      kernel(std::move(k)),
      where(std::move(w)),
      message(std::move(m)) {}

Builder::Builder(std::string kernel_name, const Meta& meta) : meta_(meta), meta_used_(meta.size(), false) {
  fn_.name = std::move(kernel_name);
  scopes_.push_back({&fn_.body, {}});
}

Builder& Builder::current(const Loc& loc) {
  if (!tl_current)
    throw BuildError("<none>", fmt::format("{}:{}", loc.file_name(), loc.line()),
                     "a DSL operation was used outside a kernel body (call it inside the lambda given to kernel())");
  return *tl_current;
}

std::string Builder::where(const Loc& loc) const {
  const Loc& l = loc.line() ? loc : last_loc_;
  if (!l.line()) return "<unknown location>";
  return fmt::format("{}:{}{}", l.file_name(), l.line(), loc.line() ? "" : " (near)");
}

void Builder::fail(const Loc& loc, const std::string& message) const { throw BuildError(fn_.name, where(loc), message); }

void Builder::define(ir::ValueId v) {
  if (visible_.size() <= v) visible_.resize(v + 1, false);
  visible_[v] = true;
  scopes_.back().defined.push_back(v);
}

void Builder::add_param(const std::string& name, ir::ParamKind kind, const ir::Type& t, ParamSpec spec, const Loc& loc) {
  if (!is_identifier(name)) fail(loc, fmt::format("parameter name '{}' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", name));
  if (fn_.find_param(name)) fail(loc, fmt::format("parameter '{}' is declared twice", name));
  if (scopes_.size() != 1) fail(loc, fmt::format("parameter '{}' is declared inside a loop or if body", name));
  if (spec.align_bytes < 0 || (spec.align_bytes & (spec.align_bytes - 1)) != 0)
    fail(loc, fmt::format("parameter '{}': align_bytes = {} must be 0 or a power of two", name, spec.align_bytes));
  if (spec.contiguous_last && kind != ir::ParamKind::Tensor)
    fail(loc, fmt::format("parameter '{}': contiguous_last applies to tensors only", name));
  ir::ValueId v = fn_.new_value(t, name);
  fn_.params.push_back({name, kind, t, v, spec});
  fn_.body.args.push_back(v);
  define(v);
}

Tile Builder::pointer(const std::string& name, DType pointee, ParamSpec spec, Loc loc) {
  if (pointee == DType::i1) fail(loc, fmt::format("parameter '{}': pointers to i1 are not supported (use i8 or u8)", name));
  add_param(name, ir::ParamKind::Pointer, ir::Type::pointer(pointee), spec, loc);
  return Tile(this, fn_.params.back().value);
}

Tensor Builder::tensor(const std::string& name, DType dtype, int rank, ParamSpec spec, Loc loc) {
  if (rank < 1 || rank > 8) fail(loc, fmt::format("tensor '{}': rank {} is not supported (valid: 1..8)", name, rank));
  if (dtype == DType::i1) fail(loc, fmt::format("tensor '{}': i1 tensors are not supported (use i8 or u8)", name));
  add_param(name, ir::ParamKind::Tensor, ir::Type::tensor(dtype, rank), spec, loc);
  return Tensor(Tile(this, fn_.params.back().value));
}

Tile Builder::scalar(const std::string& name, DType dtype, Loc loc) {
  if (ir::is_fp8(dtype)) fail(loc, fmt::format("scalar parameter '{}': fp8 scalars are not supported", name));
  add_param(name, ir::ParamKind::Scalar, ir::Type::scalar(dtype), {}, loc);
  return Tile(this, fn_.params.back().value);
}

const ir::MetaValue* Builder::lookup_meta(const std::string& name, const Loc& loc) {
  if (!is_identifier(name)) fail(loc, fmt::format("meta-parameter name '{}' is not an identifier", name));
  if (fn_.find_meta(name)) fail(loc, fmt::format("meta-parameter '{}' is declared twice", name));
  for (size_t i = 0; i < meta_.size(); ++i)
    if (meta_[i].first == name) {
      meta_used_[i] = true;
      return &meta_[i].second;
    }
  return nullptr;
}

int64_t Builder::meta_int(const std::string& name, std::optional<int64_t> def, Loc loc) {
  const ir::MetaValue* v = lookup_meta(name, loc);
  if (v && !std::holds_alternative<int64_t>(*v))
    fail(loc, fmt::format("meta-parameter '{}' is an int, but the binding gives {} ({})", name, meta_kind(*v), ir::to_string(*v)));
  if (!v && !def) fail(loc, fmt::format("meta-parameter '{}' (an int) has no default and no value was given", name));
  int64_t x = v ? std::get<int64_t>(*v) : *def;
  fn_.meta.push_back({name, x});
  return x;
}

size_t Builder::tensor_param_index(const Tensor& t, const char* what, const Loc& loc) const {
  for (size_t i = 0; i < fn_.params.size(); ++i)
    if (fn_.params[i].kind == ir::ParamKind::Tensor && fn_.params[i].value == t.descriptor().id()) return i;
  fail(loc, fmt::format("same_size: {} is not a tensor parameter of this kernel (a slice or another kernel's tensor)", what));
}

void Builder::same_size(const Tensor& a, int a_dim, const Tensor& b, int b_dim, std::string why, Loc loc) {
  const size_t ia = tensor_param_index(a, "the first tensor", loc), ib = tensor_param_index(b, "the second tensor", loc);
  for (auto [t, d] : {std::pair{ia, a_dim}, std::pair{ib, b_dim}})
    if (d < 0 || d >= fn_.params[t].type.rank)
      fail(loc, fmt::format("same_size: dim {} of tensor '{}' (valid: 0 to {})", d, fn_.params[t].name, fn_.params[t].type.rank - 1));
  fn_.size_relations.push_back({ia, a_dim, ib, b_dim, std::move(why)});
}

void Builder::meta_out_of_range(const std::string& name, int64_t value, int64_t lo, int64_t hi, const Loc& loc) {
  fail(loc, fmt::format("meta-parameter '{}' = {} does not fit the type the kernel reads it as (valid: {} to {})", name,
                        value, lo, hi));
}

bool Builder::meta_bool(const std::string& name, std::optional<bool> def, Loc loc) {
  const ir::MetaValue* v = lookup_meta(name, loc);
  if (v && !std::holds_alternative<bool>(*v))
    fail(loc, fmt::format("meta-parameter '{}' is a bool, but the binding gives {} ({})", name, meta_kind(*v), ir::to_string(*v)));
  if (!v && !def) fail(loc, fmt::format("meta-parameter '{}' (a bool) has no default and no value was given", name));
  bool x = v ? std::get<bool>(*v) : *def;
  fn_.meta.push_back({name, x});
  return x;
}

DType Builder::meta_dtype(const std::string& name, std::optional<DType> def, Loc loc) {
  const ir::MetaValue* v = lookup_meta(name, loc);
  if (v && !std::holds_alternative<DType>(*v))
    fail(loc, fmt::format("meta-parameter '{}' is a dtype, but the binding gives {} ({})", name, meta_kind(*v), ir::to_string(*v)));
  if (!v && !def) fail(loc, fmt::format("meta-parameter '{}' (a dtype) has no default and no value was given", name));
  DType x = v ? std::get<DType>(*v) : *def;
  fn_.meta.push_back({name, x});
  return x;
}

Tile Builder::program_id(int axis, Loc loc) {
  if (axis < 0 || axis > 2) fail(loc, fmt::format("program_id: axis {} is not 0, 1 or 2", axis));
  return emit1(ir::OpKind::program_id, {}, {{"axis", int64_t{axis}}}, loc);
}

Tile Builder::num_programs(int axis, Loc loc) {
  if (axis < 0 || axis > 2) fail(loc, fmt::format("num_programs: axis {} is not 0, 1 or 2", axis));
  return emit1(ir::OpKind::num_programs, {}, {{"axis", int64_t{axis}}}, loc);
}

std::vector<ir::ValueId> Builder::emit(ir::OpKind kind, std::vector<ir::ValueId> operands, ir::AttrMap attrs, const Loc& loc) {
  if (loc.line()) last_loc_ = loc;
  std::vector<ir::Type> in;
  for (ir::ValueId v : operands) {
    if (v >= visible_.size() || !visible_[v])
      fail(loc, fmt::format("{}: uses a value built inside a for_range or if_ body outside that body; declare the "
                            "variable as tilejit::lang::Var so that it is carried out of the body",
                            ir::op_name(kind)));
    in.push_back(fn_.type(v));
  }
  std::vector<ir::Type> out;
  try {
    out = ir::infer_result_types(kind, in, attrs);
  } catch (const ir::TypeError& e) {
    fail(loc, e.what());
  }
  ir::Op op;
  op.kind = kind;
  op.operands = std::move(operands);
  op.attrs = std::move(attrs);
  op.loc = {loc.file_name(), loc.line(), loc.column()};
  for (const ir::Type& t : out) op.results.push_back(fn_.new_value(t));
  std::vector<ir::ValueId> results = op.results;
  append(std::move(op));
  return results;
}

Tile Builder::emit1(ir::OpKind kind, std::vector<ir::ValueId> operands, ir::AttrMap attrs, const Loc& loc) {
  auto r = emit(kind, std::move(operands), std::move(attrs), loc);
  return Tile(this, r.at(0));
}

void Builder::append(ir::Op op) {
  for (ir::ValueId r : op.results) define(r);
  scopes_.back().block->ops.push_back(std::move(op));
}

void Builder::enter(ir::Block& block) {
  scopes_.push_back({&block, {}});
  for (ir::ValueId a : block.args) define(a);
}

void Builder::leave() {
  for (ir::ValueId v : scopes_.back().defined) visible_[v] = false;
  scopes_.pop_back();
}

void Builder::unregister_var(Var* v) {
  auto it = std::find(vars_.rbegin(), vars_.rend(), v);
  if (it != vars_.rend()) vars_.erase(std::next(it).base());
}

ir::Function Builder::finish() {
  std::vector<std::string> unused;
  for (size_t i = 0; i < meta_.size(); ++i)
    if (!meta_used_[i]) unused.push_back(meta_[i].first);
  if (!unused.empty()) {
    std::vector<std::string> declared;
    for (const auto& m : fn_.meta) declared.push_back(m.name);
    // a declared name left unused was given more than once: the first value was read
    for (const std::string& name : unused)
      if (std::find(declared.begin(), declared.end(), name) != declared.end())
        throw BuildError(fn_.name, "build()", fmt::format("meta-parameter {} given more than once (give each meta once)", name));
    throw BuildError(fn_.name, "build()",
                     fmt::format("no meta-parameter named {} (declared: {})", fmt::join(unused, ", "),
                                 declared.empty() ? "none" : fmt::format("{}", fmt::join(declared, ", "))));
  }
  try {
    ir::verify(fn_);
  } catch (const ir::VerifyError& e) {
    throw BuildError(fn_.name, "build()", fmt::format("internal error, the built IR does not verify: {}", e.what()));
  }
  return std::move(fn_);
}

Kernel::Kernel(std::string name, Body body) : name_(std::move(name)), body_(std::move(body)) {
  if (!is_identifier(name_)) throw BuildError(name_, "kernel()", "the kernel name must be an identifier ([A-Za-z_][A-Za-z0-9_]*)");
  if (!body_) throw BuildError(name_, "kernel()", "the kernel body is empty");
}

ir::Function Kernel::build(const Meta& meta) const {
  Builder b(name_, meta);
  CurrentBuilder scope(&b);
  body_(b);
  return b.finish();
}

}  // namespace tilejit::lang
