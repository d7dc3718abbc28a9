"""bench/triton_attention_autotune.py: the wall time of Triton's autotuning of a fused-attention
forward (the shape of Triton's tutorial 06: online softmax, @triton.autotune over BLOCK_M, BLOCK_N,
num_stages, num_warps) from a cold Triton cache, to compare with `tilejit tune attention_fwd`
measured in the same session. Reference only: tilejit does not use Python.

Usage (GPU machine): python3 bench/triton_attention_autotune.py [B H S D ...]
"""
import os
import sys
import tempfile
import time

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cold-"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w)
    for bm in (64, 128) for bn in (32, 64) for s in (3, 4, 7) for w in (4, 8)
]


@triton.autotune(configs=CONFIGS, key=["N_CTX", "HEAD_DIM"])
@triton.jit
def attn_fwd(Q, K, V, Out, sm_scale, stride_z, stride_h, stride_m, N_CTX, H: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    base = (off_hz // H) * stride_z + (off_hz % H) * stride_h
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * stride_m + offs_d[None, :], mask=offs_m[:, None] < N_CTX, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + base + cols[None, :] * stride_m + offs_d[:, None], mask=cols[None, :] < N_CTX, other=0.0)
        qk = tl.dot(q, k) * qk_scale
        qk = tl.where(cols[None, :] < N_CTX, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base + cols[:, None] * stride_m + offs_d[None, :], mask=cols[:, None] < N_CTX, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(Out + base + offs_m[:, None] * stride_m + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < N_CTX)


def run(B, H, S, D):
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    scale = D ** -0.5
    grid = lambda meta: (triton.cdiv(S, meta["BLOCK_M"]), B * H)  # noqa: E731
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    attn_fwd[grid](q, k, v, o, scale, q.stride(0), q.stride(1), q.stride(2), S, H=H, HEAD_DIM=D)
    torch.cuda.synchronize()
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    attn_fwd[grid](q, k, v, o, scale, q.stride(0), q.stride(1), q.stride(2), S, H=H, HEAD_DIM=D)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    err = ((o.float() - ref).norm() / ref.norm()).item()
    best = attn_fwd.best_config
    print(f"triton autotune attention B={B} H={H} S={S} D={D}: {len(CONFIGS)} configs, cold {cold:.2f} s, "
          f"warm {warm * 1e3:.2f} ms, best {best}, rel. error {err:.2e}")


if __name__ == "__main__":
    args = [int(x) for x in sys.argv[1:]] or [2, 8, 1024, 64]
    for i in range(0, len(args), 4):
        run(*args[i:i + 4])
