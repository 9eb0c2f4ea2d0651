"""What users deploy, end to end: on the local control plane (kube-apiserver + kwok), the operator
runs from its image and a worker pod's agent from the worker image (cpu variant, paddle engine),
both as the chart and a worker pod spec run them; the rest of the fleet are agent processes. A
rollout reaches Succeeded and /v1/infer proves the image-run worker serves the new weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_api.vocabulary import WavePhase
from ckpt_e2e import images
from ckpt_e2e.images import Built
from ckpt_e2e.launchers import ContainerLauncher, Launcher
from ckpt_e2e.podruntime import PodInfo
from ckpt_e2e.rollout_env import (
    AGENT_PROCESS,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    http_json,
    rollout_spec,
    serving_versions,
)
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

OPERATOR_UID = "65532:65532"


class FirstPodsFromImage:
    """Per-pod launcher choice: the first `count` pods started run `image`, the others processes."""

    def __init__(self, count: int, image: Launcher) -> None:
        self.count = count
        self.image = image
        self.pods: list[str] = []

    def __call__(self, pod: PodInfo) -> Launcher:
        if pod.name in self.pods or len(self.pods) < self.count:
            if pod.name not in self.pods:
                self.pods.append(pod.name)
            return self.image
        return AGENT_PROCESS


def _hardened(container: dict[str, object], user: str) -> None:
    """The container runs as the chart's securityContext says."""
    config = container["Config"]
    host = container["HostConfig"]
    assert isinstance(config, dict)
    assert isinstance(host, dict)
    assert config["User"] == user
    assert host["ReadonlyRootfs"] is True
    assert container["EffectiveCaps"] in (None, [])
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "host"


def test_rollout_with_operator_and_worker_from_their_images(
    built_images: dict[str, Built],
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    fleet_factory: Callable[..., Fleet],
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    tmp_path: Path,
) -> None:
    operator_image, worker_image = built_images["operator"].tag, built_images["worker-cpu"].tag
    operator = OperatorProcess(
        operator_identity.kubeconfig,
        namespace,
        operator_identity.token_file,
        tmp_path / "operator",
        launcher=ContainerLauncher(operator_image, user=OPERATOR_UID),
    )
    operator.start()
    try:
        picker = FirstPodsFromImage(1, ContainerLauncher(worker_image))
        fleet = fleet_factory(2, agent_launcher=picker)
        workers = fleet.workers(2)
        (from_image,) = [w for w in workers if w.name in picker.pods]

        (op_container,) = images.containers(operator_image)
        _hardened(op_container, OPERATOR_UID)
        (agent_container,) = images.containers(worker_image)
        _hardened(agent_container, "10001:10001")
        assert from_image.name in str(agent_container["Name"])

        rollouts.create(
            "fleet",
            rollout_spec(
                checkpoint_source.url,
                "v2",
                fleet.labels,
                verifyChecksum=True,
                strategy={"waves": [1, "100%"]},
            ),
        )
        status = rollouts.wait_phase("fleet", {"Succeeded", "Failed"}, timeout=300, version="v2")
        assert status["phase"] == "Succeeded", status
        assert status["updatedReplicas"] == 2
        # Successful workers are folded into their wave's counts; the wave lists the members.
        assert [(w["phase"], w["updated"]) for w in status["waves"]] == [(WavePhase.COMPLETED, 1)] * 2
        assert from_image.name in {pod for w in status["waves"] for pod in w["pods"]}
        agent = http_json(from_image.url("/v1/status"), token=fleet.token)
        assert (agent["version"], agent["checksum_verified"]) == ("v2", True)

        dirs = {v: checkpoint_source.version_dir(v) for v in ("v1", "v2")}
        assert serving_versions(workers, fleet.token, dirs) == {w.name: "v2" for w in workers}
        # Both containers did the work from start to end: neither was restarted or replaced.
        assert operator.alive
        assert operator.starts == 1
        assert [c["Id"] for c in images.containers(operator_image)] == [op_container["Id"]]
        assert [c["Id"] for c in images.containers(worker_image)] == [agent_container["Id"]]
    finally:
        operator.stop()
    assert images.containers(operator_image) == []
