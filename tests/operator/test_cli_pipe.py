"""A user command whose reader has gone (`ckpt-rollout status x | head -5`) ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_closed_pipe_ends_the_output_without_a_traceback() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader left before the first line: every write fails
    try:
        result = subprocess.run(
            [sys.executable, "-m", "ckpt_cli", "crd"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == 141, "128 + SIGPIPE, as a tool the signal ended"
