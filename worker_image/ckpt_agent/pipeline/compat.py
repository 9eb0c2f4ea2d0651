"""Does a checkpoint fit the live model? Names, shapes and dtypes, checked before any byte moves."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_api.manifest import ManifestDocument

_MAX_LISTED = 8


@dataclass(frozen=True)
class ParamSpec:
    dtype: str  # safetensors name, e.g. "F32"
    shape: tuple[int, ...]


def _listing(names: list[str]) -> str:
    return _listing_text([repr(n) for n in names])


def _listing_text(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def compatibility_problems(
    manifest: ManifestDocument, params: Mapping[str, ParamSpec], *, holds: Collection[str] | None = None
) -> list[str]:
    """Human-readable problems; empty when every tensor maps to a parameter of the same shape
    and dtype and every parameter is covered. `holds`: the dtypes the engine can hold at all
    (None: any); a tensor of another dtype is named first, with its dtype, whatever else is
    wrong, because no model of that engine could ever take it."""
    ranked = sorted({f.rank for f in manifest.files.values() if f.rank is not None})
    if ranked:
        # Its ranks' files repeat every parameter name: one model holds one rank's at most.
        return [f"the version is saved per tensor-parallel rank ({_listing_text([str(r) for r in ranked])})"]
    tensors = {t.name: t for t in manifest.tensors}
    problems = []
    if holds is not None:
        unheld = [f"{t.name!r} is {t.dtype}" for t in manifest.tensors if t.dtype not in holds]
        if unheld:
            problems.append(f"dtypes the engine cannot hold: {_listing_text(unheld)}")
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


def check_compatible(
    manifest: ManifestDocument, params: Mapping[str, ParamSpec], *, holds: Collection[str] | None = None
) -> None:
    problems = compatibility_problems(manifest, params, holds=holds)
    if problems:
        raise LoadError(
            Reason.INCOMPATIBLE_CHECKPOINT,
            f"version {manifest.version} does not fit the model: " + "; ".join(problems),
        )
