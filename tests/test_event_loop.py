"""The operator and the agent run on uvloop where it is installed (both images and the dev venv
install it), and on asyncio's loop where it is not."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import pytest
import uvloop

from ckpt_api import event_loop


async def _loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_result() -> None:
    assert event_loop.run(_loop_type()) is uvloop.Loop


def test_without_uvloop_the_loop_is_asyncios(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    loop = event_loop.new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()
    assert event_loop.run(_loop_type()) is not uvloop.Loop
