"""The apiserver from synchronous code (the user commands, the dashboard's watch threads, the
release client, the leader's renewal thread) through kubernetes_asyncio, the operator's one
Kubernetes client. Every call runs on one event loop in a daemon thread and the caller's thread
waits for it, so this works whether or not the caller's thread runs a loop of its own (the
dashboard's does, a notebook's may). A client's aiohttp session is made on that loop and closed
on it when the process exits.

Not ckpt_rollout.io.kube: importing that registers the operator's metrics in the caller's
Prometheus registry (a trainer's, for the release client).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# How often a call answered 429 with a Retry-After is asked again (after that long): the request
# was not served (the apiserver's storage still starting, its flow control), and the sync client
# the commands used before, through urllib3, did the same.
RETRIES_AFTER_429 = 3


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="kube-calls", daemon=True).start()

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """``make()`` awaited on the loop (made there too: a client's calls need its loop)."""

        async def awaited() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(awaited(), self.loop).result()


_shared: _Loop | None = None
_shared_lock = threading.Lock()


def _loop() -> _Loop:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = _Loop()
            atexit.register(_close_open)
        return _shared


# Clients not closed yet, held until they are: a command's or the dashboard's lives as long as
# the process and is closed at exit (aiohttp warns on stderr about a session collected open).
_open: set[BlockingKube] = set()


def _close_open() -> None:
    for kube in list(_open):
        kube.close()


def retry_after(exc: Any) -> float | None:
    """The seconds a 429 answer asks to wait before asking again (None: not such an answer)."""
    value = (getattr(exc, "headers", None) or {}).get("Retry-After")
    if getattr(exc, "status", None) != 429 or value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: the apiserver sends seconds
        return None


class BlockingKube:
    """A kubernetes_asyncio ApiClient whose calls block the calling thread until they answer.
    Errors come out as the async client raises them (ApiException, aiohttp's ClientError,
    TimeoutError)."""

    def __init__(self, api_client: Any, loop: _Loop) -> None:
        from kubernetes_asyncio import client

        self.api_client = api_client
        self._loop = loop
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self._closed = False
        _open.add(self)

    @classmethod
    def from_kubeconfig(cls, config_file: str | None = None, context: str | None = None) -> BlockingKube:
        """A client of the kubeconfig (None: $KUBECONFIG, else ~/.kube/config) and context (None:
        its current one). ConfigException or OSError when it cannot be used."""
        from kubernetes_asyncio import config

        paths = (config_file or os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)
        if not any(Path(p).expanduser().exists() for p in paths if p):
            # Said here: the client would log a warning of its own before failing the same way.
            raise config.ConfigException(f"no kubeconfig file at {os.pathsep.join(paths)}")
        loop = _loop()
        return cls(
            loop.run(lambda: config.new_client_from_config(config_file=config_file, context=context)), loop
        )

    @classmethod
    def in_cluster(cls) -> BlockingKube:
        """A client of the pod's service account; ConfigException outside a pod."""
        from kubernetes_asyncio import client, config

        configuration = type.__call__(client.Configuration)  # not a copy of the process default
        config.load_incluster_config(client_configuration=configuration)

        async def made() -> Any:
            return client.ApiClient(configuration)

        loop = _loop()
        return cls(loop.run(made), loop)

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """The answer of ``make()``, e.g. ``kube.call(lambda: kube.core.read_namespace("rl"))``;
        asked again after a 429's Retry-After (RETRIES_AFTER_429)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        for attempt in range(RETRIES_AFTER_429 + 1):
            try:
                return self._loop.run(make)
            except ApiException as exc:
                wait = retry_after(exc)
                if wait is None or attempt == RETRIES_AFTER_429:
                    raise
                time.sleep(wait)
        raise AssertionError("unreachable")

    def watch(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Generator[dict[str, Any], None, None]:
        """The events of ``func``'s watch (kubernetes_asyncio.watch.Watch.stream's arguments and
        events), one at a time; the stream is closed when the generator is closed or dropped."""
        from kubernetes_asyncio import watch

        async def made() -> Any:
            return watch.Watch()  # its own ApiClient, used to deserialize, belongs to the loop too

        stream = self.call(made)
        stream.stream(func, *args, **kwargs)

        async def step() -> tuple[bool, Any]:
            try:
                return True, await stream.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, event = self.call(step)
                if not more:
                    return
                yield event
        finally:
            self.call(stream.close)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _open.discard(self)
            self._loop.run(self.api_client.close)

    def __enter__(self) -> BlockingKube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
