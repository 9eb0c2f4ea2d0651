"""`rollout.report: false`: the operator pulls this worker's outcome (big waves), so the agent
writes no status.workers entry into the CR; its pod condition is still written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from ckpt_agent.common.errors import RequestError
from ckpt_agent.common.metrics import AgentMetrics
from ckpt_agent.server.update_request import RolloutRef, parse_rollout
from ckpt_agent.service.reporting import KubeReporter
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WorkerPhase, WorkerReason
from ckpt_api.worker_entries import worker_entry

REF = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 1}


def test_report_defaults_to_true_and_must_be_a_boolean() -> None:
    assert parse_rollout(REF) == RolloutRef(namespace="rl", name="fleet", uid="u", wave=1, report=True)
    assert parse_rollout({**REF, "report": False}) == RolloutRef(
        namespace="rl", name="fleet", uid="u", wave=1, report=False
    )
    with pytest.raises(RequestError) as err:
        parse_rollout({**REF, "report": "no"})
    assert err.value.field == "rollout.report"


POD_UID = "5f1d3c1e-pod-uid"


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[Any, list[str]]]:
    """A stand-in apiserver that records the paths of the patches it gets (and the bodies, in
    `api.bodies`); a pod it is asked to patch has the UID `POD_UID`."""
    patched: list[str] = []
    bodies: list[Any] = []

    async def patch(request: web.Request) -> web.Response:
        patched.append(request.path)
        bodies.append(await request.json())
        if request.path.startswith("/api/v1/"):
            return web.json_response({"kind": "Pod", "metadata": {"name": "worker-0", "uid": POD_UID}})
        return web.json_response({})

    app = web.Application()
    app.router.add_patch("/{tail:.*}", patch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api = client.ApiClient(configuration=client.Configuration(host=f"http://127.0.0.1:{port}"))
    api.bodies = bodies
    yield api, patched
    await api.close()
    await runner.cleanup()


def _entry() -> WorkerStatus:
    return worker_entry(
        version="v2",
        phase=WorkerPhase.UPDATED,
        reason=WorkerReason.LOADED,
        message="v2 is live",
        checksum_verified=False,
        bytes=0,
        seconds=0.0,
        last_transition_time="t",
        live_version="v2",
        wave=1,
        uid="u",
    )


async def test_pulled_rollouts_get_no_cr_patch_but_the_pod_condition(
    apiserver: tuple[Any, list[str]],
) -> None:
    api, patched = apiserver
    reporter = KubeReporter(api, "worker-0", "rl", AgentMetrics())
    reporter.worker_event(RolloutRef(**REF, report=False), _entry())
    reporter.weights_ready(True, "Loaded", "serving v2")
    reporter.worker_event(RolloutRef(**REF), _entry())
    await reporter.close()  # drains the queue

    assert patched == [
        "/api/v1/namespaces/rl/pods/worker-0/status",
        "/apis/rollout.ckpt.dev/v1alpha1/namespaces/rl/checkpointrollouts/fleet/status",
    ]
    assert reporter.describe()["last"]["version"] == "v2", "/v1/status still shows the last outcome"


async def test_entries_carry_the_pod_uid_the_apiserver_gave_for_this_pod(
    apiserver: tuple[Any, list[str]],
) -> None:
    """The operator ignores an entry whose podUID is not its live pod's (an earlier pod of the
    same name wrote it); the agent learns its UID from its first pod status patch."""
    api, _ = apiserver
    reporter = KubeReporter(api, "worker-0", "rl", AgentMetrics())
    reporter.worker_event(RolloutRef(**REF), _entry())  # before any pod patch: no UID yet
    reporter.weights_ready(False, "Loading", "loading v2")
    reporter.worker_event(RolloutRef(**REF), _entry())
    await reporter.close()
    entries = [b["status"]["workers"]["worker-0"] for b in api.bodies if "workers" in b.get("status", {})]
    assert [e["podUID"] for e in entries] == [None, POD_UID]
    assert reporter.pod_uid == POD_UID
