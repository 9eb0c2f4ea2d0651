"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both drive
rollouts. The standby blocks until the lease is free or expired; the leader renews it in a
thread and exits the process if it loses it (Kubernetes restarts it as a standby)."""

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ckpt_api.vocabulary import LEASE_NAME
from ckpt_rollout.io.blocking_kube import BlockingKube

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


class LeaseElector:
    def __init__(
        self, namespace: str, *, identity: str | None = None, duration_s: int = 15, renew_every_s: float = 5.0
    ) -> None:
        from kubernetes_asyncio import client, config

        try:
            self._kube = BlockingKube.in_cluster()
        except config.ConfigException:
            self._kube = BlockingKube.from_kubeconfig()
        self._client = client
        self.namespace = namespace
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.duration_s = duration_s
        self.renew_every_s = renew_every_s
        # Every Lease call gives up after this long: a hung apiserver must not hold a renewal
        # past the moment the lease could lapse (the watchdog exits regardless, see below).
        self.call_timeout_s = renew_every_s
        self.holder: str | None = None  # the holder the last attempt saw

    def _try(self) -> bool:
        """One attempt to acquire or renew; the apiserver's resourceVersion check makes it
        atomic between replicas."""
        from kubernetes_asyncio.client.exceptions import ApiException

        api = self._kube.coordination
        now = _now()
        try:
            lease = self._kube.call(
                lambda: api.read_namespaced_lease(
                    LEASE_NAME, self.namespace, _request_timeout=self.call_timeout_s
                )
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = self._client.V1Lease(
                metadata=self._client.V1ObjectMeta(name=LEASE_NAME),
                spec=self._client.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=self.duration_s,
                    acquire_time=_fmt(now),
                    renew_time=_fmt(now),
                ),
            )
            try:
                self._kube.call(
                    lambda: api.create_namespaced_lease(
                        self.namespace, body, _request_timeout=self.call_timeout_s
                    )
                )
                self.holder = self.identity
                return True
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
        spec = lease.spec
        self.holder = spec.holder_identity
        renewed = _parse(spec.renew_time)
        expired = renewed is None or now > renewed + timedelta(seconds=spec.lease_duration_seconds or 0)
        if spec.holder_identity != self.identity and not expired:
            return False
        if spec.holder_identity != self.identity:
            spec.acquire_time = _fmt(now)
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = self.duration_s
        spec.renew_time = _fmt(now)
        try:
            self._kube.call(
                lambda: api.replace_namespaced_lease(
                    LEASE_NAME, self.namespace, lease, _request_timeout=self.call_timeout_s
                )
            )
            self.holder = self.identity
            return True
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first
                return False
            raise

    def acquire(self) -> None:
        log.info("waiting for lease %s/%s as %s", self.namespace, LEASE_NAME, self.identity)
        while not self._try():
            time.sleep(1.0)
        log.info("acquired lease %s/%s", self.namespace, LEASE_NAME)

    def keep_renewing(self) -> threading.Thread:
        """Renew in one thread; exit the process at once when another replica holds the lease,
        and from a second thread (a watchdog that does not wait on any call) when no renewal
        has succeeded for longer than the lease would outlive it, a hung call included. Either
        way this replica stops before a standby may take over, so two never lead at once."""
        last_ok = [time.monotonic()]

        def lose(why: str) -> None:
            log.error(
                "lost lease %s/%s (%s); exiting so a standby takes over", self.namespace, LEASE_NAME, why
            )
            os._exit(1)

        def renew() -> None:
            while True:
                time.sleep(self.renew_every_s)
                try:
                    if self._try():
                        last_ok[0] = time.monotonic()
                    elif self.holder not in (None, self.identity):
                        lose(f"held by {self.holder}")
                except Exception:  # network blips: keep trying; the watchdog bounds how long
                    log.exception("lease renewal failed")

        def watchdog() -> None:
            limit = self.duration_s - self.renew_every_s
            while True:
                time.sleep(min(1.0, self.renew_every_s))
                if time.monotonic() - last_ok[0] > limit:
                    lose(f"no renewal for {limit:.0f}s")

        threading.Thread(target=watchdog, name="lease-watchdog", daemon=True).start()
        thread = threading.Thread(target=renew, name="lease-renewer", daemon=True)
        thread.start()
        return thread


class _Alive(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"standby": true}')

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def liveness_while_standby(host: str, port: int) -> Iterator[None]:
    """A standby replica is healthy: answer the liveness probe until kopf takes the port."""
    server = ThreadingHTTPServer((host, port), _Alive)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
