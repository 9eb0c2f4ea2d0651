"""The doorbell of a pulled wave, end to end in the operator's process: a change of only a pod's
WeightsReady condition reaches the daemons that listen for it (their last step left a pulled member
to it) and none of those that wait for a change a rollout reads."""

from __future__ import annotations

import asyncio
from typing import Any

from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter
from kubernetes_asyncio import client

from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION
from ckpt_rollout.controller.daemon import Waker
from ckpt_rollout.io.podcache import PodCache


def _pod(reason: str | None, ip: str = "127.1.0.1") -> dict[str, Any]:
    conditions = [{"type": WEIGHTS_READY_CONDITION, "status": "False", "reason": reason}] if reason else []
    return {
        "metadata": {"name": "a", "namespace": "rl", "labels": {"app": "w"}},
        "status": {"phase": "Running", "podIP": ip, "conditions": conditions},
    }


async def test_only_a_weights_ready_change_rings_and_only_listeners_hear_it() -> None:
    cache = PodCache(client.ApiClient(), ["rl"])
    cache.apply("ADDED", _pod(None))
    woken, rung = asyncio.Event(), asyncio.Event()
    cache.subscribe("rl", woken)
    cache.listen("rl", rung)
    cache.apply("MODIFIED", _pod("Loading"))
    assert (woken.is_set(), rung.is_set()) == (False, True)
    rung.clear()
    cache.apply("MODIFIED", _pod("Loading"))
    assert not rung.is_set(), "the same condition again rings nothing"
    cache.apply("MODIFIED", _pod("Loaded", ip="127.1.0.9"))
    assert (woken.is_set(), rung.is_set()) == (True, False), "a change a rollout reads wakes instead"
    woken.clear()
    cache.unlisten("rl", rung)
    cache.apply("MODIFIED", _pod("Failed", ip="127.1.0.9"))
    assert not rung.is_set(), "an unlistened doorbell"
    assert not woken.is_set()


async def test_a_daemon_hears_the_doorbell_only_while_it_listens() -> None:
    setter: FlagSetter[Any] = FlagSetter()
    stopped: AsyncFlagWaiter[Any] = AsyncFlagWaiter(setter)
    cache = PodCache(client.ApiClient(), ["rl"])
    cache.apply("ADDED", _pod("Loading"))
    deaf, listening = Waker(), Waker()
    for waker in (deaf, listening):
        cache.listen("rl", waker.rung)
    sleeps = [
        asyncio.create_task(deaf.sleep(stopped, 60, doorbell=False)),
        asyncio.create_task(listening.sleep(stopped, 60, doorbell=True)),
    ]
    await asyncio.sleep(0.05)
    assert not any(s.done() for s in sleeps)
    cache.apply("MODIFIED", _pod("Loaded"))
    await asyncio.wait_for(sleeps[1], 10)
    assert not sleeps[0].done(), "a daemon whose step waits on no doorbell sleeps on"
    setter.set()
    await asyncio.wait_for(sleeps[0], 10)
