"""ckpt_agent.pipeline.finite: NaN/Inf found on the raw bits of every floating dtype, at any element,
and nothing else flagged (largest finite, subnormals, negative zero)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_agent.pipeline.finite import (
    BLOCK_BYTES,
    CHECKED_DTYPES,
    FiniteScan,
    NonFinite,
    can_hold_non_finite,
    first_non_finite,
)
from ckpt_source.dtypes import BITS, ITEM_SIZES

# (dtype, bits, expected kind or None for finite). Spelt out per format, from its definition.
PATTERNS: list[tuple[str, int, str | None]] = [
    ("F64", 0x7FF8_0000_0000_0000, "NaN"),
    ("F64", 0xFFF0_0000_0000_0001, "NaN"),
    ("F64", 0x7FF0_0000_0000_0000, "+Inf"),
    ("F64", 0xFFF0_0000_0000_0000, "-Inf"),
    ("F64", 0x7FEF_FFFF_FFFF_FFFF, None),  # largest finite
    ("F64", 0xFFEF_FFFF_FFFF_FFFF, None),
    ("F64", 0x0000_0000_0000_0001, None),  # smallest subnormal
    ("F64", 0x8000_0000_0000_0000, None),  # -0
    ("F32", 0x7FC0_0000, "NaN"),
    ("F32", 0xFFFF_FFFF, "NaN"),
    ("F32", 0x7F80_0001, "NaN"),  # signalling
    ("F32", 0x7F80_0000, "+Inf"),
    ("F32", 0xFF80_0000, "-Inf"),
    ("F32", 0x7F7F_FFFF, None),
    ("F32", 0xFF7F_FFFF, None),
    ("F32", 0x0000_0001, None),
    ("F32", 0x807F_FFFF, None),  # largest negative subnormal
    ("F32", 0x8000_0000, None),
    ("F16", 0x7E00, "NaN"),
    ("F16", 0xFC01, "NaN"),
    ("F16", 0x7C00, "+Inf"),
    ("F16", 0xFC00, "-Inf"),
    ("F16", 0x7BFF, None),
    ("F16", 0xFBFF, None),
    ("F16", 0x0001, None),
    ("F16", 0x8000, None),
    ("BF16", 0x7FC0, "NaN"),
    ("BF16", 0xFF81, "NaN"),
    ("BF16", 0x7F80, "+Inf"),
    ("BF16", 0xFF80, "-Inf"),
    ("BF16", 0x7F7F, None),
    ("BF16", 0xFF7F, None),
    ("BF16", 0x0001, None),
    ("BF16", 0x8000, None),
    ("F8_E5M2", 0x7E, "NaN"),
    ("F8_E5M2", 0xFD, "NaN"),
    ("F8_E5M2", 0x7C, "+Inf"),
    ("F8_E5M2", 0xFC, "-Inf"),
    ("F8_E5M2", 0x7B, None),  # 57344
    ("F8_E5M2", 0xFB, None),
    ("F8_E5M2", 0x01, None),
    ("F8_E5M2", 0x80, None),
    ("F8_E4M3", 0x7F, "NaN"),
    ("F8_E4M3", 0xFF, "NaN"),
    ("F8_E4M3", 0x7E, None),  # 448, the largest
    ("F8_E4M3", 0xFE, None),
    ("F8_E4M3", 0x78, None),  # exponent all ones, still finite (256) in e4m3fn
    ("F8_E4M3", 0x01, None),
    ("F8_E4M3", 0x80, None),
    ("F8_E8M0", 0xFF, "NaN"),
    ("F8_E8M0", 0xFE, None),
    ("F8_E8M0", 0x00, None),
    ("F8_E4M3FNUZ", 0x80, "NaN"),
    ("F8_E4M3FNUZ", 0x7F, None),
    ("F8_E4M3FNUZ", 0xFF, None),
    ("F8_E5M2FNUZ", 0x80, "NaN"),
    ("F8_E5M2FNUZ", 0x7F, None),
    ("F8_E5M2FNUZ", 0xFF, None),
]

# A filler value per dtype that is finite and not zero.
ONE = {
    "F64": 0x3FF0_0000_0000_0000,
    "F32": 0x3F80_0000,
    "F16": 0x3C00,
    "BF16": 0x3F80,
    "F8_E5M2": 0x3C,
    "F8_E4M3": 0x38,
    "F8_E8M0": 0x7F,
    "F8_E4M3FNUZ": 0x40,
    "F8_E5M2FNUZ": 0x40,
    "C64": 0x3F80_0000,
}


def located(found: NonFinite | None) -> tuple[int, str] | None:
    return None if found is None else (found.index, found.kind)


def tensor(dtype: str, count: int, at: dict[int, int]) -> bytes:
    width = ITEM_SIZES[dtype] // (2 if dtype == "C64" else 1)
    values = np.full(count, ONE[dtype], dtype=f"<u{width}")
    for index, bits in at.items():
        values[index] = bits
    return values.tobytes()


def test_every_float_dtype_of_the_format_is_checked() -> None:
    # Every dtype but the integers, BOOL and the OCP MX formats that have no NaN or Inf.
    floats = {d for d in BITS if not d.startswith(("I", "U", "BOOL"))} - {"F4", "F6_E2M3", "F6_E3M2"}
    assert floats == CHECKED_DTYPES
    assert {dtype for dtype, _bits, _kind in PATTERNS} | {"C64"} == CHECKED_DTYPES


@pytest.mark.parametrize(
    "dtype", ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F4", "F6_E3M2"]
)
def test_dtypes_without_nan_or_inf_always_pass(dtype: str) -> None:
    assert not can_hold_non_finite(dtype)
    assert first_non_finite(dtype, b"\xff" * 64) is None


def _count(dtype: str) -> int:
    # Enough elements to span three scan blocks, so "middle" and "last" sit in later blocks.
    return 2 * BLOCK_BYTES // (ITEM_SIZES[dtype]) + 5


@pytest.mark.parametrize(
    ("dtype", "bits", "kind"), PATTERNS, ids=lambda v: hex(v) if isinstance(v, int) else v
)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_patterns_at_first_middle_last_element(dtype: str, bits: int, kind: str | None, where: str) -> None:
    count = _count(dtype)
    index = {"first": 0, "middle": count // 2, "last": count - 1}[where]
    found = first_non_finite(dtype, tensor(dtype, count, {index: bits}))
    assert located(found) == (None if kind is None else (index, kind))


def test_the_first_of_several_is_reported() -> None:
    data = tensor("BF16", 5000, {4000: 0x7F80, 1234: 0xFFC0, 4999: 0x7FC0})
    found = first_non_finite("BF16", data)
    assert located(found) == (1234, "NaN")
    assert found is not None
    assert found.describe() == "NaN at element 1234"


@pytest.mark.parametrize(("part", "index"), [(0, 0), (1, 0), (0, 7), (1, 7)])
def test_c64_counts_complex_elements(part: int, index: int) -> None:
    values = tensor("C64", 16, {2 * index + part: 0x7F80_0000})
    found = first_non_finite("C64", values)
    assert located(found) == (index, "+Inf")


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["F64", "F32", "F16", "BF16", "F8_E5M2", "F8_E4M3"]),
    index=st.integers(0, 299),
    cuts=st.lists(st.integers(1, 2400), max_size=6),
)
def test_pieces_split_anywhere_give_the_same_answer(dtype: str, index: int, cuts: list[int]) -> None:
    """As the reader feeds a tensor: pieces that split elements, found in a later piece."""
    nan = {"F64": 0x7FF8_0000_0000_0000, "F32": 0x7FC0_0000, "F16": 0x7E00, "BF16": 0x7FC0}
    data = tensor(dtype, 300, {index: nan.get(dtype, 0x7F)})
    scan = FiniteScan(dtype)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for lo, hi in itertools.pairwise(bounds):
        scan.update(memoryview(data)[lo:hi])
    assert located(scan.found) == (index, "NaN")


def _oracle(dtype: str, raw: np.ndarray) -> np.ndarray:
    """Non-finite by numpy's own float types: the narrow formats widened bit-exactly (BF16 is
    F32's top half, F8_E5M2 is F16's)."""
    if dtype == "BF16":
        wide = (raw.astype("<u4") << 16).view("<f4")
    elif dtype == "F8_E5M2":
        wide = (raw.astype("<u2") << 8).view("<f2")
    else:
        wide = raw.view({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype])
    return ~np.isfinite(wide)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["F64", "F32", "F16", "BF16", "F8_E5M2"]), seed=st.integers(0, 2**32 - 1))
def test_random_bits_agree_with_numpy_floats(dtype: str, seed: int) -> None:
    width = ITEM_SIZES[dtype]
    raw = np.random.default_rng(seed).integers(0, 256, 64 * width, dtype=np.uint8).view(f"<u{width}")
    bad = np.flatnonzero(_oracle(dtype, raw))
    found = first_non_finite(dtype, raw.tobytes())
    assert (found.index if found else None) == (int(bad[0]) if bad.size else None)


def test_every_e4m3_byte_by_its_definition() -> None:
    # e4m3fn: NaN only where exponent and mantissa are all ones, in either sign.
    for bits in range(256):
        found = first_non_finite("F8_E4M3", bytes([bits]))
        assert (found is not None) == (bits & 0x7F == 0x7F), hex(bits)


# One non-finite pattern per kind, per checked dtype (C64 by its F32 parts).
KINDS: list[tuple[str, int, str]] = [
    (dtype, bits, kind) for dtype, bits, kind in PATTERNS if kind is not None
] + [("C64", 0x7FC0_0000, "NaN"), ("C64", 0x7F80_0000, "+Inf"), ("C64", 0xFF80_0000, "-Inf")]
# The largest finite value and the largest subnormal, both signs, per dtype whose scan has a
# fast test that could false-alarm on them (the sum of squares overflows on the former).
EXTREMES = {
    "F64": [0x7FEF_FFFF_FFFF_FFFF, 0xFFEF_FFFF_FFFF_FFFF, 0x000F_FFFF_FFFF_FFFF, 0x800F_FFFF_FFFF_FFFF],
    "F32": [0x7F7F_FFFF, 0xFF7F_FFFF, 0x007F_FFFF, 0x807F_FFFF],
    "C64": [0x7F7F_FFFF, 0xFF7F_FFFF, 0x007F_FFFF, 0x807F_FFFF],
    "F16": [0x7BFF, 0xFBFF, 0x03FF, 0x83FF],
    "BF16": [0x7F7F, 0xFF7F, 0x007F, 0x807F],
    "F8_E5M2": [0x7B, 0xFB, 0x03, 0x83],
    "F8_E4M3": [0x7E, 0xFE, 0x07, 0x87],
    "F8_E8M0": [0xFE, 0x00],
    "F8_E4M3FNUZ": [0x7F, 0xFF, 0x07],
    "F8_E5M2FNUZ": [0x7F, 0xFF, 0x03],
}


def _value_width(dtype: str) -> int:
    return ITEM_SIZES[dtype] // (2 if dtype == "C64" else 1)


def _positions(dtype: str) -> dict[str, int]:
    """Value indices: first, last, and either side of the first and second block boundary."""
    per_block = BLOCK_BYTES // _value_width(dtype)
    count = 3 * per_block
    return {
        "first": 0,
        "last": count - 1,
        "block end": per_block - 1,
        "block start": per_block,
        "second block end": 2 * per_block - 1,
        "second block start": 2 * per_block,
    }


@pytest.mark.parametrize(("dtype", "bits", "kind"), KINDS, ids=lambda v: hex(v) if isinstance(v, int) else v)
@pytest.mark.parametrize(
    "where", ["first", "last", "block end", "block start", "second block end", "second block start"]
)
def test_every_kind_in_every_dtype_at_the_edges_among_extremes(
    dtype: str, bits: int, kind: str, where: str
) -> None:
    """The fast tests (two reductions, the sum of squares) over blocks of the largest finite
    values and subnormals: the one NaN/Inf is found wherever it sits, fed whole or in pieces
    that cut elements at odd offsets, as the hashing pass feeds them."""
    positions = _positions(dtype)
    count = positions["last"] + 1
    extremes = EXTREMES[dtype]
    values = np.resize(np.array(extremes, dtype=f"<u{_value_width(dtype)}"), count)
    values[positions[where]] = bits
    data = values.tobytes()
    expected = (positions[where] // (2 if dtype == "C64" else 1), kind)
    assert located(first_non_finite(dtype, data)) == expected
    scan = FiniteScan(dtype)
    hashed = bytearray()
    view = memoryview(data)
    for lo, hi in itertools.pairwise([0, 3, BLOCK_BYTES + 5, len(data) - 1, len(data)]):
        scan.update(view[lo:hi], hashed.extend)
    assert located(scan.found) == expected
    assert hashed == data  # every byte handed to the hash, in order, before and after the hit


@pytest.mark.parametrize("dtype", sorted(EXTREMES))
def test_blocks_of_extreme_finite_values_pass(dtype: str) -> None:
    # Three blocks of the largest finite values: their squares overflow F32/F64, the exact
    # search must settle that false alarm and report nothing.
    count = 3 * BLOCK_BYTES // _value_width(dtype)
    values = np.resize(np.array(EXTREMES[dtype], dtype=f"<u{_value_width(dtype)}"), count)
    assert first_non_finite(dtype, values.tobytes()) is None


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_each_block_sees_the_piece_in_blocks_of_at_most_block_bytes(dtype: str) -> None:
    data = tensor(dtype, 3 * BLOCK_BYTES // ITEM_SIZES[dtype], {7: 0x7F80_0000 if dtype == "F32" else 0x7F80})
    sizes: list[int] = []
    scan = FiniteScan(dtype)
    scan.update(memoryview(data), lambda block: sizes.append(block.nbytes))
    assert sizes == [BLOCK_BYTES] * 3
    assert located(scan.found) == (7, "+Inf")


def test_each_block_sees_pieces_of_unchecked_dtypes_whole() -> None:
    seen: list[bytes] = []
    FiniteScan("I32").update(memoryview(b"\xff" * 12), lambda block: seen.append(bytes(block)))
    assert seen == [b"\xff" * 12]
