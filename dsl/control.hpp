// Structured control flow: counted loops with loop-carried Vars, and ifs on scalar conditions.
// The body lambdas run once, at build time, to record the loop/if body as an IR region.
#pragma once
#include <functional>
#include <vector>
#include <source_location>

#include "dsl/builder.hpp"

namespace tilejit::lang {

// for (i = lb; i < ub; i += step) body(i). Bounds are runtime integer scalars (or numbers); step
// must be positive. Every Var declared outside and reassigned inside becomes loop-carried.
void for_range(const Operand& lb, const Operand& ub, const Operand& step, const std::function<void(Tile)>& body,
               std::source_location loc = std::source_location::current());
void for_range(const Operand& lb, const Operand& ub, const std::function<void(Tile)>& body,
               std::source_location loc = std::source_location::current());

// if (cond) then_body() else else_body(). cond is an i1 scalar. Vars reassigned in either branch
// take the branch's value afterwards.
void if_(const Operand& cond, const std::function<void()>& then_body,
         std::source_location loc = std::source_location::current());
void if_(const Operand& cond, const std::function<void()>& then_body, const std::function<void()>& else_body,
         std::source_location loc = std::source_location::current());

// Warpgroup ping-pong (FlashAttention-3's schedule): on the GPU with two warpgroups (8 warps),
// `body` runs in one warpgroup at a time, the two taking turns, warpgroup 0 first. Put a loop's
// MMA issue in turns: one warpgroup issues its MMAs while the other runs its softmax, so tensor
// cores and ALUs work at the same time instead of both warpgroups contending for each in step.
// MMAs issued inside stay in flight after the turn ends (their results are waited for at the first
// read); dots are not hoisted across a turn's ends. A pure schedule: no effect on values (the
// interpreter, and GPU schedules with other warp counts, run `body` as is). Every thread must take
// the same turns (not under a branch that differs between warpgroups); turns do not nest, and a
// turn must not contain an exchange through shared memory (a barrier of all threads: deadlock).
void warpgroup_turn(const std::function<void()>& body, std::source_location loc = std::source_location::current());

// Warp specialisation: the program's warps split into roles, each running its own code at once --
// e.g. a GEMM's MMA warpgroups beside warps that generate a dropout mask, so that neither waits
// for the other's instructions. Roles take whole warpgroups, in order: role 0 the first `warps`
// warps, role 1 the next, ...; `warps` is a power of two and a multiple of 4, or 0 for the warps
// the others leave of the launch's num_warps (at most one role; num_warps may then be any multiple
// of 4, e.g. 12 = 8 + 4). Each role's tiles are spread over its own warps. A role reads only
// scalars, pointers and tensors from outside (no tiles), changes no Var declared outside, and
// roles do not talk to each other (no shared values): they are independent programs that share
// the program id. max_registers (0, or all roles: multiples of 8 in [24, 256]) rebalances the
// register file between roles on sm_90a (setmaxnreg; the launch then caps registers at
// 65536 / threads), e.g. 232 for MMA warps and 40 for a generator; the roles' total must fit in
// 65536. warp_roles stands at the kernel's top level. The interpreter runs the roles one after
// the other, which is the same result since they share nothing.
struct WarpRole {
  int warps = 0;
  int max_registers = 0;
  std::function<void()> body;
};
void warp_roles(const std::vector<WarpRole>& roles, std::source_location loc = std::source_location::current());

// The kernel's TMA rings (window loads in a loop that feed wgmma from shared memory, on sm_90a:
// jit/wgmma_plan.hpp) are filled by a producer warpgroup of their own -- 4 warps more at launch,
// one thread of which issues every copy ahead of the consumers -- instead of by the consumers
// between their MMAs. Each ring tile then has its own full and empty barriers: the consumers wait
// for a tile where a dot first reads it and free its stage right after the wgmma wait that
// retires its last reader (K of attention before V), and the first stages are in flight from the
// kernel's first instruction. setmaxnreg moves registers to the consumers (their total with the
// producer's must fit 65536). A schedule with no effect on values (the interpreter ignores it);
// first at the kernel's top level, not with warp_roles. A ring may stand inside other loops (a
// persistent grid's tile loop: its stages count on across their iterations) but not in a branch,
// and its loops' bounds and the tiles' offsets must be scalar arithmetic the producer can compute
// alone (loop counters, program ids, parameters, scalar loads).
// reduce_writer: a second warp of the producer warpgroup issues the kernel's TMA adds
// (atomic_add of a window in a ring's loop body, FlashAttention-3's dQ writer): each consumer
// warpgroup stages its part and goes on, the writer adds it and hands the staging back, so no
// consumer waits for a bulk copy or for the other warpgroup. Every TMA add must stand at the top
// level of a ring's loop body, one per loop of one ring, into a tensor nothing else in the kernel
// touches, with no semaphores in the kernel (the compile says which of these fails).
// coordinates_at_use: inside loops the consumers compute their threads' layout coordinates (for
// arange, layout conversions, element offsets) from opaque copies of the lane and warp, once per
// loop body, so that LLVM cannot hoist them, and the per-register values derived from them, out of
// the loop, where each held a register through every iteration (decision 114).
struct RingProducer {
  int producer_registers = 24;
  int consumer_registers = 240;
  bool reduce_writer = false;
  bool coordinates_at_use = false;
};
void ring_producer(RingProducer r = {}, std::source_location loc = std::source_location::current());

// A channel from one warp role to another: a ring of `stages` shared-memory slots of one tile
// type, each with a full and an empty barrier. Declared before the roles; one role pushes, another
// pops, each with the same running index (0, 1, 2, ...: slot index % stages, phase index / stages):
//   Channel words(u32, {128, 4}, 2);
//   warp_roles({{.warps = 8, .body = [&] { for_range(0, n, [&](Tile j) { use(words.pop(j)); }); }},
//               {.warps = 4, .body = [&] { for_range(0, n, [&](Tile j) { words.push(j, make(j)); }); }}});
// push waits until the slot's previous tile was popped, stores the tile and marks the slot full;
// pop waits until it is full and reads it -- in the layout its use asks for, like a load_at_use
// window (wrap it in `precompute` to read it early) -- then marks it empty. Every index is pushed
// once and popped once, in order. The interpreter runs the pushing role first.
class Channel {
 public:
  Channel(DType dtype, const ir::Shape& shape, int stages, std::source_location loc = std::source_location::current());
  void push(const Operand& index, const Tile& value, std::source_location loc = std::source_location::current()) const;
  Tile pop(const Operand& index, std::source_location loc = std::source_location::current()) const;

 private:
  ir::AttrMap attrs() const;
  int64_t id_;
  DType dtype_;
  ir::Shape shape_;
  int stages_;
};

}  // namespace tilejit::lang
