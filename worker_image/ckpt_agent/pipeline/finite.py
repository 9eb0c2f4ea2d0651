"""Whether a tensor's raw bytes hold NaN or Inf, per safetensors dtype, on the bits alone.

A checksum proves the bytes are the published ones, not that they are numbers: a diverged RL
step publishes NaN weights with perfectly good checksums. This looks at the bit patterns, never
converting to float (numpy has no bfloat16 or float8, and a conversion would cost a copy).

Every format here is sign-magnitude (or unsigned), so after the sign bit is dropped the
non-finite patterns are the largest magnitudes: `(bits & ~sign) >= threshold`. The scan tests
that with two read-only reductions instead of a masked temporary: the unsigned maximum reaches
`sign | threshold` only if a negative NaN/Inf is present, and the signed maximum (the same bits
viewed as signed ints) reaches `threshold` only if a positive one is. F32 and F64 (C64's parts
too) take one pass instead: the block's sum of squares through BLAS, which is not finite when a
value is NaN or ±Inf (every term is >= 0, so nothing cancels) and otherwise only when it
overflows (values beyond ~1e19 in F32), a false alarm the exact search settles. Only a block that
hits is searched element by element, through a mask of that block's size.

    IEEE-style (F64, F32, F16, BF16, F8_E5M2): exponent all ones; mantissa zero is ±Inf, else NaN.
    F8_E4M3 (e4m3fn): no Inf; NaN is exponent and mantissa all ones (S.1111.111).
    F8_E8M0 (unsigned exponent): 0xFF is NaN.
    F8_E4M3FNUZ, F8_E5M2FNUZ: no Inf, no negative zero; NaN is 0x80.
    C64: two F32 per element (a NaN in either part counts).
    F4, F6_E2M3, F6_E3M2 (OCP MX): every pattern is a finite number; integers and BOOL likewise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

NonFiniteKind = Literal["NaN", "+Inf", "-Inf"]

# Bytes per block of the scan: the hash reads a block, then the scan reads it again from cache.
# Measured on a loaded 2-core machine (#33), 512 KiB cost the least: smaller blocks pay more
# per-call overhead than cache misses save.
BLOCK_BYTES = 512 << 10


@dataclass(frozen=True)
class _Format:
    width: int  # bytes per value
    sign: int  # the sign bit (0: unsigned)
    threshold: int  # the smallest non-finite magnitude
    has_inf: bool
    nan_is_negative_zero: bool = False  # FNUZ: 0x80 is the only NaN
    values_per_element: int = 1  # C64: two F32


_F32 = _Format(4, 0x8000_0000, 0x7F80_0000, True)
_FORMATS: dict[str, _Format] = {
    "F64": _Format(8, 0x8000_0000_0000_0000, 0x7FF0_0000_0000_0000, True),
    "F32": _F32,
    "F16": _Format(2, 0x8000, 0x7C00, True),
    "BF16": _Format(2, 0x8000, 0x7F80, True),
    "F8_E5M2": _Format(1, 0x80, 0x7C, True),
    "F8_E4M3": _Format(1, 0x80, 0x7F, False),
    "F8_E8M0": _Format(1, 0, 0xFF, False),
    "F8_E4M3FNUZ": _Format(1, 0x80, 0x80, False, nan_is_negative_zero=True),
    "F8_E5M2FNUZ": _Format(1, 0x80, 0x80, False, nan_is_negative_zero=True),
    "C64": _Format(4, 0x8000_0000, 0x7F80_0000, True, values_per_element=2),
}

CHECKED_DTYPES: frozenset[str] = frozenset(_FORMATS)


def can_hold_non_finite(dtype: str) -> bool:
    """Whether some bit pattern of `dtype` is NaN or Inf (else the scan has nothing to do)."""
    return dtype in _FORMATS


@dataclass(frozen=True)
class NonFinite:
    index: int  # element index in the flattened tensor
    kind: NonFiniteKind

    def describe(self) -> str:
        return f"{self.kind} at element {self.index}"


_UNSIGNED = {width: np.dtype(f"<u{width}") for width in (1, 2, 4, 8)}
_SIGNED = {width: np.dtype(f"<i{width}") for width in (1, 2, 4, 8)}
_FLOAT: dict[int, np.dtype[np.floating]] = {4: np.dtype("<f4"), 8: np.dtype("<f8")}
# The ufuncs' own reductions: `ndarray.max()` goes through a Python wrapper that costs as much
# as scanning a few KiB, once per block.
_max, _min = np.maximum.reduce, np.minimum.reduce
_isfinite = np.isfinite


def _bits_suspect(fmt: _Format) -> Callable[[np.ndarray], bool]:
    """The exact block test on the bits: two read-only reductions (see the module doc)."""
    signed_dtype = _SIGNED[fmt.width]
    if fmt.nan_is_negative_zero:
        nan = -fmt.sign
        return lambda block: bool(_min(block.view(signed_dtype)) == nan)
    if fmt.sign == 0:
        return lambda block: bool(_max(block) >= fmt.threshold)
    negative, positive = fmt.sign | fmt.threshold, fmt.threshold
    return lambda block: bool(_max(block) >= negative or _max(block.view(signed_dtype)) >= positive)


def _square_sum_suspect(fmt: _Format) -> Callable[[np.ndarray], bool]:
    """F32/F64 (and C64's parts), in one BLAS pass: the sum of squares is finite unless some
    value is NaN or ±Inf, or the sum overflows. Every term is >= 0, +Inf or NaN, so nothing
    cancels (no Inf - Inf); an overflow is only a false alarm, settled by the exact search."""
    float_dtype = _FLOAT[fmt.width]

    def suspect(block: np.ndarray) -> bool:
        values = block.view(float_dtype)
        return not _isfinite(values.dot(values))

    return suspect


def _suspect_for(fmt: _Format) -> Callable[[np.ndarray], bool]:
    return _square_sum_suspect(fmt) if fmt.width in _FLOAT and fmt.sign else _bits_suspect(fmt)


def _first_in_block(fmt: _Format, unsigned: np.ndarray) -> int | None:
    if fmt.nan_is_negative_zero:
        mask = unsigned == fmt.sign
    else:
        mask = (unsigned & ~np.array(fmt.sign, dtype=unsigned.dtype)) >= fmt.threshold
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _kind(fmt: _Format, bits: int) -> NonFiniteKind:
    if not fmt.has_inf or bits & ~fmt.sign != fmt.threshold:
        return "NaN"
    return "-Inf" if bits & fmt.sign else "+Inf"


def first_non_finite(dtype: str, data: memoryview | bytes) -> NonFinite | None:
    """The first NaN/Inf element of a `dtype` tensor's bytes, or None (always for dtypes that
    have no such value). `data` holds whole elements."""
    scan = FiniteScan(dtype)
    scan.update(memoryview(data))
    return scan.found


class FiniteScan:
    """Scans one tensor's bytes piece by piece, in order, as they land, remembering the first
    non-finite element. Pieces may split an element: its bytes are carried to the next piece.
    After the first hit, further pieces are not looked at.

    `update(piece, each_block)` is the pass that hashes too: it hands each BLOCK_BYTES block of
    the piece to `each_block` (the hasher's update) and scans the block right after, while the
    hash has just pulled it into cache, so each byte comes from memory once."""

    def __init__(self, dtype: str) -> None:
        self._fmt = _FORMATS.get(dtype)
        self._suspect = None if self._fmt is None else _suspect_for(self._fmt)
        self.found: NonFinite | None = None
        self._values = 0  # values scanned so far
        self._carry = b""

    def update(self, piece: memoryview, each_block: Callable[[memoryview], object] | None = None) -> None:
        view = piece.cast("B") if piece.format != "B" or piece.ndim != 1 else piece
        fmt = self._fmt
        if fmt is None or self.found is not None:
            if each_block is not None:
                each_block(view)
            return
        start = self._complete_carry(fmt, view)
        if start is None:  # the piece ended inside the carried element, or that element hit
            if each_block is not None:
                each_block(view)
            return
        whole_end = start + (len(view) - start) // fmt.width * fmt.width
        self._carry = bytes(view[whole_end:])
        values = np.frombuffer(view[start:whole_end], dtype=_UNSIGNED[fmt.width])
        first = self._values
        self._values += values.size
        # Values are scanned with the block their last byte lies in.
        done = 0
        for block_start in range(0, len(view), BLOCK_BYTES):
            block_end = min(block_start + BLOCK_BYTES, len(view))
            if each_block is not None:
                each_block(view[block_start:block_end])
            upto = max(min(block_end, whole_end) - start, 0) // fmt.width
            if self.found is None and upto > done:
                self._scan(fmt, values[done:upto], first + done)
            done = upto

    def _complete_carry(self, fmt: _Format, view: memoryview) -> int | None:
        """Scans the element split by the previous piece once `view` completes it: the offset in
        `view` where whole elements start, or None when the piece ended first or that one hit."""
        if not self._carry:
            return 0
        need = fmt.width - len(self._carry)
        self._carry += bytes(view[:need])
        if len(self._carry) < fmt.width:
            return None
        head, self._carry = self._carry, b""
        self._scan(fmt, np.frombuffer(head, dtype=_UNSIGNED[fmt.width]), self._values)
        self._values += 1
        return None if self.found is not None else need

    def _scan(self, fmt: _Format, block: np.ndarray, first_value: int) -> None:
        assert self._suspect is not None
        if not block.size or not self._suspect(block):
            return
        at = _first_in_block(fmt, block)
        if at is None:  # a false alarm of the fast test (a sum of squares that overflowed)
            return
        value = first_value + at
        self.found = NonFinite(value // fmt.values_per_element, _kind(fmt, int(block[at])))
