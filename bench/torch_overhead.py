"""Per-call cost of tilejit_torch beside SDPA at shapes small enough that the host side dominates
(issue 25: a binding's overhead matters for small layers and decoding). One process; alternated
rounds; microseconds per call, the median round.

    TILEJIT_C_LIBRARY=.gpu/libtilejit_c.so LD_LIBRARY_PATH=.gpu python3 bench/torch_overhead.py
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "torch"))
import tilejit_torch as tj  # noqa: E402


def per_call_us(fn, calls=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    shapes = [(1, 128, 1, 64), (1, 512, 8, 128), (8, 1024, 16, 128)]
    print(f"tilejit {tj.version()}, torch {torch.__version__}, {torch.cuda.get_device_name()}; us per call, median of 7 rounds")
    print("| B, S, H, D | tilejit fwd | SDPA flash fwd | tilejit fwd+bwd | SDPA flash fwd+bwd |")
    print("| --- | --- | --- | --- | --- |")
    for b, s, h, d in shapes:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

        def tj_fwd():
            with torch.no_grad():
                tj.flash_attn_func(q, k, v, causal=True)

        def sdpa_fwd():
            with torch.no_grad(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        def tj_both():
            tj.flash_attn_func(q, k, v, causal=True).sum().backward()

        def sdpa_both():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).sum().backward()

        fns = [tj_fwd, sdpa_fwd, tj_both, sdpa_both]
        for f in fns:
            f()  # warm-up (compiles)
        rounds = [[] for _ in fns]
        for r in range(7):
            order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
            for i in order:
                rounds[i].append(per_call_us(fns[i]))
        med = [statistics.median(x) for x in rounds]
        print(f"| {b}, {s}, {h}, {d} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} |")


if __name__ == "__main__" and "--breakdown" not in sys.argv and "--profile" not in sys.argv:
    main()


def breakdown():
    """Host time per call of the pieces (no synchronisation inside the loop): the C ABI call alone,
    the workspace query, the options and views; B 1, S 512, H 8, D 128, causal."""
    from tilejit_torch import _c, ops
    q, k, v, dout = (torch.randn(1, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    seed = torch.zeros((), dtype=torch.int64)
    out, lse = torch.ops.tilejit.attention_forward(q, k, v, None, None, 0, 0, 0.088, True, -1, -1, None, 0.0, seed, True)
    dq, dk, dv = torch.ops.tilejit.attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.088, True, -1, -1, None, 0.0, seed, True)
    opts = ops._options(q, None, None, 0, 0, 0.088, True, -1, -1, None, 0.0, seed, True)
    t = {n: ops._view(x, n) for n, x in (("q", q), ("k", k), ("v", v), ("o", out), ("do", dout), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv))}
    stream = torch.cuda.current_stream().cuda_stream
    wsb = _c.backward_workspace_bytes(t["q"], t["k"], opts)
    ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")

    def host_us(fn, calls=300):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / calls * 1e6

    pieces = {
        "C forward": lambda: _c.forward(t["q"], t["k"], t["v"], t["o"], t["lse"], opts, stream, 0, 0),
        "C backward": lambda: _c.backward(t["q"], t["k"], t["v"], t["o"], t["do"], t["lse"], t["dq"], t["dk"], t["dv"], opts, stream,
                                          ws.data_ptr(), wsb),
        "backward workspace query": lambda: _c.backward_workspace_bytes(t["q"], t["k"], opts),
        "options": lambda: ops._options(q, None, None, 0, 0, 0.088, True, -1, -1, None, 0.0, seed, True),
        "5 views": lambda: [ops._view(x, "x") for x in (q, k, v, out, lse)],
        "op forward": lambda: torch.ops.tilejit.attention_forward(q, k, v, None, None, 0, 0, 0.088, True, -1, -1, None, 0.0, seed, True),
        "op backward": lambda: torch.ops.tilejit.attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.088, True, -1, -1, None,
                                                                    0.0, seed, True),
    }
    for name, fn in pieces.items():
        fn()
        print(f"{name}: {statistics.median(host_us(fn) for _ in range(5)):.1f} us host time per call")


if __name__ == "__main__" and "--breakdown" in sys.argv:
    breakdown()


def profile():
    """torch.profiler over forward + backward through autograd (B 1, S 128, H 1, D 64, causal): host
    time per call split by operator and Python function, tilejit beside SDPA, and the time from
    entering backward() to the first kernel of the backward (what the autograd engine costs)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    q, k, v = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

    def tj_both():
        tj.flash_attn_func(q, k, v, causal=True).sum().backward()

    def sdpa_both():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).sum().backward()

    for name, fn in (("tilejit", tj_both), ("sdpa", sdpa_both)):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        # the pieces with synchronisation between them: host-bound or device-bound?
        t = {"forward": [], "backward": []}
        for _ in range(50):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = (tj.flash_attn_func(q, k, v, causal=True) if fn is tj_both else
                   F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
            loss = out.sum()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            torch.cuda.synchronize()
            t["forward"].append((t1 - t0) * 1e6)
            t["backward"].append((t2 - t1) * 1e6)
        print(f"{name}: forward (+sync) {statistics.median(t['forward']):.1f} us, backward() host "
              f"{statistics.median(t['backward']):.1f} us (median of 50)")
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        print(f"== {name}: 20 calls, by self CPU time ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
        print(f"== {name}: by Python stack (5 frames), CPU total ==")
        print(prof.key_averages(group_by_stack_n=5).table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__" and "--profile" in sys.argv:
    profile()
