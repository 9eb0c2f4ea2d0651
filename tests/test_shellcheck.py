"""Every shell script in the tree is shellcheck-clean (e2e/kind/run.sh, .ci/run, ...).

shellcheck comes from Debian; `scripts/install-system-deps.sh` (run by `make test`) installs it.
Without it these tests fail: a green run that skipped the lint would hide a missing install step.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHEBANGS = (b"#!/bin/sh", b"#!/bin/bash", b"#!/usr/bin/env bash", b"#!/usr/bin/env sh")


def shell_scripts() -> list[Path]:
    """Tracked and untracked-but-not-ignored files ending in .sh or starting with a sh/bash shebang."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    found = []
    for name in listed:
        path = ROOT / name
        if not path.is_file():
            continue
        if path.suffix == ".sh":
            found.append(path)
            continue
        with path.open("rb") as fh:
            if fh.read(24).startswith(SHEBANGS):
                found.append(path)
    return sorted(found)


def test_the_kind_path_and_ci_scripts_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in shell_scripts()}
    assert {"e2e/kind/run.sh", "e2e/provision.sh", ".ci/run"} <= names


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_shellcheck_clean(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck is not None, (
        "shellcheck missing: `make test` installs it (scripts/install-system-deps.sh)"
    )
    result = subprocess.run(
        [shellcheck, "--external-sources", str(script)], capture_output=True, text=True, cwd=script.parent
    )
    assert result.returncode == 0, result.stdout + result.stderr
