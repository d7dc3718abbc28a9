// The values a kernel author handles: Tile (an immutable SSA value: scalar or tile), Var (a mutable
// variable that becomes loop-carried when reassigned inside for_range/if_), Operand (a Tile or a
// C++ number, carrying the source location of the expression), and Tensor (a strided global tensor).
#pragma once
#include <concepts>
#include <cstdint>
#include <source_location>
#include <type_traits>
#include <vector>

#include "dsl/ir/function.hpp"

namespace tilejit::lang {

using ir::DType;
using ir::Shape;
class Builder;
class Var;
class Operand;
struct BlockRef;

// Index helpers: t[col] is t[:, None] (a column), t[row] is t[None, :] (a row).
struct ColIndex {};
struct RowIndex {};
inline constexpr ColIndex col{};
inline constexpr RowIndex row{};

class Tile {
 public:
  Tile() = default;
  Tile(Builder* b, ir::ValueId v) : b_(b), v_(v) {}

  bool valid() const { return b_ != nullptr; }
  Builder* builder() const { return b_; }
  ir::ValueId id() const { return v_; }
  const ir::Type& type() const;
  DType dtype() const { return type().dtype; }
  const Shape& shape() const { return type().shape; }
  int rank() const { return static_cast<int>(shape().size()); }

  Tile operator[](ColIndex) const;  // [N] -> [N, 1]
  Tile operator[](RowIndex) const;  // [N] -> [1, N]
  Tile to(DType d, std::source_location loc = std::source_location::current()) const;

 private:
  Builder* b_ = nullptr;
  ir::ValueId v_ = 0;
};

// A mutable kernel variable. Reassigning it inside a for_range body makes it a loop-carried value
// of that loop; inside an if_ branch, a result of the if. Its type may not change inside a body.
class Var {
 public:
  Var(const Tile& init, std::source_location loc = std::source_location::current());  // NOLINT: implicit on purpose
  Var(const Var& other, std::source_location loc = std::source_location::current());
  Var& operator=(const Tile& t);
  Var& operator=(const Var& other) { return *this = other.value(); }
  ~Var();

  operator Tile() const { return value_; }  // NOLINT: implicit on purpose
  const Tile& value() const { return value_; }
  DType dtype() const { return value_.dtype(); }
  const Shape& shape() const { return value_.shape(); }
  Tile operator[](ColIndex c) const { return value_[c]; }
  Tile operator[](RowIndex r) const { return value_[r]; }
  const std::source_location& declared_at() const { return decl_; }

  Var& operator+=(const Operand& o);
  Var& operator-=(const Operand& o);
  Var& operator*=(const Operand& o);
  Var& operator/=(const Operand& o);

 private:
  friend class Builder;
  Tile value_;
  Builder* b_;
  std::source_location decl_;
};

// A Tile, a Var or a C++ number. Numbers are weakly typed: they take the dtype of the tile they
// meet (1.5 with a bf16 tile is a bf16 constant), as Python numbers do in Triton. The implicit
// constructors record where the expression was written, which build errors report.
class Operand {
 public:
  Operand(const Tile& t, std::source_location loc = std::source_location::current())  // NOLINT
      : tile_(t), loc_(loc) {}
  Operand(const Var& v, std::source_location loc = std::source_location::current())  // NOLINT
      : tile_(v.value()), loc_(loc) {}
  template <class T>
    requires std::is_arithmetic_v<T>
  Operand(T x, std::source_location loc = std::source_location::current())  // NOLINT
      : literal_(true), loc_(loc) {
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = LiteralKind::Bool;
      int_ = x ? 1 : 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      kind_ = LiteralKind::Float;
      float_ = static_cast<double>(x);
    } else if constexpr (std::is_unsigned_v<T> && sizeof(T) == 8) {
      kind_ = LiteralKind::UInt64;
      int_ = static_cast<int64_t>(x);
    } else {
      kind_ = LiteralKind::Int;
      int_ = static_cast<int64_t>(x);
    }
  }

  enum class LiteralKind { Bool, Int, UInt64, Float };
  bool is_literal() const { return literal_; }
  const Tile& tile() const { return tile_; }
  LiteralKind literal_kind() const { return kind_; }
  int64_t int_value() const { return int_; }
  double float_value() const { return kind_ == LiteralKind::Float ? float_ : static_cast<double>(int_); }
  const std::source_location& loc() const { return loc_; }

 private:
  Tile tile_;
  bool literal_ = false;
  LiteralKind kind_ = LiteralKind::Int;
  int64_t int_ = 0;
  double float_ = 0;
  std::source_location loc_;
};

// A strided global tensor parameter (base pointer, sizes, strides); see Builder::tensor.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Tile descriptor) : desc_(descriptor) {}
  const Tile& descriptor() const { return desc_; }
  DType dtype() const { return desc_.type().dtype; }
  int rank() const { return desc_.type().rank; }

  Tile ptr(std::source_location loc = std::source_location::current()) const;
  Tile size(int dim, std::source_location loc = std::source_location::current()) const;    // i32
  Tile stride(int dim, std::source_location loc = std::source_location::current()) const;  // i64, elements
  // A view of the same tensor whose dim `dim` starts at `start` and has `length` elements (i32
  // scalars, possibly runtime values); other dims, strides and dtype are unchanged. Windows on the
  // view are bounds-checked against the view: e.g. one sequence of a packed (varlen) batch.
  Tensor slice(int dim, const Operand& start, const Operand& length,
               std::source_location loc = std::source_location::current()) const;
  // The window starting at `offsets` (one per tensor dim) of the given tile shape; tile dim i spans
  // tensor dim dims[i] (default: the last shape.size() dims, in order). Out-of-range elements read
  // as the padding value and are not written. This is the form that maps to TMA on Hopper.
  BlockRef block(std::vector<Operand> offsets, Shape shape, std::vector<int64_t> dims = {},
                 std::source_location loc = std::source_location::current()) const;

 private:
  Tile desc_;
};

struct BlockRef {
  Tensor tensor;
  std::vector<Tile> offsets;
  Shape shape;
  std::vector<int64_t> dims;
  std::source_location loc;
};

// Arithmetic, comparison and bit operators (numpy broadcasting, Triton-like promotion).
// Integer '/' and '%' follow C++ (truncation), not Python.
Tile operator+(const Operand& a, const Operand& b);
Tile operator-(const Operand& a, const Operand& b);
Tile operator*(const Operand& a, const Operand& b);
// x * scale (floats), which the compiled kernel skips for a warp whose elements of `scale` are all
// exactly 1 (a branch on a vote: the warp issues none of the multiplies). Bit-identical to x * scale;
// worth it when scale is usually 1 (the attention forward's output rescale, LAZY_RESCALE).
Tile scale_lazily(const Operand& x, const Operand& scale, std::source_location loc = std::source_location::current());
Tile operator/(const Operand& a, const Operand& b);
Tile operator%(const Operand& a, const Operand& b);
Tile operator&(const Operand& a, const Operand& b);
Tile operator|(const Operand& a, const Operand& b);
Tile operator^(const Operand& a, const Operand& b);
Tile operator<<(const Operand& a, const Operand& b);
Tile operator>>(const Operand& a, const Operand& b);
Tile operator<(const Operand& a, const Operand& b);
Tile operator<=(const Operand& a, const Operand& b);
Tile operator>(const Operand& a, const Operand& b);
Tile operator>=(const Operand& a, const Operand& b);
Tile operator==(const Operand& a, const Operand& b);
Tile operator!=(const Operand& a, const Operand& b);
Tile operator-(const Operand& a);
Tile operator~(const Operand& a);
Tile operator!(const Operand& a);

}  // namespace tilejit::lang
