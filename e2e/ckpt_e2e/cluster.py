"""A real local control plane: etcd, kube-apiserver, controller-manager, scheduler and kwok.

Everything binds to 127.0.0.1 on free ports and lives in one temp dir. kwok fakes the
kubelets of `nodes` nodes whose podCIDRs lie in 127.0.0.0/8 (node i gets 127.<base+i>.0.0/16,
base claimed per cluster, never shared by two live clusters), so every pod's IP is a loopback
address a test process can bind.

`ClusterOptions(real_node=True)` adds one real kubelet node beside them (realnode.py, in a
network namespace of its own, nodenet.py). Only then does the apiserver also serve the node's
pods: a forwarder on the host end of the node's veth passes connections to it (it still binds
127.0.0.1 alone), it advertises that address so the `kubernetes` Service's endpoints point
there (kube-proxy on the node routes the Service IP), its serving certificate names it and the
Service IP, and it authorizes kubelets with the Node authorizer, as a real cluster does.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TextIO

from . import versions
from .kubeapi import ApiError, KubeAPI, is_ready
from .kwok_stages import stages_yaml
from .nodenet import NodeNetwork
from .pki import CertPair, ClusterPKI
from .procs import PortReservation, WaitTimeout, all_threads_stopped, spawn, stop, wait_for
from .realnode import NODE_NAME as REAL_NODE_NAME
from .realnode import RealNode
from .realnode import sweep_stale as sweep_stale_nodes

NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Pod CIDR octets: clear of 127.0.x (the control plane) and kwok's fallback 127.250.0.0/16.
_FIRST_OCTET, _LAST_OCTET = 20, 239
LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR
TCPFORWARD = Path(__file__).resolve().parent / "tcpforward.py"


@dataclass
class ClusterOptions:
    nodes: int = 2
    # Later benchmarks run up to 5000 pods; a /16 per node holds that many IPs.
    max_pods_per_node: int = 5000
    workdir: Path | None = None  # default: a fresh temp dir, removed on stop
    keep_workdir: bool = False
    start_timeout: float = 120.0
    # Second octet of node 0's podCIDR. None: claim a free range (see _claim_octets) so two
    # clusters on one machine (a developer's and a CI run) never hand out the same pod IPs.
    cidr_base: int | None = None
    # One real kubelet + containerd node beside the kwok ones (binaries must then include
    # realnode.BINARIES).
    real_node: bool = False


@dataclass
class _Component:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)  # to start it again (apiserver_down)


@dataclass
class LocalCluster:
    binaries: Mapping[str, Path]
    options: ClusterOptions = field(default_factory=ClusterOptions)

    def __post_init__(self) -> None:
        self._components: list[_Component] = []
        self._own_workdir = self.options.workdir is None
        self.workdir = self.options.workdir or Path(tempfile.mkdtemp(prefix="ckpt-e2e-"))
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.ports: dict[str, int] = {}
        # etcd and the kube-* servers take no port 0 they could report: their ports stay held
        # (see PortReservation) for the cluster's life, an apiserver restart included.
        self._port_hold: PortReservation | None = None
        self.timings: dict[str, float] = {}
        self.server = ""
        self.cidr_base = self.options.cidr_base or 0
        self._octet_locks: list[TextIO] = []
        self.node_net: NodeNetwork | None = None
        self.real_node: RealNode | None = None
        # Where pods on the real node reach the apiserver (the forwarder); "" without one.
        self.pod_server = ""
        # What the real node's teardown could not remove (empty when all went).
        self.teardown_leftovers: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalCluster:
        t0 = time.monotonic()
        try:
            self._start(t0)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop components in reverse start order; each is SIGTERMed, then SIGKILLed. The real
        node goes first (its teardown talks to its own containerd only), its network last."""
        if self.real_node is not None:
            self.teardown_leftovers = self.real_node.stop()
            self.real_node = None
        while self._components:
            comp = self._components.pop()
            stop(comp.proc, grace=10.0)
        if self.node_net is not None:
            self.teardown_leftovers += self.node_net.destroy()
            self.node_net.release()
            self.node_net = None
        for lock in self._octet_locks:
            lock.close()  # releases the flock: the pod IP range is free again
        self._octet_locks.clear()
        if self._port_hold is not None:
            self._port_hold.release()
        if self._own_workdir and not self.options.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def pids(self) -> dict[str, int]:
        found = {c.name: c.proc.pid for c in self._components}
        if self.real_node is not None:
            found.update(self.real_node.pids)
        return found

    def admin_api(self) -> KubeAPI:
        return KubeAPI(self.server, self.pki.ca_cert, self._admin.cert, self._admin.key)

    @contextmanager
    def apiserver_down(self) -> Iterator[None]:
        """kube-apiserver is stopped (SIGTERM) for the block, then started again with the same
        flags, port, certificates and etcd data; returns once it is ready. Every client sees
        what a control-plane restart looks like: refused connections, then broken watches."""
        index = next(i for i, c in enumerate(self._components) if c.name == "kube-apiserver")
        comp = self._components[index]
        stop(comp.proc, grace=10.0)
        try:
            yield
        finally:
            with open(comp.log, "a") as log:
                log.write("\n--- restarted by LocalCluster.apiserver_down ---\n")
            fresh = _Component(comp.name, spawn(comp.argv, comp.log, cwd=self.workdir), comp.log, comp.argv)
            self._components[index] = fresh
            api = self.admin_api()
            self._wait(fresh, lambda: api.ok("/readyz"), "kube-apiserver /readyz after a restart")

    def apiserver_frozen(self) -> AbstractContextManager[None]:
        """kube-apiserver is stopped (SIGSTOP) for the block: the kernel still completes TCP
        handshakes on its port, so every call hangs instead of failing — a hung apiserver.
        It continues (SIGCONT) after the block; returns once it answers /readyz again."""
        return self._frozen("kube-apiserver")

    def etcd_frozen(self) -> AbstractContextManager[None]:
        """etcd is stopped (SIGSTOP) for the block: kube-apiserver still answers what its caches
        hold (TokenReviews, RBAC decisions) while its /readyz fails; the same return as above."""
        return self._frozen("etcd")

    @contextmanager
    def _frozen(self, name: str) -> Iterator[None]:
        comp = next(c for c in self._components if c.name == name)
        # os.kill, not Popen.send_signal: that one silently sends nothing to a child it believes
        # gone, and a freeze that did not happen reads as a test failure far from here.
        os.kill(comp.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: all_threads_stopped(comp.proc.pid), 10, f"{name} (pid {comp.proc.pid}) to stop")
            yield
        finally:
            os.kill(comp.proc.pid, signal.SIGCONT)
            api = self.admin_api()
            self._wait(comp, lambda: api.ok("/readyz"), f"kube-apiserver /readyz after {name} froze")

    # ------------------------------------------------------------------ steps

    def _start(self, t0: float) -> None:
        wd = self.workdir
        if self.options.cidr_base is None:
            self.cidr_base, self._octet_locks = _claim_octets(self.options.nodes)
        self.pki = ClusterPKI(wd / "pki")
        names = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        self._port_hold = PortReservation(len(names))
        self.ports = dict(zip(names, self._port_hold.ports, strict=True))
        self.server = f"https://{LOOPBACK}:{self.ports['apiserver']}"
        ips, dns = [LOOPBACK], ["localhost", "kubernetes.default.svc"]
        if self.options.real_node:
            # What a SIGKILLed run left (shims, containers, mounts, its netns), before we add ours.
            sweep_stale_nodes()
            self.node_net = NodeNetwork.claim(owner=wd / "realnode")
            self.node_net.create()
            self.pod_server = f"https://{self.node_net.host_ip}:{self.ports['apiserver']}"
            # What in-cluster clients dial: the Service IP or name, or the advertised endpoint.
            ips += [self.node_net.host_ip, KUBERNETES_SERVICE_IP]
            dns += ["kubernetes", "kubernetes.default", "kubernetes.default.svc.cluster.local"]
        serving = self.pki.serving("apiserver", ips, dns)
        self._admin = self.pki.client("admin", "ckpt-e2e-admin", ("system:masters",))

        self._start_etcd()
        self._start_apiserver(serving)
        if self.node_net is not None:
            self._start_forwarder(self.node_net)
        self.timings["apiserver_ready"] = time.monotonic() - t0

        self._write_kubeconfig(self.kubeconfig, self._admin)
        cm_kc = self._kubeconfig_for("controller-manager", "system:kube-controller-manager")
        sched_kc = self._kubeconfig_for("scheduler", "system:kube-scheduler")
        # kwok writes node and pod status; the admin group keeps it out of RBAC concerns.
        kwok_kc = self._kubeconfig_for("kwok", "kwok-controller", ("system:masters",))
        self._start_controller_manager(cm_kc)
        self._start_scheduler(sched_kc)
        self._start_kwok(kwok_kc)
        self._create_nodes()
        self._wait_ready()
        if self.node_net is not None:
            self._start_real_node(self.node_net)
            self.timings["real_node_ready"] = time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str]) -> _Component:
        log = self.workdir / "logs" / f"{name}.log"
        comp = _Component(name, spawn(argv, log, cwd=self.workdir), log, list(argv))
        self._components.append(comp)
        return comp

    def _wait(self, comp: _Component, check: object, what: str, timeout: float | None = None) -> None:
        """Wait for `check()`; fail fast with the log tail if the process died meanwhile."""
        assert callable(check)

        def probe() -> bool:
            if comp.proc.poll() is not None:
                raise RuntimeError(
                    f"{comp.name} exited with {comp.proc.returncode} while waiting for {what}; "
                    f"log tail ({comp.log}):\n{_tail(comp.log)}"
                )
            return bool(check())

        try:
            wait_for(probe, timeout or self.options.start_timeout, what, interval=0.1)
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}; {comp.name} log tail:\n{_tail(comp.log)}") from None

    def _start_etcd(self) -> None:
        client = f"http://{LOOPBACK}:{self.ports['etcd']}"
        peer = f"http://{LOOPBACK}:{self.ports['etcd-peer']}"
        comp = self._spawn(
            "etcd",
            [
                str(self.binaries["etcd"]),
                "--name=ckpt-e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=ckpt-e2e={peer}",
                # Test data is disposable: skipping fsync makes etcd writes (and startup) fast.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait(comp, lambda: _http_ok(f"{client}/health"), "etcd /health")

    def _start_apiserver(self, serving: CertPair) -> None:
        issuer = self.server
        if self.node_net is None:
            node_flags = [
                f"--advertise-address={LOOPBACK}",
                "--authorization-mode=RBAC",
                # The endpoint reconciler would publish 127.0.0.1 for the kubernetes Service,
                # which EndpointSlice validation rejects.
                "--endpoint-reconciler-type=none",
            ]
        else:
            kubelet_client = self.pki.client(
                "apiserver-kubelet-client", "kube-apiserver", ("system:masters",)
            )
            node_flags = [
                # The kubernetes Service's endpoint (lease reconciler, the default): the forwarder.
                f"--advertise-address={self.node_net.host_ip}",
                # Kubelets act as system:node:<name>, allowed what their own pods need.
                "--authorization-mode=Node,RBAC",
                # logs/exec/port-forward reach the kubelet as a client of its x509 + webhook
                # authn; its serving certificate is self-signed, so it is not verified.
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        comp = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers=http://{LOOPBACK}:{self.ports['etcd']}",
                f"--bind-address={LOOPBACK}",
                *node_flags,
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--cert-dir={self.workdir / 'apiserver'}",
                f"--client-ca-file={self.pki.ca_cert}",
                f"--service-account-issuer={issuer}",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                f"--api-audiences={issuer}",
                # Cluster IPs are routed only on the real node (its kube-proxy); for kwok pods they
                # are only allocated.
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        api = self.admin_api()
        self._wait(comp, lambda: api.ok("/readyz"), "kube-apiserver /readyz")

    def _start_forwarder(self, net: NodeNetwork) -> None:
        port = self.ports["apiserver"]
        comp = self._spawn(
            "apiserver-forwarder",
            [sys.executable, "-I", str(TCPFORWARD), f"{net.host_ip}:{port}", f"{LOOPBACK}:{port}"],
        )
        api = KubeAPI(self.pod_server, self.pki.ca_cert, self._admin.cert, self._admin.key)
        self._wait(comp, lambda: api.ok("/readyz"), f"kube-apiserver /readyz through {self.pod_server}")

    def _start_real_node(self, net: NodeNetwork) -> None:
        # The node dials the forwarder: it lives in its netns, where 127.0.0.1 is its own.
        kubelet_kc = self.workdir / "kubelet.kubeconfig"
        write_kubeconfig(
            kubelet_kc, self.pod_server, self.pki.ca_cert,
            self.pki.client("kubelet", "system:node:" + REAL_NODE_NAME, ("system:nodes",)),
        )  # fmt: skip
        proxy_kc = self.workdir / "kube-proxy.kubeconfig"
        write_kubeconfig(
            proxy_kc, self.pod_server, self.pki.ca_cert, self.pki.client("kube-proxy", "system:kube-proxy")
        )
        self.real_node = RealNode(
            self.binaries,
            net,
            self.workdir / "realnode",
            self.pki.ca_cert,
            kubelet_kc,
            proxy_kc,
            SERVICE_CIDR,
            start_timeout=self.options.start_timeout,
        )
        self.real_node.start(self.admin_api())

    def _start_controller_manager(self, kubeconfig: Path) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports['controller-manager']}",
                f"--cert-dir={self.workdir / 'controller-manager'}",
                "--leader-elect=false",
                # Signs the legacy token Secrets and publishes the CA into every namespace
                # (kube-root-ca.crt), as on a real cluster.
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                # Each controller acts as its own ServiceAccount, so RBAC is exercised as usual.
                "--use-service-account-credentials=true",
                # Defaults (20 qps) make a 5000-pod ReplicaSet take minutes.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )

    def _start_scheduler(self, kubeconfig: Path) -> None:
        config = self.workdir / "scheduler-config.json"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries["kube-scheduler"]),
                f"--config={config}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={self.workdir / 'scheduler'}",
                "--v=1",
            ],
        )

    def _start_kwok(self, kubeconfig: Path) -> None:
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(stages_yaml(self.options.max_pods_per_node, versions.KWOK))
        self._spawn(
            "kwok",
            [
                str(self.binaries["kwok"]),
                f"--kubeconfig={kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
                f"--node-ip={LOOPBACK}",
                # Fallback only: every node we create carries its own loopback podCIDR.
                "--cidr=127.250.0.0/16",
            ],
        )

    def _create_nodes(self) -> None:
        api = self.admin_api()
        for i in range(self.options.nodes):
            name = f"kwok-node-{i}"
            cidr = f"127.{self.cidr_base + i}.0.0/16"
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {NODE_ANNOTATION: "fake"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                    },
                },
                "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
            }
            try:
                api.request("POST", "/api/v1/nodes", body)
            except ApiError as exc:
                if exc.status != 409:
                    raise

    def _wait_ready(self) -> None:
        api = self.admin_api()
        by_name = {c.name: c for c in self._components}
        for name in ("kube-controller-manager", "kube-scheduler"):
            port = self.ports[name.removeprefix("kube-")]
            self._wait(
                by_name[name], lambda p=port: _http_ok(f"https://{LOOPBACK}:{p}/healthz"), f"{name} /healthz"
            )

        def nodes_ready() -> bool:
            items = api.request("GET", "/api/v1/nodes")["items"]
            fake = [
                n for n in items if (n["metadata"].get("annotations") or {}).get(NODE_ANNOTATION) == "fake"
            ]
            ready = [n for n in fake if is_ready(n)]
            return len(ready) == self.options.nodes

        self._wait(by_name["kwok"], nodes_ready, f"{self.options.nodes} kwok nodes Ready")
        # The ServiceAccount controller creates `default` in each namespace; pods are
        # rejected until it exists, so a cluster without it is not ready for tests.
        self._wait(
            by_name["kube-controller-manager"],
            lambda: api.ok("/api/v1/namespaces/default/serviceaccounts/default"),
            "ServiceAccount default/default",
        )

    # ------------------------------------------------------------------ kubeconfigs

    def _kubeconfig_for(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        path = self.workdir / f"{stem}.kubeconfig"
        self._write_kubeconfig(path, self.pki.client(stem, user, groups))
        return path

    def _write_kubeconfig(self, path: Path, creds: CertPair) -> None:
        write_kubeconfig(path, self.server, self.pki.ca_cert, creds)


def _claim_octets(count: int) -> tuple[int, list[TextIO]]:
    """Claim `count` consecutive second octets (127.N.0.0/16 each) for this cluster's pods.

    Each octet is an flock on a file shared by every cluster on the machine; the kernel drops
    the lock when its holder exits, however it exits, so a crashed run never leaks a range.
    """
    lock_dir = Path(tempfile.gettempdir()) / "ckpt-e2e-pod-cidrs"
    lock_dir.mkdir(exist_ok=True)
    bases = list(range(_FIRST_OCTET, _LAST_OCTET - count + 2))
    secrets.SystemRandom().shuffle(bases)  # fewer lock collisions between parallel starts
    for base in bases:
        held: list[TextIO] = []
        for octet in range(base, base + count):
            handle = open(lock_dir / f"127.{octet}.lock", "w")  # noqa: SIM115 - held until stop()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                break
            held.append(handle)
        if len(held) == count:
            return base, held
        for claimed in held:
            claimed.close()
    raise RuntimeError(f"no {count} free pod CIDR octets left in 127.{_FIRST_OCTET}-{_LAST_OCTET}")


def write_kubeconfig(path: Path, server: str, ca: Path, creds: CertPair) -> None:
    """Self-contained kubeconfig (data embedded), JSON being valid YAML for every loader."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "ckpt-e2e", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [
            {
                "name": "ckpt-e2e",
                "user": {"client-certificate-data": b64(creds.cert), "client-key-data": b64(creds.key)},
            }
        ],
        "contexts": [{"name": "ckpt-e2e", "context": {"cluster": "ckpt-e2e", "user": "ckpt-e2e"}}],
        "current-context": "ckpt-e2e",
    }
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)


def _http_ok(url: str) -> bool:
    # Component health endpoints serve self-signed certs from their --cert-dir.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=ctx) as resp:
            return bool(200 <= resp.status < 300)
    except OSError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
