"""tilejit_torch on a GPU with torch: values and gradients against a float32 reference, the ops'
registrations (torch.library.opcheck), torch.compile(fullgraph=True), streams, CUDA-graph capture and replay.

    TILEJIT_C_LIBRARY=.../libtilejit_c.so python3 bindings/torch/tests/test_torch_gpu.py [-v]

Skips (exit 0, a SKIPPED line) without torch or a GPU.
"""
import math
import os
import sys
import unittest

try:
    import torch
except ImportError:
    print("SKIPPED: no torch")
    sys.exit(0)
if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tilejit_torch as tj  # noqa: E402


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), doc=None, cu_q=None, cu_k=None, alibi=None, softcap=0.0):
    """float32 attention on [B, S, H, D] (or packed varlen) tensors, GQA by repeating K/V heads."""
    if cu_q is not None:
        outs = []
        for i in range(len(cu_q) - 1):
            qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            outs.append(reference(q[qs][None], k[ks][None], v[ks][None], causal, scale, window)[0])
        return torch.cat(outs)
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))  # [B, H, S, D]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * scale
    sq, sk = q.shape[2], k.shape[2]
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    if softcap > 0.0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:  # slope[h] * (key - query position)
        s = s + alibi.float()[None, :, None, None] * (j - i).float()[None, None]
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= j <= i
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    allowed = allowed[None, None]
    if doc is not None:
        allowed = allowed & (doc[:, None, :, None] == doc[:, None, None, :])
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ v).transpose(1, 2)


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


class Values(unittest.TestCase):
    def check(self, q, k, v, tol=2e-2, **kw):
        ref_kw = {key: kw[key] for key in ("causal", "window", "softcap") if key in kw}
        if "alibi_slopes" in kw:
            ref_kw["alibi"] = kw["alibi_slopes"]
        if "document_ids" in kw:
            ref_kw["doc"] = kw["document_ids"]
        fn_kw = dict(kw)
        if "window" in fn_kw:
            fn_kw["window_size"] = fn_kw.pop("window")
        out = tj.flash_attn_func(q, k, v, **fn_kw)
        qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
        ref = reference(qr, kr, vr, **ref_kw)
        self.assertLess(rel(out, ref), tol)
        dout = torch.randn_like(out)
        out.backward(dout)
        ref.backward(dout.float())
        for got, want, name in ((q.grad, qr.grad, "dq"), (k.grad, kr.grad, "dk"), (v.grad, vr.grad, "dv")):
            self.assertEqual(got.shape, want.shape, name)
            self.assertLess(rel(got, want), tol, name)

    def test_dense_bf16_d128(self):
        for causal in (False, True):
            with self.subTest(causal=causal):
                self.check(rand(2, 300, 4, 128), rand(2, 300, 4, 128), rand(2, 300, 4, 128), causal=causal)

    def test_f16_d64_gqa_and_bottom_right_causal(self):
        q = rand(2, 200, 8, 64, dtype=torch.float16)
        k, v = rand(2, 333, 2, 64, dtype=torch.float16), rand(2, 333, 2, 64, dtype=torch.float16)
        self.check(q, k, v, causal=True)

    def test_window_and_documents(self):
        q, k, v = rand(1, 256, 2, 64), rand(1, 256, 2, 64), rand(1, 256, 2, 64)
        self.check(q, k, v, window=(32, 8))
        q, k, v = rand(1, 256, 2, 64), rand(1, 256, 2, 64), rand(1, 256, 2, 64)
        self.check(q, k, v, window=(40, 0), causal=True)
        doc = torch.repeat_interleave(torch.tensor([0, 1, 2], device="cuda", dtype=torch.int32), torch.tensor([100, 56, 100],
                                      device="cuda"))[None]
        q, k, v = rand(1, 256, 2, 64), rand(1, 256, 2, 64), rand(1, 256, 2, 64)
        self.check(q, k, v, document_ids=doc, causal=True)

    def test_score_mods(self):
        q, k, v = rand(2, 256, 4, 64), rand(2, 256, 4, 64), rand(2, 256, 4, 64)
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device="cuda", dtype=torch.float32)
        self.check(q, k, v, causal=True, alibi_slopes=slopes)
        q, k, v = rand(2, 256, 4, 128), rand(2, 256, 4, 128), rand(2, 256, 4, 128)
        with torch.no_grad():
            q.mul_(4.0)  # scores large enough that the cap bends them
        self.check(q, k, v, softcap=5.0)
        with self.assertRaisesRegex(ValueError, "alibi_slopes and softcap"):
            tj.flash_attn_func(q, k, v, alibi_slopes=torch.ones(4, device="cuda"), softcap=5.0)

    def test_varlen(self):
        lens = [70, 129, 33]
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        q, k, v = rand(sum(lens), 4, 64), rand(sum(lens), 4, 64), rand(sum(lens), 4, 64)
        out, lse = tj.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
        self.assertEqual(tuple(lse.shape), (4, sum(lens)))
        ref = reference(q.detach(), k.detach(), v.detach(), causal=True, cu_q=cu.tolist(), cu_k=cu.tolist())
        self.assertLess(rel(out, ref), 2e-2)
        out.sum().backward()
        self.assertTrue(torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0)

    def test_deterministic_and_atomic_backward(self):
        q, k, v = rand(2, 512, 4, 128), rand(2, 512, 4, 128), rand(2, 512, 4, 128)
        grads = []
        for det in (True, True, False):
            for x in (q, k, v):
                x.grad = None
            tj.flash_attn_func(q, k, v, causal=True, deterministic=det).square().sum().backward()
            grads.append(q.grad.clone())
        self.assertTrue(torch.equal(grads[0], grads[1]))  # deterministic: bit-identical
        self.assertLess(rel(grads[2], grads[0]), 1e-2)

    def test_randomized_sweep(self):
        # 100 cases: dtypes, D 64 / 128, GQA groups, ragged S_q != S_k, causal, windows (S_q == S_k)
        g = torch.Generator().manual_seed(1234)

        def pick(options):
            return options[int(torch.randint(len(options), (1,), generator=g))]

        for case in range(100):
            dtype, d = pick([torch.bfloat16, torch.float16]), pick([64, 128])
            b, h_kv, group = pick([1, 2]), pick([1, 2]), pick([1, 2, 4])
            sq = int(torch.randint(1, 300, (1,), generator=g))
            sk = sq if case % 3 == 0 else int(torch.randint(1, 300, (1,), generator=g))
            kw = {"causal": bool(case % 2)}
            if sq == sk and case % 5 == 0:
                kw["window"] = (int(torch.randint(0, 64, (1,), generator=g)), -1 if kw["causal"] else 16)
            with self.subTest(case=case, dtype=dtype, d=d, b=b, h_kv=h_kv, group=group, sq=sq, sk=sk, **kw):
                self.check(rand(b, sq, h_kv * group, d, dtype=dtype), rand(b, sk, h_kv, d, dtype=dtype),
                           rand(b, sk, h_kv, d, dtype=dtype), **kw)

    def test_dropout_seeds(self):
        q, k, v = (rand(1, 256, 2, 64).detach() for _ in range(3))
        a = tj.flash_attn_func(q, k, v, dropout_p=0.2, seed=7)
        b = tj.flash_attn_func(q, k, v, dropout_p=0.2, seed=7)
        c = tj.flash_attn_func(q, k, v, dropout_p=0.2)
        d = tj.flash_attn_func(q, k, v, dropout_p=0.2)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(c, d))  # a fresh seed per call
        self.assertFalse(torch.equal(a, tj.flash_attn_func(q, k, v)))

    def test_lse(self):
        q, k, v = (rand(1, 128, 2, 64).detach() for _ in range(3))
        _, lse = tj.flash_attn_func(q, k, v, return_lse=True)
        s = (q.float().transpose(1, 2) @ k.float().transpose(1, 2).transpose(-1, -2)) / 8.0
        self.assertLess(rel(lse, torch.logsumexp(s, -1)), 1e-4)


class Integration(unittest.TestCase):
    def test_opcheck(self):
        q, k, v = rand(1, 128, 2, 64), rand(1, 128, 2, 64), rand(1, 128, 2, 64)
        seed = torch.zeros((), dtype=torch.int64)
        args = (q, k, v, None, None, 0, 0, 0.125, True, -1, -1, None, 0.0, seed, True)
        torch.library.opcheck(torch.ops.tilejit.attention_forward.default, args)
        out, lse = torch.ops.tilejit.attention_forward(*args)
        bargs = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None, None, 0, 0, 0.125, True, -1,
                 -1, None, 0.0, seed, True)
        torch.library.opcheck(torch.ops.tilejit.attention_backward.default, bargs)

    def test_opcheck_varlen_gqa_masks(self):
        seed = torch.zeros((), dtype=torch.int64)
        # GQA with a window
        q, k, v = rand(1, 128, 4, 64), rand(1, 128, 2, 64), rand(1, 128, 2, 64)
        torch.library.opcheck(torch.ops.tilejit.attention_forward.default,
                              (q, k, v, None, None, 0, 0, 0.125, False, 32, 8, None, 0.0, seed, True))
        # document ids (a mask with block lists: the forward's workspace)
        doc = torch.tensor([[0] * 50 + [1] * 78], device="cuda", dtype=torch.int32)
        torch.library.opcheck(torch.ops.tilejit.attention_forward.default,
                              (q, k, v, None, None, 0, 0, 0.125, True, -1, -1, doc, 0.0, seed, True))
        # varlen
        cu = torch.tensor([0, 40, 100], device="cuda", dtype=torch.int32)
        qv, kv, vv = rand(100, 4, 64), rand(100, 2, 64), rand(100, 2, 64)
        torch.library.opcheck(torch.ops.tilejit.attention_forward.default,
                              (qv, kv, vv, cu, cu, 60, 60, 0.125, True, -1, -1, None, 0.0, seed, True))

    def test_compile_fullgraph(self):
        def step(q, k, v):
            return tj.flash_attn_func(q, k, v, causal=True).float().square().sum()

        q, k, v = rand(2, 256, 4, 64), rand(2, 256, 4, 64), rand(2, 256, 4, 64)
        eager = step(q, k, v)
        eager.backward()
        g_eager = [x.grad.clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        compiled = torch.compile(step, fullgraph=True)
        got = compiled(q, k, v)
        got.backward()
        # (inductor fuses the float conversion and the sum: the loss may differ in its last bits)
        torch.testing.assert_close(got, eager, rtol=1e-5, atol=0)
        for a, b in zip((q.grad, k.grad, v.grad), g_eager):
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)

    def test_side_stream_and_other_device_index(self):
        q, k, v = (rand(1, 256, 2, 128).detach() for _ in range(3))
        want = tj.flash_attn_func(q, k, v)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = tj.flash_attn_func(q, k, v)
        torch.cuda.current_stream().wait_stream(s)
        self.assertTrue(torch.equal(got, want))

    def test_cuda_graph_capture_and_replay(self):
        # forward and backward captured once, replayed on new data in the same buffers: each replay
        # equals an eager call (the TMA descriptors travel in the kernel parameters)
        q, k, v, dout = (torch.randn(2, 384, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        seed = torch.zeros((), dtype=torch.int64)

        def step():
            out, lse = torch.ops.tilejit.attention_forward(q, k, v, None, None, 0, 0, 0.0883883, True, -1, -1, None, 0.0, seed, True)
            grads = torch.ops.tilejit.attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.0883883, True, -1, -1, None, 0.0,
                                                         seed, True)
            return (out, lse) + tuple(grads)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()  # warm-up: compiles, sets function attributes
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call inside raises
        try:
            with torch.cuda.graph(g):
                captured = step()
            step()  # and an eager call after warm-up synchronises nothing either
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for trial in range(3):
            for x in (q, k, v, dout):
                x.copy_(torch.randn_like(x))
            g.replay()
            want = step()
            for got, exp in zip(captured, want):
                self.assertTrue(torch.equal(got, exp), f"replay {trial}")

    def test_dropout_inside_capture_is_refused_clearly(self):
        q, k, v = (rand(1, 128, 2, 64).detach() for _ in range(3))
        tj.flash_attn_func(q, k, v, dropout_p=0.1)  # warm-up (compiles)
        g = torch.cuda.CUDAGraph()
        with self.assertRaisesRegex(Exception, "dropout inside a CUDA graph"):
            with torch.cuda.graph(g):
                tj.flash_attn_func(q, k, v, dropout_p=0.1)

    def test_bad_arguments_name_the_problem(self):
        q = rand(1, 128, 3, 64).detach()
        k = rand(1, 128, 2, 64).detach()
        with self.assertRaisesRegex(ValueError, "multiple"):
            tj.flash_attn_func(q, k, k)
        with self.assertRaisesRegex(ValueError, "dtype"):
            tj.flash_attn_func(q.double(), q.double(), q.double())


if __name__ == "__main__":
    print(f"tilejit {tj.version()}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    unittest.main()
