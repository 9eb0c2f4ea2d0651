"""Who may do what to an agent on the local control plane (real TokenReviews and
SubjectAccessReviews): a worker's token for its namespace's agents (what its agent presents to
the peers it pulls from) reads another agent's relay and nothing else, by the chart's RBAC
(`get agents/relay`) or, with the allow-list fallback, by --relay-allowed-usernames; the
operator's token does everything."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kubernetes import client

from ckpt_api.constants import agent_audience
from ckpt_e2e.rollout_env import http_call, http_json
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity
from ckpt_e2e.serviceaccounts import WORKER_ACCOUNT, ChartAccounts, mint_token

pytestmark = pytest.mark.integration

CONTROL: tuple[tuple[str, object], ...] = (
    ("/v1/update_weights", {"version": "v2"}),
    ("/v1/pause", {}),
    ("/v1/status", None),
)


def _refusals(worker_url: Callable[[str], str], token: str) -> dict[str, tuple[int, str]]:
    refused = {}
    for path, body in CONTROL:
        code, answer = http_call(worker_url(path), token, body)
        refused[path] = (code, json.loads(answer)["message"])
    return refused


@pytest.mark.parametrize("authorization", ["access-review", "allow-list"])
def test_a_workers_token_reads_the_relay_and_cannot_reload_or_pause(
    fleet_factory: Callable[..., Fleet],
    chart_accounts: ChartAccounts,
    operator_identity: OperatorIdentity,
    k8s_api: client.ApiClient,
    namespace: str,
    authorization: str,
) -> None:
    fallback = operator_identity.username if authorization == "allow-list" else None
    fleet = fleet_factory(1, allowed_username=fallback)
    (worker,) = fleet.workers(1)
    peer = mint_token(k8s_api, namespace, WORKER_ACCOUNT, [agent_audience(namespace)])

    code, manifest = http_call(worker.url("/v1/relay/v1/manifest.json"), peer)
    assert code == 200, manifest
    assert json.loads(manifest)["version"] == "v1"
    user = chart_accounts.worker_username
    if fallback is None:
        # Each refusal names what RBAC would have to grant.
        update, get = (f"user {user!r} may not {verb} agents.rollout.ckpt.dev in namespace {namespace!r}"
                       for verb in ("update", "get"))  # fmt: skip
        expected = {"/v1/update_weights": update, "/v1/pause": update, "/v1/status": get}
    else:
        expected = {path: f"user {user!r} may only read this agent's relay" for path, _ in CONTROL}
    refused = _refusals(worker.url, peer)
    assert {path: code for path, (code, _) in refused.items()} == {path: 403 for path, _ in CONTROL}
    assert {path: message.split(" (")[0] for path, (_, message) in refused.items()} == expected
    # Nothing changed: still v1, not paused; the operator's token still does everything.
    status = http_json(worker.url("/v1/status"), token=fleet.token)
    assert (status["version"], status["paused_by"]) == ("v1", [])
