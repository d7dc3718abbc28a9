// Kernel definition: a Kernel is a name and a C++ body that, run by a Builder for one binding of
// its meta-parameters, declares the signature and builds the tile IR (one ir::Function).
#pragma once
#include <functional>
#include <limits>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dsl/tile.hpp"

namespace tilejit::lang {

inline constexpr DType i1 = DType::i1, i8 = DType::i8, i16 = DType::i16, i32 = DType::i32, i64 = DType::i64;
inline constexpr DType u8 = DType::u8, u16 = DType::u16, u32 = DType::u32, u64 = DType::u64;
inline constexpr DType f16 = DType::f16, bf16 = DType::bf16, f32 = DType::f32, f64 = DType::f64;
inline constexpr DType f8e4m3 = DType::f8e4m3, f8e5m2 = DType::f8e5m2;
using ir::ParamSpec;
using Loc = std::source_location;

// A kernel-construction error: which kernel, where in the user's C++ source, and what is wrong.
struct BuildError : std::runtime_error {
  BuildError(std::string kernel, std::string where, std::string message);
  std::string kernel, where, message;
};

// Meta-parameter values for one specialisation, e.g. {{"BLOCK_M", 64}, {"DTYPE", bf16}}.
using Meta = std::vector<std::pair<std::string, ir::MetaValue>>;

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bool>) return DType::i1;
  else if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, uint32_t>) return DType::u32;
  else if constexpr (std::is_same_v<T, uint64_t>) return DType::u64;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::i64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
  else static_assert(sizeof(T) == 0, "unsupported scalar parameter type");
}

class Builder {
 public:
  using Loc = std::source_location;
  Builder(std::string kernel_name, const Meta& meta);
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  // ---- the signature (parameters in declaration order) ----
  Tile pointer(const std::string& name, DType pointee, ParamSpec spec = {}, Loc loc = Loc::current());
  Tensor tensor(const std::string& name, DType dtype, int rank, ParamSpec spec = {}, Loc loc = Loc::current());
  Tile scalar(const std::string& name, DType dtype, Loc loc = Loc::current());
  template <class T>
  Tile scalar(const std::string& name, Loc loc = Loc::current()) {
    return scalar(name, dtype_of<T>(), loc);
  }
  // A launch requirement: a.size(a_dim) == b.size(b_dim) (e.g. a GEMM's K in A and in B). The
  // launcher and the interpreter refuse arguments that break it, naming both tensors and `why`.
  void same_size(const Tensor& a, int a_dim, const Tensor& b, int b_dim, std::string why = {}, Loc loc = Loc::current());

  // ---- compile-time meta-parameters: plain C++ values while the body runs ----
  int64_t meta_int(const std::string& name, std::optional<int64_t> def = {}, Loc loc = Loc::current());
  bool meta_bool(const std::string& name, std::optional<bool> def = {}, Loc loc = Loc::current());
  DType meta_dtype(const std::string& name, std::optional<DType> def = {}, Loc loc = Loc::current());
  template <class T>
  T meta(const std::string& name, std::optional<T> def = {}, Loc loc = Loc::current()) {
    if constexpr (std::is_same_v<T, bool>) return meta_bool(name, def, loc);
    else if constexpr (std::is_same_v<T, DType>) return meta_dtype(name, def, loc);
    else {
      // a value the declared type cannot hold is an error, never a truncated (and differently keyed) kernel
      const int64_t x = meta_int(name, def ? std::optional<int64_t>(*def) : std::nullopt, loc);
      if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(int64_t)) {
        if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) || x > static_cast<int64_t>(std::numeric_limits<T>::max()))
          meta_out_of_range(name, x, static_cast<int64_t>(std::numeric_limits<T>::min()),
                            static_cast<int64_t>(std::numeric_limits<T>::max()), loc);
      } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
        if (x < 0) meta_out_of_range(name, x, 0, std::numeric_limits<int64_t>::max(), loc);
      }
      return static_cast<T>(x);
    }
  }

  Tile program_id(int axis, Loc loc = Loc::current());
  Tile num_programs(int axis, Loc loc = Loc::current());
  const std::string& kernel_name() const { return fn_.name; }

  // ---- used by the DSL functions (not needed by kernel authors) ----
  static Builder& current(const Loc& loc);  // the builder running on this thread
  const ir::Type& type(ir::ValueId v) const { return fn_.type(v); }
  // Append an op to the current block; result types from the IR type rules.
  std::vector<ir::ValueId> emit(ir::OpKind kind, std::vector<ir::ValueId> operands, ir::AttrMap attrs, const Loc& loc);
  Tile emit1(ir::OpKind kind, std::vector<ir::ValueId> operands, ir::AttrMap attrs, const Loc& loc);
  [[noreturn]] void fail(const Loc& loc, const std::string& message) const;
  std::string where(const Loc& loc) const;

  // Region construction for for_range / if_: build into `block`, then hand the op over.
  ir::ValueId new_value(const ir::Type& t) { return fn_.new_value(t); }
  void enter(ir::Block& block);
  void leave();
  void append(ir::Op op);  // an op whose results were created with new_value (for_, if_)
  std::vector<Var*> live_vars() const { return vars_; }
  static void set_var(Var& v, Tile t) { v.value_ = t; }

  void register_var(Var* v) { vars_.push_back(v); }
  int64_t new_channel_id() { return next_channel_++; }  // lang::Channel: one id per channel of the kernel
  void unregister_var(Var* v);

  // Finish: every meta binding used, the IR verified. Called by Kernel::build.
  ir::Function finish();

 private:
  struct Scope {
    ir::Block* block;
    std::vector<ir::ValueId> defined;
  };
  void define(ir::ValueId v);
  void add_param(const std::string& name, ir::ParamKind kind, const ir::Type& t, ParamSpec spec, const Loc& loc);
  const ir::MetaValue* lookup_meta(const std::string& name, const Loc& loc);
  size_t tensor_param_index(const Tensor& t, const char* what, const Loc& loc) const;
  [[noreturn]] void meta_out_of_range(const std::string& name, int64_t value, int64_t lo, int64_t hi, const Loc& loc);

  ir::Function fn_;
  const Meta& meta_;
  std::vector<bool> meta_used_;
  std::vector<Scope> scopes_;
  std::vector<bool> visible_;
  std::vector<Var*> vars_;
  int64_t next_channel_ = 0;
  Loc last_loc_{};
};

class Kernel {
 public:
  using Body = std::function<void(Builder&)>;
  Kernel(std::string name, Body body);
  const std::string& name() const { return name_; }
  // Run the body for this meta binding; returns verified tile IR or throws BuildError.
  ir::Function build(const Meta& meta = {}) const;

 private:
  std::string name_;
  Body body_;
};

inline Kernel kernel(std::string name, Kernel::Body body) { return Kernel(std::move(name), std::move(body)); }

}  // namespace tilejit::lang
