#!/usr/bin/env python3
"""PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel, ring
attention over cuDNN SDPA, load-balanced) on the shapes `attention_bench --cp` runs, for the side by
side in BENCHMARKS.md. One process per GPU:

  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node W bench/cp_torch.py [--tokens 8192] [--heads 16] [--causal 1] [--reps 10]

Prints one line per run (rank 0), the slowest rank's median times and the Long-Context benchmark's
per-GPU TFLOP/s (4 x allowed area x H x D, backward 2.5x, divided by W):
  TORCH_CP W=2 tokens_per_gpu=8192 S=16384 H=16 D=128 causal=1 fwd_ms=.. bwd_ms=.. fwd_tflops_per_gpu=.. bwd_tflops_per_gpu=..
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per GPU")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (world,))
    S, H, D = a.tokens * world, a.heads, a.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    fwd_ms, bwd_ms = [], []
    # context_parallel shards its buffers in place (a resize), which tensors that require grad refuse:
    # gradients are asked for inside
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), context_parallel(
            mesh, buffers=[q, k, v, do], buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers={q, k, v, do}):
        for t in (q, k, v):
            t.requires_grad_(True)
        for i in range(a.reps + 2):
            s0, s1, s2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            dist.barrier()
            s0.record()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(a.causal))
            s1.record()
            out.backward(do)
            s2.record()
            torch.cuda.synchronize()
            q.grad = k.grad = v.grad = None
            if i >= 2:
                fwd_ms.append(s0.elapsed_time(s1))
                bwd_ms.append(s1.elapsed_time(s2))
    med = lambda x: sorted(x)[len(x) // 2]
    t = torch.tensor([med(fwd_ms), med(bwd_ms)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    area = S * (S + 1) / 2 if a.causal else S * S
    flops = 4 * area * H * D
    if rank == 0:
        f, b = t.tolist()
        print(f"TORCH_CP W={world} tokens_per_gpu={a.tokens} S={S} H={H} D={D} causal={a.causal} fwd_ms={f:.3f} bwd_ms={b:.3f} "
              f"fwd_tflops_per_gpu={flops / f * 1e-9 / world:.1f} bwd_tflops_per_gpu={2.5 * flops / b * 1e-9 / world:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
