"""The operator and the agent run on uvloop where it is installed (both images and the dev venv
install it), and on asyncio's loop where it is not."""

from __future__ import annotations

import asyncio
import builtins
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from ckpt_api import process_runtime


async def _loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_result() -> None:
    assert process_runtime.run(_loop_type()) is uvloop.Loop


def test_without_uvloop_the_loop_is_asyncios(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    loop = process_runtime.new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()
    assert process_runtime.run(_loop_type()) is not uvloop.Loop


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


@pytest.mark.usefixtures("restored_gc")
def test_freeze_start_up_frees_start_up_garbage_freezes_the_rest_and_keeps_the_thresholds() -> None:
    thresholds = gc.get_threshold()
    before = gc.get_freeze_count()
    garbage = weakref.ref(_Node())
    kept = _Node()
    kept_ref = weakref.ref(kept)
    process_runtime.freeze_start_up()
    assert garbage() is None, "garbage left by start-up is collected, not frozen"
    assert gc.get_freeze_count() > before
    assert gc.get_threshold() == thresholds
    del kept
    gc.collect()
    assert kept_ref() is not None, "what was alive at the freeze is never scanned again"


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_and_collects_less_often() -> None:
    process_runtime.tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == process_runtime.GC_THRESHOLDS
    assert process_runtime.GC_THRESHOLDS[0] > 700, "young collections rarer than Python's default"
