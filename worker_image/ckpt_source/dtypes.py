"""Tensor dtypes by their safetensors names, the names manifests use, and how numpy holds them.

Every dtype safetensors 0.8 defines, by its size in bits. F4 (e2m1) and the two F6 formats pack
several values per byte, so a tensor's byte length is `numel * bits / 8`, and safetensors (like
us) refuses a shape whose bits do not fill whole bytes.
"""

from __future__ import annotations

import numpy as np

from ckpt_api.manifest import DTYPE_BITS, tensor_nbytes

# The format's table (ckpt_api.manifest), so manifests, headers and buffers agree on sizes.
BITS: dict[str, int] = DTYPE_BITS

# Bytes per element of the dtypes whose elements are whole bytes (every one but F4/F6), for
# callers that size or view elements; `nbytes_of` is the lookup that works for every dtype.
ITEM_SIZES: dict[str, int] = {name: bits // 8 for name, bits in BITS.items() if bits % 8 == 0}

PACKED: frozenset[str] = frozenset(name for name, bits in BITS.items() if bits % 8)

# numpy has no bfloat16, float8 or float4/6: those travel as unsigned ints of the same width
# holding the raw bits, and the packed ones as plain bytes.
_NUMPY: dict[str, str] = {
    "BOOL": "bool",
    "U8": "u1",
    "I8": "i1",
    "F8_E4M3": "u1",
    "F8_E5M2": "u1",
    "F8_E8M0": "u1",
    "F8_E4M3FNUZ": "u1",
    "F8_E5M2FNUZ": "u1",
    "F4": "u1",
    "F6_E2M3": "u1",
    "F6_E3M2": "u1",
    "I16": "<i2",
    "U16": "<u2",
    "F16": "<f2",
    "BF16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "F32": "<f4",
    "C64": "<c8",
    "I64": "<i8",
    "U64": "<u8",
    "F64": "<f8",
}

# Keyed by numpy's dtype name, so arrays of ml_dtypes' extension types (bfloat16, float8_*) map
# too, without importing ml_dtypes.
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
    "complex64": "C64",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
}


# The name frameworks give each dtype (torch, paddle, ml_dtypes, and safetensors' own TensorSpec):
# the numpy names above, plus F4's packed pair type. F6 has none anywhere.
FRAMEWORK_NAMES: dict[str, str] = {st: name for name, st in _FROM_NUMPY.items()} | {"F4": "float4_e2m1fn_x2"}

# The safetensors name of each dtype a paddle tensor may carry, keyed by str(tensor.dtype): a
# plain table, so publishing a paddle state dict needs no agent code and this module no paddle.
# Which of these a given paddle build really holds is the engine's question (paddle_tensors).
BY_PADDLE_NAME: dict[str, str] = {
    f"paddle.{name}": st for st, name in FRAMEWORK_NAMES.items() if st in ITEM_SIZES
}


def is_known(dtype: str) -> bool:
    return dtype in BITS


def numpy_dtype(dtype: str) -> np.dtype[np.generic]:
    """The numpy dtype that holds `dtype`'s bytes: raw bits for bf16/fp8, and bytes (uint8) for
    the packed F4/F6, whose arrays therefore have `nbytes_of` elements, not the tensor's shape."""
    return np.dtype(_NUMPY[dtype])


def from_numpy(dtype: np.dtype[np.generic]) -> str:
    try:
        return _FROM_NUMPY[dtype.name]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no safetensors name") from None


def nbytes_of(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a `dtype` tensor of `shape`; KeyError for an unknown dtype, ValueError when the
    elements of a packed dtype do not fill whole bytes."""
    return tensor_nbytes(dtype, shape)
