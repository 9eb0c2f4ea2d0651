"""kopf registrations, thin adapters: the per-CR loop is ckpt_rollout.controller.daemon, a step is
ckpt_rollout.controller.executor."""

import asyncio
import logging
from typing import Any

import kopf

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import FINALIZER, KOPF_ANNOTATION_PREFIX, KOPF_DIFFBASE_KEY
from ckpt_rollout.controller.config import OperatorConfig, agent_ca
from ckpt_rollout.controller.daemon import RolloutLoops
from ckpt_rollout.controller.executor import Reconciler
from ckpt_rollout.domain.world import Peer
from ckpt_rollout.io.agent_client import AgentClient
from ckpt_rollout.io.agent_tokens import AgentTokens, NoToken, TokenFile, TokenRequestTokens
from ckpt_rollout.io.configmaps import ConfigMapWatch
from ckpt_rollout.io.kube import RolloutApi, load_api_client
from ckpt_rollout.io.podcache import PodCache

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
    # kopf's own calls (finalizers, progress annotations, events): bounded, not its 300 s default.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
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
    memo.agents = AgentClient(
        agent_tokens(config, api_client), timeout_s=config.agent_timeout_s, ca=agent_ca(config)
    )
    memo.reconciler = Reconciler(memo.api, memo.agents, config.tuning)
    memo.pods = PodCache(api_client, config.namespaces, config.watch_server_timeout_s)
    memo.pods_task = asyncio.create_task(memo.pods.run(), name="ckpt-pod-cache")
    memo.configmaps = ConfigMapWatch(api_client, config.watch_server_timeout_s)
    memo.loops = RolloutLoops(memo.api, memo.reconciler, memo.pods, memo.configmaps, config.source_policy)


def agent_tokens(config: OperatorConfig, api_client: Any) -> AgentTokens:
    if config.agent_token_service_account is not None:
        return TokenRequestTokens(
            api_client,
            config.agent_token_service_account,
            audience_base=config.agent_audience,
            seconds=config.agent_token_seconds,
        )
    if config.agent_token_file:
        return TokenFile(config.agent_token_file)
    log.warning("no agent token configured: agents must run with --no-auth")
    return NoToken()


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    memo.pods_task.cancel()
    memo.configmaps.close()
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


@kopf.on.event(GROUP, VERSION, PLURAL)
async def rollout_changed(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    # async: asyncio.Event is not thread-safe (kopf runs sync handlers in threads)
    memo.loops.changed(namespace, name, body)


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
    await memo.loops.follow(namespace, name, body, stopped, kwargs["rollouts_by_namespace"])
