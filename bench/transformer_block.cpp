// bench/transformer_block (issue 30): one Llama-style transformer block's GEMMs and attention,
// forward and backward, timed end to end on one stream, with three ways of doing attention dropout
// (p = 0.1 on the probabilities), in alternated rounds of one process:
//   none   no dropout
//   fused  Philox in the attention kernels, forward and backward
//   gemm   the packed keep-mask written by the QKV projection GEMM beside its wgmmas (gemm's
//          DROPOUT_MASK, bit for bit the fused mask: checked first), read by the forward and the
//          backward (Options::dropout_bits)
//   spread the same mask written by every forward GEMM before the attention that reads it, in
//          shares proportional to their flops (MASK_RANGE): the QKV GEMM writes its share of this
//          layer's mask, the O, gate/up and down GEMMs theirs of the next layer's (two mask
//          buffers, as a model of L layers would alternate them; checked first)
// The block: hidden 4096, 32 query heads of D 128 (8 K/V heads; --mha: 32), MLP 14336 with gate
// and up as one GEMM, bf16, B x S = 16k tokens at S 4096 and 8192 (--seq S), causal (--full).
//   forward   QKV = X Wqkv^T; attention; Y = O Wo^T; GU = Y Wgu^T; Z = H Wd^T
//   backward  dWd = dZ^T H, dH = dZ Wd; dWgu = dGU^T Y, dY = dGU Wgu; dWo = dY^T O, dO = dY Wo;
//             attention backward; dWqkv = dQKV^T X, dX = dQKV Wqkv
// Not in it (element-wise, a few % of the block at this size): norms, residual adds, RoPE and
// SwiGLU's product (H and dGU are inputs of their own). Weight gradients leave in bf16.
// Prints BLOCK lines (per mode: forward, backward and block ms, against none) and PARTS (each
// step timed alone, mode none; the mask GEMMs beside the plain ones: every forward GEMM with its
// spread share and with the whole mask, and the mask kernel alone -- the data for a model of how
// much mask each GEMM hides). --hiding: that model measured and used instead (see hiding() below).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "api/attention.hpp"
#include "api/registry.hpp"
#include "bench/attention_ab.hpp"
#include "bench/bench_util.hpp"
#include "kernels/gemm.hpp"
#include "kernels/meta_names.hpp"
#include "kernels/philox_host.hpp"
#include "runtime/driver.hpp"
#include "runtime/bundle.hpp"
#include "runtime/function.hpp"

using namespace tilejit;
using attention_bench::time_ms;
using bench_util::median;
using bench_util::no_rng_state;
using bench_util::random_buffer;
using bench_util::rotated_rounds;
using runtime::DeviceBuffer;

namespace {

namespace mn = tilejit::kernels::meta_name;
constexpr ir::DType kBf16 = ir::DType::bf16;
constexpr double kDropoutP = 0.1;
constexpr uint64_t kSeed = 1234;

struct Shape {
  int64_t S, B, hidden = 4096, heads = 32, kv_heads = 8, D = 128, mlp = 14336;
  bool causal = true;
  int64_t tokens() const { return B * S; }
  int64_t qkv_cols() const { return (heads + 2 * kv_heads) * D; }
  int64_t words() const { return (S + 31) / 32; }
};

// One GEMM role of the block: C[M, N] = op(A) op(B) with the library's schedule (128 x 256 tiles,
// GROUP_M 8, 8 warps, 4 stages) and the operand layouts the role has:
//   nt  C = A B^T   A [M, K], B given as [N, K] (a layer's forward: X W^T)
//   nn  C = A B     A [M, K], B [K, N]           (the input gradient: dY W)
//   tn  C = A^T B   A given as [K, M], B [K, N]  (the weight gradient: dY^T X; both MN-major,
//                                                 read by wgmma transposed)
enum class Layout { nt, nn, tn };

// The mask tiles the GEMMs write (--mask-tile MxW: rows x 32-bit words; decision 015's 64 x 16 by
// default): one a K step, so a smaller tile spreads the same mask over more steps (decision 094).
struct MaskTile {
  int64_t rows = 64, words = 16;
};
MaskTile g_mask_tile;
// --mask-warps W[:MMA_REGS:MASK_REGS]: the tiles written by W warps of their own beside the GEMM's 8
// (MASK_WARPS, setmaxnreg between the roles when given) instead of in the K loop (decision 015)
struct MaskWarps {
  int64_t warps = 0, mma_registers = 0, mask_registers = 0;
};
MaskWarps g_mask_warps;

Function make_gemm(Layout l, bool dropout_mask = false, bool causal = false, bool ranged = false) {
  const library::LibraryKernel* lk = library::find("gemm");
  lang::Meta meta = lk->default_meta;
  const auto set = [&](const char* name, ir::MetaValue v) {
    for (auto& [k, value] : meta)
      if (k == name) return void(value = v);
    meta.emplace_back(name, v);
  };
  set(mn::kOutDtype, kBf16);
  set(mn::kAKmajor, l != Layout::tn);
  set(mn::kBKmajor, l == Layout::nt);
  if (dropout_mask) {
    // decision 015's best placement: 64 x 16-word mask tiles, one a K step, 16-byte stores
    set(mn::kDropoutMask, true);
    set(mn::kMaskBlockM, g_mask_tile.rows);
    set(mn::kMaskBlockW, g_mask_tile.words);
    set(mn::kMaskTilesPerStep, int64_t{1});
    set(mn::kMaskAlign, int64_t{16});
    set(mn::kMaskCausal, causal);  // only the words a causal layer reads
    set(mn::kMaskRange, ranged);   // tiles [mask_tile_first, mask_tile_end) of it
    if (g_mask_warps.warps) {
      set(mn::kMaskWarps, g_mask_warps.warps);
      if (g_mask_warps.mma_registers) set(mn::kMmaRegisters, g_mask_warps.mma_registers), set(mn::kMaskRegisters, g_mask_warps.mask_registers);
    }
  }
  jit::CompileOptions o;
  o.num_warps = lk->num_warps + (dropout_mask ? static_cast<int>(g_mask_warps.warps) : 0);
  o.pipeline.stages = lk->stages;
  return Function(kernels::gemm(), meta, o);
}

int64_t meta_of(const Function& f, const char* name) { return std::get<int64_t>(f.signature().find_meta(name)->value); }

// The block's tensors: weights, activations and gradients (random where read first: the timing
// does not depend on the values).
enum Buf : size_t { x, wqkv, wo, wgu, wd, qkv, o, lse, y, gu, h, z, dz, dh, dgu, dy, dout, dqkv, dx, dwqkv, dwo, dwgu, dwd, bits, bits_next, ws, kBufs };

// The mask work a GEMM carries: none, all of the mask in `buffer` (first = end = -1), or its
// tiles [first, end) (MASK_RANGE).
struct MaskShare {
  bool on = false;
  Buf buffer = bits;
  int64_t first = -1, end = -1;
};

struct Block {
  Shape s;
  bool dry;  // --check-only: made-up addresses, every launch only checked (no GPU)
  int calls = 0;  // GEMM and attention calls made (checked, when dry)
  std::array<uint64_t, kBufs> addr{};
  std::vector<DeviceBuffer> owned;
  Function nt = make_gemm(Layout::nt), nn = make_gemm(Layout::nn), tn = make_gemm(Layout::tn), nt_mask = make_gemm(Layout::nt, true, s.causal),
           nt_share = make_gemm(Layout::nt, true, s.causal, true);

  size_t bytes_of(Buf b) const {
    const auto bf16 = [](int64_t r, int64_t c) { return static_cast<size_t>(r * c) * 2; };
    const int64_t M = s.tokens(), HD = s.heads * s.D;
    switch (b) {
      case x: case y: case z: case dz: case dy: case dx: return bf16(M, s.hidden);
      case wqkv: case dwqkv: return bf16(s.qkv_cols(), s.hidden);
      case wo: case dwo: return bf16(s.hidden, HD);
      case wgu: case dwgu: return bf16(2 * s.mlp, s.hidden);
      case wd: case dwd: return bf16(s.hidden, s.mlp);
      case qkv: case dqkv: return bf16(M, s.qkv_cols());
      case o: case dout: return bf16(M, HD);
      case lse: return static_cast<size_t>(M * s.heads) * 4;
      case gu: case dgu: return bf16(M, 2 * s.mlp);
      case h: case dh: return bf16(M, s.mlp);
      case bits: case bits_next: return static_cast<size_t>(s.B * s.heads * s.S * s.words()) * 4;
      case ws: return workspace_bytes();
      case kBufs: break;
    }
    return 0;
  }
  Block(Shape shape, bool check_only) : s(shape), dry(check_only) {
    uint64_t fake = uint64_t{1} << 40;  // (made-up, 1 MB aligned)
    for (size_t b = 0; b < kBufs; ++b) {
      const size_t n = bytes_of(static_cast<Buf>(b));
      if (dry) {
        addr[b] = fake, fake += (n + (1u << 20)) & ~uint64_t{(1u << 20) - 1};
        continue;
      }
      const bool input = b == x || b == wqkv || b == wo || b == wgu || b == wd || b == h || b == dz || b == dgu;
      owned.push_back(input ? random_buffer(n, kBf16, b + 1) : DeviceBuffer(n));
      addr[b] = owned.back().ptr();
    }
  }
  DeviceBuffer& buffer(Buf b) { return owned.at(static_cast<size_t>(b)); }

  // Q, K, V (and dQ, dK, dV) as [B, S, heads, D] views of the QKV projection's output
  attention::Tensor head_view(Buf b, int which) const {
    const int64_t offset = which == 0 ? 0 : which == 1 ? s.heads * s.D : (s.heads + s.kv_heads) * s.D;
    const int64_t heads = which == 0 ? s.heads : s.kv_heads, N = s.qkv_cols();
    return attention::strided(addr[b] + static_cast<uint64_t>(offset * 2), kBf16, {s.B, s.S, heads, s.D}, {s.S * N, N, s.D, 1});
  }
  attention::Tensor bhsd(Buf b) const { return attention::contiguous(addr[b], kBf16, {s.B, s.S, s.heads, s.D}); }
  attention::Tensor lse_view() const { return attention::contiguous(addr[lse], ir::DType::f32, {s.B, s.heads, s.S}); }
  // the mask this layer's attention reads (spread: the buffer `current` names)
  Buf current = bits, next = bits_next;
  attention::Tensor bits_view(Buf b) const { return attention::contiguous(addr[b], ir::DType::u32, {s.B * s.heads, s.S, s.words()}); }
  attention::Tensor bits_view() const { return bits_view(current); }
  // the mask's tiles as the GEMMs cut it (their MASK_BLOCK_M rows x MASK_BLOCK_W words)
  int64_t mask_tiles() const {
    return s.B * s.heads * lang::cdiv(s.S, meta_of(nt_share, mn::kMaskBlockM)) * lang::cdiv(s.words(), meta_of(nt_share, mn::kMaskBlockW));
  }
  attention::Workspace workspace() const { return {addr[ws], bytes_of(ws)}; }
  // the mask kernel alone (attention::generate_dropout_bits), into `bits`: what the GEMMs' shares replace
  void generate_mask(CUstream st) const {
    attention::Options gen = options(2);
    gen.dropout_bits.reset();
    attention::generate_dropout_bits(bits_view(bits), s.B, s.heads, s.S, s.S, gen, st);
  }

  attention::Options options(int mode) const {  // 0 none, 1 fused, 2 bits from the QKV GEMM, 3 spread
    attention::Options opts;
    opts.causal = s.causal;
    if (mode) opts.dropout_p = kDropoutP, opts.seed = kSeed, opts.offset = 0;
    if (mode >= 2) opts.dropout_bits = bits_view();
    return opts;
  }
  // the backward's: spread's last forward swapped the buffers after its attention read `current`
  attention::Options backward_options(int mode) const {
    attention::Options opts = options(mode);
    if (mode == 3) opts.dropout_bits = bits_view(next);
    return opts;
  }
  size_t workspace_bytes() const {
    size_t most = 0;
    for (int mode : {0, 1, 2, 3}) most = std::max(most, attention::backward_workspace_bytes(head_view(qkv, 0), head_view(qkv, 1), options(mode)));
    return std::max<size_t>(most, 256);
  }

  // C[M, N] = op(A) op(B) on `stream` (see Layout): a and b as the role stores them
  void gemm(Function& g, Layout l, Buf a, Buf b, Buf c, int64_t M, int64_t N, int64_t K, CUstream stream, MaskShare share = {}) {
    const auto matrix = [&](Buf m, int64_t rows, int64_t cols) { return attention::contiguous(addr[m], kBf16, {rows, cols}); };
    const attention::Tensor A = l == Layout::tn ? matrix(a, K, M) : matrix(a, M, K);
    const attention::Tensor B = l == Layout::nt ? matrix(b, N, K) : matrix(b, K, N);
    const attention::Tensor C = matrix(c, M, N);
    const runtime::Grid grid{lang::cdiv(M, meta_of(g, mn::kBlockM)) * lang::cdiv(N, meta_of(g, mn::kBlockN))};
    std::vector<runtime::DeviceArg> args{A.view(), B.view(), C.view()};
    const attention::Tensor bv = bits_view(share.buffer);
    if (share.on) {
      const attention::Options d = options(2);
      args.insert(args.end(), {bv.view(), static_cast<int32_t>(s.S), static_cast<uint32_t>(d.seed), static_cast<uint32_t>(d.seed >> 32),
                               static_cast<uint32_t>(d.offset), static_cast<uint32_t>(d.offset >> 32),
                               kernels::dropout_keep_threshold(d.dropout_p), no_rng_state, 0u});
      if (share.first >= 0) args.insert(args.end(), {static_cast<int32_t>(share.first), static_cast<int32_t>(share.end)});
    }
    ++calls;
    if (dry) g.check(grid, std::span<const runtime::DeviceArg>(args));
    else g.launch(grid, stream, args);
  }

  // spread: the mask's tiles over the forward GEMMs in proportion to their flops (N x K each, M
  // common), or as `model_bounds` say: [0, qkv) by the QKV GEMM, then O, gate/up and down in that order
  std::optional<std::array<int64_t, 5>> model_bounds;  // --hiding: assign_mask_tiles' split instead of the flops'
  std::array<int64_t, 5> spread_bounds() const {
    if (model_bounds) return *model_bounds;
    const double w[4] = {double(s.qkv_cols() * s.hidden), double(s.hidden * s.heads * s.D), double(2 * s.mlp * s.hidden),
                         double(s.hidden * s.mlp)};
    const double total = w[0] + w[1] + w[2] + w[3];
    std::array<int64_t, 5> b{0, 0, 0, 0, mask_tiles()};
    double acc = 0;
    for (int i = 0; i < 3; ++i) acc += w[i], b[static_cast<size_t>(i) + 1] = static_cast<int64_t>(std::llround(acc / total * double(mask_tiles())));
    return b;
  }
  // 0 QKV (this layer's mask), 1-3 O, gate/up, down (the next layer's); an empty share: the plain GEMM
  MaskShare share_of(int gemm_index) const {
    const std::array<int64_t, 5> b = spread_bounds();
    const int64_t first = b[static_cast<size_t>(gemm_index)], end = b[static_cast<size_t>(gemm_index) + 1];
    if (first >= end) return {};
    return {true, gemm_index == 0 ? current : next, first, end};
  }
  // forward GEMM i (0 QKV, 1 O, 2 gate/up, 3 down): plain, or writing tiles [first, end) of a mask
  void forward_gemm(int i, CUstream st, MaskShare share = {}) {
    const int64_t M = s.tokens();
    Function& g = share.on ? nt_share : nt;
    switch (i) {
      case 0: gemm(g, Layout::nt, x, wqkv, qkv, M, s.qkv_cols(), s.hidden, st, share); return;
      case 1: gemm(g, Layout::nt, o, wo, y, M, s.hidden, s.heads * s.D, st, share); return;
      case 2: gemm(g, Layout::nt, y, wgu, gu, M, 2 * s.mlp, s.hidden, st, share); return;
      default: gemm(g, Layout::nt, h, wd, z, M, s.hidden, s.mlp, st, share); return;
    }
  }
  void qkv_projection(int mode, CUstream st) {
    if (mode == 2) gemm(nt_mask, Layout::nt, x, wqkv, qkv, s.tokens(), s.qkv_cols(), s.hidden, st, {true, current});
    else forward_gemm(0, st, mode == 3 ? share_of(0) : MaskShare{});
  }
  void attention_forward(int mode, CUstream st) {
    ++calls;
    if (dry) attention::check_forward(head_view(qkv, 0), head_view(qkv, 1), head_view(qkv, 2), bhsd(o), lse_view(), options(mode));
    else attention::forward(head_view(qkv, 0), head_view(qkv, 1), head_view(qkv, 2), bhsd(o), lse_view(), options(mode), st);
  }
  // (spread: the next forward's attention reads the buffer this one's later GEMMs wrote into)
  void forward(int mode, CUstream st) {
    const bool spread = mode == 3;
    qkv_projection(mode, st);
    attention_forward(mode, st);
    for (int i = 1; i < 4; ++i) forward_gemm(i, st, spread ? share_of(i) : MaskShare{});
    if (spread) std::swap(current, next);
  }
  void attention_backward(int mode, CUstream st) {
    const auto q = head_view(qkv, 0), k = head_view(qkv, 1), v = head_view(qkv, 2), dq = head_view(dqkv, 0), dk = head_view(dqkv, 1),
               dv = head_view(dqkv, 2);
    ++calls;
    if (dry) attention::check_backward(q, k, v, bhsd(o), bhsd(dout), lse_view(), dq, dk, dv, backward_options(mode), workspace());
    else attention::backward(q, k, v, bhsd(o), bhsd(dout), lse_view(), dq, dk, dv, backward_options(mode), st, workspace());
  }
  void backward(int mode, CUstream st) {
    const int64_t M = s.tokens();
    gemm(tn, Layout::tn, dz, h, dwd, s.hidden, s.mlp, M, st);          // dWd = dZ^T H
    gemm(nn, Layout::nn, dz, wd, dh, M, s.mlp, s.hidden, st);          // dH = dZ Wd
    gemm(tn, Layout::tn, dgu, y, dwgu, 2 * s.mlp, s.hidden, M, st);    // dWgu = dGU^T Y
    gemm(nn, Layout::nn, dgu, wgu, dy, M, s.hidden, 2 * s.mlp, st);    // dY = dGU Wgu
    gemm(tn, Layout::tn, dy, o, dwo, s.hidden, s.heads * s.D, M, st);  // dWo = dY^T O
    gemm(nn, Layout::nn, dy, wo, dout, M, s.heads * s.D, s.hidden, st);  // dO = dY Wo
    attention_backward(mode, st);
    gemm(tn, Layout::tn, dqkv, x, dwqkv, s.qkv_cols(), s.hidden, M, st);  // dWqkv = dQKV^T X
    gemm(nn, Layout::nn, dqkv, wqkv, dx, M, s.hidden, s.qkv_cols(), st);  // dX = dQKV Wqkv
  }
  // the GEMMs' flops (2 M N K each) and attention's (4 B H S^2 D, / 2 causal; backward 2.5x)
  double gemm_flops() const {
    const double M = static_cast<double>(s.tokens()), hd = static_cast<double>(s.hidden);
    const double fwd = 2 * M * hd * (static_cast<double>(s.qkv_cols()) + static_cast<double>(s.heads * s.D) + 3 * static_cast<double>(s.mlp));
    return 3 * fwd;  // forward, input and weight gradients
  }
  double attention_flops() const {
    return 3.5 * 4.0 * static_cast<double>(s.B * s.heads) * static_cast<double>(s.S) * static_cast<double>(s.S) * static_cast<double>(s.D) /
           (s.causal ? 2 : 1);
  }
};

// The masks modes gemm and spread write against attention::generate_dropout_bits' (every word a
// causal row can see): gemm's from the QKV GEMM, spread's from two forwards (each buffer gets the
// QKV GEMM's share from one and the O, gate/up and down GEMMs' from the other).
bool masks_match(Block& blk, const runtime::Stream& stream) {
  const size_t bytes = blk.bytes_of(bits);
  std::vector<uint32_t> want(bytes / 4), got(bytes / 4);
  const std::vector<uint32_t> zeros(bytes / 4, 0u);
  blk.generate_mask(stream.handle());
  stream.synchronize();
  blk.buffer(bits).download(want.data(), bytes);
  const auto same = [&](Buf b) {
    blk.buffer(b).download(got.data(), bytes);
    const int64_t words = blk.s.words();
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const int64_t word = static_cast<int64_t>(i % static_cast<size_t>(words)), row = static_cast<int64_t>(i / static_cast<size_t>(words)) % blk.s.S;
      if (!blk.s.causal || 32 * word <= row) bad += got[i] != want[i];
    }
    return bad == 0;
  };
  for (Buf b : {bits, bits_next}) blk.buffer(b).upload(zeros.data(), bytes);
  blk.qkv_projection(2, stream.handle());
  stream.synchronize();
  const bool gemm = same(bits);
  for (Buf b : {bits, bits_next}) blk.buffer(b).upload(zeros.data(), bytes);
  blk.forward(3, stream.handle());
  blk.forward(3, stream.handle());
  stream.synchronize();
  const bool spread = same(bits) && same(bits_next);
  const std::array<int64_t, 5> b = blk.spread_bounds();
  std::printf("MASK gemm_bits_identical=%d spread_bits_identical=%d spread_tiles=%ld/%ld/%ld/%ld of %ld (QKV / O / gate-up / down)\n",
              gemm ? 1 : 0, spread ? 1 : 0, static_cast<long>(b[1] - b[0]), static_cast<long>(b[2] - b[1]), static_cast<long>(b[3] - b[2]),
              static_cast<long>(b[4] - b[3]), static_cast<long>(b[4]));
  return gemm && spread;
}

// --check-only: every launch of every mode checked as the GPU run would launch it (arguments,
// grids, the kernels compiled), without a GPU: what CI runs.
int check_only(Shape shape) {
  Block blk(shape, true);
  for (int mode : {0, 1, 2, 3}) {
    blk.forward(mode, nullptr);
    blk.backward(mode, nullptr);
  }
  for (Function* g : {&blk.nt, &blk.nn, &blk.tn, &blk.nt_mask, &blk.nt_share}) {
    const jit::CompiledKernel& k = g->compiled();
    std::printf("KERNEL %s: %s\n", runtime::describe_meta(g->signature().meta).c_str(), k.info.to_string().c_str());
    if (k.info.spill_store_bytes > 0) {
      std::fprintf(stderr, "transformer_block: a GEMM spills (%s)\n", k.info.to_string().c_str());
      return 1;
    }
  }
  std::printf("CHECKED S=%ld kv_heads=%ld causal=%d: %d GEMM and attention calls in 4 modes\n", static_cast<long>(shape.S),
              static_cast<long>(shape.kv_heads), shape.causal ? 1 : 0, blk.calls);
  return 0;
}

int run(Shape shape, int max_reps) {
  Block blk(shape, false);
  runtime::Stream stream;
  const Shape& s = blk.s;
  std::printf("BLOCK_SHAPE B=%ld S=%ld hidden=%ld heads=%ld kv_heads=%ld D=%ld mlp=%ld causal=%d p=%g\n", static_cast<long>(s.B),
              static_cast<long>(s.S), static_cast<long>(s.hidden), static_cast<long>(s.heads), static_cast<long>(s.kv_heads),
              static_cast<long>(s.D), static_cast<long>(s.mlp), s.causal ? 1 : 0, kDropoutP);
  if (!masks_match(blk, stream)) return 1;
  // the whole block per mode: six rounds, the modes' order rotated each round
  constexpr int kModes = 4;
  std::vector<double> fwd[kModes], bwd[kModes], both[kModes];
  rotated_rounds(6, kModes, [&](int mode) {
    fwd[mode].push_back(time_ms([&] { blk.forward(mode, stream.handle()); }, stream, max_reps));
    blk.forward(mode, stream.handle());  // (the backward reads this mode's O, LSE and mask)
    bwd[mode].push_back(time_ms([&] { blk.backward(mode, stream.handle()); }, stream, max_reps));
    both[mode].push_back(time_ms([&] { blk.forward(mode, stream.handle()), blk.backward(mode, stream.handle()); }, stream, max_reps));
  });
  const char* names[kModes] = {"none", "fused", "gemm", "spread"};
  const double f0 = median(fwd[0]), b0 = median(bwd[0]), t0 = median(both[0]);
  for (int mode = 0; mode < kModes; ++mode) {
    const double f = median(fwd[mode]), b = median(bwd[mode]), t = median(both[mode]);
    std::printf("BLOCK mode=%s fwd_ms=%.3f bwd_ms=%.3f block_ms=%.3f fwd_vs_none=%.3f bwd_vs_none=%.3f block_vs_none=%.3f "
                "block_tflops=%.0f\n",
                names[mode], f, b, t, f / f0, b / b0, t / t0, (blk.gemm_flops() + blk.attention_flops()) / (t * 1e-3) / 1e12);
  }
  std::printf("BLOCK gemm_vs_fused=%.3f spread_vs_fused=%.3f (the block with the mask from the GEMMs over fused dropout's)\n",
              median(both[2]) / median(both[1]), median(both[3]) / median(both[1]));
  // the parts alone (mode none; the mask GEMM beside the plain QKV GEMM)
  const CUstream st = stream.handle();
  const int64_t M = s.tokens();
  const auto part = [&](const char* name, const std::function<void()>& fn) {
    std::printf("PARTS %s_ms=%.4f\n", name, time_ms(fn, stream, max_reps));
  };
  part("qkv_gemm", [&] { blk.qkv_projection(0, st); });
  part("qkv_gemm_with_mask", [&] { blk.qkv_projection(2, st); });
  part("qkv_gemm_with_share", [&] { blk.qkv_projection(3, st); });
  part("forward_spread", [&] { blk.forward(3, st); });
  // issue 30's hiding model: each forward GEMM plain, with its spread share and with the whole mask
  // (MASK_RANGE over every tile), and the mask kernel alone on the same mask
  const MaskShare whole{true, bits, 0, blk.mask_tiles()};
  const char* gemm_names[4] = {"qkv", "o", "gate_up", "down"};
  for (int i = 1; i < 4; ++i)
    part(fmt::format("{}_gemm_with_share", gemm_names[i]).c_str(), [&] { blk.forward_gemm(i, st, blk.share_of(i)); });
  for (int i = 0; i < 4; ++i)
    part(fmt::format("{}_gemm_with_whole_mask", gemm_names[i]).c_str(), [&] { blk.forward_gemm(i, st, whole); });
  part("mask_kernel", [&] { blk.generate_mask(st); });
  part("attention_fwd", [&] { blk.attention_forward(0, st); });
  part("attention_fwd_bits", [&] { blk.attention_forward(2, st); });
  part("attention_fwd_fused", [&] { blk.attention_forward(1, st); });
  blk.forward(0, st);
  part("attention_bwd", [&] { blk.attention_backward(0, st); });
  for (int i = 1; i < 4; ++i) part(fmt::format("{}_gemm", gemm_names[i]).c_str(), [&] { blk.forward_gemm(i, st); });
  part("down_dx_gemm_nn", [&] { blk.gemm(blk.nn, Layout::nn, dz, wd, dh, M, s.mlp, s.hidden, st); });
  part("down_dw_gemm_tn", [&] { blk.gemm(blk.tn, Layout::tn, dz, h, dwd, s.hidden, s.mlp, M, st); });
  std::fflush(stdout);
  return 0;
}

// --hiding (issue 30's model, decision 094): how much each forward GEMM's share costs where it
// runs, in the block's forward (spread mode: attention reads the bits) with the first n of the
// mask's tiles on that GEMM alone (n = 1/16 .. all), against the same forward with no GEMM carrying
// any, all in rotated rounds. (Timing a GEMM alone, repeated, read 2-3x these costs: decision 094.)
// The curves go to attention::assign_mask_tiles, whose split is checked against the flops' split by
// timing the forward and the block both ways beside none, alternated.
int hiding(Shape shape, int max_reps) {
  Block blk(shape, false);
  runtime::Stream stream;
  const CUstream st = stream.handle();
  const Shape& s = blk.s;
  const int64_t all = blk.mask_tiles();
  std::printf("BLOCK_SHAPE B=%ld S=%ld causal=%d mask_tiles=%ld of %ldx%ld words mask_warps=%ld\n", static_cast<long>(s.B),
              static_cast<long>(s.S), s.causal ? 1 : 0, static_cast<long>(all), static_cast<long>(g_mask_tile.rows),
              static_cast<long>(g_mask_tile.words), static_cast<long>(g_mask_warps.warps));
  const char* gemm_names[4] = {"qkv", "o", "gate_up", "down"};
  const std::vector<double> fractions{1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 3.0 / 4, 1.0};
  struct Point {
    int gemm;       // -1: no GEMM carries tiles (the baseline)
    int64_t tiles;  // on `gemm`, [0, tiles)
    std::vector<double> ms;
  };
  std::vector<Point> points{{-1, 0, {}}};
  for (int i = 0; i < 4; ++i)
    for (double f : fractions) points.push_back({i, std::llround(f * static_cast<double>(all)), {}});
  const auto bounds_of = [](const Point& p) {
    std::array<int64_t, 5> b{0, 0, 0, 0, 0};
    for (int j = p.gemm + 1; j < 5 && p.gemm >= 0; ++j) b[static_cast<size_t>(j)] = p.tiles;
    return b;
  };
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round)
    for (size_t k = 0; k < points.size(); ++k) {
      // rotated, and reversed every other round (clock drift favours whichever runs first)
      const size_t j = (k + static_cast<size_t>(round) * 5) % points.size();
      Point& p = points[round % 2 ? points.size() - 1 - j : j];
      blk.model_bounds = bounds_of(p);
      p.ms.push_back(time_ms([&] { blk.forward(3, st); }, stream, max_reps));
    }
  const double baseline = median(points[0].ms);
  std::printf("HIDE baseline_fwd_ms=%.4f (spread's forward, no GEMM carrying tiles)\n", baseline);
  std::vector<attention::MaskHidingCurve> curves(4);
  for (const Point& p : points) {
    if (p.gemm < 0) continue;
    const double ms = median(p.ms);
    curves[static_cast<size_t>(p.gemm)].points.emplace_back(p.tiles, ms - baseline);
    std::printf("HIDE gemm=%s tiles=%ld fwd_ms=%.4f extra_ms=%.4f\n", gemm_names[p.gemm], static_cast<long>(p.tiles), ms, ms - baseline);
  }
  blk.model_bounds.reset();
  const std::array<int64_t, 5> by_flops = blk.spread_bounds();
  const std::vector<int64_t> counts = attention::assign_mask_tiles(curves, all);
  std::array<int64_t, 5> by_model{0, 0, 0, 0, 0};
  for (size_t i = 0; i < 4; ++i) by_model[i + 1] = by_model[i] + counts[i];
  double predicted[2] = {0, 0};
  for (size_t i = 0; i < 4; ++i) {
    predicted[0] += attention::mask_hiding_extra_ms(curves[i], by_flops[i + 1] - by_flops[i]);
    predicted[1] += attention::mask_hiding_extra_ms(curves[i], counts[i]);
  }
  for (int m = 0; m < 2; ++m) {
    const std::array<int64_t, 5>& b = m ? by_model : by_flops;
    std::printf("ASSIGN split=%s tiles=%ld/%ld/%ld/%ld predicted_extra_ms=%.4f\n", m ? "model" : "flops", static_cast<long>(b[1] - b[0]),
                static_cast<long>(b[2] - b[1]), static_cast<long>(b[3] - b[2]), static_cast<long>(b[4] - b[3]), predicted[m]);
  }
  // the check: the forward (and the block) with each split, beside none and the baseline, alternated
  blk.model_bounds = by_model;
  if (!masks_match(blk, stream)) return 1;
  constexpr int kVariants = 4;  // none, the baseline (bits, no GEMM carrying tiles), spread by flops, by the model
  const char* names[kVariants] = {"none", "baseline", "spread_flops", "spread_model"};
  std::vector<double> fwd[kVariants], both[kVariants];
  const auto use = [&](int v) {
    if (v == 1) blk.model_bounds = std::array<int64_t, 5>{0, 0, 0, 0, 0};
    else if (v == 2) blk.model_bounds.reset();
    else blk.model_bounds = by_model;
    return v == 0 ? 0 : 3;  // the block's mode
  };
  rotated_rounds(6, kVariants, [&](int v) {
    const int mode = use(v);
    fwd[v].push_back(time_ms([&] { blk.forward(mode, st); }, stream, max_reps));
    blk.forward(mode, st);
    both[v].push_back(time_ms([&] { blk.forward(mode, st), blk.backward(mode, st); }, stream, max_reps));
  });
  const double f0 = median(fwd[0]), fb = median(fwd[1]), t0 = median(both[0]);
  for (int v = 0; v < kVariants; ++v)
    std::printf("HIDING variant=%s fwd_ms=%.3f fwd_vs_none=%.3f gemm_extra_ms=%.4f predicted_extra_ms=%.4f block_ms=%.3f block_vs_none=%.3f\n",
                names[v], median(fwd[v]), median(fwd[v]) / f0, v ? median(fwd[v]) - fb : 0.0, v >= 2 ? predicted[v - 2] : 0.0,
                median(both[v]), median(both[v]) / t0);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("TILEJIT_SPECIALIZE", "0", /*overwrite=*/0);  // library kernels as the API launches them
  std::vector<int64_t> seqs{4096, 8192};
  bool mha = false, full = false, check = false, hide = false;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seq" && i + 1 < argc) seqs = {std::atoll(argv[++i])};
    else if (a == "--mha") mha = true;
    else if (a == "--full") full = true;
    else if (a == "--check-only") check = true;
    else if (a == "--hiding") hide = true;
    else if (a == "--mask-warps" && i + 1 < argc &&
             std::sscanf(argv[i + 1], "%ld:%ld:%ld", &g_mask_warps.warps, &g_mask_warps.mma_registers, &g_mask_warps.mask_registers) >= 1)
      ++i;
    else if (a == "--mask-tile" && i + 1 < argc && std::sscanf(argv[i + 1], "%ldx%ld", &g_mask_tile.rows, &g_mask_tile.words) == 2) ++i;
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--seq S] [--mha] [--full] [--reps N] [--check-only] [--hiding] [--mask-tile MxW] [--mask-warps W[:MMA_REGS:MASK_REGS]]\n", argv[0]);
      return 2;
    }
  }
  if (g_mask_tile.rows < 1 || g_mask_tile.rows > 256 || (g_mask_tile.rows & (g_mask_tile.rows - 1)) != 0 || g_mask_tile.words < 2 ||
      g_mask_tile.words > 64 || (g_mask_tile.words & (g_mask_tile.words - 1)) != 0) {
    std::fprintf(stderr, "transformer_block: --mask-tile %ldx%ld: valid: rows a power of two in [1, 256], words one in [2, 64] (e.g. 16x16)\n",
                 static_cast<long>(g_mask_tile.rows), static_cast<long>(g_mask_tile.words));
    return 2;
  }
  // (8 more: 16 warps cannot hold the 128 x 256 accumulator at 65536 / 512 registers, ptxas C7602)
  if (g_mask_warps.warps != 0 && g_mask_warps.warps != 4) {
    std::fprintf(stderr, "transformer_block: --mask-warps %ld: valid: 4 (a warpgroup beside the GEMM's 8 warps)\n",
                 static_cast<long>(g_mask_warps.warps));
    return 2;
  }
  for (int64_t S : seqs)
    if (S < 128 || S > 16384 || S % 128 != 0) {
      std::fprintf(stderr, "transformer_block: --seq %ld: valid: multiples of 128 from 128 to 16384\n", static_cast<long>(S));
      return 2;
    }
  const auto shape_of = [&](int64_t S) {
    Shape shape{S, 16384 / S};
    if (mha) shape.kv_heads = shape.heads;
    shape.causal = !full;
    return shape;
  };
  if (check) {
    try {
      for (int64_t S : seqs)
        if (const int rc = check_only(shape_of(S))) return rc;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "transformer_block --check-only: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  auto& driver = runtime::Driver::get();
  if (!driver.available()) {
    std::fprintf(stderr, "bench/transformer_block needs a GPU: %s\n", driver.unavailable_reason().c_str());
    return 2;
  }
  try {
    std::printf("GPU: %s\n", driver.props(0).name.c_str());
    for (int64_t S : seqs)
      if (const int rc = hide ? hiding(shape_of(S), reps) : run(shape_of(S), reps)) return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transformer_block: %s\n", e.what());
    return 1;
  }
  return 0;
}
