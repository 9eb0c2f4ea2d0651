"""kopf registrations. Each handler is a thin adapter over ckpt_rollout.rollout."""

import logging
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_rollout import metrics
from ckpt_rollout.agent_client import AgentClient, TokenFile
from ckpt_rollout.config import OperatorConfig
from ckpt_rollout.kube import RolloutApi, load_api_client
from ckpt_rollout.rollout import Memory, Peer, Pod, Reconciler

log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo.config
    # kopf's own bookkeeping lives under our API group, not kopf.zalando.org.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
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


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    await memo.agents.close()
    await memo.api_client.close()


@kopf.on.probe(id="rollouts")
def probe(memo: kopf.Memo, **_: Any) -> int:
    return int(memo.api.requests)


@kopf.index("pods")
def pods_by_namespace(
    namespace: str | None, name: str, labels: kopf.Labels, status: kopf.Status, meta: kopf.Meta, **_: Any
) -> dict[str, Pod] | None:
    """Running pods with an IP, by namespace: the only pods a rollout may call."""
    ip = status.get("podIP")
    if namespace is None or status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
        return None
    return {namespace: Pod(name=name, ip=ip, labels=dict(labels))}


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
    pods_by_namespace: kopf.Index[str, Pod] = kwargs["pods_by_namespace"]
    rollouts_index: kopf.Index[str, Peer] = kwargs["rollouts_by_namespace"]
    memory = Memory()
    reconciler: Reconciler = memo.reconciler

    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    while not stopped:
        try:
            obj = await memo.api.get(namespace, name)
            pods = list(pods_by_namespace.get(namespace, []))
            peers = list(rollouts_index.get(namespace, []))
            _, delay = await reconciler.step(obj, pods, memory, emit, peers)
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
            log.error("%s/%s: spec rejected by the models: %s", namespace, name, exc)
            delay = 10.0
        await stopped.wait(delay)
