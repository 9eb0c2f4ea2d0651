"""Mutation testing of the pure core with mutmut: `python -m ckpt_e2e.mutation`.

mutmut names mutants by module path from its working directory, and the repo's `operator/`
directory would make those `operator.ckpt_rollout...` — a name the standard library owns. So
the run happens in a scratch tree laid out as the packages import (`ckpt_rollout/`,
`ckpt_api/`, `ckpt_agent/`, `tests/`), holding copies of the modules under test and the unit
tests that cover them. Only pure modules are mutated: no cluster, no network, a few minutes.
Prints every surviving mutant (its diff) and exits 1 below the score floor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCORE_FLOOR = 0.90

# The pure core: the modules whose every branch a rollout's correctness rests on.
MUTATED = (
    "ckpt_rollout/domain/planning.py",
    "ckpt_rollout/domain/conditions.py",
    "ckpt_rollout/domain/outcomes.py",
    "ckpt_rollout/domain/selectors.py",
    "ckpt_rollout/domain/mergepatch.py",
    "ckpt_rollout/domain/machine.py",
    "ckpt_rollout/domain/analyzing.py",
    "ckpt_rollout/domain/drive.py",
    "ckpt_rollout/domain/plan.py",
    "ckpt_rollout/domain/freshness.py",
    "ckpt_rollout/domain/analysis.py",
)
PACKAGES = {
    "ckpt_rollout": ROOT / "operator" / "ckpt_rollout",
    "ckpt_api": ROOT / "operator" / "ckpt_api",
}
TESTS = (
    "tests/operator/test_planning.py",
    "tests/operator/test_conditions.py",
    "tests/operator/test_outcomes.py",
    "tests/operator/test_selectors.py",
    "tests/operator/machine_kit.py",
    "tests/operator/test_machine_start.py",
    "tests/operator/test_machine_waves.py",
    "tests/operator/test_machine_pause.py",
    "tests/operator/test_machine_failures.py",
    "tests/operator/test_machine_rollback.py",
    "tests/operator/test_machine_departures.py",
    "tests/operator/test_machine_told.py",
    "tests/operator/test_machine_properties.py",
    "tests/operator/analysis_kit.py",
    "tests/operator/test_machine_analysis.py",
    "tests/operator/test_machine_analysis_failures.py",
    "tests/operator/test_machine_analysis_interplay.py",
    "tests/operator/test_analysis.py",
    "tests/operator/test_freshness.py",
    "tests/operator/test_views.py",
    "tests/operator/test_pulled_waves.py",
    "tests/operator/test_status_writes.py",
    "tests/operator/test_executor.py",
)


@dataclass(frozen=True)
class Result:
    killed: int
    survived: list[str]
    not_run: int

    @property
    def total(self) -> int:
        return self.killed + len(self.survived)

    @property
    def score(self) -> float:
        return self.killed / self.total if self.total else 1.0


def stage(work: Path) -> None:
    """The scratch tree mutmut runs in."""
    for name, src in PACKAGES.items():
        shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "tests").mkdir()
    for test in TESTS:
        shutil.copy2(ROOT / test, work / "tests" / Path(test).name)
    paths = ", ".join(json.dumps(p) for p in MUTATED)
    (work / "pyproject.toml").write_text(
        "[project]\nname = 'ckpt-mutation-scratch'\nversion = '0'\n"
        f"[tool.mutmut]\nsource_paths = [{paths}]\n"
        'pytest_add_cli_args_test_selection = ["tests/"]\n'
        'also_copy = ["ckpt_api/"]\n'
        "[tool.pytest.ini_options]\nasyncio_mode = 'auto'\n"
        "asyncio_default_fixture_loop_scope = 'function'\n"
    )


def results(work: Path) -> Result:
    """Killed/survived from mutmut's per-file records (exit code 0: the tests still passed)."""
    killed, survived, not_run = 0, [], 0
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code is None:
                not_run += 1
            elif code == 0:
                survived.append(key)
            else:
                killed += 1
    return Result(killed, survived, not_run)


def show(work: Path, mutant: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", mutant], cwd=work, capture_output=True, text=True
    )
    return out.stdout.strip() or out.stderr.strip()


def run(work: Path, *, max_children: int) -> Result:
    stage(work)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # The scratch packages must win over the editable install's paths to the checkout.
    env["PYTHONPATH"] = str(work)
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    result = results(work)
    if proc.returncode != 0 and result.total == 0:
        raise RuntimeError(f"mutmut failed ({proc.returncode}): {proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=float, default=SCORE_FLOOR, help="minimum killed fraction")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--keep", metavar="DIR", help="run in DIR (kept) instead of a temp dir")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckpt-mutation-") as tmp:
        work = Path(args.keep or tmp)
        if args.keep:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
        result = run(work, max_children=args.max_children)
        diffs = [show(work, m) for m in result.survived]
    for mutant, diff in zip(result.survived, diffs, strict=True):
        print(f"survived: {mutant}\n{diff}\n")
    print(
        f"mutation: killed={result.killed} survived={len(result.survived)} not_run={result.not_run} "
        f"score={result.score:.3f} floor={args.floor:.2f}"
    )
    return 0 if result.score >= args.floor and result.not_run == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
