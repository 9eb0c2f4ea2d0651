"""Tensor dtypes by their safetensors names, the names manifests use."""

from __future__ import annotations

import numpy as np

ITEM_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

# numpy has no bfloat16 or float8: those travel as same-width unsigned ints holding the raw bits.
_NUMPY: dict[str, str] = {
    "BOOL": "bool",
    "U8": "u1",
    "I8": "i1",
    "F8_E4M3": "u1",
    "F8_E5M2": "u1",
    "I16": "<i2",
    "U16": "<u2",
    "F16": "<f2",
    "BF16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "F32": "<f4",
    "I64": "<i8",
    "U64": "<u8",
    "F64": "<f8",
}

_FROM_NUMPY: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
}


def numpy_dtype(dtype: str) -> np.dtype[np.generic]:
    """The numpy dtype that holds `dtype`'s bytes (raw bits for bf16/fp8)."""
    return np.dtype(_NUMPY[dtype])


def from_numpy(dtype: np.dtype[np.generic]) -> str:
    try:
        return _FROM_NUMPY[dtype.name]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no safetensors name") from None


def nbytes_of(dtype: str, shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * ITEM_SIZES[dtype]
