"""The one safetensors header encoder and the strict header reader, against the library."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import deserialize, safe_open
from safetensors.numpy import save_file

from ckpt_source.dtypes import BITS
from ckpt_source.safetensors_format import (
    encode_header,
    read_header,
    read_header_with_metadata,
    write_file,
)


def _tensors() -> list[tuple[str, str, tuple[int, ...], bytes]]:
    rng = np.random.default_rng(3)
    out = []
    for i, (dtype, bits) in enumerate(BITS.items()):
        shape = (2, 4 * (i % 3 + 1))  # element counts that fill whole bytes at every width
        out.append((f"t{i}.{dtype}", dtype, shape, rng.bytes(2 * shape[1] * bits // 8)))
    return out


def test_encode_header_is_what_the_library_reads(tmp_path: Path) -> None:
    tensors = _tensors()
    prefix, offsets = encode_header([(n, d, s, len(b)) for n, d, s, b in tensors])
    (header_len,) = struct.unpack("<Q", prefix[:8])
    assert len(prefix) == 8 + header_len
    assert len(prefix) % 8 == 0, "the data section starts 8-byte aligned"
    assert offsets == list(np.cumsum([0, *(len(b) for *_, b in tensors)])[:-1])
    path = tmp_path / "all.safetensors"
    path.write_bytes(prefix + b"".join(b for *_, b in tensors))
    by_library = dict(deserialize(path.read_bytes()))
    for name, dtype, shape, data in tensors:
        got = by_library[name]
        assert (got["dtype"], tuple(got["shape"]), bytes(got["data"])) == (dtype, shape, data), name
    with safe_open(str(path), "numpy") as f:
        assert sorted(f.keys()) == sorted(n for n, *_ in tensors)
    stored = read_header(path)
    assert [(t.name, t.dtype, t.shape, t.offset, t.nbytes) for t in stored] == [
        (n, d, s, len(prefix) + off, len(b)) for (n, d, s, b), off in zip(tensors, offsets, strict=True)
    ]


def test_metadata_is_written_and_read_back(tmp_path: Path) -> None:
    prefix, _ = encode_header([("w", "F32", (1,), 4)], metadata={"format": "pt"})
    path = tmp_path / "m.safetensors"
    path.write_bytes(prefix + b"\0" * 4)
    with safe_open(str(path), "numpy") as f:
        assert f.metadata() == {"format": "pt"}
    assert read_header_with_metadata(path)[1] == {"format": "pt"}


@pytest.mark.parametrize(
    ("tensors", "fragment"),
    [
        ([("w", "F32", (2,), 4)], "4 bytes do not match F32[2]"),
        ([("w", "F4", (3,), 2)], "not a whole number of bytes"),
        ([("w", "F33", (1,), 4)], "unknown dtype 'F33'"),
        ([("w", "U8", (1,), 1), ("w", "U8", (1,), 1)], "appears twice"),
    ],
)
def test_encode_header_refuses_what_no_reader_would_accept(
    tensors: list[tuple[str, str, tuple[int, ...], int]], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        encode_header(tensors)


def test_write_file_places_tensors_after_its_own_header(tmp_path: Path) -> None:
    out = io.BytesIO()
    out.write(b"xx")  # offsets are relative to where writing started
    placed = write_file(out, [("a", "U8", (3,), memoryview(b"abc")), ("b", "BF16", (1,), memoryview(b"de"))])
    raw = out.getvalue()[2:]
    assert [raw[p.offset : p.offset + p.nbytes] for p in placed] == [b"abc", b"de"]
    path = tmp_path / "w.safetensors"
    path.write_bytes(raw)
    assert [(t.name, t.offset) for t in read_header(path)] == [(p.name, p.offset) for p in placed]


def _raw_file(path: Path, header: dict[str, Any], data: bytes, *, header_len: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize(
    ("header", "data", "header_len", "fragment"),
    [
        ({"a": _entry("U8", [2], 0, 2)}, b"\0\0", 1000, "runs past the end of the file"),
        ({"a": _entry("F32", [3], 0, 8)}, b"\0" * 8, None, "F32[3] needs 12"),
        ({"a": _entry("F99", [2], 0, 2)}, b"\0\0", None, "unsupported dtype 'F99'"),
        ({"a": _entry("F6_E2M3", [3], 0, 3)}, b"\0" * 3, None, "not a whole number of bytes"),
        ({"a": _entry("U8", [4], 0, 4), "b": _entry("U8", [2], 2, 4)}, b"\0" * 4, None, "overlaps"),
        (
            {"a": _entry("U8", [2], 0, 2), "b": _entry("U8", [2], 4, 6)},
            b"\0" * 6,
            None,
            "belong to no tensor",
        ),
        ({"a": _entry("U8", [2], 0, 2)}, b"\0" * 5, None, "after the last tensor"),
        ({"a": _entry("U8", [8], 0, 8)}, b"\0" * 4, None, "past the end of the file"),
        ({"a": _entry("U8", [-1], 0, 0)}, b"", None, "shape"),
        ({"a": _entry("U8", [1], 0, 1), "__metadata__": {"k": 1}}, b"\0", None, "__metadata__"),
        ({"a": {"dtype": "U8", "shape": [1]}}, b"\0", None, "data_offsets"),
    ],
)
def test_read_header_is_strict_and_names_the_file(
    tmp_path: Path, header: dict[str, Any], data: bytes, header_len: int | None, fragment: str
) -> None:
    path = _raw_file(tmp_path / "bad.safetensors", header, data, header_len=header_len)
    with pytest.raises(ValueError, match=r"^bad\.safetensors: ") as info:
        read_header(path)
    assert fragment in str(info.value)


def test_read_header_of_a_file_the_numpy_binding_wrote(tmp_path: Path) -> None:
    path = tmp_path / "np.safetensors"
    save_file({"x": np.arange(6, dtype=np.int16).reshape(2, 3), "y": np.ones(1, np.float64)}, str(path))
    stored = {t.name: t for t in read_header(path)}
    raw = path.read_bytes()
    x = stored["x"]
    assert (x.dtype, x.shape) == ("I16", (2, 3))
    assert raw[x.offset : x.offset + x.nbytes] == np.arange(6, dtype="<i2").tobytes()


@pytest.mark.parametrize("content", [b"", b"1234567", b"\xff" * 8 + b"{}"])
def test_garbage_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "g.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"^g\.safetensors: "):
        read_header(path)
