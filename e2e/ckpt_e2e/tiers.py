"""Test tiers by cost, as pytest markers derived from what each test needs (a pytest plugin,
loaded by pyproject's addopts: ``-p ckpt_e2e.tiers``).

A test is marked from the fixtures it requests (its whole closure), so a new test lands in its
tier without a mark of its own:

- ``cluster``: the closure holds ``cluster`` or ``real_cluster``, or the test is marked
  ``integration`` (it starts a control plane itself). Costs a control plane per session.
- ``images``: the closure holds ``built_images``. The container images (buildah, podman):
  minutes cold.
- ``realnode``: the closure holds ``real_cluster``, or the scenario ``provider`` is
  "real-node". A real kubelet + containerd node (root).
- ``mutation``: marked by hand (tests/test_mutation.py). mutmut over the pure core: minutes
  cold, seconds when nothing it covers changed.
- ``bench``: marked by hand (benches run as tests). Network namespaces, many processes.
- ``fuzz``: marked by hand (schemathesis against a live agent). A minute and more of a core.

What no marker names is the quick loop (``make check``): models, the operator's domain and I/O
against in-process servers, the agent with real engines, the chart with helm. The tree says the
same: nothing under ``tests/`` needs a cluster; ``e2e/tests/`` holds what does (and a few quick
tests beside their kin).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

# Fixtures whose presence in a test's closure puts it in a tier.
BY_FIXTURE: Mapping[str, frozenset[str]] = {
    "cluster": frozenset({"cluster"}),
    "real_cluster": frozenset({"cluster", "realnode"}),
    "built_images": frozenset({"images"}),
}
# The scenario suite's provider that runs on the real node (providers.provider, indirect).
REAL_NODE_PROVIDER = "real-node"


def tiers_for(fixtures: Iterable[str], params: Mapping[str, object], marks: Iterable[str]) -> set[str]:
    """The tier markers a test gets from its fixture closure, its parameters and its own marks."""
    tiers: set[str] = set()
    for fixture in fixtures:
        tiers |= BY_FIXTURE.get(fixture, frozenset())
    if params.get("provider") == REAL_NODE_PROVIDER:
        tiers |= {"cluster", "realnode"}
    # The older name of `cluster`, on tests that start a control plane of their own.
    if "integration" in marks:
        tiers.add("cluster")
    return tiers - set(marks)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        marks = {m.name for m in item.iter_markers()}
        for tier in sorted(tiers_for(getattr(item, "fixturenames", ()), params, marks)):
            item.add_marker(tier)
