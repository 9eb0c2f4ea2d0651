"""Versions saved per tensor-parallel rank (vLLM's and SGLang's `sharded_state`:
`model-rank-<r>-part-<p>.safetensors`, each rank's file holding the same parameter names): publish
records each shard's rank and writes no index; the manifest accepts a name once per rank; an
agent given `--ranks` pulls, verifies and stages only its ranks' files and the shared ones, so a
replica's pods each move their share of the bytes, not the whole checkpoint."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from agent_testkit import AgentFactory
from safetensors.numpy import load_file, save_file

from ckpt_agent.config import AgentConfig, AuthConfig, ConfigError, TLSConfig, parse_ranks
from ckpt_api.manifest import ManifestError, encode_manifest, parse_document, shard_rank, share
from ckpt_source.publish import PublishError, publish

RANKS = 4
ROWS = 64  # each rank's weight: ROWS x 256 float32


def sharded_state(src: Path, version_seed: int) -> Path:
    """A 4-rank sharded_state checkpoint: every rank's file holds `w` and `b`, its own values."""
    src.mkdir(parents=True)
    for rank in range(RANKS):
        values = np.full((ROWS, 256), version_seed * 10 + rank, dtype=np.float32)
        save_file(
            {"w": values, "b": values[0, :16].copy()}, str(src / f"model-rank-{rank}-part-0.safetensors")
        )
    (src / "config.json").write_text('{"architectures": ["Stand-in"]}')
    return src


@pytest.fixture
def ranked_root(tmp_path: Path) -> Path:
    root = tmp_path / "published"
    for seed, version in enumerate(("v1", "v2"), start=1):
        publish(sharded_state(tmp_path / f"src-{version}", seed), version, root)
    return root


def test_publish_records_each_shards_rank_and_no_index(ranked_root: Path) -> None:
    doc = parse_document((ranked_root / "v1" / "manifest.json").read_bytes())
    assert {name: f.rank for name, f in doc.files.items()} == {
        f"model-rank-{r}-part-0.safetensors": r for r in range(RANKS)
    }
    assert sorted(doc.extra_files) == ["config.json"], "no index: each rank reads its files by name"
    assert [t.name for t in doc.tensors].count("w") == RANKS


def test_a_name_twice_within_a_rank_is_refused_at_publish(tmp_path: Path) -> None:
    src = sharded_state(tmp_path / "src", 1)
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(src / "model-rank-2-part-1.safetensors"))
    with pytest.raises(PublishError, match=r"tensor 'w' is in more than one shard"):
        publish(src, "v1", tmp_path / "out")
    assert not (tmp_path / "out" / "v1").exists()


def test_the_manifest_takes_a_name_once_per_rank_and_a_rankless_shard_counts_for_every_rank(
    ranked_root: Path,
) -> None:
    doc = parse_document((ranked_root / "v1" / "manifest.json").read_bytes())
    # The same document, rank 3's shard now counted for every rank: its names collide.
    rankless = doc.model_copy(
        update={
            "files": {
                **doc.files,
                "model-rank-3-part-0.safetensors": doc.files["model-rank-3-part-0.safetensors"].model_copy(
                    update={"rank": None}
                ),
            }
        }
    )
    with pytest.raises(ManifestError, match="listed twice"):
        parse_document(encode_manifest(rankless))


def test_a_share_is_its_ranks_shards_and_every_shared_file(ranked_root: Path) -> None:
    doc = parse_document((ranked_root / "v1" / "manifest.json").read_bytes())
    assert len(doc.by_file) == RANKS  # cached on the whole document first
    mine = share(doc, frozenset({2, 3}))
    assert sorted(mine.by_file) == sorted(mine.files)
    assert sorted(mine.files) == ["model-rank-2-part-0.safetensors", "model-rank-3-part-0.safetensors"]
    assert {t.key for t in mine.tensors} == {(f, n) for f in mine.files for n in ("w", "b")}
    assert mine.total_bytes == doc.total_bytes // 2
    assert mine.extra_files == doc.extra_files
    assert share(doc, frozenset({7})).tensors == ()
    assert shard_rank("model-00001-of-00002.safetensors") is None


@pytest.mark.parametrize(
    ("value", "ranks"),
    [("0-3", {0, 1, 2, 3}), ("8,9", {8, 9}), (" 4-5, 7 ", {4, 5, 7}), ("", None)],
)
def test_ranks_are_ranks_and_ranges(value: str, ranks: set[int] | None) -> None:
    assert parse_ranks(value) == (None if ranks is None else frozenset(ranks))


@pytest.mark.parametrize("value", ["a", "3-1", "-2", "1-x"])
def test_a_rank_list_that_is_none_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="--ranks"):
        parse_ranks(value)


def test_ranks_are_for_engines_that_stage_a_directory() -> None:
    config = AgentConfig(
        engine="paddle", ranks=frozenset({0}), auth=AuthConfig(disabled=True), tls=TLSConfig(plain_http=True)
    )
    with pytest.raises(ConfigError, match="--ranks is for the engines that stage a directory"):
        config.validate()


async def test_a_member_pulls_and_stages_only_its_share(
    ranked_root: Path,
    agent_factory: AgentFactory,
    source_server: Callable[[Path], Awaitable[str]],
    tmp_path: Path,
) -> None:
    """Node 1 of a replica runs ranks 2 and 3: half of the version's bytes cross its link."""
    url = await source_server(ranked_root)
    staging = tmp_path / "node1"
    member = await agent_factory(engine="member", source=url, staging_dir=staging, ranks=frozenset({2, 3}))
    assert (await member.update("v2", verify_checksum=True))[0] == 202
    status = await member.wait_settled()
    assert (status["version"], status["checksum_verified"], status["last_error"]) == ("v2", True, None)
    doc = parse_document((ranked_root / "v2" / "manifest.json").read_bytes())
    assert status["last_load"]["bytes"] == doc.total_bytes // 2
    assert sorted(p.name for p in (staging / "v2").iterdir()) == [
        "config.json",
        "model-rank-2-part-0.safetensors",
        "model-rank-3-part-0.safetensors",
    ]
    for rank in (2, 3):
        held = load_file(str(staging / "v2" / f"model-rank-{rank}-part-0.safetensors"))
        assert held["w"].shape == (ROWS, 256)
        assert (held["w"] == 20 + rank).all()
