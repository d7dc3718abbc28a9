// Printing of IR types.
#include "dsl/ir/type.hpp"

#include <fmt/format.h>

namespace tilejit::ir {

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

std::string to_string(const Type& t) {
  std::string dims = t.shape.empty() ? std::string{} : shape_string(t.shape);
  switch (t.kind) {
    case TypeKind::Value: return fmt::format("{}{}", name(t.dtype), dims);
    case TypeKind::Pointer: return fmt::format("ptr<{}>{}", name(t.dtype), dims);
    case TypeKind::Tensor: return fmt::format("tensor<{},{}>", name(t.dtype), t.rank);
  }
  return "?";
}

}  // namespace tilejit::ir
