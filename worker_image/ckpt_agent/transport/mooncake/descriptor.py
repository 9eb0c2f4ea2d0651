"""What a Mooncake server answers for `GET /v1/mooncake/<version>`: the version's manifest (the
exact bytes, so its digest can be checked) and where each shard's bytes sit in the server's
registered memory.

    {"manifest": "<manifest.json text>", "protocol": "tcp"|"rdma", "session": "host:rpc_port",
     "files": {"<shard>": {"size": n, "extents": [[file_offset, address, nbytes], ...]}}}

A source maps each shard whole (one extent); a relaying agent publishes one extent per tensor
from its staging copy. Bytes of a shard not covered by an extent (safetensors header, padding)
are not tensor data: readers zero-fill them.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_agent.transport.mooncake.runtime import PROTOCOLS, Protocol
from ckpt_api.manifest import is_valid_file_name

_SESSION = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


@dataclass(frozen=True)
class Extent:
    file_offset: int
    addr: int
    nbytes: int

    @property
    def file_end(self) -> int:
        return self.file_offset + self.nbytes


@dataclass(frozen=True)
class ExportedFile:
    size: int
    extents: tuple[Extent, ...]  # sorted by file_offset, non-overlapping


@dataclass(frozen=True)
class Descriptor:
    manifest: bytes
    protocol: Protocol
    session: str
    files: Mapping[str, ExportedFile]

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest.decode("utf-8"),
            "protocol": self.protocol,
            "session": self.session,
            "files": {
                name: {"size": f.size, "extents": [[e.file_offset, e.addr, e.nbytes] for e in f.extents]}
                for name, f in self.files.items()
            },
        }


class InvalidDescriptor(ValueError):
    pass


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidDescriptor(f"expected a non-negative integer, got {value!r}")
    return value


def _file(name: object, doc: object) -> tuple[str, ExportedFile]:
    if not isinstance(name, str) or not is_valid_file_name(name) or not isinstance(doc, dict):
        raise InvalidDescriptor(f"bad file entry {name!r}")
    size = _int(doc.get("size"))
    raw = doc.get("extents")
    if not isinstance(raw, list):
        raise InvalidDescriptor(f"{name}: extents must be a list")
    extents = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            raise InvalidDescriptor(f"{name}: an extent is [file_offset, address, nbytes]")
        extents.append(Extent(_int(item[0]), _int(item[1]), _int(item[2])))
    extents.sort(key=lambda e: e.file_offset)
    for prev, cur in itertools.pairwise(extents):
        if cur.file_offset < prev.file_end:
            raise InvalidDescriptor(f"{name}: extents overlap")
    if extents and extents[-1].file_end > size:
        raise InvalidDescriptor(f"{name}: an extent ends past the file size")
    return name, ExportedFile(size, tuple(extents))


def parse_descriptor(raw: bytes) -> Descriptor:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidDescriptor(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidDescriptor("not a JSON object")
    manifest, protocol, session, files = (doc.get(k) for k in ("manifest", "protocol", "session", "files"))
    if not isinstance(manifest, str):
        raise InvalidDescriptor("manifest must be a string")
    if protocol not in PROTOCOLS:
        raise InvalidDescriptor(f"unknown protocol {protocol!r}")
    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise InvalidDescriptor(f"bad session {session!r}")
    if not isinstance(files, dict):
        raise InvalidDescriptor("files must be an object")
    return Descriptor(
        manifest.encode("utf-8"), protocol, session, dict(_file(n, d) for n, d in files.items())
    )
