"""The ConfigMaps rollouts take their version from (spec.versionFrom), each followed by a
list+watch of that one name.

A field selector per followed name, not a watch on every ConfigMap: namespaces hold many
large ConfigMaps no rollout reads, and the operator keeps none of them. A trainer's write
reaches the rollouts that name the ConfigMap within one watch event."""

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_rollout.domain.version_source import ConfigMapState
from ckpt_rollout.io.watchstream import LIST_TIMEOUT_S, follow, list_body

log = logging.getLogger(__name__)

RETRY_S = 2.0
FORBIDDEN_RETRY_S = 10.0  # RBAC changes are rare: don't hammer the apiserver meanwhile

Key = tuple[str, str]  # (namespace, name)


def configmap_state(obj: dict[str, Any] | None) -> ConfigMapState:
    if obj is None:
        return ConfigMapState()
    return ConfigMapState(
        exists=True,
        data=dict(obj.get("data") or {}),
        binary_keys=frozenset(obj.get("binaryData") or {}),
    )


@dataclass
class _Followed:
    task: asyncio.Task[None] | None = None
    subscribers: set[asyncio.Event] = field(default_factory=set)
    state: ConfigMapState | None = None  # None until the first list answers


class ConfigMapWatch:
    def __init__(self, api_client: client.ApiClient, watch_timeout_s: int = 300) -> None:
        self._core = client.CoreV1Api(api_client)
        self._watch_timeout_s = watch_timeout_s
        self._followed: dict[Key, _Followed] = {}

    def follow(self, key: Key, event: asyncio.Event) -> None:
        """Set ``event`` whenever the ConfigMap's state changes; the first follower starts its watch."""
        followed = self._followed.setdefault(key, _Followed())
        followed.subscribers.add(event)
        if followed.task is None:
            followed.task = asyncio.create_task(self._run(key, followed), name=f"ckpt-configmap-{key}")

    def unfollow(self, key: Key, event: asyncio.Event) -> None:
        """The last follower gone, the watch stops and its state is forgotten."""
        followed = self._followed.get(key)
        if followed is None:
            return
        followed.subscribers.discard(event)
        if not followed.subscribers:
            if followed.task is not None:
                followed.task.cancel()
            del self._followed[key]

    def state(self, key: Key) -> ConfigMapState | None:
        """What the watch last saw; None before its first list answered."""
        followed = self._followed.get(key)
        return followed.state if followed is not None else None

    def close(self) -> None:
        for followed in self._followed.values():
            if followed.task is not None:
                followed.task.cancel()
        self._followed.clear()

    def _set(self, followed: _Followed, state: ConfigMapState) -> None:
        if state != followed.state:
            followed.state = state
            for event in followed.subscribers:
                event.set()

    async def _run(self, key: Key, followed: _Followed) -> None:
        namespace, name = key
        while True:
            try:
                version = await self._list(key, followed)
                while True:
                    version = await self._watch(key, followed, version)
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:  # the version is too old: relist at once
                    continue
                if exc.status in (401, 403):
                    # Rollouts that name it say so in their status, not only in this log.
                    self._set(followed, ConfigMapState(error=f"{exc.status} {exc.reason}"))
                log.warning("ConfigMap %s/%s: API error %s; relisting", namespace, name, exc.status)
                await asyncio.sleep(FORBIDDEN_RETRY_S if exc.status in (401, 403) else RETRY_S)
            except Exception as exc:  # keep following; the next list repairs any gap
                log.warning("ConfigMap %s/%s: %r; relisting in %.0fs", namespace, name, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _request(self, key: Key, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", LIST_TIMEOUT_S)  # a watch passes its own
        namespace, name = key
        return await self._core.list_namespaced_config_map(
            namespace, field_selector=f"metadata.name={name}", _preload_content=False, **kwargs
        )

    async def _list(self, key: Key, followed: _Followed) -> str:
        resp = await self._request(key)
        body = await list_body(resp)
        items = body.get("items") or []
        self._set(followed, configmap_state(items[0] if items else None))
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, key: Key, followed: _Followed, version: str) -> str:
        resp = await self._request(
            key,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s,
            _request_timeout=self._watch_timeout_s + 30,
        )

        def apply(kind: str, obj: dict[str, Any]) -> None:
            self._set(followed, configmap_state(None if kind == "DELETED" else obj))

        return await follow(resp, version, apply)
