"""Each CheckpointRollout's loop: step, then sleep until the CR changes (anyone's write but our
own), its namespace's pods change, the ConfigMap its version comes from changes, or the step's
timer runs out."""

import asyncio
import logging
import time
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from ckpt_api.source_policy import SourcePolicy
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import EventReason, EventType
from ckpt_rollout.controller.executor import Emit, Reconciler
from ckpt_rollout.domain.freshness import freshest, resource_version
from ckpt_rollout.domain.mergepatch import merge_diff
from ckpt_rollout.domain.spec_gates import Held, gate, recovered_status, stalled_status
from ckpt_rollout.domain.version_source import source_ref
from ckpt_rollout.domain.world import Memory, Peer, rfc3339
from ckpt_rollout.io import metrics
from ckpt_rollout.io.configmaps import ConfigMapWatch, Key
from ckpt_rollout.io.kube import RolloutApi
from ckpt_rollout.io.podcache import PodCache

log = logging.getLogger(__name__)

RETRY_S = 2.0  # after an API error or an unreachable apiserver
REJECTED_RETRY_S = 10.0  # after a spec or status the models reject
WAITING_LOOK_S = 5.0  # while pods of the namespace are not Running yet
# After a pulled member's doorbell (its pod's WeightsReady changed), the rings of this long are
# heard by one step: a wave's members end their loads within moments of each other.
DOORBELL_GATHER_S = 0.2


class Waker:
    """Wakes a CR's daemon when someone else changes the CR (a spec edit, an annotation, an
    agent's push) or its namespace's pods change; its own patches do not wake it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.rung = asyncio.Event()  # a pod's WeightsReady condition changed (PodCache.listen)
        self.written: int | None = None  # resourceVersion of our last patch

    def cr_changed(self, body: kopf.Body) -> None:
        if resource_version(body) != self.written:
            self.event.set()

    async def sleep(
        self, stopped: kopf.DaemonStopped, delay: float | None, *, doorbell: bool = False
    ) -> None:
        """Until woken, stopped, or ``delay`` seconds (None: no timer); with ``doorbell``, also
        shortly after a pod's WeightsReady condition changes."""
        waits = [asyncio.ensure_future(self.event.wait()), asyncio.ensure_future(stopped.wait(delay))]
        if doorbell:
            waits.append(asyncio.ensure_future(self.rung.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if doorbell and self.rung.is_set() and not self.event.is_set() and not stopped:
            await stopped.wait(DOORBELL_GATHER_S)


class RolloutLoops:
    """The loops of every CR this operator follows, and what wakes them."""

    def __init__(
        self,
        api: RolloutApi,
        reconciler: Reconciler,
        pods: PodCache,
        configmaps: ConfigMapWatch,
        source_policy: SourcePolicy,
    ) -> None:
        self.api = api
        self.source_policy = source_policy
        self.reconciler = reconciler
        self.pods = pods
        self.configmaps = configmaps
        self.wakers: dict[tuple[str, str], Waker] = {}

    def changed(self, namespace: str | None, name: str, body: kopf.Body) -> None:
        waker = self.wakers.get((namespace or "", name))
        if waker is not None:
            waker.cr_changed(body)

    async def follow(
        self,
        namespace: str,
        name: str,
        body: kopf.Body,
        stopped: kopf.DaemonStopped,
        peers_index: kopf.Index[str, Peer],
    ) -> None:
        key = (namespace, name)
        waker = self.wakers[key] = Waker()
        self.pods.subscribe(namespace, waker.event)
        self.pods.listen(namespace, waker.rung)
        source: list[Key] = []  # the ConfigMap followed for spec.versionFrom, if any
        memory = Memory()

        def emit(type_: str, reason: str, message: str) -> None:
            kopf.event(body, type=type_, reason=reason, message=message)

        try:
            await self.pods.wait_synced()  # a rollout never acts on a partial view of its pods
            written: dict[str, Any] | None = None  # what our last status patch returned
            while not stopped:
                waker.event.clear()
                waker.rung.clear()  # the step reads every pod's condition as it is now
                delay: float | None
                try:
                    # kopf keeps `body` live from its watch: no GET per step, and a finished
                    # rollout costs no API request until its spec, its pods or a timer needs one.
                    newest = freshest(body, written)
                    # A shallow copy is a snapshot: kopf replaces the body's parts, never edits
                    # them, and the step only reads them.
                    obj = dict(newest) if newest is not None else await self.api.get(namespace, name)
                    self._follow_source(obj, source, waker)
                    resolved, patched = await self._resolved(obj, emit)
                    if patched is not None:
                        written = patched
                        waker.written = resource_version(patched)
                    # Held by a gate: a spec edit, or its ConfigMap's watch, wakes the loop.
                    delay = None
                    if resolved is not None:
                        peers = list(peers_index.get(namespace, []))
                        waiting = self.pods.waiting(namespace)
                        stepped, delay = await self.reconciler.step(
                            resolved, self.pods.get(namespace), memory, emit, peers, waiting
                        )
                        if waiting:
                            # A pod still creating its containers is named once it has taken
                            # too long, which no pod event announces: look again by then.
                            delay = min(delay if delay is not None else WAITING_LOOK_S, WAITING_LOOK_S)
                        if stepped is not resolved:
                            written = stepped
                            waker.written = resource_version(stepped)
                except ApiException as exc:
                    if exc.status == 404:
                        return
                    log.warning("%s/%s: API error %s, retrying", namespace, name, exc.status)
                    delay = RETRY_S
                except (aiohttp.ClientError, TimeoutError) as exc:
                    # The apiserver is unreachable (restarting, network blip): retry soon. Letting
                    # the daemon die would make kopf restart it only after its 60 s backoff.
                    log.warning("%s/%s: apiserver unreachable (%s), retrying", namespace, name, exc)
                    delay = RETRY_S
                except ValidationError as exc:
                    log.error("%s/%s: spec or status rejected by the models: %s", namespace, name, exc)
                    delay = REJECTED_RETRY_S
                if delay is None or delay > 0:
                    await waker.sleep(stopped, delay, doorbell=memory.doorbell)
        finally:
            # Deleted, or handed to another replica: its gauges must not outlive the loop (a
            # stale Failed phase would keep an alert firing).
            metrics.forget(key)
            self.pods.unsubscribe(namespace, waker.event)
            self.pods.unlisten(namespace, waker.rung)
            for followed in source:
                self.configmaps.unfollow(followed, waker.event)
            self.wakers.pop(key, None)

    def _follow_source(self, obj: dict[str, Any], source: list[Key], waker: Waker) -> None:
        """Follow the ConfigMap spec.versionFrom names now (and no longer one it named)."""
        try:
            ref = source_ref(obj["spec"])
        except (ValidationError, KeyError, TypeError):
            ref = None  # an invalid versionFrom: the InvalidSpec gate holds the rollout
        wanted = [(obj["metadata"]["namespace"], ref.name)] if ref is not None else []
        if wanted == source:
            return
        for old in source:
            self.configmaps.unfollow(old, waker.event)
        for new in wanted:
            self.configmaps.follow(new, waker.event)
        source[:] = wanted

    async def _resolved(
        self, obj: dict[str, Any], emit: Emit
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The CR as a step reads it (None: held by a spec gate, nothing to step) and the CR as a
        status write here returned it (None: nothing written)."""
        verdict = gate(obj, self.configmaps.state, self.source_policy)
        if verdict is None:
            return None, None
        meta = obj["metadata"]
        status = CheckpointRolloutStatus.model_validate(obj.get("status") or {})
        stamp, generation = rfc3339(time.time()), meta.get("generation")
        if isinstance(verdict, Held):
            new = stalled_status(status, verdict, now=stamp, generation=generation)
            if status.message != verdict.message:
                emit(EventType.WARNING, EventReason(verdict.reason), verdict.message)
            return None, await self._write(obj, status, new)
        recovered = recovered_status(status, verdict.message, now=stamp, generation=generation)
        if recovered is None:
            return verdict.obj, None
        patched = await self._write(obj, status, recovered)
        if patched is None:
            return verdict.obj, None
        return {**patched, "spec": verdict.obj["spec"]}, patched  # the spec as resolved

    async def _write(
        self, obj: dict[str, Any], old: CheckpointRolloutStatus, new: CheckpointRolloutStatus
    ) -> dict[str, Any] | None:
        patch = merge_diff(old.to_wire(), new.to_wire())
        if not patch:
            return None
        return await self.api.patch_status(obj["metadata"]["namespace"], obj["metadata"]["name"], patch)
