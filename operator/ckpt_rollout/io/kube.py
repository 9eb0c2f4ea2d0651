"""The few Kubernetes API calls the operator makes outside kopf: status reads and writes, and the
Warning events of a worker pod that cannot start."""

from typing import Any

from kubernetes_asyncio import client, config

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_rollout.io.metrics import API_REQUESTS

MERGE_PATCH = "application/merge-patch+json"


async def load_api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG (local runs, tests)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()


# One CR read or status write: a hung apiserver must not hold a rollout's loop (the loop retries).
API_TIMEOUT_S = 15.0


class RolloutApi:
    """Reads and merge-patches CheckpointRollouts, reads pods' Warning events; counts requests for
    the control-plane bench."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._client = api_client
        self._api = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.requests = 0

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        self.requests += 1
        API_REQUESTS.labels("get").inc()
        obj: dict[str, Any] = await self._api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=API_TIMEOUT_S
        )
        return obj

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        API_REQUESTS.labels("patch").inc()
        obj: dict[str, Any] = await self._api.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
            _request_timeout=API_TIMEOUT_S,
        )
        return obj

    async def pod_warnings(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The Warning events about the pod with ``uid`` (core/v1, as JSON)."""
        self.requests += 1
        API_REQUESTS.labels("events").inc()
        events = await self._core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.uid={uid},type=Warning",
            _request_timeout=API_TIMEOUT_S,
        )
        found: list[dict[str, Any]] = self._client.sanitize_for_serialization(events).get("items") or []
        return found
