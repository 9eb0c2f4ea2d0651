"""The checkpoint versions the scenario suite rolls out, built the same way on every cluster.

The local provider builds the catalog into a temp dir and serves it with `ckpt-rollout serve`;
on an existing cluster (the kind path) an init container of the in-cluster checkpoint source
runs this very file (`python catalog.py /data`, from a ConfigMap) in the worker image, and the
test process builds a copy locally only to know what each version must answer on /v1/infer.
Versions come from seeds, so both copies hold the same tensors.

Imports only the standard library and ckpt_agent (what the worker image has); publishing goes
through `python -m ckpt_agent publish`, the command users run (`ckpt-rollout publish`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# A bigger reference model (~100 MB a version), so loads last long enough to act on a rollout
# mid-load or mid-wave. Agents serving it need the same shape: see `model_flags`.
BIG_MODEL = {"hidden": 2048, "layers": 6}


@dataclass(frozen=True)
class Entry:
    version: str
    seed: int
    big: bool = False
    corrupt: str | None = None  # flip a byte inside this tensor after publishing
    truncate: bool = False  # cut the (last) shard in half after publishing
    poison: str | None = None  # this tensor holds a NaN, published as is (valid checksums)


CATALOG = (
    Entry("v1", 1),
    Entry("v2", 2),
    Entry("v3", 3),
    Entry("b1", 21, big=True),
    Entry("b2", 22, big=True),
    Entry("b3", 23, big=True),
    # Damaged on the source after publishing, as a bad disk or a half-finished copy would.
    Entry("v-corrupt", 9, corrupt="layers.1.weight"),
    Entry("v-truncated", 11, truncate=True),
    # A diverged training step: NaN weights, every checksum valid.
    Entry("v-nan", 13, poison="layers.1.weight"),
)


def model_flags(big: bool) -> list[str]:
    """Agent flags for the model shape the versions of that size have."""
    if not big:
        return []
    return ["--model-hidden", str(BIG_MODEL["hidden"]), "--model-layers", str(BIG_MODEL["layers"])]


def publish_version(
    root: Path,
    version: str,
    seed: int,
    work: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    poison: str | None = None,
) -> str:
    """Write the reference model for ``seed`` and publish it as ``version`` under ``root`` with
    `ckpt-rollout publish`, with its published reference outputs (none for a NaN checkpoint);
    returns the manifest digest."""
    from ckpt_agent.formats.synth import ReferenceModelSpec, published_reference, write_reference_checkpoint

    spec = ReferenceModelSpec(hidden=hidden, layers=layers)
    src = work / f"src-{version}"
    write_reference_checkpoint(src, seed, spec, poison=poison)
    command = [
        sys.executable,
        "-m",
        "ckpt_agent",
        "publish",
        str(src),
        "--version",
        version,
        "--out",
        str(root),
    ]
    reference = published_reference(spec, seed, poison=poison)
    if reference is not None:
        path = work / f"reference-{version}.json"
        path.write_text(reference.model_dump_json())
        command += ["--reference", str(path)]
    out = subprocess.run(
        command,
        check=True,
        capture_output=True,
        text=True,
    )
    digest = out.stdout.strip().splitlines()[-1]
    if not digest.startswith("sha256:"):
        raise RuntimeError(f"publish {version}: unexpected output {out.stdout!r}")
    return digest


def corrupt_tensor(version_dir: Path, tensor: str) -> None:
    """Flip one byte inside ``tensor``'s data: the manifest's checksum no longer matches."""
    manifest = json.loads((version_dir / "manifest.json").read_text())
    entry = next(t for t in manifest["tensors"] if t["name"] == tensor)
    shard = version_dir / entry["file"]
    with open(shard, "r+b") as fh:
        fh.seek(entry["offset"] + entry["nbytes"] // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def truncate_shard(version_dir: Path) -> str:
    """Cut the last shard in half (the manifest still lists its full size); returns its name."""
    manifest = json.loads((version_dir / "manifest.json").read_text())
    shard = sorted(manifest["files"])[-1]
    path = version_dir / shard
    os.truncate(path, path.stat().st_size // 2)
    return str(shard)


def build(root: Path, work: Path, entries: tuple[Entry, ...] = CATALOG) -> dict[str, str]:
    """Publish ``entries`` under ``root`` (damaging the ones that ask for it); returns digests."""
    root.mkdir(parents=True, exist_ok=True)
    digests = {}
    for e in entries:
        shape = BIG_MODEL if e.big else {}
        digests[e.version] = publish_version(root, e.version, e.seed, work, poison=e.poison, **shape)
        if e.corrupt:
            corrupt_tensor(root / e.version, e.corrupt)
        if e.truncate:
            truncate_shard(root / e.version)
    return digests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="publish the e2e scenario versions under ROOT")
    parser.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        for version, digest in build(args.root, Path(work)).items():
            print(f"{version} {digest}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
