"""README's shell blocks, run as written: the `bash` fences of a section, in order, in one shell.

A section is a `## ` heading and everything up to the next heading of that level or above (its
`### ` subsections included). A block whose fence names a variant after the language (```` ```bash
kubectl ````; renderers read only the language) is one way of a step that has several: it runs
only when that variant is asked for, in place of the others. Blocks run in one bash process
(`set -eo pipefail`), so a variable one block sets is there for the next, as in the reader's
terminal; each block is announced on stderr before it runs and timed, so a failure names the
block it came from.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(r"^```(\S*)(?:[ \t]+(\S+))?[ \t]*$")
_MARK = "### README block "


@dataclass(frozen=True)
class Block:
    section: str
    index: int  # 1-based, within the section
    line: int  # 1-based line of the opening fence in README
    text: str

    @property
    def label(self) -> str:
        first = next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return f"{self.section} #{self.index} (README line {self.line}): {first.strip()}"


def section_blocks(section: str, text: str | None = None, variant: str | None = None) -> list[Block]:
    """The `bash` blocks of the `## {section}` section of README (or of `text`): those that name
    no variant, and those that name ``variant``."""
    lines = (README.read_text() if text is None else text).splitlines()
    heading = f"## {section}"
    try:
        start = lines.index(heading)
    except ValueError:
        raise LookupError(f"README has no section {heading!r}") from None
    blocks: list[Block] = []
    fence: tuple[str, str | None, int, list[str]] | None = None
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        match = _FENCE.match(line)
        if fence is None:
            if re.match(r"^#{1,2} ", line):
                break  # the next section
            if match:
                fence = (match.group(1), match.group(2), number, [])
        elif match and not match.group(1):
            language, named, opened, body = fence
            if language == "bash" and named in (None, variant):
                blocks.append(Block(section, len(blocks) + 1, opened, "\n".join(body) + "\n"))
            fence = None
        else:
            fence[3].append(line)
    if fence is not None:
        raise ValueError(f"README line {fence[2]}: a block that is never closed")
    return blocks


@dataclass
class BlocksRun:
    returncode: int
    output: str
    seconds: dict[str, float]  # block label -> seconds it ran, for those that ended

    @property
    def failed_block(self) -> str | None:
        """The label of the block that was running when the shell stopped (None when it ended)."""
        if self.returncode == 0:
            return None
        started = [ln.removeprefix(_MARK) for ln in self.output.splitlines() if ln.startswith(_MARK)]
        return started[-1] if started else None


def run_blocks(blocks: Sequence[Block], *, cwd: Path, env: Mapping[str, str], timeout: float) -> BlocksRun:
    """Run ``blocks`` in order in one bash; stdout and stderr together, as a terminal shows them."""
    with tempfile.TemporaryDirectory(prefix="ckpt-readme-") as tmp:
        times = Path(tmp) / "times"
        script = ["set -eo pipefail"]
        for block in blocks:
            script += [
                f"echo {_quote(_MARK + block.label)} >&2",
                "_t0=$(date +%s.%N)",
                block.text.rstrip("\n"),
                f'echo "{block.index} $_t0 $(date +%s.%N)" >> {_quote(str(times))}',
            ]
        path = Path(tmp) / "readme.sh"
        path.write_text("\n".join(script) + "\n")
        started = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", str(path)],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
            returncode, output = done.returncode, done.stdout
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
            returncode, output = 124, out + f"\n(timed out after {time.monotonic() - started:.0f}s)"
        by_index = {b.index: b.label for b in blocks}
        seconds = {}
        if times.exists():
            for row in times.read_text().splitlines():
                index, t0, t1 = row.split()
                seconds[by_index[int(index)]] = float(t1) - float(t0)
    return BlocksRun(returncode, output, seconds)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def shell_env(**overrides: str) -> dict[str, str]:
    """This process's environment with ``overrides``: what a reader's terminal would hold."""
    return {**os.environ, **overrides}
