"""The chart's worker admission policies on the real apiserver: an agent's token is bound to its
pod, and with it the agent may write only that pod's status and that pod's entry of a rollout's
status.workers. Every other e2e test runs its agents under these policies too (chart_accounts
applies them), so a rollout that needs a worker to write more than its own entry fails there."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_e2e.podruntime import PodInfo
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import Rollouts
from ckpt_e2e.serviceaccounts import WORKER_ACCOUNT, ChartAccounts

pytestmark = pytest.mark.integration

SPEC = {"version": "v2", "source": {"uri": "http://127.0.0.1:1/"}, "selector": {"matchLabels": {"a": "b"}}}


def _entry(version: str) -> dict[str, Any]:
    return {"version": version, "phase": "Updated", "reason": "Loaded"}


@contextmanager
def _api(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    with api:
        yield api


def _refusal(call: Callable[[], object]) -> str | None:
    """The apiserver's message if it refused the call as forbidden, None if it was let through."""
    try:
        call()
    except ApiException as exc:
        if exc.status != 403:
            raise
        return str(exc.body)
    return None


def _pod(api: client.ApiClient, namespace: str, name: str) -> PodInfo:
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "admission"}),
        spec=client.V1PodSpec(
            service_account_name=WORKER_ACCOUNT, containers=[client.V1Container(name="w", image="w")]
        ),
    )
    pod = client.CoreV1Api(api).create_namespaced_pod(namespace, body)
    return PodInfo(name, namespace, pod.metadata.uid, "", "", {})


@pytest.mark.usefixtures("crd_installed")
def test_a_worker_writes_only_its_own_pod_and_its_own_entry(
    chart_accounts: ChartAccounts, k8s_api: client.ApiClient, namespace: str
) -> None:
    mine, other = _pod(k8s_api, namespace, "worker-a"), _pod(k8s_api, namespace, "worker-b")
    Rollouts(k8s_api, namespace).create("fleet", SPEC)
    admin = client.CustomObjectsApi(k8s_api)

    def patch_status(api: client.ApiClient, status: dict[str, Any]) -> Callable[[], object]:
        return lambda: client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "fleet", {"status": status}
        )

    def patch_pod(api: client.ApiClient, pod: PodInfo) -> Callable[[], object]:
        condition = {"type": "rollout.ckpt.dev/WeightsReady", "status": "True", "reason": "Loaded"}
        return lambda: client.CoreV1Api(api).patch_namespaced_pod_status(
            pod.name, namespace, {"status": {"conditions": [condition]}}
        )

    patch_status(k8s_api, {"phase": "Progressing", "workers": {"worker-b": _entry("v1")}})()

    with (
        _api(chart_accounts.worker_kubeconfig_for(mine)) as worker,
        _api(chart_accounts.worker_kubeconfig) as unbound,
        _api(chart_accounts.operator_kubeconfig) as operator,
    ):
        # The apiserver enforces a new policy once its informer has seen it (about a second).
        # Each probe writes a value not there yet: a probe let through before that would make
        # the next one a no-op write, which the policy rightly allows, and the wait would never end.
        probes = itertools.count(1)

        def enforced() -> bool:
            probe = {"workers": {"worker-b": _entry(f"probe{next(probes)}")}}
            return _refusal(patch_status(worker, probe)) is not None

        wait_for(enforced, 30, "the worker admission policy to be enforced", interval=0.2)
        patch_status(k8s_api, {"workers": {"worker-b": _entry("v1")}})()
        refused = _refusal(patch_status(worker, {"workers": {"worker-b": _entry("v2")}}))
        assert refused is not None
        assert "pod worker-a may write only its own entry of status.workers" in refused
        removal = _refusal(patch_status(worker, {"workers": {"worker-b": None}}))
        assert removal is not None
        assert "only its own entry" in removal
        phase = _refusal(patch_status(worker, {"phase": "Succeeded", "workers": {"worker-a": _entry("v2")}}))
        assert phase is not None
        assert "no other status field" in phase
        assert _refusal(patch_status(worker, {"workers": {"worker-a": _entry("v2")}})) is None

        other_pod = _refusal(patch_pod(worker, other))
        assert other_pod is not None
        assert "pod worker-a may write only its own status, not pod worker-b's" in other_pod
        assert _refusal(patch_pod(worker, mine)) is None
        _own_pod_beyond_weights_ready_is_refused(worker, k8s_api, namespace, mine)

        # A token bound to no pod (the ServiceAccount's, minted by hand) writes nothing.
        not_bound = _refusal(patch_status(unbound, {"workers": {"worker-a": _entry("v3")}}))
        assert not_bound is not None
        assert "bound to the pod" in not_bound
        assert _refusal(patch_pod(unbound, mine)) is not None

        # The operator is not a worker: it writes any entry (e.g. WorkerTimeout for a silent pod).
        assert _refusal(patch_status(operator, {"workers": {"worker-b": _entry("v2")}})) is None

    status = admin.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "fleet")["status"]
    assert status["phase"] == "Progressing"
    assert status["workers"] == {"worker-a": _entry("v2"), "worker-b": _entry("v2")}


def _own_pod_beyond_weights_ready_is_refused(
    worker: client.ApiClient, admin: client.ApiClient, namespace: str, mine: PodInfo
) -> None:
    """Its own pod, but not its WeightsReady condition: its podIP (which the operator and peers
    dial with their credentials), its phase, another condition, a label."""
    core = client.CoreV1Api(worker)

    def patch(body: dict[str, Any] | list[dict[str, Any]]) -> Callable[[], object]:
        # A list is a JSON patch: a strategic merge would add to podIPs (merged by ip), which the
        # apiserver's own validation refuses before any policy sees the write.
        return lambda: core.patch_namespaced_pod_status(mine.name, namespace, body)

    before = client.CoreV1Api(admin).read_namespaced_pod_status(mine.name, namespace)
    weights_ready = "rollout.ckpt.dev/WeightsReady"
    moved_ip: list[dict[str, Any]] = [
        {"op": "replace", "path": "/status/podIP", "value": "10.99.0.1"},
        {"op": "replace", "path": "/status/podIPs", "value": [{"ip": "10.99.0.1"}]},
    ]
    for body in [moved_ip, {"status": {"phase": "Failed"}}]:
        refused = _refusal(patch(body))
        assert refused is not None, body
        assert (
            f"pod {mine.name} may change only its {weights_ready} condition, no other status field" in refused
        )
    # A condition of another type than WeightsReady (Ready may already say what a patch would).
    ready = {"type": "ckpt.test/Other", "status": "True"}
    other = _refusal(patch({"status": {"conditions": [ready]}}))
    assert other is not None
    assert f"may change only its {weights_ready} condition, not its other conditions" in other
    label = _refusal(patch({"metadata": {"labels": {"app": "elsewhere"}}}))
    if label is not None:  # the apiserver may drop metadata changes on pods/status by itself
        assert "may not change its labels or annotations" in label
    pod = client.CoreV1Api(admin).read_namespaced_pod_status(mine.name, namespace)
    assert (pod.status.pod_ip, pod.status.phase) == (before.status.pod_ip, before.status.phase)
    assert pod.metadata.labels == before.metadata.labels
    condition = {"type": weights_ready, "status": "False", "reason": "Loading"}
    assert _refusal(patch({"status": {"conditions": [condition]}})) is None, "its own condition, again"
