"""Who may do what to an agent on the local control plane (real TokenReviews): a worker's token
for the agents' audience (what its agent presents to the peers it pulls from) reads another
agent's relay and nothing else; the operator's token does everything."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from kubernetes import client

from ckpt_api.constants import DEFAULT_AGENT_AUDIENCE
from ckpt_e2e.rollout_env import http_json
from ckpt_e2e.rollout_fixtures import Fleet
from ckpt_e2e.serviceaccounts import WORKER_ACCOUNT, ChartAccounts, mint_token

pytestmark = pytest.mark.integration


def _call(url: str, token: str, body: object = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_workers_token_reads_the_relay_and_cannot_reload_or_pause(
    fleet_factory: Callable[..., Fleet],
    chart_accounts: ChartAccounts,
    k8s_api: client.ApiClient,
    namespace: str,
) -> None:
    fleet = fleet_factory(1)
    (worker,) = fleet.workers(1)
    peer = mint_token(k8s_api, namespace, WORKER_ACCOUNT, [DEFAULT_AGENT_AUDIENCE])

    code, manifest = _call(worker.url("/v1/relay/v1/manifest.json"), peer)
    assert code == 200, manifest
    assert json.loads(manifest)["version"] == "v1"
    for path, body in (("/v1/update_weights", {"version": "v2"}), ("/v1/pause", {}), ("/v1/status", None)):
        code, refused = _call(worker.url(path), peer, body)
        assert code == 403, (path, refused)
        assert json.loads(refused) == {
            "error": "Forbidden",
            "message": f"user {chart_accounts.worker_username!r} may only read this agent's relay",
        }
    # Nothing changed: still v1, not paused; the operator's token still does everything.
    status = http_json(worker.url("/v1/status"), token=fleet.token)
    assert (status["version"], status["paused_by"]) == ("v1", [])
