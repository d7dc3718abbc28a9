// Tile accessors and Var bookkeeping (registration with the builder, compound assignment).
#include <fmt/format.h>

#include "dsl/ops.hpp"

namespace tilejit::lang {

const ir::Type& Tile::type() const {
  if (!b_) throw BuildError("<none>", "<unknown>", "an empty Tile was used (declared but never assigned)");
  return b_->type(v_);
}

Tile Tile::operator[](ColIndex) const { return expand_dims(*this, rank(), Loc{}); }
Tile Tile::operator[](RowIndex) const { return expand_dims(*this, 0, Loc{}); }
Tile Tile::to(DType d, std::source_location loc) const { return cast(d, *this, loc); }

Var::Var(const Tile& init, std::source_location loc) : value_(init), b_(&Builder::current(loc)), decl_(loc) {
  if (!init.valid()) b_->fail(loc, "a Var must be initialised with a value");
  if (init.builder() != b_) b_->fail(loc, "a Var is initialised with a value of another kernel");
  b_->register_var(this);
}

Var::Var(const Var& other, std::source_location loc) : Var(other.value(), loc) {}

Var::~Var() { b_->unregister_var(this); }

Var& Var::operator=(const Tile& t) {
  if (!t.valid() || t.builder() != b_) b_->fail(decl_, "a Var is assigned a value of another kernel or an empty Tile");
  value_ = t;
  return *this;
}

Var& Var::operator+=(const Operand& o) { return *this = value_ + o; }
Var& Var::operator-=(const Operand& o) { return *this = value_ - o; }
Var& Var::operator*=(const Operand& o) { return *this = value_ * o; }
Var& Var::operator/=(const Operand& o) { return *this = value_ / o; }

}  // namespace tilejit::lang
