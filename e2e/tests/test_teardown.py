"""Stopping a cluster (and its pod runtime) leaves no process and no listening port behind."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest
from kubernetes import client, config

from ckpt_e2e.cluster import ClusterOptions, LocalCluster
from ckpt_e2e.fixtures import CONTROL_PLANE
from ckpt_e2e.podruntime import Launch, PodInfo, PodRuntime
from ckpt_e2e.procs import descendants, listening_ports, wait_for
from ckpt_e2e.provision import resolve

pytestmark = pytest.mark.integration

_SLEEPER = (
    "import os, socket, time; s = socket.socket(); s.bind((os.environ['POD_IP'], 18090)); "
    "s.listen(); time.sleep(3600)"
)


def listener(pod: PodInfo) -> Launch:
    return Launch([sys.executable, "-c", _SLEEPER])


@pytest.mark.skipif("CKPT_E2E_KUBECONFIG" in os.environ, reason="tests the local control plane")
def test_teardown_leaves_no_process_or_port(
    tmp_path_factory: pytest.TempPathFactory, record_property: Callable[[str, object], None]
) -> None:
    before_procs = descendants(os.getpid())
    binaries = resolve(CONTROL_PLANE)
    local = LocalCluster(binaries, ClusterOptions(nodes=1)).start()
    workdir = local.workdir
    try:
        api = config.new_client_from_config(config_file=str(local.kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            "default",
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="p", labels={"app": "sleeper"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="worker")]),
            ),
        )
        runtime = PodRuntime(
            api, "default", "app=sleeper", listener, tmp_path_factory.mktemp("teardown-pods")
        ).start()
        pod_ip = wait_for(
            lambda: next((pp.pod.ip for pp in runtime.running().values()), None), 60, "the sleeper process"
        )
        wait_for(lambda: (pod_ip, 18090) in listening_ports(), 10, f"{pod_ip}:18090 listening")
        during_procs = descendants(os.getpid()) - before_procs
        during_ports = listening_ports(during_procs)
        # etcd (client+peer), apiserver, controller-manager, scheduler, the pod's process.
        assert len(during_ports) >= 6, during_ports
        assert (pod_ip, 18090) in during_ports, during_ports
        assert all(ip.startswith("127.") for ip, _ in during_ports), during_ports
        runtime.stop()
        api.close()
    finally:
        local.stop()

    record_property("cluster_start_seconds", round(local.timings["total"], 2))
    leftover_procs = descendants(os.getpid()) & during_procs
    assert not leftover_procs, f"processes left behind: {leftover_procs}"
    leftover_ports = listening_ports() & during_ports
    assert not leftover_ports, f"ports still listening: {leftover_ports}"
    assert not workdir.exists(), f"workdir left behind: {workdir}"
