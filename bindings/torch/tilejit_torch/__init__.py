"""tilejit from PyTorch (issue 25): FlashAttention forward and backward as torch.library ops
(`torch.ops.tilejit.attention_forward` / `attention_backward`) with fake implementations and
autograd, and flash-attn-style functions. Loads libtilejit_c (bindings/c) through ctypes: no
compiled extension, no libtorch ABI dependence.
"""
from ._c import TilejitArgumentError, TilejitDeviceError, TilejitError, version
from .interface import flash_attn_func, flash_attn_varlen_func
from .masks import create_block_table
from . import ops

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "create_block_table", "ops", "version", "TilejitError",
           "TilejitArgumentError", "TilejitDeviceError"]
__version__ = "0.1.0"
