"""Helpers for the agent tests: published trees, in-process agents and sources, bounded waits."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import xxhash

from ckpt_agent.config import AuthConfig
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.formats.synth import (
    ReferenceModelSpec,
    expected_infer_output,
    published_reference,
    write_reference_checkpoint,
)
from ckpt_api.agent_api import PREFER_HEADER, RESPOND_ASYNC
from ckpt_api.manifest import MANIFEST_NAME, ExtraFileRecord, encode_manifest, manifest_digest
from ckpt_source.publish import publish

SPEC = ReferenceModelSpec(hidden=32, layers=3, outputs=8)
# What makes an update_weights asynchronous without a `rollout` (202, then poll /v1/status).
RESPOND_ASYNC_HEADERS = {PREFER_HEADER: RESPOND_ASYNC}
T = TypeVar("T")
# The `agent_factory` fixture: keyword overrides of AgentConfig (+ token) -> a started agent.
AgentFactory = Callable[..., Awaitable["AgentClient"]]


def jwt_shaped(**claims: Any) -> str:
    """A token shaped like a service-account JWT (unsigned: the signature is filler), carrying
    ``claims``: what an agent in TokenReview mode sends to its apiserver for review."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'kid': 'test'})}.{part(claims)}.c2lnbmF0dXJl"


# The token of agents started with static_token_agent, and the relay secret they share (what
# they present to each other's relays, and all it lets a peer do).
STATIC_TOKEN = "operator-token"
RELAY_TOKEN = "relay-secret"


async def static_token_agent(agent_factory: AgentFactory, token_file: Path, **overrides: Any) -> AgentClient:
    """An agent whose API takes the static token in ``token_file`` (the conftest fixture), and
    the shared relay token of a file beside it for relay reads."""
    relay = token_file.with_name("relay-token")
    relay.write_text(RELAY_TOKEN + "\n")
    overrides.setdefault("relay_token_file", relay)
    return await agent_factory(token=STATIC_TOKEN, auth=AuthConfig(token_file=token_file), **overrides)


@asynccontextmanager
async def ckpt_agent_process(*argv: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """Run `python -m ckpt_agent ARGV` (an agent or a source as a real process); yields it with
    the URL from its startup banner, and kills it on the way out if it still runs."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ckpt_agent", *argv, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        match = re.search(r"(http://\S+)", line)
        assert match, f"no banner: {line!r}"
        yield proc, match.group(1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def wait_until(predicate: Callable[[], Awaitable[T | None]], limit_s: float, what: str) -> T:
    """Poll `predicate` until it returns something truthy; fail after `limit_s` seconds."""
    deadline = time.monotonic() + limit_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s}s waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Tree:
    """A published source tree (`root/<version>/...`) and where its sources came from."""

    root: Path
    work: Path
    digests: dict[str, str] = field(default_factory=dict)

    @property
    def file_uri(self) -> str:
        return f"file://{self.root}"

    def add(
        self,
        version: str,
        seed: int,
        spec: ReferenceModelSpec = SPEC,
        shards: int = 1,
        *,
        poison: str | None = None,
        reference_seed: int | None = None,
    ) -> Path:
        """Publish the reference model for `seed` with its published reference, as a trainer
        would. `poison`: a tensor holding NaN; `reference_seed`: publish another seed's reference
        (a wrong export: the bytes are not the model the reference was computed from)."""
        src = self.work / f"src-{version}"
        write_reference_checkpoint(src, seed, spec, shards=shards, poison=poison)
        reference = published_reference(
            spec, seed if reference_seed is None else reference_seed, poison=poison
        )
        self.digests[version] = publish(src, version, self.root, reference=reference)
        return self.root / version

    def add_from_dir(self, version: str, src: Path) -> Path:
        self.digests[version] = publish(src, version, self.root)
        return self.root / version

    def expected(self, version: str) -> list[float]:
        return expected_infer_output(self.root / version)

    def tensor_bytes(self, version: str) -> int:
        """What a whole load of `version` pulls: the bytes of all its tensors."""
        return sum(int(t["nbytes"]) for t in self.manifest(version)["tensors"])

    def manifest(self, version: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.root / version / MANIFEST_NAME).read_bytes())
        return doc

    def copy_version(self, base: str, version: str) -> Path:
        """A byte-identical copy of `base` published as `version` (manifest rewritten)."""
        dst = self.root / version
        shutil.copytree(self.root / base, dst)
        doc = self.manifest(base)
        doc["version"] = version
        (dst / MANIFEST_NAME).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        return dst


def set_extra_files(version_dir: Path, files: dict[str, bytes | None]) -> str:
    """Write (bytes) or delete (None) non-weight files of a published version and list them in
    its manifest as a publisher does, e.g. to craft a version publish would refuse; returns the
    new manifest digest."""
    manifest = parse_manifest((version_dir / MANIFEST_NAME).read_bytes())
    extra = dict(manifest.extra_files)
    for name, content in files.items():
        if content is None:
            (version_dir / name).unlink(missing_ok=True)
            extra.pop(name, None)
        else:
            (version_dir / name).write_bytes(content)
            extra[name] = ExtraFileRecord(
                size=len(content),
                xxh3_128=xxhash.xxh3_128(content).hexdigest(),
                sha256=hashlib.sha256(content).hexdigest(),
            )
    raw = encode_manifest(manifest.model_copy(update={"extra_files": extra, "format_version": 2}))
    (version_dir / MANIFEST_NAME).write_bytes(raw)
    return manifest_digest(raw)


def corrupt_tensor(version_dir: Path, tensor: str) -> None:
    """Flip the top byte of the middle element of an F32 `tensor` (sign and exponent bits: a
    change that shows in the model's output, not just in its checksum)."""
    doc = json.loads((version_dir / MANIFEST_NAME).read_bytes())
    entry = next(t for t in doc["tensors"] if t["name"] == tensor)
    with (version_dir / entry["file"]).open("r+b") as f:
        f.seek(entry["offset"] + entry["nbytes"] // 8 * 4 + 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate_shard(version_dir: Path, keep_fraction: float = 0.5) -> str:
    doc = json.loads((version_dir / MANIFEST_NAME).read_bytes())
    shard = sorted(doc["files"])[-1]
    path = version_dir / shard
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(int(size * keep_fraction))
    return shard


def last_tensor(doc: dict[str, Any]) -> str:
    """The tensor read last in a load (highest offset of the last shard)."""
    tensors = sorted(doc["tensors"], key=lambda t: (t["file"], t["offset"]))
    return str(tensors[-1]["name"])


class AgentClient:
    def __init__(
        self, session: aiohttp.ClientSession, url: str, token: str | None = None, agent: Any = None
    ) -> None:
        self.agent = agent
        self.session = session
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"headers": {**self.headers, **(headers or {})}}
        if raw is not None:
            kwargs["data"] = raw
        elif body is not None:
            kwargs["json"] = body
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except json.JSONDecodeError:
                return resp.status, text

    async def update(self, version: str, **fields: Any) -> tuple[int, Any]:
        """The operator's asynchronous call: 202 (or 200 noop, 409 busy), then poll."""
        body = {"version": version, **fields}
        return await self.request("POST", "/v1/update_weights", body, headers=RESPOND_ASYNC_HEADERS)

    async def update_sync(self, version: str, **fields: Any) -> tuple[int, Any]:
        """A FastDeploy client's call: answered in FastDeploy's envelope once the load ended."""
        return await self.request("POST", "/v1/update_weights", {"version": version, **fields})

    async def status(self) -> dict[str, Any]:
        code, body = await self.request("GET", "/v1/status")
        assert code == 200, body
        return dict(body)

    async def infer(self) -> list[float]:
        code, body = await self.request("POST", "/v1/infer", {})
        assert code == 200, body
        return list(body["output"])

    async def is_paused(self) -> bool:
        code, body = await self.request("GET", "/v1/is_paused")
        assert (code, body["status"]) == (200, "success"), body
        return bool(body["result"]["is_paused"])

    async def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        code, text = await self.request("GET", "/metrics")
        assert code == 200
        total = 0.0
        for line in str(text).splitlines():
            if not line.startswith(name):
                continue
            series, _, value = line.rpartition(" ")
            metric, _, label_text = series.partition("{")
            if metric != name:
                continue
            found = dict(p.split("=", 1) for p in label_text.rstrip("}").split(",") if "=" in p)
            if all(found.get(k, "").strip('"') == v for k, v in (labels or {}).items()):
                total += float(value)
        return total

    async def wait_settled(self, limit_s: float = 20.0) -> dict[str, Any]:
        """Wait until no load runs; returns the final status."""

        async def settled() -> dict[str, Any] | None:
            status = await self.status()
            return status if status["state"] != "loading" else None

        return await wait_until(settled, limit_s, "the load to finish")


def close_to(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))
