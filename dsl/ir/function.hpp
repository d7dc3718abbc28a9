// A kernel in the tile IR: its parameters, its meta-parameter specialisation, the value table and
// the body. Also the few structural utilities every pass needs (walk, replace uses, type rules).
#pragma once
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "dsl/ir/op.hpp"

namespace tilejit::ir {

// What a launch must guarantee about a pointer or tensor parameter. Declared in the kernel's
// signature (never guessed from values) so it can specialise code; checked before every launch.
struct ParamSpec {
  // Base address, and for tensors every stride but the innermost (in bytes), divisible by this
  // (0: only the element size). Lets the compiler use vector and TMA accesses.
  int align_bytes = 0;
  bool contiguous_last = false;   // tensor: innermost stride == 1
  // Integer scalar: the value is a multiple of this (0: nothing known). Set by the launch-time
  // specialisation (runtime/specialization.hpp), checked at every launch.
  int divisible_by = 0;
  bool operator==(const ParamSpec&) const = default;
};

enum class ParamKind : uint8_t { Scalar, Pointer, Tensor };

struct Param {
  std::string name;
  ParamKind kind{};
  Type type;      // scalar dtype, ptr<T>, or tensor<T,rank>
  ValueId value;  // the body block argument carrying it
  ParamSpec spec;
};

using MetaValue = std::variant<int64_t, bool, DType>;
std::string to_string(const MetaValue& v);

struct MetaEntry {
  std::string name;
  MetaValue value;
};

struct ValueInfo {
  Type type;
  std::string name;  // hint for printing (parameters); empty for temporaries
};

// A launch requirement a kernel states about its tensor arguments: dim `a_dim` of parameter `a`
// has the size of dim `b_dim` of parameter `b` (a GEMM's K in A and in B). Checked by the launcher
// and the interpreter; not part of the code, the printed IR or the cache key.
struct SizeRelation {
  size_t a = 0;
  int a_dim = 0;
  size_t b = 0;
  int b_dim = 0;
  std::string why;  // what the sizes are ("A's K and B's K")
};

struct Function;
// "" when the sizes agree, else the error the launcher and the interpreter give, naming both
// arguments, their sizes and the relation's `why`.
std::string size_relation_error(const Function& f, const SizeRelation& r, int64_t a_size, int64_t b_size);

struct Function {
  std::string name;
  std::vector<Param> params;
  std::vector<SizeRelation> size_relations;
  std::vector<MetaEntry> meta;  // the specialisation this body was built for, in declaration order
  std::vector<ValueInfo> values;
  Block body;  // args: one per parameter

  ValueId new_value(Type t, std::string name_hint = {});
  const Type& type(ValueId v) const { return values.at(v).type; }
  const Param* find_param(std::string_view name) const;
  const MetaEntry* find_meta(std::string_view name) const;
};

// Visit every op, outer before inner, in program order.
void walk(Block& b, const std::function<void(Op&)>& fn);
void walk(const Block& b, const std::function<void(const Op&)>& fn);
// Replace every use of `from` by `to` inside `b` (operands and nested regions).
void replace_all_uses(Block& b, ValueId from, ValueId to);

// The type rules, shared by the DSL (which reports violations with the user's source location)
// and the verifier: the result types an op of `kind` with these operand types and attributes has.
// Throws TypeError on a violation; regions (for_/if_) are checked by the verifier.
struct TypeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
std::vector<Type> infer_result_types(OpKind kind, const std::vector<Type>& operands, const AttrMap& attrs);

// The first tile value whose dims are not all powers of two, as the GPU backends refuse it
// ("arange at f.cpp:10: tile dimensions must be powers of two for the GPU backend, got i32[96]"),
// or "" when there is none. The interpreter applies it by default, so CPU runs fail as compiles do.
std::string gpu_shape_violation(const Function& f);

// Text form, stable across processes and builds (see printer.cpp for the grammar).
struct PrintOptions {
  bool locations = false;  // append "loc(file:line)" to each op
};
std::string print(const Function& f, PrintOptions opts = {});

// Structural checks every pass can call; throws VerifyError naming the kernel and the op.
struct VerifyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void verify(const Function& f);

// A canonical serialisation (independent of pointers, addresses and hash-map order) and its
// SHA-256: equal for structurally identical kernels built in any process. The compile-cache key.
std::string serialize(const Function& f);
std::string structural_hash(const Function& f);  // 64 hex digits

}  // namespace tilejit::ir
