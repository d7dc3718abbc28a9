"""The torch.library ops: tilejit::attention_forward / attention_backward, with fake (meta)
implementations for dense and varlen shapes and autograd (saving q, k, v, out, lse).

Each op runs on torch's current stream of the inputs' device, takes its outputs and workspace
from torch's caching allocator, and never synchronises. Layouts are flash-attn's: dense q / out
[B, S_q, H_q, D], k / v [B, S_k, H_kv, D], lse f32 [B, H_q, S_q]; varlen q [total_q, H_q, D],
k / v [total_k, H_kv, D] with int32 cu_seqlens, lse [H_q, total_q].
"""
from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _c

_DTYPES = {torch.bfloat16: _c.BF16, torch.float16: _c.F16, torch.float32: _c.F32, torch.int32: _c.I32, torch.uint8: _c.U8}


def _view(t: Tensor, name: str) -> _c.Tensor:
    if t.dtype not in _DTYPES:
        raise _c.TilejitArgumentError(f"tilejit_torch: {name} has dtype {t.dtype}; valid: bfloat16 / float16 for q, k, v, "
                                      f"float32 for lse, int32 for cu_seqlens and document ids")
    if not t.is_cuda:
        raise _c.TilejitArgumentError(f"tilejit_torch: {name} is on {t.device}; tilejit runs on CUDA tensors")
    return _c.Tensor.make(t.data_ptr(), _DTYPES[t.dtype], list(t.shape), list(t.stride()), t.device.index)


def _unit_last(t: Tensor) -> Tensor:
    """The kernels need a unit stride on D (and 16-byte row pitches, which the library checks)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_capture(op: str, dropout_p: float) -> None:
    # Capture is safe (the kernels' TMA descriptors are kernel parameters, copied into the graph),
    # but a dropout seed read on the host would be baked into the graph: every replay would drop
    # the same elements. Refuse that rather than train on one mask.
    if dropout_p > 0.0 and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"tilejit_torch.{op}: dropout inside a CUDA graph capture is not supported yet (the seed is a "
                           "host value, so every replay would reuse one mask); capture without dropout")


def _options(q: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
             softmax_scale: float, causal: bool, window_left: int, window_right: int, document_ids: Optional[Tensor],
             dropout_p: float, seed: int, deterministic: bool, alibi_slopes: Optional[Tensor] = None,
             softcap: float = 0.0) -> _c.Options:
    o = _c.Options()
    # score mods (the library's: ALiBi adds slope[h] * (key - query position); soft-capping
    # cap * tanh(score / cap)), on q . k * scale before the mask and the softmax
    if alibi_slopes is not None and softcap > 0.0:
        raise _c.TilejitArgumentError("tilejit_torch: alibi_slopes and softcap together are not supported; use one")
    if alibi_slopes is not None:
        o.score_mod = 1
        o.set_tensor("alibi_slopes", _view(alibi_slopes, "alibi_slopes"))
    elif softcap > 0.0:
        o.score_mod, o.softcap = 2, softcap
    o.has_softmax_scale, o.softmax_scale = 1, softmax_scale
    if cu_seqlens_q is not None:
        o.set_tensor("cu_seqlens_q", _view(cu_seqlens_q, "cu_seqlens_q"))
        o.set_tensor("cu_seqlens_k", _view(cu_seqlens_k, "cu_seqlens_k"))
        o.max_seqlen_q, o.max_seqlen_k = max_seqlen_q, max_seqlen_k
    windowed = window_left >= 0 or window_right >= 0
    if document_ids is not None:
        if windowed:
            raise _c.TilejitArgumentError("tilejit_torch: window_size and document_ids together are not supported; use one")
        o.mask_kind = _c.MASK_CAUSAL_DOCUMENT if causal else _c.MASK_DOCUMENT
        o.set_tensor("mask_doc_ids", _view(document_ids, "document_ids"))
    elif windowed:
        # flash-attn's window_size = (left, right), -1 = unbounded on that side
        left = window_left if window_left >= 0 else (1 << 40)
        right = window_right if window_right >= 0 else (1 << 40)
        if causal:
            o.mask_kind, o.mask_window_left = _c.MASK_CAUSAL_SLIDING_WINDOW, left
        else:
            o.mask_kind, o.mask_window_left, o.mask_window_right = _c.MASK_SLIDING_WINDOW, left, right
    else:
        o.causal = int(causal)
    o.dropout_p = dropout_p
    o.seed = seed & ((1 << 64) - 1)
    # deterministic: dQ recomputed in its own kernel (the library's default); else atomics
    o.dq_reduction = _c.DQ_RECOMPUTE if deterministic else _c.DQ_ATOMIC
    return o


def _seed(seed: Tensor) -> int:
    # a CPU int64 scalar (drawn with torch.randint in the traced program, so every compiled step
    # draws its own): reading it does not touch the GPU
    if seed.device.type != "cpu" or seed.numel() != 1:
        raise _c.TilejitArgumentError(f"tilejit_torch: seed must be a one-element CPU int64 tensor, got {tuple(seed.shape)} "
                                      f"on {seed.device}")
    return int(seed.item())


def _on(device: torch.device):
    # (entering torch.cuda.device costs more than the call when it is already current)
    return contextlib.nullcontext() if torch.cuda.current_device() == device.index else torch.cuda.device(device)


def _workspace(nbytes: int, device: torch.device) -> Tuple[Optional[Tensor], int]:
    if nbytes == 0:
        return None, 0
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws, ws.data_ptr()


def _lse_shape(q: Tensor, varlen: bool) -> List[int]:
    return [q.shape[1], q.shape[0]] if varlen else [q.shape[0], q.shape[2], q.shape[1]]


@torch.library.custom_op("tilejit::attention_forward", mutates_args=(), device_types="cuda")
def attention_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                      max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int,
                      window_right: int, document_ids: Optional[Tensor], dropout_p: float, seed: Tensor,
                      deterministic: bool, alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0) -> Tuple[Tensor, Tensor]:
    # (deterministic: the backward's dQ reduction, kept for autograd; the forward is deterministic)
    _check_capture("attention_forward", dropout_p)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    varlen = cu_seqlens_q is not None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    opts = _options(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                    document_ids, dropout_p, _seed(seed), True, alibi_slopes, softcap)
    tq, tk, tv, to, tl = _view(q, "q"), _view(k, "k"), _view(v, "v"), _view(out, "out"), _view(lse, "lse")
    with _on(q.device):
        ws, ws_ptr = _workspace(_c.forward_workspace_bytes(tq, tk, opts), q.device)
        _c.forward(tq, tk, tv, to, tl, opts, torch.cuda.current_stream(q.device).cuda_stream, ws_ptr, 0 if ws is None else ws.numel())
    return out, lse


@attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
      document_ids, dropout_p, seed, deterministic, alibi_slopes=None, softcap=0.0):
    varlen = cu_seqlens_q is not None
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(_lse_shape(q, varlen), dtype=torch.float32)


@torch.library.custom_op("tilejit::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
                       cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
                       window_left: int, window_right: int, document_ids: Optional[Tensor], dropout_p: float, seed: Tensor,
                       deterministic: bool, alibi_slopes: Optional[Tensor] = None,
                       softcap: float = 0.0) -> Tuple[Tensor, Tensor, Tensor]:
    _check_capture("attention_backward", dropout_p)
    q, k, v, out, dout = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(out), _unit_last(dout)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    opts = _options(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                    document_ids, dropout_p, _seed(seed), deterministic, alibi_slopes, softcap)
    t = {n: _view(x, n) for n, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse), ("dq", dq),
                                     ("dk", dk), ("dv", dv))}
    with _on(q.device):
        ws, ws_ptr = _workspace(_c.backward_workspace_bytes(t["q"], t["k"], opts), q.device)
        _c.backward(t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], t["dq"], t["dk"], t["dv"], opts,
                    torch.cuda.current_stream(q.device).cuda_stream, ws_ptr, 0 if ws is None else ws.numel())
    return dq, dk, dv


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
      window_right, document_ids, dropout_p, seed, deterministic, alibi_slopes=None, softcap=0.0):
    def like(x):
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    return like(q), like(k), like(v)


# Autograd (also interface._Attention's): the forward's inputs after q, k, v (cu_seqlens ... softcap)
# get no gradient.
_FORWARD_EXTRA = 14


def setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, doc, p, seed, deterministic, slopes, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, doc, seed, slopes)
    ctx.params = (max_q, max_k, scale, causal, wl, wr, p, softcap)
    ctx.deterministic = deterministic


def backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, doc, seed, slopes = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, p, softcap = ctx.params
    dq, dk, dv = attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, doc, p, seed,
                                    ctx.deterministic, slopes, softcap)
    return (dq, dk, dv) + (None,) * _FORWARD_EXTRA


attention_forward.register_autograd(backward, setup_context=setup_context)
