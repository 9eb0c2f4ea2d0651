"""Paddle tensors to and from raw safetensors bytes, bit for bit (imports paddle: load lazily).

Bytes are written through a uint8 view of the destination tensor, never through a numpy array
of a "holder" dtype: paddle reads numpy uint16 as bfloat16 bits and has no float8 numpy type, so
a value conversion anywhere on the way would silently change weights. Which dtypes paddle really
holds is found by a round trip through these same functions, once per process: a paddle build
whose kernels lack a dtype (paddle 3.3's uint16/32/64) refuses it instead of failing mid-apply.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle

from ckpt_source.dtypes import BY_PADDLE_NAME, FRAMEWORK_NAMES, ITEM_SIZES

# Every dtype a framework names is a candidate; which ones this paddle really holds is found by
# trying (`supported_dtypes`): F8_E8M0, the FNUZ float8s and F4 have no paddle dtype at all.
_CANDIDATES: dict[str, str] = {st: name for st, name in FRAMEWORK_NAMES.items() if st in ITEM_SIZES}


def paddle_dtype(dtype: str) -> Any:
    """The paddle dtype for a safetensors dtype name; KeyError if paddle has none."""
    found = getattr(paddle, _CANDIDATES[dtype], None)
    if found is None:
        raise KeyError(dtype)
    return found


def safetensors_dtype(tensor: Any) -> str:
    """The safetensors name of a paddle tensor's dtype; KeyError for one safetensors lacks."""
    return BY_PADDLE_NAME[str(tensor.dtype)]


def write_bytes(tensor: Any, data: memoryview | bytes) -> None:
    """Overwrite `tensor`'s storage with `data` (exactly its byte size), no value conversion."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.nbytes != tensor.size * tensor.element_size():
        raise ValueError(f"{raw.nbytes} bytes for a {tensor.dtype}{list(tensor.shape)} tensor")
    if raw.nbytes == 0:
        return
    if tensor.ndim == 0:
        # A 0-d tensor has no last axis to view as bytes: build the value and copy it (one element).
        tensor.set_value(paddle.to_tensor(raw).view(tensor.dtype).reshape([]))
        return
    view = tensor.view(paddle.uint8)  # shares the storage: writing it writes the tensor
    view.set_value(raw.reshape(view.shape))


def read_bytes(tensor: Any) -> memoryview:
    """A copy of `tensor`'s bytes (paddle's numpy export keeps the bits: bf16 as uint16, float8
    as int8)."""
    array = np.ascontiguousarray(tensor.numpy())
    return array.reshape(-1).view(np.uint8).data


def tensor_from_bytes(dtype: str, shape: Sequence[int], data: memoryview | bytes) -> Any:
    tensor = paddle.zeros(list(shape), dtype=paddle_dtype(dtype))
    write_bytes(tensor, data)
    return tensor


def _round_trips(dtype: str) -> bool:
    width = ITEM_SIZES[dtype]
    try:
        for shape in ((3,), ()):
            count = math.prod(shape)
            # Values every dtype can hold as they are (bool: 0/1; float8: no NaN patterns).
            raw = (np.arange(count * width) % 2).astype(np.uint8).tobytes()
            tensor = tensor_from_bytes(dtype, shape, raw)
            if safetensors_dtype(tensor) != dtype or bytes(read_bytes(tensor)) != raw:
                return False
    except Exception:  # a dtype without kernels fails in whichever op lacks one
        return False
    return True


@functools.cache
def supported_dtypes() -> frozenset[str]:
    """The safetensors dtypes this paddle build holds byte-exact."""
    return frozenset(name for name in _CANDIDATES if _round_trips(name))
