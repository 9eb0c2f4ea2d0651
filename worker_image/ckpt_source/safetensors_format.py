"""The safetensors layout: reading headers to find tensor bytes, and the one header encoder.

A file is: u64 little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {...}}`, then the data
section; offsets are relative to its start and, as the safetensors library requires, tile it
exactly (no gap, no overlap, no trailing byte). Publishing and staging need byte ranges, not
tensors (numpy has no bf16/fp8/fp4 dtypes), so we read headers ourselves and then let the library
open the file too: it is the reference for what a loader will accept.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from safetensors import SafetensorError, safe_open

from ckpt_source.dtypes import is_known, nbytes_of

# The safetensors library refuses longer headers; so do we, before reading one into memory.
MAX_HEADER_BYTES = 100_000_000
_ALIGN = 8  # safetensors pads its header so the data section starts 8-byte aligned


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute, from the start of the file
    nbytes: int


def encode_header(
    tensors: Sequence[tuple[str, str, tuple[int, ...], int]],
    *,
    metadata: Mapping[str, str] | None = None,
) -> tuple[bytes, list[int]]:
    """The prefix of a safetensors file holding `tensors` — (name, dtype, shape, nbytes) packed in
    this order — and each tensor's offset from the start of the data section.

    The prefix is the 8-byte length plus the JSON header padded with spaces to 8-byte alignment,
    as the safetensors library writes it. ValueError when a byte count does not match its dtype
    and shape, or a name repeats.
    """
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = dict(metadata)
    offsets: list[int] = []
    cursor = 0
    for name, dtype, shape, nbytes in tensors:
        if name in doc:
            raise ValueError(f"tensor {name!r} appears twice in one file")
        if not is_known(dtype):
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
        if nbytes != nbytes_of(dtype, shape):
            raise ValueError(f"tensor {name!r}: {nbytes} bytes do not match {dtype}{list(shape)}")
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [cursor, cursor + nbytes]}
        offsets.append(cursor)
        cursor += nbytes
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw, offsets


def write_file(
    out: BinaryIO, tensors: Iterable[tuple[str, str, tuple[int, ...], memoryview]]
) -> list[StoredTensor]:
    """Write one safetensors file at `out`'s position; returns where each tensor landed (offsets
    from that position)."""
    items = list(tensors)
    prefix, offsets = encode_header([(name, dtype, shape, data.nbytes) for name, dtype, shape, data in items])
    out.write(prefix)
    placed = []
    for (name, dtype, shape, data), offset in zip(items, offsets, strict=True):
        placed.append(StoredTensor(name, dtype, shape, len(prefix) + offset, data.nbytes))
        out.write(data)
    return placed


class _Bad(ValueError):
    pass


def _tensor(name: str, info: object, data_start: int, size: int) -> StoredTensor:
    if not isinstance(info, dict):
        raise _Bad(f"tensor {name!r}: header entry is not an object")
    dtype, raw_shape, raw_offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or not is_known(dtype):
        raise _Bad(f"tensor {name!r} has unsupported dtype {dtype!r}")
    if not isinstance(raw_shape, list) or not all(_is_count(d) for d in raw_shape):
        raise _Bad(f"tensor {name!r}: shape {raw_shape!r} is not a list of non-negative integers")
    shape = tuple(raw_shape)
    if not (isinstance(raw_offsets, list) and len(raw_offsets) == 2 and all(map(_is_count, raw_offsets))):
        raise _Bad(f"tensor {name!r}: data_offsets {raw_offsets!r} are not two non-negative integers")
    begin, end = raw_offsets
    try:
        expected = nbytes_of(dtype, shape)
    except ValueError as exc:
        raise _Bad(f"tensor {name!r}: {exc}") from None
    if end - begin != expected:
        raise _Bad(
            f"tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
            f"{dtype}{list(shape)} needs {expected}"
        )
    if data_start + end > size:
        raise _Bad(f"tensor {name!r}: bytes end at {data_start + end}, past the end of the file ({size})")
    return StoredTensor(name, dtype, shape, data_start + begin, expected)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse(path: Path) -> tuple[list[StoredTensor], dict[str, str] | None]:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise _Bad("too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise _Bad(f"header length {header_len} runs past the end of the file ({size} bytes)")
        if header_len > MAX_HEADER_BYTES:
            raise _Bad(f"header length {header_len} is over the {MAX_HEADER_BYTES}-byte limit")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Bad(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _Bad("header is not a JSON object")
    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _Bad("__metadata__ is not an object of strings")
    tensors = sorted(
        (_tensor(name, info, data_start, size) for name, info in header.items()), key=lambda t: t.offset
    )
    cursor = data_start
    for t in tensors:
        if t.offset < cursor:
            raise _Bad(f"tensor {t.name!r} overlaps the tensor before it")
        if t.offset > cursor:
            raise _Bad(f"{t.offset - cursor} bytes before tensor {t.name!r} belong to no tensor")
        cursor = t.offset + t.nbytes
    if cursor != size:
        raise _Bad(f"{size - cursor} bytes after the last tensor belong to no tensor")
    return tensors, metadata


def read_header_with_metadata(path: Path) -> tuple[list[StoredTensor], dict[str, str] | None]:
    """`read_header`, plus the file's `__metadata__` (None when it has none)."""
    try:
        tensors, metadata = _parse(path)
        # Our checks name the problem; the library's open is the last word on what loaders accept.
        with safe_open(str(path), "numpy"):
            pass
    except _Bad as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    except SafetensorError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    return tensors, metadata


def read_header(path: Path) -> list[StoredTensor]:
    """Tensors of a safetensors file with absolute byte offsets, in file order; ValueError naming
    the file for anything a safetensors loader would refuse."""
    return read_header_with_metadata(path)[0]
