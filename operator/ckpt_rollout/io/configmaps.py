"""The ConfigMaps rollouts take their version from (spec.versionFrom), each followed by a
list+watch of that one name.

A field selector per followed name, not a watch on every ConfigMap: namespaces hold many
large ConfigMaps no rollout reads, and the operator keeps none of them. A trainer's write
reaches the rollouts that name the ConfigMap within one watch event."""

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_rollout.domain.version_source import ConfigMapState
from ckpt_rollout.io.reflector import Reflector

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
        list_call = functools.partial(
            self._core.list_namespaced_config_map, namespace, field_selector=f"metadata.name={name}"
        )

        async def replace(items: AsyncIterator[dict[str, Any]]) -> None:
            found = [item async for item in items]
            self._set(followed, configmap_state(found[0] if found else None))

        def apply(kind: str, obj: dict[str, Any]) -> None:
            self._set(followed, configmap_state(None if kind == "DELETED" else obj))

        def denied(exc: ApiException) -> None:
            # Rollouts that name it say so in their status, not only in the reflector's log.
            self._set(followed, ConfigMapState(error=f"{exc.status} {exc.reason}"))

        what = f"ConfigMap {namespace}/{name}"
        await Reflector(what, list_call, replace, apply, self._watch_timeout_s, denied).run()
