"""Bearer-token auth on every endpoint but /healthz."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, jwt_shaped

from ckpt_agent.config import AgentConfig, AuthConfig, ConfigError
from ckpt_agent.server.auth import (
    Access,
    AuthDecision,
    UserInfo,
    access_for,
    access_review,
    audience_refusal,
    bearer_token,
    decide_access_review,
    decide_token_review,
    review_failed,
    settle_refusal,
)
from ckpt_e2e.procs import PortReservation

AUTH_FAILURES = "ckpt_agent_auth_failures_total"
ENDPOINTS = [
    ("POST", "/v1/update_weights"),
    ("POST", "/v1/pause"),
    ("POST", "/v1/resume"),
    ("GET", "/v1/is_paused"),
    ("GET", "/v1/status"),
    ("POST", "/v1/infer"),
    ("GET", "/metrics"),
]


@pytest.fixture
async def guarded(tree: Tree, agent_factory: AgentFactory, tmp_path: Path) -> tuple[AgentClient, Path]:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    client = await agent_factory(source=tree.file_uri, auth=AuthConfig(token_file=token_file))
    return client, token_file


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
async def test_calls_without_a_valid_token_get_401(
    guarded: tuple[AgentClient, Path], method: str, path: str
) -> None:
    client, _ = guarded
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}):
        client.headers = headers
        code, body = await client.request(method, path, {"version": "v1"})
        assert code == 401, (headers, body)
        assert body["error"] == "Unauthorized"
        assert body["message"]


async def test_the_right_token_is_let_through_and_healthz_is_open(guarded: tuple[AgentClient, Path]) -> None:
    client, _ = guarded
    client.headers = {}
    assert (await client.request("GET", "/healthz"))[0] == 200
    client.headers = {"Authorization": "Bearer s3cret-token"}
    assert (await client.request("GET", "/v1/status"))[0] == 200
    assert (await client.request("GET", "/metrics"))[0] == 200
    assert await client.metric("ckpt_agent_auth_failures_total") == 0


async def test_rotated_token_file_is_picked_up(guarded: tuple[AgentClient, Path]) -> None:
    client, token_file = guarded
    token_file.write_text("rotated-token-value")
    os.utime(token_file, (1, 1))  # a different mtime even within one clock tick
    client.headers = {"Authorization": "Bearer s3cret-token"}
    assert (await client.request("GET", "/v1/status"))[0] == 401
    client.headers = {"Authorization": "Bearer rotated-token-value"}
    assert (await client.request("GET", "/v1/status"))[0] == 200


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("bearer abc", "abc"),
        ("Token abc", None),
    ],
)
def test_bearer_token_parsing(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


SA = "system:serviceaccount:ckpt:operator"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ({"authenticated": False, "error": "token expired"}, 401),
        (
            {
                "authenticated": True,
                "audiences": ["https://kubernetes.default.svc"],
                "user": {"username": SA},
            },
            401,
        ),
        (
            {
                "authenticated": True,
                "audiences": ["ckpt-rollout-agent"],
                "user": {"username": "system:anonymous"},
            },
            403,
        ),
        ({"authenticated": True, "audiences": ["ckpt-rollout-agent"], "user": {}}, 403),
        ({"authenticated": True, "audiences": ["ckpt-rollout-agent"], "user": {"username": SA}}, 200),
    ],
)
def test_token_review_decisions(status: dict[str, Any], code: int) -> None:
    decision = decide_token_review(status, "ckpt-rollout-agent", {SA})
    assert decision.status == code
    assert decision.reason


REVIEWED_USER = {
    "username": SA,
    "uid": "u-1",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:ckpt"],
    "extra": {"authentication.kubernetes.io/pod-name": ["op-0"]},
}


@pytest.mark.parametrize(
    ("status", "code", "user"),
    [
        ({"authenticated": False, "error": "token expired"}, 401, None),
        (
            {"authenticated": True, "audiences": ["ckpt-rollout-agent/other"], "user": REVIEWED_USER},
            401,
            None,
        ),
        ({"authenticated": True, "audiences": ["ckpt-rollout-agent/rl"], "user": {}}, 403, None),
        # Any authenticated user passes on to its SubjectAccessReview, with all it is known by.
        (
            {"authenticated": True, "audiences": ["ckpt-rollout-agent/rl"], "user": REVIEWED_USER},
            200,
            UserInfo(
                SA,
                "u-1",
                ("system:serviceaccounts", "system:serviceaccounts:ckpt"),
                (("authentication.kubernetes.io/pod-name", ("op-0",)),),
            ),
        ),
        (
            {
                "authenticated": True,
                "audiences": ["ckpt-rollout-agent/rl"],
                "user": {"username": "system:anonymous"},
            },
            200,
            UserInfo("system:anonymous"),
        ),
    ],
)
def test_token_review_decisions_for_access_review(
    status: dict[str, Any], code: int, user: UserInfo | None
) -> None:
    decision = decide_token_review(status, "ckpt-rollout-agent/rl", None)
    assert (decision.status, decision.user) == (code, user)
    assert decision.reason


OURS = ("ckpt-rollout-agent/rl", "ckpt-rollout-agent/rl/w-0")  # this agent's: namespace, pod


@pytest.mark.parametrize(
    ("token_audiences", "code"),
    [
        (["ckpt-rollout-agent/rl/w-0"], 200),  # the operator's token for this agent
        (["ckpt-rollout-agent/rl"], 200),  # a peer's (namespace-wide)
        (["ckpt-rollout-agent/rl/w-1"], 401),  # the operator's for another pod: never reused here
        (["ckpt-rollout-agent/rl/w-0x"], 401),
        (["ckpt-rollout-agent/other/w-0"], 401),
    ],
)
def test_an_agent_accepts_its_namespaces_audience_and_its_pods_own(
    token_audiences: list[str], code: int
) -> None:
    """#32 item 4: what the operator presents to one pod opens no other agent."""
    # The apiserver answers with the requested audiences the token is valid for.
    valid = [a for a in OURS if a in token_audiences]
    status = {"authenticated": bool(valid), "audiences": valid, "user": REVIEWED_USER}
    assert decide_token_review(status, OURS, None).status == code
    refusal = audience_refusal({"aud": token_audiences}, OURS)
    assert (refusal.status if refusal else 200) == code
    if refusal is not None:
        assert "'ckpt-rollout-agent/rl/w-0'" in refusal.reason


@pytest.mark.parametrize(
    ("method", "path", "access"),
    [
        ("POST", "/v1/update_weights", Access("update")),
        ("POST", "/v1/pause", Access("update")),
        ("POST", "/v1/resume", Access("update")),
        ("POST", "/v1/infer", Access("update")),  # runs the model: not for a metrics reader
        ("GET", "/v1/status", Access("get")),
        ("GET", "/v1/is_paused", Access("get")),
        ("GET", "/metrics", Access("get")),
        ("HEAD", "/v1/status", Access("get")),
        ("get", "/v1/status", Access("get")),
        ("DELETE", "/v1/status", Access("update")),  # an unknown method is not a read
        ("GET", "/v1/relay/v2/manifest.json", Access("get", "relay")),
        ("GET", "/v1/mooncake/v2/segments", Access("get", "relay")),
        ("POST", "/v1/relay/v2/anything", Access("get", "relay")),  # the relay serves reads only
    ],
)
def test_each_route_needs_one_verb_on_agents(method: str, path: str, access: Access) -> None:
    assert access_for(method, path) == access


def test_an_access_review_names_the_caller_and_this_pod() -> None:
    user = UserInfo(SA, "u-1", ("g1", "g2"), (("k", ("a", "b")),))
    assert access_review(user, Access("get", "relay"), "rl", "worker-0") == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": SA,
            "uid": "u-1",
            "groups": ["g1", "g2"],
            "extra": {"k": ["a", "b"]},
            "resourceAttributes": {
                "namespace": "rl",
                "verb": "get",
                "group": "rollout.ckpt.dev",
                "resource": "agents",
                "subresource": "relay",
                "name": "worker-0",
            },
        },
    }
    spec = access_review(UserInfo("u"), Access("update"), "rl", None)["spec"]
    assert spec == {
        "user": "u",
        "groups": [],
        "resourceAttributes": {
            "namespace": "rl",
            "verb": "update",
            "group": "rollout.ckpt.dev",
            "resource": "agents",
        },
    }


@pytest.mark.parametrize(
    ("status", "access", "code", "reason"),
    [
        ({"allowed": True}, Access("update"), 200, "access review"),
        ({"allowed": True, "denied": True}, Access("update"), 403, None),
        (
            {"allowed": False},
            Access("update"),
            403,
            f"user {SA!r} may not update agents.rollout.ckpt.dev in namespace 'rl'",
        ),
        (
            {"allowed": False, "reason": "no RBAC policy matched"},
            Access("get", "relay"),
            403,
            f"user {SA!r} may not get agents/relay.rollout.ckpt.dev in namespace 'rl' "
            "(no RBAC policy matched)",
        ),
        ({}, Access("get"), 403, f"user {SA!r} may not get agents.rollout.ckpt.dev in namespace 'rl'"),
    ],
)
def test_access_review_decisions(
    status: dict[str, Any], access: Access, code: int, reason: str | None
) -> None:
    decision = decide_access_review(status, UserInfo(SA), access, "rl")
    assert decision.status == code
    if reason is not None:
        assert decision.reason == reason


@pytest.mark.parametrize(
    ("http_status", "code", "reason"),
    [
        (None, 503, "token review unavailable"),  # no connection: the apiserver is away
        (500, 503, "token review unavailable (HTTP 500)"),
        (503, 503, "token review unavailable (HTTP 503)"),
        (429, 503, "token review unavailable (HTTP 429)"),
        (403, 401, "token review refused (HTTP 403)"),  # the agent's own RBAC: not transient
        (401, 401, "token review refused (HTTP 401)"),
    ],
)
def test_a_token_review_without_an_answer_is_transient_only_when_the_apiserver_is(
    http_status: int | None, code: int, reason: str
) -> None:
    assert review_failed(http_status) == AuthDecision(code, reason)


@pytest.mark.parametrize(
    ("http_status", "code", "reason"),
    [
        (None, 503, "access review unavailable"),
        (504, 503, "access review unavailable (HTTP 504)"),
        (403, 403, "access review refused (HTTP 403)"),  # the agent lacks subjectaccessreviews create
    ],
)
def test_an_access_review_without_an_answer(http_status: int | None, code: int, reason: str) -> None:
    assert review_failed(http_status, "access review", refused=403) == AuthDecision(code, reason)


DENIED = AuthDecision(403, "user 'u' may not update agents.rollout.ckpt.dev in namespace 'rl'", "u")
INVALID = AuthDecision(401, "token review: token not authenticated")


@pytest.mark.parametrize(
    ("refusal", "readyz", "expected"),
    [
        (DENIED, 200, DENIED),  # a ready apiserver's refusal stands
        (INVALID, 200, INVALID),
        (
            DENIED,
            500,  # e.g. its etcd away, or post-start hooks (RBAC bootstrap) still running
            AuthDecision(
                503, f"unsettled, the apiserver is not ready (readyz: HTTP 500): {DENIED.reason}", "u"
            ),
        ),
        (
            INVALID,
            403,  # right after a restart even /readyz's own grant may not be loaded yet
            AuthDecision(503, f"unsettled, the apiserver is not ready (readyz: HTTP 403): {INVALID.reason}"),
        ),
        (
            DENIED,
            None,
            AuthDecision(
                503, f"unsettled, the apiserver is not ready (readyz: no answer): {DENIED.reason}", "u"
            ),
        ),
        (AuthDecision(200, "access review", "u"), 500, AuthDecision(200, "access review", "u")),
    ],
)
def test_only_a_ready_apiservers_refusal_stands(
    refusal: AuthDecision, readyz: int | None, expected: AuthDecision
) -> None:
    assert settle_refusal(refusal, readyz) == expected


async def test_an_agent_whose_apiserver_is_away_answers_503_auth_unavailable(
    tree: Tree, agent_factory: AgentFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apiserver's port refuses connections (held, nobody listening): the agent cannot
    review the caller's token, so it says so as a retryable 503, not as a 401 that would fail
    the caller's rollout, and it does nothing."""
    with PortReservation(1) as held:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{held.ports[0]}'}}}}]\n"
            "users: [{name: u, user: {token: agent}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        client = await agent_factory(
            source=tree.file_uri,
            auth=AuthConfig(tokenreview_audience="ckpt-rollout-agent", allowed_usernames=(SA,)),
            token=jwt_shaped(sub=SA, aud=["ckpt-rollout-agent"]),
        )
        service = client.agent.service
        live_before = service.live
        code, body = await client.update("v2")
        assert (code, body["error"]) == (503, "AuthUnavailable"), body
        assert body["message"] == "token review unavailable"
        assert service.live is live_before, "nothing was loaded"
        registry = service.metrics.registry
        assert registry.get_sample_value(AUTH_FAILURES, {"reason": "unavailable"}) == 1
        assert registry.get_sample_value(AUTH_FAILURES, {"reason": "invalid"}) is None


@pytest.mark.parametrize(
    "auth",
    [
        AuthConfig(),
        AuthConfig(token_file=Path("/t"), disabled=True),
        AuthConfig(token_file=Path("/t"), tokenreview_audience="aud", allowed_usernames=(SA,)),
        AuthConfig(allowed_usernames=(SA,), disabled=True),
    ],
)
def test_auth_must_be_chosen_explicitly(auth: AuthConfig) -> None:
    with pytest.raises(ConfigError):
        AgentConfig(auth=auth).validate()


@pytest.mark.parametrize(
    ("auth", "namespace", "message"),
    [
        # SubjectAccessReview asks about this pod's namespace: it must be known.
        (AuthConfig(tokenreview_audience="aud"), None, "set POD_NAMESPACE"),
        # The relay allow-list belongs to the allow-list fallback; RBAC grants agents/relay.
        (AuthConfig(tokenreview_audience="aud", relay_usernames=(SA,)), "rl", "agents/relay"),
    ],
)
def test_access_review_mode_needs_its_namespace(
    auth: AuthConfig, namespace: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        AgentConfig(auth=auth, pod_namespace=namespace).validate()


@pytest.mark.parametrize(
    ("auth", "access_review"),
    [
        (AuthConfig(tokenreview_audience="aud"), True),
        (AuthConfig(tokenreview_audience="aud", allowed_usernames=(SA,)), False),
        (AuthConfig(token_file=Path("/t")), False),
        (AuthConfig(disabled=True), False),
    ],
)
def test_access_review_is_the_default_with_tokenreview(auth: AuthConfig, access_review: bool) -> None:
    assert auth.access_review is access_review


@pytest.mark.parametrize(
    "header",
    [b"Bearer \xff\xfe\xfd", "Bearer s3cret-tokén".encode(), b"Bearer \x00", b"\xc3\x28"],
    ids=["not-utf8", "non-ascii", "nul", "bad-scheme-bytes"],
)
async def test_an_authorization_header_of_odd_bytes_gets_401_not_500(
    guarded: tuple[AgentClient, Path], header: bytes
) -> None:
    """Raw bytes on the wire (a client library would refuse to send them): whatever the header
    holds, a token that is not the right one is refused with a reason."""
    client, _ = guarded
    host, port = client.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"GET /v1/status HTTP/1.1\r\nHost: agent\r\nAuthorization: "
            + header
            + b"\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.split()[1] in (b"400", b"401"), reply[:300]
    assert b"Traceback" not in rest
