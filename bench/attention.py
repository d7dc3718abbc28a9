"""bench/attention.py: tilejit attention (through its C++ API) next to PyTorch SDPA, one table.

Usage (on the GPU machine):
    python3 bench/attention.py BIN [--quick] [--rounds N] [--check-only | --no-check | --dropout-only] [--out DIR] [--dtype f16] [--gqa G]
BIN is the attention_bench binary (build/bench/attention_bench, or .gpu/bench/attention_bench).

1. Cross-check (unless --no-check): ~20 cases (GQA/MQA, ragged S_q != S_k, causal, custom scales,
   both layouts, varlen when the kernels have it) are written to DIR/check as raw binaries; BIN
   --check runs forward + backward through tilejit::attention and writes O, LSE, dQ, dK, dV; they
   are compared with PyTorch's float32 math (SDPA's MATH backend; rows that see no key, which it
   turns into NaN, by the same math by hand). Pass: relative error < 1e-2 for every output.
2. Timing (unless --check-only): bf16 (--dtype f16), B*S = 16k tokens, H*D = 2048, D in {64, 128},
   K/V heads H / G with --gqa G (SDPA's enable_gqa),
   S in {1k .. 16k}, causal and not (--quick: 5 configs); tilejit from BIN, PyTorch SDPA with the
   FLASH_ATTENTION and CUDNN_ATTENTION backends, forward and backward (FLOPs 4*B*H*S^2*D, halved
   for causal, x2.5 for backward), CUDA events around calls queued back to back (--timing synced: one
   call between events, then a sync, which counts each side's host work), median of repeats;
   --rounds N (default 3) alternated rounds of both sides, each point their median, each ratio the
   median of the rounds' own ratios with their range (single runs move several %). Prints one table, writes DIR/attention.png and
   DIR/attention_table.md (the snippet for BENCHMARKS.md).
3. Dropout (when BIN has it; also --dropout-only): the check runs cases with dropout_p; BIN writes the
   keep-mask its forward used and the reference applies that explicit mask (softmax * mask / keep
   probability, PyTorch float32 math, autograd for the gradients). Timing: BIN --dropout (D128 S4k
   bf16, p = 0.1, full and causal: forward and backward with dropout vs without) next to SDPA
   flash's own dropout slowdown (dropout_p = 0.1 vs 0) in the same run.
"""
import argparse
import datetime
import itertools
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from timing import queued_ms, synced_ms  # bench/timing.py (the script's own folder is on sys.path)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

TOKENS, HIDDEN = 16384, 2048
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


# ---------------------------------------------------------------------------------------------
# Cross-check against PyTorch float32 math

def check_cases(caps):
    # name, dtype, B, Hq, Hkv, Sq, Sk, D, causal, scale (None: 1/sqrt(D)), layout
    dense = [
        ("mha_full", "bf16", 2, 4, 4, 128, 128, 64, False, None, "bshd"),
        ("mha_causal", "bf16", 2, 4, 4, 257, 257, 128, True, None, "bshd"),
        ("gqa_ragged", "bf16", 2, 8, 2, 100, 1000, 64, False, None, "bshd"),
        ("gqa_causal_sq_lt_sk", "bf16", 1, 8, 2, 100, 1000, 128, True, None, "bhsd"),
        ("gqa_causal_sq_gt_sk", "f16", 2, 6, 2, 257, 17, 64, True, None, "bshd"),
        ("mqa", "f16", 3, 8, 1, 17, 257, 128, False, 0.2, "bshd"),
        ("mqa_causal", "bf16", 1, 4, 1, 1000, 100, 64, True, None, "bhsd"),
        ("single_row", "bf16", 1, 2, 2, 1, 1000, 64, False, None, "bshd"),
        ("single_row_causal", "f16", 1, 2, 1, 1, 17, 128, True, None, "bshd"),
        ("single_key", "bf16", 2, 2, 2, 100, 1, 64, False, None, "bhsd"),
        ("d256", "bf16", 1, 2, 2, 257, 257, 256, False, None, "bshd"),
        ("d256_causal_gqa", "f16", 1, 4, 2, 100, 300, 256, True, 0.05, "bhsd"),
        ("f16_scale", "f16", 2, 4, 4, 1000, 1000, 64, False, 0.3, "bshd"),
        ("bf16_long", "bf16", 1, 2, 2, 2048, 2048, 128, True, None, "bshd"),
        ("bhsd_full", "f16", 2, 4, 2, 333, 129, 128, False, None, "bhsd"),
        ("odd_all", "bf16", 3, 3, 1, 17, 100, 64, True, 0.11, "bshd"),
        ("d128_big_heads", "bf16", 1, 16, 4, 256, 512, 128, True, None, "bshd"),
    ]
    cases = [dict(name=n, dtype=t, B=b, Hq=hq, Hkv=hk, Sq=sq, Sk=sk, D=d, causal=c, scale=s, layout=l, varlen=False)
             for (n, t, b, hq, hk, sq, sk, d, c, s, l) in dense]
    if caps.get("dropout"):
        # name, dtype, B, Hq, Hkv, Sq, Sk, D, causal, layout, dropout_p, seed, offset
        for n, t, b, hq, hk, sq, sk, d, causal, l, p, seed, off in [
            ("dropout_full", "bf16", 2, 4, 4, 128, 200, 64, False, "bshd", 0.1, 1234, 0),
            ("dropout_causal_gqa", "f16", 1, 8, 2, 257, 300, 128, True, "bhsd", 0.5, 2**40 + 7, 2**33 + 5),
            ("dropout_mqa_sq_gt_sk", "bf16", 2, 4, 1, 300, 100, 128, True, "bshd", 0.1, 99, 12345),
            ("dropout_d256", "bf16", 1, 2, 2, 100, 257, 256, False, "bshd", 0.3, 5, 6),
        ]:
            cases.append(dict(name=n, dtype=t, B=b, Hq=hq, Hkv=hk, Sq=sq, Sk=sk, D=d, causal=causal, scale=None, layout=l,
                              varlen=False, dropout=(p, seed, off)))
    if caps.get("varlen_fwd"):
        for n, t, hq, hk, d, causal, lq, lk, drop in [
            ("varlen_full", "bf16", 4, 2, 64, False, [17, 100, 1, 257], [100, 17, 64, 257], None),
            ("varlen_causal", "f16", 4, 4, 128, True, [100, 257, 33], [300, 100, 33], None),
            ("varlen_mqa", "bf16", 8, 1, 64, True, [1, 1000], [17, 1000], None),
            ("varlen_empty_gqa", "bf16", 4, 2, 64, True, [0, 70, 5, 33], [20, 0, 130, 33], None),
            ("varlen_dropout", "bf16", 4, 2, 64, True, [0, 70, 5, 33], [20, 9, 130, 33], (0.2, 77, 3)),
        ]:
            if drop and not caps.get("dropout"):
                continue
            cases.append(dict(name=n, dtype=t, Hq=hq, Hkv=hk, D=d, causal=causal, scale=None, layout="bshd", varlen=True,
                              lens_q=lq, lens_k=lk, dropout=drop))
    return cases


def dump(t, path):
    t = t.contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    t.numpy().tofile(path)


def load(path, dtype, shape):
    raw = torch.from_file(path, size=math.prod(shape), dtype=dtype if dtype == torch.float32 else torch.int16)
    return (raw if dtype == torch.float32 else raw.view(dtype)).reshape(shape)


def reference(q, k, v, do, causal, scale, keep=None, keep_p=1.0):
    """float32 [B, H, S, D] inputs (k, v with Hkv heads). Returns O, LSE, dQ, dK, dV (float32).
    keep: an explicit dropout keep-mask [B, Hq, Sq, Sk] (bool): O = (softmax(S) * keep / keep_p) V,
    LSE that of the undropped softmax (FlashAttention's convention)."""
    q, k, v, do = (x.float().cuda() for x in (q, k, v, do))
    Sq, Sk, Hq, Hkv = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
    if Sq == 0 or Sk == 0:  # an empty varlen sequence: no query or no key; O = 0, LSE = -inf, zero gradients
        lse = torch.full((q.shape[0], Hq, Sq), float("-inf"), device="cuda")
        return torch.zeros_like(q), lse, torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    mask = None
    if causal:  # bottom-right: query i sees keys j <= i + Sk - Sq
        i = torch.arange(Sq, device="cuda")[:, None]
        j = torch.arange(Sk, device="cuda")[None, :]
        mask = j <= i + (Sk - Sq)
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    s = (q @ kk.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.detach(), -1)
    if keep is not None:  # dropout with the kernel's own mask, by hand (rows with no key: 0)
        seen = mask.any(-1)[:, None] if mask is not None else torch.ones(1, dtype=torch.bool, device="cuda")
        p = torch.softmax(torch.where(seen, s, 0.0), -1) * seen
        o = (p * keep.cuda() / keep_p) @ vv
    elif mask is None or bool(mask.any(-1).all()):
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    else:  # rows with no key: O = 0 and zero gradients (SDPA math would give NaN)
        seen = mask.any(-1)[:, None]
        p = torch.softmax(torch.where(seen, s, 0.0), -1) * seen
        o = p @ vv
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return o.detach(), lse, dq, dk, dv


def rel(x, ref):
    x, ref = x.float().cuda(), ref.float().cuda()
    den = ref.norm().item()
    return (x - ref).norm().item() / (den if den > 0 else 1.0)


def lse_err(x, ref):
    x, ref = x.cuda(), ref.cuda()
    inf = torch.isinf(ref)
    if not torch.equal(torch.isinf(x), inf) or bool((x[inf] != ref[inf]).any()):
        return float("inf")
    return (x[~inf] - ref[~inf]).abs().max().item() if bool((~inf).any()) else 0.0


def run_check(bin_path, out_dir, caps):
    d = os.path.join(out_dir, "check")
    os.makedirs(d, exist_ok=True)
    cases = check_cases(caps)
    lines = []
    for idx, c in enumerate(cases):
        g = torch.Generator().manual_seed(1000 + idx)
        dt = DTYPES[c["dtype"]]
        base = os.path.join(d, c["name"])
        if c["varlen"]:
            tq, tk = sum(c["lens_q"]), sum(c["lens_k"])
            c["tensors"] = [torch.randn(n, h, c["D"], generator=g).to(dt) for n, h in
                            ((tq, c["Hq"]), (tk, c["Hkv"]), (tk, c["Hkv"]), (tq, c["Hq"]))]
            cu_q = torch.tensor([0, *itertools.accumulate(c["lens_q"])], dtype=torch.int32)
            cu_k = torch.tensor([0, *itertools.accumulate(c["lens_k"])], dtype=torch.int32)
            c["cu"] = (cu_q, cu_k)
            cu_q.numpy().tofile(base + ".cu_q.bin")
            cu_k.numpy().tofile(base + ".cu_k.bin")
            extra = (f"varlen=1 nseq={len(c['lens_q'])} total_q={tq} total_k={tk} max_q={max(c['lens_q'])} "
                     f"max_k={max(c['lens_k'])}")
        else:
            # logical [B, S, H, D] tensors, stored in the case's layout
            c["tensors"] = [torch.randn(c["B"], s, h, c["D"], generator=g).to(dt) for s, h in
                            ((c["Sq"], c["Hq"]), (c["Sk"], c["Hkv"]), (c["Sk"], c["Hkv"]), (c["Sq"], c["Hq"]))]
            extra = f"B={c['B']} Sq={c['Sq']} Sk={c['Sk']}"
        for t, suffix in zip(c["tensors"], ("q", "k", "v", "do")):
            dump(t.transpose(1, 2) if c["layout"] == "bhsd" else t, f"{base}.{suffix}.bin")
        scale = f" scale={c['scale']!r}" if c["scale"] is not None else ""
        if c.get("dropout"):
            p, seed, off = c["dropout"]
            scale += f" dropout_p={p!r} seed={seed} offset={off}"
        lines.append(f"name={c['name']} dtype={c['dtype']} Hq={c['Hq']} Hkv={c['Hkv']} D={c['D']} "
                     f"causal={int(c['causal'])} layout={c['layout']} {extra}{scale}")
    with open(os.path.join(d, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([bin_path, "--check", d], capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    ran = {}
    for line in out.stdout.splitlines():
        if line.startswith("ran "):
            parts = line.split()
            ran[parts[1]] = "forward only" not in line
        elif line.startswith("FAILED"):
            print(line)
    print(f"\ncross-check against PyTorch float32 math ({len(cases)} cases, pass: rel. error < 1e-2)")
    print(f"{'case':<22} {'shape':<44} {'O':>9} {'LSE abs':>9} {'dQ':>9} {'dK':>9} {'dV':>9}  ok")
    n_ok, worst = 0, [0.0] * 5
    for c in cases:
        name, base = c["name"], os.path.join(d, c["name"])
        if name not in ran:
            print(f"{name:<22} did not run")
            continue
        dt = DTYPES[c["dtype"]]
        scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(c["D"])
        q, k, v, do = c["tensors"]
        mask = None  # dropout: the forward's keep-mask, u8 [B * Hq, Sq, Sk] (1 = kept; 0xFF: not visited)
        if c.get("dropout"):
            p = c["dropout"][0]
            keep_p = round((1 - p) * 256) / 256  # the kernels' 8-bit threshold
            if c["varlen"]:
                nb, mq, mk = len(c["lens_q"]), max(c["lens_q"]), max(c["lens_k"])
            else:
                nb, mq, mk = c["B"], c["Sq"], c["Sk"]
            mask = torch.from_file(base + ".mask.bin", size=nb * c["Hq"] * mq * mk, dtype=torch.uint8)
            mask = (mask == 1).reshape(nb, c["Hq"], mq, mk)
        drop = lambda b, sq, sk: {} if mask is None else dict(keep=mask[b:b + 1, :, :sq, :sk], keep_p=keep_p)
        if c["varlen"]:
            tq, tk, H = q.shape[0], k.shape[0], c["Hq"]
            o_t = load(base + ".o.bin", dt, (tq, H, c["D"]))
            lse_t = load(base + ".lse.bin", torch.float32, (H, tq))
            grads = [load(f"{base}.{n}.bin", dt, s) for n, s in (("dq", q.shape), ("dk", k.shape), ("dv", v.shape))] \
                if ran[name] else None
            refs = [[], [], [], [], []]
            cu_q, cu_k = c["cu"]
            for i in range(len(c["lens_q"])):
                a, b, e, f_ = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
                r = reference(*(x[None].transpose(1, 2) for x in (q[a:b], k[e:f_], v[e:f_], do[a:b])), c["causal"], scale,
                              **drop(i, b - a, f_ - e))
                refs[0].append(r[0][0].transpose(0, 1))
                refs[1].append(r[1][0])
                refs[2].append(r[2][0].transpose(0, 1))
                refs[3].append(r[3][0].transpose(0, 1))
                refs[4].append(r[4][0].transpose(0, 1))
            ref = [torch.cat(refs[0]), torch.cat(refs[1], 1), torch.cat(refs[2]), torch.cat(refs[3]), torch.cat(refs[4])]
            got = [o_t, lse_t] + (grads or [None] * 3)
            shape = f"varlen {c['lens_q']}x{c['lens_k']} H{c['Hq']}/{c['Hkv']} D{c['D']}"
        else:
            B, Sq, Sk, D = c["B"], c["Sq"], c["Sk"], c["D"]
            phys = (lambda s, h: (B, h, s, D)) if c["layout"] == "bhsd" else (lambda s, h: (B, s, h, D))
            to_bhsd = (lambda t: t) if c["layout"] == "bhsd" else (lambda t: t.transpose(1, 2))
            got = [to_bhsd(load(base + ".o.bin", dt, phys(Sq, c["Hq"]))), load(base + ".lse.bin", torch.float32, (B, c["Hq"], Sq))]
            if ran[name]:
                got += [to_bhsd(load(f"{base}.{n}.bin", dt, phys(s, h)))
                        for n, s, h in (("dq", Sq, c["Hq"]), ("dk", Sk, c["Hkv"]), ("dv", Sk, c["Hkv"]))]
            else:
                got += [None] * 3
            ref = reference(*(x.transpose(1, 2) for x in (q, k, v, do)), c["causal"], scale,
                            **({} if mask is None else dict(keep=mask, keep_p=keep_p)))
            shape = f"B{B} H{c['Hq']}/{c['Hkv']} S{Sq}x{Sk} D{D} {c['layout']}"
        errs = [rel(got[0], ref[0]), lse_err(got[1], ref[1])] + [rel(g, r) if g is not None else float("nan")
                                                                 for g, r in zip(got[2:], ref[2:])]
        nan_out = any(bool(torch.isnan(g.float()).any()) for g in got if g is not None)
        ok = not nan_out and all(e < 1e-2 for e in errs if not math.isnan(e))
        n_ok += ok
        worst = [max(w, e) if not math.isnan(e) else w for w, e in zip(worst, errs)]
        tag = f"{c['dtype']} {'causal' if c['causal'] else 'full'}" + (f" p={c['dropout'][0]}" if c.get("dropout") else "")
        print(f"{name:<22} {shape + ' ' + tag:<44} " + " ".join(f"{e:9.2e}" for e in errs) + f"  {'ok' if ok else 'FAIL'}"
              + (" (NaN in output)" if nan_out else ""))
    print(f"cross-check: {n_ok}/{len(cases)} ok; worst O {worst[0]:.2e} LSE {worst[1]:.2e} dQ {worst[2]:.2e} "
          f"dK {worst[3]:.2e} dV {worst[4]:.2e}")
    return n_ok == len(cases)


# ---------------------------------------------------------------------------------------------
# Timing

def configs(quick):
    if quick:
        return [(1024, 128, False), (4096, 128, False), (4096, 128, True), (4096, 64, False), (16384, 128, True)]
    return [(s, d, c) for d in (64, 128) for c in (False, True) for s in (1024, 2048, 4096, 8192, 16384)]


def fwd_flops(S, D, causal):
    B, H = TOKENS // S, HIDDEN // D
    return 4.0 * B * H * S * S * D / (2 if causal else 1)


TIMING = {"queued": queued_ms, "synced": synced_ms}
timing = "queued"


def torch_tflops(backend, S, D, causal, dtype="bf16", gqa=1):
    B, H = TOKENS // S, HIDDEN // D
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    # [B, S, H, D] memory seen as [B, H, S, D]: the layout frameworks (and the tilejit bench) use;
    # gqa > 1: K and V with H / gqa heads (SDPA's enable_gqa)
    q = torch.randn(B, S, H, D, device="cuda", dtype=tdt).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(B, S, H // gqa, D, device="cuda", dtype=tdt).transpose(1, 2).requires_grad_() for _ in range(2))
    do = torch.randn(B, S, H, D, device="cuda", dtype=tdt).transpose(1, 2)
    extra = {"enable_gqa": True} if gqa > 1 else {}
    try:
        with sdpa_kernel(backend):
            f_ms = TIMING[timing](lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)
            b_ms = TIMING[timing](lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    except RuntimeError as e:
        print(f"  {backend.name} S={S} D={D} causal={causal}: {str(e).splitlines()[0]}", file=sys.stderr)
        return float("nan"), float("nan")
    f = fwd_flops(S, D, causal)
    return f / (f_ms * 1e-3) / 1e12, 2.5 * f / (b_ms * 1e-3) / 1e12


def run_ours(bin_path, quick, dtype, gqa):
    """One run of BIN over the grid: {(S, D, causal): (fwd TFLOP/s, bwd TFLOP/s)}."""
    cmd = [bin_path] + (["--quick"] if quick else []) + ["--dtype", dtype, "--gqa", str(gqa)] + (["--synced"] if timing == "synced" else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    ours = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            kv = dict(f.split("=") for f in line.split()[1:])
            ours[(int(kv["S"]), int(kv["D"]), kv["causal"] == "1")] = (float(kv["fwd_tflops"]), float(kv["bwd_tflops"]))
    if out.returncode != 0:
        print(f"{bin_path} exited with {out.returncode}", file=sys.stderr)
    return ours


def median(xs):
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run_bench(bin_path, out_dir, quick, dtype="bf16", gqa=1, rounds=3):
    # Rounds alternate which side runs first (tilejit's process, then SDPA's backends, or the
    # reverse): the GPU's clock and the processes' memory placement move single timings several %
    # between runs, so each point is the median of its rounds and each ratio the median of the
    # rounds' own ratios (both sides timed minutes apart at most).
    nan2 = (float("nan"), float("nan"))
    per_round = []  # [(ours, {(S, D, causal): (flash, cudnn)})]
    for r in range(rounds):
        theirs = {}
        if r % 2 == 0:
            ours = run_ours(bin_path, quick, dtype, gqa)
        for S, D, causal in configs(quick):
            theirs[(S, D, causal)] = (torch_tflops(SDPBackend.FLASH_ATTENTION, S, D, causal, dtype, gqa),
                                      torch_tflops(SDPBackend.CUDNN_ATTENTION, S, D, causal, dtype, gqa))
        if r % 2 == 1:
            ours = run_ours(bin_path, quick, dtype, gqa)
        per_round.append((ours, theirs))
        print(f"round {r + 1} of {rounds} done", file=sys.stderr)
    rows = []
    for key in configs(quick):
        S, D, causal = key
        tjs = [o.get(key, nan2) for o, _ in per_round]
        fls = [t[key][0] for _, t in per_round]
        cus = [t[key][1] for _, t in per_round]
        med = lambda xs, i: median([x[i] for x in xs])
        ratio = lambda a, b, i: [x[i] / y[i] if y[i] == y[i] and y[i] > 0 else float("nan") for x, y in zip(a, b)]
        rows.append(dict(S=S, D=D, causal=causal, tj=(med(tjs, 0), med(tjs, 1)), fl=(med(fls, 0), med(fls, 1)),
                         cu=(med(cus, 0), med(cus, 1)),
                         vs_fl=(median(ratio(tjs, fls, 0)), median(ratio(tjs, fls, 1))),
                         vs_cu=[ratio(tjs, cus, 0), ratio(tjs, cus, 1)]))
    gpu = torch.cuda.get_device_name()
    # tools/pack_gpu.sh records the commit it packed (the GPU machine's copy has no .git)
    commit_file = os.path.join(os.path.dirname(os.path.abspath(bin_path)), "..", "COMMIT")
    if os.path.exists(commit_file):
        commit = open(commit_file).read().strip()
    else:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
        except OSError:
            commit = "?"
    kv = f", K/V heads H/{gqa} (GQA)" if gqa > 1 else ""
    head = (f"Attention, {dtype}{kv}, B*S = {TOKENS} tokens, H*D = {HIDDEN}; TFLOP/s (fwd 4*B*H*S^2*D, /2 causal; bwd x2.5); "
            f"{gpu}, torch {torch.__version__}, {datetime.date.today()}, commit {commit}")
    md = [head + f"; {timing} timing; median of {rounds} alternated rounds (ratios: the rounds' own ratios, their median and range)", "",
          "| D | S | B x H | mask | tilejit fwd | flash fwd | cuDNN fwd | tilejit bwd | flash bwd | cuDNN bwd "
          "| fwd vs flash | fwd vs cuDNN | bwd vs flash | bwd vs cuDNN |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    v = lambda x: f"{x:.0f}" if x == x else "-"
    f2 = lambda x: f"{x:.2f}" if x == x else "-"

    def spread(xs):
        ok = [x for x in xs if x == x]
        if len(ok) < 2:
            return f2(median(xs))
        return f"{f2(median(xs))} ({min(ok):.2f}-{max(ok):.2f})"

    for row in rows:
        tj, fl, cu = row["tj"], row["fl"], row["cu"]
        md.append(f"| {row['D']} | {row['S']} | {TOKENS // row['S']} x {HIDDEN // row['D']} | {'causal' if row['causal'] else 'full'} "
                  f"| {v(tj[0])} | {v(fl[0])} | {v(cu[0])} | {v(tj[1])} | {v(fl[1])} | {v(cu[1])} | {f2(row['vs_fl'][0])} "
                  f"| {spread(row['vs_cu'][0])} | {f2(row['vs_fl'][1])} | {spread(row['vs_cu'][1])} |")
    print("\n" + "\n".join(md))
    with open(os.path.join(out_dir, "attention_table.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"D{r['D']} S{r['S'] // 1024}k{' c' if r['causal'] else ''}" for r in rows]
        fig, axes = plt.subplots(2, 1, figsize=(max(8, len(rows) * 0.8), 8), sharex=True)
        for ax, i, title in ((axes[0], 0, "forward"), (axes[1], 1, "backward")):
            w = 0.27
            xs = range(len(rows))
            for j, (name, col) in enumerate((("tilejit", "tj"), ("SDPA flash", "fl"), ("SDPA cuDNN", "cu"))):
                ax.bar([x + (j - 1) * w for x in xs], [row[col][i] for row in rows], w, label=name)
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"attention {title}, {dtype}{kv}, {gpu}")
            ax.legend()
        axes[1].set_xticks(list(range(len(rows))))
        axes[1].set_xticklabels(labels, rotation=45, ha="right")
        fig.tight_layout()
        png = os.path.join(out_dir, "attention.png")
        fig.savefig(png, dpi=120)
        print(f"wrote {png} and {os.path.join(out_dir, 'attention_table.md')}")
    except ImportError:
        print("matplotlib not available: no plot", file=sys.stderr)


def run_dropout_bench(bin_path, p=0.1):
    """Fused dropout's cost: tilejit (BIN --dropout) and SDPA flash, dropout_p = p vs 0, D128 S4k bf16."""
    out = subprocess.run([bin_path, "--dropout", str(p)], capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    ours = {}
    for line in out.stdout.splitlines():
        if line.startswith("DROPOUT "):
            kv = dict(f.split("=") for f in line.split()[1:])
            ours[kv["causal"] == "1"] = kv
    S, D = 4096, 128
    B, H = TOKENS // S, HIDDEN // D
    print(f"\nfused dropout p = {p}, bf16 B={B} H={H} S={S} D={D}: time with dropout / without (forward, backward)")
    print(f"{'mask':<7} {'tilejit fwd ms':>15} {'+dropout':>9} {'slowdown':>9} {'bwd ms':>8} {'+dropout':>9} {'slowdown':>9}"
          f" | {'flash fwd ms':>12} {'+dropout':>9} {'slowdown':>9} {'bwd ms':>8} {'+dropout':>9} {'slowdown':>9}")
    for causal in (False, True):
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
        do = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        fl = []
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                for dp in (0.0, p):
                    f_ms = TIMING[timing](lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dp))
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dp)
                    b_ms = TIMING[timing](lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
                    fl += [f_ms, b_ms]
        except RuntimeError as e:
            print(f"  SDPA flash with dropout: {str(e).splitlines()[0]}", file=sys.stderr)
            fl = [float("nan")] * 4
        t = ours.get(causal)
        tj = [float(t[x]) for x in ("fwd_ms", "fwd_dropout_ms", "bwd_ms", "bwd_dropout_ms")] if t else [float("nan")] * 4
        print(f"{'causal' if causal else 'full':<7} {tj[0]:15.3f} {tj[1]:9.3f} {tj[1] / tj[0]:8.3f}x {tj[2]:8.3f} {tj[3]:9.3f} "
              f"{tj[3] / tj[2]:8.3f}x | {fl[0]:12.3f} {fl[2]:9.3f} {fl[2] / fl[0]:8.3f}x {fl[1]:8.3f} {fl[3]:9.3f} "
              f"{fl[3] / fl[1]:8.3f}x")
    if out.returncode != 0:
        print(f"{bin_path} --dropout exited with {out.returncode}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin", help="the attention_bench binary")
    ap.add_argument("--quick", action="store_true", help="5 timing configs instead of 20")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--dropout-only", action="store_true", help="only the dropout slowdown table (no check, no grid)")
    ap.add_argument("--out", default="bench_out", help="directory for the check files, the PNG and the table")
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16", help="the timing grid's dtype")
    ap.add_argument("--gqa", type=int, choices=(1, 2, 4, 8), default=1, help="timing grid: K/V heads = H / GQA")
    ap.add_argument("--rounds", type=int, default=3, help="alternated timing rounds; each point is their median (>= 1)")
    ap.add_argument("--timing", choices=tuple(TIMING), default="queued",
                    help="queued: calls back to back between events (both sides); synced: one call, then a sync (the older tables)")
    args = ap.parse_args()
    global timing
    timing = args.timing
    os.makedirs(args.out, exist_ok=True)
    caps_line = subprocess.run([args.bin, "--capabilities"], capture_output=True, text=True).stdout.split()
    caps = {k: v == "1" for k, v in (f.split("=") for f in caps_line)}
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; tilejit: {' '.join(caps_line)}")
    ok = True
    if args.dropout_only:
        if caps.get("dropout"):
            run_dropout_bench(args.bin)
        sys.exit(0 if caps.get("dropout") else 1)
    if not args.no_check:
        ok = run_check(args.bin, args.out, caps)
    if not args.check_only:
        if args.rounds < 1:
            ap.error(f"--rounds {args.rounds}: give 1 or more rounds")
        run_bench(args.bin, args.out, args.quick, args.dtype, args.gqa, args.rounds)
        if caps.get("dropout"):
            run_dropout_bench(args.bin)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
