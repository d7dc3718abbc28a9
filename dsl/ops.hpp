// The tile operations of the DSL: creation, shape manipulation, math, reductions, dot, casts and
// program geometry. Each builds tile IR in the kernel being built; errors name the source line.
#pragma once
#include <source_location>

#include "dsl/builder.hpp"
#include "dsl/ir/input_precision.hpp"

namespace tilejit::lang {


// ---- creation ----
Tile arange(int64_t start, int64_t end, Loc loc = Loc::current());           // i32[end-start]
Tile full(DType dtype, Shape shape, const Operand& value, Loc loc = Loc::current());
Tile zeros(DType dtype, Shape shape, Loc loc = Loc::current());
Tile scalar_constant(DType dtype, const Operand& value, Loc loc = Loc::current());  // a typed scalar

// ---- shapes ----
Tile expand_dims(const Operand& t, int axis, Loc loc = Loc::current());
Tile broadcast_to(const Operand& t, Shape shape, Loc loc = Loc::current());
Tile reshape(const Operand& t, Shape shape, Loc loc = Loc::current());
Tile trans(const Operand& t, Loc loc = Loc::current());  // swaps the last two dims
Tile permute(const Operand& t, std::vector<int64_t> perm, Loc loc = Loc::current());

// ---- elementwise ----
Tile where(const Operand& cond, const Operand& a, const Operand& b, Loc loc = Loc::current());
Tile maximum(const Operand& a, const Operand& b, Loc loc = Loc::current());  // NaN-propagating
Tile minimum(const Operand& a, const Operand& b, Loc loc = Loc::current());
Tile umulhi(const Operand& a, const Operand& b, Loc loc = Loc::current());   // high half of a*b (32/64-bit ints)
// PTX prmt.b32 (default mode) on u32/i32 tiles (broadcasting; u32 unless every tile operand is
// i32): the source bytes are {b:a} (a = bytes 0..3, b = bytes 4..7); result byte i is the source
// byte that nibble i of `selector` names (bits 0..2), or, when the nibble's bit 3 is set, that
// byte's bit 7 replicated into all 8 bits. E.g. byte_perm(x, 0, 0x8888) is 0xFFFFFFFF when bit 7
// of x is set, else 0: one instruction, where a compare and a select would take two or more.
Tile byte_perm(const Operand& a, const Operand& b, const Operand& selector, Loc loc = Loc::current());
// a * b + c with one rounding (PTX fma.rn), elementwise over f32 (or f64) tiles that broadcast;
// literals take the tiles' dtype. Kernels are compiled without contraction (a * b + c is two
// rounded ops, as the interpreter computes it), so this is how a kernel asks for the fused form.
Tile fma(const Operand& a, const Operand& b, const Operand& c, Loc loc = Loc::current());
Tile cast(DType dtype, const Operand& x, Loc loc = Loc::current());   // value conversion (RNE for floats)
Tile bitcast(DType dtype, const Operand& x, Loc loc = Loc::current());
// A 16-bit tile [..., 2n] as u32 [..., n], each word two neighbours (t[2j] in the low half), and
// back: bitwise work on packed pairs, e.g. zeroing dropped bf16 probabilities with one AND per two
// (on the GPU, where a thread holds both of a pair -- as in MMA layouts -- no data moves).
Tile pack_pairs(const Tile& x, Loc loc = Loc::current());
Tile unpack_pairs(DType dtype, const Tile& words, Loc loc = Loc::current());
// x itself, computed here: a schedule hint. Values whose layout is decided by their uses (views,
// aranges and the elementwise math on them, e.g. a Philox counter chain) are otherwise computed
// at their first use; precompute computes them where it stands, in the layout that use asks for,
// and keeps the compiler from sinking the work back down (an optimisation barrier on the
// registers). E.g. work placed after issuing a dot and before reading its result runs while the
// tensor cores do. Same value everywhere (the interpreter copies it).
Tile precompute(const Operand& x, Loc loc = Loc::current());
Tile exp(const Operand& x, Loc loc = Loc::current());
Tile exp2(const Operand& x, Loc loc = Loc::current());
Tile log(const Operand& x, Loc loc = Loc::current());
Tile log2(const Operand& x, Loc loc = Loc::current());
Tile sqrt(const Operand& x, Loc loc = Loc::current());
Tile rsqrt(const Operand& x, Loc loc = Loc::current());
// Approximate 1 / x (the GPU's rcp.approx.ftz: within 1 ulp, subnormal inputs and results flushed
// to zero; the interpreter: 1 / x rounded, flushed the same way). Unlike '/', never a slow-path
// subroutine call (which would make ptxas serialise a kernel's wgmma).
Tile rcp(const Operand& x, Loc loc = Loc::current());
Tile abs(const Operand& x, Loc loc = Loc::current());
Tile floor(const Operand& x, Loc loc = Loc::current());
Tile ceil(const Operand& x, Loc loc = Loc::current());
Tile tanh(const Operand& x, Loc loc = Loc::current());
Tile sin(const Operand& x, Loc loc = Loc::current());
Tile cos(const Operand& x, Loc loc = Loc::current());
Tile erf(const Operand& x, Loc loc = Loc::current());

// ---- reductions along one axis (the axis disappears), or over all axes (a scalar) ----
// sum: i1 (a count), i8 and i16 tiles sum in i32, u8 and u16 in u32 (Triton's rule, as cumsum);
// floats keep their dtype, accumulated in f32 and rounded once.
Tile sum(const Operand& x, int axis, Loc loc = Loc::current());
Tile max(const Operand& x, int axis, Loc loc = Loc::current());
Tile min(const Operand& x, int axis, Loc loc = Loc::current());
Tile sum(const Operand& x, Loc loc = Loc::current());
Tile max(const Operand& x, Loc loc = Loc::current());
Tile min(const Operand& x, Loc loc = Loc::current());

// ---- matrix product: a[M,K] @ b[K,N], accumulated in f32 (i32 for i8), plus acc if given ----
// Batched (Triton's 3-D tl.dot): a[B,M,K] @ b[B,K,N] -> [B,M,N], the 2-D product per leading index;
// acc is [B,M,N] or broadcasts to it. Inputs f16 bf16 f32 i8 (fp8: interpreter only), a and b alike.
// On the GPU: mma.sync for 16-bit inputs (per batch for 3-D) when the shapes fit, wgmma on sm_90a
// where planned (2-D only), FMA on CUDA cores otherwise.
//
// DotOptions::input_precision (Triton's input_precision): ieee (the default) multiplies the inputs
// as they are; tf32 (f32 inputs only) first rounds each input to TF32 as PTX cvt.rna.tf32.f32 does
// (round to nearest, ties away from zero, on the 13 dropped mantissa bits; infinities and NaNs
// kept, subnormals rounded, not flushed), then the products of the rounded values are exact and
// accumulate in f32: on the GPU mma.sync m16n8k8 .tf32 (tensor cores) where the shapes fit (M a
// multiple of 16, K of 8, N of 8), else FMA on the rounded inputs. The same rounding everywhere,
// but not the same order of additions: the interpreter sums each output's products exactly (in
// double) and rounds once; the GPU rounds after each k step of 8 (mma) or each product (FMA), so
// results agree within the usual f32 summation error (~K * 2^-24 relative), bit for bit only
// where every partial sum is exact.
using ir::InputPrecision;
struct DotOptions {
  InputPrecision input_precision = InputPrecision::ieee;
  // A schedule hint (no effect on values): on wgmma, the shared-memory descriptors of operands that
  // stay put across the loops around the dot (a tile loaded once) are computed at the dot, not
  // hoisted out of those loops by the compiler, where each k step's descriptor holds two registers
  // through the loop (the dK/dV kernel spilled 128-344 B at D 128 for it: decision 077)
  bool descriptors_at_use = false;
  // A schedule hint (no effect on values): an A operand wgmma takes through shared memory (a
  // register tile transposed, staged before the dot) has its staging offsets computed at the dot
  // from opaque copies of the thread's lane and warp, not hoisted out of the loops around it (16
  // registers held through the dK/dV kernel's query loop; ~25 more ALU instructions a visit: 103)
  bool staging_at_use = false;
};
Tile dot(const Operand& a, const Operand& b, Loc loc = Loc::current());
Tile dot(const Operand& a, const Operand& b, const Operand& acc, Loc loc = Loc::current());
Tile dot(const Operand& a, const Operand& b, DotOptions o, Loc loc = Loc::current());
Tile dot(const Operand& a, const Operand& b, const Operand& acc, DotOptions o, Loc loc = Loc::current());

// ---- program geometry and integer helpers ----
Tile program_id(int axis, Loc loc = Loc::current());
Tile num_programs(int axis, Loc loc = Loc::current());
Tile cdiv(const Operand& a, const Operand& b, Loc loc = Loc::current());  // ceil(a / b) for positive ints
constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace tilejit::lang
