"""Each CheckpointRollout's loop: step, then sleep until the CR changes (anyone's write but our
own), its namespace's pods change, or the step's timer runs out."""

import asyncio
import logging
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from ckpt_rollout import metrics
from ckpt_rollout.executor import Reconciler
from ckpt_rollout.freshness import freshest, resource_version
from ckpt_rollout.kube import RolloutApi
from ckpt_rollout.podcache import PodCache
from ckpt_rollout.world import Memory, Peer

log = logging.getLogger(__name__)

RETRY_S = 2.0  # after an API error or an unreachable apiserver
REJECTED_RETRY_S = 10.0  # after a spec or status the models reject


class Waker:
    """Wakes a CR's daemon when someone else changes the CR (a spec edit, an annotation, an
    agent's push) or its namespace's pods change; its own patches do not wake it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.written: int | None = None  # resourceVersion of our last patch

    def cr_changed(self, body: kopf.Body) -> None:
        if resource_version(body) != self.written:
            self.event.set()

    async def sleep(self, stopped: kopf.DaemonStopped, delay: float | None) -> None:
        """Until woken, stopped, or ``delay`` seconds (None: no timer)."""
        waits = [asyncio.ensure_future(self.event.wait()), asyncio.ensure_future(stopped.wait(delay))]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


class RolloutLoops:
    """The loops of every CR this operator follows, and what wakes them."""

    def __init__(self, api: RolloutApi, reconciler: Reconciler, pods: PodCache) -> None:
        self.api = api
        self.reconciler = reconciler
        self.pods = pods
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
        memory = Memory()

        def emit(type_: str, reason: str, message: str) -> None:
            kopf.event(body, type=type_, reason=reason, message=message)

        try:
            await self.pods.wait_synced()  # a rollout never acts on a partial view of its pods
            written: dict[str, Any] | None = None  # what our last status patch returned
            while not stopped:
                waker.event.clear()
                delay: float | None
                try:
                    # kopf keeps `body` live from its watch: no GET per step, and a finished
                    # rollout costs no API request until its spec, its pods or a timer needs one.
                    newest = freshest(body, written)
                    # A shallow copy is a snapshot: kopf replaces the body's parts, never edits
                    # them, and the step only reads them.
                    obj = dict(newest) if newest is not None else await self.api.get(namespace, name)
                    peers = list(peers_index.get(namespace, []))
                    stepped, delay = await self.reconciler.step(
                        obj, self.pods.get(namespace), memory, emit, peers
                    )
                    if stepped is not obj:
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
                    await waker.sleep(stopped, delay)
        finally:
            # Deleted, or handed to another replica: its gauges must not outlive the loop (a
            # stale Failed phase would keep an alert firing).
            metrics.forget(key)
            self.pods.unsubscribe(namespace, waker.event)
            self.wakers.pop(key, None)
