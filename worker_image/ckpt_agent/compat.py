"""Does a checkpoint fit the live model? Names, shapes and dtypes, checked before any byte moves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_agent.errors import LoadError, Reason
from ckpt_agent.manifest import Manifest

_MAX_LISTED = 8


@dataclass(frozen=True)
class ParamSpec:
    dtype: str  # safetensors name, e.g. "F32"
    shape: tuple[int, ...]


def _listing(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def compatibility_problems(manifest: Manifest, params: Mapping[str, ParamSpec]) -> list[str]:
    """Human-readable problems; empty when every tensor maps to a parameter of the same shape
    and dtype and every parameter is covered."""
    tensors = {t.name: t for t in manifest.tensors}
    problems = []
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    if missing:
        problems.append(f"missing tensors for parameters {_listing(missing)}")
    if extra:
        problems.append(f"tensors with no matching parameter {_listing(extra)}")
    mismatched = []
    for name in sorted(set(params) & set(tensors)):
        want, got = params[name], tensors[name]
        if want.shape != got.shape or want.dtype != got.dtype:
            mismatched.append(
                f"{name!r} is {got.dtype}{list(got.shape)} in the checkpoint, "
                f"{want.dtype}{list(want.shape)} in the model"
            )
    if mismatched:
        more = len(mismatched) - _MAX_LISTED
        problems.append(
            "shape/dtype mismatch: "
            + "; ".join(mismatched[:_MAX_LISTED])
            + (f"; and {more} more" if more > 0 else "")
        )
    return problems


def check_compatible(manifest: Manifest, params: Mapping[str, ParamSpec]) -> None:
    problems = compatibility_problems(manifest, params)
    if problems:
        raise LoadError(
            Reason.INCOMPATIBLE_CHECKPOINT,
            f"version {manifest.version} does not fit the model: " + "; ".join(problems),
        )
