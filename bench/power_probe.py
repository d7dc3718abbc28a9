"""The SM clock and power under sustained attention, tilejit beside SDPA's cuDNN, in one process.

    TILEJIT_C_LIBRARY=.gpu/libtilejit_c.so LD_LIBRARY_PATH=.gpu python3 bench/power_probe.py [--seconds 4] [--phases 4]

Each phase queues one implementation's calls (the forward; with --backward also autograd.grad of one
retained forward) back to back for --seconds (batches of 10 calls between
CUDA events) while nvidia-smi samples clocks.sm and power.draw.instant every 100 ms; phases alternate
tilejit, cuDNN, tilejit, ... Per phase: median ms per call, TFLOP/s, median SM clock and power, and
TFLOP/s per (GHz of SM clock): work per clock, the figure the power cap does not move. The H200
caps power at 700 W; a kernel that reaches the cap runs at whatever clock the cap allows, so its
sustained speed is its work per clock times the clock its energy per FLOP buys.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "torch"))
import tilejit_torch as tj  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--backward", action="store_true", help="time the backward (autograd.grad of one forward, retained) too")
    ap.add_argument("--shapes", default="4,4096,16,128,0;4,4096,16,128,1;4,4096,32,64,0",
                    help="B,S,H,D,causal;... (BSHD for tilejit, BHSD views for SDPA)")
    args = ap.parse_args()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw.instant", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    phases = []  # (name, shape, t0, t1, ms list)
    for spec in args.shapes.split(";"):
        b, s, h, d, causal = (int(x) for x in spec.split(","))
        causal = bool(causal)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        do = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        kinds = {"fwd": {"tilejit": lambda: tj.flash_attn_func(q, k, v, causal=causal),
                         "cudnn": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)}}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if args.backward:
                o_tj = tj.flash_attn_func(q, k, v, causal=causal)
                o_cu = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                do_t = do.transpose(1, 2)
                kinds["bwd"] = {"tilejit": lambda: torch.autograd.grad(o_tj, (q, k, v), do, retain_graph=True),
                                "cudnn": lambda: torch.autograd.grad(o_cu, (qt, kt, vt), do_t, retain_graph=True)}
            for kind, fns in kinds.items():
                grad = torch.enable_grad() if kind == "bwd" else torch.no_grad()
                with grad:
                    for f in fns.values():
                        f()
                    torch.cuda.synchronize()
                    a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    for p in range(args.phases):
                        name = ("tilejit", "cudnn")[p % 2]
                        ms = []
                        t0 = time.time()
                        while time.time() - t0 < args.seconds:
                            a.record()
                            for _ in range(10):
                                fns[name]()
                            e.record()
                            e.synchronize()
                            ms.append(a.elapsed_time(e) / 10)
                        # the first second dropped: the clock settles under the power cap
                        phases.append((f"{name} {kind}", spec, t0 + 1.0, time.time(), ms[len(ms) // 4:], flops * (2.5 if kind == "bwd" else 1)))
    smi.terminate()
    samples = []
    for line in smi.stdout.read().splitlines():
        try:
            ts, clk, pw = (x.strip() for x in line.split(","))
            samples.append((datetime.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(clk), float(pw)))
        except ValueError:
            continue
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, tilejit {tj.version()}")
    print("| shape B,S,H,D,causal | impl | ms | TFLOP/s | SM MHz | W | TFLOP/s per GHz |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, spec, t0, t1, ms, flops in phases:
        inside = [(c, w) for t, c, w in samples if t0 <= t <= t1]
        clk = statistics.median(c for c, _ in inside) if inside else float("nan")
        pw = statistics.median(w for _, w in inside) if inside else float("nan")
        m = statistics.median(ms)
        tf = flops / m / 1e9
        print(f"| {spec} | {name} | {m:.4f} | {tf:.0f} | {clk:.0f} | {pw:.0f} | {tf / (clk / 1000):.0f} |")


if __name__ == "__main__":
    main()
