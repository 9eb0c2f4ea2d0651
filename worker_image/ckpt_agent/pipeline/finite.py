"""Whether a tensor's raw bytes hold NaN or Inf, per safetensors dtype, on the bits alone.

A checksum proves the bytes are the published ones, not that they are numbers: a diverged RL
step publishes NaN weights with perfectly good checksums. This looks at the bit patterns, never
converting to float (numpy has no bfloat16 or float8, and a conversion would cost a copy).

Every format here is sign-magnitude (or unsigned), so after the sign bit is dropped the
non-finite patterns are the largest magnitudes: `(bits & ~sign) >= threshold`. The scan tests
that with two read-only reductions instead of a masked temporary: the unsigned maximum reaches
`sign | threshold` only if a negative NaN/Inf is present, and the signed maximum (the same bits
viewed as signed ints) reaches `threshold` only if a positive one is. Only a block that hits is
searched element by element, through a mask of that block's size.

    IEEE-style (F64, F32, F16, BF16, F8_E5M2): exponent all ones; mantissa zero is ±Inf, else NaN.
    F8_E4M3 (e4m3fn): no Inf; NaN is exponent and mantissa all ones (S.1111.111).
    F8_E8M0 (unsigned exponent): 0xFF is NaN.
    F8_E4M3FNUZ, F8_E5M2FNUZ: no Inf, no negative zero; NaN is 0x80.
    C64: two F32 per element (a NaN in either part counts).
    F4, F6_E2M3, F6_E3M2 (OCP MX): every pattern is a finite number; integers and BOOL likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

NonFiniteKind = Literal["NaN", "+Inf", "-Inf"]

# Elements per block of the scan: small enough that the second reduction reads the block from
# L2, large enough that the per-block Python overhead stays negligible.
BLOCK_BYTES = 256 << 10


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
# The ufuncs' own reductions: `ndarray.max()` goes through a Python wrapper that costs as much
# as scanning a few KiB, once per block.
_max, _min = np.maximum.reduce, np.minimum.reduce


def _views(fmt: _Format, data: memoryview) -> tuple[np.ndarray, np.ndarray]:
    unsigned = np.frombuffer(data, dtype=_UNSIGNED[fmt.width])
    return unsigned, unsigned.view(_SIGNED[fmt.width])


def _block_hits(fmt: _Format, unsigned: np.ndarray, signed: np.ndarray) -> bool:
    if fmt.nan_is_negative_zero:
        return bool(_min(signed) == -fmt.sign)
    if fmt.sign == 0:
        return bool(_max(unsigned) >= fmt.threshold)
    return bool(_max(unsigned) >= fmt.sign | fmt.threshold or _max(signed) >= fmt.threshold)


def _first_in_block(fmt: _Format, unsigned: np.ndarray) -> int:
    if fmt.nan_is_negative_zero:
        mask = unsigned == fmt.sign
    else:
        mask = (unsigned & ~np.array(fmt.sign, dtype=unsigned.dtype)) >= fmt.threshold
    return int(np.flatnonzero(mask)[0])


def _kind(fmt: _Format, bits: int) -> NonFiniteKind:
    if not fmt.has_inf or bits & ~fmt.sign != fmt.threshold:
        return "NaN"
    return "-Inf" if bits & fmt.sign else "+Inf"


def _scan(fmt: _Format, data: memoryview) -> tuple[int, NonFiniteKind] | None:
    """The first non-finite value of `data` (whole values): (value index, kind)."""
    unsigned, signed = _views(fmt, data)
    step = max(BLOCK_BYTES // fmt.width, 1)
    for start in range(0, unsigned.size, step):
        block = unsigned[start : start + step]
        if _block_hits(fmt, block, signed[start : start + step]):
            at = _first_in_block(fmt, block)
            return start + at, _kind(fmt, int(block[at]))
    return None


def first_non_finite(dtype: str, data: memoryview | bytes) -> NonFinite | None:
    """The first NaN/Inf element of a `dtype` tensor's bytes, or None (always for dtypes that
    have no such value). `data` holds whole elements."""
    scan = FiniteScan(dtype)
    scan.update(memoryview(data))
    return scan.found


class FiniteScan:
    """Scans one tensor's bytes piece by piece, in order, as they land (while they are still in
    cache), remembering the first non-finite element. Pieces may split an element: its bytes
    are carried to the next piece. After the first hit, further pieces are not looked at."""

    def __init__(self, dtype: str) -> None:
        self._fmt = _FORMATS.get(dtype)
        self.found: NonFinite | None = None
        self._values = 0  # values scanned so far
        self._carry = b""

    def update(self, piece: memoryview) -> None:
        fmt = self._fmt
        if fmt is None or self.found is not None:
            return
        view = piece.cast("B") if piece.format != "B" or piece.ndim != 1 else piece
        if self._carry:
            need = fmt.width - len(self._carry)
            self._carry += bytes(view[:need])
            view = view[need:]
            if len(self._carry) < fmt.width:
                return
            head, self._carry = self._carry, b""
            if self._record(_scan(fmt, memoryview(head))):
                return
            self._values += 1
        whole = len(view) - len(view) % fmt.width
        if self._record(_scan(fmt, view[:whole])):
            return
        self._values += whole // fmt.width
        self._carry = bytes(view[whole:])

    def _record(self, hit: tuple[int, NonFiniteKind] | None) -> bool:
        if hit is None:
            return False
        assert self._fmt is not None
        value, kind = hit
        self.found = NonFinite((self._values + value) // self._fmt.values_per_element, kind)
        return True
