"""The multi-agent host: many real agents (null engine) in one process, each on its own IP,
reporting to the CR and its pod like a one-agent-per-pod fleet."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client

from ckpt_api.agent_api import AgentStatus, RolloutRef, UpdateAccepted, UpdateWeightsRequest
from ckpt_api.status import CheckpointRolloutStatus, WorkerStatus
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION, WorkerPhase
from ckpt_e2e.multiagent import HostedPod, MultiAgentHost, request_kind
from ckpt_e2e.nullfleet import NullFleet
from ckpt_e2e.procs import PortReservation, wait_for
from ckpt_e2e.rollout_env import AGENT_PORT, Rollouts, http_json

ROLLOUT = RolloutRef(namespace="ns", name="fleet", uid="u", wave=2)


@pytest.mark.parametrize(
    ("method", "url", "kind"),
    [
        (
            "PATCH",
            "https://h/apis/rollout.ckpt.dev/v1alpha1/namespaces/a/checkpointrollouts/r/status",
            "PATCH checkpointrollouts/status",
        ),
        (
            "get",
            "https://h/apis/rollout.ckpt.dev/v1alpha1/namespaces/a/checkpointrollouts/r?x=1",
            "GET checkpointrollouts",
        ),
        ("PATCH", "https://h/api/v1/namespaces/a/pods/p/status", "PATCH pods/status"),
        ("POST", "https://h/apis/authentication.k8s.io/v1/tokenreviews", "POST other"),
    ],
)
def test_request_kind(method: str, url: str, kind: str) -> None:
    assert request_kind(method, url) == kind


def _loopback_ips(count: int) -> list[str]:
    # Outside the pod CIDR octets clusters claim (20-239) and kwok's fallback (250).
    third = secrets.randbelow(250)
    return [f"127.{241 + secrets.randbelow(8)}.{third}.{i + 1}" for i in range(count)]


async def test_one_process_serves_each_agent_on_its_own_ip(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret")
    # Held on the wildcard address: that keeps the port from others on every pod IP too.
    held = PortReservation(1, host="0.0.0.0")
    (port,) = held.ports
    pods = [HostedPod(f"w-{i}", "ns", ip) for i, ip in enumerate(_loopback_ips(3))]
    host = MultiAgentHost(pods, token_file=token_file, initial_version="v0", port=port, report=False)
    await host.start()
    try:
        auth = {"Authorization": "Bearer s3cret"}
        async with aiohttp.ClientSession() as session:

            async def call(ip: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
                url = f"http://{ip}:{port}{path}"
                async with session.request(method, url, json=body, headers=auth) as resp:
                    return resp.status, await resp.json()

            for pod in pods:
                status = await _status(call, pod.ip)
                assert (status.version, status.engine.get("name")) == ("v0", "null")
            async with session.get(f"http://{pods[0].ip}:{port}/v1/status") as resp:
                assert resp.status == 401, "each hosted agent still checks the caller's token"

            request = UpdateWeightsRequest(version="v1", rollout=ROLLOUT)
            code, _ = await call(pods[1].ip, "POST", "/v1/update_weights", request.to_wire())
            assert code == 202
            for _ in range(100):
                if (await _status(call, pods[1].ip)).version == "v1":
                    break
                await asyncio.sleep(0.02)
            assert [(await _status(call, p.ip)).version for p in pods] == ["v0", "v1", "v0"]

        stats = host.stats()
        assert stats["agents"] == 3
        assert stats["versions"] == {"v0": 2, "v1": 1}
        assert stats["loads"] == 1
        assert set(stats["slowest_load_s_by_wave"]) == {"2"}
        assert stats["api_requests"] == {}, "reporting off: no API client at all"
    finally:
        await host.stop()
        held.release()


async def _status(call: Any, ip: str) -> AgentStatus:
    code, body = await call(ip, "GET", "/v1/status")
    assert code == 200
    return AgentStatus.model_validate(body)


@pytest.mark.integration
def test_hosted_agents_report_to_the_cr_and_their_pods(
    cluster: Any, k8s_api: client.ApiClient, namespace: str, crd_installed: None, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(secrets.token_hex(16))
    labels = {"app": "null-workers"}
    fleet = NullFleet(k8s_api, namespace, 4, cluster.kubeconfig, token_file, tmp_path, labels=labels, hosts=2)
    rollouts = Rollouts(k8s_api, namespace)
    # A CR for the reports to land in; its spec selects nothing, so no operator acts on it.
    rollouts.create(
        "fleet",
        {"version": "v1", "source": {"uri": "http://127.0.0.1:9/x"}, "selector": {"matchLabels": {"a": "b"}}},
    )
    with fleet:
        assert len(fleet.pids) == 2
        pods = fleet.pods()
        assert len({p.ip for p in pods}) == 4
        token = token_file.read_text()
        request = UpdateWeightsRequest(
            version="v1", rollout=RolloutRef(namespace=namespace, name="fleet", uid="u", wave=0)
        )
        for pod in pods:
            url = f"http://{pod.ip}:{AGENT_PORT}/v1/update_weights"
            assert UpdateAccepted.model_validate(http_json(url, token=token, body=request.to_wire())).accepted

        def reported() -> dict[str, WorkerStatus] | None:
            status = CheckpointRolloutStatus.model_validate(rollouts.status("fleet"))
            done = {k: v for k, v in status.workers.items() if v.phase is WorkerPhase.UPDATED}
            return done if len(done) == 4 else None

        workers = wait_for(reported, 60, "4 Updated entries in status.workers", interval=0.2)
        assert set(workers) == {p.name for p in pods}
        assert all(e.version == "v1" and e.bytes == 0 for e in workers.values())

        core = client.CoreV1Api(k8s_api)
        for pod in pods:
            conditions = core.read_namespaced_pod_status(pod.name, namespace).status.conditions or []
            ready = {c.type: c.status for c in conditions}.get(WEIGHTS_READY_CONDITION)
            assert ready == "True", pod.name

        stats = wait_for(
            lambda: (s := fleet.stats())["api_requests"].get("PATCH pods/status", 0) >= 12 and s,
            30,
            "pod reports counted",
        )
        assert stats["agents"] == 4
        assert stats["versions"] == {"v1": 4}
        # Loading + Updated on the CR, per agent; ready at boot, not ready, ready again on the pod.
        assert stats["api_requests"]["PATCH checkpointrollouts/status"] == 8
        assert stats["api_requests"]["PATCH pods/status"] == 12
    assert fleet.pids == [], "stopped with the block"
