"""What the user commands do to a CheckpointRollout, through the user's kubeconfig: read it, watch
it, and the five actions (pause, resume, promote, abort, retry). The CLI (commands) and the
dashboard call the same functions, so a button does exactly what its command does. Failures are
ActionErrors carrying the CLI's exit code; nothing here prints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    FAILED_PHASES,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    SKIP_ANALYSIS_ANNOTATION,
    Phase,
    WavePhase,
)
from ckpt_rollout.io.blocking_kube import BlockingKube
from ckpt_rollout.tools.views import desired_version

EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_API_ERROR, EXIT_INTERRUPTED = 3, 4, 5, 6, 130
MERGE_PATCH = "application/merge-patch+json"


class ActionError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Target:
    """The kubectl-style flags every user command takes."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


def connect(target: Target) -> tuple[BlockingKube, str]:
    """(the client, the namespace): the flag's namespace, else that of the context used (the
    `--context` one, else the current one), else default."""
    from kubernetes_asyncio import config

    try:
        kube = BlockingKube.from_kubeconfig(target.kubeconfig, target.context)
        namespace = target.namespace
        if namespace is None:
            contexts, active = config.list_kube_config_contexts(config_file=target.kubeconfig)
            if target.context is not None:
                active = next((c for c in contexts or [] if c.get("name") == target.context), None)
            namespace = (active or {}).get("context", {}).get("namespace") or "default"
    except (config.ConfigException, OSError) as exc:
        raise ActionError(f"no usable kubeconfig: {exc}", EXIT_UNREACHABLE) from None
    return kube, namespace


def request(what: str, namespace: str, name: str, call: Callable[[], Any]) -> Any:
    """One API call, its failures as ActionErrors."""
    from aiohttp import ClientError
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            raise ActionError(f"checkpointrollout {namespace}/{name} not found", EXIT_NOT_FOUND) from None
        raise ActionError(
            f"{what} {namespace}/{name}: HTTP {exc.status}: {_api_message(exc)}", EXIT_API_ERROR
        ) from None
    except (ClientError, OSError) as exc:  # TimeoutError is an OSError
        raise ActionError(f"cannot reach the apiserver: {_first_line(exc)}", EXIT_UNREACHABLE) from None


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


def get(api: BlockingKube, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = request(
        "get",
        namespace,
        name,
        lambda: api.call(
            lambda: api.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        ),
    )
    return obj


def patch(api: BlockingKube, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """A merge patch (null removes a key)."""
    obj: dict[str, Any] = request(
        "patch",
        namespace,
        name,
        lambda: api.call(
            lambda: api.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE_PATCH
            )
        ),
    )
    return obj


def selected(obj: dict[str, Any], pods: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Of ``pods`` (pod summaries of ``obj``'s namespace, by name), those ``obj``'s selector
    selects; none for a selector the models refuse."""
    from pydantic import ValidationError

    from ckpt_api.spec import LabelSelector
    from ckpt_rollout.domain.selectors import selector_matches

    try:
        selector = LabelSelector.model_validate((obj.get("spec") or {}).get("selector") or {})
    except ValidationError:
        return {}
    return {
        name: dict(pod) for name, pod in pods.items() if selector_matches(selector, pod.get("labels") or {})
    }


def pod_summary(pod: dict[str, Any]) -> dict[str, Any]:
    """What the views read of a pod (as the apiserver serves it): its name, namespace, labels,
    node and phase."""
    meta = pod.get("metadata") or {}
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "labels": meta.get("labels") or {},
        "node": (pod.get("spec") or {}).get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase"),
    }


def list_pods(api: BlockingKube, namespace: str | None) -> dict[str, Any]:
    """The pods of ``namespace`` (None: all) as the list call serves them (JSON)."""
    core = api.core
    call = (lambda: core.list_namespaced_pod(namespace)) if namespace else core.list_pod_for_all_namespaces
    listed = request("list pods in", namespace or "*", "*", lambda: api.call(call))
    served: dict[str, Any] = api.api_client.sanitize_for_serialization(listed)
    return served


def selected_pods(api: BlockingKube, namespace: str, obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pods ``obj`` selects, by name (pod_summary). Empty where the user may not list pods."""
    try:
        listed = list_pods(api, namespace)
    except ActionError:
        return {}
    return selected(obj, {p["name"]: p for p in map(pod_summary, listed.get("items") or [])})


# -- watching ------------------------------------------------------------------------------------


def watch_events(
    api: BlockingKube,
    namespace: str | None,
    resource_version: str | None,
    timeout_s: int,
    name: str | None = None,
) -> Generator[dict[str, Any], None, None]:
    """Watch events of the CheckpointRollouts in ``namespace`` (None: every namespace; ``name``:
    that one only) from ``resource_version``, for at most ``timeout_s``. A version too old to
    watch from comes out as one event of type GONE: the caller lists again."""
    extra: dict[str, Any] = {"field_selector": f"metadata.name={name}"} if name else {}
    args: tuple[str, ...] = (
        (GROUP, VERSION, PLURAL) if namespace is None else (GROUP, VERSION, namespace, PLURAL)
    )
    call = (
        api.custom.list_cluster_custom_object
        if namespace is None
        else api.custom.list_namespaced_custom_object
    )
    yield from _gone_as_event(
        api.watch(call, *args, resource_version=resource_version, timeout_seconds=timeout_s, **extra)
    )


def watch_pod_events(
    api: BlockingKube, namespace: str | None, resource_version: str | None, timeout_s: int
) -> Iterator[dict[str, Any]]:
    """watch_events' counterpart for the pods of ``namespace`` (None: every namespace), each
    event's object as JSON."""
    core = api.core
    call = core.list_pod_for_all_namespaces if namespace is None else core.list_namespaced_pod
    args = () if namespace is None else (namespace,)
    stream = api.watch(call, *args, resource_version=resource_version, timeout_seconds=timeout_s)
    for event in _gone_as_event(stream):
        yield (
            event
            if event["type"] == "GONE"
            else {"type": event.get("type"), "object": event.get("raw_object") or {}}
        )


def _gone_as_event(stream: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The events of ``stream``; the 410 that ends a watch from a version too old as a GONE
    event (the client raises every ERROR event)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        yield from stream
    except ApiException as exc:
        if exc.status != 410:
            raise
        yield {"type": "GONE"}


def list_rollouts(api: BlockingKube, namespace: str | None) -> dict[str, Any]:
    """The CheckpointRollouts of ``namespace`` (None: all) as the list call returns them."""
    custom = api.custom

    def call() -> Any:
        if namespace is None:
            return custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)

    listed: dict[str, Any] = request("list", namespace or "*", "*", lambda: api.call(call))
    return listed


def next_change(
    api: BlockingKube, namespace: str, name: str, obj: dict[str, Any], left: float | None
) -> dict[str, Any] | None:
    """The object after its next change, or None if none came within ``left`` (at most a minute:
    then the caller looks again)."""
    wait_s = max(1, int(min(left if left is not None else 60.0, 60.0)))
    version = (obj.get("metadata") or {}).get("resourceVersion")

    def first_event() -> dict[str, Any] | None:
        # Closed here, in this thread: the rest of the stream is not wanted.
        with closing(watch_events(api, namespace, version, wait_s, name)) as events:
            return next(events, None)

    event = request("watch", namespace, name, first_event)
    if event is None:
        return None
    if event.get("type") in ("GONE", "ERROR"):  # start over from the object as it is now
        return get(api, namespace, name)
    if event.get("type") == "DELETED":
        raise ActionError(f"checkpointrollout {namespace}/{name} was deleted", EXIT_NOT_FOUND)
    changed: dict[str, Any] = event.get("object") or {}
    return changed


# -- the actions ---------------------------------------------------------------------------------


def refusal(action: str, obj: dict[str, Any]) -> str | None:
    """Why ``action`` does not apply to the rollout as it is now (None: it does). The dashboard
    greys a button out for the same reason the command refuses."""
    status = obj.get("status") or {}
    phase = status.get("phase")
    if action == "promote" and (phase != Phase.PAUSED or (obj.get("spec") or {}).get("paused")):
        why = "spec.paused is set: use resume" if phase == Phase.PAUSED else f"phase is {phase or 'unknown'}"
        return f"not paused after a wave ({why}); nothing to promote"
    if action == "retry" and phase not in FAILED_PHASES:
        return f"phase is {phase or 'unknown'}; only a Failed or RolledBack rollout is retried"
    if action == "skip-analysis" and _analyzing(obj) is None:
        return "no wave is being analyzed; nothing to skip"
    if action == "abort":
        return _not_started(obj)
    return None


def _not_started(obj: dict[str, Any]) -> str | None:
    """Why there is no rollout of the desired version to abort yet (an abort names the rollout by
    its start), or None."""
    status = obj.get("status") or {}
    version = desired_version(obj)
    if version is None:
        return "nothing to abort: its versionFrom has not been resolved yet"
    if status.get("targetVersion") != version or not status.get("startedAt"):
        return f"nothing to abort: the operator has not started rolling {version} out yet"
    return None


def _analyzing(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The spec wave whose analysis runs now, if one does (of the version being rolled out)."""
    status = obj.get("status") or {}
    if status.get("targetVersion") != desired_version(obj):
        return None
    waves = status.get("waves") or []
    return next(
        (w for w in waves if w.get("phase") == WavePhase.ANALYZING and w.get("specIndex") is not None), None
    )


def _checked(action: str, obj: dict[str, Any], name: str) -> dict[str, Any]:
    why = refusal(action, obj)
    if why is not None:
        raise ActionError(f"{name}: {why}", EXIT_REFUSED)
    return obj


def pause(api: BlockingKube, namespace: str, name: str) -> str:
    patch(api, namespace, name, {"spec": {"paused": True}})
    return f"{name}: paused (in-flight loads finish; no new calls)"


def resume(api: BlockingKube, namespace: str, name: str) -> str:
    patch(api, namespace, name, {"spec": {"paused": False}})
    return f"{name}: resumed"


def promote(api: BlockingKube, namespace: str, name: str) -> str:
    """Continue past the pauseAfterWave the rollout waits at (the last completed wave). The value
    names the version paused, so it promotes no later version that pauses after the same wave."""
    obj = _checked("promote", get(api, namespace, name), name)
    status = obj.get("status") or {}
    completed = int(status.get("currentWave") or 0)
    version = status.get("targetVersion") or desired_version(obj)
    value = f"{completed - 1}@{version}"
    patch(api, namespace, name, {"metadata": {"annotations": {PROMOTE_ANNOTATION: value}}})
    return f"{name}: promoted past wave {completed}"


def skip_analysis(api: BlockingKube, namespace: str, name: str) -> str:
    """End the running analysis as Skipped: its wave completes and the rollout goes on. The value
    names the wave and version, so it skips no later analysis (promote never skips one)."""
    obj = _checked("skip-analysis", get(api, namespace, name), name)
    wave = _analyzing(obj)
    assert wave is not None  # _checked refused otherwise
    version = desired_version(obj)
    value = f"{wave['specIndex']}@{version}"
    patch(api, namespace, name, {"metadata": {"annotations": {SKIP_ANALYSIS_ANNOTATION: value}}})
    return f"{name}: skipping the analysis of wave {int(wave['specIndex']) + 1}"


def abort(api: BlockingKube, namespace: str, name: str) -> str:
    """Roll the version being rolled out back. The value names that rollout, "<startedAt>@<version>",
    so it aborts no later rollout of the same version (the annotation stays on the CR)."""
    obj = _checked("abort", get(api, namespace, name), name)
    version = desired_version(obj)
    value = f"{(obj.get('status') or {}).get('startedAt')}@{version}"
    patch(api, namespace, name, {"metadata": {"annotations": {ABORT_ANNOTATION: value}}})
    return f"{name}: aborting {version}; updated workers go back to the previous version"


def retry(api: BlockingKube, namespace: str, name: str) -> str:
    """Roll the same version out again after it ended Failed or RolledBack. An abort of that
    version is withdrawn in the same patch (an operator from before aborts named their rollout
    would stop the retry at once)."""
    obj = _checked("retry", get(api, namespace, name), name)
    phase = (obj.get("status") or {}).get("phase")
    version = desired_version(obj)
    token = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f".{time.time_ns() % 1_000_000:06d}"
    annotations: dict[str, str | None] = {RETRY_ANNOTATION: token}
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(ABORT_ANNOTATION) or ""
    aborted = value.rpartition("@")[2] == version
    if aborted:
        annotations[ABORT_ANNOTATION] = None  # merge patch: null removes the key
    patch(api, namespace, name, {"metadata": {"annotations": annotations}})
    return f"{name}: retrying {version} (was {phase}{'; its abort withdrawn' if aborted else ''})"


ACTIONS: dict[str, Callable[[BlockingKube, str, str], str]] = {
    "pause": pause,
    "resume": resume,
    "promote": promote,
    "abort": abort,
    "retry": retry,
    "skip-analysis": skip_analysis,
}
