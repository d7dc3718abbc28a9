// Kernels shared by the JIT suites: compiled and assembled in CI (test_jit.cpp) and run on the
// GPU against the interpreter (test_jit_gpu.cpp). Each exercises a different part of lowering.
#pragma once
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "dsl/lang.hpp"
#include "runtime/host_tensor.hpp"

namespace test_kernels {

using namespace tilejit::lang;

// A window copy whose tensors and column offset declare nothing: the launch-time specialisation's
// subject (runtime/specialization.hpp).
inline Kernel undeclared_copy = kernel("undeclared_copy", [](Builder& k) {
  auto X = k.tensor("X", bf16, 2), Y = k.tensor("Y", bf16, 2);
  auto c0 = k.scalar<int>("c0");
  auto r0 = program_id(0) * 64;
  store(Y.block({r0, c0}, {64, 64}), load(X.block({r0, c0}, {64, 64})));
});

inline Kernel vector_add = kernel("vector_add", [](Builder& k) {
  auto X = k.pointer("X", f32, {.align_bytes = 16});
  auto Y = k.pointer("Y", f32, {.align_bytes = 16});
  auto Out = k.pointer("Out", f32, {.align_bytes = 16});
  auto n = k.scalar<int>("n");
  auto BLOCK = k.meta<int>("BLOCK", 256);
  auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
  auto mask = offs < n;
  store(Out + offs, load(X + offs, mask) + load(Y + offs, mask), mask);
});

inline Kernel softmax = kernel("softmax", [](Builder& k) {
  auto T = k.meta_dtype("DTYPE", f32);
  auto BLOCK = k.meta<int>("BLOCK", 128);
  auto ROWS = k.meta<int>("ROWS", 1);
  auto X = k.tensor("X", T, 2), Y = k.tensor("Y", T, 2);
  auto r = program_id(0) * ROWS;
  auto x = cast(f32, load(X.block({r, 0}, {ROWS, BLOCK}), -INFINITY));
  auto e = exp(x - max(x, 1)[col]);
  store(Y.block({r, 0}, {ROWS, BLOCK}), cast(T, e / sum(e, 1)[col]));
});

// Reductions across registers, lanes and warps, a loop with an if inside, a reduce-all.
inline Kernel reductions = kernel("reductions", [](Builder& k) {
  auto X = k.tensor("X", f32, 2), R0 = k.tensor("R0", f32, 1), R1 = k.tensor("R1", f32, 1), S = k.tensor("S", f32, 1);
  auto n = k.scalar<int>("n");
  auto x = load(X.block({0, 0}, {64, 128}));
  store(R0.block({0}, {128}), max(x, 0));
  Var acc = zeros(f32, {64});
  for_range(0, n, [&](Tile i) {
    if_(i % 2 == 0, [&] { acc = acc + sum(x, 1); }, [&] { acc = acc - min(x, 1); });
  });
  store(R1.block({0}, {64}), acc);
  store(S.block({0}, {1}), expand_dims(sum(x), 0));
});

// Floating-point, integer and cast operations, each row of F/G one op.
inline Kernel elementwise = kernel("elementwise", [](Builder& k) {
  auto A = k.tensor("A", f32, 1), B = k.tensor("B", f32, 1), I = k.tensor("I", i32, 1), J = k.tensor("J", i32, 1);
  auto F = k.tensor("F", f32, 2), G = k.tensor("G", i32, 2), H = k.tensor("H", bf16, 1);
  auto a = load(A.block({0}, {256})), b = load(B.block({0}, {256}));
  auto i = load(I.block({0}, {256})), j = load(J.block({0}, {256}));
  std::vector<Tile> fs{a + b, a - b, a * b, a / b, sqrt(abs(a)), maximum(a, b), minimum(a, b), floor(a * 10),
                       ceil(a * 10), where(a < b, a, b), cast(f32, cast(bf16, a * 1000)), cast(f32, cast(f16, a * 1000)),
                       cast(f32, i), exp2(a), exp(a), log2(abs(a) + 1), tanh(a), erf(a), rsqrt(abs(a) + 1), sin(a)};
  std::vector<Tile> is{i + j, i - j, i * j, i / j, i % j, i & j, i | j, i ^ j, i << (j & 31), i >> (j & 31),
                       cast(i32, umulhi(cast(u32, i), cast(u32, j))), cast(i32, a * 1000), cast(i32, i < j), ~i, -i,
                       maximum(i, j), minimum(i, j), cast(i32, cast(u32, i) >> 3), i / 0, i << 40,
                       byte_perm(i, j, i * j), cast(i32, byte_perm(cast(u32, i), 0, 0x8D8C))};
  for (size_t r = 0; r < fs.size(); ++r) store(F.block({static_cast<int64_t>(r), 0}, {1, 256}), expand_dims(fs[r], 0));
  for (size_t r = 0; r < is.size(); ++r) store(G.block({static_cast<int64_t>(r), 0}, {1, 256}), expand_dims(is[r], 0));
  store(H.block({0}, {256}), cast(bf16, a) * cast(bf16, b) + cast(bf16, a));
});

// atomic_add from every program into the same 64 floats and 4 counters.
inline Kernel atomics = kernel("atomics", [](Builder& k) {
  auto X = k.pointer("X", f32), Acc = k.pointer("Acc", f32), Cnt = k.pointer("Cnt", i32);
  auto offs = arange(0, 64);
  auto x = load(X + program_id(0) * 64 + offs);
  atomic_add(Acc + offs, x);
  atomic_add(Cnt + (offs % 4), 1);
});

// Tensor::slice: program b handles the rows [Cu[b], Cu[b + 1]) of X as a view (start and length
// loaded from memory). Y = 2 X through 16-row windows that cross the view's end (clipped stores),
// Z[b] = column sums of those windows (rows past the end read as -1), and W[b] = the view's first
// row shifted left by `shift` columns through a slice of the innermost dim (padding 5).
// A product masked by packed bits (like attention's precomputed dropout mask): C = where(bit n % 32
// of W[m, n / 32], A @ B, -1). AT_USE reads W with load_at_use (the GPU backend may re-read it in
// the MMA accumulator's layout); STORE_BETWEEN overwrites W (inverted) between the load and its
// use, so a re-read would see other bits: the backend must fall back to the loaded registers.
inline Kernel masked_product = kernel("masked_product", [](Builder& k) {
  auto at_use = k.meta<bool>("AT_USE", true), store_between = k.meta<bool>("STORE_BETWEEN", false);
  auto A = k.tensor("A", bf16, 2, {.align_bytes = 16, .contiguous_last = true});
  auto B = k.tensor("B", bf16, 2, {.align_bytes = 16, .contiguous_last = true});
  auto W = k.tensor("W", u32, 2, {.contiguous_last = true});
  auto C = k.tensor("C", f32, 2, {.contiguous_last = true});
  auto m0 = program_id(0) * 64;
  auto acc = dot(load(A.block({m0, 0}, {64, 32})), load(B.block({0, 0}, {32, 64})));
  auto window = W.block({m0, 0}, {64, 2});
  auto words = at_use ? load_at_use(window) : load(window);
  if (store_between) store(window, ~words);
  auto shifts = reshape(cast(u32, arange(0, 32)), {1, 1, 32});
  auto keep = reshape(((expand_dims(words, 2) >> shifts) & 1u) != 0u, {64, 64});
  store(C.block({m0, 0}, {64, 64}), where(keep, acc, -1.0f));
});

// Programs accumulate into one tile in a fixed order through a semaphore: program p (of P) waits
// until the count reaches P - 1 - p (the last program goes first), adds its rows of X to Acc, and
// signals; Order[p] records the count it saw. The floating-point sum is therefore the same on every
// run and machine. OFFSET adds to every target (OFFSET > 0: nobody can start, a deadlock).
inline Kernel ordered_sum = kernel("ordered_sum", [](Builder& k) {
  auto offset = k.meta<int>("OFFSET", 0);
  auto X = k.tensor("X", f32, 2, {.contiguous_last = true}), Acc = k.tensor("Acc", f32, 1, {.contiguous_last = true});
  auto Order = k.pointer("Order", i32), Sem = k.pointer("Sem", i32);
  auto p = program_id(0), P = num_programs(0);
  wait_at_least(Sem, P - 1 - p + offset);
  store(Order + p, load(Sem));
  auto window = Acc.block({0}, {256});
  store(window, load(window) + load(X.block({p, 0}, {256}, {1})));
  signal_add(Sem, 1);
});

// The same order with atomic_add on a window and a semaphore (the add waits for its turn): program
// p adds its [64, 64] tile of X (rows 64p..) into Acc once the count reaches P - 1 - p. On sm_90a
// Acc's window is added by TMA from shared memory, and only the issuing thread waits.
inline Kernel ordered_tile_add = kernel("ordered_tile_add", [](Builder& k) {
  const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
  auto X = k.tensor("X", f32, 2, row_major), Acc = k.tensor("Acc", f32, 2, row_major);
  auto Sem = k.pointer("Sem", i32);
  auto p = program_id(0), P = num_programs(0);
  atomic_add(Acc.block({0, 0}, {64, 64}), load(X.block({p * 64, 0}, {64, 64})), Sem, P - 1 - p);
  signal_add(Sem, 1);
});

inline Kernel segments = kernel("segments", [](Builder& k) {
  const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
  auto X = k.tensor("X", bf16, 2, row_major), Y = k.tensor("Y", bf16, 2, row_major);
  auto Z = k.tensor("Z", f32, 2, row_major), W = k.tensor("W", bf16, 2, row_major);
  auto Cu = k.pointer("Cu", i32);
  auto shift = k.scalar<int>("shift");
  auto b = program_id(0);
  auto start = load(Cu + b);
  auto len = load(Cu + (b + 1)) - start;
  auto x = X.slice(0, start, len), y = Y.slice(0, start, len);
  Var acc = zeros(f32, {64});
  for_range(0, len, 16, [&](Tile r0) {
    auto t = load(x.block({r0, 0}, {16, 64}), -1.0);
    store(y.block({r0, 0}, {16, 64}), t * 2.0);
    acc = acc + sum(cast(f32, t), 0);
  });
  store(Z.block({b, 0}, {64}), acc);
  store(W.block({b, 0}, {64}), load(x.slice(1, shift, x.size(1) - shift).block({0, 0}, {64}), 5.0));
});

// Role 1 (4 warps) pushes, for j = 0 .. n-1, the tile words[r, c] = 1000 j + 10 r + c + pid; role
// 0 (8 warps) pops each and stores its column sums into out[pid, j, c] (a reduction: the pop is
// read in the reduction's layout). STAGES slots.
inline const Kernel& channel_kernel() {
  static const Kernel k = kernel("channel_kernel", [](Builder& kb) {
    const int stages = static_cast<int>(kb.meta<int>("STAGES", 2));
    auto out = kb.tensor("out", u32, 3, {.contiguous_last = true});
    auto n = kb.scalar<int>("n");
    Tile pid = program_id(0);
    Channel ring(u32, {64, 8}, stages);
    warp_roles({{.warps = 8, .body = [&] {
                   for_range(0, n, [&](Tile j) { store(out.block({pid, j, 0}, {1, 8}, {1, 2}), reshape(sum(ring.pop(j), 0), {1, 8})); });
                 }},
                {.warps = 4, .body = [&] {
                   for_range(0, n, [&](Tile j) {
                     Tile v = cast(u32, j * 1000 + pid) + cast(u32, arange(0, 64) * 10)[col] + cast(u32, arange(0, 8))[row];
                     ring.push(j, v);
                   });
                 }}});
  });
  return k;
}

inline std::vector<uint32_t> channel_expected(int programs, int n) {
  std::vector<uint32_t> want;
  for (int p = 0; p < programs; ++p)
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < 8; ++c) {
        uint32_t s = 0;
        for (int r = 0; r < 64; ++r) s += static_cast<uint32_t>(1000 * j + p + 10 * r + c);
        want.push_back(s);
      }
  return want;
}



// O[BM, 64] = sum over key blocks of bf16(Q K_j^T / 16) V_j, K and V streamed through TMA rings
// (attention's shape without the softmax). PRODUCER: lang::ring_producer fills the rings. NESTED:
// the key loop runs twice, inside another loop (the producer's ring counts on across the runs).
// Misuse, for the error tests: IN_BRANCH (the key loop inside an if), ROLES (beside warp_roles),
// TILE_OFFSET (K's offset shifted by a scalar reduced from a tile, which the producer cannot compute).
inline const Kernel& ring_kernel() {
  static const Kernel k = kernel("ring_kernel", [](Builder& kb) {
    const int64_t D = 64, BM = 64, BN = 64;
    const bool producer = kb.meta<bool>("PRODUCER", false), nested = kb.meta<bool>("NESTED", false);
    const bool roles = kb.meta<bool>("ROLES", false), tile_offset = kb.meta<bool>("TILE_OFFSET", false);
    const bool in_branch = kb.meta<bool>("IN_BRANCH", false);
    const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
    auto Q = kb.tensor("Q", bf16, 2, row_major), K = kb.tensor("K", bf16, 2, row_major), V = kb.tensor("V", bf16, 2, row_major);
    auto O = kb.tensor("O", f32, 2, {.contiguous_last = true});
    if (producer) ring_producer();
    auto body = [&] {
      Tile m0 = program_id(0) * BM;
      Tile q = load(Q.block({m0, 0}, {BM, D}));
      Tile shift = tile_offset ? cast(i32, max(cast(f32, arange(0, 64)) * 0.0f, 0)) : Tile(zeros(i32, {}));
      Var acc = zeros(f32, {BM, D});
      auto keys = [&] {
        for_range(0, K.size(0), BN, [&](Tile n0) {
          Tile s = dot(q, trans(load(K.block({n0 + shift, 0}, {BN, D}))));
          acc = dot(cast(bf16, s * 0.0625f), load(V.block({n0, 0}, {BN, D})), acc);
        });
      };
      if (nested) for_range(0, 2, [&](Tile) { keys(); });
      else if (in_branch) if_(program_id(0) >= 0, keys);
      else keys();
      store(O.block({m0, 0}, {BM, D}), acc);
    };
    if (roles) warp_roles({{.warps = 4, .body = body}, {.warps = 0, .body = [] {}}});
    else body();
  });
  return k;
}

// A dQ-like add a key block: S = Q K_j^T, part = (S c) V_j [BM, D] added into Acc's window at m0
// (every block into the same window, as key tiles into dQ). WRITER: RingProducer::reduce_writer.
// Misuse metas: the add after the loop (AFTER), in a branch (IN_BRANCH), the sum read back in the
// kernel (READ_BACK), a semaphore signalled (SIGNAL). ORDERED: every program adds into the first
// window, in program order (a turn a semaphore counts, passed on by each add's signal);
// FIRST_WINDOW: into the first window, in no particular order.
inline const Kernel& writer_kernel() {
  static const Kernel k = kernel("writer_kernel", [](Builder& kb) {
    const int64_t D = 64, BM = 64, BN = 64;
    const bool writer = kb.meta<bool>("WRITER", false), after = kb.meta<bool>("AFTER", false);
    const bool in_branch = kb.meta<bool>("IN_BRANCH", false), read_back = kb.meta<bool>("READ_BACK", false);
    const bool signal = kb.meta<bool>("SIGNAL", false), ordered = kb.meta<bool>("ORDERED", false);
    const bool first_window = ordered || kb.meta<bool>("FIRST_WINDOW", false);
    const ParamSpec row_major{.align_bytes = 16, .contiguous_last = true};
    auto Q = kb.tensor("Q", bf16, 2, row_major), K = kb.tensor("K", bf16, 2, row_major), V = kb.tensor("V", bf16, 2, row_major);
    auto Acc = kb.tensor("Acc", f32, 2, row_major), O = kb.tensor("O", f32, 2, row_major);
    Tile sem = kb.pointer("sem", i32);
    ring_producer({.reduce_writer = writer});
    const Tile m0 = program_id(0) * BM;
    const Tile q = load(Q.block({m0, 0}, {BM, D}));
    const Tile row = first_window ? m0 * 0 : m0;  // the window added into
    Var last = zeros(f32, {BM, D});
    for_range(0, K.size(0), BN, [&](Tile n0) {
      const Tile s = dot(q, trans(load(K.block({n0, 0}, {BN, D}))));
      const Tile part = dot(cast(bf16, s * 0.0625f), load(V.block({n0, 0}, {BN, D})));
      // (ordered: program p's add j after every earlier add of programs < p, then passing the turn on)
      if (ordered) atomic_add(Acc.block({row, 0}, {BM, D}), part, sem, program_id(0) * cdiv(K.size(0), BN) + n0 / BN, sem);
      else if (in_branch) if_(n0 >= 0, [&] { atomic_add(Acc.block({row, 0}, {BM, D}), part); });
      else if (after) last = part;
      else atomic_add(Acc.block({row, 0}, {BM, D}), part);
    });
    if (after) atomic_add(Acc.block({m0, 0}, {BM, D}), last);
    if (read_back) store(O.block({m0, 0}, {BM, D}), load(Acc.block({m0, 0}, {BM, D})));
    if (signal) signal_add(sem, 1);
  });
  return k;
}

// S = Q K^T for a [BM, D] block of Q whose tensor promises only 4-byte alignment (no TMA: the
// wgmma takes A from registers, converted from the load's layout through shared memory) and K by
// TMA, in a loop over key blocks; ROLE: the same inside a warp role of 4 warps beside an idle one.
inline const Kernel& qk_registers() {
  static const Kernel k = kernel("qk_registers", [](Builder& kb) {
    const int64_t D = kb.meta<int>("HEAD_DIM", 128), BM = 64, BN = 128;
    const bool role = kb.meta<bool>("ROLE", false);
    // OUTER: the key loop runs inside an outer loop of two passes (its TMA ring is re-entered: the
    // planner's "rerun" ring), the second pass storing 2 Q K^T over the first's
    const bool outer = kb.meta<bool>("OUTER", false);
    // CHANNEL (with ROLE): the other role pushes a u32 [BM, BN / 32] tile of bits per key block
    // through a two-slot channel, and the Q K^T role adds bit (r, c) of each to S[r, c], reading
    // the words in the accumulator's layout (as the forward's RNG_WARPS reads its dropout words)
    const bool channel = kb.meta<bool>("CHANNEL", false);
    // TWO: a second Q block (the next one, cyclically), also through registers: S = Q K^T + Q' K^T
    const bool two = kb.meta<bool>("TWO", false);
    // ACC: the dQ kernel's shape: per key block S = Q K^T, then acc += bf16(S / 16) K (A from the
    // block's registers, B the same K tile read MN-major), acc stored once after the loop into
    // S's first D columns
    const bool acc_mode = kb.meta<bool>("ACC", false);
    // INNER (with ACC): S's A operand is computed inside the loop from Q alone (bf16(Q / 2)): the
    // same every iteration, so LLVM hoists it out of the loop
    const bool inner = kb.meta<bool>("INNER", false);
    // Q_TMA: Q promises 16-byte alignment, so it is loaded once by TMA (the reference for the rest)
    const bool q_tma = kb.meta<bool>("Q_TMA", false);
    auto Q = kb.tensor("Q", bf16, 2, {.align_bytes = q_tma ? 16 : 4, .contiguous_last = true});
    auto K = kb.tensor("K", bf16, 2, {.align_bytes = 16, .contiguous_last = true});
    auto S = kb.tensor("S", f32, 2, {.contiguous_last = true});
    Tile m0 = program_id(0) * BM;
    std::optional<Channel> words;
    if (channel) words.emplace(u32, tilejit::ir::Shape{BM, BN / 32}, 2);
    auto body = [&] {
      Tile q = load(Q.block({m0, 0}, {BM, D}));
      Tile q2 = two ? load(Q.block({(m0 + BM) % Q.size(0), 0}, {BM, D})) : Tile();
      if (acc_mode) {
        Var acc = zeros(f32, {BM, D});
        for_range(0, K.size(0), BN, [&](Tile n0) {
          Tile kt = load(K.block({n0, 0}, {BN, D}));
          Tile s = dot(inner ? cast(bf16, cast(f32, q) * 0.5f) : q, trans(kt)) * 0.0625f;
          acc = dot(cast(bf16, s), kt, acc);
        });
        store(S.block({m0, 0}, {BM, D}), acc);
        for_range(D, S.size(1), D, [&](Tile c0) { store(S.block({m0, c0}, {BM, D}), zeros(f32, {BM, D})); });  // (the rest of S)
        return;
      }
      auto keys = [&](const Tile& times) {
        for_range(0, K.size(0), BN, [&](Tile n0) {
          Tile kt = load(K.block({n0, 0}, {BN, D}));
          Tile s = dot(q, trans(kt)) * cast(f32, times);
          if (two) s = s + dot(q2, trans(kt));
          if (words) {
            Tile w = reshape(broadcast_to(expand_dims(words->pop(n0 / BN), 2), {BM, BN / 32, 32}), {BM, BN});
            s = s + cast(f32, (w >> cast(u32, arange(0, BN) % 32)[row]) & 1u);
          }
          store(S.block({m0, n0}, {BM, BN}), s);
        });
      };
      if (outer) for_range(1, 3, [&](Tile pass) { keys(pass); });
      else keys(full(i32, {}, 1));
    };
    // the bits of key block j: a pattern of the program, the block, the row and the word
    auto pusher = [&] {
      for_range(0, cdiv(K.size(0), BN), [&](Tile j) {
        Tile v = (cast(u32, j) * 2654435761u + cast(u32, program_id(0)) * 40503u) * 2246822519u +
                 cast(u32, arange(0, BM))[col] * 3266489917u + cast(u32, arange(0, BN / 32))[row] * 668265263u;
        words->push(j, v);
      });
    };
    if (!role) body();
    else if (words) warp_roles({{.warps = 4, .body = body}, {.warps = 4, .body = pusher}});
    else warp_roles({{.warps = 4, .body = body}, {.warps = 4, .body = [] {}}});
  });
  return k;
}

// Issue 28, item 2: integer padding converts like a cast (truncate, saturate, NaN -> 0): a u8
// window padded with -2.0 reads 0 past the end, an i8 window padded with 300.0 reads 127.
inline const Kernel& int_padding() {
  static const Kernel k = kernel("int_padding", [](Builder& b) {
    auto U = b.tensor("U", u8, 1), I = b.tensor("I", i8, 1), OU = b.tensor("OU", u8, 1), OI = b.tensor("OI", i8, 1);
    auto off = b.scalar<int>("off");
    store(OU.block({0}, {16}), load(U.block({off}, {16}), -2.0));
    store(OI.block({0}, {16}), load(I.block({off}, {16}), 300.0));
  });
  return k;
}

// Issue 28, item 4: f32 atomic_add flushes subnormal inputs and results to zero (PTX atom/red.add.f32
// does; the interpreter follows): one program adds X into Acc through pointers (returning the old
// values into Old) and into Acc2 through a window.
inline const Kernel& atomic_subnormals() {
  static const Kernel k = kernel("atomic_subnormals", [](Builder& b) {
    auto X = b.pointer("X", f32), Acc = b.pointer("Acc", f32), Old = b.pointer("Old", f32);
    auto Acc2 = b.tensor("Acc2", f32, 1, {.contiguous_last = true});
    auto offs = arange(0, 64);
    auto x = load(X + offs);
    store(Old + offs, atomic_add(Acc + offs, x));
    atomic_add(Acc2.block({0}, {64}), x);
  });
  return k;
}
// Issue 26: the read-modify-write atomics, with every order and scope, from every program:
// Amax = {max, min} of X (a NaN in X is ignored), Hist += 1 at even lanes' bins (masked),
// Bits = {or, and, xor} of per-program words, Ext = {max, min} of signed 64-bit values, Slot[0]
// claimed once by compare-and-swap (Slot[1] counts the winners: 1), Swap[pid] exchanged (the old
// values to Old). The final memory does not depend on the programs' order.
inline const Kernel& atomic_ops() {
  static const Kernel k = kernel("atomic_ops", [](Builder& b) {
    auto X = b.pointer("X", f32), Amax = b.pointer("Amax", f32), Hist = b.pointer("Hist", i32);
    auto Bits = b.pointer("Bits", u32), Ext = b.pointer("Ext", i64), Slot = b.pointer("Slot", i32);
    auto Swap = b.pointer("Swap", u64), Old = b.pointer("Old", u64);
    auto pid = program_id(0);
    auto offs = arange(0, 64);
    auto x = load(X + pid * 64 + offs);
    atomic_max(Amax, x, {.sem = MemSem::relaxed});
    atomic_min(Amax + 1, x, {.sem = MemSem::release});
    atomic_add(Hist + (pid * 7 + offs * 3) % 16, 1, offs % 2 == 0, {.sem = MemSem::relaxed});
    auto word = cast(u32, pid * 40503 + 17);
    atomic_or(Bits, word);
    atomic_and(Bits + 1, word | cast(u32, 0xFF00), {.sem = MemSem::acquire});
    atomic_xor(Bits + 2, word, {.sem = MemSem::acq_rel, .scope = MemScope::sys});
    auto v = cast(i64, offs - 32 + pid) * int64_t{3000000000};
    atomic_max(Ext, v);
    atomic_min(Ext + 1, v, offs < 48);
    auto won = atomic_cas(Slot, 0, 1, {.sem = MemSem::acquire});
    atomic_add(Slot + 1, cast(i32, won == 0), {.sem = MemSem::relaxed});
    store(Old + pid, atomic_xchg(Swap + pid, cast(u64, pid) * 3, {.scope = MemScope::cta}));
  });
  return k;
}
// Window atomics beyond add (issue 26): every program applies max / min to an f32 [8, 64] window
// and max / min / and / or / xor to i32 / u32 / i64 windows at offsets that overlap its
// neighbours' and cross the tensors' edges (elements outside are skipped). Order-independent
// results, so the GPU must equal the interpreter exactly.
inline const Kernel& window_atomics() {
  static const Kernel k = kernel("window_atomics", [](Builder& b) {
    auto X = b.tensor("X", f32, 2), F = b.tensor("F", f32, 2), I = b.tensor("I", i32, 2), U = b.tensor("U", u32, 2);
    auto L = b.tensor("L", i64, 2);
    auto pid = program_id(0);
    auto r0 = pid * 3 - 2, c0 = pid * 5 - 8;  // overlapping, partly outside at both ends
    // Each op owns rows of its own (r0 spans [-2, 21) over 6 programs): max and min, or and and or, on
    // one element would not commute, and the GPU runs the programs in no fixed order.
    Tile x = load(X.block({pid * 8, 0}, {8, 64}));
    atomic_max(F.block({r0, c0}, {8, 64}), x);
    atomic_min(F.block({r0 + 24, c0}, {8, 64}), x);
    Tile xi = cast(i32, x * 1000.0f);
    atomic_max(I.block({r0, c0}, {8, 64}), xi);
    atomic_min(I.block({r0 + 24, c0}, {8, 64}), xi);
    Tile w = cast(u32, xi) * cast(u32, 2654435761u) + cast(u32, pid);
    atomic_and(U.block({r0, c0}, {8, 64}), w | cast(u32, 0x0F0F0F0Fu));
    atomic_or(U.block({r0 + 24, c0}, {8, 64}), w & cast(u32, 0x00FF00FFu));
    atomic_xor(U.block({r0 + 48, c0}, {8, 64}), w);
    atomic_max(L.block({r0, c0}, {8, 64}), cast(i64, xi) * int64_t{5000000000});
  });
  return k;
}
// atomic_ops' arguments for `programs` programs (a NaN in X, which max and min ignore).
struct AtomicOpsArgs {
  tilejit::runtime::HostTensor x, amax, hist, bits, ext, slot, swap, old;
  explicit AtomicOpsArgs(int64_t programs)
      : x(f32, {programs * 64}), amax(f32, {2}), hist(i32, {16}), bits(u32, {3}), ext(i64, {2}), slot(i32, {2}),
        swap(u64, {programs}), old(u64, {programs}) {
    x.fill_uniform(41, -3, 3);
    x.set_flat(77, std::nan(""));
    amax.set_flat(0, -100), amax.set_flat(1, 100);
    hist.fill(0);
    bits.set_flat(0, 0), bits.set_flat(1, 0xFFFFFFFFu), bits.set_flat(2, 0x5A5A5A5Au);
    ext.set_flat(0, -1e15), ext.set_flat(1, 1e15);
    slot.fill(0);
    old.fill(0);
    for (int64_t p = 0; p < programs; ++p) swap.set_flat(p, static_cast<double>(1000 + p));
  }
};
// Issue 28, item 10: reductions across lanes of 64-bit and 8/16-bit integer tiles; pack_pairs of a
// tile spread one element per thread.
inline Kernel wide_and_narrow_reductions = kernel("wide_and_narrow_reductions", [](Builder& k) {
  auto D = k.meta_dtype("DTYPE");
  auto X = k.tensor("X", D, 2);
  auto Rows = k.pointer("Rows", D), Cols = k.pointer("Cols", D), All = k.pointer("All", D);
  auto x = load(X.block({0, 0}, {32, 64}));
  store(Rows + arange(0, 32), cast(D, sum(x, 1)));  // (8/16-bit sums count in 32 bits: wrapped back here)
  store(Cols + arange(0, 64), max(x, 0));
  store(All, min(x));
});

inline Kernel small_pack_pairs = kernel("small_pack_pairs", [](Builder& k) {
  auto X = k.pointer("X", f16), Out = k.pointer("Out", u32);
  auto r = arange(0, 64);
  auto x = load(X + r[col] * 2 + arange(0, 2)[row]);  // f16[64, 2]
  store(Out + r[col], pack_pairs(x));                   // u32[64, 1]
});

// Issue 28, item 1: window offsets of every integer type are taken at their value (the GPU had cut
// i64 / u32 / u64 offsets to 32 bits: 2^32 read row 0, 0xFFFFFFFF read as -1). The i64 `off`,
// converted (wrapping) to each of kWideOffsetTypes (index t): X[o:o+16, 0:32] into O[t] (offset of
// a tile dim, 16-byte vector loads inside), X[0:16, o:o+32] into P[t] (the unit-stride dim),
// X[o, 0:32] into R[t] (a fixed dim), X's corner stored into S[t] at row o (clipped) and its
// [16, 16] corner added into A[t] at (o, o).
inline constexpr DType kWideOffsetTypes[] = {i64, u32, u64, i16, u8, i32, u16, i8};
// Constant i32 window offsets whose columns wrap past 2^31 (fuzzer seed 407120, issue 28): from the
// wrapping sum nvrtc's optimizer rebuilt the Ones store's column as sext(C + x) - C, 2^32 elements
// off, and the kernel faulted. Every Acc element the second atomic names is outside Acc.
// abs, neg, 0 - x and x * -1 of 8/16-bit integers (meta DTYPE), each widened to i32 and stored: at
// the type's minimum they wrap to the minimum. ptxas gives abs.s16 / neg.s16 of -32768 as +32768
// read back unconverted, so the backends compute them in 32 bits (issue 28, fuzzer).
inline const Kernel& narrow_int_negation() {
  static const Kernel k = kernel("narrow_int_negation", [](Builder& b) {
    const DType d = b.meta<DType>("DTYPE", i16);
    auto X = b.pointer("X", d), Out = b.pointer("Out", i32);
    auto i = arange(0, 64);
    Tile x = load(X + i);
    Tile zero = full(d, {64}, 0.0), minus1 = full(d, {64}, -1.0);
    store(Out + i, cast(i32, abs(x)));
    store(Out + 64 + i, cast(i32, -x));
    store(Out + 128 + i, cast(i32, zero - x));
    store(Out + 192 + i, cast(i32, x * minus1));
    store(Out + 256 + i, cast(i32, cast(i16, -cast(i8, x))));  // an i8 negation read as i16
  });
  return k;
}

// Signed min/max of negated values (ptxas 13.0 dropped the inner max's second negation when it
// fused two into VIMNMX3: fuzzer seed 723574): row max/min of -x, and max/min(max/min(-a, -b), -c).
inline const Kernel& negated_min_max() {
  static const Kernel k = kernel("negated_min_max", [](Builder& b) {
    const DType d = b.meta<DType>("DTYPE", i32);
    auto X = b.tensor("X", d, 2), Out = b.tensor("Out", i32, 2);
    Tile x = load(X.block({0, 0}, {16, 32}));  // [16, 32]
    Tile n = -x;
    store(Out.block({0, 0}, {1, 16}), reshape(cast(i32, max(n, 1)), {1, 16}));
    store(Out.block({1, 0}, {1, 16}), reshape(cast(i32, min(n, 1)), {1, 16}));
    Tile a = load(X.block({0, 0}, {1, 32})), c = load(X.block({1, 0}, {1, 32})), e = load(X.block({2, 0}, {1, 32}));
    store(Out.block({2, 0}, {1, 32}), cast(i32, maximum(maximum(-a, -c), -e)));
    store(Out.block({3, 0}, {1, 32}), cast(i32, minimum(minimum(-a, -c), -e)));
    store(Out.block({4, 0}, {1, 32}), cast(i32, maximum(maximum(a, -c), e)));
  });
  return k;
}

inline const Kernel& wrapping_window_offset() {
  static const Kernel k = kernel("wrapping_window_offset", [](Builder& b) {
    auto Src = b.tensor("Src", i32, 2);
    auto Ones = b.tensor("Ones", f32, 3);
    auto Masked = b.tensor("Masked", f32, 3, {.align_bytes = 0, .contiguous_last = true});
    auto Acc = b.tensor("Acc", i64, 2);
    auto pointers = [](const Tensor& o) {
      Tile r = arange(0, 64), c = arange(0, 16);
      return o.ptr() + program_id(0) * o.stride(0) + r[col] * o.stride(1) + c[row] * o.stride(2);
    };
    Tile near_max = scalar_constant(i32, int64_t{2147483647});
    Tile nineteen = scalar_constant(i32, int64_t{19});
    Tile far = load(Src.block({nineteen, near_max}, {64, 16}), -23.5);  // padding only
    store(pointers(Ones), full(f32, {64, 16}, 1.0));
    Tile minus2 = scalar_constant(i32, int64_t{-2});
    atomic_add(Acc.block({minus2, nineteen}, {64, 16}), full(i64, {64, 16}, int64_t{1}));
    store(pointers(Masked), full(f32, {64, 16}, 1.0), full(i1, {64, 16}, true));
    atomic_add(Acc.block({minus2, near_max}, {64, 16}), cast(i64, far));
  });
  return k;
}

inline const Kernel& wide_offsets() {
  static const Kernel k = kernel("wide_offsets", [](Builder& b) {
    const ParamSpec rows{.align_bytes = 16, .contiguous_last = true};
    auto X = b.tensor("X", f32, 2, rows), O = b.tensor("O", f32, 3, rows), P = b.tensor("P", f32, 3, rows);
    auto R = b.tensor("R", f32, 2, rows), S = b.tensor("S", f32, 3, rows), A = b.tensor("A", f32, 3, rows);
    auto off = b.scalar<int64_t>("off");
    auto corner = load(X.block({0, 0}, {16, 32})), corner16 = load(X.block({0, 0}, {16, 16}));
    int t = 0;
    for (DType d : kWideOffsetTypes) {
      Tile o = cast(d, off);
      store(O.block({t, 0, 0}, {16, 32}), load(X.block({o, 0}, {16, 32}), -1.0));
      store(P.block({t, 0, 0}, {16, 32}), load(X.block({0, o}, {16, 32}), -3.0));
      store(R.block({t, 0}, {32}), load(X.block({o, 0}, {32}, {1}), -2.0));
      store(S.block({t, o, 0}, {16, 32}), corner);
      atomic_add(A.block({t, o, o}, {16, 16}), corner16);
      ++t;
    }
  });
  return k;
}

// Issue 28, item 1, the TMA paths: a bf16 dot of two windows loaded once (TMA copies + wgmma on
// sm_90a) added into a window of C (a TMA reduce), all at offsets of type OFFSET_DTYPE; and a K
// loop (a TMA + wgmma pipeline) whose counter is of type COUNTER_DTYPE (i32 or i64). TMA
// coordinates are 32-bit: wider offsets must take the generic paths. (An H100 also faults on a box
// whose innermost coordinate is not a multiple of 16 bytes and on a reduce at a negative
// coordinate: the planners take TMA only where jit/scalar_facts.hpp proves neither can happen, so
// here the copies at inner offset 0, never the reduce at row o.)
inline const Kernel& wide_offset_tma() {
  static const Kernel k = kernel("wide_offset_tma", [](Builder& b) {
    auto T = b.meta_dtype("OFFSET_DTYPE", i32), CT = b.meta_dtype("COUNTER_DTYPE", i32);
    const ParamSpec rows{.align_bytes = 16, .contiguous_last = true};
    auto A = b.tensor("A", bf16, 2, rows), B = b.tensor("B", bf16, 2, rows), C = b.tensor("C", f32, 2, rows);
    auto D = b.tensor("D", f32, 2, rows);
    auto off = b.scalar<int64_t>("off");
    Tile o = cast(T, off);
    atomic_add(C.block({o, 0}, {64, 64}), dot(load(A.block({o, 0}, {64, 64})), load(B.block({o, 0}, {64, 64}))));
    auto m0 = program_id(0) * 64;  // (0: one program; loop-invariant offsets)
    Var acc = zeros(f32, {64, 64});
    for_range(cast(CT, 0), cast(CT, A.size(1)), 64, [&](Tile kk) {
      acc = dot(load(A.block({m0, kk}, {64, 64})), trans(load(B.block({m0, kk}, {64, 64}))), acc);
    });
    store(D.block({m0, 0}, {64, 64}), acc);
  });
  return k;
}

// Found by the fuzzer: a TMA box whose innermost coordinate does not start on 16 bytes is an
// illegal instruction on the H100. The windows' offsets on the contiguous dim are STEP * k for a
// run-time k: with STEP 1 nothing says they are aligned (generic loads and red.global adds), with
// STEP 8 (bf16) and 4 (f32) they are (TMA copies, wgmma and a TMA reduce, whose coordinates must
// also be non-negative: k is a u16).
inline const Kernel& unaligned_tma_windows() {
  static const Kernel kern = kernel("unaligned_tma_windows", [](Builder& b) {
    auto STEP = b.meta<int>("STEP", 1);
    const ParamSpec rows{.align_bytes = 16, .contiguous_last = true};
    auto A = b.tensor("A", bf16, 2, rows), B = b.tensor("B", bf16, 2, rows), O = b.tensor("O", f32, 2, rows);
    auto k = cast(u16, b.scalar<int32_t>("k"));  // unsigned: never a negative coordinate
    auto d = dot(load(A.block({0, k * STEP}, {64, 64})), load(B.block({0, k * STEP}, {64, 64})));
    atomic_add(O.block({0, k * (STEP == 1 ? 1 : STEP / 2)}, {64, 64}), d);
  });
  return kern;
}

// Issue 28, item 3: float % is fmod, exactly (the GPU had computed x - trunc(x / y) * y: 256 where
// fmod gives 4). R = X % Y in DTYPE, and Bits its bits as two u32 words per element (low, high;
// NaN as one pattern): the value check cannot see -0 against +0 or f64 subnormal differences.
inline const Kernel& float_rem() {
  static const Kernel k = kernel("float_rem", [](Builder& b) {
    const DType T = b.meta_dtype("DTYPE", f32);
    auto X = b.pointer("X", T), Y = b.pointer("Y", T), R = b.pointer("R", T), Bits = b.pointer("Bits", u32);
    auto n = b.scalar<int>("n");
    auto i = program_id(0) * 256 + arange(0, 256);
    auto m = i < n;
    auto r = load(X + i, m, 0.0) % load(Y + i, m, 1.0);
    store(R + i, r, m);
    auto c = where(r != r, NAN, r);
    Tile lo = T == f64 ? cast(u32, bitcast(u64, c)) : T == f32 ? bitcast(u32, c) : cast(u32, bitcast(u16, c));
    Tile hi = T == f64 ? cast(u32, bitcast(u64, c) >> 32) : full(u32, {256}, 0);
    store(Bits + 2 * i, lo, m);
    store(Bits + 2 * i + 1, hi, m);
  });
  return k;
}

// Operands for float_rem in dtype d (f32 f64 f16 bf16), as doubles: the issue's large quotients,
// signs of zero results, inf / NaN / zero operands, subnormals and extremes; random bit patterns
// (mostly far-apart exponents: the long reduction); near multiples (x = y * m * 2^s, one ulp off:
// the rounded quotient's correction).
inline std::vector<std::pair<double, double>> float_rem_inputs(DType d, uint64_t seed) {
  const bool dbl = d == f64;
  const double sub = std::ldexp(1.0, dbl ? -1074 : d == f32 ? -149 : d == f16 ? -24 : -133);
  const double big = dbl ? DBL_MAX : d == f32 ? FLT_MAX : d == f16 ? 65504.0 : 0x1.fep127;
  std::vector<std::pair<double, double>> v{
      {1e30, 3.7}, {1e10, 0.1}, {-1e10, 0.1}, {5.5, 2}, {-5.5, 2}, {5.5, -2}, {-6, 3}, {6, -3}, {0.0, 1}, {-0.0, 1},
      {-0.0, INFINITY}, {1, 0}, {1, -0.0}, {0.0, 0.0}, {INFINITY, 1}, {-INFINITY, 2}, {INFINITY, INFINITY}, {NAN, 1},
      {1, NAN}, {7.25, INFINITY}, {-7.25, -INFINITY}, {3 * sub, 2 * sub}, {1e-39, 3 * sub}, {big, sub}, {-big, 3 * sub},
      {big, 1.5}, {16777218, 3}, {8388609, 2}, {std::ldexp(1.0, 53) + 2, 3}, {1e300, 3.7}, {1e-300, 1e-310}, {sub, 1e-39}};
  std::mt19937_64 g(seed);
  auto any = [&] {  // a random bit pattern of d
    const uint64_t b = g();
    if (dbl) return std::bit_cast<double>(b);
    if (d == f32) return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(b)));
    const auto h = static_cast<uint16_t>(b);
    return static_cast<double>(d == f16 ? tilejit::ir::f16_bits_to_f32(h) : tilejit::ir::bf16_bits_to_f32(h));
  };
  for (int k = 0; k < 2000; ++k) v.emplace_back(any(), any());
  auto next = [&](double x, bool up) {  // x rounded to d, then one ulp of d up or down
    using namespace tilejit::ir;
    const auto f = static_cast<float>(x);
    if (dbl) return std::nextafter(x, up ? INFINITY : 0.0);
    if (d == f32) return static_cast<double>(std::nextafter(f, up ? INFINITY : 0.0f));
    const int step = up ? 1 : -1;
    if (d == f16) return static_cast<double>(f16_bits_to_f32(static_cast<uint16_t>(f32_to_f16_bits(f) + step)));
    return static_cast<double>(bf16_bits_to_f32(static_cast<uint16_t>(f32_to_bf16_bits(f) + step)));
  };
  for (int k = 0; k < 2000; ++k) {
    const double y = std::fabs(any());
    v.emplace_back(next(std::ldexp(y, static_cast<int>(g() % (dbl ? 60 : 30))) * static_cast<double>(1 + g() % 9), g() % 2), y);
  }
  return v;
}
}  // namespace test_kernels
