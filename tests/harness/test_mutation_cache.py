"""The mutation run's cache (ckpt_e2e.mutation): a module's results are kept under a hash of what
decides them, so an unchanged core is read back and an edit reruns what it touches."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_e2e import mutation

# A core of three modules: `b` imports `a`; `c` stands alone; each has a test, `a`'s through a kit.
FILES = {
    "operator/ckpt_rollout/__init__.py": "",
    "operator/ckpt_rollout/domain/__init__.py": "",
    "operator/ckpt_rollout/domain/a.py": "def f() -> int:\n    return 1\n",
    "operator/ckpt_rollout/domain/b.py": "from .a import f\n\ndef g() -> int:\n    return f() + 1\n",
    "operator/ckpt_rollout/domain/c.py": "def h() -> int:\n    return 3\n",
    "tests/operator/kit.py": "from ckpt_rollout.domain.a import f\n",
    "tests/operator/test_a.py": "from kit import f\n\ndef test_f():\n    assert f() == 1\n",
    "tests/operator/test_b.py": "from ckpt_rollout.domain import b\n\ndef test_g():\n    assert b.g() == 2\n",
    "tests/operator/test_c.py": "from ckpt_rollout.domain.c import h\n\ndef test_h():\n    assert h() == 3\n",
}
A, B, C = (f"ckpt_rollout/domain/{name}.py" for name in "abc")


@pytest.fixture
def core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setattr(mutation, "ROOT", root)
    monkeypatch.setattr(mutation, "PACKAGES", {"ckpt_rollout": root / "operator" / "ckpt_rollout"})
    monkeypatch.setattr(mutation, "MUTATED", (A, B, C))
    monkeypatch.setattr(mutation, "TESTS", tuple(r for r in FILES if r.startswith("tests/")))
    monkeypatch.setenv("CKPT_E2E_CACHE_DIR", str(tmp_path / "cache"))
    return root


def _moved(root: Path, rel: str) -> set[str]:
    """The modules whose hash moves when `rel` is edited."""
    before = mutation.fingerprints()
    with (root / rel).open("a") as f:
        f.write("# edited\n")
    after = mutation.fingerprints()
    return {m for m in before if before[m] != after[m]}


@pytest.mark.parametrize(
    ("edited", "moved"),
    [
        ("operator/ckpt_rollout/domain/c.py", {C}),
        ("operator/ckpt_rollout/domain/a.py", {A, B}),  # b runs a
        ("operator/ckpt_rollout/domain/b.py", {A, B}),  # b is a caller of a: its tests reach a through b
        ("tests/operator/kit.py", {A}),
        ("tests/operator/test_c.py", {C}),
    ],
)
def test_an_edit_moves_the_hash_of_what_it_decides(core: Path, edited: str, moved: set[str]) -> None:
    assert _moved(core, edited) == moved


def test_a_cached_core_runs_nothing_and_an_edit_reruns_only_its_modules(
    core: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[tuple[str, ...]] = []

    def mutate(work: Path, modules: tuple[str, ...], *, max_children: int) -> dict[str, mutation.Result]:
        ran.append(modules)
        # `a` has a survivor; one of `c`'s mutants did not run (not stored: rerun next time).
        return {
            m: mutation.Result(
                killed=4, survived={"a__mutmut_1": "- 1\n+ 2"} if m == A else {}, not_run=int(m == C)
            )
            for m in modules
        }

    monkeypatch.setattr(mutation, "mutate", mutate)
    first = mutation.run(tmp_path / "w1", max_children=1)
    assert ran == [(A, B, C)]
    survivor = {"a__mutmut_1": "- 1\n+ 2"}
    assert (first.killed, first.survived, first.not_run, first.cached) == (12, survivor, 1, [])

    second = mutation.run(tmp_path / "w2", max_children=1)
    assert ran[1:] == [(C,)]
    assert (second.killed, second.survived, second.not_run) == (12, survivor, 1)
    assert sorted(second.cached) == [A, B]

    (core / "operator" / B).write_text("def g() -> int:\n    return 2\n")  # no longer calls a
    mutation.run(tmp_path / "w3", max_children=1)
    assert ran[2:] == [(A, B, C)]  # C again: its last run was incomplete

    mutation.run(tmp_path / "w4", max_children=1, use_cache=False)
    assert ran[3:] == [(A, B, C)]


def test_a_real_run_counts_kills_and_shows_each_survivor_as_a_diff(core: Path, tmp_path: Path) -> None:
    """mutmut itself over the small core, with one function no test calls: its mutants survive and
    each is reported with the diff that made it (what a developer needs to write the missing test)."""
    untested_source = "\n\ndef untested(x: int) -> int:\n    return x * 7\n"
    (core / "operator" / C).write_text(FILES[f"operator/{C}"] + untested_source)
    result = mutation.mutate(tmp_path / "work", (C,), max_children=1)[C]
    assert result.not_run == 0
    assert result.killed >= 1  # `return 3` mutated fails test_h
    untested = {name: diff for name, diff in result.survived.items() if ".x_untested__mutmut_" in name}
    assert untested, result.survived
    for diff in untested.values():
        assert diff.startswith(f"--- {C}\n+++ {C}\n"), diff
        assert "\n-    return x * 7" in diff, diff
        assert "\n+    return" in diff, diff


def test_a_test_id_no_node_id_selects_stops_the_run(core: Path, tmp_path: Path) -> None:
    """pytest escapes a non-ASCII parameter in a test id; mutmut selects each mutant's tests by
    node id, so such a test made every mutant it covers a usage error counted as a kill."""
    (core / "tests/operator/test_c.py").write_text(
        "import pytest\nfrom ckpt_rollout.domain.c import h\n\n"
        '@pytest.mark.parametrize("mark", ["\\u00b2"])\ndef test_h(mark):\n    assert h() == 3\n'
    )
    with pytest.raises(RuntimeError, match=r"cannot be selected by node id.*test_h\[\\\\xb2\]"):
        mutation.mutate(tmp_path / "work", (C,), max_children=1)
