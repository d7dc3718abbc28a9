"""How the timing method moves tilejit's and SDPA's attention figures, in one process.

    TILEJIT_C_LIBRARY=.gpu/libtilejit_c.so LD_LIBRARY_PATH=.gpu python3 bench/timing_methods.py [--rounds N]

bench/attention.py (and attention_bench) time one call between two CUDA events with a synchronisation
after each: the GPU idles while the host prepares the next call, and the host's own work inside the
call (argument checks, planning, the launch) lands between the events. A training step queues its
kernels. This script times the same calls both ways, alternated: "synced" (one call between events,
sync, median) and "queued" (CALLS calls back to back between events, divided, median), for tilejit
(through tilejit_torch) and SDPA's cuDNN and flash backends, forward and forward + backward.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "torch"))
import tilejit_torch as tj  # noqa: E402
from timing import queued_ms, synced_ms  # noqa: E402  (bench/timing.py)

TOKENS, HIDDEN = 16384, 2048


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"tilejit {tj.version()}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for d, s, causal in [(128, 4096, False), (128, 4096, True), (128, 1024, False), (64, 4096, False), (64, 4096, True)]:
        b, h = TOKENS // s, HIDDEN // d
        q, k, v, g = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qt, kt, vt, gt = (x.transpose(1, 2).contiguous() for x in (q, k, v, g))
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        qtg, ktg, vtg = (x.clone().requires_grad_() for x in (qt, kt, vt))

        def tj_fwd():
            with torch.no_grad():
                tj.flash_attn_func(q, k, v, causal=causal)

        def sdpa(backend):
            def fwd():
                with torch.no_grad(), sdpa_kernel(backend):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            def both():
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=causal).backward(gt)
            return fwd, both

        def tj_both():
            tj.flash_attn_func(qg, kg, vg, causal=causal).backward(g)

        cudnn_fwd, cudnn_both = sdpa(SDPBackend.CUDNN_ATTENTION)
        flash_fwd, flash_both = sdpa(SDPBackend.FLASH_ATTENTION)
        fns = {"tilejit fwd": tj_fwd, "cudnn fwd": cudnn_fwd, "flash fwd": flash_fwd,
               "tilejit fwd+bwd": tj_both, "cudnn fwd+bwd": cudnn_both, "flash fwd+bwd": flash_both}
        for f in fns.values():
            f()
        res = {(n, m): [] for n in fns for m in ("synced", "queued")}
        for r in range(args.rounds):
            names = list(fns) if r % 2 == 0 else list(reversed(fns))
            for n in names:
                res[(n, "synced")].append(synced_ms(fns[n]))
                res[(n, "queued")].append(queued_ms(fns[n], settle_ms=0))  # (unsettled: the host-time study)
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        print(f"D={d} S={s} B={b} H={h} causal={int(causal)}")
        for n in fns:
            f = flops * (3.5 if "bwd" in n else 1.0)
            sy, qu = statistics.median(res[(n, "synced")]), statistics.median(res[(n, "queued")])
            print(f"  {n:16s} synced {sy:.4f} ms {f / sy / 1e9:6.1f} TF   queued {qu:.4f} ms {f / qu / 1e9:6.1f} TF   synced/queued {sy / qu:.3f}")
        for kind in ("fwd", "fwd+bwd"):
            for m in ("synced", "queued"):
                t = statistics.median(res[(f"tilejit {kind}", m)])
                c = statistics.median(res[(f"cudnn {kind}", m)])
                print(f"  RATIO {kind} {m}: tilejit vs cudnn {c / t:.3f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
