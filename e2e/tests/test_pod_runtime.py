"""kwok pods get distinct loopback IPs, and the pod-runtime stand-in runs a process on each."""

from __future__ import annotations

import ipaddress
import sys
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from ckpt_e2e.fixtures import PodRuntimeFactory
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.podruntime import Launch, PodInfo, PodRuntime
from ckpt_e2e.procs import wait_for

pytestmark = pytest.mark.integration

PORT = 18089
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")

# Answers every GET with the pod name it was started for: proves the process is bound to the
# pod's IP and got the downward-API environment.
_ECHO_SERVER = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["POD_NAME"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
print("listening", os.environ["POD_IP"], flush=True)
http.server.HTTPServer((os.environ["POD_IP"], int(os.environ["PORT"])), H).serve_forever()
"""


def echo_server(pod: PodInfo) -> Launch:
    return Launch([sys.executable, "-c", _ECHO_SERVER], env={"PORT": str(PORT)})


def deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # kwok runs no image; the stand-in runs the process instead.
                "spec": {"containers": [{"name": "worker", "image": "worker"}]},
            },
        },
    }


def answer(ip: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:{PORT}/", timeout=1) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def running_pods(core: client.CoreV1Api, namespace: str, selector: str) -> dict[str, str]:
    """Running, not-terminating pods by name -> IP."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return {
        p.metadata.name: p.status.pod_ip
        for p in pods
        if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp
    }


def exactly(pods: dict[str, str], count: int) -> dict[str, str] | None:
    return pods if len(pods) == count else None


def serving(runtime: PodRuntime, count: int) -> dict[str, str] | None:
    """pod name -> IP once exactly `count` processes run and each answers with its pod name."""
    procs = runtime.running()
    if len(procs) != count:
        return None
    if any(answer(pp.pod.ip) != name for name, pp in procs.items()):
        return None
    return {name: pp.pod.ip for name, pp in procs.items()}


def test_deployment_pods_get_loopback_ips_and_processes(
    k8s_api: client.ApiClient, namespace: str, kubectl: Kubectl, pod_runtime: PodRuntimeFactory
) -> None:
    core = client.CoreV1Api(k8s_api)
    runtime = pod_runtime("app=echo", echo_server)
    kubectl.apply(deployment("echo", 3))

    pods = wait_for(lambda: exactly(running_pods(core, namespace, "app=echo"), 3), 60, "3 Running pods")
    ips = list(pods.values())
    assert len(set(ips)) == 3, f"pod IPs not distinct: {pods}"
    assert all(ipaddress.ip_address(ip) in LOOPBACK for ip in ips), pods
    nodes = {p.spec.node_name for p in core.list_namespaced_pod(namespace).items}
    assert nodes, "no pod was scheduled"
    assert all(n.startswith("kwok-node-") for n in nodes), nodes

    served = wait_for(lambda: serving(runtime, 3), 30, "a process serving on each of 3 pod IPs")
    assert served == pods
    for name in pods:
        assert runtime.log_path(name).read_text().startswith(f"listening {pods[name]}")

    # Deleting a pod stops its process; the ReplicaSet's replacement gets a new one.
    victim = sorted(pods)[0]
    victim_proc = runtime.running()[victim].proc
    kubectl("delete", "pod", victim, "--wait=false")
    wait_for(lambda: victim_proc.poll() is not None, 30, f"process of deleted pod {victim} to stop")
    after_delete = wait_for(lambda: serving(runtime, 3), 60, "3 serving pods after the delete")
    assert victim not in after_delete

    # Scaling to 5 starts exactly two more processes and leaves the others alone.
    before = {name: pp.pid for name, pp in runtime.running().items()}
    kubectl("scale", "deployment/echo", "--replicas=5")
    after_scale = wait_for(lambda: serving(runtime, 5), 60, "5 serving pods after scale-up")
    assert len(set(after_scale) - set(before)) == 2
    assert {name: runtime.running()[name].pid for name in before} == before
    assert len(set(after_scale.values())) == 5
    assert runtime.exited == [], f"processes died on their own: {runtime.exited}"

    # Scaling to zero stops every process it started; none is left running.
    started = [pp.proc for pp in runtime.running().values()]
    kubectl("scale", "deployment/echo", "--replicas=0")
    wait_for(lambda: not runtime.running(), 60, "all processes to stop after scale to 0")
    assert all(proc.poll() is not None for proc in started)


def test_pod_runtime_follows_rapid_churn(
    k8s_api: client.ApiClient, namespace: str, kubectl: Kubectl, pod_runtime: PodRuntimeFactory
) -> None:
    """Pods created and deleted faster than processes start: the runtime converges anyway."""
    core = client.CoreV1Api(k8s_api)
    runtime = pod_runtime("app=churn", echo_server)
    kubectl.apply(deployment("churn", 4))
    for replicas in (1, 6, 2, 5):
        kubectl("scale", "deployment/churn", f"--replicas={replicas}")

    # While the ReplicaSet still deletes surplus pods, five processes can already serve a set
    # that is about to change; converged means the serving set is the Running set.
    def converged() -> dict[str, str] | None:
        served = serving(runtime, 5)
        return served if served is not None and served == running_pods(core, namespace, "app=churn") else None

    final = wait_for(converged, 90, "the 5 serving pods to be the 5 Running pods after churn")
    assert len(set(final.values())) == 5, f"pod IPs not distinct: {final}"
