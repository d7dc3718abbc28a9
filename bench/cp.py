#!/usr/bin/env python3
"""bench/cp.py: tilejit's context parallelism next to PyTorch's, in one run, one table.

Usage (on a machine with W >= 2 GPUs):
    NCCL_NVLS_ENABLE=0 python3 bench/cp.py BIN [--world W ...] [--reps R] [--rounds N]
BIN is attention_bench. For each W (default: 2 and every GPU) and each configuration (causal, D128
bf16: 16 heads at 8K and 16K tokens per GPU; the Long-Context benchmark's 64 / 8 heads at 8K,
tilejit only, PyTorch's SDPA taking no GQA there), the rounds alternate `BIN --cp` (ring,
allgather, ulysses) and `torchrun bench/cp_torch.py` (torch.distributed.tensor.experimental.
context_parallel, cuDNN SDPA), so drift over the run favours neither. Per-GPU TFLOP/s with the
benchmark's formula (4 x allowed area x Hq x D, backward 2.5x, slowest rank); the table gives each
mode's best round and its ratio to PyTorch's best round.
"""
import argparse
import os
import re
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-2000:] + out.stderr[-4000:])
        raise SystemExit(f"{' '.join(cmd)} failed with {out.returncode}")
    return out.stdout.splitlines()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--world", type=int, action="append")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    gpus = torch.cuda.device_count()
    worlds = a.world or sorted({2, gpus})
    configs = [(8192, 16, 16), (16384, 16, 16), (8192, 64, 8)]
    rows = []
    for W in worlds:
        for tokens, hq, hkv in configs:
            best = {}
            for _ in range(a.rounds):
                for line in run([a.bin, "--cp", "--world", str(W), "--tokens", str(tokens), "--heads", str(hq), "--kv-heads", str(hkv),
                                 "--causal", "1", "--reps", str(a.reps)]):
                    if line.startswith("CP ") and "mask=causal " in line:
                        f = fields(line)
                        key = f["mode"]
                        cur = (float(f["fwd_tflops_per_gpu"]), float(f["bwd_tflops_per_gpu"]), float(f["fwd_eff"]), float(f["bwd_eff"]))
                        best[key] = max(best.get(key, cur), cur)
                if hq == hkv:
                    for line in run(["torchrun", "--nproc_per_node", str(W), os.path.join(HERE, "cp_torch.py"), "--tokens", str(tokens),
                                     "--heads", str(hq), "--causal", "1", "--reps", str(a.reps)]):
                        if line.startswith("TORCH_CP "):
                            f = fields(line)
                            cur = (float(f["fwd_tflops_per_gpu"]), float(f["bwd_tflops_per_gpu"]), 0.0, 0.0)
                            best["torch"] = max(best.get("torch", cur), cur)
            t = best.get("torch")
            for mode in ("ring", "allgather", "ulysses"):
                fw, bw, fe, be = best[mode]
                ratio = f"{fw / t[0]:.2f} / {bw / t[1]:.2f}" if t else "-"
                rows.append(f"| {W} | {tokens // 1024}K | {hq} / {hkv} | {mode} | {fw:.0f} / {bw:.0f} | {fe:.2f} / {be:.2f} | {ratio} |")
            if t:
                rows.append(f"| {W} | {tokens // 1024}K | {hq} / {hkv} | PyTorch context_parallel | {t[0]:.0f} / {t[1]:.0f} | - | 1 |")
    print("| W | tokens per GPU | Hq / Hkv | mode | fwd / bwd TFLOP/s per GPU | efficiency fwd / bwd | vs PyTorch fwd / bwd |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
