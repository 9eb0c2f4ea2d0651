"""The chart's agent TLS (agentTLS): serving Secrets per worker namespace for the name callers
verify, the CA mounted into the operator, from a CA the chart generates or from cert-manager;
plain http only when switched off."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest
import yaml
from chart_render import ROOT, Helm, Obj, Rendered

from ckpt_api.tls import agent_server_name, ca_context, server_context
from ckpt_rollout.chartgen.chart_values import ChartValues

WORKERS = "workerRbac.namespaces={team-a,team-b}"
CA_FILE = "/var/run/secrets/ckpt-rollout/agent-ca/ca.crt"


def _operator(rendered: Rendered) -> tuple[Obj, Obj]:
    pod: Obj = rendered.one("Deployment")["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def _data(secret: Obj, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory: what the operator does against an agent with these files."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    sides = (
        (client.wrap_bio(c_in, c_out, server_hostname=name), c_out, s_in),
        (server.wrap_bio(s_in, s_out, server_side=True), s_out, c_in),
    )
    for _ in range(10):
        done = 0
        for tls, sent, peer in sides:
            try:
                tls.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            peer.write(sent.read())
        if done == 2:
            return
    raise AssertionError("handshake did not finish")


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
        _handshake(agent, operator_trust, agent_server_name(ns))
        other = "team-b" if ns == "team-a" else "team-a"
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            _handshake(agent, operator_trust, agent_server_name(other))


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
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    for flag, key in (("tls-cert-file", "tls.crt"), ("tls-key-file", "tls.key"), ("peer-ca-file", "ca.crt")):
        assert flags[flag] == f"{mount['mountPath']}/{key}"
    # The kubelet's probes speak TLS to the API port (they do not verify).
    assert {container[p]["httpGet"]["scheme"] for p in ("livenessProbe", "readinessProbe")} == {"HTTPS"}
