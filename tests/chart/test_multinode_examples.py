"""examples/multinode/ agree with the CRD, the agent's contract and each other: the rollout
selects every pod of the LeaderWorkerSets, the leaders' agents drive their engine and the
workers' agents stage for it, all at the path their engine containers mount (no cluster needed)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from chart_render import ROOT

from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION
from ckpt_rollout.domain.selectors import selector_matches

MULTINODE = ROOT / "examples" / "multinode"
FLEETS = {"sglang-leaderworkerset.yaml": "sglang", "vllm-leaderworkerset.yaml": "vllm"}


def _one(path: Path, kind: str) -> Any:
    (found,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return found


def _agent_flags(container: dict[str, Any]) -> dict[str, str]:
    from ckpt_agent.cli import build_parser

    build_parser().parse_args(["agent", *container["args"]])  # the agent's CLI takes them
    return {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in container["args"])}


def _templates(name: str) -> dict[str, Any]:
    lws = _one(MULTINODE / name, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    return {"leader": template["leaderTemplate"], "worker": template["workerTemplate"]}


def test_the_rollout_groups_replicas_by_leaderworkerset_labels() -> None:
    cr = _one(MULTINODE / "checkpointrollout.yaml", "CheckpointRollout")
    spec = CheckpointRolloutSpec.model_validate(cr["spec"])
    assert spec.replica_groups is not None
    assert spec.replica_groups.group_label == "leaderworkerset.sigs.k8s.io/group-key"
    assert spec.replica_groups.leader_label == "leaderworkerset.sigs.k8s.io/worker-index"
    for name in FLEETS:
        for role, template in _templates(name).items():
            assert selector_matches(spec.selector, template["metadata"]["labels"]), (name, role)


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_leaders_drive_their_engine_and_workers_stage_where_it_reads(name: str) -> None:
    for role, template in _templates(name).items():
        pod = template["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        flags = _agent_flags(containers["agent"])
        expected = FLEETS[name] if role == "leader" else "member"
        assert flags["engine"] == expected, (name, role)
        assert ("engine-url" in flags) is (role == "leader"), (name, role)
        staging = PurePosixPath(flags["staging-dir"])
        # The same volume at the same path in the engine and the agent: the path the agent
        # stages to is the path the engine's ranks read.
        for container in containers.values():
            mounts = {m["name"]: PurePosixPath(m["mountPath"]) for m in container["volumeMounts"]}
            assert mounts.get("staging") == staging, (name, role, container["name"])
        assert {"conditionType": WEIGHTS_READY_CONDITION} in pod["readinessGates"], (name, role)
