"""The chart's agent TLS (agentTLS): serving Secrets per worker namespace for the name callers
verify, the CA mounted into the operator, from a CA the chart generates or from cert-manager;
plain http only when switched off. The same Secrets without the chart (`ckpt-rollout
tls-secrets`, for the `kubectl apply` path), and what `helm uninstall` leaves for running workers."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest
import yaml
from chart_render import ROOT, Helm, Obj, Rendered

from ckpt_api.tls import agent_server_name, ca_context, server_context
from ckpt_cli.entry import main
from ckpt_e2e.pki import handshake_in_memory
from ckpt_rollout.chartgen.chart_values import ChartValues

WORKERS = "workerRbac.namespaces={team-a,team-b}"
CA_FILE = "/var/run/secrets/ckpt-rollout/agent-ca/ca.crt"


def _operator(rendered: Rendered) -> tuple[Obj, Obj]:
    pod: Obj = rendered.one("Deployment")["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def _data(secret: Obj, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def test_generated_certificates_verify_for_their_namespace_only(helm: Helm, tmp_path: Path) -> None:
    rendered = helm.template(None, WORKERS)
    ca = rendered.one("Secret", "rel-ckpt-rollout-agent-ca", "ops")
    assert ca["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (tmp_path / "ca.crt").write_bytes(_data(ca, "ca.crt"))
    operator_trust = ca_context(tmp_path / "ca.crt").current()
    for ns in ("team-a", "team-b"):
        serving = rendered.one("Secret", "ckpt-rollout-agent-tls", ns)
        assert serving["type"] == "kubernetes.io/tls"
        assert _data(serving, "ca.crt") == _data(ca, "ca.crt"), "peers verify with the operator's CA"
        (tmp_path / f"{ns}.crt").write_bytes(_data(serving, "tls.crt"))
        (tmp_path / f"{ns}.key").write_bytes(_data(serving, "tls.key"))
        agent = server_context(tmp_path / f"{ns}.crt", tmp_path / f"{ns}.key").current()
        handshake_in_memory(agent, operator_trust, agent_server_name(ns))
        other = "team-b" if ns == "team-a" else "team-a"
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            handshake_in_memory(agent, operator_trust, agent_server_name(other))


def test_the_operator_mounts_only_the_ca_and_verifies_agents(helm: Helm) -> None:
    pod, container = _operator(helm.template())
    assert f"--agent-ca-file={CA_FILE}" in container["args"]
    assert "--agent-plain-http" not in container["args"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "agent-ca"]
    # Not the CA's key, which the generated Secret also holds.
    assert volume["secret"] == {
        "secretName": "rel-ckpt-rollout-agent-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "agent-ca"]
    assert (mount["mountPath"], mount["readOnly"]) == (str(Path(CA_FILE).parent), True)


def test_tls_off_calls_agents_over_plain_http_and_issues_nothing(helm: Helm) -> None:
    rendered = helm.template(None, WORKERS, "agentTLS.enabled=false")
    pod, container = _operator(rendered)
    assert "--agent-plain-http" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--agent-ca-file")]
    assert "agent-ca" not in {v["name"] for v in pod["volumes"]}
    assert rendered.of_kind("Secret") == []
    assert rendered.of_kind("Certificate") == []


def test_cert_manager_issues_one_certificate_per_worker_namespace(helm: Helm) -> None:
    rendered = helm.template(
        None,
        WORKERS,
        "agentTLS.certManager.enabled=true",
        "agentTLS.certManager.issuerRef.name=agents-ca",
    )
    assert rendered.of_kind("Secret") == [], "cert-manager writes the Secrets"
    for ns in ("team-a", "team-b"):
        cert = rendered.one("Certificate", "rel-ckpt-rollout-agent", ns)["spec"]
        assert cert["secretName"] == "ckpt-rollout-agent-tls"
        assert cert["dnsNames"] == [agent_server_name(ns)]
        assert cert["issuerRef"] == {"name": "agents-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        assert "server auth" in cert["usages"]
    # The operator's CA comes from a Certificate of the same issuer in the release namespace.
    carrier = rendered.one("Certificate", "rel-ckpt-rollout-agent-ca", "ops")["spec"]
    assert carrier["secretName"] == "rel-ckpt-rollout-agent-ca"
    assert f"--agent-ca-file={CA_FILE}" in _operator(rendered)[1]["args"]


def test_cert_manager_needs_an_issuer(helm: Helm) -> None:
    error = helm.template_error(None, "agentTLS.certManager.enabled=true")
    assert "agentTLS.certManager.issuerRef.name" in error


def test_without_generation_you_bring_the_secrets(helm: Helm) -> None:
    rendered = helm.template(None, WORKERS, "agentTLS.generate=false")
    assert rendered.of_kind("Secret") == []
    assert rendered.of_kind("Certificate") == []
    assert f"--agent-ca-file={CA_FILE}" in _operator(rendered)[1]["args"]


def test_worker_namespaces_default_to_the_release_namespace(helm: Helm) -> None:
    rendered = helm.template()
    assert rendered.one("Secret", "ckpt-rollout-agent-tls", "ops")


def test_the_worker_example_serves_the_charts_secret_and_verifies_peers() -> None:
    docs = yaml.safe_load_all((ROOT / "examples" / "worker-deployment.yaml").read_text())
    pod = next(d for d in docs if d and d["kind"] == "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "agent-tls"]
    assert volume["secret"]["secretName"] == ChartValues().agent_tls.secret_name
    container = pod["containers"][0]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "agent-tls"]
    # The fleet's settings file the example workers run with (the chart's agentSettings).
    settings = yaml.safe_load((ROOT / "examples" / "agent-settings.yaml").read_text())["agentSettings"]
    for setting, key in (
        ("tls_cert_file", "tls.crt"),
        ("tls_key_file", "tls.key"),
        ("peer_ca_file", "ca.crt"),
    ):
        assert settings[setting] == f"{mount['mountPath']}/{key}"
    # The kubelet's probes speak TLS to the API port (they do not verify).
    assert {container[p]["httpGet"]["scheme"] for p in ("livenessProbe", "readinessProbe")} == {"HTTPS"}


# --------------------------------------------------------------------------- without the chart


STATIC_MANIFEST = ROOT / "examples" / "kubectl" / "operator.yaml"


def _tls_secrets(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[Obj], str]:
    """`ckpt-rollout tls-secrets ARGS`: exit code, the Secrets printed, stderr."""
    code = main(["tls-secrets", *args])
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d], err


def _one(secrets: list[Obj], name: str, namespace: str) -> Obj:
    (found,) = [
        s for s in secrets if (s["metadata"]["name"], s["metadata"]["namespace"]) == (name, namespace)
    ]
    return found


def _agent(secret: Obj, where: Path) -> ssl.SSLContext:
    (where / "tls.crt").write_bytes(_data(secret, "tls.crt"))
    (where / "tls.key").write_bytes(_data(secret, "tls.key"))
    return server_context(where / "tls.crt", where / "tls.key").current()


def _trusting(secret: Obj, where: Path) -> ssl.SSLContext:
    (where / "ca.crt").write_bytes(_data(secret, "ca.crt"))
    return ca_context(where / "ca.crt").current()


def test_tls_secrets_prints_what_the_static_manifest_mounts_and_the_agents_serve(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The `kubectl apply` path's agent TLS without cert-manager: the CA Secret the operator of
    examples/kubectl/operator.yaml mounts, and serving Secrets agents in each namespace verify
    with, for that namespace's name only."""
    code, secrets, _ = _tls_secrets(capsys, "--namespace", "rl", "--namespace", "team-b")
    assert code == 0
    docs = [d for d in yaml.safe_load_all(STATIC_MANIFEST.read_text()) if d]
    operator = next(d for d in docs if d["kind"] == "Deployment")
    (volume,) = [v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "agent-ca"]
    ca = _one(secrets, volume["secret"]["secretName"], operator["metadata"]["namespace"])
    trust = _trusting(ca, tmp_path)
    for ns in ("rl", "team-b"):
        serving = _one(secrets, ChartValues().agent_tls.secret_name, ns)
        assert serving["type"] == "kubernetes.io/tls"
        assert _data(serving, "ca.crt") == _data(ca, "ca.crt"), "peers verify with the operator's CA"
        (tmp_path / ns).mkdir()
        agent = _agent(serving, tmp_path / ns)
        handshake_in_memory(agent, trust, agent_server_name(ns))
        other = "team-b" if ns == "rl" else "rl"
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            handshake_in_memory(agent, trust, agent_server_name(other))


def test_tls_secrets_signs_a_later_namespace_with_the_ca_it_printed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, first, _ = _tls_secrets(capsys, "-n", "rl")
    ca = _one(first, "ckpt-rollout-agent-ca", "ckpt-rollout-system")
    saved = tmp_path / "ca-secret.yaml"  # what `kubectl get secret ... -o yaml` gives back
    saved.write_text(yaml.safe_dump(ca))
    code, later, _ = _tls_secrets(capsys, "-n", "team-b", "--ca-from", str(saved), "--cert-days", "30")
    assert code == 0
    assert _one(later, "ckpt-rollout-agent-ca", "ckpt-rollout-system")["data"] == ca["data"], "the same CA"
    agent = _agent(_one(later, "ckpt-rollout-agent-tls", "team-b"), tmp_path)
    handshake_in_memory(agent, _trusting(ca, tmp_path), agent_server_name("team-b"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: ConfigMap\ndata: {a: b}\n", "not a Secret with data tls.crt and tls.key"),
        ("data: {tls.crt: bm8=, tls.key: bm8=}\n", "do not hold a PEM certificate and key"),
        ("{", "not YAML or JSON"),
    ],
    ids=["no-ca-keys", "not-pem", "not-yaml"],
)
def test_tls_secrets_refuses_a_ca_it_cannot_sign_with(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    code, printed, err = _tls_secrets(capsys, "-n", "rl", "--ca-from", str(bad))
    assert (code, printed) == (2, [])
    assert err.startswith(f"ckpt-rollout tls-secrets: --ca-from {bad}: "), err
    assert message in err, err


def test_tls_secrets_refuses_a_serving_certificate_as_its_ca(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, first, _ = _tls_secrets(capsys, "-n", "rl")
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text(yaml.safe_dump(_one(first, "ckpt-rollout-agent-tls", "rl")))
    code, _, err = _tls_secrets(capsys, "-n", "rl", "--ca-from", str(leaf))
    assert code == 2
    assert "is not a CA certificate" in err, err


# --------------------------------------------------------------------------- helm uninstall

KEPT_KINDS = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def _kept(obj: Obj) -> bool:
    return (obj["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"


def _worker_objects(rendered: Rendered) -> list[Obj]:
    return [
        o
        for o in rendered.objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "worker-agent"
        and o["kind"] != "NetworkPolicy"
    ]


def test_uninstall_keeps_what_running_workers_use(helm: Helm) -> None:
    """`helm uninstall` must not pull the worker ServiceAccount, its RBAC, the agents' TLS
    Secret or their settings ConfigMap from under running pods."""
    rendered = helm.template(None, "workerRbac.enabled=true", WORKERS)
    workers = _worker_objects(rendered)
    assert {o["kind"] for o in workers} == {*KEPT_KINDS, "Secret", "ConfigMap"}
    assert [(o["kind"], o["metadata"]["name"]) for o in workers if not _kept(o)] == []
    assert not _kept(rendered.one("Deployment")), "the operator itself goes"
    certificates = helm.template(
        None,
        "workerRbac.enabled=true",
        WORKERS,
        "agentTLS.certManager.enabled=true",
        "agentTLS.certManager.issuerRef.name=agents-ca",
    )
    for ns in ("team-a", "team-b"):
        assert _kept(certificates.one("Certificate", "rel-ckpt-rollout-agent", ns))


def test_uninstall_removes_them_when_told_to(helm: Helm) -> None:
    rendered = helm.template(
        None,
        "workerRbac.enabled=true",
        WORKERS,
        "workerRbac.keepOnUninstall=false",
        "agentTLS.keepOnUninstall=false",
    )
    assert [o["kind"] for o in _worker_objects(rendered) if _kept(o)] == []
