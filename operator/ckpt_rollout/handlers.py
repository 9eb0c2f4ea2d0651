"""kopf registrations, thin adapters over the executor (ckpt_rollout.executor)."""

import asyncio
import copy
import logging
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import FINALIZER, KOPF_ANNOTATION_PREFIX, KOPF_DIFFBASE_KEY
from ckpt_rollout import metrics
from ckpt_rollout.agent_client import AgentClient, TokenFile
from ckpt_rollout.config import OperatorConfig
from ckpt_rollout.executor import Reconciler
from ckpt_rollout.freshness import freshest, resource_version
from ckpt_rollout.kube import RolloutApi, load_api_client
from ckpt_rollout.podcache import PodCache
from ckpt_rollout.world import Memory, Peer

log = logging.getLogger(__name__)


def _quiet_wakeups(record: logging.LogRecord) -> bool:
    """Drop kopf's per-event success line of the wake-up handler from the log."""
    return not (record.levelno == logging.INFO and "'rollout_changed' succeeded" in record.getMessage())


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo.config
    # kopf's own bookkeeping lives under our API group, not kopf.zalando.org.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_ANNOTATION_PREFIX, key=KOPF_DIFFBASE_KEY
    )
    settings.watching.server_timeout = config.watch_server_timeout_s
    settings.watching.client_timeout = config.watch_server_timeout_s + 30
    settings.watching.connect_timeout = 30
    # Our own Events are posted explicitly (kopf.event); kopf's INFO lines ("Handler ...
    # succeeded", one per CR change with the wake-up handler) would each cost a POST.
    settings.posting.level = logging.WARNING
    logging.getLogger("kopf.objects").addFilter(_quiet_wakeups)
    # Our resources are known up front; scanning CRDs/namespaces would need RBAC we don't grant.
    settings.scanning.disabled = True
    settings.execution.max_workers = 4
    api_client = await load_api_client()
    memo.api = RolloutApi(api_client)
    memo.api_client = api_client
    memo.agents = AgentClient(TokenFile(config.agent_token_file), timeout_s=config.agent_timeout_s)
    memo.reconciler = Reconciler(memo.api, memo.agents, config.tuning)
    memo.pods = PodCache(api_client, config.namespaces, config.watch_server_timeout_s)
    memo.pods_task = asyncio.create_task(memo.pods.run(), name="ckpt-pod-cache")
    memo.wakers = {}  # (namespace, name) -> Waker of that CR's daemon


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    memo.pods_task.cancel()
    await memo.agents.close()
    await memo.api_client.close()


@kopf.on.probe(id="rollouts")
def probe(memo: kopf.Memo, **_: Any) -> int:
    return int(memo.api.requests)


@kopf.index(GROUP, VERSION, PLURAL)
def rollouts_by_namespace(
    namespace: str | None, name: str, meta: kopf.Meta, spec: kopf.Spec, **_: Any
) -> dict[str, Peer] | None:
    """Every CheckpointRollout's selector, to find overlaps without list calls."""
    if namespace is None:
        return None
    return {
        namespace: Peer(
            name=name,
            created=str(meta.get("creationTimestamp") or ""),
            selector=dict(spec.get("selector") or {}),
        )
    }


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


@kopf.on.event(GROUP, VERSION, PLURAL)
async def rollout_changed(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    waker: Waker | None = memo.wakers.get((namespace, name))
    if waker is not None:  # async: asyncio.Event is not thread-safe (kopf runs sync handlers in threads)
        waker.cr_changed(body)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def rollout_loop(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    assert namespace is not None  # CheckpointRollouts are namespaced
    pod_cache: PodCache = memo.pods
    rollouts_index: kopf.Index[str, Peer] = kwargs["rollouts_by_namespace"]
    memory = Memory()
    reconciler: Reconciler = memo.reconciler

    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    key = (namespace, name)
    waker = memo.wakers[key] = Waker()
    pod_cache.subscribe(namespace, waker.event)
    try:
        await pod_cache.wait_synced()  # a rollout never acts on a partial view of its pods
        written: dict[str, Any] | None = None  # what our last status patch returned
        while not stopped:
            waker.event.clear()
            delay: float | None
            try:
                # kopf keeps `body` live from its watch: no GET per step, and a finished rollout
                # costs no API request until its spec, its pods or a timer needs one.
                newest = freshest(body, written)
                obj = (
                    copy.deepcopy(dict(newest)) if newest is not None else await memo.api.get(namespace, name)
                )
                pods = pod_cache.get(namespace)
                peers = list(rollouts_index.get(namespace, []))
                stepped, delay = await reconciler.step(obj, pods, memory, emit, peers)
                if stepped is not obj:
                    written = stepped
                    waker.written = resource_version(stepped)
            except ApiException as exc:
                if exc.status == 404:
                    metrics.forget(key)
                    return
                log.warning("%s/%s: API error %s, retrying", namespace, name, exc.status)
                delay = 2.0
            except (aiohttp.ClientError, TimeoutError) as exc:
                # The apiserver is unreachable (restarting, network blip): retry soon. Letting the
                # daemon die would make kopf restart it only after its 60 s backoff.
                log.warning("%s/%s: apiserver unreachable (%s), retrying", namespace, name, exc)
                delay = 2.0
            except ValidationError as exc:
                log.error("%s/%s: spec or status rejected by the models: %s", namespace, name, exc)
                delay = 10.0
            if delay is None or delay > 0:
                await waker.sleep(stopped, delay)
    finally:
        pod_cache.unsubscribe(namespace, waker.event)
        memo.wakers.pop(key, None)
