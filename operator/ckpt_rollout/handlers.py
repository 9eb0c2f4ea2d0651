"""kopf registrations. Each handler is a thin adapter over ckpt_rollout.rollout."""

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
from ckpt_rollout.freshness import freshest
from ckpt_rollout.kube import RolloutApi, load_api_client
from ckpt_rollout.podcache import PodCache
from ckpt_rollout.rollout import Memory, Peer, Reconciler

log = logging.getLogger(__name__)


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
    settings.posting.level = logging.INFO
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

    await pod_cache.wait_synced()  # a rollout never acts on a partial view of its pods
    written: dict[str, Any] | None = None  # what our last status patch returned
    while not stopped:
        try:
            # kopf keeps `body` live from its watch: no GET per step, and a finished rollout
            # costs no API request until its spec, its pods or a timer needs one.
            newest = freshest(body, written)
            obj = copy.deepcopy(dict(newest)) if newest is not None else await memo.api.get(namespace, name)
            pods = pod_cache.get(namespace)
            peers = list(rollouts_index.get(namespace, []))
            stepped, delay = await reconciler.step(obj, pods, memory, emit, peers)
            written = stepped if stepped is not obj else written
        except ApiException as exc:
            if exc.status == 404:
                metrics.forget((namespace, name))
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
        await stopped.wait(delay)
