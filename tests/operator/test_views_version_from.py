"""What the CLI's views make of a spec.versionFrom rollout, which has no spec.version: the
version is what the operator resolved (status.targetVersion)."""

from __future__ import annotations

from typing import Any

from ckpt_rollout.tools.views import desired_version, progress_line, status_table, watch_exit_code
from ckpt_rollout.tools.watchtable import rollout_view

FROM = {"configMapKeyRef": {"name": "trainer", "key": "version"}}


def _obj(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "rl", "name": "fleet"}, "spec": spec, "status": status}


SUCCEEDED = {"phase": "Succeeded", "targetVersion": "v7", "replicas": 2, "updatedReplicas": 2}


def test_the_desired_version_is_the_spec_s_or_what_version_from_resolved_to() -> None:
    assert desired_version(_obj({"version": "v8"}, SUCCEEDED)) == "v8"
    assert desired_version(_obj({"versionFrom": FROM}, SUCCEEDED)) == "v7"
    assert desired_version(_obj({"versionFrom": FROM}, {})) is None


def test_a_version_from_rollout_that_succeeded_reads_as_done() -> None:
    obj = _obj({"versionFrom": FROM}, SUCCEEDED)
    assert watch_exit_code(obj) == 0
    assert progress_line(obj).startswith("v7 [")
    assert "2/2 updated" in progress_line(obj)
    assert "Version:    v7 (versionFrom)" in status_table(obj)
    assert rollout_view(obj)["version"] == "v7"


def test_a_spec_version_the_operator_has_not_picked_up_is_still_going() -> None:
    obj = _obj({"version": "v8"}, SUCCEEDED)
    assert watch_exit_code(obj) is None
    assert "0/2 updated" in progress_line(obj)
