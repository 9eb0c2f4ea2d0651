"""Pod-runtime stand-in (test harness only): runs a real process per Running pod.

kwok makes pods Running with loopback IPs but runs no containers. `PodRuntime` plays the
kubelet for the pods matching a label selector: it watches them, starts `command(pod)` bound
to the pod's IP with the downward-API variables set (POD_NAME, POD_NAMESPACE, POD_IP, ...),
captures each process's output to a log file, and stops the process once the pod is being
deleted or gone. It is driven by a list+watch, so it follows pods within milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ckpt_api.vocabulary import PodPhase

from .kwok_stages import KUBELET_STOP_LABEL
from .procs import spawn, stop, wait_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodInfo:
    name: str
    namespace: str
    uid: str
    ip: str
    node: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Launch:
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    # For a workload that lives outside the spawned process group (a container: conmon keeps it
    # when the podman client dies): how to SIGKILL it, and what to remove once it is stopped.
    kill: Callable[[], None] | None = None
    cleanup: Callable[[], None] | None = None


CommandFactory = Callable[[PodInfo], "Launch | Sequence[str]"]


@dataclass
class PodProcess:
    pod: PodInfo
    proc: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    cleanup: Callable[[], None] | None = None

    def stop(self, grace: float) -> None:
        stop(self.proc, grace)
        if self.cleanup is not None:
            self.cleanup()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def _pod_info(pod: dict[str, Any]) -> PodInfo | None:
    """The pod if it should have a process now: Running, has an IP, not being deleted."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    if meta.get("deletionTimestamp") or status.get("phase") != PodPhase.RUNNING:
        return None
    if not status.get("podIP"):
        return None
    return PodInfo(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        ip=status["podIP"],
        node=pod.get("spec", {}).get("nodeName", ""),
        labels=dict(meta.get("labels") or {}),
    )


class PodRuntime:
    """Start with `start()` (or a `with` block); `stop()` stops every process it started."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        label_selector: str,
        command: CommandFactory,
        log_dir: Path,
        grace: float = 5.0,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.label_selector = label_selector
        self._command = command
        self.log_dir = log_dir
        self._grace = grace
        self._lock = threading.Lock()
        self._procs: dict[str, PodProcess] = {}  # by pod uid
        self._logs: dict[str, Path] = {}  # pod name -> latest log
        self.exited: list[tuple[PodInfo, int]] = []  # processes that ended while their pod ran
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None

    # ------------------------------------------------------------------ public API

    def start(self, timeout: float = 30.0) -> PodRuntime:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Children are spawned from this thread (their parent-death signal is tied to it),
        # so it lives until stop().
        self._thread = threading.Thread(target=self._run, name=f"podruntime-{self.namespace}", daemon=True)
        self._thread.start()
        wait_for(
            lambda: self._synced.is_set() or not self._thread_alive(), timeout, "pod runtime initial list"
        )
        if not self._synced.is_set():
            raise RuntimeError(f"pod runtime failed to start: {self.last_error!r}")
        return self

    def stop(self) -> None:
        self._stopping.set()
        resp = self._response
        if resp is not None:
            # Unblocks the watch read in the runtime thread; EBADF: the thread closed that watch
            # itself meanwhile (it ended), so nothing blocks on it.
            with contextlib.suppress(OSError):
                resp.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=self._grace * 2 + 10)
        with self._lock:
            leftovers = list(self._procs.values())
            self._procs.clear()
        for pp in leftovers:  # only if the thread could not finish its own cleanup
            pp.stop(self._grace)

    def __enter__(self) -> PodRuntime:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def running(self) -> dict[str, PodProcess]:
        """Live processes by pod name."""
        with self._lock:
            return {pp.pod.name: pp for pp in self._procs.values() if pp.alive}

    def log_path(self, pod_name: str) -> Path:
        """Log of the most recent process started for `pod_name`."""
        with self._lock:
            return self._logs[pod_name]

    # ------------------------------------------------------------------ runtime thread

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    version = self._relist()
                    self._synced.set()
                    self._watch(version)
                except Exception as exc:  # keep following pods; see last_error
                    if self._stopping.is_set():
                        break
                    self.last_error = exc
                    log.warning("pod runtime %s: %r; relisting", self.namespace, exc)
                    self._stopping.wait(0.5)
        finally:
            self._stop_all()

    def _relist(self) -> str:
        resp: Any = self._core.list_namespaced_pod(
            self.namespace, label_selector=self.label_selector, _preload_content=False
        )
        body = json.loads(resp.data)
        wanted = {p.uid: p for p in map(_pod_info, body["items"]) if p is not None}
        with self._lock:
            gone = [uid for uid in self._procs if uid not in wanted]
        for uid in gone:
            self._stop_pod(uid)
        for info in wanted.values():
            self._ensure(info)
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> None:
        while not self._stopping.is_set():
            resp: Any = self._core.list_namespaced_pod(
                self.namespace,
                label_selector=self.label_selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
                _preload_content=False,
            )
            self._response = resp
            if self._stopping.is_set():  # stop() ran before the response existed
                resp.release_conn()
                return
            try:
                for event in _events(resp):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":  # typically 410 Gone: our version is too old
                        raise RuntimeError(f"watch error: {obj.get('message')}")
                    version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    info = None if kind == "DELETED" else _pod_info(obj)
                    if info is None:
                        self._stop_pod(obj["metadata"]["uid"])
                        if kind != "DELETED":
                            self._release(obj)
                    else:
                        self._ensure(info)
                    self._reap()
            finally:
                self._response = None
                resp.release_conn()
            self._reap()

    def _ensure(self, info: PodInfo) -> None:
        with self._lock:
            if info.uid in self._procs:
                return
        launch = self._command(info)
        if not isinstance(launch, Launch):
            launch = Launch(argv=list(launch))
        env = {
            **os.environ,
            "POD_NAME": info.name,
            "POD_NAMESPACE": info.namespace,
            "POD_IP": info.ip,
            "POD_UID": info.uid,
            "NODE_NAME": info.node,
            **launch.env,
        }
        log_path = self.log_dir / f"{info.name}.{info.uid[:8]}.log"
        proc = spawn(launch.argv, log_path, env=env, cwd=launch.cwd)
        with self._lock:
            self._procs[info.uid] = PodProcess(info, proc, log_path, time.monotonic(), launch.cleanup)
            self._logs[info.name] = log_path

    def _stop_pod(self, uid: str) -> None:
        # Forgotten only once stopped, so running() never omits a process that is still alive.
        with self._lock:
            pp = self._procs.get(uid)
        if pp is not None:
            pp.stop(self._grace)
            with self._lock:
                self._procs.pop(uid, None)

    def _release(self, pod: dict[str, Any]) -> None:
        """A pod that leaves as a kubelet lets it (kwok_stages.KUBELET_STOP_LABEL), its process
        stopped: it goes now, as a kubelet's last delete makes it go."""
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp") or KUBELET_STOP_LABEL not in (meta.get("labels") or {}):
            return
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        with contextlib.suppress(ApiException):  # gone already
            self._core.delete_namespaced_pod(meta["name"], meta["namespace"], body=options)

    def _reap(self) -> None:
        """Note processes that died on their own; they are not restarted (tests look at it)."""
        with self._lock:
            for pp in self._procs.values():
                code = pp.proc.poll()
                if code is not None and all(p is not pp.pod for p, _ in self.exited):
                    self.exited.append((pp.pod, code))

    def _stop_all(self) -> None:
        with self._lock:
            uids = list(self._procs)
        for uid in uids:
            self._stop_pod(uid)

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """Decode a watch stream: one JSON object per line, lines may span reads."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
