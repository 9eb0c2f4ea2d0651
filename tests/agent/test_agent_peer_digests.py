"""Bytes from a peer are checked against the source manifest's cryptographic digest (BLAKE3, or
sha256 in a format 2 manifest), not its xxh3 (a peer picks what it serves, and xxh3 collisions can
be made); a manifest without either is loaded from the source; and a pinned manifest digest makes
the load verify the bytes too. Real agents, a real published tree, real paddle tensors."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest
from agent_testkit import (
    AgentClient,
    AgentFactory,
    Tree,
    close_to,
    corrupt_tensor,
    static_token_agent,
)

from ckpt_agent.pipeline.load_job import LoadJob
from ckpt_api.manifest import MANIFEST_NAME, manifest_digest


def _rewrite_manifest(tree: Tree, version: str, edit: Any) -> str:
    """Edit a published manifest in place (as a bad publisher or an old one would have written
    it); returns its new digest."""
    doc = tree.manifest(version)
    edit(doc)
    raw = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    (tree.root / version / MANIFEST_NAME).write_bytes(raw)
    return manifest_digest(raw)


def _total(tree: Tree, version: str) -> int:
    return sum(t["nbytes"] for t in tree.manifest(version)["tensors"])


async def _peer_with(tree: Tree, agent_factory: AgentFactory, token_file: Path, version: str) -> AgentClient:
    """A peer relaying `version`, loaded from the tree before a test edits its manifest."""
    peer = await static_token_agent(agent_factory, token_file, source=tree.file_uri)
    assert (await peer.update(version, verify_checksum=True))[0] == 202
    assert (await peer.wait_settled())["relay"]["version"] == version
    return peer


def _records(tree: Tree, version: str, doc: dict[str, Any]) -> list[tuple[dict[str, Any], bytes]]:
    """Every tensor and extra file record of `doc`, each with the bytes it describes."""
    out = []
    for t in doc["tensors"]:
        with (tree.root / version / t["file"]).open("rb") as f:
            f.seek(t["offset"])
            out.append((t, f.read(t["nbytes"])))
    for name, extra in doc["extra_files"].items():
        out.append((extra, (tree.root / version / name).read_bytes()))
    return out


def _as_format_2(tree: Tree, version: str) -> Callable[[dict[str, Any]], None]:
    """An edit making a manifest what a format 2 publisher wrote: sha256 where blake3 was."""

    def edit(doc: dict[str, Any]) -> None:
        doc["format_version"] = 2
        for record, data in _records(tree, version, doc):
            del record["blake3"]
            record["sha256"] = hashlib.sha256(data).hexdigest()

    return edit


def test_publish_writes_the_blake3_of_every_tensor_and_file(tree: Tree) -> None:
    doc = tree.manifest("v2")
    assert doc["format_version"] == 3
    records = _records(tree, "v2", doc)
    assert doc["tensors"]
    assert doc["extra_files"]
    for record, data in records:
        assert record["blake3"] == blake3.blake3(data).hexdigest()
        assert "sha256" not in record, "one cryptographic digest is hashed, not two"


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
async def test_peer_bytes_that_match_xxh3_but_not_the_strong_digest_are_refused(
    scratch_tree: Tree, agent_factory: AgentFactory, token_file: Path, algorithm: str
) -> None:
    """The only way to build a peer whose bytes pass xxh3 and fail the cryptographic digest
    without a collision: the source manifest's digest of one tensor is wrong while every byte is
    real. The peer path refuses that tensor; the source path (xxh3) takes the same bytes. sha256:
    a format 2 manifest, which readers still take."""
    peer = await _peer_with(scratch_tree, agent_factory, token_file, "v2")
    victim = scratch_tree.manifest("v2")["tensors"][1]["name"]

    def wrong_digest(doc: dict[str, Any]) -> None:
        if algorithm == "sha256":
            _as_format_2(scratch_tree, "v2")(doc)
        entry = next(t for t in doc["tensors"] if t["name"] == victim)
        entry[algorithm] = "0" * 64

    _rewrite_manifest(scratch_tree, "v2", wrong_digest)
    client = await static_token_agent(
        agent_factory, token_file, source=scratch_tree.file_uri, initial_version="v1"
    )
    await client.wait_settled()
    body = {"uri": scratch_tree.file_uri, "peer": peer.url}
    assert (await client.update("v2", verify_checksum=False, source=body))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert status["version"] == "v2"
    assert last["fallback_reason"].startswith("ChecksumMismatch")
    assert f"tensor {victim!r}" in last["fallback_reason"]
    assert f"{algorithm} " in last["fallback_reason"]
    assert "0" * 64 in last["fallback_reason"]
    # Resumed by tensor: the refused tensor (and the rest) from the source, not the whole version.
    victim_bytes = next(t["nbytes"] for t in scratch_tree.manifest("v2")["tensors"] if t["name"] == victim)
    assert victim_bytes <= last["bytes_from_source"] < _total(scratch_tree, "v2")
    assert close_to(await client.infer(), scratch_tree.expected("v2"))


async def test_a_manifest_without_a_strong_digest_is_loaded_from_the_source_not_the_peer(
    scratch_tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    peer = await _peer_with(scratch_tree, agent_factory, token_file, "v2")

    def published_before_strong_digests(doc: dict[str, Any]) -> None:
        doc["format_version"] = 2
        for entry in [*doc["tensors"], *doc["extra_files"].values()]:
            del entry["blake3"]

    _rewrite_manifest(scratch_tree, "v2", published_before_strong_digests)
    client = await static_token_agent(
        agent_factory, token_file, source=scratch_tree.file_uri, initial_version="v1"
    )
    await client.wait_settled()
    body = {"uri": scratch_tree.file_uri, "peer": peer.url}
    assert (await client.update("v2", source=body))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert status["version"] == "v2"
    assert "lists no blake3 or sha256" in last["fallback_reason"]
    # Decided from the manifest, before any byte came from the peer.
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (0, _total(scratch_tree, "v2"))
    pulled = "ckpt_agent_pulled_bytes_total"
    assert await client.metric(pulled, {"origin": "peer"}) == 0
    assert close_to(await client.infer(), scratch_tree.expected("v2"))


@pytest.mark.parametrize(
    ("verify_checksum", "peer", "pin", "verified"),
    [
        (False, None, None, False),
        (True, None, None, True),
        (False, "http://127.0.0.1:1", None, True),
        (False, None, "sha256:" + "a" * 64, True),
        (True, None, "sha256:" + "a" * 64, True),
    ],
)
def test_a_pin_or_a_peer_implies_verification(
    verify_checksum: bool, peer: str | None, pin: str | None, verified: bool
) -> None:
    job = LoadJob("v2", verify_checksum, "file:///x", pin, None, peer=peer)
    assert job.must_verify is verified


@pytest.mark.parametrize("pinned", [True, False])
async def test_a_pinned_load_checks_tensor_bytes_without_verify_checksum(
    scratch_tree: Tree, agent_factory: AgentFactory, pinned: bool
) -> None:
    """A source whose manifest is the pinned one but whose shard was damaged after publishing:
    the pin alone (verify_checksum false) refuses the bytes; without a pin the load skips the
    check, as FastDeploy's verify_checksum=false does."""
    digest = scratch_tree.digests["v2"]
    corrupt_tensor(scratch_tree.root / "v2", scratch_tree.manifest("v2")["tensors"][0]["name"])
    client = await agent_factory(source=scratch_tree.file_uri, initial_version="v1")
    await client.wait_settled()
    source = {"uri": scratch_tree.file_uri, **({"manifestDigest": digest} if pinned else {})}
    assert (await client.update("v2", verify_checksum=False, source=source))[0] == 202
    status = await client.wait_settled()
    if pinned:
        assert (status["state"], status["version"]) == ("failed", "v1")
        assert status["last_error"]["reason"] == "ChecksumMismatch"
    else:
        assert (status["version"], status["checksum_verified"]) == ("v2", False)
