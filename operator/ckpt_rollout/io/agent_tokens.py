"""The bearer token the operator presents to one agent.

Default (`--agent-token-serviceaccount`): a TokenRequest token of the operator's own
ServiceAccount per agent, for the audience `<agent audience>/<namespace>/<pod>`
(ckpt_api.constants.agent_pod_audience), which only that pod's agent accepts: a token received
by a pod that merely matches a rollout's selector, or captured by whoever holds the namespace's
agent certificate, opens no other agent. Legacy (`--agent-token-file`): one projected token,
the same for every agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_api.constants import DEFAULT_AGENT_AUDIENCE, agent_audience, agent_pod_audience

log = logging.getLogger(__name__)

# One TokenRequest, bounded like the operator's other single-object calls (ckpt_rollout.io.kube).
TOKEN_REQUEST_TIMEOUT_S = 15.0
# Renew once this share of the granted lifetime has passed (the kubelet's own rule for
# projected tokens), so a token is never presented in its last minutes.
RENEW_FRACTION = 0.8
DEFAULT_TOKEN_SECONDS = 3600


class AgentTokenUnavailable(Exception):
    """No token could be had for an agent (TokenRequest failed, none cached still valid)."""


class AgentTokens(Protocol):
    async def for_agent(self, namespace: str, pod: str) -> str | None:
        """The token for the agent of pod ``pod`` in ``namespace`` (None: present none)."""
        ...


class NoToken:
    """Agents without authentication (`--no-auth`, local development)."""

    async def for_agent(self, namespace: str, pod: str) -> str | None:
        return None


class TokenFile:
    """A projected service-account token: the kubelet rotates it, so re-read when it changes.
    The same token for every namespace (the legacy, single-audience mode)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._mtime = -1.0
        self._token: str | None = None

    def get(self) -> str | None:
        mtime = os.stat(self._path).st_mtime
        if mtime != self._mtime:
            with open(self._path, encoding="utf-8") as fh:
                self._token = fh.read().strip()
            self._mtime = mtime
        return self._token

    async def for_agent(self, namespace: str, pod: str) -> str | None:
        return self.get()


@dataclass(frozen=True)
class Lifetime:
    """When to renew a token and when it stops being presentable, on the monotonic clock."""

    renew_at: float
    expires_at: float


def lifetime(granted_s: float, now_mono: float) -> Lifetime:
    """A token granted for ``granted_s`` seconds from now: renewed after RENEW_FRACTION of that;
    still presented until then if a renewal fails, but never past its expiry."""
    granted_s = max(granted_s, 0.0)
    return Lifetime(renew_at=now_mono + RENEW_FRACTION * granted_s, expires_at=now_mono + granted_s)


def granted_seconds(expiration: datetime | str | None, requested_s: int, now: datetime) -> float:
    """What the apiserver granted: it may shorten a request (--service-account-max-token-
    expiration) or lengthen it (--service-account-extend-token-expiration); no stamp means
    what was asked for."""
    if expiration is None:
        return float(requested_s)
    if isinstance(expiration, str):
        expiration = datetime.fromisoformat(expiration.replace("Z", "+00:00"))
    return (expiration - now).total_seconds()


def parse_service_account(value: str) -> tuple[str, str]:
    """`NAMESPACE/NAME` of a ServiceAccount."""
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{value!r} is not NAMESPACE/NAME of a ServiceAccount")
    return namespace, name


@dataclass
class _Held:
    token: str
    life: Lifetime


class TokenRequestTokens:
    """Mints and caches one token per agent; one TokenRequest at a time per agent, however many
    calls wait for it. Tokens of pods gone are dropped once they expire."""

    def __init__(
        self,
        api_client: Any,
        service_account: tuple[str, str],
        *,
        audience_base: str = DEFAULT_AGENT_AUDIENCE,
        seconds: int = DEFAULT_TOKEN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._namespace, self._name = service_account
        self._base = audience_base
        self._seconds = seconds
        self._clock = clock
        self._held: dict[tuple[str, str], _Held] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.minted = 0

    async def for_agent(self, namespace: str, pod: str) -> str:
        key = (namespace, pod)
        held = self._held.get(key)
        if held is not None and self._clock() < held.life.renew_at:
            return held.token
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            held = self._held.get(key)
            if held is not None and self._clock() < held.life.renew_at:
                return held.token  # renewed while this call waited
            try:
                held = await self._mint(namespace, pod)
            except AgentTokenUnavailable:
                if held is not None and self._clock() < held.life.expires_at:
                    log.warning("keeping the agent token for %s/%s until it expires", namespace, pod)
                    return held.token
                raise
            self._forget_expired()
            self._held[key] = held
            return held.token

    def _forget_expired(self) -> None:
        now = self._clock()
        for key in [k for k, h in self._held.items() if now >= h.life.expires_at]:
            del self._held[key]
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]

    async def _mint(self, namespace: str, pod: str) -> _Held:
        audience = agent_pod_audience(agent_audience(namespace, self._base), pod)
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=self._seconds)
        )
        started = self._clock()
        try:
            answer = await self._core.create_namespaced_service_account_token(
                self._name, self._namespace, request, _request_timeout=TOKEN_REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            log.warning("TokenRequest for audience %s failed: %s %s", audience, exc.status, exc.reason)
            raise AgentTokenUnavailable(
                f"TokenRequest for {self._namespace}/{self._name} (audience {audience}) failed: "
                f"HTTP {exc.status} {exc.reason}"
            ) from None
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            log.warning("TokenRequest for audience %s failed: %r", audience, exc)
            raise AgentTokenUnavailable(f"TokenRequest for audience {audience} failed: {exc!r}") from None
        status = answer.status
        if status is None or not status.token:
            raise AgentTokenUnavailable(f"TokenRequest for audience {audience} returned no token")
        self.minted += 1
        granted = granted_seconds(status.expiration_timestamp, self._seconds, datetime.now(UTC))
        return _Held(str(status.token), lifetime(granted, started))
