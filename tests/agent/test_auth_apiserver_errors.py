"""An apiserver that answers a review with an error status (500, 429, 503) has given no verdict:
the agent says AuthUnavailable (503, ask again), never the 401/403 that fails a worker for good.
The apiserver here is a stand-in on 127.0.0.1 because a real one cannot be made to answer 500
or 429 to one review on demand; the client and the agent's code are the real ones."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from ckpt_agent.server.auth import AccessReviewTarget, AuthDecision, TokenReviewAuthenticator

AUDIENCE = "ckpt-rollout-agent"
USER = "system:serviceaccount:ckpt-rollout-system:ckpt-operator"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Apiserver:
    """Answers each review with the status set for it; a 200 carries a verdict that allows."""

    def __init__(self) -> None:
        self.answers = {TOKEN_REVIEWS: 200, ACCESS_REVIEWS: 200}
        self.calls: list[str] = []
        self.authenticated = True

    async def review(self, request: web.Request) -> web.Response:
        self.calls.append(request.path)
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
            status = {"allowed": True}
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
    decision = await auth.authenticate("a-token", "POST", "/v1/update_weights")
    assert decision == AuthDecision(503, f"token review unavailable (HTTP {code})")
    # Not cached: once the apiserver answers again, the same token is let through.
    stand_in.answers[TOKEN_REVIEWS] = 200
    assert (await auth.authenticate("a-token", "POST", "/v1/update_weights")).allowed


@pytest.mark.parametrize("code", [500, 429])
async def test_an_access_review_answered_with_an_error_status_is_unavailable(
    apiserver: tuple[Apiserver, Any], code: int
) -> None:
    stand_in, api = apiserver
    stand_in.answers[ACCESS_REVIEWS] = code
    auth = TokenReviewAuthenticator(api, AUDIENCE, target=AccessReviewTarget("rl", "worker-0"))
    decision = await auth.authenticate("a-token", "POST", "/v1/update_weights")
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
    decision = await auth.authenticate("a-token", "POST", "/v1/update_weights")
    assert decision == AuthDecision(401, "token review: token expired")
