// Op names, attribute access and the type rules of every op kind.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "dsl/ir/atomic.hpp"
#include "dsl/ir/function.hpp"
#include "dsl/ir/input_precision.hpp"

namespace tilejit::ir {
namespace {

constexpr std::array<std::string_view, static_cast<size_t>(OpKind::timestamp) + 1> kNames{
    "constant", "arange", "splat", "broadcast", "expand_dims", "reshape", "trans",
    "add", "sub", "mul", "div", "rem", "minimum", "maximum",
    "and", "or", "xor", "shl", "shr", "umulhi", "cmp", "byte_perm", "fma",
    "neg", "not", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "rcp", "floor", "ceil", "tanh", "sin",
    "cos", "erf",
    "select", "cast", "bitcast", "pack_pairs", "unpack_pairs", "precompute", "reduce", "dot",
    "program_id", "num_programs",
    "tensor_ptr", "tensor_dim", "tensor_stride", "tensor_slice", "addptr", "load", "store", "atomic_add", "atomic_rmw", "atomic_cas", "block_load",
    "block_store", "wait_ge", "signal_add", "turn_begin", "turn_end",
    "for", "if", "yield", "warp_roles", "channel_push", "channel_pop", "ring_producer",
    "scan", "reduce_with", "xor_permute", "gather", "histogram", "timestamp",
};

[[noreturn]] void fail(OpKind k, const std::string& msg) {
  throw TypeError(fmt::format("{}: {}", op_name(k), msg));
}

void expect_count(OpKind k, const std::vector<Type>& ops, size_t n) {
  if (ops.size() != n) fail(k, fmt::format("expects {} operand(s), got {}", n, ops.size()));
}

void expect_value(OpKind k, const Type& t, const char* what) {
  if (!t.is_value()) fail(k, fmt::format("{} must be a number or tile of numbers, got {}", what, to_string(t)));
}

void expect_scalar_int(OpKind k, const Type& t, const char* what) {
  if (!t.is_value() || !t.is_scalar() || !is_int(t.dtype) || t.dtype == DType::i1)
    fail(k, fmt::format("{} must be an integer scalar, got {}", what, to_string(t)));
}

int64_t axis_attr(OpKind k, const AttrMap& a, const char* key, int64_t lo, int64_t hi) {
  auto it = a.find(key);
  if (it == a.end() || !std::holds_alternative<int64_t>(it->second)) fail(k, fmt::format("missing integer attribute '{}'", key));
  int64_t v = std::get<int64_t>(it->second);
  if (v < lo || v > hi) fail(k, fmt::format("{} = {} is out of range [{}, {}]", key, v, lo, hi));
  return v;
}

const std::vector<int64_t>& ints_attr(OpKind k, const AttrMap& a, const char* key) {
  auto it = a.find(key);
  if (it == a.end() || !std::holds_alternative<std::vector<int64_t>>(it->second))
    fail(k, fmt::format("missing integer-list attribute '{}'", key));
  return std::get<std::vector<int64_t>>(it->second);
}

DType dtype_attr(OpKind k, const AttrMap& a) {
  auto it = a.find("dtype");
  if (it == a.end() || !std::holds_alternative<DType>(it->second)) fail(k, "missing attribute 'dtype'");
  return std::get<DType>(it->second);
}

const std::string& str_attr(OpKind k, const AttrMap& a, const char* key) {
  auto it = a.find(key);
  if (it == a.end() || !std::holds_alternative<std::string>(it->second)) fail(k, fmt::format("missing string attribute '{}'", key));
  return std::get<std::string>(it->second);
}

void expect_valid_shape(OpKind k, const Shape& s) {
  for (int64_t d : s)
    if (d <= 0) fail(k, fmt::format("tile dimensions must be positive, got {}", shape_string(s)));
}

bool is_permutation(const std::vector<int64_t>& p, size_t n) {
  if (p.size() != n) return false;
  std::vector<int64_t> s = p;
  std::sort(s.begin(), s.end());
  for (size_t i = 0; i < n; ++i)
    if (s[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

std::string_view op_name(OpKind k) { return kNames.at(static_cast<size_t>(k)); }

bool is_elementwise_binary(OpKind k) { return k >= OpKind::add && k <= OpKind::umulhi; }
bool is_elementwise_unary(OpKind k) { return k >= OpKind::neg && k <= OpKind::erf; }
bool is_float_only_unary(OpKind k) { return k >= OpKind::exp && k <= OpKind::erf; }
bool is_elementwise(OpKind k) {
  return is_elementwise_binary(k) || is_elementwise_unary(k) || k == OpKind::cmp || k == OpKind::byte_perm || k == OpKind::fma || k == OpKind::select ||
         k == OpKind::cast || k == OpKind::bitcast || k == OpKind::precompute || k == OpKind::addptr;
}

std::string SourceLoc::str() const {
  if (!file) return "<unknown>";
  return fmt::format("{}:{}", file, line);
}

int64_t Op::int_attr(const std::string& key) const { return std::get<int64_t>(attrs.at(key)); }
double Op::float_attr(const std::string& key) const {
  const Attr& a = attrs.at(key);
  if (auto* i = std::get_if<int64_t>(&a)) return static_cast<double>(*i);
  return std::get<double>(a);
}
const std::string& Op::str_attr(const std::string& key) const { return std::get<std::string>(attrs.at(key)); }
const std::vector<int64_t>& Op::ints_attr(const std::string& key) const {
  return std::get<std::vector<int64_t>>(attrs.at(key));
}

namespace {

// Elementwise arithmetic, comparisons, byte_perm, fma and select: operands of one type.
std::vector<Type> elementwise_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  if (is_elementwise_binary(k)) {
    expect_count(k, in, 2);
    expect_value(k, in[0], "lhs");
    if (in[0] != in[1]) fail(k, fmt::format("operand types differ: {} vs {}", to_string(in[0]), to_string(in[1])));
    DType d = in[0].dtype;
    bool int_only = k == bit_and || k == bit_or || k == bit_xor || k == shl || k == shr || k == umulhi;
    if (int_only && !is_int(d)) fail(k, fmt::format("needs integer operands, got {}", to_string(in[0])));
    if (k == umulhi && d != DType::i32 && d != DType::u32 && d != DType::i64 && d != DType::u64)
      fail(k, fmt::format("needs 32- or 64-bit integer operands, got {}", to_string(in[0])));
    if (is_fp8(d)) fail(k, "fp8 is a storage type: cast to f16/bf16/f32 before arithmetic");
    return {in[0]};
  }
  if (is_elementwise_unary(k)) {
    expect_count(k, in, 1);
    expect_value(k, in[0], "operand");
    if (is_fp8(in[0].dtype)) fail(k, "fp8 is a storage type: cast to f16/bf16/f32 before arithmetic");
    if (is_float_only_unary(k) && !is_float(in[0].dtype))
      fail(k, fmt::format("needs a floating-point operand, got {} (cast it first)", to_string(in[0])));
    if (k == bit_not && !is_int(in[0].dtype)) fail(k, fmt::format("needs an integer operand, got {}", to_string(in[0])));
    return {in[0]};
  }
  switch (k) {
    case cmp: {
      expect_count(k, in, 2);
      expect_value(k, in[0], "lhs");
      if (in[0] != in[1]) fail(k, fmt::format("operand types differ: {} vs {}", to_string(in[0]), to_string(in[1])));
      const std::string& p = str_attr(k, a, "pred");
      if (p != "eq" && p != "ne" && p != "lt" && p != "le" && p != "gt" && p != "ge")
        fail(k, fmt::format("unknown predicate '{}' (valid: eq ne lt le gt ge)", p));
      return {Type::tile(DType::i1, in[0].shape)};
    }
    case byte_perm: {
      expect_count(k, in, 3);
      expect_value(k, in[0], "a");
      if (in[0] != in[1] || in[0] != in[2])
        fail(k, fmt::format("operand types differ: {}, {}, {}", to_string(in[0]), to_string(in[1]), to_string(in[2])));
      if (in[0].dtype != DType::u32 && in[0].dtype != DType::i32)
        fail(k, fmt::format("needs u32 or i32 operands (it permutes the bytes of 32-bit words), got {}", to_string(in[0])));
      return {in[0]};
    }
    case fma: {
      expect_count(k, in, 3);
      expect_value(k, in[0], "a");
      if (in[0] != in[1] || in[0] != in[2])
        fail(k, fmt::format("operand types differ: {}, {}, {}", to_string(in[0]), to_string(in[1]), to_string(in[2])));
      if (in[0].dtype != DType::f32 && in[0].dtype != DType::f64) fail(k, fmt::format("needs f32 or f64 operands, got {}", to_string(in[0])));
      return {in[0]};
    }
    case select: {
      expect_count(k, in, 3);
      if (!in[0].is_value() || in[0].dtype != DType::i1) fail(k, fmt::format("condition must be i1, got {}", to_string(in[0])));
      if (in[1] != in[2]) fail(k, fmt::format("branch types differ: {} vs {}", to_string(in[1]), to_string(in[2])));
      if (in[0].shape != in[1].shape)
        fail(k, fmt::format("condition shape {} differs from value shape {}", shape_string(in[0].shape), shape_string(in[1].shape)));
      return {in[1]};
    }
    default:
      break;
  }
  fail(k, "no type rule");
}

// Constants, aranges and the ops that only reshape a tile.
std::vector<Type> shape_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  switch (k) {
    case constant: {
      expect_count(k, in, 0);
      Shape s = ints_attr(k, a, "shape");
      expect_valid_shape(k, s);
      auto it = a.find("value");
      if (it == a.end() || !(std::holds_alternative<int64_t>(it->second) || std::holds_alternative<double>(it->second)))
        fail(k, "missing numeric attribute 'value'");
      return {Type::tile(dtype_attr(k, a), s)};
    }
    case arange: {
      expect_count(k, in, 0);
      int64_t start = axis_attr(k, a, "start", INT32_MIN, INT32_MAX);
      int64_t end = axis_attr(k, a, "end", INT32_MIN, INT32_MAX);
      if (end <= start) fail(k, fmt::format("needs end > start, got [{}, {})", start, end));
      return {Type::tile(DType::i32, {end - start})};
    }
    case splat: {
      expect_count(k, in, 1);
      if (!in[0].is_scalar() || in[0].is_tensor()) fail(k, fmt::format("operand must be a scalar, got {}", to_string(in[0])));
      Shape s = ints_attr(k, a, "shape");
      expect_valid_shape(k, s);
      return {in[0].with_shape(s)};
    }
    case broadcast: {
      expect_count(k, in, 1);
      const Shape& s = ints_attr(k, a, "shape");
      if (s.size() != in[0].shape.size())
        fail(k, fmt::format("rank differs: {} to {}", to_string(in[0]), shape_string(s)));
      for (size_t i = 0; i < s.size(); ++i)
        if (in[0].shape[i] != s[i] && in[0].shape[i] != 1)
          fail(k, fmt::format("cannot broadcast {} to {}", to_string(in[0]), shape_string(s)));
      return {in[0].with_shape(s)};
    }
    case expand_dims: {
      expect_count(k, in, 1);
      if (in[0].is_tensor()) fail(k, "operand is a tensor descriptor");
      int64_t axis = axis_attr(k, a, "axis", 0, static_cast<int64_t>(in[0].shape.size()));
      Shape s = in[0].shape;
      s.insert(s.begin() + axis, 1);
      return {in[0].with_shape(s)};
    }
    case reshape: {
      expect_count(k, in, 1);
      if (in[0].is_tensor()) fail(k, "operand is a tensor descriptor");
      Shape s = ints_attr(k, a, "shape");
      expect_valid_shape(k, s);
      Type r = in[0].with_shape(s);
      if (r.numel() != in[0].numel())
        fail(k, fmt::format("element count differs: {} ({} elements) to {} ({} elements)", to_string(in[0]),
                            in[0].numel(), shape_string(s), r.numel()));
      return {r};
    }
    case trans: {
      expect_count(k, in, 1);
      const auto& perm = ints_attr(k, a, "perm");
      if (!is_permutation(perm, in[0].shape.size()))
        fail(k, fmt::format("perm {} is not a permutation of the {} dims of {}", shape_string(perm), in[0].shape.size(),
                            to_string(in[0])));
      Shape s(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) s[i] = in[0].shape[static_cast<size_t>(perm[i])];
      return {in[0].with_shape(s)};
    }
    default:
      break;
  }
  fail(k, "no type rule");
}

// Conversions: cast, bitcast, 16-bit pairs, and precompute (the value itself).
std::vector<Type> conversion_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  switch (k) {
    case cast: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      return {in[0].with_dtype(dtype_attr(k, a))};
    }
    case bitcast: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      DType to = dtype_attr(k, a);
      if (bit_width(to) != bit_width(in[0].dtype) || to == DType::i1 || in[0].dtype == DType::i1)
        fail(k, fmt::format("{} and {} differ in width", name(in[0].dtype), name(to)));
      return {in[0].with_dtype(to)};
    }
    case pack_pairs: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      if (bit_width(in[0].dtype) != 16 || in[0].shape.empty() || in[0].shape.back() % 2 != 0)
        fail(k, fmt::format("needs a tile of a 16-bit dtype whose last dimension is even, got {}", to_string(in[0])));
      Shape s = in[0].shape;
      s.back() /= 2;
      return {Type::tile(DType::u32, s)};
    }
    case unpack_pairs: {
      expect_count(k, in, 1);
      DType to = dtype_attr(k, a);
      if (!in[0].is_value() || in[0].dtype != DType::u32 || in[0].shape.empty())
        fail(k, fmt::format("needs a u32 tile, got {}", to_string(in[0])));
      if (bit_width(to) != 16) fail(k, fmt::format("unpacks into a 16-bit dtype, got {}", name(to)));
      Shape s = in[0].shape;
      s.back() *= 2;
      return {Type::tile(to, s)};
    }
    case precompute: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      return {in[0]};
    }
    default:
      break;
  }
  fail(k, "no type rule");
}

// Reductions along an axis and dot.
std::vector<Type> reduction_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  switch (k) {
    case reduce: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      if (in[0].is_scalar()) fail(k, "operand is a scalar");
      int64_t axis = axis_attr(k, a, "axis", 0, static_cast<int64_t>(in[0].shape.size()) - 1);
      const std::string& kind = str_attr(k, a, "kind");
      if (kind != "sum" && kind != "max" && kind != "min") fail(k, fmt::format("unknown reduction '{}' (valid: sum max min)", kind));
      if (in[0].dtype == DType::i1 || is_fp8(in[0].dtype)) fail(k, fmt::format("cannot reduce {}", name(in[0].dtype)));
      Shape s = in[0].shape;
      s.erase(s.begin() + axis);
      return {in[0].with_shape(s)};
    }
    case gather: {
      expect_count(k, in, 2);
      expect_value(k, in[0], "source");
      expect_value(k, in[1], "index");
      if (in[0].is_scalar()) fail(k, "the source is a scalar");
      if (!is_int(in[1].dtype) || in[1].dtype == DType::i1) fail(k, fmt::format("the index must be an integer tile, got {}", to_string(in[1])));
      if (in[1].shape.size() != in[0].shape.size())
        fail(k, fmt::format("the index {} and the source {} differ in rank", to_string(in[1]), to_string(in[0])));
      const int64_t axis = axis_attr(k, a, "axis", 0, static_cast<int64_t>(in[0].shape.size()) - 1);
      for (size_t d = 0; d < in[0].shape.size(); ++d)
        if (static_cast<int64_t>(d) != axis && in[0].shape[d] != in[1].shape[d])
          fail(k, fmt::format("the index {} and the source {} differ in dimension {} (only the axis {} may)", to_string(in[1]),
                              to_string(in[0]), d, axis));
      return {in[0].with_shape(in[1].shape)};
    }
    case histogram: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      if (in[0].is_scalar() || !is_int(in[0].dtype) || in[0].dtype == DType::i1)
        fail(k, fmt::format("needs an integer tile, got {}", to_string(in[0])));
      const int64_t bins = axis_attr(k, a, "num_bins", 1, kMaxHistogramBins);
      if (bins & (bins - 1)) fail(k, fmt::format("num_bins = {} (valid: a power of two from 1 to {})", bins, kMaxHistogramBins));
      if (a.count("method") && str_attr(k, a, "method") != "ballots" && str_attr(k, a, "method") != "shared_atomics")
        fail(k, fmt::format("unknown method '{}' (valid: ballots shared_atomics)", str_attr(k, a, "method")));
      return {Type::tile(DType::i32, {bins})};
    }
    case xor_permute: {
      expect_count(k, in, 1);
      expect_value(k, in[0], "operand");
      if (in[0].is_scalar()) fail(k, "operand is a scalar");
      const int64_t axis = axis_attr(k, a, "axis", 0, static_cast<int64_t>(in[0].shape.size()) - 1);
      const int64_t n = in[0].shape[static_cast<size_t>(axis)];
      if (n & (n - 1)) fail(k, fmt::format("the axis has {} elements (valid: a power of two)", n));
      axis_attr(k, a, "mask", 0, n - 1);
      return {in[0]};
    }
    case scan:
    case reduce_with: {
      if (in.empty()) fail(k, "needs one or more operands");
      for (const Type& t : in) {
        expect_value(k, t, "operand");
        if (t.is_scalar()) fail(k, "an operand is a scalar");
        if (t.shape != in[0].shape) fail(k, fmt::format("operands differ in shape: {} and {}", to_string(in[0]), to_string(t)));
        if (is_fp8(t.dtype)) fail(k, fmt::format("cannot combine {} (cast to f16 or f32 first)", name(t.dtype)));
      }
      int64_t axis = axis_attr(k, a, "axis", 0, static_cast<int64_t>(in[0].shape.size()) - 1);
      if (k == scan) {
        axis_attr(k, a, "reverse", 0, 1);
        return in;
      }
      std::vector<Type> out;
      for (const Type& t : in) {
        Shape s = t.shape;
        s.erase(s.begin() + axis);
        out.push_back(t.with_shape(s));
      }
      return out;
    }
    case dot: {
      // (a[M,K], b[K,N], acc[M,N]), or batched (a[B,M,K], b[B,K,N], acc[B,M,N])
      expect_count(k, in, 3);
      const Type &A = in[0], &B = in[1], &C = in[2];
      for (const Type* t : {&A, &B, &C}) {
        expect_value(k, *t, "operand");
        if (t->shape.size() != 2 && t->shape.size() != 3)
          fail(k, fmt::format("operands must be 2-D or 3-D (batched) tiles, got {}", to_string(*t)));
      }
      const size_t r = A.shape.size();
      if (B.shape.size() != r || C.shape.size() != r)
        fail(k, fmt::format("operands differ in rank: a is {}, b is {}, acc is {}", to_string(A), to_string(B), to_string(C)));
      if (r == 3 && A.shape[0] != B.shape[0])
        fail(k, fmt::format("batch sizes differ: a is {}, b is {}", to_string(A), to_string(B)));
      if (A.shape[r - 1] != B.shape[r - 2])
        fail(k, fmt::format("inner dimensions differ: a is {}, b is {}", to_string(A), to_string(B)));
      if (A.dtype != B.dtype) fail(k, fmt::format("a and b dtypes differ: {} vs {}", name(A.dtype), name(B.dtype)));
      DType want = A.dtype == DType::i8 ? DType::i32 : DType::f32;
      if (!(is_float(A.dtype) && A.dtype != DType::f64) && A.dtype != DType::i8)
        fail(k, fmt::format("unsupported input dtype {} (valid: f16 bf16 f32 f8e4m3 f8e5m2 i8)", name(A.dtype)));
      Shape out = A.shape;
      out[r - 1] = B.shape[r - 1];
      if (C.dtype != want || C.shape != out)
        fail(k, fmt::format("accumulator must be {}{}, got {}", name(want), shape_string(out), to_string(C)));
      if (auto it = a.find(kInputPrecisionAttr); it != a.end()) {
        const std::string& p = str_attr(k, a, kInputPrecisionAttr);
        const auto precision = parse_input_precision(p);
        if (!precision) fail(k, fmt::format("unknown input_precision '{}' (valid: ieee tf32)", p));
        if (*precision == InputPrecision::tf32 && A.dtype != DType::f32)
          fail(k, fmt::format("input_precision tf32 needs f32 inputs, got {} (valid: f32; ieee for every input dtype)", name(A.dtype)));
      }
      return {C};
    }
    default:
      break;
  }
  fail(k, "no type rule");
}

// Program ids, tensor descriptors and pointer memory (addptr, load, store, atomic_add).
std::vector<Type> memory_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  switch (k) {
    case program_id:
    case num_programs:
      expect_count(k, in, 0);
      axis_attr(k, a, "axis", 0, 2);
      return {Type::scalar(DType::i32)};
    case tensor_ptr:
    case tensor_dim:
    case tensor_stride: {
      expect_count(k, in, 1);
      if (!in[0].is_tensor()) fail(k, fmt::format("operand must be a tensor descriptor, got {}", to_string(in[0])));
      if (k == tensor_ptr) return {Type::pointer(in[0].dtype)};
      axis_attr(k, a, "dim", 0, in[0].rank - 1);
      return {Type::scalar(k == tensor_dim ? DType::i32 : DType::i64)};
    }
    case tensor_slice: {
      expect_count(k, in, 3);
      if (!in[0].is_tensor()) fail(k, fmt::format("operand must be a tensor descriptor, got {}", to_string(in[0])));
      axis_attr(k, a, "dim", 0, in[0].rank - 1);
      if (in[1] != Type::scalar(DType::i32) || in[2] != Type::scalar(DType::i32))
        fail(k, fmt::format("start and length must be i32 scalars, got {} and {}", to_string(in[1]), to_string(in[2])));
      return {in[0]};
    }
    case addptr: {
      expect_count(k, in, 2);
      if (!in[0].is_pointer()) fail(k, fmt::format("first operand must be a pointer, got {}", to_string(in[0])));
      if (!in[1].is_value() || !is_int(in[1].dtype) || in[1].dtype == DType::i1)
        fail(k, fmt::format("offset must be an integer, got {}", to_string(in[1])));
      if (in[0].shape != in[1].shape)
        fail(k, fmt::format("pointer shape {} differs from offset shape {}", shape_string(in[0].shape), shape_string(in[1].shape)));
      return {in[0]};
    }
    case load: {
      if (in.size() != 1 && in.size() != 3) fail(k, fmt::format("expects 1 or 3 operands, got {}", in.size()));
      if (!in[0].is_pointer()) fail(k, fmt::format("address must be a pointer, got {}", to_string(in[0])));
      Type r = Type::tile(in[0].dtype, in[0].shape);
      if (in.size() == 3) {
        if (in[1] != Type::tile(DType::i1, in[0].shape)) fail(k, fmt::format("mask must be i1{}, got {}", shape_string(in[0].shape), to_string(in[1])));
        if (in[2] != r) fail(k, fmt::format("padding value must be {}, got {}", to_string(r), to_string(in[2])));
      }
      return {r};
    }
    case store:
    case atomic_add: {
      if (in.size() != 2 && in.size() != 3) fail(k, fmt::format("expects 2 or 3 operands, got {}", in.size()));
      if (!in[0].is_pointer()) fail(k, fmt::format("address must be a pointer, got {}", to_string(in[0])));
      Type v = Type::tile(in[0].dtype, in[0].shape);
      if (in[1] != v) fail(k, fmt::format("value must be {} to match the address, got {}", to_string(v), to_string(in[1])));
      if (in.size() == 3 && in[2] != Type::tile(DType::i1, in[0].shape))
        fail(k, fmt::format("mask must be i1{}, got {}", shape_string(in[0].shape), to_string(in[2])));
      if (k == store) return {};
      DType d = v.dtype;
      if (d != DType::f32 && d != DType::f16 && d != DType::bf16 && d != DType::i32 && d != DType::u32 &&
          d != DType::i64 && d != DType::u64 && d != DType::f64)
        fail(k, fmt::format("unsupported dtype {} (valid: f32 f64 f16 bf16 i32 u32 i64 u64)", name(d)));
      return {v};
    }
    case atomic_rmw:
    case atomic_cas: {
      const size_t values = k == atomic_cas ? 2 : 1;  // (compare,) value
      if (in.size() != 1 + values && in.size() != 2 + values)
        fail(k, fmt::format("expects {} or {} operands, got {}", 1 + values, 2 + values, in.size()));
      if (!in[0].is_pointer()) fail(k, fmt::format("address must be a pointer, got {}", to_string(in[0])));
      Type v = Type::tile(in[0].dtype, in[0].shape);
      for (size_t i = 1; i <= values; ++i)
        if (in[i] != v) fail(k, fmt::format("operand {} must be {} to match the address, got {}", i, to_string(v), to_string(in[i])));
      if (in.size() == 2 + values && in.back() != Type::tile(DType::i1, in[0].shape))
        fail(k, fmt::format("mask must be i1{}, got {}", shape_string(in[0].shape), to_string(in.back())));
      std::optional<AtomicRmw> rmw;
      if (k == atomic_rmw) {
        auto it = a.find("rmw");
        const std::string* s = it == a.end() ? nullptr : std::get_if<std::string>(&it->second);
        rmw = s ? parse_atomic_rmw(*s) : std::nullopt;
        if (!rmw) fail(k, "the attribute rmw must be one of add max min and or xor xchg");
      }
      auto it = a.find("sem");
      const std::string* sem = it == a.end() ? nullptr : std::get_if<std::string>(&it->second);
      if (!sem || !parse_mem_sem(*sem)) fail(k, "the attribute sem must be one of relaxed acquire release acq_rel");
      it = a.find("scope");
      const std::string* scope = it == a.end() ? nullptr : std::get_if<std::string>(&it->second);
      if (!scope || !parse_mem_scope(*scope)) fail(k, "the attribute scope must be one of cta gpu sys");
      if (std::string valid = atomic_dtype_error(rmw, v.dtype); !valid.empty())
        fail(k, fmt::format("{} does not take {} (valid: {})", rmw ? fmt::format("rmw {}", name(*rmw)) : std::string("compare-and-swap"),
                            name(v.dtype), valid));
      return {v};
    }
    default:
      break;
  }
  fail(k, "no type rule");
}

// Tensor windows: block_load and block_store (optionally a reduce ordered by a semaphore).
std::vector<Type> window_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  switch (k) {
    case block_load:
    case block_store: {
      if (in.empty() || !in[0].is_tensor()) fail(k, "first operand must be a tensor descriptor");
      const Type& t = in[0];
      size_t first_off = k == block_load ? 1 : 2;
      const bool ordered = k == block_store && a.count("after_semaphore");  // + (semaphore, target)
      const bool signal = ordered && a.count("signal_after");               // + (signal)
      if (k == block_store && a.count("signal_after") && !ordered) fail(k, "'signal_after' needs 'after_semaphore'");
      expect_count(k, in, first_off + static_cast<size_t>(t.rank) + (ordered ? 2 : 0) + (signal ? 1 : 0));
      for (size_t i = first_off; i < first_off + static_cast<size_t>(t.rank); ++i) expect_scalar_int(k, in[i], "offset");
      auto is_semaphore = [](const Type& s) { return s.is_pointer() && s.is_scalar() && s.dtype == DType::i32; };
      if (ordered) {
        const size_t at = first_off + static_cast<size_t>(t.rank);
        if (!a.count("reduce") || a.at("reduce") != Attr(std::string("add"))) fail(k, "'after_semaphore' needs reduce = \"add\"");
        if (!is_semaphore(in[at])) fail(k, fmt::format("the semaphore must be a scalar pointer to i32, got {}", to_string(in[at])));
        if (in[at + 1] != Type::scalar(DType::i32)) fail(k, fmt::format("the target must be an i32 scalar, got {}", to_string(in[at + 1])));
        if (signal && !is_semaphore(in[at + 2]))
          fail(k, fmt::format("the signalled semaphore must be a scalar pointer to i32, got {}", to_string(in[at + 2])));
      }
      const auto& dims = ints_attr(k, a, "dims");
      if (dims.empty() || dims.size() > static_cast<size_t>(t.rank)) fail(k, fmt::format("needs 1..{} tile dims", t.rank));
      std::vector<bool> seen(static_cast<size_t>(t.rank), false);
      for (int64_t d : dims) {
        if (d < 0 || d >= t.rank || seen[static_cast<size_t>(d)])
          fail(k, fmt::format("dims {} must be distinct tensor dims in [0, {})", shape_string(dims), t.rank));
        seen[static_cast<size_t>(d)] = true;
      }
      if (k == block_load) {
        Shape s = ints_attr(k, a, "shape");
        expect_valid_shape(k, s);
        if (s.size() != dims.size()) fail(k, fmt::format("shape {} and dims {} differ in length", shape_string(s), shape_string(dims)));
        if (!a.count("padding")) fail(k, "missing attribute 'padding'");
        return {Type::tile(t.dtype, s)};
      }
      const Type& v = in[1];
      if (!v.is_value() || v.dtype != t.dtype || v.shape.size() != dims.size())
        fail(k, fmt::format("value must be a {}-D tile of {}, got {}", dims.size(), name(t.dtype), to_string(v)));
      if (auto it = a.find("reduce"); it != a.end()) {
        const auto* r = std::get_if<std::string>(&it->second);
        const std::optional<AtomicRmw> rmw = r ? parse_atomic_rmw(*r) : std::nullopt;
        if (!rmw || *rmw == AtomicRmw::xchg) fail(k, "attribute 'reduce' must be \"add\", \"max\", \"min\", \"and\", \"or\" or \"xor\"");
        if (*rmw != AtomicRmw::add && !atomic_dtype_error(rmw, t.dtype).empty())
          fail(k, fmt::format("reduce = \"{}\" takes {} tensors, got {}", *r, atomic_dtype_error(rmw, t.dtype), name(t.dtype)));
      }
      return {};
    }
    default:
      break;
  }
  fail(k, "no type rule");
}

// Control flow and synchronisation: semaphores, turns, channels, warp roles, loops, ifs.
std::vector<Type> control_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  switch (k) {
    case timestamp:
      expect_count(k, in, 1);
      if (!in[0].is_pointer() || !in[0].is_scalar() || in[0].dtype != DType::u64)
        fail(k, fmt::format("the destination must be a scalar pointer to u64, got {}", to_string(in[0])));
      return {};
    case wait_ge:
    case signal_add: {
      expect_count(k, in, 2);
      if (!in[0].is_pointer() || !in[0].is_scalar() || in[0].dtype != DType::i32)
        fail(k, fmt::format("the semaphore must be a scalar pointer to i32, got {}", to_string(in[0])));
      if (in[1] != Type::scalar(DType::i32))
        fail(k, fmt::format("the {} must be an i32 scalar, got {}", k == wait_ge ? "target" : "value", to_string(in[1])));
      return {};
    }
    case turn_begin:
    case turn_end: expect_count(k, in, 0); return {};
    case ring_producer: {
      expect_count(k, in, 0);
      for (const char* name : {"producer_registers", "consumer_registers"}) {
        auto it = a.find(name);
        const int64_t* v = it == a.end() ? nullptr : std::get_if<int64_t>(&it->second);
        if (!v || *v < 24 || *v > 256 || *v % 8 != 0)
          fail(k, fmt::format("{} must be a multiple of 8 in [24, 256]{}", name, v ? fmt::format(", got {}", *v) : ""));
      }
      return {};
    }
    case channel_push:
    case channel_pop: {
      expect_count(k, in, k == channel_push ? 2 : 1);
      if (in[0] != Type::scalar(DType::i32)) fail(k, fmt::format("the index must be an i32 scalar, got {}", to_string(in[0])));
      axis_attr(k, a, "channel", 0, 1 << 20);
      axis_attr(k, a, "stages", 1, 16);
      const Type t = Type::tile(dtype_attr(k, a), ints_attr(k, a, "shape"));
      expect_valid_shape(k, t.shape);
      if (k == channel_pop) return {t};
      if (in[1] != t) fail(k, fmt::format("the channel carries {}, got {}", to_string(t), to_string(in[1])));
      return {};
    }
    case warp_roles: {
      expect_count(k, in, 0);
      const auto& warps = ints_attr(k, a, "warps");
      if (warps.size() < 2 || ints_attr(k, a, "max_registers").size() != warps.size())
        fail(k, "needs two or more roles, each with warps and max_registers");
      return {};
    }
    case for_: {
      if (in.size() < 3) fail(k, "needs lower bound, upper bound and step");
      for (int i = 0; i < 3; ++i) expect_scalar_int(k, in[static_cast<size_t>(i)], "loop bound");
      if (in[0] != in[1] || in[0] != in[2]) fail(k, "bounds and step must have the same integer type");
      return {in.begin() + 3, in.end()};
    }
    case yield:
      return {};
    case if_:
      throw std::logic_error("infer_result_types: the results of 'if' come from its regions");
    default:
      break;
  }
  fail(k, "no type rule");
}

}  // namespace

std::vector<Type> infer_result_types(OpKind k, const std::vector<Type>& in, const AttrMap& a) {
  using enum OpKind;
  if (is_elementwise_binary(k) || is_elementwise_unary(k)) return elementwise_types(k, in, a);
  switch (k) {
    case cmp:
    case byte_perm:
    case fma:
    case select: return elementwise_types(k, in, a);
    case constant:
    case arange:
    case splat:
    case broadcast:
    case expand_dims:
    case reshape:
    case trans: return shape_types(k, in, a);
    case cast:
    case bitcast:
    case pack_pairs:
    case unpack_pairs:
    case precompute: return conversion_types(k, in, a);
    case reduce:
    case scan:
    case reduce_with:
    case xor_permute:
    case gather:
    case histogram:
    case dot: return reduction_types(k, in, a);
    case program_id:
    case num_programs:
    case tensor_ptr:
    case tensor_dim:
    case tensor_stride:
    case tensor_slice:
    case addptr:
    case load:
    case store:
    case atomic_add:
    case atomic_rmw:
    case atomic_cas: return memory_types(k, in, a);
    case block_load:
    case block_store: return window_types(k, in, a);
    case wait_ge:
    case signal_add:
    case timestamp:
    case turn_begin:
    case turn_end:
    case ring_producer:
    case channel_push:
    case channel_pop:
    case warp_roles:
    case for_:
    case yield:
    case if_: return control_types(k, in, a);
    default:
      break;
  }
  fail(k, "no type rule");
}

std::optional<WindowOrder> window_order(const Op& op) {
  if (op.kind != OpKind::block_store || !op.attrs.count("after_semaphore")) return std::nullopt;
  const bool signal = op.attrs.count("signal_after") != 0;
  const size_t n = op.operands.size() - (signal ? 1 : 0);
  WindowOrder w{op.operands[n - 2], op.operands[n - 1], std::nullopt};
  if (signal) w.signal = op.operands.back();
  return w;
}

}  // namespace tilejit::ir
