"""How the long-running processes (the operator, the agent, the checkpoint server) run: on
uvloop's event loop where it is installed (both images install it), and with a garbage
collector that does not rescan their start-up heap.

Their CPU between loads is mostly HTTP: the operator's calls and pulls to every agent of a wave,
an agent's answers. uvloop's transports cost less per connection and per request than asyncio's
selector loop; behaviour is the same. Python's default collector (a young collection every 700
allocations, a full one every 100 young ones) spent ~27 % of the operator's CPU in
`bench controlplane` at 5 000 workers and ~30 % of an agent host's, mostly full collections
scanning objects that live as long as the process: modules, classes, the models' schemas."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# Allocations between young collections, young collections between middle ones, middle ones
# between full ones (Python's defaults: 700, 10, 10). Garbage in cycles lives a little longer;
# most objects are freed by their reference count and never wait for a collection.
GC_THRESHOLDS = (50_000, 20, 10)


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


def freeze_start_up() -> None:
    """Once the process has imported what it runs: what exists now is never garbage, and no
    collection scans it again."""
    gc.collect()  # what start-up left as garbage is not frozen with the rest
    gc.freeze()


def tune_gc() -> None:
    """freeze_start_up, and collections at GC_THRESHOLDS: for the operator, whose garbage is small
    (parsed answers, status documents). Not for the agent: a failed load's traceback can hold a
    tensor's buffer in a cycle, which must not wait 50 000 allocations to be freed."""
    freeze_start_up()
    gc.set_threshold(*GC_THRESHOLDS)
