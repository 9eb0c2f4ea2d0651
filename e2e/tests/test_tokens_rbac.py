"""ServiceAccount tokens and RBAC on the real apiserver: what the agent's auth relies on."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ckpt_e2e.procs import wait_for
from ckpt_e2e.serviceaccounts import TOKEN_SECONDS, ChartAccounts

pytestmark = pytest.mark.integration

AUDIENCE = "ckpt-agent"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _claims(token: str) -> dict[str, Any]:
    return dict(json.loads(_unb64url(token.split(".")[1])))


def _resign_with_own_key(token: str, claims: dict[str, Any]) -> str:
    """Same header (alg, kid) and the given claims, signed ES256 with a key the cluster never saw."""
    header = token.split(".")[0]
    signing_input = f"{header}.{_b64url(json.dumps(claims).encode())}".encode()
    der = ec.generate_private_key(ec.SECP256R1()).sign(signing_input, ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return f"{signing_input.decode()}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _review(auth: client.AuthenticationV1Api, token: str, audiences: list[str]) -> Any:
    review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
    return auth.create_token_review(review).status


def _pod(name: str, service_account: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "token-holder"}),
        spec=client.V1PodSpec(
            service_account_name=service_account,
            containers=[client.V1Container(name="worker", image="worker")],
        ),
    )


def test_pod_bound_token_with_custom_audience_passes_token_review(
    k8s_api: client.ApiClient, namespace: str
) -> None:
    core, auth = client.CoreV1Api(k8s_api), client.AuthenticationV1Api(k8s_api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="operator"))
    )
    pod = core.create_namespaced_pod(namespace, _pod("holder", "operator"))
    # What the kubelet does for a projected token volume: TokenRequest bound to the pod.
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[AUDIENCE],
            expiration_seconds=600,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name="holder", uid=pod.metadata.uid
            ),
        )
    )
    token = core.create_namespaced_service_account_token("operator", namespace, request).status.token

    status = _review(auth, token, [AUDIENCE])
    assert status.authenticated is True, status.error
    assert status.user.username == f"system:serviceaccount:{namespace}:operator"
    assert status.audiences == [AUDIENCE]
    assert status.user.extra["authentication.kubernetes.io/pod-name"] == ["holder"]

    assert not _review(auth, token, ["someone-else"]).authenticated, "audience must be checked"

    claims = _claims(token)
    header, _, signature = token.split(".")
    escalated = {**claims, "sub": f"system:serviceaccount:{namespace}:default"}
    tampered = f"{header}.{_b64url(json.dumps(escalated).encode())}.{signature}"
    assert not _review(auth, tampered, [AUDIENCE]).authenticated, "tampered claims accepted"
    forged = _resign_with_own_key(token, claims)
    assert not _review(auth, forged, [AUDIENCE]).authenticated, "foreign signature accepted"

    # A pod-bound token dies with its pod (the apiserver checks the bound object's uid).
    core.delete_namespaced_pod("holder", namespace)
    wait_for(
        lambda: not _review(auth, token, [AUDIENCE]).authenticated,
        30,
        "the token of the deleted pod to be rejected",
    )


def test_rbac_denies_service_account_without_a_role(k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    token = core.create_namespaced_service_account_token("nobody", namespace, request).status.token

    as_sa = client.Configuration()
    as_sa.host = k8s_api.configuration.host
    as_sa.ssl_ca_cert = k8s_api.configuration.ssl_ca_cert
    as_sa.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(as_sa) as sa_api:
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(sa_api).list_namespaced_pod(namespace)
        assert denied.value.status == 403

        rbac = client.RbacAuthorizationV1Api(k8s_api)
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="pod-reader"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="nobody-reads-pods"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"
                ),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="nobody", namespace=namespace)],
            ),
        )
        # RBAC reads bindings from an informer cache: allow it to observe the new binding.
        wait_for(lambda: _can_list_pods(sa_api, namespace), 10, "RBAC to grant pods/list")


def _allowed(call: Callable[[], object]) -> bool:
    """The call went through (False: the apiserver answered 403 Forbidden)."""
    try:
        call()
    except ApiException as exc:
        if exc.status != 403:
            raise
        return False
    return True


def _can_list_pods(api: client.ApiClient, namespace: str) -> bool:
    return _allowed(lambda: client.CoreV1Api(api).list_namespaced_pod(namespace))


def _api_from(kubeconfig: Any) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return api


def _whoami(api: client.ApiClient) -> str:
    review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
    return str(review.status.user_info.username)


def _can_read_secrets(api: client.ApiClient, namespace: str) -> bool:
    return _allowed(lambda: client.CoreV1Api(api).list_namespaced_secret(namespace))


def test_chart_accounts_are_their_service_accounts_with_the_charts_rbac_only(
    chart_accounts: ChartAccounts,
) -> None:
    """What the operator and agent processes of the e2e tier run with: their own tokens, scoped
    by the chart's Roles, not the admin credential."""
    namespace = chart_accounts.namespace
    operator_kubeconfig = chart_accounts.operator_kubeconfig
    with _api_from(operator_kubeconfig) as operator, _api_from(chart_accounts.worker_kubeconfig) as worker:
        assert _whoami(operator) == chart_accounts.operator_username
        assert _whoami(worker) == chart_accounts.worker_username
        # watchNamespaces: a Role in the operator's namespace, nothing outside it.
        assert _can_list_pods(operator, namespace)
        assert not _can_list_pods(operator, "kube-system")
        assert not _can_list_pods(worker, namespace), "agents get their own pod, never list"
        assert not _can_read_secrets(operator, namespace)
        assert not _can_read_secrets(worker, namespace)
        # Cluster-scoped: the agents check the operator's token.
        assert _review(client.AuthenticationV1Api(worker), "not-a-token", []).authenticated is not True

    token = yaml.safe_load(operator_kubeconfig.read_text())["users"][0]["user"]["token"]
    claims = _claims(token)
    assert claims["exp"] - claims["iat"] == TOKEN_SECONDS
