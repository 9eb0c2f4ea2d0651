"""Scoped agent credentials and RBAC authorization on the local control plane (#16, #32): the
operator mints a token per agent (audience ckpt-rollout-agent/<namespace>/<pod>) that no other
agent accepts, and agents obey only callers the chart's RBAC grants (SubjectAccess-
Review on agents.rollout.ckpt.dev), the allow-list being the explicit fallback."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client

from ckpt_api.constants import agent_audience, agent_pod_audience
from ckpt_e2e.catalog import model_flags
from ckpt_e2e.fixtures import ClusterHandle, fresh_namespace
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.podruntime import PodRuntime
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import (
    WORKER_LABEL,
    AgentOptions,
    CheckpointSource,
    MintedAgentTokens,
    OperatorProcess,
    Rollouts,
    Worker,
    http_call,
    ready_workers,
    rollout_spec,
    serving_versions,
    worker_deployment,
)
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity
from ckpt_e2e.serviceaccounts import (
    OPERATOR_ACCOUNT,
    WORKER_ACCOUNT,
    ChartAccounts,
    chart_accounts,
    chart_settings,
    mint_token,
    render_chart,
)
from ckpt_rollout.io.agent_tokens import TOKEN_REQUEST_TIMEOUT_S, AgentTokenUnavailable, TokenRequestTokens

pytestmark = pytest.mark.integration

LABELS = {"app": WORKER_LABEL, "fleet": "scoped"}


@contextmanager
def _one_worker(
    api: client.ApiClient, kubectl: Kubectl, accounts: ChartAccounts, source: CheckpointSource, logs: Path
) -> Iterator[Worker]:
    """One worker pod in ``kubectl``'s namespace running a real agent as the chart's worker
    account there, authorizing by SubjectAccessReview (the harness's default)."""
    namespace = kubectl.namespace
    assert namespace is not None
    kubectl.apply(worker_deployment("scoped", 1, LABELS, WORKER_ACCOUNT))
    options = AgentOptions(
        source_url=source.url,
        initial_version="v1",
        kubeconfig=accounts.worker_kubeconfig_for,
        relay_token=accounts.worker_relay_token_for,
        extra_args=model_flags(False),
    )
    with PodRuntime(api, namespace, f"app={WORKER_LABEL},fleet=scoped", options.launch, logs) as runtime:
        token = mint_token(api, accounts.namespace, OPERATOR_ACCOUNT, [agent_audience(namespace)])
        (worker,) = ready_workers(runtime, 1, token)
        yield worker


def test_a_token_for_one_namespace_opens_no_agent_of_another(
    cluster: ClusterHandle,
    k8s_api: client.ApiClient,
    kubectl: Kubectl,
    namespace: str,
    crd_installed: None,
    checkpoint_source: CheckpointSource,
    tmp_path: Path,
) -> None:
    """One operator, workers in two namespaces: what it would present in A is refused by B's
    agent and taken by A's; its rollouts in both namespaces succeed."""
    with (
        fresh_namespace(k8s_api, "scoped-b") as other,
        chart_accounts(k8s_api, kubectl, cluster.kubeconfig, tmp_path / "accounts", also=[other]) as accounts,
        _one_worker(k8s_api, kubectl, accounts, checkpoint_source, tmp_path / "pods-a") as worker_a,
        _one_worker(
            k8s_api, cluster.kubectl.in_namespace(other), accounts, checkpoint_source, tmp_path / "pods-b"
        ) as worker_b,
    ):
        # A token of the operator's account for A's agents, minted as the operator mints it.
        token_a = mint_token(k8s_api, namespace, OPERATOR_ACCOUNT, [agent_audience(namespace)])
        code, body = http_call(worker_b.url("/v1/status"), token_a)
        assert code == 401, body
        assert json.loads(body)["error"] == "Unauthorized"
        code, body = http_call(worker_a.url("/v1/status"), token_a)
        assert code == 200, body
        # What the operator presents to one agent (#32 item 4): taken by that pod's agent; one
        # for another pod (a pod that merely matched a selector received it) is refused.
        own, other_pod = (
            mint_token(
                k8s_api, namespace, OPERATOR_ACCOUNT, [agent_pod_audience(agent_audience(namespace), pod)]
            )
            for pod in (worker_a.name, "not-this-pod")
        )
        assert http_call(worker_a.url("/v1/status"), own)[0] == 200
        code, body = http_call(worker_a.url("/v1/status"), other_pod)
        assert code == 401, body
        assert "not valid for audience" in json.loads(body)["message"], body
        # The same operator reaches both namespaces' agents, each with its own token.
        operator = OperatorProcess(
            accounts.operator_kubeconfig,
            namespace,
            MintedAgentTokens(namespace, OPERATOR_ACCOUNT),
            tmp_path / "operator",
            extra_args=["--namespace", other],
        ).start()
        try:
            for ns in (namespace, other):
                Rollouts(k8s_api, ns).create("fleet", rollout_spec(checkpoint_source.url, "v2", LABELS))
            for ns, worker in ((namespace, worker_a), (other, worker_b)):
                status = Rollouts(k8s_api, ns).wait_phase("fleet", {"Succeeded", "Failed"}, 120, "v2")
                assert status["phase"] == "Succeeded", status
                token = mint_token(k8s_api, namespace, OPERATOR_ACCOUNT, [agent_audience(ns)])
                versions = {"v2": checkpoint_source.version_dir("v2")}
                assert serving_versions([worker], token, versions) == {worker.name: "v2"}
        finally:
            operator.stop()


def _service_account(api: client.ApiClient, namespace: str, name: str) -> str:
    """A new ServiceAccount's token for ``namespace``'s agents."""
    client.CoreV1Api(api).create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    return mint_token(api, namespace, name, [agent_audience(namespace)])


def _can(api: client.ApiClient, namespace: str, account: str, verb: str) -> bool:
    """What `kubectl auth can-i VERB agents.rollout.ckpt.dev --as=system:serviceaccount:NS:ACCOUNT` says."""
    attributes = client.V1ResourceAttributes(
        namespace=namespace, verb=verb, group="rollout.ckpt.dev", resource="agents"
    )
    spec = client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{namespace}:{account}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
        resource_attributes=attributes,
    )
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        client.V1SubjectAccessReview(spec=spec)
    )
    return bool(review.status.allowed)


def _message(answer: tuple[int, bytes]) -> tuple[int, str]:
    return answer[0], str(json.loads(answer[1])["message"])


def test_only_identities_the_chart_grants_are_obeyed(
    fleet_factory: Callable[..., Fleet],
    chart_accounts: ChartAccounts,
    kubectl: Kubectl,
    k8s_api: client.ApiClient,
    namespace: str,
) -> None:
    """A valid token of an account without the grant is refused (403 naming the verb and the
    resource); once the chart's agentAuth.metricsReaders names it, it may read and still not
    pause; the operator (update agents) may."""
    fleet = fleet_factory(1)
    (worker,) = fleet.workers(1)
    reader = _service_account(k8s_api, namespace, "metrics-reader")
    user = f"system:serviceaccount:{namespace}:metrics-reader"
    denied_get = f"user {user!r} may not get agents.rollout.ckpt.dev in namespace {namespace!r}"
    denied_update = f"user {user!r} may not update agents.rollout.ckpt.dev in namespace {namespace!r}"

    code, message = _message(http_call(worker.url("/v1/status"), reader))
    assert (code, message.split(" (")[0]) == (403, denied_get)
    assert not _can(k8s_api, namespace, "metrics-reader", "get")

    grant = [
        *chart_settings(namespace),
        "agentAuth.metricsReaders[0].kind=ServiceAccount",
        "agentAuth.metricsReaders[0].name=metrics-reader",
    ]
    kubectl.apply(render_chart(chart_accounts.release, namespace, ["templates/worker-rbac.yaml"], grant))
    wait_for(lambda: _can(k8s_api, namespace, "metrics-reader", "get"), 30, "RBAC to grant the reader")
    assert not _can(k8s_api, namespace, "metrics-reader", "update")
    # The agent keeps a refusal 5 s: bounded wait for its next review.
    wait_for(lambda: http_call(worker.url("/v1/status"), reader)[0] == 200, 30, "the reader let in")
    assert http_call(worker.url("/metrics"), reader)[0] == 200
    code, message = _message(http_call(worker.url("/v1/pause"), reader, {}))
    assert (code, message.split(" (")[0]) == (403, denied_update)

    assert http_call(worker.url("/v1/pause"), fleet.token, {})[0] == 200
    assert http_call(worker.url("/v1/resume"), fleet.token, {})[0] == 200


def test_a_refusal_from_an_apiserver_that_is_not_ready_is_no_verdict(
    fleet_factory: Callable[..., Fleet], cluster: ClusterHandle, k8s_api: client.ApiClient, namespace: str
) -> None:
    """While the apiserver's /readyz fails (its etcd frozen; after a restart its RBAC caches
    fill the same way) a caller it refuses gets 503 AuthUnavailable, to call again, not a 403
    that would fail a rollout's worker for good; once it is ready the same refusal is a 403."""
    assert cluster.local is not None, "freezes the local control plane's etcd"
    fleet = fleet_factory(1)
    (worker,) = fleet.workers(1)
    # Two accounts without the grant: the agent keeps a refusal 5 s, so each phase has its own.
    early = _service_account(k8s_api, namespace, "unbound-early")
    late = _service_account(k8s_api, namespace, "unbound-late")
    assert http_call(worker.url("/v1/status"), early)[0] == 403
    admin = cluster.local.admin_api()
    with cluster.local.etcd_frozen():
        wait_for(lambda: not admin.ok("/readyz"), 30, "the apiserver's /readyz to fail")
        code, body = http_call(worker.url("/v1/status"), late)
        assert code == 503, body
        answer = json.loads(body)
        assert answer["error"] == "AuthUnavailable"
        assert answer["message"].startswith("unsettled, the apiserver is not ready (readyz: HTTP 500)")
        assert "may not get agents.rollout.ckpt.dev" in answer["message"]
        assert http_call(worker.url("/v1/status"), fleet.token)[0] == 200, "a granted caller still passes"
    code, body = http_call(worker.url("/v1/status"), late)
    assert code == 403, body


def test_the_allow_list_fallback_ignores_rbac(
    fleet_factory: Callable[..., Fleet],
    operator_identity: OperatorIdentity,
    k8s_api: client.ApiClient,
    namespace: str,
) -> None:
    """--allowed-usernames: only the operator, whatever RBAC grants others."""
    fleet = fleet_factory(1, allowed_username=operator_identity.username)
    (worker,) = fleet.workers(1)
    other = _service_account(k8s_api, namespace, "someone")
    code, message = _message(http_call(worker.url("/v1/status"), other))
    assert (code, message) == (
        403,
        f"user 'system:serviceaccount:{namespace}:someone' is not allowed to call this agent",
    )
    assert http_call(worker.url("/v1/status"), fleet.token)[0] == 200


async def test_the_operator_mints_one_token_per_agent_and_renews_it_before_expiry(
    chart_accounts: ChartAccounts, k8s_api: client.ApiClient, namespace: str
) -> None:
    """TokenRequestTokens as the operator runs it, with the chart's operator account (its RBAC:
    tokens of itself only): one token per agent, kept until 80% of its lifetime, for that pod's
    audience alone (an agent accepts its namespace's audience and its own pod's, #32 item 4);
    another account's tokens are refused with the apiserver's status."""
    from kubernetes_asyncio import config as async_config

    def audiences_of(ns: str, pod: str) -> list[str]:
        """What that pod's agent reviews a token for."""
        return [agent_audience(ns), agent_pod_audience(agent_audience(ns), pod)]

    now = [0.0]
    api = await async_config.new_client_from_config(config_file=str(chart_accounts.operator_kubeconfig))
    try:
        tokens = TokenRequestTokens(api, (namespace, OPERATOR_ACCOUNT), seconds=600, clock=lambda: now[0])
        first = await tokens.for_agent(namespace, "w-0")
        assert await tokens.for_agent(namespace, "w-0") == first
        neighbour = await tokens.for_agent(namespace, "w-1")
        elsewhere = await tokens.for_agent("elsewhere", "w-0")
        assert tokens.minted == 3
        now[0] = 479.0  # just before 80% of 600 s
        assert await tokens.for_agent(namespace, "w-0") == first
        now[0] = 481.0
        renewed = await tokens.for_agent(namespace, "w-0")
        assert tokens.minted == 4
        assert renewed != first

        authn = client.AuthenticationV1Api(k8s_api)

        def authenticated(token: str, audiences: list[str]) -> bool:
            spec = client.V1TokenReviewSpec(token=token, audiences=audiences)
            status = authn.create_token_review(client.V1TokenReview(spec=spec)).status
            assert not status.authenticated or status.user.username == chart_accounts.operator_username
            return bool(status.authenticated)

        assert authenticated(renewed, audiences_of(namespace, "w-0"))
        assert authenticated(neighbour, audiences_of(namespace, "w-1"))
        assert authenticated(elsewhere, audiences_of("elsewhere", "w-0"))
        # Refused by every other agent: of its namespace, and of another namespace.
        assert not authenticated(neighbour, audiences_of(namespace, "w-0"))
        assert not authenticated(elsewhere, audiences_of(namespace, "w-0"))

        foreign = TokenRequestTokens(api, (namespace, WORKER_ACCOUNT))
        with pytest.raises(AgentTokenUnavailable, match="HTTP 403"):
            await foreign.for_agent(namespace, "w-0")
    finally:
        await api.close()


async def test_a_token_whose_renewal_hangs_is_presented_until_it_expires_and_no_longer(
    cluster: ClusterHandle, chart_accounts: ChartAccounts, namespace: str
) -> None:
    """A hung apiserver: the renewal gives up within TOKEN_REQUEST_TIMEOUT_S; the token it held
    is still presented while valid, and once expired the call fails instead of sending it."""
    from kubernetes_asyncio import config as async_config

    assert cluster.local is not None, "freezes the local control plane's apiserver"
    now = [0.0]
    api = await async_config.new_client_from_config(config_file=str(chart_accounts.operator_kubeconfig))
    try:
        tokens = TokenRequestTokens(api, (namespace, OPERATOR_ACCOUNT), seconds=600, clock=lambda: now[0])
        held = await tokens.for_agent(namespace, "w-0")
        with cluster.local.apiserver_frozen():
            now[0] = 500.0  # renewal due (480), still valid (600)
            started = time.monotonic()
            assert await tokens.for_agent(namespace, "w-0") == held
            assert time.monotonic() - started < TOKEN_REQUEST_TIMEOUT_S + 5
            now[0] = 601.0
            with pytest.raises(AgentTokenUnavailable):
                await tokens.for_agent(namespace, "w-0")
        assert tokens.minted == 1
        assert await tokens.for_agent(namespace, "w-0") != held  # the apiserver is back
    finally:
        await api.close()
