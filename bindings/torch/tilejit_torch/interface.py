"""flash-attn-style functions over the tilejit ops: flash_attn_func and flash_attn_varlen_func."""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import ops


def _seed(dropout_p: float, seed: Optional[int]) -> Tensor:
    if seed is not None:
        return torch.tensor(seed, dtype=torch.int64)
    if dropout_p == 0.0:
        return torch.zeros((), dtype=torch.int64)
    # drawn from torch's CPU generator inside the (possibly compiled) program: a new mask each call
    return torch.randint(0, 2**62, (), dtype=torch.int64)


def _scale(q: Tensor, softmax_scale: Optional[float]) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


class _Attention(torch.autograd.Function):
    """Autograd over the two ops. The ops also carry register_autograd (for callers of
    torch.ops.tilejit directly); this Function is the lighter path the functions below take:
    torch.library's Python autograd wrapper cost ~0.2 ms in the forward and ~0.6 ms in the
    backward per call on the H100 host (bench/torch_overhead.py)."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = ops.attention_forward(*inputs)
        ops.setup_context(ctx, inputs, (out, lse))  # what the ops' own autograd saves
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return ops.backward(ctx, dout, dlse)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), deterministic: bool = True,
                    return_lse: bool = False, document_ids: Optional[Tensor] = None, seed: Optional[int] = None,
                    alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention over q [B, S_q, H_q, D], k / v [B, S_k, H_kv, D] (bf16 / f16; D 64, 128 or 256; H_q a
    multiple of H_kv). causal is bottom-right aligned when S_q != S_k (as flash-attn). window_size =
    (left, right) keys around each query (-1: unbounded). document_ids: int32 [B, S] (S_q == S_k), a
    query sees keys of its own document only (with causal: and not after it). dropout_p uses a fresh
    seed per call unless `seed` is given. deterministic=False sums dQ with atomics (faster, not
    bit-reproducible). alibi_slopes (f32 [H_q]) adds slope[h] * (j - i) to score (i, j) (flash-attn's
    -slope |i - j| where causal); softcap > 0 applies cap * tanh(score / cap) (one of the two). Returns out [B, S_q, H_q, D] (and lse f32 [B, H_q, S_q] with return_lse; lse
    gets no gradient)."""
    out, lse = _Attention.apply(q, k, v, None, None, 0, 0, _scale(q, softmax_scale), causal, window_size[0], window_size[1],
                                document_ids, float(dropout_p), _seed(dropout_p, seed), deterministic, alibi_slopes,
                                float(softcap))
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1), deterministic: bool = True,
                           return_lse: bool = False, seed: Optional[int] = None, alibi_slopes: Optional[Tensor] = None,
                           softcap: float = 0.0) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Packed sequences: q [total_q, H_q, D], k / v [total_k, H_kv, D], cu_seqlens int32 [batch + 1]
    (device tensors, offsets of each sequence), max_seqlen_* the longest sequence. Returns out
    [total_q, H_q, D] (and lse f32 [H_q, total_q])."""
    out, lse = _Attention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), _scale(q, softmax_scale),
                                causal, window_size[0], window_size[1], None, float(dropout_p), _seed(dropout_p, seed),
                                deterministic, alibi_slopes, float(softcap))
    return (out, lse) if return_lse else out
