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


def keep_scale(p):
    """What kept probabilities are multiplied by: 256 / round((1 - p) * 256) (8-bit thresholds)."""
    return 256.0 / round((1.0 - p) * 256.0) if p > 0 else 1.0


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), doc=None, cu_q=None, cu_k=None, alibi=None, softcap=0.0,
              prefix=None, table=None, block=(128, 128), keep=None, dropout_p=0.0):
    """float32 attention on [B, S, H, D] (or packed varlen) tensors, GQA by repeating K/V heads;
    `keep` (bool [B, H, S_q, S_k], varlen [batch, H, max_q, max_k]) drops probabilities, scaling the
    kept ones by keep_scale(dropout_p)."""
    if cu_q is not None:
        outs = []
        for i in range(len(cu_q) - 1):
            qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            kp = None if keep is None else keep[i:i + 1, :, :qs.stop - qs.start, :ks.stop - ks.start]
            outs.append(reference(q[qs][None], k[ks][None], v[ks][None], causal, scale, window, keep=kp, dropout_p=dropout_p)[0])
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
    if prefix is not None:  # prefix LM: causal, and every key inside the sequence's prefix
        allowed = (j <= i)[None, None] | (j[None, None] < prefix.long()[:, None, None, None])
    if table is not None:  # block-sparse, indexed by the query row (not the aligned position)
        rows = torch.arange(sq, device=q.device) // block[0]
        cols = torch.arange(sk, device=q.device) // block[1]
        allowed = table.bool()[:, :, rows][:, :, :, cols]
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if keep is not None:
        p = p * keep.float() * keep_scale(dropout_p)
    return (p @ v).transpose(1, 2)


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()


def rel(a, b):
    """|a - b| / |b| with |b| floored at an RMS of 1e-3 per element: where the exact result is zero
    (one key: softmax's gradient vanishes, the float32 reference gives exact zeros) the 16-bit
    rounding residue is compared with a scale, not with zero. Unit-normal inputs give gradients far
    above the floor, where it changes nothing."""
    floor = 1e-3 * math.sqrt(b.numel())
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(floor)).item()


class Values(unittest.TestCase):
    def check(self, q, k, v, tol=1e-2, **kw):
        """Output and gradients through autograd against the float32 reference: rel. error < tol
        (the issue's bar, 1e-2). With dropout_p the call returns its keep-mask, which the reference
        applies."""
        ref_kw = {key: kw[key] for key in ("causal", "window", "softcap", "dropout_p") if key in kw}
        for name, ref_name in (("alibi_slopes", "alibi"), ("document_ids", "doc"), ("prefix_lengths", "prefix"),
                               ("block_table", "table"), ("block_size", "block")):
            if name in kw:
                ref_kw[ref_name] = kw[name]
        fn_kw = dict(kw)
        if "window" in fn_kw:
            fn_kw["window_size"] = fn_kw.pop("window")
        if kw.get("dropout_p", 0.0) > 0.0:
            out, ref_kw["keep"] = tj.flash_attn_func(q, k, v, return_dropout_mask=True, **fn_kw)
        else:
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

    def test_prefix_lm_and_block_sparse(self):
        q, k, v = rand(2, 256, 2, 64), rand(2, 256, 2, 64), rand(2, 256, 2, 64)
        self.check(q, k, v, prefix_lengths=torch.tensor([40, 200], device="cuda", dtype=torch.int32))
        q, k, v = rand(2, 200, 4, 128), rand(2, 300, 2, 128), rand(2, 300, 2, 128)
        table = (torch.rand(1, 4, 4, 5, device="cuda") < 0.5).to(torch.uint8)
        table[..., 0] = 1  # (every row sees a block: an empty row's gradient is zero, also in the reference)
        self.check(q, k, v, block_table=table, block_size=(64, 64))

    def test_varlen(self):
        lens_q, lens_k = [70, 129, 33], [90, 129, 20]
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
        for p in (0.0, 0.25):
            with self.subTest(dropout_p=p):
                q, k, v = rand(sum(lens_q), 4, 64), rand(sum(lens_k), 2, 64), rand(sum(lens_k), 2, 64)
                res = tj.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, dropout_p=p,
                                                return_lse=True, return_dropout_mask=p > 0)
                out, lse = res[0], res[1]
                self.assertEqual(tuple(lse.shape), (4, sum(lens_q)))
                qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
                ref = reference(qr, kr, vr, causal=True, cu_q=cu_q.tolist(), cu_k=cu_k.tolist(),
                                keep=res[2] if p > 0 else None, dropout_p=p)
                self.assertLess(rel(out, ref), 1e-2)
                dout = torch.randn_like(out)
                out.backward(dout)
                ref.backward(dout.float())
                for got, want, name in ((q.grad, qr.grad, "dq"), (k.grad, kr.grad, "dk"), (v.grad, vr.grad, "dv")):
                    self.assertLess(rel(got, want), 1e-2, name)

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
        # 100 cases: dtypes, D 64 / 128, GQA groups, ragged S_q != S_k, causal, windows (S_q == S_k),
        # dropout (every fourth case, checked with the keep-mask the call returns)
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
            if case % 4 == 1:
                kw["dropout_p"] = pick([0.1, 0.3])
            with self.subTest(case=case, dtype=dtype, d=d, b=b, h_kv=h_kv, group=group, sq=sq, sk=sk, **kw):
                self.check(rand(b, sq, h_kv * group, d, dtype=dtype), rand(b, sk, h_kv, d, dtype=dtype),
                           rand(b, sk, h_kv, d, dtype=dtype), **kw)

    def test_dropout_seeds(self):
        q, k, v = (rand(1, 256, 2, 64).detach() for _ in range(3))
        a, mask_a = tj.flash_attn_func(q, k, v, dropout_p=0.2, seed=7, return_dropout_mask=True)
        b, mask_b = tj.flash_attn_func(q, k, v, dropout_p=0.2, seed=7, return_dropout_mask=True)
        c, mask_c = tj.flash_attn_func(q, k, v, dropout_p=0.2, return_dropout_mask=True)
        d, mask_d = tj.flash_attn_func(q, k, v, dropout_p=0.2, return_dropout_mask=True)
        self.assertTrue(torch.equal(a, b) and torch.equal(mask_a, mask_b))
        self.assertFalse(torch.equal(c, d) or torch.equal(mask_c, mask_d))  # a fresh seed per call
        self.assertFalse(torch.equal(a, tj.flash_attn_func(q, k, v)))
        kept = mask_c.float().mean().item()  # 8-bit threshold: keep probability 205 / 256
        self.assertLess(abs(kept - 205 / 256), 0.01)
        torch.manual_seed(5)  # device seeds come from torch's generator: reproducible
        e = tj.flash_attn_func(q, k, v, dropout_p=0.2)
        torch.manual_seed(5)
        self.assertTrue(torch.equal(e, tj.flash_attn_func(q, k, v, dropout_p=0.2)))

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
        # every forward case and its backward: GQA with windows (sliding and causal sliding), causal
        # and non-causal documents (block lists: the forward's workspace), prefix LM, block-sparse,
        # varlen, dropout with a device seed, ALiBi, soft-capping; then the keep-mask op
        seed = torch.zeros((), dtype=torch.int64)
        q, k, v = rand(1, 128, 4, 64), rand(1, 128, 2, 64), rand(1, 128, 2, 64)
        doc = torch.tensor([[0] * 50 + [1] * 78], device="cuda", dtype=torch.int32)
        prefix = torch.tensor([30], device="cuda", dtype=torch.int32)
        table = torch.tensor([[[[1, 0], [1, 1]]]], device="cuda", dtype=torch.uint8)
        dev_seed = torch.tensor([1234, 5], device="cuda", dtype=torch.int64)
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device="cuda", dtype=torch.float32)
        cu = torch.tensor([0, 40, 100], device="cuda", dtype=torch.int32)
        qv, kv, vv = rand(100, 4, 64), rand(100, 2, 64), rand(100, 2, 64)
        dense = (None, None, 0, 0, 0.125)
        cases = {
            "sliding window": (q, k, v) + dense + (False, 32, 8, None, 0.0, seed, True),
            "causal sliding window": (q, k, v) + dense + (True, 32, -1, None, 0.0, seed, True),
            "document": (q, k, v) + dense + (False, -1, -1, doc, 0.0, seed, True),
            "causal document": (q, k, v) + dense + (True, -1, -1, doc, 0.0, seed, True),
            "prefix LM": (q, k, v) + dense + (False, -1, -1, None, 0.0, seed, True, None, 0.0, prefix),
            "block-sparse": (q, k, v) + dense + (False, -1, -1, None, 0.0, seed, True, None, 0.0, None, table, 64, 64),
            "varlen causal": (qv, kv, vv, cu, cu, 60, 60, 0.125, True, -1, -1, None, 0.0, seed, True),
            "dropout, device seed": (q, k, v) + dense + (True, -1, -1, None, 0.2, dev_seed, True),
            "varlen dropout": (qv, kv, vv, cu, cu, 60, 60, 0.125, False, -1, -1, None, 0.2, dev_seed, True),
            "alibi": (q, k, v) + dense + (True, -1, -1, None, 0.0, seed, True, slopes),
            "softcap, atomic dQ": (q, k, v) + dense + (False, -1, -1, None, 0.0, seed, False, None, 5.0),
        }
        for name, args in cases.items():
            with self.subTest(case=name):
                torch.library.opcheck(torch.ops.tilejit.attention_forward.default, args)
                out, lse = torch.ops.tilejit.attention_forward(*args)
                bargs = (torch.randn_like(out), args[0].detach(), args[1].detach(), args[2].detach(), out.detach(),
                         lse.detach()) + args[3:]
                torch.library.opcheck(torch.ops.tilejit.attention_backward.default, bargs)
        torch.library.opcheck(torch.ops.tilejit.dropout_keep_mask.default, (q.detach(), dev_seed, 0.2, 1, 4, 128, 100))

    def test_create_block_table(self):
        # FlexAttention's create_block_mask for whole blocks: a block-causal mask's table, used as
        # a block-sparse mask, equals the reference with the element mask; partial blocks refuse
        def block_causal(b, h, q_idx, kv_idx):
            return (kv_idx // 64) <= (q_idx // 64)

        table = tj.create_block_table(block_causal, 1, 1, 256, 256, block_size=(64, 64))
        self.assertEqual(tuple(table.shape), (1, 1, 4, 4))
        self.assertTrue(torch.equal(table.cpu(), torch.tril(torch.ones(4, 4, dtype=torch.uint8))[None, None]))
        q, k, v = rand(2, 256, 2, 64), rand(2, 256, 2, 64), rand(2, 256, 2, 64)
        self.check_block_table(q, k, v, table)
        with self.assertRaisesRegex(ValueError, "partly allowed"):
            tj.create_block_table(lambda b, h, qi, ki: ki <= qi, 1, 1, 256, 256, block_size=(64, 64))

    def check_block_table(self, q, k, v, table):
        out = tj.flash_attn_func(q, k, v, block_table=table, block_size=(64, 64))
        ref = reference(q.detach(), k.detach(), v.detach(), table=table, block=(64, 64))
        self.assertLess(rel(out, ref), 1e-2)

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
        # dropout: the device seed drawn inside the compiled program, a new mask per call
        drop = torch.compile(lambda q, k, v: tj.flash_attn_func(q, k, v, dropout_p=0.1, causal=True), fullgraph=True)
        with torch.no_grad():
            a, b = drop(q, k, v), drop(q, k, v)
        self.assertTrue(torch.isfinite(a).all() and not torch.equal(a, b))

    def test_side_stream(self):
        q, k, v = (rand(1, 256, 2, 128).detach() for _ in range(3))
        want = tj.flash_attn_func(q, k, v)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = tj.flash_attn_func(q, k, v)
        torch.cuda.current_stream().wait_stream(s)
        self.assertTrue(torch.equal(got, want))

    def test_inputs_on_a_non_current_device(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("needs 2 GPUs (inputs on cuda:1 while cuda:0 is current)")
        torch.cuda.set_device(0)
        q, k, v = (torch.randn(2, 300, 4, 64, device="cuda:1", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out = tj.flash_attn_func(q, k, v, causal=True, dropout_p=0.1, seed=3)
        out.square().sum().backward()
        self.assertEqual(torch.cuda.current_device(), 0)  # (the call leaves the current device alone)
        self.assertEqual(out.device, torch.device("cuda:1"))
        with torch.cuda.device(1):  # the same call with cuda:1 current: the same bits
            q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
            out2 = tj.flash_attn_func(q2, k2, v2, causal=True, dropout_p=0.1, seed=3)
            out2.square().sum().backward()
        self.assertTrue(torch.equal(out, out2))
        for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
            self.assertTrue(torch.equal(a, b))
        ref = reference(q.detach(), k.detach(), v.detach(), causal=True,
                        keep=tj.ops.dropout_keep_mask(q.detach(), torch.tensor(3), 0.1, 2, 4, 300, 300), dropout_p=0.1)
        self.assertLess(rel(out, ref), 1e-2)

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

    def test_cuda_graph_with_dropout_draws_a_new_mask_per_replay(self):
        # the seed is drawn on the device inside the graph (torch's graph-safe generator) and read
        # by the kernels when they run: each replay drops other elements, and equals an eager call
        # given the [seed, offset] that replay drew, forward and backward, bit for bit
        q, k, v, dout = (torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))

        def step(seed=None):
            s = torch.randint(0, 2**62, (2,), dtype=torch.int64, device="cuda") if seed is None else seed
            out, lse = torch.ops.tilejit.attention_forward(q, k, v, None, None, 0, 0, 0.125, True, -1, -1, None, 0.1, s, True)
            grads = torch.ops.tilejit.attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.125, True, -1, -1, None, 0.1,
                                                         s, True)
            return (s, out) + tuple(grads)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.graph(g):
                captured = step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        outs = []
        for trial in range(3):
            g.replay()
            seed = captured[0].clone()
            want = step(seed)
            for got, exp in zip(captured[1:], want[1:]):
                self.assertTrue(torch.equal(got, exp), f"replay {trial}")
            outs.append(captured[1].clone())
        self.assertFalse(torch.equal(outs[0], outs[1]) or torch.equal(outs[1], outs[2]))

        # the same through flash_attn_func and autograd (a training step captured whole)
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

        def train_step():
            for x in (qg, kg, vg):
                x.grad = None
            out = tj.flash_attn_func(qg, kg, vg, dropout_p=0.1, causal=True)
            out.backward(dout)
            return out

        with torch.cuda.stream(side):
            for _ in range(2):
                train_step()
        torch.cuda.current_stream().wait_stream(side)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            out_g = train_step()
        g2.replay()
        first = (out_g.clone(), qg.grad.clone())
        g2.replay()
        self.assertFalse(torch.equal(first[0], out_g) or torch.equal(first[1], qg.grad))
        self.assertTrue(torch.isfinite(out_g).all() and torch.isfinite(qg.grad).all())

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
