"""Failure reasons the agent reports, and the exceptions that carry them."""

from __future__ import annotations

from ckpt_api.agent_api import ErrorBody
from ckpt_api.vocabulary import ErrorCode, WorkerReason

# The agent's name for what a LoadError carries; the words live in ckpt_api.vocabulary.
Reason = WorkerReason


class LoadError(Exception):
    """A load failed for a reason worth reporting; the previous weights are still live unless
    `weights_lost` is set (a streamed apply that could not be undone)."""

    def __init__(
        self, reason: Reason, message: str, *, tensor: str | None = None, weights_lost: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.tensor = tensor
        self.weights_lost = weights_lost


class RequestError(Exception):
    """A request the agent refuses before doing anything: answered with a 4xx and a reason."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        reason: str = ErrorCode.INVALID_REQUEST,
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.reason = reason
        self.status = status

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.reason, message=self.message, field=self.field)
