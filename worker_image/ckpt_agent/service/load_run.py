"""One load's state in the service, from the request to its end: the agent's counterpart of the
operator's Draft. The service keeps the running one (cancel and shutdown reach it there) and
hands it to each step of the load, instead of keeping the load's scratch state on itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.pipeline.load_job import LoadJob
from ckpt_agent.pipeline.reader import CANCELLED_MESSAGE
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.smoke import CheckResult
from ckpt_agent.transport.abort import LoadAbort


@dataclass
class LoadRun:
    job: LoadJob
    # While the load runs: the copy of the version still live, served until the load changes
    # the weights, and again if it fails before it did.
    standing: RelayCopy | None
    peer_skipped: str | None = None  # why this load ignored the peer it was given
    abort: LoadAbort = field(default_factory=LoadAbort)  # wakes its blocked reads
    stopped: LoadError | None = None  # why it was stopped (None: it was not)
    # Stopped by POST /v1/cancel_load: its caller (the operator giving it up) writes its own
    # verdict, which this agent's report must not overwrite.
    caller_stopped: bool = False
    on_peer: bool = False  # the current attempt reads a peer
    fallback: str | None = None  # why the load left its peer for the source
    peer_bytes: int = 0  # what the peer sent before the load left it
    check: CheckResult | None = None  # its smoke check, once it ran
    stage: bool = False  # a replica follower's staging call (UpdateWeightsRequest.stage)

    def stop(self, error: LoadError) -> None:
        """Its reads are woken and its loops stop at their next cancel check, with `error`
        (the first reason given stands)."""
        if self.stopped is None:
            self.stopped = error
        self.job.cancel.set()
        self.abort.abort(error)

    def why_stopped(self, error: LoadError) -> LoadError:
        """The load's loops stop at a cancel check with the shutdown's words: put the reason the
        load was stopped for in their place."""
        stopped = self.stopped
        if stopped is None or error.reason != Reason.CANCELLED or stopped is error:
            return error
        message = error.message.replace(CANCELLED_MESSAGE, stopped.message)
        return LoadError(stopped.reason, message, tensor=error.tensor, weights_lost=error.weights_lost)
