"""What `publish` tells its user while it works: warnings, per-file lines, a progress bar.

`publish_version` reports through a `Reporter`; the CLI picks one: a rich progress bar (bytes,
rate, ETA) when stderr is a terminal, one line per file otherwise (logs, CI), nothing for
library callers. `advance` is called from hashing threads; rich's Progress locks itself, and the
line reporter prints only from the calling thread.
"""

from __future__ import annotations

import sys
from typing import IO, Any, Protocol


class Reporter(Protocol):
    def warn(self, message: str) -> None: ...

    def begin(self, total_bytes: int) -> None:
        """Work is about to start: `total_bytes` is what `advance` will add up to."""

    def expect(self, nbytes: int) -> None:
        """`nbytes` more work than announced (a file that must be copied)."""

    def advance(self, nbytes: int) -> None: ...

    def file_done(self, name: str, nbytes: int, method: str) -> None: ...

    def end(self) -> None: ...


class Silent:
    """For library callers (tests, benches): warnings are kept, nothing is printed."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def begin(self, total_bytes: int) -> None:
        pass

    def expect(self, nbytes: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file_done(self, name: str, nbytes: int, method: str) -> None:
        pass

    def end(self) -> None:
        pass


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Lines(Silent):
    """One line per file on `stream` (stderr): what a log or a CI job can keep."""

    def __init__(self, stream: IO[str] | None = None, prefix: str = "publish") -> None:
        super().__init__()
        self._stream = stream or sys.stderr
        self._prefix = prefix

    def _print(self, text: str) -> None:
        print(f"{self._prefix}: {text}", file=self._stream, flush=True)

    def warn(self, message: str) -> None:
        super().warn(message)
        self._print(f"warning: {message}")

    def file_done(self, name: str, nbytes: int, method: str) -> None:
        self._print(f"{name} {human_bytes(nbytes)} ({method})")


class Bar:
    """A rich progress bar on stderr: bytes done of the total, rate, time left; files printed
    above it as they finish."""

    def __init__(self, description: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.text import Text

        self._text = Text

        self._description = description
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: Any = None
        self._total = 0

    def warn(self, message: str) -> None:
        # Text, not markup: a message may hold brackets (tensor names, lists).
        self._progress.console.print(self._text.assemble(("warning: ", "yellow"), message))

    def begin(self, total_bytes: int) -> None:
        self._progress.start()
        self._total = total_bytes
        self._task = self._progress.add_task(self._description, total=total_bytes)

    def expect(self, nbytes: int) -> None:
        if self._task is not None:
            self._total += nbytes
            self._progress.update(self._task, total=self._total)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, nbytes)

    def file_done(self, name: str, nbytes: int, method: str) -> None:
        self._progress.console.print(self._text(f"{name} {human_bytes(nbytes)} ({method})"))

    def end(self) -> None:
        self._progress.stop()
