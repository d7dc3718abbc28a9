// Operations of the tile IR: the op kinds, their attributes, source locations, and the
// Op/Block structure (an Op may own regions, each a Block with arguments, for loops and ifs).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dsl/ir/type.hpp"

namespace tilejit::ir {

// a dot's DotOptions::descriptors_at_use, a schedule hint (absent: off)
inline constexpr const char* kDescriptorsAtUseAttr = "descriptors_at_use";
// a dot's DotOptions::staging_at_use, a schedule hint (absent: off)
inline constexpr const char* kStagingAtUseAttr = "staging_at_use";
// a block store's StoreOptions: tma (1; absent: off) and, with it, offsets_at_store (1; absent: off)
inline constexpr const char* kTmaStoreAttr = "tma";
inline constexpr const char* kOffsetsAtStoreAttr = "offsets_at_store";
// a block add's AddOptions::narrow_staging (1; absent: off)
inline constexpr const char* kNarrowStagingAttr = "narrow_staging";

using ValueId = uint32_t;

// histogram's largest num_bins: on the GPU a program counts in shared memory, 4 bytes a bin.
constexpr int64_t kMaxHistogramBins = 16384;

// The op set. Elementwise ops take operands of identical type (the DSL inserts the broadcasts and
// casts), so every pass below sees explicit shapes and dtypes. Semantics are documented in
// README.md ("The tile IR") and implemented exactly by the interpreter.
enum class OpKind : uint8_t {
  // values
  constant,       // {value} -> T (scalar, or every element of a tile)
  arange,         // {start,end} -> i32[end-start]
  splat,          // (scalar) -> tile of the result shape
  broadcast,      // (t) -> t with size-1 dims stretched to {shape}
  expand_dims,    // (t) {axis} -> t with a size-1 dim inserted at axis
  reshape,        // (t) {shape} -> same elements, row-major order, new shape
  trans,          // (t) {perm} -> dims permuted
  // elementwise binary (same type in, same type out; cmp gives i1)
  add, sub, mul, div, rem, minimum, maximum,
  bit_and, bit_or, bit_xor, shl, shr,  // shr is arithmetic for signed, logical for unsigned
  umulhi,                              // high 32/64 bits of the full unsigned product
  cmp,                                 // {pred: eq ne lt le gt ge}
  // elementwise ternary: (a, b, selector) u32 or i32, all one type: PTX prmt.b32 (default mode) --
  // result byte i is source byte (selector nibble i) & 7 of {b:a} (a = bytes 0..3), or, when the
  // nibble's bit 3 is set, that byte's bit 7 copied into all 8 bits
  byte_perm,
  fma,  // elementwise ternary: (a, b, c) f32 or f64, all one type: a * b + c rounded once
  // elementwise unary
  neg, bit_not, abs, exp, exp2, log, log2, sqrt, rsqrt, rcp, floor, ceil, tanh, sin, cos, erf,  // rcp: approximate 1/x
  select,   // (cond i1, a, b)
  cast,     // (t) -> value converted to the result dtype (RNE for floats, truncation for float->int)
  bitcast,  // (t) -> same bits reinterpreted, same width
  // (16-bit t[..., 2n]) -> u32[..., n]: element j = bits of t[..., 2j] | bits of t[..., 2j + 1] << 16
  pack_pairs,
  // (u32 w[..., n]) {dtype: 16-bit} -> dtype[..., 2n]: the inverse of pack_pairs
  unpack_pairs,
  // (t) -> t, the same value: a schedule hint (lang::precompute): computed where this op stands
  // rather than where its result is used
  precompute,
  reduce,   // (t) {kind: sum max min, axis} -> t without axis
  // (a[M,K], b[K,N], acc[M,N]) {input_precision, descriptors_at_use} -> acc + a@b, accumulated in
  // acc's dtype
  dot,
  // program geometry
  program_id,    // {axis} -> i32
  num_programs,  // {axis} -> i32
  // tensors and memory
  tensor_ptr,     // (tensor) -> ptr<T>
  tensor_dim,     // (tensor) {dim} -> i32
  tensor_stride,  // (tensor) {dim} -> i64 (in elements)
  tensor_slice,   // (tensor, start i32, length i32) {dim} -> the view whose dim `dim` is [start, start + length)
  addptr,         // (ptr, int offset) -> ptr + offset elements (same shape)
  load,           // (ptr[, mask, other]) -> T
  store,          // (ptr, value[, mask])
  atomic_add,     // (ptr, value[, mask]) -> previous values
  // (ptr, value[, mask]) {rmw: add max min and or xor xchg, sem, scope (dsl/ir/atomic.hpp)} -> previous values
  atomic_rmw,
  // (ptr, compare, value[, mask]) {sem, scope}: *ptr = value where *ptr == compare -> previous values
  atomic_cas,
  block_load,     // (tensor, offset per tensor dim...) {shape, dims, padding} -> window (bounds-checked)
  // (tensor, value, offset per tensor dim...[, semaphore, target[, signal]]) {dims[, reduce = "add":
  // atomic += [, after_semaphore: once *semaphore >= target[, signal_after: then, once the add is
  // complete, *signal += 1 (release)]]]}
  block_store,
  // inter-program ordering (i32 semaphores in global memory; every thread of the program takes part)
  wait_ge,     // (ptr<i32> scalar, target i32): until *ptr >= target; later reads see what the signals released
  signal_add,  // (ptr<i32> scalar, value i32): after the program's earlier writes, *ptr += value (release)
  // warpgroup ping-pong (a schedule: no effect on values): the section between turn_begin and
  // turn_end runs in one warpgroup at a time, alternately (lang::turn_begin)
  turn_begin,
  turn_end,
  // control flow
  for_,    // (lb, ub, step, init...) region(iv, carried...) -> carried results
  if_,     // (cond) region then, region else -> results
  yield,   // (values...) terminates a region
  // warp specialisation (lang::warp_roles): region i runs on its own warps only (attrs: warps,
  // max_registers, one entry per region); regions read only scalars from outside, yield nothing
  warp_roles,
  // a ring of shared-memory tiles between two warp roles (lang::Channel), attrs {channel, stages,
  // shape, dtype} on both ends: (index i32, value) -> (): into slot index % stages once the slot's
  // previous tile was popped; (index i32) -> tile: the tile pushed with that index, then the slot is free
  channel_push,
  channel_pop,
  // (lang::ring_producer, first at the kernel's top level) the kernel's TMA rings are filled by a
  // producer warpgroup of their own; attrs {producer_registers, consumer_registers} (setmaxnreg).
  // A schedule: no effect on values.
  ring_producer,
  // with a user combine function (lang::associative_scan, lang::reduce): operands n tiles of one
  // shape, region combine(a_0..a_{n-1}, b_0..b_{n-1}) over scalars of their dtypes yielding n
  // (a before b along the axis; associative): only constants and elementwise ops, no outer tiles
  scan,         // (t...) {axis, reverse} -> t...: inclusive prefix (suffix when reverse = 1) along axis
  reduce_with,  // (t...) {axis} -> t... without axis
  // (t) {axis, mask} -> t: element i along axis is t's element i ^ mask (the axis a power of two,
  // mask below it): butterflies, bitonic sorting networks (lang::sort), flip (mask = n - 1)
  xor_permute,
  // (x, index) {axis} -> x's dtype in index's shape: element at position p takes x at p with its
  // axis coordinate replaced by index[p] (Triton's tl.gather, numpy's take_along_axis)
  gather,
  // (x integer tile) {num_bins[, method]} -> i32[num_bins]: bin b counts the elements of x equal to b
  // (values outside [0, num_bins) count nowhere); Triton's tl.histogram. method (how the GPU
  // counts): ballots (absent) or shared_atomics
  histogram,
  // (ptr<u64> scalar): lane 0 of every warp that runs it stores the multiprocessor's cycle counter
  // at ptr + (the warp's index in the program): instrumentation (lang::timestamp); the interpreter
  // and the emulator write a count instead, the GPU cycles
  timestamp,
};

std::string_view op_name(OpKind k);
bool is_elementwise_binary(OpKind k);
bool is_elementwise_unary(OpKind k);
// Result element i depends only on element i of the operands, all of the result's shape: the
// binary and unary ops, cmp, byte_perm, select, cast, bitcast, precompute and addptr (layouts pass through).
bool is_elementwise(OpKind k);
bool is_float_only_unary(OpKind k);

using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>, DType>;
using AttrMap = std::map<std::string, Attr>;  // ordered: printing and hashing are deterministic
// On a float mul x * s (lang::scale_lazily): the compiled kernel may skip the multiply for a warp
// whose elements of s are all 1 (x * 1 == x bit for bit); the interpreter multiplies.
inline constexpr const char* kSkipUnitScaleAttr = "skip_unit_scale";

// Where in the user's C++ the op was built; not part of the hash, printed only on request.
struct SourceLoc {
  const char* file = nullptr;
  uint32_t line = 0;
  uint32_t column = 0;
  std::string str() const;
};

struct Block;

struct Op {
  OpKind kind{};
  std::vector<ValueId> operands;
  std::vector<ValueId> results;
  AttrMap attrs;
  std::vector<Block> regions;
  SourceLoc loc;

  int64_t int_attr(const std::string& key) const;
  double float_attr(const std::string& key) const;
  const std::string& str_attr(const std::string& key) const;
  const std::vector<int64_t>& ints_attr(const std::string& key) const;
  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
};

struct Block {
  std::vector<ValueId> args;
  std::vector<Op> ops;
};

// The ordering operands of an ordered window add (block_store with after_semaphore): the semaphore
// and its target after the offsets, and with signal_after the semaphore signalled once it is done.
struct WindowOrder {
  ValueId semaphore = 0, target = 0;
  std::optional<ValueId> signal;
};
std::optional<WindowOrder> window_order(const Op& op);

}  // namespace tilejit::ir
