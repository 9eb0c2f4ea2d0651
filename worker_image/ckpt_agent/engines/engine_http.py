"""The one HTTP client for engines that run their own server (SGLang, vLLM, FastDeploy): every
failure to talk to the engine is a LoadError(EngineError), and a connection that never opened
is told apart from one that failed later (the call cannot have reached the engine)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from typing import Any, Required, TypedDict, Unpack

import aiohttp

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.pipeline.smoke import CALL_GRACE_S, Verdict, check_generation, completion_choice
from ckpt_api.agent_api import HealthCheckRequest


class EngineUnreachable(LoadError):
    """The engine did not answer (down, restarting, or too slow)."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.ENGINE_ERROR, message)


class EngineNotConnected(EngineUnreachable):
    """No connection was made: the call never reached the engine, so it changed nothing."""


class Request(TypedDict, total=False):
    """How a call is made, besides what it asks."""

    limit_s: Required[float]  # the whole call, answer included
    params: dict[str, str] | None
    token: str | None  # a bearer instead of the client's own


def _bearer(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {token}"} if token else None


class EngineHttp:
    """Calls to the engine's HTTP server. `token`: a bearer sent with every call (a call may
    name its own instead)."""

    def __init__(self, base_url: str, label: str, *, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.label = label
        self._token = token
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(headers=_bearer(self._token))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def exchange(
        self, method: str, path: str, body: dict[str, Any] | None = None, **request: Unpack[Request]
    ) -> tuple[int, str]:
        """(HTTP status, body text) of one call, whatever the status."""
        assert self._session is not None, "engine not started"
        try:
            async with self._session.request(
                method,
                self.base_url + path,
                json=body,
                params=request.get("params"),
                headers=_bearer(request.get("token")),
                timeout=aiohttp.ClientTimeout(total=request["limit_s"]),
            ) as resp:
                return resp.status, await resp.text()
        except aiohttp.ClientConnectorError as exc:
            raise EngineNotConnected(f"{self.label} {method} {path}: cannot connect: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnreachable(
                f"{self.label} at {self.base_url}: {method} {path} failed: {exc!r}"
            ) from None

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        ok_statuses: tuple[int, ...] = (),
        **request: Unpack[Request],
    ) -> tuple[int, Any]:
        """(HTTP status, decoded JSON) of a call that must answer 2xx (or one of `ok_statuses`)."""
        status, text = await self.exchange(method, path, body, **request)
        if status // 100 != 2 and status not in ok_statuses:
            raise LoadError(Reason.ENGINE_ERROR, f"{self.label} {path} answered HTTP {status}: {text[:500]}")
        try:
            return status, _decode(text, strict=status // 100 == 2)
        except ValueError as exc:
            raise LoadError(Reason.ENGINE_ERROR, f"{self.label} {path} answered non-JSON: {exc}") from None


def _decode(text: str, *, strict: bool) -> Any:
    """JSON of a reply; an error reply (e.g. a plain-text 404) may be text instead."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        if strict:
            raise
        return text


async def completion(
    http: EngineHttp, check: HealthCheckRequest, token: str | None = None
) -> tuple[object, object]:
    """(text, finish reason) of a greedy OpenAI-compatible `/v1/completions` call, for the
    server's served model (vLLM's and FastDeploy's requests leave `model` optional). `token`: a
    bearer for the /v1 routes other than the client's own."""
    body = {"prompt": check.prompt, "max_tokens": check.max_tokens, "temperature": 0}
    _, reply = await http.call(
        "POST", "/v1/completions", body, limit_s=check.timeout_seconds + CALL_GRACE_S, token=token
    )
    return completion_choice(reply)


async def timed_generation(generation: Awaitable[tuple[object, object]]) -> Verdict:
    """The smoke verdict of a short generation (an awaitable of (text, finish reason)), timed;
    a LoadError it raises counts as a failed check (the caller's)."""
    started = time.monotonic()
    text, finish_reason = await generation
    return check_generation(text, finish_reason, time.monotonic() - started)
