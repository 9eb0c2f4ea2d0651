"""The agents' TLS Secrets without cert-manager (`ckpt-rollout tls-secrets`, tools/tls_command),
for the `kubectl apply` install path (the chart generates the same ones itself).

Prints, for `kubectl apply -f -`, the CA Secret the operator mounts (`ckpt-rollout-agent-ca` in
the operator's namespace: ca.crt, and the CA's own tls.crt/tls.key to sign more later) and one
serving Secret per worker namespace (`ckpt-rollout-agent-tls`: tls.crt, tls.key, ca.crt) for the
name callers verify, ``ckpt_api.tls.agent_server_name(NS)``. ``--ca-from`` signs with a CA printed
earlier (`kubectl get secret ckpt-rollout-agent-ca -o yaml`), so a namespace added later, or a
serving certificate renewed, needs no change on the operator's side.

Certificates are made here, on the admin's machine, rather than by the operator: an operator
that writes Secrets in every worker namespace could read and replace any of them, and its RBAC
grants no Secret access at all.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ckpt_api.tls import AGENT_CA_SECRET, AGENT_TLS_SECRET, agent_server_name
from ckpt_api.vocabulary import COMPONENT_LABEL

CA_COMMON_NAME = "ckpt-rollout-agent-ca"
# Certificates valid from a little before now: a node whose clock runs behind still accepts them.
_BACKDATE = dt.timedelta(minutes=5)
_MAX_COMMON_NAME = 64  # X.509's upper bound; verifiers check the DNS SAN, the CN is a label


class CAError(ValueError):
    """--ca-from holds no CA this command can sign with; says why."""


@dataclass(frozen=True)
class CA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey, days: int) -> Any:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )


# What a CA that signs only certificates (and their revocation lists) may do; the test PKI
# (ckpt_e2e.pki) uses it too.
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


def new_ca(days: int) -> CA:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    cert = (
        _builder(name, name, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    return CA(cert, key)


def serving_pair(ca: CA, namespace: str, days: int) -> tuple[bytes, bytes]:
    """(certificate, key) PEM for every agent of `namespace`."""
    dns = agent_server_name(namespace)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[:_MAX_COMMON_NAME])])
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(subject, ca.cert.subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return _pem_cert(cert), _pem_key(key)


def _secret(name: str, namespace: str, component: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ckpt-rollout", COMPONENT_LABEL: component},
        },
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def ca_from_secret(text: str) -> CA:
    """The CA of a Secret this command printed (or the chart generated): tls.crt and tls.key."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CAError(f"not YAML or JSON: {str(exc).splitlines()[0]}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or not {"tls.crt", "tls.key"} <= data.keys():
        raise CAError("not a Secret with data tls.crt and tls.key (the CA's certificate and key)")
    try:
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        key = serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), password=None)
    except ValueError as exc:
        raise CAError(f"tls.crt/tls.key do not hold a PEM certificate and key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CAError(f"the CA key is {type(key).__name__}; this command signs with ECDSA keys only")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        raise CAError("tls.key is not the key of tls.crt")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CAError(f"tls.crt ({cert.subject.rfc4514_string()}) is not a CA certificate")
    return CA(cert, key)


def render(
    namespaces: Sequence[str],
    *,
    operator_namespace: str,
    ca: CA | None,
    cert_days: int,
    ca_days: int,
) -> str:
    """The Secrets as a YAML stream: the CA's first, then one serving Secret per namespace."""
    ca = ca or new_ca(ca_days)
    ca_pem = _pem_cert(ca.cert)
    docs = [
        _secret(
            AGENT_CA_SECRET,
            operator_namespace,
            "operator",
            {"ca.crt": ca_pem, "tls.crt": ca_pem, "tls.key": _pem_key(ca.key)},
        )
    ]
    for namespace in namespaces:
        cert, key = serving_pair(ca, namespace, cert_days)
        docs.append(
            _secret(
                AGENT_TLS_SECRET,
                namespace,
                "worker-agent",
                {"tls.crt": cert, "tls.key": key, "ca.crt": ca_pem},
            )
        )
    return yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True)
