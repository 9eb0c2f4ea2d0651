"""Running pods with an IP, by namespace, from one list+watch on pods read as raw JSON.

This replaces a kopf index on pods: kopf runs every pod event through its per-object
machinery (a worker task, a diff base deep copy, handler matching) and holds back every
handler until the initial list has been through it. With 5000 worker pods that was minutes
of CPU before the first rollout step, and hundreds of MB. A rollout only needs each pod's
name, IP and labels (and LeaderWorkerSet's group size), so that is all this keeps, with its
WeightsReady condition: the doorbell of a pulled wave (ckpt_rollout.domain.drive), which wakes
only the daemons that listen for it (each load flips it twice, on every pod of a wave).
"""

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client

from ckpt_api.spec import LWS_SIZE_ANNOTATION
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION, ConditionStatus, PodPhase
from ckpt_rollout.domain.world import Pod, WeightsSignal
from ckpt_rollout.io.reflector import Reflector


def _startup(obj: dict[str, Any]) -> tuple[object, ...]:
    """What tells whether a pod that is not Running can start (its phase, whether it is
    scheduled, its containers' waiting reasons): a change to it wakes the daemons."""
    status = obj.get("status") or {}
    scheduled = [
        (c.get("status"), c.get("reason"))
        for c in status.get("conditions") or []
        if c.get("type") == "PodScheduled"
    ]
    waiting = [
        ((c.get("state") or {}).get("waiting") or {}).get("reason")
        for key in ("initContainerStatuses", "containerStatuses")
        for c in status.get(key) or []
    ]
    return status.get("phase"), tuple(scheduled), tuple(waiting)


def startup_view(obj: dict[str, Any]) -> dict[str, Any]:
    """Of a pod not Running yet, what says whether and why it cannot start (what
    ckpt_rollout.domain.troubles.pod_trouble reads, and the uid its events are read by): many
    pods may wait at once."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    kept_meta = ("name", "namespace", "uid", "labels", "creationTimestamp", "deletionTimestamp")
    kept_status = ("phase", "reason", "message", "conditions", "initContainerStatuses", "containerStatuses")
    return {
        "metadata": {k: meta[k] for k in kept_meta if k in meta},
        "status": {k: status[k] for k in kept_status if k in status},
    }


def running_pod(obj: dict[str, Any]) -> Pod | None:
    """The pod if a rollout may call it: Running, with an IP, not being deleted."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    ip = status.get("podIP")
    if status.get("phase") != PodPhase.RUNNING or not ip or meta.get("deletionTimestamp"):
        return None
    return Pod(
        name=meta["name"],
        ip=ip,
        labels=dict(meta.get("labels") or {}),
        uid=meta.get("uid") or "",
        group_size=group_size((meta.get("annotations") or {}).get(LWS_SIZE_ANNOTATION)),
        weights=weights_signal(status.get("conditions")),
    )


def weights_signal(conditions: object) -> WeightsSignal | None:
    """The pod's WeightsReady condition, if its agent wrote one."""
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, dict) and c.get("type") == WEIGHTS_READY_CONDITION:
            return WeightsSignal(
                ready=c.get("status") == ConditionStatus.TRUE,
                reason=str(c.get("reason") or ""),
                message=str(c.get("message") or ""),
            )
    return None


def _read_by_rollouts(pod: Pod | None) -> Pod | None:
    """What a change of wakes the daemons: the pod without its doorbell."""
    return dataclasses.replace(pod, weights=None) if pod is not None else None


def group_size(annotation: object) -> int | None:
    """LeaderWorkerSet's size annotation as a count; None when absent or not a positive int."""
    if not isinstance(annotation, str) or not annotation.isdigit():
        return None
    return int(annotation) or None


class PodCache:
    def __init__(self, api_client: client.ApiClient, namespaces: list[str], watch_timeout_s: int = 300):
        self._core = client.CoreV1Api(api_client)
        self._namespaces = namespaces or [""]  # "" = every namespace
        self._watch_timeout_s = watch_timeout_s
        self._pods: dict[str, dict[str, Pod]] = {}  # namespace -> name -> pod
        # namespace -> name -> the pod as listed: those not Running yet (not being deleted), to
        # say why one cannot start (ckpt_rollout.domain.troubles.pod_trouble).
        self._waiting: dict[str, dict[str, dict[str, Any]]] = {}
        self._synced = {ns: asyncio.Event() for ns in self._namespaces}
        self._subscribers: dict[str, set[asyncio.Event]] = {}  # namespace -> daemons' wake-ups
        self._listeners: dict[str, set[asyncio.Event]] = {}  # namespace -> doorbells

    def get(self, namespace: str) -> list[Pod]:
        return list(self._pods.get(namespace, {}).values())

    def waiting(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's pods that are not Running yet (nor being deleted), as listed."""
        return list(self._waiting.get(namespace, {}).values())

    def subscribe(self, namespace: str, event: asyncio.Event) -> None:
        """Set ``event`` whenever the namespace's rollout-relevant pods change."""
        self._subscribers.setdefault(namespace, set()).add(event)

    def unsubscribe(self, namespace: str, event: asyncio.Event) -> None:
        self._subscribers.get(namespace, set()).discard(event)

    def listen(self, namespace: str, event: asyncio.Event) -> None:
        """Set ``event`` whenever only a pod's WeightsReady condition changes in the namespace."""
        self._listeners.setdefault(namespace, set()).add(event)

    def unlisten(self, namespace: str, event: asyncio.Event) -> None:
        self._listeners.get(namespace, set()).discard(event)

    def _changed(self, namespace: str) -> None:
        for event in self._subscribers.get(namespace, ()):
            event.set()

    async def wait_synced(self) -> None:
        await asyncio.gather(*(e.wait() for e in self._synced.values()))

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) or a listed object (kind ADDED)."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace", "")
        pods = self._pods.setdefault(namespace, {})
        pod = None if kind == "DELETED" else running_pod(obj)
        # Most pod events (conditions, other status) change nothing a rollout reads: only
        # a pod that comes, goes or changes its IP or labels wakes the daemons, or one not
        # running yet whose startup state changes. Its WeightsReady condition is kept, unwoken.
        rang = False
        if pod is None:
            changed = pods.pop(meta.get("name", ""), None) is not None
        else:
            before = pods.get(pod.name)
            changed = _read_by_rollouts(before) != _read_by_rollouts(pod)
            rang = not changed and before is not None and before.weights != pod.weights
            pods[pod.name] = pod
        changed = self._note_waiting(namespace, kind, obj, pod is None) or changed
        if changed:
            self._changed(namespace)
        elif rang:
            for event in self._listeners.get(namespace, ()):
                event.set()

    def _note_waiting(self, namespace: str, kind: str, obj: dict[str, Any], not_running: bool) -> bool:
        meta = obj.get("metadata") or {}
        waiting = self._waiting.setdefault(namespace, {})
        name = meta.get("name", "")
        if kind == "DELETED" or not not_running or meta.get("deletionTimestamp"):
            return waiting.pop(name, None) is not None
        before = waiting.get(name)
        waiting[name] = startup_view(obj)
        return before is None or _startup(before) != _startup(obj)

    async def run(self) -> None:
        """Follow pods until cancelled, one reflector per namespace (or one for all)."""
        await asyncio.gather(*(self._reflector(ns).run() for ns in self._namespaces))

    def _reflector(self, namespace: str) -> Reflector:
        if namespace:
            list_call = functools.partial(self._core.list_namespaced_pod, namespace)
        else:
            list_call = self._core.list_pod_for_all_namespaces

        async def replace(items: AsyncIterator[dict[str, Any]]) -> None:
            await self._replace(namespace, items)

        what = f"pods in {namespace or 'all namespaces'}"
        return Reflector(what, list_call, replace, self.apply, self._watch_timeout_s)

    async def _replace(self, namespace: str, items: AsyncIterator[dict[str, Any]]) -> None:
        listed: dict[str, dict[str, Pod]] = {}
        waiting: dict[str, dict[str, dict[str, Any]]] = {}
        async for item in items:
            item_ns, item_name = item["metadata"]["namespace"], item["metadata"]["name"]
            if (pod := running_pod(item)) is not None:
                listed.setdefault(item_ns, {})[pod.name] = pod
            elif not item["metadata"].get("deletionTimestamp"):
                waiting.setdefault(item_ns, {})[item_name] = startup_view(item)
        if namespace:
            self._pods[namespace] = listed.get(namespace, {})
            self._waiting[namespace] = waiting.get(namespace, {})
        else:
            self._pods = listed
            self._waiting = waiting
        for changed in self._subscribers:  # a relist may have missed events: look again
            self._changed(changed)
        self._synced[namespace].set()
