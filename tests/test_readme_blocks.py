"""README's executed sections (ckpt_e2e.readme, e2e/tests/test_readme_first_rollout.py): which
blocks a section yields, and that "First rollout" still holds the journey's commands in order and
parses as bash (a fast guard; the e2e test runs them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ckpt_e2e.readme import run_blocks, section_blocks, shell_env

DOC = """# title

## Before
```bash
echo before
```

## Journey

Text.

```bash
A=1
echo "a=$A"
```

```console
$ not run
```

### Sub

```bash
echo "sub=$A" && false
echo never
```

```bash
echo after-failure
```

## After
```bash
echo after
```
"""


def test_a_section_is_its_bash_blocks_through_its_subsections() -> None:
    blocks = section_blocks("Journey", DOC)
    assert [b.text for b in blocks] == [
        'A=1\necho "a=$A"\n',
        'echo "sub=$A" && false\necho never\n',
        "echo after-failure\n",
    ]
    assert [b.index for b in blocks] == [1, 2, 3]
    assert blocks[0].line == DOC.splitlines().index("```bash", 5) + 1


def test_blocks_share_one_shell_and_stop_at_the_first_failure() -> None:
    run = run_blocks(section_blocks("Journey", DOC), cwd=Path("/"), env=shell_env(), timeout=30)
    assert run.returncode == 1
    assert "a=1" in run.output
    assert "sub=1" in run.output
    assert "never" not in run.output
    assert "after-failure" not in run.output
    assert run.failed_block is not None
    assert run.failed_block.startswith("Journey #2")
    assert list(run.seconds) == [section_blocks("Journey", DOC)[0].label]


def test_unknown_section_and_unclosed_block_are_named() -> None:
    with pytest.raises(LookupError, match="Nope"):
        section_blocks("Nope", DOC)
    with pytest.raises(ValueError, match="never closed"):
        section_blocks("X", "## X\n```bash\necho\n")


def test_first_rollout_holds_the_journey_in_order() -> None:
    *journey, cleanup = section_blocks("First rollout")
    assert cleanup.text.strip() == "make cluster-down"
    text = "\n".join(b.text for b in journey)
    order = [
        "make cluster-up REAL_NODE=1",
        'eval "$(make -s cluster-env)"',
        "helm upgrade --install ckpt-rollout charts/ckpt-rollout",
        "-f local/values.yaml",
        "kubectl -n rl apply -k local/",
        "ckpt-rollout publish --example",
        "kubectl -n rl exec -i deployment/ckpt-src",
        "kubectl -n rl apply -f examples/checkpointrollout.yaml",
        "kubectl -n rl wait ckr/rollout-worker",
        "ckpt-rollout status rollout-worker",
    ]
    positions = [text.find(step) for step in order]
    assert -1 not in positions, dict(zip(order, positions, strict=True))
    assert positions == sorted(positions)
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
