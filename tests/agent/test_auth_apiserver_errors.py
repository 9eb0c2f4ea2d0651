"""An apiserver that answers a review with an error status (500, 429, 503) has given no verdict:
the agent says AuthUnavailable (503, ask again), never the 401/403 that fails a worker for good.
How long the agent keeps a verdict: a revoked token or binding stops working within
ALLOWED_TTL_S (and by the token's `exp`), a token that cannot be one the apiserver accepts costs
no review, and the cache stays bounded whatever tokens arrive.
The apiserver here is a stand-in on 127.0.0.1 because a real one cannot be made to answer 500
or 429 to one review on demand; the client and the agent's code are the real ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_testkit import jwt_shaped, wait_until
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from ckpt_agent.server import auth as auth_module
from ckpt_agent.server.auth import (
    STALE_IF_UNAVAILABLE_S,
    AccessReviewTarget,
    AuthDecision,
    TokenReviewAuthenticator,
)

AUDIENCE = "ckpt-rollout-agent"
USER = "system:serviceaccount:ckpt-rollout-system:ckpt-operator"
TOKEN = jwt_shaped(sub=USER, aud=[AUDIENCE])
# Revocation: a deleted ServiceAccount or pod, or a withdrawn binding, stops working within this.
REVOCATION_BOUND_S = 10.0  # ckpt_agent.server.auth.ALLOWED_TTL_S
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Apiserver:
    """Answers each review with the status set for it; a 200 carries a verdict that allows."""

    def __init__(self) -> None:
        self.answers = {TOKEN_REVIEWS: 200, ACCESS_REVIEWS: 200}
        self.calls: list[str] = []
        self.authenticated = True
        self.allowed = True
        self.hung: set[str] = set()  # reviews that wait until released
        self.released = asyncio.Event()

    async def review(self, request: web.Request) -> web.Response:
        self.calls.append(request.path)
        if request.path in self.hung:
            await self.released.wait()
        code = self.answers[request.path]
        if code != 200:
            return web.json_response({"kind": "Status", "status": "Failure", "code": code}, status=code)
        if request.path == TOKEN_REVIEWS:
            status: dict[str, Any] = {
                "authenticated": True,
                "audiences": [AUDIENCE],
                "user": {"username": USER},
            }
            if not self.authenticated:
                status = {"authenticated": False, "error": "token expired"}
        else:
            status = {"allowed": self.allowed}
        return web.json_response({"status": status})

    async def readyz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[Apiserver, Any]]:
    stand_in = Apiserver()
    app = web.Application()
    app.router.add_post(TOKEN_REVIEWS, stand_in.review)
    app.router.add_post(ACCESS_REVIEWS, stand_in.review)
    app.router.add_get("/readyz", stand_in.readyz)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.port}")
    api = client.ApiClient(configuration)
    try:
        yield stand_in, api
    finally:
        await api.close()
        await server.close()


@pytest.mark.parametrize("code", [500, 429, 503])
async def test_a_token_review_answered_with_an_error_status_is_unavailable(
    apiserver: tuple[Apiserver, Any], code: int
) -> None:
    stand_in, api = apiserver
    stand_in.answers[TOKEN_REVIEWS] = code
    auth = TokenReviewAuthenticator(api, AUDIENCE, allowed_usernames=(USER,))
    decision = await auth.authenticate(TOKEN, "POST", "/v1/update_weights")
    assert decision == AuthDecision(503, f"token review unavailable (HTTP {code})")
    # Not cached: once the apiserver answers again, the same token is let through.
    stand_in.answers[TOKEN_REVIEWS] = 200
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed


@pytest.mark.parametrize("code", [500, 429])
async def test_an_access_review_answered_with_an_error_status_is_unavailable(
    apiserver: tuple[Apiserver, Any], code: int
) -> None:
    stand_in, api = apiserver
    stand_in.answers[ACCESS_REVIEWS] = code
    auth = TokenReviewAuthenticator(api, AUDIENCE, target=AccessReviewTarget("rl", "worker-0"))
    decision = await auth.authenticate(TOKEN, "POST", "/v1/update_weights")
    assert decision.status == 503, decision
    assert decision.reason == f"access review unavailable (HTTP {code})"
    assert stand_in.calls == [TOKEN_REVIEWS, ACCESS_REVIEWS]


async def test_a_token_review_that_authenticates_nobody_is_still_a_401(
    apiserver: tuple[Apiserver, Any],
) -> None:
    """The other side of the rule: a review answered 200 that says no stays a refusal."""
    stand_in, api = apiserver
    stand_in.authenticated = False
    auth = TokenReviewAuthenticator(api, AUDIENCE, allowed_usernames=(USER,))
    decision = await auth.authenticate(TOKEN, "POST", "/v1/update_weights")
    assert decision == AuthDecision(401, "token review: token expired")


class FakeClock:
    """The monotonic clock the authenticator's cache reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("revoked", ["token", "binding"])
async def test_a_revoked_token_or_binding_stops_working_within_the_bound(
    apiserver: tuple[Apiserver, Any], revoked: str
) -> None:
    stand_in, api = apiserver
    clock = FakeClock()
    auth = TokenReviewAuthenticator(api, AUDIENCE, target=AccessReviewTarget("rl", "worker-0"), clock=clock)
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed
    if revoked == "token":
        stand_in.authenticated = False  # its ServiceAccount (or bound pod) was deleted
    else:
        stand_in.allowed = False  # its RoleBinding was deleted
    clock.now += REVOCATION_BOUND_S
    decision = await auth.authenticate(TOKEN, "POST", "/v1/update_weights")
    assert decision.status == (401 if revoked == "token" else 403), decision


@pytest.mark.parametrize("failing", [TOKEN_REVIEWS, ACCESS_REVIEWS])
async def test_a_caller_allowed_before_an_outage_is_still_allowed_while_the_apiserver_is_away(
    apiserver: tuple[Apiserver, Any], failing: str
) -> None:
    """Past the revocation bound, but with the apiserver unable to answer (a restart): the last
    allowed decision stands for STALE_IF_UNAVAILABLE_S, so the operator rides the outage through;
    after that, 503. A caller never allowed before gets 503 at once."""
    stand_in, api = apiserver
    clock = FakeClock()
    auth = TokenReviewAuthenticator(api, AUDIENCE, target=AccessReviewTarget("rl", "worker-0"), clock=clock)
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed
    stand_in.answers[failing] = 503
    clock.now += REVOCATION_BOUND_S
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed
    other = jwt_shaped(sub="someone-else", aud=[AUDIENCE])
    assert (await auth.authenticate(other, "POST", "/v1/update_weights")).status == 503
    clock.now += STALE_IF_UNAVAILABLE_S
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).status == 503
    stand_in.answers[failing] = 200
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed


@pytest.mark.parametrize("failing", [TOKEN_REVIEWS, ACCESS_REVIEWS])
async def test_once_the_apiserver_is_found_away_kept_callers_wait_for_no_review(
    apiserver: tuple[Apiserver, Any], failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The breaker that lets ALLOWED_TTL_S be short: an apiserver that hangs costs the first
    review its timeout; after that, callers whose decision lapsed are answered from it without a
    review of their own, while one review at a time (in the background) looks for the apiserver;
    once it answers, decisions are fresh again and revocations count."""
    monkeypatch.setattr(auth_module, "TOKENREVIEW_TIMEOUT_S", 0.5)
    stand_in, api = apiserver
    clock = FakeClock()
    auth = TokenReviewAuthenticator(api, AUDIENCE, target=AccessReviewTarget("rl", "worker-0"), clock=clock)
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed
    stand_in.hung.add(failing)
    clock.now += REVOCATION_BOUND_S
    # The first lapsed review meets the hung apiserver, times out, and answers from the kept one.
    assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed
    asked = len(stand_in.calls)

    for _ in range(20):
        assert (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed

    # At most the one background review went out for those 20 callers (none waited on it).
    assert len(stand_in.calls) - asked <= 1, stand_in.calls
    stand_in.released.set()
    stand_in.allowed = stand_in.authenticated = False  # revoked meanwhile

    async def refused() -> bool:
        return not (await auth.authenticate(TOKEN, "POST", "/v1/update_weights")).allowed

    # Back: the background review (or the next caller's own) sees the revocation.
    await wait_until(refused, 10, "the revocation to count once the apiserver answers")


async def test_a_token_is_not_trusted_past_its_own_expiry(apiserver: tuple[Apiserver, Any]) -> None:
    """Its `exp` is unverified, so it may only shorten the cache: here to two seconds."""
    stand_in, api = apiserver
    clock = FakeClock()
    auth = TokenReviewAuthenticator(api, AUDIENCE, allowed_usernames=(USER,), clock=clock)
    expiring = jwt_shaped(sub=USER, aud=[AUDIENCE], exp=int(time.time()) + 2)
    assert (await auth.authenticate(expiring, "GET", "/v1/status")).allowed
    stand_in.authenticated = False  # the apiserver now finds it expired
    clock.now += 3
    assert (await auth.authenticate(expiring, "GET", "/v1/status")).status == 401


@pytest.mark.parametrize(
    "token",
    [
        "a-token",
        "x" * 4096,
        "a.b.c",
        TOKEN.rsplit(".", 1)[0],  # no signature part
        TOKEN + ".extra",
        jwt_shaped(sub=USER, aud=[AUDIENCE]).replace(TOKEN.split(".")[0], "e30"),  # header {}: no alg
        "eyJhbGciOiJub25lIn0." + TOKEN.split(".")[1] + ".c2ln",  # alg none
        "!!!." + TOKEN.split(".", 1)[1],  # not base64url
        jwt_shaped(sub=USER, aud=["another-audience"]),
        jwt_shaped(sub=USER, aud="another-audience"),
    ],
    ids=[
        "opaque",
        "long",
        "not-base64-json",
        "two-parts",
        "four-parts",
        "no-alg",
        "alg-none",
        "bad-charset",
        "other-audiences",
        "other-audience",
    ],
)
async def test_a_token_that_cannot_pass_review_costs_no_review(
    apiserver: tuple[Apiserver, Any], token: str
) -> None:
    """Random bearer tokens from anyone on the pod network must not each cost the apiserver a
    TokenReview: only a JWT that names this agent's audience (or none) is sent for review."""
    stand_in, api = apiserver
    auth = TokenReviewAuthenticator(api, AUDIENCE, allowed_usernames=(USER,))
    decision = await auth.authenticate(token, "GET", "/v1/status")
    assert decision.status == 401, decision
    assert stand_in.calls == []


async def test_the_decision_cache_is_bounded(apiserver: tuple[Apiserver, Any]) -> None:
    stand_in, api = apiserver
    auth = TokenReviewAuthenticator(api, AUDIENCE, target=AccessReviewTarget("rl", "worker-0"), max_kept=8)
    for i in range(40):
        token = jwt_shaped(sub=USER, aud=[AUDIENCE], jti=str(i))
        assert (await auth.authenticate(token, "GET", "/v1/status")).allowed
    assert auth.kept_decisions() <= 16, "at most 8 identities and 8 access decisions"
    # The most recent are still kept: asked again, they cost no review.
    calls = len(stand_in.calls)
    assert (await auth.authenticate(token, "GET", "/v1/status")).allowed
    assert len(stand_in.calls) == calls
