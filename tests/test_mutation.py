"""Mutation score of the pure core (planning, conditions, outcomes, selectors, merge patch, the
reconcile machine): every mutant mutmut makes of them must fail some unit test, to the floor in
ckpt_e2e.mutation. A failure lists each surviving mutant's diff: a test to write, or an
equivalent mutant to mark `# pragma: no mutate` with the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Cold, ~15 min of both cores (2500 mutants), far more under load: above the suite's 600 s
# per-test limit, and bounded by its own. Once cached (ckpt_e2e.mutation keeps each module's
# results under a hash of what decides them) an unchanged core costs seconds, an edit what it
# touches.
LIMIT_S = 3600


@pytest.mark.mutation
@pytest.mark.timeout(LIMIT_S)
def test_pure_core_mutation_score() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_e2e.mutation"], capture_output=True, text=True, timeout=LIMIT_S - 60
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    print(proc.stdout)
    assert proc.returncode == 0, f"{summary}\n\n{proc.stdout[-20000:]}{proc.stderr[-2000:]}"
    assert summary.startswith("mutation: killed="), summary
