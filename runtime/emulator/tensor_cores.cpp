// The emulator's tensor cores and asynchronous copies (machine.hpp): mma.sync fragments, TMA boxes
// into swizzled shared tiles, mbarrier phases, wgmma from shared-memory descriptors.
#include <bit>

#include "runtime/emulator/machine.hpp"

namespace tilejit::runtime::emu {

void Emulator::hopper_inst(const pir::Inst& in, const Mask& m) {
  const auto arg = [&](size_t k, int t) -> const Val& { return vals(in.args[k])[static_cast<size_t>(t)]; };
  const auto set = [&](size_t k, int t, const Val& v) { vals(in.results[k])[static_cast<size_t>(t)] = v; };
  switch (in.op) {
    case Op::mma_16816: mma(in, m); return;
    case Op::mma_1688_tf32: mma_tf32(in, m); return;
    case Op::smem_addr: each(m, [&](int t) { set(0, t, Val{0, arg(0, t).i}); }); return;  // (the window starts at 0)
    case Op::fence_mbar_init:
    case Op::fence_proxy_async:
    case Op::fence_proxy_async_global:
    case Op::wgmma_fence:
    case Op::wgmma_commit:
      return;  // (asynchronous copies and MMAs complete when issued here, but TMA's global writes)
    case Op::bulk_commit:
      each(m, [&](int t) {
        if (auto it = tma_writes_.find(t); it != tma_writes_.end()) {
          it->second.committed.push_back(std::move(it->second.open));
          it->second.open.clear();
        }
      });
      return;
    case Op::bulk_wait:  // (.read: the shared tile was read at the issue)
      if (in.imm & pir::kBulkWaitRead) return;
      each(m, [&](int t) {
        if (auto it = tma_writes_.find(t); it != tma_writes_.end()) land_tma_writes(it->second, static_cast<size_t>(in.imm & 0xFF), false);
      });
      return;
    case Op::wgmma_wait:
      for (size_t k = 0; k < in.results.size(); ++k) each(m, [&](int t) { set(k, t, arg(k, t)); });
      return;
    case Op::mbar_init:
      each(m, [&](int t) {
        const int64_t count = arg(1, t).i;
        mbarriers_[arg(0, t).i] = Mbarrier{count, count, 0, 0};
      });
      return;
    case Op::mbar_inval: each(m, [&](int t) { mbarriers_.erase(arg(0, t).i); }); return;
    case Op::mbar_expect_tx: each(m, [&](int t) { mbar_update(in, t, arg(0, t).i, 1, arg(1, t).i); }); return;
    case Op::mbar_arrive:
      maybe_yield(m);
      each(m, [&](int t) { mbar_update(in, t, arg(0, t).i, 1, 0); });
      return;
    case Op::mbar_wait:
      if (per_warp_) {
        const int t0 = first_thread(m);
        if (t0 < 0) return;
        const int64_t addr = arg(0, t0).i, parity = arg(1, t0).i & 1;
        yield_turn(t0 / 32);
        wait_until(t0 / 32, in, [&] { return (mbarrier(in, t0, addr).phase & 1) != parity; });
        return;
      }
      each(m, [&](int t) {
        const Mbarrier& b = mbarrier(in, t, arg(0, t).i);
        if ((b.phase & 1) == (arg(1, t).i & 1))
          throw EmulatorUnsupported(fmt::format(
              "tilejit emulator: kernel '{}': thread {} waits on an mbarrier phase that has not completed; in lockstep only "
              "programs whose waits follow their arrivals run (warp-specialised roles need warps that run concurrently)",
              p_.name, t));
      });
      return;
    // Semaphores between programs (ordered adds): programs run one after another here, so a wait
    // passes once earlier programs (or this one's own warps) have signalled enough; a wait only a
    // later program could satisfy is reported (not emulated: programs that run at once)
    case Op::sem_signal:
      each(m, [&](int t) {
        std::byte* q = global(in, t, static_cast<uint64_t>(arg(0, t).i), 4, 4);
        write(DType::i32, q, Val{0, wrap(DType::i32, static_cast<uint64_t>(read(DType::i32, q).i + arg(1, t).i))});
      });
      return;
    case Op::sem_wait: {
      auto reached = [&](int t) { return read(DType::i32, global(in, t, static_cast<uint64_t>(arg(0, t).i), 4, 4)).i >= arg(1, t).i; };
      if (per_warp_) {
        const int t0 = first_thread(m);
        if (t0 < 0) return;
        yield_turn(t0 / 32);
        wait_until(t0 / 32, in, [&] { return reached(t0); });
        return;
      }
      each(m, [&](int t) {
        if (!reached(t))
          throw EmulatorUnsupported(fmt::format("tilejit emulator: kernel '{}': thread {} waits for a semaphore only a later program "
                                                "signals (programs run one after another here)", p_.name, t));
      });
      return;
    }
    case Op::atom_shared:
      each(m, [&](int t) {
        std::byte* q = shared(in, t, arg(0, t).i, 4);
        const Val old = read(DType::u32, q);
        const bool exch = in.imm == pir::kAtomSharedExch;
        write(DType::u32, q, Val{0, exch ? arg(1, t).i : wrap(DType::u32, static_cast<uint64_t>(old.i + arg(1, t).i))});
        set(0, t, old);
      });
      return;
    case Op::tma_load:
    case Op::tma_load_2d:
      maybe_yield(m);
      tma(in, m, Tma::load);
      return;
    case Op::tma_reduce_add: tma(in, m, Tma::reduce_add); return;
    case Op::tma_store: tma(in, m, Tma::store); return;
    case Op::wgmma:
    case Op::wgmma_rs:
      if (per_warp_) wgmma_collective(in, m);
      else wgmma(in, m);
      return;
    default:
      throw EmulatorUnsupported(fmt::format("tilejit emulator: kernel '{}' uses {} (not emulated: cross-program semaphores)",
                                            p_.name, pir::op_name(in.op)));
  }
}

Emulator::Mbarrier& Emulator::mbarrier(const pir::Inst& in, int t, int64_t addr) {
  auto it = mbarriers_.find(addr);
  if (it == mbarriers_.end()) fault(in, t, fmt::format("no mbarrier was initialised at shared address {}", addr));
  return it->second;
}

void Emulator::mbar_update(const pir::Inst& in, int t, int64_t addr, int64_t arrivals, int64_t tx) {
  Mbarrier& b = mbarrier(in, t, addr);
  stalls_ = 0;
  b.pending -= arrivals;
  b.tx += tx;
  if (b.pending < 0) fault(in, t, fmt::format("more arrivals than the mbarrier at {} expects ({})", addr, b.count));
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
  }
}

void Emulator::land_tma_writes(TmaWrites& q, size_t keep, bool open_too) {
  const auto land = [&](const std::vector<TmaWrite>& group) {
    for (const TmaWrite& w : group) {
      Val now = w.value;
      if (w.add) {
        const Val old = read(w.dtype, w.global);
        if (ir::is_float(w.dtype)) now.f = interp::atomic_float_add(w.dtype, old.f, w.value.f);
        else now.i = wrap(w.dtype, static_cast<uint64_t>(old.i + w.value.i));
      }
      write(w.dtype, w.global, now);
    }
  };
  while (q.committed.size() > keep) {
    land(q.committed.front());
    q.committed.erase(q.committed.begin());
  }
  if (open_too) {
    land(q.open);
    q.open.clear();
  }
}

void Emulator::tma(const pir::Inst& in, const Mask& m, Tma mode) {
  const bool reduce = mode != Tma::load;  // (reduce_add and store: shared -> global)
  each(m, [&](int t) {
    const int64_t tag = vals(in.args[1])[static_cast<size_t>(t)].i - kMapTag;
    if (tag < 0 || tag >= static_cast<int64_t>(p_.tensor_maps.size())) fault(in, t, "the tensor-map argument names no map");
    const pir::TensorMapSpec& spec = p_.tensor_maps[static_cast<size_t>(tag)];
    const TensorArg& ta = tensors_.at(static_cast<size_t>(spec.param_index));
    const size_t rank = ta.sizes.size();
    const size_t coords = in.op == Op::tma_load_2d ? 2 : static_cast<size_t>(in.imm);
    if (coords != rank || spec.box.size() != rank) fault(in, t, "a box whose rank is not the tensor's");
    const int64_t es = ir::byte_size(ta.dtype);
    std::vector<int64_t> c(rank);  // innermost first
    for (size_t d = 0; d < rank; ++d) c[d] = vals(in.args[2 + d])[static_cast<size_t>(t)].i;
    const int64_t smem0 = vals(in.args[0])[static_cast<size_t>(t)].i;
    int64_t elems = 1;
    for (int64_t b : spec.box) elems *= b;
    std::vector<int64_t> idx(rank, 0);
    for (int64_t e = 0; e < elems; ++e) {
      bool inside = true;
      int64_t offset = 0;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t g = c[d] + idx[d];
        const size_t td = rank - 1 - d;
        inside = inside && g >= 0 && g < ta.sizes[td];
        offset += g * ta.strides[td];
      }
      std::byte* sm = shared(in, t, swizzle(smem0 + e * es, spec.swizzle_bytes), es);
      if (reduce) {
        if (inside) {  // (lands later: land_tma_writes)
          std::byte* gm = global(in, t, ta.base + static_cast<uint64_t>(offset * es), static_cast<uint64_t>(es), static_cast<uint64_t>(es));
          tma_writes_[t].open.push_back({gm, ta.dtype, read(ta.dtype, sm), mode == Tma::reduce_add});
        }
      } else if (inside) {
        const std::byte* gm = global(in, t, ta.base + static_cast<uint64_t>(offset * es), static_cast<uint64_t>(es), static_cast<uint64_t>(es));
        std::memcpy(sm, gm, static_cast<size_t>(es));
      } else {
        std::memset(sm, 0, static_cast<size_t>(es));
      }
      for (size_t d = 0; d < rank; ++d) {  // next box element, innermost fastest
        if (++idx[d] < spec.box[d]) break;
        idx[d] = 0;
      }
    }
    if (!reduce) mbar_update(in, t, vals(in.args[2 + rank])[static_cast<size_t>(t)].i, 0, -elems * es);
  });
}

void Emulator::wgmma(const pir::Inst& in, const Mask& m) {
  const int64_t n = in.imm & 0xFFFF;
  const auto d = static_cast<DType>((in.imm >> 16) & 0xFF);
  const bool b_mn = (in.imm >> 24) & 1, overwrite = (in.imm >> 25) & 1, a_mn = (in.imm >> 26) & 1;
  const bool rs = in.op == Op::wgmma_rs;
  if (d != DType::f16 && d != DType::bf16)
    throw EmulatorUnsupported(fmt::format("tilejit emulator: wgmma with {} operands", ir::name(d)));
  const int64_t es = 2;
  const size_t first_acc = rs ? 5 : 2;
  const auto elem = [&](const pir::Inst& i, int t, int64_t addr) {
    return read(d, shared(i, t, swizzle(addr, 128), es)).f;
  };
  struct Desc {
    int64_t start, lbo, sbo;
  };
  const auto decode = [](int64_t desc) {
    const auto u = static_cast<uint64_t>(desc);
    return Desc{static_cast<int64_t>((u & 0x3FFF) << 4), static_cast<int64_t>(((u >> 16) & 0x3FFF) << 4),
                static_cast<int64_t>(((u >> 32) & 0x3FFF) << 4)};
  };
  // K-major: row r (M or N), column k; MN-major: the tile's rows are k, 64-element chunks of r
  const auto at = [&](const Desc& ds, bool mn_major, int64_t r, int64_t k) {
    return mn_major ? ds.start + (k / 8) * ds.sbo + (k % 8) * 128 + (r % 64) * es + (r / 64) * ds.lbo
                    : ds.start + (r / 8) * ds.sbo + (r % 8) * 128 + k * es;
  };
  for (int g0 = 0; g0 < n_; g0 += 128) {
    int lead = -1;
    for (int t = g0; t < std::min(g0 + 128, n_) && lead < 0; ++t)
      if (m[static_cast<size_t>(t)] && !exited_[static_cast<size_t>(t)]) lead = t;
    if (lead < 0) continue;
    std::vector<double> A(64 * 16), B(16 * static_cast<size_t>(n));
    const Desc db = decode(vals(in.args[rs ? 4 : 1])[static_cast<size_t>(lead)].i);
    for (int64_t k = 0; k < 16; ++k)
      for (int64_t c = 0; c < n; ++c) B[static_cast<size_t>(k * n + c)] = elem(in, lead, at(db, b_mn, c, k));
    if (rs) {
      for (int l = 0; l < 128 && g0 + l < n_; ++l) {
        const int t = g0 + l, w = l / 32, g = (l % 32) / 4, q = l % 4;
        for (int k = 0; k < 2; ++k) {
          const auto half = [&](size_t arg_index) {
            Val v;
            element::from_bits(d, (static_cast<uint64_t>(vals(in.args[arg_index])[static_cast<size_t>(t)].i) >> (16 * k)) & 0xFFFFu,
                               v.f, v.i);
            return v.f;
          };
          const int r0 = 16 * w + g;
          A[static_cast<size_t>(r0 * 16 + 2 * q + k)] = half(0);
          A[static_cast<size_t>((r0 + 8) * 16 + 2 * q + k)] = half(1);
          A[static_cast<size_t>(r0 * 16 + 2 * q + 8 + k)] = half(2);
          A[static_cast<size_t>((r0 + 8) * 16 + 2 * q + 8 + k)] = half(3);
        }
      }
    } else {
      const Desc da = decode(vals(in.args[0])[static_cast<size_t>(lead)].i);
      for (int64_t r = 0; r < 64; ++r)
        for (int64_t k = 0; k < 16; ++k) A[static_cast<size_t>(r * 16 + k)] = elem(in, lead, at(da, a_mn, r, k));
    }
    for (int l = 0; l < 128 && g0 + l < n_; ++l) {
      const int t = g0 + l, w = l / 32, lane = l % 32;
      for (int64_t j = 0; j < n / 2; ++j) {
        const int64_t row = 16 * w + lane / 4 + 8 * ((j / 2) % 2), col = 8 * (j / 4) + 2 * (lane % 4) + (j % 2);
        double s = overwrite ? 0.0 : vals(in.args[first_acc + static_cast<size_t>(j)])[static_cast<size_t>(t)].f;
        for (int64_t k = 0; k < 16; ++k) s += A[static_cast<size_t>(row * 16 + k)] * B[static_cast<size_t>(k * n + col)];
        vals(in.results[static_cast<size_t>(j)])[static_cast<size_t>(t)] = Val{static_cast<double>(static_cast<float>(s)), 0};
      }
    }
  }
}

void Emulator::warp_mma(const pir::Inst& in, const Mask& m, int k,
                        const std::function<void(int t, int g, int q, MmaTile& A, MmaTile& B)>& load) {
  for (int w0 = 0; w0 < n_; w0 += 32) {
    bool any = false;
    for (int l = 0; l < 32; ++l) any = any || (m[static_cast<size_t>(w0 + l)] && !exited_[static_cast<size_t>(w0 + l)]);
    if (!any) continue;
    MmaTile A{}, B{};
    double C[16][8];
    for (int l = 0; l < 32; ++l) {
      const int t = w0 + l, g = l / 4, q = l % 4;
      load(t, g, q, A, B);
      C[g][2 * q] = vals(in.args[6])[static_cast<size_t>(t)].f;
      C[g][2 * q + 1] = vals(in.args[7])[static_cast<size_t>(t)].f;
      C[g + 8][2 * q] = vals(in.args[8])[static_cast<size_t>(t)].f;
      C[g + 8][2 * q + 1] = vals(in.args[9])[static_cast<size_t>(t)].f;
    }
    for (int l = 0; l < 32; ++l) {
      const int t = w0 + l, g = l / 4, q = l % 4;
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
      for (size_t r = 0; r < 4; ++r) {
        double s = C[rows[r]][cols[r]];
        for (int j = 0; j < k; ++j)
          s += A[static_cast<size_t>(rows[r])][static_cast<size_t>(j)] * B[static_cast<size_t>(j)][static_cast<size_t>(cols[r])];
        vals(in.results[r])[static_cast<size_t>(t)] = Val{static_cast<double>(static_cast<float>(s)), 0};
      }
    }
  }
}

void Emulator::mma(const pir::Inst& in, const Mask& m) {
  const auto d = static_cast<DType>(in.imm);
  if (d != DType::f16 && d != DType::bf16)
    throw EmulatorUnsupported(fmt::format("tilejit emulator: mma_16816 with {} operands", ir::name(d)));
  const auto half = [&](int64_t word, int k) {
    Val v;
    element::from_bits(d, (static_cast<uint64_t>(word) >> (16 * k)) & 0xFFFFu, v.f, v.i);
    return v.f;
  };
  warp_mma(in, m, 16, [&](int t, int g, int q, MmaTile& A, MmaTile& B) {
    const auto a = [&](size_t k) { return vals(in.args[k])[static_cast<size_t>(t)].i; };
    const auto gi = static_cast<size_t>(g), qi = static_cast<size_t>(q);
    for (size_t k = 0; k < 2; ++k) {
      A[gi][2 * qi + k] = half(a(0), static_cast<int>(k));
      A[gi + 8][2 * qi + k] = half(a(1), static_cast<int>(k));
      A[gi][2 * qi + 8 + k] = half(a(2), static_cast<int>(k));
      A[gi + 8][2 * qi + 8 + k] = half(a(3), static_cast<int>(k));
      B[2 * qi + k][gi] = half(a(4), static_cast<int>(k));
      B[2 * qi + 8 + k][gi] = half(a(5), static_cast<int>(k));
    }
  });
}

void Emulator::mma_tf32(const pir::Inst& in, const Mask& m) {
  const auto tf32 = [](int64_t word) {
    return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(word) & 0xffffe000u));
  };
  warp_mma(in, m, 8, [&](int t, int g, int q, MmaTile& A, MmaTile& B) {
    const auto a = [&](size_t k) { return tf32(vals(in.args[k])[static_cast<size_t>(t)].i); };
    const auto gi = static_cast<size_t>(g), qi = static_cast<size_t>(q);
    A[gi][qi] = a(0);
    A[gi + 8][qi] = a(1);
    A[gi][qi + 4] = a(2);
    A[gi + 8][qi + 4] = a(3);
    B[qi][gi] = a(4);
    B[qi + 4][gi] = a(5);
  });
}

}  // namespace tilejit::runtime::emu
