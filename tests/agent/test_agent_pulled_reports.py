"""`rollout.report: false`: the operator pulls this worker's outcome (big waves), so the agent
writes no status.workers entry into the CR; its pod condition is still written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from ckpt_agent.errors import RequestError
from ckpt_agent.metrics import AgentMetrics
from ckpt_agent.report import worker_entry
from ckpt_agent.reporting import KubeReporter
from ckpt_agent.update_request import RolloutRef, parse_rollout
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WorkerPhase, WorkerReason

REF = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 1}


def test_report_defaults_to_true_and_must_be_a_boolean() -> None:
    assert parse_rollout(REF) == RolloutRef(namespace="rl", name="fleet", uid="u", wave=1, report=True)
    assert parse_rollout({**REF, "report": False}) == RolloutRef(
        namespace="rl", name="fleet", uid="u", wave=1, report=False
    )
    with pytest.raises(RequestError) as err:
        parse_rollout({**REF, "report": "no"})
    assert err.value.field == "rollout.report"


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[Any, list[str]]]:
    """A stand-in apiserver that records the paths of the patches it gets."""
    patched: list[str] = []

    async def patch(request: web.Request) -> web.Response:
        patched.append(request.path)
        return web.json_response({})

    app = web.Application()
    app.router.add_patch("/{tail:.*}", patch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api = client.ApiClient(configuration=client.Configuration(host=f"http://127.0.0.1:{port}"))
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
