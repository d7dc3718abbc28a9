// Philox4x32-10 and the dropout keep-mask (kernels/philox.hpp, kernels/philox_host.hpp,
// kernels/dropout_mask.hpp): Random123's known-answer vectors on the host and in the interpreter,
// the DSL functions and the packed-mask kernel against the host bit for bit over several tile
// shapes and offsets, and keep-rate statistics.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dropout_key_args.hpp"
#include "dsl/lang.hpp"
#include "host_bits.hpp"
#include "kernels/dropout_mask.hpp"
#include "kernels/philox.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/emulator.hpp"
#include "runtime/interpreter.hpp"

using namespace tilejit;
using namespace tilejit::lang;
namespace rt = tilejit::runtime;

// These tests run tiles of any shape (7, 13, 24 ...) to test semantics on the CPU; the GPU backends
// take powers of two only, which the interpreter otherwise enforces.
static void interpret_any_shape(const tilejit::ir::Function& f, rt::Grid grid, const std::vector<rt::Arg>& args) {
  rt::interpret(f, grid, args, {.gpu_rules = false});
}
using rt::HostTensor;
using testing::raw;
using U4 = std::array<uint32_t, 4>;
using U2 = std::array<uint32_t, 2>;

namespace {

struct Kat {
  U4 counter;
  U2 key;
  U4 out;
};
// Random123's kat_vectors for philox4x32 10 (counter words, key words, expected output).
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}, {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

template <class T>
HostTensor tensor_of(DType d, ir::Shape shape, const std::vector<T>& v) {
  HostTensor t(d, std::move(shape));
  REQUIRE(static_cast<size_t>(t.numel()) == v.size());
  REQUIRE(sizeof(T) == static_cast<size_t>(ir::byte_size(d)));
  std::memcpy(t.data(), v.data(), v.size() * sizeof(T));
  return t;
}

const kernels::DropoutRngHost kRngs[] = {
    {0, 0, 230},
    {0x0123456789abcdefull, 0x0000000500000007ull, 230},
    {0xfedcba9876543210ull, 0xffffffff00000001ull, 128},
    {42, 1ull << 40, 13},
};

// Out[bh, r, c] = keep(bh, row0 + r, col0 + c) as u8, written by BM x BN programs; GENERAL picks
// dropout_keep (any columns) instead of dropout_keep_block. Grid: (cdiv(R, BM), cdiv(C, BN), BH).
const Kernel& keep_kernel() {
  static const Kernel k = kernel("keep_tiles", [](Builder& kb) {
    auto BM = kb.meta<int>("BLOCK_M", 64), BN = kb.meta<int>("BLOCK_N", 128);
    auto general = kb.meta<bool>("GENERAL", false);
    auto Out = kb.tensor("Out", u8, 3);
    auto row0 = kb.scalar<int>("row0"), col0 = kb.scalar<int>("col0");
    auto key = kernels::DropoutKey::declare(kb);
    auto r0 = program_id(0) * BM, c0 = program_id(1) * BN, bh = program_id(2);
    auto rows = row0 + r0 + arange(0, BM);
    Tile keep = general ? kernels::dropout_keep(bh, rows, col0 + c0 + arange(0, BN), key)
                        : kernels::dropout_keep_block(bh, rows, col0 + c0, BN, key);
    store(Out.block({bh, r0, c0}, {BM, BN}), cast(u8, keep));
  });
  return k;
}

// Out[bh, r, c] = dropout_keep_mask_block(bh, row0 + r, col0 + c), u32 (0 or 0xFFFFFFFF expected),
// and Applied = apply_keep_mask(X, that mask) for X = the f32 bit patterns of Out's index (NaN,
// infinities and -0 among them). Grid as keep_kernel.
const Kernel& keep_mask_kernel() {
  static const Kernel k = kernel("keep_mask_tiles", [](Builder& kb) {
    auto BM = kb.meta<int>("BLOCK_M", 64), BN = kb.meta<int>("BLOCK_N", 128);
    auto Out = kb.tensor("Out", u32, 3), X = kb.tensor("X", f32, 3), Applied = kb.tensor("Applied", f32, 3);
    auto row0 = kb.scalar<int>("row0"), col0 = kb.scalar<int>("col0");
    auto key = kernels::DropoutKey::declare(kb);
    auto r0 = program_id(0) * BM, c0 = program_id(1) * BN, bh = program_id(2);
    Tile mask = kernels::dropout_keep_mask_block(bh, row0 + r0 + arange(0, BM), col0 + c0, BN, key);
    store(Out.block({bh, r0, c0}, {BM, BN}), mask);
    store(Applied.block({bh, r0, c0}, {BM, BN}), kernels::apply_keep_mask(load(X.block({bh, r0, c0}, {BM, BN})), mask));
  });
  return k;
}

std::vector<rt::Arg> rng_args(const kernels::DropoutRngHost& r) {
  return testing::dropout_key_args(r);
}

// The keep-mask of rows [row0, row0 + R) x columns [col0, col0 + C) for bh = 0..BH-1 through the
// interpreter, as u8 [BH, R, C].
std::vector<uint8_t> interpret_keep(const kernels::DropoutRngHost& r, int bm, int bn, bool general, int bh_count, int rows, int cols,
                                    int row0, int col0) {
  HostTensor out(u8, {bh_count, rows, cols});
  out.poison();
  std::vector<rt::Arg> args{out, row0, col0};
  for (const rt::Arg& a : rng_args(r)) args.push_back(a);
  interpret_any_shape(keep_kernel().build({{"BLOCK_M", bm}, {"BLOCK_N", bn}, {"GENERAL", general}}),
                {cdiv(rows, bm), cdiv(cols, bn), bh_count}, args);
  return raw<uint8_t>(out);
}

std::vector<uint8_t> host_keep(const kernels::DropoutRngHost& r, int bh_count, int rows, int cols, int row0, int col0) {
  std::vector<uint8_t> m;
  for (int bh = 0; bh < bh_count; ++bh)
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j)
        m.push_back(kernels::dropout_keep_host(r, static_cast<uint32_t>(bh), static_cast<uint32_t>(row0 + i), static_cast<uint32_t>(col0 + j)));
  return m;
}

size_t count_differences(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  return bad;
}

// The packed mask through the dropout_mask kernel in the interpreter (output poisoned first).
// persistent > 0: the PERSISTENT form on a grid of that many programs. `state`: seed and offset
// read from that rng_state tensor (r's scalars then unused).
std::vector<uint32_t> interpret_packed(const kernels::DropoutRngHost& r, int bh_count, int s_q, int s_k, int bm = 64, int bw = 4,
                                       int persistent = 0, bool causal = false, HostTensor* state = nullptr) {
  const int words = static_cast<int>(cdiv(s_k, 32));
  HostTensor mask(u32, {bh_count, s_q, words});
  mask.poison();
  std::vector<rt::Arg> args{mask, s_k};
  for (const rt::Arg& a : testing::dropout_key_args(r, state)) args.push_back(a);
  const runtime::Grid grid = persistent ? runtime::Grid{persistent} : runtime::Grid{cdiv(s_q, bm), cdiv(words, bw), bh_count};
  interpret_any_shape(kernels::dropout_mask().build({{"BLOCK_M", bm}, {"BLOCK_W", bw}, {"PERSISTENT", persistent > 0}, {"CAUSAL", causal}}), grid,
                args);
  return raw<uint32_t>(mask);
}

}  // namespace

TEST_CASE("the dropout_mask kernel lowered and run on the host (runtime/emulator.hpp) writes the interpreter's bits") {
  const kernels::DropoutRngHost r{0x0123456789abcdefull, 0x0000000500000007ull, kernels::dropout_keep_threshold(0.3)};
  for (int persistent : {0, 3})
    for (bool causal : {false, true}) {
      INFO("persistent " << persistent << " causal " << causal);
      const int bh = 3, s_q = 70, s_k = 200, words = static_cast<int>(cdiv(s_k, 32));
      HostTensor state = testing::rng_state_tensor(r.seed, r.offset);
      HostTensor mask(u32, {bh, s_q, words});
      mask.poison();
      std::vector<rt::Arg> args{mask, s_k};
      for (const rt::Arg& a : testing::dropout_key_args(r, &state)) args.push_back(a);
      const runtime::Grid grid = persistent ? runtime::Grid{persistent} : runtime::Grid{cdiv(s_q, 64), cdiv(words, 4), bh};
      runtime::emulate(kernels::dropout_mask().build({{"BLOCK_M", 64}, {"BLOCK_W", 4}, {"PERSISTENT", persistent > 0}, {"CAUSAL", causal}}),
                       grid, args);
      CHECK(raw<uint32_t>(mask) == interpret_packed(r, bh, s_q, s_k, 64, 4, persistent, causal));
    }
}

TEST_CASE("dropout key from device memory (rng_state): the same mask as the scalars, which it overrides") {
  // CUDA graphs freeze scalar arguments; rng_state_in_memory = 1 makes the kernels read seed and
  // offset from rng_state instead. 64-bit values with both halves non-zero, so a swapped or
  // dropped word shows.
  const kernels::DropoutRngHost r{0x89abcdef01234567ull, 0x00000003fedcba98ull, kernels::dropout_keep_threshold(0.3)};
  const kernels::DropoutRngHost garbage{0x1111111122222222ull, 0x3333333344444444ull, r.keep_threshold};
  HostTensor state = testing::rng_state_tensor(r.seed, r.offset), wrong = testing::rng_state_tensor(garbage.seed, garbage.offset);
  const std::vector<uint32_t> want = kernels::dropout_mask_packed_host(r, 3, 70, 200);
  CHECK(interpret_packed(r, 3, 70, 200) == want);                                // scalars (the flag off)
  CHECK(interpret_packed(garbage, 3, 70, 200, 64, 4, 0, false, &state) == want);  // memory wins over the scalars
  CHECK(interpret_packed(garbage, 3, 70, 200, 64, 4, 3, true, &state) ==
        interpret_packed(r, 3, 70, 200, 64, 4, 3, true));                         // persistent, causal: the same
  CHECK(interpret_packed(r, 3, 70, 200, 64, 4, 0, false, &wrong) != want);      // (the state is really read)
}

TEST_CASE("host Philox4x32-10 matches Random123's known-answer vectors") {
  for (const Kat& k : kKats) {
    INFO(fmt::format("counter {:08x} {:08x} {:08x} {:08x} key {:08x} {:08x}", k.counter[0], k.counter[1], k.counter[2], k.counter[3],
                     k.key[0], k.key[1]));
    CHECK(kernels::philox4x32_10_host(k.counter, k.key) == k.out);
  }
}

TEST_CASE("DSL philox4x32_10 in the interpreter: the known-answer vectors and the host on random counters") {
  const int n = 256;
  std::vector<uint32_t> c(4 * n), key(2 * n);
  std::mt19937 gen(7);
  for (auto& v : c) v = static_cast<uint32_t>(gen());
  for (auto& v : key) v = static_cast<uint32_t>(gen());
  for (int i = 0; i < 3; ++i) {
    for (int w = 0; w < 4; ++w) c[static_cast<size_t>(4 * i + w)] = kKats[i].counter[static_cast<size_t>(w)];
    for (int w = 0; w < 2; ++w) key[static_cast<size_t>(2 * i + w)] = kKats[i].key[static_cast<size_t>(w)];
  }
  HostTensor C = tensor_of(u32, {n, 4}, c), K = tensor_of(u32, {n, 2}, key), Out(u32, {n, 4});
  Out.poison();
  Kernel k = kernel("philox_kat", [&](Builder& kb) {
    auto Cp = kb.pointer("C", u32), Kp = kb.pointer("K", u32), Op = kb.pointer("Out", u32);
    auto i = arange(0, n);
    auto r = kernels::philox4x32_10({load(Cp + i * 4), load(Cp + i * 4 + 1), load(Cp + i * 4 + 2), load(Cp + i * 4 + 3)},
                                    {load(Kp + i * 2), load(Kp + i * 2 + 1)});
    for (int w = 0; w < 4; ++w) store(Op + i * 4 + w, r[static_cast<size_t>(w)]);
  });
  interpret_any_shape(k.build(), {1}, {C, K, Out});
  auto got = raw<uint32_t>(Out);
  for (int i = 0; i < 3; ++i) {
    INFO("KAT " << i);
    CHECK(U4{got[4 * i], got[4 * i + 1], got[4 * i + 2], got[4 * i + 3]} == kKats[i].out);
  }
  size_t bad = 0;
  for (int i = 0; i < n; ++i) {
    auto s = static_cast<size_t>(i);
    U4 want = kernels::philox4x32_10_host({c[4 * s], c[4 * s + 1], c[4 * s + 2], c[4 * s + 3]}, {key[2 * s], key[2 * s + 1]});
    bad += U4{got[4 * s], got[4 * s + 1], got[4 * s + 2], got[4 * s + 3]} != want;
  }
  CHECK(bad == 0);
}

TEST_CASE("philox4x32_10 broadcasts counters and keys of different shapes (i32 inputs cast to u32)") {
  const int R = 8, C = 16;
  HostTensor Out(u32, {4, R, C});
  Out.poison();
  Kernel k = kernel("philox_broadcast", [&](Builder& kb) {
    auto O = kb.tensor("Out", u32, 3);
    auto c3 = kb.scalar("c3", u32), k0 = kb.scalar<int>("k0");
    auto r = kernels::philox4x32_10({arange(0, R)[col] * 1000003, arange(0, C)[row], scalar_constant(u32, 0xdeadbeefu), c3},
                                    {k0, arange(0, C)[row] * -7});
    for (int w = 0; w < 4; ++w) {
      CHECK(r[static_cast<size_t>(w)].shape() == ir::Shape{R, C});
      CHECK(r[static_cast<size_t>(w)].dtype() == u32);
      store(O.block({w, 0, 0}, {R, C}), r[static_cast<size_t>(w)]);
    }
  });
  interpret_any_shape(k.build(), {1}, {Out, uint32_t{0x80000001u}, -5});
  auto got = raw<uint32_t>(Out);
  size_t bad = 0;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      U4 want = kernels::philox4x32_10_host({static_cast<uint32_t>(i * 1000003), static_cast<uint32_t>(j), 0xdeadbeefu, 0x80000001u},
                                            {static_cast<uint32_t>(-5), static_cast<uint32_t>(j * -7)});
      for (int w = 0; w < 4; ++w) bad += got[static_cast<size_t>((w * R + i) * C + j)] != want[static_cast<size_t>(w)];
    }
  CHECK(bad == 0);
}

TEST_CASE("uniform_f32 is (x >> 8) * 2^-24: in [0, 1), exact, the host's value") {
  std::vector<uint32_t> x{0u, 255u, 256u, 0x80000000u, 0xFFFFFF00u, 0xFFFFFFFFu};
  std::mt19937 gen(3);
  while (x.size() < 128) x.push_back(static_cast<uint32_t>(gen()));
  const int64_t n = static_cast<int64_t>(x.size());
  HostTensor X = tensor_of(u32, {n}, x), Out(f32, {n});
  Kernel k = kernel("uniform", [&](Builder& kb) {
    auto Xp = kb.pointer("X", u32), Op = kb.pointer("Out", f32);
    auto i = arange(0, n);
    store(Op + i, kernels::uniform_f32(load(Xp + i)));
  });
  interpret_any_shape(k.build(), {1}, {X, Out});
  auto got = raw<float>(Out);
  for (size_t i = 0; i < x.size(); ++i) {
    CHECK(got[i] == kernels::uniform_f32_host(x[i]));
    CHECK(got[i] >= 0.0f);
    CHECK(got[i] < 1.0f);
  }
  CHECK(got[0] == 0.0f);
  CHECK(got[2] == 0x1p-24f);
  CHECK(got[5] == 1.0f - 0x1p-24f);
}

TEST_CASE("dropout keep thresholds: round((1 - p) * 256), effective keep probability threshold / 256") {
  CHECK(kernels::dropout_keep_threshold(0.0) == 256);
  CHECK(kernels::dropout_keep_threshold(1.0) == 0);
  CHECK(kernels::dropout_keep_threshold(0.1) == 230);
  CHECK(kernels::dropout_keep_threshold(0.5) == 128);
  CHECK(kernels::dropout_keep_probability(230) == 0.8984375);
  CHECK_THROWS_AS(kernels::dropout_keep_threshold(1.5), std::invalid_argument);
  // threshold 256 keeps everything, 0 nothing
  kernels::DropoutRngHost all{99, 3, 256}, none{99, 3, 0};
  for (uint32_t j = 0; j < 64; ++j) {
    CHECK(kernels::dropout_keep_host(all, 1, 2, j));
    CHECK(!kernels::dropout_keep_host(none, 1, 2, j));
  }
  // both halves of seed and offset change the mask
  kernels::DropoutRngHost base{0x1111111122222222ull, 0x3333333344444444ull, 128};
  auto mask = [](const kernels::DropoutRngHost& r) { return kernels::dropout_mask_host(r, 2, 8, 64); };
  for (uint64_t flip : {uint64_t{1}, uint64_t{1} << 32}) {
    auto s = base, o = base;
    s.seed ^= flip;
    o.offset ^= flip;
    CHECK(mask(s) != mask(base));
    CHECK(mask(o) != mask(base));
  }
}

TEST_CASE("dropout keep-mask: interpreter == host bit for bit across tile shapes, offsets and both forms") {
  for (const auto& r : kRngs) {
    INFO(fmt::format("seed {:#x} offset {:#x} threshold {}", r.seed, r.offset, r.keep_threshold));
    // the whole [256, 512] mask at once, one program per bh
    const int BH = 2, R = 256, C = 512;
    auto whole = interpret_keep(r, R, C, false, BH, R, C, 0, 0);
    CHECK(count_differences(whole, host_keep(r, BH, R, C, 0, 0)) == 0);
    // the same mask tiled by [64, 128], [16, 16], [128, 32] blocks (block form) and [32, 64] (general form)
    struct Tiling {
      int bm, bn;
      bool general;
    };
    for (Tiling t : {Tiling{64, 128, false}, Tiling{16, 16, false}, Tiling{128, 32, false}, Tiling{32, 64, true}}) {
      INFO(fmt::format("{}x{} blocks, general={}", t.bm, t.bn, t.general));
      CHECK(count_differences(interpret_keep(r, t.bm, t.bn, t.general, BH, R, C, 0, 0), whole) == 0);
    }
    // one [64, 128] block at (m0, n0) = (96, 320) equals that sub-block of the whole mask (the
    // block form needs n0 to be a multiple of 64: a block start k * BLOCK_N)
    const int m0 = 96, n0 = 320;
    auto block = interpret_keep(r, 64, 128, false, BH, 64, 128, m0, n0);
    std::vector<uint8_t> sub;
    for (int bh = 0; bh < BH; ++bh)
      for (int i = 0; i < 64; ++i)
        for (int j = 0; j < 128; ++j) sub.push_back(whole[static_cast<size_t>((bh * R + m0 + i) * C + n0 + j)]);
    CHECK(count_differences(block, sub) == 0);
  }
  // the general form on columns that are not 16-aligned and tiles of any width; large coordinates
  const auto& r = kRngs[1];
  CHECK(count_differences(interpret_keep(r, 8, 24, true, 3, 40, 72, 5, 13), host_keep(r, 3, 40, 72, 5, 13)) == 0);
  CHECK(count_differences(interpret_keep(r, 32, 64, false, 1, 32, 64, 2000000000, 2147483584),
                          host_keep(r, 1, 32, 64, 2000000000, 2147483584)) == 0);
}

TEST_CASE("SWAR keep flags: bit 7 of each byte is byte < T, for every byte value and every threshold 0..256") {
  // 256 words holding every byte value in every byte lane: word w = bytes (w + 64 l) % 256, lane l
  // -- plus the same with lanes rotated, so that each value meets every neighbour pattern twice.
  const int n = 512;
  std::vector<uint32_t> words(n);
  for (int w = 0; w < n; ++w)
    for (int l = 0; l < 4; ++l) words[static_cast<size_t>(w)] |= static_cast<uint32_t>((w * (w < 256 ? 1 : 7) + 64 * l) % 256) << (8 * l);
  HostTensor in = tensor_of(u32, {n}, words);
  const Kernel k = kernel("keep_flags", [&](Builder& kb) {
    auto W = kb.tensor("W", u32, 1), Out = kb.tensor("Out", u32, 1);
    auto thr = kb.scalar("keep_threshold", u32);
    store(Out.block({0}, {n}), kernels::dropout_keep_flags(load(W.block({0}, {n})), thr));
  });
  const ir::Function fn = k.build();
  size_t bad = 0;
  for (uint32_t t = 0; t <= 256; ++t) {
    HostTensor out(u32, {n});
    interpret_any_shape(fn, {1}, {in, out, t});
    const auto flags = raw<uint32_t>(out);
    for (size_t w = 0; w < words.size(); ++w)
      for (int l = 0; l < 4; ++l) {
        const uint32_t byte = (words[w] >> (8 * l)) & 0xFFu;
        const bool keep = (flags[w] >> (8 * l + 7)) & 1u;
        if (keep != (byte < t) && bad++ < 8)
          MESSAGE(fmt::format("T = {}: byte {:#04x} in lane {} of {:#010x}: flag {}", t, byte, l, words[w], keep));
      }
  }
  CHECK(bad == 0);
}

TEST_CASE("dropout_keep_mask_block: 0 / 0xFFFFFFFF exactly where the host keeps, apply_keep_mask == where(keep, x, +0)") {
  std::vector<kernels::DropoutRngHost> rngs(std::begin(kRngs), std::end(kRngs));
  for (uint32_t t : {0u, 1u, 128u, 255u, 256u}) rngs.push_back({0x0123456789abcdefull, 77, t});
  struct Block {
    int bh, rows, cols, row0, col0, bm, bn;  // bn % 64 != 0: the per-element form
  };
  for (const auto& r : rngs)
    for (Block b : {Block{2, 128, 256, 0, 0, 64, 128}, Block{1, 64, 192, 33, 320, 32, 64}, Block{1, 48, 96, 5, 13, 16, 32}}) {
      INFO(fmt::format("seed {:#x} offset {:#x} threshold {}; {}x{} blocks at ({}, {})", r.seed, r.offset, r.keep_threshold, b.bm,
                       b.bn, b.row0, b.col0));
      HostTensor out(u32, {b.bh, b.rows, b.cols}), x(f32, {b.bh, b.rows, b.cols}), applied(f32, {b.bh, b.rows, b.cols});
      out.poison();
      applied.poison();
      // x's bit patterns: spread over all exponents and signs (NaN, inf, -0 and subnormals included)
      std::vector<uint32_t> xbits(static_cast<size_t>(x.numel()));
      for (size_t i = 0; i < xbits.size(); ++i) xbits[i] = static_cast<uint32_t>(i * 0x9E3779B1u);
      xbits[0] = 0x80000000u;  // -0
      xbits[1] = 0x7FC00000u;  // NaN
      xbits[2] = 0xFF800000u;  // -inf
      std::memcpy(x.data(), xbits.data(), xbits.size() * 4);
      std::vector<rt::Arg> args{out, x, applied, b.row0, b.col0};
      for (const rt::Arg& a : rng_args(r)) args.push_back(a);
      interpret_any_shape(keep_mask_kernel().build({{"BLOCK_M", b.bm}, {"BLOCK_N", b.bn}}), {cdiv(b.rows, b.bm), cdiv(b.cols, b.bn), b.bh}, args);
      const auto keep = host_keep(r, b.bh, b.rows, b.cols, b.row0, b.col0);
      const auto mask = raw<uint32_t>(out), got = raw<uint32_t>(applied);
      size_t bad_mask = 0, bad_applied = 0;
      for (size_t i = 0; i < keep.size(); ++i) {
        bad_mask += mask[i] != (keep[i] ? 0xFFFFFFFFu : 0u);
        bad_applied += got[i] != (keep[i] ? xbits[i] : 0u);  // dropped: +0, whatever x was
      }
      CHECK(bad_mask == 0);
      CHECK(bad_applied == 0);
    }
}

TEST_CASE("dropout_keep_block: a non-positive column count is a build error") {
  Kernel k = kernel("bad_keep", [](Builder& kb) {
    auto Out = kb.tensor("Out", u8, 2);
    auto keep = kernels::dropout_keep_block(0, arange(0, 16), 0, 0, kernels::DropoutKey::declare(kb));
    store(Out.block({0, 0}, {16, 1}), cast(u8, keep));
  });
  CHECK_THROWS_WITH_AS(k.build(), doctest::Contains("num_cols = 0 is not positive"), BuildError);
}

TEST_CASE("dropout_keep_words / dropout_mask: an odd word count is a build error naming the value") {
  Kernel k = kernel("bad_words", [](Builder& kb) {
    auto Out = kb.tensor("Out", u32, 2);
    store(Out.block({0, 0}, {16, 3}), kernels::dropout_keep_words(0, arange(0, 16), 0, 3, kernels::DropoutKey::declare(kb)));
  });
  CHECK_THROWS_WITH_AS(k.build(), doctest::Contains("num_words = 3 must be a positive even number"), BuildError);
  CHECK_THROWS_WITH_AS(kernels::dropout_mask().build({{"BLOCK_M", 16}, {"BLOCK_W", 1}}), doctest::Contains("BLOCK_W must be even"),
                       BuildError);
}

TEST_CASE("dropout keep-mask: the 16 elements of a Philox call are the columns one accumulator thread holds") {
  // j = 64 q + 8 k + 2 t + e: call 4 q + t, byte 2 k + e. A wgmma/mma.sync accumulator thread with
  // lane % 4 = t holds exactly columns 8 k + 2 t + e of each 64: its calls are its own.
  for (uint32_t q = 0; q < 3; ++q)
    for (uint32_t t = 0; t < 4; ++t) {
      std::vector<uint32_t> bytes;
      for (uint32_t k = 0; k < 8; ++k)
        for (uint32_t e = 0; e < 2; ++e) {
          const uint32_t j = 64 * q + 8 * k + 2 * t + e;
          CHECK(kernels::dropout_call_host(j) == 4 * q + t);
          bytes.push_back(kernels::dropout_position_host(j));
        }
      std::sort(bytes.begin(), bytes.end());
      for (uint32_t b = 0; b < 16; ++b) CHECK(bytes[b] == b);  // each byte serves exactly one column
    }
}

TEST_CASE("dropout_mask kernel: packed bits == host bit for bit, ragged S_k (tail bits 0), several schedules") {
  struct Shape {
    int bh, s_q, s_k;
  };
  struct Schedule {
    int bm, bw, persistent = 0;
  };
  for (const auto& r : kRngs)
    for (Shape s : {Shape{3, 100, 77}, Shape{2, 64, 256}, Shape{1, 5, 1}, Shape{2, 130, 200}})
      for (Schedule sc : {Schedule{64, 4}, Schedule{16, 2}, Schedule{32, 8}, Schedule{128, 2}, Schedule{16, 2, 3}, Schedule{32, 4, 7}}) {
        INFO(fmt::format("seed {:#x} offset {:#x} threshold {}; BH={} S_q={} S_k={}; BLOCK_M={} BLOCK_W={} persistent={}", r.seed,
                         r.offset, r.keep_threshold, s.bh, s.s_q, s.s_k, sc.bm, sc.bw, sc.persistent));
        auto got = interpret_packed(r, s.bh, s.s_q, s.s_k, sc.bm, sc.bw, sc.persistent);
        auto want = kernels::dropout_mask_packed_host(r, s.bh, s.s_q, s.s_k);
        REQUIRE(got.size() == want.size());
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
        CHECK(bad == 0);
        // the tail bits past S_k are 0
        const int words = static_cast<int>(cdiv(s.s_k, 32));
        if (s.s_k % 32 != 0)
          for (size_t row = 0; row < static_cast<size_t>(s.bh * s.s_q); ++row)
            CHECK((got[row * static_cast<size_t>(words) + static_cast<size_t>(words - 1)] >> (s.s_k % 32)) == 0);
      }
}

TEST_CASE("dropout_mask CAUSAL: every word a causal layer reads is the host's; tiles wholly above the diagonal are not written") {
  const kernels::DropoutRngHost r = kRngs[0];
  struct Shape {
    int bh, s_q, s_k;
  };
  for (Shape s : {Shape{2, 300, 300}, Shape{1, 100, 260}, Shape{2, 260, 100}})
    for (int bm : {16, 64}) {
      INFO(fmt::format("BH={} S_q={} S_k={} BLOCK_M={}", s.bh, s.s_q, s.s_k, bm));
      const auto got = interpret_packed(r, s.bh, s.s_q, s.s_k, bm, 2, 0, true);
      const auto want = kernels::dropout_mask_packed_host(r, s.bh, s.s_q, s.s_k);
      const int words = static_cast<int>(cdiv(s.s_k, 32)), diag = s.s_k - s.s_q;
      size_t bad = 0, skipped = 0;
      for (int bh = 0; bh < s.bh; ++bh)
        for (int row = 0; row < s.s_q; ++row)
          for (int w = 0; w < words; ++w) {
            const size_t i = (static_cast<size_t>(bh) * s.s_q + row) * words + w;
            if (32 * w <= row + diag) bad += got[i] != want[i];  // some key of the word is visible to the row
            else skipped += got[i] != want[i];                   // above the diagonal: may be left unwritten
          }
      CHECK(bad == 0);
      if (s.s_q == s.s_k) CHECK(skipped > 0);  // the work was skipped somewhere
    }
}

TEST_CASE("keep-rate statistics: bytes uniform (chi-square), keep rate within a binomial bound over 1M elements") {
  // The bytes behind the mask: 2^22 of them from the host generator, chi-square over 256 bins.
  {
    kernels::DropoutRngHost r{0x9e3779b97f4a7c15ull, 12345, 256};
    std::vector<double> bins(256, 0.0);
    const int rows = 1024, cols = 4096;
    for (uint32_t i = 0; i < rows; ++i)
      for (uint32_t j = 0; j < cols; ++j) bins[kernels::dropout_byte_host(r, 7, i, j)] += 1;
    const double expect = double(rows) * cols / 256;
    double chi2 = 0;
    for (double b : bins) chi2 += (b - expect) * (b - expect) / expect;
    // 255 degrees of freedom: mean 255, sd sqrt(510) = 22.6; the 1e-6 tails are ~130 and ~400
    MESSAGE(fmt::format("byte chi-square over {} bytes: {:.1f} (255 dof)", rows * cols, chi2));
    CHECK(chi2 > 130);
    CHECK(chi2 < 400);
  }
  // The packed mask from the dropout_mask kernel in the interpreter: BH = 4, S_q = S_k = 512.
  for (double p : {0.1, 0.5}) {
    kernels::DropoutRngHost r{0x5eed5eed5eedull + static_cast<uint64_t>(p * 100), 7, kernels::dropout_keep_threshold(p)};
    const int BH = 4, S = 512;
    auto packed = interpret_packed(r, BH, S, S);
    double kept = 0;
    std::vector<double> per_position(16, 0.0);  // kept elements per position j % 16 inside a Philox call
    for (size_t w = 0; w < packed.size(); ++w)
      for (int b = 0; b < 32; ++b)
        if ((packed[w] >> b) & 1u) kept += 1, per_position[static_cast<size_t>(b % 16)] += 1;
    const double n = double(BH) * S * S, q = kernels::dropout_keep_probability(r.keep_threshold);
    const double sd = std::sqrt(n * q * (1 - q));
    MESSAGE(fmt::format("p = {}: threshold {}, kept {} of {} = {:.6f} (expected {:.6f}, {:+.2f} sd)", p, r.keep_threshold, kept, n,
                        kept / n, q, (kept - n * q) / sd));
    CHECK(std::abs(kept - n * q) < 5 * sd);
    // chi-square of the keep counts over the 16 byte positions (15 dof; 1e-6 tail ~ 50)
    double chi2 = 0, e = n / 16 * q;
    for (double c : per_position) chi2 += (c - e) * (c - e) / (e * (1 - q));
    MESSAGE(fmt::format("p = {}: keep counts per byte position, chi-square {:.1f} (15 dof)", p, chi2));
    CHECK(chi2 < 50);
  }
}
