"""Stopping a cluster (and its pod runtime) leaves no process and no listening port behind."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client, config

from ckpt_e2e.cluster import ClusterOptions, LocalCluster
from ckpt_e2e.fixtures import CONTROL_PLANE
from ckpt_e2e.podruntime import Launch, PodInfo, PodRuntime
from ckpt_e2e.procs import descendants, listening_ports, pid_alive, wait_for
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


def _host_state() -> dict[str, object]:
    """What a real node could leave on the host outside its own directory."""
    from ckpt_e2e.realnode import _KERNEL_TUNABLES, CGROUP_ROOT, HOST_DIRS

    return {
        "dirs": {str(d) for d in HOST_DIRS if d.exists()},
        "entries": {str(e) for d in HOST_DIRS if d.is_dir() for e in d.iterdir()},
        "cgroups": {str(c) for c in CGROUP_ROOT.glob("*/k8s.io/*") if c.is_dir()},
        "netns": set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set(),
        "links": set(os.listdir("/sys/class/net")),
        "sysctls": {k: (Path("/proc/sys") / k).read_text() for k in _KERNEL_TUNABLES},
    }


@pytest.mark.realnode
@pytest.mark.skipif("CKPT_E2E_KUBECONFIG" in os.environ, reason="tests the local control plane")
def test_real_node_teardown_leaves_nothing(record_property: Callable[[str, object], None]) -> None:
    """A real node with a running pod (its sandbox, network namespace, volumes, log link, a
    container as uid 65532): after stop no process, mount, netns, link, route, cgroup, host file,
    changed sysctl or directory of it is left."""
    from ckpt_e2e.realnode import BINARIES, placement

    before_procs = descendants(os.getpid())
    before = _host_state()
    binaries = resolve([*CONTROL_PLANE, *BINARIES])
    local = LocalCluster(binaries, ClusterOptions(nodes=1, real_node=True)).start()
    workdir = local.workdir
    node, net = local.real_node, local.node_net
    assert node is not None
    assert net is not None
    try:
        api = config.new_client_from_config(config_file=str(local.kubeconfig))
        core = client.CoreV1Api(api)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                **placement(),
                "securityContext": {"runAsUser": 65532, "runAsGroup": 65532},
                "containers": [
                    {
                        "name": "c",
                        "image": node.pause_image,
                        "imagePullPolicy": "Never",
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                    }
                ],
                "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
            },
        }
        core.create_namespaced_pod("default", body)

        def running() -> bool:
            pod = core.read_namespaced_pod("sleeper", "default")
            return bool(pod.status.container_statuses and pod.status.container_statuses[0].ready)

        wait_for(running, 120, "the sleeper pod running on the real node", interval=0.5)
        during_procs = descendants(os.getpid()) - before_procs
        shims = node.shim_pids()
        assert shims, "a containerd shim serves the pod"
        during_procs |= shims | {p for s in shims for p in descendants(s)}
        assert node.mounts(), "the pod's rootfs, netns and volumes are mounted"
        assert net.netns in _host_state()["netns"]  # type: ignore[operator]
        api.close()
    finally:
        local.stop()

    record_property("real_cluster_start_seconds", round(local.timings["total"], 2))
    assert local.teardown_leftovers == []
    leftover_procs = {p for p in during_procs if pid_alive(p)}
    assert not leftover_procs, f"processes left behind: {leftover_procs}"
    after = _host_state()
    for key in ("dirs", "entries", "cgroups", "netns", "links"):
        new = after[key] - before[key]  # type: ignore[operator]
        assert not new, f"{key} left behind: {new}"
    assert after["sysctls"] == before["sysctls"]
    assert not net.leftovers()
    assert not workdir.exists(), f"workdir left behind: {workdir}"


def _naming(path: Path) -> dict[int, bytes]:
    """pid -> argv[0] of the processes whose command line names `path`."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if str(path).encode() in argv:
            found[int(entry.name)] = argv.split(b"\0")[0]
    return found


_KILLED_RUN = """
import sys, time
from kubernetes import client, config
from ckpt_e2e.cluster import ClusterOptions, LocalCluster
from ckpt_e2e.fixtures import CONTROL_PLANE
from ckpt_e2e.provision import resolve
from ckpt_e2e.realnode import BINARIES, placement

local = LocalCluster(resolve([*CONTROL_PLANE, *BINARIES]), ClusterOptions(nodes=1, real_node=True)).start()
core = client.CoreV1Api(config.new_client_from_config(config_file=str(local.kubeconfig)))
container = {"name": "c", "image": local.real_node.pause_image, "imagePullPolicy": "Never"}
core.create_namespaced_pod(
    "default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {**placement(), "containers": [container]}})
def ready():
    statuses = core.read_namespaced_pod("p", "default").status.container_statuses or []
    return bool(statuses) and all(s.ready for s in statuses)
while not ready():
    time.sleep(0.5)
print("RUN", local.workdir, local.node_net.netns, flush=True)
time.sleep(600)
"""


@pytest.mark.realnode
@pytest.mark.skipif("CKPT_E2E_KUBECONFIG" in os.environ, reason="tests the local control plane")
def test_a_killed_runs_real_node_is_swept_by_the_next(tmp_path: Path) -> None:
    """SIGKILL runs no teardown: the kubelet and containerd die with the harness (parent-death
    signal); its netns, mounts, host files and changed sysctls stay, and often a shim with its
    container. The next real node's start sweeps them (realnode.sweep_stale), found through the
    index the dead run claimed."""
    import signal
    import subprocess

    from ckpt_e2e.realnode import sweep_stale

    before = _host_state()
    log = tmp_path / "killed-run.log"
    with open(log, "w") as out:
        run = subprocess.Popen([sys.executable, "-c", _KILLED_RUN], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "RUN " in log.read_text() or run.poll() is not None, 180, "the run's pod")
        assert run.poll() is None, log.read_text()
        (line,) = [line for line in log.read_text().splitlines() if line.startswith("RUN ")]
        workdir, netns = line.split()[1:]
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    realnode = Path(workdir) / "realnode"
    try:

        def only_shims_left() -> bool:
            return all(a.endswith(b"containerd-shim-runc-v2") for a in _naming(realnode).values())

        wait_for(only_shims_left, 30, "kubelet and containerd gone with their harness")
        shims = set(_naming(realnode))
        assert netns in _host_state()["netns"]  # type: ignore[operator]
        assert realnode.is_dir()

        assert str(realnode) in sweep_stale()
        # Killed by PID; init reaps them a moment later.
        wait_for(lambda: not any(pid_alive(p) for p in shims), 10, f"shims {shims} gone")
        assert str(realnode) not in Path("/proc/self/mountinfo").read_text()
        assert not realnode.exists()
        after = _host_state()
        for key in ("dirs", "entries", "cgroups", "netns", "links"):
            new = after[key] - before[key]  # type: ignore[operator]
            assert not new, f"{key} left behind: {new}"
        assert after["sysctls"] == before["sysctls"]
    finally:
        sweep_stale()  # a failed assertion must not leave the dead run's node behind either
        shutil.rmtree(workdir, ignore_errors=True)  # its control-plane files
