"""flash-attn-style functions over the tilejit ops: flash_attn_func and flash_attn_varlen_func."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import ops


_NO_SEED = torch.zeros((), dtype=torch.int64)  # (read only: the calls without dropout share it)


def _seed(dropout_p: float, seed: Optional[int], device: torch.device) -> Tensor:
    if seed is not None:
        return torch.tensor(seed, dtype=torch.int64)  # a fixed mask, also in every replay of a CUDA graph
    if dropout_p == 0.0:
        return _NO_SEED
    # [seed, offset] drawn on the device from torch's CUDA generator: a new mask each call, each
    # compiled step and each CUDA-graph replay (torch's generator is graph-safe; the kernels read the
    # pair when they run), reproducible under torch.manual_seed, and no host synchronisation
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)


def _scale(q: Tensor, softmax_scale: Optional[float]) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


class _Attention(torch.autograd.Function):
    """Autograd over the two ops. The ops also carry register_autograd (for callers of
    torch.ops.tilejit directly); this Function is the lighter path the functions below take:
    torch.library's Python autograd wrapper cost ~0.2 ms in the forward and ~0.6 ms in the
    backward per call on the H100 host (bench/torch_overhead.py). Eager calls run the ops'
    implementations directly (ops.forward / ops.backward_call); torch.compile traces the ops."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = ops.forward(*inputs)
        ops.setup_context(ctx, inputs, (out, lse))  # what the ops' own autograd saves
        ctx.mark_non_differentiable(lse)
        if not torch.compiler.is_compiling():
            ctx.set_materialize_grads(False)  # (no zero-filled gradient for lse per call)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return ops.backward(ctx, dout, dlse)


def _results(out: Tensor, lse: Tensor, return_lse: bool, keep: Optional[Tensor]):
    extra = ((lse,) if return_lse else ()) + ((keep,) if keep is not None else ())
    return (out,) + extra if extra else out


def _keep_mask(q: Tensor, seed: Tensor, dropout_p: float, batch: int, heads: int, seq_q: int, seq_k: int) -> Tensor:
    if dropout_p == 0.0:
        return torch.ones((batch, heads, seq_q, seq_k), dtype=torch.bool, device=q.device)
    return ops.dropout_keep_mask(q.detach(), seed, dropout_p, batch, heads, seq_q, seq_k)  # (q: the device)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), deterministic: bool = False,
                    return_lse: bool = False, document_ids: Optional[Tensor] = None, seed: Optional[int] = None,
                    alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0, prefix_lengths: Optional[Tensor] = None,
                    block_table: Optional[Tensor] = None, block_size: Tuple[int, int] = (128, 128),
                    return_dropout_mask: bool = False):
    """Attention over q [B, S_q, H_q, D], k / v [B, S_k, H_kv, D] (bf16 / f16; D 64, 128 or 256; H_q a
    multiple of H_kv). causal is bottom-right aligned when S_q != S_k (as flash-attn). window_size =
    (left, right) keys around each query (-1: unbounded). document_ids: int32 [B, S] (S_q == S_k), a
    query sees keys of its own document only (with causal: and not after it). dropout_p uses a fresh
    seed per call unless `seed` is given. deterministic=False (flash-attn's default) runs the library's
    fastest backward: dQ summed with atomics at D 128 dense (1.05-1.17x), its last bits varying run
    to run; deterministic=True the fastest bit-reproducible one. alibi_slopes (f32 [H_q]) adds slope[h] * (j - i) to score (i, j) (flash-attn's
    -slope |i - j| where causal); softcap > 0 applies cap * tanh(score / cap) (one of the two).
    prefix_lengths: int32 [B], a prefix LM (query i sees key j iff j <= i or j < prefix_lengths[b]; causal
    implied). block_table: uint8 [B or 1, H_q or 1, cdiv(S_q, bq), cdiv(S_k, bk)] with block_size = (bq,
    bk), a block-sparse mask (block (i // bq, j // bk) allowed iff non-zero). One mask at a time.
    Returns out [B, S_q, H_q, D], then lse f32 [B, H_q, S_q] with return_lse (no gradient), then with
    return_dropout_mask the bool keep-mask [B, H_q, S_q, S_k] the call drew (kept probabilities are
    scaled by 256 / round((1 - dropout_p) * 256))."""
    s = _seed(dropout_p, seed, q.device)
    out, lse = _Attention.apply(q, k, v, None, None, 0, 0, _scale(q, softmax_scale), causal, window_size[0], window_size[1],
                                document_ids, float(dropout_p), s, deterministic, alibi_slopes, float(softcap), prefix_lengths,
                                block_table, int(block_size[0]), int(block_size[1]))
    keep = _keep_mask(q, s, float(dropout_p), q.shape[0], q.shape[2], q.shape[1], k.shape[1]) if return_dropout_mask else None
    return _results(out, lse, return_lse, keep)


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1), deterministic: bool = False,
                           return_lse: bool = False, seed: Optional[int] = None, alibi_slopes: Optional[Tensor] = None,
                           softcap: float = 0.0, return_dropout_mask: bool = False):
    """Packed sequences: q [total_q, H_q, D], k / v [total_k, H_kv, D], cu_seqlens int32 [batch + 1]
    (device tensors, offsets of each sequence), max_seqlen_* the longest sequence. Returns out
    [total_q, H_q, D], then lse f32 [H_q, total_q] with return_lse, then with return_dropout_mask the
    keep-mask bool [batch, H_q, max_seqlen_q, max_seqlen_k] (sequence b's rows and columns from 0)."""
    s = _seed(dropout_p, seed, q.device)
    out, lse = _Attention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), _scale(q, softmax_scale),
                                causal, window_size[0], window_size[1], None, float(dropout_p), s, deterministic, alibi_slopes,
                                float(softcap))
    keep = None
    if return_dropout_mask:
        keep = _keep_mask(q, s, float(dropout_p), cu_seqlens_q.shape[0] - 1, q.shape[1], int(max_seqlen_q), int(max_seqlen_k))
    return _results(out, lse, return_lse, keep)
