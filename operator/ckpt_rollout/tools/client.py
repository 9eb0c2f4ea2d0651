"""The trainer's side of a rollout, from Python: publish a checkpoint directory as a version,
set it as a CheckpointRollout's target, wait until the fleet serves it.

    from ckpt_rollout.tools.client import release
    result = release("global_step_1200", source_dir=ckpt_dir, rollout="fleet", namespace="rl",
                     publish_root="/mnt/ckpt")
    print(result.summary)

Needs only the operator's dependencies (the Kubernetes client), except `publish`, which runs
the checkpoint publisher (`ckpt_source`, which the agent also uses) and so needs
`pip install 'ckpt-rollout[agent]'` for its numpy and xxhash (the operator image lacks it: there,
`set_target_version` and `wait_for` work, `publish` says what to install).

The version is set the way the CR is owned: a CR with spec.versionFrom gets the version in its
ConfigMap key (the ConfigMap created if absent); any other gets a merge patch of spec.version
(with spec.source.manifestDigest when the CR pins one), by field manager `ckpt-rollout-release`.
Credentials: the kubeconfig given, else $KUBECONFIG or ~/.kube/config, else the pod's service
account (a trainer running in the cluster). Failures raise ReleaseError (its `code` is the
CLI's exit code): ReleaseFailed when the rollout fails, ReleaseTimeout when it does not end in
time; neither undoes anything, and before the version is set nothing is changed at all.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload
from urllib.parse import quote, urlsplit

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.versions import validate_version
from ckpt_api.vocabulary import ConditionType
from ckpt_rollout.io.blocking_kube import BlockingKube
from ckpt_rollout.tools import actions
from ckpt_rollout.tools.actions import EXIT_API_ERROR, EXIT_UNREACHABLE, ActionError
from ckpt_rollout.tools.release import (
    FIELD_MANAGER,
    ConfigMapKey,
    SpecVersion,
    VersionTarget,
    outcome,
    publish_dir,
    stall_stamp,
    summary,
    updated_bytes,
    version_patch,
    version_target,
)

__all__ = [
    "FIELD_MANAGER",
    "Published",
    "ReleaseError",
    "ReleaseFailed",
    "ReleaseResult",
    "ReleaseTimeout",
    "VersionSet",
    "publish",
    "release",
    "set_target_version",
    "wait_for",
]

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 7
PUBLISHER_MISSING = (
    "publishing needs the checkpoint publisher (ckpt_source): pip install 'ckpt-rollout[agent]'"
)
# Past the CR's own progress deadline (which fails the rollout with its reason) before a wait
# gives up without one.
DEADLINE_GRACE_S = 60.0
DEFAULT_PROGRESS_DEADLINE_S = 1800.0
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ReleaseError(Exception):
    """Release could not do what was asked; ``code`` is `ckpt-rollout release`'s exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class ReleaseFailed(ReleaseError):
    """The rollout of the version ended Failed or RolledBack, or is Stalled: the CR's reason
    and message. The status is left as the operator wrote it."""

    def __init__(
        self,
        rollout: str,
        phase: str | None,
        reason: str | None,
        message: str | None,
        workers: tuple[str, ...] = (),
    ) -> None:
        said = ": ".join(p for p in (reason, message) if p) or "no reason given"
        first = f" (worker {workers[0]})" if workers else ""
        super().__init__(f"{rollout}: {phase or ConditionType.STALLED}: {said}{first}", EXIT_FAILED)
        self.phase, self.reason, self.detail, self.workers = phase, reason, message, workers


class ReleaseTimeout(ReleaseError):
    """The rollout did not end in time; it goes on (nothing is undone)."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message, EXIT_TIMEOUT)
        self.status = status


@dataclass(frozen=True)
class Published:
    version: str
    digest: str  # sha256 of the manifest: what spec.source.manifestDigest pins
    path: Path
    bytes: int
    seconds: float


@dataclass(frozen=True)
class VersionSet:
    """Where the version was written, and the CR's Stalled condition before (see wait_for)."""

    version: str
    rollout: str
    namespace: str
    target: VersionTarget
    stale_stall: str | None


@dataclass(frozen=True)
class ReleaseResult:
    version: str
    rollout: str
    namespace: str
    phase: str | None
    seconds: float
    updated: int
    replicas: int
    loaded: dict[str, int]  # bytes each worker pulled, from the statuses seen
    summary: str
    status: dict[str, Any] = field(repr=False)
    published: Published | None = None


@dataclass(frozen=True)
class _Cluster:
    kube: BlockingKube
    namespace: str


@contextmanager
def _as_release_errors() -> Iterator[None]:
    try:
        yield
    except ActionError as exc:
        raise ReleaseError(str(exc), exc.code) from None


@contextmanager
def _connect(
    kubeconfig: str | os.PathLike[str] | None, context: str | None, namespace: str | None
) -> Iterator[_Cluster]:
    """A client of its own, closed afterwards (the process's default kubernetes configuration is
    left alone: a training script may use it for something else)."""
    from kubernetes_asyncio import config

    try:
        default = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
        if kubeconfig is not None or context is not None or default.exists():
            path = None if kubeconfig is None else str(kubeconfig)
            kube = BlockingKube.from_kubeconfig(path, context)
            contexts, active = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c.get("name") == context), active)
            own = (chosen or {}).get("context", {}).get("namespace")
        else:
            kube = BlockingKube.in_cluster()
            own = (
                _SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
                if _SERVICE_ACCOUNT_NAMESPACE.exists()
                else None
            )
    except (config.ConfigException, OSError) as exc:
        raise ReleaseError(
            f"no usable kubeconfig or in-cluster credentials: {exc}", EXIT_UNREACHABLE
        ) from None
    with kube:
        yield _Cluster(kube, namespace or own or "default")


# -- publish ------------------------------------------------------------------------------------


def publisher_installed() -> bool:
    # The operator's wheel ships ckpt_source without the agent extra's libraries it hashes with.
    return all(importlib.util.find_spec(m) is not None for m in ("ckpt_source", "numpy", "xxhash", "blake3"))


def publish(
    version: str,
    source_dir: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str],
    link: bool = False,
    progress: bool = False,
) -> Published:
    """Publish ``source_dir`` (a Hugging Face model directory, a .safetensors file or a paddle
    state dict: whatever `ckpt-rollout publish` takes) as ``version`` under ``root``. Atomic and
    never overwriting; ReleaseError naming the file for a checkpoint that cannot be published,
    and nothing is left under ``root`` then. ``progress``: report on stderr as `publish` does."""
    _check_version(version)
    if not publisher_installed():
        raise ReleaseError(PUBLISHER_MISSING)
    from ckpt_source.publish import PublishError, publish_version
    from ckpt_source.publish.progress import Bar, Lines, Reporter, Silent

    reporter: Reporter = Silent()
    if progress:
        import sys

        reporter = Bar(f"publish {version}") if sys.stderr.isatty() else Lines()
    try:
        result = publish_version(Path(source_dir), version, Path(root), link=link, reporter=reporter)
    except PublishError as exc:
        raise ReleaseError(f"publish: {' '.join(str(exc).split())}") from None
    return Published(result.version, result.digest, result.path, result.bytes, result.seconds)


def check_served(source_uri: str, version: str, digest: str, timeout: float = 10.0) -> bool:
    """Whether an http(s) source serves ``version`` with this manifest digest: a wrong publish
    root must not get as far as a rollout. False when it cannot be asked from here (not http,
    a cluster-internal name this machine cannot resolve, TLS it cannot verify, a proxy);
    ReleaseError when it answers, but not with this version."""
    parts = urlsplit(source_uri)
    if parts.scheme not in ("http", "https"):
        return False
    url = f"{source_uri.rstrip('/')}/{quote(version)}/manifest.json"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (the scheme is checked)
            served = "sha256:" + hashlib.sha256(resp.read()).hexdigest()
    except urllib.error.HTTPError as exc:
        if exc.code != 404:  # e.g. a proxy in the way: the source itself was not asked
            return False
        raise ReleaseError(
            f"published, but {source_uri} answers HTTP 404 for {version}: is the publish root the "
            "directory `ckpt-rollout serve` serves? The version was not set"
        ) from None
    except (urllib.error.URLError, OSError):
        return False
    if served != digest:
        raise ReleaseError(
            f"{source_uri} serves another {version} (manifest {served}, published {digest}): the publish "
            "root is not the directory it serves. The version was not set"
        )
    return True


# -- set the version ------------------------------------------------------------------------------


def set_target_version(
    version: str,
    *,
    rollout: str,
    namespace: str | None = None,
    digest: str | None = None,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
) -> VersionSet:
    """Make ``version`` the rollout's target, the way the CR is owned (module docstring).
    ``digest``: the version's manifest digest, needed when the CR pins one."""
    _check_version(version)
    with _connect(kubeconfig, context, namespace) as cluster:
        with _as_release_errors():
            obj = actions.get(cluster.kube, cluster.namespace, rollout)
        return _set(cluster, obj, version, digest)


def _target(obj: dict[str, Any], rollout: str) -> VersionTarget:
    try:
        return version_target(obj)
    except ValueError as exc:
        raise ReleaseError(f"checkpointrollout {rollout}: {exc}") from None


def _set(cluster: _Cluster, obj: dict[str, Any], version: str, digest: str | None) -> VersionSet:
    rollout = obj["metadata"]["name"]
    target = _target(obj, rollout)
    stale = stall_stamp(obj)
    if isinstance(target, ConfigMapKey):
        _write_config_map(cluster, target, version)
    else:
        try:
            body = version_patch(version, digest, target)
        except ValueError as exc:
            raise ReleaseError(f"checkpointrollout {rollout}: {exc}") from None
        with _as_release_errors():
            actions.request(
                "patch",
                cluster.namespace,
                rollout,
                lambda: cluster.kube.call(
                    lambda: cluster.kube.custom.patch_namespaced_custom_object(
                        *_cr_path(cluster.namespace),
                        rollout,
                        body,
                        field_manager=FIELD_MANAGER,
                        _content_type=actions.MERGE_PATCH,
                    )
                ),
            )
    return VersionSet(version, rollout, cluster.namespace, target, stale)


def _cr_path(namespace: str) -> tuple[str, str, str, str]:
    return GROUP, VERSION, namespace, PLURAL


def _write_config_map(cluster: _Cluster, ref: ConfigMapKey, version: str) -> None:
    """Set the key, keeping the ConfigMap's other keys; create the ConfigMap if it is absent."""
    from aiohttp import ClientError
    from kubernetes_asyncio.client.exceptions import ApiException

    what = f"configmap {cluster.namespace}/{ref.name}"
    core = cluster.kube.core

    def patch() -> None:
        cluster.kube.call(
            lambda: core.patch_namespaced_config_map(
                ref.name,
                cluster.namespace,
                {"data": {ref.key: version}},
                field_manager=FIELD_MANAGER,
                _content_type=actions.MERGE_PATCH,
            )
        )

    try:
        try:
            patch()
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"metadata": {"name": ref.name}, "data": {ref.key: version}}
            try:
                cluster.kube.call(
                    lambda: core.create_namespaced_config_map(
                        cluster.namespace, body, field_manager=FIELD_MANAGER
                    )
                )
            except ApiException as again:
                if again.status != 409:  # created meanwhile by someone else: set the key in it
                    raise
                patch()
    except ApiException as exc:
        raise ReleaseError(f"{what}: HTTP {exc.status}: {exc.reason}", EXIT_API_ERROR) from None
    except (ClientError, OSError) as exc:  # TimeoutError is an OSError
        raise ReleaseError(f"cannot reach the apiserver: {exc}", EXIT_UNREACHABLE) from None


# -- wait -----------------------------------------------------------------------------------------


def wait_for(
    version: str,
    *,
    rollout: str,
    namespace: str | None = None,
    timeout: float | None = None,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    stale_stall: str | None = None,
) -> ReleaseResult:
    """Follow the rollout (watch API) until ``version`` is its target and Complete: the
    result; ReleaseFailed when it fails (or stalls), ReleaseTimeout after ``timeout`` seconds
    (default: the CR's progressDeadlineSeconds and a minute). ``stale_stall``: VersionSet's, so
    a Stalled condition from before the version was set does not count against it."""
    _check_version(version)
    with _connect(kubeconfig, context, namespace) as cluster:
        return _wait(cluster, rollout, version, timeout, stale_stall, time.monotonic())


def _wait(
    cluster: _Cluster,
    rollout: str,
    version: str,
    timeout: float | None,
    stale: str | None,
    started: float,
    published: Published | None = None,
) -> ReleaseResult:
    ns = cluster.namespace
    with _as_release_errors():
        obj = actions.get(cluster.kube, ns, rollout)
        limit = _default_timeout(obj) if timeout is None else timeout
        deadline = time.monotonic() + limit
        loaded: dict[str, int] = {}
        while True:
            loaded = updated_bytes(loaded, obj, version)
            verdict = outcome(obj, version, stale)
            if verdict.done:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                status = obj.get("status") or {}
                raise ReleaseTimeout(
                    f"{rollout}: {version} not complete after {limit:.0f}s (target "
                    f"{status.get('targetVersion')}, {status.get('phase')}: {status.get('message')}); "
                    "the rollout goes on",
                    status,
                )
            obj = actions.next_change(cluster.kube, ns, rollout, obj, left) or obj
    if not verdict.succeeded:
        raise ReleaseFailed(rollout, verdict.phase, verdict.reason, verdict.message, verdict.workers)
    status = obj.get("status") or {}
    seconds = time.monotonic() - started
    return ReleaseResult(
        version=version,
        rollout=rollout,
        namespace=ns,
        phase=verdict.phase,
        seconds=seconds,
        updated=int(status.get("updatedReplicas") or 0),
        replicas=int(status.get("replicas") or 0),
        loaded=loaded,
        summary=summary(obj, version, seconds, loaded, None if published is None else published.bytes),
        status=status,
        published=published,
    )


def _default_timeout(obj: dict[str, Any]) -> float:
    timeouts = (obj.get("spec") or {}).get("timeouts") or {}
    return float(timeouts.get("progressDeadlineSeconds") or DEFAULT_PROGRESS_DEADLINE_S) + DEADLINE_GRACE_S


# -- all three ------------------------------------------------------------------------------------


@overload
def release(
    version: str,
    *,
    source_dir: str | os.PathLike[str] | None,
    rollout: str,
    namespace: str | None = None,
    wait: Literal[True] = True,
    timeout: float | None = None,
    publish_root: str | os.PathLike[str] | None = None,
    link: bool = False,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    progress: bool = False,
) -> ReleaseResult: ...


@overload
def release(
    version: str,
    *,
    source_dir: str | os.PathLike[str] | None,
    rollout: str,
    namespace: str | None = None,
    wait: Literal[False],
    timeout: float | None = None,
    publish_root: str | os.PathLike[str] | None = None,
    link: bool = False,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    progress: bool = False,
) -> VersionSet: ...


def release(
    version: str,
    *,
    source_dir: str | os.PathLike[str] | None,
    rollout: str,
    namespace: str | None = None,
    wait: bool = True,
    timeout: float | None = None,
    publish_root: str | os.PathLike[str] | None = None,
    link: bool = False,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    progress: bool = False,
) -> ReleaseResult | VersionSet:
    """Publish ``source_dir`` as ``version`` into the rollout's source (None: it is published
    already), set it as the target, and (``wait``) return once the fleet serves it. Where to
    publish: ``publish_root``, else a file:// source's directory; an http(s) or mooncake source
    needs ``publish_root`` (the directory `ckpt-rollout serve` serves). Everything is checked
    before anything is written: a bad version, an absent publisher package, a CR release cannot
    drive, a source it cannot publish to raise ReleaseError with nothing changed. Without
    ``wait``: the VersionSet."""
    started = time.monotonic()
    _check_version(version)
    if source_dir is not None and not publisher_installed():
        raise ReleaseError(PUBLISHER_MISSING)
    with _connect(kubeconfig, context, namespace) as cluster:
        with _as_release_errors():
            obj = actions.get(cluster.kube, cluster.namespace, rollout)
        target = _target(obj, rollout)
        if isinstance(target, SpecVersion) and target.pinned and source_dir is None:
            raise ReleaseError(
                f"checkpointrollout {rollout}: it pins spec.source.manifestDigest, and a version published "
                "elsewhere has no digest here; publish it with release (source_dir=, --from)"
            )
        published = None
        if source_dir is not None:
            uri = str(((obj.get("spec") or {}).get("source") or {}).get("uri") or "")
            try:
                root = publish_dir(uri, None if publish_root is None else Path(publish_root))
            except ValueError as exc:
                raise ReleaseError(f"checkpointrollout {rollout}: {exc}") from None
            published = publish(version, source_dir, root=root, link=link, progress=progress)
            check_served(uri, version, published.digest)
            with _as_release_errors():  # read again: publishing a big checkpoint takes a while
                obj = actions.get(cluster.kube, cluster.namespace, rollout)
        done = _set(cluster, obj, version, None if published is None else published.digest)
        if not wait:
            return done
        return _wait(cluster, rollout, version, timeout, done.stale_stall, started, published)


def _check_version(version: str) -> None:
    try:
        validate_version(version)
    except ValueError as exc:
        raise ReleaseError(str(exc)) from None
