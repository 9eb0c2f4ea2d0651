"""A worker that makes no progress names its cause within seconds (#28), long before the worker
timeout: real agents that cannot check the operator's token (their apiserver address answers
nothing, as when their kubeconfig or the TLS Secret they need is wrong) answer every call 503
AuthUnavailable; the rollout keeps calling them, and says so with the cause in status.message, a
Warning event and the worker's status entry. A selected pod the scheduler cannot place is named
the same way."""

from __future__ import annotations

import json
import socket
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from ckpt_e2e.catalog import model_flags
from ckpt_e2e.fixtures import PodRuntimeFactory
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.podruntime import PodInfo
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import (
    WORKER_LABEL,
    AgentOptions,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    http_call,
    rollout_spec,
    worker_deployment,
)
from ckpt_e2e.serviceaccounts import WORKER_ACCOUNT, ChartAccounts

pytestmark = pytest.mark.integration

NAME = "stalled"
LABELS = {"app": WORKER_LABEL, "fleet": "stalled"}
SHOWN_WITHIN_S = 15.0  # the bound; the worker timeout is 600 s


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answer(worker: Worker, token: str) -> tuple[int, bytes] | None:
    """The agent's answer to /v1/status, or None while it does not listen yet."""
    try:
        return http_call(worker.url("/v1/status"), token, timeout=10)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_agents_that_cannot_check_the_token_are_named_with_the_cause_within_seconds(
    operator: OperatorProcess,
    rollouts: Rollouts,
    kubectl: Kubectl,
    pod_runtime: PodRuntimeFactory,
    checkpoint_source: CheckpointSource,
    chart_accounts: ChartAccounts,
    tmp_path: Path,
) -> None:
    nowhere = f"https://127.0.0.1:{_closed_port()}"

    def unreachable_apiserver(pod: PodInfo) -> Path:
        # The pod's own credential, for an apiserver address where nothing answers.
        config = json.loads(chart_accounts.worker_kubeconfig_for(pod).read_text())
        config["clusters"][0]["cluster"]["server"] = nowhere
        path = tmp_path / f"{pod.name}-nowhere.kubeconfig"
        path.write_text(json.dumps(config))
        return path

    kubectl.apply(worker_deployment(NAME, 1, LABELS, WORKER_ACCOUNT))
    options = AgentOptions(
        source_url=checkpoint_source.url,
        initial_version="v1",
        kubeconfig=unreachable_apiserver,
        relay_token=chart_accounts.worker_relay_token_for,
        extra_args=model_flags(False),
    )
    runtime = pod_runtime(f"app={WORKER_LABEL},fleet={NAME}", options.launch)
    pod = wait_for(lambda: next(iter(runtime.running().values()), None), 60, "the worker pod").pod
    worker = Worker(pod.name, pod.ip)
    code, body = wait_for(lambda: _answer(worker, chart_accounts.peer_token()), 60, "the agent answering")
    assert code == 503, body
    assert json.loads(body)["error"] == "AuthUnavailable"

    rollouts.create(NAME, rollout_spec(checkpoint_source.url, "v2", LABELS, strategy={"waves": ["100%"]}))

    def shown() -> dict[str, Any] | None:
        status = rollouts.status(NAME)
        message = str(status.get("message") or "")
        return status if f"waiting on {pod.name}: AuthUnavailable" in message else None

    status = wait_for(
        shown, SHOWN_WITHIN_S, "status.message naming the pod and AuthUnavailable", interval=0.2
    )
    assert "cannot check the operator's token" in str(status["message"])
    assert status["phase"] == "Progressing", "outwaited, not failed: the worker timeout decides"
    entry = status["workers"][pod.name]
    assert (entry["phase"], entry["reason"]) == ("Pending", "AuthUnavailable")

    def warned() -> list[dict[str, str]]:
        return [
            e
            for e in rollouts.events(NAME)
            if (e["type"], e["reason"]) == ("Warning", "WorkerStalled") and pod.name in e["message"]
        ]

    (warning,) = wait_for(warned, SHOWN_WITHIN_S, "a Warning event naming the pod", interval=0.2)
    assert f"{pod.name}: AuthUnavailable: the agent cannot check the operator's token" in warning["message"]


def test_a_pod_that_cannot_be_scheduled_is_named_with_the_cause_within_seconds(
    operator: OperatorProcess, rollouts: Rollouts, kubectl: Kubectl, checkpoint_source: CheckpointSource
) -> None:
    labels = {"app": WORKER_LABEL, "fleet": "unplaced"}
    deployment = worker_deployment("unplaced", 1, labels, WORKER_ACCOUNT)
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {"ckpt-e2e/no-such-node": "true"}
    kubectl.apply(deployment)
    rollouts.create(NAME, rollout_spec(checkpoint_source.url, "v2", labels))

    def shown() -> str | None:
        message = str(rollouts.status(NAME).get("message") or "")
        return message if "Unschedulable: the pod cannot be scheduled" in message else None

    message = wait_for(shown, SHOWN_WITHIN_S, "status.message naming the unschedulable pod", interval=0.2)
    assert message.startswith("no Running pod with an IP matches the selector; waiting on unplaced-"), message
    assert "node(s) didn't match Pod's node affinity/selector" in message, message

    def warned() -> list[dict[str, str]]:
        return [
            e
            for e in rollouts.events(NAME)
            if (e["type"], e["reason"]) == ("Warning", "WorkerStalled") and "Unschedulable" in e["message"]
        ]

    (warning,) = wait_for(
        warned, SHOWN_WITHIN_S, "a Warning event naming the unschedulable pod", interval=0.2
    )
    assert warning["message"].startswith("unplaced-"), warning
