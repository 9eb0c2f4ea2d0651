"""Delivering status to Kubernetes: the CR worker entry and the pod's WeightsReady condition.

Patches go out in order through one queue (a Loading entry never lands after the Updated
one), each with bounded retries on transient errors; a report that cannot be delivered is
logged and counted, never allowed to block or fail a load.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp

from ckpt_agent.common.metrics import AgentMetrics
from ckpt_agent.service.report import (
    entry_json,
    pod_condition_patch,
    rfc3339,
    weights_ready_condition,
    worker_status_patch,
)
from ckpt_api.agent_api import RolloutRef
from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.status import WorkerStatus

log = logging.getLogger(__name__)

# One status write; a hung apiserver fails it (and it is retried) instead of holding the queue.
REPORT_TIMEOUT_S = 10.0
# Retrying these cannot help: the object is gone, RBAC forbids it, or the patch is invalid.
_PERMANENT = frozenset({400, 401, 403, 404, 422})
# How long shutdown waits for queued reports (the final Updated/Failed entry matters most).
DRAIN_SECONDS = 5.0


class StatusReporter(Protocol):
    def worker_event(self, rollout: RolloutRef, entry: WorkerStatus) -> None: ...
    def weights_ready(self, ready: bool, reason: str, message: str) -> None: ...
    def describe(self) -> dict[str, Any]: ...
    async def close(self) -> None: ...


class DisabledReporter:
    """Reporting off (no cluster): remembers the last entry for `/v1/status` only."""

    def __init__(self) -> None:
        self.last_entry: dict[str, Any] | None = None
        self.ready: bool | None = None

    def worker_event(self, rollout: RolloutRef, entry: WorkerStatus) -> None:
        self.last_entry = {"rollout": f"{rollout.namespace}/{rollout.name}", **entry_json(entry)}

    def weights_ready(self, ready: bool, reason: str, message: str) -> None:
        self.ready = ready

    def describe(self) -> dict[str, Any]:
        return {"enabled": False, "last": self.last_entry, "weights_ready": self.ready}

    async def close(self) -> None:
        pass


class KubeReporter:
    def __init__(
        self,
        api_client: Any,
        pod_name: str,
        pod_namespace: str,
        metrics: AgentMetrics,
        *,
        attempts: int = 5,
        backoff_seconds: float = 0.2,
    ) -> None:
        self._api = api_client
        self._pod = pod_name
        self._namespace = pod_namespace
        self._metrics = metrics
        self._attempts = attempts
        self._backoff = backoff_seconds
        self._queue: asyncio.Queue[tuple[str, Callable[[], Awaitable[object]]]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._ready: tuple[bool, str] | None = None  # (status, lastTransitionTime)
        self.last_entry: dict[str, Any] | None = None
        self.last_error: str | None = None
        # This pod's UID, from the answer to its first status patch: entries carry it so that the
        # operator can tell them from those of an earlier pod of the same name.
        self.pod_uid: str | None = None

    def _submit(self, target: str, call: Callable[[], Awaitable[object]]) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._drain(), name="ckpt-agent-reporter")
        self._queue.put_nowait((target, call))

    def worker_event(self, rollout: RolloutRef, entry: WorkerStatus) -> None:
        from kubernetes_asyncio import client

        self.last_entry = {"rollout": f"{rollout.namespace}/{rollout.name}", **entry_json(entry)}
        if not rollout.report:
            return  # the operator pulls this outcome from /v1/status
        api = client.CustomObjectsApi(self._api)
        self._submit(
            f"checkpointrollout {rollout.namespace}/{rollout.name}",
            # Built when sent: by then the pod patch queued before it has told the UID.
            lambda: api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                rollout.namespace,
                PLURAL,
                rollout.name,
                worker_status_patch(self._pod, entry.model_copy(update={"pod_uid": self.pod_uid})),
                _content_type="application/merge-patch+json",
                _request_timeout=REPORT_TIMEOUT_S,
            ),
        )

    def weights_ready(self, ready: bool, reason: str, message: str) -> None:
        from kubernetes_asyncio import client

        # lastTransitionTime moves only when the status flips, as for any Kubernetes condition.
        if self._ready is None or self._ready[0] != ready:
            self._ready = (ready, rfc3339())
        body = pod_condition_patch(weights_ready_condition(ready, reason, message, self._ready[1]))
        api = client.CoreV1Api(self._api)

        async def patch() -> None:
            pod = await api.patch_namespaced_pod_status(
                self._pod, self._namespace, body, _request_timeout=REPORT_TIMEOUT_S
            )
            self.pod_uid = getattr(getattr(pod, "metadata", None), "uid", None) or self.pod_uid

        self._submit(f"pod {self._namespace}/{self._pod}", patch)

    async def _drain(self) -> None:
        while True:
            target, call = await self._queue.get()
            try:
                await self._deliver(target, call)
            finally:
                self._queue.task_done()

    async def _deliver(self, target: str, call: Callable[[], Awaitable[object]]) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        for attempt in range(1, self._attempts + 1):
            try:
                await call()
                return
            except ApiException as exc:
                error = f"patching {target}: HTTP {exc.status} {exc.reason}"
                if exc.status in _PERMANENT:
                    attempt = self._attempts
            except (OSError, aiohttp.ClientError, TimeoutError) as exc:
                error = f"patching {target}: {exc!r}"
            if attempt >= self._attempts:
                break
            await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
        self.last_error = error
        self._metrics.report_failures.labels("cr" if target.startswith("checkpointrollout") else "pod").inc()
        log.warning("giving up: %s", error)

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "pod": f"{self._namespace}/{self._pod}",
            "last": self.last_entry,
            "last_error": self.last_error,
            "weights_ready": None if self._ready is None else self._ready[0],
        }

    async def close(self) -> None:
        if self._worker is not None:
            try:
                await asyncio.wait_for(self._queue.join(), DRAIN_SECONDS)
            except TimeoutError:
                log.warning("status reports still queued at shutdown were dropped")
            self._worker.cancel()
