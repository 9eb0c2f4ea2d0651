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

```bash one
echo only-one
```

```bash two
echo only-two
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


def test_a_block_that_names_a_variant_runs_only_in_that_variant() -> None:
    plain = [b.text for b in section_blocks("Journey", DOC)]
    assert "echo only-one\n" not in plain
    assert "echo only-two\n" not in plain
    one = section_blocks("Journey", DOC, variant="one")
    assert [b.text for b in one] == [*plain, "echo only-one\n"]
    assert [b.index for b in one] == [1, 2, 3, 4]
    assert [b.text for b in section_blocks("Journey", DOC, variant="two")][-1] == "echo only-two\n"


# The operator's step of README's first rollout, each way (the e2e test runs both).
OPERATOR_STEP = {
    "helm": [
        "helm upgrade --install ckpt-rollout charts/ckpt-rollout",
        # The example workers' agent settings (the static manifest of the kubectl way holds them).
        "-f examples/agent-settings.yaml",
        "-f local/values.yaml",
    ],
    "kubectl": [
        "kubectl apply -f crds/",
        "ckpt-rollout tls-secrets --namespace rl | kubectl apply -f -",
        "kubectl apply -k local/kubectl/",
    ],
}


@pytest.mark.parametrize("variant", sorted(OPERATOR_STEP))
def test_first_rollout_holds_the_journey_in_order(variant: str) -> None:
    *journey, cleanup = section_blocks("First rollout", variant=variant)
    assert cleanup.text.strip() == "make cluster-down"
    text = "\n".join(b.text for b in journey)
    for other, steps in OPERATOR_STEP.items():
        if other != variant:
            assert steps[-1] not in text, f"{other}'s operator step in the {variant} journey"
    order = [
        "make cluster-up REAL_NODE=1",
        'eval "$(make -s cluster-env)"',
        *OPERATOR_STEP[variant],
        "kubectl -n rl apply -k local/\n",
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
