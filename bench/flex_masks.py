#!/usr/bin/env python3
"""FlexAttention (torch.compile) forward and backward on the masks of `attention_bench --masks`,
same shapes and documents; prints one FLEX line per (mask, S) (S 8k and 16k, or `--seq S`). TFLOP/s count unmasked elements only
(4 * D per allowed (row, key); backward 2.5x), as the C++ side does. The backward's time is that of
forward + backward minus the forward's. Run on the GPU machine:
    python3 bench/flex_masks.py [--seq S] [--head-dim 64]
"""
import argparse

import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask

from timing import queued_ms  # bench/timing.py: attention_bench's rule, both sides of the masks table

DOC_LENGTHS = [1024, 3072, 512, 2560, 1536, 4096, 768, 2816]  # bench/attention.cpp kDocumentLengths
TOKENS, HIDDEN = 16384, 2048


def doc_ids(S, device):
    ids, d = [], 0
    while len(ids) < S:
        ids += [d] * DOC_LENGTHS[d % 8]
        d += 1
    return torch.tensor(ids[:S], device=device, dtype=torch.int32)


def block_table(S, device):
    """attention_bench's block-sparse table: 128 x 128 blocks, the diagonal and (7 i + 3 j) % 5 < 2."""
    nb = (S + 127) // 128
    i, j = torch.arange(nb)[:, None], torch.arange(nb)[None, :]
    return ((i == j) | ((i * 7 + j * 3) % 5 < 2)).to(device)


def masks(S, device):
    docs = doc_ids(S, device)
    prefix = S // 2
    table = block_table(S, device)
    return {
        "causal": lambda b, h, q, k: k <= q,
        "causal_sliding_window_1024": lambda b, h, q, k: (k <= q) & (q - k <= 1023),
        "sliding_window_1024": lambda b, h, q, k: (k >= q - 512) & (k <= q + 511),
        "causal_document": lambda b, h, q, k: (k <= q) & (docs[q] == docs[k]),
        "document": lambda b, h, q, k: docs[q] == docs[k],
        "global_64_sliding_window_1024": lambda b, h, q, k: (k < 64) | (q < 64) | ((k >= q - 512) & (k <= q + 511)),
        "prefix_lm_half": lambda b, h, q, k: (k <= q) | (k < prefix),
        "block_sparse_128": lambda b, h, q, k: table[q // 128, k // 128],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=0, help="only this sequence length (attention_bench --masks --seq S)")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128), help="attention_bench --masks --head-dim D")
    args = ap.parse_args()
    seqs = (args.seq,) if args.seq else (8192, 16384)
    D = args.head_dim
    dev = "cuda"
    # one compile per mask and shape: each mask_mod is a new function, and dynamo's default cache
    # limit (8) would otherwise fall back to the unfused eager path after the first shape
    torch._dynamo.config.cache_size_limit = 64
    for S in seqs:
        torch._dynamo.reset()
        flex = torch.compile(flex_attention)
        B, H = TOKENS // S, HIDDEN // D
        q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
        qi, ki = torch.arange(S, device=dev)[:, None], torch.arange(S, device=dev)[None, :]
        for name, mod in masks(S, dev).items():
            allowed = int(mod(0, 0, qi, ki).sum().item()) * B * H
            bm = create_block_mask(mod, None, None, S, S, device=dev, BLOCK_SIZE=128)
            with torch.no_grad():
                ms = queued_ms(lambda: flex(q, k, v, block_mask=bm))

            def forward_backward():
                flex(q, k, v, block_mask=bm).backward(grad)
                q.grad = k.grad = v.grad = None

            bwd = queued_ms(forward_backward) - ms
            print(f"FLEX name={name} S={S} B={B} H={H} D={D} density={allowed / (B * H * S * S):.4f} fwd_ms={ms:.4f} "
                  f"fwd_tflops={4 * D * allowed / (ms * 1e-3) / 1e12:.1f} bwd_ms={bwd:.4f} "
                  f"bwd_tflops={2.5 * 4 * D * allowed / (bwd * 1e-3) / 1e12:.1f}", flush=True)


if __name__ == "__main__":
    main()
