"""Putting a source file into the version directory: hard link, reflink, or copy.

`--link` tries a hard link (free, same inode: the version *is* the source file), then a reflink
(FICLONE: copy-on-write, free on btrfs/xfs/bcachefs, an independent file), then a copy. Without
`--link`, publishing never shares an inode with the source: reflink, else copy. A hard-linked
version changes if someone rewrites the source file in place, so `--link` is for sources that
are never modified after they are written (a trainer's per-step output directory); an agent
that verifies checksums would then refuse the version, but one that does not would load it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Sequence
from pathlib import Path

HARDLINK = "hardlink"
REFLINK = "reflink"
COPY = "copy"
WRITTEN = "written"  # a file publish produced itself (state dict shards, a generated index)

LINK_METHODS: tuple[str, ...] = (HARDLINK, REFLINK, COPY)
COPY_METHODS: tuple[str, ...] = (REFLINK, COPY)

_FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
_COPY_STEP = 64 << 20


def _hardlink(src: Path, dst: Path) -> None:
    # follow_symlinks: link the file a symlink points to (an HF cache snapshot's blob).
    os.link(src, dst, follow_symlinks=True)


def _reflink(src: Path, dst: Path) -> None:
    with src.open("rb") as fin, dst.open("xb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
        except OSError:
            fout.close()
            dst.unlink()
            raise


def _copy(src: Path, dst: Path, advance: Callable[[int], None]) -> None:
    # sendfile copies in the kernel (as shutil.copyfile does), in steps so progress can move.
    with src.open("rb") as fin, dst.open("xb") as fout:
        size = os.fstat(fin.fileno()).st_size
        offset = 0
        while offset < size:
            sent = os.sendfile(fout.fileno(), fin.fileno(), offset, min(_COPY_STEP, size - offset))
            if sent == 0:
                raise OSError(f"{src} shrank while it was copied")
            offset += sent
            advance(sent)


def place(
    src: Path,
    dst: Path,
    methods: Sequence[str],
    *,
    advance: Callable[[int], None],
    expect: Callable[[int], None],
) -> str:
    """Make `dst` hold `src`'s bytes with the first of `methods` that works; returns its name.
    A copy first `expect`s its size (progress grows by what links cost nothing), then
    `advance`s as it goes.

    Hard links and reflinks fail for ordinary reasons (another filesystem, a filesystem without
    CoW, protected_hardlinks for a file we do not own), so each failure falls through to the next;
    a copy's failure (no space, no permission) is the error.
    """
    for method in methods:
        if method == COPY:
            expect(src.stat().st_size)
            _copy(src, dst, advance)
            return COPY
        try:
            if method == HARDLINK:
                _hardlink(src, dst)
            elif method == REFLINK:
                _reflink(src, dst)
            else:
                raise ValueError(f"unknown placement method {method!r}")
        except OSError:
            continue
        return method
    raise OSError(f"none of {list(methods)} could place {src.name}")
