"""docs/architecture.md keeps up with the layers import-linter enforces: every contract is quoted
by name and every layer of a layers contract is named, so a new layer or contract without its
documentation fails here rather than leaving the design document behind."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def contracts(pyproject: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pyproject["tool"]["importlinter"]["contracts"])


def layer_names(contract: dict[str, Any]) -> list[str]:
    """The modules a layers contract names, each layer split at its independence bars."""
    return [name.strip() for layer in contract.get("layers", []) for name in layer.split("|")]


def is_named(doc: str, container: str, name: str) -> bool:
    """Named as code: `name`, `name/` (a package), `name.py` (a module) or `container.name`."""
    spellings = (f"`{name}`", f"`{name}/`", f"`{name}.py`", f"`{container}.{name}`")
    return any(spelling in doc for spelling in spellings)


def unnamed_layers(doc: str, pyproject: dict[str, Any]) -> list[str]:
    missing = []
    for contract in contracts(pyproject):
        for container in contract.get("containers", []):
            missing += [
                f"{container}.{name}" for name in layer_names(contract) if not is_named(doc, container, name)
            ]
    return missing


def unquoted_contracts(doc: str, pyproject: dict[str, Any]) -> list[str]:
    return [c["name"] for c in contracts(pyproject) if f'"{c["name"]}"' not in doc]


def unnamed_roots(doc: str, pyproject: dict[str, Any]) -> list[str]:
    return [p for p in pyproject["tool"]["importlinter"]["root_packages"] if f"`{p}`" not in doc]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def doc() -> str:
    assert ARCHITECTURE.is_file(), "docs/architecture.md is missing: the design document lives in the repo"
    return ARCHITECTURE.read_text()


def test_every_layer_is_named(doc: str, pyproject: dict[str, Any]) -> None:
    assert unnamed_layers(doc, pyproject) == []


def test_every_contract_is_quoted(doc: str, pyproject: dict[str, Any]) -> None:
    assert unquoted_contracts(doc, pyproject) == []


def test_every_root_package_is_named(doc: str, pyproject: dict[str, Any]) -> None:
    assert unnamed_roots(doc, pyproject) == []


def test_a_new_layer_or_contract_without_docs_is_caught(doc: str) -> None:
    """The checks can fail: a layer and a contract the document never mentions are reported."""
    grown = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layered = next(c for c in contracts(grown) if c.get("type") == "layers")
    layered["layers"] = [*layered["layers"], "undocumented_layer | another_one"]
    grown["tool"]["importlinter"]["contracts"].append(
        {"name": "An undocumented contract", "type": "forbidden"}
    )
    container = layered["containers"][0]
    assert unnamed_layers(doc, grown) == [f"{container}.undocumented_layer", f"{container}.another_one"]
    assert unquoted_contracts(doc, grown) == ["An undocumented contract"]
