"""Bearer-token auth for every agent endpoint but `/healthz` and `/openapi.json`.

Two authenticators: a static token file (outside Kubernetes, or a mounted Secret) and
TokenReview (a service-account token bound to this agent's audience). A reviewed caller is then
authorized by SubjectAccessReview (kube-rbac-proxy's model, the default): may it `update`
(control routes), `get` (reads) or `get` the `relay` subresource (peers) of resource
`agents.rollout.ckpt.dev` named after this pod in this pod's namespace; or, the explicit
fallback, by a username allow-list. 401 = no or invalid credentials, 403 = valid but not
allowed, 503 = the apiserver could not be asked, or refused while not ready (see
settle_refusal).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from ckpt_api.agent_openapi import OPENAPI_PATH
from ckpt_api.constants import AGENT_RBAC_RESOURCE, AGENT_RELAY_SUBRESOURCE, GROUP
from ckpt_api.vocabulary import ErrorCode

log = logging.getLogger(__name__)

# The OpenAPI document is public like /healthz: it says what this open source says already, and
# API tools read it before they hold a token.
OPEN_PATHS = frozenset({"/healthz", OPENAPI_PATH})


@dataclass(frozen=True)
class UserInfo:
    """Who a TokenReview says the caller is: what a SubjectAccessReview asks about."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_review(cls, user: Mapping[str, Any]) -> UserInfo:
        extra = user.get("extra")
        extra = extra if isinstance(extra, dict) else {}
        return cls(
            username=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
        )


@dataclass(frozen=True)
class AuthDecision:
    status: int  # 200 allowed, 401, 403, or 503 when the token could not be reviewed
    reason: str
    username: str | None = None
    user: UserInfo | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200


class Authenticator(Protocol):
    async def authenticate(self, token: str, method: str, path: str) -> AuthDecision:
        """May the bearer of ``token`` make this request?"""
        ...


# What peers read: the relay copy of the live version (ckpt_agent.server.relay_routes).
RELAY_PREFIXES = ("/v1/relay/", "/v1/mooncake/")


def scoped(decision: AuthDecision, path: str, relay_only: Collection[str]) -> AuthDecision:
    """A peer's identity (another worker's token) reads the relay and nothing else: it can
    neither pause nor reload this agent."""
    if decision.allowed and decision.username in relay_only and not path.startswith(RELAY_PREFIXES):
        return AuthDecision(
            403, f"user {decision.username!r} may only read this agent's relay", decision.username
        )
    return decision


@dataclass(frozen=True)
class Access:
    """What a request needs in RBAC: a verb on `agents`, or on its `relay` subresource."""

    verb: str
    subresource: str | None = None

    def __str__(self) -> str:
        resource = (
            AGENT_RBAC_RESOURCE if self.subresource is None else f"{AGENT_RBAC_RESOURCE}/{self.subresource}"
        )
        return f"{self.verb} {resource}.{GROUP}"


_READS = frozenset({"GET", "HEAD"})


def access_for(method: str, path: str) -> Access:
    """Peers read the relay (`get agents/relay`); other reads (status, /metrics on this port)
    are `get agents`; every other method changes state or runs the model (`update agents`)."""
    if path.startswith(RELAY_PREFIXES):
        return Access("get", AGENT_RELAY_SUBRESOURCE)
    return Access("get" if method.upper() in _READS else "update")


def access_review(user: UserInfo, access: Access, namespace: str, name: str | None) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` may do ``access`` to this agent."""
    attributes: dict[str, Any] = {
        "namespace": namespace,
        "verb": access.verb,
        "group": GROUP,
        "resource": AGENT_RBAC_RESOURCE,
    }
    if access.subresource is not None:
        attributes["subresource"] = access.subresource
    if name:
        attributes["name"] = name
    spec: dict[str, Any] = {
        "user": user.username,
        "groups": list(user.groups),
        "resourceAttributes": attributes,
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def decide_access_review(
    status: Mapping[str, Any], user: UserInfo, access: Access, namespace: str
) -> AuthDecision:
    """Turn a SubjectAccessReview status into a decision (pure, like decide_token_review)."""
    if status.get("allowed") is True and not status.get("denied"):
        return AuthDecision(200, "access review", user.username, user)
    why = status.get("reason") or status.get("evaluationError") or ""
    return AuthDecision(
        403,
        f"user {user.username!r} may not {access} in namespace {namespace!r}" + (f" ({why})" if why else ""),
        user.username,
        user,
    )


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


class _TokenFile:
    """A token in a file, re-read when it changes (mounted Secrets are updated in place)."""

    def __init__(self, path: Path, *, required: bool = True) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._token = b""
        if required or path.exists():  # an optional one matches nothing until it appears
            self._load()
        if required and not self._token:
            raise ValueError(f"token file {path} is empty")

    def _load(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._token = self.path.read_bytes().strip()
            self._stamp = stamp

    def matches(self, token: str) -> bool:
        try:
            self._load()
        except OSError as exc:
            log.warning("cannot re-read token file %s (%s); using the last token read", self.path, exc)
        return bool(self._token) and hmac.compare_digest(token.encode(), self._token)


class StaticTokenAuthenticator:
    """Compares against a token file: its bearer may do everything. With ``relay_token_file``
    (the agent's --relay-token-file, one relay secret its peers share), that token reads the
    relay and nothing else: peers never need, and are never sent, the full token."""

    RELAY_USER = "relay-token"

    def __init__(self, path: Path, *, relay_token_file: Path | None = None) -> None:
        self._token = _TokenFile(path)
        # Not yet mounted is no reason to refuse to start: peers are refused until it is.
        self._relay = _TokenFile(relay_token_file, required=False) if relay_token_file else None

    async def authenticate(self, token: str, method: str = "GET", path: str = "/") -> AuthDecision:
        if self._token.matches(token):
            return AuthDecision(200, "static token")
        if self._relay is not None and self._relay.matches(token):
            relay = AuthDecision(200, "relay token", self.RELAY_USER)
            return scoped(relay, path, frozenset({self.RELAY_USER}))
        return AuthDecision(401, "invalid token")


Audiences = str | tuple[str, ...]


def _named(audiences: Audiences) -> tuple[str, ...]:
    return (audiences,) if isinstance(audiences, str) else audiences


def _not_ours(audiences: Audiences) -> AuthDecision:
    ours = " or ".join(repr(a) for a in _named(audiences))
    return AuthDecision(401, f"token is not valid for audience {ours}")


def decide_token_review(
    status: Mapping[str, Any], audiences: Audiences, allowed_usernames: Collection[str] | None
) -> AuthDecision:
    """Turn a TokenReview status into a decision (pure, so it is testable without a cluster).
    ``audiences``: those this agent accepts (its namespace's, and its pod's own).
    ``allowed_usernames`` None: any authenticated user passes, for SubjectAccessReview to judge."""
    if not status.get("authenticated"):
        error = status.get("error") or "token not authenticated"
        return AuthDecision(401, f"token review: {error}")
    valid_for = status.get("audiences") or []
    if not any(a in valid_for for a in _named(audiences)):
        return _not_ours(audiences)
    user = status.get("user")
    info = UserInfo.from_review(user if isinstance(user, dict) else {})
    username = info.username or None
    if not username or (allowed_usernames is not None and username not in allowed_usernames):
        return AuthDecision(403, f"user {username!r} is not allowed to call this agent", username)
    return AuthDecision(200, "token review", username, info)


def review_failed(http_status: int | None, review: str = "token review", refused: int = 401) -> AuthDecision:
    """The decision when a TokenReview (or an access review) got no answer (None: no
    connection) or an HTTP error."""
    if http_status is None or http_status == 429 or http_status >= 500:
        # The apiserver is away or overloaded: nothing was decided about the caller, who may
        # call again (503, not the 401 that would fail a rollout's worker for good).
        suffix = "" if http_status is None else f" (HTTP {http_status})"
        return AuthDecision(503, f"{review} unavailable{suffix}")
    # The apiserver refused our own review (e.g. the agent's RBAC lacks tokenreviews or
    # subjectaccessreviews create): calling again will not help, so say so.
    return AuthDecision(refused, f"{review} refused (HTTP {http_status})")


def settle_refusal(refusal: AuthDecision, readyz: int | None) -> AuthDecision:
    """A refusal (401/403) stands only if the apiserver that gave it was ready (its /readyz
    answered ``readyz`` 200). Right after a restart kube-apiserver answers while its RBAC and
    service-account caches still fill: a caller whose binding is not loaded yet reads as denied,
    and so may this agent's own review create. Such an answer is no verdict: 503, ask again."""
    if refusal.allowed or readyz == 200:
        return refusal
    seen = "no answer" if readyz is None else f"HTTP {readyz}"
    return AuthDecision(
        503, f"unsettled, the apiserver is not ready (readyz: {seen}): {refusal.reason}", refusal.username
    )


# How long one request waits for its TokenReview, and then for its SubjectAccessReview, before
# it is answered 503 AuthUnavailable.
TOKENREVIEW_TIMEOUT_S = 5.0
# How long a 200 from /readyz vouches for the refusals that follow: refusals are rare, and this
# bounds the extra calls a flood of bad tokens makes.
READYZ_TRUST_S = 1.0


# How long a decision is kept. An allowed one is the revocation lag: a deleted ServiceAccount,
# a deleted pod (for a pod-bound token) or a withdrawn RoleBinding stops working within this, and
# never later than the token's own `exp`. A refusal is kept so that a repeated bad token costs
# one review per window.
# This short only with the breaker (TokenReviewAuthenticator._kept_or_reviewed): in an outage a review waits
# its TOKENREVIEW_TIMEOUT_S, longer than callers' own timeouts, so callers whose decision lapsed
# every 10 s would each meet that wait; once one review found the apiserver away, they are
# answered from their kept decision at once while one review at a time, in the background,
# finds out when it is back.
ALLOWED_TTL_S = 10.0
REFUSED_TTL_S = 5.0
# While the apiserver cannot be asked (an outage, a restart), an allowed decision is still used
# this long past its TTL, never past the token's `exp`: nobody can learn of a revocation then
# anyway, and the operator (and peers) keep working through a restart instead of meeting 503.
STALE_IF_UNAVAILABLE_S = 120.0
# Decisions kept at most, per cache (the least recently used go first): a flood of distinct
# tokens cannot grow the agent's memory, and evicts only what is cheap to ask again.
MAX_KEPT_DECISIONS = 1024

Clock = Callable[[], float]


class _Answers:
    """Decisions kept briefly so a rollout's polling does not flood the apiserver; an allowed one
    a while longer for when the apiserver cannot be asked (``stale``)."""

    def __init__(self, ttl_seconds: float, negative_ttl_seconds: float, max_kept: int, clock: Clock) -> None:
        self._ttl = ttl_seconds
        self._negative_ttl = negative_ttl_seconds
        self._max_kept = max_kept
        self._clock = clock
        # key -> (fresh until, usable while the apiserver is away until, decision)
        self._kept: OrderedDict[Any, tuple[float, float, AuthDecision]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: Any) -> AuthDecision | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        now = self._clock()
        if kept[1] <= now:
            del self._kept[key]
            return None
        if kept[0] <= now:
            return None  # ask again; kept meanwhile for ``stale``
        self._kept.move_to_end(key)
        return kept[2]

    def stale(self, key: Any) -> AuthDecision | None:
        """The allowed decision for ``key`` past its TTL but within STALE_IF_UNAVAILABLE_S (and the
        token's lifetime), for when the apiserver cannot be asked."""
        kept = self._kept.get(key)
        if kept is None or kept[1] <= self._clock() or not kept[2].allowed:
            return None
        return kept[2]

    def put(self, key: Any, decision: AuthDecision, valid_for_s: float | None = None) -> AuthDecision:
        """Keep ``decision``; ``valid_for_s`` shortens an allowed one (the token expires sooner)."""
        ttl = self._ttl if decision.allowed else self._negative_ttl
        usable = ttl + STALE_IF_UNAVAILABLE_S if decision.allowed else ttl
        if valid_for_s is not None:
            ttl, usable = min(ttl, valid_for_s), min(usable, valid_for_s)
        if ttl > 0:
            now = self._clock()
            self._kept[key] = (now + ttl, now + usable, decision)
            self._kept.move_to_end(key)
            while len(self._kept) > self._max_kept:
                self._kept.popitem(last=False)
        return decision


_B64URL = re.compile(r"[A-Za-z0-9_-]+")


def _b64url_json(part: str) -> dict[str, Any] | None:
    if not _B64URL.fullmatch(part):
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def unverified_claims(token: str) -> dict[str, Any] | None:
    """The claims of a token shaped like a signed JWT (header.payload.signature, base64url, the
    header naming its `alg`), unverified; None for anything else. Every token that can pass
    review here is one (service-account and OIDC tokens bound to our audience), so a token of
    another shape is refused without asking the apiserver. The claims are the bearer's word:
    they may only shorten how long a decision is kept, or refuse."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[2] or not _B64URL.fullmatch(parts[2]):
        return None
    header = _b64url_json(parts[0])
    if header is None or not isinstance(header.get("alg"), str) or header["alg"].lower() == "none":
        return None
    return _b64url_json(parts[1])


def audience_refusal(claims: Mapping[str, Any], audiences: Audiences) -> AuthDecision | None:
    """A refusal that needs no TokenReview: a JWT naming other audiences only (the apiserver
    would refuse it for ours)."""
    aud = claims.get("aud")
    named = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else None
    if named is not None and not any(a in named for a in _named(audiences)):
        return _not_ours(audiences)
    return None


def seconds_left(claims: Mapping[str, Any], now: float) -> float | None:
    """Seconds until the token's `exp` (None: it names none)."""
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return float(exp) - now


async def _review(call: Callable[..., Awaitable[Any]], body: Any, what: str) -> dict[str, Any] | int | None:
    """POST one review; its status object, or the HTTP status it failed with (None: no answer
    within TOKENREVIEW_TIMEOUT_S or no connection)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        # Raw JSON rather than the generated model: the decision needs a few fields, and
        # model validation quirks must not turn into a 500.
        response = await call(body, _preload_content=False, _request_timeout=TOKENREVIEW_TIMEOUT_S)
        try:
            # Without _preload_content the client does not raise on an error status: a 500 or
            # 429 body must not be read as a review that authenticated nobody.
            if not 200 <= response.status <= 299:
                log.warning("%s failed: HTTP %s", what, response.status)
                return int(response.status)
            payload = json.loads(await response.read())
        finally:
            response.release()
    except ApiException as exc:
        log.warning("%s failed: %s %s", what, exc.status, exc.reason)
        return int(exc.status or 0) or None
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.warning("%s failed: %r", what, exc)
        return None
    status = payload.get("status") if isinstance(payload, dict) else None
    return status if isinstance(status, dict) else {}


async def _readyz(api_client: Any) -> int | None:
    """The HTTP status of the apiserver's /readyz (None: no answer)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        response = await api_client.call_api(
            "/readyz",
            "GET",
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=TOKENREVIEW_TIMEOUT_S,
        )
        response.release()
        return int(response.status)
    except ApiException as exc:
        return int(exc.status or 0) or None
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.warning("apiserver /readyz failed: %r", exc)
        return None


@dataclass(frozen=True)
class AccessReviewTarget:
    """This agent as RBAC sees it: its pod's namespace and name."""

    namespace: str
    name: str | None = None


class TokenReviewAuthenticator:
    """TokenReview for who the caller is, then SubjectAccessReview on ``target`` for what it may
    do; or, with ``allowed_usernames`` (the fallback), the allow-list, ``relay_usernames``
    reading the relay only."""

    def __init__(
        self,
        api_client: Any,
        audience: str,
        allowed_usernames: Collection[str] = (),
        *,
        pod_audience: str | None = None,
        target: AccessReviewTarget | None = None,
        relay_usernames: Collection[str] = (),
        ttl_seconds: float = ALLOWED_TTL_S,
        negative_ttl_seconds: float = REFUSED_TTL_S,
        max_kept: int = MAX_KEPT_DECISIONS,
        clock: Clock = time.monotonic,
    ) -> None:
        if (target is None) == (not allowed_usernames):
            raise ValueError("authorize by SubjectAccessReview (target) or by allowed_usernames, one of them")
        self._api = api_client
        # The namespace's audience (peers' relay reads, callers of older operators) and this
        # pod's own (the operator's calls): a token for another pod is refused.
        self._audiences = (audience,) if pod_audience is None else (audience, pod_audience)
        self._target = target
        self._allowed = frozenset(allowed_usernames) | frozenset(relay_usernames)
        self.relay_only = frozenset(relay_usernames) - frozenset(allowed_usernames)
        self._reviews = _Answers(ttl_seconds, negative_ttl_seconds, max_kept, clock)
        self._access = _Answers(ttl_seconds, negative_ttl_seconds, max_kept, clock)
        self._ready_until = 0.0
        # Set when a review found the apiserver unable to answer, cleared by one that got an
        # answer: meanwhile a lapsed allowed decision is used at once (see ALLOWED_TTL_S).
        self._away = False
        self._probe: asyncio.Task[object] | None = None

    def kept_decisions(self) -> int:
        """How many decisions are cached (bounded by ``max_kept`` per cache)."""
        return len(self._reviews) + len(self._access)

    async def authenticate(self, token: str, method: str, path: str) -> AuthDecision:
        claims = unverified_claims(token)
        if claims is None:
            return AuthDecision(401, "token is not a signed JWT")
        if (refused := audience_refusal(claims, self._audiences)) is not None:
            return refused
        key = hashlib.sha256(token.encode()).hexdigest()
        valid_for = seconds_left(claims, time.time())
        identity = self._reviews.get(key) or await self._token_review(key, token, valid_for)
        if not identity.allowed:
            return identity
        user, target = identity.user, self._target
        if target is None or user is None:
            return scoped(identity, path, self.relay_only)
        access = access_for(method, path)
        return self._access.get((key, access)) or await self._access_review(
            key, user, target, access, valid_for
        )

    async def _kept_or_reviewed(
        self, answers: _Answers, key: Any, review: Callable[[], Coroutine[Any, Any, AuthDecision]]
    ) -> AuthDecision:
        """``review()``'s decision; but while the apiserver is known away, the lapsed allowed
        decision for ``key`` at once, with ``review`` run in the background (one at a time) to
        learn when it is back."""
        kept = answers.stale(key) if self._away else None
        if kept is None:
            return await review()
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(review())
        return kept

    async def _token_review(self, key: str, token: str, valid_for: float | None) -> AuthDecision:
        return await self._kept_or_reviewed(
            self._reviews, key, lambda: self._token_review_now(key, token, valid_for)
        )

    async def _token_review_now(self, key: str, token: str, valid_for: float | None) -> AuthDecision:
        from kubernetes_asyncio import client

        allowed = None if self._target is not None else self._allowed
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=list(self._audiences))
        )
        status = await _review(client.AuthenticationV1Api(self._api).create_token_review, body, "TokenReview")
        self._away = not isinstance(status, dict)
        if not isinstance(status, dict):
            decision = await self._settled(review_failed(status))
        else:
            decision = decide_token_review(status, self._audiences, allowed)
            if decision.status == 401:  # the apiserver's word (our allow-list's is final)
                decision = await self._settled(decision)
        if decision.status == 503:
            return self._reviews.stale(key) or decision
        return decision if not isinstance(status, dict) else self._reviews.put(key, decision, valid_for)

    async def _access_review(
        self, key: str, user: UserInfo, target: AccessReviewTarget, access: Access, valid_for: float | None
    ) -> AuthDecision:
        return await self._kept_or_reviewed(
            self._access, (key, access), lambda: self._access_review_now(key, user, target, access, valid_for)
        )

    async def _access_review_now(
        self, key: str, user: UserInfo, target: AccessReviewTarget, access: Access, valid_for: float | None
    ) -> AuthDecision:
        from kubernetes_asyncio import client

        body = access_review(user, access, target.namespace, target.name)
        create = client.AuthorizationV1Api(self._api).create_subject_access_review
        status = await _review(create, body, "SubjectAccessReview")
        self._away = not isinstance(status, dict)
        if not isinstance(status, dict):
            decision = await self._settled(review_failed(status, "access review", refused=403))
        else:
            decision = await self._settled(decide_access_review(status, user, access, target.namespace))
        if decision.status == 503:
            return self._access.stale((key, access)) or decision
        return (
            decision if not isinstance(status, dict) else self._access.put((key, access), decision, valid_for)
        )

    async def _settled(self, decision: AuthDecision) -> AuthDecision:
        if decision.allowed or decision.status == 503 or time.monotonic() < self._ready_until:
            return decision
        readyz = await _readyz(self._api)
        if readyz == 200:
            self._ready_until = time.monotonic() + READYZ_TRUST_S
        return settle_refusal(decision, readyz)


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
        decision = await authenticator.authenticate(token, request.method, request.path)
        if not decision.allowed:
            reject = _REJECTIONS.get(decision.status, _REJECTIONS[401])
            on_reject(reject.metric)
            body = {"error": reject.error, "message": decision.reason}
            return web.json_response(body, status=decision.status, headers=reject.headers)
        return await handler(request)

    return middleware
