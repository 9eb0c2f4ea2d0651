"""Test-harness pieces for rollouts on a real control plane: checkpoint source, worker fleet
(kwok pods running real agents), the operator as a killable process, and readers for what
each worker actually serves. Shared by the operator integration tests, the scenario suite and
the demo."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from ckpt_api.constants import GROUP, PLURAL, VERSION, agent_audience
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION, UpdateResult

from .catalog import corrupt_tensor as corrupt_tensor  # re-exported: tests damage versions
from .catalog import publish_version
from .launchers import Launcher, ProcessLauncher, kubeconfig_files
from .pki import AgentPKI, CertPair
from .podruntime import Launch, PodInfo, PodRuntime
from .procs import PortReservation, spawn, spawn_server, stop, wait_for
from .serviceaccounts import mint_token

CLI = [sys.executable, "-m", "ckpt_cli"]
AGENT_PORT = 8089
WORKER_LABEL = "rollout-worker"


@functools.cache
def session_agent_pki() -> AgentPKI:
    """The agents' CA of this test session: every harness agent serves a certificate from it
    (TLS unless a test asks for --plain-http) and every harness operator trusts it."""
    return AgentPKI(Path(tempfile.mkdtemp(prefix="ckpt-agent-pki-")))


def urlopen(req: urllib.request.Request, timeout: float) -> Any:
    # https: an agent of the session, verified against its CA for the pod IP it was dialled at.
    context = session_agent_pki().client_context() if req.type == "https" else None
    return urllib.request.urlopen(req, timeout=timeout, context=context)


def http_json(url: str, *, token: str | None = None, body: Any = None, timeout: float = 5.0) -> Any:
    """One HTTP(S) call to an agent or source on loopback; returns the decoded JSON body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urlopen(req, timeout) as resp:
        return json.loads(resp.read() or b"null")


def http_call(url: str, token: str, body: object = None, timeout: float = 15.0) -> tuple[int, bytes]:
    """One call that may be refused: (HTTP status, body), a 4xx or 5xx included; POST with a
    body, else GET."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urlopen(request, timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_text(url: str, *, token: str | None = None, timeout: float = 5.0) -> str:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urlopen(req, timeout) as resp:
        return str(resp.read().decode())


def metric_value(metrics_text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        pairs = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part)
        found = {k: v.strip('"') for k, v in pairs.items()}
        if all(found.get(k) == v for k, v in (labels or {}).items()):
            total += float(value)
    return total


# -- checkpoint source ----------------------------------------------------------------------


@dataclass
class CheckpointSource:
    root: Path
    url: str
    proc: subprocess.Popen[bytes] | None = None
    digests: dict[str, str] = field(default_factory=dict)

    def version_dir(self, version: str) -> Path:
        return self.root / version


def publish_reference_version(
    root: Path, version: str, seed: int, work: Path, *, hidden: int = 64, layers: int = 2
) -> str:
    """Publish a synthetic reference-model checkpoint; returns its manifest digest."""
    return publish_version(root, version, seed, work, hidden=hidden, layers=layers)


@contextmanager
def serve_checkpoints(root: Path, log_dir: Path, host: str = "127.0.0.1") -> Iterator[CheckpointSource]:
    """`ckpt-rollout serve ROOT` on ``host`` (loopback; the real node's pods reach the host end
    of its veth instead)."""
    proc, url = spawn_server(
        [*CLI, "serve", str(root), "--host", host, "--port", "0"],
        log_dir / f"source-{host}.log" if host != "127.0.0.1" else log_dir / "source.log",
        "checkpoint source",
    )
    source = CheckpointSource(root=root, url=url, proc=proc)
    try:
        wait_for(lambda: http_ok(f"{source.url}/healthz"), 30, "checkpoint source /healthz")
        yield source
    finally:
        stop(proc)


def http_ok(url: str) -> bool:
    """Whether `url` answers a GET with a success (a server up and ready)."""
    try:
        http_text(url, timeout=1)
        return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


# -- credentials ----------------------------------------------------------------------------


def operator_token(api: client.ApiClient, namespace: str, account: str = "ckpt-operator") -> str:
    """A new ServiceAccount and its token for ``namespace``'s agents, as the operator mints one
    (the demo's; the test fixtures' account comes from the chart, serviceaccounts.py)."""
    client.CoreV1Api(api).create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
    )
    return mint_token(api, namespace, account, [agent_audience(namespace)])


# -- worker fleet ---------------------------------------------------------------------------


def worker_pod_spec(service_account: str | None = None) -> dict[str, Any]:
    """A test worker's pod spec (its agent is run by the pod runtime), Ready only while its agent
    says its weights are; ``service_account``: what it runs as (a token bound to a pod is that
    pod's account's)."""
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "worker", "image": "ckpt-rollout-worker:dev"}],
        "readinessGates": [{"conditionType": WEIGHTS_READY_CONDITION}],
    }
    if service_account is not None:
        pod_spec["serviceAccountName"] = service_account
    return pod_spec


def worker_deployment(
    name: str, replicas: int, labels: dict[str, str], service_account: str | None = None
) -> dict[str, Any]:
    pod_spec = worker_pod_spec(service_account)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


# examples/worker-deployment.yaml's projected relay token, and the peers' username there.
EXAMPLE_RELAY = (
    "/var/run/secrets/ckpt-rollout/relay/token",
    "system:serviceaccount:$(POD_NAMESPACE):ckpt-rollout-worker",
)


# Where a worker pod mounts its namespace's settings (ConfigMap ckpt-rollout-agent, the chart's
# agentSettings), and the agent's --config there.
AGENT_SETTINGS_DIR = "/etc/ckpt-rollout"
AGENT_SETTINGS_FILE = f"{AGENT_SETTINGS_DIR}/agent.yaml"


def agent_settings(
    source_url: str,
    allowed_username: str | None,
    relay: tuple[str, str | None] | None = None,
    tls: tuple[CertPair, Path] | None = None,
    *,
    audience: str,
) -> dict[str, Any]:
    """The settings (ckpt_agent.settings keys) every test worker of a namespace shares: paddle
    reference engine on AGENT_PORT, accepts tokens for ``audience`` (its namespace's,
    ckpt_api.constants.agent_audience) and authorizes them by SubjectAccessReview, or, given
    ``allowed_username`` (the fallback), only that user's. ``relay``: (its own token file, the
    peers' username with the allow-list): what it presents to peers and whom it lets read its
    relay. ``tls``: (its serving certificate, the CA peers must chain to); None: plain http."""
    settings: dict[str, Any] = {
        "port": AGENT_PORT,
        "engine": "paddle",
        "source": source_url,
        "tokenreview_audience": audience,
    }
    if allowed_username is not None:
        settings["allowed_usernames"] = [allowed_username]
    if relay is not None:
        settings["relay_token_file"] = relay[0]
        if relay[1] is not None and allowed_username is not None:
            settings["relay_allowed_usernames"] = [relay[1]]
    if tls is None:
        settings["plain_http"] = True
    else:
        settings |= {
            "tls_cert_file": str(tls[0].cert),
            "tls_key_file": str(tls[0].key),
            "peer_ca_file": str(tls[1]),
        }
    return settings


def settings_as_flags(settings: Mapping[str, Any]) -> list[str]:
    """The same settings as `ckpt-rollout agent` flags (switches given when true)."""
    from ckpt_agent.settings import flag_name

    flags: list[str] = []
    for key, value in settings.items():
        if value is True:
            flags.append(flag_name(key))
        elif isinstance(value, list):
            flags += [flag_name(key), ",".join(value)]
        elif value is not False:
            flags += [flag_name(key), str(value)]
    return flags


def agent_flags(
    host: str,
    source_url: str,
    initial_version: str,
    allowed_username: str | None,
    extra_args: list[str] | None = None,
    relay: tuple[str, str | None] | None = None,
    tls: tuple[CertPair, Path] | None = None,
    *,
    audience: str,
) -> list[str]:
    """`ckpt-rollout agent` flags of a test worker run without a settings file (the local
    provider's agent processes): `agent_settings` as flags, then what is its own: the bind
    address, the version it boots on, and ``extra_args``."""
    settings = agent_settings(source_url, allowed_username, relay, tls, audience=audience)
    return [*settings_as_flags(settings), *pod_flags(host, initial_version, extra_args)]


def pod_flags(host: str, initial_version: str, extra_args: list[str] | None = None) -> list[str]:
    """What stays on a worker's command line beside --config: the bind address, the version its
    fleet boots on and the scenario's ``extra_args`` (flags: they override the file)."""
    return ["--host", host, "--initial-version", initial_version, *(extra_args or [])]


AGENT_PROCESS = ProcessLauncher([*CLI, "agent"])


@dataclass
class AgentOptions:
    source_url: str
    initial_version: str
    # One for every pod, or each pod's own (a token bound to it, as its kubelet projects one).
    kubeconfig: Path | Callable[[PodInfo], Path]
    # None: callers are authorized by SubjectAccessReview (what the chart's RBAC grants); a
    # username: the allow-list fallback, that user only.
    allowed_username: str | None = None
    extra_args: list[str] = field(default_factory=list)
    # Runs each pod's agent: a process of the checkout by default, or e.g. the worker image
    # (ContainerLauncher, whose entrypoint is the agent); chosen per pod.
    launcher: Callable[[PodInfo], Launcher] = lambda _pod: AGENT_PROCESS
    # Each pod's own token for reading peers' relays, and, with the allow-list, the peers'
    # username (the workers').
    relay_token: Callable[[PodInfo], Path] | None = None
    relay_username: str | None = None
    # The CA each pod's serving certificate comes from (None: the agents run --plain-http).
    tls: AgentPKI | None = field(default_factory=session_agent_pki)
    # Flags of each pod's own, after extra_args (e.g. a replica leader's engine and a follower's).
    pod_args: Callable[[PodInfo], list[str]] = lambda _pod: []

    def launch(self, pod: PodInfo) -> Launch:
        # What the pod spec's downward API and service account give a real worker container.
        kubeconfig = self.kubeconfig if isinstance(self.kubeconfig, Path) else self.kubeconfig(pod)
        env = {
            "KUBECONFIG": str(kubeconfig),
            "POD_NAME": pod.name,
            "POD_NAMESPACE": pod.namespace,
            "POD_IP": pod.ip,
            "POD_UID": pod.uid,
            "NODE_NAME": pod.node,
        }
        files = kubeconfig_files(kubeconfig)
        relay = None
        if self.relay_token is not None:
            token = self.relay_token(pod)
            relay = (str(token), self.relay_username)
            files.append(token)
        name = f"agent-{pod.name}-{pod.uid[:8]}"
        tls = None
        if self.tls is not None:
            tls = (self.tls.for_pod(pod.namespace, pod.ip, name), self.tls.ca_cert)
            files += [tls[0].cert, tls[0].key, tls[1]]
        flags = agent_flags(
            pod.ip,
            self.source_url,
            self.initial_version,
            self.allowed_username,
            [*self.extra_args, *self.pod_args(pod)],
            relay,
            tls,
            audience=agent_audience(pod.namespace),
        )
        return self.launcher(pod).launch(flags, name, env, files)


@dataclass
class Worker:
    name: str
    ip: str
    port: int = AGENT_PORT  # another port when the agent is reached through a port-forward
    scheme: str = "https"  # http: an agent run with --plain-http

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.ip}:{self.port}{path}"


def ready_workers(
    runtime: PodRuntime, count: int, token: str, timeout: float = 90.0, scheme: str = "https"
) -> list[Worker]:
    """Wait until ``count`` agents answer /v1/status; returns them sorted by pod name."""

    def answering() -> list[Worker] | None:
        workers = [Worker(p.pod.name, p.pod.ip, scheme=scheme) for p in runtime.running().values()]
        if len(workers) != count:
            return None
        for w in workers:
            try:
                http_json(w.url("/v1/status"), token=token, timeout=1)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return None
        return sorted(workers, key=lambda w: w.name)

    return wait_for(answering, timeout, f"{count} agents answering /v1/status", interval=0.3)


def served_output(worker: Worker, token: str) -> list[float]:
    body = http_json(worker.url("/v1/infer"), token=token, body={})
    return list(body["output"])


@functools.cache
def _expected_output(version_dir: Path) -> tuple[float, ...]:
    from ckpt_agent.formats.synth import expected_infer_output

    return tuple(expected_infer_output(version_dir))


def serving_versions(
    workers: list[Worker], token: str, version_dirs: Mapping[str, Path]
) -> dict[str, str | None]:
    """Which of ``version_dirs`` each worker's /v1/infer output matches (None: none of them)."""
    import numpy as np

    found: dict[str, str | None] = {}
    for w in workers:
        out = served_output(w, token)
        found[w.name] = next(
            (v for v, d in version_dirs.items() if np.allclose(out, _expected_output(d), atol=1e-5)), None
        )
    return found


def agent_state(worker: Worker, token: str) -> str | None:
    """The agent's load state from /v1/status ("loading", "idle", ...), None if unreachable."""
    try:
        return str(http_json(worker.url("/v1/status"), token=token, timeout=2)["state"])
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def update_calls(worker: Worker, token: str, result: str | None = None) -> float:
    """update_weights requests the agent received: every answer (accepted, noop, conflict,
    rejected) unless ``result`` picks one. "Called once" claims count them all: a second call
    answered 200 (already live) or 409 (busy) is still a second call."""
    return metric_value(
        http_text(worker.url("/metrics"), token=token),
        "ckpt_agent_update_requests_total",
        {"result": result} if result is not None else None,
    )


def load_calls(worker: Worker, token: str) -> float:
    """update_weights requests that reached a free agent: every answer but 409. A 409 (a load
    already runs: the superseded version's, or the pod's initial load) is the agent telling the
    operator to call again once it is free, by design; a second call answered 200 (already live),
    202 or 4xx is a double call."""
    metrics_text = http_text(worker.url("/metrics"), token=token)
    name = "ckpt_agent_update_requests_total"
    return metric_value(metrics_text, name) - metric_value(
        metrics_text, name, {"result": UpdateResult.CONFLICT}
    )


# -- the operator ---------------------------------------------------------------------------


OPERATOR_PROCESS = ProcessLauncher([*CLI, "operator"])


@dataclass(frozen=True)
class MintedAgentTokens:
    """The operator mints its agents' tokens, one audience per agent (pod), for this
    ServiceAccount of its own (--agent-token-serviceaccount; the chart's default). A token file
    instead is the legacy mode: that one token for every namespace."""

    namespace: str
    name: str


AgentCredential = Path | MintedAgentTokens


def agent_credential_args(credential: AgentCredential) -> tuple[list[str], list[Path]]:
    """The operator's flags for ``credential``, and the files they name."""
    if isinstance(credential, MintedAgentTokens):
        return ["--agent-token-serviceaccount", f"{credential.namespace}/{credential.name}"], []
    return ["--agent-token-file", str(credential)], [credential]


class OperatorProcess:
    """`ckpt-rollout operator` that tests can SIGKILL and restart: a child process of the
    checkout by default, or the operator image (``launcher=ContainerLauncher(...)``)."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        agent_credential: AgentCredential,
        log_dir: Path,
        extra_args: list[str] | None = None,
        name: str = "operator",
        launcher: Launcher = OPERATOR_PROCESS,
        agent_ca: Path | None = None,
        agent_tls: bool = True,
    ) -> None:
        """``agent_ca``: what agents' certificates must chain to (default: the session's CA);
        ``agent_tls`` False: agents are called over plain http (--agent-plain-http)."""
        self.agent_ca = (agent_ca or session_agent_pki().ca_cert) if agent_tls else None
        self.extra_args = extra_args or []
        self.name = name
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.agent_credential = agent_credential
        self.log_dir = log_dir
        self.launcher = launcher
        self.proc: subprocess.Popen[bytes] | None = None
        self._launch: Launch | None = None
        self._liveness_port: PortReservation | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self) -> OperatorProcess:
        # kopf binds the liveness port itself (port 0 would not be reported): held until stopped.
        self._liveness_port = PortReservation(1)
        (liveness_port,) = self._liveness_port.ports
        self.liveness_url = f"http://127.0.0.1:{liveness_port}/healthz"
        credential_args, credential_files = agent_credential_args(self.agent_credential)
        args = [
            "--namespace",
            self.namespace,
            "--liveness-host",
            "127.0.0.1",
            "--liveness-port",
            str(liveness_port),
            "--metrics-port",
            "0",
            *credential_args,
            # Short, so a hung agent shows up quickly in tests.
            "--agent-timeout",
            "3",
            *(["--agent-plain-http"] if self.agent_ca is None else ["--agent-ca-file", str(self.agent_ca)]),
            *self.extra_args,
        ]
        files = [*credential_files, *kubeconfig_files(self.kubeconfig)]
        if self.agent_ca is not None:
            files.append(self.agent_ca)
        launch = self.launcher.launch(args, self.name, {"KUBECONFIG": str(self.kubeconfig)}, files)
        self._launch = launch
        self.proc = spawn(launch.argv, self.log_path, env=launch.env)
        self.starts += 1
        proc = self.proc

        def up() -> bool:
            return http_ok(self.liveness_url) or proc.poll() is not None

        try:
            wait_for(up, 60, "operator liveness endpoint")
            if proc.poll() is not None:
                raise RuntimeError(f"operator exited with {proc.returncode} at startup")
        except (RuntimeError, AssertionError) as exc:
            self.stop()  # the caller gets no handle to stop it with
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{exc}; {self.log_path}:\n{tail}") from exc
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no final status write — what a node failure looks like."""
        assert self.proc is not None
        assert self._launch is not None
        if self._launch.kill is not None:
            self._launch.kill()
        else:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._cleanup()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._launch is not None and self._launch.cleanup is not None:
            self._launch.cleanup()
        if self._liveness_port is not None:
            self._liveness_port.release()


# -- the CR ---------------------------------------------------------------------------------


@contextmanager
def operator_with_metrics(
    kubeconfig: Path, namespace: str, credential: AgentCredential, workdir: Path, args: Sequence[str] = ()
) -> Iterator[tuple[OperatorProcess, int]]:
    """An operator serving /metrics on a port held for it (prometheus_client binds it and would
    not report a port 0 it chose); yields it and the port, stops it after the block."""
    with PortReservation(1) as held:
        (port,) = held.ports
        op = OperatorProcess(kubeconfig, namespace, credential, workdir, ["--metrics-port", str(port), *args])
        op.start()
        try:
            yield op, port
        finally:
            op.stop()


def rollout_spec(source_uri: str, version: str, labels: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    """A CheckpointRollout spec for the pods with ``labels``; ``extra`` adds spec fields."""
    return {
        "version": version,
        "source": {"uri": source_uri},
        "selector": {"matchLabels": dict(labels)},
        **extra,
    }


def conditions(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """status.conditions by type."""
    return {c["type"]: c for c in status.get("conditions") or []}


class Rollouts:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = client.CustomObjectsApi(api)
        self.namespace = namespace

    def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "CheckpointRollout",
            "metadata": {"name": name},
            "spec": spec,
        }
        obj: dict[str, Any] = self.api.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return obj

    def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.api.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return obj

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self.api.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec}
        )
        return obj

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def wait_phase(
        self, name: str, phases: set[str], timeout: float = 120.0, version: str | None = None
    ) -> dict[str, Any]:
        """Wait until the rollout (of ``version``, if given) is in one of ``phases``."""

        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            if version is not None and status.get("targetVersion") != version:
                return None
            return status if status.get("phase") in phases else None

        return wait_for(reached, timeout, f"{name} phase in {sorted(phases)}", interval=0.2)

    def events(self, name: str) -> list[dict[str, Any]]:
        core = client.CoreV1Api(self.api.api_client)
        items = core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}").items
        return [{"reason": e.reason, "type": e.type, "message": e.message} for e in items]
