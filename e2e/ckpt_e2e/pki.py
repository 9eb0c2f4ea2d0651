"""Throwaway PKI for one local cluster: a CA, serving and client certificates, SA signing key.

ECDSA P-256 keys keep generation in the milliseconds, which matters because every pytest
session makes a fresh cluster.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ckpt_api.tls import agent_server_name
from ckpt_rollout.tools.tls_secrets import CA_KEY_USAGE

_VALIDITY = dt.timedelta(days=7)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class ClusterPKI:
    """Files under `directory`; the CA key stays in memory to sign further client certs."""

    def __init__(self, directory: Path, ca_name: str = "ckpt-e2e-ca") -> None:
        """``ca_name``: the CA's subject, which a verifier looks issuers up by: CAs trusted
        side by side need different ones."""
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._ca_key = _key()
        now = dt.datetime.now(dt.UTC)
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name(ca_name))
            .issuer_name(_name(ca_name))
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(CA_KEY_USAGE, critical=True)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_cert = self.dir / "ca.crt"
        self.ca_cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        # Service-account tokens are signed with this key (apiserver) and verified with its
        # public half; the controller-manager signs legacy tokens with it too.
        sa_key = _key()
        self.sa_key = self.dir / "sa.key"
        self.sa_pub = self.dir / "sa.pub"
        _write_key(sa_key, self.sa_key)
        self.sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _issue(
        self,
        stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> CertPair:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = CertPair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def serving(self, stem: str, ips: list[str], dns: list[str]) -> CertPair:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        # The CN is informational (clients check the SANs) and capped at 64 characters, which a
        # long test namespace in the agents' name exceeds.
        common = next((n for n in (*dns, *ips) if len(n) <= 64), stem[:64])
        return self._issue(stem, _name(common), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> CertPair:
        """Client cert; the apiserver maps CN to the user name and O to groups."""
        return self._issue(stem, _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)


def agent_certificate(pki: ClusterPKI, namespace: str, ips: tuple[str, ...] = ()) -> CertPair:
    """A serving certificate as the chart issues one: for the agents' name in ``namespace``
    (callers verify that name, never the pod IP); ``ips``: for test clients that dial an
    address and check it (the operator and peers never do)."""
    return pki.serving(f"agent-{namespace}", list(ips), [agent_server_name(namespace)])


class AgentPKI:
    """The agents' CA of a test session and serving certificates issued from it per pod: for
    the agents' name in the pod's namespace (what the operator and peers verify) and for the pod
    IP (what the harness's own readers dial and check with urllib)."""

    def __init__(self, directory: Path) -> None:
        self._pki = ClusterPKI(directory, ca_name=f"ckpt-e2e-agent-ca-{x509.random_serial_number():x}"[:64])
        self.ca_cert = self._pki.ca_cert
        self._also_trusted: list[Path] = []

    def for_pod(self, namespace: str, ip: str, stem: str) -> CertPair:
        return self._pki.serving(stem, [ip], [agent_server_name(namespace)])

    def trust(self, ca_cert: Path) -> None:
        """Let the harness's own readers also accept agents of another CA (a test's); what the
        operator and the agents trust is their flags' business."""
        self._also_trusted.append(ca_cert)

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        for ca in self._also_trusted:
            context.load_verify_locations(cafile=str(ca))
        return context


def handshake_in_memory(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory, no socket: the operator (`client`) verifying an agent
    (`server`) for `name`; raises ssl.SSLError when it does not verify."""
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
