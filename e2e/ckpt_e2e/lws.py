"""The LeaderWorkerSet controller (sigs.k8s.io/lws, built from its Go module like the control
plane) run beside the local control plane, for the tests of multi-node replicas.

Its manager runs as a host process with the admin kubeconfig. LeaderWorkerSet needs its
admission webhooks: the pod webhook is what labels a group's pods (group-key on the leader,
worker-index on the workers) and the LeaderWorkerSet one fills in the object's defaults. The
apiserver reaches them at https://127.0.0.1:<port> with a certificate from a CA of this module's
own (the module's webhook manifests name a Service; here they name that URL and CA instead), and
only for the namespace under test: pods of other tests are never sent to it. The module's own
CRD is installed (once per cluster; it is left for the next test, as a cluster keeps CRDs).
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from ckpt_api.vocabulary import ConditionStatus

from .kubectl import Kubectl
from .pki import ClusterPKI
from .procs import PortReservation, spawn, stop, wait_for
from .provision import module_source, resolve
from .rollout_env import http_ok

GROUP_LABEL_PREFIX = "leaderworkerset.sigs.k8s.io/"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"


def _webhooks(source: Path, namespace: str, url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations, pointed at ``url`` and scoped to ``namespace``."""
    docs = [
        d for d in yaml.safe_load_all((source / "config" / "webhook" / "manifests.yaml").read_text()) if d
    ]
    bundle = base64.b64encode(ca_bundle).decode()
    for doc in docs:
        doc["metadata"] = {"name": f"ckpt-e2e-lws-{namespace}-{doc['kind'].lower()}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path, "caBundle": bundle}
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            if hook["rules"][0]["resources"] == ["pods"]:
                # As the module's kustomize patch does: only pods a LeaderWorkerSet made.
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": f"{GROUP_LABEL_PREFIX}name", "operator": "Exists"}]
                }
    return docs


@contextmanager
def leaderworkerset_controller(kubectl: Kubectl, namespace: str, workdir: Path) -> Iterator[None]:
    """The controller serving ``namespace`` for the block; its webhooks are removed after."""
    manager = resolve(["lws-manager"])["lws-manager"]
    source = module_source("lws")
    workdir.mkdir(parents=True, exist_ok=True)
    kubectl.run("apply", "--server-side", "-f", str(source / "config" / "crd" / "bases"))
    established = '{.status.conditions[?(@.type=="Established")].status}'

    def served() -> bool:
        got = kubectl.run("get", "crd", CRD_NAME, "-o", f"jsonpath={established}", check=False)
        return got.stdout.strip() == ConditionStatus.TRUE

    wait_for(served, 60, f"CRD {CRD_NAME} to be established")
    pki = ClusterPKI(workdir / "pki", ca_name="ckpt-e2e-lws-ca")
    serving = pki.serving("webhook", ips=["127.0.0.1"], dns=["localhost"])
    certs = workdir / "certs"
    certs.mkdir(exist_ok=True)
    (certs / "tls.crt").write_bytes(serving.cert.read_bytes())
    (certs / "tls.key").write_bytes(serving.key.read_bytes())
    with PortReservation(2) as ports:
        webhook_port, probe_port = ports.ports
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        }
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        log = workdir / "lws-manager.log"
        proc = spawn([str(manager), f"--kubeconfig={kubectl.kubeconfig}", f"--config={config_path}"], log)
        hooks = _webhooks(source, namespace, f"https://127.0.0.1:{webhook_port}", pki.ca_cert.read_bytes())
        try:
            wait_for(lambda: _ready(proc, probe_port, log), 60, "the LeaderWorkerSet controller to be ready")
            kubectl.apply(hooks)
            yield
        finally:
            for hook in hooks:
                kubectl.run(
                    "delete", hook["kind"], hook["metadata"]["name"], "--ignore-not-found", check=False
                )
            stop(proc)


def _ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"lws-manager exited with {proc.returncode}; log tail:\n{log.read_text()[-3000:]}")
    return http_ok(f"http://127.0.0.1:{port}/readyz")
