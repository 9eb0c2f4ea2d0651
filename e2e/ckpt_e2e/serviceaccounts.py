"""Who the operator and the agents are in the e2e tier: the chart's own ServiceAccounts and RBAC,
rendered with `helm template` and applied per test namespace, and kubeconfigs whose credential
is a TokenRequest token of those accounts. The processes under test get exactly what a user's
install grants them, so a permission the chart lacks fails the test that needs it; test code
keeps the admin kubeconfig.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from ckpt_api.constants import agent_audience
from ckpt_api.vocabulary import INSTANCE_LABEL

from .kubectl import Kubectl
from .podruntime import PodInfo
from .procs import wait_for
from .provision import ProvisionError, resolve
from .versions import KUBERNETES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ckpt-rollout"

OPERATOR_ACCOUNT = "ckpt-operator"
# The chart's workerRbac.serviceAccount.name default: what examples/worker-deployment.yaml runs as.
WORKER_ACCOUNT = "ckpt-rollout-worker"
# One day, longer than any test session, so nothing refreshes them: a real pod's projected token
# is rotated by its kubelet, but our processes read their kubeconfig once. mint_token refuses a
# shorter grant (an apiserver with --service-account-max-token-expiration) rather than let a
# test fail with 401 hours in.
TOKEN_SECONDS = 24 * 3600
_RBAC_TEMPLATES = (
    "templates/serviceaccount.yaml",
    "templates/rbac.yaml",
    "templates/worker-rbac.yaml",
    "templates/worker-admission.yaml",
)
# Cluster-scoped objects of a namespace's release, deleted with it.
_CLUSTER_KINDS = (
    "clusterrole,clusterrolebinding,"
    "validatingadmissionpolicy.admissionregistration.k8s.io,"
    "validatingadmissionpolicybinding.admissionregistration.k8s.io"
)
_BINDINGS = ("RoleBinding", "ClusterRoleBinding")


def helm_binary() -> Path:
    try:
        return resolve(["helm"])["helm"]
    except ProvisionError:
        found = shutil.which("helm")
        if found is None:
            raise
        return Path(found)


def release_name(namespace: str) -> str:
    """The release (and fullnameOverride) of a namespace's chart objects: unique per namespace,
    since some of them are cluster-scoped."""
    return f"e2e-{namespace}"[:53]


def render_chart(
    release: str,
    namespace: str,
    templates: Sequence[str],
    settings: Sequence[str],
    json_settings: Sequence[str] = (),
) -> str:
    """`helm template` of ``templates`` only, with ``settings`` as `--set` values and
    ``json_settings`` as `--set-json` ones."""
    argv = [str(helm_binary()), "template", release, str(CHART), "--namespace", namespace]
    argv += ["--kube-version", KUBERNETES, "--set", f"fullnameOverride={release}"]
    for template in templates:
        argv += ["--show-only", template]
    for setting in settings:
        argv += ["--set", setting]
    for setting in json_settings:
        argv += ["--set-json", setting]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def apply_worker_rbac(kubectl: Kubectl, agent_settings: Mapping[str, Any] | None = None) -> str:
    """The chart's worker RBAC (templates/worker-rbac.yaml: ServiceAccount ckpt-rollout-worker,
    its Role, and TokenReview) for ``kubectl``'s namespace, rendered from the chart itself and
    applied; returns the release name its objects are labelled with. With ``agent_settings``
    (the chart's agentSettings), also the agents' ConfigMap ckpt-rollout-agent."""
    assert kubectl.namespace is not None
    release = release_name(kubectl.namespace)
    settings = ["workerRbac.enabled=true", f"workerRbac.namespaces={{{kubectl.namespace}}}"]
    templates = ["templates/worker-rbac.yaml"]
    json_settings = []
    if agent_settings is not None:
        templates.append("templates/worker-agent-settings.yaml")
        json_settings.append(f"agentSettings={json.dumps(agent_settings)}")
    kubectl.apply(render_chart(release, kubectl.namespace, templates, settings, json_settings))
    return release


def delete_worker_rbac(kubectl: Kubectl, release: str) -> None:
    """Namespaced objects go with the namespace; the TokenReview binding and the worker
    admission policies are cluster-wide."""
    kubectl.run(
        "delete",
        _CLUSTER_KINDS,
        "-l",
        f"{INSTANCE_LABEL}={release}",
        "--ignore-not-found",
        check=False,
    )


def service_account_username(namespace: str, account: str) -> str:
    return f"system:serviceaccount:{namespace}:{account}"


def mint_token(
    api: client.ApiClient,
    namespace: str,
    account: str,
    audiences: Sequence[str] = (),
    seconds: int = TOKEN_SECONDS,
    pod: tuple[str, str] | None = None,
) -> str:
    """A TokenRequest token of ``account``; no audiences means the apiserver's own. ``pod``:
    (name, uid) of the pod it is bound to, as a kubelet's projected token is (the apiserver then
    names that pod in the caller's user info, which the worker admission policies check)."""
    bound = None
    if pod is not None:
        bound = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod[0], uid=pod[1])
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=list(audiences), expiration_seconds=seconds, bound_object_ref=bound
        )
    )
    status = client.CoreV1Api(api).create_namespaced_service_account_token(account, namespace, request).status
    granted = status.expiration_timestamp - datetime.now(UTC)
    if granted < timedelta(seconds=seconds) - timedelta(minutes=5):
        raise RuntimeError(
            f"the apiserver granted {namespace}/{account} a token for {granted}, not {seconds} s: "
            "raise its --service-account-max-token-expiration or refresh the token"
        )
    return str(status.token)


def token_kubeconfig(admin_kubeconfig: Path, token: str, user: str, path: Path) -> Path:
    """A kubeconfig for the admin kubeconfig's current cluster whose only credential is ``token``."""
    config = yaml.safe_load(admin_kubeconfig.read_text())
    context_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = dict(next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]))
    if ca := cluster.get("certificate-authority"):
        # Relative to the kubeconfig it came from, as kubectl reads it; this one lives elsewhere.
        cluster["certificate-authority"] = str(admin_kubeconfig.parent / ca)
    written = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "ckpt-e2e", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "ckpt-e2e", "user": user}}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(written, indent=1))
    path.chmod(0o600)
    return path


def access_checks(objects: Sequence[dict[str, Any]]) -> list[client.V1SubjectAccessReviewSpec]:
    """One SubjectAccessReview per (ServiceAccount, verb, resource, name) the rendered bindings
    grant, each scoped like its binding: what RBAC must allow once it has seen the objects."""
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    checks = []
    for binding in (o for o in objects if o["kind"] in _BINDINGS):
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        for subject in binding["subjects"]:
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{subject['namespace']}"]
            user = service_account_username(subject["namespace"], subject["name"])
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        kind, _, subresource = resource.partition("/")
                        for verb in rule["verbs"]:
                            for name in rule.get("resourceNames") or [None]:
                                attributes = client.V1ResourceAttributes(
                                    namespace=namespace, verb=verb, group=group, resource=kind,
                                    subresource=subresource or None, name=name,
                                )  # fmt: skip
                                checks.append(
                                    client.V1SubjectAccessReviewSpec(
                                        user=user, groups=groups, resource_attributes=attributes
                                    )
                                )
    return checks


def wait_granted(api: client.ApiClient, objects: Sequence[dict[str, Any]], timeout: float = 30.0) -> None:
    """Until RBAC, which reads bindings from an informer cache, allows everything ``objects``
    grant: a process started earlier could meet a 403 the chart does not cause."""
    authz = client.AuthorizationV1Api(api)
    pending = access_checks(objects)

    def allowed() -> bool:
        pending[:] = [
            spec
            for spec in pending
            if not authz.create_subject_access_review(client.V1SubjectAccessReview(spec=spec)).status.allowed
        ]
        return not pending

    wait_for(allowed, timeout, f"RBAC to allow what the chart grants ({len(pending)} checks)", interval=0.1)


@dataclass(frozen=True)
class ChartAccounts:
    """The chart's operator and worker ServiceAccounts in one namespace, and a kubeconfig of each:
    `worker_kubeconfig` holds a token bound to no pod (what the admission policies refuse for
    status writes); an agent runs with `worker_kubeconfig_for(its pod)`."""

    namespace: str
    release: str
    operator_kubeconfig: Path
    worker_kubeconfig: Path
    api: client.ApiClient = field(repr=False, compare=False)
    admin_kubeconfig: Path = field(repr=False)
    workdir: Path = field(repr=False)

    def peer_token(self) -> str:
        """A token of the workers' account for this namespace's agents, bound to no pod: what a
        peer presents, so it reads any agent's relay (RBAC get agents/relay) and nothing else.
        Tests read agents' relays with it."""
        return mint_token(self.api, self.namespace, WORKER_ACCOUNT, [agent_audience(self.namespace)])

    def worker_relay_token_for(self, pod: PodInfo) -> Path:
        """A token file of the worker account for its namespace's agents, bound to ``pod``: what
        its agent presents to the peers it pulls from (a projected token in a real pod)."""
        token = mint_token(
            self.api,
            pod.namespace,
            WORKER_ACCOUNT,
            [agent_audience(pod.namespace)],
            pod=(pod.name, pod.uid),
        )
        path = self.workdir / f"relay-token-{pod.name}-{pod.uid[:8]}"
        path.write_text(token)
        path.chmod(0o600)
        return path

    def worker_kubeconfig_for(self, pod: PodInfo) -> Path:
        """A kubeconfig whose token is bound to ``pod``, as its kubelet would project it."""
        token = mint_token(self.api, pod.namespace, WORKER_ACCOUNT, pod=(pod.name, pod.uid))
        path = self.workdir / f"{WORKER_ACCOUNT}-{pod.name}-{pod.uid[:8]}.kubeconfig"
        user = service_account_username(pod.namespace, WORKER_ACCOUNT)
        return token_kubeconfig(self.admin_kubeconfig, token, user, path)

    @property
    def operator_username(self) -> str:
        return service_account_username(self.namespace, OPERATOR_ACCOUNT)

    @property
    def worker_username(self) -> str:
        return service_account_username(self.namespace, WORKER_ACCOUNT)


def chart_settings(namespace: str, also: Sequence[str] = ()) -> list[str]:
    """The chart's values for an operator run as the harness runs it (`--namespace NS`, and
    `--lease-namespace NS` under leader election) with its workers in the same namespace, and
    in the namespaces ``also`` names (which it then watches too)."""
    watched = ",".join([namespace, *also])
    return [
        f"serviceAccount.name={OPERATOR_ACCOUNT}",
        f"watchNamespaces={{{watched}}}",
        "leaderElection.enabled=true",
        f"leaderElection.leaseNamespace={namespace}",
        "workerRbac.enabled=true",
        f"workerRbac.namespaces={{{watched}}}",
        f"workerRbac.serviceAccount.name={WORKER_ACCOUNT}",
    ]


@contextmanager
def chart_accounts(
    api: client.ApiClient,
    kubectl: Kubectl,
    admin_kubeconfig: Path,
    workdir: Path,
    also: Sequence[str] = (),
) -> Iterator[ChartAccounts]:
    """The chart's ServiceAccounts and RBAC applied in ``kubectl``'s namespace (its cluster-wide
    objects deleted after the block), with a kubeconfig for each account; ``also``: more worker
    namespaces the operator watches (each gets the worker account and RBAC)."""
    namespace = kubectl.namespace
    assert namespace is not None
    release = release_name(namespace)
    rendered = render_chart(release, namespace, _RBAC_TEMPLATES, chart_settings(namespace, also))
    # Objects in several namespaces (each naming its own) go in without a default namespace.
    applier = Kubectl(kubectl.binary, kubectl.kubeconfig) if also else kubectl
    applier.apply(rendered)
    try:
        wait_granted(api, [doc for doc in yaml.safe_load_all(rendered) if doc])

        def kubeconfig(account: str) -> Path:
            token = mint_token(api, namespace, account)
            user = service_account_username(namespace, account)
            return token_kubeconfig(admin_kubeconfig, token, user, workdir / f"{account}.kubeconfig")

        yield ChartAccounts(
            namespace,
            release,
            kubeconfig(OPERATOR_ACCOUNT),
            kubeconfig(WORKER_ACCOUNT),
            api,
            admin_kubeconfig,
            workdir,
        )
    finally:
        delete_worker_rbac(kubectl, release)
