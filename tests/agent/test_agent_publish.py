"""`publish`: shards + manifest from safetensors files or a paddle state dict, immutably."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import blake3
import numpy as np
import paddle
import pytest
import xxhash
from safetensors.numpy import load_file, save_file

from ckpt_agent.cli import add_commands
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.formats.synth import load_published_tensors, write_reference_checkpoint
from ckpt_source.publish import PublishError, publish


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    return parser.parse_args(argv)


def _check_checksums(version_dir: Path) -> None:
    manifest = parse_manifest((version_dir / "manifest.json").read_bytes(), expected_version=version_dir.name)
    for entry in manifest.tensors:
        data = (version_dir / entry.file).read_bytes()[entry.offset : entry.end]
        assert xxhash.xxh3_128_hexdigest(data) == entry.xxh3_128, entry.name


def test_publish_safetensors_dir_keeps_shards_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=5, hidden=16, layers=3, shards=3)
    digest = publish(src, "global_step_5", tmp_path / "root")
    out = tmp_path / "root" / "global_step_5"
    assert digest == "sha256:" + hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    for shard in src.glob("*.safetensors"):
        assert (out / shard.name).read_bytes() == shard.read_bytes()
    published = load_published_tensors(out)
    for shard in src.glob("*.safetensors"):
        for name, array in load_file(str(shard)).items():
            np.testing.assert_array_equal(published[name], array)
    _check_checksums(out)
    assert not [p for p in (tmp_path / "root").iterdir() if p.name.startswith(".")], "temp dir left behind"


def test_publish_is_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=7)
    assert publish(src, "v", tmp_path / "a") == publish(src, "v", tmp_path / "b")


def test_publish_paddle_state_dict_including_bf16(tmp_path: Path) -> None:
    layer = paddle.nn.Linear(8, 4)
    state = dict(layer.state_dict())
    state["emb"] = paddle.to_tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).astype("bfloat16")
    state["steps"] = paddle.to_tensor(np.array([3, 4], dtype=np.int64))
    path = tmp_path / "model.pdparams"
    paddle.save(state, str(path))
    publish(path, "pd1", tmp_path / "root", shard_bytes=100)
    out = tmp_path / "root" / "pd1"
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    dtypes = {t.name: (t.dtype, t.shape) for t in manifest.tensors}
    assert dtypes == {
        "weight": ("F32", (8, 4)),
        "bias": ("F32", (4,)),
        "emb": ("BF16", (3, 4)),
        "steps": ("I64", (2,)),
    }
    assert len(manifest.files) > 1, "a 100-byte shard limit must split the tensors"
    published = load_published_tensors(out)
    np.testing.assert_array_equal(published["weight"], state["weight"].numpy())
    np.testing.assert_array_equal(published["emb"], state["emb"].numpy())  # raw bf16 bits
    _check_checksums(out)


def test_refuses_to_overwrite_an_existing_version(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=1)
    publish(src, "v1", tmp_path / "root")
    before = (tmp_path / "root" / "v1" / "manifest.json").read_bytes()
    write_reference_checkpoint(tmp_path / "other", seed=2)
    with pytest.raises(PublishError, match="already exists"):
        publish(tmp_path / "other", "v1", tmp_path / "root")
    assert (tmp_path / "root" / "v1" / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("version", ["a/b", "..", "x..y", ".hidden", "", "v" * 129])
def test_refuses_unsafe_version_names(tmp_path: Path, version: str) -> None:
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=1)
    with pytest.raises(PublishError):
        publish(src, version, tmp_path / "root")
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").iterdir())


def test_refuses_duplicate_tensor_names_across_shards(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    save_file({"w": np.zeros(2, np.float32)}, str(src / "a.safetensors"))
    save_file({"w": np.ones(2, np.float32)}, str(src / "b.safetensors"))
    with pytest.raises(PublishError, match="more than one shard"):
        publish(src, "dup", tmp_path / "root")


def test_refuses_a_dir_without_safetensors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishError, match=r"no \*\.safetensors"):
        publish(tmp_path / "empty", "v", tmp_path / "root")


def test_cli_prints_the_digest_and_fails_on_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=1)
    args = _cli(["publish", str(src), "--version", "v1", "--out", str(tmp_path / "root")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.strip()
    raw = (tmp_path / "root" / "v1" / "manifest.json").read_bytes()
    assert printed == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert json.loads(raw)["version"] == "v1"
    assert args.func(args) == 1
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "format_version", "field", "digest"),
    [
        ([], 3, "blake3", lambda data: blake3.blake3(data).hexdigest()),
        (["--digest", "sha256"], 2, "sha256", lambda data: hashlib.sha256(data).hexdigest()),
    ],
)
def test_publish_digest_flag_picks_the_cryptographic_digest_and_the_format(
    tmp_path: Path, argv: list[str], format_version: int, field: str, digest: Callable[[bytes], str]
) -> None:
    """blake3 by default (format 3); `--digest sha256` writes what agents before format 3 read."""
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=2, hidden=8, layers=2, shards=2)
    (src / "config.json").write_text("{}")
    args = _cli(["publish", str(src), "--version", "v1", "--out", str(tmp_path / "root"), *argv])
    assert args.func(args) == 0
    out = tmp_path / "root" / "v1"
    doc = json.loads((out / "manifest.json").read_bytes())
    assert doc["format_version"] == format_version
    other = "sha256" if field == "blake3" else "blake3"
    for t in doc["tensors"]:
        data = (out / t["file"]).read_bytes()[t["offset"] : t["offset"] + t["nbytes"]]
        assert t[field] == digest(data), t["name"]
        assert other not in t
    assert doc["extra_files"]["config.json"][field] == digest(b"{}")
    assert parse_manifest((out / "manifest.json").read_bytes()).strong_digests_complete
