// Replays a fuzz Program's nodes into the DSL (the Builder of a kernel being built): the one place
// that turns a Node into DSL calls, used while generating (node by node) and when rebuilding an
// edited program (whole).
#pragma once
#include <memory>
#include <vector>

#include "dsl/lang.hpp"
#include "tools/fuzz/program.hpp"

namespace tilejit::fuzz {

class Emitter {
 public:
  Emitter(lang::Builder& b, Program& p);
  void declare_params();   // tensors, then scalars, in the Program's order
  // One node that is not a control-flow marker; records the result's dtype and shape in the node.
  void emit(size_t index);
  // Every node in order, loops and ifs included.
  void replay();

  const lang::Tile& value(int node) const { return values_.at(static_cast<size_t>(node)); }
  void set_value(size_t node, lang::Tile t) { values_.at(node) = t; }
  void ensure_size() { values_.resize(p_.nodes.size()); }
  lang::Builder& builder() { return b_; }

 private:
  size_t replay_block(size_t i);  // until the marker that ends the block; returns its index
  lang::Operand literal(DType d, double v, int64_t iv) const;
  lang::Tile store_pointers(const lang::Tensor& o) const;  // output [pid] as a [R, C] pointer tile
  lang::Tile along_axis(const Node& n);  // scans, combine reductions, xor_permute, gather

  lang::Builder& b_;
  Program& p_;
  std::vector<lang::Tile> values_;
  std::vector<lang::Tensor> tensors_;
  std::vector<lang::Tile> scalars_;
  std::vector<std::unique_ptr<lang::Var>> vars_;
};

// The Program built into tile IR (throws lang::BuildError when the program is not well-typed).
ir::Function build(Program& p);

// True when `kind` is one of the loop/if markers.
bool is_marker(NodeKind kind);

}  // namespace tilejit::fuzz
