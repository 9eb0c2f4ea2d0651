"""Just enough of the safetensors layout to find tensor bytes and to write shards.

A file is: u64 little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {...}}`, then the data
section; offsets are relative to its start. We read headers ourselves (rather than loading
tensors) because publishing only needs byte ranges, and bf16/fp8 have no numpy dtype.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ckpt_agent.dtypes import ITEM_SIZES, nbytes_of

_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute, from the start of the file
    nbytes: int


def read_header(path: Path) -> list[StoredTensor]:
    """Tensors of a safetensors file with absolute byte offsets, in file order."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path.name}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{path.name}: header length {header_len} is implausible")
        header = json.loads(f.read(header_len))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: header is not a JSON object")
    data_start = 8 + header_len
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
        if dtype not in ITEM_SIZES:
            raise ValueError(f"{path.name}: tensor {name!r} has unsupported dtype {dtype!r}")
        if end - begin != nbytes_of(dtype, shape) or data_start + end > size:
            raise ValueError(f"{path.name}: tensor {name!r} has inconsistent data_offsets")
        tensors.append(StoredTensor(name, dtype, shape, data_start + begin, end - begin))
    tensors.sort(key=lambda t: t.offset)
    return tensors


def write_file(
    out: BinaryIO, tensors: Iterable[tuple[str, str, tuple[int, ...], memoryview]]
) -> list[StoredTensor]:
    """Write one safetensors file; returns where each tensor landed (absolute offsets)."""
    items = list(tensors)
    base = out.tell()
    header: dict[str, object] = {}
    cursor = 0
    for name, dtype, shape, data in items:
        if data.nbytes != nbytes_of(dtype, shape):
            raise ValueError(f"tensor {name!r}: {data.nbytes} bytes do not match {dtype}{list(shape)}")
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [cursor, cursor + data.nbytes]}
        cursor += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    # Pad with spaces so the data section starts 8-byte aligned, as the format recommends.
    raw += b" " * (-(8 + len(raw)) % 8)
    out.write(struct.pack("<Q", len(raw)))
    out.write(raw)
    placed = []
    for name, dtype, shape, data in items:
        placed.append(StoredTensor(name, dtype, shape, out.tell() - base, data.nbytes))
        out.write(data)
    return placed
