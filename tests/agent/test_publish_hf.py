"""`publish` of real checkpoints: Hugging Face directories written with the safetensors library
(sharded with an index, one file, no index), a single .safetensors file, a paddle state dict;
every safetensors dtype; the non-weight files; --link; --json; and each bad input refused in one
line with nothing left behind."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pty
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema_rs
import numpy as np
import paddle
import pytest
import xxhash

from ckpt_agent.cli import add_commands
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_api.manifest import ManifestDocument, render_schema
from ckpt_e2e.hf_checkpoint import HFCheckpoint, Tensor, llama_like, write_safetensors
from ckpt_source.dtypes import BITS, FRAMEWORK_NAMES
from ckpt_source.publish import PublishError, publish_version
from ckpt_source.safetensors_format import encode_header, read_header

INDEX = "model.safetensors.index.json"


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    return parser.parse_args(argv)


def _manifest(version_dir: Path) -> ManifestDocument:
    raw = (version_dir / "manifest.json").read_bytes()
    jsonschema_rs.validator_for(json.loads(render_schema())).validate(json.loads(raw))
    return parse_manifest(raw, expected_version=version_dir.name)


def _assert_published(
    version_dir: Path, tensors: dict[str, Tensor], extra: dict[str, bytes]
) -> ManifestDocument:
    """Every tensor's bytes in the published shards are the source's, every extra file is listed
    with its size and checksum and is byte-identical."""
    manifest = _manifest(version_dir)
    assert {t.name for t in manifest.tensors} == set(tensors)
    for entry in manifest.tensors:
        want = tensors[entry.name]
        assert (entry.dtype, entry.shape) == (want.dtype, want.shape), entry.name
        with (version_dir / entry.file).open("rb") as f:
            f.seek(entry.offset)
            data = f.read(entry.nbytes)
        assert data == want.data, entry.name
        assert xxhash.xxh3_128_hexdigest(data) == entry.xxh3_128
    for name, raw in extra.items():
        listed = manifest.extra_files[name]
        assert (version_dir / name).read_bytes() == raw, name
        assert (listed.size, listed.xxh3_128) == (len(raw), xxhash.xxh3_128_hexdigest(raw))
    assert set(manifest.extra_files) >= set(extra)
    on_disk = {p.name for p in version_dir.iterdir()}
    assert on_disk == {"manifest.json", *manifest.files, *manifest.extra_files}
    return manifest


def _no_leftovers(root: Path, version: str) -> None:
    assert not (root / version).exists()
    assert not root.exists() or not [p for p in root.iterdir() if p.name.startswith(".")], "temp dir left"


@pytest.mark.parametrize(
    ("scale_dtype", "weight_dtype"), [("F8_E8M0", "F8_E4M3"), ("F32", "F8_E4M3"), ("F32", "BF16")]
)
def test_sharded_hf_directory_with_index(tmp_path: Path, scale_dtype: str, weight_dtype: str) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=3, scale_dtype=scale_dtype, weight_dtype=weight_dtype)
    result = publish_version(ckpt.path, "global_step_3", tmp_path / "root")
    out = tmp_path / "root" / "global_step_3"
    manifest = _assert_published(out, ckpt.tensors, ckpt.extra_files)
    assert set(manifest.files) == set(ckpt.shards)
    assert set(manifest.extra_files) == set(ckpt.extra_files)  # config, tokenizer, index...
    for shard in ckpt.shards:
        assert (out / shard).read_bytes() == (ckpt.path / shard).read_bytes()
    assert result.warnings == ()
    assert "lm_head.weight" not in {t.name for t in manifest.tensors}  # tied: HF saves none


def test_one_model_safetensors_without_index(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=4, shards=1, index=False)
    assert list(ckpt.shards) == ["model.safetensors"]
    publish_version(ckpt.path, "v", tmp_path / "root")
    manifest = _assert_published(tmp_path / "root" / "v", ckpt.tensors, ckpt.extra_files)
    assert list(manifest.files) == ["model.safetensors"]
    assert INDEX not in manifest.extra_files, "one shard needs no index"


def test_one_shard_with_index(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=5, shards=1, index=True)
    publish_version(ckpt.path, "v", tmp_path / "root")
    manifest = _assert_published(tmp_path / "root" / "v", ckpt.tensors, ckpt.extra_files)
    assert INDEX in manifest.extra_files


def test_shards_without_index_get_a_generated_one(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=6, shards=2, index=False)
    assert not (ckpt.path / INDEX).exists()
    result = publish_version(ckpt.path, "v", tmp_path / "root")
    out = tmp_path / "root" / "v"
    _assert_published(out, ckpt.tensors, ckpt.extra_files)
    index = json.loads((out / INDEX).read_bytes())
    expected = {name: shard for shard, names in ckpt.shards.items() for name in names}
    assert index["weight_map"] == expected
    assert index["metadata"]["total_size"] == sum(len(t.data) for t in ckpt.tensors.values())
    assert {f.name: f.method for f in result.files}[INDEX] == "written"


def test_a_single_safetensors_file(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=7, shards=1, index=False)
    result = publish_version(ckpt.path / "model.safetensors", "v", tmp_path / "root")
    manifest = _assert_published(tmp_path / "root" / "v", ckpt.tensors, {})
    assert list(manifest.files) == ["model.safetensors"]
    assert manifest.extra_files == {}
    assert [f.kind for f in result.files] == ["shard"]


def test_a_paddle_state_dict_in_several_shards_gets_an_index(tmp_path: Path) -> None:
    state = {
        "w": paddle.to_tensor(np.arange(24, dtype=np.float32).reshape(4, 6)),
        "emb": paddle.to_tensor(np.ones((3, 4), np.float32)).astype("bfloat16"),
        "step": paddle.to_tensor(np.array([7], dtype=np.int64)),
    }
    path = tmp_path / "model.pdparams"
    paddle.save(state, str(path))
    result = publish_version(path, "pd", tmp_path / "root", shard_bytes=64)
    out = tmp_path / "root" / "pd"
    tensors = {
        "w": Tensor("F32", (4, 6), state["w"].numpy().tobytes()),
        "emb": Tensor("BF16", (3, 4), state["emb"].numpy().tobytes()),
        "step": Tensor("I64", (1,), state["step"].numpy().tobytes()),
    }
    manifest = _assert_published(out, tensors, {})
    assert len(manifest.files) >= 2
    index = json.loads((out / INDEX).read_bytes())
    assert index["weight_map"] == {t.name: t.file for t in manifest.tensors}
    assert {f.method for f in result.files} == {"written"}


def test_every_safetensors_dtype_round_trips_byte_identical(tmp_path: Path) -> None:
    assert set(FRAMEWORK_NAMES) | {"F6_E2M3", "F6_E3M2"} == set(BITS)
    rng = np.random.default_rng(11)
    shape = (3, 8)  # 24 elements: whole bytes for the 4- and 6-bit types too
    tensors = {f"t.{d.lower()}": Tensor(d, shape, rng.bytes(24 * bits // 8)) for d, bits in BITS.items()}
    src = tmp_path / "src"
    src.mkdir()
    f6 = {n: t for n, t in tensors.items() if t.dtype not in FRAMEWORK_NAMES}
    library = {n: t for n, t in tensors.items() if n not in f6}
    write_safetensors(src / "model-00001-of-00002.safetensors", library)
    # The library cannot write F6: those go through our header writer.
    prefix, offsets = encode_header([(n, t.dtype, t.shape, len(t.data)) for n, t in f6.items()])
    assert offsets == [0, len(f6["t.f6_e2m3"].data)]
    (src / "model-00002-of-00002.safetensors").write_bytes(prefix + b"".join(t.data for t in f6.values()))
    publish_version(src, "dtypes", tmp_path / "root")
    manifest = _assert_published(tmp_path / "root" / "dtypes", tensors, {})
    assert {t.dtype for t in manifest.tensors} == set(BITS)


def test_kept_and_skipped_files(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=8, index=False, shards=1)
    src = ckpt.path
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc123").write_bytes(b"{{ chat template }}")
    (src / "chat_template.jinja").symlink_to(blobs / "abc123")  # an HF cache snapshot's layout
    (src / "README.md").write_bytes(b"# model\n")
    (src / "original").mkdir()
    (src / "original" / "consolidated.pth").write_bytes(b"x")
    (src / ".gitattributes").write_bytes(b"*.safetensors filter=lfs\n")
    (src / "pytorch_model.bin").write_bytes(b"pickle")
    (src / "pytorch_model.bin.index.json").write_bytes(b"{}")
    (src / "notes (old).txt").write_bytes(b"?")
    (src / "gone.json").symlink_to(tmp_path / "nowhere")
    (src / "manifest.json").write_bytes(b"{}")
    result = publish_version(src, "v", tmp_path / "root")
    kept = dict(
        ckpt.extra_files, **{"chat_template.jinja": b"{{ chat template }}", "README.md": b"# model\n"}
    )
    _assert_published(tmp_path / "root" / "v", ckpt.tensors, kept)
    reasons = {w.split(":")[0].removeprefix("skipped "): w for w in result.warnings}
    assert set(reasons) == {
        "original",
        ".gitattributes",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
        "notes (old).txt",
        "gone.json",
        "manifest.json",
    }
    assert "sub-directory" in reasons["original"]
    assert "another format" in reasons["pytorch_model.bin"]
    assert "broken symlink" in reasons["gone.json"]
    assert "hidden" in reasons[".gitattributes"]


def test_index_total_size_mismatch_is_a_warning(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=9)
    index = json.loads(ckpt.extra_files[INDEX])
    index["metadata"]["total_size"] += 1
    raw = json.dumps(index).encode()
    (ckpt.path / INDEX).write_bytes(raw)
    result = publish_version(ckpt.path, "v", tmp_path / "root")
    assert [w for w in result.warnings if "total_size" in w]
    _assert_published(tmp_path / "root" / "v", ckpt.tensors, {**ckpt.extra_files, INDEX: raw})


def test_shards_the_index_does_not_name_are_skipped(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=10)
    write_safetensors(ckpt.path / "model.safetensors", {"stray": Tensor("F32", (2,), b"\0" * 8)})
    result = publish_version(ckpt.path, "v", tmp_path / "root")
    _assert_published(tmp_path / "root" / "v", ckpt.tensors, ckpt.extra_files)
    assert any(w.startswith("skipped model.safetensors: not named by") for w in result.warnings)


# -- --link ---------------------------------------------------------------------------------------
def test_link_hard_links_every_file_on_the_same_filesystem(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=12)
    result = publish_version(ckpt.path, "v", tmp_path / "root", link=True)
    out = tmp_path / "root" / "v"
    for f in result.files:
        assert f.method == "hardlink", f
        src, dst = (ckpt.path / f.name).stat(), (out / f.name).stat()
        assert (dst.st_ino, dst.st_dev) == (src.st_ino, src.st_dev)
        assert dst.st_nlink == 2
    _assert_published(out, ckpt.tensors, ckpt.extra_files)


def test_without_link_the_version_shares_no_inode_with_the_source(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=13)
    result = publish_version(ckpt.path, "v", tmp_path / "root")
    assert {f.method for f in result.files} <= {"reflink", "copy"}
    for f in result.files:
        assert (tmp_path / "root" / "v" / f.name).stat().st_ino != (ckpt.path / f.name).stat().st_ino


def _other_filesystem(tmp_path: Path) -> Path | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        return shm
    return None


def test_link_falls_back_across_filesystems(tmp_path: Path) -> None:
    other = _other_filesystem(tmp_path)
    if other is None:
        # Same filesystem everywhere: force the fallback order a cross-device link would take.
        src_root, methods = tmp_path, ("reflink", "copy")
    else:
        src_root, methods = other, None
    src = src_root / f"ckpt-publish-{os.getpid()}-{tmp_path.name}"
    try:
        ckpt = llama_like(src, seed=14)
        result = publish_version(
            ckpt.path, "v", tmp_path / "root", link=True, **({"methods": methods} if methods else {})
        )
        assert {f.method for f in result.files} <= {"reflink", "copy"}
        for f in result.files:
            assert (tmp_path / "root" / "v" / f.name).stat().st_nlink == 1
        _assert_published(tmp_path / "root" / "v", ckpt.tensors, ckpt.extra_files)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def test_methods_can_force_a_copy(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=15)
    result = publish_version(ckpt.path, "v", tmp_path / "root", methods=("copy",))
    assert {f.method for f in result.files} == {"copy"}
    _assert_published(tmp_path / "root" / "v", ckpt.tensors, ckpt.extra_files)


# -- the command line -----------------------------------------------------------------------------
def test_cli_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=16)
    args = _cli(
        ["publish", str(ckpt.path), "--version", "v1", "--out", str(tmp_path / "root"), "--link", "--json"]
    )
    assert args.func(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    raw = (tmp_path / "root" / "v1" / "manifest.json").read_bytes()
    assert summary["digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert summary["version"] == "v1"
    assert summary["link_methods"] == {"hardlink": len(ckpt.shards) + len(ckpt.extra_files)}
    assert {f["name"] for f in summary["files"]} == set(ckpt.shards) | set(ckpt.extra_files)
    assert summary["bytes"] == sum(f["bytes"] for f in summary["files"])
    assert summary["tensors"] == len(ckpt.tensors)
    assert summary["seconds"] >= 0
    # Not a terminal: one line per file on stderr, saying how it was placed.
    lines = captured.err.strip().splitlines()
    assert len(lines) == len(summary["files"])
    assert all(line.startswith("publish: ") and line.endswith("(hardlink)") for line in lines)


def test_a_terminal_gets_a_progress_bar_with_rate_and_eta(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=18)
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ckpt_agent", "publish", str(ckpt.path), "--version", "v1", "--out",
             str(tmp_path / "root"), "--link"],
            stdout=subprocess.PIPE,
            stderr=slave,
            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
            timeout=120,
            check=False,
        )  # fmt: skip
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, terminal
    assert proc.stdout.decode().strip().startswith("sha256:")
    assert "publish v1" in terminal
    assert "/s" in terminal, "a rate column"
    assert "config.json" in terminal
    assert "(hardlink)" in terminal


def _bad_header_length(src: Path) -> None:
    raw = b'{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    (src / "model.safetensors").write_bytes((len(raw) + 100).to_bytes(8, "little") + raw + b"\0\0")


def _header_with(src: Path, dtype: str, shape: list[int], nbytes: int) -> None:
    raw = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    (src / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * nbytes)


def _index(src: Path, weight_map: dict[str, str]) -> None:
    (src / INDEX).write_text(json.dumps({"metadata": {"total_size": 8}, "weight_map": weight_map}))


def _two(src: Path, a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    write_safetensors(src / "model-00001-of-00002.safetensors", a)
    write_safetensors(src / "model-00002-of-00002.safetensors", b)


T = Tensor("F32", (2,), b"\0" * 8)

BAD_INPUTS: dict[str, tuple[Callable[[Path], Any], str, str]] = {
    # case: (what the source gets, the file the message names, a fragment of it)
    "no weights": (lambda s: (s / "config.json").write_text("{}"), "src", "no weights"),
    "only other formats": (
        lambda s: (s / "pytorch_model.bin").write_bytes(b"x"),
        "src",
        "convert to safetensors",
    ),
    "index names a missing shard": (
        lambda s: (
            _two(s, {"a": T}, {"b": T}),
            _index(s, {"a": "model-00001-of-00002.safetensors", "b": "model-00003-of-00003.safetensors"}),
        ),
        INDEX,
        "missing",
    ),
    "index maps a tensor to a shard without it": (
        lambda s: (
            _two(s, {"a": T}, {"b": T}),
            _index(s, {"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}),
        ),
        INDEX,
        "maps tensor 'a' to model-00002-of-00002.safetensors, but it is in model-00001",
    ),
    "index misses a tensor": (
        lambda s: (
            _two(s, {"a": T, "c": T}, {"b": T}),
            _index(s, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}),
        ),
        INDEX,
        "does not list tensor 'c'",
    ),
    "tensor in two shards": (lambda s: _two(s, {"a": T}, {"a": T}), "model-00002", "more than one shard"),
    "tensor in two shards, with index": (
        lambda s: (
            _two(s, {"a": T}, {"a": T, "b": T}),
            _index(s, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}),
        ),
        "model-00002",
        "more than one shard",
    ),
    "header longer than its file": (_bad_header_length, "model.safetensors", "past the end of the file"),
    "bytes do not match dtype and shape": (
        lambda s: _header_with(s, "F32", [3], 8),
        "model.safetensors",
        "F32[3] needs 12",
    ),
    "unknown dtype": (
        lambda s: _header_with(s, "F33", [2], 8),
        "model.safetensors",
        "unsupported dtype 'F33'",
    ),
    "packed dtype short of a byte": (
        lambda s: _header_with(s, "F4", [3], 2),
        "model.safetensors",
        "not a whole number of bytes",
    ),
    "not JSON index": (
        lambda s: (_two(s, {"a": T}, {"b": T}), (s / INDEX).write_text("{")),
        INDEX,
        "not JSON",
    ),
    "unsafe shard name": (
        lambda s: write_safetensors(s / "model (1).safetensors", {"a": T}),
        "model (1).safetensors",
        "shard name",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_1_and_nothing_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, names, fragment = BAD_INPUTS[case]
    src = tmp_path / "src"
    src.mkdir()
    make(src)
    root = tmp_path / "root"
    args = _cli(["publish", str(src), "--version", "v1", "--out", str(root)])
    assert args.func(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = [line for line in captured.err.splitlines() if not line.startswith("publish: warning:")]
    assert len(err) == 1, captured.err
    assert err[0].startswith("ckpt-rollout publish: ")
    assert names in err[0], err[0]
    assert fragment in err[0], err[0]
    _no_leftovers(root, "v1")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"not a checkpoint at all", "neither a *.safetensors file nor a paddle state dict")],
)
def test_a_file_that_is_no_checkpoint(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "weights.pdparams"
    path.write_bytes(content)
    with pytest.raises(PublishError, match=r"weights\.pdparams") as info:
        publish_version(path, "v", tmp_path / "root")
    assert fragment in str(info.value)
    _no_leftovers(tmp_path / "root", "v")


def test_read_header_agrees_with_the_library_writer(tmp_path: Path) -> None:
    ckpt: HFCheckpoint = llama_like(tmp_path / "hf", seed=17)
    for shard, names in ckpt.shards.items():
        assert sorted(t.name for t in read_header(ckpt.path / shard)) == sorted(names)
