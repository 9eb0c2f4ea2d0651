"""What a Dockerfile puts into its image, read from the Dockerfile itself (test harness only).

The file-set tests install exactly the files an image's build copies into a clean venv, with the
extra the image installs, so a module the image lacks fails a test here and not a user's pod. Reading the
Dockerfile (instead of a list kept next to it) keeps the two from drifting.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    word: str  # upper-cased: FROM, COPY, RUN, ...
    rest: str


def instructions(dockerfile: Path) -> list[Instruction]:
    """The Dockerfile's instructions with continuation lines joined; heredoc bodies dropped."""
    out: list[Instruction] = []
    lines = dockerfile.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if nxt.startswith("#"):
                continue
            line = line[:-1].rstrip() + " " + nxt
        word, _, rest = line.partition(" ")
        if "<<" in rest:  # heredoc: skip its body up to the terminator
            marker = rest.split("<<", 1)[1].split()[0].strip("'\"-")
            while i < len(lines) and lines[i].strip() != marker:
                i += 1
            i += 1
        out.append(Instruction(word.upper(), rest.strip()))
    return out


def copied_sources(dockerfile: Path) -> list[str]:
    """Build-context paths the Dockerfile COPYs (stage-to-stage copies excluded)."""
    sources: list[str] = []
    for ins in instructions(dockerfile):
        if ins.word not in ("COPY", "ADD"):
            continue
        args = list(json.loads(ins.rest)) if ins.rest.startswith("[") else shlex.split(ins.rest)
        flags = [a for a in args if a.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources.extend(p.rstrip("/") for p in paths[:-1])
    return sources


def copy_file_set(dockerfile: Path, context: Path, dest: Path) -> list[str]:
    """Copy what the Dockerfile copies from ``context`` into ``dest`` (same relative paths)."""
    sources = copied_sources(dockerfile)
    for rel in sources:
        src = context / rel
        if not src.exists():
            raise FileNotFoundError(f"{dockerfile}: COPY source {rel} is not in the build context")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, target)
    return sources


def entrypoint(dockerfile: Path) -> list[str]:
    """The final stage's ENTRYPOINT (exec form)."""
    found = [ins.rest for ins in instructions(dockerfile) if ins.word == "ENTRYPOINT"]
    if not found:
        raise ValueError(f"{dockerfile} has no ENTRYPOINT")
    return list(json.loads(found[-1]))
