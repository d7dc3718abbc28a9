// A random DSL program as data: the fuzzer's unit of generation, replay, reduction and report.
// A Program is a flat list of Nodes in build order (loops and ifs as begin/end markers), so that
// the reducer can edit it and the printer can write it back as the C++ a user would have written.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir/dtype.hpp"
#include "dsl/ir/type.hpp"

namespace tilejit::fuzz {

using ir::DType;
using ir::Shape;

// How an input tensor is filled (every fill is reproducible from the tensor's seed).
enum class Fill : uint8_t {
  SmallInts,  // integers in [-3, 3] ([0, 6] unsigned): dots and float sums of them are exact
  Normal,     // floats: normal(0, scale); ints: uniform in a moderate range
  Specials,   // a mix of edge values (0, -0, +-inf, NaN, subnormals, extremes, powers of two)
  Bits,       // every bit pattern (ints: the full range)
};

struct TensorSpec {
  DType dtype = DType::f32;
  Shape shape;          // inputs: [rows, cols]; outputs: [programs, R, C]
  Fill fill = Fill::Normal;
  double scale = 1;     // Normal's standard deviation
  uint64_t seed = 0;
  bool output = false;  // outputs start poisoned (0xFF bytes) on both sides
  bool accumulator = false;  // filled like an input, then atomically added into
  bool contiguous = false;   // declared contiguous_last (vector and TMA accesses)
  int align = 0;             // declared align_bytes
};

enum class NodeKind : uint8_t {
  Scalar,      // scalar parameter #param (value in `value`/`ivalue`)
  Constant,    // full(dtype, shape, value)
  Arange,      // arange(0, ivalue) viewed as: sub 0 as is, 1 [col], 2 [row]
  ProgramId,   // program_id(0)
  LoadPtr,     // masked load of input `tensor` at rows args[0] + arange(R), cols args[1] + arange(C); other `value`
  LoadBlock,   // load(tensor.block({args[0], args[1]}, shape), padding `value`)
  Unary,       // sub = ir::OpKind
  Binary,      // sub = ir::OpKind (cmp: `ivalue` is the predicate index)
  Select,      // where(args[0], args[1], args[2])
  Fma,         // fma(args[0], args[1], args[2])
  Cast,        // cast(dtype, args[0])
  Bitcast,     // bitcast(dtype, args[0])
  Broadcast,   // broadcast args[0] (rank <= 2) to `shape` via expand_dims on the left
  Trans,       // trans(args[0])
  Reduce,      // sub 0 sum, 1 max, 2 min over axis ivalue (-1: all axes)
  Dot,         // dot(args[0], args[1]) (+ args[2] when present)
  PackPairs,   // pack_pairs(args[0])
  UnpackPairs, // unpack_pairs(dtype, args[0])
  VarDecl,     // Var #var = args[0] (top level only)
  VarRead,     // the current value of Var #var
  VarAssign,   // Var #var = args[0]
  LoopBegin,   // for_range(args[0], args[1], ivalue): the node's value is the induction variable
  LoopEnd,
  IfBegin,     // if_(args[0], then...
  IfElse,      // ...else...
  IfEnd,
  Store,       // output `tensor` [pid] <- args[0] (a [R, C] tile): sub 0 pointers, 1 window at
               // rows/cols offsets args[1], args[2] (StoreOptions::tma under --tma-stores), 2 pointers
               // masked by args[1], 3 the window of 1 by a generic store (--tma-stores read-backs only)
  AtomicAdd,   // old = atomic_add(output `tensor` [pid] pointers, args[0]) (no two programs collide)
  AtomicBlock, // atomic_{add, max, min, and, or, xor}[sub](accumulator `tensor`.block({args[1], args[2]}, [R, C]), args[0])
               // (all programs; one sub per program, so the result does not depend on their order)
  LoadOutput,  // load(output `tensor`.block({pid, args[0], args[1]}, shape, dims {1, 2}), padding 0): what
               // this program stored so far (poison before), read back in another layout (in-place
               // updates: the lowering must order them between threads, decision 047)
  // along an axis (`ivalue`) with a combine `sub`: 0 a + b, 1 maximum, 2 minimum, 3 a (the first),
  // 4 b (the last: order-sensitive)
  Scan,        // associative_scan(args[0], axis, combine, reverse = `value` != 0)
  ReduceWith,  // reduce(args[0], axis, combine)
  XorPermute,  // xor_permute(args[0], axis, mask `sub`)
  Gather,      // gather(args[0], cast(i32, args[1]) & (axis length - 1), axis)
  Histogram,   // histogram(args[0], 2^sub bins) of an integer tile (any shape): i32[2^sub]
};

struct Node {
  NodeKind kind = NodeKind::Constant;
  int sub = 0;
  std::vector<int> args;
  DType dtype = DType::f32;  // the result (after a build: what the DSL made)
  Shape shape;
  double value = 0;
  int64_t ivalue = 0;
  int tensor = -1;
  int var = -1;
  bool exact = true;   // the README promises this value bit for bit on the GPU
  bool small = false;  // holds small integers exactly (sums and dots of such values are exact)
  int approx_depth = 0;  // approximate operations on the way to this value
  // |value| <= 2^20 where finite (or any 16-bit value): a float sum of it cannot overflow in one
  // order and not in another (the GPU's order differs from the interpreter's)
  bool bounded = false;
  bool removed = false;  // set by the reducer: the node is skipped (its uses were replaced first)
};

struct ScalarParam {
  DType dtype = DType::i32;
  int64_t ivalue = 0;  // integers (u64 as bits)
  double fvalue = 0;   // floats
};

struct Program {
  uint64_t seed = 0;
  int num_warps = 4;
  int64_t programs = 1;  // grid x
  int64_t R = 16, C = 16;  // the main tile shape
  bool tma_stores = false;  // window stores ask for TMA (StoreOptions::tma; GenerateOptions::tma_stores)
  std::vector<TensorSpec> tensors;
  std::vector<ScalarParam> scalars;
  std::vector<Node> nodes;

  bool has_output() const;
};

struct GenerateOptions {
  int max_nodes = 40;
  bool wgmma = true;        // dots shaped for wgmma and TMA K loops
  bool pack_pairs = true;
  bool narrow_reductions = true;  // reductions over i8/i16/u8/u16 tiles
  bool fp8 = false;         // fp8 casts and dot inputs
  bool axis_ops = true;     // scans, reductions with a combine, xor_permute, gather (since 0.1.4)
  // window stores with StoreOptions::tma, and most programs drawn so that some window stores meet
  // the TMA store path's conditions (generate.cpp tma_shape / tma_output / tma_offset / tma_epilogue;
  // other programs than without for the same seed, which stay as they were)
  bool tma_stores = false;
};

Program generate(uint64_t seed, const GenerateOptions& opts = {});

// The program as C++ DSL source (a kernel a user could paste into a test), with its launch.
std::string to_cpp(const Program& p);

}  // namespace tilejit::fuzz
