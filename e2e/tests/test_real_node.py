"""The real node beside kwok (ckpt_e2e.realnode): what only a real kubelet makes testable.

A pod on the pod network reaches the apiserver the way in-cluster clients do (the `kubernetes`
Service, routed by kube-proxy, TLS to the Service IP, its projected ServiceAccount token); the
chart's operator pod drives worker-image pods whose readiness gate keeps them NotReady, and out of
their Service's endpoints, while their weights change; containers run as the chart's uid on a
read-only root; the operator's credential to agents is the projected token the chart mounts.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_api.constants import agent_audience
from ckpt_api.tls import AGENT_TLS_SECRET
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION
from ckpt_e2e.fixtures import ClusterHandle, fresh_namespace
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.procs import wait_for
from ckpt_e2e.realnode import NODE_NAME, TAINT_KEY, RealNode, placement
from ckpt_e2e.realnode_env import (
    OPERATOR_IMAGE,
    SYSTEM_NAMESPACE,
    RealNodeEnv,
    RealNodeProvider,
    pod_ready,
    real_node_deployment,
    real_node_of,
)
from ckpt_e2e.rollout_env import (
    AGENT_PORT,
    WORKER_LABEL,
    agent_state,
    http_json,
    rollout_spec,
    serving_versions,
)
from ckpt_e2e.versions import KUBERNETES

pytestmark = pytest.mark.integration

OPERATOR_UID = 65532  # charts/ckpt-rollout/templates/deployment.yaml
WORKER_UID = 10001  # examples/worker-deployment.yaml
AGENT_TOKEN_DIR = "/var/run/secrets/ckpt-rollout/agent"  # the chart's legacy projected token
SHOWN_WITHIN_S = 15.0  # #28's bound for a stalled worker's cause; the worker timeout is 600 s


def _conditions(pod: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}


def _process(node: RealNode, pod: dict[str, Any]) -> tuple[int, bool]:
    """(uid, root filesystem read-only) of the pod's first container, read on the host."""
    pid = node.container_pid(pod["status"]["containerStatuses"][0]["containerID"])
    status = Path(f"/proc/{pid}/status").read_text()
    uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
    root = next(
        line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if line.split()[4] == "/"
    )
    return uid, "ro" in root.split()[5].split(",")


def _endpoints_ready(kubectl: Kubectl, service: str) -> dict[str, bool]:
    """pod name -> ready, from the Service's EndpointSlices (what a Service routes to)."""
    slices = kubectl.json("get", "endpointslices", "-l", f"kubernetes.io/service-name={service}")["items"]
    return {
        e["targetRef"]["name"]: bool(e.get("conditions", {}).get("ready"))
        for s in slices
        for e in s.get("endpoints") or []
    }


def test_real_node_joins_beside_kwok(real_cluster: ClusterHandle) -> None:
    node = real_node_of(real_cluster)
    nodes = {n["metadata"]["name"]: n for n in real_cluster.kubectl.json("get", "nodes")["items"]}
    assert set(nodes) == {"kwok-node-0", NODE_NAME}
    real = nodes[NODE_NAME]
    assert _conditions(real)["Ready"] == "True"
    assert real["status"]["nodeInfo"]["kubeletVersion"] == KUBERNETES
    assert real["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": node.net.node_ip} in real["status"]["addresses"]
    assert [t["key"] for t in real["spec"]["taints"]] == [TAINT_KEY]
    # The kubernetes Service points at the forwarder pods reach, not at loopback.
    (slice_,) = real_cluster.kubectl.json("get", "endpointslices", "-n", "default", "-l",
                                           "kubernetes.io/service-name=kubernetes")["items"]  # fmt: skip
    assert [e["addresses"] for e in slice_["endpoints"]] == [[node.net.host_ip]]


# The operator's own client (kubernetes_asyncio: the image carries no other).
_IN_CLUSTER_CLIENT = """
import asyncio, json
from kubernetes_asyncio import client, config
async def main():
    config.load_incluster_config()  # KUBERNETES_SERVICE_HOST: the Service IP; the SA token and CA
    configuration = client.Configuration.get_default_copy()
    async with client.ApiClient() as api:
        reviews = client.AuthenticationV1Api(api)
        review = await reviews.create_self_subject_review(client.V1SelfSubjectReview())
    print(json.dumps({"host": configuration.host, "user": review.status.user_info.to_dict()}))
asyncio.run(main())
"""


def test_pod_reaches_the_apiserver_through_the_kubernetes_service(
    real_cluster: ClusterHandle, built_images: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    """In-cluster config in a pod of the operator image on the pod network: the `kubernetes`
    Service IP (kube-proxy), TLS verified against the cluster CA, the projected token bound to
    the pod; its log read back through the apiserver (apiserver -> kubelet)."""
    node = real_node_of(real_cluster)
    node.import_images([OPERATOR_IMAGE])
    with real_cluster.api_client() as api, fresh_namespace(api, request.node.name) as namespace:
        kubectl = real_cluster.kubectl.in_namespace(namespace)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "in-cluster"},
            "spec": {
                **placement(),
                "restartPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": OPERATOR_UID,
                    "runAsGroup": OPERATOR_UID,
                },
                "containers": [
                    {
                        "name": "client",
                        "image": OPERATOR_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", _IN_CLUSTER_CLIENT],
                        "securityContext": {
                            "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        }
        kubectl.apply(pod)

        def finished() -> dict[str, Any] | None:
            got: dict[str, Any] = kubectl.json("get", "pod", "in-cluster")
            return got if got["status"].get("phase") in ("Succeeded", "Failed") else None

        done = wait_for(finished, 120, "the in-cluster client pod to finish", interval=0.5)
        log = kubectl.run("logs", "in-cluster").stdout
        assert done["status"]["phase"] == "Succeeded", log
        assert done["status"]["podIP"].startswith(node.net.pod_subnet.rsplit(".", 2)[0])
        seen = json.loads(log.strip().splitlines()[-1])
        assert seen["host"] == "https://10.0.0.1:443"
        user = seen["user"]
        assert user["username"] == f"system:serviceaccount:{namespace}:default"
        assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["in-cluster"]
        assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [done["metadata"]["uid"]]
        assert user["extra"]["authentication.kubernetes.io/node-name"] == [NODE_NAME]


def test_chart_operator_rolls_worker_pods_in_place_behind_their_readiness_gate(
    real_node_provider: RealNodeProvider, real_node_env: RealNodeEnv
) -> None:
    provider, node = real_node_provider, real_node_env.node
    kubectl = provider.kubectl
    system = provider.operator_kubectl

    # The chart's operator: Running, Ready, as the chart's uid on a read-only root.
    (operator_pod,) = provider._operator_pods()
    assert pod_ready(operator_pod)
    assert operator_pod["spec"]["nodeName"] == NODE_NAME
    assert _process(node, operator_pod) == (OPERATOR_UID, True)

    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "workers"},
            "spec": {"selector": {"fleet": "workers"}, "ports": [{"port": AGENT_PORT}]},
        }
    )

    # Boot loads held by a frozen source: containers up and probed, pods NotReady (the gate).
    with provider.source_stalled():
        fleet = provider.fleet(2, at_rest=False)
        workers = fleet.workers(2)

        def gated() -> list[dict[str, Any]] | None:
            pods = kubectl.json("get", "pods", "-l", "fleet=workers")["items"]
            held = [p for p in pods if _conditions(p).get("ContainersReady") == "True" and not pod_ready(p)]
            return pods if len(held) == 2 else None

        pods = wait_for(gated, 120, "2 worker pods running, containers ready, pod NotReady", interval=0.5)
        assert {_conditions(p).get(WEIGHTS_READY_CONDITION) for p in pods} <= {"False", None}
        assert set(_endpoints_ready(kubectl, "workers").values()) <= {False}

    def all_ready() -> list[dict[str, Any]] | None:
        pods = kubectl.json("get", "pods", "-l", "fleet=workers")["items"]
        return pods if len(pods) == 2 and all(pod_ready(p) for p in pods) else None

    def endpoints_all_ready() -> bool:
        return _endpoints_ready(kubectl, "workers") == {w.name: True for w in workers}

    before = wait_for(all_ready, 120, "both workers Ready once their boot load ends", interval=0.5)
    wait_for(endpoints_all_ready, 60, "both workers in the Service's ready endpoints", interval=0.2)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before}
    for pod in before:
        assert _process(node, pod) == (WORKER_UID, True)

    # A rollout to v2; the canary's load is held mid-way: that pod alone leaves the endpoints.
    with provider.source_stalled():
        provider.rollouts.create("fleet", provider.spec("v2", fleet, strategy={"waves": [1, "100%"]}))
        by_name = {w.name: w for w in workers}

        def canary_loading() -> str | None:
            status = provider.rollouts.status("fleet")
            waves = status.get("waves") or []
            called = waves[0].get("called") if waves else None
            if called and agent_state(by_name[called[0]], fleet.token) == "loading":
                return str(called[0])
            return None

        canary = wait_for(canary_loading, 120, "the canary loading v2", interval=0.2)
        (other,) = set(by_name) - {canary}

        def canary_out() -> bool:
            return _endpoints_ready(kubectl, "workers") == {canary: False, other: True}

        wait_for(canary_out, 60, "the loading canary out of the Service's ready endpoints", interval=0.2)
        pod = kubectl.json("get", "pod", canary)
        assert not pod_ready(pod)
        assert _conditions(pod)[WEIGHTS_READY_CONDITION] == "False"
        assert _conditions(pod)["ContainersReady"] == "True"

    status = provider.rollouts.wait_phase("fleet", {"Succeeded", "Failed", "RolledBack"}, timeout=180)
    assert status["phase"] == "Succeeded", status.get("message")
    after = wait_for(all_ready, 120, "both workers Ready on v2", interval=0.5)
    wait_for(endpoints_all_ready, 60, "both workers back in the Service's ready endpoints", interval=0.2)
    published = {v: provider.version_dir(v) for v in ("v1", "v2")}
    assert set(serving_versions(workers, fleet.token, published).values()) == {"v2"}
    # In place: the same pods, never restarted.
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after} == uids
    assert [c["restartCount"] for p in after for c in p["status"]["containerStatuses"]] == [0, 0]

    # The operator's credential: tokens it mints per worker namespace for its own account (no
    # projected agent token in its pod). Agents take such a token for their namespace, refuse
    # one for another namespace (401) and another account's for theirs (403: no RBAC grant).
    container = operator_pod["spec"]["containers"][0]
    assert f"--agent-token-serviceaccount={SYSTEM_NAMESPACE}/ckpt-rollout" in container["args"]
    assert all(m["mountPath"] != AGENT_TOKEN_DIR for m in container.get("volumeMounts", []))
    namespace = kubectl.namespace
    assert namespace is not None

    def token(account: str, where: Kubectl, audience: str) -> str:
        return where.run("create", "token", account, f"--audience={audience}").stdout.strip()

    ours = token("ckpt-rollout", system, agent_audience(namespace))
    assert http_json(workers[0].url("/v1/status"), token=ours)["version"] == "v2"
    with pytest.raises(urllib.error.HTTPError, match="401"):
        http_json(
            workers[0].url("/v1/status"), token=token("ckpt-rollout", system, agent_audience("elsewhere"))
        )
    with pytest.raises(urllib.error.HTTPError, match="403"):
        http_json(
            workers[0].url("/v1/status"),
            token=token("ckpt-rollout-worker", kubectl, agent_audience(namespace)),
        )
    operator_now = system.json("get", "pod", operator_pod["metadata"]["name"])
    assert operator_now["status"]["containerStatuses"][0]["restartCount"] == 0


def test_worker_pods_that_cannot_start_are_named_with_the_kubelets_cause_within_seconds(
    real_node_provider: RealNodeProvider,
) -> None:
    """What only a kubelet reports: an image it cannot run (the pod's container state) and a
    Secret volume it cannot mount (only a FailedMount event, which the operator reads with the
    chart's `list events`). Each is named, pod and cause, in a WorkerStalled Warning event on the rollout
    within SHOWN_WITHIN_S of its creation (#28), long before the worker timeout."""
    provider = real_node_provider
    labels = {"app": WORKER_LABEL, "fleet": "stuck"}
    # An image the node does not hold, never to be pulled: the kubelet says so in the container's
    # state at once (no registry is reachable from here to fail a pull against).
    unpullable = real_node_deployment("unpullable", 1, labels, [], image="localhost/ckpt-worker:missing")
    # Without its Secret volumes: the kubelet mounts volumes before it looks for the image, so a
    # missing Secret would be what holds this pod too.
    spec = unpullable["spec"]["template"]["spec"]
    secrets = {v["name"] for v in spec.get("volumes", []) if "secret" in v}
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in secrets]
    for each in spec["containers"]:
        each["volumeMounts"] = [m for m in each.get("volumeMounts", []) if m["name"] not in secrets]
    # The worker pod mounts its agent's serving certificate; this namespace has none (as when
    # the TLS Secret was never created, or went with a `helm uninstall`).
    unmountable = real_node_deployment("unmountable", 1, labels, [])
    container = unmountable["spec"]["template"]["spec"]["containers"][0]
    tls = [v for v in unmountable["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert [v["secret"]["secretName"] for v in tls] == [AGENT_TLS_SECRET]
    assert provider.kubectl.run("get", "secret", AGENT_TLS_SECRET, check=False).returncode != 0
    for deployment in (unpullable, unmountable):
        deployment["spec"]["template"]["spec"]["serviceAccountName"] = "default"
        provider.kubectl.apply(deployment)
    provider.rollouts.create("stuck", rollout_spec(provider.source_uri, "v2", labels))
    created = time.monotonic()

    def warned(prefix: str, reason: str) -> Callable[[], str | None]:
        def seen() -> str | None:
            for event in provider.rollouts.events("stuck"):
                said = event["message"] or ""
                if event["reason"] == "WorkerStalled" and said.startswith(prefix) and f": {reason}: " in said:
                    return said
            return None

        return seen

    mount = wait_for(warned("unmountable-", "FailedMount"), SHOWN_WITHIN_S, "FailedMount named", interval=0.5)
    assert f'secret "{AGENT_TLS_SECRET}" not found' in mount, mount
    assert f"container {container['name']} cannot be created" in mount, mount
    pull = wait_for(
        warned("unpullable-", "ErrImageNeverPull"),
        max(1.0, SHOWN_WITHIN_S - (time.monotonic() - created)),
        "the missing image named",
        interval=0.5,
    )
    assert "the image is not on the node and its pull policy is Never" in pull, pull
    assert "localhost/ckpt-worker:missing" in pull, pull
    status = provider.rollouts.status("stuck")
    assert status["phase"] in ("Pending", "Progressing"), status
    assert "; waiting on un" in str(status.get("message")), status
