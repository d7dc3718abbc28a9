"""The torch.library ops: tilejit::attention_forward / attention_backward, with fake (meta)
implementations for dense and varlen shapes and autograd (saving q, k, v, out, lse), and
tilejit::dropout_keep_mask (the keep-mask a call with some seed draws).

Each op runs on torch's current stream of the inputs' device, takes its outputs and workspace
from torch's caching allocator, and never synchronises. Layouts are flash-attn's: dense q / out
[B, S_q, H_q, D], k / v [B, S_k, H_kv, D], lse f32 [B, H_q, S_q]; varlen q [total_q, H_q, D],
k / v [total_k, H_kv, D] with int32 cu_seqlens, lse [H_q, total_q].

Dropout's `seed` is either a CPU int64 scalar (a fixed seed, offset 0) or an int64 [2] tensor
[seed, offset] on the inputs' device, which the kernels read when they run: CUDA graphs replay it
afresh, so a graph that draws it (torch.randint on the device, from torch's graph-safe generator)
drops other elements on every replay.
"""
from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _c

_DTYPES = {torch.bfloat16: _c.BF16, torch.float16: _c.F16, torch.float32: _c.F32, torch.int32: _c.I32, torch.uint8: _c.U8,
           torch.int64: _c.I64}


def _view(t: Tensor, name: str) -> _c.Tensor:
    if t.dtype not in _DTYPES:
        raise _c.TilejitArgumentError(f"tilejit_torch: {name} has dtype {t.dtype}; valid: bfloat16 / float16 for q, k, v, "
                                      f"float32 for lse, int32 for cu_seqlens, document ids and prefix lengths, uint8 for "
                                      f"block tables, int64 for seeds")
    if not t.is_cuda:
        raise _c.TilejitArgumentError(f"tilejit_torch: {name} is on {t.device}; tilejit runs on CUDA tensors")
    return _c.Tensor.make(t.data_ptr(), _DTYPES[t.dtype], list(t.shape), list(t.stride()), t.device.index)


def _unit_last(t: Tensor) -> Tensor:
    """The kernels need a unit stride on D (and 16-byte row pitches, which the library checks)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _options(q: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
             softmax_scale: float, causal: bool, window_left: int, window_right: int, document_ids: Optional[Tensor],
             dropout_p: float, seed: Tensor, deterministic: bool, alibi_slopes: Optional[Tensor] = None,
             softcap: float = 0.0, prefix_lengths: Optional[Tensor] = None, block_table: Optional[Tensor] = None,
             block_q: int = 0, block_k: int = 0) -> _c.Options:
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
    masks = [n for n, x in (("window_size", windowed), ("document_ids", document_ids is not None),
                            ("prefix_lengths", prefix_lengths is not None), ("block_table", block_table is not None)) if x]
    if len(masks) > 1:
        raise _c.TilejitArgumentError(f"tilejit_torch: {' and '.join(masks)} together are not supported; use one mask")
    if causal and block_table is not None:
        raise _c.TilejitArgumentError("tilejit_torch: causal with block_table is not supported (a block-sparse mask is "
                                      "the table alone; zero the blocks above the diagonal instead)")
    if document_ids is not None:
        o.mask_kind = _c.MASK_CAUSAL_DOCUMENT if causal else _c.MASK_DOCUMENT
        o.set_tensor("mask_doc_ids", _view(document_ids, "document_ids"))
    elif prefix_lengths is not None:  # prefix LM: bidirectional inside each sequence's prefix, causal after it
        o.mask_kind = _c.MASK_PREFIX_LM
        o.set_tensor("mask_prefix_lengths", _view(prefix_lengths, "prefix_lengths"))
    elif block_table is not None:  # the table tiles the [S_q, S_k] scores in block_q x block_k blocks
        o.mask_kind, o.mask_block_q, o.mask_block_k = _c.MASK_BLOCK_SPARSE, block_q, block_k
        o.set_tensor("mask_block_table", _view(block_table, "block_table"))
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
    if seed.is_cuda:
        if dropout_p > 0.0:  # (without dropout the library refuses a state it would not read)
            o.set_tensor("rng_state", _view(seed, "seed"))
    else:
        o.seed = _host_seed(seed) & ((1 << 64) - 1)
    # deterministic: the fastest deterministic reduction for the shape (recompute, or ordered at
    # D128 on long sequences); else the library's default, the fastest (atomic at D128 dense, where
    # it runs on the dQ writer; recompute wherever atomic is not faster or not taken, e.g. varlen)
    o.dq_reduction = _c.DQ_DETERMINISTIC if deterministic else _c.DQ_DEFAULT
    return o


def _host_seed(seed: Tensor) -> int:
    # a CPU int64 scalar: reading it does not touch the GPU (a device seed is [2] on the inputs'
    # device, which the library checks)
    if seed.numel() != 1:
        raise _c.TilejitArgumentError(f"tilejit_torch: seed must be a one-element CPU int64 tensor or an int64 [2] "
                                      f"[seed, offset] on the inputs' device, got {tuple(seed.shape)} on {seed.device}")
    return int(seed.item())


def _on(device: torch.device):
    # (entering torch.cuda.device costs more than the call when it is already current)
    return contextlib.nullcontext() if torch.cuda.current_device() == device.index else torch.cuda.device(device)


def _workspace(nbytes: int, device: torch.device) -> Tuple[Optional[Tensor], int]:
    if nbytes == 0:
        return None, 0
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws, ws.data_ptr()


# torch's current stream of a device as a CUstream integer: the raw getter inductor's generated code
# calls (no Stream object per call), else the public API
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: torch.device) -> int:
    return _raw_stream(device.index) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream


def _lse_shape(q: Tensor, varlen: bool) -> List[int]:
    return [q.shape[1], q.shape[0]] if varlen else [q.shape[0], q.shape[2], q.shape[1]]


def _forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                  max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int,
                  window_right: int, document_ids: Optional[Tensor], dropout_p: float, seed: Tensor,
                  deterministic: bool, alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0,
                  prefix_lengths: Optional[Tensor] = None, block_table: Optional[Tensor] = None, block_q: int = 0,
                  block_k: int = 0) -> Tuple[Tensor, Tensor]:
    # (deterministic: the backward's dQ reduction, kept for autograd; the forward is deterministic)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    varlen = cu_seqlens_q is not None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    opts = _options(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                    document_ids, dropout_p, seed, True, alibi_slopes, softcap, prefix_lengths, block_table, block_q, block_k)
    tq, tk, tv, to, tl = _view(q, "q"), _view(k, "k"), _view(v, "v"), _view(out, "out"), _view(lse, "lse")
    with _on(q.device):
        ws, ws_ptr = _workspace(_c.forward_workspace_bytes(tq, tk, opts), q.device)
        _c.forward(tq, tk, tv, to, tl, opts, _stream(q.device), ws_ptr, 0 if ws is None else ws.numel())
    return out, lse


@torch.library.custom_op("tilejit::attention_forward", mutates_args=(), device_types="cuda")
def attention_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                      max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int,
                      window_right: int, document_ids: Optional[Tensor], dropout_p: float, seed: Tensor,
                      deterministic: bool, alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0,
                      prefix_lengths: Optional[Tensor] = None, block_table: Optional[Tensor] = None, block_q: int = 0,
                      block_k: int = 0) -> Tuple[Tensor, Tensor]:
    return _forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                         window_right, document_ids, dropout_p, seed, deterministic, alibi_slopes, softcap, prefix_lengths,
                         block_table, block_q, block_k)


@attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
      document_ids, dropout_p, seed, deterministic, alibi_slopes=None, softcap=0.0, prefix_lengths=None, block_table=None,
      block_q=0, block_k=0):
    varlen = cu_seqlens_q is not None
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(_lse_shape(q, varlen), dtype=torch.float32)


def _backward_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
                   cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
                   window_left: int, window_right: int, document_ids: Optional[Tensor], dropout_p: float, seed: Tensor,
                   deterministic: bool, alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0,
                   prefix_lengths: Optional[Tensor] = None, block_table: Optional[Tensor] = None, block_q: int = 0,
                   block_k: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    q, k, v, out, dout = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(out), _unit_last(dout)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    opts = _options(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                    document_ids, dropout_p, seed, deterministic, alibi_slopes, softcap, prefix_lengths, block_table, block_q,
                    block_k)
    t = {n: _view(x, n) for n, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse), ("dq", dq),
                                     ("dk", dk), ("dv", dv))}
    with _on(q.device):
        ws, ws_ptr = _workspace(_c.backward_workspace_bytes(t["q"], t["k"], opts), q.device)
        _c.backward(t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], t["dq"], t["dk"], t["dv"], opts,
                    _stream(q.device), ws_ptr, 0 if ws is None else ws.numel())
    return dq, dk, dv


@torch.library.custom_op("tilejit::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
                       cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
                       window_left: int, window_right: int, document_ids: Optional[Tensor], dropout_p: float, seed: Tensor,
                       deterministic: bool, alibi_slopes: Optional[Tensor] = None, softcap: float = 0.0,
                       prefix_lengths: Optional[Tensor] = None, block_table: Optional[Tensor] = None, block_q: int = 0,
                       block_k: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          window_left, window_right, document_ids, dropout_p, seed, deterministic, alibi_slopes, softcap,
                          prefix_lengths, block_table, block_q, block_k)


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
      window_right, document_ids, dropout_p, seed, deterministic, alibi_slopes=None, softcap=0.0, prefix_lengths=None,
      block_table=None, block_q=0, block_k=0):
    def like(x):
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    return like(q), like(k), like(v)


try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # (then every call takes the registered ops)
    _get_current_dispatch_mode = None


def _eager(t: Tensor) -> bool:
    """Whether a call on t runs now on real tensors: not traced by torch.compile, make_fx / export or
    AOT autograd (fake, functional or proxied tensors, a dispatch mode active). Only then may it
    skip the registered op."""
    return (_get_current_dispatch_mode is not None and type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None)


def forward(*args) -> Tuple[Tensor, Tensor]:
    """attention_forward's arguments: an eager call runs the implementation directly, skipping
    torch.library's Python dispatch and the op's autograd wrapper (bench/torch_overhead.py:
    decision 053); a traced one records the registered op, which the graph then holds."""
    return _forward_impl(*args) if _eager(args[0]) else attention_forward(*args)


def backward_call(*args) -> Tuple[Tensor, Tensor, Tensor]:
    """attention_backward's arguments, as forward() does it."""
    return _backward_impl(*args) if _eager(args[0]) else attention_backward(*args)


# Autograd (also interface._Attention's): the forward's inputs after q, k, v (cu_seqlens ... block_k)
# get no gradient.
_FORWARD_EXTRA = 18


def setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, doc, p, seed, deterministic, slopes, softcap, prefix, table, bq,
     bk) = (tuple(inputs) + (None, 0.0, None, None, 0, 0)[len(inputs) - 15:])
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, doc, seed, slopes, prefix, table)
    ctx.params = (max_q, max_k, scale, causal, wl, wr, p, softcap, bq, bk)
    ctx.deterministic = deterministic


def backward(ctx, dout, dlse):
    if dout is None:  # (interface._Attention does not materialise gradients: out unused)
        return (None,) * (3 + _FORWARD_EXTRA)
    q, k, v, out, lse, cu_q, cu_k, doc, seed, slopes, prefix, table = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, p, softcap, bq, bk = ctx.params
    dq, dk, dv = backward_call(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, doc, p, seed,
                               ctx.deterministic, slopes, softcap, prefix, table, bq, bk)
    return (dq, dk, dv) + (None,) * _FORWARD_EXTRA


attention_forward.register_autograd(backward, setup_context=setup_context)


@torch.library.custom_op("tilejit::dropout_keep_mask", mutates_args=(), device_types="cuda")
def dropout_keep_mask(q: Tensor, seed: Tensor, dropout_p: float, batch: int, heads_q: int, seq_q: int, seq_k: int) -> Tensor:
    """bool [batch, heads_q, seq_q, seq_k]: which attention probabilities a call with this seed and
    dropout_p keeps (the library's generate_dropout_bits, unpacked; q gives the device). Varlen
    calls: batch = the sequence count, seq_q / seq_k = the max_seqlen's, rows and columns inside
    each sequence."""
    opts = _c.Options()
    opts.dropout_p = dropout_p
    if seed.is_cuda:
        opts.set_tensor("rng_state", _view(seed, "seed"))
    else:
        opts.seed = _host_seed(seed) & ((1 << 64) - 1)
    words = (seq_k + 31) // 32
    bits = torch.empty(batch * heads_q, seq_q, words, dtype=torch.int32, device=q.device)  # (u32 bits)
    tb = _c.Tensor.make(bits.data_ptr(), _c.U32, list(bits.shape), list(bits.stride()), q.device.index)
    with _on(q.device):
        _c.generate_dropout_bits(tb, batch, heads_q, seq_q, seq_k, opts, _stream(q.device))
    shifts = torch.arange(32, dtype=torch.int32, device=q.device)
    keep = ((bits.unsqueeze(-1) >> shifts) & 1).bool().reshape(batch * heads_q, seq_q, words * 32)[..., :seq_k]
    return keep.reshape(batch, heads_q, seq_q, seq_k).contiguous()


@dropout_keep_mask.register_fake
def _(q, seed, dropout_p, batch, heads_q, seq_q, seq_k):
    return q.new_empty((batch, heads_q, seq_q, seq_k), dtype=torch.bool)
