"""Bearer-token auth for every agent endpoint but `/healthz` and `/openapi.json`.

Two authenticators: a static token file (outside Kubernetes, or a mounted Secret) and
TokenReview (the operator's projected service-account token, bound to an audience, from an
allowed service account). 401 = no or invalid credentials, 403 = valid but not allowed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from ckpt_api.agent_openapi import OPENAPI_PATH
from ckpt_api.vocabulary import ErrorCode

log = logging.getLogger(__name__)

# The OpenAPI document is public like /healthz: it says what this open source says already, and
# API tools read it before they hold a token.
OPEN_PATHS = frozenset({"/healthz", OPENAPI_PATH})


@dataclass(frozen=True)
class AuthDecision:
    status: int  # 200 allowed, 401, 403, or 503 when the token could not be reviewed
    reason: str
    username: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200


class Authenticator(Protocol):
    # Callers who may read the relay (peers pulling a version) and nothing else.
    relay_only: frozenset[str]

    async def authenticate(self, token: str) -> AuthDecision: ...


# What peers read: the relay copy of the live version (ckpt_agent.relay.http).
RELAY_PREFIXES = ("/v1/relay/", "/v1/mooncake/")


def scoped(decision: AuthDecision, path: str, relay_only: Collection[str]) -> AuthDecision:
    """A peer's identity (another worker's token) reads the relay and nothing else: it can
    neither pause nor reload this agent."""
    if decision.allowed and decision.username in relay_only and not path.startswith(RELAY_PREFIXES):
        return AuthDecision(
            403, f"user {decision.username!r} may only read this agent's relay", decision.username
        )
    return decision


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    # RFC 6750 tokens are printable ASCII. aiohttp hands other header bytes over as surrogate
    # escapes, which no comparison or TokenReview body can encode: such a header carries no token.
    if not (token.isascii() and token.isprintable()):
        return None
    return token


class StaticTokenAuthenticator:
    """Compares against a token file, re-read when it changes (mounted Secrets are updated in place)."""

    relay_only: frozenset[str] = frozenset()  # one shared secret: peers present it too

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[float, int] | None = None
        self._token = b""
        self._load()
        if not self._token:
            raise ValueError(f"token file {path} is empty")

    def _load(self) -> None:
        st = os.stat(self._path)
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._token = self._path.read_bytes().strip()
            self._stamp = stamp

    async def authenticate(self, token: str) -> AuthDecision:
        try:
            self._load()
        except OSError as exc:
            log.warning("cannot re-read token file %s (%s); using the last token read", self._path, exc)
        if self._token and hmac.compare_digest(token.encode(), self._token):
            return AuthDecision(200, "static token")
        return AuthDecision(401, "invalid token")


def decide_token_review(
    status: Mapping[str, Any], audience: str, allowed_usernames: Collection[str]
) -> AuthDecision:
    """Turn a TokenReview status into a decision (pure, so it is testable without a cluster)."""
    if not status.get("authenticated"):
        error = status.get("error") or "token not authenticated"
        return AuthDecision(401, f"token review: {error}")
    audiences = status.get("audiences") or []
    if audience not in audiences:
        return AuthDecision(401, f"token is not valid for audience {audience!r}")
    username = (status.get("user") or {}).get("username")
    if not username or username not in allowed_usernames:
        return AuthDecision(403, f"user {username!r} is not allowed to call this agent", username)
    return AuthDecision(200, "token review", username)


def review_failed(http_status: int | None) -> AuthDecision:
    """The decision when a TokenReview got no answer (None: no connection) or an HTTP error."""
    if http_status is None or http_status == 429 or http_status >= 500:
        # The apiserver is away or overloaded: nothing was decided about the caller, who may
        # call again (503, not the 401 that would fail a rollout's worker for good).
        suffix = "" if http_status is None else f" (HTTP {http_status})"
        return AuthDecision(503, f"token review unavailable{suffix}")
    # The apiserver refused our own review (e.g. the agent's RBAC lacks tokenreviews create):
    # calling again will not help, so say so.
    return AuthDecision(401, f"token review refused (HTTP {http_status})")


# How long one request waits for its TokenReview before it is answered 503 AuthUnavailable.
TOKENREVIEW_TIMEOUT_S = 5.0


class TokenReviewAuthenticator:
    """Asks the apiserver; caches answers briefly so a rollout's polling does not flood it."""

    def __init__(
        self,
        api_client: Any,
        audience: str,
        allowed_usernames: Collection[str],
        *,
        relay_usernames: Collection[str] = (),
        ttl_seconds: float = 60.0,
        negative_ttl_seconds: float = 5.0,
    ) -> None:
        self._api = api_client
        self._audience = audience
        self._allowed = frozenset(allowed_usernames) | frozenset(relay_usernames)
        self.relay_only = frozenset(relay_usernames) - frozenset(allowed_usernames)
        self._ttl = ttl_seconds
        self._negative_ttl = negative_ttl_seconds
        self._cache: dict[str, tuple[float, AuthDecision]] = {}

    async def authenticate(self, token: str) -> AuthDecision:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached and cached[0] > now:
            return cached[1]
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[self._audience]))
        try:
            # Raw JSON rather than the generated model: the decision needs three fields, and
            # model validation quirks must not turn into a 500.
            response = await client.AuthenticationV1Api(self._api).create_token_review(
                review, _preload_content=False, _request_timeout=TOKENREVIEW_TIMEOUT_S
            )
            try:
                payload = json.loads(await response.read())
            finally:
                response.release()
        except ApiException as exc:
            log.warning("TokenReview failed: %s %s", exc.status, exc.reason)
            return review_failed(exc.status)
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("TokenReview failed: %r", exc)
            return review_failed(None)
        status = payload.get("status") if isinstance(payload, dict) else None
        status = status if isinstance(status, dict) else {}
        decision = decide_token_review(status, self._audience, self._allowed)
        if len(self._cache) > 1024:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + (self._ttl if decision.allowed else self._negative_ttl), decision)
        return decision


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class _Rejection:
    error: ErrorCode
    metric: str  # the `reason` label of the auth-failure counter
    headers: dict[str, str]


_REJECTIONS = {
    401: _Rejection(ErrorCode.UNAUTHORIZED, "invalid", {"WWW-Authenticate": 'Bearer error="invalid_token"'}),
    403: _Rejection(ErrorCode.FORBIDDEN, "forbidden", {}),
    # Not the caller's fault and nothing was done: it may call again (the operator does).
    503: _Rejection(ErrorCode.AUTH_UNAVAILABLE, "unavailable", {"Retry-After": "1"}),
}


def auth_middleware(
    authenticator: Authenticator | None, on_reject: Callable[[str], None] = lambda _reason: None
) -> Middleware:
    """`authenticator=None` means auth is off (explicit `--no-auth`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if authenticator is None or request.path in OPEN_PATHS:
            return await handler(request)
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            on_reject("missing")
            return web.json_response(
                {"error": ErrorCode.UNAUTHORIZED, "message": "missing bearer token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        decision = scoped(await authenticator.authenticate(token), request.path, authenticator.relay_only)
        if not decision.allowed:
            reject = _REJECTIONS.get(decision.status, _REJECTIONS[401])
            on_reject(reject.metric)
            body = {"error": reject.error, "message": decision.reason}
            return web.json_response(body, status=decision.status, headers=reject.headers)
        return await handler(request)

    return middleware
