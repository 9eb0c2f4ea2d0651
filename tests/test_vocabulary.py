"""Every phase, state, reason, condition type, annotation, label and lease name lives in
ckpt_api.vocabulary; the product and the harness name them, never retype them."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import pytest
from pydantic import BaseModel

from ckpt_api import vocabulary
from ckpt_api.status import CheckpointRolloutStatus

ROOT = Path(__file__).resolve().parents[1]
# Where a retyped word would drift from the shared one: the operator, the agent, the checkpoint
# publisher, the harness.
SCANNED = [
    ROOT / "operator" / "ckpt_rollout",
    ROOT / "worker_image" / "ckpt_agent",
    ROOT / "worker_image" / "ckpt_source",
    ROOT / "e2e" / "ckpt_e2e",
]

# (path under a scanned root's parent, literal): why it is not the vocabulary word.
ALLOWED = {
    ("ckpt_rollout/chartgen/chart_values.py", "ckpt-rollout-operator"): (
        "the operator image's default repository, which shares the Lease's name"
    ),
    ("ckpt_e2e/standins/sglang.py", "Unauthorized"): "SGLang's own 401 body, which its stand-in answers",
}


def _words() -> dict[str, str]:
    """Every vocabulary value -> where it is defined."""
    words: dict[str, str] = {}
    for name, value in vars(vocabulary).items():
        if isinstance(value, type) and issubclass(value, StrEnum) and value.__module__ == vocabulary.__name__:
            for member in value:
                words.setdefault(member.value, f"{name}.{member.name}")
        elif name.isupper() and isinstance(value, str):
            words.setdefault(value, name)
    return words


def _field_names(model: type[BaseModel]) -> set[str]:
    """The wire names of a model's fields and of its nested models' fields."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        names.add(field.alias or name)
        for arg in _type_args(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names |= _field_names(arg)
    return names


def _type_args(annotation: object) -> Iterator[object]:
    yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _type_args(arg)


# A status field named like a word ("updated" and "failed" are wave counters, and metric label
# values) is the field where it is a key: a dict display's key, a subscript, a .get() argument.
FIELD_NAMES = _field_names(CheckpointRolloutStatus)


def _key_positions(tree: ast.AST) -> set[int]:
    keys: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
        ):
            keys.add(id(node.args[0]))
    return keys


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _literals(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    keys = _key_positions(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        if id(node) in keys and node.value in FIELD_NAMES:
            continue
        yield node.lineno, node.value


def _retyped() -> Iterator[tuple[str, int, str]]:
    words = _words()
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).as_posix()
            for line, value in _literals(path):
                if value in words and (rel, value) not in ALLOWED:
                    yield rel, line, value


def test_no_vocabulary_word_is_retyped_outside_ckpt_api() -> None:
    words = _words()
    found = [f"{rel}:{line}: {value!r} is {words[value]}" for rel, line, value in _retyped()]
    assert not found, "use the ckpt_api.vocabulary name:\n" + "\n".join(found)


def test_allowed_literals_still_occur() -> None:
    present = {
        (path.relative_to(root.parent).as_posix(), value)
        for root in SCANNED
        for path in root.rglob("*.py")
        for _, value in _literals(path)
    }
    assert set(ALLOWED) <= present, f"stale entries: {set(ALLOWED) - present}"


def test_the_scan_sees_a_retyped_word(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        '"""Succeeded in a docstring is prose."""\n'
        'x = {"updated": 1}\n'  # a status field, as a key
        'y = w.get("failed")\n'
        'if phase == "RolledBack": z = "updated"\n'
    )
    assert [v for _, v in _literals(source) if v in _words()] == ["RolledBack", "updated"]


def test_vocabulary_imports_no_operator_framework_or_kubernetes_client() -> None:
    code = (
        "import sys, ckpt_api.vocabulary, ckpt_api.status, ckpt_api.constants; "
        "print(sorted({'kopf', 'aiohttp', 'kubernetes', 'kubernetes_asyncio'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


# The words users, kubectl, dashboards and other components read: a change here is a change of
# the contract (a rename needs an issue), not a refactoring.
WIRE_WORDS: dict[type[StrEnum], list[str]] = {
    vocabulary.Phase: [
        "Pending",
        "Progressing",
        "Paused",
        "Succeeded",
        "Failed",
        "RollingBack",
        "RolledBack",
    ],
    vocabulary.WorkerPhase: ["Pending", "Loading", "Updated", "Failed"],
    vocabulary.WavePhase: ["Running", "Analyzing", "Completed", "Failed"],
    vocabulary.AnalysisPhase: ["Running", "Passed", "Failed", "Skipped"],
    vocabulary.WaveKind: ["Spec", "CatchUp", "Drift"],
    vocabulary.ConditionStatus: ["True", "False", "Unknown"],
    vocabulary.ConditionType: [
        "Progressing",
        "Complete",
        "Failed",
        "Paused",
        "Ready",
        "Reconciling",
        "Stalled",
    ],
    vocabulary.AgentState: ["idle", "loading", "failed"],
    vocabulary.HealthCheckOutcome: ["passed", "failed", "skipped"],
    vocabulary.WorkerReason: [
        "Loading",
        "Loaded",
        "Staged",
        "ChecksumMismatch",
        "IncompatibleCheckpoint",
        "ManifestDigestMismatch",
        "SourceUnreachable",
        "VersionNotFound",
        "TruncatedShard",
        "ManifestTooLarge",
        "InvalidVersion",
        "InvalidManifest",
        "NonFiniteTensor",
        "HealthCheckFailed",
        "EngineError",
        "InvalidSource",
        "StagingFull",
        "Cancelled",
        "WorkerTimeout",
        "MemberFailed",
        "AgentUnreachable",
        "LoadFailed",
    ],
    vocabulary.UpdateResult: ["accepted", "noop", "conflict", "rejected"],
    vocabulary.LoadResult: ["succeeded", "failed"],
    vocabulary.WorkerResult: ["updated", "failed", "rolled_back"],
    vocabulary.EventType: ["Normal", "Warning"],
}


@pytest.mark.parametrize("enum", list(WIRE_WORDS), ids=lambda e: e.__name__)
def test_wire_words_are_stable(enum: type[StrEnum]) -> None:
    assert [m.value for m in enum] == WIRE_WORDS[enum]


def test_metadata_names_are_stable() -> None:
    assert vocabulary.PROMOTE_ANNOTATION == "rollout.ckpt.dev/promote"
    assert vocabulary.ABORT_ANNOTATION == "rollout.ckpt.dev/abort"
    assert vocabulary.SKIP_ANALYSIS_ANNOTATION == "rollout.ckpt.dev/skip-analysis"
    assert vocabulary.FINALIZER == "rollout.ckpt.dev/finalizer"
    assert vocabulary.WEIGHTS_READY_CONDITION == "rollout.ckpt.dev/WeightsReady"
    assert vocabulary.LEASE_NAME == "ckpt-rollout-operator"
