"""Synthetic checkpoints for the reference model, and what it must answer for each.

Used by tests, benches and the demo: `write_reference_checkpoint` writes safetensors shards
deterministically from a seed; `expected_infer_output` computes with numpy what `/v1/infer`
returns once a published version is live, so a test can prove which weights serve traffic;
`published_reference` is what a publisher writes into the manifest for the agent's smoke check.
No paddle import here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckpt_agent.formats.manifest import parse_manifest
from ckpt_api.manifest import MANIFEST_NAME, ReferenceRecord
from ckpt_source.dtypes import numpy_dtype
from ckpt_source.safetensors_format import write_file


@dataclass(frozen=True)
class ReferenceModelSpec:
    """Shape of the reference MLP: `layers` x (Linear(hidden, hidden) + tanh), then a head."""

    hidden: int = 64
    layers: int = 2
    outputs: int = 8

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        # Paddle's Linear stores weight as [in_features, out_features].
        shapes: dict[str, tuple[int, ...]] = {}
        for i in range(self.layers):
            shapes[f"layers.{i}.weight"] = (self.hidden, self.hidden)
            shapes[f"layers.{i}.bias"] = (self.hidden,)
        shapes["head.weight"] = (self.hidden, self.outputs)
        shapes["head.bias"] = (self.outputs,)
        return shapes

    def nbytes(self) -> int:
        return sum(int(np.prod(s)) * 4 for s in self.parameter_shapes().values())


def reference_input(hidden: int) -> np.ndarray:
    """The fixed input `/v1/infer` runs: a smooth non-symmetric signal, shape [1, hidden]."""
    x = np.sin(np.arange(hidden, dtype=np.float64) * 0.7 + 0.3)
    return x.astype(np.float32)[None, :]


def reference_params(spec: ReferenceModelSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for name, shape in spec.parameter_shapes().items():
        # Gain 1.5 keeps tanh activations away from 0 and saturation, so every layer moves the output.
        scale = 1.5 / np.sqrt(shape[0]) if len(shape) == 2 else 0.1
        params[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)
    return params


def checkpoint_params(
    spec: ReferenceModelSpec, seed: int, poison: str | None = None
) -> dict[str, np.ndarray]:
    """The weights of the checkpoint for `seed`; `poison` names a tensor whose middle element is
    NaN, as a diverged training step leaves it (its checksums are as valid as any)."""
    params = reference_params(spec, seed)
    if poison is not None:
        params[poison].flat[params[poison].size // 2] = np.nan
    return params


# Outputs of paddle's float32 forward pass stay within ~1e-5 of numpy's float64 one here; a wrong
# export is off by tenths. Loose enough for GPU kernels (TF32) too.
REFERENCE_ATOL = 1e-2


def published_reference(
    spec: ReferenceModelSpec, seed: int, *, poison: str | None = None, atol: float = REFERENCE_ATOL
) -> ReferenceRecord | None:
    """The manifest's `reference` for the checkpoint of `seed`: its forward pass on the fixed
    input. None when that is not finite (a NaN checkpoint has no reference to publish)."""
    outputs = reference_forward(spec, checkpoint_params(spec, seed, poison))
    if not all(np.isfinite(outputs)):
        return None
    return ReferenceRecord(outputs=[float(v) for v in outputs], atol=atol)


def reference_forward(spec: ReferenceModelSpec, params: dict[str, np.ndarray]) -> list[float]:
    x = reference_input(spec.hidden).astype(np.float64)
    for i in range(spec.layers):
        x = np.tanh(x @ params[f"layers.{i}.weight"] + params[f"layers.{i}.bias"])
    out = x @ params["head.weight"] + params["head.bias"]
    return [float(v) for v in out.ravel()]


def write_reference_checkpoint(
    directory: Path | str,
    seed: int,
    spec: ReferenceModelSpec | None = None,
    *,
    hidden: int = 64,
    layers: int = 2,
    outputs: int = 8,
    shards: int = 1,
    poison: str | None = None,
) -> ReferenceModelSpec:
    """Write the reference model's weights for `seed` as `shards` safetensors files. The shape
    comes from `spec` when given, else from `hidden`/`layers`/`outputs`; `poison`: see
    `checkpoint_params`."""
    spec = spec or ReferenceModelSpec(hidden=hidden, layers=layers, outputs=outputs)
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    items = list(checkpoint_params(spec, seed, poison).items())
    per_shard = -(-len(items) // shards)
    for index in range(shards):
        chunk = items[index * per_shard : (index + 1) * per_shard]
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        with (out_dir / name).open("wb") as f:
            write_file(f, ((n, "F32", a.shape, a.data.cast("B")) for n, a in chunk))
    return spec


def load_published_tensors(version_dir: Path | str) -> dict[str, np.ndarray]:
    """Every tensor of a published version directory, via its manifest."""
    root = Path(version_dir)
    manifest = parse_manifest((root / MANIFEST_NAME).read_bytes())
    tensors = {}
    for entry in manifest.tensors:
        with (root / entry.file).open("rb") as f:
            f.seek(entry.offset)
            raw = f.read(entry.nbytes)
        tensors[entry.name] = np.frombuffer(raw, dtype=numpy_dtype(entry.dtype)).reshape(entry.shape)
    return tensors


def spec_of(tensors: dict[str, np.ndarray]) -> ReferenceModelSpec:
    layers = sum(1 for n in tensors if n.startswith("layers.") and n.endswith(".weight"))
    hidden, outputs = tensors["head.weight"].shape
    return ReferenceModelSpec(hidden=int(hidden), layers=layers, outputs=int(outputs))


def expected_infer_output(published_version_dir: Path | str) -> list[float]:
    """What `/v1/infer` answers while the version in `published_version_dir` is live."""
    tensors = load_published_tensors(published_version_dir)
    return reference_forward(spec_of(tensors), tensors)


def manifest_version(published_version_dir: Path | str) -> str:
    doc = json.loads((Path(published_version_dir) / MANIFEST_NAME).read_bytes())
    return str(doc["version"])
