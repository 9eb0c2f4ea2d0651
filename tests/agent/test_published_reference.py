"""The manifest's published reference (what the reference model answers with a version's
weights): written by `ckpt-rollout publish --reference`, computed by the reference-model
publisher from the weights it publishes, read back by the agent; a bad one is refused with a
clear error and nothing published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_agent.cli import build_parser
from ckpt_agent.common.errors import LoadError
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.formats.synth import (
    REFERENCE_ATOL,
    ReferenceModelSpec,
    expected_infer_output,
    published_reference,
    write_reference_checkpoint,
)
from ckpt_api.manifest import MANIFEST_NAME, ReferenceRecord

SPEC = ReferenceModelSpec(hidden=16, layers=2, outputs=4)


def _publish(tmp_path: Path, *extra: str) -> int:
    src = tmp_path / "src"
    write_reference_checkpoint(src, seed=3, spec=SPEC)
    args = build_parser().parse_args(
        ["publish", str(src), "--version", "v3", "--out", str(tmp_path / "root"), *extra]
    )
    return int(args.func(args))


def test_the_publisher_writes_the_reference_of_the_weights_it_publishes(tmp_path: Path) -> None:
    reference = published_reference(SPEC, seed=3)
    assert reference is not None
    path = tmp_path / "reference.json"
    path.write_text(reference.model_dump_json())
    assert _publish(tmp_path, "--reference", str(path)) == 0
    manifest = parse_manifest((tmp_path / "root" / "v3" / MANIFEST_NAME).read_bytes())
    assert manifest.reference == ReferenceRecord(outputs=reference.outputs, atol=REFERENCE_ATOL)
    # The reference is what /v1/infer answers once these bytes are live.
    live = expected_infer_output(tmp_path / "root" / "v3")
    assert max(abs(a - b) for a, b in zip(live, manifest.reference.outputs, strict=True)) < 1e-6


def test_a_nan_checkpoint_has_no_reference_to_publish() -> None:
    assert published_reference(SPEC, seed=3, poison="layers.0.weight") is None


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"outputs": [1.0], "atol": 0}', "atol: Input should be greater than 0"),
        ('{"outputs": [], "atol": 0.1}', "outputs: List should have at least 1 item"),
        ('{"outputs": ["x"], "atol": 0.1}', "outputs.0: Input should be a valid number"),
        ('{"outputs": [1.0]}', "atol: Field required"),
        ("not json", "Invalid JSON"),
    ],
    ids=["zero-atol", "no-outputs", "not-numbers", "no-atol", "not-json"],
)
def test_a_bad_reference_file_is_refused_and_nothing_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    path = tmp_path / "reference.json"
    path.write_text(content)
    assert _publish(tmp_path, "--reference", str(path)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ckpt-rollout publish: {path}: not a reference {{outputs, atol}}: "), err
    assert says in err, err
    assert not (tmp_path / "root").exists()


def test_a_missing_reference_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _publish(tmp_path, "--reference", str(tmp_path / "nope.json")) == 1
    assert f"{tmp_path / 'nope.json'}: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("reference", "says"),
    [
        ({"outputs": [1.0], "atol": -1}, "invalid manifest: reference must be"),
        ({"outputs": [1.0], "atol": 0.1, "rtol": 0}, None),  # unknown fields: ignored
    ],
    ids=["negative-atol", "unknown-field"],
)
def test_the_agent_reads_the_manifest_reference_strictly(
    tmp_path: Path, reference: dict[str, object], says: str | None
) -> None:
    _publish(tmp_path)
    path = tmp_path / "root" / "v3" / MANIFEST_NAME
    doc = json.loads(path.read_bytes())
    assert "reference" not in doc, "no --reference: no reference"
    doc["reference"] = reference
    raw = json.dumps(doc).encode()
    if says is None:
        assert parse_manifest(raw).reference == ReferenceRecord(outputs=[1.0], atol=0.1)
        return
    with pytest.raises(LoadError, match=says):
        parse_manifest(raw)
