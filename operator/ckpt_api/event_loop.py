"""The event loop the operator and the agent run on: uvloop's where it is installed (both images
install it), else asyncio's. Their CPU is mostly HTTP — the operator's calls and pulls to every
agent of a wave, an agent's answers — and uvloop's transports cost less per connection and per
request than asyncio's selector loop; behaviour is the same."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the loop above."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
