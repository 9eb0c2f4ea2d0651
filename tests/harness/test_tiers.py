"""Tier markers come from what a test needs (ckpt_e2e.tiers), so a new test lands in its tier
without a mark of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_e2e.tiers import REAL_NODE_PROVIDER, tiers_for


@pytest.mark.parametrize(
    ("fixtures", "params", "marks", "tiers"),
    [
        # Agents, the operator's domain, the chart: no tier (the quick loop).
        (["tmp_path", "agent_factory", "session"], {}, set(), set()),
        # Anything standing on the session's control plane: k8s_api, namespace, provider...
        (["provider", "cluster", "namespace", "k8s_api"], {"provider": "local"}, set(), {"cluster"}),
        (["built_images", "cluster", "fleet_factory"], {}, set(), {"cluster", "images"}),
        (
            ["real_node_provider", "real_node_env", "real_cluster", "built_images"],
            {},
            set(),
            {"cluster", "images", "realnode"},
        ),
        # The scenario suite asks for the real node's provider by parameter (indirect).
        (["provider"], {"provider": "real-node"}, set(), {"cluster", "realnode"}),
        # A test that starts a control plane itself says so with the older name.
        (["tmp_path_factory"], {}, {"integration"}, {"cluster"}),
        # A mark the test already carries is not added twice.
        (["cluster"], {}, {"cluster", "integration"}, set()),
    ],
)
def test_tiers_follow_the_fixture_closure(
    fixtures: list[str], params: dict[str, object], marks: set[str], tiers: set[str]
) -> None:
    assert tiers_for(fixtures, params, marks) == tiers


_CONFTEST = """
import pytest

@pytest.fixture
def cluster():
    return "a control plane"

@pytest.fixture
def namespace(cluster):
    return "ns"
"""

_TESTS = """
def test_needs_a_namespace(namespace):
    pass

def test_needs_nothing(tmp_path):
    pass
"""


@pytest.mark.parametrize(
    ("expression", "selected"),
    [("cluster", ["test_needs_a_namespace"]), ("not cluster", ["test_needs_nothing"])],
)
def test_one_flag_selects_a_tier(tmp_path: Path, expression: str, selected: list[str]) -> None:
    """The plugin marks before `-m` deselects, and the marker it adds passes --strict-markers."""
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_example.py").write_text(_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster: test\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ckpt_e2e.tiers", "--strict-markers", "-m", expression,
         "-q", "--co", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # this file's plugin alone
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split("::")[1] for line in proc.stdout.splitlines() if "::" in line] == selected


def test_the_real_node_runs_the_scenarios_whose_assertion_needs_a_kubelet() -> None:
    """The rest run once, on kwok pods (e2e/tests/test_scenarios.py says why for each of these)."""
    path = Path(__file__).resolve().parents[2] / "e2e" / "tests" / "test_scenarios.py"
    spec = importlib.util.spec_from_file_location("scenarios_under_inspection", path)
    assert spec is not None
    assert spec.loader is not None
    scenarios = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scenarios)

    def providers(test: object) -> list[str]:
        marks = getattr(test, "pytestmark", [])
        return [p for m in marks if m.name == "parametrize" and m.args[0] == "provider" for p in m.args[1]]

    tests = {name: obj for name, obj in vars(scenarios).items() if name.startswith("test_")}
    assert not any("provider" in str(m.args[:1]) for m in scenarios.pytestmark if m.name == "parametrize")
    assert {name for name, test in tests.items() if REAL_NODE_PROVIDER in providers(test)} == {
        "test_happy_path",
        "test_operator_killed_mid_wave",
        "test_kube_apiserver_restarted_mid_rollout",
    }
