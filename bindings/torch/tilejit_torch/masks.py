"""FlexAttention-style helpers for the library's masks that fit them: create_block_table turns a
mask_mod (FlexAttention's signature) into the block table of a block-sparse mask."""
from __future__ import annotations

from typing import Callable, Tuple

import torch
from torch import Tensor


def create_block_table(mask_mod: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor], B: int, H: int, Q_LEN: int, KV_LEN: int,
                       block_size: Tuple[int, int] = (128, 128), device="cuda") -> Tensor:
    """The uint8 block table [B, H, cdiv(Q_LEN, bq), cdiv(KV_LEN, bk)] of mask_mod(b, h, q_idx,
    kv_idx) -> bool (broadcasting index tensors, as FlexAttention's create_block_mask calls it),
    for flash_attn_func(..., block_table=table, block_size=block_size). B or H = 1: a table that
    broadcasts over that dim. A block-sparse mask allows or denies whole blocks, so every block must
    be wholly allowed or wholly denied (positions past Q_LEN / KV_LEN do not count); a mask with
    partly allowed blocks raises ValueError naming one (use a library mask kind, or smaller blocks).
    Evaluates the whole [B, H, Q_LEN, KV_LEN] grid once: build it at set-up, not per step."""
    bq, bk = block_size
    if bq < 1 or bk < 1:
        raise ValueError(f"create_block_table: block_size = {block_size}; both must be >= 1")
    nq, nk = -(-Q_LEN // bq), -(-KV_LEN // bk)
    b = torch.arange(B, device=device)[:, None, None, None]
    h = torch.arange(H, device=device)[None, :, None, None]
    qi = torch.arange(Q_LEN, device=device)[None, None, :, None]
    ki = torch.arange(KV_LEN, device=device)[None, None, None, :]
    allowed = torch.as_tensor(mask_mod(b, h, qi, ki), device=device).to(torch.bool).expand(B, H, Q_LEN, KV_LEN)
    # pad to whole blocks with "don't care": False for any(), True for all()
    pad = (0, nk * bk - KV_LEN, 0, nq * bq - Q_LEN)
    as_u8 = allowed.to(torch.uint8)
    blocks_any = torch.nn.functional.pad(as_u8, pad, value=0).reshape(B, H, nq, bq, nk, bk).amax((3, 5)).bool()
    blocks_all = torch.nn.functional.pad(as_u8, pad, value=1).reshape(B, H, nq, bq, nk, bk).amin((3, 5)).bool()
    partial = blocks_any & ~blocks_all
    if bool(partial.any()):
        b0, h0, q0, k0 = (int(x) for x in partial.nonzero()[0])
        raise ValueError(f"create_block_table: block (b {b0}, h {h0}, q block {q0}, kv block {k0}) of {bq} x {bk} is partly "
                         f"allowed; a block-sparse mask allows whole blocks only (use a library mask kind or smaller blocks)")
    return blocks_any.to(torch.uint8).contiguous()
