"""The three install paths on a real control plane: kubectl apply, helm, and what GitOps runs.

kwok plays the kubelet: the operator pod is created, scheduled and reported Running/Ready, but
no container runs, so these tests check what the apiserver, RBAC and helm do with the chart,
not the operator's behaviour (other suites run the operator as a process).

The CRD is cluster-scoped and other suites share the session cluster, so these tests never
delete it: helm's `crds.keep` (on by default) leaves it in place on uninstall, and before each
`helm install` that manages it the CRD is handed to that release the way README tells users to
(`kubectl label/annotate`, helm's adoption rule).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_agent.server.auth import Access, UserInfo, access_review
from ckpt_api.tls import AGENT_CA_SECRET, AGENT_TLS_SECRET, agent_server_name, ca_context, server_context
from ckpt_api.vocabulary import LEASE_NAME
from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.pki import handshake_in_memory
from ckpt_e2e.procs import wait_for
from ckpt_e2e.provision import resolve
from ckpt_e2e.rollout_env import CLI
from ckpt_e2e.versions import KUBERNETES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ckpt-rollout"
CRDS_DIR = ROOT / "crds"
EXAMPLES = ROOT / "examples"
CRD = "checkpointrollouts.rollout.ckpt.dev"
# README's names for the kubectl and GitOps paths.
SYSTEM_NS = "ckpt-rollout-system"
WORKER_NS = "rl"
WAIT = 120.0


@dataclass(frozen=True)
class HelmCli:
    binary: Path
    kubeconfig: Path
    home: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=env, timeout=WAIT + 60
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result


@pytest.fixture(scope="module")
def helm(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> HelmCli:
    return HelmCli(resolve(["helm"])["helm"], cluster.kubeconfig, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def kube(cluster: ClusterHandle) -> Kubectl:
    return cluster.kubectl


def _exists(kube: Kubectl, *what: str) -> bool:
    return kube.run("get", *what, "-o", "name", check=False).returncode == 0


def _delete_namespace(kube: Kubectl, name: str) -> None:
    kube.run("delete", "namespace", name, "--ignore-not-found", "--wait=false")
    wait_for(lambda: not _exists(kube, "namespace", name), WAIT, f"namespace {name} to go away")


@pytest.fixture(scope="module")
def readme_namespaces(kube: Kubectl) -> Iterator[None]:
    """ckpt-rollout-system and rl: README's namespaces, for the tests that run README's commands."""
    for name in (SYSTEM_NS, WORKER_NS):
        assert not _exists(kube, "namespace", name), f"namespace {name} exists before the test"
    kube.run("create", "namespace", WORKER_NS)
    yield
    for name in (SYSTEM_NS, WORKER_NS):
        _delete_namespace(kube, name)


def _crd_established(kube: Kubectl) -> bool:
    crd = kube.json("get", "crd", CRD)
    return any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])


def _wait_served(kube: Kubectl, namespace: str) -> None:
    wait_for(lambda: _crd_established(kube), WAIT, f"CRD {CRD} Established")
    # Served: the short name resolves through discovery and lists.
    wait_for(
        lambda: kube.run("get", "ckr", "-n", namespace, check=False).returncode == 0,
        WAIT,
        "kubectl get ckr to work",
    )


def _hand_crd_to(kube: Kubectl, release: str, namespace: str) -> None:
    """README's adoption step: a CRD created elsewhere (kubectl, another release) joins a release."""
    if not _exists(kube, "crd", CRD):
        return
    kube.run("label", "--overwrite", "crd", CRD, "app.kubernetes.io/managed-by=Helm")
    kube.run(
        "annotate",
        "--overwrite",
        "crd",
        CRD,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
    )


def _create_example_rollout(kube: Kubectl, namespace: str) -> str:
    kube.run("apply", "-n", namespace, "-f", str(EXAMPLES / "checkpointrollout.yaml"))
    cr = kube.json("get", "ckr", "rollout-worker", "-n", namespace)
    assert cr["spec"]["version"] == "global_step_1200"
    uid: str = cr["metadata"]["uid"]
    return uid


def _operator_pods(kube: Kubectl, namespace: str, instance: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component=operator"
    pods: list[dict[str, Any]] = kube.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return pods


def _wait_operator_pod_running(kube: Kubectl, namespace: str, instance: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pods = _operator_pods(kube, namespace, instance)
        return pods[0] if len(pods) == 1 and pods[0]["status"].get("phase") == "Running" else None

    pod = wait_for(running, WAIT, f"operator pod of {instance} in {namespace} Running")
    # What the apiserver admitted is the hardened pod the chart renders.
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    return pod


def _can(kube: Kubectl, user: str, verb: str, resource: str, namespace: str | None, name: str = "") -> bool:
    """`kubectl auth can-i` as `user`; "pods/status" asks about the status subresource."""
    kind, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, f"{kind}/{name}" if name else kind, f"--as={user}"]
    args += [f"--subresource={subresource}"] if subresource else []
    args += [f"--namespace={namespace}"] if namespace else []
    result = kube.run(*args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def _may(kube: Kubectl, user: str, verb: str, resource: str, namespace: str) -> bool:
    """The SubjectAccessReview an agent asks (ckpt_agent.server.auth.access_review) about ``resource``
    of group rollout.ckpt.dev, which no API serves: `kubectl auth can-i` resolves resources by
    discovery, so it cannot ask this."""
    kind, _, subresource = resource.partition("/")
    assert kind == "agents"
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}")
    review = access_review(UserInfo(user, groups=groups), Access(verb, subresource or None), namespace, None)
    answer = kube.run("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(answer.stdout)["status"].get("allowed"))


def _sa(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


# --------------------------------------------------------------------------- kubectl path


def test_kubectl_apply_crds_alone_serves_the_crd(kube: Kubectl, namespace: str) -> None:
    kube.run("apply", "-f", str(CRDS_DIR))
    _wait_served(kube, namespace)
    _create_example_rollout(kube, namespace)
    assert kube.json("get", "ckr", "-n", namespace)["items"][0]["metadata"]["name"] == "rollout-worker"


WORKER_SA = "ckpt-rollout-worker"
# What a worker agent calls (the chart's worker RBAC), asked of the worker ServiceAccount.
WORKER_CALLS = [
    ("get", "checkpointrollouts.rollout.ckpt.dev"),
    ("patch", "checkpointrollouts.rollout.ckpt.dev/status"),
    ("get", "pods"),
    ("patch", "pods/status"),
]
# What `helm uninstall` keeps for running workers (README, Uninstall), and how README removes it.
KEPT = ",".join([
    "serviceaccount", "role", "rolebinding", "secret", "clusterrole", "clusterrolebinding",
    "validatingadmissionpolicy", "validatingadmissionpolicybinding",
])  # fmt: skip


def _delete_kept(kube: Kubectl, release: str) -> None:
    """README's clean-up after `helm uninstall`, once no worker runs."""
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=worker-agent"
    kube.run("delete", KEPT, "-A", "-l", selector, "--ignore-not-found")


def _secret_file(kube: Kubectl, namespace: str, name: str, key: str, dest: Path) -> Path:
    data = kube.json("get", "secret", name, "-n", namespace)["data"]
    dest.write_bytes(base64.b64decode(data[key]))
    return dest


def _worker_status_write_refused(kube: Kubectl, namespace: str) -> str | None:
    """The apiserver's refusal of the worker account writing a rollout's status with a token
    bound to no pod (impersonated), None while it lets the write through (RBAC allows it: only
    the admission policies refuse it, once their binding is in force)."""
    result = kube.run(
        "patch", "ckr", "rollout-worker", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"message": "written by a worker"}}),
        f"--as={_sa(namespace, WORKER_SA)}", f"--as-group=system:serviceaccounts:{namespace}",
        check=False,
    )  # fmt: skip
    return result.stderr if result.returncode != 0 else None


@pytest.mark.usefixtures("readme_namespaces")
def test_kubectl_install_path(kube: Kubectl, tmp_path: Path) -> None:
    # README, "kubectl apply": the commands as written there (namespace rl exists already).
    kube.run("apply", "-f", str(CRDS_DIR))
    kube.run("create", "namespace", SYSTEM_NS)
    secrets = subprocess.run(
        [*CLI, "tls-secrets", "--namespace", WORKER_NS], capture_output=True, text=True, check=True
    ).stdout
    kube.run("apply", "-f", "-", input=secrets)
    manifest = EXAMPLES / "kubectl" / "operator.yaml"
    kube.run("apply", "-f", str(manifest))
    try:
        _wait_served(kube, WORKER_NS)
        pod = _wait_operator_pod_running(kube, SYSTEM_NS, "ckpt-rollout")
        operator = _sa(SYSTEM_NS, "ckpt-rollout")
        assert _can(kube, operator, "patch", "checkpointrollouts.rollout.ckpt.dev/status", WORKER_NS)
        assert _can(kube, operator, "watch", "pods", WORKER_NS)
        assert not _can(kube, operator, "get", "secrets", WORKER_NS)
        assert not _can(kube, operator, "delete", "pods", WORKER_NS)

        # What the worker namespace needs: the example workers' ServiceAccount and its RBAC ...
        assert _exists(kube, "serviceaccount", WORKER_SA, "-n", WORKER_NS)
        worker = _sa(WORKER_NS, WORKER_SA)
        for verb, resource in WORKER_CALLS:
            assert _can(kube, worker, verb, resource, WORKER_NS), (verb, resource)
        assert _can(kube, worker, "create", "tokenreviews.authentication.k8s.io", None)
        assert _can(kube, worker, "create", "subjectaccessreviews.authorization.k8s.io", None)
        assert _may(kube, worker, "get", "agents/relay", WORKER_NS)
        # ... the admission policies in force for it ...
        _create_example_rollout(kube, WORKER_NS)
        refusal = wait_for(lambda: _worker_status_write_refused(kube, WORKER_NS), WAIT, "the worker policy")
        # Impersonation carries no user extras, so the policy fails closed rather than naming the
        # missing pod; either way it is the policy, bound to the worker account, that refuses.
        policy = "ValidatingAdmissionPolicy 'ckpt-rollout-worker-checkpointrollouts-status'"
        assert policy in refusal, refusal
        assert "denied request" in refusal, refusal
        # ... and the agents' TLS: what the operator pod mounts verifies the namespace's agents.
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["agent-ca"]["secret"]["secretName"] == AGENT_CA_SECRET
        trust = ca_context(_secret_file(kube, SYSTEM_NS, AGENT_CA_SECRET, "ca.crt", tmp_path / "ca.crt"))
        agent = server_context(
            _secret_file(kube, WORKER_NS, AGENT_TLS_SECRET, "tls.crt", tmp_path / "tls.crt"),
            _secret_file(kube, WORKER_NS, AGENT_TLS_SECRET, "tls.key", tmp_path / "tls.key"),
        )
        handshake_in_memory(agent.current(), trust.current(), agent_server_name(WORKER_NS))
    finally:
        kube.run("-n", WORKER_NS, "delete", "ckr", "rollout-worker", "--ignore-not-found")
        kube.run("delete", "-f", str(manifest), "--ignore-not-found", "--wait=false")
        _delete_namespace(kube, SYSTEM_NS)


# --------------------------------------------------------------------------- helm path


def _chart_copy(dest: Path, version: str) -> Path:
    """The working-tree chart as another chart version (helm caches nothing by path)."""
    target = dest / f"ckpt-rollout-{version}"
    shutil.copytree(CHART, target)
    chart_yaml = target / "Chart.yaml"
    meta = yaml.safe_load(chart_yaml.read_text())
    meta["version"] = version
    chart_yaml.write_text(yaml.safe_dump(meta, sort_keys=False))
    return target


def _previous_chart(dest: Path) -> Path:
    """The chart as last committed (the previous version users run), else the working tree."""
    archive = dest / "previous.tar"
    result = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "archive",
            "--format=tar",
            f"--output={archive}",
            "HEAD",
            "charts/ckpt-rollout",
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:  # not a git checkout (e.g. an unpacked source tree)
        return CHART
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "previous", filter="data")
    return dest / "previous" / "charts" / "ckpt-rollout"


def test_helm_install_upgrade_uninstall_keeps_the_crd_and_rollouts(
    helm: HelmCli, kube: Kubectl, namespace: str, tmp_path: Path
) -> None:
    release = "ckr-upgrade"
    _hand_crd_to(kube, release, namespace)
    previous = _previous_chart(tmp_path)
    installed = helm("install", release, str(previous), "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s")
    assert "allowed-usernames" in installed.stdout  # NOTES.txt tells how to wire agents
    assert _sa(namespace, f"{release}-ckpt-rollout") in installed.stdout
    _wait_served(kube, namespace)
    _wait_operator_pod_running(kube, namespace, release)
    uid = _create_example_rollout(kube, namespace)

    current = json.loads(helm("list", "-n", namespace, "-o", "json").stdout)[0]["chart"]
    new_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"] + "-next"
    newer = _chart_copy(tmp_path, new_version)
    helm("upgrade", release, str(newer), "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s")
    releases = json.loads(helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["chart"], r["revision"]) for r in releases] == [(f"ckpt-rollout-{new_version}", "2")], current
    # helm upgraded the CRD itself (a crds/ directory would have been left alone) ...
    labels = kube.json("get", "crd", CRD)["metadata"]["labels"]
    assert labels["helm.sh/chart"] == f"ckpt-rollout-{new_version}"
    # ... and the rollout lived through it.
    assert kube.json("get", "ckr", "rollout-worker", "-n", namespace)["metadata"]["uid"] == uid

    helm("uninstall", release, "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s")
    assert not _exists(kube, "deployment", f"{release}-ckpt-rollout", "-n", namespace)
    assert not _exists(kube, "clusterrole", f"{release}-ckpt-rollout")
    assert _crd_established(kube), "crds.keep=true must keep the CRD on uninstall"
    assert kube.json("get", "ckr", "rollout-worker", "-n", namespace)["metadata"]["uid"] == uid

    # Installing again under the same name adopts the kept CRD.
    helm("install", release, str(CHART), "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s")
    assert kube.json("get", "ckr", "rollout-worker", "-n", namespace)["metadata"]["uid"] == uid
    helm("uninstall", release, "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s")
    assert _crd_established(kube)


# kubectl maps checkpointrollouts.rollout.ckpt.dev through discovery: without the CRD served it
# asks about another resource, which nobody is granted.
@pytest.mark.usefixtures("crd_installed")
def test_helm_rbac_for_watched_namespaces_leases_and_workers(
    helm: HelmCli, kube: Kubectl, namespace: str
) -> None:
    """What the rendered RBAC allows on a real apiserver: exactly the calls, only where needed."""
    release = "ckr-rbac"
    workers = f"{namespace}-w"
    elsewhere = f"{namespace}-x"
    for extra in (workers, elsewhere):
        kube.run("create", "namespace", extra)
    try:
        helm(
            "install", release, str(CHART), "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s",
            "--set", "crds.install=false",
            "--set", f"watchNamespaces={{{workers}}}",
            "--set", "leaderElection.enabled=true",
            "--set", "workerRbac.enabled=true",
            "--set", f"workerRbac.namespaces={{{workers}}}",
            # Accepted by the apiserver (no CNI here enforces it): the objects are valid.
            "--set", "workerRbac.networkPolicy.enabled=true",
        )  # fmt: skip
        policy = json.loads(kube.run("get", "networkpolicy", "-n", workers, "-o", "json").stdout)["items"]
        assert [p["metadata"]["name"] for p in policy] == [f"{release}-ckpt-rollout-worker-agent"]
        pod = _wait_operator_pod_running(kube, namespace, release)
        assert f"--namespace={workers}" in pod["spec"]["containers"][0]["args"]

        operator = _sa(namespace, f"{release}-ckpt-rollout")
        for verb, resource in [
            ("list", "checkpointrollouts.rollout.ckpt.dev"),
            ("watch", "checkpointrollouts.rollout.ckpt.dev"),
            ("patch", "checkpointrollouts.rollout.ckpt.dev"),
            ("patch", "checkpointrollouts.rollout.ckpt.dev/status"),
            ("list", "pods"),
            # spec.versionFrom's ConfigMaps, read only.
            ("get", "configmaps"),
            ("watch", "configmaps"),
            ("create", "events"),
            ("create", "events.events.k8s.io"),
        ]:
            assert _can(kube, operator, verb, resource, workers), (verb, resource)
            assert not _can(kube, operator, verb, resource, elsewhere), (verb, resource, "elsewhere")
        # What the agents ask SubjectAccessReview before obeying it (no API serves it).
        for verb in ("get", "update"):
            assert _may(kube, operator, verb, "agents", workers), verb
            assert not _may(kube, operator, verb, "agents", elsewhere), (verb, "elsewhere")
        # It mints its agents' tokens for its own ServiceAccount, and for no other.
        own = f"{release}-ckpt-rollout"
        assert _can(kube, operator, "create", "serviceaccounts/token", namespace, own)
        assert not _can(kube, operator, "create", "serviceaccounts/token", namespace, "default")
        assert not _can(kube, operator, "create", "serviceaccounts/token", workers, "ckpt-rollout-worker")
        assert "--agent-token-serviceaccount=" + f"{namespace}/{own}" in pod["spec"]["containers"][0]["args"]
        for verb, resource in [
            ("delete", "checkpointrollouts.rollout.ckpt.dev"),
            ("update", "checkpointrollouts.rollout.ckpt.dev"),
            ("delete", "pods"),
            ("patch", "pods"),
            ("get", "secrets"),
            ("patch", "configmaps"),
            ("create", "configmaps"),
        ]:
            assert not _can(kube, operator, verb, resource, workers), (verb, resource)
        assert _can(kube, operator, "create", "leases.coordination.k8s.io", namespace)
        assert _can(kube, operator, "update", "leases.coordination.k8s.io", namespace, LEASE_NAME)
        assert _can(kube, operator, "get", "leases.coordination.k8s.io", namespace, LEASE_NAME)
        assert not _can(kube, operator, "update", "leases.coordination.k8s.io", namespace, "someone-elses")
        assert not _can(kube, operator, "delete", "leases.coordination.k8s.io", namespace, LEASE_NAME)
        assert not _can(kube, operator, "create", "leases.coordination.k8s.io", workers)

        worker = _sa(workers, "ckpt-rollout-worker")
        assert _exists(kube, "serviceaccount", "ckpt-rollout-worker", "-n", workers)
        for verb, resource in [
            ("get", "checkpointrollouts.rollout.ckpt.dev"),
            ("patch", "checkpointrollouts.rollout.ckpt.dev/status"),
            ("get", "pods"),
            ("patch", "pods/status"),
        ]:
            assert _can(kube, worker, verb, resource, workers), (verb, resource)
            assert not _can(kube, worker, verb, resource, elsewhere), (verb, resource, "elsewhere")
        assert _can(kube, worker, "create", "tokenreviews.authentication.k8s.io", None)
        assert _can(kube, worker, "create", "subjectaccessreviews.authorization.k8s.io", None)
        # Peers read each other's relay, and may not control an agent.
        assert _may(kube, worker, "get", "agents/relay", workers)
        assert not _may(kube, worker, "get", "agents/relay", elsewhere)
        assert not _may(kube, worker, "update", "agents", workers)
        assert not _may(kube, worker, "get", "agents", workers)
        for verb, resource in [
            ("patch", "checkpointrollouts.rollout.ckpt.dev"),
            ("list", "checkpointrollouts.rollout.ckpt.dev"),
            ("list", "pods"),
            ("patch", "pods"),
            ("get", "secrets"),
        ]:
            assert not _can(kube, worker, verb, resource, workers), (verb, resource)
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", f"--timeout={WAIT:.0f}s", check=False)
        _delete_kept(kube, release)
        for extra in (workers, elsewhere):
            kube.run("delete", "namespace", extra, "--ignore-not-found", "--wait=false")


def test_helm_rejects_unknown_values_before_touching_the_cluster(helm: HelmCli, namespace: str) -> None:
    result = helm(
        "install", "ckr-bad", str(CHART), "-n", namespace, "--set", "watchNamespace=rl", check=False
    )
    assert result.returncode != 0
    assert "watchNamespace" in result.stderr
    assert helm("list", "-n", namespace, "-q").stdout.strip() == ""


# --------------------------------------------------------------------------- GitOps


def _example(path: Path, kind: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    assert len(docs) == 1
    return docs[0]


@pytest.mark.usefixtures("readme_namespaces")
def test_argocd_application_renders_and_applies(helm: HelmCli, kube: Kubectl, tmp_path: Path) -> None:
    """What Argo CD does with the Application: `helm template` with its values, then apply."""
    app = _example(EXAMPLES / "gitops" / "argocd-application.yaml", "Application")
    source, destination = app["spec"]["source"], app["spec"]["destination"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(source["helm"]["valuesObject"]))
    rendered = helm(
        "template", source["helm"]["releaseName"], str(ROOT / source["path"]),
        "--namespace", destination["namespace"], "--values", str(values),
        "--kube-version", KUBERNETES,  # Argo CD passes the destination cluster's version
    ).stdout  # fmt: skip
    if "CreateNamespace=true" in app["spec"]["syncPolicy"]["syncOptions"]:
        kube.run("create", "namespace", destination["namespace"])
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered)
    kube.run("apply", "-f", str(manifest))
    try:
        _wait_served(kube, WORKER_NS)
        _wait_operator_pod_running(kube, destination["namespace"], source["helm"]["releaseName"])
        assert _exists(kube, "rolebinding", "-n", WORKER_NS, "ckpt-rollout-worker-agent")
        # Argo CD would keep the CRD on Application deletion: it carries helm's keep policy.
        crd = kube.json("get", "crd", CRD)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    finally:
        objects = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "CustomResourceDefinition"]
        kube.run("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=json.dumps({
            "apiVersion": "v1", "kind": "List", "items": objects,
        }))  # fmt: skip
        _delete_namespace(kube, destination["namespace"])


@pytest.mark.usefixtures("readme_namespaces")
def test_flux_helmrelease_installs(helm: HelmCli, kube: Kubectl, tmp_path: Path) -> None:
    """What helm-controller does with the HelmRelease: a helm install with its values."""
    release = _example(EXAMPLES / "gitops" / "flux-helmrelease.yaml", "HelmRelease")
    spec = release["spec"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(spec["values"]))
    name, target = spec["releaseName"], spec["targetNamespace"]
    _hand_crd_to(kube, name, target)
    create = ["--create-namespace"] if spec["install"]["createNamespace"] else []
    helm(
        "install", name, str(ROOT / spec["chart"]["spec"]["chart"]), "--namespace", target, *create,
        "--values", str(values), "--wait", f"--timeout={WAIT:.0f}s",
    )  # fmt: skip
    try:
        _wait_served(kube, WORKER_NS)
        _wait_operator_pod_running(kube, target, name)
        assert _exists(kube, "serviceaccount", "-n", WORKER_NS, "ckpt-rollout-worker")
    finally:
        helm("uninstall", name, "--namespace", target, "--wait", f"--timeout={WAIT:.0f}s")
        assert _crd_established(kube)
        _delete_kept(kube, name)
        _delete_namespace(kube, target)


@pytest.mark.usefixtures("readme_namespaces")
def test_worker_example_deploys_with_the_chart_rbac(helm: HelmCli, kube: Kubectl) -> None:
    """README's helm section, in order: chart with workerRbac for `rl`, workers, CR, uninstall."""
    _hand_crd_to(kube, "ckpt-rollout", SYSTEM_NS)
    helm(
        "upgrade", "--install", "ckpt-rollout", str(CHART), "-n", SYSTEM_NS, "--create-namespace",
        "--set", "workerRbac.enabled=true", "--set", f"workerRbac.namespaces={{{WORKER_NS}}}",
        "--wait", f"--timeout={WAIT:.0f}s",
    )  # fmt: skip
    installed = True
    try:
        kube.run("-n", WORKER_NS, "apply", "-f", str(EXAMPLES / "worker-deployment.yaml"))
        kube.run("-n", WORKER_NS, "apply", "-f", str(EXAMPLES / "checkpointrollout.yaml"))
        assert "rollout-worker" in kube.run("-n", WORKER_NS, "get", "ckr").stdout

        def pods_running() -> list[dict[str, Any]] | None:
            pods = kube.json("get", "pods", "-n", WORKER_NS, "-l", "app=rollout-worker")["items"]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return running if len(running) == 4 else None

        pods = wait_for(pods_running, WAIT, "4 example worker pods Running")
        for pod in pods:
            assert pod["spec"]["serviceAccountName"] == "ckpt-rollout-worker"
            assert pod["spec"]["readinessGates"] == [{"conditionType": "rollout.ckpt.dev/WeightsReady"}]
        worker = _sa(WORKER_NS, "ckpt-rollout-worker")
        assert _can(kube, worker, "patch", "pods/status", WORKER_NS)
        assert _can(kube, worker, "patch", "checkpointrollouts.rollout.ckpt.dev/status", WORKER_NS)

        uid = kube.json("get", "ckr", "rollout-worker", "-n", WORKER_NS)["metadata"]["uid"]
        helm("uninstall", "ckpt-rollout", "-n", SYSTEM_NS, "--wait", f"--timeout={WAIT:.0f}s")
        installed = False
        assert kube.json("get", "ckr", "rollout-worker", "-n", WORKER_NS)["metadata"]["uid"] == uid
        # What the running workers use stays (README, Uninstall): their account, its RBAC, the
        # admission policies and their TLS Secret.
        assert _exists(kube, "serviceaccount", WORKER_SA, "-n", WORKER_NS)
        for verb, resource in WORKER_CALLS:
            assert _can(kube, worker, verb, resource, WORKER_NS), (verb, resource, "after uninstall")
        assert _can(kube, worker, "create", "tokenreviews.authentication.k8s.io", None)
        assert _exists(kube, "secret", AGENT_TLS_SECRET, "-n", WORKER_NS)
        assert _exists(kube, "validatingadmissionpolicybinding", "ckpt-rollout-worker-pods-status")
        assert not _exists(kube, "deployment", "ckpt-rollout", "-n", SYSTEM_NS)
        # Installing again adopts them.
        installed = True
        helm(
            "upgrade", "--install", "ckpt-rollout", str(CHART), "-n", SYSTEM_NS,
            "--set", "workerRbac.enabled=true", "--set", f"workerRbac.namespaces={{{WORKER_NS}}}",
            "--wait", f"--timeout={WAIT:.0f}s",
        )  # fmt: skip
        helm("uninstall", "ckpt-rollout", "-n", SYSTEM_NS, "--wait", f"--timeout={WAIT:.0f}s")
        installed = False
        # README's clean-up once no worker runs.
        _delete_kept(kube, "ckpt-rollout")
        assert not _exists(kube, "serviceaccount", WORKER_SA, "-n", WORKER_NS)
        assert not _exists(kube, "clusterrolebinding", "ckpt-rollout-worker-tokenreview")
        assert not _exists(kube, "validatingadmissionpolicy", "ckpt-rollout-worker-pods-status")
    finally:
        kube.run("-n", WORKER_NS, "delete", "deployment", "rollout-worker", "--ignore-not-found")
        kube.run("-n", WORKER_NS, "delete", "ckr", "rollout-worker", "--ignore-not-found")
        if installed:
            helm(
                "uninstall", "ckpt-rollout", "-n", SYSTEM_NS, "--wait", f"--timeout={WAIT:.0f}s", check=False
            )
        _delete_kept(kube, "ckpt-rollout")
        _delete_namespace(kube, SYSTEM_NS)
