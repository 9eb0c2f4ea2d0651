"""The checkpoint version manifest (`manifest.json`): the format publishers write and agents read.

A version directory (and the served tree, so any static file server is a source) holds:

    <root>/<version>/manifest.json
    <root>/<version>/<shard>.safetensors     files: the shards, holding every tensor
    <root>/<version>/<other file>            extra_files: config.json, tokenizer files, the index…

The manifest lists every tensor (name, dtype, shape, file, byte offset, nbytes, xxh3-128) and
every other file of the version (size, whole-file xxh3-128), each also with a cryptographic digest:
BLAKE3-256 (`blake3`, format 3) or sha256 (`sha256`, what format 2 publishers wrote). Its own
sha256, over the exact bytes served, is what `spec.source.manifestDigest` pins; an agent checks the
bytes it uses against the xxh3-128 the manifest gives for them, and bytes from a peer or over
Mooncake against the cryptographic digest (`strong_digest`): a peer chooses the bytes it serves,
and xxh3 is not collision-resistant, so it alone could let a peer forge a tensor. BLAKE3 replaced
sha256 because publishing hashes every byte on the trainer's critical path: it runs ~2.5x sha256
on one core here (with the SHA extensions) and both digests are computed in the same pass.
Optionally, `reference` holds what the paddle reference model answers with these weights
(`ReferenceRecord`), for the smoke check after a load.

A checkpoint saved per tensor-parallel rank (vLLM's and SGLang's `sharded_state` load format:
`model-rank-<rank>-part-<part>.safetensors`, each rank reading only its own files, each with the
same parameter names) records each such shard's `rank`. A tensor name is then unique within a
rank (a shard without a rank counts for every rank), and a tensor is told apart by its file and
name (`TensorRecord.key`). `share()` is the part of a version that given ranks read: all that a
multi-node replica's pod pulls.

Compatibility, for publishers and readers of different ages:

- `format_version` is 3 (version 1 had no `extra_files`; version 2 carried sha256 where 3 carries
  blake3). Readers accept every version up to theirs and refuse a higher one with an
  InvalidManifest naming it: a reader cannot know what a newer format means. A format 2 reader
  would load a blake3-only manifest from its source but refuse every peer and Mooncake read for
  want of a sha256, so publishers that write blake3 say format 3, and that reader says plainly
  what it lacks; `publish --digest sha256` still writes format 2 for fleets of older agents.
- Unknown fields, at any level, are ignored. A newer publisher may add information (a
  cryptographic digest per tensor, provenance) that older agents do not need; ignoring it lets
  nothing through unverified, since the manifest digest pins every byte of the manifest and the
  checksums a reader does understand cover every byte it loads.
- A publisher bumps `format_version` when a reader must understand a new field to load the
  version correctly (a new encoding, a new kind of file); that is what makes old readers refuse.

`render_schema()` is the published JSON schema of the format (`make crds` writes it to
`operator/ckpt_api/manifest.schema.json`; a test fails when the committed copy drifts).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from functools import cached_property
from typing import Annotated, Any, Final, Literal, NamedTuple, NoReturn, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

FORMAT_VERSION = 3
# The cryptographic digests a record may carry, preferred first.
StrongAlgorithm = Literal["blake3", "sha256"]
CHECKSUM_ALGORITHM: Final = "xxh3-128"
MANIFEST_NAME = "manifest.json"
SCHEMA_ID = "https://rollout.ckpt.dev/schemas/manifest.schema.json"

# Every dtype safetensors defines (0.8), by its name in headers and manifests.
Dtype = Literal[
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
]
# Bits per element: F4 and F6 pack values across bytes, so a shape is valid for them only when
# its bits fill whole bytes (as safetensors requires).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
if set(DTYPE_BITS) != set(get_args(Dtype)):  # pragma: no cover - a typo in one of the two lists
    raise ImportError("ckpt_api.manifest: DTYPE_BITS and Dtype name different dtypes")

_FILE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$"
_FILE_NAME = re.compile(_FILE_NAME_PATTERN)
MAX_TENSOR_NAME = 1024
MAX_RANK = 16


def is_valid_file_name(name: str) -> bool:
    """A file name a version may hold: one path component, no '..', not the manifest itself."""
    return bool(_FILE_NAME.fullmatch(name)) and ".." not in name and name != MANIFEST_NAME


_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def manifest_digest(raw: bytes) -> str:
    """The digest `spec.source.manifestDigest` pins: the sha256 of the manifest's exact bytes."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def is_valid_digest(value: str) -> bool:
    return bool(_DIGEST.fullmatch(value))


def tensor_nbytes(dtype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor; KeyError for an unknown dtype, ValueError when a packed dtype's bits do
    not fill whole bytes."""
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise ValueError(f"{dtype}{list(shape)} is {bits} bits, not a whole number of bytes")
    return bits // 8


def _file_name(name: str) -> str:
    if not is_valid_file_name(name):
        raise PydanticCustomError("file_name", "unsafe file name {name!r}", {"name": name})
    return name


FileName = Annotated[str, AfterValidator(_file_name)]
# What `is_valid_file_name` checks, as JSON schema for the keys of `files` and `extra_files`.
_FILE_NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": _FILE_NAME_PATTERN,
    "not": {"anyOf": [{"pattern": r"\.\."}, {"const": MANIFEST_NAME}]},
    "description": "one path component, no '..', not manifest.json",
}
Count = Annotated[int, Field(ge=0)]
Xxh3 = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$", description="xxh3-128, 32 lowercase hex digits")]
# Both optional: manifests published before either existed still load (their bytes are read from
# the source only).
_Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Sha256 = Annotated[
    _Hex64 | SkipJsonSchema[None],
    Field(
        default=None,
        description="sha256 of the bytes, 64 lowercase hex digits (format 2 publishers): what bytes from "
        "a peer or over Mooncake are checked against when there is no blake3",
    ),
]
Blake3 = Annotated[
    _Hex64 | SkipJsonSchema[None],
    Field(
        default=None,
        description="BLAKE3-256 of the bytes, 64 lowercase hex digits (since format 3): what bytes from a "
        "peer or over Mooncake are checked against",
    ),
]


class StrongDigest(NamedTuple):
    """The cryptographic digest bytes from an untrusted transport are checked against."""

    algorithm: StrongAlgorithm
    hexdigest: str


class _Record(BaseModel):
    # Unknown fields are ignored (see the module docstring); strict: JSON integers only, no "1".
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class _Digested(_Record):
    xxh3_128: Xxh3
    sha256: Sha256
    blake3: Blake3

    @property
    def strong_digest(self) -> StrongDigest | None:
        """BLAKE3 where the publisher wrote it, else sha256, else None (published before both)."""
        if self.blake3 is not None:
            return StrongDigest("blake3", self.blake3)
        if self.sha256 is not None:
            return StrongDigest("sha256", self.sha256)
        return None


class TensorRecord(_Digested):
    name: str = Field(min_length=1, max_length=MAX_TENSOR_NAME)
    dtype: Dtype
    shape: tuple[Count, ...] = Field(max_length=MAX_RANK)
    file: str = Field(min_length=1, description="the shard holding it, a key of `files`")
    offset: Count = Field(description="first byte, from the start of the file")
    nbytes: Count = Field(description="numel * bits / 8 of its dtype; F4/F6 shapes must fill whole bytes")

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def key(self) -> tuple[str, str]:
        """What tells it from every other tensor of its version: ranks' shards repeat names."""
        return self.file, self.name


class ShardRecord(_Record):
    size: Count
    # Only ranks' files carry it: readers that predate it load every shard, as before.
    rank: Count | SkipJsonSchema[None] = Field(
        default=None, description="the tensor-parallel rank that alone reads this shard (sharded_state)"
    )


# vLLM's ShardedStateLoader.DEFAULT_PATTERN ("model-rank-{rank}-part-{part}.safetensors",
# model_executor/model_loader/sharded_state_loader.py), which SGLang's sharded_state loader shares:
# each rank globs its own files and reads nothing else.
_RANK_FILE = re.compile(r"model-rank-(\d+)-part-\d+\.safetensors")


def shard_rank(name: str) -> int | None:
    """The rank whose file ``name`` is in a sharded_state checkpoint (None: every rank's)."""
    found = _RANK_FILE.fullmatch(name)
    return int(found.group(1)) if found else None


def share(doc: ManifestDocument, ranks: frozenset[int]) -> ManifestDocument:
    """What ``ranks`` read of ``doc``: their shards, the shards with no rank and their tensors,
    and every extra file. ``doc`` itself when it records no rank (every rank reads every file)."""
    if all(f.rank is None for f in doc.files.values()):
        return doc
    files = {name: f for name, f in doc.files.items() if f.rank is None or f.rank in ranks}
    tensors = tuple(t for t in doc.tensors if t.file in files)
    part = doc.model_copy(
        update={"files": files, "tensors": tensors, "total_bytes": sum(t.nbytes for t in tensors)}
    )
    # model_copy copies what the whole document had cached (by_file) along with its fields.
    for name, attr in vars(ManifestDocument).items():
        if isinstance(attr, cached_property):
            part.__dict__.pop(name, None)
    return part


class ExtraFileRecord(_Digested):
    """Another file of the version, whole; its digests are of the whole file."""

    size: Count


MAX_REFERENCE_OUTPUTS = 4096


class ReferenceRecord(_Record):
    """What the paddle reference engine's forward pass answers on its fixed input
    (`ckpt_agent.formats.synth.reference_input`) with these weights, as the publisher computed it. An
    agent's smoke check compares its own output against it, which catches a wrong export whose
    bytes match their checksums and hold no NaN. Other engines ignore it."""

    outputs: list[float] = Field(min_length=1, max_length=MAX_REFERENCE_OUTPUTS)
    atol: float = Field(gt=0, allow_inf_nan=False, description="largest |output - reference| accepted")

    @model_validator(mode="after")
    def _finite(self) -> ReferenceRecord:
        bad = next((i for i, v in enumerate(self.outputs) if not math.isfinite(v)), None)
        if bad is not None:
            _fail(f"reference output {bad} is {self.outputs[bad]}, not a finite number")
        return self


class ManifestDocument(_Record):
    """manifest.json of one checkpoint version."""

    model_config = ConfigDict(
        extra="ignore",
        frozen=True,
        strict=True,
        title="Checkpoint version manifest",
        json_schema_extra={"$id": SCHEMA_ID},
    )

    format_version: int = Field(
        ge=1, le=FORMAT_VERSION, description="readers refuse a format newer than theirs"
    )
    version: str = Field(min_length=1)
    checksum: Literal["xxh3-128"]
    files: dict[FileName, ShardRecord] = Field(description="the safetensors shards, by name")
    extra_files: dict[FileName, ExtraFileRecord] = Field(
        default_factory=dict,
        description="every other file of the version (config, tokenizer, index…); since format 2",
    )
    tensors: tuple[TensorRecord, ...]
    # Informational (publishers write it); readers that predate it never required it. Absent, it is
    # the tensors' sum, so a manifest built in code equals the one parsed from its encoding.
    total_bytes: Count | SkipJsonSchema[None] = Field(
        default_factory=lambda fields: sum(t.nbytes for t in fields.get("tensors", ())),
        description="sum of every tensor's nbytes",
    )
    # Optional, so readers that predate it load the version unchanged (it adds a check only).
    reference: ReferenceRecord | None = Field(
        default=None,
        description="the reference model's outputs on its fixed input for these weights (smoke check)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ManifestDocument:
        files = self.files
        every_rank: set[str] = set()  # names in shards without a rank
        per_rank: dict[int, set[str]] = {}
        by_file: dict[str, list[TensorRecord]] = {}
        for index, t in enumerate(self.tensors):
            where = tensor_label(t.name, index)
            shard = files.get(t.file)
            if shard is None:
                _fail(f"{where}: file {shown(t.file, 128)} is not listed in files")
            try:
                expected = tensor_nbytes(t.dtype, t.shape)
            except ValueError as exc:
                _fail(f"{where}: {exc}")
            if t.nbytes != expected:
                _fail(f"{where}: nbytes {t.nbytes} does not match {t.dtype}{tuple(t.shape)}")
            if t.offset + t.nbytes > shard.size:
                _fail(f"{where}: bytes end past the size of {t.file}")
            if shard.rank is None:
                twice = t.name in every_rank or any(t.name in names for names in per_rank.values())
                every_rank.add(t.name)
            else:
                names = per_rank.setdefault(shard.rank, set())
                twice = t.name in names or t.name in every_rank
                names.add(t.name)
            if twice:
                _fail(f"{where} is listed twice")
            by_file.setdefault(t.file, []).append(t)
        for fname, entries in by_file.items():
            entries.sort(key=lambda t: t.offset)
            for prev, cur in itertools.pairwise(entries):
                if cur.offset < prev.offset + prev.nbytes:
                    _fail(f"tensors {shown(prev.name, 128)} and {shown(cur.name, 128)} overlap in {fname}")
        for fname in self.extra_files:
            if fname in files:
                _fail(f"extra file {fname!r} is also listed in files")
        return self

    @property
    def tensor_bytes(self) -> int:
        """Bytes of every tensor: what `total_bytes` says, computed rather than trusted."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def largest_tensor_bytes(self) -> int:
        return max((t.nbytes for t in self.tensors), default=0)

    @property
    def strong_digests_complete(self) -> bool:
        """Every tensor and extra file has a cryptographic digest, so bytes from a source that
        chooses what it sends (a peer) can be checked against it."""
        records: list[_Digested] = [*self.tensors, *self.extra_files.values()]
        return all(r.strong_digest is not None for r in records)

    # Cached: a reader looks it up per request. model_copy keeps the cached value, so a changed
    # copy is for writing bytes only (as tests do to forge a bad manifest).
    @cached_property
    def by_file(self) -> dict[str, list[TensorRecord]]:
        """Tensors of each shard in offset order (the order they are read in), shards by name."""
        groups: dict[str, list[TensorRecord]] = {}
        for t in self.tensors:
            groups.setdefault(t.file, []).append(t)
        for entries in groups.values():
            entries.sort(key=lambda t: t.offset)
        return dict(sorted(groups.items()))


def encode_manifest(manifest: ManifestDocument) -> bytes:
    """The bytes a publisher writes: deterministic, so publishing the same tensors twice gives
    the same digest. Unset digests and reference are left out rather than null (the bytes of a
    manifest without them stay what they were), `total_bytes` is the tensors' sum, and a format 1
    manifest has no `extra_files`."""
    doc = manifest.model_dump(mode="json", exclude_none=True)
    doc["total_bytes"] = manifest.tensor_bytes
    if manifest.format_version < 2:
        del doc["extra_files"]
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _fail(message: str) -> NoReturn:
    raise PydanticCustomError("manifest", "{message}", {"message": message})


class ManifestError(ValueError):
    """A manifest this reader cannot use; the message names what is wrong, one line."""


def parse_document(raw: bytes) -> ManifestDocument:
    """Validate manifest bytes; ManifestError naming the first problem found."""
    try:
        return ManifestDocument.model_validate_json(raw)
    except ValidationError as exc:
        raise ManifestError(_describe(exc.errors(include_url=False)[0], raw)) from None


# What each field must be, for errors pydantic reports in its own words.
# What of a manifest's own text a message may carry: it ends up in a CR's status, which the CR's
# author reads, and a "manifest" fetched from the wrong address may be any reply at all.
_SHOWN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+/-]*")


def shown(value: object, limit: int = 64) -> str:
    """`value` (from a manifest) for a message: a short name-like string or a small integer as
    itself; anything else by its JSON type and size only, so no prose, markup or long text of
    the reply is ever repeated."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**9:
        return str(value)
    if isinstance(value, str):
        if len(value) <= limit and _SHOWN.fullmatch(value):
            return repr(value)
        return f"a string of {len(value)} characters"
    kinds = {bool: "a boolean", type(None): "null", float: "a number", list: "a list", dict: "an object"}
    return kinds.get(type(value), "a number" if isinstance(value, int) else "a value")


_MUST_BE = {
    "version": "a non-empty string",
    "name": f"a non-empty string of at most {MAX_TENSOR_NAME} characters",
    "file": "a non-empty string",
    "offset": "an integer >= 0",
    "nbytes": "an integer >= 0",
    "size": "an integer >= 0",
    "total_bytes": "an integer >= 0",
    "xxh3_128": "32 lowercase hex digits",
    "sha256": "64 lowercase hex digits",
    "blake3": "64 lowercase hex digits",
    "shape": f"a list of at most {MAX_RANK} dimensions",
    "files": "an object",
    "extra_files": "an object",
    "tensors": "a list",
    "checksum": repr(CHECKSUM_ALGORITHM),
    "reference": "an object {outputs: [finite numbers], atol: number > 0}",
}


def _describe(error: Any, raw: bytes) -> str:
    loc: tuple[str | int, ...] = tuple(error["loc"])
    kind = error["type"]
    if kind == "json_invalid":
        return f"manifest is not valid JSON: {error['ctx'].get('error', error['msg'])}"
    if kind == "manifest":
        return str(error["msg"])
    if not loc:
        return "manifest must be a JSON object" if kind == "model_type" else str(error["msg"])
    top = loc[0]
    if top == "format_version":
        given = shown(error.get("input"), 0)  # a number: a string is not repeated at all
        return f"unsupported format_version {given} (this reader reads 1 to {FORMAT_VERSION})"
    if top in ("files", "extra_files") and len(loc) >= 2:
        what = "shard" if top == "files" else "extra"
        if loc[-1] == "[key]":
            return f"unsafe {what} file name {shown(loc[1], 128)}"
        if len(loc) == 2:
            return f"{top}[{shown(loc[1], 128)}] must be an object"
        return f"{top}[{shown(loc[1], 128)}].{loc[2]} must be {_MUST_BE.get(str(loc[2]), 'valid')}"
    if top == "tensors" and len(loc) >= 2:
        where = _tensor_where(raw, loc[1])
        if len(loc) == 2:
            return f"{where} must be an object"
        field = str(loc[2])
        if field == "dtype":
            return f"{where}: unknown dtype {shown(error.get('input'), 16)}"
        if field == "shape" and len(loc) > 3:
            return f"{where}: shape dimension {loc[3]} must be an integer >= 0"
        return f"{where}: {field} must be {_MUST_BE.get(field, 'valid')}"
    return f"{top} must be {_MUST_BE.get(str(top), 'valid')}"


def _tensor_where(raw: bytes, index: str | int) -> str:
    # Only on the error path: name the tensor by its name when it has a usable one.
    try:
        name = json.loads(raw)["tensors"][int(index)]["name"]
    except (ValueError, KeyError, IndexError, TypeError):
        name = None
    return tensor_label(name, index)


def tensor_label(name: object, index: str | int) -> str:
    """A tensor in a message: by its name when that is short and name-like, else its index."""
    if isinstance(name, str) and len(name) <= 128 and _SHOWN.fullmatch(name):
        return f"tensor {name!r}"
    return f"tensors[{index}]"


def render_schema() -> str:
    """The format's JSON schema, as committed."""
    schema = ManifestDocument.model_json_schema(mode="validation")
    for key in ("files", "extra_files"):
        schema["properties"][key]["propertyNames"] = _FILE_NAME_SCHEMA
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(render_schema(), end="")
