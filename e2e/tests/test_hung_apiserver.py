"""A hung apiserver (SIGSTOP: connections accepted, never answered) on the local control plane:
an agent whose TokenReview cannot be answered says so within its documented bound (503
AuthUnavailable with Retry-After, ckpt_agent.server.auth.TOKENREVIEW_TIMEOUT_S) instead of holding the
caller, and answers normally once the apiserver is back. The leader election's side of a hung
apiserver is in test_leader_lease.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from kubernetes import client

from ckpt_agent.server.auth import TOKENREVIEW_TIMEOUT_S
from ckpt_api.constants import agent_audience
from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.rollout_env import http_json, urlopen
from ckpt_e2e.rollout_fixtures import Fleet
from ckpt_e2e.serviceaccounts import OPERATOR_ACCOUNT, mint_token

pytestmark = pytest.mark.integration

# The client gives up here: an agent holding the request longer than its bound fails the test.
CLIENT_WAIT_S = TOKENREVIEW_TIMEOUT_S + 10


def test_an_agent_answers_within_its_tokenreview_bound_while_the_apiserver_hangs(
    cluster: ClusterHandle, fleet_factory: Callable[..., Fleet], k8s_api: client.ApiClient, namespace: str
) -> None:
    assert cluster.local is not None, "freezes the local control plane's apiserver"
    fleet = fleet_factory(1)
    (worker,) = fleet.workers(1)
    # A token the agent has not reviewed yet (its cache would answer a known one).
    fresh = mint_token(k8s_api, namespace, OPERATOR_ACCOUNT, [agent_audience(namespace)])
    request = urllib.request.Request(worker.url("/v1/status"), headers={"Authorization": f"Bearer {fresh}"})
    with cluster.local.apiserver_frozen():
        with pytest.raises(urllib.error.HTTPError) as refused:
            urlopen(request, CLIENT_WAIT_S)
        assert refused.value.code == 503
        assert refused.value.headers["Retry-After"] == "1"
        body = json.loads(refused.value.read())
        assert body["error"] == "AuthUnavailable"
        assert "token review unavailable" in body["message"]
    status = http_json(worker.url("/v1/status"), token=fresh, timeout=CLIENT_WAIT_S)
    assert status["version"] == "v1"
