// Types of tile-IR values: scalars and tiles of an element type, pointers (scalar or tile), and
// tensor descriptors (a global tensor's base pointer, sizes and strides, passed as one parameter).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir/dtype.hpp"

namespace tilejit::ir {

using Shape = std::vector<int64_t>;

enum class TypeKind : uint8_t {
  Value,    // number: scalar (empty shape) or tile
  Pointer,  // global pointer to `dtype`: scalar or tile of pointers
  Tensor,   // descriptor of a strided global tensor of `dtype` and `rank` dimensions (always scalar)
};

struct Type {
  TypeKind kind = TypeKind::Value;
  DType dtype = DType::f32;
  Shape shape;   // empty for scalars
  int rank = 0;  // Tensor only

  static Type scalar(DType t) { return {TypeKind::Value, t, {}, 0}; }
  static Type tile(DType t, Shape s) { return {TypeKind::Value, t, std::move(s), 0}; }
  static Type pointer(DType pointee, Shape s = {}) { return {TypeKind::Pointer, pointee, std::move(s), 0}; }
  static Type tensor(DType t, int rank) { return {TypeKind::Tensor, t, {}, rank}; }

  bool is_scalar() const { return shape.empty(); }
  bool is_value() const { return kind == TypeKind::Value; }
  bool is_pointer() const { return kind == TypeKind::Pointer; }
  bool is_tensor() const { return kind == TypeKind::Tensor; }
  int64_t numel() const;
  Type with_shape(Shape s) const { Type t = *this; t.shape = std::move(s); return t; }
  Type with_dtype(DType d) const { Type t = *this; t.dtype = d; return t; }

  friend bool operator==(const Type&, const Type&) = default;
};

// "f32", "bf16[64,128]", "ptr<f16>", "ptr<f16>[128]", "tensor<bf16,4>"
std::string to_string(const Type& t);
std::string shape_string(const Shape& s);

}  // namespace tilejit::ir
