"""ctypes over libtilejit_c (bindings/c/tilejit_c.h): the structs, the calls, errors as exceptions.

No torch here: this layer is tested on machines without torch (tests/test_c_layer.py, ctest
`torch_binding_c_layer`). The library is found, in order, at $TILEJIT_C_LIBRARY, next to this
package, then by the dynamic loader's search (LD_LIBRARY_PATH, the system paths).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional, Sequence

ABI_VERSION = 4  # TILEJIT_C_ABI_VERSION of the header these structs restate

# tilejit_status
OK, INVALID_ARGUMENT, DEVICE_ERROR, ERROR = 0, 1, 2, 3
# tilejit_dtype (ir::DType's values)
I32, I64, U8, U32, U64, F16, BF16, F32 = 3, 4, 5, 7, 8, 9, 10, 11
# tilejit_mask_kind
MASK_FULL, MASK_CAUSAL, MASK_SLIDING_WINDOW, MASK_CAUSAL_SLIDING_WINDOW = 0, 1, 2, 3
MASK_DOCUMENT, MASK_CAUSAL_DOCUMENT, MASK_PREFIX_LM, MASK_BLOCK_SPARSE = 5, 6, 7, 10
# tilejit_dq_reduction
DQ_DETERMINISTIC, DQ_DEFAULT, DQ_RECOMPUTE, DQ_ATOMIC, DQ_SPLIT, DQ_ORDERED = -2, -1, 0, 1, 2, 3


class TilejitError(RuntimeError):
    """A failed tilejit call: the library's one-line message (function, argument, value, what is valid)."""


class TilejitArgumentError(TilejitError, ValueError):
    """A bad argument (TILEJIT_INVALID_ARGUMENT): nothing ran."""


class TilejitDeviceError(TilejitError):
    """No GPU, or a CUDA driver / launch failure (TILEJIT_DEVICE_ERROR)."""


class Tensor(ctypes.Structure):
    """tilejit_tensor: a device tensor view (sizes and strides in elements)."""

    _fields_ = [
        ("data", ctypes.c_uint64),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
        ("device", ctypes.c_int32),
    ]

    @classmethod
    def make(cls, data: int, dtype: int, sizes: Sequence[int], strides: Sequence[int], device: int) -> "Tensor":
        if not 1 <= len(sizes) <= 4 or len(strides) != len(sizes):
            raise TilejitArgumentError(f"tilejit_torch: a tensor of rank {len(sizes)} (sizes {list(sizes)}); valid ranks are 1..4")
        # (one constructor call: setting the fields one by one cost ~2.5 us a tensor)
        return cls(data, dtype, len(sizes), _Dims(*sizes), _Dims(*strides), device)


_TensorP = ctypes.POINTER(Tensor)
_Dims = ctypes.c_int64 * 4


class Options(ctypes.Structure):
    """tilejit_attention_options, field for field (tilejit_attention_options_init fills the defaults)."""

    _fields_ = [
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("cu_seqlens_q", _TensorP),
        ("cu_seqlens_k", _TensorP),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("dropout_p", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("dropout_mask", _TensorP),
        ("dropout_bits", _TensorP),
        ("mask_kind", ctypes.c_int32),
        ("mask_window_left", ctypes.c_int64),
        ("mask_window_right", ctypes.c_int64),
        ("mask_global_tokens", ctypes.c_int64),
        ("mask_block_q", ctypes.c_int64),
        ("mask_block_k", ctypes.c_int64),
        ("mask_doc_ids", _TensorP),
        ("mask_prefix_lengths", _TensorP),
        ("mask_block_table", _TensorP),
        ("score_mod", ctypes.c_int32),
        ("alibi_slopes", _TensorP),
        ("softcap", ctypes.c_float),
        ("dq_reduction", ctypes.c_int32),
        ("q_descending", ctypes.c_int32),
        ("block_mask", ctypes.c_void_p),
        ("rng_state", _TensorP),
    ]

    def __init__(self) -> None:
        super().__init__()
        library().tilejit_attention_options_init(ctypes.byref(self))
        self._keep: list = []  # tensors the pointers above refer to

    def set_tensor(self, field: str, t: Optional[Tensor]) -> None:
        if t is None:
            setattr(self, field, None)
            return
        self._keep.append(t)
        setattr(self, field, ctypes.pointer(t))


_lib: Optional[ctypes.CDLL] = None
_lock = threading.Lock()


def _candidates() -> list:
    env = os.environ.get("TILEJIT_C_LIBRARY")
    if env:
        return [env]  # an explicit path is the only one tried: a wrong one is an error, not a fallback
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtilejit_c.so")
    return [here, "libtilejit_c.so"]


def library() -> ctypes.CDLL:
    """libtilejit_c, loaded once; its ABI version must be ABI_VERSION."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                errors.append(f"{path}: no such file")
                continue
            try:
                lib = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        else:
            raise OSError("tilejit_torch: cannot load libtilejit_c (set TILEJIT_C_LIBRARY to its path, or put it on "
                          "LD_LIBRARY_PATH): " + "; ".join(errors))
        _declare(lib)
        got = lib.tilejit_c_abi_version()
        if got != ABI_VERSION:
            raise OSError(f"tilejit_torch: libtilejit_c at {lib._name} has C ABI version {got}; this package needs "
                          f"{ABI_VERSION} (install the package and the library of one tilejit version)")
        _lib = lib
        return lib


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    T, O = _TensorP, c.POINTER(Options)
    lib.tilejit_attention_options_init.argtypes, lib.tilejit_attention_options_init.restype = [O], None
    lib.tilejit_version.argtypes, lib.tilejit_version.restype = [], c.c_char_p
    lib.tilejit_c_abi_version.argtypes, lib.tilejit_c_abi_version.restype = [], c.c_int
    lib.tilejit_last_error.argtypes, lib.tilejit_last_error.restype = [], c.c_char_p
    lib.tilejit_attention_forward.argtypes = [T, T, T, T, T, O, c.c_uint64, c.c_uint64, c.c_size_t]
    lib.tilejit_attention_backward.argtypes = [T, T, T, T, T, T, T, T, T, O, c.c_uint64, c.c_uint64, c.c_size_t]
    lib.tilejit_attention_forward_workspace_bytes.argtypes = [T, T, O, c.POINTER(c.c_size_t)]
    lib.tilejit_attention_backward_workspace_bytes.argtypes = [T, T, O, c.POINTER(c.c_size_t)]
    lib.tilejit_attention_check_forward.argtypes = [T, T, T, T, T, O]
    lib.tilejit_attention_prepare.argtypes = [c.c_int32] * 9
    lib.tilejit_generate_dropout_bits.argtypes = [T, c.c_int64, c.c_int64, c.c_int64, c.c_int64, O, c.c_uint64, c.c_int32]
    for f in ("tilejit_attention_forward", "tilejit_attention_backward", "tilejit_attention_forward_workspace_bytes",
              "tilejit_attention_backward_workspace_bytes", "tilejit_attention_check_forward", "tilejit_attention_prepare",
              "tilejit_generate_dropout_bits"):
        getattr(lib, f).restype = c.c_int


def check(status: int) -> None:
    """Raises the library's last error for a failed status."""
    if status == OK:
        return
    message = library().tilejit_last_error().decode("utf-8", "replace")
    cls = {INVALID_ARGUMENT: TilejitArgumentError, DEVICE_ERROR: TilejitDeviceError}.get(status, TilejitError)
    raise cls(message)


def version() -> str:
    return library().tilejit_version().decode()


def _p(t: Optional[Tensor]):
    return ctypes.byref(t) if t is not None else None


def forward_workspace_bytes(q: Tensor, k: Tensor, opts: Options) -> int:
    n = ctypes.c_size_t(0)
    check(library().tilejit_attention_forward_workspace_bytes(_p(q), _p(k), ctypes.byref(opts), ctypes.byref(n)))
    return n.value


def backward_workspace_bytes(q: Tensor, k: Tensor, opts: Options) -> int:
    n = ctypes.c_size_t(0)
    check(library().tilejit_attention_backward_workspace_bytes(_p(q), _p(k), ctypes.byref(opts), ctypes.byref(n)))
    return n.value


def check_forward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, opts: Options) -> None:
    check(library().tilejit_attention_check_forward(_p(q), _p(k), _p(v), _p(o), _p(lse), ctypes.byref(opts)))


def forward(q, k, v, o, lse, opts: Options, stream: int, workspace: int, workspace_bytes: int) -> None:
    check(library().tilejit_attention_forward(_p(q), _p(k), _p(v), _p(o), _p(lse), ctypes.byref(opts), stream, workspace,
                                              workspace_bytes))


def backward(q, k, v, o, dout, lse, dq, dk, dv, opts: Options, stream: int, workspace: int, workspace_bytes: int) -> None:
    check(library().tilejit_attention_backward(_p(q), _p(k), _p(v), _p(o), _p(dout), _p(lse), _p(dq), _p(dk), _p(dv),
                                               ctypes.byref(opts), stream, workspace, workspace_bytes))


def generate_dropout_bits(bits: Tensor, batch: int, heads_q: int, seq_q: int, seq_k: int, opts: Options, stream: int) -> None:
    """The packed keep-mask (u32 [batch * heads_q, seq_q, cdiv(seq_k, 32)]) of calls with these options."""
    check(library().tilejit_generate_dropout_bits(_p(bits), batch, heads_q, seq_q, seq_k, ctypes.byref(opts), stream, 0))
