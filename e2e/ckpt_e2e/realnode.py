"""One real node beside the kwok nodes: a kubelet and Debian's containerd running real pods from
the images `make images` builds, with kube-proxy (iptables mode) routing Service IPs.

Started by `LocalCluster` when `ClusterOptions(real_node=True)` (`make cluster-up REAL_NODE=1`,
the `real_cluster` fixture). The node is a network namespace of its own (nodenet.py); kubelet,
containerd and kube-proxy run in it through nsenter (same mount and PID namespaces as the host,
so the kubelet's volume mounts are containerd's and teardown sees every process and mount).
Workarounds these VMs need (../shared/REAL_NODE_NOTES.md): a runc wrapper dropping
process.rlimits and process.oomScoreAdj, cgroupfs with QoS cgroups off, no swap check, and a
pause image built here (no registry is reachable).

Everything lives under `<cluster workdir>/realnode/`: containerd's root, state, socket and runc
root; the kubelet's root, certificates and pod logs; CNI config and IPAM state; the pod
network namespaces (netns_mounts_under_state_dir). Teardown (`stop`): kubelet and kube-proxy
stopped by PID, every containerd task killed and deleted (its shim exits and cleans up), any
shim or container process still alive SIGKILLed by PID, containerd stopped, every mount under
that directory unmounted, the kubelet's /var/log/containers links and the host sysctls the
kubelet changed restored, the directory removed; `leftovers()` says what is still there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import images
from .kubeapi import ApiError, KubeAPI, is_ready
from .nodenet import NodeNetwork, stale_claims
from .procs import WaitTimeout, descendants, pid_alive, spawn, stop, wait_for
from .provision import file_lock

NOT_READY_TAINT = "node.kubernetes.io/not-ready"

BINARIES = ["kubelet", "kube-proxy"]
NODE_NAME = "ckpt-real-node"
# kwok nodes are labelled type=kwok; pods pick this node by name and must tolerate its taint, so
# nothing written for kwok (images that do not exist here) is ever scheduled onto it.
NODE_LABELS = {"type": "real"}
TAINT_KEY = "e2e.ckpt.dev/real-node"
CRI_NAMESPACE = "k8s.io"
HOST_SYSCTLS = "host-sysctls.json"
# What the kubelet sets on the host when it starts (container_manager_linux: kernel tunables);
# read before, restored after.
_KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Host paths the kubelet, containerd and libcni use whatever their configured directories: links
# to container logs, shim sockets, CNI result caches, the device-plugin socket, and the cgroups
# runc makes under k8s.io/ of each hierarchy. Teardown removes what is ours in each, then each
# directory that is left empty (none exists on a machine that never ran a node).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
SHIM_SOCKET_DIR = Path("/run/containerd/s")
CNI_RESULTS = Path("/var/lib/cni/results")
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_DIRS = (
    CONTAINER_LOG_LINKS,
    SHIM_SOCKET_DIR,
    SHIM_SOCKET_DIR.parent,
    CNI_RESULTS,
    CNI_RESULTS.parent,
    DEVICE_PLUGIN_SOCKET.parent,
    DEVICE_PLUGIN_SOCKET.parent.parent,
)
# containerd plugins that would write outside our directory (/opt/containerd) or probe for
# filesystems and exporters we do not use.
_DISABLED_PLUGINS = (
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)

# PID 1 of every pod sandbox: sleeps until told to stop, reaping orphans (a pod sharing its
# process namespace hands them to it), as registry.k8s.io/pause does.
_PAUSE_PY = (
    "import os, signal\n"
    "def reap(*_):\n"
    "    while True:\n"
    "        try:\n"
    "            if os.waitpid(-1, os.WNOHANG)[0] == 0: return\n"
    "        except ChildProcessError: return\n"
    "signal.signal(signal.SIGCHLD, reap)\n"
    "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
    "signal.signal(signal.SIGINT, lambda *_: os._exit(0))\n"
    "while True: signal.pause()\n"
)


class RealNodeError(RuntimeError):
    pass


def toleration() -> dict[str, str]:
    return {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def placement() -> dict[str, object]:
    """Pod spec fields that put a pod on the real node (and only there)."""
    return {"nodeSelector": {"kubernetes.io/hostname": NODE_NAME}, "tolerations": [toleration()]}


# --------------------------------------------------------------------------- images


def pause_image() -> str:
    """The sandbox image, built from the project's base image (cached by its inputs' hash)."""
    base = images.ensure_base()
    containerfile = (
        f"FROM {base.tag}\nUSER 65535:65535\nENTRYPOINT {json.dumps(['python3', '-I', '-c', _PAUSE_PY])}\n"
    )
    key = hashlib.sha256(f"{base.image_id}\n{containerfile}".encode()).hexdigest()[:12]
    tag = f"localhost/ckpt-rollout-pause:{key}"
    with file_lock(images.images_dir() / "locks" / "pause.lock"):
        if not images.image_exists(tag):
            with tempfile.TemporaryDirectory(prefix="ckpt-pause-") as tmp:
                (Path(tmp) / "Containerfile").write_text(containerfile)
                images._run(
                    ["buildah", "bud", "--isolation", "chroot", "--pull=never", "--quiet",
                     "-f", Path(tmp) / "Containerfile", "-t", tag, tmp],
                    images.images_dir() / "logs" / "pause.log",
                )  # fmt: skip
    return tag


# --------------------------------------------------------------------------- the node


@dataclass
class _Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class RealNode:
    binaries: Mapping[str, Path]
    net: NodeNetwork
    root: Path  # <cluster workdir>/realnode
    ca_cert: Path
    kubelet_kubeconfig: Path
    proxy_kubeconfig: Path
    service_cidr: str
    start_timeout: float = 180.0
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._procs: list[_Proc] = []
        self._imported: dict[str, str] = {}  # tag -> podman image id
        self._sysctls: dict[str, str] = {}
        self._container_ids: set[str] = set()
        self._started: dict[str, int] = {}  # every process this node started, by name
        self.pause_image = ""  # the sandbox image's tag, once started

    # ------------------------------------------------------------------ paths

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def state_dir(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cni_network(self) -> str:
        return f"ckpt-e2e-{self.net.netns}"

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.proc.pid for p in self._procs}

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    # ------------------------------------------------------------------ start

    def start(self, api: KubeAPI) -> RealNode:
        t0 = time.monotonic()
        for sub in ("containerd", "kubelet", "cni/net.d", "cni/ipam", "logs", "pod-logs", "runc"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        pause = self.pause_image = pause_image()
        self._write_cni()
        self._start_containerd(pause)
        self.timings["containerd_ready"] = time.monotonic() - t0
        self.import_images([pause])
        self.timings["pause_imported"] = time.monotonic() - t0
        self._sysctls = _read_tunables()
        # Kept on disk too: a sweep after a SIGKILLed run restores them from there.
        (self.root / HOST_SYSCTLS).write_text(json.dumps(self._sysctls))
        self._start_kubelet()
        self._start_kube_proxy()
        self._wait_node_ready(api)
        self.timings["node_ready"] = time.monotonic() - t0
        return self

    def _spawn(self, name: str, argv: Sequence[str | os.PathLike[str]]) -> _Proc:
        entry = _Proc(name, spawn(self.net.exec_argv([str(a) for a in argv]), self.log(name)), self.log(name))
        self._procs.append(entry)
        self._started[name] = entry.proc.pid
        return entry

    def _alive_or_fail(self, entry: _Proc, what: str) -> None:
        if entry.proc.poll() is not None:
            raise RealNodeError(
                f"{entry.name} exited with {entry.proc.returncode} while waiting for {what}; "
                f"log tail ({entry.log}):\n{_tail(entry.log)}"
            )

    def _write_cni(self) -> None:
        conflist = {
            "cniVersion": "1.0.0",
            # Named per node: libcni caches results under /var/lib/cni/results/<name>-<id>-<if>.
            "name": self.cni_network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.net.bridge,
                    "isGateway": True,
                    # Pods only talk to the host's veth end and to each other: nothing to NAT.
                    "ipMasq": False,
                    # A pod reaching itself through a Service IP comes back over its own port.
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.net.pod_subnet, "gateway": self.net.pod_gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                }
            ],
        }
        (self.root / "cni" / "net.d" / "10-ckpt-e2e.conflist").write_text(json.dumps(conflist, indent=1))

    def _containerd_config(self, pause: str) -> str:
        wrapper = images.runtime_wrapper(("rlimits", "oomScoreAdj"))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        # TOML strings below are JSON strings: the same escaping for the paths we write.
        q = json.dumps
        return "\n".join(
            [
                "version = 2",
                f"root = {q(str(self.root / 'containerd' / 'root'))}",
                f"state = {q(str(self.state_dir))}",
                "disabled_plugins = [" + ", ".join(q(p) for p in _DISABLED_PLUGINS) + "]",
                "[grpc]",
                f"  address = {q(str(self.containerd_socket))}",
                "[debug]",
                '  level = "warn"',
                f"[{cri}]",
                f"  sandbox_image = {q(pause)}",
                # Pod network namespaces under our state dir, not /run/netns beside others'.
                "  netns_mounts_under_state_dir = true",
                "  restrict_oom_score_adj = true",
                "  disable_apparmor = true",
                '  stream_server_address = "127.0.0.1"',
                f"[{cri}.cni]",
                '  bin_dir = "/usr/lib/cni"',
                f"  conf_dir = {q(str(self.root / 'cni' / 'net.d'))}",
                "  max_conf_num = 1",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
                f"[{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri}.containerd.runtimes.runc.options]",
                f"  BinaryName = {q(str(wrapper))}",
                # runc's own state, otherwise /run/containerd/runc.
                f"  Root = {q(str(self.root / 'runc'))}",
                "  SystemdCgroup = false",
                "",
            ]
        )

    def _start_containerd(self, pause: str) -> None:
        config = self.root / "containerd" / "config.toml"
        config.write_text(self._containerd_config(pause))
        entry = self._spawn("containerd", ["containerd", "--config", config])

        def up() -> bool:
            self._alive_or_fail(entry, "its socket")
            return self.containerd_socket.exists() and self._ctr("version", check=False).returncode == 0

        wait_for(up, 60, "containerd answering on its socket", interval=0.1)

    def _ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.containerd_socket), "--namespace", CRI_NAMESPACE, *args]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
        if check and done.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done

    def import_images(self, tags: Sequence[str]) -> dict[str, float]:
        """podman images into containerd (`podman save` | `ctr images import`); pods use them
        with imagePullPolicy Never/IfNotPresent. Returns seconds per image imported now; an
        image already imported with the same id is skipped."""
        took: dict[str, float] = {}
        for tag in tags:
            image_id = images.inspect_image(tag)["Id"]
            if self._imported.get(tag) == image_id:
                continue
            started = time.monotonic()
            archive = self.root / "images" / f"{image_id}.tar"
            archive.parent.mkdir(exist_ok=True)
            try:
                # A docker-archive names the image by its tag (manifest.json RepoTags), which is
                # the name containerd stores it under and pods ask for.
                images._run(["podman", "save", "-o", archive, tag])
                self._ctr("images", "import", str(archive), timeout=600)
            finally:
                archive.unlink(missing_ok=True)
            self._imported[tag] = image_id
            took[tag] = time.monotonic() - started
        return took

    def _start_kubelet(self) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.net.node_ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            # These VMs: cgroup v1+v2 hybrid, swap unknown, no QoS hierarchy, no allocatable
            # enforcement, no per-pod ephemeral storage accounting.
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "localStorageCapacityIsolation": False,
            "podLogsDir": str(self.pod_logs),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "registerWithTaints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
            "serializeImagePulls": False,
            # A shared CI disk must not make the kubelet evict our handful of pods or GC images
            # it cannot pull back.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "/etc/resolv.conf",
            "clusterDomain": "cluster.local",
            "maxPods": 32,
            # Status changes (a readiness gate flipping) reach the apiserver without waiting for
            # the default 10 s status loop; pod status is written by the status manager anyway.
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
        }
        path = self.root / "kubelet" / "config.json"
        path.write_text(json.dumps(config, indent=1))
        self._spawn(
            "kubelet",
            [
                self.binaries["kubelet"],
                f"--config={path}",
                f"--kubeconfig={self.kubelet_kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.net.node_ip}",
                f"--node-labels={','.join(f'{k}={v}' for k, v in NODE_LABELS.items())}",
                f"--root-dir={self.root / 'kubelet' / 'root'}",
                f"--cert-dir={self.root / 'kubelet' / 'pki'}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.proxy_kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": NODE_NAME,
            "bindAddress": self.net.node_ip,
            "clusterCIDR": self.net.pod_subnet,
            "metricsBindAddress": "127.0.0.1:10249",
            "healthzBindAddress": "127.0.0.1:10256",
            # 0 leaves the conntrack sysctls alone (some are not per network namespace).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"minSyncPeriod": "0s", "syncPeriod": "30s"},
        }
        path = self.root / "kube-proxy.json"
        path.write_text(json.dumps(config, indent=1))
        self._spawn("kube-proxy", [self.binaries["kube-proxy"], f"--config={path}", "--v=1"])

    def _wait_node_ready(self, api: KubeAPI) -> None:
        by_name = {p.name: p for p in self._procs}

        def ready() -> bool:
            for entry in by_name.values():
                self._alive_or_fail(entry, f"node {NODE_NAME} Ready")
            try:
                node = api.request("GET", f"/api/v1/nodes/{NODE_NAME}")
            except (ApiError, OSError):
                return False
            # Ready, and the node controller has lifted its not-ready taint (it does so a moment
            # after the condition turns True): only then may pods be scheduled here.
            taints = {t.get("key") for t in node.get("spec", {}).get("taints") or []}
            return is_ready(node) and NOT_READY_TAINT not in taints

        try:
            wait_for(ready, self.start_timeout, f"node {NODE_NAME} Ready and untainted", interval=0.5)
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}; kubelet log tail:\n{_tail(self.log('kubelet'))}") from None

    # ------------------------------------------------------------------ inspection

    def tasks(self) -> dict[str, int]:
        """containerd task id -> pid of its process (running or not)."""
        out = self._ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
        found = {}
        for line in out:
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                found[fields[0]] = int(fields[1])
        return found

    def container_pid(self, container_id: str) -> int:
        """The host pid of a pod's container, from its status' containerID (containerd://ID)."""
        cid = container_id.removeprefix("containerd://")
        pid = self.tasks().get(cid)
        if not pid:
            raise RealNodeError(f"no containerd task {cid}")
        return pid

    def shim_pids(self) -> set[int]:
        """containerd-shim processes serving our containerd (their argv names its socket)."""
        found = set()
        needle = str(self.containerd_socket).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and needle in argv:
                found.add(int(entry.name))
        return found

    def mounts(self) -> list[str]:
        """Mount points under this node's directory, deepest first."""
        root = str(self.root)
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                points.append(point)
        return sorted(set(points), key=lambda p: p.count("/"), reverse=True)

    def leftovers(self) -> list[str]:
        """Whatever of this node still exists after stop(): processes, mounts, files."""
        left = [f"process {name} pid {pid}" for name, pid in self._started.items() if pid_alive(pid)]
        left += [f"shim pid {pid}" for pid in sorted(self.shim_pids())]
        left += [f"mount {m}" for m in self.mounts()]
        left += [f"log link {link}" for link in self._log_links()]
        left += [f"shim socket {s}" for s in self._shim_sockets() if s.exists()]
        left += [f"CNI result {r}" for r in self._cni_results()]
        left += [f"cgroup {c}" for c in self._cgroups()]
        if _stale_socket(DEVICE_PLUGIN_SOCKET):
            left.append(f"stale socket {DEVICE_PLUGIN_SOCKET}")
        if self.root.exists():
            left.append(f"directory {self.root}")
        return left

    def _log_links(self) -> list[Path]:
        if not CONTAINER_LOG_LINKS.is_dir():
            return []
        ours = []
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.pod_logs) + "/"):
                    ours.append(link)
        return ours

    def _cni_results(self) -> list[Path]:
        if not CNI_RESULTS.is_dir():
            return []
        return [
            r
            for r in CNI_RESULTS.iterdir()
            if r.name.startswith(self.cni_network + "-") or any(cid in r.name for cid in self._container_ids)
        ]

    def _cgroups(self) -> list[Path]:
        found = []
        for cid in self._container_ids:
            found += [d for d in CGROUP_ROOT.glob(f"*/k8s.io/{cid}") if d.is_dir()]
        return found

    def _shim_sockets(self) -> list[Path]:
        # containerd 1.6 names a shim's socket sha256(<containerd address>/<namespace>/<id>)
        # under /run/containerd/s whatever its state dir; a shim removes it when it exits cleanly.
        return [
            SHIM_SOCKET_DIR
            / hashlib.sha256(f"{self.containerd_socket}/{CRI_NAMESPACE}/{cid}".encode()).hexdigest()
            for cid in self._container_ids
        ]

    # ------------------------------------------------------------------ stop

    def stop(self) -> list[str]:
        """Tear the node down (see the module docstring); returns what could not be removed."""
        by_name = {p.name: p for p in self._procs}
        for name in ("kubelet", "kube-proxy"):
            if name in by_name:
                stop(by_name[name].proc, grace=10.0)
        if "containerd" in by_name and by_name["containerd"].proc.poll() is None:
            self._remove_tasks()
        self._kill_shims()
        if "containerd" in by_name:
            stop(by_name["containerd"].proc, grace=10.0)
        self._procs.clear()
        self._clean_host()
        _restore_tunables(self._sysctls)
        self._sysctls = {}
        if not self.mounts():
            shutil.rmtree(self.root, ignore_errors=True)
        return self.leftovers()

    def _kill_shims(self) -> None:
        """SIGKILL, by PID, every shim of this node and what runs under it (its containers)."""
        stragglers = self.shim_pids()
        for pid in list(stragglers):
            stragglers |= descendants(pid)
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: not self.shim_pids(), 10, "containerd shims gone", interval=0.1)

    def _clean_host(self) -> None:
        """Unmount everything under the node's directory, then remove what is ours elsewhere."""
        for point in self.mounts():
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False, timeout=30)
        for link in self._log_links():
            link.unlink(missing_ok=True)
        for path in [*self._shim_sockets(), *self._cni_results()]:
            path.unlink(missing_ok=True)
        for cgroup in self._cgroups():  # empty once its processes are gone
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        if _stale_socket(DEVICE_PLUGIN_SOCKET):  # a live kubelet elsewhere keeps its own
            DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
        for parent in [*HOST_DIRS, *CGROUP_ROOT.glob("*/k8s.io")]:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only when empty: another node may be using it

    def _remove_tasks(self) -> None:
        """Kill and delete every task, so each shim cleans up its bundle, cgroup and socket and
        exits; containers are listed first so their ids are known for the socket check."""
        listed = self._ctr("containers", "ls", "-q", check=False).stdout.split()
        self._container_ids |= set(listed)
        for task in self.tasks():
            self._ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False, timeout=30)
        for task in self.tasks():
            self._ctr("tasks", "delete", "--force", task, check=False, timeout=30)


def sweep_stale() -> list[str]:
    """Remove what real nodes of dead harnesses left (a SIGKILLed pytest runs no teardown: its
    kubelet and containerd die with it by the parent-death signal; shims, containers, mounts,
    host files, changed sysctls and the netns stay). Each index no live cluster holds is cleaned
    as its own teardown would have: shims and their containers killed by PID, mounts, host files,
    the sysctls that run found, its directory, its netns. Returns the directories swept."""
    swept = []
    for net, root in stale_claims():
        if root is None:
            continue
        node = RealNode({}, net, root, Path(), Path(), Path(), "")
        tasks = root / "containerd" / "state" / "io.containerd.runtime.v2.task" / CRI_NAMESPACE
        node._container_ids = {d.name for d in tasks.iterdir()} if tasks.is_dir() else set()
        node._kill_shims()
        node._clean_host()
        with contextlib.suppress(OSError, ValueError):
            _restore_tunables(json.loads((root / HOST_SYSCTLS).read_text()))
        if not node.mounts():
            shutil.rmtree(root, ignore_errors=True)
        swept.append(str(root))
    return swept


def _stale_socket(path: Path) -> bool:
    """A unix socket nobody listens on any more."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def _read_tunables() -> dict[str, str]:
    values = {}
    for key in _KERNEL_TUNABLES:
        with contextlib.suppress(OSError):
            values[key] = (Path("/proc/sys") / key).read_text().strip()
    return values


def _restore_tunables(values: Mapping[str, str]) -> None:
    for key, value in values.items():
        path = Path("/proc/sys") / key
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
