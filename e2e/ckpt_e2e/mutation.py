"""Mutation testing of the pure core with mutmut: `python -m ckpt_e2e.mutation`.

mutmut names mutants by module path from its working directory, and the repo's `operator/`
directory would make those `operator.ckpt_rollout...` — a name the standard library owns. So
the run happens in a scratch tree laid out as the packages import (`ckpt_rollout/`,
`ckpt_api/`, `ckpt_agent/`, `tests/`), holding copies of the modules under test and the unit
tests that cover them. Only pure modules are mutated: no cluster, no network, ~10 minutes of both cores.
Prints every surviving mutant (its diff) and exits 1 below the score floor.

Results are cached per mutated module (``<cache>/mutation/``, ``<cache>`` as in provision.py:
``$CKPT_E2E_CACHE_DIR`` or ``~/.cache/ckpt-rollout``) under a hash of what decides them: the
module, the project modules it imports, the modules and tests that import it (its callers, down
to the tests), the kits those tests use, mutmut's and Python's versions and this file. A run
mutates only the modules whose hash moved, so an unchanged core costs seconds and an edit to one
module pays for it and for what stands on it; the floor is checked over every module alike.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from .provision import cache_root

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
    # Pure too: how the operator reads an agent's answer (a misread framing is a lost outcome).
    "ckpt_rollout/io/http_wire.py",
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
    "tests/operator/test_machine_doorbell.py",
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
    "tests/operator/test_http_wire.py",
)


@dataclass(frozen=True)
class Result:
    killed: int
    survived: dict[str, str]  # mutant -> its diff
    not_run: int
    cached: list[str] = field(default_factory=list)  # modules whose results came from the cache

    @property
    def total(self) -> int:
        return self.killed + len(self.survived)

    @property
    def score(self) -> float:
        return self.killed / self.total if self.total else 1.0


# --------------------------------------------------------------------------- cache keys


def _module_file(name: str, near: Path) -> Path | None:
    """The project file an import names: a package module under operator/, or a test kit
    (tests import theirs by bare name from their own directory)."""
    parts = name.split(".")
    bases = [PACKAGES[parts[0]].parent] if parts[0] in PACKAGES else [near]
    for base in bases:
        stem = base.joinpath(*parts)
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _imports(path: Path) -> set[Path]:
    """Project files `path` imports, the packages on the way included."""
    package = path.parent.relative_to(path.parent.anchor).parts  # only read for relative imports
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[: len(package) - node.level + 1]
                top = next((i for i, part in enumerate(base) if part in PACKAGES), None)
                module = ".".join([*base[top:], *([module] if module else [])]) if top is not None else ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    found = set()
    for name in filter(None, names):
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            file = _module_file(".".join(parts[:end]), path.parent)
            if file is not None:
                found.add(file)
    return found - {path}


def _reach(graph: dict[Path, set[Path]], start: Path) -> set[Path]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def fingerprints() -> dict[str, str]:
    """MUTATED module -> the hash its cached results are kept under (see the module's doc)."""
    graph: dict[Path, set[Path]] = {}
    todo = [ROOT / t for t in TESTS]
    while todo:
        file = todo.pop()
        if file not in graph:
            graph[file] = _imports(file)
            todo.extend(graph[file])
    reach = {file: _reach(graph, file) for file in graph}
    common = hashlib.sha256()
    for text in (version("mutmut"), sys.version.split()[0], Path(__file__).read_text()):
        common.update(text.encode() + b"\0")
    keys = {}
    for module in MUTATED:
        file = PACKAGES[module.split("/")[0]].parent / module
        decides = reach.get(file, {file}) | {caller for caller, below in reach.items() if file in below}
        digest = common.copy()
        for part in sorted(decides):
            digest.update(str(part.relative_to(ROOT)).encode() + b"\0" + part.read_bytes() + b"\0")
        keys[module] = digest.hexdigest()
    return keys


def _cache_file(module: str, key: str) -> Path:
    return cache_root() / "mutation" / f"{module.replace('/', '.')}-{key[:24]}.json"


def cached_result(module: str, key: str) -> Result | None:
    try:
        entry = json.loads(_cache_file(module, key).read_text())
    except (OSError, ValueError):
        return None
    return Result(killed=entry["killed"], survived=entry["survived"], not_run=0, cached=[module])


def store(module: str, key: str, result: Result) -> None:
    """Keeps one entry per module: the one for its current hash."""
    path = _cache_file(module, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f"{module.replace('/', '.')}-*.json"):
        old.unlink(missing_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"killed": result.killed, "survived": result.survived}, indent=1))
    tmp.replace(path)


# --------------------------------------------------------------------------- the run


def stage(work: Path, mutated: tuple[str, ...] = MUTATED) -> None:
    """The scratch tree mutmut runs in, mutating `mutated`."""
    for name, src in PACKAGES.items():
        shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "tests").mkdir()
    for test in TESTS:
        shutil.copy2(ROOT / test, work / "tests" / Path(test).name)
    paths = ", ".join(json.dumps(p) for p in mutated)
    (work / "pyproject.toml").write_text(
        "[project]\nname = 'ckpt-mutation-scratch'\nversion = '0'\n"
        # The whole package goes into mutmut's tree (the mutated modules import the rest of
        # it); only `mutated` is mutated.
        f'[tool.mutmut]\nsource_paths = ["ckpt_rollout/"]\nonly_mutate = [{paths}]\n'
        'pytest_add_cli_args_test_selection = ["tests/"]\n'
        'also_copy = ["ckpt_api/"]\n'
        "[tool.pytest.ini_options]\nasyncio_mode = 'auto'\n"
        "asyncio_default_fixture_loop_scope = 'function'\n"
    )


# mutmut's exit codes (mutmut.stats.status_by_exit_code) that count against the score: the tests
# passed with the mutant in place (0), or no test reaches the mutated function at all (33, and 5:
# pytest collected nothing) -- code no test runs is code no test checks. `None`: not run yet;
# 34: skipped (`# pragma: no mutate`), in neither count. Every other code is a detection: a failed
# test, a timeout, a crash, a type-check error.
SURVIVED_CODES = frozenset({0, 5, 33})
SKIPPED_CODES = frozenset({34})


def results(work: Path, module: str) -> Result:
    """Killed/survived of one module from mutmut's record of it, with each survivor's diff."""
    meta = work / "mutants" / f"{module}.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    names = [key for key, code in sorted(codes.items()) if code in SURVIVED_CODES]
    survived = dict(zip(names, diffs(work, Path(module), names), strict=True))
    not_run = sum(code is None for code in codes.values())
    killed = sum(code is not None and code not in SURVIVED_CODES | SKIPPED_CODES for code in codes.values())
    return Result(killed, survived, not_run)


# One process for every survivor's diff: `mutmut show` per mutant cost a Python start and a walk of
# every mutated file each (~1.5 s of a core; a module with 40 survivors paid a minute).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = sys.argv[1], json.loads(sys.argv[2])
print(json.dumps([get_diff_for_mutant(name, path=path) for name in names]))
"""


def diffs(work: Path, source: Path, names: list[str]) -> list[str]:
    """The diff of each named mutant of `source` (its path as mutmut names it, relative to `work`;
    mutmut reads its mutated copy under `work/mutants/` itself)."""
    if not names:
        return []
    out = subprocess.run(
        [sys.executable, "-c", _DIFFS, str(source), json.dumps(names)],
        cwd=work,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        reason = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        return [f"(no diff: {reason[0]})"] * len(names)
    shown: list[str] = json.loads(out.stdout)
    return shown


def unselectable_tests(work: Path, env: dict[str, str]) -> list[str]:
    """Collected test ids that no node id on a command line selects: pytest escapes a non-ASCII id
    (`\\xNN`), and mutmut hands each mutant's tests to pytest by node id. One such id in a mutant's
    tests is a pytest usage error (exit 4) that mutmut's worker records as a kill."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"collecting the mutation's tests failed ({out.returncode}): {out.stdout[-3000:]}")
    return [line for line in out.stdout.splitlines() if "::" in line and "\\" in line]


def mutate(work: Path, modules: tuple[str, ...], *, max_children: int) -> dict[str, Result]:
    """mutmut over `modules` in a scratch tree at `work`; each module's results."""
    stage(work, modules)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # The scratch packages must win over the editable install's paths to the checkout.
    env["PYTHONPATH"] = str(work)
    if bad := unselectable_tests(work, env):
        raise RuntimeError(
            "these test ids cannot be selected by node id, so mutmut would count their mutants killed "
            f"unrun; give them ASCII ids: {bad[:10]}"
        )
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    found = {module: results(work, module) for module in modules}
    if proc.returncode != 0 and not any(r.total for r in found.values()):
        raise RuntimeError(f"mutmut failed ({proc.returncode}): {proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return found


def run(work: Path, *, max_children: int, use_cache: bool = True) -> Result:
    """Every MUTATED module's results: from the cache where its hash is known, else mutmut's
    (stored when every mutant ran)."""
    keys = fingerprints()
    by_module = {m: r for m in MUTATED if use_cache and (r := cached_result(m, keys[m])) is not None}
    todo = tuple(m for m in MUTATED if m not in by_module)
    if todo:
        for module, result in mutate(work, todo, max_children=max_children).items():
            by_module[module] = result
            if result.not_run == 0:
                store(module, keys[module], result)
    return Result(
        killed=sum(r.killed for r in by_module.values()),
        survived={k: v for r in by_module.values() for k, v in r.survived.items()},
        not_run=sum(r.not_run for r in by_module.values()),
        cached=[m for r in by_module.values() for m in r.cached],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=float, default=SCORE_FLOOR, help="minimum killed fraction")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--keep", metavar="DIR", help="run in DIR (kept) instead of a temp dir")
    parser.add_argument("--no-cache", action="store_true", help="mutate every module, cached or not")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckpt-mutation-") as tmp:
        work = Path(args.keep or tmp)
        if args.keep:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
        result = run(work, max_children=args.max_children, use_cache=not args.no_cache)
    for mutant, diff in result.survived.items():
        print(f"survived: {mutant}\n{diff}\n")
    print(
        f"mutation: killed={result.killed} survived={len(result.survived)} not_run={result.not_run} "
        f"score={result.score:.3f} floor={args.floor:.2f} cached={len(result.cached)}/{len(MUTATED)} modules"
    )
    return 0 if result.score >= args.floor and result.not_run == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
