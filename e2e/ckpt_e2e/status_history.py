"""Every status one CheckpointRollout went through, as a user watching it sees them
(`kubectl get ckr NAME -w`), and who wrote its worker entries.

A watch delivers one event per write, so entries the operator folds away a moment later are
still seen: the only way to tell afterwards whether a wave's agents reported their loads
themselves (pushed) or the operator pulled the outcomes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import WorkerPhase

from .procs import WaitTimeout, wait_for

# Each watch request ends after this long and the next resumes from the last version seen:
# what bounds how long stopping the history takes.
_WATCH_SECONDS = 1


@dataclass
class StatusHistory:
    """The statuses of CR ``name`` in write order, collected by a thread (``record``)."""

    api: client.CustomObjectsApi
    namespace: str
    name: str
    # (resourceVersion, status) of every write seen; appended by the watch thread only.
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def follow(self, version: str) -> None:
        """Collect writes after ``version`` until stopped (the watch thread's body)."""
        try:
            while not self.stop.is_set():
                for event in watch.Watch().stream(
                    self.api.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=version,
                    timeout_seconds=_WATCH_SECONDS,
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch of {self.namespace}/{self.name} failed: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    self.seen.append((version, dict(obj.get("status") or {})))
        except BaseException as exc:  # surfaced to the test by statuses()
            self.error = exc

    def statuses(self) -> list[dict[str, Any]]:
        """Every status seen so far, once the watch has caught up with the CR as it is now."""

        def caught_up() -> bool:
            if self.error is not None:
                raise AssertionError(f"status history of {self.name} broke") from self.error
            current = self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
            return bool(self.seen) and self.seen[-1][0] == current["metadata"]["resourceVersion"]

        wait_for(caught_up, 30, f"the watch of {self.name} to catch up", interval=0.1)
        return [status for _, status in list(self.seen)]

    def phases(self, version: str) -> dict[str, list[str]]:
        """Per pod, the phases its status.workers entry for ``version`` went through."""
        seen: dict[str, list[str]] = {}
        for status in self.statuses():
            for pod, entry in (status.get("workers") or {}).items():
                phases = seen.setdefault(pod, [])
                phase = entry.get("phase")
                if entry.get("version") == version and (not phases or phases[-1] != phase):
                    phases.append(phase)
        return {pod: phases for pod, phases in seen.items() if phases}

    def agent_reported(self, version: str) -> set[str]:
        """Pods whose agent wrote its own entry for loading ``version`` (the push path: only an
        agent reports a load in progress; the operator records decided outcomes only)."""
        return {pod for pod, phases in self.phases(version).items() if WorkerPhase.LOADING in phases}

    def wait_reported(self, version: str, pods: Iterable[str], timeout: float = 30.0) -> None:
        """Wait until the agent of each of ``pods`` has written its whole load of ``version``
        (Loading, then Updated): its reports are queued and retried, so they may land after the
        operator pulled that pod and moved on."""
        expected = set(pods)

        def missing() -> list[str]:
            phases = self.phases(version)
            return sorted(p for p in expected if not _reported_whole_load(phases.get(p, [])))

        try:
            wait_for(lambda: not missing(), timeout, f"reports of {version}")
        except WaitTimeout:
            message = f"within {timeout:.0f}s these agents never wrote their load: {missing()}"
            raise AssertionError(message) from None


def _reported_whole_load(phases: list[str]) -> bool:
    """Loading, and Updated after it (an Updated before it is the operator's pulled entry)."""
    if WorkerPhase.LOADING not in phases:
        return False
    return WorkerPhase.UPDATED in phases[phases.index(WorkerPhase.LOADING) :]


@contextmanager
def record(api: client.ApiClient, namespace: str, name: str) -> Iterator[StatusHistory]:
    """The history of CR ``name`` (existing or not yet created) from now until the block ends."""
    custom = client.CustomObjectsApi(api)
    listing = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}"
    )
    history = StatusHistory(custom, namespace, name)
    for item in listing["items"]:
        history.seen.append((item["metadata"]["resourceVersion"], dict(item.get("status") or {})))
    start = listing["metadata"]["resourceVersion"]
    thread = threading.Thread(target=history.follow, args=(start,), name=f"watch-{name}", daemon=True)
    thread.start()
    try:
        yield history
    finally:
        history.stop.set()
        thread.join(timeout=_WATCH_SECONDS + 30)
