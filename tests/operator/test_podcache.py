"""The pod cache against a stand-in apiserver: paged list, then watch events (split across
reads), a 410 that forces a relist, and only callable pods kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION
from ckpt_rollout.domain.world import WeightsSignal
from ckpt_rollout.io.podcache import PodCache, running_pod


def _pod(name: str, ip: str | None = "127.1.0.1", phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "rl", "labels": {"app": "w"}, **meta},
        "status": {"phase": phase, **({"podIP": ip} if ip else {})},
    }


def _weights(name: str, status: str, reason: str) -> dict[str, Any]:
    pod = _pod(name)
    conditions = [
        {"type": "Ready", "status": "True"},
        {"type": WEIGHTS_READY_CONDITION, "status": status, "reason": reason, "message": f"{reason} v2"},
    ]
    return {**pod, "status": {**pod["status"], "conditions": conditions}}


async def test_a_pods_weights_ready_condition_is_kept_as_its_doorbell() -> None:
    cache = PodCache(client.ApiClient(), ["rl"])
    cache.apply("ADDED", _pod("a"))
    assert cache.get("rl")[0].weights is None, "no agent wrote it"
    cache.apply("MODIFIED", _weights("a", "False", "Loading"))
    assert cache.get("rl")[0].weights == WeightsSignal(False, "Loading", "Loading v2")
    cache.apply("MODIFIED", _weights("a", "True", "Loaded"))
    signal = cache.get("rl")[0].weights
    assert signal == WeightsSignal(True, "Loaded", "Loaded v2")
    assert not signal.loading


def test_only_running_pods_with_an_ip_that_are_not_deleted_count() -> None:
    assert running_pod(_pod("a")) is not None
    assert running_pod(_pod("a", ip=None)) is None
    assert running_pod(_pod("a", phase="Pending")) is None
    assert running_pod(_pod("a", deletionTimestamp="2026-01-01T00:00:00Z")) is None
    pod = running_pod(_pod("a", ip="127.1.0.9"))
    assert pod is not None
    assert (pod.name, pod.ip, dict(pod.labels)) == ("a", "127.1.0.9", {"app": "w"})


def _creating(name: str, waiting: str = "ContainerCreating") -> dict[str, Any]:
    """A pending pod whose container waits for ``waiting``."""
    pod = _pod(name, None, "Pending")
    pod["status"]["containerStatuses"] = [{"name": "agent", "state": {"waiting": {"reason": waiting}}}]
    return pod


async def test_a_pod_waiting_to_start_is_kept_only_in_what_tells_why() -> None:
    pod = _creating("p", "ImagePullBackOff")
    pod["spec"] = {
        "containers": [{"name": "agent", "image": "x", "env": [{"name": "A", "value": "b" * 1000}]}]
    }
    pod["metadata"]["managedFields"] = [{"manager": "kube-controller-manager"}]
    # Its age (a container creating too long) and uid (its Warning events are listed by it).
    pod["metadata"].update(uid="uid-p", creationTimestamp="2026-12-02T10:00:00Z")
    cache = PodCache(client.ApiClient(), ["rl"])
    cache.apply("ADDED", pod)
    (kept,) = cache.waiting("rl")
    assert kept == {
        "metadata": {
            "name": "p",
            "namespace": "rl",
            "uid": "uid-p",
            "labels": {"app": "w"},
            "creationTimestamp": "2026-12-02T10:00:00Z",
        },
        "status": pod["status"],
    }


class StandIn:
    """Serves pods of namespace rl: a two-page list, then scripted watch streams."""

    def __init__(self) -> None:
        self.pages = [[_pod("a", "127.1.0.1"), _pod("b", "127.1.0.2")], [_pod("c", None, "Pending")]]
        self.watches: list[list[dict[str, Any]]] = []
        self.lists = 0
        self.watch_versions: list[str] = []
        self.release = asyncio.Event()

    async def pods(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("true", "True", "1"):
            return await self._watch(request)
        page = int(request.query.get("continue") or 0)
        if page == 0:
            self.lists += 1
        more = page + 1 < len(self.pages)
        meta = {"resourceVersion": f"{self.lists}0", **({"continue": str(page + 1)} if more else {})}
        return web.json_response({"items": self.pages[page], "metadata": meta})

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        self.watch_versions.append(request.query["resourceVersion"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        events = self.watches.pop(0) if self.watches else []
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        for i in range(0, len(data), 7):  # lines split across reads
            await resp.write(data[i : i + 7])
        if not self.watches and not events:
            await self.release.wait()  # an idle watch: held open until the test ends
        return resp


@pytest.fixture
async def standin() -> AsyncIterator[tuple[StandIn, client.ApiClient]]:
    server = StandIn()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/rl/pods", server.pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api = client.ApiClient(configuration=client.Configuration(host=f"http://127.0.0.1:{port}"))
    yield server, api
    server.release.set()
    await api.close()
    await runner.cleanup()


async def _until(predicate: Any, what: str) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_list_then_watch_then_relist_after_410(standin: tuple[StandIn, client.ApiClient]) -> None:
    server, api = standin
    server.watches = [
        [
            {"type": "ADDED", "object": _pod("d", "127.1.0.4")},
            {"type": "MODIFIED", "object": _pod("c", "127.1.0.3")},  # c got Running with an IP
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "17"}}},
            {"type": "DELETED", "object": _pod("a")},
        ],
        [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
    ]
    cache = PodCache(api, ["rl"], watch_timeout_s=5)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.wait_synced(), 5)
        await _until(lambda: server.lists == 2, "a relist after the 410")
        # After the relist the cache holds exactly the listed callable pods again, and the
        # pod not Running yet among those waiting to start.
        await _until(lambda: sorted(p.name for p in cache.get("rl")) == ["a", "b"], "the relisted pods")
        assert [p["metadata"]["name"] for p in cache.waiting("rl")] == ["c"]
        assert server.watch_versions[:2] == ["10", "17"], "the second watch resumes from the bookmark"
        assert cache.get("other") == []
    finally:
        task.cancel()


async def test_watch_events_update_the_cache(standin: tuple[StandIn, client.ApiClient]) -> None:
    server, api = standin
    server.watches = [
        [
            {"type": "MODIFIED", "object": _pod("c", "127.1.0.3")},
            {"type": "DELETED", "object": _pod("a")},
            {"type": "MODIFIED", "object": _pod("b", deletionTimestamp="2026-01-01T00:00:00Z")},
        ]
    ]
    cache = PodCache(api, ["rl"], watch_timeout_s=5)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.wait_synced(), 5)
        await _until(lambda: [p.name for p in cache.get("rl")] == ["c"], "the watched changes")
        assert cache.get("rl")[0].ip == "127.1.0.3"
        assert cache.waiting("rl") == [], "c runs now; b, being deleted, will never start"
    finally:
        task.cancel()


@pytest.mark.parametrize(
    ("kind", "pod", "wakes"),
    [
        ("MODIFIED", _pod("a", "127.1.0.1"), False),  # a condition or other status changed
        ("MODIFIED", _weights("a", "False", "Loading"), False),  # a doorbell, kept unwoken
        ("MODIFIED", _pod("a", "127.1.0.7"), True),  # a new IP: calls go elsewhere
        ("MODIFIED", {**_pod("a"), "metadata": {"name": "a", "namespace": "rl", "labels": {}}}, True),
        ("MODIFIED", _pod("a", phase="Failed"), True),  # no longer callable
        ("DELETED", _pod("a"), True),
        ("ADDED", _pod("new", "127.1.0.8"), True),
        # Not callable yet, but why it cannot start may be shown (domain.troubles.pod_trouble).
        ("ADDED", _pod("new", None, "Pending"), True),
        ("MODIFIED", _creating("p"), False),  # nothing about its start changed
        ("MODIFIED", _creating("p", "ImagePullBackOff"), True),
        ("DELETED", _creating("p"), True),  # no longer one to show
        ("DELETED", _pod("never-seen"), False),
    ],
)
async def test_daemons_wake_only_for_changes_a_rollout_reads(
    kind: str, pod: dict[str, Any], wakes: bool
) -> None:
    cache = PodCache(client.ApiClient(), ["rl"])
    cache.apply("ADDED", _pod("a", "127.1.0.1"))
    cache.apply("ADDED", _creating("p"))
    woken, elsewhere = asyncio.Event(), asyncio.Event()
    cache.subscribe("rl", woken)
    cache.subscribe("other", elsewhere)
    cache.apply(kind, pod)
    assert woken.is_set() is wakes
    assert not elsewhere.is_set()
    cache.unsubscribe("rl", woken)
    woken.clear()
    cache.apply("DELETED", _pod("a"))
    assert not woken.is_set(), "an unsubscribed daemon is not woken"
